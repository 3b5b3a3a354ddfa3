/*
 * test_conv_col_cuda.c — the im2col + cuBLAS conv route (cuda/nn_conv_col.cu,
 * ROUTE_COL of cuda/nn_conv.cu) on the GPU through the nn entry points:
 * forward, backward-data and backward-filter against the engine's CPU conv,
 * run-to-run repeatability, the route choice (lucid_cuda_nn_set_conv_col and
 * LUCID_CONV_COL) and capture.  The index maps, the eligibility function and
 * the scratch sizes are checked on the host by test_conv_col_maps.cu (the
 * route's C++ entry points are not callable from C).
 *
 * Host-only check (every CUDA build, with or without a device): the launch
 * counter lucid_cuda_conv_col_launch_count starts at 0.
 * Device checks (skipped without a device), each case in bf16 and f16:
 *   - with the route forced on for every pass (lucid_cuda_nn_set_conv_col
 *     8): forward without and with bias, backward-data beta 0 (dx poisoned
 *     with NaN) and beta 1 (dx random), backward-params (dw f32, db NULL)
 *     beta 0 (dw poisoned) and beta 1 (dw random); each launch counted on
 *     this route (lucid_cuda_conv_col_launch_count: +1 im2col per call;
 *     the backward-data only for stride-1 cases, the others keep the
 *     implicit GEMM's stride phases: 0); each compared with the engine's
 *     CPU conv on the same rounded inputs (x, dy and the weight rounded to
 *     the dtype, as the route rounds it), relative Frobenius error <= 1e-2
 *     (the bf16/f16 conv tolerance of spec/c/test_nn_cuda.c); each pass run
 *     twice (outputs poisoned or reset in between): bitwise identical;
 *   - the route off (set_conv_col 1): no launch on this route in any pass,
 *     still within 1e-2 of the CPU;
 *   - set_conv_col 4 (1 + forward | backward-data): those on it,
 *     backward-params not; set_conv_col 5 (1 + backward-filter): only
 *     backward-params; still within 1e-2;
 *   - the per-context switch at 0 follows LUCID_CONV_COL (unset, "" or "1":
 *     every pass; "0": none; a set of the letters f, d, w: those passes;
 *     another value: ERR_ARG);
 *   - the same with K = Cin*kh*kw or Cout not a multiple of 8 (the route
 *     rounds K up to a multiple of 8 inside, DECISIONS 32: zero rows of
 *     the columns, the forward's weight padded per call, the backward-data's
 *     flipped weight padded, the filter gradient's padded columns dropped
 *     by its fold): the pose head's 64>51 (Cout 51; the backward-data's K'
 *     459) and 51>51 (K 459), layer 0's 3>16 stride 2 (K 27), 32>12 (Cout
 *     12, K' 108); each pass on the route when LUCID_CONV_COL_PAD is not
 *     "0" (with "0": only the passes whose K is a multiple of 8);
 *   - filter gradients whose P = Ho*Wo is cut into S chunks per image
 *     (nn_conv_gemm.cu's split, L 1600 unless LUCID_WGRAD_SPLIT says
 *     otherwise): 16>32 3x3 at 64x64 with N 3 (S 2 < N: one GEMM per
 *     chunk), at 160x160 with N 1 (S 16: one GEMM batched over the
 *     chunks), 51>51 at 80x80 N 1 (K 459 and S 4), against the CPU like
 *     every case (beta 0 and 1, repeatable bitwise);
 *   - ineligible convs with the route on (Ho*Wo not a multiple of 8, also
 *     with K 27; groups 2, f32, the 1x1 stride-1 GEMM route's shape): no
 *     launch on this route, results within 1e-2 (f32: 1e-5) of the CPU;
 *   - the per-context switch at 0 with LUCID_CONV_COL_PAD as the
 *     environment holds it (read once per process): a K 459 case takes the
 *     passes LUCID_CONV_COL gives unless LUCID_CONV_COL_PAD is "0";
 *   - capture: forward, backward-data (beta 0 and 1) and backward-params on
 *     this route recorded into a CUDA graph on a fresh context after an eager
 *     pass (4 launches on the route recorded for a stride-1 case, 2 for a
 *     stride-2 one), replayed: bitwise equal to the eager results; also for
 *     a padded case (51>51, bias) and a split filter gradient (16>32 64x64
 *     N 3).
 * Cases: the network's 3x3 convs at reduced size (64>64 s1 and 64>128 s2 at
 * 40x40 in place of 80x80, 32>64 s2 at 80x80 in place of 160x160), 5x5 pad
 * 2, 3x3 dilation 2, 3x3 stride 2 on odd planes (17x31 -> 9x16, 15x9 ->
 * 8x5), 1x1 stride 2, 2x2 stride 2 on an odd plane, a 3x1 kernel; the
 * padded and split cases above; batch 1, 2 and 3.  The small-channel route
 * (nn_conv_small.cu), which takes the forward and backward-data of 3x3
 * convs with Cin*Cout <= 256 (3>16) before this one, is switched off for
 * these cases (lucid_cuda_nn_set_conv_small 1); Cin*Cout > 512 for most of
 * them anyway.
 */
