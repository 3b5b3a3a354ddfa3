/*
 * optim.c — optimizer objects (SGD, AdamW, MuSGD): flat state buffers and
 * the step dispatcher.
 *
 * Contract
 *   - State buffers are flat f32 tensors with the layout's numel, on the
 *     layout's device, zero-initialised (torch initialises momentum buffers
 *     lazily from the first gradient; buf = 0*mu + d equals that clone).
 *   - MuSGD also owns a workspace of lucid_musgd_work_numel(layout) floats.
 *   - lucid_optim_step checks the buffers and launches one update (kernel
 *     table of the device); the per-step scalars come from the block.
 *   - lucid_optim_step_fused checks the same plus the EMA tensors (each
 *     EMA's layout must have the segment table of the one it is used
 *     with) and hands the whole step to the device's optim_step entry with
 *     its flags (optim_backend.h lucid_step_call).
 *   - MuSGD on CUDA: the GEMM precision is the host's choice, read from
 *     the staging copy of in.ns_bf16 when the step is enqueued (optim.h).
 */
#include "train/optim_backend.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct lucid_optim {
    int refcount;
    lucid_optim_kind kind;
    lucid_param_layout *layout;   /* owning reference */
    int nstate;
    lucid_tensor *state[2];
    lucid_tensor *work;           /* MuSGD workspace, else NULL */
};

static const char *const kind_names[LUCID_OPTIM_KIND_COUNT] = {"SGD", "AdamW",
                                                               "MuSGD"};

const char *lucid_optim_kind_name(lucid_optim_kind k) {
    return (unsigned)k < LUCID_OPTIM_KIND_COUNT ? kind_names[k] : "?";
}

int lucid_optim_kind_parse(const char *name, lucid_optim_kind *out) {
    if (!name) return -1;
    for (int k = 0; k < LUCID_OPTIM_KIND_COUNT; k++)
        if (strcasecmp(name, kind_names[k]) == 0) {
            *out = (lucid_optim_kind)k;
            return 0;
        }
    return -1;
}

static lucid_status zeros(lucid_ctx *ctx, lucid_device dev, int64_t n,
                          lucid_tensor **out) {
    if (dev.type == LUCID_CPU) {
        LUCID_TRY(lucid_tensor_empty(ctx, dev, LUCID_F32, 1, &n, out));
        memset(lucid_tensor_data(*out), 0, (size_t)n * sizeof(float));
        return LUCID_OK;
    }
    return lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &n, out);
}

static void optim_free(lucid_optim *o) {
    for (int i = 0; i < 2; i++)
        if (o->state[i]) lucid_tensor_release(o->state[i]);
    if (o->work) lucid_tensor_release(o->work);
    if (o->layout) lucid_param_layout_release(o->layout);
    free(o);
}

lucid_status lucid_optim_create(lucid_ctx *ctx, lucid_optim_kind kind,
                                lucid_param_layout *layout,
                                lucid_optim **out) {
    *out = NULL;
    if ((unsigned)kind >= LUCID_OPTIM_KIND_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: unknown kind %d",
                            (int)kind);
    if (!layout) return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: NULL layout");
    lucid_optim *o = calloc(1, sizeof *o);
    if (!o) return lucid_seterr(ctx, LUCID_ERR_OOM, "optimizer: out of memory");
    o->refcount = 1;
    o->kind = kind;
    o->layout = layout;
    lucid_param_layout_retain(layout);
    o->nstate = kind == LUCID_OPTIM_SGD ? 1 : 2;
    lucid_status st = LUCID_OK;
    int64_t n = layout->total_numel;
    for (int i = 0; i < o->nstate && st == LUCID_OK; i++)
        st = zeros(ctx, layout->dev, n, &o->state[i]);
    if (st == LUCID_OK && kind == LUCID_OPTIM_MUSGD && layout->nmuon > 0)
        st = zeros(ctx, layout->dev, lucid_musgd_work_numel(layout), &o->work);
    if (st != LUCID_OK) {
        optim_free(o);
        return st;
    }
    *out = o;
    return LUCID_OK;
}

