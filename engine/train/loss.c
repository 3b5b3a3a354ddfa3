/*
 * loss.c — the pose loss object: plan (every work buffer allocated once),
 * argument checks, and the forward/backward orchestration of the phases in
 * assigner.c, loss_box.c, loss_kpt.c and loss_cls.c. Formulas, sources and
 * the public contract are in train/loss.h.
 *
 * Contract
 *   - plan_create validates the configuration and carves one storage into
 *     the work arrays; forward/backward allocate nothing (checked by the
 *     tests through the context's CPU memory statistics).
 *   - The compute type follows the outputs: f64 outputs run the double
 *     phases, f32/bf16/f16 the float ones. Reductions accumulate in double.
 *   - Forward order: prep_gt, decode, assign (skipped when frozen), then
 *     box+dfl, keypoints, cls; the raw sums become the components here.
 *   - Backward needs the assignment of a forward of the same compute type
 *     (ERR_STATE otherwise) and rewrites every element of the gradients.
 *   - This is the CPU reference. A plan on a CUDA device runs the same
 *     phases as kernels (cuda/loss.cu) through the kernel table of
 *     train/loss_backend.h: the checks, the layout and the frozen/assigned
 *     bookkeeping stay here; the work storage gets the backend's tail area.
 */
#define LUCID_POSE_LOSS_INTERNAL
#include "loss.h"
#include "loss_backend.h"
#include "internal.h"
#include <stdlib.h>
#include <string.h>

#define LPL_MAX_TOPK 64 /* must match assigner.c */
#define LPL_MAX_REG 64  /* must match loss_box.c */

static const double coco_sigmas[17] = {
    .026, .025, .025, .035, .035, .079, .079, .072, .072,
    .062, .062, .107, .107, .087, .087, .089, .089};

lucid_pose_loss_config lucid_pose_loss_config_default(void) {
    lucid_pose_loss_config c;
    memset(&c, 0, sizeof c);
    c.nc = 1;
    c.nkpt = 17;
    c.reg_max = 16;
    c.topk = 10;
    c.tal_alpha = 0.5;
    c.tal_beta = 6.0;
    c.gain_box = 7.5;
    c.gain_cls = 0.5;
    c.gain_dfl = 1.5;
    c.gain_pose = 12.0;
    c.gain_kobj = 1.0;
    return c;
}

void lucid_pose_loss_config_levels(lucid_pose_loss_config *cfg, int img_h,
                                   int img_w) {
    static const int st[3] = {8, 16, 32};
    cfg->nlevels = 3;
    for (int l = 0; l < 3; l++) {
        cfg->strides[l] = st[l];
        cfg->level_h[l] = img_h / st[l];
        cfg->level_w[l] = img_w / st[l];
    }
}

const lucid_pose_loss_kernels *lucid_pose_loss_kernels_for(lucid_ctx *ctx,
                                                           lucid_device dev,
                                                           int *err) {
    *err = 0;
    if (dev.type == LUCID_CPU) return NULL;
    const lucid_pose_loss_kernels *k =
        dev.type == LUCID_CUDA ? lucid_pose_loss_cuda_kernels() : NULL;
    *err = 1;
    if (!k) {
        lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                     "pose loss: no loss kernels for device %s:%d in this "
                     "build (built with CUDA=0?)",
                     dev.type == LUCID_CUDA ? "cuda" : "?", dev.index);
        return NULL;
    }
    if (ctx->device.type != dev.type || ctx->device.index != dev.index) {
        lucid_seterr(ctx, LUCID_ERR_ARG,
                     "pose loss: plan on cuda:%d but the context drives %s",
                     dev.index,
                     ctx->device.type == LUCID_CPU ? "the cpu"
                                                   : "another GPU");
        return NULL;
    }
    *err = 0;
    return k;
}

/* make_anchors and the OKS sigmas into host arrays anc [A*3], sig [K]. */
static void fill_anchors_sigmas(const lucid_pose_loss_config *cfg,
                                double *anc, double *sig) {
    int64_t a = 0;
    for (int l = 0; l < cfg->nlevels; l++)
        for (int i = 0; i < cfg->level_h[l]; i++)
            for (int j = 0; j < cfg->level_w[l]; j++, a++) {
                anc[a * 3 + 0] = j + 0.5;
                anc[a * 3 + 1] = i + 0.5;
                anc[a * 3 + 2] = cfg->strides[l];
            }
    for (int k = 0; k < cfg->nkpt; k++)
        sig[k] = cfg->sigmas ? cfg->sigmas[k]
                 : cfg->nkpt == 17 ? coco_sigmas[k]
                                   : 1.0 / cfg->nkpt;
}

