/*
 * nn_conv_gemm.cuh — 1x1 convolutions (groups 1, stride 1, no padding,
 * dilation 1) of bf16/f16 NCHW activations as cuBLAS GEMMs: forward,
 * backward-data and backward-filter.  An alternative to the implicit-GEMM
 * kernels of nn_conv_igemm.cu for that case, chosen per process by
 * LUCID_CONV1X1 (see lucid_conv1x1_switch) and dispatched from nn_conv.cu.
 *
 * Formulation: the im2col GEMM of Caffe's / Torch7's SpatialConvolutionMM
 * with a 1x1 kernel, where im2col is the identity: per image n,
 *     forward          Y[n]  (Cout x HW) = W   (Cout x Cin) . X[n]  (Cin x HW)
 *     backward-data    dX[n] (Cin x HW)  = W^T (Cin x Cout) . dY[n] (Cout x HW)
 *     backward-filter  dW    (Cout x Cin) = sum_n dY[n] (Cout x HW) . X[n]^T
 * with X[n], Y[n] the row-major [C, H*W] planes of image n (NCHW).
 *
 * Numerics: cublasGemmStridedBatchedEx, compute type CUBLAS_COMPUTE_32F
 * (f32 accumulation; the handle's math mode forbids reduced-precision
 * reductions), operands in the activation dtype.  The f32 master weight is
 * rounded once to the activation dtype (into scratch) before the forward and
 * backward-data GEMMs, as the implicit-GEMM kernels round it when staging;
 * the _wc variants take it already rounded (nn_conv.cu passes a Conv2d's
 * persistent weight shadow, engine/nn/nn.h lucid_conv_wshadow, cast once
 * per weight change by lucid_conv_gemm_cast_weight or, for a whole model in
 * one launch, lucid_conv_gemm_cast_group: the same rounding, so the same
 * bits; LUCID_WCAST_ONCE=0 restores a cast per call).
 * Outputs are rounded once: y = dt(acc [+ b]), dx = dt(acc + beta*dx),
 * dw (f32) = beta*dw + acc.
 *
 * Engine symbols used: lucid_seterr, lucid_dtype_name, lucid_cuda_err,
 * lucid_cublas_err, lucid_pdl_for_stream (bench/conv_lab defines its own).
 *
 * Every function queues on `stream` (the cuBLAS handle must be bound to it
 * and own a preset workspace: nn_conv.cu uses the context's handle, see
 * backend.cu), allocates nothing, never synchronizes (CUDA-graph
 * capturable after the first call of a shape has loaded cuBLAS's kernels)
 * and is bitwise deterministic run to run for one shape, dtype and pointer
 * alignment on one GPU (cuBLAS picks its kernel from those, and the context's
 * handle never uses atomics; the image sum of the filter gradient has a
 * fixed order, see lucid_conv_gemm_backward_filter).  Errors set ctx and
 * return ERR_UNSUPPORTED (dtype other than bf16/f16, or a geometry outside
 * lucid_conv_gemm_fits), or the cuBLAS / launch error (ERR_DEVICE).
 */
#ifndef LUCID_CUDA_NN_CONV_GEMM_CUH
#define LUCID_CUDA_NN_CONV_GEMM_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include "lucid.h"

/* Geometry: x [N,Cin,H,W], w [Cout,Cin,1,1], y [N,Cout,H,W], contiguous;
 * HW = H*W. */
typedef struct lucid_conv_gemm_geom {
    int64_t N, Cin, Cout, HW;
} lucid_conv_gemm_geom;

/* 1 when the geometry fits cuBLAS's 32-bit sizes (N, Cin, Cout, HW, all
 * positive and <= INT_MAX). */
int lucid_conv_gemm_fits(const lucid_conv_gemm_geom *g);

/* The process's 1x1 route switch, from LUCID_CONV1X1 read once per process
 * (thread-safe): 2 auto (unset, "" or "auto": cuBLAS for the convs that
 * lucid_conv_gemm_preferred accepts, the implicit GEMM for the others;
 * DECISIONS 26), 1 cuBLAS GEMM for every 1x1 conv ("gemm": the default of
 * DECISIONS 23), 0 implicit GEMM ("igemm"), -1 any other value (nn_conv.cu
 * then fails eligible convs with ERR_ARG naming the variable).  *value (may
 * be NULL) receives the value read (a copy, "" when unset). */
