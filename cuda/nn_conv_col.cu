/*
 * nn_conv_col.cu — convolutions as im2col + cuBLAS GEMMs (bf16/f16, groups
 * 1, any kernel size, stride, padding, dilation).  The contract, the GEMM
 * formulation and the numerics are in nn_conv_col.cuh; nn_conv.cu decides
 * when this route runs (LUCID_CONV_COL, lucid_cuda_nn_set_conv_col).  The
 * forward and backward-filter GEMMs are the 1x1 route's (nn_conv_gemm.cu)
 * applied to the column matrix (Cin -> K = Cin*kh*kw, x -> col); the
 * backward-data of a stride-1 conv is a forward of dy with the flipped,
 * transposed weight (the weight shadow's copy, or col_wflip per call), one
 * GEMM straight into dx.
 *
 * Two im2col kernels, chosen per process by LUCID_COL_IM2COL
 * (lucid_conv_col_im2col_switch): the tiled one (default; col_im2col_tiled,
 * a block stages the input rows of a tile of output positions of one
 * channel in shared memory and writes its kh*kw column rows with 16-byte
 * stores) and the per-thread one (col_im2col, 8 columns of one row per
 * thread).  Their work is host-callable (col_tile_fill / col_tile_emit per
 * block and thread, col_im2col_row8 per thread item) so that
 * spec/c/test_conv_col_maps.cu runs the kernels' own index maps on the
 * CPU.  Both use 32-bit index math within an image and a plane (64-bit
 * bases) and come in stride variants 1, 2 (the divisions by the stride
 * become shifts) and any.
 */
#include "nn_common.cuh"
#include "nn_conv_col.cuh"
#include "nn_conv_gemm.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COL_HD __host__ __device__ __forceinline__
/* "#pragma unroll" for the device pass only (the host compiler warns about it) */
#if defined(__CUDA_ARCH__)
#define COL_UNROLL _Pragma("unroll")
#else
#define COL_UNROLL
#endif

// ----------------------------------------------------------------------------
// the switch and the geometry

namespace {
struct col_env {
    int passes; /* LUCID_CONV_COL_F | _D | _W, or -1 for an unknown value */
    char value[64];
};

col_env col_env_read(void) {
    col_env e;
    const char *v = getenv("LUCID_CONV_COL");
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    e.passes = -1;
    if (!v || !v[0] || strcmp(v, "1") == 0) {
        e.passes = LUCID_CONV_COL_ALL;
    } else if (strcmp(v, "0") == 0) {
        e.passes = 0;
    } else {
        int m = 0;
        for (const char *c = v; *c; c++) {
            int bit = *c == 'f' ? LUCID_CONV_COL_F : *c == 'd' ? LUCID_CONV_COL_D
                      : *c == 'w' ? LUCID_CONV_COL_W : 0;
            if (!bit || (m & bit)) return e; /* unknown letter or repeated */
            m |= bit;
        }
        e.passes = m;
    }
    return e;
}
} // namespace

int lucid_conv_col_switch(const char **value) {
    static const col_env e = col_env_read(); /* once, thread-safe */
    if (value) *value = e.value;
    return e.passes;
}

int lucid_conv_col_pad_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_CONV_COL_PAD", &off);
}

int lucid_conv_col_im2col_switch(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_COL_IM2COL", &off);
}

static int64_t col_K(const lucid_conv_col_geom *g) { return g->Cin * g->kh * g->kw; }
static int64_t col_P(const lucid_conv_col_geom *g) { return g->Ho * g->Wo; }
/* rows per image of the column matrix: K rounded up to a multiple of 8, so
 * that every leading dimension of the GEMMs is a whole number of 16-byte
 * vectors (the padding rows are +0 and the weight's padding columns +0) */
static int64_t col_Kr(const lucid_conv_col_geom *g) { return (col_K(g) + 7) / 8 * 8; }

/* The checks of lucid_conv_col_eligible that every pass shares: the route
 * can compute im2col(x) and the forward GEMM of g. */
static int col_geom_ok(const lucid_conv_col_geom *g, lucid_dtype dt) {
    if (!g) return 0;
    if (dt != LUCID_BF16 && dt != LUCID_F16) return 0;
    if (g->N < 1 || g->Cin < 1 || g->H < 1 || g->W < 1 || g->Cout < 1) return 0;
    if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0 ||
        g->dh < 1 || g->dw < 1)
        return 0;
    const int64_t lim = (int64_t)INT_MAX;
    if (g->H > lim || g->W > lim || g->Cin > lim || g->Cout > lim) return 0;
    if (g->Ho != (g->H + 2 * g->ph - (int64_t)g->dh * (g->kh - 1) - 1) / g->sh + 1 ||
        g->Wo != (g->W + 2 * g->pw - (int64_t)g->dw * (g->kw - 1) - 1) / g->sw + 1 ||
        g->Ho < 1 || g->Wo < 1)
        return 0;
    const int64_t K = col_Kr(g), P = col_P(g);
    if (P % 8 || (col_K(g) % 8 && !lucid_conv_col_pad_switch())) return 0;
    if (K > lim || P > lim) return 0;
    if (g->N > LUCID_CONV_COL_MAX_ELEMS / K / P) return 0;
    /* the filter gradient's f32 per-image partials (N*Cout*K) too */
    if (g->Cout > LUCID_CONV_COL_MAX_ELEMS / K || g->N > LUCID_CONV_COL_MAX_ELEMS / (g->Cout * K))
        return 0;
    /* x, y and the weight under 2^31 elements (32-bit plane offsets) */
    if (g->N * g->Cin > lim / (g->H * g->W) || g->N * g->Cout > lim / P ||
        g->Cout > lim / K)
        return 0;
    return 1;
}

