/*
 * nn_conv_igemm_ph.cuh — the tile of igemm_dgrad_ph, the stride-phase
 * backward-data kernel of nn_conv_igemm.cu: tile shapes (PhCfg), the split
 * of a phase's k tiles between the k-slices of a block (ph_slice), the
 * loader (PhStage) and the epilogue (ph_epilogue).  Host-callable (HD, as
 * nn_conv_igemm_tile.cuh, whose IgP, Phase, phase_of, BK and NT it uses), so
 * that spec/c/test_conv_igemm_maps.cu runs these index maps on the CPU.
 *
 * The GEMM of stride phase z (blockIdx.z = a*sw + b, Phase in
 * nn_conv_igemm_tile.cuh: the dx pixels h = h0 + sh*i, w = w0 + sw*j, the
 * taps r = a + sh*ri, q = b + sw*qi, ri < nR, qi < nQ):
 *   C(ci, p) = sum over k of A(ci, k) B(k, p),  p = (img, i, j) of the
 *              phase's N x Hp x Wp grid
 *   k = (tp*ct + cb)*BK + kk:  tp = ri*nQ + qi (the tap), co = cb*BK + kk
 *              (ct = ceil(Cout/BK) tiles of output channels per tap; a k
 *              tile holds one tap, as the KT3 phase form of igemm_nchw)
 *   A(ci, k) = wt[((r*kw + q)*Cout + co)*Cin + ci]   (= dt(w[co][ci][r][q]);
 *              the layout of lucid_conv_igemm_wt_src, nn_conv_igemm.cuh)
 *   B(k, p)  = dy[img][co][(h+ph-r)/sh][(w+pw-q)/sw] (the divisions are
 *              exact by the phase's choice of taps; 0 outside dy)
 *   A and B are 0 for co >= Cout, A for ci >= Cin.
 *   dx[img][ci][h][w] = dt(beta*dx + C(ci, p))  (beta == 0 never reads dx)
 *
 * Why (H200, recorded YOLO11n-pose step, batch 4, 640, bf16): the six
 * stride-2 3x3 backward-data passes on igemm_nchw's phase form took 0.294 ms
 * of the critical path, 33-71 us each for at most 5 MB of traffic.  That
 * kernel stages A from the f32 KCRS master weight with ci along the
 * threads, 9 floats apart: every 4-byte element costs a 32-byte sector
 * (73 KB of L1/L2 traffic for a 4 KB bf16 tile), which is what bounded it;
 * its phases also ran up to 32 k tiles one after another in a grid of 200
 * blocks (128 -> 256 at 20x20), and Cin 16 filled a quarter of its 64-row
 * tile.  Here A comes from the pre-cast transposed weight as 16-byte
 * vectors of 8 input channels (one vector load and one vector store per
 * 8 elements, every byte used), B as before (a thread's pixel fixed, one
 * bounds test per k tile, elements a dy plane apart); a small grid splits
 * the k loop between 2 or 4 groups of warps of the block (KS k-slices),
 * whose sums are added in a fixed order; Cin <= 16 uses 16 x 128 tiles.
 *
 * Block: KS groups of NT = 128 threads (4 warps); group g computes the whole
 * TM x TN output tile over the k tiles [kb, ke) = ph_slice(g) of the phase,
 * with its own A and B tiles in shared memory (and its own named barrier),
 * each warp a (FM*16) x (FN*16) part.  After the k loops the group sums are
 * added in group order, (((s0 + s1) + s2) + s3), in f32, and the block's
 * threads write the tile.  Every order is fixed by the geometry: results are
 * bitwise identical run to run.
 */
#ifndef LUCID_CUDA_NN_CONV_IGEMM_PH_CUH
#define LUCID_CUDA_NN_CONV_IGEMM_PH_CUH

#include "nn_conv_igemm_tile.cuh"

/* Tile of one group: TM input channels (64; 16 when Cin <= 16) x TN phase
 * pixels (64; 128 with TM 16), the warps WM x WN, each FM x FN fragments
 * of 16 x 16; shared row pitches LA, LB, LC (elements).  (Not BM, BN, ...:
 * those are igemm_nchw's macros.) */
