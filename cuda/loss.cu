/*
 * loss.cu — the pose loss on the GPU (lucid_pose_loss_cuda_kernels): a port
 * of the CPU reference (engine/train/assigner.c, loss_box.c, loss_kpt.c,
 * loss_cls.c; formulas and sources in engine/train/loss.h), forward and
 * backward, queued on the context's compute stream.
 *
 * Contract
 *   - No host synchronisation, no allocation and no host read inside
 *     forward/backward: every buffer is a view into the plan's one work
 *     storage (the reference layout of loss.c plus the backend area of
 *     loss_backend.h), and the scalars (tss, n_fg, the raw components, the
 *     total) stay in plan->scal on the device, where the backward reads
 *     them. Capturable into a CUDA graph (checked by spec/c/test_loss_cuda.c).
 *   - Bitwise reproducible: the only atomics are integer ones (claim counts,
 *     the first claiming gt, the max of non-negative floats as their bits,
 *     the foreground list's slots, k_topk2's blocks-done counters); every
 *     sum is a fixed-order tree (xor-shuffle inside a warp, warps in index
 *     order, one partial per block, one block folds the partials in index
 *     order), in double as the reference accumulates. The order of the
 *     foreground slots is the hardware's, but every value kept in a slot
 *     depends on its anchor only.
 *   - Agreement with the CPU reference (f32 compute type): each work item
 *     runs the reference's float arithmetic in the reference's order.
 *     Products that feed a sum use __fmul_rn/__fadd_rn so nvcc does not
 *     contract them into FMAs (the host build has none), and exp, log,
 *     log1p, atan and pow are evaluated in double and rounded once, which is
 *     what glibc's float functions return in all but rare halfway cases.
 *     Assignments match exactly except for near-ties within an ulp; losses
 *     and gradients agree to a few ulps.
 *
 * Kernels (one phase each, as the reference), and their threads:
 *   prep_gt   one warp per gt row: every lane evaluates the box and mask
 *             (same loads, same expressions), lane 0 writes the row's
 *             pixels xyxy, widened box of the inside test, label, mask_gt
 *             and zeroes pos_al/pos_ov; keypoint k by lane k % 32.
 *   decode    one thread per (anchor, side), 4 per anchor (the sides warp-
 *             uniform): DFL softmax + expectation of one side, the
 *             reference's sequential chain -> predicted xyxy (grid units);
 *             side 0 zeroes the anchor's claim count.
 *   topk      one block of 1024 threads per (image, gt): each thread keeps
 *             the top-k of its anchors (strided, in index order: ties keep
 *             the lower index), then k rounds of a block argmax over the
 *             threads' heads (xor-shuffle argmax per warp, then over the
 *             warps) give the reference's top-k; the candidates among them
 *             are the gt's positives and claim their anchors (atomicAdd
 *             count, atomicMin first gt). (value desc, index asc) is a total
 *             order on NaN-free values: each thread's list is the top-k of
 *             its anchors under it and the argmax is unique, so the
 *             selection does not depend on the block size or the trees.
 *             (A NaN align metric, i.e. NaN network outputs, has no such
 *             order: the selection then depends on the partition, as it
 *             always did, and differs from the CPU's.)
 *   resolve   per anchor: unclaimed -> background; one claim -> that gt;
 *             several -> argmax overlap over all gts (first on ties); then
 *             max align / overlap per gt (atomicMax on the float bits).
 *   loss      blocks of 256 anchors x LPL_SUB (2) threads: thread t < 256
 *             owns anchor 256 blockIdx + t (the former one-thread-per-anchor
 *             map) and does the normalised target score and class BCE; the
 *             block's foreground anchors are compacted in index order and
 *             their independent terms (4 DFL sides, K keypoints' OKS + kobj,
 *             the CIoU) are spread one per thread over the block (grouped by
 *             kind, passes of 512 when there are more); each term is the
 *             reference's expression in one thread, and the owner adds them
 *             in the reference's order and precision (sides 0..3 in float,
 *             keypoints 0..K-1 in double). Block partials of the 7 sums over
 *             the same 256 anchors with the same tree as before: the extra
 *             threads hold zeros, so their warp sums are +0.0 exactly where
 *             the 8-warp block had 0.0 in lanes 8..31 of the last warp sum.
 *   finalize  one block: folds the partials, writes tss, n_fg, the raw
 *             components, the items and the total (plan->scal and the
 *             caller's total/items tensors).
 *   backward  the layout of loss: class gradients and a background anchor's
 *             zeros split by channel over the anchor's threads; a foreground
 *             anchor's DFL sides (each with the CIoU gradient, recomputed)
 *             and keypoints spread one per thread over the block. d total /
 *             d outputs (every element written), in the gradients' dtypes,
 *             times the optional device grad_scale; nothing is summed
 *             across threads.
 * Every value is computed by the same expression on the same inputs as
 * with one thread per anchor / 256 threads per gt, and every sum keeps its
 * order: the outputs are bitwise those of that layout.
 *
 * Spread kernels (the default; same bits as topk / loss / backward above,
 * which stay for A/B runs: LUCID_LOSS_TOPK=0 and LUCID_LOSS_TERMS=0, read
 * at every call, select them; spec/c/test_loss_cuda.c checks all four
 * settings bit for bit):
 *   topk2     up to 8 blocks of 256 per (image, gt) instead of one: only
 *             the gt's candidate cells are evaluated (one rectangle per
 *             level, found by binary search on the inside test's own float
 *             expressions), sliced over the warps; per-lane top-k lists in
 *             registers (no local memory), warp maxima with redux.sync on
 *             64-bit (metric, ~index) keys, a merge per block and one over
 *             the blocks plus the first k anchors outside the rectangles
 *             (metric +0.0): exactly k_topk's top-k (cuda/loss_topk.cuh
 *             says why; spec/c/test_loss_topk_emu.cu checks it on the
 *             host). Serves topk <= 16 (TK_KR); k_topk the rest.
 *   resolve   (both settings) also lists the foreground anchors in slots
 *             (FgBufs: one atomicAdd per warp) with their keypoint
 *             constants.
 *   items     one thread per foreground term (4 DFL sides, K keypoints,
 *             the CIoU of every foreground anchor) over a grid sized by
 *             the capacity (<= 4 blocks per SM, grid-stride beyond): the
 *             terms of a crowded block of anchors no longer queue in that
 *             block; each term into its slot (FgBufs.itm).
 *   loss2     one thread per anchor, k_loss's blocks of 256 anchors: the
 *             owner's part of k_loss, the slot's terms added in k_loss's
 *             order and precision, the same block partials.
 *   backward2 one grid of two kinds of blocks: the foreground items (a DFL
 *             side with its CIoU gradient, a keypoint) grid-stride over
 *             the first blocks, then one thread per anchor (class
 *             gradients, a background anchor's zeros).
 */
#define LUCID_POSE_LOSS_INTERNAL
#include "common.cuh"
#include "loss_topk.cuh"
#include "train/loss_backend.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LPL_MAX_TOPK 64 /* as loss.c / assigner.c */
#define LPL_MAX_REG 64  /* as loss.c / loss_box.c */
#define LPL_THREADS 256 /* anchors per block (and per loss partial) */
#define LPL_SUB 2       /* threads per anchor of k_loss / k_backward */
#define LPL_LB_THREADS (LPL_THREADS * LPL_SUB)
#define LPL_DEC_ANCHORS (LPL_THREADS / 4) /* k_decode: 4 sides per anchor */
#define LPL_PREP_THREADS 128 /* k_prep_gt: 4 gt rows (warps) per block */
#define LPL_TOPK_THREADS 1024
#define LPL_FIN_THREADS 256
#define LPL_TK_THREADS 256 /* k_topk2: threads per block */
#define LPL_TK_BPG 8       /* k_topk2: blocks per gt */
#define LPL_TK_WARPS (LPL_TK_BPG * LPL_TK_THREADS / 32) /* warps per gt */
#define LPL_ITEM_WAVES 4   /* k_items / k_backward2: at most 4 blocks per SM */

/* Block partials of the loss kernel (slot stride 8 doubles). */
enum { Q_BOX = 0, Q_DFL, Q_POSE, Q_KOBJ, Q_CLS, Q_TSS, Q_NFG, Q_N };
#define Q_STRIDE 8

/* ------------------------------------------------------------ parameters */

struct Geom {
    int B, G, A, K, nc, R, topk, nlev;
    int off[LUCID_POSE_LOSS_MAX_LEVELS + 1]; /* first anchor of each level */
    int w[LUCID_POSE_LOSS_MAX_LEVELS];
    float s[LUCID_POSE_LOSS_MAX_LEVELS];
    float W, H, s0, s1;
    double tal_alpha, tal_beta;
    double gain_box, gain_cls, gain_dfl, gain_pose, gain_kobj;
};

struct Bufs {
    const double *sigmas;
    double *scal;
    int32_t *gt_label;
    uint8_t *gt_mask;
    float *gt_box, *gt_cand, *gt_kpt, *pbox;
    int32_t *pos, *tgt;
    float *tscore, *alpha, *pos_al, *pos_ov;
    int32_t *cnt, *first; /* backend area: claims per anchor */
    double *part;         /* backend area: loss block partials */
};

/* Backend area of the spread kernels (k_topk2, k_items, k_loss2,
 * k_backward2). cap = min(B G topk, B A) bounds the foreground count: a
 * foreground anchor is a positive of some gt, and a gt has <= topk. */
struct FgBufs {
    int32_t *n;           /* [1] foreground anchors of the last assignment */
    int32_t *list;        /* [cap] slot -> anchor b A + a (k_resolve order) */
    int32_t *slot;        /* [B A] anchor -> slot (foreground anchors only) */
    float *area, *factor; /* [cap] keypoint constants (kpt_consts) of a slot */
    float *itm;           /* [cap (5 + 2K)] forward terms of a slot: DFL
                           * sides 0..3, OKS terms 0..K-1, kobj BCEs
                           * 0..K-1, CIoU */
    tk_key_t *tk;         /* [B G LPL_TK_BPG TK_KR] k_topk2 block lists */
    int32_t *tk_ctr;      /* [B G] k_topk2 blocks done per gt (0 between
                           * launches: the last block resets it) */
};

/* A strided [B, C, A] output (or gradient) of the network. */
struct View {
    const void *p; /* element [0,0,0] */
    int dt;
    int64_t sb, sc, sa;
};
struct OView {
    void *p;
    int dt;
    int64_t sb, sc, sa;
};

/* A strided target tensor (up to 4 dims). */
struct TView {
    const void *p;
    int dt;
    int64_t s[4];
};
struct Targets {
    TView cls, box, kpt, valid;
};

/* The caller's total / items (any float dtype): storage base + offsets. */
struct Scalars {
    void *total;
    int total_dt;
    int64_t total_off;
    void *items;
    int items_dt;
    int64_t items_off[LUCID_POSE_LOSS_NITEMS];
};

__device__ __forceinline__ float ld(const View &v, int b, int c, int a) {
    return lucid_load_f32(v.p, v.dt, (int64_t)b * v.sb + (int64_t)c * v.sc +
                                         (int64_t)a * v.sa);
}
__device__ __forceinline__ void stg(const OView &v, int b, int c, int a,
                                   float x) {
    lucid_store_f32(v.p, v.dt,
                    (int64_t)b * v.sb + (int64_t)c * v.sc + (int64_t)a * v.sa,
                    x);
}

/* ------------------------------------------------------------ float math
 * No contraction (the reference is compiled without FMA); transcendental
 * functions in double, rounded once. */
#define FM(a, b) __fmul_rn((a), (b))
#define FA(a, b) __fadd_rn((a), (b))
#define FS(a, b) __fsub_rn((a), (b))

