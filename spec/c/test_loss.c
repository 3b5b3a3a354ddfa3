/*
 * test_loss.c — the pose loss (engine/train/loss.h) on the CPU: hand-checked
 * cases, a degenerate box, f32 vs f64, no allocation per call.
 * (The finite-difference gradient check is test_loss_grad.c.)
 *
 * Expected values are computed from the reference formulas (reference §2)
 * outside lucid: the closed forms are in the comments, the digits come from
 * a direct Python transcription of bbox_iou/TAL (math module, float64).
 *
 * Geometry shared by the cases: a 64x64 image, levels 8x8 (s8), 4x4 (s16),
 * 2x2 (s32) = 84 anchors; anchor a = i*8 + j of level 0 sits at pixel
 * (8j + 4, 8i + 4), so a = 9 is at (12, 12) and a = 10 at (20, 12).
 */
#define LUCID_POSE_LOSS_INTERNAL
#include "test.h"
#include "internal.h" /* lucid_cpu_get/set: element access in tests */
#include "train/loss.h"

#define LN2 0.69314718055994530942
#define LN3 1.09861228866810969140
static const double SIG[17] = {.026, .025, .025, .035, .035, .079, .079,
                               .072, .072, .062, .062, .107, .107, .087,
                               .087, .089, .089};

/* ------------------------------------------------------------ problem */

typedef struct prob {
    lucid_ctx *ctx;
    int B, G, nc, K, A, R;
    lucid_dtype dt;
    lucid_pose_loss_plan *plan;
    lucid_tensor *pb, *pc, *pk, *gb, *gc, *gk;
    lucid_tensor *tc, *tb, *tk, *tv, *total, *items;
    lucid_pose_targets tg;
} prob;

static lucid_tensor *mk(lucid_ctx *ctx, lucid_dtype dt, int nd, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t = NULL;
    if (lucid_tensor_zeros(ctx, (lucid_device){LUCID_CPU, 0}, dt, nd, sh, &t))
        return NULL;
    return t;
}

static int prob_init(prob *P, lucid_ctx *ctx, int B, int G, int nc,
                     lucid_dtype dt) {
    memset(P, 0, sizeof *P);
    P->ctx = ctx, P->B = B, P->G = G, P->nc = nc, P->K = 17, P->R = 16;
    P->dt = dt;
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    cfg.batch = B, cfg.nc = nc, cfg.max_gt = G;
    lucid_pose_loss_config_levels(&cfg, 64, 64);
    if (lucid_pose_loss_plan_create(ctx, (lucid_device){LUCID_CPU, 0}, &cfg,
                                    &P->plan))
        return -1;
    P->A = lucid_pose_loss_plan_anchors(P->plan);
    P->pb = mk(ctx, dt, 3, B, 64, P->A, 0);
    P->pc = mk(ctx, dt, 3, B, nc, P->A, 0);
    P->pk = mk(ctx, dt, 3, B, 51, P->A, 0);
    P->gb = mk(ctx, dt, 3, B, 64, P->A, 0);
    P->gc = mk(ctx, dt, 3, B, nc, P->A, 0);
    P->gk = mk(ctx, dt, 3, B, 51, P->A, 0);
    P->tc = mk(ctx, LUCID_F32, 2, B, G, 0, 0);
    P->tb = mk(ctx, LUCID_F32, 3, B, G, 4, 0);
    P->tk = mk(ctx, LUCID_F32, 4, B, G, 17, 3);
    P->tv = mk(ctx, LUCID_U8, 2, B, G, 0, 0);
    P->total = mk(ctx, LUCID_F64, 1, 1, 0, 0, 0);
    P->items = mk(ctx, LUCID_F64, 1, 5, 0, 0, 0);
    P->tg = (lucid_pose_targets){P->tc, P->tb, P->tk, P->tv};
    return P->pb && P->pc && P->pk && P->gb && P->gc && P->gk && P->tc &&
                   P->tb && P->tk && P->tv && P->total && P->items
               ? 0
               : -1;
}

static void prob_free(prob *P) {
    lucid_tensor *ts[] = {P->pb, P->pc, P->pk, P->gb, P->gc, P->gk,
                          P->tc, P->tb, P->tk, P->tv, P->total, P->items};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lucid_tensor_release(ts[i]);
    lucid_pose_loss_plan_destroy(P->plan);
}

