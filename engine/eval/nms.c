/*
 * nms.c — head decoding and non-maximum suppression for validation.
 * Sources: Ultralytics nn/modules/head.py (Detect: DFL + dist2bbox,
 * Pose.kpts_decode) and utils/nms.py non_max_suppression (conf > 0.001,
 * top max_nms by confidence, torchvision nms at IoU 0.7 per class,
 * max_det 300).
 *
 * The work is ordered so that only what the result depends on is computed
 * (with a barely trained model every one of the 8400 anchors passes conf
 * 0.001, but NMS reaches max_det long before the end of the list):
 *   1. confidence of every anchor (max class logit, sigmoid), candidates
 *      above conf_thres;
 *   2. candidates ordered by descending confidence, ties by ascending anchor
 *      (a total order: an LSD radix sort on the f32 bits, stable, of anchors
 *      enumerated in ascending order), cut to max_nms;
 *   3. greedy NMS walking that list: a candidate is kept when no kept box of
 *      its class overlaps it with IoU > iou_thres, until max_det are kept.
 *      Boxes are DFL-decoded lazily, CHUNK candidates ahead of the walk;
 *   4. keypoints decoded for the kept detections only.
 * Every value is computed with the same f32/f64 operations in the same
 * order as the straightforward path (reference.c: full qsort, every
 * candidate decoded, lucid_nms_sorted), so the detections are bitwise the
 * same (spec/c/test_eval.c checks it on random inputs).
 */
#include "eval.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 16 /* boxes decoded ahead of the NMS walk */

lucid_nms_opts lucid_nms_opts_default(void) {
    lucid_nms_opts o = {0.001f, 0.7f, 300, 30000};
    return o;
}

double lucid_eval_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* IoU without eps, as torchvision.ops.nms computes it. */
static float nms_iou(const float *a, const float *b) {
    float iw = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float ih = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    float inter = (iw > 0 ? iw : 0) * (ih > 0 ? ih : 0);
    float uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) -
                inter;
    return uni > 0 ? inter / uni : 0.0f;
}

int lucid_nms_sorted(const float *boxes, const int *cls, int n,
                     float iou_thres, int max_keep, int *keep) {
    int kept = 0;
    for (int i = 0; i < n; i++) keep[i] = 1;
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        if (kept == max_keep) {
            keep[i] = 0;
            continue;
        }
        kept++;
        for (int j = i + 1; j < n; j++)
            if (keep[j] && cls[j] == cls[i] &&
                nms_iou(boxes + 4 * i, boxes + 4 * j) > iou_thres)
                keep[j] = 0;
    }
    return kept;
}

typedef lucid_eval_cand cand;

/* Scratch layout of the fast path: cands [A], radix buffer [A], boxes
 * [A][4], kept boxes as columns x1 y1 x2 y2 area and class [A + KBLK]
 * each, kept candidate index [A]. */
#define KBLK 8 /* kept boxes tested per branch-free block */
static size_t fast_scratch_bytes(int A) {
    return (size_t)A * (2 * sizeof(cand) + 4 * sizeof(float) + sizeof(int)) +
           (size_t)(A + KBLK) * (5 * sizeof(float) + sizeof(int)) + 64;
}

