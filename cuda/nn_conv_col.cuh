/*
 * nn_conv_col.cuh — convolutions with a spatial kernel (3x3 and any other
 * kh x kw, stride, padding, dilation; groups 1) of bf16/f16 NCHW
 * activations as an explicit im2col buffer and cuBLAS GEMMs: forward,
 * backward-data (stride 1) and backward-filter.  An alternative to the
 * implicit-GEMM kernels of nn_conv_igemm.cu, chosen per process and pass by
 * LUCID_CONV_COL (see lucid_conv_col_switch) and dispatched from nn_conv.cu
 * (ROUTE_COL).  Measured on the H200 (docs/DECISIONS.md 31): GPU time per
 * call 0.30-0.95x the implicit GEMM's on 47 of the network's 48 (shape,
 * pass) pairs it can take (bench/bench_conv_col_cuda.c), the recorded
 * training step 4.318 -> 4.015 ms.
 *
 * Formulation: Caffe's / Torch7's SpatialConvolutionMM.  With K = Cin*kh*kw,
 * P = Ho*Wo and, per image n, the column matrix
 *     col[n] (K x P):  col[n][(ci*kh + r)*kw + q][ho*Wo + wo]
 *                        = x[n][ci][ho*sh - ph + r*dh][wo*sw - pw + q*dw]
 *                          (0 outside the image: the zero padding),
 * the weight w [Cout, Cin, kh, kw] read as the row-major W (Cout x K) and
 * Y[n], dY[n] the row-major [Cout, P] planes of image n:
 *     forward          Y[n] = W . col[n]  (nn_conv_gemm.cuh's 1x1 forward
 *                      with Cin -> K and x -> col)
 *     backward-data    (stride 1 only) the forward of dy with the weight
 *                      flipped and transposed, w'[ci][co][r][q] =
 *                      w[co][ci][kh-1-r][kw-1-q], padding (kh-1)*dh - ph
 *                      (>= 0) and (kw-1)*dw - pw, the same dilation
 *                      (Caffe's DeconvolutionLayer identity): im2col(dy),
 *                      then one GEMM straight into dx.  A strided backward-
 *                      data would need a col2im scatter of f32 columns: an
 *                      implementation of it measured slower than the
 *                      implicit GEMM's stride phases, so strided convs keep
 *                      those for this pass.
 *     backward-filter  dW = sum_n dY[n] . col[n]^T (col recomputed from x,
 *                      or the forward's, kept in a column cache: the
 *                      *_cols entry points below; engine/nn/nn.h
 *                      lucid_conv_wcols;
 *                      lucid_conv_gemm_backward_filter_rows with Cin -> Kr
 *                      and Kout = K: K rounded up to Kr, a multiple of 8,
 *                      with zero rows in col and zero columns in W).
 *
 * Numerics: as nn_conv_gemm.cuh (cuBLAS CUBLAS_COMPUTE_32F, f32
 * accumulation, the weight rounded once to the activation dtype: a shadow
 * or a per-call (padded) cast for the forward, the shadow's flipped copy
 * or a per-call flipped cast for the backward-data).  forward: y =
 * dt(sum over K [+ b]); backward-data: dx = dt(sum over Cout*kh*kw +
 * beta*dx), one rounding each; backward-filter: dw (f32) = beta*dw + the
 * N*S partials (images x chunks of H*W, nn_conv_gemm.cuh) folded in a
 * fixed order (in order up to 8, else a fixed warp tree).  The
 * im2col copy is exact.  Deterministic run to run (fixed GEMMs, fixed sum
 * orders, no atomics); the sums differ in order from the implicit GEMM's,
 * so the bits differ from that route's.
 *
 * Every entry point queues on `stream` (the cuBLAS handle bound to it, with
 * its preset workspace), allocates nothing, never synchronizes (CUDA-graph
 * capturable once a shape's first call has loaded cuBLAS's kernels).
 * Errors set ctx: ERR_UNSUPPORTED for a geometry, dtype or pass that
 * lucid_conv_col_eligible refuses (ERR_ARG for g NULL), else the cuBLAS /
 * launch error.
 */
#ifndef LUCID_CUDA_NN_CONV_COL_CUH
#define LUCID_CUDA_NN_CONV_COL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include "lucid.h"

/* Geometry: x [N,Cin,H,W], w [Cout,Cin,kh,kw], y [N,Cout,Ho,Wo], all
 * contiguous, Ho = (H + 2ph - dh(kh-1) - 1)/sh + 1 (likewise Wo). */
