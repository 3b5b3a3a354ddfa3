/*
 * loss.h — the pose training loss (Ultralytics v8PoseLoss semantics) with the
 * task-aligned assigner, fixed shapes, no host synchronisation by design.
 *
 * Source of every formula: ../shared/reference/yolo_pose_reference.md §1.7
 * and §2 (Ultralytics 8.4.114, utils/loss.py and utils/tal.py). The function
 * names below are the Ultralytics ones the formulas come from.
 *
 * ---------------------------------------------------------------- inputs
 * Network outputs, anchors concatenated over the levels (level 0 first, each
 * level row-major over (h_l, w_l)); any of f32 / bf16 / f16 (arithmetic in
 * f32), or f64 on the CPU (arithmetic in f64, for gradient checks):
 *   pred_box [B, 4*reg_max, A]  DFL logits, channel = side*reg_max + bin,
 *                               sides l, t, r, b                 (reg_max 16)
 *   pred_cls [B, nc, A]         class logits
 *   pred_kpt [B, K*3, A]        raw keypoints, channel = k*3 + {x, y, vis}
 * Targets, fixed shape, f32 (or f64), padded per image to max_gt rows:
 *   cls [B, G]  boxes [B, G, 4] (normalised xywh, YOLO label convention)
 *   kpts [B, G, K, 3] (normalised x, y; visibility v)  valid [B, G] (u8/f32)
 * Rows with valid == 0 are padding; an image with no valid row is a negative.
 * Nothing is ever read past G = max_gt.
 *
 * ------------------------------------------------- anchors (make_anchors)
 *   anchor a of level l at cell (i, j): (x, y) = (j + 0.5, i + 0.5) grid
 *   units, stride s_a = stride_l. Image size (pixels) = (h_0 s_0, w_0 s_0),
 *   as the reference derives imgsz from the first feature map.
 *
 * ----------------------------------------------- targets (v8 preprocess)
 *   W, H image size. x *= W, y *= H, w *= W, h *= H (pixels), then
 *   xywh2xyxy: x1 = x - w/2, y1 = y - h/2, x2 = x + w/2, y2 = y + h/2.
 *   mask_gt = valid AND (x1 + y1 + x2 + y2 > 0) (the reference's padding
 *   test). Label = trunc(cls) clamped to [0, nc-1] (the reference would
 *   fail on an out-of-range class). Invalid rows read as all zeros.
 *   Keypoints: kx *= W, ky *= H (pixels).
 *
 * ----------------------------------------- prediction decode (bbox_decode,
 *                                                 dist2bbox, kpts_decode)
 *   p = softmax over the reg_max bins of one side; E = sum_i i * p_i.
 *   pred box (grid units, xyxy) = (ax - E_l, ay - E_t, ax + E_r, ay + E_b).
 *   pred keypoint (grid units) = (2 raw_x + ax - 0.5, 2 raw_y + ay - 0.5);
 *   the visibility channel stays a raw logit.
 *
 * ------------------------------------------------ bbox_iou(CIoU=True), eps=1e-7
 *   w1 = x2-x1, h1 = y2-y1+eps (same for box 2)
 *   inter = clamp(min(x2)-max(x1), 0) * clamp(min(y2)-max(y1), 0)
 *   union = w1 h1 + w2 h2 - inter + eps;           iou = inter / union
 *   cw, ch = enclosing box width/height;           c2 = cw^2 + ch^2 + eps
 *   rho2 = ((x1'+x2'-x1-x2)^2 + (y1'+y2'-y1-y2)^2) / 4
 *   v = 4/pi^2 (atan(w2/h2) - atan(w1/h1))^2;  alpha = v / (v - iou + (1+eps))
 *   CIoU = iou - (rho2/c2 + v alpha)               (alpha detached)
 *
 * ------------------------ TaskAlignedAssigner (topk 10, alpha 0.5, beta 6,
 *                                   eps 1e-9), all inputs detached, pixels
 *   1. inside (select_candidates_in_gts): the gt box goes through xyxy2xywh;
 *      a width (height) < stride[0] becomes stride[1] around the centre;
 *      back to xyxy; candidate = min(ax s - x1, ay s - y1, x2 - ax s,
 *      y2 - ay s) > 1e-9, and mask_gt.
 *   2. overlap(g,a) = clamp(CIoU(gt_px, pred_box * s), 0) for candidates,
 *      else 0; score = sigmoid(logit of the gt class);
 *      align(g,a) = score^0.5 * overlap^6 (0 for non-candidates).
 *   3. per gt: the topk anchors by align over ALL anchors (ties: the lowest
 *      anchor index wins, as torch.topk on CUDA); positive = in top-k AND
 *      candidate AND mask_gt.
 *   4. select_highest_overlaps: an anchor positive for several gts goes to
 *      argmax_g overlap(g, a) over ALL gts (first on ties; the reference
 *      argmax). target_gt_idx = that gt.
 *   5. per gt t: pos_al = max align over its (final) positives, pos_ov =
 *      max overlap; per positive anchor:
 *        norm = align(t,a) * pos_ov(t) / (pos_al(t) + 1e-9)
 *      target score = one-hot(label(t)) * norm (0 for background).
 *   Detached (constants for the gradient): fg mask, target_gt_idx, target
 *   boxes, target scores (norm), target_scores_sum, n_fg, the keypoint
 *   targets and mask, the box area of the keypoint loss, the CIoU alpha.
 *
 * ------------------------------------------------------ components (v8PoseLoss)
 *   tss = max(sum of target scores, 1); fg = assigned anchors; n_fg = |fg|.
 *   cls  = sum_{b,a,c} BCEwithLogits(z, target score) / tss
 *   box  (BboxLoss) = sum_fg (1 - CIoU(pred, target)) * norm / tss, grid units
 *          (target box = gt_px / s_a)
 *   dfl  (DFLoss, bbox2dist) = sum_fg norm * mean_sides[ CE(tl) wl + CE(tr) wr ]
 *          / tss, t = clamp(ltrb target, 0, reg_max-1-0.01), tl = floor(t),
 *          tr = tl+1, wl = tr - t, wr = 1 - wl
 *   pose (KeypointLoss) = sum_fg sum_k factor (1 - exp(-e)) m / (n_fg K),
 *          m = (v != 0), factor = K / (sum_k m + 1e-9),
 *          d = (px-gx)^2 + (py-gy)^2 (grid units, g = kpt_px / s_a),
 *          e = d / ((2 sigma_k)^2 (area + 1e-9) 2), area = w h of the
 *          target box in grid units; sigma = COCO OKS_SIGMA (K = 17) else 1/K
 *   kobj = sum_fg sum_k BCEwithLogits(vis logit, m) / (n_fg K)
 *   box, dfl, pose, kobj are 0 when n_fg = 0.
 *   items (logged) = [7.5 box, 12 pose, 1 kobj, 0.5 cls, 1.5 dfl]
 *   total (backpropagated) = B * sum(items)
 *
 * ------------------------------------------------------ use
 *   plan_create once (allocates every work buffer), then per step
 *   forward (writes total and items, keeps the assignment in the plan) and
 *   backward (writes d total / d outputs, times an optional device scalar
 *   grad_scale, e.g. the fp16 loss scale). Neither allocates nor reads
 *   anything back to the host, so both can be recorded into a CUDA graph.
 *   Backward uses the assignment and the CIoU alphas of the last forward.
 *   The CPU code is the reference; the CUDA backend ports its phases
 *   (prep_gt, decode, assign, box, kpt, cls) one kernel each, plus one
 *   finalize kernel that turns the phase sums into tss, n_fg, the items and
 *   the total in device memory (loss.c does that step on the host now);
 *   backward kernels read tss and n_fg from there, never from the host.
 *   Checked against a PyTorch transcription of the reference
 *   (spec/reference/pose_loss_ref.py, torch 2.11 on an H200): identical
 *   assignment, f64 within 1e-14, f32 within 3e-7 (gradients 3e-6 of max).
 */
