/*
 * lane.cu — the lanes of a context's device: side streams that a run of
 * ops is redirected to, so that independent work overlaps.
 *   - lane 0, the parameter-gradient lane: the weight and bias gradients of
 *     a backward run there while the compute stream goes on with the input
 *     gradients (lucid_ctx_set_grad_lane, engine/lucid.h; used by the Conv2d
 *     module's backward, engine/nn/module.c). It has up to
 *     LUCID_CUDA_GRAD_LANES streams (lane 0 and lanes LUCID_CUDA_BRANCHES +
 *     1 ..; LUCID_GRAD_LANES=n uses n of them, default 3): each gradient
 *     buffer (the fork's key) is given one of them, in turn, the first time
 *     it is seen, and keeps it, so the work on one buffer stays in order on
 *     one stream while the gradients of different layers run side by side;
 *   - lanes 1..LUCID_CUDA_BRANCHES, branch lanes: independent branches of a
 *     network, e.g. the box / class / keypoint branches of the pose head
 *     (lucid_ctx_branch_fork, engine/lucid.h; lua/lucid/nn/head.lua);
 *   - lane LUCID_CUDA_LANE_CAST, the cast lane: launches queued straight on
 *     its stream (lucid_cuda_cast_lane_fork / _join / _mark_plain /
 *     _wait_plain, common.cuh), no fields swapped: the conv weight shadows'
 *     casts, the plain ones (which the forward's GEMMs wait for through the
 *     mark) and the flipped and transposed copies (which only the
 *     backward-data reads), beside the forward instead of ahead of it
 *     (nn_conv.cu, conv2d_cast_shadows);
 *   - lane LUCID_CUDA_LANE_COLS, the cols lane: launches queued straight
 *     on its stream like the cast lane's (lucid_cuda_cols_lane_fork): the
 *     im2col of a conv whose forward builds no columns (layer 0 on the
 *     small-channel kernels) for its filter gradient, queued during the
 *     forward (the column cache, engine/nn/nn.h lucid_conv_wcols); the
 *     filter gradient waits for an event recorded after that launch.
 *
 * Why: a training step of a small network at batch 4 is latency-bound: its
 * kernels rarely fill the GPU, and on one stream they run one after the
 * other. The weight gradient of a layer is needed only by the optimizer, so
 * it need not sit on the backward's critical path (the chain of input
 * gradients). The same split is what cuDNN-based frameworks do when they
 * overlap weight-gradient work with the rest of the backward.
 *
 * How
 *   - fork: an event recorded on the current stream, waited on by the lane
 *     stream; then the lane's stream, cuBLAS handle, cuDNN stream and nn
 *     scratch (arena and BatchNorm fold counters, nn_common.cuh) are swapped
 *     into the context's fields, so the ops that follow queue on the lane
 *     without knowing it. return swaps them back. Forks nest (a Conv2d
 *     backward inside a branch forks the parameter lane from the branch
 *     lane): the open forks are a stack and returns undo them innermost
 *     first. A fork of a lane that is already open runs inline (*forked 0).
 *   - join: an event recorded on the lane, waited on by the current stream.
 *     Under stream capture the two edges become graph edges: the recorded
 *     graph holds the same fork/join structure (the lane must be joined
 *     before the capture ends; capture_end does it).
 *   - Lane work keeps the order of its calls: the gradients of a parameter
 *     written by several backwards accumulate in the same order as without
 *     the lane, with the same kernels, so results are bitwise equal.
 *   - Why several parameter-gradient streams: one was the step's tail. A
 *     CUPTI timeline of the recorded step (tools/ktrace.c, H200, 2026-11-30)
 *     showed the input-gradient chain done at 4.58 ms of a 4.98 ms replay
 *     while the single lane still had ~0.4 ms of weight gradients queued,
 *     the early layers' (160x160 and 320x320 planes, 35-50 us each), one
 *     after the other although they do not depend on each other.
 *   - Priorities: the compute stream and the branch lanes are created with
 *     the device's greatest priority and the parameter lanes and the cast
 *     lane with its least (backend.cu), so when both have blocks waiting,
 *     the critical path's are scheduled first.
 *   - Resources (stream, events, a cuBLAS handle with the compute handle's
 *     settings and its own workspace) are created by the lane's first fork
 *     outside a capture; a fork during a capture before that, or with the
 *     lane switched off (LUCID_GRAD_LANE=0 for lane 0, LUCID_BRANCH_LANES=0
 *     for the others), leaves the work on the current stream (*forked 0).
 *   - Memory: lane allocations (arena growth, workspace, counters) come from
 *     the caching allocator tagged with the lane's stream (alloc.cu), and
 *     are held until the context goes. A block is reused only for its own
 *     stream, so a tensor a branch allocates on its lane (eager warm-up) is
 *     never handed to another stream while the lane may still use it. The
 *     converse is not covered: the allocator does not track a block's use
 *     on other streams, so a tensor that lane work reads or writes must stay
 *     referenced until the lane is joined (freed earlier, its block goes
 *     back to its own stream's cache and can be handed out and written
 *     there while the lane still reads it). The callers pass module-owned,
 *     persistent buffers (module.c, head.lua), which satisfies this.
 */
