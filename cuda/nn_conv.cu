/*
 * nn_conv.cu — Conv2d on the GPU: forward, backward-data, backward-weight/
 * bias.  Routes (conv_route): bf16/f16 with groups 1 run lucid's own
 * implicit-GEMM tensor-core kernels (nn_conv_igemm.cu: no planning, no
 * per-shape warm-up, 3.5x less conv time per step than cuDNN's legacy API
 * on this network, bench/conv_lab); f32 and grouped convolutions go to cuDNN
 * (legacy convolution API); depthwise to nn_conv_dw.cu.  bf16/f16 1x1
 * convs with stride 1, no padding and dilation 1 take cuBLAS GEMMs instead
 * (nn_conv_gemm.cu) when their channel counts are multiples of 8
 * (LUCID_CONV1X1=auto, the default: DECISIONS 23 and 26; =gemm for every
 * 1x1 conv, =igemm for none; lucid_cuda_nn_set_conv1x1 overrides it per
 * context).  bf16/f16 3x3 convs with few channels (Cin*Cout <= 512, stride
 * 1 or 2, pad 1: nn_conv_small.cuh) run the direct kernels of
 * nn_conv_small.cu for the forward and backward-data passes (ROUTE_SMALL;
 * LUCID_CONV_SMALL=0 or lucid_cuda_nn_set_conv_small restores the implicit
 * GEMM), and for the filter gradient when Cin, Cout <= 16 (a direct
 * split-and-fold reduction, opt-in with LUCID_CONV_SMALL_WGRAD=1; else the next
 * routes: im2col or the implicit GEMM).  bf16/f16 convs with a spatial kernel whose Ho*Wo is a
 * multiple of 8 take im2col + cuBLAS GEMMs (nn_conv_col.cu, ROUTE_COL; K =
 * Cin*kh*kw padded to 8 inside the route) for the forward, the
 * backward-filter and the stride-1 backward-data (LUCID_CONV_COL, default
 * every pass; lucid_cuda_nn_set_conv_col per context); the rest stays on
 * the implicit GEMM.
 *
 * Weight shadows (nn.h lucid_conv_wshadow; the *_shadow slots and
 * conv2d_cast_shadows): the cuBLAS routes' forward and backward-data (1x1
 * GEMM; im2col forward with K % 8 == 0) multiply by the weight rounded to
 * the activation dtype; given a shadow
 * that is fresh (same weight storage, version, dtype and device epoch
 * st->shadow_epoch, which graph.cu moves at capture begin / end and graph
 * launch, except around a capture that keeps the shadows: common.cuh) they
 * read it and cast nothing, else they cast into it (one launch, as the
 * per-call route; counted in st->shadow_casts) and mark it.  lucid_cuda_conv2d_cast_shadows casts
 * a list of weights (those the 1x1 switch or the im2col switch sends to
 * cuBLAS) in one launch, and for a spatial weight with the im2col
 * backward-data on also its flipped, transposed copy after it in the same
 * buffer (flip_off, flip_shape), which that pass reads instead of its
 * per-call col_wflip when the shadow is fresh and the shape matches.
 * Likewise the stride-phase backward-data of the implicit GEMM
 * (nn_conv_igemm.cuh, igemm_dgrad_ph: strided convs with Cin % 8 == 0)
 * reads a transposed copy (lucid_conv_igemm_wt_src) at phase_off: its
 * first call through a shadow marks the shadow (want_phase) and casts per
 * call into the scratch; from then on the group cast writes the copy with
 * the weight (one launch in all), and the pass casts nothing while the
 * shadow is fresh.  Same bits either way.
 * The flipped and transposed copies ("gathering" items: strided reads of
 * the f32 weight) are read by the backward-data only, so the group cast
 * queues them as a launch of their own on the cast lane (lane.cu), a
 * low-priority side stream forked from the current stream where the group
 * cast is called (the one launch took 46 us at the head of the H200's
 * recorded forward, 19 us before the transposed copies joined it: session
 * 11; DECISIONS 36).  The plain casts the forward reads go first on the
 * same lane, followed by a mark that their readers wait for
 * (lucid_cuda_cast_lane_mark_plain / _wait_plain), so the forward's first
 * convs, which read no shadow, run beside the whole cast;
 * LUCID_WCAST_PLAIN_SIDE=0 keeps them in a launch on the current stream.
 * Every reader joins the lane first: a backward-data that takes a flipped
 * or transposed copy from a shadow makes its stream wait for the lane
 * (lucid_cuda_cast_lane_join: an event, a graph edge under capture;
 * nothing once the compute stream has waited), and so does every cast into
 * a shadow buffer on the current stream (shadow_take, the next group cast:
 * a buffer reused for another shape overlaps the old copies); shadow_take
 * makes a reader of a fresh plain shadow wait for the mark.  The shadow
 * marks are made when the launches are queued, as before: a copy is
 * "fresh" once queued, and its readers wait for it.  LUCID_WCAST_SIDE=0 /
 * lucid_cuda_nn_set_wcast_side(ctx, 1) queue the whole group in one launch
 * on the current stream (the gathering items first), as before.
 * A shadow's buffer is allocated on first use outside stream capture and
 * never replaced (a recorded graph may read it); without one, or with
 * LUCID_WCAST_ONCE=0 / lucid_cuda_nn_set_wcast(ctx, 1), the GEMM casts
 * into scratch per call.  Same bits either way.
 *
 * Column caches (nn.h lucid_conv_wcols, nn_conv_wcols.cuh; DECISIONS 38;
 * the *_cols slots): a forward on the im2col route given a cache writes
 * its columns there instead of the stream's scratch when the conv's filter
 * gradient takes the im2col route too, and the filter gradient reads them
 * back instead of running its own im2col when they are fresh for its x
 * (same bytes, same GEMMs: same bits).  A forward on another route (layer
 * 0 and the 160x160 bottlenecks: the small-channel kernels) given a cache
 * queues the im2col of x on the cols lane (lane.cu, low priority, forked
 * where the forward is called) when the mode allows it (LUCID_WCOLS: for
 * x_stable convs, or all), so the backward's filter gradient waits for an
 * event and runs its GEMMs only: layer 0's 30 us im2col (H200 replay)
 * leaves the end of the step's critical path.  LUCID_WCOLS=0 /
 * lucid_cuda_nn_set_wcols(ctx, 1): every call as before.
 *
 * Contract (nn.h): x [N,Cin,H,W], y/dy [N,Cout,Ho,Wo], dx like x: contiguous
 * f32/bf16/f16; w, b, dw, db f32 (master parameters).  forward overwrites
 * y; dx = beta*dx + ...; dw = beta*dw + ..., db = beta*db + ... (beta 0
 * never reads the destination; cuDNN documents the same for its beta).
 *
 * Precision: f32 runs with CUDNN_FMA_MATH (no TF32: agrees with the CPU to
 * ~1e-6).  bf16/f16 run with f32 accumulation (compute type FLOAT); the f32
 * weights are cast to the activation dtype into the nn arena before the
 * forward and backward-data calls, and the weight gradient comes out of
 * cuDNN in the activation dtype (beta 0, arena) and is added to the f32 dw
 * by a kernel (dw = beta*dw + float(tmp)).  Bias: forward adds b in f32 after
 * the convolution (one kernel); db is the deterministic per-channel sum of
 * nn_norm_{fwd,bwd}.cu.
 *
 * Plans: one lucid_cuda_conv_plan per key (N,Cin,H,W,Cout,kh,kw, stride,
 * pad, dilation, groups, dtype), cached in the context's nn state and found
 * by a scan that compares a 64-bit hash of the key first.  Planned lazily,
 * per pass, on the pass's first cuDNN-routed call (forward on the first
 * forward, backward-data on the first backward-data, backward-filter on the
 * first backward-filter; a pass routed to the direct kernels is never
 * planned): the descriptors (with the first planned pass), then the first
 * algorithm of cudnnGet*Algorithm_v7's ranking (queried at the base math
 * type: FMA for f32, tensor-op otherwise) that is CUDNN_DETERMINISTIC,
 * allowed by the math mode (f32: no tensor-op math), accepted by
 * cudnnGet*WorkspaceSize and needs at most 512 MiB of workspace.  The nn
 * arena is grown to that pass's need right then, so later calls of that key
 * and pass allocate nothing (CUDA-graph capturable).  No cudnnFind*: a
 * timing-based choice could differ between runs.  (Until 2026-11 all three
 * passes were planned on the key's first call; the choices are the same,
 * only made later: inference-only shapes, e.g. validation at batch 8, no
 * longer pay for backward heuristics queries.)
 *
 * Direct kernels (deterministic, f32 accumulation, f32 weights read as is):
 * used for depthwise convolutions in mode 0 (auto), for every conv in mode 1
 * (lucid_cuda_nn_set_conv_mode), for a pass with no acceptable cuDNN
 * algorithm, and in builds without cuDNN.  forward and backward-data are a
 * gather (one thread per output element); backward-weight is one block per
 * weight element folding (n, i, j) in a fixed order.
 */
#include "nn_common.cuh"
#include "nn_conv_igemm.cuh"
#include "nn_conv_gemm.cuh"
#include "nn_conv_dw.cuh"
#include "nn_conv_small.cuh"
#include "nn_conv_col.cuh"
#include "nn_conv_wcols.cuh"
#include "nn_dcols.cuh"

#include <algorithm>
#include <limits.h>
#include <new>
#include <string.h>

#define CONV_WS_CAP ((size_t)512 << 20)
#define CONV_THREADS 256

// ----------------------------------------------------------------------------
// geometry and plans

typedef struct conv_geom {
    int64_t N, Cin, H, W, Cout, Ho, Wo, kh, kw, G, Cg, Og;
    int sh, sw, ph, pw, dh, dw;
} conv_geom;

enum { PASS_FWD = 0, PASS_BWD_DATA = 1, PASS_BWD_FILTER = 2 };
enum { ROUTE_DIRECT = 0, ROUTE_CUDNN = 1, ROUTE_IGEMM = 2, ROUTE_DW = 3, ROUTE_GEMM = 4 };
enum { ROUTE_SMALL = 5 }; /* nn_conv_small.cu: forward, backward-data, filter gradient */
enum { ROUTE_COL = 6 };   /* nn_conv_col.cu: im2col + cuBLAS */

struct lucid_cuda_conv_plan {
    int64_t key[16];
    uint64_t hash;
    lucid_dtype dt;
    conv_geom g;
    int depthwise;
    int igemm;        /* the implicit-GEMM kernels apply (bf16/f16, groups 1) */
    lucid_igemm_geom ig;
    int gemm1x1;      /* the cuBLAS 1x1 route applies (nn_conv_gemm.cu) */
    lucid_conv_gemm_geom gg;
    int col[3];       /* the im2col route applies to the pass (nn_conv_col.cu) */
    lucid_conv_col_geom cg;
    lucid_conv_dw_geom dwg; /* depthwise kernels (nn_conv_dw.cu) */
    size_t wbytes;    /* weight in the activation dtype (0 for f32) */
    int planned[3];   /* the pass's algorithm choice ran (have/ws final) */
    int have[3];      /* a cuDNN algorithm was chosen for the pass */
    size_t need[3];   /* arena need of the pass (0 without an algorithm) */
#if defined(LUCID_HAVE_CUDNN)
    int descs;        /* 0 not made yet, 1 made, -1 too large for cuDNN */
    int ran[3];       /* profile: the pass's first cuDNN call was timed */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd[3];
    cudnnConvolutionFwdAlgo_t fwd_algo;
    cudnnConvolutionBwdDataAlgo_t bd_algo;
    cudnnConvolutionBwdFilterAlgo_t bf_algo;
    size_t ws[3];
#endif
};

