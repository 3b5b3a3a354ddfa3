/*
 * nn.h — neural-network primitives of lucid: kernels, modules, parameter sets.
 *
 * Design (DESIGN.md decisions 1, 3, 4, 5):
 *   1. Kernels.  Every primitive has an explicit forward and a hand-written
 *      backward.  lucid_nn_<op>_<pass>() are the checked entry points: they
 *      validate shapes/dtypes/devices and call the kernel table of the device
 *      the tensors live on (lucid_nn_kernels; CPU: engine/nn/, CUDA:
 *      cuda/, registered through the getter lucid_nn_cuda_kernels()).
 *      Table functions receive checked, contiguous NCHW activations.
 *   2. Dtypes.  Activations (x, y, dy, dx) are f32, bf16, f16, or f64 (CPU,
 *      for gradient checks); all activations of one call share a dtype.
 *      Parameters, parameter gradients and BN statistics are f32 (f64 allowed
 *      on the CPU); arithmetic is done in f32 or better (CPU: f64) and rounded
 *      once on store.
 *   3. Accumulation ("beta semantics").  A backward output g is written as
 *      g = beta * g + new; beta = 0 overwrites (g is not read, so stale NaNs
 *      do not leak), beta = 1 accumulates.  Forward outputs overwrite.
 *   4. Modules (Torch7 nn style).  lucid_module = small vtable + fields:
 *      parameter views, buffers, mode, and PERSISTENT outputs[] and
 *      grad_inputs[] reallocated only when an input shape/dtype/device
 *      changes, so a recorded CUDA graph sees the same addresses every step.
 *   5. Parameters.  Modules DECLARE their parameters and buffers in a
 *      lucid_param_set; lucid_param_set_materialize() then allocates one
 *      flat parameter buffer, one flat gradient buffer (same layout) and one
 *      flat buffer for buffers, and points every lucid_param's views into
 *      them for the lifetime of the set (never re-flattened).
 *
 * Argument order (style_anchors 3.3): forward(ctx, input, output, params...,
 * options); backward(ctx, input, grad_output, grad_input, params...,
 * options, beta).  Shapes are NCHW; indices 0-based.  Errors: every
 * function returns a lucid_status and leaves the message in ctx.
 *
 * Engine-internal header: includes only lucid.h, no CUDA and no Lua.
 */
#ifndef LUCID_NN_H
#define LUCID_NN_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================ attributes */

/* Sources one piece of lucid_nn_channel_copy_multi may sum (src and up to
 * LUCID_CHAN_SUM_MAX - 1 addends). */
#define LUCID_CHAN_SUM_MAX 4

/* One piece of lucid_nn_channel_copy_multi (below):
 *   dst[:, dst_c0 : dst_c0+nch] = src[:, src_c0 : src_c0+nch]
 * or, with src NULL, = 0 (all-zero bits); with addends (add[0] non-NULL,
 * the list ends at the first NULL) the rounded left-to-right sum
 *   dst[...] = ((src[...] + add[0][...]) + add[1][...]) + add[2][...]
 * of the channels [add_c0[k], add_c0[k] + nch) of each addend: every
 * addition in f32 (f64 for f64 tensors) of the operands as read, rounded to
 * dst's dtype before the next one (the bits of the chain
 * src:add(add[0]):add(add[1])... of whole tensors). Positional
 * initializers {dst, dst_c0, src, src_c0, nch} leave the addends NULL. */
typedef struct lucid_chan_piece {
    lucid_tensor *dst;
    int64_t dst_c0;
    const lucid_tensor *src; /* NULL: zero fill (src_c0 ignored) */
    int64_t src_c0;
    int64_t nch;
    const lucid_tensor *add[LUCID_CHAN_SUM_MAX - 1]; /* NULL-terminated */
    int64_t add_c0[LUCID_CHAN_SUM_MAX - 1];
} lucid_chan_piece;

/* Number of sources of a piece: 0 (zero fill), 1 (copy) or 2..
 * LUCID_CHAN_SUM_MAX (a sum). */
static inline int lucid_chan_piece_nsrc(const lucid_chan_piece *p) {
    if (!p->src) return 0;
    int k = 1;
    while (k < LUCID_CHAN_SUM_MAX && p->add[k - 1]) k++;
    return k;
}

/* Pieces one lucid_nn_channel_copy_multi call takes (Concat and Split have
 * at most 64 inputs / outputs). */
#define LUCID_CHAN_PIECES_MAX 64

/* Pieces a gradient description may have for the BatchNorm2d backward that
 * reads dy as a sum of terms (lucid_nn_batchnorm2d_backward_terms): more
 * are not taken (the caller materialises dy). */
#define LUCID_BN_TERMS_PIECES 8

/* Conv2d attributes (PyTorch nn.Conv2d).  Kernel size comes from the weight
 * shape [C_out, C_in/groups, kH, kW].
 *   H_out = floor((H + 2*pad_h - dilation_h*(kH-1) - 1) / stride_h) + 1   */
typedef struct lucid_conv2d_params {
    int stride_h, stride_w;     /* >= 1 */
    int pad_h, pad_w;           /* >= 0, zero padding */
    int dilation_h, dilation_w; /* >= 1 */
    int groups;                 /* >= 1, divides C_in and C_out */
} lucid_conv2d_params;

/* MaxPool2d attributes (PyTorch nn.MaxPool2d, dilation 1, ceil_mode False).
 * Padding is -inf; pad <= kernel/2. */
typedef struct lucid_pool2d_params {
    int kernel_h, kernel_w;
    int stride_h, stride_w;
    int pad_h, pad_w;
} lucid_pool2d_params;

/* Output size of a convolution/pooling window along one axis (may be <= 0
 * when the input is too small; the checked entry points reject that). */
int64_t lucid_nn_conv_out_size(int64_t in, int k, int stride, int pad,
                               int dilation);

/* ======================================================== kernel table
 * One table per device type.  Arguments are already checked by the
 * lucid_nn_* entry points below (shapes, dtypes, devices, contiguity);
 * see each entry point for the contract of the slot with the same name.
 * Optional tensors (NULL allowed) are marked "nullable".
 */
/* A Conv2d weight shadow (defined with its functions below). */
typedef struct lucid_conv_wshadow lucid_conv_wshadow;
/* The im2col columns of a conv's backward-data written by the BatchNorm
 * backward before it (defined with its functions below). */
typedef struct lucid_conv_dcols lucid_conv_dcols;
/* A Conv2d's column cache: the forward's im2col columns of x kept for its
 * filter gradient (defined with its functions below). */
typedef struct lucid_conv_wcols lucid_conv_wcols;

