/*
 * graph.c — the device-independent side of recorded steps (graph.h):
 * capture/launch through the backend table's graph slots, events, and the
 * reference set pinning what a recording baked in.
 */
#include "train/graph.h"
#include "internal.h"
#include "nn/epoch.h"
#include "train/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- capture */

static const lucid_backend *graph_backend(lucid_ctx *ctx, const char *what) {
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    if (!b || !b->capture_begin || !b->capture_end || !b->graph_launch) {
        lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                     "%s: CUDA graphs need a context on a CUDA device (this "
                     "one drives %s)",
                     what, b ? b->name : "the cpu");
        return NULL;
    }
    return b;
}

int lucid_ctx_graphs_available(const lucid_ctx *ctx) {
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    return b && b->capture_begin && b->capture_end && b->graph_launch;
}

lucid_status lucid_ctx_capture_begin_ex(lucid_ctx *ctx, unsigned flags) {
    const lucid_backend *b = graph_backend(ctx, "capture_begin");
    if (!b) return ctx->last_status;
    const unsigned known = LUCID_CAPTURE_KEEP_SHADOWS | LUCID_CAPTURE_CONTINUE;
    if (flags & ~known)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "capture_begin: unknown flags 0x%x",
                            flags & ~known);
    return b->capture_begin(ctx, flags);
}

lucid_status lucid_ctx_capture_begin(lucid_ctx *ctx) {
    return lucid_ctx_capture_begin_ex(ctx, 0);
}

lucid_status lucid_ctx_shadows_stale(lucid_ctx *ctx) {
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    if (!b || !b->shadows_stale) return LUCID_OK;
    return b->shadows_stale(ctx);
}

struct lucid_graph {
    lucid_ctx *ctx; /* one reference */
    void *exec;
    int keeps; /* the capture kept the conv weight shadows (graph.h) */
};

int lucid_graph_keeps_shadows(const lucid_graph *g) { return g && g->keeps; }

lucid_status lucid_ctx_capture_end(lucid_ctx *ctx, lucid_graph **out) {
    if (out) *out = NULL;
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    if (!out) {
        /* discard: a no-op on contexts that cannot capture */
        if (!b || !b->capture_end) return LUCID_OK;
        return b->capture_end(ctx, NULL, NULL);
    }
    b = graph_backend(ctx, "capture_end");
    if (!b) return ctx->last_status;
    lucid_graph *g = calloc(1, sizeof *g);
    if (!g) {
        b->capture_end(ctx, NULL, NULL); /* never leave the stream capturing */
        return lucid_seterr(ctx, LUCID_ERR_OOM, "capture_end: out of host memory");
    }
    lucid_status st = b->capture_end(ctx, &g->exec, &g->keeps);
    if (st != LUCID_OK) {
        free(g);
        return st;
    }
    lucid_ctx_retain(ctx);
    g->ctx = ctx;
    *out = g;
    return LUCID_OK;
}

int lucid_ctx_capturing(lucid_ctx *ctx) {
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    return b && b->capturing ? b->capturing(ctx) : 0;
}

lucid_status lucid_graph_launch(lucid_ctx *ctx, lucid_graph *g) {
    if (!g || !g->exec)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "graph_launch: graph was destroyed");
    if (ctx != g->ctx)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "graph_launch: the graph belongs to another context");
    const lucid_backend *b = graph_backend(ctx, "graph_launch");
    if (!b) return ctx->last_status;
    return b->graph_launch(ctx, g->exec, g->keeps);
}

void lucid_graph_destroy(lucid_graph *g) {
    if (!g) return;
    if (g->ctx && g->ctx->accel && g->ctx->accel->graph_destroy)
        g->ctx->accel->graph_destroy(g->ctx, g->exec);
    if (g->ctx) lucid_ctx_release(g->ctx);
    free(g);
}

/* ----------------------------------------------------------------- events */

struct lucid_event {
    lucid_ctx *ctx; /* one reference */
    void *ev;
};

lucid_status lucid_event_create(lucid_ctx *ctx, lucid_event **out) {
    *out = NULL;
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    if (!b || !b->event_record || !b->event_synchronize)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "event: needs a context on a CUDA device");
    lucid_event *e = calloc(1, sizeof *e);
    if (!e) return lucid_seterr(ctx, LUCID_ERR_OOM, "event: out of host memory");
    lucid_ctx_retain(ctx);
    e->ctx = ctx;
    *out = e;
    return LUCID_OK;
}

