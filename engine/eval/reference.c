/*
 * reference.c — the straightforward validation path, kept as the oracle
 * for the optimised one (nms.c, match.c): every candidate above conf is
 * sorted with qsort, every candidate's box is decoded, greedy NMS walks the
 * whole list (lucid_nms_sorted), then the kept ones get their keypoints.
 * This is the implementation the validator used before the optimisation,
 * unchanged but for the optional stage clock (select = conf filter + qsort,
 * decode = every candidate's box, nms, kpts = the kept ones' output with
 * keypoints); spec/c/test_eval.c and bench/bench_val.lua compare the two
 * bit for bit (lucid_pose_val_config.reference selects it).
 */
#include "eval.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef lucid_eval_cand cand;

/* Descending confidence; ties by anchor index (a total order). */
static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->conf > b->conf) return -1;
    if (a->conf < b->conf) return 1;
    return (a->anchor > b->anchor) - (a->anchor < b->anchor);
}

size_t lucid_eval_reference_scratch_bytes(int A) {
    return (size_t)A * (sizeof(cand) + 4 * sizeof(float) + 2 * sizeof(int)) + 64;
}



int lucid_eval_decode_nms_reference_timed(
    const float *box_logits, const float *cls_logits, const float *kpt_raw,
    int A, int reg_max, int nc, int K, const lucid_anchor_level *levels,
    int nlevels, const lucid_nms_opts *opts, void *scratch, lucid_det *dets,
    float *kpt_out, lucid_eval_timings *tm) {
    if (A <= 0 || reg_max <= 0 || reg_max > 64 || nc <= 0 || K < 0 || !opts)
        return -1;
    int total = 0;
    for (int l = 0; l < nlevels; l++) total += levels[l].h * levels[l].w;
    if (total != A) return -1;

    cand *cands = scratch;
    float *boxes = (float *)(cands + A);
    int *cls = (int *)(boxes + 4 * (size_t)A);
    int *keep = cls + A;
    double t0 = tm ? lucid_eval_now() : 0;

    int n = lucid_eval_candidates(cls_logits, A, nc, opts->conf_thres, cands);
    qsort(cands, (size_t)n, sizeof *cands, cand_cmp);
    if (n > opts->max_nms) n = opts->max_nms;
    double t1 = tm ? lucid_eval_now() : 0;

    for (int i = 0; i < n; i++) {
        int a = cands[i].anchor;
        float ax = 0, ay = 0, stride = 1;
        lucid_eval_anchor(levels, nlevels, a, &ax, &ay, &stride);
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
    double t2 = tm ? lucid_eval_now() : 0;
    int kept = lucid_nms_sorted(boxes, cls, n, opts->iou_thres, opts->max_det,
                                keep);
    double t3 = tm ? lucid_eval_now() : 0;
    int out = 0;
    for (int i = 0; i < n && out < kept; i++) {
        if (!keep[i]) continue;
        lucid_eval_det_fill(&dets[out], boxes + 4 * i, cands[i].conf, cands[i].cls,
                            cands[i].anchor, levels, nlevels, kpt_raw, A, K,
                            kpt_out + (size_t)out * K * 3);
        out++;
    }
    if (tm) {
        tm->select += t1 - t0;
        tm->decode += t2 - t1;
        tm->nms += t3 - t2;
        tm->kpts += lucid_eval_now() - t3;
        tm->candidates += n > 0 ? n : 0;
        tm->decoded += n > 0 ? n : 0;
        tm->kept += out;
    }
    return out;
}

int lucid_eval_decode_nms_reference(const float *box_logits,
                                    const float *cls_logits,
                                    const float *kpt_raw, int A, int reg_max,
                                    int nc, int K,
                                    const lucid_anchor_level *levels,
                                    int nlevels, const lucid_nms_opts *opts,
                                    void *scratch, lucid_det *dets,
                                    float *kpt_out) {
    return lucid_eval_decode_nms_reference_timed(
        box_logits, cls_logits, kpt_raw, A, reg_max, nc, K, levels, nlevels,
        opts, scratch, dets, kpt_out, NULL);
}
