/*
 * test_conv_small_cuda.c — the small-channel 3x3 conv route (cuda/nn_conv_small.cu,
 * ROUTE_SMALL of cuda/nn_conv.cu): forward and backward-data against the
 * engine's CPU conv and a float64 reference, run-to-run repeatability,
 * capture, the route choice and the eligibility function.
 *
 * Host-only checks (every CUDA build, with or without a device):
 *   lucid_conv_small_eligible on the network's four small shapes (3->16 s2
 *   640, 16->32 s2 320, 16->8 and 8->16 at 160) in bf16 and f16, the
 *   threshold edges (Cin*Cout = 512 qualifies, 527 and 1024 do not), odd
 *   and tiny planes; refused: f32, f64, groups 2, 5x5 / 1x1 / 3x1 kernels,
 *   dilation 2, stride 3 and mixed strides, padding 0 / 2 / mixed, an
 *   inconsistent Ho or Wo, N or C 0, more than 2^31 elements, NULL;
 *   LUCID_CONV_SMALL as read (lucid_conv_small_switch agrees with the
 *   environment); the kernel generation: LUCID_CONV_SMALL_V as read
 *   (lucid_conv_small_version), lucid_conv_small_set_version forcing 1 and
 *   2 and returning the previous value, lucid_conv_small_kernel naming v2
 *   for the forward (stride 1, 2) and stride-1 backward-data with Ci, Co
 *   <= 16 (the network's layer 0 and 160x160 bottleneck) and v1 otherwise
 *   or when forced, 0 for pass 2, f32 or an ineligible geometry; the direct
 *   entry points return ERR_ARG (ineligible geometry) and ERR_UNSUPPORTED
 *   (f32) with a message, before any device work.
 * Device checks (skipped without a device), each in bf16 and f16:
 *   - every case below through the nn entry points with the route forced
 *     on (lucid_cuda_nn_set_conv_small 2): forward (with and without bias),
 *     backward-data beta 0 (dx poisoned with NaN) and beta 1 (dx random);
 *     one kernel launch each on this route (lucid_conv_small_launch_count);
 *     compared with the engine's CPU conv on the same rounded inputs
 *     (relative Frobenius error <= 1e-2, the bf16/f16 conv tolerance of
 *     spec/c/test_nn_cuda.c) and, per element, with a float64 reference of
 *     the conv with the weights rounded to the dtype:
 *       |gpu - ref| <= u*|ref| + (1 + u)*(t + 1)*2^-24*S + a
 *     (S the sum of |terms| including |b| and |beta*dx|, t their number;
 *     u = 2^-8 bf16, 2^-11 f16: the one rounding; a = 2^-25 for f16, half
 *     its subnormal spacing); each pass run twice: bitwise identical;
 *     the kernel generation lucid_conv_small_kernel names ran
 *     (lucid_conv_small_tc_launch_count); where that is v2, the pass again
 *     with v1 forced (lucid_conv_small_set_version 1): within the same
 *     float64 bound, and v2 within twice the bound of v1 element by element
 *     (new vs old; beta 0 and 1);
 *   - the same calls with the route off (set_conv_small 1): no launch on
 *     this route (the implicit GEMM) and within 1e-2 of the CPU;
 *   - ineligible shapes (32->32, 17->31, pad 0, 5x5, dilation 2, groups 2,
 *     1x1, stride 3, f32) with the route forced on: no launch on it;
 *   - the direct entry points with every pointer one element past an
 *     aligned address (the scalar staging and store paths): bitwise equal
 *     to the aligned run of the nn route;
 *   - capture: forward and backward-data (beta 0 and 1) recorded into a
 *     CUDA graph after an eager pass, replayed: bitwise equal to eager.
 * Cases: stride 1 and 2; even, odd and tiny planes (7x9, 33x32, 31x33,
 * 160x160, 640x640, 2x3, 1x1, 5x300, 70x1, 9x300, 6x600); Cin
 * 1/3/4/5/8/12/16/512, Cout 1/4/6/7/8/10/12/16/20/32/512 (several channel
 * groups, several channel super-groups, staged channel chunks; v2: 1..8
 * warps per block, two or more tiles per row, padded channel pairs);
 * batch 1, 2, 3 and 4; the five passes of the network at full size (layer
 * 0 3>16 s2 640x640 batch 4 forward, the 160x160 bottleneck's 16>8 and
 * 8>16 batch 4 forward and backward-data).
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "../../cuda/nn_conv_small.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* As in test_conv_dw_cuda.c: strong references in a CUDA build (the stamp
 * build/.config-cuda1 tells it), weak ones in a CPU-only build. */
#if defined(__has_include)
#if __has_include("../../build/.config-cuda1")
#define SC_CUDA_BUILD 1
#endif
#endif
#ifdef SC_CUDA_BUILD
#define SC_LINKED() 1
#else
#pragma weak lucid_conv_small_eligible
#pragma weak lucid_conv_small_preferred
#pragma weak lucid_conv_small_switch
#pragma weak lucid_conv_small_forward
#pragma weak lucid_conv_small_backward_data
#pragma weak lucid_conv_small_launch_count
#pragma weak lucid_conv_small_tc_launch_count
#pragma weak lucid_conv_small_version
#pragma weak lucid_conv_small_set_version
#pragma weak lucid_conv_small_kernel
#define SC_LINKED()                                                           \
    (lucid_conv_small_eligible && lucid_conv_small_switch &&                 \
     lucid_conv_small_forward && lucid_conv_small_backward_data &&           \
     lucid_conv_small_launch_count && lucid_conv_small_tc_launch_count &&    \
     lucid_conv_small_version && lucid_conv_small_set_version &&             \
     lucid_conv_small_kernel)
#endif
/* cuda/nn_table.cu hooks */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route);
#if defined(__GNUC__)
__attribute__((weak))
#endif
void *lucid_cuda_nn_stream(lucid_ctx *ctx);

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* ------------------------------------------------------------ host checks */

static lucid_conv_small_geom geom(int64_t N, int64_t Cin, int64_t H, int64_t W, int64_t Cout,
                                  int k, int s, int p, int d, int g) {
    lucid_conv_small_geom r;
    memset(&r, 0, sizeof r);
    r.N = N; r.Cin = Cin; r.H = H; r.W = W; r.Cout = Cout;
    r.kh = r.kw = k; r.sh = r.sw = s; r.ph = r.pw = p; r.dh = r.dw = d; r.groups = g;
    r.Ho = (H + 2 * p - d * (k - 1) - 1) / s + 1;
    r.Wo = (W + 2 * p - d * (k - 1) - 1) / s + 1;
    return r;
}