/* The backward-data of a stride-1 conv as a forward conv (the
 * "deconvolution" identity of Caffe's DeconvolutionLayer): dx = conv(dy,
 * w'), w'[ci][co][r][q] = w[co][ci][kh-1-r][kw-1-q], stride 1, the same
 * dilation, padding (kh-1)*dh - ph (which must be >= 0) and likewise along
 * w, so its output is H x W.  *t: that forward's geometry (Cin' = Cout,
 * Cout' = Cin).  1 when g has stride 1 and *t passes col_geom_ok. */
static int col_dgrad_geom(const lucid_conv_col_geom *g, lucid_dtype dt,
                          lucid_conv_col_geom *t) {
    if (!g || g->sh != 1 || g->sw != 1) return 0;
    const int ph = (g->kh - 1) * g->dh - g->ph, pw = (g->kw - 1) * g->dw - g->pw;
    if (ph < 0 || pw < 0) return 0;
    *t = lucid_conv_col_geom{g->N, g->Cout, g->Ho, g->Wo, g->Cin, g->H, g->W,
                             g->kh, g->kw, 1, 1, ph, pw, g->dh, g->dw};
    return col_geom_ok(t, dt);
}

int lucid_conv_col_eligible(const lucid_conv_col_geom *g, lucid_dtype dt, int pass) {
    if (pass < 0 || pass > 2 || !col_geom_ok(g, dt)) return 0;
    lucid_conv_col_geom t;
    return pass != 1 || col_dgrad_geom(g, dt, &t);
}

/* the GEMMs' view: Cin -> Kr (the padded rows) */
static lucid_conv_gemm_geom col_gemm_geom(const lucid_conv_col_geom *g) {
    return lucid_conv_gemm_geom{g->N, col_Kr(g), g->Cout, col_P(g)};
}

static size_t col_bytes(const lucid_conv_col_geom *g, size_t elem) {
    return nn_align((size_t)(g->N * col_Kr(g) * col_P(g)) * elem);
}

size_t lucid_conv_col_scratch(const lucid_conv_col_geom *g, lucid_dtype dt, int pass, int bias) {
    lucid_conv_gemm_geom gg = col_gemm_geom(g);
    lucid_conv_col_geom t;
    if (pass == 1) /* im2col(dy) + the flipped weight [Cin, Kr'] */
        return col_dgrad_geom(g, dt, &t) ? col_bytes(&t, 2) + nn_align((size_t)(g->Cin * col_Kr(&t)) * 2)
                                         : 0;
    if (pass == 2) return col_bytes(g, 2) + lucid_conv_gemm_wgrad_scratch(&gg, col_K(g));
    return col_bytes(g, 2) + lucid_conv_gemm_scratch(&gg, dt, 0, bias);
}

// ----------------------------------------------------------------------------
// the per-thread work (host-callable)

/* The kernels' view of a geometry (32-bit: lucid_conv_col_eligible keeps
 * every operand under 2^31 elements). */
struct ColArgs {
    int N, Cin, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
    int K, P;
    int Kr; /* rows per image of the column matrix: K rounded up to 8 (rows K..Kr-1 are +0) */
};

static ColArgs col_args(const lucid_conv_col_geom *g) {
    ColArgs a;
    a.N = (int)g->N; a.Cin = (int)g->Cin; a.H = (int)g->H; a.W = (int)g->W;
    a.Ho = (int)g->Ho; a.Wo = (int)g->Wo; a.kh = g->kh; a.kw = g->kw;
    a.sh = g->sh; a.sw = g->sw; a.ph = g->ph; a.pw = g->pw; a.dh = g->dh; a.dw = g->dw;
    a.K = (int)col_K(g); a.P = (int)col_P(g); a.Kr = (int)col_Kr(g);
    return a;
}

/* Stride variants of both kernels: S = 1 or 2 when sh == sw == S (the
 * divisions by the stride become shifts), 0 any stride. */
template <int S> COL_HD int col_sh(const ColArgs &a) { return S ? S : a.sh; }
template <int S> COL_HD int col_sw(const ColArgs &a) { return S ? S : a.sw; }

/* im2col of row `row` = n*Kr + k of the column matrix, columns p = p8*8 ..
 * p8*8 + 7: v[j] = the x element of col[n][k][p + j] (+0 in the padding,
 * and in the whole row for k >= K: the rows that round K up to Kr).
 * Returns the offset of v[0] in col.  32-bit offsets within an image and
 * a channel plane; the image/channel base is formed in 64 bits. */
template <typename T, int S>
COL_HD size_t col_im2col_row8(const T *__restrict__ x, const ColArgs &a, unsigned row,
                              unsigned p8, T v[8]) {
    const unsigned n = row / (unsigned)a.Kr, k = row - n * (unsigned)a.Kr;
    const unsigned p = p8 * 8u;
    T z;
    memset(&z, 0, sizeof z); /* +0 */
    if (k >= (unsigned)a.K) {
        for (int j = 0; j < 8; j++) v[j] = z;
        return (size_t)row * a.P + p;
    }
    const unsigned KK = (unsigned)(a.kh * a.kw), ci = k / KK, rq = k - ci * KK;
    const int r = (int)(rq / (unsigned)a.kw), q = (int)rq - r * a.kw;
    int ho = (int)(p / (unsigned)a.Wo), wo = (int)p - ho * a.Wo;
    const T *xp = x + ((size_t)n * a.Cin + ci) * ((size_t)a.H * a.W);
    const int oh = r * a.dh - a.ph, ow = q * a.dw - a.pw;
    const int sh = col_sh<S>(a), sw = col_sw<S>(a);
    for (int j = 0; j < 8; j++) {
        const int hi = ho * sh + oh, wi = wo * sw + ow;
        v[j] = hi >= 0 && hi < a.H && wi >= 0 && wi < a.W ? xp[hi * a.W + wi] : z;
        if (++wo == a.Wo) {
            wo = 0;
            ++ho;
        }
    }
    return (size_t)row * a.P + p;
}

