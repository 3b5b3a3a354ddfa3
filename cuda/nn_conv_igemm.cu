/*
 * nn_conv_igemm.cu — implicit-GEMM Conv2d in NCHW on tensor cores (WMMA,
 * bf16/f16 operands, f32 accumulation); the bf16/f16 route of nn_conv.cu for
 * groups == 1.  Interface and guarantees: nn_conv_igemm.cuh.
 *
 * Why: cuDNN's legacy API costs 0.05-0.35 ms per call on this network's small
 * convolutions whatever their size, plus ~34 ms of heuristics per new shape
 * and pass; measured by bench/conv_lab (H200, 2026-11-29) the network's 287
 * conv calls per step took 33.2 ms through cuDNN NCHW and 9.5 ms through
 * implicit-GEMM kernels of this design (NHWC there).  Formulation as in the
 * classic im2col GEMM of Caffe/Torch7 (SpatialConvolutionMM), with the
 * im2col gather done while staging tiles instead of in a buffer.
 *
 * The three GEMMs  C[M][Nc] = sum_k A(m,k) B(k,n):
 *   forward   M = Cout, Nc = N*Ho*Wo, K = Cin*kh*kw
 *             A(co, k)   = w[co][k]                (k = ci,r,q: KCRS order)
 *             B(k, pix)  = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw]  (0 outside)
 *             C(co, pix) -> y[img][co][ho][wo] (+ b[co])
 *   backward-data  M = Cin, Nc = N*H*W, K = Cout*kh*kw
 *             A(ci, k)   = w[co][ci][r][q]          (k = co,r,q)
 *             B(k, pix)  = dy[img][co][(h+ph-r*dh)/sh][(w+pw-q*dw)/sw]
 *                          (0 unless both divisions are exact and in range)
 *             C(ci, pix) -> dx[img][ci][h][w] (beta*dx + C)
 *   backward-filter  M = Cout, Nc = Cin*kh*kw, K = N*Ho*Wo (split into
 *             `splits` fixed chunks of whole BK tiles)
 *             A(co, p)   = dy[img][co][ho][wo]     (p = img,ho,wo)
 *             B(p, k)    = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw]
 *             C(co, k)   -> dw[co][k] (beta*dw + C; with splits > 1 each
 *                          split writes its f32 partial and reduce_splits
 *                          adds them in split order)
 *
 * Numerics: operands are rounded to the activation dtype once (the f32
 * weights when staged, like the cast of cuDNN's route), products are summed
 * in f32 by the tensor cores (order fixed by the tile schedule), the output
 * is rounded once.  Not bitwise equal to cuDNN; within the CPU-vs-CUDA
 * tolerances of spec/c/test_nn_cuda.c.
 *
 * Tiles: 64x64 output tile per block of 4 warps (each 32x32 = 2x2 WMMA
 * 16x16x16 fragments), k step 32, the next k tile loaded into registers while
 * the current one is multiplied.  Each thread keeps a fixed output column
 * (pixel) of the B tile, so the pixel's decomposition is computed once per
 * block; kernel sizes 1 and 3 are compile-time constants (KS) so the k
 * decomposition divides by constants.
 */
#include "nn_conv_igemm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

namespace wm = nvcuda::wmma;

enum { IG_FWD = 0, IG_DGRAD = 1, IG_WGRAD = 2 };

#define BM 64
#define BN 64
#define BK 32
#define NT 128
#define LDA (BK + 8)  /* A row-major [BM][LDA] */
#define LDBR (BN + 8) /* B row-major [BK][LDBR] (fwd, dgrad) */
#define LDBC (BK + 8) /* B col-major [BN][LDBC] (wgrad) */
#define LDC (BN + 4)  /* C row-major [BM][LDC], f32 */
#define SB_ELEMS (BK * LDBR > BN * LDBC ? BK * LDBR : BN * LDBC)

/* elements of A and of B each thread stages per k tile */
#define PER_T (BM * BK / NT)

