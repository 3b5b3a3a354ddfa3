/*
 * nn_cpu.h — private helpers of the CPU nn kernels (engine/nn/ *.c files).
 *
 * Two compute paths per kernel:
 *   - f64 tensors (gradient checks): read into f64, compute in f64, round once
 *     on store — the reference arithmetic.
 *   - f32 tensors (the CPU training dtype): typed f32 loops (statistics and
 *     reductions accumulate in f64 where noted), threaded over planes /
 *     channels / tiles with cpu_parallel_for.  bf16/f16 tensors are staged
 *     through f32 buffers (nn_f32_in / nn_f32_out / nn_f32_done) and take the
 *     same f32 code, so they equal the f32 path rounded once more.
 * Determinism: work is cut into tiles that depend only on the shapes, never
 * on the thread count; a tile's result does not depend on which thread runs
 * it, and reductions across tiles run in a fixed order.
 * ld/st convert one element of a contiguous buffer; st_beta implements the
 * beta semantics of nn.h (beta == 0 never reads the destination).  The kernel
 * functions named cpu_<op>_<pass> are collected into the CPU table by nn.c.
 */
#ifndef LUCID_NN_CPU_H
#define LUCID_NN_CPU_H

#include "internal.h"
#include "cpu/cpu.h"
#include "nn/nn.h"
#include <math.h>

static inline double nn_ld(const void *p, lucid_dtype dt, int64_t i) {
    switch (dt) {
    case LUCID_F32: return ((const float *)p)[i];
    case LUCID_F64: return ((const double *)p)[i];
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)p)[i]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)p)[i]);
    case LUCID_I32: return ((const int32_t *)p)[i];
    case LUCID_I64: return (double)((const int64_t *)p)[i];
    default: return 0.0;
    }
}

static inline void nn_st(void *p, lucid_dtype dt, int64_t i, double v) {
    switch (dt) {
    case LUCID_F32: ((float *)p)[i] = (float)v; break;
    case LUCID_F64: ((double *)p)[i] = v; break;
    case LUCID_BF16: ((uint16_t *)p)[i] = lucid_f32_to_bf16((float)v); break;
    case LUCID_F16: ((uint16_t *)p)[i] = lucid_f32_to_f16((float)v); break;
    case LUCID_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case LUCID_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: break;
    }
}

/* p[i] = beta * p[i] + v  (beta == 0: p[i] = v without reading p[i]). */
static inline void nn_st_beta(void *p, lucid_dtype dt, int64_t i, double v,
                              double beta) {
    if (beta != 0.0) v += beta * nn_ld(p, dt, i);
    nn_st(p, dt, i, v);
}

/* Contiguous block p[off .. off+n) <-> f64 scratch (fast paths f32/f64). */
static inline void nn_load_block(const void *p, lucid_dtype dt, int64_t off,
                                 double *dst, int64_t n) {
    if (dt == LUCID_F32) {
        const float *s = (const float *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else if (dt == LUCID_F64) {
        const double *s = (const double *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = nn_ld(p, dt, off + i);
    }
}

static inline void nn_store_block(void *p, lucid_dtype dt, int64_t off,
                                  const double *src, int64_t n, double beta) {
    if (beta == 0.0 && dt == LUCID_F32) {
        float *d = (float *)p + off;
        for (int64_t i = 0; i < n; i++) d[i] = (float)src[i];
    } else if (beta == 0.0 && dt == LUCID_F64) {
        double *d = (double *)p + off;
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
    } else {
        for (int64_t i = 0; i < n; i++) nn_st_beta(p, dt, off + i, src[i], beta);
    }
}

/* Whole contiguous tensor <-> f64 scratch. */
static inline void nn_load_all(const lucid_tensor *t, double *dst, int64_t n) {
    const void *p = lucid_tensor_data(t);
    if (t->dtype == LUCID_F64) {
        for (int64_t i = 0; i < n; i++) dst[i] = ((const double *)p)[i];
        return;
    }
    if (t->dtype == LUCID_F32) {
        for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)p)[i];
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = nn_ld(p, t->dtype, i);
}

static inline void nn_store_all(lucid_tensor *t, const double *src, int64_t n,
                                double beta) {
    void *p = lucid_tensor_data(t);
    if (beta == 0.0 && t->dtype == LUCID_F64) {
        for (int64_t i = 0; i < n; i++) ((double *)p)[i] = src[i];
        return;
    }
    if (beta == 0.0 && t->dtype == LUCID_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)p)[i] = (float)src[i];
        return;
    }
    for (int64_t i = 0; i < n; i++) nn_st_beta(p, t->dtype, i, src[i], beta);
}

