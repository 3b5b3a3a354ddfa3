/*
 * nn_conv_igemm_tile.cuh — the tile of lucid's implicit-GEMM conv kernels
 * (nn_conv_igemm.cu): launch parameters (IgP), stride phases, the Stage
 * loaders that gather one k tile of A and B into registers and store it to
 * shared memory, the k range of a split and the epilogue.  Host-callable
 * (HD), so that spec/c/test_conv_igemm_maps.cu runs the kernels' own index
 * maps on the CPU.  The GEMM formulations and the numerics: the comment at
 * the top of nn_conv_igemm.cu.
 */
#ifndef LUCID_CUDA_NN_CONV_IGEMM_TILE_CUH
#define LUCID_CUDA_NN_CONV_IGEMM_TILE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>
#include <type_traits>

/* GEMM modes; IG_DGRAD_PH2: the stride phases on igemm_dgrad_ph
 * (nn_conv_igemm_ph.cuh), a plan's mode only (igemm_nchw has no such MODE) */
enum { IG_FWD = 0, IG_DGRAD = 1, IG_WGRAD = 2, IG_DGRAD_PH = 3, IG_DGRAD_PH2 = 4 };

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
    int lc;             /* KT3: log2 of the channels per slot (fwd/dgrad 2..5 of a k tile,
                           wgrad 2..6 of a column tile); stride phases: 5 */
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

/* v, opaque to the optimiser (no instruction): a value fixed for the whole
 * k loop that is passed through fresh() at each k tile is not hoisted out of
 * the loop with everything derived from it.  The kernels are occupancy-bound
 * by registers: recomputing a few adds per staged element is cheaper than
 * keeping PER_T loop-invariant offsets or taps in registers. */
template <typename I> HD I fresh(I v) { /* I: a 32-bit integer */
#ifdef __CUDA_ARCH__
    asm volatile("" : "+r"(v));
#endif
    return v;
}

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

/* Minimum resident blocks per SM that igemm_nchw<T, MODE, KS> asks of the
 * register allocator (its __launch_bounds__; 0: none).  Left free, ptxas
 * spends the registers the loaders no longer need on preloading more WMMA
 * fragments (nvcc 13.0: the filter gradient's 3x3 tap-major kernel 96 -> 128
 * registers, 5 -> 4 blocks of 128 threads); these bounds keep each variant
 * at its former blocks per SM, without spilling: 96 registers for the filter
 * gradient's tap-major and 1x1 vector variants, 128 for the scalar 1x1
 * backward-data one.  LUCID_IGEMM_MINB (nn_conv_igemm.cu) overrides it. */
constexpr int ig_min_blocks(int mode, int ks) {
    return mode == IG_WGRAD && (ks == KT3 || ks == KV1) ? 5 : mode == IG_DGRAD && ks == 1 ? 4 : 0;
}

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
 *   wgrad A: m = v/(BK/8), k = (v%(BK/8))*8; wgrad B: n = v/(BK/8), same k
 *
 * init() is given the block's first k tile kbeg, and load() is then called
 * for k0 = kbeg, kbeg + BK, ... in that order: what moves by a fixed amount
 * from one k tile to the next is carried in the Stage (advanced by adds and
 * compares at the end of load) instead of being derived from k0 with
 * divisions: the filter gradient's pixel p = (image, row, column) and the
 * KT3 tile's tap and channel offset.
 *
 * Element offsets are 32-bit (unsigned): lucid_conv_igemm_fits keeps every
 * operand under INT32_MAX elements; the offsets of masked-off elements are
 * formed but never read (unsigned, so their wrap-around is defined). */