size_t lucid_eval_scratch_bytes(int A, int nc, int K) {
    (void)nc;
    (void)K;
    size_t f = fast_scratch_bytes(A), r = lucid_eval_reference_scratch_bytes(A);
    return f > r ? f : r;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

int lucid_eval_candidates(const float *cls_logits, int A, int nc, float conf_thres,
                          lucid_eval_cand *out) {
    int n = 0;
    for (int a = 0; a < A; a++) {
        int best = 0;
        float bl = cls_logits[a];
        for (int c = 1; c < nc; c++)
            if (cls_logits[(size_t)c * A + a] > bl) {
                bl = cls_logits[(size_t)c * A + a];
                best = c;
            }
        float conf = sigmoidf_(bl);
        if (conf > conf_thres) {
            out[n].conf = conf;
            out[n].anchor = a;
            out[n].cls = best;
            n++;
        }
    }
    return n;
}

int lucid_eval_anchor(const lucid_anchor_level *lv, int nlv, int a, float *ax,
                      float *ay, float *stride) {
    for (int l = 0; l < nlv; l++) {
        int n = lv[l].h * lv[l].w;
        if (a < n) {
            *ax = (float)(a % lv[l].w) + 0.5f;
            *ay = (float)(a / lv[l].w) + 0.5f;
            *stride = lv[l].stride;
            return 0;
        }
        a -= n;
    }
    return -1;
}

void lucid_eval_det_fill(lucid_det *d, const float box[4], float conf, int cls, int anchor,
                         const lucid_anchor_level *levels, int nlevels, const float *kpt_raw,
                         int A, int K, float *kp) {
    memcpy(d->box, box, sizeof d->box);
    d->conf = conf;
    d->cls = cls;
    d->kpts = NULL;
    if (K <= 0) return;
    float ax = 0, ay = 0, stride = 1;
    lucid_eval_anchor(levels, nlevels, anchor, &ax, &ay, &stride);
    for (int k = 0; k < K; k++) {
        float rx = kpt_raw[(size_t)(3 * k) * A + anchor];
        float ry = kpt_raw[(size_t)(3 * k + 1) * A + anchor];
        float rv = kpt_raw[(size_t)(3 * k + 2) * A + anchor];
        kp[3 * k] = (rx * 2.0f + (ax - 0.5f)) * stride;
        kp[3 * k + 1] = (ry * 2.0f + (ay - 0.5f)) * stride;
        kp[3 * k + 2] = sigmoidf_(rv);
    }
    d->kpts = kp;
}

/* Candidates by descending confidence, ties in their current (ascending
 * anchor) order: stable LSD radix sort, ascending on the complement of the
 * f32 bits. Confidences are sigmoid values, never negative or NaN, so the
 * bit order is the numeric order (the same total order as the reference's
 * qsort on (conf desc, anchor asc)). */
static void sort_desc(cand *c, cand *tmp, int n) {
    if (n < 2) return;
    enum { BITS = 11, NB = 1 << BITS };
    static const int shift[3] = {0, 11, 22};
    uint32_t hist[3][NB];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &c[i].conf, 4);
        u = ~u;
        hist[0][u & (NB - 1)]++;
        hist[1][(u >> 11) & (NB - 1)]++;
        hist[2][u >> 22]++;
    }
    cand *src = c, *dst = tmp;
    for (int p = 0; p < 3; p++) {
        uint32_t *h = hist[p];
        uint32_t u0;
        memcpy(&u0, &src[0].conf, 4);
        u0 = ~u0;
        if (h[(u0 >> shift[p]) & (NB - 1)] == (uint32_t)n) continue; /* one digit */
        uint32_t sum = 0;
        for (int d = 0; d < NB; d++) {
            uint32_t c_ = h[d];
            h[d] = sum;
            sum += c_;
        }
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[i].conf, 4);
            u = ~u;
            dst[h[(u >> shift[p]) & (NB - 1)]++] = src[i];
        }
        cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != c) memcpy(c, src, sizeof *c * (size_t)n);
}

/* DFL expectation of the 4 sides -> xyxy pixels, for the cnt candidates
 * c[0..cnt-1] (cnt <= CHUNK). The logits are gathered row by row first
 * (4*reg_max rows of A floats: independent loads instead of one cache miss
 * after another), then each side is reduced exactly as the reference does:
 * m = max, w_b = exp((double)(l_b - m)), dist = (float)(sum w_b*b / sum w_b). */
static void decode_boxes(const float *box_logits, int A, int reg_max,
                         const cand *c, int cnt,
                         const lucid_anchor_level *levels, int nlevels,
                         float *out) {
    float g[4 * 64][CHUNK];
    for (int r = 0; r < 4 * reg_max; r++) {
        const float *row = box_logits + (size_t)r * A;
        for (int j = 0; j < cnt; j++) g[r][j] = row[c[j].anchor];
    }
    for (int j = 0; j < cnt; j++) {
        float ax = 0, ay = 0, stride = 1;
        lucid_eval_anchor(levels, nlevels, c[j].anchor, &ax, &ay, &stride);
        float dist[4];
        for (int side = 0; side < 4; side++) {
            float(*v)[CHUNK] = g + side * reg_max;
            float m = v[0][j];
            for (int b = 1; b < reg_max; b++)
                if (v[b][j] > m) m = v[b][j];
            double z = 0, e = 0;
            for (int b = 0; b < reg_max; b++) {
                double w = exp((double)(v[b][j] - m));
                z += w;
                e += w * b;
            }
            dist[side] = (float)(e / z);
        }
        float *o = out + 4 * (size_t)j;
        o[0] = (ax - dist[0]) * stride;
        o[1] = (ay - dist[1]) * stride;
        o[2] = (ax + dist[2]) * stride;
        o[3] = (ay + dist[3]) * stride;
    }
}

/* Kept boxes as columns, padded to a multiple of KBLK with entries of class
 * -1 (never a candidate's class, so never suppressing). */