typedef struct lucid_nn_kernels {
    const char *name; /* "cpu", "cuda" */

    /* ---- Conv2d */
    lucid_status (*conv2d_forward)(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y, const lucid_tensor *w,
                                   const lucid_tensor *b,
                                   const lucid_conv2d_params *p);
    lucid_status (*conv2d_backward_input)(lucid_ctx *ctx, const lucid_tensor *x,
                                          const lucid_tensor *dy,
                                          lucid_tensor *dx,
                                          const lucid_tensor *w,
                                          const lucid_conv2d_params *p,
                                          double beta);
    lucid_status (*conv2d_backward_params)(lucid_ctx *ctx,
                                           const lucid_tensor *x,
                                           const lucid_tensor *dy,
                                           lucid_tensor *dw, lucid_tensor *db,
                                           const lucid_conv2d_params *p,
                                           double beta);
    /* ---- BatchNorm2d */
    lucid_status (*batchnorm2d_forward)(
        lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
        const lucid_tensor *weight, const lucid_tensor *bias,
        lucid_tensor *running_mean, lucid_tensor *running_var,
        lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
        lucid_tensor *save_invstd, int training, double momentum, double eps);
    lucid_status (*batchnorm2d_backward)(
        lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
        lucid_tensor *dx, const lucid_tensor *weight,
        const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
        lucid_tensor *dweight, lucid_tensor *dbias, int training,
        double beta_input, double beta_params);
    /* ---- SiLU */
    lucid_status (*silu_forward)(lucid_ctx *ctx, const lucid_tensor *x,
                                 lucid_tensor *y);
    lucid_status (*silu_backward)(lucid_ctx *ctx, const lucid_tensor *x,
                                  const lucid_tensor *dy, lucid_tensor *dx,
                                  double beta);
    /* ---- MaxPool2d */
    lucid_status (*maxpool2d_forward)(lucid_ctx *ctx, const lucid_tensor *x,
                                      lucid_tensor *y, lucid_tensor *indices,
                                      const lucid_pool2d_params *p);
    lucid_status (*maxpool2d_backward)(lucid_ctx *ctx, const lucid_tensor *x,
                                       const lucid_tensor *dy,
                                       lucid_tensor *dx,
                                       const lucid_tensor *indices,
                                       const lucid_pool2d_params *p,
                                       double beta);
    /* ---- nearest Upsample */
    lucid_status (*upsample_nearest2d_forward)(lucid_ctx *ctx,
                                               const lucid_tensor *x,
                                               lucid_tensor *y, int scale);
    lucid_status (*upsample_nearest2d_backward)(lucid_ctx *ctx,
                                                const lucid_tensor *x,
                                                const lucid_tensor *dy,
                                                lucid_tensor *dx, int scale,
                                                double beta);
    /* ---- channel-slice copy (Concat / Split / Chunk, both directions) */
    lucid_status (*channel_copy)(lucid_ctx *ctx, lucid_tensor *dst,
                                 int64_t dst_c0, const lucid_tensor *src,
                                 int64_t src_c0, int64_t nch, double beta);
    /* ---- Add */
    lucid_status (*add_forward)(lucid_ctx *ctx, const lucid_tensor *a,
                                const lucid_tensor *b, lucid_tensor *y);
    /* ---- softmax over the last dim */
    lucid_status (*softmax_forward)(lucid_ctx *ctx, const lucid_tensor *x,
                                    lucid_tensor *y);
    lucid_status (*softmax_backward)(lucid_ctx *ctx, const lucid_tensor *y,
                                     const lucid_tensor *dy, lucid_tensor *dx,
                                     double beta);
    /* ---- DFL projection */
    lucid_status (*dfl_forward)(lucid_ctx *ctx, const lucid_tensor *x,
                                lucid_tensor *y, int reg_max);
    lucid_status (*dfl_backward)(lucid_ctx *ctx, const lucid_tensor *x,
                                 const lucid_tensor *dy, lucid_tensor *dx,
                                 int reg_max, double beta);
    /* ---- BatchNorm2d + SiLU fused (nullable: a table without them makes
     * the entry points return ERR_UNSUPPORTED) */
    lucid_status (*batchnorm2d_silu_forward)(
        lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
        const lucid_tensor *weight, const lucid_tensor *bias,
        lucid_tensor *running_mean, lucid_tensor *running_var,
        lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
        lucid_tensor *save_invstd, int training, double momentum, double eps);
    lucid_status (*batchnorm2d_silu_backward)(
        lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
        lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
        const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
        lucid_tensor *dweight, lucid_tensor *dbias, int training,
        double beta_input, double beta_params);
    /* ---- multi-piece channel copy (nullable: the entry point then runs
     * the pieces one by one).  Receives 1..LUCID_CHAN_PIECES_MAX checked,
     * non-empty pieces (nch > 0, numel > 0) of one dtype (src and addends
     * NULL or of dst's dtype) and one shape outside dim 1, no piece's dst
     * overlapping another piece's dst or any piece's src or addend.  A
     * piece with addends is a rounded sum (lucid_chan_piece). */
    lucid_status (*channel_copy_multi)(lucid_ctx *ctx, int n,
                                       const lucid_chan_piece *pieces);
    /* ---- Conv2d with a weight shadow (nullable: the entry points then
     * call conv2d_forward / conv2d_backward_input and ignore the shadow;
     * the CPU table has none).  See lucid_conv_wshadow below. */
    lucid_status (*conv2d_forward_shadow)(lucid_ctx *ctx, const lucid_tensor *x,
                                          lucid_tensor *y, const lucid_tensor *w,
                                          const lucid_tensor *b,
                                          const lucid_conv2d_params *p,
                                          lucid_conv_wshadow *ws);
    lucid_status (*conv2d_backward_input_shadow)(
        lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
        lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
        double beta, lucid_conv_wshadow *ws);
    lucid_status (*conv2d_cast_shadows)(lucid_ctx *ctx,
                                        const lucid_tensor *const *w,
                                        lucid_conv_wshadow *const *ws,
                                        int n, lucid_dtype dt);
    /* ---- the backward-data's columns written by the BatchNorm backward
     * (nullable, all three or none: the entry points then take the plain
     * calls; the CPU table has none).  See lucid_conv_dcols below.  The
     * reservation receives dc zeroed; the BatchNorm slot receives an armed
     * dc and a non-NULL dx (silu: the fused BatchNorm2d+SiLU, bias
     * nullable) and sets dc->filled only when it wrote the columns; the
     * conv slot receives a filled dc. */
    lucid_status (*conv2d_dcols_reserve)(lucid_ctx *ctx, const lucid_tensor *x,
                                         const lucid_tensor *w,
                                         const lucid_conv2d_params *p,
                                         lucid_conv_dcols *dc);
    lucid_status (*batchnorm2d_backward_dcols)(
        lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
        lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
        const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
        lucid_tensor *dweight, lucid_tensor *dbias, int training,
        double beta_input, double beta_params, int silu, lucid_conv_dcols *dc);
    lucid_status (*conv2d_backward_input_dcols)(
        lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
        lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
        double beta, lucid_conv_wshadow *ws, lucid_conv_dcols *dc);
    /* ---- the filter gradient's columns cached by the forward (nullable,
     * both or none: the entry points then call conv2d_forward_shadow /
     * conv2d_forward and conv2d_backward_params and ignore the cache; the
     * CPU table has none).  See lucid_conv_wcols below.  Both receive a
     * non-NULL wc; ws nullable as for conv2d_forward_shadow. */
    lucid_status (*conv2d_forward_cols)(lucid_ctx *ctx, const lucid_tensor *x,
                                        lucid_tensor *y, const lucid_tensor *w,
                                        const lucid_tensor *b,
                                        const lucid_conv2d_params *p,
                                        lucid_conv_wshadow *ws, lucid_conv_wcols *wc,
                                        int x_stable);
    lucid_status (*conv2d_backward_params_cols)(lucid_ctx *ctx, const lucid_tensor *x,
                                                const lucid_tensor *dy, lucid_tensor *dw,
                                                lucid_tensor *db,
                                                const lucid_conv2d_params *p,
                                                double beta, lucid_conv_wcols *wc);
    /* ---- the training BatchNorm2d backward reading dy as a sum of terms
     * (nullable: the entry point then answers *taken = 0; the CPU table
     * has none).  See lucid_nn_batchnorm2d_backward_terms below.  Receives
     * checked pieces (1..LUCID_BN_TERMS_PIECES, tiling dy's channels in
     * order, sources of x's dtype, shape outside dim 1 and device), a
     * non-NULL dx and training 1; sets *taken = 1 only when it queued the
     * work, else leaves everything untouched (*taken = 0).  n == 0 (pieces
     * NULL): a query, nothing is queued: *taken = whether a call for this
     * x with 16-byte aligned sources would take the route. */
    lucid_status (*batchnorm2d_backward_terms)(
        lucid_ctx *ctx, const lucid_tensor *x, int n, const lucid_chan_piece *pieces,
        lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
        const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
        lucid_tensor *dweight, lucid_tensor *dbias, double beta_input,
        double beta_params, int silu, int *taken);
} lucid_nn_kernels;

/* The CPU table (engine/nn/).  Always present. */
const lucid_nn_kernels *lucid_nn_cpu_kernels(void);

/* The CUDA table: defined in cuda/nn_table.cu in a CUDA build, and as NULL
 * in engine/core/cuda_absent.c in a CPU-only build (ordinary strong symbols,
 * so static links pull the CUDA objects in). */
const lucid_nn_kernels *lucid_nn_cuda_kernels(void);

/* The table for a device of this context; NULL with ERR_UNSUPPORTED set
 * in ctx when the build has no CUDA nn kernels. */
const lucid_nn_kernels *lucid_nn_kernels_for(lucid_ctx *ctx, lucid_device dev);

/* ======================================================= checked entry points
 * All activation tensors: contiguous, same device, same float dtype.
 */

/* ---------------------------------------------------------------- Conv2d
 * x [N, C_in, H, W], w [C_out, C_in/g, kH, kW] (f32; f64 on the CPU),
 * b [C_out] or NULL, y [N, C_out, H_out, W_out] (overwritten).
 * y[n,o,i,j] = b[o] + sum_{c in group(o), u, v} w[o, c', u, v]
 *              * x[n, c, i*sh - ph + u*dh, j*sw - pw + v*dw]   (zero padded)
 * Source: PyTorch nn.Conv2d documentation. */
lucid_status lucid_nn_conv2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                     lucid_tensor *y, const lucid_tensor *w,
                                     const lucid_tensor *b,
                                     const lucid_conv2d_params *p);
/* dx = beta*dx + conv_transpose(dy, w); x is the forward input (its shape
 * and dtype equal dx's; kernels may ignore its values). */
lucid_status lucid_nn_conv2d_backward_input(lucid_ctx *ctx,
                                            const lucid_tensor *x,
                                            const lucid_tensor *dy,
                                            lucid_tensor *dx,
                                            const lucid_tensor *w,
                                            const lucid_conv2d_params *p,
                                            double beta);
/* dw = beta*dw + sum_n dy (x) x ; db = beta*db + sum_{n,i,j} dy.
 * dw [C_out, C_in/g, kH, kW] and db [C_out] in the parameter dtype; either
 * may be NULL (frozen), not both. */
lucid_status lucid_nn_conv2d_backward_params(lucid_ctx *ctx,
                                             const lucid_tensor *x,
                                             const lucid_tensor *dy,
                                             lucid_tensor *dw, lucid_tensor *db,
                                             const lucid_conv2d_params *p,
                                             double beta);

/* ------------------------------------------------ Conv2d weight shadows
 * The cuBLAS routes of bf16/f16 convolutions (1x1: cuda/nn_conv_gemm.cu;
 * im2col: cuda/nn_conv_col.cu) multiply by the f32 master weight rounded
 * once to the activation dtype
 * (round to nearest even: __float2bfloat16_rn / __float2half_rn).  Without
 * a shadow that rounding is one kernel launch before EVERY forward and
 * backward-data GEMM, into scratch.  A shadow is a persistent device copy of
 * that rounded weight plus the host-side record of what it holds, so the
 * cast runs once per weight change:
 *   - the shadow is FRESH for (w, dt) when its last cast was queued from the
 *     same weight view (storage, retained, and data pointer) at the same
 *     storage version (lucid_storage_version: every host-queued write, the
 *     optimizer's included, bumps it), into the same dtype, in the same
 *     device epoch;
 *   - the device epoch (backend: cuda/graph.cu, st->shadow_epoch) changes
 *     at every capture begin, capture end and graph launch: a cast queued
 *     outside a capture is not relied on inside it (the replay would read a
 *     stale shadow), a cast queued inside it is (it is replayed too), and
 *     after a capture or a replay (which may have changed weights on the
 *     device behind the host's versions) the next eager use casts again.
 *     Except around a capture begun with LUCID_CAPTURE_KEEP_SHADOWS
 *     (train/graph.h): shadows fresh at its begin stay fresh inside it, and
 *     when it cast none, neither its end nor its graph's launches change the
 *     epoch; its caller recasts the shadows before each launch.
 * A gemm-routed forward / backward-data given a shadow uses it when fresh,
 * else casts into it (one launch, as without) and marks it fresh; a shadow
 * whose buffer does not exist yet and cannot be allocated now (stream
 * capture refuses allocation) is left alone and the call casts into scratch
 * exactly as without a shadow.  The bits of every output are those of the
 * shadow-less route (the same rounding of the same values).
 * LUCID_WCAST_ONCE=0 (read once per process; lucid_cuda_nn_set_wcast per
 * context) makes the CUDA kernels ignore shadows: the per-call casts.
 * Fields are owned by the functions below and the CUDA kernels; clients
 * only init, pass and release a shadow.  Not thread-safe: one shadow is
 * used by the thread that drives its module. */
