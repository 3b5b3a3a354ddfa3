/*
 * params.c — the parameter set: declare, then materialize into flat buffers.
 *
 * Contract (DESIGN.md decision 3; style_anchors Absorb 7 / Avoid 6):
 *   - Phase 1: modules declare parameters and buffers (name, shape, kind,
 *     trainable flag, optimizer group, init rule).  Nothing is allocated.
 *   - Phase 2 (once): materialize allocates ONE flat parameter buffer, ONE
 *     flat gradient buffer with the same layout (parameters only) and ONE
 *     flat byte buffer for buffers; each entry's data/grad are views into
 *     them that stay valid for the set's lifetime (never re-flattened).
 *     Parameter offsets are multiples of LUCID_PARAM_ALIGN (16) elements;
 *     buffer byte offsets are multiples of 64.  Padding is zero-filled, so
 *     norms over the flat gradient buffer are exact.
 *   - Init runs in declaration order, drawing each random entry from the
 *     context generator (lucid_ctx_rng_next(numel)): deterministic given
 *     the seed and the declaration order, equal on CPU and CUDA.
 *   - Versions: each entry and the set carry a counter bumped on structural
 *     change (trainable flag, replacement, re-init) for recorded steps.
 */
#include "nn/nn.h"
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lucid_param_set {
    int refcount;
    int count, cap;
    lucid_param **items;        /* (count) individually allocated: stable */
    int materialized;
    lucid_device device;
    lucid_dtype dtype;          /* float dtype of params and f32 buffers */
    lucid_tensor *flat_params;  /* [param_len] */
    lucid_tensor *flat_grads;   /* [param_len] */
    lucid_tensor *flat_buffers; /* [buffer_bytes] u8 */
    uint64_t version;
    int alias;                  /* views of another set's buffers (lucid_param_set_alias) */
};

lucid_status lucid_param_set_create(lucid_ctx *ctx, lucid_param_set **out) {
    *out = NULL;
    lucid_param_set *s = calloc(1, sizeof *s);
    if (!s) return lucid_seterr(ctx, LUCID_ERR_OOM, "param set: out of host memory");
    s->refcount = 1;
    s->dtype = LUCID_F32;
    *out = s;
    return LUCID_OK;
}

void lucid_param_set_retain(lucid_param_set *s) {
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_param_set_release(lucid_param_set *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (int i = 0; i < s->count; i++) {
        lucid_tensor_release(s->items[i]->data);
        lucid_tensor_release(s->items[i]->grad);
        free(s->items[i]);
    }
    free(s->items);
    lucid_tensor_release(s->flat_params);
    lucid_tensor_release(s->flat_grads);
    lucid_tensor_release(s->flat_buffers);
    free(s);
}

lucid_status lucid_param_set_declare(lucid_ctx *ctx, lucid_param_set *s,
                                     const char *name, lucid_param_kind kind,
                                     lucid_dtype dtype, int ndim,
                                     const int64_t *shape, int trainable,
                                     int group, const lucid_init_rule *init,
                                     lucid_param **out) {
    if (out) *out = NULL;
    if (s->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set: cannot declare '%s' after "
                            "materialize (the flat buffers are never "
                            "re-flattened)",
                            name ? name : "?");
    if (!name || !*name || strlen(name) >= LUCID_PARAM_NAME_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: name must be 1..%d characters",
                            LUCID_PARAM_NAME_MAX - 1);
    if (kind != LUCID_PARAM_KIND_PARAM && kind != LUCID_PARAM_KIND_BUFFER)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "param set: '%s': bad kind %d",
                            name, (int)kind);
    if (dtype != LUCID_F32 && !(dtype == LUCID_I64 && kind == LUCID_PARAM_KIND_BUFFER))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: '%s': dtype %s; parameters are f32, "
                            "buffers f32 or i64",
                            name, lucid_dtype_name(dtype));
    if (ndim < 0 || ndim > LUCID_MAX_DIMS)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "param set: '%s': rank %d", name,
                            ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param set: '%s': negative dim %d", name, i);
    }
    /* f64 is the widest dtype a parameter materializes in */
    if (lucid_shape_bytes(ndim, shape, LUCID_F64, &numel, NULL) != 0) {
        char b[256];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: '%s': tensor size overflows: shape %s",
                            name, lucid_shape_str(ndim, shape, b, sizeof b));
    }
    if (init && init->kind == LUCID_INIT_FAN_IN && init->fan_in < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: '%s': FAN_IN init needs fan_in >= 1",
                            name);
    if (lucid_param_set_find(s, name))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: '%s' is declared twice", name);
    if (s->count == s->cap) {
        int nc = s->cap ? 2 * s->cap : 64;
        lucid_param **ni = realloc(s->items, sizeof *ni * (size_t)nc);
        if (!ni) return lucid_seterr(ctx, LUCID_ERR_OOM, "param set: out of host memory");
        s->items = ni;
        s->cap = nc;
    }
    lucid_param *p = calloc(1, sizeof *p);
    if (!p) return lucid_seterr(ctx, LUCID_ERR_OOM, "param set: out of host memory");
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->dtype = dtype;
    p->ndim = ndim;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->numel = numel;
    p->trainable = kind == LUCID_PARAM_KIND_PARAM ? (trainable != 0) : 0;
    p->group = kind == LUCID_PARAM_KIND_PARAM ? group : LUCID_PARAM_GROUP_NONE;
    if (init) p->init = *init;
    else p->init.kind = LUCID_INIT_ZEROS;
    p->index = s->count;
    p->offset = -1;
    s->items[s->count++] = p;
    if (out) *out = p;
    return LUCID_OK;
}