#include "common.cuh"
#include "nn_common.cuh"

#include <stdlib.h>
#include <string.h>

/* Lane 0 and the lanes after the branch lanes carry parameter gradients
 * (all but the last, the cast lane). */
static int lane_is_grad(int lane) {
    return lane == 0 || (lane > LUCID_CUDA_BRANCHES && lane < LUCID_CUDA_LANE_CAST);
}

/* The lanes of single launches queued on their stream without a swap. */
static int lane_is_side(int lane) {
    return lane == LUCID_CUDA_LANE_CAST || lane == LUCID_CUDA_LANE_COLS;
}

/* Lanes whose work is off the critical path: the least stream priority. */
static int lane_is_low(int lane) { return lane_is_grad(lane) || lane_is_side(lane); }

/* LUCID_GRAD_LANES=n (1..LUCID_CUDA_GRAD_LANES, read once): how many
 * parameter-gradient streams are used; default LUCID_CUDA_GRAD_LANES. A
 * value out of range or not a number keeps the default. */
static int grad_lane_count(void) {
    static int n = -1;
    return lucid_env_int("LUCID_GRAD_LANES", 1, LUCID_CUDA_GRAD_LANES, LUCID_CUDA_GRAD_LANES, &n);
}

/* The parameter-gradient lane of gradient buffer key: the one it was given
 * when first seen; a new key takes the next stream in turn (lane 0, then
 * LUCID_CUDA_BRANCHES + 1, ...). With the table full, or no key, lane 0. */
static int grad_lane_of(lucid_cuda_state *st, const void *key) {
    int n = grad_lane_count();
    if (n <= 1 || !key) return 0;
    for (int i = 0; i < st->grad_keys_n; i++)
        if (st->grad_keys[i] == key) return st->grad_key_lane[i];
    if (st->grad_keys_n >= LUCID_CUDA_GRAD_KEYS) return 0;
    int slot = st->grad_keys_n % n;
    int lane = slot == 0 ? 0 : LUCID_CUDA_BRANCHES + slot;
    st->grad_keys[st->grad_keys_n] = key;
    st->grad_key_lane[st->grad_keys_n] = (unsigned char)lane;
    st->grad_keys_n++;
    return lane;
}

static int lane_env_off(int lane) {
    static int grad = -1, branch = -1;
    return lane_is_grad(lane) ? lucid_env_zero("LUCID_GRAD_LANE", &grad)
                              : lucid_env_zero("LUCID_BRANCH_LANES", &branch);
}

static lucid_status lane_create(lucid_ctx *ctx, lucid_cuda_state *st, lucid_cuda_lane *L,
                                int lane) {
    int least = 0, greatest = 0;
    CUDA_CHECK(ctx, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    if (lane_is_low(lane)) /* in the side partition with LUCID_SIDE_SMS (green.cu) */
        LUCID_TRY(lucid_cuda_side_stream_create(ctx, st, least, &L->stream));
    else
        CUDA_CHECK(ctx, cudaStreamCreateWithPriority(&L->stream, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&L->fork_ev, cudaEventDisableTiming));
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&L->join_ev, cudaEventDisableTiming));
    for (int m = 0; m < LUCID_CUDA_MARKS; m++)
        CUDA_CHECK(ctx, cudaEventCreateWithFlags(&L->mark_ev[m], cudaEventDisableTiming));
    /* the cast and cols lanes run their own kernels only (the cast lane's
     * one mark: slot 0, after the plain casts, lucid_cuda_cast_lane_mark_plain):
     * no cuBLAS handle and workspace (32 MiB) */
    if (lane_is_side(lane)) return LUCID_OK;
    /* the compute handle's settings and workspace size (backend.cu) */
    return lucid_cuda_cublas_create(ctx, st, L->stream, &L->cublas, &L->cublas_ws);
}