struct IgP {
    const void *a;      /* fwd/dgrad: f32 weight; wgrad: dy */
    const void *b;      /* fwd/wgrad: x; dgrad: dy */
    void *out;          /* y / dx (T) or dw / partials (f32) */
    const float *bias;  /* fwd only, may be NULL */
    float beta;
    int N, Cin, H, W, Cout, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
    int M, Nc, K;
    int kchunk;         /* wgrad: k (pixel) range per split, multiple of BK */
    int direct;         /* wgrad: 1 = write dw with beta, 0 = write partials */
};

/* host-callable too, so that a host emulation of the tile loop can check
 * the index maps on a machine without a GPU */
#define HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

template <typename T> HD T to_t(float v);
template <> HD __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> HD __half to_t<__half>(float v) { return __float2half_rn(v); }
template <typename T> HD float to_f(T v);
template <> HD float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> HD float to_f<__half>(__half v) { return __half2float(v); }

/* kernel extents: compile-time for KS = 1 or 3, else from the geometry */
template <int KS> HD int kh_of(const IgP &P) { return KS ? KS : P.kh; }
template <int KS> HD int kw_of(const IgP &P) { return KS ? KS : P.kw; }

/* One k tile of A (BM x BK, row-major) and B into registers.  Thread t
 * stages A elements (m = t/BK + j*(NT/BK), k = t%BK) and B elements:
 *   row-major B (fwd, dgrad): (k = t/BN + j*(NT/BN), n = t%BN)
 *   col-major B (wgrad):      (n = t/BK + j*(NT/BK), k = t%BK)           */
template <typename T, int MODE, int KS>
struct Stage {
    T a[PER_T], b[PER_T];
    /* fixed per thread: the B column's pixel (fwd, dgrad) */
    int img, p0h, p0w; /* fwd: ho*sh-ph, wo*sw-pw; dgrad: h+ph, w+pw */
    bool nvalid;

    HD void init(const IgP &P, int n0, int t) {
        if (MODE == IG_WGRAD) return;
        int n = n0 + t % BN;
        nvalid = n < P.Nc;
        if (!nvalid) n = 0;
        if (MODE == IG_FWD) {
            int wo = n % P.Wo, r = n / P.Wo, ho = r % P.Ho;
            img = r / P.Ho;
            p0h = ho * P.sh - P.ph;
            p0w = wo * P.sw - P.pw;
        } else {
            int w = n % P.W, r = n / P.W, h = r % P.H;
            img = r / P.H;
            p0h = h + P.ph;
            p0w = w + P.pw;
        }
    }

