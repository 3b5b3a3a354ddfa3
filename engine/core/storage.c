/*
 * storage.c — reference-counted memory blocks on a device.
 *
 * A storage owns its bytes (unless wrapped) and one reference to its context,
 * so a context lives as long as any of its memory. Device memory comes from
 * the backend's caching allocator; CPU memory is 64-byte aligned and counted
 * in the context's CPU statistics; pinned CPU memory goes through the
 * accelerator backend when there is one.
 */
#include "internal.h"
#include <stdlib.h>
#include <string.h>

static void cpu_stats_add(lucid_ctx *ctx, size_t nbytes) {
    lucid_memory_stats *st = &ctx->cpu_stats;
    __atomic_add_fetch(&st->allocated, nbytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->reserved, nbytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->num_allocs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->num_device_allocs, 1, __ATOMIC_RELAXED);
    uint64_t a = __atomic_load_n(&st->allocated, __ATOMIC_RELAXED);
    uint64_t p = __atomic_load_n(&st->peak_allocated, __ATOMIC_RELAXED);
    while (a > p && !__atomic_compare_exchange_n(&st->peak_allocated, &p, a, 0,
                                                 __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
    }
    uint64_t r = __atomic_load_n(&st->reserved, __ATOMIC_RELAXED);
    uint64_t pr = __atomic_load_n(&st->peak_reserved, __ATOMIC_RELAXED);
    while (r > pr && !__atomic_compare_exchange_n(&st->peak_reserved, &pr, r, 0,
                                                  __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)) {
    }
}

static void cpu_stats_sub(lucid_ctx *ctx, size_t nbytes) {
    __atomic_sub_fetch(&ctx->cpu_stats.allocated, nbytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ctx->cpu_stats.reserved, nbytes, __ATOMIC_RELAXED);
}

lucid_status lucid_storage_create(lucid_ctx *ctx, lucid_device dev,
                                  size_t nbytes, int pinned,
                                  lucid_storage **out) {
    *out = NULL;
    /* a size past int64 is a wrapped computation upstream, never memory */
    if (nbytes > (size_t)INT64_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "storage size %zu bytes overflows (more than "
                            "2^63-1)",
                            nbytes);
    lucid_storage *s = calloc(1, sizeof *s);
    if (!s)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of host memory allocating a storage header");
    s->refcount = 1;
    s->ctx = ctx;
    s->device = dev;
    s->nbytes = nbytes;
    size_t alloc_bytes = nbytes ? nbytes : 1;
    if (dev.type == LUCID_CPU) {
        if (pinned && ctx->accel && ctx->accel->host_alloc_pinned) {
            lucid_status st =
                ctx->accel->host_alloc_pinned(ctx, alloc_bytes, &s->data);
            if (st != LUCID_OK) {
                free(s);
                return st;
            }
            s->pinned = 1;
        } else {
            size_t rounded = (alloc_bytes + 63) & ~(size_t)63;
            s->data = aligned_alloc(64, rounded);
            if (!s->data) {
                free(s);
                return lucid_seterr(ctx, LUCID_ERR_OOM,
                                    "out of host memory: cannot allocate %zu "
                                    "bytes (cpu allocated now: %llu bytes)",
                                    nbytes,
                                    (unsigned long long)ctx->cpu_stats.allocated);
            }
        }
        cpu_stats_add(ctx, nbytes);
    } else {
        const lucid_backend *b = lucid_backend_for(ctx, dev);
        if (!b) {
            free(s);
            return ctx->last_status;
        }
        lucid_status st = b->alloc(ctx, alloc_bytes, &s->data);
        if (st != LUCID_OK) {
            free(s);
            return st;
        }
    }
    lucid_ctx_retain(ctx);
    *out = s;
    return LUCID_OK;
}

lucid_status lucid_storage_wrap(lucid_ctx *ctx, lucid_device dev, void *data,
                                size_t nbytes, lucid_storage **out) {
    lucid_storage *s = calloc(1, sizeof *s);
    if (!s) return lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory");
    s->refcount = 1;
    s->ctx = ctx;
    s->device = dev;
    s->data = data;
    s->nbytes = nbytes;
    s->external = 1;
    lucid_ctx_retain(ctx);
    *out = s;
    return LUCID_OK;
}

void lucid_storage_retain(lucid_storage *s) {
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_storage_release(lucid_storage *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    lucid_ctx *ctx = s->ctx;
    if (!s->external) {
        if (s->device.type == LUCID_CPU) {
            if (s->pinned)
                ctx->accel->host_free_pinned(ctx, s->data);
            else
                free(s->data);
            cpu_stats_sub(ctx, s->nbytes);
        } else {
            ctx->accel->free(ctx, s->data, s->nbytes ? s->nbytes : 1);
        }
    }
    free(s);
    lucid_ctx_release(ctx);
}

void *lucid_storage_data(const lucid_storage *s) { return s->data; }
size_t lucid_storage_nbytes(const lucid_storage *s) { return s->nbytes; }
lucid_device lucid_storage_device(const lucid_storage *s) { return s->device; }
lucid_ctx *lucid_storage_ctx(const lucid_storage *s) { return s->ctx; }

uint64_t lucid_storage_version(const lucid_storage *s) {
    return __atomic_load_n(&s->version, __ATOMIC_RELAXED);
}

void lucid_storage_bump_version(lucid_storage *s) {
    __atomic_add_fetch(&s->version, 1, __ATOMIC_RELAXED);
}