lucid_status lucid_event_record(lucid_event *e) {
    return e->ctx->accel->event_record(e->ctx, &e->ev);
}

lucid_status lucid_event_record_node(lucid_event *e) {
    if (!e->ctx->accel->event_record_node)
        return lucid_seterr(e->ctx, LUCID_ERR_UNSUPPORTED, "event record_node: not supported "
                            "by this build's CUDA backend");
    return e->ctx->accel->event_record_node(e->ctx, &e->ev);
}

lucid_status lucid_event_synchronize(lucid_event *e) {
    return e->ctx->accel->event_synchronize(e->ctx, e->ev);
}

lucid_status lucid_event_wait(lucid_event *e) {
    if (!e->ctx->accel->event_wait)
        return lucid_seterr(e->ctx, LUCID_ERR_UNSUPPORTED, "event wait: not supported by this "
                            "build's CUDA backend");
    return e->ctx->accel->event_wait(e->ctx, e->ev);
}

lucid_status lucid_event_wait_on(lucid_event *e, lucid_ctx *waiter) {
    if (!waiter) return lucid_seterr(e->ctx, LUCID_ERR_ARG, "event wait: no waiting context");
    if (waiter == e->ctx) return lucid_event_wait(e);
    lucid_device a = lucid_ctx_device(e->ctx), b = lucid_ctx_device(waiter);
    if (waiter->accel != e->ctx->accel || a.type != b.type || a.index != b.index)
        return lucid_seterr(waiter, LUCID_ERR_ARG, "event wait: the event is of a context on "
                            "device %d, the waiting context on device %d (one device only)",
                            a.index, b.index);
    if (!waiter->accel->event_wait)
        return lucid_seterr(waiter, LUCID_ERR_UNSUPPORTED, "event wait: not supported by this "
                            "build's CUDA backend");
    return waiter->accel->event_wait(waiter, e->ev);
}

lucid_status lucid_side_copy(lucid_ctx *ctx, int n, lucid_tensor *const *dst,
                             const lucid_tensor *const *src, lucid_event *after,
                             lucid_event *done) {
    const lucid_backend *b = ctx ? ctx->accel : NULL;
    if (!b || !b->side_copy)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED, "side_copy: needs a context on a CUDA "
                            "device");
    if (n < 0 || n > 64)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "side_copy: %d copies (expected 0..64)", n);
    if ((after && after->ctx != ctx) || (done && done->ctx != ctx))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "side_copy: an event of another context");
    void *d[64] = {0};
    const void *sp[64] = {0};
    size_t bytes[64] = {0};
    for (int i = 0; i < n; i++) {
        const lucid_tensor *x = dst[i], *y = src[i];
        if (!x || !y)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "side_copy: copy %d has a NULL tensor", i + 1);
        lucid_device dd = lucid_tensor_device(x), sd = lucid_tensor_device(y);
        char a[96], c[96];
        if (dd.type != LUCID_CUDA || lucid_storage_ctx(x->storage) != ctx ||
            !(sd.type == LUCID_CPU || (sd.type == LUCID_CUDA && sd.index == dd.index)))
            return lucid_seterr(ctx, LUCID_ERR_ARG, "side_copy: copy %d: destination on %s, source "
                                "on %s (expected a destination on this context's CUDA device and a "
                                "source on the host or that device)", i + 1,
                                dd.type == LUCID_CUDA ? "cuda" : "cpu",
                                sd.type == LUCID_CUDA ? "cuda" : "cpu");
        if (x->dtype != y->dtype || lucid_tensor_numel(x) != lucid_tensor_numel(y) ||
            !lucid_tensor_is_contiguous(x) || !lucid_tensor_is_contiguous(y))
            return lucid_seterr(ctx, LUCID_ERR_ARG, "side_copy: copy %d: destination %s %s, source "
                                "%s %s (expected contiguous tensors of one dtype and element count)",
                                i + 1, lucid_shape_str(x->ndim, x->shape, a, sizeof a),
                                lucid_dtype_name(x->dtype),
                                lucid_shape_str(y->ndim, y->shape, c, sizeof c),
                                lucid_dtype_name(y->dtype));
        d[i] = lucid_tensor_data(x);
        sp[i] = lucid_tensor_data(y);
        bytes[i] = (size_t)lucid_tensor_numel(x) * lucid_dtype_size(x->dtype);
    }
    LUCID_TRY(b->side_copy(ctx, n, d, sp, bytes, after ? after->ev : NULL,
                           done ? &done->ev : NULL));
    for (int i = 0; i < n; i++) lucid_storage_bump_version(dst[i]->storage);
    return LUCID_OK;
}

