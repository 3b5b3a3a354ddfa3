/*
 * test_conv_dw_cuda.c — the depthwise Conv2d kernels of cuda/nn_conv_dw.cu
 * (forward, backward-data, backward-filter) against a float64 CPU reference
 * computed here from the same (rounded) inputs.
 *
 * Cases: the YOLO11n-pose depthwise convs at batch 4 (3x3 s1 p1: C=64 80x80,
 * C=128 40x40, C=64 40x40, C=256 20x20, C=64 20x20, C=128 20x20 = attention
 * pe) and odd ones: 7x13 and 9x6 planes, 1x1 planes, a 300-wide row, stride
 * 2, pad 0, 5x5 (pad 2 and pad 0), dilation 2, an asymmetric 3x5 kernel with
 * mixed stride/pad/dilation, 1x1, C = 2048 (a single split), a 5000-wide row
 * (too wide for the tiled kernels) and a misaligned case (every device
 * pointer one element past an aligned address).  Each in f32, bf16 and f16:
 *   forward without and with bias; backward-data beta 0 and beta 1;
 *   backward-filter beta 0 and beta 1; backward-filter run twice (scratch
 *   and dw poisoned with NaN before each run) must be bitwise identical.
 * Outputs written with beta 0 (and y) are poisoned with NaN first; NaN never
 * passes.
 *
 * Tolerances.  Let ref be the float64 value, S the sum of |terms| (|w*x|,
 * |b|, |beta*old|) and t the number of terms.  The kernels accumulate in f32
 * (fmaf) and round once to the output dtype, so
 *   y, dx (dtype T):  |gpu - ref| <= u_T*|ref| + (1 + u_T)*e + a_T,
 *       e = (t + 1) * 2^-24 * S   (worst-case f32 accumulation error),
 *       u_T = 2^-24 (f32), 2^-8 (bf16), 2^-11 (f16): half an ulp, the one
 *       rounding to T;  a_T = 2^-25 for f16 (half the subnormal spacing), 0
 *       otherwise;  f32 also: relative Frobenius error <= 1e-5.
 *   dw (f32 in every run; bf16/f16 products are exact in f32):
 *       relative Frobenius error <= 1e-5 and, per element,
 *       |gpu - ref| <= 1e-5 * S + 2^-24 * |ref|.
 *
 * Host-only checks (routes, scratch sizes, argument errors) run in every
 * CUDA build; the device checks print "skip ...: no CUDA device" when there
 * is none (and everything skips in a CPU-only build).  With a device, the
 * network's 7 depthwise calls are also timed in bf16 (eager, host clock
 * around LUCID_DW_BENCH_ITERS back-to-back calls per pass, default 50; 0
 * skips) and printed as "# timing" lines (information, not checks).
 */
#include "test_cuda_util.h"

#include "../../cuda/nn_conv_dw.cuh"

/* The kernels exist only in CUDA builds.  There the references are strong,
 * so the linker takes cuda/nn_conv_dw.o out of build/libengine.a even while
 * nothing else calls it (a weak reference would not pull an archive member);
 * the Makefile's stamp build/.config-cuda1 tells a CUDA build.  In a
 * CPU-only build they are weak and NULL, and everything skips. */
#if defined(__has_include)
#if __has_include("../../build/.config-cuda1")
#define DW_CUDA_BUILD 1
#endif
#endif
#ifdef DW_CUDA_BUILD
#define DW_LINKED() 1
#else
#pragma weak lucid_conv_dw_tiled
#pragma weak lucid_conv_dw_wgrad_scratch_bytes
#pragma weak lucid_conv_dw_forward
#pragma weak lucid_conv_dw_backward_data
#pragma weak lucid_conv_dw_backward_filter
#define DW_LINKED()                                                           \
    (lucid_conv_dw_forward && lucid_conv_dw_backward_data &&                  \
     lucid_conv_dw_backward_filter && lucid_conv_dw_wgrad_scratch_bytes &&    \
     lucid_conv_dw_tiled)
#endif
#if defined(__GNUC__)
__attribute__((weak))
#endif
void *lucid_cuda_nn_stream(lucid_ctx *ctx); /* cuda/nn_table.cu */

