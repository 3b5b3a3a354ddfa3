/*
 * optim_cpu.c — CPU reference kernels of the optimizers (SGD, AdamW,
 * MuSGD with Newton–Schulz) and the CPU kernel table.
 *
 * Contract
 *   - Element formulas follow the PyTorch / Ultralytics code operation by
 *     operation, each operation rounded to f32 (no FMA; cuda/optim.cu does
 *     the same with __fmul_rn/__fadd_rn, so elementwise updates are bitwise
 *     equal on both devices):
 *       SGD (torch.optim.SGD, dampening 0):
 *         d = g (+ wd*p when wd != 0); buf = buf*mu + d;
 *         u = nesterov ? d + mu*buf : buf;  p = p + (-lr)*u
 *       AdamW (torch.optim.AdamW, t = step after increment):
 *         p = p*(1 - lr*wd); m = lerp(m, g, 1-b1); v = v*b2 + (1-b2)*(g*g);
 *         den = sqrt(v)/sqrt(1-b2^t) + eps; p = p + (-lr/(1-b1^t))*(m/den)
 *         lerp(a, b, w) = |w| < 0.5 ? a + w*(b-a) : b - (b-a)*(1-w) (ATen)
 *       MuSGD (reference §6, Ultralytics muon.py), muon segments:
 *         m = lerp(m, g, 1-mu); u = nesterov ? lerp(g, m, mu) : m;
 *         O = NS5(u as (rows, cols)) * sqrt(max(1, shape[-2]/shape[-1]));
 *         p = p + f32(-(lr*muon))*O;  g2 = g (+ wd*p when wd != 0);
 *         b = b*mu + g2; v = nesterov ? g2 + mu*b : b; p = p + f32(-(lr*sgd))*v
 *       other segments: SGD as above (Ultralytics MuSGD's SGD branch).
 *   - NS5 (zeropower_via_newtonschulz5): X = u/(||u||_F + 1e-7), transposed
 *     when rows > cols; 5 x { A = X X^T; B = b*A + (c*A) @ A; X = a*X + B@X }
 *     with (a,b,c) = (3.4445, -4.7750, 2.0315); transposed back. With
 *     in.ns_bf16 every intermediate is rounded to bf16 where the reference
 *     computes in bf16 (products accumulate in f32, as cuBLAS does);
 *     otherwise everything stays f32. GEMMs go through OpenBLAS.
 *   - Skips (found_inf) and the step counter: lucid_pb_optim_prep.
 */
#include "train/optim_backend.h"
#include <cblas.h>
#include <string.h>

