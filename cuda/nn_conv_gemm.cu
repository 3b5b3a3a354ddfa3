/*
 * nn_conv_gemm.cu — 1x1 convolutions (bf16/f16, groups 1, stride 1, no
 * padding, dilation 1) through cuBLAS GEMMs.  The contract, the GEMM
 * formulation and the numerics are in nn_conv_gemm.cuh; nn_conv.cu decides
 * when this route runs (LUCID_CONV1X1, lucid_cuda_nn_set_conv1x1).
 *
 * cuBLAS is column-major; a row-major [r, c] matrix with leading dimension
 * c is the column-major [c, r] matrix with the same leading dimension.  So
 * with P = HW, per image n:
 *   x[n]  row-major [Cin, P]  = col-major X' [P, Cin],  ld P
 *   y[n]  row-major [Cout, P] = col-major Y' [P, Cout], ld P
 *   w     row-major [Cout, Cin] = col-major W' [Cin, Cout], ld Cin
 * and the three products are (m x n, reduction k):
 *   forward          Y'  = X'  . W'           m P,   n Cout, k Cin
 *   backward-data    dX' = dY' . W'^T         m P,   n Cin,  k Cout
 *   backward-filter  dW' = X'^T . dY'         m Cin, n Cout, k P
 * (dW' [Cin, Cout] col-major = dw row-major [Cout, Cin]).  The first two are
 * one strided-batched call over the images with the weight's stride 0.
 *
 * Kernels here (weight cast, bias add, partial fold) are launched with
 * lucid_launch (launch.cuh) and wait for their predecessor first.
 */
#include "nn_common.cuh"
#include "nn_conv_col.cuh"
#include "nn_conv_gemm.cuh"
#include "nn_conv_igemm.cuh" /* lucid_conv_igemm_wt_src */

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_THREADS 256

// ----------------------------------------------------------------------------
// the switch

namespace {
struct conv1x1_env {
    int route;     /* 0 igemm, 1 gemm, 2 auto, -1 unknown value */
    char value[64];
};

conv1x1_env conv1x1_env_read(void) {
    conv1x1_env e;
    const char *v = getenv("LUCID_CONV1X1");
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    if (!v || !v[0] || strcmp(v, "auto") == 0) e.route = 2;
    else if (strcmp(v, "gemm") == 0) e.route = 1;
    else if (strcmp(v, "igemm") == 0) e.route = 0;
    else e.route = -1;
    return e;
}
} // namespace

int lucid_conv1x1_switch(const char **value) {
    static const conv1x1_env e = conv1x1_env_read(); /* once, thread-safe */
    if (value) *value = e.value;
    return e.route;
}

namespace {
struct wgrad_env {
    int64_t chunk; /* L: least columns per chunk, 0 no split, -1 unknown value */
    char value[64];
};

wgrad_env wgrad_env_read(void) {
    wgrad_env e;
    const char *v = getenv("LUCID_WGRAD_SPLIT");
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    e.chunk = -1;
    if (!v || !v[0]) {
        e.chunk = 1600;
    } else {
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        if (end && !*end && n >= 0 && n <= INT_MAX && v[0] >= '0' && v[0] <= '9') e.chunk = n;
    }
    return e;
}

/* L and the raw value of LUCID_WGRAD_SPLIT, read once */
int64_t wgrad_chunk(const char **value) {
    static const wgrad_env e = wgrad_env_read();
    if (value) *value = e.value;
    return e.chunk;
}
} // namespace

/* the per-image partials' bound (floats) */
#define WGRAD_MAX_PARTS ((int64_t)1 << 26)

int64_t lucid_conv_gemm_wgrad_splits(const lucid_conv_gemm_geom *g) {
    const int64_t L = wgrad_chunk(NULL);
    if (L <= 0 || !g) return 1;
    int64_t S = 1;
    const int64_t per = g->N * g->Cout * g->Cin;
    while (S < 64 && g->HW % (16 * S) == 0 && g->HW / (2 * S) >= L &&
           per <= WGRAD_MAX_PARTS / (2 * S))
        S *= 2;
    return S;
}

/* LUCID_WGRAD_PTRS (read once; unset or anything but "0": on): whether a
 * split filter gradient with N > 1 and S > 1 takes ONE pointer-array batched
 * GEMM (cublasGemmBatchedEx over all N*S products) instead of min(N, S)
 * strided-batched launches. */
int lucid_conv_gemm_wgrad_ptrs_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_WGRAD_PTRS", &off);
}

/* Whether the split filter gradient of g takes the pointer-array GEMM. */
static bool wgrad_uses_ptrs(const lucid_conv_gemm_geom *g, int64_t S) {
    return g->N > 1 && S > 1 && lucid_conv_gemm_wgrad_ptrs_switch();
}