/* Bump allocator over the work storage (64-byte aligned slices). */
typedef struct carve {
    size_t off;
    char *base;
} carve;
static void *carve_take(carve *c, size_t bytes) {
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Lay out the arrays; with base NULL only measures. */
static size_t plan_layout(lucid_pose_loss_plan *p, char *base) {
    const size_t B = (size_t)p->cfg.batch, G = (size_t)p->cfg.max_gt;
    const size_t A = (size_t)p->A, K = (size_t)p->cfg.nkpt;
    const size_t k = (size_t)p->cfg.topk, R = sizeof(double); /* real slot */
    carve c = {0, base};
    p->anc = carve_take(&c, A * 3 * sizeof(double));
    p->sigmas = carve_take(&c, K * sizeof(double));
    p->scal = carve_take(&c, LPL_S_COUNT * sizeof(double));
    p->gt_label = carve_take(&c, B * G * sizeof(int32_t));
    p->gt_mask = carve_take(&c, B * G);
    p->gt_box = carve_take(&c, B * G * 4 * R);
    p->gt_cand = carve_take(&c, B * G * 4 * R);
    p->gt_kpt = carve_take(&c, B * G * K * 3 * R);
    p->pbox = carve_take(&c, B * A * 4 * R);
    p->pos = carve_take(&c, B * G * k * sizeof(int32_t));
    p->tgt = carve_take(&c, B * A * sizeof(int32_t));
    p->tscore = carve_take(&c, B * A * R);
    p->alpha = carve_take(&c, B * A * R);
    p->pos_al = carve_take(&c, B * G * R);
    p->pos_ov = carve_take(&c, B * G * R);
    return c.off;
}

lucid_status lucid_pose_loss_plan_create(lucid_ctx *ctx, lucid_device device,
                                         const lucid_pose_loss_config *cfg,
                                         lucid_pose_loss_plan **out) {
    if (!out) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: out is NULL");
    *out = NULL;
    if (!cfg) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: cfg is NULL");
    int kerr = 0;
    const lucid_pose_loss_kernels *kern =
        lucid_pose_loss_kernels_for(ctx, device, &kerr);
    if (kerr) return ctx->last_status;
    if (cfg->batch < 1 || cfg->nc < 1 || cfg->nkpt < 1 || cfg->max_gt < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: batch=%d nc=%d nkpt=%d max_gt=%d must "
                            "all be >= 1",
                            cfg->batch, cfg->nc, cfg->nkpt, cfg->max_gt);
    if (cfg->reg_max < 2 || cfg->reg_max > LPL_MAX_REG)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: reg_max=%d out of [2, %d]", cfg->reg_max,
                            LPL_MAX_REG);
    if (cfg->nlevels < 1 || cfg->nlevels > LUCID_POSE_LOSS_MAX_LEVELS)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: nlevels=%d out of [1, %d]",
                            cfg->nlevels, LUCID_POSE_LOSS_MAX_LEVELS);
    int64_t A = 0;
    for (int l = 0; l < cfg->nlevels; l++) {
        if (cfg->level_h[l] < 1 || cfg->level_w[l] < 1 ||
            !(cfg->strides[l] > 0))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "pose loss: level %d has size %dx%d, stride "
                                "%g (need >= 1 and > 0)",
                                l, cfg->level_h[l], cfg->level_w[l],
                                cfg->strides[l]);
        A += (int64_t)cfg->level_h[l] * cfg->level_w[l];
    }
    if (A > INT32_MAX / 4)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: %lld anchors is "
                            "too many", (long long)A);
    if (cfg->topk < 1 || cfg->topk > LPL_MAX_TOPK || cfg->topk > A)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: topk=%d must be in [1, %d] and not "
                            "above the %lld anchors",
                            cfg->topk, LPL_MAX_TOPK, (long long)A);
    if (!(cfg->tal_alpha >= 0) || !(cfg->tal_beta >= 0))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: assigner alpha=%g beta=%g must be >= 0",
                            cfg->tal_alpha, cfg->tal_beta);
    if (cfg->sigmas)
        for (int k = 0; k < cfg->nkpt; k++)
            if (!(cfg->sigmas[k] > 0))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "pose loss: sigma[%d]=%g must be > 0", k,
                                    cfg->sigmas[k]);

    lucid_pose_loss_plan *p = calloc(1, sizeof *p);
    if (!p) return lucid_seterr(ctx, LUCID_ERR_OOM, "pose loss: out of memory");
    p->ctx = ctx;
    p->device = device;
    p->cfg = *cfg;
    p->A = (int)A;
    p->img_h = cfg->level_h[0] * cfg->strides[0];
    p->img_w = cfg->level_w[0] * cfg->strides[0];
    size_t bytes = plan_layout(p, NULL);
    if (kern) bytes += kern->extra_bytes(p); /* backend tail area */
    lucid_status st = lucid_storage_create(ctx, device, bytes, 0, &p->ws);
    if (st != LUCID_OK) {
        free(p);
        return st;
    }
    plan_layout(p, lucid_storage_data(p->ws));
    if (kern) {
        /* device storage: the backend zeroes it and uploads the tables */
        double *anc = malloc((size_t)A * 3 * sizeof(double));
        double *sig = malloc((size_t)cfg->nkpt * sizeof(double));
        if (!anc || !sig)
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "pose loss: out of memory");
        else {
            fill_anchors_sigmas(cfg, anc, sig);
            st = kern->plan_init(ctx, p, anc, sig);
        }
        free(anc);
        free(sig);
        if (st != LUCID_OK) {
            lucid_storage_release(p->ws);
            free(p);
            return st;
        }
    } else {
        memset(lucid_storage_data(p->ws), 0, bytes);
        /* make_anchors: cell centres, level by level, row-major. */
        fill_anchors_sigmas(cfg, p->anc, p->sigmas);
    }
    p->cfg.sigmas = p->sigmas; /* device memory for a device plan */
    *out = p;
    return LUCID_OK;
}

