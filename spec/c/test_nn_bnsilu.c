/*
 * test_nn_bnsilu.c — the fused BatchNorm2d + SiLU on the CPU
 * (lucid_nn_batchnorm2d_silu_*, lucid_module_batchnorm2d_silu_*).
 *
 * Gradient checks: float64, central differences (test_nn_util.h: step 1e-6,
 * bound max|analytic - numeric| / max(max|numeric|, 1e-3) < 1e-6) of
 * L = sum(a * r), a = silu(bn(x)), for the input (through the batch
 * statistics in training), the BN weight and the BN bias, in train and eval
 * mode, with and without affine parameters.
 * Against the separate calls (batchnorm2d then silu, backward silu then
 * batchnorm2d) on the same inputs:
 *   f64 and f32 forward: equal bit for bit (same arithmetic, z not rounded
 *     differently in f32 / f64); statistics, running stats and
 *     num_batches_tracked bit for bit (the same code computes them);
 *   f64 backward: max|diff| <= 1e-12 * max|ref|; f32 backward (the fused one
 *     recomputes z from the f32-rounded saved statistics):
 *     max|diff| <= 1e-5 * max|ref|.
 * bf16 / f16 activations (f32 parameters): the fused result on rounded
 * inputs equals the f32 fused result on the same values within one rounding
 * of the output (|lo - f32| <= u*|f32| + 1e-6, u = 2^-8 bf16, 2^-11 f16),
 * parameter gradients within 1e-6 relative; against the separate bf16/f16
 * route (which rounds z and dL/dz to the activation dtype) within
 * max|diff| <= 4u * max|ref| for a, 6u for dx (up to 2.0u measured).
 * Beta semantics, nullable outputs, argument errors, and the module pair
 * (outputs in act's / bn's persistent slots, frozen parameters,
 * need_grad_input, kind checks, backward before forward).
 */
#define TEST_NN_SEED 0x7f4a7c159e3779b9ull
#include "test_nn_util.h"

#define MOM 0.03
#define EPS 1e-3

static lucid_tensor *clone(const lucid_tensor *t) { return conv_to(t, t->dtype); }

/* bitwise equality of two tensors of one dtype */
static int same_bits(const lucid_tensor *a, const lucid_tensor *b) {
    if (a->dtype != b->dtype || numel(a) != numel(b)) return 0;
    return memcmp(lucid_tensor_data(a), lucid_tensor_data(b),
                  (size_t)numel(a) * lucid_dtype_size(a->dtype)) == 0;
}

/* max|a - ref| <= tol * max|ref| (NaN fails) */
static void check_close(const char *name, const lucid_tensor *a,
                        const lucid_tensor *ref, double tol) {
    double d = max_abs_diff(a, ref), m = max_abs(ref);
    CHECK(name, d <= tol * m, "max diff %.3g > %.1g * max|ref| %.3g", d, tol, m);
}

// ----------------------------------------------------------------------------
// state of one fused call

typedef struct bs {
    lucid_tensor *x, *y, *w, *b, *rm, *rv, *nbt, *sm, *si, *r;
    int training;
} bs;

static void bs_free(bs *s) {
    lucid_tensor *all[] = {s->x, s->y, s->w, s->b, s->rm, s->rv, s->nbt, s->sm, s->si, s->r};
    for (int i = 0; i < 10; i++)
        if (all[i]) lucid_tensor_release(all[i]);
    memset(s, 0, sizeof *s);
}

/* x [N,C,H,W] in dt, parameters/statistics in pdt; affine 0: no weight/bias */
static void bs_make(bs *s, lucid_dtype dt, lucid_dtype pdt, int64_t N, int64_t C,
                    int64_t H, int64_t W, int affine, int training) {
    memset(s, 0, sizeof *s);
    s->training = training;
    s->x = mk4(dt, N, C, H, W);
    s->y = like(s->x, dt);
    s->r = like(s->x, dt);
    fill_rand(s->x, -2.5, 3);
    fill_rand(s->r, -1, 1);
    if (affine) {
        s->w = mk1(pdt, C);
        s->b = mk1(pdt, C);
        fill_rand(s->w, 0.5, 1.5);
        fill_rand(s->b, -0.5, 0.5);
    }
    s->rm = mk1(pdt, C);
    s->rv = mk1(pdt, C);
    fill_rand(s->rm, -0.3, 0.3);
    fill_rand(s->rv, 0.5, 2);
    int64_t one = 1;
    s->nbt = mk(LUCID_I64, 1, &one);
    fill_val(s->nbt, 0);
    s->sm = mk1(pdt, C);
    s->si = mk1(pdt, C);
}

