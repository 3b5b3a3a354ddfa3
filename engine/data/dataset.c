/*
 * dataset.c — building a validated dataset from candidate images and the
 * Ultralytics YOLO-pose folder reader.
 *
 * Contract
 *   - Every image is decoded at scan time (truncated/corrupt files are found
 *     before training) and every label file parsed and validated
 *     (labels.c). Rejects are counted by reason; each reject keeps its
 *     message ("<file>[:<line>]: <what>") for the report.
 *   - Policy: SKIP drops the image and goes on; FAIL returns the first reject
 *     (in file order) as the error. In both cases the open fails when the
 *     split ends up empty or rejected/total > max_reject_fraction, with the
 *     counts by reason in the message.
 *   - Scanning may use several threads; results are gathered in file order,
 *     so the dataset is the same whatever the thread count.
 *   - Images without a label file, or with an empty one, are kept as
 *     background images (verify_image_label), and counted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static const int coco_flip_idx[17] = {0,  2,  1,  4,  3,  6,  5,  8, 7,
                                      10, 9,  12, 11, 14, 13, 16, 15};

lucid_dataset_options lucid_dataset_options_default(void) {
    lucid_dataset_options o;
    memset(&o, 0, sizeof o);
    o.spec.nkpt = 17;
    o.spec.ndim = 3;
    o.spec.has_flip_idx = 1;
    memcpy(o.spec.flip_idx, coco_flip_idx, sizeof coco_flip_idx);
    o.spec.nc = 1;
    o.imgsz = 640;
    o.cache = 1;
    o.policy = LUCID_POLICY_SKIP;
    o.max_reject_fraction = 0.1;
    o.exif_labels = LUCID_EXIF_LABELS_DISPLAY;
    o.threads = 1;
    return o;
}

/* ------------------------------------------------------------- scanning */

typedef struct scan_result {
    lucid_reject reason;
    char *msg;               /* owned, for rejects */
    lucid_image img;         /* prepared (kept only with the cache) */
    lucid_labels labels;
    int orient, ow, oh, missing_labels;
} scan_result;

typedef struct scan_job {
    lucid_scan_item *items;
    scan_result *res;
    int64_t n;
    const lucid_dataset_options *opt;
    int64_t next;            /* atomic cursor */
} scan_job;

static void scan_one(lucid_ctx *ectx, const lucid_dataset_options *opt,
                     lucid_scan_item *it, scan_result *r) {
    memset(r, 0, sizeof *r);
    r->orient = 1;
    if (it->reject != LUCID_REJECT_NONE) {
        r->reason = it->reject;
        r->msg = it->reject_msg;
        it->reject_msg = NULL;
        return;
    }
    struct stat sb;
    if (stat(it->image_path, &sb) != 0) {
        r->reason = LUCID_REJECT_IMAGE_MISSING;
        r->msg = NULL;
        lucid_seterr(ectx, LUCID_ERR_IO, "%s: cannot open image: %s",
                     it->image_path, strerror(errno));
        r->msg = strdup(lucid_ctx_error(ectx));
        return;
    }
    if (sb.st_size == 0) {
        r->reason = LUCID_REJECT_IMAGE_EMPTY;
        lucid_seterr(ectx, LUCID_ERR_IO, "%s: empty file (0 bytes)",
                     it->image_path);
        r->msg = strdup(lucid_ctx_error(ectx));
        return;
    }
    lucid_status st = lucid_prepare_image(ectx, it->image_path, opt->imgsz,
                                          &r->img, &r->orient, &r->ow, &r->oh);
    if (st != LUCID_OK) {
        r->reason = st == LUCID_ERR_IO ? LUCID_REJECT_IMAGE_MISSING
                                       : LUCID_REJECT_IMAGE_CORRUPT;
        r->msg = strdup(lucid_ctx_error(ectx));
        return;
    }
    if (r->ow < 10 || r->oh < 10) {
        r->reason = LUCID_REJECT_IMAGE_SMALL;
        lucid_seterr(ectx, LUCID_ERR_FORMAT,
                     "%s: image size %dx%d < 10 pixels", it->image_path, r->ow,
                     r->oh);
        r->msg = strdup(lucid_ctx_error(ectx));
        lucid_image_free(&r->img);
        return;
    }
    if (it->has_inline_labels) {
        r->labels = it->labels;
        memset(&it->labels, 0, sizeof it->labels);
    } else {
        int line;
        st = lucid_labels_read(ectx, it->label_path, &opt->spec, &r->labels,
                               &r->reason, &line, &r->missing_labels);
        if (st != LUCID_OK) {
            if (r->reason == LUCID_REJECT_NONE)
                r->reason = LUCID_REJECT_LABEL_IO;
            r->msg = strdup(lucid_ctx_error(ectx));
            lucid_image_free(&r->img);
            return;
        }
    }
    if (opt->exif_labels == LUCID_EXIF_LABELS_STORED && r->orient != 1)
        lucid_labels_orient(&r->labels, opt->spec.nkpt, r->orient);
    if (!opt->cache) lucid_image_free(&r->img);
}

