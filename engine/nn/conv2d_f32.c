/*
 * conv2d_f32.c — Conv2d on the CPU for f32 activations (bf16/f16 staged
 * through f32 by conv2d.c): forward, backward-data, backward-weight/bias.
 *
 * Method (contract in nn.h; f64 tensors take the f64 code of conv2d.c):
 *   forward      y[n,g,:,tile] = w_g @ im2col(x[n,g])[:, tile] (+ b), one
 *                OpenBLAS sgemm per tile; 1x1 stride-1 unpadded convs use
 *                the NCHW planes as the GEMM operand directly (no im2col).
 *   backward-in  dcol = w_g[:, cblock]^T @ dy[n,g], col2im into the planes of
 *                that channel block (tiles never share a dx element); 1x1:
 *                one sgemm per column tile straight into dx (beta folded in).
 *   backward-w   per slot s: acc_s += dy[n,g,:,tile] @ im2col(...)[:, tile]^T
 *                over the tiles u = s, s+S, ...; dw = beta*dw + sum_s acc_s
 *                in slot order; db in f64.
 *   depthwise    (one input and one output channel per group): direct
 *                loops over (image, channel) planes.
 * Tiles (column tiles of <= 4096 outputs, channel blocks, S = min(tiles, 8)
 * slots) depend on the shapes only, so results are the same for any thread
 * count.  OpenBLAS runs single-threaded inside the kernels (the threads come
 * from cpu_parallel_for); its previous thread count is restored on return.
 * Source: PyTorch nn.Conv2d documentation; im2col as in Caffe / darknet.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

typedef struct cgeom {
    int64_t N, Cin, H, W, Cout, Ho, Wo;
    int64_t kh, kw, G, Cg, Og, K, P, HW;
    int sh, sw, ph, pw, dh, dw;
} cgeom;

static cgeom cgeom_of(const lucid_tensor *x, int64_t Cout, int64_t kh,
                      int64_t kw, int64_t Ho, int64_t Wo,
                      const lucid_conv2d_params *p) {
    cgeom g;
    g.N = x->shape[0]; g.Cin = x->shape[1]; g.H = x->shape[2]; g.W = x->shape[3];
    g.Cout = Cout; g.kh = kh; g.kw = kw; g.Ho = Ho; g.Wo = Wo;
    g.G = p->groups; g.Cg = g.Cin / g.G; g.Og = g.Cout / g.G;
    g.K = g.Cg * kh * kw; g.P = Ho * Wo; g.HW = g.H * g.W;
    g.sh = p->stride_h; g.sw = p->stride_w; g.ph = p->pad_h; g.pw = p->pad_w;
    g.dh = p->dilation_h; g.dw = p->dilation_w;
    return g;
}

static int is_pointwise(const cgeom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
           g->pw == 0;
}

/* valid output columns [*j0, *j1) of kernel column v: 0 <= j*sw-pw+v*dw < W */
static void valid_cols(const cgeom *g, int64_t v, int64_t *j0, int64_t *j1) {
    int64_t off = v * g->dw - g->pw; /* wi = j*sw + off */
    int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
    int64_t hi = (g->W - 1 - off) >= 0 ? (g->W - 1 - off) / g->sw + 1 : 0;
    if (hi > g->Wo) hi = g->Wo;
    if (lo > hi) lo = hi;
    *j0 = lo;
    *j1 = hi;
}

/* col[K, q1-q0] = im2col of one group x [Cg, H, W] over output columns
 * [q0, q1) (flat i*Wo + j). */
static void im2col_f32(const cgeom *g, const float *x, int64_t q0, int64_t q1,
                       float *col) {
    int64_t L = q1 - q0;
    for (int64_t c = 0; c < g->Cg; c++)
        for (int64_t u = 0; u < g->kh; u++)
            for (int64_t v = 0; v < g->kw; v++) {
                float *row = col + ((c * g->kh + u) * g->kw + v) * L;
                const float *xc = x + c * g->HW;
                int64_t j0, j1, off = v * g->dw - g->pw;
                valid_cols(g, v, &j0, &j1);
                int64_t q = q0;
                while (q < q1) {
                    int64_t i = q / g->Wo, j = q - i * g->Wo;
                    int64_t je = g->Wo < j + (q1 - q) ? g->Wo : j + (q1 - q);
                    float *r = row + (q - q0) - j; /* r[j] is output column j */
                    int64_t hi = i * g->sh - g->ph + u * g->dh;
                    if (hi < 0 || hi >= g->H) {
                        for (int64_t k = j; k < je; k++) r[k] = 0.0f;
                    } else {
                        const float *xr = xc + hi * g->W + off;
                        int64_t a = j0 > j ? j0 : j, b = j1 < je ? j1 : je;
                        if (a > b) a = b;
                        for (int64_t k = j; k < a; k++) r[k] = 0.0f;
                        if (g->sw == 1)
                            memcpy(r + a, xr + a, sizeof(float) * (size_t)(b - a));
                        else
                            for (int64_t k = a; k < b; k++) r[k] = xr[k * g->sw];
                        for (int64_t k = b; k < je; k++) r[k] = 0.0f;
                    }
                    q += je - j;
                }
            }
}