__device__ __forceinline__ float m_exp(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float m_log(float x) { return (float)log((double)x); }
__device__ __forceinline__ float m_log1p(float x) {
    return (float)log1p((double)x);
}
__device__ __forceinline__ float m_atan(float x) {
    return (float)atan((double)x);
}
__device__ __forceinline__ float m_pow(float x, float y) {
    return (float)pow((double)x, (double)y);
}
/* 1 / (1 + exp(-z)) */
__device__ __forceinline__ float m_sigmoid(float z) {
    return 1.0f / FA(1.0f, m_exp(-z));
}
/* (1 - y) z - min(z, 0) + log1p(exp(-|z|)) */
__device__ __forceinline__ float m_bce(float z, float y) {
    const float mn = z < 0 ? z : 0.0f;
    const float e = z < 0 ? z : -z;
    return FA(FS(FM(FS(1.0f, y), z), mn), m_log1p(m_exp(e)));
}
/* x^e with torch.pow's exact special exponents (assigner.c powr) */
__device__ __forceinline__ float m_powr(float x, double e) {
    if (e == 0.5) return sqrtf(x);
    if (e == 1.0) return x;
    if (e == 2.0) return FM(x, x);
    if (e == 3.0) return FM(FM(x, x), x);
    return m_pow(x, (float)e);
}

__device__ __forceinline__ float dmin_(float u, float v) {
    return u < v ? 1.0f : (u == v ? 0.5f : 0.0f);
}
__device__ __forceinline__ float dmax_(float u, float v) {
    return u > v ? 1.0f : (u == v ? 0.5f : 0.0f);
}

/* bbox_iou(CIoU=True, eps=1e-7) of b1 against b2 (xyxy), as lpl_ciou_f32:
 * *alpha computed and stored unless alpha_given; with g1 adds
 * scale * dCIoU/db1 (alpha constant). */
__device__ float ciou(const float *b1, const float *b2, float *alpha,
                      int alpha_given, float scale, float *g1) {
    const float eps = 1e-7f;
    const float x1 = b1[0], y1 = b1[1], x2 = b1[2], y2 = b1[3];
    const float X1 = b2[0], Y1 = b2[1], X2 = b2[2], Y2 = b2[3];
    const float w1 = FS(x2, x1), h1 = FA(FS(y2, y1), eps);
    const float w2 = FS(X2, X1), h2 = FA(FS(Y2, Y1), eps);
    const float ix2 = x2 < X2 ? x2 : X2, ix1 = x1 > X1 ? x1 : X1;
    const float iy2 = y2 < Y2 ? y2 : Y2, iy1 = y1 > Y1 ? y1 : Y1;
    const float iwr = FS(ix2, ix1), ihr = FS(iy2, iy1);
    const float iw = iwr > 0 ? iwr : 0.0f, ih = ihr > 0 ? ihr : 0.0f;
    const float inter = FM(iw, ih);
    const float uni = FA(FS(FA(FM(w1, h1), FM(w2, h2)), inter), eps);
    const float iou = inter / uni;
    const float cw = FS(x2 > X2 ? x2 : X2, x1 < X1 ? x1 : X1);
    const float ch = FS(y2 > Y2 ? y2 : Y2, y1 < Y1 ? y1 : Y1);
    const float c2 = FA(FA(FM(cw, cw), FM(ch, ch)), eps);
    const float dx = FS(FS(FA(X1, X2), x1), x2);
    const float dy = FS(FS(FA(Y1, Y2), y1), y2);
    const float rho2 = FA(FM(dx, dx), FM(dy, dy)) / 4.0f;
    const float kv =
        (float)(4.0 / (3.14159265358979323846 * 3.14159265358979323846));
    const float r1 = w1 / h1;
    const float at = FS(m_atan(w2 / h2), m_atan(r1));
    const float v = FM(kv, FM(at, at));
    if (!alpha_given) *alpha = v / FA(FS(v, iou), (float)(1.0 + 1e-7));
    const float al = *alpha;
    const float c = FS(iou, FA(rho2 / c2, FM(v, al)));
    if (g1) {
        const float g_inter = scale * (1 / uni + inter / (uni * uni));
        const float g_a1 = -scale * inter / (uni * uni);
        const float g_r1 = -scale * al * kv * 2 * at * (-1 / (1 + r1 * r1));
        const float g_w1 = g_a1 * h1 + g_r1 / h1;
        const float g_h1 = g_a1 * w1 - g_r1 * w1 / (h1 * h1);
        const float g_iw = iwr >= 0 ? g_inter * ih : 0.0f;
        const float g_ih = ihr >= 0 ? g_inter * iw : 0.0f;
        const float g_c2 = scale * rho2 / (c2 * c2);
        const float g_rho2 = -scale / c2;
        const float g_cw = g_c2 * 2 * cw, g_ch = g_c2 * 2 * ch;
        g1[0] += -g_w1 - g_iw * dmax_(x1, X1) - g_cw * dmin_(x1, X1) -
                 g_rho2 * dx / 2;
        g1[2] += g_w1 + g_iw * dmin_(x2, X2) + g_cw * dmax_(x2, X2) -
                 g_rho2 * dx / 2;
        g1[1] += -g_h1 - g_ih * dmax_(y1, Y1) - g_ch * dmin_(y1, Y1) -
                 g_rho2 * dy / 2;
        g1[3] += g_h1 + g_ih * dmin_(y2, Y2) + g_ch * dmax_(y2, Y2) -
                 g_rho2 * dy / 2;
    }
    return c;
}

/* Anchor a: cell centre (grid units) and stride (make_anchors). */
__device__ __forceinline__ void anchor(const Geom &g, int a, float &ax,
                                       float &ay, float &s) {
    int l = 0;
    while (l + 1 < g.nlev && a >= g.off[l + 1]) l++;
    const int r = a - g.off[l];
    const int i = r / g.w[l], j = r - i * g.w[l];
    ax = (float)j + 0.5f;
    ay = (float)i + 0.5f;
    s = g.s[l];
}

/* Softmax of one side's bins (z[0..R-1]) into pr; returns log-sum-exp.
 * RF > 0: R is the compile-time RF (arrays in registers). */
template <int RF>
__device__ __forceinline__ float softmax_side(const float *z, int R,
                                              float *pr) {
    const int n = RF > 0 ? RF : R;
    float m = z[0], s = 0.0f;
#pragma unroll
    for (int i = 1; i < n; i++)
        if (z[i] > m) m = z[i];
#pragma unroll
    for (int i = 0; i < n; i++) {
        pr[i] = m_exp(FS(z[i], m));
        s = FA(s, pr[i]);
    }
#pragma unroll
    for (int i = 0; i < n; i++) pr[i] = pr[i] / s;
    return FA(m, m_log(s));
}

template <int RF>
__device__ __forceinline__ float expect_side(const float *pr, int R) {
    const int n = RF > 0 ? RF : R;
    float e = 0.0f;
#pragma unroll
    for (int i = 0; i < n; i++) e = FA(e, FM(pr[i], (float)i));
    return e;
}

template <int RF>
__device__ __forceinline__ void load_side(const View &box, int b, int sd,
                                          int a, int R, float *z) {
    const int n = RF > 0 ? RF : R;
#pragma unroll
    for (int i = 0; i < n; i++) z[i] = ld(box, b, sd * n + i, a);
}

/* Inside test of the assigner (select_candidates_in_gts) for gt row r. */
__device__ __forceinline__ int inside(const Bufs &bf, int64_t r, float px,
                                      float py) {
    const float *cd = bf.gt_cand + r * 4;
    float d = FS(px, cd[0]), e;
    if ((e = FS(py, cd[1])) < d) d = e;
    if ((e = FS(cd[2], px)) < d) d = e;
    if ((e = FS(cd[3], py)) < d) d = e;
    return d > 1e-9f;
}

/* The pair (gt g, anchor a) of image b, as assigner.c pair(): 1 when a is a
 * candidate; *ov = clamp(CIoU(gt, pred px), 0), *al = score^alpha ov^beta
 * (both 0 for non-candidates). */
__device__ int pair(const Geom &g, const Bufs &bf, const View &cls, int b,
                    int gi, int a, float *ov, float *al) {
    const int64_t r = (int64_t)b * g.G + gi;
    *ov = 0.0f, *al = 0.0f;
    if (!bf.gt_mask[r]) return 0;
    float ax, ay, s;
    anchor(g, a, ax, ay, s);
    const float px = FM(ax, s), py = FM(ay, s);
    if (!inside(bf, r, px, py)) return 0;
    const float *pb = bf.pbox + ((int64_t)b * g.A + a) * 4;
    const float pd[4] = {FM(pb[0], s), FM(pb[1], s), FM(pb[2], s),
                         FM(pb[3], s)};
    float alpha;
    float o = ciou(bf.gt_box + r * 4, pd, &alpha, 0, 0.0f, NULL);
    if (!(o > 0)) o = 0.0f;
    const float z = ld(cls, b, bf.gt_label[r], a);
    const float sc = m_sigmoid(z);
    *ov = o;
    *al = FM(m_powr(sc, g.tal_alpha), m_powr(o, g.tal_beta));
    return 1;
}

__device__ __forceinline__ int is_candidate(const Geom &g, const Bufs &bf,
                                            int b, int gi, int a) {
    const int64_t r = (int64_t)b * g.G + gi;
    if (!bf.gt_mask[r]) return 0;
    float ax, ay, s;
    anchor(g, a, ax, ay, s);
    return inside(bf, r, FM(ax, s), FM(ay, s));
}

/* ------------------------------------------------------------ reductions */

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Fixed-order block sums of Q_N values (blockDim.x a multiple of 32);
 * result valid in thread 0. sh: [Q_N][32]. */
__device__ __forceinline__ void block_sums(double *v, double (*sh)[32]) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
#pragma unroll
    for (int q = 0; q < Q_N; q++) {
        const double w = warp_sum_d(v[q]);
        if (lane == 0) sh[q][wid] = w;
    }
    __syncthreads();
    if (wid == 0) {
#pragma unroll
        for (int q = 0; q < Q_N; q++)
            v[q] = warp_sum_d(lane < nw ? sh[q][lane] : 0.0);
    }
}

/* ------------------------------------------------------------ kernels */

/* One warp per gt row: every lane evaluates the row's box and mask (the
 * same loads, the same float expressions), lane 0 writes the per-row values
 * and the lanes write the keypoints k = lane, lane + 32, ... */
