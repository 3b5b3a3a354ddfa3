/*
 * nn_conv_small.cu — direct 3x3 Conv2d (stride 1 or 2, padding 1) for few
 * channels in NCHW bf16/f16: forward and backward-data.  Interface,
 * definitions and numerics: nn_conv_small.cuh.
 *
 * A "pass" reads an input tensor `in` [N, Ci, Hi, Wi] and writes an output
 * tensor `out` [N, Co, Ho, Wo]; Ci is the reduced channel count:
 *   forward        in = x, out = y, Ci = Cin, Co = Cout (mode S1 or S2)
 *   backward s1    in = dy, out = dx, Ci = Cout, Co = Cin: the correlation
 *                  of dy with the kernel rotated by 180 degrees (pad 1,
 *                  stride 1), i.e. the forward kernel with the weights
 *                  staged as w[c][o][8 - t] (mode S1)
 *   backward s2    in = dy, out = dx: mode BWD2 below.
 *
 * Two generations: the v1 kernels described here (sc_conv, sc_bwd2: CUDA
 * cores, every eligible pass) and the v2 tensor-core kernel (sc2_conv,
 * described at its section below: forward and stride-1 backward-data with
 * Ci, Co <= 16).  The entry points take v2 where it applies unless
 * LUCID_CONV_SMALL_V=1 / lucid_conv_small_set_version(1) (nn_conv_small.cuh).
 *
 * v1.  Block.  A block owns an output tile of TW columns x TH rows of one image
 * and COT = CG*COB output channels (grid: tiles_w * tiles_h * N * ncos
 * blocks, ncos = ceil(Co / COT)).  Its threads are CG x RW warps: warp
 * (cg, rw) computes channels [cg*COB, cg*COB + COB) of the tile's rows
 * [rw*RH, rw*RH + RH); lane l one column (S1, S2: TW = 32, RH = 4 rows)
 * or the column pair 2l, 2l+1 (BWD2: TW = 64, RH = 4 rows as 2 row
 * pairs).  So each thread holds COB x 4 (S1/S2) or COB x 8 (BWD2) f32
 * accumulators.  COB = 8 when Co >= 16, else 4; CG = min(4, ceil(Co/COB));
 * RW = 8 / CG (256 threads), halved while the grid has fewer than
 * SC_TARGET_BLOCKS blocks or half the tile still covers the plane.
 *
 * Staging.  For each chunk of CIC input channels (CIC: the largest even
 * split that keeps the chunk under SC_SMEM_BUDGET), the block copies the
 * input rows its tile needs, with the halo, into shared memory as f32
 * (converted once), and the chunk's weights rounded to the activation dtype
 * and converted back to f32, laid out [c][tap][COT] so a warp reads its COB
 * weights of a tap as broadcast float4s.  Input rows are copied in items of
 * 8 elements aligned to 8 in the global row: one 16-byte load (two float4
 * shared stores) when the item is inside the row and W % 8 == 0 with an
 * aligned pointer, else element by element with zeros outside the plane.
 * A row's shared column j holds global column org + j, where org is a
 * multiple of 8 (S1/S2: the tile's first input column minus 8, so the left
 * halo column is j = 7; BWD2: the tile's first dy column).
 *
 * Compute.  S1/S2, per channel: the thread loads its (RH-1)*S+3 x 3 input
 * window (lanes read consecutive columns: conflict-free for S1; S2 reads
 * a float2 and a float, two wavefronts each), then for r, q: one weight
 * vector, 4 x COB fmaf.  BWD2: per channel the 3 x 2 dy window of the
 * thread (dy rows a..a+2, columns b, b+1), then for each of the 9 taps in
 * order, the taps' exact-division pattern fixed at compile time: dx(2a,2b)
 * takes tap (1,1) of dy(a,b); dx(2a,2b+1) taps (1,0) of dy(a,b+1) and
 * (1,2) of dy(a,b); dx(2a+1,2b) (0,1) of dy(a+1,b) and (2,1) of dy(a,b);
 * dx(2a+1,2b+1) (0,0),(0,2),(2,0),(2,2) of dy(a+1,b+1), dy(a+1,b),
 * dy(a,b+1), dy(a,b).  A dy row or column past the plane is a staged zero.
 *
 * Order (deterministic, independent of the tiling): per output, the f32
 * accumulator starts at the bias (forward) or 0, then channel ascending
 * (chunks run in order), then the taps in the order above, one fmaf each;
 * the store adds fmaf(beta, old, acc) when beta != 0 and rounds once.
 *
 * Every kernel opens with lucid_pdl_wait / lucid_pdl_launch_dependents
 * (launch.cuh) and is launched with lucid_launch.
 */
#include "nn_common.cuh"
#include "nn_conv_small.cuh"

#include <atomic>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#define SC_THREADS 256           /* largest block */
#define SC_ROWS 4                /* output rows per thread (S1, S2, BWD2) */
#define SC_TARGET_BLOCKS 264     /* shrink tiles until the grid has this many */
#define SC_SMEM_BUDGET (32 * 1024) /* bytes of one staged channel chunk (< 48 KiB) */

enum { SC_S1 = 0, SC_S2 = 1, SC_BWD2 = 2 };
/* weight staging: forward w[o][c][t], backward stride 1 w[c][o][8-t],
 * backward stride 2 w[c][o][t] */
enum { SC_W_FWD = 0, SC_W_BWD_FLIP = 1, SC_W_BWD = 2 };

namespace {

struct sc_args {
    const void *in;
    void *out;
    const float *w;
    const float *bias; /* forward only; NULL: none */
    float beta;        /* backward only; 0: out not read */
    int Ci, Hi, Wi;    /* reduced channels, input plane */
    int Co, Ho, Wo;    /* output channels, output plane */
    int wmode;         /* SC_W_* */
    int cg, rw;        /* channel groups, row warps (warps = cg * rw) */
    int th;            /* output rows per tile */
    int rows_in, sw, nch; /* staged rows per channel, shared row stride, items per row */
    int cic;           /* channels per staged chunk */
    int ncos, tiles_w, tiles_h;
    int vec_in;        /* 16-byte staging loads allowed */
    int vec_out;       /* BWD2: 4-byte pair accesses on out allowed */
};

struct sc_plan {
    int mode, cob;
    unsigned blocks, threads;
    size_t smem;
    sc_args a;
};

int64_t sc_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The switch, read once. */
struct sc_env {
    int route; /* 1 on, 0 off, -1 unknown value */
    char value[64];
};

sc_env sc_env_read(void) {
    sc_env e;
    const char *v = getenv("LUCID_CONV_SMALL");
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    if (!v || !v[0] || strcmp(v, "1") == 0) e.route = 1;
    else if (strcmp(v, "0") == 0) e.route = 0;
    else e.route = -1;
    return e;
}

/* Launch plan of one pass (0 forward, 1 backward-data) of an eligible g. */
void sc_plan_make(const lucid_conv_small_geom *g, int pass, sc_plan *p) {
    memset(p, 0, sizeof *p);
    sc_args &a = p->a;
    const int s = g->sh;
    if (pass == 0) {
        a.Ci = (int)g->Cin; a.Hi = (int)g->H; a.Wi = (int)g->W;
        a.Co = (int)g->Cout; a.Ho = (int)g->Ho; a.Wo = (int)g->Wo;
        p->mode = s == 1 ? SC_S1 : SC_S2;
        a.wmode = SC_W_FWD;
    } else {
        a.Ci = (int)g->Cout; a.Hi = (int)g->Ho; a.Wi = (int)g->Wo;
        a.Co = (int)g->Cin; a.Ho = (int)g->H; a.Wo = (int)g->W;
        p->mode = s == 1 ? SC_S1 : SC_BWD2;
        a.wmode = s == 1 ? SC_W_BWD_FLIP : SC_W_BWD;
    }
    p->cob = a.Co >= 16 ? 8 : 4;
    int64_t cg = sc_cdiv(a.Co, p->cob);
    a.cg = (int)(cg < 4 ? cg : 4);
    int cot = a.cg * p->cob;
    a.ncos = (int)sc_cdiv(a.Co, cot);
    int tw = p->mode == SC_BWD2 ? 64 : 32;
    a.tiles_w = (int)sc_cdiv(a.Wo, tw);
    int rw = (SC_THREADS / 32) / a.cg;
    int64_t blocks;
    for (;;) {
        int th = rw * SC_ROWS;
        blocks = (int64_t)a.tiles_w * sc_cdiv(a.Ho, th) * g->N * a.ncos;
        if (rw > 1 && (blocks < SC_TARGET_BLOCKS || (rw / 2) * SC_ROWS >= a.Ho)) {
            rw /= 2;
            continue;
        }
        break;
    }
    a.rw = rw;
    a.th = rw * SC_ROWS;
    a.tiles_h = (int)sc_cdiv(a.Ho, a.th);
    if (p->mode == SC_S1) {
        a.rows_in = a.th + 2;
        a.nch = 6; /* shared columns 7 .. 40 used */
    } else if (p->mode == SC_S2) {
        a.rows_in = 2 * a.th + 1;
        a.nch = 9; /* shared columns 7 .. 71 */
    } else {
        a.rows_in = a.th / 2 + 1;
        a.nch = 5; /* shared columns 0 .. 32 */
    }
    a.sw = a.nch * 8;
    size_t per_c = ((size_t)a.rows_in * a.sw + 9 * (size_t)cot) * sizeof(float);
    int64_t nchunks = sc_cdiv((int64_t)a.Ci * (int64_t)per_c, SC_SMEM_BUDGET);
    a.cic = (int)sc_cdiv(a.Ci, nchunks);
    p->smem = (size_t)a.cic * per_c;
    p->blocks = (unsigned)blocks;
    p->threads = 32u * (unsigned)(a.cg * a.rw);
}

} // namespace

// ----------------------------------------------------------------------------
// per-thread phases (host and device: spec/c/test_conv_small_emu.cu runs them
// on the CPU, one block at a time, every phase for all threads in turn, which
// is what the kernels' barriers guarantee)

#define SC_HD __host__ __device__ __forceinline__
/* "#pragma unroll" for the device pass only (the host compiler warns about it) */
#if defined(__CUDA_ARCH__)
#define SC_UNROLL _Pragma("unroll")
#else
#define SC_UNROLL
#endif

template <typename T> SC_HD float sc_f(T v);
template <> SC_HD float sc_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> SC_HD float sc_f<__half>(__half v) { return __half2float(v); }

template <typename T> SC_HD T sc_t(float v);
template <> SC_HD __nv_bfloat16 sc_t<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> SC_HD __half sc_t<__half>(float v) { return __float2half_rn(v); }

