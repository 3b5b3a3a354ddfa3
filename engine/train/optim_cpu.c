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
 *     ||u||_F^2 is summed in the chunked order of optim_backend.h (the
 *     CUDA kernels use the same order: that norm is bitwise equal).
 *   - Skips (found_inf) and the step counter: lucid_pb_optim_prep.
 *   - One entry point for lucid_optim_step (call flags 0) and
 *     lucid_optim_step_fused: the element pass applies, per gradient
 *     element and in this order, g*inv (unscale, scaler on, inv != 1),
 *     g*coef (clip_norm), clamp(-c, c) (clip_value) — the same roundings
 *     as the separate calls, which store each intermediate in f32 — then
 *     the update, then the EMA of the new parameter. The scalar work runs
 *     first through lucid_pb_chain. So the fused step is bitwise equal to
 *     the separate calls, and cuda/optim.cu repeats this arithmetic.
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

/* One AdamW element (scalars of the chunk's slot); returns the new p. */
static inline float adamw_elem(float p0, float g, float *m, float *vv,
                               float w1, float b2, float omb2, float dm,
                               float bc2, float nss, float eps) {
    float p = p0 * dm;
    float mi = lerpf_aten(*m, g, w1);
    float gg = g * g;
    float vi = *vv * b2;
    vi = vi + omb2 * gg;
    float den = sqrtf(vi) / bc2;
    den = den + eps;
    float q = mi / den;
    *m = mi;
    *vv = vi;
    return p + nss * q;
}

/* The gradient processing of the element pass (see the contract). */
typedef struct gproc {
    int scale, norm, value;
    float inv, coef, cv;
} gproc;

static inline float gproc_apply(const gproc *q, float x) {
    if (q->scale) x = x * q->inv;
    if (q->norm) x = x * q->coef;
    if (q->value) {
        if (x < -q->cv) x = -q->cv; /* clamp_min(-c); NaN compares false */
        if (x > q->cv) x = q->cv;   /* then clamp_max(c) */
    }
    return x;
}

static inline void ema_elem(float *e, float p, float d, float omd) {
    float x = *e * d;
    float y = omd * p;
    *e = x + y;
}

/* ---------------------------------------------------------- Newton–Schulz */

static inline float rb(float x, int on) {
    return on ? lucid_bf16_to_f32(lucid_f32_to_bf16(x)) : x;
}

float lucid_cpu_muon_sumsq(const float *u, int64_t n) {
    /* lane t of the partial fold sums partials t, t+T, ... in order: the
     * same sums accumulated as the partials come */
    float lanes[LUCID_OPTIM_THREADS] = {0};
    for (int64_t c = 0; c * LUCID_OPTIM_CHUNK < n; c++) {
        int64_t s0 = c * LUCID_OPTIM_CHUNK, len = n - s0;
        if (len > LUCID_OPTIM_CHUNK) len = LUCID_OPTIM_CHUNK;
        float *l = &lanes[c % LUCID_OPTIM_THREADS];
        *l = *l + lucid_fold_sumsq(u + s0, len);
    }
    return lucid_fold_tree(lanes);
}

void lucid_cpu_ns5_iterate(float *X, int M, int K, int bf, float *gram3,
                           float *Y) {
    int64_t n = (int64_t)M * K, mm = (int64_t)M * M;
    float *A = gram3, *T = A + mm, *B = T + mm;
    for (int it = 0; it < LUCID_NS_STEPS; it++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, M, K, 1.0f, X,
                    K, X, K, 0.0f, A, M);
        for (int64_t i = 0; i < mm; i++) {
            A[i] = rb(A[i], bf);
            T[i] = rb(LUCID_NS_C * A[i], bf);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, T,
                    M, A, M, 0.0f, B, M);
        for (int64_t i = 0; i < mm; i++) {
            float ba = rb(LUCID_NS_B * A[i], bf);
            B[i] = rb(ba + rb(B[i], bf), bf);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, M, 1.0f, B,
                    M, X, K, 0.0f, Y, K);
        for (int64_t i = 0; i < n; i++) {
            float ax = rb(LUCID_NS_A * X[i], bf);
            X[i] = rb(ax + rb(Y[i], bf), bf);
        }
    }
}

/* In: u (rows x cols, row-major) in `u`. Out: O in `u` (same layout).
 * work: >= numel + 3*min(rows,cols)^2 floats besides u. */
static void ns5_cpu(float *u, int rows, int cols, float shape_scale, int bf,
                    float *work) {
    int64_t n = (int64_t)rows * cols;
    int tr = rows > cols;
    int m = tr ? cols : rows, k = tr ? rows : cols; /* X is m x k, m <= k */
    float *X = work, *A = X + n;
    for (int64_t i = 0; i < n; i++) u[i] = rb(u[i], bf);
    float nrm = rb(sqrtf(lucid_cpu_muon_sumsq(u, n)), bf);
    float den = rb(nrm + LUCID_NS_EPS, bf);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float x = rb(u[(int64_t)r * cols + c] / den, bf);
            if (tr) X[(int64_t)c * rows + r] = x;
            else X[(int64_t)r * cols + c] = x;
        }
    /* u's storage is free now: reuse it for B@X */
    lucid_cpu_ns5_iterate(X, m, k, bf, A, u);
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

