/*
 * conv_wshadow.c — the host-side freshness record of a Conv2d weight shadow
 * (lucid_conv_wshadow, nn.h): what the shadow's device buffer holds and
 * whether it still equals the weight rounded to an activation dtype.
 *
 * The rule (nn.h): fresh <=> the last cast was queued from the same weight
 * view (its storage, retained so the address cannot be reused by another
 * storage, and its data pointer), with the storage at the same version,
 * into the same dtype, in the same device epoch.  Every host-queued write
 * of a storage bumps its version (engine/core/ops.c, the nn entry points,
 * engine/train/optim.c), so an unchanged version means no write was queued
 * since the cast: the shadow, queued on the stream before those reads,
 * equals what a cast now would produce.  Host only; no device work here.
 */
#include "nn/nn.h"
#include "internal.h"
#include <string.h>

void lucid_conv_wshadow_init(lucid_conv_wshadow *s) {
    memset(s, 0, sizeof *s);
    s->dtype = LUCID_F32;
}

void lucid_conv_wshadow_invalidate(lucid_conv_wshadow *s) {
    if (!s) return;
    s->valid = 0;
    lucid_storage_release(s->src);
    s->src = NULL;
    s->src_data = NULL;
    s->numel = 0;
    s->src_version = 0;
    s->epoch = 0;
    s->flip_off = 0;
    memset(s->flip_shape, 0, sizeof s->flip_shape);
    s->phase_off = 0;
    memset(s->phase_shape, 0, sizeof s->phase_shape);
    /* phase_want is kept: it describes the conv, not the cast */
}

void lucid_conv_wshadow_release(lucid_conv_wshadow *s) {
    if (!s) return;
    lucid_conv_wshadow_invalidate(s);
    lucid_storage_release(s->buf);
    s->buf = NULL;
}

int lucid_conv_wshadow_fresh(const lucid_conv_wshadow *s, const lucid_tensor *w,
                             lucid_dtype dt, uint64_t epoch) {
    if (!s || !w || !s->valid || !s->buf) return 0;
    return s->src == w->storage && s->src_data == lucid_tensor_data(w) &&
           s->numel == lucid_tensor_numel(w) &&
           s->src_version == lucid_storage_version(w->storage) && s->dtype == dt &&
           s->epoch == epoch;
}

void lucid_conv_wshadow_mark(lucid_conv_wshadow *s, const lucid_tensor *w,
                             lucid_dtype dt, uint64_t epoch) {
    if (!s || !w) return;
    lucid_storage_retain(w->storage); /* before the release: may be the same */
    lucid_storage_release(s->src);
    s->src = w->storage;
    s->src_data = lucid_tensor_data(w);
    s->numel = lucid_tensor_numel(w);
    s->src_version = lucid_storage_version(w->storage);
    s->dtype = dt;
    s->epoch = epoch;
    s->valid = 1;
}

void lucid_conv_wshadow_mark_flip(lucid_conv_wshadow *s, const lucid_tensor *w, int64_t off) {
    if (!s || !w || w->ndim != 4 || off <= 0) return;
    s->flip_off = off;
    for (int d = 0; d < 4; d++) s->flip_shape[d] = w->shape[d];
}

int64_t lucid_conv_wshadow_flip_off(const lucid_conv_wshadow *s, const lucid_tensor *w,
                                    lucid_dtype dt, uint64_t epoch) {
    if (!s || !w || s->flip_off <= 0 || w->ndim != 4) return 0;
    for (int d = 0; d < 4; d++)
        if (s->flip_shape[d] != w->shape[d]) return 0;
    return lucid_conv_wshadow_fresh(s, w, dt, epoch) ? s->flip_off : 0;
}

void lucid_conv_wshadow_mark_phase(lucid_conv_wshadow *s, const lucid_tensor *w, int64_t off) {
    if (!s || !w || w->ndim != 4 || off <= 0) return;
    s->phase_off = off;
    for (int d = 0; d < 4; d++) s->phase_shape[d] = w->shape[d];
}

int64_t lucid_conv_wshadow_phase_off(const lucid_conv_wshadow *s, const lucid_tensor *w,
                                     lucid_dtype dt, uint64_t epoch) {
    if (!s || !w || s->phase_off <= 0 || w->ndim != 4) return 0;
    for (int d = 0; d < 4; d++)
        if (s->phase_shape[d] != w->shape[d]) return 0;
    return lucid_conv_wshadow_fresh(s, w, dt, epoch) ? s->phase_off : 0;
}

void lucid_conv_wshadow_want_phase(lucid_conv_wshadow *s) {
    if (s) s->phase_want = 1;
}
