/*
 * test_conv_small_wgrad_emu.cu — host emulation of the small-channel
 * filter gradient (cuda/nn_conv_small.cu, section "filter gradient":
 * sw_wgrad + sw_fold).  The launch plan (sw_plan_make) and the kernels'
 * own per-thread phases (sw_stage, sw_accum, sw_dw_index) run on the CPU
 * one block at a time, each phase for every thread of the block in turn
 * (what the kernel's __syncthreads guarantee); the warp butterfly
 * (sw_bfly's __shfl_xor_sync) and the fold are emulated step by step in
 * the kernels' order.  Needs nvcc, not a GPU (runs in make test).
 *
 * Per case (stride 1 and 2; odd, tiny and wide planes; Cin 1..16 giving
 * 1..4 channel chunks of 1..4 channels, Cout 1..16 giving 1..4 output
 * warps and 1, 2 or 4 row warps; several splits and tiles per split), bf16
 * (and f16 for some), beta 0 (dw poisoned with NaN) and beta 1:
 *   - every dw element within the float64 bound
 *       |emu - ref| <= D * 2^-24 * (sum |terms| + |beta*dw0|)
 *     where ref = beta*dw0 + sum of the products of the dtype-rounded x and
 *     dy (exact in f32), D = the depth of the f32 summation tree (the
 *     thread's products per*4, the butterfly 5, the row warps, the fold's
 *     ceil(S/16) + 16, beta 1);
 *   - the plan: <= 128 threads in whole warps, dynamic shared memory
 *     < 48 KiB, splits x tiles per split covering the tiles exactly once;
 *     sw_dw_index naming every dw element exactly once over (output warp,
 *     channel chunk, lane, sum);
 *   - every partial of every split written (scratch poisoned with NaN);
 *   - shared memory poisoned with NaN before each staging: a read of
 *     anything the block did not stage shows up.
 * Plus layer 0 of the network at full size (3>16 s2 640x640 batch 4,
 * bf16).  The device runs IEEE fmaf / adds in the same order, so the GPU
 * must produce these bits (spec/c/test_conv_small_cuda.c checks the bound
 * and run-to-run identity there).
 */
#include "nn_conv_small.cu"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/* Not linked into this host-only program: cuda/backend.cu and engine/core. */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
extern "C" lucid_status lucid_seterr(lucid_ctx *, lucid_status s, const char *, ...) { return s; }
extern "C" const char *lucid_dtype_name(lucid_dtype) { return "?"; }
lucid_status lucid_cuda_err(lucid_ctx *, cudaError_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}

#define TAP_HOST_SEED 0x5bd1e9955bd1e995ull
#include "tap_host.h"

struct wcase {
    int N, Cin, H, W, Cout, s;
};

static const wcase CASES[] = {
    {2, 3, 33, 31, 16, 2},  {1, 1, 7, 9, 1, 1},    {3, 5, 17, 70, 6, 1},
    {2, 16, 9, 40, 8, 1},   {1, 8, 20, 20, 16, 2}, {2, 16, 5, 3, 16, 2},
    {1, 12, 1, 1, 10, 1},   {2, 4, 37, 65, 12, 2}, {1, 7, 2, 3, 3, 1},
    {2, 16, 40, 33, 4, 1},  {1, 2, 160, 6, 8, 2},  {4, 3, 64, 64, 16, 2},
    {2, 16, 31, 29, 16, 1}, {1, 3, 300, 5, 2, 2},
};

/* One run of the two kernels on the host: part [S][nk], then dw. */
template <typename T, int S, int CB>
static void emulate(const sw_plan &p, std::vector<float> &part, float *dw) {
    const sw_args &a = p.a;
    constexpr int M = SW_M(CB), P = 32 * M;
    const int nw = (int)p.threads / 32;
    std::vector<float> sm(p.smem / sizeof(float));
    std::vector<float> v((size_t)nw * 32 * P), nv(v.size());
    for (int cg = 0; cg < a.ncg; cg++)
        for (int sp = 0; sp < a.S; sp++) {
            std::fill(v.begin(), v.end(), 0.0f);
            const int t0 = sp * a.per, t1 = std::min(t0 + a.per, a.tiles);
            for (int t = t0; t < t1; t++) {
                const sw_tile tl = sw_tile_of(a, t);
                std::fill(sm.begin(), sm.end(), NAN);
                for (int w = 0; w < nw; w++)
                    for (int l = 0; l < 32; l++) sw_stage<T, S>(a, sm.data(), tl, cg, w, nw, l);
                for (int w = 0; w < nw; w++)
                    for (int l = 0; l < 32; l++)
                        sw_accum<T, S, CB>(a, sm.data(), tl, w % a.nog, w / a.nog, l,
                                           &v[((size_t)w * 32 + l) * P]);
            }
            /* butterfly: all lanes of a step at once (from the old values) */
            for (int w = 0; w < nw; w++) {
                int h = 16 * M;
                for (int b = 16; b >= 1; b >>= 1, h >>= 1) {
                    for (int l = 0; l < 32; l++) {
                        const float *me = &v[((size_t)w * 32 + l) * P];
                        const float *pa = &v[((size_t)w * 32 + (l ^ b)) * P];
                        float *out = &nv[((size_t)w * 32 + l) * P];
                        const bool up = (l & b) != 0;
                        for (int k = 0; k < h; k++)
                            out[k] = up ? me[k + h] + pa[k + h] : me[k] + pa[k];
                    }
                    for (int l = 0; l < 32; l++)
                        memcpy(&v[((size_t)w * 32 + l) * P], &nv[((size_t)w * 32 + l) * P],
                               (size_t)h * sizeof(float));
                }
            }
            for (int w = 0; w < a.nog; w++) /* the row-warp-0 warps */
                for (int l = 0; l < 32; l++)
                    for (int m = 0; m < M; m++) {
                        float s = v[((size_t)w * 32 + l) * P + m];
                        for (int r = 1; r < a.rw; r++)
                            s += v[((size_t)(r * a.nog + w) * 32 + l) * P + m];
                        const int e = sw_dw_index<CB>(a, w, cg, l, m);
                        if (e >= 0) part[(size_t)sp * a.nk + e] = s;
                    }
        }
    for (int k = 0; k < a.nk; k++) {
        float red[SW_FOLD_WARPS];
        for (int f = 0; f < SW_FOLD_WARPS; f++) {
            float s = 0.0f;
            for (int sp = f; sp < a.S; sp += SW_FOLD_WARPS) s += part[(size_t)sp * a.nk + k];
            red[f] = s;
        }
        float tot = red[0];
        for (int f = 1; f < SW_FOLD_WARPS; f++) tot += red[f];
        dw[k] = a.beta != 0.0f ? fmaf(a.beta, dw[k], tot) : tot;
    }
}