int lucid_wcast_once_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_WCAST_ONCE", &off);
}

int lucid_wcast_side_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_WCAST_SIDE", &off);
}

int lucid_wcast_plain_side_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_WCAST_PLAIN_SIDE", &off);
}

// ----------------------------------------------------------------------------
// geometry and scratch

int lucid_conv_gemm_preferred(const lucid_conv_gemm_geom *g) {
    return g->Cin % 8 == 0 && g->Cout % 8 == 0;
}

int lucid_conv_gemm_fits(const lucid_conv_gemm_geom *g) {
    return g->N > 0 && g->Cin > 0 && g->Cout > 0 && g->HW > 0 && g->N <= INT_MAX &&
           g->Cin <= INT_MAX && g->Cout <= INT_MAX && g->HW <= INT_MAX;
}

/* the weight in dt (bf16 and f16 are both 2 bytes) */
static size_t wcast_bytes(const lucid_conv_gemm_geom *g, lucid_dtype dt) {
    (void)dt;
    return nn_align((size_t)(g->Cout * g->Cin) * 2);
}

size_t lucid_conv_gemm_scratch(const lucid_conv_gemm_geom *g, lucid_dtype dt, int pass,
                               int bias) {
    if (pass == 0)
        return wcast_bytes(g, dt) +
               (bias ? nn_align((size_t)(g->N * g->Cout * g->HW) * sizeof(float)) : 0);
    if (pass == 1) return wcast_bytes(g, dt);
    return lucid_conv_gemm_wgrad_scratch(g, g->Cin);
}

size_t lucid_conv_gemm_wgrad_scratch(const lucid_conv_gemm_geom *g, int64_t Kout) {
    const int64_t S = lucid_conv_gemm_wgrad_splits(g), parts = g->N * S;
    if (parts == 1 && Kout >= g->Cin) return 0;
    size_t b = nn_align((size_t)(parts * g->Cout * g->Cin) * sizeof(float));
    if (wgrad_uses_ptrs(g, S)) b += nn_align((size_t)(3 * parts) * sizeof(void *));
    return b;
}

// ----------------------------------------------------------------------------
// kernels

/* d[i] = T(s[i]) (one rounding of the f32 master weight) */
template <typename T>
static __global__ void gemm_wcast(const float *__restrict__ s, T *__restrict__ d, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        lucid_elem<T>::store(d, i, s[i]);
}

/* Elements per block of a group-cast item (a tiled transposed weight:
 * at most that many, wt_tile_rows below). */
#define GROUP_ELEMS (GEMM_THREADS * 4)

/* The transposed weight of a wt item (Cin = wt[0], Cout = wt[1], KK =
 * wt[2]) is the transpose of the f32 weight seen as a [R][KK] matrix, R =
 * Cout*Cin rows (co, ci) of KK taps, into [KK][R]: its element i = tap*R +
 * r is the weight's r*KK + tap (lucid_conv_igemm_wt_src, written out).
 * Cast element by element in that order, neighbouring threads read KK
 * floats apart (9 for 3x3: a 32-byte sector per element); so a block takes
 * wt_tile_rows whole rows instead, reads their nr*KK floats in order into
 * shared memory (coalesced), then writes them tap by tap, runs of nr
 * consecutive elements (coalesced).  Rows per block: GROUP_ELEMS / KK (113
 * for 3x3), 0 when one row exceeds the staging (KK > GROUP_ELEMS: the
 * element-wise gather). */
static __host__ __device__ __forceinline__ unsigned wt_tile_rows(int KK) {
    return KK >= 1 && KK <= GROUP_ELEMS ? (unsigned)(GROUP_ELEMS / KK) : 0u;
}

/* Rows [r0, r0 + nr) of tile block lb (tr rows a block, R rows in all). */
struct wt_tile {
    int64_t r0;
    unsigned nr;
};
static __host__ __device__ __forceinline__ wt_tile wt_tile_of(unsigned lb, unsigned tr,
                                                              int64_t R) {
    wt_tile t;
    t.r0 = (int64_t)lb * tr;
    t.nr = (unsigned)(R - t.r0 < (int64_t)tr ? R - t.r0 : (int64_t)tr);
    return t;
}

/* Element e (< nr*KK) of tile t's write phase: *dst = its index in the
 * transposed weight (tap-major: runs of nr per tap); returns the index of
 * its value among the staged floats (the weight's t.r0*KK + that). */
