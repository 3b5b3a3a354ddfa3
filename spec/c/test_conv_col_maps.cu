/*
 * test_conv_col_maps.cu — host emulation of the im2col + cuBLAS conv route
 * (cuda/nn_conv_col.cu): the kernel's own per-thread work, col_im2col_row8
 * (im2col: 8 columns of one column-matrix row per thread item, in the
 * stride variant the launcher picks), run on the CPU for every thread item
 * of a grid, with a float64 GEMM in place of cuBLAS, against a float64
 * direct convolution.  Needs nvcc, not a GPU (runs in
 * make test).
 *
 * K = Cin*kh*kw is rounded up inside the route to Kr, a multiple of 8
 * (DECISIONS 32): the column matrix has Kr rows per image (rows K .. Kr-1
 * +0), the forward's weight is [Cout][Kr] (col_wpad, per call, when K % 8
 * != 0), the backward-data's flipped weight [Cin][Kr'] (col_wflip, Kr' =
 * Cout*kh*kw rounded up), the filter gradient's products [Cout][Kr] of
 * which the fold keeps the first K columns.  col_wpad, col_wflip and the
 * fold (nn_conv_gemm.cu's gemm_wgrad_fold) are __global__ kernels, so
 * their per-thread bodies are emulated here line for line (wpad_emulated,
 * wflip_emulated, fold_emulated: the kernels' index maps, not the
 * definitions), and what they write is checked against the definitions.
 *
 * Per geometry (3x3 stride 1 pad 1, also with 6- and 1-wide rows so that an
 * 8-column vector spans several output rows; 3x3 stride 2 pad 1 with even
 * and odd H/W; stride 3; 5x5 pad 2 at stride 1 and 2; 3x3 dilation 2 pad 2
 * at stride 1 and 2; 1x1 stride 2 pad 0, even and odd; 3x1 and 1x3 kernels;
 * 2x2 stride 2 pad 0, even and odd; an asymmetric 3x5 kernel with mixed
 * stride, padding and dilation; padding 3 on a 3x3 kernel, whole rows and
 * columns of padding; batch 1, 2 and 3; all with K, Cout and P = Ho*Wo
 * multiples of 8; then K or Cout not a multiple of 8: Cin 51 3x3 (K 459 ->
 * 464, the pose head's 51>51), 64>51 (Cout 51: the backward-data's K' 459
 * -> 464), Cin 3 3x3 stride 2 (K 27 -> 32, layer 0), Cin 5 1x1 stride 2
 * (K 5 -> 8), Cin 3 > Cout 12 (K 27, K' 108 -> 112), Cin 7 with the 3x5
 * kernel (K 105 -> 112), Cin 2 5x5 (K 50 -> 56); and filter gradients
 * whose P splits (nn_conv_gemm.cu's S chunks per image, L 1600 unless
 * LUCID_WGRAD_SPLIT says otherwise): 8>8 and Cin 3 (K 27) 3x3 at 64x64
 * (S 2, N 1 and 3) and Cin 3 at 160x160 (S 16); lucid_conv_col_eligible
 * checked), with x, dy and the weight rounded to bf16 (the weight: the
 * route's weight cast):
 *   - im2col coverage: item i returns offset 8*i and the N*Kr*P/8 items
 *     write every column element exactly once, nothing outside;
 *   - im2col = the header's definition of col[n][k][p] for k < K, bitwise,
 *     in bf16 and f16 (the copy is exact; the padding is +0), and +0
 *     (bits 0x0000) in every element of the rows K .. Kr-1;
 *   - the forward's weight: [Cout][Kr], by col_wpad's index map when Kr >
 *     K (else the cast [Cout][K]): w[co][k] rounded for k < K, +0 beyond,
 *     bitwise; forward: Y[n] = Wp . col[n] over the Kr rows (f64) = the
 *     direct convolution (f64): relative Frobenius error <= 1e-6 (the same
 *     products in another order: ~1e-16; a wrong index gives O(1));
 *   - backward-data (stride-1 geometries, the only ones the route takes
 *     for this pass; the others are checked to be refused): the route's
 *     own transposed geometry (col_dgrad_geom) and the flipped, transposed
 *     weight by col_wflip's index map, [Cin][Kr'] = w[co][ci][kh-1-r][kw-1-q]
 *     at (co*kh + r)*kw + q, +0 beyond Cout*kh*kw, bitwise; im2col(dy) by
 *     the kernel's items (its padding rows +0 too), then dX[n] = Wf .
 *     col'[n] (f64) = the direct transposed convolution (f64, scattered
 *     from the forward's index map): relative Frobenius error <= 1e-6;
 *   - backward-filter: the GEMM route's view {N, Kr, Cout, P}, S chunks
 *     per image, the N*S products [Cout][Kr] (f64, partial n*S + s over
 *     the columns [s*P/S, (s+1)*P/S)) folded by gemm_wgrad_fold's index
 *     map into dw [Cout][K] = the direct filter gradient (f64): relative
 *     Frobenius error <= 1e-6.
 * Host checks of the contract:
 *   - lucid_conv_col_eligible accepts the YOLO11n-pose 3x3 convs at batch 4
 *     in bf16 and f16 (64>64 80x80, 64>128 s2 80x80, 32>64 s2 160x160, ...,
 *     the pose head's 64>51 and 51>51 at 80x80, 40x40 and 20x20, layer 0
 *     3>16 s2 640x640) for the forward and backward-filter, for the
 *     backward-data only those of stride 1 (also refused there: padding
 *     beyond (k-1)*d, H*W not a multiple of 8); K and Cout not multiples of
 *     8 (layer 0, Cin 5 1x1, Cout 12 and 51); the edges N*Kr*P and N*Cout*Kr
 *     = LUCID_CONV_COL_MAX_ELEMS with K padded (refused one image or one
 *     channel beyond: the limits count the padded rows); refuses a pass
 *     other than 0, 1, 2, f32, f64, NULL, P not a multiple of 8, an
 *     inconsistent Ho / Wo, an empty output, N*K*P above the limit (by one
 *     image), zero sizes, stride or dilation 0, negative padding, x / y /
 *     the weight over 2^31 elements;
 *   - lucid_conv_col_scratch = the regions the header lists (256-byte
 *     aligned): forward col (N*Kr*P) + the weight (Cout*Kr) [+ f32 product
 *     with a bias], backward-data the columns of dy (N*Kr'*H*W) + the
 *     flipped weight (Cin*Kr'; 0 when the pass is not eligible),
 *     backward-filter col + the f32 partials N*S*Cout*Kr when N*S > 1 or K
 *     < Kr (else none), in bf16 and f16, for unpadded, padded and
 *     splitting geometries; the bias flag changes only the forward;
 *   - lucid_conv_col_switch follows LUCID_CONV_COL (unset, "" or "1": 7;
 *     "0": 0; a set of the letters f, d, w: their mask; else -1) and
 *     returns the value read; lucid_conv_col_pad_switch follows
 *     LUCID_CONV_COL_PAD (0 only for "0");
 *   - LUCID_CONV_COL_PAD, read once per process, in child processes (fork
 *     before this process reads it): "0" refuses every pass of K % 8 != 0
 *     (layer 0, Cin 5, 51>51) and the backward-data of K' % 8 != 0 (16>51,
 *     64>51) while Cout 51 and 12 with K % 8 == 0 stay eligible, and the
 *     entry points refuse such a geometry (ERR_UNSUPPORTED) before any
 *     launch or GEMM call; "1" pads;
 *   - the entry points refuse an ineligible geometry (ERR_UNSUPPORTED,
 *     message "not eligible") or a NULL one (ERR_ARG) before any launch or
 *     GEMM call.
 * The filter-gradient split itself (the engine's lucid_conv_gemm_wgrad_splits,
 * LUCID_WGRAD_SPLIT, the GEMM plan) is checked by test_conv_gemm_split.cu.
 */
#include "nn_conv_col.cu"
#include "nn_dcols.cuh"

#include "conv_col_env.h"
#include "conv_wgrad_split.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

/* Not linked into this host-only program (nothing is launched; the error
 * paths only format a message): cuda/backend.cu, engine/core and
 * cuda/nn_conv_gemm.cu and cuBLAS.  The GEMM entry points (and
 * cublasGemmStridedBatchedEx, which the backward-data calls itself) count
 * their calls (none may happen here); lucid_conv_gemm_scratch and
 * lucid_conv_gemm_wgrad_scratch are the size contract of nn_conv_gemm.cuh:
 * the weight in dt (forward, backward-data), the f32 product with a bias
 * (forward), the N*S f32 partials when N*S > 1 or only Kout < Cin columns
 * are kept (backward-filter), each 256-byte aligned, with S from the split
 * rule of spec/c/conv_wgrad_split.h (test_conv_gemm_split.cu checks the
 * engine's rule against the same). */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