#ifndef LUCID_TRAIN_LOSS_H
#define LUCID_TRAIN_LOSS_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LUCID_POSE_LOSS_MAX_LEVELS 4
#define LUCID_POSE_LOSS_NITEMS 5 /* box, pose, kobj, cls, dfl */

typedef struct lucid_pose_loss_config {
    int batch;   /* B */
    int nc;      /* classes (1 for person pose) */
    int nkpt;    /* K (17); keypoints always carry (x, y, visibility) */
    int max_gt;  /* G: instances per image, fixed */
    int reg_max; /* DFL bins (16) */
    int nlevels; /* 1 .. LUCID_POSE_LOSS_MAX_LEVELS (3) */
    int level_h[LUCID_POSE_LOSS_MAX_LEVELS];
    int level_w[LUCID_POSE_LOSS_MAX_LEVELS];
    double strides[LUCID_POSE_LOSS_MAX_LEVELS]; /* 8, 16, 32 */
    int topk;                                   /* 10 */
    double tal_alpha, tal_beta;                 /* 0.5, 6.0 */
    double gain_box, gain_cls, gain_dfl, gain_pose, gain_kobj; /* 7.5 .5 1.5 12 1 */
    const double *sigmas; /* K OKS sigmas; NULL = COCO (K=17) or 1/K */
} lucid_pose_loss_config;