static void *scan_worker(void *arg) {
    scan_job *job = arg;
    lucid_ctx *ectx = NULL;
    lucid_ctx_create(NULL, &ectx, NULL, 0); /* error sink of this thread */
    for (;;) {
        int64_t i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->n) break;
        scan_one(ectx, job->opt, &job->items[i], &job->res[i]);
    }
    if (ectx) lucid_ctx_release(ectx);
    return NULL;
}

static void free_items(lucid_scan_item *items, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        free(items[i].image_path);
        free(items[i].label_path);
        free(items[i].reject_msg);
        lucid_labels_free(&items[i].labels);
    }
    free(items);
}

static int reject_counts_str(const lucid_dataset_stats *s, char *buf,
                             size_t len) {
    int w = 0;
    buf[0] = 0;
    for (int r = 1; r < LUCID_REJECT_COUNT; r++) {
        if (!s->reject_count[r]) continue;
        w += snprintf(buf + w, w < (int)len ? len - w : 0, "%s%s %lld",
                      w ? ", " : "", lucid_reject_name((lucid_reject)r),
                      (long long)s->reject_count[r]);
    }
    return w;
}

lucid_status lucid_dataset_build(lucid_ctx *ctx, const char *what,
                                 lucid_scan_item *items, int64_t n,
                                 const lucid_dataset_options *opt,
                                 const lucid_dataset_stats *pre,
                                 lucid_dataset **out) {
    *out = NULL;
    if (opt->spec.has_flip_idx && opt->spec.nkpt > 0 &&
        lucid_flip_idx_check(ctx, opt->spec.flip_idx, opt->spec.nkpt,
                             opt->spec.nkpt) != LUCID_OK) {
        free_items(items, n);
        return LUCID_ERR_ARG;
    }
    if (opt->imgsz < 32) {
        free_items(items, n);
        return lucid_seterr(ctx, LUCID_ERR_ARG, "imgsz %d < 32", opt->imgsz);
    }
    scan_result *res = calloc(n > 0 ? n : 1, sizeof *res);
    lucid_dataset *ds = calloc(1, sizeof *ds);
    if (!res || !ds) {
        free(res);
        free(ds);
        free_items(items, n);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", what);
    }
    scan_job job = {items, res, n, opt, 0};
    int T = opt->threads > 0 ? opt->threads : 1;
    if (T > 64) T = 64;
    if (T > n) T = n > 0 ? (int)n : 1;
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < T; t++)
        if (pthread_create(&th[t], NULL, scan_worker, &job) == 0) started++;
        else break;
    scan_worker(&job);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);

    ds->refcount = 1;
    ds->opt = *opt;
    if (pre) ds->stats = *pre;
    lucid_dataset_stats *s = &ds->stats;
    s->total = n;
    int64_t kept = 0;
    const char *first_msg = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (res[i].reason != LUCID_REJECT_NONE) {
            s->rejected++;
            s->reject_count[res[i].reason]++;
            if (!first_msg) first_msg = res[i].msg;
        } else {
            kept++;
        }
    }
    char counts[512];
    reject_counts_str(s, counts, sizeof counts);
    lucid_status st = LUCID_OK;
    if (opt->policy == LUCID_POLICY_FAIL && s->rejected > 0) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: %s (policy fail; %lld "
                          "rejected: %s)", what, first_msg ? first_msg : "?",
                          (long long)s->rejected, counts);
    } else if (kept == 0) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                          "%s: no usable image (%lld found, %lld rejected%s%s)"
                          "%s%s",
                          what, (long long)n, (long long)s->rejected,
                          s->rejected ? ": " : "", counts,
                          first_msg ? "; first: " : "",
                          first_msg ? first_msg : "");
    } else if ((double)s->rejected > opt->max_reject_fraction * (double)n) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                          "%s: %lld of %lld images rejected (%.1f%% > "
                          "max_reject_fraction %.1f%%): %s; first: %s",
                          what, (long long)s->rejected, (long long)n,
                          100.0 * s->rejected / n,
                          100.0 * opt->max_reject_fraction, counts,
                          first_msg ? first_msg : "?");
    }
    if (st == LUCID_OK) {
        ds->paths = calloc(kept, sizeof(char *));
        ds->labels = calloc(kept, sizeof(lucid_labels));
        ds->orient = calloc(kept, sizeof(int));
        ds->orig_wh = calloc(kept * 2, sizeof(int32_t));
        ds->reject_msgs = calloc(s->rejected + 1, sizeof(char *));
        if (opt->cache) ds->cache = calloc(kept, sizeof(lucid_image));
        if (!ds->paths || !ds->labels || !ds->orient || !ds->orig_wh ||
            !ds->reject_msgs || (opt->cache && !ds->cache))
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", what);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        scan_result *r = &res[i];
        if (st == LUCID_OK && r->reason != LUCID_REJECT_NONE) {
            ds->reject_msgs[ds->nreject_msgs++] = r->msg;
            r->msg = NULL;
        } else if (st == LUCID_OK) {
            ds->paths[k] = items[i].image_path;
            items[i].image_path = NULL;
            ds->labels[k] = r->labels;
            memset(&r->labels, 0, sizeof r->labels);
            ds->orient[k] = r->orient;
            ds->orig_wh[2 * k] = r->ow;
            ds->orig_wh[2 * k + 1] = r->oh;
            if (ds->cache) {
                ds->cache[k] = r->img;
                s->cache_bytes += (uint64_t)r->img.w * r->img.h * 3;
                memset(&r->img, 0, sizeof r->img);
            }
            s->instances += ds->labels[k].n;
            s->duplicates += ds->labels[k].ndup;
            if (ds->labels[k].n > s->max_instances)
                s->max_instances = ds->labels[k].n;
            if (r->missing_labels) s->missing_labels++;
            else if (ds->labels[k].n == 0 && !items[i].has_inline_labels)
                s->empty_labels++;
            k++;
        }
        free(r->msg);
        lucid_image_free(&r->img);
        lucid_labels_free(&r->labels);
    }
    free(res);
    free_items(items, n);
    ds->n = k;
    s->kept = k;
    if (st != LUCID_OK) {
        lucid_dataset_release(ds);
        return st;
    }
    *out = ds;
    return LUCID_OK;
}

