/*
 * elementwise.c — CPU copy/cast, fill, binary, binary_scalar, unary, axpy.
 *
 * Contract
 *   - All ops overwrite their output (axpy: y = alpha*x + y accumulates into
 *     y). Operands have out's shape already (ops.c broadcast them into
 *     stride-0 views); any strides work. The output may be the very same
 *     view as an input (in-place); partially overlapping views are undefined.
 *   - copy/fill: every dtype (f32 f64 bf16 f16 u8 i32 i64). Same-dtype copies
 *     move bits. Casts go through f32 when both dtypes are in {f32,bf16,f16},
 *     else through f64 (so i64 values beyond 2^53 lose low bits); to integer
 *     dtypes: truncation toward zero, saturation, NaN -> 0.
 *   - binary/unary/axpy: output dtype f32/f64/bf16/f16 (checked by ops.c);
 *     inputs of any dtype are converted to the compute type, which is f64
 *     for an f64 output and f32 otherwise; the result is rounded once.
 *   - Semantics: DIV is IEEE division (x/0 = ±Inf); POW is C pow/powf
 *     (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN, as C and torch.pow);
 *     MAX/MIN propagate NaN (max(NaN, 1) = NaN, like torch.maximum);
 *     RELU(NaN) = NaN; SIGMOID = 1/(1+exp(-x)); SILU = x*sigmoid(x).
 *   - Fast path: an f32 (f64) operand row with unit stride is used in place,
 *     other rows are gathered into CPU_CHUNK-element buffers. When all
 *     operands merge into one long row (contiguous, or scalar-broadcast) and
 *     it has >= 2*CPU_GRAIN elements, it is split over threads (parallel.c);
 *     every element is computed the same way, so results do not change.
 */
#include "cpu.h"
#include <math.h>
#include <string.h>

/* ------------------------------------------------------- f32 kernels */

static inline float max_f32(float x, float y) {
    return (x != x || y != y) ? x + y : (x > y ? x : y);
}
static inline float min_f32(float x, float y) {
    return (x != x || y != y) ? x + y : (x < y ? x : y);
}
static inline double max_f64(double x, double y) {
    return (x != x || y != y) ? x + y : (x > y ? x : y);
}
static inline double min_f64(double x, double y) {
    return (x != x || y != y) ? x + y : (x < y ? x : y);
}

/* o[j] = a[j] (op) b[j], j < n. o may equal a or b. */
static void binary_f32(lucid_binary_op op, int64_t n, float *o, const float *a,
                       const float *b) {
    switch (op) {
    case LUCID_OP_ADD: for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j]; break;
    case LUCID_OP_SUB: for (int64_t j = 0; j < n; j++) o[j] = a[j] - b[j]; break;
    case LUCID_OP_MUL: for (int64_t j = 0; j < n; j++) o[j] = a[j] * b[j]; break;
    case LUCID_OP_DIV: for (int64_t j = 0; j < n; j++) o[j] = a[j] / b[j]; break;
    case LUCID_OP_MAX: for (int64_t j = 0; j < n; j++) o[j] = max_f32(a[j], b[j]); break;
    case LUCID_OP_MIN: for (int64_t j = 0; j < n; j++) o[j] = min_f32(a[j], b[j]); break;
    case LUCID_OP_POW: for (int64_t j = 0; j < n; j++) o[j] = powf(a[j], b[j]); break;
    default: break;
    }
}

static void binary_f64(lucid_binary_op op, int64_t n, double *o,
                       const double *a, const double *b) {
    switch (op) {
    case LUCID_OP_ADD: for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j]; break;
    case LUCID_OP_SUB: for (int64_t j = 0; j < n; j++) o[j] = a[j] - b[j]; break;
    case LUCID_OP_MUL: for (int64_t j = 0; j < n; j++) o[j] = a[j] * b[j]; break;
    case LUCID_OP_DIV: for (int64_t j = 0; j < n; j++) o[j] = a[j] / b[j]; break;
    case LUCID_OP_MAX: for (int64_t j = 0; j < n; j++) o[j] = max_f64(a[j], b[j]); break;
    case LUCID_OP_MIN: for (int64_t j = 0; j < n; j++) o[j] = min_f64(a[j], b[j]); break;
    case LUCID_OP_POW: for (int64_t j = 0; j < n; j++) o[j] = pow(a[j], b[j]); break;
    default: break;
    }
}