    HD void load(const IgP &P, int m0, int n0, int k0, int kend, int t) {
        const int KH = kh_of<KS>(P), KW = kw_of<KS>(P), KK = KH * KW;
        /* A */
        {
            const int k = k0 + t % BK;
            for (int j = 0; j < PER_T; j++) {
                const int m = m0 + t / BK + j * (NT / BK);
                float v = 0.0f;
                if (m < P.M && k < kend) {
                    if (MODE == IG_FWD) {
                        v = ((const float *)P.a)[(size_t)m * P.K + k];
                    } else if (MODE == IG_DGRAD) {
                        int co = k / KK, rq = k - co * KK;
                        v = ((const float *)P.a)[((size_t)co * P.Cin + m) * KK + rq];
                    } else {
                        int P2 = P.Ho * P.Wo, im = k / P2, pix = k - im * P2;
                        v = to_f<T>(((const T *)P.a)[((size_t)im * P.Cout + m) * P2 + pix]);
                    }
                }
                a[j] = to_t<T>(v);
            }
        }
        /* B */
        if (MODE == IG_FWD) {
UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = to_t<T>(0.0f);
                if (nvalid && k < kend) {
                    int ci = k / KK, rq = k - ci * KK, r = rq / KW, q = rq - r * KW;
                    int hi = p0h + r * P.dh, wi = p0w + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = ((const T *)P.b)[(((size_t)img * P.Cin + ci) * P.H + hi) * P.W + wi];
                }
                b[j] = v;
            }
        } else if (MODE == IG_DGRAD) {
UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = to_t<T>(0.0f);
                if (nvalid && k < kend) {
                    int co = k / KK, rq = k - co * KK, r = rq / KW, q = rq - r * KW;
                    int hn = p0h - r * P.dh, wn = p0w - q * P.dw;
                    if (hn >= 0 && wn >= 0) {
                        int ho = hn / P.sh, wo = wn / P.sw;
                        if (ho * P.sh == hn && wo * P.sw == wn && ho < P.Ho && wo < P.Wo)
                            v = ((const T *)P.b)[(((size_t)img * P.Cout + co) * P.Ho + ho) * P.Wo + wo];
                    }
                }
                b[j] = v;
            }
        } else {
            /* k = pixel (fixed per thread in this tile), n = (ci, r, q) */
            const int p = k0 + t % BK;
            const bool pv = p < kend;
            int im = 0, bh = 0, bw = 0;
            if (pv) {
                int wo = p % P.Wo, r = p / P.Wo, ho = r % P.Ho;
                im = r / P.Ho;
                bh = ho * P.sh - P.ph;
                bw = wo * P.sw - P.pw;
            }
UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int n = n0 + t / BK + j * (NT / BK);
                T v = to_t<T>(0.0f);
                if (pv && n < P.Nc) {
                    int ci = n / KK, rq = n - ci * KK, r = rq / KW, q = rq - r * KW;
                    int hi = bh + r * P.dh, wi = bw + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = ((const T *)P.b)[(((size_t)im * P.Cin + ci) * P.H + hi) * P.W + wi];
                }
                b[j] = v;
            }
        }
    }

    HD void store(T *sA, T *sB, int t) const {
UNROLL
        for (int j = 0; j < PER_T; j++) sA[(t / BK + j * (NT / BK)) * LDA + t % BK] = a[j];
        if (MODE == IG_WGRAD) {
UNROLL
            for (int j = 0; j < PER_T; j++) sB[(t / BK + j * (NT / BK)) * LDBC + t % BK] = b[j];
        } else {
UNROLL
            for (int j = 0; j < PER_T; j++) sB[(t / BN + j * (NT / BN)) * LDBR + t % BN] = b[j];
        }
    }
};