/* Reference defaults: nc 1, K 17, reg_max 16, topk 10, alpha 0.5, beta 6,
 * gains 7.5/0.5/1.5/12/1, sigmas NULL. batch, max_gt and the levels are 0:
 * set them (lucid_pose_loss_config_levels fills the levels). */
lucid_pose_loss_config lucid_pose_loss_config_default(void);

/* Three levels of strides 8, 16, 32 for an image of img_h x img_w pixels
 * (both multiples of 32): level sizes img/stride. */
void lucid_pose_loss_config_levels(lucid_pose_loss_config *cfg, int img_h,
                                   int img_w);

/* The padded targets of one batch (see the top comment for shapes). */
typedef struct lucid_pose_targets {
    const lucid_tensor *cls;   /* [B, G]        f32/f64 */
    const lucid_tensor *boxes; /* [B, G, 4]     f32/f64, normalised xywh */
    const lucid_tensor *kpts;  /* [B, G, K, 3]  f32/f64 */
    const lucid_tensor *valid; /* [B, G]        u8/f32/f64, nonzero = valid */
} lucid_pose_targets;

typedef struct lucid_pose_loss_plan lucid_pose_loss_plan;

/* Validate cfg and allocate every work buffer on `device` (one storage).
 * Errors: ERR_ARG (bad sizes; fewer anchors than topk), ERR_OOM,
 * ERR_UNSUPPORTED (a device without the loss kernels). */
lucid_status lucid_pose_loss_plan_create(lucid_ctx *ctx, lucid_device device,
                                         const lucid_pose_loss_config *cfg,
                                         lucid_pose_loss_plan **out);
void lucid_pose_loss_plan_destroy(lucid_pose_loss_plan *plan);
/* A = sum_l h_l w_l. */
int lucid_pose_loss_plan_anchors(const lucid_pose_loss_plan *plan);
/* Bytes of the work storage. */
size_t lucid_pose_loss_plan_workspace_bytes(const lucid_pose_loss_plan *plan);

/* Forward. pred_* as in the top comment (same dtype, on the plan's device,
 * any strides). total: 1 element, items: 5 elements [box, pose, kobj, cls,
 * dfl] (gain-scaled, no batch factor); both any float dtype, either may be
 * NULL. Runs the assigner unless the plan is frozen. */
lucid_status lucid_pose_loss_forward(lucid_ctx *ctx,
                                     lucid_pose_loss_plan *plan,
                                     const lucid_tensor *pred_box,
                                     const lucid_tensor *pred_cls,
                                     const lucid_tensor *pred_kpt,
                                     const lucid_pose_targets *targets,
                                     lucid_tensor *total, lucid_tensor *items);

/* Backward of total w.r.t. the three outputs, multiplied by grad_scale
 * (1-element tensor on the plan's device; NULL = 1). grad_* have the shape
 * of pred_* (any float dtype; usually the same); they are overwritten, and
 * any may be NULL. Needs a forward with the same pred_* first (ERR_STATE). */
