/*
 * ema.c — exponential moving average of the flat parameter buffer
 * (Ultralytics ModelEMA, reference §3.5): object, dispatcher, CPU kernel.
 *
 * Contract
 *   - The EMA tensor has the layout's shape (flat f32) and starts as a copy
 *     of the parameters (ModelEMA deep-copies the model).
 *   - Per update: updates += 1 (device counter in the block, before use);
 *     d = decay * (1 - exp(-updates / tau)) in f64; then for every element of
 *     every segment (trainable, frozen and floating buffers such as BN
 *     running mean/var): v = v * f32(d); v = v + f32(1 - d) * p, each
 *     operation rounded to f32 (ModelEMA: v *= d; v += (1 - d) * p).
 *   - Gaps between segments are left as they are.
 *   - lucid_ema_update_pair: two EMAs (parameters, f32 BN buffers) with one
 *     update counter and one d, as the fused optimizer step's ema/aux_ema:
 *     the block is copied on the device into a scratch block first, so the
 *     second update derives d from the same (updates, decay, tau).
 */
#include "train/optim_backend.h"
#include <stdlib.h>
#include <string.h>

struct lucid_ema {
    int refcount;
    lucid_param_layout *layout; /* owning reference */
    lucid_tensor *ema;
};

lucid_status lucid_cpu_ema_update(lucid_ctx *ctx, const lucid_param_layout *l,
                                  lucid_param_values *blk, float *ema,
                                  const float *param) {
    lucid_pb_ema_prep(blk);
    float d = blk->st.ema_d, omd = blk->st.ema_1md;
    for (int c = 0; c < l->nchunks_all; c++) {
        const lucid_chunk *ch = &l->chunks_all_host[c];
        float *v = ema + ch->start;
        const float *p = param + ch->start;
        for (int32_t j = 0; j < ch->len; j++) {
            float x = v[j] * d;
            float y = omd * p[j];
            v[j] = x + y;
        }
    }
    return LUCID_OK;
}

lucid_status lucid_ema_create(lucid_ctx *ctx, lucid_param_layout *layout,
                              const lucid_tensor *params, lucid_ema **out) {
    *out = NULL;
    LUCID_TRY(lucid_optim_check_flat(ctx, "ema_create", layout, NULL, params,
                                     "params", 0));
    lucid_ema *e = calloc(1, sizeof *e);
    if (!e) return lucid_seterr(ctx, LUCID_ERR_OOM, "ema: out of memory");
    lucid_status st = lucid_tensor_clone(ctx, params, &e->ema);
    if (st != LUCID_OK) {
        free(e);
        return st;
    }
    e->refcount = 1;
    e->layout = layout;
    lucid_param_layout_retain(layout);
    *out = e;
    return LUCID_OK;
}

void lucid_ema_retain(lucid_ema *e) {
    if (e) __atomic_add_fetch(&e->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_ema_release(lucid_ema *e) {
    if (!e || __atomic_sub_fetch(&e->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    lucid_tensor_release(e->ema);
    lucid_param_layout_release(e->layout);
    free(e);
}

lucid_tensor *lucid_ema_tensor(lucid_ema *e) { return e->ema; }
lucid_param_layout *lucid_ema_layout(lucid_ema *e) { return e->layout; }

lucid_status lucid_ema_update(lucid_ctx *ctx, lucid_ema *e,
                              lucid_param_block *pb,
                              const lucid_tensor *params) {
    if (!e) return lucid_seterr(ctx, LUCID_ERR_ARG, "ema_update: NULL ema");
    LUCID_TRY(lucid_optim_check_flat(ctx, "ema_update", e->layout, pb, params,
                                     "params", 0));
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, e->layout->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->ema_update(ctx, e->layout, lucid_pb_dev(pb),
                            lucid_tensor_data(e->ema),
                            lucid_tensor_data(params)));
    lucid_storage_bump_version(e->ema->storage);
    return LUCID_OK;
}

lucid_status lucid_ema_update_pair(lucid_ctx *ctx, lucid_ema *e,
                                   lucid_param_block *pb,
                                   const lucid_tensor *params, lucid_ema *aux,
                                   lucid_param_block *scratch,
                                   const lucid_tensor *x) {
    if (!e || !aux || !pb || !scratch)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "ema_update_pair: NULL %s",
                            !e ? "ema" : !aux ? "aux ema" : !pb ? "block" : "scratch block");
    if (scratch == pb)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "ema_update_pair: the scratch block is the block itself");
    if (pb->dev.type != scratch->dev.type ||
        (pb->dev.type == LUCID_CUDA && pb->dev.index != scratch->dev.index))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "ema_update_pair: block and scratch block are on "
                            "different devices");
    /* scratch = pb before the update: same updates, decay and tau */
    LUCID_TRY(lucid_copy(ctx, scratch->device, pb->device));
    LUCID_TRY(lucid_ema_update(ctx, e, pb, params));
    return lucid_ema_update(ctx, aux, scratch, x);
}