#if defined(LUCID_HAVE_CUDNN)
static void plan_free_descs(lucid_cuda_conv_plan *p) {
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    for (int i = 0; i < 3; i++)
        if (p->cd[i]) cudnnDestroyConvolutionDescriptor(p->cd[i]);
    p->xd = NULL;
    p->yd = NULL;
    p->wd = NULL;
    for (int i = 0; i < 3; i++) p->cd[i] = NULL;
}
#endif

void lucid_cuda_conv_plan_free(lucid_cuda_conv_plan *p) {
    if (!p) return;
#if defined(LUCID_HAVE_CUDNN)
    plan_free_descs(p);
#endif
    delete p;
}

static conv_geom geom_of(const lucid_tensor *x, const int64_t wshape[4],
                         const lucid_conv2d_params *p) {
    conv_geom g;
    g.N = x->shape[0]; g.Cin = x->shape[1]; g.H = x->shape[2]; g.W = x->shape[3];
    g.Cout = wshape[0]; g.kh = wshape[2]; g.kw = wshape[3];
    g.G = p->groups; g.Cg = g.Cin / g.G; g.Og = g.Cout / g.G;
    g.Ho = lucid_nn_conv_out_size(g.H, (int)g.kh, p->stride_h, p->pad_h, p->dilation_h);
    g.Wo = lucid_nn_conv_out_size(g.W, (int)g.kw, p->stride_w, p->pad_w, p->dilation_w);
    g.sh = p->stride_h; g.sw = p->stride_w;
    g.ph = p->pad_h; g.pw = p->pad_w;
    g.dh = p->dilation_h; g.dw = p->dilation_w;
    return g;
}

static void key_of(const conv_geom &g, lucid_dtype dt, int64_t key[16]) {
    int64_t k[16] = {g.N, g.Cin, g.H, g.W, g.Cout, g.kh, g.kw, g.sh, g.sw,
                     g.ph, g.pw, g.dh, g.dw, g.G, (int64_t)dt, 0};
    memcpy(key, k, sizeof k);
}

static uint64_t key_hash(const int64_t key[16]) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the 16 words */
    for (int i = 0; i < 16; i++) {
        h ^= (uint64_t)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

#if defined(LUCID_HAVE_CUDNN)
static cudnnDataType_t cudnn_dt(lucid_dtype dt) {
    return dt == LUCID_BF16 ? CUDNN_DATA_BFLOAT16
           : dt == LUCID_F16 ? CUDNN_DATA_HALF
                             : CUDNN_DATA_FLOAT;
}

/* f32: only FMA kernels (no TF32); the descriptor keeps CUDNN_FMA_MATH. */
static bool math_ok(lucid_dtype dt, cudnnMathType_t m) {
    if (dt != LUCID_F32) return true;
    return m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static cudnnMathType_t base_math(lucid_dtype dt) {
    return dt == LUCID_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

/* The shape's tensor, filter and convolution descriptors (one convolution
 * descriptor per pass: each pass keeps its own chosen math type).  Sets
 * pl->descs to 1, or to -1 when the shape exceeds cuDNN's int dims (direct
 * kernels); on an error everything made here is destroyed again, so the
 * next call retries. */
static lucid_status plan_descs_make(lucid_ctx *ctx, lucid_cuda_conv_plan *pl) {
    const conv_geom &g = pl->g;
    cudnnDataType_t ddt = cudnn_dt(pl->dt);
    cudnnMathType_t base = base_math(pl->dt);
    CUDNN_CHECK(ctx, cudnnCreateTensorDescriptor(&pl->xd));
    CUDNN_CHECK(ctx, cudnnCreateTensorDescriptor(&pl->yd));
    CUDNN_CHECK(ctx, cudnnCreateFilterDescriptor(&pl->wd));
    CUDNN_CHECK(ctx, cudnnSetTensor4dDescriptor(pl->xd, CUDNN_TENSOR_NCHW, ddt,
                                                (int)g.N, (int)g.Cin, (int)g.H, (int)g.W));
    CUDNN_CHECK(ctx, cudnnSetTensor4dDescriptor(pl->yd, CUDNN_TENSOR_NCHW, ddt,
                                                (int)g.N, (int)g.Cout, (int)g.Ho, (int)g.Wo));
    CUDNN_CHECK(ctx, cudnnSetFilter4dDescriptor(pl->wd, ddt, CUDNN_TENSOR_NCHW,
                                                (int)g.Cout, (int)g.Cg, (int)g.kh, (int)g.kw));
    for (int i = 0; i < 3; i++) {
        CUDNN_CHECK(ctx, cudnnCreateConvolutionDescriptor(&pl->cd[i]));
        CUDNN_CHECK(ctx, cudnnSetConvolution2dDescriptor(
                             pl->cd[i], g.ph, g.pw, g.sh, g.sw, g.dh, g.dw,
                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        CUDNN_CHECK(ctx, cudnnSetConvolutionGroupCount(pl->cd[i], (int)g.G));
        CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->cd[i], base));
    }
    /* the descriptors must agree with our output size */
    int on, oc, oh, ow;
    CUDNN_CHECK(ctx, cudnnGetConvolution2dForwardOutputDim(pl->cd[0], pl->xd, pl->wd,
                                                           &on, &oc, &oh, &ow));
    if (on != g.N || oc != g.Cout || oh != g.Ho || ow != g.Wo)
        return lucid_seterr(ctx, LUCID_ERR_DEVICE,
                            "conv2d: cuDNN output dims %dx%dx%dx%d differ from "
                            "%lldx%lldx%lldx%lld",
                            on, oc, oh, ow, (long long)g.N, (long long)g.Cout,
                            (long long)g.Ho, (long long)g.Wo);
    return LUCID_OK;
}

static lucid_status plan_descs(lucid_ctx *ctx, lucid_cuda_conv_plan *pl) {
    if (pl->descs) return LUCID_OK;
    const conv_geom &g = pl->g;
    /* 4-d descriptors take int dims and int strides */
    if (g.N * g.Cin * g.H * g.W > INT_MAX || g.N * g.Cout * g.Ho * g.Wo > INT_MAX) {
        pl->descs = -1; /* direct kernels */
        return LUCID_OK;
    }
    lucid_status s = plan_descs_make(ctx, pl);
    if (s != LUCID_OK) {
        plan_free_descs(pl);
        return s;
    }
    pl->descs = 1;
    return LUCID_OK;
}

/* The algorithm of one pass: the first of cudnnGet*Algorithm_v7's ranking
 * (queried with the pass's descriptor at the base math type) that is
 * deterministic, allowed by the math mode, accepted by the workspace query
 * and needs at most CONV_WS_CAP bytes.  The descriptor keeps the math type
 * of the last candidate tried (the chosen one when there is one). */
static lucid_status plan_fwd(lucid_ctx *ctx, cudnnHandle_t h, lucid_cuda_conv_plan *pl) {
    int n = 0, ret = 0;
    CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->cd[0], base_math(pl->dt)));
    CUDNN_CHECK(ctx, cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf((size_t)(n > 0 ? n : 1));
    CUDNN_CHECK(ctx, cudnnGetConvolutionForwardAlgorithm_v7(
                         h, pl->xd, pl->wd, pl->cd[0], pl->yd, n, &ret, perf.data()));
    for (int i = 0; i < ret && !pl->have[PASS_FWD]; i++) {
        const cudnnConvolutionFwdAlgoPerf_t &q = perf[(size_t)i];
        if (q.status != CUDNN_STATUS_SUCCESS || q.determinism != CUDNN_DETERMINISTIC ||
            !math_ok(pl->dt, q.mathType))
            continue;
        CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(
                             pl->cd[0], pl->dt == LUCID_F32 ? CUDNN_FMA_MATH : q.mathType));
        size_t ws = 0;
        if (cudnnGetConvolutionForwardWorkspaceSize(h, pl->xd, pl->wd, pl->cd[0], pl->yd,
                                                    q.algo, &ws) != CUDNN_STATUS_SUCCESS ||
            ws > CONV_WS_CAP)
            continue;
        pl->fwd_algo = q.algo;
        pl->ws[PASS_FWD] = ws;
        pl->have[PASS_FWD] = 1;
    }
    return LUCID_OK;
}

static lucid_status plan_bwd_data(lucid_ctx *ctx, cudnnHandle_t h, lucid_cuda_conv_plan *pl) {
    int n = 0, ret = 0;
    CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->cd[1], base_math(pl->dt)));
    CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf((size_t)(n > 0 ? n : 1));
    CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                         h, pl->wd, pl->yd, pl->cd[1], pl->xd, n, &ret, perf.data()));
    for (int i = 0; i < ret && !pl->have[PASS_BWD_DATA]; i++) {
        const cudnnConvolutionBwdDataAlgoPerf_t &q = perf[(size_t)i];
        if (q.status != CUDNN_STATUS_SUCCESS || q.determinism != CUDNN_DETERMINISTIC ||
            !math_ok(pl->dt, q.mathType))
            continue;
        CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(
                             pl->cd[1], pl->dt == LUCID_F32 ? CUDNN_FMA_MATH : q.mathType));
        size_t ws = 0;
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, pl->wd, pl->yd, pl->cd[1], pl->xd,
                                                         q.algo, &ws) != CUDNN_STATUS_SUCCESS ||
            ws > CONV_WS_CAP)
            continue;
        pl->bd_algo = q.algo;
        pl->ws[PASS_BWD_DATA] = ws;
        pl->have[PASS_BWD_DATA] = 1;
    }
    return LUCID_OK;
}

static lucid_status plan_bwd_filter(lucid_ctx *ctx, cudnnHandle_t h, lucid_cuda_conv_plan *pl) {
    int n = 0, ret = 0;
    CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(pl->cd[2], base_math(pl->dt)));
    CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf((size_t)(n > 0 ? n : 1));
    CUDNN_CHECK(ctx, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                         h, pl->xd, pl->yd, pl->cd[2], pl->wd, n, &ret, perf.data()));
    for (int i = 0; i < ret && !pl->have[PASS_BWD_FILTER]; i++) {
        const cudnnConvolutionBwdFilterAlgoPerf_t &q = perf[(size_t)i];
        if (q.status != CUDNN_STATUS_SUCCESS || q.determinism != CUDNN_DETERMINISTIC ||
            !math_ok(pl->dt, q.mathType))
            continue;
        CUDNN_CHECK(ctx, cudnnSetConvolutionMathType(
                             pl->cd[2], pl->dt == LUCID_F32 ? CUDNN_FMA_MATH : q.mathType));
        size_t ws = 0;
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, pl->xd, pl->yd, pl->cd[2],
                                                           pl->wd, q.algo, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws > CONV_WS_CAP)
            continue;
        pl->bf_algo = q.algo;
        pl->ws[PASS_BWD_FILTER] = ws;
        pl->have[PASS_BWD_FILTER] = 1;
    }
    return LUCID_OK;
}