template <int BM_> struct PhCfg {
    static constexpr int TM = BM_;
    static constexpr int TN = BM_ == 16 ? 128 : 64;
    static constexpr int WN = BM_ == 16 ? 4 : 2; /* warps along N */
    static constexpr int WM = 4 / WN;             /* warps along M */
    static constexpr int FM = TM / WM / 16;       /* fragments of a warp along M */
    static constexpr int FN = TN / WN / 16;       /* ... along N */
    static constexpr int LA = TM + 8;  /* sA [BK][LA], A(m, k) at k*LA + m (col-major A) */
    static constexpr int LB = TN + 8;  /* sB [BK][LB], B(k, n) at k*LB + n */
    static constexpr int LC = TN + 4;  /* sC [TM][LC], f32 */
    static constexpr int AV = TM * BK / 8;         /* 16-byte vectors of an A tile */
    static constexpr int AVT = (AV + NT - 1) / NT; /* ... a thread stages: 2 (TM 64), 1 */
    static constexpr int PB = BK * TN / NT;        /* B elements a thread stages: 16, 32 */
    static constexpr int GSMEM = (BK * LA + BK * LB) * 2; /* a group's A and B, bytes */
    static constexpr int CSMEM = TM * LC * 4;              /* the f32 output tile */
    static_assert(BM_ == 16 || BM_ == 64, "PhCfg: BM 16 or 64");
    static_assert(WM * FM * 16 == TM && WN * FN * 16 == TN, "PhCfg: warps cover the tile");
    static_assert(NT % TN == 0 && (BK * TN) % NT == 0, "PhCfg: B staging");
    static_assert(GSMEM % 128 == 0 && (BK * LA * 2) % 32 == 0, "PhCfg: tile alignment");
};

/* Shared memory of a block of KS groups: the groups' A and B tiles during
 * the k loops, then (aliasing them) the f32 output tile. */
template <int BM_, int KS_> struct PhSmem {
    static constexpr int AB = KS_ * PhCfg<BM_>::GSMEM, C = PhCfg<BM_>::CSMEM;
    static constexpr int bytes = AB > C ? AB : C;
    static_assert(bytes <= 48 * 1024, "PhSmem: static shared memory limit");
};

/* Group g's share [kb, ke) of a phase's nt k tiles among KS groups:
 * contiguous, sizes differ by at most one, in k order. */
HD void ph_slice(int nt, int KS_, int g, int &kb, int &ke) {
    kb = (int)((long long)nt * g / KS_);
    ke = (int)((long long)nt * (g + 1) / KS_);
}

/* One k tile of A and B into registers (load), then into the group's
 * shared tiles (store).  Thread t (0 .. NT-1 within its group) stages
 *   A: 16-byte vectors v = t + u*NT < AV of the tile: k = v / (TM/8),
 *      channels m = (v % (TM/8))*8 .. +7: wt's row (tap, co = c0 + k),
 *      input channels m0 + m .. (Cin % 8 == 0: a vector is all in or out)
 *   B: k = t/TN + j*(NT/TN) (co = c0 + k), column n = t % TN: its pixel is
 *      fixed (init), so the bounds test is made once per tile and the
 *      elements are one dy plane apart.
 * init() takes the group's first k tile kb; load() is then called for kb,
 * kb + 1, ... in that order: the tile's tap (ri, qi) and first output
 * channel c0 are carried and advanced by compares, not divisions.  Element
 * offsets are 32-bit unsigned (lucid_conv_igemm_fits: operands under 2^31
 * elements); those of masked-off elements are formed but never read. */
template <typename T, int BM_>
struct PhStage {
    typedef PhCfg<BM_> C;
    uint4 av[C::AVT];
    T b[C::PB];
    /* B column pixel (h, w) = (h0 + sh*i, w0 + sw*j) of image img: the dy
     * row of tap (a + sh*ri, .) is (h + ph - a)/sh - ri = hb - ri (exact:
     * h + ph - a is a multiple of sh by the phase's choice, and >= 0),
     * the column wb - qi likewise */
    int img, hb, wb;
    bool nvalid;       /* the column is a pixel of the phase (n < Nc) */
    int c0, ri, qi;    /* next tile: first output channel, tap in the nR x nQ grid */