struct lucid_conv_wshadow {
    lucid_storage *buf;       /* device bytes (2 per weight element, then room for the
                               * im2col backward-data's flipped weight of a spatial
                               * kernel), or NULL */
    int valid;                /* buf holds the cast described below */
    lucid_storage *src;       /* retained: the weight's storage at the cast */
    const void *src_data;     /* lucid_tensor_data(w) at the cast */
    int64_t numel;            /* weight elements cast */
    uint64_t src_version;     /* lucid_storage_version(src) at the cast */
    lucid_dtype dtype;        /* LUCID_BF16 or LUCID_F16 */
    uint64_t epoch;           /* device epoch (st->shadow_epoch) at the cast */
    int64_t flip_off;         /* > 0: the group cast also wrote the im2col route's flipped
                               * weight (cuda/nn_conv_col.cuh) at this element offset; 0 none */
    int64_t flip_shape[4];    /* w's [Cout, Cin, kh, kw] at that flipped cast: the flipped
                               * layout depends on the shape, which freshness does not
                               * compare (a same-numel view of the same data is "fresh") */
    int64_t phase_off;        /* > 0: the group cast also wrote the stride-phase
                               * backward-data's transposed weight (cuda/nn_conv_igemm.cuh
                               * lucid_conv_igemm_wt_src) at this element offset; 0 none */
    int64_t phase_shape[4];   /* w's shape at that cast (the layout depends on it) */
    int phase_want;           /* a backward-data on the stride-phase kernel read (or cast
                               * per call) that copy through this shadow: the group cast
                               * writes it from then on.  Kept by invalidate (a property
                               * of the conv, not of the cast) */
};

/* An empty shadow (no buffer, not valid). */
void lucid_conv_wshadow_init(lucid_conv_wshadow *s);
/* Free the buffer and drop the source reference (s is empty again).  The
 * caller makes sure no queued or recorded work still reads the buffer (a
 * module's shadow is released with the module; a recording holds a
 * reference on its modules). */
void lucid_conv_wshadow_release(lucid_conv_wshadow *s);
/* 1 when s holds w (an f32 weight view) rounded to dt as cast in device
 * epoch `epoch` and nothing has written w's storage since (see above). */
int lucid_conv_wshadow_fresh(const lucid_conv_wshadow *s, const lucid_tensor *w,
                             lucid_dtype dt, uint64_t epoch);
/* Record that a cast of w to dt into s->buf was just queued in `epoch`
 * (retains w's storage, releasing the previous one). */
void lucid_conv_wshadow_mark(lucid_conv_wshadow *s, const lucid_tensor *w,
                             lucid_dtype dt, uint64_t epoch);
/* Forget what s holds (s->buf is kept). */
void lucid_conv_wshadow_invalidate(lucid_conv_wshadow *s);
/* Record, after lucid_conv_wshadow_mark in the same cast, that the cast also
 * wrote w's flipped, transposed copy (the im2col route's backward-data,
 * cuda/nn_conv_col.cuh) at element `off` > 0 of s->buf, for w's shape. */
void lucid_conv_wshadow_mark_flip(lucid_conv_wshadow *s, const lucid_tensor *w, int64_t off);
/* The element offset of w's flipped copy in s->buf when s is fresh for w
 * (lucid_conv_wshadow_fresh) and its last cast wrote that copy for w's own
 * shape (the flipped layout depends on the shape, which freshness does not
 * compare: a same-numel view of the same data is "fresh"); else 0. */
int64_t lucid_conv_wshadow_flip_off(const lucid_conv_wshadow *s, const lucid_tensor *w,
                                    lucid_dtype dt, uint64_t epoch);
/* The same pair for the stride-phase backward-data's transposed weight
 * (cuda/nn_conv_igemm.cuh): mark_phase records, after lucid_conv_wshadow_mark
 * in the same cast, that the cast wrote it at element `off` > 0 for w's
 * shape; phase_off gives that offset when s is fresh for (w, dt, epoch) and
 * the copy was written for w's own shape, else 0.  want_phase records that
 * the conv's backward-data reads that copy (sticky: the group cast then
 * writes it with every cast of s; invalidate keeps it, init clears it). */
void lucid_conv_wshadow_mark_phase(lucid_conv_wshadow *s, const lucid_tensor *w, int64_t off);
int64_t lucid_conv_wshadow_phase_off(const lucid_conv_wshadow *s, const lucid_tensor *w,
                                     lucid_dtype dt, uint64_t epoch);
void lucid_conv_wshadow_want_phase(lucid_conv_wshadow *s);

/* lucid_nn_conv2d_forward / _backward_input with a weight shadow ws
 * (nullable: exactly the calls above).  Same arguments, checks, results
 * and errors; the CUDA table's cuBLAS routes (1x1, im2col) read and update
 * ws (see above), every other route and device ignores it. */
lucid_status lucid_nn_conv2d_forward_shadow(lucid_ctx *ctx, const lucid_tensor *x,
                                            lucid_tensor *y, const lucid_tensor *w,
                                            const lucid_tensor *b,
                                            const lucid_conv2d_params *p,
                                            lucid_conv_wshadow *ws);
lucid_status lucid_nn_conv2d_backward_input_shadow(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
    double beta, lucid_conv_wshadow *ws);
/* Cast n f32 weights w[i] (contiguous, one device) into their shadows
 * ws[i] for activation dtype dt, in ONE kernel launch (chunked beyond the
 * kernel-parameter table's size) for every shadow that a cuBLAS route (1x1
 * or im2col, with the flipped weight for the im2col backward-data) would
 * use and that is not fresh; marks them fresh.  The copies only the
 * backward-data reads (flipped, transposed) go in a second launch on a
 * low-priority side stream of the CUDA backend (LUCID_WCAST_SIDE=0: in the
 * same launch), which every backward-data reading one waits for first.  A shadow whose
 * buffer does not exist yet is allocated here, except during a stream
 * capture (it is skipped: its conv then casts per call).  dt f32 and
 * weights on the CPU: nothing to do (LUCID_OK).  ERR_ARG for NULL
 * entries, n < 0, non-f32 or non-contiguous weights, weights on different
 * devices, or dt other than f32/bf16/f16.  No-op with LUCID_WCAST_ONCE=0. */
lucid_status lucid_nn_conv2d_cast_shadows(lucid_ctx *ctx, const lucid_tensor *const *w,
                                          lucid_conv_wshadow *const *ws, int n,
                                          lucid_dtype dt);

/* ------------------------------- backward-data columns from the BatchNorm
 * The im2col route's backward-data of a bf16/f16 conv (cuda/nn_conv_col.cuh)
 * is im2col(dy) into the pass's scratch, then one GEMM.  In the Conv block
 * (conv -> bn -> act, lua/lucid/nn/blocks.lua) dy is the input gradient of
 * the BatchNorm2d, and when that backward is one kernel (one part per
 * channel: N*H*W <= 8192, the one-pass route of cuda/nn_norm.cuh) the
 * kernel can also write the columns of the dx it produces, straight into
 * the conv's scratch, and the conv skips its im2col: one launch less on the
 * backward's critical path, the same bits (the columns are copies of dx).
 * Geometry: a 3x3 conv, stride 1, padding 1, dilation 1, groups 1, Cout*9
 * and H*W multiples of 8 (no padded rows, 16-byte column vectors), on the
 * im2col route for its backward-data; the columns of image n are the
 * row-major [Cout*9 x H*W] matrix, row co*9 + r*3 + q, column p = i*W + j,
 * value dy[n][co][i+r-1][j+q-1] (+0 outside the plane).
 * The three calls, back to back on the context's stream (the columns live
 * in the stream's nn scratch, which another op may reuse or grow):
 *   1. lucid_nn_conv2d_dcols_reserve(x, w, p, &dc): x the conv's forward
 *      input (dx's shape), w its weight.  Arms dc (dc.armed = 1) and
 *      reserves the scratch of the conv's backward-data and backward-filter
 *      with the columns after both, when the geometry qualifies, N*H*W <=
 *      8192 (the BatchNorm backward of dy is then one kernel), the
 *      backward-data takes the im2col route and LUCID_BN_EMIT_COLS is not
 *      "0" (read on each call); else dc.armed = 0 (LUCID_OK: the plain
 *      calls follow).  Nothing is queued.
 *   2. lucid_nn_batchnorm2d_backward_dcols(..., silu, &dc): the BatchNorm2d
 *      backward (silu: the fused BatchNorm2d+SiLU), exactly as
 *      lucid_nn_batchnorm2d[_silu]_backward, whose dx (the conv's dy) also
 *      goes to the columns when dc is armed and the kernel can write them
 *      (training, dx given, one part per channel, the one-pass route on,
 *      16-byte aligned vectors, dx's shape [N, Cout, H, W] and dtype those
 *      of the reservation): dc.filled = 1, dc.dy = dx's data; else
 *      dc.filled = 0.
 *   3. lucid_nn_conv2d_backward_input_dcols(..., &dc): the backward-data
 *      (as lucid_nn_conv2d_backward_input_shadow); with dc filled from this
 *      dy for this geometry, on the im2col route, and the scratch neither
 *      moved nor shrunk since step 1, the GEMM reads the columns and no
 *      im2col runs; otherwise the plain pass (the same bits).
 * Between 2 and 3 only the conv's parameter gradient may run on the stream
 * (lucid_nn_conv2d_backward_params: its scratch lies before the columns).
 * Errors: those of the plain calls; dc NULL is ERR_ARG for step 1 and
 * means "no columns" for steps 2 and 3.  Source: Caffe's im2col /
 * DeconvolutionLayer (the backward-data as a forward of dy). */
