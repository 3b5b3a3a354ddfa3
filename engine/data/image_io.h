/*
 * image_io.h — writing and drawing on images (lucid_image, RGB HWC u8), and
 * the letterbox geometry that maps network-input pixels back to the
 * original image: what prediction and the validation outputs need.
 *
 *   encode.c   PNG writing (libpng), atomic (temporary file + rename);
 *              letterbox geometry and the validation letterbox of one image
 *   draw.c     filled circles, thick lines, rectangles, a 5x7 bitmap font,
 *              COCO pose skeletons with the Ultralytics pose palette
 *
 * Contract
 *   - Pixel i covers [i, i+1) (data.h); a float coordinate x lands in pixel
 *     floor(x). Drawing clips to the image; nothing here reads outside it.
 *   - Every fallible function returns lucid_status with the message in the
 *     context; messages name the path. Drawing cannot fail.
 */
#ifndef LUCID_DATA_IMAGE_IO_H
#define LUCID_DATA_IMAGE_IO_H

#include "data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ PNG */

/* Encode img as an 8-bit RGB, non-interlaced PNG in memory (*buf is
 * malloc'd, free it with free()). ERR_ARG on an empty image, ERR_OOM. */
lucid_status lucid_image_encode_png(lucid_ctx *ctx, const lucid_image *img,
                                    uint8_t **buf, size_t *len);
/* Encode and write atomically (engine/io lucid_atomic_write: temporary file
 * in the target's folder, fsync, rename): a failed write leaves an existing
 * file untouched. ERR_IO naming the path (missing folder, no permission). */
lucid_status lucid_image_write_png(lucid_ctx *ctx, const char *path,
                                   const lucid_image *img);

/* ------------------------------------------------------------ letterbox */

/* Where an original w x h image lands in the s x s network input of the
 * validation path (BaseDataset.load_image: long side resized to s with
 * w, h ceil'd and capped, then LetterBox(s, s) centred, pad 114):
 *   x_net = x_orig * rx + pad_x,   y_net = y_orig * ry + pad_y.
 * rx = uw / w and ry = uh / h where uw x uh is the unpadded image inside the
 * input (they differ from one another by the ceil only). */
typedef struct lucid_letterbox_geom {
    int src_w, src_h;  /* original image */
    int size;          /* s */
    int pw, ph;        /* prepared (long side = s) size */
    int uw, uh;        /* unpadded image inside the s x s input */
    int pad_x, pad_y;  /* left, top padding in pixels */
    double rx, ry;     /* scale per axis */
} lucid_letterbox_geom;

void lucid_letterbox_geometry(int w, int h, int size, lucid_letterbox_geom *g);
/* Network-input pixels -> original pixels, clamped to [0, w] x [0, h]. */
void lucid_letterbox_unmap(const lucid_letterbox_geom *g, float *x, float *y);

/* The validation preprocessing of one image: prepared resize
 * (lucid_image_resize, INTER_LINEAR) then lucid_aug_letterbox into dst,
 * which is allocated here (size x size). g (may be NULL) receives the
 * geometry. Byte-identical to the loader's validation images. */
lucid_status lucid_image_letterbox_val(lucid_ctx *ctx, const lucid_image *src,
                                       int size, lucid_image *dst,
                                       lucid_letterbox_geom *g);

/* Original (decoded, EXIF-oriented) size of dataset image i, as seen at
 * scan time. ERR_ARG when i is out of range. */
lucid_status lucid_dataset_orig_size(lucid_ctx *ctx, const lucid_dataset *ds,
                                     int64_t i, int *w, int *h);

/* ------------------------------------------------------------------ draw */

typedef struct lucid_rgb {
    uint8_t r, g, b;
} lucid_rgb;

/* Filled disc: every pixel (x, y) with (x-cx)^2 + (y-cy)^2 <= r^2
 * (integer centre; r = 0 sets one pixel). */
void lucid_draw_circle(lucid_image *img, int cx, int cy, int r, lucid_rgb c);
/* Line from (x0, y0) to (x1, y1), Bresenham; each point stamped with a disc
 * of radius r (r = 0: the 1-pixel Bresenham line, both ends included). */
void lucid_draw_line(lucid_image *img, int x0, int y0, int x1, int y1, int r,
                     lucid_rgb c);
/* Rectangle outline of thickness t >= 1 inside the corners (x1, y1) and
 * (x2, y2), both included; filled when t <= 0. */
void lucid_draw_rect(lucid_image *img, int x1, int y1, int x2, int y2, int t,
                     lucid_rgb c);
/* Text in the built-in 5x7 font (digits, '.', '%', '-', ':', space, a-z and
 * A-Z folded to lower case; other characters draw as a hollow box), each
 * font pixel a scale x scale block, glyphs 6 * scale apart. (x, y) is the
 * top-left corner. Returns the width in pixels. */
int lucid_draw_text(lucid_image *img, int x, int y, const char *s, int scale,
                    lucid_rgb c);
/* Width and height in pixels that lucid_draw_text would cover. */
void lucid_text_size(const char *s, int scale, int *w, int *h);

/* The 19 limbs of the COCO keypoint skeleton, 0-based keypoint indices. */
extern const int lucid_coco_skeleton[19][2];
/* Ultralytics' pose palette (as RGB) and the palette entry of each limb and
 * keypoint: face green, arms blue, legs orange as Ultralytics draws them. */
extern const lucid_rgb lucid_pose_palette[20];
extern const uint8_t lucid_limb_color_idx[19];
extern const uint8_t lucid_kpt_color_idx[17];
/* Colour of class c for boxes (Ultralytics' 20-colour palette). */
lucid_rgb lucid_class_color(int c);

typedef struct lucid_pose_draw_opts {
    float kpt_threshold; /* keypoints / limbs drawn when v > this (0.5) */
    int boxes;           /* draw the box (1) */
    int labels;          /* draw "<label> <conf>" above the box (1) */
    int line_width;      /* 0: Ultralytics' max(round((w+h)/2*0.003), 2) */
    int radius;          /* keypoint radius, 0: line_width + 1 */
} lucid_pose_draw_opts;
lucid_pose_draw_opts lucid_pose_draw_opts_default(void);

/* One detection: box xyxy (may be NULL), class cls (colour), conf, label
 * (may be NULL: no text), keypoints K x (x, y, v) (may be NULL). Limbs use
 * lucid_coco_skeleton when K == 17; keypoints at (0, 0) or outside the
 * image are skipped as Ultralytics does. */
void lucid_draw_pose(lucid_image *img, const float *box, int cls, float conf,
                     const char *label, const float *kpts, int K,
                     const lucid_pose_draw_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_DATA_IMAGE_IO_H */
