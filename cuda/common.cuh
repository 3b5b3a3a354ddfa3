/*
 * common.cuh — shared internals of the CUDA backend (the .cu files of cuda/ only).
 *
 * Contract
 *   - Every CUDA / cuBLAS / cuDNN call is wrapped in a CHECK macro that, on
 *     failure, stores "<call> failed at <file>:<line>: <name>: <string>" in
 *     the context through lucid_seterr() and returns LUCID_ERR_DEVICE (or
 *     LUCID_ERR_OOM for an allocation failure) from the enclosing function.
 *     Nothing here aborts or exits.
 *   - Per-context state (lucid_cuda_state) lives in ctx->backend_state: the
 *     device ordinal, the compute stream every op is queued on, a side stream
 *     for copies that overlap compute, library handles and the allocator.
 *     Every entry point calls cuda_enter(ctx) first, which makes the
 *     context's device current, so two contexts on two GPUs work from one
 *     host thread.
 *   - Ops are asynchronous: they queue work on the compute stream and never
 *     synchronize the host (synchronize() is the only sync), except a copy
 *     into pageable host memory that needs host-side unpacking (see
 *     elementwise.cu).
 */
#ifndef LUCID_CUDA_COMMON_CUH
#define LUCID_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#if defined(LUCID_HAVE_CUDNN)
#include <cudnn.h>
#endif
#include <stdint.h>
#include <stddef.h>

#include "internal.h"
#include "launch.cuh"

/* ------------------------------------------------------------ error checks */

lucid_status lucid_cuda_err(lucid_ctx *ctx, cudaError_t e, const char *call,
                            const char *file, int line);
lucid_status lucid_cublas_err(lucid_ctx *ctx, cublasStatus_t e,
                              const char *call, const char *file, int line);
#if defined(LUCID_HAVE_CUDNN)
lucid_status lucid_cudnn_err(lucid_ctx *ctx, cudnnStatus_t e, const char *call,
                             const char *file, int line);
#endif