int lucid_conv1x1_switch(const char **value);

/* 1 when the auto switch sends this 1x1 conv to cuBLAS: Cin and Cout both
 * multiples of 8, so every GEMM operand row is a whole number of 16-byte
 * vectors.  With other channel counts (the pose head's 51 keypoint
 * channels, the 1-class score conv) cuBLAS picked sm75-era kernels on the
 * H200, up to 10x slower than the implicit GEMM for the same pass
 * (bench/conv_lab, DECISIONS 26). */
int lucid_conv_gemm_preferred(const lucid_conv_gemm_geom *g);

/* Scratch bytes of a pass (0 forward, 1 backward-data, 2 backward-filter):
 *   forward          the weight in dt, plus (bias only) the f32 GEMM output
 *                    N*Cout*HW*4 that the bias is added to before rounding;
 *   backward-data    the weight in dt;
 *   backward-filter  the f32 partials, lucid_conv_gemm_wgrad_scratch(g, Cin).
 * Sub-regions are 256-byte aligned.  A function of the geometry only. */
size_t lucid_conv_gemm_scratch(const lucid_conv_gemm_geom *g, lucid_dtype dt, int pass,
                               int bias);

/* y = conv1x1(x, w) + b (b may be NULL).  x, y in dt; w [Cout,Cin], b [Cout]
 * f32.  Launches: weight cast, GEMM (one strided-batched call over the N
 * images, W broadcast with stride 0), and with b an f32 -> dt bias kernel.
 * scratch: lucid_conv_gemm_scratch(g, dt, 0, b != NULL) bytes. */
lucid_status lucid_conv_gemm_forward(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                     lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                     const void *x, const float *w, const float *b, void *y,
                                     void *scratch);

/* dx = beta*dx + W^T . dy per image (dt); beta == 0 never reads dx (cuBLAS's
 * beta contract).  Launches: weight cast, GEMM.  scratch:
 * lucid_conv_gemm_scratch(g, dt, 1, 0) bytes. */
lucid_status lucid_conv_gemm_backward_data(lucid_ctx *ctx, cublasHandle_t h,
                                           cudaStream_t stream, lucid_dtype dt,
                                           const lucid_conv_gemm_geom *g, const void *dy,
                                           const float *w, void *dx, float beta,
                                           void *scratch);

/* The two calls above with the weight already rounded to dt: wc (device,
 * Cout*Cin elements of dt, the bits lucid_conv_gemm_cast_weight or
 * lucid_conv_gemm_cast_group write for w) is multiplied instead, and no
 * cast is launched; wc NULL casts w into scratch as above (w is then read,
 * else ignored).  Outputs are bitwise those of the calls above for the same
 * w.  scratch: the same sizes (the weight region is left unused with wc). */
lucid_status lucid_conv_gemm_forward_wc(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                        lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                        const void *x, const float *w, const void *wc,
                                        const float *b, void *y, void *scratch);
lucid_status lucid_conv_gemm_backward_data_wc(lucid_ctx *ctx, cublasHandle_t h,
                                              cudaStream_t stream, lucid_dtype dt,
                                              const lucid_conv_gemm_geom *g, const void *dy,
                                              const float *w, const void *wc, void *dx,
                                              float beta, void *scratch);

/* dst[i] = dt(w[i]) for i < n (round to nearest even), one launch on
 * stream: the cast the two calls above make into scratch.  ERR_UNSUPPORTED
 * for dt other than bf16/f16, ERR_DEVICE on a launch error. */
lucid_status lucid_conv_gemm_cast_weight(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                         const float *w, void *dst, int64_t n);

