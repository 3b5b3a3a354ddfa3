/*
 * labels.c — YOLO-pose label parsing and validation.
 *
 * Contract
 *   - One row per instance: "cls cx cy w h" then K x (x y [v]), whitespace
 *     separated, normalised to [0,1]. Blank lines are ignored.
 *   - Checks as Ultralytics verify_image_label (data/utils.py), plus
 *     finiteness and the visibility set: 5 + K*D columns; every value >= 0;
 *     box and keypoint coordinates <= 1; class an integer in [0, nc);
 *     v in {0,1,2} when D = 3. Exact duplicate rows are removed and counted.
 *   - A bad row is ERR_FORMAT with the message "<file>:<line>: <what>" and
 *     the reason/line returned, so the dataset can count it by policy.
 *   - For D = 2 the visibility is derived as the reference does: 0 when
 *     x < 0 or y < 0, else 1 (the range check makes it 1).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const reject_names[LUCID_REJECT_COUNT] = {
    "none",          "image_missing",    "image_empty",
    "image_corrupt", "image_small",      "label_io",
    "label_columns", "label_number",     "label_nonfinite",
    "label_range",   "label_class",      "label_visibility",
};

const char *lucid_reject_name(lucid_reject r) {
    if ((int)r < 0 || r >= LUCID_REJECT_COUNT) return "unknown";
    return reject_names[r];
}

lucid_status lucid_flip_idx_check(lucid_ctx *ctx, const int *flip_idx, int n,
                                  int nkpt) {
    if (n != nkpt)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "flip_idx has %d entries, kpt_shape has %d "
                            "keypoints",
                            n, nkpt);
    for (int i = 0; i < n; i++) {
        int j = flip_idx[i];
        if (j < 0 || j >= n)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "flip_idx[%d] = %d is outside 0..%d", i, j,
                                n - 1);
        if (flip_idx[j] != i)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "flip_idx is not its own inverse: "
                                "flip_idx[%d] = %d but flip_idx[%d] = %d",
                                i, j, j, flip_idx[j]);
    }
    return LUCID_OK;
}

lucid_status lucid_labels_alloc(lucid_ctx *ctx, int n, int nkpt,
                                lucid_labels *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return LUCID_OK;
    out->cls = malloc(sizeof(float) * n);
    out->box = malloc(sizeof(float) * n * 4);
    out->kpts = nkpt > 0 ? malloc(sizeof(float) * n * nkpt * 3) : NULL;
    if (!out->cls || !out->box || (nkpt > 0 && !out->kpts)) {
        lucid_labels_free(out);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory for %d labels",
                            n);
    }
    out->n = n;
    return LUCID_OK;
}

void lucid_labels_free(lucid_labels *l) {
    if (!l) return;
    free(l->cls);
    free(l->box);
    free(l->kpts);
    memset(l, 0, sizeof *l);
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Parse one line into vals (up to maxv); returns the number of tokens (which
 * may exceed maxv: only counted), or -1 with *bad set to the first token that
 * is not a number. */
static int parse_row(const char *s, const char *e, double *vals, int maxv,
                     char *bad, size_t badlen) {
    int n = 0;
    char tok[64];
    while (s < e) {
        while (s < e && is_space(*s)) s++;
        if (s >= e) break;
        const char *t = s;
        while (s < e && !is_space(*s)) s++;
        size_t tl = (size_t)(s - t);
        if (tl >= sizeof tok) {
            snprintf(bad, badlen, "%.20s...", t);
            return -1;
        }
        memcpy(tok, t, tl);
        tok[tl] = 0;
        char *end;
        double v = strtod(tok, &end);
        if (end == tok || *end != 0) {
            snprintf(bad, badlen, "%s", tok);
            return -1;
        }
        if (n < maxv) vals[n] = v;
        n++;
    }
    return n;
}