template <typename T, int MODE, int KS>
struct Stage {
    static constexpr bool VA = KS == KV1 && MODE == IG_WGRAD; /* A by vectors */
    static constexpr bool VB = KS == KV1;                      /* B by vectors */
    static constexpr bool TM = KS == KT3;                      /* tap-major 3x3 */
    /* KT3 backward-data stages A with m (= ci) along the threads: the weight
     * w[c][m][r][q] is then read 9 floats apart by neighbouring threads
     * instead of Cin*9 apart */
    static constexpr bool AT = TM && (MODE == IG_DGRAD || MODE == IG_DGRAD_PH);
    /* A as loaded: fwd and dgrad stage the f32 weight and round it to T in
     * store(), after the k tile's MMA: rounded in load(), the conversion
     * would wait for the load there and hold the B loads and the MMA behind
     * the weight's global latency */
    typedef typename std::conditional<MODE == IG_WGRAD, T, float>::type TA;
    TA a[VA ? 1 : PER_T];
    T b[VB ? 1 : PER_T];
    uint4 av[VA ? 2 : 1], bv[VB ? 2 : 1];
    /* fwd, dgrad: the B column's pixel, fixed per thread.  Scalar B: image
     * img and p0h, p0w = ho*sh-ph, wo*sw-pw (fwd) or h+ph, w+pw (dgrad); VB:
     * the offset of the pixel's first channel, img*C*H*W + h*W + w, in p0h */
    int img, p0h, p0w;
    bool nvalid;
    /* KT3: fwd, dgrad: the k tile's first tap and first channel (tm_tile,
     * then tm_next); wgrad: those of the block's column tile (fixed).  tr,
     * tq: with one tap per tile (lc == 5 fwd/dgrad, lc == 6 wgrad), the
     * tap's row and column in the 3x3 grid (dgrad phases: in the phase's
     * nR x nQ grid) */
    int tap0, c0, tr, tq;
    /* wgrad: the thread's pixel in the current k tile, p = k0 + t%BK
     * (scalar) as image pim, row pho, column pwo; KV1: p = k0 + (t%(BK/8))*8
     * as image pim and offset pho in the plane.  Advanced by wg_next: BK =
     * sI planes + sH rows + sW columns (KV1: sI planes + sH) */
    int pim, pho, pwo, sI, sH, sW;