static void lane_free(lucid_cuda_state *st, lucid_cuda_lane *L) {
    if (L->cublas) cublasDestroy(L->cublas);
    if (st->alloc) {
        if (L->cublas_ws) lucid_cuda_free(st->alloc, L->cublas_ws);
        if (L->arena) lucid_cuda_free(st->alloc, L->arena);
        if (L->counters) lucid_cuda_free(st->alloc, L->counters);
    }
    if (L->fork_ev) cudaEventDestroy(L->fork_ev);
    if (L->join_ev) cudaEventDestroy(L->join_ev);
    for (int m = 0; m < LUCID_CUDA_MARKS; m++)
        if (L->mark_ev[m]) cudaEventDestroy(L->mark_ev[m]);
    if (L->stream) cudaStreamDestroy(L->stream);
    int off = L->off;
    memset(L, 0, sizeof *L);
    L->off = off;
    (void)cudaGetLastError();
}

void lucid_cuda_lane_destroy(lucid_cuda_state *st) {
    for (int k = 0; k < LUCID_CUDA_LANES; k++) lane_free(st, &st->lanes[k]);
    lucid_cuda_side_green_destroy(st);
    st->lane_depth = 0;
    st->lane_ns = NULL;
}

/* Swap a lane's stream, handles and nn scratch with the context's. */
static void lane_swap(lucid_cuda_state *st, lucid_cuda_nn_state *ns, lucid_cuda_lane *L) {
    cudaStream_t s = st->stream;
    st->stream = L->stream;
    L->stream = s;
    cublasHandle_t h = st->cublas;
    st->cublas = L->cublas;
    L->cublas = h;
    void *w = st->cublas_ws;
    st->cublas_ws = L->cublas_ws;
    L->cublas_ws = w;
#if defined(LUCID_HAVE_CUDNN)
    if (st->cudnn) (void)cudnnSetStream(st->cudnn, st->stream);
#endif
    void *a = ns->arena;
    ns->arena = L->arena;
    L->arena = a;
    size_t b = ns->arena_bytes;
    ns->arena_bytes = L->arena_bytes;
    L->arena_bytes = b;
    unsigned int *c = ns->counters;
    ns->counters = L->counters;
    L->counters = c;
}

/* Creates lane `lane`'s resources on first use (*ready 1 once they exist):
 * never inside a capture (*ready 0, LUCID_OK: the caller leaves its work on
 * the current stream); a failed creation frees what was made, switches the
 * lane off and returns the error once. */
static lucid_status lane_ensure(lucid_ctx *ctx, lucid_cuda_state *st, lucid_cuda_lane *L,
                                int lane, int *ready) {
    *ready = L->stream != NULL;
    if (*ready) return LUCID_OK;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) return LUCID_OK; /* never create in a capture */
    lucid_status s = lane_create(ctx, st, L, lane);
    if (s != LUCID_OK) {
        lane_free(st, L);
        L->off = 1;
        return s;
    }
    *ready = 1;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_lane_fork(lucid_ctx *ctx, int lane, const void *key,
                                             int *forked) {
    *forked = 0;
    if (lane < 0 || lane > LUCID_CUDA_BRANCHES)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "lane_fork: lane %d (expected 0..%d)", lane,
                            LUCID_CUDA_BRANCHES);
    CUDA_ENTER(ctx, st);
    if (lane == 0) lane = grad_lane_of(st, key);
    lucid_cuda_lane *L = &st->lanes[lane];
    if (L->off || L->open) return LUCID_OK;
    if (lane_env_off(lane)) {
        L->off = 1;
        return LUCID_OK;
    }
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    int ready = 0;
    LUCID_TRY(lane_ensure(ctx, st, L, lane, &ready));
    if (!ready) return LUCID_OK;
    CUDA_CHECK(ctx, cudaEventRecord(L->fork_ev, st->stream));
    CUDA_CHECK(ctx, cudaStreamWaitEvent(L->stream, L->fork_ev, 0));
    lane_swap(st, ns, L);
    st->lane_ns = ns;
    st->lane_stack[st->lane_depth++] = lane;
    L->open = 1;
    L->pending = 1;
    *forked = 1;
    return LUCID_OK;
}

