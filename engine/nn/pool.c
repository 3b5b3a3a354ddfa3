/*
 * pool.c — MaxPool2d on the CPU, forward and backward.
 *
 * Contract (see nn.h): x [N,C,H,W] -> y [N,C,Ho,Wo], contiguous, padding
 * -inf, dilation 1, floor mode.  Ties go to the first maximum in row-major
 * window order (strictly-greater replaces).  indices (nullable, i32
 * [N,C,Ho,Wo]) receive h*W + w of the argmax in its plane; the backward
 * uses them when given, else recomputes the argmax from x.
 *   forward overwrites y (and indices); backward: dx = beta*dx + scatter(dy).
 * Source: PyTorch nn.MaxPool2d documentation.
 */
#include "nn/nn_cpu.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* argmax (flat h*W+w) of the window of output (i, j) in plane xp, or -1
 * when the window holds only padding (cannot happen for pad <= k/2). */
static int64_t window_argmax(const void *xp, lucid_dtype dt, int64_t base,
                             int64_t H, int64_t W, int64_t i, int64_t j,
                             const lucid_pool2d_params *p, double *maxv) {
    int64_t best = -1;
    double m = -INFINITY;
    for (int64_t u = 0; u < p->kernel_h; u++) {
        int64_t hi = i * p->stride_h - p->pad_h + u;
        if (hi < 0 || hi >= H) continue;
        for (int64_t v = 0; v < p->kernel_w; v++) {
            int64_t wi = j * p->stride_w - p->pad_w + v;
            if (wi < 0 || wi >= W) continue;
            double val = nn_ld(xp, dt, base + hi * W + wi);
            if (best < 0 || val > m || (isnan(val) && !isnan(m))) {
                m = val;
                best = hi * W + wi;
            }
        }
    }
    *maxv = m;
    return best;
}

lucid_status cpu_maxpool2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y, lucid_tensor *indices,
                                   const lucid_pool2d_params *p) {
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Ho = y->shape[2], Wo = y->shape[3];
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    int32_t *id = indices ? lucid_tensor_data(indices) : NULL;
    for (int64_t pl = 0; pl < NC; pl++)
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                double m;
                int64_t a = window_argmax(xd, x->dtype, pl * H * W, H, W, i, j,
                                          p, &m);
                int64_t o = (pl * Ho + i) * Wo + j;
                nn_st(yd, y->dtype, o, m);
                if (id) id[o] = (int32_t)a;
            }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_maxpool2d_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dx,
                                    const lucid_tensor *indices,
                                    const lucid_pool2d_params *p, double beta) {
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Ho = dy->shape[2], Wo = dy->shape[3];
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    const int32_t *id = indices ? lucid_tensor_data(indices) : NULL;
    double *plane = nn_scratch(ctx, H * W, "maxpool2d backward");
    if (!plane) return LUCID_ERR_OOM;
    for (int64_t pl = 0; pl < NC; pl++) {
        memset(plane, 0, sizeof(double) * (size_t)(H * W));
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                int64_t o = (pl * Ho + i) * Wo + j, a;
                if (id) {
                    a = id[o];
                } else {
                    double m;
                    a = window_argmax(xd, x->dtype, pl * H * W, H, W, i, j, p, &m);
                }
                if (a >= 0) plane[a] += nn_ld(dyd, dy->dtype, o);
            }
        for (int64_t k = 0; k < H * W; k++)
            nn_st_beta(dxd, dx->dtype, pl * H * W + k, plane[k], beta);
    }
    free(plane);
    return LUCID_OK;
}