/* Plan one pass of pl on its first cuDNN-routed call: the descriptors (on
 * the plan's first planned pass) and the pass's algorithm.  Timed into the
 * profile when LUCID_PROFILE is set.  An error leaves the pass unplanned
 * (the next call retries). */
static lucid_status plan_pass(lucid_ctx *ctx, lucid_cuda_state *st, lucid_cuda_nn_state *ns,
                              lucid_cuda_conv_plan *pl, int pass) {
    if (pl->planned[pass]) return LUCID_OK;
    double t0 = ns->profile ? lucid_cuda_nn_now() : 0.0;
    lucid_status s = plan_descs(ctx, pl);
    if (s == LUCID_OK && pl->descs > 0) {
        pl->have[pass] = 0;
        pl->ws[pass] = 0;
        s = pass == PASS_FWD        ? plan_fwd(ctx, st->cudnn, pl)
            : pass == PASS_BWD_DATA ? plan_bwd_data(ctx, st->cudnn, pl)
                                    : plan_bwd_filter(ctx, st->cudnn, pl);
        if (s != LUCID_OK) pl->have[pass] = 0;
    }
    if (s != LUCID_OK) return s;
    pl->need[pass] = pl->have[pass] ? nn_align(pl->ws[pass]) + nn_align(pl->wbytes) : 0;
    pl->planned[pass] = 1;
    if (ns->profile) {
        ns->prof.plan_s[pass] += lucid_cuda_nn_now() - t0;
        ns->prof.plan_n[pass]++;
    }
    return LUCID_OK;
}
#endif

/* The plan of (x, wshape, p): found in the cache or added to it (no cuDNN
 * work here; each pass is planned by conv_route on its first use). */
static lucid_status plan_get(lucid_ctx *ctx, lucid_cuda_nn_state *ns, const lucid_tensor *x,
                             const int64_t wshape[4], const lucid_conv2d_params *p,
                             lucid_cuda_conv_plan **out) {
    conv_geom g = geom_of(x, wshape, p);
    int64_t key[16];
    key_of(g, x->dtype, key);
    uint64_t h = key_hash(key);
    for (lucid_cuda_conv_plan *pl : ns->plans)
        if (pl->hash == h && memcmp(pl->key, key, sizeof key) == 0) {
            *out = pl;
            return LUCID_OK;
        }
    lucid_cuda_conv_plan *pl = new (std::nothrow) lucid_cuda_conv_plan();
    if (!pl) return lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (conv plan)");
    memset((void *)pl, 0, sizeof *pl);
    memcpy(pl->key, key, sizeof key);
    pl->hash = h;
    pl->dt = x->dtype;
    pl->g = g;
    pl->depthwise = g.Cg == 1 && g.Og == 1;
    pl->dwg = lucid_conv_dw_geom{g.N, g.Cin, g.H, g.W, g.Ho, g.Wo, (int)g.kh, (int)g.kw,
                                 g.sh, g.sw, g.ph, g.pw, g.dh, g.dw};
    pl->ig = lucid_igemm_geom{(int)g.N, (int)g.Cin, (int)g.H, (int)g.W, (int)g.Cout,
                              (int)g.Ho, (int)g.Wo, (int)g.kh, (int)g.kw, g.sh, g.sw,
                              g.ph, g.pw, g.dh, g.dw};
    pl->igemm = x->dtype != LUCID_F32 && g.G == 1 && g.N < INT_MAX && g.Cin < INT_MAX &&
                g.H < INT_MAX && g.W < INT_MAX && g.Cout < INT_MAX &&
                lucid_conv_igemm_fits(&pl->ig);
    pl->gg = lucid_conv_gemm_geom{g.N, g.Cin, g.Cout, g.H * g.W};
    pl->gemm1x1 = x->dtype != LUCID_F32 && g.G == 1 && g.kh == 1 && g.kw == 1 && g.sh == 1 &&
                  g.sw == 1 && g.ph == 0 && g.pw == 0 && g.dh == 1 && g.dw == 1 &&
                  lucid_conv_gemm_fits(&pl->gg);
    pl->cg = lucid_conv_col_geom{g.N, g.Cin, g.H, g.W, g.Cout, g.Ho, g.Wo, (int)g.kh, (int)g.kw,
                                 g.sh, g.sw, g.ph, g.pw, g.dh, g.dw};
    for (int ps = 0; ps < 3; ps++)
        pl->col[ps] = g.G == 1 && !pl->gemm1x1 && lucid_conv_col_eligible(&pl->cg, x->dtype, ps);
    pl->wbytes = x->dtype == LUCID_F32
                     ? 0
                     : (size_t)(g.Cout * g.Cg * g.kh * g.kw) * lucid_dtype_size(x->dtype);
    try {
        ns->plans.push_back(pl);
    } catch (...) {
        lucid_cuda_conv_plan_free(pl);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (conv plan)");
    }
    *out = pl;
    return LUCID_OK;
}

/* The small-channel route's view of a geometry (nn_conv_small.cuh). */
static lucid_conv_small_geom small_geom_of(const conv_geom &g) {
    return lucid_conv_small_geom{g.N, g.Cin, g.H, g.W, g.Cout, g.Ho, g.Wo, (int)g.kh, (int)g.kw,
                                 g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, (int)g.G};
}

/* Whether the im2col route (nn_conv_col.cuh) takes `pass` in ns: the
 * per-context setting (lucid_cuda_nn_set_conv_col: 1 + a mask of
 * LUCID_CONV_COL_F / _D / _W), else LUCID_CONV_COL (lucid_conv_col_switch,
 * the same mask).  -1 for an unknown LUCID_CONV_COL value (*v: the value,
 * v nullable). */
static int col_on(const lucid_cuda_nn_state *ns, int pass, const char **v) {
    int m = ns->conv_col ? ns->conv_col - 1 : lucid_conv_col_switch(v);
    if (m < 0) return -1;
    return (m >> pass) & 1;
}

/* Route of a pass (*route: ROUTE_SMALL, ROUTE_GEMM, ROUTE_COL, ROUTE_IGEMM,
 * ROUTE_DW, ROUTE_CUDNN or ROUTE_DIRECT).  The im2col route (col_on) comes
 * after the 1x1 GEMM and before the implicit GEMM, for the passes its
 * switch names and lucid_conv_col_eligible accepts.
 * Small-channel 3x3 convs (lucid_conv_small_eligible, bf16/f16) take
 * ROUTE_SMALL for the forward and backward-data passes in mode 0, before
 * anything else: with the per-context switch at 0 (lucid_cuda_nn_set_conv_small)
 * those that lucid_conv_small_preferred accepts, unless LUCID_CONV_SMALL=0
 * (read once per process; unset or "1" on, another value ERR_ARG here);
 * with the per-context switch at 2 every eligible one, at 1 none.  It needs
 * no scratch there.  The filter gradient takes it under the same rule when
 * lucid_conv_small_wgrad_eligible (Cin, Cout <= 16) and LUCID_CONV_SMALL_WGRAD
 * is "1" (lucid_conv_small_wgrad_switch, opt-in; "2": only convs with Cin <= 4,
 * i.e. layer 0, whose filter gradient ends the step's critical path), with the per-split partial
 * sums as its scratch (lucid_conv_small_wgrad_scratch, reserved).
 * Modes (lucid_cuda_nn_set_conv_mode): 0 auto = implicit GEMM for bf16/f16
 * with groups 1 (1x1 stride-1 unpadded ones: cuBLAS GEMMs instead when the
 * 1x1 switch says gemm: lucid_cuda_nn_set_conv1x1, else LUCID_CONV1X1, read
 * once per process, whose default "auto" takes cuBLAS only for channel
 * counts that are multiples of 8, lucid_conv_gemm_preferred; an unknown
 * LUCID_CONV1X1 value is ERR_ARG here), the
 * depthwise kernels of nn_conv_dw.cu for depthwise (any dtype), cuDNN
 * otherwise (f32 and grouped); 1 = the generic direct kernels below for
 * everything; 2 = cuDNN for everything it takes (depthwise included).  A
 * cuDNN pass is planned on its first call; the pass's scratch is reserved
 * here (the arena grows here, named `op`, and never during capture; the
 * GEMM forward with a bias reserves its f32 output on top, in the
 * forward).  *ws: the arena (cuDNN, the split-K partials of the
 * implicit-GEMM passes, the GEMM route's weight cast and partials).
 * conv_route_of decides without reserving: *need, the pass's scratch bytes,
 * and *reserve, whether conv_route reserves them (the routes that need
 * none reserve nothing, except ROUTE_COL and ROUTE_CUDNN, which always
 * take the arena's base). */
static lucid_status conv_route_of(lucid_ctx *ctx, lucid_cuda_state *st,
                                  lucid_cuda_nn_state *ns, lucid_cuda_conv_plan *pl, int pass,
                                  const char *op, int *route, size_t *need, bool *reserve) {
    *route = ROUTE_DIRECT;
    *need = 0;
    *reserve = false;
    if (ns->conv_mode == 1) return LUCID_OK;
    if (ns->conv_mode == 0 && ns->conv_small != 1) {
        lucid_conv_small_geom sg = small_geom_of(pl->g);
        const bool wgrad = pass == PASS_BWD_FILTER;
        const int sww = wgrad ? lucid_conv_small_wgrad_switch() : 0;
        if (wgrad ? sww && (sww == 1 || sg.Cin <= 4) &&
                        lucid_conv_small_wgrad_eligible(&sg, pl->dt)
                  : lucid_conv_small_eligible(&sg, pl->dt)) {
            int on = ns->conv_small == 2;
            if (ns->conv_small == 0) {
                const char *v = "";
                int sw = lucid_conv_small_switch(&v);
                if (sw < 0)
                    return lucid_seterr(ctx, LUCID_ERR_ARG,
                                        "%s: LUCID_CONV_SMALL=\"%s\" (expected 0 or 1)", op, v);
                on = sw == 1 && lucid_conv_small_preferred(&sg);
            }
            if (on) {
                *route = ROUTE_SMALL;
                if (wgrad) { /* the per-split partial sums */
                    *need = lucid_conv_small_wgrad_scratch(&sg);
                    *reserve = true;
                }
                return LUCID_OK;
            }
        }
    }
    if (ns->conv_mode == 0 && pl->gemm1x1) {
        int gemm = ns->conv1x1 == 2;
        if (ns->conv1x1 == 0) {
            const char *v = "";
            int sw = lucid_conv1x1_switch(&v);
            if (sw < 0)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: LUCID_CONV1X1=\"%s\" (expected auto, gemm or igemm)", op, v);
            gemm = sw == 1 || (sw == 2 && lucid_conv_gemm_preferred(&pl->gg));
        }
        if (gemm) {
            *route = ROUTE_GEMM;
            *need = lucid_conv_gemm_scratch(&pl->gg, pl->dt, pass, 0);
            *reserve = *need != 0;
            return LUCID_OK;
        }
    }
    if (ns->conv_mode == 0 && pl->col[pass]) {
        const char *v = "";
        int on = col_on(ns, pass, &v);
        if (on < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: LUCID_CONV_COL=\"%s\" (expected 0, 1 or a set of the "
                                "letters f, d, w)", op, v);
        if (on) {
            *route = ROUTE_COL;
            *need = lucid_conv_col_scratch(&pl->cg, pl->dt, pass, 0);
            *reserve = true;
            return LUCID_OK;
        }
    }
    if (ns->conv_mode == 0 && pl->igemm) {
        *route = ROUTE_IGEMM;
        *need = lucid_conv_igemm_scratch(&pl->ig, pass);
        *reserve = *need != 0;
        return LUCID_OK;
    }
    if (ns->conv_mode == 0 && pl->depthwise) {
        *route = ROUTE_DW;
        *need = pass == PASS_BWD_FILTER ? lucid_conv_dw_wgrad_scratch_bytes(&pl->dwg) : 0;
        *reserve = *need != 0;
        return LUCID_OK;
    }
