/*
 * softmax.c — softmax over the last dim on the CPU, forward and backward.
 *
 * Contract (see nn.h): x, y, dy, dx contiguous, same shape, rank >= 1,
 * viewed as [rows, L] with L the last dim.
 *   forward:  y = exp(x - max) / sum(exp(x - max))          (overwrites)
 *   backward (takes the forward OUTPUT y):
 *             dx = beta*dx + y * (dy - sum_L(dy * y))
 * f64 tensors: f64 arithmetic.  f32 tensors (bf16/f16 staged through f32):
 * nn_exp_f32, sums and the dot in f64, threaded over rows.
 * Source: PyTorch torch.softmax(dim=-1); the attention of Ultralytics'
 * Attention block is softmax((q*scale)^T k) over keys.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <math.h>

typedef struct sm_job {
    int64_t L;
    const float *x, *y, *dy;
    float *out;
    float beta;
} sm_job;

static void sm_fwd_range(void *arg, int64_t r0, int64_t r1) {
    sm_job *J = arg;
    int64_t L = J->L;
    float t[256]; /* x - max, in chunks (nn_exp_f32 wants distinct buffers) */
    for (int64_t r = r0; r < r1; r++) {
        const float *x = J->x + r * L;
        float *y = J->out + r * L;
        float m = -INFINITY;
        for (int64_t i = 0; i < L; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i0 = 0; i0 < L; i0 += 256) {
            int64_t n = L - i0 < 256 ? L - i0 : 256;
            for (int64_t i = 0; i < n; i++) t[i] = x[i0 + i] - m;
            nn_exp_f32(t, y + i0, n);
        }
        float inv = (float)(1.0 / nn_sum_f64(y, L));
        for (int64_t i = 0; i < L; i++) y[i] *= inv;
    }
}

static void sm_bwd_range(void *arg, int64_t r0, int64_t r1) {
    sm_job *J = arg;
    int64_t L = J->L;
    for (int64_t r = r0; r < r1; r++) {
        const float *y = J->y + r * L, *g = J->dy + r * L;
        float *dx = J->out + r * L;
        double l[4] = {0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 4 <= L; i += 4)
            for (int k = 0; k < 4; k++) l[k] += (double)g[i + k] * y[i + k];
        for (; i < L; i++) l[0] += (double)g[i] * y[i];
        float dot = (float)((l[0] + l[2]) + (l[1] + l[3]));
        if (J->beta == 0.0f)
            for (i = 0; i < L; i++) dx[i] = y[i] * (g[i] - dot);
        else
            for (i = 0; i < L; i++) dx[i] = J->beta * dx[i] + y[i] * (g[i] - dot);
    }
}

static lucid_status sm_f32(lucid_ctx *ctx, const lucid_tensor *a,
                           const lucid_tensor *dy, lucid_tensor *out,
                           double beta) {
    const char *what = dy ? "softmax backward" : "softmax forward";
    int oa = 0, ody = 0, oo = 0;
    float *ab = nn_f32_in(ctx, a, &oa, what);
    float *dyb = dy ? nn_f32_in(ctx, dy, &ody, what) : NULL;
    float *ob = nn_f32_out(ctx, out, dy && beta != 0.0, &oo, what);
    lucid_status st = LUCID_ERR_OOM;
    if (ab && (!dy || dyb) && ob) {
        int64_t L = a->shape[a->ndim - 1];
        int64_t rows = L ? lucid_tensor_numel(a) / L : 0;
        sm_job J = {.L = L, .x = ab, .y = ab, .dy = dyb, .out = ob,
                    .beta = (float)beta};
        int64_t grain = L >= NN_GRAIN / 4 ? 1 : (NN_GRAIN / 4) / (L > 0 ? L : 1);
        nn_parallel(ctx, rows, grain, dy ? sm_bwd_range : sm_fwd_range, &J);
        st = LUCID_OK;
    }
    nn_f32_done(out, ob, oo, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)a, ab, oa, 0);
    if (dy) nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

lucid_status cpu_softmax_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                 lucid_tensor *y) {
    if (x->dtype != LUCID_F64) return sm_f32(ctx, x, NULL, y, 0.0);
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
    if (y->dtype != LUCID_F64) return sm_f32(ctx, y, dy, dx, beta);
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
