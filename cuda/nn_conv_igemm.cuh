/*
 * nn_conv_igemm.cuh — lucid's own implicit-GEMM Conv2d kernels (NCHW, bf16 or
 * f16 activations, f32 master weights, f32 accumulation on tensor cores):
 * forward, backward-data and backward-filter, for groups == 1 and any kernel
 * size, stride, padding and dilation.  Used by nn_conv.cu for bf16/f16
 * convolutions (cuDNN stays the f32 route).  See nn_conv_igemm.cu for the
 * GEMM formulations and the numerics.
 *
 * Every function launches on `stream`, allocates nothing, never synchronizes
 * (CUDA-graph capturable) and returns cudaGetLastError() after its launches
 * (cudaErrorInvalidValue for a dtype other than bf16/f16).  Results are
 * bitwise identical run to run: every reduction has a fixed order (tensor-core
 * accumulation in k order within a tile, split-K partials folded by a
 * separate kernel in an order fixed by the split count: sequentially, or
 * for more than 16 splits of the filter gradient by 32 lanes and a fixed
 * shuffle tree).
 */
#ifndef LUCID_CUDA_NN_CONV_IGEMM_CUH
#define LUCID_CUDA_NN_CONV_IGEMM_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include "lucid.h"

/* Geometry: x [N,Cin,H,W], w [Cout,Cin,kh,kw], y [N,Cout,Ho,Wo] (contiguous,
 * groups 1); stride sh,sw, padding ph,pw, dilation dh,dw.  Element counts of
 * every tensor must fit in int32 (checked by lucid_conv_igemm_fits). */
typedef struct lucid_igemm_geom {
    int N, Cin, H, W, Cout, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
} lucid_igemm_geom;

/* 1 when the geometry can run here (all index arithmetic in int32). */
int lucid_conv_igemm_fits(const lucid_igemm_geom *g);

/* Split count of the backward-filter GEMM (a function of the geometry only,
 * so the result and its reduction order never depend on the run) and the
 * f32 scratch it needs in bytes (0 when splits == 1: the kernel writes dw
 * directly). */
int lucid_conv_igemm_wgrad_splits(const lucid_igemm_geom *g);
size_t lucid_conv_igemm_wgrad_scratch(const lucid_igemm_geom *g);

/* Scratch bytes of a pass (0 forward, 1 backward-data, 2 backward-filter):
 * the f32 partials of a split-K GEMM; 0 when the pass is not split.  A
 * function of the geometry only (and of the tensors' 16-byte alignment,
 * which does not change it); reserve it before capturing. */
size_t lucid_conv_igemm_scratch(const lucid_igemm_geom *g, int pass);

/* y = conv(x, w) + b (b may be NULL), one rounding of the f32 sum to dt.
 * scratch: lucid_conv_igemm_scratch(g, 0) bytes (may be NULL when 0): a
 * grid too small for the GPU is split along K, its partials folded in split
 * order by a second kernel. */
cudaError_t lucid_conv_igemm_forward(lucid_dtype dt, const void *x, const float *w,
                                     const float *b, void *y, void *scratch,
                                     const lucid_igemm_geom *g, cudaStream_t stream);

/* dx = beta*dx + conv_transpose(dy, w); beta == 0 never reads dx.
 * scratch: lucid_conv_igemm_scratch(g, 1) bytes (may be NULL when 0). */
cudaError_t lucid_conv_igemm_backward_data(lucid_dtype dt, const void *dy, const float *w,
                                           void *dx, float beta, void *scratch,
                                           const lucid_igemm_geom *g, cudaStream_t stream);

/* dw = beta*dw + sum over (n, ho, wo) of dy * x-patch (f32); scratch holds
 * lucid_conv_igemm_wgrad_scratch(g) bytes (may be NULL when that is 0). */
cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream);

#endif