/* Run a CUDA runtime call; on failure set the context's error and return. */
#define CUDA_CHECK(ctx, call)                                                 \
    do {                                                                      \
        cudaError_t cuda_e_ = (call);                                         \
        if (cuda_e_ != cudaSuccess)                                           \
            return lucid_cuda_err((ctx), cuda_e_, #call, __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(ctx, call)                                               \
    do {                                                                      \
        cublasStatus_t cublas_e_ = (call);                                    \
        if (cublas_e_ != CUBLAS_STATUS_SUCCESS)                               \
            return lucid_cublas_err((ctx), cublas_e_, #call, __FILE__,        \
                                    __LINE__);                                \
    } while (0)

#if defined(LUCID_HAVE_CUDNN)
#define CUDNN_CHECK(ctx, call)                                                \
    do {                                                                      \
        cudnnStatus_t cudnn_e_ = (call);                                      \
        if (cudnn_e_ != CUDNN_STATUS_SUCCESS)                                 \
            return lucid_cudnn_err((ctx), cudnn_e_, #call, __FILE__,          \
                                   __LINE__);                                 \
    } while (0)
#endif

/* Check the launch of the kernel just queued (bad configuration, missing
 * image for this architecture). Asynchronous faults surface at the next
 * synchronizing call. */
#define CUDA_CHECK_LAUNCH(ctx, what)                                          \
    do {                                                                      \
        cudaError_t cuda_e_ = cudaGetLastError();                             \
        if (cuda_e_ != cudaSuccess)                                           \
            return lucid_cuda_err((ctx), cuda_e_, "launch of " what,          \
                                  __FILE__, __LINE__);                        \
    } while (0)

/* ------------------------------------------------------------ allocator */

typedef struct lucid_cuda_allocator lucid_cuda_allocator;

/* Create / destroy the caching allocator of one device (alloc.cu). */
lucid_status lucid_cuda_allocator_create(lucid_ctx *ctx, int device,
                                         cudaStream_t default_stream,
                                         lucid_cuda_allocator **out);
/* Frees every cached segment and pinned block; live blocks are freed too
 * (called at context shutdown after a device synchronize). */
void lucid_cuda_allocator_destroy(lucid_cuda_allocator *a);

/* Device memory, tagged with the stream it will be used on. A block freed
 * goes back to the cache of that stream and is reused by later work queued
 * on the same stream (stream order makes the reuse safe). */
lucid_status lucid_cuda_malloc(lucid_ctx *ctx, lucid_cuda_allocator *a,
                               size_t nbytes, cudaStream_t stream, void **ptr);
void lucid_cuda_free(lucid_cuda_allocator *a, void *ptr);
void lucid_cuda_stats(lucid_cuda_allocator *a, lucid_memory_stats *out);
lucid_status lucid_cuda_empty_cache(lucid_ctx *ctx, lucid_cuda_allocator *a);
void lucid_cuda_reset_peak(lucid_cuda_allocator *a);

/* Page-locked host memory, cached. A freed block records an event on
 * `stream` and is handed out again only after that event has completed, so
 * an asynchronous copy still reading it is never overwritten. */
lucid_status lucid_cuda_host_malloc(lucid_ctx *ctx, lucid_cuda_allocator *a,
                                    size_t nbytes, void **ptr);
void lucid_cuda_host_free(lucid_cuda_allocator *a, void *ptr,
                          cudaStream_t stream);

/* ------------------------------------------------------------ state */

/* Side streams of a context (lane.cu). */
#define LUCID_CUDA_BRANCHES 3
/* parameter-gradient lanes: lane 0 and lanes LUCID_CUDA_BRANCHES + 1 .. */
#define LUCID_CUDA_GRAD_LANES 3
/* the conv weight casts' side lane (lucid_cuda_cast_lane_fork), never
 * forked through lucid_cuda_lane_fork */
#define LUCID_CUDA_LANE_CAST (LUCID_CUDA_GRAD_LANES + LUCID_CUDA_BRANCHES)
/* the last lane: the filter gradients' column builds during the forward
 * (lucid_cuda_cols_lane_fork, nn_conv.cu), never forked through
 * lucid_cuda_lane_fork */
#define LUCID_CUDA_LANE_COLS (LUCID_CUDA_LANE_CAST + 1)
#define LUCID_CUDA_LANES (LUCID_CUDA_LANE_COLS + 1)
#define LUCID_CUDA_GRAD_KEYS 512 /* gradient buffers remembered per context */
#define LUCID_CUDA_MARKS 4
typedef struct lucid_cuda_lane {
    cudaStream_t stream;        /* NULL until the lane's first fork */
    cublasHandle_t cublas;      /* bound to stream, the compute handle's settings */
    void *cublas_ws;            /* its workspace (allocator, lane's stream) */
    cudaEvent_t fork_ev, join_ev;
    void *arena;                /* nn scratch of the lane (swapped with the */
    size_t arena_bytes;         /* nn state's arena, arena_bytes and      */
    unsigned int *counters;     /* counters while the lane is open)        */
    cudaEvent_t mark_ev[LUCID_CUDA_MARKS]; /* lucid_ctx_branch_mark slots */
    int marked[LUCID_CUDA_MARKS];          /* recorded and not yet waited on */
    int open;                   /* a fork of this lane is open */
    int pending;                /* work queued since the last join */
    int off;                    /* disabled (environment) or creation failed */
} lucid_cuda_lane;

typedef struct lucid_cuda_state {
    int device;                 /* CUDA ordinal */
    int sm_count;               /* multiprocessors (launch sizing only) */
    cudaStream_t stream;        /* compute stream: every op is queued here */
    cudaStream_t copy_stream;   /* side stream for overlapping copies */
    cublasHandle_t cublas;      /* bound to `stream` */
    void *cublas_ws;            /* cuBLAS workspace, from the allocator */
    size_t cublas_ws_bytes;
#if defined(LUCID_HAVE_CUDNN)
    cudnnHandle_t cudnn;        /* bound to `stream` */
#endif
    lucid_cuda_allocator *alloc;
    /* Lanes (lane.cu): side streams that ops are redirected to between a
     * fork and its return, by swapping a lane's stream, cuBLAS handle and nn
     * scratch into the fields above (a stack: forks nest, returns undo them
     * in reverse order). Lanes 0 and LUCID_CUDA_BRANCHES + 1 .. carry
     * parameter gradients, lanes 1..LUCID_CUDA_BRANCHES independent
     * branches of a network; lanes LUCID_CUDA_LANE_CAST and
     * LUCID_CUDA_LANE_COLS take one launch at a time on their own stream,
     * without a swap (the conv weight casts and the filter gradients'
     * column builds: nn_conv.cu). */
    lucid_cuda_lane lanes[LUCID_CUDA_LANES];
    int lane_stack[LUCID_CUDA_LANES]; /* open forks, innermost last */
    int lane_depth;
    void *lane_ns;              /* the nn state the open forks swapped */
    /* The parameter-gradient lane of each gradient buffer, fixed when the
     * buffer is first seen (lane.cu, grad_lane_of) */
    const void *grad_keys[LUCID_CUDA_GRAD_KEYS];
    unsigned char grad_key_lane[LUCID_CUDA_GRAD_KEYS];
    int grad_keys_n;
    /* Device epoch of the column caches (engine/nn/nn.h lucid_conv_wcols,
     * nn_conv_wcols.cu): graph.cu moves it at every capture begin, capture
     * end and graph launch, so an event recorded outside a capture is never
     * waited on inside it, nor one from before a capture or a replay
     * afterwards.  (Until session 15 it was the weight shadows' epoch too.) */
    uint64_t wcast_epoch;
    /* Freshness epoch of the conv weight shadows (engine/nn/nn.h
     * lucid_conv_wshadow; nn_conv.cu shadow_take / conv2d_cast_shadows
     * compare it): moved with wcast_epoch, except around a capture begun
     * with LUCID_CAPTURE_KEEP_SHADOWS (engine/train/graph.h): its begin
     * keeps it, and when the capture queued no shadow cast its end and its
     * graph's launches keep it too.  shadow_casts counts the shadow casts
     * queued since the last capture begin; capture_keep: the open capture
     * was begun with that flag. */
    uint64_t shadow_epoch;
    uint64_t shadow_casts;
    int capture_keep;
    /* LUCID_CAPTURE_CONTINUE (engine/train/graph.h): capture_epoch is the
     * wcast_epoch inside the last capture begun on this context; wcast_alias
     * (0: none), while a continuing capture is open, the previous capture's
     * epoch: column caches marked in it read as fresh there, and their
     * events (of that capture) are not waited on (nn_conv_wcols.cu). */
    uint64_t capture_epoch;
    uint64_t wcast_alias;
    /* The SM partition of the low-priority lanes (green.cu, LUCID_SIDE_SMS):
     * a CUgreenCtx (NULL: none) and its SM count (-1: none needed) */
    void *side_green;
    int side_sms;
} lucid_cuda_state;

/* green.cu: LUCID_SIDE_SMS (read once): the SM count asked for the
 * partition that the parameter-gradient, cast and cols lanes run in; 0
 * when unset or empty (no partition), -1 when not a whole number 0..2^20
 * (lucid_cuda_side_stream_create then fails with ERR_ARG naming it). */
extern "C" int lucid_cuda_side_sms_switch(void);
/* A stream with `priority` for a low-priority lane of st: in st's partition
 * (created on first use) when LUCID_SIDE_SMS asks for fewer SMs than the
 * device has, else a plain non-blocking stream. ERR_UNSUPPORTED (naming the
 * setting and the driver call) when the partition cannot be made; the CUDA
 * error of the stream's creation otherwise. */
extern "C" lucid_status lucid_cuda_side_stream_create(lucid_ctx *ctx, lucid_cuda_state *st,
                                                      int priority, cudaStream_t *stream);
/* Set the priority of a kernel node captured from a stream of st's
 * partition (a CUgraphNode: the runtime's attribute call refuses nodes of
 * another context): with the partition's context pushed current. */
extern "C" lucid_status lucid_cuda_side_node_priority(lucid_ctx *ctx, lucid_cuda_state *st,
                                                      void *node, int priority);
/* Streams created in a side partition so far, any context: a test hook
 * (spec/side_sms_spec.lua). */
extern "C" unsigned long lucid_cuda_side_stream_count(void);
/* Destroy st's partition (after every stream in it). */
extern "C" void lucid_cuda_side_green_destroy(lucid_cuda_state *st);

/* cuBLAS workspace: NVIDIA recommends 32 MiB on Hopper (4 MiB before). */
#define LUCID_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* backend.cu: a cuBLAS handle bound to stream with lucid's settings (f32
 * reductions for bf16/f16 products, no TF32, no atomics: bitwise run to
 * run) and a fixed workspace of LUCID_CUBLAS_WORKSPACE_BYTES from st's
 * allocator on that stream (cuBLAS then never allocates by itself, so a
 * captured graph replays with the same addresses). *handle and *ws are set
 * as soon as they exist, so the caller frees them on an error. Used for the
 * compute stream and for every lane (same settings and workspace size, so
 * cuBLAS picks the same algorithms: same bits). */
lucid_status lucid_cuda_cublas_create(lucid_ctx *ctx, lucid_cuda_state *st,
                                      cudaStream_t stream, cublasHandle_t *handle,
                                      void **ws);

/* lane.cu (the backend slots lane_fork / lane_return / lane_join,
 * engine/internal.h). lucid_cuda_lane_join(ctx, -1) joins every lane with
 * pending work (synchronize, capture_end, event_record and graph_launch
 * call it), -2 the branch lanes, 0 the parameter-gradient lanes; -1 and -2
 * skip open lanes. */
extern "C" lucid_status lucid_cuda_lane_fork(lucid_ctx *ctx, int lane, const void *key,
                                             int *forked);
extern "C" void lucid_cuda_lane_return(lucid_ctx *ctx);
extern "C" lucid_status lucid_cuda_lane_join(lucid_ctx *ctx, int lane);
extern "C" lucid_status lucid_cuda_lane_mark(lucid_ctx *ctx, int lane, int slot);
extern "C" lucid_status lucid_cuda_lane_wait(lucid_ctx *ctx, int lane, int slot);
/* The cast lane (LUCID_CUDA_LANE_CAST), for work that only a later reader
 * needs, off the current stream's path (nn_conv.cu: the conv weight
 * casts; mark_plain / wait_plain let the forward's readers wait for the
 * plain casts alone, lane.cu).  fork: *side = the lane's
 * low-priority stream, made to wait for everything queued on the current
 * stream so far (an event: a graph edge under capture), and the lane is
 * pending until joined; the caller queues its launch on *side itself (no
 * swap of the context's fields).  *side = NULL (LUCID_OK) when the lane
 * is not available: its stream does not exist yet and the current stream
 * is being captured (never created inside a capture), or its creation
 * failed before (then the error was returned once).  join: the current
 * stream waits for the lane's queued work when it is pending (nothing
 * otherwise; from inside a fork only that lane's stream waits, and the
 * lane stays pending until a join on the compute stream).  Every join of
 * all lanes (synchronize, capture begin / end, event_record,
 * graph_launch) joins it too.  Errors: the CUDA error (ERR_DEVICE). */
extern "C" lucid_status lucid_cuda_cast_lane_fork(lucid_ctx *ctx, cudaStream_t *side);
/* The cols lane (LUCID_CUDA_LANE_COLS): the same fork as the cast lane's,
 * for the im2col launches that a conv's forward queues for its filter
 * gradient (nn_conv.cu, the column cache of engine/nn/nn.h
 * lucid_conv_wcols).  Its readers wait for an event the caller records on
 * *side after its launch (no mark or join of the lane is needed for
 * them); the lane is pending until a join of every lane (synchronize,
 * capture begin / end, event_record, graph_launch). */
extern "C" lucid_status lucid_cuda_cols_lane_fork(lucid_ctx *ctx, cudaStream_t *side);
extern "C" lucid_status lucid_cuda_cast_lane_join(lucid_ctx *ctx);
extern "C" lucid_status lucid_cuda_cast_lane_mark_plain(lucid_ctx *ctx);
extern "C" lucid_status lucid_cuda_cast_lane_wait_plain(lucid_ctx *ctx);
/* graph.cu's guards: capture_begin (ERR_STATE with a fork open; joins every
 * lane and forgets the marks), capture_end (closes open forks first). */
extern "C" lucid_status lucid_cuda_lane_before_capture(lucid_ctx *ctx);
extern "C" void lucid_cuda_lane_unwind(lucid_ctx *ctx);
/* Frees the lanes' resources (shutdown, after the nn state: the streams are
 * idle). */
void lucid_cuda_lane_destroy(lucid_cuda_state *st);

/* The context's CUDA state after making its device current; NULL (with the
 * error set in ctx) when the device cannot be selected. */
lucid_cuda_state *lucid_cuda_enter(lucid_ctx *ctx);

#define CUDA_ENTER(ctx, st)                                                   \
    lucid_cuda_state *st = lucid_cuda_enter(ctx);                             \
    if (!st) return (ctx)->last_status

/* Scratch device memory on the compute stream (freed back to the cache;
 * stream order makes the immediate free safe for later work). */
static inline lucid_status lucid_cuda_scratch(lucid_ctx *ctx,
                                              lucid_cuda_state *st,
                                              size_t nbytes, void **ptr) {
    return lucid_cuda_malloc(ctx, st->alloc, nbytes, st->stream, ptr);
}
static inline void lucid_cuda_scratch_free(lucid_cuda_state *st, void *ptr) {
    if (ptr) lucid_cuda_free(st->alloc, ptr);
}

/* ------------------------------------------------------------ op entry points
 * (the lucid_backend table in backend.cu points at these) */

extern "C" {
lucid_status lucid_cuda_copy(lucid_ctx *ctx, lucid_tensor *dst,
                             const lucid_tensor *src);
lucid_status lucid_cuda_fill(lucid_ctx *ctx, lucid_tensor *dst, double value);
lucid_status lucid_cuda_binary(lucid_ctx *ctx, lucid_binary_op op,
                               lucid_tensor *out, const lucid_tensor *a,
                               const lucid_tensor *b);
lucid_status lucid_cuda_binary_scalar(lucid_ctx *ctx, lucid_binary_op op,
                                      lucid_tensor *out, const lucid_tensor *a,
                                      double scalar, int reverse);
lucid_status lucid_cuda_unary(lucid_ctx *ctx, lucid_unary_op op,
                              lucid_tensor *out, const lucid_tensor *a);
lucid_status lucid_cuda_axpy(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                             const lucid_tensor *x);
lucid_status lucid_cuda_reduce_all(lucid_ctx *ctx, lucid_reduce_op op,
                                   lucid_tensor *out, const lucid_tensor *a);
lucid_status lucid_cuda_reduce_dim(lucid_ctx *ctx, lucid_reduce_op op,
                                   lucid_tensor *out, const lucid_tensor *a,
                                   int dim);
lucid_status lucid_cuda_matmul(lucid_ctx *ctx, lucid_tensor *out,
                               const lucid_tensor *a, const lucid_tensor *b,
                               int trans_a, int trans_b, double alpha,
                               double beta);
lucid_status lucid_cuda_rand_uniform(lucid_ctx *ctx, lucid_tensor *dst,
                                     uint64_t seed, uint64_t offset, double lo,
                                     double hi);
lucid_status lucid_cuda_rand_normal(lucid_ctx *ctx, lucid_tensor *dst,
                                    uint64_t seed, uint64_t offset,
                                    double mean, double std);
}

/* ------------------------------------------------------------ dtype helpers */

/* Device dtypes the float ops compute on (f64 tensors are CPU-only). */
static inline int lucid_cuda_is_op_dtype(lucid_dtype dt) {
    return dt == LUCID_F32 || dt == LUCID_BF16 || dt == LUCID_F16;
}

static inline cudaDataType_t lucid_cuda_datatype(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F32: return CUDA_R_32F;
    case LUCID_F64: return CUDA_R_64F;
    case LUCID_BF16: return CUDA_R_16BF;
    case LUCID_F16: return CUDA_R_16F;
    case LUCID_U8: return CUDA_R_8U;
    case LUCID_I32: return CUDA_R_32I;
    default: return CUDA_R_64I;
    }
}