static lucid_status bs_fwd(bs *s) {
    return lucid_nn_batchnorm2d_silu_forward(ctx, s->x, s->y, s->w, s->b, s->rm, s->rv,
                                             s->nbt, s->sm, s->si, s->training, MOM, EPS);
}

static double bs_loss(void *vs) {
    bs *s = vs;
    if (bs_fwd(s) != LUCID_OK) return NAN;
    return dot(s->y, s->r);
}

// ----------------------------------------------------------------------------
// float64 gradient checks

static void test_gradcheck(void) {
    char nm[160];
    for (int affine = 1; affine >= 0; affine--) {
        for (int training = 1; training >= 0; training--) {
            const char *mode = training ? "train" : "eval";
            const char *aff = affine ? "" : " no-affine";
            bs s;
            bs_make(&s, LUCID_F64, LUCID_F64, 3, 4, 3, 2, affine, training);
            bs_loss(&s);
            lucid_tensor *dx = like(s.x, LUCID_F64);
            lucid_tensor *dw = mk1(LUCID_F64, 4), *db = mk1(LUCID_F64, 4);
            fill_val(dx, NAN); /* beta 0 must not read */
            fill_val(dw, NAN);
            fill_val(db, NAN);
            lucid_status st = lucid_nn_batchnorm2d_silu_backward(
                ctx, s.x, s.r, dx, s.w, s.b, s.sm, s.si, affine ? dw : NULL,
                affine ? db : NULL, training, 0.0, 0.0);
            snprintf(nm, sizeof nm, "bn+silu f64 %s%s: backward runs", mode, aff);
            CHECK_STATUS(nm, ctx, st);
            snprintf(nm, sizeof nm, "bn+silu f64 %s%s: gradcheck input%s", mode, aff,
                     training ? " (through the batch statistics)" : "");
            check_grad(nm, bs_loss, &s, s.x, dx);
            if (affine) {
                snprintf(nm, sizeof nm, "bn+silu f64 %s: gradcheck weight", mode);
                check_grad(nm, bs_loss, &s, s.w, dw);
                snprintf(nm, sizeof nm, "bn+silu f64 %s: gradcheck bias", mode);
                check_grad(nm, bs_loss, &s, s.b, db);
            }
            lucid_tensor *all[] = {dx, dw, db};
            rel(all, 3);
            bs_free(&s);
        }
    }
}

// ----------------------------------------------------------------------------
// fused == separate (f64 and f32), two training steps then eval

/* The separate route on clones of s's state: y = silu(bn(x)), then the
 * backward of r; the fused route on s itself; compares. */
