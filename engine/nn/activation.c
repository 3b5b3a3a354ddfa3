/*
 * activation.c — SiLU on the CPU, forward and backward, and the vectorisable
 * f32 exp (nn_exp_f32) shared by the f32 paths of softmax and DFL.
 *
 * Contract (see nn.h): x, y, dy, dx contiguous, same shape and dtype.
 *   forward:  y = x * s,  s = sigmoid(x) = 1 / (1 + exp(-x))   (overwrites)
 *   backward: dx = beta*dx + dy * s * (1 + x * (1 - s))
 * f64 tensors: computed in f64, rounded once on store.  f32 tensors (bf16/f16
 * staged through f32): f32 arithmetic with nn_exp_f32, in blocks of 256
 * elements, threaded over blocks.
 * Source: PyTorch nn.SiLU documentation (Elfwing et al. 2017); the exp is
 * Cephes expf (S. Moshier), Cody-Waite reduction and a degree-6 polynomial.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <math.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// f32 exp

void nn_exp_f32(const float *restrict x, float *restrict y, int64_t n) {
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    const float log2e = 1.44269504088896341f, c1 = 0.693359375f,
                c2 = -2.12194440e-4f;
    for (int64_t i = 0; i < n; i++) {
        /* clamp by bit selects (branch-free, so it vectorises; NaN stays) */
        float v = x[i];
        int32_t vb, hb, lb, mh = -(int32_t)(v > hi), ml = -(int32_t)(v < lo);
        memcpy(&vb, &v, 4);
        memcpy(&hb, &hi, 4);
        memcpy(&lb, &lo, 4);
        vb = (vb & ~(mh | ml)) | (hb & mh) | (lb & ml);
        memcpy(&v, &vb, 4);
        /* n = round(v * log2 e), by the 1.5 * 2^23 trick (|v*log2e| < 128) */
        float fn = (v * log2e + 12582912.0f) - 12582912.0f;
        float r = v - fn * c1;
        r = r - fn * c2;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        /* 2^n for n in [-126, 127]: exponent bits; n = -127/128 edge by two
         * factors of 2^(n/2) */
        int32_t k = (int32_t)fn;
        int32_t k1 = k >> 1, k2 = k - k1;
        int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
        float s1, s2;
        memcpy(&s1, &b1, 4);
        memcpy(&s2, &b2, 4);
        y[i] = p * s1 * s2;
    }
}

// ----------------------------------------------------------------------------
// f32 SiLU, blocks of NB elements

#define NB 256

typedef struct silu_job {
    const float *x, *dy;
    float *y, *dx;
    float beta;
    int64_t n;
} silu_job;

static void silu_fwd_range(void *arg, int64_t b0, int64_t b1) {
    silu_job *J = arg;
    float e[NB], nx[NB];
    for (int64_t b = b0; b < b1; b++) {
        int64_t i0 = b * NB, m = J->n - i0 < NB ? J->n - i0 : NB;
        const float *restrict x = J->x + i0;
        float *restrict y = J->y + i0;
        for (int64_t i = 0; i < m; i++) nx[i] = -x[i];
        nn_exp_f32(nx, e, m);
        for (int64_t i = 0; i < m; i++) y[i] = x[i] / (1.0f + e[i]);
    }
}

static void silu_bwd_range(void *arg, int64_t b0, int64_t b1) {
    silu_job *J = arg;
    float e[NB], nx[NB];
    for (int64_t b = b0; b < b1; b++) {
        int64_t i0 = b * NB, m = J->n - i0 < NB ? J->n - i0 : NB;
        const float *restrict x = J->x + i0, *restrict dy = J->dy + i0;
        float *restrict dx = J->dx + i0;
        for (int64_t i = 0; i < m; i++) nx[i] = -x[i];
        nn_exp_f32(nx, e, m);
        float beta = J->beta;
        if (beta == 0.0f) {
            for (int64_t i = 0; i < m; i++) {
                float s = 1.0f / (1.0f + e[i]);
                dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
            }
        } else {
            for (int64_t i = 0; i < m; i++) {
                float s = 1.0f / (1.0f + e[i]);
                dx[i] = beta * dx[i] + dy[i] * s * (1.0f + x[i] * (1.0f - s));
            }
        }
    }
}

static lucid_status silu_f32(lucid_ctx *ctx, const lucid_tensor *x,
                             const lucid_tensor *dy, lucid_tensor *out,
                             double beta) {
    const char *what = dy ? "silu backward" : "silu forward";
    int ox = 0, ody = 0, oo = 0;
    float *xb = nn_f32_in(ctx, x, &ox, what);
    float *dyb = dy ? nn_f32_in(ctx, dy, &ody, what) : NULL;
    float *ob = nn_f32_out(ctx, out, dy && beta != 0.0, &oo, what);
    lucid_status st = LUCID_ERR_OOM;
    if (xb && (!dy || dyb) && ob) {
        silu_job J = {.x = xb, .dy = dyb, .beta = (float)beta,
                      .n = lucid_tensor_numel(x)};
        if (dy) J.dx = ob;
        else J.y = ob;
        nn_parallel(ctx, (J.n + NB - 1) / NB, NN_GRAIN / NB,
                    dy ? silu_bwd_range : silu_fwd_range, &J);
        st = LUCID_OK;
    }
    nn_f32_done(out, ob, oo, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    if (dy) nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

// ----------------------------------------------------------------------------
// entry points

lucid_status cpu_silu_forward(lucid_ctx *ctx, const lucid_tensor *x,
                              lucid_tensor *y) {
    if (x->dtype != LUCID_F64) return silu_f32(ctx, x, NULL, y, 0.0);
    int64_t n = lucid_tensor_numel(x);
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    for (int64_t i = 0; i < n; i++) {
        double v = nn_ld(xd, x->dtype, i);
        nn_st(yd, y->dtype, i, v * nn_sigmoid_f64(v));
    }
    return LUCID_OK;
}

lucid_status cpu_silu_backward(lucid_ctx *ctx, const lucid_tensor *x,
                               const lucid_tensor *dy, lucid_tensor *dx,
                               double beta) {
    if (x->dtype != LUCID_F64) return silu_f32(ctx, x, dy, dx, beta);
    int64_t n = lucid_tensor_numel(x);
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t i = 0; i < n; i++) {
        double v = nn_ld(xd, x->dtype, i), s = nn_sigmoid_f64(v);
        double g = nn_ld(dyd, dy->dtype, i) * s * (1.0 + v * (1.0 - s));
        nn_st_beta(dxd, dx->dtype, i, g, beta);
    }
    return LUCID_OK;
}
