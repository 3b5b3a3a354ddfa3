/*
 * assigner.c — target preparation and the task-aligned assigner of the pose
 * loss (CPU reference; formulas and sources in train/loss.h).
 *
 * Contract
 *   lpl_prep_gt_*  reads the padded targets once into the plan: gt boxes in
 *                  pixels (xyxy), the widened boxes of the inside test, the
 *                  labels, mask_gt and the keypoints in pixels. Rows that are
 *                  not valid become zeros; nothing past max_gt is read.
 *   lpl_assign_*   TaskAlignedAssigner on detached inputs: the decoded
 *                  predicted boxes (plan->pbox, from lpl_decode_*) and the
 *                  class logits. Writes plan->pos (positives per gt),
 *                  plan->tgt (assigned gt per anchor, -1 = background),
 *                  plan->tscore (normalised target score), plan->pos_al /
 *                  pos_ov and the scalars tss and n_fg.
 *   Each phase is a loop nest whose outer loop is one GPU work item (per gt
 *   or per anchor); there are no float atomics and no data-dependent sizes,
 *   so the CUDA port keeps the same results and needs no host sync.
 *
 * Template: this file includes itself twice, once with real_t = float
 * (suffix _f32, the f32/bf16/f16 path) and once with real_t = double (_f64,
 * gradient checks). The code under #else is the single source of both.
 */
#ifndef LPL_SUFFIX

#define LUCID_POSE_LOSS_INTERNAL
#include "loss.h"
#include "internal.h"
#include <math.h>

#define LPL_MAX_TOPK 64 /* also checked by lucid_pose_loss_plan_create */

#define real_t float
#define LPL_SUFFIX f32
#include "assigner.c"
#undef real_t
#undef LPL_SUFFIX

#define real_t double
#define LPL_SUFFIX f64
#include "assigner.c"
#undef real_t
#undef LPL_SUFFIX

#else /* ------------------------------------------- template body */

/* x^e with the special exponents torch.pow(tensor, scalar) computes exactly
 * (0.5 -> sqrt, 1, 2, 3), else pow. */
static inline real_t LPL_FN(powr)(real_t x, double e) {
    if (e == 0.5) return LPL_SQRT(x);
    if (e == 1.0) return x;
    if (e == 2.0) return x * x;
    if (e == 3.0) return x * x * x;
    return LPL_POW(x, (real_t)e);
}

void LPL_FN(prep_gt)(lucid_pose_loss_plan *p, const lucid_pose_targets *t) {
    const int B = p->cfg.batch, G = p->cfg.max_gt, K = p->cfg.nkpt;
    const int nc = p->cfg.nc;
    real_t *box = p->gt_box, *cand = p->gt_cand, *kp = p->gt_kpt;
    const real_t W = (real_t)p->img_w, H = (real_t)p->img_h;
    const real_t s0 = (real_t)p->cfg.strides[0];
    const real_t s1 = (real_t)p->cfg.strides[p->cfg.nlevels > 1 ? 1 : 0];
    for (int64_t r = 0; r < (int64_t)B * G; r++) {
        real_t *bx = box + r * 4, *cd = cand + r * 4;
        real_t *k3 = kp + r * K * 3;
        int valid = lucid_cpu_get(t->valid, r) != 0.0;
        /* v8DetectionLoss.preprocess: xywh * (W,H,W,H), then xywh2xyxy. */
        real_t x = (real_t)lucid_cpu_get(t->boxes, r * 4 + 0) * W;
        real_t y = (real_t)lucid_cpu_get(t->boxes, r * 4 + 1) * H;
        real_t w = (real_t)lucid_cpu_get(t->boxes, r * 4 + 2) * W;
        real_t h = (real_t)lucid_cpu_get(t->boxes, r * 4 + 3) * H;
        real_t hw = w / 2, hh = h / 2;
        real_t x1 = x - hw, y1 = y - hh, x2 = x + hw, y2 = y + hh;
        int ok = valid && (x1 + y1 + x2 + y2) > 0; /* mask_gt */
        p->gt_mask[r] = (uint8_t)ok;
        if (!ok) {
            p->gt_label[r] = 0;
            for (int j = 0; j < 4; j++) bx[j] = cd[j] = 0;
            for (int j = 0; j < K * 3; j++) k3[j] = 0;
            continue;
        }
        double c = lucid_cpu_get(t->cls, r);
        int lab = 0;
        if (c >= nc) lab = nc - 1;
        else if (c >= 0) lab = (int)c; /* .long() truncates */
        p->gt_label[r] = lab;
        bx[0] = x1, bx[1] = y1, bx[2] = x2, bx[3] = y2;
        /* select_candidates_in_gts (8.4): xyxy2xywh, a side < stride[0]
         * becomes stride[1], xywh2xyxy. */
        real_t cx = (x1 + x2) / 2, cy = (y1 + y2) / 2;
        real_t cw = x2 - x1, ch = y2 - y1;
        if (cw < s0) cw = s1;
        if (ch < s0) ch = s1;
        real_t chw = cw / 2, chh = ch / 2;
        cd[0] = cx - chw, cd[1] = cy - chh, cd[2] = cx + chw, cd[3] = cy + chh;
        for (int k = 0; k < K; k++) {
            int64_t i = (r * K + k) * 3;
            k3[k * 3 + 0] = (real_t)lucid_cpu_get(t->kpts, i + 0) * W;
            k3[k * 3 + 1] = (real_t)lucid_cpu_get(t->kpts, i + 1) * H;
            k3[k * 3 + 2] = (real_t)lucid_cpu_get(t->kpts, i + 2);
        }
    }
}

