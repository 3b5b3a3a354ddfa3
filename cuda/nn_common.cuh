/*
 * nn_common.cuh — shared internals of the CUDA nn kernels (cuda/nn_*.cu).
 *
 * Contract
 *   - The slots of lucid_nn_kernels (engine/nn/nn.h) are implemented in
 *     nn_conv.cu (Conv2d), nn_norm_{fwd,bwd}.cu (BatchNorm2d, the fused BatchNorm2d +
 *     SiLU, and the per-channel sum used by the conv bias gradient),
 *     nn_pointwise.cu (SiLU, Add, channel_copy, channel_copy_multi,
 *     nearest Upsample, MaxPool2d) and nn_softmax.cu (softmax, DFL); the
 *     table and the per-context nn state live in nn_table.cu.
 *   - Activations are f32, bf16 or f16 (f64 is CPU-only: ERR_UNSUPPORTED);
 *     parameters, parameter gradients and BN statistics are f32.  Arithmetic
 *     is f32 (statistics finalised in f64), rounded once on store.
 *   - Beta semantics of nn.h: out = beta*out + new; beta == 0 never reads out.
 *   - Every launch goes to the context's compute stream and is checked.
 *   - Deterministic: no float atomics anywhere (integer arrival counters
 *     only decide WHICH block folds, never the order); every reduction has a
 *     fixed partition (a function of the shapes only) and a fixed combining
 *     order, so results are bitwise identical run to run on one GPU.
 *   - Capturable: after the first (warm-up) call of each shape and pass
 *     nothing here allocates, synchronizes the host or searches algorithms.
 *     Scratch comes from the per-context nn arena (below), which grows only
 *     on a shape's or a conv pass's first call; growing it while the stream
 *     is being captured is refused with ERR_STATE and a message naming the
 *     op ("run one eager step first").
 *
 * Per-context nn state (lucid_cuda_nn_state)
 *   - arena: one device block from the context's caching allocator, shared
 *     by every nn op of the context (they all run in order on the compute
 *     stream, so sharing is safe).  It only grows; a replaced arena is kept
 *     alive (retired list) until the context shuts down, because a recorded
 *     CUDA graph may still point at it.
 *   - counters: the arrival counters of the BatchNorm "last block folds"
 *     reductions (nn_norm_{fwd,bwd}.cu), one unsigned int per channel for up to
 *     LUCID_CUDA_NN_COUNTERS channels, zero between launches: every launch
 *     that uses them counts each channel up to its number of parts and the
 *     last-arriving block sets it back to 0 before the launch completes.
 *     Unlike the arena they must keep their value from one launch to the
 *     next, so they are a separate block, allocated and zeroed (memset on
 *     the compute stream) on the first request made outside stream capture
 *     and never replaced, so a recorded graph always points at the live
 *     buffer and each replay leaves it zero.  All nn kernels of a context run
 *     in order on its one compute stream (graphs are launched on it too), so
 *     one buffer per state suffices: no two launches use it at once.
 *   - conv plans: one per (shape, dtype, conv params) key; each holds the
 *     cuDNN descriptors and the algorithms chosen ONCE per pass, lazily:
 *     forward on the key's first forward, backward-data on its first
 *     backward-data, backward-filter on its first backward-filter (so
 *     inference-only shapes never plan backward passes); cudnnGet*Algorithm_v7
 *     heuristics, deterministic algorithms only, no cudnnFind: a timing-based
 *     choice could differ between runs and break bitwise reproducibility.
 *   - Profile: with LUCID_PROFILE=1 in the environment (read once, when the
 *     state is made) the state counts and times (host clock) the conv plan
 *     creation per pass, the first cuDNN call of each plan and pass (lazy
 *     kernel loading shows up there) and the arena growths, and prints one
 *     line to stderr when the state is destroyed:
 *       lucid profile: cudnn plans fwd N (S s) bwd_data N (S s) bwd_filter
 *       N (S s); cudnn first runs fwd N (S s) ...; scratch grows N (S s,
 *       arena B MiB); conv keys K
 *     Unset, the cost is one branch per conv call.
 *   - The state is found through a small registry keyed by the context
 *     (nn_table.cu) and freed by lucid_cuda_nn_state_destroy(ctx), which the
 *     backend's shutdown must call after its final stream synchronize and
 *     before it destroys the cuDNN handle and the allocator.
 */