#if defined(LUCID_HAVE_CUDNN)
    LUCID_TRY(plan_pass(ctx, st, ns, pl, pass));
    if (!pl->have[pass]) return LUCID_OK;
    *need = pl->need[pass];
    *reserve = true;
    *route = ROUTE_CUDNN;
#else
    (void)ctx; (void)st; (void)pass; (void)op;
#endif
    return LUCID_OK;
}

/* conv_route_of's route, with the pass's scratch reserved (*ws: the arena;
 * NULL when the route needs none). */
static lucid_status conv_route(lucid_ctx *ctx, lucid_cuda_state *st, lucid_cuda_nn_state *ns,
                               lucid_cuda_conv_plan *pl, int pass, const char *op,
                               int *route, void **ws) {
    size_t need = 0;
    bool reserve = false;
    *ws = NULL;
    LUCID_TRY(conv_route_of(ctx, st, ns, pl, pass, op, route, &need, &reserve));
    if (reserve) LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns, need, op, ws));
    return LUCID_OK;
}

#if defined(LUCID_HAVE_CUDNN)
/* Profile: the host time of a pass's first cuDNN call (lazy kernel-module
 * loading and first-launch costs show up here). */
static inline double first_run_begin(const lucid_cuda_nn_state *ns,
                                     const lucid_cuda_conv_plan *pl, int pass) {
    return ns->profile && !pl->ran[pass] ? lucid_cuda_nn_now() : 0.0;
}
static inline void first_run_end(lucid_cuda_nn_state *ns, lucid_cuda_conv_plan *pl, int pass,
                                 double t0) {
    if (!ns->profile || pl->ran[pass]) return;
    pl->ran[pass] = 1;
    ns->prof.first_s[pass] += lucid_cuda_nn_now() - t0;
    ns->prof.first_n[pass]++;
}
#endif

// ----------------------------------------------------------------------------
// small kernels

template <typename T>
static __global__ void cast_from_f32(const float *__restrict__ s, T *__restrict__ d, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        lucid_elem<T>::store(d, i, s[i]);
}

/* dw = beta*dw + float(tmp) */
template <typename T>
static __global__ void acc_to_f32(const T *__restrict__ tmp, float *dw, int64_t n, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = lucid_elem<T>::load(tmp, i);
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], v) : v;
    }
}

/* y[n, o, s] += b[o] (in f32, rounded once) */
template <typename T>
static __global__ void bias_add(T *y, const float *__restrict__ b, int64_t C, int64_t S,
                         int64_t total) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = (i / S) % C;
        lucid_elem<T>::store(y, i, lucid_elem<T>::load(y, i) + b[c]);
    }
}

// ----------------------------------------------------------------------------
// direct kernels

template <typename T>
static __global__ void conv_fwd_direct(const T *__restrict__ x, const float *__restrict__ w,
                                const float *__restrict__ b, T *__restrict__ y,
                                conv_geom g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t P = g.Ho * g.Wo, total = g.N * g.Cout * P;
    int64_t K = g.Cg * g.kh * g.kw;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = e % g.Wo, r = e / g.Wo;
        int64_t i = r % g.Ho; r /= g.Ho;
        int64_t o = r % g.Cout, n = r / g.Cout;
        int64_t grp = o / g.Og;
        const T *xb = x + (n * g.Cin + grp * g.Cg) * g.H * g.W;
        const float *wo = w + o * K;
        float acc = b ? b[o] : 0.0f;
        for (int64_t c = 0; c < g.Cg; c++) {
            const T *xc = xb + c * g.H * g.W;
            const float *wc = wo + c * g.kh * g.kw;
            for (int64_t u = 0; u < g.kh; u++) {
                int64_t hi = i * g.sh - g.ph + u * g.dh;
                if (hi < 0 || hi >= g.H) continue;
                for (int64_t v = 0; v < g.kw; v++) {
                    int64_t wi = j * g.sw - g.pw + v * g.dw;
                    if (wi < 0 || wi >= g.W) continue;
                    acc = fmaf(wc[u * g.kw + v], lucid_elem<T>::load(xc, hi * g.W + wi), acc);
                }
            }
        }
        lucid_elem<T>::store(y, e, acc);
    }
}

/* dx[n, ci, h, w] = beta*dx + sum_{o in group, u, v} w[o, c, u, v] *
 *                   dy[n, o, (h+ph-u*dh)/sh, (w+pw-v*dw)/sw]  (exact division) */
template <typename T>
static __global__ void conv_bwd_data_direct(const T *__restrict__ dy, const float *__restrict__ w,
                                     T *dx, conv_geom g, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t total = g.N * g.Cin * g.H * g.W;
    int64_t K = g.Cg * g.kh * g.kw;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t wq = e % g.W, r = e / g.W;
        int64_t h = r % g.H; r /= g.H;
        int64_t ci = r % g.Cin, n = r / g.Cin;
        int64_t grp = ci / g.Cg, c = ci % g.Cg;
        float acc = 0.0f;
        for (int64_t oo = 0; oo < g.Og; oo++) {
            int64_t o = grp * g.Og + oo;
            const T *dyo = dy + (n * g.Cout + o) * g.Ho * g.Wo;
            const float *wc = w + o * K + c * g.kh * g.kw;
            for (int64_t u = 0; u < g.kh; u++) {
                int64_t ti = h + g.ph - u * g.dh;
                if (ti < 0 || ti % g.sh) continue;
                int64_t i = ti / g.sh;
                if (i >= g.Ho) continue;
                for (int64_t v = 0; v < g.kw; v++) {
                    int64_t tj = wq + g.pw - v * g.dw;
                    if (tj < 0 || tj % g.sw) continue;
                    int64_t j = tj / g.sw;
                    if (j >= g.Wo) continue;
                    acc = fmaf(wc[u * g.kw + v], lucid_elem<T>::load(dyo, i * g.Wo + j), acc);
                }
            }
        }
        if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(dx, e), acc);
        lucid_elem<T>::store(dx, e, acc);
    }
}

/* One block per weight element (o, c, u, v): fold (n, i, j) in order. */
template <typename T>
static __global__ void conv_bwd_filter_direct(const T *__restrict__ x, const T *__restrict__ dy,
                                       float *dw, conv_geom g, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float sh[32];
    int64_t K = g.Cg * g.kh * g.kw, total = g.Cout * K;
    int64_t P = g.Ho * g.Wo, M = g.N * P;
    for (int64_t e = blockIdx.x; e < total; e += gridDim.x) {
        int64_t o = e / K, rem = e % K;
        int64_t c = rem / (g.kh * g.kw), uv = rem % (g.kh * g.kw);
        int64_t u = uv / g.kw, v = uv % g.kw;
        int64_t ci = (o / g.Og) * g.Cg + c;
        float acc = 0.0f;
        for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
            int64_t n = m / P, q = m % P;
            int64_t i = q / g.Wo, j = q % g.Wo;
            int64_t hi = i * g.sh - g.ph + u * g.dh;
            int64_t wi = j * g.sw - g.pw + v * g.dw;
            if (hi < 0 || hi >= g.H || wi < 0 || wi >= g.W) continue;
            float gy = lucid_elem<T>::load(dy, (n * g.Cout + o) * P + q);
            float xv = lucid_elem<T>::load(x, ((n * g.Cin + ci) * g.H + hi) * g.W + wi);
            acc = fmaf(gy, xv, acc);
        }
        acc = nn_block_sum(acc, sh);
        if (threadIdx.x == 0) dw[e] = beta != 0.0f ? fmaf(beta, dw[e], acc) : acc;
    }
}

static unsigned cv_blocks(int64_t n) { return lucid_cuda_blocks(n, CONV_THREADS); }

#if defined(LUCID_HAVE_CUDNN)
static lucid_status cast_weight(lucid_ctx *ctx, lucid_cuda_state *st, const float *w,
                                void *dst, lucid_dtype dt, int64_t n) {
    NN_DISPATCH(dt, (lucid_launch(cast_from_f32<T>, cv_blocks(n), CONV_THREADS, 0, st->stream,
                                  w, (T *)dst, n)));
    CUDA_CHECK_LAUNCH(ctx, "cast_from_f32 (conv weight)");
    return LUCID_OK;
}
#endif

// ----------------------------------------------------------------------------
// weight shadows of the cuBLAS 1x1 route (engine/nn/nn.h lucid_conv_wshadow)

/* Shadows in use for ns: the per-context override, else LUCID_WCAST_ONCE. */
static bool wcast_on(const lucid_cuda_nn_state *ns) {
    if (ns->wcast == 1) return false;
    if (ns->wcast == 2) return true;
    return lucid_wcast_once_switch() != 0;
}

/* The group cast's gathering items on the cast lane: the per-context
 * override, else LUCID_WCAST_SIDE. */
static bool wcast_side_on(const lucid_cuda_nn_state *ns) {
    if (ns->wcast_side == 1) return false;
    if (ns->wcast_side == 2) return true;
    return lucid_wcast_side_switch() != 0;
}

/* 1 when the stream is being captured (errors read as "capturing": the
 * callers then take the route that allocates nothing). */
static bool stream_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* 1 when ws->buf exists on w's device and holds n elements of 2 bytes, or
 * was just made so (never during a capture: allocation is refused there,
 * and a buffer is never replaced, because a recorded graph may read it). */
static lucid_status shadow_buffer(lucid_ctx *ctx, lucid_cuda_state *st, lucid_conv_wshadow *ws,
                                  const lucid_tensor *w, int64_t n, bool *ok) {
    *ok = false;
    size_t need = (size_t)n * 2; /* bf16 and f16 */
    lucid_device dev = lucid_tensor_device(w);
    if (ws->buf) {
        lucid_device bd = lucid_storage_device(ws->buf);
        *ok = bd.type == dev.type && bd.index == dev.index &&
              lucid_storage_nbytes(ws->buf) >= need;
        return LUCID_OK;
    }
    if (stream_capturing(st->stream)) return LUCID_OK;
    LUCID_TRY(lucid_storage_create(ctx, dev, need, 0, &ws->buf));
    *ok = true;
    return LUCID_OK;
}

/* Element offset of the stride-phase backward-data's transposed weight in
 * w's shadow buffer (nn_conv_igemm.cuh lucid_conv_igemm_wt_src; 16-byte
 * aligned), after the cast and the flipped weight: for a spatial kernel
 * whose Cin is a multiple of 8 (what that kernel takes); else 0 (none). */
