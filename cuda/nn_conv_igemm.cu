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
#include <stdlib.h>

namespace wm = nvcuda::wmma;

enum { IG_FWD = 0, IG_DGRAD = 1, IG_WGRAD = 2, IG_DGRAD_PH = 3 };

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
    int kchunk;         /* split-K: k range per split (multiple of BK); 0 = no split */
    int direct;         /* 1 = final epilogue; 0 = write f32 partials (split z at z*part_n) */
    int part_n;         /* fwd/dgrad split: elements of the output (N*M*plane) */
    int ct;             /* tap-major 3x3 (KT3): channel tiles per kernel tap; 0 otherwise */
};

/* Backward-data of a strided convolution, one launch per stride phase
 * (blockIdx.z = a*sw + b): the input pixels h = h0 + sh*i, w = w0 + sw*j
 * with (h+ph) % sh == a and (w+pw) % sw == b receive only the taps
 * r = a + sh*ri, q = b + sw*qi, so the GEMM of the phase has
 * K = Cout*nR*nQ instead of Cout*kh*kw with (sh*sw-1)/(sh*sw) zeros. */
struct Phase {
    int a, b, h0, w0, Hp, Wp, nR, nQ;
    int Nc, K;
};

/* host-callable too, so that a host emulation of the tile loop can check
 * the index maps on a machine without a GPU */
#define HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#define LDG16(p) __ldg((const uint4 *)(p))
#else
#define UNROLL
#define LDG16(p) (*(const uint4 *)(p))
#endif

HD Phase phase_of(const IgP &P, int z) {
    Phase f;
    f.a = z / P.sw;
    f.b = z % P.sw;
    f.h0 = ((f.a - P.ph) % P.sh + P.sh) % P.sh;
    f.w0 = ((f.b - P.pw) % P.sw + P.sw) % P.sw;
    f.Hp = f.h0 < P.H ? (P.H - f.h0 + P.sh - 1) / P.sh : 0;
    f.Wp = f.w0 < P.W ? (P.W - f.w0 + P.sw - 1) / P.sw : 0;
    f.nR = f.a < P.kh ? (P.kh - f.a + P.sh - 1) / P.sh : 0;
    f.nQ = f.b < P.kw ? (P.kw - f.b + P.sw - 1) / P.sw : 0;
    f.Nc = P.N * f.Hp * f.Wp;
    f.K = P.ct ? f.nR * f.nQ * P.ct * BK : P.Cout * f.nR * f.nQ;
    return f;
}

/* k of a phase's GEMM -> (co, ri, qi), k = (co*nR + ri)*nQ + qi; shifts
 * when nR and nQ are 1 or 2 (stride 2, kernel <= 4), divisions otherwise */
HD void phase_k(const Phase &f, int k, int &co, int &ri, int &qi) {
    if (f.nR <= 2 && f.nQ <= 2) {
        int lq = f.nQ - 1, lr = f.nR - 1; /* log2 */
        qi = k & lq;
        ri = (k >> lq) & lr;
        co = k >> (lq + lr);
    } else {
        int nn = f.nR * f.nQ, rr;
        co = k / nn;
        rr = k - co * nn;
        ri = rr / f.nQ;
        qi = rr - ri * f.nQ;
    }
}

template <typename T> HD T to_t(float v);
template <> HD __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> HD __half to_t<__half>(float v) { return __float2half_rn(v); }
template <typename T> HD float to_f(T v);
template <> HD float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> HD float to_f<__half>(__half v) { return __half2float(v); }

/* Kernel variants (KS): 1 and 3 = kh == kw == KS as compile-time constants
 * (any stride, padding, dilation); 0 = any kernel size; KV1 = 1x1, stride
 * 1, padding 0 with H*W % 8 == 0 and 16-byte aligned tensors: the operands
 * that run along pixels are staged with 16-byte loads (8 elements). */
enum { KV1 = 11, KT3 = 33 };
template <int KS> HD int kh_of(const IgP &P) { return KS == KV1 ? 1 : KS == KT3 ? 3 : KS ? KS : P.kh; }
template <int KS> HD int kw_of(const IgP &P) { return KS == KV1 ? 1 : KS == KT3 ? 3 : KS ? KS : P.kw; }

/* Tap-major 3x3 (KT3): the reduction runs over (kernel tap, channel) with the
 * tap outer, in whole tiles of BK channels (fwd, dgrad: k = (tap*ct + c/BK)*BK
 * + c%BK, channels past the last one read as 0) or, for the filter gradient,
 * the GEMM's columns run over (tap, channel) in tiles of BN channels
 * (n = (tap*ct + ci/BN)*BN + ci%BN).  Within one tile the tap is fixed, so a
 * thread's pixel offset and its bounds test are computed once per tile and
 * its elements are one stride (a channel plane) apart: a few instructions
 * per staged element instead of a division chain.  Same sums as the
 * channel-major order up to the order of the f32 accumulation. */