#ifndef LUCID_CUDA_NN_COMMON_CUH
#define LUCID_CUDA_NN_COMMON_CUH

#include "common.cuh"
#ifndef LUCID_NN_CUDA_IMPL
#define LUCID_NN_CUDA_IMPL 1 /* nn.h: lucid_nn_cuda_kernels is defined here */
#endif
#include "nn/nn.h"

#include <time.h>
#include <vector>

/* ---------------------------------------------------------------- state */

struct lucid_cuda_conv_plan; /* nn_conv.cu */

/* LUCID_PROFILE counters of one nn state (passes: fwd, bwd_data,
 * bwd_filter); host seconds. */
typedef struct lucid_cuda_nn_profile {
    double plan_s[3];               /* conv plan creation per pass */
    long plan_n[3];
    double first_s[3];              /* first cuDNN call of a plan's pass */
    long first_n[3];
    double grow_s;                  /* arena growths (allocator calls) */
    long grow_n;
} lucid_cuda_nn_profile;

typedef struct lucid_cuda_nn_state {
    lucid_ctx *ctx;                 /* owner (not retained) */
    lucid_cuda_state *cst;          /* fingerprint: backend state ... */
    void *alloc_fp;                 /* ... and its allocator */
    void *arena;                    /* shared scratch (bytes: arena_bytes) */
    size_t arena_bytes;
    std::vector<void *> retired;    /* older arenas, freed at destroy */
    unsigned int *counters;         /* BN fold counters [LUCID_CUDA_NN_COUNTERS] */
    /* (while a lane fork is open, lane.cu has swapped the lane's own
     * arena and counters into the three fields above, so work on two
     * streams never shares scratch; arenas a lane outgrows go to retired) */
    std::vector<lucid_cuda_conv_plan *> plans; /* conv plan cache */
    int conv_mode;                  /* lucid_cuda_nn_set_conv_mode */
    int conv1x1;                    /* 1x1 route: 0 LUCID_CONV1X1, 1 igemm, 2 gemm
                                       (lucid_cuda_nn_set_conv1x1, nn_conv_gemm.cuh) */
    int wcast;                      /* conv weight shadows: 0 LUCID_WCAST_ONCE, 1 off,
                                       2 on (lucid_cuda_nn_set_wcast, nn_conv.cu) */
    int wcast_side;                 /* their flipped / transposed copies on the cast
                                       lane: 0 LUCID_WCAST_SIDE, 1 off, 2 on
                                       (lucid_cuda_nn_set_wcast_side, nn_conv.cu) */
    int conv_small;                 /* small-channel 3x3 route: 0 LUCID_CONV_SMALL, 1 off,
                                       2 on (lucid_cuda_nn_set_conv_small, nn_conv_small.cuh) */
    int conv_col;                   /* im2col route: 0 LUCID_CONV_COL, else 1 + the
                                       mask of passes (lucid_cuda_nn_set_conv_col,
                                       nn_conv_col.cuh) */
    int wcols;                      /* conv column caches: 0 LUCID_WCOLS, else 1 + the
                                       mode (lucid_cuda_nn_set_wcols, nn_conv_wcols.cuh) */
    size_t wcols_cap;               /* their ceiling in bytes: 0 LUCID_WCOLS_MAX_MB
                                       (lucid_cuda_nn_set_wcols_cap) */
    int bn_cluster;                 /* BatchNorm multi-part channels on clusters:
                                       0 LUCID_BN_CLUSTER, 1 off, 2 on
                                       (lucid_cuda_nn_set_bn_cluster, nn_norm.cuh) */
    int profile;                    /* LUCID_PROFILE=1 at creation */
    lucid_cuda_nn_profile prof;     /* counters (profile only) */
} lucid_cuda_nn_state;