/* Two adjacent elements as one 4-byte word (rounded to nearest even each). */
template <typename T> struct sc_pair;
template <> struct sc_pair<__nv_bfloat16> {
    typedef __nv_bfloat162 type;
    static SC_HD float2 get(type v) { return __bfloat1622float2(v); }
    static SC_HD type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct sc_pair<__half> {
    typedef __half2 type;
    static SC_HD float2 get(type v) { return __half22float2(v); }
    static SC_HD type make(float a, float b) { return __floats2half2_rn(a, b); }
};

/* The element with bit pattern b. */
template <typename T> SC_HD T sc_from_bits(unsigned short b);
template <> SC_HD __nv_bfloat16 sc_from_bits<__nv_bfloat16>(unsigned short b) {
    __nv_bfloat16_raw r;
    r.x = b;
    return __nv_bfloat16(r);
}
template <> SC_HD __half sc_from_bits<__half>(unsigned short b) {
    __half_raw r;
    r.x = b;
    return __half(r);
}

/* 8 elements (one 16-byte word, element 0 in the low half of r.x) as floats. */
template <typename T>
SC_HD void sc_cvt8(const uint4 &r, float *f) {
    const unsigned u[4] = {r.x, r.y, r.z, r.w};
SC_UNROLL
    for (int k = 0; k < 4; k++) {
        f[2 * k] = sc_f<T>(sc_from_bits<T>((unsigned short)(u[k] & 0xffffu)));
        f[2 * k + 1] = sc_f<T>(sc_from_bits<T>((unsigned short)(u[k] >> 16)));
    }
}

/* A block's place: image n, channel super-group (first output channel
 * co0), first output row / column of the tile (S1/S2: y/dx; BWD2: the dy
 * row a0 and column b0 of the tile's first dx row/column pair), and the
 * global row / column of staged row 0 / shared column 0. */
struct sc_tile {
    int n, co0, r0, c0, row0, col0;
};

/* S: the stride of sc_conv (1 or 2), 0 for sc_bwd2. */
SC_HD sc_tile sc_tile_of(const sc_args &a, int S, int cob, int blk) {
    sc_tile t;
    int tx = blk % a.tiles_w;
    blk /= a.tiles_w;
    int ty = blk % a.tiles_h;
    blk /= a.tiles_h;
    int cs = blk % a.ncos;
    t.n = blk / a.ncos;
    t.co0 = cs * a.cg * cob;
    if (S == 0) { /* BWD2 */
        t.r0 = ty * (a.th / 2);
        t.c0 = tx * 32;
        t.row0 = t.r0;
        t.col0 = t.c0;
    } else {
        t.r0 = ty * a.th;
        t.c0 = tx * 32;
        t.row0 = t.r0 * S - 1;
        t.col0 = t.c0 * S - 8;
    }
    return t;
}

/* Stage channels [c0, c0 + cn) of image t.n: input rows [row0, row0 +
 * rows_in) (rows outside [0, Hi) are zeros) and shared columns [0, nch*8)
 * = global columns [col0, col0 + nch*8) (outside [0, Wi): zeros); then the
 * chunk's weights for output channels [co0, co0 + cot), rounded to T.
 * Thread tid of nthr takes items tid, tid + nthr, ... */
template <typename T>
SC_HD void sc_stage(const sc_args &a, float *sm, float *swt, const sc_tile &tl, int c0, int cn,
                    int cot, int tid, int nthr) {
    const T *in = (const T *)a.in;
    const int per_c = a.rows_in * a.nch;
    for (int it = tid; it < cn * per_c; it += nthr) {
        int c = it / per_c, rem = it - c * per_c;
        int row = rem / a.nch, k = rem - row * a.nch;
        int hi = tl.row0 + row, wi = tl.col0 + 8 * k;
        float f[8];
        if (hi >= 0 && hi < a.Hi) {
            const T *src = in + ((int64_t)(tl.n * a.Ci + c0 + c) * a.Hi + hi) * a.Wi;
            if (a.vec_in && wi >= 0 && wi + 8 <= a.Wi) {
                sc_cvt8<T>(*reinterpret_cast<const uint4 *>(src + wi), f);
            } else {
SC_UNROLL
                for (int e = 0; e < 8; e++)
                    f[e] = wi + e >= 0 && wi + e < a.Wi ? sc_f<T>(src[wi + e]) : 0.0f;
            }
        } else {
SC_UNROLL
            for (int e = 0; e < 8; e++) f[e] = 0.0f;
        }
        float4 *d = reinterpret_cast<float4 *>(sm + (c * a.rows_in + row) * a.sw + 8 * k);
        d[0] = make_float4(f[0], f[1], f[2], f[3]);
        d[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    for (int it = tid; it < cn * 9 * cot; it += nthr) {
        int o = it % cot, ct = it / cot;
        int t = ct % 9, c = ct / 9;
        int og = tl.co0 + o, cw = c0 + c;
        float v = 0.0f;
        if (og < a.Co) {
            int64_t wi = a.wmode == SC_W_FWD ? ((int64_t)og * a.Ci + cw) * 9 + t
                         : a.wmode == SC_W_BWD_FLIP ? ((int64_t)cw * a.Co + og) * 9 + (8 - t)
                                                    : ((int64_t)cw * a.Co + og) * 9 + t;
            v = sc_f<T>(sc_t<T>(a.w[wi]));
        }
        swt[it] = v; /* [c][t][o] */
    }
}

/* The COB weights of (channel c, tap t) for channel group cg. */
template <int COB>
SC_HD void sc_wload(const float *swt, int c, int t, int cot, int cg, float *wv) {
    const float4 *p = reinterpret_cast<const float4 *>(swt + (c * 9 + t) * cot + cg * COB);
SC_UNROLL
    for (int k = 0; k < COB / 4; k++) {
        float4 v = p[k];
        wv[4 * k] = v.x;
        wv[4 * k + 1] = v.y;
        wv[4 * k + 2] = v.z;
        wv[4 * k + 3] = v.w;
    }
}

/* ---- S1 / S2: thread (warp = cg * rw + rw index, lane) -> output column
 * c0 + lane, rows r0 + rw*4 .. +3, channels co0 + cg*COB .. +COB-1 */

template <int COB>
SC_HD void sc_conv_init(const sc_args &a, const sc_tile &tl, int tid,
                        float (&acc)[COB][SC_ROWS]) {
    const int warp = tid >> 5, cg = warp / a.rw;
SC_UNROLL
    for (int o = 0; o < COB; o++) {
        int og = tl.co0 + cg * COB + o;
        float b0 = a.bias && og < a.Co ? a.bias[og] : 0.0f;
SC_UNROLL
        for (int v = 0; v < SC_ROWS; v++) acc[o][v] = b0;
    }
}

/* Accumulate the staged channels [0, cn): per channel the 3 x ((4-1)*S+3)
 * input window, then r, q ascending. */
template <int S, int COB>
SC_HD void sc_conv_chunk(const sc_args &a, const float *sm, const float *swt, int cn, int cot,
                         int tid, float (&acc)[COB][SC_ROWS]) {
    constexpr int V = SC_ROWS, XR = (V - 1) * S + 3;
    const int lane = tid & 31, warp = tid >> 5;
    const int cg = warp / a.rw, rw = warp - cg * a.rw;
    /* shared column of tap q of output column lane: lane*S - 1 + q + 8 */
    const float *xb = sm + (rw * V * S) * a.sw + lane * S + 7;
    for (int c = 0; c < cn; c++) {
        const float *xc = xb + c * a.rows_in * a.sw;
        float xin[XR][3];
SC_UNROLL
        for (int rr = 0; rr < XR; rr++) {
            const float *xr = xc + rr * a.sw;
            if (S == 2) {
                xin[rr][0] = xr[0];
                float2 p = *reinterpret_cast<const float2 *>(xr + 1); /* even: aligned */
                xin[rr][1] = p.x;
                xin[rr][2] = p.y;
            } else {
SC_UNROLL
                for (int q = 0; q < 3; q++) xin[rr][q] = xr[q];
            }
        }
SC_UNROLL
        for (int r = 0; r < 3; r++)
SC_UNROLL
            for (int q = 0; q < 3; q++) {
                float wv[COB];
                sc_wload<COB>(swt, c, r * 3 + q, cot, cg, wv);
SC_UNROLL
                for (int v = 0; v < V; v++)
SC_UNROLL
                    for (int o = 0; o < COB; o++)
                        acc[o][v] = fmaf(wv[o], xin[v * S + r][q], acc[o][v]);
            }
    }
}

template <typename T, int COB>
SC_HD void sc_conv_store(const sc_args &a, const sc_tile &tl, int tid,
                         const float (&acc)[COB][SC_ROWS]) {
    const int lane = tid & 31, warp = tid >> 5;
    const int cg = warp / a.rw, rw = warp - cg * a.rw;
    T *out = (T *)a.out;
    const int wo = tl.c0 + lane;
    if (wo >= a.Wo) return;
SC_UNROLL
    for (int o = 0; o < COB; o++) {
        int og = tl.co0 + cg * COB + o;
        T *po = out + ((int64_t)(tl.n * a.Co + og) * a.Ho) * a.Wo + wo;
SC_UNROLL
        for (int v = 0; v < SC_ROWS; v++) {
            int ho = tl.r0 + rw * SC_ROWS + v;
            if (og < a.Co && ho < a.Ho) {
                float r = acc[o][v];
                if (a.beta != 0.0f) r = fmaf(a.beta, sc_f<T>(po[(int64_t)ho * a.Wo]), r);
                po[(int64_t)ho * a.Wo] = sc_t<T>(r);
            }
        }
    }
}

/* ---- BWD2: thread -> dy column b = b0 + lane, dy rows a = a0 + rw*2 + i
 * (i = 0, 1); dx rows 2a + pr, columns 2b + pc; acc[o][i][pr*2 + pc] */

#define SC_VR (SC_ROWS / 2)

template <int COB>
SC_HD void sc_bwd2_chunk(const sc_args &a, const float *sm, const float *swt, int cn, int cot,
                         int tid, float (&acc)[COB][SC_VR][4]) {
    const int lane = tid & 31, warp = tid >> 5;
    const int cg = warp / a.rw, rw = warp - cg * a.rw;
    const float *db = sm + (rw * SC_VR) * a.sw + lane;
    for (int c = 0; c < cn; c++) {
        const float *dc = db + c * a.rows_in * a.sw;
        float d[SC_VR + 1][2];
SC_UNROLL
        for (int ii = 0; ii <= SC_VR; ii++) {
            d[ii][0] = dc[ii * a.sw];
            d[ii][1] = dc[ii * a.sw + 1];
        }
SC_UNROLL
        for (int t = 0; t < 9; t++) {
            const int r = t / 3, q = t % 3;
            const int ph = (r != 1) * 2 + (q != 1); /* dx row/column parity */
            const int di = r == 0, dj = q == 0;     /* dy offset (a+1 / b+1) */
            float wv[COB];
            sc_wload<COB>(swt, c, t, cot, cg, wv);
SC_UNROLL
            for (int i = 0; i < SC_VR; i++)
SC_UNROLL
                for (int o = 0; o < COB; o++)
                    acc[o][i][ph] = fmaf(wv[o], d[i + di][dj], acc[o][i][ph]);
        }
    }
}

template <typename T, int COB>
SC_HD void sc_bwd2_store(const sc_args &a, const sc_tile &tl, int tid,
                         const float (&acc)[COB][SC_VR][4]) {
    const int lane = tid & 31, warp = tid >> 5;
    const int cg = warp / a.rw, rw = warp - cg * a.rw;
    T *out = (T *)a.out;
    const int wc = 2 * (tl.c0 + lane);
    if (wc >= a.Wo) return;
    const bool pair = a.vec_out && wc + 1 < a.Wo;
SC_UNROLL
    for (int o = 0; o < COB; o++) {
        int og = tl.co0 + cg * COB + o;
        T *po = out + ((int64_t)(tl.n * a.Co + og) * a.Ho) * a.Wo + wc;
SC_UNROLL
        for (int i = 0; i < SC_VR; i++)
SC_UNROLL
            for (int pr = 0; pr < 2; pr++) {
                int h = 2 * (tl.r0 + rw * SC_VR + i) + pr;
                if (og >= a.Co || h >= a.Ho) continue;
                T *p = po + (int64_t)h * a.Wo;
                float r0 = acc[o][i][pr * 2], r1 = acc[o][i][pr * 2 + 1];
                if (pair) {
                    typedef typename sc_pair<T>::type P;
                    P *pp = reinterpret_cast<P *>(p);
                    if (a.beta != 0.0f) {
                        float2 old = sc_pair<T>::get(*pp);
                        r0 = fmaf(a.beta, old.x, r0);
                        r1 = fmaf(a.beta, old.y, r1);
                    }
                    *pp = sc_pair<T>::make(r0, r1);
                } else {
                    if (a.beta != 0.0f) r0 = fmaf(a.beta, sc_f<T>(p[0]), r0);
                    p[0] = sc_t<T>(r0);
                    if (wc + 1 < a.Wo) {
                        if (a.beta != 0.0f) r1 = fmaf(a.beta, sc_f<T>(p[1]), r1);
                        p[1] = sc_t<T>(r1);
                    }
                }
            }
    }
}

// ----------------------------------------------------------------------------
// kernels

/* Forward (S = 1 or 2) and stride-1 backward-data (S = 1, flipped weights). */
template <typename T, int S, int COB>
static __global__ void __launch_bounds__(SC_THREADS, 2)
sc_conv(sc_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ float4 sc_smem4[];
    float *sm = reinterpret_cast<float *>(sc_smem4);
    float *swt = sm + a.cic * a.rows_in * a.sw;
    const int tid = threadIdx.x, cot = a.cg * COB;
    const sc_tile tl = sc_tile_of(a, S, COB, blockIdx.x);
    float acc[COB][SC_ROWS];
    sc_conv_init<COB>(a, tl, tid, acc);
    for (int c0 = 0; c0 < a.Ci; c0 += a.cic) {
        const int cn = min(a.cic, a.Ci - c0);
        if (c0) __syncthreads(); /* the previous chunk is consumed */
        sc_stage<T>(a, sm, swt, tl, c0, cn, cot, tid, blockDim.x);
        __syncthreads();
        sc_conv_chunk<S, COB>(a, sm, swt, cn, cot, tid, acc);
    }
    sc_conv_store<T, COB>(a, tl, tid, acc);
}

/* Stride-2 backward-data. */
template <typename T, int COB>
static __global__ void __launch_bounds__(SC_THREADS, 2)
sc_bwd2(sc_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ float4 sc_smem4[];
    float *sm = reinterpret_cast<float *>(sc_smem4);
    float *swt = sm + a.cic * a.rows_in * a.sw;
    const int tid = threadIdx.x, cot = a.cg * COB;
    const sc_tile tl = sc_tile_of(a, 0, COB, blockIdx.x);
    float acc[COB][SC_VR][4];
#pragma unroll
    for (int o = 0; o < COB; o++)
#pragma unroll
        for (int i = 0; i < SC_VR; i++)
#pragma unroll
            for (int ph = 0; ph < 4; ph++) acc[o][i][ph] = 0.0f;
    for (int c0 = 0; c0 < a.Ci; c0 += a.cic) {
        const int cn = min(a.cic, a.Ci - c0);
        if (c0) __syncthreads();
        sc_stage<T>(a, sm, swt, tl, c0, cn, cot, tid, blockDim.x);
        __syncthreads();
        sc_bwd2_chunk<COB>(a, sm, swt, cn, cot, tid, acc);
    }
    sc_bwd2_store<T, COB>(a, tl, tid, acc);
}

// ============================================================================
// v2: the tensor-core kernels (the default; LUCID_CONV_SMALL_V=1 or
// lucid_conv_small_set_version(1) keeps the v1 kernels above for every pass)
//
// Which passes: the forward with stride 1 or 2 and the stride-1
// backward-data, whenever the pass's reduced channels Ci and its output
// channels Co are both <= 16 (sc2_plan_make); the rest (the stride-2
// backward-data, wider channel counts) stays on v1.
//
// The product.  A pass is a GEMM per output row segment: D[o][p] = sum_k
// A[o][k] * B[k][p], o the output channel (M = 16 rows, those >= Co zero),
// p one of 8 output pixels of a row (N = 8), k a (kernel tap, input
// channel) pair.  One warp owns 32 consecutive output columns ("strip") of
// SC2_TR = 2 output rows and all Co channels: 4 n-tiles x 2 rows of
// m16n8 f32 accumulators (32 registers).  mma.sync.m16n8k16 (Ci in 9..16:
// one step = one tap, 16 channels) or m16n8k8 (Ci in 5..8: one tap, 8
// channels; Ci <= 4: two taps of one kernel row, 4 channels, the fourth
// tap of a row a padding tap with weight 0 reading the third tap's input).
// Steps per kernel row G = 3 (Ci > 4) or 2; NSTEP = 3*G.
//
// Grid: tiles_w x ceil(Ho/2) x N blocks of TW threads (one warp per 32
// columns), TW the output row cut into as few equal tiles of whole warps,
// at most 256 columns, as keep the dynamic shared memory under 48 KiB
// (the network: 160 columns, 5 warps; 320 and 1280 blocks).
//
// Shared memory.  The block's input rows, with the halo, as "pair planes":
// word [cp][row][col] holds channels 2cp (low half) and 2cp+1 (high half)
// of one input pixel, so that a B-fragment register (two consecutive k of
// one pixel) is one 32-bit load.  Ci is padded to 2*CP2 channels with
// zeros (CP2 = 2, 4, 8).  Stride 1: staged columns [c0-8, c0+TW+8) of the
// input, word index = column - (c0-8).  Stride 2: staged columns
// [2c0-8, 2c0+2TW+8), split into the even columns (words [0, TWE)) and the
// odd ones (words [TWE, 2TWE)), TWE = TW+8, so that the 8 pixels of an
// n-tile read consecutive words.  Plane cp starts at cp*PSW + 2*(cp & 3)
// words (PSW a multiple of 32): with the n-tile's pixel order below the 4
// lane quads of a B load hit disjoint banks (one wavefront per load when
// Ci > 4; 1.5 on average when Ci <= 4), and a warp's 8-byte staging
// stores (cp fastest across lanes) take two wavefronts each, the least for
// 256 bytes.  The weights follow, already
// in A-fragment order: word [(s*4 + reg)*33 + lane] (rounded to the
// activation dtype from the f32 master weight, once per block).
//
// Pixel order.  n-tile nt (0..3) column n (0..7) of a strip is pixel
// 8*(n>>1) + 2*nt + (n&1) of the strip, so lane (g, t) of the C fragment
// (rows g, g+8; columns 2t, 2t+1 of each n-tile) holds pixels 8t..8t+7 of
// channels g and g+8: one 16-byte store (or load, for beta) each.
//
// Per block: stage (inputs and packed weights; SC2_U items per thread
// loaded before any is stored, so one memory latency per block), barrier,
// each lane loads its A fragments (all steps: <= 36 registers), then per
// staged input row and step group the B fragments once, used by each of the
// TR output rows that reads that input row (stride 1: 4 staged rows for 2
// output rows), then the store.
//
// Order (deterministic, independent of the tiling and the alignment): per
// output the f32 accumulator starts at the bias (forward) or 0, then one
// mma per step in the order of the kernel row r ascending and, within r,
// the step (tap q ascending; Ci <= 4: taps 0,1 then 2) ascending; each mma
// adds its 16 (or 8) exact products of dt values to the accumulator in the
// tensor core's own fixed way (not an fmaf chain: bits can differ from
// v1 and between GPU generations, never between runs).  The store adds
// fmaf(beta, old, acc) when beta != 0 and rounds once.
// ============================================================================

#define SC2_TR 2            /* output rows per tile */
#define SC2_TWMAX 256       /* widest tile: 8 warps of 32 columns */
#define SC2_THREADS 256     /* largest block */
#define SC2_WROW 33         /* words per packed weight row: 32 lanes + 1 */
/* staging items of each kind per thread in flight (more for 16 channels) */
#define SC2_U(CP2) ((CP2) == 8 ? 6 : 4)
#define SC2_SMEM_MAX (48 * 1024)

/* Compile-time shape of the k dimension for CP2 channel pairs. */
template <int CP2> struct sc2_k {
    static constexpr bool K16 = CP2 == 8;       /* m16n8k16, else m16n8k8 */
    static constexpr int KR = K16 ? 2 : 1;      /* B registers per n-tile and step */
    static constexpr int AR = K16 ? 4 : 2;      /* A registers per step */
    static constexpr int G = CP2 == 2 ? 2 : 3;  /* steps per kernel row */
    static constexpr int NSTEP = 3 * G;
    static constexpr int TT = CP2 == 2 ? 12 : 9; /* weight-build taps per pair (12: 4 per row) */
};

namespace {

struct sc2_args {
    const void *in;
    void *out;
    const float *w;
    const float *bias; /* forward only; NULL: none */
    float beta;        /* backward only; 0: out not read */
    int Ci, Hi, Wi;    /* reduced channels, input plane */
    int Co, Ho, Wo;    /* output channels, output plane */
    int wmode;         /* SC_W_FWD or SC_W_BWD_FLIP */
    int tw;            /* output columns per tile: 32 per warp */
    int tiles_w, tiles_h;
    int rsw;           /* words per staged row */
    int twe;           /* stride 2: words of the even-column half of a row */
    int psw;           /* words per pair plane (a multiple of 32) */
    int nch;           /* 8-column chunks per staged row */
    int vec_in;        /* 16-byte staging loads allowed */
    int vec_out;       /* 16-byte stores (and beta loads) allowed */
};

struct sc2_plan {
    int S, cp2;
    unsigned blocks, threads;
    size_t smem;
    sc2_args a;
};

int sc2_cp2_of(int Ci) { return Ci <= 4 ? 2 : Ci <= 8 ? 4 : 8; }

/* Derived layout of a plan whose S, cp2 and a.tw are set; the dynamic
 * shared memory in bytes. */
size_t sc2_layout(sc2_plan *p) {
    sc2_args &a = p->a;
    const int S = p->S, ri = (SC2_TR - 1) * S + 3, G = p->cp2 == 2 ? 2 : 3;
    if (S == 1) {
        a.twe = 0;
        a.rsw = a.tw + 16;
        a.nch = a.rsw / 8;
    } else {
        a.twe = a.tw + 8;
        a.rsw = 2 * a.twe;
        a.nch = (2 * a.tw + 16) / 8;
    }
    /* + 8: plane cp's skew (2*(cp & 3) <= 6 words) never reaches plane cp+1 */
    a.psw = (int)(sc_cdiv((int64_t)ri * a.rsw + 8, 32) * 32);
    size_t words = (size_t)p->cp2 * a.psw + 8 + (size_t)3 * G * 4 * SC2_WROW;
    return words * sizeof(uint32_t);
}

/* The v2 launch plan of pass (0 forward, 1 backward-data) of an eligible g;
 * 0 when v2 does not take the pass.  tw_force > 0 (a multiple of 32, at
 * most SC2_TWMAX): that tile width (tests). */
int sc2_plan_make(const lucid_conv_small_geom *g, int pass, sc2_plan *p, int tw_force) {
    memset(p, 0, sizeof *p);
    sc2_args &a = p->a;
    const int s = g->sh;
    if (pass == 0) {
        a.Ci = (int)g->Cin; a.Hi = (int)g->H; a.Wi = (int)g->W;
        a.Co = (int)g->Cout; a.Ho = (int)g->Ho; a.Wo = (int)g->Wo;
        a.wmode = SC_W_FWD;
    } else {
        if (s != 1) return 0;
        a.Ci = (int)g->Cout; a.Hi = (int)g->Ho; a.Wi = (int)g->Wo;
        a.Co = (int)g->Cin; a.Ho = (int)g->H; a.Wo = (int)g->W;
        a.wmode = SC_W_BWD_FLIP;
    }
    if (a.Ci > 16 || a.Co > 16) return 0;
    p->S = s;
    p->cp2 = sc2_cp2_of(a.Ci);
    /* tile width: the plane in as few equal tiles of whole warps as fit the
     * shared-memory limit */
    size_t smem = 0;
    for (int twmax = SC2_TWMAX; twmax >= 32; twmax -= 32) {
        int64_t ntw = sc_cdiv(a.Wo, twmax);
        a.tw = tw_force > 0 ? tw_force : (int)(32 * sc_cdiv(sc_cdiv(a.Wo, ntw), 32));
        smem = sc2_layout(p);
        if (smem < SC2_SMEM_MAX || tw_force > 0) break;
    }
    if (smem >= SC2_SMEM_MAX) return 0;
    a.tiles_w = (int)sc_cdiv(a.Wo, a.tw);
    a.tiles_h = (int)sc_cdiv(a.Ho, SC2_TR);
    p->blocks = (unsigned)((int64_t)a.tiles_w * a.tiles_h * g->N);
    p->threads = (unsigned)a.tw;
    p->smem = smem;
    return 1;
}

} // namespace

/* A v2 block's place: image n, first output row i0 and column c0, and the
 * input row / column of staged row 0 / column 0. */
struct sc2_tile {
    int n, i0, c0, row0, col0;
};

SC_HD sc2_tile sc2_tile_of(const sc2_args &a, int S, int blk) {
    sc2_tile t;
    int tx = blk % a.tiles_w;
    blk /= a.tiles_w;
    int ty = blk % a.tiles_h;
    t.n = blk / a.tiles_h;
    t.c0 = tx * a.tw;
    t.i0 = ty * SC2_TR;
    t.row0 = t.i0 * S - 1;
    t.col0 = t.c0 * S - 8;
    return t;
}

/* The 16 bits of v. */
template <typename T> SC_HD unsigned sc_bits(T v);
template <> SC_HD unsigned sc_bits<__nv_bfloat16>(__nv_bfloat16 v) {
    __nv_bfloat16_raw r = v;
    return r.x;
}
template <> SC_HD unsigned sc_bits<__half>(__half v) {
    __half_raw r = v;
    return r.x;
}

/* 16 bytes of global memory, read-only for the kernel's lifetime. */
SC_HD uint4 sc2_ld16(const unsigned short *p) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const uint4 *>(p));
#else
    return *reinterpret_cast<const uint4 *>(p);
#endif
}

/* Pair plane cp's first word. */
SC_HD int sc2_plane(const sc2_args &a, int cp) { return cp * a.psw + 2 * (cp & 3); }

/* Load staging item `it` (cp fastest, then the 8-column chunk k, then the
 * staged row rr): channels 2cp and 2cp+1 (zeros past Ci), input row
 * row0 + rr (zeros outside the plane), columns col0 + 8k .. +7 (zeros
 * outside the plane), as raw 16-bit elements, element 0 in the low half of
 * .x. */
template <int CP2>
SC_HD void sc2_in_load(const sc2_args &a, const sc2_tile &tl, int it, uint4 (&v)[2]) {
    const unsigned short *in = (const unsigned short *)a.in;
    const int cp = it % CP2, rest = it / CP2;
    const int k = rest % a.nch, rr = rest / a.nch;
    const int hi = tl.row0 + rr, col = tl.col0 + 8 * k;
SC_UNROLL
    for (int e = 0; e < 2; e++) {
        const int c = 2 * cp + e;
        v[e] = make_uint4(0u, 0u, 0u, 0u);
        if (c >= a.Ci || hi < 0 || hi >= a.Hi) continue;
        const unsigned short *src = in + ((int64_t)(tl.n * a.Ci + c) * a.Hi + hi) * a.Wi;
        if (a.vec_in && col >= 0 && col + 8 <= a.Wi) {
            v[e] = sc2_ld16(src + col);
        } else {
            unsigned h[8];
SC_UNROLL
            for (int j = 0; j < 8; j++) h[j] = col + j >= 0 && col + j < a.Wi ? src[col + j] : 0u;
            v[e] = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                              h[6] | h[7] << 16);
        }
    }
}

