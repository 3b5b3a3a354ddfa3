/*
 * test_conv_small_emu.cu — host emulation of the small-channel 3x3 conv
 * kernels (cuda/nn_conv_small.cu): the launch plans of the entry points
 * (sc_plan_make for v1, sc2_plan_make for the tensor-core v2) and the
 * kernels' own per-thread phases (staging, the per-chunk accumulation, the
 * store; v2: the staging per thread, then per warp the 32 lanes' fragment
 * loads, the mma and the stores), run on the CPU one block at a time, each
 * phase for every thread of the block in turn (what the kernels'
 * __syncthreads guarantee).  v2's mma.sync is emulated from the PTX
 * fragment layouts of m16n8k16 / m16n8k8 (A row-major 16xK, B KxN, C/D
 * 16x8; lane = 4*groupID + threadID_in_group), each product added with fmaf
 * in k order.  Needs nvcc, not a GPU (runs in make test).
 *
 * Per case (stride 1 and 2; odd, even, tiny and wide planes; channel
 * counts giving 1..4 channel groups, several super-groups and staged
 * channel chunks; v2: 1..8 warps per block, several tiles per row, padded
 * channel pairs, the shared-memory-limited stride-2 tile), bf16 and f16,
 * forward (bias or not) and backward-data with beta 0 (destination NaN)
 * and beta 1, for v1 and, where it takes the pass, v2:
 *   - every element within the float64 bound of the conv with the weights
 *     rounded to the dtype (spec/c/test_conv_small_cuda.c states it:
 *     |emu - ref| <= u*|ref| + (1 + u)*(t + 1)*2^-24*S + a);
 *   - v2 within twice that bound of v1 (new vs old);
 *   - v2 takes exactly the passes it is meant to (forward with stride 1
 *     or 2, stride-1 backward-data; reduced and output channels <= 16);
 *   - nothing written outside the tensor (guard elements on both sides);
 *   - shared memory: filled with NaN before every staging phase, so a read
 *     of anything the block did not stage shows up as NaN;
 *   - the same bits with every pointer one element off (scalar staging and
 *     stores) and with another tiling (v1: 1 row warp, 1 channel per chunk;
 *     v2: another tile width): the summation order does not depend on
 *     either;
 *   - plan limits: <= 256 threads in whole warps, dynamic shared memory
 *     < 48 KiB, the grid = tiles x images (x channel super-groups), v2's
 *     layout (row and plane strides, chunks per row).
 * Plus the five full-size passes of the network (layer 0 forward 3>16 s2
 * 640x640, the 160x160 bottleneck's 16>8 and 8>16 forward and
 * backward-data, batch 4, bf16; v1 once, v2 as planned and retiled).
 * v1 uses IEEE fmaf and round-to-nearest-even conversions on both host and
 * device, so the GPU must produce these bits too; v2's bits on the GPU are
 * the tensor core's (checked against the float64 bound and run to run in
 * spec/c/test_conv_small_cuda.c), the index maps are what is checked here.
 */
#include "nn_conv_small.cu"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/* Not linked into this host-only program (nothing is launched and no
 * error path runs): cuda/backend.cu and engine/core. */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
extern "C" lucid_status lucid_seterr(lucid_ctx *, lucid_status s, const char *, ...) { return s; }
extern "C" const char *lucid_dtype_name(lucid_dtype) { return "?"; }
lucid_status lucid_cuda_err(lucid_ctx *, cudaError_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}

#define TAP_HOST_SEED 0x9e3779b97f4a7c15ull
#include "tap_host.h"

template <typename T> static unsigned short bits16(T v) {
    unsigned short u;
    memcpy(&u, &v, 2);
    return u;
}

/* Run one planned pass on the host.  rw_force / cic_force > 0 override
 * the plan's tiling (the result must not change). */