static int64_t shadow_phase_off(const lucid_tensor *w) {
    if (w->ndim != 4 || w->shape[2] * w->shape[3] <= 1 || w->shape[2] > INT_MAX ||
        w->shape[3] > INT_MAX || w->shape[1] % 8 != 0)
        return 0;
    const int64_t end = lucid_tensor_numel(w) +
                        w->shape[1] * lucid_conv_col_wflip_kr(w->shape[0], (int)w->shape[2],
                                                              (int)w->shape[3]);
    return (end + 7) / 8 * 8;
}

/* Elements of w's shadow buffer: the cast weight, and for a spatial kernel
 * room for the im2col route's flipped weight after it (Cin rows of
 * lucid_conv_col_wflip_kr elements) and, when Cin % 8 == 0, for the
 * stride-phase backward-data's transposed weight (numel elements at
 * shadow_phase_off), whichever call creates the buffer. */
static int64_t shadow_elems(const lucid_tensor *w) {
    const int64_t numel = lucid_tensor_numel(w);
    if (w->ndim != 4 || w->shape[2] * w->shape[3] <= 1 || w->shape[2] > INT_MAX ||
        w->shape[3] > INT_MAX)
        return numel;
    const int64_t ph = shadow_phase_off(w);
    if (ph > 0) return ph + numel;
    return numel + w->shape[1] * lucid_conv_col_wflip_kr(w->shape[0], (int)w->shape[2],
                                                         (int)w->shape[3]);
}

/* 1 when the group cast writes w's transposed weight for the stride-phase
 * backward-data into ws: its conv's backward-data asked for it
 * (lucid_conv_wshadow_want_phase), the kernel's switch is on, the buffer
 * has room for it (shadow_phase_off) and the sizes fit its int fields. */
static bool phase_copy_wanted(const lucid_conv_wshadow *ws, const lucid_tensor *w) {
    return ws->phase_want && lucid_conv_igemm_dgrad_phase() && shadow_phase_off(w) > 0 &&
           w->shape[0] <= INT_MAX && w->shape[1] <= INT_MAX &&
           w->shape[2] * w->shape[3] <= INT_MAX;
}

/* The weight of a GEMM-routed forward / backward-data in the activation
 * dtype: *wc = ws's buffer when it is fresh; else, when it can be used, w
 * is cast into it here (one launch on the current stream, the per-call
 * cast's kernel) and it is marked fresh; else *wc = NULL (no shadow, off,
 * or no buffer during a capture: the GEMM casts into scratch). */
static lucid_status shadow_take(lucid_ctx *ctx, lucid_cuda_state *st, lucid_cuda_nn_state *ns,
                                lucid_conv_wshadow *ws, const lucid_tensor *w, lucid_dtype dt,
                                const void **wc) {
    *wc = NULL;
    if (!ws || !wcast_on(ns)) return LUCID_OK;
    if (lucid_conv_wshadow_fresh(ws, w, dt, st->shadow_epoch)) {
        /* the plain cast may still run on the cast lane (conv2d_cast_shadows) */
        LUCID_TRY(lucid_cuda_cast_lane_wait_plain(ctx));
        *wc = lucid_storage_data(ws->buf);
        return LUCID_OK;
    }
    int64_t n = lucid_tensor_numel(w);
    bool ok = false;
    LUCID_TRY(shadow_buffer(ctx, st, ws, w, shadow_elems(w), &ok));
    if (!ok) return LUCID_OK;
    void *dst = lucid_storage_data(ws->buf);
    lucid_conv_wshadow_invalidate(ws); /* until the cast is queued */
    /* the cast lane may still write copies into this buffer (another shape's
     * flipped or transposed weight can overlap this cast) */
    LUCID_TRY(lucid_cuda_cast_lane_join(ctx));
    LUCID_TRY(lucid_conv_gemm_cast_weight(ctx, st->stream, dt,
                                          (const float *)lucid_tensor_data(w), dst, n));
    st->shadow_casts++;
    lucid_conv_wshadow_mark(ws, w, dt, st->shadow_epoch);
    *wc = dst;
    return LUCID_OK;
}

/* 1 when conv_route would send a 1x1 conv (stride 1, no padding, dilation
 * 1, groups 1) of these channel counts to cuBLAS in ns: the group cast
 * casts only those weights (the spatial size only matters beyond cuBLAS's
 * 32-bit sizes, where a cast weight is merely unused). */
static bool gemm_route_likely(const lucid_cuda_nn_state *ns, int64_t Cin, int64_t Cout) {
    if (ns->conv_mode != 0) return false;
    if (ns->conv1x1 == 2) return true;
    if (ns->conv1x1 == 1) return false;
    int sw = lucid_conv1x1_switch(NULL);
    lucid_conv_gemm_geom g = {1, Cin, Cout, 1};
    return sw == 1 || (sw == 2 && lucid_conv_gemm_preferred(&g));
}

/* 1 when conv_route would send the forward of a conv with a spatial kernel,
 * K = Cin*kh*kw and Cout output channels to the im2col route in ns (the
 * spatial size only decides beyond that; a weight cast for a conv that
 * then takes another route is merely unused). */
static bool col_route_likely(const lucid_cuda_nn_state *ns, int64_t K, int64_t Cout) {
    if (ns->conv_mode != 0 || K % 8 || Cout < 1) return false; /* padded K: cast per call */
    return col_on(ns, PASS_FWD, NULL) == 1;
}

/* Checked by lucid_nn_conv2d_cast_shadows (n >= 1, f32 contiguous weights
 * on this device, dt bf16/f16).  With wcast_side_on (see the file
 * comment): the plain casts, the plain-cast mark and the gathering items
 * (flipped and transposed copies) on the cast lane, or with
 * LUCID_WCAST_PLAIN_SIDE=0 the plain casts on the current stream and the
 * gathering items on the lane; else all of them in one launch on the
 * current stream. */