static __host__ __device__ __forceinline__ unsigned wt_tile_elem(unsigned e, const wt_tile &t,
                                                                 unsigned KK, int64_t R,
                                                                 int64_t *dst) {
    const unsigned tap = e / t.nr, j = e - tap * t.nr;
    *dst = (int64_t)tap * R + t.r0 + j;
    return j * KK + tap;
}

/* Grid blocks of one group-cast item (validated: count 0 .. 2^40, wt
 * consistent with count): its count / GROUP_ELEMS rounded up, or for a
 * transposed weight with wt_tile_rows > 0 its rows / wt_tile_rows rounded
 * up. */
static uint64_t cast_item_blocks(const lucid_conv_gemm_cast_item &it) {
    const unsigned tr = it.wt[0] > 0 ? wt_tile_rows(it.wt[2]) : 0u;
    if (tr > 0) {
        const uint64_t rows = (uint64_t)it.wt[0] * (uint64_t)it.wt[1];
        return (rows + tr - 1) / tr;
    }
    return ((uint64_t)it.count + GROUP_ELEMS - 1) / GROUP_ELEMS;
}

/* The table of one group-cast launch, by value in the kernel parameters
 * (__grid_constant__: indexed in place, never copied per thread).  Item k
 * owns blocks [first[k], first[k+1]) of the grid (cast_item_blocks). */
struct gemm_cast_table {
    const float *src[LUCID_CONV_GEMM_CAST_GROUP];
    void *dst[LUCID_CONV_GEMM_CAST_GROUP];
    int64_t count[LUCID_CONV_GEMM_CAST_GROUP];
    int flip[LUCID_CONV_GEMM_CAST_GROUP][5];
    int wt[LUCID_CONV_GEMM_CAST_GROUP][3];
    unsigned first[LUCID_CONV_GEMM_CAST_GROUP + 1];
    int n;
};
static_assert(sizeof(gemm_cast_table) <= 8192,
              "group cast table exceeds 8 KiB of kernel parameters (CUDA 12.1+: 32,764 bytes)");

/* d[i] = T(s[i]) for every item of the table: the element operation of
 * gemm_wcast (lucid_elem<T>::store, one rounding), so the bits are its;
 * a flip item (flip[4] > 0) reads s at lucid_conv_col_wflip_src, the
 * index map of nn_conv_col.cu's per-call col_wflip (same bits); a wt item
 * (wt[0] > 0) at lucid_conv_igemm_wt_src, the map of nn_conv_igemm.cu's
 * per-call igemm_wt_cast (same rounding: same bits), through the
 * shared-memory tile of wt_tile_rows when a row fits it (the staging holds
 * the f32 values unchanged: one rounding still). */
