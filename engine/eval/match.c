/*
 * match.c — which predictions are true positives at each threshold.
 * Source: Ultralytics engine/validator.py BaseValidator.match_predictions
 * (non-SciPy branch), and for crowd regions the COCO rule of pycocotools
 * (a detection whose intersection-over-detection-area with a crowd region
 * reaches the threshold, and that matched no ground truth, is ignored).
 */
#include "eval.h"
#include <stdlib.h>
#include <string.h>

const float lucid_eval_thresholds[LUCID_EVAL_NTHR] = {
    0.50f, 0.55f, 0.60f, 0.65f, 0.70f, 0.75f, 0.80f, 0.85f, 0.90f, 0.95f};

typedef struct pair {
    float iou;
    int gt, pred, order;
} pair;

/* iou descending, ties by enumeration order (row-major gt, pred). */
static int pair_cmp(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    if (a->iou > b->iou) return -1;
    if (a->iou < b->iou) return 1;
    return (a->order > b->order) - (a->order < b->order);
}

int lucid_match_predictions(const float *iou, const int *gt_cls, int n_gt,
                            const int *pred_cls, int n_pred,
                            uint8_t *correct) {
    memset(correct, 0, (size_t)n_pred * LUCID_EVAL_NTHR);
    if (n_gt == 0 || n_pred == 0) return 0;
    pair *pairs = malloc(sizeof(pair) * (size_t)n_gt * (size_t)n_pred);
    int *best_gt_for_pred = malloc(sizeof(int) * (size_t)(n_pred + n_gt));
    if (!pairs || !best_gt_for_pred) {
        free(pairs);
        free(best_gt_for_pred);
        return -1;
    }
    int *taken_gt = best_gt_for_pred + n_pred;
    for (int t = 0; t < LUCID_EVAL_NTHR; t++) {
        float thr = lucid_eval_thresholds[t];
        int np_ = 0;
        for (int g = 0; g < n_gt; g++)
            for (int p = 0; p < n_pred; p++) {
                float v = iou[(size_t)g * n_pred + p];
                if (gt_cls[g] == pred_cls[p] && v >= thr) {
                    pairs[np_].iou = v;
                    pairs[np_].gt = g;
                    pairs[np_].pred = p;
                    pairs[np_].order = np_;
                    np_++;
                }
            }
        if (np_ == 0) continue;
        qsort(pairs, (size_t)np_, sizeof *pairs, pair_cmp);
        /* first (highest-iou) pair per prediction */
        for (int p = 0; p < n_pred; p++) best_gt_for_pred[p] = -1;
        for (int i = 0; i < np_; i++)
            if (best_gt_for_pred[pairs[i].pred] < 0)
                best_gt_for_pred[pairs[i].pred] = pairs[i].gt;
        /* survivors in prediction order; first per ground truth wins */
        for (int g = 0; g < n_gt; g++) taken_gt[g] = 0;
        for (int p = 0; p < n_pred; p++) {
            int g = best_gt_for_pred[p];
            if (g >= 0 && !taken_gt[g]) {
                taken_gt[g] = 1;
                correct[(size_t)p * LUCID_EVAL_NTHR + t] = 1;
            }
        }
    }
    free(pairs);
    free(best_gt_for_pred);
    return 0;
}

/* intersection over the area of box a (the detection) */
static float ioa(const float *a, const float *b) {
    float iw = (a[2] < b[2] ? a[2] : b[2]) - (a[0] > b[0] ? a[0] : b[0]);
    float ih = (a[3] < b[3] ? a[3] : b[3]) - (a[1] > b[1] ? a[1] : b[1]);
    float inter = (iw > 0 ? iw : 0) * (ih > 0 ? ih : 0);
    float area = (a[2] - a[0]) * (a[3] - a[1]);
    return area > 0 ? inter / area : 0.0f;
}

void lucid_apply_crowd(const lucid_det *preds, int n_pred,
                       const float *crowd_boxes, int n_crowd,
                       const uint8_t *correct, int8_t *tp) {
    for (int p = 0; p < n_pred; p++) {
        float best = 0.0f;
        for (int c = 0; c < n_crowd; c++) {
            float v = ioa(preds[p].box, crowd_boxes + 4 * c);
            if (v > best) best = v;
        }
        for (int t = 0; t < LUCID_EVAL_NTHR; t++) {
            float thr = lucid_eval_thresholds[t];
            size_t k = (size_t)p * LUCID_EVAL_NTHR + t;
            if (correct[k]) tp[k] = 1;
            else tp[k] = (n_crowd > 0 && best >= thr) ? -1 : 0;
        }
    }
}