/* Store item `it` (loaded by sc2_in_load) into its pair plane: word j of
 * the chunk = (channel 2cp, channel 2cp+1) of column 8k + j. */
template <int S, int CP2>
SC_HD void sc2_in_store(const sc2_args &a, uint32_t *sm, int it, const uint4 (&v)[2]) {
    const int cp = it % CP2, rest = it / CP2;
    const int k = rest % a.nch, rr = rest / a.nch;
    const unsigned lo[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
    const unsigned hi[4] = {v[1].x, v[1].y, v[1].z, v[1].w};
    unsigned wd[8];
SC_UNROLL
    for (int m = 0; m < 4; m++) {
        wd[2 * m] = (lo[m] & 0xffffu) | (hi[m] << 16);
        wd[2 * m + 1] = (lo[m] >> 16) | (hi[m] & 0xffff0000u);
    }
    uint32_t *row = sm + sc2_plane(a, cp) + rr * a.rsw; /* 8-byte aligned */
    if (S == 1) {
        uint2 *d = reinterpret_cast<uint2 *>(row + 8 * k);
        d[0] = make_uint2(wd[0], wd[1]);
        d[1] = make_uint2(wd[2], wd[3]);
        d[2] = make_uint2(wd[4], wd[5]);
        d[3] = make_uint2(wd[6], wd[7]);
    } else {
        uint2 *de = reinterpret_cast<uint2 *>(row + 4 * k);
        uint2 *dd = reinterpret_cast<uint2 *>(row + a.twe + 4 * k);
        de[0] = make_uint2(wd[0], wd[2]);
        de[1] = make_uint2(wd[4], wd[6]);
        dd[0] = make_uint2(wd[1], wd[3]);
        dd[1] = make_uint2(wd[5], wd[7]);
    }
}

/* Weight-build position `it` (tap fastest, then the pair cp, then the
 * output row o of the 16-row A tile): its kernel row r, tap column q (q 3:
 * the padding tap of CP2 2) and its packed word index. */
template <int CP2>
SC_HD void sc2_wpos(int it, int &o, int &cp, int &r, int &q, int &word) {
    typedef sc2_k<CP2> K;
    const int tt = it % K::TT, rest = it / K::TT;
    cp = rest % CP2;
    o = rest / CP2;
    r = CP2 == 2 ? tt >> 2 : tt / 3;
    q = CP2 == 2 ? tt & 3 : tt % 3;
    const int s = CP2 == 2 ? r * 2 + (q >> 1) : r * 3 + q;
    const int kp = CP2 == 2 ? ((q & 1) << 1) | cp : cp; /* pair within the step */
    const int reg = (o >> 3) + 2 * (kp >> 2), lane = (o & 7) * 4 + (kp & 3);
    word = (s * 4 + reg) * SC2_WROW + lane;
}

/* The two f32 weights of position `it` (channels 2cp, 2cp+1 of output
 * channel o at tap (r, q) of the pass; 0 past Ci / Co and for the padding
 * tap). */
template <int CP2>
SC_HD void sc2_w_load(const sc2_args &a, int it, float (&f)[2]) {
    int o, cp, r, q, word;
    sc2_wpos<CP2>(it, o, cp, r, q, word);
    f[0] = f[1] = 0.0f;
    if (q > 2 || o >= a.Co) return;
    const int t = r * 3 + q;
SC_UNROLL
    for (int e = 0; e < 2; e++) {
        const int c = 2 * cp + e;
        if (c >= a.Ci) continue;
        f[e] = a.wmode == SC_W_FWD ? a.w[(o * a.Ci + c) * 9 + t]
                                   : a.w[(c * a.Co + o) * 9 + (8 - t)];
    }
}

template <typename T, int CP2>
SC_HD void sc2_w_store(uint32_t *swt, int it, const float (&f)[2]) {
    int o, cp, r, q, word;
    sc2_wpos<CP2>(it, o, cp, r, q, word);
    swt[word] = sc_bits<T>(sc_t<T>(f[0])) | sc_bits<T>(sc_t<T>(f[1])) << 16;
}

/* Stage the block's input pair planes and its packed weights.  Thread tid
 * of nthr takes items tid, tid + nthr, ...; SC2_U of each kind are loaded
 * before any is stored. */
template <typename T, int S, int CP2>
SC_HD void sc2_stage(const sc2_args &a, uint32_t *sm, const sc2_tile &tl, int tid, int nthr) {
    typedef sc2_k<CP2> K;
    constexpr int RI = (SC2_TR - 1) * S + 3;
    uint32_t *swt = sm + CP2 * a.psw + 8;
    /* A rows 8..15 only when Co > 8 (else sc2_lane_init zeroes them) */
    const int nin = CP2 * RI * a.nch, nw = (a.Co > 8 ? 16 : 8) * CP2 * K::TT;
    const int nall = nin > nw ? nin : nw;
    constexpr int U = SC2_U(CP2);
    for (int b0 = tid; b0 < nall; b0 += U * nthr) {
        uint4 v[U][2];
        float f[U][2];
SC_UNROLL
        for (int u = 0; u < U; u++) {
            const int it = b0 + u * nthr;
            if (it < nin) sc2_in_load<CP2>(a, tl, it, v[u]);
            if (it < nw) sc2_w_load<CP2>(a, it, f[u]);
        }
SC_UNROLL
        for (int u = 0; u < U; u++) {
            const int it = b0 + u * nthr;
            if (it < nin) sc2_in_store<S, CP2>(a, sm, it, v[u]);
            if (it < nw) sc2_w_store<T, CP2>(swt, it, f[u]);
        }
    }
}

/* One lane's registers: its A fragments of every step, its accumulators
 * (output row i of the tile, n-tile nt, C registers 0..3), and its B-load
 * word offsets per step group and B register (row 0, n-tile 0). */
template <int S, int CP2> struct sc2_lane {
    uint32_t A[sc2_k<CP2>::NSTEP][sc2_k<CP2>::AR];
    float acc[SC2_TR][4][4];
    int off[sc2_k<CP2>::G][sc2_k<CP2>::KR];
};

/* After the staging barrier: lanes lane0 .. lane0+L-1 of warp `warp` (the
 * kernel: L = 1, its own lane; the host emulation: L = 32, lane0 = 0). */
template <int S, int CP2, int L>
SC_HD void sc2_lane_init(const sc2_args &a, const uint32_t *sm, int warp, int lane0,
                         sc2_lane<S, CP2> *ln) {
    typedef sc2_k<CP2> K;
    const uint32_t *swt = sm + CP2 * a.psw + 8;
    for (int l = 0; l < L; l++) {
        const int lane = lane0 + l, g = lane >> 2, tq = lane & 3;
        sc2_lane<S, CP2> &x = ln[l];
SC_UNROLL
        for (int s = 0; s < K::NSTEP; s++)
SC_UNROLL
            for (int r = 0; r < K::AR; r++)
                x.A[s][r] = (r & 1) && a.Co <= 8 ? 0u : swt[(s * 4 + r) * SC2_WROW + lane];
        const float b0 = a.bias && g < a.Co ? a.bias[g] : 0.0f;
        const float b1 = a.bias && g + 8 < a.Co ? a.bias[g + 8] : 0.0f;
SC_UNROLL
        for (int i = 0; i < SC2_TR; i++)
SC_UNROLL
            for (int nt = 0; nt < 4; nt++) {
                x.acc[i][nt][0] = x.acc[i][nt][1] = b0;
                x.acc[i][nt][2] = x.acc[i][nt][3] = b1;
            }
        /* the lane's B column is pixel p0 (+ 2*nt) of the tile */
        const int p0 = 32 * warp + 8 * (g >> 1) + (g & 1);
SC_UNROLL
        for (int grp = 0; grp < K::G; grp++)
SC_UNROLL
            for (int k = 0; k < K::KR; k++) {
                int cp, q;
                if (CP2 == 2) {
                    cp = tq & 1;
                    q = 2 * grp + (tq >> 1);
                    if (q > 2) q = 2; /* padding tap (weight 0): the third tap's input */
                } else {
                    cp = tq + 4 * k;
                    q = grp;
                }
                const int col = S == 1 ? p0 + q + 7
                                       : q == 1 ? p0 + 4 : a.twe + p0 + 3 + (q >> 1);
                x.off[grp][k] = sc2_plane(a, cp) + col;
            }
    }
}

/* acc[i][nt] += A[s] * B[nt] over the warp's lanes (device: mma.sync on
 * this lane's fragments; host: the PTX fragment layout of m16n8k16 /
 * m16n8k8 emulated for lanes 0..L-1, L = 32, each product added with fmaf
 * in k order). */
template <typename T, int S, int CP2, int L>
SC_HD void sc2_mma(sc2_lane<S, CP2> *ln, int i, int nt, int s,
                   const uint32_t (&b)[L][4][sc2_k<CP2>::KR]) {
    typedef sc2_k<CP2> K;
#if defined(__CUDA_ARCH__)
    float *d = ln[0].acc[i][nt];
    const uint32_t *A = ln[0].A[s];
    if constexpr (K::K16) {
        if constexpr (std::is_same<T, __half>::value)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(b[0][nt][0]),
                  "r"(b[0][nt][1]));
        else
            asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(b[0][nt][0]),
                  "r"(b[0][nt][1]));
    } else {
        if constexpr (std::is_same<T, __half>::value)
            asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                "{%4,%5}, {%6}, {%0,%1,%2,%3};"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(A[0]), "r"(A[1]), "r"(b[0][nt][0]));
        else
            asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                "{%4,%5}, {%6}, {%0,%1,%2,%3};"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(A[0]), "r"(A[1]), "r"(b[0][nt][0]));
    }
