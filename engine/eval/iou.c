/*
 * iou.c — overlap measures used by validation: box IoU and keypoint OKS.
 * Sources: Ultralytics utils/metrics.py box_iou (eps 1e-7) and kpt_iou
 * (area = box w*h * 0.53 in the pose validator, eps 1e-7); COCO sigmas
 * from pycocotools (Ultralytics OKS_SIGMA).
 */
#include "eval.h"
#include <math.h>

const float lucid_coco_kpt_sigmas[17] = {
    0.026f, 0.025f, 0.025f, 0.035f, 0.035f, 0.079f, 0.079f, 0.072f, 0.072f,
    0.062f, 0.062f, 0.107f, 0.107f, 0.087f, 0.087f, 0.089f, 0.089f};

float lucid_box_iou(const float *a, const float *b) {
    float iw = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float ih = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    float inter = (iw > 0 ? iw : 0) * (ih > 0 ? ih : 0);
    float area_a = (a[2] - a[0]) * (a[3] - a[1]);
    float area_b = (b[2] - b[0]) * (b[3] - b[1]);
    return inter / (area_a + area_b - inter + 1e-7f);
}

float lucid_kpt_oks(const float *gt, const float *pred, int K,
                    const float *sigmas, float gt_area) {
    float sum = 0.0f;
    int nvis = 0;
    for (int k = 0; k < K; k++) {
        if (gt[3 * k + 2] == 0.0f) continue;
        float dx = gt[3 * k] - pred[3 * k];
        float dy = gt[3 * k + 1] - pred[3 * k + 1];
        float s2 = (2.0f * sigmas[k]) * (2.0f * sigmas[k]);
        float e = (dx * dx + dy * dy) / (s2 * (gt_area + 1e-7f) * 2.0f);
        sum += expf(-e);
        nvis++;
    }
    return sum / ((float)nvis + 1e-7f);
}
