/*
 * coco_json.c — the COCO keypoint JSON reader (person_keypoints_*.json),
 * with cJSON.
 *
 * Contract (as Ultralytics data/converter.py convert_coco with
 * use_keypoints=True, and the YOLOv7 coco-kpts label set):
 *   - images[] give file_name, width, height; they are sorted by file_name
 *     (the YOLO folder reader's order).
 *   - An annotation with iscrowd != 0 is dropped (counted in stats.crowd);
 *     with num_keypoints == 0 dropped (stats.no_keypoints) when K > 0; with
 *     bbox w or h <= 0 dropped.
 *   - box = (x + w/2) / W, (y + h/2) / H, w / W, h / H; keypoints x / W,
 *     y / H, v. class = index of category_id in categories[].
 *   - The rows are validated like txt rows (labels.c): a bad annotation
 *     rejects its image (counted as label_range, by the policy) with
 *     "<json>: annotation <id> (image <file>): ...".
 *   - JSON syntax errors name the file and line.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct coco_img {
    double id;
    const char *file;
    double w, h;
    int nann, cap;
    const cJSON **anns;
} coco_img;

static int cmp_img(const void *a, const void *b) {
    return strcmp(((const coco_img *)a)->file, ((const coco_img *)b)->file);
}

static double num(const cJSON *o, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static char *read_all(lucid_ctx *ctx, const char *path, size_t *len,
                      lucid_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open: %s", path,
                           strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        *st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: read failed", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* Convert the annotations of one image to normalised label rows; returns
 * ERR_FORMAT with the message in ectx on a bad annotation. */
static lucid_status convert_image(lucid_ctx *ctx, const char *json_path,
                                  const coco_img *im, const cJSON *cats,
                                  const lucid_pose_spec *spec,
                                  lucid_labels *out, lucid_dataset_stats *pre) {
    int K = spec->nkpt;
    LUCID_TRY(lucid_labels_alloc(ctx, im->nann, K, out));
    int n = 0;
    for (int a = 0; a < im->nann; a++) {
        const cJSON *ann = im->anns[a];
        double aid = num(ann, "id", -1);
        if (num(ann, "iscrowd", 0) != 0) { pre->crowd++; continue; }
        if (K > 0 && num(ann, "num_keypoints", 1) == 0) { pre->no_keypoints++; continue; }
        const cJSON *bb = cJSON_GetObjectItemCaseSensitive(ann, "bbox");
        if (!cJSON_IsArray(bb) || cJSON_GetArraySize(bb) != 4) {
            lucid_labels_free(out);
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: annotation %.0f (image %s): bbox is not "
                                "[x, y, w, h]", json_path, aid, im->file);
        }
        double b[4];
        for (int c = 0; c < 4; c++) b[c] = cJSON_GetArrayItem(bb, c)->valuedouble;
        if (b[2] <= 0 || b[3] <= 0) continue;
        int cls = -1, ci = 0;
        double cat = num(ann, "category_id", -1);
        for (const cJSON *c = cats ? cats->child : NULL; c; c = c->next, ci++)
            if (num(c, "id", -2) == cat) { cls = ci; break; }
        if (cls < 0 || cls >= spec->nc) {
            lucid_labels_free(out);
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: annotation %.0f (image %s): category_id "
                                "%.0f is not one of the %d classes",
                                json_path, aid, im->file, cat, spec->nc);
        }
        float *box = out->box + n * 4;
        box[0] = (float)((b[0] + b[2] / 2) / im->w);
        box[1] = (float)((b[1] + b[3] / 2) / im->h);
        box[2] = (float)(b[2] / im->w);
        box[3] = (float)(b[3] / im->h);
        out->cls[n] = (float)cls;
        const char *bad = NULL;
        for (int c = 0; c < 4; c++)
            if (!(box[c] >= 0 && box[c] <= 1)) bad = "box outside the image";
        if (K > 0) {
            const cJSON *kp = cJSON_GetObjectItemCaseSensitive(ann, "keypoints");
            if (!cJSON_IsArray(kp) || cJSON_GetArraySize(kp) != K * 3) {
                lucid_labels_free(out);
                return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                    "%s: annotation %.0f (image %s): %d "
                                    "keypoint values, expected %d",
                                    json_path, aid, im->file,
                                    cJSON_IsArray(kp) ? cJSON_GetArraySize(kp) : 0,
                                    K * 3);
            }
            const cJSON *e = kp->child;
            for (int k = 0; k < K; k++) {
                double x = e->valuedouble; e = e->next;
                double y = e->valuedouble; e = e->next;
                double v = e->valuedouble; e = e->next;
                float *o = out->kpts + ((size_t)n * K + k) * 3;
                o[0] = (float)(x / im->w);
                o[1] = (float)(y / im->h);
                o[2] = (float)v;
                if (v != 0 && v != 1 && v != 2) bad = "visibility not in {0,1,2}";
                if (!(o[0] >= 0 && o[0] <= 1 && o[1] >= 0 && o[1] <= 1))
                    bad = "keypoint outside the image";
                if (spec->ndim == 2) o[2] = 1;
            }
        }
        if (bad) {
            lucid_labels_free(out);
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: annotation %.0f (image %s): %s",
                                json_path, aid, im->file, bad);
        }
        n++;
    }
    if (n == 0) lucid_labels_free(out);
    else out->n = n;
    return LUCID_OK;
}