    HD void init(const IgP &P, const Phase &f, int n0, int kbeg, int t) {
        img = p0h = p0w = 0;
        nvalid = false;
        tap0 = c0 = tr = tq = 0;
        pim = pho = pwo = sI = sH = sW = 0;
        if (MODE == IG_WGRAD) {
            const int P2 = P.Ho * P.Wo;
            sI = BK / P2;
            if (VA) {
                sH = BK - sI * P2;
                const int p = kbeg + (t % (BK / 8)) * 8;
                pim = p / P2;
                pho = p - pim * P2;
            } else {
                const int rP = BK - sI * P2;
                sH = rP / P.Wo;
                sW = rP - sH * P.Wo;
                const int p = kbeg + t % BK, rr = p / P.Wo;
                pwo = p - rr * P.Wo;
                pim = rr / P.Ho;
                pho = rr - pim * P.Ho;
            }
            if (TM) {
                /* column tile n0/BN: tap group tg (taps tap0 .. tap0 + BN/cpt - 1)
                 * and channel slot (channels c0 .. c0 + cpt - 1), cpt = 2^lc */
                const int bx = n0 / BN, tg = bx / P.ct;
                tap0 = tg * (BN >> P.lc);
                c0 = (bx - tg * P.ct) << P.lc;
                tr = tap0 / 3;
                tq = tap0 - tr * 3;
            }
            return;
        }
        if (TM) {
            tm_tile(P, kbeg, tap0, c0);
            const int nq = MODE == IG_DGRAD_PH ? f.nQ : 3;
            if (nq > 0) { /* (nQ == 0: the phase has no taps, K == 0) */
                tr = tap0 / nq;
                tq = tap0 - tr * nq;
            }
        }
        if (VB) {
            /* B(c, pix) = x[img][c][pix]: the thread's 8 pixels n .. n+7 */
            const int n = n0 + (t % (BN / 8)) * 8, HW = P.H * P.W;
            const int C = MODE == IG_FWD ? P.Cin : P.Cout;
            nvalid = n < P.Nc;
            img = n / HW;
            p0h = (int)((unsigned)img * C * HW + (n - img * HW));
            return;
        }
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

    /* wgrad: the pixel of the next k tile, p + BK (each carry at most once:
     * pwo + sW < 2*Wo, pho + sH + 1 < 2*Ho) */
    HD void wg_next(const IgP &P) {
        pim += sI;
        if (VA) {
            pho += sH;
            if (pho >= P.Ho * P.Wo) {
                pho -= P.Ho * P.Wo;
                ++pim;
            }
            return;
        }
        pwo += sW;
        pho += sH;
        if (pwo >= P.Wo) {
            pwo -= P.Wo;
            ++pho;
        }
        if (pho >= P.Ho) {
            pho -= P.Ho;
            ++pim;
        }
    }

    /* KT3 fwd, dgrad: the next k tile's first channel and tap (tm_tile of
     * k0 + BK); tr, tq follow the tap when a tile holds one tap (lc == 5) */
    HD void tm_next(const IgP &P, const Phase &f) {
        c0 += 1 << P.lc;
        if (c0 == P.ct << P.lc) {
            c0 = 0;
            tap0 += BK >> P.lc;
            if (++tq == (MODE == IG_DGRAD_PH ? f.nQ : 3)) {
                tq = 0;
                ++tr;
            }
        }
    }

    HD void load(const IgP &P, const Phase &f, int m0, int n0, int k0, int kend, int t) {
        const int KH = kh_of<KS>(P), KW = kw_of<KS>(P), KK = KH * KW;
        const T zero = to_t<T>(0.0f);
        /* A */
        if (VA) {
            /* wgrad, 1x1: A(co, p) = dy[pim][co][pho..], 8 pixels per vector */
            const int P2 = P.Ho * P.Wo;
            const bool kv = k0 + (t % (BK / 8)) * 8 < kend;
            const unsigned off = (unsigned)pim * P.Cout * P2 + pho;
            UNROLL
            for (int i = 0; i < 2; i++) {
                const int m = m0 + (t + i * NT) / (BK / 8);
                uint4 z = make_uint4(0, 0, 0, 0);
                if (m < P.M && kv) z = LDG16((const T *)P.a + off + (unsigned)m * P2);
                av[i] = z;
            }
        } else if (TM && MODE != IG_WGRAD) {
            load_a_tm(P, f, m0, t);
        } else if (MODE == IG_WGRAD) {
            /* A(co, p) = dy[pim][co][pho][pwo]: rows co = mA + j*(NT/BK) */
            const int P2 = P.Ho * P.Wo, mA = m0 + t / BK;
            const bool pv = k0 + t % BK < kend;
            const unsigned off = ((unsigned)pim * P.Cout + mA) * P2 + pho * P.Wo + pwo;
            const unsigned step = fresh((NT / BK) * P2);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                T v = zero;
                if (pv && mA + j * (NT / BK) < P.M) v = ((const T *)P.a)[off + j * step];
                a[j] = v;
            }
        } else {
            /* fwd, dgrad: the f32 weight, rows m = mA + j*(NT/BK), column k
             * (fixed in the tile) */
            const float *w = (const float *)P.a;
            const int k = k0 + t % BK, mA = m0 + t / BK;
            const bool kv = k < kend;
            unsigned off, step;
            if (MODE == IG_FWD) {
                off = (unsigned)mA * P.K + k;
                step = (NT / BK) * P.K;
            } else if (MODE == IG_DGRAD) {
                const int co = k / KK, rq = k - co * KK;
                off = ((unsigned)co * P.Cin + mA) * KK + rq;
                step = (NT / BK) * KK;
            } else {
                int co, ri, qi;
                phase_k(f, k, co, ri, qi);
                const int r = f.a + P.sh * ri, q = f.b + P.sw * qi;
                off = (((unsigned)co * P.Cin + mA) * KH + r) * KW + q;
                step = (NT / BK) * KK;
            }
            step = fresh(step);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                float v = 0.0f;
                if (kv && mA + j * (NT / BK) < P.M) v = w[off + j * step];
                a[j] = v;
            }
        }
        /* B */
        if (VB) {
            UNROLL
            for (int i = 0; i < 2; i++) {
                const int v = t + i * NT;
                uint4 z = make_uint4(0, 0, 0, 0);
                if (MODE == IG_WGRAD) {
                    /* B(p, ci) = x[pim][ci][pho..], 8 pixels per vector (the
                     * pixels of A's vectors: H*W == Ho*Wo) */
                    const int HW = P.H * P.W, n = n0 + v / (BK / 8);
                    if (n < P.Nc && k0 + (t % (BK / 8)) * 8 < kend)
                        z = LDG16((const T *)P.b + (unsigned)pim * P.Cin * HW + pho +
                                  (unsigned)n * HW);
                } else {
                    /* B(c, pix) = x[img][c][pix] (fwd: c = ci; dgrad: c = co,
                     * from dy), 8 pixels per vector */
                    const int k = k0 + v / (BN / 8);
                    if (nvalid && k < kend)
                        z = LDG16((const T *)P.b + (unsigned)p0h + (unsigned)k * (P.H * P.W));
                }
                bv[i] = z;
            }
        } else if (TM) {
            load_b_tm(P, f, k0, kend, t);
        } else if (MODE == IG_FWD) {
            const T *x = (const T *)P.b;
            const unsigned xb = (unsigned)img * P.Cin;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = zero;
                if (nvalid && k < kend) {
                    int ci = k / KK, rq = k - ci * KK, r = rq / KW, q = rq - r * KW;
                    int hi = p0h + r * P.dh, wi = p0w + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = x[((xb + ci) * P.H + hi) * P.W + wi];
                }
                b[j] = v;
            }
        } else if (MODE == IG_DGRAD) {
            const T *dy = (const T *)P.b;
            const unsigned yb = (unsigned)img * P.Cout;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = zero;
                if (nvalid && k < kend) {
                    int co = k / KK, rq = k - co * KK, r = rq / KW, q = rq - r * KW;
                    int hn = p0h - r * P.dh, wn = p0w - q * P.dw;
                    if (hn >= 0 && wn >= 0) {
                        int ho = hn / P.sh, wo = wn / P.sw;
                        if (ho * P.sh == hn && wo * P.sw == wn && ho < P.Ho && wo < P.Wo)
                            v = dy[((yb + co) * P.Ho + ho) * P.Wo + wo];
                    }
                }
                b[j] = v;
            }
        } else if (MODE == IG_DGRAD_PH) {
            const T *dy = (const T *)P.b;
            const unsigned yb = (unsigned)img * P.Cout;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int k = k0 + t / BN + j * (NT / BN);
                T v = zero;
                if (nvalid && k < kend) {
                    int co, ri, qi;
                    phase_k(f, k, co, ri, qi);
                    /* exact: (h + ph - r) = sh*(i + (h0+ph-a)/sh - ri) */
                    int hn = p0h - (f.a + P.sh * ri), wn = p0w - (f.b + P.sw * qi);
                    if (hn >= 0 && wn >= 0) {
                        int ho = P.sh == 2 ? hn >> 1 : hn / P.sh, wo = P.sw == 2 ? wn >> 1 : wn / P.sw;
                        if (ho < P.Ho && wo < P.Wo)
                            v = dy[((yb + co) * P.Ho + ho) * P.Wo + wo];
                    }
                }
                b[j] = v;
            }
        } else {
            /* wgrad: k = the pixel (pim, pho, pwo), n = (ci, r, q) */
            const T *x = (const T *)P.b;
            const bool pv = k0 + t % BK < kend;
            const int bh = pho * P.sh - P.ph, bw = pwo * P.sw - P.pw;
            const unsigned xb = (unsigned)pim * P.Cin;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int n = n0 + t / BK + j * (NT / BK);
                T v = zero;
                if (pv && n < P.Nc) {
                    int ci = n / KK, rq = n - ci * KK, r = rq / KW, q = rq - r * KW;
                    int hi = bh + r * P.dh, wi = bw + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = x[((xb + ci) * P.H + hi) * P.W + wi];
                }
                b[j] = v;
            }
        }
        if (MODE == IG_WGRAD) wg_next(P);
        else if (TM) tm_next(P, f);
    }

    /* KT3 fwd, dgrad: the first tap and channel of the k tile at k0; the
     * tile holds taps tap0 .. tap0 + BK/cpt - 1 (cpt = 2^lc channels each,
     * channels c0 ..) */
    HD void tm_tile(const IgP &P, int k0, int &tp0, int &ch0) const {
        const int kt = k0 / BK, tg = kt / P.ct;
        tp0 = tg * (BK >> P.lc);
        ch0 = (kt - tg * P.ct) << P.lc;
    }

    /* KT3 with one tap per tile: its kernel tap (r, q) */
    HD void tm_rq(const IgP &P, const Phase &f, int &r, int &q) const {
        if (MODE == IG_DGRAD_PH) {
            r = f.a + P.sh * tr;
            q = f.b + P.sw * tq;
        } else {
            r = tr;
            q = tq;
        }
    }

    /* KT3 with few channels (lc < 5, fwd and stride-1 dgrad): slot s of the
     * k tile -> tap and channel; false past the last tap or channel */
    HD bool tm_slot(const IgP &P, int s, int C, int &tap, int &c) const {
        tap = tap0 + (s >> P.lc);
        c = c0 + (s & ((1 << P.lc) - 1));
        return tap < 9 && c < C;
    }

    /* KT3 A tile (fwd, dgrad): A(m, c) = w[m][c][r][q] (fwd; thread t: c =
     * c0 + t%BK, m = m0 + t/BK + j*(NT/BK)) or w[c][m][r][q] (dgrad, m = ci;
     * AT: m = m0 + t%BM, c = c0 + t/BM + j*(NT/BM)) */
    HD void load_a_tm(const IgP &P, const Phase &f, int m0, int t) {
        const float *w = (const float *)P.a;
        if (MODE != IG_DGRAD_PH && P.lc < 5) { /* several taps per k tile */
            int tap, c;
            if (AT) {
                const int m = m0 + t % BM;
                UNROLL
                for (int j = 0; j < PER_T; j++) {
                    float v = 0.0f;
                    if (tm_slot(P, t / BM + j * (NT / BM), P.Cout, tap, c) && m < P.M)
                        v = w[((unsigned)c * P.Cin + m) * 9 + tap];
                    a[j] = v;
                }
            } else {
                const int mA = m0 + t / BK;
                const bool sv = tm_slot(P, t % BK, P.Cin, tap, c);
                const unsigned base = ((unsigned)mA * P.Cin + c) * 9 + tap;
                const unsigned step = fresh((NT / BK) * P.Cin * 9);
                UNROLL
                for (int j = 0; j < PER_T; j++) {
                    float v = 0.0f;
                    if (sv && mA + j * (NT / BK) < P.M) v = w[base + j * step];
                    a[j] = v;
                }
            }
            return;
        }
        int r, q;
        tm_rq(P, f, r, q);
        if (AT) {
            const int m = m0 + t % BM, c = c0 + t / BM;
            const bool mv = m < P.M;
            const unsigned base = ((unsigned)c * P.Cin + m) * 9 + r * 3 + q;
            const unsigned step = fresh((NT / BM) * P.Cin * 9);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                float v = 0.0f;
                if (mv && c + j * (NT / BM) < P.Cout) v = w[base + j * step];
                a[j] = v;
            }
            return;
        }
        const int c = c0 + t % BK, mA = m0 + t / BK;
        const unsigned base = ((unsigned)mA * P.Cin + c) * 9 + r * 3 + q;
        const unsigned step = fresh((NT / BK) * P.Cin * 9);
        const bool cv = c < P.Cin;
        UNROLL
        for (int j = 0; j < PER_T; j++) {
            float v = 0.0f;
            if (cv && mA + j * (NT / BK) < P.M) v = w[base + j * step];
            a[j] = v;
        }
    }

    /* KT3 B tile.  fwd: B(c, pix) = x[img][c][ho*sh-ph+r*dh][wo*sw-pw+q*dw];
     * dgrad (stride 1): dy[img][c][h+ph-r*dh][w+pw-q*dw]; dgrad phase:
     * dy[img][c][(h+ph-r)/sh][(w+pw-q)/sw] (exact by the phase's choice of
     * taps).  Thread t: pixel fixed (init), c = c0 + t/BN + j*(NT/BN).
     * wgrad: B(p, ci) = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw] with the
     * pixel p = k0 + t%BK (pim, pho, pwo) and ci = c0 + t/BK + j*(NT/BK),
     * tap0 and c0 those of the column tile n0 (init). */
    HD void load_b_tm(const IgP &P, const Phase &f, int k0, int kend, int t) {
        const T zero = to_t<T>(0.0f);
        if (MODE == IG_WGRAD) {
            const T *x = (const T *)P.b;
            const bool pv = k0 + t % BK < kend;
            const int bh = pho * P.sh - P.ph, bw = pwo * P.sw - P.pw;
            const unsigned plane = (unsigned)P.H * P.W;
            if (P.lc == 6) { /* one tap per tile: one bounds test */
                const int ci = c0 + t / BK;
                const int hi = bh + tr * P.dh, wi = bw + tq * P.dw;
                const bool ok = pv && hi >= 0 && hi < P.H && wi >= 0 && wi < P.W;
                const unsigned off = ((unsigned)pim * P.Cin + ci) * plane + hi * P.W + wi;
                const unsigned step = fresh((NT / BK) * plane);
                UNROLL
                for (int j = 0; j < PER_T; j++) {
                    T v = zero;
                    if (ok && ci + j * (NT / BK) < P.Cin) v = x[off + j * step];
                    b[j] = v;
                }
                return;
            }
            /* few channels (Cin <= 32): several taps per tile, one per slot */
            const unsigned xb = (unsigned)pim * P.Cin;
            const int cm = (1 << P.lc) - 1, tp0 = fresh(tap0), ch0 = fresh(c0);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int nl = t / BK + j * (NT / BK), tap = tp0 + (nl >> P.lc), ci = ch0 + (nl & cm);
                T v = zero;
                if (pv && tap < 9 && ci < P.Cin) {
                    const int r = tap / 3, q = tap - r * 3;
                    const int hi = bh + r * P.dh, wi = bw + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = x[(xb + ci) * plane + hi * P.W + wi];
                }
                b[j] = v;
            }
            return;
        }
        if (MODE != IG_DGRAD_PH && P.lc < 5) { /* several taps per k tile */
            const bool fw = MODE == IG_FWD;
            const int C = fw ? P.Cin : P.Cout, Hs = fw ? P.H : P.Ho, Ws = fw ? P.W : P.Wo;
            const int sg = fw ? 1 : -1; /* fwd: p0 + r*d; dgrad (stride 1): p0 - r*d */
            const T *src = (const T *)P.b;
            const unsigned sb = (unsigned)img * C;
            int tap, c;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                T v = zero;
                if (nvalid && tm_slot(P, t / BN + j * (NT / BN), C, tap, c)) {
                    const int r = tap / 3, q = tap - r * 3;
                    const int hh = p0h + sg * r * P.dh, ww = p0w + sg * q * P.dw;
                    if (hh >= 0 && hh < Hs && ww >= 0 && ww < Ws)
                        v = src[((sb + c) * Hs + hh) * Ws + ww];
                }
                b[j] = v;
            }
            return;
        }
        int r, q;
        tm_rq(P, f, r, q);
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
        const unsigned plane = (unsigned)Hs * Ws;
        const unsigned off = ((unsigned)img * C + c) * plane + hh * Ws + ww;
        const unsigned step = fresh((NT / BN) * plane);
        const T *src = (const T *)P.b;
        UNROLL
        for (int j = 0; j < PER_T; j++) {
            T v = zero;
            if (ok && c + j * (NT / BN) < C) v = src[off + j * step];
            b[j] = v;
        }
    }

    static HD T rnd(float v) { return to_t<T>(v); }
    static HD T rnd(T v) { return v; }

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
                const T v = rnd(a[j]);
                if (AT) sA[(t % BM) * LDA + t / BM + j * (NT / BM)] = v;
                else sA[(t / BK + j * (NT / BK)) * LDA + t % BK] = v;
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
            const int bx = n0 / BN, tg = bx / P.ct;
            const int tap = tg * (BN >> P.lc) + (c >> P.lc);
            const int ci = ((bx - tg * P.ct) << P.lc) + (c & ((1 << P.lc) - 1));
            if (tap >= 9 || ci >= P.Cin) return;
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

#endif
