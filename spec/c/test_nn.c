/*
 * test_nn.c — the nn kernels on the CPU (engine/nn/nn.h, lucid_nn_*).
 *
 * Gradient checks: float64, central differences with step h = 1e-6 on
 * every element of every input and parameter, loss L = sum(y * r) for a
 * fixed random r (so dy = r).  Bound: relative error
 *     max_i |analytic_i - numeric_i| / max(max_i |numeric_i|, 1e-3) < 1e-6
 * (the rounding error of the difference quotient is ~1e-10 here).
 * Forward values: conv against a direct 7-loop convolution, DFL and softmax
 * against naive formulas.  Reduced-precision paths: bf16 / f16 activations
 * against the f32 path on the same (already rounded) input; both compute in
 * f64 and round once, so the difference is one rounding of the output:
 *     |y_lo - y_f32| <= u * |y_f32| + 1e-6,  u = 2^-8 (bf16), 2^-11 (f16).
 */
#define TEST_NN_SEED 0x9e3779b97f4a7c15ull
#include "test_nn_util.h"

static lucid_tensor *rounded(const lucid_tensor *t, lucid_dtype dt) {
    /* t rounded to dt, returned as dt */
    return conv_to(t, dt);
}

// ----------------------------------------------------------------------------
// Conv2d

typedef struct conv_case {
    const char *name;
    int N, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, dh, dw, g, bias;
} conv_case;

typedef struct conv_st {
    lucid_tensor *x, *w, *b, *y, *r;
    lucid_conv2d_params p;
} conv_st;

static double conv_loss(void *vs) {
    conv_st *s = vs;
    if (lucid_nn_conv2d_forward(ctx, s->x, s->y, s->w, s->b, &s->p) != LUCID_OK)
        return NAN;
    return dot(s->y, s->r);
}

/* direct 7-loop convolution (plus the group loop) */
static void conv_naive(const conv_case *c, const lucid_tensor *x,
                       const lucid_tensor *w, const lucid_tensor *b,
                       lucid_tensor *y) {
    int64_t Ho = y->shape[2], Wo = y->shape[3];
    int Cg = c->Cin / c->g, Og = c->Cout / c->g;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->Cout; o++)
            for (int64_t i = 0; i < Ho; i++)
                for (int64_t j = 0; j < Wo; j++) {
                    double acc = b ? get(b, o) : 0.0;
                    int gi = o / Og;
                    for (int cc = 0; cc < Cg; cc++)
                        for (int u = 0; u < c->kh; u++)
                            for (int v = 0; v < c->kw; v++) {
                                int64_t hi = i * c->sh - c->ph + u * c->dh;
                                int64_t wi = j * c->sw - c->pw + v * c->dw;
                                if (hi < 0 || hi >= c->H || wi < 0 || wi >= c->W)
                                    continue;
                                int ci = gi * Cg + cc;
                                acc += get(w, ((o * Cg + cc) * c->kh + u) * c->kw + v) *
                                       get(x, ((n * c->Cin + ci) * c->H + hi) * c->W + wi);
                            }
                    set(y, ((n * c->Cout + o) * Ho + i) * Wo + j, acc);
                }
}