#include "test_cuda_util.h"
#include "conv_col_env.h"

#include "nn/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* As in test_conv_small_cuda.c: strong references in a CUDA build (the stamp
 * build/.config-cuda1 tells it), weak ones in a CPU-only build.  Declared
 * here: cuda/nn_conv_col.cuh and cuda/nn_common.cuh are C++ headers. */
unsigned long lucid_cuda_conv_col_launch_count(void); /* cuda/nn_conv_col.cu */
int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route); /* cuda/nn_table.cu */
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route); /* cuda/nn_table.cu */
#if defined(__has_include)
#if __has_include("../../build/.config-cuda1")
#define CC_CUDA_BUILD 1
#endif
#endif
#ifdef CC_CUDA_BUILD
#define CC_LINKED() 1
#else
#pragma weak lucid_cuda_conv_col_launch_count
#pragma weak lucid_cuda_nn_set_conv_col
#pragma weak lucid_cuda_nn_set_conv_small
#define CC_LINKED()                                                           \
    (lucid_cuda_conv_col_launch_count && lucid_cuda_nn_set_conv_col && lucid_cuda_nn_set_conv_small)
#endif

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* Launches on the im2col route during the call of `expr` (-1 when it fails). */
#define ROUTE_COUNT(delta, expr)                                              \
    do {                                                                      \
        unsigned long c0_ = lucid_cuda_conv_col_launch_count();               \
        lucid_status s_ = (expr);                                             \
        (delta) = s_ == LUCID_OK ? (long)(lucid_cuda_conv_col_launch_count() - c0_) : -1; \
    } while (0)

/* the launches expected on the route for a call, with the reason on failure */
#define CHECK_COUNT(name, d, want)                                            \
    CHECK(name, (d) == (want), "%ld launches on the im2col route, expected %d (%s)", (long)(d), \
          (int)(want), (d) < 0 ? lucid_ctx_error(ctx) : "")

/* Host copy of t with its values rounded to dt and back to f32 (the weight
 * the route multiplies by: the CPU reference uses it). */
static lucid_tensor *rounded(const lucid_tensor *t, lucid_dtype dt) {
    lucid_tensor *r = NULL, *f = NULL;
    if (!t || lucid_tensor_to(ctx, t, CPU, dt, &r) != LUCID_OK) return NULL;
    if (lucid_tensor_to(ctx, r, CPU, LUCID_F32, &f) != LUCID_OK) f = NULL;
    rel(r);
    return f;
}

/* A host clone (NULL on failure). */
static lucid_tensor *hclone(const lucid_tensor *t) {
    lucid_tensor *c = NULL;
    if (!t || lucid_tensor_clone(ctx, t, &c) != LUCID_OK) return NULL;
    return c;
}

/* ------------------------------------------------------------ cases */

typedef struct col_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int kh, kw, s, ph, pw, d, groups;
    lucid_dtype dt; /* test_keep only */
} col_case;