/* One k tile of A (BM x BK, row-major) and B into registers.  Scalar
 * staging: thread t holds A elements (m = t/BK + j*(NT/BK), k = t%BK) and
 * B elements
 *   row-major B (fwd, dgrad): (k = t/BN + j*(NT/BN), n = t%BN)
 *   col-major B (wgrad):      (n = t/BK + j*(NT/BK), k = t%BK)
 * Vector staging (KV1): 16-byte vectors v = t + i*NT, i = 0, 1, of
 *   row-major B (fwd, dgrad): k = v/(BN/8), n = (v%(BN/8))*8
 *   wgrad A: m = v/(BK/8), k = (v%(BK/8))*8; wgrad B: n = v/(BK/8), same k */
template <typename T, int MODE, int KS>
struct Stage {
    static constexpr bool VA = KS == KV1 && MODE == IG_WGRAD; /* A by vectors */
    static constexpr bool VB = KS == KV1;                      /* B by vectors */
    static constexpr bool TM = KS == KT3;                      /* tap-major 3x3 */
    /* KT3 backward-data stages A with m (= ci) along the threads: the weight
     * w[c][m][r][q] is then read 9 floats apart by neighbouring threads
     * instead of Cin*9 apart */
    static constexpr bool AT = TM && (MODE == IG_DGRAD || MODE == IG_DGRAD_PH);
    T a[VA ? 1 : PER_T], b[VB ? 1 : PER_T];
    uint4 av[VA ? 2 : 1], bv[VB ? 2 : 1];
    /* fixed per thread: the B column's pixel (fwd, dgrad; scalar B) */
    int img, p0h, p0w; /* fwd: ho*sh-ph, wo*sw-pw; dgrad: h+ph, w+pw */
    bool nvalid;

    HD void init(const IgP &P, const Phase &f, int n0, int t) {
        img = p0h = p0w = 0;
        nvalid = false;
        if (MODE == IG_WGRAD || VB) return;
        int n = n0 + t % BN;
        nvalid = n < f.Nc;
        if (!nvalid) n = 0;
        if (MODE == IG_FWD) {
            int wo = n % P.Wo, r = n / P.Wo, ho = r % P.Ho;
            img = r / P.Ho;
            p0h = ho * P.sh - P.ph;
            p0w = wo * P.sw - P.pw;
        } else if (MODE == IG_DGRAD) {
            int w = n % P.W, r = n / P.W, h = r % P.H;
            img = r / P.H;
            p0h = h + P.ph;
            p0w = w + P.pw;
        } else { /* IG_DGRAD_PH: n = (img, i, j) of the phase's pixel grid */
            int j = n % f.Wp, r = n / f.Wp, i = r % f.Hp;
            img = r / f.Hp;
            p0h = f.h0 + P.sh * i + P.ph;
            p0w = f.w0 + P.sw * j + P.pw;
        }
    }

