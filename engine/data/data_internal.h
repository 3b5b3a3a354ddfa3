/*
 * data_internal.h — private structures shared by the files of engine/data/.
 * Not part of the public API.
 */
#ifndef LUCID_DATA_INTERNAL_H
#define LUCID_DATA_INTERNAL_H

#include "data.h"
#include "internal.h"

#include <stddef.h>

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

/* Pixel flips (bits): output (y, x) shows (H-1-y if UD, W-1-x if LR). */
enum { LUCID_FLIP_LR = 1, LUCID_FLIP_UD = 2 };

/* HWC image -> planar CHW (3 planes of w*h), applying the pixel flips
 * `flips` (LUCID_FLIP_*) and RandomHSV with the gains (rh, rs, rv) when
 * hsv != 0 on the way (same bytes as lucid_aug_flipud/fliplr and
 * lucid_aug_hsv_apply followed by the transpose: HSV is per pixel and the
 * flips permute pixels, so they commute; one pass instead of three). */
void lucid_hwc_to_chw(const lucid_image *img, uint8_t *chw, int hsv,
                      double rh, double rs, double rv, int flips);

/* The pixel half of lucid_aug_flipud / lucid_aug_fliplr (LUCID_FLIP_*). */
void lucid_image_flip(lucid_image *img, int flips);

/* A canvas given as up to 4 disjoint rectangles of images on a background
 * of 114 that extends without bound (outside the canvas too, as the warp's
 * border): the mosaic canvas without writing it out. */
typedef struct lucid_tile {
    int x0, y0, x1, y1;      /* canvas rectangle [x0, x1) x [y0, y1) */
    const uint8_t *data;     /* HWC pixel shown at canvas (x0, y0) */
    size_t stride;           /* bytes from one image row to the next */
} lucid_tile;

typedef struct lucid_tiles {
    int w, h;                /* canvas size (only for materialising) */
    int n;                   /* tiles in t[] */
    lucid_tile t[4];
} lucid_tiles;

/* lucid_aug_mosaic4 without pixels: the same instances, and the canvas as
 * tiles (pointing into imgs, which must outlive *tiles). */
lucid_status lucid_aug_mosaic4_tiles(lucid_ctx *ctx, const lucid_image *imgs[4],
                                     const lucid_labels *labels[4], int nkpt,
                                     int s, int xc, int yc, lucid_tiles *tiles,
                                     lucid_instances *out);
/* Write the canvas of tiles into img (tiles->w x tiles->h, allocated). */
void lucid_tiles_fill(const lucid_tiles *tiles, lucid_image *img);

/* Where lucid_aug_warp_tiles writes: channel c of output pixel (y, x) is
 * ch[c][y * stride + x * step] (HWC: ch = {d, d+1, d+2}, step 3, stride 3w;
 * CHW: ch = the 3 planes, step 1, stride w). */
typedef struct lucid_warp_out {
    int w, h;
    uint8_t *ch[3];
    ptrdiff_t step, stride;
    int flips;               /* LUCID_FLIP_*, applied to the warped image */
    int hsv;                 /* 1: RandomHSV with gains (rh, rs, rv) */
    double rh, rs, rv;
} lucid_warp_out;

/* 1 when M is affine without rotation or shear and positive scales (the
 * pose defaults): lucid_aug_warp_tiles handles exactly these. */
int lucid_aug_warp_is_axis_aligned(const double M[9]);
/* Warp the tiled canvas by an axis-aligned M (lucid_aug_warp_is_axis_aligned)
 * into out: the bytes of lucid_aug_warp on the materialised canvas, then
 * RandomHSV (out->hsv) and the flips (out->flips). */
lucid_status lucid_aug_warp_tiles(lucid_ctx *ctx, const lucid_tiles *tiles,
                                  const double M[9], const lucid_warp_out *out);
/* The output descriptors of an s x s HWC image / of CHW planes. */
lucid_warp_out lucid_warp_out_hwc(lucid_image *img);
lucid_warp_out lucid_warp_out_chw(uint8_t *chw, int w, int h);

/* lucid_augment_sample, optionally writing planar CHW: with chw != NULL
 * the pixels (HSV applied when p->hsv_on_cpu, flips applied) go to chw
 * (3 planes of s*s) and out is only scratch (still s x s). */
lucid_status lucid_augment_sample_ex(lucid_ctx *ctx, const lucid_dataset *ds,
                                     const lucid_aug_params *p, int s,
                                     uint64_t seed, uint64_t epoch,
                                     int64_t index, lucid_aug_work *work,
                                     lucid_image *out, lucid_instances *inst,
                                     float hsv[3], uint8_t *chw);

#endif
