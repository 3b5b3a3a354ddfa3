/*
 * pose_val.c — the pose validator: per batch, decode + NMS every image,
 * match detections to ground truth by box IoU and by keypoint OKS at the
 * ten thresholds, and accumulate both metrics (Ultralytics PoseValidator
 * update_metrics / _process_batch; OKS area = gt box w*h * 0.53).
 * Ground truth arrives in the loader's fixed target layout, normalised to
 * the network input; matching happens in input pixels.
 *
 * The images of a batch are independent up to the accumulation: each one
 * (decode + NMS, ground truth, IoU/OKS, matching, crowd rule) works in its
 * own slot of buffers kept across batches, on up to cfg.threads threads
 * taking images one at a time; then the slots go into the accumulators in
 * image order, so the metrics are the same for any thread count.
 */
#include "eval.h"
#include "internal.h"
#include "cpu/cpu.h"
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What one image of a batch needs during the batch: the decode/NMS
 * scratch, the ground truth in pixels, the IoU/OKS matrix, and its results
 * (the tp/ignored marks of its detections for boxes and for keypoints),
 * which go into the accumulators in image order after the batch. */
typedef struct img_slot {
    void *scratch;
    float *gxyxy, *gk, *area, *iou, *crowd;
    int *gc, *pc;
    float *pconf;
    uint8_t *corr;
    int8_t *tp_box, *tp_pose;
    int64_t cap_g, cap_crowd;
    int m, n;              /* ground truths, detections */
    lucid_status st;       /* LUCID_ERR_OOM from matching */
    lucid_eval_timings tm; /* this image's stage times */
} img_slot;

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
    img_slot *slots;    /* [cap_images] */
    lucid_eval_timings tm;
};

static void slot_free(img_slot *s) {
    free(s->scratch);
    free(s->gxyxy);
    free(s->gk);
    free(s->area);
    free(s->iou);
    free(s->crowd);
    free(s->gc);
    free(s->pc);
    free(s->pconf);
    free(s->corr);
    free(s->tp_box);
    free(s->tp_pose);
}

void lucid_pose_val_free(lucid_pose_val *v) {
    if (!v) return;
    lucid_ap_accum_free(v->box_acc);
    lucid_ap_accum_free(v->pose_acc);
    free(v->dets);
    free(v->kpts);
    free(v->ndets);
    for (int i = 0; i < v->cap_images; i++) slot_free(&v->slots[i]);
    free(v->slots);
    free(v);
}