typedef struct lucid_conv_col_geom {
    int64_t N, Cin, H, W, Cout, Ho, Wo;
    int kh, kw, sh, sw, ph, pw, dh, dw;
} lucid_conv_col_geom;

/* Largest column buffer the route takes, in elements (N*Kr*P), and largest
 * set of per-image filter-gradient partials (N*Cout*Kr; the split into
 * chunks keeps N*S*Cout*Kr under it too): 2^26, i.e. 128 MiB of bf16
 * columns and 256 MiB of f32 partials. */
#define LUCID_CONV_COL_MAX_ELEMS ((int64_t)1 << 26)

/* 1 when the route can run pass `pass` (0 forward, 1 backward-data, 2
 * backward-filter) of g in dt: bf16/f16; every size positive and Ho, Wo
 * consistent with the kernel, stride, padding and dilation; P = Ho*Wo a
 * multiple of 8 (16-byte column vectors); K = Cin*kh*kw any (rounded up to
 * Kr, a multiple of 8, inside the route: aligned leading dimensions; with
 * an unaligned K = 27, layer 0's filter gradient, cuBLAS picked a GEMV-like
 * kernel that took 967 us on the H200), unless LUCID_CONV_COL_PAD=0, which
 * requires K % 8 == 0; Cout any; N*Kr*P (the columns) and N*Cout*Kr (the
 * filter gradient's f32 partials) at most LUCID_CONV_COL_MAX_ELEMS, every
 * operand under 2^31 elements; for the backward-data also stride 1 with
 * (kh-1)*dh >= ph, (kw-1)*dw >= pw and the flipped forward (K' =
 * Cout*kh*kw, output H*W) passing the same tests.  0 otherwise (also for g
 * NULL or another pass). */
int lucid_conv_col_eligible(const lucid_conv_col_geom *g, lucid_dtype dt, int pass);

/* LUCID_CONV_COL_PAD, read once per process (lucid_env_zero): 0 when it is
 * "0" (then Cin*kh*kw, and for the backward-data Cout*kh*kw, must itself
 * be a multiple of 8, as before DECISIONS 32; Cout is free either way, so
 * it is not the old routing exactly), else 1: K is rounded up to a
 * multiple of 8 inside the route (zero rows of the columns, zero columns
 * of the weight). */
int lucid_conv_col_pad_switch(void);

/* LUCID_COL_IM2COL, read once per process (lucid_env_zero): 0 when it is
 * "0" (the per-thread im2col kernel col_im2col: 8 columns of one row per
 * thread, 8 scalar loads from global memory), else 1 (unset, empty or any
 * other value): the tiled kernel col_im2col_tiled (one block per image,
 * channel and tile of output positions stages the input rows it reads in
 * shared memory, then writes the kh*kw column rows with 16-byte stores;
 * the same bits).  The tiled kernel falls back to col_im2col by itself
 * when a tile of 8 positions needs more than 48 KB of shared memory
 * (whole padded input rows are staged: W above ~6000 for a 3x3 kernel).
 * LUCID_COL_IM2COL_TILE (read once; a whole number 8..65536, default
 * 2048, rounded down to a multiple of 8) caps its tile, in output
 * positions, for measurements. */
int lucid_conv_col_im2col_switch(void);

/* The passes of the route, as a mask. */
#define LUCID_CONV_COL_F 1 /* forward */
#define LUCID_CONV_COL_D 2 /* backward-data */
#define LUCID_CONV_COL_W 4 /* backward-filter */
#define LUCID_CONV_COL_ALL 7

/* LUCID_CONV_COL, read once per process, as the mask of passes the route
 * takes: unset, empty or "1": all three; "0": none; else a set of the
 * letters f (forward), d (backward-data), w (backward-filter), e.g. "fw";
 * -1 for any other value (nn_conv.cu then fails the conv with ERR_ARG
 * naming it).  *value (nullable) receives the raw value ("" when unset). */
int lucid_conv_col_switch(const char **value);