template <typename T, int MODE, int COB>
static void emulate(sc_plan p, int N) {
    const sc_args &a = p.a;
    const int S = MODE == SC_S1 ? 1 : MODE == SC_S2 ? 2 : 0;
    const int cot = a.cg * COB, nthr = (int)p.threads;
    std::vector<float4> smem4(p.smem / sizeof(float4) + 1);
    float *sm = reinterpret_cast<float *>(smem4.data());
    float *swt = sm + a.cic * a.rows_in * a.sw;
    struct AccF { float v[COB][SC_ROWS]; };
    struct AccB { float v[COB][SC_VR][4]; };
    std::vector<AccF> af((size_t)nthr);
    std::vector<AccB> ab((size_t)nthr);
    (void)N;
    for (unsigned blk = 0; blk < p.blocks; blk++) {
        sc_tile tl = sc_tile_of(a, S, COB, (int)blk);
        for (int t = 0; t < nthr; t++) {
            if (MODE == SC_BWD2) {
                for (int o = 0; o < COB; o++)
                    for (int i = 0; i < SC_VR; i++)
                        for (int k = 0; k < 4; k++) ab[(size_t)t].v[o][i][k] = 0.0f;
            } else {
                sc_conv_init<COB>(a, tl, t, af[(size_t)t].v);
            }
        }
        for (int c0 = 0; c0 < a.Ci; c0 += a.cic) {
            const int cn = a.cic < a.Ci - c0 ? a.cic : a.Ci - c0;
            for (size_t i = 0; i < p.smem / sizeof(float); i++) sm[i] = NAN;
            for (int t = 0; t < nthr; t++) sc_stage<T>(a, sm, swt, tl, c0, cn, cot, t, nthr);
            for (int t = 0; t < nthr; t++) {
                if (MODE == SC_BWD2) sc_bwd2_chunk<COB>(a, sm, swt, cn, cot, t, ab[(size_t)t].v);
                else sc_conv_chunk<(MODE == SC_S2 ? 2 : 1), COB>(a, sm, swt, cn, cot, t,
                                                                af[(size_t)t].v);
            }
        }
        for (int t = 0; t < nthr; t++) {
            if (MODE == SC_BWD2) sc_bwd2_store<T, COB>(a, tl, t, ab[(size_t)t].v);
            else sc_conv_store<T, COB>(a, tl, t, af[(size_t)t].v);
        }
    }
}

template <typename T>
static void run_plan(const sc_plan &p, int N) {
    if (p.mode == SC_S1) {
        if (p.cob == 8) emulate<T, SC_S1, 8>(p, N);
        else emulate<T, SC_S1, 4>(p, N);
    } else if (p.mode == SC_S2) {
        if (p.cob == 8) emulate<T, SC_S2, 8>(p, N);
        else emulate<T, SC_S2, 4>(p, N);
    } else {
        if (p.cob == 8) emulate<T, SC_BWD2, 8>(p, N);
        else emulate<T, SC_BWD2, 4>(p, N);
    }
}

/* v2 (the tensor-core kernels): one planned pass on the host.  Per block,
 * shared memory filled with NaN, every thread's staging, then per warp its
 * 32 lanes' fragment loads, the mma emulated from the PTX fragment layout
 * (fmaf in k order: the index maps are what is checked here; the GPU's
 * tensor core sums in its own order) and the stores. */
template <typename T, int S, int CP2>
static void emulate2(const sc2_plan &p) {
    const sc2_args &a = p.a;
    const int nthr = (int)p.threads;
    std::vector<uint32_t> smem(p.smem / 4 + 4);
    std::vector<sc2_lane<S, CP2>> ln(32);
    for (unsigned blk = 0; blk < p.blocks; blk++) {
        sc2_tile tl = sc2_tile_of(a, S, (int)blk);
        std::fill(smem.begin(), smem.end(), 0x7fc07fc0u); /* NaN in both halves, bf16 and f16 */
        for (int t = 0; t < nthr; t++) sc2_stage<T, S, CP2>(a, smem.data(), tl, t, nthr);
        for (int wp = 0; wp < nthr / 32; wp++) {
            sc2_lane_init<S, CP2, 32>(a, smem.data(), wp, 0, ln.data());
            sc2_compute<T, S, CP2, 32>(a, smem.data(), ln.data());
            sc2_store<T, S, CP2, 32>(a, tl, wp, 0, ln.data());
        }
    }
}