template <typename T, int MODE, int KS>
__global__ void __launch_bounds__(NT) igemm_nchw(IgP P) {
    typedef typename std::conditional<MODE == IG_WGRAD, wm::col_major, wm::row_major>::type BLay;
    __shared__ __align__(128) T sA[BM * LDA];
    __shared__ __align__(128) T sB[SB_ELEMS];
    __shared__ __align__(128) float sC[BM * LDC];

    const int t = threadIdx.x;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    int kbeg = 0, kend = P.K;
    if (MODE == IG_WGRAD) {
        kbeg = blockIdx.z * P.kchunk;
        kend = min(P.K, kbeg + P.kchunk);
    }
    const int warp = t >> 5, wr = (warp >> 1) * 32, wc = (warp & 1) * 32;

    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wm::fill_fragment(acc[i][j], 0.0f);

    Stage<T, MODE, KS> st;
    st.init(P, n0, t);
    if (kbeg < kend) st.load(P, m0, n0, kbeg, kend, t);
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        st.store(sA, sB, t);
        __syncthreads();
        if (k0 + BK < kend) st.load(P, m0, n0, k0 + BK, kend, t);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa[2];
            wm::fragment<wm::matrix_b, 16, 16, 16, T, BLay> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wm::load_matrix_sync(fa[i], sA + (wr + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (MODE == IG_WGRAD)
                    wm::load_matrix_sync(fb[j], sB + (wc + j * 16) * LDBC + kk, LDBC);
                else
                    wm::load_matrix_sync(fb[j], sB + kk * LDBR + wc + j * 16, LDBR);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wm::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wm::store_matrix_sync(sC + (wr + i * 16) * LDC + wc + j * 16, acc[i][j], LDC,
                                  wm::mem_row_major);
    __syncthreads();

    if (MODE == IG_WGRAD) {
        float *out = (float *)P.out;
        if (!P.direct) out += (size_t)blockIdx.z * P.M * P.Nc;
        for (int e = t; e < BM * BN; e += NT) {
            int r = e / BN, c = e % BN, gm = m0 + r, gn = n0 + c;
            if (gm >= P.M || gn >= P.Nc) continue;
            size_t o = (size_t)gm * P.Nc + gn;
            float v = sC[r * LDC + c];
            if (P.direct && P.beta != 0.0f) v = fmaf(P.beta, out[o], v);
            out[o] = v;
        }
    } else {
        /* C(m, pix) -> out[img][m][pix] */
        const int PS = MODE == IG_FWD ? P.Ho * P.Wo : P.H * P.W;
        T *out = (T *)P.out;
        for (int e = t; e < BM * BN; e += NT) {
            int r = e / BN, c = e % BN, gm = m0 + r, gn = n0 + c;
            if (gm >= P.M || gn >= P.Nc) continue;
            int im = gn / PS, pix = gn - im * PS;
            size_t o = ((size_t)im * P.M + gm) * PS + pix;
            float v = sC[r * LDC + c];
            if (MODE == IG_FWD) {
                if (P.bias) v += P.bias[gm];
            } else if (P.beta != 0.0f) {
                v = fmaf(P.beta, to_f<T>(out[o]), v);
            }
            out[o] = to_t<T>(v);
        }
    }
}

/* dw[i] = beta*dw[i] + sum over splits s = 0, 1, ... of part[s][i] */
__global__ void igemm_reduce_splits(const float *__restrict__ part, float *dw, int n, int splits,
                                    float beta) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < splits; k++) s += part[(size_t)k * n + i];
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

// ---------------------------------------------------------------------------
// host side

static IgP params_of(const lucid_igemm_geom *g) {
    IgP P;
    P.a = P.b = NULL;
    P.out = NULL;
    P.bias = NULL;
    P.beta = 0.0f;
    P.N = g->N; P.Cin = g->Cin; P.H = g->H; P.W = g->W; P.Cout = g->Cout;
    P.Ho = g->Ho; P.Wo = g->Wo; P.kh = g->kh; P.kw = g->kw;
    P.sh = g->sh; P.sw = g->sw; P.ph = g->ph; P.pw = g->pw; P.dh = g->dh; P.dw = g->dw;
    P.M = P.Nc = P.K = 0;
    P.kchunk = 0;
    P.direct = 1;
    return P;
}

static int ks_of(const lucid_igemm_geom *g) {
    if (g->kh == 1 && g->kw == 1) return 1;
    if (g->kh == 3 && g->kw == 3) return 3;
    return 0;
}

template <typename T, int MODE>
static void launch(const IgP &P, int ks, dim3 grid, cudaStream_t s) {
    switch (ks) {
    case 1: igemm_nchw<T, MODE, 1><<<grid, NT, 0, s>>>(P); break;
    case 3: igemm_nchw<T, MODE, 3><<<grid, NT, 0, s>>>(P); break;
    default: igemm_nchw<T, MODE, 0><<<grid, NT, 0, s>>>(P); break;
    }
}

template <int MODE>
static cudaError_t launch_dt(lucid_dtype dt, const IgP &P, int ks, dim3 grid, cudaStream_t s) {
    if (dt == LUCID_BF16) launch<__nv_bfloat16, MODE>(P, ks, grid, s);
    else if (dt == LUCID_F16) launch<__half, MODE>(P, ks, grid, s);
    else return cudaErrorInvalidValue;
    return cudaGetLastError();
}

static unsigned tiles(int n, int t) { return (unsigned)((n + t - 1) / t); }

int lucid_conv_igemm_fits(const lucid_igemm_geom *g) {
    const int64_t lim = INT32_MAX;
    int64_t kk = (int64_t)g->kh * g->kw;
    int64_t nx = (int64_t)g->N * g->Cin * g->H * g->W;
    int64_t ny = (int64_t)g->N * g->Cout * g->Ho * g->Wo;
    int64_t nw = (int64_t)g->Cout * g->Cin * kk;
    return g->N > 0 && g->Cin > 0 && g->Cout > 0 && g->Ho > 0 && g->Wo > 0 && kk > 0 &&
           g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 && nx < lim && ny < lim &&
           nw < lim;
}

/* Splits of the backward-filter GEMM: enough blocks to cover the H200's 132
 * SMs about twice, each split at least 8 k tiles (256 pixels) long. */
int lucid_conv_igemm_wgrad_splits(const lucid_igemm_geom *g) {
    int M = g->Cout, Nc = g->Cin * g->kh * g->kw, K = g->N * g->Ho * g->Wo;
    long blocks = (long)tiles(M, BM) * tiles(Nc, BN);
    long want = (264 + blocks - 1) / blocks;
    long maxs = (K + 8 * BK - 1) / (8 * BK);
    long s = want < maxs ? want : maxs;
    if (s > 64) s = 64;
    return s < 1 ? 1 : (int)s;
}

static int wgrad_chunk(const lucid_igemm_geom *g, int splits) {
    int K = g->N * g->Ho * g->Wo;
    int per = (K + splits - 1) / splits;
    return (per + BK - 1) / BK * BK;
}

size_t lucid_conv_igemm_wgrad_scratch(const lucid_igemm_geom *g) {
    int s = lucid_conv_igemm_wgrad_splits(g);
    if (s <= 1) return 0;
    return (size_t)s * g->Cout * g->Cin * g->kh * g->kw * sizeof(float);
}

cudaError_t lucid_conv_igemm_forward(lucid_dtype dt, const void *x, const float *w,
                                     const float *b, void *y, const lucid_igemm_geom *g,
                                     cudaStream_t stream) {
    IgP P = params_of(g);
    P.a = w;
    P.b = x;
    P.out = y;
    P.bias = b;
    P.M = g->Cout;
    P.Nc = g->N * g->Ho * g->Wo;
    P.K = g->Cin * g->kh * g->kw;
    dim3 grid(tiles(P.Nc, BN), tiles(P.M, BM), 1);
    return launch_dt<IG_FWD>(dt, P, ks_of(g), grid, stream);
}

cudaError_t lucid_conv_igemm_backward_data(lucid_dtype dt, const void *dy, const float *w,
                                           void *dx, float beta, const lucid_igemm_geom *g,
                                           cudaStream_t stream) {
    IgP P = params_of(g);
    P.a = w;
    P.b = dy;
    P.out = dx;
    P.beta = beta;
    P.M = g->Cin;
    P.Nc = g->N * g->H * g->W;
    P.K = g->Cout * g->kh * g->kw;
    dim3 grid(tiles(P.Nc, BN), tiles(P.M, BM), 1);
    return launch_dt<IG_DGRAD>(dt, P, ks_of(g), grid, stream);
}

cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream) {
    IgP P = params_of(g);
    P.a = dy;
    P.b = x;
    P.beta = beta;
    P.M = g->Cout;
    P.Nc = g->Cin * g->kh * g->kw;
    P.K = g->N * g->Ho * g->Wo;
    int splits = lucid_conv_igemm_wgrad_splits(g);
    P.kchunk = wgrad_chunk(g, splits);
    /* the last chunks may be empty after rounding to whole tiles: trim */
    splits = (P.K + P.kchunk - 1) / P.kchunk;
    P.direct = splits == 1;
    if (!P.direct && !scratch) return cudaErrorInvalidValue;
    P.out = P.direct ? (void *)dw : scratch;
    dim3 grid(tiles(P.Nc, BN), tiles(P.M, BM), (unsigned)splits);
    cudaError_t e = launch_dt<IG_WGRAD>(dt, P, ks_of(g), grid, stream);
    if (e != cudaSuccess || P.direct) return e;
    int n = P.M * P.Nc;
    unsigned blocks = tiles(n, 256);
    if (blocks > 1024) blocks = 1024;
    igemm_reduce_splits<<<blocks, 256, 0, stream>>>((const float *)scratch, dw, n, splits, beta);
    return cudaGetLastError();
}