typedef struct kept_cols {
    float *x1, *y1, *x2, *y2, *area;
    int *cls;
} kept_cols;

/* suppressed(): does a kept box of class bc overlap b with IoU > thr? The
 * reference's nms_iou(kept, b) term for term: the areas computed once with
 * the same expression, uni = (area_k + area_b) - inter, iou = uni > 0 ?
 * inter / uni : 0. Which kept box suppresses does not matter, only whether
 * one does. */
#if defined(__GNUC__) && !defined(LUCID_EVAL_SCALAR_NMS)
/* The same arithmetic on KBLK kept boxes at a time (GCC/Clang vector
 * extensions: IEEE lane-wise, the same operations as the scalar path). The
 * selects are x < y ? x : y and x > y ? x : y: when the candidate's y is a
 * number they pick what fminf/fmaxf pick (a NaN kept x gives y); when a
 * candidate coordinate is NaN its area is NaN, so uni is NaN and the IoU 0
 * with every kept box, whatever the selects give, exactly as in the
 * reference (a NaN box is never suppressed). */
#define VL 4 /* lanes: one SSE/NEON register */
typedef float vf __attribute__((vector_size(4 * VL)));
typedef int vi __attribute__((vector_size(4 * VL)));

static inline vf vsel(vi m, vf a, vf b) {
    return (vf)((m & (vi)a) | (~m & (vi)b));
}

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int suppressed(const kept_cols *k, int nk, const float *b, float barea,
                      int bc, float thr) {
    const vf zero = {0};
    const vf bx1 = zero + b[0], by1 = zero + b[1], bx2 = zero + b[2],
             by2 = zero + b[3], ba = zero + barea, th = zero + thr;
    const vi cl = (vi){0} + bc;
    for (int k0 = 0; k0 < nk; k0 += KBLK) {
        vi hit = {0};
        for (int q = k0; q < k0 + KBLK; q += VL) {
            vf kx1 = vload(k->x1 + q), ky1 = vload(k->y1 + q);
            vf kx2 = vload(k->x2 + q), ky2 = vload(k->y2 + q);
            vf ka = vload(k->area + q);
            vi kc;
            memcpy(&kc, k->cls + q, sizeof kc);
            vf mx2 = vsel(kx2 < bx2, kx2, bx2);
            vf Mx1 = vsel(kx1 > bx1, kx1, bx1);
            vf my2 = vsel(ky2 < by2, ky2, by2);
            vf My1 = vsel(ky1 > by1, ky1, by1);
            vf iw = mx2 - Mx1, ih = my2 - My1;
            vf inter = vsel(iw > zero, iw, zero) * vsel(ih > zero, ih, zero);
            vf uni = ka + ba - inter;
            vf iou = vsel(uni > zero, inter / uni, zero);
            hit |= (iou > th) & (kc == cl);
        }
        if (hit[0] | hit[1] | hit[2] | hit[3]) return 1;
    }
    return 0;
}
#else
/* One kept box at a time (other compilers, or -DLUCID_EVAL_SCALAR_NMS).
 * fminf/fmaxf are written out as selects: x < y || y != y ? x : y picks
 * what fminf(x, y) picks (a zero's sign may differ, which cannot change
 * inter: iw = min - max is then 0 or the same value). */
static int suppressed(const kept_cols *k, int nk, const float *b, float barea,
                      int bc, float thr) {
    const float bx1 = b[0], by1 = b[1], bx2 = b[2], by2 = b[3];
    for (int q = 0; q < nk; q++) {
        if (k->cls[q] != bc) continue;
        float kx2 = k->x2[q], kx1 = k->x1[q], ky2 = k->y2[q], ky1 = k->y1[q];
        float mx2 = (kx2 < bx2 || bx2 != bx2) ? kx2 : bx2;
        float Mx1 = (kx1 > bx1 || bx1 != bx1) ? kx1 : bx1;
        float my2 = (ky2 < by2 || by2 != by2) ? ky2 : by2;
        float My1 = (ky1 > by1 || by1 != by1) ? ky1 : by1;
        float iw = mx2 - Mx1, ih = my2 - My1;
        float inter = (iw > 0 ? iw : 0) * (ih > 0 ? ih : 0);
        float uni = k->area[q] + barea - inter;
        float iou = uni > 0 ? inter / uni : 0.0f;
        if (iou > thr) return 1;
    }
    return 0;
}
#endif