lucid_status lucid_labels_parse(lucid_ctx *ctx, const char *name,
                                const char *text, size_t len,
                                const lucid_pose_spec *spec, lucid_labels *out,
                                lucid_reject *reason, int *line_out) {
    memset(out, 0, sizeof *out);
    *reason = LUCID_REJECT_NONE;
    *line_out = 0;
    int K = spec->nkpt, D = spec->ndim;
    if (K < 0 || K > LUCID_MAX_KPT || (K > 0 && D != 2 && D != 3))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "kpt_shape [%d,%d] unsupported (K <= %d, D 2|3)",
                            K, D, LUCID_MAX_KPT);
    int ncol = 5 + K * (K > 0 ? D : 0);
    /* count lines for the allocation */
    int cap = 0;
    for (size_t i = 0; i < len; i++) if (text[i] == '\n') cap++;
    cap++;
    double *vals = malloc(sizeof(double) * (ncol + 1));
    lucid_labels l;
    lucid_status st = lucid_labels_alloc(ctx, cap, K, &l);
    if (st != LUCID_OK || !vals) {
        free(vals);
        lucid_labels_free(&l);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", name);
    }
    int n = 0, lineno = 0, ndup = 0;
    const char *p = text, *end = text + len;
    char bad[80];
    lucid_reject why = LUCID_REJECT_NONE;
    char msg[200] = {0};
    while (p < end && why == LUCID_REJECT_NONE) {
        const char *le = memchr(p, '\n', (size_t)(end - p));
        if (!le) le = end;
        lineno++;
        int nt = parse_row(p, le, vals, ncol + 1, bad, sizeof bad);
        const char *ls = p;
        p = le + 1;
        if (nt == 0) continue;
        (void)ls;
        if (nt < 0) {
            why = LUCID_REJECT_LABEL_NUMBER;
            snprintf(msg, sizeof msg, "'%s' is not a number", bad);
            break;
        }
        if (nt != ncol) {
            why = LUCID_REJECT_LABEL_COLUMNS;
            snprintf(msg, sizeof msg,
                     "%d columns, expected %d (5 + %d keypoints x %d)", nt,
                     ncol, K, K > 0 ? D : 0);
            break;
        }
        for (int c = 0; c < ncol; c++) {
            if (!isfinite(vals[c])) {
                why = LUCID_REJECT_LABEL_NONFINITE;
                snprintf(msg, sizeof msg, "column %d is not finite (%g)",
                         c + 1, vals[c]);
                break;
            }
        }
        if (why) break;
        double cls = vals[0];
        if (cls < 0 || cls != floor(cls) || cls >= spec->nc) {
            why = LUCID_REJECT_LABEL_CLASS;
            snprintf(msg, sizeof msg,
                     "class %g is not an integer in [0, %d)", cls, spec->nc);
            break;
        }
        for (int c = 1; c < ncol; c++) {
            int is_v = K > 0 && D == 3 && c >= 5 && (c - 5) % 3 == 2;
            if (is_v) {
                double v = vals[c];
                if (v != 0 && v != 1 && v != 2) {
                    why = LUCID_REJECT_LABEL_VISIBILITY;
                    snprintf(msg, sizeof msg,
                             "keypoint %d visibility %g not in {0,1,2}",
                             (c - 5) / 3, v);
                    break;
                }
            } else if (vals[c] < 0 || vals[c] > 1) {
                why = LUCID_REJECT_LABEL_RANGE;
                if (c < 5)
                    snprintf(msg, sizeof msg,
                             "box column %d = %g outside [0,1]", c + 1,
                             vals[c]);
                else
                    snprintf(msg, sizeof msg,
                             "keypoint %d coordinate = %g outside [0,1]",
                             (c - 5) / D, vals[c]);
                break;
            }
        }
        if (why) break;
        /* store */
        float *kp = K > 0 ? l.kpts + (size_t)n * K * 3 : NULL;
        l.cls[n] = (float)cls;
        for (int c = 0; c < 4; c++) l.box[n * 4 + c] = (float)vals[1 + c];
        for (int k = 0; k < K; k++) {
            float x = (float)vals[5 + k * D], y = (float)vals[5 + k * D + 1];
            float v = D == 3 ? (float)vals[5 + k * D + 2]
                             : ((x < 0 || y < 0) ? 0.f : 1.f);
            kp[k * 3] = x;
            kp[k * 3 + 1] = y;
            kp[k * 3 + 2] = v;
        }
        /* duplicate of an earlier row? */
        int dup = 0;
        for (int r = 0; r < n && !dup; r++) {
            if (l.cls[r] != l.cls[n] ||
                memcmp(l.box + r * 4, l.box + n * 4, sizeof(float) * 4))
                continue;
            if (K == 0 || memcmp(l.kpts + (size_t)r * K * 3, kp,
                                 sizeof(float) * K * 3) == 0)
                dup = 1;
        }
        if (dup) ndup++;
        else n++;
    }
    free(vals);
    if (why != LUCID_REJECT_NONE) {
        lucid_labels_free(&l);
        *reason = why;
        *line_out = lineno;
        return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s:%d: %s", name, lineno,
                            msg);
    }
    if (n == 0) {
        lucid_labels_free(&l);
    } else {
        l.n = n;
    }
    l.ndup = ndup;
    *out = l;
    return LUCID_OK;
}

lucid_status lucid_labels_read(lucid_ctx *ctx, const char *path,
                               const lucid_pose_spec *spec, lucid_labels *out,
                               lucid_reject *reason, int *line, int *missing) {
    memset(out, 0, sizeof *out);
    *reason = LUCID_REJECT_NONE;
    *line = 0;
    *missing = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) {
            *missing = 1;
            return LUCID_OK;
        }
        *reason = LUCID_REJECT_LABEL_IO;
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open label file: %s",
                            path, strerror(errno));
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (!buf) return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", path);
    if (rerr) {
        free(buf);
        *reason = LUCID_REJECT_LABEL_IO;
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: read error", path);
    }
    lucid_status st =
        lucid_labels_parse(ctx, path, buf, len, spec, out, reason, line);
    free(buf);
    return st;
}

/* Normalised forward map stored -> display (see decode.c lucid_image_orient):
 * 2 (1-x, y); 3 (1-x, 1-y); 4 (x, 1-y); 5 (y, x); 6 (1-y, x); 7 (1-y, 1-x);
 * 8 (y, 1-x). */
static void orient_xy(int o, float *x, float *y) {
    float a = *x, b = *y;
    switch (o) {
    case 2: *x = 1 - a; break;
    case 3: *x = 1 - a; *y = 1 - b; break;
    case 4: *y = 1 - b; break;
    case 5: *x = b; *y = a; break;
    case 6: *x = 1 - b; *y = a; break;
    case 7: *x = 1 - b; *y = 1 - a; break;
    case 8: *x = b; *y = 1 - a; break;
    default: break;
    }
}

void lucid_labels_orient(lucid_labels *l, int nkpt, int o) {
    if (o <= 1 || o > 8) return;
    for (int i = 0; i < l->n; i++) {
        float *b = l->box + i * 4;
        orient_xy(o, &b[0], &b[1]);
        if (o >= 5) {
            float t = b[2];
            b[2] = b[3];
            b[3] = t;
        }
        for (int k = 0; k < nkpt; k++) {
            float *kp = l->kpts + ((size_t)i * nkpt + k) * 3;
            if (kp[2] == 0) continue; /* v=0: no position to move */
            orient_xy(o, &kp[0], &kp[1]);
        }
    }
}
