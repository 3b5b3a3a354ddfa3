/*
 * eval.h — validation of pose models: head decoding, NMS, matching at
 * IoU/OKS thresholds 0.50:0.95, and AP/precision/recall as Ultralytics 8.4
 * computes them (ultralytics/utils/metrics.py: box_iou, kpt_iou,
 * ap_per_class, compute_ap, smooth; ultralytics/utils/nms.py:
 * non_max_suppression; ultralytics/engine/validator.py: match_predictions).
 *
 * Everything here runs on the host in f32/f64 over small per-image arrays;
 * the head outputs are copied back from the device once per validation batch.
 * All coordinates are pixels of the (letterboxed) network input; boxes are
 * xyxy unless a name says xywh. Keypoints are K x (x, y, v).
 */
#ifndef LUCID_EVAL_H
#define LUCID_EVAL_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LUCID_EVAL_NTHR 10 /* thresholds 0.50, 0.55, ..., 0.95 */

/* COCO keypoint sigmas for the 17 person keypoints (pycocotools / Ultralytics
 * OKS_SIGMA): nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles. */
extern const float lucid_coco_kpt_sigmas[17];

/* One detection after NMS. kpts points into storage owned by the result. */
typedef struct lucid_det {
    float box[4];  /* x1, y1, x2, y2 */
    float conf;    /* max class probability */
    int cls;
    const float *kpts; /* [K*3] x, y, visibility probability; NULL if K = 0 */
} lucid_det;

/* NMS options (defaults = Ultralytics validation: conf 0.001, iou 0.7,
 * max_det 300, max_nms 30000, class-aware). */
typedef struct lucid_nms_opts {
    float conf_thres;
    float iou_thres;
    int max_det;
    int max_nms;
} lucid_nms_opts;
lucid_nms_opts lucid_nms_opts_default(void);

/* Decode one image's raw head outputs into candidate rows and run NMS.
 *   box_logits [4*reg_max, A] f32, cls_logits [nc, A] f32,
 *   kpt_raw [K*3, A] f32 (K may be 0), all channel-major for this image;
 *   anchors: levels of (h, w, stride), anchors enumerated level by level,
 *   row-major, at cell centres (j+0.5, i+0.5).
 * Box: DFL expectation (softmax over reg_max bins · [0..reg_max-1]) gives
 * l,t,r,b in grid units; xyxy = (ax-l, ay-t, ax+r, ay+b) * stride.
 * Keypoints: x = (2*raw_x + (ax - 0.5)) * stride, same for y,
 * v = sigmoid(raw_v) (Ultralytics Pose.kpts_decode).
 * Output: up to opts.max_det detections sorted by confidence, written to
 * dets (capacity max_det) with keypoints in kpt_out (capacity max_det*K*3).
 * Candidates are ordered by descending confidence, ties by ascending anchor;
 * only the boxes the greedy NMS walk reaches are decoded and only the kept
 * detections get keypoints (nms.c); the result is bitwise that of
 * lucid_eval_decode_nms_reference.
 * scratch: caller buffer of at least lucid_eval_scratch_bytes(A, nc, K).
 * Returns the number of detections (>= 0), or -1 on bad arguments. */
typedef struct lucid_anchor_level {
    int h, w;
    float stride;
} lucid_anchor_level;
size_t lucid_eval_scratch_bytes(int A, int nc, int K);
int lucid_eval_decode_nms(const float *box_logits, const float *cls_logits,
                          const float *kpt_raw, int A, int reg_max, int nc,
                          int K, const lucid_anchor_level *levels, int nlevels,
                          const lucid_nms_opts *opts, void *scratch,
                          lucid_det *dets, float *kpt_out);

/* Stage timings (seconds, lucid_eval_now) and counts accumulated by the
 * validator and by lucid_eval_decode_nms_timed:
 *   select  confidence of every anchor, conf filter, ordering
 *   decode  DFL box decoding of the candidates NMS looked at
 *   nms     the greedy NMS walk
 *   kpts    keypoint decoding of the kept detections
 *   match   ground truth setup, IoU and OKS matrices, matching, crowd rule
 *   accum   appending to the AP accumulators
 * candidates: above conf (after the max_nms cut); decoded: boxes decoded;
 * kept: detections. */