extern "C" void lucid_cuda_lane_return(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st || st->lane_depth == 0) return;
    /* lane_swap rebinds the cuDNN handle to the stream: make the context's
     * device current first (another context may have made its own current
     * since the fork) */
    if (cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    lucid_cuda_lane *L = &st->lanes[st->lane_stack[--st->lane_depth]];
    lane_swap(st, (lucid_cuda_nn_state *)st->lane_ns, L);
    L->open = 0;
    if (st->lane_depth == 0) st->lane_ns = NULL;
}

/* The current stream waits for lane k's queued work. pending means "the
 * compute stream has not waited for it yet": a join made while a fork is
 * open (synchronize or an event record inside a branch) makes only the open
 * lane wait, so the lane stays pending until a join on the compute stream
 * (otherwise a later branch_join would skip it and the compute stream would
 * depend on it only through a lane it may not join, e.g. lane 0). */
static lucid_status join_one(lucid_ctx *ctx, lucid_cuda_state *st, int k) {
    lucid_cuda_lane *L = &st->lanes[k];
    if (!L->pending) return LUCID_OK;
    if (L->open)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "lane_join: lane %d is open (its fork has "
                            "not returned)", k);
    if (st->lane_depth == 0) {
        L->pending = 0;
        /* the cast lane's plain-cast mark is covered by the join (and must
         * not outlive a capture that recorded it) */
        if (k == LUCID_CUDA_LANE_CAST) L->marked[0] = 0;
    }
    CUDA_CHECK(ctx, cudaEventRecord(L->join_ev, L->stream));
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, L->join_ev, 0));
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_lane_join(lucid_ctx *ctx, int lane) {
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur) return LUCID_OK;
    if (lane > LUCID_CUDA_BRANCHES || lane < -2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "lane_join: lane %d (expected 0..%d, -1 for "
                            "all, -2 for the branch lanes)", lane, LUCID_CUDA_BRANCHES);
    int any = 0;
    for (int k = 0; k < LUCID_CUDA_LANES; k++) any |= cur->lanes[k].pending;
    if (!any) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    if (lane > 0) return join_one(ctx, st, lane);
    if (lane == 0) { /* every parameter-gradient stream */
        for (int k = 0; k < LUCID_CUDA_LANES; k++)
            if (lane_is_grad(k)) LUCID_TRY(join_one(ctx, st, k));
        return LUCID_OK;
    }
    /* -1: every lane, -2: the branch lanes 1..LUCID_CUDA_BRANCHES; both
     * skip an open lane (a join from inside a branch leaves that branch to
     * its own join) */
    for (int k = lane == -1 ? 0 : 1; k < (lane == -1 ? LUCID_CUDA_LANES : LUCID_CUDA_BRANCHES + 1);
         k++)
        if (!st->lanes[k].open) LUCID_TRY(join_one(ctx, st, k));
    return LUCID_OK;
}

/* The fork of a side lane (the cast lane, the cols lane): *side = its
 * stream, waiting for the current stream's work so far; the lane pending. */
static lucid_status side_lane_fork(lucid_ctx *ctx, int lane, cudaStream_t *side) {
    *side = NULL;
    CUDA_ENTER(ctx, st);
    lucid_cuda_lane *L = &st->lanes[lane];
    if (L->off) return LUCID_OK;
    int ready = 0;
    LUCID_TRY(lane_ensure(ctx, st, L, lane, &ready));
    if (!ready) return LUCID_OK;
    CUDA_CHECK(ctx, cudaEventRecord(L->fork_ev, st->stream));
    /* pending from here on: once the lane stream waits on the fork (part of
     * a capture, if any), only a join brings it back, even if the caller's
     * launch then fails */
    L->pending = 1;
    CUDA_CHECK(ctx, cudaStreamWaitEvent(L->stream, L->fork_ev, 0));
    *side = L->stream;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_cast_lane_fork(lucid_ctx *ctx, cudaStream_t *side) {
    return side_lane_fork(ctx, LUCID_CUDA_LANE_CAST, side);
}

extern "C" lucid_status lucid_cuda_cols_lane_fork(lucid_ctx *ctx, cudaStream_t *side) {
    return side_lane_fork(ctx, LUCID_CUDA_LANE_COLS, side);
}

extern "C" lucid_status lucid_cuda_cast_lane_join(lucid_ctx *ctx) {
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur || !cur->lanes[LUCID_CUDA_LANE_CAST].pending) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    return join_one(ctx, st, LUCID_CUDA_LANE_CAST);
}