static int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/* Run one entry's init rule on its view. */
static lucid_status init_one(lucid_ctx *ctx, lucid_param *p) {
    lucid_tensor *t = p->data;
    if (p->numel == 0) return LUCID_OK;
    switch (p->init.kind) {
    case LUCID_INIT_ZEROS: return lucid_fill(ctx, t, 0.0);
    case LUCID_INIT_ONES: return lucid_fill(ctx, t, 1.0);
    case LUCID_INIT_CONSTANT: return lucid_fill(ctx, t, p->init.a);
    case LUCID_INIT_UNIFORM:
    case LUCID_INIT_FAN_IN: {
        double lo = p->init.a, hi = p->init.b;
        if (p->init.kind == LUCID_INIT_FAN_IN) {
            hi = 1.0 / sqrt((double)p->init.fan_in);
            lo = -hi;
        }
        uint64_t seed, off;
        lucid_ctx_rng_next(ctx, (uint64_t)p->numel, &seed, &off);
        return lucid_rand_uniform(ctx, t, seed, off, lo, hi);
    }
    case LUCID_INIT_ARANGE: {
        lucid_tensor *h = NULL;
        lucid_device cpu = {LUCID_CPU, 0};
        LUCID_TRY(lucid_tensor_empty(ctx, cpu, t->dtype, t->ndim, t->shape, &h));
        for (int64_t i = 0; i < p->numel; i++) lucid_cpu_set(h, i, (double)i);
        lucid_status st = lucid_copy(ctx, t, h);
        lucid_tensor_release(h);
        return st;
    }
    }
    return lucid_seterr(ctx, LUCID_ERR_ARG, "param set: '%s': unknown init %d",
                        p->name, (int)p->init.kind);
}