static void test_conv_case(const conv_case *c) {
    char nm[160];
    lucid_conv2d_params p = {c->sh, c->sw, c->ph, c->pw, c->dh, c->dw, c->g};
    int64_t Ho = lucid_nn_conv_out_size(c->H, c->kh, c->sh, c->ph, c->dh);
    int64_t Wo = lucid_nn_conv_out_size(c->W, c->kw, c->sw, c->pw, c->dw);
    conv_st s = {0};
    s.p = p;
    s.x = mk4(LUCID_F64, c->N, c->Cin, c->H, c->W);
    s.w = mk4(LUCID_F64, c->Cout, c->Cin / c->g, c->kh, c->kw);
    s.b = c->bias ? mk1(LUCID_F64, c->Cout) : NULL;
    s.y = mk4(LUCID_F64, c->N, c->Cout, Ho, Wo);
    s.r = like(s.y, LUCID_F64);
    fill_rand(s.x, -1, 1);
    fill_rand(s.w, -1, 1);
    if (s.b) fill_rand(s.b, -1, 1);
    fill_rand(s.r, -1, 1);

    /* forward vs direct loops */
    lucid_tensor *yref = like(s.y, LUCID_F64);
    conv_naive(c, s.x, s.w, s.b, yref);
    lucid_status st = lucid_nn_conv2d_forward(ctx, s.x, s.y, s.w, s.b, &p);
    snprintf(nm, sizeof nm, "conv2d %s: forward f64 = direct loops", c->name);
    CHECK(nm, st == LUCID_OK && max_abs_diff(s.y, yref) < 1e-12 * (1 + max_abs(yref)),
          "status %s, max diff %g", lucid_status_name(st), max_abs_diff(s.y, yref));

    /* analytic gradients */
    lucid_tensor *dx = like(s.x, LUCID_F64), *dw = like(s.w, LUCID_F64);
    lucid_tensor *db = c->bias ? like(s.b, LUCID_F64) : NULL;
    fill_val(dx, NAN); /* beta 0 must not read it */
    fill_val(dw, 0.5); /* beta 1 accumulates */
    if (db) fill_val(db, 0.5);
    st = lucid_nn_conv2d_backward_input(ctx, s.x, s.r, dx, s.w, &p, 0.0);
    if (st == LUCID_OK)
        st = lucid_nn_conv2d_backward_params(ctx, s.x, s.r, dw, db, &p, 1.0);
    snprintf(nm, sizeof nm, "conv2d %s: backward runs", c->name);
    CHECK_STATUS(nm, ctx, st);
    for (int64_t i = 0; i < numel(dw); i++) set(dw, i, get(dw, i) - 0.5);
    if (db)
        for (int64_t i = 0; i < numel(db); i++) set(db, i, get(db, i) - 0.5);
    snprintf(nm, sizeof nm, "conv2d %s: gradcheck input", c->name);
    check_grad(nm, conv_loss, &s, s.x, dx);
    snprintf(nm, sizeof nm, "conv2d %s: gradcheck weight (accumulated, beta 1)", c->name);
    check_grad(nm, conv_loss, &s, s.w, dw);
    if (db) {
        snprintf(nm, sizeof nm, "conv2d %s: gradcheck bias", c->name);
        check_grad(nm, conv_loss, &s, s.b, db);
    }

    /* reduced precision activations, f32 parameters */
    lucid_dtype lows[2] = {LUCID_BF16, LUCID_F16};
    double us[2] = {U_BF16, U_F16};
    for (int k = 0; k < 2; k++) {
        lucid_tensor *xl = rounded(s.x, lows[k]), *x32 = conv_to(xl, LUCID_F32);
        lucid_tensor *rl = rounded(s.r, lows[k]), *r32 = conv_to(rl, LUCID_F32);
        lucid_tensor *w32 = conv_to(s.w, LUCID_F32);
        lucid_tensor *b32 = s.b ? conv_to(s.b, LUCID_F32) : NULL;
        lucid_tensor *yl = like(s.y, lows[k]), *y32 = like(s.y, LUCID_F32);
        lucid_tensor *dxl = like(s.x, lows[k]), *dx32 = like(s.x, LUCID_F32);
        lucid_tensor *dwl = like(s.w, LUCID_F32), *dw32 = like(s.w, LUCID_F32);
        fill_val(dwl, 0);
        fill_val(dw32, 0);
        st = lucid_nn_conv2d_forward(ctx, xl, yl, w32, b32, &p);
        if (!st) st = lucid_nn_conv2d_forward(ctx, x32, y32, w32, b32, &p);
        if (!st) st = lucid_nn_conv2d_backward_input(ctx, xl, rl, dxl, w32, &p, 0);
        if (!st) st = lucid_nn_conv2d_backward_input(ctx, x32, r32, dx32, w32, &p, 0);
        if (!st) st = lucid_nn_conv2d_backward_params(ctx, xl, rl, dwl, NULL, &p, 1);
        if (!st) st = lucid_nn_conv2d_backward_params(ctx, x32, r32, dw32, NULL, &p, 1);
        snprintf(nm, sizeof nm, "conv2d %s: %s path runs", c->name,
                 lucid_dtype_name(lows[k]));
        CHECK_STATUS(nm, ctx, st);
        snprintf(nm, sizeof nm, "conv2d %s: %s forward = f32 within one rounding",
                 c->name, lucid_dtype_name(lows[k]));
        check_lowp(nm, yl, y32, us[k]);
        snprintf(nm, sizeof nm, "conv2d %s: %s grad_input = f32 within one rounding",
                 c->name, lucid_dtype_name(lows[k]));
        check_lowp(nm, dxl, dx32, us[k]);
        snprintf(nm, sizeof nm, "conv2d %s: %s grad_weight (f32) = f32 path",
                 c->name, lucid_dtype_name(lows[k]));
        check_lowp(nm, dwl, dw32, 1e-6);
        lucid_tensor *all[] = {xl, x32, rl, r32, w32, b32, yl, y32, dxl, dx32, dwl, dw32};
        rel(all, 12);
    }
    lucid_tensor *all[] = {s.x, s.w, s.b, s.y, s.r, yref, dx, dw, db};
    rel(all, 9);
}