struct lucid_conv_dcols {
    int armed;          /* step 1 reserved the columns */
    int filled;         /* step 2 wrote them from dy below */
    void *data;         /* the columns: N * Cout*9 * H*W elements of dtype (device) */
    const void *dy;     /* data of the dx tensor step 2 wrote them from */
    lucid_dtype dtype;  /* bf16 or f16 */
    int64_t N, C, H, W; /* dy's shape (C = Cout; H, W: the conv's input and output) */
    const void *base;   /* the stream's scratch at step 1; data = base + off */
    size_t off, bytes;  /* the columns' byte offset in it and size */
    const void *stream; /* the stream of step 1 (a cudaStream_t) */
};

lucid_status lucid_nn_conv2d_dcols_reserve(lucid_ctx *ctx, const lucid_tensor *x,
                                           const lucid_tensor *w,
                                           const lucid_conv2d_params *p,
                                           lucid_conv_dcols *dc);
lucid_status lucid_nn_batchnorm2d_backward_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, int silu, lucid_conv_dcols *dc);
lucid_status lucid_nn_conv2d_backward_input_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
    double beta, lucid_conv_wshadow *ws, lucid_conv_dcols *dc);

/* ----------------------------------- Conv2d filter-gradient column cache
 * The im2col route of a bf16/f16 conv (cuda/nn_conv_col.cuh) builds the
 * column matrix of x (im2col: N images of Kr x Ho*Wo elements, Kr =
 * Cin*kh*kw rounded up to 8, +0 padding rows) in its forward, and the filter
 * gradient, dw = sum_n dY[n] . col[n]^T, built the same matrix again from
 * the same x.  A column cache is a persistent device buffer per conv plus
 * the host-side record of what it holds, so the filter gradient multiplies
 * the forward's columns instead (DECISIONS 38):
 *   - a forward on the im2col route given a cache writes its columns into
 *     it instead of the stream's scratch (the GEMM reads them there) and
 *     marks it;
 *   - a forward on another route (layer 0 and the 160x160 bottlenecks run
 *     the small-channel kernels, which build no columns) given a cache may
 *     build the columns with one im2col launch on a low-priority side
 *     stream (the CUDA backend's cols lane, forked where the forward is
 *     called), when the conv's filter gradient takes the im2col route and
 *     the mode allows it (LUCID_WCOLS below): off the backward's critical
 *     path, beside the forward;
 *   - the filter gradient given a cache that is FRESH for its x skips its
 *     im2col and multiplies the cached columns: the same bytes as the
 *     im2col it skips, hence the same bits.
 * FRESH for (x, kernel, params, rows) <=> the last write was queued from
 * the same x view (its storage, retained so that the address cannot be
 * reused by another storage, and its data pointer, i.e. the offset) with
 * the storage at the same version (every host-queued write bumps it, as
 * for the weight shadows: an in-place change of x between the forward and
 * the filter gradient is seen), the same shape and dtype, the same kernel
 * size, stride, padding, dilation and groups, the same rows per image (K
 * padding), in the same device epoch (the backend's column-cache epoch,
 * st->wcast_epoch, moved at every capture begin / end and graph launch: a
 * write queued outside a capture is never relied on inside it, one inside
 * it is, and none after a replay).  The record follows the LAST write: forward(x1), forward(x2),
 * filter gradient of x2 reads x2's columns; that of x1 builds its own.
 * Ordering on the device (the CUDA backend; events, graph edges under
 * capture): every reader waits for the last write, wherever it ran (the
 * cols lane, a branch lane); every write first waits for the reads of
 * this epoch since the last write (a filter gradient on a
 * parameter-gradient lane may still read the buffer when a second forward
 * of the same conv, gradient accumulation, overwrites it) and for the last
 * write.
 * Buffers: allocated on first use outside stream capture and never freed
 * while the cache lives (a recorded graph may read them): a call that
 * needs more bytes than the buffer holds allocates a larger one and keeps
 * the old one (retired, up to LUCID_CONV_WCOLS_RETIRED; beyond, the call
 * runs without the cache).  Every cache of the process together holds at
 * most LUCID_WCOLS_MAX_MB MiB (read once; default 2048; the CUDA
 * backend's per-context override lucid_cuda_nn_set_wcols_cap): a conv
 * whose buffer would pass it runs without a cache, as before.  Cost for
 * YOLO11n-pose at batch 4, 640, bf16: 39 caches, 366 MiB with LUCID_WCOLS=1
 * (41 and 408 MiB with 2).
 * LUCID_WCOLS (read once per process; lucid_cuda_nn_set_wcols per
 * context): "0" off (every call exactly as without a cache); unset, "" or
 * "1": the cache, and side builds for convs whose input is stable
 * (x_stable: the caller says x keeps its values until the filter
 * gradient; the Conv2d module passes it when it computes no input
 * gradient, i.e. layer 0, whose input is the image); "2": side builds for
 * every conv whose forward builds no columns; "3": the cache without side
 * builds.  Any other value reads as 1.
 * Fields are owned by the functions below and the CUDA kernels (events,
 * events_free, the *_pending fields); clients only init, pass and release
 * a cache.  Not thread-safe: one cache is used by the thread that drives
 * its module. */
#define LUCID_CONV_WCOLS_RETIRED 4
struct lucid_conv_wcols {
    lucid_storage *buf;       /* device bytes of the columns, or NULL */
    lucid_storage *retired[LUCID_CONV_WCOLS_RETIRED]; /* outgrown buffers (kept) */
    size_t held;              /* bytes of buf and retired, counted in the process total */
    int valid;                /* buf holds the columns of the x described below */
    lucid_storage *src;       /* retained: x's storage at the write */
    const void *src_data;     /* lucid_tensor_data(x) at the write */
    uint64_t src_version;     /* lucid_storage_version(src) at the write */
    int64_t shape[4];         /* x's shape */
    lucid_dtype dtype;        /* x's dtype (bf16 / f16) */
    int kh, kw;               /* kernel size */
    lucid_conv2d_params p;    /* stride, padding, dilation, groups */
    int64_t rows;             /* rows per image of the column matrix (K rounded up) */
    uint64_t epoch;           /* device epoch at the write */
    int side;                 /* written on the backend's side lane (informative) */
    void *events[2];          /* backend events: [0] after the last write, [1] after
                               * the reads since it; NULL until made */
    void (*events_free)(void **events); /* set by the backend that made them */
    int write_pending;        /* events[0] recorded in write_epoch */
    uint64_t write_epoch;
    int read_pending;         /* events[1] recorded in read_epoch */
    uint64_t read_epoch;
};

/* An empty cache (no buffer, not valid). */
void lucid_conv_wcols_init(lucid_conv_wcols *c);
/* Free the buffers and events, drop the source reference and give the
 * bytes back to the process total (c is empty again).  The caller makes
 * sure no queued or recorded work still uses the buffers (a module's cache
 * is released with the module; a recording holds a reference on its
 * modules). */
void lucid_conv_wcols_release(lucid_conv_wcols *c);
/* Forget what c holds (buffers, events and the *_pending fields kept). */
void lucid_conv_wcols_invalidate(lucid_conv_wcols *c);
/* 1 when c holds the columns of x (bf16/f16 [N, Cin, H, W]) for a kh x kw
 * kernel with params p and `rows` rows per image, written in `epoch`, and
 * nothing has written x's storage since (see above); 0 otherwise (also for
 * a NULL argument). */
int lucid_conv_wcols_fresh(const lucid_conv_wcols *c, const lucid_tensor *x, int kh, int kw,
                           const lucid_conv2d_params *p, int64_t rows, uint64_t epoch);
/* Record that the columns of x (as for _fresh) were just queued into
 * c->buf in `epoch` (side: on the side lane).  Retains x's storage,
 * releasing the previous one. */
void lucid_conv_wcols_mark(lucid_conv_wcols *c, const lucid_tensor *x, int kh, int kw,
                           const lucid_conv2d_params *p, int64_t rows, uint64_t epoch,
                           int side);
/* Buffer bookkeeping for the backend: take `bytes` from the process total
 * when it stays within cap (1), else take nothing (0); give them back;
 * the total now (bytes of every live cache buffer, retired ones
 * included). */
int lucid_conv_wcols_budget_take(size_t bytes, size_t cap);
void lucid_conv_wcols_budget_give(size_t bytes);
size_t lucid_conv_wcols_held_total(void);
/* Install buf (`bytes` already taken from the total) as c's buffer,
 * retiring the current one: 1, or 0 when every retired slot is used
 * (nothing changed; the caller frees buf and gives the bytes back). */
int lucid_conv_wcols_adopt(lucid_conv_wcols *c, lucid_storage *buf, size_t bytes);

/* lucid_nn_conv2d_forward_shadow with a column cache wc (nullable: exactly
 * that call) and x_stable (the caller's promise that x keeps its values
 * until the conv's filter gradient; only a hint for side builds: the
 * freshness rule above catches a change).  Pass wc only when a filter
 * gradient will follow (training, weight trainable).  Same arguments,
 * checks, results and errors as the forward. */
lucid_status lucid_nn_conv2d_forward_cols(lucid_ctx *ctx, const lucid_tensor *x,
                                          lucid_tensor *y, const lucid_tensor *w,
                                          const lucid_tensor *b,
                                          const lucid_conv2d_params *p,
                                          lucid_conv_wshadow *ws, lucid_conv_wcols *wc,
                                          int x_stable);
/* lucid_nn_conv2d_backward_params reading the columns of wc when they are
 * fresh for x and the filter gradient takes the im2col route (wc
 * nullable: exactly that call).  Same arguments, checks, results (bits)
 * and errors. */