static void test_host(void) {
    static const struct {
        const char *tag;
        int64_t N, Cin, H, W, Cout;
        int s;
    } yes[] = {
        {"layer 0 3>16 s2 640", 4, 3, 640, 640, 16, 2},
        {"layer 1 16>32 s2 320", 4, 16, 320, 320, 32, 2},
        {"C3k2 16>8 160", 4, 16, 160, 160, 8, 1},
        {"C3k2 8>16 160", 4, 8, 160, 160, 16, 1},
        {"1>512 (edge)", 1, 1, 9, 9, 512, 1},
        {"512>1 (edge)", 1, 512, 9, 9, 1, 2},
        {"16>32 = 512 (edge)", 2, 16, 8, 8, 32, 1},
        {"odd 7x9", 3, 3, 7, 9, 8, 2},
        {"1x1 plane", 1, 4, 1, 1, 4, 2},
        {"1280 plane", 1, 3, 1280, 1280, 16, 2},
    };
    for (size_t i = 0; i < NELEM(yes); i++)
        for (int d = 0; d < 2; d++) {
            lucid_dtype dt = d ? LUCID_F16 : LUCID_BF16;
            lucid_conv_small_geom g =
                geom(yes[i].N, yes[i].Cin, yes[i].H, yes[i].W, yes[i].Cout, 3, yes[i].s, 1, 1, 1);
            CHECK(NAME("conv_small eligible: %s %s", yes[i].tag, lucid_dtype_name(dt)),
                  lucid_conv_small_eligible(&g, dt) == 1, "refused");
        }
    lucid_conv_small_geom base = geom(4, 16, 160, 160, 8, 3, 1, 1, 1, 1), g;
    CHECK("conv_small refused: f32", !lucid_conv_small_eligible(&base, LUCID_F32), "accepted");
    CHECK("conv_small refused: f64", !lucid_conv_small_eligible(&base, LUCID_F64), "accepted");
    CHECK("conv_small refused: NULL", !lucid_conv_small_eligible(NULL, LUCID_BF16), "accepted");
#define REFUSE(tag, expr)                                                     \
    do {                                                                      \
        g = base;                                                             \
        expr;                                                                 \
        CHECK("conv_small refused: " tag, !lucid_conv_small_eligible(&g, LUCID_BF16), \
              "accepted");                                                    \
    } while (0)
    REFUSE("32>32 (1024)", (g = geom(4, 32, 160, 160, 32, 3, 1, 1, 1, 1)));
    REFUSE("17>31 (527)", (g = geom(4, 17, 16, 16, 31, 3, 1, 1, 1, 1)));
    REFUSE("1>513", (g = geom(1, 1, 16, 16, 513, 3, 1, 1, 1, 1)));
    REFUSE("groups 2", (g = geom(4, 16, 16, 16, 8, 3, 1, 1, 1, 2)));
    REFUSE("5x5", (g = geom(4, 16, 16, 16, 8, 5, 1, 2, 1, 1)));
    REFUSE("1x1", (g = geom(4, 16, 16, 16, 8, 1, 1, 0, 1, 1)));
    REFUSE("3x1 kernel", (g.kw = 1, g.pw = 0));
    REFUSE("dilation 2", (g = geom(4, 16, 16, 16, 8, 3, 1, 2, 2, 1)));
    REFUSE("stride 3", (g = geom(4, 16, 16, 16, 8, 3, 3, 1, 1, 1)));
    REFUSE("stride 1,2", (g.sw = 2, g.Wo = 80));
    REFUSE("pad 0", (g = geom(4, 16, 16, 16, 8, 3, 1, 0, 1, 1)));
    REFUSE("pad 2", (g = geom(4, 16, 16, 16, 8, 3, 1, 2, 1, 1)));
    REFUSE("pad 1,0", (g.pw = 0, g.Wo = 158));
    REFUSE("Ho inconsistent", (g.Ho = 159));
    REFUSE("Wo inconsistent", (g.Wo = 80));
    REFUSE("N 0", (g.N = 0));
    REFUSE("Cin 0", (g.Cin = 0));
    REFUSE("Cout 0", (g.Cout = 0));
    REFUSE("x over 2^31 elements", (g = geom(8, 16, 4096, 4096, 8, 3, 1, 1, 1, 1)));
    REFUSE("y over 2^31 elements", (g = geom(1, 1, 2048, 2048, 512, 3, 1, 1, 1, 1)));
    REFUSE("plane over 2^31 elements", (g = geom(1, 1, 46341, 46341, 1, 3, 1, 1, 1, 1)));
#undef REFUSE

    /* the default switch's preference (LUCID_CONV_SMALL_PREFER_CC = 256):
     * the YOLO11n-pose shapes measured faster here, not the products of 512 */
    struct { const char *tag; int cin, cout, s, want; } pref[] = {
        {"3->16 s2 (layer 0)", 3, 16, 2, 1}, {"16->8 (160x160 bottleneck)", 16, 8, 1, 1},
        {"8->16", 8, 16, 1, 1}, {"16->16 (= 256)", 16, 16, 1, 1},
        {"16->32 s2 (layer 1, 512)", 16, 32, 2, 0}, {"32->16 (80x80 bottleneck, 512)", 32, 16, 1, 0},
    };
    for (size_t i = 0; i < sizeof pref / sizeof pref[0]; i++) {
        lucid_conv_small_geom pg = geom(4, pref[i].cin, 64, 64, pref[i].cout, 3, pref[i].s, 1, 1, 1);
        CHECK(NAME("conv_small preferred: %s", pref[i].tag),
              lucid_conv_small_eligible(&pg, LUCID_BF16) &&
                  lucid_conv_small_preferred(&pg) == pref[i].want,
              "eligible %d preferred %d", lucid_conv_small_eligible(&pg, LUCID_BF16),
              lucid_conv_small_preferred(&pg));
    }

    const char *v = NULL;
    int sw = lucid_conv_small_switch(&v);
    const char *env = getenv("LUCID_CONV_SMALL");
    int want = !env || !env[0] || strcmp(env, "1") == 0 ? 1 : strcmp(env, "0") == 0 ? 0 : -1;
    CHECK("conv_small switch follows LUCID_CONV_SMALL", sw == want && v &&
              strcmp(v, env ? env : "") == 0,
          "switch %d value \"%s\", environment \"%s\"", sw, v ? v : "(null)", env ? env : "");

    /* the kernel generation: LUCID_CONV_SMALL_V, then the process override */
    const char *venv = getenv("LUCID_CONV_SMALL_V");
    int vwant = !venv || !venv[0] || strcmp(venv, "2") == 0 ? 2 : strcmp(venv, "1") == 0 ? 1 : -1;
    v = NULL;
    int ver = lucid_conv_small_version(&v);
    CHECK("conv_small version follows LUCID_CONV_SMALL_V", ver == vwant && v &&
              strcmp(v, venv ? venv : "") == 0,
          "version %d value \"%s\", environment \"%s\"", ver, v ? v : "(null)",
          venv ? venv : "");
    {
        int p0 = lucid_conv_small_set_version(1);
        int v1 = lucid_conv_small_version(NULL);
        int p1 = lucid_conv_small_set_version(2);
        int v2 = lucid_conv_small_version(NULL);
        int p2 = lucid_conv_small_set_version(7); /* not 1 or 2: back to the environment */
        int v3 = lucid_conv_small_version(NULL);
        int p3 = lucid_conv_small_set_version(p0);
        CHECK("conv_small set_version forces 1 and 2, returns the previous, 0 follows the "
              "environment",
              p0 == 0 && v1 == 1 && p1 == 1 && v2 == 2 && p2 == 2 && v3 == vwant && p3 == 0,
              "previous %d %d %d %d, versions %d %d %d", p0, p1, p2, p3, v1, v2, v3);
    }
    /* which passes v2 takes: forward s1/s2 and backward s1 with Ci, Co <= 16 */
    static const struct {
        const char *tag;
        int64_t N, Cin, H, W, Cout;
        int s, fwd, bwd; /* kernel generation with v2 on */
    } kern[] = {
        {"layer 0 3>16 s2 640", 4, 3, 640, 640, 16, 2, 2, 1},
        {"C3k2 16>8 160", 4, 16, 160, 160, 8, 1, 2, 2},
        {"C3k2 8>16 160", 4, 8, 160, 160, 16, 1, 2, 2},
        {"layer 1 16>32 s2 320 (Cout 32)", 4, 16, 320, 320, 32, 2, 1, 1},
        {"32>16 80 (Cin 32)", 4, 32, 80, 80, 16, 1, 1, 1},
        {"16>16 s1 odd 7x9", 2, 16, 7, 9, 16, 1, 2, 2},
        {"1>1 1x1", 1, 1, 1, 1, 1, 1, 2, 2},
        {"5>7 s2 9x33", 2, 5, 9, 33, 7, 2, 2, 1},
    };
    int prev = lucid_conv_small_set_version(2);
    for (size_t i = 0; i < NELEM(kern); i++) {
        lucid_conv_small_geom kg =
            geom(kern[i].N, kern[i].Cin, kern[i].H, kern[i].W, kern[i].Cout, 3, kern[i].s, 1, 1, 1);
        int f = lucid_conv_small_kernel(&kg, LUCID_BF16, 0), b = lucid_conv_small_kernel(&kg, LUCID_F16, 1);
        CHECK(NAME("conv_small kernel with v2 on: %s", kern[i].tag),
              f == kern[i].fwd && b == kern[i].bwd, "forward %d backward %d (want %d %d)", f, b,
              kern[i].fwd, kern[i].bwd);
    }
    lucid_conv_small_set_version(1);
    {
        lucid_conv_small_geom kg = geom(4, 16, 160, 160, 8, 3, 1, 1, 1, 1);
        CHECK("conv_small kernel with v1 forced: 1 for both passes",
              lucid_conv_small_kernel(&kg, LUCID_BF16, 0) == 1 &&
                  lucid_conv_small_kernel(&kg, LUCID_BF16, 1) == 1,
              "forward %d backward %d", lucid_conv_small_kernel(&kg, LUCID_BF16, 0),
              lucid_conv_small_kernel(&kg, LUCID_BF16, 1));
    }
    lucid_conv_small_set_version(prev);
    {
        lucid_conv_small_geom kg = geom(4, 16, 160, 160, 8, 3, 1, 1, 1, 1);
        lucid_conv_small_geom kb = geom(4, 32, 16, 16, 32, 3, 1, 1, 1, 1);
        CHECK("conv_small kernel: 0 for pass 2, f32, an ineligible geometry",
              lucid_conv_small_kernel(&kg, LUCID_BF16, 2) == 0 &&
                  lucid_conv_small_kernel(&kg, LUCID_F32, 0) == 0 &&
                  lucid_conv_small_kernel(&kb, LUCID_BF16, 0) == 0,
              "%d %d %d", lucid_conv_small_kernel(&kg, LUCID_BF16, 2),
              lucid_conv_small_kernel(&kg, LUCID_F32, 0), lucid_conv_small_kernel(&kb, LUCID_BF16, 0));
    }

    lucid_ctx *c = test_cpu_ctx();
    if (!c) return;
    lucid_conv_small_geom bad = geom(1, 32, 8, 8, 32, 3, 1, 1, 1, 1);
    lucid_status st = lucid_conv_small_forward(c, NULL, LUCID_BF16, &bad, NULL, NULL, NULL, NULL);
    CHECK("conv_small forward: ineligible geometry is ERR_ARG with a message",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(c), "not eligible"), "%s: %s",
          lucid_status_name(st), lucid_ctx_error(c));
    st = lucid_conv_small_backward_data(c, NULL, LUCID_F16, &bad, NULL, NULL, NULL, 0.0);
    CHECK("conv_small backward_data: ineligible geometry is ERR_ARG with a message",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(c), "Cin*Cout"), "%s: %s",
          lucid_status_name(st), lucid_ctx_error(c));
    st = lucid_conv_small_forward(c, NULL, LUCID_F32, &base, NULL, NULL, NULL, NULL);
    CHECK("conv_small forward: f32 is ERR_UNSUPPORTED with a message",
          st == LUCID_ERR_UNSUPPORTED && strstr(lucid_ctx_error(c), "f32"), "%s: %s",
          lucid_status_name(st), lucid_ctx_error(c));
    st = lucid_conv_small_backward_data(c, NULL, LUCID_F32, &base, NULL, NULL, NULL, 1.0);
    CHECK("conv_small backward_data: f32 is ERR_UNSUPPORTED",
          st == LUCID_ERR_UNSUPPORTED, "%s: %s", lucid_status_name(st), lucid_ctx_error(c));
    lucid_ctx_release(c);
}

