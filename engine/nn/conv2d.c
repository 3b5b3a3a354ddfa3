/*
 * conv2d.c — Conv2d on the CPU: forward, backward-data, backward-weight/bias.
 *
 * Contract (see nn.h): x [N,Cin,H,W], w [Cout,Cin/g,kH,kW], b [Cout] or
 * NULL, y [N,Cout,Ho,Wo]; all contiguous.  forward overwrites y;
 * backward_input writes dx = beta*dx + ...; backward_params writes
 * dw = beta*dw + ..., db = beta*db + ... (beta 1 = accumulate).
 * Activations f32/f64/bf16/f16, parameters f32/f64.  f64 activations are
 * computed here in f64 and rounded once on store (the reference, for
 * gradient checks); f32 activations take the threaded f32 path of
 * conv2d_f32.c, and bf16/f16 activations are staged through f32 buffers
 * into that same path.
 *
 * f64 method: per image and group, im2col into col [K = Cin/g*kH*kW,
 * P = Ho*Wo] and one GEMM (OpenBLAS dgemm):  y_g = w_g @ col;  dcol =
 * w_g^T @ dy_g then col2im;  dw_g += dy_g @ col^T.  Depthwise convolutions
 * (one input and one output channel per group) take a direct loop instead.
 * This file also holds the scratch and f32 staging helpers of nn_cpu.h.
 * Source: PyTorch nn.Conv2d documentation; im2col as in Caffe / darknet.
 */
#include "nn/nn_cpu.h"
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// geometry

typedef struct conv_geom {
    int64_t N, Cin, H, W, Cout, Ho, Wo;
    int64_t kh, kw, G, Cg, Og, K, P;
    lucid_conv2d_params p;
} conv_geom;

static conv_geom geom_of(const lucid_tensor *x, const lucid_tensor *w,
                         const lucid_conv2d_params *p) {
    conv_geom g;
    g.N = x->shape[0]; g.Cin = x->shape[1]; g.H = x->shape[2]; g.W = x->shape[3];
    g.Cout = w->shape[0]; g.kh = w->shape[2]; g.kw = w->shape[3];
    g.G = p->groups; g.Cg = g.Cin / g.G; g.Og = g.Cout / g.G;
    g.Ho = lucid_nn_conv_out_size(g.H, (int)g.kh, p->stride_h, p->pad_h, p->dilation_h);
    g.Wo = lucid_nn_conv_out_size(g.W, (int)g.kw, p->stride_w, p->pad_w, p->dilation_w);
    g.K = g.Cg * g.kh * g.kw;
    g.P = g.Ho * g.Wo;
    g.p = *p;
    return g;
}

static int is_depthwise(const conv_geom *g) { return g->Cg == 1 && g->Og == 1; }

// ----------------------------------------------------------------------------
// im2col / col2im over one group of one image (x: [Cg, H, W] in f64)

static void im2col(const conv_geom *g, const double *x, double *col) {
    const lucid_conv2d_params *p = &g->p;
    for (int64_t c = 0; c < g->Cg; c++)
        for (int64_t u = 0; u < g->kh; u++)
            for (int64_t v = 0; v < g->kw; v++) {
                double *row = col + ((c * g->kh + u) * g->kw + v) * g->P;
                const double *xc = x + c * g->H * g->W;
                for (int64_t i = 0; i < g->Ho; i++) {
                    int64_t hi = i * p->stride_h - p->pad_h + u * p->dilation_h;
                    double *r = row + i * g->Wo;
                    if (hi < 0 || hi >= g->H) {
                        memset(r, 0, sizeof(double) * (size_t)g->Wo);
                        continue;
                    }
                    const double *xr = xc + hi * g->W;
                    for (int64_t j = 0; j < g->Wo; j++) {
                        int64_t wi = j * p->stride_w - p->pad_w + v * p->dilation_w;
                        r[j] = (wi >= 0 && wi < g->W) ? xr[wi] : 0.0;
                    }
                }
            }
}