#else
    constexpr int KK = K::K16 ? 16 : 8;
    float Am[16][16], Bm[16][8], Cm[16][8];
    auto el = [](uint32_t w, int h) { return sc_f<T>(sc_from_bits<T>((unsigned short)(h ? w >> 16 : w & 0xffffu))); };
    for (int l = 0; l < L; l++) {
        const int g = l >> 2, tq = l & 3;
        for (int r = 0; r < K::AR; r++) { /* R0 (g, 2t), R1 (g+8, 2t), R2 (g, 2t+8), R3 (g+8, 2t+8) */
            const int row = g + 8 * (r & 1), col = 2 * tq + 8 * (r >> 1);
            Am[row][col] = el(ln[l].A[s][r], 0);
            Am[row][col + 1] = el(ln[l].A[s][r], 1);
        }
        for (int k = 0; k < K::KR; k++) { /* B0 (2t, g), B1 (2t+8, g) */
            Bm[2 * tq + 8 * k][g] = el(b[l][nt][k], 0);
            Bm[2 * tq + 8 * k + 1][g] = el(b[l][nt][k], 1);
        }
        for (int c = 0; c < 4; c++) Cm[g + 8 * (c >> 1)][2 * tq + (c & 1)] = ln[l].acc[i][nt][c];
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++)
            for (int k = 0; k < KK; k++) Cm[m][n] = fmaf(Am[m][k], Bm[k][n], Cm[m][n]);
    for (int l = 0; l < L; l++) {
        const int g = l >> 2, tq = l & 3;
        for (int c = 0; c < 4; c++) ln[l].acc[i][nt][c] = Cm[g + 8 * (c >> 1)][2 * tq + (c & 1)];
    }