void lucid_event_destroy(lucid_event *e) {
    if (!e) return;
    if (e->ev && e->ctx->accel->event_destroy) e->ctx->accel->event_destroy(e->ctx, e->ev);
    lucid_ctx_release(e->ctx);
    free(e);
}

/* ------------------------------------------------------------------- refs */

typedef struct {
    lucid_param *p;
    lucid_tensor *data, *grad;   /* retained */
    lucid_storage *storage;      /* identity only (held through data) */
    int64_t offset;
    int ndim;
    int64_t shape[LUCID_MAX_DIMS], strides[LUCID_MAX_DIMS];
    lucid_dtype dtype;
    lucid_device device;
    int trainable;
} ref_param;

#define REF_SAVED 4

/* The persistent buffers of one module at record time (restore()). */
typedef struct {
    int nout, nin;
    lucid_tensor **outputs;      /* (nout) retained, may be NULL */
    lucid_tensor **grad_inputs;  /* (nin) retained, may be NULL */
    lucid_tensor *saved[REF_SAVED];
} ref_bufs;

/* The hot fields first (lucid_graph_refs_quick reads the first cache
 * line only: the epoch, the mode mismatch count, the watch bits and
 * pointers and the recorded watched values). */
struct lucid_graph_refs {
    uint64_t epoch;              /* lucid_contract_epoch() at the last clean check */
    int mismatch;                /* recorded modules whose mode bits differ now
                                    (kept by the modules' setters: watches[]) */
    unsigned watch;              /* watched parameter-block inputs (bits) */
    const lucid_param_inputs *ema_in, *ns_in; /* their staging (fixed) */
    double ema_decay, ema_tau;
    int32_t ns_bf16;
    lucid_param_set *set;        /* retained */
    uint64_t set_version;        /* at the last check that found it equal */
    int nparams;
    ref_param *params;
    lucid_tensor *flat[3];       /* params, grads, buffers (retained) */
    int nmodules;
    lucid_module **mods;         /* (nmodules) retained, may hold NULL */
    lucid_mode_watch *watches;   /* (nmodules) linked into each module */
    ref_bufs *bufs;              /* (nmodules) */
    /* the block of each watch bit (retained) */
    lucid_param_block *ema_block, *ns_block;
};

static lucid_tensor *keep(lucid_tensor *t) {
    if (t) lucid_tensor_retain(t);
    return t;
}

static void snap_param(ref_param *r, lucid_param *p) {
    r->p = p;
    r->data = keep(p->data);
    r->grad = keep(p->grad);
    r->storage = p->data ? p->data->storage : NULL;
    r->offset = p->data ? p->data->offset : -1;
    r->ndim = p->data ? p->data->ndim : p->ndim;
    for (int d = 0; d < LUCID_MAX_DIMS; d++) {
        r->shape[d] = p->data && d < p->data->ndim ? p->data->shape[d] : 0;
        r->strides[d] = p->data && d < p->data->ndim ? p->data->strides[d] : 0;
    }
    r->dtype = p->data ? p->data->dtype : p->dtype;
    r->device = p->data ? lucid_tensor_device(p->data) : (lucid_device){LUCID_CPU, 0};
    r->trainable = p->trainable;
}