#include "host_standins.h" /* lucid_seterr (message in g_msg), lucid_dtype_name, error hooks */
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
lucid_status lucid_conv_gemm_backward_filter_rows(lucid_ctx *, cublasHandle_t, cudaStream_t,
                                                  lucid_dtype, const lucid_conv_gemm_geom *,
                                                  int64_t, const void *, const void *, float *,
                                                  float, void *) {
    g_gemm_calls++;
    return LUCID_ERR_DEVICE;
}
/* the split rule of nn_conv_gemm.cu, L from this process's LUCID_WGRAD_SPLIT */
static int64_t stub_wgrad_splits(const lucid_conv_gemm_geom *g) {
    return conv_wgrad_splits(g->N, g->Cout, g->Cin, g->HW,
                             conv_wgrad_env_chunk(getenv("LUCID_WGRAD_SPLIT")));
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

#define TAP_HOST_SEED 0x7f4a7c159e3779b9ull
#include "tap_host.h"

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

/* K rounded up to a multiple of 8 (the route's Kr, from the contract) */
static int64_t round8(int64_t k) { return (k + 7) / 8 * 8; }

/* 1 when this process's LUCID_CONV_COL_PAD lets K % 8 != 0 take the route
 * (the contract: anything but "0") */
static bool pad_on(void) {
    const char *e = getenv("LUCID_CONV_COL_PAD");
    return !(e && strcmp(e, "0") == 0);
}

/* 1 when a K (Cin*kh*kw, or the backward-data's Cout*kh*kw) may take the
 * route in this process */
static bool k_ok(int64_t K) { return K % 8 == 0 || pad_on(); }

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

/* ------------------------------------------------------------ the kernels' index maps
 * (__global__ functions: their per-thread bodies, line for line, run here
 * for every i of the grid-stride loop; lucid_elem<T>::store(p, i, v) is
 * p[i] = T(v) rounded to nearest) */

/* col_wpad (nn_conv_col.cu), n = Cout*Kr: wp[co][k] = T(w[co][k]) for
 * k < K, +0 for K <= k < Kr */
template <typename T>
static void wpad_emulated(const float *w, T *wp, int K, int Kr, int n) {
    for (int64_t i = 0; i < n; i++) {
        const int co = (int)(i / Kr), k = (int)(i - (int64_t)co * Kr);
        wp[i] = from_float<T>(k < K ? w[(size_t)co * K + k] : 0.0f);
    }
}

/* col_wflip (nn_conv_col.cu), n = Cin*Kr:
 * wf[ci][(co*kh + r)*kw + q] = T(w[co][ci][kh-1-r][kw-1-q]), +0 beyond
 * Cout*kh*kw */
template <typename T>
static void wflip_emulated(const float *w, T *wf, int Cin, int Cout, int kh, int kw, int Kr,
                           int n) {
    const int KK = kh * kw;
    for (int64_t i = 0; i < n; i++) {
        const int ci = (int)(i / Kr), k = (int)(i - (int64_t)ci * Kr);
        if (k >= Cout * KK) {
            wf[i] = from_float<T>(0.0f);
            continue;
        }
        const int co = k / KK, rq = k - co * KK, r = rq / kw, q = rq - r * kw;
        wf[i] = from_float<T>(
            w[((size_t)co * Cin + ci) * KK + (kh - 1 - r) * kw + (kw - 1 - q)]);
    }
}

/* gemm_wgrad_fold (nn_conv_gemm.cu): dw[o][k] = beta*dw[o][k] + ((part[0] +
 * part[1]) + ...) at [o][k] of each [Cout, Kp] partial, k < Kout; in f64
 * here, over the f64 products of this test */
static void fold_emulated(const double *part, double *dw, int64_t Cout, int64_t Kout,
                          int64_t Kp, int64_t parts, double beta) {
    const int64_t n = Cout * Kout, np = Cout * Kp;
    for (int64_t i = 0; i < n; i++) {
        const int64_t o = i / Kout, src = i + o * (Kp - Kout);
        double s = part[src];
        for (int64_t k = 1; k < parts; k++) s += part[k * np + src];
        dw[i] = beta != 0.0 ? fma(beta, dw[i], s) : s;
    }
}

/* ------------------------------------------------------------ one geometry */

/* im2col by the kernel's per-thread function for T: every item's 8 values
 * stored at its offset; coverage, the definition (rows k < K) and the
 * padding rows (K <= k < Kr: +0) checked. */
template <typename T>
static void im2col_check(const char *pre, const char *tname, const lucid_conv_col_geom &g,
                         const ColArgs &a, const std::vector<float> &xf, std::vector<T> &col) {
    const int64_t N = g.N, K = a.K, Kr = a.Kr, P = a.P, total = N * Kr * P,
                  items = N * Kr * (P / 8);
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
           NAME("%s: im2col items write every column element once (%lld rows per image)", pre,
                (long long)Kr),
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
                            int64_t e = (n * Kr + k) * P + p;
                            if (bits16(col[(size_t)e]) != want) {
                                if (first < 0) first = e;
                                nbad++;
                            }
                        }
    ok(nbad == 0, NAME("%s: im2col = definition %s (bitwise)", pre, tname),
       WHY("%lld of %lld elements differ (first at %lld)", (long long)nbad,
           (long long)(N * K * P), (long long)first));
    if (Kr == K) return;
    /* the rows that round K up to Kr: +0 (bits 0), whatever x holds */
    int64_t pbad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = K; k < Kr; k++)
            for (int64_t p = 0; p < P; p++) pbad += bits16(col[(size_t)((n * Kr + k) * P + p)]) != 0;
    ok(pbad == 0,
       NAME("%s: im2col padding rows %lld..%lld = +0 %s (bitwise)", pre, (long long)K,
            (long long)(Kr - 1), tname),
       WHY("%lld of %lld elements not +0", (long long)pbad, (long long)(N * (Kr - K) * P)));
}

