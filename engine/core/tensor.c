/*
 * tensor.c — tensor views over storages: creation, shape and stride
 * arithmetic, views (view, narrow, select, transpose, permute, broadcast),
 * and element access for reference code.
 *
 * A tensor is (storage, dtype, shape, strides, offset); strides and offset
 * count elements. Tensors are reference counted; a view takes a reference to
 * the storage, never to the tensor it came from.
 */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lucid_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int lucid_shape_bytes(int ndim, const int64_t *shape, lucid_dtype dt,
                      int64_t *numel, int64_t *nbytes) {
    size_t es = lucid_dtype_size(dt);
    if (ndim < 0 || ndim > LUCID_MAX_DIMS || (ndim > 0 && !shape)) return -1;
    int64_t n = 1, stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0) return -1;
        /* the row-major stride of dim i-1 (zero sizes count as 1, as in
         * lucid_contiguous_strides; dim 0 has no dim before it) and the
         * element count */
        if (i > 0 &&
            __builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride))
            return -1;
        if (__builtin_mul_overflow(n, shape[i], &n)) return -1;
    }
    int64_t b;
    if (es == 0 || __builtin_mul_overflow(n, (int64_t)es, &b)) return -1;
    if (numel) *numel = n;
    if (nbytes) *nbytes = b;
    return 0;
}

/* "tensor size overflows: shape [..] of f32 ..." for a shape that
 * lucid_shape_bytes rejects (sizes already checked non-negative). */
static lucid_status size_overflow(lucid_ctx *ctx, const char *what, int ndim,
                                  const int64_t *shape, lucid_dtype dt) {
    char b[256];
    return lucid_seterr(ctx, LUCID_ERR_ARG,
                        "%stensor size overflows: shape %s of %s needs more "
                        "than 2^63-1 elements or bytes",
                        what, lucid_shape_str(ndim, shape, b, sizeof b),
                        lucid_dtype_name(dt));
}

static lucid_status check_shape(lucid_ctx *ctx, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > LUCID_MAX_DIMS)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "tensor rank %d out of range 0..%d", ndim,
                            LUCID_MAX_DIMS);
    if (ndim > 0 && !shape)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "shape is NULL for a rank-%d tensor", ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "shape[%d] = %lld is negative", i,
                                (long long)shape[i]);
    return LUCID_OK;
}

static lucid_tensor *tensor_alloc(void) {
    lucid_tensor *t = calloc(1, sizeof *t);
    if (t) t->refcount = 1;
    return t;
}

int64_t lucid_tensor_span(const lucid_tensor *t) {
    int64_t span = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        int64_t st = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        span += (t->shape[i] - 1) * st;
    }
    return span;
}

/* lucid_tensor_span with every product and sum checked: -1 when a stride is
 * INT64_MIN or the span does not fit int64. */
static int64_t span_checked(int ndim, const int64_t *shape,
                            const int64_t *strides) {
    int64_t span = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    for (int i = 0; i < ndim; i++) {
        if (strides[i] == INT64_MIN) return -1;
        int64_t st = strides[i] < 0 ? -strides[i] : strides[i], ext;
        if (__builtin_mul_overflow(shape[i] - 1, st, &ext) ||
            __builtin_add_overflow(span, ext, &span))
            return -1;
    }
    return span;
}

