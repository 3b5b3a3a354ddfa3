/*
 * test_optim.c — optimizers (SGD, AdamW, MuSGD), the parameter block, EMA,
 * layout validation and the schedule formulas, on the CPU.
 *
 * Every optimizer runs several steps with state and a schedule that moves
 * lr/momentum between steps, against an independent float64
 * implementation written here from the PyTorch / Ultralytics formulas.
 * Schedule values are checked against numbers computed by hand.
 *
 * The fused step (lucid_optim_step_fused) runs against the separate calls
 * it replaces (unscale, clip_norm, clip_value, optim_step, scaler_update,
 * ema_update x2) over steps with clipping, huge and non-finite gradients,
 * a scaler skip, EMA of params and of BN buffers: bitwise equal on the CPU.
 * Newton–Schulz on a zero-padded matrix is checked against the unpadded
 * one (the padding the CUDA buckets rely on), and the Muon bucket plan's
 * invariants are checked on a layout with many shapes.
 */
#include "test_optim_fixture.h"
#include "internal.h"
#include "train/optim_backend.h"
#include <float.h>

#define NSTEPS 5

typedef struct {
    double p[FX_TOTAL], s0[FX_TOTAL], s1[FX_TOTAL];
} ref_state;

static void set_schedule(lucid_param_values *v, int step, int adam) {
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        v->in.lr[s] = 0.01f * (1.0f + 0.1f * (float)step) * (s >= 3 ? 3.0f : 1.0f);
        if (s % 3 == 2) v->in.lr[s] = 0.05f - 0.005f * (float)step;
        v->in.momentum[s] = adam ? 0.9f : 0.8f + 0.03f * (float)step;
        v->in.weight_decay[s] = (s % 3 == 0) ? 0.01f : 0.0f;
    }
}

static void fill_grads(float *g) {
    for (int64_t i = 0; i < FX_TOTAL; i++) g[i] = fx_randn();
}

/* ---- f64 references ---- */

static void ref_sgd(ref_state *r, const float *g, const lucid_param_values *v) {
    for (int64_t i = 0; i < FX_TOTAL; i++) {
        if (!fx_trainable(i)) continue;
        int sg = fx_seg_of(i), s = fx_segs[sg].kind + 3 * fx_segs[sg].head;
        double lr = v->in.lr[s], mu = v->in.momentum[s], wd = v->in.weight_decay[s];
        double d = g[i] + wd * r->p[i];
        r->s0[i] = mu * r->s0[i] + d;
        double u = d + mu * r->s0[i];
        r->p[i] -= lr * u;
    }
}

static void ref_adamw(ref_state *r, const float *g, const lucid_param_values *v,
                      int t) {
    for (int64_t i = 0; i < FX_TOTAL; i++) {
        if (!fx_trainable(i)) continue;
        int sg = fx_seg_of(i), s = fx_segs[sg].kind + 3 * fx_segs[sg].head;
        double lr = v->in.lr[s], b1 = v->in.momentum[s], wd = v->in.weight_decay[s];
        double b2 = v->in.beta2, eps = v->in.eps;
        r->p[i] *= 1.0 - lr * wd;
        r->s0[i] = b1 * r->s0[i] + (1.0 - b1) * g[i];
        r->s1[i] = b2 * r->s1[i] + (1.0 - b2) * (double)g[i] * g[i];
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        r->p[i] -= lr / bc1 * r->s0[i] / (sqrt(r->s1[i]) / sqrt(bc2) + eps);
    }
}

/* Newton–Schulz 5 in f64: u (rows x cols) -> O, in place. */
static void ref_ns5(double *u, int rows, int cols) {
    int tr = rows > cols, m = tr ? cols : rows, k = tr ? rows : cols;
    int n = rows * cols;
    double *X = calloc((size_t)n, sizeof *X), *Y = calloc((size_t)n, sizeof *Y);
    double *A = calloc((size_t)m * m, sizeof *A), *B = calloc((size_t)m * m, sizeof *B);
    double nrm = 0;
    for (int i = 0; i < n; i++) nrm += u[i] * u[i];
    nrm = sqrt(nrm) + 1e-7;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            *(tr ? &X[c * rows + r] : &X[r * cols + c]) = u[r * cols + c] / nrm;
    const double a = 3.4445, b = -4.7750, cc = 2.0315;
    for (int it = 0; it < 5; it++) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int q = 0; q < k; q++) s += X[i * k + q] * X[j * k + q];
                A[i * m + j] = s;
            }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int q = 0; q < m; q++) s += A[i * m + q] * A[q * m + j];
                B[i * m + j] = b * A[i * m + j] + cc * s;
            }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < k; j++) {
                double s = 0;
                for (int q = 0; q < m; q++) s += B[i * m + q] * X[q * k + j];
                Y[i * k + j] = a * X[i * k + j] + s;
            }
        memcpy(X, Y, (size_t)n * sizeof *X);
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            u[r * cols + c] = tr ? X[c * rows + r] : X[r * cols + c];
    free(X); free(Y); free(A); free(B);
}

