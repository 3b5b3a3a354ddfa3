/*
 * pose_val.c — the pose validator: per batch, decode + NMS every image,
 * match detections to ground truth by box IoU and by keypoint OKS at the
 * ten thresholds, and accumulate both metrics (Ultralytics PoseValidator
 * update_metrics / _process_batch; OKS area = gt box w*h * 0.53).
 * Ground truth arrives in the loader's fixed target layout, normalised to
 * the network input; matching happens in input pixels.
 */
#include "eval.h"
#include "internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct lucid_pose_val {
    lucid_pose_val_config cfg;
    float sigmas[64];
    lucid_ap_accum *box_acc, *pose_acc;
    int64_t images;
    int A;
    /* per-batch storage */
    int cap_images;
    lucid_det *dets;    /* [cap_images * max_det] */
    float *kpts;        /* [cap_images * max_det * K * 3] */
    int *ndets;         /* [cap_images] */
    void *scratch;
};

void lucid_pose_val_free(lucid_pose_val *v) {
    if (!v) return;
    lucid_ap_accum_free(v->box_acc);
    lucid_ap_accum_free(v->pose_acc);
    free(v->dets);
    free(v->kpts);
    free(v->ndets);
    free(v->scratch);
    free(v);
}

lucid_status lucid_pose_val_create(lucid_ctx *ctx,
                                   const lucid_pose_val_config *cfg,
                                   lucid_pose_val **out) {
    *out = NULL;
    if (cfg->nc < 1 || cfg->nkpt < 0 || cfg->nkpt > 64 || cfg->reg_max < 1 ||
        cfg->nlevels < 1 || cfg->nlevels > 4 || cfg->nms.max_det < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose validator: bad config (nc %d, K %d, reg_max "
                            "%d, levels %d, max_det %d)",
                            cfg->nc, cfg->nkpt, cfg->reg_max, cfg->nlevels,
                            cfg->nms.max_det);
    lucid_pose_val *v = calloc(1, sizeof *v);
    if (!v) return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
    v->cfg = *cfg;
    for (int k = 0; k < cfg->nkpt; k++)
        v->sigmas[k] = cfg->sigmas ? cfg->sigmas[k]
                       : cfg->nkpt == 17 ? lucid_coco_kpt_sigmas[k]
                                         : 1.0f / (float)cfg->nkpt;
    v->cfg.sigmas = v->sigmas;
    for (int l = 0; l < cfg->nlevels; l++) v->A += cfg->levels[l].h * cfg->levels[l].w;
    lucid_status s = lucid_ap_accum_create(ctx, &v->box_acc);
    if (s == LUCID_OK) s = lucid_ap_accum_create(ctx, &v->pose_acc);
    if (s == LUCID_OK) {
        v->scratch = malloc(lucid_eval_scratch_bytes(v->A, cfg->nc, cfg->nkpt));
        if (!v->scratch) s = lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
    }
    if (s != LUCID_OK) {
        lucid_pose_val_free(v);
        return s;
    }
    *out = v;
    return LUCID_OK;
}

void lucid_pose_val_reset(lucid_pose_val *v) {
    lucid_ap_accum_reset(v->box_acc);
    lucid_ap_accum_reset(v->pose_acc);
    v->images = 0;
}

static lucid_status reserve_images(lucid_ctx *ctx, lucid_pose_val *v, int n) {
    if (n <= v->cap_images) return LUCID_OK;
    int md = v->cfg.nms.max_det, K = v->cfg.nkpt;
    lucid_det *d = realloc(v->dets, sizeof(lucid_det) * (size_t)n * md);
    if (d) v->dets = d;
    float *k = realloc(v->kpts, sizeof(float) * (size_t)n * md * (K ? K * 3 : 1));
    if (k) v->kpts = k;
    int *nd = realloc(v->ndets, sizeof(int) * (size_t)n);
    if (nd) v->ndets = nd;
    if (!d || !k || !nd)
        return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory for %d images", n);
    v->cap_images = n;
    return LUCID_OK;
}

static lucid_status check_f32(lucid_ctx *ctx, const lucid_tensor *t,
                              const char *name, int ndim, int64_t d0,
                              int64_t d1, int64_t d2) {
    if (!t) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose validator: %s missing", name);
    if (t->dtype != LUCID_F32 || lucid_tensor_device(t).type != LUCID_CPU ||
        !lucid_tensor_is_contiguous(t))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose validator: %s must be a contiguous f32 CPU "
                            "tensor (got %s)",
                            name, lucid_dtype_name(t->dtype));
    int64_t want[3] = {d0, d1, d2};
    if (t->ndim < ndim) goto bad;
    for (int i = 0; i < ndim && i < 3; i++)
        if (want[i] >= 0 && t->shape[i] != want[i]) goto bad;
    return LUCID_OK;
bad: {
    char b[128];
    return lucid_seterr(ctx, LUCID_ERR_ARG,
                        "pose validator: %s has shape %s, expected [%lld, %lld, "
                        "%lld] (-1 = any)",
                        name, lucid_shape_str(t->ndim, t->shape, b, sizeof b),
                        (long long)d0, (long long)d1, (long long)d2);
}
}