template <typename T>
static __global__ void gemm_wcast_group(const __grid_constant__ gemm_cast_table t) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const unsigned b = blockIdx.x;
    int lo = 0, hi = t.n - 1; /* the item k with first[k] <= b < first[k+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t.first[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    const float *s = t.src[lo];
    T *d = (T *)t.dst[lo];
    const int64_t n = t.count[lo];
    const unsigned lb = b - t.first[lo]; /* the item's own block index */
    const int *f = t.flip[lo], *tw = t.wt[lo];
    const unsigned tr = tw[0] > 0 ? wt_tile_rows(tw[2]) : 0u;
    if (tr > 0) { /* the whole block takes this branch: the barrier is uniform */
        __shared__ float stage[GROUP_ELEMS];
        const unsigned KK = (unsigned)tw[2];
        const int64_t R = (int64_t)tw[0] * tw[1];
        const wt_tile tl = wt_tile_of(lb, tr, R);
        const unsigned ne = tl.nr * KK; /* <= tr * KK <= GROUP_ELEMS */
        const float *sr = s + tl.r0 * KK;
        for (unsigned e = threadIdx.x; e < ne; e += blockDim.x) stage[e] = sr[e];
        __syncthreads();
        for (unsigned e = threadIdx.x; e < ne; e += blockDim.x) {
            int64_t i;
            const unsigned k = wt_tile_elem(e, tl, KK, R, &i);
            lucid_elem<T>::store(d, i, stage[k]);
        }
        return;
    }
    const int64_t i0 = (int64_t)lb * GROUP_ELEMS;
    const int64_t i1 = i0 + GROUP_ELEMS < n ? i0 + GROUP_ELEMS : n;
    /* the gathers below are lucid_conv_col_wflip_src in 32-bit arithmetic
     * when the item fits (64-bit divisions made this launch 47.6 us on the
     * H200's critical path, session 11); the same indices, so the same bits */
    const bool narrow = n <= (int64_t)UINT32_MAX;
    if (tw[0] > 0) { /* a kernel of more than GROUP_ELEMS taps: element-wise */
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
            lucid_elem<T>::store(d, i, s[lucid_conv_igemm_wt_src(i, tw[0], tw[1], tw[2])]);
        return;
    }
    if (f[4] > 0) {
        if (narrow) {
            const unsigned Ci = (unsigned)f[0], Co = (unsigned)f[1], kh = (unsigned)f[2],
                           kw = (unsigned)f[3], Kr = (unsigned)f[4], KK = kh * kw;
            for (unsigned i = (unsigned)i0 + threadIdx.x; i < (unsigned)i1; i += blockDim.x) {
                const unsigned ci = i / Kr, k = i - ci * Kr;
                float v = 0.0f;
                if (k < Co * KK) {
                    const unsigned co = k / KK, rq = k - co * KK, r = rq / kw, q = rq - r * kw;
                    v = s[(size_t)(co * Ci + ci) * KK + (kh - 1 - r) * kw + (kw - 1 - q)];
                }
                lucid_elem<T>::store(d, i, v);
            }
            return;
        }
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
            const int64_t j = lucid_conv_col_wflip_src(i, f[0], f[1], f[2], f[3], f[4]);
            lucid_elem<T>::store(d, i, j < 0 ? 0.0f : s[j]);
        }
        return;
    }
    /* plain item: with 16-byte aligned f32 and 8-byte aligned T (every
     * block starts at a multiple of GROUP_ELEMS), each thread casts 4
     * consecutive elements from one float4 into one 8-byte store (the same
     * per-element rounding: the same bits; 4x fewer memory instructions than
     * the strided scalar loop, which took 40 us of the H200's replay start
     * beside layer 0, session 13); else, and for the tail, element-wise */
    const int64_t v1 = i0 + ((i1 - i0) & ~(int64_t)3);
    if ((((uintptr_t)(s + i0)) & 15u) == 0 && (((uintptr_t)(d + i0)) & 7u) == 0) {
        for (int64_t i = i0 + 4 * (int64_t)threadIdx.x; i < v1; i += 4 * (int64_t)blockDim.x) {
            const float4 v = *reinterpret_cast<const float4 *>(s + i);
            union { T h[4]; uint2 u; } o;
            lucid_elem<T>::store(o.h, 0, v.x);
            lucid_elem<T>::store(o.h, 1, v.y);
            lucid_elem<T>::store(o.h, 2, v.z);
            lucid_elem<T>::store(o.h, 3, v.w);
            *reinterpret_cast<uint2 *>(d + i) = o.u;
        }
        for (int64_t i = v1 + threadIdx.x; i < i1; i += blockDim.x) lucid_elem<T>::store(d, i, s[i]);
        return;
    }
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) lucid_elem<T>::store(d, i, s[i]);
}

/* y[n, o, p] = T(acc[n, o, p] + b[o]) (one rounding of the f32 sum) */
template <typename T>
static __global__ void gemm_bias_round(const float *__restrict__ acc,
                                       const float *__restrict__ b, T *__restrict__ y,
                                       int64_t C, int64_t P, int64_t total) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        lucid_elem<T>::store(y, i, acc[i] + b[(i / P) % C]);
}

/* dw[o][k] = beta*dw[o][k] + (((part[0][o][k] + part[1][o][k]) + part[2][o][k])
 * + ...) for k < Kout: the parts ([Cout, Kp] each, Kp >= Kout) folded in
 * order; beta == 0 never reads dw (dw [Cout, Kout]).  One thread per
 * element: for at most WGRAD_FOLD_SERIAL parts. */
#define WGRAD_FOLD_SERIAL 8
static __global__ void gemm_wgrad_fold(const float *__restrict__ part, float *dw, int64_t Cout,
                                       int64_t Kout, int64_t Kp, int64_t parts, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t n = Cout * Kout, np = Cout * Kp;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / Kout, src = i + o * (Kp - Kout);
        float s = part[src];
        for (int64_t k = 1; k < parts; k++) s += part[k * np + src];
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* The same fold for more parts, one warp per element: lane l adds parts l,
 * l + 32, ... in order, then a fixed shuffle-down tree over the lanes (a
 * fixed order too, so deterministic; not the serial order's bits). */
static __global__ void gemm_wgrad_fold_warp(const float *__restrict__ part, float *dw,
                                            int64_t Cout, int64_t Kout, int64_t Kp,
                                            int64_t parts, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t n = Cout * Kout, np = Cout * Kp;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < n; i += warps) {
        const int64_t o = i / Kout, src = i + o * (Kp - Kout);
        float s = 0.0f;
        for (int64_t k = lane; k < parts; k += 32) s += part[k * np + src];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0) dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* The operand pointers of the pointer-array filter-gradient GEMM, product j
 * = n*S + s (image n, columns [s*Pc, (s+1)*Pc)): a[j] = x + (n*Ci*P + s*Pc)
 * elements, b[j] = dy + (n*Co*P + s*Pc) elements, c[j] = part + j*pw floats
 * (es: bytes per activation element).  Written on the stream before each
 * GEMM, so replays and eager calls never read stale addresses. */
static __global__ void gemm_wgrad_ptrs(const char *x, const char *dy, float *part,
                                       const void **a, const void **b, void **c, int64_t S,
                                       int64_t parts, int64_t Ci, int64_t Co, int64_t P,
                                       int64_t Pc, int64_t pw, int64_t es) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < parts;
         j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = j / S, s = j % S;
        a[j] = x + (size_t)(n * Ci * P + s * Pc) * es;
        b[j] = dy + (size_t)(n * Co * P + s * Pc) * es;
        c[j] = part + j * pw;
    }
}