static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }

/* o[j] = op(a[j]). o may equal a. */
static void unary_f32(lucid_unary_op op, int64_t n, float *o, const float *a) {
    switch (op) {
    case LUCID_OP_NEG: for (int64_t j = 0; j < n; j++) o[j] = -a[j]; break;
    case LUCID_OP_ABS: for (int64_t j = 0; j < n; j++) o[j] = fabsf(a[j]); break;
    case LUCID_OP_EXP: for (int64_t j = 0; j < n; j++) o[j] = expf(a[j]); break;
    case LUCID_OP_LOG: for (int64_t j = 0; j < n; j++) o[j] = logf(a[j]); break;
    case LUCID_OP_SQRT: for (int64_t j = 0; j < n; j++) o[j] = sqrtf(a[j]); break;
    case LUCID_OP_SIGMOID:
        for (int64_t j = 0; j < n; j++) o[j] = sigmoid_f32(a[j]);
        break;
    case LUCID_OP_SILU:
        for (int64_t j = 0; j < n; j++) o[j] = a[j] * sigmoid_f32(a[j]);
        break;
    case LUCID_OP_TANH: for (int64_t j = 0; j < n; j++) o[j] = tanhf(a[j]); break;
    case LUCID_OP_RELU:
        for (int64_t j = 0; j < n; j++) o[j] = a[j] > 0.0f || a[j] != a[j] ? a[j] : 0.0f;
        break;
    case LUCID_OP_SQUARE: for (int64_t j = 0; j < n; j++) o[j] = a[j] * a[j]; break;
    default: break;
    }
}

static void unary_f64(lucid_unary_op op, int64_t n, double *o, const double *a) {
    switch (op) {
    case LUCID_OP_NEG: for (int64_t j = 0; j < n; j++) o[j] = -a[j]; break;
    case LUCID_OP_ABS: for (int64_t j = 0; j < n; j++) o[j] = fabs(a[j]); break;
    case LUCID_OP_EXP: for (int64_t j = 0; j < n; j++) o[j] = exp(a[j]); break;
    case LUCID_OP_LOG: for (int64_t j = 0; j < n; j++) o[j] = log(a[j]); break;
    case LUCID_OP_SQRT: for (int64_t j = 0; j < n; j++) o[j] = sqrt(a[j]); break;
    case LUCID_OP_SIGMOID:
        for (int64_t j = 0; j < n; j++) o[j] = sigmoid_f64(a[j]);
        break;
    case LUCID_OP_SILU:
        for (int64_t j = 0; j < n; j++) o[j] = a[j] * sigmoid_f64(a[j]);
        break;
    case LUCID_OP_TANH: for (int64_t j = 0; j < n; j++) o[j] = tanh(a[j]); break;
    case LUCID_OP_RELU:
        for (int64_t j = 0; j < n; j++) o[j] = a[j] > 0.0 || a[j] != a[j] ? a[j] : 0.0;
        break;
    case LUCID_OP_SQUARE: for (int64_t j = 0; j < n; j++) o[j] = a[j] * a[j]; break;
    default: break;
    }
}

/* ------------------------------------------------------------ driver */

typedef enum ew_kind { EW_BINARY, EW_UNARY, EW_AXPY } ew_kind;

/* What to compute: out = a (op) b, op(a), or a + alpha*b (axpy, a = y).
 * b == NULL in a binary spec means "the scalar" (reverse: scalar first). */
typedef struct ew_spec {
    ew_kind kind;
    int op;
    double scalar;  /* binary_scalar operand, or axpy alpha */
    int reverse;
} ew_spec;

/* Row of t as contiguous f32: t's own memory when it already is, else buf. */
static const float *operand_f32(const lucid_tensor *t, int64_t off,
                                int64_t stride, int64_t n, float *buf) {
    if (t->dtype == LUCID_F32 && stride == 1) return cpu_ptr(t, off);
    cpu_load_f32(buf, t, off, stride, n);
    return buf;
}