static void test_conv(void) {
    static const conv_case cases[] = {
        /* name            N Cin H W Cout kh kw sh sw ph pw dh dw g bias */
        {"3x3 s1 p1 bias", 2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
        {"3x3 stride 2 no-bias", 2, 3, 7, 8, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0},
        {"3x3 dilation 2 pad 2", 1, 2, 8, 7, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1},
        {"groups 2", 2, 4, 6, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1},
        {"depthwise s2", 2, 4, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 1},
        {"depthwise dil2 no-bias", 1, 3, 7, 6, 3, 3, 3, 1, 1, 2, 2, 2, 2, 3, 0},
        {"depthwise multiplier 2", 1, 2, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1},
        {"1x1", 2, 5, 4, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
        {"3x2 rect, asym stride/pad", 1, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0, 1, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_conv_case(&cases[i]);

    /* argument errors are statuses with messages, never aborts */
    lucid_tensor *x = mk4(LUCID_F32, 1, 3, 4, 4), *w = mk4(LUCID_F32, 4, 2, 3, 3);
    lucid_tensor *y = mk4(LUCID_F32, 1, 4, 4, 4);
    lucid_conv2d_params p = {1, 1, 1, 1, 1, 1, 1};
    lucid_status st = lucid_nn_conv2d_forward(ctx, x, y, w, NULL, &p);
    CHECK("conv2d: channel mismatch is ERR_ARG with a message",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "groups"),
          "status %s msg '%s'", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_tensor *all[] = {x, w, y};
    rel(all, 3);
}

// ----------------------------------------------------------------------------
// BatchNorm2d

typedef struct bn_st {
    lucid_tensor *x, *w, *b, *rm, *rv, *sm, *si, *y, *r;
    int training;
} bn_st;

static double bn_loss(void *vs) {
    bn_st *s = vs;
    if (lucid_nn_batchnorm2d_forward(ctx, s->x, s->y, s->w, s->b, s->rm, s->rv,
                                     NULL, s->sm, s->si, s->training, 0.03,
                                     1e-3) != LUCID_OK)
        return NAN;
    return dot(s->y, s->r);
}

static void test_bn(void) {
    char nm[128];
    for (int training = 1; training >= 0; training--) {
        bn_st s = {0};
        s.training = training;
        s.x = mk4(LUCID_F64, 3, 4, 3, 2);
        s.y = like(s.x, LUCID_F64);
        s.r = like(s.x, LUCID_F64);
        s.w = mk1(LUCID_F64, 4); s.b = mk1(LUCID_F64, 4);
        s.rm = mk1(LUCID_F64, 4); s.rv = mk1(LUCID_F64, 4);
        s.sm = mk1(LUCID_F64, 4); s.si = mk1(LUCID_F64, 4);
        fill_rand(s.x, -2, 3);
        fill_rand(s.r, -1, 1);
        fill_rand(s.w, 0.5, 1.5);
        fill_rand(s.b, -0.5, 0.5);
        fill_rand(s.rm, -0.2, 0.2);
        fill_rand(s.rv, 0.5, 2);
        bn_loss(&s);
        lucid_tensor *dx = like(s.x, LUCID_F64), *dw = mk1(LUCID_F64, 4),
                     *db = mk1(LUCID_F64, 4);
        fill_val(dx, NAN);
        fill_val(dw, NAN);
        fill_val(db, NAN);
        lucid_status st = lucid_nn_batchnorm2d_backward(
            ctx, s.x, s.r, dx, s.w, s.sm, s.si, dw, db, training, 0.0, 0.0);
        snprintf(nm, sizeof nm, "batchnorm2d %s: backward runs",
                 training ? "train" : "eval");
        CHECK_STATUS(nm, ctx, st);
        snprintf(nm, sizeof nm, "batchnorm2d %s: gradcheck input%s",
                 training ? "train" : "eval",
                 training ? " (through the batch statistics)" : "");
        check_grad(nm, bn_loss, &s, s.x, dx);
        snprintf(nm, sizeof nm, "batchnorm2d %s: gradcheck weight",
                 training ? "train" : "eval");
        check_grad(nm, bn_loss, &s, s.w, dw);
        snprintf(nm, sizeof nm, "batchnorm2d %s: gradcheck bias",
                 training ? "train" : "eval");
        check_grad(nm, bn_loss, &s, s.b, db);

        if (training) {
            /* normalised output: per-channel mean 0, biased var 1 (w=1,b=0) */
            lucid_tensor *w1 = mk1(LUCID_F64, 4), *b0 = mk1(LUCID_F64, 4);
            fill_val(w1, 1);
            fill_val(b0, 0);
            lucid_nn_batchnorm2d_forward(ctx, s.x, s.y, w1, b0, NULL, NULL, NULL,
                                         s.sm, s.si, 1, 0.03, 1e-3);
            double worst = 0;
            for (int c = 0; c < 4; c++) {
                double m = 0, v = 0;
                for (int n = 0; n < 3; n++)
                    for (int i = 0; i < 6; i++) m += get(s.y, (n * 4 + c) * 6 + i);
                m /= 18;
                for (int n = 0; n < 3; n++)
                    for (int i = 0; i < 6; i++) {
                        double d = get(s.y, (n * 4 + c) * 6 + i) - m;
                        v += d * d;
                    }
                v /= 18;
                /* var of xhat = var/(var+eps) */
                double xv = 1.0 / (get(s.si, c) * get(s.si, c)) - 1e-3;
                double want = xv / (xv + 1e-3);
                worst = fmax(worst, fmax(fabs(m), fabs(v - want)));
            }
            CHECK("batchnorm2d train: output has mean 0 and var var/(var+eps)",
                  worst < 1e-12, "worst deviation %g", worst);
            lucid_tensor *a2[] = {w1, b0};
            rel(a2, 2);
        }

        /* bf16 / f16 activations, f32 parameters and statistics */
        lucid_dtype lows[2] = {LUCID_BF16, LUCID_F16};
        double us[2] = {U_BF16, U_F16};
        for (int k = 0; k < 2; k++) {
            lucid_tensor *xl = rounded(s.x, lows[k]), *x32 = conv_to(xl, LUCID_F32);
            lucid_tensor *rl = rounded(s.r, lows[k]), *r32 = conv_to(rl, LUCID_F32);
            lucid_tensor *w32 = conv_to(s.w, LUCID_F32), *b32 = conv_to(s.b, LUCID_F32);
            lucid_tensor *rm1 = conv_to(s.rm, LUCID_F32), *rv1 = conv_to(s.rv, LUCID_F32);
            lucid_tensor *rm2 = conv_to(s.rm, LUCID_F32), *rv2 = conv_to(s.rv, LUCID_F32);
            lucid_tensor *sm1 = mk1(LUCID_F32, 4), *si1 = mk1(LUCID_F32, 4);
            lucid_tensor *sm2 = mk1(LUCID_F32, 4), *si2 = mk1(LUCID_F32, 4);
            lucid_tensor *yl = like(s.x, lows[k]), *y32 = like(s.x, LUCID_F32);
            lucid_tensor *dxl = like(s.x, lows[k]), *dx32 = like(s.x, LUCID_F32);
            lucid_tensor *dwl = mk1(LUCID_F32, 4), *dw32 = mk1(LUCID_F32, 4);
            st = lucid_nn_batchnorm2d_forward(ctx, xl, yl, w32, b32, rm1, rv1, NULL,
                                              sm1, si1, training, 0.03, 1e-3);
            if (!st)
                st = lucid_nn_batchnorm2d_forward(ctx, x32, y32, w32, b32, rm2, rv2,
                                                  NULL, sm2, si2, training, 0.03, 1e-3);
            if (!st)
                st = lucid_nn_batchnorm2d_backward(ctx, xl, rl, dxl, w32, sm1, si1,
                                                   dwl, NULL, training, 0, 0);
            if (!st)
                st = lucid_nn_batchnorm2d_backward(ctx, x32, r32, dx32, w32, sm2, si2,
                                                   dw32, NULL, training, 0, 0);
            snprintf(nm, sizeof nm, "batchnorm2d %s %s: runs",
                     training ? "train" : "eval", lucid_dtype_name(lows[k]));
            CHECK_STATUS(nm, ctx, st);
            snprintf(nm, sizeof nm, "batchnorm2d %s %s: forward = f32 within one rounding",
                     training ? "train" : "eval", lucid_dtype_name(lows[k]));
            check_lowp(nm, yl, y32, us[k]);
            snprintf(nm, sizeof nm, "batchnorm2d %s %s: grad_input = f32 within one rounding",
                     training ? "train" : "eval", lucid_dtype_name(lows[k]));
            check_lowp(nm, dxl, dx32, us[k]);
            snprintf(nm, sizeof nm, "batchnorm2d %s %s: f32 running stats and grads = f32 path",
                     training ? "train" : "eval", lucid_dtype_name(lows[k]));
            CHECK(nm, max_abs_diff(rm1, rm2) == 0 && max_abs_diff(rv1, rv2) == 0 &&
                      max_abs_diff(dwl, dw32) <= 1e-6 * (1 + max_abs(dw32)),
                  "running mean diff %g var diff %g dw diff %g",
                  max_abs_diff(rm1, rm2), max_abs_diff(rv1, rv2),
                  max_abs_diff(dwl, dw32));
            lucid_tensor *all[] = {xl, x32, rl, r32, w32, b32, rm1, rv1, rm2, rv2,
                                   sm1, si1, sm2, si2, yl, y32, dxl, dx32, dwl, dw32};
            rel(all, 20);
        }
        lucid_tensor *all[] = {s.x, s.y, s.r, s.w, s.b, s.rm, s.rv, s.sm, s.si,
                               dx, dw, db};
        rel(all, 12);
    }
}

/* running statistics after two training steps, by hand */
static void test_bn_running(void) {
    lucid_tensor *x = mk4(LUCID_F32, 2, 2, 1, 2), *y = like(x, LUCID_F32);
    lucid_tensor *rm = mk1(LUCID_F32, 2), *rv = mk1(LUCID_F32, 2);
    lucid_tensor *sm = mk1(LUCID_F32, 2), *si = mk1(LUCID_F32, 2);
    int64_t one = 1;
    lucid_tensor *nbt = mk(LUCID_I64, 1, &one);
    fill_val(rm, 0);
    fill_val(rv, 1);
    fill_val(nbt, 0);
    /* step 1: channel 0 values {1,2,3,4}: mean 2.5, biased var 1.25,
     *   unbiased 5/3; channel 1 values {0,0,0,8}: mean 2, unbiased 16. */
    double v1[8] = {1, 2, 0, 0, 3, 4, 0, 8};
    for (int i = 0; i < 8; i++) set(x, i, v1[i]);
    lucid_status st = lucid_nn_batchnorm2d_forward(ctx, x, y, NULL, NULL, rm, rv,
                                                   nbt, sm, si, 1, 0.03, 1e-3);
    /* step 2: channel 0 {10,10,10,14}: mean 11, unbiased 4;
     *         channel 1 {-1,1,-1,1}: mean 0, unbiased 4/3 */
    double v2[8] = {10, 10, -1, 1, 10, 14, -1, 1};
    for (int i = 0; i < 8; i++) set(x, i, v2[i]);
    if (!st)
        st = lucid_nn_batchnorm2d_forward(ctx, x, y, NULL, NULL, rm, rv, nbt, sm, si,
                                          1, 0.03, 1e-3);
    CHECK_STATUS("batchnorm2d running stats: two steps run", ctx, st);
    double m = 0.03;
    double rm0 = (1 - m) * ((1 - m) * 0 + m * 2.5) + m * 11;
    double rv0 = (1 - m) * ((1 - m) * 1 + m * (5.0 / 3.0)) + m * 4;
    double rm1 = (1 - m) * ((1 - m) * 0 + m * 2) + m * 0;
    double rv1 = (1 - m) * ((1 - m) * 1 + m * 16) + m * (4.0 / 3.0);
    double e = fmax(fmax(test_relerr(get(rm, 0), rm0), test_relerr(get(rv, 0), rv0)),
                    fmax(test_relerr(get(rm, 1), rm1), test_relerr(get(rv, 1), rv1)));
    CHECK("batchnorm2d running stats after 2 steps = hand values (momentum 0.03, "
          "unbiased var)",
          e < 1e-6, "rel err %g: got %g %g %g %g want %g %g %g %g", e, get(rm, 0),
          get(rv, 0), get(rm, 1), get(rv, 1), rm0, rv0, rm1, rv1);
    CHECK("batchnorm2d: num_batches_tracked counts 2", get(nbt, 0) == 2,
          "got %g", get(nbt, 0));
    /* saved stats of step 2: invstd of channel 0 = 1/sqrt(3 + 1e-3) */
    CHECK("batchnorm2d: save_invstd uses the biased variance + eps",
          test_relerr(get(si, 0), 1 / sqrt(3.0 + 1e-3)) < 1e-6 &&
              test_relerr(get(sm, 0), 11) < 1e-7,
          "invstd %g mean %g", get(si, 0), get(sm, 0));
    /* eval forward uses the running statistics */
    st = lucid_nn_batchnorm2d_forward(ctx, x, y, NULL, NULL, rm, rv, nbt, sm, si, 0,
                                      0.03, 1e-3);
    double want = (10 - get(rm, 0)) / sqrt(get(rv, 0) + 1e-3);
    CHECK("batchnorm2d eval: normalises with running stats, no update",
          st == LUCID_OK && test_relerr(get(y, 0), want) < 1e-6 && get(nbt, 0) == 2,
          "y0 %g want %g", get(y, 0), want);
    /* a single value per channel cannot be trained on */
    lucid_tensor *x1 = mk4(LUCID_F32, 1, 2, 1, 1), *y1 = like(x1, LUCID_F32);
    fill_val(x1, 1);
    st = lucid_nn_batchnorm2d_forward(ctx, x1, y1, NULL, NULL, rm, rv, NULL, sm, si,
                                      1, 0.03, 1e-3);
    CHECK("batchnorm2d train: one value per channel is ERR_ARG",
          st == LUCID_ERR_ARG, "status %s", lucid_status_name(st));
    lucid_tensor *all[] = {x, y, rm, rv, sm, si, nbt, x1, y1};
    rel(all, 9);
}

// ----------------------------------------------------------------------------
// SiLU, MaxPool2d, Upsample, softmax, DFL

typedef struct un_st {
    lucid_tensor *x, *y, *r, *idx;
    int kind; /* 0 silu 1 maxpool 2 upsample 3 softmax 4 dfl */
    lucid_pool2d_params pp;
    int arg;
} un_st;

static lucid_status un_fwd(un_st *s, const lucid_tensor *x, lucid_tensor *y) {
    switch (s->kind) {
    case 0: return lucid_nn_silu_forward(ctx, x, y);
    case 1: return lucid_nn_maxpool2d_forward(ctx, x, y, s->idx, &s->pp);
    case 2: return lucid_nn_upsample_nearest2d_forward(ctx, x, y, s->arg);
    case 3: return lucid_nn_softmax_forward(ctx, x, y);
    default: return lucid_nn_dfl_forward(ctx, x, y, s->arg);
    }
}

static lucid_status un_bwd(un_st *s, const lucid_tensor *x, const lucid_tensor *y,
                           const lucid_tensor *dy, lucid_tensor *dx, double beta) {
    switch (s->kind) {
    case 0: return lucid_nn_silu_backward(ctx, x, dy, dx, beta);
    case 1: return lucid_nn_maxpool2d_backward(ctx, x, dy, dx, s->idx, &s->pp, beta);
    case 2: return lucid_nn_upsample_nearest2d_backward(ctx, x, dy, dx, s->arg, beta);
    case 3: return lucid_nn_softmax_backward(ctx, y, dy, dx, beta);
    default: return lucid_nn_dfl_backward(ctx, x, dy, dx, s->arg, beta);
    }
}

static double un_loss(void *vs) {
    un_st *s = vs;
    if (un_fwd(s, s->x, s->y) != LUCID_OK) return NAN;
    return dot(s->y, s->r);
}

static void test_unary(const char *name, un_st *s, double lo, double hi) {
    char nm[160];
    fill_rand(s->x, lo, hi);
    fill_rand(s->r, -1, 1);
    lucid_status st = un_fwd(s, s->x, s->y);
    lucid_tensor *dx = like(s->x, LUCID_F64);
    fill_val(dx, 0.25);
    if (!st) st = un_bwd(s, s->x, s->y, s->r, dx, 1.0);
    snprintf(nm, sizeof nm, "%s: forward/backward run", name);
    CHECK_STATUS(nm, ctx, st);
    for (int64_t i = 0; i < numel(dx); i++) set(dx, i, get(dx, i) - 0.25);
    snprintf(nm, sizeof nm, "%s: gradcheck input (beta 1 accumulates)", name);
    check_grad(nm, un_loss, s, s->x, dx);

    /* low precision vs f32 on the same rounded input */
    lucid_dtype lows[2] = {LUCID_BF16, LUCID_F16};
    double us[2] = {U_BF16, U_F16};
    lucid_tensor *idx_save = s->idx;
    for (int k = 0; k < 2; k++) {
        lucid_tensor *xl = rounded(s->x, lows[k]), *x32 = conv_to(xl, LUCID_F32);
        lucid_tensor *rl = rounded(s->r, lows[k]), *r32 = conv_to(rl, LUCID_F32);
        lucid_tensor *yl = like(s->y, lows[k]), *y32 = like(s->y, LUCID_F32);
        lucid_tensor *dxl = like(s->x, lows[k]), *dx32 = like(s->x, LUCID_F32);
        s->idx = NULL; /* maxpool: recompute argmax in backward */
        st = un_fwd(s, xl, yl);
        if (!st) st = un_fwd(s, x32, y32);
        if (!st) st = un_bwd(s, xl, yl, rl, dxl, 0);
        if (!st) st = un_bwd(s, x32, y32, r32, dx32, 0);
        snprintf(nm, sizeof nm, "%s %s: runs", name, lucid_dtype_name(lows[k]));
        CHECK_STATUS(nm, ctx, st);
        snprintf(nm, sizeof nm, "%s %s: forward = f32 within one rounding", name,
                 lucid_dtype_name(lows[k]));
        check_lowp(nm, yl, y32, us[k]);
        /* softmax backward reads the rounded y: allow two roundings */
        snprintf(nm, sizeof nm, "%s %s: grad_input = f32 within %s rounding", name,
                 lucid_dtype_name(lows[k]), s->kind == 3 ? "a few units of" : "one");
        if (s->kind == 3) {
            /* dx = y*(dy - <dy,y>): y carries one rounding in the low path */
            double worst = 0;
            for (int64_t i = 0; i < numel(dx32); i++)
                worst = fmax(worst, fabs(get(dxl, i) - get(dx32, i)));
            CHECK(nm, worst <= 4 * us[k] * (1 + max_abs(dx32)), "max diff %g", worst);
        } else {
            check_lowp(nm, dxl, dx32, us[k]);
        }
        lucid_tensor *all[] = {xl, x32, rl, r32, yl, y32, dxl, dx32};
        rel(all, 8);
    }
    s->idx = idx_save;
    lucid_tensor_release(dx);
}

static void test_elementwise_family(void) {
    /* SiLU */
    {
        un_st s = {0};
        int64_t sh[4] = {2, 3, 4, 5};
        s.x = mk(LUCID_F64, 4, sh); s.y = like(s.x, LUCID_F64); s.r = like(s.x, LUCID_F64);
        test_unary("silu", &s, -6, 6);
        set(s.x, 0, 2.0);
        lucid_nn_silu_forward(ctx, s.x, s.y);
        CHECK("silu: value at 2 = 2*sigmoid(2)",
              fabs(get(s.y, 0) - 2.0 / (1 + exp(-2.0))) < 1e-15, "got %g", get(s.y, 0));
        lucid_tensor *all[] = {s.x, s.y, s.r};
        rel(all, 3);
    }
    /* MaxPool2d: k3 s2 p1 and the SPPF k5 s1 p2, indices stored */
    int pools[2][3] = {{3, 2, 1}, {5, 1, 2}};
    for (int q = 0; q < 2; q++) {
        un_st s = {0};
        s.kind = 1;
        s.pp = (lucid_pool2d_params){pools[q][0], pools[q][0], pools[q][1],
                                     pools[q][1], pools[q][2], pools[q][2]};
        s.x = mk4(LUCID_F64, 2, 3, 7, 6);
        int64_t Ho = lucid_nn_conv_out_size(7, pools[q][0], pools[q][1], pools[q][2], 1);
        int64_t Wo = lucid_nn_conv_out_size(6, pools[q][0], pools[q][1], pools[q][2], 1);
        s.y = mk4(LUCID_F64, 2, 3, Ho, Wo);
        s.r = like(s.y, LUCID_F64);
        s.idx = mk4(LUCID_I32, 2, 3, Ho, Wo);
        char nm[64];
        snprintf(nm, sizeof nm, "maxpool2d k%d s%d p%d", pools[q][0], pools[q][1],
                 pools[q][2]);
        test_unary(nm, &s, -1, 1); /* continuous random: no ties */
        /* backward without indices = with indices */
        lucid_tensor *d1 = like(s.x, LUCID_F64), *d2 = like(s.x, LUCID_F64);
        lucid_nn_maxpool2d_forward(ctx, s.x, s.y, s.idx, &s.pp);
        lucid_nn_maxpool2d_backward(ctx, s.x, s.r, d1, s.idx, &s.pp, 0);
        lucid_nn_maxpool2d_backward(ctx, s.x, s.r, d2, NULL, &s.pp, 0);
        snprintf(nm, sizeof nm, "maxpool2d k%d: backward from indices = recomputed",
                 pools[q][0]);
        CHECK(nm, max_abs_diff(d1, d2) == 0, "diff %g", max_abs_diff(d1, d2));
        lucid_tensor *all[] = {s.x, s.y, s.r, s.idx, d1, d2};
        rel(all, 6);
    }
    {   /* ties: the first maximum in row-major window order wins */
        lucid_tensor *x = mk4(LUCID_F32, 1, 1, 2, 2), *y = mk4(LUCID_F32, 1, 1, 1, 1);
        lucid_tensor *idx = mk4(LUCID_I32, 1, 1, 1, 1), *dy = like(y, LUCID_F32);
        lucid_tensor *dx = like(x, LUCID_F32);
        fill_val(x, 3.0);
        fill_val(dy, 1.0);
        lucid_pool2d_params pp = {2, 2, 2, 2, 0, 0};
        lucid_nn_maxpool2d_forward(ctx, x, y, idx, &pp);
        lucid_nn_maxpool2d_backward(ctx, x, dy, dx, NULL, &pp, 0);
        CHECK("maxpool2d: ties go to the first max (index and gradient)",
              get(idx, 0) == 0 && get(dx, 0) == 1 && get(dx, 1) == 0 && get(dx, 3) == 0,
              "index %g dx %g %g %g %g", get(idx, 0), get(dx, 0), get(dx, 1),
              get(dx, 2), get(dx, 3));
        lucid_tensor *all[] = {x, y, idx, dy, dx};
        rel(all, 5);
    }
    /* Upsample ×2 and ×3 */
    for (int sc = 2; sc <= 3; sc++) {
        un_st s = {0};
        s.kind = 2;
        s.arg = sc;
        s.x = mk4(LUCID_F64, 2, 3, 3, 4);
        s.y = mk4(LUCID_F64, 2, 3, 3 * sc, 4 * sc);
        s.r = like(s.y, LUCID_F64);
        char nm[64];
        snprintf(nm, sizeof nm, "upsample nearest x%d", sc);
        test_unary(nm, &s, -1, 1);
        lucid_nn_upsample_nearest2d_forward(ctx, s.x, s.y, sc);
        int ok = 1;
        for (int i = 0; i < 3 * sc && ok; i++)
            for (int j = 0; j < 4 * sc && ok; j++)
                ok = get(s.y, ((1 * 3 + 2) * 3 * sc + i) * 4 * sc + j) ==
                     get(s.x, ((1 * 3 + 2) * 3 + i / sc) * 4 + j / sc);
        snprintf(nm, sizeof nm, "upsample nearest x%d: y[i,j] = x[i/s, j/s]", sc);
        CHECK(nm, ok, "mismatch");
        lucid_tensor *all[] = {s.x, s.y, s.r};
        rel(all, 3);
    }
    /* softmax over the last dim */
    {
        un_st s = {0};
        s.kind = 3;
        int64_t sh[3] = {3, 5, 7};
        s.x = mk(LUCID_F64, 3, sh); s.y = like(s.x, LUCID_F64); s.r = like(s.x, LUCID_F64);
        test_unary("softmax", &s, -3, 3);
        fill_rand(s.x, -3, 3);
        set(s.x, 0, 800.0); /* stability: no overflow */
        lucid_nn_softmax_forward(ctx, s.x, s.y);
        double worst = 0;
        for (int r = 0; r < 15; r++) {
            double z = 0, m = -INFINITY;
            for (int i = 0; i < 7; i++) m = fmax(m, get(s.x, r * 7 + i));
            for (int i = 0; i < 7; i++) z += exp(get(s.x, r * 7 + i) - m);
            for (int i = 0; i < 7; i++)
                worst = fmax(worst, fabs(get(s.y, r * 7 + i) -
                                         exp(get(s.x, r * 7 + i) - m) / z));
        }
        CHECK("softmax: values = exp(x-max)/sum, stable for large inputs",
              worst < 1e-15 && fabs(get(s.y, 0) - 1) < 1e-15, "worst %g", worst);
        lucid_tensor *all[] = {s.x, s.y, s.r};
        rel(all, 3);
    }
    /* DFL: [B, 64, A] (reg_max 16) and a 4-D [B, 12, H, W] (reg_max 3) */
    for (int q = 0; q < 2; q++) {
        un_st s = {0};
        s.kind = 4;
        s.arg = q == 0 ? 16 : 3;
        if (q == 0) {
            int64_t xs[3] = {2, 64, 5}, ys[3] = {2, 4, 5};
            s.x = mk(LUCID_F64, 3, xs);
            s.y = mk(LUCID_F64, 3, ys);
        } else {
            s.x = mk4(LUCID_F64, 2, 12, 2, 3);
            s.y = mk4(LUCID_F64, 2, 4, 2, 3);
        }
        s.r = like(s.y, LUCID_F64);
        char nm[64];
        snprintf(nm, sizeof nm, "dfl reg_max %d", s.arg);
        test_unary(nm, &s, -3, 3);
        lucid_nn_dfl_forward(ctx, s.x, s.y, s.arg);
        int64_t S = numel(s.y) / (2 * 4);
        double worst = 0;
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < 4; j++)
                for (int64_t a = 0; a < S; a++) {
                    double z = 0, e = 0;
                    for (int k = 0; k < s.arg; k++)
                        z += exp(get(s.x, ((int64_t)b * 4 * s.arg + j * s.arg + k) * S + a));
                    for (int k = 0; k < s.arg; k++)
                        e += k * exp(get(s.x, ((int64_t)b * 4 * s.arg + j * s.arg + k) * S + a)) / z;
                    worst = fmax(worst, fabs(e - get(s.y, (b * 4 + j) * S + a)));
                }
        snprintf(nm, sizeof nm, "dfl reg_max %d: y = sum_k k softmax_k (x.view(B,4,R,A))",
                 s.arg);
        CHECK(nm, worst < 1e-12, "worst %g", worst);
        lucid_tensor *all[] = {s.x, s.y, s.r};
        rel(all, 3);
    }
}

// ----------------------------------------------------------------------------
// channel copy and Add

static void test_copy_add(void) {
    lucid_tensor *a = mk4(LUCID_F32, 2, 3, 2, 2), *b = mk4(LUCID_F32, 2, 5, 2, 2);
    lucid_tensor *cat = mk4(LUCID_F32, 2, 8, 2, 2);
    fill_rand(a, -1, 1);
    fill_rand(b, -1, 1);
    lucid_status st = lucid_nn_channel_copy(ctx, cat, 0, a, 0, 3, 0);
    if (!st) st = lucid_nn_channel_copy(ctx, cat, 3, b, 0, 5, 0);
    int ok = st == LUCID_OK;
    for (int n = 0; n < 2 && ok; n++)
        for (int c = 0; c < 8 && ok; c++)
            for (int i = 0; i < 4 && ok; i++) {
                double want = c < 3 ? get(a, (n * 3 + c) * 4 + i)
                                    : get(b, (n * 5 + c - 3) * 4 + i);
                ok = get(cat, (n * 8 + c) * 4 + i) == want;
            }
    CHECK("channel_copy: concat of [2,3,..] and [2,5,..] = torch.cat(dim=1)", ok,
          "status %s", lucid_status_name(st));
    /* beta 1 accumulates a slice out of cat into a bf16 destination */
    lucid_tensor *g = mk4(LUCID_BF16, 2, 2, 2, 2);
    fill_val(g, 1.0);
    st = lucid_nn_channel_copy(ctx, g, 0, cat, 4, 2, 1.0);
    ok = st == LUCID_OK;
    for (int n = 0; n < 2 && ok; n++)
        for (int c = 0; c < 2 && ok; c++)
            for (int i = 0; i < 4 && ok; i++) {
                double want = 1.0 + get(b, (n * 5 + 1 + c) * 4 + i);
                ok = fabs(get(g, (n * 2 + c) * 4 + i) - want) <= U_BF16 * fabs(want);
            }
    CHECK("channel_copy: slice [4,6) accumulated (beta 1) with dtype conversion", ok,
          "status %s", lucid_status_name(st));
    st = lucid_nn_channel_copy(ctx, cat, 6, b, 0, 5, 0);
    CHECK("channel_copy: out-of-range slice is ERR_ARG", st == LUCID_ERR_ARG,
          "status %s", lucid_status_name(st));
    lucid_tensor *y = like(a, LUCID_F32), *a2 = like(a, LUCID_F32);
    fill_rand(a2, -1, 1);
    st = lucid_nn_add_forward(ctx, a, a2, y);
    ok = st == LUCID_OK;
    for (int64_t i = 0; i < numel(y) && ok; i++)
        ok = get(y, i) == (double)(float)(get(a, i) + get(a2, i));
    CHECK("add: y = a + b", ok, "status %s", lucid_status_name(st));
    lucid_tensor *all[] = {a, b, cat, g, y, a2};
    rel(all, 6);
}

static void test_table(void) {
    const lucid_nn_kernels *k = lucid_nn_cpu_kernels();
    int full = k && k->conv2d_forward && k->conv2d_backward_input &&
               k->conv2d_backward_params && k->batchnorm2d_forward &&
               k->batchnorm2d_backward && k->silu_forward && k->silu_backward &&
               k->maxpool2d_forward && k->maxpool2d_backward &&
               k->upsample_nearest2d_forward && k->upsample_nearest2d_backward &&
               k->channel_copy && k->add_forward && k->softmax_forward &&
               k->softmax_backward && k->dfl_forward && k->dfl_backward;
    CHECK("kernel table: cpu table complete", full && strcmp(k->name, "cpu") == 0,
          "missing slot");
    lucid_device cuda = {LUCID_CUDA, 0};
    if (lucid_nn_cuda_kernels() != NULL) {
        TEST_SKIP("kernel table: cuda absent in a CPU build", "this build has the CUDA nn kernels");
    } else {
        const lucid_nn_kernels *c = lucid_nn_kernels_for(ctx, cuda);
        CHECK("kernel table: cuda lookup in a CPU-only build is ERR_UNSUPPORTED",
              c == NULL && lucid_ctx_last_status(ctx) == LUCID_ERR_UNSUPPORTED,
              "got %p status %s", (const void *)c,
              lucid_status_name(lucid_ctx_last_status(ctx)));
    }
}

int main(void) {
    nn_ctx_open(1);
    test_table();
    test_conv();
    test_bn();
    test_bn_running();
    test_elementwise_family();
    test_copy_add();
    lucid_ctx_release(ctx);
    return test_exit();
}