static void run_case(const col_case &c) {
    const lucid_conv_col_geom g = geom_of(c);
    char pre[200];
    snprintf(pre, sizeof pre, "col %s N%lld %lld>%lld %lldx%lld k%dx%d s%d,%d p%d,%d d%d,%d",
             c.tag, (long long)c.N, (long long)c.Cin, (long long)c.Cout, (long long)c.H,
             (long long)c.W, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
    const int64_t K0 = c.Cin * c.kh * c.kw;
    const int el = lucid_conv_col_eligible(&g, LUCID_BF16, 0);
    const bool want_el = k_ok(K0);
    ok(el == (int)want_el,
       NAME("%s: %s (K %lld, P %lld)", pre,
            want_el ? "eligible" : "refused (LUCID_CONV_COL_PAD=0 and K % 8 != 0)",
            (long long)K0, (long long)(g.Ho * g.Wo)),
       el ? "accepted" : "refused");
    if (el != 1) return;
    const ColArgs a = col_args(&g);
    const int64_t N = g.N, Cin = g.Cin, H = g.H, W = g.W, Cout = g.Cout, Ho = g.Ho, Wo = g.Wo;
    const int64_t K = a.K, Kr = a.Kr, P = a.P, kh = g.kh, kw = g.kw;
    ok(K == K0 && Kr == round8(K0),
       NAME("%s: %lld column rows per image (K %lld rounded up to 8)", pre, (long long)round8(K0),
            (long long)K0),
       WHY("K %lld, Kr %lld", (long long)K, (long long)Kr));
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

    /* the forward's weight as its GEMM reads it, [Cout][Kr]: col_wpad's map
     * when K is padded, else the weight cast (shadow or per-call cast) */
    std::vector<__nv_bfloat16> wg((size_t)(Cout * Kr), from_float<__nv_bfloat16>(NAN));
    if (Kr != K) {
        wpad_emulated(wf.data(), wg.data(), (int)K, (int)Kr, (int)(Cout * Kr));
        int64_t nbad = 0;
        for (int64_t co = 0; co < Cout; co++)
            for (int64_t k = 0; k < Kr; k++) {
                const unsigned short want =
                    k < K ? bits16(from_float<__nv_bfloat16>(wf[(size_t)(co * K + k)])) : 0;
                nbad += bits16(wg[(size_t)(co * Kr + k)]) != want;
            }
        ok(nbad == 0,
           NAME("%s: col_wpad's map: weight [%lld][%lld] = w rounded, columns %lld..%lld +0 "
                "(bitwise)",
                pre, (long long)Cout, (long long)Kr, (long long)K, (long long)(Kr - 1)),
           WHY("%lld of %lld elements differ", (long long)nbad, (long long)(Cout * Kr)));
    } else {
        for (size_t i = 0; i < nw; i++) wg[i] = from_float<__nv_bfloat16>(wf[i]);
    }

    /* forward: Y[n] = Wp . col[n] over the Kr rows */
    std::vector<double> y(ny, 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t co = 0; co < Cout; co++) {
            double *yr = &y[(size_t)((n * Cout + co) * P)];
            for (int64_t k = 0; k < Kr; k++) {
                const double wv = __bfloat162float(wg[(size_t)(co * Kr + k)]);
                const double *cr = &colf[(size_t)((n * Kr + k) * P)];
                for (int64_t p = 0; p < P; p++) yr[p] += wv * cr[p];
            }
        }
    check_rel(NAME("%s: forward W.col (%lld rows) = direct conv", pre, (long long)Kr), y, ry,
              1e-6);

    /* backward-data: stride 1 only, as the forward of dy with the flipped,
     * transposed weight (the route's own geometry), im2col by the kernel's items */
    lucid_conv_col_geom t;
    const int eld = lucid_conv_col_eligible(&g, LUCID_BF16, 1);
    const bool want_d = conv_col_dgrad_takes(g.sh, g.sw, g.kh, g.kw, g.ph, g.pw, g.dh, g.dw) &&
                        k_ok(Cout * kh * kw) && (H * W) % 8 == 0;
    if (!want_d) {
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
            const int64_t Kt = at.K, Ktr = at.Kr, Pt = at.P; /* Cout*kh*kw, rounded, H*W */
            ok(Kt == Cout * kh * kw && Ktr == round8(Kt),
               NAME("%s: backward-data columns of %lld rows (Cout*kh*kw %lld rounded up)", pre,
                    (long long)round8(Cout * kh * kw), (long long)(Cout * kh * kw)),
               WHY("K' %lld, Kr' %lld", (long long)Kt, (long long)Ktr));
            std::vector<__nv_bfloat16> wfl((size_t)(Cin * Ktr), from_float<__nv_bfloat16>(NAN));
            wflip_emulated(wf.data(), wfl.data(), (int)Cin, (int)Cout, (int)kh, (int)kw,
                           (int)Ktr, (int)(Cin * Ktr));
            int64_t nbad = 0;
            for (int64_t ci = 0; ci < Cin; ci++)
                for (int64_t k = 0; k < Ktr; k++) {
                    unsigned short want = 0;
                    if (k < Kt) { /* k = (co*kh + r)*kw + q */
                        const int64_t co = k / (kh * kw), r = k / kw % kh, q = k % kw;
                        want = bits16(from_float<__nv_bfloat16>(
                            wf[(size_t)(((co * Cin + ci) * kh + (kh - 1 - r)) * kw +
                                        (kw - 1 - q))]));
                    }
                    nbad += bits16(wfl[(size_t)(ci * Ktr + k)]) != want;
                }
            ok(nbad == 0,
               NAME("%s: col_wflip's map: [%lld][%lld] = w[co][ci][kh-1-r][kw-1-q] rounded, "
                    "+0 beyond %lld (bitwise)",
                    pre, (long long)Cin, (long long)Ktr, (long long)Kt),
               WHY("%lld of %lld elements differ", (long long)nbad, (long long)(Cin * Ktr)));
            std::vector<double> dx(nx, 0.0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t ci = 0; ci < Cin; ci++) {
                    double *dr = &dx[(size_t)((n * Cin + ci) * Pt)];
                    for (int64_t k = 0; k < Ktr; k++) {
                        const double wv = __bfloat162float(wfl[(size_t)(ci * Ktr + k)]);
                        const __nv_bfloat16 *cr = &colt[(size_t)((n * Ktr + k) * Pt)];
                        for (int64_t p = 0; p < Pt; p++) dr[p] += wv * __bfloat162float(cr[p]);
                    }
                }
            check_rel(NAME("%s: backward-data W'.im2col(dy) = direct transposed conv", pre), dx,
                      rdx, 1e-6);
        }
    }

    /* backward-filter: the GEMM route's view {N, Kr, Cout, P}; the N*S
     * products [Cout][Kr] (partial n*S + s over the columns [s*P/S,
     * (s+1)*P/S)), folded into [Cout][K] (N*S == 1 with K == Kr is one GEMM
     * straight into dw there: the fold of one partial is the same) */
    const lucid_conv_gemm_geom gg = {N, Kr, Cout, P};
    const int64_t S = stub_wgrad_splits(&gg), Pc = P / S, parts = N * S;
    std::vector<double> part((size_t)(parts * Cout * Kr), NAN);
    for (int64_t n = 0; n < N; n++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t co = 0; co < Cout; co++) {
                const float *dr = &dyf[(size_t)((n * Cout + co) * P + s * Pc)];
                for (int64_t k = 0; k < Kr; k++) {
                    const double *cr = &colf[(size_t)((n * Kr + k) * P + s * Pc)];
                    double sum = 0.0;
                    for (int64_t p = 0; p < Pc; p++) sum += (double)dr[p] * cr[p];
                    part[(size_t)(((n * S + s) * Cout + co) * Kr + k)] = sum;
                }
            }
    std::vector<double> dw(nw, NAN);
    fold_emulated(part.data(), dw.data(), Cout, K, Kr, parts, 0.0);
    check_rel(NAME("%s: backward-filter S %lld, %lld products [%lld][%lld] folded to [%lld][%lld] "
                   "= direct filter gradient",
                   pre, (long long)S, (long long)parts, (long long)Cout, (long long)Kr,
                   (long long)Cout, (long long)K),
              dw, rdw, 1e-6);
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
    /* K or Cout not a multiple of 8: K padded to Kr (DECISIONS 32) */
    {"K 459 -> 464 (pose head 51>51)", 2, 51, 8, 10, 51, 3, 3, 1, 1, 1, 1, 1, 1},
    {"Cout 51 (backward-data K' 459 -> 464)", 1, 64, 4, 6, 51, 3, 3, 1, 1, 1, 1, 1, 1},
    {"K 27 -> 32 s2 (layer 0)", 2, 3, 16, 16, 16, 3, 3, 2, 2, 1, 1, 1, 1},
    {"K 5 -> 8 1x1 s2", 1, 5, 16, 16, 8, 1, 1, 2, 2, 0, 0, 1, 1},
    {"K 27 -> 32, Cout 12 (K' 108 -> 112)", 2, 3, 8, 8, 12, 3, 3, 1, 1, 1, 1, 1, 1},
    {"K 105 -> 112 3x5 s2,1 p1,2 d1,2", 1, 7, 15, 9, 8, 3, 5, 2, 1, 1, 2, 1, 2},
    {"K 50 -> 56 5x5 p2", 2, 2, 6, 12, 8, 5, 5, 1, 1, 2, 2, 1, 1},
    /* filter gradients whose P splits (L 1600: S 2 at 64x64, 16 at 160x160) */
    {"64x64 (split)", 1, 8, 64, 64, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    {"K 27 64x64 (split, S < N)", 3, 3, 64, 64, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    {"K 27 160x160 (split 16)", 1, 3, 160, 160, 8, 3, 3, 1, 1, 1, 1, 1, 1},
};

/* ------------------------------------------------------------ contract */

/* the passes this process's route should take of g (K and the
 * backward-data's K' padded unless LUCID_CONV_COL_PAD=0), for geometries
 * within every size limit and with P % 8 == 0 */
static void want_passes(const lucid_conv_col_geom &g, int want[3]) {
    const bool f = k_ok(g.Cin * g.kh * g.kw);
    want[0] = want[2] = f;
    want[1] = f && conv_col_dgrad_takes(g.sh, g.sw, g.kh, g.kw, g.ph, g.pw, g.dh, g.dw) &&
              k_ok(g.Cout * g.kh * g.kw) && (g.H * g.W) % 8 == 0;
}

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
        /* K or Cout not a multiple of 8 (DECISIONS 32) */
        {"64>51 80x80 (pose head, Cout 51)", 4, 64, 80, 80, 51, 1},
        {"51>51 80x80 (pose head, K 459)", 4, 51, 80, 80, 51, 1},
        {"64>51 40x40 (pose head)", 4, 64, 40, 40, 51, 1},
        {"51>51 40x40 (pose head)", 4, 51, 40, 40, 51, 1},
        {"64>51 20x20 (pose head)", 4, 64, 20, 20, 51, 1},
        {"51>51 20x20 (pose head)", 4, 51, 20, 20, 51, 1},
        {"3>16 s2 640x640 (layer 0, K 27)", 4, 3, 640, 640, 16, 2},
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        for (int d = 0; d < 2; d++) {
            lucid_dtype dt = d ? LUCID_F16 : LUCID_BF16;
            lucid_conv_col_geom g = sq(yes[i].N, yes[i].Cin, yes[i].H, yes[i].W, yes[i].Cout, 3,
                                       yes[i].s, 1, 1);
            int want[3];
            want_passes(g, want);
            for (int ps = 0; ps < 3; ps++)
                ok(lucid_conv_col_eligible(&g, dt, ps) == want[ps],
                   NAME("conv_col eligible: %s N4 %s pass %d: %s", yes[i].tag,
                        lucid_dtype_name(dt), ps,
                        want[ps] ? "yes"
                        : ps == 1 && yes[i].s != 1 ? "no (stride 2)"
                                                   : "no (LUCID_CONV_COL_PAD=0)"),
                   want[ps] ? "refused" : "accepted");
        }
    /* N*K*P = 2^26 exactly (1x1 and 2x2 s2, K = 8, P = 2^20, N = 8) */
    lucid_conv_col_geom e1 = sq(8, 8, 1024, 1024, 8, 1, 1, 0, 1);
    lucid_conv_col_geom e2 = sq(8, 2, 2048, 2048, 8, 2, 2, 0, 1);
    ok(lucid_conv_col_eligible(&e1, LUCID_BF16, 0) == 1,
       "conv_col eligible: N*K*P = LUCID_CONV_COL_MAX_ELEMS (1x1)", "refused");
    ok(lucid_conv_col_eligible(&e2, LUCID_F16, 2) == 1,
       "conv_col eligible: N*K*P = LUCID_CONV_COL_MAX_ELEMS (2x2 s2)", "refused");
    /* the limits count the padded rows: Cin 5 1x1 (K 5, Kr 8), P 2^20, N 8:
     * N*Kr*P = 2^26 (N*K*P would still allow N 12); Cin 7 1x1 on 8x1 (Kr 8),
     * Cout 2^23: N*Cout*Kr = 2^26 (N*Cout*K would allow Cout 9586980) */
    lucid_conv_col_geom e3 = sq(8, 5, 1024, 1024, 8, 1, 1, 0, 1);
    lucid_conv_col_geom e4 = sq(1, 7, 8, 1, (int64_t)1 << 23, 1, 1, 0, 1);
    ok(lucid_conv_col_eligible(&e3, LUCID_BF16, 0) == (int)k_ok(5),
       NAME("conv_col eligible: N*Kr*P = LUCID_CONV_COL_MAX_ELEMS (Cin 5 1x1, K 5 -> 8): %s",
            k_ok(5) ? "yes" : "no (LUCID_CONV_COL_PAD=0)"),
       "wrong answer");
    ok(lucid_conv_col_eligible(&e4, LUCID_BF16, 2) == (int)k_ok(7),
       NAME("conv_col eligible: N*Cout*Kr = LUCID_CONV_COL_MAX_ELEMS (Cin 7 1x1, Cout 2^23): %s",
            k_ok(7) ? "yes" : "no (LUCID_CONV_COL_PAD=0)"),
       "wrong answer");

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
        lucid_conv_col_geom hw = sq(1, 64, 10, 10, 64, 3, 1, 0, 1); /* 10x10 -> 8x8 */
        ok(lucid_conv_col_eligible(&hw, LUCID_BF16, 0) == 1 &&
               lucid_conv_col_eligible(&hw, LUCID_BF16, 2) == 1 &&
               !lucid_conv_col_eligible(&hw, LUCID_BF16, 1),
           "conv_col: 3x3 p0 10x10 -> 8x8 forward and filter gradient yes, backward-data no "
           "(H*W 100 not a multiple of 8)",
           "wrong answer");
    }
    /* K or Cout not multiples of 8: eligible, K padded (these used to be refused) */
    static const struct {
        const char *tag;
        lucid_conv_col_geom g;
    } pad[] = {
        {"K 27 (layer 0 3>16 s2 640)", sq(4, 3, 640, 640, 16, 3, 2, 1, 1)},
        {"K 5 (Cin 5 1x1 s2)", sq(1, 5, 16, 16, 8, 1, 2, 0, 1)},
        {"Cout 12 (64>12, backward-data K' 108)", sq(4, 64, 80, 80, 12, 3, 1, 1, 1)},
        {"Cout 51 (64>51, backward-data K' 459)", sq(4, 64, 80, 80, 51, 3, 1, 1, 1)},
        {"K 459, Cout 64 (51>64, backward-data K' 576)", sq(2, 51, 16, 16, 64, 3, 1, 1, 1)},
        {"Cout 1 (8>1 3x3)", sq(1, 8, 8, 8, 1, 3, 1, 1, 1)},
    };
    for (size_t i = 0; i < sizeof pad / sizeof pad[0]; i++) {
        int want[3], got[3];
        want_passes(pad[i].g, want);
        for (int ps = 0; ps < 3; ps++) got[ps] = lucid_conv_col_eligible(&pad[i].g, LUCID_BF16, ps);
        ok(got[0] == want[0] && got[1] == want[1] && got[2] == want[2],
           NAME("conv_col eligible: %s: forward %d, backward-data %d, backward-filter %d",
                pad[i].tag, want[0], want[1], want[2]),
           WHY("%d %d %d", got[0], got[1], got[2]));
    }
#define REFUSE(tag, expr)                                                     \
    do {                                                                      \
        g = base;                                                             \
        expr;                                                                 \
        ok(!lucid_conv_col_eligible(&g, LUCID_BF16, 0), "conv_col refused: " tag, "accepted"); \
    } while (0)
    REFUSE("P % 8 (s2 17x33 -> 9x17)", (g = sq(4, 64, 17, 33, 64, 3, 2, 1, 1)));
    REFUSE("P % 8 (7x7)", (g = sq(1, 64, 7, 7, 64, 3, 1, 1, 1)));
    REFUSE("P % 8 with K padded (Cin 3 5x5 -> 5x5)", (g = sq(1, 3, 5, 5, 16, 3, 1, 1, 1)));
    REFUSE("Ho inconsistent", (g.Ho = 79));
    REFUSE("Wo inconsistent", (g.Wo = 81));
    REFUSE("no output (5x5 p0 on 2x2)", (g = sq(1, 8, 2, 2, 8, 5, 1, 0, 1)));
    REFUSE("N*K*P over the limit (N 32 64>64 80x80)", (g.N = 32));
    REFUSE("N*K*P over the limit by one image (1x1)", (g = e1, g.N = 9));
    REFUSE("N*K*P over the limit by one image (2x2 s2)", (g = e2, g.N = 9));
    REFUSE("N*Kr*P over the limit by one image (Cin 5 1x1: K 5 -> 8)", (g = e3, g.N = 9));
    REFUSE("N*Cout*K over the limit (the filter gradient's f32 partials: 256x 512>512 3x3 on 4x4)",
           (g = sq(256, 512, 4, 4, 512, 3, 1, 1, 1)));
    REFUSE("N*Cout*Kr over the limit by one channel (Cin 7 1x1: K 7 -> 8)",
           (g = e4, g.Cout = ((int64_t)1 << 23) + 1));
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
        {"64>64 80x80 N4 (filter gradient split)", sq(4, 64, 80, 80, 64, 3, 1, 1, 1)},
        {"64>128 s2 80x80 N1", sq(1, 64, 80, 80, 128, 3, 2, 1, 1)},
        {"8>8 8x1 N1 (unaligned regions)", sq(1, 8, 8, 1, 8, 3, 1, 1, 1)},
        {"4>8 2x2 s2 17x9 N3 (unaligned regions)", sq(3, 4, 17, 9, 8, 2, 2, 0, 1)},
        {"51>51 20x20 N4 (K 459 -> 464)", sq(4, 51, 20, 20, 51, 3, 1, 1, 1)},
        {"64>51 20x20 N1 (Cout 51, K' 459 -> 464)", sq(1, 64, 20, 20, 51, 3, 1, 1, 1)},
        {"3>16 s2 64x64 N2 (K 27 -> 32)", sq(2, 3, 64, 64, 16, 3, 2, 1, 1)},
        {"5>8 1x1 s2 N1 (K 5 -> 8: partials for N 1)", sq(1, 5, 16, 16, 8, 1, 2, 0, 1)},
        {"16>32 160x160 N1 (filter gradient split)", sq(1, 16, 160, 160, 32, 3, 1, 1, 1)},
        {"3>16 s2 640x640 N4 (layer 0: K 27, split)", sq(4, 3, 640, 640, 16, 3, 2, 1, 1)},
    };
    const int64_t L = conv_wgrad_env_chunk(getenv("LUCID_WGRAD_SPLIT"));
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int d = 0; d < 2; d++) {
            lucid_dtype dt = d ? LUCID_F16 : LUCID_BF16;
            const lucid_conv_col_geom &g = cs[i].g;
            const int64_t K = g.Cin * g.kh * g.kw, Kr = round8(K), P = g.Ho * g.Wo;
            const int64_t Ktr = round8(g.Cout * g.kh * g.kw); /* the backward-data's rows */
            if (!k_ok(K)) { /* LUCID_CONV_COL_PAD=0: not eligible, no contract */
                ok(!lucid_conv_col_eligible(&g, dt, 0),
                   NAME("conv_col scratch: %s %s refused (LUCID_CONV_COL_PAD=0)", cs[i].tag,
                        lucid_dtype_name(dt)),
                   "accepted");
                continue;
            }
            int el[3];
            want_passes(g, el);
            const int64_t S = conv_wgrad_splits(g.N, g.Cout, Kr, P, L);
            const size_t col2 = nn_align((size_t)(g.N * Kr * P) * 2);
            const size_t wc = nn_align((size_t)(g.Cout * Kr) * 2);
            const size_t prod = nn_align((size_t)(g.N * g.Cout * P) * 4);
            const size_t part =
                g.N * S > 1 || K < Kr ? nn_align((size_t)(g.N * S * g.Cout * Kr) * 4) : 0;
            const size_t colt = nn_align((size_t)(g.N * Ktr * g.H * g.W) * 2) +
                                nn_align((size_t)(g.Cin * Ktr) * 2);
            const size_t want[3][2] = {{col2 + wc, col2 + wc + prod},
                                       {el[1] ? colt : 0, el[1] ? colt : 0},
                                       {col2 + part, col2 + part}};
            static const char *pass[3] = {"forward", "backward-data", "backward-filter"};
            for (int ps = 0; ps < 3; ps++)
                for (int b = 0; b < 2; b++) {
                    size_t got = lucid_conv_col_scratch(&g, dt, ps, b);
                    ok(got == want[ps][b] && got % 256 == 0 && (ps != 1 || got > 0 || !el[1]),
                       NAME("conv_col scratch: %s %s %s%s (Kr %lld%s, S %lld)", cs[i].tag,
                            lucid_dtype_name(dt), pass[ps], b ? " bias" : "", (long long)Kr,
                            ps == 1 ? (el[1] ? ", eligible" : ", not eligible") : "",
                            (long long)S),
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
    const char *pe = getenv("LUCID_CONV_COL_PAD");
    ok(lucid_conv_col_pad_switch() == (int)pad_on(),
       NAME("conv_col pad switch follows LUCID_CONV_COL_PAD (%s%s%s): %d", pe ? "\"" : "",
            pe ? pe : "unset", pe ? "\"" : "", (int)pad_on()),
       WHY("%d", lucid_conv_col_pad_switch()));
}

/* In a child: LUCID_CONV_COL_PAD = value, then eligibility by pass and,
 * when it refuses padding, the entry points' refusals.  The child prints
 * its own lines; its exit status is its failure count (capped). */
static void child_pad(const char *value) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LUCID_CONV_COL_PAD", value, 1);
        const bool pad = strcmp(value, "0") != 0;
        char pre[96];
        snprintf(pre, sizeof pre, "LUCID_CONV_COL_PAD \"%s\"", value);
        ok(lucid_conv_col_pad_switch() == (int)pad,
           NAME("%s: pad switch %d", pre, (int)pad), WHY("%d", lucid_conv_col_pad_switch()));
        static const struct {
            const char *tag;
            lucid_conv_col_geom g;
            int off[3]; /* forward, backward-data, backward-filter with "0" */
        } cs[] = {
            {"K 27 (layer 0 3>16 s2 640 N4)", sq(4, 3, 640, 640, 16, 3, 2, 1, 1), {0, 0, 0}},
            {"K 5 (Cin 5 1x1 s2)", sq(1, 5, 16, 16, 8, 1, 2, 0, 1), {0, 0, 0}},
            {"K 459 (51>51 20x20 N4)", sq(4, 51, 20, 20, 51, 3, 1, 1, 1), {0, 0, 0}},
            {"K 144, K' 459 (16>51 20x20)", sq(2, 16, 20, 20, 51, 3, 1, 1, 1), {1, 0, 1}},
            {"K 576, K' 459 (64>51 20x20: Cout 51)", sq(2, 64, 20, 20, 51, 3, 1, 1, 1), {1, 0, 1}},
            {"K 576, K' 108 (64>12 16x16: Cout 12)", sq(2, 64, 16, 16, 12, 3, 1, 1, 1), {1, 0, 1}},
            {"K 459, K' 576 (51>64 16x16)", sq(2, 51, 16, 16, 64, 3, 1, 1, 1), {0, 0, 0}},
            {"K 576 (64>64 20x20)", sq(2, 64, 20, 20, 64, 3, 1, 1, 1), {1, 1, 1}},
        };
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            int want[3], got[3];
            want_passes(cs[i].g, want); /* follows this process's variable */
            bool same = true;
            for (int ps = 0; ps < 3; ps++) {
                got[ps] = lucid_conv_col_eligible(&cs[i].g, LUCID_BF16, ps);
                same = same && (pad || want[ps] == cs[i].off[ps]);
            }
            ok(same && got[0] == want[0] && got[1] == want[1] && got[2] == want[2],
               NAME("%s: %s: forward %d, backward-data %d, backward-filter %d", pre, cs[i].tag,
                    want[0], want[1], want[2]),
               WHY("%d %d %d (rule %d %d %d)", got[0], got[1], got[2], want[0], want[1],
                   want[2]));
        }
        if (!pad) {
            const unsigned long l0 = lucid_cuda_conv_col_launch_count();
            const int c0 = g_gemm_calls;
            g_msg[0] = 0;
            lucid_status st = lucid_conv_col_forward(NULL, NULL, NULL, LUCID_BF16, &cs[0].g, NULL,
                                                     NULL, NULL, NULL, NULL, NULL);
            ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
               NAME("%s: forward of K 27 is ERR_UNSUPPORTED", pre),
               WHY("status %d, message \"%s\"", (int)st, g_msg));
            g_msg[0] = 0;
            st = lucid_conv_col_backward_filter(NULL, NULL, NULL, LUCID_BF16, &cs[2].g, NULL, NULL,
                                                NULL, 0.0f, NULL);
            ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
               NAME("%s: backward_filter of K 459 is ERR_UNSUPPORTED", pre),
               WHY("status %d, message \"%s\"", (int)st, g_msg));
            g_msg[0] = 0;
            st = lucid_conv_col_backward_data(NULL, NULL, NULL, LUCID_BF16, &cs[3].g, NULL, NULL,
                                              NULL, NULL, 0.0f, NULL);
            ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
               NAME("%s: backward_data of K' 459 is ERR_UNSUPPORTED", pre),
               WHY("status %d, message \"%s\"", (int)st, g_msg));
            ok(lucid_cuda_conv_col_launch_count() == l0 && g_gemm_calls == c0,
               NAME("%s: the refusals launch nothing and call no GEMM", pre),
               WHY("%lu launches, %d GEMM calls", lucid_cuda_conv_col_launch_count() - l0,
                   g_gemm_calls - c0));
        }
        fflush(stdout);
        _exit(failures > 100 ? 100 : failures);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status)) {
        printf("not ok LUCID_CONV_COL_PAD \"%s\" child: ended by signal %d\n", value,
               WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        failures++;
    } else if (WEXITSTATUS(status) != 0) {
        failures++; /* its not ok lines are above */
    }
}