/* ------------------------------------------------------------ references */

typedef struct sc_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int s, bias;
} sc_case;

static const sc_case NET[] = {
    {"layer 0 3>16 s2 640x640 N4", 4, 3, 640, 640, 16, 2, 0},
    {"layer 1 16>32 s2 320x320", 1, 16, 320, 320, 32, 2, 0},
    {"C3k2 16>8 160x160 N4", 4, 16, 160, 160, 8, 1, 0},
    {"C3k2 8>16 160x160 N4 bias", 4, 8, 160, 160, 16, 1, 1},
};

static const sc_case ODD[] = {
    {"3>8 7x9 N4 bias", 4, 3, 7, 9, 8, 1, 1},
    {"8>16 s2 7x9", 1, 8, 7, 9, 16, 2, 0},
    {"16>32 s2 33x32 N4 bias", 4, 16, 33, 32, 32, 2, 1},
    {"16>8 33x32", 1, 16, 33, 32, 8, 1, 0},
    {"8>32 33x32 N4", 4, 8, 33, 32, 32, 1, 0},
    {"3>32 s2 33x32 bias", 1, 3, 33, 32, 32, 2, 1},
    {"16>8 s2 31x33 N4 bias", 4, 16, 31, 33, 8, 2, 1},
    {"3>16 s2 160x160 N4", 4, 3, 160, 160, 16, 2, 0},
    {"8>12 24x40 N2 bias", 2, 8, 24, 40, 12, 1, 1},
    {"16>20 s2 24x40 N2", 2, 16, 24, 40, 20, 2, 0},
    {"1>512 20x70 N2 bias", 2, 1, 20, 70, 512, 1, 1},
    {"512>1 s2 17x40", 1, 512, 17, 40, 1, 2, 0},
    {"4>4 1x1 plane N3", 3, 4, 1, 1, 4, 1, 0},
    {"5>6 s2 2x3 N2 bias", 2, 5, 2, 3, 6, 2, 1},
    {"4>8 5x300", 1, 4, 5, 300, 8, 1, 0},
    {"4>4 s2 70x1 N2", 2, 4, 70, 1, 4, 2, 0},
    /* v2 tilings (the network's shapes scaled down, 1..8 warps per block,
     * two tiles per row, padded channel pairs, stride 2 with 8 / 16
     * channels, the shared-memory-limited tile, one channel) */
    {"3>16 s2 48x80 N2 bias", 2, 3, 48, 80, 16, 2, 1},
    {"16>8 20x96 N2", 2, 16, 20, 96, 8, 1, 0},
    {"8>16 17x200", 1, 8, 17, 200, 16, 1, 0},
    {"16>8 9x300 bias", 1, 16, 9, 300, 8, 1, 1},
    {"12>10 11x45 bias", 1, 12, 11, 45, 10, 1, 1},
    {"5>7 s2 9x33 N2", 2, 5, 9, 33, 7, 2, 0},
    {"16>16 s2 13x70 bias", 1, 16, 13, 70, 16, 2, 1},
    {"1>1 6x8", 1, 1, 6, 8, 1, 1, 0},
    {"16>16 s2 6x600", 1, 16, 6, 600, 16, 2, 0},
    {"16>8 16x160 N2 bias", 2, 16, 16, 160, 8, 1, 1},
    {"8>16 16x160 N2", 2, 8, 16, 160, 16, 1, 0},
};