void lucid_pose_loss_plan_destroy(lucid_pose_loss_plan *plan) {
    if (!plan) return;
    lucid_storage_release(plan->ws);
    free(plan);
}

int lucid_pose_loss_plan_anchors(const lucid_pose_loss_plan *plan) {
    return plan ? plan->A : 0;
}

size_t lucid_pose_loss_plan_workspace_bytes(const lucid_pose_loss_plan *plan) {
    return plan ? lucid_storage_nbytes(plan->ws) : 0;
}

void lucid_pose_loss_plan_set_frozen(lucid_pose_loss_plan *plan, int frozen) {
    if (plan) plan->frozen = frozen != 0;
}

/* ---------------------------------------------------------------- checks */

static int same_dev(lucid_device a, lucid_device b) {
    return a.type == b.type && a.index == b.index;
}

/* Check t: ndim/shape (shape entries < 0 are free), float dtype set in
 * `dts` (bitmask of lucid_dtype), on the plan's device. */
static lucid_status check_tensor(lucid_pose_loss_plan *p, const char *what,
                                 const lucid_tensor *t, int ndim,
                                 const int64_t *shape, unsigned dts) {
    lucid_ctx *ctx = p->ctx;
    char b1[96], b2[96];
    if (!t) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: %s is NULL", what);
    int bad = t->ndim != ndim;
    for (int d = 0; !bad && d < ndim; d++)
        bad = shape[d] >= 0 && t->shape[d] != shape[d];
    if (bad)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: %s has shape %s, expected %s", what,
                            lucid_shape_str(t->ndim, t->shape, b1, sizeof b1),
                            lucid_shape_str(ndim, shape, b2, sizeof b2));
    if (!(dts & (1u << t->dtype)))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: %s has dtype %s, not allowed here",
                            what, lucid_dtype_name(t->dtype));
    if (!same_dev(lucid_tensor_device(t), p->device))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: %s is not on the plan's device", what);
    return LUCID_OK;
}

#define DT(x) (1u << (x))
#define DT_FLOAT (DT(LUCID_F32) | DT(LUCID_F64) | DT(LUCID_BF16) | DT(LUCID_F16))

