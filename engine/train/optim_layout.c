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
 *   - Muon plan (optim_backend.h): built for every layout with Muon
 *     segments (host tables on every device, so tests can inspect it; the
 *     CUDA MuSGD uses it). Each matrix X = m x k (m <= k) starts in the
 *     group of its shape rounded up to multiples of LUCID_MUON_ALIGN;
 *     groups are then merged greedily, always the pair whose merge lowers
 *     the estimated cost the most (ties: lowest index pair), while some
 *     merge lowers it or while there are more than LUCID_MUON_MAX_BUCKETS
 *     groups. Estimated cost of a bucket of n matrices of padded shape
 *     M x K: MUON_BUCKET_S (the fixed cost of its 15 GEMM launches per
 *     step) + 5 n (4 M^2 K + 2 M^3) / MUON_GEMM_FLOPS (five Newton–Schulz
 *     iterations of XX^T, (cA)A and BX). Deterministic; buckets sorted by
 *     (M, K), matrices inside a bucket in segment order.
 *   - Ticket counters (CUDA): one int32 per one-launch reduction, zeroed
 *     here; the kernels leave them at zero.
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
    free(l->chunks_frozen_host);
    free(l->mats_host);
    free(l->buckets_host);
    if (l->counters) lucid_tensor_release(l->counters);
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

/* which: 0 every segment, 1 trainable ones, 2 non-trainable ones. */
static int chunk_wanted(const lucid_param_segment *s, int which) {
    return which == 0 || (which == 1) == (s->trainable != 0);
}

static int count_chunks(const lucid_param_segment *segs, int n, int which) {
    int64_t c = 0;
    for (int i = 0; i < n; i++)
        if (chunk_wanted(&segs[i], which))
            c += (segs[i].numel + LUCID_OPTIM_CHUNK - 1) / LUCID_OPTIM_CHUNK;
    return (int)c;
}

static void fill_chunks(const lucid_param_segment *segs, int n, int which,
                        lucid_chunk *out) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        if (!chunk_wanted(&segs[i], which)) continue;
        for (int64_t s = 0; s < segs[i].numel; s += LUCID_OPTIM_CHUNK) {
            int64_t len = segs[i].numel - s;
            if (len > LUCID_OPTIM_CHUNK) len = LUCID_OPTIM_CHUNK;
            out[c++] = (lucid_chunk){segs[i].offset + s, (int32_t)len, i};
        }
    }
}

/* ------------------------------------------------------------ Muon plan */

#define MUON_BUCKET_S 40e-6     /* fixed cost of a bucket per step (s) */
#define MUON_GEMM_FLOPS 50e12   /* GEMM rate assumed by the estimate */

typedef struct {
    int64_t M, K, n;
} mbk;

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static double mbk_cost(int64_t M, int64_t K, int64_t n) {
    double m = (double)M, k = (double)K;
    return MUON_BUCKET_S +
           5.0 * (double)n * (4.0 * m * m * k + 2.0 * m * m * m) / MUON_GEMM_FLOPS;
}

static int mbk_cmp(const void *a, const void *b) {
    const mbk *x = a, *y = b;
    if (x->M != y->M) return x->M < y->M ? -1 : 1;
    if (x->K != y->K) return x->K < y->K ? -1 : 1;
    return 0;
}

/* Groups start as the distinct padded shapes; lab[] maps each group to
 * its current bucket, so every matrix lands in the bucket its shape was
 * merged into. */