static void set3(lucid_tensor *t, int b, int c, int a, double v) {
    lucid_cpu_set(t, (b * t->shape[1] + c) * t->shape[2] + a, v);
}
static double get3(const lucid_tensor *t, int b, int c, int a) {
    return lucid_cpu_get(t, (b * t->shape[1] + c) * t->shape[2] + a);
}

/* Box logits of one side at anchor a: bins [lo, hi] = 0, the rest -1e4
 * (probability exactly 0), so the expectation is (lo + hi) / 2. */
static void side(prob *P, int b, int a, int s, int lo, int hi) {
    for (int i = 0; i < 16; i++)
        set3(P->pb, b, s * 16 + i, a, (i >= lo && i <= hi) ? 0.0 : -1e4);
}

/* A gt row: class, normalised xywh, all 17 keypoints at (kx, ky, v). */
static void gt(prob *P, int b, int g, int valid, double cls, double x,
               double y, double w, double h, double kx, double ky, double v) {
    int64_t r = (int64_t)b * P->G + g;
    lucid_cpu_set(P->tv, r, valid);
    lucid_cpu_set(P->tc, r, cls);
    double bx[4] = {x, y, w, h};
    for (int j = 0; j < 4; j++) lucid_cpu_set(P->tb, r * 4 + j, bx[j]);
    for (int k = 0; k < 17; k++) {
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 0, kx);
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 1, ky);
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 2, v);
    }
}

static lucid_status fwd(prob *P) {
    return lucid_pose_loss_forward(P->ctx, P->plan, P->pb, P->pc, P->pk, &P->tg,
                                   P->total, P->items);
}
static lucid_status bwd(prob *P) {
    return lucid_pose_loss_backward(P->ctx, P->plan, P->pb, P->pc, P->pk, NULL,
                                    P->gb, P->gc, P->gk);
}

static double item(prob *P, int i) { return lucid_cpu_get(P->items, i); }

static int all_finite(const lucid_tensor *t) {
    for (int64_t i = 0; i < lucid_tensor_numel(t); i++)
        if (!isfinite(lucid_cpu_get(t, i))) return 0;
    return 1;
}

static void check_items(const char *name, prob *P, const double *want,
                        double want_total, double tol) {
    char nm[128];
    static const char *nms[5] = {"box", "pose", "kobj", "cls", "dfl"};
    for (int i = 0; i < 5; i++) {
        snprintf(nm, sizeof nm, "%s: %s item", name, nms[i]);
        double got = item(P, i);
        CHECK(nm, fabs(got - want[i]) <= tol * fabs(want[i]) + 1e-12,
              "got %.12g want %.12g", got, want[i]);
    }
    snprintf(nm, sizeof nm, "%s: total", name);
    double got = lucid_cpu_get(P->total, 0);
    CHECK(nm, fabs(got - want_total) <= tol * fabs(want_total),
          "got %.12g want %.12g", got, want_total);
}

/* ------------------------------------------------------------ cases */

/* Case 1: one gt, px (8,8)-(16,16) (w = h = 8: no widening). Its only
 * candidate is a = 9 (the s16 anchor (8,8) and the s32 anchor (16,16) sit on
 * its border: margin 0, not > 1e-9). A padding row with a real-looking box
 * must be ignored. Predictions at a = 9: sides l, t, b with bins {0,1}
 * (E = 0.5), side r with bins {0,1,2} (E = 1): pred = (1, 1, 2.5, 2) grid,
 * gt = (1, 1, 2, 2) grid. All class logits 0, all raw keypoints 0.
 *   iou = 1/1.5, rho2/c2 = 0.0625/3.25, v = 4/pi^2 (pi/4 - atan 1.5)^2,
 *   CIoU = 2/3 - 1/52 - v^2/(v + 1/3) = 0.6467214296 (grid; 0.6467215698 in
 *   pixels, the eps terms differ). align = sqrt(0.5) ov^6 >> 1e-9, so
 *   norm = ov (1 - ~1e-8) = 0.64672155727790537; tss = max(norm, 1) = 1.
 *   cls  = 84 ln 2 (BCE(0, y) = ln 2 whatever y)
 *   box  = (1 - CIoU_grid) norm
 *   dfl  = norm (3 ln 2 + ln 3) / 4   (targets 0.5 on every side)
 *   pose: pred kpt = 2*0 + 1.5 - 0.5 = 1, gt kpt = 12/8 = 1.5 -> d = 0.5,
 *         area = 1: pose = sum_k (1 - exp(-0.5 / (8 sigma_k^2))) / 17
 *   kobj = ln 2. */
