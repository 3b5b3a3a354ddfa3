/*
 * nn_cpu.h — private helpers of the CPU nn kernels (engine/nn/ *.c files).
 *
 * The CPU kernels are the reference: they read every dtype into f64, compute
 * in f64 and round once on store.  ld/st convert one element of a contiguous
 * buffer; st_beta implements the beta semantics of nn.h (beta == 0 never
 * reads the destination).  The kernel functions named cpu_<op>_<pass> are
 * collected into the CPU table by nn.c.
 */
#ifndef LUCID_NN_CPU_H
#define LUCID_NN_CPU_H

#include "internal.h"
#include "nn/nn.h"

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