#endif
}

/* The block's product: for each staged row ri and step group, each lane's
 * B fragments of its 4 n-tiles once, then one mma per n-tile for each
 * output row i of the tile that reads row ri (kernel row r = ri - i*S). */
template <typename T, int S, int CP2, int L>
SC_HD void sc2_compute(const sc2_args &a, const uint32_t *sm, sc2_lane<S, CP2> *ln) {
    typedef sc2_k<CP2> K;
    constexpr int RI = (SC2_TR - 1) * S + 3;
SC_UNROLL
    for (int ri = 0; ri < RI; ri++)
SC_UNROLL
        for (int grp = 0; grp < K::G; grp++) {
            uint32_t b[L][4][K::KR];
            for (int l = 0; l < L; l++)
SC_UNROLL
                for (int nt = 0; nt < 4; nt++)
SC_UNROLL
                    for (int k = 0; k < K::KR; k++)
                        b[l][nt][k] = sm[ln[l].off[grp][k] + ri * a.rsw + 2 * nt];
SC_UNROLL
            for (int i = 0; i < SC2_TR; i++) {
                const int r = ri - i * S;
                if (r < 0 || r > 2) continue;
SC_UNROLL
                for (int nt = 0; nt < 4; nt++) sc2_mma<T, S, CP2, L>(ln, i, nt, r * K::G + grp, b);
            }
        }
}

/* Lane (g, t): channels g and g+8, pixels 8t .. 8t+7 of its warp's strip,
 * for each output row of the tile; 16-byte stores where the row allows. */