lucid_status lucid_nn_conv2d_backward_params_cols(lucid_ctx *ctx, const lucid_tensor *x,
                                                  const lucid_tensor *dy, lucid_tensor *dw,
                                                  lucid_tensor *db,
                                                  const lucid_conv2d_params *p,
                                                  double beta, lucid_conv_wcols *wc);

/* ----------------------------------------------------------- BatchNorm2d
 * x, y [N, C, H, W]; weight, bias, running_mean, running_var, save_mean,
 * save_invstd [C] (f32; f64 on the CPU); num_batches_tracked: one i64
 * element, nullable.  weight/bias nullable (affine=False).
 * training=1: mean/var over (N,H,W) (biased var for normalisation),
 *   running = (1-momentum)*running + momentum*batch (unbiased var, M/(M-1),
 *   M = N*H*W > 1 else ERR_ARG), num_batches_tracked += 1; running_* and
 *   num_batches_tracked may be NULL (no tracking).
 * training=0: normalise with running_mean/running_var (required).
 * Both modes store save_mean and save_invstd = 1/sqrt(var + eps) of the
 * statistics used, for the backward.  y = (x-mean)*invstd*weight + bias.
 * Source: PyTorch nn.BatchNorm2d documentation (momentum 0.03, eps 1e-3 in
 * Ultralytics initialize_weights). */
lucid_status lucid_nn_batchnorm2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps);
/* xhat = (x-mean)*invstd, g = dy*weight (weight NULL: 1), M = N*H*W:
 *   training: dx = beta_input*dx + invstd*(g - mean(g) - xhat*mean(g*xhat))
 *   eval:     dx = beta_input*dx + invstd*g
 *   dweight = beta_params*dweight + sum(dy*xhat); dbias = beta_params*dbias
 *   + sum(dy).  dx, dweight, dbias are each nullable (skipped). */
lucid_status lucid_nn_batchnorm2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params);

/* ------------------------------------------- BatchNorm2d + SiLU (fused)
 * a = silu(z), z = BatchNorm2d(x): nn.BatchNorm2d followed by nn.SiLU (the
 * conv -> bn -> act of Ultralytics' Conv block) in one pass, without
 * storing z.  Arguments, shapes, dtypes, modes, NULL rules and errors are
 * those of lucid_nn_batchnorm2d_forward, and the statistics are computed by
 * the same code, so save_mean, save_invstd, running_mean, running_var and
 * num_batches_tracked are bitwise those of the unfused call; y receives
 *   a = z * sigmoid(z),  z = (x - mean) * invstd * weight + bias
 * with z in f32 (f64 for f64 activations on the CPU), rounded once to the
 * activation dtype as a.  Numerics against the unfused route (batchnorm2d
 * then silu): f32/f64 activations give the same values (the CPU: bitwise);
 * bf16/f16 activations differ by about one rounding, because the unfused
 * route rounds z to the activation dtype before the SiLU and this one does
 * not.  ERR_UNSUPPORTED when the device's kernel table has no fused slot.
 * Source: PyTorch nn.BatchNorm2d and nn.SiLU documentation. */
lucid_status lucid_nn_batchnorm2d_silu_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps);
/* Backward of the above.  dy is the gradient of a; x, weight, bias,
 * save_mean, save_invstd and training are those of the forward (bias is
 * needed to recompute z; weight/bias NULL: 1/0).  With
 *   z = (x-mean)*invstd*weight + bias, s = sigmoid(z),
 *   g = dy * s * (1 + z*(1-s))        (dL/dz, the SiLU backward)
 * it computes exactly lucid_nn_batchnorm2d_backward with grad_output g:
 *   training: dx = beta_input*dx + invstd*w*(g - mean(g) - xhat*mean(g*xhat))
 *   eval:     dx = beta_input*dx + invstd*w*g
 *   dweight = beta_params*dweight + sum(g*xhat); dbias = beta_params*dbias
 *   + sum(g).  dx, dweight, dbias are each nullable (skipped).
 * g is recomputed in f32 (f64 for f64) inside the reductions and the dx
 * pass and never stored (the unfused route rounds it to bf16/f16 first).
 * Shapes and dtypes: as lucid_nn_batchnorm2d_backward; bias [C] like
 * weight. */
lucid_status lucid_nn_batchnorm2d_silu_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params);

/* ----------------------------- BatchNorm2d backward reading dy as terms
 * The training backward of BatchNorm2d (silu 0: lucid_nn_batchnorm2d_
 * backward) or of the fused BatchNorm2d + SiLU (silu 1: lucid_nn_
 * batchnorm2d_silu_backward) whose grad_output dy is given as a gradient
 * description instead of a tensor: n pieces (lucid_chan_piece with dst
 * NULL), piece i holding channels [p.dst_c0, p.dst_c0 + p.nch) of dy as
 * p.src's channels from p.src_c0 (one source) or as the rounded
 * left-to-right sum of p.src and its addends (2..LUCID_CHAN_SUM_MAX
 * sources), i.e. exactly the values lucid_nn_channel_copy_multi would
 * write into a tensor dy given those pieces with dst = dy: every addition
 * in f32, rounded to the activation dtype before the next (chan_sum_multi's
 * arithmetic, cuda/nn_pointwise.cu).  The pieces tile [0, C) in order
 * (piece 0 at channel 0, each next one where the last ended, the last
 * ending at C).  This lets the Conv block's BatchNorm read a sum of
 * gradients (a concatenation's slice plus an inner block's gradient, the
 * gradients of a tensor with several consumers) where it is needed, instead
 * of a launch that first writes the sum to memory (DECISIONS 40).
 * Taken (*taken = 1): on a device whose kernel table has the slot (CUDA)
 * when the call is the one-pass route of cuda/nn_norm.cuh (training, dx
 * given, one part per channel: N*H*W <= 8192 at most, LUCID_BN_ONEPASS on),
 * n <= LUCID_BN_TERMS_PIECES, every source row 16-byte aligned when the
 * vector path applies, and LUCID_BN_DY_TERMS is not "0" (read once per
 * process; lucid_nn_bn_dy_terms_override).  Then one kernel computes dx,
 * dweight and dbias with bitwise the values of lucid_nn_channel_copy_multi
 * into a fresh (16-byte aligned) tensor dy followed by the plain backward
 * of that dy: the same partition, vector width and arithmetic.
 * Not taken (*taken = 0, LUCID_OK): nothing is written or queued; the
 * caller materialises dy and calls the plain backward (the CPU always,
 * eval, dx NULL, multi-part channels, more pieces, unaligned sources).
 * Shapes: x, dx [N, C, H, W] (dx nullable: then never taken), every source
 * [N, C_src, H, W] contiguous of x's dtype and device; parameters as the
 * plain backward (bias: silu only, nullable).  dx must not overlap a
 * source.  Errors (ERR_ARG): n < 1, pieces or taken NULL, a piece with a
 * dst, without a source or with more than LUCID_CHAN_SUM_MAX, pieces that
 * do not tile [0, C) in order, a source of another dtype, device, N, H or
 * W, a channel range out of bounds, dx overlapping a source; otherwise the
 * errors of the plain backward.  Source: PyTorch nn.BatchNorm2d / nn.SiLU
 * docs (the backward), DECISIONS 33 (the sums). */
lucid_status lucid_nn_batchnorm2d_backward_terms(
    lucid_ctx *ctx, const lucid_tensor *x, int n, const lucid_chan_piece *pieces,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training, double beta_input,
    double beta_params, int silu, int *taken);

/* Whether lucid_nn_batchnorm2d_backward_terms would take a call for this x
 * (training, dx given) with 16-byte aligned sources: *fit 1 or 0, nothing
 * queued.  For callers that choose between producing a description and a
 * copy they can share (lucid/nn/blocks.lua C3).  Errors: ERR_ARG for a NULL
 * x or fit, an x that is not a contiguous float [N, C, H, W]. */
lucid_status lucid_nn_batchnorm2d_terms_fit(lucid_ctx *ctx, const lucid_tensor *x,
                                            int training, int *fit);

/* Test hook: LUCID_BN_DY_TERMS for the whole process.  mode 1: on (the
 * default), 0: off (every call answers *taken = 0), -1: follow the
 * environment again.  Returns the previous override (-1 when none).  Not
 * thread-safe: set it between steps. */
int lucid_nn_bn_dy_terms_override(int mode);

/* 1 when lucid_nn_batchnorm2d_backward_terms may take calls now. */
int lucid_nn_bn_dy_terms_on(void);

/* ------------------------------------------------------------------ SiLU
 * y = x * sigmoid(x);  dx = beta*dx + dy * s * (1 + x*(1-s)), s=sigmoid(x).
 * Any shape (x, y, dy, dx same shape). */
lucid_status lucid_nn_silu_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y);
lucid_status lucid_nn_silu_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dx,
                                    double beta);

/* ------------------------------------------------------------- MaxPool2d
 * x [N,C,H,W] -> y [N,C,H_out,W_out]; window padding is -inf.  Ties: the
 * first maximum in row-major window order wins.  indices (nullable): i32
 * [N,C,H_out,W_out], the flat index h*W+w of the max in its input plane;
 * the backward recomputes the argmax from x when indices is NULL.
 * dx = beta*dx + scatter-add of dy to the argmax positions. */
lucid_status lucid_nn_maxpool2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                        lucid_tensor *y, lucid_tensor *indices,
                                        const lucid_pool2d_params *p);
lucid_status lucid_nn_maxpool2d_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                         const lucid_tensor *dy,
                                         lucid_tensor *dx,
                                         const lucid_tensor *indices,
                                         const lucid_pool2d_params *p,
                                         double beta);

/* ----------------------------------------------------- nearest Upsample
 * x [N,C,H,W] -> y [N,C,H*scale,W*scale], y[..,i,j] = x[..,i/scale,j/scale]
 * (integer scale >= 1; nn.Upsample(scale_factor=2, mode='nearest')).
 * dx[..,i,j] = beta*dx + sum of the scale x scale block of dy. */