lucid_status lucid_pose_loss_backward(lucid_ctx *ctx,
                                      lucid_pose_loss_plan *plan,
                                      const lucid_tensor *pred_box,
                                      const lucid_tensor *pred_cls,
                                      const lucid_tensor *pred_kpt,
                                      const lucid_tensor *grad_scale,
                                      lucid_tensor *grad_box,
                                      lucid_tensor *grad_cls,
                                      lucid_tensor *grad_kpt);

/* Frozen plans reuse every detached quantity of the last forward (the
 * assignment, target scores, target boxes and keypoints, tss, n_fg and the
 * CIoU alphas) instead of recomputing them; targets are then ignored. This
 * is the loss as a function of the outputs with the detached parts held
 * constant — what a finite-difference check of the backward needs. */
void lucid_pose_loss_plan_set_frozen(lucid_pose_loss_plan *plan, int frozen);

/* Copy the last assignment to host memory (synchronises; tests, debugging,
 * visualisation): gt_index[b*A + a] = assigned gt or -1 (background);
 * score (may be NULL) = its normalised target score. Also returns n_fg and
 * target_scores_sum when the pointers are non-NULL. */
lucid_status lucid_pose_loss_read_assignment(lucid_ctx *ctx,
                                             const lucid_pose_loss_plan *plan,
                                             int32_t *gt_index, double *score,
                                             double *n_fg, double *tss);

/* ======================================================================
 * Internal to engine/train/loss*.c and assigner*.c (the CPU reference),
 * visible only with LUCID_POSE_LOSS_INTERNAL defined.
 * ====================================================================== */
#ifdef LUCID_POSE_LOSS_INTERNAL

/* Scalars kept in the work storage (double). */
enum {
    LPL_S_TSS = 0, /* max(sum target scores, 1) */
    LPL_S_NFG,     /* number of foreground anchors */
    LPL_S_BOX,     /* raw components, before gains */
    LPL_S_POSE,
    LPL_S_KOBJ,
    LPL_S_CLS,
    LPL_S_DFL,
    LPL_S_TOTAL,
    LPL_S_COUNT
};

struct lucid_pose_loss_plan {
    lucid_ctx *ctx;
    lucid_device device;
    lucid_pose_loss_config cfg; /* cfg.sigmas points at `sigmas` below */
    int A;
    double img_h, img_w;
    lucid_storage *ws;
    /* Views into ws. "real" arrays hold float or double (8-byte slots). */
    double *anc;       /* [A*3]: x, y (grid units), stride */
    double *sigmas;    /* [K] */
    double *scal;      /* [LPL_S_COUNT] */
    int32_t *gt_label; /* [B*G] */
    uint8_t *gt_mask;  /* [B*G] */
    void *gt_box;      /* [B*G*4] real: xyxy pixels, zeros for invalid */
    void *gt_cand;     /* [B*G*4] real: xyxy of the inside test */
    void *gt_kpt;      /* [B*G*K*3] real: x, y pixels, v */
    void *pbox;        /* [B*A*4] real: decoded predicted xyxy, grid units */
    int32_t *pos;      /* [B*G*topk]: positives of each gt, -1 = none */
    int32_t *tgt;      /* [B*A]: assigned gt, -1 = background */
    void *tscore;      /* [B*A] real: normalised target score */
    void *alpha;       /* [B*A] real: CIoU alpha of fg anchors (detached) */
    void *pos_al;      /* [B*G] real */
    void *pos_ov;      /* [B*G] real */
    int assigned;      /* a forward ran: the arrays above are valid */
    lucid_dtype real_dt; /* LUCID_F32 or LUCID_F64 of that forward */
    int frozen;
};

/* Strided [B, C, A] views of an output (or of its gradient). */
typedef struct lpl_in {
    const char *data;
    lucid_dtype dt;
    int64_t sb, sc, sa;
} lpl_in;
typedef struct lpl_out {
    char *data;
    lucid_dtype dt;
    int64_t sb, sc, sa;
} lpl_out;

static inline double lpl_get(const lpl_in *v, int64_t b, int64_t c,
                             int64_t a) {
    int64_t i = b * v->sb + c * v->sc + a * v->sa;
    switch (v->dt) {
    case LUCID_F32: return ((const float *)v->data)[i];
    case LUCID_F64: return ((const double *)v->data)[i];
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)v->data)[i]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)v->data)[i]);
    default: return 0.0;
    }
}