// ----------------------------------------------------------------------------
// the tiled im2col (shared memory; host-callable per-block work)
//
// One block per (n, ci, tile of TP output positions p0 .. p0+TP-1 of the
// plane; TP a multiple of 8, the last tile of a plane may be shorter).
// Phase 1 (col_tile_fill) stages the input rows the tile reads, all kh
// kernel rows, in shared memory with the zero padding written as +0
// (coalesced loads: consecutive threads read consecutive columns of a row;
// each input element is read from global memory once per block), plus two
// small tables; phase 2 (col_tile_emit) writes the rows
// k = ci*kh*kw + r*kw + q, r < kh, q < kw of the tile as 16-byte vectors of
// 8 consecutive p (consecutive threads: consecutive vectors of one row, so
// a warp writes contiguous runs), each read from shared memory with one or
// two 16-byte loads and a funnel shift; the blocks of ci = Cin-1 also write
// the rows K .. Kr-1 of the image (+0).
//
// Shared layout (in elements of T, 2 bytes): staged row i (input row
// hi = ho0*sh - ph + i, i < the block's rows) at i*RP; within it, the
// padded column u = wi + pw (u < Wn) at (u % sw)*PP + u / sw: a stride-sw
// row split into sw phase planes of PP elements, so that the 8 inputs of
// 8 consecutive wo of one kernel column q are contiguous (index
// wo + q*dw/sw in plane (q*dw) % sw) whatever the stride.  PP and RP are
// multiples of 8 (16-byte chunks), 8 elements of slack follow the rows
// (the second chunk of a load at the end), then the int tables at byte
// offset tab: tp[v] (v < TP/8) = the staged offset of vector v's first
// position, (ho - ho0)*sh*RP + wo, with bit 31 set when its 8 positions
// cross into the next output row (then read one by one); tk[rq] (rq <
// kh*kw) = r*dh*RP + ((q*dw) % sw)*PP + (q*dw)/sw.
//
// On the device every thread of the block runs col_tile_fill, then
// __syncthreads, then col_tile_emit (col_im2col_tiled); on the host
// (spec/c/test_conv_col_maps.cu) one thread runs col_tile_fill for every
// tid in order, then col_tile_emit for every tid, on a plain buffer.

#define COL_FILL_BATCH 4 /* staged elements a thread loads before it stores them */

/* The launch plan of a geometry (col_tile_plan). */
struct ColTile {
    int TP;    /* output positions per tile (a multiple of 8) */
    int tiles; /* tiles per plane: ceil(P / TP) */
    int R;     /* staged rows per block, at most (bound over the tiles) */
    int Wn;    /* staged columns per row: (Wo-1)*sw + (kw-1)*dw + 1 */
    int PP;    /* elements per phase plane of a staged row (a multiple of 8) */
    int RP;    /* elements per staged row: sw * PP */
    int tab;   /* byte offset of the tables tp, tk */
    int smem;  /* dynamic shared bytes per block: tab + 4*(TP/8 + kh*kw) */
    int nthr;  /* threads per block */
};

/* What a block covers. */
struct ColTileBlock {
    unsigned n, ci, p0, nv, ho0, rows; /* nv: 8-vectors of the tile; rows: staged rows */
    int hbase;                         /* the input row of staged row 0: ho0*sh - ph */
};

template <int S>
COL_HD ColTileBlock col_tile_block(const ColArgs &a, const ColTile &t, unsigned block) {
    ColTileBlock b;
    const unsigned plane = block / (unsigned)t.tiles, tile = block - plane * (unsigned)t.tiles;
    b.n = plane / (unsigned)a.Cin;
    b.ci = plane - b.n * (unsigned)a.Cin;
    b.p0 = tile * (unsigned)t.TP;
    const unsigned left = (unsigned)a.P - b.p0, np = left < (unsigned)t.TP ? left : (unsigned)t.TP;
    b.nv = np / 8u;
    b.ho0 = b.p0 / (unsigned)a.Wo;
    const unsigned ho1 = (b.p0 + np - 1u) / (unsigned)a.Wo;
    const int sh = col_sh<S>(a);
    b.rows = (ho1 - b.ho0) * (unsigned)sh + (unsigned)((a.kh - 1) * a.dh) + 1u;
    b.hbase = (int)b.ho0 * sh - a.ph;
    return b;
}

/* host emulation: shared-memory accesses outside their region (the test
 * checks that there are none; the device never counts) */
[[maybe_unused]] static unsigned long g_col_tile_oob;

/* shared-memory accessors: plain typed accesses on the device, memcpy on
 * the host (the buffer is bytes there; bounds counted) */