static void ref_musgd(ref_state *r, const float *g, const lucid_param_values *v) {
    for (int sg = 0; sg < FX_NSEG; sg++) {
        const lucid_param_segment *S = &fx_segs[sg];
        if (!S->trainable) continue;
        int s = S->kind + 3 * S->head;
        double lr = v->in.lr[s], mu = v->in.momentum[s], wd = v->in.weight_decay[s];
        int64_t o = S->offset, n = S->numel;
        if (!(S->ndim == 2 || S->ndim == 4)) {
            for (int64_t i = o; i < o + n; i++) {
                double d = g[i] + wd * r->p[i];
                r->s0[i] = mu * r->s0[i] + d;
                r->p[i] -= lr * (d + mu * r->s0[i]);
            }
            continue;
        }
        double *u = calloc((size_t)n, sizeof *u);
        for (int64_t j = 0; j < n; j++) {
            r->s0[o + j] = mu * r->s0[o + j] + (1 - mu) * g[o + j];
            u[j] = mu * r->s0[o + j] + (1 - mu) * g[o + j];
        }
        int rows = (int)S->shape[0], cols = (int)(n / rows);
        ref_ns5(u, rows, cols);
        double sc = sqrt(fmax(1.0, (double)S->shape[S->ndim - 2] / S->shape[S->ndim - 1]));
        for (int64_t j = 0; j < n; j++) {
            int64_t i = o + j;
            r->p[i] -= lr * v->in.muon_scale * sc * u[j];
            double d = g[i] + wd * r->p[i];
            r->s1[i] = mu * r->s1[i] + d;
            r->p[i] -= lr * v->in.sgd_scale * (d + mu * r->s1[i]);
        }
        free(u);
    }
}

/* Max |a - b| / (scale) over trainable elements; frozen/gap must be exact. */
static double max_err(const float *p, const ref_state *r, const float *p0,
                      int *untouched_ok) {
    double e = 0, scale = 1e-12;
    for (int64_t i = 0; i < FX_TOTAL; i++) scale = fmax(scale, fabs(r->p[i] - p0[i]));
    *untouched_ok = 1;
    for (int64_t i = 0; i < FX_TOTAL; i++) {
        if (!fx_trainable(i)) {
            if (memcmp(&p[i], &p0[i], sizeof(float)) != 0) *untouched_ok = 0;
            continue;
        }
        e = fmax(e, fabs(p[i] - r->p[i]) / scale);
    }
    return e;
}

static void run_optim(lucid_ctx *ctx, lucid_optim_kind kind, int ns_bf16,
                      double tol, const char *name) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_layout *l = fx_layout(ctx, cpu);
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ns_bf16 = ns_bf16;
    lucid_param_block *pb = NULL;
    lucid_optim *o = NULL;
    if (lucid_param_block_create(ctx, cpu, &v, &pb) != LUCID_OK ||
        lucid_optim_create(ctx, kind, l, &o) != LUCID_OK) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    float p0[FX_TOTAL];
    ref_state *r = calloc(1, sizeof *r);
    for (int64_t i = 0; i < FX_TOTAL; i++) {
        p0[i] = fx_randn() * 0.5f;
        fx_f(P)[i] = p0[i];
        r->p[i] = p0[i];
    }
    int ok = 1;
    for (int step = 1; step <= NSTEPS && ok; step++) {
        set_schedule(&v, step, kind == LUCID_OPTIM_ADAMW);
        lucid_param_block_update(pb, &v.in);
        fill_grads(fx_f(G));
        if (lucid_param_block_upload(ctx, pb) != LUCID_OK ||
            lucid_optim_step(ctx, o, pb, P, G) != LUCID_OK) {
            TEST_FAIL(name, "step %d: %s", step, lucid_ctx_error(ctx));
            ok = 0;
            break;
        }
        if (kind == LUCID_OPTIM_SGD) ref_sgd(r, fx_f(G), &v);
        else if (kind == LUCID_OPTIM_ADAMW) ref_adamw(r, fx_f(G), &v, step);
        else ref_musgd(r, fx_f(G), &v);
    }
    if (ok) {
        int untouched;
        double e = max_err(fx_f(P), r, p0, &untouched);
        CHECK(name, e < tol, "max relative error %.3g after %d steps (tol %.1g)",
              e, NSTEPS, tol);
        char nm[128];
        snprintf(nm, sizeof nm, "%s frozen segments, buffers and gaps untouched", name);
        CHECK(nm, untouched, "a non-trainable element changed");
        lucid_param_values back;
        lucid_param_block_read(ctx, pb, &back);
        snprintf(nm, sizeof nm, "%s step counter", name);
        CHECK(nm, back.st.step == NSTEPS, "step = %lld", (long long)back.st.step);
        /* state buffer matches (momentum / exp_avg) */
        double se = 0, ss = 1e-12;
        const float *s0 = fx_f(lucid_optim_state(o, 0));
        for (int64_t i = 0; i < FX_TOTAL; i++) {
            if (!fx_trainable(i)) continue;
            ss = fmax(ss, fabs(r->s0[i]));
            se = fmax(se, fabs(s0[i] - r->s0[i]));
        }
        snprintf(nm, sizeof nm, "%s state '%s'", name, lucid_optim_state_name(o, 0));
        CHECK(nm, se / ss < tol, "relative error %.3g", se / ss);
    }
    free(r);
    lucid_tensor_release(P);
    lucid_tensor_release(G);
    lucid_optim_release(o);
    lucid_param_block_release(pb);
    lucid_param_layout_release(l);
}

/* A momentum of 0 and no Nesterov reduce SGD to p -= lr*(g + wd*p): checks
 * the non-Nesterov branch against a hand value. */
