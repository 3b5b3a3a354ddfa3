/*
 * nn_conv_small.cuh — direct Conv2d kernels for 3x3 convolutions with few
 * channels (cuda/nn_conv_small.cu): forward and backward-data.  nn_conv.cu
 * routes an eligible bf16/f16 conv here (ROUTE_SMALL, before the implicit
 * GEMM) unless LUCID_CONV_SMALL=0 or lucid_cuda_nn_set_conv_small says
 * otherwise; the filter gradient (Cin, Cout <= 16) too, unless
 * LUCID_CONV_SMALL_WGRAD=1 (opt-in; else it stays on the im2col / implicit GEMM).
 *
 * Why: on the implicit GEMM (64x64 tensor-core tiles) a conv whose output
 * channels (forward) or input channels (backward-data) number 8..32 wastes
 * most of each tile, and its high-resolution planes make it the slowest
 * kind of conv per byte in the network (H200, Nsight Compute: 3->16 s2
 * 640->320 51 us, 16->32 s2 320->160 54 us, 16->8 and 8->16 at 160x160
 * 51 / 33 us forward, 61 / 38 / 70 us backward-data, for 1.6-13 MB of
 * tensors).  Here every thread accumulates several outputs of several
 * channels in registers from a shared-memory tile, so each input byte is
 * read from global memory about once.
 *
 * Two generations of kernels (LUCID_CONV_SMALL_V, below):
 *   v2 (default): tensor cores (mma.sync m16n8k16 / m16n8k8, f32
 *     accumulation), for the forward (stride 1 or 2) and the stride-1
 *     backward-data whenever the pass's reduced channels (forward Cin,
 *     backward Cout) and output channels (forward Cout, backward Cin) are
 *     both <= 16: layer 0 (3->16 s2) and the 160x160 bottleneck's 16->8 /
 *     8->16 both ways.  A block = 2 output rows x 32..256 columns, one warp
 *     per 32 columns holding all output channels; inputs staged once as
 *     channel-pair words, weights packed once per block in fragment order.
 *   v1: CUDA-core fmaf kernels for every eligible pass (the rest: the
 *     stride-2 backward-data, channel counts over 16).
 *   The layout of both: nn_conv_small.cu.
 *
 * Definitions (the direct convolution, cross-correlation as in PyTorch's
 * torch.nn.Conv2d documentation and Caffe's convolution layer; 3x3 kernel,
 * padding 1, stride s in {1, 2}, zero padding):
 *   forward        y[n][o][i][j]  = b[o] + sum_{c,r,q} w[o][c][r][q] *
 *                                   x[n][c][i*s-1+r][j*s-1+q]
 *   backward-data  dx[n][c][h][v] = beta*dx[n][c][h][v] + sum_{o,r,q}
 *                                   w[o][c][r][q] * dy[n][o][(h+1-r)/s][(v+1-q)/s]
 *                  (only the terms whose divisions are exact and whose dy
 *                  index is inside [0,Ho) x [0,Wo); out-of-range x is 0)
 *
 * Layout and dtypes: x, dx [N, Cin, H, W], y, dy [N, Cout, Ho, Wo]:
 * contiguous NCHW in `dt` (LUCID_BF16 or LUCID_F16; anything else is
 * ERR_UNSUPPORTED).  w [Cout, Cin, 3, 3] and b [Cout] (b may be NULL) are
 * f32 master parameters.  Any alignment is accepted (16-byte loads where
 * the row length and the pointer allow them).
 *
 * Numerics: each weight is rounded to `dt` first (round-to-nearest-even,
 * as the implicit GEMM and the cuBLAS 1x1 route do when staging), so every
 * product is of two `dt` values and exact in f32; the result is rounded
 * once to `dt` (with beta: rnd(fmaf(beta, dx, acc)); beta == 0 never reads
 * dx, so NaN there cannot leak).  Accumulation, in f32, in a fixed order:
 *   v1: one fmaf per product — forward: bias first, then channel c
 *     ascending, then r, then q ascending; backward-data: channel o
 *     ascending, then the 3x3 taps in a fixed order (stride 1: r and q
 *     descending; stride 2: r, q ascending).  The same bits on any GPU.
 *   v2: bias (forward) or 0 first, then one mma per k-step in a fixed
 *     order — kernel row r ascending (backward: of the kernel rotated by
 *     180 degrees), then within r the taps q ascending (Ci <= 4: taps 0,1
 *     together, then tap 2) — each step adding its 16 (Ci 9..16: one tap,
 *     16 channels) or 8 (Ci 5..8: one tap; Ci <= 4: two taps x 4 channels)
 *     products to the accumulator as the tensor core does (its own fixed
 *     internal order, not an fmaf chain).  The same bits on every run of a
 *     GPU generation; another generation may differ.
 * Neither order depends on the tiling, the alignment or the run: results
 * are bitwise identical run to run, eager or captured.  v1, v2 and the
 * implicit GEMM differ in the last bits (other summation orders); all are
 * within the bf16/f16 tolerances of the CPU reference
 * (spec/c/test_conv_small_cuda.c).  v2 pads the reduced channels Ci with
 * zeros to 4, 8 or 16 (zero weights times staged zeros), and when Ci <= 4
 * adds per kernel row a zero-weight tap that reads the row's third tap
 * again: outputs from finite inputs are unaffected; an output whose
 * third-column input is infinite is non-finite either way (NaN here where
 * the plain sum may give +-Inf).
 *
 * Capturable: a call only queues one kernel on `stream` (a cudaStream_t
 * passed as void *): no allocation, no synchronisation, no attribute
 * change (dynamic shared memory stays under 48 KiB), no scratch.
 *
 * Errors: lucid_status with the message in ctx: ERR_ARG for a geometry
 * lucid_conv_small_eligible() refuses or an unknown LUCID_CONV_SMALL_V,
 * ERR_UNSUPPORTED for a dtype other than bf16/f16, ERR_DEVICE for a failed
 * launch.  Nothing is printed.
 * Usable from C (declarations only; no CUDA headers).
 */
