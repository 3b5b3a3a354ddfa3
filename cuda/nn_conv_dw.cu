/*
 * nn_conv_dw.cu — depthwise Conv2d (groups == Cin == Cout) in NCHW: forward,
 * backward-data and a deterministic backward-filter.  Interface and
 * semantics: nn_conv_dw.cuh.
 *
 * Tiled route (kh == kw == K in {3, 5}, stride 1, dilation 1, pad (K-1)/2,
 * so Ho == H and Wo == W; the YOLO11n-pose depthwise convs are all 3x3 of
 * this kind).
 *
 *   Rows.  The N*C*H image rows of a tensor are one "row space" (row g is
 *   plane g / H, image row g % H, at element g*W).  A forward/backward-data
 *   block owns TH consecutive output rows, which may straddle planes: it
 *   stages the input rows [g0-P, g0+TH+P) into shared memory as f32 (P =
 *   (K-1)/2; rows outside the tensor are zeros) and every output row only
 *   uses the staged rows whose image row is inside its own plane (a row of
 *   the neighbouring plane is skipped, never multiplied by zero, so a
 *   non-finite value there cannot leak).  Shared row layout: 4 zero columns,
 *   the W input columns, >= 4 zero columns; stride SW = 4*ceil(W/4) + 8
 *   floats, so the interior starts 16-byte aligned.
 *   Staging reads each row with 16-, 8- or 4-byte vector loads when W and
 *   the base pointer allow (W % 8 == 0 for bf16/f16 gives 16 bytes).
 *
 *   Threads.  128 threads; each computes V = 4 consecutive outputs of one
 *   row (TPR = ceil(W/4) strips per row), reading its K rows of K+3 inputs
 *   from shared memory as 3 float4 per row (conflict-free) and the K*K f32
 *   weights of its channel from global (L1-resident).  TH = 128/TPR rows per
 *   tile (one strip per thread), doubled (two strips per thread) when that
 *   still leaves >= 1024 blocks.  Stores are 4-wide vectors (8 bytes bf16,
 *   16 bytes f32) when W % 4 == 0 and the pointer is aligned.
 *   Backward-data is the same kernel on dy with the kernel rotated by 180
 *   degrees (stride 1, pad P: conv_transpose == correlation with the flipped
 *   kernel), plus beta*dx read in f32 before the single rounding.
 *
 *   Filter gradient.  Grid (C, S): block (c, s) takes the row tiles s, s+S,
 *   ... of channel c (rows n*H + h over n, h), stages x as above, reads dy
 *   4-wide from global and accumulates the K*K taps in registers; the block
 *   folds them with a xor-shuffle tree per warp and the 4 warp sums in warp
 *   order.  S = min(tiles per channel, ceil(2048 / C)) is a function of the
 *   geometry only.  S == 1: the block writes dw = beta*dw + sum directly;
 *   otherwise partials go to scratch[(c*K*K + tap)*S + s] and
 *   dw_wgrad_fold sums each row of S in index order.
 *
 * Generic route (any kernel, stride, padding, dilation): forward and
 * backward-data are one thread per output / input element (a gather with
 * exact-division tests for the transposed case); the filter gradient is a
 * grid of (C*kh*kw, S) blocks of 256 threads, each folding a fixed chunk of
 * the N*Ho*Wo products with nn_block_sum, then the same fold kernel.
 *
 * Every accumulation is f32 fmaf; results are rounded once at the store.
 */
#include "nn_common.cuh"
#include "nn_conv_dw.cuh"

#include <limits.h>
#include <string.h>

#define DW_BT 128             /* threads of the tiled kernels */
#define DW_GT 256             /* threads of the generic kernels */
#define DW_V 4                /* outputs per thread along W (tiled) */
#define DW_SPLIT_TARGET 2048  /* backward-filter: aim for about this many blocks */
#define DW_S_MAX 1024         /* at most this many splits per channel/tap */
#define DW_SMEM_MAX (48 * 1024)

// ----------------------------------------------------------------------------
// host-side planning (a function of the geometry only)

typedef struct dw_tiling {
    int K;        /* kernel size (3 or 5) */
    int TPR;      /* 4-wide strips per row: ceil(W / 4) */
    int SW;       /* shared row stride in floats: 4*TPR + 8 */
    int TH;       /* rows per tile */
    size_t smem;  /* dynamic shared bytes: (TH + K - 1) * SW * 4 */
} dw_tiling;

