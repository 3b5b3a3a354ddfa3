/*
 * conv_wcols.c — the host-side record of a Conv2d column cache
 * (lucid_conv_wcols, nn.h): what the cache's device buffer holds, whether
 * it still holds the im2col columns of a given x, and the process total of
 * the bytes every cache holds (LUCID_WCOLS_MAX_MB is checked against it by
 * the CUDA backend, cuda/nn_conv_wcols.cu).
 *
 * The rule (nn.h): fresh <=> the last write was queued from the same x
 * view (its storage, retained so the address cannot be reused by another
 * storage, and its data pointer), with the storage at the same version,
 * the same shape and dtype, the same kernel and conv params, the same rows
 * per image, in the same device epoch.  Every host-queued write of a
 * storage bumps its version (engine/core/ops.c, the nn entry points,
 * engine/train/optim.c), so an unchanged version means no write was queued
 * since the columns were: a filter gradient queued after them (and ordered
 * after them on the device by the backend's events) reads what an im2col
 * of x would write now.  Host only; no device work here, except that
 * release calls the events_free hook the backend installed.
 */
#include "nn/nn.h"
#include "internal.h"
#include <string.h>

/* bytes of every live cache buffer in the process (retired ones included) */
static size_t g_held;

void lucid_conv_wcols_init(lucid_conv_wcols *c) {
    memset(c, 0, sizeof *c);
    c->dtype = LUCID_F32;
}

void lucid_conv_wcols_invalidate(lucid_conv_wcols *c) {
    if (!c) return;
    c->valid = 0;
    lucid_storage_release(c->src);
    c->src = NULL;
    c->src_data = NULL;
    c->src_version = 0;
    memset(c->shape, 0, sizeof c->shape);
    c->kh = c->kw = 0;
    memset(&c->p, 0, sizeof c->p);
    c->rows = 0;
    c->epoch = 0;
    c->side = 0;
}

void lucid_conv_wcols_release(lucid_conv_wcols *c) {
    if (!c) return;
    lucid_conv_wcols_invalidate(c);
    if (c->events_free) c->events_free(c->events);
    c->events[0] = c->events[1] = NULL;
    c->events_free = NULL;
    lucid_storage_release(c->buf);
    c->buf = NULL;
    for (int i = 0; i < LUCID_CONV_WCOLS_RETIRED; i++) {
        lucid_storage_release(c->retired[i]);
        c->retired[i] = NULL;
    }
    lucid_conv_wcols_budget_give(c->held);
    c->held = 0;
    c->write_pending = c->read_pending = 0;
    c->write_epoch = c->read_epoch = 0;
}

static int same_params(const lucid_conv2d_params *a, const lucid_conv2d_params *b) {
    return a->stride_h == b->stride_h && a->stride_w == b->stride_w && a->pad_h == b->pad_h &&
           a->pad_w == b->pad_w && a->dilation_h == b->dilation_h &&
           a->dilation_w == b->dilation_w && a->groups == b->groups;
}

int lucid_conv_wcols_fresh(const lucid_conv_wcols *c, const lucid_tensor *x, int kh, int kw,
                           const lucid_conv2d_params *p, int64_t rows, uint64_t epoch) {
    if (!c || !x || !p || !c->valid || !c->buf || x->ndim != 4) return 0;
    for (int d = 0; d < 4; d++)
        if (c->shape[d] != x->shape[d]) return 0;
    return c->src == x->storage && c->src_data == lucid_tensor_data(x) &&
           c->src_version == lucid_storage_version(x->storage) && c->dtype == x->dtype &&
           c->kh == kh && c->kw == kw && same_params(&c->p, p) && c->rows == rows &&
           c->epoch == epoch;
}

void lucid_conv_wcols_mark(lucid_conv_wcols *c, const lucid_tensor *x, int kh, int kw,
                           const lucid_conv2d_params *p, int64_t rows, uint64_t epoch,
                           int side) {
    if (!c || !x || !p || x->ndim != 4) return;
    lucid_storage_retain(x->storage); /* before the release: may be the same */
    lucid_storage_release(c->src);
    c->src = x->storage;
    c->src_data = lucid_tensor_data(x);
    c->src_version = lucid_storage_version(x->storage);
    for (int d = 0; d < 4; d++) c->shape[d] = x->shape[d];
    c->dtype = x->dtype;
    c->kh = kh;
    c->kw = kw;
    c->p = *p;
    c->rows = rows;
    c->epoch = epoch;
    c->side = side != 0;
    c->valid = 1;
}

int lucid_conv_wcols_budget_take(size_t bytes, size_t cap) {
    size_t cur = __atomic_load_n(&g_held, __ATOMIC_RELAXED);
    for (;;) {
        if (bytes > cap || cur > cap - bytes) return 0;
        if (__atomic_compare_exchange_n(&g_held, &cur, cur + bytes, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    }
}

void lucid_conv_wcols_budget_give(size_t bytes) {
    if (bytes) __atomic_sub_fetch(&g_held, bytes, __ATOMIC_RELAXED);
}

size_t lucid_conv_wcols_held_total(void) { return __atomic_load_n(&g_held, __ATOMIC_RELAXED); }

int lucid_conv_wcols_adopt(lucid_conv_wcols *c, lucid_storage *buf, size_t bytes) {
    if (!c || !buf) return 0;
    if (c->buf) {
        int slot = -1;
        for (int i = 0; i < LUCID_CONV_WCOLS_RETIRED && slot < 0; i++)
            if (!c->retired[i]) slot = i;
        if (slot < 0) return 0;
        c->retired[slot] = c->buf;
    }
    lucid_conv_wcols_invalidate(c); /* the new buffer holds nothing yet */
    c->buf = buf;
    c->held += bytes;
    return 1;
}