static void test_entry_refusals(void) {
    lucid_conv_col_geom bad = sq(1, 64, 7, 7, 64, 3, 1, 1, 1); /* P 49 */
    lucid_conv_col_geom good = sq(1, 64, 16, 16, 64, 3, 1, 1, 1);
    const unsigned long l0 = lucid_cuda_conv_col_launch_count();
    const int c0 = g_gemm_calls;
    lucid_status st;
    g_msg[0] = 0;
    st = lucid_conv_col_forward(NULL, NULL, NULL, LUCID_BF16, &bad, NULL, NULL, NULL, NULL, NULL,
                                NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
       "conv_col forward: ineligible geometry (P 49) is ERR_UNSUPPORTED with a message",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    g_msg[0] = 0;
    st = lucid_conv_col_backward_data(NULL, NULL, NULL, LUCID_F32, &good, NULL, NULL, NULL,
                                      NULL, 0.0f, NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "f32"),
       "conv_col backward_data: f32 is ERR_UNSUPPORTED naming the dtype",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    g_msg[0] = 0;
    {
        lucid_conv_col_geom s2 = sq(1, 64, 16, 16, 64, 3, 2, 1, 1);
        st = lucid_conv_col_backward_data(NULL, NULL, NULL, LUCID_BF16, &s2, NULL, NULL, NULL,
                                          NULL, 0.0f, NULL);
        ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
           "conv_col backward_data: stride 2 is ERR_UNSUPPORTED with a message",
           WHY("status %d, message \"%s\"", (int)st, g_msg));
    }
    g_msg[0] = 0;
    st = lucid_conv_col_backward_filter(NULL, NULL, NULL, LUCID_F16, &bad, NULL, NULL, NULL, 1.0f,
                                        NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "not eligible"),
       "conv_col backward_filter: ineligible geometry (P 49) is ERR_UNSUPPORTED",
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

/* ------------------------------------------------------------ the tiled im2col */

/* col_im2col_tiled emulated on the host: for every block of the plan
 * (col_tile_plan), col_tile_fill for every thread in order, then
 * col_tile_emit for every thread (the kernel's __syncthreads between the
 * phases), on a shared buffer of exactly t.smem bytes that starts each
 * block as garbage (0xff bytes: a bf16/f16 NaN, as a previous block's
 * leftovers would be on the device) followed by a canary.  Per geometry
 * (stride 1, 2, 3, mixed; dilation 2; 5x5, 7x7, 3x1, 1x3, 3x5, 2x2, 1x1
 * kernels; padding 0..3 including whole padding rows; Wo not a multiple of
 * 8, 1-wide and 261-wide rows; K % 8 != 0, so Kr > K; Cin 51; batch 1..3),
 * in bf16 with the tile cap 2048 (the default), 64 (tiles that start
 * mid-row, several tiles per plane) and 8 (one vector per tile), and in
 * f16 with the default:
 *   - the plan: shared memory <= 48 KB, every block's staged rows <= t.R,
 *     no shared access outside t.smem (the accessors count them), the
 *     canary intact; every element of the N*Kr*P columns written exactly
 *     once, by 16-byte aligned vectors, nothing outside;
 *   - the columns = the header's definition, bitwise (+0 in the padding
 *     and in the rows K..Kr-1);
 *   - the columns = the per-thread kernel's (col_im2col_row8 for every
 *     item of its grid), bitwise.
 * Plus: the plans of the YOLO11n-pose im2col shapes at batch 4 (accepted,
 * their tile, grid and shared memory printed), a fallback (W 8000 needs
 * more than 48 KB even for a tile of 8), and LUCID_COL_IM2COL's switch. */

/* the store of col_tile_emit on the host: copies the vector, counts the
 * writes of each element, and anything unaligned or outside (host and
 * device only so that nvcc compiles col_tile_emit's device side with it) */
template <typename T> struct TileHostStore {
    T *col;
    unsigned char *cnt;
    size_t total;
    int64_t *bad;
    __host__ __device__ void operator()(size_t off, const uint4 &v) const {
        if (off % 8 || off + 8 > total) {
            (*bad)++;
            return;
        }
        memcpy((void *)(col + off), &v, 16);
        for (int j = 0; j < 8; j++) cnt[off + j]++;
    }
};

template <typename T, int S>
static void tiled_run(const ColArgs &a, const ColTile &t, const T *x, std::vector<T> &col,
                      std::vector<unsigned char> &cnt, int64_t *bad, int64_t *rows_over,
                      int64_t *canary) {
    const unsigned blocks = (unsigned)((int64_t)a.N * a.Cin * t.tiles);
    std::vector<unsigned char> sm((size_t)t.smem + 64);
    TileHostStore<T> st{col.data(), cnt.data(), col.size(), bad};
    for (unsigned b = 0; b < blocks; b++) {
        memset(sm.data(), 0xff, (size_t)t.smem);
        memset(sm.data() + t.smem, 0x5a, 64);
        if (col_tile_block<S>(a, t, b).rows > (unsigned)t.R) (*rows_over)++;
        for (int tid = 0; tid < t.nthr; tid++)
            col_tile_fill<T, S>(x, a, t, b, (unsigned)tid, sm.data());
        for (int tid = 0; tid < t.nthr; tid++)
            col_tile_emit<T, S>(a, t, b, (unsigned)tid, sm.data(), st);
        for (int i = 0; i < 64; i++) *canary += sm[(size_t)t.smem + i] != 0x5a;
    }
}

template <typename T>
static void tiled_check(const char *pre, const char *tname, int tpmax,
                        const lucid_conv_col_geom &g, const std::vector<float> &xf) {
    const ColArgs a = col_args(&g);
    ColTile t;
    if (!col_tile_plan(a, tpmax, &t)) {
        ok(false, NAME("%s: tiled %s tile<=%d: planned", pre, tname, tpmax), "no plan");
        return;
    }
    const int64_t N = g.N, K = a.K, Kr = a.Kr, P = a.P, total = N * Kr * P;
    std::vector<T> x(xf.size());
    for (size_t i = 0; i < xf.size(); i++) x[i] = from_float<T>(xf[i]);
    /* the tiled kernel's columns; the sentinel 0x7fc1 (a NaN no x value is) */
    std::vector<T> col((size_t)total);
    const unsigned short sent = 0x7fc1;
    for (auto &v : col) memcpy((void *)&v, &sent, 2);
    std::vector<unsigned char> cnt((size_t)total, 0);
    int64_t bad = 0, rows_over = 0, canary = 0;
    g_col_tile_oob = 0;
    const int s = col_stride(a);
    if (s == 1) tiled_run<T, 1>(a, t, x.data(), col, cnt, &bad, &rows_over, &canary);
    else if (s == 2) tiled_run<T, 2>(a, t, x.data(), col, cnt, &bad, &rows_over, &canary);
    else tiled_run<T, 0>(a, t, x.data(), col, cnt, &bad, &rows_over, &canary);
    int64_t not_once = 0;
    for (int64_t e = 0; e < total; e++) not_once += cnt[(size_t)e] != 1;
    ok(t.smem <= 49152 && t.TP % 8 == 0 && (int64_t)t.tiles * t.TP >= P && rows_over == 0 &&
           g_col_tile_oob == 0 && canary == 0 && bad == 0 && not_once == 0,
       NAME("%s: tiled %s tile<=%d (TP %d x %d tiles, %d B shared): in bounds, every element "
            "written once",
            pre, tname, tpmax, t.TP, t.tiles, t.smem),
       WHY("smem %d, %lld blocks over %d rows, %lu shared accesses outside, canary %lld, %lld "
           "stores unaligned/outside, %lld of %lld elements not written once",
           t.smem, (long long)rows_over, t.R, g_col_tile_oob, (long long)canary, (long long)bad,
           (long long)not_once, (long long)total));
    /* the definition, rows K..Kr-1 included (+0) */
    int64_t nbad = 0, first = -1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < Kr; k++)
            for (int64_t p = 0; p < P; p++) {
                unsigned short want = 0;
                if (k < K) {
                    const int64_t ci = k / (g.kh * g.kw), rq = k % (g.kh * g.kw);
                    const int64_t r = rq / g.kw, q = rq % g.kw, ho = p / g.Wo, wo = p % g.Wo;
                    const int64_t hi = ho * g.sh - g.ph + r * g.dh, wi = wo * g.sw - g.pw + q * g.dw;
                    if (hi >= 0 && hi < g.H && wi >= 0 && wi < g.W)
                        want = bits16(x[(size_t)(((n * g.Cin + ci) * g.H + hi) * g.W + wi)]);
                }
                const int64_t e = (n * Kr + k) * P + p;
                if (bits16(col[(size_t)e]) != want) {
                    if (first < 0) first = e;
                    nbad++;
                }
            }
    ok(nbad == 0, NAME("%s: tiled %s tile<=%d = definition (bitwise, rows K..Kr-1 +0)", pre, tname, tpmax),
       WHY("%lld of %lld elements differ (first at %lld)", (long long)nbad, (long long)total,
           (long long)first));
    /* the per-thread kernel's items */
    int64_t nold = 0, firsto = -1;
    for (unsigned row = 0; row < (unsigned)(N * Kr); row++)
        for (unsigned p8 = 0; p8 < (unsigned)(P / 8); p8++) {
            T v[8];
            const size_t off = s == 1   ? col_im2col_row8<T, 1>(x.data(), a, row, p8, v)
                               : s == 2 ? col_im2col_row8<T, 2>(x.data(), a, row, p8, v)
                                        : col_im2col_row8<T, 0>(x.data(), a, row, p8, v);
            for (int j = 0; j < 8; j++)
                if (off + j >= (size_t)total || bits16(col[off + j]) != bits16(v[j])) {
                    if (firsto < 0) firsto = (int64_t)(off + j);
                    nold++;
                }
        }
    ok(nold == 0, NAME("%s: tiled %s tile<=%d = per-thread kernel (bitwise)", pre, tname, tpmax),
       WHY("%lld of %lld elements differ (first at %lld)", (long long)nold, (long long)total,
           (long long)firsto));
}

