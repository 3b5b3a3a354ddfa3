/*
 * loss_box.c — box decode, CIoU and the box (BboxLoss) + DFL (DFLoss) terms
 * of the pose loss, forward and backward (CPU reference; formulas in
 * train/loss.h).
 *
 * Contract
 *   lpl_decode_*  pbox[b,a] = dist2bbox(softmax-expectation of the 4 sides)
 *                 in grid units, for every anchor.
 *   lpl_ciou_*    bbox_iou(CIoU=True, eps=1e-7) of b1 against b2 (xyxy),
 *                 and optionally its gradient w.r.t. b1 with alpha held
 *                 constant (the reference computes alpha under no_grad).
 *   lpl_box_*     over fg anchors: box_sum += (1 - CIoU(pred, target)) norm,
 *                 dfl_sum += norm * mean over sides of the two-bin CE;
 *                 with gbox != NULL writes d total / d logits for every
 *                 anchor (zeros on background), using coef->box/dfl as
 *                 d total / d box_sum, d dfl_sum. store_alpha: compute the
 *                 CIoU alphas and save them (forward); else use the saved
 *                 ones (backward, frozen forward).
 *   Min/max ties split the gradient in halves and a clamp at exactly 0 lets
 *   it through, as PyTorch's minimum/maximum/clamp backward do.
 *
 * Template: included twice by itself (real_t float / double), as
 * assigner.c explains.
 */
#ifndef LPL_SUFFIX

#define LUCID_POSE_LOSS_INTERNAL
#include "loss.h"
#include "internal.h"
#include <math.h>

#define LPL_MAX_REG 64 /* also checked by lucid_pose_loss_plan_create */

#define real_t float
#define LPL_SUFFIX f32
#include "loss_box.c"
#undef real_t
#undef LPL_SUFFIX

#define real_t double
#define LPL_SUFFIX f64
#include "loss_box.c"
#undef real_t
#undef LPL_SUFFIX

#else /* ------------------------------------------- template body */

/* d min(u, v) / du and d max(u, v) / du, PyTorch's tie rule (halves). */
static inline real_t LPL_FN(dmin)(real_t u, real_t v) {
    return u < v ? (real_t)1 : (u == v ? (real_t)0.5 : (real_t)0);
}
static inline real_t LPL_FN(dmax)(real_t u, real_t v) {
    return u > v ? (real_t)1 : (u == v ? (real_t)0.5 : (real_t)0);
}

real_t LPL_FN(ciou)(const real_t *b1, const real_t *b2, real_t *alpha,
                    int alpha_given, real_t scale, real_t *g1) {
    const real_t eps = (real_t)1e-7;
    const real_t x1 = b1[0], y1 = b1[1], x2 = b1[2], y2 = b1[3];
    const real_t X1 = b2[0], Y1 = b2[1], X2 = b2[2], Y2 = b2[3];
    const real_t w1 = x2 - x1, h1 = y2 - y1 + eps;
    const real_t w2 = X2 - X1, h2 = Y2 - Y1 + eps;
    const real_t ix2 = x2 < X2 ? x2 : X2, ix1 = x1 > X1 ? x1 : X1;
    const real_t iy2 = y2 < Y2 ? y2 : Y2, iy1 = y1 > Y1 ? y1 : Y1;
    const real_t iwr = ix2 - ix1, ihr = iy2 - iy1;
    const real_t iw = iwr > 0 ? iwr : 0, ih = ihr > 0 ? ihr : 0;
    const real_t inter = iw * ih;
    const real_t uni = w1 * h1 + w2 * h2 - inter + eps;
    const real_t iou = inter / uni;
    const real_t cw = (x2 > X2 ? x2 : X2) - (x1 < X1 ? x1 : X1);
    const real_t ch = (y2 > Y2 ? y2 : Y2) - (y1 < Y1 ? y1 : Y1);
    const real_t c2 = cw * cw + ch * ch + eps;
    const real_t dx = X1 + X2 - x1 - x2, dy = Y1 + Y2 - y1 - y2;
    const real_t rho2 = (dx * dx + dy * dy) / 4;
    const real_t kv = (real_t)(4.0 / (M_PI * M_PI));
    const real_t r1 = w1 / h1;
    const real_t at = LPL_ATAN(w2 / h2) - LPL_ATAN(r1);
    const real_t v = kv * (at * at);
    if (!alpha_given) *alpha = v / (v - iou + (real_t)(1.0 + 1e-7));
    const real_t al = *alpha;
    const real_t ciou = iou - (rho2 / c2 + v * al);
    if (g1) {
        /* d iou = (1/U + I/U^2) dI - I/U^2 d(w1 h1) */
        const real_t g_inter = scale * (1 / uni + inter / (uni * uni));
        const real_t g_a1 = -scale * inter / (uni * uni);
        /* v = kv at^2, at = atan(w2/h2) - atan(r1), r1 = w1/h1 */
        const real_t g_r1 = -scale * al * kv * 2 * at * (-1 / (1 + r1 * r1));
        const real_t g_w1 = g_a1 * h1 + g_r1 / h1;
        const real_t g_h1 = g_a1 * w1 - g_r1 * w1 / (h1 * h1);
        const real_t g_iw = iwr >= 0 ? g_inter * ih : 0;
        const real_t g_ih = ihr >= 0 ? g_inter * iw : 0;
        const real_t g_c2 = scale * rho2 / (c2 * c2);
        const real_t g_rho2 = -scale / c2;
        const real_t g_cw = g_c2 * 2 * cw, g_ch = g_c2 * 2 * ch;
        g1[0] += -g_w1 - g_iw * LPL_FN(dmax)(x1, X1) -
                 g_cw * LPL_FN(dmin)(x1, X1) - g_rho2 * dx / 2;
        g1[2] += g_w1 + g_iw * LPL_FN(dmin)(x2, X2) +
                 g_cw * LPL_FN(dmax)(x2, X2) - g_rho2 * dx / 2;
        g1[1] += -g_h1 - g_ih * LPL_FN(dmax)(y1, Y1) -
                 g_ch * LPL_FN(dmin)(y1, Y1) - g_rho2 * dy / 2;
        g1[3] += g_h1 + g_ih * LPL_FN(dmin)(y2, Y2) +
                 g_ch * LPL_FN(dmax)(y2, Y2) - g_rho2 * dy / 2;
    }
    return ciou;
}