    HD void load(const IgP &P, const Phase &f, int m0, int n0, int k0, int kend, int t) {
        const int KH = kh_of<KS>(P), KW = kw_of<KS>(P), KK = KH * KW;
        /* A */
        if (VA) {
            /* wgrad, 1x1: A(co, p) = dy[img][co][pix], 8 pixels per vector */
            const int P2 = P.Ho * P.Wo;
            UNROLL
            for (int i = 0; i < 2; i++) {
                int v = t + i * NT, m = m0 + v / (BK / 8), k = k0 + (v % (BK / 8)) * 8;
                uint4 z = make_uint4(0, 0, 0, 0);
                if (m < P.M && k < kend) {
                    int im = k / P2, pix = k - im * P2;
                    z = LDG16((const T *)P.a + ((size_t)im * P.Cout + m) * P2 + pix);
                }
                av[i] = z;
            }
        } else if (TM && MODE != IG_WGRAD) {
            load_a_tm(P, f, m0, k0, t);
        } else {
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
                    } else if (MODE == IG_DGRAD_PH) {
                        int co, ri, qi;
                        phase_k(f, k, co, ri, qi);
                        int r = f.a + P.sh * ri, q = f.b + P.sw * qi;
                        v = ((const float *)P.a)[(((size_t)co * P.Cin + m) * KH + r) * KW + q];
                    } else {
                        int P2 = P.Ho * P.Wo, im = k / P2, pix = k - im * P2;
                        v = to_f<T>(((const T *)P.a)[((size_t)im * P.Cout + m) * P2 + pix]);
                    }
                }
                a[j] = to_t<T>(v);
            }
        }
        /* B */
        if (VB) {
            const int HW = P.H * P.W; /* == Ho*Wo for 1x1 s1 p0 */
            UNROLL
            for (int i = 0; i < 2; i++) {
                int v = t + i * NT;
                uint4 z = make_uint4(0, 0, 0, 0);
                if (MODE == IG_WGRAD) {
                    /* B(p, ci) = x[img][ci][pix], 8 pixels per vector */
                    int n = n0 + v / (BK / 8), k = k0 + (v % (BK / 8)) * 8;
                    if (n < P.Nc && k < kend) {
                        int im = k / HW, pix = k - im * HW;
                        z = LDG16((const T *)P.b + ((size_t)im * P.Cin + n) * HW + pix);
                    }
                } else {
                    /* B(c, pix) = x[img][c][pix] (fwd: c = ci; dgrad: c = co,
                     * from dy), 8 pixels per vector */
                    int k = k0 + v / (BN / 8), n = n0 + (v % (BN / 8)) * 8;
                    if (n < P.Nc && k < kend) {
                        int im = n / HW, pix = n - im * HW;
                        int C = MODE == IG_FWD ? P.Cin : P.Cout;
                        z = LDG16((const T *)P.b + ((size_t)im * C + k) * HW + pix);
                    }
                }
                bv[i] = z;
            }
        } else if (TM) {
            load_b_tm(P, f, n0, k0, kend, t);
        } else if (MODE == IG_FWD) {
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
        } else if (MODE == IG_DGRAD_PH) {
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = to_t<T>(0.0f);
                if (nvalid && k < kend) {
                    int co, ri, qi;
                    phase_k(f, k, co, ri, qi);
                    /* exact: (h + ph - r) = sh*(i + (h0+ph-a)/sh - ri) */
                    int hn = p0h - (f.a + P.sh * ri), wn = p0w - (f.b + P.sw * qi);
                    if (hn >= 0 && wn >= 0) {
                        int ho = P.sh == 2 ? hn >> 1 : hn / P.sh, wo = P.sw == 2 ? wn >> 1 : wn / P.sw;
                        if (ho < P.Ho && wo < P.Wo)
                            v = ((const T *)P.b)[(((size_t)img * P.Cout + co) * P.Ho + ho) * P.Wo + wo];
                    }
                }
                b[j] = v;
            }
        } else {
            /* wgrad: k = pixel (fixed per thread in this tile), n = (ci, r, q) */
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

    /* KT3: kernel tap (r, q) and first channel c0 of the k tile at k0 */
    HD void tm_tap(const IgP &P, const Phase &f, int k0, int &r, int &q, int &c0) const {
        const int kt = k0 / BK, tap = kt / P.ct;
        c0 = (kt - tap * P.ct) * BK;
        if (MODE == IG_DGRAD_PH) {
            int ri = tap / f.nQ, qi = tap - ri * f.nQ;
            r = f.a + P.sh * ri;
            q = f.b + P.sw * qi;
        } else {
            r = tap / 3;
            q = tap - r * 3;
        }
    }

    /* KT3 A tile (fwd, dgrad): A(m, c) = w[m][c][r][q] (fwd; thread t: c =
     * c0 + t%BK, m = m0 + t/BK + j*(NT/BK)) or w[c][m][r][q] (dgrad, m = ci;
     * AT: m = m0 + t%BM, c = c0 + t/BM + j*(NT/BM)) */
    HD void load_a_tm(const IgP &P, const Phase &f, int m0, int k0, int t) {
        int r, q, c0;
        tm_tap(P, f, k0, r, q, c0);
        const float *w = (const float *)P.a;
        if (AT) {
            const int m = m0 + t % BM, c = c0 + t / BM;
            const bool mv = m < P.M;
            const size_t base = ((size_t)c * P.Cin + m) * 9 + r * 3 + q;
            const size_t step = (size_t)(NT / BM) * P.Cin * 9;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                float v = 0.0f;
                if (mv && c + j * (NT / BM) < P.Cout) v = w[base + j * step];
                a[j] = to_t<T>(v);
            }
            return;
        }
        const int c = c0 + t % BK, mA = m0 + t / BK;
        const size_t base = ((size_t)mA * P.Cin + c) * 9 + r * 3 + q;
        const size_t step = (size_t)(NT / BK) * P.Cin * 9;
        const bool cv = c < P.Cin;
        UNROLL
        for (int j = 0; j < PER_T; j++) {
            float v = 0.0f;
            if (cv && mA + j * (NT / BK) < P.M) v = w[base + j * step];
            a[j] = to_t<T>(v);
        }
    }

    /* KT3 B tile.  fwd: B(c, pix) = x[img][c][ho*sh-ph+r*dh][wo*sw-pw+q*dw];
     * dgrad (stride 1): dy[img][c][h+ph-r*dh][w+pw-q*dw]; dgrad phase:
     * dy[img][c][(h+ph-r)/sh][(w+pw-q)/sw] (exact by the phase's choice of
     * taps).  Thread t: pixel fixed (init), c = c0 + t/BN + j*(NT/BN).
     * wgrad: B(p, ci) = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw] with the
     * pixel p = k0 + t%BK and ci = ci0 + t/BK + j*(NT/BK), tap and ci0 from
     * the column tile n0. */
    HD void load_b_tm(const IgP &P, const Phase &f, int n0, int k0, int kend, int t) {
        const T zero = to_t<T>(0.0f);
        if (MODE == IG_WGRAD) {
            const int p = k0 + t % BK;
            int im = 0, hi = 0, wi = 0;
            bool ok = p < kend;
            const int tap = n0 / (P.ct * BN), ci = n0 - tap * P.ct * BN + t / BK;
            const int r = tap / 3, q = tap - r * 3;
            if (ok) {
                int wo = p % P.Wo, rr = p / P.Wo, ho = rr % P.Ho;
                im = rr / P.Ho;
                hi = ho * P.sh - P.ph + r * P.dh;
                wi = wo * P.sw - P.pw + q * P.dw;
                ok = hi >= 0 && hi < P.H && wi >= 0 && wi < P.W;
            }
            const size_t plane = (size_t)P.H * P.W;
            const T *bp = (const T *)P.b + ((size_t)im * P.Cin + ci) * plane +
                          (ok ? (size_t)hi * P.W + wi : 0);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                T v = zero;
                if (ok && ci + j * (NT / BK) < P.Cin) v = bp[(size_t)j * (NT / BK) * plane];
                b[j] = v;
            }
            return;
        }
        int r, q, c0;
        tm_tap(P, f, k0, r, q, c0);
        const int c = c0 + t / BN;
        int hh, ww, Hs, Ws, C;
        bool ok = nvalid;
        if (MODE == IG_FWD) {
            hh = p0h + r * P.dh;
            ww = p0w + q * P.dw;
            Hs = P.H;
            Ws = P.W;
            C = P.Cin;
        } else if (MODE == IG_DGRAD) { /* stride 1 */
            hh = p0h - r * P.dh;
            ww = p0w - q * P.dw;
            Hs = P.Ho;
            Ws = P.Wo;
            C = P.Cout;
        } else {
            int hn = p0h - r, wn = p0w - q;
            ok = ok && hn >= 0 && wn >= 0;
            hh = P.sh == 2 ? hn >> 1 : hn / P.sh;
            ww = P.sw == 2 ? wn >> 1 : wn / P.sw;
            Hs = P.Ho;
            Ws = P.Wo;
            C = P.Cout;
        }
        ok = ok && hh >= 0 && hh < Hs && ww >= 0 && ww < Ws;
        const size_t plane = (size_t)Hs * Ws;
        const T *bp = (const T *)P.b + ((size_t)img * C + c) * plane +
                      (ok ? (size_t)hh * Ws + ww : 0);
        UNROLL
        for (int j = 0; j < PER_T; j++) {
            T v = zero;
            if (ok && c + j * (NT / BN) < C) v = bp[(size_t)j * (NT / BN) * plane];
            b[j] = v;
        }
    }

    HD void store(T *sA, T *sB, int t) const {
        if (VA) {
            UNROLL
            for (int i = 0; i < 2; i++) {
                int v = t + i * NT;
                *(uint4 *)(sA + (v / (BK / 8)) * LDA + (v % (BK / 8)) * 8) = av[i];
            }
        } else {
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                if (AT) sA[(t % BM) * LDA + t / BM + j * (NT / BM)] = a[j];
                else sA[(t / BK + j * (NT / BK)) * LDA + t % BK] = a[j];
            }
        }
        if (VB) {
            UNROLL
            for (int i = 0; i < 2; i++) {
                int v = t + i * NT;
                if (MODE == IG_WGRAD)
                    *(uint4 *)(sB + (v / (BK / 8)) * LDBC + (v % (BK / 8)) * 8) = bv[i];
                else
                    *(uint4 *)(sB + (v / (BN / 8)) * LDBR + (v % (BN / 8)) * 8) = bv[i];
            }
        } else if (MODE == IG_WGRAD) {
            UNROLL
            for (int j = 0; j < PER_T; j++) sB[(t / BK + j * (NT / BK)) * LDBC + t % BK] = b[j];
        } else {
            UNROLL
            for (int j = 0; j < PER_T; j++) sB[(t / BN + j * (NT / BN)) * LDBR + t % BN] = b[j];
        }
    }
};

