/*
 * param_block.c — the device parameter block (see optim.h for every field).
 *
 * Contract
 *   - Two copies of struct lucid_param_values: the staging copy in host
 *     memory (page-locked when the block lives on a GPU, so the upload is a
 *     true async copy a CUDA graph can record) and the device copy that
 *     kernels read. On the CPU both are ordinary memory and the upload is a
 *     memcpy, so update-without-upload has no effect on either device.
 *   - upload copies only the inputs part (offsetof(lucid_param_values, st)
 *     bytes): device-owned state is never overwritten by the host.
 *   - read synchronizes (through the blocking device->host copy); set_state
 *     is synchronous.
 */
#include "train/optim_backend.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void lucid_param_values_default(lucid_param_values *v) {
    memset(v, 0, sizeof *v);
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        v->in.lr[s] = 0.01f;
        v->in.momentum[s] = 0.937f;
        v->in.weight_decay[s] = (s % LUCID_KIND_COUNT) == LUCID_KIND_WEIGHT
                                    ? 0.0005f : 0.0f;
    }
    v->in.beta2 = 0.999f;
    v->in.eps = 1e-8f;
    v->in.muon_scale = 0.2f;
    v->in.sgd_scale = 1.0f;
    v->in.ema_decay = 0.9999;
    v->in.ema_tau = 2000.0;
    v->in.clip_max_norm = 10.0f;
    v->in.clip_value = 0.0f;
    v->in.growth_factor = 2.0f;
    v->in.backoff_factor = 0.5f;
    v->in.growth_interval = 2000;
    v->in.nesterov = 1;
    v->in.scaler_enabled = 0;
    v->in.ns_bf16 = 1;
    v->st.loss_scale = 65536.0f;
    v->st.inv_scale = 1.0f / 65536.0f;
    v->st.clip_coef = 1.0f;
}

static void pb_free(lucid_param_block *pb) {
    if (!pb) return;
    if (pb->staging) lucid_tensor_release(pb->staging);
    if (pb->device) lucid_tensor_release(pb->device);
    if (pb->ctx) lucid_ctx_release(pb->ctx);
    free(pb);
}

lucid_status lucid_param_block_create(lucid_ctx *ctx, lucid_device dev,
                                      const lucid_param_values *init,
                                      lucid_param_block **out) {
    *out = NULL;
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, dev);
    if (!k) return ctx->last_status;
    lucid_param_block *pb = calloc(1, sizeof *pb);
    if (!pb) return lucid_seterr(ctx, LUCID_ERR_OOM, "param block: out of memory");
    pb->refcount = 1;
    pb->ctx = ctx;
    lucid_ctx_retain(ctx);
    pb->dev = dev;
    int64_t n = (int64_t)sizeof(lucid_param_values);
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_storage *s = NULL;
    lucid_status st = lucid_storage_create(ctx, cpu, (size_t)n,
                                           dev.type == LUCID_CUDA, &s);
    if (st == LUCID_OK) {
        st = lucid_tensor_from_storage(ctx, s, LUCID_U8, 1, &n, NULL, 0,
                                       &pb->staging);
        lucid_storage_release(s);
    }
    if (st == LUCID_OK)
        st = lucid_tensor_empty(ctx, dev, LUCID_U8, 1, &n, &pb->device);
    if (st != LUCID_OK) {
        pb_free(pb);
        return st;
    }
    lucid_param_values *h = lucid_pb_host(pb);
    if (init) *h = *init;
    else lucid_param_values_default(h);
    st = k->memcpy_h2d(ctx, lucid_tensor_data(pb->device), h, sizeof *h, 0);
    if (st != LUCID_OK) {
        pb_free(pb);
        return st;
    }
    *out = pb;
    return LUCID_OK;
}

void lucid_param_block_retain(lucid_param_block *pb) {
    if (pb) __atomic_add_fetch(&pb->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_param_block_release(lucid_param_block *pb) {
    if (pb && __atomic_sub_fetch(&pb->refcount, 1, __ATOMIC_ACQ_REL) == 0)
        pb_free(pb);
}

lucid_status lucid_param_block_update(lucid_param_block *pb,
                                      const lucid_param_inputs *in) {
    if (!pb || !in) return LUCID_ERR_ARG;
    lucid_pb_host(pb)->in = *in;
    return LUCID_OK;
}

lucid_param_inputs *lucid_param_block_staging(lucid_param_block *pb) {
    return &lucid_pb_host(pb)->in;
}

lucid_status lucid_param_block_upload(lucid_ctx *ctx, lucid_param_block *pb) {
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, pb->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->memcpy_h2d(ctx, lucid_pb_dev(pb), lucid_pb_host(pb),
                            offsetof(lucid_param_values, st), 1));
    lucid_storage_bump_version(pb->device->storage);
    return LUCID_OK;
}

lucid_status lucid_param_block_read(lucid_ctx *ctx, lucid_param_block *pb,
                                    lucid_param_values *out) {
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, pb->dev);
    if (!k) return ctx->last_status;
    return k->memcpy_d2h(ctx, out, lucid_pb_dev(pb), sizeof *out);
}

lucid_status lucid_param_block_set_state(lucid_ctx *ctx, lucid_param_block *pb,
                                         const lucid_param_state *st) {
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, pb->dev);
    if (!k) return ctx->last_status;
    lucid_pb_host(pb)->st = *st;
    return k->memcpy_h2d(ctx, &lucid_pb_dev(pb)->st, st, sizeof *st, 0);
}

void *lucid_param_block_device_ptr(lucid_param_block *pb) {
    return lucid_pb_dev(pb);
}

lucid_device lucid_param_block_device(const lucid_param_block *pb) {
    return pb->dev;
}
