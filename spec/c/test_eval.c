/*
 * test_eval.c — validation metrics against hand-derived values:
 * AP of simple curves (COCO and Ultralytics methods), matching semantics,
 * a two-threshold-regime dataset whose mAP50-95 is derived in the comments,
 * crowd regions, images without people, OKS, decoding and NMS; the
 * optimised decode/NMS and validator against the straightforward reference
 * path (reference.c) bit for bit on random inputs (many candidates, tied
 * confidences, several classes, NaN boxes, caps reached, threads), and the
 * COCO results JSON number formatting against "%.14g".
 */
#include "test.h"
#include "eval/eval.h"

static lucid_ctx *ctx;

static void test_compute_ap(void) {
    double r1[] = {1.0}, p1[] = {1.0};
    /* perfect: COCO 1.0; Ultralytics 0.995 (last trapezoid step drops to 0) */
    double a = lucid_compute_ap(r1, p1, 1, LUCID_AP_COCO);
    CHECK("ap coco perfect = 1", fabs(a - 1.0) < 1e-12, "got %.12f", a);
    a = lucid_compute_ap(r1, p1, 1, LUCID_AP_ULTRALYTICS);
    CHECK("ap ultralytics perfect = 0.995", fabs(a - 0.995) < 1e-12, "got %.12f", a);
    /* half recall at precision 1: COCO thresholds 0.00..0.50 (51 of 101) */
    double r2[] = {0.5}, p2[] = {1.0};
    a = lucid_compute_ap(r2, p2, 1, LUCID_AP_COCO);
    CHECK("ap coco half recall = 51/101", fabs(a - 51.0 / 101.0) < 1e-12, "got %.12f", a);
    /* Ultralytics: mrec [0,.5,.5,1] mpre [1,1,0,0]: trapezoid = 0.495 (numpy) */
    a = lucid_compute_ap(r2, p2, 1, LUCID_AP_ULTRALYTICS);
    CHECK("ap ultralytics half recall = 0.495", fabs(a - 0.495) < 1e-12, "got %.12f", a);
    /* TP FP TP with 2 gt: r [.5 .5 1], p [1 .5 2/3]; numpy gives 0.828333.. */
    double r3[] = {0.5, 0.5, 1.0}, p3[] = {1.0, 0.5, 2.0 / 3.0};
    a = lucid_compute_ap(r3, p3, 3, LUCID_AP_ULTRALYTICS);
    CHECK("ap ultralytics tp-fp-tp", fabs(a - 0.8283333333333331) < 1e-12, "got %.12f", a);
    /* COCO: envelope [1, 2/3, 2/3]; r<=.5 -> 1 (51 values), r>.5 -> 2/3 (50) */
    a = lucid_compute_ap(r3, p3, 3, LUCID_AP_COCO);
    double want = (51.0 + 50.0 * 2.0 / 3.0) / 101.0;
    CHECK("ap coco tp-fp-tp", fabs(a - want) < 1e-12, "got %.12f want %.12f", a, want);
}

static void test_iou_oks(void) {
    float a[4] = {0, 0, 10, 10}, b[4] = {0, 0, 10, 6.2f};
    float v = lucid_box_iou(a, b);
    CHECK("box iou 0.62", fabs(v - 0.62f) < 1e-6, "got %f", v);
    float c[4] = {20, 20, 30, 30};
    CHECK("box iou disjoint = 0", lucid_box_iou(a, c) == 0.0f, "got %f", lucid_box_iou(a, c));
    /* one visible keypoint 1 px off, sigma 0.026, box 100x100 -> area 5300:
     * e = 1 / (0.052^2 * 5300 * 2) = 0.0348889; OKS = exp(-e) = 0.965713 */
    float gt[17 * 3] = {0}, pr[17 * 3] = {0};
    gt[0] = 50; gt[1] = 50; gt[2] = 2;
    pr[0] = 51; pr[1] = 50; pr[2] = 0.9f;
    float oks = lucid_kpt_oks(gt, pr, 17, lucid_coco_kpt_sigmas, 100 * 100 * 0.53f);
    CHECK("oks one keypoint", fabs(oks - 0.965713f) < 2e-6, "got %.7f", oks);
    /* invisible gt keypoints do not count, whatever the prediction */
    gt[3] = 10; gt[4] = 10; gt[5] = 0;
    pr[3] = 90; pr[4] = 90;
    oks = lucid_kpt_oks(gt, pr, 17, lucid_coco_kpt_sigmas, 100 * 100 * 0.53f);
    CHECK("oks ignores invisible", fabs(oks - 0.965713f) < 2e-6, "got %.7f", oks);
    /* no visible keypoint: 0 / (0 + 1e-7) = 0 */
    float none[17 * 3] = {0};
    oks = lucid_kpt_oks(none, pr, 17, lucid_coco_kpt_sigmas, 100.0f);
    CHECK("oks without visible keypoints = 0", oks == 0.0f, "got %f", oks);
}

