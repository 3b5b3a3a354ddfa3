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
 * f64 activations compute everything in f64; f32 (bf16/f16 staged through
 * f32) activations apply y = x*scale + shift and the dx formula in f32,
 * threaded over channels, with the per-channel sums still in f64.
 * Fused BatchNorm2d + SiLU (cpu_batchnorm2d_silu_*): the same code with
 * act = 1.  The forward computes the statistics exactly as above and applies
 * a = z * sigmoid(z) to z = x*scale + shift before the store (f32 paths: in
 * blocks of NB elements with nn_exp_f32, the arithmetic of activation.c, so
 * the f32 and f64 forwards equal batchnorm then silu bitwise); the backward
 * recomputes z from x, the saved statistics, weight and bias, turns dy into
 * g = dy * s * (1 + z*(1-s)) (s = sigmoid(z)) per channel into a per-thread
 * f32 scratch of N*H*W elements, and runs the BatchNorm2d backward on g
 * (f32: within rounding of the separate backward, whose silu reads the z the
 * forward computed from the unrounded f64 statistics).
 * Source: PyTorch nn.BatchNorm2d docs; Ioffe & Szegedy 2015 for the
 * backward through the batch statistics; nn.SiLU docs for the activation.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <math.h>
#include <stdlib.h>

static double pget(const lucid_tensor *t, int64_t c, double dflt) {
    return t ? nn_ld(lucid_tensor_data(t), t->dtype, c) : dflt;
}
static void pset(lucid_tensor *t, int64_t c, double v) {
    if (t) nn_st(lucid_tensor_data(t), t->dtype, c, v);
}

static void nbt_add_one(lucid_tensor *t) {
    void *p = lucid_tensor_data(t);
    if (t->dtype == LUCID_I64) ((int64_t *)p)[0] += 1;
    else nn_st(p, t->dtype, 0, nn_ld(p, t->dtype, 0) + 1.0);
}

/* dy * silu'(z) in f64: silu'(z) = s * (1 + z*(1-s)), s = sigmoid(z). */
static inline double silu_grad_f64(double dy, double z) {
    double s = nn_sigmoid_f64(z);
    return dy * s * (1.0 + z * (1.0 - s));
}

// ----------------------------------------------------------------------------
// f32 SiLU on an affine plane (fused paths), blocks of NB elements

#define NB 256

/* y[i] = silu(z[i]), z[i] = x[i]*scale + shift, i < S. */
static void silu_affine_plane(const float *restrict x, float *restrict y,
                              int64_t S, float scale, float shift) {
    float z[NB], nz[NB], e[NB];
    for (int64_t i0 = 0; i0 < S; i0 += NB) {
        int64_t m = S - i0 < NB ? S - i0 : NB;
        for (int64_t i = 0; i < m; i++) {
            z[i] = x[i0 + i] * scale + shift;
            nz[i] = -z[i];
        }
        nn_exp_f32(nz, e, m);
        for (int64_t i = 0; i < m; i++) y[i0 + i] = z[i] / (1.0f + e[i]);
    }
}

/* g[i] = dy[i] * silu'(z[i]), z[i] = x[i]*scale + shift, i < S. */
static void silu_grad_plane(const float *restrict x, const float *restrict dy,
                            float *restrict g, int64_t S, float scale,
                            float shift) {
    float z[NB], nz[NB], e[NB];
    for (int64_t i0 = 0; i0 < S; i0 += NB) {
        int64_t m = S - i0 < NB ? S - i0 : NB;
        for (int64_t i = 0; i < m; i++) {
            z[i] = x[i0 + i] * scale + shift;
            nz[i] = -z[i];
        }
        nn_exp_f32(nz, e, m);
        for (int64_t i = 0; i < m; i++) {
            float sg = 1.0f / (1.0f + e[i]);
            g[i0 + i] = dy[i0 + i] * sg * (1.0f + z[i] * (1.0f - sg));
        }
    }
}

// ----------------------------------------------------------------------------
// f32 path (one channel per unit)