static inline float lerpf_aten(float a, float b, float w) {
    return (w < 0.5f && w > -0.5f) ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

static inline float alpha_of(float lr, float scale) {
    return (float)(-((double)lr * (double)scale));
}

/* One SGD element; returns the new parameter. */
static inline float sgd_elem(float p, float g, float *buf, float lr, float mu,
                             float wd, int nesterov) {
    float d = g;
    if (wd != 0.0f) d = d + wd * p;
    float b = *buf * mu;
    b = b + d;
    *buf = b;
    float u = nesterov ? d + mu * b : b;
    return p + (-lr) * u;
}

static void sgd_cpu(const lucid_param_layout *l, const lucid_param_values *v,
                    float *param, const float *grad, float *buf) {
    for (int c = 0; c < l->nchunks_train; c++) {
        const lucid_chunk *ch = &l->chunks_train_host[c];
        int s = l->seg_host[ch->seg].slot;
        float lr = v->in.lr[s], mu = v->in.momentum[s], wd = v->in.weight_decay[s];
        for (int64_t i = ch->start; i < ch->start + ch->len; i++)
            param[i] = sgd_elem(param[i], grad[i], &buf[i], lr, mu, wd,
                                v->in.nesterov);
    }
}

static void adamw_cpu(const lucid_param_layout *l, const lucid_param_values *v,
                      float *param, const float *grad, float *m, float *vv) {
    float eps = v->in.eps;
    float omb2 = (float)(1.0 - (double)v->in.beta2), b2 = v->in.beta2;
    for (int c = 0; c < l->nchunks_train; c++) {
        const lucid_chunk *ch = &l->chunks_train_host[c];
        int s = l->seg_host[ch->seg].slot;
        float w1 = (float)(1.0 - (double)v->in.momentum[s]);
        float dm = v->st.decay_mul[s], bc2 = v->st.bc2_sqrt[s];
        float nss = -v->st.step_size[s];
        for (int64_t i = ch->start; i < ch->start + ch->len; i++) {
            float g = grad[i];
            float p = param[i] * dm;
            float mi = lerpf_aten(m[i], g, w1);
            float gg = g * g;
            float vi = vv[i] * b2;
            vi = vi + omb2 * gg;
            float den = sqrtf(vi) / bc2;
            den = den + eps;
            float q = mi / den;
            param[i] = p + nss * q;
            m[i] = mi;
            vv[i] = vi;
        }
    }
}

/* ---------------------------------------------------------- Newton–Schulz */

static inline float rb(float x, int on) {
    return on ? lucid_bf16_to_f32(lucid_f32_to_bf16(x)) : x;
}

/* The norm fold of optim_backend.h over n contiguous values. */
static float sumsq_fold(const float *x, int64_t n) {
    float lanes[LUCID_OPTIM_THREADS];
    for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
        float s = 0.0f;
        for (int64_t j = t; j < n; j += LUCID_OPTIM_THREADS) {
            float sq = x[j] * x[j];
            s = s + sq;
        }
        lanes[t] = s;
    }
    for (int h = LUCID_OPTIM_THREADS / 2; h > 0; h >>= 1)
        for (int t = 0; t < h; t++) lanes[t] = lanes[t] + lanes[t + h];
    return lanes[0];
}

/* In: u (rows x cols, row-major) in `u`. Out: O in `u` (same layout).
 * work: >= numel + 3*min(rows,cols)^2 floats besides u. */
static void ns5_cpu(float *u, int rows, int cols, float shape_scale, int bf,
                    float *work) {
    int64_t n = (int64_t)rows * cols;
    int tr = rows > cols;
    int m = tr ? cols : rows, k = tr ? rows : cols; /* X is m x k, m <= k */
    float *X = work, *A = X + n, *T = A + (int64_t)m * m, *B = T + (int64_t)m * m;
    for (int64_t i = 0; i < n; i++) u[i] = rb(u[i], bf);
    float nrm = rb(sqrtf(sumsq_fold(u, n)), bf);
    float den = rb(nrm + LUCID_NS_EPS, bf);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float x = rb(u[(int64_t)r * cols + c] / den, bf);
            if (tr) X[(int64_t)c * rows + r] = x;
            else X[(int64_t)r * cols + c] = x;
        }
    float *Y = u; /* u's storage is free now: reuse it for B@X */
    for (int it = 0; it < LUCID_NS_STEPS; it++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, k, 1.0f, X,
                    k, X, k, 0.0f, A, m);
        for (int64_t i = 0; i < (int64_t)m * m; i++) {
            A[i] = rb(A[i], bf);
            T[i] = rb(LUCID_NS_C * A[i], bf);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, T,
                    m, A, m, 0.0f, B, m);
        for (int64_t i = 0; i < (int64_t)m * m; i++) {
            float ba = rb(LUCID_NS_B * A[i], bf);
            B[i] = rb(ba + rb(B[i], bf), bf);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, m, 1.0f, B,
                    m, X, k, 0.0f, Y, k);
        for (int64_t i = 0; i < n; i++) {
            float ax = rb(LUCID_NS_A * X[i], bf);
            X[i] = rb(ax + rb(Y[i], bf), bf);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float x = tr ? X[(int64_t)c * rows + r] : X[(int64_t)r * cols + c];
            if (shape_scale != 1.0f) x = rb(x * shape_scale, bf);
            u[(int64_t)r * cols + c] = x;
        }
}

