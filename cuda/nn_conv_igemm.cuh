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
 * accumulation in k order within a tile, split-K partials folded in an order
 * fixed by the split count: sequentially, or for more than 16 splits of the
 * filter gradient by 32 lanes and a fixed shuffle tree).  The partials of a
 * split forward / backward-data are folded either inside the conv kernel,
 * across a thread-block cluster of the tile's split blocks (distributed
 * shared memory, sm_90), or by a second kernel: the same operations in the
 * same order, the same bits.
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

/* LUCID_IGEMM_CLUSTER, read once per process: 0 when it is "0" (split
 * forward / backward-data passes write f32 partials to scratch and a second
 * kernel, igemm_reduce_out, folds them: the reference route), else 1 (the
 * cluster fold where it can run).  The callers decide (cuda/nn_conv.cu, per
 * context overridable by lucid_cuda_nn_set_igemm_cluster; bench/conv_lab)
 * and pass it as the `cluster` argument below. */
int lucid_conv_igemm_cluster_switch(void);

/* 1 when a forward (pass 0) or backward-data (pass 1) pass of g in dtype dt
 * is split and, given cluster != 0, takes the cluster route on the current
 * device (2..16 splits; the cluster of S blocks can be scheduled: cc 9.0+,
 * cudaOccupancyMaxActiveClusters >= 1, queried once per device, kernel and
 * S; no allocation, no sync, capture-safe).  Such a pass needs no scratch;
 * every other split pass needs lucid_conv_igemm_scratch(g, pass). */
int lucid_conv_igemm_cluster_route(lucid_dtype dt, const lucid_igemm_geom *g, int pass);

/* y = conv(x, w) + b (b may be NULL), one rounding of the f32 sum to dt.
 * A grid too small for the GPU is split along K into f32 partials, folded in
 * split order (v = p0 + p1 + ... + p[S-1], then + b, one rounding): with
 * cluster != 0 and lucid_conv_igemm_cluster_route(dt, g, 0) inside the conv
 * kernel (one cluster launch; scratch unused, may be NULL), otherwise by a
 * second kernel from scratch: lucid_conv_igemm_scratch(g, 0) bytes (may be
 * NULL when 0).  Both give the same bits. */
cudaError_t lucid_conv_igemm_forward(lucid_dtype dt, const void *x, const float *w,
                                     const float *b, void *y, void *scratch, int cluster,
                                     const lucid_igemm_geom *g, cudaStream_t stream);

/* dx = beta*dx + conv_transpose(dy, w); beta == 0 never reads dx (the
 * fold computes fmaf(beta, dx, sum) on both routes).  scratch and cluster as
 * for the forward (pass 1). */
cudaError_t lucid_conv_igemm_backward_data(lucid_dtype dt, const void *dy, const float *w,
                                           void *dx, float beta, void *scratch, int cluster,
                                           const lucid_igemm_geom *g, cudaStream_t stream);

/* dw = beta*dw + sum over (n, ho, wo) of dy * x-patch (f32); scratch holds
 * lucid_conv_igemm_wgrad_scratch(g) bytes (may be NULL when that is 0). */
cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream);

/* Test hooks (C linkage, for spec/c programs): the split count of a forward
 * (pass 0) or backward-data (pass 1) pass of the geometry given as its 15
 * ints in lucid_igemm_geom's order (1: not split; 0: pass or geometry out
 * of range); the igemm_reduce_out launches (two-kernel route) and the
 * cluster-fold launches queued by the calling thread so far (any stream,
 * eager or captured). */
extern "C" int lucid_conv_igemm_split_count(const int geom[15], int pass);
extern "C" unsigned long lucid_conv_igemm_reduce_count(void);
extern "C" unsigned long lucid_conv_igemm_cluster_count(void);

#endif