template <typename T, int S>
static void emulate_s(const sw_plan &p, std::vector<float> &part, float *dw) {
    switch (p.a.cb) {
    case 1: emulate<T, S, 1>(p, part, dw); break;
    case 2: emulate<T, S, 2>(p, part, dw); break;
    case 3: emulate<T, S, 3>(p, part, dw); break;
    default: emulate<T, S, 4>(p, part, dw); break;
    }
}

/* Plan checks: limits, tile cover, dw index cover. */
template <int CB>
static bool index_cover(const sw_args &a, std::vector<int> &seen) {
    for (int og = 0; og < a.nog; og++)
        for (int cg = 0; cg < a.ncg; cg++)
            for (int l = 0; l < 32; l++)
                for (int m = 0; m < SW_M(CB); m++) {
                    const int e = sw_dw_index<CB>(a, og, cg, l, m);
                    if (e >= a.nk) return false;
                    if (e >= 0) seen[e]++;
                }
    return true;
}

static void check_plan(const char *name, const lucid_conv_small_geom &g, const sw_plan &p) {
    const sw_args &a = p.a;
    ok(p.threads >= 32 && p.threads <= 32 * SW_WARPS && p.threads % 32 == 0 &&
           (int)p.threads == 32 * a.nog * a.rw,
       NAME("%s: plan threads", name), WHY("threads %u", p.threads));
    ok(p.smem < 48 * 1024 && p.smem > 0, NAME("%s: plan shared memory < 48 KiB", name),
       WHY("smem %zu", p.smem));
    ok(a.S >= 1 && (int64_t)a.S * a.per >= a.tiles && (int64_t)(a.S - 1) * a.per < a.tiles &&
           a.tiles == a.N * a.tiles_h * a.tiles_w && a.tiles_h * a.th >= a.Ho &&
           a.tiles_w * SW_TW >= a.Wo,
       NAME("%s: plan splits cover the tiles once", name),
       WHY("S %d per %d tiles %d", a.S, a.per, a.tiles));
    ok(a.ncg * a.cb >= a.Cin && (a.ncg - 1) * a.cb < a.Cin && a.cb <= SW_CBMAX &&
           a.nog * SW_OB >= a.Cout && a.nk == a.Cout * a.Cin * 9,
       NAME("%s: plan channel chunks", name), WHY("cb %d ncg %d nog %d", a.cb, a.ncg, a.nog));
    std::vector<int> seen((size_t)a.nk, 0);
    bool in = a.cb == 1 ? index_cover<1>(a, seen) : a.cb == 2 ? index_cover<2>(a, seen)
              : a.cb == 3 ? index_cover<3>(a, seen) : index_cover<4>(a, seen);
    int bad = 0;
    for (int e = 0; e < a.nk; e++) bad += seen[e] != 1;
    ok(in && bad == 0, NAME("%s: every dw element named exactly once", name),
       WHY("%d elements not once (in range %d)", bad, (int)in));
    ok(lucid_conv_small_wgrad_scratch(&g) == (size_t)a.S * a.nk * sizeof(float),
       NAME("%s: scratch size", name), WHY("%zu", lucid_conv_small_wgrad_scratch(&g)));
}