static void test_sgd_plain(lucid_ctx *ctx) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_layout *l = fx_layout(ctx, cpu);
    lucid_param_values v;
    lucid_param_values_default(&v);
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        v.in.lr[s] = 0.5f;
        v.in.momentum[s] = 0.9f;
        v.in.weight_decay[s] = 0.0f;
    }
    v.in.nesterov = 0;
    lucid_param_block *pb = NULL;
    lucid_optim *o = NULL;
    lucid_param_block_create(ctx, cpu, &v, &pb);
    lucid_optim_create(ctx, LUCID_OPTIM_SGD, l, &o);
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = 1.0f;
    lucid_optim_step(ctx, o, pb, P, G); /* buf = 1, p = -0.5 */
    lucid_optim_step(ctx, o, pb, P, G); /* buf = 1.9, p = -0.5 - 0.95 */
    CHECK("sgd without nesterov: two steps by hand", fx_f(P)[0] == -1.45f,
          "p = %.9g, expected -1.45", fx_f(P)[0]);
    lucid_tensor_release(P);
    lucid_tensor_release(G);
    lucid_optim_release(o);
    lucid_param_block_release(pb);
    lucid_param_layout_release(l);
}

/* Upload semantics: staging edits take effect only after upload; device
 * state survives uploads; set_state restores it. */
static void test_param_block(lucid_ctx *ctx) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_block *pb = NULL;
    CHECK_STATUS("param block create", ctx, lucid_param_block_create(ctx, cpu, NULL, &pb));
    if (!pb) return;
    lucid_param_values v;
    lucid_param_block_read(ctx, pb, &v);
    CHECK("param block defaults", v.in.lr[0] == 0.01f && v.in.momentum[0] == 0.937f &&
          v.in.weight_decay[0] == 0.0005f && v.in.weight_decay[2] == 0.0f &&
          v.st.loss_scale == 65536.0f && v.in.ema_tau == 2000.0f &&
          v.in.growth_interval == 2000,
          "unexpected defaults");
    lucid_param_block_staging(pb)->lr[1] = 0.123f;
    lucid_param_block_read(ctx, pb, &v);
    CHECK("param block: staging edit invisible before upload", v.in.lr[1] == 0.01f,
          "lr[1] = %g", v.in.lr[1]);
    lucid_param_state st = v.st;
    st.loss_scale = 1024.0f;
    st.step = 77;
    st.ema_updates = 5;
    lucid_param_block_set_state(ctx, pb, &st);
    lucid_param_block_upload(ctx, pb);
    lucid_param_block_read(ctx, pb, &v);
    CHECK("param block: upload applies the inputs", v.in.lr[1] == 0.123f,
          "lr[1] = %g", v.in.lr[1]);
    CHECK("param block: upload keeps device-owned state",
          v.st.loss_scale == 1024.0f && v.st.step == 77 && v.st.ema_updates == 5,
          "scale %g step %lld", v.st.loss_scale, (long long)v.st.step);
    lucid_param_block_release(pb);
}

static void test_layout_errors(lucid_ctx *ctx) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_segment s[2] = {
        {"a", 0, 10, 0, 1, {10}, 1, 0},
        {"b", 5, 10, 0, 1, {10}, 1, 0},
    };
    lucid_param_layout *l = NULL;
    lucid_status st = lucid_param_layout_create(ctx, cpu, 20, s, 2, &l);
    CHECK("layout rejects overlapping segments",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "'b'") &&
          strstr(lucid_ctx_error(ctx), "overlaps"),
          "status %d: %s", st, lucid_ctx_error(ctx));
    s[1].offset = 15;
    st = lucid_param_layout_create(ctx, cpu, 20, s, 2, &l);
    CHECK("layout rejects a segment past the end",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "outside"),
          "status %d: %s", st, lucid_ctx_error(ctx));
    s[1].offset = 10;
    s[1].shape[0] = 9;
    st = lucid_param_layout_create(ctx, cpu, 20, s, 2, &l);
    CHECK("layout rejects numel != product of shape",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "shape"),
          "status %d: %s", st, lucid_ctx_error(ctx));
    s[1].shape[0] = 10;
    s[1].kind = 7;
    st = lucid_param_layout_create(ctx, cpu, 20, s, 2, &l);
    CHECK("layout rejects an unknown kind", st == LUCID_ERR_ARG, "status %d", st);
    s[1].kind = 2;
    st = lucid_param_layout_create(ctx, cpu, 20, s, 2, &l);
    CHECK("layout accepts a valid table", st == LUCID_OK && l &&
          lucid_param_layout_trainable_numel(l) == 20,
          "%s", lucid_ctx_error(ctx));
    /* wrong-size buffers are refused by the step */
    lucid_optim *o = NULL;
    lucid_param_block *pb = NULL;
    lucid_optim_create(ctx, LUCID_OPTIM_SGD, l, &o);
    lucid_param_block_create(ctx, cpu, NULL, &pb);
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, 19), *G = fx_tensor(ctx, LUCID_F32, 20);
    st = lucid_optim_step(ctx, o, pb, P, G);
    CHECK("optimizer refuses a params buffer of the wrong size",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "19"),
          "status %d: %s", st, lucid_ctx_error(ctx));
    lucid_tensor_release(P);
    lucid_tensor_release(G);
    lucid_optim_release(o);
    lucid_param_block_release(pb);
    lucid_param_layout_release(l);
}

/* EMA: N updates with moving params vs f64 ModelEMA, buffers and frozen
 * segments included, gaps untouched. */