static int64_t out_size(int64_t n, int s) { return (n - 1) / s + 1; }

/* A host tensor's elements as floats (malloc'ed; NULL on failure). */
static float *floats_of(const lucid_tensor *t) {
    int64_t n = lucid_tensor_numel(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (!f) return NULL;
    for (int64_t i = 0; i < n; i++) f[i] = (float)test_hget(t, i);
    return f;
}

/* float64 forward: ref = b + sum w*x, mag = |b| + sum |w*x| */
static void ref_fwd(const sc_case *cc, const float *x, const float *w, const float *b,
                    double *ref, double *mag) {
    int64_t Ho = out_size(cc->H, cc->s), Wo = out_size(cc->W, cc->s), e = 0;
    for (int64_t n = 0; n < cc->N; n++)
        for (int64_t o = 0; o < cc->Cout; o++)
            for (int64_t i = 0; i < Ho; i++)
                for (int64_t j = 0; j < Wo; j++, e++) {
                    double acc = b ? b[o] : 0.0, m = b ? fabs(b[o]) : 0.0;
                    for (int64_t c = 0; c < cc->Cin; c++) {
                        const float *xc = x + (n * cc->Cin + c) * cc->H * cc->W;
                        const float *wc = w + (o * cc->Cin + c) * 9;
                        for (int r = 0; r < 3; r++) {
                            int64_t hi = i * cc->s - 1 + r;
                            if (hi < 0 || hi >= cc->H) continue;
                            for (int q = 0; q < 3; q++) {
                                int64_t wi = j * cc->s - 1 + q;
                                if (wi < 0 || wi >= cc->W) continue;
                                double t = (double)wc[r * 3 + q] * xc[hi * cc->W + wi];
                                acc += t;
                                m += fabs(t);
                            }
                        }
                    }
                    ref[e] = acc;
                    mag[e] = m;
                }
}

/* float64 backward-data without beta: ref = sum w*dy, mag = sum |w*dy| */
static void ref_bwd(const sc_case *cc, const float *dy, const float *w, double *ref,
                    double *mag) {
    int64_t Ho = out_size(cc->H, cc->s), Wo = out_size(cc->W, cc->s), e = 0;
    for (int64_t n = 0; n < cc->N; n++)
        for (int64_t c = 0; c < cc->Cin; c++)
            for (int64_t h = 0; h < cc->H; h++)
                for (int64_t v = 0; v < cc->W; v++, e++) {
                    double acc = 0.0, m = 0.0;
                    for (int64_t o = 0; o < cc->Cout; o++) {
                        const float *dyo = dy + (n * cc->Cout + o) * Ho * Wo;
                        const float *wc = w + (o * cc->Cin + c) * 9;
                        for (int r = 0; r < 3; r++) {
                            int64_t ti = h + 1 - r;
                            if (ti < 0 || ti % cc->s || ti / cc->s >= Ho) continue;
                            for (int q = 0; q < 3; q++) {
                                int64_t tj = v + 1 - q;
                                if (tj < 0 || tj % cc->s || tj / cc->s >= Wo) continue;
                                double t = (double)wc[r * 3 + q] *
                                           dyo[(ti / cc->s) * Wo + tj / cc->s];
                                acc += t;
                                m += fabs(t);
                            }
                        }
                    }
                    ref[e] = acc;
                    mag[e] = m;
                }
}

/* Host copy h (elements [off, off + n)) against ref within the bound of the
 * header; t = terms per element. */
static void cmp_bound_at(const char *name, const lucid_tensor *h, int64_t off, const double *ref,
                         const double *mag, int64_t n, int64_t t, lucid_dtype dt) {
    const double u = dt == LUCID_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
    const double a = dt == LUCID_F16 ? ldexp(1.0, -25) : 0.0;
    int64_t nbad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = test_hget(h, off + i);
        double e = (double)(t + 1) * ldexp(1.0, -24) * mag[i];
        if (!(isfinite(g) && fabs(g - ref[i]) <= u * fabs(ref[i]) + (1 + u) * e + a)) {
            if (first < 0) first = i;
            nbad++;
        }
    }
    if (nbad)
        TEST_FAIL(name, "%lld of %lld elements outside the bound (first %lld: gpu %.8g ref "
                  "%.8g, S %.3g)",
                  (long long)nbad, (long long)n, (long long)first, test_hget(h, off + first),
                  ref[first], mag[first]);
    else
        TEST_OK(name);
}

