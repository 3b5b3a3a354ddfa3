/*
 * concat.c — channel-slice copy (Concat, Split/Chunk both ways, Add's
 * backward) and Add on the CPU.
 *
 * Contract (see nn.h):
 *   channel_copy: dst [N,Cd,*S], src [N,Cs,*S] contiguous;
 *     dst[:, d0:d0+n] = beta*dst[:, d0:d0+n] + src[:, s0:s0+n]
 *     (dtypes may differ: converted through f64; same dtype and beta 0 is a
 *     plain memcpy per batch item).
 *   channel_copy_multi: beta-0 channel_copy per piece (a piece without src
 *     memsets its channel range of each batch item to zero bits; a piece
 *     with addends is the rounded left-to-right sum of its sources: f32
 *     additions rounded to bf16 / f16 after each one, f32 and f64 in their
 *     own precision, the bits of a:add(b) chained).
 *   add_forward: y = a + b, same shape and dtype (y may alias a or b).
 * f32 (and same-dtype copies) take typed loops threaded over blocks of
 * elements; other dtype mixes go through f64 per element.
 * Source: torch.cat / torch.chunk / torch.split along dim 1.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <string.h>

#define CB_ELEMS ((int64_t)1 << 14) /* block of a copy or add */

typedef struct cc_job {
    int64_t N, len, nb; /* nb blocks per batch item */
    int64_t dstride, sstride; /* elements between batch items */
    size_t es;
    char *d;
    const char *s;
    float beta;
    const float *a, *b;
    float *y;
    int64_t n;
} cc_job;

static void cc_range(void *arg, int64_t u0, int64_t u1) {
    cc_job *J = arg;
    for (int64_t u = u0; u < u1; u++) {
        int64_t n = u / J->nb, k = u % J->nb;
        int64_t i0 = k * CB_ELEMS, m = J->len - i0 < CB_ELEMS ? J->len - i0 : CB_ELEMS;
        if (m <= 0) continue;
        char *d = J->d + (size_t)(n * J->dstride + i0) * J->es;
        const char *s = J->s + (size_t)(n * J->sstride + i0) * J->es;
        if (J->beta == 0.0f)
            memmove(d, s, (size_t)m * J->es);
        else
            nn_f32_axpby((float *)d, (const float *)s, m, J->beta);
    }
}

static void add_range(void *arg, int64_t u0, int64_t u1) {
    cc_job *J = arg;
    for (int64_t u = u0; u < u1; u++) {
        int64_t i0 = u * CB_ELEMS, m = J->n - i0 < CB_ELEMS ? J->n - i0 : CB_ELEMS;
        const float *a = J->a + i0, *b = J->b + i0;
        float *y = J->y + i0;
        for (int64_t i = 0; i < m; i++) y[i] = a[i] + b[i];
    }
}

lucid_status cpu_channel_copy(lucid_ctx *ctx, lucid_tensor *dst,
                              int64_t dst_c0, const lucid_tensor *src,
                              int64_t src_c0, int64_t nch, double beta) {
    int64_t N = dst->shape[0], Cd = dst->shape[1], Cs = src->shape[1];
    int64_t S = 1;
    for (int i = 2; i < dst->ndim; i++) S *= dst->shape[i];
    char *dd = lucid_tensor_data(dst);
    const char *sd = lucid_tensor_data(src);
    size_t des = lucid_dtype_size(dst->dtype), ses = lucid_dtype_size(src->dtype);
    int64_t len = nch * S;
    if (dst->dtype == src->dtype && (beta == 0.0 || dst->dtype == LUCID_F32) &&
        dst->storage != src->storage) {
        cc_job J = {.N = N, .len = len, .nb = (len + CB_ELEMS - 1) / CB_ELEMS,
                    .dstride = Cd * S, .sstride = Cs * S, .es = des,
                    .d = dd + (size_t)(dst_c0 * S) * des,
                    .s = sd + (size_t)(src_c0 * S) * ses, .beta = (float)beta};
        nn_parallel(ctx, N * J.nb, 8, cc_range, &J);
        return LUCID_OK;
    }
    for (int64_t n = 0; n < N; n++) {
        char *d = dd + (size_t)((n * Cd + dst_c0) * S) * des;
        const char *s = sd + (size_t)((n * Cs + src_c0) * S) * ses;
        if (beta == 0.0 && dst->dtype == src->dtype) {
            memmove(d, s, (size_t)len * des);
            continue;
        }
        for (int64_t i = 0; i < len; i++)
            nn_st_beta(d, dst->dtype, i, nn_ld(s, src->dtype, i), beta);
    }
    (void)ctx;
    return LUCID_OK;
}

/* One sum piece: rows of len elements, blocks of CB_ELEMS. */
typedef struct cs_job {
    int64_t len, nb; /* nb blocks per batch item */
    int ns;          /* sources, 2..LUCID_CHAN_SUM_MAX */
    lucid_dtype dt;
    char *d;
    int64_t dstride;
    const char *s[LUCID_CHAN_SUM_MAX];
    int64_t sstride[LUCID_CHAN_SUM_MAX];
} cs_job;

/* v rounded to bf16 / f16 and back (exact in f32) */
static inline float cs_bf16(float v) { return lucid_bf16_to_f32(lucid_f32_to_bf16(v)); }
static inline float cs_f16(float v) { return lucid_f16_to_f32(lucid_f32_to_f16(v)); }