lucid_status lucid_nn_upsample_nearest2d_forward(lucid_ctx *ctx,
                                                 const lucid_tensor *x,
                                                 lucid_tensor *y, int scale);
lucid_status lucid_nn_upsample_nearest2d_backward(lucid_ctx *ctx,
                                                  const lucid_tensor *x,
                                                  const lucid_tensor *dy,
                                                  lucid_tensor *dx, int scale,
                                                  double beta);

/* ------------------------------------------------------ channel slices
 * dst [N, C_dst, *S], src [N, C_src, *S] (same N and trailing dims, rank
 * >= 2, both contiguous, dtypes may differ: converted):
 *   dst[:, dst_c0 : dst_c0+nch] = beta*dst[...] + src[:, src_c0 : src_c0+nch]
 * Concat forward = one piece per input (beta 0); Concat backward, Split /
 * Chunk forward and backward are the same primitive with the roles swapped
 * (the modules batch their pieces through lucid_nn_channel_copy_multi
 * below).  Also the backward of Add (nch = C, beta as wanted). */
lucid_status lucid_nn_channel_copy(lucid_ctx *ctx, lucid_tensor *dst,
                                   int64_t dst_c0, const lucid_tensor *src,
                                   int64_t src_c0, int64_t nch, double beta);

/* Several beta-0 channel copies (and zero fills, and rounded sums) in one
 * call — on the GPU one kernel launch per 16 pieces instead of one per
 * piece (Concat and Split forward and backward, and the blocks' fused
 * gradient sums).  For each of the n pieces p (in any order; they must not
 * interfere):
 *   p.dst[:, p.dst_c0 : p.dst_c0+p.nch] = p.src[:, p.src_c0 : p.src_c0+p.nch]
 * or = 0 (all-zero bits) when p.src is NULL, or the rounded left-to-right
 * sum of p.src and its addends p.add[k] (lucid_chan_piece: the bits of
 * a:add(b) chained, one rounding to dst's dtype per addition).  Copies move
 * bits verbatim (NaN payloads included); p.dst outside the named channels
 * is not touched.  Sum sources are read as tensors of dst's dtype: a piece
 * with addends whose src or an addend has another dtype is an error
 * (ERR_ARG), and addends need a src (ERR_ARG).
 * Every dst and src: contiguous, rank >= 2, float dtype, all of one shape
 * outside dim 1 ([N, *, *S]), all on one device; every dst of piece 0's
 * dst dtype.  A src of another dtype is converted as by
 * lucid_nn_channel_copy, which then runs that piece on its own (a launch
 * of its own on the GPU); same-dtype pieces move bits.  n in 0..LUCID_CHAN_PIECES_MAX (0: nothing).  Pieces with nch 0 are
 * skipped.
 * Errors (ERR_ARG, message naming the piece): pieces NULL with n > 0, n out
 * of range, a NULL dst, a non-contiguous tensor, rank < 2, a shape outside
 * dim 1 that differs from piece 0's dst, a dst dtype that differs from
 * piece 0's dst, a tensor on another device, a channel range out of bounds or nch < 0,
 * a piece whose dst region may overlap another piece's dst or any piece's
 * src or addend (same storage: checked per channel range on one tensor,
 * else by extent); ERR_UNSUPPORTED for a non-float dtype (or f64 on the GPU).
 * Route: LUCID_CHAN_COPY_MULTI=0 in the environment (read once per process)
 * or lucid_nn_chan_copy_multi_override(0) runs the pieces one by one as
 * lucid_nn_channel_copy(beta 0) calls (then one beta-1 call per addend:
 * dst = 1*dst + addend, the same one rounding per addition) and
 * lucid_fill(0) of narrowed views: the reference route, same bits. */
lucid_status lucid_nn_channel_copy_multi(lucid_ctx *ctx, int n,
                                         const lucid_chan_piece *pieces);

/* Test hook: route of lucid_nn_channel_copy_multi for the whole process.
 * mode 1: one table call (the default); 0: piece by piece (as
 * LUCID_CHAN_COPY_MULTI=0); -1: follow LUCID_CHAN_COPY_MULTI again.
 * Returns the previous override (-1 when none).  Not thread-safe: set it
 * between steps, never while another thread runs nn calls. */
int lucid_nn_chan_copy_multi_override(int mode);

/* 1 when lucid_nn_channel_copy_multi takes its one-call route now. */
int lucid_nn_chan_copy_multi_on(void);

/* ------------------------------------------------------------------- Add
 * y = a + b (same shape and dtype; y may alias a or b). */
lucid_status lucid_nn_add_forward(lucid_ctx *ctx, const lucid_tensor *a,
                                  const lucid_tensor *b, lucid_tensor *y);

/* n-ary add: y = ((x[0] + x[1]) + x[2]) + ... + x[n-1], each addition in
 * f32 (f64 for f64) rounded to the dtype before the next: the bits of
 * x[0]:add(x[1]):add(x[2])..., in one call (one launch on the GPU: a
 * one-piece lucid_nn_channel_copy_multi over all channels).  n in
 * 1..LUCID_CHAN_SUM_MAX (1: a copy).  Every x[i] and y: one shape (rank
 * >= 2), one float dtype, one device, contiguous; y must not overlap any
 * x[i].  Errors: ERR_ARG (n out of range, a NULL, shape / dtype / device
 * mismatch, overlap, a non-contiguous tensor), ERR_UNSUPPORTED (a
 * non-float dtype, f64 on the GPU). */
lucid_status lucid_nn_add_n(lucid_ctx *ctx, int n, const lucid_tensor *const *x,
                            lucid_tensor *y);

/* ------------------------------------------------ softmax over last dim
 * y = exp(x - max) / sum(exp(x - max)) along the last dim (any rank >= 1).
 * Backward takes the forward OUTPUT y: dx = beta*dx + y*(dy - sum(dy*y)).
 * With lucid_matmul this is the attention of Ultralytics' Attention block. */
lucid_status lucid_nn_softmax_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                      lucid_tensor *y);
lucid_status lucid_nn_softmax_backward(lucid_ctx *ctx, const lucid_tensor *y,
                                       const lucid_tensor *dy,
                                       lucid_tensor *dx, double beta);

/* ------------------------------------------------------------------ DFL
 * x [B, 4*R, *S] -> y [B, 4, *S] (R = reg_max, S any trailing dims, e.g. A
 * anchors): p_k = softmax_k(x[b, j*R + k, s]), y[b,j,s] = sum_k k * p_k
 * (the fixed projection 0..R-1 of Ultralytics DFL).
 * dx[b, j*R+k, s] = beta*dx + dy[b,j,s] * p_k * (k - y[b,j,s]). */
lucid_status lucid_nn_dfl_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                  lucid_tensor *y, int reg_max);
lucid_status lucid_nn_dfl_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                   const lucid_tensor *dy, lucid_tensor *dx,
                                   int reg_max, double beta);

/* ============================================================ parameters */

#define LUCID_PARAM_NAME_MAX 128
#define LUCID_PARAM_ALIGN 16 /* flat offsets are multiples of 16 elements */

typedef enum lucid_param_kind {
    LUCID_PARAM_KIND_PARAM = 0,  /* learnable (has a gradient slot) */
    LUCID_PARAM_KIND_BUFFER = 1  /* state, no gradient (BN running stats) */
} lucid_param_kind;

/* Optimizer group hint (Ultralytics build_optimizer): */
typedef enum lucid_param_group {
    LUCID_PARAM_GROUP_DECAY = 0, /* weights with weight decay (g0) */
    LUCID_PARAM_GROUP_NORM = 1,  /* normalisation weights, no decay (g1) */
    LUCID_PARAM_GROUP_BIAS = 2,  /* biases, no decay (g2) */
    LUCID_PARAM_GROUP_NONE = -1  /* buffers */
} lucid_param_group;

typedef enum lucid_init_kind {
    LUCID_INIT_ZEROS = 0,
    LUCID_INIT_ONES,
    LUCID_INIT_CONSTANT,  /* a */
    LUCID_INIT_UNIFORM,   /* U(a, b) */
    LUCID_INIT_FAN_IN,    /* U(-1/sqrt(fan_in), +1/sqrt(fan_in)): PyTorch's
                             conv weight kaiming_uniform(a=sqrt(5)) and bias */
    LUCID_INIT_ARANGE     /* 0, 1, 2, ... (DFL projection) */
} lucid_init_kind;

typedef struct lucid_init_rule {
    lucid_init_kind kind;
    double a, b;
    int64_t fan_in; /* LUCID_INIT_FAN_IN */
} lucid_init_rule;

/* One declared parameter or buffer.  Fields are read-only for clients;
 * change them through the functions below. */
typedef struct lucid_param {
    char name[LUCID_PARAM_NAME_MAX]; /* reference (state-dict) name */
    lucid_param_kind kind;
    lucid_dtype dtype;      /* f32 entries follow the set's float dtype
                               (f32, or f64 for gradient checks); i64 for
                               counters (num_batches_tracked) */
    int ndim;
    int64_t shape[LUCID_MAX_DIMS];
    int64_t numel;
    int trainable;          /* params: 1 = receives gradients and updates */
    int group;              /* lucid_param_group */
    lucid_init_rule init;
    int index;              /* position in the set (declaration order) */
    int64_t offset;         /* elements from the start of its flat buffer
                               (params: same offset in the gradient buffer);
                               -1 before materialize */
    lucid_tensor *data;     /* view into the flat buffer (NULL before) */
    lucid_tensor *grad;     /* view into the flat gradient buffer; NULL for
                               buffers (and before materialize) */
    uint64_t version;       /* bumped on structural change (trainable flag,
                               replacement, re-init) */
} lucid_param;

typedef struct lucid_param_set lucid_param_set;

lucid_status lucid_param_set_create(lucid_ctx *ctx, lucid_param_set **out);
void lucid_param_set_retain(lucid_param_set *s);
void lucid_param_set_release(lucid_param_set *s);