/* Host monotonic clock in seconds (profile timings). */
static inline double lucid_cuda_nn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The nn state of ctx (created on first use); NULL with the error set. */
lucid_cuda_nn_state *lucid_cuda_nn_get(lucid_ctx *ctx, lucid_cuda_state *st);

/* A scratch region of at least nbytes from the arena (256-byte aligned
 * base).  Grows the arena on a miss (never during stream capture: then
 * ERR_STATE naming `what`).  The pointer is valid until the next nn call. */
lucid_status lucid_cuda_nn_arena(lucid_ctx *ctx, lucid_cuda_state *st,
                                 lucid_cuda_nn_state *ns, size_t nbytes,
                                 const char *what, void **ptr);

/* Channels the BN fold counters cover (512 KiB of counters: more than
 * grid.y's 65535, so the channel stride of the BN kernels is exercised). */
static const int64_t LUCID_CUDA_NN_COUNTERS = (int64_t)1 << 17;

/* The state's zeroed arrival counters (see above) when n channels fit in
 * them: *ptr = the buffer, allocated on the first call outside stream
 * capture.  *ptr = NULL (LUCID_OK) when n > LUCID_CUDA_NN_COUNTERS or the
 * buffer does not exist yet and the stream is being captured: the caller
 * then takes its fallback route (which must give the same bits). */
lucid_status lucid_cuda_nn_counters(lucid_ctx *ctx, lucid_cuda_state *st,
                                    lucid_cuda_nn_state *ns, int64_t n,
                                    unsigned int **ptr);

/* Free one conv plan (nn_conv.cu; called by the state destructor). */
void lucid_cuda_conv_plan_free(lucid_cuda_conv_plan *p);

extern "C" {
/* Release the nn state of ctx (plans, descriptors, arenas).  Safe to call
 * when there is none.  The backend's shutdown calls it (see above); tests
 * may call it before releasing their context. */
void lucid_cuda_nn_state_destroy(lucid_ctx *ctx);

/* Convolution route of ctx, for tests and benchmarks: 0 auto (cuDNN, but
 * the direct kernels for depthwise convs and for any pass without a
 * deterministic cuDNN algorithm), 1 direct kernels for every conv, 2 cuDNN
 * for every conv that has a deterministic algorithm (depthwise included).
 * Returns the previous mode (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_conv_mode(lucid_ctx *ctx, int mode);
/* 1x1 route of ctx, for tests and benchmarks, overriding the process switch
 * LUCID_CONV1X1 (nn_conv_gemm.cuh): 0 follow LUCID_CONV1X1 (the default),
 * 1 implicit GEMM, 2 cuBLAS GEMM (other values read as 0).  Affects only
 * eligible convs (bf16/f16, 1x1, groups 1, stride 1, no padding, dilation
 * 1) in conv mode 0.  Returns the previous setting (-1 when ctx has no CUDA
 * state). */
int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route);
/* Conv weight shadows of ctx (engine/nn/nn.h lucid_conv_wshadow), for
 * tests and benchmarks, overriding the process switch LUCID_WCAST_ONCE:
 * 0 follow LUCID_WCAST_ONCE (the default), 1 off (shadows ignored, every
 * 1x1 GEMM forward / backward-data casts its weight into scratch, group
 * casts queue nothing), 2 on (other values read as 0).  Returns the
 * previous setting (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_wcast(lucid_ctx *ctx, int mode);
/* Where the group cast of ctx's weight shadows queues the flipped and
 * transposed copies (the backward-data's; nn_conv.cu), for tests and
 * benchmarks, overriding the process switch LUCID_WCAST_SIDE: 0 follow
 * LUCID_WCAST_SIDE (the default), 1 one launch with the plain casts on the
 * current stream, 2 a second launch on the cast lane (lane.cu; other
 * values read as 0).  Same bits either way.  Returns the previous setting
 * (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_wcast_side(lucid_ctx *ctx, int mode);
/* Small-channel 3x3 route of ctx (nn_conv_small.cuh), for tests and
 * benchmarks, overriding the process switch LUCID_CONV_SMALL: 0 follow
 * LUCID_CONV_SMALL (the default), 1 off (the implicit GEMM), 2 on (other
 * values read as 0).  Affects only eligible convs
 * (lucid_conv_small_eligible) in conv mode 0, forward and backward-data.
 * Returns the previous setting (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route);
/* im2col route of ctx (nn_conv_col.cuh), for tests and benchmarks,
 * overriding the process switch LUCID_CONV_COL: 0 follow LUCID_CONV_COL
 * (the default), else 1 + the mask of the passes it takes
 * (LUCID_CONV_COL_F 1 forward, _D 2 backward-data, _W 4 backward-filter:
 * 1 off, i.e. the implicit GEMM, 8 every pass; other values read as 0).
 * Affects only eligible convs (lucid_conv_col_eligible, groups 1, not
 * taken by the small-channel or 1x1 routes) in conv mode 0.  Returns the
 * previous setting (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route);
/* Conv column caches of ctx (engine/nn/nn.h lucid_conv_wcols,
 * nn_conv_wcols.cuh), for tests and benchmarks, overriding the process
 * switch LUCID_WCOLS: 0 follow LUCID_WCOLS (the default), else 1 + the
 * mode (1 off, 2 cache + side builds for stable inputs, 3 cache + side
 * builds for every conv whose forward builds no columns, 4 cache without
 * side builds; other values read as 0).  Returns the previous setting (-1
 * when ctx has no CUDA state). */