/* Load element `off` of a buffer of runtime dtype `dt` as float (one
 * rounding, as the CPU reference's cpu_load_f32). */
__device__ __forceinline__ float lucid_load_f32(const void *p, int dt,
                                                int64_t off) {
    switch (dt) {
    case LUCID_F32: return ((const float *)p)[off];
    case LUCID_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    case LUCID_F16: return __half2float(((const __half *)p)[off]);
    case LUCID_F64: return (float)((const double *)p)[off];
    case LUCID_U8: return (float)((const uint8_t *)p)[off];
    case LUCID_I32: return (float)((const int32_t *)p)[off];
    case LUCID_I64: return (float)((const int64_t *)p)[off];
    default: return 0.0f;
    }
}

/* f64 -> f32 rounding to odd: truncate, then set the last bit when the
 * conversion was inexact. A second rounding to bf16/f16 (>= 2 bits shorter)
 * is then the correctly rounded f64 -> bf16/f16 result, the same bits as the
 * CPU reference's cpu_f64_to_bf16 / cpu_f64_to_f16. */
__device__ __forceinline__ float lucid_f64_to_f32_odd(double x) {
    if (x != x) return (float)x;
    float f = __double2float_rz(x);
    if ((double)f != x) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f;
}

/* Load any dtype as double (integers exactly up to 2^53). */
__device__ __forceinline__ double lucid_load_f64(const void *p, int dt,
                                                 int64_t off) {
    switch (dt) {
    case LUCID_F32: return ((const float *)p)[off];
    case LUCID_F64: return ((const double *)p)[off];
    case LUCID_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    case LUCID_F16: return __half2float(((const __half *)p)[off]);
    case LUCID_U8: return ((const uint8_t *)p)[off];
    case LUCID_I32: return ((const int32_t *)p)[off];
    case LUCID_I64: return (double)((const int64_t *)p)[off];
    default: return 0.0;
    }
}