void lucid_optim_retain(lucid_optim *o) {
    if (o) __atomic_add_fetch(&o->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_optim_release(lucid_optim *o) {
    if (o && __atomic_sub_fetch(&o->refcount, 1, __ATOMIC_ACQ_REL) == 0)
        optim_free(o);
}

lucid_optim_kind lucid_optim_get_kind(const lucid_optim *o) { return o->kind; }
int lucid_optim_state_count(const lucid_optim *o) { return o->nstate; }

lucid_tensor *lucid_optim_state(lucid_optim *o, int i) {
    return (i >= 0 && i < o->nstate) ? o->state[i] : NULL;
}

const char *lucid_optim_state_name(const lucid_optim *o, int i) {
    if (i < 0 || i >= o->nstate) return NULL;
    switch (o->kind) {
    case LUCID_OPTIM_ADAMW: return i == 0 ? "exp_avg" : "exp_avg_sq";
    case LUCID_OPTIM_MUSGD: return i == 0 ? "momentum_buffer" : "momentum_buffer_SGD";
    default: return "momentum_buffer";
    }
}

/* Same segment table (offsets, sizes, trainability) and total. */
static int same_table(const lucid_param_layout *a, const lucid_param_layout *b) {
    if (a == b) return 1;
    if (a->total_numel != b->total_numel || a->nsegs != b->nsegs ||
        a->dev.type != b->dev.type || a->dev.index != b->dev.index)
        return 0;
    for (int i = 0; i < a->nsegs; i++) {
        const lucid_param_segment *x = &a->segs[i], *y = &b->segs[i];
        if (x->offset != y->offset || x->numel != y->numel ||
            (x->trainable != 0) != (y->trainable != 0))
            return 0;
    }
    return 1;
}

static lucid_status step_common(lucid_ctx *ctx, lucid_optim *o,
                                lucid_param_block *pb, lucid_tensor *params,
                                const lucid_tensor *grads,
                                const lucid_optim_step_opts *opts,
                                const char *what) {
    if (!o || !pb)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer step: NULL %s",
                            o ? "parameter block" : "optimizer");
    LUCID_TRY(lucid_optim_check_flat(ctx, what, o->layout, pb, params, "params", 0));
    LUCID_TRY(lucid_optim_check_flat(ctx, what, o->layout, pb, grads, "grads", 0));
    if (lucid_tensor_data(params) == lucid_tensor_data(grads))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: params and grads are the same buffer", what);
    lucid_step_call c;
    memset(&c, 0, sizeof c);
    c.kind = o->kind;
    c.param = lucid_tensor_data(params);
    c.grad = lucid_tensor_data((lucid_tensor *)grads);
    c.s0 = lucid_tensor_data(o->state[0]);
    c.s1 = o->nstate > 1 ? lucid_tensor_data(o->state[1]) : NULL;
    c.work = o->work ? lucid_tensor_data(o->work) : NULL;
    c.ns_bf16_gemm = lucid_pb_host(pb)->in.ns_bf16 != 0;
    lucid_tensor *ema_t = NULL, *aux_t = NULL;
    if (opts) {
        const int known = LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM |
                          LUCID_STEP_CLIP_VALUE | LUCID_STEP_SCALER_UPDATE |
                          LUCID_STEP_KEEP_GRADS;
        if (opts->flags & ~known)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: unknown flags 0x%x", what,
                                (unsigned)(opts->flags & ~known));
        c.flags = opts->flags;
        if (opts->aux_ema && !opts->ema)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: aux_ema needs ema (it uses the EMA's decay)", what);
        if (opts->ema) {
            lucid_param_layout *el = lucid_ema_layout(opts->ema);
            if (!same_table(el, o->layout))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: the EMA's layout is not the optimizer's "
                                    "(segment tables differ)", what);
            ema_t = lucid_ema_tensor(opts->ema);
            LUCID_TRY(lucid_optim_check_flat(ctx, what, o->layout, pb, ema_t, "ema", 0));
            if (lucid_tensor_data(ema_t) == c.param || lucid_tensor_data(ema_t) == c.grad)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: the EMA aliases params or grads", what);
            c.flags |= LUCID_STEP_EMA_BIT;
            c.ema = lucid_tensor_data(ema_t);
        }
        if (opts->aux_ema) {
            lucid_param_layout *al = lucid_ema_layout(opts->aux_ema);
            aux_t = lucid_ema_tensor(opts->aux_ema);
            LUCID_TRY(lucid_optim_check_flat(ctx, what, al, pb, aux_t, "aux_ema", 0));
            LUCID_TRY(lucid_optim_check_flat(ctx, what, al, pb, opts->aux, "aux", 0));
            if (lucid_tensor_data(aux_t) == lucid_tensor_data((lucid_tensor *)opts->aux))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: aux_ema and aux are the same buffer", what);
            c.flags |= LUCID_STEP_AUX_BIT;
            c.aux_layout = al;
            c.aux_ema = lucid_tensor_data(aux_t);
            c.aux = lucid_tensor_data((lucid_tensor *)opts->aux);
        }
    }
    const lucid_optim_kernels *k = lucid_optim_kernels_for(ctx, o->layout->dev);
    if (!k) return ctx->last_status;
    LUCID_TRY(k->optim_step(ctx, o->layout, lucid_pb_dev(pb), &c));
    lucid_storage_bump_version(params->storage);
    for (int i = 0; i < o->nstate; i++)
        lucid_storage_bump_version(o->state[i]->storage);
    if (c.flags & (LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | LUCID_STEP_CLIP_VALUE))
        lucid_storage_bump_version(grads->storage);
    if (ema_t) lucid_storage_bump_version(ema_t->storage);
    if (aux_t) lucid_storage_bump_version(aux_t->storage);
    return LUCID_OK;
}

lucid_status lucid_optim_step(lucid_ctx *ctx, lucid_optim *o,
                              lucid_param_block *pb, lucid_tensor *params,
                              const lucid_tensor *grads) {
    return step_common(ctx, o, pb, params, grads, NULL,
                       o ? lucid_optim_kind_name(o->kind) : "optimizer step");
}

lucid_status lucid_optim_step_fused(lucid_ctx *ctx, lucid_optim *o,
                                    lucid_param_block *pb,
                                    lucid_tensor *params, lucid_tensor *grads,
                                    const lucid_optim_step_opts *opts) {
    if (!opts)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer fused step: NULL options");
    return step_common(ctx, o, pb, params, grads, opts,
                       o ? lucid_optim_kind_name(o->kind) : "optimizer fused step");
}