/* Scratch bytes of a pass (0 forward, 1 backward-data, 2 backward-filter)
 * of an eligible g; bias: the forward has a bias (its f32 product).
 * Regions, each aligned to 256 bytes: forward col (N*Kr*P of dt) + the
 * GEMM's (the weight cast [Cout][Kr] when no shadow is given or K % 8 !=
 * 0, the f32 product with a bias); backward-data the columns of dy
 * (N*Kr'*H*W of dt, Kr' = Cout*kh*kw rounded up to 8) + the flipped
 * weight (Cin*Kr' of dt); backward-filter col + the f32 partials
 * (lucid_conv_gemm_wgrad_scratch with K kept of Kr: N*S*Cout*Kr*4 when
 * N*S > 1 or K < Kr).  0 for a backward-data g that is not eligible. */
size_t lucid_conv_col_scratch(const lucid_conv_col_geom *g, lucid_dtype dt, int pass, int bias);

/* y = conv(x, w) [+ b].  x, y: dt; w, b: f32 (b nullable); wcast
 * (nullable): w already rounded to dt (Cout*K elements, a weight shadow;
 * ignored when K % 8 != 0: the padded weight is cast per call).
 * Launches: im2col, [weight cast,] one strided-batched GEMM [, bias add]. */
lucid_status lucid_conv_col_forward(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                    lucid_dtype dt, const lucid_conv_col_geom *g,
                                    const void *x, const float *w, const void *wcast,
                                    const float *b, void *y, void *scratch);

/* lucid_conv_col_forward with the columns written to `cols` (nullable:
 * into scratch, i.e. lucid_conv_col_forward) instead of the first region
 * of scratch, and read from there by the GEMM: cols holds
 * lucid_conv_col_cols_bytes(g) bytes, 16-byte aligned, and outlives the
 * call (a column cache, engine/nn/nn.h lucid_conv_wcols).  scratch is
 * still lucid_conv_col_scratch(g, dt, 0, b != NULL) bytes, its GEMM region
 * at the same offset (the first region then goes unused).  Same launches
 * and the same bits as lucid_conv_col_forward. */
lucid_status lucid_conv_col_forward_cols(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                         lucid_dtype dt, const lucid_conv_col_geom *g,
                                         const void *x, const float *w, const void *wcast,
                                         const float *b, void *y, void *scratch, void *cols);

/* Bytes of the column matrix of g (N*Kr*Ho*Wo elements of 2 bytes,
 * rounded up to 256): the first region of the forward's and the
 * backward-filter's scratch, and the size of a column cache. */
size_t lucid_conv_col_cols_bytes(const lucid_conv_col_geom *g);

/* Rows per image of the column matrix of g: Cin*kh*kw rounded up to 8. */
int64_t lucid_conv_col_rows(const lucid_conv_col_geom *g);

/* cols = im2col(x) alone (one launch on stream, the kernel the forward and
 * the backward-filter run; counted by lucid_cuda_conv_col_launch_count):
 * a filter gradient's columns queued ahead of it, on a side stream, by a
 * forward that builds none itself (nn_conv.cu, the column cache).  g
 * eligible for pass 2 (else ERR_UNSUPPORTED); cols as for
 * lucid_conv_col_forward_cols. */
lucid_status lucid_conv_col_im2col(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                   const lucid_conv_col_geom *g, const void *x, void *cols);

/* dx = beta*dx + conv_transpose(dy, w) (beta == 0 never reads dx), for a
 * g eligible for pass 1 (stride 1).  wflip (nullable): the flipped weight
 * already in dt ([Cin][lucid_conv_col_wflip_kr(Cout, kh, kw)], a shadow
 * the group cast wrote); NULL casts it into scratch.  Launches: [the
 * flipped weight cast,] im2col(dy), one strided-batched GEMM. */
lucid_status lucid_conv_col_backward_data(lucid_ctx *ctx, cublasHandle_t h,
                                          cudaStream_t stream, lucid_dtype dt,
                                          const lucid_conv_col_geom *g, const void *dy,
                                          const float *w, const void *wflip, void *dx,
                                          float beta, void *scratch);

/* 1 when the backward-data of g in dt can take its columns from the
 * BatchNorm backward before it (nn.h lucid_conv_dcols): eligible for pass
 * 1, a 3x3 kernel, stride 1, padding 1, dilation 1 and Cout*9 a multiple
 * of 8, so the columns of dy are exactly the row-major [Cout*9 x H*W]
 * matrix per image that the BatchNorm writes (no padded rows; H*W a
 * multiple of 8 by eligibility).  0 otherwise (also for g NULL). */
int lucid_conv_col_dcols_geom(const lucid_conv_col_geom *g, lucid_dtype dt);