/* Declare a parameter or buffer (phase 1).  Names must be unique.  dtype
 * LUCID_F32 (float, follows the set) or LUCID_I64 (buffers only).  *out is
 * a pointer that stays valid for the set's lifetime.  ERR_STATE after
 * materialize; ERR_ARG on a duplicate name or bad shape. */
lucid_status lucid_param_set_declare(lucid_ctx *ctx, lucid_param_set *s,
                                     const char *name, lucid_param_kind kind,
                                     lucid_dtype dtype, int ndim,
                                     const int64_t *shape, int trainable,
                                     int group, const lucid_init_rule *init,
                                     lucid_param **out);
/* Phase 2: allocate the flat buffers on dev (float dtype dt: LUCID_F32, or
 * LUCID_F64 on the CPU for gradient checks), point every entry's views into
 * them, zero the gradients and run every init rule in declaration order,
 * drawing from the context generator (lucid_ctx_rng_next). Once only:
 * ERR_STATE on a second call. */
lucid_status lucid_param_set_materialize(lucid_ctx *ctx, lucid_param_set *s,
                                         lucid_device dev, lucid_dtype dt);
/* Phase 2 for a twin: instead of allocating, point every entry of s at the
 * same place in src's flat buffers (parameters, gradients, buffers: src's
 * offsets, shapes and dtypes), retaining them, so a second module tree
 * declared exactly like src's (same names, kinds, dtypes and shapes, in the
 * same order) computes with src's parameters and buffers and accumulates
 * into src's gradients. Nothing is initialised; each entry's trainable flag
 * is copied from src's. s then reports src's device and dtype. For two
 * copies of a network whose activations must not be shared (docs/
 * PIPELINE.md: two steps in flight on two contexts). Errors: ERR_STATE when
 * s is already materialized or src is not; ERR_ARG when s is src, or the
 * declarations differ (the first entry that differs, by position and name,
 * and what differs). The views stay valid while s lives (the flat buffers
 * are retained; src may be released first). What is NOT shared: the entries
 * themselves — each set keeps its own trainable flags (copied once, here)
 * and versions, so a later structural change of src (a frozen or unfrozen
 * parameter, a replaced tensor) is not seen through s: make a new alias
 * after one. Two optimizers or EMAs over src and s would update the same
 * values twice. lucid_param_set_reset refuses an alias (ERR_STATE). */
lucid_status lucid_param_set_alias(lucid_ctx *ctx, lucid_param_set *s,
                                   const lucid_param_set *src);
int lucid_param_set_is_materialized(const lucid_param_set *s);
/* Re-run the init rules (params and buffers; counters to 0). */
lucid_status lucid_param_set_reset(lucid_ctx *ctx, lucid_param_set *s);

int lucid_param_set_count(const lucid_param_set *s);
lucid_param *lucid_param_set_get(const lucid_param_set *s, int i);
lucid_param *lucid_param_set_find(const lucid_param_set *s, const char *name);
/* Element counts: kind PARAM: sum of parameter numels (trainable_only: of
 * trainable ones); kind BUFFER: sum of buffer numels. */
int64_t lucid_param_set_numel(const lucid_param_set *s, lucid_param_kind kind,
                              int trainable_only);
/* The flat buffers (1-D, padded length; NULL before materialize).  The
 * buffers' flat tensor is a byte view (U8) since it mixes dtypes. */
lucid_tensor *lucid_param_set_flat_params(const lucid_param_set *s);
lucid_tensor *lucid_param_set_flat_grads(const lucid_param_set *s);
lucid_tensor *lucid_param_set_flat_buffers(const lucid_param_set *s);
lucid_device lucid_param_set_device(const lucid_param_set *s);
lucid_dtype lucid_param_set_dtype(const lucid_param_set *s);
/* Zero the whole flat gradient buffer (one fill). */
lucid_status lucid_param_set_zero_grad(lucid_ctx *ctx, lucid_param_set *s);
/* Freeze (0) or unfreeze (1) a parameter; bumps its version and the set's. */
lucid_status lucid_param_set_trainable(lucid_ctx *ctx, lucid_param_set *s,
                                       lucid_param *p, int trainable);
/* Mark a structural change of p (e.g. its contents were replaced by a
 * load): bumps p->version and the set's version. */
void lucid_param_bump_version(lucid_param_set *s, lucid_param *p);
/* Sum of all changes; compare to detect drift cheaply. Every bump of a
 * set's version also moves the contract epoch (below). */
uint64_t lucid_param_set_version(const lucid_param_set *s);

/* ======================================================== contract epoch */

/* The contract epoch: one process-wide counter that moves on every change
 * a recorded step (train/graph.h, docs/STEP.md "Contract") must see, other
 * than a module's mode: every version bump of any parameter set (trainable
 * flag, a tensor replaced, values reloaded in place, materialize, reset),
 * and what the Lua library announces through lucid_contract_bump (a model's
 * bump_version / replace_forward, an edit of a module tree, an instance
 * override of a module's forward). A recording
 * keeps the epoch of its last clean check: equal means none of those
 * happened anywhere since. Module modes are watched exactly, per module
 * (lucid_module_watch_modes), so a switch and back moves nothing. Atomic
 * (relaxed): any thread may bump; never decreases. */
uint64_t lucid_contract_epoch(void);
void lucid_contract_bump(void);

/* =============================================================== modules */

typedef struct lucid_module lucid_module;

/* Mode bits of a module: what a recording bakes in of its mode. */
enum { LUCID_MODE_TRAIN = 1u, LUCID_MODE_GRAD_INPUT = 2u };

/* A watcher of one module's mode bits (lucid_module_watch_modes): while
 * linked, every change of the module's bits through the two setters below
 * updates *mismatch, the watcher's count of its modules whose bits differ
 * from `recorded` (+1 when this module's bits leave `recorded`, -1 when
 * they come back). A zero count is an exact, O(1) "every watched module is
 * in its recorded mode" (a switch and back, as around validation, leaves
 * it zero). The node and the counter belong to the watcher; the module
 * must outlive the link (a recording holds a reference on its modules).
 * Not synchronised: a module's setters and its watchers' checks run on one
 * thread at a time (the thread that drives the model). */
typedef struct lucid_mode_watch {
    struct lucid_mode_watch *next; /* the module's list */
    int *mismatch;                 /* the watcher's count */
    unsigned recorded;             /* LUCID_MODE_* bits it expects */
} lucid_mode_watch;

typedef struct lucid_module_vtable {
    const char *kind; /* PyTorch class name: "Conv2d", "BatchNorm2d", ... */
    /* Compute m->outputs[] from in[] (ninputs == m->ninputs). */
    lucid_status (*forward)(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in);
    /* Given the same inputs as the last forward and one gradient per output
     * (NULL entry = zero gradient), compute m->grad_inputs[] (overwritten;
     * skipped when m->need_grad_input == 0) and ACCUMULATE (+=) into the
     * gradient views of trainable parameters. */
    lucid_status (*backward)(lucid_ctx *ctx, lucid_module *m, int nin,
                             const lucid_tensor *const *in, int nout,
                             const lucid_tensor *const *grad_out);
    /* PyTorch-like one-line description: "Conv2d(3, 16, kernel_size=(3, 3),
     * stride=(2, 2), padding=(1, 1), bias=False)". Returns snprintf count. */
    int (*describe)(const lucid_module *m, char *buf, size_t n);
    void (*free_priv)(lucid_module *m); /* nullable */
} lucid_module_vtable;

struct lucid_module {
    const lucid_module_vtable *vt;
    int refcount;
    char name[LUCID_PARAM_NAME_MAX]; /* name prefix, e.g. "model.0.conv" */
    int training;         /* 1 train mode (default), 0 eval */
    int need_grad_input;  /* 0: backward skips grad_inputs (first layer) */
    uint64_t version;     /* bumped on mode / need_grad_input change */
    lucid_param_set *set; /* retained; NULL for parameter-free modules */
    int nparams;          /* params then buffers, in declaration order */
    lucid_param *params[8];
    int ninputs, noutputs;
    lucid_tensor **outputs;     /* (noutputs) persistent, owned */
    lucid_tensor **grad_inputs; /* (ninputs)  persistent, owned */
    lucid_tensor *saved[4];     /* persistent per-kind state (BN stats...) */
    void *priv;                 /* per-kind attributes */
    lucid_mode_watch *watchers; /* lucid_module_watch_modes (NULL: none) */
};

/* Constructors.  Those taking (set, prefix) declare their parameters in set
 * under "<prefix>.weight" etc.; the set must be materialized before the
 * first forward (ERR_STATE otherwise).
 * Conv2d: p < 0 selects Ultralytics autopad (d*(k-1)/2, 'same' for s=1).
 *   weight [c2, c1/g, k, k] init FAN_IN (fan_in = c1/g*k*k), group DECAY;
 *   bias [c2] init FAN_IN, group BIAS (bias != 0 only). */
lucid_status lucid_module_conv2d_create(lucid_ctx *ctx, lucid_param_set *set,
                                        const char *prefix, int c1, int c2,
                                        int k, int s, int p, int d, int g,
                                        int bias, lucid_module **out);
/* BatchNorm2d: weight (ONES, NORM), bias (ZEROS, BIAS), buffers
 * running_mean (ZEROS), running_var (ONES), num_batches_tracked (i64, 0). */
lucid_status lucid_module_batchnorm2d_create(lucid_ctx *ctx,
                                             lucid_param_set *set,
                                             const char *prefix, int c,
                                             double eps, double momentum,
                                             lucid_module **out);
lucid_status lucid_module_silu_create(lucid_ctx *ctx, lucid_module **out);
lucid_status lucid_module_maxpool2d_create(lucid_ctx *ctx, int k, int s,
                                           int p, lucid_module **out);
lucid_status lucid_module_upsample_create(lucid_ctx *ctx, int scale,
                                          lucid_module **out);
/* Concat along channels of ninputs inputs (torch.cat(dim=1)). */
lucid_status lucid_module_concat_create(lucid_ctx *ctx, int ninputs,
                                        lucid_module **out);