/* dx planes [nc, H, W] += col2im of col [nc*kh*kw, P]. */
static void col2im_f32(const cgeom *g, const float *col, int64_t nc, float *dx) {
    for (int64_t c = 0; c < nc; c++)
        for (int64_t u = 0; u < g->kh; u++)
            for (int64_t v = 0; v < g->kw; v++) {
                const float *row = col + ((c * g->kh + u) * g->kw + v) * g->P;
                float *xc = dx + c * g->HW;
                int64_t j0, j1, off = v * g->dw - g->pw;
                valid_cols(g, v, &j0, &j1);
                for (int64_t i = 0; i < g->Ho; i++) {
                    int64_t hi = i * g->sh - g->ph + u * g->dh;
                    if (hi < 0 || hi >= g->H) continue;
                    const float *r = row + i * g->Wo;
                    float *xr = xc + hi * g->W + off;
                    if (g->sw == 1)
                        for (int64_t k = j0; k < j1; k++) xr[k] += r[k];
                    else
                        for (int64_t k = j0; k < j1; k++) xr[k * g->sw] += r[k];
                }
            }
}

/* column tiles of the P outputs of one plane: shape-only */
static void col_tiles(int64_t P, int64_t *PB, int64_t *nPB) {
    const int64_t T = 4096;
    if (P <= T) {
        *PB = P > 0 ? P : 1;
        *nPB = 1;
        return;
    }
    int64_t n = (P + T - 1) / T;
    int64_t b = (P + n - 1) / n;
    b = (b + 15) / 16 * 16;
    *PB = b;
    *nPB = (P + b - 1) / b;
}

/* ---------------------------------------------------------------- BLAS */

static int blas_serial_begin(void) {
    int t = openblas_get_num_threads();
    if (t != 1) openblas_set_num_threads(1);
    return t;
}
static void blas_serial_end(int t) {
    if (t != 1) openblas_set_num_threads(t);
}

static void oom_flag(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELAXED); }

// ----------------------------------------------------------------------------
// forward

typedef struct fwd_job {
    cgeom g;
    const float *x, *w, *b;
    float *y;
    int64_t PB, nPB, OB, nOB;
    int oom;
} fwd_job;

static void fwd_range(void *arg, int64_t u0, int64_t u1) {
    fwd_job *J = arg;
    const cgeom *g = &J->g;
    int pw = is_pointwise(g);
    float *col = NULL;
    if (!pw) {
        col = malloc(sizeof(float) * (size_t)(g->K * J->PB));
        if (!col) { oom_flag(&J->oom); return; }
    }
    int64_t last = -1;
    for (int64_t u = u0; u < u1; u++) {
        /* u = ((n * G + gi) * nPB + pb) * nOB + ob */
        int64_t ob = u % J->nOB, t = u / J->nOB;
        int64_t pb = t % J->nPB, ng = t / J->nPB;
        int64_t n = ng / g->G, gi = ng % g->G;
        int64_t q0 = pb * J->PB, q1 = q0 + J->PB < g->P ? q0 + J->PB : g->P;
        int64_t o0 = ob * J->OB, o1 = o0 + J->OB < g->Og ? o0 + J->OB : g->Og;
        if (q0 >= q1 || o0 >= o1) continue;
        int64_t L = q1 - q0;
        const float *xg = J->x + (n * g->Cin + gi * g->Cg) * g->HW;
        const float *B;
        int ldb;
        if (pw) {
            B = xg + q0;
            ldb = (int)g->P;
        } else {
            if (t != last) im2col_f32(g, xg, q0, q1, col);
            last = t;
            B = col;
            ldb = (int)L;
        }
        int64_t oc = gi * g->Og + o0;
        float *yo = J->y + (n * g->Cout + oc) * g->P + q0;
        float beta = 0.0f;
        if (J->b) {
            for (int64_t o = 0; o < o1 - o0; o++) {
                float bv = J->b[oc + o];
                float *r = yo + o * g->P;
                for (int64_t q = 0; q < L; q++) r[q] = bv;
            }
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(o1 - o0),
                    (int)L, (int)g->K, 1.0f, J->w + oc * g->K, (int)g->K, B, ldb,
                    beta, yo, (int)g->P);
    }
    free(col);
}

