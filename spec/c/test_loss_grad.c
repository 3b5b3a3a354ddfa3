/*
 * test_loss_grad.c — finite-difference check, in float64, of the pose loss
 * backward (engine/train/loss.h) w.r.t. all three network outputs.
 *
 * Problem: B = 2, a 64x64 image (levels 8x8, 4x4, 2x2: A = 84), nc = 2,
 * K = 17, max_gt = 3 (image 1: two instances + one padding row), random
 * outputs and targets. Every one of the 2*84*(64+2+51) = 19656 output
 * elements is perturbed by +-h (central difference).
 *
 * The reference loss treats the assignment (fg mask, target boxes and
 * scores, tss, n_fg) and the CIoU alpha as constants (computed under
 * no_grad), so the loss as a function of the outputs is checked with those
 * held at the base point: lucid_pose_loss_plan_set_frozen(plan, 1) after
 * one ordinary forward. Without freezing, the differences would include the
 * derivative of the (detached) target scores.
 */
#include "test.h"
#include "internal.h" /* lucid_cpu_get/set */
#include "train/loss.h"

static uint64_t rng_s = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng_s ^= rng_s >> 12, rng_s ^= rng_s << 25, rng_s ^= rng_s >> 27;
    return (double)((rng_s * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static lucid_tensor *mk(lucid_ctx *ctx, lucid_dtype dt, int nd, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t = NULL;
    lucid_tensor_zeros(ctx, (lucid_device){LUCID_CPU, 0}, dt, nd, sh, &t);
    return t;
}

int main(void) {
    enum { B = 2, G = 3, NC = 2 };
    lucid_ctx *ctx = NULL;
    lucid_ctx_options opt = lucid_ctx_options_default();
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    cfg.batch = B, cfg.nc = NC, cfg.max_gt = G;
    lucid_pose_loss_config_levels(&cfg, 64, 64);
    lucid_pose_loss_plan *plan = NULL;
    CHECK_STATUS("grad: plan", ctx,
                 lucid_pose_loss_plan_create(ctx, (lucid_device){LUCID_CPU, 0},
                                             &cfg, &plan));
    if (!plan) return test_exit();
    const int A = lucid_pose_loss_plan_anchors(plan);
    lucid_tensor *out[3] = {mk(ctx, LUCID_F64, 3, B, 64, A, 0),
                            mk(ctx, LUCID_F64, 3, B, NC, A, 0),
                            mk(ctx, LUCID_F64, 3, B, 51, A, 0)};
    lucid_tensor *grad[3] = {mk(ctx, LUCID_F64, 3, B, 64, A, 0),
                             mk(ctx, LUCID_F64, 3, B, NC, A, 0),
                             mk(ctx, LUCID_F64, 3, B, 51, A, 0)};
    lucid_tensor *tc = mk(ctx, LUCID_F32, 2, B, G, 0, 0);
    lucid_tensor *tb = mk(ctx, LUCID_F32, 3, B, G, 4, 0);
    lucid_tensor *tk = mk(ctx, LUCID_F32, 4, B, G, 17, 3);
    lucid_tensor *tv = mk(ctx, LUCID_F32, 2, B, G, 0, 0);
    lucid_tensor *total = mk(ctx, LUCID_F64, 1, 1, 0, 0, 0);
    lucid_tensor *scale = mk(ctx, LUCID_F64, 1, 1, 0, 0, 0);
    lucid_pose_targets tg = {tc, tb, tk, tv};

    /* Outputs: box logits decreasing with the bin (distances ~2 cells). */
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            for (int c = 0; c < 64; c++)
                lucid_cpu_set(out[0], ((int64_t)b * 64 + c) * A + a,
                              nrand() - 0.4 * (c % 16));
            for (int c = 0; c < NC; c++)
                lucid_cpu_set(out[1], ((int64_t)b * NC + c) * A + a, nrand() - 1);
            for (int c = 0; c < 51; c++)
                lucid_cpu_set(out[2], ((int64_t)b * 51 + c) * A + a, 0.5 * nrand());
        }
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            int64_t r = (int64_t)b * G + g;
            double x = 0.25 + 0.5 * urand(), y = 0.25 + 0.5 * urand();
            double w = 0.15 + 0.35 * urand(), h = 0.15 + 0.35 * urand();
            double bx[4] = {x, y, w, h};
            lucid_cpu_set(tv, r, !(b == 1 && g == 2));
            lucid_cpu_set(tc, r, g % 2);
            for (int j = 0; j < 4; j++) lucid_cpu_set(tb, r * 4 + j, bx[j]);
            for (int k = 0; k < 17; k++) {
                lucid_cpu_set(tk, (r * 17 + k) * 3 + 0, x + w * (urand() - 0.5));
                lucid_cpu_set(tk, (r * 17 + k) * 3 + 1, y + h * (urand() - 0.5));
                lucid_cpu_set(tk, (r * 17 + k) * 3 + 2, (int)(3 * urand()));
            }
        }

    CHECK_STATUS("grad: forward", ctx,
                 lucid_pose_loss_forward(ctx, plan, out[0], out[1], out[2], &tg,
                                         total, NULL));
    const double base = lucid_cpu_get(total, 0);
    double nfg = 0, tss = 0;
    lucid_pose_loss_read_assignment(ctx, plan, NULL, NULL, &nfg, &tss);
    CHECK("grad: problem has foreground (n_fg >= 10, tss > 1 or not)",
          nfg >= 10 && isfinite(base), "nfg %g total %g", nfg, base);
    CHECK_STATUS("grad: backward", ctx,
                 lucid_pose_loss_backward(ctx, plan, out[0], out[1], out[2], NULL,
                                          grad[0], grad[1], grad[2]));
    lucid_pose_loss_plan_set_frozen(plan, 1);
    lucid_pose_loss_forward(ctx, plan, out[0], out[1], out[2], NULL, total, NULL);
    CHECK("grad: frozen forward reproduces the loss",
          lucid_cpu_get(total, 0) == base, "%.17g vs %.17g",
          lucid_cpu_get(total, 0), base);

    static const char *names[3] = {"box logits", "class logits", "keypoints"};
    const double h = 1e-6;
    for (int j = 0; j < 3; j++) {
        /* pass: |fd - an| <= 5e-8 + 1e-6 |an| (the central difference
         * carries ~1e-8 of rounding noise: |total| ~ 1e2, eps 1e-16, h 1e-6) */
        double worst = 0, gmax = 0, wabs = 0, wrel = 0;
        int64_t wi = -1, nonzero = 0;
        double wa = 0, wf = 0;
        for (int64_t i = 0; i < lucid_tensor_numel(out[j]); i++) {
            double v = lucid_cpu_get(out[j], i);
            lucid_cpu_set(out[j], i, v + h);
            lucid_pose_loss_forward(ctx, plan, out[0], out[1], out[2], NULL, total, NULL);
            double fp = lucid_cpu_get(total, 0);
            lucid_cpu_set(out[j], i, v - h);
            lucid_pose_loss_forward(ctx, plan, out[0], out[1], out[2], NULL, total, NULL);
            double fm = lucid_cpu_get(total, 0);
            lucid_cpu_set(out[j], i, v);
            double fd = (fp - fm) / (2 * h), an = lucid_cpu_get(grad[j], i);
            double d = fabs(fd - an), e = d / (5e-8 + 1e-6 * fabs(an));
            nonzero += an != 0;
            gmax = fmax(gmax, fabs(an));
            wabs = fmax(wabs, d);
            if (fabs(an) > 1e-3) wrel = fmax(wrel, d / fabs(an));
            if (e > worst) worst = e, wi = i, wa = an, wf = fd;
        }
        char nm[96];
        snprintf(nm, sizeof nm, "grad: finite differences, %s", names[j]);
        CHECK(nm, worst <= 1 && nonzero > 0,
              "worst at %lld (analytic %.10g, fd %.10g), %lld nonzero",
              (long long)wi, wa, wf, (long long)nonzero);
        printf("# %s: max abs err %.3g, max rel err (|g|>1e-3) %.3g, %lld "
               "nonzero, max |g| %.4g\n",
               names[j], wabs, wrel, (long long)nonzero, gmax);
    }

    /* grad_scale multiplies every gradient (fp16 loss scale). */
    lucid_cpu_set(scale, 0, 2.5);
    lucid_tensor *g2 = mk(ctx, LUCID_F64, 3, B, 64, A, 0);
    lucid_pose_loss_plan_set_frozen(plan, 0);
    lucid_pose_loss_forward(ctx, plan, out[0], out[1], out[2], &tg, total, NULL);
    CHECK_STATUS("grad: backward with grad_scale", ctx,
                 lucid_pose_loss_backward(ctx, plan, out[0], out[1], out[2], scale,
                                          g2, NULL, NULL));
    double e = 0;
    for (int64_t i = 0; i < lucid_tensor_numel(g2); i++)
        e = fmax(e, fabs(lucid_cpu_get(g2, i) - 2.5 * lucid_cpu_get(grad[0], i)));
    CHECK("grad: grad_scale scales the gradient", e < 1e-12, "err %g", e);

    lucid_tensor *all[] = {out[0], out[1], out[2], grad[0], grad[1], grad[2],
                           tc, tb, tk, tv, total, scale, g2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lucid_tensor_release(all[i]);
    lucid_pose_loss_plan_destroy(plan);
    lucid_ctx_release(ctx);
    return test_exit();
}