static void test_match(void) {
    /* 2 gt, 3 preds. iou matrix [gt][pred]:
     *   g0: p0 .90  p1 .80  p2 .00
     *   g1: p0 .85  p1 .00  p2 .55
     * t=.5: pairs by iou: (g0,p0) .90 (g1,p0) .85 (g0,p1) .80 (g1,p2) .55
     *   best per pred: p0->g0, p1->g0, p2->g1; in pred order p0 takes g0,
     *   p1 loses (g0 taken), p2 takes g1  => correct p0, p2.
     * t=.55: same (0.55f >= 0.55f). t=.6: (g1,p2) gone: p0->g0, p1->g0 => p0.
     * t=.85: (g0,p0) .90 (g1,p0) .85 => p0 only. t=.9: p0 (0.90 >= 0.9f? the
     *   f32 0.90f equals the threshold 0.90f) => p0. t=.95: none. */
    float iou[6] = {0.90f, 0.80f, 0.0f, 0.85f, 0.0f, 0.55f};
    int gc[2] = {0, 0}, pc[3] = {0, 0, 0};
    uint8_t corr[3 * 10];
    int rc = lucid_match_predictions(iou, gc, 2, pc, 3, corr);
    int ok = rc == 0 && corr[0] && !corr[10] && corr[20] && corr[1] && !corr[11] &&
             corr[21] && corr[2] && !corr[22] && corr[8] && !corr[9] && !corr[18];
    CHECK("match_predictions ultralytics order", ok,
          "p0 %d%d%d p1 %d%d p2 %d%d", corr[0], corr[8], corr[9], corr[10], corr[11],
          corr[20], corr[21]);
    /* class mismatch never matches */
    int pc2[3] = {1, 1, 1};
    lucid_match_predictions(iou, gc, 2, pc2, 3, corr);
    int any = 0;
    for (int i = 0; i < 30; i++) any |= corr[i];
    CHECK("match needs same class", !any, "a cross-class match was made");
}

/* Dataset: image A with gt g1 [0,0,10,10], g2 [20,20,30,30];
 * preds p1 = g1 (conf .9), p2 = [20,20,30,26.2] (conf .8, IoU .62 with g2).
 * t in {.50,.55,.60}: TP TP -> recall [.5, 1], precision [1, 1] -> AP 1.
 * t >= .65: TP FP -> recall [.5,.5], precision [1,.5] -> COCO AP 51/101.
 * mAP50 = 1; mAP50-95 = (3 + 7 * 51/101) / 10.
 * Image B has no people and one prediction at conf .1 -> FP everywhere,
 * ranked last: adds an FP after all TPs, which leaves the COCO envelope
 * unchanged (precision at recall 1 stays 1 for t <= .6). */