lucid_status lucid_param_set_reset(lucid_ctx *ctx, lucid_param_set *s) {
    if (!s->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set: reset before materialize");
    if (s->alias)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set: reset of an alias (its values are another set's: "
                            "reset that set)");
    for (int i = 0; i < s->count; i++) {
        LUCID_TRY(init_one(ctx, s->items[i]));
        s->items[i]->version++;
    }
    s->version++;
    lucid_contract_bump();
    return LUCID_OK;
}

/* The failure path of materialize and alias: every entry's views released,
 * its offset back to -1 (the set stays un-materialised). */
static void unbind_entries(lucid_param_set *s) {
    for (int i = 0; i < s->count; i++) {
        lucid_tensor_release(s->items[i]->data);
        lucid_tensor_release(s->items[i]->grad);
        s->items[i]->data = s->items[i]->grad = NULL;
        s->items[i]->offset = -1;
    }
}

lucid_status lucid_param_set_materialize(lucid_ctx *ctx, lucid_param_set *s,
                                         lucid_device dev, lucid_dtype dt) {
    if (s->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set: already materialized (views must stay "
                            "valid; never re-flatten)");
    if (dt != LUCID_F32 && dt != LUCID_F64)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: dtype %s; use f32 (or f64 on the cpu "
                            "for gradient checks)",
                            lucid_dtype_name(dt));
    if (dt == LUCID_F64 && dev.type != LUCID_CPU)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "param set: f64 parameters are cpu-only");
    /* layout */
    int64_t plen = 0, bbytes = 0;
    size_t fes = lucid_dtype_size(dt);
    /* the flat lengths are sums of every entry: kept below 2^62 (checked)
     * so the rounding and the byte sizes cannot wrap either */
    const int64_t lim = (int64_t)1 << 62;
    for (int i = 0; i < s->count; i++) {
        lucid_param *p = s->items[i];
        int64_t add = 0;
        int wraps;
        if (p->kind == LUCID_PARAM_KIND_PARAM) {
            p->offset = plen;
            wraps = __builtin_add_overflow(plen, p->numel, &add) || add > lim;
            if (!wraps) plen = round_up(add, LUCID_PARAM_ALIGN);
        } else {
            size_t es = p->dtype == LUCID_I64 ? 8 : fes;
            p->offset = bbytes / (int64_t)es;
            wraps = __builtin_mul_overflow(p->numel, (int64_t)es, &add) ||
                    __builtin_add_overflow(bbytes, add, &add) || add > lim;
            if (!wraps) bbytes = round_up(add, 64);
        }
        if (wraps) {
            for (int j = 0; j <= i; j++) s->items[j]->offset = -1;
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param set: tensor size overflows: the flat "
                                "%s reach past 2^62 %s at '%s'",
                                p->kind == LUCID_PARAM_KIND_PARAM ? "parameters"
                                                                  : "buffers",
                                p->kind == LUCID_PARAM_KIND_PARAM ? "elements"
                                                                  : "bytes",
                                p->name);
        }
    }
    lucid_tensor *fp = NULL, *fg = NULL, *fb = NULL;
    lucid_status st;
    int64_t pl = plen > 0 ? plen : LUCID_PARAM_ALIGN;
    int64_t bl = bbytes > 0 ? bbytes : 64;
    st = lucid_tensor_empty(ctx, dev, dt, 1, &pl, &fp);
    if (st == LUCID_OK) st = lucid_tensor_empty(ctx, dev, dt, 1, &pl, &fg);
    if (st == LUCID_OK) st = lucid_tensor_empty(ctx, dev, LUCID_U8, 1, &bl, &fb);
    if (st == LUCID_OK) st = lucid_fill(ctx, fp, 0.0);
    if (st == LUCID_OK) st = lucid_fill(ctx, fg, 0.0);
    if (st == LUCID_OK) st = lucid_fill(ctx, fb, 0.0);
    for (int i = 0; st == LUCID_OK && i < s->count; i++) {
        lucid_param *p = s->items[i];
        if (p->kind == LUCID_PARAM_KIND_PARAM) {
            st = lucid_tensor_from_storage(ctx, fp->storage, dt, p->ndim,
                                           p->shape, NULL, p->offset, &p->data);
            if (st == LUCID_OK)
                st = lucid_tensor_from_storage(ctx, fg->storage, dt, p->ndim,
                                               p->shape, NULL, p->offset,
                                               &p->grad);
        } else {
            lucid_dtype bdt = p->dtype == LUCID_I64 ? LUCID_I64 : dt;
            st = lucid_tensor_from_storage(ctx, fb->storage, bdt, p->ndim,
                                           p->shape, NULL, p->offset, &p->data);
        }
    }
    if (st != LUCID_OK) {
        unbind_entries(s);
        lucid_tensor_release(fp);
        lucid_tensor_release(fg);
        lucid_tensor_release(fb);
        return st;
    }
    s->flat_params = fp;
    s->flat_grads = fg;
    s->flat_buffers = fb;
    s->device = dev;
    s->dtype = dt;
    s->materialized = 1;
    for (int i = 0; i < s->count; i++) {
        LUCID_TRY(init_one(ctx, s->items[i]));
    }
    s->version++;
    lucid_contract_bump();
    return LUCID_OK;
}

/* The first way entry q (of src) and p (of s) are declared differently, or
 * NULL. */
static const char *decl_diff(const lucid_param *p, const lucid_param *q) {
    if (strcmp(p->name, q->name) != 0) return "name";
    if (p->kind != q->kind) return "kind";
    if (p->dtype != q->dtype) return "dtype";
    if (p->ndim != q->ndim) return "rank";
    for (int d = 0; d < p->ndim; d++)
        if (p->shape[d] != q->shape[d]) return "shape";
    return NULL;
}