static const col_case CASES[] = {
    {"64>64 3x3 s1 40x40 N2 (C3k2 80x80 at half size)", 2, 64, 40, 40, 64, 3, 3, 1, 1, 1, 1, 1, 0},
    {"64>128 3x3 s2 40x40 N2 (80x80 s2 at half size)", 2, 64, 40, 40, 128, 3, 3, 2, 1, 1, 1, 1, 0},
    {"32>64 3x3 s2 80x80 N1 (160x160 s2 at half size)", 1, 32, 80, 80, 64, 3, 3, 2, 1, 1, 1, 1, 0},
    {"16>32 5x5 p2 24x20 N3", 3, 16, 24, 20, 32, 5, 5, 1, 2, 2, 1, 1, 0},
    {"32>32 3x3 d2 p2 16x12 N1", 1, 32, 16, 12, 32, 3, 3, 1, 2, 2, 2, 1, 0},
    {"16>64 3x3 s2 odd 17x31 -> 9x16 N3", 3, 16, 17, 31, 64, 3, 3, 2, 1, 1, 1, 1, 0},
    {"32>24 3x3 s2 odd 15x9 -> 8x5 N1", 1, 32, 15, 9, 24, 3, 3, 2, 1, 1, 1, 1, 0},
    {"64>32 1x1 s2 16x16 N2", 2, 64, 16, 16, 32, 1, 1, 2, 0, 0, 1, 1, 0},
    {"8>16 2x2 s2 odd 17x9 -> 8x4 N3", 3, 8, 17, 9, 16, 2, 2, 2, 0, 0, 1, 1, 0},
    {"16>16 3x1 p1,0 12x12 N2", 2, 16, 12, 12, 16, 3, 1, 1, 1, 0, 1, 1, 0},
    /* K or Cout not a multiple of 8: K padded inside the route (DECISIONS 32) */
    {"64>51 3x3 s1 20x20 N2 (pose head: Cout 51, backward-data K' 459)", 2, 64, 20, 20, 51, 3, 3,
     1, 1, 1, 1, 1, 0},
    {"51>51 3x3 s1 20x20 N2 (pose head: K 459)", 2, 51, 20, 20, 51, 3, 3, 1, 1, 1, 1, 1, 0},
    {"3>16 3x3 s2 64x64 N2 (layer 0: K 27)", 2, 3, 64, 64, 16, 3, 3, 2, 1, 1, 1, 1, 0},
    {"3>16 3x3 s2 32x32 N2 (K 27)", 2, 3, 32, 32, 16, 3, 3, 2, 1, 1, 1, 1, 0},
    {"32>12 3x3 s1 16x16 N2 (Cout 12, backward-data K' 108)", 2, 32, 16, 16, 12, 3, 3, 1, 1, 1,
     1, 1, 0},
    /* filter gradients whose P splits (S 2 at 64x64, 16 at 160x160, 4 at 80x80 with L 1600) */
    {"16>32 3x3 s1 64x64 N3 (filter gradient split, S < N)", 3, 16, 64, 64, 32, 3, 3, 1, 1, 1, 1,
     1, 0},
    {"16>32 3x3 s1 160x160 N1 (filter gradient split 16)", 1, 16, 160, 160, 32, 3, 3, 1, 1, 1, 1,
     1, 0},
    {"51>51 3x3 s1 80x80 N1 (K 459, filter gradient split 4)", 1, 51, 80, 80, 51, 3, 3, 1, 1, 1,
     1, 1, 0},
};
#define CASE_PAD_51 11   /* 51>51 20x20 */
#define CASE_SPLIT_N3 15 /* 16>32 64x64 N3 */

/* 1 when a K (Cin*kh*kw, or the backward-data's Cout*kh*kw) may take the
 * route in this process: a multiple of 8, or LUCID_CONV_COL_PAD other than
 * "0" (nn_conv_col.cuh, read once per process) */
static int k_on(int64_t K) {
    const char *e = getenv("LUCID_CONV_COL_PAD");
    return K % 8 == 0 || !(e && strcmp(e, "0") == 0);
}

/* 1 when the route takes the case's forward and filter gradient */
static int fwd_on(const col_case *cc) { return k_on(cc->Cin * cc->kh * cc->kw); }

/* 1 when the route takes the case's backward-data (conv_col_env.h; its
 * K' = Cout*kh*kw as above) */
static int dgrad_on(const col_case *cc) {
    return fwd_on(cc) &&
           conv_col_dgrad_takes(cc->s, cc->s, cc->kh, cc->kw, cc->ph, cc->pw, cc->d, cc->d) &&
           k_on(cc->Cout * cc->kh * cc->kw);
}

