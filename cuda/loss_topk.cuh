/*
 * loss_topk.cuh — the pure pieces of the pose loss's spread top-k
 * (k_topk2 in cuda/loss.cu), host and device, so that the host emulation
 * spec/c/test_loss_topk_emu.cu runs the very same code against brute force.
 *
 * The top-k of the assigner (assigner.c, step 1) is the first k anchors of
 * the total order "larger align metric, then lower index" over ALL anchors.
 * A non-candidate anchor (centre not inside the gt's widened box) has
 * metric +0.0 exactly (pair() in loss.cu). Hence, with S = the candidates
 * plus the first k non-candidates by index, top-k(all) = top-k(S): every
 * other non-candidate ranks after k elements of S (the same +0.0, lower
 * indices). Any superset of S gives the same top-k as well.
 *
 * The candidates of a gt form, on each level, one rectangle of cells: the
 * inside test (loss.cu inside()) is d > 1e-9f with d the running minimum of
 *   e0 = px - c0, e1 = py - c1, e2 = c2 - px, e3 = c3 - py
 * (float subtractions, px = (j + 0.5f) * s, py = (i + 0.5f) * s, products
 * rounded), where an e that is NaN never replaces d. So, when e0 is a
 * number, the test is e0 > t and e_q > t for every e_q (q = 1..3) that is a
 * number; when e0 is NaN it fails. px and py can not be NaN (finite cell
 * centres), so e_q is NaN exactly when c_q is. Rounded multiplication and
 * subtraction are monotone, so each of the four conditions holds on a
 * prefix or a suffix of the columns (rows): the candidate cells are the
 * rectangle [i0, i1] x [j0, j1] found by four binary searches on the same
 * float expressions (tk_bound). spec/c/test_loss_topk_emu.cu checks the
 * rectangle against the inside test cell by cell (boxes on cell centres,
 * one ulp off them, NaN and infinite sides) and the whole selection
 * against a sort of all anchors.
 *
 * Keys: (metric, anchor) as one 64-bit integer, metric bits high, the
 * complemented anchor index low: for metrics >= +0.0 (the assigner's: a
 * product of a sigmoid power and a clamped IoU power) and indices < 2^31,
 * a larger key ranks first, and no element has the key 0 (the "none"
 * sentinel). NaN metrics (NaN network outputs) get keys above +inf, a
 * fixed order; the former block top-k and the CPU treat NaN differently
 * (their result depended on the partition), so only NaN-free metrics are
 * covered by the bitwise guarantee.
 */
#ifndef LUCID_CUDA_LOSS_TOPK_CUH
#define LUCID_CUDA_LOSS_TOPK_CUH

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TK_HD __host__ __device__ __forceinline__
#else
#define TK_HD static inline
#endif

/* unrolled on the device (register arrays); nothing on the host pass */
#ifdef __CUDA_ARCH__
#define TK_UNROLL _Pragma("unroll")
#else
#define TK_UNROLL
#endif

#define TK_MAX_LEVELS 4 /* = LUCID_POSE_LOSS_MAX_LEVELS */
#define TK_KR 16        /* per-lane register list: k_topk2 serves topk <= 16 */

typedef unsigned long long tk_key_t; /* a (metric, anchor) rank key */

/* Rounded float product / difference, never contracted (loss.cu FM, FS). */
TK_HD float tk_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
TK_HD float tk_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

TK_HD uint32_t tk_fbits(float v) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(v);
#else
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
#endif
}

/* Key of metric v (>= +0.0) at anchor a (0 <= a < 2^31); never 0. */
TK_HD tk_key_t tk_key(float v, int a) {
    return ((tk_key_t)tk_fbits(v) << 32) | (tk_key_t)(~(uint32_t)a);
}
/* Anchor of a non-zero key. */
TK_HD int tk_anchor(tk_key_t key) { return (int)~(uint32_t)key; }

/* Condition q of the inside test for cell index m (column for q = 0, 2;
 * row for q = 1, 3) of a level of stride s, as a predicate that is false
 * on a prefix and true on the rest:
 *   q 0: px - c0 > t          (false on a NaN c0: the test fails)
 *   q 1: NaN c1 or py - c1 > t
 *   q 2: NOT (NaN c2 or c2 - px > t)
 *   q 3: NOT (NaN c3 or c3 - py > t). */
TK_HD bool tk_pred(int q, const float *cd, int m, float s) {
    const float p = tk_mul((float)m + 0.5f, s);
    const float t = 1e-9f;
    const float c = cd[q];
    switch (q) {
    case 0: return tk_sub(p, c) > t;
    case 1: return c != c || tk_sub(p, c) > t;
    case 2: return !(c != c || tk_sub(c, p) > t);
    default: return !(c != c || tk_sub(c, p) > t);
    }
}

