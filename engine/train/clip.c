/*
 * clip.c — total gradient 2-norm, norm clipping and value clipping:
 * dispatchers (lucid_grad_clip_norm / lucid_grad_clip_value) and the CPU
 * kernels.
 *
 * Contract (semantics: clipping reference §1-§4, §11)
 *   - norm = sqrt(sum over trainable elements of g*g), accumulated in f32
 *     whatever the gradient dtype, in the fixed chunk/lane/tree order of
 *     optim_backend.h (the CUDA kernels use the same order, so the norm is
 *     bitwise equal on both devices). A finite |g| >= ~1.8e19 makes g*g
 *     overflow f32, so the norm is Inf, as torch's CUDA path (§1.7).
 *     Deliberate deviation from torch for bf16/f16 grads: torch returns the
 *     total in the gradient dtype (an f16 total saturates at 65504); lucid
 *     keeps it in f32 (issue 6: "norms accumulate in fp32").
 *   - coef = min(max_norm * (1/(norm + 1e-6)), 1), NaN passing the clamp,
 *     multiplied into every trainable gradient unconditionally; the
 *     product is rounded once to the gradient dtype.
 *   - value clipping: clamp_min(-c) then clamp_max(c) per element.
 *   - frozen segments (trainable = 0) are neither summed nor modified.
 */
#include "train/optim_backend.h"
#include <string.h>

static inline float load_g(const void *g, lucid_dtype dt, int64_t i) {
    switch (dt) {
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)g)[i]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)g)[i]);
    default: return ((const float *)g)[i];
    }
}

static inline void store_g(void *g, lucid_dtype dt, int64_t i, float v) {
    switch (dt) {
    case LUCID_BF16: ((uint16_t *)g)[i] = lucid_f32_to_bf16(v); break;
    case LUCID_F16: ((uint16_t *)g)[i] = lucid_f32_to_f16(v); break;
    default: ((float *)g)[i] = v; break;
    }
}

/* The lane/tree fold of optim_backend.h over n values given by get(i). */
static float tree_fold(float lanes[LUCID_OPTIM_THREADS]) {
    for (int h = LUCID_OPTIM_THREADS / 2; h > 0; h >>= 1)
        for (int t = 0; t < h; t++) lanes[t] = lanes[t] + lanes[t + h];
    return lanes[0];
}

static float chunk_sumsq(const void *g, lucid_dtype dt, const lucid_chunk *c) {
    float lanes[LUCID_OPTIM_THREADS];
    for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
        float s = 0.0f;
        for (int64_t j = t; j < c->len; j += LUCID_OPTIM_THREADS) {
            float x = load_g(g, dt, c->start + j);
            float sq = x * x;
            s = s + sq;
        }
        lanes[t] = s;
    }
    return tree_fold(lanes);
}

/* Fold the chunk partials in the same order as the CUDA finishing block. */
static float fold_partials(const float *p, int n) {
    float lanes[LUCID_OPTIM_THREADS];
    for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
        float s = 0.0f;
        for (int j = t; j < n; j += LUCID_OPTIM_THREADS) s = s + p[j];
        lanes[t] = s;
    }
    return tree_fold(lanes);
}

lucid_status lucid_cpu_grad_norm(lucid_ctx *ctx, const lucid_param_layout *l,
                                 lucid_param_values *blk, void *grad,
                                 lucid_dtype gdt, int apply) {
    float *part = lucid_tensor_data(l->partials);
    for (int c = 0; c < l->nchunks_train; c++)
        part[c] = chunk_sumsq(grad, gdt, &l->chunks_train_host[c]);
    float coef = lucid_pb_norm_finish(blk, fold_partials(part, l->nchunks_train));
    if (!apply) return LUCID_OK;
    for (int c = 0; c < l->nchunks_train; c++) {
        const lucid_chunk *ch = &l->chunks_train_host[c];
        for (int64_t j = 0; j < ch->len; j++) {
            int64_t i = ch->start + j;
            store_g(grad, gdt, i, load_g(grad, gdt, i) * coef);
        }
    }
    return LUCID_OK;
}

lucid_status lucid_cpu_grad_clip_value(lucid_ctx *ctx,
                                       const lucid_param_layout *l,
                                       lucid_param_values *blk, void *grad,
                                       lucid_dtype gdt) {
    float c = blk->in.clip_value;
    for (int k = 0; k < l->nchunks_train; k++) {
        const lucid_chunk *ch = &l->chunks_train_host[k];
        for (int64_t j = 0; j < ch->len; j++) {
            int64_t i = ch->start + j;
            float x = load_g(grad, gdt, i);
            if (x < -c) x = -c; /* clamp_min(-c); NaN compares false */
            if (x > c) x = c;   /* then clamp_max(c) */
            store_g(grad, gdt, i, x);
        }
    }
    return LUCID_OK;
}

/* ---------------------------------------------------------- dispatchers */

lucid_status lucid_grad_clip_norm(lucid_ctx *ctx, lucid_param_layout *layout,
                                  lucid_param_block *pb, lucid_tensor *grads,
                                  int apply) {
    LUCID_TRY(lucid_optim_check_flat(ctx, "clip_grad_norm", layout, pb, grads,
                                     "grads", 1));
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, layout->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->grad_norm(ctx, layout, lucid_pb_dev(pb),
                           lucid_tensor_data(grads), grads->dtype, apply));
    if (apply) lucid_storage_bump_version(grads->storage);
    return LUCID_OK;
}

lucid_status lucid_grad_clip_value(lucid_ctx *ctx, lucid_param_layout *layout,
                                   lucid_param_block *pb, lucid_tensor *grads) {
    LUCID_TRY(lucid_optim_check_flat(ctx, "clip_grad_value", layout, pb, grads,
                                     "grads", 1));
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, layout->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->grad_clip_value(ctx, layout, lucid_pb_dev(pb),
                                 lucid_tensor_data(grads), grads->dtype));
    lucid_storage_bump_version(grads->storage);
    return LUCID_OK;
}