__global__ void k_prep_gt(Geom g, Bufs bf, FgBufs fb, Targets t) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r == 0 && lane == 0) *fb.n = 0; /* k_resolve appends the new list */
    if (r >= (int64_t)g.B * g.G) return;
    const int64_t b = r / g.G, gi = r % g.G;
    const int K = g.K;
    float *bx = bf.gt_box + r * 4, *cd = bf.gt_cand + r * 4;
    float *k3 = bf.gt_kpt + r * K * 3;
    if (lane == 0) {
        bf.pos_al[r] = 0.0f;
        bf.pos_ov[r] = 0.0f;
    }
    const int valid =
        lucid_load_f64(t.valid.p, t.valid.dt,
                       b * t.valid.s[0] + gi * t.valid.s[1]) != 0.0;
    const int64_t ob = b * t.box.s[0] + gi * t.box.s[1];
    const float W = g.W, H = g.H;
    const float x = FM((float)lucid_load_f64(t.box.p, t.box.dt, ob), W);
    const float y =
        FM((float)lucid_load_f64(t.box.p, t.box.dt, ob + t.box.s[2]), H);
    const float w =
        FM((float)lucid_load_f64(t.box.p, t.box.dt, ob + 2 * t.box.s[2]), W);
    const float h =
        FM((float)lucid_load_f64(t.box.p, t.box.dt, ob + 3 * t.box.s[2]), H);
    const float hw = w / 2, hh = h / 2;
    const float x1 = FS(x, hw), y1 = FS(y, hh), x2 = FA(x, hw), y2 = FA(y, hh);
    const int ok = valid && FA(FA(FA(x1, y1), x2), y2) > 0;
    if (!ok) {
        if (lane == 0) {
            bf.gt_mask[r] = 0;
            bf.gt_label[r] = 0;
            for (int j = 0; j < 4; j++) bx[j] = cd[j] = 0.0f;
        }
        for (int j = lane; j < K * 3; j += 32) k3[j] = 0.0f;
        return;
    }
    if (lane == 0) {
        bf.gt_mask[r] = 1;
        const double c = lucid_load_f64(t.cls.p, t.cls.dt,
                                        b * t.cls.s[0] + gi * t.cls.s[1]);
        int lab = 0;
        if (c >= g.nc) lab = g.nc - 1;
        else if (c >= 0) lab = (int)c;
        bf.gt_label[r] = lab;
        bx[0] = x1, bx[1] = y1, bx[2] = x2, bx[3] = y2;
        const float cx = FA(x1, x2) / 2, cy = FA(y1, y2) / 2;
        float cw = FS(x2, x1), ch = FS(y2, y1);
        if (cw < g.s0) cw = g.s1;
        if (ch < g.s0) ch = g.s1;
        const float chw = cw / 2, chh = ch / 2;
        cd[0] = FS(cx, chw), cd[1] = FS(cy, chh), cd[2] = FA(cx, chw),
        cd[3] = FA(cy, chh);
    }
    const int64_t ok0 = b * t.kpt.s[0] + gi * t.kpt.s[1];
    for (int k = lane; k < K; k += 32) {
        const int64_t o = ok0 + k * t.kpt.s[2];
        k3[k * 3 + 0] = FM((float)lucid_load_f64(t.kpt.p, t.kpt.dt, o), W);
        k3[k * 3 + 1] =
            FM((float)lucid_load_f64(t.kpt.p, t.kpt.dt, o + t.kpt.s[3]), H);
        k3[k * 3 + 2] =
            (float)lucid_load_f64(t.kpt.p, t.kpt.dt, o + 2 * t.kpt.s[3]);
    }
}

/* One thread per (anchor, side): block = LPL_DEC_ANCHORS anchors x 4 sides,
 * side = threadIdx.x / LPL_DEC_ANCHORS (warp-uniform). Each side's softmax
 * and expectation is the reference's sequential chain in one thread. */
template <int RF>
__global__ void __launch_bounds__(LPL_THREADS)
    k_decode(Geom g, Bufs bf, View box) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int sd = threadIdx.x / LPL_DEC_ANCHORS;
    const int64_t i = (int64_t)blockIdx.x * LPL_DEC_ANCHORS +
                      (threadIdx.x % LPL_DEC_ANCHORS);
    if (i >= (int64_t)g.B * g.A) return;
    const int b = (int)(i / g.A), a = (int)(i % g.A);
    float ax, ay, s;
    anchor(g, a, ax, ay, s);
    constexpr int NZ = RF > 0 ? RF : LPL_MAX_REG;
    float z[NZ], pr[NZ];
    load_side<RF>(box, b, sd, a, g.R, z);
    softmax_side<RF>(z, g.R, pr);
    const float E = expect_side<RF>(pr, g.R);
    const float c = (sd & 1) ? ay : ax;
    bf.pbox[i * 4 + sd] = sd < 2 ? FS(c, E) : FA(c, E);
    if (sd == 0) {
        bf.cnt[i] = 0;
        bf.first[i] = INT_MAX;
    }
}

/* (v1, i1) ranks before (v2, i2): larger value, then lower index. */
__device__ __forceinline__ bool ranks_before(float v1, int i1, float v2,
                                             int i2) {
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

__global__ void __launch_bounds__(LPL_TOPK_THREADS)
    k_topk(Geom g, Bufs bf, View cls) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int bg = blockIdx.x;
    const int b = bg / g.G, gi = bg % g.G;
    const int k = g.topk;
    int32_t *pos = bf.pos + (int64_t)bg * k;
    if (!bf.gt_mask[bg]) {
        for (int j = threadIdx.x; j < k; j += blockDim.x) pos[j] = -1;
        return;
    }
    /* 1. this thread's top-k of its anchors a = tid, tid + T, ... (the
     * reference insertion: equal values keep the earlier, lower index) */
    float val[LPL_MAX_TOPK];
    int idx[LPL_MAX_TOPK];
    int n = 0;
    for (int a = threadIdx.x; a < g.A; a += blockDim.x) {
        float ov, al;
        pair(g, bf, cls, b, gi, a, &ov, &al);
        int j;
        if (n < k) j = n++;
        else if (al > val[k - 1]) j = k - 1;
        else continue;
        for (; j > 0 && val[j - 1] < al; j--) {
            val[j] = val[j - 1];
            idx[j] = idx[j - 1];
        }
        val[j] = al, idx[j] = a;
    }
    /* 2. k rounds of a block argmax over the heads of the threads' lists:
     * an xor-shuffle argmax in each warp, then every warp the same
     * xor-shuffle argmax over the warps' winners. (value desc, index asc)
     * is a total order on the NaN-free values, so the winner is unique and
     * independent of the tree and of the block size. */
    __shared__ float wv[2][32];
    __shared__ int wi[2][32];
    __shared__ int sel[LPL_MAX_TOPK];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    int h = 0;
    for (int j = 0; j < k; j++) {
        float v = h < n ? val[h] : -INFINITY;
        int ix = h < n ? idx[h] : INT_MAX;
        const int mine = ix;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, ix, o);
            if (ranks_before(v2, i2, v, ix)) v = v2, ix = i2;
        }
        if (lane == 0) wv[j & 1][wid] = v, wi[j & 1][wid] = ix;
        __syncthreads();
        float bv = lane < nw ? wv[j & 1][lane] : -INFINITY;
        int bi = lane < nw ? wi[j & 1][lane] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_before(v2, i2, bv, bi)) bv = v2, bi = i2;
        }
        if (mine == bi && bi != INT_MAX) h++;
        if (threadIdx.x == 0) sel[j] = bi;
    }
    __syncthreads();
    /* 3. positives = top-k AND candidate; claim the anchors */
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int a = sel[j];
        int p = -1;
        if (a >= 0 && a < g.A && is_candidate(g, bf, b, gi, a)) {
            p = a;
            const int64_t i = (int64_t)b * g.A + a;
            atomicAdd(&bf.cnt[i], 1);
            atomicMin(&bf.first[i], gi);
        }
        pos[j] = p;
    }
}

/* Warp maximum of a 64-bit key (two 32-bit redux steps: the high words,
 * then the low words of the lanes holding the highest high word). */
__device__ __forceinline__ tk_key_t warp_max_key(tk_key_t x) {
    const unsigned hi = __reduce_max_sync(0xffffffffu, (unsigned)(x >> 32));
    const unsigned lo = __reduce_max_sync(
        0xffffffffu, (unsigned)(x >> 32) == hi ? (unsigned)x : 0u);
    return ((tk_key_t)hi << 32) | lo;
}

/* Merge of nl <= 32 descending key lists lst[l k .. l k + k - 1] (0-padded;
 * shared memory), lane l owning list l: k rounds of a warp maximum over the
 * lists' heads, the winner's list advancing (keys are unique, so one lane
 * wins). Returns in lane r < k the r-th key of the merged order (0: none);
 * called by a whole warp. */
__device__ __forceinline__ tk_key_t tk_merge(const tk_key_t *lst, int nl,
                                             int k) {
    const int lane = threadIdx.x & 31;
    int h = 0;
    tk_key_t cur = lane < nl ? lst[lane * k] : 0, mine = 0;
    for (int r = 0; r < k; r++) {
        const tk_key_t m = warp_max_key(cur);
        if (m == 0) break;
        if (lane == r) mine = m;
        if (cur == m) cur = ++h < k ? lst[lane * k + h] : 0;
    }
    return mine;
}

/* The candidate rectangles of gt cand box cd (global memory) on every
 * level: lane 4 l + q runs the binary search of bound q of level l
 * (tk_bound), then every lane gathers all of them. Called by a whole
 * warp. */
__device__ __forceinline__ void tk_rects(const Geom &g, const float *cd,
                                         TkRects &R) {
    const int lane = threadIdx.x & 31, l = lane >> 2, q = lane & 3;
    int v = 0;
    if (l < g.nlev) {
        const int w = g.w[l], h = (g.off[l + 1] - g.off[l]) / w;
        v = tk_bound(q, cd, w, h, g.s[l]);
    }
    R.nlev = g.nlev;
#pragma unroll
    for (int l2 = 0; l2 < TK_MAX_LEVELS; l2++) {
        R.off[l2] = g.off[l2];
        R.w[l2] = g.w[l2];
        R.j0[l2] = __shfl_sync(0xffffffffu, v, 4 * l2 + 0);
        R.i0[l2] = __shfl_sync(0xffffffffu, v, 4 * l2 + 1);
        R.j1[l2] = __shfl_sync(0xffffffffu, v, 4 * l2 + 2);
        R.i1[l2] = __shfl_sync(0xffffffffu, v, 4 * l2 + 3);
        R.n[l2] = l2 < g.nlev ? tk_rect_cells(R.i0[l2], R.i1[l2], R.j0[l2],
                                              R.j1[l2])
                              : 0;
    }
    R.off[TK_MAX_LEVELS] = g.off[TK_MAX_LEVELS];
}

/* The top-k of the assigner spread over up to LPL_TK_BPG blocks per
 * (image, gt) (topk <= TK_KR; the result and the claims are k_topk's, see
 * loss_topk.cuh for why):
 *   1. every warp finds the gt's candidate rectangles (tk_rects); the gt's
 *      N candidate cells, in index order, are cut into slices of sw =
 *      tk_slice(N, LPL_TK_WARPS) cells, one per warp of the gt's blocks
 *      (blocks past the last slice return at once), lanes strided over the
 *      slice; each cell's metric is pair()'s (the call k_topk makes) and
 *      goes into the lane's register list (tk_insert);
 *   2. each warp: k rounds of a warp maximum over its lanes' heads -> its
 *      top-k (shared memory); warp 0 merges the block's 8 lists
 *      (tk_merge). With one busy block that is the gt's list of the
 *      candidates; with nb > 1 each busy block stores its list (fb.tk) and
 *      the last one to finish (fence, counter fb.tk_ctr, which it resets)
 *      merges the nb lists. The last merge also takes the first k anchors
 *      outside the rectangles (metric +0.0, tk_outside): the gt's top-k;
 *   3. as k_topk: positives = top-k AND candidate; they claim their anchors
 *      (atomicAdd count, atomicMin first gt) and pos gets the top-k in
 *      order, -1 for a non-candidate.
 * (value desc, index asc) is a total order on NaN-free metrics, so every
 * list is the exact top-k of its part and the merges give the exact top-k
 * of the whole, whatever the slices: pos and the claims are k_topk's. */
__global__ void __launch_bounds__(LPL_TK_THREADS, 3)
    k_topk2(Geom g, Bufs bf, FgBufs fb, View cls) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr int WPB = LPL_TK_THREADS / 32; /* warps per block */
    __shared__ tk_key_t s_l[(LPL_TK_BPG + 1) * TK_KR];
    const int bg = blockIdx.x / LPL_TK_BPG, c = blockIdx.x % LPL_TK_BPG;
    const int b = bg / g.G, gi = bg % g.G;
    const int k = g.topk;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int32_t *pos = bf.pos + (int64_t)bg * k;
    if (!bf.gt_mask[bg]) {
        if (c == 0)
            for (int j = threadIdx.x; j < k; j += blockDim.x) pos[j] = -1;
        return;
    }
    /* 1. this warp's slice of the candidate cells */
    TkRects R;
    tk_rects(g, bf.gt_cand + (int64_t)bg * 4, R);
    int N = 0;