/* Bound q of the candidate rectangle of inside box cd (gt_cand: x1 y1 x2
 * y2, pixels) on a level of w x h cells, stride s: q 0 first column j0
 * (w: none), q 1 first row i0 (h: none), q 2 last column j1 (-1: none),
 * q 3 last row i1 (-1: none). Binary search for the first cell where
 * tk_pred holds. */
TK_HD int tk_bound(int q, const float *cd, int w, int h, float s) {
    int lo = 0, hi = (q & 1) ? h : w;
    while (lo < hi) {
        const int m = (lo + hi) >> 1;
        if (tk_pred(q, cd, m, s))
            hi = m;
        else
            lo = m + 1;
    }
    return q < 2 ? lo : lo - 1;
}

/* The candidate rectangles of one gt on every level (rows i0..i1, columns
 * j0..j1; n = its cell count, 0 when empty) and the level layout. */
struct TkRects {
    int nlev;
    int off[TK_MAX_LEVELS + 1]; /* first anchor of each level; off[nlev] = A */
    int w[TK_MAX_LEVELS];
    int i0[TK_MAX_LEVELS], i1[TK_MAX_LEVELS];
    int j0[TK_MAX_LEVELS], j1[TK_MAX_LEVELS];
    int n[TK_MAX_LEVELS];
};

/* Cell count of level l's rectangle from its bounds. */
TK_HD int tk_rect_cells(int i0, int i1, int j0, int j1) {
    return (i0 <= i1 && j0 <= j1) ? (i1 - i0 + 1) * (j1 - j0 + 1) : 0;
}

/* Anchor of cell e (0 <= e < sum n) of the rectangles, level by level,
 * row-major inside each (index order); -1 past the end. */
TK_HD int tk_cell_anchor(const TkRects &R, int e) {
    int a = -1;
TK_UNROLL
    for (int l = 0; l < TK_MAX_LEVELS; l++) {
        if (a < 0 && l < R.nlev) {
            if (e < R.n[l]) {
                const int rw = R.j1[l] - R.j0[l] + 1;
                const int di = e / rw;
                a = R.off[l] + (R.i0[l] + di) * R.w[l] + R.j0[l] + (e - di * rw);
            } else {
                e -= R.n[l];
            }
        }
    }
    return a;
}

/* The t-th (0-based) anchor outside every rectangle in index order; -1
 * when there are fewer than t + 1. */
TK_HD int tk_outside(const TkRects &R, int t) {
    int a = -1;
TK_UNROLL
    for (int l = 0; l < TK_MAX_LEVELS; l++) {
        if (a < 0 && l < R.nlev) {
            const int cells = R.off[l + 1] - R.off[l], w = R.w[l];
            const int nout = cells - R.n[l];
            if (t < nout) {
                if (R.n[l] == 0) {
                    a = R.off[l] + t;
                } else {
                    const int rh = R.i1[l] - R.i0[l] + 1;
                    const int rw = R.j1[l] - R.j0[l] + 1;
                    const int before = R.i0[l] * w, pr = w - rw;
                    if (t < before) {
                        a = R.off[l] + t;
                    } else if (t - before < rh * pr) {
                        const int u = t - before, row = R.i0[l] + u / pr;
                        const int c = u - (u / pr) * pr;
                        a = R.off[l] + row * w + (c < R.j0[l] ? c : c + rw);
                    } else {
                        a = R.off[l] + (R.i1[l] + 1) * w +
                            (t - before - rh * pr);
                    }
                }
            } else {
                t -= nout;
            }
        }
    }
    return a;
}

/* Cells per warp of a gt with N candidate cells spread over nw warps: an
 * equal share, but at least 32 (one per lane), so that a small gt keeps
 * few warps (and blocks) busy. */
TK_HD int tk_slice(int N, int nw) {
    const int sw = (N + nw - 1) / nw;
    return sw < 32 ? 32 : sw;
}

/* Insert key x into the descending list L[0..TK_KR-1] (0 = empty slot),
 * dropping the smallest: the list stays the top TK_KR of what was
 * inserted. Compile-time indices only (registers on the device). */
TK_HD void tk_insert(tk_key_t *L, tk_key_t x) {
TK_UNROLL
    for (int q = 0; q < TK_KR; q++) {
        const tk_key_t y = L[q];
        const bool up = x > y;
        L[q] = up ? x : y;
        x = up ? y : x;
    }
}

/* Drop the head of the list (after it was taken). */
TK_HD void tk_pop(tk_key_t *L) {
TK_UNROLL
    for (int q = 0; q + 1 < TK_KR; q++) L[q] = L[q + 1];
    L[TK_KR - 1] = 0;
}

#endif