lucid_status lucid_dataset_open_coco(lucid_ctx *ctx, const char *json_path,
                                     const char *images_dir,
                                     const lucid_dataset_options *opt,
                                     lucid_dataset **out) {
    *out = NULL;
    lucid_dataset_options def = lucid_dataset_options_default();
    if (!opt) opt = &def;
    lucid_status st = LUCID_OK;
    size_t len = 0;
    char *text = read_all(ctx, json_path, &len, &st);
    if (!text) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        int line = 1;
        if (ep && ep >= text && ep <= text + len)
            for (const char *p = text; p < ep; p++) line += *p == '\n';
        free(text);
        return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s:%d: JSON syntax error",
                            json_path, line);
    }
    free(text);
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(root, "images");
    const cJSON *anns = cJSON_GetObjectItemCaseSensitive(root, "annotations");
    const cJSON *cats = cJSON_GetObjectItemCaseSensitive(root, "categories");
    if (!cJSON_IsArray(images) || !cJSON_IsArray(anns)) {
        cJSON_Delete(root);
        return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                            "%s: not a COCO file (no images/annotations "
                            "arrays)", json_path);
    }
    int ni = cJSON_GetArraySize(images);
    coco_img *im = calloc(ni > 0 ? ni : 1, sizeof *im);
    lucid_scan_item *items = calloc(ni > 0 ? ni : 1, sizeof *items);
    if (!im || !items) {
        free(im);
        free(items);
        cJSON_Delete(root);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", json_path);
    }
    int k = 0;
    for (const cJSON *e = images->child; e; e = e->next, k++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "file_name");
        im[k].id = num(e, "id", -1);
        im[k].file = cJSON_IsString(fn) ? fn->valuestring : NULL;
        im[k].w = num(e, "width", 0);
        im[k].h = num(e, "height", 0);
        if (!im[k].file || im[k].w <= 0 || im[k].h <= 0) {
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                              "%s: images[%d] lacks file_name/width/height",
                              json_path, k);
            goto fail;
        }
    }
    qsort(im, ni, sizeof *im, cmp_img);
    /* group annotations by image id (linear search over a sorted copy of ids
     * would be faster; datasets here are small enough for a scan per
     * annotation through a binary search on ids) */
    double *ids = malloc(sizeof(double) * (ni > 0 ? ni : 1));
    int *ord = malloc(sizeof(int) * (ni > 0 ? ni : 1));
    if (!ids || !ord) {
        free(ids);
        free(ord);
        st = lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", json_path);
        goto fail;
    }
    for (int i = 0; i < ni; i++) { ord[i] = i; ids[i] = im[i].id; }
    /* insertion sort of ord by id (ni is the image count of one split) */
    for (int i = 1; i < ni; i++) {
        int t = ord[i], j = i - 1;
        while (j >= 0 && ids[ord[j]] > ids[t]) { ord[j + 1] = ord[j]; j--; }
        ord[j + 1] = t;
    }
    for (const cJSON *a = anns->child; a; a = a->next) {
        double iid = num(a, "image_id", -1);
        int lo = 0, hi = ni - 1, found = -1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            double v = ids[ord[mid]];
            if (v == iid) { found = ord[mid]; break; }
            if (v < iid) lo = mid + 1;
            else hi = mid - 1;
        }
        if (found < 0) continue; /* annotation of an image not listed */
        coco_img *c = &im[found];
        if (c->nann == c->cap) {
            int nc = c->cap ? c->cap * 2 : 8;
            const cJSON **na = realloc(c->anns, sizeof(*na) * nc);
            if (!na) {
                free(ids);
                free(ord);
                st = lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory");
                goto fail;
            }
            c->anns = na;
            c->cap = nc;
        }
        c->anns[c->nann++] = a;
    }
    free(ids);
    free(ord);
    lucid_dataset_stats pre;
    memset(&pre, 0, sizeof pre);
    size_t dl = strlen(images_dir);
    for (int i = 0; i < ni; i++) {
        size_t l = dl + strlen(im[i].file) + 2;
        items[i].image_path = malloc(l);
        if (!items[i].image_path) {
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory");
            goto fail;
        }
        snprintf(items[i].image_path, l, "%s/%s", images_dir, im[i].file);
        items[i].has_inline_labels = 1;
        st = convert_image(ctx, json_path, &im[i], cats, &opt->spec,
                           &items[i].labels, &pre);
        if (st == LUCID_ERR_FORMAT) { /* a bad record rejects its image */
            items[i].reject = LUCID_REJECT_LABEL_RANGE;
            items[i].reject_msg = strdup(lucid_ctx_error(ctx));
            lucid_ctx_clear_error(ctx);
            st = LUCID_OK;
        }
        if (st != LUCID_OK) goto fail;
    }
    for (int i = 0; i < ni; i++) free(im[i].anns);
    free(im);
    cJSON_Delete(root);
    return lucid_dataset_build(ctx, json_path, items, ni, opt, &pre, out);
fail:
    for (int i = 0; i < ni; i++) {
        free(im[i].anns);
        free(items[i].image_path);
        lucid_labels_free(&items[i].labels);
    }
    free(im);
    free(items);
    cJSON_Delete(root);
    return st;
}