/* The cast lane's mark after its plain casts (mark slot 0): the plain
 * casts are queued first on the lane, then the mark, then the gathering
 * items (nn_conv.cu, conv2d_cast_shadows), so a forward GEMM reading a
 * plain shadow waits for the plain casts alone (cast_lane_wait_plain)
 * while the flipped and transposed copies go on beside the forward. A
 * no-op unless the lane was forked and has work pending. */
extern "C" lucid_status lucid_cuda_cast_lane_mark_plain(lucid_ctx *ctx) {
    CUDA_ENTER(ctx, st);
    lucid_cuda_lane *L = &st->lanes[LUCID_CUDA_LANE_CAST];
    if (!L->stream || !L->pending) return LUCID_OK;
    CUDA_CHECK(ctx, cudaEventRecord(L->mark_ev[0], L->stream));
    L->marked[0] = 1;
    return LUCID_OK;
}

/* The current stream waits for the cast lane's plain-cast mark, if one is
 * recorded and not yet covered: cleared once the compute stream itself has
 * waited (a wait from inside a fork leaves it for the compute stream, as
 * join_one does with pending), and by any join of the lane. */
extern "C" lucid_status lucid_cuda_cast_lane_wait_plain(lucid_ctx *ctx) {
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur || !cur->lanes[LUCID_CUDA_LANE_CAST].marked[0]) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    lucid_cuda_lane *L = &st->lanes[LUCID_CUDA_LANE_CAST];
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, L->mark_ev[0], 0));
    if (st->lane_depth == 0) L->marked[0] = 0;
    return LUCID_OK;
}

/* Mark and wait: a join split in two. mark records the lane's current
 * position in slot m; it is recorded only inside an open fork of the lane
 * (the lane is then the innermost fork, its stream in st->stream), so a
 * mark is always part of the same capture as the work before it; outside
 * a fork it is a no-op. wait makes the current stream wait for a recorded
 * mark once (then the slot is free again); a slot never marked is a no-op.
 * Used to release a branch's results level by level while the branch goes
 * on (the pose head's backward: lua/lucid/nn/head.lua). */
static lucid_status mark_args(lucid_ctx *ctx, const char *fn, int lane, int slot) {
    if (lane < 0 || lane >= LUCID_CUDA_LANES || slot < 0 || slot >= LUCID_CUDA_MARKS)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: lane %d slot %d (expected 0..%d, 0..%d)", fn,
                            lane, slot, LUCID_CUDA_LANES - 1, LUCID_CUDA_MARKS - 1);
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_lane_mark(lucid_ctx *ctx, int lane, int slot) {
    LUCID_TRY(mark_args(ctx, "lane_mark", lane, slot));
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur || !cur->lanes[lane].open) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    if (st->lane_depth == 0 || st->lane_stack[st->lane_depth - 1] != lane)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "lane_mark: lane %d is open under another "
                            "fork (mark it where it is the innermost)", lane);
    lucid_cuda_lane *L = &st->lanes[lane];
    CUDA_CHECK(ctx, cudaEventRecord(L->mark_ev[slot], st->stream));
    L->marked[slot] = 1;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_lane_wait(lucid_ctx *ctx, int lane, int slot) {
    LUCID_TRY(mark_args(ctx, "lane_wait", lane, slot));
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur || !cur->lanes[lane].marked[slot]) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    lucid_cuda_lane *L = &st->lanes[lane];
    L->marked[slot] = 0;
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, L->mark_ev[slot], 0));
    return LUCID_OK;
}

/* Before a capture begins: every lane joined (so no wait inside the capture
 * can reach work queued before it) and every mark forgotten (a mark left
 * from an eager pass must not be waited on inside the capture). ERR_STATE
 * while a fork is open: the capture would start on the lane's stream. */
extern "C" lucid_status lucid_cuda_lane_before_capture(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) return LUCID_OK;
    if (st->lane_depth)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "capture_begin: lane %d is open (its fork "
                            "has not returned)", st->lane_stack[st->lane_depth - 1]);
    LUCID_TRY(lucid_cuda_lane_join(ctx, -1));
    for (int k = 0; k < LUCID_CUDA_LANES; k++)
        memset(st->lanes[k].marked, 0, sizeof st->lanes[k].marked);
    return LUCID_OK;
}

/* Close every open fork (innermost first): capture_end's failure paths,
 * so that the capture ends on the compute stream itself. */
extern "C" void lucid_cuda_lane_unwind(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    while (st && st->lane_depth) lucid_cuda_lane_return(ctx);
}