/* K (3 or 5) when g is a same-size stride-1 conv the tiled kernels take. */
static int dw_fast_shape(const lucid_conv_dw_geom *g) {
    int K = g->kh;
    if ((K != 3 && K != 5) || g->kw != K) return 0;
    if (g->sh != 1 || g->sw != 1 || g->dh != 1 || g->dw != 1) return 0;
    if (g->ph != (K - 1) / 2 || g->pw != (K - 1) / 2) return 0;
    if (g->Ho != g->H || g->Wo != g->W) return 0;
    if (g->N < 1 || g->C < 1) return 0;
    if (g->W > INT_MAX / 8 || g->H > INT_MAX / 8) return 0;
    if (g->N * g->C * g->H > INT_MAX / 2 ||
        g->N * g->C * g->H * g->W > INT_MAX / 2) return 0; /* 32-bit rows, items */
    return K;
}

/* Tiling of a row space of R rows; grow: allow two strips per thread. */
static int dw_tile(const lucid_conv_dw_geom *g, int64_t R, int grow, dw_tiling *t) {
    int K = dw_fast_shape(g);
    if (!K) return 0;
    t->K = K;
    t->TPR = (int)((g->W + DW_V - 1) / DW_V);
    t->SW = t->TPR * DW_V + 8;
    int th1 = DW_BT / t->TPR;
    if (th1 < 1) th1 = 1;
    int th = th1;
    if (grow && (R + 2 * (int64_t)th1 - 1) / (2 * (int64_t)th1) >= 1024) th = 2 * th1;
    for (;;) {
        size_t smem = (size_t)(th + K - 1) * (size_t)t->SW * sizeof(float);
        if (smem <= DW_SMEM_MAX) {
            t->TH = th;
            t->smem = smem;
            return 1;
        }
        if (th == th1) return 0;
        th = th1;
    }
}

typedef struct dw_wplan {
    int tiled;
    dw_tiling t;      /* tiled */
    int64_t ntiles;   /* tiled: row tiles per channel */
    int64_t CH;       /* generic: products per chunk */
    int64_t S;        /* splits (1: the blocks write dw themselves) */
    int64_t KK;       /* taps */
} dw_wplan;

static int64_t dw_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void dw_wgrad_plan(const lucid_conv_dw_geom *g, dw_wplan *p) {
    memset(p, 0, sizeof *p);
    p->KK = (int64_t)g->kh * g->kw;
    p->S = 1;
    if (g->C < 1) return;
    int64_t NH = g->N * g->H;
    if (dw_tile(g, NH, 0, &p->t)) {
        p->tiled = 1;
        p->ntiles = dw_cdiv(NH, p->t.TH);
        int64_t S = dw_cdiv(DW_SPLIT_TARGET, g->C);
        if (S > p->ntiles) S = p->ntiles;
        if (S > DW_S_MAX) S = DW_S_MAX;
        p->S = S < 1 ? 1 : S;
        return;
    }
    int64_t M = g->N * g->Ho * g->Wo;
    if (M < 1) return;
    int64_t S = dw_cdiv(DW_SPLIT_TARGET, g->C * p->KK);
    int64_t smax = dw_cdiv(M, 1024);
    if (S > smax) S = smax;
    if (S > DW_S_MAX) S = DW_S_MAX;
    if (S < 1) S = 1;
    p->CH = dw_cdiv(M, S);
    p->S = dw_cdiv(M, p->CH); /* no empty chunk */
}

/* Widest vector (elements) for rows of W elements starting at p. */
static int dw_ve(const void *p, int64_t W, size_t esz) {
    for (int ve = (int)(16 / esz); ve > 1; ve >>= 1)
        if (W % ve == 0 && (uintptr_t)p % ((size_t)ve * esz) == 0) return ve;
    return 1;
}

/* 4-wide output strips can be vector accesses at p. */
static int dw_vec4(const void *p, int64_t W, size_t esz) {
    return W % DW_V == 0 && (uintptr_t)p % (DW_V * esz) == 0;
}

// ----------------------------------------------------------------------------
// device helpers

template <typename T> __device__ __forceinline__ float dw_f(T v);
template <> __device__ __forceinline__ float dw_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float dw_f<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float dw_f<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T dw_t(float v);
template <> __device__ __forceinline__ float dw_t<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 dw_t<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half dw_t<__half>(float v) { return __float2half_rn(v); }

template <int BYTES> struct dw_raw;
template <> struct dw_raw<16> { typedef uint4 type; };
template <> struct dw_raw<8> { typedef uint2 type; };
template <> struct dw_raw<4> { typedef unsigned int type; };
template <> struct dw_raw<2> { typedef unsigned short type; };