static void test_ema(lucid_ctx *ctx) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_layout *l = fx_layout(ctx, cpu);
    lucid_param_block *pb = NULL;
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ema_tau = 3.0f; /* short ramp so d moves a lot in few updates */
    v.in.ema_decay = 0.9f;
    lucid_param_block_create(ctx, cpu, &v, &pb);
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    double ref[FX_TOTAL];
    for (int i = 0; i < FX_TOTAL; i++) ref[i] = fx_f(P)[i] = fx_randn();
    lucid_ema *e = NULL;
    CHECK_STATUS("ema create", ctx, lucid_ema_create(ctx, l, P, &e));
    if (!e) return;
    float gap0 = fx_f(lucid_ema_tensor(e))[181];
    const int N = 7;
    for (int u = 1; u <= N; u++) {
        for (int i = 0; i < FX_TOTAL; i++) fx_f(P)[i] += 0.25f * fx_randn();
        fx_f(P)[181] = 99.0f; /* gap element: never averaged */
        lucid_ema_update(ctx, e, pb, P);
        double d = (double)0.9f * (1.0 - exp(-(double)u / 3.0));
        for (int i = 0; i < FX_TOTAL; i++) ref[i] = d * ref[i] + (1 - d) * fx_f(P)[i];
    }
    double err = 0;
    const float *E = fx_f(lucid_ema_tensor(e));
    for (int i = 0; i < FX_TOTAL; i++)
        if (fx_seg_of(i) >= 0) err = fmax(err, fabs(E[i] - ref[i]));
    CHECK("ema after 7 updates equals ModelEMA (params, frozen, BN buffers)",
          err < 1e-6, "max abs error %.3g", err);
    CHECK("ema leaves gaps untouched", E[181] == gap0, "gap = %g", E[181]);
    lucid_param_block_read(ctx, pb, &v);
    double d7 = (double)0.9f * (1.0 - exp(-7.0 / 3.0));
    CHECK("ema update counter and decay on the device",
          v.st.ema_updates == N && v.st.ema_d == (float)d7,
          "updates %lld d %.9g (expected %.9g)", (long long)v.st.ema_updates,
          v.st.ema_d, d7);
    /* first decay with the reference defaults: 0.9999*(1-exp(-1/2000)) */
    lucid_param_values_default(&v);
    lucid_param_block *pb2 = NULL;
    lucid_param_block_create(ctx, cpu, &v, &pb2);
    lucid_ema_update(ctx, e, pb2, P);
    lucid_param_block_read(ctx, pb2, &v);
    /* 0.9999 * (1 - exp(-1/2000)) = 4.99825e-4 (by hand: 1 - e^-0.0005 =
     * 4.99875e-4) */
    CHECK("ema first decay with defaults = 4.99825e-4",
          fabs(v.st.ema_d - 4.99825e-4) < 1e-9, "d = %.9g", v.st.ema_d);
    lucid_param_block_release(pb2);
    lucid_ema_release(e);
    lucid_tensor_release(P);
    lucid_param_block_release(pb);
    lucid_param_layout_release(l);
}

/* ------------------------------------------------ fused step vs separate */

/* BN-buffer layout for the aux EMA: two running stats and a gap. */
#define FXB_TOTAL 24
static const lucid_param_segment fxb_segs[2] = {
    {"bn.running_mean", 0, 8, LUCID_KIND_WEIGHT, 1, {8}, 0, 0},
    {"bn.running_var", 12, 12, LUCID_KIND_WEIGHT, 1, {12}, 0, 0},
};

typedef struct fused_rig {
    lucid_param_layout *l, *bl;
    lucid_param_block *pb, *pbx; /* pbx: separate route's aux EMA block */
    lucid_optim *o;
    lucid_ema *e, *ea;
    lucid_tensor *P, *G, *B;
} fused_rig;

static int rig_make(lucid_ctx *ctx, fused_rig *r, lucid_optim_kind kind,
                    const lucid_param_values *v, const float *p0, const float *b0) {
    lucid_device cpu = {LUCID_CPU, 0};
    memset(r, 0, sizeof *r);
    r->l = fx_layout(ctx, cpu);
    if (lucid_param_layout_create(ctx, cpu, FXB_TOTAL, fxb_segs, 2, &r->bl) ||
        lucid_param_block_create(ctx, cpu, v, &r->pb) ||
        lucid_param_block_create(ctx, cpu, v, &r->pbx) ||
        lucid_optim_create(ctx, kind, r->l, &r->o))
        return 0;
    r->P = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    r->G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    r->B = fx_tensor(ctx, LUCID_F32, FXB_TOTAL);
    memcpy(fx_f(r->P), p0, FX_TOTAL * sizeof(float));
    memcpy(fx_f(r->B), b0, FXB_TOTAL * sizeof(float));
    return lucid_ema_create(ctx, r->l, r->P, &r->e) == LUCID_OK &&
           lucid_ema_create(ctx, r->bl, r->B, &r->ea) == LUCID_OK;
}

static void rig_free(fused_rig *r) {
    lucid_ema_release(r->e), lucid_ema_release(r->ea);
    lucid_optim_release(r->o);
    lucid_tensor_release(r->P), lucid_tensor_release(r->G), lucid_tensor_release(r->B);
    lucid_param_block_release(r->pb), lucid_param_block_release(r->pbx);
    lucid_param_layout_release(r->l), lucid_param_layout_release(r->bl);
}

/* The separate calls a fused step with these flags replaces. */
static lucid_status rig_separate(lucid_ctx *ctx, fused_rig *r, int flags) {
    lucid_status s = LUCID_OK;
    if (flags & LUCID_STEP_UNSCALE) s = lucid_grad_unscale(ctx, r->l, r->pb, r->G);
    if (!s && (flags & LUCID_STEP_CLIP_NORM)) s = lucid_grad_clip_norm(ctx, r->l, r->pb, r->G, 1);
    if (!s && (flags & LUCID_STEP_CLIP_VALUE)) s = lucid_grad_clip_value(ctx, r->l, r->pb, r->G);
    if (!s) s = lucid_optim_step(ctx, r->o, r->pb, r->P, r->G);
    if (!s && (flags & LUCID_STEP_SCALER_UPDATE)) s = lucid_scaler_update(ctx, r->pb);
    if (!s) s = lucid_ema_update(ctx, r->e, r->pb, r->P);
    if (!s) s = lucid_ema_update(ctx, r->ea, r->pbx, r->B);
    return s;
}

