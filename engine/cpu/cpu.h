/*
 * cpu.h — private helpers shared by the CPU backend (the .c files of engine/cpu).
 *
 * Contract
 *   - Row iteration: cpu_rows walks up to CPU_MAX_OPS tensors of one shape
 *     together in logical row-major order, one innermost "row" at a time,
 *     after merging dims that are contiguous for every operand (so a
 *     contiguous tensor is one long row). Any strides work, including 0
 *     (broadcast) and negative ones.
 *   - Gather/scatter: cpu_load_* converts a strided row of any dtype into a
 *     contiguous f32 or f64 buffer; cpu_store_* converts back and rounds once
 *     (round-to-nearest-even for floats; integers saturate, NaN -> 0,
 *     fractions truncate toward zero).
 *   - Compute type: f64 when the output is f64, else f32 (bf16/f16 are
 *     computed in f32 and rounded once on store, as engine/lucid.h says).
 * Not part of any public header; the op files include it.
 */
#ifndef LUCID_CPU_H
#define LUCID_CPU_H

#include "internal.h"

#define CPU_MAX_OPS 3
/* Elements per gather buffer: an op keeps at most four of them on the
 * stack (16 KiB in f64), small enough for worker threads. */
#define CPU_CHUNK 512

/* ---------------------------------------------------------------- rows */

typedef struct cpu_rows {
    int nops;
    int ndim;                                 /* >= 1 after merging */
    int64_t shape[LUCID_MAX_DIMS];            /* merged shape */
    int64_t strides[CPU_MAX_OPS][LUCID_MAX_DIMS];
    int64_t idx[LUCID_MAX_DIMS];              /* current outer index */
    int64_t off[CPU_MAX_OPS];  /* element offset (from storage start) of the
                                  current row's first element, per operand */
    int64_t inner[CPU_MAX_OPS];               /* innermost stride per operand */
    int64_t len;                              /* row length (elements) */
    int64_t rows_left;                        /* rows after the current one */
} cpu_rows;

/* Start iterating ts[0..nops) (all of ts[0]'s shape; callers guarantee equal
 * shapes). Returns 0 when there are no elements, else 1 with the first row
 * in it->off / it->len. */
int cpu_rows_init(cpu_rows *it, int nops, const lucid_tensor *const *ts);
/* Advance to the next row; returns 0 when done. */
int cpu_rows_next(cpu_rows *it);

/* ------------------------------------------------------- gather/scatter */

/* dst[j] = (float)t[off + j*stride], j < n, for any dtype of t. */
void cpu_load_f32(float *dst, const lucid_tensor *t, int64_t off,
                  int64_t stride, int64_t n);
/* dst[j] = (double)t[off + j*stride]. */
void cpu_load_f64(double *dst, const lucid_tensor *t, int64_t off,
                  int64_t stride, int64_t n);
/* t[off + j*stride] = src[j] converted (rounded once) to t's dtype. */
void cpu_store_f32(lucid_tensor *t, int64_t off, int64_t stride,
                   const float *src, int64_t n);
void cpu_store_f64(lucid_tensor *t, int64_t off, int64_t stride,
                   const double *src, int64_t n);

/* Correctly rounded (nearest-even) f64 -> bf16 / f16: rounds to f32 with
 * round-to-odd first, so there is no double-rounding error. */
uint16_t cpu_f64_to_bf16(double x);
uint16_t cpu_f64_to_f16(double x);
/* Saturating f64 -> integer (NaN -> 0, truncation toward zero). */
int64_t cpu_f64_to_i64(double x);
int32_t cpu_f64_to_i32(double x);
uint8_t cpu_f64_to_u8(double x);

/* Typed element pointer of storage offset off (elements). */
static inline void *cpu_ptr(const lucid_tensor *t, int64_t off) {
    return (char *)t->storage->data + off * (int64_t)lucid_dtype_size(t->dtype);
}

/* ------------------------------------------------------------ threads */

/* Work on elements [begin, end) of some index range. */
typedef void (*cpu_range_fn)(void *arg, int64_t begin, int64_t end);
/* Threads the CPU kernels may use: ctx->cpu_threads, or the online CPUs. */
int cpu_num_threads(const lucid_ctx *ctx);
/* Run fn over disjoint ranges covering [0, n), on up to cpu_num_threads
 * threads with at least grain elements each (parallel.c). Only for work
 * whose result does not depend on how the range is split. */
void cpu_parallel_for(lucid_ctx *ctx, int64_t n, int64_t grain,
                      cpu_range_fn fn, void *arg);
/* Grain of element-parallel loops: below 2 * CPU_GRAIN elements, one thread. */
#define CPU_GRAIN ((int64_t)1 << 16)

/* ------------------------------------------------------ backend entries */

lucid_status lucid_cpu_copy(lucid_ctx *ctx, lucid_tensor *dst,
                            const lucid_tensor *src);
lucid_status lucid_cpu_fill(lucid_ctx *ctx, lucid_tensor *dst, double value);
lucid_status lucid_cpu_binary(lucid_ctx *ctx, lucid_binary_op op,
                              lucid_tensor *out, const lucid_tensor *a,
                              const lucid_tensor *b);
lucid_status lucid_cpu_binary_scalar(lucid_ctx *ctx, lucid_binary_op op,
                                     lucid_tensor *out, const lucid_tensor *a,
                                     double scalar, int reverse);
lucid_status lucid_cpu_unary(lucid_ctx *ctx, lucid_unary_op op,
                             lucid_tensor *out, const lucid_tensor *a);
lucid_status lucid_cpu_axpy(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                            const lucid_tensor *x);
lucid_status lucid_cpu_reduce_all(lucid_ctx *ctx, lucid_reduce_op op,
                                  lucid_tensor *out, const lucid_tensor *a);
lucid_status lucid_cpu_reduce_dim(lucid_ctx *ctx, lucid_reduce_op op,
                                  lucid_tensor *out, const lucid_tensor *a,
                                  int dim);
lucid_status lucid_cpu_matmul(lucid_ctx *ctx, lucid_tensor *out,
                              const lucid_tensor *a, const lucid_tensor *b,
                              int trans_a, int trans_b, double alpha,
                              double beta);
lucid_status lucid_cpu_rand_uniform(lucid_ctx *ctx, lucid_tensor *dst,
                                    uint64_t seed, uint64_t offset, double lo,
                                    double hi);
lucid_status lucid_cpu_rand_normal(lucid_ctx *ctx, lucid_tensor *dst,
                                   uint64_t seed, uint64_t offset, double mean,
                                   double std);

#endif /* LUCID_CPU_H */