/* VE elements at p (aligned to VE*sizeof(T)) as floats. */
template <typename T, int VE>
__device__ __forceinline__ void dw_ld(const T *p, float *f) {
    typedef typename dw_raw<VE * (int)sizeof(T)>::type R;
    const R r = *reinterpret_cast<const R *>(p);
    T e[VE];
    memcpy(e, &r, sizeof r); /* register moves */
#pragma unroll
    for (int k = 0; k < VE; k++) f[k] = dw_f<T>(e[k]);
}

/* 4 floats to 4 elements at p (aligned to 4*sizeof(T)), one rounding each. */
template <typename T>
__device__ __forceinline__ void dw_st4(T *p, const float *a) {
    typedef typename dw_raw<DW_V * (int)sizeof(T)>::type R;
    T e[DW_V];
#pragma unroll
    for (int k = 0; k < DW_V; k++) e[k] = dw_t<T>(a[k]);
    R r;
    memcpy(&r, e, sizeof r); /* register moves */
    *reinterpret_cast<R *>(p) = r;
}

/* Stage nrows rows of W elements into s (row rr at s + rr*SW + 4); row rr
 * starts at element row_off(rr) of in, or is zeros when that is < 0. */
template <typename T, int VE, typename RowOff>
__device__ __forceinline__ void dw_stage_rows(const T *__restrict__ in, float *s, int nrows,
                                              int W, int SW, RowOff row_off) {
    const int cpr = W / VE;
    const int total = nrows * cpr;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int rr = i / cpr, cc = (i - rr * cpr) * VE;
        const long long off = row_off(rr);
        float f[VE];
        if (off >= 0) {
            dw_ld<T, VE>(in + off + cc, f);
        } else {
#pragma unroll
            for (int k = 0; k < VE; k++) f[k] = 0.0f;
        }
        float *d = s + rr * SW + 4 + cc;
        if constexpr (VE % 4 == 0) {
#pragma unroll
            for (int q = 0; q < VE / 4; q++)
                reinterpret_cast<float4 *>(d)[q] =
                    make_float4(f[4 * q], f[4 * q + 1], f[4 * q + 2], f[4 * q + 3]);
        } else if constexpr (VE == 2) {
            *reinterpret_cast<float2 *>(d) = make_float2(f[0], f[1]);
        } else {
            d[0] = f[0];
        }
    }
}

/* Stage rows (vector width ve chosen on the host) and zero the pad columns
 * [0, 4) and [4 + W, SW) of every staged row. */
template <typename T, typename RowOff>
__device__ __forceinline__ void dw_stage(const T *__restrict__ in, float *s, int nrows, int W,
                                         int SW, int ve, RowOff row_off) {
    constexpr int VMAX = 16 / (int)sizeof(T); /* 4 (f32) or 8 (bf16/f16) */
    if (ve == VMAX) dw_stage_rows<T, VMAX>(in, s, nrows, W, SW, row_off);
    else if (ve >= 4) dw_stage_rows<T, 4>(in, s, nrows, W, SW, row_off);
    else if (ve == 2) dw_stage_rows<T, 2>(in, s, nrows, W, SW, row_off);
    else dw_stage_rows<T, 1>(in, s, nrows, W, SW, row_off);
    const int np = SW - W;
    const int tp = nrows * np;
    for (int i = threadIdx.x; i < tp; i += blockDim.x) {
        const int rr = i / np, k = i - rr * np;
        s[rr * SW + (k < 4 ? k : W + k)] = 0.0f;
    }
}

/* The K+3 staged inputs of a 4-wide strip at column j0 of shared row sr
 * (shared columns j0 .. j0 + 4*NF4 - 1; the strip's taps start at OFF). */
template <int NF4>
__device__ __forceinline__ void dw_row_in(const float *sr, int j0, float *xs) {
    const float4 *p = reinterpret_cast<const float4 *>(sr + j0);
#pragma unroll
    for (int q = 0; q < NF4; q++) {
        float4 f = p[q];
        xs[4 * q] = f.x;
        xs[4 * q + 1] = f.y;
        xs[4 * q + 2] = f.z;
        xs[4 * q + 3] = f.w;
    }
}

// ----------------------------------------------------------------------------
// tiled kernels

/* Forward (DGRAD false): out = conv(in, w) + b.  Backward-data (DGRAD true):
 * out = beta*out + conv(in, rot180(w)), in = dy.  One row space of R rows
 * (N*C*H), TH rows per block. */