static void test_dataset(void) {
    lucid_ap_accum *acc = NULL;
    CHECK_STATUS("accum create", ctx, lucid_ap_accum_create(ctx, &acc));
    float g[2][4] = {{0, 0, 10, 10}, {20, 20, 30, 30}};
    lucid_det preds[2] = {{{0, 0, 10, 10}, 0.9f, 0, NULL},
                          {{20, 20, 30, 26.2f}, 0.8f, 0, NULL}};
    float iou[4];
    for (int i = 0; i < 2; i++)
        for (int p = 0; p < 2; p++) iou[i * 2 + p] = lucid_box_iou(g[i], preds[p].box);
    int gc[2] = {0, 0}, pc[2] = {0, 0};
    uint8_t corr[20];
    int8_t tp[20];
    lucid_match_predictions(iou, gc, 2, pc, 2, corr);
    lucid_apply_crowd(preds, 2, NULL, 0, corr, tp);
    float conf[2] = {0.9f, 0.8f};
    lucid_ap_accum_add(ctx, acc, 2, conf, pc, tp, 2, gc);
    /* image B: no people */
    int8_t tpb[10] = {0};
    float confb = 0.1f;
    int pcb = 0;
    lucid_ap_accum_add(ctx, acc, 1, &confb, &pcb, tpb, 0, NULL);
    lucid_ap_result r;
    CHECK_STATUS("accum compute", ctx, lucid_ap_accum_compute(ctx, acc, LUCID_AP_COCO, &r));
    double want = (3.0 + 7.0 * 51.0 / 101.0) / 10.0;
    CHECK("mAP50 = 1", fabs(r.map50 - 1.0) < 1e-12, "got %.12f", r.map50);
    CHECK("mAP50-95 hand value", fabs(r.map50_95 - want) < 1e-12, "got %.12f want %.12f",
          r.map50_95, want);
    /* P, R at the max smoothed F1 of the IoU .5 curve. The curves are
     * np.interp'd linearly between the confidences (.9 TP, .8 TP, .1 FP),
     * so precision falls linearly from 1 at conf .8 to 2/3 at conf .1. An
     * independent numpy transcription of ap_per_class gives the argmax at
     * index 757 with P = 0.9798846411744226, R = 1. */
    CHECK("precision and recall at max F1", fabs(r.precision - 0.9798846411744226) < 1e-9 &&
          fabs(r.recall - 1) < 1e-12, "P %.12f R %.12f", r.precision, r.recall);

    /* perfect predictions on both gts: every metric 1 (COCO method) */
    lucid_ap_accum_reset(acc);
    preds[1].box[3] = 30;
    for (int i = 0; i < 2; i++)
        for (int p = 0; p < 2; p++) iou[i * 2 + p] = lucid_box_iou(g[i], preds[p].box);
    lucid_match_predictions(iou, gc, 2, pc, 2, corr);
    lucid_apply_crowd(preds, 2, NULL, 0, corr, tp);
    lucid_ap_accum_add(ctx, acc, 2, conf, pc, tp, 2, gc);
    lucid_ap_accum_compute(ctx, acc, LUCID_AP_COCO, &r);
    CHECK("perfect predictions: mAP50-95 = 1", fabs(r.map50_95 - 1) < 1e-12, "got %.12f",
          r.map50_95);
    lucid_ap_accum_compute(ctx, acc, LUCID_AP_ULTRALYTICS, &r);
    CHECK("perfect predictions, ultralytics method: 0.995", fabs(r.map50_95 - 0.995) < 1e-12,
          "got %.12f", r.map50_95);

    /* crowd: a prediction inside a crowd region and unmatched is ignored,
     * so adding it to the perfect set leaves mAP at 1; without the crowd
     * box it is an FP ranked first (conf .95) and mAP drops. */
    lucid_ap_accum_reset(acc);
    lucid_det p3[3] = {{{50, 50, 60, 60}, 0.95f, 0, NULL}, preds[0], preds[1]};
    float iou3[6];
    for (int i = 0; i < 2; i++)
        for (int p = 0; p < 3; p++) iou3[i * 3 + p] = lucid_box_iou(g[i], p3[p].box);
    int pc3[3] = {0, 0, 0};
    uint8_t corr3[30];
    int8_t tp3[30];
    float conf3[3] = {0.95f, 0.9f, 0.8f};
    float crowd[4] = {45, 45, 70, 70};
    lucid_match_predictions(iou3, gc, 2, pc3, 3, corr3);
    lucid_apply_crowd(p3, 3, crowd, 1, corr3, tp3);
    CHECK("crowd marks the unmatched prediction ignored", tp3[0] == -1 && tp3[9] == -1 &&
          tp3[10] == 1, "tp %d %d %d", tp3[0], tp3[9], tp3[10]);
    lucid_ap_accum_add(ctx, acc, 3, conf3, pc3, tp3, 2, gc);
    lucid_ap_accum_compute(ctx, acc, LUCID_AP_COCO, &r);
    CHECK("crowd-ignored prediction leaves mAP 1", fabs(r.map50_95 - 1) < 1e-12, "got %.12f",
          r.map50_95);
    lucid_ap_accum_reset(acc);
    lucid_apply_crowd(p3, 3, NULL, 0, corr3, tp3);
    lucid_ap_accum_add(ctx, acc, 3, conf3, pc3, tp3, 2, gc);
    lucid_ap_accum_compute(ctx, acc, LUCID_AP_COCO, &r);
    /* FP TP TP: recall [0,.5,1], precision [0,.5,2/3] -> envelope 2/3 at all
     * recall thresholds reached (r=0 hits index 0 whose envelope is 2/3) */
    CHECK("same prediction without crowd is an FP", fabs(r.map50_95 - 2.0 / 3.0) < 1e-12,
          "got %.12f", r.map50_95);

    /* no ground truth anywhere: all zeros, no NaN */
    lucid_ap_accum_reset(acc);
    lucid_ap_accum_add(ctx, acc, 1, &confb, &pcb, tpb, 0, NULL);
    lucid_ap_accum_compute(ctx, acc, LUCID_AP_COCO, &r);
    CHECK("no ground truth: zeros", r.map50_95 == 0 && r.precision == 0 && r.n_classes == 0,
          "map %f", r.map50_95);
    lucid_ap_accum_free(acc);
}

