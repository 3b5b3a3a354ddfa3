/*
 * backend.cu — the CUDA backend table and the per-context device state.
 *
 * init creates, for one context and one device ordinal: a non-blocking
 * compute stream (every op is queued on it), a non-blocking side stream for
 * copies that overlap compute, the caching allocator (alloc.cu), a cuBLAS
 * handle bound to the compute stream with a fixed workspace taken from the
 * allocator (cublasSetWorkspace: cuBLAS then never allocates by itself, so a
 * captured CUDA graph replays with the same addresses), and a cuDNN handle
 * bound to the compute stream when the build has cuDNN. shutdown frees all
 * of it. Every entry point first makes the context's device current
 * (lucid_cuda_enter), so contexts on different GPUs can be driven from one
 * thread in any order.
 *
 * lucid_cuda_backend_device_count() never fails: no driver, no device or a
 * broken installation all read as 0 devices.
 */
#include "common.cuh"
#include "nn_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---------------------------------------------------------------- errors */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

lucid_status lucid_cuda_err(lucid_ctx *ctx, cudaError_t e, const char *call,
                            const char *file, int line) {
    (void)cudaGetLastError(); /* clear a non-sticky error */
    lucid_status st = e == cudaErrorMemoryAllocation ? LUCID_ERR_OOM
                                                     : LUCID_ERR_DEVICE;
    return lucid_seterr(ctx, st, "%s failed at %s:%d: %s: %s", call,
                        base_name(file), line, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

lucid_status lucid_cublas_err(lucid_ctx *ctx, cublasStatus_t e,
                              const char *call, const char *file, int line) {
    (void)cudaGetLastError();
    lucid_status st = e == CUBLAS_STATUS_ALLOC_FAILED ? LUCID_ERR_OOM
                      : e == CUBLAS_STATUS_NOT_SUPPORTED
                          ? LUCID_ERR_UNSUPPORTED
                          : LUCID_ERR_DEVICE;
    return lucid_seterr(ctx, st, "%s failed at %s:%d: %s: %s", call,
                        base_name(file), line, cublasGetStatusName(e),
                        cublasGetStatusString(e));
}

#if defined(LUCID_HAVE_CUDNN)
lucid_status lucid_cudnn_err(lucid_ctx *ctx, cudnnStatus_t e, const char *call,
                             const char *file, int line) {
    (void)cudaGetLastError();
    lucid_status st = e == CUDNN_STATUS_ALLOC_FAILED ? LUCID_ERR_OOM
                      : e == CUDNN_STATUS_NOT_SUPPORTED ? LUCID_ERR_UNSUPPORTED
                                                        : LUCID_ERR_DEVICE;
    return lucid_seterr(ctx, st, "%s failed at %s:%d: %s", call,
                        base_name(file), line, cudnnGetErrorString(e));
}
#endif

/* ---------------------------------------------------------------- state */

lucid_cuda_state *lucid_cuda_enter(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) {
        lucid_seterr(ctx, LUCID_ERR_STATE,
                     "CUDA backend used on a context without CUDA state "
                     "(not initialised or already shut down)");
        return NULL;
    }
    cudaError_t e = cudaSetDevice(st->device);
    if (e != cudaSuccess) {
        lucid_cuda_err(ctx, e, "cudaSetDevice", __FILE__, __LINE__);
        return NULL;
    }
    return st;
}

extern "C" int lucid_cuda_backend_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n < 0 ? 0 : n;
}

static void cuda_shutdown(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) return;
    if (cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    if (st->stream) cudaStreamSynchronize(st->stream);
    if (st->copy_stream) cudaStreamSynchronize(st->copy_stream);
    for (int k = 0; k < LUCID_CUDA_LANES; k++)
        if (st->lanes[k].stream) cudaStreamSynchronize(st->lanes[k].stream);
    /* nn plans and scratch (cuda/nn_table.cu) use cuDNN and the allocator */
    lucid_cuda_nn_state_destroy(ctx);
#if defined(LUCID_HAVE_CUDNN)
    if (st->cudnn) cudnnDestroy(st->cudnn);
#endif
    if (st->cublas) cublasDestroy(st->cublas);
    lucid_cuda_lane_destroy(st);
    if (st->alloc) {
        if (st->cublas_ws) lucid_cuda_free(st->alloc, st->cublas_ws);
        lucid_cuda_allocator_destroy(st->alloc);
    }
    if (st->copy_stream) cudaStreamDestroy(st->copy_stream);
    if (st->stream) cudaStreamDestroy(st->stream);
    (void)cudaGetLastError();
    free(st);
    ctx->backend_state = NULL;
}