template <typename T>
COL_HD void col_sm_st(unsigned char *sm, const ColTile &t, unsigned i, T v) {
#ifdef __CUDA_ARCH__
    ((T *)sm)[i] = v;
#else
    if ((size_t)i * 2 + 2 > (size_t)t.tab) g_col_tile_oob++;
    else memcpy(sm + (size_t)i * 2, &v, 2);
#endif
}
template <typename T>
COL_HD T col_sm_ld(const unsigned char *sm, const ColTile &t, unsigned i) {
#ifdef __CUDA_ARCH__
    return ((const T *)sm)[i];
#else
    T v;
    memset(&v, 0, sizeof v);
    if ((size_t)i * 2 + 2 > (size_t)t.tab) g_col_tile_oob++;
    else memcpy(&v, sm + (size_t)i * 2, 2);
    return v;
#endif
}
/* 16-byte chunk c (elements 8c .. 8c+7) */
COL_HD uint4 col_sm_ld16(const unsigned char *sm, const ColTile &t, unsigned c) {
#ifdef __CUDA_ARCH__
    return ((const uint4 *)sm)[c];
#else
    uint4 v = make_uint4(0, 0, 0, 0);
    if ((size_t)c * 16 + 16 > (size_t)t.tab) g_col_tile_oob++;
    else memcpy(&v, sm + (size_t)c * 16, 16);
    return v;
#endif
}
/* table entry i (tp[i] for i < TP/8, tk[i - TP/8] after) */
COL_HD void col_sm_sti(unsigned char *sm, const ColTile &t, unsigned i, unsigned v) {
#ifdef __CUDA_ARCH__
    ((unsigned *)(sm + t.tab))[i] = v;
#else
    if ((size_t)t.tab + (size_t)i * 4 + 4 > (size_t)t.smem) g_col_tile_oob++;
    else memcpy(sm + t.tab + (size_t)i * 4, &v, 4);
#endif
}
COL_HD unsigned col_sm_ldi(const unsigned char *sm, const ColTile &t, unsigned i) {
#ifdef __CUDA_ARCH__
    return ((const unsigned *)(sm + t.tab))[i];
#else
    unsigned v = 0;
    if ((size_t)t.tab + (size_t)i * 4 + 4 > (size_t)t.smem) g_col_tile_oob++;
    else memcpy(&v, sm + t.tab + (size_t)i * 4, 4);
    return v;
#endif
}

/* (hi:lo) >> s, the low 32 bits (s 0 or 16) */
COL_HD uint32_t col_fshr(uint32_t lo, uint32_t hi, unsigned s) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, s);
#else
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> s);
#endif
}

/* the 8 staged elements at i .. i+7 (any alignment) as one vector */
COL_HD uint4 col_sm_row8(const unsigned char *sm, const ColTile &t, unsigned i) {
    const unsigned c = i >> 3, s = i & 7u;
    const uint4 A = col_sm_ld16(sm, t, c);
    if (!s) return A;
    const uint4 B = col_sm_ld16(sm, t, c + 1);
    uint32_t w[8] = {A.x, A.y, A.z, A.w, B.x, B.y, B.z, B.w};
    if (s & 4u) {
COL_UNROLL
        for (int j = 0; j < 6; j++) w[j] = w[j + 2];
    }
    if (s & 2u) {
COL_UNROLL
        for (int j = 0; j < 5; j++) w[j] = w[j + 1];
    }
    const unsigned sh = (s & 1u) * 16u;
    return make_uint4(col_fshr(w[0], w[1], sh), col_fshr(w[1], w[2], sh),
                      col_fshr(w[2], w[3], sh), col_fshr(w[3], w[4], sh));
}

/* Phase 1 of block `block`, thread tid of t.nthr: the tables and the
 * staged rows (x: the whole input, as col_im2col_row8). */
template <typename T, int S>
COL_HD void col_tile_fill(const T *__restrict__ x, const ColArgs &a, const ColTile &t,
                          unsigned block, unsigned tid, unsigned char *sm) {
    const ColTileBlock b = col_tile_block<S>(a, t, block);
    const int sh = col_sh<S>(a), sw = col_sw<S>(a);
    const unsigned nthr = (unsigned)t.nthr, TV = (unsigned)t.TP / 8u, Wo = (unsigned)a.Wo;
    for (unsigned v = tid; v < b.nv; v += nthr) {
        const unsigned p = b.p0 + 8u * v, ho = p / Wo, wo = p - ho * Wo;
        unsigned e = (ho - b.ho0) * (unsigned)sh * (unsigned)t.RP + wo;
        if (wo + 8u > Wo) e |= 0x80000000u;
        col_sm_sti(sm, t, v, e);
    }
    const unsigned KK = (unsigned)(a.kh * a.kw);
    for (unsigned rq = tid; rq < KK; rq += nthr) {
        const unsigned r = rq / (unsigned)a.kw, q = rq - r * (unsigned)a.kw;
        const unsigned qd = q * (unsigned)a.dw;
        col_sm_sti(sm, t, TV + rq,
                   r * (unsigned)a.dh * (unsigned)t.RP + (qd % (unsigned)sw) * (unsigned)t.PP +
                       qd / (unsigned)sw);
    }
    /* staged element (row, u), row < b.rows, u < Wn, in the order row*Wn + u:
     * thread tid takes tid, tid + nthr, ... (COL_FILL_BATCH at a time: that
     * many loads in flight) */
    const T *xp = x + ((size_t)b.n * a.Cin + b.ci) * ((size_t)a.H * a.W);
    const unsigned Wn = (unsigned)t.Wn, drow = nthr / Wn, du = nthr - drow * Wn;
    unsigned row = tid / Wn, u = tid - row * Wn;
    T z;
    memset(&z, 0, sizeof z); /* +0 */
    while (row < b.rows) {
        T v[COL_FILL_BATCH];
        unsigned at[COL_FILL_BATCH];
COL_UNROLL
        for (int j = 0; j < COL_FILL_BATCH; j++) {
            const int hi = b.hbase + (int)row, wi = (int)u - a.pw;
            const bool in = row < b.rows;
            v[j] = in && (unsigned)hi < (unsigned)a.H && (unsigned)wi < (unsigned)a.W
                       ? xp[hi * a.W + wi]
                       : z;
            at[j] = in ? row * (unsigned)t.RP + (u % (unsigned)sw) * (unsigned)t.PP +
                             u / (unsigned)sw
                       : 0xffffffffu;
            u += du;
            row += drow;
            if (u >= Wn) {
                u -= Wn;
                row++;
            }
        }
COL_UNROLL
        for (int j = 0; j < COL_FILL_BATCH; j++)
            if (at[j] != 0xffffffffu) col_sm_st<T>(sm, t, at[j], v[j]);
    }
}