static inline void lpl_set(const lpl_out *v, int64_t b, int64_t c, int64_t a,
                           double x) {
    int64_t i = b * v->sb + c * v->sc + a * v->sa;
    switch (v->dt) {
    case LUCID_F32: ((float *)v->data)[i] = (float)x; break;
    case LUCID_F64: ((double *)v->data)[i] = x; break;
    case LUCID_BF16: ((uint16_t *)v->data)[i] = lucid_f32_to_bf16((float)x); break;
    case LUCID_F16: ((uint16_t *)v->data)[i] = lucid_f32_to_f16((float)x); break;
    default: break;
    }
}

/* Gradient coefficients of the backward (0 where a term is absent):
 * d total / d component_raw times the upstream scale. */
typedef struct lpl_coef {
    double box, dfl, cls, pose, kobj;
} lpl_coef;

/* The phases, each compiled for float (_f32) and double (_f64) from one
 * source by the self-including files (see assigner.c). lpl_ciou: CIoU of
 * box b1 against b2 (xyxy); *alpha is the detached alpha (computed and
 * stored unless alpha_given); with g1 != NULL adds scale * dCIoU/db1. */
#define LPL_DECLARE(SUF, T)                                                   \
    T lpl_ciou_##SUF(const T *b1, const T *b2, T *alpha, int alpha_given,     \
                     T scale, T *g1);                                         \
    void lpl_prep_gt_##SUF(lucid_pose_loss_plan *p,                           \
                           const lucid_pose_targets *t);                      \
    void lpl_decode_##SUF(lucid_pose_loss_plan *p, const lpl_in *box);        \
    void lpl_assign_##SUF(lucid_pose_loss_plan *p, const lpl_in *cls);        \
    void lpl_box_##SUF(lucid_pose_loss_plan *p, const lpl_in *box,            \
                       int store_alpha, double *box_sum, double *dfl_sum,     \
                       const lpl_coef *coef, const lpl_out *gbox);            \
    void lpl_kpt_##SUF(lucid_pose_loss_plan *p, const lpl_in *kpt,            \
                       double *pose_sum, double *kobj_sum,                    \
                       const lpl_coef *coef, const lpl_out *gkpt);            \
    void lpl_cls_##SUF(lucid_pose_loss_plan *p, const lpl_in *cls,            \
                       double *cls_sum, const lpl_coef *coef,                 \
                       const lpl_out *gcls);
LPL_DECLARE(f32, float)
LPL_DECLARE(f64, double)

/* Type-generic math for the template passes (float -> the f functions).
 * Arguments must already have the pass's real type. */
#define LPL_EXP(x) _Generic((x), float: expf, default: exp)(x)
#define LPL_LOG(x) _Generic((x), float: logf, default: log)(x)
#define LPL_LOG1P(x) _Generic((x), float: log1pf, default: log1p)(x)
#define LPL_ATAN(x) _Generic((x), float: atanf, default: atan)(x)
#define LPL_SQRT(x) _Generic((x), float: sqrtf, default: sqrt)(x)
#define LPL_POW(x, y) _Generic((x), float: powf, default: pow)(x, y)
#define LPL_FLOOR(x) _Generic((x), float: floorf, default: floor)(x)
/* sigmoid as torch computes it; BCE-with-logits as ATen does:
 * (1 - y) z - log_sigmoid(z), log_sigmoid(z) = min(z,0) - log1p(exp(-|z|)).
 * z and y must be lvalues or plain expressions of the real type. */
#define LPL_SIGMOID(z) (1 / (1 + LPL_EXP(-(z))))
#define LPL_BCE(z, y)                                                         \
    ((1 - (y)) * (z) - ((z) < 0 ? (z) : 0) +                                  \
     LPL_LOG1P(LPL_EXP((z) < 0 ? (z) : -(z))))

#define LPL_CAT_(a, b) a##_##b
#define LPL_CAT(a, b) LPL_CAT_(a, b)
/* Name of a phase in the current template pass: LPL_FN(box) -> lpl_box_f32. */
#define LPL_FN(name) LPL_CAT(lpl_##name, LPL_SUFFIX)

#endif /* LUCID_POSE_LOSS_INTERNAL */

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_LOSS_H */
