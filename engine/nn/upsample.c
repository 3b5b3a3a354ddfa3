/*
 * upsample.c — nearest-neighbour Upsample by an integer factor on the CPU.
 *
 * Contract (see nn.h): x [N,C,H,W] -> y [N,C,H*s,W*s], contiguous.
 *   forward:  y[n,c,i,j] = x[n,c,i/s,j/s]                   (overwrites)
 *   backward: dx[n,c,h,w] = beta*dx + sum_{a,b<s} dy[n,c,h*s+a,w*s+b]
 * The forward copies elements of any dtype (typed loops for 2/4/8-byte
 * elements); the f32 backward (bf16/f16 staged through f32) sums in f32 in
 * the order a, b; both are threaded over (image, channel) planes.
 * Source: PyTorch nn.Upsample(scale_factor=s, mode='nearest') (for an
 * integer factor, src = floor(dst / s)).
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <string.h>

typedef struct up_job {
    int64_t H, W;
    int s;
    size_t es;
    const void *src;
    void *dst;
    float beta;
} up_job;

#define UP_ROW(T)                                                            \
    do {                                                                     \
        const T *xr = (const T *)J->src + (pl * H + h) * W;                  \
        T *yr = (T *)J->dst + (pl * Ho + h * s) * Wo;                        \
        if (s == 2)                                                          \
            for (int64_t w = 0; w < W; w++) yr[2 * w] = yr[2 * w + 1] = xr[w]; \
        else                                                                 \
            for (int64_t j = 0; j < Wo; j++) yr[j] = xr[j / s];              \
        for (int a = 1; a < s; a++)                                          \
            memcpy(yr + a * Wo, yr, sizeof(T) * (size_t)Wo);                 \
    } while (0)

static void up_fwd_range(void *arg, int64_t p0, int64_t p1) {
    up_job *J = arg;
    int64_t H = J->H, W = J->W;
    int s = J->s;
    int64_t Ho = H * s, Wo = W * s;
    for (int64_t pl = p0; pl < p1; pl++)
        for (int64_t h = 0; h < H; h++) {
            if (J->es == 4) UP_ROW(uint32_t);
            else if (J->es == 2) UP_ROW(uint16_t);
            else if (J->es == 8) UP_ROW(uint64_t);
            else UP_ROW(uint8_t);
        }
}

static void up_bwd_range(void *arg, int64_t p0, int64_t p1) {
    up_job *J = arg;
    int64_t H = J->H, W = J->W;
    int s = J->s;
    int64_t Wo = W * s;
    const float *dy = J->src;
    float *dx = J->dst;
    for (int64_t pl = p0; pl < p1; pl++)
        for (int64_t h = 0; h < H; h++) {
            float *d = dx + (pl * H + h) * W;
            const float *r0 = dy + (pl * H * s + h * s) * Wo;
            for (int64_t w = 0; w < W; w++) {
                float acc = 0.0f;
                for (int a = 0; a < s; a++)
                    for (int b = 0; b < s; b++) acc += r0[a * Wo + w * s + b];
                d[w] = J->beta == 0.0f ? acc : J->beta * d[w] + acc;
            }
        }
}

static int64_t up_grain(int64_t per) {
    return per >= NN_GRAIN ? 1 : (NN_GRAIN + per - 1) / (per > 0 ? per : 1);
}

lucid_status cpu_upsample_nearest2d_forward(lucid_ctx *ctx,
                                            const lucid_tensor *x,
                                            lucid_tensor *y, int scale) {
    if (x->dtype == y->dtype) {
        up_job J = {.H = x->shape[2], .W = x->shape[3], .s = scale,
                    .es = lucid_dtype_size(x->dtype), .src = lucid_tensor_data(x),
                    .dst = lucid_tensor_data(y)};
        nn_parallel(ctx, x->shape[0] * x->shape[1],
                    up_grain(J.H * J.W * scale * scale), up_fwd_range, &J);
        return LUCID_OK;
    }
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
    if (dx->dtype != LUCID_F64) {
        const char *what = "upsample_nearest2d backward";
        int ody = 0, odx = 0;
        float *dyb = nn_f32_in(ctx, dy, &ody, what);
        float *dxb = dyb ? nn_f32_out(ctx, dx, beta != 0.0, &odx, what) : NULL;
        if (!dyb || !dxb) {
            if (dyb) nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
            return LUCID_ERR_OOM;
        }
        up_job J = {.H = dx->shape[2], .W = dx->shape[3], .s = scale, .src = dyb,
                    .dst = dxb, .beta = (float)beta};
        nn_parallel(ctx, dx->shape[0] * dx->shape[1],
                    up_grain(J.H * J.W * scale * scale), up_bwd_range, &J);
        nn_f32_done(dx, dxb, odx, 1);
        nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
        return LUCID_OK;
    }
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