typedef struct lucid_eval_timings {
    double select, decode, nms, kpts, match, accum;
    double wall; /* add_batch calls from entry to return (the stages above
                  * are summed over images, so over threads) */
    int64_t images, candidates, decoded, kept;
} lucid_eval_timings;

/* lucid_eval_decode_nms with its stage times added to *tm (NULL: none). */
int lucid_eval_decode_nms_timed(const float *box_logits,
                                const float *cls_logits, const float *kpt_raw,
                                int A, int reg_max, int nc, int K,
                                const lucid_anchor_level *levels, int nlevels,
                                const lucid_nms_opts *opts, void *scratch,
                                lucid_det *dets, float *kpt_out,
                                lucid_eval_timings *tm);

/* Monotonic clock in seconds. */
double lucid_eval_now(void);

/* The straightforward path the optimised one must equal bit for bit
 * (reference.c): full sort, every candidate decoded, lucid_nms_sorted.
 * Same arguments as lucid_eval_decode_nms; scratch of at least
 * lucid_eval_reference_scratch_bytes(A) (lucid_eval_scratch_bytes covers
 * it). */
size_t lucid_eval_reference_scratch_bytes(int A);

/* A detection candidate: sigmoid of its best class logit, its anchor and
 * class. */
typedef struct lucid_eval_cand {
    float conf;
    int anchor;
    int cls;
} lucid_eval_cand;

/* The candidates of one image in anchor order: for each anchor the best
 * class (the first of equal logits) of cls_logits [nc][A], kept when
 * sigmoid(logit) > conf_thres (Ultralytics non_max_suppression's xc);
 * writes out[0..n) and returns n (<= A).  Shared by the fast and the
 * reference path. */
int lucid_eval_candidates(const float *cls_logits, int A, int nc, float conf_thres,
                          lucid_eval_cand *out);

/* Anchor a's centre (grid units, +0.5) and stride over the levels (row-major
 * h x w each, in order); -1 when a is past the last level.  Source:
 * Ultralytics make_anchors. */
int lucid_eval_anchor(const lucid_anchor_level *lv, int nlv, int a, float *ax, float *ay,
                      float *stride);

/* One kept detection: box (x1 y1 x2 y2, input pixels), conf, cls and, for
 * K > 0, the K keypoints of `anchor` decoded into kp [K][3] as Ultralytics
 * Pose.kpts_decode ((raw*2 + (anchor - 0.5)) * stride, sigmoid visibility)
 * from kpt_raw [3K][A]; d->kpts = kp (NULL when K == 0).  Shared by the fast
 * and the reference path, so their detections agree bit for bit. */
void lucid_eval_det_fill(lucid_det *d, const float box[4], float conf, int cls, int anchor,
                         const lucid_anchor_level *levels, int nlevels, const float *kpt_raw,
                         int A, int K, float *kp);
int lucid_eval_decode_nms_reference_timed(
    const float *box_logits, const float *cls_logits, const float *kpt_raw,
    int A, int reg_max, int nc, int K, const lucid_anchor_level *levels,
    int nlevels, const lucid_nms_opts *opts, void *scratch, lucid_det *dets,
    float *kpt_out, lucid_eval_timings *tm);
int lucid_eval_decode_nms_reference(const float *box_logits,
                                    const float *cls_logits,
                                    const float *kpt_raw, int A, int reg_max,
                                    int nc, int K,
                                    const lucid_anchor_level *levels,
                                    int nlevels, const lucid_nms_opts *opts,
                                    void *scratch, lucid_det *dets,
                                    float *kpt_out);

/* Greedy NMS over n boxes already sorted by descending score; keep[i] set to
 * 1 for survivors. Suppresses j when IoU(i, j) > iou_thres and same class
 * (torchvision.ops.nms on class-offset boxes). Returns survivors count. */
int lucid_nms_sorted(const float *boxes, const int *cls, int n,
                     float iou_thres, int max_keep, int *keep);

/* IoU of two xyxy boxes: inter / (area1 + area2 - inter + 1e-7)
 * (Ultralytics box_iou). */
float lucid_box_iou(const float *a, const float *b);

/* OKS between a ground truth and a prediction (Ultralytics kpt_iou):
 * area = gt box w*h * 0.53; e = d^2 / ((2 sigma)^2 * (area + 1e-7) * 2);
 * OKS = sum over gt-visible (v != 0) of exp(-e) / (n_visible + 1e-7). */