static void col2im_add(const conv_geom *g, const double *col, double *x) {
    const lucid_conv2d_params *p = &g->p;
    for (int64_t c = 0; c < g->Cg; c++)
        for (int64_t u = 0; u < g->kh; u++)
            for (int64_t v = 0; v < g->kw; v++) {
                const double *row = col + ((c * g->kh + u) * g->kw + v) * g->P;
                double *xc = x + c * g->H * g->W;
                for (int64_t i = 0; i < g->Ho; i++) {
                    int64_t hi = i * p->stride_h - p->pad_h + u * p->dilation_h;
                    if (hi < 0 || hi >= g->H) continue;
                    const double *r = row + i * g->Wo;
                    double *xr = xc + hi * g->W;
                    for (int64_t j = 0; j < g->Wo; j++) {
                        int64_t wi = j * p->stride_w - p->pad_w + v * p->dilation_w;
                        if (wi >= 0 && wi < g->W) xr[wi] += r[j];
                    }
                }
            }
}

// ----------------------------------------------------------------------------
// scratch

double *nn_scratch(lucid_ctx *ctx, int64_t n, const char *what) {
    double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!p)
        lucid_seterr(ctx, LUCID_ERR_OOM,
                     "%s: out of host memory for a %lld-element f64 scratch "
                     "buffer",
                     what, (long long)n);
    return p;
}

float *nn_scratch_f32(lucid_ctx *ctx, int64_t n, const char *what) {
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1);
    bytes = (bytes + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (!p)
        lucid_seterr(ctx, LUCID_ERR_OOM,
                     "%s: out of host memory for a %lld-element f32 scratch "
                     "buffer",
                     what, (long long)n);
    return p;
}

