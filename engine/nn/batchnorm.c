/*
 * batchnorm.c — BatchNorm2d on the CPU, forward (train/eval) and backward.
 *
 * Contract (see nn.h): x, y [N,C,H,W] contiguous; per-channel tensors [C]
 * (weight, bias, running_mean, running_var, save_mean, save_invstd) in the
 * parameter dtype (f32, or f64 for gradient checks).  forward overwrites y,
 * save_mean, save_invstd and (training) updates running stats in place:
 *     running = (1 - momentum) * running + momentum * batch
 * with the unbiased variance (PyTorch semantics), num_batches_tracked += 1.
 * backward: dx = beta_input*dx + ..., dweight/dbias = beta_params*(.) + ...
 * Statistics are accumulated in f64 (two passes: mean, then centred sum of
 * squares), so they are at least as accurate as the GPU's f32 statistics.
 * Source: PyTorch nn.BatchNorm2d docs; Ioffe & Szegedy 2015 for the
 * backward through the batch statistics.
 */
#include "nn/nn_cpu.h"
#include <math.h>
#include <stdlib.h>

lucid_status cpu_batchnorm2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = x->shape[2] * x->shape[3], M = N * S;
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    lucid_dtype dt = x->dtype;
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        if (training) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) {
                int64_t base = (n * C + c) * S;
                for (int64_t i = 0; i < S; i++) s += nn_ld(xd, dt, base + i);
            }
            mean = s / (double)M;
            double ss = 0.0;
            for (int64_t n = 0; n < N; n++) {
                int64_t base = (n * C + c) * S;
                for (int64_t i = 0; i < S; i++) {
                    double d = nn_ld(xd, dt, base + i) - mean;
                    ss += d * d;
                }
            }
            var = ss / (double)M; /* biased: used for normalisation */
            if (running_mean) {
                void *rm = lucid_tensor_data(running_mean);
                double r = nn_ld(rm, running_mean->dtype, c);
                nn_st(rm, running_mean->dtype, c,
                      (1.0 - momentum) * r + momentum * mean);
            }
            if (running_var) {
                void *rv = lucid_tensor_data(running_var);
                double r = nn_ld(rv, running_var->dtype, c);
                double unbiased = ss / (double)(M - 1);
                nn_st(rv, running_var->dtype, c,
                      (1.0 - momentum) * r + momentum * unbiased);
            }
        } else {
            mean = nn_ld(lucid_tensor_data(running_mean), running_mean->dtype, c);
            var = nn_ld(lucid_tensor_data(running_var), running_var->dtype, c);
        }
        double invstd = 1.0 / sqrt(var + eps);
        nn_st(lucid_tensor_data(save_mean), save_mean->dtype, c, mean);
        nn_st(lucid_tensor_data(save_invstd), save_invstd->dtype, c, invstd);
        double wv = weight ? nn_ld(lucid_tensor_data(weight), weight->dtype, c) : 1.0;
        double bv = bias ? nn_ld(lucid_tensor_data(bias), bias->dtype, c) : 0.0;
        double scale = wv * invstd, shift = bv - mean * scale;
        for (int64_t n = 0; n < N; n++) {
            int64_t base = (n * C + c) * S;
            for (int64_t i = 0; i < S; i++)
                nn_st(yd, dt, base + i, nn_ld(xd, dt, base + i) * scale + shift);
        }
    }
    if (training && num_batches_tracked) {
        void *p = lucid_tensor_data(num_batches_tracked);
        if (num_batches_tracked->dtype == LUCID_I64)
            ((int64_t *)p)[0] += 1;
        else
            nn_st(p, num_batches_tracked->dtype, 0,
                  nn_ld(p, num_batches_tracked->dtype, 0) + 1.0);
    }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_batchnorm2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = x->shape[2] * x->shape[3], M = N * S;
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    lucid_dtype dt = x->dtype;
    for (int64_t c = 0; c < C; c++) {
        double mean = nn_ld(lucid_tensor_data(save_mean), save_mean->dtype, c);
        double invstd = nn_ld(lucid_tensor_data(save_invstd), save_invstd->dtype, c);
        double wv = weight ? nn_ld(lucid_tensor_data(weight), weight->dtype, c) : 1.0;
        /* sum(dy) and sum(dy * xhat) */
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++) {
            int64_t base = (n * C + c) * S;
            for (int64_t i = 0; i < S; i++) {
                double g = nn_ld(dyd, dy->dtype, base + i);
                double xh = (nn_ld(xd, dt, base + i) - mean) * invstd;
                sdy += g;
                sdyx += g * xh;
            }
        }
        if (dweight)
            nn_st_beta(lucid_tensor_data(dweight), dweight->dtype, c, sdyx,
                       beta_params);
        if (dbias)
            nn_st_beta(lucid_tensor_data(dbias), dbias->dtype, c, sdy,
                       beta_params);
        if (!dx) continue;
        void *dxd = lucid_tensor_data(dx);
        double k = wv * invstd;
        double mdy = sdy / (double)M, mdyx = sdyx / (double)M;
        for (int64_t n = 0; n < N; n++) {
            int64_t base = (n * C + c) * S;
            for (int64_t i = 0; i < S; i++) {
                double g = nn_ld(dyd, dy->dtype, base + i);
                double v;
                if (training) {
                    double xh = (nn_ld(xd, dt, base + i) - mean) * invstd;
                    v = k * (g - mdy - xh * mdyx);
                } else {
                    v = k * g;
                }
                nn_st_beta(dxd, dx->dtype, base + i, v, beta_input);
            }
        }
    }
    (void)ctx;
    return LUCID_OK;
}