template <typename T, int K, bool DGRAD>
static __global__ void __launch_bounds__(DW_BT)
dw_tiled_fd(const T *__restrict__ in, const float *__restrict__ w, const float *__restrict__ b,
            T *__restrict__ out, float beta, int C, int H, int W, int R, int TH, int TPR, int SW,
            int ve, int vec_out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ float4 dw_smem[];
    float *s = reinterpret_cast<float *>(dw_smem);
    constexpr int P = (K - 1) / 2, OFF = 4 - P, NF4 = (OFF + DW_V + K - 1 + 3) / 4;
    const int g0 = (int)blockIdx.x * TH;
    dw_stage(in, s, TH + K - 1, W, SW, ve, [=](int rr) -> long long {
        const int g = g0 - P + rr;
        return (g >= 0 && g < R) ? (long long)g * W : -1LL;
    });
    __syncthreads();
    const int items = TH * TPR;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        const int r = it / TPR, j0 = (it - r * TPR) * DW_V, row = g0 + r;
        if (row >= R) break;
        const int h = row % H, c = (row / H) % C;
        const float *wc = w + (size_t)c * (K * K);
        float wr[K * K];
#pragma unroll
        for (int q = 0; q < K * K; q++) wr[q] = __ldg(wc + (DGRAD ? K * K - 1 - q : q));
        const float b0 = (!DGRAD && b) ? __ldg(b + c) : 0.0f;
        float acc[DW_V];
#pragma unroll
        for (int k = 0; k < DW_V; k++) acc[k] = b0;
#pragma unroll
        for (int u = 0; u < K; u++) {
            const int hh = h + u - P;
            if (hh < 0 || hh >= H) continue;
            float xs[4 * NF4];
            dw_row_in<NF4>(s + (r + u) * SW, j0, xs);
#pragma unroll
            for (int v = 0; v < K; v++)
#pragma unroll
                for (int k = 0; k < DW_V; k++)
                    acc[k] = fmaf(wr[u * K + v], xs[OFF + k + v], acc[k]);
        }
        T *o = out + (long long)row * W + j0;
        if (vec_out) {
            if (DGRAD && beta != 0.0f) {
                float old[DW_V];
                dw_ld<T, DW_V>(o, old);
#pragma unroll
                for (int k = 0; k < DW_V; k++) acc[k] = fmaf(beta, old[k], acc[k]);
            }
            dw_st4<T>(o, acc);
        } else {
            const int kmax = W - j0;
#pragma unroll
            for (int k = 0; k < DW_V; k++) {
                if (k >= kmax) break;
                float a = acc[k];
                if (DGRAD && beta != 0.0f) a = fmaf(beta, dw_f<T>(o[k]), a);
                o[k] = dw_t<T>(a);
            }
        }
    }
}

/* Filter gradient, grid (C, S): block (c, sp) folds the row tiles sp,
 * sp+S, ... of channel c (NH = N*H rows n*H + h) into K*K sums. */
template <typename T, int K>
static __global__ void __launch_bounds__(DW_BT)
dw_tiled_wgrad(const T *__restrict__ x, const T *__restrict__ dy, float *dw, float *part,
               float beta, int C, int H, int W, int NH, int TH, int TPR, int SW, int ve,
               int vec_dy, int ntiles, int S) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ float4 dw_smem[];
    float *s = reinterpret_cast<float *>(dw_smem);
    constexpr int P = (K - 1) / 2, OFF = 4 - P, NF4 = (OFF + DW_V + K - 1 + 3) / 4, KK = K * K;
    __shared__ float red[DW_BT / 32][KK];
    const int c = (int)blockIdx.x, sp = (int)blockIdx.y;
    const long long plane = (long long)H * W;
    float acc[KK];