#ifndef LUCID_CUDA_NN_CONV_SMALL_CUH
#define LUCID_CUDA_NN_CONV_SMALL_CUH

#include <stddef.h>
#include <stdint.h>

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest Cin * Cout that takes this route.  Tuned on the YOLO11n-pose
 * shapes: 3->16 (48), 16->32 (512), the C3k2 bottlenecks 16->8 / 8->16
 * (128) qualify; the next 3x3 convs (32->32, 64->64, 51->51 ...) do not,
 * and keep the implicit GEMM, whose tensor cores win once both channel
 * counts fill a tile. */
#define LUCID_CONV_SMALL_MAX_CC 512

/* Largest Cin * Cout that the default switch sends to this route
 * (lucid_conv_small_preferred).  Measured on the H200 (Nsight Compute,
 * one forward+backward of YOLO11n-pose at batch 4, 640, bf16, each kernel
 * alone, seventh session): against the implicit GEMM the direct kernels
 * win for 3->16 (layer 0, 51.1 -> 31.0 us) and the 160x160 bottlenecks
 * 16->8 / 8->16 (forward 51.3 -> 20.6 and 32.6 -> 17.5 us, backward-data
 * 61.4 -> 20.6 and 38.2 -> 17.1 us), and lose for the products of 512:
 * 16->32 stride 2 (forward 54.5 -> 60.1 us) and the 80x80 bottlenecks
 * 32->16 / 16->32 (15.9 -> 37.9, 17.5 -> 23.1 us forward, similar
 * backward), where the tensor cores' tile is full enough. */
#define LUCID_CONV_SMALL_PREFER_CC 256

/* Geometry of one convolution (the conv's own view: x [N,Cin,H,W],
 * w [Cout,Cin,kh,kw], y [N,Cout,Ho,Wo]; stride, zero padding, dilation,
 * groups as in lucid_conv2d_params). */