/* ineligible with the route on */
static const col_case KEEP[] = {
    {"Ho*Wo 153 (3x3 s2 17x33 -> 9x17)", 2, 32, 17, 33, 32, 3, 3, 2, 1, 1, 1, 1, LUCID_BF16},
    {"Ho*Wo 25 with K 27 (3>16 3x3 5x5)", 2, 3, 5, 5, 16, 3, 3, 1, 1, 1, 1, 1, LUCID_F16},
    {"groups 2", 2, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1, 2, LUCID_BF16},
    {"f32 32>32", 2, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1, LUCID_F32},
    {"1x1 s1 (the 1x1 GEMM route)", 2, 32, 16, 16, 32, 1, 1, 1, 0, 0, 1, 1, LUCID_F16},
};

/* Shapes and host inputs of one case in dt. */
typedef struct col_io {
    lucid_conv2d_params p;
    int64_t xs[4], ws[4], ys[4], bs[1];
    lucid_tensor *hx, *hw, *hwr, *hb, *hdy, *hdx1, *hdw1;
} col_io;

static int io_make(col_io *io, const col_case *cc, lucid_dtype dt) {
    memset(io, 0, sizeof *io);
    lucid_conv2d_params p = {cc->s, cc->s, cc->ph, cc->pw, cc->d, cc->d, cc->groups};
    io->p = p;
    int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->ph, cc->d);
    int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->pw, cc->d);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W};
    int64_t ws[4] = {cc->Cout, cc->Cin / cc->groups, cc->kh, cc->kw};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo};
    memcpy(io->xs, xs, sizeof xs);
    memcpy(io->ws, ws, sizeof ws);
    memcpy(io->ys, ys, sizeof ys);
    io->bs[0] = cc->Cout;
    double fan = 1.0 / sqrt((double)(ws[1] * cc->kh * cc->kw));
    io->hx = hrand(dt, 4, xs, -1, 1);
    io->hw = hrand(LUCID_F32, 4, ws, -fan, fan);
    io->hwr = rounded(io->hw, dt);
    io->hb = hrand(LUCID_F32, 1, io->bs, -fan, fan);
    io->hdy = hrand(dt, 4, ys, -1, 1);
    io->hdx1 = hrand(dt, 4, xs, -1, 1);
    io->hdw1 = hrand(LUCID_F32, 4, ws, -1, 1);
    return io->hx && io->hw && io->hwr && io->hb && io->hdy && io->hdx1 && io->hdw1;
}

static void io_free(col_io *io) {
    rel(io->hx); rel(io->hw); rel(io->hwr); rel(io->hb); rel(io->hdy); rel(io->hdx1);
    rel(io->hdw1);
}

/* ------------------------------------------------------------ one case */

/* The CPU references of a case (weights rounded to dt). */
typedef struct col_ref {
    lucid_tensor *y, *yb, *dx0, *dx1, *dw0, *dw1;
} col_ref;