#pragma unroll
    for (int q = 0; q < KK; q++) acc[q] = 0.0f;
    const int items = TH * TPR;
    for (int tile = sp; tile < ntiles; tile += S) {
        const int q0 = tile * TH;
        __syncthreads(); /* the previous tile's reads are done */
        dw_stage(x, s, TH + K - 1, W, SW, ve, [=](int rr) -> long long {
            const int q = q0 - P + rr;
            if (q < 0 || q >= NH) return -1LL;
            const int n = q / H, h = q - n * H;
            return ((long long)n * C + c) * plane + (long long)h * W;
        });
        __syncthreads();
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int r = it / TPR, j0 = (it - r * TPR) * DW_V, q = q0 + r;
            if (q >= NH) break;
            const int n = q / H, h = q - n * H, kmax = W - j0;
            const T *dp = dy + ((long long)n * C + c) * plane + (long long)h * W + j0;
            float d[DW_V];
            if (vec_dy) {
                dw_ld<T, DW_V>(dp, d);
            } else {
#pragma unroll
                for (int k = 0; k < DW_V; k++) d[k] = k < kmax ? dw_f<T>(dp[k]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < K; u++) {
                const int hh = h + u - P;
                if (hh < 0 || hh >= H) continue;
                float xs[4 * NF4];
                dw_row_in<NF4>(s + (r + u) * SW, j0, xs);
#pragma unroll
                for (int v = 0; v < K; v++)
#pragma unroll
                    for (int k = 0; k < DW_V; k++)
                        if (k < kmax) acc[u * K + v] = fmaf(d[k], xs[OFF + k + v], acc[u * K + v]);
            }
        }
    }
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int q = 0; q < KK; q++) {
        const float v = nn_warp_sum(acc[q]);
        if (lane == 0) red[wid][q] = v;
    }
    __syncthreads();
    if (threadIdx.x < KK) {
        float sum = 0.0f;
#pragma unroll
        for (int wv = 0; wv < DW_BT / 32; wv++) sum += red[wv][threadIdx.x];
        const size_t e = (size_t)c * KK + threadIdx.x;
        if (S == 1) dw[e] = beta != 0.0f ? fmaf(beta, dw[e], sum) : sum;
        else part[e * (size_t)S + sp] = sum;
    }
}

/* dw[i] = beta*dw[i] + sum_{s < S} part[i*S + s], s in index order. */
static __global__ void dw_wgrad_fold(const float *__restrict__ part, float *dw, int64_t n, int S,
                                     float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float *p = part + i * S;
        float sum = 0.0f;
        for (int k = 0; k < S; k++) sum += p[k];
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], sum) : sum;
    }
}

// ----------------------------------------------------------------------------
// generic kernels (any kernel size, stride, padding, dilation)

template <typename T>
static __global__ void dw_generic_fwd(const T *__restrict__ x, const float *__restrict__ w,
                                      const float *__restrict__ b, T *__restrict__ y,
                                      lucid_conv_dw_geom g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t total = g.N * g.C * g.Ho * g.Wo, KK = (int64_t)g.kh * g.kw;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % g.Wo, r = e / g.Wo;
        const int64_t i = r % g.Ho, p = r / g.Ho; /* p = n*C + c */
        const int64_t c = p % g.C;
        const T *xp = x + p * g.H * g.W;
        const float *wc = w + c * KK;
        float acc = b ? b[c] : 0.0f;
        for (int u = 0; u < g.kh; u++) {
            const int64_t hi = i * g.sh - g.ph + (int64_t)u * g.dh;
            if (hi < 0 || hi >= g.H) continue;
            for (int v = 0; v < g.kw; v++) {
                const int64_t wi = j * g.sw - g.pw + (int64_t)v * g.dw;
                if (wi < 0 || wi >= g.W) continue;
                acc = fmaf(wc[u * g.kw + v], dw_f<T>(xp[hi * g.W + wi]), acc);
            }
        }
        y[e] = dw_t<T>(acc);
    }
}

/* dx[n,c,h,x] = beta*dx + sum_{u,v} w[c,u,v] * dy[n,c,(h+ph-u*dh)/sh,
 * (x+pw-v*dw)/sw] over the taps where both divisions are exact and in range */
template <typename T>
static __global__ void dw_generic_dgrad(const T *__restrict__ dy, const float *__restrict__ w,
                                        T *dx, lucid_conv_dw_geom g, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int64_t total = g.N * g.C * g.H * g.W, KK = (int64_t)g.kh * g.kw;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t wq = e % g.W, r = e / g.W;
        const int64_t h = r % g.H, p = r / g.H;
        const int64_t c = p % g.C;
        const T *dyp = dy + p * g.Ho * g.Wo;
        const float *wc = w + c * KK;
        float acc = 0.0f;
        for (int u = 0; u < g.kh; u++) {
            const int64_t ti = h + g.ph - (int64_t)u * g.dh;
            if (ti < 0 || ti % g.sh) continue;
            const int64_t i = ti / g.sh;
            if (i >= g.Ho) continue;
            for (int v = 0; v < g.kw; v++) {
                const int64_t tj = wq + g.pw - (int64_t)v * g.dw;
                if (tj < 0 || tj % g.sw) continue;
                const int64_t j = tj / g.sw;
                if (j >= g.Wo) continue;
                acc = fmaf(wc[u * g.kw + v], dw_f<T>(dyp[i * g.Wo + j]), acc);
            }
        }
        if (beta != 0.0f) acc = fmaf(beta, dw_f<T>(dx[e]), acc);
        dx[e] = dw_t<T>(acc);
    }
}

