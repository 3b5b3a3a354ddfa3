/*
 * data_internal.h — private structures shared by the files of engine/data/.
 * Not part of the public API.
 */
#ifndef LUCID_DATA_INTERNAL_H
#define LUCID_DATA_INTERNAL_H

#include "data.h"
#include "internal.h"

/* One candidate image of a split before validation. */
typedef struct lucid_scan_item {
    char *image_path;        /* owned */
    char *label_path;        /* owned; NULL when labels are given inline */
    lucid_labels labels;     /* inline labels (COCO) or parsed at scan */
    int has_inline_labels;
    lucid_reject reject;     /* rejected before the scan (COCO record) */
    char *reject_msg;        /* owned */
} lucid_scan_item;

struct lucid_dataset {
    int refcount;
    lucid_dataset_options opt;
    int64_t n;
    char **paths;            /* [n] image paths, owned */
    lucid_labels *labels;    /* [n] normalised, oriented */
    int *orient;             /* [n] EXIF orientation found at scan */
    int32_t *orig_wh;        /* [n, 2] decoded (oriented) size */
    lucid_image *cache;      /* [n] prepared images or NULL (no cache) */
    lucid_dataset_stats stats;
    char **reject_msgs;      /* [nreject_msgs] one message per reject */
    int64_t nreject_msgs;
};

/* Validate items (decode images, parse label files), apply the policy and
 * build the dataset. Takes ownership of items[0..n) in every case. */
lucid_status lucid_dataset_build(lucid_ctx *ctx, const char *what,
                                 lucid_scan_item *items, int64_t n,
                                 const lucid_dataset_options *opt,
                                 const lucid_dataset_stats *pre,
                                 lucid_dataset **out);

/* Prepared size of a (w, h) image for imgsz (BaseDataset.load_image):
 * r = imgsz / max(w, h); w' = min(ceil(w r), imgsz), h' likewise. */
void lucid_prepared_size(int w, int h, int imgsz, int *pw, int *ph);
/* Decode + resize to the prepared size (no cache). */
lucid_status lucid_prepare_image(lucid_ctx *ctx, const char *path, int imgsz,
                                 lucid_image *out, int *orient, int *ow,
                                 int *oh);

/* HWC image -> planar CHW (3 planes of w*h), applying RandomHSV with the
 * gains (rh, rs, rv) on the way when hsv != 0 (same bytes as
 * lucid_aug_hsv_apply followed by the transpose, one pass less). */
void lucid_hwc_to_chw(const lucid_image *img, uint8_t *chw, int hsv,
                      double rh, double rs, double rv);

/* lucid_augment_sample with the HSV stage deferred (defer_hsv = 1: the
 * gains are drawn and returned in hsv[] but not applied, whatever
 * p->hsv_on_cpu says) — the loader applies them in lucid_hwc_to_chw. */
lucid_status lucid_augment_sample_ex(lucid_ctx *ctx, const lucid_dataset *ds,
                                     const lucid_aug_params *p, int s,
                                     uint64_t seed, uint64_t epoch,
                                     int64_t index, lucid_aug_work *work,
                                     lucid_image *out, lucid_instances *inst,
                                     float hsv[3], double hsv_d[3],
                                     int defer_hsv);

#endif