static lucid_status build_muon_plan(lucid_ctx *ctx, lucid_param_layout *l) {
    int nm = l->nmuon;
    if (nm == 0) return LUCID_OK;
    mbk *g = calloc((size_t)nm, sizeof *g);       /* initial groups */
    int *lab = calloc((size_t)nm, sizeof *lab);   /* group -> bucket */
    int *mg = calloc((size_t)nm, sizeof *mg);     /* matrix -> group */
    mbk *bk = calloc((size_t)nm, sizeof *bk);     /* buckets */
    l->mats_host = calloc((size_t)nm, sizeof *l->mats_host);
    l->buckets_host = calloc(LUCID_MUON_MAX_BUCKETS, sizeof *l->buckets_host);
    if (!g || !lab || !mg || !bk || !l->mats_host || !l->buckets_host) {
        free(g), free(lab), free(mg), free(bk);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "param layout: out of memory");
    }
    /* distinct padded shapes, sorted */
    int ng = 0;
    for (int i = 0; i < nm; i++) {
        const lucid_seg_info *sg = &l->seg_host[l->muon_host[i]];
        int64_t m = sg->rows < sg->cols ? sg->rows : sg->cols;
        int64_t k = sg->rows < sg->cols ? sg->cols : sg->rows;
        mbk x = {round_up(m, LUCID_MUON_ALIGN), round_up(k, LUCID_MUON_ALIGN), 1};
        int f = -1;
        for (int j = 0; j < ng && f < 0; j++)
            if (g[j].M == x.M && g[j].K == x.K) f = j;
        if (f < 0) g[f = ng++] = (mbk){x.M, x.K, 0};
        g[f].n++;
    }
    qsort(g, (size_t)ng, sizeof *g, mbk_cmp);
    for (int i = 0; i < nm; i++) {
        const lucid_seg_info *sg = &l->seg_host[l->muon_host[i]];
        int64_t m = sg->rows < sg->cols ? sg->rows : sg->cols;
        int64_t k = sg->rows < sg->cols ? sg->cols : sg->rows;
        int64_t M = round_up(m, LUCID_MUON_ALIGN), K = round_up(k, LUCID_MUON_ALIGN);
        for (int j = 0; j < ng; j++)
            if (g[j].M == M && g[j].K == K) mg[i] = j;
    }
    int nb = ng;
    for (int j = 0; j < ng; j++) bk[j] = g[j], lab[j] = j;
    /* greedy merges */
    for (;;) {
        int bi = -1, bj = -1;
        double best = 0.0;
        for (int i = 0; i < nb; i++)
            for (int j = i + 1; j < nb; j++) {
                int64_t M = bk[i].M > bk[j].M ? bk[i].M : bk[j].M;
                int64_t K = bk[i].K > bk[j].K ? bk[i].K : bk[j].K;
                double d = mbk_cost(M, K, bk[i].n + bk[j].n) -
                           mbk_cost(bk[i].M, bk[i].K, bk[i].n) -
                           mbk_cost(bk[j].M, bk[j].K, bk[j].n);
                if (bi < 0 || d < best) best = d, bi = i, bj = j;
            }
        if (bi < 0 || (best >= 0.0 && nb <= LUCID_MUON_MAX_BUCKETS)) break;
        bk[bi].M = bk[bi].M > bk[bj].M ? bk[bi].M : bk[bj].M;
        bk[bi].K = bk[bi].K > bk[bj].K ? bk[bi].K : bk[bj].K;
        bk[bi].n += bk[bj].n;
        for (int j = 0; j < ng; j++) {
            if (lab[j] == bj) lab[j] = bi;
            else if (lab[j] > bj) lab[j]--;
        }
        for (int j = bj; j + 1 < nb; j++) bk[j] = bk[j + 1];
        nb--;
    }
    /* sort the buckets by (M, K), relabelling the groups */
    int order[LUCID_MUON_MAX_BUCKETS], rank[LUCID_MUON_MAX_BUCKETS];
    for (int i = 0; i < nb; i++) order[i] = i;
    for (int i = 1; i < nb; i++)
        for (int j = i; j > 0 && mbk_cmp(&bk[order[j - 1]], &bk[order[j]]) > 0; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < nb; i++) rank[order[i]] = i;
    l->nbuckets = nb;
    int64_t xo = 0, ao = 0;
    int first = 0;
    for (int r = 0; r < nb; r++) {
        const mbk *b = &bk[order[r]];
        lucid_muon_bucket *o = &l->buckets_host[r];
        o->M = (int32_t)b->M, o->K = (int32_t)b->K;
        o->first = first, o->count = (int32_t)b->n;
        o->x_off = xo, o->a_off = ao;
        xo += b->n * b->M * b->K;
        ao += b->n * b->M * b->M;
        first += (int)b->n;
    }
    l->muon_nx = xo, l->muon_na = ao;
    /* matrices, bucket by bucket, segment order inside a bucket */
    int *fill = calloc((size_t)nb, sizeof *fill);
    if (!fill) {
        free(g), free(lab), free(mg), free(bk);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "param layout: out of memory");
    }
    for (int i = 0; i < nm; i++) {
        int si = l->muon_host[i];
        lucid_seg_info *sg = &l->seg_host[si];
        int r = rank[lab[mg[i]]];
        lucid_muon_bucket *b = &l->buckets_host[r];
        int idx = b->first + fill[r];
        lucid_muon_mat *mt = &l->mats_host[idx];
        mt->seg = si;
        mt->bucket = r;
        mt->tr = sg->rows > sg->cols;
        mt->m = mt->tr ? sg->cols : sg->rows;
        mt->k = mt->tr ? sg->rows : sg->cols;
        mt->M = b->M, mt->K = b->K;
        mt->cols = sg->cols;
        mt->x_off = b->x_off + (int64_t)fill[r] * b->M * b->K;
        mt->first_chunk = -1;
        mt->nchunks = 0;
        for (int c = 0; c < l->nchunks_train; c++)
            if (l->chunks_train_host[c].seg == si) {
                if (mt->first_chunk < 0) mt->first_chunk = c;
                mt->nchunks++;
            }
        sg->muon = idx;
        fill[r]++;
    }
    free(fill), free(g), free(lab), free(mg), free(bk);
    return LUCID_OK;
}