typedef struct lucid_conv_small_geom {
    int64_t N, Cin, H, W, Cout, Ho, Wo;
    int kh, kw;   /* kernel */
    int sh, sw;   /* stride */
    int ph, pw;   /* zero padding */
    int dh, dw;   /* dilation */
    int groups;
} lucid_conv_small_geom;

/* 1 when (g, dt) may run on this route, 0 otherwise.  Host-only; a pure
 * function of its arguments (no device, no environment).  Eligible: dt
 * LUCID_BF16 or LUCID_F16; groups 1; kernel 3x3; dilation 1; stride 1 or 2
 * (the same in both dims); padding 1 in both dims; N, Cin, Cout >= 1;
 * Cin * Cout <= LUCID_CONV_SMALL_MAX_CC; H, W >= 1 and Ho, Wo equal to
 * (H + 2 - 3) / s + 1 (resp. W), i.e. consistent with the parameters; every
 * tensor (x, y) under 2^31 elements (32-bit indices).  Any plane size, any
 * N. */
int lucid_conv_small_eligible(const lucid_conv_small_geom *g, lucid_dtype dt);

/* 1 when an eligible conv is one the default switch routes here:
 * Cin * Cout <= LUCID_CONV_SMALL_PREFER_CC.  Host-only, pure. */
int lucid_conv_small_preferred(const lucid_conv_small_geom *g);

/* The process switch LUCID_CONV_SMALL, read once (the first call):
 * unset, "" or "1": 1 (the route is on); "0": 0 (eligible convs keep the
 * implicit GEMM); any other value: -1, with *value (when not NULL) set to
 * the text, so the caller can name it in an ERR_ARG.  *value is always set
 * when value is not NULL. */
int lucid_conv_small_switch(const char **value);

/* y = conv(x, w) + b (see the definitions above); y is overwritten.
 * x [N,Cin,H,W], y [N,Cout,Ho,Wo] in dt; w [Cout,Cin,3,3] f32; b [Cout]
 * f32 or NULL.  `stream`: the cudaStream_t to queue on. */
lucid_status lucid_conv_small_forward(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                      const lucid_conv_small_geom *g, const void *x,
                                      const float *w, const float *b, void *y);

/* dx = beta*dx + conv_transpose(dy, w) (see the definitions above; beta 0
 * never reads dx).  dy [N,Cout,Ho,Wo], dx [N,Cin,H,W] in dt; w
 * [Cout,Cin,3,3] f32. */
lucid_status lucid_conv_small_backward_data(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                            const lucid_conv_small_geom *g, const void *dy,
                                            const float *w, void *dx, double beta);

/* Kernels launched by this route from the calling thread so far (any
 * context, eager or while capturing): a test hook that tells which route a
 * conv took. */
unsigned long lucid_conv_small_launch_count(void);

/* Of those, the v2 (tensor-core) kernels. */
unsigned long lucid_conv_small_tc_launch_count(void);

/* The kernel generation the entry points use where v2 takes the pass: the
 * one lucid_conv_small_set_version forced, else the process switch
 * LUCID_CONV_SMALL_V, read once (the first call): unset, "" or "2": 2;
 * "1": 1 (v1 for every pass: the A/B switch); any other value: -1, and
 * the entry points return ERR_ARG naming it.  *value (when value is not
 * NULL) is always set to the environment's text. */
int lucid_conv_small_version(const char **value);

/* Force the generation for the whole process: 1 or 2; 0 (or anything
 * else) follows LUCID_CONV_SMALL_V again.  Returns the previous forced
 * value (0: none).  For benchmarks and tests that compare v1 and v2 in one
 * process; thread-safe, but calls already queued keep their kernel. */
int lucid_conv_small_set_version(int v);

/* The kernel generation that pass (0 forward, 1 backward-data) of (g, dt)
 * runs on now: 2 (v2), 1 (v1), or 0 when the route does not take it
 * (lucid_conv_small_eligible refuses, or pass is neither 0 nor 1).
 * Host-only; follows lucid_conv_small_version (-1 there reads as 1 here). */