int lucid_cuda_nn_set_wcols(lucid_ctx *ctx, int mode);
/* The ceiling of the process's column-cache bytes as ctx's calls see it,
 * overriding LUCID_WCOLS_MAX_MB: bytes > 0, or 0 to follow the variable.
 * Returns the previous setting (-1 when ctx has no CUDA state, or bytes <
 * 0: then nothing changes). */
long long lucid_cuda_nn_set_wcols_cap(lucid_ctx *ctx, long long bytes);
/* BatchNorm route of ctx for channels of several parts (nn_norm.cuh), for
 * tests and benchmarks, overriding the process switch LUCID_BN_CLUSTER:
 * 0 follow LUCID_BN_CLUSTER (the default; unset: off), 1 off (the
 * cooperative kernels or two launches per training direction, as before
 * the cluster route), 2 on where the device takes cluster launches
 * (sm_90+; other values read as 0).  Same bits either way.  Returns the
 * previous setting (-1 when ctx has no CUDA state). */
int lucid_cuda_nn_set_bn_cluster(lucid_ctx *ctx, int mode);
/* The compute stream of ctx (a cudaStream_t as void *), for benchmarks. */
void *lucid_cuda_nn_stream(lucid_ctx *ctx);
/* LUCID_PROFILE counters of ctx so far, for benchmarks (bench/
 * bench_warmup.lua reads them through the LuaJIT FFI): out[0..2] plans per
 * pass (fwd, bwd_data, bwd_filter), out[3..5] their seconds, out[6..8]
 * first cuDNN calls per pass, out[9..11] their seconds, out[12] arena
 * growths, out[13] their seconds, out[14] arena bytes, out[15] conv plan
 * keys.  Returns 1, or 0 (out untouched) when ctx has no nn state or
 * profiling is off.  Never creates state; safe on any context. */
int lucid_cuda_nn_profile_read(lucid_ctx *ctx, double out[16]);
/* BatchNorm kernels (forward and backward, plain and fused with SiLU;
 * nn_norm_{fwd,bwd}.cu) queued by the calling thread so far, any context, eager or
 * while capturing: a test hook for the launch routes (LUCID_BN_ONEPASS,
 * LUCID_BN_COOP, LUCID_BN_CLUSTER). */