/* Grid (C*kh*kw, S): block (ct, sp) folds products m in [sp*CH, (sp+1)*CH)
 * of the N*Ho*Wo products of tap ct % KK of channel ct / KK. */
template <typename T>
static __global__ void __launch_bounds__(DW_GT)
dw_generic_wgrad(const T *__restrict__ x, const T *__restrict__ dy, float *dw, float *part,
                 float beta, lucid_conv_dw_geom g, int64_t CH, int S) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float sh[32];
    const int64_t KK = (int64_t)g.kh * g.kw, ct = blockIdx.x;
    const int sp = (int)blockIdx.y;
    const int64_t c = ct / KK, tap = ct - c * KK;
    const int64_t u = tap / g.kw, v = tap - u * g.kw;
    const int64_t P = g.Ho * g.Wo, M = g.N * P;
    const int64_t m0 = (int64_t)sp * CH, m1 = m0 + CH < M ? m0 + CH : M;
    float acc = 0.0f;
    for (int64_t m = m0 + threadIdx.x; m < m1; m += blockDim.x) {
        const int64_t n = m / P, pos = m - n * P;
        const int64_t i = pos / g.Wo, j = pos - i * g.Wo;
        const int64_t hi = i * g.sh - g.ph + u * g.dh, wi = j * g.sw - g.pw + v * g.dw;
        if (hi < 0 || hi >= g.H || wi < 0 || wi >= g.W) continue;
        const int64_t pl = n * g.C + c;
        acc = fmaf(dw_f<T>(dy[pl * P + pos]), dw_f<T>(x[(pl * g.H + hi) * g.W + wi]), acc);
    }
    acc = nn_block_sum(acc, sh);
    if (threadIdx.x == 0) {
        if (S == 1) dw[ct] = beta != 0.0f ? fmaf(beta, dw[ct], acc) : acc;
        else part[ct * S + sp] = acc;
    }
}

// ----------------------------------------------------------------------------
// launchers

template <typename T>
static lucid_status dw_fd_launch(lucid_ctx *ctx, cudaStream_t st, const lucid_conv_dw_geom *g,
                                 const T *in, const float *w, const float *b, T *out,
                                 float beta, bool dgrad) {
    dw_tiling t;
    const int64_t R = g->N * g->C * g->H;
    if (dw_tile(g, R, 1, &t)) {
        const unsigned blocks = (unsigned)dw_cdiv(R, t.TH);
        const int ve = dw_ve(in, g->W, sizeof(T)), vo = dw_vec4(out, g->W, sizeof(T));
        const int C = (int)g->C, H = (int)g->H, W = (int)g->W, Ri = (int)R;
        if (!dgrad && t.K == 3)
            lucid_launch(dw_tiled_fd<T, 3, false>, blocks, DW_BT, t.smem, st, in, w, b, out,
                         0.0f, C, H, W, Ri, t.TH, t.TPR, t.SW, ve, vo);
        else if (!dgrad)
            lucid_launch(dw_tiled_fd<T, 5, false>, blocks, DW_BT, t.smem, st, in, w, b, out,
                         0.0f, C, H, W, Ri, t.TH, t.TPR, t.SW, ve, vo);
        else if (t.K == 3)
            lucid_launch(dw_tiled_fd<T, 3, true>, blocks, DW_BT, t.smem, st, in, w, nullptr,
                         out, beta, C, H, W, Ri, t.TH, t.TPR, t.SW, ve, vo);
        else
            lucid_launch(dw_tiled_fd<T, 5, true>, blocks, DW_BT, t.smem, st, in, w, nullptr,
                         out, beta, C, H, W, Ri, t.TH, t.TPR, t.SW, ve, vo);
        CUDA_CHECK_LAUNCH(ctx, "dw_tiled_fd (depthwise conv)");
        return LUCID_OK;
    }
    if (!dgrad) {
        const int64_t total = g->N * g->C * g->Ho * g->Wo;
        lucid_launch(dw_generic_fwd<T>, lucid_cuda_blocks(total, DW_GT), DW_GT, 0, st, in, w, b,
                     out, *g);
        CUDA_CHECK_LAUNCH(ctx, "dw_generic_fwd (depthwise conv forward)");
    } else {
        const int64_t total = g->N * g->C * g->H * g->W;
        lucid_launch(dw_generic_dgrad<T>, lucid_cuda_blocks(total, DW_GT), DW_GT, 0, st, in, w,
                     out, *g, beta);
        CUDA_CHECK_LAUNCH(ctx, "dw_generic_dgrad (depthwise conv backward-data)");
    }
    return LUCID_OK;
}