typedef struct bn_job {
    int64_t N, C, S;
    const float *x, *dy;
    float *y, *dx;
    const lucid_tensor *weight, *bias, *save_mean, *save_invstd;
    lucid_tensor *running_mean, *running_var, *sm, *si, *dweight, *dbias;
    int training;
    int act;  /* 1: fused SiLU after the normalisation */
    int oom;  /* set by a range that could not get its scratch */
    double momentum, eps, beta_in, beta_p;
} bn_job;

static void bn_fwd_range(void *arg, int64_t c0, int64_t c1) {
    bn_job *J = arg;
    int64_t N = J->N, C = J->C, S = J->S, M = N * S;
    for (int64_t c = c0; c < c1; c++) {
        double mean, var;
        if (J->training) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += nn_sum_f64(J->x + (n * C + c) * S, S);
            mean = s / (double)M;
            double ss = 0.0;
            for (int64_t n = 0; n < N; n++) {
                const float *xp = J->x + (n * C + c) * S;
                double l[4] = {0, 0, 0, 0};
                int64_t i = 0;
                for (; i + 4 <= S; i += 4)
                    for (int k = 0; k < 4; k++) {
                        double d = (double)xp[i + k] - mean;
                        l[k] += d * d;
                    }
                for (; i < S; i++) {
                    double d = (double)xp[i] - mean;
                    l[0] += d * d;
                }
                ss += (l[0] + l[2]) + (l[1] + l[3]);
            }
            var = ss / (double)M;
            if (J->running_mean)
                pset(J->running_mean, c,
                     (1.0 - J->momentum) * pget(J->running_mean, c, 0) +
                         J->momentum * mean);
            if (J->running_var)
                pset(J->running_var, c,
                     (1.0 - J->momentum) * pget(J->running_var, c, 0) +
                         J->momentum * (ss / (double)(M - 1)));
        } else {
            mean = pget(J->running_mean, c, 0);
            var = pget(J->running_var, c, 1);
        }
        double invstd = 1.0 / sqrt(var + J->eps);
        pset(J->sm, c, mean);
        pset(J->si, c, invstd);
        double sc = pget(J->weight, c, 1.0) * invstd;
        float scale = (float)sc, shift = (float)(pget(J->bias, c, 0.0) - mean * sc);
        for (int64_t n = 0; n < N; n++) {
            const float *restrict xp = J->x + (n * C + c) * S;
            float *restrict yp = J->y + (n * C + c) * S;
            if (J->act) silu_affine_plane(xp, yp, S, scale, shift);
            else
                for (int64_t i = 0; i < S; i++) yp[i] = xp[i] * scale + shift;
        }
    }
}