static lucid_status rig_fused(lucid_ctx *ctx, fused_rig *r, int flags) {
    lucid_optim_step_opts o = {flags, r->e, r->ea, r->B};
    return lucid_optim_step_fused(ctx, r->o, r->pb, r->P, r->G, &o);
}

/* Bitwise equal, any NaN equal to any NaN. */
static int same_bits(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

/* The scenario of the fused tests: per step the flags, clip limits, the
 * scaler and the gradient scale / special value. */
typedef struct fused_scen {
    int flags;
    float max_norm, clip_value;
    int scaler;
    float gscale;
    int special; /* 0 none, 1 +Inf at one element, 2 1e20 at one element */
} fused_scen;

#define KEEP LUCID_STEP_KEEP_GRADS
#define SCU LUCID_STEP_SCALER_UPDATE
static const fused_scen fscen[] = {
    {LUCID_STEP_CLIP_NORM | SCU | KEEP, 1.0f, 0.0f, 0, 1.0f, 0},  /* coef < 1 */
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 1, 65536.0f, 0},
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 1, 65536.0f, 1},
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | LUCID_STEP_CLIP_VALUE | SCU, 2.0f, 0.05f, 1,
     32768.0f, 0},
    {LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 0, 1.0f, 2}, /* Inf norm */
    {LUCID_STEP_CLIP_VALUE | KEEP, 10.0f, 0.1f, 0, 1.0f, 0},
    {0, 10.0f, 0.0f, 0, 1.0f, 0},
};
#define NFSCEN ((int)(sizeof fscen / sizeof *fscen))

static void test_fused_cpu(lucid_ctx *ctx, lucid_optim_kind kind, const char *name) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ns_bf16 = 1;
    v.in.growth_interval = 2;
    v.in.ema_tau = 3.0;
    float p0[FX_TOTAL], b0[FXB_TOTAL], g[FX_TOTAL];
    for (int i = 0; i < FX_TOTAL; i++) p0[i] = 0.5f * fx_randn();
    for (int i = 0; i < FXB_TOTAL; i++) b0[i] = fx_randn();
    fused_rig S, F;
    if (!rig_make(ctx, &S, kind, &v, p0, b0) || !rig_make(ctx, &F, kind, &v, p0, b0)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    int ok = 1, grads_ok = 1, untouched_ok = 1;
    for (int k = 0; k < NFSCEN && ok; k++) {
        const fused_scen *sc = &fscen[k];
        set_schedule(&v, k + 1, kind == LUCID_OPTIM_ADAMW);
        v.in.clip_max_norm = sc->max_norm;
        v.in.clip_value = sc->clip_value;
        v.in.scaler_enabled = sc->scaler;
        fused_rig *rr[2] = {&S, &F};
        for (int i = 0; i < FX_TOTAL; i++) g[i] = fx_randn() * sc->gscale;
        if (sc->special == 1) g[5] = INFINITY;
        if (sc->special == 2) g[7] = 1e20f;
        for (int i = 0; i < FXB_TOTAL; i++) fx_f(S.B)[i] += 0.1f * fx_randn();
        memcpy(fx_f(F.B), fx_f(S.B), FXB_TOTAL * sizeof(float));
        for (int q = 0; q < 2; q++) {
            lucid_param_block_update(rr[q]->pb, &v.in);
            lucid_param_block_update(rr[q]->pbx, &v.in);
            lucid_param_block_upload(ctx, rr[q]->pb);
            lucid_param_block_upload(ctx, rr[q]->pbx);
            memcpy(fx_f(rr[q]->G), g, sizeof g);
        }
        if (rig_separate(ctx, &S, sc->flags) != LUCID_OK ||
            rig_fused(ctx, &F, sc->flags) != LUCID_OK) {
            TEST_FAIL(name, "step %d: %s", k, lucid_ctx_error(ctx));
            ok = 0;
            break;
        }
        int keep = (sc->flags & KEEP) || kind == LUCID_OPTIM_MUSGD;
        if (keep ? !same_bits(fx_f(S.G), fx_f(F.G), FX_TOTAL)
                 : memcmp(fx_f(F.G), g, sizeof g) != 0)
            grads_ok = 0;
        for (int i = 0; i < FX_TOTAL; i++)
            if (!fx_trainable(i) && (memcmp(&fx_f(F.P)[i], &p0[i], 4) ||
                                     memcmp(&fx_f(F.G)[i], &g[i], 4)))
                untouched_ok = 0;
    }
    if (!ok) {
        rig_free(&S), rig_free(&F);
        return;
    }
    char nm[160];
    int same = same_bits(fx_f(S.P), fx_f(F.P), FX_TOTAL);
    for (int i = 0; i < lucid_optim_state_count(S.o); i++)
        same = same && same_bits(fx_f(lucid_optim_state(S.o, i)),
                                 fx_f(lucid_optim_state(F.o, i)), FX_TOTAL);
    CHECK(name, same, "params or state differ from the separate calls");
    snprintf(nm, sizeof nm, "%s: EMA of params and of the BN buffers bitwise", name);
    CHECK(nm, same_bits(fx_f(lucid_ema_tensor(S.e)), fx_f(lucid_ema_tensor(F.e)), FX_TOTAL) &&
                  same_bits(fx_f(lucid_ema_tensor(S.ea)), fx_f(lucid_ema_tensor(F.ea)),
                            FXB_TOTAL),
          "EMA differs");
    snprintf(nm, sizeof nm, "%s: gradients (processed with KEEP_GRADS, else unchanged)", name);
    CHECK(nm, grads_ok, "gradients differ");
    snprintf(nm, sizeof nm, "%s: frozen params and their grads untouched", name);
    CHECK(nm, untouched_ok, "a non-trainable element changed");
    lucid_param_values vs, vf;
    lucid_param_block_read(ctx, S.pb, &vs);
    lucid_param_block_read(ctx, F.pb, &vf);
    snprintf(nm, sizeof nm, "%s: block state (step, skips, scale, norm, EMA count) bitwise", name);
    CHECK(nm, memcmp(&vs.st, &vf.st, sizeof vs.st) == 0 && vf.st.skipped_steps == 1 &&
                  vf.st.step == NFSCEN - 1 && vf.st.ema_updates == NFSCEN &&
                  vf.st.nonfinite_norms == 2,
          "step %lld/%lld skipped %lld/%lld ema %lld nonfinite %d/%d scale %g/%g",
          (long long)vs.st.step, (long long)vf.st.step, (long long)vs.st.skipped_steps,
          (long long)vf.st.skipped_steps, (long long)vf.st.ema_updates,
          vs.st.nonfinite_norms, vf.st.nonfinite_norms, vs.st.loss_scale, vf.st.loss_scale);
    rig_free(&S), rig_free(&F);
}