lucid_status lucid_graph_refs_create(lucid_ctx *ctx, lucid_param_set *set,
                                     int nmodules, lucid_module *const *modules,
                                     lucid_graph_refs **out) {
    *out = NULL;
    if (nmodules < 0 || (nmodules > 0 && !modules))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "graph refs: bad module list");
    lucid_graph_refs *r = calloc(1, sizeof *r);
    if (!r) return lucid_seterr(ctx, LUCID_ERR_OOM, "graph refs: out of host memory");
    /* the epoch before the snapshot: a change during it moves it past this */
    r->epoch = lucid_contract_epoch();
    if (set) {
        lucid_param_set_retain(set);
        r->set = set;
        r->set_version = lucid_param_set_version(set);
        r->nparams = lucid_param_set_count(set);
        r->params = calloc((size_t)(r->nparams ? r->nparams : 1), sizeof *r->params);
        if (!r->params) goto oom;
        for (int i = 0; i < r->nparams; i++)
            snap_param(&r->params[i], lucid_param_set_get(set, i));
        r->flat[0] = keep(lucid_param_set_flat_params(set));
        r->flat[1] = keep(lucid_param_set_flat_grads(set));
        r->flat[2] = keep(lucid_param_set_flat_buffers(set));
    }
    size_t nm = (size_t)(nmodules ? nmodules : 1);
    r->mods = calloc(nm, sizeof *r->mods);
    r->watches = calloc(nm, sizeof *r->watches);
    r->bufs = calloc(nm, sizeof *r->bufs);
    if (!r->mods || !r->watches || !r->bufs) goto oom;
    r->nmodules = nmodules;
    for (int i = 0; i < nmodules; i++) {
        lucid_module *m = modules[i];
        ref_bufs *rb = &r->bufs[i];
        if (!m) continue;
        lucid_module_retain(m);
        r->mods[i] = m;
        r->watches[i].mismatch = &r->mismatch;
        lucid_module_watch_modes(m, &r->watches[i]);
        rb->nout = m->noutputs;
        rb->nin = m->ninputs;
        rb->outputs = calloc((size_t)(rb->nout ? rb->nout : 1), sizeof *rb->outputs);
        rb->grad_inputs = calloc((size_t)(rb->nin ? rb->nin : 1), sizeof *rb->grad_inputs);
        if (!rb->outputs || !rb->grad_inputs) goto oom;
        for (int k = 0; k < rb->nout; k++) rb->outputs[k] = keep(m->outputs ? m->outputs[k] : NULL);
        for (int k = 0; k < rb->nin; k++)
            rb->grad_inputs[k] = keep(m->grad_inputs ? m->grad_inputs[k] : NULL);
        for (int k = 0; k < REF_SAVED; k++) rb->saved[k] = keep(m->saved[k]);
    }
    *out = r;
    return LUCID_OK;
oom:
    lucid_graph_refs_release(r);
    return lucid_seterr(ctx, LUCID_ERR_OOM, "graph refs: out of host memory");
}

/* Point *slot at pb (one reference), releasing what it held. */
static void hold_block(lucid_param_block **slot, lucid_param_block *pb) {
    if (*slot == pb) return;
    lucid_param_block_retain(pb);
    if (*slot) lucid_param_block_release(*slot);
    *slot = pb;
}

lucid_status lucid_graph_refs_watch_block(lucid_ctx *ctx, lucid_graph_refs *r,
                                          lucid_param_block *pb, unsigned what) {
    if (!r || !pb || !what || (what & ~(unsigned)LUCID_GRAPH_WATCH_ALL))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "graph refs: watch_block: bad arguments");
    const lucid_param_inputs *in = lucid_param_block_staging(pb);
    if (what & LUCID_GRAPH_WATCH_EMA) {
        hold_block(&r->ema_block, pb);
        r->ema_in = in;
        r->ema_decay = in->ema_decay;
        r->ema_tau = in->ema_tau;
    }
    if (what & LUCID_GRAPH_WATCH_NS_BF16) {
        hold_block(&r->ns_block, pb);
        r->ns_in = in;
        r->ns_bf16 = in->ns_bf16;
    }
    r->watch |= what;
    return LUCID_OK;
}