static void test_decode_nms(void) {
    /* one level 2x2 at stride 8: anchors (0.5,0.5) (1.5,0.5) (0.5,1.5) (1.5,1.5).
     * Anchor 0: class logit 4 (conf .982), DFL peaked at bin 2 on every side.
     * Anchor 1: class logit 2 (conf .881), same distances -> its box overlaps
     * anchor 0's box with IoU 3/5 = 0.6 (< 0.7): both survive.
     * Anchor 2: logit 0 (conf .5), IoU .6 with anchor 0 too.
     * Anchor 3: logit -10 (conf 4.5e-5 < 0.001): not a candidate. */
    enum { A = 4, R = 16, K = 1 };
    float box[4 * R * A], cls[A] = {4, 2, 0, -10}, kpt[3 * K * A];
    for (int i = 0; i < 4 * R * A; i++) box[i] = 0;
    for (int side = 0; side < 4; side++)
        for (int a = 0; a < A; a++) box[(side * R + 2) * A + a] = 40.0f;
    for (int i = 0; i < 3 * K * A; i++) kpt[i] = 0.25f;
    lucid_anchor_level lv = {2, 2, 8.0f};
    lucid_nms_opts o = lucid_nms_opts_default();
    char scratch[4096];
    lucid_det dets[300];
    float kout[300 * 3];
    int n = lucid_eval_decode_nms(box, cls, kpt, A, R, 1, K, &lv, 1, &o, scratch, dets, kout);
    CHECK("decode: candidates above conf, NMS keeps both", n == 3, "got %d detections", n);
    if (n >= 1) {
        /* (0.5-2)*8 = -12, (0.5+2)*8 = 20; DFL expectation 2 within 1e-6 */
        CHECK("decode: DFL box", fabs(dets[0].box[0] + 12) < 1e-4 && fabs(dets[0].box[2] - 20) < 1e-4,
              "box %f %f %f %f", dets[0].box[0], dets[0].box[1], dets[0].box[2], dets[0].box[3]);
        /* keypoint x = (2*0.25 + 0.5 - 0.5) * 8 = 4; v = sigmoid(.25) */
        CHECK("decode: keypoints", fabs(dets[0].kpts[0] - 4) < 1e-5 &&
              fabs(dets[0].kpts[2] - 1 / (1 + expf(-0.25f))) < 1e-6,
              "kpt %f %f %f", dets[0].kpts[0], dets[0].kpts[1], dets[0].kpts[2]);
        CHECK("decode: sorted by confidence", dets[0].conf >= dets[1].conf, "conf %f %f",
              dets[0].conf, dets[1].conf);
    }
    /* lower the NMS IoU to 0.5: anchor 1 (IoU .6 with anchor 0) is suppressed,
     * anchor 2 (IoU .6 too) as well -> 1 left */
    o.iou_thres = 0.5f;
    n = lucid_eval_decode_nms(box, cls, kpt, A, R, 1, K, &lv, 1, &o, scratch, dets, kout);
    CHECK("nms suppresses overlaps above the threshold", n == 1, "got %d", n);
    CHECK("decode rejects a bad anchor layout",
          lucid_eval_decode_nms(box, cls, kpt, 5, R, 1, K, &lv, 1, &o, scratch, dets, kout) == -1,
          "accepted");
}