static lucid_status check_preds(lucid_pose_loss_plan *p, const lucid_tensor *pb,
                                const lucid_tensor *pc, const lucid_tensor *pk,
                                int is_grad) {
    const int64_t B = p->cfg.batch, A = p->A;
    const int64_t sb[3] = {B, 4 * (int64_t)p->cfg.reg_max, A};
    const int64_t sc[3] = {B, p->cfg.nc, A};
    const int64_t sk[3] = {B, 3 * (int64_t)p->cfg.nkpt, A};
    if (is_grad) {
        if (pb) LUCID_TRY(check_tensor(p, "grad_box", pb, 3, sb, DT_FLOAT));
        if (pc) LUCID_TRY(check_tensor(p, "grad_cls", pc, 3, sc, DT_FLOAT));
        if (pk) LUCID_TRY(check_tensor(p, "grad_kpt", pk, 3, sk, DT_FLOAT));
        return LUCID_OK;
    }
    LUCID_TRY(check_tensor(p, "pred_box", pb, 3, sb, DT_FLOAT));
    LUCID_TRY(check_tensor(p, "pred_cls", pc, 3, sc, DT_FLOAT));
    LUCID_TRY(check_tensor(p, "pred_kpt", pk, 3, sk, DT_FLOAT));
    if (pc->dtype != pb->dtype || pk->dtype != pb->dtype)
        return lucid_seterr(p->ctx, LUCID_ERR_ARG,
                            "pose loss: outputs must share one dtype (box %s, "
                            "cls %s, kpt %s)",
                            lucid_dtype_name(pb->dtype),
                            lucid_dtype_name(pc->dtype),
                            lucid_dtype_name(pk->dtype));
    return LUCID_OK;
}

static lucid_status check_targets(lucid_pose_loss_plan *p,
                                  const lucid_pose_targets *t) {
    const int64_t B = p->cfg.batch, G = p->cfg.max_gt, K = p->cfg.nkpt;
    const int64_t s2[2] = {B, G}, s3[3] = {B, G, 4}, s4[4] = {B, G, K, 3};
    const unsigned f = DT(LUCID_F32) | DT(LUCID_F64);
    if (!t) return lucid_seterr(p->ctx, LUCID_ERR_ARG, "pose loss: targets is NULL");
    LUCID_TRY(check_tensor(p, "targets.cls", t->cls, 2, s2, f));
    LUCID_TRY(check_tensor(p, "targets.boxes", t->boxes, 3, s3, f));
    LUCID_TRY(check_tensor(p, "targets.kpts", t->kpts, 4, s4, f));
    LUCID_TRY(check_tensor(p, "targets.valid", t->valid, 2, s2, f | DT(LUCID_U8)));
    return LUCID_OK;
}

static lucid_status check_scalar_out(lucid_pose_loss_plan *p, const char *what,
                                     const lucid_tensor *t, int64_t n) {
    if (!t) return LUCID_OK;
    if (lucid_tensor_numel(t) != n || !lucid_dtype_is_float(t->dtype) ||
        !same_dev(lucid_tensor_device(t), p->device))
        return lucid_seterr(p->ctx, LUCID_ERR_ARG,
                            "pose loss: %s must be a float tensor of %lld "
                            "element(s) on the plan's device",
                            what, (long long)n);
    return LUCID_OK;
}

static lpl_in in_view(const lucid_tensor *t) {
    lpl_in v = {(const char *)lucid_tensor_data(t), t->dtype, t->strides[0],
                t->strides[1], t->strides[2]};
    return v;
}

static lpl_out out_view(lucid_tensor *t) {
    lpl_out v = {(char *)lucid_tensor_data(t), t->dtype, t->strides[0],
                 t->strides[1], t->strides[2]};
    return v;
}

/* ---------------------------------------------------------------- forward */

