/*
 * upsample.c — nearest-neighbour Upsample by an integer factor on the CPU.
 *
 * Contract (see nn.h): x [N,C,H,W] -> y [N,C,H*s,W*s], contiguous.
 *   forward:  y[n,c,i,j] = x[n,c,i/s,j/s]                   (overwrites)
 *   backward: dx[n,c,h,w] = beta*dx + sum_{a,b<s} dy[n,c,h*s+a,w*s+b]
 * Source: PyTorch nn.Upsample(scale_factor=s, mode='nearest') (for an
 * integer factor, src = floor(dst / s)).
 */
#include "nn/nn_cpu.h"

lucid_status cpu_upsample_nearest2d_forward(lucid_ctx *ctx,
                                            const lucid_tensor *x,
                                            lucid_tensor *y, int scale) {
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Ho = H * scale, Wo = W * scale;
    const char *xd = lucid_tensor_data(x);
    char *yd = lucid_tensor_data(y);
    size_t es = lucid_dtype_size(x->dtype);
    for (int64_t pl = 0; pl < NC; pl++)
        for (int64_t i = 0; i < Ho; i++) {
            const char *xr = xd + (size_t)((pl * H + i / scale) * W) * es;
            char *yr = yd + (size_t)((pl * Ho + i) * Wo) * es;
            for (int64_t j = 0; j < Wo; j++)
                for (size_t b = 0; b < es; b++)
                    yr[(size_t)j * es + b] = xr[(size_t)(j / scale) * es + b];
        }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_upsample_nearest2d_backward(lucid_ctx *ctx,
                                             const lucid_tensor *x,
                                             const lucid_tensor *dy,
                                             lucid_tensor *dx, int scale,
                                             double beta) {
    int64_t NC = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
    int64_t Wo = W * scale;
    const void *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t pl = 0; pl < NC; pl++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                double s = 0.0;
                for (int64_t a = 0; a < scale; a++) {
                    int64_t row = (pl * H * scale + h * scale + a) * Wo;
                    for (int64_t b = 0; b < scale; b++)
                        s += nn_ld(dyd, dy->dtype, row + w * scale + b);
                }
                nn_st_beta(dxd, dx->dtype, (pl * H + h) * W + w, s, beta);
            }
    (void)ctx; (void)x;
    return LUCID_OK;
}