/* Newton–Schulz on X zero-padded to M x K equals the unpadded iteration
 * on the real block up to BLAS summation order, and the padding stays
 * exactly zero. The tolerance is 4e-6 of the largest entry (~34 f32 ulps
 * of it): OpenBLAS picks its kernel and blocking by the matrix sizes and
 * the CPU, so padded and unpadded products may add in different orders, and
 * five iterations amplify that (an AMD EPYC dev machine gave 5.96e-7 of
 * 0.588 where an Intel one gave bitwise equality, session 12). */
static void test_ns_padding(int m, int k, int M, int K, int bf) {
    char name[160];
    snprintf(name, sizeof name,
             "newton-schulz %dx%d zero-padded to %dx%d (%s) equals the unpadded one", m, k, M,
             K, bf ? "bf16" : "f32");
    float *x = calloc((size_t)m * k, sizeof *x), *xp = calloc((size_t)M * K, sizeof *xp);
    float *w = calloc((size_t)3 * M * M + (size_t)M * K, sizeof *w);
    double nrm = 0;
    for (int i = 0; i < m * k; i++) x[i] = fx_randn(), nrm += (double)x[i] * x[i];
    for (int i = 0; i < m * k; i++) {
        x[i] = (float)(x[i] / sqrt(nrm));
        if (bf) x[i] = lucid_bf16_to_f32(lucid_f32_to_bf16(x[i]));
    }
    for (int r = 0; r < m; r++)
        for (int c = 0; c < k; c++) xp[r * K + c] = x[r * k + c];
    lucid_cpu_ns5_iterate(x, m, k, bf, w, w + 3 * m * m);
    lucid_cpu_ns5_iterate(xp, M, K, bf, w, w + 3 * M * M);
    double e = 0, mx = 0;
    int pad_zero = 1, bitwise = 1;
    for (int r = 0; r < M; r++)
        for (int c = 0; c < K; c++) {
            float y = xp[r * K + c];
            if (r >= m || c >= k) {
                if (y != 0.0f) pad_zero = 0;
                continue;
            }
            float z = x[r * k + c];
            if (memcmp(&y, &z, 4)) bitwise = 0;
            e = fmax(e, fabs((double)y - z));
            mx = fmax(mx, fabs((double)z));
        }
    CHECK(name, pad_zero && e <= 4e-6 * mx && mx > 0.1,
          "padding zero %d, max diff %.3g of max %.3g (bitwise %d)", pad_zero, e, mx, bitwise);
    free(x), free(xp), free(w);
}