/* The k range [kbeg, kend) of grid slice z: all of the phase's K, or split
 * z's chunk under split-K.  Host-callable (emulation). */
HD void k_range(const IgP &P, const Phase &f, int MODE_, int z, int &kbeg, int &kend) {
    kbeg = 0;
    kend = f.K;
    if (MODE_ != IG_DGRAD_PH && P.kchunk > 0) {
        kbeg = z * P.kchunk;
        kend = P.K < kbeg + P.kchunk ? P.K : kbeg + P.kchunk;
    }
}

/* Thread t's share of the output tile (sC, f32 [BM][LDC]): column
 * c = t % BN (fixed, so its pixel is decomposed once), rows t/BN + i*(NT/BN).
 * wgrad: dw (direct, with beta) or split z's partial; fwd: + bias, one
 * rounding; dgrad: beta*dx + C, one rounding.  Host-callable (emulation). */
template <typename T, int MODE>
HD void epilogue(const IgP &P, const Phase &f, int m0, int n0, int z, int t, const float *sC) {
    const int c = t % BN, gn = n0 + c;
    if (MODE == IG_WGRAD) {
        /* column of dw: gn, or (KT3) channel ci of tap `tap` -> ci*9 + tap */
        int col = gn, ncr = P.Nc;
        if (P.ct) {
            int tap = gn / (P.ct * BN), ci = gn - tap * P.ct * BN;
            if (ci >= P.Cin) return;
            col = ci * 9 + tap;
            ncr = P.Cin * 9;
        } else if (gn >= P.Nc) {
            return;
        }
        float *out = (float *)P.out;
        if (!P.direct) out += (size_t)z * P.M * ncr;
        for (int r = t / BN; r < BM; r += NT / BN) {
            int gm = m0 + r;
            if (gm >= P.M) break;
            size_t o = (size_t)gm * ncr + col;
            float v = sC[r * LDC + c];
            if (P.direct && P.beta != 0.0f) v = fmaf(P.beta, out[o], v);
            out[o] = v;
        }
        return;
    }
    if (gn >= f.Nc) return;
    /* C(m, n) -> out[img][m][pixel of n]: base + m * plane */
    size_t base, plane;
    if (MODE == IG_DGRAD_PH) {
        int j = gn % f.Wp, q = gn / f.Wp, i = q % f.Hp, im = q / f.Hp;
        plane = (size_t)P.H * P.W;
        base = (size_t)im * P.Cin * plane + (size_t)(f.h0 + P.sh * i) * P.W + f.w0 + P.sw * j;
    } else {
        plane = MODE == IG_FWD ? (size_t)P.Ho * P.Wo : (size_t)P.H * P.W;
        int im = (int)(gn / plane);
        base = (size_t)im * P.M * plane + (gn - (size_t)im * plane);
    }
    if (!P.direct) { /* split-K: this split's f32 partial, in output order */
        float *part = (float *)P.out + (size_t)z * P.part_n;
        for (int r = t / BN; r < BM; r += NT / BN) {
            int gm = m0 + r;
            if (gm >= P.M) break;
            part[base + (size_t)gm * plane] = sC[r * LDC + c];
        }
        return;
    }
    T *out = (T *)P.out;
    for (int r = t / BN; r < BM; r += NT / BN) {
        int gm = m0 + r;
        if (gm >= P.M) break;
        size_t o = base + (size_t)gm * plane;
        float v = sC[r * LDC + c];
        if (MODE == IG_FWD) {
            if (P.bias) v += P.bias[gm];
        } else if (P.beta != 0.0f) {
            v = fmaf(P.beta, to_f<T>(out[o]), v);
        }
        out[o] = to_t<T>(v);
    }
}

