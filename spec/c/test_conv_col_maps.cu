/*
 * test_conv_col_maps.cu — host emulation of the im2col + cuBLAS conv route
 * (cuda/nn_conv_col.cu): the kernel's own per-thread work, col_im2col_row8
 * (im2col: 8 columns of one column-matrix row per thread item, in the
 * stride variant the launcher picks), run on the CPU for every thread item
 * of a grid, with a float64 GEMM in place of cuBLAS, against a float64
 * direct convolution.  Needs nvcc, not a GPU (runs in
 * make test).
 *
 * Per geometry (3x3 stride 1 pad 1, also with 6- and 1-wide rows so that an
 * 8-column vector spans several output rows; 3x3 stride 2 pad 1 with even
 * and odd H/W; stride 3; 5x5 pad 2 at stride 1 and 2; 3x3 dilation 2 pad 2
 * at stride 1 and 2; 1x1 stride 2 pad 0, even and odd; 3x1 and 1x3 kernels;
 * 2x2 stride 2 pad 0, even and odd; an asymmetric 3x5 kernel with mixed
 * stride, padding and dilation; padding 3 on a 3x3 kernel, whole rows and
 * columns of padding; batch 1, 2 and 3; all with K = Cin*kh*kw, Cout and
 * P = Ho*Wo multiples of 8, lucid_conv_col_eligible checked), with x, dy
 * and the weight rounded to bf16 (the weight: the route's weight cast):
 *   - im2col coverage: item i returns offset 8*i and the N*K*P/8 items
 *     write every column element exactly once, nothing outside;
 *   - im2col = the header's definition of col[n][k][p], bitwise, in bf16
 *     and f16 (the copy is exact; the padding is +0);
 *   - forward: Y[n] = W . col[n] (f64) = the direct convolution (f64):
 *     relative Frobenius error <= 1e-6 (the same products in another
 *     order: ~1e-16; a wrong index gives O(1));
 *   - backward-data (stride-1 geometries, the only ones the route takes
 *     for this pass; the others are checked to be refused): the route's
 *     own transposed geometry (col_dgrad_geom) and the flipped, transposed
 *     weight w'[ci][co][r][q] = w[co][ci][kh-1-r][kw-1-q]; im2col(dy) by
 *     the kernel's items, then dX[n] = W' . col'[n] (f64) = the direct
 *     transposed convolution (f64, scattered from the forward's index map):
 *     relative Frobenius error <= 1e-6;
 *   - backward-filter: dW = sum_n dY[n] . col[n]^T (f64) = the direct
 *     filter gradient (f64): relative Frobenius error <= 1e-6.
 * Host checks of the contract:
 *   - lucid_conv_col_eligible accepts the YOLO11n-pose 3x3 convs at batch 4
 *     in bf16 and f16 (64>64 80x80, 64>128 s2 80x80, 32>64 s2 160x160, ...)
 *     for the forward and backward-filter, for the backward-data only those
 *     of stride 1 (also refused there: padding beyond (k-1)*d), and the
 *     edge N*K*P = LUCID_CONV_COL_MAX_ELEMS; refuses a pass other than 0, 1,
 *     2, f32, f64, NULL,
 *     P, K or Cout not a multiple of 8, an inconsistent Ho / Wo, an empty
 *     output, N*K*P above the limit (by one image), zero sizes, stride or
 *     dilation 0, negative padding, x / y / the weight over 2^31 elements;
 *   - lucid_conv_col_scratch = the regions the header lists (256-byte
 *     aligned): forward col + weight cast [+ f32 product with a bias],
 *     backward-data the columns of dy + the flipped weight (0 when the
 *     pass is not eligible), backward-filter col [+ the per-image f32
 *     partials for N > 1], in bf16 and f16; the bias flag changes only the
 *     forward;
 *   - lucid_conv_col_switch follows LUCID_CONV_COL (unset, "" or "1": 7;
 *     "0": 0; a set of the letters f, d, w: their mask; else -1) and
 *     returns the value read;
 *   - the entry points refuse an ineligible geometry (ERR_UNSUPPORTED,
 *     message "not eligible") or a NULL one (ERR_ARG) before any launch or
 *     GEMM call.
 */
#include "nn_conv_col.cu"