#pragma unroll
    for (int l = 0; l < TK_MAX_LEVELS; l++) N += R.n[l];
    const int sw = tk_slice(N, LPL_TK_WARPS);
    const int nb = (N + WPB * sw - 1) / (WPB * sw); /* busy blocks */
    if (c > 0 && c >= nb) return; /* block 0 also serves N = 0 */
    const int e0 = (c * WPB + wid) * sw;
    const int e1 = e0 + sw < N ? e0 + sw : N;
    tk_key_t L[TK_KR];
#pragma unroll
    for (int q = 0; q < TK_KR; q++) L[q] = 0;
    for (int e = e0 + lane; e < e1; e += 32) {
        const int a = tk_cell_anchor(R, e);
        float ov, al;
        pair(g, bf, cls, b, gi, a, &ov, &al);
        tk_insert(L, tk_key(al, a));
    }
    /* 2. the warp's top-k, the block's, the gt's */
    tk_key_t mine = 0;
    for (int r = 0; r < k; r++) {
        const tk_key_t m = warp_max_key(L[0]);
        if (m == 0) break;
        if (lane == r) mine = m;
        if (L[0] == m) tk_pop(L);
    }
    if (lane < k) s_l[wid * k + lane] = mine;
    __syncthreads();
    if (wid != 0) return;
    mine = tk_merge(s_l, WPB, k);
    int nl = 1; /* block lists in the last merge */
    if (nb > 1) {
        tk_key_t *gl = fb.tk + (int64_t)bg * LPL_TK_BPG * TK_KR;
        if (lane < k) gl[c * k + lane] = mine;
        __threadfence();
        __syncwarp(); /* also: tk_merge's reads of s_l are done */
        int last = 0;
        if (lane == 0) {
            __threadfence();
            last = atomicAdd(&fb.tk_ctr[bg], 1) == nb - 1;
        }
        if (!__shfl_sync(0xffffffffu, last, 0)) return;
        __threadfence();
        for (int e = lane; e < nb * k; e += 32) s_l[e] = __ldcg(gl + e);
        if (lane == 0) fb.tk_ctr[bg] = 0; /* for the next launch */
        nl = nb;
    } else {
        __syncwarp(); /* tk_merge's reads of s_l are done */
        if (lane < k) s_l[lane] = mine;
    }
    if (lane < k) {
        const int a = tk_outside(R, lane);
        s_l[nl * k + lane] = a >= 0 ? tk_key(0.0f, a) : 0;
    }
    __syncwarp();
    mine = tk_merge(s_l, nl + 1, k);
    /* 3. positives = top-k AND candidate; claim the anchors */
    if (lane < k) {
        const int a = mine ? tk_anchor(mine) : -1;
        int p = -1;
        if (a >= 0 && a < g.A && is_candidate(g, bf, b, gi, a)) {
            p = a;
            const int64_t i = (int64_t)b * g.A + a;
            atomicAdd(&bf.cnt[i], 1);
            atomicMin(&bf.first[i], gi);
        }
        pos[lane] = p;
    }
}

/* Keypoint box area and visibility factor of gt row r at stride s. */
__device__ __forceinline__ void kpt_consts(const Geom &g, const float *gb,
                                           const float *gk, float s,
                                           float &area, float &factor) {
    area = FM(FS(gb[2] / s, gb[0] / s), FS(gb[3] / s, gb[1] / s));
    int nvis = 0;
    for (int k = 0; k < g.K; k++) nvis += gk[k * 3 + 2] != 0;
    const float rcp = 1.0f / FA((float)nvis, 1e-9f);
    factor = FM(rcp, (float)g.K);
}

/* One thread per anchor (blocks of whole warps): the assigned gt, the raw
 * target score, the gt's max align / overlap; then the foreground anchors
 * take slots of the foreground list (fb: one atomicAdd per warp, lanes in
 * index order; the order of the warps is the hardware's, which changes
 * nothing downstream: every slot's values depend on its anchor only) with
 * their keypoint constants (kpt_consts, as k_loss computes them). */
__global__ void k_resolve(Geom g, Bufs bf, FgBufs fb, View cls) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int in = i < (int64_t)g.B * g.A;
    const int b = in ? (int)(i / g.A) : 0, a = in ? (int)(i % g.A) : 0;
    int t = -1;
    if (in) {
        const int c = bf.cnt[i];
        float ov, al;
        if (c == 1) {
            t = bf.first[i];
        } else if (c > 1) {
            /* select_highest_overlaps: argmax overlap over all gts */
            float best = 0.0f;
            t = 0;
            for (int gi = 0; gi < g.G; gi++) {
                pair(g, bf, cls, b, gi, a, &ov, &al);
                if (gi == 0 || ov > best) best = ov, t = gi;
            }
        }
        bf.tgt[i] = t;
        if (t < 0) {
            bf.tscore[i] = 0.0f;
        } else {
            pair(g, bf, cls, b, t, a, &ov, &al);
            const int64_t r = (int64_t)b * g.G + t;
            /* non-negative floats order as their bits */
            atomicMax((unsigned int *)&bf.pos_al[r], __float_as_uint(al));
            atomicMax((unsigned int *)&bf.pos_ov[r], __float_as_uint(ov));
            bf.tscore[i] = al; /* the loss kernel normalises it */
        }
    }
    /* the foreground list */
    const int fg = t >= 0;
    const unsigned m = __ballot_sync(0xffffffffu, fg);
    if (!m) return;
    const int lane = threadIdx.x & 31;
    int base = 0;
    if (lane == 0) base = atomicAdd(fb.n, __popc(m));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (!fg) return;
    const int slot = base + __popc(m & ((1u << lane) - 1u));
    fb.list[slot] = (int32_t)i;
    fb.slot[i] = slot;
    float ax, ay, s, area, factor;
    anchor(g, a, ax, ay, s);
    const int64_t r = (int64_t)b * g.G + t;
    kpt_consts(g, bf.gt_box + r * 4, bf.gt_kpt + r * g.K * 3, s, area, factor);
    fb.area[slot] = area;
    fb.factor[slot] = factor;
}

/* Foreground compaction of a block's LPL_THREADS anchors (threads
 * 0 .. LPL_THREADS-1 own them; every thread of the block calls this, fg is 0
 * in the others): returns the rank of the thread's anchor among the block's
 * foreground anchors in index order (-1 when fg is 0), *nf their count. */
__device__ __forceinline__ int fg_compact(int fg, int *s_cnt, int *nf) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const unsigned m = __ballot_sync(0xffffffffu, fg);
    if (lane == 0 && wid < LPL_THREADS / 32) s_cnt[wid] = __popc(m);
    __syncthreads();
    int off = 0, tot = 0;
#pragma unroll
    for (int w = 0; w < LPL_THREADS / 32; w++) {
        if (w < wid) off += s_cnt[w];
        tot += s_cnt[w];
    }
    *nf = tot;
    return fg ? off + __popc(m & ((1u << lane) - 1u)) : -1;
}

/* The foreground list of a k_loss / k_backward block: fg_compact, then a
 * foreground thread publishes its anchor (tid) and its keypoint constants
 * in its slot; ends with the barrier that makes the list visible.
 * Returns the thread's slot (-1: background); *nf = the block's count. */
__device__ __forceinline__ int fg_list(int fg, int tid, float area, float factor, int *s_cnt,
                                       int *s_la, float *s_area, float *s_factor, int *nf) {
    const int slot = fg_compact(fg, s_cnt, nf);
    if (slot >= 0) {
        s_la[slot] = tid;
        s_area[slot] = area;
        s_factor[slot] = factor;
    }
    __syncthreads();
    return slot;
}

/* Target box of gt row r in grid units at stride s (the reference's tb). */
__device__ __forceinline__ void target_box(const float *gb, float s,
                                           float *tb) {
    tb[0] = gb[0] / s, tb[1] = gb[1] / s, tb[2] = gb[2] / s, tb[3] = gb[3] / s;
}

/* ltrb[sd] of the reference (distance of the anchor to the target's side). */
__device__ __forceinline__ float ltrb_side(const float *tb, float ax, float ay,
                                           int sd) {
    return sd == 0 ? FS(ax, tb[0])
                   : sd == 1 ? FS(ay, tb[1])
                             : sd == 2 ? FS(tb[2], ax) : FS(tb[3], ay);
}

/* One side's DFL term of the forward (the body of the reference's side
 * loop): lse-weighted cross-entropy against the two neighbouring bins. */
template <int RF>
__device__ __forceinline__ float dfl_side_term(const Geom &g, const View &box,
                                               int b, int a, int sd,
                                               float ltrb) {
    constexpr int NZ = RF > 0 ? RF : LPL_MAX_REG;
    const int R = RF > 0 ? RF : g.R;
    const float tmax = (float)((double)(R - 1) - 0.01);
    float z[NZ], pr[NZ];
    load_side<RF>(box, b, sd, a, R, z);
    const float lse = softmax_side<RF>(z, R, pr);
    float tg = ltrb;
    if (!(tg > 0)) tg = 0.0f;
    if (tg > tmax) tg = tmax;
    const int tl = (int)tg, tr = tl + 1;
    const float wl = FS((float)tr, tg), wr = FS(1.0f, wl);
    float ztl = 0.0f, ztr = 0.0f;
#pragma unroll
    for (int q = 0; q < NZ; q++) {
        if (q == tl) ztl = z[q];
        if (q == tr) ztr = z[q];
    }
    return FA(FM(FS(lse, ztl), wl), FM(FS(lse, ztr), wr));
}

/* Keypoint k of anchor a against its gt (gk: the gt row's keypoints; ar:
 * kpt_consts's area): the decoded offsets dx, dy, the OKS denominator den,
 * ex = exp(-d / den), the visibility mask m and the raw visibility logit rv
 * (the reference's keypoint loop, shared by the forward term and the
 * gradient). */
struct kpt_oks { float dx, dy, den, ex, m, rv; };
__device__ __forceinline__ kpt_oks kpt_oks_of(const Bufs &bf, const View &kpt, int b, int a,
                                              int k, const float *gk, float ar, float ax,
                                              float ay, float s) {
    kpt_oks o;
    const float rx = ld(kpt, b, k * 3 + 0, a);
    const float ry = ld(kpt, b, k * 3 + 1, a);
    o.rv = ld(kpt, b, k * 3 + 2, a);
    o.m = gk[k * 3 + 2] != 0 ? 1.0f : 0.0f;
    const float px = FA(FM(rx, 2.0f), FS(ax, 0.5f));
    const float py = FA(FM(ry, 2.0f), FS(ay, 0.5f));
    o.dx = FS(px, gk[k * 3] / s);
    o.dy = FS(py, gk[k * 3 + 1] / s);
    const float d = FA(FM(o.dx, o.dx), FM(o.dy, o.dy));
    const float sg2 = FM(2.0f, (float)bf.sigmas[k]);
    o.den = FM(FM(FM(sg2, sg2), FA(ar, 1e-9f)), 2.0f);
    o.ex = m_exp(-(d / o.den));
    return o;
}

/* One keypoint's forward terms at anchor a (the body of the reference's
 * keypoint loop): x = the OKS term factor (1 - exp(-d / den)) m, y = the
 * kobj BCE; gk = the gt row's keypoints, ar / fc = kpt_consts. */
__device__ __forceinline__ void kpt_term(const Bufs &bf, const View &kpt,
                                         int b, int a, int k, const float *gk,
                                         float ar, float fc, float ax,
                                         float ay, float s, float &x,
                                         float &y) {
    const kpt_oks o = kpt_oks_of(bf, kpt, b, a, k, gk, ar, ax, ay, s);
    x = FM(fc, FM(FS(1.0f, o.ex), o.m));
    y = m_bce(o.rv, o.m);
}

