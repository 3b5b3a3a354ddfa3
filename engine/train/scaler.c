/*
 * scaler.c — fp16 dynamic loss scaling (torch.amp.GradScaler semantics,
 * clipping reference §8): scale the loss, unscale + found_inf check, and the
 * end-of-step scale update. Dispatchers and CPU kernels.
 *
 * Contract
 *   - Everything is decided on the device: found_inf is a device int the
 *     unscale sets, the optimizer kernel reads (skip) and scaler_update
 *     resets; the scale and growth tracker live in the block. No host sync.
 *   - unscale: inv = f32(1/f64(S)); for every trainable element: not finite
 *     -> found_inf = 1; then g *= inv unless inv == 1 (non-finite stays
 *     non-finite). f32 gradients only (torch refuses fp16 grads too).
 *   - update (every optimizer step, scaler on or off): torch
 *     _amp_update_scale_ when enabled (no lower bound on the scale), then
 *     found_inf = 0.
 */
#include "train/optim_backend.h"

lucid_status lucid_cpu_grad_unscale(lucid_ctx *ctx, const lucid_param_layout *l,
                                    lucid_param_values *blk, float *grad) {
    if (!blk->in.scaler_enabled) return LUCID_OK;
    lucid_pb_unscale_prep(blk);
    float inv = blk->st.inv_scale;
    int found = 0;
    for (int c = 0; c < l->nchunks_train; c++) {
        const lucid_chunk *ch = &l->chunks_train_host[c];
        float *g = grad + ch->start;
        for (int32_t j = 0; j < ch->len; j++) {
            float x = g[j];
            if (!(x - x == 0.0f)) found = 1;
            if (inv != 1.0f) g[j] = x * inv;
        }
    }
    if (found) blk->st.found_inf = 1;
    return LUCID_OK;
}

lucid_status lucid_cpu_scaler_update(lucid_ctx *ctx, lucid_param_values *blk) {
    lucid_pb_scaler_update(blk);
    return LUCID_OK;
}

lucid_status lucid_cpu_scale(lucid_ctx *ctx, lucid_param_values *blk, float *x,
                             int64_t n) {
    float s = blk->st.loss_scale;
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * s;
    return LUCID_OK;
}

/* ---------------------------------------------------------- dispatchers */

lucid_status lucid_scaler_scale(lucid_ctx *ctx, lucid_param_block *pb,
                                lucid_tensor *x) {
    if (!pb || !x) return lucid_seterr(ctx, LUCID_ERR_ARG, "scaler_scale: NULL argument");
    lucid_device d = lucid_tensor_device(x);
    if (d.type != pb->dev.type || d.index != pb->dev.index)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "scaler_scale: tensor and parameter block are on "
                            "different devices");
    if (x->dtype != LUCID_F32 || !lucid_tensor_is_contiguous(x))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "scaler_scale: expected a contiguous f32 tensor, "
                            "got dtype %s",
                            lucid_dtype_name(x->dtype));
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, pb->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->scale(ctx, lucid_pb_dev(pb), lucid_tensor_data(x),
                       lucid_tensor_numel(x)));
    lucid_storage_bump_version(x->storage);
    return LUCID_OK;
}

lucid_status lucid_grad_unscale(lucid_ctx *ctx, lucid_param_layout *layout,
                                lucid_param_block *pb, lucid_tensor *grads) {
    LUCID_TRY(lucid_optim_check_flat(ctx, "grad_unscale", layout, pb, grads,
                                     "grads", 0));
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, layout->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->grad_unscale(ctx, layout, lucid_pb_dev(pb),
                              lucid_tensor_data(grads)));
    lucid_storage_bump_version(grads->storage);
    return LUCID_OK;
}

lucid_status lucid_scaler_update(lucid_ctx *ctx, lucid_param_block *pb) {
    if (!pb) return lucid_seterr(ctx, LUCID_ERR_ARG, "scaler_update: NULL block");
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, pb->dev);
    if (!k) return ctx->last_status;
    return k->scaler_update(ctx, lucid_pb_dev(pb));
}