/* ------------------------------------------ fast path == reference path */

static const lucid_device CPU = {LUCID_CPU, 0};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}
static float unif(void) { return (float)(rnd() >> 8) / 16777216.0f; }
static float gauss(void) { /* Irwin-Hall, 4 terms: mean 0, sd 1 */
    return (unif() + unif() + unif() + unif() - 2.0f) * 1.7320508f;
}
/* coarse values: many exact ties (as bf16 outputs of the GPU run have) */
static float quant(float x, float step) { return floorf(x / step + 0.5f) * step; }

/* Bitwise comparison of two detection lists. */
static int same_dets(const lucid_det *a, int na, const lucid_det *b, int nb, int K,
                     char *why, size_t wn) {
    if (na != nb) {
        snprintf(why, wn, "%d vs %d detections", na, nb);
        return 0;
    }
    for (int i = 0; i < na; i++) {
        if (memcmp(a[i].box, b[i].box, sizeof a[i].box) || memcmp(&a[i].conf, &b[i].conf, 4) ||
            a[i].cls != b[i].cls || (!a[i].kpts) != (!b[i].kpts) ||
            (K && a[i].kpts && memcmp(a[i].kpts, b[i].kpts, sizeof(float) * 3 * K))) {
            snprintf(why, wn, "detection %d differs: conf %a/%a cls %d/%d box %a/%a", i,
                     a[i].conf, b[i].conf, a[i].cls, b[i].cls, a[i].box[0], b[i].box[0]);
            return 0;
        }
    }
    return 1;
}

/* Random head outputs for one image: class logits quantised (ties), DFL
 * logits quantised, optional NaN/inf in a few box logits. */
static void random_head(float *box, float *cls, float *kpt, int A, int R, int nc, int K,
                        float cls_mu, float cls_step, float box_scale, int specials) {
    for (int i = 0; i < 4 * R * A; i++) box[i] = quant(gauss() * box_scale, 0.125f);
    for (int i = 0; i < nc * A; i++) cls[i] = quant(cls_mu + gauss(), cls_step);
    for (int i = 0; i < 3 * K * A; i++) kpt[i] = gauss();
    for (int s = 0; s < specials; s++) {
        int i = (int)(rnd() % (uint32_t)(4 * R * A));
        box[i] = s % 3 == 0 ? NAN : s % 3 == 1 ? INFINITY : -INFINITY;
    }
}