/* ------------------------------------------------------------ YOLO folder */

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    return !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
           !strcasecmp(dot, ".png");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* img2label_paths: the last "/images/" -> "/labels/", extension -> ".txt". */
static char *label_path_for(const char *img) {
    size_t n = strlen(img);
    char *s = malloc(n + 16);
    if (!s) return NULL;
    const char *last = NULL;
    for (const char *p = img; (p = strstr(p, "/images/")); p++) last = p;
    if (last) {
        size_t pre = (size_t)(last - img);
        memcpy(s, img, pre);
        memcpy(s + pre, "/labels/", 8);
        strcpy(s + pre + 8, last + 8);
    } else {
        strcpy(s, img);
    }
    char *dot = strrchr(s, '.');
    char *slash = strrchr(s, '/');
    if (dot && (!slash || dot > slash)) strcpy(dot, ".txt");
    else strcat(s, ".txt");
    return s;
}

lucid_status lucid_dataset_open_yolo(lucid_ctx *ctx, const char *images_dir,
                                     const lucid_dataset_options *opt,
                                     lucid_dataset **out) {
    *out = NULL;
    lucid_dataset_options def = lucid_dataset_options_default();
    if (!opt) opt = &def;
    DIR *d = opendir(images_dir);
    if (!d)
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open image folder: %s",
                            images_dir, strerror(errno));
    size_t cap = 256, n = 0;
    char **names = malloc(cap * sizeof(char *));
    struct dirent *e;
    int oom = !names;
    while (!oom && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !has_image_ext(e->d_name)) continue;
        if (n == cap) {
            char **nn = realloc(names, cap * 2 * sizeof(char *));
            if (!nn) { oom = 1; break; }
            names = nn;
            cap *= 2;
        }
        names[n] = strdup(e->d_name);
        if (!names[n]) { oom = 1; break; }
        n++;
    }
    closedir(d);
    lucid_scan_item *items = oom ? NULL : calloc(n ? n : 1, sizeof *items);
    if (!items) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory listing",
                            images_dir);
    }
    qsort(names, n, sizeof(char *), cmp_str);
    size_t dl = strlen(images_dir);
    while (dl > 1 && images_dir[dl - 1] == '/') dl--;
    for (size_t i = 0; i < n; i++) {
        size_t len = dl + strlen(names[i]) + 2;
        items[i].image_path = malloc(len);
        if (items[i].image_path) {
            snprintf(items[i].image_path, len, "%.*s/%s", (int)dl, images_dir,
                     names[i]);
            items[i].label_path = label_path_for(items[i].image_path);
        }
        free(names[i]);
        if (!items[i].image_path || !items[i].label_path) oom = 1;
    }
    free(names);
    if (oom) {
        free_items(items, (int64_t)n);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", images_dir);
    }
    return lucid_dataset_build(ctx, images_dir, items, (int64_t)n, opt, NULL,
                               out);
}