static int ref_make(const char *pre, col_ref *r, const col_io *io, lucid_dtype dt) {
    memset(r, 0, sizeof *r);
    r->y = hpoison(dt, 4, io->ys);
    r->yb = hpoison(dt, 4, io->ys);
    r->dx0 = hpoison(dt, 4, io->xs);
    r->dx1 = hclone(io->hdx1);
    r->dw0 = hpoison(LUCID_F32, 4, io->ws);
    r->dw1 = hclone(io->hdw1);
    if (!r->y || !r->yb || !r->dx0 || !r->dx1 || !r->dw0 || !r->dw1) {
        TEST_FAIL(NAME("%s: cpu setup", pre), "%s", lucid_ctx_error(ctx));
        return 0;
    }
    RUN(NAME("%s: forward cpu", pre),
        lucid_nn_conv2d_forward(ctx, io->hx, r->y, io->hwr, NULL, &io->p));
    RUN(NAME("%s: forward bias cpu", pre),
        lucid_nn_conv2d_forward(ctx, io->hx, r->yb, io->hwr, io->hb, &io->p));
    RUN(NAME("%s: backward_input cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, io->hx, io->hdy, r->dx0, io->hwr, &io->p, 0.0));
    RUN(NAME("%s: backward_input beta 1 cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, io->hx, io->hdy, r->dx1, io->hwr, &io->p, 1.0));
    RUN(NAME("%s: backward_params cpu", pre),
        lucid_nn_conv2d_backward_params(ctx, io->hx, io->hdy, r->dw0, NULL, &io->p, 0.0));
    RUN(NAME("%s: backward_params beta 1 cpu", pre),
        lucid_nn_conv2d_backward_params(ctx, io->hx, io->hdy, r->dw1, NULL, &io->p, 1.0));
    return 1;
done:
    return 0;
}

static void ref_free(col_ref *r) {
    rel(r->y); rel(r->yb); rel(r->dx0); rel(r->dx1); rel(r->dw0); rel(r->dw1);
}

/* Every pass on the GPU in the current route setting: the launches on the
 * route expected per pass want[0..2] (forward, backward-data,
 * backward-filter), each result within tol of the CPU; with `twice`, every
 * pass run again (outputs poisoned or reset first): bitwise identical. */
static void run_passes(const char *pre, const col_io *io, const col_ref *r, lucid_dtype dt,
                       const int want[3], double tol, int twice) {
    lucid_tensor *gx = dev(io->hx), *gw = dev(io->hw), *gb = dev(io->hb), *gdy = dev(io->hdy);
    lucid_tensor *gy = dpoison(dt, 4, io->ys), *gdx0 = dpoison(dt, 4, io->xs);
    lucid_tensor *gdx1 = dev(io->hdx1), *gdw0 = dpoison(LUCID_F32, 4, io->ws);
    lucid_tensor *gdw1 = dev(io->hdw1), *s = NULL;
    long d;
    if (!gx || !gw || !gb || !gdy || !gy || !gdx0 || !gdx1 || !gdw0 || !gdw1) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
#define AGAIN(what, out, expr, reset)                                         \
    do {                                                                      \
        if (!twice) break;                                                    \
        s = host(out);                                                        \
        reset;                                                                \
        RUN(NAME("%s: %s again", pre, what), expr);                           \
        if (s) cmp_bits(NAME("%s: %s deterministic", pre, what), out, s);     \
        else TEST_FAIL(NAME("%s: %s deterministic", pre, what), "copy back failed"); \
        rel(s);                                                               \
        s = NULL;                                                             \
    } while (0)
#define RESET(t, h)                                                           \
    if (lucid_copy(ctx, t, h) != LUCID_OK) {                                \
        TEST_FAIL(NAME("%s: reset", pre), "%s", lucid_ctx_error(ctx));        \
        goto done;                                                            \
    }

    /* forward, without and with bias */
    ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, NULL, &io->p));
    CHECK_COUNT(NAME("%s: forward launches", pre), d, want[0]);
    cmp_rel(NAME("%s: forward vs cpu", pre), gy, r->y, tol);
    AGAIN("forward", gy, lucid_nn_conv2d_forward(ctx, gx, gy, gw, NULL, &io->p),
          lucid_fill(ctx, gy, NAN));
    lucid_fill(ctx, gy, NAN);
    ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &io->p));
    CHECK_COUNT(NAME("%s: forward bias launches", pre), d, want[0]);
    cmp_rel(NAME("%s: forward bias vs cpu", pre), gy, r->yb, tol);
    AGAIN("forward bias", gy, lucid_nn_conv2d_forward(ctx, gx, gy, gw, gb, &io->p),
          lucid_fill(ctx, gy, NAN));

    /* backward-data, beta 0 (poisoned) and beta 1 */
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &io->p, 0.0));
    CHECK_COUNT(NAME("%s: backward_input launches", pre), d, want[1]);
    cmp_rel(NAME("%s: backward_input beta 0 vs cpu", pre), gdx0, r->dx0, tol);
    AGAIN("backward_input beta 0", gdx0,
          lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &io->p, 0.0),
          lucid_fill(ctx, gdx0, NAN));
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1, gw, &io->p, 1.0));
    CHECK_COUNT(NAME("%s: backward_input beta 1 launches", pre), d, want[1]);
    cmp_rel(NAME("%s: backward_input beta 1 vs cpu", pre), gdx1, r->dx1, tol);
    AGAIN("backward_input beta 1", gdx1,
          lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1, gw, &io->p, 1.0),
          RESET(gdx1, io->hdx1));

    /* backward-params (dw f32, no bias gradient), beta 0 (poisoned) and beta 1 */
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_params(ctx, gx, gdy, gdw0, NULL, &io->p, 0.0));
    CHECK_COUNT(NAME("%s: backward_params launches", pre), d, want[2]);
    cmp_rel(NAME("%s: backward_params dw beta 0 vs cpu", pre), gdw0, r->dw0, tol);
    AGAIN("backward_params beta 0", gdw0,
          lucid_nn_conv2d_backward_params(ctx, gx, gdy, gdw0, NULL, &io->p, 0.0),
          lucid_fill(ctx, gdw0, NAN));
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_params(ctx, gx, gdy, gdw1, NULL, &io->p, 1.0));
    CHECK_COUNT(NAME("%s: backward_params beta 1 launches", pre), d, want[2]);
    cmp_rel(NAME("%s: backward_params dw beta 1 vs cpu", pre), gdw1, r->dw1, tol);
    AGAIN("backward_params beta 1", gdw1,
          lucid_nn_conv2d_backward_params(ctx, gx, gdy, gdw1, NULL, &io->p, 1.0),
          RESET(gdw1, io->hdw1));
