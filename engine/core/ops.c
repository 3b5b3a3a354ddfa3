/*
 * ops.c — the dispatch layer of the op table.
 *
 * Each public op checks its arguments (dtypes, devices, shapes), expands
 * broadcasts into stride-0 views, picks the backend of the device the
 * tensors live on (lucid_backend_for) and calls it. Written outputs get
 * their storage version bumped, which is what recorded steps watch.
 */
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

static int same_device(lucid_device a, lucid_device b) {
    return a.type == b.type && a.index == b.index;
}

static const char *dev_str(lucid_device d, char *buf, size_t n) {
    if (d.type == LUCID_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

/* All tensors on one device; returns that device's backend or NULL. */
static const lucid_backend *backend_of(lucid_ctx *ctx, const char *op,
                                       const lucid_tensor *out,
                                       const lucid_tensor *a,
                                       const lucid_tensor *b) {
    lucid_device d = lucid_tensor_device(out);
    const lucid_tensor *others[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (!others[i]) continue;
        lucid_device e = lucid_tensor_device(others[i]);
        if (!same_device(d, e)) {
            char x[32], y[32];
            lucid_seterr(ctx, LUCID_ERR_ARG,
                         "%s: tensors on different devices (%s and %s); "
                         "move one with :to()",
                         op, dev_str(d, x, sizeof x), dev_str(e, y, sizeof y));
            return NULL;
        }
    }
    return lucid_backend_for(ctx, d);
}

static lucid_status require_float(lucid_ctx *ctx, const char *op,
                                  const char *arg, const lucid_tensor *t) {
    if (!lucid_dtype_is_float(t->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s: %s has dtype %s; expected f32, f64, bf16 or "
                            "f16",
                            op, arg, lucid_dtype_name(t->dtype));
    return LUCID_OK;
}

static void bump(lucid_tensor *t) { lucid_storage_bump_version(t->storage); }

lucid_status lucid_fill(lucid_ctx *ctx, lucid_tensor *dst, double value) {
    const lucid_backend *be = backend_of(ctx, "fill", dst, NULL, NULL);
    if (!be) return ctx->last_status;
    if (lucid_tensor_numel(dst) == 0) return LUCID_OK;
    LUCID_TRY(be->fill(ctx, dst, value));
    bump(dst);
    return LUCID_OK;
}

lucid_status lucid_copy(lucid_ctx *ctx, lucid_tensor *dst,
                        const lucid_tensor *src) {
    if (!lucid_tensor_same_shape(dst, src)) {
        int both_contig = lucid_tensor_is_contiguous(dst) &&
                          lucid_tensor_is_contiguous(src);
        if (!(both_contig &&
              lucid_tensor_numel(dst) == lucid_tensor_numel(src))) {
            char a[128], b[128];
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "copy: destination shape %s and source shape "
                                "%s differ",
                                lucid_shape_str(dst->ndim, dst->shape, a, sizeof a),
                                lucid_shape_str(src->ndim, src->shape, b, sizeof b));
        }
    }
    if (lucid_tensor_numel(dst) == 0) return LUCID_OK;
    lucid_device dd = lucid_tensor_device(dst), sd = lucid_tensor_device(src);
    const lucid_backend *be;
    if (dd.type == LUCID_CPU && sd.type == LUCID_CPU)
        be = lucid_cpu_backend();
    else
        be = lucid_backend_for(ctx, dd.type == LUCID_CUDA ? dd : sd);
    if (!be) return ctx->last_status;
    if (dd.type == LUCID_CUDA && sd.type == LUCID_CUDA && !same_device(dd, sd)) {
        char x[32], y[32];
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "copy between %s and %s: peer copies go through "
                            "the CPU (tensor:to('cpu') first)",
                            dev_str(sd, x, sizeof x), dev_str(dd, y, sizeof y));
    }
    if (!lucid_tensor_same_shape(dst, src)) {
        /* contiguous reshaping copy: view src with dst's shape */
        lucid_tensor v = *src;
        v.ndim = dst->ndim;
        memcpy(v.shape, dst->shape, sizeof v.shape);
        lucid_contiguous_strides(v.ndim, v.shape, v.strides);
        LUCID_TRY(be->copy(ctx, dst, &v));
    } else {
        LUCID_TRY(be->copy(ctx, dst, src));
    }
    bump(dst);
    return LUCID_OK;
}

lucid_status lucid_binary(lucid_ctx *ctx, lucid_binary_op op, lucid_tensor *out,
                          const lucid_tensor *a, const lucid_tensor *b) {
    if ((unsigned)op >= LUCID_BINARY_OP_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "binary: unknown op %d", (int)op);
    const lucid_backend *be = backend_of(ctx, "binary", out, a, b);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "binary", "out", out));
    lucid_tensor va, vb;
    LUCID_TRY(lucid_tensor_broadcast_view(ctx, a, out->ndim, out->shape, &va));
    LUCID_TRY(lucid_tensor_broadcast_view(ctx, b, out->ndim, out->shape, &vb));
    if (lucid_tensor_numel(out) == 0) return LUCID_OK;
    LUCID_TRY(be->binary(ctx, op, out, &va, &vb));
    bump(out);
    return LUCID_OK;
}