lucid_status lucid_pose_val_create(lucid_ctx *ctx,
                                   const lucid_pose_val_config *cfg,
                                   lucid_pose_val **out) {
    *out = NULL;
    if (cfg->nc < 1 || cfg->nkpt < 0 || cfg->nkpt > 64 || cfg->reg_max < 1 ||
        cfg->nlevels < 1 || cfg->nlevels > 4 || cfg->nms.max_det < 1 ||
        cfg->threads < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose validator: bad config (nc %d, K %d, reg_max "
                            "%d, levels %d, max_det %d, threads %d)",
                            cfg->nc, cfg->nkpt, cfg->reg_max, cfg->nlevels,
                            cfg->nms.max_det, cfg->threads);
    lucid_pose_val *v = calloc(1, sizeof *v);
    if (!v) return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
    v->cfg = *cfg;
    for (int k = 0; k < cfg->nkpt; k++)
        v->sigmas[k] = cfg->sigmas ? cfg->sigmas[k]
                       : cfg->nkpt == 17 ? lucid_coco_kpt_sigmas[k]
                                         : 1.0f / (float)cfg->nkpt;
    v->cfg.sigmas = v->sigmas;
    for (int l = 0; l < cfg->nlevels; l++) v->A += cfg->levels[l].h * cfg->levels[l].w;
    /* NMS keeps at most one detection per anchor (the candidates are each
     * anchor's best class), so a max_det above A keeps the same detections
     * as A; the per-image buffers (images x max_det) are sized by the
     * smaller: max_det = 2^31 - 1 must not ask for 2^31 detections a slot */
    if (v->A > 0 && v->cfg.nms.max_det > v->A) v->cfg.nms.max_det = (int)v->A;
    lucid_status s = lucid_ap_accum_create(ctx, &v->box_acc);
    if (s == LUCID_OK) s = lucid_ap_accum_create(ctx, &v->pose_acc);
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
    memset(&v->tm, 0, sizeof v->tm);
}

void lucid_pose_val_timings(const lucid_pose_val *v, lucid_eval_timings *out) {
    *out = v->tm;
}

/* Grow p to hold need elements of elem bytes (never shrinks). */
static int grow_to(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, (size_t)(need > 0 ? need : 1) * elem);
    if (!q) return -1;
    *p = q;
    *cap = need;
    return 0;
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
    img_slot *sl = realloc(v->slots, sizeof(img_slot) * (size_t)n);
    if (sl) {
        v->slots = sl;
        memset(sl + v->cap_images, 0, sizeof(img_slot) * (size_t)(n - v->cap_images));
    }
    if (!d || !k || !nd || !sl)
        return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory for %d images", n);
    /* per-image fixed-size buffers; the ground-truth ones grow per batch */
    size_t np_ = (size_t)md;
    for (int i = v->cap_images; i < n; i++) {
        img_slot *s = &v->slots[i];
        s->scratch = malloc(lucid_eval_scratch_bytes(v->A, v->cfg.nc, K));
        s->pc = malloc(sizeof(int) * np_);
        s->pconf = malloc(sizeof(float) * np_);
        s->corr = malloc(np_ * LUCID_EVAL_NTHR);
        s->tp_box = malloc(np_ * LUCID_EVAL_NTHR);
        s->tp_pose = malloc(np_ * LUCID_EVAL_NTHR);
        if (!s->scratch || !s->pc || !s->pconf || !s->corr || !s->tp_box || !s->tp_pose) {
            /* the slots up to i are complete or zeroed: free() handles both */
            v->cap_images = i + 1;
            return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory for %d images", n);
        }
    }
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

/* One batch, as the per-image work sees it. */
typedef struct batch_job {
    lucid_pose_val *v;
    const lucid_pose_val_batch *b;
    const float *pbox, *pcls, *pkpt, *gcls, *gbox, *gkpt, *gmask;
    int64_t G;
    atomic_int next; /* next image to process */
} batch_job;

/* Image i of the batch: decode + NMS, ground truth in pixels, box IoU and
 * keypoint OKS matrices, matching at the ten thresholds, crowd rule. Writes
 * only image i's detections and slot, so images may run in parallel. */
static void process_image(const batch_job *j, int i, img_slot *s) {
    lucid_pose_val *v = j->v;
    const lucid_pose_val_batch *b = j->b;
    const lucid_pose_val_config *c = &v->cfg;
    int K = c->nkpt, A = v->A, nc = c->nc, md = c->nms.max_det;
    int64_t G = j->G;
    lucid_det *dets = v->dets + (size_t)i * md;
    float *kout = v->kpts + (size_t)i * md * (K ? K * 3 : 1);
    const float *ib = j->pbox + (size_t)i * 4 * c->reg_max * A;
    const float *ic = j->pcls + (size_t)i * nc * A;
    const float *ik = K ? j->pkpt + (size_t)i * 3 * K * A : NULL;
    memset(&s->tm, 0, sizeof s->tm);
    s->st = LUCID_OK;
    s->n = s->m = 0;
    int n;
    if (c->reference) {
        n = lucid_eval_decode_nms_reference_timed(ib, ic, ik, A, c->reg_max, nc, K,
                                                  c->levels, c->nlevels, &c->nms,
                                                  s->scratch, dets, kout, &s->tm);
    } else {
        n = lucid_eval_decode_nms_timed(ib, ic, ik, A, c->reg_max, nc, K,
                                        c->levels, c->nlevels, &c->nms,
                                        s->scratch, dets, kout, &s->tm);
    }
    /* n >= 0: the arguments were checked in add_batch */
    v->ndets[i] = n;
    s->n = n;
    double t_m0 = lucid_eval_now();
    /* ground truth of image i in input pixels */
    int m = 0;
    float *gxyxy = s->gxyxy, *gk = s->gk, *area = s->area, *iou = s->iou;
    int *gc = s->gc, *pc = s->pc;
    for (int64_t g = 0; g < G; g++) {
        size_t r = (size_t)i * G + g;
        if (j->gmask[r] == 0.0f) continue;
        const float *bx = j->gbox + r * 4;
        float cx = bx[0] * b->img_w, cy = bx[1] * b->img_h;
        float w = bx[2] * b->img_w, h = bx[3] * b->img_h;
        gxyxy[4 * m + 0] = cx - w / 2;
        gxyxy[4 * m + 1] = cy - h / 2;
        gxyxy[4 * m + 2] = cx + w / 2;
        gxyxy[4 * m + 3] = cy + h / 2;
        area[m] = w * h * 0.53f;
        gc[m] = (int)j->gcls[r];
        for (int k = 0; k < K; k++) {
            const float *src = j->gkpt + (r * K + k) * 3;
            gk[(size_t)m * K * 3 + 3 * k] = src[0] * b->img_w;
            gk[(size_t)m * K * 3 + 3 * k + 1] = src[1] * b->img_h;
            gk[(size_t)m * K * 3 + 3 * k + 2] = src[2];
        }
        m++;
    }
    s->m = m;
    int nc_i = 0;
    if (b->crowd && b->ncrowd) {
        nc_i = b->ncrowd[i];
        for (int k = 0; k < nc_i; k++) {
            const float *cb = b->crowd + ((size_t)i * b->max_crowd + k) * 4;
            s->crowd[4 * k] = cb[0] * b->img_w;
            s->crowd[4 * k + 1] = cb[1] * b->img_h;
            s->crowd[4 * k + 2] = cb[2] * b->img_w;
            s->crowd[4 * k + 3] = cb[3] * b->img_h;
        }
    }
    for (int p = 0; p < n; p++) {
        pc[p] = dets[p].cls;
        s->pconf[p] = dets[p].conf;
    }
    /* boxes */
    for (int g = 0; g < m; g++)
        for (int p = 0; p < n; p++)
            iou[(size_t)g * n + p] = lucid_box_iou(gxyxy + 4 * g, dets[p].box);
    if (lucid_match_predictions(iou, gc, m, pc, n, s->corr)) {
        s->st = LUCID_ERR_OOM;
        return;
    }
    lucid_apply_crowd(dets, n, s->crowd, nc_i, s->corr, s->tp_box);
    /* keypoints */
    if (K) {
        for (int g = 0; g < m; g++)
            for (int p = 0; p < n; p++)
                iou[(size_t)g * n + p] = lucid_kpt_oks(gk + (size_t)g * K * 3,
                                                       dets[p].kpts, K,
                                                       v->sigmas, area[g]);
        if (lucid_match_predictions(iou, gc, m, pc, n, s->corr)) {
            s->st = LUCID_ERR_OOM;
            return;
        }
        lucid_apply_crowd(dets, n, s->crowd, nc_i, s->corr, s->tp_pose);
    }
    s->tm.match += lucid_eval_now() - t_m0;
}

/* Worker: takes the next unprocessed image until none is left (dynamic, so
 * a thread slowed down by other load on the machine does not hold up the
 * batch; which thread does an image never changes its result). */
static void *worker_main(void *arg) {
    batch_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->b->n_images) break;
        process_image(j, i, &j->v->slots[i]);
    }
    return NULL;
}