unsigned long lucid_cuda_bn_launch_count(void);
/* The BatchNorm backwards that read dy as a sum of terms
 * (lucid_cuda_batchnorm2d_backward_terms, bn_grad_dx1_terms) queued by the
 * calling thread so far, any context, eager or while capturing (each is
 * also counted by lucid_cuda_bn_launch_count): a test hook for
 * LUCID_BN_DY_TERMS. */
unsigned long lucid_cuda_bn_terms_count(void);
/* Stream operations (kernels, cudaMemcpy2DAsync, cudaMemset2DAsync) queued
 * by the calling thread's channel_copy and channel_copy_multi calls so far
 * (nn_pointwise.cu), any context, eager or while capturing: a test hook for
 * LUCID_CHAN_COPY_MULTI (one launch per call vs one per piece). */
unsigned long lucid_cuda_chan_copy_op_count(void);
}

/* 256-byte alignment of arena sub-regions. */
static inline size_t nn_align(size_t n) { return (n + 255) & ~(size_t)255; }

/* ---------------------------------------------------------------- slots */

extern "C" {
/* nn_conv.cu */
lucid_status lucid_cuda_conv2d_forward(lucid_ctx *, const lucid_tensor *,
                                       lucid_tensor *, const lucid_tensor *,
                                       const lucid_tensor *,
                                       const lucid_conv2d_params *);
lucid_status lucid_cuda_conv2d_backward_input(lucid_ctx *,
                                              const lucid_tensor *,
                                              const lucid_tensor *,
                                              lucid_tensor *,
                                              const lucid_tensor *,
                                              const lucid_conv2d_params *,
                                              double);
lucid_status lucid_cuda_conv2d_backward_params(lucid_ctx *,
                                               const lucid_tensor *,
                                               const lucid_tensor *,
                                               lucid_tensor *, lucid_tensor *,
                                               const lucid_conv2d_params *,
                                               double);
lucid_status lucid_cuda_conv2d_forward_shadow(lucid_ctx *, const lucid_tensor *,
                                              lucid_tensor *, const lucid_tensor *,
                                              const lucid_tensor *,
                                              const lucid_conv2d_params *,
                                              lucid_conv_wshadow *);
lucid_status lucid_cuda_conv2d_backward_input_shadow(lucid_ctx *, const lucid_tensor *,
                                                     const lucid_tensor *, lucid_tensor *,
                                                     const lucid_tensor *,
                                                     const lucid_conv2d_params *, double,
                                                     lucid_conv_wshadow *);
lucid_status lucid_cuda_conv2d_cast_shadows(lucid_ctx *, const lucid_tensor *const *,
                                            lucid_conv_wshadow *const *, int, lucid_dtype);
lucid_status lucid_cuda_conv2d_dcols_reserve(lucid_ctx *, const lucid_tensor *,
                                             const lucid_tensor *, const lucid_conv2d_params *,
                                             lucid_conv_dcols *);
lucid_status lucid_cuda_conv2d_backward_input_dcols(lucid_ctx *, const lucid_tensor *,
                                                    const lucid_tensor *, lucid_tensor *,
                                                    const lucid_tensor *,
                                                    const lucid_conv2d_params *, double,
                                                    lucid_conv_wshadow *, lucid_conv_dcols *);
lucid_status lucid_cuda_conv2d_forward_cols(lucid_ctx *, const lucid_tensor *, lucid_tensor *,
                                            const lucid_tensor *, const lucid_tensor *,
                                            const lucid_conv2d_params *, lucid_conv_wshadow *,
                                            lucid_conv_wcols *, int);
lucid_status lucid_cuda_conv2d_backward_params_cols(lucid_ctx *, const lucid_tensor *,
                                                    const lucid_tensor *, lucid_tensor *,
                                                    lucid_tensor *, const lucid_conv2d_params *,
                                                    double, lucid_conv_wcols *);
/* nn_norm_{fwd,bwd}.cu */
lucid_status lucid_cuda_batchnorm2d_silu_forward(
    lucid_ctx *, const lucid_tensor *, lucid_tensor *, const lucid_tensor *,
    const lucid_tensor *, lucid_tensor *, lucid_tensor *, lucid_tensor *,
    lucid_tensor *, lucid_tensor *, int, double, double);
lucid_status lucid_cuda_batchnorm2d_silu_backward(
    lucid_ctx *, const lucid_tensor *, const lucid_tensor *, lucid_tensor *,
    const lucid_tensor *, const lucid_tensor *, const lucid_tensor *,
    const lucid_tensor *, lucid_tensor *, lucid_tensor *, int, double, double);
lucid_status lucid_cuda_batchnorm2d_forward(
    lucid_ctx *, const lucid_tensor *, lucid_tensor *, const lucid_tensor *,
    const lucid_tensor *, lucid_tensor *, lucid_tensor *, lucid_tensor *,
    lucid_tensor *, lucid_tensor *, int, double, double);
lucid_status lucid_cuda_batchnorm2d_backward(
    lucid_ctx *, const lucid_tensor *, const lucid_tensor *, lucid_tensor *,
    const lucid_tensor *, const lucid_tensor *, const lucid_tensor *,
    lucid_tensor *, lucid_tensor *, int, double, double);
lucid_status lucid_cuda_batchnorm2d_backward_dcols(
    lucid_ctx *, const lucid_tensor *, const lucid_tensor *, lucid_tensor *,
    const lucid_tensor *, const lucid_tensor *, const lucid_tensor *, const lucid_tensor *,
    lucid_tensor *, lucid_tensor *, int, double, double, int, lucid_conv_dcols *);
lucid_status lucid_cuda_batchnorm2d_backward_terms(
    lucid_ctx *, const lucid_tensor *, int, const lucid_chan_piece *, lucid_tensor *,
    const lucid_tensor *, const lucid_tensor *, const lucid_tensor *, const lucid_tensor *,
    lucid_tensor *, lucid_tensor *, double, double, int, int *);
/* nn_pointwise.cu */
lucid_status lucid_cuda_silu_forward(lucid_ctx *, const lucid_tensor *,
                                     lucid_tensor *);
lucid_status lucid_cuda_silu_backward(lucid_ctx *, const lucid_tensor *,
                                      const lucid_tensor *, lucid_tensor *,
                                      double);
lucid_status lucid_cuda_maxpool2d_forward(lucid_ctx *, const lucid_tensor *,
                                          lucid_tensor *, lucid_tensor *,
                                          const lucid_pool2d_params *);
lucid_status lucid_cuda_maxpool2d_backward(lucid_ctx *, const lucid_tensor *,
                                           const lucid_tensor *,
                                           lucid_tensor *,
                                           const lucid_tensor *,
                                           const lucid_pool2d_params *,
                                           double);
lucid_status lucid_cuda_upsample_nearest2d_forward(lucid_ctx *,
                                                   const lucid_tensor *,
                                                   lucid_tensor *, int);
lucid_status lucid_cuda_upsample_nearest2d_backward(lucid_ctx *,
                                                    const lucid_tensor *,
                                                    const lucid_tensor *,
                                                    lucid_tensor *, int,
                                                    double);
lucid_status lucid_cuda_channel_copy(lucid_ctx *, lucid_tensor *, int64_t,
                                     const lucid_tensor *, int64_t, int64_t,
                                     double);
lucid_status lucid_cuda_channel_copy_multi(lucid_ctx *, int, const lucid_chan_piece *);
lucid_status lucid_cuda_add_forward(lucid_ctx *, const lucid_tensor *,
                                    const lucid_tensor *, lucid_tensor *);
/* nn_softmax.cu */
lucid_status lucid_cuda_softmax_forward(lucid_ctx *, const lucid_tensor *,
                                        lucid_tensor *);
lucid_status lucid_cuda_softmax_backward(lucid_ctx *, const lucid_tensor *,
                                         const lucid_tensor *, lucid_tensor *,
                                         double);
lucid_status lucid_cuda_dfl_forward(lucid_ctx *, const lucid_tensor *,
                                    lucid_tensor *, int);
lucid_status lucid_cuda_dfl_backward(lucid_ctx *, const lucid_tensor *,
                                     const lucid_tensor *, lucid_tensor *, int,
                                     double);
}