lucid_status lucid_pose_val_add_batch(lucid_ctx *ctx, lucid_pose_val *v,
                                      const lucid_pose_val_batch *b) {
    const lucid_pose_val_config *c = &v->cfg;
    int K = c->nkpt, A = v->A, nc = c->nc;
    int64_t B = b->pred_box ? b->pred_box->shape[0] : 0;
    LUCID_TRY(check_f32(ctx, b->pred_box, "pred_box", 3, -1, 4 * c->reg_max, A));
    LUCID_TRY(check_f32(ctx, b->pred_cls, "pred_cls", 3, B, nc, A));
    if (K) LUCID_TRY(check_f32(ctx, b->pred_kpt, "pred_kpt", 3, B, 3 * K, A));
    LUCID_TRY(check_f32(ctx, b->cls, "cls", 2, B, -1, -1));
    int64_t G = b->cls->shape[1];
    LUCID_TRY(check_f32(ctx, b->boxes, "boxes", 3, B, G, 4));
    LUCID_TRY(check_f32(ctx, b->mask, "mask", 2, B, G, -1));
    if (K) LUCID_TRY(check_f32(ctx, b->kpts, "kpts", 3, B, G, K));
    if (b->n_images < 0 || b->n_images > B)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose validator: n_images %d outside 0..%lld",
                            b->n_images, (long long)B);
    LUCID_TRY(reserve_images(ctx, v, b->n_images));

    const float *pbox = lucid_tensor_data(b->pred_box);
    const float *pcls = lucid_tensor_data(b->pred_cls);
    const float *pkpt = K ? lucid_tensor_data(b->pred_kpt) : NULL;
    const float *gcls = lucid_tensor_data(b->cls);
    const float *gbox = lucid_tensor_data(b->boxes);
    const float *gkpt = K ? lucid_tensor_data(b->kpts) : NULL;
    const float *gmask = lucid_tensor_data(b->mask);
    int md = c->nms.max_det;

    /* per-image work arrays sized for G ground truths and max_det preds */
    size_t ng = (size_t)G, np_ = (size_t)md;
    float *gxyxy = malloc(sizeof(float) * ng * 4);
    float *gk = malloc(sizeof(float) * ng * (K ? K * 3 : 1));
    int *gc = malloc(sizeof(int) * ng);
    float *area = malloc(sizeof(float) * ng);
    float *iou = malloc(sizeof(float) * ng * np_);
    int *pc = malloc(sizeof(int) * np_);
    float *pconf = malloc(sizeof(float) * np_);
    uint8_t *corr = malloc(np_ * LUCID_EVAL_NTHR);
    int8_t *tp = malloc(np_ * LUCID_EVAL_NTHR);
    float *crowd = malloc(sizeof(float) * 4 * (size_t)(b->max_crowd > 0 ? b->max_crowd : 1));
    lucid_status st = LUCID_OK;
    if (!gxyxy || !gk || !gc || !area || !iou || !pc || !pconf || !corr || !tp || !crowd) {
        st = lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
        goto done;
    }
    for (int i = 0; i < b->n_images; i++) {
        lucid_det *dets = v->dets + (size_t)i * md;
        float *kout = v->kpts + (size_t)i * md * (K ? K * 3 : 1);
        int n = lucid_eval_decode_nms(pbox + (size_t)i * 4 * c->reg_max * A,
                                      pcls + (size_t)i * nc * A,
                                      K ? pkpt + (size_t)i * 3 * K * A : NULL, A,
                                      c->reg_max, nc, K, c->levels, c->nlevels,
                                      &c->nms, v->scratch, dets, kout);
        if (n < 0) {
            st = lucid_seterr(ctx, LUCID_ERR_ARG, "pose validator: decode failed for image %d", i);
            goto done;
        }
        v->ndets[i] = n;
        /* ground truth of image i in input pixels */
        int m = 0;
        for (int64_t g = 0; g < G; g++) {
            size_t r = (size_t)i * G + g;
            if (gmask[r] == 0.0f) continue;
            const float *bx = gbox + r * 4;
            float cx = bx[0] * b->img_w, cy = bx[1] * b->img_h;
            float w = bx[2] * b->img_w, h = bx[3] * b->img_h;
            gxyxy[4 * m + 0] = cx - w / 2;
            gxyxy[4 * m + 1] = cy - h / 2;
            gxyxy[4 * m + 2] = cx + w / 2;
            gxyxy[4 * m + 3] = cy + h / 2;
            area[m] = w * h * 0.53f;
            gc[m] = (int)gcls[r];
            for (int k = 0; k < K; k++) {
                const float *src = gkpt + (r * K + k) * 3;
                gk[(size_t)m * K * 3 + 3 * k] = src[0] * b->img_w;
                gk[(size_t)m * K * 3 + 3 * k + 1] = src[1] * b->img_h;
                gk[(size_t)m * K * 3 + 3 * k + 2] = src[2];
            }
            m++;
        }
        int nc_i = 0;
        if (b->crowd && b->ncrowd) {
            nc_i = b->ncrowd[i];
            for (int k = 0; k < nc_i; k++) {
                const float *cb = b->crowd + ((size_t)i * b->max_crowd + k) * 4;
                crowd[4 * k] = cb[0] * b->img_w;
                crowd[4 * k + 1] = cb[1] * b->img_h;
                crowd[4 * k + 2] = cb[2] * b->img_w;
                crowd[4 * k + 3] = cb[3] * b->img_h;
            }
        }
        for (int p = 0; p < n; p++) {
            pc[p] = dets[p].cls;
            pconf[p] = dets[p].conf;
        }
        /* boxes */
        for (int g = 0; g < m; g++)
            for (int p = 0; p < n; p++)
                iou[(size_t)g * n + p] = lucid_box_iou(gxyxy + 4 * g, dets[p].box);
        if (lucid_match_predictions(iou, gc, m, pc, n, corr)) {
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
            goto done;
        }
        lucid_apply_crowd(dets, n, crowd, nc_i, corr, tp);
        st = lucid_ap_accum_add(ctx, v->box_acc, n, pconf, pc, tp, m, gc);
        if (st != LUCID_OK) goto done;
        /* keypoints */
        if (K) {
            for (int g = 0; g < m; g++)
                for (int p = 0; p < n; p++)
                    iou[(size_t)g * n + p] = lucid_kpt_oks(gk + (size_t)g * K * 3,
                                                           dets[p].kpts, K,
                                                           v->sigmas, area[g]);
            if (lucid_match_predictions(iou, gc, m, pc, n, corr)) {
                st = lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
                goto done;
            }
            lucid_apply_crowd(dets, n, crowd, nc_i, corr, tp);
            st = lucid_ap_accum_add(ctx, v->pose_acc, n, pconf, pc, tp, m, gc);
            if (st != LUCID_OK) goto done;
        }
        v->images++;
    }
done:
    free(gxyxy);
    free(gk);
    free(gc);
    free(area);
    free(iou);
    free(pc);
    free(pconf);
    free(corr);
    free(tp);
    free(crowd);
    return st;
}

const lucid_det *lucid_pose_val_dets(const lucid_pose_val *v, int i, int *n) {
    if (i < 0 || i >= v->cap_images) {
        *n = 0;
        return NULL;
    }
    *n = v->ndets[i];
    return v->dets + (size_t)i * v->cfg.nms.max_det;
}

lucid_status lucid_pose_val_compute(lucid_ctx *ctx, const lucid_pose_val *v,
                                    lucid_pose_metrics *out) {
    memset(out, 0, sizeof *out);
    LUCID_TRY(lucid_ap_accum_compute(ctx, v->box_acc, v->cfg.ap_method, &out->box));
    if (v->cfg.nkpt)
        LUCID_TRY(lucid_ap_accum_compute(ctx, v->pose_acc, v->cfg.ap_method, &out->pose));
    out->images = v->images;
    out->fitness = out->box.map50_95 + out->pose.map50_95;
    return LUCID_OK;
}