/* Phase 2 of block `block`, thread tid: the column vectors, each handed
 * to st(offset in col, 16-byte vector) (offset a multiple of 8 elements). */
template <typename T, int S, typename St>
COL_HD void col_tile_emit(const ColArgs &a, const ColTile &t, unsigned block, unsigned tid,
                          const unsigned char *sm, const St &st) {
    const ColTileBlock b = col_tile_block<S>(a, t, block);
    const int sh = col_sh<S>(a);
    const unsigned KK = (unsigned)(a.kh * a.kw), TV = (unsigned)t.TP / 8u;
    /* the last channel's blocks also write the rows K .. Kr-1 (+0) */
    const unsigned KKe = KK + (b.ci + 1u == (unsigned)a.Cin ? (unsigned)(a.Kr - a.K) : 0u);
    const size_t base = ((size_t)b.n * a.Kr + (size_t)b.ci * KK) * a.P + b.p0;
    const unsigned nv = b.nv, nthr = (unsigned)t.nthr, drq = nthr / nv, dv = nthr - drq * nv;
    unsigned rq = tid / nv, v = tid - rq * nv;
    while (rq < KKe) {
        union {
            T h[8];
            uint4 u;
        } o;
        if (rq >= KK) {
            o.u = make_uint4(0, 0, 0, 0);
        } else {
            const unsigned e = col_sm_ldi(sm, t, v), kq = col_sm_ldi(sm, t, TV + rq);
            if (!(e & 0x80000000u)) {
                o.u = col_sm_row8(sm, t, e + kq);
            } else { /* crosses an output row: one by one */
                const unsigned Wo = (unsigned)a.Wo, p = b.p0 + 8u * v;
                unsigned ho = p / Wo, wo = p - ho * Wo;
COL_UNROLL
                for (int j = 0; j < 8; j++) {
                    o.h[j] = col_sm_ld<T>(sm, t, (ho - b.ho0) * (unsigned)sh * (unsigned)t.RP + wo + kq);
                    if (++wo == Wo) {
                        wo = 0;
                        ++ho;
                    }
                }
            }
        }
        st(base + (size_t)rq * a.P + 8u * v, o.u);
        v += dv;
        rq += drq;
        if (v >= nv) {
            v -= nv;
            rq++;
        }
    }
}

// ----------------------------------------------------------------------------
// kernels

/* Blocks of COL_BX x COL_BY threads: threadIdx.x runs along a row of the
 * column matrix (im2col: its 8-column vectors) or a row of a dx plane
 * threadIdx.y over rows, so a short row (a 20x20 map has 50 vectors)
 * wastes at most one partial warp. */
#define COL_BX 32
#define COL_BY 8

/* grid: x over the P/8 column vectors of a row, y over the rows n*K + k
 * (grid-stride in both) */
template <typename T, int S>
static __global__ void __launch_bounds__(COL_BX *COL_BY)
col_im2col(const T *__restrict__ x, T *__restrict__ col, ColArgs a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const unsigned rows = (unsigned)a.N * a.Kr, P8 = (unsigned)a.P / 8;
    for (unsigned row = blockIdx.y * COL_BY + threadIdx.y; row < rows; row += gridDim.y * COL_BY)
        for (unsigned p8 = blockIdx.x * COL_BX + threadIdx.x; p8 < P8; p8 += gridDim.x * COL_BX) {
            union {
                T v[8];
                uint4 u;
            } o;
            const size_t off = col_im2col_row8<T, S>(x, a, row, p8, o.v);
            *(uint4 *)(col + off) = o.u;
        }
}

/* The tiled im2col: one block of t.nthr threads per (n, ci, tile), grid
 * N*Cin*t.tiles (1-D), t.smem bytes of dynamic shared memory (<= 48 KB). */
#define COL_TNT 256

/* the store of col_tile_emit on the device: one 16-byte vector */
template <typename T> struct ColStore {
    T *col;
    COL_HD void operator()(size_t off, const uint4 &v) const { *(uint4 *)(col + off) = v; }
};

template <typename T, int S>
static __global__ void __launch_bounds__(COL_TNT)
col_im2col_tiled(const T *__restrict__ x, T *__restrict__ col, ColArgs a, ColTile t) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ uint4 col_smem[];
    unsigned char *sm = (unsigned char *)col_smem;
    col_tile_fill<T, S>(x, a, t, blockIdx.x, threadIdx.x, sm);
    __syncthreads();
    col_tile_emit<T, S>(a, t, blockIdx.x, threadIdx.x, sm, ColStore<T>{col});
}

/* wf[i] = T(w[lucid_conv_col_wflip_src(i, ...)]) (one rounding), +0 where
 * it is -1; i over the Cin*Kr elements of wf */
template <typename T>
static __global__ void col_wflip(const float *__restrict__ w, T *__restrict__ wf, int Cin,
                                 int Cout, int kh, int kw, int Kr, int n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t src = lucid_conv_col_wflip_src(i, Cin, Cout, kh, kw, Kr);
        lucid_elem<T>::store(wf, i, src < 0 ? 0.0f : w[src]);
    }
}

/* wp[co][k] = T(w[co][k]) for k < K, +0 for K <= k < Kr (one rounding, as
 * the GEMM route's cast): the forward's weight with its rows padded; i over
 * the Cout*Kr elements of wp */
