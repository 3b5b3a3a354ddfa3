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

    /* KT3: the k tile at k0 holds taps tap0 .. tap0 + BK/cpt - 1 (cpt = 2^lc
     * channels each, channels c0 ..); (r, q): the kernel tap tap0 (with
     * lc == 5 the tile's only tap) */
    HD void tm_tap(const IgP &P, const Phase &f, int k0, int &r, int &q, int &c0) const {
        int tap0;
        tm_tile(P, k0, tap0, c0);
        const int tap = tap0;
        if (MODE == IG_DGRAD_PH) {
            int ri = tap / f.nQ, qi = tap - ri * f.nQ;
            r = f.a + P.sh * ri;
            q = f.b + P.sw * qi;
        } else {
            r = tap / 3;
            q = tap - r * 3;
        }
    }

    HD void tm_tile(const IgP &P, int k0, int &tap0, int &c0) const {
        const int kt = k0 / BK, tg = kt / P.ct;
        tap0 = tg * (BK >> P.lc);
        c0 = (kt - tg * P.ct) << P.lc;
    }

    /* KT3 with few channels (lc < 5, fwd and stride-1 dgrad): slot s of the
     * k tile -> tap and channel; false past the last tap or channel */
    HD bool tm_slot(const IgP &P, int tap0, int c0, int s, int C, int &tap, int &c) const {
        tap = tap0 + (s >> P.lc);
        c = c0 + (s & ((1 << P.lc) - 1));
        return tap < 9 && c < C;
    }

    /* KT3 A tile (fwd, dgrad): A(m, c) = w[m][c][r][q] (fwd; thread t: c =
     * c0 + t%BK, m = m0 + t/BK + j*(NT/BK)) or w[c][m][r][q] (dgrad, m = ci;
     * AT: m = m0 + t%BM, c = c0 + t/BM + j*(NT/BM)) */
    HD void load_a_tm(const IgP &P, const Phase &f, int m0, int k0, int t) {
        const float *w = (const float *)P.a;
        if (MODE != IG_DGRAD_PH && P.lc < 5) { /* several taps per k tile */
            int tap0, c0, tap, c;
            tm_tile(P, k0, tap0, c0);
            if (AT) {
                const int m = m0 + t % BM;
                UNROLL
                for (int j = 0; j < PER_T; j++) {
                    float v = 0.0f;
                    if (tm_slot(P, tap0, c0, t / BM + j * (NT / BM), P.Cout, tap, c) && m < P.M)
                        v = w[((size_t)c * P.Cin + m) * 9 + tap];
                    a[j] = to_t<T>(v);
                }
            } else {
                const int mA = m0 + t / BK;
                const bool sv = tm_slot(P, tap0, c0, t % BK, P.Cin, tap, c);
                const size_t base = sv ? ((size_t)mA * P.Cin + c) * 9 + tap : 0;
                UNROLL
                for (int j = 0; j < PER_T; j++) {
                    float v = 0.0f;
                    if (sv && mA + j * (NT / BK) < P.M)
                        v = w[base + (size_t)j * (NT / BK) * P.Cin * 9];
                    a[j] = to_t<T>(v);
                }
            }
            return;
        }
        int r, q, c0;
        tm_tap(P, f, k0, r, q, c0);
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
            /* column tile n0/BN: tap group tg (taps tap0 .. tap0 + BN/cpt - 1)
             * and channel slot cg (channels ci0 .. ci0 + cpt - 1), cpt = 2^lc */
            const int p = k0 + t % BK;
            const bool pv = p < kend;
            const int bx = n0 / BN, tg = bx / P.ct, tap0 = tg * (BN >> P.lc);
            const int ci0 = (bx - tg * P.ct) << P.lc;
            int im = 0, bh = 0, bw = 0;
            if (pv) {
                int wo = p % P.Wo, rr = p / P.Wo, ho = rr % P.Ho;
                im = rr / P.Ho;
                bh = ho * P.sh - P.ph;
                bw = wo * P.sw - P.pw;
            }
            const size_t plane = (size_t)P.H * P.W;
            if (P.lc == 6) { /* one tap per tile: one bounds test */
                const int r = tap0 / 3, q = tap0 - r * 3, ci = ci0 + t / BK;
                const int hi = bh + r * P.dh, wi = bw + q * P.dw;
                const bool ok = pv && hi >= 0 && hi < P.H && wi >= 0 && wi < P.W;
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
            /* few channels (Cin <= 32): several taps per tile, one per slot */
            const T *xb = (const T *)P.b + (size_t)im * P.Cin * plane;
            const int cm = (1 << P.lc) - 1;
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                const int nl = t / BK + j * (NT / BK), tap = tap0 + (nl >> P.lc), ci = ci0 + (nl & cm);
                T v = zero;
                if (pv && tap < 9 && ci < P.Cin) {
                    const int r = tap / 3, q = tap - r * 3;
                    const int hi = bh + r * P.dh, wi = bw + q * P.dw;
                    if (hi >= 0 && hi < P.H && wi >= 0 && wi < P.W)
                        v = xb[(size_t)ci * plane + (size_t)hi * P.W + wi];
                }
                b[j] = v;
            }
            return;
        }
        if (MODE != IG_DGRAD_PH && P.lc < 5) { /* several taps per k tile */
            const bool fw = MODE == IG_FWD;
            const int C = fw ? P.Cin : P.Cout, Hs = fw ? P.H : P.Ho, Ws = fw ? P.W : P.Wo;
            const int sg = fw ? 1 : -1; /* fwd: p0 + r*d; dgrad (stride 1): p0 - r*d */
            const T *src = (const T *)P.b + (size_t)img * C * Hs * Ws;
            int tap0, c0, tap, c;
            tm_tile(P, k0, tap0, c0);
            UNROLL
            for (int j = 0; j < PER_T; j++) {
                T v = zero;
                if (nvalid && tm_slot(P, tap0, c0, t / BN + j * (NT / BN), C, tap, c)) {
                    const int r = tap / 3, q = tap - r * 3;
                    const int hh = p0h + sg * r * P.dh, ww = p0w + sg * q * P.dw;
                    if (hh >= 0 && hh < Hs && ww >= 0 && ww < Ws)
                        v = src[((size_t)c * Hs + hh) * Ws + ww];
                }
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
