/*
 * dfl.c — the DFL projection (Distribution Focal Loss decode) on the CPU.
 *
 * Contract (see nn.h): x [B, 4*R, *S] -> y [B, 4, *S] contiguous (R =
 * reg_max, S the trailing dims, e.g. anchors A).  For side j and position s:
 *   p_k = softmax_k x[b, j*R + k, s],   y[b, j, s] = sum_k k * p_k
 *   dx[b, j*R+k, s] = beta*dx + dy[b,j,s] * p_k * (k - y[b,j,s])
 * The projection weights are the fixed 0..R-1 of Ultralytics' DFL (a frozen
 * 1x1 conv); the channel layout is x.view(B, 4, R, A) as there.
 * f64 tensors: f64 arithmetic.  f32 tensors (bf16/f16 staged through f32):
 * f32 arithmetic on blocks of 64 anchors (nn_exp_f32), threaded over
 * (image, side, block).
 * Source: Ultralytics nn/modules/block.py DFL; Li et al. 2020 (GFL).
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <math.h>
#include <stdlib.h>

#define DB 64 /* anchors per block */

typedef struct dfl_job {
    int64_t S, nb;
    int R;
    const float *x, *dy;
    float *out;
    float beta;
    int oom;
} dfl_job;

/* p [R, DB] = softmax over bins of columns [s0, s0+m) of side (b, j);
 * e[DB] = expectation */
static void dfl_block(const dfl_job *J, const float *xs, int64_t m, float *p,
                      float *e) {
    int R = J->R;
    float mx[DB], z[DB], t[DB];
    for (int64_t t = 0; t < m; t++) mx[t] = -INFINITY;
    for (int k = 0; k < R; k++)
        for (int64_t t = 0; t < m; t++) {
            float v = xs[(int64_t)k * J->S + t];
            mx[t] = v > mx[t] ? v : mx[t];
        }
    for (int k = 0; k < R; k++) {
        for (int64_t q = 0; q < m; q++) t[q] = xs[(int64_t)k * J->S + q] - mx[q];
        nn_exp_f32(t, p + k * DB, m);
    }
    for (int64_t t = 0; t < m; t++) z[t] = 0.0f, e[t] = 0.0f;
    for (int k = 0; k < R; k++)
        for (int64_t t = 0; t < m; t++) z[t] += p[k * DB + t];
    for (int64_t t = 0; t < m; t++) z[t] = 1.0f / z[t];
    for (int k = 0; k < R; k++)
        for (int64_t t = 0; t < m; t++) {
            p[k * DB + t] *= z[t];
            e[t] += (float)k * p[k * DB + t];
        }
}

static void dfl_range(void *arg, int64_t u0, int64_t u1) {
    dfl_job *J = arg;
    int R = J->R;
    float *p = malloc(sizeof(float) * (size_t)R * DB);
    if (!p) {
        __atomic_store_n(&J->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    float e[DB];
    for (int64_t u = u0; u < u1; u++) {
        int64_t bj = u / J->nb, s0 = (u % J->nb) * DB;
        int64_t m = J->S - s0 < DB ? J->S - s0 : DB;
        const float *xs = J->x + bj * R * J->S + s0;
        dfl_block(J, xs, m, p, e);
        if (!J->dy) {
            for (int64_t t = 0; t < m; t++) J->out[bj * J->S + s0 + t] = e[t];
            continue;
        }
        const float *g = J->dy + bj * J->S + s0;
        for (int k = 0; k < R; k++) {
            float *d = J->out + (bj * R + k) * J->S + s0;
            for (int64_t t = 0; t < m; t++) {
                float v = g[t] * p[k * DB + t] * ((float)k - e[t]);
                d[t] = J->beta == 0.0f ? v : J->beta * d[t] + v;
            }
        }
    }
    free(p);
}

static lucid_status dfl_f32(lucid_ctx *ctx, const lucid_tensor *x,
                            const lucid_tensor *dy, lucid_tensor *out,
                            int reg_max, double beta) {
    const char *what = dy ? "dfl backward" : "dfl forward";
    int ox = 0, ody = 0, oo = 0;
    float *xb = nn_f32_in(ctx, x, &ox, what);
    float *dyb = dy ? nn_f32_in(ctx, dy, &ody, what) : NULL;
    float *ob = nn_f32_out(ctx, out, dy && beta != 0.0, &oo, what);
    lucid_status st = LUCID_ERR_OOM;
    if (xb && (!dy || dyb) && ob) {
        int64_t S = 1;
        for (int i = 2; i < x->ndim; i++) S *= x->shape[i];
        dfl_job J = {.S = S, .nb = (S + DB - 1) / DB, .R = reg_max, .x = xb,
                     .dy = dyb, .out = ob, .beta = (float)beta};
        nn_parallel(ctx, x->shape[0] * 4 * J.nb, 32, dfl_range, &J);
        st = J.oom ? lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of host memory", what)
                   : LUCID_OK;
    }
    nn_f32_done(out, ob, oo, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    if (dy) nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

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
    if (x->dtype != LUCID_F64) return dfl_f32(ctx, x, dy, dx, reg_max, beta);
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