static void test_vs_separate(lucid_dtype dt, int affine, int64_t N, int64_t C,
                             int64_t H, int64_t W) {
    char nm[200], pre[96];
    snprintf(pre, sizeof pre, "bn+silu %s %lldx%lldx%lldx%lld%s vs separate",
             lucid_dtype_name(dt), (long long)N, (long long)C, (long long)H,
             (long long)W, affine ? "" : " no-affine");
    double btol = dt == LUCID_F64 ? 1e-12 : 1e-5;
    bs s;
    bs_make(&s, dt, dt, N, C, H, W, affine, 1);
    lucid_tensor *rm2 = clone(s.rm), *rv2 = clone(s.rv), *nbt2 = clone(s.nbt);
    lucid_tensor *sm2 = like(s.sm, dt), *si2 = like(s.si, dt);
    lucid_tensor *z2 = like(s.x, dt), *y2 = like(s.x, dt), *g2 = like(s.x, dt);
    lucid_tensor *dx = like(s.x, dt), *dx2 = like(s.x, dt);
    lucid_tensor *dw = mk1(dt, C), *db = mk1(dt, C), *dw2 = mk1(dt, C), *db2 = mk1(dt, C);
    lucid_status st = LUCID_OK;
    for (int step = 0; step < 2 && !st; step++) {
        fill_rand(s.x, -2.5 + step, 3 + step);
        st = bs_fwd(&s);
        if (!st)
            st = lucid_nn_batchnorm2d_forward(ctx, s.x, z2, s.w, s.b, rm2, rv2, nbt2, sm2,
                                              si2, 1, MOM, EPS);
        if (!st) st = lucid_nn_silu_forward(ctx, z2, y2);
    }
    snprintf(nm, sizeof nm, "%s: two train forwards run", pre);
    CHECK_STATUS(nm, ctx, st);
    if (st) goto done;
    snprintf(nm, sizeof nm, "%s: train forward bitwise equal", pre);
    CHECK(nm, same_bits(s.y, y2), "max diff %g", max_abs_diff(s.y, y2));
    snprintf(nm, sizeof nm,
             "%s: save_mean, save_invstd, running stats, num_batches_tracked bitwise equal",
             pre);
    CHECK(nm,
          same_bits(s.sm, sm2) && same_bits(s.si, si2) && same_bits(s.rm, rm2) &&
              same_bits(s.rv, rv2) && same_bits(s.nbt, nbt2) && get(s.nbt, 0) == 2,
          "mean %g invstd %g rm %g rv %g nbt %g/%g", max_abs_diff(s.sm, sm2),
          max_abs_diff(s.si, si2), max_abs_diff(s.rm, rm2), max_abs_diff(s.rv, rv2),
          get(s.nbt, 0), get(nbt2, 0));

    /* train backward, beta 0 then beta 1 */
    for (int beta = 0; beta <= 1 && !st; beta++) {
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dx, s.w, s.b, s.sm, s.si,
                                                affine ? dw : NULL, affine ? db : NULL, 1,
                                                beta, beta);
        if (!st) st = lucid_nn_silu_backward(ctx, z2, s.r, g2, 0.0);
        if (!st)
            st = lucid_nn_batchnorm2d_backward(ctx, s.x, g2, dx2, s.w, sm2, si2,
                                               affine ? dw2 : NULL, affine ? db2 : NULL, 1,
                                               beta, beta);
        snprintf(nm, sizeof nm, "%s: train backward beta %d runs", pre, beta);
        CHECK_STATUS(nm, ctx, st);
        if (st) break;
        snprintf(nm, sizeof nm, "%s: train grad_input beta %d", pre, beta);
        check_close(nm, dx, dx2, btol);
        if (affine) {
            snprintf(nm, sizeof nm, "%s: train grad_weight beta %d", pre, beta);
            check_close(nm, dw, dw2, btol);
            snprintf(nm, sizeof nm, "%s: train grad_bias beta %d", pre, beta);
            check_close(nm, db, db2, btol);
        }
    }

    /* eval: running statistics, no update */
    if (!st) {
        lucid_tensor *rm0 = clone(s.rm), *rv0 = clone(s.rv);
        s.training = 0;
        st = bs_fwd(&s);
        if (!st)
            st = lucid_nn_batchnorm2d_forward(ctx, s.x, z2, s.w, s.b, rm2, rv2, nbt2, sm2,
                                              si2, 0, MOM, EPS);
        if (!st) st = lucid_nn_silu_forward(ctx, z2, y2);
        if (!st)
            st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dx, s.w, s.b, s.sm,
                                                    s.si, affine ? dw : NULL,
                                                    affine ? db : NULL, 0, 0.0, 0.0);
        if (!st) st = lucid_nn_silu_backward(ctx, z2, s.r, g2, 0.0);
        if (!st)
            st = lucid_nn_batchnorm2d_backward(ctx, s.x, g2, dx2, s.w, sm2, si2,
                                               affine ? dw2 : NULL, affine ? db2 : NULL, 0,
                                               0.0, 0.0);
        snprintf(nm, sizeof nm, "%s: eval forward and backward run", pre);
        CHECK_STATUS(nm, ctx, st);
        if (!st) {
            snprintf(nm, sizeof nm, "%s: eval forward bitwise equal, running stats untouched",
                     pre);
            CHECK(nm, same_bits(s.y, y2) && same_bits(s.rm, rm0) && same_bits(s.rv, rv0) &&
                          get(s.nbt, 0) == 2,
                  "y diff %g rm diff %g nbt %g", max_abs_diff(s.y, y2),
                  max_abs_diff(s.rm, rm0), get(s.nbt, 0));
            snprintf(nm, sizeof nm, "%s: eval grad_input", pre);
            check_close(nm, dx, dx2, btol);
            if (affine) {
                snprintf(nm, sizeof nm, "%s: eval grad_weight and grad_bias", pre);
                CHECK(nm,
                      max_abs_diff(dw, dw2) <= btol * max_abs(dw2) &&
                          max_abs_diff(db, db2) <= btol * max_abs(db2),
                      "dw diff %g db diff %g", max_abs_diff(dw, dw2), max_abs_diff(db, db2));
            }
        }
        lucid_tensor *a2[] = {rm0, rv0};
        rel(a2, 2);
    }
