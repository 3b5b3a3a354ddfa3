/*
 * nn_table.cu — the CUDA nn kernel table (lucid_nn_cuda_kernels) and the
 * per-context nn state: a registry keyed by the context, the shared scratch
 * arena, the BatchNorm fold counters, and the destructor.
 *
 * Registry: the backend state (lucid_cuda_state, common.cuh) has no slot for
 * nn state, so the nn state of a context is found in a process-wide list
 * keyed by the context pointer and guarded by a mutex (a handful of entries;
 * one short scan per nn call).  An entry also records the backend state and
 * allocator it was made for: if a context was released without
 * lucid_cuda_nn_state_destroy() and a new one reuses its address, the stale
 * entry no longer matches and is dropped (its device memory went with the
 * old allocator).  The backend's shutdown should call
 * lucid_cuda_nn_state_destroy(ctx) so entries never go stale.
 *
 * Profile (LUCID_PROFILE=1, read once per state): see nn_common.cuh; the
 * summary line is printed by the state's destructor.
 *
 * Counters (the BatchNorm fold's arrival counters): see nn_common.cuh.
 *
 * Arena policy: see nn_common.cuh.  Growth is geometric (x1.5 at least) so
 * a warm-up sees O(log) allocations; replaced arenas stay alive until the
 * context goes, because a recorded CUDA graph may point at them.
 */
#include "nn_common.cuh"
#include "nn_conv_col.cuh"

#include <mutex>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// registry

namespace {
std::mutex g_nn_mu;
std::vector<lucid_cuda_nn_state *> *g_nn_states; /* leaked at exit: tiny */

/* LUCID_PROFILE set to anything but "" or "0". */
int nn_profile_env(void) {
    const char *e = getenv("LUCID_PROFILE");
    return e && e[0] && strcmp(e, "0") != 0;
}

void nn_profile_print(const lucid_cuda_nn_state *ns) {
    const lucid_cuda_nn_profile &p = ns->prof;
    fprintf(stderr,
            "lucid profile: cudnn plans fwd %ld (%.3f s) bwd_data %ld (%.3f s) "
            "bwd_filter %ld (%.3f s); cudnn first runs fwd %ld (%.3f s) "
            "bwd_data %ld (%.3f s) bwd_filter %ld (%.3f s); scratch grows %ld "
            "(%.3f s, arena %.1f MiB); conv keys %zu\n",
            p.plan_n[0], p.plan_s[0], p.plan_n[1], p.plan_s[1], p.plan_n[2], p.plan_s[2],
            p.first_n[0], p.first_s[0], p.first_n[1], p.first_s[1], p.first_n[2],
            p.first_s[2], p.grow_n, p.grow_s, (double)ns->arena_bytes / (1024.0 * 1024.0),
            ns->plans.size());
}

void nn_state_free(lucid_cuda_nn_state *ns, bool release_memory) {
    if (!ns) return;
    if (ns->profile) nn_profile_print(ns);
    for (lucid_cuda_conv_plan *p : ns->plans) lucid_cuda_conv_plan_free(p);
    ns->plans.clear();
    if (release_memory && ns->cst && ns->cst->alloc) {
        if (ns->arena) lucid_cuda_free(ns->cst->alloc, ns->arena);
        for (void *p : ns->retired) lucid_cuda_free(ns->cst->alloc, p);
        if (ns->counters) lucid_cuda_free(ns->cst->alloc, ns->counters);
    }
    delete ns;
}
} // namespace

lucid_cuda_nn_state *lucid_cuda_nn_get(lucid_ctx *ctx, lucid_cuda_state *st) {
    std::lock_guard<std::mutex> lk(g_nn_mu);
    if (!g_nn_states) {
        g_nn_states = new (std::nothrow) std::vector<lucid_cuda_nn_state *>();
        if (!g_nn_states) {
            lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (nn state)");
            return NULL;
        }
    }
    for (size_t i = 0; i < g_nn_states->size(); i++) {
        lucid_cuda_nn_state *ns = (*g_nn_states)[i];
        if (ns->ctx != ctx) continue;
        if (ns->cst == st && ns->alloc_fp == (void *)st->alloc) return ns;
        /* stale: a previous context at this address; its memory is gone */
        ns->arena = NULL;
        ns->retired.clear();
        ns->counters = NULL;
        nn_state_free(ns, false);
        g_nn_states->erase(g_nn_states->begin() + (long)i);
        break;
    }
    lucid_cuda_nn_state *ns = new (std::nothrow) lucid_cuda_nn_state();
    if (!ns) {
        lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (nn state)");
        return NULL;
    }
    ns->ctx = ctx;
    ns->cst = st;
    ns->alloc_fp = (void *)st->alloc;
    ns->arena = NULL;
    ns->arena_bytes = 0;
    ns->counters = NULL;
    ns->conv_mode = 0;
    ns->conv1x1 = 0;
    ns->wcast = 0;
    ns->wcast_side = 0;
    ns->conv_small = 0;
    ns->conv_col = 0;
    ns->wcols = 0;
    ns->wcols_cap = 0;
    ns->bn_cluster = 0;
    ns->profile = nn_profile_env();
    memset(&ns->prof, 0, sizeof ns->prof);
    try {
        g_nn_states->push_back(ns);
    } catch (...) {
        delete ns;
        lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (nn state)");
        return NULL;
    }
    return ns;
}

