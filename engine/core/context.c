/*
 * context.c — the context object: device, accelerator backend state, RNG,
 * CPU memory accounting and the last error. No global state: each context
 * owns everything it uses, so several contexts can live in one process.
 */
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

lucid_ctx_options lucid_ctx_options_default(void) {
    lucid_ctx_options o;
    memset(&o, 0, sizeof o);
    o.device.type = LUCID_CPU;
    o.device.index = 0;
    return o;
}

int lucid_cuda_device_count(void) { return lucid_cuda_backend_device_count(); }

int lucid_cuda_available(void) { return lucid_cuda_device_count() > 0; }

int lucid_device_parse(const char *s, lucid_device *out) {
    if (!s) return -1;
    if (strcmp(s, "cpu") == 0) {
        out->type = LUCID_CPU;
        out->index = 0;
        return 0;
    }
    if (strcmp(s, "auto") == 0) {
        out->type = lucid_cuda_available() ? LUCID_CUDA : LUCID_CPU;
        out->index = 0;
        return 0;
    }
    if (strncmp(s, "cuda", 4) == 0) {
        out->type = LUCID_CUDA;
        out->index = 0;
        if (s[4] == '\0') return 0;
        if (s[4] != ':' || s[5] < '0' || s[5] > '9') return -1;
        char *end = NULL;
        long v = strtol(s + 5, &end, 10);
        if (*end != '\0' || v < 0 || v > 1024) return -1;
        out->index = (int)v;
        return 0;
    }
    return -1;
}

static void copy_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

lucid_status lucid_ctx_create(const lucid_ctx_options *opt, lucid_ctx **out,
                              char *err, size_t errlen) {
    lucid_ctx_options def = lucid_ctx_options_default();
    if (!opt) opt = &def;
    if (!out) {
        copy_err(err, errlen, "lucid_ctx_create: out is NULL");
        return LUCID_ERR_ARG;
    }
    *out = NULL;
    if (opt->device.type != LUCID_CPU && opt->device.type != LUCID_CUDA) {
        char msg[96];
        snprintf(msg, sizeof msg, "lucid_ctx_create: unknown device type %d",
                 (int)opt->device.type);
        copy_err(err, errlen, msg);
        return LUCID_ERR_ARG;
    }
    if (opt->device.type == LUCID_CPU && opt->device.index != 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "lucid_ctx_create: device cpu:%d (the CPU is device 0)",
                 opt->device.index);
        copy_err(err, errlen, msg);
        return LUCID_ERR_ARG;
    }
    if (opt->cpu_threads < 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "lucid_ctx_create: cpu_threads %d (expected >= 0; 0: "
                 "one per core)", opt->cpu_threads);
        copy_err(err, errlen, msg);
        return LUCID_ERR_ARG;
    }
    lucid_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        copy_err(err, errlen, "lucid_ctx_create: out of host memory");
        return LUCID_ERR_OOM;
    }
    ctx->refcount = 1;
    ctx->device = opt->device;
    ctx->cpu_threads = opt->cpu_threads;
    ctx->rng_seed = opt->seed;
    ctx->rng_offset = 0;
    if (opt->device.type == LUCID_CUDA) {
        ctx->accel = lucid_cuda_backend();
        if (!ctx->accel) {
            copy_err(err, errlen,
                     "device cuda requested but this build has no CUDA "
                     "backend (rebuild with CUDA=1 where nvcc is installed)");
            free(ctx);
            return LUCID_ERR_UNSUPPORTED;
        }
        int n = lucid_cuda_backend_device_count();
        if (opt->device.index < 0 || opt->device.index >= n) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "device cuda:%d requested but %d CUDA device(s) visible",
                     opt->device.index, n);
            copy_err(err, errlen, msg);
            free(ctx);
            return LUCID_ERR_DEVICE;
        }
        lucid_status s = ctx->accel->init(ctx, opt->device.index);
        if (s != LUCID_OK) {
            copy_err(err, errlen, ctx->errmsg);
            free(ctx);
            return s;
        }
    }
    *out = ctx;
    return LUCID_OK;
}

