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

/* The label half of lucid_aug_fliplr / lucid_aug_flipud (canvas width W /
 * height H in pixels). */
void lucid_instances_fliplr(lucid_instances *in, int W, const int *flip_idx);
void lucid_instances_flipud(lucid_instances *in, int H);

/* Pixel flips left to lucid_hwc_to_chw (bits of *flips). */
enum { LUCID_FLIP_LR = 1, LUCID_FLIP_UD = 2 };

/* HWC image -> planar CHW (3 planes of w*h), applying the pixel flips
 * `flips` (LUCID_FLIP_*: output (y, x) reads (H-1-y if UD, W-1-x if LR))
 * and RandomHSV with the gains (rh, rs, rv) when hsv != 0 on the way (same
 * bytes as lucid_aug_flipud/fliplr and lucid_aug_hsv_apply followed by the
 * transpose: HSV is per pixel and the flips permute pixels, so they
 * commute; one pass instead of three). */
void lucid_hwc_to_chw(const lucid_image *img, uint8_t *chw, int hsv,
                      double rh, double rs, double rv, int flips);

/* What lucid_augment_sample_ex may leave to lucid_hwc_to_chw (defer). */
enum { LUCID_DEFER_HSV = 1, LUCID_DEFER_FLIPS = 2 };

/* lucid_augment_sample with stages deferred: LUCID_DEFER_HSV draws the
 * gains and returns them in hsv[] / hsv_d[] but does not apply them,
 * whatever p->hsv_on_cpu says; LUCID_DEFER_FLIPS flips the instances but
 * not the pixels and returns the pixel flips to apply in *flips
 * (LUCID_FLIP_*; may be NULL without the flag). The loader applies both in
 * lucid_hwc_to_chw. */
lucid_status lucid_augment_sample_ex(lucid_ctx *ctx, const lucid_dataset *ds,
                                     const lucid_aug_params *p, int s,
                                     uint64_t seed, uint64_t epoch,
                                     int64_t index, lucid_aug_work *work,
                                     lucid_image *out, lucid_instances *inst,
                                     float hsv[3], double hsv_d[3],
                                     int defer, int *flips);

#endif