static void test_fast_equals_reference(void) {
    enum { R = 16, K = 5, NC = 3 };
    lucid_anchor_level lv[3] = {{24, 24, 8.0f}, {12, 12, 16.0f}, {6, 6, 32.0f}};
    const int A = 24 * 24 + 12 * 12 + 6 * 6;
    float *box = malloc(sizeof(float) * 4 * R * A), *cls = malloc(sizeof(float) * NC * A);
    float *kpt = malloc(sizeof(float) * 3 * K * A);
    void *s1 = malloc(lucid_eval_scratch_bytes(A, NC, K));
    void *s2 = malloc(lucid_eval_scratch_bytes(A, NC, K));
    lucid_det *d1 = malloc(sizeof(lucid_det) * A), *d2 = malloc(sizeof(lucid_det) * A);
    float *k1 = malloc(sizeof(float) * A * 3 * K), *k2 = malloc(sizeof(float) * A * 3 * K);
    /* option sets: defaults; max_det cap; max_nms cut; loose and strict IoU;
     * high conf; every anchor (conf -1); IoU 0 and negative */
    struct { float conf, iou; int max_det, max_nms; } opt[] = {
        {0.001f, 0.7f, 300, 30000}, {0.001f, 0.7f, 17, 30000}, {0.001f, 0.7f, 300, 40},
        {0.001f, 0.3f, 300, 30000}, {0.001f, 0.95f, 300, 30000}, {0.25f, 0.7f, 300, 30000},
        {-1.0f, 0.7f, 300, 30000},  {0.001f, 0.0f, 300, 30000}, {0.001f, -0.5f, 50, 30000},
        {0.001f, 0.7f, 1000, 30000}};
    int nopt = (int)(sizeof opt / sizeof opt[0]);
    int cases = 0, bad = 0, total_kept = 0;
    char why[256] = "";
    for (int trial = 0; trial < 24 && !bad; trial++) {
        int nc = trial % 3 == 0 ? 1 : NC;
        float mu = trial % 4 == 0 ? -4.5f : trial % 4 == 1 ? -1.0f : trial % 4 == 2 ? 2.0f : -7.0f;
        float step = trial % 2 ? 0.25f : 0.0078125f;
        float bs = trial % 5 == 0 ? 0.2f : trial % 5 == 1 ? 3.0f : 1.0f; /* flat / peaked DFL */
        random_head(box, cls, kpt, A, R, nc, K, mu, step, bs, trial % 6 == 5 ? 40 : 0);
        for (int o = 0; o < nopt && !bad; o++) {
            lucid_nms_opts no = {opt[o].conf, opt[o].iou, opt[o].max_det, opt[o].max_nms};
            int n1 = lucid_eval_decode_nms(box, cls, kpt, A, R, nc, K, lv, 3, &no, s1, d1, k1);
            int n2 = lucid_eval_decode_nms_reference(box, cls, kpt, A, R, nc, K, lv, 3, &no, s2,
                                                     d2, k2);
            cases++;
            total_kept += n1;
            if (!same_dets(d1, n1, d2, n2, K, why, sizeof why)) {
                bad = 1;
                printf("# trial %d options %d: %s\n", trial, o, why);
            }
        }
    }
    CHECK("fast decode+NMS equals the reference bit for bit (random heads, ties, 1-3 classes, "
          "NaN/inf boxes, caps)",
          !bad, "%s", why);
    CHECK("the random cases keep detections", total_kept > cases, "%d kept over %d cases",
          total_kept, cases);
    free(box); free(cls); free(kpt); free(s1); free(s2); free(d1); free(d2); free(k1); free(k2);
}

/* Whole validator: reference (one thread, plain path) vs fast (threads 1
 * and 3): the same detections per image and bitwise equal metrics. */