extern "C" lucid_status lucid_cuda_conv2d_cast_shadows(lucid_ctx *ctx,
                                                       const lucid_tensor *const *w,
                                                       lucid_conv_wshadow *const *ws, int n,
                                                       lucid_dtype dt) {
    lucid_cuda_state *st = lucid_cuda_enter(ctx);
    if (!st) return ctx->last_status;
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    if (!wcast_on(ns) || n <= 0 || (dt != LUCID_BF16 && dt != LUCID_F16)) return LUCID_OK;
    std::vector<lucid_conv_gemm_cast_item> items;
    std::vector<int> which;
    std::vector<int64_t> phase_at; /* per entry of which: the transposed copy's offset, or 0 */
    try {
        items.reserve((size_t)n * 3); /* a weight, its flipped and its transposed weight */
        which.reserve((size_t)n);
        phase_at.reserve((size_t)n);
    } catch (...) {
        return lucid_seterr(ctx, LUCID_ERR_OOM, "out of host memory (conv weight group cast)");
    }
    const uint64_t epoch = st->shadow_epoch;
    /* the im2col route's backward-data reads a flipped weight: cast with the
     * rest when that pass is on (stride-2 convs never read it; small) */
    const bool flips = col_on(ns, PASS_BWD_DATA, NULL) == 1;
    for (int i = 0; i < n; i++) {
        const lucid_tensor *wi = w[i];
        int64_t Cout = wi->shape[0], Cin = lucid_tensor_numel(wi) / (Cout > 0 ? Cout : 1);
        bool spatial = wi->ndim == 4 && wi->shape[2] * wi->shape[3] > 1;
        /* a strided conv's transposed weight (its backward-data asked for it)
         * comes with the plain cast, whether or not a cuBLAS route reads that */
        const bool phase = spatial && phase_copy_wanted(ws[i], wi);
        if (Cout < 1 ||
            !(phase || (spatial ? col_route_likely(ns, Cin, Cout) : gemm_route_likely(ns, Cin, Cout))))
            continue;
        const int64_t numel = lucid_tensor_numel(wi);
        const bool flip = spatial && flips && wi->shape[2] <= INT_MAX && wi->shape[3] <= INT_MAX;
        const int kh = flip ? (int)wi->shape[2] : 0, kw = flip ? (int)wi->shape[3] : 0;
        const int64_t ci = flip ? wi->shape[1] : 0,
                      kr = flip ? lucid_conv_col_wflip_kr(Cout, kh, kw) : 0;
        const bool flipped = flip && ci * kr <= INT_MAX && Cout <= INT_MAX;
        /* skipped only when every copy this call would write is fresh: a
         * forward's shadow_take recasts the plain part alone (the flipped
         * copy then reads stale: flip_off 0), and a graph that keeps the
         * shadows reads the flipped copy it was captured with */
        if (lucid_conv_wshadow_fresh(ws[i], wi, dt, epoch) &&
            (!phase || lucid_conv_wshadow_phase_off(ws[i], wi, dt, epoch) > 0) &&
            (!flipped || lucid_conv_wshadow_flip_off(ws[i], wi, dt, epoch) > 0))
            continue;
        bool ok = false;
        LUCID_TRY(shadow_buffer(ctx, st, ws[i], wi, shadow_elems(wi), &ok));
        if (!ok) continue; /* its conv casts per call */
        lucid_conv_wshadow_invalidate(ws[i]); /* until the launch is queued */
        lucid_conv_gemm_cast_item it = {(const float *)lucid_tensor_data(wi),
                                        lucid_storage_data(ws[i]->buf), numel, {0, 0, 0, 0, 0}};
        items.push_back(it);
        /* numel: a multiple of 8 (col_route_likely: K % 8 == 0), so the flipped
         * weight starts 16-byte aligned */
        if (flipped) {
            lucid_conv_gemm_cast_item f = {(const float *)lucid_tensor_data(wi),
                                           (char *)lucid_storage_data(ws[i]->buf) + numel * 2,
                                           ci * kr, {(int)ci, (int)Cout, kh, kw, (int)kr}};
            items.push_back(f);
        }
        /* the transposed weight, when wanted and the buffer (made by
         * whichever call came first, for this shape or another) holds it */
        const int64_t poff = phase ? shadow_phase_off(wi) : 0;
        const bool phased =
            poff > 0 && lucid_storage_nbytes(ws[i]->buf) >= (size_t)(poff + numel) * 2;
        if (phased) {
            lucid_conv_gemm_cast_item p = {(const float *)lucid_tensor_data(wi),
                                           (char *)lucid_storage_data(ws[i]->buf) + poff * 2,
                                           numel, {0, 0, 0, 0, 0},
                                           {(int)wi->shape[1], (int)Cout,
                                            (int)(wi->shape[2] * wi->shape[3])}};
            items.push_back(p);
        }
        /* flip_off / phase_off only for the copies actually queued */
        which.push_back(flipped ? i : -1 - i);
        phase_at.push_back(phased ? poff : 0);
    }
    /* the gathering items (flipped and transposed copies: strided reads of
     * the f32 weight) first: on the cast lane they are a launch of their
     * own; in one launch their slower blocks start in the first wave
     * instead of trailing the plain casts.  Each item writes its own region:
     * the order and the stream change no bit. */
    const int ngather = (int)(std::stable_partition(items.begin(), items.end(),
                                                    [](const lucid_conv_gemm_cast_item &c) {
                                                        return c.flip[4] > 0 || c.wt[0] > 0;
                                                    }) -
                              items.begin());
    const int nitems = (int)items.size();
    if (nitems > 0) {
        /* a cast lane launch of an earlier call not joined yet may still
         * write into these buffers (a buffer reused by another shape) */
        LUCID_TRY(lucid_cuda_cast_lane_join(ctx));
        st->shadow_casts++;
    }
    cudaStream_t side = NULL;
    /* forked before anything is queued: the lane waits for what precedes
     * the group cast (with the plain casts on the current stream, not for
     * those) */
    const bool plain_side = lucid_wcast_plain_side_switch() != 0;
    if ((ngather > 0 || (plain_side && nitems > 0)) && wcast_side_on(ns))
        LUCID_TRY(lucid_cuda_cast_lane_fork(ctx, &side));
    if (side && plain_side) {
        /* the plain casts first on the lane, then the mark their readers
         * (shadow_take) wait for, then the gathers that only the
         * backward-data reads (joined there) */
        LUCID_TRY(lucid_conv_gemm_cast_group(ctx, side, dt, items.data() + ngather,
                                             nitems - ngather));
        LUCID_TRY(lucid_cuda_cast_lane_mark_plain(ctx));
        LUCID_TRY(lucid_conv_gemm_cast_group(ctx, side, dt, items.data(), ngather));
    } else if (side) {
        LUCID_TRY(lucid_conv_gemm_cast_group(ctx, side, dt, items.data(), ngather));
        LUCID_TRY(lucid_conv_gemm_cast_group(ctx, st->stream, dt, items.data() + ngather,
                                             nitems - ngather));
    } else {
        LUCID_TRY(lucid_conv_gemm_cast_group(ctx, st->stream, dt, items.data(), nitems));
    }
    for (size_t c = 0; c < which.size(); c++) { /* k >= 0: with its flipped weight */
        const int k = which[c], i = k >= 0 ? k : -1 - k;
        lucid_conv_wshadow_mark(ws[i], w[i], dt, epoch);
        if (k >= 0) lucid_conv_wshadow_mark_flip(ws[i], w[i], lucid_tensor_numel(w[i]));
        if (phase_at[c] > 0) lucid_conv_wshadow_mark_phase(ws[i], w[i], phase_at[c]);
    }
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// entry points

static lucid_status conv_common(lucid_ctx *ctx, const char *op, const lucid_tensor *x,
                                const lucid_tensor *w, lucid_cuda_state **stp,
                                lucid_cuda_nn_state **nsp) {
    LUCID_TRY(nn_check_act(ctx, op, x->dtype));
    LUCID_TRY(nn_check_f32(ctx, op, "weight", w));
    lucid_cuda_state *st = lucid_cuda_enter(ctx);
    if (!st) return ctx->last_status;
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    *stp = st;
    *nsp = ns;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// column caches (nn.h lucid_conv_wcols)

/* 1 in *yes when the filter gradient of pl would take the im2col route in
 * ns (conv_route_of; decided without planning: an eligible pass with the
 * route's switch on gives ROUTE_COL or ROUTE_SMALL). */
static lucid_status wgrad_takes_col(lucid_ctx *ctx, lucid_cuda_state *st,
                                    lucid_cuda_nn_state *ns, lucid_cuda_conv_plan *pl,
                                    bool *yes) {
    *yes = false;
    if (ns->conv_mode != 0 || !pl->col[PASS_BWD_FILTER] || col_on(ns, PASS_BWD_FILTER, NULL) != 1)
        return LUCID_OK;
    int rf = ROUTE_DIRECT;
    size_t need = 0;
    bool reserve = false;
    LUCID_TRY(conv_route_of(ctx, st, ns, pl, PASS_BWD_FILTER, "conv2d_backward_params", &rf,
                            &need, &reserve));
    *yes = rf == ROUTE_COL;
    return LUCID_OK;
}

/* LUCID_WCOLS_SIDE_AFTER, read once per process: 1 (default) a
 * small-channel forward (layer 0's sc2_conv) forks its side build after
 * queueing its own kernel, so the build's fork event follows that kernel
 * and its im2col (1284 blocks, 51 us on the H200, session 13 call 3) no
 * longer starts ahead of layer 0's forward at the head of the replay; 0
 * forks it before, as first built.  Same columns, same bits. */
static bool wcols_side_after(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_WCOLS_SIDE_AFTER", &off);
}

/* The side build of a forward that builds no columns: im2col(x) into wc's
 * buffer on the cols lane (forked from the current stream here, so it
 * runs beside the forward's own kernels), an event after it for the
 * filter gradient, the record marked (side).  Nothing when the buffer or
 * the lane is not available now (the filter gradient then builds its
 * columns itself). */
static lucid_status wcols_side_build(lucid_ctx *ctx, lucid_cuda_state *st,
                                     lucid_cuda_nn_state *ns, lucid_cuda_conv_plan *pl,
                                     const lucid_tensor *x, const lucid_conv2d_params *p,
                                     lucid_conv_wcols *wc) {
    void *cols = NULL;
    LUCID_TRY(lucid_conv_wcols_write_begin(ctx, st, ns, wc, x,
                                           lucid_conv_col_cols_bytes(&pl->cg), &cols));
    if (!cols) return LUCID_OK;
    cudaStream_t side = NULL;
    LUCID_TRY(lucid_cuda_cols_lane_fork(ctx, &side));
    if (!side) return LUCID_OK; /* the record stays forgotten */
    LUCID_TRY(lucid_conv_col_im2col(ctx, side, pl->dt, &pl->cg, lucid_tensor_data(x), cols));
    LUCID_TRY(lucid_conv_wcols_write_end(ctx, st, wc, side, x, pl->cg.kh, pl->cg.kw, p,
                                         lucid_conv_col_rows(&pl->cg), 1));
    lucid_conv_wcols_count_side();
    return LUCID_OK;
}

/* The forward; ws (nullable) is the weight shadow of the GEMM route, wc
 * (nullable) the column cache of the filter gradient (x_stable: the
 * caller's hint for side builds, nn.h). */
static lucid_status conv_forward(lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
                                 const lucid_tensor *w, const lucid_tensor *b,
                                 const lucid_conv2d_params *p, lucid_conv_wshadow *wsh,
                                 lucid_conv_wcols *wc, int x_stable) {
    const char *op = "conv2d_forward";
    lucid_cuda_state *st;
    lucid_cuda_nn_state *ns;
    LUCID_TRY(conv_common(ctx, op, x, w, &st, &ns));
    LUCID_TRY(nn_check_f32(ctx, op, "bias", b));
    lucid_cuda_conv_plan *pl;
    LUCID_TRY(plan_get(ctx, ns, x, w->shape, p, &pl));
    const conv_geom &g = pl->g;
    const float *bp = b ? (const float *)lucid_tensor_data(b) : NULL;
    int64_t ny = g.N * g.Cout * g.Ho * g.Wo;
    int route = ROUTE_DIRECT;
    void *ws = NULL;
    LUCID_TRY(conv_route(ctx, st, ns, pl, PASS_FWD, op, &route, &ws));
    /* the column cache: written by this forward when its filter gradient
     * reads columns (the im2col route), by the forward's own im2col or, for
     * a forward on another route, by a side build when the mode allows */
    const int wmode = wc ? lucid_conv_wcols_mode(ns) : LUCID_WCOLS_OFF;
    bool wcol = false;
    if (wmode != LUCID_WCOLS_OFF) LUCID_TRY(wgrad_takes_col(ctx, st, ns, pl, &wcol));
    const bool side = wcol && route != ROUTE_COL &&
                      (wmode == LUCID_WCOLS_SIDE || (wmode == LUCID_WCOLS_STABLE && x_stable));
    /* a small-channel forward queues its kernel first and forks the side
     * build after it (wcols_side_after), else the side build comes first */
    const bool side_after = side && route == ROUTE_SMALL && wcols_side_after();
    if (side && !side_after) LUCID_TRY(wcols_side_build(ctx, st, ns, pl, x, p, wc));
    if (route == ROUTE_GEMM || route == ROUTE_COL) { /* cuBLAS: 1x1 or im2col */
        const bool col = route == ROUTE_COL;
        if (bp) /* the f32 product the bias is added to */
            LUCID_TRY(lucid_cuda_nn_arena(
                ctx, st, ns,
                col ? lucid_conv_col_scratch(&pl->cg, x->dtype, PASS_FWD, 1)
                    : lucid_conv_gemm_scratch(&pl->gg, x->dtype, PASS_FWD, 1),
                op, &ws));
        const void *wcast = NULL;
        /* a padded K (not a multiple of 8) casts its padded weight per call */
        if (!col || (g.Cin * g.kh * g.kw) % 8 == 0)
            LUCID_TRY(shadow_take(ctx, st, ns, wsh, w, x->dtype, &wcast));
        const float *wp = (const float *)lucid_tensor_data(w);
        if (col) {
            void *cols = NULL; /* the cache's buffer, else the scratch */
            if (wcol)
                LUCID_TRY(lucid_conv_wcols_write_begin(ctx, st, ns, wc, x,
                                                       lucid_conv_col_cols_bytes(&pl->cg),
                                                       &cols));
            LUCID_TRY(lucid_conv_col_forward_cols(ctx, st->cublas, st->stream, x->dtype,
                                                  &pl->cg, lucid_tensor_data(x), wp, wcast, bp,
                                                  lucid_tensor_data(y), ws, cols));
            if (cols)
                LUCID_TRY(lucid_conv_wcols_write_end(ctx, st, wc, st->stream, x, pl->cg.kh,
                                                     pl->cg.kw, p, lucid_conv_col_rows(&pl->cg),
                                                     0));
            return LUCID_OK;
        }
        return lucid_conv_gemm_forward_wc(ctx, st->cublas, st->stream, x->dtype, &pl->gg,
                                          lucid_tensor_data(x), wp, wcast, bp,
                                          lucid_tensor_data(y), ws);
    }
    if (route == ROUTE_IGEMM) {
        CUDA_CHECK(ctx, lucid_conv_igemm_forward(x->dtype, lucid_tensor_data(x),
                                                 (const float *)lucid_tensor_data(w), bp,
                                                 lucid_tensor_data(y), ws, &pl->ig, st->stream));
        return LUCID_OK;
    }
    if (route == ROUTE_SMALL) {
        lucid_conv_small_geom sg = small_geom_of(g);
        LUCID_TRY(lucid_conv_small_forward(ctx, st->stream, x->dtype, &sg, lucid_tensor_data(x),
                                           (const float *)lucid_tensor_data(w), bp,
                                           lucid_tensor_data(y)));
        if (side_after) LUCID_TRY(wcols_side_build(ctx, st, ns, pl, x, p, wc));
        return LUCID_OK;
    }
    if (route == ROUTE_DW)
        return lucid_conv_dw_forward(ctx, st->stream, x->dtype, &pl->dwg, lucid_tensor_data(x),
                                     (const float *)lucid_tensor_data(w), bp,
                                     lucid_tensor_data(y));
#if defined(LUCID_HAVE_CUDNN)
    if (route == ROUTE_CUDNN) {
        const void *wp = lucid_tensor_data(w);
        if (pl->wbytes) {
            void *wtmp = (char *)ws + nn_align(pl->ws[PASS_FWD]);
            LUCID_TRY(cast_weight(ctx, st, (const float *)wp, wtmp, x->dtype,
                                  g.Cout * g.Cg * g.kh * g.kw));
            wp = wtmp;
        }
        float one = 1.0f, zero = 0.0f;
        double t0 = first_run_begin(ns, pl, PASS_FWD);
        CUDNN_CHECK(ctx, cudnnConvolutionForward(st->cudnn, &one, pl->xd, lucid_tensor_data(x),
                                                 pl->wd, wp, pl->cd[PASS_FWD], pl->fwd_algo,
                                                 ws, pl->ws[PASS_FWD], &zero, pl->yd,
                                                 lucid_tensor_data(y)));
        first_run_end(ns, pl, PASS_FWD, t0);
        if (bp) {
            NN_DISPATCH(x->dtype, (lucid_launch(bias_add<T>, cv_blocks(ny), CONV_THREADS, 0,
                                                st->stream, (T *)lucid_tensor_data(y), bp,
                                                g.Cout, g.Ho * g.Wo, ny)));
            CUDA_CHECK_LAUNCH(ctx, "bias_add");
        }
        return LUCID_OK;
    }
#endif
    NN_DISPATCH(x->dtype, (lucid_launch(conv_fwd_direct<T>, cv_blocks(ny), CONV_THREADS, 0,
                                        st->stream, (const T *)lucid_tensor_data(x),
                                        (const float *)lucid_tensor_data(w), bp,
                                        (T *)lucid_tensor_data(y), g)));
    CUDA_CHECK_LAUNCH(ctx, "conv_fwd_direct");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_conv2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                                  lucid_tensor *y, const lucid_tensor *w,
                                                  const lucid_tensor *b,
                                                  const lucid_conv2d_params *p) {
    return conv_forward(ctx, x, y, w, b, p, NULL, NULL, 0);
}

extern "C" lucid_status lucid_cuda_conv2d_forward_shadow(lucid_ctx *ctx, const lucid_tensor *x,
                                                         lucid_tensor *y, const lucid_tensor *w,
                                                         const lucid_tensor *b,
                                                         const lucid_conv2d_params *p,
                                                         lucid_conv_wshadow *ws) {
    return conv_forward(ctx, x, y, w, b, p, ws, NULL, 0);
}

extern "C" lucid_status lucid_cuda_conv2d_forward_cols(lucid_ctx *ctx, const lucid_tensor *x,
                                                       lucid_tensor *y, const lucid_tensor *w,
                                                       const lucid_tensor *b,
                                                       const lucid_conv2d_params *p,
                                                       lucid_conv_wshadow *ws,
                                                       lucid_conv_wcols *wc, int x_stable) {
    return conv_forward(ctx, x, y, w, b, p, ws, wc, x_stable);
}

// ----------------------------------------------------------------------------
// backward-data columns written by the BatchNorm backward (nn.h lucid_conv_dcols)

/* LUCID_BN_EMIT_COLS, read on each call: "1" = on; unset or anything
 * else = no reservation (the BatchNorm backward writes no columns, the
 * backward-data runs its im2col).  Off by default: measured on the H200
 * (session 11, one recorded fit with a CUPTI trace), bn_grad_dx1_cols took
 * 11-46 us per call where bn_grad_dx1 (8.7 us) plus the im2col it saves
 * (~6 us) took ~15: one block per channel writing 9*N column rows is
 * slower than the 512-1024-block im2col (step 3.799 / 3.832 ms on, 3.729
 * off, same call). */
static bool dcols_switch(void) {
    const char *e = getenv("LUCID_BN_EMIT_COLS");
    return e && strcmp(e, "1") == 0;
}

/* The nn.h slot conv2d_dcols_reserve (dc zeroed; x, w, p checked): when
 * the switch is on, the conv qualifies (lucid_conv_col_dcols_geom, groups
 * 1), its dy is small enough for a one-kernel BatchNorm backward (N*H*W <=
 * LUCID_DCOLS_MAX_NS, nn_dcols.cuh) and its backward-data takes the im2col
 * route, the stream's arena is grown (outside capture) to hold the scratch
 * of the backward-data and of the backward-filter (which may run on this
 * stream in between, without a parameter lane) followed by the columns,
 * and dc is armed with their place.  Planning the two passes here is what
 * their calls do first (a cuDNN filter pass is planned now instead of a
 * moment later). */
extern "C" lucid_status lucid_cuda_conv2d_dcols_reserve(lucid_ctx *ctx, const lucid_tensor *x,
                                                        const lucid_tensor *w,
                                                        const lucid_conv2d_params *p,
                                                        lucid_conv_dcols *dc) {
    const char *op = "conv2d_dcols_reserve";
    if (!dcols_switch() || (x->dtype != LUCID_BF16 && x->dtype != LUCID_F16)) return LUCID_OK;
    lucid_cuda_state *st;
    lucid_cuda_nn_state *ns;
    LUCID_TRY(conv_common(ctx, op, x, w, &st, &ns));
    lucid_cuda_conv_plan *pl;
    LUCID_TRY(plan_get(ctx, ns, x, w->shape, p, &pl));
    if (pl->g.G != 1 || !lucid_conv_col_dcols_geom(&pl->cg, pl->dt) ||
        pl->g.N * pl->g.Ho * pl->g.Wo > LUCID_DCOLS_MAX_NS)
        return LUCID_OK; /* (a BatchNorm of more than one part per channel writes none) */
    int rd = ROUTE_DIRECT, rf = ROUTE_DIRECT;
    size_t nd = 0, nf = 0;
    bool b = false;
    LUCID_TRY(conv_route_of(ctx, st, ns, pl, PASS_BWD_DATA, "conv2d_backward_input", &rd, &nd,
                            &b));
    if (rd != ROUTE_COL) return LUCID_OK;
    LUCID_TRY(conv_route_of(ctx, st, ns, pl, PASS_BWD_FILTER, "conv2d_backward_params", &rf,
                            &nf, &b));
    const size_t off = nn_align(nd > nf ? nd : nf);
    const size_t bytes = nn_align(lucid_conv_col_dcols_bytes(&pl->cg));
    void *base = NULL;
    LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns, off + bytes, op, &base));
    dc->armed = 1;
    dc->filled = 0;
    dc->data = (char *)base + off;
    dc->dy = NULL;
    dc->dtype = pl->dt;
    dc->N = pl->g.N;
    dc->C = pl->g.Cout;
    dc->H = pl->g.Ho;
    dc->W = pl->g.Wo;
    dc->base = base;
    dc->off = off;
    dc->bytes = bytes;
    dc->stream = (const void *)st->stream;
    return LUCID_OK;
}

