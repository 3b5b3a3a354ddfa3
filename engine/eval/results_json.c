/*
 * results_json.c — COCO results entries of one image's detections as JSON
 * text, the same values lua/lucid/predict.lua computes (unletterbox, then
 * coco_entries' rounding) written the way lua-cjson writes them ("%.14g"),
 * without building Lua tables: for the val_predictions.json of a fit
 * (lua/lucid/val_output.lua), 300 detections x 56 numbers per image.
 */
#include "eval.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* round(x, d) of predict.lua: floor(x * 10^d + 0.5) / 10^d, then "%.14g".
 * k = floor(x * 10^d + 0.5) is an integer; when |k| < 1e14 and the value is
 * 0 or at least 1e-4, "%.14g" of k / 10^d prints exactly the decimal digits
 * of k with d of them after the point, trailing zeros (and a bare point)
 * removed: the double k / 10^d is within half an ulp of that decimal,
 * which has at most 14 significant digits, and its decimal exponent is in
 * [-4, 14), where %g uses the fixed style. Other values go through
 * snprintf. */
int lucid_eval_format_rounded(char *out, double x, int decimals) {
    static const double p10[] = {1, 10, 100, 1000, 10000, 100000, 1000000};
    if (decimals < 0 || decimals > 6) return -1;
    double m = p10[decimals];
    double k = floor(x * m + 0.5);
    double v = k / m;
    if (!isfinite(v)) return -1;
    if (!(fabs(k) < 1e14) || (k != 0 && fabs(v) < 1e-4) || (k == 0 && signbit(k)))
        return snprintf(out, 32, "%.14g", v);
    char *p = out;
    uint64_t u = (uint64_t)fabs(k);
    if (k < 0) *p++ = '-';
    uint64_t P = (uint64_t)m, ip = u / P, fp = u % P;
    char tmp[24];
    int nt = 0;
    do {
        tmp[nt++] = (char)('0' + ip % 10);
        ip /= 10;
    } while (ip);
    while (nt) *p++ = tmp[--nt];
    if (fp) {
        char fr[8];
        for (int i = decimals - 1; i >= 0; i--) {
            fr[i] = (char)('0' + fp % 10);
            fp /= 10;
        }
        int len = decimals;
        while (len > 0 && fr[len - 1] == '0') len--;
        *p++ = '.';
        memcpy(p, fr, (size_t)len);
        p += len;
    }
    *p = 0;
    return (int)(p - out);
}

/* predict.unletterbox: x -> (x - pad) / ratio, clamped to [0, size] (a NaN
 * stays NaN), in double as Lua computes it. */
static double unlb(double x, double pad, double ratio, double size) {
    x = (x - pad) / ratio;
    return x < 0 ? 0 : (x > size ? size : x);
}

size_t lucid_eval_coco_json_bound(int n, int K) {
    /* per entry: 5 + 3K numbers of at most 32 bytes, 96 bytes of keys */
    return (size_t)(n > 0 ? n : 0) * ((size_t)(5 + 3 * (K > 0 ? K : 0)) * 32 + 96) + 1;
}

#define PUT(s)                                                                 \
    do {                                                                       \
        size_t l_ = strlen(s);                                                 \
        memcpy(p, s, l_);                                                      \
        p += l_;                                                               \
    } while (0)
#define NUM(x, d)                                                              \
    do {                                                                       \
        int l_ = lucid_eval_format_rounded(p, (x), (d));                       \
        if (l_ < 0) return -1;                                                 \
        p += l_;                                                               \
    } while (0)

int64_t lucid_eval_coco_json(const lucid_det *dets, int n, int K,
                             double image_id, const lucid_unletterbox *g,
                             char *out) {
    char *p = out;
    char idbuf[64];
    if (!isfinite(image_id)) return -1;
    snprintf(idbuf, sizeof idbuf, "{\"image_id\":%.14g,\"category_id\":", image_id);
    for (int i = 0; i < n; i++) {
        const lucid_det *d = &dets[i];
        if (i) *p++ = ',';
        PUT(idbuf);
        p += snprintf(p, 32, "%.14g", (double)d->cls + 1);
        PUT(",\"bbox\":[");
        double x1 = unlb(d->box[0], g->pad_x, g->rx, g->w);
        double y1 = unlb(d->box[1], g->pad_y, g->ry, g->h);
        double x2 = unlb(d->box[2], g->pad_x, g->rx, g->w);
        double y2 = unlb(d->box[3], g->pad_y, g->ry, g->h);
        NUM(x1, 3);
        *p++ = ',';
        NUM(y1, 3);
        *p++ = ',';
        NUM(x2 - x1, 3);
        *p++ = ',';
        NUM(y2 - y1, 3);
        PUT("],\"score\":");
        NUM((double)d->conf, 5);
        if (d->kpts && K > 0) {
            PUT(",\"keypoints\":[");
            for (int k = 0; k < K; k++) {
                if (k) *p++ = ',';
                NUM(unlb(d->kpts[3 * k], g->pad_x, g->rx, g->w), 3);
                *p++ = ',';
                NUM(unlb(d->kpts[3 * k + 1], g->pad_y, g->ry, g->h), 3);
                *p++ = ',';
                NUM((double)d->kpts[3 * k + 2], 5);
            }
            *p++ = ']';
        }
        *p++ = '}';
    }
    *p = 0;
    return (int64_t)(p - out);
}
