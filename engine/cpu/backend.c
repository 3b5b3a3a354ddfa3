/*
 * backend.c — the CPU backend table (lucid_cpu_backend).
 *
 * The CPU is never a context's accelerator, so it has no per-context state:
 * init/shutdown/synchronize are no-ops (CPU ops complete before they
 * return). CPU storage is allocated by engine/core/storage.c itself
 * (64-byte aligned, counted in ctx->cpu_stats); the memory entries here only
 * expose those statistics and keep the table complete:
 *   alloc/free      plain aligned host memory, not counted (storage.c does
 *                   not call them; they exist for callers that want scratch)
 *   host pinned     NULL (page-locked memory comes from the CUDA backend)
 *   memory_stats    ctx->cpu_stats; empty_cache: nothing cached;
 *   reset_peak      peaks := current values.
 * The ops live in elementwise.c, reduce.c, matmul.c and random.c.
 */
#include "cpu.h"
#include <stdlib.h>

static lucid_status cpu_init(lucid_ctx *ctx, int device_index) {
    return LUCID_OK;
}

static void cpu_shutdown(lucid_ctx *ctx) {}

static lucid_status cpu_synchronize(lucid_ctx *ctx) { return LUCID_OK; }

static lucid_status cpu_alloc(lucid_ctx *ctx, size_t nbytes, void **ptr) {
    size_t rounded = ((nbytes ? nbytes : 1) + 63) & ~(size_t)63;
    *ptr = aligned_alloc(64, rounded);
    if (!*ptr)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of host memory: cannot allocate %zu bytes",
                            nbytes);
    return LUCID_OK;
}

static void cpu_free(lucid_ctx *ctx, void *ptr, size_t nbytes) { free(ptr); }

static lucid_status cpu_memory_stats(lucid_ctx *ctx, lucid_memory_stats *out) {
    *out = ctx->cpu_stats;
    return LUCID_OK;
}

static lucid_status cpu_empty_cache(lucid_ctx *ctx) { return LUCID_OK; }

static lucid_status cpu_reset_peak(lucid_ctx *ctx) {
    ctx->cpu_stats.peak_allocated = ctx->cpu_stats.allocated;
    ctx->cpu_stats.peak_reserved = ctx->cpu_stats.reserved;
    return LUCID_OK;
}

static const lucid_backend cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .synchronize = cpu_synchronize,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc_pinned = NULL,
    .host_free_pinned = NULL,
    .memory_stats = cpu_memory_stats,
    .empty_cache = cpu_empty_cache,
    .reset_peak = cpu_reset_peak,
    .copy = lucid_cpu_copy,
    .fill = lucid_cpu_fill,
    .binary = lucid_cpu_binary,
    .binary_scalar = lucid_cpu_binary_scalar,
    .unary = lucid_cpu_unary,
    .axpy = lucid_cpu_axpy,
    .reduce_all = lucid_cpu_reduce_all,
    .reduce_dim = lucid_cpu_reduce_dim,
    .matmul = lucid_cpu_matmul,
    .rand_uniform = lucid_cpu_rand_uniform,
    .rand_normal = lucid_cpu_rand_normal,
};

const lucid_backend *lucid_cpu_backend(void) { return &cpu_backend; }