/* The columns of dc, for the backward-data of plan pl on the im2col route
 * with dy (ws: the arena the pass just reserved, need_d bytes of it): dc
 * filled from dy's data for this geometry and dtype, on this stream, still
 * at its place in the same arena, after the pass's own scratch; else NULL
 * (the pass runs its im2col). */
static const void *dcols_ready(const lucid_conv_dcols *dc, const lucid_cuda_conv_plan *pl,
                               const lucid_tensor *dy, const lucid_cuda_state *st,
                               const lucid_cuda_nn_state *ns, const void *ws, size_t need_d) {
    if (!dc || !dc->armed || !dc->filled || !dc->data) return NULL;
    if (!lucid_conv_col_dcols_geom(&pl->cg, pl->dt) || pl->g.G != 1) return NULL;
    if (dc->dy != lucid_tensor_data(dy) || dc->dtype != pl->dt || dc->N != pl->g.N ||
        dc->C != pl->g.Cout || dc->H != pl->g.Ho || dc->W != pl->g.Wo)
        return NULL;
    if (dc->stream != (const void *)st->stream || dc->base != ws || ws != ns->arena ||
        dc->off < need_d || dc->bytes < lucid_conv_col_dcols_bytes(&pl->cg) ||
        dc->off + dc->bytes > ns->arena_bytes || dc->data != (const char *)ws + dc->off)
        return NULL;
    return dc->data;
}

/* The backward-data; wsh (nullable) is the weight shadow of the GEMM route,
 * dc (nullable) the columns the BatchNorm backward wrote (dcols_ready). */