/* Programmatic dependent launch (launch.cuh): the mode is decided when the
 * first CUDA context is created, from that device's compute capability and
 * LUCID_PDL: 0 undecided, 1 eager launches only (default on sm_90+), 2 eager
 * and captured launches (LUCID_PDL=graph), 3 off (LUCID_PDL=0 or < sm_90). */
static volatile int pdl_state = 0;

int lucid_pdl_for_stream(cudaStream_t stream) {
    int m = pdl_state;
    if (m == 2) return 1;
    if (m != 1) return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cs == cudaStreamCaptureStatusNone;
}

static lucid_status pdl_decide(lucid_ctx *ctx, int device_index) {
    if (pdl_state != 0) return LUCID_OK;
    int major = 0;
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                           device_index));
    const char *env = getenv("LUCID_PDL");
    if (major < 9 || (env && strcmp(env, "0") == 0)) pdl_state = 3;
    else if (env && strcmp(env, "graph") == 0) pdl_state = 2;
    else pdl_state = 1;
    return LUCID_OK;
}

lucid_status lucid_cuda_cublas_create(lucid_ctx *ctx, lucid_cuda_state *st,
                                      cudaStream_t stream, cublasHandle_t *handle,
                                      void **ws) {
    CUBLAS_CHECK(ctx, cublasCreate(handle));
    CUBLAS_CHECK(ctx, cublasSetStream(*handle, stream));
    /* f32 products stay f32 (no TF32), and bf16/f16 products reduce in the
     * f32 compute type, never in the output type. */
    CUBLAS_CHECK(ctx, cublasSetMathMode(
                          *handle,
                          (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    /* no atomics-based reductions (cuBLAS's default, made explicit): results
     * stay bitwise identical run to run (matmul.cu, nn_conv_gemm.cu) */
    CUBLAS_CHECK(ctx, cublasSetAtomicsMode(*handle, CUBLAS_ATOMICS_NOT_ALLOWED));
    LUCID_TRY(lucid_cuda_malloc(ctx, st->alloc, LUCID_CUBLAS_WORKSPACE_BYTES, stream, ws));
    CUBLAS_CHECK(ctx, cublasSetWorkspace(*handle, *ws, LUCID_CUBLAS_WORKSPACE_BYTES));
    return LUCID_OK;
}

static lucid_status cuda_init_state(lucid_ctx *ctx, lucid_cuda_state *st,
                                    int device_index) {
    st->device = device_index;
    CUDA_CHECK(ctx, cudaSetDevice(device_index));
    LUCID_TRY(pdl_decide(ctx, device_index));
    CUDA_CHECK(ctx, cudaDeviceGetAttribute(&st->sm_count,
                                           cudaDevAttrMultiProcessorCount,
                                           device_index));
    /* the compute stream gets the device's greatest priority, so its blocks
     * go first when the parameter-gradient lane (least priority, lane.cu)
     * has blocks waiting too */
    int least_prio = 0, greatest_prio = 0;
    CUDA_CHECK(ctx, cudaDeviceGetStreamPriorityRange(&least_prio, &greatest_prio));
    (void)least_prio;
    CUDA_CHECK(ctx, cudaStreamCreateWithPriority(&st->stream, cudaStreamNonBlocking,
                                                 greatest_prio));
    CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&st->copy_stream,
                                              cudaStreamNonBlocking));
    LUCID_TRY(lucid_cuda_allocator_create(ctx, device_index, st->stream,
                                          &st->alloc));
    st->cublas_ws_bytes = LUCID_CUBLAS_WORKSPACE_BYTES;
    LUCID_TRY(lucid_cuda_cublas_create(ctx, st, st->stream, &st->cublas, &st->cublas_ws));
#if defined(LUCID_HAVE_CUDNN)
    CUDNN_CHECK(ctx, cudnnCreate(&st->cudnn));
    CUDNN_CHECK(ctx, cudnnSetStream(st->cudnn, st->stream));
#endif
    return LUCID_OK;
}

static lucid_status cuda_init(lucid_ctx *ctx, int device_index) {
    lucid_cuda_state *st =
        (lucid_cuda_state *)calloc(1, sizeof(lucid_cuda_state));
    if (!st)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of host memory creating the CUDA state");
    ctx->backend_state = st;
    lucid_status s = cuda_init_state(ctx, st, device_index);
    if (s != LUCID_OK) {
        /* keep the message: shutdown does not touch ctx->errmsg */
        cuda_shutdown(ctx);
        return s;
    }
    return LUCID_OK;
}

static lucid_status cuda_synchronize(lucid_ctx *ctx) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(lucid_cuda_lane_join(ctx, -1));
    CUDA_CHECK(ctx, cudaStreamSynchronize(st->stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(st->copy_stream));
    return LUCID_OK;
}

/* ---------------------------------------------------------------- memory */

static lucid_status cuda_alloc(lucid_ctx *ctx, size_t nbytes, void **ptr) {
    CUDA_ENTER(ctx, st);
    return lucid_cuda_malloc(ctx, st->alloc, nbytes, st->stream, ptr);
}

static void cuda_free(lucid_ctx *ctx, void *ptr, size_t nbytes) {
    (void)nbytes;
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (st) lucid_cuda_free(st->alloc, ptr);
}

static lucid_status cuda_host_alloc_pinned(lucid_ctx *ctx, size_t nbytes,
                                           void **ptr) {
    CUDA_ENTER(ctx, st);
    return lucid_cuda_host_malloc(ctx, st->alloc, nbytes, ptr);
}

static void cuda_host_free_pinned(lucid_ctx *ctx, void *ptr) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) return;
    if (cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    lucid_cuda_host_free(st->alloc, ptr, st->stream);
}