lucid_status lucid_pose_loss_forward(lucid_ctx *ctx,
                                     lucid_pose_loss_plan *plan,
                                     const lucid_tensor *pred_box,
                                     const lucid_tensor *pred_cls,
                                     const lucid_tensor *pred_kpt,
                                     const lucid_pose_targets *targets,
                                     lucid_tensor *total, lucid_tensor *items) {
    if (!plan) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: plan is NULL");
    lucid_pose_loss_plan *p = plan;
    if (ctx != p->ctx)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: plan belongs to another context");
    LUCID_TRY(check_preds(p, pred_box, pred_cls, pred_kpt, 0));
    LUCID_TRY(check_scalar_out(p, "total", total, 1));
    LUCID_TRY(check_scalar_out(p, "items", items, LUCID_POSE_LOSS_NITEMS));
    const lucid_dtype rdt = pred_box->dtype == LUCID_F64 ? LUCID_F64 : LUCID_F32;
    const int frozen = p->frozen;
    if (frozen && (!p->assigned || p->real_dt != rdt))
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "pose loss: a frozen plan needs an earlier forward "
                            "with outputs of the same compute type");
    if (!frozen) LUCID_TRY(check_targets(p, targets));

    if (p->device.type != LUCID_CPU) {
        int kerr = 0;
        const lucid_pose_loss_kernels *k =
            lucid_pose_loss_kernels_for(ctx, p->device, &kerr);
        if (kerr) return ctx->last_status;
        LUCID_TRY(k->forward(ctx, p, pred_box, pred_cls, pred_kpt, targets,
                             frozen, total, items));
        p->assigned = 1;
        p->real_dt = rdt;
        return LUCID_OK;
    }

    const lpl_in vb = in_view(pred_box), vc = in_view(pred_cls),
                 vk = in_view(pred_kpt);
    double bs, ds, ps, os, cs;
    if (rdt == LUCID_F64) {
        if (!frozen) lpl_prep_gt_f64(p, targets);
        lpl_decode_f64(p, &vb);
        if (!frozen) lpl_assign_f64(p, &vc);
        lpl_box_f64(p, &vb, !frozen, &bs, &ds, NULL, NULL);
        lpl_kpt_f64(p, &vk, &ps, &os, NULL, NULL);
        lpl_cls_f64(p, &vc, &cs, NULL, NULL);
    } else {
        if (!frozen) lpl_prep_gt_f32(p, targets);
        lpl_decode_f32(p, &vb);
        if (!frozen) lpl_assign_f32(p, &vc);
        lpl_box_f32(p, &vb, !frozen, &bs, &ds, NULL, NULL);
        lpl_kpt_f32(p, &vk, &ps, &os, NULL, NULL);
        lpl_cls_f32(p, &vc, &cs, NULL, NULL);
    }
    p->assigned = 1;
    p->real_dt = rdt;

    double *S = p->scal;
    const double tss = S[LPL_S_TSS], nfg = S[LPL_S_NFG];
    const double nk = nfg * p->cfg.nkpt;
    S[LPL_S_BOX] = nfg > 0 ? bs / tss : 0;
    S[LPL_S_DFL] = nfg > 0 ? ds / tss : 0;
    S[LPL_S_POSE] = nfg > 0 ? ps / nk : 0;
    S[LPL_S_KOBJ] = nfg > 0 ? os / nk : 0;
    S[LPL_S_CLS] = cs / tss;
    const double it[LUCID_POSE_LOSS_NITEMS] = {
        p->cfg.gain_box * S[LPL_S_BOX], p->cfg.gain_pose * S[LPL_S_POSE],
        p->cfg.gain_kobj * S[LPL_S_KOBJ], p->cfg.gain_cls * S[LPL_S_CLS],
        p->cfg.gain_dfl * S[LPL_S_DFL]};
    double sum = 0;
    for (int i = 0; i < LUCID_POSE_LOSS_NITEMS; i++) sum += it[i];
    S[LPL_S_TOTAL] = sum * p->cfg.batch;
    if (total) lucid_cpu_set(total, 0, S[LPL_S_TOTAL]);
    if (items)
        for (int i = 0; i < LUCID_POSE_LOSS_NITEMS; i++) lucid_cpu_set(items, i, it[i]);
    return LUCID_OK;
}

/* --------------------------------------------------------------- backward */