int lucid_eval_decode_nms_timed(const float *box_logits,
                                const float *cls_logits, const float *kpt_raw,
                                int A, int reg_max, int nc, int K,
                                const lucid_anchor_level *levels, int nlevels,
                                const lucid_nms_opts *opts, void *scratch,
                                lucid_det *dets, float *kpt_out,
                                lucid_eval_timings *tm) {
    if (A <= 0 || reg_max <= 0 || reg_max > 64 || nc <= 0 || K < 0 || !opts)
        return -1;
    int total = 0;
    for (int l = 0; l < nlevels; l++) total += levels[l].h * levels[l].w;
    if (total != A) return -1;

    cand *cands = scratch;
    cand *tmp = cands + A;
    float *boxes = (float *)(tmp + A);
    kept_cols kc;
    kc.x1 = boxes + 4 * (size_t)A;
    kc.y1 = kc.x1 + A + KBLK;
    kc.x2 = kc.y1 + A + KBLK;
    kc.y2 = kc.x2 + A + KBLK;
    kc.area = kc.y2 + A + KBLK;
    kc.cls = (int *)(kc.area + A + KBLK);
    int *kidx = kc.cls + A + KBLK;
    double t0 = tm ? lucid_eval_now() : 0, t1 = 0;

    /* 1. candidates: max class probability above conf_thres */
    int n = lucid_eval_candidates(cls_logits, A, nc, opts->conf_thres, cands);
    /* 2. order, top max_nms */
    sort_desc(cands, tmp, n);
    if (n > opts->max_nms) n = opts->max_nms;
    if (tm) {
        t1 = lucid_eval_now();
        tm->select += t1 - t0;
        tm->candidates += n > 0 ? n : 0;
    }

    /* 3. greedy NMS over the ordered list, boxes decoded CHUNK ahead */
    const float thr = opts->iou_thres;
    const int max_keep = opts->max_det;
    int kept = 0, i = 0;
    double t_dec = 0, t_nms = 0;
    while (i < n && kept < max_keep) {
        int i1 = i + CHUNK < n ? i + CHUNK : n;
        double ta = tm ? lucid_eval_now() : 0;
        decode_boxes(box_logits, A, reg_max, cands + i, i1 - i, levels, nlevels,
                     boxes + 4 * (size_t)i);
        double tb = tm ? lucid_eval_now() : 0;
        if (tm) tm->decoded += i1 - i;
        for (; i < i1 && kept < max_keep; i++) {
            const float *b = boxes + 4 * (size_t)i;
            const float barea = (b[2] - b[0]) * (b[3] - b[1]);
            const int bc = cands[i].cls;
            if (suppressed(&kc, kept, b, barea, bc, thr)) continue;
            if (kept % KBLK == 0) /* a new block: class -1 never suppresses */
                for (int q = kept; q < kept + KBLK; q++) {
                    kc.x1[q] = kc.y1[q] = kc.x2[q] = kc.y2[q] = 0;
                    kc.area[q] = 1;
                    kc.cls[q] = -1;
                }
            kc.x1[kept] = b[0];
            kc.y1[kept] = b[1];
            kc.x2[kept] = b[2];
            kc.y2[kept] = b[3];
            kc.area[kept] = barea;
            kc.cls[kept] = bc;
            kidx[kept] = i;
            kept++;
        }
        if (tm) {
            double tc = lucid_eval_now();
            t_dec += tb - ta;
            t_nms += tc - tb;
        }
    }
    if (tm) {
        tm->decode += t_dec;
        tm->nms += t_nms;
        tm->kept += kept;
    }

    /* 4. the kept detections, keypoints decoded */
    double t2 = tm ? lucid_eval_now() : 0;
    for (int o = 0; o < kept; o++) {
        int ci = kidx[o];
        lucid_eval_det_fill(&dets[o], boxes + 4 * (size_t)ci, cands[ci].conf, cands[ci].cls,
                            cands[ci].anchor, levels, nlevels, kpt_raw, A, K,
                            kpt_out + (size_t)o * K * 3);
    }
    if (tm) tm->kpts += lucid_eval_now() - t2;
    return kept;
}

int lucid_eval_decode_nms(const float *box_logits, const float *cls_logits,
                          const float *kpt_raw, int A, int reg_max, int nc,
                          int K, const lucid_anchor_level *levels, int nlevels,
                          const lucid_nms_opts *opts, void *scratch,
                          lucid_det *dets, float *kpt_out) {
    return lucid_eval_decode_nms_timed(box_logits, cls_logits, kpt_raw, A,
                                       reg_max, nc, K, levels, nlevels, opts,
                                       scratch, dets, kpt_out, NULL);
}