extern "C" void lucid_cuda_nn_state_destroy(lucid_ctx *ctx) {
    lucid_cuda_nn_state *found = NULL;
    {
        std::lock_guard<std::mutex> lk(g_nn_mu);
        if (!g_nn_states) return;
        for (size_t i = 0; i < g_nn_states->size(); i++)
            if ((*g_nn_states)[i]->ctx == ctx) {
                found = (*g_nn_states)[i];
                g_nn_states->erase(g_nn_states->begin() + (long)i);
                break;
            }
    }
    if (!found) return;
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    bool live = st && st == found->cst && (void *)st->alloc == found->alloc_fp;
    if (live) {
        if (cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
        /* queued work may still use the arena */
        if (cudaStreamSynchronize(st->stream) != cudaSuccess)
            (void)cudaGetLastError();
        for (int k = 0; k < LUCID_CUDA_LANES; k++)
            if (st->lanes[k].stream && cudaStreamSynchronize(st->lanes[k].stream) != cudaSuccess)
                (void)cudaGetLastError();
    }
    nn_state_free(found, live);
}

/* The per-context settings below (0 the default / follow the process
 * switch, 1 .. max the others; any other value reads as 0): the previous
 * setting, or -1 when ctx has no CUDA state. */
static int set_route(lucid_ctx *ctx, int lucid_cuda_nn_state::*field, int route, int max) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) return -1;
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return -1;
    int old = ns->*field;
    ns->*field = route >= 1 && route <= max ? route : 0;
    return old;
}

extern "C" int lucid_cuda_nn_set_conv_mode(lucid_ctx *ctx, int mode) {
    return set_route(ctx, &lucid_cuda_nn_state::conv_mode, mode, 2);
}

extern "C" int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route) {
    return set_route(ctx, &lucid_cuda_nn_state::conv1x1, route, 2);
}

extern "C" int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route) {
    return set_route(ctx, &lucid_cuda_nn_state::conv_small, route, 2);
}

extern "C" int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route) {
    return set_route(ctx, &lucid_cuda_nn_state::conv_col, route, 1 + LUCID_CONV_COL_ALL);
}

extern "C" int lucid_cuda_nn_set_bn_cluster(lucid_ctx *ctx, int mode) {
    return set_route(ctx, &lucid_cuda_nn_state::bn_cluster, mode, 2);
}

extern "C" int lucid_cuda_nn_set_wcast(lucid_ctx *ctx, int mode) {
    return set_route(ctx, &lucid_cuda_nn_state::wcast, mode, 2);
}

extern "C" int lucid_cuda_nn_set_wcast_side(lucid_ctx *ctx, int mode) {
    return set_route(ctx, &lucid_cuda_nn_state::wcast_side, mode, 2);
}

extern "C" int lucid_cuda_nn_set_wcols(lucid_ctx *ctx, int mode) {
    return set_route(ctx, &lucid_cuda_nn_state::wcols, mode, 4);
}

extern "C" long long lucid_cuda_nn_set_wcols_cap(lucid_ctx *ctx, long long bytes) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st || bytes < 0) return -1;
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return -1;
    const long long old = (long long)ns->wcols_cap;
    ns->wcols_cap = (size_t)bytes;
    return old;
}

/* The compute stream of ctx (as void *), for benchmarks that time nn calls
 * with CUDA events; NULL when ctx has no CUDA state. */
extern "C" void *lucid_cuda_nn_stream(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    return st ? (void *)st->stream : NULL;
}