float lucid_kpt_oks(const float *gt_kpts, const float *pred_kpts, int K,
                    const float *sigmas, float gt_area);

/* Ultralytics match_predictions for one image at the 10 thresholds:
 * iou [n_gt, n_pred] (IoU or OKS), classes; writes correct[n_pred][10] as
 * 0/1. For each threshold: all same-class pairs with iou >= t, sorted by iou
 * descending, first pair per prediction kept, then first per ground truth
 * (in prediction order). Returns 0, or -1 when out of host memory. */
int lucid_match_predictions(const float *iou, const int *gt_cls, int n_gt,
                            const int *pred_cls, int n_pred,
                            uint8_t *correct);

/* COCO crowd rule: for each threshold t, a prediction that is not a true
 * positive at t and whose intersection over its own area with any crowd box
 * is >= t is marked ignored. In: correct[n_pred][10] (0/1); out:
 * tp[n_pred][10] as 1 / 0 / -1 (ignored). crowd: [n_crowd][4] xyxy. */
void lucid_apply_crowd(const lucid_det *preds, int n_pred,
                       const float *crowd_boxes, int n_crowd,
                       const uint8_t *correct, int8_t *tp);

/* Accumulates per-image statistics for one metric (box or pose) and computes
 * P, R, mAP50, mAP50-95 at the end (Ultralytics ap_per_class). */
typedef struct lucid_ap_accum lucid_ap_accum;

lucid_status lucid_ap_accum_create(lucid_ctx *ctx, lucid_ap_accum **out);
void lucid_ap_accum_free(lucid_ap_accum *acc);
void lucid_ap_accum_reset(lucid_ap_accum *acc);
/* Add one image: n_pred predictions with confidence, class and per-threshold
 * outcome (1 true positive, 0 false positive, -1 ignored: e.g. matched to a
 * COCO crowd region; ignored predictions count neither way at that
 * threshold), and the classes of its n_gt ground truths (crowd excluded). */
lucid_status lucid_ap_accum_add(lucid_ctx *ctx, lucid_ap_accum *acc, int n_pred,
                                const float *conf, const int *pred_cls,
                                const int8_t *tp /* [n_pred][10] */, int n_gt,
                                const int *gt_cls);

typedef struct lucid_ap_result {
    double precision, recall;  /* mean over classes, at max mean-F1 conf */
    double map50, map50_95;    /* mean over classes with ground truth */
    double map[LUCID_EVAL_NTHR];
    int n_classes;             /* classes with ground truth */
    int64_t n_gt, n_pred;
} lucid_ap_result;

/* How one precision/recall curve becomes an AP:
 *  COCO        pycocotools COCOeval.accumulate: the mean over the 101 recall
 *              thresholds linspace(0, 1, 101) of the precision envelope at
 *              the first point whose recall reaches the threshold (0 when
 *              none does). Perfect predictions give 1.0. The default.
 *  ULTRALYTICS utils/metrics.py compute_ap: envelope mrec = [0, r..., r_last,
 *              1], mpre = [1, p..., 0, 0] made monotone by a reverse running
 *              max, trapezoid integral of its linear interpolation at
 *              linspace(0, 1, 101). Perfect predictions give 0.995. */
typedef enum lucid_ap_method {
    LUCID_AP_COCO = 0,
    LUCID_AP_ULTRALYTICS = 1
} lucid_ap_method;

lucid_status lucid_ap_accum_compute(lucid_ctx *ctx, const lucid_ap_accum *acc,
                                    lucid_ap_method method,
                                    lucid_ap_result *out);

/* AP of one curve (recall non-decreasing) by the given method. */
double lucid_compute_ap(const double *recall, const double *precision, int n,
                        lucid_ap_method method);

/* IoU/OKS thresholds 0.50, 0.55, ..., 0.95 as f32 (torch.linspace). */
extern const float lucid_eval_thresholds[LUCID_EVAL_NTHR];

/* ------------------------------------------------ COCO results as JSON
 * What lua/lucid/predict.lua's unletterbox + coco_entries + lua-cjson
 * produce for one image's detections, written directly (results_json.c). */

/* Letterbox geometry of one image (lucid.image.geometry): network-input
 * pixels -> original pixels as (x - pad) / ratio, clamped to [0, w|h]. */
typedef struct lucid_unletterbox {
    double rx, ry, pad_x, pad_y, w, h;
} lucid_unletterbox;