static void to_f32(const void *p, lucid_dtype dt, float *dst, int64_t n) {
    switch (dt) {
    case LUCID_F32: memcpy(dst, p, sizeof(float) * (size_t)n); break;
    case LUCID_F64:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((const double *)p)[i];
        break;
    case LUCID_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = lucid_bf16_to_f32(((const uint16_t *)p)[i]);
        break;
    case LUCID_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = lucid_f16_to_f32(((const uint16_t *)p)[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)nn_ld(p, dt, i);
    }
}

float *nn_f32_in(lucid_ctx *ctx, const lucid_tensor *t, int *owned,
                 const char *what) {
    *owned = 0;
    if (t->dtype == LUCID_F32) return lucid_tensor_data(t);
    int64_t n = lucid_tensor_numel(t);
    float *b = nn_scratch_f32(ctx, n, what);
    if (!b) return NULL;
    to_f32(lucid_tensor_data(t), t->dtype, b, n);
    *owned = 1;
    return b;
}

float *nn_f32_out(lucid_ctx *ctx, lucid_tensor *t, int load, int *owned,
                  const char *what) {
    *owned = 0;
    if (t->dtype == LUCID_F32) return lucid_tensor_data(t);
    int64_t n = lucid_tensor_numel(t);
    float *b = nn_scratch_f32(ctx, n, what);
    if (!b) return NULL;
    if (load) to_f32(lucid_tensor_data(t), t->dtype, b, n);
    *owned = 1;
    return b;
}

void nn_f32_done(lucid_tensor *t, float *buf, int owned, int store) {
    if (!owned || !buf) return;
    if (store) {
        int64_t n = lucid_tensor_numel(t);
        void *p = lucid_tensor_data(t);
        switch (t->dtype) {
        case LUCID_BF16:
            for (int64_t i = 0; i < n; i++)
                ((uint16_t *)p)[i] = lucid_f32_to_bf16(buf[i]);
            break;
        case LUCID_F16:
            for (int64_t i = 0; i < n; i++)
                ((uint16_t *)p)[i] = lucid_f32_to_f16(buf[i]);
            break;
        default:
            for (int64_t i = 0; i < n; i++) nn_st(p, t->dtype, i, buf[i]);
        }
    }
    free(buf);
}

float *nn_f32_param(lucid_ctx *ctx, const lucid_tensor *t, const char *what) {
    int64_t n = lucid_tensor_numel(t);
    float *b = nn_scratch_f32(ctx, n, what);
    if (b) to_f32(lucid_tensor_data(t), t->dtype, b, n);
    return b;
}

// ----------------------------------------------------------------------------
// f32 dispatch (f32, bf16, f16 activations)

static lucid_status fwd_f32(lucid_ctx *ctx, const lucid_tensor *x,
                            lucid_tensor *y, const lucid_tensor *w,
                            const lucid_tensor *b,
                            const lucid_conv2d_params *p) {
    const char *what = "conv2d forward";
    int ox = 0, oy = 0;
    float *wb = nn_f32_param(ctx, w, what);
    float *bb = b ? nn_f32_param(ctx, b, what) : NULL;
    float *xb = nn_f32_in(ctx, x, &ox, what);
    float *yb = nn_f32_out(ctx, y, 0, &oy, what);
    lucid_status st = LUCID_ERR_OOM;
    if (wb && (!b || bb) && xb && yb)
        st = cpu_conv2d_forward_f32(ctx, x, xb, yb, w, wb, bb, y->shape[2],
                                    y->shape[3], p);
    nn_f32_done(y, yb, oy, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    free(wb);
    free(bb);
    return st;
}

static lucid_status bwi_f32(lucid_ctx *ctx, const lucid_tensor *dy,
                            lucid_tensor *dx, const lucid_tensor *w,
                            const lucid_conv2d_params *p, double beta) {
    const char *what = "conv2d backward_input";
    int ody = 0, odx = 0;
    float *wb = nn_f32_param(ctx, w, what);
    float *dyb = nn_f32_in(ctx, dy, &ody, what);
    float *dxb = nn_f32_out(ctx, dx, beta != 0.0, &odx, what);
    lucid_status st = LUCID_ERR_OOM;
    if (wb && dyb && dxb)
        st = cpu_conv2d_backward_input_f32(ctx, dx, dyb, dxb, w, wb, dy->shape[2],
                                           dy->shape[3], p, (float)beta);
    nn_f32_done(dx, dxb, odx, st == LUCID_OK);
    nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    free(wb);
    return st;
}

static lucid_status bwp_f32(lucid_ctx *ctx, const lucid_tensor *x,
                            const lucid_tensor *dy, lucid_tensor *dwt,
                            lucid_tensor *db, const lucid_conv2d_params *p,
                            double beta) {
    const char *what = "conv2d backward_params";
    int ox = 0, ody = 0;
    float *xb = dwt ? nn_f32_in(ctx, x, &ox, what) : NULL;
    float *dyb = nn_f32_in(ctx, dy, &ody, what);
    lucid_status st = LUCID_ERR_OOM;
    int64_t Cout = dy->shape[1];
    int64_t kh = dwt ? dwt->shape[2] : 1, kw = dwt ? dwt->shape[3] : 1;
    if ((!dwt || xb) && dyb)
        st = cpu_conv2d_backward_params_f32(ctx, x, xb, dyb, Cout, kh, kw,
                                            dy->shape[2], dy->shape[3], dwt, db,
                                            p, beta);
    nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

// ----------------------------------------------------------------------------
// forward

lucid_status cpu_conv2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                lucid_tensor *y, const lucid_tensor *w,
                                const lucid_tensor *b,
                                const lucid_conv2d_params *p) {
    if (x->dtype != LUCID_F64) return fwd_f32(ctx, x, y, w, b, p);
    conv_geom g = geom_of(x, w, p);
    int dw = is_depthwise(&g);
    int64_t img_in = g.Cin * g.H * g.W, img_out = g.Cout * g.P;
    double *wb = nn_scratch(ctx, g.Cout * g.K, "conv2d forward");
    double *xb = nn_scratch(ctx, img_in, "conv2d forward");
    double *yb = nn_scratch(ctx, img_out, "conv2d forward");
    double *col = dw ? NULL : nn_scratch(ctx, g.K * g.P, "conv2d forward");
    double *bb = nn_scratch(ctx, g.Cout, "conv2d forward");
    if (!wb || !xb || !yb || !bb || (!dw && !col)) {
        free(wb); free(xb); free(yb); free(col); free(bb);
        return LUCID_ERR_OOM;
    }
    nn_load_all(w, wb, g.Cout * g.K);
    if (b) nn_load_all(b, bb, g.Cout);
    else memset(bb, 0, sizeof(double) * (size_t)g.Cout);
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    for (int64_t n = 0; n < g.N; n++) {
        nn_load_block(xd, x->dtype, n * img_in, xb, img_in);
        if (dw) {
            /* depthwise: y[c,i,j] = b[c] + sum_uv w[c,u,v] x[c, ...] */
            for (int64_t c = 0; c < g.Cout; c++) {
                const double *xc = xb + c * g.H * g.W;
                const double *wc = wb + c * g.K;
                double *yc = yb + c * g.P;
                for (int64_t i = 0; i < g.Ho; i++)
                    for (int64_t j = 0; j < g.Wo; j++) {
                        double acc = bb[c];
                        for (int64_t u = 0; u < g.kh; u++) {
                            int64_t hi = i * p->stride_h - p->pad_h + u * p->dilation_h;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int64_t v = 0; v < g.kw; v++) {
                                int64_t wi = j * p->stride_w - p->pad_w + v * p->dilation_w;
                                if (wi < 0 || wi >= g.W) continue;
                                acc += wc[u * g.kw + v] * xc[hi * g.W + wi];
                            }
                        }
                        yc[i * g.Wo + j] = acc;
                    }
            }
        } else {
            for (int64_t gi = 0; gi < g.G; gi++) {
                im2col(&g, xb + gi * g.Cg * g.H * g.W, col);
                double *yg = yb + gi * g.Og * g.P;
                for (int64_t o = 0; o < g.Og; o++)
                    for (int64_t q = 0; q < g.P; q++) yg[o * g.P + q] = bb[gi * g.Og + o];
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                            (int)g.Og, (int)g.P, (int)g.K, 1.0,
                            wb + gi * g.Og * g.K, (int)g.K, col, (int)g.P, 1.0,
                            yg, (int)g.P);
            }
        }
        nn_store_block(yd, y->dtype, n * img_out, yb, img_out, 0.0);
    }
    free(wb); free(xb); free(yb); free(col); free(bb);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// backward: data

lucid_status cpu_conv2d_backward_input(lucid_ctx *ctx, const lucid_tensor *x,
                                       const lucid_tensor *dy, lucid_tensor *dx,
                                       const lucid_tensor *w,
                                       const lucid_conv2d_params *p,
                                       double beta) {
    if (dx->dtype != LUCID_F64) return bwi_f32(ctx, dy, dx, w, p, beta);
    conv_geom g = geom_of(dx, w, p);
    int dw = is_depthwise(&g);
    int64_t img_in = g.Cin * g.H * g.W, img_out = g.Cout * g.P;
    double *wb = nn_scratch(ctx, g.Cout * g.K, "conv2d backward_input");
    double *dxb = nn_scratch(ctx, img_in, "conv2d backward_input");
    double *dyb = nn_scratch(ctx, img_out, "conv2d backward_input");
    double *col = dw ? NULL : nn_scratch(ctx, g.K * g.P, "conv2d backward_input");
    if (!wb || !dxb || !dyb || (!dw && !col)) {
        free(wb); free(dxb); free(dyb); free(col);
        return LUCID_ERR_OOM;
    }
    nn_load_all(w, wb, g.Cout * g.K);
    const void *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    for (int64_t n = 0; n < g.N; n++) {
        nn_load_block(dyd, dy->dtype, n * img_out, dyb, img_out);
        memset(dxb, 0, sizeof(double) * (size_t)img_in);
        if (dw) {
            for (int64_t c = 0; c < g.Cout; c++) {
                double *xc = dxb + c * g.H * g.W;
                const double *wc = wb + c * g.K;
                const double *yc = dyb + c * g.P;
                for (int64_t i = 0; i < g.Ho; i++)
                    for (int64_t j = 0; j < g.Wo; j++) {
                        double gy = yc[i * g.Wo + j];
                        for (int64_t u = 0; u < g.kh; u++) {
                            int64_t hi = i * p->stride_h - p->pad_h + u * p->dilation_h;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int64_t v = 0; v < g.kw; v++) {
                                int64_t wi = j * p->stride_w - p->pad_w + v * p->dilation_w;
                                if (wi < 0 || wi >= g.W) continue;
                                xc[hi * g.W + wi] += wc[u * g.kw + v] * gy;
                            }
                        }
                    }
            }
        } else {
            for (int64_t gi = 0; gi < g.G; gi++) {
                /* dcol [K, P] = w_g^T [K, Og] @ dy_g [Og, P] */
                cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.K,
                            (int)g.P, (int)g.Og, 1.0, wb + gi * g.Og * g.K,
                            (int)g.K, dyb + gi * g.Og * g.P, (int)g.P, 0.0,
                            col, (int)g.P);
                col2im_add(&g, col, dxb + gi * g.Cg * g.H * g.W);
            }
        }
        nn_store_block(dxd, dx->dtype, n * img_in, dxb, img_in, beta);
    }
    (void)x;
    free(wb); free(dxb); free(dyb); free(col);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// backward: weight and bias