static void *stream;

/* ------------------------------------------------------------ values */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(double lo, double hi) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) * (1.0 / 9007199254740992.0));
}

static size_t esz(lucid_dtype dt) { return dt == LUCID_F32 ? 4 : 2; }

static double get(lucid_dtype dt, const void *p, int64_t i) {
    if (dt == LUCID_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == LUCID_BF16 ? lucid_bf16_to_f32(h) : lucid_f16_to_f32(h);
}

/* store v rounded once (through f32) to dt */
static void put(lucid_dtype dt, void *p, int64_t i, double v) {
    if (dt == LUCID_F32) ((float *)p)[i] = (float)v;
    else if (dt == LUCID_BF16) ((uint16_t *)p)[i] = lucid_f32_to_bf16((float)v);
    else ((uint16_t *)p)[i] = lucid_f32_to_f16((float)v);
}

/* ------------------------------------------------------------ buffers
 * A device tensor of off + n elements and its host staging tensor; the
 * kernels see the device data from element `off` on (off 1: misaligned). */

typedef struct buf {
    lucid_dtype dt;
    int64_t n, off;
    lucid_tensor *d, *h;
} buf;

static int buf_make(buf *b, lucid_dtype dt, int64_t n, int64_t off) {
    int64_t tot = n + off > 0 ? n + off : 1;
    memset(b, 0, sizeof *b);
    b->dt = dt;
    b->n = n;
    b->off = off;
    if (lucid_tensor_empty(ctx, GPU, dt, 1, &tot, &b->d) != LUCID_OK) return 0;
    if (lucid_tensor_zeros(ctx, CPU, dt, 1, &tot, &b->h) != LUCID_OK) return 0;
    return 1;
}

static void buf_free(buf *b) {
    if (b->d) lucid_tensor_release(b->d);
    if (b->h) lucid_tensor_release(b->h);
    memset(b, 0, sizeof *b);
}

static void *hptr(const buf *b) { return (char *)lucid_tensor_data(b->h) + b->off * esz(b->dt); }
static void *dptr(const buf *b) { return (char *)lucid_tensor_data(b->d) + b->off * esz(b->dt); }

static int buf_up(buf *b) {
    return lucid_copy(ctx, b->d, b->h) == LUCID_OK && lucid_ctx_synchronize(ctx) == LUCID_OK;
}
static int buf_down(buf *b) {
    return lucid_ctx_synchronize(ctx) == LUCID_OK && lucid_copy(ctx, b->h, b->d) == LUCID_OK &&
           lucid_ctx_synchronize(ctx) == LUCID_OK;
}
static int buf_poison(buf *b) { return lucid_fill(ctx, b->d, NAN) == LUCID_OK; }

/* ------------------------------------------------------------ reference */

typedef struct dw_case {
    const char *tag;
    int64_t N, C, H, W;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int misalign;
    int tiled; /* expected route: 1 tiled kernels, 0 generic */
} dw_case;

static lucid_conv_dw_geom geom_of(const dw_case *k) {
    lucid_conv_dw_geom g;
    g.N = k->N; g.C = k->C; g.H = k->H; g.W = k->W;
    g.kh = k->kh; g.kw = k->kw; g.sh = k->sh; g.sw = k->sw;
    g.ph = k->ph; g.pw = k->pw; g.dh = k->dh; g.dw = k->dw;
    g.Ho = (k->H + 2 * k->ph - k->dh * (k->kh - 1) - 1) / k->sh + 1;
    g.Wo = (k->W + 2 * k->pw - k->dw * (k->kw - 1) - 1) / k->sw + 1;
    return g;
}

/* Visit every (n, c, i, j, u, v) with its input position inside x:
 * F(yi, xi, wi) with yi, xi element indices of y and x, wi of w. */
#define FOR_TAPS(g, F)                                                        \
    for (int64_t n_ = 0; n_ < (g).N; n_++)                                    \
        for (int64_t c_ = 0; c_ < (g).C; c_++)                                \
            for (int64_t i_ = 0; i_ < (g).Ho; i_++)                           \
                for (int64_t j_ = 0; j_ < (g).Wo; j_++)                       \
                    for (int u_ = 0; u_ < (g).kh; u_++) {                     \
                        int64_t hi_ = i_ * (g).sh - (g).ph + (int64_t)u_ * (g).dh; \
                        if (hi_ < 0 || hi_ >= (g).H) continue;                \
                        for (int v_ = 0; v_ < (g).kw; v_++) {                 \
                            int64_t wi_ = j_ * (g).sw - (g).pw + (int64_t)v_ * (g).dw; \
                            if (wi_ < 0 || wi_ >= (g).W) continue;            \
                            int64_t pl_ = n_ * (g).C + c_;                    \
                            int64_t yi = (pl_ * (g).Ho + i_) * (g).Wo + j_;   \
                            int64_t xi = (pl_ * (g).H + hi_) * (g).W + wi_;   \
                            int64_t wi = (c_ * (g).kh + u_) * (g).kw + v_;    \
                            F;                                                \
                        }                                                     \
                    }

/* ------------------------------------------------------------ comparisons */

static const double U24 = 1.0 / 16777216.0; /* 2^-24 */

static double unit_round(lucid_dtype dt) {
    return dt == LUCID_F32 ? U24 : dt == LUCID_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
}

/* y/dx in dtype dt against ref with sum |terms| sabs and term counts cnt */
static void cmp_act(const char *name, const buf *got, const double *ref, const double *sabs,
                    const int *cnt, int64_t n) {
    lucid_dtype dt = got->dt;
    double u = unit_round(dt), a = dt == LUCID_F16 ? U24 / 2 : 0.0;
    double worst = 0, num = 0, den = 0;
    int64_t wi = -1, nbad = 0;
    const void *p = hptr(got);
    for (int64_t i = 0; i < n; i++) {
        double gv = get(dt, p, i), d = fabs(gv - ref[i]);
        double e = (cnt[i] + 1) * U24 * sabs[i];
        double bound = u * fabs(ref[i]) + (1 + u) * e + a;
        double r = isnan(d) || isinf(d) ? INFINITY : (bound > 0 ? d / bound : (d > 0 ? INFINITY : 0));
        if (r > 1) nbad++;
        if (wi < 0 || r > worst) {
            worst = r;
            wi = i;
        }
        if (!isnan(d)) {
            num += d * d;
            den += ref[i] * ref[i];
        }
    }
    double fro = den > 0 ? sqrt(num / den) : sqrt(num);
    if (nbad)
        TEST_FAIL(name, "%lld of %lld elements outside the bound (worst %lld: gpu %.9g ref "
                  "%.9g, %.3g x bound)",
                  (long long)nbad, (long long)n, (long long)wi, get(dt, p, wi), ref[wi], worst);
    else if (dt == LUCID_F32 && !(fro <= 1e-5))
        TEST_FAIL(name, "relative Frobenius error %.3g > 1e-5", fro);
    else
        TEST_OK(name);
}

/* dw (f32) against ref with sum |terms| sabs */
static void cmp_dw(const char *name, const buf *got, const double *ref, const double *sabs,
                   int64_t n) {
    const float *p = hptr(got);
    double num = 0, den = 0, worst = 0;
    int64_t wi = -1, nbad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)p[i] - ref[i]);
        double bound = 1e-5 * sabs[i] + U24 * fabs(ref[i]);
        double r = isnan(d) || isinf(d) ? INFINITY : (bound > 0 ? d / bound : (d > 0 ? INFINITY : 0));
        if (r > 1) nbad++;
        if (wi < 0 || r > worst) {
            worst = r;
            wi = i;
        }
        if (!isnan(d)) {
            num += d * d;
            den += ref[i] * ref[i];
        }
    }
    double fro = den > 0 ? sqrt(num / den) : sqrt(num);
    if (nbad)
        TEST_FAIL(name, "%lld of %lld elements outside the bound (worst %lld: gpu %.9g ref "
                  "%.9g, %.3g x bound)",
                  (long long)nbad, (long long)n, (long long)wi, (double)p[wi], ref[wi], worst);
    else if (!(fro <= 1e-5))
        TEST_FAIL(name, "relative Frobenius error %.3g > 1e-5", fro);
    else
        TEST_OK(name);
}