/* ------------------------------------------------- shared helpers (nn_norm_{fwd,bwd}.cu)
 * Per-channel sum over (N, S) of a [N, C, S] activation, finalised into an
 * f32 [C] tensor with beta semantics: out = beta*out + sum(dy).  Used for
 * the conv bias gradient.  dy: f32/bf16/f16 device buffer. */
lucid_status lucid_cuda_nn_channel_sum(lucid_ctx *ctx, lucid_cuda_state *st,
                                       lucid_cuda_nn_state *ns, const void *dy,
                                       lucid_dtype dt, int64_t N, int64_t C,
                                       int64_t S, float *out, double beta);

/* ---------------------------------------------------------------- checks */

/* ERR_UNSUPPORTED unless dt is a device activation dtype. */
static inline lucid_status nn_check_act(lucid_ctx *ctx, const char *op,
                                        lucid_dtype dt) {
    if (dt == LUCID_F32 || dt == LUCID_BF16 || dt == LUCID_F16)
        return LUCID_OK;
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "%s on cuda: activation dtype %s is not supported "
                        "(f32, bf16, f16; f64 is CPU-only)",
                        op, lucid_dtype_name(dt));
}

/* ERR_UNSUPPORTED unless t (nullable) is f32 (parameters on the device). */
static inline lucid_status nn_check_f32(lucid_ctx *ctx, const char *op,
                                        const char *arg,
                                        const lucid_tensor *t) {
    if (!t || t->dtype == LUCID_F32) return LUCID_OK;
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "%s on cuda: %s has dtype %s; device parameters, "
                        "gradients and statistics are f32",
                        op, arg, lucid_dtype_name(t->dtype));
}