/* Store a double into any dtype with one rounding, as the CPU reference's
 * cpu_store_f64: f32 round to nearest even; bf16/f16 correctly rounded from
 * f64 (through round-to-odd); integers truncate toward zero and saturate,
 * NaN -> 0 (u8: everything <= 0 -> 0, >= 255 -> 255). PTX float-to-int
 * conversions saturate and map NaN to 0, so the i32/i64 casts do it. */
__device__ __forceinline__ void lucid_store_f64(void *p, int dt, int64_t off,
                                                double v) {
    switch (dt) {
    case LUCID_F32: ((float *)p)[off] = (float)v; break;
    case LUCID_F64: ((double *)p)[off] = v; break;
    case LUCID_BF16:
        ((__nv_bfloat16 *)p)[off] = __float2bfloat16_rn(lucid_f64_to_f32_odd(v));
        break;
    case LUCID_F16:
        ((__half *)p)[off] = __float2half_rn(lucid_f64_to_f32_odd(v));
        break;
    case LUCID_U8:
        ((uint8_t *)p)[off] =
            (v != v || v <= 0.0) ? 0 : v >= 255.0 ? 255 : (uint8_t)(int)v;
        break;
    case LUCID_I32: ((int32_t *)p)[off] = __double2int_rz(v); break;
    case LUCID_I64: ((int64_t *)p)[off] = __double2ll_rz(v); break;
    default: break;
    }
}