void lucid_ctx_retain(lucid_ctx *ctx) {
    if (ctx) __atomic_add_fetch(&ctx->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_ctx_release(lucid_ctx *ctx) {
    if (!ctx) return;
    if (__atomic_sub_fetch(&ctx->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (ctx->accel) {
        ctx->accel->synchronize(ctx);
        ctx->accel->shutdown(ctx);
    }
    free(ctx);
}

lucid_device lucid_ctx_device(const lucid_ctx *ctx) { return ctx->device; }

lucid_status lucid_ctx_synchronize(lucid_ctx *ctx) {
    if (ctx->accel) return ctx->accel->synchronize(ctx);
    return LUCID_OK;
}

lucid_status lucid_ctx_set_grad_lane(lucid_ctx *ctx, int on) {
    ctx->grad_lane = on ? 1 : 0;
    if (!on && ctx->accel && ctx->accel->lane_join) return ctx->accel->lane_join(ctx, 0);
    return LUCID_OK;
}

int lucid_ctx_grad_lane(const lucid_ctx *ctx) { return ctx->grad_lane; }

lucid_status lucid_ctx_grad_lane_fork(lucid_ctx *ctx, lucid_device dev, const void *key,
                                      int *forked) {
    *forked = 0;
    if (!ctx->grad_lane || !ctx->accel || !ctx->accel->lane_fork ||
        dev.type != ctx->device.type || dev.index != ctx->device.index)
        return LUCID_OK;
    return ctx->accel->lane_fork(ctx, 0, key, forked);
}

lucid_status lucid_ctx_branch_fork(lucid_ctx *ctx, int branch, int *forked) {
    if (!forked) return lucid_seterr(ctx, LUCID_ERR_ARG, "branch_fork: forked is NULL");
    *forked = 0;
    if (branch < 1 || branch > LUCID_BRANCHES)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "branch_fork: branch %d (expected 1..%d)",
                            branch, LUCID_BRANCHES);
    if (!ctx->accel || !ctx->accel->lane_fork) return LUCID_OK;
    return ctx->accel->lane_fork(ctx, branch, NULL, forked);
}

void lucid_ctx_branch_return(lucid_ctx *ctx) {
    if (ctx->accel && ctx->accel->lane_return) ctx->accel->lane_return(ctx);
}

lucid_status lucid_ctx_branch_join(lucid_ctx *ctx, int branch) {
    if (branch != -1 && (branch < 1 || branch > LUCID_BRANCHES))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "branch_join: branch %d (expected 1..%d, or -1 "
                            "for all)", branch, LUCID_BRANCHES);
    if (!ctx->accel || !ctx->accel->lane_join) return LUCID_OK;
    /* -1: the backend's -2, every branch lane but an open one */
    return ctx->accel->lane_join(ctx, branch > 0 ? branch : -2);
}

static lucid_status branch_mark_args(lucid_ctx *ctx, const char *fn, int branch, int mark) {
    if (branch < 1 || branch > LUCID_BRANCHES || mark < 1 || mark > LUCID_BRANCH_MARKS)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: branch %d mark %d (expected 1..%d, 1..%d)",
                            fn, branch, mark, LUCID_BRANCHES, LUCID_BRANCH_MARKS);
    return LUCID_OK;
}

lucid_status lucid_ctx_branch_mark(lucid_ctx *ctx, int branch, int mark) {
    LUCID_TRY(branch_mark_args(ctx, "branch_mark", branch, mark));
    if (!ctx->accel || !ctx->accel->lane_mark) return LUCID_OK;
    return ctx->accel->lane_mark(ctx, branch, mark - 1);
}

lucid_status lucid_ctx_branch_wait(lucid_ctx *ctx, int branch, int mark) {
    LUCID_TRY(branch_mark_args(ctx, "branch_wait", branch, mark));
    if (!ctx->accel || !ctx->accel->lane_wait) return LUCID_OK;
    return ctx->accel->lane_wait(ctx, branch, mark - 1);
}

const lucid_backend *lucid_backend_for(lucid_ctx *ctx, lucid_device dev) {
    if (dev.type == LUCID_CPU) return lucid_cpu_backend();
    if (ctx->accel && ctx->device.type == dev.type &&
        ctx->device.index == dev.index)
        return ctx->accel;
    lucid_seterr(ctx, LUCID_ERR_ARG,
                 "tensor on cuda:%d but this context drives %s:%d", dev.index,
                 ctx->device.type == LUCID_CUDA ? "cuda" : "cpu",
                 ctx->device.index);
    return NULL;
}

lucid_status lucid_memory_stats_get(lucid_ctx *ctx, lucid_device dev,
                                    lucid_memory_stats *out) {
    if (dev.type == LUCID_CPU) {
        *out = ctx->cpu_stats;
        return LUCID_OK;
    }
    const lucid_backend *b = lucid_backend_for(ctx, dev);
    if (!b) return ctx->last_status;
    return b->memory_stats(ctx, out);
}

lucid_status lucid_memory_empty_cache(lucid_ctx *ctx) {
    if (ctx->accel) return ctx->accel->empty_cache(ctx);
    return LUCID_OK;
}

lucid_status lucid_memory_reset_peak(lucid_ctx *ctx) {
    ctx->cpu_stats.peak_allocated = ctx->cpu_stats.allocated;
    ctx->cpu_stats.peak_reserved = ctx->cpu_stats.reserved;
    if (ctx->accel) return ctx->accel->reset_peak(ctx);
    return LUCID_OK;
}

void lucid_ctx_rng_next(lucid_ctx *ctx, uint64_t n, uint64_t *seed,
                        uint64_t *offset) {
    *seed = ctx->rng_seed;
    *offset = ctx->rng_offset;
    ctx->rng_offset += n;
}

void lucid_ctx_rng_set(lucid_ctx *ctx, uint64_t seed, uint64_t offset) {
    ctx->rng_seed = seed;
    ctx->rng_offset = offset;
}

void lucid_ctx_rng_get(const lucid_ctx *ctx, uint64_t *seed, uint64_t *offset) {
    *seed = ctx->rng_seed;
    *offset = ctx->rng_offset;
}