static void bn_bwd_range(void *arg, int64_t c0, int64_t c1) {
    bn_job *J = arg;
    int64_t N = J->N, C = J->C, S = J->S, M = N * S;
    /* act: g = dy * silu'(z) of one channel, [N, S] */
    float *gs = NULL;
    if (J->act) {
        gs = malloc(sizeof(float) * (size_t)(M > 0 ? M : 1));
        if (!gs) {
            __atomic_store_n(&J->oom, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    for (int64_t c = c0; c < c1; c++) {
        double mean = pget(J->save_mean, c, 0), invstd = pget(J->save_invstd, c, 1);
        double wv = pget(J->weight, c, 1.0);
        float meanf = (float)mean;
        if (gs) {
            /* z as the forward computes it, from the saved statistics */
            double sc = wv * invstd;
            float scale = (float)sc, shift = (float)(pget(J->bias, c, 0.0) - mean * sc);
            for (int64_t n = 0; n < N; n++)
                silu_grad_plane(J->x + (n * C + c) * S, J->dy + (n * C + c) * S,
                                gs + n * S, S, scale, shift);
        }
        /* sum(g) and sum(g * (x - mean)) in f64 (g = dy, or dy*silu'(z)) */
        double sdy = 0.0, sdxm = 0.0;
        for (int64_t n = 0; n < N; n++) {
            const float *xp = J->x + (n * C + c) * S;
            const float *gp = gs ? gs + n * S : J->dy + (n * C + c) * S;
            double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
            int64_t i = 0;
            for (; i + 4 <= S; i += 4)
                for (int k = 0; k < 4; k++) {
                    double g = gp[i + k];
                    a[k] += g;
                    b[k] += g * ((double)xp[i + k] - mean);
                }
            for (; i < S; i++) {
                double g = gp[i];
                a[0] += g;
                b[0] += g * ((double)xp[i] - mean);
            }
            sdy += (a[0] + a[2]) + (a[1] + a[3]);
            sdxm += (b[0] + b[2]) + (b[1] + b[3]);
        }
        double sdyx = sdxm * invstd;
        if (J->dweight)
            nn_st_beta(lucid_tensor_data(J->dweight), J->dweight->dtype, c, sdyx,
                       J->beta_p);
        if (J->dbias)
            nn_st_beta(lucid_tensor_data(J->dbias), J->dbias->dtype, c, sdy,
                       J->beta_p);
        if (!J->dx) continue;
        double k = wv * invstd;
        /* training: dx = k*(dy - mean(dy)) - (x - mean) * k*invstd*mean(dy*xhat) */
        float kf = (float)k, mdy = J->training ? (float)(sdy / (double)M) : 0.0f;
        float c2 = J->training ? (float)(k * invstd * (sdyx / (double)M)) : 0.0f;
        float beta = (float)J->beta_in;
        for (int64_t n = 0; n < N; n++) {
            const float *restrict xp = J->x + (n * C + c) * S;
            const float *restrict gp = gs ? gs + n * S : J->dy + (n * C + c) * S;
            float *restrict dp = J->dx + (n * C + c) * S;
            if (beta == 0.0f) {
                for (int64_t i = 0; i < S; i++)
                    dp[i] = kf * (gp[i] - mdy) - (xp[i] - meanf) * c2;
            } else {
                for (int64_t i = 0; i < S; i++)
                    dp[i] = beta * dp[i] + (kf * (gp[i] - mdy) - (xp[i] - meanf) * c2);
            }
        }
    }
    free(gs);
}

static int64_t bn_grain(int64_t N, int64_t S) {
    int64_t per = N * S;
    return per >= NN_GRAIN ? 1 : (NN_GRAIN + per - 1) / (per > 0 ? per : 1);
}

static lucid_status bn_forward_f32(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y, const lucid_tensor *weight,
                                   const lucid_tensor *bias, lucid_tensor *rm,
                                   lucid_tensor *rv, lucid_tensor *sm,
                                   lucid_tensor *si, int training,
                                   double momentum, double eps, int act) {
    const char *what = act ? "batchnorm2d_silu forward" : "batchnorm2d forward";
    int ox = 0, oy = 0;
    float *xb = nn_f32_in(ctx, x, &ox, what);
    float *yb = xb ? nn_f32_out(ctx, y, 0, &oy, what) : NULL;
    if (!xb || !yb) {
        nn_f32_done((lucid_tensor *)x, xb, ox, 0);
        return LUCID_ERR_OOM;
    }
    bn_job J = {.N = x->shape[0], .C = x->shape[1], .S = x->shape[2] * x->shape[3],
                .x = xb, .y = yb, .weight = weight, .bias = bias,
                .running_mean = rm, .running_var = rv, .sm = sm, .si = si,
                .training = training, .act = act, .momentum = momentum,
                .eps = eps};
    nn_parallel(ctx, J.C, bn_grain(J.N, J.S), bn_fwd_range, &J);
    nn_f32_done(y, yb, oy, 1);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    return LUCID_OK;
}

static lucid_status bn_backward_f32(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dx,
                                    const lucid_tensor *weight,
                                    const lucid_tensor *bias,
                                    const lucid_tensor *save_mean,
                                    const lucid_tensor *save_invstd,
                                    lucid_tensor *dweight, lucid_tensor *dbias,
                                    int training, double beta_input,
                                    double beta_params, int act) {
    const char *what = act ? "batchnorm2d_silu backward" : "batchnorm2d backward";
    int ox = 0, ody = 0, odx = 0;
    float *xb = nn_f32_in(ctx, x, &ox, what);
    float *dyb = nn_f32_in(ctx, dy, &ody, what);
    float *dxb = dx ? nn_f32_out(ctx, dx, beta_input != 0.0, &odx, what) : NULL;
    lucid_status st = LUCID_ERR_OOM;
    if (xb && dyb && (!dx || dxb)) {
        bn_job J = {.N = x->shape[0], .C = x->shape[1],
                    .S = x->shape[2] * x->shape[3], .x = xb, .dy = dyb,
                    .dx = dx ? dxb : NULL, .weight = weight, .bias = bias,
                    .save_mean = save_mean, .save_invstd = save_invstd,
                    .dweight = dweight, .dbias = dbias, .training = training,
                    .act = act, .beta_in = beta_input, .beta_p = beta_params};
        nn_parallel(ctx, J.C, bn_grain(J.N, J.S), bn_bwd_range, &J);
        st = J.oom ? lucid_seterr(ctx, LUCID_ERR_OOM,
                                  "%s: out of host memory for the %lld-element "
                                  "SiLU gradient scratch",
                                  what, (long long)(J.N * J.S))
                   : LUCID_OK;
    }
    if (dx) nn_f32_done(dx, dxb, odx, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

// ----------------------------------------------------------------------------
// f64 activations: the reference code (act: SiLU fused after the affine map)

static lucid_status bn_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps,
    int act) {
    if (x->dtype != LUCID_F64) {
        lucid_status st = bn_forward_f32(ctx, x, y, weight, bias, running_mean,
                                         running_var, save_mean, save_invstd,
                                         training, momentum, eps, act);
        if (st == LUCID_OK && training && num_batches_tracked)
            nbt_add_one(num_batches_tracked);
        return st;
    }
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
            for (int64_t i = 0; i < S; i++) {
                double z = nn_ld(xd, dt, base + i) * scale + shift;
                nn_st(yd, dt, base + i, act ? z * nn_sigmoid_f64(z) : z);
            }
        }
    }
    if (training && num_batches_tracked) nbt_add_one(num_batches_tracked);
    (void)ctx;
    return LUCID_OK;
}

static lucid_status bn_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, int act) {
    if (x->dtype != LUCID_F64)
        return bn_backward_f32(ctx, x, dy, dx, weight, bias, save_mean,
                               save_invstd, dweight, dbias, training,
                               beta_input, beta_params, act);
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = x->shape[2] * x->shape[3], M = N * S;
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    lucid_dtype dt = x->dtype;
    for (int64_t c = 0; c < C; c++) {
        double mean = nn_ld(lucid_tensor_data(save_mean), save_mean->dtype, c);
        double invstd = nn_ld(lucid_tensor_data(save_invstd), save_invstd->dtype, c);
        double wv = weight ? nn_ld(lucid_tensor_data(weight), weight->dtype, c) : 1.0;
        double bv = bias ? nn_ld(lucid_tensor_data(bias), bias->dtype, c) : 0.0;
        double scale = wv * invstd, shift = bv - mean * scale;
/* the gradient reaching the normalisation: dy, or dy * silu'(z) */
#define BN_G(i_)                                                              \
    (act ? silu_grad_f64(nn_ld(dyd, dy->dtype, (i_)),                         \
                         nn_ld(xd, dt, (i_)) * scale + shift)                 \
         : nn_ld(dyd, dy->dtype, (i_)))
        /* sum(g) and sum(g * xhat) */
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++) {
            int64_t base = (n * C + c) * S;
            for (int64_t i = 0; i < S; i++) {
                double g = BN_G(base + i);
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
                double g = BN_G(base + i);
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
#undef BN_G
    }
    (void)ctx;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// entry points

lucid_status cpu_batchnorm2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward(ctx, x, y, weight, bias, running_mean, running_var,
                      num_batches_tracked, save_mean, save_invstd, training,
                      momentum, eps, 0);
}

lucid_status cpu_batchnorm2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward(ctx, x, dy, dx, weight, NULL, save_mean, save_invstd,
                       dweight, dbias, training, beta_input, beta_params, 0);
}

lucid_status cpu_batchnorm2d_silu_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward(ctx, x, y, weight, bias, running_mean, running_var,
                      num_batches_tracked, save_mean, save_invstd, training,
                      momentum, eps, 1);
}

lucid_status cpu_batchnorm2d_silu_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward(ctx, x, dy, dx, weight, bias, save_mean, save_invstd,
                       dweight, dbias, training, beta_input, beta_params, 1);
}
