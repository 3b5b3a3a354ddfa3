/*
 * ap.c — average precision, precision and recall over a validation set.
 * Source: Ultralytics utils/metrics.py ap_per_class, compute_ap and smooth
 * (8.4): sort by confidence; per class cumulative TP/FP; recall =
 * TP/(n_gt + 1e-16), precision = TP/(TP + FP); AP by the 101-point
 * interpolated trapezoid of the monotone precision envelope; P and R at the
 * confidence where the class-mean F1 curve (1000 points, box-filter smoothed
 * with fraction 0.1) peaks. Predictions marked ignored (-1) at a threshold
 * are left out of that threshold's curve (COCO crowd rule). The AP of a
 * curve is COCO's 101-point interpolation by default (lucid_ap_method).
 */
#include "eval.h"
#include "internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-16
#define NPX 1000

struct lucid_ap_accum {
    int64_t n, cap;         /* predictions */
    float *conf;
    int *cls;
    int8_t *tp;             /* [cap][10] */
    int64_t ngt, gcap;
    int *gt_cls;
};

lucid_status lucid_ap_accum_create(lucid_ctx *ctx, lucid_ap_accum **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return lucid_seterr(ctx, LUCID_ERR_OOM, "ap accumulator: out of memory");
    return LUCID_OK;
}

void lucid_ap_accum_free(lucid_ap_accum *a) {
    if (!a) return;
    free(a->conf);
    free(a->cls);
    free(a->tp);
    free(a->gt_cls);
    free(a);
}