/* Split along channels into noutputs pieces of sizes[i] channels
 * (sizes NULL: equal chunks, torch.chunk; sizes must then divide C). */
lucid_status lucid_module_split_create(lucid_ctx *ctx, int noutputs,
                                       const int64_t *sizes,
                                       lucid_module **out);
lucid_status lucid_module_add_create(lucid_ctx *ctx, lucid_module **out);
lucid_status lucid_module_softmax_create(lucid_ctx *ctx, lucid_module **out);
/* out = alpha * op(a) @ op(b) through lucid_matmul (2 inputs). */
lucid_status lucid_module_matmul_create(lucid_ctx *ctx, int trans_a,
                                        int trans_b, double alpha,
                                        lucid_module **out);
/* DFL(reg_max): declares "<prefix>.conv.weight" [1, R, 1, 1] init ARANGE,
 * frozen (trainable 0) — the fixed projection, counted like Ultralytics. */
lucid_status lucid_module_dfl_create(lucid_ctx *ctx, lucid_param_set *set,
                                     const char *prefix, int reg_max,
                                     lucid_module **out);

/* Cast the weights of the given Conv2d modules that can take a cuBLAS
 * route (groups 1 and either kernel 1x1, stride 1, padding 0, dilation 1:
 * the 1x1 GEMM, or a spatial kernel: the im2col GEMM; the backend casts only
 * those its route switches send there) into
 * their weight shadows (lucid_conv_wshadow above) for the activation dtype
 * dt, in one kernel launch, two with the backward's copies on a side stream
 * (lucid_nn_conv2d_cast_shadows): the forward and
 * backward-data of those convs then cast nothing until a weight changes.
 * Other Conv2d modules are skipped; a module of another kind is ERR_ARG;
 * so is n < 0 or a NULL entry.  ERR_STATE before materialize.  Modules on
 * the CPU, dt f32, or LUCID_WCAST_ONCE=0: nothing is queued (LUCID_OK).
 * Call it right before a forward (the Lua model does, Model:forward). */
lucid_status lucid_nn_conv_cast_weights(lucid_ctx *ctx, lucid_module *const *modules,
                                        int n, lucid_dtype dt);

void lucid_module_retain(lucid_module *m);
void lucid_module_release(lucid_module *m);

/* Forward / backward through the vtable with argument checks.  Outputs and
 * grad_inputs stay owned by the module (borrowed pointers; valid until the
 * module is released or an input shape/dtype/device changes). */
lucid_status lucid_module_forward(lucid_ctx *ctx, lucid_module *m, int nin,
                                  const lucid_tensor *const *in);
lucid_status lucid_module_backward(lucid_ctx *ctx, lucid_module *m, int nin,
                                   const lucid_tensor *const *in, int nout,
                                   const lucid_tensor *const *grad_out);
/* Single input/output conveniences; *y / *dx are borrowed. */
lucid_status lucid_module_forward1(lucid_ctx *ctx, lucid_module *m,
                                   const lucid_tensor *x, lucid_tensor **y);
lucid_status lucid_module_backward1(lucid_ctx *ctx, lucid_module *m,
                                    const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor **dx);
/* BatchNorm2d followed by SiLU, fused (lucid_nn_batchnorm2d_silu_*), on a
 * pair of existing modules: bn a BatchNorm2d, act a SiLU (else ERR_ARG).
 * The pair behaves as bn then act would, with each module's own state:
 *   forward: bn's parameters, buffers, mode (bn->training), eps and momentum;
 *     the statistics go to bn's saved tensors and the running stats to its
 *     buffers (as bn's forward); a goes to act's persistent output
 *     (*y = act->outputs[0], borrowed).  bn's output is not written.
 *   backward (after a fused forward with the same x): the input gradient
 *     goes to bn's persistent grad_inputs[0] (*dx, borrowed; NULL and not
 *     computed when bn->need_grad_input == 0), gradients ACCUMULATE into
 *     bn's trainable weight/bias (frozen ones get nothing).  act's grad
 *     input is not written.
 * ERR_STATE before materialize or for a backward before the fused forward;
 * otherwise the errors of the entry points. */
lucid_status lucid_module_batchnorm2d_silu_forward(lucid_ctx *ctx,
                                                   lucid_module *bn,
                                                   lucid_module *act,
                                                   const lucid_tensor *x,
                                                   lucid_tensor **y);
lucid_status lucid_module_batchnorm2d_silu_backward(lucid_ctx *ctx,
                                                    lucid_module *bn,
                                                    lucid_module *act,
                                                    const lucid_tensor *x,
                                                    const lucid_tensor *dy,
                                                    lucid_tensor **dx);
/* The backward of BatchNorm2d module bn (act NULL: as lucid_module_backward
 * after its own forward) or of the fused pair (act a SiLU: as
 * lucid_module_batchnorm2d_silu_backward after the fused forward) with dy
 * given as n pieces (lucid_nn_batchnorm2d_backward_terms): *taken = 1 and
 * the same results (bn's grad input in *dx, borrowed; dweight / dbias
 * accumulated) when the engine takes it; *taken = 0 and nothing done when
 * it does not (bn in eval mode, need_grad_input off, the CPU, multi-part
 * channels, ...): the caller materialises dy and calls the plain backward.
 * Errors: those of lucid_module_batchnorm2d_silu_backward (act given) or of
 * lucid_module_backward on bn (act NULL: ERR_ARG for a module that is not a
 * BatchNorm2d), and of lucid_nn_batchnorm2d_backward_terms. */
lucid_status lucid_module_batchnorm2d_backward_terms(lucid_ctx *ctx, lucid_module *bn,
                                                     lucid_module *act,
                                                     const lucid_tensor *x, int n,
                                                     const lucid_chan_piece *pieces,
                                                     lucid_tensor **dx, int *taken);
/* Whether lucid_module_batchnorm2d_backward_terms would take a call on bn
 * now for input x with 16-byte aligned sources (bn training, its
 * need_grad_input on, lucid_nn_batchnorm2d_terms_fit): *fit 1 or 0. */
lucid_status lucid_module_batchnorm2d_terms_fit(lucid_ctx *ctx, lucid_module *bn,
                                                const lucid_tensor *x, int *fit);
/* The Conv block's backward with the BatchNorm writing the conv's
 * backward-data columns (lucid_conv_dcols above), on modules:
 *   lucid_module_conv2d_dcols_reserve(conv, x, &armed): step 1 for the
 *     next backward of Conv2d module conv (x: the input of its last
 *     forward); the module keeps the reservation; *armed (nullable) = 1
 *     when it was made, 0 otherwise (conv->need_grad_input 0, geometry,
 *     route, device, LUCID_BN_EMIT_COLS=0: the plain calls follow).
 *   lucid_module_batchnorm2d_backward_dcols(bn, act, x, dy, conv, &dx):
 *     step 2: the backward of BatchNorm2d module bn (act NULL: as its
 *     module backward, lucid_module_backward; act a SiLU: the fused pair,
 *     lucid_module_batchnorm2d_silu_backward), with conv's reservation
 *     when it has one; *dx: bn's grad input (NULL when need_grad_input 0).
 *   The conv module's next backward (lucid_module_backward) is step 3: it
 *     uses the columns when step 2 wrote them from the dy it receives.
 *   A forward or backward of conv drops the reservation.
 * ERR_ARG for modules of another kind; otherwise the errors of the plain
 * calls. */
lucid_status lucid_module_conv2d_dcols_reserve(lucid_ctx *ctx, lucid_module *conv,
                                               const lucid_tensor *x, int *armed);
lucid_status lucid_module_batchnorm2d_backward_dcols(lucid_ctx *ctx, lucid_module *bn,
                                                     lucid_module *act,
                                                     const lucid_tensor *x,
                                                     const lucid_tensor *dy,
                                                     lucid_module *conv,
                                                     lucid_tensor **dx);
lucid_tensor *lucid_module_output(const lucid_module *m, int i);
lucid_tensor *lucid_module_grad_input(const lucid_module *m, int i);
/* The persistent buffer m->outputs[i] (grad 0) or m->grad_inputs[i]
 * (grad 1), made to have device dev, dtype dt and shape (ndim, shape)
 * exactly as the module's own passes do: kept when it already has them,
 * else released and replaced by a new uninitialised tensor; *out is the
 * buffer (borrowed).  For callers that compute a module's buffer with
 * another primitive (the Lua blocks' fused sums write their Concat and
 * Split helpers' buffers with lucid_nn_channel_copy_multi): the buffer
 * stays the module's, one per module, pinned and restored by a recording
 * like every module buffer (docs/STEP.md).  Errors: ERR_ARG for i out of
 * range, ndim outside 0..LUCID_MAX_DIMS or a negative size; allocation
 * errors. */
lucid_status lucid_module_ensure_buffer(lucid_ctx *ctx, lucid_module *m, int grad,
                                        int i, lucid_device dev, lucid_dtype dt,
                                        int ndim, const int64_t *shape,
                                        lucid_tensor **out);
const char *lucid_module_kind(const lucid_module *m);
/* train (1) / eval (0); bumps m->version when it changes and updates the
 * module's mode watchers. The only writers of m->training and
 * m->need_grad_input after creation: write the fields through these. */
void lucid_module_set_training(lucid_module *m, int training);
void lucid_module_set_need_grad_input(lucid_module *m, int flag);
/* LUCID_MODE_* bits of m now. */
unsigned lucid_module_mode_bits(const lucid_module *m);
/* Link w into m's watchers, expecting m's bits now (w->recorded is set;
 * w->mismatch must point at the watcher's counter). */
void lucid_module_watch_modes(lucid_module *m, lucid_mode_watch *w);
/* Unlink w (a no-op when it is not linked); the counter is left as is. */
void lucid_module_unwatch_modes(lucid_module *m, lucid_mode_watch *w);
int lucid_module_describe(const lucid_module *m, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_NN_H */