/* The gradient of one keypoint (x, y, visibility channels) of anchor a. */
__device__ __forceinline__ void kpt_grad(const Bufs &bf, const View &kpt,
                                         const OView &gkpt, int b, int a,
                                         int k, const float *gk, float ar,
                                         float fc, float ax, float ay, float s,
                                         double c_pose, double c_kobj) {
    const kpt_oks o = kpt_oks_of(bf, kpt, b, a, k, gk, ar, ax, ay, s);
    const float gd = o.m != 0 ? (float)c_pose * fc * o.ex / o.den : 0.0f;
    stg(gkpt, b, k * 3 + 0, a, gd * 4 * o.dx);
    stg(gkpt, b, k * 3 + 1, a, gd * 4 * o.dy);
    stg(gkpt, b, k * 3 + 2, a, (float)c_kobj * (m_sigmoid(o.rv) - o.m));
}

/* The gradient of DFL side sd (its R bins) of foreground anchor fi = b A + a
 * with the CIoU gradient of that side (recomputed, alpha detached); gb =
 * the assigned gt's box, norm its normalised target score. */
template <int RF>
__device__ __forceinline__ void dfl_side_grad(const Bufs &bf, const View &box,
                                              const OView &gbox, int b, int a,
                                              int sd, int R, int64_t fi,
                                              const float *gb, float ax,
                                              float ay, float s, float norm,
                                              double c_box, double c_dfl) {
    constexpr int NZ = RF > 0 ? RF : LPL_MAX_REG;
    float tb[4];
    target_box(gb, s, tb);
    /* the forward's decode of the same pred_box (lpl_decode_f32) */
    const float *pbp = bf.pbox + fi * 4;
    const float pb[4] = {pbp[0], pbp[1], pbp[2], pbp[3]};
    float g1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float gscl = (float)(-c_box) * norm;
    ciou(pb, tb, &bf.alpha[fi], 1, gscl, g1);
    const float gE[4] = {-g1[0], -g1[1], g1[2], g1[3]};
    const float cd = (float)c_dfl * norm / 4;
    const float tmax = (float)((double)(R - 1) - 0.01);
    float z[NZ], pr[NZ];
    load_side<RF>(box, b, sd, a, R, z);
    softmax_side<RF>(z, R, pr);
    float tg = ltrb_side(tb, ax, ay, sd);
    if (!(tg > 0)) tg = 0.0f;
    if (tg > tmax) tg = tmax;
    const int tl = (int)tg, tr = tl + 1;
    const float wl = (float)tr - tg, wr = 1 - wl;
    const float E = expect_side<RF>(pr, R);
#pragma unroll
    for (int q = 0; q < (RF > 0 ? RF : NZ); q++) {
        if (RF == 0 && q >= R) break;
        float gv = gE[sd] * pr[q] * ((float)q - E);
        gv += cd * (wl * (pr[q] - (q == tl ? 1.0f : 0.0f)) +
                    wr * (pr[q] - (q == tr ? 1.0f : 0.0f)));
        stg(gbox, b, sd * R + q, a, gv);
    }
}

/* k_loss / k_backward: a block owns LPL_THREADS anchors (thread t < 256 owns
 * anchor blockIdx.x * 256 + t, exactly the former one-thread-per-anchor
 * map) and has LPL_SUB threads per anchor. The owners do the per-anchor part
 * (assignment, class terms); the block's foreground anchors are then
 * compacted in index order and their independent terms ("items": the 4 DFL
 * sides, the K keypoints, the CIoU) are spread over all the block's threads,
 * one item per thread, grouped by kind (sides, then keypoints, then boxes)
 * so that a warp runs one code path. Every item is the reference's
 * expression in one thread; the forward's owners then add the items' terms
 * in the reference's order (sides 0..3, keypoints 0..K-1) and precision. */
template <int RF>
__global__ void __launch_bounds__(LPL_LB_THREADS, 1)
    k_loss(Geom g, Bufs bf, View box, View cls, View kpt, int frozen) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ double sh[Q_N][32];
    __shared__ int s_cnt[LPL_THREADS / 32];
    __shared__ int s_la[LPL_THREADS];
    __shared__ float s_area[LPL_THREADS], s_factor[LPL_THREADS];
    __shared__ float s_res[LPL_LB_THREADS][2];
    const int tid = threadIdx.x;
    const int64_t n = (int64_t)g.B * g.A;
    const int64_t i0 = (int64_t)blockIdx.x * LPL_THREADS;
    const int64_t i = i0 + tid; /* the owned anchor (tid < LPL_THREADS) */
    const int K = g.K;
    double acc[Q_N];
#pragma unroll
    for (int q = 0; q < Q_N; q++) acc[q] = 0.0;
    int fg = 0;
    float norm = 0.0f, area = 0.0f, factor = 0.0f;
    if (tid < LPL_THREADS && i < n) {
        const int b = (int)(i / g.A), a = (int)(i % g.A);
        const int t = bf.tgt[i];
        const int64_t r = (int64_t)b * g.G + (t >= 0 ? t : 0);
        norm = bf.tscore[i];
        if (!frozen && t >= 0) {
            norm = FM(norm, bf.pos_ov[r]) / FA(bf.pos_al[r], 1e-9f);
            bf.tscore[i] = norm;
        }
        /* class BCE over every anchor and class */
        const int lab = t >= 0 ? bf.gt_label[r] : -1;
        for (int c = 0; c < g.nc; c++) {
            const float z = ld(cls, b, c, a);
            const float y = c == lab ? norm : 0.0f;
            acc[Q_CLS] += (double)m_bce(z, y);
        }
        if (t >= 0) {
            fg = 1;
            acc[Q_NFG] = 1.0;
            acc[Q_TSS] = (double)norm;
            float ax, ay, s;
            anchor(g, a, ax, ay, s);
            kpt_consts(g, bf.gt_box + r * 4, bf.gt_kpt + r * K * 3, s, area,
                       factor);
        }
    }
    int nf;
    const int slot = fg_list(fg, tid, area, factor, s_cnt, s_la, s_area, s_factor, &nf);
    /* items: [0, 4 nf) DFL sides, [4 nf, (4 + K) nf) keypoints, then boxes */
    const int n_side = 4 * nf, n_kpt = K * nf, total = (5 + K) * nf;
    float dfl = 0.0f, cv = 0.0f;
    double ps = 0.0, os = 0.0;
    for (int base = 0; base < total; base += LPL_LB_THREADS) {
        const int it = base + tid;
        if (it < total) {
            int f, j; /* j: 0..3 side, 4 .. 3 + K keypoint, 4 + K box */
            if (it < n_side) {
                f = it >> 2, j = it & 3;
            } else if (it < n_side + n_kpt) {
                const int q = it - n_side;
                f = q / K, j = 4 + (q - f * K);
            } else {
                f = it - n_side - n_kpt, j = 4 + K;
            }
            const int64_t fi = i0 + s_la[f];
            const int b = (int)(fi / g.A), a = (int)(fi % g.A);
            const int64_t r = (int64_t)b * g.G + bf.tgt[fi];
            float ax, ay, s;
            anchor(g, a, ax, ay, s);
            float tb[4];
            target_box(bf.gt_box + r * 4, s, tb);
            float x = 0.0f, y = 0.0f;
            if (j < 4) {
                x = dfl_side_term<RF>(g, box, b, a, j,
                                      ltrb_side(tb, ax, ay, j));
            } else if (j < 4 + K) {
                kpt_term(bf, kpt, b, a, j - 4, bf.gt_kpt + r * K * 3, s_area[f], s_factor[f], ax,
                         ay, s, x, y);
            } else {
                const float *pbp = bf.pbox + fi * 4;
                const float pb[4] = {pbp[0], pbp[1], pbp[2], pbp[3]};
                x = ciou(pb, tb, &bf.alpha[fi], frozen, 0.0f, NULL);
            }
            s_res[tid][0] = x;
            s_res[tid][1] = y;
        }
        __syncthreads();
        if (slot >= 0) { /* the owner adds its items in the reference order */
            for (int sd = 0; sd < 4; sd++) {
                const int q = 4 * slot + sd - base;
                if (q >= 0 && q < LPL_LB_THREADS) dfl = FA(dfl, s_res[q][0]);
            }
            for (int k = 0; k < K; k++) {
                const int q = n_side + slot * K + k - base;
                if (q >= 0 && q < LPL_LB_THREADS) {
                    ps += (double)s_res[q][0];
                    os += (double)s_res[q][1];
                }
            }
            const int q = n_side + n_kpt + slot - base;
            if (q >= 0 && q < LPL_LB_THREADS) cv = s_res[q][0];
        }
        __syncthreads();
    }
    if (slot >= 0) {
        acc[Q_BOX] = (double)FM(FS(1.0f, cv), norm);
        acc[Q_DFL] = (double)FM(dfl / 4, norm);
        acc[Q_POSE] = ps;
        acc[Q_KOBJ] = os;
    }
    /* threads >= LPL_THREADS hold zeros: their warps' sums are +0.0, what
     * the former 8-warp block put in lanes 8..31 of the final warp sum */
    block_sums(acc, sh);
    if (tid == 0) {
#pragma unroll
        for (int q = 0; q < Q_N; q++)
            bf.part[(int64_t)blockIdx.x * Q_STRIDE + q] = acc[q];
    }
}

__global__ void __launch_bounds__(LPL_FIN_THREADS)
    k_finalize(Geom g, Bufs bf, int nparts, int frozen, Scalars out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ double sh[Q_N][32];
    double acc[Q_N];
#pragma unroll
    for (int q = 0; q < Q_N; q++) acc[q] = 0.0;
    for (int j = threadIdx.x; j < nparts; j += blockDim.x)
#pragma unroll
        for (int q = 0; q < Q_N; q++) acc[q] += bf.part[(int64_t)j * Q_STRIDE + q];
    block_sums(acc, sh);
    if (threadIdx.x != 0) return;
    double *S = bf.scal;
    if (!frozen) {
        S[LPL_S_TSS] = acc[Q_TSS] > 1 ? acc[Q_TSS] : 1.0;
        S[LPL_S_NFG] = acc[Q_NFG];
    }
    const double tss = S[LPL_S_TSS], nfg = S[LPL_S_NFG];
    const double nk = __dmul_rn(nfg, (double)g.K);
    S[LPL_S_BOX] = nfg > 0 ? acc[Q_BOX] / tss : 0;
    S[LPL_S_DFL] = nfg > 0 ? acc[Q_DFL] / tss : 0;
    S[LPL_S_POSE] = nfg > 0 ? acc[Q_POSE] / nk : 0;
    S[LPL_S_KOBJ] = nfg > 0 ? acc[Q_KOBJ] / nk : 0;
    S[LPL_S_CLS] = acc[Q_CLS] / tss;
    const double it[LUCID_POSE_LOSS_NITEMS] = {
        __dmul_rn(g.gain_box, S[LPL_S_BOX]), __dmul_rn(g.gain_pose, S[LPL_S_POSE]),
        __dmul_rn(g.gain_kobj, S[LPL_S_KOBJ]), __dmul_rn(g.gain_cls, S[LPL_S_CLS]),
        __dmul_rn(g.gain_dfl, S[LPL_S_DFL])};
    double sum = 0;
    for (int q = 0; q < LUCID_POSE_LOSS_NITEMS; q++) sum = __dadd_rn(sum, it[q]);
    S[LPL_S_TOTAL] = __dmul_rn(sum, (double)g.B);
    /* as lucid_cpu_set: f64 exact, else through float */
    if (out.total) {
        if (out.total_dt == LUCID_F64)
            ((double *)out.total)[out.total_off] = S[LPL_S_TOTAL];
        else
            lucid_store_f32(out.total, out.total_dt, out.total_off,
                            (float)S[LPL_S_TOTAL]);
    }
    if (out.items)
        for (int q = 0; q < LUCID_POSE_LOSS_NITEMS; q++) {
            if (out.items_dt == LUCID_F64)
                ((double *)out.items)[out.items_off[q]] = it[q];
            else
                lucid_store_f32(out.items, out.items_dt, out.items_off[q],
                                (float)it[q]);
        }
}

