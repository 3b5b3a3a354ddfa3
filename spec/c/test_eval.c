/*
 * test_eval.c — validation metrics against hand-derived values:
 * AP of simple curves (COCO and Ultralytics methods), matching semantics,
 * a two-threshold-regime dataset whose mAP50-95 is derived in the comments,
 * crowd regions, images without people, OKS, decoding and NMS.
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
    lucid_ctx_release(ctx);
    return test_exit();
}