/* One weight of a group cast: dst[i] = dt(src[i]) for i < count; or, with
 * flip[4] > 0, the im2col route's flipped weight of a [Cout=flip[1],
 * Cin=flip[0], kh=flip[2], kw=flip[3]] weight with rows of Kr=flip[4]:
 * dst[i] = dt(src[lucid_conv_col_wflip_src(i, ...)]) (+0 for -1), count =
 * Cin*Kr (nn_conv_col.cuh); or, with wt[0] > 0, the stride-phase
 * backward-data's transposed weight of a [Cout=wt[1], Cin=wt[0], kh*kw =
 * wt[2]] weight: dst[i] = dt(src[lucid_conv_igemm_wt_src(i, Cin, Cout,
 * KK)]), count = Cout*Cin*KK (nn_conv_igemm.cuh). */
typedef struct lucid_conv_gemm_cast_item {
    const float *src;
    void *dst;
    int64_t count;
    int flip[5]; /* Cin, Cout, kh, kw, Kr; all 0: a plain cast */
    int wt[3];   /* Cin, Cout, kh*kw; all 0: not the transposed weight */
} lucid_conv_gemm_cast_item;

/* Items per launch of lucid_conv_gemm_cast_group (the table travels by
 * value in the kernel parameters: about 6 KiB, within the 32,764 bytes
 * CUDA 12.1+ allows on Volta and newer).  YOLO11n-pose has 122 items (42
 * 1x1 weights, 37 spatial weights with their flipped copies, the 6
 * stride-2 ones' transposed weights): one launch, or two when nn_conv.cu
 * queues the 43 copies on the cast lane (LUCID_WCAST_SIDE). */
#define LUCID_CONV_GEMM_CAST_GROUP 128

/* The casts of n items (count >= 0; the buffers must not overlap) in
 * ceil(n / LUCID_CONV_GEMM_CAST_GROUP) launches on stream (none for n 0),
 * each element rounded exactly as lucid_conv_gemm_cast_weight rounds it
 * (a transposed weight with kh*kw <= 1024 is staged through shared memory,
 * f32 unchanged, so that its reads and writes are coalesced).
 * Errors: as lucid_conv_gemm_cast_weight; ERR_ARG for n < 0, a negative
 * count or a count above 2^40 elements. */
lucid_status lucid_conv_gemm_cast_group(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                        const lucid_conv_gemm_cast_item *items, int n);

/* The process's switch of the weight shadows (engine/nn/nn.h
 * lucid_conv_wshadow), from LUCID_WCAST_ONCE read once per process
 * (lucid_env_zero): 0 when it is "0" (every GEMM forward / backward-data casts
 * its weight into scratch, shadows are ignored), else 1 (the default). */
int lucid_wcast_once_switch(void);

/* The process's switch of where the group cast queues the flipped and
 * transposed copies (nn_conv.cu, lucid_cuda_conv2d_cast_shadows), from
 * LUCID_WCAST_SIDE read once per process (lucid_env_zero): 0 when it is
 * "0" (one launch with the plain casts on the current stream), else 1 (the
 * default: a second launch on the cast lane, lane.cu). */
int lucid_wcast_side_switch(void);

/* With the cast lane on (lucid_wcast_side_switch), whether the plain casts
 * go there too, ahead of the gathering items, their readers waiting for a
 * mark after them (lucid_cuda_cast_lane_mark_plain / _wait_plain, lane.cu),
 * so that the forward's first convs run beside the cast: 1 (default)
 * unless LUCID_WCAST_PLAIN_SIDE is "0" (read once per process; the plain
 * casts then stay on the current stream ahead of the forward). */
int lucid_wcast_plain_side_switch(void);

/* Weight-cast launches of this file (the per-call cast and each group-cast
 * launch) queued by the calling thread so far, any context, eager or while
 * capturing: a test hook for the shadow routes. */
extern "C" unsigned long lucid_cuda_wcast_launch_count(void);