template <typename T>
static __global__ void col_wpad(const float *__restrict__ w, T *__restrict__ wp, int K, int Kr,
                                int n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int co = (int)(i / Kr), k = (int)(i - (int64_t)co * Kr);
        lucid_elem<T>::store(wp, i, k < K ? w[(size_t)co * K + k] : 0.0f);
    }
}

static thread_local unsigned long g_col_launches;

extern "C" unsigned long lucid_cuda_conv_col_launch_count(void) { return g_col_launches; }

static lucid_status col_check(lucid_ctx *ctx, const char *op, lucid_dtype dt,
                              const lucid_conv_col_geom *g, int pass) {
    if (lucid_conv_col_eligible(g, dt, pass)) return LUCID_OK;
    if (!g) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s (im2col GEMM route): geometry NULL", op);
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "%s (im2col GEMM route): dtype %s, x %lldx%lldx%lldx%lld, Cout %lld, "
                        "y %lldx%lld, kernel %dx%d, stride %d,%d, pad %d,%d, dilation %d,%d "
                        "not eligible (needs bf16/f16, Ho*Wo a multiple of 8, "
                        "N*Cin*kh*kw*Ho*Wo and N*Cout*Cin*kh*kw <= %lld; backward-data also "
                        "stride 1, padding <= (kernel-1)*dilation and H*W a multiple of 8; with "
                        "LUCID_CONV_COL_PAD=0 also Cin*kh*kw and Cout*kh*kw multiples of 8)",
                        op, lucid_dtype_name(dt), (long long)g->N, (long long)g->Cin,
                        (long long)g->H, (long long)g->W, (long long)g->Cout,
                        (long long)g->Ho, (long long)g->Wo, g->kh, g->kw, g->sh, g->sw, g->ph,
                        g->pw, g->dh, g->dw, (long long)LUCID_CONV_COL_MAX_ELEMS);
}

/* The stride variant of a geometry: 1 or 2 when sh == sw is, else 0. */
static int col_stride(const ColArgs &a) {
    return a.sh == a.sw && (a.sh == 1 || a.sh == 2) ? a.sh : 0;
}

static dim3 col_grid(unsigned x_items, unsigned y_items) {
    const unsigned gy = (y_items + COL_BY - 1) / COL_BY;
    return dim3((x_items + COL_BX - 1) / COL_BX, gy < 65535u ? gy : 65535u);
}

/* The tiled kernel's plan (col_im2col_tiled): tiles of whole output rows
 * (TP a multiple of lcm(Wo, 8)) unless lcm(Wo, 8) > tpmax (then any
 * multiple of 8, a tile may start mid-row), the largest such TP <= tpmax
 * and <= P rounded up, halved while the grid has fewer than
 * COL_TILE_BLOCKS blocks and the halved tile keeps COL_TILE_TP_MIN
 * positions and a whole output row (a block stages whole input rows),
 * evened out (the fewest multiples of L that keep the number of tiles),
 * then halved (down to 8) until the block's shared memory fits in
 * COL_TILE_SMEM.  0 when even a tile of 8 does not fit (the staged rows
 * are whole padded input rows: about W > 6000 for a 3x3 kernel at stride
 * 1) or P % 8: the launcher then runs col_im2col. */
#define COL_TILE_TP 2048     /* default tpmax (LUCID_COL_IM2COL_TILE) */
#define COL_TILE_TP_MIN 128  /* no smaller tiles for the grid's sake */
#define COL_TILE_BLOCKS 1024 /* about 8 blocks per SM of an H200 (132 SMs) */
#define COL_TILE_SMEM 49152  /* the dynamic shared memory a launch gets without an attribute */