lucid_status lucid_binary_scalar(lucid_ctx *ctx, lucid_binary_op op,
                                 lucid_tensor *out, const lucid_tensor *a,
                                 double scalar, int reverse) {
    if ((unsigned)op >= LUCID_BINARY_OP_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "binary: unknown op %d", (int)op);
    const lucid_backend *be = backend_of(ctx, "binary_scalar", out, a, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "binary_scalar", "out", out));
    lucid_tensor va;
    LUCID_TRY(lucid_tensor_broadcast_view(ctx, a, out->ndim, out->shape, &va));
    if (lucid_tensor_numel(out) == 0) return LUCID_OK;
    LUCID_TRY(be->binary_scalar(ctx, op, out, &va, scalar, reverse));
    bump(out);
    return LUCID_OK;
}

lucid_status lucid_unary(lucid_ctx *ctx, lucid_unary_op op, lucid_tensor *out,
                         const lucid_tensor *a) {
    if ((unsigned)op >= LUCID_UNARY_OP_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "unary: unknown op %d", (int)op);
    const lucid_backend *be = backend_of(ctx, "unary", out, a, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "unary", "out", out));
    lucid_tensor va;
    LUCID_TRY(lucid_tensor_broadcast_view(ctx, a, out->ndim, out->shape, &va));
    if (lucid_tensor_numel(out) == 0) return LUCID_OK;
    LUCID_TRY(be->unary(ctx, op, out, &va));
    bump(out);
    return LUCID_OK;
}

lucid_status lucid_axpy(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                        const lucid_tensor *x) {
    const lucid_backend *be = backend_of(ctx, "axpy", y, x, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "axpy", "y", y));
    if (!lucid_tensor_same_shape(x, y)) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG, "axpy: x %s and y %s differ",
                            lucid_shape_str(x->ndim, x->shape, a, sizeof a),
                            lucid_shape_str(y->ndim, y->shape, b, sizeof b));
    }
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(be->axpy(ctx, y, alpha, x));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_reduce_all(lucid_ctx *ctx, lucid_reduce_op op,
                              lucid_tensor *out, const lucid_tensor *a) {
    if ((unsigned)op >= LUCID_REDUCE_OP_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "reduce: unknown op %d", (int)op);
    const lucid_backend *be = backend_of(ctx, "reduce", out, a, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "reduce", "out", out));
    if (lucid_tensor_numel(out) != 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "reduce: out must have one element, has %lld",
                            (long long)lucid_tensor_numel(out));
    if (lucid_tensor_numel(a) == 0 &&
        (op == LUCID_REDUCE_MAX || op == LUCID_REDUCE_MIN ||
         op == LUCID_REDUCE_MEAN))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "reduce: max/min/mean of an empty tensor");
    LUCID_TRY(be->reduce_all(ctx, op, out, a));
    bump(out);
    return LUCID_OK;
}