lucid_status lucid_tensor_from_storage(lucid_ctx *ctx, lucid_storage *s,
                                       lucid_dtype dt, int ndim,
                                       const int64_t *shape,
                                       const int64_t *strides, int64_t offset,
                                       lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_shape(ctx, ndim, shape));
    if (lucid_dtype_size(dt) == 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "unknown dtype %d", (int)dt);
    /* the shape itself must be representable (numel, contiguous strides) */
    if (lucid_shape_bytes(ndim, shape, dt, NULL, NULL) != 0)
        return size_overflow(ctx, "", ndim, shape, dt);
    if (dt == LUCID_F64 && s->device.type != LUCID_CPU)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "dtype f64 is CPU-only (gradient checks); "
                            "device is cuda:%d",
                            s->device.index);
    lucid_tensor *t = tensor_alloc();
    if (!t) return lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory");
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    if (strides)
        for (int i = 0; i < ndim; i++) t->strides[i] = strides[i];
    else
        lucid_contiguous_strides(ndim, shape, t->strides);
    t->offset = offset;
    /* strides reach forward from the offset (as PyTorch's, which refuses
     * negative strides); the span check below relies on it */
    for (int i = -1; i < ndim; i++) {
        int64_t v = i < 0 ? offset : t->strides[i];
        if (v >= 0) continue;
        char b[128], what[48];
        if (i < 0) snprintf(what, sizeof what, "offset %lld", (long long)v);
        else snprintf(what, sizeof what, "stride %lld of dim %d", (long long)v, i);
        free(t);
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "view %s: %s is negative (the offset and strides count "
                            "forward from the storage's start)",
                            lucid_shape_str(ndim, shape, b, sizeof b), what);
    }
    /* bytes the view reaches: (offset + span) * itemsize, every step checked
     * (a wrapped product would pass the size test with a tiny number) */
    int64_t span = span_checked(ndim, t->shape, t->strides), end = 0, need = 0;
    int wraps = span < 0 || __builtin_add_overflow(offset, span, &end) ||
                __builtin_mul_overflow(end, (int64_t)lucid_dtype_size(dt), &need);
    if (offset < 0 || wraps || (span > 0 && (uint64_t)need > s->nbytes)) {
        char b[128];
        free(t);
        if (offset >= 0 && wraps)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "view %s at offset %lld: tensor size overflows "
                                "(the strides reach past 2^63-1 bytes)",
                                lucid_shape_str(ndim, shape, b, sizeof b),
                                (long long)offset);
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "view %s at offset %lld needs %lld bytes but the "
                            "storage has %zu",
                            lucid_shape_str(ndim, shape, b, sizeof b),
                            (long long)offset, (long long)need, s->nbytes);
    }
    lucid_storage_retain(s);
    t->storage = s;
    *out = t;
    return LUCID_OK;
}

lucid_status lucid_tensor_empty(lucid_ctx *ctx, lucid_device dev,
                                lucid_dtype dt, int ndim,
                                const int64_t *shape, lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_shape(ctx, ndim, shape));
    if (lucid_dtype_size(dt) == 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "unknown dtype %d", (int)dt);
    if (dt == LUCID_F64 && dev.type != LUCID_CPU)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "dtype f64 is CPU-only (gradient checks); "
                            "requested on cuda:%d",
                            dev.index);
    int64_t nbytes;
    if (lucid_shape_bytes(ndim, shape, dt, NULL, &nbytes) != 0)
        return size_overflow(ctx, "", ndim, shape, dt);
    lucid_storage *s = NULL;
    LUCID_TRY(lucid_storage_create(ctx, dev, (size_t)nbytes, 0, &s));
    lucid_status st = lucid_tensor_from_storage(ctx, s, dt, ndim, shape, NULL,
                                                0, out);
    lucid_storage_release(s);
    return st;
}