template <typename T>
static lucid_status dw_wgrad_launch(lucid_ctx *ctx, cudaStream_t st, const lucid_conv_dw_geom *g,
                                    const dw_wplan *pl, const T *x, const T *dy, float *dw,
                                    float *part, float beta) {
    const int S = (int)pl->S;
    if (pl->tiled) {
        const dw_tiling &t = pl->t;
        const int ve = dw_ve(x, g->W, sizeof(T)), vd = dw_vec4(dy, g->W, sizeof(T));
        const int C = (int)g->C, H = (int)g->H, W = (int)g->W, NH = (int)(g->N * g->H);
        const dim3 grid((unsigned)g->C, (unsigned)S);
        if (t.K == 3)
            lucid_launch(dw_tiled_wgrad<T, 3>, grid, DW_BT, t.smem, st, x, dy, dw, part, beta,
                         C, H, W, NH, t.TH, t.TPR, t.SW, ve, vd, (int)pl->ntiles, S);
        else
            lucid_launch(dw_tiled_wgrad<T, 5>, grid, DW_BT, t.smem, st, x, dy, dw, part, beta,
                         C, H, W, NH, t.TH, t.TPR, t.SW, ve, vd, (int)pl->ntiles, S);
        CUDA_CHECK_LAUNCH(ctx, "dw_tiled_wgrad (depthwise conv backward-filter)");
    } else {
        const dim3 grid((unsigned)(g->C * pl->KK), (unsigned)S);
        lucid_launch(dw_generic_wgrad<T>, grid, DW_GT, 0, st, x, dy, dw, part, beta, *g, pl->CH,
                     S);
        CUDA_CHECK_LAUNCH(ctx, "dw_generic_wgrad (depthwise conv backward-filter)");
    }
    if (S > 1) {
        const int64_t n = g->C * pl->KK;
        lucid_launch(dw_wgrad_fold, lucid_cuda_blocks(n, DW_GT), DW_GT, 0, st, part, dw, n, S,
                     beta);
        CUDA_CHECK_LAUNCH(ctx, "dw_wgrad_fold (depthwise conv backward-filter)");
    }
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// entry points

static lucid_status dw_validate(lucid_ctx *ctx, const char *op, lucid_dtype dt,
                                const lucid_conv_dw_geom *g) {
    if (!g) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: no geometry", op);
    LUCID_TRY(nn_check_act(ctx, op, dt));
    if (g->N < 0 || g->C < 0 || g->H < 1 || g->W < 1 || g->kh < 1 || g->kw < 1 || g->sh < 1 ||
        g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: bad geometry N=%lld C=%lld H=%lld W=%lld kernel %dx%d "
                            "stride %dx%d pad %dx%d dilation %dx%d",
                            op, (long long)g->N, (long long)g->C, (long long)g->H,
                            (long long)g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh,
                            g->dw);
    const int64_t eh = g->H + 2 * (int64_t)g->ph - (int64_t)g->dh * (g->kh - 1) - 1;
    const int64_t ew = g->W + 2 * (int64_t)g->pw - (int64_t)g->dw * (g->kw - 1) - 1;
    const int64_t ho = eh < 0 ? 0 : eh / g->sh + 1, wo = ew < 0 ? 0 : ew / g->sw + 1;
    if (ho < 1 || wo < 1 || g->Ho != ho || g->Wo != wo)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: output %lldx%lld does not follow from input %lldx%lld, "
                            "kernel %dx%d, stride %dx%d, pad %dx%d, dilation %dx%d "
                            "(expected %lldx%lld, both >= 1)",
                            op, (long long)g->Ho, (long long)g->Wo, (long long)g->H,
                            (long long)g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh,
                            g->dw, (long long)ho, (long long)wo);
    return LUCID_OK;
}