/* The sum of J->ns sources per element, in the order of the sources: f32
 * (f64) additions, each rounded to the dtype (bf16 / f16: through
 * lucid_f32_to_bf16 / _f16, as a:add(b) stores). */
static void cs_range(void *arg, int64_t u0, int64_t u1) {
    const cs_job *J = arg;
    const int ns = J->ns;
    for (int64_t u = u0; u < u1; u++) {
        int64_t r = u / J->nb, k = u % J->nb;
        int64_t i0 = k * CB_ELEMS, m = J->len - i0 < CB_ELEMS ? J->len - i0 : CB_ELEMS;
        if (m <= 0) continue;
        const size_t es = lucid_dtype_size(J->dt);
        char *d = J->d + (size_t)(r * J->dstride + i0) * es;
        const char *s[LUCID_CHAN_SUM_MAX];
        for (int j = 0; j < ns; j++) s[j] = J->s[j] + (size_t)(r * J->sstride[j] + i0) * es;
        switch (J->dt) {
        case LUCID_F32: {
            float *y = (float *)d;
            for (int64_t i = 0; i < m; i++) {
                float v = ((const float *)s[0])[i];
                for (int j = 1; j < ns; j++) v = v + ((const float *)s[j])[i];
                y[i] = v;
            }
            break;
        }
        case LUCID_F64: {
            double *y = (double *)d;
            for (int64_t i = 0; i < m; i++) {
                double v = ((const double *)s[0])[i];
                for (int j = 1; j < ns; j++) v = v + ((const double *)s[j])[i];
                y[i] = v;
            }
            break;
        }
        case LUCID_BF16: {
            uint16_t *y = (uint16_t *)d;
            for (int64_t i = 0; i < m; i++) {
                float v = lucid_bf16_to_f32(((const uint16_t *)s[0])[i]);
                for (int j = 1; j < ns; j++)
                    v = cs_bf16(v + lucid_bf16_to_f32(((const uint16_t *)s[j])[i]));
                y[i] = lucid_f32_to_bf16(v);
            }
            break;
        }
        default: { /* F16 */
            uint16_t *y = (uint16_t *)d;
            for (int64_t i = 0; i < m; i++) {
                float v = lucid_f16_to_f32(((const uint16_t *)s[0])[i]);
                for (int j = 1; j < ns; j++)
                    v = cs_f16(v + lucid_f16_to_f32(((const uint16_t *)s[j])[i]));
                y[i] = lucid_f32_to_f16(v);
            }
            break;
        }
        }
    }
}

lucid_status cpu_channel_copy_multi(lucid_ctx *ctx, int n,
                                    const lucid_chan_piece *pc) {
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pc[i];
        const int ns = lucid_chan_piece_nsrc(p);
        if (ns > 1) {
            int64_t N = p->dst->shape[0], S = 1;
            for (int d = 2; d < p->dst->ndim; d++) S *= p->dst->shape[d];
            cs_job J = {.len = p->nch * S, .ns = ns, .dt = p->dst->dtype,
                        .dstride = p->dst->shape[1] * S};
            J.nb = (J.len + CB_ELEMS - 1) / CB_ELEMS;
            size_t es = lucid_dtype_size(p->dst->dtype);
            J.d = (char *)lucid_tensor_data(p->dst) + (size_t)(p->dst_c0 * S) * es;
            for (int j = 0; j < ns; j++) {
                const lucid_tensor *t = j ? p->add[j - 1] : p->src;
                int64_t c0 = j ? p->add_c0[j - 1] : p->src_c0;
                J.s[j] = (const char *)lucid_tensor_data(t) + (size_t)(c0 * S) * es;
                J.sstride[j] = t->shape[1] * S;
            }
            nn_parallel(ctx, N * J.nb, 4, cs_range, &J);
            continue;
        }
        if (p->src) {
            LUCID_TRY(cpu_channel_copy(ctx, p->dst, p->dst_c0, p->src, p->src_c0,
                                       p->nch, 0.0));
            continue;
        }
        int64_t N = p->dst->shape[0], Cd = p->dst->shape[1], S = 1;
        for (int d = 2; d < p->dst->ndim; d++) S *= p->dst->shape[d];
        size_t es = lucid_dtype_size(p->dst->dtype);
        char *dd = lucid_tensor_data(p->dst);
        for (int64_t r = 0; r < N; r++)
            memset(dd + (size_t)((r * Cd + p->dst_c0) * S) * es, 0,
                   (size_t)(p->nch * S) * es);
    }
    return LUCID_OK;
}

lucid_status cpu_add_forward(lucid_ctx *ctx, const lucid_tensor *a,
                             const lucid_tensor *b, lucid_tensor *y) {
    int64_t n = lucid_tensor_numel(y);
    const void *ad = lucid_tensor_data(a), *bd = lucid_tensor_data(b);
    void *yd = lucid_tensor_data(y);
    if (y->dtype == LUCID_F32 && a->dtype == LUCID_F32 && b->dtype == LUCID_F32) {
        cc_job J = {.a = ad, .b = bd, .y = yd, .n = n};
        nn_parallel(ctx, (n + CB_ELEMS - 1) / CB_ELEMS, 4, add_range, &J);
        return LUCID_OK;
    }
    for (int64_t i = 0; i < n; i++)
        nn_st(yd, y->dtype, i, nn_ld(ad, a->dtype, i) + nn_ld(bd, b->dtype, i));
    (void)ctx;
    return LUCID_OK;
}
