/*
 * loss_cls.c — the classification term of the pose loss: BCE with logits
 * against the soft target scores, summed over every anchor and class
 * (CPU reference; formulas in train/loss.h).
 *
 * Contract
 *   lpl_cls_*  cls_sum = sum_{b,a,c} BCEwithLogits(z, y), y = norm for the
 *              assigned gt's class of a fg anchor, else 0 (the caller
 *              divides by tss). With gcls != NULL writes
 *              coef->cls * (sigmoid(z) - y) for every element. The targets
 *              y are detached.
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
#include "loss_cls.c"
#undef real_t
#undef LPL_SUFFIX

#define real_t double
#define LPL_SUFFIX f64
#include "loss_cls.c"
#undef real_t
#undef LPL_SUFFIX

#else /* ------------------------------------------- template body */

void LPL_FN(cls)(lucid_pose_loss_plan *p, const lpl_in *cls, double *cls_sum,
                 const lpl_coef *coef, const lpl_out *gcls) {
    const int B = p->cfg.batch, A = p->A, G = p->cfg.max_gt, nc = p->cfg.nc;
    const real_t *tscore = p->tscore;
    const real_t cc = gcls ? (real_t)coef->cls : 0;
    double sum = 0;
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            const int64_t i = (int64_t)b * A + a;
            const int t = p->tgt[i];
            const int lab = t >= 0 ? p->gt_label[(int64_t)b * G + t] : -1;
            for (int c = 0; c < nc; c++) {
                const real_t z = (real_t)lpl_get(cls, b, c, a);
                const real_t y = c == lab ? tscore[i] : (real_t)0;
                sum += (double)LPL_BCE(z, y);
                if (gcls)
                    lpl_set(gcls, b, c, a, (double)(cc * (LPL_SIGMOID(z) - y)));
            }
        }
    if (cls_sum) *cls_sum = sum;
}

#endif /* LPL_SUFFIX */