/* depthwise: one (image, channel) plane per unit */
typedef struct dw_job {
    cgeom g;
    const float *x, *w, *b, *dy;
    float *y, *dx;
    float beta;
    double *dwacc, *dbacc; /* backward-params: per channel */
    int oom;
} dw_job;

static void dw_fwd_range(void *arg, int64_t u0, int64_t u1) {
    dw_job *J = arg;
    const cgeom *g = &J->g;
    for (int64_t u = u0; u < u1; u++) {
        int64_t c = u % g->Cout;
        const float *xc = J->x + u * g->HW, *wc = J->w + c * g->kh * g->kw;
        float *yc = J->y + u * g->P;
        float bv = J->b ? J->b[c] : 0.0f;
        for (int64_t q = 0; q < g->P; q++) yc[q] = bv;
        for (int64_t i = 0; i < g->Ho; i++) {
            float *yr = yc + i * g->Wo;
            for (int64_t uu = 0; uu < g->kh; uu++) {
                int64_t hi = i * g->sh - g->ph + uu * g->dh;
                if (hi < 0 || hi >= g->H) continue;
                for (int64_t v = 0; v < g->kw; v++) {
                    int64_t j0, j1, off = v * g->dw - g->pw;
                    valid_cols(g, v, &j0, &j1);
                    const float *xr = xc + hi * g->W + off;
                    float wv = wc[uu * g->kw + v];
                    if (g->sw == 1)
                        for (int64_t j = j0; j < j1; j++) yr[j] += wv * xr[j];
                    else
                        for (int64_t j = j0; j < j1; j++) yr[j] += wv * xr[j * g->sw];
                }
            }
        }
    }
}

lucid_status cpu_conv2d_forward_f32(lucid_ctx *ctx, const lucid_tensor *xt,
                                    const float *x, float *y,
                                    const lucid_tensor *wt, const float *w,
                                    const float *b, int64_t Ho, int64_t Wo,
                                    const lucid_conv2d_params *p) {
    cgeom g = cgeom_of(xt, wt->shape[0], wt->shape[2], wt->shape[3], Ho, Wo, p);
    int bt = blas_serial_begin();
    int oom = 0;
    if (g.Cg == 1 && g.Og == 1) {
        dw_job J = {.g = g, .x = x, .w = w, .b = b, .y = y};
        nn_parallel(ctx, g.N * g.Cout, 1, dw_fwd_range, &J);
    } else {
        fwd_job J = {.g = g, .x = x, .w = w, .b = b, .y = y};
        col_tiles(g.P, &J.PB, &J.nPB);
        J.nOB = 1;
        int64_t units = g.N * g.G * J.nPB;
        if (units < 8 && g.Og >= 64) {
            J.nOB = (8 + units - 1) / units;
            if (J.nOB > g.Og / 32) J.nOB = g.Og / 32;
        }
        J.OB = (g.Og + J.nOB - 1) / J.nOB;
        nn_parallel(ctx, units * J.nOB, 1, fwd_range, &J);
        oom = J.oom;
    }
    blas_serial_end(bt);
    if (oom)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "conv2d forward: out of host memory for the im2col "
                            "buffer");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// backward: data

typedef struct bwi_job {
    cgeom g;
    const float *dy, *w;
    float *dx;
    float beta;
    int64_t CB, nCB, PB, nPB; /* channel blocks (im2col) or column tiles (1x1) */
    int oom;
} bwi_job;