static lucid_status conv_backward_input(lucid_ctx *ctx, const lucid_tensor *x,
                                        const lucid_tensor *dy, lucid_tensor *dx,
                                        const lucid_tensor *w, const lucid_conv2d_params *p,
                                        double beta, lucid_conv_wshadow *wsh,
                                        const lucid_conv_dcols *dc) {
    const char *op = "conv2d_backward_input";
    lucid_cuda_state *st;
    lucid_cuda_nn_state *ns;
    LUCID_TRY(conv_common(ctx, op, dx, w, &st, &ns));
    lucid_cuda_conv_plan *pl;
    LUCID_TRY(plan_get(ctx, ns, dx, w->shape, p, &pl));
    const conv_geom &g = pl->g;
    int64_t nx = g.N * g.Cin * g.H * g.W;
    (void)x;
    int route = ROUTE_DIRECT;
    void *ws = NULL;
    LUCID_TRY(conv_route(ctx, st, ns, pl, PASS_BWD_DATA, op, &route, &ws));
    if (route == ROUTE_GEMM) {
        const void *wc = NULL;
        LUCID_TRY(shadow_take(ctx, st, ns, wsh, w, dx->dtype, &wc));
        return lucid_conv_gemm_backward_data_wc(ctx, st->cublas, st->stream, dx->dtype,
                                                &pl->gg, lucid_tensor_data(dy),
                                                (const float *)lucid_tensor_data(w), wc,
                                                lucid_tensor_data(dx), (float)beta, ws);
    }
    if (route == ROUTE_COL) { /* the flipped weight: from a fresh shadow, else cast per call */
        /* the shape matters too (lucid_conv_wshadow_flip_off): a same-numel
         * view of the same data ([16,8,3,3] cast, [8,16,3,3] used) would read
         * the other shape's layout, and past the buffer when Cin*Kr' grows
         * ([8,8,3,3] cast: 576 written; [1,64,3,3] used: 1024 read) */
        const int64_t off = wsh && wcast_on(ns)
                                ? lucid_conv_wshadow_flip_off(wsh, w, dx->dtype, st->shadow_epoch)
                                : 0;
        const void *wf = off > 0 ? (const char *)lucid_storage_data(wsh->buf) + off * 2 : NULL;
        if (wf) LUCID_TRY(lucid_cuda_cast_lane_join(ctx)); /* the copy may be on the lane */
        const void *cols =
            dcols_ready(dc, pl, dy, st, ns, ws, lucid_conv_col_scratch(&pl->cg, pl->dt, 1, 0));
        if (cols)
            return lucid_conv_col_backward_data_cols(ctx, st->cublas, st->stream, dx->dtype,
                                                     &pl->cg, cols,
                                                     (const float *)lucid_tensor_data(w), wf,
                                                     lucid_tensor_data(dx), (float)beta, ws);
        return lucid_conv_col_backward_data(ctx, st->cublas, st->stream, dx->dtype, &pl->cg,
                                            lucid_tensor_data(dy),
                                            (const float *)lucid_tensor_data(w), wf,
                                            lucid_tensor_data(dx), (float)beta, ws);
    }
    if (route == ROUTE_IGEMM) {
        /* the stride-phase kernel reads the transposed weight: from a fresh
         * shadow holding it for w's shape, else cast per call into the
         * scratch (same bits); asking the shadow for it makes the group
         * cast write it from then on */
        const void *wt = NULL;
        if (wsh && wcast_on(ns) && lucid_conv_igemm_dgrad_wt_elems(&pl->ig) > 0) {
            lucid_conv_wshadow_want_phase(wsh);
            const int64_t off = lucid_conv_wshadow_phase_off(wsh, w, dx->dtype, st->shadow_epoch);
            if (off > 0) wt = (const char *)lucid_storage_data(wsh->buf) + off * 2;
        }
        if (wt) LUCID_TRY(lucid_cuda_cast_lane_join(ctx)); /* the copy may be on the lane */
        CUDA_CHECK(ctx, lucid_conv_igemm_backward_data_wt(
                            dx->dtype, lucid_tensor_data(dy), (const float *)lucid_tensor_data(w),
                            wt, lucid_tensor_data(dx), (float)beta, ws, &pl->ig, st->stream));
        return LUCID_OK;
    }
    if (route == ROUTE_SMALL) {
        lucid_conv_small_geom sg = small_geom_of(g);
        return lucid_conv_small_backward_data(ctx, st->stream, dx->dtype, &sg,
                                              lucid_tensor_data(dy),
                                              (const float *)lucid_tensor_data(w),
                                              lucid_tensor_data(dx), beta);
    }
    if (route == ROUTE_DW)
        return lucid_conv_dw_backward_data(ctx, st->stream, dx->dtype, &pl->dwg,
                                           lucid_tensor_data(dy),
                                           (const float *)lucid_tensor_data(w),
                                           lucid_tensor_data(dx), beta);
#if defined(LUCID_HAVE_CUDNN)
    if (route == ROUTE_CUDNN) {
        const void *wp = lucid_tensor_data(w);
        if (pl->wbytes) {
            void *wc = (char *)ws + nn_align(pl->ws[PASS_BWD_DATA]);
            LUCID_TRY(cast_weight(ctx, st, (const float *)wp, wc, dx->dtype,
                                  g.Cout * g.Cg * g.kh * g.kw));
            wp = wc;
        }
        float one = 1.0f, bt = (float)beta;
        double t0 = first_run_begin(ns, pl, PASS_BWD_DATA);
        CUDNN_CHECK(ctx, cudnnConvolutionBackwardData(
                             st->cudnn, &one, pl->wd, wp, pl->yd, lucid_tensor_data(dy),
                             pl->cd[PASS_BWD_DATA], pl->bd_algo, ws, pl->ws[PASS_BWD_DATA],
                             &bt, pl->xd, lucid_tensor_data(dx)));
        first_run_end(ns, pl, PASS_BWD_DATA, t0);
        return LUCID_OK;
    }
#endif
    NN_DISPATCH(dx->dtype, (lucid_launch(conv_bwd_data_direct<T>, cv_blocks(nx), CONV_THREADS,
                                         0, st->stream, (const T *)lucid_tensor_data(dy),
                                         (const float *)lucid_tensor_data(w),
                                         (T *)lucid_tensor_data(dx), g, (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "conv_bwd_data_direct");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_conv2d_backward_input(lucid_ctx *ctx,
                                                         const lucid_tensor *x,
                                                         const lucid_tensor *dy,
                                                         lucid_tensor *dx,
                                                         const lucid_tensor *w,
                                                         const lucid_conv2d_params *p,
                                                         double beta) {
    return conv_backward_input(ctx, x, dy, dx, w, p, beta, NULL, NULL);
}

extern "C" lucid_status lucid_cuda_conv2d_backward_input_shadow(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy, lucid_tensor *dx,
    const lucid_tensor *w, const lucid_conv2d_params *p, double beta, lucid_conv_wshadow *ws) {
    return conv_backward_input(ctx, x, dy, dx, w, p, beta, ws, NULL);
}

extern "C" lucid_status lucid_cuda_conv2d_backward_input_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy, lucid_tensor *dx,
    const lucid_tensor *w, const lucid_conv2d_params *p, double beta, lucid_conv_wshadow *ws,
    lucid_conv_dcols *dc) {
    return conv_backward_input(ctx, x, dy, dx, w, p, beta, ws, dc);
}

/* The parameter gradients; wc (nullable) the column cache the forward
 * wrote (read when fresh for x on the im2col route). */
static lucid_status conv_backward_params(lucid_ctx *ctx, const lucid_tensor *x,
                                         const lucid_tensor *dy, lucid_tensor *dwt,
                                         lucid_tensor *db, const lucid_conv2d_params *p,
                                         double beta, lucid_conv_wcols *wc) {
    const char *op = "conv2d_backward_params";
    LUCID_TRY(nn_check_act(ctx, op, x->dtype));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_weight", dwt));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_bias", db));
    CUDA_ENTER(ctx, st);
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    if (dwt) {
        lucid_cuda_conv_plan *pl;
        LUCID_TRY(plan_get(ctx, ns, x, dwt->shape, p, &pl));
        const conv_geom &g = pl->g;
        int64_t nw = g.Cout * g.Cg * g.kh * g.kw;
        float *dwp = (float *)lucid_tensor_data(dwt);
        bool done = false;
        int route = ROUTE_DIRECT;
        void *ws = NULL;
        LUCID_TRY(conv_route(ctx, st, ns, pl, PASS_BWD_FILTER, op, &route, &ws));
        if (route == ROUTE_SMALL) {
            lucid_conv_small_geom sg = small_geom_of(g);
            LUCID_TRY(lucid_conv_small_backward_filter(
                ctx, st->stream, x->dtype, &sg, lucid_tensor_data(x), lucid_tensor_data(dy), dwp,
                beta, ws, lucid_conv_small_wgrad_scratch(&sg)));
            done = true;
        }
        if (route == ROUTE_GEMM) {
            LUCID_TRY(lucid_conv_gemm_backward_filter(ctx, st->cublas, st->stream, x->dtype,
                                                      &pl->gg, lucid_tensor_data(x),
                                                      lucid_tensor_data(dy), dwp, (float)beta,
                                                      ws));
            done = true;
        }
        if (route == ROUTE_COL) {
            const void *cols = NULL; /* the forward's, when fresh for x */
            if (wc && lucid_conv_wcols_mode(ns) != LUCID_WCOLS_OFF)
                LUCID_TRY(lucid_conv_wcols_read_begin(
                    ctx, st, wc, x, pl->cg.kh, pl->cg.kw, p, lucid_conv_col_rows(&pl->cg),
                    lucid_conv_col_cols_bytes(&pl->cg), &cols));
            if (cols) {
                LUCID_TRY(lucid_conv_col_backward_filter_cols(ctx, st->cublas, st->stream,
                                                              x->dtype, &pl->cg, cols,
                                                              lucid_tensor_data(dy), dwp,
                                                              (float)beta, ws));
                LUCID_TRY(lucid_conv_wcols_read_end(ctx, st, wc));
            } else {
                LUCID_TRY(lucid_conv_col_backward_filter(ctx, st->cublas, st->stream, x->dtype,
                                                         &pl->cg, lucid_tensor_data(x),
                                                         lucid_tensor_data(dy), dwp,
                                                         (float)beta, ws));
            }
            done = true;
        }
        if (route == ROUTE_IGEMM) {
            CUDA_CHECK(ctx, lucid_conv_igemm_backward_filter(
                                x->dtype, lucid_tensor_data(x), lucid_tensor_data(dy), dwp,
                                (float)beta, ws, &pl->ig, st->stream));
            done = true;
        }
        if (route == ROUTE_DW) {
            LUCID_TRY(lucid_conv_dw_backward_filter(
                ctx, st->stream, x->dtype, &pl->dwg, lucid_tensor_data(x), lucid_tensor_data(dy),
                dwp, beta, ws, lucid_conv_dw_wgrad_scratch_bytes(&pl->dwg)));
            done = true;
        }
#if defined(LUCID_HAVE_CUDNN)
        if (route == ROUTE_CUDNN) {
            float one = 1.0f, zero = 0.0f, bt = (float)beta;
            double t0 = first_run_begin(ns, pl, PASS_BWD_FILTER);
            if (pl->wbytes) {
                void *tmp = (char *)ws + nn_align(pl->ws[PASS_BWD_FILTER]);
                CUDNN_CHECK(ctx, cudnnConvolutionBackwardFilter(
                                     st->cudnn, &one, pl->xd, lucid_tensor_data(x), pl->yd,
                                     lucid_tensor_data(dy), pl->cd[PASS_BWD_FILTER], pl->bf_algo,
                                     ws, pl->ws[PASS_BWD_FILTER], &zero, pl->wd, tmp));
                NN_DISPATCH(x->dtype, (lucid_launch(acc_to_f32<T>, cv_blocks(nw), CONV_THREADS,
                                                    0, st->stream, (const T *)tmp, dwp, nw,
                                                    bt)));
                CUDA_CHECK_LAUNCH(ctx, "acc_to_f32 (conv weight grad)");
            } else {
                CUDNN_CHECK(ctx, cudnnConvolutionBackwardFilter(
                                     st->cudnn, &one, pl->xd, lucid_tensor_data(x), pl->yd,
                                     lucid_tensor_data(dy), pl->cd[PASS_BWD_FILTER], pl->bf_algo,
                                     ws, pl->ws[PASS_BWD_FILTER], &bt, pl->wd, dwp));
            }
            first_run_end(ns, pl, PASS_BWD_FILTER, t0);
            done = true;
        }
#endif
        if (!done) {
            unsigned blocks = (unsigned)(nw < (1 << 30) ? nw : (1 << 30));
            NN_DISPATCH(x->dtype, (lucid_launch(conv_bwd_filter_direct<T>, blocks, CONV_THREADS,
                                                0, st->stream, (const T *)lucid_tensor_data(x),
                                                (const T *)lucid_tensor_data(dy), dwp, g,
                                                (float)beta)));
            CUDA_CHECK_LAUNCH(ctx, "conv_bwd_filter_direct");
        }
    }
    if (db) {
        int64_t N = dy->shape[0], C = dy->shape[1], S = dy->shape[2] * dy->shape[3];
        LUCID_TRY(lucid_cuda_nn_channel_sum(ctx, st, ns, lucid_tensor_data(dy), dy->dtype, N,
                                            C, S, (float *)lucid_tensor_data(db), beta));
    }
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_conv2d_backward_params(lucid_ctx *ctx,
                                                          const lucid_tensor *x,
                                                          const lucid_tensor *dy,
                                                          lucid_tensor *dwt, lucid_tensor *db,
                                                          const lucid_conv2d_params *p,
                                                          double beta) {
    return conv_backward_params(ctx, x, dy, dwt, db, p, beta, NULL);
}

extern "C" lucid_status lucid_cuda_conv2d_backward_params_cols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy, lucid_tensor *dwt,
    lucid_tensor *db, const lucid_conv2d_params *p, double beta, lucid_conv_wcols *wc) {
    return conv_backward_params(ctx, x, dy, dwt, db, p, beta, wc);
}