lucid_status lucid_reduce_dim(lucid_ctx *ctx, lucid_reduce_op op,
                              lucid_tensor *out, const lucid_tensor *a,
                              int dim, int keepdim) {
    if ((unsigned)op >= LUCID_REDUCE_OP_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "reduce: unknown op %d", (int)op);
    const lucid_backend *be = backend_of(ctx, "reduce_dim", out, a, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "reduce_dim", "out", out));
    if (dim < 0 || dim >= a->ndim)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "reduce_dim: dim %d out of range for rank %d", dim,
                            a->ndim);
    if (a->shape[dim] == 0 && op != LUCID_REDUCE_SUM && op != LUCID_REDUCE_SUMSQ &&
        op != LUCID_REDUCE_NORM2)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "reduce_dim: max/min/mean over an empty dim");
    /* expected out shape */
    int64_t kshape[LUCID_MAX_DIMS];
    memcpy(kshape, a->shape, sizeof kshape);
    kshape[dim] = 1;
    lucid_tensor vout = *out;
    if (keepdim) {
        if (!(out->ndim == a->ndim &&
              memcmp(out->shape, kshape, sizeof(int64_t) * a->ndim) == 0))
            goto bad;
    } else {
        if (out->ndim != a->ndim - 1) goto bad;
        for (int i = 0, k = 0; i < a->ndim; i++) {
            if (i == dim) continue;
            if (out->shape[k++] != a->shape[i]) goto bad;
        }
        /* reinsert the reduced dim with stride 0 */
        vout.ndim = a->ndim;
        for (int i = 0, k = 0; i < a->ndim; i++) {
            if (i == dim) {
                vout.shape[i] = 1;
                vout.strides[i] = 0;
            } else {
                vout.shape[i] = out->shape[k];
                vout.strides[i] = out->strides[k];
                k++;
            }
        }
    }
    LUCID_TRY(be->reduce_dim(ctx, op, &vout, a, dim));
    bump(out);
    return LUCID_OK;
bad: {
    char x[128], y[128];
    return lucid_seterr(ctx, LUCID_ERR_ARG,
                        "reduce_dim: out shape %s does not match input %s "
                        "reduced over dim %d (keepdim=%d)",
                        lucid_shape_str(out->ndim, out->shape, x, sizeof x),
                        lucid_shape_str(a->ndim, a->shape, y, sizeof y), dim,
                        keepdim);
}
}

lucid_status lucid_tensor_item(lucid_ctx *ctx, const lucid_tensor *t,
                               double *out) {
    if (!out) return lucid_seterr(ctx, LUCID_ERR_ARG, "item: out is NULL");
    int64_t n = lucid_tensor_numel(t);
    if (n != 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "item: expected a tensor with one element, got %lld", (long long)n);
    if (lucid_tensor_device(t).type == LUCID_CPU) {
        *out = lucid_cpu_get(t, 0);
        return LUCID_OK;
    }
    /* a 0-d view of element [0,...,0] */
    lucid_tensor *one = NULL, *host = NULL;
    LUCID_TRY(lucid_tensor_from_storage(ctx, t->storage, t->dtype, 0, NULL,
                                        NULL, t->offset, &one));
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_status s = lucid_tensor_to(ctx, one, cpu, t->dtype, &host);
    lucid_tensor_release(one);
    if (s != LUCID_OK) return s;
    s = lucid_ctx_synchronize(ctx);
    if (s == LUCID_OK) *out = lucid_cpu_get(host, 0);
    lucid_tensor_release(host);
    return s;
}

lucid_status lucid_reduce_item(lucid_ctx *ctx, lucid_reduce_op op,
                               const lucid_tensor *a, double *out) {
    lucid_tensor *r = NULL;
    lucid_dtype dt = lucid_tensor_device(a).type == LUCID_CPU ? LUCID_F64
                                                              : LUCID_F32;
    LUCID_TRY(lucid_tensor_empty(ctx, lucid_tensor_device(a), dt, 0, NULL, &r));
    lucid_status s = lucid_reduce_all(ctx, op, r, a);
    if (s == LUCID_OK) s = lucid_tensor_item(ctx, r, out);
    lucid_tensor_release(r);
    return s;
}