static void bwi_range(void *arg, int64_t u0, int64_t u1) {
    bwi_job *J = arg;
    const cgeom *g = &J->g;
    if (is_pointwise(g)) {
        for (int64_t u = u0; u < u1; u++) {
            /* u = (n * G + gi) * nPB + pb; dx tile = beta*dx + w_g^T @ dy tile */
            int64_t pb = u % J->nPB, ng = u / J->nPB;
            int64_t n = ng / g->G, gi = ng % g->G;
            int64_t q0 = pb * J->PB, q1 = q0 + J->PB < g->P ? q0 + J->PB : g->P;
            if (q0 >= q1) continue;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g->Cg,
                        (int)(q1 - q0), (int)g->Og, 1.0f, J->w + gi * g->Og * g->K,
                        (int)g->K, J->dy + (n * g->Cout + gi * g->Og) * g->P + q0,
                        (int)g->P, J->beta,
                        J->dx + (n * g->Cin + gi * g->Cg) * g->HW + q0, (int)g->P);
        }
        return;
    }
    int64_t kk = g->kh * g->kw;
    float *col = malloc(sizeof(float) * (size_t)(J->CB * kk * g->P));
    if (!col) { oom_flag(&J->oom); return; }
    for (int64_t u = u0; u < u1; u++) {
        /* u = (n * G + gi) * nCB + cb */
        int64_t cb = u % J->nCB, ng = u / J->nCB;
        int64_t n = ng / g->G, gi = ng % g->G;
        int64_t c0 = cb * J->CB, c1 = c0 + J->CB < g->Cg ? c0 + J->CB : g->Cg;
        if (c0 >= c1) continue;
        int64_t nc = c1 - c0;
        /* dcol [nc*kk, P] = w_g[:, c0*kk : c1*kk]^T @ dy_g [Og, P] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(nc * kk),
                    (int)g->P, (int)g->Og, 1.0f, J->w + gi * g->Og * g->K + c0 * kk,
                    (int)g->K, J->dy + (n * g->Cout + gi * g->Og) * g->P, (int)g->P,
                    0.0f, col, (int)g->P);
        float *dxp = J->dx + (n * g->Cin + gi * g->Cg + c0) * g->HW;
        nn_f32_scale(dxp, nc * g->HW, J->beta);
        col2im_f32(g, col, nc, dxp);
    }
    free(col);
}

static void dw_bwi_range(void *arg, int64_t u0, int64_t u1) {
    dw_job *J = arg;
    const cgeom *g = &J->g;
    for (int64_t u = u0; u < u1; u++) {
        int64_t c = u % g->Cout;
        const float *yc = J->dy + u * g->P, *wc = J->w + c * g->kh * g->kw;
        float *xc = J->dx + u * g->HW;
        nn_f32_scale(xc, g->HW, J->beta);
        for (int64_t i = 0; i < g->Ho; i++) {
            const float *yr = yc + i * g->Wo;
            for (int64_t uu = 0; uu < g->kh; uu++) {
                int64_t hi = i * g->sh - g->ph + uu * g->dh;
                if (hi < 0 || hi >= g->H) continue;
                for (int64_t v = 0; v < g->kw; v++) {
                    int64_t j0, j1, off = v * g->dw - g->pw;
                    valid_cols(g, v, &j0, &j1);
                    float *xr = xc + hi * g->W + off;
                    float wv = wc[uu * g->kw + v];
                    if (g->sw == 1)
                        for (int64_t j = j0; j < j1; j++) xr[j] += wv * yr[j];
                    else
                        for (int64_t j = j0; j < j1; j++) xr[j * g->sw] += wv * yr[j];
                }
            }
        }
    }
}

lucid_status cpu_conv2d_backward_input_f32(lucid_ctx *ctx,
                                           const lucid_tensor *dxt,
                                           const float *dy, float *dx,
                                           const lucid_tensor *wt,
                                           const float *w, int64_t Ho,
                                           int64_t Wo,
                                           const lucid_conv2d_params *p,
                                           float beta) {
    cgeom g = cgeom_of(dxt, wt->shape[0], wt->shape[2], wt->shape[3], Ho, Wo, p);
    int bt = blas_serial_begin();
    int oom = 0;
    if (g.Cg == 1 && g.Og == 1) {
        dw_job J = {.g = g, .w = w, .dy = dy, .dx = dx, .beta = beta};
        nn_parallel(ctx, g.N * g.Cout, 1, dw_bwi_range, &J);
    } else {
        bwi_job J = {.g = g, .dy = dy, .w = w, .dx = dx, .beta = beta};
        int64_t units;
        if (is_pointwise(&g)) {
            col_tiles(g.P, &J.PB, &J.nPB);
            units = g.N * g.G * J.nPB;
        } else {
            int64_t kkP = g.kh * g.kw * g.P;
            J.CB = ((int64_t)1 << 20) / (kkP > 0 ? kkP : 1);
            if (J.CB < 1) J.CB = 1;
            if (J.CB > g.Cg) J.CB = g.Cg;
            /* a few blocks per image when the batch alone is too small */
            if (g.N * g.G < 8 && g.Cg >= 16 && J.CB > g.Cg / 4) J.CB = (g.Cg + 3) / 4;
            J.nCB = (g.Cg + J.CB - 1) / J.CB;
            units = g.N * g.G * J.nCB;
        }
        nn_parallel(ctx, units, 1, bwi_range, &J);
        oom = J.oom;
    }
    blas_serial_end(bt);
    if (oom)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "conv2d backward_input: out of host memory for the "
                            "col2im buffer");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// backward: weight and bias