#include "conv_col_env.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/* Not linked into this host-only program (nothing is launched; the error
 * paths only format a message): cuda/backend.cu, engine/core and
 * cuda/nn_conv_gemm.cu and cuBLAS.  The GEMM entry points (and
 * cublasGemmStridedBatchedEx, which the backward-data calls itself) count
 * their calls (none may happen here); lucid_conv_gemm_scratch
 * is the size contract of nn_conv_gemm.cuh: the weight in dt (forward,
 * backward-data), the f32 product with a bias (forward), the per-image f32
 * partials for N > 1 (backward-filter), each 256-byte aligned. */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
static char g_msg[1024];
extern "C" lucid_status lucid_seterr(lucid_ctx *, lucid_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}
extern "C" const char *lucid_dtype_name(lucid_dtype dt) {
    return dt == LUCID_F32 ? "f32" : dt == LUCID_BF16 ? "bf16" : dt == LUCID_F16 ? "f16" : "?";
}
lucid_status lucid_cuda_err(lucid_ctx *, cudaError_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}
static int g_gemm_calls = 0;
lucid_status lucid_conv_gemm_forward_wc(lucid_ctx *, cublasHandle_t, cudaStream_t, lucid_dtype,
                                        const lucid_conv_gemm_geom *, const void *,
                                        const float *, const void *, const float *, void *,
                                        void *) {
    g_gemm_calls++;
    return LUCID_ERR_DEVICE;
}
extern "C" cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
    const void *, cudaDataType, int, long long int, const void *, cudaDataType, int,
    long long int, const void *, void *, cudaDataType, int, long long int, int,
    cublasComputeType_t, cublasGemmAlgo_t) {
    g_gemm_calls++;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
lucid_status lucid_cublas_err(lucid_ctx *, cublasStatus_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}
lucid_status lucid_conv_gemm_backward_filter_rows(lucid_ctx *, cublasHandle_t, cudaStream_t,
                                                  lucid_dtype, const lucid_conv_gemm_geom *,
                                                  int64_t, const void *, const void *, float *,
                                                  float, void *) {
    g_gemm_calls++;
    return LUCID_ERR_DEVICE;
}
/* the split rule of nn_conv_gemm.cu with LUCID_WGRAD_SPLIT unset (L = 1600) */
static int64_t stub_wgrad_splits(const lucid_conv_gemm_geom *g) {
    int64_t S = 1;
    const int64_t per = g->N * g->Cout * g->Cin;
    while (S < 64 && g->HW % (16 * S) == 0 && g->HW / (2 * S) >= 1600 &&
           per <= ((int64_t)1 << 26) / (2 * S))
        S *= 2;
    return S;
}
size_t lucid_conv_gemm_wgrad_scratch(const lucid_conv_gemm_geom *g, int64_t Kout) {
    const int64_t parts = g->N * stub_wgrad_splits(g);
    if (parts == 1 && Kout >= g->Cin) return 0;
    return nn_align((size_t)(parts * g->Cout * g->Cin) * 4);
}
size_t lucid_conv_gemm_scratch(const lucid_conv_gemm_geom *g, lucid_dtype, int pass, int bias) {
    size_t wc = nn_align((size_t)(g->Cout * g->Cin) * 2);
    if (pass == 0) return wc + (bias ? nn_align((size_t)(g->N * g->Cout * g->HW) * 4) : 0);
    if (pass == 1) return wc;
    return lucid_conv_gemm_wgrad_scratch(g, g->Cin);
}

static int failures = 0;
static void ok(bool good, const char *name, const char *why) {
    if (good) {
        printf("ok %s\n", name);
    } else {
        printf("not ok %s: %s\n", name, why);
        failures++;
    }
}

static char why[512];
#define WHY(...) (snprintf(why, sizeof why, __VA_ARGS__), why)
static char nm[320];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

static unsigned long long rng = 0x7f4a7c159e3779b9ull;
static double urand(double lo, double hi) {
    unsigned long long z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) * (1.0 / 9007199254740992.0));
}

static float rb(double v) { return __bfloat162float(__float2bfloat16_rn((float)v)); }
template <typename T> static unsigned short bits16(T v) {
    unsigned short u;
    memcpy(&u, &v, 2);
    return u;
}
template <typename T> static T from_float(float v);
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __half from_float<__half>(float v) { return __float2half_rn(v); }