/* ------------------------------------------------------------- accessors */

void lucid_dataset_retain(lucid_dataset *ds) {
    if (ds) __atomic_add_fetch(&ds->refcount, 1, __ATOMIC_ACQ_REL);
}

void lucid_dataset_release(lucid_dataset *ds) {
    if (!ds || __atomic_sub_fetch(&ds->refcount, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    for (int64_t i = 0; i < ds->n; i++) {
        if (ds->paths) free(ds->paths[i]);
        if (ds->labels) lucid_labels_free(&ds->labels[i]);
        if (ds->cache) lucid_image_free(&ds->cache[i]);
    }
    for (int64_t i = 0; i < ds->nreject_msgs; i++) free(ds->reject_msgs[i]);
    free(ds->reject_msgs);
    free(ds->paths);
    free(ds->labels);
    free(ds->orient);
    free(ds->orig_wh);
    free(ds->cache);
    free(ds);
}

int64_t lucid_dataset_size(const lucid_dataset *ds) { return ds->n; }

const lucid_dataset_options *lucid_dataset_opts(const lucid_dataset *ds) {
    return &ds->opt;
}

void lucid_dataset_get_stats(const lucid_dataset *ds,
                             lucid_dataset_stats *out) {
    *out = ds->stats;
}

int64_t lucid_dataset_num_rejects(const lucid_dataset *ds) {
    return ds->nreject_msgs;
}

const char *lucid_dataset_reject_message(const lucid_dataset *ds, int64_t k) {
    return k >= 0 && k < ds->nreject_msgs ? ds->reject_msgs[k] : NULL;
}

const char *lucid_dataset_image_path(const lucid_dataset *ds, int64_t i) {
    return i >= 0 && i < ds->n ? ds->paths[i] : NULL;
}

const lucid_labels *lucid_dataset_labels(const lucid_dataset *ds, int64_t i) {
    return i >= 0 && i < ds->n ? &ds->labels[i] : NULL;
}

int lucid_dataset_summary(const lucid_dataset *ds, char *buf, size_t len) {
    const lucid_dataset_stats *s = &ds->stats;
    char counts[512];
    reject_counts_str(s, counts, sizeof counts);
    return snprintf(buf, len,
                    "%lld images (%lld found), %lld instances, %lld rejected%s%s%s, "
                    "%lld background (%lld without label file), %lld duplicate "
                    "rows removed, cache %.1f MB",
                    (long long)s->kept, (long long)s->total,
                    (long long)s->instances, (long long)s->rejected,
                    s->rejected ? " (" : "", counts, s->rejected ? ")" : "",
                    (long long)(s->missing_labels + s->empty_labels),
                    (long long)s->missing_labels, (long long)s->duplicates,
                    s->cache_bytes / 1e6);
}