/* The bucket plan of a layout with many Muon shapes. */
static void test_muon_plan(lucid_ctx *ctx) {
    enum { N = 40 };
    lucid_param_segment s[N];
    char names[N][16];
    int64_t off = 0;
    for (int i = 0; i < N; i++) {
        int r = 1 + (i * 37) % 97, c = 1 + (i * 53) % 211;
        if (i % 5 == 0) r *= 4; /* some tall ones */
        snprintf(names[i], sizeof names[i], "w%d", i);
        s[i] = (lucid_param_segment){names[i], off, (int64_t)r * c, LUCID_KIND_WEIGHT, 2,
                                     {r, c}, 1, 0};
        if (i % 7 == 3) { /* a 1-D bias between them */
            s[i].ndim = 1, s[i].shape[0] = s[i].numel, s[i].shape[1] = 0;
        }
        off += s[i].numel + 3;
    }
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_layout *l = NULL;
    if (lucid_param_layout_create(ctx, cpu, off, s, N, &l) != LUCID_OK) {
        TEST_FAIL("muon plan", "%s", lucid_ctx_error(ctx));
        return;
    }
    int ok = l->nbuckets >= 1 && l->nbuckets <= LUCID_MUON_MAX_BUCKETS;
    int seen[N] = {0}, mixed = 0;
    int64_t xo = 0, ao = 0;
    for (int b = 0; b < l->nbuckets && ok; b++) {
        const lucid_muon_bucket *k = &l->buckets_host[b];
        ok = ok && k->M % LUCID_MUON_ALIGN == 0 && k->K % LUCID_MUON_ALIGN == 0 &&
             k->M <= k->K && k->x_off == xo && k->a_off == ao && k->count > 0;
        xo += (int64_t)k->count * k->M * k->K;
        ao += (int64_t)k->count * k->M * k->M;
        for (int j = k->first; j < k->first + k->count && ok; j++) {
            const lucid_muon_mat *mt = &l->mats_host[j];
            const lucid_seg_info *sg = &l->seg_host[mt->seg];
            ok = mt->bucket == b && mt->m <= k->M && mt->k <= k->K && mt->m <= mt->k &&
                 mt->x_off == k->x_off + (int64_t)(j - k->first) * k->M * k->K &&
                 sg->muon == j && (int64_t)mt->m * mt->k == sg->numel &&
                 mt->tr == (sg->rows > sg->cols) && !seen[mt->seg] &&
                 mt->nchunks == (sg->numel + LUCID_OPTIM_CHUNK - 1) / LUCID_OPTIM_CHUNK &&
                 l->chunks_train_host[mt->first_chunk].seg == mt->seg &&
                 l->chunks_train_host[mt->first_chunk].start == sg->offset;
            seen[mt->seg] = 1;
            if (j > k->first && (mt->m != mt[-1].m || mt->k != mt[-1].k)) mixed = 1;
        }
    }
    int all = 1;
    for (int i = 0; i < N; i++)
        if ((s[i].ndim == 2) != (seen[i] == 1)) all = 0;
    CHECK("muon plan: every matrix in one bucket of a padded shape that holds it",
          ok && all && xo == l->muon_nx && ao == l->muon_na && l->nmuon > 0,
          "plan invalid (%d buckets)", l->nbuckets);
    CHECK("muon plan: a bucket mixes matrix shapes", mixed, "no bucket with two shapes");
    lucid_param_layout_release(l);
}

static void test_fused_errors(lucid_ctx *ctx) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_param_layout *l = fx_layout(ctx, cpu), *bl = NULL;
    lucid_param_layout_create(ctx, cpu, FXB_TOTAL, fxb_segs, 2, &bl);
    lucid_param_block *pb = NULL;
    lucid_optim *o = NULL;
    lucid_param_block_create(ctx, cpu, NULL, &pb);
    lucid_optim_create(ctx, LUCID_OPTIM_SGD, l, &o);
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, FX_TOTAL), *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_tensor *B = fx_tensor(ctx, LUCID_F32, FXB_TOTAL);
    lucid_ema *eb = NULL;
    lucid_ema_create(ctx, bl, B, &eb);
    lucid_optim_step_opts op = {0, eb, NULL, NULL};
    lucid_status st = lucid_optim_step_fused(ctx, o, pb, P, G, &op);
    CHECK("fused step refuses an EMA of another layout",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "layout"), "status %d: %s", st,
          lucid_ctx_error(ctx));
    op = (lucid_optim_step_opts){0, NULL, eb, B};
    st = lucid_optim_step_fused(ctx, o, pb, P, G, &op);
    CHECK("fused step refuses aux_ema without ema", st == LUCID_ERR_ARG, "status %d", st);
    op = (lucid_optim_step_opts){1 << 12, NULL, NULL, NULL};
    st = lucid_optim_step_fused(ctx, o, pb, P, G, &op);
    CHECK("fused step refuses unknown flags",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "flags"), "status %d", st);
    lucid_ema_release(eb);
    lucid_tensor_release(P), lucid_tensor_release(G), lucid_tensor_release(B);
    lucid_optim_release(o);
    lucid_param_block_release(pb);
    lucid_param_layout_release(l), lucid_param_layout_release(bl);
}

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 * fmax(1.0, fabs(b)))