template <typename T, int MODE, int KS>
__global__ void __launch_bounds__(NT) igemm_nchw(IgP P) {
    typedef typename std::conditional<MODE == IG_WGRAD, wm::col_major, wm::row_major>::type BLay;
    __shared__ __align__(128) T sA[BM * LDA];
    __shared__ __align__(128) T sB[SB_ELEMS];
    __shared__ __align__(128) float sC[BM * LDC];

    const int t = threadIdx.x;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    Phase f;
    if (MODE == IG_DGRAD_PH) {
        f = phase_of(P, blockIdx.z);
        if (n0 >= f.Nc) return; /* grid.x is sized for the largest phase */
    } else {
        f.a = f.b = f.h0 = f.w0 = f.Hp = f.Wp = f.nR = f.nQ = 0;
        f.Nc = P.Nc;
        f.K = P.K;
    }
    int kbeg, kend;
    k_range(P, f, MODE, blockIdx.z, kbeg, kend);
    const int warp = t >> 5, wr = (warp >> 1) * 32, wc = (warp & 1) * 32;

    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wm::fill_fragment(acc[i][j], 0.0f);

    Stage<T, MODE, KS> st;
    st.init(P, f, n0, t);
    if (kbeg < kend) st.load(P, f, m0, n0, kbeg, kend, t);
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        st.store(sA, sB, t);
        __syncthreads();
        if (k0 + BK < kend) st.load(P, f, m0, n0, k0 + BK, kend, t);
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

    epilogue<T, MODE>(P, f, m0, n0, blockIdx.z, t, sC);
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

/* The same fold for many splits (> 16): one warp per element, lane l adds
 * splits l, l+32, ... in order, then a fixed xor-shuffle tree (every lane
 * ends with the same value).  A fixed order that depends on the split count
 * only: bitwise identical run to run.  The sequential fold above is a chain
 * of `splits` dependent adds per element, and with few elements (layer 0's
 * 16x27 filter gradient in 528 splits) nothing hides its load latency. */
__global__ void igemm_reduce_splits_warp(const float *__restrict__ part, float *dw, int n,
                                         int splits, float beta) {
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int i = blockIdx.x * wpb + (threadIdx.x >> 5); i < n; i += gridDim.x * wpb) {
        float s = 0.0f;
        for (int k = lane; k < splits; k += 32) s += part[(size_t)k * n + i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* Split-K forward / backward-data: out[i] = round(sum over splits s = 0, 1,
 * ... of part[s][i] (+ bias[c] | beta*out[i])), c = (i / plane) % M: the
 * same operations, in the same order, as the unsplit epilogue after the
 * f32 sum. */
template <typename T>
__global__ void igemm_reduce_out(const float *__restrict__ part, T *out, int n, int splits,
                                 const float *__restrict__ bias, int plane, int M, float beta) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < splits; k++) v += part[(size_t)k * n + i];
        if (bias) v += bias[(i / plane) % M];
        else if (beta != 0.0f) v = fmaf(beta, to_f<T>(out[i]), v);
        out[i] = to_t<T>(v);
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
    P.part_n = 0;
    P.ct = 0;
    return P;
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Kernel variant of a pass: KV1 needs a 1x1 stride-1 unpadded conv whose
 * planes hold a multiple of 8 elements and 16-byte aligned operands that
 * are read by vectors (p1, p2; the weight is read by scalars). */
static int ks_of(const lucid_igemm_geom *g, const void *p1, const void *p2) {
    if (g->kh == 1 && g->kw == 1) {
        bool v = g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
                 ((long)g->H * g->W) % 8 == 0 && al16(p1) && (!p2 || al16(p2));
        return v ? KV1 : 1;
    }
    if (g->kh == 3 && g->kw == 3) return 3;
    return 0;
}

/* Smallest reduction channel count (fwd: Cin, dgrad: Cout) for which a 3x3
 * pass runs tap-major, and the smallest Cin for the tap-major filter
 * gradient (its column tiles hold BN = 64 channels of one tap).  Below, the
 * channel-major k3 kernels waste less of a tile.  LUCID_IGEMM_TAP_MIN_C /
 * LUCID_IGEMM_TAP_MIN_CW override them (bench/conv_lab comparisons; a huge
 * value turns the variant off); read once. */
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
static int tap_min_c(void) {
    static int v = -1;
    if (v < 0) v = env_int("LUCID_IGEMM_TAP_MIN_C", 16);
    return v;
}
static int tap_min_cw(void) {
    static int v = -1;
    if (v < 0) v = env_int("LUCID_IGEMM_TAP_MIN_CW", 48);
    return v;
}
static bool is3x3(const lucid_igemm_geom *g) { return g->kh == 3 && g->kw == 3; }

template <typename T, int MODE>
static void launch(const IgP &P, int ks, dim3 grid, cudaStream_t s) {
    switch (ks) {
    case KV1: igemm_nchw<T, MODE, KV1><<<grid, NT, 0, s>>>(P); break;
    case 1: igemm_nchw<T, MODE, 1><<<grid, NT, 0, s>>>(P); break;
    case 3: igemm_nchw<T, MODE, 3><<<grid, NT, 0, s>>>(P); break;
    case KT3: igemm_nchw<T, MODE, KT3><<<grid, NT, 0, s>>>(P); break;
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
 * SMs about four times, each split at least 2 k tiles (64 pixels) long (a
 * short grid is latency-bound: each k tile is a dependent global load), at
 * most 1024 splits. */
int lucid_conv_igemm_wgrad_splits(const lucid_igemm_geom *g) {
    int M = g->Cout, Nc = g->Cin * g->kh * g->kw, K = g->N * g->Ho * g->Wo;
    long blocks = (long)tiles(M, BM) * tiles(Nc, BN);
    long want = (528 + blocks - 1) / blocks;
    long maxs = (K + 2 * BK - 1) / (2 * BK);
    long s = want < maxs ? want : maxs;
    if (s > 1024) s = 1024;
    return s < 1 ? 1 : (int)s;
}

/* Split-K of forward / backward-data (not the stride-phase form): only a
 * grid that leaves SMs idle (< 132 blocks) is split, into up to 16 ranges
 * of at least 2 k tiles, for about 2 blocks per SM.  A function of the
 * geometry only.  M, Nc, K: the pass's GEMM. */
static int fd_splits(int M, int Nc, int K) {
    long blocks = (long)tiles(Nc, BN) * tiles(M, BM);
    if (blocks >= 132) return 1;
    long want = (264 + blocks - 1) / blocks;
    long maxs = (K + BK - 1) / BK / 2;
    long s = want < maxs ? want : maxs;
    if (s > 16) s = 16;
    return s < 1 ? 1 : (int)s;
}

static int chunk_of(int K, int splits) {
    int per = (K + splits - 1) / splits;
    return (per + BK - 1) / BK * BK;
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

/* One pass ready to launch: parameters, grid, GEMM mode and kernel variant
 * (shared by the launchers below and the host emulation test). */
struct IgLaunch {
    IgP P;
    dim3 grid;
    int mode, ks, splits;
};

/* Grid and split-K of a forward / backward-data plan (L.P's M, Nc, K set);
 * nout: output elements.  With splits > 1 the kernel writes partials to the
 * scratch (L.P.out is then set by the caller) and igemm_reduce_out finishes. */
static void split_fd(IgLaunch &L, long nout) {
    L.splits = fd_splits(L.P.M, L.P.Nc, L.P.K);
    if (L.splits > 1) {
        L.P.kchunk = chunk_of(L.P.K, L.splits);
        L.splits = (L.P.K + L.P.kchunk - 1) / L.P.kchunk;
    }
    if (L.splits > 1) {
        L.P.direct = 0;
        L.P.part_n = (int)nout;
    } else {
        L.P.kchunk = 0;
    }
    L.grid = dim3(tiles(L.P.Nc, BN), tiles(L.P.M, BM), (unsigned)L.splits);
}

static IgLaunch plan_forward(const lucid_igemm_geom *g, const void *x, const float *w,
                             const float *b, void *y) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = w;
    L.P.b = x;
    L.P.out = y;
    L.P.bias = b;
    L.P.M = g->Cout;
    L.P.Nc = g->N * g->Ho * g->Wo;
    L.P.K = g->Cin * g->kh * g->kw;
    L.mode = IG_FWD;
    L.ks = ks_of(g, x, NULL);
    if (is3x3(g) && g->Cin >= tap_min_c()) {
        L.ks = KT3;
        L.P.ct = (int)tiles(g->Cin, BK);
        L.P.K = 9 * L.P.ct * BK;
    }
    split_fd(L, (long)g->N * g->Cout * g->Ho * g->Wo);
    return L;
}

static IgLaunch plan_backward_data(const lucid_igemm_geom *g, const void *dy, const float *w,
                                   void *dx, float beta) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = w;
    L.P.b = dy;
    L.P.out = dx;
    L.P.beta = beta;
    L.P.M = g->Cin;
    L.P.Nc = g->N * g->H * g->W;
    L.P.K = g->Cout * g->kh * g->kw;
    L.splits = 1;
    if ((g->sh > 1 || g->sw > 1) && g->dh == 1 && g->dw == 1) {
        /* one z slice per stride phase; grid.x for the largest phase */
        int Hp = (g->H + g->sh - 1) / g->sh, Wp = (g->W + g->sw - 1) / g->sw;
        L.grid = dim3(tiles(g->N * Hp * Wp, BN), tiles(L.P.M, BM), (unsigned)(g->sh * g->sw));
        L.mode = IG_DGRAD_PH;
        L.ks = is3x3(g) ? 3 : 0;
        if (is3x3(g) && g->Cout >= tap_min_c()) {
            L.ks = KT3;
            L.P.ct = (int)tiles(g->Cout, BK); /* phase K: nR*nQ*ct*BK (phase_of) */
        }
    } else {
        L.mode = IG_DGRAD;
        L.ks = ks_of(g, dy, NULL);
        if (is3x3(g) && g->sh == 1 && g->sw == 1 && g->Cout >= tap_min_c()) {
            L.ks = KT3;
            L.P.ct = (int)tiles(g->Cout, BK);
            L.P.K = 9 * L.P.ct * BK;
        }
        split_fd(L, (long)g->N * g->Cin * g->H * g->W);
    }
    return L;
}

static IgLaunch plan_backward_filter(const lucid_igemm_geom *g, const void *x, const void *dy,
                                     float *dw, float beta, void *scratch) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = dy;
    L.P.b = x;
    L.P.beta = beta;
    L.P.M = g->Cout;
    L.P.Nc = g->Cin * g->kh * g->kw;
    L.P.K = g->N * g->Ho * g->Wo;
    int splits = lucid_conv_igemm_wgrad_splits(g);
    L.P.kchunk = wgrad_chunk(g, splits);
    /* the last chunks may be empty after rounding to whole tiles: trim */
    L.splits = (L.P.K + L.P.kchunk - 1) / L.P.kchunk;
    L.P.direct = L.splits == 1;
    L.P.out = L.P.direct ? (void *)dw : scratch;
    L.grid = dim3(tiles(L.P.Nc, BN), tiles(L.P.M, BM), (unsigned)L.splits);
    L.mode = IG_WGRAD;
    L.ks = ks_of(g, x, dy);
    if (is3x3(g) && g->Cin >= tap_min_cw()) {
        L.ks = KT3;
        L.P.ct = (int)tiles(g->Cin, BN);
        L.P.Nc = 9 * L.P.ct * BN; /* padded columns; dw's are Cin*9 */
        L.grid.x = tiles(L.P.Nc, BN);
    }
    return L;
}

static cudaError_t launch_plan(lucid_dtype dt, const IgLaunch &L, cudaStream_t s) {
    switch (L.mode) {
    case IG_FWD: return launch_dt<IG_FWD>(dt, L.P, L.ks, L.grid, s);
    case IG_DGRAD: return launch_dt<IG_DGRAD>(dt, L.P, L.ks, L.grid, s);
    case IG_DGRAD_PH: return launch_dt<IG_DGRAD_PH>(dt, L.P, L.ks, L.grid, s);
    default: return launch_dt<IG_WGRAD>(dt, L.P, L.ks, L.grid, s);
    }
}

/* Finishes a split forward / backward-data: the fold of the partials. */
template <typename T>
static void reduce_out(const IgLaunch &L, void *out, const float *bias, float beta,
                       cudaStream_t s) {
    int n = L.P.part_n;
    unsigned blocks = tiles(n, 256);
    if (blocks > 2048) blocks = 2048;
    int plane = L.mode == IG_FWD ? L.P.Ho * L.P.Wo : L.P.H * L.P.W;
    igemm_reduce_out<T><<<blocks, 256, 0, s>>>((const float *)L.P.out, (T *)out, n, L.splits,
                                               bias, plane, L.P.M, beta);
}

static cudaError_t launch_fd(lucid_dtype dt, IgLaunch L, void *out, const float *bias,
                             float beta, void *scratch, cudaStream_t s) {
    if (L.P.direct) return launch_plan(dt, L, s);
    if (!scratch) return cudaErrorInvalidValue;
    L.P.out = scratch;
    cudaError_t e = launch_plan(dt, L, s);
    if (e != cudaSuccess) return e;
    if (dt == LUCID_BF16) reduce_out<__nv_bfloat16>(L, out, bias, beta, s);
    else reduce_out<__half>(L, out, bias, beta, s);
    return cudaGetLastError();
}

size_t lucid_conv_igemm_scratch(const lucid_igemm_geom *g, int pass) {
    if (pass == 2) return lucid_conv_igemm_wgrad_scratch(g);
    IgLaunch L = pass == 0 ? plan_forward(g, NULL, NULL, NULL, NULL)
                           : plan_backward_data(g, NULL, NULL, NULL, 0.0f);
    return L.P.direct ? 0 : (size_t)L.splits * L.P.part_n * sizeof(float);
}

cudaError_t lucid_conv_igemm_forward(lucid_dtype dt, const void *x, const float *w,
                                     const float *b, void *y, void *scratch,
                                     const lucid_igemm_geom *g, cudaStream_t stream) {
    return launch_fd(dt, plan_forward(g, x, w, b, y), y, b, 0.0f, scratch, stream);
}

cudaError_t lucid_conv_igemm_backward_data(lucid_dtype dt, const void *dy, const float *w,
                                           void *dx, float beta, void *scratch,
                                           const lucid_igemm_geom *g, cudaStream_t stream) {
    return launch_fd(dt, plan_backward_data(g, dy, w, dx, beta), dx, NULL, beta, scratch,
                     stream);
}

cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream) {
    IgLaunch L = plan_backward_filter(g, x, dy, dw, beta, scratch);
    if (!L.P.direct && !scratch) return cudaErrorInvalidValue;
    cudaError_t e = launch_plan(dt, L, stream);
    if (e != cudaSuccess || L.P.direct) return e;
    int n = g->Cout * g->Cin * g->kh * g->kw;
    if (L.splits > 16) {
        unsigned blocks = tiles(n, 8); /* 8 warps of 256 threads, one per element */
        if (blocks > 4096) blocks = 4096;
        igemm_reduce_splits_warp<<<blocks, 256, 0, stream>>>((const float *)scratch, dw, n,
                                                             L.splits, beta);
        return cudaGetLastError();
    }
    unsigned blocks = tiles(n, 256);
    if (blocks > 1024) blocks = 1024;
    igemm_reduce_splits<<<blocks, 256, 0, stream>>>((const float *)scratch, dw, n, L.splits,
                                                    beta);
    return cudaGetLastError();
}
