/*
 * optim_layout.c — the validated segment table (lucid_param_layout) and the
 * per-device kernel table lookup.
 *
 * Contract
 *   - lucid_param_layout_create checks every segment (name, offset, numel,
 *     kind, ndim, shape product, overlaps) and reports the first bad one by
 *     name and index; then builds the chunk tables described in
 *     optim_backend.h and copies them to the device.
 *   - MuSGD ("muon") segments: trainable with ndim 2 or 4 (reference §6),
 *     viewed as (shape[0], numel/shape[0]); shape scale
 *     sqrt(max(1, shape[-2]/shape[-1])).
 *   - The CUDA kernel table comes from cuda/optim.cu; a CUDA=0 build links
 *     engine/core/cuda_absent.c instead, whose getter returns NULL.
 */
#include "train/optim_backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const lucid_optim_kernels *lucid_optim_cuda_kernels(void) {
    return lucid_optim_cuda_kernels_impl();
}

const lucid_optim_kernels *lucid_optim_kernels_for(lucid_ctx *ctx,
                                                   lucid_device dev) {
    if (dev.type == LUCID_CPU) return lucid_optim_cpu_kernels();
    const lucid_optim_kernels *k = lucid_optim_cuda_kernels();
    if (!k) {
        lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                     "optimizer kernels for cuda:%d are not in this build "
                     "(built with CUDA=0, or cuda/optim.o not linked)",
                     dev.index);
        return NULL;
    }
    if (ctx->device.type != LUCID_CUDA || ctx->device.index != dev.index) {
        lucid_seterr(ctx, LUCID_ERR_ARG,
                     "optimizer: tensors on cuda:%d but the context drives "
                     "%s",
                     dev.index,
                     ctx->device.type == LUCID_CPU ? "the cpu" : "another GPU");
        return NULL;
    }
    return k;
}

static const char *seg_name(const lucid_param_segment *s) {
    return s->name ? s->name : "(unnamed)";
}

static void layout_free(lucid_param_layout *l) {
    if (!l) return;
    if (l->segs)
        for (int i = 0; i < l->nsegs; i++) free((char *)l->segs[i].name);
    free(l->segs);
    free(l->seg_host);
    free(l->chunks_train_host);
    free(l->chunks_all_host);
    free(l->muon_host);
    if (l->dev_tables) lucid_tensor_release(l->dev_tables);
    if (l->partials) lucid_tensor_release(l->partials);
    if (l->ctx) lucid_ctx_release(l->ctx);
    free(l);
}

typedef struct { int64_t off; int idx; } span_t;

static int span_cmp(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : x->idx - y->idx;
}

static lucid_status validate(lucid_ctx *ctx, int64_t total,
                             const lucid_param_segment *segs, int n) {
    for (int i = 0; i < n; i++) {
        const lucid_param_segment *s = &segs[i];
        if (s->offset < 0 || s->numel < 0 || s->offset > total ||
            s->numel > total - s->offset)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param layout: segment %d '%s' [%lld, +%lld) "
                                "is outside the flat buffer of %lld elements",
                                i, seg_name(s), (long long)s->offset,
                                (long long)s->numel, (long long)total);
        if (s->kind < 0 || s->kind >= LUCID_KIND_COUNT)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param layout: segment %d '%s' has kind %d; "
                                "expected 0 (weight), 1 (norm) or 2 (bias)",
                                i, seg_name(s), s->kind);
        if (s->ndim < 0 || s->ndim > 4)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param layout: segment %d '%s' has ndim %d "
                                "(0..4 supported)",
                                i, seg_name(s), s->ndim);
        int64_t p = 1;
        for (int d = 0; d < s->ndim; d++) {
            if (s->shape[d] < 0)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "param layout: segment %d '%s' has a "
                                    "negative size in dim %d",
                                    i, seg_name(s), d);
            p *= s->shape[d];
        }
        if (p != s->numel)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "param layout: segment %d '%s' has numel %lld "
                                "but its shape holds %lld elements",
                                i, seg_name(s), (long long)s->numel,
                                (long long)p);
    }
    span_t *sp = malloc((size_t)(n ? n : 1) * sizeof *sp);
    if (!sp) return lucid_seterr(ctx, LUCID_ERR_OOM, "param layout: out of memory");
    for (int i = 0; i < n; i++) sp[i] = (span_t){segs[i].offset, i};
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    lucid_status st = LUCID_OK;
    int64_t end = 0;
    int prev = -1;
    for (int k = 0; k < n; k++) {
        const lucid_param_segment *s = &segs[sp[k].idx];
        if (s->numel == 0) continue;
        if (prev >= 0 && s->offset < end) {
            st = lucid_seterr(ctx, LUCID_ERR_ARG,
                              "param layout: segment %d '%s' overlaps segment "
                              "%d '%s'",
                              sp[k].idx, seg_name(s), prev,
                              seg_name(&segs[prev]));
            break;
        }
        end = s->offset + s->numel;
        prev = sp[k].idx;
    }
    free(sp);
    return st;
}