typedef struct bwp_job {
    cgeom g;
    const float *x, *dy;
    float *acc;    /* [S, Cout*K] or NULL (bias only) */
    double *bacc;  /* [S, Cout] */
    int64_t PB, nPB, U, S;
    int oom;
} bwp_job;

static void bwp_range(void *arg, int64_t s0, int64_t s1) {
    bwp_job *J = arg;
    const cgeom *g = &J->g;
    int pw = is_pointwise(g);
    float *col = NULL;
    if (J->acc && !pw) {
        col = malloc(sizeof(float) * (size_t)(g->K * J->PB));
        if (!col) { oom_flag(&J->oom); return; }
    }
    for (int64_t s = s0; s < s1; s++) {
        float *acc = J->acc ? J->acc + s * g->Cout * g->K : NULL;
        double *bacc = J->bacc + s * g->Cout;
        if (acc) memset(acc, 0, sizeof(float) * (size_t)(g->Cout * g->K));
        memset(bacc, 0, sizeof(double) * (size_t)g->Cout);
        for (int64_t u = s; u < J->U; u += J->S) {
            int64_t n = u / J->nPB, pb = u % J->nPB;
            int64_t q0 = pb * J->PB, q1 = q0 + J->PB < g->P ? q0 + J->PB : g->P;
            if (q0 >= q1) continue;
            int64_t L = q1 - q0;
            const float *dyn = J->dy + n * g->Cout * g->P + q0;
            for (int64_t o = 0; o < g->Cout; o++)
                bacc[o] += nn_sum_f64(dyn + o * g->P, L);
            if (!acc) continue;
            for (int64_t gi = 0; gi < g->G; gi++) {
                const float *xg = J->x + (n * g->Cin + gi * g->Cg) * g->HW;
                const float *B;
                int ldb;
                if (pw) {
                    B = xg + q0;
                    ldb = (int)g->P;
                } else {
                    im2col_f32(g, xg, q0, q1, col);
                    B = col;
                    ldb = (int)L;
                }
                /* acc_g [Og, K] += dy_g [Og, L] @ col^T [L, K] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->Og,
                            (int)g->K, (int)L, 1.0f, dyn + gi * g->Og * g->P,
                            (int)g->P, B, ldb, 1.0f, acc + gi * g->Og * g->K,
                            (int)g->K);
            }
        }
    }
    free(col);
}

/* depthwise: per channel, images in order; sums in f64 */
static void dw_bwp_range(void *arg, int64_t c0, int64_t c1) {
    dw_job *J = arg;
    const cgeom *g = &J->g;
    int64_t kk = g->kh * g->kw;
    float *prod = malloc(sizeof(float) * (size_t)(g->Wo > 0 ? g->Wo : 1));
    if (!prod) { oom_flag(&J->oom); return; }
    for (int64_t c = c0; c < c1; c++) {
        double *wa = J->dwacc ? J->dwacc + c * kk : NULL;
        double bs = 0.0;
        if (wa)
            for (int64_t k = 0; k < kk; k++) wa[k] = 0.0;
        for (int64_t n = 0; n < g->N; n++) {
            const float *yc = J->dy + (n * g->Cout + c) * g->P;
            const float *xc = J->x + (n * g->Cin + c) * g->HW;
            bs += nn_sum_f64(yc, g->P);
            if (!wa) continue;
            for (int64_t uu = 0; uu < g->kh; uu++)
                for (int64_t v = 0; v < g->kw; v++) {
                    int64_t j0, j1, off = v * g->dw - g->pw;
                    valid_cols(g, v, &j0, &j1);
                    double s = 0.0;
                    for (int64_t i = 0; i < g->Ho; i++) {
                        int64_t hi = i * g->sh - g->ph + uu * g->dh;
                        if (hi < 0 || hi >= g->H || j0 >= j1) continue;
                        const float *yr = yc + i * g->Wo, *xr = xc + hi * g->W + off;
                        if (g->sw == 1)
                            for (int64_t j = j0; j < j1; j++) prod[j - j0] = yr[j] * xr[j];
                        else
                            for (int64_t j = j0; j < j1; j++)
                                prod[j - j0] = yr[j] * xr[j * g->sw];
                        s += nn_sum_f64(prod, j1 - j0);
                    }
                    wa[uu * g->kw + v] += s;
                }
        }
        J->dbacc[c] = bs;
    }
    free(prod);
}

/* dst (f32 or f64 parameter tensor) = beta*dst + src */
static void store_param(lucid_tensor *t, const double *src, int64_t n,
                        double beta) {
    nn_store_all(t, src, n, beta);
}

lucid_status cpu_conv2d_backward_params_f32(lucid_ctx *ctx,
                                            const lucid_tensor *xt,
                                            const float *x, const float *dy,
                                            int64_t Cout, int64_t kh,
                                            int64_t kw, int64_t Ho, int64_t Wo,
                                            lucid_tensor *dwt, lucid_tensor *db,
                                            const lucid_conv2d_params *p,
                                            double beta) {
    cgeom g = cgeom_of(xt, Cout, kh, kw, Ho, Wo, p);
    int64_t nw = g.Cout * g.K;
    double *wsum = NULL, *bsum = NULL;
    int oom = 0;
    int bt = blas_serial_begin();
    if (g.Cg == 1 && g.Og == 1) {
        wsum = dwt ? nn_scratch(ctx, nw, "conv2d backward_params") : NULL;
        bsum = nn_scratch(ctx, g.Cout, "conv2d backward_params");
        if ((dwt && !wsum) || !bsum) {
            free(wsum); free(bsum);
            blas_serial_end(bt);
            return LUCID_ERR_OOM;
        }
        dw_job J = {.g = g, .x = x, .dy = dy, .dwacc = wsum, .dbacc = bsum};
        nn_parallel(ctx, g.Cout, 1, dw_bwp_range, &J);
        oom = J.oom;
    } else {
        bwp_job J = {.g = g, .x = x, .dy = dy};
        col_tiles(g.P, &J.PB, &J.nPB);
        J.U = g.N * J.nPB;
        J.S = J.U < 8 ? J.U : 8;
        if (J.S < 1) J.S = 1;
        float *acc = dwt ? nn_scratch_f32(ctx, J.S * nw, "conv2d backward_params")
                         : NULL;
        double *bacc = nn_scratch(ctx, J.S * g.Cout, "conv2d backward_params");
        wsum = nn_scratch(ctx, nw > 0 ? nw : 1, "conv2d backward_params");
        bsum = nn_scratch(ctx, g.Cout, "conv2d backward_params");
        if ((dwt && !acc) || !bacc || !wsum || !bsum) {
            free(acc); free(bacc); free(wsum); free(bsum);
            blas_serial_end(bt);
            return LUCID_ERR_OOM;
        }
        J.acc = acc;
        J.bacc = bacc;
        nn_parallel(ctx, J.S, 1, bwp_range, &J);
        oom = J.oom;
        /* fixed-order reduction over the slots */
        if (dwt)
            for (int64_t i = 0; i < nw; i++) {
                double s = 0.0;
                for (int64_t k = 0; k < J.S; k++) s += acc[k * nw + i];
                wsum[i] = s;
            }
        for (int64_t o = 0; o < g.Cout; o++) {
            double s = 0.0;
            for (int64_t k = 0; k < J.S; k++) s += bacc[k * g.Cout + o];
            bsum[o] = s;
        }
        free(acc);
        free(bacc);
    }
    blas_serial_end(bt);
    if (oom) {
        free(wsum); free(bsum);
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "conv2d backward_params: out of host memory for the "
                            "im2col buffer");
    }
    if (dwt) store_param(dwt, wsum, nw, beta);
    if (db) store_param(db, bsum, g.Cout, beta);
    free(wsum);
    free(bsum);
    return LUCID_OK;
}
