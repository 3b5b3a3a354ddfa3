/*
 * dfl.c — the DFL projection (Distribution Focal Loss decode) on the CPU.
 *
 * Contract (see nn.h): x [B, 4*R, *S] -> y [B, 4, *S] contiguous (R =
 * reg_max, S the trailing dims, e.g. anchors A).  For side j and position s:
 *   p_k = softmax_k x[b, j*R + k, s],   y[b, j, s] = sum_k k * p_k
 *   dx[b, j*R+k, s] = beta*dx + dy[b,j,s] * p_k * (k - y[b,j,s])
 * The projection weights are the fixed 0..R-1 of Ultralytics' DFL (a frozen
 * 1x1 conv); the channel layout is x.view(B, 4, R, A) as there.
 * Source: Ultralytics nn/modules/block.py DFL; Li et al. 2020 (GFL).
 */
#include "nn/nn_cpu.h"
#include <math.h>
#include <stdlib.h>

/* p[0..R) = softmax over bins of column s of side j; returns the mean. */
static double dfl_probs(const void *xd, lucid_dtype dt, int64_t base,
                        int64_t S, int R, double *p) {
    double m = -INFINITY;
    for (int k = 0; k < R; k++) {
        p[k] = nn_ld(xd, dt, base + (int64_t)k * S);
        if (p[k] > m) m = p[k];
    }
    double z = 0.0;
    for (int k = 0; k < R; k++) {
        p[k] = exp(p[k] - m);
        z += p[k];
    }
    double e = 0.0;
    for (int k = 0; k < R; k++) {
        p[k] /= z;
        e += k * p[k];
    }
    return e;
}

lucid_status cpu_dfl_forward(lucid_ctx *ctx, const lucid_tensor *x,
                             lucid_tensor *y, int reg_max) {
    int64_t B = x->shape[0], S = 1;
    for (int i = 2; i < x->ndim; i++) S *= x->shape[i];
    double *p = nn_scratch(ctx, reg_max, "dfl forward");
    if (!p) return LUCID_ERR_OOM;
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < 4; j++)
            for (int64_t s = 0; s < S; s++) {
                int64_t base = (b * 4 * reg_max + j * reg_max) * S + s;
                double e = dfl_probs(xd, x->dtype, base, S, reg_max, p);
                nn_st(yd, y->dtype, (b * 4 + j) * S + s, e);
            }
    free(p);
    return LUCID_OK;
}

lucid_status cpu_dfl_backward(lucid_ctx *ctx, const lucid_tensor *x,
                              const lucid_tensor *dy, lucid_tensor *dx,
                              int reg_max, double beta) {
    int64_t B = x->shape[0], S = 1;
    for (int i = 2; i < x->ndim; i++) S *= x->shape[i];
    double *p = nn_scratch(ctx, reg_max, "dfl backward");
    if (!p) return LUCID_ERR_OOM;
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < 4; j++)
            for (int64_t s = 0; s < S; s++) {
                int64_t base = (b * 4 * reg_max + j * reg_max) * S + s;
                double e = dfl_probs(xd, x->dtype, base, S, reg_max, p);
                double g = nn_ld(dyd, dy->dtype, (b * 4 + j) * S + s);
                for (int k = 0; k < reg_max; k++)
                    nn_st_beta(dxd, dx->dtype, base + (int64_t)k * S,
                               g * p[k] * (k - e), beta);
            }
    free(p);
    return LUCID_OK;
}