#undef AGAIN
#undef RESET
done:
    rel(s);
    rel(gx); rel(gw); rel(gb); rel(gdy); rel(gy); rel(gdx0); rel(gdx1); rel(gdw0); rel(gdw1);
}

static void test_case(const col_case *cc, lucid_dtype dt) {
    char pre[200], sub[240];
    snprintf(pre, sizeof pre, "conv_col %s %s", cc->tag, lucid_dtype_name(dt));
    col_io io;
    col_ref r;
    memset(&r, 0, sizeof r);
    if (!io_make(&io, cc, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!ref_make(pre, &r, &io, dt)) goto done;

    const int dg = dgrad_on(cc), fw = fwd_on(cc);
    const int ON[3] = {fw, dg, fw}, OFF[3] = {0, 0, 0}, FD[3] = {fw, dg, 0}, W[3] = {0, 0, fw};
    /* the small-channel route would take the forward and backward-data of
     * Cin*Cout <= 256 (3>16) before this one */
    lucid_cuda_nn_set_conv_small(ctx, 1);
    lucid_cuda_nn_set_conv_col(ctx, 8);
    run_passes(pre, &io, &r, dt, ON, 1e-2, 1);
    lucid_cuda_nn_set_conv_col(ctx, 1);
    snprintf(sub, sizeof sub, "%s: route off", pre);
    run_passes(sub, &io, &r, dt, OFF, 1e-2, 0);
    lucid_cuda_nn_set_conv_col(ctx, 4);
    snprintf(sub, sizeof sub, "%s: route 4 (forward, backward-data)", pre);
    run_passes(sub, &io, &r, dt, FD, 1e-2, 0);
    lucid_cuda_nn_set_conv_col(ctx, 5);
    snprintf(sub, sizeof sub, "%s: route 5 (backward-filter)", pre);
    run_passes(sub, &io, &r, dt, W, 1e-2, 0);
done:
    lucid_cuda_nn_set_conv_col(ctx, 0);
    lucid_cuda_nn_set_conv_small(ctx, 0);
    ref_free(&r);
    io_free(&io);
}

/* The per-context switch at 0: LUCID_CONV_COL decides (read once per
 * process, here as the environment holds it; LUCID_CONV_COL_PAD too, for a
 * case whose K or K' is not a multiple of 8). */
static void test_env(const col_case *cc, lucid_dtype dt) {
    char pre[240];
    const char *env = getenv("LUCID_CONV_COL"), *pad = getenv("LUCID_CONV_COL_PAD");
    snprintf(pre, sizeof pre,
             "conv_col switch 0 follows LUCID_CONV_COL=\"%s\" (LUCID_CONV_COL_PAD=\"%s\"): %s %s",
             env ? env : "(unset)", pad ? pad : "(unset)", cc->tag, lucid_dtype_name(dt));
    const int sw = conv_col_env_mask(env); /* the pass mask, -1 for a bad value */
    col_io io;
    lucid_tensor *gx = NULL, *gw = NULL, *gy = NULL, *gdy = NULL, *gdx = NULL, *gdw = NULL;
    if (!io_make(&io, cc, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    gx = dev(io.hx); gw = dev(io.hw); gdy = dev(io.hdy);
    gy = dpoison(dt, 4, io.ys); gdx = dpoison(dt, 4, io.xs); gdw = dpoison(LUCID_F32, 4, io.ws);
    if (!gx || !gw || !gdy || !gy || !gdx || !gdw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv_col(ctx, 0);
    if (sw < 0) {
        lucid_status st = lucid_nn_conv2d_forward(ctx, gx, gy, gw, NULL, &io.p);
        CHECK(NAME("%s: unknown value is ERR_ARG naming it", pre),
              st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "LUCID_CONV_COL"), "%s: %s",
              lucid_status_name(st), lucid_ctx_error(ctx));
        goto done;
    }
    long d;
    ROUTE_COUNT(d, lucid_nn_conv2d_forward(ctx, gx, gy, gw, NULL, &io.p));
    CHECK_COUNT(NAME("%s: forward", pre), d, (sw & 1) != 0 && fwd_on(cc));
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx, gw, &io.p, 0.0));
    CHECK_COUNT(NAME("%s: backward_input", pre), d, (sw & 2) != 0 && dgrad_on(cc));
    ROUTE_COUNT(d, lucid_nn_conv2d_backward_params(ctx, gx, gdy, gdw, NULL, &io.p, 0.0));
    CHECK_COUNT(NAME("%s: backward_params", pre), d, (sw & 4) != 0 && fwd_on(cc));
done:
    rel(gx); rel(gw); rel(gy); rel(gdy); rel(gdx); rel(gdw);
    io_free(&io);
}

/* ------------------------------------------------------------ other routes */

static void test_keep(const col_case *cc) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv_col keeps the other route: %s %s", cc->tag,
             lucid_dtype_name(cc->dt));
    col_io io;
    col_ref r;
    memset(&r, 0, sizeof r);
    if (!io_make(&io, cc, cc->dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!ref_make(pre, &r, &io, cc->dt)) goto done;
    static const int OFF[3] = {0, 0, 0};
    lucid_cuda_nn_set_conv_col(ctx, 8);
    run_passes(pre, &io, &r, cc->dt, OFF, cc->dt == LUCID_F32 ? 1e-5 : 1e-2, 0);
done:
    lucid_cuda_nn_set_conv_col(ctx, 0);
    ref_free(&r);
    io_free(&io);
}