done:;
    lucid_tensor *all[] = {rm2, rv2, nbt2, sm2, si2, z2, y2, g2, dx, dx2, dw, db, dw2, db2};
    rel(all, 14);
    bs_free(&s);
}

// ----------------------------------------------------------------------------
// bf16 / f16 activations

static void test_lowp(lucid_dtype lo, double u, int training) {
    char nm[200], pre[64];
    const char *mode = training ? "train" : "eval";
    snprintf(pre, sizeof pre, "bn+silu %s %s", lucid_dtype_name(lo), mode);
    int64_t N = 2, C = 5, H = 7, W = 6;
    bs s; /* the low-precision run */
    bs_make(&s, lo, LUCID_F32, N, C, H, W, 1, training);
    lucid_tensor *x32 = conv_to(s.x, LUCID_F32), *r32 = conv_to(s.r, LUCID_F32);
    lucid_tensor *y32 = like(s.x, LUCID_F32), *dx32 = like(s.x, LUCID_F32);
    lucid_tensor *rm2 = clone(s.rm), *rv2 = clone(s.rv), *sm2 = clone(s.sm),
                 *si2 = clone(s.si);
    lucid_tensor *dx = like(s.x, lo), *dw = mk1(LUCID_F32, C), *db = mk1(LUCID_F32, C);
    lucid_tensor *dw32 = mk1(LUCID_F32, C), *db32 = mk1(LUCID_F32, C);
    /* the separate low-precision route */
    lucid_tensor *rm3 = clone(s.rm), *rv3 = clone(s.rv), *sm3 = clone(s.sm),
                 *si3 = clone(s.si);
    lucid_tensor *z3 = like(s.x, lo), *y3 = like(s.x, lo), *g3 = like(s.x, lo),
                 *dx3 = like(s.x, lo);
    lucid_status st = bs_fwd(&s);
    if (!st)
        st = lucid_nn_batchnorm2d_silu_forward(ctx, x32, y32, s.w, s.b, rm2, rv2, NULL, sm2,
                                               si2, training, MOM, EPS);
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dx, s.w, s.b, s.sm, s.si, dw,
                                                db, training, 0.0, 0.0);
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, x32, r32, dx32, s.w, s.b, sm2, si2,
                                                dw32, db32, training, 0.0, 0.0);
    if (!st)
        st = lucid_nn_batchnorm2d_forward(ctx, s.x, z3, s.w, s.b, rm3, rv3, NULL, sm3, si3,
                                          training, MOM, EPS);
    if (!st) st = lucid_nn_silu_forward(ctx, z3, y3);
    if (!st) st = lucid_nn_silu_backward(ctx, z3, s.r, g3, 0.0);
    if (!st)
        st = lucid_nn_batchnorm2d_backward(ctx, s.x, g3, dx3, s.w, sm3, si3, NULL, NULL,
                                           training, 0.0, 0.0);
    snprintf(nm, sizeof nm, "%s: runs", pre);
    CHECK_STATUS(nm, ctx, st);
    if (!st) {
        snprintf(nm, sizeof nm, "%s: forward = f32 fused within one rounding", pre);
        check_lowp(nm, s.y, y32, u);
        snprintf(nm, sizeof nm, "%s: grad_input = f32 fused within one rounding", pre);
        check_lowp(nm, dx, dx32, u);
        snprintf(nm, sizeof nm,
                 "%s: f32 statistics, running stats and parameter grads = f32 path", pre);
        CHECK(nm,
              same_bits(s.sm, sm2) && same_bits(s.si, si2) && same_bits(s.rm, rm2) &&
                  same_bits(s.rv, rv2) && max_abs_diff(dw, dw32) <= 1e-6 * max_abs(dw32) &&
                  max_abs_diff(db, db32) <= 1e-6 * max_abs(db32),
              "mean %g rm %g dw %g db %g", max_abs_diff(s.sm, sm2), max_abs_diff(s.rm, rm2),
              max_abs_diff(dw, dw32), max_abs_diff(db, db32));
        snprintf(nm, sizeof nm,
                 "%s: fused vs separate (z rounded there) within 4u (a), 6u (dx) * max|ref|",
                 pre);
        CHECK(nm,
              max_abs_diff(s.y, y3) <= 4 * u * max_abs(y3) &&
                  max_abs_diff(dx, dx3) <= 6 * u * max_abs(dx3),
              "y diff %g (max %g) dx diff %g (max %g)", max_abs_diff(s.y, y3), max_abs(y3),
              max_abs_diff(dx, dx3), max_abs(dx3));
        snprintf(nm, sizeof nm, "%s: same running stats as the separate route", pre);
        CHECK(nm, same_bits(s.rm, rm3) && same_bits(s.rv, rv3) && same_bits(s.sm, sm3),
              "rm diff %g", max_abs_diff(s.rm, rm3));
    }
    lucid_tensor *all[] = {x32, r32, y32, dx32, rm2, rv2, sm2, si2, dx, dw, db, dw32,
                           db32, rm3, rv3, sm3, si3, z3, y3, g3, dx3};
    rel(all, 21);
    bs_free(&s);
}