static unsigned gm_blocks(int64_t n) { return lucid_cuda_blocks(n, GEMM_THREADS); }

// ----------------------------------------------------------------------------
// entry points

static lucid_status gemm_check(lucid_ctx *ctx, const char *op, lucid_dtype dt,
                               const lucid_conv_gemm_geom *g) {
    if (dt != LUCID_BF16 && dt != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s (1x1 GEMM route): dtype %s (expected bf16 or f16)", op,
                            lucid_dtype_name(dt));
    if (!lucid_conv_gemm_fits(g))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s (1x1 GEMM route): N=%lld Cin=%lld Cout=%lld HW=%lld outside "
                            "the 32-bit cuBLAS sizes",
                            op, (long long)g->N, (long long)g->Cin, (long long)g->Cout,
                            (long long)g->HW);
    return LUCID_OK;
}

/* Weight-cast launches (gemm_wcast and gemm_wcast_group) queued by this
 * thread: lucid_cuda_wcast_launch_count (nn_conv_gemm.cuh). */
static thread_local unsigned long g_wcast_launches;

extern "C" unsigned long lucid_cuda_wcast_launch_count(void) { return g_wcast_launches; }

/* The weight rounded to dt into scratch (the first region). */
static lucid_status cast_w(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                           const lucid_conv_gemm_geom *g, const float *w, void *dst) {
    int64_t n = g->Cout * g->Cin;
    if (dt == LUCID_BF16)
        CUDA_CHECK(ctx, lucid_launch(gemm_wcast<__nv_bfloat16>, dim3(gm_blocks(n)),
                                     dim3(GEMM_THREADS), 0, stream, w,
                                     (__nv_bfloat16 *)dst, n));
    else
        CUDA_CHECK(ctx, lucid_launch(gemm_wcast<__half>, dim3(gm_blocks(n)),
                                     dim3(GEMM_THREADS), 0, stream, w, (__half *)dst, n));
    g_wcast_launches++;
    return LUCID_OK;
}

lucid_status lucid_conv_gemm_cast_weight(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                         const float *w, void *dst, int64_t n) {
    if (dt != LUCID_BF16 && dt != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "conv weight cast (1x1 GEMM route): dtype %s (expected bf16 or f16)",
                            lucid_dtype_name(dt));
    if (n <= 0) return LUCID_OK;
    lucid_conv_gemm_geom g = {1, n, 1, 1}; /* cast_w casts Cout*Cin elements */
    return cast_w(ctx, stream, dt, &g, w, dst);
}