#define MAX_WORKERS 32

/* Images of the batch on up to `threads` threads (this one included). */
static void process_all(batch_job *j, int threads) {
    int n = j->b->n_images;
    if (threads > n) threads = n;
    if (threads > MAX_WORKERS) threads = MAX_WORKERS;
    pthread_t th[MAX_WORKERS];
    int started[MAX_WORKERS] = {0};
    for (int k = 1; k < threads; k++)
        started[k] = pthread_create(&th[k], NULL, worker_main, j) == 0;
    worker_main(j); /* a thread that could not start leaves its share here */
    for (int k = 1; k < threads; k++)
        if (started[k]) pthread_join(th[k], NULL);
}

lucid_status lucid_pose_val_add_batch(lucid_ctx *ctx, lucid_pose_val *v,
                                      const lucid_pose_val_batch *b) {
    double t_wall0 = lucid_eval_now();
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
    if (c->reg_max > 64)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "pose validator: reg_max %d > 64",
                            c->reg_max);
    int64_t total = 0;
    for (int l = 0; l < c->nlevels; l++) total += (int64_t)c->levels[l].h * c->levels[l].w;
    if (total != A || A <= 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "pose validator: bad anchor levels");
    LUCID_TRY(reserve_images(ctx, v, b->n_images));
    /* ground-truth buffers of every slot sized for this batch's G */
    int md = c->nms.max_det;
    int64_t mc = b->max_crowd > 0 ? b->max_crowd : 1, gn = G > 0 ? G : 1;
    for (int i = 0; i < b->n_images; i++) {
        img_slot *s = &v->slots[i];
        if (gn > s->cap_g) {
            int64_t c1 = s->cap_g, c2 = s->cap_g, c3 = s->cap_g, c4 = s->cap_g, c5 = s->cap_g;
            if (grow_to((void **)&s->gxyxy, &c1, gn, sizeof(float) * 4) ||
                grow_to((void **)&s->gk, &c2, gn, sizeof(float) * (K ? K * 3 : 1)) ||
                grow_to((void **)&s->area, &c3, gn, sizeof(float)) ||
                grow_to((void **)&s->gc, &c4, gn, sizeof(int)) ||
                grow_to((void **)&s->iou, &c5, gn, sizeof(float) * (size_t)md))
                return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
            s->cap_g = gn;
        }
        if (grow_to((void **)&s->crowd, &s->cap_crowd, mc, sizeof(float) * 4))
            return lucid_seterr(ctx, LUCID_ERR_OOM, "pose validator: out of memory");
    }

    batch_job j = {v, b, lucid_tensor_data(b->pred_box), lucid_tensor_data(b->pred_cls),
                   K ? lucid_tensor_data(b->pred_kpt) : NULL, lucid_tensor_data(b->cls),
                   lucid_tensor_data(b->boxes), K ? lucid_tensor_data(b->kpts) : NULL,
                   lucid_tensor_data(b->mask), G, 0};
    atomic_init(&j.next, 0);
    int n_img = b->n_images;
    /* images in parallel (each writes only its own slot and detections);
     * threads 1 or the reference path: in order on this thread */
    int threads = c->reference ? 1 : c->threads ? c->threads : cpu_num_threads(ctx);
    process_all(&j, threads);
    /* the accumulators in image order: the same sequence as one thread */
    lucid_status st = LUCID_OK;
    for (int i = 0; i < n_img && st == LUCID_OK; i++) {
        img_slot *s = &v->slots[i];
        lucid_eval_timings *t = &s->tm;
        v->tm.select += t->select;
        v->tm.decode += t->decode;
        v->tm.nms += t->nms;
        v->tm.kpts += t->kpts;
        v->tm.match += t->match;
        v->tm.candidates += t->candidates;
        v->tm.decoded += t->decoded;
        v->tm.kept += t->kept;
        if (s->st != LUCID_OK) {
            st = lucid_seterr(ctx, s->st, "pose validator: out of memory");
            break;
        }
        double t_a0 = lucid_eval_now();
        st = lucid_ap_accum_add(ctx, v->box_acc, s->n, s->pconf, s->pc, s->tp_box, s->m, s->gc);
        if (st == LUCID_OK && K)
            st = lucid_ap_accum_add(ctx, v->pose_acc, s->n, s->pconf, s->pc, s->tp_pose, s->m,
                                    s->gc);
        v->tm.accum += lucid_eval_now() - t_a0;
        if (st == LUCID_OK) {
            v->images++;
            v->tm.images++;
        }
    }
    v->tm.wall += lucid_eval_now() - t_wall0;
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