static int64_t col_gcd(int64_t a, int64_t b) {
    while (b) {
        const int64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static int col_tile_plan(const ColArgs &a, int tpmax, ColTile *t) {
    if (a.P % 8 || tpmax < 8) return 0;
    tpmax -= tpmax % 8;
    const int64_t Wo = a.Wo, P = a.P, sh = a.sh, sw = a.sw, KK = (int64_t)a.kh * a.kw;
    const int64_t Wn = (Wo - 1) * sw + (int64_t)(a.kw - 1) * a.dw + 1;
    const int64_t PP = ((Wn + sw - 1) / sw + 7) / 8 * 8, RP = sw * PP;
    const int64_t planes = (int64_t)a.N * a.Cin;
    int64_t L = Wo / col_gcd(Wo, 8) * 8; /* lcm(Wo, 8) */
    if (L > tpmax) L = 8;
    int64_t m = tpmax / L < (P + L - 1) / L ? tpmax / L : (P + L - 1) / L;
    while (m > 1 && planes * ((P + m * L - 1) / (m * L)) < COL_TILE_BLOCKS &&
           m / 2 * L >= COL_TILE_TP_MIN && m / 2 * L >= Wo)
        m /= 2;
    { /* the same number of tiles, as even as L allows */
        const int64_t units = (P + L - 1) / L, tiles = (units + m - 1) / m;
        m = (units + tiles - 1) / tiles;
    }
    for (;;) {
        const int64_t TP = m * L;
        /* output rows a tile spans: tiles start at row boundaries when Wo | TP */
        int64_t nho = TP % Wo == 0 ? TP / Wo : (Wo - 1 + TP - 1) / Wo + 1;
        if (nho > a.Ho) nho = a.Ho;
        const int64_t R = (nho - 1) * sh + (int64_t)(a.kh - 1) * a.dh + 1;
        const int64_t tab = ((R * RP + 8) * 2 + 15) / 16 * 16, smem = tab + 4 * (TP / 8 + KK);
        if (smem <= COL_TILE_SMEM) {
            t->TP = (int)TP;
            t->tiles = (int)((P + TP - 1) / TP);
            t->R = (int)R;
            t->Wn = (int)Wn;
            t->PP = (int)PP;
            t->RP = (int)RP;
            t->tab = (int)tab;
            t->smem = (int)smem;
            t->nthr = COL_TNT;
            return 1;
        }
        if (m > 1) {
            m /= 2;
        } else if (L > 8) {
            m = L / 16 > 1 ? L / 16 : 1;
            L = 8;
        } else {
            return 0;
        }
    }
}

static int col_tile_tpmax(void) {
    static int v = -1;
    return lucid_env_int("LUCID_COL_IM2COL_TILE", 8, 1 << 16, COL_TILE_TP, &v);
}

template <typename T>
static cudaError_t col_im2col_launch(cudaStream_t stream, const ColArgs &a, const void *x,
                                     void *col) {
    const int s = col_stride(a);
    ColTile t;
    if (lucid_conv_col_im2col_switch() && col_tile_plan(a, col_tile_tpmax(), &t)) {
        const dim3 grid((unsigned)((int64_t)a.N * a.Cin * t.tiles)), block(t.nthr);
        const size_t sm = (size_t)t.smem;
        if (s == 1)
            return lucid_launch(col_im2col_tiled<T, 1>, grid, block, sm, stream, (const T *)x,
                                (T *)col, a, t);
        if (s == 2)
            return lucid_launch(col_im2col_tiled<T, 2>, grid, block, sm, stream, (const T *)x,
                                (T *)col, a, t);
        return lucid_launch(col_im2col_tiled<T, 0>, grid, block, sm, stream, (const T *)x,
                            (T *)col, a, t);
    }
    const dim3 grid = col_grid((unsigned)a.P / 8, (unsigned)a.N * a.Kr), block(COL_BX, COL_BY);
    if (s == 1)
        return lucid_launch(col_im2col<T, 1>, grid, block, 0, stream, (const T *)x, (T *)col, a);
    if (s == 2)
        return lucid_launch(col_im2col<T, 2>, grid, block, 0, stream, (const T *)x, (T *)col, a);
    return lucid_launch(col_im2col<T, 0>, grid, block, 0, stream, (const T *)x, (T *)col, a);
}

/* col = im2col(x) */
static lucid_status col_fill(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                             const lucid_conv_col_geom *g, const void *x, void *col) {
    const ColArgs a = col_args(g);
    if (dt == LUCID_BF16)
        CUDA_CHECK(ctx, col_im2col_launch<__nv_bfloat16>(stream, a, x, col));
    else
        CUDA_CHECK(ctx, col_im2col_launch<__half>(stream, a, x, col));
    g_col_launches++;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// entry points

size_t lucid_conv_col_cols_bytes(const lucid_conv_col_geom *g) { return col_bytes(g, 2); }

int64_t lucid_conv_col_rows(const lucid_conv_col_geom *g) { return col_Kr(g); }

lucid_status lucid_conv_col_im2col(lucid_ctx *ctx, cudaStream_t stream, lucid_dtype dt,
                                   const lucid_conv_col_geom *g, const void *x, void *cols) {
    LUCID_TRY(col_check(ctx, "conv2d_forward (filter gradient columns)", dt, g, 2));
    if (!cols)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_forward (im2col GEMM route): columns NULL");
    return col_fill(ctx, stream, dt, g, x, cols);
}

lucid_status lucid_conv_col_forward(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                    lucid_dtype dt, const lucid_conv_col_geom *g,
                                    const void *x, const float *w, const void *wcast,
                                    const float *b, void *y, void *scratch) {
    return lucid_conv_col_forward_cols(ctx, h, stream, dt, g, x, w, wcast, b, y, scratch, NULL);
}

lucid_status lucid_conv_col_forward_cols(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                         lucid_dtype dt, const lucid_conv_col_geom *g,
                                         const void *x, const float *w, const void *wcast,
                                         const float *b, void *y, void *scratch, void *cols) {
    LUCID_TRY(col_check(ctx, "conv2d_forward", dt, g, 0));
    if (!cols) cols = scratch;
    LUCID_TRY(col_fill(ctx, stream, dt, g, x, cols));
    lucid_conv_gemm_geom gg = col_gemm_geom(g);
    void *gs = (char *)scratch + col_bytes(g, 2);
    const int64_t K = col_K(g), Kr = col_Kr(g);
    if (Kr != K) { /* the weight's rows padded into the GEMM's weight region (no shadow) */
        const int n = (int)(g->Cout * Kr);
        const unsigned blocks = lucid_cuda_blocks(n, 256);
        if (dt == LUCID_BF16)
            CUDA_CHECK(ctx, lucid_launch(col_wpad<__nv_bfloat16>, dim3(blocks), dim3(256), 0,
                                         stream, w, (__nv_bfloat16 *)gs, (int)K, (int)Kr, n));
        else
            CUDA_CHECK(ctx, lucid_launch(col_wpad<__half>, dim3(blocks), dim3(256), 0, stream, w,
                                         (__half *)gs, (int)K, (int)Kr, n));
        wcast = gs;
    }
    return lucid_conv_gemm_forward_wc(ctx, h, stream, dt, &gg, cols, w, wcast, b, y, gs);
}

int lucid_conv_col_dcols_geom(const lucid_conv_col_geom *g, lucid_dtype dt) {
    return g && lucid_conv_col_eligible(g, dt, 1) && g->kh == 3 && g->kw == 3 && g->sh == 1 &&
           g->sw == 1 && g->ph == 1 && g->pw == 1 && g->dh == 1 && g->dw == 1 &&
           (g->Cout * 9) % 8 == 0;
}

size_t lucid_conv_col_dcols_bytes(const lucid_conv_col_geom *g) {
    return (size_t)(g->N * g->Cout * 9 * g->H * g->W) * 2;
}

/* The backward-data; cols (nullable): the columns of dy already written
 * (lucid_conv_col_backward_data_cols), else im2col(dy) into scratch. */
static lucid_status col_backward_data(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                      lucid_dtype dt, const lucid_conv_col_geom *g,
                                      const void *dy, const void *cols, const float *w,
                                      const void *wflip, void *dx, float beta, void *scratch) {
    LUCID_TRY(col_check(ctx, "conv2d_backward_input", dt, g, 1));
    lucid_conv_col_geom t;
    col_dgrad_geom(g, dt, &t); /* eligible: stride 1, t valid */
    const int64_t Kt = col_Kr(&t), Pt = col_P(&t), nwf = g->Cin * Kt;
    const void *wf = wflip;
    if (!wf) { /* the per-call cast into scratch */
        void *d = (char *)scratch + col_bytes(&t, 2);
        const unsigned blocks = lucid_cuda_blocks(nwf, 256);
        if (dt == LUCID_BF16)
            CUDA_CHECK(ctx, lucid_launch(col_wflip<__nv_bfloat16>, dim3(blocks), dim3(256), 0,
                                         stream, w, (__nv_bfloat16 *)d, (int)g->Cin,
                                         (int)g->Cout, g->kh, g->kw, (int)Kt, (int)nwf));
        else
            CUDA_CHECK(ctx, lucid_launch(col_wflip<__half>, dim3(blocks), dim3(256), 0, stream, w,
                                         (__half *)d, (int)g->Cin, (int)g->Cout, g->kh, g->kw,
                                         (int)Kt, (int)nwf));
        wf = d;
    }
    if (!cols) {
        LUCID_TRY(col_fill(ctx, stream, dt, &t, dy, scratch));
        cols = scratch;
    }
    const cudaDataType_t adt = lucid_cuda_datatype(dt);
    const float one = 1.0f;
    /* per image, dX'[P x Cin] = col'[P x K'] . Wf'[K' x Cin] (column-major views as in
     * nn_conv_gemm.cu; beta applied by cuBLAS: dx = dt(acc + beta*dx)) */
    CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                          h, CUBLAS_OP_N, CUBLAS_OP_N, (int)Pt, (int)g->Cin, (int)Kt, &one,
                          cols, adt, (int)Pt, (long long)(Kt * Pt), wf, adt, (int)Kt, 0LL,
                          &beta, dx, adt, (int)Pt, (long long)(g->Cin * Pt), (int)g->N,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LUCID_OK;
}

lucid_status lucid_conv_col_backward_data(lucid_ctx *ctx, cublasHandle_t h,
                                          cudaStream_t stream, lucid_dtype dt,
                                          const lucid_conv_col_geom *g, const void *dy,
                                          const float *w, const void *wflip, void *dx,
                                          float beta, void *scratch) {
    return col_backward_data(ctx, h, stream, dt, g, dy, NULL, w, wflip, dx, beta, scratch);
}

lucid_status lucid_conv_col_backward_data_cols(lucid_ctx *ctx, cublasHandle_t h,
                                               cudaStream_t stream, lucid_dtype dt,
                                               const lucid_conv_col_geom *g, const void *cols,
                                               const float *w, const void *wflip, void *dx,
                                               float beta, void *scratch) {
    if (!cols)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_backward_input (im2col GEMM route): columns NULL");
    if (!lucid_conv_col_dcols_geom(g, dt)) {
        LUCID_TRY(col_check(ctx, "conv2d_backward_input", dt, g, 1));
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "conv2d_backward_input (im2col GEMM route): columns from the "
                            "BatchNorm need a 3x3 kernel, stride 1, padding 1, dilation 1 and "
                            "Cout*9 a multiple of 8 (Cout %lld, kernel %dx%d, stride %d,%d, "
                            "pad %d,%d, dilation %d,%d)",
                            (long long)g->Cout, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                            g->dh, g->dw);
    }
    return col_backward_data(ctx, h, stream, dt, g, NULL, cols, w, wflip, dx, beta, scratch);
}

lucid_status lucid_conv_col_backward_filter(lucid_ctx *ctx, cublasHandle_t h,
                                            cudaStream_t stream, lucid_dtype dt,
                                            const lucid_conv_col_geom *g, const void *x,
                                            const void *dy, float *dw, float beta,
                                            void *scratch) {
    LUCID_TRY(col_check(ctx, "conv2d_backward_params", dt, g, 2));
    LUCID_TRY(col_fill(ctx, stream, dt, g, x, scratch));
    lucid_conv_gemm_geom gg = col_gemm_geom(g);
    return lucid_conv_gemm_backward_filter_rows(ctx, h, stream, dt, &gg, col_K(g), scratch, dy,
                                                dw, beta, (char *)scratch + col_bytes(g, 2));
}

lucid_status lucid_conv_col_backward_filter_cols(lucid_ctx *ctx, cublasHandle_t h,
                                                 cudaStream_t stream, lucid_dtype dt,
                                                 const lucid_conv_col_geom *g, const void *cols,
                                                 const void *dy, float *dw, float beta,
                                                 void *scratch) {
    LUCID_TRY(col_check(ctx, "conv2d_backward_params", dt, g, 2));
    if (!cols)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "conv2d_backward_params (im2col GEMM route): columns NULL");
    lucid_conv_gemm_geom gg = col_gemm_geom(g);
    return lucid_conv_gemm_backward_filter_rows(ctx, h, stream, dt, &gg, col_K(g), cols, dy,
                                                dw, beta, (char *)scratch + col_bytes(g, 2));
}