/* k_backward: the block layout of k_loss (LPL_SUB threads per anchor). All
 * threads write the class gradient and a background anchor's zeros, channel
 * c by the anchor's thread c % LPL_SUB; the foreground anchors' items (a DFL
 * side with its CIoU gradient, a keypoint) are spread over the block, one
 * per thread, each the reference's expressions. Nothing is summed across
 * threads. */
template <int RF>
__global__ void __launch_bounds__(LPL_LB_THREADS, 1)
    k_backward(Geom g, Bufs bf, View box, View cls, View kpt,
               const void *gscale, int gscale_dt, OView gbox, OView gcls,
               OView gkpt) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ int s_cnt[LPL_THREADS / 32];
    __shared__ int s_la[LPL_THREADS];
    __shared__ float s_area[LPL_THREADS], s_factor[LPL_THREADS];
    const int tid = threadIdx.x;
    const int la = tid % LPL_THREADS, sub = tid / LPL_THREADS;
    const int64_t n = (int64_t)g.B * g.A;
    const int64_t i0 = (int64_t)blockIdx.x * LPL_THREADS;
    const int64_t i = i0 + la;
    const int K = g.K;
    /* coefficients, as lucid_pose_loss_backward (double) */
    const double g0 = gscale ? lucid_load_f64(gscale, gscale_dt, 0) : 1.0;
    const double tss = bf.scal[LPL_S_TSS], nfg = bf.scal[LPL_S_NFG];
    const double gB = __dmul_rn(g0, (double)g.B);
    const double nk = __dmul_rn(nfg, (double)g.K);
    const double c_box = nfg > 0 ? __dmul_rn(gB, g.gain_box) / tss : 0;
    const double c_dfl = nfg > 0 ? __dmul_rn(gB, g.gain_dfl) / tss : 0;
    const double c_cls = __dmul_rn(gB, g.gain_cls) / tss;
    const double c_pose = nfg > 0 ? __dmul_rn(gB, g.gain_pose) / nk : 0;
    const double c_kobj = nfg > 0 ? __dmul_rn(gB, g.gain_kobj) / nk : 0;

    const int R = RF > 0 ? RF : g.R;
    int fg = 0;
    float area = 0.0f, factor = 0.0f;
    if (i < n) {
        const int b = (int)(i / g.A), a = (int)(i % g.A);
        const int t = bf.tgt[i];
        const int64_t r = (int64_t)b * g.G + (t >= 0 ? t : 0);
        const float norm = bf.tscore[i];
        if (gcls.p) {
            const float cc = (float)c_cls;
            const int lab = t >= 0 ? bf.gt_label[r] : -1;
            for (int c = sub; c < g.nc; c += LPL_SUB) {
                const float z = ld(cls, b, c, a);
                const float y = c == lab ? norm : 0.0f;
                stg(gcls, b, c, a, cc * (m_sigmoid(z) - y));
            }
        }
        if (t < 0) {
            if (gbox.p)
                for (int c = sub; c < 4 * R; c += LPL_SUB)
                    stg(gbox, b, c, a, 0.0f);
            if (gkpt.p)
                for (int c = sub; c < 3 * K; c += LPL_SUB)
                    stg(gkpt, b, c, a, 0.0f);
        } else if (sub == 0) {
            fg = 1;
            if (gkpt.p) {
                float ax, ay, s;
                anchor(g, a, ax, ay, s);
                kpt_consts(g, bf.gt_box + r * 4, bf.gt_kpt + r * K * 3, s,
                           area, factor);
            }
        }
    }
    int nf;
    const int slot = fg_list(fg, tid, area, factor, s_cnt, s_la, s_area, s_factor, &nf);
    /* items: [0, 4 nf) DFL sides (with gbox), then the keypoints (gkpt) */
    const int n_side = gbox.p ? 4 * nf : 0, n_kpt = gkpt.p ? K * nf : 0;
    for (int it = tid; it < n_side + n_kpt; it += LPL_LB_THREADS) {
        int f, j; /* j: 0..3 side, 4 .. 3 + K keypoint */
        if (it < n_side) {
            f = it >> 2, j = it & 3;
        } else {
            const int q = it - n_side;
            f = q / K, j = 4 + (q - f * K);
        }
        const int64_t fi = i0 + s_la[f];
        const int b = (int)(fi / g.A), a = (int)(fi % g.A);
        const int64_t r = (int64_t)b * g.G + bf.tgt[fi];
        const float norm = bf.tscore[fi];
        float ax, ay, s;
        anchor(g, a, ax, ay, s);
        const float *gb = bf.gt_box + r * 4;
        if (j < 4)
            dfl_side_grad<RF>(bf, box, gbox, b, a, j, R, fi, gb, ax, ay, s, norm, c_box,
                              c_dfl);
        else
            kpt_grad(bf, kpt, gkpt, b, a, j - 4, bf.gt_kpt + r * K * 3, s_area[f],
                     s_factor[f], ax, ay, s, c_pose, c_kobj);
    }
}

/* ------------------------------------------------------------ spread
 * The foreground terms without the anchor blocks: k_resolve lists the
 * foreground anchors (fb), and every term of every foreground anchor is
 * one work item of a grid over the whole device, so that a crowded block
 * of anchors no longer serialises its anchors' terms. Each item is the
 * same expression on the same inputs as in k_loss / k_backward; k_loss2
 * adds an anchor's terms in the same order and precision and keeps the
 * block partials' tree, so the outputs are bitwise those of k_loss /
 * k_backward (LUCID_LOSS_TERMS=0 selects those). */

/* Work item it of nf foreground slots with K keypoints, grouped by kind as
 * in k_loss (a warp runs one code path): [0, 4 nf) DFL sides (j = side),
 * [4 nf, (4 + K) nf) keypoints (j = 4 + k), then the boxes (j = 4 + K).
 * Sets the slot f and j. */
__device__ __forceinline__ void item_of(int64_t it, int nf, int K, int &f,
                                        int &j) {
    const int64_t n_side = 4 * (int64_t)nf, n_kpt = (int64_t)K * nf;
    if (it < n_side) {
        f = (int)(it >> 2), j = (int)(it & 3);
    } else if (it < n_side + n_kpt) {
        const int q = (int)(it - n_side);
        f = q / K, j = 4 + (q - f * K);
    } else {
        f = (int)(it - n_side - n_kpt), j = 4 + K;
    }
}

/* Forward terms of the foreground slots (grid-stride over the items):
 * fb.itm[f (5 + 2K) + .] = DFL side 0..3, OKS term 0..K-1, kobj BCE
 * 0..K-1, CIoU (which stores the anchor's alpha unless frozen). */
template <int RF>
__global__ void __launch_bounds__(LPL_THREADS)
    k_items(Geom g, Bufs bf, FgBufs fb, View box, View kpt, int frozen) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int nf = *fb.n, K = g.K;
    const int64_t total = (int64_t)(5 + K) * nf;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         it < total; it += step) {
        int f, j;
        item_of(it, nf, K, f, j);
        const int64_t fi = fb.list[f];
        const int b = (int)(fi / g.A), a = (int)(fi % g.A);
        const int64_t r = (int64_t)b * g.G + bf.tgt[fi];
        float ax, ay, s;
        anchor(g, a, ax, ay, s);
        float tb[4];
        target_box(bf.gt_box + r * 4, s, tb);
        float *o = fb.itm + (int64_t)f * (5 + 2 * K);
        if (j < 4) {
            o[j] = dfl_side_term<RF>(g, box, b, a, j, ltrb_side(tb, ax, ay, j));
        } else if (j < 4 + K) {
            float x, y;
            kpt_term(bf, kpt, b, a, j - 4, bf.gt_kpt + r * K * 3, fb.area[f],
                     fb.factor[f], ax, ay, s, x, y);
            o[j] = x;
            o[K + j] = y;
        } else {
            const float *pbp = bf.pbox + fi * 4;
            const float pb[4] = {pbp[0], pbp[1], pbp[2], pbp[3]};
            o[4 + 2 * K] = ciou(pb, tb, &bf.alpha[fi], frozen, 0.0f, NULL);
        }
    }
}

/* One thread per anchor, LPL_THREADS per block (the anchors of k_loss's
 * block): the owner's part of k_loss (normalised target score, class BCE)
 * and the foreground terms from fb.itm, added in k_loss's order (sides
 * 0..3 in float, keypoints 0..K-1 in double); block partials by the same
 * tree (k_loss's threads >= LPL_THREADS held zeros: its warps 8..15 gave
 * +0.0 where this block's final warp sum reads 0.0). */
__global__ void __launch_bounds__(LPL_THREADS)
    k_loss2(Geom g, Bufs bf, FgBufs fb, View cls, int frozen) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ double sh[Q_N][32];
    const int64_t i = (int64_t)blockIdx.x * LPL_THREADS + threadIdx.x;
    const int K = g.K;
    double acc[Q_N];
#pragma unroll
    for (int q = 0; q < Q_N; q++) acc[q] = 0.0;
    if (i < (int64_t)g.B * g.A) {
        const int b = (int)(i / g.A), a = (int)(i % g.A);
        const int t = bf.tgt[i];
        const int64_t r = (int64_t)b * g.G + (t >= 0 ? t : 0);
        float norm = bf.tscore[i];
        if (!frozen && t >= 0) {
            norm = FM(norm, bf.pos_ov[r]) / FA(bf.pos_al[r], 1e-9f);
            bf.tscore[i] = norm;
        }
        /* class BCE over every anchor and class */
        const int lab = t >= 0 ? bf.gt_label[r] : -1;
        for (int c = 0; c < g.nc; c++) {
            const float z = ld(cls, b, c, a);
            const float y = c == lab ? norm : 0.0f;
            acc[Q_CLS] += (double)m_bce(z, y);
        }
        if (t >= 0) {
            acc[Q_NFG] = 1.0;
            acc[Q_TSS] = (double)norm;
            const float *o = fb.itm + (int64_t)fb.slot[i] * (5 + 2 * K);
            float dfl = 0.0f;
            for (int sd = 0; sd < 4; sd++) dfl = FA(dfl, o[sd]);
            double ps = 0.0, os = 0.0;
            for (int k = 0; k < K; k++) {
                ps += (double)o[4 + k];
                os += (double)o[4 + K + k];
            }
            acc[Q_BOX] = (double)FM(FS(1.0f, o[4 + 2 * K]), norm);
            acc[Q_DFL] = (double)FM(dfl / 4, norm);
            acc[Q_POSE] = ps;
            acc[Q_KOBJ] = os;
        }
    }
    block_sums(acc, sh);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int q = 0; q < Q_N; q++)
            bf.part[(int64_t)blockIdx.x * Q_STRIDE + q] = acc[q];
    }
}

/* Zero channels [0, nch) of anchor (b, a) of a gradient (+0.0: the bits
 * stg(..., 0.0f) writes in every float dtype). */
__device__ __forceinline__ void zero_chans(const OView &v, int b, int a,
                                           int nch) {
    const int64_t o = (int64_t)b * v.sb + (int64_t)a * v.sa;
    switch (v.dt) {
    case LUCID_F32:
        for (int c = 0; c < nch; c++) ((float *)v.p)[o + c * v.sc] = 0.0f;
        break;
    case LUCID_BF16:
    case LUCID_F16:
        for (int c = 0; c < nch; c++) ((uint16_t *)v.p)[o + c * v.sc] = 0;
        break;
    case LUCID_F64:
        for (int c = 0; c < nch; c++) ((double *)v.p)[o + c * v.sc] = 0.0;
        break;
    default: break;
    }
}