static void musgd_cpu(const lucid_param_layout *l, const lucid_param_values *v,
                      float *param, const float *grad, float *buf, float *bsgd,
                      float *work) {
    int nest = v->in.nesterov, bf = v->in.ns_bf16;
    for (int si = 0; si < l->nsegs; si++) {
        const lucid_seg_info *sg = &l->seg_host[si];
        if (!(sg->flags & LUCID_SEG_TRAINABLE) || sg->numel == 0) continue;
        int s = sg->slot;
        float lr = v->in.lr[s], mu = v->in.momentum[s], wd = v->in.weight_decay[s];
        int64_t o = sg->offset, n = sg->numel;
        if (!(sg->flags & LUCID_SEG_MUON)) {
            for (int64_t i = o; i < o + n; i++)
                param[i] = sgd_elem(param[i], grad[i], &buf[i], lr, mu, wd, nest);
            continue;
        }
        float *U = work;              /* u, then O */
        float *W = work + n;          /* NS scratch */
        float w1 = (float)(1.0 - (double)mu);
        for (int64_t j = 0; j < n; j++) {
            float g = grad[o + j];
            float mi = lerpf_aten(buf[o + j], g, w1);
            buf[o + j] = mi;
            U[j] = nest ? lerpf_aten(g, mi, mu) : mi;
        }
        ns5_cpu(U, sg->rows, sg->cols, sg->muon_shape_scale, bf, W);
        float am = alpha_of(lr, v->in.muon_scale), as = alpha_of(lr, v->in.sgd_scale);
        for (int64_t j = 0; j < n; j++) {
            int64_t i = o + j;
            float p = param[i] + am * U[j];
            float d = grad[i];
            if (wd != 0.0f) d = d + wd * p;
            float b = bsgd[i] * mu;
            b = b + d;
            bsgd[i] = b;
            float u = nest ? d + mu * b : b;
            param[i] = p + as * u;
        }
    }
}

static lucid_status cpu_optim_step(lucid_ctx *ctx, const lucid_param_layout *l,
                                   lucid_param_values *blk,
                                   lucid_optim_kind kind, float *param,
                                   const float *grad, float *s0, float *s1,
                                   float *work) {
    if (!lucid_pb_optim_prep(blk, kind)) return LUCID_OK;
    switch (kind) {
    case LUCID_OPTIM_SGD: sgd_cpu(l, blk, param, grad, s0); break;
    case LUCID_OPTIM_ADAMW: adamw_cpu(l, blk, param, grad, s0, s1); break;
    case LUCID_OPTIM_MUSGD: musgd_cpu(l, blk, param, grad, s0, s1, work); break;
    default:
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: unknown kind %d",
                            (int)kind);
    }
    return LUCID_OK;
}

static lucid_status cpu_h2d(lucid_ctx *ctx, void *dst, const void *src,
                            size_t n, int async) {
    memcpy(dst, src, n);
    return LUCID_OK;
}

static lucid_status cpu_d2h(lucid_ctx *ctx, void *dst, const void *src,
                            size_t n) {
    memcpy(dst, src, n);
    return LUCID_OK;
}

static const lucid_optim_kernels cpu_table = {
    .grad_unscale = lucid_cpu_grad_unscale,
    .grad_norm = lucid_cpu_grad_norm,
    .grad_clip_value = lucid_cpu_grad_clip_value,
    .optim_step = cpu_optim_step,
    .scaler_update = lucid_cpu_scaler_update,
    .scale = lucid_cpu_scale,
    .ema_update = lucid_cpu_ema_update,
    .memcpy_h2d = cpu_h2d,
    .memcpy_d2h = cpu_d2h,
};

const lucid_optim_kernels *lucid_optim_cpu_kernels(void) { return &cpu_table; }