// ----------------------------------------------------------------------------
// nullable outputs, errors

static void test_nullable_and_errors(void) {
    bs s;
    bs_make(&s, LUCID_F64, LUCID_F64, 2, 3, 4, 5, 1, 1);
    lucid_status st = bs_fwd(&s);
    lucid_tensor *dx = like(s.x, LUCID_F64), *dw = mk1(LUCID_F64, 3), *db = mk1(LUCID_F64, 3);
    lucid_tensor *dxa = like(s.x, LUCID_F64), *dwa = mk1(LUCID_F64, 3),
                 *dba = mk1(LUCID_F64, 3);
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dx, s.w, s.b, s.sm, s.si, dw,
                                                db, 1, 0.0, 0.0);
    fill_val(dxa, NAN);
    fill_val(dwa, 7);
    fill_val(dba, 7);
    /* dx only: dweight/dbias untouched */
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dxa, s.w, s.b, s.sm, s.si,
                                                NULL, NULL, 1, 0.0, 0.0);
    int ok = !st && max_abs_diff(dxa, dx) == 0;
    /* dweight only, then dbias only */
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, NULL, s.w, s.b, s.sm, s.si,
                                                dwa, NULL, 1, 0.0, 0.0);
    if (!st)
        st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, NULL, s.w, s.b, s.sm, s.si,
                                                NULL, dba, 1, 0.0, 0.0);
    ok = ok && !st && max_abs_diff(dwa, dw) == 0 && max_abs_diff(dba, db) == 0;
    CHECK("bn+silu: grad_input, grad_weight, grad_bias each nullable, same values", ok,
          "status %s dx %g dw %g db %g", lucid_status_name(st), max_abs_diff(dxa, dx),
          max_abs_diff(dwa, dw), max_abs_diff(dba, db));

    /* errors: those of BatchNorm2d */
    st = lucid_nn_batchnorm2d_silu_forward(ctx, s.x, s.y, s.w, s.b, NULL, NULL, NULL, s.sm,
                                           s.si, 0, MOM, EPS);
    CHECK("bn+silu: eval without running stats is ERR_ARG", st == LUCID_ERR_ARG,
          "status %s", lucid_status_name(st));
    lucid_tensor *x1 = mk4(LUCID_F64, 1, 3, 1, 1), *y1 = like(x1, LUCID_F64);
    st = lucid_nn_batchnorm2d_silu_forward(ctx, x1, y1, s.w, s.b, s.rm, s.rv, NULL, s.sm,
                                           s.si, 1, MOM, EPS);
    CHECK("bn+silu: training on one value per channel is ERR_ARG", st == LUCID_ERR_ARG,
          "status %s", lucid_status_name(st));
    lucid_tensor *b4 = mk1(LUCID_F64, 4);
    st = lucid_nn_batchnorm2d_silu_backward(ctx, s.x, s.r, dx, s.w, b4, s.sm, s.si, NULL,
                                            NULL, 1, 0.0, 0.0);
    CHECK("bn+silu backward: a bias of the wrong size is ERR_ARG",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "bias"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_tensor *yb = mk4(LUCID_F32, 2, 3, 4, 5);
    st = lucid_nn_batchnorm2d_silu_forward(ctx, s.x, yb, s.w, s.b, s.rm, s.rv, NULL, s.sm,
                                           s.si, 1, MOM, EPS);
    CHECK("bn+silu: output dtype differing from the input is ERR_ARG", st == LUCID_ERR_ARG,
          "status %s", lucid_status_name(st));
    const lucid_nn_kernels *k = lucid_nn_cpu_kernels();
    CHECK("kernel table: cpu has the fused BatchNorm2d+SiLU slots",
          k->batchnorm2d_silu_forward && k->batchnorm2d_silu_backward, "missing");
    lucid_tensor *all[] = {dx, dw, db, dxa, dwa, dba, x1, y1, b4, yb};
    rel(all, 10);
    bs_free(&s);
}

