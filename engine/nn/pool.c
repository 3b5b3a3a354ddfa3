/*
 * pool.c — MaxPool2d on the CPU, forward and backward.
 *
 * Contract (see nn.h): x [N,C,H,W] -> y [N,C,Ho,Wo], contiguous, padding
 * -inf, dilation 1, floor mode.  Ties go to the first maximum in row-major
 * window order (strictly-greater replaces).  indices (nullable, i32
 * [N,C,Ho,Wo]) receive h*W + w of the argmax in its plane; the backward
 * uses them when given, else recomputes the argmax from x.
 *   forward overwrites y (and indices); backward: dx = beta*dx + scatter(dy).
 * f64 tensors: the reference loops below.  f32 tensors (bf16/f16 staged
 * through f32): separable window search (the max over each window row, then
 * over the rows, with the same tie and NaN rules, so the same argmax as the
 * row-major scan), threaded over (image, channel) planes.
 * Source: PyTorch nn.MaxPool2d documentation.
 */
#include "nn/nn_cpu.h"
NN_VECTORIZE_FILE
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* v replaces the current best m (first valid always wins: caller) */
static inline int better(float v, float m) {
    return v > m || (isnan(v) && !isnan(m));
}

typedef struct pool_job {
    int64_t H, W, Ho, Wo;
    const lucid_pool2d_params *p;
    const float *x, *dy;
    float *y, *dx;
    int32_t *idx;        /* forward output (nullable) */
    const int32_t *iin;  /* backward input (nullable: recompute) */
    float beta;
    int oom;
} pool_job;

/* argmax of every window of plane x into ym (nullable) and im */
static void plane_argmax(const pool_job *J, const float *x, float *ym,
                         int32_t *im, float *rv, int32_t *ri) {
    const lucid_pool2d_params *p = J->p;
    int64_t H = J->H, W = J->W, Ho = J->Ho, Wo = J->Wo;
    /* row pass: rv/ri [H, Wo] = max over the window columns of row h */
    for (int64_t h = 0; h < H; h++) {
        const float *xr = x + h * W;
        for (int64_t j = 0; j < Wo; j++) {
            int64_t w0 = j * p->stride_w - p->pad_w, b = -1;
            float m = -INFINITY;
            for (int64_t v = 0; v < p->kernel_w; v++) {
                int64_t wi = w0 + v;
                if (wi < 0 || wi >= W) continue;
                if (b < 0 || better(xr[wi], m)) {
                    m = xr[wi];
                    b = wi;
                }
            }
            rv[h * Wo + j] = m;
            ri[h * Wo + j] = (int32_t)b;
        }
    }
    /* column pass over the window rows */
    for (int64_t i = 0; i < Ho; i++)
        for (int64_t j = 0; j < Wo; j++) {
            int64_t h0 = i * p->stride_h - p->pad_h, b = -1;
            float m = -INFINITY;
            for (int64_t u = 0; u < p->kernel_h; u++) {
                int64_t hi = h0 + u;
                if (hi < 0 || hi >= H || ri[hi * Wo + j] < 0) continue;
                if (b < 0 || better(rv[hi * Wo + j], m)) {
                    m = rv[hi * Wo + j];
                    b = hi * W + ri[hi * Wo + j];
                }
            }
            if (ym) ym[i * Wo + j] = m;
            im[i * Wo + j] = (int32_t)b;
        }
}

static void pool_fwd_range(void *arg, int64_t p0, int64_t p1) {
    pool_job *J = arg;
    int64_t HW = J->H * J->W, P = J->Ho * J->Wo;
    float *rv = malloc(sizeof(float) * (size_t)(J->H * J->Wo + 1));
    int32_t *ri = malloc(sizeof(int32_t) * (size_t)(J->H * J->Wo + 1));
    int32_t *tmp = J->idx ? NULL : malloc(sizeof(int32_t) * (size_t)(P + 1));
    if (!rv || !ri || (!J->idx && !tmp)) {
        __atomic_store_n(&J->oom, 1, __ATOMIC_RELAXED);
    } else {
        for (int64_t pl = p0; pl < p1; pl++)
            plane_argmax(J, J->x + pl * HW, J->y + pl * P,
                         J->idx ? J->idx + pl * P : tmp, rv, ri);
    }
    free(rv); free(ri); free(tmp);
}

static void pool_bwd_range(void *arg, int64_t p0, int64_t p1) {
    pool_job *J = arg;
    int64_t HW = J->H * J->W, P = J->Ho * J->Wo;
    float *plane = malloc(sizeof(float) * (size_t)(HW + 1));
    float *rv = J->iin ? NULL : malloc(sizeof(float) * (size_t)(J->H * J->Wo + 1));
    int32_t *ri = J->iin ? NULL : malloc(sizeof(int32_t) * (size_t)(J->H * J->Wo + 1));
    int32_t *tmp = J->iin ? NULL : malloc(sizeof(int32_t) * (size_t)(P + 1));
    if (!plane || (!J->iin && (!rv || !ri || !tmp))) {
        __atomic_store_n(&J->oom, 1, __ATOMIC_RELAXED);
    } else {
        for (int64_t pl = p0; pl < p1; pl++) {
            const int32_t *id;
            if (J->iin) {
                id = J->iin + pl * P;
            } else {
                plane_argmax(J, J->x + pl * HW, NULL, tmp, rv, ri);
                id = tmp;
            }
            const float *g = J->dy + pl * P;
            memset(plane, 0, sizeof(float) * (size_t)HW);
            for (int64_t o = 0; o < P; o++)
                if (id[o] >= 0) plane[id[o]] += g[o];
            nn_f32_axpby(J->dx + pl * HW, plane, HW, J->beta);
        }
    }
    free(plane); free(rv); free(ri); free(tmp);
}