void lucid_ap_accum_reset(lucid_ap_accum *a) {
    a->n = 0;
    a->ngt = 0;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

lucid_status lucid_ap_accum_add(lucid_ctx *ctx, lucid_ap_accum *a, int n_pred,
                                const float *conf, const int *pred_cls,
                                const int8_t *tp, int n_gt, const int *gt_cls) {
    int64_t need = a->n + n_pred;
    if (need > a->cap) {
        int64_t c1 = a->cap, c2 = a->cap, c3 = a->cap;
        if (grow((void **)&a->conf, &c1, need, sizeof(float)) ||
            grow((void **)&a->cls, &c2, need, sizeof(int)) ||
            grow((void **)&a->tp, &c3, need, LUCID_EVAL_NTHR))
            return lucid_seterr(ctx, LUCID_ERR_OOM,
                                "ap accumulator: out of memory at %lld "
                                "predictions",
                                (long long)need);
        a->cap = c1;
    }
    if (n_pred > 0) { /* (the arrays may be NULL when empty) */
        memcpy(a->conf + a->n, conf, sizeof(float) * (size_t)n_pred);
        memcpy(a->cls + a->n, pred_cls, sizeof(int) * (size_t)n_pred);
        memcpy(a->tp + a->n * LUCID_EVAL_NTHR, tp, (size_t)n_pred * LUCID_EVAL_NTHR);
    }
    a->n = need;
    if (grow((void **)&a->gt_cls, &a->gcap, a->ngt + n_gt, sizeof(int)))
        return lucid_seterr(ctx, LUCID_ERR_OOM, "ap accumulator: out of memory");
    if (n_gt > 0) memcpy(a->gt_cls + a->ngt, gt_cls, sizeof(int) * (size_t)n_gt);
    a->ngt += n_gt;
    return LUCID_OK;
}

/* numpy.interp for increasing (possibly repeated) xp. */
static double interp(double x, const double *xp, const double *fp, int n,
                     double left, double right) {
    if (n == 0) return left;
    if (x < xp[0]) return left;
    if (x > xp[n - 1]) return right;
    int lo = 0, hi = n - 1; /* last j with xp[j] <= x */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (xp[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    if (xp[lo] == x || lo == n - 1) return fp[lo];
    double slope = (fp[lo + 1] - fp[lo]) / (xp[lo + 1] - xp[lo]);
    return fp[lo] + slope * (x - xp[lo]);
}

/* pycocotools: q[r] = envelope precision at searchsorted(rc, r, 'left'). */
static double compute_ap_coco(const double *recall, const double *precision,
                              int n) {
    double *env = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!env) return NAN;
    for (int i = 0; i < n; i++) env[i] = precision[i];
    for (int i = n - 1; i > 0; i--)
        if (env[i] > env[i - 1]) env[i - 1] = env[i];
    double sum = 0.0;
    int k = 0;
    for (int r = 0; r <= 100; r++) {
        double thr = r * 0.01; /* numpy.linspace(0, 1, 101)[r], as pycocotools */
        while (k < n && recall[k] < thr) k++;
        sum += k < n ? env[k] : 0.0;
    }
    free(env);
    return sum / 101.0;
}

double lucid_compute_ap(const double *recall, const double *precision, int n,
                        lucid_ap_method method) {
    if (method == LUCID_AP_COCO) return compute_ap_coco(recall, precision, n);
    int m = n + 3;
    double *mrec = malloc(sizeof(double) * (size_t)m);
    double *mpre = malloc(sizeof(double) * (size_t)m);
    if (!mrec || !mpre) {
        free(mrec);
        free(mpre);
        return NAN;
    }
    mrec[0] = 0.0;
    mpre[0] = 1.0;
    for (int i = 0; i < n; i++) {
        mrec[i + 1] = recall[i];
        mpre[i + 1] = precision[i];
    }
    mrec[n + 1] = n > 0 ? recall[n - 1] : 0.0;
    mpre[n + 1] = 0.0;
    mrec[n + 2] = 1.0;
    mpre[n + 2] = 0.0;
    for (int i = m - 2; i >= 0; i--)
        if (mpre[i + 1] > mpre[i]) mpre[i] = mpre[i + 1];
    double ap = 0.0, prev = interp(0.0, mrec, mpre, m, mpre[0], mpre[m - 1]);
    for (int i = 1; i <= 100; i++) {
        double x = i / 100.0;
        double y = interp(x, mrec, mpre, m, mpre[0], mpre[m - 1]);
        ap += 0.5 * (prev + y) * 0.01;
        prev = y;
    }
    free(mrec);
    free(mpre);
    return ap;
}

typedef struct order_item {
    float conf;
    int64_t idx;
} order_item;

static int order_cmp(const void *pa, const void *pb) {
    const order_item *a = pa, *b = pb;
    if (a->conf > b->conf) return -1;
    if (a->conf < b->conf) return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

lucid_status lucid_ap_accum_compute(lucid_ctx *ctx, const lucid_ap_accum *a,
                                    lucid_ap_method method,
                                    lucid_ap_result *out) {
    memset(out, 0, sizeof *out);
    out->n_gt = a->ngt;
    out->n_pred = a->n;
    if (a->ngt == 0) return LUCID_OK;
    /* unique target classes and their counts */
    int *gcls = malloc(sizeof(int) * (size_t)a->ngt);
    order_item *ord = malloc(sizeof(order_item) * (size_t)(a->n ? a->n : 1));
    double *rec = malloc(sizeof(double) * (size_t)(a->n + 1));
    double *pre = malloc(sizeof(double) * (size_t)(a->n + 1));
    double *xc = malloc(sizeof(double) * (size_t)(a->n + 1));
    double *pcurve = NULL, *rcurve = NULL;
    lucid_status st = LUCID_OK;
    if (!gcls || !ord || !rec || !pre || !xc) {
        st = lucid_seterr(ctx, LUCID_ERR_OOM, "ap: out of memory");
        goto done;
    }
    memcpy(gcls, a->gt_cls, sizeof(int) * (size_t)a->ngt);
    qsort(gcls, (size_t)a->ngt, sizeof(int), int_cmp);
    int nc = 0;
    for (int64_t i = 0; i < a->ngt; i++)
        if (i == 0 || gcls[i] != gcls[i - 1]) gcls[nc++] = gcls[i];
    pcurve = calloc((size_t)nc * NPX, sizeof(double));
    rcurve = calloc((size_t)nc * NPX, sizeof(double));
    if (!pcurve || !rcurve) {
        st = lucid_seterr(ctx, LUCID_ERR_OOM, "ap: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < a->n; i++) {
        ord[i].conf = a->conf[i];
        ord[i].idx = i;
    }
    qsort(ord, (size_t)a->n, sizeof *ord, order_cmp);

    double map_sum[LUCID_EVAL_NTHR] = {0};
    for (int ci = 0; ci < nc; ci++) {
        int c = gcls[ci];
        int64_t n_l = 0;
        for (int64_t i = 0; i < a->ngt; i++) n_l += a->gt_cls[i] == c;
        for (int t = 0; t < LUCID_EVAL_NTHR; t++) {
            int n = 0;
            double tpc = 0, fpc = 0;
            for (int64_t k = 0; k < a->n; k++) {
                int64_t i = ord[k].idx;
                if (a->cls[i] != c) continue;
                int8_t v = a->tp[i * LUCID_EVAL_NTHR + t];
                if (v < 0) continue; /* ignored at this threshold */
                tpc += v;
                fpc += 1 - v;
                rec[n] = tpc / ((double)n_l + EPS);
                pre[n] = tpc / (tpc + fpc);
                xc[n] = -(double)a->conf[i];
                n++;
            }
            if (n == 0) break; /* no predictions of this class: AP 0 */
            map_sum[t] += lucid_compute_ap(rec, pre, n, method);
            if (t == 0) {
                for (int j = 0; j < NPX; j++) {
                    double x = -(double)j / (NPX - 1);
                    rcurve[(size_t)ci * NPX + j] = interp(x, xc, rec, n, 0.0, rec[n - 1]);
                    pcurve[(size_t)ci * NPX + j] = interp(x, xc, pre, n, 1.0, pre[n - 1]);
                }
            }
        }
    }
    /* F1 of the class means, smoothed (box filter of 101 points, edges
     * padded with the end values), argmax */
    double f1[NPX], sm[NPX];
    for (int j = 0; j < NPX; j++) {
        double s = 0;
        for (int ci = 0; ci < nc; ci++) {
            double p = pcurve[(size_t)ci * NPX + j], r = rcurve[(size_t)ci * NPX + j];
            s += 2 * p * r / (p + r + EPS);
        }
        f1[j] = s / nc;
    }
    int nf = (int)lround(NPX * 0.1 * 2) / 2 + 1, half = nf / 2;
    for (int j = 0; j < NPX; j++) {
        double s = 0;
        for (int k = j - half; k <= j + half; k++)
            s += f1[k < 0 ? 0 : k >= NPX ? NPX - 1 : k];
        sm[j] = s / nf;
    }
    int best = 0;
    for (int j = 1; j < NPX; j++)
        if (sm[j] > sm[best]) best = j;
    double psum = 0, rsum = 0;
    for (int ci = 0; ci < nc; ci++) {
        psum += pcurve[(size_t)ci * NPX + best];
        rsum += rcurve[(size_t)ci * NPX + best];
    }
    out->precision = psum / nc;
    out->recall = rsum / nc;
    double m = 0;
    for (int t = 0; t < LUCID_EVAL_NTHR; t++) {
        out->map[t] = map_sum[t] / nc;
        m += out->map[t];
    }
    out->map50 = out->map[0];
    out->map50_95 = m / LUCID_EVAL_NTHR;
    out->n_classes = nc;
done:
    free(gcls);
    free(ord);
    free(rec);
    free(pre);
    free(xc);
    free(pcurve);
    free(rcurve);
    return st;
}
