/*
 * softmax.c — softmax over the last dim on the CPU, forward and backward.
 *
 * Contract (see nn.h): x, y, dy, dx contiguous, same shape, rank >= 1,
 * viewed as [rows, L] with L the last dim.
 *   forward:  y = exp(x - max) / sum(exp(x - max))          (overwrites)
 *   backward (takes the forward OUTPUT y):
 *             dx = beta*dx + y * (dy - sum_L(dy * y))
 * Source: PyTorch torch.softmax(dim=-1); the attention of Ultralytics'
 * Attention block is softmax((q*scale)^T k) over keys.
 */
#include "nn/nn_cpu.h"
#include <math.h>

lucid_status cpu_softmax_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                 lucid_tensor *y) {
    int64_t L = x->shape[x->ndim - 1];
    int64_t rows = L ? lucid_tensor_numel(x) / L : 0;
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * L;
        double m = -INFINITY;
        for (int64_t i = 0; i < L; i++) {
            double v = nn_ld(xd, x->dtype, base + i);
            if (v > m) m = v;
        }
        double s = 0.0;
        for (int64_t i = 0; i < L; i++) s += exp(nn_ld(xd, x->dtype, base + i) - m);
        for (int64_t i = 0; i < L; i++)
            nn_st(yd, y->dtype, base + i, exp(nn_ld(xd, x->dtype, base + i) - m) / s);
    }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_softmax_backward(lucid_ctx *ctx, const lucid_tensor *y,
                                  const lucid_tensor *dy, lucid_tensor *dx,
                                  double beta) {
    int64_t L = y->shape[y->ndim - 1];
    int64_t rows = L ? lucid_tensor_numel(y) / L : 0;
    const void *yd = lucid_tensor_data(y), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * L;
        double dot = 0.0;
        for (int64_t i = 0; i < L; i++)
            dot += nn_ld(dyd, dy->dtype, base + i) * nn_ld(yd, y->dtype, base + i);
        for (int64_t i = 0; i < L; i++) {
            double yv = nn_ld(yd, y->dtype, base + i);
            double g = yv * (nn_ld(dyd, dy->dtype, base + i) - dot);
            nn_st_beta(dxd, dx->dtype, base + i, g, beta);
        }
    }
    (void)ctx;
    return LUCID_OK;
}