template <typename T>
static void run_case(const wcase &c, const char *dtn, bool plan_checks) {
    lucid_conv_small_geom g = {c.N, c.Cin, c.H, c.W, c.Cout, (c.H - 1) / c.s + 1,
                               (c.W - 1) / c.s + 1, 3, 3, c.s, c.s, 1, 1, 1, 1, 1};
    char base[160];
    snprintf(base, sizeof base, "wgrad %dx%dx%dx%d > %d s%d %s", c.N, c.Cin, c.H, c.W, c.Cout,
             c.s, dtn);
    const lucid_dtype dt = std::is_same<T, __half>::value ? LUCID_F16 : LUCID_BF16;
    ok(lucid_conv_small_wgrad_eligible(&g, dt), NAME("%s: eligible", base), "refused");
    sw_plan p;
    sw_plan_make(&g, &p);
    if (plan_checks) check_plan(base, g, p);
    const int64_t nx = g.N * g.Cin * g.H * g.W, ny = g.N * g.Cout * g.Ho * g.Wo;
    std::vector<T> x((size_t)nx), dy((size_t)ny);
    for (auto &e : x) e = sc_t<T>((float)urand(-2.0, 2.0));
    for (auto &e : dy) e = sc_t<T>((float)urand(-1.0, 1.0));
    /* float64 reference: sums and sums of |terms| */
    const int nk = (int)(g.Cout * g.Cin * 9);
    std::vector<double> ref((size_t)nk, 0.0), mag((size_t)nk, 0.0);
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t o = 0; o < g.Cout; o++)
            for (int64_t i = 0; i < g.Ho; i++)
                for (int64_t j = 0; j < g.Wo; j++) {
                    const double d = sc_f<T>(dy[(size_t)(((n * g.Cout + o) * g.Ho + i) * g.Wo + j)]);
                    for (int64_t ci = 0; ci < g.Cin; ci++)
                        for (int r = 0; r < 3; r++) {
                            const int64_t h = i * c.s - 1 + r;
                            if (h < 0 || h >= g.H) continue;
                            for (int q = 0; q < 3; q++) {
                                const int64_t v = j * c.s - 1 + q;
                                if (v < 0 || v >= g.W) continue;
                                const double xv =
                                    sc_f<T>(x[(size_t)(((n * g.Cin + ci) * g.H + h) * g.W + v)]);
                                const size_t e = (size_t)((o * g.Cin + ci) * 9 + r * 3 + q);
                                ref[e] += d * xv;
                                mag[e] += fabs(d * xv);
                            }
                        }
                }
    const double D = (double)p.a.per * SW_RPW + 5 + p.a.rw + (p.a.S + 15) / 16 + 16 + 1;
    for (int beta = 0; beta <= 1; beta++) {
        std::vector<float> dw((size_t)nk), dw0((size_t)nk);
        for (int k = 0; k < nk; k++) dw0[k] = beta ? (float)urand(-1.0, 1.0) : NAN;
        dw = dw0;
        std::vector<float> part((size_t)p.a.S * nk, NAN);
        sw_plan q = p;
        q.a.x = x.data();
        q.a.dy = dy.data();
        q.a.beta = (float)beta;
        if (c.s == 1) emulate_s<T, 1>(q, part, dw.data());
        else emulate_s<T, 2>(q, part, dw.data());
        int unwritten = 0;
        for (float f : part) unwritten += std::isnan(f);
        ok(unwritten == 0, NAME("%s beta %d: every partial written", base, beta),
           WHY("%d of %zu partials NaN", unwritten, part.size()));
        int bad = 0, first = -1;
        double worst = 0.0;
        for (int k = 0; k < nk; k++) {
            const double b0 = beta ? (double)dw0[k] : 0.0;
            const double r = b0 + ref[k], tol = D * std::ldexp(1.0, -24) * (mag[k] + fabs(b0)) + 1e-30;
            const double err = fabs((double)dw[k] - r);
            if (!(err <= tol)) {
                if (first < 0) first = k;
                bad++;
            }
            if (err / tol > worst) worst = err / tol;
        }
        ok(bad == 0, NAME("%s beta %d: dw within the float64 bound", base, beta),
           WHY("%d of %d off; first %d: %.9g vs %.9g (err/bound worst %.3g)", bad, nk, first,
               first >= 0 ? dw[first] : 0.0, first >= 0 ? ref[first] : 0.0, worst));
    }
}

int main() {
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        run_case<__nv_bfloat16>(CASES[k], "bf16", true);
        if (k % 3 == 0) run_case<__half>(CASES[k], "f16", false);
    }
    /* layer 0 at full size */
    run_case<__nv_bfloat16>(wcase{4, 3, 640, 640, 16, 2}, "bf16", true);
    /* ineligible for the filter gradient: Cin or Cout over 16 */
    lucid_conv_small_geom g17 = {1, 17, 8, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    lucid_conv_small_geom g32 = {1, 8, 8, 8, 32, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    ok(!lucid_conv_small_wgrad_eligible(&g17, LUCID_BF16) &&
           !lucid_conv_small_wgrad_eligible(&g32, LUCID_BF16) &&
           lucid_conv_small_wgrad_scratch(&g17) == 0 &&
           !lucid_conv_small_wgrad_eligible(&g17, LUCID_F32),
       "wgrad: Cin 17 / Cout 32 / f32 refused", "accepted");
    return failures ? 1 : 0;
}