template <typename T>
static void run_plan2(const sc2_plan &p) {
    if (p.S == 1) {
        if (p.cp2 == 2) emulate2<T, 1, 2>(p);
        else if (p.cp2 == 4) emulate2<T, 1, 4>(p);
        else emulate2<T, 1, 8>(p);
    } else {
        if (p.cp2 == 2) emulate2<T, 2, 2>(p);
        else if (p.cp2 == 4) emulate2<T, 2, 4>(p);
        else emulate2<T, 2, 8>(p);
    }
}

struct Case {
    int N, Cin, H, W, Cout, s, bias;
};

static const Case CASES[] = {
    {4, 3, 7, 9, 8, 1, 1},      {1, 8, 7, 9, 16, 2, 0},     {2, 16, 33, 32, 32, 2, 1},
    {1, 16, 33, 32, 8, 1, 0},   {2, 8, 33, 32, 32, 1, 0},   {1, 3, 33, 32, 32, 2, 1},
    {2, 16, 31, 33, 8, 2, 1},   {1, 3, 64, 64, 16, 2, 0},   {2, 8, 24, 40, 12, 1, 1},
    {2, 16, 24, 40, 20, 2, 0},  {1, 1, 20, 70, 512, 1, 1},  {1, 512, 17, 40, 1, 2, 0},
    {3, 4, 1, 1, 4, 1, 0},      {2, 5, 2, 3, 6, 2, 1},      {1, 4, 5, 300, 8, 1, 0},
    {2, 4, 70, 1, 4, 2, 0},     {1, 16, 40, 40, 8, 1, 0},   {1, 8, 40, 40, 16, 1, 1},
    {1, 16, 66, 70, 32, 2, 0},  {2, 7, 13, 17, 9, 1, 1},    {1, 9, 19, 23, 5, 2, 1},
    /* v2 tilings: the network's small shapes scaled down (layer 0 3>16 s2,
     * the C3k2 bottleneck 16>8 / 8>16), 1..8 warps per block, two tiles per
     * row, padded channel pairs, stride 2 with 8 and 16 channels (a smaller
     * tile to fit the shared memory), a single channel */
    {2, 3, 48, 80, 16, 2, 1},   {2, 16, 20, 96, 8, 1, 0},   {1, 8, 17, 200, 16, 1, 0},
    {1, 16, 9, 300, 8, 1, 1},   {1, 12, 11, 45, 10, 1, 1},  {2, 5, 9, 33, 7, 2, 0},
    {1, 16, 13, 70, 16, 2, 1},  {1, 1, 6, 8, 1, 1, 0},     {1, 16, 6, 600, 16, 2, 0},
    {2, 16, 16, 160, 8, 1, 1},  {2, 8, 16, 160, 16, 1, 0},  {1, 3, 32, 640, 16, 2, 0},
};

/* The full-size shapes of the five passes the brief names (YOLO11n-pose at
 * batch 4, 640: layer 0 forward; the 160x160 bottleneck's two convs,
 * forward and backward-data), bf16; passes: bit 0 forward, 1 backward-data
 * beta 0, 2 beta 1. */
static const struct {
    Case c;
    int passes;
} FULL[] = {
    {{4, 3, 640, 640, 16, 2, 0}, 1},
    {{4, 16, 160, 160, 8, 1, 0}, 7},
    {{4, 8, 160, 160, 16, 1, 1}, 7},
};

/* One case, one dtype, one pass (0 forward, 1 backward-data beta 0, 2
 * backward-data beta 1). */