static lucid_status cuda_memory_stats(lucid_ctx *ctx, lucid_memory_stats *out) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "CUDA state is gone");
    lucid_cuda_stats(st->alloc, out);
    return LUCID_OK;
}

static lucid_status cuda_empty_cache(lucid_ctx *ctx) {
    CUDA_ENTER(ctx, st);
    return lucid_cuda_empty_cache(ctx, st->alloc);
}

static lucid_status cuda_reset_peak(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "CUDA state is gone");
    lucid_cuda_reset_peak(st->alloc);
    return LUCID_OK;
}

/* ---------------------------------------------------------------- table */

/* graph.cu */
extern "C" {
lucid_status lucid_cuda_graph_capture_begin(lucid_ctx *ctx, unsigned flags);
lucid_status lucid_cuda_graph_capture_end(lucid_ctx *ctx, void **graph_exec, int *keeps);
lucid_status lucid_cuda_graph_launch(lucid_ctx *ctx, void *graph_exec, int keeps);
lucid_status lucid_cuda_shadows_stale(lucid_ctx *ctx);
void lucid_cuda_graph_destroy(lucid_ctx *ctx, void *graph_exec);
int lucid_cuda_graph_capturing(lucid_ctx *ctx);
lucid_status lucid_cuda_event_record(lucid_ctx *ctx, void **event);
lucid_status lucid_cuda_event_synchronize(lucid_ctx *ctx, void *event);
void lucid_cuda_event_destroy(lucid_ctx *ctx, void *event);
lucid_status lucid_cuda_event_wait(lucid_ctx *ctx, void *event);
lucid_status lucid_cuda_event_record_node(lucid_ctx *ctx, void **event);
lucid_status lucid_cuda_side_copy(lucid_ctx *ctx, int n, void *const *dst, const void *const *src,
                                  const size_t *bytes, void *after, void **done);
}

static const lucid_backend cuda_backend = {
    "cuda",
    cuda_init,
    cuda_shutdown,
    cuda_synchronize,
    cuda_alloc,
    cuda_free,
    cuda_host_alloc_pinned,
    cuda_host_free_pinned,
    cuda_memory_stats,
    cuda_empty_cache,
    cuda_reset_peak,
    lucid_cuda_copy,
    lucid_cuda_fill,
    lucid_cuda_binary,
    lucid_cuda_binary_scalar,
    lucid_cuda_unary,
    lucid_cuda_axpy,
    lucid_cuda_reduce_all,
    lucid_cuda_reduce_dim,
    lucid_cuda_matmul,
    lucid_cuda_rand_uniform,
    lucid_cuda_rand_normal,
    /* CUDA graphs and events (graph.cu) */
    lucid_cuda_graph_capture_begin,
    lucid_cuda_graph_capture_end,
    lucid_cuda_graph_launch,
    lucid_cuda_graph_destroy,
    lucid_cuda_graph_capturing,
    lucid_cuda_event_record,
    lucid_cuda_event_synchronize,
    lucid_cuda_event_destroy,
    /* parameter-gradient lane (lane.cu) */
    lucid_cuda_lane_fork,
    lucid_cuda_lane_return,
    lucid_cuda_lane_join,
    lucid_cuda_lane_mark,
    lucid_cuda_lane_wait,
    /* the side copy stream (graph.cu) */
    lucid_cuda_event_wait,
    lucid_cuda_side_copy,
    lucid_cuda_event_record_node,
    lucid_cuda_shadows_stale,
};

extern "C" const lucid_backend *lucid_cuda_backend(void) {
    return &cuda_backend;
}