lucid_status lucid_conv_gemm_cast_group(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                        const lucid_conv_gemm_cast_item *items, int n) {
    if (dt != LUCID_BF16 && dt != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "conv weight group cast: dtype %s (expected bf16 or f16)",
                            lucid_dtype_name(dt));
    if (n < 0 || (n > 0 && !items))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "conv weight group cast: %d items%s", n,
                            n < 0 ? "" : ", table NULL");
    int i = 0;
    while (i < n) {
        gemm_cast_table t;
        memset(&t, 0, sizeof t);
        uint64_t blocks = 0;
        while (i < n && t.n < LUCID_CONV_GEMM_CAST_GROUP) {
            const lucid_conv_gemm_cast_item &it = items[i++];
            if (it.count < 0 || it.count > ((int64_t)1 << 40))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "conv weight group cast: item %d has %lld elements "
                                    "(expected 0 .. 2^40)",
                                    i - 1, (long long)it.count);
            if (it.flip[4] > 0 &&
                (it.flip[0] < 1 || it.flip[1] < 1 || it.flip[2] < 1 || it.flip[3] < 1 ||
                 (int64_t)it.flip[1] * it.flip[2] * it.flip[3] > it.flip[4] ||
                 it.count != (int64_t)it.flip[0] * it.flip[4]))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "conv weight group cast: flip item %d: Cin %d, Cout %d, "
                                    "kernel %dx%d, rows of %d, %lld elements (expected rows >= "
                                    "Cout*kh*kw and Cin*rows elements)",
                                    i - 1, it.flip[0], it.flip[1], it.flip[2], it.flip[3],
                                    it.flip[4], (long long)it.count);
            if (it.wt[0] != 0 &&
                (it.wt[0] < 1 || it.wt[1] < 1 || it.wt[2] < 1 || it.flip[4] > 0 ||
                 it.count != (int64_t)it.wt[0] * it.wt[1] * it.wt[2]))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "conv weight group cast: transposed-weight item %d: Cin %d, "
                                    "Cout %d, %d taps, %lld elements%s (expected Cin*Cout*taps "
                                    "elements, no flip)",
                                    i - 1, it.wt[0], it.wt[1], it.wt[2], (long long)it.count,
                                    it.flip[4] > 0 ? ", flip set" : "");
            if (it.count == 0) continue;
            const uint64_t nb = cast_item_blocks(it);
            if (blocks + nb > 0x7fffffffu) { /* grid.x: start a new launch */
                i--;
                break;
            }
            t.src[t.n] = it.src;
            t.dst[t.n] = it.dst;
            t.count[t.n] = it.count;
            memcpy(t.flip[t.n], it.flip, sizeof it.flip);
            memcpy(t.wt[t.n], it.wt, sizeof it.wt);
            t.first[t.n] = (unsigned)blocks;
            blocks += nb;
            t.n++;
        }
        if (t.n == 0) continue;
        t.first[t.n] = (unsigned)blocks;
        if (dt == LUCID_BF16)
            CUDA_CHECK(ctx, lucid_launch(gemm_wcast_group<__nv_bfloat16>, dim3((unsigned)blocks),
                                         dim3(GEMM_THREADS), 0, stream, t));
        else
            CUDA_CHECK(ctx, lucid_launch(gemm_wcast_group<__half>, dim3((unsigned)blocks),
                                         dim3(GEMM_THREADS), 0, stream, t));
        g_wcast_launches++;
    }
    return LUCID_OK;
}

lucid_status lucid_conv_gemm_forward(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                     lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                     const void *x, const float *w, const float *b, void *y,
                                     void *scratch) {
    return lucid_conv_gemm_forward_wc(ctx, h, stream, dt, g, x, w, NULL, b, y, scratch);
}

lucid_status lucid_conv_gemm_forward_wc(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                        lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                        const void *x, const float *w, const void *wcast,
                                        const float *b, void *y, void *scratch) {
    LUCID_TRY(gemm_check(ctx, "conv2d_forward", dt, g));
    const int64_t P = g->HW, Ci = g->Cin, Co = g->Cout;
    const void *wc = wcast;
    if (!wc) {
        LUCID_TRY(cast_w(ctx, stream, dt, g, w, scratch));
        wc = scratch;
    }
    const cudaDataType_t adt = lucid_cuda_datatype(dt);
    /* with a bias the product stays f32 until the bias is added */
    void *out = b ? (void *)((char *)scratch + wcast_bytes(g, dt)) : y;
    const cudaDataType_t cdt = b ? CUDA_R_32F : adt;
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                          h, CUBLAS_OP_N, CUBLAS_OP_N, (int)P, (int)Co, (int)Ci, &one, x, adt,
                          (int)P, (long long)(Ci * P), wc, adt, (int)Ci, 0LL, &zero, out, cdt,
                          (int)P, (long long)(Co * P), (int)g->N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    if (b) {
        int64_t ny = g->N * Co * P;
        if (dt == LUCID_BF16)
            CUDA_CHECK(ctx, lucid_launch(gemm_bias_round<__nv_bfloat16>, dim3(gm_blocks(ny)),
                                         dim3(GEMM_THREADS), 0, stream, (const float *)out, b,
                                         (__nv_bfloat16 *)y, Co, P, ny));
        else
            CUDA_CHECK(ctx, lucid_launch(gemm_bias_round<__half>, dim3(gm_blocks(ny)),
                                         dim3(GEMM_THREADS), 0, stream, (const float *)out, b,
                                         (__half *)y, Co, P, ny));
    }
    return LUCID_OK;
}