void lucid_graph_refs_release(lucid_graph_refs *r) {
    if (!r) return;
    for (int i = 0; r->params && i < r->nparams; i++) {
        lucid_tensor_release(r->params[i].data);
        lucid_tensor_release(r->params[i].grad);
    }
    free(r->params);
    for (int k = 0; k < 3; k++) lucid_tensor_release(r->flat[k]);
    for (int i = 0; r->mods && r->bufs && i < r->nmodules; i++) {
        ref_bufs *rb = &r->bufs[i];
        if (!r->mods[i]) continue;
        lucid_module_unwatch_modes(r->mods[i], &r->watches[i]);
        for (int k = 0; rb->outputs && k < rb->nout; k++) lucid_tensor_release(rb->outputs[k]);
        for (int k = 0; rb->grad_inputs && k < rb->nin; k++)
            lucid_tensor_release(rb->grad_inputs[k]);
        for (int k = 0; k < REF_SAVED; k++) lucid_tensor_release(rb->saved[k]);
        free(rb->outputs);
        free(rb->grad_inputs);
        lucid_module_release(r->mods[i]);
    }
    free(r->mods);
    free(r->watches);
    free(r->bufs);
    if (r->ema_block) lucid_param_block_release(r->ema_block);
    if (r->ns_block) lucid_param_block_release(r->ns_block);
    if (r->set) lucid_param_set_release(r->set);
    free(r);
}

static int same_dev(lucid_device a, lucid_device b) {
    return a.type == b.type && a.index == b.index;
}

/* Field-by-field comparison of one entry; 1 + reason when it changed. */
static int param_changed(const ref_param *r, char *why, size_t n) {
    const lucid_param *p = r->p;
    const lucid_tensor *t = p->data;
    if (!t) {
        snprintf(why, n, "%s: its tensor is gone", p->name);
        return 1;
    }
    if (t != r->data || t->storage != r->storage || p->grad != r->grad) {
        snprintf(why, n, "%s: tensor replaced", p->name);
        return 1;
    }
    if (t->offset != r->offset) {
        snprintf(why, n, "%s: offset %lld -> %lld", p->name, (long long)r->offset,
                 (long long)t->offset);
        return 1;
    }
    if (t->ndim != r->ndim) {
        snprintf(why, n, "%s: rank %d -> %d", p->name, r->ndim, t->ndim);
        return 1;
    }
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != r->shape[d] || t->strides[d] != r->strides[d]) {
            snprintf(why, n, "%s: shape/strides changed in dim %d", p->name, d);
            return 1;
        }
    if (t->dtype != r->dtype) {
        snprintf(why, n, "%s: dtype %s -> %s", p->name, lucid_dtype_name(r->dtype),
                 lucid_dtype_name(t->dtype));
        return 1;
    }
    if (!same_dev(lucid_tensor_device(t), r->device)) {
        snprintf(why, n, "%s: moved to another device", p->name);
        return 1;
    }
    if (p->trainable != r->trainable) {
        snprintf(why, n, "%s: trainable %d -> %d", p->name, r->trainable, p->trainable);
        return 1;
    }
    return 0;
}

int lucid_graph_refs_check_watched(const lucid_graph_refs *r, char *why, size_t whylen) {
    if (!r->watch) return 0;
    if (r->watch & LUCID_GRAPH_WATCH_EMA) {
        const lucid_param_inputs *in = r->ema_in;
        if (in->ema_decay != r->ema_decay || in->ema_tau != r->ema_tau) {
            if (why && whylen) snprintf(why, whylen, "EMA decay/tau changed");
            return 1;
        }
    }
    if ((r->watch & LUCID_GRAPH_WATCH_NS_BF16) &&
        r->ns_in->ns_bf16 != r->ns_bf16) {
        if (why && whylen)
            snprintf(why, whylen, "MuSGD Newton-Schulz precision (ns_bf16) changed");
        return 1;
    }
    return 0;
}

int lucid_graph_refs_quick(const lucid_graph_refs *r) {
    if (r->epoch != lucid_contract_epoch_now() || r->mismatch) return 0;
    if (!r->watch) return 1;
    if ((r->watch & LUCID_GRAPH_WATCH_EMA) &&
        (r->ema_in->ema_decay != r->ema_decay || r->ema_in->ema_tau != r->ema_tau))
        return 0;
    return !((r->watch & LUCID_GRAPH_WATCH_NS_BF16) && r->ns_in->ns_bf16 != r->ns_bf16);
}