static void test_schedule(void) {
    CHECK("accumulate: batch 16 -> 4", lucid_sched_accumulate(64, 16) == 4, "wrong value");
    CHECK("accumulate: batch 8 -> 8", lucid_sched_accumulate(64, 8) == 8, "wrong value");
    CHECK("accumulate: batch 24 -> round(2.67) = 3", lucid_sched_accumulate(64, 24) == 3, "wrong value");
    CHECK("accumulate: batch 40 -> round(1.6) = 2", lucid_sched_accumulate(64, 40) == 2, "wrong value");
    CHECK("accumulate: batch 128 -> round(0.5)=0 -> 1", lucid_sched_accumulate(64, 128) == 1, "wrong value");
    CHECK("weight decay: batch 16 acc 4 -> 0.0005",
          NEAR(lucid_sched_weight_decay(0.0005, 16, 4, 64), 0.0005), "wrong value");
    CHECK("weight decay: batch 24 acc 3 -> 0.0005625",
          NEAR(lucid_sched_weight_decay(0.0005, 24, 3, 64), 0.0005625), "wrong value");
    CHECK("warmup iters: 3 epochs x 885 = 2655",
          lucid_sched_warmup_iters(3.0, 100, 885) == 2655, "wrong value");
    CHECK("warmup iters: epochs 2 caps warmup at 1 epoch",
          lucid_sched_warmup_iters(3.0, 2, 10) == 10, "wrong value");
    CHECK("warmup iters: epochs 1 -> 0", lucid_sched_warmup_iters(3.0, 1, 10) == 0, "wrong value");
    CHECK("warmup iters: 0.5 x 5 = 2.5 rounds half to even -> 2",
          lucid_sched_warmup_iters(0.5, 10, 5) == 2, "wrong value");
    CHECK("lf linear at epoch 0 = 1", NEAR(lucid_sched_lf(0, 0, 100, 0.01), 1.0), "wrong value");
    CHECK("lf linear at epoch 50/100 = 0.505",
          NEAR(lucid_sched_lf(0, 50, 100, 0.01), 0.505), "wrong value");
    CHECK("lf linear at the end = lrf", NEAR(lucid_sched_lf(0, 100, 100, 0.01), 0.01), "wrong value");
    CHECK("lf cosine at epoch 50/100 = 0.505",
          NEAR(lucid_sched_lf(1, 50, 100, 0.01), 0.505), "wrong value");
    CHECK("lf cosine at epoch 25/100 = 0.855017856",
          fabs(lucid_sched_lf(1, 25, 100, 0.01) - 0.8550178566873411) < 1e-12,
          "got %.12g", lucid_sched_lf(1, 25, 100, 0.01));
    CHECK("warmup lr, bias group: 0.1 -> 0.01 at 10/40 = 0.0775",
          NEAR(lucid_sched_warmup_lr(10, 40, 1, 0.1, 0.01, 1.0), 0.0775), "wrong value");
    CHECK("warmup lr, other group: 0 -> 0.01 at 10/40 = 0.0025",
          NEAR(lucid_sched_warmup_lr(10, 40, 0, 0.1, 0.01, 1.0), 0.0025), "wrong value");
    CHECK("warmup lr at ni = nw is initial_lr * lf",
          NEAR(lucid_sched_warmup_lr(40, 40, 1, 0.1, 0.01, 0.5), 0.005), "wrong value");
    CHECK("warmup lr with nw = 0 gives the final value",
          NEAR(lucid_sched_warmup_lr(0, 0, 1, 0.1, 0.01, 1.0), 0.01), "wrong value");
    CHECK("warmup momentum at 3/4 = 0.90275",
          NEAR(lucid_sched_warmup_momentum(3, 4, 0.8, 0.937), 0.90275), "wrong value");
    CHECK("warmup accumulate at ni 0 = 1", lucid_sched_warmup_accumulate(0, 40, 64, 16) == 1, "wrong value");
    CHECK("warmup accumulate at 20/40 = round(2.5) = 2",
          lucid_sched_warmup_accumulate(20, 40, 64, 16) == 2, "wrong value");
    CHECK("warmup accumulate at 30/40 = round(3.25) = 3",
          lucid_sched_warmup_accumulate(30, 40, 64, 16) == 3, "wrong value");
    CHECK("warmup accumulate at nw = 4", lucid_sched_warmup_accumulate(40, 40, 64, 16) == 4, "wrong value");
    CHECK("in warmup: ni <= nw", lucid_sched_in_warmup(40, 40) && !lucid_sched_in_warmup(41, 40), "wrong value");
    lucid_optim_kind k;
    double lr, mom;
    lucid_sched_auto_optimizer(56599, 16, 64, 100, 1, &k, &lr, &mom);
    CHECK("auto: COCO-pose 100 epochs -> MuSGD lr 0.01 momentum 0.9",
          k == LUCID_OPTIM_MUSGD && lr == 0.01 && mom == 0.9, "kind %d lr %g", k, lr);
    lucid_sched_auto_optimizer(137, 16, 64, 100, 1, &k, &lr, &mom);
    CHECK("auto: 137 images -> AdamW lr 0.002", k == LUCID_OPTIM_ADAMW && NEAR(lr, 0.002),
          "kind %d lr %g", k, lr);
    lucid_sched_auto_optimizer(137, 16, 64, 100, 80, &k, &lr, &mom);
    CHECK("auto: nc 80 -> lr round(0.01/84, 6) = 0.000119", NEAR(lr, 0.000119), "lr %.9g", lr);
    CHECK("optimizer kind names", lucid_optim_kind_parse("musgd", &k) == 0 &&
          k == LUCID_OPTIM_MUSGD && strcmp(lucid_optim_kind_name(LUCID_OPTIM_ADAMW), "AdamW") == 0, "wrong value");
}

int main(void) {
    lucid_ctx *ctx = fx_ctx();
    run_optim(ctx, LUCID_OPTIM_SGD, 0, 1e-5, "sgd nesterov 5 steps vs f64");
    run_optim(ctx, LUCID_OPTIM_ADAMW, 0, 1e-5, "adamw 5 steps vs f64");
    run_optim(ctx, LUCID_OPTIM_MUSGD, 0, 2e-5, "musgd (f32 newton-schulz) 5 steps vs f64");
    run_optim(ctx, LUCID_OPTIM_MUSGD, 1, 2e-2, "musgd (bf16 newton-schulz) 5 steps vs f64");
    test_sgd_plain(ctx);
    test_param_block(ctx);
    test_layout_errors(ctx);
    test_ema(ctx);
    test_fused_cpu(ctx, LUCID_OPTIM_SGD, "fused SGD step == separate calls, 7 steps (cpu, bitwise)");
    test_fused_cpu(ctx, LUCID_OPTIM_ADAMW, "fused AdamW step == separate calls, 7 steps (cpu, bitwise)");
    test_fused_cpu(ctx, LUCID_OPTIM_MUSGD, "fused MuSGD step == separate calls, 7 steps (cpu, bitwise)");
    test_fused_errors(ctx);
    test_ns_padding(6, 10, 8, 16, 0);
    test_ns_padding(6, 10, 8, 16, 1);
    test_ns_padding(20, 45, 32, 64, 0);
    test_ns_padding(20, 45, 32, 64, 1);
    test_muon_plan(ctx);
    test_schedule();
    lucid_ctx_release(ctx);
    return test_exit();
}