static void case_single(lucid_ctx *ctx, lucid_dtype dt) {
    const char *name = dt == LUCID_F64 ? "single anchor f64" : "single anchor f32";
    prob P;
    if (prob_init(&P, ctx, 1, 2, 1, dt)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    side(&P, 0, 9, 0, 0, 1);
    side(&P, 0, 9, 1, 0, 1);
    side(&P, 0, 9, 2, 0, 2);
    side(&P, 0, 9, 3, 0, 1);
    gt(&P, 0, 0, 1, 0, 0.1875, 0.1875, 0.125, 0.125, 0.1875, 0.1875, 2);
    gt(&P, 0, 1, 0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2); /* padding */
    char nm[128];
    snprintf(nm, sizeof nm, "%s: forward", name);
    CHECK_STATUS(nm, ctx, fwd(&P));
    int32_t idx[84];
    double sc[84], nfg, tss;
    lucid_pose_loss_read_assignment(ctx, P.plan, idx, sc, &nfg, &tss);
    int others = 0;
    for (int a = 0; a < 84; a++) others += a != 9 && idx[a] != -1;
    snprintf(nm, sizeof nm, "%s: only anchor 9 is fg, assigned to gt 0", name);
    CHECK(nm, idx[9] == 0 && others == 0 && nfg == 1, "idx9=%d others=%d nfg=%g",
          idx[9], others, nfg);
    const double norm = 0.64672155727790537;
    const double tol = dt == LUCID_F64 ? 1e-9 : 3e-6;
    snprintf(nm, sizeof nm, "%s: target score = CIoU overlap", name);
    CHECK(nm, fabs(sc[9] - norm) < tol && tss == 1.0, "score %.12g tss %g",
          sc[9], tss);
    double pose = 0;
    for (int k = 0; k < 17; k++)
        pose += 1.0 * /* factor fl(fl(1/17) * 17) = 1 */
                (1 - exp(-0.5 / (4 * SIG[k] * SIG[k] * (1 + 1e-9) * 2)));
    pose /= 17;
    const double want[5] = {7.5 * (1 - 0.64672142962953316) * norm,
                            12 * pose, LN2, 0.5 * 84 * LN2,
                            1.5 * norm * (3 * LN2 + LN3) / 4};
    check_items(name, &P, want, 44.282641593343499, tol);

    snprintf(nm, sizeof nm, "%s: backward", name);
    CHECK_STATUS(nm, ctx, bwd(&P));
    /* d total/d z_cls = 0.5 (sigmoid(z) - y) / tss with B = 1. */
    snprintf(nm, sizeof nm, "%s: cls grad", name);
    double g0 = get3(P.gc, 0, 0, 0), g9 = get3(P.gc, 0, 0, 9);
    CHECK(nm, fabs(g0 - 0.25) < tol && fabs(g9 - 0.5 * (0.5 - norm)) < tol,
          "bg %.12g (0.25) fg %.12g (%.12g)", g9, g0, 0.5 * (0.5 - norm));
    /* kobj: (sigmoid(0) - 1) / (n_fg K) = -1/34 ; pose x of keypoint 0:
     * 12/17 * factor * exp(-e0) / den0 * 4 dx, dx = 1 - 1.5. */
    double den0 = 4 * SIG[0] * SIG[0] * (1 + 1e-9) * 2;
    double gx = 12.0 / 17 * exp(-0.5 / den0) / den0 * 4 * -0.5;
    snprintf(nm, sizeof nm, "%s: keypoint grads", name);
    CHECK(nm, fabs(get3(P.gk, 0, 2, 9) + 1.0 / 34) < tol &&
                  test_relerr(get3(P.gk, 0, 0, 9), gx) < tol &&
                  test_relerr(get3(P.gk, 0, 1, 9), gx) < tol,
          "vis %.12g pose-x %.12g want %.12g", get3(P.gk, 0, 2, 9),
          get3(P.gk, 0, 0, 9), gx);
    /* Side l of a = 9: p = (1/2, 1/2) equals the target mix (wl = wr = 1/2),
     * so the DFL part vanishes and only CIoU's dE p_i (i - E) remains:
     * equal and opposite on bins 0 and 1, zero elsewhere. */
    double b0 = get3(P.gb, 0, 0, 9), b1 = get3(P.gb, 0, 1, 9);
    double rest = 0;
    for (int i = 2; i < 16; i++) rest += fabs(get3(P.gb, 0, i, 9));
    snprintf(nm, sizeof nm, "%s: box grad structure", name);
    CHECK(nm, fabs(b0 + b1) < tol && rest == 0 && b0 != 0, "b0 %g b1 %g rest %g",
          b0, b1, rest);
    double bg = 0;
    for (int c = 0; c < 64; c++) bg += fabs(get3(P.gb, 0, c, 0));
    for (int c = 0; c < 51; c++) bg += fabs(get3(P.gk, 0, c, 0));
    snprintf(nm, sizeof nm, "%s: background box/kpt grads are zero", name);
    CHECK(nm, bg == 0, "sum |g| = %g", bg);
    prob_free(&P);
}

/* Case 2: one gt claimed by two anchors. gt px (8,8)-(24,16) = grid
 * (1,1,3,2); candidates a = 9 and a = 10 only. a = 9 predicts (1,1,2.5,2),
 * a = 10 predicts the gt exactly (l bins {1,2}: E = 1.5; t, r, b bins {0,1}).
 *   ov9 = 0.73734670498883625, ov10 = 0.99999997421875086 (pixels)
 *   norm_i = align_i * max ov / (max align + 1e-9):
 *   n9 = (ov9/ov10)^6 ov10 = 0.16070541787260598, n10 = 0.99999997280453712,
 *   tss = n9 + n10 = 1.1607053906771432 (> 1, so it divides).
 *   cls = 84 ln 2 / tss; dfl = (n9 (3 ln2 + ln3)/4 + n10 ln 2) / tss.
 * Keypoints at the gt centre (16,12) px = (2,1.5) grid, only k < 10 visible;
 * preds (1,1) and (2,1): d = 1.25 and 0.25, area 2, factor 17/10 formed
 * in float32 as the reference does: fl(fl(1/10) * 17) = 1.7000000477. */
static void case_two_anchors(lucid_ctx *ctx) {
    const char *name = "two anchors";
    prob P;
    if (prob_init(&P, ctx, 1, 1, 1, LUCID_F64)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    side(&P, 0, 9, 0, 0, 1), side(&P, 0, 9, 1, 0, 1);
    side(&P, 0, 9, 2, 0, 2), side(&P, 0, 9, 3, 0, 1);
    side(&P, 0, 10, 0, 1, 2), side(&P, 0, 10, 1, 0, 1);
    side(&P, 0, 10, 2, 0, 1), side(&P, 0, 10, 3, 0, 1);
    gt(&P, 0, 0, 1, 0, 0.25, 0.1875, 0.25, 0.125, 0.25, 0.1875, 2);
    for (int k = 10; k < 17; k++) lucid_cpu_set(P.tk, k * 3 + 2, 0);
    CHECK_STATUS("two anchors: forward", ctx, fwd(&P));
    int32_t idx[84];
    double sc[84], nfg, tss;
    lucid_pose_loss_read_assignment(ctx, P.plan, idx, sc, &nfg, &tss);
    CHECK("two anchors: both fg for gt 0",
          idx[9] == 0 && idx[10] == 0 && nfg == 2, "idx %d %d nfg %g", idx[9],
          idx[10], nfg);
    CHECK("two anchors: normalised scores",
          fabs(sc[9] - 0.16070541787260598) < 1e-9 &&
              fabs(sc[10] - 0.99999997280453712) < 1e-9 &&
              fabs(tss - 1.1607053906771432) < 1e-9,
          "n9 %.15g n10 %.15g tss %.15g", sc[9], sc[10], tss);
    const double want[5] = {0.27274415761134901, 11.832635445920754, LN2,
                            25.081456343141447, 1.0607727665125462};
    check_items(name, &P, want, 38.940755893746051, 1e-9);
    prob_free(&P);
}

/* Case 3: an anchor claimed by two gts goes to the gt of higher overlap.
 * g0 = (1,1,3,2) grid, g1 = (1,1,2,2) grid (listed second on purpose).
 * a = 9 predicts (1,1,2,2) = g1, a = 10 predicts (2,1,3,2). a = 9 is a
 * positive of both; ov(g0,9) = 0.44675186156078384 < ov(g1,9) =
 * 0.99999997343750091, so a = 9 -> g1 and a = 10 -> g0 with
 *   n9 = 0.99999997202328728, n10 = 0.44675178209447025,
 *   tss = 1.4467517541177575, box = 0.17084128695010053 (raw). */
static void case_two_gts(lucid_ctx *ctx) {
    prob P;
    if (prob_init(&P, ctx, 1, 2, 1, LUCID_F64)) {
        TEST_FAIL("two gts", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    for (int s = 0; s < 4; s++) side(&P, 0, 9, s, 0, 1), side(&P, 0, 10, s, 0, 1);
    /* a = 10, side l: p = (0.6, 0.3, 0.1) -> E = 0.5, finite DFL at 1.5 */
    for (int i = 0; i < 3; i++) set3(P.pb, 0, i, 10, log((double[]){.6, .3, .1}[i]));
    gt(&P, 0, 0, 1, 0, 0.25, 0.1875, 0.25, 0.125, 0.25, 0.1875, 2);
    gt(&P, 0, 1, 1, 0, 0.1875, 0.1875, 0.125, 0.125, 0.1875, 0.1875, 2);
    CHECK_STATUS("two gts: forward", ctx, fwd(&P));
    int32_t idx[84];
    double sc[84], nfg, tss;
    lucid_pose_loss_read_assignment(ctx, P.plan, idx, sc, &nfg, &tss);
    CHECK("two gts: shared anchor goes to the higher-IoU gt",
          idx[9] == 1 && idx[10] == 0 && nfg == 2, "idx %d %d nfg %g", idx[9],
          idx[10], nfg);
    CHECK("two gts: scores and tss",
          fabs(sc[9] - 0.99999997202328728) < 1e-9 &&
              fabs(sc[10] - 0.44675178209447025) < 1e-9 &&
              fabs(tss - 1.4467517541177575) < 1e-9,
          "n9 %.15g n10 %.15g tss %.15g", sc[9], sc[10], tss);
    CHECK("two gts: box item", fabs(item(&P, 0) - 7.5 * 0.17084128695010053) < 1e-9,
          "got %.15g", item(&P, 0));
    CHECK("two gts: total finite", isfinite(lucid_cpu_get(P.total, 0)), "total");
    prob_free(&P);
}

/* Case 4: no instances (every row padding, with junk values). B = 2, class
 * logits z = (a % 3) - 1. Only cls: sum over both images of ln(1 + e^z) =
 * 2 * 28 * (ln(1+e^-1) + ln 2 + ln(1+e)) = 56 ln(2 (2 + e + 1/e))
 * = 129.90155284...; tss = 1. items cls = 0.5 * that, total = 2 * item.
 * Gradient: d total / d z = 2 * 0.5 * sigmoid(z); box/kpt grads zero. */
static void case_empty(lucid_ctx *ctx) {
    prob P;
    if (prob_init(&P, ctx, 2, 3, 1, LUCID_F64)) {
        TEST_FAIL("no instances", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    for (int b = 0; b < 2; b++) {
        for (int g = 0; g < 3; g++) gt(&P, b, g, 0, 0, 0.5, 0.5, 0.3, 0.3, 0.5, 0.5, 2);
        for (int a = 0; a < 84; a++) set3(P.pc, b, 0, a, (a % 3) - 1.0);
    }
    CHECK_STATUS("no instances: forward", ctx, fwd(&P));
    double s = 56 * log(2 * (2 + exp(1.0) + exp(-1.0)));
    const double want[5] = {0, 0, 0, 0.5 * s, 0};
    check_items("no instances", &P, want, s, 1e-12);
    CHECK_STATUS("no instances: backward", ctx, bwd(&P));
    double err = 0, other = 0;
    for (int b = 0; b < 2; b++)
        for (int a = 0; a < 84; a++) {
            double z = (a % 3) - 1.0;
            err = fmax(err, fabs(get3(P.gc, b, 0, a) - 1 / (1 + exp(-z))));
            for (int c = 0; c < 64; c++) other += fabs(get3(P.gb, b, c, a));
            for (int c = 0; c < 51; c++) other += fabs(get3(P.gk, b, c, a));
        }
    CHECK("no instances: cls grad = sigmoid(z), others 0", err < 1e-12 && other == 0,
          "err %g other %g", err, other);
    prob_free(&P);
}

/* Case 5: all keypoints invisible (case 1 geometry, v = 0, vis logits 0.3).
 * pose = 0 exactly (mask 0, factor = 17/1e-9 multiplies 0); kobj =
 * BCE(0.3, 0) = ln(1 + e^0.3) = 0.85435524...; its gradient
 * sigmoid(0.3)/17 > 0 pushes the logits down; x/y gradients are 0. */
static void case_invisible(lucid_ctx *ctx) {
    prob P;
    if (prob_init(&P, ctx, 1, 1, 1, LUCID_F64)) {
        TEST_FAIL("invisible", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    for (int s = 0; s < 4; s++) side(&P, 0, 9, s, 0, 1);
    gt(&P, 0, 0, 1, 0, 0.1875, 0.1875, 0.125, 0.125, 0.3, 0.2, 0);
    for (int k = 0; k < 17; k++) set3(P.pk, 0, 3 * k + 2, 9, 0.3);
    CHECK_STATUS("invisible: forward", ctx, fwd(&P));
    CHECK("invisible: pose item is 0", item(&P, 1) == 0.0, "got %g", item(&P, 1));
    CHECK("invisible: kobj = ln(1+e^0.3)",
          fabs(item(&P, 2) - log(1 + exp(0.3))) < 1e-12, "got %.15g", item(&P, 2));
    CHECK_STATUS("invisible: backward", ctx, bwd(&P));
    double xy = 0, v = get3(P.gk, 0, 2, 9);
    for (int k = 0; k < 17; k++)
        xy += fabs(get3(P.gk, 0, 3 * k, 9)) + fabs(get3(P.gk, 0, 3 * k + 1, 9));
    CHECK("invisible: kobj grad pushes down, x/y grads 0",
          xy == 0 && fabs(v - 1 / (1 + exp(-0.3)) / 17) < 1e-12, "xy %g v %.15g",
          xy, v);
    prob_free(&P);
}

/* Case 6: degenerate boxes. Image 0: a zero-area gt at (8,8) px (valid:
 * its coordinate sum is 32 > 0). Widened to 16x16 for the inside test, its
 * candidates are a = 0, 1, 8, 9 and the s16 anchor 64; every CIoU with it
 * is <= 0 (inter = 0), so all metrics are 0 and top-k takes anchors 0..9
 * (lowest index first): positives 0, 1, 8, 9. Image 1: a zero-width gt
 * (w = 0, h = 16 px) and predictions of zero size (all mass on bin 0).
 * Everything must stay finite, in f32 and f64. */
static void case_degenerate(lucid_ctx *ctx, lucid_dtype dt) {
    const char *name = dt == LUCID_F64 ? "degenerate f64" : "degenerate f32";
    prob P;
    if (prob_init(&P, ctx, 2, 1, 1, dt)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    gt(&P, 0, 0, 1, 0, 0.125, 0.125, 0, 0, 0.125, 0.125, 2);
    gt(&P, 1, 0, 1, 0, 0.5, 0.5, 0, 0.25, 0.5, 0.5, 2);
    for (int a = 0; a < 84; a++)
        for (int s = 0; s < 4; s++) side(&P, 1, a, s, 0, 0);
    char nm[128];
    snprintf(nm, sizeof nm, "%s: forward", name);
    CHECK_STATUS(nm, ctx, fwd(&P));
    int32_t idx[168];
    double nfg;
    lucid_pose_loss_read_assignment(ctx, P.plan, idx, NULL, &nfg, NULL);
    snprintf(nm, sizeof nm, "%s: zero-area gt gets anchors 0,1,8,9", name);
    int n0 = 0;
    for (int a = 0; a < 84; a++) n0 += idx[a] == 0;
    CHECK(nm, n0 == 4 && idx[0] == 0 && idx[1] == 0 && idx[8] == 0 && idx[9] == 0,
          "n0=%d", n0);
    snprintf(nm, sizeof nm, "%s: backward", name);
    CHECK_STATUS(nm, ctx, bwd(&P));
    snprintf(nm, sizeof nm, "%s: finite loss and gradients", name);
    CHECK(nm, all_finite(P.total) && all_finite(P.items) && all_finite(P.gb) &&
                  all_finite(P.gc) && all_finite(P.gk) && nfg == 4,
          "total %g nfg %g", lucid_cpu_get(P.total, 0), nfg);
    prob_free(&P);
}

/* ------------------------------------------------ random problem (shared) */

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64*, uniform [0,1) */
    rng_s ^= rng_s >> 12, rng_s ^= rng_s << 25, rng_s ^= rng_s >> 27;
    return (double)((rng_s * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Random outputs (box logits biased to small distances) and 3 gts per
 * image (image 1: 2 valid + 1 padding), nc = 2. Values are stored through
 * the dtype of P (so f32 and f64 problems built from the same seed hold
 * the same f32-representable numbers when `round32`). */
static void fill_random(prob *P, uint64_t seed, int round32) {
    rng_s = seed;
    for (int b = 0; b < P->B; b++)
        for (int a = 0; a < P->A; a++) {
            for (int c = 0; c < 64; c++) {
                double v = nrand() - 0.4 * (c % 16);
                set3(P->pb, b, c, a, round32 ? (double)(float)v : v);
            }
            for (int c = 0; c < P->nc; c++) {
                double v = nrand() - 1;
                set3(P->pc, b, c, a, round32 ? (double)(float)v : v);
            }
            for (int c = 0; c < 51; c++) {
                double v = 0.5 * nrand();
                set3(P->pk, b, c, a, round32 ? (double)(float)v : v);
            }
        }
    for (int b = 0; b < P->B; b++)
        for (int g = 0; g < P->G; g++) {
            float x = (float)(0.25 + 0.5 * urand()), y = (float)(0.25 + 0.5 * urand());
            float w = (float)(0.15 + 0.35 * urand()), h = (float)(0.15 + 0.35 * urand());
            gt(P, b, g, !(b == 1 && g == 2), g % 2, x, y, w, h, 0, 0, 0);
            int64_t r = (int64_t)b * P->G + g;
            for (int k = 0; k < 17; k++) {
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 0, (float)(x + w * (urand() - 0.5)));
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 1, (float)(y + h * (urand() - 0.5)));
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 2, (double)(int)(3 * urand()));
            }
        }
}

/* f32 (and bf16) against f64 on the same random problem. */
static void case_precision(lucid_ctx *ctx) {
    prob P64, P32, P16;
    if (prob_init(&P64, ctx, 2, 3, 2, LUCID_F64) ||
        prob_init(&P32, ctx, 2, 3, 2, LUCID_F32) ||
        prob_init(&P16, ctx, 2, 3, 2, LUCID_BF16)) {
        TEST_FAIL("f32 vs f64", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    fill_random(&P64, 7, 1);
    fill_random(&P32, 7, 1);
    fill_random(&P16, 7, 1);
    CHECK_STATUS("f32 vs f64: forward f64", ctx, fwd(&P64));
    CHECK_STATUS("f32 vs f64: forward f32", ctx, fwd(&P32));
    CHECK_STATUS("bf16: forward", ctx, fwd(&P16));
    int32_t i64[168], i32[168];
    double nfg;
    lucid_pose_loss_read_assignment(ctx, P64.plan, i64, NULL, &nfg, NULL);
    lucid_pose_loss_read_assignment(ctx, P32.plan, i32, NULL, NULL, NULL);
    CHECK("f32 vs f64: same assignment", !memcmp(i64, i32, sizeof i64) && nfg > 5,
          "nfg %g", nfg);
    double worst = 0;
    for (int i = 0; i < 5; i++)
        worst = fmax(worst, test_relerr(item(&P32, i), item(&P64, i)));
    worst = fmax(worst, test_relerr(lucid_cpu_get(P32.total, 0),
                                    lucid_cpu_get(P64.total, 0)));
    CHECK("f32 vs f64: total and items within 1e-5", worst < 1e-5, "rel %g", worst);
    CHECK_STATUS("f32 vs f64: backward f64", ctx, bwd(&P64));
    CHECK_STATUS("f32 vs f64: backward f32", ctx, bwd(&P32));
    lucid_tensor *g64[3] = {P64.gb, P64.gc, P64.gk}, *g32[3] = {P32.gb, P32.gc, P32.gk};
    double gerr = 0;
    for (int j = 0; j < 3; j++) {
        double mx = 0, e = 0;
        for (int64_t i = 0; i < lucid_tensor_numel(g64[j]); i++) {
            mx = fmax(mx, fabs(lucid_cpu_get(g64[j], i)));
            e = fmax(e, fabs(lucid_cpu_get(g64[j], i) - lucid_cpu_get(g32[j], i)));
        }
        gerr = fmax(gerr, e / mx);
    }
    CHECK("f32 vs f64: gradients within 1e-5 of max", gerr < 1e-5, "err %g", gerr);
    CHECK("bf16: loss finite and near f64",
          all_finite(P16.total) &&
              test_relerr(lucid_cpu_get(P16.total, 0), lucid_cpu_get(P64.total, 0)) < 0.05,
          "bf16 %g f64 %g", lucid_cpu_get(P16.total, 0), lucid_cpu_get(P64.total, 0));
    CHECK_STATUS("bf16: backward", ctx, bwd(&P16));
    CHECK("bf16: gradients finite", all_finite(P16.gb) && all_finite(P16.gk),
          "non-finite");
    prob_free(&P64), prob_free(&P32), prob_free(&P16);
}

/* After the plan exists, forward/backward allocate nothing. */
static void case_no_alloc(lucid_ctx *ctx) {
    prob P;
    if (prob_init(&P, ctx, 2, 3, 2, LUCID_F32)) {
        TEST_FAIL("no allocation", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    fill_random(&P, 11, 0);
    lucid_memory_stats s0, s1;
    lucid_memory_stats_get(ctx, (lucid_device){LUCID_CPU, 0}, &s0);
    lucid_status st = LUCID_OK;
    for (int i = 0; i < 3 && st == LUCID_OK; i++) {
        st = fwd(&P);
        if (st == LUCID_OK) st = bwd(&P);
    }
    lucid_memory_stats_get(ctx, (lucid_device){LUCID_CPU, 0}, &s1);
    CHECK("no allocation: forward/backward ok", st == LUCID_OK, "%s",
          lucid_ctx_error(ctx));
    CHECK("no allocation: allocated and num_allocs unchanged",
          s0.allocated == s1.allocated && s0.num_allocs == s1.num_allocs,
          "allocated %llu -> %llu, allocs %llu -> %llu",
          (unsigned long long)s0.allocated, (unsigned long long)s1.allocated,
          (unsigned long long)s0.num_allocs, (unsigned long long)s1.num_allocs);
    prob_free(&P);
}

/* Argument errors come back as statuses with a message. */
static void case_errors(lucid_ctx *ctx) {
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    lucid_pose_loss_plan *plan = NULL;
    cfg.batch = 1, cfg.max_gt = 2;
    lucid_pose_loss_config_levels(&cfg, 64, 64);
    cfg.topk = 100; /* more than 84 anchors */
    lucid_status st = lucid_pose_loss_plan_create(ctx, (lucid_device){LUCID_CPU, 0},
                                                  &cfg, &plan);
    CHECK("errors: topk above anchors refused", st == LUCID_ERR_ARG && !plan,
          "status %s", lucid_status_name(st));
    prob P;
    if (prob_init(&P, ctx, 1, 2, 1, LUCID_F32)) {
        TEST_FAIL("errors", "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    st = bwd(&P);
    CHECK("errors: backward before forward is ERR_STATE", st == LUCID_ERR_STATE,
          "status %s", lucid_status_name(st));
    st = lucid_pose_loss_forward(ctx, P.plan, P.pc, P.pc, P.pk, &P.tg, NULL, NULL);
    CHECK("errors: wrong output shape is ERR_ARG",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "pred_box"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    prob_free(&P);
}

int main(void) {
    lucid_ctx *ctx = NULL;
    lucid_ctx_options opt = lucid_ctx_options_default();
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    case_single(ctx, LUCID_F64);
    case_single(ctx, LUCID_F32);
    case_two_anchors(ctx);
    case_two_gts(ctx);
    case_empty(ctx);
    case_invisible(ctx);
    case_degenerate(ctx, LUCID_F64);
    case_degenerate(ctx, LUCID_F32);
    case_precision(ctx);
    case_no_alloc(ctx);
    case_errors(ctx);
    lucid_ctx_release(ctx);
    return test_exit();
}