int lucid_graph_refs_check(lucid_graph_refs *r, char *why, size_t whylen,
                           int *moved) {
    return lucid_graph_refs_check_ex(r, 0, why, whylen, moved);
}

int lucid_graph_refs_check_ex(lucid_graph_refs *r, int all_entries, char *why,
                              size_t whylen, int *moved) {
    if (moved) *moved = 0;
    if (why && whylen) why[0] = '\0';
    char scratch[8];
    if (!why || !whylen) {
        why = scratch;
        whylen = sizeof scratch;
    }
    uint64_t epoch = lucid_contract_epoch();
    if (epoch != r->epoch && moved) *moved |= LUCID_GRAPH_MOVED_EPOCH;
    if (r->set && lucid_param_set_count(r->set) != r->nparams) {
        snprintf(why, whylen, "the parameter set changed size (%d -> %d entries)",
                 r->nparams, lucid_param_set_count(r->set));
        return 1;
    }
    if (lucid_graph_refs_check_watched(r, why, whylen)) return 1;
    /* the entries, field by field, when the set's version moved (every
     * entry change bumps it; a bump with every field equal is a load in
     * place: the recording stays valid), or when asked to */
    if (r->set && (all_entries || lucid_param_set_version(r->set) != r->set_version)) {
        if (moved) *moved |= LUCID_GRAPH_MOVED_PARAMS;
        for (int i = 0; i < r->nparams; i++)
            if (param_changed(&r->params[i], why, whylen)) return 1;
        r->set_version = lucid_param_set_version(r->set);
    }
    /* modes: the watchers' count is exact; only a nonzero count walks the
     * modules, to name the first that differs */
    if (r->mismatch) {
        if (moved) *moved |= LUCID_GRAPH_MOVED_MODES;
        for (int i = 0; i < r->nmodules; i++) {
            const lucid_module *m = r->mods[i];
            if (!m) continue;
            unsigned now = lucid_module_mode_bits(m), rec = r->watches[i].recorded;
            if (now == rec) continue;
            const char *name = m->name[0] ? m->name : "?";
            if ((now ^ rec) & LUCID_MODE_TRAIN)
                snprintf(why, whylen, "module %s (%s): mode %s -> %s", name, lucid_module_kind(m),
                         (rec & LUCID_MODE_TRAIN) ? "train" : "eval",
                         (now & LUCID_MODE_TRAIN) ? "train" : "eval");
            else
                snprintf(why, whylen, "module %s (%s): need_grad_input %d -> %d", name,
                         lucid_module_kind(m), (rec & LUCID_MODE_GRAD_INPUT) ? 1 : 0,
                         (now & LUCID_MODE_GRAD_INPUT) ? 1 : 0);
            return 1;
        }
        snprintf(why, whylen, "graph refs: mode count %d with every module as recorded",
                 r->mismatch);
        return 1;
    }
    r->epoch = epoch;
    return 0;
}

static int reinstall(lucid_tensor **slot, lucid_tensor *rec) {
    if (*slot == rec) return 0;
    if (rec) lucid_tensor_retain(rec);
    if (*slot) lucid_tensor_release(*slot);
    *slot = rec;
    return 1;
}

int lucid_graph_refs_restore(lucid_graph_refs *r) {
    int n = 0;
    for (int i = 0; i < r->nmodules; i++) {
        const ref_bufs *rb = &r->bufs[i];
        lucid_module *m = r->mods[i];
        if (!m) continue;
        /* only slots the recording saw filled: an empty recorded slot (e.g.
         * grad_inputs of a first layer) is left as the module has it */
        for (int k = 0; k < rb->nout && m->outputs; k++)
            if (rb->outputs[k]) n += reinstall(&m->outputs[k], rb->outputs[k]);
        for (int k = 0; k < rb->nin && m->grad_inputs; k++)
            if (rb->grad_inputs[k]) n += reinstall(&m->grad_inputs[k], rb->grad_inputs[k]);
        for (int k = 0; k < REF_SAVED; k++)
            if (rb->saved[k]) n += reinstall(&m->saved[k], rb->saved[k]);
    }
    return n;
}

int lucid_graph_refs_nmodules(const lucid_graph_refs *r) { return r->nmodules; }
int lucid_graph_refs_nparams(const lucid_graph_refs *r) { return r->nparams; }