static void cmp_bound(const char *name, const lucid_tensor *g, const double *ref,
                      const double *mag, int64_t t, lucid_dtype dt) {
    lucid_tensor *h = host(g);
    if (!h) {
        TEST_FAIL(name, "copy back failed: %s", lucid_ctx_error(ctx));
        return;
    }
    cmp_bound_at(name, h, 0, ref, mag, lucid_tensor_numel(h), t, dt);
    lucid_tensor_release(h);
}

/* Launches on the small route during the call of `expr`. */
#define ROUTE_COUNT(delta, expr)                                              \
    do {                                                                      \
        unsigned long c0_ = lucid_conv_small_launch_count();                  \
        lucid_status s_ = (expr);                                             \
        (delta) = s_ == LUCID_OK ? (long)(lucid_conv_small_launch_count() - c0_) : -1; \
    } while (0)

/* v1 launches of the small route during `expr` (the caller forced v1) and
 * the v2 (tensor-core) launches during `expr`. */
#define TC_COUNT(delta, expr)                                                 \
    do {                                                                      \
        unsigned long c0_ = lucid_conv_small_tc_launch_count();               \
        lucid_status s_ = (expr);                                             \
        (delta) = s_ == LUCID_OK ? (long)(lucid_conv_small_tc_launch_count() - c0_) : -1; \
    } while (0)

/* New vs old: the device result g (v1) against the host copy h (v2),
 * element by element within twice the bound of the header (both are within
 * it of ref). */
static void cmp_close(const char *name, const lucid_tensor *g, const lucid_tensor *h,
                      const double *ref, const double *mag, int64_t t, lucid_dtype dt) {
    lucid_tensor *o = host(g);
    if (!o) {
        TEST_FAIL(name, "copy back failed: %s", lucid_ctx_error(ctx));
        return;
    }
    const double u = dt == LUCID_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
    const double a = dt == LUCID_F16 ? ldexp(1.0, -25) : 0.0;
    int64_t n = lucid_tensor_numel(o), nbad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        double x = test_hget(o, i), y = test_hget(h, i);
        double e = (double)(t + 1) * ldexp(1.0, -24) * mag[i];
        if (!(fabs(x - y) <= 2 * (u * fabs(ref[i]) + (1 + u) * e + a))) {
            if (first < 0) first = i;
            nbad++;
        }
    }
    if (nbad)
        TEST_FAIL(name, "%lld of %lld elements differ more (first %lld: v1 %.8g v2 %.8g ref %.8g)",
                  (long long)nbad, (long long)n, (long long)first, test_hget(o, first),
                  test_hget(h, first), ref[first]);
    else
        TEST_OK(name);
    lucid_tensor_release(o);
}

/* ------------------------------------------------------------ one case */

/* The misaligned direct run: every device pointer one element past an
 * aligned address; y and dx (beta 0 and 1) compared bitwise with the nn
 * route's results hy, hdx0, hdx1 (host copies). */