/* Pair (gt g, anchor a) of image b: returns 1 when a is a candidate of g
 * (inside its widened box, g valid); *ov = clamp(CIoU(gt, pred), 0) and
 * *al = score^alpha * ov^beta for candidates, both 0 otherwise. */
static int LPL_FN(pair)(const lucid_pose_loss_plan *p, const lpl_in *cls,
                        int b, int g, int a, real_t *ov, real_t *al) {
    const int64_t r = (int64_t)b * p->cfg.max_gt + g;
    *ov = 0, *al = 0;
    if (!p->gt_mask[r]) return 0;
    const real_t *cd = (const real_t *)p->gt_cand + r * 4;
    const double *an = p->anc + (int64_t)a * 3;
    const real_t s = (real_t)an[2];
    const real_t px = (real_t)an[0] * s, py = (real_t)an[1] * s;
    real_t d = px - cd[0], e;
    if ((e = py - cd[1]) < d) d = e;
    if ((e = cd[2] - px) < d) d = e;
    if ((e = cd[3] - py) < d) d = e;
    if (!(d > (real_t)1e-9)) return 0;
    const real_t *pb = (const real_t *)p->pbox + ((int64_t)b * p->A + a) * 4;
    const real_t pd[4] = {pb[0] * s, pb[1] * s, pb[2] * s, pb[3] * s};
    real_t alpha;
    real_t o = LPL_FN(ciou)((const real_t *)p->gt_box + r * 4, pd, &alpha, 0,
                            0, NULL);
    if (!(o > 0)) o = 0; /* clamp_(0) */
    real_t z = (real_t)lpl_get(cls, b, p->gt_label[r], a);
    real_t sc = LPL_SIGMOID(z);
    *ov = o;
    *al = LPL_FN(powr)(sc, p->cfg.tal_alpha) * LPL_FN(powr)(o, p->cfg.tal_beta);
    return 1;
}

void LPL_FN(assign)(lucid_pose_loss_plan *p, const lpl_in *cls) {
    const int B = p->cfg.batch, G = p->cfg.max_gt, A = p->A;
    const int k = p->cfg.topk;
    real_t *tscore = p->tscore, *pos_al = p->pos_al, *pos_ov = p->pos_ov;
    real_t ov, al;

    /* 1. per gt (one GPU block each): top-k anchors by align metric over all
     * anchors, ties to the lower index; positives = top-k and candidate. */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            int32_t *pos = p->pos + ((int64_t)b * G + g) * k;
            int32_t idx[LPL_MAX_TOPK];
            real_t val[LPL_MAX_TOPK];
            int n = 0;
            for (int j = 0; j < k; j++) pos[j] = -1;
            if (!p->gt_mask[(int64_t)b * G + g]) continue;
            for (int a = 0; a < A; a++) {
                LPL_FN(pair)(p, cls, b, g, a, &ov, &al);
                int j;
                if (n < k) j = n++;
                else if (al > val[k - 1]) j = k - 1;
                else continue;
                for (; j > 0 && val[j - 1] < al; j--) {
                    val[j] = val[j - 1];
                    idx[j] = idx[j - 1];
                }
                val[j] = al, idx[j] = a;
            }
            for (int j = 0; j < n; j++)
                if (LPL_FN(pair)(p, cls, b, g, idx[j], &ov, &al))
                    pos[j] = idx[j];
        }

    /* 2. per anchor: how many gts claim it; several -> argmax overlap over
     * all gts (select_highest_overlaps; first maximum wins). */
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            int cnt = 0, first = -1;
            for (int g = 0; g < G; g++) {
                const int32_t *pos = p->pos + ((int64_t)b * G + g) * k;
                for (int j = 0; j < k; j++)
                    if (pos[j] == a) {
                        if (cnt++ == 0) first = g;
                        break;
                    }
            }
            int t = first;
            if (cnt > 1) {
                real_t best = 0;
                t = 0;
                for (int g = 0; g < G; g++) {
                    LPL_FN(pair)(p, cls, b, g, a, &ov, &al);
                    if (g == 0 || ov > best) best = ov, t = g;
                }
            }
            p->tgt[(int64_t)b * A + a] = t;
        }

    /* 3. per gt: max align and max overlap over its final positives
     * (a max is order-free: atomicMax on the GPU keeps it deterministic). */
    for (int64_t r = 0; r < (int64_t)B * G; r++) pos_al[r] = pos_ov[r] = 0;
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            int t = p->tgt[(int64_t)b * A + a];
            if (t < 0) continue;
            LPL_FN(pair)(p, cls, b, t, a, &ov, &al);
            int64_t r = (int64_t)b * G + t;
            if (al > pos_al[r]) pos_al[r] = al;
            if (ov > pos_ov[r]) pos_ov[r] = ov;
        }

    /* 4. per anchor: normalised target score; tss and n_fg (sums in f64). */
    double sum = 0, nfg = 0;
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++) {
            int64_t i = (int64_t)b * A + a;
            int t = p->tgt[i];
            if (t < 0) {
                tscore[i] = 0;
                continue;
            }
            LPL_FN(pair)(p, cls, b, t, a, &ov, &al);
            int64_t r = (int64_t)b * G + t;
            tscore[i] = al * pos_ov[r] / (pos_al[r] + (real_t)1e-9);
            sum += (double)tscore[i];
            nfg += 1;
        }
    p->scal[LPL_S_TSS] = sum > 1 ? sum : 1;
    p->scal[LPL_S_NFG] = nfg;
}

#endif /* LPL_SUFFIX */