static const double *operand_f64(const lucid_tensor *t, int64_t off,
                                 int64_t stride, int64_t n, double *buf) {
    if (t->dtype == LUCID_F64 && stride == 1) return cpu_ptr(t, off);
    cpu_load_f64(buf, t, off, stride, n);
    return buf;
}

static void chunk_f32(const ew_spec *sp, int64_t n, float *o, const float *a,
                      const float *b) {
    switch (sp->kind) {
    case EW_BINARY: binary_f32((lucid_binary_op)sp->op, n, o, a, b); break;
    case EW_UNARY: unary_f32((lucid_unary_op)sp->op, n, o, a); break;
    case EW_AXPY: {
        float alpha = (float)sp->scalar;
        for (int64_t j = 0; j < n; j++) o[j] = a[j] + alpha * b[j];
        break;
    }
    }
}

static void chunk_f64(const ew_spec *sp, int64_t n, double *o, const double *a,
                      const double *b) {
    switch (sp->kind) {
    case EW_BINARY: binary_f64((lucid_binary_op)sp->op, n, o, a, b); break;
    case EW_UNARY: unary_f64((lucid_unary_op)sp->op, n, o, a); break;
    case EW_AXPY:
        for (int64_t j = 0; j < n; j++) o[j] = a[j] + sp->scalar * b[j];
        break;
    }
}

/* One row segment [j_begin, j_end) of (out, a[, b]) starting at element
 * offsets off[] with inner strides inner[] — what a thread works on. */
typedef struct ew_row {
    const ew_spec *sp;
    lucid_tensor *out;
    const lucid_tensor *a, *b;
    int64_t off[3], inner[3];
} ew_row;

static void ew_range_f64(const ew_row *w, int64_t j_begin, int64_t j_end) {
    const ew_spec *sp = w->sp;
    double bo[CPU_CHUNK], ba[CPU_CHUNK], bb[CPU_CHUNK], sc[CPU_CHUNK];
    int scalar_b = sp->kind == EW_BINARY && !w->b;
    if (scalar_b)
        for (int j = 0; j < CPU_CHUNK; j++) sc[j] = sp->scalar;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += CPU_CHUNK) {
        int64_t n = j_end - j0 < CPU_CHUNK ? j_end - j0 : CPU_CHUNK;
        int64_t oo = w->off[0] + j0 * w->inner[0];
        const double *pa = operand_f64(w->a, w->off[1] + j0 * w->inner[1],
                                       w->inner[1], n, ba);
        const double *pb = sc;
        if (w->b) pb = operand_f64(w->b, w->off[2] + j0 * w->inner[2],
                                   w->inner[2], n, bb);
        if (scalar_b && sp->reverse) { const double *t = pa; pa = pb; pb = t; }
        int direct = w->inner[0] == 1;
        double *po = direct ? cpu_ptr(w->out, oo) : bo;
        chunk_f64(sp, n, po, pa, pb);
        if (!direct) cpu_store_f64(w->out, oo, w->inner[0], bo, n);
    }
}

static void ew_range_f32(const ew_row *w, int64_t j_begin, int64_t j_end) {
    const ew_spec *sp = w->sp;
    float bo[CPU_CHUNK], ba[CPU_CHUNK], bb[CPU_CHUNK], sc[CPU_CHUNK];
    int scalar_b = sp->kind == EW_BINARY && !w->b;
    if (scalar_b)
        for (int j = 0; j < CPU_CHUNK; j++) sc[j] = (float)sp->scalar;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += CPU_CHUNK) {
        int64_t n = j_end - j0 < CPU_CHUNK ? j_end - j0 : CPU_CHUNK;
        int64_t oo = w->off[0] + j0 * w->inner[0];
        const float *pa = operand_f32(w->a, w->off[1] + j0 * w->inner[1],
                                      w->inner[1], n, ba);
        const float *pb = sc;
        if (w->b) pb = operand_f32(w->b, w->off[2] + j0 * w->inner[2],
                                   w->inner[2], n, bb);
        if (scalar_b && sp->reverse) { const float *t = pa; pa = pb; pb = t; }
        int direct = w->out->dtype == LUCID_F32 && w->inner[0] == 1;
        float *po = direct ? cpu_ptr(w->out, oo) : bo;
        chunk_f32(sp, n, po, pa, pb);
        if (!direct) cpu_store_f32(w->out, oo, w->inner[0], bo, n);
    }
}