/* Backward, two kinds of blocks in one grid: blocks [0, nib) walk the
 * foreground items (grid-stride; a DFL side with its CIoU gradient, a
 * keypoint: dfl_side_grad / kpt_grad, k_backward's expressions), blocks
 * from nib on own LPL_THREADS anchors each (class gradients of every
 * anchor; a background anchor's box and keypoint gradients are zeros).
 * Every element written once, nothing summed across threads: the bits of
 * k_backward. */
template <int RF>
__global__ void __launch_bounds__(LPL_THREADS)
    k_backward2(Geom g, Bufs bf, FgBufs fb, View box, View cls, View kpt,
                const void *gscale, int gscale_dt, OView gbox, OView gcls,
                OView gkpt, int nib) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int K = g.K;
    /* coefficients, as lucid_pose_loss_backward (double) */
    const double g0 = gscale ? lucid_load_f64(gscale, gscale_dt, 0) : 1.0;
    const double tss = bf.scal[LPL_S_TSS], nfg = bf.scal[LPL_S_NFG];
    const double gB = __dmul_rn(g0, (double)g.B);
    const double nk = __dmul_rn(nfg, (double)g.K);
    const double c_box = nfg > 0 ? __dmul_rn(gB, g.gain_box) / tss : 0;
    const double c_dfl = nfg > 0 ? __dmul_rn(gB, g.gain_dfl) / tss : 0;
    const double c_cls = __dmul_rn(gB, g.gain_cls) / tss;
    const double c_pose = nfg > 0 ? __dmul_rn(gB, g.gain_pose) / nk : 0;
    const double c_kobj = nfg > 0 ? __dmul_rn(gB, g.gain_kobj) / nk : 0;
    const int R = RF > 0 ? RF : g.R;
    if ((int)blockIdx.x < nib) {
        const int nf = *fb.n;
        const int64_t n_side = gbox.p ? 4 * (int64_t)nf : 0;
        const int64_t n_kpt = gkpt.p ? (int64_t)K * nf : 0;
        const int64_t step = (int64_t)nib * blockDim.x;
        for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
             it < n_side + n_kpt; it += step) {
            int f, j; /* without gbox the keypoints come first */
            item_of(it + (gbox.p ? 0 : 4 * (int64_t)nf), nf, K, f, j);
            const int64_t fi = fb.list[f];
            const int b = (int)(fi / g.A), a = (int)(fi % g.A);
            const int64_t r = (int64_t)b * g.G + bf.tgt[fi];
            float ax, ay, s;
            anchor(g, a, ax, ay, s);
            if (j < 4)
                dfl_side_grad<RF>(bf, box, gbox, b, a, j, R, fi,
                                  bf.gt_box + r * 4, ax, ay, s, bf.tscore[fi],
                                  c_box, c_dfl);
            else
                kpt_grad(bf, kpt, gkpt, b, a, j - 4, bf.gt_kpt + r * K * 3,
                         fb.area[f], fb.factor[f], ax, ay, s, c_pose, c_kobj);
        }
        return;
    }
    const int64_t i =
        (int64_t)(blockIdx.x - nib) * LPL_THREADS + threadIdx.x;
    if (i >= (int64_t)g.B * g.A) return;
    const int b = (int)(i / g.A), a = (int)(i % g.A);
    const int t = bf.tgt[i];
    if (gcls.p) {
        const int64_t r = (int64_t)b * g.G + (t >= 0 ? t : 0);
        const float norm = bf.tscore[i];
        const float cc = (float)c_cls;
        const int lab = t >= 0 ? bf.gt_label[r] : -1;
        for (int c = 0; c < g.nc; c++) {
            const float z = ld(cls, b, c, a);
            const float y = c == lab ? norm : 0.0f;
            stg(gcls, b, c, a, cc * (m_sigmoid(z) - y));
        }
    }
    if (t < 0) {
        if (gbox.p) zero_chans(gbox, b, a, 4 * R);
        if (gkpt.p) zero_chans(gkpt, b, a, 3 * K);
    }
}

/* ------------------------------------------------------------ host side */

static inline size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

static int loss_blocks(const lucid_pose_loss_plan *p) {
    const int64_t n = (int64_t)p->cfg.batch * p->A;
    return (int)((n + LPL_THREADS - 1) / LPL_THREADS);
}

/* Foreground capacity: min(B G topk, B A) (see FgBufs). */
static size_t fg_cap(const lucid_pose_loss_plan *p) {
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A;
    const size_t c = (size_t)p->cfg.batch * (size_t)p->cfg.max_gt *
                     (size_t)p->cfg.topk;
    return c < n ? c : n;
}

/* Bytes of the FgBufs arrays (after the cnt, first, part arrays). */
static size_t fg_bytes(const lucid_pose_loss_plan *p, FgBufs *fb,
                       char *base) {
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A, cap = fg_cap(p);
    const size_t nG = (size_t)p->cfg.batch * (size_t)p->cfg.max_gt;
    const size_t its = 5 + 2 * (size_t)p->cfg.nkpt;
    const size_t sz[8] = {sizeof(int32_t),
                          cap * sizeof(int32_t),
                          n * sizeof(int32_t),
                          cap * sizeof(float),
                          cap * sizeof(float),
                          cap * its * sizeof(float),
                          nG * LPL_TK_BPG * TK_KR * sizeof(tk_key_t),
                          nG * sizeof(int32_t)};
    size_t off = 0, at[8];
    for (int j = 0; j < 8; j++) at[j] = off, off += al64(sz[j]);
    if (fb) {
        fb->n = (int32_t *)(base + at[0]);
        fb->list = (int32_t *)(base + at[1]);
        fb->slot = (int32_t *)(base + at[2]);
        fb->area = (float *)(base + at[3]);
        fb->factor = (float *)(base + at[4]);
        fb->itm = (float *)(base + at[5]);
        fb->tk = (tk_key_t *)(base + at[6]);
        fb->tk_ctr = (int32_t *)(base + at[7]);
    }
    return off;
}

static size_t cuda_extra_bytes(const lucid_pose_loss_plan *p) {
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A;
    return 2 * al64(n * sizeof(int32_t)) +
           al64((size_t)loss_blocks(p) * Q_STRIDE * sizeof(double)) +
           fg_bytes(p, NULL, NULL);
}

static Bufs make_bufs(const lucid_pose_loss_plan *p) {
    Bufs bf;
    bf.sigmas = p->sigmas;
    bf.scal = p->scal;
    bf.gt_label = p->gt_label;
    bf.gt_mask = p->gt_mask;
    bf.gt_box = (float *)p->gt_box;
    bf.gt_cand = (float *)p->gt_cand;
    bf.gt_kpt = (float *)p->gt_kpt;
    bf.pbox = (float *)p->pbox;
    bf.pos = p->pos;
    bf.tgt = p->tgt;
    bf.tscore = (float *)p->tscore;
    bf.alpha = (float *)p->alpha;
    bf.pos_al = (float *)p->pos_al;
    bf.pos_ov = (float *)p->pos_ov;
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A;
    char *base = (char *)lucid_storage_data(p->ws) +
                 (lucid_storage_nbytes(p->ws) - cuda_extra_bytes(p));
    bf.cnt = (int32_t *)base;
    bf.first = (int32_t *)(base + al64(n * sizeof(int32_t)));
    bf.part = (double *)(base + 2 * al64(n * sizeof(int32_t)));
    return bf;
}

static FgBufs make_fgbufs(const lucid_pose_loss_plan *p) {
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A;
    char *base = (char *)lucid_storage_data(p->ws) +
                 (lucid_storage_nbytes(p->ws) - cuda_extra_bytes(p)) +
                 2 * al64(n * sizeof(int32_t)) +
                 al64((size_t)loss_blocks(p) * Q_STRIDE * sizeof(double));
    FgBufs fb;
    fg_bytes(p, &fb, base);
    return fb;
}

/* The kernel switches, read at every call (for A/B runs in one process):
 * LUCID_LOSS_TOPK=0 queues k_topk instead of k_topk2, LUCID_LOSS_TERMS=0
 * k_loss / k_backward instead of k_items + k_loss2 / k_backward2. Both
 * pairs give the same bits; anything but "0" (or unset) means the new
 * kernels. k_topk2 serves topk <= TK_KR, k_topk the rest. */
static int loss_switch(const char *name) {
    const char *v = getenv(name);
    return !(v && strcmp(v, "0") == 0);
}

/* Blocks of the foreground item walks: one item per thread up to the
 * capacity's items, at most LPL_ITEM_WAVES blocks per SM.
 * LUCID_LOSS_ITEM_BLOCKS=n (1..2^20; anything else: ignored) forces n (tests: the grid-stride
 * loops with many items per thread). */
static unsigned item_blocks(const lucid_pose_loss_plan *p,
                            const lucid_cuda_state *st, int per_fg) {
    const char *env = getenv("LUCID_LOSS_ITEM_BLOCKS"); /* read on each call (tests set it) */
    if (env && *env) {
        char *end = NULL;
        const long v = strtol(env, &end, 10);
        if (end && !*end && v >= 1 && v <= (1L << 20)) return (unsigned)v;
    }
    const int64_t items = (int64_t)fg_cap(p) * per_fg;
    int64_t nb = (items + LPL_THREADS - 1) / LPL_THREADS;
    const int64_t most =
        (int64_t)(st->sm_count > 0 ? st->sm_count : 132) * LPL_ITEM_WAVES;
    if (nb > most) nb = most;
    return (unsigned)(nb > 0 ? nb : 1);
}

static Geom make_geom(const lucid_pose_loss_plan *p) {
    const lucid_pose_loss_config *c = &p->cfg;
    Geom g;
    memset(&g, 0, sizeof g);
    g.B = c->batch, g.G = c->max_gt, g.A = p->A, g.K = c->nkpt, g.nc = c->nc;
    g.R = c->reg_max, g.topk = c->topk, g.nlev = c->nlevels;
    int off = 0;
    for (int l = 0; l < c->nlevels; l++) {
        g.off[l] = off;
        g.w[l] = c->level_w[l];
        g.s[l] = (float)c->strides[l];
        off += c->level_h[l] * c->level_w[l];
    }
    g.off[c->nlevels] = off;
    g.W = (float)p->img_w, g.H = (float)p->img_h;
    g.s0 = (float)c->strides[0];
    g.s1 = (float)c->strides[c->nlevels > 1 ? 1 : 0];
    g.tal_alpha = c->tal_alpha, g.tal_beta = c->tal_beta;
    g.gain_box = c->gain_box, g.gain_cls = c->gain_cls;
    g.gain_dfl = c->gain_dfl, g.gain_pose = c->gain_pose;
    g.gain_kobj = c->gain_kobj;
    return g;
}

static View make_view(const lucid_tensor *t) {
    View v = {lucid_tensor_data(t), (int)t->dtype, t->strides[0],
              t->strides[1], t->strides[2]};
    return v;
}
static OView make_oview(lucid_tensor *t) {
    OView v = {NULL, 0, 0, 0, 0};
    if (!t) return v;
    v.p = lucid_tensor_data(t);
    v.dt = (int)t->dtype;
    v.sb = t->strides[0], v.sc = t->strides[1], v.sa = t->strides[2];
    return v;
}
static TView make_tview(const lucid_tensor *t) {
    TView v;
    memset(&v, 0, sizeof v);
    v.p = lucid_tensor_data(t);
    v.dt = (int)t->dtype;
    for (int d = 0; d < t->ndim && d < 4; d++) v.s[d] = t->strides[d];
    return v;
}

static lucid_status check_dtypes(lucid_ctx *ctx, const char *what,
                                 const lucid_tensor *t) {
    if (!t || lucid_cuda_is_op_dtype(t->dtype)) return LUCID_OK;
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "pose loss on cuda: %s has dtype %s (f32, bf16, f16 "
                        "on the device; f64 is the CPU reference's)",
                        what, lucid_dtype_name(t->dtype));
}