static int64_t align64(int64_t x) { return round_up(x, 64); }

lucid_muon_ws lucid_musgd_ws(const lucid_param_layout *l) {
    lucid_muon_ws w;
    int64_t o = 0;
    w.x = o, o += align64(l->muon_nx);
    w.y = o, o += align64(l->muon_nx);
    w.a = o, o += align64(l->muon_na);
    w.t = o, o += align64(l->muon_na);
    w.b = o, o += align64(l->muon_na);
    w.h = o, o += align64(l->muon_na);
    w.den = o, o += align64(l->nmuon);
    w.part = o, o += align64(l->nchunks_train);
    w.total = o;
    return w;
}

/* Device copies of the tables (CUDA) or aliases (CPU), the norm partials
 * and (CUDA) the ticket counters. */
static lucid_status upload_tables(lucid_ctx *ctx, lucid_param_layout *l) {
    size_t sz[6] = {
        (size_t)l->nsegs * sizeof(lucid_seg_info),
        (size_t)l->nchunks_train * sizeof(lucid_chunk),
        (size_t)l->nchunks_all * sizeof(lucid_chunk),
        (size_t)l->nchunks_frozen * sizeof(lucid_chunk),
        (size_t)l->nmuon * sizeof(lucid_muon_mat),
        (size_t)l->nbuckets * sizeof(lucid_muon_bucket),
    };
    const void *src[6] = {l->seg_host, l->chunks_train_host, l->chunks_all_host,
                          l->chunks_frozen_host, l->mats_host, l->buckets_host};
    int64_t np = l->nchunks_train > 0 ? l->nchunks_train : 1;
    LUCID_TRY(lucid_tensor_empty(ctx, l->dev, LUCID_F32, 1, &np, &l->partials));
    if (l->dev.type == LUCID_CPU) {
        l->seg_dev = l->seg_host;
        l->chunks_train_dev = l->chunks_train_host;
        l->chunks_all_dev = l->chunks_all_host;
        l->chunks_frozen_dev = l->chunks_frozen_host;
        l->mats_dev = l->mats_host;
        l->buckets_dev = l->buckets_host;
        return LUCID_OK;
    }
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, l->dev);
    if (!k) return ctx->last_status;
    size_t off[6], bytes = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = bytes;
        bytes += (sz[i] + 15) / 16 * 16; /* 16-byte aligned tables */
    }
    int64_t nbytes = bytes ? (int64_t)bytes : 1;
    LUCID_TRY(lucid_tensor_empty(ctx, l->dev, LUCID_U8, 1, &nbytes,
                                 &l->dev_tables));
    char *base = lucid_tensor_data(l->dev_tables);
    for (int i = 0; i < 6; i++)
        if (sz[i]) LUCID_TRY(k->memcpy_h2d(ctx, base + off[i], src[i], sz[i], 0));
    l->seg_dev = (const lucid_seg_info *)(base + off[0]);
    l->chunks_train_dev = (const lucid_chunk *)(base + off[1]);
    l->chunks_all_dev = (const lucid_chunk *)(base + off[2]);
    l->chunks_frozen_dev = (const lucid_chunk *)(base + off[3]);
    l->mats_dev = (const lucid_muon_mat *)(base + off[4]);
    l->buckets_dev = (const lucid_muon_bucket *)(base + off[5]);
    int64_t nc = 1 + (int64_t)l->nmuon;
    LUCID_TRY(lucid_tensor_zeros(ctx, l->dev, LUCID_I32, 1, &nc, &l->counters));
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
    l->nchunks_frozen = count_chunks(segs, nsegs, 2);
    l->chunks_train_host = calloc((size_t)l->nchunks_train + 1, sizeof(lucid_chunk));
    l->chunks_all_host = calloc((size_t)l->nchunks_all + 1, sizeof(lucid_chunk));
    l->chunks_frozen_host = calloc((size_t)l->nchunks_frozen + 1, sizeof(lucid_chunk));
    if (!l->segs || !l->seg_host || !l->muon_host || !l->chunks_train_host ||
        !l->chunks_all_host || !l->chunks_frozen_host) {
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
        g->muon = -1;
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
    fill_chunks(segs, nsegs, 2, l->chunks_frozen_host);
    lucid_status st = build_muon_plan(ctx, l);
    if (st == LUCID_OK) st = upload_tables(ctx, l);
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
    /* CPU: u and X (numel each), A, T, B (gram each), scalar slots. */
    if (l->dev.type == LUCID_CPU)
        return 2 * l->muon_max_numel + 3 * l->muon_max_gram + 16;
    return lucid_musgd_ws(l).total;
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