/* Dispatch a templated launch on an activation dtype: F(T) is called with
 * T = float, __nv_bfloat16 or __half. */
#define NN_DISPATCH(dt, F)                                                    \
    do {                                                                      \
        switch (dt) {                                                         \
        case LUCID_F32: { typedef float T; F; } break;                        \
        case LUCID_BF16: { typedef __nv_bfloat16 T; F; } break;               \
        case LUCID_F16: { typedef __half T; F; } break;                       \
        default: break;                                                       \
        }                                                                     \
    } while (0)

/* Elements of a contiguous tensor's dims [from, ndim). */
static inline int64_t nn_inner(const lucid_tensor *t, int from) {
    int64_t s = 1;
    for (int i = from; i < t->ndim; i++) s *= t->shape[i];
    return s;
}

/* sigmoid in f32 (the SiLU of nn_pointwise.cu and of the fused
 * BatchNorm2d+SiLU of nn_norm_{fwd,bwd}.cu: one formula, so both give the same bits). */
static __device__ __forceinline__ float nn_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* Fixed-order block reductions (blockDim.x a multiple of 32, <= 1024):
 * xor-shuffle tree inside each warp, then warp 0 folds the warp results in
 * index order.  Result valid in thread 0. */
static __device__ __forceinline__ float nn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float nn_block_sum(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = nn_warp_sum(v);
    __syncthreads(); /* sh may be reused by a previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    float r = 0.0f;
    if (wid == 0) {
        r = lane < nw ? sh[lane] : 0.0f;
        r = nn_warp_sum(r);
    }
    return r;
}

#endif /* LUCID_CUDA_NN_COMMON_CUH */