// ----------------------------------------------------------------------------
// the module pair

typedef struct pair {
    lucid_param_set *set;
    lucid_module *bn, *act;
} pair;

static lucid_status pair_make(pair *p, int c) {
    memset(p, 0, sizeof *p);
    LUCID_TRY(lucid_param_set_create(ctx, &p->set));
    LUCID_TRY(lucid_module_batchnorm2d_create(ctx, p->set, "model.0.bn", c, EPS, MOM,
                                              &p->bn));
    LUCID_TRY(lucid_module_silu_create(ctx, &p->act));
    LUCID_TRY(lucid_param_set_materialize(ctx, p->set, CPU, LUCID_F32));
    /* non-trivial weight and bias, equal in every pair */
    for (int i = 0; i < c; i++) {
        set(p->bn->params[0]->data, i, 0.6 + 0.1 * i);
        set(p->bn->params[1]->data, i, -0.2 + 0.07 * i);
    }
    return LUCID_OK;
}

static void pair_free(pair *p) {
    lucid_module_release(p->bn);
    lucid_module_release(p->act);
    lucid_param_set_release(p->set);
}

static void test_modules(void) {
    pair f, s;
    lucid_status st = pair_make(&f, 6);
    if (!st) st = pair_make(&s, 6);
    CHECK_STATUS("bn+silu modules: two BatchNorm2d+SiLU pairs", ctx, st);
    if (st) return;
    lucid_tensor *x = mk4(LUCID_F32, 2, 6, 5, 4), *dy = like(x, LUCID_F32);
    fill_rand(x, -2, 3);
    fill_rand(dy, -1, 1);
    lucid_tensor *y = NULL, *dx = NULL, *z = NULL, *ys = NULL, *g = NULL, *dxs = NULL;

    st = lucid_module_batchnorm2d_silu_backward(ctx, f.bn, f.act, x, dy, &dx);
    CHECK("bn+silu modules: backward before forward is ERR_STATE", st == LUCID_ERR_STATE,
          "status %s", lucid_status_name(st));
    st = lucid_module_batchnorm2d_silu_forward(ctx, f.act, f.bn, x, &y);
    CHECK("bn+silu modules: (SiLU, BatchNorm2d) is ERR_ARG naming the kinds",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "SiLU"), "status %s: %s",
          lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_tensor *xc = mk4(LUCID_F32, 2, 5, 5, 4);
    st = lucid_module_batchnorm2d_silu_forward(ctx, f.bn, f.act, xc, &y);
    CHECK("bn+silu modules: wrong channel count is ERR_ARG", st == LUCID_ERR_ARG,
          "status %s", lucid_status_name(st));

    /* two steps: fused pair vs bn then act (beta 1 accumulation of the
     * parameter gradients over both) */
    st = LUCID_OK;
    for (int step = 0; step < 2 && !st; step++) {
        st = lucid_module_batchnorm2d_silu_forward(ctx, f.bn, f.act, x, &y);
        if (!st) st = lucid_module_forward1(ctx, s.bn, x, &z);
        if (!st) st = lucid_module_forward1(ctx, s.act, z, &ys);
        if (!st) st = lucid_module_batchnorm2d_silu_backward(ctx, f.bn, f.act, x, dy, &dx);
        if (!st) st = lucid_module_backward1(ctx, s.act, z, dy, &g);
        if (!st) st = lucid_module_backward1(ctx, s.bn, x, g, &dxs);
    }
    CHECK_STATUS("bn+silu modules: two fused and two separate steps run", ctx, st);
    if (!y || !ys || !dx || !dxs) goto done;
    CHECK("bn+silu modules: output is act's persistent output, grad_input bn's",
          y == lucid_module_output(f.act, 0) && dx == lucid_module_grad_input(f.bn, 0) &&
              lucid_module_output(f.bn, 0) == NULL &&
              lucid_module_grad_input(f.act, 0) == NULL,
          "y %p act out %p dx %p bn gin %p", (void *)y, (void *)lucid_module_output(f.act, 0),
          (void *)dx, (void *)lucid_module_grad_input(f.bn, 0));
    CHECK("bn+silu modules: forward = BatchNorm2d then SiLU (bitwise)", same_bits(y, ys),
          "max diff %g", max_abs_diff(y, ys));
    check_close("bn+silu modules: grad_input = separate", dx, dxs, 1e-5);
    {
        int same = 1;
        for (int i = 2; i < 5; i++)
            same = same && same_bits(f.bn->params[i]->data, s.bn->params[i]->data);
        CHECK("bn+silu modules: running_mean, running_var, num_batches_tracked bitwise = "
              "separate",
              same && get(f.bn->params[4]->data, 0) == 2, "nbt %g",
              get(f.bn->params[4]->data, 0));
    }
    check_close("bn+silu modules: accumulated weight grad (2 steps) = separate",
                f.bn->params[0]->grad, s.bn->params[0]->grad, 1e-5);
    check_close("bn+silu modules: accumulated bias grad (2 steps) = separate",
                f.bn->params[1]->grad, s.bn->params[1]->grad, 1e-5);

    /* frozen bias, no input gradient */
    lucid_param_set_zero_grad(ctx, f.set);
    lucid_param_set_trainable(ctx, f.set, f.bn->params[1], 0);
    lucid_module_set_need_grad_input(f.bn, 0);
    lucid_tensor *dx0 = dx;
    st = lucid_module_batchnorm2d_silu_backward(ctx, f.bn, f.act, x, dy, &dx);
    CHECK("bn+silu modules: frozen bias gets no gradient, need_grad_input 0 gives no dx",
          st == LUCID_OK && dx == NULL && max_abs(f.bn->params[1]->grad) == 0 &&
              max_abs(f.bn->params[0]->grad) > 0 && lucid_module_grad_input(f.bn, 0) == dx0,
          "status %s dx %p bias grad %g weight grad %g", lucid_status_name(st), (void *)dx,
          max_abs(f.bn->params[1]->grad), max_abs(f.bn->params[0]->grad));

    /* eval mode of bn: running statistics, no update */
    lucid_tensor *rm0 = clone(f.bn->params[2]->data);
    lucid_module_set_training(f.bn, 0);
    lucid_module_set_training(s.bn, 0);
    st = lucid_module_batchnorm2d_silu_forward(ctx, f.bn, f.act, x, &y);
    if (!st) st = lucid_module_forward1(ctx, s.bn, x, &z);
    if (!st) st = lucid_module_forward1(ctx, s.act, z, &ys);
    CHECK("bn+silu modules: eval forward = separate, running stats untouched",
          st == LUCID_OK && same_bits(y, ys) && same_bits(f.bn->params[2]->data, rm0) &&
              get(f.bn->params[4]->data, 0) == 2,
          "status %s diff %g", lucid_status_name(st), max_abs_diff(y, ys));
    lucid_tensor_release(rm0);
done:
    lucid_tensor_release(x);
    lucid_tensor_release(xc);
    lucid_tensor_release(dy);
    pair_free(&f);
    pair_free(&s);
}

int main(void) {
    nn_ctx_open(1);
    test_gradcheck();
    test_vs_separate(LUCID_F64, 1, 3, 4, 3, 2);
    test_vs_separate(LUCID_F64, 0, 2, 3, 5, 1);
    test_vs_separate(LUCID_F32, 1, 3, 4, 3, 2);
    test_vs_separate(LUCID_F32, 1, 2, 6, 33, 29); /* planes of > 256 (several blocks) */
    test_vs_separate(LUCID_F32, 0, 4, 3, 5, 7);
    test_lowp(LUCID_BF16, U_BF16, 1);
    test_lowp(LUCID_BF16, U_BF16, 0);
    test_lowp(LUCID_F16, U_F16, 1);
    test_lowp(LUCID_F16, U_F16, 0);
    test_nullable_and_errors();
    test_modules();
    lucid_ctx_release(ctx);
    return test_exit();
}