/* floor(x * 10^decimals + 0.5) / 10^decimals written as lua-cjson writes a
 * number ("%.14g"); out holds at least 32 bytes. Returns the length, or -1
 * for NaN / infinity (which cjson refuses too) or decimals outside 0..6. */
int lucid_eval_format_rounded(char *out, double x, int decimals);

/* Capacity lucid_eval_coco_json needs for n detections with K keypoints. */
size_t lucid_eval_coco_json_bound(int n, int K);

/* The n entries {"image_id", "category_id" (cls + 1), "bbox" [x, y, w, h]
 * (3 decimals), "score" (5 decimals), "keypoints" [x, y, v] * K (3, 3, 5
 * decimals)} in original-image pixels, separated by commas (no brackets),
 * NUL-terminated. Returns the length, or -1 when a value is NaN/infinite. */
int64_t lucid_eval_coco_json(const lucid_det *dets, int n, int K,
                             double image_id, const lucid_unletterbox *g,
                             char *out);

/* ------------------------------------------------------ pose validator
 * Accumulates box and pose metrics over a validation set, one batch of head
 * outputs at a time (Ultralytics PoseValidator: update_metrics with
 * _process_batch for boxes (IoU) and keypoints (OKS, area = box w*h*0.53)).
 */
typedef struct lucid_pose_val_config {
    int nc;        /* classes */
    int nkpt;      /* K (0 = detection only) */
    int reg_max;   /* 16 */
    int nlevels;
    lucid_anchor_level levels[4];
    const float *sigmas; /* [K]; NULL = COCO sigmas (K = 17) or 1/K */
    lucid_nms_opts nms;
    lucid_ap_method ap_method;
    int reference; /* 1: the straightforward decode/NMS path (reference.c),
                    * one image after the other; for tests and benchmarks */
    int threads;   /* images of a batch processed in parallel: 0 = the
                    * context's CPU threads, 1 = in order on the caller's
                    * thread. The results do not depend on it. */
} lucid_pose_val_config;

typedef struct lucid_pose_val lucid_pose_val;

lucid_status lucid_pose_val_create(lucid_ctx *ctx,
                                   const lucid_pose_val_config *cfg,
                                   lucid_pose_val **out);
void lucid_pose_val_free(lucid_pose_val *v);
void lucid_pose_val_reset(lucid_pose_val *v);

/* One batch. Head outputs on the CPU in f32, contiguous:
 *   pred_box [B, 4*reg_max, A], pred_cls [B, nc, A], pred_kpt [B, K*3, A]
 *   (NULL when K = 0).
 * Targets (the loader's fixed layout), f32 on the CPU, normalised to the
 * network input of img_w x img_h pixels: cls [B, G], boxes [B, G, 4] (cx cy
 * w h), kpts [B, G, K, 3] (x y v), mask [B, G] (nonzero = valid row).
 * crowd (may be NULL): [B, C, 4] normalised xyxy crowd regions with
 * ncrowd[B] valid rows each. Only the first n_images images are used.
 * The detections of the batch stay readable with lucid_pose_val_dets until
 * the next add_batch. */
typedef struct lucid_pose_val_batch {
    const lucid_tensor *pred_box, *pred_cls, *pred_kpt;
    const lucid_tensor *cls, *boxes, *kpts, *mask;
    const float *crowd; const int *ncrowd; int max_crowd;
    int n_images;
    float img_w, img_h;
} lucid_pose_val_batch;

lucid_status lucid_pose_val_add_batch(lucid_ctx *ctx, lucid_pose_val *v,
                                      const lucid_pose_val_batch *b);

/* Detections of image i (0-based) of the last batch; *n gets their count. */
const lucid_det *lucid_pose_val_dets(const lucid_pose_val *v, int i, int *n);

/* Stage timings accumulated since create or the last reset. */
void lucid_pose_val_timings(const lucid_pose_val *v, lucid_eval_timings *out);

typedef struct lucid_pose_metrics {
    lucid_ap_result box, pose;
    int64_t images;
    double fitness; /* box mAP50-95 + pose mAP50-95 (Ultralytics 8.4) */
} lucid_pose_metrics;

lucid_status lucid_pose_val_compute(lucid_ctx *ctx, const lucid_pose_val *v,
                                    lucid_pose_metrics *out);

#ifdef __cplusplus
}
#endif
#endif
