/*
 * loss_kpt.c — the keypoint terms of the pose loss: the OKS-shaped location
 * loss (KeypointLoss) and the visibility BCE (kobj), forward and backward
 * (CPU reference; formulas in train/loss.h).
 *
 * Contract
 *   lpl_kpt_*  over fg anchors a with assigned gt t:
 *                pose_sum += sum_k factor (1 - exp(-e_k)) m_k
 *                kobj_sum += sum_k BCEwithLogits(vis_k, m_k)
 *              (the caller divides both by n_fg * K). With gkpt != NULL
 *              writes d total / d raw keypoints for every anchor (zeros on
 *              background) using coef->pose / coef->kobj as d total / d
 *              pose_sum, d kobj_sum. Keypoint targets, the mask m, the
 *              factor (float32 reciprocal * K, as the reference) and the
 *              box area are detached.
 *
 * Template: included twice by itself (real_t float / double), as
 * assigner.c explains.
 */
#ifndef LPL_SUFFIX

#define LUCID_POSE_LOSS_INTERNAL
#include "loss.h"
#include "internal.h"
#include <math.h>

#define real_t float
#define LPL_SUFFIX f32
#include "loss_kpt.c"
#undef real_t
#undef LPL_SUFFIX

#define real_t double
#define LPL_SUFFIX f64
#include "loss_kpt.c"
#undef real_t
#undef LPL_SUFFIX

#else /* ------------------------------------------- template body */

void LPL_FN(kpt)(lucid_pose_loss_plan *p, const lpl_in *kpt,
                 double *pose_sum, double *kobj_sum, const lpl_coef *coef,
                 const lpl_out *gkpt) {
    const int B = p->cfg.batch, A = p->A, G = p->cfg.max_gt;
    const int K = p->cfg.nkpt;
    double psum = 0, osum = 0;
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            const int64_t i = (int64_t)b * A + a;
            const int t = p->tgt[i];
            if (t < 0) {
                if (gkpt)
                    for (int c = 0; c < 3 * K; c++) lpl_set(gkpt, b, c, a, 0.0);
                continue;
            }
            const real_t ax = (real_t)p->anc[a * 3], ay = (real_t)p->anc[a * 3 + 1];
            const real_t s = (real_t)p->anc[a * 3 + 2];
            const int64_t r = (int64_t)b * G + t;
            const real_t *gb = (const real_t *)p->gt_box + r * 4;
            const real_t *gk = (const real_t *)p->gt_kpt + r * K * 3;
            /* area = w h of the target box in grid units (xyxy2xywh) */
            const real_t area = (gb[2] / s - gb[0] / s) * (gb[3] / s - gb[1] / s);
            int nvis = 0;
            for (int k = 0; k < K; k++) nvis += gk[k * 3 + 2] != 0;
            /* The reference writes K / (count + 1e-9): an int64 count plus a
             * Python float is float32 (torch's default dtype), and int /
             * tensor runs as reciprocal(tensor) * int. So: two float32
             * roundings, also for f64 outputs (checked against torch). */
            const float rcp = 1.0f / ((float)nvis + 1e-9f);
            const real_t factor = (real_t)(rcp * (float)K);
            for (int k = 0; k < K; k++) {
                const real_t rx = (real_t)lpl_get(kpt, b, k * 3 + 0, a);
                const real_t ry = (real_t)lpl_get(kpt, b, k * 3 + 1, a);
                const real_t rv = (real_t)lpl_get(kpt, b, k * 3 + 2, a);
                const real_t m = gk[k * 3 + 2] != 0 ? (real_t)1 : (real_t)0;
                /* kpts_decode: 2 raw + (anchor - 0.5); target px / stride */
                const real_t px = rx * 2 + (ax - (real_t)0.5);
                const real_t py = ry * 2 + (ay - (real_t)0.5);
                const real_t dx = px - gk[k * 3] / s, dy = py - gk[k * 3 + 1] / s;
                const real_t d = dx * dx + dy * dy;
                const real_t sg2 = (real_t)2 * (real_t)p->sigmas[k];
                const real_t den = sg2 * sg2 * (area + (real_t)1e-9) * 2;
                const real_t ex = LPL_EXP(-(d / den));
                psum += (double)(factor * ((1 - ex) * m));
                osum += (double)LPL_BCE(rv, m);
                if (!gkpt) continue;
                /* d/d raw: factor m exp(-e) / den * 2 d{x,y} * 2 (decode) */
                const real_t gd = m != 0 ? (real_t)coef->pose * factor * ex / den : 0;
                lpl_set(gkpt, b, k * 3 + 0, a, (double)(gd * 4 * dx));
                lpl_set(gkpt, b, k * 3 + 1, a, (double)(gd * 4 * dy));
                lpl_set(gkpt, b, k * 3 + 2, a,
                        (double)((real_t)coef->kobj * (LPL_SIGMOID(rv) - m)));
            }
        }
    if (pose_sum) *pose_sum = psum;
    if (kobj_sum) *kobj_sum = osum;
}

#endif /* LPL_SUFFIX */