static void ew_range(void *arg, int64_t j_begin, int64_t j_end) {
    const ew_row *w = arg;
    if (w->out->dtype == LUCID_F64) ew_range_f64(w, j_begin, j_end);
    else ew_range_f32(w, j_begin, j_end);
}

/* Walk (out, a[, b]) row by row in the compute type of out; a single long
 * row (contiguous or scalar-broadcast operands) is split over threads. */
static lucid_status ew_run(lucid_ctx *ctx, const ew_spec *sp,
                           lucid_tensor *out, const lucid_tensor *a,
                           const lucid_tensor *b) {
    const lucid_tensor *ts[3] = {out, a, b};
    int nops = b ? 3 : 2;
    cpu_rows it;
    if (!cpu_rows_init(&it, nops, ts)) return LUCID_OK;
    ew_row w = {sp, out, a, b, {0, 0, 0}, {0, 0, 0}};
    for (int k = 0; k < nops; k++) w.inner[k] = it.inner[k];
    if (it.rows_left == 0) {
        for (int k = 0; k < nops; k++) w.off[k] = it.off[k];
        cpu_parallel_for(ctx, it.len, CPU_GRAIN, ew_range, &w);
        return LUCID_OK;
    }
    do {
        for (int k = 0; k < nops; k++) w.off[k] = it.off[k];
        ew_range(&w, 0, it.len);
    } while (cpu_rows_next(&it));
    return LUCID_OK;
}

/* ------------------------------------------------------------ entries */

lucid_status lucid_cpu_binary(lucid_ctx *ctx, lucid_binary_op op,
                              lucid_tensor *out, const lucid_tensor *a,
                              const lucid_tensor *b) {
    ew_spec sp = {EW_BINARY, (int)op, 0.0, 0};
    return ew_run(ctx, &sp, out, a, b);
}

lucid_status lucid_cpu_binary_scalar(lucid_ctx *ctx, lucid_binary_op op,
                                     lucid_tensor *out, const lucid_tensor *a,
                                     double scalar, int reverse) {
    ew_spec sp = {EW_BINARY, (int)op, scalar, reverse};
    return ew_run(ctx, &sp, out, a, NULL);
}

lucid_status lucid_cpu_unary(lucid_ctx *ctx, lucid_unary_op op,
                             lucid_tensor *out, const lucid_tensor *a) {
    ew_spec sp = {EW_UNARY, (int)op, 0.0, 0};
    return ew_run(ctx, &sp, out, a, NULL);
}

lucid_status lucid_cpu_axpy(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                            const lucid_tensor *x) {
    ew_spec sp = {EW_AXPY, 0, alpha, 0};
    return ew_run(ctx, &sp, y, y, x);
}

/* ---------------------------------------------------------- copy/fill */

/* Same-dtype row copy of esize-byte elements (bits, no conversion). */
static void copy_bits(void *dst, int64_t ds, const void *src, int64_t ss,
                      int64_t n, size_t esize) {
    if (ds == 1 && ss == 1) {
        memmove(dst, src, (size_t)n * esize);
        return;
    }
    switch (esize) {
    case 1: {
        uint8_t *d = dst;
        const uint8_t *s = src;
        for (int64_t j = 0; j < n; j++) d[j * ds] = s[j * ss];
        break;
    }
    case 2: {
        uint16_t *d = dst;
        const uint16_t *s = src;
        for (int64_t j = 0; j < n; j++) d[j * ds] = s[j * ss];
        break;
    }
    case 4: {
        uint32_t *d = dst;
        const uint32_t *s = src;
        for (int64_t j = 0; j < n; j++) d[j * ds] = s[j * ss];
        break;
    }
    case 8: {
        uint64_t *d = dst;
        const uint64_t *s = src;
        for (int64_t j = 0; j < n; j++) d[j * ds] = s[j * ss];
        break;
    }
    default: break;
    }
}

static int is_f32_family(lucid_dtype dt) {
    return dt == LUCID_F32 || dt == LUCID_BF16 || dt == LUCID_F16;
}