extern "C" int lucid_conv_dw_tiled(const lucid_conv_dw_geom *g) {
    dw_tiling t;
    dw_wplan p;
    if (!g || !dw_tile(g, g->N * g->C * g->H, 1, &t)) return 0;
    dw_wgrad_plan(g, &p);
    return p.tiled;
}

extern "C" size_t lucid_conv_dw_wgrad_scratch_bytes(const lucid_conv_dw_geom *g) {
    if (!g || g->C < 1) return 0;
    dw_wplan p;
    dw_wgrad_plan(g, &p);
    return p.S > 1 ? (size_t)(g->C * p.KK * p.S) * sizeof(float) : 0;
}

extern "C" lucid_status lucid_conv_dw_forward(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                              const lucid_conv_dw_geom *g, const void *x,
                                              const float *w, const float *b, void *y) {
    const char *op = "conv_dw_forward";
    LUCID_TRY(dw_validate(ctx, op, dt, g));
    if (g->N == 0 || g->C == 0) return LUCID_OK;
    if (!x || !w || !y) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: NULL x, w or y", op);
    cudaStream_t st = (cudaStream_t)stream;
    switch (dt) {
    case LUCID_F32:
        return dw_fd_launch<float>(ctx, st, g, (const float *)x, w, b, (float *)y, 0.0f, false);
    case LUCID_BF16:
        return dw_fd_launch<__nv_bfloat16>(ctx, st, g, (const __nv_bfloat16 *)x, w, b,
                                           (__nv_bfloat16 *)y, 0.0f, false);
    default:
        return dw_fd_launch<__half>(ctx, st, g, (const __half *)x, w, b, (__half *)y, 0.0f,
                                    false);
    }
}

extern "C" lucid_status lucid_conv_dw_backward_data(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                                    const lucid_conv_dw_geom *g, const void *dy,
                                                    const float *w, void *dx, double beta) {
    const char *op = "conv_dw_backward_data";
    LUCID_TRY(dw_validate(ctx, op, dt, g));
    if (g->N == 0 || g->C == 0) return LUCID_OK;
    if (!dy || !w || !dx) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: NULL dy, w or dx", op);
    cudaStream_t st = (cudaStream_t)stream;
    const float bt = (float)beta;
    switch (dt) {
    case LUCID_F32:
        return dw_fd_launch<float>(ctx, st, g, (const float *)dy, w, NULL, (float *)dx, bt, true);
    case LUCID_BF16:
        return dw_fd_launch<__nv_bfloat16>(ctx, st, g, (const __nv_bfloat16 *)dy, w, NULL,
                                           (__nv_bfloat16 *)dx, bt, true);
    default:
        return dw_fd_launch<__half>(ctx, st, g, (const __half *)dy, w, NULL, (__half *)dx, bt,
                                    true);
    }
}

extern "C" lucid_status lucid_conv_dw_backward_filter(lucid_ctx *ctx, void *stream,
                                                      lucid_dtype dt, const lucid_conv_dw_geom *g,
                                                      const void *x, const void *dy, float *dw,
                                                      double beta, void *scratch,
                                                      size_t scratch_bytes) {
    const char *op = "conv_dw_backward_filter";
    LUCID_TRY(dw_validate(ctx, op, dt, g));
    if (g->C == 0) return LUCID_OK;
    if (!dw || (g->N > 0 && (!x || !dy)))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: NULL x, dy or dw", op);
    dw_wplan pl;
    dw_wgrad_plan(g, &pl);
    const size_t need = pl.S > 1 ? (size_t)(g->C * pl.KK * pl.S) * sizeof(float) : 0;
    if (need && (!scratch || scratch_bytes < need))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: scratch of %zu bytes at %p; this geometry needs %zu "
                            "(lucid_conv_dw_wgrad_scratch_bytes)",
                            op, scratch_bytes, scratch, need);
    cudaStream_t st = (cudaStream_t)stream;
    float *part = (float *)scratch;
    const float bt = (float)beta;
    switch (dt) {
    case LUCID_F32:
        return dw_wgrad_launch<float>(ctx, st, g, &pl, (const float *)x, (const float *)dy, dw,
                                      part, bt);
    case LUCID_BF16:
        return dw_wgrad_launch<__nv_bfloat16>(ctx, st, g, &pl, (const __nv_bfloat16 *)x,
                                              (const __nv_bfloat16 *)dy, dw, part, bt);
    default:
        return dw_wgrad_launch<__half>(ctx, st, g, &pl, (const __half *)x, (const __half *)dy,
                                       dw, part, bt);
    }
}
