/*
 * lane.cu — the parameter-gradient lane of a context's device: a second
 * stream on which the weight and bias gradients of a backward run while the
 * compute stream goes on with the input gradients (lucid_ctx_set_grad_lane,
 * engine/lucid.h; used by the Conv2d module's backward, engine/nn/module.c).
 *
 * Why: a training step of a small network at batch 4 is latency-bound: its
 * kernels rarely fill the GPU, and on one stream they run one after the
 * other. The weight gradient of a layer is needed only by the optimizer, so
 * it need not sit on the backward's critical path (the chain of input
 * gradients). The same split is what cuDNN-based frameworks do when they
 * overlap weight-gradient work with the rest of the backward.
 *
 * How
 *   - fork: an event recorded on the compute stream, waited on by the lane
 *     stream; then the lane's stream, cuBLAS handle, cuDNN stream and nn
 *     scratch (arena and BatchNorm fold counters, nn_common.cuh) are swapped
 *     into the context's fields, so the ops that follow queue on the lane
 *     without knowing it. return swaps them back. The swap is host state of
 *     one thread's calls: fork and return bracket one op call in the module
 *     code, never a Lua callback.
 *   - join: an event recorded on the lane, waited on by the compute stream.
 *     Under stream capture the two edges become graph edges: the recorded
 *     graph holds the same fork/join structure (the lane must be joined
 *     before the capture ends; capture_end does it).
 *   - Lane work keeps the order of its calls: the gradients of a parameter
 *     written by several backwards accumulate in the same order as without
 *     the lane, with the same kernels, so results are bitwise equal.
 *   - Priorities: the compute stream is created with the device's greatest
 *     priority and the lane with its least (backend.cu), so when both have
 *     blocks waiting, the critical path's are scheduled first.
 *   - Resources (stream, events, a cuBLAS handle with the compute handle's
 *     settings and its own workspace) are created by the first fork outside
 *     a capture; a fork during a capture before that, or with
 *     LUCID_GRAD_LANE=0, leaves the work on the compute stream (*forked 0).
 *   - Memory: lane allocations (arena growth, workspace) come from the
 *     caching allocator tagged with the lane stream (alloc.cu), and are held
 *     until the context goes. No tensor is allocated on the lane.
 */
#include "common.cuh"
#include "nn_common.cuh"

#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace of the lane: as the compute handle's (backend.cu), so
 * that cuBLAS's heuristics pick the same algorithms (same bits). */
#define LANE_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

static int lane_env_off(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LUCID_GRAD_LANE");
        v = e && strcmp(e, "0") == 0;
    }
    return v;
}

static lucid_status lane_create(lucid_ctx *ctx, lucid_cuda_state *st) {
    int least = 0, greatest = 0;
    CUDA_CHECK(ctx, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(ctx, cudaStreamCreateWithPriority(&st->lane_stream, cudaStreamNonBlocking,
                                                 least));
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&st->lane_fork_ev, cudaEventDisableTiming));
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&st->lane_join_ev, cudaEventDisableTiming));
    CUBLAS_CHECK(ctx, cublasCreate(&st->lane_cublas));
    CUBLAS_CHECK(ctx, cublasSetStream(st->lane_cublas, st->lane_stream));
    /* the compute handle's settings (backend.cu, cuda_init_state) */
    CUBLAS_CHECK(ctx, cublasSetMathMode(
                          st->lane_cublas,
                          (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    CUBLAS_CHECK(ctx, cublasSetAtomicsMode(st->lane_cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
    LUCID_TRY(lucid_cuda_malloc(ctx, st->alloc, LANE_CUBLAS_WORKSPACE_BYTES, st->lane_stream,
                                &st->lane_cublas_ws));
    CUBLAS_CHECK(ctx, cublasSetWorkspace(st->lane_cublas, st->lane_cublas_ws,
                                         LANE_CUBLAS_WORKSPACE_BYTES));
    return LUCID_OK;
}

void lucid_cuda_lane_destroy(lucid_cuda_state *st) {
    if (st->lane_cublas) cublasDestroy(st->lane_cublas);
    if (st->lane_cublas_ws && st->alloc) lucid_cuda_free(st->alloc, st->lane_cublas_ws);
    if (st->lane_fork_ev) cudaEventDestroy(st->lane_fork_ev);
    if (st->lane_join_ev) cudaEventDestroy(st->lane_join_ev);
    if (st->lane_stream) cudaStreamDestroy(st->lane_stream);
    st->lane_cublas = NULL;
    st->lane_cublas_ws = NULL;
    st->lane_fork_ev = st->lane_join_ev = NULL;
    st->lane_stream = NULL;
    (void)cudaGetLastError();
}

/* Swap the lane's stream, handles and nn scratch with the context's. */
static void lane_swap(lucid_cuda_state *st, lucid_cuda_nn_state *ns) {
    cudaStream_t s = st->stream;
    st->stream = st->lane_stream;
    st->lane_stream = s;
    cublasHandle_t h = st->cublas;
    st->cublas = st->lane_cublas;
    st->lane_cublas = h;
    void *w = st->cublas_ws;
    st->cublas_ws = st->lane_cublas_ws;
    st->lane_cublas_ws = w;
#if defined(LUCID_HAVE_CUDNN)
    if (st->cudnn) (void)cudnnSetStream(st->cudnn, st->stream);
#endif
    void *a = ns->arena;
    ns->arena = ns->lane_arena;
    ns->lane_arena = a;
    size_t b = ns->arena_bytes;
    ns->arena_bytes = ns->lane_arena_bytes;
    ns->lane_arena_bytes = b;
    unsigned int *c = ns->counters;
    ns->counters = ns->lane_counters;
    ns->lane_counters = c;
}

extern "C" lucid_status lucid_cuda_lane_fork(lucid_ctx *ctx, int *forked) {
    *forked = 0;
    CUDA_ENTER(ctx, st);
    if (st->lane_off || st->lane_open) return LUCID_OK;
    if (lane_env_off()) {
        st->lane_off = 1;
        return LUCID_OK;
    }
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    if (!st->lane_stream) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
        if (cs != cudaStreamCaptureStatusNone) return LUCID_OK; /* never create in a capture */
        lucid_status s = lane_create(ctx, st);
        if (s != LUCID_OK) {
            lucid_cuda_lane_destroy(st);
            st->lane_off = 1;
            return s;
        }
    }
    CUDA_CHECK(ctx, cudaEventRecord(st->lane_fork_ev, st->stream));
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->lane_stream, st->lane_fork_ev, 0));
    lane_swap(st, ns);
    st->lane_ns = ns;
    st->lane_open = 1;
    st->lane_pending = 1;
    *forked = 1;
    return LUCID_OK;
}

extern "C" void lucid_cuda_lane_return(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st || !st->lane_open) return;
    lane_swap(st, (lucid_cuda_nn_state *)st->lane_ns);
    st->lane_ns = NULL;
    st->lane_open = 0;
}

extern "C" lucid_status lucid_cuda_lane_join(lucid_ctx *ctx) {
    lucid_cuda_state *cur = (lucid_cuda_state *)ctx->backend_state;
    if (!cur || !cur->lane_pending || cur->lane_open) return LUCID_OK;
    CUDA_ENTER(ctx, st);
    st->lane_pending = 0;
    CUDA_CHECK(ctx, cudaEventRecord(st->lane_join_ev, st->lane_stream));
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, st->lane_join_ev, 0));
    return LUCID_OK;
}
