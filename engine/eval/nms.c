/*
 * nms.c — head decoding and non-maximum suppression for validation.
 * Sources: Ultralytics nn/modules/head.py (Detect: DFL + dist2bbox,
 * Pose.kpts_decode) and utils/nms.py non_max_suppression (conf > 0.001,
 * top max_nms by confidence, torchvision nms at IoU 0.7 per class,
 * max_det 300).
 */
#include "eval.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

lucid_nms_opts lucid_nms_opts_default(void) {
    lucid_nms_opts o = {0.001f, 0.7f, 300, 30000};
    return o;
}

/* IoU without eps, as torchvision.ops.nms computes it. */
static float nms_iou(const float *a, const float *b) {
    float iw = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float ih = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    float inter = (iw > 0 ? iw : 0) * (ih > 0 ? ih : 0);
    float uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) -
                inter;
    return uni > 0 ? inter / uni : 0.0f;
}

int lucid_nms_sorted(const float *boxes, const int *cls, int n,
                     float iou_thres, int max_keep, int *keep) {
    int kept = 0;
    for (int i = 0; i < n; i++) keep[i] = 1;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        if (kept == max_keep) {
            keep[i] = 0;
            continue;
        }
        kept++;
        for (int j = i + 1; j < n; j++)
            if (keep[j] && cls[j] == cls[i] &&
                nms_iou(boxes + 4 * i, boxes + 4 * j) > iou_thres)
                keep[j] = 0;
    }
    return kept;
}

typedef struct cand {
    float conf;
    int anchor;
    int cls;
} cand;

/* Descending confidence; ties by anchor index (a total order, so the result
 * does not depend on the sort algorithm). */
static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->conf > b->conf) return -1;
    if (a->conf < b->conf) return 1;
    return (a->anchor > b->anchor) - (a->anchor < b->anchor);
}

size_t lucid_eval_scratch_bytes(int A, int nc, int K) {
    (void)nc;
    (void)K;
    return (size_t)A * (sizeof(cand) + 4 * sizeof(float) + 2 * sizeof(int)) + 64;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Anchor centre (grid units) and stride of anchor a. */
static int anchor_of(const lucid_anchor_level *lv, int nlv, int a, float *ax,
                     float *ay, float *stride) {
    for (int l = 0; l < nlv; l++) {
        int n = lv[l].h * lv[l].w;
        if (a < n) {
            *ax = (float)(a % lv[l].w) + 0.5f;
            *ay = (float)(a / lv[l].w) + 0.5f;
            *stride = lv[l].stride;
            return 0;
        }
        a -= n;
    }
    return -1;
}

int lucid_eval_decode_nms(const float *box_logits, const float *cls_logits,
                          const float *kpt_raw, int A, int reg_max, int nc,
                          int K, const lucid_anchor_level *levels, int nlevels,
                          const lucid_nms_opts *opts, void *scratch,
                          lucid_det *dets, float *kpt_out) {
    if (A <= 0 || reg_max <= 0 || reg_max > 64 || nc <= 0 || K < 0 || !opts)
        return -1;
    int total = 0;
    for (int l = 0; l < nlevels; l++) total += levels[l].h * levels[l].w;
    if (total != A) return -1;

    cand *cands = scratch;
    float *boxes = (float *)(cands + A);
    int *cls = (int *)(boxes + 4 * (size_t)A);
    int *keep = cls + A;

    /* candidates: max class probability above conf_thres */
    int n = 0;
    for (int a = 0; a < A; a++) {
        int best = 0;
        float bl = cls_logits[a];
        for (int c = 1; c < nc; c++)
            if (cls_logits[(size_t)c * A + a] > bl) {
                bl = cls_logits[(size_t)c * A + a];
                best = c;
            }
        float conf = sigmoidf_(bl);
        if (conf > opts->conf_thres) {
            cands[n].conf = conf;
            cands[n].anchor = a;
            cands[n].cls = best;
            n++;
        }
    }
    qsort(cands, (size_t)n, sizeof *cands, cand_cmp);
    if (n > opts->max_nms) n = opts->max_nms;

    /* decode boxes of the candidates: DFL expectation per side */
    for (int i = 0; i < n; i++) {
        int a = cands[i].anchor;
        float ax = 0, ay = 0, stride = 1;
        anchor_of(levels, nlevels, a, &ax, &ay, &stride);
        float dist[4];
        for (int side = 0; side < 4; side++) {
            const float *lg = box_logits + (size_t)side * reg_max * A + a;
            float m = lg[0];
            for (int b = 1; b < reg_max; b++)
                if (lg[(size_t)b * A] > m) m = lg[(size_t)b * A];
            double z = 0, e = 0;
            for (int b = 0; b < reg_max; b++) {
                double w = exp((double)(lg[(size_t)b * A] - m));
                z += w;
                e += w * b;
            }
            dist[side] = (float)(e / z);
        }
        boxes[4 * i + 0] = (ax - dist[0]) * stride;
        boxes[4 * i + 1] = (ay - dist[1]) * stride;
        boxes[4 * i + 2] = (ax + dist[2]) * stride;
        boxes[4 * i + 3] = (ay + dist[3]) * stride;
        cls[i] = cands[i].cls;
    }
    int kept = lucid_nms_sorted(boxes, cls, n, opts->iou_thres, opts->max_det,
                                keep);
    int out = 0;
    for (int i = 0; i < n && out < kept; i++) {
        if (!keep[i]) continue;
        lucid_det *d = &dets[out];
        memcpy(d->box, boxes + 4 * i, sizeof d->box);
        d->conf = cands[i].conf;
        d->cls = cands[i].cls;
        d->kpts = NULL;
        if (K > 0) {
            int a = cands[i].anchor;
            float ax = 0, ay = 0, stride = 1;
            anchor_of(levels, nlevels, a, &ax, &ay, &stride);
            float *kp = kpt_out + (size_t)out * K * 3;
            for (int k = 0; k < K; k++) {
                float rx = kpt_raw[(size_t)(3 * k) * A + a];
                float ry = kpt_raw[(size_t)(3 * k + 1) * A + a];
                float rv = kpt_raw[(size_t)(3 * k + 2) * A + a];
                kp[3 * k] = (rx * 2.0f + (ax - 0.5f)) * stride;
                kp[3 * k + 1] = (ry * 2.0f + (ay - 0.5f)) * stride;
                kp[3 * k + 2] = sigmoidf_(rv);
            }
            d->kpts = kp;
        }
        out++;
    }
    return out;
}