    HD void init(const IgP &P, const Phase &f, int n0, int kt, int t) {
        int n = n0 + t % C::TN;
        nvalid = n < f.Nc;
        if (!nvalid) n = 0;
        const int j = n % f.Wp, rr = n / f.Wp, i = rr % f.Hp;
        img = rr / f.Hp;
        hb = (f.h0 + P.ph - f.a) / P.sh + i;
        wb = (f.w0 + P.pw - f.b) / P.sw + j;
        const int tp = kt / P.ct;
        c0 = (kt - tp * P.ct) * BK;
        ri = f.nQ > 0 ? tp / f.nQ : 0;
        qi = tp - ri * f.nQ;
    }

    HD void load(const IgP &P, const Phase &f, const T *wt, int m0, int t) {
        const int r = f.a + P.sh * ri, q = f.b + P.sw * qi;
        /* A: wt[((r*kw + q)*Cout + co)*Cin + ci] */
        const unsigned rowb = (unsigned)(r * P.kw + q) * P.Cout + c0;
        UNROLL
        for (int u = 0; u < C::AVT; u++) {
            const int v = t + u * NT;
            const int k = v / (C::TM / 8), m = m0 + (v % (C::TM / 8)) * 8;
            uint4 z = make_uint4(0, 0, 0, 0);
            if ((C::AV % NT == 0 || v < C::AV) && c0 + k < P.Cout && m < P.Cin)
                z = LDG16(wt + (rowb + k) * P.Cin + m);
            av[u] = z;
        }
        /* B: dy[img][co][(h+ph-r)/sh][(w+pw-q)/sw] = dy[img][co][hb-ri][wb-qi] */
        const T zero = to_t<T>(0.0f);
        const int ho = hb - ri, wo = wb - qi;
        const bool ok = nvalid && ho >= 0 && wo >= 0 && ho < P.Ho && wo < P.Wo;
        const int k0 = t / C::TN;
        const unsigned plane = (unsigned)P.Ho * P.Wo;
        const unsigned off = ((unsigned)img * P.Cout + c0 + k0) * plane + ho * P.Wo + wo;
        const unsigned step = fresh((NT / C::TN) * plane);
        const T *dy = (const T *)P.b;
        UNROLL
        for (int j = 0; j < C::PB; j++) {
            T v = zero;
            if (ok && c0 + k0 + j * (NT / C::TN) < P.Cout) v = dy[off + j * step];
            b[j] = v;
        }
        /* the next tile: output channels first, then the tap */
        c0 += BK;
        if (c0 >= P.ct * BK) {
            c0 = 0;
            if (++qi == f.nQ) {
                qi = 0;
                ++ri;
            }
        }
    }

    HD void store(T *sA, T *sB, int t) const {
        UNROLL
        for (int u = 0; u < C::AVT; u++) {
            const int v = t + u * NT;
            if (C::AV % NT == 0 || v < C::AV)
                *(uint4 *)(sA + (v / (C::TM / 8)) * C::LA + (v % (C::TM / 8)) * 8) = av[u];
        }
        UNROLL
        for (int j = 0; j < C::PB; j++) sB[(t / C::TN + j * (NT / C::TN)) * C::LB + t % C::TN] = b[j];
    }
};

/* Thread t of nthr (the whole block) writes its share of the f32 output
 * tile sC [TM][LC]: column c = t % TN (its dx pixel decomposed once), rows
 * t/TN, t/TN + nthr/TN, ...: dx = dt(beta*dx + C) (beta == 0 never reads
 * dx), as igemm_nchw's phase epilogue. */
template <typename T, int BM_>
HD void ph_epilogue(const IgP &P, const Phase &f, int m0, int n0, int t, int nthr,
                    const float *sC) {
    typedef PhCfg<BM_> C;
    const int c = t % C::TN, gn = n0 + c;
    if (gn >= f.Nc) return;
    const int j = gn % f.Wp, q = gn / f.Wp, i = q % f.Hp, im = q / f.Hp;
    const size_t plane = (size_t)P.H * P.W;
    const size_t base =
        (size_t)im * P.Cin * plane + (size_t)(f.h0 + P.sh * i) * P.W + f.w0 + P.sw * j;
    T *out = (T *)P.out;
    for (int r = t / C::TN; r < C::TM; r += nthr / C::TN) {
        const int gm = m0 + r;
        if (gm >= P.M) break;
        const size_t o = base + (size_t)gm * plane;
        float v = sC[r * C::LC + c];
        if (P.beta != 0.0f) v = fmaf(P.beta, to_f<T>(out[o]), v);
        out[o] = to_t<T>(v);
    }
}

#endif