/* EMA of every element of the chunk list (the EMA-only blocks). */
static void ema_chunks(const lucid_chunk *ch, int n, float *e, const float *p,
                       float d, float omd) {
    for (int c = 0; c < n; c++)
        for (int64_t i = ch[c].start; i < ch[c].start + ch[c].len; i++)
            ema_elem(&e[i], p[i], d, omd);
}

static lucid_status cpu_optim_step(lucid_ctx *ctx, const lucid_param_layout *l,
                                   lucid_param_values *v,
                                   const lucid_step_call *call) {
    const int f = call->flags;
    const lucid_optim_kind kind = call->kind;
    if ((unsigned)kind >= LUCID_OPTIM_KIND_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: unknown kind %d",
                            (int)kind);
    float *param = call->param, *grad = call->grad;
    /* 1. the unscale check and the norm over the processed gradients */
    gproc q = {0};
    int uns = (f & LUCID_STEP_UNSCALE) && v->in.scaler_enabled;
    if (uns) {
        q.inv = lucid_pb_inv_scale(v->st.loss_scale);
        q.scale = q.inv != 1.0f;
        int found = 0;
        for (int c = 0; c < l->nchunks_train; c++) {
            const lucid_chunk *ch = &l->chunks_train_host[c];
            for (int64_t i = ch->start; i < ch->start + ch->len; i++)
                if (!(grad[i] - grad[i] == 0.0f)) found = 1;
        }
        if (found) v->st.found_inf = 1;
    }
    float sumsq = 0.0f;
    if (f & LUCID_STEP_CLIP_NORM) {
        float *part = lucid_tensor_data(l->partials);
        float lanes[LUCID_OPTIM_THREADS];
        for (int c = 0; c < l->nchunks_train; c++) {
            const lucid_chunk *ch = &l->chunks_train_host[c];
            for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
                float s = 0.0f;
                for (int64_t j = t; j < ch->len; j += LUCID_OPTIM_THREADS) {
                    float x = grad[ch->start + j];
                    if (q.scale) x = x * q.inv;
                    float sq = x * x;
                    s = s + sq;
                }
                lanes[t] = s;
            }
            part[c] = lucid_fold_tree(lanes);
        }
        sumsq = lucid_fold_sum(part, l->nchunks_train);
    }
    /* 2. the scalar chain */
    lucid_pb_chain(v, f, kind, sumsq);
    const int skip = v->st.step_skipped;
    q.norm = (f & LUCID_STEP_CLIP_NORM) != 0;
    q.coef = v->st.clip_coef;
    q.value = (f & LUCID_STEP_CLIP_VALUE) != 0;
    q.cv = v->in.clip_value;
    const int proc = q.scale || q.norm || q.value;
    const int ema = (f & LUCID_STEP_EMA_BIT) != 0;
    const float d = v->st.ema_d, omd = v->st.ema_1md;
    /* 3. the element pass */
    if (kind == LUCID_OPTIM_MUSGD) {
        if (proc)
            for (int c = 0; c < l->nchunks_train; c++) {
                const lucid_chunk *ch = &l->chunks_train_host[c];
                for (int64_t i = ch->start; i < ch->start + ch->len; i++)
                    grad[i] = gproc_apply(&q, grad[i]);
            }
        if (!skip) musgd_cpu(l, v, param, grad, call->s0, call->s1, call->work);
        if (ema) ema_chunks(l->chunks_all_host, l->nchunks_all, call->ema, param, d, omd);
    } else {
        const int keep = proc && (f & LUCID_STEP_KEEP_GRADS);
        float eps = v->in.eps, b2 = v->in.beta2;
        float omb2 = (float)(1.0 - (double)b2);
        for (int c = 0; c < l->nchunks_train; c++) {
            const lucid_chunk *ch = &l->chunks_train_host[c];
            int s = l->seg_host[ch->seg].slot;
            float lr = v->in.lr[s], mu = v->in.momentum[s], wd = v->in.weight_decay[s];
            float w1 = (float)(1.0 - (double)mu);
            float dm = v->st.decay_mul[s], bc2 = v->st.bc2_sqrt[s];
            float nss = -v->st.step_size[s];
            for (int64_t i = ch->start; i < ch->start + ch->len; i++) {
                float x = proc ? gproc_apply(&q, grad[i]) : grad[i];
                if (!skip) {
                    if (kind == LUCID_OPTIM_SGD)
                        param[i] = sgd_elem(param[i], x, &call->s0[i], lr, mu, wd,
                                            v->in.nesterov);
                    else
                        param[i] = adamw_elem(param[i], x, &call->s0[i], &call->s1[i],
                                              w1, b2, omb2, dm, bc2, nss, eps);
                }
                if (ema) ema_elem(&call->ema[i], param[i], d, omd);
                if (keep) grad[i] = x;
            }
        }
        if (ema)
            ema_chunks(l->chunks_frozen_host, l->nchunks_frozen, call->ema, param, d, omd);
    }
    if (f & LUCID_STEP_AUX_BIT)
        ema_chunks(call->aux_layout->chunks_all_host, call->aux_layout->nchunks_all,
                   call->aux_ema, call->aux, d, omd);
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
