/*
 * test_optim.c — optimizers (SGD, AdamW, MuSGD), the parameter block, EMA,
 * layout validation and the schedule formulas, on the CPU.
 *
 * Every optimizer runs several steps with state and a schedule that moves
 * lr/momentum between steps, against an independent float64
 * implementation written here from the PyTorch / Ultralytics formulas.
 * Schedule values are checked against numbers computed by hand.
 */
#include "test_optim_fixture.h"
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
    test_schedule();
    lucid_ctx_release(ctx);
    return test_exit();
}