lucid_status lucid_matmul(lucid_ctx *ctx, lucid_tensor *out,
                          const lucid_tensor *a, const lucid_tensor *b,
                          int trans_a, int trans_b, double alpha, double beta) {
    const lucid_backend *be = backend_of(ctx, "matmul", out, a, b);
    if (!be) return ctx->last_status;
    if (a->dtype != b->dtype || a->dtype != out->dtype)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "matmul: dtypes differ (a %s, b %s, out %s)",
                            lucid_dtype_name(a->dtype),
                            lucid_dtype_name(b->dtype),
                            lucid_dtype_name(out->dtype));
    LUCID_TRY(require_float(ctx, "matmul", "a", a));
    if (a->ndim < 2 || b->ndim != a->ndim || out->ndim != a->ndim)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "matmul: ranks must be equal and >= 2 (a %d, b %d, "
                            "out %d)",
                            a->ndim, b->ndim, out->ndim);
    int n = a->ndim;
    for (int i = 0; i < n - 2; i++)
        if (a->shape[i] != b->shape[i] || a->shape[i] != out->shape[i])
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "matmul: batch dim %d differs (a %lld, b %lld, "
                                "out %lld)",
                                i, (long long)a->shape[i],
                                (long long)b->shape[i],
                                (long long)out->shape[i]);
    int64_t M = trans_a ? a->shape[n - 1] : a->shape[n - 2];
    int64_t K = trans_a ? a->shape[n - 2] : a->shape[n - 1];
    int64_t Kb = trans_b ? b->shape[n - 1] : b->shape[n - 2];
    int64_t N = trans_b ? b->shape[n - 2] : b->shape[n - 1];
    if (K != Kb)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "matmul: inner dimensions differ: op(a) is "
                            "%lldx%lld (K = %lld) but op(b) is %lldx%lld (K = "
                            "%lld)",
                            (long long)M, (long long)K, (long long)K,
                            (long long)Kb, (long long)N, (long long)Kb);
    if (out->shape[n - 2] != M || out->shape[n - 1] != N)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "matmul: out is %lldx%lld but op(a) @ op(b) is "
                            "%lldx%lld (op(a) %lldx%lld, op(b) %lldx%lld)",
                            (long long)out->shape[n - 2],
                            (long long)out->shape[n - 1], (long long)M,
                            (long long)N, (long long)M, (long long)K,
                            (long long)Kb, (long long)N);
    if (!lucid_tensor_is_contiguous(out))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "matmul: out must be contiguous");
    if (lucid_tensor_numel(out) == 0) return LUCID_OK;
    LUCID_TRY(be->matmul(ctx, out, a, b, trans_a, trans_b, alpha, beta));
    bump(out);
    return LUCID_OK;
}

lucid_status lucid_rand_uniform(lucid_ctx *ctx, lucid_tensor *dst,
                                uint64_t seed, uint64_t offset, double lo,
                                double hi) {
    const lucid_backend *be = backend_of(ctx, "rand_uniform", dst, NULL, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "rand_uniform", "dst", dst));
    if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "rand_uniform: need finite lo <= hi, got [%g, %g)",
                            lo, hi);
    if (lucid_tensor_numel(dst) == 0) return LUCID_OK;
    LUCID_TRY(be->rand_uniform(ctx, dst, seed, offset, lo, hi));
    bump(dst);
    return LUCID_OK;
}

lucid_status lucid_rand_normal(lucid_ctx *ctx, lucid_tensor *dst,
                               uint64_t seed, uint64_t offset, double mean,
                               double std) {
    const lucid_backend *be = backend_of(ctx, "rand_normal", dst, NULL, NULL);
    if (!be) return ctx->last_status;
    LUCID_TRY(require_float(ctx, "rand_normal", "dst", dst));
    if (!(std >= 0) || !isfinite(mean) || !isfinite(std))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "rand_normal: need finite mean and std >= 0, got "
                            "mean %g std %g",
                            mean, std);
    if (lucid_tensor_numel(dst) == 0) return LUCID_OK;
    LUCID_TRY(be->rand_normal(ctx, dst, seed, offset, mean, std));
    bump(dst);
    return LUCID_OK;
}