template <typename T>
static void run_case(const Case &c, const char *dname, int pass, bool full = false) {
    const int Ho = (c.H - 1) / c.s + 1, Wo = (c.W - 1) / c.s + 1;
    const size_t nx = (size_t)c.N * c.Cin * c.H * c.W, ny = (size_t)c.N * c.Cout * Ho * Wo;
    const size_t nw = (size_t)c.Cout * c.Cin * 9;
    const size_t nin = pass == 0 ? nx : ny, nout = pass == 0 ? ny : nx;
    char name[256];
    snprintf(name, sizeof name, "emu %s N%d %d>%d %dx%d s%d%s %s", dname, c.N, c.Cin, c.Cout,
             c.H, c.W, c.s, c.bias && pass == 0 ? " bias" : "",
             pass == 0 ? "forward" : pass == 1 ? "backward_data beta 0" : "backward_data beta 1");
    const int G = 8; /* guard elements on both sides; one extra for misalignment */
    std::vector<T> in(nin + 2 * G + 1), old(nout);
    std::vector<float> w(nw), wr(nw), b((size_t)c.Cout);
    double fan = 1.0 / std::sqrt((double)(pass == 0 ? c.Cin * 9 : c.Cout * 9));
    for (size_t i = 0; i < nin; i++) in[G + i] = sc_t<T>((float)urand(-1, 1));
    for (size_t i = 0; i < nw; i++) {
        w[i] = (float)urand(-fan, fan);
        wr[i] = sc_f<T>(sc_t<T>(w[i]));
    }
    for (int i = 0; i < c.Cout; i++) b[(size_t)i] = (float)urand(-fan, fan);
    for (size_t i = 0; i < nout; i++) old[i] = sc_t<T>((float)urand(-1, 1));
    const bool bias = pass == 0 && c.bias;

    /* float64 reference */
    std::vector<double> ref(nout), mag(nout);
    const T *X = in.data() + G;
    if (pass == 0) {
        size_t e = 0;
        for (int n = 0; n < c.N; n++)
            for (int o = 0; o < c.Cout; o++)
                for (int i = 0; i < Ho; i++)
                    for (int j = 0; j < Wo; j++, e++) {
                        double acc = bias ? b[(size_t)o] : 0, m = bias ? std::fabs(b[(size_t)o]) : 0;
                        for (int ci = 0; ci < c.Cin; ci++)
                            for (int r = 0; r < 3; r++)
                                for (int q = 0; q < 3; q++) {
                                    int hi = i * c.s - 1 + r, wi = j * c.s - 1 + q;
                                    if (hi < 0 || hi >= c.H || wi < 0 || wi >= c.W) continue;
                                    double t = (double)wr[((size_t)o * c.Cin + ci) * 9 + r * 3 + q] *
                                               sc_f<T>(X[(((size_t)n * c.Cin + ci) * c.H + hi) * c.W + wi]);
                                    acc += t;
                                    m += std::fabs(t);
                                }
                        ref[e] = acc;
                        mag[e] = m;
                    }
    } else {
        size_t e = 0;
        for (int n = 0; n < c.N; n++)
            for (int ci = 0; ci < c.Cin; ci++)
                for (int h = 0; h < c.H; h++)
                    for (int v = 0; v < c.W; v++, e++) {
                        double acc = 0, m = 0;
                        for (int o = 0; o < c.Cout; o++)
                            for (int r = 0; r < 3; r++)
                                for (int q = 0; q < 3; q++) {
                                    int ti = h + 1 - r, tj = v + 1 - q;
                                    if (ti < 0 || tj < 0 || ti % c.s || tj % c.s || ti / c.s >= Ho ||
                                        tj / c.s >= Wo)
                                        continue;
                                    double t = (double)wr[((size_t)o * c.Cin + ci) * 9 + r * 3 + q] *
                                               sc_f<T>(X[(((size_t)n * c.Cout + o) * Ho + ti / c.s) * Wo + tj / c.s]);
                                    acc += t;
                                    m += std::fabs(t);
                                }
                        if (pass == 2) {
                            acc += sc_f<T>(old[e]);
                            m += std::fabs(sc_f<T>(old[e]));
                        }
                        ref[e] = acc;
                        mag[e] = m;
                    }
    }
    const int64_t terms = (pass == 0 ? c.Cin * 9 : c.Cout * 9) + (bias || pass == 2);

    lucid_conv_small_geom g = {c.N, c.Cin, c.H, c.W, c.Cout, Ho, Wo, 3, 3, c.s, c.s, 1, 1,
                               1, 1, 1};
    ok(lucid_conv_small_eligible(&g, LUCID_BF16) == 1, name, "not eligible");
    const T guard = sc_t<T>(12345.0f);
    const double u = std::strcmp(dname, "bf16") == 0 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double aa = std::strcmp(dname, "f16") == 0 ? std::ldexp(1.0, -25) : 0.0;
    const int spass = pass == 0 ? 0 : 1;
    /* v2 takes the forward (stride 1 or 2) and the stride-1 backward-data
     * when the pass's reduced and output channels are both <= 16 */
    const int ci = pass == 0 ? c.Cin : c.Cout, co = pass == 0 ? c.Cout : c.Cin;
    const bool v2_expect = (pass == 0 || c.s == 1) && ci <= 16 && co <= 16;
    {
        sc2_plan p2;
        const int took = sc2_plan_make(&g, spass, &p2, 0);
        ok(took == (v2_expect ? 1 : 0), NAME("%s: v2 takes the pass iff Ci, Co <= 16 (stride 1 "
                                             "or forward)", name),
           WHY("plan %d, expected %d", took, v2_expect ? 1 : 0));
    }
    std::vector<float> v1out; /* v1's result (variant 0), for v2 vs v1 */
    for (int ver = 1; ver <= 2; ver++) {
        if (ver == 2 && !v2_expect) break;
        std::vector<unsigned short> first;
        const char *vn = ver == 1 ? "v1" : "v2";
        int tw_alt = 32; /* v2 "other tiling": another tile width */
        /* variant 0: the plan as the entry point makes it; 1: every pointer
         * one element off; 2: another tiling */
        for (int var = 0; var < 3; var++) {
            /* full sizes: v1 once (for v2 vs v1), v2 as planned and retiled */
            if (full && (ver == 1 ? var > 0 : var == 1)) continue;
            sc_plan p;
            sc2_plan q;
            if (ver == 1) sc_plan_make(&g, spass, &p);
            else sc2_plan_make(&g, spass, &q, var == 2 ? tw_alt : 0);
            if (ver == 2 && var == 0) tw_alt = q.a.tw > 32 ? 32 : 64;
            const int off = var == 1 ? 1 : 0;
            std::vector<T> in2(in.size());
            for (size_t i = 0; i < nin; i++) in2[G + off + i] = in[G + i];
            std::vector<T> out(nout + 2 * G + 1, guard);
            for (size_t i = 0; i < nout; i++)
                out[G + off + i] = pass == 2 ? old[i] : sc_t<T>(NAN);
            const void *pin = in2.data() + G + off;
            void *pout = out.data() + G + off;
            const int Win = pass == 0 ? c.W : Wo, Wout = pass == 0 ? Wo : c.W;
            if (ver == 1) {
                p.a.in = pin;
                p.a.out = pout;
                p.a.w = w.data();
                p.a.bias = bias ? b.data() : NULL;
                p.a.beta = pass == 2 ? 1.0f : 0.0f;
                p.a.vec_in = Win % 8 == 0 && (uintptr_t)p.a.in % 16 == 0;
                p.a.vec_out = pass != 0 && Wout % 2 == 0 && (uintptr_t)p.a.out % 4 == 0;
            } else {
                q.a.in = pin;
                q.a.out = pout;
                q.a.w = w.data();
                q.a.bias = bias ? b.data() : NULL;
                q.a.beta = pass == 2 ? 1.0f : 0.0f;
                q.a.vec_in = Win % 8 == 0 && (uintptr_t)q.a.in % 16 == 0;
                q.a.vec_out = Wout % 8 == 0 && (uintptr_t)q.a.out % 16 == 0;
            }
            if (ver == 1 && var == 2) {
                /* one row warp, one channel per chunk: more blocks, more chunks */
                size_t per_c = p.smem / (size_t)p.a.cic;
                p.a.rw = 1;
                p.a.th = SC_ROWS;
                p.a.tiles_h = (p.a.Ho + SC_ROWS - 1) / SC_ROWS;
                p.a.rows_in = p.mode == SC_S1 ? SC_ROWS + 2 : p.mode == SC_S2 ? 2 * SC_ROWS + 1
                                                                              : SC_ROWS / 2 + 1;
                per_c = ((size_t)p.a.rows_in * p.a.sw + 9 * (size_t)(p.a.cg * p.cob)) * 4;
                p.a.cic = 1;
                p.smem = per_c;
                p.threads = 32u * (unsigned)p.a.cg;
                p.blocks = (unsigned)((int64_t)p.a.tiles_w * p.a.tiles_h * c.N * p.a.ncos);
            }
            if (ver == 1 && var == 0) {
                int tw = p.mode == SC_BWD2 ? 64 : 32;
                int64_t want = (int64_t)((p.a.Wo + tw - 1) / tw) * ((p.a.Ho + p.a.th - 1) / p.a.th) *
                               c.N * p.a.ncos;
                bool good = p.threads >= 32 && p.threads <= SC_THREADS && p.threads % 32 == 0 &&
                            p.smem > 0 && p.smem < 48 * 1024 && (int64_t)p.blocks == want &&
                            p.a.cg * p.cob >= 4 && (p.a.cg * p.cob) % 4 == 0 &&
                            (int64_t)p.a.ncos * p.a.cg * p.cob >= p.a.Co && p.a.cic >= 1 &&
                            p.a.cic <= p.a.Ci;
                ok(good, NAME("%s: plan limits", name),
                   WHY("threads %u smem %zu blocks %u (want %lld) cg %d cob %d ncos %d cic %d",
                       p.threads, p.smem, p.blocks, (long long)want, p.a.cg, p.cob, p.a.ncos,
                       p.a.cic));
            }
            if (ver == 2 && var == 0) {
                const int S = c.s, ri = S + 3;
                const int64_t want = (int64_t)((q.a.Wo + q.a.tw - 1) / q.a.tw) *
                                     ((q.a.Ho + SC2_TR - 1) / SC2_TR) * c.N;
                const int cp2 = q.a.Ci <= 4 ? 2 : q.a.Ci <= 8 ? 4 : 8;
                const int64_t need = S == 1 ? (int64_t)q.a.tw + 16 : 2 * ((int64_t)q.a.tw + 8);
                bool good = q.threads == (unsigned)q.a.tw && q.a.tw % 32 == 0 && q.a.tw >= 32 &&
                            q.a.tw <= SC2_TWMAX && q.smem > 0 && q.smem < 48 * 1024 &&
                            (int64_t)q.blocks == want && q.S == S && q.cp2 == cp2 &&
                            2 * q.cp2 >= q.a.Ci && q.a.rsw == need && q.a.nch * 8 == q.a.rsw &&
                            q.a.psw % 32 == 0 && q.a.psw >= ri * q.a.rsw + 8 &&
                            /* the tiles do not waste a whole warp per row */
                            (int64_t)q.a.tiles_w * q.a.tw - q.a.Wo < 32 * q.a.tiles_w;
                ok(good, NAME("%s: v2 plan limits", name),
                   WHY("threads %u tw %d smem %zu blocks %u (want %lld) S %d cp2 %d rsw %d psw %d "
                       "nch %d tiles_w %d", q.threads, q.a.tw, q.smem, q.blocks, (long long)want,
                       q.S, q.cp2, q.a.rsw, q.a.psw, q.a.nch, q.a.tiles_w));
            }
            if (ver == 1) run_plan<T>(p, c.N);
            else run_plan2<T>(q);
            const char *vtag = var == 1 ? " [misaligned]" : var == 2 ? " [tiling]" : "";
            /* guards */
            bool gok = true;
            for (int i = 0; i < G + off; i++) gok = gok && bits16(out[(size_t)i]) == bits16(guard);
            for (size_t i = G + off + nout; i < out.size(); i++)
                gok = gok && bits16(out[i]) == bits16(guard);
            ok(gok, NAME("%s %s%s: no write outside the tensor", name, vn, vtag),
               "a guard element changed");
            if (var == 0) {
                long bad = 0, firstbad = -1, vbad = 0, vfirst = -1;
                for (size_t i = 0; i < nout; i++) {
                    double gv = sc_f<T>(out[G + i]);
                    double e = (double)(terms + 1) * std::ldexp(1.0, -24) * mag[i];
                    double bound = u * std::fabs(ref[i]) + (1 + u) * e + aa;
                    if (!(std::isfinite(gv) && std::fabs(gv - ref[i]) <= bound)) {
                        if (firstbad < 0) firstbad = (long)i;
                        bad++;
                    }
                    /* v2 vs v1: both within the bound of the reference */
                    if (ver == 2 && !(std::fabs(gv - (double)v1out[i]) <= 2 * bound)) {
                        if (vfirst < 0) vfirst = (long)i;
                        vbad++;
                    }
                }
                ok(bad == 0, NAME("%s %s: vs float64", name, vn),
                   WHY("%ld of %zu outside the bound (first %ld: emu %.8g ref %.8g)", bad, nout,
                       firstbad, firstbad >= 0 ? (double)sc_f<T>(out[G + (size_t)firstbad]) : 0.0,
                       firstbad >= 0 ? ref[(size_t)firstbad] : 0.0));
                if (ver == 2)
                    ok(vbad == 0, NAME("%s: v2 vs v1 (within twice the bound)", name),
                       WHY("%ld of %zu differ more (first %ld: v2 %.8g v1 %.8g)", vbad, nout,
                           vfirst, vfirst >= 0 ? (double)sc_f<T>(out[G + (size_t)vfirst]) : 0.0,
                           vfirst >= 0 ? (double)v1out[(size_t)vfirst] : 0.0));
                first.resize(nout);
                for (size_t i = 0; i < nout; i++) first[i] = bits16(out[G + i]);
                if (ver == 1) {
                    v1out.resize(nout);
                    for (size_t i = 0; i < nout; i++) v1out[i] = sc_f<T>(out[G + i]);
                }
            } else {
                size_t diff = 0;
                for (size_t i = 0; i < nout; i++) diff += bits16(out[G + off + i]) != first[i];
                ok(diff == 0, NAME("%s %s: %s = default (bitwise)", name, vn,
                                   var == 1 ? "misaligned pointers" : "other tiling"),
                   WHY("%zu of %zu elements differ", diff, nout));
            }
        }
    }
}

int main() {
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++)
        for (int pass = 0; pass < 3; pass++) {
            run_case<__nv_bfloat16>(CASES[k], "bf16", pass);
            if (k % 3 == 0) run_case<__half>(CASES[k], "f16", pass);
        }
    for (size_t k = 0; k < sizeof FULL / sizeof FULL[0]; k++)
        for (int pass = 0; pass < 3; pass++)
            if (FULL[k].passes >> pass & 1) run_case<__nv_bfloat16>(FULL[k].c, "bf16", pass, true);
    return failures ? 1 : 0;
}
