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
 * (cudaErrorInvalidValue for a dtype other than bf16/f16, or a missing or
 * unaligned scratch a pass needs).  Results are bitwise identical run to
 * run: every reduction has a fixed order (tensor-core accumulation in k
 * order within a tile, split-K partials folded by a separate kernel in an
 * order fixed by the split count: sequentially, or for more than 16 splits
 * of the filter gradient by 32 lanes and a fixed shuffle tree; the
 * stride-phase backward-data's k-slices added in slice order inside the
 * block).  No float atomics.
 */
#ifndef LUCID_CUDA_NN_CONV_IGEMM_CUH
#define LUCID_CUDA_NN_CONV_IGEMM_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
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
 * the f32 partials of a split-K GEMM; 0 when the pass is not split; for a
 * backward-data on the stride-phase kernel (below), the per-call
 * transposed weight (Cout*Cin*kh*kw*2 bytes, rounded up to 256), reserved
 * whether or not a call then passes its own.  A function of the geometry
 * and the stride-phase switch only (and of the tensors' 16-byte alignment,
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

/* ---- the stride-phase backward-data kernel (igemm_dgrad_ph, nn_conv_igemm.cu)
 *
 * A strided convolution (sh or sw > 1, dilation 1) whose Cin is a multiple
 * of 8 runs its backward-data on igemm_dgrad_ph unless the switch below is
 * off.  That kernel reads the weight rounded to dt and transposed tap-major,
 *     wt[(tap*Cout + co)*Cin + ci] = dt(w[co][ci][r][q]),  tap = r*kw + q,
 * so that the A operand of a k tile (one tap, 32 output channels, 16 or 64
 * input channels) is rows of contiguous input channels, staged by 16-byte
 * loads.  lucid_conv_igemm_wt_src(i, ...) is the index into w (KCRS, f32)
 * of element i of wt: one definition for the per-call cast of
 * lucid_conv_igemm_backward_data* and the group cast of the weight shadows
 * (nn_conv_gemm.cu), which therefore write the same bits (round to nearest
 * even).  Cin, Cout, KK = kh*kw >= 1; 0 <= i < Cout*Cin*KK. */
static __host__ __device__ __forceinline__ int64_t lucid_conv_igemm_wt_src(int64_t i, int Cin,
                                                                           int Cout, int KK) {
    const int64_t r = i / Cin, ci = i - r * Cin;
    const int64_t tap = r / Cout, co = r - tap * Cout;
    return (co * Cin + ci) * KK + tap;
}

/* Elements of wt (Cout*Cin*kh*kw) that the backward-data of g reads, or 0
 * when its plan does not read one (another kernel, or the switch off).  A
 * function of the geometry and the switch only. */
int64_t lucid_conv_igemm_dgrad_wt_elems(const lucid_igemm_geom *g);

/* lucid_conv_igemm_backward_data with the transposed weight already made:
 * wt (nullable; 16-byte aligned, lucid_conv_igemm_dgrad_wt_elems(g)
 * elements of dt in the layout above, e.g. a weight shadow's copy) is read
 * instead of w.  wt NULL (or unaligned): the pass casts w into the first
 * bytes of scratch (one launch, igemm_wt_cast) and reads that: the same
 * bits.  Ignored when the plan reads no wt.  scratch: as above (the wt
 * region is part of lucid_conv_igemm_scratch(g, 1) either way). */
cudaError_t lucid_conv_igemm_backward_data_wt(lucid_dtype dt, const void *dy, const float *w,
                                              const void *wt, void *dx, float beta,
                                              void *scratch, const lucid_igemm_geom *g,
                                              cudaStream_t stream);

#ifdef __cplusplus
extern "C" {
#endif
/* The switch of the stride-phase kernel: LUCID_DGRAD_PHASE, read once per
 * process ("0": off, the former stride-phase form of igemm_nchw runs, bit
 * for bit as before; unset or anything else: on), unless
 * lucid_conv_igemm_set_dgrad_phase set it (v 0 off, 1 on, -1 back to the
 * environment; a test hook, process-wide: call it outside captures; the
 * scratch a pass needs follows the switch, so reserve after setting it). */
int lucid_conv_igemm_dgrad_phase(void);
void lucid_conv_igemm_set_dgrad_phase(int v);
/* igemm_wt_cast launches (the per-call transposed weight) queued by the
 * calling thread so far, eager or captured: a test hook. */
unsigned long lucid_conv_igemm_wt_cast_count(void);
#ifdef __cplusplus
}
#endif

/* dw = beta*dw + sum over (n, ho, wo) of dy * x-patch (f32); scratch holds
 * lucid_conv_igemm_wgrad_scratch(g) bytes (may be NULL when that is 0). */
cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream);

#endif