lucid_status lucid_conv_gemm_backward_data(lucid_ctx *ctx, cublasHandle_t h,
                                           cudaStream_t stream, lucid_dtype dt,
                                           const lucid_conv_gemm_geom *g, const void *dy,
                                           const float *w, void *dx, float beta,
                                           void *scratch) {
    return lucid_conv_gemm_backward_data_wc(ctx, h, stream, dt, g, dy, w, NULL, dx, beta,
                                            scratch);
}

lucid_status lucid_conv_gemm_backward_data_wc(lucid_ctx *ctx, cublasHandle_t h,
                                              cudaStream_t stream, lucid_dtype dt,
                                              const lucid_conv_gemm_geom *g, const void *dy,
                                              const float *w, const void *wcast, void *dx,
                                              float beta, void *scratch) {
    LUCID_TRY(gemm_check(ctx, "conv2d_backward_input", dt, g));
    const int64_t P = g->HW, Ci = g->Cin, Co = g->Cout;
    const void *wc = wcast;
    if (!wc) {
        LUCID_TRY(cast_w(ctx, stream, dt, g, w, scratch));
        wc = scratch;
    }
    const cudaDataType_t adt = lucid_cuda_datatype(dt);
    const float one = 1.0f;
    CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                          h, CUBLAS_OP_N, CUBLAS_OP_T, (int)P, (int)Ci, (int)Co, &one, dy, adt,
                          (int)P, (long long)(Co * P), wc, adt, (int)Ci, 0LL, &beta, dx, adt,
                          (int)P, (long long)(Ci * P), (int)g->N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    return LUCID_OK;
}

lucid_status lucid_conv_gemm_backward_filter(lucid_ctx *ctx, cublasHandle_t h,
                                             cudaStream_t stream, lucid_dtype dt,
                                             const lucid_conv_gemm_geom *g, const void *x,
                                             const void *dy, float *dw, float beta,
                                             void *scratch) {
    return lucid_conv_gemm_backward_filter_rows(ctx, h, stream, dt, g, g ? g->Cin : 0, x, dy,
                                                dw, beta, scratch);
}

/* LUCID_WGRAD_SM, read once per process: 0 (unset, the default) leaves
 * cuBLAS its own choice for the filter gradients' GEMMs; n > 0 sets the
 * handle's SM count target (cublasSetSmCountTarget) to n around them, so
 * that cuBLAS picks kernels for a GPU of n SMs: the filter gradients run on
 * the low-priority parameter-gradient lanes beside the critical path of the
 * recorded step, whose kernels ran up to 3x longer there than alone (H200,
 * session 13); a smaller footprint is the A/B.  The kernel choice, and with
 * it the summation order, may differ from the default's (eager and
 * recorded alike).  -1 in wgrad_sm_target for a value that is not a
 * non-negative integer (*value: the text). */
static int wgrad_sm_target(const char **value) {
    static const char *text = getenv("LUCID_WGRAD_SM");
    static const int target = [] {
        if (!text || !text[0]) return 0;
        char *end = NULL;
        long v = strtol(text, &end, 10);
        return (*end || v < 0 || v > 100000) ? -1 : (int)v;
    }();
    if (value) *value = text ? text : "";
    return target;
}

static lucid_status backward_filter_rows(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                         lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                         int64_t Kout, const void *x, const void *dy, float *dw,
                                         float beta, void *scratch);

lucid_status lucid_conv_gemm_backward_filter_rows(lucid_ctx *ctx, cublasHandle_t h,
                                                  cudaStream_t stream, lucid_dtype dt,
                                                  const lucid_conv_gemm_geom *g, int64_t Kout,
                                                  const void *x, const void *dy, float *dw,
                                                  float beta, void *scratch) {
    const char *v = "";
    const int tgt = wgrad_sm_target(&v);
    if (tgt < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_backward_params: LUCID_WGRAD_SM=\"%s\" (expected 0, "
                            "cuBLAS's choice, or a positive SM count)",
                            v);
    if (tgt == 0)
        return backward_filter_rows(ctx, h, stream, dt, g, Kout, x, dy, dw, beta, scratch);
    int prev = 0;
    CUBLAS_CHECK(ctx, cublasGetSmCountTarget(h, &prev));
    CUBLAS_CHECK(ctx, cublasSetSmCountTarget(h, tgt));
    const lucid_status r = backward_filter_rows(ctx, h, stream, dt, g, Kout, x, dy, dw, beta,
                                                scratch);
    /* restored on every path; a failure to restore is reported unless the
     * call already failed (its own error is the one to keep) */
    const cublasStatus_t rs = cublasSetSmCountTarget(h, prev);
    if (r != LUCID_OK) return r;
    if (rs != CUBLAS_STATUS_SUCCESS)
        return lucid_cublas_err(ctx, rs, "cublasSetSmCountTarget(h, prev)", __FILE__, __LINE__);
    return LUCID_OK;
}