static void test_tiled(void) {
    static const col_case cs[] = {
        {"3x3 s1 p1 K27", 2, 3, 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s1 p1 20x20 K45", 1, 5, 20, 20, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s2 p1 40x40>20x20", 3, 4, 40, 40, 8, 3, 3, 2, 2, 1, 1, 1, 1},
        {"3x3 s2 p1 17x31>9x16", 2, 3, 17, 31, 8, 3, 3, 2, 2, 1, 1, 1, 1},
        {"3x3 s2 p0 17x17>8x8", 2, 3, 17, 17, 8, 3, 3, 2, 2, 0, 0, 1, 1},
        {"3x3 s1 p1 6-wide rows", 3, 8, 4, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s1 p1 1-wide rows K18", 2, 2, 8, 1, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s3 p1", 2, 3, 22, 10, 8, 3, 3, 3, 3, 1, 1, 1, 1},
        {"5x5 s1 p2 K75", 2, 3, 6, 12, 8, 5, 5, 1, 1, 2, 2, 1, 1},
        {"5x5 s2 p2 odd K50", 1, 2, 15, 15, 8, 5, 5, 2, 2, 2, 2, 1, 1},
        {"7x7 s2 p3 32x33>16x17", 1, 2, 32, 33, 8, 7, 7, 2, 2, 3, 3, 1, 1},
        {"3x3 d2 p2", 2, 3, 9, 8, 8, 3, 3, 1, 1, 2, 2, 2, 2},
        {"3x3 s2 d2 p2 odd", 1, 3, 13, 15, 8, 3, 3, 2, 2, 2, 2, 2, 2},
        {"1x1 s2 p0 K5", 2, 5, 16, 16, 8, 1, 1, 2, 2, 0, 0, 1, 1},
        {"1x1 s2 p0 odd", 1, 3, 15, 9, 8, 1, 1, 2, 2, 0, 0, 1, 1},
        {"3x1 p1,0", 2, 3, 8, 8, 8, 3, 1, 1, 1, 1, 0, 1, 1},
        {"1x3 s2,1 p0,1", 1, 3, 16, 8, 8, 1, 3, 2, 1, 0, 1, 1, 1},
        {"2x2 s2 p0 odd", 3, 4, 17, 9, 8, 2, 2, 2, 2, 0, 0, 1, 1},
        {"3x5 s2,1 p1,2 d1,2", 1, 3, 15, 9, 8, 3, 5, 2, 1, 1, 2, 1, 2},
        {"3x3 p3 (padding rows)", 1, 3, 4, 2, 8, 3, 3, 1, 1, 3, 3, 1, 1},
        {"3x3 s2 p1 64x64>32x32", 1, 2, 64, 64, 8, 3, 3, 2, 2, 1, 1, 1, 1},
        {"3x3 s1 p1 8x100", 1, 2, 12, 100, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s1 p1 8x261 (lcm(Wo,8) > 2048)", 1, 1, 8, 261, 8, 3, 3, 1, 1, 1, 1, 1, 1},
        {"3x3 s1 p1 Cin 51 20x20 (K 459, Kr 464)", 1, 51, 20, 20, 8, 3, 3, 1, 1, 1, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const col_case &c = cs[i];
        const lucid_conv_col_geom g = geom_of(c);
        char pre[200];
        snprintf(pre, sizeof pre, "col %s N%lld Cin%lld %lldx%lld k%dx%d s%d,%d p%d,%d d%d,%d",
                 c.tag, (long long)c.N, (long long)c.Cin, (long long)c.H, (long long)c.W, c.kh,
                 c.kw, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
        if ((g.Ho * g.Wo) % 8) {
            ok(false, NAME("%s: P %% 8 == 0", pre), "bad test geometry");
            continue;
        }
        std::vector<float> xf((size_t)(g.N * g.Cin * g.H * g.W));
        for (auto &v : xf) v = rb(urand(-1, 1));
        tiled_check<__nv_bfloat16>(pre, "bf16", 2048, g, xf);
        tiled_check<__nv_bfloat16>(pre, "bf16", 64, g, xf);
        tiled_check<__nv_bfloat16>(pre, "bf16", 8, g, xf);
        tiled_check<__half>(pre, "f16", 2048, g, xf);
    }

    /* the YOLO11n-pose im2col shapes at batch 4 (forward / filter gradient
     * im2col of x; the stride-1 ones are also the backward-data's of dy) */
    static const struct {
        int64_t Cin, H;
        int s;
    } ys[] = {{16, 320, 2}, {32, 160, 1}, {32, 160, 2}, {64, 80, 1},  {64, 80, 2},
              {128, 40, 1}, {128, 40, 2}, {256, 20, 1}, {64, 20, 1},  {51, 80, 1},
              {51, 40, 1},  {51, 20, 1},  {64, 160, 1}, {128, 80, 1}, {256, 40, 1}};
    for (size_t i = 0; i < sizeof ys / sizeof ys[0]; i++) {
        const lucid_conv_col_geom g = sq(4, ys[i].Cin, ys[i].H, ys[i].H, 64, 3, ys[i].s, 1, 1);
        const ColArgs a = col_args(&g);
        ColTile t;
        const int planned = col_tile_plan(a, COL_TILE_TP, &t);
        ok(planned && t.smem <= 49152,
           NAME("conv_col tiled plan: N4 Cin %lld %lldx%lld s%d -> %lldx%lld: TP %d, %d tiles, "
                "grid %lld x %d threads, %d B shared, %d staged rows x %d",
                (long long)ys[i].Cin, (long long)ys[i].H, (long long)ys[i].H, ys[i].s,
                (long long)g.Ho, (long long)g.Wo, planned ? t.TP : 0, planned ? t.tiles : 0,
                planned ? (long long)(4 * ys[i].Cin * t.tiles) : 0LL, planned ? t.nthr : 0,
                planned ? t.smem : 0, planned ? t.R : 0, planned ? t.RP : 0),
           "no plan: falls back to the per-thread kernel");
    }
    {
        ColTile t;
        const lucid_conv_col_geom wide = sq(1, 1, 8, 8000, 8, 3, 1, 1, 1);
        const lucid_conv_col_geom ok4k = sq(1, 1, 8, 4000, 8, 3, 1, 1, 1);
        const ColArgs aw = col_args(&wide), a4 = col_args(&ok4k);
        const int p4 = col_tile_plan(a4, COL_TILE_TP, &t);
        ok(p4 && t.smem <= 49152,
           NAME("conv_col tiled plan: 3x3 s1 on 8x4000 planned (TP %d, %d B shared)",
                p4 ? t.TP : 0, p4 ? t.smem : 0),
           "refused");
        ok(!col_tile_plan(aw, COL_TILE_TP, &t),
           "conv_col tiled plan: 3x3 s1 on 8x8000 refused (a tile of 8 needs > 48 KB: the "
           "per-thread kernel runs)",
           "planned");
    }
    {
        const char *e = getenv("LUCID_COL_IM2COL");
        const int want = !(e && strcmp(e, "0") == 0);
        ok(lucid_conv_col_im2col_switch() == want,
           NAME("conv_col im2col switch follows LUCID_COL_IM2COL (\"%s\": %s)", e ? e : "",
                want ? "tiled" : "per-thread"),
           "another answer");
    }
}

/* ------------------------------------------- columns from the BatchNorm */

/* The BatchNorm backward's columns (cuda/nn_dcols.cuh, nn.h
 * lucid_conv_dcols) emulated on the host: for every channel c of a dx
 * [N, C, H, W] (the grad_output of a 3x3 stride-1 padding-1 conv Cin > C),
 * the channel's planes staged as the kernel stages them, then
 * bn_emit_cols for every thread of a 256-thread block in turn into a
 * buffer of NaN followed by 8 canary elements.  Checked: the geometry is
 * one lucid_conv_col_dcols_geom accepts; every element of the N*C*9*H*W
 * columns written, each channel's pass changing only that channel's rows,
 * nothing past the end; the columns bitwise equal to the route's own im2col of dx for
 * the backward-data (col_im2col_row8 on col_dgrad_geom's geometry, itself
 * checked against the definition by im2col_check), bf16 and f16.  Shapes:
 * 40x40 and 20x20 (W not a multiple of 8: vectors cross rows) at N 4 with
 * 8 and 32 channels; 6x4, 2x12, 1x8 planes; N 1 with 64x128 (S 8192: more
 * vectors per row than threads); N 3 with 5x8.  Plus the host contract:
 * lucid_conv_col_dcols_geom accepts the YOLO11n-pose shapes that fuse
 * (32>32 40x40, 64>64 20x20, 64>32, 32>64, 128>64, 256>64) and refuses
 * Cout*9 not a multiple of 8 (Cout 12, 51), stride 2, padding 0 or 2,
 * dilation 2, a 5x5 or 3x1 kernel, H*W not a multiple of 8, f32, NULL;
 * lucid_conv_col_dcols_bytes = N*Cout*9*H*W*2; and
 * lucid_conv_col_backward_data_cols refuses a geometry outside them
 * (ERR_UNSUPPORTED) or NULL columns (ERR_ARG) before any launch or GEMM
 * call, and for an accepted one calls the GEMM without an im2col launch. */
template <typename T>
static void dcols_check(const char *tname, int64_t N, int64_t C, int64_t H, int64_t W) {
    char pre[128];
    snprintf(pre, sizeof pre, "bn columns %lldx%lldx%lldx%lld %s", (long long)N, (long long)C,
             (long long)H, (long long)W, tname);
    const lucid_conv_col_geom g = sq(N, 8, H, W, C, 3, 1, 1, 1); /* conv 8 > C */
    lucid_conv_col_geom t;
    if (!lucid_conv_col_dcols_geom(&g, LUCID_BF16) || !col_dgrad_geom(&g, LUCID_BF16, &t)) {
        ok(false, NAME("%s: geometry accepted", pre), "refused");
        return;
    }
    const int64_t S = H * W, total = N * C * 9 * S;
    std::vector<float> dxf((size_t)(N * C * S));
    for (auto &v : dxf) v = rb(urand(-1, 1));
    std::vector<T> dx(dxf.size());
    for (size_t i = 0; i < dxf.size(); i++) dx[i] = from_float<T>(dxf[i]);
    /* the route's im2col of dx (the backward-data's columns), checked */
    const ColArgs a = col_args(&t);
    std::vector<T> ref;
    im2col_check<T>(pre, tname, t, a, dxf, ref);
    /* the BatchNorm's: per channel, the staged planes, then every thread */
    std::vector<T> col((size_t)total + 8, from_float<T>(NAN)), stage((size_t)(N * S));
    bn_dcols dc;
    dc.col = col.data();
    dc.H = (int)H;
    dc.W = (int)W;
    int64_t stray = 0, outside = 0, missing = 0;
    std::vector<T> before;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t n = 0; n < N; n++)
            memcpy(&stage[(size_t)(n * S)], &dx[(size_t)((n * C + c) * S)], (size_t)S * sizeof(T));
        before = col;
        for (unsigned tid = 0; tid < 256; tid++)
            bn_emit_cols<T>(stage.data(), dc, N, C, S, c, tid, 256);
        /* only channel c's rows may change in its pass */
        for (int64_t e = 0; e < total + 8; e++) {
            if (bits16(col[(size_t)e]) == bits16(before[(size_t)e])) continue;
            if (e >= total) outside++;
            else if ((e / S) % (C * 9) / 9 != c) stray++;
        }
    }
    const unsigned short nan16 = bits16(from_float<T>(NAN));
    for (int64_t e = 0; e < total; e++) missing += bits16(col[(size_t)e]) == nan16;
    ok(missing == 0 && stray == 0 && outside == 0,
       NAME("%s: every column element written, by its channel's pass only, nothing outside", pre),
       WHY("%lld elements not written, %lld written by another channel's pass, %lld past the "
           "end",
           (long long)missing, (long long)stray, (long long)outside));
    int64_t nbad = 0, first = -1;
    for (int64_t e = 0; e < total; e++)
        if (bits16(col[(size_t)e]) != bits16(ref[(size_t)e])) {
            if (first < 0) first = e;
            nbad++;
        }
    ok(nbad == 0, NAME("%s: columns = the route's im2col of dx (bitwise)", pre),
       WHY("%lld of %lld elements differ (first at %lld)", (long long)nbad, (long long)total,
           (long long)first));
}

static void test_dcols(void) {
    dcols_check<__nv_bfloat16>("bf16", 4, 32, 40, 40);
    dcols_check<__nv_bfloat16>("bf16", 4, 8, 20, 20);
    dcols_check<__nv_bfloat16>("bf16", 2, 8, 6, 4);
    dcols_check<__nv_bfloat16>("bf16", 2, 16, 2, 12);
    dcols_check<__nv_bfloat16>("bf16", 4, 8, 1, 8);
    dcols_check<__nv_bfloat16>("bf16", 1, 8, 64, 128);
    dcols_check<__nv_bfloat16>("bf16", 3, 8, 5, 8);
    dcols_check<__half>("f16", 4, 32, 40, 40);
    dcols_check<__half>("f16", 4, 8, 20, 20);
    dcols_check<__half>("f16", 2, 16, 2, 12);
    /* the geometry the fusion takes */
    static const struct {
        int64_t Cin, Cout, H;
    } fuse[] = {{32, 32, 40}, {64, 64, 20}, {64, 32, 40}, {32, 64, 40}, {128, 64, 40},
                {256, 64, 20}, {128, 128, 20}};
    for (size_t i = 0; i < sizeof fuse / sizeof fuse[0]; i++) {
        const lucid_conv_col_geom g = sq(4, fuse[i].Cin, fuse[i].H, fuse[i].H, fuse[i].Cout, 3, 1, 1, 1);
        ok(lucid_conv_col_dcols_geom(&g, LUCID_BF16) && lucid_conv_col_dcols_geom(&g, LUCID_F16) &&
               lucid_conv_col_dcols_bytes(&g) ==
                   (size_t)(4 * fuse[i].Cout * 9 * fuse[i].H * fuse[i].H) * 2,
           NAME("bn columns: conv %lld>%lld 3x3 s1 p1 at 4x%lldx%lld accepted, %lld bytes",
                (long long)fuse[i].Cin, (long long)fuse[i].Cout, (long long)fuse[i].H,
                (long long)fuse[i].H, (long long)(4 * fuse[i].Cout * 9 * fuse[i].H * fuse[i].H * 2)),
           "refused or another size");
    }
    static const struct {
        const char *what;
        lucid_conv_col_geom g;
        lucid_dtype dt;
    } no[] = {
        {"Cout 12 (Cout*9 = 108)", sq(4, 32, 40, 40, 12, 3, 1, 1, 1), LUCID_BF16},
        {"Cout 51 (Cout*9 = 459)", sq(4, 64, 40, 40, 51, 3, 1, 1, 1), LUCID_BF16},
        {"stride 2", sq(4, 32, 40, 40, 32, 3, 2, 1, 1), LUCID_BF16},
        {"padding 0", sq(4, 32, 40, 40, 32, 3, 1, 0, 1), LUCID_BF16},
        {"padding 2, dilation 2", sq(4, 32, 40, 40, 32, 3, 1, 2, 2), LUCID_BF16},
        {"5x5 padding 2", sq(4, 32, 40, 40, 32, 5, 1, 2, 1), LUCID_BF16},
        {"H*W 420", sq(4, 32, 20, 21, 32, 3, 1, 1, 1), LUCID_BF16},
        {"f32", sq(4, 32, 40, 40, 32, 3, 1, 1, 1), LUCID_F32},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        ok(!lucid_conv_col_dcols_geom(&no[i].g, no[i].dt),
           NAME("bn columns: %s refused", no[i].what), "accepted");
    {
        lucid_conv_col_geom k31 = sq(4, 32, 40, 40, 32, 3, 1, 1, 1);
        k31.kw = 1;
        k31.pw = 0;
        ok(!lucid_conv_col_dcols_geom(&k31, LUCID_BF16) && !lucid_conv_col_dcols_geom(NULL, LUCID_BF16),
           "bn columns: a 3x1 kernel and NULL refused", "accepted");
    }
    /* the entry point */
    const lucid_conv_col_geom good = sq(4, 32, 40, 40, 32, 3, 1, 1, 1);
    const lucid_conv_col_geom bad = sq(4, 32, 40, 40, 12, 3, 1, 1, 1);
    const unsigned long l0 = lucid_cuda_conv_col_launch_count();
    int c0 = g_gemm_calls;
    alignas(16) static unsigned char buf[64];
    lucid_status st;
    g_msg[0] = 0;
    st = lucid_conv_col_backward_data_cols(NULL, NULL, NULL, LUCID_BF16, &bad, buf, NULL, buf,
                                           NULL, 0.0f, NULL);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "columns from the BatchNorm"),
       "bn columns: backward_data_cols refuses Cout 12 (ERR_UNSUPPORTED, message)",
       WHY("status %d, message \"%s\"", (int)st, g_msg));
    st = lucid_conv_col_backward_data_cols(NULL, NULL, NULL, LUCID_BF16, &good, NULL, NULL, buf,
                                           NULL, 0.0f, NULL);
    ok(st == LUCID_ERR_ARG, "bn columns: backward_data_cols with columns NULL is ERR_ARG",
       WHY("status %d", (int)st));
    ok(lucid_cuda_conv_col_launch_count() == l0 && g_gemm_calls == c0,
       "bn columns: the refusals launch nothing and call no GEMM",
       WHY("%lu launches, %d GEMM calls", lucid_cuda_conv_col_launch_count() - l0,
           g_gemm_calls - c0));
    /* accepted, with the flipped weight given (no cast): the GEMM (the stub
     * fails it), no im2col */
    st = lucid_conv_col_backward_data_cols(NULL, NULL, NULL, LUCID_BF16, &good, buf, NULL, buf,
                                           NULL, 0.0f, NULL);
    ok(st == LUCID_ERR_DEVICE && g_gemm_calls == c0 + 1 && lucid_cuda_conv_col_launch_count() == l0,
       "bn columns: backward_data_cols goes straight to the GEMM (no im2col launch)",
       WHY("status %d, %d GEMM calls, %lu launches", (int)st, g_gemm_calls - c0,
           lucid_cuda_conv_col_launch_count() - l0));
}

int main() {
    /* the children first: nothing in this process has read LUCID_CONV_COL_PAD yet */
    child_pad("0");
    child_pad("1");
    test_eligible();
    test_scratch();
    test_switch();
    test_entry_refusals();
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(CASES[i]);
    test_tiled();
    test_dcols();
    return failures != 0;
}