/* Bytes of those columns: N*Cout*9*H*W elements of 2 bytes. */
size_t lucid_conv_col_dcols_bytes(const lucid_conv_col_geom *g);

/* lucid_conv_col_backward_data with the columns of dy already written
 * (cols: lucid_conv_col_dcols_bytes of them, 16-byte aligned, outside the
 * first lucid_conv_col_scratch(g, dt, 1, 0) bytes of scratch, which the
 * flipped weight's per-call cast may still use): no im2col; the GEMM reads
 * cols.  ERR_UNSUPPORTED unless lucid_conv_col_dcols_geom(g, dt); ERR_ARG
 * for cols NULL. */
lucid_status lucid_conv_col_backward_data_cols(lucid_ctx *ctx, cublasHandle_t h,
                                               cudaStream_t stream, lucid_dtype dt,
                                               const lucid_conv_col_geom *g, const void *cols,
                                               const float *w, const void *wflip, void *dx,
                                               float beta, void *scratch);

/* dw = beta*dw + sum_n dY[n] . col[n]^T (dw f32 [Cout,Cin,kh,kw]; beta == 0
 * never reads dw).  Launches: im2col, then lucid_conv_gemm_backward_filter_rows
 * (nn_conv_gemm.cuh) on the columns with K kept of Kr: min(N, S)
 * strided-batched GEMMs and the ordered fold (one GEMM straight into dw
 * when N*S == 1 and K == Kr). */
lucid_status lucid_conv_col_backward_filter(lucid_ctx *ctx, cublasHandle_t h,
                                            cudaStream_t stream, lucid_dtype dt,
                                            const lucid_conv_col_geom *g, const void *x,
                                            const void *dy, float *dw, float beta,
                                            void *scratch);

/* lucid_conv_col_backward_filter with the columns of x already written
 * (cols: lucid_conv_col_cols_bytes(g) bytes, 16-byte aligned, the bytes
 * the im2col of x writes: a fresh column cache): no im2col, the GEMMs read
 * cols; their partials in scratch at the offset the plain call uses.  The
 * same GEMMs on the same column bytes: the same bits.  ERR_ARG for cols
 * NULL. */
lucid_status lucid_conv_col_backward_filter_cols(lucid_ctx *ctx, cublasHandle_t h,
                                                 cudaStream_t stream, lucid_dtype dt,
                                                 const lucid_conv_col_geom *g, const void *cols,
                                                 const void *dy, float *dw, float beta,
                                                 void *scratch);

/* The flipped, transposed weight of the backward-data (rows of Kr >=
 * Cout*kh*kw elements, Kr a multiple of 8): element i of wf [Cin][Kr] is
 * w[co][ci][kh-1-r][kw-1-q] for i = ci*Kr + (co*kh + r)*kw + q, and +0 in
 * the padding (k >= Cout*kh*kw): the index into w, or -1 for +0.  One
 * definition for the per-call cast (col_wflip) and the group cast of the
 * weight shadows (nn_conv_gemm.cu), so both write the same bits. */
static __host__ __device__ __forceinline__ int64_t lucid_conv_col_wflip_src(
    int64_t i, int Cin, int Cout, int kh, int kw, int Kr) {
    const int KK = kh * kw;
    const int ci = (int)(i / Kr), k = (int)(i - (int64_t)ci * Kr);
    if (k >= Cout * KK) return -1;
    const int co = k / KK, rq = k - co * KK, r = rq / kw, q = rq - r * kw;
    return ((int64_t)co * Cin + ci) * KK + (kh - 1 - r) * kw + (kw - 1 - q);
}

/* Kr of the backward-data's flipped weight: Cout*kh*kw rounded up to 8. */
static inline int64_t lucid_conv_col_wflip_kr(int64_t Cout, int kh, int kw) {
    return (Cout * kh * kw + 7) / 8 * 8;
}

/* im2col launches queued by the calling thread so far (one per forward,
 * backward-data and backward-filter call of the route that builds its
 * columns, and one per lucid_conv_col_im2col), any context, eager or while
 * capturing: a test hook for the route choice and the column cache. */
extern "C" unsigned long lucid_cuda_conv_col_launch_count(void);

/* Per context, lucid_cuda_nn_set_conv_col (nn_common.cuh, nn_table.cu)
 * overrides LUCID_CONV_COL for tests and benchmarks. */

#endif