/* dw = beta*dw + sum_n dY[n] . X[n]^T (dw f32 [Cout,Cin]); beta == 0 never
 * reads dw.  NCHW interleaves the images along the reduction (n, hw), so the
 * sum over images is not one GEMM.  The reduction of each image is also cut
 * into S chunks of P/S columns (lucid_conv_gemm_wgrad_splits): cuBLAS gives
 * a filter gradient with few output tiles (Cin*Cout small) one tile per
 * CTA over the whole reduction, e.g. 48 CTAs over 25600 columns for a
 * 16->32 3x3 conv at 160x160, 156 us of the H200's replay (DECISIONS 32).
 * N == 1 and S == 1 is one GEMM straight into dw (beta applied by cuBLAS);
 * otherwise the N*S products (partial j = n*S + s: image n, columns
 * [s*P/S, (s+1)*P/S)) go to f32 partials, from one pointer-array batched
 * GEMM (cublasGemmBatchedEx; a small kernel writes the 3*N*S operand
 * pointers into the scratch first) when N > 1 and S > 1, else from one
 * strided-batched GEMM; LUCID_WGRAD_PTRS=0 takes min(N, S) strided-batched
 * GEMMs (batched over the larger of the two) instead, e.g. layer 0's four
 * 9 us launches at the end of the H200's critical path; then one kernel folds them
 * in order j, dw[i] = beta*dw[i] + (((p0 + p1) + p2) + ...) for up to 8
 * partials, else one warp per element (lane l adds partials l, l+32, ...
 * in order, then a fixed shuffle tree: layer 0's 256 partials took 21 us
 * serially on the H200's critical path).  scratch:
 * lucid_conv_gemm_scratch(g, dt, 2, 0) bytes (may be NULL when it is 0). */
lucid_status lucid_conv_gemm_backward_filter(lucid_ctx *ctx, cublasHandle_t h,
                                             cudaStream_t stream, lucid_dtype dt,
                                             const lucid_conv_gemm_geom *g, const void *x,
                                             const void *dy, float *dw, float beta,
                                             void *scratch);

/* The filter gradient above for an X whose rows beyond the first Kout are
 * padding (nn_conv_col.cu's columns, K rounded up to 8; g->Cin = the
 * padded row count, Kout <= g->Cin): the products are [Cout, g->Cin], dw is
 * [Cout, Kout] and only its columns are folded (always through the
 * partials when Kout < g->Cin).  scratch: lucid_conv_gemm_wgrad_scratch(g,
 * Kout) bytes.  ERR_ARG for Kout outside 1 .. g->Cin. */
lucid_status lucid_conv_gemm_backward_filter_rows(lucid_ctx *ctx, cublasHandle_t h,
                                                  cudaStream_t stream, lucid_dtype dt,
                                                  const lucid_conv_gemm_geom *g, int64_t Kout,
                                                  const void *x, const void *dy, float *dw,
                                                  float beta, void *scratch);

/* Bytes of the filter gradient's f32 partials: N*S*Cout*Cin*4 (256-byte
 * aligned) when N*S > 1 or Kout < Cin, else 0; plus 3*N*S pointers
 * (aligned) when the pointer-array GEMM runs (N > 1, S > 1,
 * lucid_conv_gemm_wgrad_ptrs_switch). */
size_t lucid_conv_gemm_wgrad_scratch(const lucid_conv_gemm_geom *g, int64_t Kout);

/* S, the chunks each image's reduction is cut into (a power of two <= 64):
 * doubled while P is a multiple of 16*S (chunks stay multiples of 8
 * columns), the chunks keep at least L columns each and the partials
 * N*S*Cout*Cin at most 2^26 floats.  L from LUCID_WGRAD_SPLIT (read once
 * per process: unset or empty 1600; "0" no split; another positive
 * integer; anything else: -1, and the filter gradient fails with ERR_ARG
 * naming the value). */
int64_t lucid_conv_gemm_wgrad_splits(const lucid_conv_gemm_geom *g);

/* The LUCID_WGRAD_PTRS switch (read once per process; "0" off, anything
 * else or unset on): see lucid_conv_gemm_backward_filter. */
int lucid_conv_gemm_wgrad_ptrs_switch(void);

/* Per context, lucid_cuda_nn_set_conv1x1 (nn_common.cuh, nn_table.cu)
 * overrides the LUCID_CONV1X1 switch for tests and benchmarks, and
 * lucid_cuda_nn_set_wcast (nn_conv.cu) the LUCID_WCAST_ONCE switch. */

#endif