extern "C" int lucid_cuda_nn_profile_read(lucid_ctx *ctx, double out[16]) {
    std::lock_guard<std::mutex> lk(g_nn_mu);
    if (!g_nn_states) return 0;
    for (lucid_cuda_nn_state *ns : *g_nn_states) {
        if (ns->ctx != ctx) continue;
        if (!ns->profile) return 0;
        const lucid_cuda_nn_profile &p = ns->prof;
        for (int i = 0; i < 3; i++) {
            out[i] = (double)p.plan_n[i];
            out[3 + i] = p.plan_s[i];
            out[6 + i] = (double)p.first_n[i];
            out[9 + i] = p.first_s[i];
        }
        out[12] = (double)p.grow_n;
        out[13] = p.grow_s;
        out[14] = (double)ns->arena_bytes;
        out[15] = (double)ns->plans.size();
        return 1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// arena

lucid_status lucid_cuda_nn_arena(lucid_ctx *ctx, lucid_cuda_state *st,
                                 lucid_cuda_nn_state *ns, size_t nbytes,
                                 const char *what, void **ptr) {
    if (nbytes == 0) nbytes = 256;
    if (ns->arena && nbytes <= ns->arena_bytes) {
        *ptr = ns->arena;
        return LUCID_OK;
    }
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "%s: needs %zu bytes of nn scratch but the arena "
                            "holds %zu and the stream is being captured; run "
                            "one eager step with these shapes before "
                            "recording",
                            what, nbytes, ns->arena_bytes);
    size_t grow = ns->arena_bytes + ns->arena_bytes / 2;
    size_t want = nn_align(nbytes > grow ? nbytes : grow);
    void *p = NULL;
    double t0 = ns->profile ? lucid_cuda_nn_now() : 0.0;
    LUCID_TRY(lucid_cuda_malloc(ctx, st->alloc, want, st->stream, &p));
    if (ns->profile) {
        ns->prof.grow_s += lucid_cuda_nn_now() - t0;
        ns->prof.grow_n++;
    }
    if (ns->arena) {
        try {
            ns->retired.push_back(ns->arena);
        } catch (...) {
            lucid_cuda_free(st->alloc, p);
            return lucid_seterr(ctx, LUCID_ERR_OOM,
                                "out of host memory (nn arena list)");
        }
    }
    ns->arena = p;
    ns->arena_bytes = want;
    *ptr = p;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// counters

lucid_status lucid_cuda_nn_counters(lucid_ctx *ctx, lucid_cuda_state *st,
                                    lucid_cuda_nn_state *ns, int64_t n,
                                    unsigned int **ptr) {
    *ptr = NULL;
    if (n < 1 || n > LUCID_CUDA_NN_COUNTERS) return LUCID_OK;
    if (!ns->counters) {
        /* never allocate (or queue the memset) into a capture: the caller
         * falls back to its two-launch route, which gives the same bits */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
        if (cs != cudaStreamCaptureStatusNone) return LUCID_OK;
        size_t bytes = sizeof(unsigned int) * (size_t)LUCID_CUDA_NN_COUNTERS;
        void *p = NULL;
        LUCID_TRY(lucid_cuda_malloc(ctx, st->alloc, bytes, st->stream, &p));
        /* stream-ordered: every kernel that uses the counters is queued on
         * this stream after the memset */
        cudaError_t e = cudaMemsetAsync(p, 0, bytes, st->stream);
        if (e != cudaSuccess) {
            lucid_cuda_free(st->alloc, p);
            return lucid_cuda_err(ctx, e, "cudaMemsetAsync(nn counters)", __FILE__, __LINE__);
        }
        ns->counters = (unsigned int *)p;
    }
    *ptr = ns->counters;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// table

static const lucid_nn_kernels cuda_nn_table = {
    "cuda",
    lucid_cuda_conv2d_forward,
    lucid_cuda_conv2d_backward_input,
    lucid_cuda_conv2d_backward_params,
    lucid_cuda_batchnorm2d_forward,
    lucid_cuda_batchnorm2d_backward,
    lucid_cuda_silu_forward,
    lucid_cuda_silu_backward,
    lucid_cuda_maxpool2d_forward,
    lucid_cuda_maxpool2d_backward,
    lucid_cuda_upsample_nearest2d_forward,
    lucid_cuda_upsample_nearest2d_backward,
    lucid_cuda_channel_copy,
    lucid_cuda_add_forward,
    lucid_cuda_softmax_forward,
    lucid_cuda_softmax_backward,
    lucid_cuda_dfl_forward,
    lucid_cuda_dfl_backward,
    lucid_cuda_batchnorm2d_silu_forward,
    lucid_cuda_batchnorm2d_silu_backward,
    lucid_cuda_channel_copy_multi,
    lucid_cuda_conv2d_forward_shadow,
    lucid_cuda_conv2d_backward_input_shadow,
    lucid_cuda_conv2d_cast_shadows,
    lucid_cuda_conv2d_dcols_reserve,
    lucid_cuda_batchnorm2d_backward_dcols,
    lucid_cuda_conv2d_backward_input_dcols,
    lucid_cuda_conv2d_forward_cols,
    lucid_cuda_conv2d_backward_params_cols,
    lucid_cuda_batchnorm2d_backward_terms,
};

extern "C" const lucid_nn_kernels *lucid_nn_cuda_kernels(void) {
    return &cuda_nn_table;
}