static void test_validator_fast_equals_reference(void) {
    enum { Bn = 5, G = 6, K = 17, R = 16, NC = 2 };
    const int S = 192, A = (24 * 24) + (12 * 12) + (6 * 6);
    lucid_pose_val_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.nc = NC;
    cfg.nkpt = K;
    cfg.reg_max = R;
    cfg.nlevels = 3;
    for (int l = 0; l < 3; l++) {
        cfg.levels[l].h = cfg.levels[l].w = S / (8 << l);
        cfg.levels[l].stride = (float)(8 << l);
    }
    cfg.nms = lucid_nms_opts_default();
    cfg.ap_method = LUCID_AP_COCO;
    lucid_pose_val *v[3] = {NULL, NULL, NULL};
    int threads[3] = {1, 1, 3};
    for (int i = 0; i < 3; i++) {
        cfg.reference = i == 0;
        cfg.threads = threads[i];
        if (lucid_pose_val_create(ctx, &cfg, &v[i]) != LUCID_OK) {
            TEST_FAIL("validator create", "%s", lucid_ctx_error(ctx));
            return;
        }
    }
    int64_t sb[3] = {Bn, 4 * R, A}, sc[3] = {Bn, NC, A}, sk[3] = {Bn, 3 * K, A};
    int64_t tc[2] = {Bn, G}, tb[3] = {Bn, G, 4}, tk[4] = {Bn, G, K, 3};
    lucid_tensor *pb, *pc, *pk, *gc, *gb, *gk, *gm;
    lucid_tensor_empty(ctx, CPU, LUCID_F32, 3, sb, &pb);
    lucid_tensor_empty(ctx, CPU, LUCID_F32, 3, sc, &pc);
    lucid_tensor_empty(ctx, CPU, LUCID_F32, 3, sk, &pk);
    lucid_tensor_zeros(ctx, CPU, LUCID_F32, 2, tc, &gc);
    lucid_tensor_zeros(ctx, CPU, LUCID_F32, 3, tb, &gb);
    lucid_tensor_zeros(ctx, CPU, LUCID_F32, 4, tk, &gk);
    lucid_tensor_zeros(ctx, CPU, LUCID_F32, 2, tc, &gm);
    int ok = 1;
    char why[256] = "";
    for (int batch = 0; batch < 3 && ok; batch++) {
        float *b = lucid_tensor_data(pb), *c = lucid_tensor_data(pc), *k = lucid_tensor_data(pk);
        for (int i = 0; i < Bn; i++)
            random_head(b + (size_t)i * 4 * R * A, c + (size_t)i * NC * A, k + (size_t)i * 3 * K * A,
                        A, R, NC, K, batch == 1 ? 0.5f : -3.0f, 0.25f, 0.5f, 0);
        /* ground truth: boxes around random points, keypoints near them */
        float *g_c = lucid_tensor_data(gc), *g_b = lucid_tensor_data(gb);
        float *g_k = lucid_tensor_data(gk), *g_m = lucid_tensor_data(gm);
        for (int r = 0; r < Bn * G; r++) {
            g_m[r] = (rnd() % 4) != 0 ? 1.0f : 0.0f;
            g_c[r] = (float)(rnd() % NC);
            g_b[4 * r] = 0.1f + 0.8f * unif();
            g_b[4 * r + 1] = 0.1f + 0.8f * unif();
            g_b[4 * r + 2] = 0.05f + 0.3f * unif();
            g_b[4 * r + 3] = 0.05f + 0.3f * unif();
            for (int q = 0; q < K; q++) {
                g_k[(r * K + q) * 3] = g_b[4 * r] + 0.1f * (unif() - 0.5f);
                g_k[(r * K + q) * 3 + 1] = g_b[4 * r + 1] + 0.1f * (unif() - 0.5f);
                g_k[(r * K + q) * 3 + 2] = (float)(rnd() % 3);
            }
        }
        lucid_pose_val_batch bt = {pb, pc, pk, gc, gb, gk, gm, NULL, NULL, 0, Bn - (batch == 2),
                                   (float)S, (float)S};
        for (int i = 0; i < 3; i++)
            if (lucid_pose_val_add_batch(ctx, v[i], &bt) != LUCID_OK) {
                ok = 0;
                snprintf(why, sizeof why, "add_batch: %s", lucid_ctx_error(ctx));
            }
        for (int img = 0; img < bt.n_images && ok; img++) {
            int n0, n1, n2;
            const lucid_det *d0 = lucid_pose_val_dets(v[0], img, &n0);
            const lucid_det *d1 = lucid_pose_val_dets(v[1], img, &n1);
            const lucid_det *d2 = lucid_pose_val_dets(v[2], img, &n2);
            ok = same_dets(d1, n1, d0, n0, K, why, sizeof why) &&
                 same_dets(d2, n2, d0, n0, K, why, sizeof why);
        }
    }
    CHECK("validator: fast path (1 and 3 threads) gives the reference's detections", ok, "%s", why);
    lucid_pose_metrics m[3];
    for (int i = 0; i < 3; i++) lucid_pose_val_compute(ctx, v[i], &m[i]);
    int same = 1;
    for (int i = 1; i < 3; i++) {
        const lucid_ap_result *r[2][2] = {{&m[0].box, &m[0].pose}, {&m[i].box, &m[i].pose}};
        for (int g = 0; g < 2; g++) {
            same &= memcmp(&r[0][g]->precision, &r[1][g]->precision, 8) == 0;
            same &= memcmp(&r[0][g]->recall, &r[1][g]->recall, 8) == 0;
            same &= memcmp(&r[0][g]->map50, &r[1][g]->map50, 8) == 0;
            same &= memcmp(&r[0][g]->map50_95, &r[1][g]->map50_95, 8) == 0;
            same &= memcmp(r[0][g]->map, r[1][g]->map, sizeof r[0][g]->map) == 0;
            same &= r[0][g]->n_gt == r[1][g]->n_gt && r[0][g]->n_pred == r[1][g]->n_pred;
        }
        same &= memcmp(&m[0].fitness, &m[i].fitness, 8) == 0 && m[0].images == m[i].images;
    }
    CHECK("validator: metrics bitwise equal to the reference (box and pose P, R, mAP50, "
          "mAP50-95)",
          same, "box mAP50-95 %.17g / %.17g / %.17g", m[0].box.map50_95, m[1].box.map50_95,
          m[2].box.map50_95);
    CHECK("validator: the random set has predictions and ground truth",
          m[0].box.n_pred > 100 && m[0].box.n_gt > 10 && m[0].images == 14,
          "%lld preds, %lld gt, %lld images", (long long)m[0].box.n_pred,
          (long long)m[0].box.n_gt, (long long)m[0].images);
    lucid_eval_timings t;
    lucid_pose_val_timings(v[1], &t);
    CHECK("validator: timings count images and stages", t.images == 14 && t.kept == m[1].box.n_pred &&
          t.decoded >= t.kept && t.candidates >= t.decoded && t.wall > 0,
          "images %lld kept %lld decoded %lld candidates %lld", (long long)t.images,
          (long long)t.kept, (long long)t.decoded, (long long)t.candidates);
    for (int i = 0; i < 3; i++) lucid_pose_val_free(v[i]);
    lucid_tensor_release(pb); lucid_tensor_release(pc); lucid_tensor_release(pk);
    lucid_tensor_release(gc); lucid_tensor_release(gb); lucid_tensor_release(gk);
    lucid_tensor_release(gm);
}