static double rel_frob(const std::vector<double> &a, const std::vector<double> &r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        double d = a[i] - r[i];
        num += d * d;
        den += r[i] * r[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static void check_rel(const char *name, const std::vector<double> &a,
                      const std::vector<double> &r, double tol) {
    double e = rel_frob(a, r);
    if (e <= tol) printf("ok %s (rel %.2e)\n", name, e);
    else ok(false, name, WHY("relative error %.3g > %.0e", e, tol));
}

/* ------------------------------------------------------------ geometry */

typedef struct col_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int kh, kw, sh, sw, ph, pw, dh, dw;
} col_case;

static lucid_conv_col_geom geom_of(const col_case &c) {
    lucid_conv_col_geom g;
    memset(&g, 0, sizeof g);
    g.N = c.N; g.Cin = c.Cin; g.H = c.H; g.W = c.W; g.Cout = c.Cout;
    g.kh = c.kh; g.kw = c.kw; g.sh = c.sh; g.sw = c.sw; g.ph = c.ph; g.pw = c.pw;
    g.dh = c.dh; g.dw = c.dw;
    g.Ho = (c.H + 2 * c.ph - (int64_t)c.dh * (c.kh - 1) - 1) / c.sh + 1;
    g.Wo = (c.W + 2 * c.pw - (int64_t)c.dw * (c.kw - 1) - 1) / c.sw + 1;
    return g;
}

/* square kernel / stride / padding / dilation */
static lucid_conv_col_geom sq(int64_t N, int64_t Cin, int64_t H, int64_t W, int64_t Cout, int k,
                              int s, int p, int d) {
    col_case c = {"", N, Cin, H, W, Cout, k, k, s, s, p, p, d, d};
    return geom_of(c);
}

/* ------------------------------------------------------------ one geometry */

/* im2col by the kernel's per-thread function for T: every item's 8 values
 * stored at its offset; coverage and the definition checked. */
template <typename T>
static void im2col_check(const char *pre, const char *tname, const lucid_conv_col_geom &g,
                         const ColArgs &a, const std::vector<float> &xf, std::vector<T> &col) {
    const int64_t N = g.N, K = a.K, P = a.P, total = N * K * P, items = N * K * (P / 8);
    std::vector<T> x(xf.size());
    for (size_t i = 0; i < xf.size(); i++) x[i] = from_float<T>(xf[i]);
    col.assign((size_t)total, from_float<T>(NAN));
    std::vector<unsigned char> wrote((size_t)total, 0);
    int64_t bad_off = -1, out = 0;
    const int s = col_stride(a);
    for (int64_t i = 0; i < items; i++) {
        T v[8];
        const unsigned row = (unsigned)(i / (P / 8)), p8 = (unsigned)(i % (P / 8));
        const int64_t off =
            (int64_t)(s == 1   ? col_im2col_row8<T, 1>(x.data(), a, row, p8, v)
                      : s == 2 ? col_im2col_row8<T, 2>(x.data(), a, row, p8, v)
                               : col_im2col_row8<T, 0>(x.data(), a, row, p8, v));
        if (off != 8 * i && bad_off < 0) bad_off = i;
        if (off < 0 || off + 8 > total) {
            out++;
            continue;
        }
        for (int j = 0; j < 8; j++) {
            col[(size_t)(off + j)] = v[j];
            wrote[(size_t)(off + j)]++;
        }
    }
    int64_t not_once = 0;
    for (int64_t e = 0; e < total; e++) not_once += wrote[(size_t)e] != 1;
    if (strcmp(tname, "bf16") == 0)
        ok(bad_off < 0 && out == 0 && not_once == 0,
           NAME("%s: im2col items write every column element once", pre),
           WHY("item %lld returned another offset than 8*i; %lld items outside; %lld of %lld "
               "elements not written exactly once",
               (long long)bad_off, (long long)out, (long long)not_once, (long long)total));
    /* the definition: col[n][(ci*kh + r)*kw + q][ho*Wo + wo] =
     * x[n][ci][ho*sh - ph + r*dh][wo*sw - pw + q*dw], +0 outside */
    int64_t nbad = 0, first = -1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t ci = 0; ci < g.Cin; ci++)
            for (int r = 0; r < g.kh; r++)
                for (int q = 0; q < g.kw; q++)
                    for (int64_t ho = 0; ho < g.Ho; ho++)
                        for (int64_t wo = 0; wo < g.Wo; wo++) {
                            int64_t k = (ci * g.kh + r) * g.kw + q, p = ho * g.Wo + wo;
                            int64_t hi = ho * g.sh - g.ph + (int64_t)r * g.dh;
                            int64_t wi = wo * g.sw - g.pw + (int64_t)q * g.dw;
                            unsigned short want = 0;
                            if (hi >= 0 && hi < g.H && wi >= 0 && wi < g.W)
                                want = bits16(
                                    x[(size_t)(((n * g.Cin + ci) * g.H + hi) * g.W + wi)]);
                            int64_t e = (n * K + k) * P + p;
                            if (bits16(col[(size_t)e]) != want) {
                                if (first < 0) first = e;
                                nbad++;
                            }
                        }
    ok(nbad == 0, NAME("%s: im2col = definition %s (bitwise)", pre, tname),
       WHY("%lld of %lld elements differ (first at %lld)", (long long)nbad, (long long)total,
           (long long)first));
}

