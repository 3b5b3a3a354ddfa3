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
 * Block.  A block owns an output tile of TW columns x TH rows of one image
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

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ----------------------------------------------------------------------------
// host entry points

thread_local unsigned long sc_launches;

extern "C" unsigned long lucid_conv_small_launch_count(void) { return sc_launches; }

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