/* ------------------------------------------------------------ capture */

/* Forward, backward-data (beta 0 and 1) and backward-params on the route,
 * eager, then recorded into a CUDA graph on a fresh context and replayed:
 * bitwise equal to the eager results. */
static void test_capture(const col_case *cc, lucid_dtype dt, int bias) {
    char pre[240];
    snprintf(pre, sizeof pre, "conv_col capture %s%s %s", cc->tag, bias ? " bias" : "",
             lucid_dtype_name(dt));
    lucid_ctx *prev = NULL;
    if (!cuda_test_enter_fresh(pre, &prev)) return;
    col_io io;
    lucid_graph *gr = NULL;
    lucid_tensor *gx = NULL, *gw = NULL, *gb = NULL, *gdy = NULL, *ey = NULL, *ry = NULL;
    lucid_tensor *edx0 = NULL, *rdx0 = NULL, *edx1 = NULL, *rdx1 = NULL, *edw = NULL,
                 *rdw = NULL;
    lucid_tensor *h[4] = {NULL, NULL, NULL, NULL};
    long d = 0;
    unsigned long c0 = 0;
    if (!io_make(&io, cc, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    gx = dev(io.hx); gw = dev(io.hw); gb = bias ? dev(io.hb) : NULL; gdy = dev(io.hdy);
    ey = dpoison(dt, 4, io.ys); ry = dpoison(dt, 4, io.ys);
    edx0 = dpoison(dt, 4, io.xs); rdx0 = dpoison(dt, 4, io.xs);
    edx1 = dev(io.hdx1); rdx1 = dev(io.hdx1);
    edw = dpoison(LUCID_F32, 4, io.ws); rdw = dpoison(LUCID_F32, 4, io.ws);
    if (!gx || !gw || (bias && !gb) || !gdy || !ey || !ry || !edx0 || !rdx0 || !edx1 || !rdx1 ||
        !edw || !rdw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv_col(ctx, 8);
    RUN(NAME("%s: eager forward", pre), lucid_nn_conv2d_forward(ctx, gx, ey, gw, gb, &io.p));
    RUN(NAME("%s: eager backward_input", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx0, gw, &io.p, 0.0));
    RUN(NAME("%s: eager backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx1, gw, &io.p, 1.0));
    RUN(NAME("%s: eager backward_params", pre),
        lucid_nn_conv2d_backward_params(ctx, gx, gdy, edw, NULL, &io.p, 0.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    c0 = lucid_cuda_conv_col_launch_count();
    {
        lucid_status s = lucid_nn_conv2d_forward(ctx, gx, ry, gw, gb, &io.p);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx0, gw, &io.p, 0.0);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx1, gw, &io.p, 1.0);
        if (!s) s = lucid_nn_conv2d_backward_params(ctx, gx, gdy, rdw, NULL, &io.p, 0.0);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    d = (long)(lucid_cuda_conv_col_launch_count() - c0);
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    CHECK(NAME("%s: captured %d im2col-route launches", pre, 2 * fwd_on(cc) + 2 * dgrad_on(cc)),
          d == 2 * fwd_on(cc) + 2 * dgrad_on(cc), "%ld", d);
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    h[0] = host(ey); h[1] = host(edx0); h[2] = host(edx1); h[3] = host(edw);
    if (!h[0] || !h[1] || !h[2] || !h[3]) {
        TEST_FAIL(NAME("%s: copy back", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    cmp_bits(NAME("%s: replay y = eager", pre), ry, h[0]);
    cmp_bits(NAME("%s: replay dx beta 0 = eager", pre), rdx0, h[1]);
    cmp_bits(NAME("%s: replay dx beta 1 = eager", pre), rdx1, h[2]);
    cmp_bits(NAME("%s: replay dw = eager", pre), rdw, h[3]);
done:
    if (gr) lucid_graph_destroy(gr);
    for (int i = 0; i < 4; i++) rel(h[i]);
    rel(gx); rel(gw); rel(gb); rel(gdy); rel(ey); rel(ry); rel(edx0); rel(rdx0); rel(edx1);
    rel(rdx1); rel(edw); rel(rdw);
    io_free(&io);
    cuda_test_leave_fresh(prev);
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!CC_LINKED()) {
        TEST_SKIP("conv_col cuda (kernels, routes, capture)",
                  "CPU-only build (no cuda/nn_conv_col.o)");
        return 0;
    }
    CHECK("conv_col launch counter starts at 0", lucid_cuda_conv_col_launch_count() == 0,
          "%lu", lucid_cuda_conv_col_launch_count());
    if (!lucid_cuda_available()) {
        TEST_SKIP("conv_col cuda kernels (forward, backward-data, backward-filter, routes, "
                  "capture; bf16/f16)",
                  "no CUDA device");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_conv_col_cuda")) return test_exit();
    CHECK("conv_col per-context switch starts at 0 and returns the previous value",
          lucid_cuda_nn_set_conv_col(ctx, 8) == 0 && lucid_cuda_nn_set_conv_col(ctx, 4) == 8 &&
              lucid_cuda_nn_set_conv_col(ctx, 9) == 4 && lucid_cuda_nn_set_conv_col(ctx, 0) == 0,
          "unexpected previous values");
    static const lucid_dtype DTS[2] = {LUCID_BF16, LUCID_F16};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < NELEM(CASES); i++) test_case(&CASES[i], DTS[k]);
    test_env(&CASES[0], LUCID_BF16);
    test_env(&CASES[CASE_PAD_51], LUCID_F16);
    for (size_t i = 0; i < NELEM(KEEP); i++) test_keep(&KEEP[i]);
    test_capture(&CASES[0], LUCID_BF16, 1); /* 64>64 s1 40x40 N2 */
    test_capture(&CASES[1], LUCID_BF16, 0); /* 64>128 s2 40x40 N2 */
    test_capture(&CASES[5], LUCID_F16, 0);  /* 16>64 s2 17x31 N3 */
    test_capture(&CASES[CASE_PAD_51], LUCID_BF16, 1);  /* 51>51 20x20 N2: K padded */
    test_capture(&CASES[CASE_SPLIT_N3], LUCID_F16, 0); /* 16>32 64x64 N3: split */
    return cuda_test_finish();
}