/* Softmax of one side's bins z[0..R-1] into pr; returns the log-sum-exp. */
static real_t LPL_FN(softmax)(const real_t *z, int R, real_t *pr) {
    real_t m = z[0], s = 0;
    for (int i = 1; i < R; i++)
        if (z[i] > m) m = z[i];
    for (int i = 0; i < R; i++) s += (pr[i] = LPL_EXP(z[i] - m));
    for (int i = 0; i < R; i++) pr[i] = pr[i] / s;
    return m + LPL_LOG(s);
}

void LPL_FN(decode)(lucid_pose_loss_plan *p, const lpl_in *box) {
    const int B = p->cfg.batch, A = p->A, R = p->cfg.reg_max;
    real_t *pbox = p->pbox;
    real_t z[LPL_MAX_REG], pr[LPL_MAX_REG];
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            real_t E[4];
            for (int s = 0; s < 4; s++) {
                for (int i = 0; i < R; i++)
                    z[i] = (real_t)lpl_get(box, b, s * R + i, a);
                LPL_FN(softmax)(z, R, pr);
                real_t e = 0;
                for (int i = 0; i < R; i++) e += pr[i] * (real_t)i;
                E[s] = e;
            }
            const real_t ax = (real_t)p->anc[a * 3], ay = (real_t)p->anc[a * 3 + 1];
            real_t *o = pbox + ((int64_t)b * A + a) * 4;
            o[0] = ax - E[0], o[1] = ay - E[1], o[2] = ax + E[2], o[3] = ay + E[3];
        }
}

void LPL_FN(box)(lucid_pose_loss_plan *p, const lpl_in *box, int store_alpha,
                 double *box_sum, double *dfl_sum, const lpl_coef *coef,
                 const lpl_out *gbox) {
    const int B = p->cfg.batch, A = p->A, R = p->cfg.reg_max;
    const int G = p->cfg.max_gt;
    const real_t tmax = (real_t)((double)(R - 1) - 0.01);
    const real_t *tscore = p->tscore;
    real_t *alpha = p->alpha;
    real_t z[LPL_MAX_REG], pr[LPL_MAX_REG];
    double bsum = 0, dsum = 0;
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            const int64_t i = (int64_t)b * A + a;
            const int t = p->tgt[i];
            if (t < 0) {
                if (gbox)
                    for (int c = 0; c < 4 * R; c++) lpl_set(gbox, b, c, a, 0.0);
                continue;
            }
            const real_t norm = tscore[i];
            const real_t ax = (real_t)p->anc[a * 3], ay = (real_t)p->anc[a * 3 + 1];
            const real_t s = (real_t)p->anc[a * 3 + 2];
            const real_t *gb = (const real_t *)p->gt_box + ((int64_t)b * G + t) * 4;
            const real_t tb[4] = {gb[0] / s, gb[1] / s, gb[2] / s, gb[3] / s};
            const real_t *pb = (const real_t *)p->pbox + i * 4;
            real_t g1[4] = {0, 0, 0, 0};
            const real_t gscale = gbox ? (real_t)(-coef->box) * norm : 0;
            real_t ciou = LPL_FN(ciou)(pb, tb, &alpha[i], !store_alpha, gscale,
                                       gbox ? g1 : NULL);
            bsum += (double)((1 - ciou) * norm);
            /* bbox2dist: (a - x1y1, x2y2 - a), clamped to [0, R-1-0.01] */
            const real_t ltrb[4] = {ax - tb[0], ay - tb[1], tb[2] - ax, tb[3] - ay};
            /* d total / d E_side from the CIoU term: x1 = ax - E_l ... */
            const real_t gE[4] = {-g1[0], -g1[1], g1[2], g1[3]};
            const real_t cd = gbox ? (real_t)coef->dfl * norm / 4 : 0;
            real_t dfl = 0;
            for (int sd = 0; sd < 4; sd++) {
                for (int k = 0; k < R; k++)
                    z[k] = (real_t)lpl_get(box, b, sd * R + k, a);
                const real_t lse = LPL_FN(softmax)(z, R, pr);
                real_t tg = ltrb[sd];
                if (!(tg > 0)) tg = 0;
                if (tg > tmax) tg = tmax;
                const int tl = (int)tg, tr = tl + 1;
                const real_t wl = (real_t)tr - tg, wr = 1 - wl;
                dfl += (lse - z[tl]) * wl + (lse - z[tr]) * wr;
                if (!gbox) continue;
                real_t E = 0;
                for (int k = 0; k < R; k++) E += pr[k] * (real_t)k;
                for (int k = 0; k < R; k++) {
                    real_t g = gE[sd] * pr[k] * ((real_t)k - E);
                    g += cd * (wl * (pr[k] - (k == tl)) + wr * (pr[k] - (k == tr)));
                    lpl_set(gbox, b, sd * R + k, a, (double)g);
                }
            }
            dsum += (double)(dfl / 4 * norm);
        }
    if (box_sum) *box_sum = bsum;
    if (dfl_sum) *dfl_sum = dsum;
}

#endif /* LPL_SUFFIX */