/* Store a float into a float dtype with one rounding (round to nearest
 * even): the same bits as lucid_f32_to_bf16 / lucid_f32_to_f16 on the CPU
 * for every non-NaN input. */
__device__ __forceinline__ void lucid_store_f32(void *p, int dt, int64_t off,
                                                float v) {
    switch (dt) {
    case LUCID_F32: ((float *)p)[off] = v; break;
    case LUCID_BF16: ((__nv_bfloat16 *)p)[off] = __float2bfloat16_rn(v); break;
    case LUCID_F16: ((__half *)p)[off] = __float2half_rn(v); break;
    case LUCID_F64: ((double *)p)[off] = (double)v; break;
    default: break;
    }
}

/* Typed element access for kernels templated on the storage type. */
template <typename T> struct lucid_elem;
template <> struct lucid_elem<float> {
    static __device__ __forceinline__ float load(const float *p, int64_t i) {
        return p[i];
    }
    static __device__ __forceinline__ void store(float *p, int64_t i, float v) {
        p[i] = v;
    }
};
template <> struct lucid_elem<__nv_bfloat16> {
    static __device__ __forceinline__ float load(const __nv_bfloat16 *p,
                                                 int64_t i) {
        return __bfloat162float(p[i]);
    }
    static __device__ __forceinline__ void store(__nv_bfloat16 *p, int64_t i,
                                                 float v) {
        p[i] = __float2bfloat16_rn(v);
    }
};
template <> struct lucid_elem<__half> {
    static __device__ __forceinline__ float load(const __half *p, int64_t i) {
        return __half2float(p[i]);
    }
    static __device__ __forceinline__ void store(__half *p, int64_t i,
                                                 float v) {
        p[i] = __float2half_rn(v);
    }
};