static int fail_call(const char *name, lucid_status s) {
    TEST_FAIL(name, "%s: %s", lucid_status_name(s), lucid_ctx_error(ctx));
    return 0;
}

#define CALL(name, expr)                                                      \
    do {                                                                      \
        lucid_status s_ = (expr);                                             \
        if (s_ != LUCID_OK) {                                                 \
            fail_call(name, s_);                                              \
            goto done;                                                        \
        }                                                                     \
    } while (0)

#define DOWN(name, b)                                                         \
    do {                                                                      \
        if (!buf_down(b)) {                                                   \
            TEST_FAIL(name, "copy back failed: %s", lucid_ctx_error(ctx));    \
            goto done;                                                        \
        }                                                                     \
    } while (0)

/* ------------------------------------------------------------ one case */

static void test_case(const dw_case *k, lucid_dtype dt) {
    char pre[200];
    const lucid_conv_dw_geom g = geom_of(k);
    snprintf(pre, sizeof pre, "conv_dw %s [N%lld C%lld %lldx%lld] %s", k->tag, (long long)g.N,
             (long long)g.C, (long long)g.H, (long long)g.W, lucid_dtype_name(dt));
    const int64_t nx = g.N * g.C * g.H * g.W, ny = g.N * g.C * g.Ho * g.Wo;
    const int64_t nw = g.C * g.kh * g.kw, off = k->misalign ? 1 : 0;
    const size_t sb = lucid_conv_dw_wgrad_scratch_bytes(&g);
    buf x, dy, y, dx, w, b, dw, sc;
    memset(&x, 0, sizeof x); dy = y = dx = w = b = dw = sc = x;
    double *xr = calloc((size_t)nx, sizeof(double)), *dyr = calloc((size_t)ny, sizeof(double));
    double *wr = calloc((size_t)nw, sizeof(double)), *br = calloc((size_t)g.C, sizeof(double));
    const int64_t nmax = nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw);
    double *ref = calloc((size_t)nmax, sizeof(double));
    double *sabs = calloc((size_t)nmax, sizeof(double));
    double *old = calloc((size_t)nmax, sizeof(double));
    int *cnt = calloc((size_t)nmax, sizeof(int));
    float *first = calloc((size_t)nw, sizeof(float));
    if (!xr || !dyr || !wr || !br || !ref || !sabs || !old || !cnt || !first ||
        !buf_make(&x, dt, nx, off) || !buf_make(&dy, dt, ny, off) || !buf_make(&y, dt, ny, off) ||
        !buf_make(&dx, dt, nx, off) || !buf_make(&w, LUCID_F32, nw, off) ||
        !buf_make(&b, LUCID_F32, g.C, off) || !buf_make(&dw, LUCID_F32, nw, off) ||
        !buf_make(&sc, LUCID_F32, (int64_t)(sb / 4), 0)) {
        TEST_FAIL(NAME("%s: setup", pre), "allocation failed: %s", lucid_ctx_error(ctx));
        goto done;
    }
    /* inputs, rounded once to their dtype; the reference reads them back */
    double fan = 1.0 / sqrt((double)(g.kh * g.kw));
    for (int64_t i = 0; i < nx; i++) {
        put(dt, hptr(&x), i, urand(-1, 1));
        xr[i] = get(dt, hptr(&x), i);
    }
    for (int64_t i = 0; i < ny; i++) {
        put(dt, hptr(&dy), i, urand(-1, 1));
        dyr[i] = get(dt, hptr(&dy), i);
    }
    for (int64_t i = 0; i < nw; i++) {
        ((float *)hptr(&w))[i] = (float)urand(-fan, fan);
        wr[i] = ((float *)hptr(&w))[i];
    }
    for (int64_t i = 0; i < g.C; i++) {
        ((float *)hptr(&b))[i] = (float)urand(-0.5, 0.5);
        br[i] = ((float *)hptr(&b))[i];
    }
    if (!buf_up(&x) || !buf_up(&dy) || !buf_up(&w) || !buf_up(&b)) {
        TEST_FAIL(NAME("%s: upload", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* ---- forward, without and with bias */
    for (int bias = 0; bias < 2; bias++) {
        char cname[320];
        snprintf(cname, sizeof cname, "%s: forward%s", pre, bias ? " +bias" : "");
        for (int64_t i = 0; i < ny; i++) {
            int64_t c = (i / (g.Ho * g.Wo)) % g.C;
            ref[i] = bias ? br[c] : 0.0;
            sabs[i] = fabs(ref[i]);
            cnt[i] = bias;
        }
        FOR_TAPS(g, (ref[yi] += wr[wi] * xr[xi], sabs[yi] += fabs(wr[wi] * xr[xi]), cnt[yi]++));
        if (!buf_poison(&y)) {
            TEST_FAIL(cname, "poison: %s", lucid_ctx_error(ctx));
            goto done;
        }
        CALL(cname, lucid_conv_dw_forward(ctx, stream, dt, &g, dptr(&x), dptr(&w),
                                          bias ? dptr(&b) : NULL, dptr(&y)));
        DOWN(cname, &y);
        cmp_act(cname, &y, ref, sabs, cnt, ny);
    }

    /* ---- backward-data, beta 0 (dx poisoned) and beta 1 */
    for (int beta = 0; beta < 2; beta++) {
        char cname[320];
        snprintf(cname, sizeof cname, "%s: backward-data beta %d", pre, beta);
        if (beta) {
            for (int64_t i = 0; i < nx; i++) {
                put(dt, hptr(&dx), i, urand(-1, 1));
                old[i] = get(dt, hptr(&dx), i);
            }
            if (!buf_up(&dx)) {
                TEST_FAIL(cname, "upload: %s", lucid_ctx_error(ctx));
                goto done;
            }
        } else if (!buf_poison(&dx)) {
            TEST_FAIL(cname, "poison: %s", lucid_ctx_error(ctx));
            goto done;
        }
        for (int64_t i = 0; i < nx; i++) {
            ref[i] = beta ? old[i] : 0.0;
            sabs[i] = fabs(ref[i]);
            cnt[i] = beta;
        }
        FOR_TAPS(g, (ref[xi] += wr[wi] * dyr[yi], sabs[xi] += fabs(wr[wi] * dyr[yi]), cnt[xi]++));
        CALL(cname, lucid_conv_dw_backward_data(ctx, stream, dt, &g, dptr(&dy), dptr(&w),
                                                dptr(&dx), (double)beta));
        DOWN(cname, &dx);
        cmp_act(cname, &dx, ref, sabs, cnt, nx);
    }

    /* ---- backward-filter: beta 0 twice (bitwise), then beta 1 */
    for (int run = 0; run < 3; run++) {
        int beta = run == 2;
        char cname[320];
        if (run == 1) snprintf(cname, sizeof cname, "%s: backward-filter bitwise rerun", pre);
        else snprintf(cname, sizeof cname, "%s: backward-filter beta %d", pre, beta);
        if (beta) {
            for (int64_t i = 0; i < nw; i++) {
                ((float *)hptr(&dw))[i] = (float)urand(-1, 1);
                old[i] = ((float *)hptr(&dw))[i];
            }
            if (!buf_up(&dw)) {
                TEST_FAIL(cname, "upload: %s", lucid_ctx_error(ctx));
                goto done;
            }
        } else if (!buf_poison(&dw)) {
            TEST_FAIL(cname, "poison: %s", lucid_ctx_error(ctx));
            goto done;
        }
        if (sb && !buf_poison(&sc)) {
            TEST_FAIL(cname, "poison: %s", lucid_ctx_error(ctx));
            goto done;
        }
        for (int64_t i = 0; i < nw; i++) {
            ref[i] = beta ? old[i] : 0.0;
            sabs[i] = fabs(ref[i]);
        }
        FOR_TAPS(g, (ref[wi] += dyr[yi] * xr[xi], sabs[wi] += fabs(dyr[yi] * xr[xi])));
        CALL(cname, lucid_conv_dw_backward_filter(ctx, stream, dt, &g, dptr(&x), dptr(&dy),
                                                  dptr(&dw), (double)beta,
                                                  sb ? dptr(&sc) : NULL, sb));
        DOWN(cname, &dw);
        if (run == 0) memcpy(first, hptr(&dw), (size_t)nw * sizeof(float));
        if (run == 1) {
            if (memcmp(first, hptr(&dw), (size_t)nw * sizeof(float)) != 0)
                TEST_FAIL(cname, "two runs differ bitwise");
            else
                TEST_OK(cname);
        } else {
            cmp_dw(cname, &dw, ref, sabs, nw);
        }
    }
done:
    buf_free(&x); buf_free(&dy); buf_free(&y); buf_free(&dx);
    buf_free(&w); buf_free(&b); buf_free(&dw); buf_free(&sc);
    free(xr); free(dyr); free(wr); free(br); free(ref); free(sabs); free(old); free(cnt);
    free(first);
}

/* ------------------------------------------------------------ cases */

#define DW3(tag, N, C, H, W) {tag, N, C, H, W, 3, 3, 1, 1, 1, 1, 1, 1, 0, 1}

static const dw_case NET[] = {
    DW3("yolo 64@80", 4, 64, 80, 80),   DW3("yolo 128@40", 4, 128, 40, 40),
    DW3("yolo 64@40", 4, 64, 40, 40),   DW3("yolo 256@20", 4, 256, 20, 20),
    DW3("yolo 64@20", 4, 64, 20, 20),   DW3("yolo pe 128@20", 4, 128, 20, 20),
};
/* calls per forward of each NET shape in YOLO11n-pose (bench/conv_lab/shapes.txt) */
static const int NET_CALLS[] = {2, 1, 1, 1, 1, 1};

static const dw_case ODD[] = {
    DW3("3x3 s1 p1 7x13", 2, 5, 7, 13),
    DW3("3x3 s1 p1 9x6", 3, 4, 9, 6),
    DW3("3x3 s1 p1 1x1 planes", 3, 70, 1, 1),
    DW3("3x3 s1 p1 300 wide", 2, 3, 5, 300),
    DW3("3x3 s1 p1 C2048 (one split)", 1, 2048, 6, 8),
    {"3x3 s1 p1 5000 wide (generic)", 1, 2, 3, 5000, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0},
    {"3x3 s1 p1 misaligned 12x16", 2, 6, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
    {"3x3 s2 p1", 2, 6, 13, 17, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0},
    {"3x3 s2 p1 C256 (one split)", 2, 256, 6, 6, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0},
    {"3x3 s1 p0", 2, 5, 7, 13, 3, 3, 1, 1, 0, 0, 1, 1, 0, 0},
    {"5x5 s1 p2", 2, 6, 11, 12, 5, 5, 1, 1, 2, 2, 1, 1, 0, 1},
    {"5x5 s1 p2 odd", 2, 3, 9, 7, 5, 5, 1, 1, 2, 2, 1, 1, 0, 1},
    {"5x5 s1 p0", 2, 4, 10, 9, 5, 5, 1, 1, 0, 0, 1, 1, 0, 0},
    {"3x3 d2 p2", 2, 5, 12, 13, 3, 3, 1, 1, 2, 2, 2, 2, 0, 0},
    {"3x5 s2x1 p1x2 d1x2", 2, 3, 9, 11, 3, 5, 2, 1, 1, 2, 1, 2, 0, 0},
    {"1x1", 2, 3, 5, 7, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0},
    DW3("3x3 s1 p1 large batch", 9, 3, 33, 20),
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------ host-only checks */

static void test_host(void) {
    int ok = 1;
    for (size_t i = 0; i < NELEM(NET); i++) {
        lucid_conv_dw_geom g = geom_of(&NET[i]);
        if (!lucid_conv_dw_tiled(&g)) {
            TEST_FAIL("conv_dw route: the network shapes take the tiled kernels", "%s does not",
                      NET[i].tag);
            ok = 0;
        }
    }
    if (ok) TEST_OK("conv_dw route: the network shapes take the tiled kernels");
    ok = 1;
    for (size_t i = 0; i < NELEM(ODD); i++) {
        lucid_conv_dw_geom g = geom_of(&ODD[i]);
        if (lucid_conv_dw_tiled(&g) != ODD[i].tiled) {
            TEST_FAIL("conv_dw route: odd cases", "%s: tiled %d, expected %d", ODD[i].tag,
                      lucid_conv_dw_tiled(&g), ODD[i].tiled);
            ok = 0;
        }
    }
    if (ok) TEST_OK("conv_dw route: odd cases");
    {
        lucid_conv_dw_geom g = geom_of(&NET[0]);
        size_t s = lucid_conv_dw_wgrad_scratch_bytes(&g);
        CHECK("conv_dw scratch: network 64@80 needs C*9*S floats, S > 1",
              s > 0 && s % (64 * 9 * 4) == 0 && s / (64 * 9 * 4) > 1, "%zu bytes", s);
        lucid_conv_dw_geom g2 = geom_of(&ODD[7]); /* 3x3 s2 p1: generic, C*9*S floats */
        size_t s2 = lucid_conv_dw_wgrad_scratch_bytes(&g2);
        CHECK("conv_dw scratch: generic 3x3 s2 needs C*9*S floats",
              s2 % (6 * 9 * 4) == 0, "%zu bytes", s2);
        lucid_conv_dw_geom g3 = geom_of(&ODD[4]);
        CHECK("conv_dw scratch: none for C 2048 (one split)",
              lucid_conv_dw_wgrad_scratch_bytes(&g3) == 0, "%zu bytes",
              lucid_conv_dw_wgrad_scratch_bytes(&g3));
    }
    /* argument errors need no device: a CPU context holds the message */
    lucid_ctx *c = NULL;
    lucid_ctx_options o = lucid_ctx_options_default();
    char err[256] = "";
    if (lucid_ctx_create(&o, &c, err, sizeof err) != LUCID_OK) {
        TEST_FAIL("conv_dw argument errors", "cpu context: %s", err);
        return;
    }
    lucid_conv_dw_geom g = geom_of(&NET[4]);
    g.Ho = 19;
    lucid_status s1 = lucid_conv_dw_forward(c, NULL, LUCID_BF16, &g, NULL, NULL, NULL, NULL);
    CHECK("conv_dw argument errors: Ho that does not follow is ERR_ARG",
          s1 == LUCID_ERR_ARG && strstr(lucid_ctx_error(c), "does not follow"), "%s: %s",
          lucid_status_name(s1), lucid_ctx_error(c));
    g = geom_of(&NET[4]);
    lucid_status s2 = lucid_conv_dw_backward_data(c, NULL, LUCID_F64, &g, NULL, NULL, NULL, 0.0);
    CHECK("conv_dw argument errors: f64 is ERR_UNSUPPORTED", s2 == LUCID_ERR_UNSUPPORTED,
          "%s: %s", lucid_status_name(s2), lucid_ctx_error(c));
    size_t need = lucid_conv_dw_wgrad_scratch_bytes(&g);
    lucid_status s3 = need ? lucid_conv_dw_backward_filter(c, NULL, LUCID_BF16, &g, (void *)16,
                                                           (void *)16, (float *)16, 0.0,
                                                           (void *)16, need - 4)
                           : LUCID_ERR_ARG;
    CHECK("conv_dw argument errors: short scratch is ERR_ARG",
          s3 == LUCID_ERR_ARG && (!need || strstr(lucid_ctx_error(c), "scratch")), "%s: %s",
          lucid_status_name(s3), lucid_ctx_error(c));
    lucid_ctx_release(c);
}

/* ------------------------------------------------------------ timing */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* bf16, eager: microseconds per call of each pass (host clock around iters
 * back-to-back calls, after 3 warm-up calls). */
static void bench_net(int iters) {
    double tot[3] = {0, 0, 0};
    for (size_t i = 0; i < NELEM(NET); i++) {
        lucid_conv_dw_geom g = geom_of(&NET[i]);
        int64_t n = g.N * g.C * g.H * g.W, nw = g.C * 9;
        size_t sb = lucid_conv_dw_wgrad_scratch_bytes(&g);
        buf x, y, w, dw, sc;
        memset(&x, 0, sizeof x); y = w = dw = sc = x;
        if (!buf_make(&x, LUCID_BF16, n, 0) || !buf_make(&y, LUCID_BF16, n, 0) ||
            !buf_make(&w, LUCID_F32, nw, 0) || !buf_make(&dw, LUCID_F32, nw, 0) ||
            !buf_make(&sc, LUCID_F32, (int64_t)(sb / 4), 0) ||
            lucid_fill(ctx, x.d, 0.5) != LUCID_OK || lucid_fill(ctx, y.d, 0.25) != LUCID_OK ||
            lucid_fill(ctx, w.d, 0.1) != LUCID_OK) {
            printf("# timing %s: setup failed: %s\n", NET[i].tag, lucid_ctx_error(ctx));
            goto next;
        }
        double us[3];
        for (int pass = 0; pass < 3; pass++) {
            lucid_status st = LUCID_OK;
            double t0 = 0;
            for (int it = -3; it < iters && st == LUCID_OK; it++) {
                if (it == 0) {
                    if (lucid_ctx_synchronize(ctx) != LUCID_OK) break;
                    t0 = now_s();
                }
                if (pass == 0)
                    st = lucid_conv_dw_forward(ctx, stream, LUCID_BF16, &g, dptr(&x), dptr(&w),
                                               NULL, dptr(&y));
                else if (pass == 1)
                    st = lucid_conv_dw_backward_data(ctx, stream, LUCID_BF16, &g, dptr(&y),
                                                     dptr(&w), dptr(&x), 0.0);
                else
                    st = lucid_conv_dw_backward_filter(ctx, stream, LUCID_BF16, &g, dptr(&x),
                                                       dptr(&y), dptr(&dw), 0.0,
                                                       sb ? dptr(&sc) : NULL, sb);
            }
            if (st != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK) {
                printf("# timing %s: failed: %s\n", NET[i].tag, lucid_ctx_error(ctx));
                goto next;
            }
            us[pass] = (now_s() - t0) / iters * 1e6;
            tot[pass] += us[pass] * NET_CALLS[i];
        }
        printf("# timing bf16 %-16s fwd %7.2f us  dgrad %7.2f us  wgrad %7.2f us  (x%d per "
               "step)\n",
               NET[i].tag, us[0], us[1], us[2], NET_CALLS[i]);
    next:
        buf_free(&x); buf_free(&y); buf_free(&w); buf_free(&dw); buf_free(&sc);
    }
    printf("# timing bf16 network depthwise (7 calls): fwd %.1f us + dgrad %.1f us + wgrad "
           "%.1f us = %.3f ms per step (eager, host clock, %d iters)\n",
           tot[0], tot[1], tot[2], (tot[0] + tot[1] + tot[2]) * 1e-3, iters);
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!DW_LINKED()) {
        TEST_SKIP("conv_dw cuda (host checks and kernels)",
                  "CPU-only build (no cuda/nn_conv_dw.o)");
        return 0;
    }
    test_host();
    if (!lucid_cuda_available()) {
        TEST_SKIP("conv_dw cuda kernels (network shapes and odd cases, f32/bf16/f16)",
                  "no CUDA device");
        return test_exit();
    }
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[512] = "";
    lucid_status st = lucid_ctx_create(&o, &ctx, err, sizeof err);
    if (st != LUCID_OK) {
        TEST_FAIL("conv_dw cuda context create", "%s: %s", lucid_status_name(st), err);
        return test_exit();
    }
    stream = lucid_cuda_nn_stream ? lucid_cuda_nn_stream(ctx) : NULL;
    CHECK("conv_dw cuda context and compute stream", stream != NULL,
          "lucid_cuda_nn_stream returned NULL");
    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < NELEM(NET); i++) test_case(&NET[i], DTS[d]);
        for (size_t i = 0; i < NELEM(ODD); i++) test_case(&ODD[i], DTS[d]);
    }
    const char *env = getenv("LUCID_DW_BENCH_ITERS");
    int iters = env ? atoi(env) : 50;
    if (iters > 0) bench_net(iters);
    return cuda_test_finish();
}