static lucid_status backward_filter_rows(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                         lucid_dtype dt, const lucid_conv_gemm_geom *g,
                                         int64_t Kout, const void *x, const void *dy, float *dw,
                                         float beta, void *scratch) {
    LUCID_TRY(gemm_check(ctx, "conv2d_backward_params", dt, g));
    if (Kout < 1 || Kout > g->Cin)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_backward_params (GEMM route): %lld filter columns kept of "
                            "%lld (expected 1 .. %lld)",
                            (long long)Kout, (long long)g->Cin, (long long)g->Cin);
    const char *v = "";
    if (wgrad_chunk(&v) < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_backward_params: LUCID_WGRAD_SPLIT=\"%s\" (expected 0, "
                            "no split, or the least columns per chunk, a positive integer)",
                            v);
    const int64_t P = g->HW, Ci = g->Cin, Co = g->Cout, N = g->N;
    const int64_t S = lucid_conv_gemm_wgrad_splits(g), Pc = P / S, parts = N * S;
    const cudaDataType_t adt = lucid_cuda_datatype(dt);
    const float one = 1.0f, zero = 0.0f;
    const size_t es = lucid_dtype_size(dt);
    const int64_t pw = Co * Ci; /* floats per partial */
    if (parts == 1 && Kout == Ci) { /* one GEMM straight into dw */
        CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                              h, CUBLAS_OP_T, CUBLAS_OP_N, (int)Ci, (int)Co, (int)P, &one, x,
                              adt, (int)P, (long long)(Ci * P), dy, adt, (int)P,
                              (long long)(Co * P), &beta, dw, CUDA_R_32F, (int)Ci,
                              (long long)pw, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return LUCID_OK;
    }
    float *part = (float *)scratch;
    if (wgrad_uses_ptrs(g, S)) { /* all N*S products in one pointer-array GEMM */
        void **ptr = (void **)((char *)scratch + nn_align((size_t)(parts * pw) * sizeof(float)));
        const void **pa = (const void **)ptr, **pb = (const void **)(ptr + parts);
        void **pc = ptr + 2 * parts;
        CUDA_CHECK(ctx, lucid_launch(gemm_wgrad_ptrs, dim3(gm_blocks(parts)), dim3(GEMM_THREADS),
                                     0, stream, (const char *)x, (const char *)dy, part, pa, pb,
                                     pc, S, parts, Ci, Co, P, Pc, pw, (int64_t)es));
        CUBLAS_CHECK(ctx, cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)Ci, (int)Co,
                                              (int)Pc, &one, pa, adt, (int)P, pb, adt, (int)P,
                                              &zero, pc, CUDA_R_32F, (int)Ci, (int)parts,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else if (S >= N) { /* per image: its S chunks, Pc columns apart */
        for (int64_t n = 0; n < N; n++)
            CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                                  h, CUBLAS_OP_T, CUBLAS_OP_N, (int)Ci, (int)Co, (int)Pc, &one,
                                  (const char *)x + (size_t)(n * Ci * P) * es, adt, (int)P,
                                  (long long)Pc, (const char *)dy + (size_t)(n * Co * P) * es,
                                  adt, (int)P, (long long)Pc, &zero, part + n * S * pw,
                                  CUDA_R_32F, (int)Ci, (long long)pw, (int)S,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else { /* per chunk: the N images */
        for (int64_t s = 0; s < S; s++)
            CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                                  h, CUBLAS_OP_T, CUBLAS_OP_N, (int)Ci, (int)Co, (int)Pc, &one,
                                  (const char *)x + (size_t)(s * Pc) * es, adt, (int)P,
                                  (long long)(Ci * P), (const char *)dy + (size_t)(s * Pc) * es,
                                  adt, (int)P, (long long)(Co * P), &zero, part + s * pw,
                                  CUDA_R_32F, (int)Ci, (long long)(S * pw), (int)N,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (parts <= WGRAD_FOLD_SERIAL)
        CUDA_CHECK(ctx, lucid_launch(gemm_wgrad_fold, dim3(gm_blocks(Co * Kout)),
                                     dim3(GEMM_THREADS), 0, stream, (const float *)part, dw, Co,
                                     Kout, Ci, parts, beta));
    else
        CUDA_CHECK(ctx, lucid_launch(gemm_wgrad_fold_warp, dim3(gm_blocks(Co * Kout * 32)),
                                     dim3(GEMM_THREADS), 0, stream, (const float *)part, dw, Co,
                                     Kout, Ci, parts, beta));
    return LUCID_OK;
}