/* f64 scratch of n elements, with a clear OOM message. */
double *nn_scratch(lucid_ctx *ctx, int64_t n, const char *what);
/* f32 scratch of n elements (64-byte aligned), with a clear OOM message. */
float *nn_scratch_f32(lucid_ctx *ctx, int64_t n, const char *what);

/* ---- f32 staging of whole contiguous tensors (conv2d.c).
 * nn_f32_in: t's data when t is f32, else a new f32 copy (*owned = 1).
 * nn_f32_out: t's data when t is f32, else a new f32 buffer holding t's
 *   values when load != 0 (beta != 0), uninitialised otherwise.
 * nn_f32_done: for an owned output buffer, round it into t (store != 0);
 *   frees owned buffers.  NULL on OOM (message set). */
float *nn_f32_in(lucid_ctx *ctx, const lucid_tensor *t, int *owned,
                 const char *what);
float *nn_f32_out(lucid_ctx *ctx, lucid_tensor *t, int load, int *owned,
                  const char *what);
void nn_f32_done(lucid_tensor *t, float *buf, int owned, int store);
/* Parameters (f32 or f64) as a new f32 copy (always owned). */
float *nn_f32_param(lucid_ctx *ctx, const lucid_tensor *t, const char *what);

/* p[0..n) = beta * p[0..n) + v[0..n) for an f32 destination (beta 0: no
 * read of p). */
static inline void nn_f32_axpby(float *restrict p, const float *restrict v,
                                int64_t n, float beta) {
    if (beta == 0.0f) {
        for (int64_t i = 0; i < n; i++) p[i] = v[i];
    } else if (beta == 1.0f) {
        for (int64_t i = 0; i < n; i++) p[i] += v[i];
    } else {
        for (int64_t i = 0; i < n; i++) p[i] = beta * p[i] + v[i];
    }
}
/* p[0..n) *= beta (beta 0: zero fill without reading). */
static inline void nn_f32_scale(float *p, int64_t n, float beta) {
    if (beta == 0.0f) {
        for (int64_t i = 0; i < n; i++) p[i] = 0.0f;
    } else if (beta != 1.0f) {
        for (int64_t i = 0; i < n; i++) p[i] *= beta;
    }
}

/* Sum of a[0..n) in f64, 8 lanes in a fixed order (vectorisable, and the
 * same result on every run). */
static inline double nn_sum_f64(const float *a, int64_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) l[k] += (double)a[i + k];
    double s = 0.0;
    for (; i < n; i++) s += a[i];
    return s + ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* The build compiles with -O2, whose "very cheap" vectoriser skips loops
 * of unknown trip count; the kernel files ask for the dynamic cost model
 * (GCC; other compilers ignore it).  Place after the includes. */
#if defined(__GNUC__) && !defined(__clang__)
#define NN_VECTORIZE_FILE \
    _Pragma("GCC optimize(\"tree-vectorize\", \"vect-cost-model=dynamic\")")
#else
#define NN_VECTORIZE_FILE
#endif

/* Elements per thread below which an elementwise f32 loop stays serial. */
#define NN_GRAIN ((int64_t)1 << 15)

/* Run fn over [0, n) on up to the context's CPU threads, at least grain
 * items per thread (cpu_parallel_for of engine/cpu/parallel.c). */
static inline void nn_parallel(lucid_ctx *ctx, int64_t n, int64_t grain,
                               cpu_range_fn fn, void *arg) {
    cpu_parallel_for(ctx, n, grain, fn, arg);
}

/* sigmoid(x) = 1 / (1 + exp(-x)) in f64, stable for large |x| (the f64
 * reference of SiLU). */