lucid_status lucid_tensor_zeros(lucid_ctx *ctx, lucid_device dev,
                                lucid_dtype dt, int ndim,
                                const int64_t *shape, lucid_tensor **out) {
    LUCID_TRY(lucid_tensor_empty(ctx, dev, dt, ndim, shape, out));
    lucid_status s = lucid_fill(ctx, *out, 0.0);
    if (s != LUCID_OK) {
        lucid_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

void lucid_tensor_retain(lucid_tensor *t) {
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_tensor_release(lucid_tensor *t) {
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    lucid_storage_release(t->storage);
    free(t);
}

int64_t lucid_tensor_numel(const lucid_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t lucid_tensor_nbytes(const lucid_tensor *t) {
    return (size_t)lucid_tensor_numel(t) * lucid_dtype_size(t->dtype);
}

int lucid_tensor_is_contiguous(const lucid_tensor *t) {
    /* an empty tensor is contiguous whatever its strides (as PyTorch's):
     * the product below would be 0 after its 0 size, and a fresh (2, 0)
     * tensor (strides 1, 1: zero sizes count as 1) would read as strided */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

lucid_device lucid_tensor_device(const lucid_tensor *t) {
    return t->storage->device;
}

lucid_ctx *lucid_tensor_ctx(const lucid_tensor *t) { return t->storage->ctx; }

void *lucid_tensor_data(const lucid_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)lucid_dtype_size(t->dtype);
}

int lucid_tensor_same_shape(const lucid_tensor *a, const lucid_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* New tensor header sharing t's storage with the given geometry. */
static lucid_status make_view(lucid_ctx *ctx, const lucid_tensor *t, int ndim,
                              const int64_t *shape, const int64_t *strides,
                              int64_t offset, lucid_tensor **out) {
    return lucid_tensor_from_storage(ctx, t->storage, t->dtype, ndim, shape,
                                     strides, offset, out);
}

static lucid_status check_dim(lucid_ctx *ctx, const lucid_tensor *t, int dim,
                              const char *what) {
    if (dim < 0 || dim >= t->ndim)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: dim %d out of range for a tensor of rank %d",
                            what, dim, t->ndim);
    return LUCID_OK;
}

lucid_status lucid_tensor_view(lucid_ctx *ctx, const lucid_tensor *t, int ndim,
                               const int64_t *shape, lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_shape(ctx, ndim, shape));
    int64_t n = 1;
    if (lucid_shape_bytes(ndim, shape, t->dtype, &n, NULL) != 0)
        return size_overflow(ctx, "view: ", ndim, shape, t->dtype);
    if (n != lucid_tensor_numel(t)) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "view: shape %s has %lld elements but the tensor "
                            "%s has %lld",
                            lucid_shape_str(ndim, shape, a, sizeof a),
                            (long long)n,
                            lucid_shape_str(t->ndim, t->shape, b, sizeof b),
                            (long long)lucid_tensor_numel(t));
    }
    if (!lucid_tensor_is_contiguous(t))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "view: the tensor is not contiguous; clone() it "
                            "first");
    return make_view(ctx, t, ndim, shape, NULL, t->offset, out);
}

lucid_status lucid_tensor_narrow(lucid_ctx *ctx, const lucid_tensor *t, int dim,
                                 int64_t start, int64_t length,
                                 lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_dim(ctx, t, dim, "narrow"));
    if (start < 0 || length < 0 || start + length > t->shape[dim])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "narrow: start %lld + length %lld exceeds size "
                            "%lld of dim %d",
                            (long long)start, (long long)length,
                            (long long)t->shape[dim], dim);
    int64_t shape[LUCID_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = length;
    return make_view(ctx, t, t->ndim, shape, t->strides,
                     t->offset + start * t->strides[dim], out);
}

lucid_status lucid_tensor_select(lucid_ctx *ctx, const lucid_tensor *t, int dim,
                                 int64_t index, lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_dim(ctx, t, dim, "select"));
    if (index < 0 || index >= t->shape[dim])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "select: index %lld out of range 0..%lld of dim %d",
                            (long long)index, (long long)t->shape[dim] - 1,
                            dim);
    int64_t shape[LUCID_MAX_DIMS], strides[LUCID_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == dim) continue;
        shape[k] = t->shape[i];
        strides[k] = t->strides[i];
        k++;
    }
    return make_view(ctx, t, k, shape, strides,
                     t->offset + index * t->strides[dim], out);
}

lucid_status lucid_tensor_transpose(lucid_ctx *ctx, const lucid_tensor *t,
                                    int d0, int d1, lucid_tensor **out) {
    *out = NULL;
    LUCID_TRY(check_dim(ctx, t, d0, "transpose"));
    LUCID_TRY(check_dim(ctx, t, d1, "transpose"));
    int64_t shape[LUCID_MAX_DIMS], strides[LUCID_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[d0] = t->shape[d1]; shape[d1] = t->shape[d0];
    strides[d0] = t->strides[d1]; strides[d1] = t->strides[d0];
    return make_view(ctx, t, t->ndim, shape, strides, t->offset, out);
}

lucid_status lucid_tensor_permute(lucid_ctx *ctx, const lucid_tensor *t,
                                  const int *perm, lucid_tensor **out) {
    *out = NULL;
    int seen[LUCID_MAX_DIMS] = {0};
    int64_t shape[LUCID_MAX_DIMS], strides[LUCID_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]])
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "permute: entry %d = %d is not a permutation "
                                "of 0..%d",
                                i, perm[i], t->ndim - 1);
        seen[perm[i]] = 1;
        shape[i] = t->shape[perm[i]];
        strides[i] = t->strides[perm[i]];
    }
    return make_view(ctx, t, t->ndim, shape, strides, t->offset, out);
}