/* The JSON numbers: round(x, d) then "%.14g", as predict.lua + cjson. */
static void test_format_rounded(void) {
    char a[64], b[64];
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < 400000 && !bad; i++) {
        double x;
        switch (i % 8) {
        case 0: x = unif() * 700.0; break;                          /* pixels */
        case 1: x = unif(); break;                                  /* scores */
        case 2: x = unif() * 1e-3; break;                           /* tiny */
        case 3: x = (double)(rnd() % 100000) / 1000.0; break;       /* exact decimals */
        case 4: x = ((double)(rnd() % 2000000) + 0.5) / 1000.0; break; /* .5 boundaries */
        case 5: x = -unif() * 50.0; break;                          /* negatives */
        case 6: x = unif() * 1e12; break;                           /* large */
        default: x = ldexp(unif(), (int)(rnd() % 80) - 40); break;  /* any exponent */
        }
        int d = i % 3 == 0 ? 5 : 3;
        double m = d == 3 ? 1000.0 : 100000.0;
        snprintf(b, sizeof b, "%.14g", floor(x * m + 0.5) / m);
        int n = lucid_eval_format_rounded(a, x, d);
        if (n != (int)strlen(b) || strcmp(a, b)) {
            bad = 1;
            worst = x;
        }
    }
    CHECK("JSON numbers: round(x, 3|5) written as %.14g", !bad, "x = %.17g: got '%s', want '%s'",
          worst, a, b);
    double special[] = {0.0, -0.0, 1e-4, 0.00005, 0.000049, 1e14, -1e-9, 123.4564999, 0.99999};
    bad = 0;
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        for (int d = 3; d <= 5; d += 2) {
            double m = d == 3 ? 1000.0 : 100000.0;
            snprintf(b, sizeof b, "%.14g", floor(special[i] * m + 0.5) / m);
            lucid_eval_format_rounded(a, special[i], d);
            if (strcmp(a, b)) {
                bad = 1;
                worst = special[i];
            }
        }
    CHECK("JSON numbers: edge values", !bad, "x = %.17g: got '%s', want '%s'", worst, a, b);
    CHECK("JSON numbers: NaN and infinity refused", lucid_eval_format_rounded(a, NAN, 3) < 0 &&
          lucid_eval_format_rounded(a, INFINITY, 3) < 0, "accepted");
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_compute_ap();
    test_iou_oks();
    test_match();
    test_dataset();
    test_decode_nms();
    test_fast_equals_reference();
    test_validator_fast_equals_reference();
    test_format_rounded();
    lucid_ctx_release(ctx);
    return test_exit();
}