/* ------------------------------------------------------------ strided iteration
 * A tensor view as the kernels see it: base pointer of element [0,..,0],
 * dtype, and per-dim strides in elements. Shapes are shared by all operands
 * of one launch (the dispatch layer already broadcast them). */

#define LUCID_CUDA_MAX_OPERANDS 3

typedef struct lucid_iter {
    int ndim;                                         /* after collapsing */
    int64_t numel;
    int64_t shape[LUCID_MAX_DIMS];
    int64_t strides[LUCID_CUDA_MAX_OPERANDS][LUCID_MAX_DIMS];
} lucid_iter;

/* Build an iterator over `n` tensors of one shape: drops size-1 dims and
 * merges neighbouring dims that are contiguous in every operand. The
 * element order stays row-major over the original shape. */
void lucid_iter_init(lucid_iter *it, int n, const lucid_tensor *const *ts);

/* 1 when every operand of the iterator is contiguous (one dim, stride 1). */
static inline int lucid_iter_contiguous(const lucid_iter *it, int n) {
    if (it->ndim == 0) return 1;
    if (it->ndim != 1) return 0;
    for (int k = 0; k < n; k++)
        if (it->strides[k][0] != 1) return 0;
    return 1;
}

/* Element offsets (in elements) of logical index i for operand k. */
template <int N, typename IndexT>
__device__ __forceinline__ void lucid_iter_offsets(const lucid_iter &it,
                                                   IndexT i, int64_t *off) {
#pragma unroll
    for (int k = 0; k < N; k++) off[k] = 0;
    for (int d = it.ndim - 1; d >= 0; d--) {
        IndexT sz = (IndexT)it.shape[d];
        IndexT c = i % sz;
        i /= sz;
#pragma unroll
        for (int k = 0; k < N; k++) off[k] += (int64_t)c * it.strides[k][d];
    }
}

/* Launch geometry: 1-D grid of `threads` per block covering n elements with
 * a grid-stride loop (capped so huge tensors reuse blocks). */
static inline unsigned lucid_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > (int64_t)1 << 20) b = (int64_t)1 << 20;
    return (unsigned)b;
}

#endif /* LUCID_CUDA_COMMON_CUH */