int lucid_conv_small_kernel(const lucid_conv_small_geom *g, lucid_dtype dt, int pass);

/* ---- filter gradient -------------------------------------------------
 *
 *   dw[o][c][r][q] = beta*dw[o][c][r][q] + sum_{n,i,j} dy[n][o][i][j] *
 *                    x[n][c][i*s-1+r][j*s-1+q]
 *   (out-of-range x is 0; beta 0 never reads dw, so NaN there cannot leak)
 *
 * the weight gradient of torch.nn.Conv2d (the correlation of x with dy,
 * e.g. Dumoulin & Visin, "A guide to convolution arithmetic", and Caffe's
 * ConvolutionLayer::Backward_cpu weight_cpu_gemm).  x [N,Cin,H,W], dy
 * [N,Cout,Ho,Wo] in dt (bf16/f16, any alignment); dw [Cout,Cin,3,3] f32.
 * The bias gradient is not here (nn_conv.cu sums dy per channel).
 *
 * Two kernels (nn_conv_small.cu, section "filter gradient"): blocks over
 * (spatial splits of the output tiles, chunks of <= 4 input channels), each
 * thread summing the 4 x chunk x 9 products of its outputs in f32 (fmaf),
 * the block's partial sums written to `scratch`, then a fold kernel adding
 * the splits in a fixed order.  Every order is a function of the geometry
 * only: bitwise identical run to run, eager or captured, on every GPU (f32
 * fmaf and adds, no tensor core, no atomics).  The order differs from the
 * im2col / implicit-GEMM routes' (other bits, within the same tolerance).
 *
 * Capturable once `scratch` is reserved: a call queues two kernels on
 * `stream`, nothing else. */

/* 1 when the filter gradient of (g, dt) may run here:
 * lucid_conv_small_eligible and Cin, Cout <= 16.  Host-only, pure. */
int lucid_conv_small_wgrad_eligible(const lucid_conv_small_geom *g, lucid_dtype dt);

/* Scratch bytes lucid_conv_small_backward_filter needs for g (f32 partial
 * sums: splits x Cout*Cin*9; layer 0 at batch 4, 640: 356 x 432 x 4 =
 * 615 KB); 0 when g is not eligible.  A function of the geometry only. */
size_t lucid_conv_small_wgrad_scratch(const lucid_conv_small_geom *g);

/* The switch LUCID_CONV_SMALL_WGRAD, read once: 1 when it is "1" (every
 * eligible conv), 2 when it is "2" (only those with Cin <= 4: layer 0, the
 * end of the step's critical path; the 160x160 bottlenecks' filter
 * gradients, on the parameter lanes, stay where they were), else 0 (the
 * default: the filter gradient of small-route convs keeps the im2col /
 * implicit-GEMM route).  Opt-in because the recorded step was slower with
 * it on the H200 (session 12, call 5: 3.742 / 3.676 ms on, 3.509 off, one
 * fit each; the 160x160 bottlenecks' filter gradients, on the lanes, were
 * not measured alone). */
int lucid_conv_small_wgrad_switch(void);

/* dw = beta*dw + the filter gradient (above).  scratch: at least
 * lucid_conv_small_wgrad_scratch(g) bytes, 4-byte aligned, not used by
 * anything else until the two kernels ran.  ERR_ARG for a geometry
 * lucid_conv_small_wgrad_eligible refuses, NULL x / dy / dw or too small
 * a scratch; ERR_UNSUPPORTED for a dtype other than bf16/f16; ERR_DEVICE
 * for a failed launch. */
lucid_status lucid_conv_small_backward_filter(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                              const lucid_conv_small_geom *g, const void *x,
                                              const void *dy, float *dw, double beta,
                                              void *scratch, size_t scratch_bytes);

/* Kernels the filter gradient launched from the calling thread so far (2
 * per call; also counted in lucid_conv_small_launch_count). */
unsigned long lucid_conv_small_wgrad_launch_count(void);

#ifdef __cplusplus
}
#endif

#endif /* LUCID_CUDA_NN_CONV_SMALL_CUH */