lucid_status lucid_tensor_broadcast_view(lucid_ctx *ctx, const lucid_tensor *t,
                                         int ndim, const int64_t *shape,
                                         lucid_tensor *view) {
    if (t->ndim > ndim) goto bad;
    *view = *t;
    view->ndim = ndim;
    view->refcount = 1;
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        view->shape[i] = shape[i];
        if (i < lead) {
            view->strides[i] = 0;
            continue;
        }
        int64_t sz = t->shape[i - lead];
        if (sz == shape[i])
            view->strides[i] = t->strides[i - lead];
        else if (sz == 1)
            view->strides[i] = 0;
        else
            goto bad;
    }
    return LUCID_OK;
bad: {
    char a[128], b[128];
    return lucid_seterr(ctx, LUCID_ERR_ARG,
                        "shape %s does not broadcast to %s",
                        lucid_shape_str(t->ndim, t->shape, a, sizeof a),
                        lucid_shape_str(ndim, shape, b, sizeof b));
}
}

int64_t lucid_tensor_elem_offset(const lucid_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t sz = t->shape[d];
        off += (i % sz) * t->strides[d];
        i /= sz;
    }
    return off;
}

double lucid_cpu_get(const lucid_tensor *t, int64_t i) {
    const char *base = t->storage->data;
    int64_t off = lucid_tensor_elem_offset(t, i);
    switch (t->dtype) {
    case LUCID_F32: return ((const float *)base)[off];
    case LUCID_F64: return ((const double *)base)[off];
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)base)[off]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)base)[off]);
    case LUCID_U8: return ((const uint8_t *)base)[off];
    case LUCID_I32: return ((const int32_t *)base)[off];
    case LUCID_I64: return (double)((const int64_t *)base)[off];
    default: return 0.0;
    }
}

void lucid_cpu_set(lucid_tensor *t, int64_t i, double v) {
    char *base = t->storage->data;
    int64_t off = lucid_tensor_elem_offset(t, i);
    switch (t->dtype) {
    case LUCID_F32: ((float *)base)[off] = (float)v; break;
    case LUCID_F64: ((double *)base)[off] = v; break;
    case LUCID_BF16: ((uint16_t *)base)[off] = lucid_f32_to_bf16((float)v); break;
    case LUCID_F16: ((uint16_t *)base)[off] = lucid_f32_to_f16((float)v); break;
    case LUCID_U8:
        ((uint8_t *)base)[off] = (uint8_t)(v != v || v < 0 ? 0 : v > 255 ? 255 : v);
        break;
    /* saturate, NaN -> 0 (a plain cast is undefined out of range) */
    case LUCID_I32:
        ((int32_t *)base)[off] = v != v ? 0
                               : v >= 2147483647.0 ? INT32_MAX
                               : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        break;
    case LUCID_I64:
        ((int64_t *)base)[off] = v != v ? 0
                               : v >= 9223372036854775807.0 ? INT64_MAX
                               : v <= -9223372036854775808.0 ? INT64_MIN
                                                             : (int64_t)v;
        break;
    default: break;
    }
}

lucid_status lucid_tensor_clone(lucid_ctx *ctx, const lucid_tensor *t,
                                lucid_tensor **out) {
    return lucid_tensor_to(ctx, t, lucid_tensor_device(t), t->dtype, out);
}

lucid_status lucid_tensor_to(lucid_ctx *ctx, const lucid_tensor *t,
                             lucid_device dev, lucid_dtype dt,
                             lucid_tensor **out) {
    LUCID_TRY(lucid_tensor_empty(ctx, dev, dt, t->ndim, t->shape, out));
    lucid_status s = lucid_copy(ctx, *out, t);
    if (s != LUCID_OK) {
        lucid_tensor_release(*out);
        *out = NULL;
    }
    return s;
}