lucid_status cpu_conv2d_backward_params(lucid_ctx *ctx, const lucid_tensor *x,
                                        const lucid_tensor *dy,
                                        lucid_tensor *dwt, lucid_tensor *db,
                                        const lucid_conv2d_params *p,
                                        double beta) {
    if (x->dtype != LUCID_F64) return bwp_f32(ctx, x, dy, dwt, db, p, beta);
    /* geometry from x and the gradient's weight shape */
    const lucid_tensor *wshape = dwt;
    lucid_tensor tmp;
    if (!wshape) {
        /* bias only: weight shape is not needed beyond Cout */
        memset(&tmp, 0, sizeof tmp);
        tmp.ndim = 4;
        tmp.shape[0] = dy->shape[1];
        tmp.shape[1] = x->shape[1] / p->groups;
        tmp.shape[2] = tmp.shape[3] = 1;
        wshape = &tmp;
    }
    conv_geom g = geom_of(x, wshape, p);
    g.Ho = dy->shape[2]; g.Wo = dy->shape[3]; g.P = g.Ho * g.Wo;
    int dw = is_depthwise(&g);
    int64_t img_in = g.Cin * g.H * g.W, img_out = g.Cout * g.P;
    double *xb = NULL, *col = NULL, *acc = NULL;
    double *dyb = nn_scratch(ctx, img_out, "conv2d backward_params");
    double *bacc = nn_scratch(ctx, g.Cout, "conv2d backward_params");
    if (dwt) {
        xb = nn_scratch(ctx, img_in, "conv2d backward_params");
        acc = nn_scratch(ctx, g.Cout * g.K, "conv2d backward_params");
        if (!dw) col = nn_scratch(ctx, g.K * g.P, "conv2d backward_params");
    }
    if (!dyb || !bacc || (dwt && (!xb || !acc || (!dw && !col)))) {
        free(dyb); free(bacc); free(xb); free(col); free(acc);
        return LUCID_ERR_OOM;
    }
    if (acc) memset(acc, 0, sizeof(double) * (size_t)(g.Cout * g.K));
    memset(bacc, 0, sizeof(double) * (size_t)g.Cout);
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    for (int64_t n = 0; n < g.N; n++) {
        nn_load_block(dyd, dy->dtype, n * img_out, dyb, img_out);
        for (int64_t o = 0; o < g.Cout; o++) {
            double s = 0.0;
            for (int64_t q = 0; q < g.P; q++) s += dyb[o * g.P + q];
            bacc[o] += s;
        }
        if (!dwt) continue;
        nn_load_block(xd, x->dtype, n * img_in, xb, img_in);
        if (dw) {
            for (int64_t c = 0; c < g.Cout; c++) {
                const double *xc = xb + c * g.H * g.W;
                const double *yc = dyb + c * g.P;
                double *wc = acc + c * g.K;
                for (int64_t u = 0; u < g.kh; u++)
                    for (int64_t v = 0; v < g.kw; v++) {
                        double s = 0.0;
                        for (int64_t i = 0; i < g.Ho; i++) {
                            int64_t hi = i * p->stride_h - p->pad_h + u * p->dilation_h;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int64_t j = 0; j < g.Wo; j++) {
                                int64_t wi = j * p->stride_w - p->pad_w + v * p->dilation_w;
                                if (wi < 0 || wi >= g.W) continue;
                                s += yc[i * g.Wo + j] * xc[hi * g.W + wi];
                            }
                        }
                        wc[u * g.kw + v] += s;
                    }
            }
        } else {
            for (int64_t gi = 0; gi < g.G; gi++) {
                im2col(&g, xb + gi * g.Cg * g.H * g.W, col);
                /* acc_g [Og, K] += dy_g [Og, P] @ col^T [P, K] */
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.Og,
                            (int)g.K, (int)g.P, 1.0, dyb + gi * g.Og * g.P,
                            (int)g.P, col, (int)g.P, 1.0,
                            acc + gi * g.Og * g.K, (int)g.K);
            }
        }
    }
    if (dwt) nn_store_all(dwt, acc, g.Cout * g.K, beta);
    if (db) nn_store_all(db, bacc, g.Cout, beta);
    free(dyb); free(bacc); free(xb); free(col); free(acc);
    return LUCID_OK;
}