lucid_status lucid_cpu_copy(lucid_ctx *ctx, lucid_tensor *dst,
                            const lucid_tensor *src) {
    if (lucid_tensor_device(src).type != LUCID_CPU ||
        lucid_tensor_device(dst).type != LUCID_CPU)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "cpu copy: both tensors must be on the cpu");
    const lucid_tensor *ts[2] = {dst, src};
    cpu_rows it;
    if (!cpu_rows_init(&it, 2, ts)) return LUCID_OK;
    if (dst->dtype == src->dtype) {
        size_t es = lucid_dtype_size(dst->dtype);
        do {
            copy_bits(cpu_ptr(dst, it.off[0]), it.inner[0],
                      cpu_ptr(src, it.off[1]), it.inner[1], it.len, es);
        } while (cpu_rows_next(&it));
        return LUCID_OK;
    }
    if (is_f32_family(dst->dtype) && is_f32_family(src->dtype)) {
        float buf[CPU_CHUNK];
        do {
            for (int64_t j0 = 0; j0 < it.len; j0 += CPU_CHUNK) {
                int64_t n = it.len - j0 < CPU_CHUNK ? it.len - j0 : CPU_CHUNK;
                cpu_load_f32(buf, src, it.off[1] + j0 * it.inner[1], it.inner[1], n);
                cpu_store_f32(dst, it.off[0] + j0 * it.inner[0], it.inner[0], buf, n);
            }
        } while (cpu_rows_next(&it));
        return LUCID_OK;
    }
    double buf[CPU_CHUNK];
    do {
        for (int64_t j0 = 0; j0 < it.len; j0 += CPU_CHUNK) {
            int64_t n = it.len - j0 < CPU_CHUNK ? it.len - j0 : CPU_CHUNK;
            cpu_load_f64(buf, src, it.off[1] + j0 * it.inner[1], it.inner[1], n);
            cpu_store_f64(dst, it.off[0] + j0 * it.inner[0], it.inner[0], buf, n);
        }
    } while (cpu_rows_next(&it));
    return LUCID_OK;
}

lucid_status lucid_cpu_fill(lucid_ctx *ctx, lucid_tensor *dst, double value) {
    /* the element's bits, converted once */
    union { uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64;
            float f; double d; int32_t i32; int64_t i64; } e;
    memset(&e, 0, sizeof e);
    switch (dst->dtype) {
    case LUCID_F32: e.f = (float)value; break;
    case LUCID_F64: e.d = value; break;
    case LUCID_BF16: e.u16 = cpu_f64_to_bf16(value); break;
    case LUCID_F16: e.u16 = cpu_f64_to_f16(value); break;
    case LUCID_U8: e.u8 = cpu_f64_to_u8(value); break;
    case LUCID_I32: e.i32 = cpu_f64_to_i32(value); break;
    case LUCID_I64: e.i64 = cpu_f64_to_i64(value); break;
    default:
        return lucid_seterr(ctx, LUCID_ERR_ARG, "fill: unknown dtype %d",
                            (int)dst->dtype);
    }
    size_t es = lucid_dtype_size(dst->dtype);
    const lucid_tensor *ts[1] = {dst};
    cpu_rows it;
    if (!cpu_rows_init(&it, 1, ts)) return LUCID_OK;
    int zero = e.u64 == 0;
    do {
        void *p = cpu_ptr(dst, it.off[0]);
        int64_t s = it.inner[0], n = it.len;
        if (zero && s == 1) {
            memset(p, 0, (size_t)n * es);
            continue;
        }
        switch (es) {
        case 1: { uint8_t *d = p; for (int64_t j = 0; j < n; j++) d[j * s] = e.u8; break; }
        case 2: { uint16_t *d = p; for (int64_t j = 0; j < n; j++) d[j * s] = e.u16; break; }
        case 4: { uint32_t *d = p; for (int64_t j = 0; j < n; j++) d[j * s] = e.u32; break; }
        case 8: { uint64_t *d = p; for (int64_t j = 0; j < n; j++) d[j * s] = e.u64; break; }
        default: break;
        }
    } while (cpu_rows_next(&it));
    return LUCID_OK;
}