lucid_status lucid_param_set_alias(lucid_ctx *ctx, lucid_param_set *s,
                                   const lucid_param_set *src) {
    if (!s || !src) return lucid_seterr(ctx, LUCID_ERR_ARG, "param set alias: set is NULL");
    if (s == src)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "param set alias: a set cannot alias itself");
    if (s->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set alias: already materialized (views must stay "
                            "valid; never re-flatten)");
    if (!src->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set alias: the source set is not materialized");
    if (s->count != src->count)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set alias: %d entries, the source has %d", s->count,
                            src->count);
    for (int i = 0; i < s->count; i++) {
        const char *why = decl_diff(s->items[i], src->items[i]);
        if (why)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param set alias: entry %d ('%s') differs from the source's "
                                "('%s') in %s",
                                i, s->items[i]->name, src->items[i]->name, why);
    }
    lucid_status st = LUCID_OK;
    for (int i = 0; st == LUCID_OK && i < s->count; i++) {
        lucid_param *p = s->items[i];
        const lucid_param *q = src->items[i];
        p->offset = q->offset;
        st = lucid_tensor_from_storage(ctx, q->data->storage, q->data->dtype, p->ndim, p->shape,
                                       NULL, q->offset, &p->data);
        if (st == LUCID_OK && q->grad)
            st = lucid_tensor_from_storage(ctx, q->grad->storage, q->grad->dtype, p->ndim,
                                           p->shape, NULL, q->offset, &p->grad);
    }
    if (st != LUCID_OK) {
        unbind_entries(s);
        return st;
    }
    for (int i = 0; i < s->count; i++) s->items[i]->trainable = src->items[i]->trainable;
    lucid_tensor_retain(src->flat_params);
    lucid_tensor_retain(src->flat_grads);
    lucid_tensor_retain(src->flat_buffers);
    s->alias = 1;
    s->flat_params = src->flat_params;
    s->flat_grads = src->flat_grads;
    s->flat_buffers = src->flat_buffers;
    s->device = src->device;
    s->dtype = src->dtype;
    s->materialized = 1;
    s->version++;
    lucid_contract_bump();
    return LUCID_OK;
}

int lucid_param_set_is_materialized(const lucid_param_set *s) {
    return s->materialized;
}

int lucid_param_set_count(const lucid_param_set *s) { return s->count; }

lucid_param *lucid_param_set_get(const lucid_param_set *s, int i) {
    return (i >= 0 && i < s->count) ? s->items[i] : NULL;
}

lucid_param *lucid_param_set_find(const lucid_param_set *s, const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < s->count; i++)
        if (strcmp(s->items[i]->name, name) == 0) return s->items[i];
    return NULL;
}

int64_t lucid_param_set_numel(const lucid_param_set *s, lucid_param_kind kind,
                              int trainable_only) {
    int64_t n = 0;
    for (int i = 0; i < s->count; i++) {
        const lucid_param *p = s->items[i];
        if (p->kind != kind) continue;
        if (trainable_only && !p->trainable) continue;
        n += p->numel;
    }
    return n;
}

lucid_tensor *lucid_param_set_flat_params(const lucid_param_set *s) {
    return s->flat_params;
}
lucid_tensor *lucid_param_set_flat_grads(const lucid_param_set *s) {
    return s->flat_grads;
}
lucid_tensor *lucid_param_set_flat_buffers(const lucid_param_set *s) {
    return s->flat_buffers;
}
lucid_device lucid_param_set_device(const lucid_param_set *s) { return s->device; }
lucid_dtype lucid_param_set_dtype(const lucid_param_set *s) { return s->dtype; }

lucid_status lucid_param_set_zero_grad(lucid_ctx *ctx, lucid_param_set *s) {
    if (!s->materialized)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "param set: zero_grad before materialize");
    return lucid_fill(ctx, s->flat_grads, 0.0);
}

lucid_status lucid_param_set_trainable(lucid_ctx *ctx, lucid_param_set *s,
                                       lucid_param *p, int trainable) {
    if (!p || p->index < 0 || p->index >= s->count || s->items[p->index] != p)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: parameter does not belong to this set");
    if (p->kind != LUCID_PARAM_KIND_PARAM)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param set: '%s' is a buffer; buffers are never "
                            "trainable",
                            p->name);
    trainable = trainable != 0;
    if (p->trainable != trainable) {
        p->trainable = trainable;
        lucid_param_bump_version(s, p);
    }
    return LUCID_OK;
}

void lucid_param_bump_version(lucid_param_set *s, lucid_param *p) {
    if (p) p->version++;
    s->version++;
    lucid_contract_bump();
}

uint64_t lucid_param_set_version(const lucid_param_set *s) { return s->version; }