template <typename T, int S, int CP2, int L>
SC_HD void sc2_store(const sc2_args &a, const sc2_tile &tl, int warp, int lane0,
                     const sc2_lane<S, CP2> *ln) {
    T *out = (T *)a.out;
    typedef typename sc_pair<T>::type P;
    for (int l = 0; l < L; l++) {
        const int lane = lane0 + l, g = lane >> 2, tq = lane & 3;
        const int col = tl.c0 + 32 * warp + 8 * tq;
        if (col >= a.Wo) continue;
SC_UNROLL
        for (int i = 0; i < SC2_TR; i++) {
            const int row = tl.i0 + i;
            if (row >= a.Ho) continue;
SC_UNROLL
            for (int h = 0; h < 2; h++) {
                const int o = g + 8 * h;
                if (o >= a.Co) continue;
                float v[8];
SC_UNROLL
                for (int nt = 0; nt < 4; nt++) {
                    v[2 * nt] = ln[l].acc[i][nt][2 * h];
                    v[2 * nt + 1] = ln[l].acc[i][nt][2 * h + 1];
                }
                T *po = out + ((int64_t)(tl.n * a.Co + o) * a.Ho + row) * a.Wo + col;
                if (a.vec_out && col + 8 <= a.Wo) {
                    if (a.beta != 0.0f) {
                        uint4 old = *reinterpret_cast<const uint4 *>(po);
                        const unsigned ow[4] = {old.x, old.y, old.z, old.w};
SC_UNROLL
                        for (int e = 0; e < 8; e++)
                            v[e] = fmaf(a.beta,
                                        sc_f<T>(sc_from_bits<T>((unsigned short)(e & 1 ? ow[e >> 1] >> 16
                                                                                   : ow[e >> 1] & 0xffffu))),
                                        v[e]);
                    }
                    P pr[4];
SC_UNROLL
                    for (int m = 0; m < 4; m++) pr[m] = sc_pair<T>::make(v[2 * m], v[2 * m + 1]);
                    uint4 st;
                    memcpy(&st, pr, sizeof st);
                    *reinterpret_cast<uint4 *>(po) = st;
                } else {
SC_UNROLL
                    for (int e = 0; e < 8; e++) {
                        if (col + e >= a.Wo) break;
                        float r = v[e];
                        if (a.beta != 0.0f) r = fmaf(a.beta, sc_f<T>(po[e]), r);
                        po[e] = sc_t<T>(r);
                    }
                }
            }
        }
    }
}

/* Forward (S = 1 or 2) and stride-1 backward-data (flipped weights) with
 * Ci, Co <= 16. */
template <typename T, int S, int CP2>
static __global__ void __launch_bounds__(SC2_THREADS, 2)
sc2_conv(sc2_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ uint4 sc2_smem4[];
    uint32_t *sm = reinterpret_cast<uint32_t *>(sc2_smem4);
    const int tid = threadIdx.x;
    const sc2_tile tl = sc2_tile_of(a, S, blockIdx.x);
    sc2_stage<T, S, CP2>(a, sm, tl, tid, blockDim.x);
    __syncthreads();
    sc2_lane<S, CP2> ln[1];
    sc2_lane_init<S, CP2, 1>(a, sm, tid >> 5, tid & 31, ln); /* branch-free: predicated loads */
    sc2_compute<T, S, CP2, 1>(a, sm, ln); /* mma.sync.aligned: the warp is converged here */
    sc2_store<T, S, CP2, 1>(a, tl, tid >> 5, tid & 31, ln);
}

// ----------------------------------------------------------------------------
// filter gradient (sw_*): dw = beta*dw + sum over n, i, j of
// dy[n][o][i][j] * x[n][c][i*s-1+r][j*s-1+q]  (nn_conv_small.cuh)
//
// Two kernels.  sw_wgrad: grid (S spatial splits, ncg input-channel
// chunks); block (sp, cg) takes the tiles [sp*per, sp*per + per) of the
// tile list (tile t = image n, row tile, column tile, in that order: one
// tile is th = rw*SW_RPW output rows x SW_TW output columns of one image)
// and the cb input channels [cg*cb, cg*cb + cb).  Its warps are nog x rw:
// warp w takes the output channels [og*4, og*4 + 4) (og = w % nog) and the
// SW_RPW rows rwi*SW_RPW.. of each tile (rwi = w / nog); lane l the column
// j0 + l.  So each thread holds 4*cb*9 f32 sums (layer 0, 3 -> 16: 108) and
// every dy element is read by exactly one thread of the cg's block.
// Staging: per tile, the block copies the cb channels' x rows i0*s-1 ..
// (i0+th-1)*s+1 and columns j0*s-1 .. j0*s+32*s as f32 into shared memory,
// split by column phase (column l of the window goes to phase l % s, index
// l / s: stride 2 keeps a warp's reads of tap q at consecutive words, no
// bank conflict); out-of-plane elements are zeros (the zero padding).
// Compute, per output (row i, column j, in tile order then row order): the
// 4 dy values (global, coalesced over the lanes), then per channel c and
// kernel row r the 3 x values, one fmaf into each of the 4*3 sums.
// Reduction (fixed order, a function of the geometry only): the warp's
// sums, padded with zeros to P = 32*M, are folded by a butterfly (xor 16,
// 8, 4, 2, 1; each step halves the values a lane holds, a + b of the two
// lanes' copies) after which lane l holds the sums l*M .. l*M + M-1; the
// row warps are added in rwi order; the block writes its partial sums to
// part[sp*nk + k] (k: the index in dw).  sw_fold: dw[k] = beta*dw[k] +
// sum_sp part[sp*nk + k]: warp f of SW_FOLD_WARPS adds sp = f, f + 16, ...
// ascending, then warp 0 adds the 16 warp sums in warp order.  No atomics:
// bitwise identical run to run, eager or replayed.

#define SW_OB 4            /* output channels per warp */
#define SW_CBMAX 4         /* input channels per chunk */
#define SW_RPW 4           /* output rows per warp per tile */
#define SW_TW 32           /* output columns per tile (one per lane) */
#define SW_XW 34           /* words per staged phase row (s = 1: 34 columns) */
#define SW_WARPS 4         /* most warps per block */
#define SW_TARGET 384      /* aim for about this many sw_wgrad blocks: one wave of
                              3 per SM on the H200 (132 SMs; 162 registers x 128
                              threads at layer 0) */
#define SW_FOLD_WARPS 16   /* warps of a fold block */
#define SW_MAXC 16         /* Cin, Cout limit of the filter gradient */
/* f32 sums a lane holds after the butterfly: ceil(4*cb*9 / 32) */
#define SW_M(CB) ((SW_OB * (CB) * 9 + 31) / 32)

namespace {

struct sw_args {
    const void *x, *dy;
    float *part; /* [S][nk] */
    float *dw;   /* [Cout][Cin][3][3] */
    float beta;  /* 0: dw not read */
    int N, Cin, H, W, Cout, Ho, Wo;
    int cb, ncg;        /* channels per chunk, chunks (grid.y) */
    int nog, rw;        /* output-channel warps, row warps */
    int th, rows_in;    /* output rows per tile, staged x rows per channel */
    int tiles_h, tiles_w, tiles;
    int per, S;         /* tiles per split, splits (grid.x) */
    int nk;             /* Cout*Cin*9 */
};

struct sw_plan {
    int s;              /* stride */
    unsigned threads;
    size_t smem;        /* dynamic: cb * rows_in * s * SW_XW floats */
    sw_args a;
};

/* Launch plan of the filter gradient of g (lucid_conv_small_wgrad_eligible
 * holds); a function of the geometry only. */
void sw_plan_make(const lucid_conv_small_geom *g, sw_plan *p) {
    memset(p, 0, sizeof *p);
    sw_args &a = p->a;
    p->s = g->sh;
    a.N = (int)g->N; a.Cin = (int)g->Cin; a.H = (int)g->H; a.W = (int)g->W;
    a.Cout = (int)g->Cout; a.Ho = (int)g->Ho; a.Wo = (int)g->Wo;
    int nch = (int)sc_cdiv(a.Cin, SW_CBMAX);
    a.cb = (int)sc_cdiv(a.Cin, nch); /* even chunks: 5 -> 3 + 2, not 4 + 1 */
    a.ncg = (int)sc_cdiv(a.Cin, a.cb);
    a.nog = (int)sc_cdiv(a.Cout, SW_OB);
    a.rw = SW_WARPS / a.nog < 1 ? 1 : SW_WARPS / a.nog;
    a.th = a.rw * SW_RPW;
    a.rows_in = (a.th - 1) * p->s + 3;
    a.tiles_h = (int)sc_cdiv(a.Ho, a.th);
    a.tiles_w = (int)sc_cdiv(a.Wo, SW_TW);
    a.tiles = a.N * a.tiles_h * a.tiles_w;
    int64_t s0 = sc_cdiv(SW_TARGET, a.ncg);
    a.per = (int)sc_cdiv(a.tiles, s0);
    a.S = (int)sc_cdiv(a.tiles, a.per);
    a.nk = a.Cout * a.Cin * 9;
    p->threads = 32u * (unsigned)(a.nog * a.rw);
    p->smem = (size_t)a.cb * a.rows_in * p->s * SW_XW * sizeof(float);
}

} // namespace

/* Tile t's image, first output row and first output column. */
struct sw_tile {
    int n, i0, j0;
};

SC_HD sw_tile sw_tile_of(const sw_args &a, int t) {
    sw_tile tl;
    tl.n = t / (a.tiles_h * a.tiles_w);
    const int rem = t - tl.n * a.tiles_h * a.tiles_w;
    const int ti = rem / a.tiles_w;
    tl.i0 = ti * a.th;
    tl.j0 = (rem - ti * a.tiles_w) * SW_TW;
    return tl;
}

/* Staging, the part of warp w (of nw) and lane l: staged rows w, w + nw, ...
 * (row = cc*rows_in + rr: channel cg*cb + cc, x row i0*s - 1 + rr), window
 * columns l, l + 32, ... of 32*s + 2 (x column j0*s - 1 + column), stored at
 * sm[((cc*rows_in + rr)*s + column % s)*SW_XW + column / s]. */
template <typename T, int S>
SC_HD void sw_stage(const sw_args &a, float *sm, const sw_tile &tl, int cg, int w, int nw,
                    int l) {
    const T *x = static_cast<const T *>(a.x);
    const int nrows = a.cb * a.rows_in, ncol = SW_TW * S + 2;
    for (int row = w; row < nrows; row += nw) {
        const int cc = row / a.rows_in, rr = row - cc * a.rows_in;
        const int c = cg * a.cb + cc, h = tl.i0 * S - 1 + rr;
        const bool in = c < a.Cin && h >= 0 && h < a.H;
        const T *xr = x + (((int64_t)tl.n * a.Cin + (in ? c : 0)) * a.H + (in ? h : 0)) * a.W;
        float *sr = sm + row * S * SW_XW;
        for (int col = l; col < ncol; col += 32) {
            const int v = tl.j0 * S - 1 + col;
            sr[(col % S) * SW_XW + col / S] = in && v >= 0 && v < a.W ? sc_f<T>(xr[v]) : 0.0f;
        }
    }
}

/* The sums of one thread (warp: output-channel group og, row warp rwi;
 * lane l) over one staged tile: acc[(ob*CB + cc)*9 + r*3 + q] +=
 * dy[n][og*4+ob][i][j] * x[n][cg*CB+cc][i*S-1+r][j*S-1+q] for its rows i
 * ascending and its column j = j0 + l (outputs outside the plane skipped;
 * output channels past Cout read as 0 and are never stored). */