lucid_status lucid_pose_loss_backward(lucid_ctx *ctx,
                                      lucid_pose_loss_plan *plan,
                                      const lucid_tensor *pred_box,
                                      const lucid_tensor *pred_cls,
                                      const lucid_tensor *pred_kpt,
                                      const lucid_tensor *grad_scale,
                                      lucid_tensor *grad_box,
                                      lucid_tensor *grad_cls,
                                      lucid_tensor *grad_kpt) {
    if (!plan) return lucid_seterr(ctx, LUCID_ERR_ARG, "pose loss: plan is NULL");
    lucid_pose_loss_plan *p = plan;
    if (ctx != p->ctx)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss: plan belongs to another context");
    LUCID_TRY(check_preds(p, pred_box, pred_cls, pred_kpt, 0));
    LUCID_TRY(check_preds(p, grad_box, grad_cls, grad_kpt, 1));
    LUCID_TRY(check_scalar_out(p, "grad_scale", grad_scale, 1));
    const lucid_dtype rdt = pred_box->dtype == LUCID_F64 ? LUCID_F64 : LUCID_F32;
    if (!p->assigned || p->real_dt != rdt)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "pose loss: backward needs a forward with outputs "
                            "of the same compute type first");
    if (p->device.type != LUCID_CPU) {
        int kerr = 0;
        const lucid_pose_loss_kernels *k =
            lucid_pose_loss_kernels_for(ctx, p->device, &kerr);
        if (kerr) return ctx->last_status;
        return k->backward(ctx, p, pred_box, pred_cls, pred_kpt, grad_scale,
                           grad_box, grad_cls, grad_kpt);
    }
    const double g0 = grad_scale ? lucid_cpu_get(grad_scale, 0) : 1.0;
    const double *S = p->scal;
    const double tss = S[LPL_S_TSS], nfg = S[LPL_S_NFG];
    const double gB = g0 * p->cfg.batch;
    const double nk = nfg * p->cfg.nkpt;
    lpl_coef c;
    c.box = nfg > 0 ? gB * p->cfg.gain_box / tss : 0;
    c.dfl = nfg > 0 ? gB * p->cfg.gain_dfl / tss : 0;
    c.cls = gB * p->cfg.gain_cls / tss;
    c.pose = nfg > 0 ? gB * p->cfg.gain_pose / nk : 0;
    c.kobj = nfg > 0 ? gB * p->cfg.gain_kobj / nk : 0;

    const lpl_in vb = in_view(pred_box), vc = in_view(pred_cls),
                 vk = in_view(pred_kpt);
    lpl_out ob, oc, ok;
    if (grad_box) ob = out_view(grad_box);
    if (grad_cls) oc = out_view(grad_cls);
    if (grad_kpt) ok = out_view(grad_kpt);
    if (rdt == LUCID_F64) {
        if (grad_box) {
            lpl_decode_f64(p, &vb);
            lpl_box_f64(p, &vb, 0, NULL, NULL, &c, &ob);
        }
        if (grad_kpt) lpl_kpt_f64(p, &vk, NULL, NULL, &c, &ok);
        if (grad_cls) lpl_cls_f64(p, &vc, NULL, &c, &oc);
    } else {
        if (grad_box) {
            lpl_decode_f32(p, &vb);
            lpl_box_f32(p, &vb, 0, NULL, NULL, &c, &ob);
        }
        if (grad_kpt) lpl_kpt_f32(p, &vk, NULL, NULL, &c, &ok);
        if (grad_cls) lpl_cls_f32(p, &vc, NULL, &c, &oc);
    }
    return LUCID_OK;
}

lucid_status lucid_pose_loss_read_assignment(lucid_ctx *ctx,
                                             const lucid_pose_loss_plan *plan,
                                             int32_t *gt_index, double *score,
                                             double *n_fg, double *tss) {
    if (!plan || !plan->assigned)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "pose loss: no assignment yet (run a forward)");
    if (plan->device.type != LUCID_CPU) {
        int kerr = 0;
        const lucid_pose_loss_kernels *k =
            lucid_pose_loss_kernels_for(ctx, plan->device, &kerr);
        if (kerr) return ctx->last_status;
        return k->read_assignment(ctx, plan, gt_index, score, n_fg, tss);
    }
    const int64_t n = (int64_t)plan->cfg.batch * plan->A;
    if (gt_index) memcpy(gt_index, plan->tgt, (size_t)n * sizeof(int32_t));
    if (score)
        for (int64_t i = 0; i < n; i++)
            score[i] = plan->real_dt == LUCID_F64
                           ? ((const double *)plan->tscore)[i]
                           : (double)((const float *)plan->tscore)[i];
    if (n_fg) *n_fg = plan->scal[LPL_S_NFG];
    if (tss) *tss = plan->scal[LPL_S_TSS];
    return LUCID_OK;
}
