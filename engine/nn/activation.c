/*
 * activation.c — SiLU on the CPU, forward and backward.
 *
 * Contract (see nn.h): x, y, dy, dx contiguous, same shape and dtype.
 *   forward:  y = x * s,  s = sigmoid(x) = 1 / (1 + exp(-x))   (overwrites)
 *   backward: dx = beta*dx + dy * s * (1 + x * (1 - s))
 * Computed in f64, rounded once on store.
 * Source: PyTorch nn.SiLU documentation (Elfwing et al. 2017).
 */
#include "nn/nn_cpu.h"
#include <math.h>

static inline double sigmoid(double x) {
    /* stable for large |x| */
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

lucid_status cpu_silu_forward(lucid_ctx *ctx, const lucid_tensor *x,
                              lucid_tensor *y) {
    int64_t n = lucid_tensor_numel(x);
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    for (int64_t i = 0; i < n; i++) {
        double v = nn_ld(xd, x->dtype, i);
        nn_st(yd, y->dtype, i, v * sigmoid(v));
    }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_silu_backward(lucid_ctx *ctx, const lucid_tensor *x,
                               const lucid_tensor *dy, lucid_tensor *dx,
                               double beta) {
    int64_t n = lucid_tensor_numel(x);
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t i = 0; i < n; i++) {
        double v = nn_ld(xd, x->dtype, i), s = sigmoid(v);
        double g = nn_ld(dyd, dy->dtype, i) * s * (1.0 + v * (1.0 - s));
        nn_st_beta(dxd, dx->dtype, i, g, beta);
    }
    (void)ctx;
    return LUCID_OK;
}