static int64_t plane_grain(int64_t per) {
    return per >= NN_GRAIN / 4 ? 1 : (NN_GRAIN / 4 + per - 1) / (per > 0 ? per : 1);
}

static lucid_status pool_f32(lucid_ctx *ctx, const lucid_tensor *x,
                             const lucid_tensor *dy, lucid_tensor *out,
                             lucid_tensor *idx, const lucid_tensor *iin,
                             const lucid_pool2d_params *p, double beta) {
    const char *what = dy ? "maxpool2d backward" : "maxpool2d forward";
    int ox = 0, ody = 0, oo = 0;
    int need_x = !dy || !iin;
    float *xb = need_x ? nn_f32_in(ctx, x, &ox, what) : NULL;
    float *dyb = dy ? nn_f32_in(ctx, dy, &ody, what) : NULL;
    float *ob = nn_f32_out(ctx, out, dy && beta != 0.0, &oo, what);
    lucid_status st = LUCID_ERR_OOM;
    if ((!need_x || xb) && (!dy || dyb) && ob) {
        pool_job J = {.H = x->shape[2], .W = x->shape[3], .p = p, .x = xb,
                      .dy = dyb, .idx = idx ? lucid_tensor_data(idx) : NULL,
                      .iin = iin ? lucid_tensor_data(iin) : NULL,
                      .beta = (float)beta};
        const lucid_tensor *yt = dy ? dy : out;
        J.Ho = yt->shape[2];
        J.Wo = yt->shape[3];
        if (dy) J.dx = ob;
        else J.y = ob;
        int64_t NC = x->shape[0] * x->shape[1];
        nn_parallel(ctx, NC, plane_grain(J.H * J.W), dy ? pool_bwd_range : pool_fwd_range,
                    &J);
        st = J.oom ? lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of host memory", what)
                   : LUCID_OK;
    }
    nn_f32_done(out, ob, oo, st == LUCID_OK);
    if (xb) nn_f32_done((lucid_tensor *)x, xb, ox, 0);
    if (dy) nn_f32_done((lucid_tensor *)dy, dyb, ody, 0);
    return st;
}

/* argmax (flat h*W+w) of the window of output (i, j) in plane xp, or -1
 * when the window holds only padding (cannot happen for pad <= k/2). */
static int64_t window_argmax(const void *xp, lucid_dtype dt, int64_t base,
                             int64_t H, int64_t W, int64_t i, int64_t j,
                             const lucid_pool2d_params *p, double *maxv) {
    int64_t best = -1;
    double m = -INFINITY;
    for (int64_t u = 0; u < p->kernel_h; u++) {
        int64_t hi = i * p->stride_h - p->pad_h + u;
        if (hi < 0 || hi >= H) continue;
        for (int64_t v = 0; v < p->kernel_w; v++) {
            int64_t wi = j * p->stride_w - p->pad_w + v;
            if (wi < 0 || wi >= W) continue;
            double val = nn_ld(xp, dt, base + hi * W + wi);
            if (best < 0 || val > m || (isnan(val) && !isnan(m))) {
                m = val;
                best = hi * W + wi;
            }
        }
    }
    *maxv = m;
    return best;
}

lucid_status cpu_maxpool2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y, lucid_tensor *indices,
                                   const lucid_pool2d_params *p) {
    if (x->dtype != LUCID_F64) return pool_f32(ctx, x, NULL, y, indices, NULL, p, 0.0);
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Ho = y->shape[2], Wo = y->shape[3];
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    int32_t *id = indices ? lucid_tensor_data(indices) : NULL;
    for (int64_t pl = 0; pl < NC; pl++)
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                double m;
                int64_t a = window_argmax(xd, x->dtype, pl * H * W, H, W, i, j,
                                          p, &m);
                int64_t o = (pl * Ho + i) * Wo + j;
                nn_st(yd, y->dtype, o, m);
                if (id) id[o] = (int32_t)a;
            }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_maxpool2d_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dx,
                                    const lucid_tensor *indices,
                                    const lucid_pool2d_params *p, double beta) {
    if (x->dtype != LUCID_F64)
        return pool_f32(ctx, x, dy, dx, NULL, indices, p, beta);
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Ho = dy->shape[2], Wo = dy->shape[3];
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    const int32_t *id = indices ? lucid_tensor_data(indices) : NULL;
    double *plane = nn_scratch(ctx, H * W, "maxpool2d backward");
    if (!plane) return LUCID_ERR_OOM;
    for (int64_t pl = 0; pl < NC; pl++) {
        memset(plane, 0, sizeof(double) * (size_t)(H * W));
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                int64_t o = (pl * Ho + i) * Wo + j, a;
                if (id) {
                    a = id[o];
                } else {
                    double m;
                    a = window_argmax(xd, x->dtype, pl * H * W, H, W, i, j, p, &m);
                }
                if (a >= 0) plane[a] += nn_ld(dyd, dy->dtype, o);
            }
        for (int64_t k = 0; k < H * W; k++)
            nn_st_beta(dxd, dx->dtype, pl * H * W + k, plane[k], beta);
    }
    free(plane);
    return LUCID_OK;
}