static int count_chunks(const lucid_param_segment *segs, int n, int train) {
    int64_t c = 0;
    for (int i = 0; i < n; i++)
        if (!train || segs[i].trainable)
            c += (segs[i].numel + LUCID_OPTIM_CHUNK - 1) / LUCID_OPTIM_CHUNK;
    return (int)c;
}

static void fill_chunks(const lucid_param_segment *segs, int n, int train,
                        lucid_chunk *out) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        if (train && !segs[i].trainable) continue;
        for (int64_t s = 0; s < segs[i].numel; s += LUCID_OPTIM_CHUNK) {
            int64_t len = segs[i].numel - s;
            if (len > LUCID_OPTIM_CHUNK) len = LUCID_OPTIM_CHUNK;
            out[c++] = (lucid_chunk){segs[i].offset + s, (int32_t)len, i};
        }
    }
}

/* Device copies of the tables (CUDA) or aliases (CPU). */
static lucid_status upload_tables(lucid_ctx *ctx, lucid_param_layout *l) {
    size_t nseg = (size_t)l->nsegs * sizeof(lucid_seg_info);
    size_t ntr = (size_t)l->nchunks_train * sizeof(lucid_chunk);
    size_t nall = (size_t)l->nchunks_all * sizeof(lucid_chunk);
    int64_t np = l->nchunks_train > 0 ? l->nchunks_train : 1;
    LUCID_TRY(lucid_tensor_empty(ctx, l->dev, LUCID_F32, 1, &np, &l->partials));
    if (l->dev.type == LUCID_CPU) {
        l->seg_dev = l->seg_host;
        l->chunks_train_dev = l->chunks_train_host;
        l->chunks_all_dev = l->chunks_all_host;
        return LUCID_OK;
    }
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, l->dev);
    if (!k) return ctx->last_status;
    int64_t bytes = (int64_t)(nseg + ntr + nall);
    if (bytes == 0) bytes = 1;
    LUCID_TRY(lucid_tensor_empty(ctx, l->dev, LUCID_U8, 1, &bytes,
                                 &l->dev_tables));
    char *base = lucid_tensor_data(l->dev_tables);
    if (nseg) LUCID_TRY(k->memcpy_h2d(ctx, base, l->seg_host, nseg, 0));
    if (ntr) LUCID_TRY(k->memcpy_h2d(ctx, base + nseg, l->chunks_train_host, ntr, 0));
    if (nall)
        LUCID_TRY(k->memcpy_h2d(ctx, base + nseg + ntr, l->chunks_all_host,
                                nall, 0));
    l->seg_dev = (const lucid_seg_info *)base;
    l->chunks_train_dev = (const lucid_chunk *)(base + nseg);
    l->chunks_all_dev = (const lucid_chunk *)(base + nseg + ntr);
    return LUCID_OK;
}