static void run_case(const col_case &c) {
    const lucid_conv_col_geom g = geom_of(c);
    char pre[200];
    snprintf(pre, sizeof pre, "col %s N%lld %lld>%lld %lldx%lld k%dx%d s%d,%d p%d,%d d%d,%d",
             c.tag, (long long)c.N, (long long)c.Cin, (long long)c.Cout, (long long)c.H,
             (long long)c.W, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
    const int el = lucid_conv_col_eligible(&g, LUCID_BF16, 0);
    ok(el == 1, NAME("%s: eligible (K %lld, P %lld)", pre, (long long)(c.Cin * c.kh * c.kw),
                     (long long)(g.Ho * g.Wo)),
       "refused");
    if (el != 1) return;
    const ColArgs a = col_args(&g);
    const int64_t N = g.N, Cin = g.Cin, H = g.H, W = g.W, Cout = g.Cout, Ho = g.Ho, Wo = g.Wo;
    const int64_t K = a.K, P = a.P, kh = g.kh, kw = g.kw;
    const size_t nx = (size_t)(N * Cin * H * W), ny = (size_t)(N * Cout * P),
                 nw = (size_t)(Cout * K);
    std::vector<float> xf(nx), dyf(ny), wf(nw);
    for (auto &v : xf) v = rb(urand(-1, 1));
    for (auto &v : dyf) v = rb(urand(-1, 1));
    for (auto &v : wf) v = rb(urand(-0.5, 0.5)); /* the route's weight cast */

    /* direct references (f64), all three from the forward's index map */
    std::vector<double> ry(ny, 0.0), rdx(nx, 0.0), rdw(nw, 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < Cout; co++)
            for (int64_t ho = 0; ho < Ho; ho++)
                for (int64_t wo = 0; wo < Wo; wo++) {
                    const size_t yi = (size_t)(((n * Cout + co) * Ho + ho) * Wo + wo);
                    for (int64_t ci = 0; ci < Cin; ci++)
                        for (int64_t r = 0; r < kh; r++)
                            for (int64_t q = 0; q < kw; q++) {
                                int64_t hi = ho * g.sh - g.ph + r * g.dh;
                                int64_t wi = wo * g.sw - g.pw + q * g.dw;
                                if (hi < 0 || hi >= H || wi < 0 || wi >= W) continue;
                                const size_t xi = (size_t)(((n * Cin + ci) * H + hi) * W + wi);
                                const size_t wi_ = (size_t)(((co * Cin + ci) * kh + r) * kw + q);
                                ry[yi] += (double)wf[wi_] * xf[xi];
                                rdx[xi] += (double)wf[wi_] * dyf[yi];
                                rdw[wi_] += (double)dyf[yi] * xf[xi];
                            }
                }

    /* im2col (the kernel's items), bf16 and f16 */
    std::vector<__nv_bfloat16> col;
    im2col_check<__nv_bfloat16>(pre, "bf16", g, a, xf, col);
    {
        std::vector<__half> colh;
        im2col_check<__half>(pre, "f16", g, a, xf, colh);
    }
    std::vector<double> colf(col.size());
    for (size_t i = 0; i < col.size(); i++) colf[i] = __bfloat162float(col[i]);

    /* forward: Y[n] = W . col[n] */
    std::vector<double> y(ny, 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < Cout; co++) {
            double *yr = &y[(size_t)((n * Cout + co) * P)];
            for (int64_t k = 0; k < K; k++) {
                const double wv = wf[(size_t)(co * K + k)];
                const double *cr = &colf[(size_t)((n * K + k) * P)];
                for (int64_t p = 0; p < P; p++) yr[p] += wv * cr[p];
            }
        }
    check_rel(NAME("%s: forward W.col = direct conv", pre), y, ry, 1e-6);

    /* backward-data: stride 1 only, as the forward of dy with the flipped,
     * transposed weight (the route's own geometry), im2col by the kernel's items */
    lucid_conv_col_geom t;
    const int eld = lucid_conv_col_eligible(&g, LUCID_BF16, 1);
    if (!conv_col_dgrad_takes(g.sh, g.sw, g.kh, g.kw, g.ph, g.pw, g.dh, g.dw)) {
        ok(eld == 0, NAME("%s: backward-data refused (stride or padding)", pre), "accepted");
    } else {
        ok(eld == 1 && col_dgrad_geom(&g, LUCID_BF16, &t) && t.Cin == Cout && t.Cout == Cin &&
               t.Ho == H && t.Wo == W,
           NAME("%s: backward-data eligible, transposed geometry", pre),
           WHY("eligible %d; t: Cin %lld Cout %lld %lldx%lld", eld, (long long)t.Cin,
               (long long)t.Cout, (long long)t.Ho, (long long)t.Wo));
        if (eld == 1) {
            const ColArgs at = col_args(&t);
            std::vector<__nv_bfloat16> colt;
            char pre2[240];
            snprintf(pre2, sizeof pre2, "%s: transposed", pre);
            im2col_check<__nv_bfloat16>(pre2, "bf16", t, at, dyf, colt);
            const int64_t Kt = at.K, Pt = at.P; /* Cout*kh*kw, H*W */
            std::vector<double> wflip((size_t)(Cin * Kt));
            for (int64_t ci = 0; ci < Cin; ci++)
                for (int64_t co = 0; co < Cout; co++)
                    for (int64_t r = 0; r < kh; r++)
                        for (int64_t q = 0; q < kw; q++)
                            wflip[(size_t)(((ci * Cout + co) * kh + r) * kw + q)] =
                                wf[(size_t)(((co * Cin + ci) * kh + (kh - 1 - r)) * kw +
                                            (kw - 1 - q))];
            std::vector<double> dx(nx, 0.0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t ci = 0; ci < Cin; ci++) {
                    double *dr = &dx[(size_t)((n * Cin + ci) * Pt)];
                    for (int64_t k = 0; k < Kt; k++) {
                        const double wv = wflip[(size_t)(ci * Kt + k)];
                        const __nv_bfloat16 *cr = &colt[(size_t)((n * Kt + k) * Pt)];
                        for (int64_t p = 0; p < Pt; p++) dr[p] += wv * __bfloat162float(cr[p]);
                    }
                }
            check_rel(NAME("%s: backward-data W'.im2col(dy) = direct transposed conv", pre), dx,
                      rdx, 1e-6);
        }
    }

    /* backward-filter: dW = sum_n dY[n] . col[n]^T */
    std::vector<double> dw(nw, 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < Cout; co++) {
            const float *dr = &dyf[(size_t)((n * Cout + co) * P)];
            for (int64_t k = 0; k < K; k++) {
                const double *cr = &colf[(size_t)((n * K + k) * P)];
                double s = 0.0;
                for (int64_t p = 0; p < P; p++) s += (double)dr[p] * cr[p];
                dw[(size_t)(co * K + k)] += s;
            }
        }
    check_rel(NAME("%s: backward-filter sum dY.col^T = direct filter gradient", pre), dw, rdw,
              1e-6);
}

static const col_case CASES[] = {
    {"3x3 s1 p1", 2, 8, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1},
    {"3x3 s1 p1 6-wide rows", 3, 8, 4, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    {"3x3 s1 p1 1-wide rows", 2, 8, 8, 1, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    {"3x3 s2 p1 even", 2, 16, 16, 16, 8, 3, 3, 2, 2, 1, 1, 1, 1},
    {"3x3 s2 p1 odd 17x31", 1, 8, 17, 31, 16, 3, 3, 2, 2, 1, 1, 1, 1},
    {"3x3 s2 p1 odd 15x9", 3, 8, 15, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1},
    {"3x3 s3 p1", 2, 8, 22, 10, 8, 3, 3, 3, 3, 1, 1, 1, 1},
    {"5x5 s1 p2", 2, 8, 6, 12, 16, 5, 5, 1, 1, 2, 2, 1, 1},
    {"5x5 s2 p2 odd", 1, 8, 15, 15, 8, 5, 5, 2, 2, 2, 2, 1, 1},
    {"3x3 d2 p2", 2, 8, 9, 8, 8, 3, 3, 1, 1, 2, 2, 2, 2},
    {"3x3 s2 d2 p2 odd", 1, 8, 13, 15, 16, 3, 3, 2, 2, 2, 2, 2, 2},
    {"1x1 s2 p0", 2, 16, 16, 16, 8, 1, 1, 2, 2, 0, 0, 1, 1},
    {"1x1 s2 p0 odd", 1, 8, 15, 9, 8, 1, 1, 2, 2, 0, 0, 1, 1},
    {"3x1 p1,0", 2, 8, 8, 8, 8, 3, 1, 1, 1, 1, 0, 1, 1},
    {"1x3 s2,1 p0,1", 1, 8, 16, 8, 8, 1, 3, 2, 1, 0, 1, 1, 1},
    {"2x2 s2 p0", 2, 2, 16, 16, 8, 2, 2, 2, 2, 0, 0, 1, 1},
    {"2x2 s2 p0 odd", 3, 4, 17, 9, 8, 2, 2, 2, 2, 0, 0, 1, 1},
    {"3x5 s2,1 p1,2 d1,2", 1, 8, 15, 9, 8, 3, 5, 2, 1, 1, 2, 1, 2},
    {"3x3 p3 (padding rows)", 1, 8, 4, 2, 8, 3, 3, 1, 1, 3, 3, 1, 1},
};

/* ------------------------------------------------------------ contract */

static void test_eligible(void) {
    static const struct {
        const char *tag;
        int64_t N, Cin, H, W, Cout;
        int s;
    } yes[] = {
        {"64>64 80x80 (C3k2 bottleneck)", 4, 64, 80, 80, 64, 1},
        {"64>128 s2 80x80", 4, 64, 80, 80, 128, 2},
        {"32>64 s2 160x160", 4, 32, 160, 160, 64, 2},
        {"16>32 s2 320x320", 4, 16, 320, 320, 32, 2},
        {"32>32 160x160", 4, 32, 160, 160, 32, 1},
        {"128>128 40x40", 4, 128, 40, 40, 128, 1},
        {"128>256 s2 40x40", 4, 128, 40, 40, 256, 2},
        {"256>256 20x20", 4, 256, 20, 20, 256, 1},
        {"64>64 20x20 (head)", 4, 64, 20, 20, 64, 1},
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        for (int d = 0; d < 2; d++) {
            lucid_dtype dt = d ? LUCID_F16 : LUCID_BF16;
            lucid_conv_col_geom g = sq(yes[i].N, yes[i].Cin, yes[i].H, yes[i].W, yes[i].Cout, 3,
                                       yes[i].s, 1, 1);
            for (int ps = 0; ps < 3; ps++) {
                const int want = ps != 1 || yes[i].s == 1;
                ok(lucid_conv_col_eligible(&g, dt, ps) == want,
                   NAME("conv_col eligible: %s N4 %s pass %d: %s", yes[i].tag,
                        lucid_dtype_name(dt), ps, want ? "yes" : "no (stride 2)"),
                   want ? "refused" : "accepted");
            }
        }
    /* N*K*P = 2^26 exactly (1x1 and 2x2 s2, K = 8, P = 2^20, N = 8) */
    lucid_conv_col_geom e1 = sq(8, 8, 1024, 1024, 8, 1, 1, 0, 1);
    lucid_conv_col_geom e2 = sq(8, 2, 2048, 2048, 8, 2, 2, 0, 1);
    ok(lucid_conv_col_eligible(&e1, LUCID_BF16, 0) == 1,
       "conv_col eligible: N*K*P = LUCID_CONV_COL_MAX_ELEMS (1x1)", "refused");
    ok(lucid_conv_col_eligible(&e2, LUCID_F16, 2) == 1,
       "conv_col eligible: N*K*P = LUCID_CONV_COL_MAX_ELEMS (2x2 s2)", "refused");

    lucid_conv_col_geom base = sq(4, 64, 80, 80, 64, 3, 1, 1, 1), g;
    ok(lucid_conv_col_eligible(&base, LUCID_BF16, 1) == 1, "conv_col eligible: 3x3 s1 p1 backward-data",
       "refused");
    ok(!lucid_conv_col_eligible(&base, LUCID_F32, 0), "conv_col refused: f32", "accepted");
    ok(!lucid_conv_col_eligible(&base, LUCID_F64, 0), "conv_col refused: f64", "accepted");
    ok(!lucid_conv_col_eligible(NULL, LUCID_BF16, 0), "conv_col refused: NULL", "accepted");
    ok(!lucid_conv_col_eligible(&base, LUCID_BF16, 3) && !lucid_conv_col_eligible(&base, LUCID_BF16, -1),
       "conv_col refused: pass 3 and -1", "accepted");
    {
        lucid_conv_col_geom p3 = sq(1, 8, 16, 16, 8, 3, 1, 3, 1); /* padding 3 > (k-1)*d */
        ok(lucid_conv_col_eligible(&p3, LUCID_BF16, 0) == 1 &&
               !lucid_conv_col_eligible(&p3, LUCID_BF16, 1),
           "conv_col: 3x3 padding 3 forward yes, backward-data no (padding beyond (k-1)*d)",
           "wrong answer");
    }
#define REFUSE(tag, expr)                                                     \
    do {                                                                      \
        g = base;                                                             \
        expr;                                                                 \
        ok(!lucid_conv_col_eligible(&g, LUCID_BF16, 0), "conv_col refused: " tag, "accepted"); \
    } while (0)
    REFUSE("P % 8 (s2 17x33 -> 9x17)", (g = sq(4, 64, 17, 33, 64, 3, 2, 1, 1)));
    REFUSE("P % 8 (7x7)", (g = sq(1, 64, 7, 7, 64, 3, 1, 1, 1)));
    REFUSE("K % 8 (layer 0 3>16 s2 640)", (g = sq(4, 3, 640, 640, 16, 3, 2, 1, 1)));
    REFUSE("K % 8 (Cin 5 1x1 s2)", (g = sq(1, 5, 16, 16, 8, 1, 2, 0, 1)));
    REFUSE("Cout % 8 (Cout 12)", (g.Cout = 12));
    REFUSE("Cout % 8 (Cout 51)", (g.Cout = 51));
    REFUSE("Ho inconsistent", (g.Ho = 79));
    REFUSE("Wo inconsistent", (g.Wo = 81));
    REFUSE("no output (5x5 p0 on 2x2)", (g = sq(1, 8, 2, 2, 8, 5, 1, 0, 1)));
    REFUSE("N*K*P over the limit (N 32 64>64 80x80)", (g.N = 32));
    REFUSE("N*K*P over the limit by one image (1x1)", (g = e1, g.N = 9));
    REFUSE("N*K*P over the limit by one image (2x2 s2)", (g = e2, g.N = 9));
    REFUSE("N*Cout*K over the limit (the filter gradient's f32 partials: 256x 512>512 3x3 on 4x4)",
           (g = sq(256, 512, 4, 4, 512, 3, 1, 1, 1)));
    REFUSE("N 0", (g.N = 0));
    REFUSE("Cin 0", (g.Cin = 0));
    REFUSE("H 0", (g.H = 0));
    REFUSE("Cout 0", (g.Cout = 0));
    REFUSE("kernel 0", (g.kh = 0));
    REFUSE("stride 0", (g.sw = 0));
    REFUSE("dilation 0", (g.dh = 0));
    REFUSE("padding -1", (g.pw = -1));
    REFUSE("x over 2^31 elements", (g = sq(1, 8, 32768, 32768, 8, 1, 4096, 0, 1)));
    REFUSE("y over 2^31 elements", (g = sq(1, 8, 64, 64, (int64_t)1 << 20, 1, 1, 0, 1)));
    REFUSE("weight over 2^31 elements", (g = sq(1, 256, 1, 8, (int64_t)1 << 24, 1, 1, 0, 1)));
#undef REFUSE
}

static void test_scratch(void) {
    static const struct {
        const char *tag;
        lucid_conv_col_geom g;
    } cs[] = {
        {"64>64 80x80 N4", sq(4, 64, 80, 80, 64, 3, 1, 1, 1)},
        {"64>128 s2 80x80 N1", sq(1, 64, 80, 80, 128, 3, 2, 1, 1)},
        {"8>8 8x1 N1 (unaligned regions)", sq(1, 8, 8, 1, 8, 3, 1, 1, 1)},
        {"4>8 2x2 s2 17x9 N3 (unaligned regions)", sq(3, 4, 17, 9, 8, 2, 2, 0, 1)},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int d = 0; d < 2; d++) {
            lucid_dtype dt = d ? LUCID_F16 : LUCID_BF16;
            const lucid_conv_col_geom &g = cs[i].g;
            const int64_t K = g.Cin * g.kh * g.kw, P = g.Ho * g.Wo;
            const size_t col2 = nn_align((size_t)(g.N * K * P) * 2);
            const size_t wc = nn_align((size_t)(g.Cout * K) * 2);
            const size_t prod = nn_align((size_t)(g.N * g.Cout * P) * 4);
            const size_t part = g.N > 1 ? nn_align((size_t)(g.N * g.Cout * K) * 4) : 0;
            const bool dgrad = conv_col_dgrad_takes(g.sh, g.sw, g.kh, g.kw, g.ph, g.pw, g.dh, g.dw);
            const size_t colt =
                nn_align((size_t)(g.N * g.Cout * g.kh * g.kw * g.H * g.W) * 2) + wc;
            const size_t want[3][2] = {{col2 + wc, col2 + wc + prod},
                                       {dgrad ? colt : 0, dgrad ? colt : 0},
                                       {col2 + part, col2 + part}};
            static const char *pass[3] = {"forward", "backward-data", "backward-filter"};
            for (int ps = 0; ps < 3; ps++)
                for (int b = 0; b < 2; b++) {
                    size_t got = lucid_conv_col_scratch(&g, dt, ps, b);
                    ok(got == want[ps][b] && got % 256 == 0 && (ps != 1 || got > 0 || !dgrad),
                       NAME("conv_col scratch: %s %s %s%s", cs[i].tag, lucid_dtype_name(dt),
                            pass[ps], b ? " bias" : ""),
                       WHY("%zu bytes, expected %zu", got, want[ps][b]));
                }
        }
}

static void test_switch(void) {
    const char *v = NULL;
    int sw = lucid_conv_col_switch(&v);
    const char *env = getenv("LUCID_CONV_COL");
    const int want = conv_col_env_mask(env);
    ok(sw == want && v && strcmp(v, env ? env : "") == 0,
       "conv_col switch follows LUCID_CONV_COL",
       WHY("switch %d value \"%s\", environment \"%s\"", sw, v ? v : "(null)", env ? env : ""));
    ok(lucid_conv_col_switch(NULL) == sw, "conv_col switch: value pointer optional",
       "another answer");
}

static void test_entry_refusals(void) {
    lucid_conv_col_geom bad = sq(1, 64, 16, 16, 12, 3, 1, 1, 1); /* Cout 12 */
    lucid_conv_col_geom good = sq(1, 64, 16, 16, 64, 3, 1, 1, 1);
    const unsigned long l0 = lucid_cuda_conv_col_launch_count();
    const int c0 = g_gemm_calls;
    lucid_status st;
    g_msg[0] = 0;
    st = lucid_conv_col_forward(NULL, NULL, NULL, LUCID_BF16, &bad, NULL, NULL, NULL, NULL, NULL,
                                NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
       "conv_col forward: ineligible geometry is ERR_UNSUPPORTED with a message",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    g_msg[0] = 0;
    st = lucid_conv_col_backward_data(NULL, NULL, NULL, LUCID_F32, &good, NULL, NULL, NULL,
                                      0.0f, NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "f32"),
       "conv_col backward_data: f32 is ERR_UNSUPPORTED naming the dtype",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    g_msg[0] = 0;
    {
        lucid_conv_col_geom s2 = sq(1, 64, 16, 16, 64, 3, 2, 1, 1);
        st = lucid_conv_col_backward_data(NULL, NULL, NULL, LUCID_BF16, &s2, NULL, NULL, NULL,
                                          0.0f, NULL);
        ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
           "conv_col backward_data: stride 2 is ERR_UNSUPPORTED with a message",
           WHY("status %d, message \"%s\"", (int)st, g_msg));
    }
    g_msg[0] = 0;
    st = lucid_conv_col_backward_filter(NULL, NULL, NULL, LUCID_F16, &bad, NULL, NULL, NULL, 1.0f,
                                        NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
       "conv_col backward_filter: ineligible geometry is ERR_UNSUPPORTED",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    st = lucid_conv_col_forward(NULL, NULL, NULL, LUCID_BF16, NULL, NULL, NULL, NULL, NULL, NULL,
                                NULL);
    ok(st == LUCID_ERR_ARG, "conv_col forward: NULL geometry is ERR_ARG",
       WHY("status %d", (int)st));
    ok(lucid_cuda_conv_col_launch_count() == l0 && g_gemm_calls == c0,
       "conv_col entry points: refusals launch nothing and call no GEMM",
       WHY("%lu launches, %d GEMM calls", lucid_cuda_conv_col_launch_count() - l0,
           g_gemm_calls - c0));
}

int main() {
    test_eligible();
    test_scratch();
    test_switch();
    test_entry_refusals();
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(CASES[i]);
    return failures != 0;
}
