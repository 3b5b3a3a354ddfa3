/*
 * nn_conv_dw.cuh — depthwise Conv2d kernels on the GPU (cuda/nn_conv_dw.cu).
 *
 * Depthwise means groups == Cin == Cout == C (channel multiplier 1): output
 * channel c sees only input channel c, weight [C, 1, kh, kw].
 *
 * Layout and dtypes
 *   x, dx [N, C, H, W] and y, dy [N, C, Ho, Wo]: contiguous NCHW, element
 *   type given by `dt` (LUCID_F32, LUCID_BF16 or LUCID_F16; anything else is
 *   ERR_UNSUPPORTED).  w, b and dw are f32 (master parameters): w / dw
 *   [C, 1, kh, kw], b [C] or NULL.  Any alignment is accepted; 16/8-byte
 *   vector accesses are used when the pointers and W allow them.
 *
 * Semantics (f32 arithmetic, one rounding to dt at the store)
 *   forward          y  = conv(x, w) (+ b)                (y is overwritten)
 *   backward-data    dx = beta*dx + conv_transpose(dy, w)  (beta 0: dx not read)
 *   backward-filter  dw = beta*dw + sum_{n,i,j} dy * x     (beta 0: dw not read)
 *   The bias gradient is not computed here (nn_norm_bwd.cu's channel sum).
 *
 * Routes: a tiled shared-memory kernel when kh == kw == K in {3, 5},
 * stride 1, dilation 1, pad (K-1)/2 (same-size output) and the tensors have
 * < 2^30 elements and fit the tile limits; a generic direct kernel (any
 * kernel size, stride, padding, dilation) otherwise.  lucid_conv_dw_tiled()
 * says which one a geometry takes.
 *
 * Deterministic: no float atomics.  The filter gradient is split over
 * (channel, spatial chunk) blocks whose partial sums go to `scratch` and are
 * folded in a fixed order by a second kernel; the partition is a function of
 * the geometry only, so results are bitwise identical run to run (and
 * between GPUs of any size).
 *
 * Capturable: every call only queues kernels on `stream` (a cudaStream_t
 * passed as void *): no allocation, no host synchronisation, no attribute
 * changes.  The backward-filter scratch is the caller's: reserve
 * lucid_conv_dw_wgrad_scratch_bytes(g) bytes (4-byte aligned, 0 means none is
 * needed and scratch may be NULL) before capturing.
 *
 * Errors: lucid_status; the message is left in ctx (ERR_ARG for a geometry
 * whose Ho/Wo do not follow from H/W and the conv parameters, or a scratch
 * that is too small; ERR_UNSUPPORTED for a dtype; ERR_DEVICE for a failed
 * launch).  Usable from C (declarations only; no CUDA headers).
 */
#ifndef LUCID_CUDA_NN_CONV_DW_CUH
#define LUCID_CUDA_NN_CONV_DW_CUH

#include <stddef.h>
#include <stdint.h>

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Geometry of one depthwise conv.  Ho/Wo must equal
 * (H + 2*ph - dh*(kh-1) - 1)/sh + 1 (and likewise for W), both >= 1.
 * N == 0 or C == 0 is accepted (nothing to compute; backward-filter with
 * N == 0 writes dw = beta*dw). */
typedef struct lucid_conv_dw_geom {
    int64_t N, C, H, W, Ho, Wo;
    int kh, kw;   /* kernel */
    int sh, sw;   /* stride */
    int ph, pw;   /* zero padding */
    int dh, dw;   /* dilation */
} lucid_conv_dw_geom;

/* 1 when g takes the tiled fast path in all three passes, 0 when the
 * generic kernels run (information for tests and benchmarks). */
int lucid_conv_dw_tiled(const lucid_conv_dw_geom *g);

/* Scratch bytes lucid_conv_dw_backward_filter needs for g (0: none).  A
 * function of g only (not of the dtype or the device). */
size_t lucid_conv_dw_wgrad_scratch_bytes(const lucid_conv_dw_geom *g);

lucid_status lucid_conv_dw_forward(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                   const lucid_conv_dw_geom *g, const void *x,
                                   const float *w, const float *b, void *y);

lucid_status lucid_conv_dw_backward_data(lucid_ctx *ctx, void *stream,
                                         lucid_dtype dt,
                                         const lucid_conv_dw_geom *g,
                                         const void *dy, const float *w,
                                         void *dx, double beta);

lucid_status lucid_conv_dw_backward_filter(lucid_ctx *ctx, void *stream,
                                           lucid_dtype dt,
                                           const lucid_conv_dw_geom *g,
                                           const void *x, const void *dy,
                                           float *dw, double beta,
                                           void *scratch, size_t scratch_bytes);

#ifdef __cplusplus
}
#endif

#endif /* LUCID_CUDA_NN_CONV_DW_CUH */