template <typename T, int S, int CB>
SC_HD void sw_accum(const sw_args &a, const float *sm, const sw_tile &tl, int og, int rwi,
                    int l, float *acc) {
    const T *dy = static_cast<const T *>(a.dy);
    const int j = tl.j0 + l;
    if (j >= a.Wo) return;
    for (int rr = 0; rr < SW_RPW; rr++) {
        const int ti = rwi * SW_RPW + rr, i = tl.i0 + ti;
        if (i >= a.Ho) break;
        float d[SW_OB];
SC_UNROLL
        for (int ob = 0; ob < SW_OB; ob++) {
            const int o = og * SW_OB + ob;
            d[ob] = o < a.Cout
                        ? sc_f<T>(dy[(((int64_t)tl.n * a.Cout + o) * a.Ho + i) * a.Wo + j])
                        : 0.0f;
        }
SC_UNROLL
        for (int cc = 0; cc < CB; cc++) {
SC_UNROLL
            for (int r = 0; r < 3; r++) {
                const float *sr = sm + ((cc * a.rows_in + ti * S + r) * S) * SW_XW;
                float xv[3];
SC_UNROLL
                for (int q = 0; q < 3; q++) xv[q] = sr[(q % S) * SW_XW + l + q / S];
SC_UNROLL
                for (int ob = 0; ob < SW_OB; ob++)
SC_UNROLL
                    for (int q = 0; q < 3; q++) {
                        const int k = (ob * CB + cc) * 9 + r * 3 + q;
                        acc[k] = fmaf(d[ob], xv[q], acc[k]);
                    }
            }
        }
    }
}

/* The dw index of the butterfly's sum m (< M) of lane l of the warp with
 * output-channel group og in channel chunk cg: sum k = l*M + m of the
 * thread's list, or -1 for padding (k past 4*CB*9, an output channel past
 * Cout or an input channel past Cin). */
template <int CB>
SC_HD int sw_dw_index(const sw_args &a, int og, int cg, int l, int m) {
    constexpr int M = SW_M(CB);
    const int k = l * M + m;
    if (k >= SW_OB * CB * 9) return -1;
    const int ob = k / (CB * 9), cc = (k / 9) % CB, t = k % 9;
    const int o = og * SW_OB + ob, c = cg * CB + cc;
    if (o >= a.Cout || c >= a.Cin) return -1;
    return (o * a.Cin + c) * 9 + t;
}

/* The butterfly: v[0..32*M) of each lane in, v[0..M) out (lane l: the
 * warp's totals of l*M .. l*M + M-1).  Step b (16, 8, 4, 2, 1), h values
 * kept of 2h: the lower lane keeps v[0..h), the upper v[h..2h), each adds
 * the partner's copy of what it keeps. */
template <int M>
__device__ __forceinline__ void sw_bfly(float *v, int l) {
    int h = 16 * M;
SC_UNROLL
    for (int b = 16; b >= 1; b >>= 1, h >>= 1) {
        const bool up = (l & b) != 0;
SC_UNROLL
        for (int k = 0; k < 32 * M; k++) {
            if (k >= h) break;
            const float keep = up ? v[k + h] : v[k], send = up ? v[k] : v[k + h];
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, b);
        }
    }
}

template <typename T, int S, int CB>
static __global__ void __launch_bounds__(32 * SW_WARPS)
sw_wgrad(sw_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ float4 sw_smem4[];
    float *sm = reinterpret_cast<float *>(sw_smem4);
    constexpr int M = SW_M(CB);
    __shared__ float red[SW_WARPS][32 * M];
    const int l = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int og = w % a.nog, rwi = w / a.nog, cg = blockIdx.y, sp = blockIdx.x;
    float v[32 * M];
SC_UNROLL
    for (int k = 0; k < 32 * M; k++) v[k] = 0.0f;
    const int t0 = sp * a.per, t1 = min(t0 + a.per, a.tiles);
    for (int t = t0; t < t1; t++) {
        const sw_tile tl = sw_tile_of(a, t);
        __syncthreads(); /* the previous tile's reads are done */
        sw_stage<T, S>(a, sm, tl, cg, w, nw, l);
        __syncthreads();
        sw_accum<T, S, CB>(a, sm, tl, og, rwi, l, v);
    }
    sw_bfly<M>(v, l);
    if (a.rw > 1) {
SC_UNROLL
        for (int m = 0; m < M; m++) red[w][m * 32 + l] = v[m];
        __syncthreads();
        if (rwi != 0) return;
SC_UNROLL
        for (int m = 0; m < M; m++)
            for (int r = 1; r < a.rw; r++) v[m] += red[r * a.nog + og][m * 32 + l];
    }
    float *part = a.part + (size_t)sp * a.nk;
SC_UNROLL
    for (int m = 0; m < M; m++) {
        const int e = sw_dw_index<CB>(a, og, cg, l, m);
        if (e >= 0) part[e] = v[m];
    }
}

/* dw[k] = beta*dw[k] + sum_sp part[sp*nk + k]; block = SW_FOLD_WARPS warps
 * x 32 elements (lane = element). */
static __global__ void __launch_bounds__(32 * SW_FOLD_WARPS)
sw_fold(sw_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float red[SW_FOLD_WARPS][32];
    const int l = threadIdx.x & 31, f = threadIdx.x >> 5;
    const int k = blockIdx.x * 32 + l;
    float sum = 0.0f;
    if (k < a.nk)
        for (int sp = f; sp < a.S; sp += SW_FOLD_WARPS) sum += a.part[(size_t)sp * a.nk + k];
    red[f][l] = sum;
    __syncthreads();
    if (f != 0 || k >= a.nk) return;
    float tot = red[0][l];
    for (int r = 1; r < SW_FOLD_WARPS; r++) tot += red[r][l];
    a.dw[k] = a.beta != 0.0f ? fmaf(a.beta, a.dw[k], tot) : tot;
}

// ----------------------------------------------------------------------------
// host entry points

thread_local unsigned long sc_launches, sc2_launches;

extern "C" unsigned long lucid_conv_small_launch_count(void) { return sc_launches; }

extern "C" unsigned long lucid_conv_small_tc_launch_count(void) { return sc2_launches; }

/* LUCID_CONV_SMALL_V, read once. */
struct sc_venv {
    int version; /* 1, 2, or -1 for an unknown value */
    char value[64];
};

static sc_venv sc_venv_read(void) {
    sc_venv e;
    const char *v = getenv("LUCID_CONV_SMALL_V");
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    if (!v || !v[0] || strcmp(v, "2") == 0) e.version = 2;
    else if (strcmp(v, "1") == 0) e.version = 1;
    else e.version = -1;
    return e;
}

static std::atomic<int> sc_version_forced(0); /* lucid_conv_small_set_version */

extern "C" int lucid_conv_small_version(const char **value) {
    static const sc_venv e = sc_venv_read(); /* once, thread-safe */
    if (value) *value = e.value;
    const int f = sc_version_forced.load(std::memory_order_relaxed);
    return f ? f : e.version;
}

extern "C" int lucid_conv_small_set_version(int v) {
    return sc_version_forced.exchange(v == 1 || v == 2 ? v : 0, std::memory_order_relaxed);
}

extern "C" int lucid_conv_small_switch(const char **value) {
    static const sc_env e = sc_env_read(); /* once, thread-safe */
    if (value) *value = e.value;
    return e.route;
}

extern "C" int lucid_conv_small_preferred(const lucid_conv_small_geom *g) {
    return g->Cin * g->Cout <= LUCID_CONV_SMALL_PREFER_CC;
}

extern "C" int lucid_conv_small_eligible(const lucid_conv_small_geom *g, lucid_dtype dt) {
    if (!g) return 0;
    if (dt != LUCID_BF16 && dt != LUCID_F16) return 0;
    if (g->groups != 1 || g->kh != 3 || g->kw != 3 || g->dh != 1 || g->dw != 1) return 0;
    if ((g->sh != 1 && g->sh != 2) || g->sw != g->sh || g->ph != 1 || g->pw != 1) return 0;
    if (g->N < 1 || g->Cin < 1 || g->Cout < 1 || g->H < 1 || g->W < 1) return 0;
    if (g->Cin > LUCID_CONV_SMALL_MAX_CC || g->Cout > LUCID_CONV_SMALL_MAX_CC ||
        g->Cin * g->Cout > LUCID_CONV_SMALL_MAX_CC)
        return 0;
    if (g->H > INT_MAX || g->W > INT_MAX) return 0;
    if (g->Ho != (g->H - 1) / g->sh + 1 || g->Wo != (g->W - 1) / g->sw + 1) return 0;
    /* 32-bit element indices (x and y; every plane index below them) */
    const int64_t lim = (int64_t)INT_MAX;
    if (g->H * g->W > lim || g->N > lim / (g->Cin * g->H * g->W) ||
        g->N > lim / (g->Cout * g->Ho * g->Wo))
        return 0;
    return 1;
}

static lucid_status sc_check(lucid_ctx *ctx, const char *op, lucid_dtype dt,
                             const lucid_conv_small_geom *g) {
    if (dt != LUCID_BF16 && dt != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s: activation dtype %s is not supported (bf16, f16)", op,
                            lucid_dtype_name(dt));
    if (!lucid_conv_small_eligible(g, dt))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: geometry not eligible for the small-channel route "
                            "(x %lldx%lldx%lldx%lld, Cout %lld, y %lldx%lld, kernel %dx%d, "
                            "stride %d,%d, pad %d,%d, dilation %d,%d, groups %d; needs 3x3, "
                            "stride 1 or 2, pad 1, dilation 1, groups 1, Cin*Cout <= %d)",
                            op, (long long)g->N, (long long)g->Cin, (long long)g->H,
                            (long long)g->W, (long long)g->Cout, (long long)g->Ho,
                            (long long)g->Wo, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                            g->dh, g->dw, g->groups, LUCID_CONV_SMALL_MAX_CC);
    return LUCID_OK;
}

template <typename T>
static cudaError_t sc_launch(const sc_plan &p, cudaStream_t stream) {
    const sc_args &a = p.a;
    dim3 grid(p.blocks), block(p.threads);
    if (p.mode == SC_S1)
        return p.cob == 8 ? lucid_launch(sc_conv<T, 1, 8>, grid, block, p.smem, stream, a)
                          : lucid_launch(sc_conv<T, 1, 4>, grid, block, p.smem, stream, a);
    if (p.mode == SC_S2)
        return p.cob == 8 ? lucid_launch(sc_conv<T, 2, 8>, grid, block, p.smem, stream, a)
                          : lucid_launch(sc_conv<T, 2, 4>, grid, block, p.smem, stream, a);
    return p.cob == 8 ? lucid_launch(sc_bwd2<T, 8>, grid, block, p.smem, stream, a)
                      : lucid_launch(sc_bwd2<T, 4>, grid, block, p.smem, stream, a);
}

