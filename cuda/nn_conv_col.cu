/*
 * nn_conv_col.cu — convolutions as im2col + cuBLAS GEMMs (bf16/f16, groups
 * 1, any kernel size, stride, padding, dilation).  The contract, the GEMM
 * formulation and the numerics are in nn_conv_col.cuh; nn_conv.cu decides
 * when this route runs (LUCID_CONV_COL, lucid_cuda_nn_set_conv_col).  The
 * forward and backward-filter GEMMs are the 1x1 route's (nn_conv_gemm.cu)
 * applied to the column matrix (Cin -> K = Cin*kh*kw, x -> col); the
 * backward-data of a stride-1 conv is a forward of dy with the flipped,
 * transposed weight (col_wflip), one GEMM straight into dx.
 *
 * The per-thread work of the im2col kernel is a host-callable function
 * (col_im2col_row8) so that spec/c/test_conv_col_maps.cu runs the kernel's
 * own index map on the CPU.  The kernel is a 2-D grid (y: rows of the
 * column matrix) with 32-bit index math, in stride variants 1, 2 (the
 * divisions by the stride become shifts) and any.
 */
#include "nn_common.cuh"
#include "nn_conv_col.cuh"
#include "nn_conv_gemm.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COL_HD __host__ __device__ __forceinline__

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

/* wf[ci][(co*kh + r)*kw + q] = T(w[co][ci][kh-1-r][kw-1-q]) (one rounding),
 * rows of Kr >= Cout*kh*kw elements (the rest +0); i over the Cin*Kr
 * elements of wf */
template <typename T>
static __global__ void col_wflip(const float *__restrict__ w, T *__restrict__ wf, int Cin,
                                 int Cout, int kh, int kw, int Kr, int n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int KK = kh * kw;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ci = (int)(i / Kr), k = (int)(i - (int64_t)ci * Kr);
        if (k >= Cout * KK) {
            lucid_elem<T>::store(wf, i, 0.0f);
            continue;
        }
        const int co = k / KK, rq = k - co * KK, r = rq / kw, q = rq - r * kw;
        lucid_elem<T>::store(wf, i, w[((size_t)co * Cin + ci) * KK + (kh - 1 - r) * kw + (kw - 1 - q)]);
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
                        "not eligible (needs bf16/f16, Cin*kh*kw, Cout and Ho*Wo multiples of 8, "
                        "N*Cin*kh*kw*Ho*Wo and N*Cout*Cin*kh*kw <= %lld; backward-data also "
                        "stride 1, padding <= (kernel-1)*dilation, Cin and H*W multiples of 8)",
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

template <typename T>
static cudaError_t col_im2col_launch(cudaStream_t stream, const ColArgs &a, const void *x,
                                     void *col) {
    const dim3 grid = col_grid((unsigned)a.P / 8, (unsigned)a.N * a.Kr), block(COL_BX, COL_BY);
    const int s = col_stride(a);
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

lucid_status lucid_conv_col_forward(lucid_ctx *ctx, cublasHandle_t h, cudaStream_t stream,
                                    lucid_dtype dt, const lucid_conv_col_geom *g,
                                    const void *x, const float *w, const void *wcast,
                                    const float *b, void *y, void *scratch) {
    LUCID_TRY(col_check(ctx, "conv2d_forward", dt, g, 0));
    LUCID_TRY(col_fill(ctx, stream, dt, g, x, scratch));
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
    return lucid_conv_gemm_forward_wc(ctx, h, stream, dt, &gg, scratch, w, wcast, b, y, gs);
}

lucid_status lucid_conv_col_backward_data(lucid_ctx *ctx, cublasHandle_t h,
                                          cudaStream_t stream, lucid_dtype dt,
                                          const lucid_conv_col_geom *g, const void *dy,
                                          const float *w, void *dx,
                                          float beta, void *scratch) {
    LUCID_TRY(col_check(ctx, "conv2d_backward_input", dt, g, 1));
    lucid_conv_col_geom t;
    col_dgrad_geom(g, dt, &t); /* eligible: stride 1, t valid */
    const int64_t Kt = col_Kr(&t), Pt = col_P(&t), nwf = g->Cin * Kt;
    void *wf = (char *)scratch + col_bytes(&t, 2);
    const unsigned blocks = lucid_cuda_blocks(nwf, 256);
    if (dt == LUCID_BF16)
        CUDA_CHECK(ctx, lucid_launch(col_wflip<__nv_bfloat16>, dim3(blocks), dim3(256), 0, stream,
                                     w, (__nv_bfloat16 *)wf, (int)g->Cin, (int)g->Cout, g->kh,
                                     g->kw, (int)Kt, (int)nwf));
    else
        CUDA_CHECK(ctx, lucid_launch(col_wflip<__half>, dim3(blocks), dim3(256), 0, stream, w,
                                     (__half *)wf, (int)g->Cin, (int)g->Cout, g->kh, g->kw,
                                     (int)Kt, (int)nwf));
    LUCID_TRY(col_fill(ctx, stream, dt, &t, dy, scratch));
    const cudaDataType_t adt = lucid_cuda_datatype(dt);
    const float one = 1.0f;
    /* per image, dX'[P x Cin] = col'[P x K'] . Wf'[K' x Cin] (column-major views as in
     * nn_conv_gemm.cu; beta applied by cuBLAS: dx = dt(acc + beta*dx)) */
    CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                          h, CUBLAS_OP_N, CUBLAS_OP_N, (int)Pt, (int)g->Cin, (int)Kt, &one,
                          scratch, adt, (int)Pt, (long long)(Kt * Pt), wf, adt, (int)Kt, 0LL,
                          &beta, dx, adt, (int)Pt, (long long)(g->Cin * Pt), (int)g->N,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LUCID_OK;
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