static lucid_status cuda_plan_init(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                                   const double *anc_host,
                                   const double *sigmas_host) {
    CUDA_ENTER(ctx, st);
    if (p->cfg.reg_max > LPL_MAX_REG || p->cfg.topk > LPL_MAX_TOPK)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss on cuda: reg_max %d / topk %d above "
                            "%d / %d",
                            p->cfg.reg_max, p->cfg.topk, LPL_MAX_REG,
                            LPL_MAX_TOPK);
    if ((int64_t)p->cfg.batch * p->A > INT32_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "pose loss on cuda: %d images x %d anchors above "
                            "2^31 - 1",
                            p->cfg.batch, p->A);
    void *base = lucid_storage_data(p->ws);
    CUDA_CHECK(ctx, cudaMemsetAsync(base, 0, lucid_storage_nbytes(p->ws),
                                    st->stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(p->anc, anc_host,
                                    (size_t)p->A * 3 * sizeof(double),
                                    cudaMemcpyHostToDevice, st->stream));
    CUDA_CHECK(ctx, cudaMemcpyAsync(p->sigmas, sigmas_host,
                                    (size_t)p->cfg.nkpt * sizeof(double),
                                    cudaMemcpyHostToDevice, st->stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(st->stream)); /* host arrays */
    return LUCID_OK;
}

#define LAUNCH_RF(kern, grid, block, ...)                                     \
    do {                                                                      \
        if (p->cfg.reg_max == 16)                                             \
            lucid_launch(kern<16>, (grid), (block), 0, st->stream, __VA_ARGS__); \
        else                                                                  \
            lucid_launch(kern<0>, (grid), (block), 0, st->stream, __VA_ARGS__); \
    } while (0)

static lucid_status cuda_forward(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                                 const lucid_tensor *pred_box,
                                 const lucid_tensor *pred_cls,
                                 const lucid_tensor *pred_kpt,
                                 const lucid_pose_targets *targets,
                                 int frozen, lucid_tensor *total,
                                 lucid_tensor *items) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(check_dtypes(ctx, "pred_box", pred_box));
    LUCID_TRY(check_dtypes(ctx, "pred_cls", pred_cls));
    LUCID_TRY(check_dtypes(ctx, "pred_kpt", pred_kpt));
    const Geom g = make_geom(p);
    const Bufs bf = make_bufs(p);
    const FgBufs fb = make_fgbufs(p);
    const View vb = make_view(pred_box), vc = make_view(pred_cls),
               vk = make_view(pred_kpt);
    const unsigned blocksA = (unsigned)loss_blocks(p);
    const int new_topk = loss_switch("LUCID_LOSS_TOPK") && g.topk <= TK_KR;
    const int new_terms = loss_switch("LUCID_LOSS_TERMS");
    if (!frozen) {
        Targets t;
        t.cls = make_tview(targets->cls);
        t.box = make_tview(targets->boxes);
        t.kpt = make_tview(targets->kpts);
        t.valid = make_tview(targets->valid);
        const int64_t nG = (int64_t)g.B * g.G;
        const int64_t rows = LPL_PREP_THREADS / 32;
        lucid_launch(k_prep_gt, (unsigned)((nG + rows - 1) / rows),
                     LPL_PREP_THREADS, 0, st->stream, g, bf, fb, t);
        CUDA_CHECK_LAUNCH(ctx, "pose loss prep_gt");
    }
    const int64_t nA = (int64_t)g.B * g.A;
    LAUNCH_RF(k_decode,
              (unsigned)((nA + LPL_DEC_ANCHORS - 1) / LPL_DEC_ANCHORS),
              LPL_THREADS, g, bf, vb);
    CUDA_CHECK_LAUNCH(ctx, "pose loss decode");
    if (!frozen) {
        if (new_topk)
            lucid_launch(k_topk2, (unsigned)(g.B * g.G * LPL_TK_BPG),
                         LPL_TK_THREADS, 0, st->stream, g, bf, fb, vc);
        else
            lucid_launch(k_topk, (unsigned)(g.B * g.G), LPL_TOPK_THREADS, 0,
                         st->stream, g, bf, vc);
        CUDA_CHECK_LAUNCH(ctx, "pose loss topk");
        lucid_launch(k_resolve, blocksA, LPL_THREADS, 0, st->stream, g, bf, fb,
                     vc);
        CUDA_CHECK_LAUNCH(ctx, "pose loss resolve");
    }
    if (new_terms) {
        LAUNCH_RF(k_items, item_blocks(p, st, 5 + g.K), LPL_THREADS, g, bf, fb,
                  vb, vk, frozen);
        CUDA_CHECK_LAUNCH(ctx, "pose loss items");
        lucid_launch(k_loss2, blocksA, LPL_THREADS, 0, st->stream, g, bf, fb,
                     vc, frozen);
    } else {
        LAUNCH_RF(k_loss, blocksA, LPL_LB_THREADS, g, bf, vb, vc, vk, frozen);
    }
    CUDA_CHECK_LAUNCH(ctx, "pose loss terms");
    Scalars out;
    memset(&out, 0, sizeof out);
    if (total) {
        out.total = lucid_storage_data(total->storage);
        out.total_dt = (int)total->dtype;
        out.total_off = lucid_tensor_elem_offset(total, 0);
    }
    if (items) {
        out.items = lucid_storage_data(items->storage);
        out.items_dt = (int)items->dtype;
        for (int q = 0; q < LUCID_POSE_LOSS_NITEMS; q++)
            out.items_off[q] = lucid_tensor_elem_offset(items, q);
    }
    lucid_launch(k_finalize, 1, LPL_FIN_THREADS, 0, st->stream, g, bf, (int)blocksA, frozen,
                 out);
    CUDA_CHECK_LAUNCH(ctx, "pose loss finalize");
    return LUCID_OK;
}

static lucid_status cuda_backward(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                                  const lucid_tensor *pred_box,
                                  const lucid_tensor *pred_cls,
                                  const lucid_tensor *pred_kpt,
                                  const lucid_tensor *grad_scale,
                                  lucid_tensor *grad_box,
                                  lucid_tensor *grad_cls,
                                  lucid_tensor *grad_kpt) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(check_dtypes(ctx, "pred_box", pred_box));
    LUCID_TRY(check_dtypes(ctx, "pred_cls", pred_cls));
    LUCID_TRY(check_dtypes(ctx, "pred_kpt", pred_kpt));
    LUCID_TRY(check_dtypes(ctx, "grad_box", grad_box));
    LUCID_TRY(check_dtypes(ctx, "grad_cls", grad_cls));
    LUCID_TRY(check_dtypes(ctx, "grad_kpt", grad_kpt));
    if (!grad_box && !grad_cls && !grad_kpt) return LUCID_OK;
    const Geom g = make_geom(p);
    const Bufs bf = make_bufs(p);
    const View vb = make_view(pred_box), vc = make_view(pred_cls),
               vk = make_view(pred_kpt);
    const OView ob = make_oview(grad_box), oc = make_oview(grad_cls),
                ok = make_oview(grad_kpt);
    const void *gs = grad_scale ? lucid_tensor_data(grad_scale) : NULL;
    const int gs_dt = grad_scale ? (int)grad_scale->dtype : 0;
    if (loss_switch("LUCID_LOSS_TERMS")) {
        const FgBufs fb = make_fgbufs(p);
        const unsigned nib = item_blocks(p, st, 4 + g.K);
        LAUNCH_RF(k_backward2, nib + (unsigned)loss_blocks(p), LPL_THREADS, g,
                  bf, fb, vb, vc, vk, gs, gs_dt, ob, oc, ok, (int)nib);
    } else {
        LAUNCH_RF(k_backward, (unsigned)loss_blocks(p), LPL_LB_THREADS, g, bf,
                  vb, vc, vk, gs, gs_dt, ob, oc, ok);
    }
    CUDA_CHECK_LAUNCH(ctx, "pose loss backward");
    return LUCID_OK;
}

static lucid_status cuda_read_assignment(lucid_ctx *ctx,
                                         const lucid_pose_loss_plan *p,
                                         int32_t *gt_index, double *score,
                                         double *n_fg, double *tss) {
    CUDA_ENTER(ctx, st);
    const size_t n = (size_t)p->cfg.batch * (size_t)p->A;
    float *sc = NULL;
    if (score) {
        sc = (float *)malloc(n * sizeof(float));
        if (!sc)
            return lucid_seterr(ctx, LUCID_ERR_OOM,
                                "pose loss: out of host memory (%zu scores)",
                                n);
    }
    double S[2];
    cudaError_t e = cudaSuccess;
    if (gt_index)
        e = cudaMemcpyAsync(gt_index, p->tgt, n * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, st->stream);
    if (e == cudaSuccess && sc)
        e = cudaMemcpyAsync(sc, p->tscore, n * sizeof(float),
                            cudaMemcpyDeviceToHost, st->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(S, p->scal, 2 * sizeof(double),
                            cudaMemcpyDeviceToHost, st->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess) {
        free(sc);
        return lucid_cuda_err(ctx, e, "pose loss read_assignment", __FILE__,
                              __LINE__);
    }
    if (sc)
        for (size_t i = 0; i < n; i++) score[i] = (double)sc[i];
    free(sc);
    if (n_fg) *n_fg = S[LPL_S_NFG];
    if (tss) *tss = S[LPL_S_TSS];
    return LUCID_OK;
}

static lucid_status cuda_capture(lucid_ctx *ctx, lucid_pose_loss_hook_fn fn,
                                 void *arg, int launches) {
    CUDA_ENTER(ctx, st);
    CUDA_CHECK(ctx, cudaStreamBeginCapture(st->stream,
                                           cudaStreamCaptureModeGlobal));
    lucid_status s = fn(arg);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &graph);
    if (s != LUCID_OK) {
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return s;
    }
    if (e != cudaSuccess)
        return lucid_cuda_err(ctx, e, "cudaStreamEndCapture (pose loss)",
                              __FILE__, __LINE__);
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    for (int i = 0; e == cudaSuccess && i < launches; i++)
        e = cudaGraphLaunch(exec, st->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
    if (exec) cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
        return lucid_cuda_err(ctx, e, "pose loss graph launch", __FILE__,
                              __LINE__);
    return LUCID_OK;
}

static lucid_status cuda_time_calls(lucid_ctx *ctx, lucid_pose_loss_hook_fn fn,
                                    void *arg, int reps, float *ms) {
    CUDA_ENTER(ctx, st);
    cudaEvent_t e0, e1;
    CUDA_CHECK(ctx, cudaEventCreate(&e0));
    cudaError_t e = cudaEventCreate(&e1);
    if (e != cudaSuccess) {
        cudaEventDestroy(e0);
        return lucid_cuda_err(ctx, e, "cudaEventCreate", __FILE__, __LINE__);
    }
    lucid_status s = LUCID_OK;
    for (int r = 0; r < reps && s == LUCID_OK && e == cudaSuccess; r++) {
        e = cudaEventRecord(e0, st->stream);
        if (e != cudaSuccess) break;
        s = fn(arg);
        if (s != LUCID_OK) break;
        e = cudaEventRecord(e1, st->stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms[r], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (s != LUCID_OK) return s;
    if (e != cudaSuccess)
        return lucid_cuda_err(ctx, e, "pose loss timing", __FILE__, __LINE__);
    return LUCID_OK;
}

static const lucid_pose_loss_kernels cuda_loss_table = {
    "cuda",
    cuda_extra_bytes,
    cuda_plan_init,
    cuda_forward,
    cuda_backward,
    cuda_read_assignment,
    cuda_capture,
    cuda_time_calls,
};

extern "C" const lucid_pose_loss_kernels *lucid_pose_loss_cuda_kernels(void) {
    return &cuda_loss_table;
}