lucid_status lucid_param_layout_create(lucid_ctx *ctx, lucid_device dev,
                                       int64_t total_numel,
                                       const lucid_param_segment *segs,
                                       int nsegs, lucid_param_layout **out) {
    *out = NULL;
    if (nsegs < 0 || (nsegs > 0 && !segs) || total_numel < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "param layout: bad segment table (n=%d)", nsegs);
    LUCID_TRY(validate(ctx, total_numel, segs, nsegs));
    lucid_param_layout *l = calloc(1, sizeof *l);
    if (!l) return lucid_seterr(ctx, LUCID_ERR_OOM, "param layout: out of memory");
    l->refcount = 1;
    l->ctx = ctx;
    lucid_ctx_retain(ctx);
    l->dev = dev;
    l->total_numel = total_numel;
    l->nsegs = nsegs;
    size_t n1 = (size_t)(nsegs ? nsegs : 1);
    l->segs = calloc(n1, sizeof *l->segs);
    l->seg_host = calloc(n1, sizeof *l->seg_host);
    l->muon_host = calloc(n1, sizeof *l->muon_host);
    l->nchunks_train = count_chunks(segs, nsegs, 1);
    l->nchunks_all = count_chunks(segs, nsegs, 0);
    l->chunks_train_host = calloc((size_t)l->nchunks_train + 1, sizeof(lucid_chunk));
    l->chunks_all_host = calloc((size_t)l->nchunks_all + 1, sizeof(lucid_chunk));
    if (!l->segs || !l->seg_host || !l->muon_host || !l->chunks_train_host ||
        !l->chunks_all_host) {
        layout_free(l);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "param layout: out of memory");
    }
    for (int i = 0; i < nsegs; i++) {
        l->segs[i] = segs[i];
        l->segs[i].name = segs[i].name ? strdup(segs[i].name) : NULL;
        const lucid_param_segment *s = &segs[i];
        lucid_seg_info *g = &l->seg_host[i];
        g->offset = s->offset;
        g->numel = s->numel;
        g->slot = s->kind + (s->head ? LUCID_KIND_COUNT : 0);
        g->flags = s->trainable ? LUCID_SEG_TRAINABLE : 0;
        g->rows = 1;
        g->cols = (int32_t)s->numel;
        g->muon_shape_scale = 1.0f;
        if (s->trainable) l->trainable_numel += s->numel;
        if (s->trainable && (s->ndim == 2 || s->ndim == 4) && s->numel > 0) {
            g->flags |= LUCID_SEG_MUON;
            g->rows = (int32_t)s->shape[0];
            g->cols = (int32_t)(s->numel / s->shape[0]);
            double r = (double)s->shape[s->ndim - 2] / (double)s->shape[s->ndim - 1];
            g->muon_shape_scale = (float)sqrt(r > 1.0 ? r : 1.0);
            l->muon_host[l->nmuon++] = i;
            if (s->numel > l->muon_max_numel) l->muon_max_numel = s->numel;
            int64_t m = g->rows < g->cols ? g->rows : g->cols;
            if (m * m > l->muon_max_gram) l->muon_max_gram = m * m;
        }
    }
    fill_chunks(segs, nsegs, 1, l->chunks_train_host);
    fill_chunks(segs, nsegs, 0, l->chunks_all_host);
    lucid_status st = upload_tables(ctx, l);
    if (st != LUCID_OK) {
        layout_free(l);
        return st;
    }
    *out = l;
    return LUCID_OK;
}

void lucid_param_layout_retain(lucid_param_layout *l) {
    if (l) __atomic_add_fetch(&l->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_param_layout_release(lucid_param_layout *l) {
    if (l && __atomic_sub_fetch(&l->refcount, 1, __ATOMIC_ACQ_REL) == 0)
        layout_free(l);
}

int lucid_param_layout_count(const lucid_param_layout *l) { return l->nsegs; }
int64_t lucid_param_layout_numel(const lucid_param_layout *l) {
    return l->total_numel;
}
int64_t lucid_param_layout_trainable_numel(const lucid_param_layout *l) {
    return l->trainable_numel;
}

int64_t lucid_musgd_work_numel(const lucid_param_layout *l) {
    /* X and Y (numel each), A, T, B (gram each), scalar slots. */
    return 2 * l->muon_max_numel + 3 * l->muon_max_gram + 16;
}

static const char *dev_name(lucid_device d, char *buf, size_t n) {
    if (d.type == LUCID_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

lucid_status lucid_optim_check_flat(lucid_ctx *ctx, const char *what,
                                    const lucid_param_layout *l,
                                    const lucid_param_block *pb,
                                    const lucid_tensor *t, const char *arg,
                                    int allow_half) {
    char a[32], b[32];
    if (!l || !t)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %s is NULL", what,
                            l ? arg : "layout");
    lucid_device d = lucid_tensor_device(t);
    if (d.type != l->dev.type || d.index != l->dev.index)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s is on %s but the parameter layout is on %s",
                            what, arg, dev_name(d, a, sizeof a),
                            dev_name(l->dev, b, sizeof b));
    if (pb && (pb->dev.type != d.type || pb->dev.index != d.index))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: the parameter block is on %s but %s is on %s",
                            what, dev_name(pb->dev, a, sizeof a), arg,
                            dev_name(d, b, sizeof b));
    if (!lucid_tensor_is_contiguous(t))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s must be one contiguous flat buffer", what,
                            arg);
    if (lucid_tensor_numel(t) != l->total_numel)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s has %lld elements but the layout covers "
                            "%lld",
                            what, arg, (long long)lucid_tensor_numel(t),
                            (long long)l->total_numel);
    int ok = t->dtype == LUCID_F32 ||
             (allow_half && (t->dtype == LUCID_BF16 || t->dtype == LUCID_F16));
    if (!ok)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s: %s has dtype %s; expected f32%s", what, arg,
                            lucid_dtype_name(t->dtype),
                            allow_half ? ", bf16 or f16" : "");
    return LUCID_OK;
}