static inline double nn_sigmoid_f64(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* Vectorisable f32 exp (Cephes expf: Cody-Waite reduction, degree-6
 * polynomial, exponent by bit assembly): within 2 ulp of expf on
 * [-87.3, 88.7]; inputs are clamped to that range (NaN stays NaN).
 * x and y must not overlap (the vector loop assumes restrict). */
void nn_exp_f32(const float *x, float *y, int64_t n);

/* ---- CPU kernels (one family per file) */
/* conv2d.c */
lucid_status cpu_conv2d_forward(lucid_ctx *, const lucid_tensor *,
                                lucid_tensor *, const lucid_tensor *,
                                const lucid_tensor *,
                                const lucid_conv2d_params *);
lucid_status cpu_conv2d_backward_input(lucid_ctx *, const lucid_tensor *,
                                       const lucid_tensor *, lucid_tensor *,
                                       const lucid_tensor *,
                                       const lucid_conv2d_params *, double);
lucid_status cpu_conv2d_backward_params(lucid_ctx *, const lucid_tensor *,
                                        const lucid_tensor *, lucid_tensor *,
                                        lucid_tensor *,
                                        const lucid_conv2d_params *, double);
/* conv2d_f32.c: the f32 path (f32 buffers; parameters as f32 copies; dw/db
 * stored with beta into the parameter tensors). */
lucid_status cpu_conv2d_forward_f32(lucid_ctx *, const lucid_tensor *xt,
                                    const float *x, float *y,
                                    const lucid_tensor *wt, const float *w,
                                    const float *b, int64_t Ho, int64_t Wo,
                                    const lucid_conv2d_params *);
lucid_status cpu_conv2d_backward_input_f32(lucid_ctx *,
                                           const lucid_tensor *dxt,
                                           const float *dy, float *dx,
                                           const lucid_tensor *wt,
                                           const float *w, int64_t Ho,
                                           int64_t Wo,
                                           const lucid_conv2d_params *,
                                           float beta);
lucid_status cpu_conv2d_backward_params_f32(lucid_ctx *,
                                            const lucid_tensor *xt,
                                            const float *x, const float *dy,
                                            int64_t Cout, int64_t kh,
                                            int64_t kw, int64_t Ho, int64_t Wo,
                                            lucid_tensor *dw, lucid_tensor *db,
                                            const lucid_conv2d_params *,
                                            double beta);
/* batchnorm.c */
lucid_status cpu_batchnorm2d_forward(lucid_ctx *, const lucid_tensor *,
                                     lucid_tensor *, const lucid_tensor *,
                                     const lucid_tensor *, lucid_tensor *,
                                     lucid_tensor *, lucid_tensor *,
                                     lucid_tensor *, lucid_tensor *, int,
                                     double, double);
lucid_status cpu_batchnorm2d_backward(lucid_ctx *, const lucid_tensor *,
                                      const lucid_tensor *, lucid_tensor *,
                                      const lucid_tensor *,
                                      const lucid_tensor *,
                                      const lucid_tensor *, lucid_tensor *,
                                      lucid_tensor *, int, double, double);
lucid_status cpu_batchnorm2d_silu_forward(lucid_ctx *, const lucid_tensor *,
                                          lucid_tensor *, const lucid_tensor *,
                                          const lucid_tensor *, lucid_tensor *,
                                          lucid_tensor *, lucid_tensor *,
                                          lucid_tensor *, lucid_tensor *, int,
                                          double, double);
lucid_status cpu_batchnorm2d_silu_backward(
    lucid_ctx *, const lucid_tensor *, const lucid_tensor *, lucid_tensor *,
    const lucid_tensor *, const lucid_tensor *, const lucid_tensor *,
    const lucid_tensor *, lucid_tensor *, lucid_tensor *, int, double, double);
/* activation.c */
lucid_status cpu_silu_forward(lucid_ctx *, const lucid_tensor *,
                              lucid_tensor *);
lucid_status cpu_silu_backward(lucid_ctx *, const lucid_tensor *,
                               const lucid_tensor *, lucid_tensor *, double);
/* pool.c */
lucid_status cpu_maxpool2d_forward(lucid_ctx *, const lucid_tensor *,
                                   lucid_tensor *, lucid_tensor *,
                                   const lucid_pool2d_params *);
lucid_status cpu_maxpool2d_backward(lucid_ctx *, const lucid_tensor *,
                                    const lucid_tensor *, lucid_tensor *,
                                    const lucid_tensor *,
                                    const lucid_pool2d_params *, double);
/* upsample.c */
lucid_status cpu_upsample_nearest2d_forward(lucid_ctx *, const lucid_tensor *,
                                            lucid_tensor *, int);
lucid_status cpu_upsample_nearest2d_backward(lucid_ctx *,
                                             const lucid_tensor *,
                                             const lucid_tensor *,
                                             lucid_tensor *, int, double);
/* concat.c */
lucid_status cpu_channel_copy(lucid_ctx *, lucid_tensor *, int64_t,
                              const lucid_tensor *, int64_t, int64_t, double);
lucid_status cpu_channel_copy_multi(lucid_ctx *, int, const lucid_chan_piece *);
lucid_status cpu_add_forward(lucid_ctx *, const lucid_tensor *,
                             const lucid_tensor *, lucid_tensor *);
/* softmax.c */
lucid_status cpu_softmax_forward(lucid_ctx *, const lucid_tensor *,
                                 lucid_tensor *);
lucid_status cpu_softmax_backward(lucid_ctx *, const lucid_tensor *,
                                  const lucid_tensor *, lucid_tensor *, double);
/* dfl.c */
lucid_status cpu_dfl_forward(lucid_ctx *, const lucid_tensor *, lucid_tensor *,
                             int);
lucid_status cpu_dfl_backward(lucid_ctx *, const lucid_tensor *,
                              const lucid_tensor *, lucid_tensor *, int,
                              double);

#endif