template <typename T>
static cudaError_t sc2_launch(const sc2_plan &p, cudaStream_t stream) {
    const sc2_args &a = p.a;
    dim3 grid(p.blocks), block(p.threads);
    if (p.S == 1)
        return p.cp2 == 2 ? lucid_launch(sc2_conv<T, 1, 2>, grid, block, p.smem, stream, a)
               : p.cp2 == 4 ? lucid_launch(sc2_conv<T, 1, 4>, grid, block, p.smem, stream, a)
                            : lucid_launch(sc2_conv<T, 1, 8>, grid, block, p.smem, stream, a);
    return p.cp2 == 2 ? lucid_launch(sc2_conv<T, 2, 2>, grid, block, p.smem, stream, a)
           : p.cp2 == 4 ? lucid_launch(sc2_conv<T, 2, 4>, grid, block, p.smem, stream, a)
                        : lucid_launch(sc2_conv<T, 2, 8>, grid, block, p.smem, stream, a);
}

static lucid_status sc2_run(lucid_ctx *ctx, const char *op, cudaStream_t stream,
                            lucid_dtype dt, sc2_plan &p) {
    cudaError_t e = dt == LUCID_BF16 ? sc2_launch<__nv_bfloat16>(p, stream)
                                     : sc2_launch<__half>(p, stream);
    if (e != cudaSuccess) return lucid_cuda_err(ctx, e, op, __FILE__, __LINE__);
    sc_launches += 1;
    sc2_launches += 1;
    return LUCID_OK;
}

/* The kernel generation of pass (0 forward, 1 backward-data): *ver = 2 when
 * the switch says 2 and v2 takes the pass (*p2 planned), else 1.  ERR_ARG
 * for an unknown LUCID_CONV_SMALL_V. */
static lucid_status sc_pick(lucid_ctx *ctx, const char *op, const lucid_conv_small_geom *g,
                            int pass, sc2_plan *p2, int *ver) {
    const char *v = "";
    const int sw = lucid_conv_small_version(&v);
    if (sw < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: LUCID_CONV_SMALL_V=\"%s\" (expected 1 or 2)",
                            op, v);
    *ver = sw == 2 && sc2_plan_make(g, pass, p2, 0) ? 2 : 1;
    return LUCID_OK;
}

extern "C" int lucid_conv_small_kernel(const lucid_conv_small_geom *g, lucid_dtype dt,
                                       int pass) {
    if (!lucid_conv_small_eligible(g, dt) || (pass != 0 && pass != 1)) return 0;
    sc2_plan p2;
    if (lucid_conv_small_version(NULL) != 2) return 1;
    return sc2_plan_make(g, pass, &p2, 0) ? 2 : 1;
}

static lucid_status sc_run(lucid_ctx *ctx, const char *op, cudaStream_t stream,
                           lucid_dtype dt, sc_plan &p) {
    cudaError_t e = dt == LUCID_BF16 ? sc_launch<__nv_bfloat16>(p, stream)
                                     : sc_launch<__half>(p, stream);
    if (e != cudaSuccess) return lucid_cuda_err(ctx, e, op, __FILE__, __LINE__);
    sc_launches += 1;
    return LUCID_OK;
}

extern "C" lucid_status lucid_conv_small_forward(lucid_ctx *ctx, void *stream, lucid_dtype dt,
                                                 const lucid_conv_small_geom *g,
                                                 const void *x, const float *w,
                                                 const float *b, void *y) {
    const char *op = "conv_small forward";
    LUCID_TRY(sc_check(ctx, op, dt, g));
    sc2_plan p2;
    int ver = 1;
    LUCID_TRY(sc_pick(ctx, op, g, 0, &p2, &ver));
    if (ver == 2) {
        p2.a.in = x;
        p2.a.out = y;
        p2.a.w = w;
        p2.a.bias = b;
        p2.a.beta = 0.0f;
        p2.a.vec_in = g->W % 8 == 0 && (uintptr_t)x % 16 == 0;
        p2.a.vec_out = g->Wo % 8 == 0 && (uintptr_t)y % 16 == 0;
        return sc2_run(ctx, op, (cudaStream_t)stream, dt, p2);
    }
    sc_plan p;
    sc_plan_make(g, 0, &p);
    p.a.in = x;
    p.a.out = y;
    p.a.w = w;
    p.a.bias = b;
    p.a.beta = 0.0f;
    p.a.vec_in = g->W % 8 == 0 && (uintptr_t)x % 16 == 0;
    p.a.vec_out = 0;
    return sc_run(ctx, op, (cudaStream_t)stream, dt, p);
}

extern "C" lucid_status lucid_conv_small_backward_data(lucid_ctx *ctx, void *stream,
                                                       lucid_dtype dt,
                                                       const lucid_conv_small_geom *g,
                                                       const void *dy, const float *w,
                                                       void *dx, double beta) {
    const char *op = "conv_small backward_data";
    LUCID_TRY(sc_check(ctx, op, dt, g));
    sc2_plan p2;
    int ver = 1;
    LUCID_TRY(sc_pick(ctx, op, g, 1, &p2, &ver));
    if (ver == 2) {
        p2.a.in = dy;
        p2.a.out = dx;
        p2.a.w = w;
        p2.a.bias = NULL;
        p2.a.beta = (float)beta;
        p2.a.vec_in = g->Wo % 8 == 0 && (uintptr_t)dy % 16 == 0;
        p2.a.vec_out = g->W % 8 == 0 && (uintptr_t)dx % 16 == 0;
        return sc2_run(ctx, op, (cudaStream_t)stream, dt, p2);
    }
    sc_plan p;
    sc_plan_make(g, 1, &p);
    p.a.in = dy;
    p.a.out = dx;
    p.a.w = w;
    p.a.bias = NULL;
    p.a.beta = (float)beta;
    p.a.vec_in = g->Wo % 8 == 0 && (uintptr_t)dy % 16 == 0;
    p.a.vec_out = g->W % 2 == 0 && (uintptr_t)dx % 4 == 0;
    return sc_run(ctx, op, (cudaStream_t)stream, dt, p);
}

// ----------------------------------------------------------------------------
// filter gradient: host entry points

thread_local unsigned long sw_launches;

extern "C" unsigned long lucid_conv_small_wgrad_launch_count(void) { return sw_launches; }

extern "C" int lucid_conv_small_wgrad_switch(void) {
    static int on = -1; /* read once */
    if (on < 0) {
        const char *e = getenv("LUCID_CONV_SMALL_WGRAD");
        on = !e ? 0 : strcmp(e, "1") == 0 ? 1 : strcmp(e, "2") == 0 ? 2 : 0;
    }
    return on;
}

extern "C" int lucid_conv_small_wgrad_eligible(const lucid_conv_small_geom *g, lucid_dtype dt) {
    return lucid_conv_small_eligible(g, dt) && g->Cin <= SW_MAXC && g->Cout <= SW_MAXC;
}

extern "C" size_t lucid_conv_small_wgrad_scratch(const lucid_conv_small_geom *g) {
    if (!lucid_conv_small_wgrad_eligible(g, LUCID_BF16)) return 0;
    sw_plan p;
    sw_plan_make(g, &p);
    return (size_t)p.a.S * (size_t)p.a.nk * sizeof(float);
}

template <typename T, int S>
static cudaError_t sw_launch_s(const sw_plan &p, cudaStream_t stream) {
    const dim3 grid((unsigned)p.a.S, (unsigned)p.a.ncg), block(p.threads);
    switch (p.a.cb) {
    case 1: return lucid_launch(sw_wgrad<T, S, 1>, grid, block, p.smem, stream, p.a);
    case 2: return lucid_launch(sw_wgrad<T, S, 2>, grid, block, p.smem, stream, p.a);
    case 3: return lucid_launch(sw_wgrad<T, S, 3>, grid, block, p.smem, stream, p.a);
    default: return lucid_launch(sw_wgrad<T, S, 4>, grid, block, p.smem, stream, p.a);
    }
}

template <typename T>
static cudaError_t sw_launch(const sw_plan &p, cudaStream_t stream) {
    return p.s == 1 ? sw_launch_s<T, 1>(p, stream) : sw_launch_s<T, 2>(p, stream);
}

extern "C" lucid_status lucid_conv_small_backward_filter(lucid_ctx *ctx, void *stream,
                                                         lucid_dtype dt,
                                                         const lucid_conv_small_geom *g,
                                                         const void *x, const void *dy,
                                                         float *dw, double beta, void *scratch,
                                                         size_t scratch_bytes) {
    const char *op = "conv_small backward_filter";
    LUCID_TRY(sc_check(ctx, op, dt, g));
    if (!lucid_conv_small_wgrad_eligible(g, dt))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: Cin %lld, Cout %lld (the filter gradient takes Cin, Cout <= %d)",
                            op, (long long)g->Cin, (long long)g->Cout, SW_MAXC);
    if (!x || !dy || !dw) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: NULL x, dy or dw", op);
    sw_plan p;
    sw_plan_make(g, &p);
    const size_t need = (size_t)p.a.S * (size_t)p.a.nk * sizeof(float);
    if (!scratch || scratch_bytes < need)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: scratch of %zu bytes at %p; this geometry needs %zu "
                            "(lucid_conv_small_wgrad_scratch)",
                            op, scratch_bytes, scratch, need);
    p.a.x = x;
    p.a.dy = dy;
    p.a.part = (float *)scratch;
    p.a.dw = dw;
    p.a.beta = (float)beta;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = dt == LUCID_BF16 ? sw_launch<__nv_bfloat16>(p, st) : sw_launch<__half>(p, st);
    if (e != cudaSuccess) return lucid_cuda_err(ctx, e, op, __FILE__, __LINE__);
    e = lucid_launch(sw_fold, dim3((unsigned)sc_cdiv(p.a.nk, 32)), dim3(32 * SW_FOLD_WARPS), 0,
                     st, p.a);
    if (e != cudaSuccess) return lucid_cuda_err(ctx, e, "conv_small backward_filter (fold)",
                                                __FILE__, __LINE__);
    sc_launches += 2;
    sw_launches += 2;
    return LUCID_OK;
}