static void test_misaligned(const char *pre, const sc_case *cc, lucid_dtype dt,
                            const lucid_tensor *hx, const lucid_tensor *hw,
                            const lucid_tensor *hb, const lucid_tensor *hdy,
                            const lucid_tensor *hdx1, const lucid_tensor *hy,
                            const lucid_tensor *hdx0, const lucid_tensor *hdx1r) {
    lucid_conv_small_geom g = geom(cc->N, cc->Cin, cc->H, cc->W, cc->Cout, 3, cc->s, 1, 1, 1);
    int64_t nx = lucid_tensor_numel(hx), ny = lucid_tensor_numel(hdy);
    int64_t sx[1] = {nx + 1}, sy[1] = {ny + 1};
    size_t es = lucid_dtype_size(dt);
    lucid_tensor *bx = hzeros(dt, 1, sx), *bdy = hzeros(dt, 1, sy), *bdx1 = hzeros(dt, 1, sx);
    lucid_tensor *gx = NULL, *gdy = NULL, *gdx1 = NULL, *gy = NULL, *gdx0 = NULL, *gw = NULL,
                 *gb = NULL, *h = NULL;
    void *stream = lucid_cuda_nn_stream ? lucid_cuda_nn_stream(ctx) : NULL;
    if (!bx || !bdy || !bdx1 || !stream) {
        TEST_FAIL(NAME("%s: misaligned setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    memcpy((char *)lucid_tensor_data(bx) + es, lucid_tensor_data(hx), (size_t)nx * es);
    memcpy((char *)lucid_tensor_data(bdy) + es, lucid_tensor_data(hdy), (size_t)ny * es);
    memcpy((char *)lucid_tensor_data(bdx1) + es, lucid_tensor_data(hdx1), (size_t)nx * es);
    gx = dev(bx); gdy = dev(bdy); gdx1 = dev(bdx1); gw = dev(hw); gb = hb ? dev(hb) : NULL;
    gy = dpoison(dt, 1, sy); gdx0 = dpoison(dt, 1, sx);
    if (!gx || !gdy || !gdx1 || !gw || !gy || !gdx0 || (hb && !gb)) {
        TEST_FAIL(NAME("%s: misaligned setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
#define OFF(t) ((char *)lucid_tensor_data(t) + es)
    RUN(NAME("%s: misaligned forward", pre),
        lucid_conv_small_forward(ctx, stream, dt, &g, OFF(gx), lucid_tensor_data(gw),
                                 gb ? lucid_tensor_data(gb) : NULL, OFF(gy)));
    RUN(NAME("%s: misaligned backward_data", pre),
        lucid_conv_small_backward_data(ctx, stream, dt, &g, OFF(gdy), lucid_tensor_data(gw),
                                       OFF(gdx0), 0.0));
    RUN(NAME("%s: misaligned backward_data beta 1", pre),
        lucid_conv_small_backward_data(ctx, stream, dt, &g, OFF(gdy), lucid_tensor_data(gw),
                                       OFF(gdx1), 1.0));
#undef OFF
    {
        const lucid_tensor *gs[3] = {gy, gdx0, gdx1};
        const lucid_tensor *rs[3] = {hy, hdx0, hdx1r};
        const char *what[3] = {"y", "dx beta 0", "dx beta 1"};
        for (int k = 0; k < 3; k++) {
            h = host(gs[k]);
            if (!h) {
                TEST_FAIL(NAME("%s: misaligned %s", pre, what[k]), "copy back failed");
                goto done;
            }
            int64_t n = lucid_tensor_numel(rs[k]);
            CHECK(NAME("%s: misaligned %s = aligned (bitwise)", pre, what[k]),
                  memcmp((char *)lucid_tensor_data(h) + es, lucid_tensor_data(rs[k]),
                         (size_t)n * es) == 0,
                  "differs");
            rel(h);
            h = NULL;
        }
    }
done:
    rel(h);
    rel(bx); rel(bdy); rel(bdx1); rel(gx); rel(gdy); rel(gdx1); rel(gy); rel(gdx0);
    rel(gw); rel(gb);
}

static void test_case(const sc_case *cc, lucid_dtype dt, int misaligned) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv_small %s %s", cc->tag, lucid_dtype_name(dt));
    lucid_conv2d_params p = {cc->s, cc->s, 1, 1, 1, 1, 1};
    int64_t Ho = out_size(cc->H, cc->s), Wo = out_size(cc->W, cc->s);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W}, ws[4] = {cc->Cout, cc->Cin, 3, 3};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo}, bs[1] = {cc->Cout};
    double fan = 1.0 / sqrt((double)(cc->Cin * 9));
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hw = hrand(LUCID_F32, 4, ws, -fan, fan);
    lucid_tensor *hb = cc->bias ? hrand(LUCID_F32, 1, bs, -fan, fan) : NULL;
    lucid_tensor *hdy = hrand(dt, 4, ys, -1, 1), *hdx1 = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *hwr = NULL, *hwf = NULL, *rdx1 = NULL, *s0 = NULL, *s1 = NULL, *s2 = NULL;
    lucid_tensor *ry = hpoison(dt, 4, ys), *rdx0 = hpoison(dt, 4, xs);
    lucid_tensor *gx = dev(hx), *gw = dev(hw), *gb = hb ? dev(hb) : NULL, *gdy = dev(hdy);
    lucid_tensor *gy = dpoison(dt, 4, ys), *gdx0 = dpoison(dt, 4, xs), *gdx1 = dev(hdx1);
    lucid_tensor *gdx1b = dev(hdx1), *gdx1c = dev(hdx1);
    float *xf = NULL, *wf = NULL, *dyf = NULL, *oldf = NULL;
    double *ref = NULL, *mag = NULL;
    int64_t nx = cc->N * cc->Cin * cc->H * cc->W, ny = cc->N * cc->Cout * Ho * Wo;
    long d, dt2;
    /* the kernel generation each pass runs on (v2 where it applies, unless
     * LUCID_CONV_SMALL_V=1) */
    lucid_conv_small_geom sg = geom(cc->N, cc->Cin, cc->H, cc->W, cc->Cout, 3, cc->s, 1, 1, 1);
    const int kf = lucid_conv_small_kernel(&sg, dt, 0), kb = lucid_conv_small_kernel(&sg, dt, 1);
    int vprev = 0;
    if (!hx || !hw || !hdy || !hdx1 || !ry || !rdx0 || !gx || !gw || !gdy || !gy || !gdx0 ||
        !gdx1 || !gdx1b || !gdx1c || (cc->bias && (!hb || !gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* the weights rounded to dt (what the GPU multiplies by) */
    if (lucid_tensor_to(ctx, hw, CPU, dt, &hwr) != LUCID_OK ||
        lucid_tensor_to(ctx, hwr, CPU, LUCID_F32, &hwf) != LUCID_OK ||
        lucid_tensor_clone(ctx, hdx1, &rdx1) != LUCID_OK) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    xf = floats_of(hx); wf = floats_of(hwf); dyf = floats_of(hdy); oldf = floats_of(hdx1);
    int64_t nmax = nx > ny ? nx : ny;
    ref = malloc((size_t)nmax * sizeof *ref);
    mag = malloc((size_t)nmax * sizeof *mag);
    if (!xf || !wf || !dyf || !oldf || !ref || !mag) {
        TEST_FAIL(NAME("%s: setup", pre), "out of host memory");
        goto done;
    }
    lucid_cuda_nn_set_conv_small(ctx, 2);

    /* forward */
    RUN(NAME("%s: forward cpu", pre), lucid_nn_conv2d_forward(ctx, hx, ry, hw, hb, &p));
    {
        unsigned long t0 = lucid_conv_small_tc_launch_count();
        ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &p));
        dt2 = (long)(lucid_conv_small_tc_launch_count() - t0);
    }
    CHECK(NAME("%s: forward on the small route (v%d)", pre, kf), d == 1 && dt2 == (kf == 2),
          "%ld launches, %ld of them v2 (%s)", d, dt2, lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: forward vs cpu", pre), gy, ry, 1e-2);
    ref_fwd(cc, xf, wf, hb ? (const float *)lucid_tensor_data(hb) : NULL, ref, mag);
    cmp_bound(NAME("%s: forward vs float64", pre), gy, ref, mag, cc->Cin * 9 + (cc->bias != 0),
              dt);
    s0 = host(gy);
    lucid_fill(ctx, gy, NAN);
    RUN(NAME("%s: forward again", pre), lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &p));
    if (s0) cmp_bits(NAME("%s: forward deterministic", pre), gy, s0);
    if (kf == 2 && s0) { /* new vs old */
        vprev = lucid_conv_small_set_version(1);
        lucid_fill(ctx, gy, NAN);
        TC_COUNT(dt2, lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &p));
        lucid_conv_small_set_version(vprev);
        CHECK(NAME("%s: forward v1 (forced) ran", pre), dt2 == 0, "%ld v2 launches (%s)", dt2,
              lucid_ctx_error(ctx));
        cmp_bound(NAME("%s: forward v1 vs float64", pre), gy, ref, mag,
                  cc->Cin * 9 + (cc->bias != 0), dt);
        cmp_close(NAME("%s: forward v2 vs v1", pre), gy, s0, ref, mag,
                  cc->Cin * 9 + (cc->bias != 0), dt);
    }

    /* backward-data beta 0 (poisoned), beta 1 */
    RUN(NAME("%s: backward_input cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx0, hw, &p, 0.0));
    {
        unsigned long t0 = lucid_conv_small_tc_launch_count();
        ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
        dt2 = (long)(lucid_conv_small_tc_launch_count() - t0);
    }
    CHECK(NAME("%s: backward_input on the small route (v%d)", pre, kb),
          d == 1 && dt2 == (kb == 2), "%ld launches, %ld of them v2 (%s)", d, dt2,
          lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: backward_input beta 0 vs cpu", pre), gdx0, rdx0, 1e-2);
    ref_bwd(cc, dyf, wf, ref, mag);
    cmp_bound(NAME("%s: backward_input beta 0 vs float64", pre), gdx0, ref, mag,
              cc->Cout * 9, dt);
    s1 = host(gdx0);
    lucid_fill(ctx, gdx0, NAN);
    RUN(NAME("%s: backward_input again", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
    if (s1) cmp_bits(NAME("%s: backward_input deterministic", pre), gdx0, s1);
    if (kb == 2 && s1) { /* new vs old */
        vprev = lucid_conv_small_set_version(1);
        lucid_fill(ctx, gdx0, NAN);
        TC_COUNT(dt2, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
        lucid_conv_small_set_version(vprev);
        CHECK(NAME("%s: backward_input v1 (forced) ran", pre), dt2 == 0, "%ld v2 launches (%s)",
              dt2, lucid_ctx_error(ctx));
        cmp_bound(NAME("%s: backward_input beta 0 v1 vs float64", pre), gdx0, ref, mag,
                  cc->Cout * 9, dt);
        cmp_close(NAME("%s: backward_input beta 0 v2 vs v1", pre), gdx0, s1, ref, mag,
                  cc->Cout * 9, dt);
    }
    RUN(NAME("%s: backward_input cpu beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx1, hw, &p, 1.0));
    RUN(NAME("%s: backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1, gw, &p, 1.0));
    cmp_rel(NAME("%s: backward_input beta 1 vs cpu", pre), gdx1, rdx1, 1e-2);
    for (int64_t i = 0; i < nx; i++) {
        ref[i] += oldf[i];
        mag[i] += fabs(oldf[i]);
    }
    cmp_bound(NAME("%s: backward_input beta 1 vs float64", pre), gdx1, ref, mag,
              cc->Cout * 9 + 1, dt);
    s2 = host(gdx1);
    if (kb == 2 && s2) { /* new vs old, beta 1 */
        vprev = lucid_conv_small_set_version(1);
        lucid_status st = lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1c, gw, &p, 1.0);
        lucid_conv_small_set_version(vprev);
        CHECK(NAME("%s: backward_input beta 1 v1", pre), st == LUCID_OK, "%s: %s",
              lucid_status_name(st), lucid_ctx_error(ctx));
        cmp_bound(NAME("%s: backward_input beta 1 v1 vs float64", pre), gdx1c, ref, mag,
                  cc->Cout * 9 + 1, dt);
        cmp_close(NAME("%s: backward_input beta 1 v2 vs v1", pre), gdx1c, s2, ref, mag,
                  cc->Cout * 9 + 1, dt);
    }

    if (misaligned && s0 && s1 && s2)
        test_misaligned(pre, cc, dt, hx, hw, hb, hdy, hdx1, s0, s1, s2);

    /* the route off: the implicit GEMM, still right */
    lucid_cuda_nn_set_conv_small(ctx, 1);
    lucid_fill(ctx, gy, NAN);
    lucid_fill(ctx, gdx0, NAN);
    ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &p));
    CHECK(NAME("%s: route off: forward not on the small route", pre), d == 0,
          "%ld launches (%s)", d, lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: route off: forward vs cpu", pre), gy, ry, 1e-2);
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
    CHECK(NAME("%s: route off: backward_input not on the small route", pre), d == 0,
          "%ld launches (%s)", d, lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: route off: backward_input vs cpu", pre), gdx0, rdx0, 1e-2);
    RUN(NAME("%s: route off: backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1b, gw, &p, 1.0));
    cmp_rel(NAME("%s: route off: backward_input beta 1 vs cpu", pre), gdx1b, rdx1, 1e-2);
done:
    if (lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, 0);
    free(xf); free(wf); free(dyf); free(oldf); free(ref); free(mag);
    rel(hx); rel(hw); rel(hb); rel(hdy); rel(hdx1); rel(hwr); rel(hwf); rel(rdx1);
    rel(s0); rel(s1); rel(s2); rel(ry); rel(rdx0); rel(gx); rel(gw); rel(gb); rel(gdy);
    rel(gy); rel(gdx0); rel(gdx1); rel(gdx1b); rel(gdx1c);
}

/* ------------------------------------------------------------ other routes */

typedef struct keep_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int k, s, pad, dil, groups;
    lucid_dtype dt;
} keep_case;

static const keep_case KEEP[] = {
    {"32>32 (Cin*Cout 1024)", 2, 32, 12, 12, 32, 3, 1, 1, 1, 1, LUCID_BF16},
    {"17>31 (527)", 1, 17, 9, 9, 31, 3, 2, 1, 1, 1, LUCID_F16},
    {"pad 0", 2, 8, 10, 10, 8, 3, 1, 0, 1, 1, LUCID_BF16},
    {"5x5 pad 2", 2, 8, 10, 10, 8, 5, 1, 2, 1, 1, LUCID_BF16},
    {"dilation 2", 2, 8, 10, 10, 8, 3, 1, 2, 2, 1, LUCID_F16},
    {"groups 2", 2, 8, 10, 10, 8, 3, 1, 1, 1, 2, LUCID_BF16},
    {"1x1", 2, 8, 10, 10, 16, 1, 1, 0, 1, 1, LUCID_BF16},
    {"stride 3", 2, 8, 10, 10, 8, 3, 3, 1, 1, 1, LUCID_F16},
    {"f32 16>8", 2, 16, 10, 10, 8, 3, 1, 1, 1, 1, LUCID_F32},
};

static void test_keep(const keep_case *kc) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv_small keeps the old route: %s %s", kc->tag,
             lucid_dtype_name(kc->dt));
    lucid_conv2d_params p = {kc->s, kc->s, kc->pad, kc->pad, kc->dil, kc->dil, kc->groups};
    int64_t Ho = lucid_nn_conv_out_size(kc->H, kc->k, kc->s, kc->pad, kc->dil);
    int64_t Wo = lucid_nn_conv_out_size(kc->W, kc->k, kc->s, kc->pad, kc->dil);
    int64_t xs[4] = {kc->N, kc->Cin, kc->H, kc->W};
    int64_t ws[4] = {kc->Cout, kc->Cin / kc->groups, kc->k, kc->k};
    int64_t ys[4] = {kc->N, kc->Cout, Ho, Wo};
    double tol = kc->dt == LUCID_F32 ? 1e-5 : 1e-2;
    lucid_tensor *hx = hrand(kc->dt, 4, xs, -1, 1), *hw = hrand(LUCID_F32, 4, ws, -0.3, 0.3);
    lucid_tensor *hdy = hrand(kc->dt, 4, ys, -1, 1);
    lucid_tensor *ry = hpoison(kc->dt, 4, ys), *rdx = hpoison(kc->dt, 4, xs);
    lucid_tensor *gx = dev(hx), *gw = dev(hw), *gdy = dev(hdy);
    lucid_tensor *gy = dpoison(kc->dt, 4, ys), *gdx = dpoison(kc->dt, 4, xs);
    long d;
    if (!hx || !hw || !hdy || !ry || !rdx || !gx || !gw || !gdy || !gy || !gdx) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv_small(ctx, 2);
    RUN(NAME("%s: forward cpu", pre), lucid_nn_conv2d_forward(ctx, hx, ry, hw, NULL, &p));
    ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, NULL, &p));
    CHECK(NAME("%s: forward", pre), d == 0, "%ld launches on the small route (%s)", d,
          lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: forward vs cpu", pre), gy, ry, tol);
    RUN(NAME("%s: backward_input cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx, hw, &p, 0.0));
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx, gw, &p, 0.0));
    CHECK(NAME("%s: backward_input", pre), d == 0, "%ld launches on the small route (%s)", d,
          lucid_ctx_error(ctx));
    cmp_rel(NAME("%s: backward_input vs cpu", pre), gdx, rdx, tol);
done:
    lucid_cuda_nn_set_conv_small(ctx, 0);
    rel(hx); rel(hw); rel(hdy); rel(ry); rel(rdx); rel(gx); rel(gw); rel(gdy); rel(gy);
    rel(gdx);
}

/* ------------------------------------------------------------ capture */

/* Forward and backward-data (beta 0 and 1) on the small route, eager, then
 * recorded into a CUDA graph on a fresh context and replayed: bitwise equal
 * to the eager results. */
static void test_capture(const sc_case *cc, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv_small capture %s %s", cc->tag, lucid_dtype_name(dt));
    lucid_ctx *prev = NULL;
    if (!cuda_test_enter_fresh(pre, &prev)) return;
    lucid_conv2d_params p = {cc->s, cc->s, 1, 1, 1, 1, 1};
    int64_t Ho = out_size(cc->H, cc->s), Wo = out_size(cc->W, cc->s);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W}, ws[4] = {cc->Cout, cc->Cin, 3, 3};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo}, bs[1] = {cc->Cout};
    lucid_graph *gr = NULL;
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hw = hrand(LUCID_F32, 4, ws, -0.3, 0.3);
    lucid_tensor *hb = cc->bias ? hrand(LUCID_F32, 1, bs, -0.3, 0.3) : NULL;
    lucid_tensor *hdy = hrand(dt, 4, ys, -1, 1), *hdx1 = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *gx = dev(hx), *gw = dev(hw), *gb = hb ? dev(hb) : NULL, *gdy = dev(hdy);
    lucid_tensor *ey = dpoison(dt, 4, ys), *ry = dpoison(dt, 4, ys);
    lucid_tensor *edx0 = dpoison(dt, 4, xs), *rdx0 = dpoison(dt, 4, xs);
    lucid_tensor *edx1 = dev(hdx1), *rdx1 = dev(hdx1);
    lucid_tensor *h[3] = {NULL, NULL, NULL};
    long d = 0;
    unsigned long c0 = 0;
    if (!hx || !hw || !hdy || !hdx1 || !gx || !gw || !gdy || !ey || !ry || !edx0 || !rdx0 ||
        !edx1 || !rdx1 || (cc->bias && (!hb || !gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv_small(ctx, 2);
    RUN(NAME("%s: eager forward", pre), lucid_nn_conv2d_forward(ctx, gx, ey, gw, gb, &p));
    RUN(NAME("%s: eager backward_input", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx0, gw, &p, 0.0));
    RUN(NAME("%s: eager backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx1, gw, &p, 1.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    c0 = lucid_conv_small_launch_count();
    {
        lucid_status s = lucid_nn_conv2d_forward(ctx, gx, ry, gw, gb, &p);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx0, gw, &p, 0.0);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx1, gw, &p, 1.0);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    d = (long)(lucid_conv_small_launch_count() - c0);
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    CHECK(NAME("%s: captured 3 small-route kernels", pre), d == 3, "%ld", d);
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    h[0] = host(ey); h[1] = host(edx0); h[2] = host(edx1);
    cmp_bits(NAME("%s: replay y = eager", pre), ry, h[0]);
    cmp_bits(NAME("%s: replay dx beta 0 = eager", pre), rdx0, h[1]);
    cmp_bits(NAME("%s: replay dx beta 1 = eager", pre), rdx1, h[2]);
done:
    if (gr) lucid_graph_destroy(gr);
    for (int i = 0; i < 3; i++) rel(h[i]);
    rel(hx); rel(hw); rel(hb); rel(hdy); rel(hdx1); rel(gx); rel(gw); rel(gb); rel(gdy);
    rel(ey); rel(ry); rel(edx0); rel(rdx0); rel(edx1); rel(rdx1);
    cuda_test_leave_fresh(prev);
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!SC_LINKED()) {
        TEST_SKIP("conv_small cuda (host checks and kernels)",
                  "CPU-only build (no cuda/nn_conv_small.o)");
        return 0;
    }
    test_host();
    if (!lucid_cuda_available()) {
        TEST_SKIP("conv_small cuda kernels (forward, backward-data, routes, capture; "
                  "bf16/f16)",
                  "no CUDA device");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_conv_small_cuda")) return test_exit();
    CHECK("conv_small per-context switch linked", lucid_cuda_nn_set_conv_small != NULL,
          "lucid_cuda_nn_set_conv_small missing");
    if (!lucid_cuda_nn_set_conv_small) return cuda_test_finish();
    CHECK("conv_small per-context switch starts at 0 and returns the previous value",
          lucid_cuda_nn_set_conv_small(ctx, 2) == 0 && lucid_cuda_nn_set_conv_small(ctx, 7) == 2 &&
              lucid_cuda_nn_set_conv_small(ctx, 0) == 0,
          "unexpected previous values");
    static const lucid_dtype DTS[2] = {LUCID_BF16, LUCID_F16};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < NELEM(NET); i++) test_case(&NET[i], DTS[k], 0);
        for (size_t i = 0; i < NELEM(ODD); i++)
            test_case(&ODD[i], DTS[k], ODD[i].W % 8 == 0 || i == 0);
    }
    for (size_t i = 0; i < NELEM(KEEP); i++) test_keep(&KEEP[i]);
    test_capture(&ODD[2], LUCID_BF16); /* 16>32 s2 33x32 N4 bias */
    test_capture(&ODD[3], LUCID_F16);  /* 16>8 s1 33x32 */
    return cuda_test_finish();
}
