/*
 * data.h — the data pipeline of lucid (CPU side): decoding, label reading and
 * validation, dataset readers (Ultralytics YOLO-pose folders + data YAML, COCO
 * keypoint JSON), the prepared-image cache, augmentations and the loader.
 *
 * Contract
 *   - Images in memory are uint8 RGB, HWC, row-major: data[(y*w + x)*3 + c].
 *   - Label coordinates on disk and in lucid_labels are normalised to [0,1]
 *     by the (EXIF-oriented) image width and height: box = cx cy w h,
 *     keypoints = K x (x y v) (v in {0,1,2} for kpt_shape [K,3]; for [K,2]
 *     v is derived: 0 when x<0 or y<0, else 1 — as Ultralytics does).
 *   - Augmentation works in pixel units of the current canvas. A pixel with
 *     index i covers [i, i+1) in label space (its centre is i + 0.5); all
 *     pixel warps use this convention, so keypoints and pixels see the same
 *     matrix exactly (see augment.c for the one deliberate sub-pixel
 *     deviation from cv2.warpAffine).
 *   - Per-sample randomness derives only from (seed, epoch, sample index)
 *     through lucid_philox4x32, so batches are byte-identical whatever the
 *     number of worker threads.
 *   - Every fallible function returns lucid_status and leaves its message in
 *     the context (lucid_ctx_error); messages name the file and the line.
 *     Nothing here calls exit/abort or prints.
 *
 * Sources of the semantics: Ultralytics `data/augment.py` (Mosaic._mosaic4,
 * RandomPerspective.affine_transform/apply_bboxes/apply_keypoints,
 * RandomPerspective.box_candidates, RandomHSV, RandomFlip, LetterBox),
 * `data/utils.py` (verify_image_label, img2label_paths, exif_size),
 * `data/base.py` (BaseDataset.load_image), `utils/instance.py`
 * (Instances.clip, remove_zero_area_boxes), `data/converter.py`
 * (convert_coco). See shared/reference/yolo_pose_reference.md section 4.
 */
#ifndef LUCID_DATA_H
#define LUCID_DATA_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LUCID_MAX_KPT 64 /* keypoints per instance */

/* ------------------------------------------------------------------ images */

typedef struct lucid_image {
    int32_t w, h;   /* pixels */
    uint8_t *data;  /* [h, w, 3] RGB, owned (free with lucid_image_free) */
} lucid_image;

/* Decode a JPEG or PNG file (format from the magic bytes) into RGB.
 * Grayscale is replicated to 3 channels, CMYK/YCCK converted (Adobe inverted
 * CMYK handled), alpha dropped, palette expanded, 16-bit samples reduced by
 * their real range (sBIT when present, else the bit length of the largest
 * sample: v8 = round(v * 255 / (2^bits - 1)), never clipped), interlaced
 * PNG and progressive JPEG supported. The EXIF orientation (JPEG APP1, PNG
 * eXIf) is applied to the pixels; *orientation (may be NULL) receives the tag
 * (1..8, 1 when absent) so labels can be oriented with lucid_labels_orient.
 * Errors: ERR_IO (cannot open/read, empty file), ERR_FORMAT (unknown format,
 * truncated or corrupt data, bad CRC), each naming the path. */
lucid_status lucid_image_decode_file(lucid_ctx *ctx, const char *path,
                                     lucid_image *out, int *orientation);
/* As lucid_image_decode_file from memory; name is used in messages. */
lucid_status lucid_image_decode_memory(lucid_ctx *ctx, const uint8_t *buf,
                                       size_t len, const char *name,
                                       lucid_image *out, int *orientation);
/* Allocate an uninitialised w x h RGB image. ERR_OOM / ERR_ARG. */
lucid_status lucid_image_alloc(lucid_ctx *ctx, int32_t w, int32_t h,
                               lucid_image *out);
void lucid_image_free(lucid_image *img);
/* Apply an EXIF orientation (1..8) to pixels: returns a new image. */
lucid_status lucid_image_orient(lucid_ctx *ctx, const lucid_image *src,
                                int orientation, lucid_image *out);
/* Bilinear resize with half-pixel centres (cv2.INTER_LINEAR semantics, 11-bit
 * fixed-point weights). dst is allocated here. */
lucid_status lucid_image_resize(lucid_ctx *ctx, const lucid_image *src,
                                int32_t w, int32_t h, lucid_image *dst);
/* Parse the EXIF orientation from a TIFF/EXIF block ("Exif\0\0" optional
 * prefix). Returns 1..8, or 1 when absent or unreadable. */
int lucid_exif_orientation(const uint8_t *exif, size_t len);

/* ------------------------------------------------------------------ labels */

typedef struct lucid_pose_spec {
    int nkpt;                     /* K (kpt_shape[0]), 0 = boxes only */
    int ndim;                     /* D (kpt_shape[1]): 2 or 3 */
    int has_flip_idx;             /* 0: horizontal flip disabled */
    int flip_idx[LUCID_MAX_KPT];  /* permutation of 0..K-1, its own inverse */
    int nc;                       /* number of classes (class ids 0..nc-1) */
} lucid_pose_spec;

/* Why a file or row was rejected. */
typedef enum lucid_reject {
    LUCID_REJECT_NONE = 0,
    LUCID_REJECT_IMAGE_MISSING,   /* image cannot be opened */
    LUCID_REJECT_IMAGE_EMPTY,     /* zero-byte image file */
    LUCID_REJECT_IMAGE_CORRUPT,   /* decode failed: truncated, bad CRC, garbage */
    LUCID_REJECT_IMAGE_SMALL,     /* a side < 10 px (verify_image_label) */
    LUCID_REJECT_LABEL_IO,        /* label file exists but cannot be read */
    LUCID_REJECT_LABEL_COLUMNS,   /* row has != 5 + K*D columns */
    LUCID_REJECT_LABEL_NUMBER,    /* a token that is not a number */
    LUCID_REJECT_LABEL_NONFINITE, /* nan / inf */
    LUCID_REJECT_LABEL_RANGE,     /* a coordinate outside [0,1] */
    LUCID_REJECT_LABEL_CLASS,     /* class not an integer in [0,nc) */
    LUCID_REJECT_LABEL_VISIBILITY,/* v not in {0,1,2} */
    LUCID_REJECT_COUNT
} lucid_reject;

/* Stable short name of a reject reason ("image_corrupt", ...). */
const char *lucid_reject_name(lucid_reject r);

typedef struct lucid_labels {
    int n;          /* instances */
    float *cls;     /* [n] */
    float *box;     /* [n, 4] cx cy w h normalised */
    float *kpts;    /* [n, K, 3] x y v normalised (v as written) */
    int ndup;       /* duplicate rows removed (as verify_image_label) */
} lucid_labels;

/* Check flip_idx: length K, a permutation of 0..K-1 that is its own inverse.
 * ERR_ARG naming the first bad position. */
lucid_status lucid_flip_idx_check(lucid_ctx *ctx, const int *flip_idx, int n,
                                  int nkpt);

/* Parse YOLO-pose label text (rows "cls cx cy w h (x y [v])xK"; blank lines
 * ignored). name is used in messages ("<name>:<line>: ..."). On a bad row:
 * ERR_FORMAT, *reason and *line (1-based) set, out left empty. Duplicate rows
 * are removed and counted in out->ndup. */
lucid_status lucid_labels_parse(lucid_ctx *ctx, const char *name,
                                const char *text, size_t len,
                                const lucid_pose_spec *spec, lucid_labels *out,
                                lucid_reject *reason, int *line);
/* Read and parse a label file. A missing file gives LUCID_OK with n = 0 and
 * *missing = 1 (a background image, as the reference). */
lucid_status lucid_labels_read(lucid_ctx *ctx, const char *path,
                               const lucid_pose_spec *spec, lucid_labels *out,
                               lucid_reject *reason, int *line, int *missing);
lucid_status lucid_labels_alloc(lucid_ctx *ctx, int n, int nkpt,
                                lucid_labels *out);
void lucid_labels_free(lucid_labels *l);
/* Apply an EXIF orientation (1..8) to normalised labels in place (centres,
 * w/h swap for 5..8, keypoint x/y; v unchanged). */
void lucid_labels_orient(lucid_labels *l, int nkpt, int orientation);

/* -------------------------------------------------------------- data YAML */

/* The Ultralytics data YAML (`path`, `train`, `val`, `kpt_shape`,
 * `flip_idx`, `names`). Strings are owned; free with lucid_data_yaml_free.
 * path, train and val are as written in the file (NULL when absent); the
 * caller resolves them (lua/lucid/data.lua: as Ultralytics does). */
typedef struct lucid_data_yaml {
    char *dir;     /* the YAML's folder ("." for a bare file name) */
    char *path;    /* dataset root as written (NULL: absent) */
    char *train;   /* image folder as written (may be NULL) */
    char *val;
    int kpt_shape[2];
    int has_flip_idx;
    int flip_idx[LUCID_MAX_KPT];
    int nflip;
    int nc;
    char **names;  /* [nc] */
} lucid_data_yaml;

/* Read a data YAML with libyaml. Errors name the file and line. */
lucid_status lucid_data_yaml_read(lucid_ctx *ctx, const char *file,
                                  lucid_data_yaml *out);
void lucid_data_yaml_free(lucid_data_yaml *y);

/* ------------------------------------------------------------------ dataset */

typedef enum lucid_reject_policy {
    LUCID_POLICY_SKIP = 0, /* count, report, drop the image */
    LUCID_POLICY_FAIL      /* the first reject fails the open */
} lucid_reject_policy;

typedef enum lucid_exif_labels {
    LUCID_EXIF_LABELS_DISPLAY = 0, /* labels refer to the oriented image
                                      (cv2.imread / Ultralytics) */
    LUCID_EXIF_LABELS_STORED       /* labels refer to the stored pixel grid;
                                      they are oriented with the pixels */
} lucid_exif_labels;

typedef struct lucid_dataset_options {
    lucid_pose_spec spec;
    int imgsz;                    /* long side of the prepared image */
    int cache;                    /* 1: keep prepared images in RAM */
    lucid_reject_policy policy;
    double max_reject_fraction;   /* fail when rejected/total exceeds this */
    lucid_exif_labels exif_labels;
    int threads;                  /* scan threads (0 = 1) */
} lucid_dataset_options;

/* imgsz 640, cache 1, policy skip, max_reject_fraction 0.1, COCO spec
 * (K=17, D=3, COCO flip_idx, nc=1), exif display, threads 1. */
lucid_dataset_options lucid_dataset_options_default(void);

typedef struct lucid_dataset_stats {
    int64_t total;                     /* images found */
    int64_t kept;                      /* images in the dataset */
    int64_t rejected;                  /* images dropped */
    int64_t reject_count[LUCID_REJECT_COUNT];
    int64_t instances;                 /* label rows kept */
    int64_t missing_labels;            /* images without label file (kept) */
    int64_t empty_labels;              /* label file with no rows (kept) */
    int64_t duplicates;                /* duplicate rows removed */
    int64_t crowd;                     /* COCO: crowd annotations dropped */
    int64_t no_keypoints;              /* COCO: num_keypoints==0 dropped */
    int max_instances;                 /* largest instance count of an image */
    uint64_t cache_bytes;              /* RAM taken by prepared images */
} lucid_dataset_stats;

typedef struct lucid_dataset lucid_dataset;

/* Open an Ultralytics YOLO-pose split: images_dir holds the images (.jpg,
 * .jpeg, .png, case-insensitive; sorted by name), labels are found by
 * img2label_paths (the last "/images/" replaced by "/labels/", extension
 * ".txt"). Every image is decoded at scan time (and cached when
 * opt->cache). Rejects are counted by reason; the open fails (ERR_FORMAT)
 * with the policy FAIL at the first reject, when the split ends up empty,
 * or when rejected/total > max_reject_fraction. The summary of rejects is in
 * the stats and, on failure, in the message. */
lucid_status lucid_dataset_open_yolo(lucid_ctx *ctx, const char *images_dir,
                                     const lucid_dataset_options *opt,
                                     lucid_dataset **out);
/* Open a COCO keypoint JSON (person_keypoints_*.json) with its image folder.
 * As convert_coco: crowd annotations and annotations with num_keypoints == 0
 * are dropped (counted), boxes with w or h <= 0 dropped, boxes become
 * normalised cx cy w h, keypoints divided by width/height. Images without a
 * kept annotation are background images. */
lucid_status lucid_dataset_open_coco(lucid_ctx *ctx, const char *json_path,
                                     const char *images_dir,
                                     const lucid_dataset_options *opt,
                                     lucid_dataset **out);
void lucid_dataset_retain(lucid_dataset *ds);
void lucid_dataset_release(lucid_dataset *ds);
int64_t lucid_dataset_size(const lucid_dataset *ds);
const lucid_dataset_options *lucid_dataset_opts(const lucid_dataset *ds);
void lucid_dataset_get_stats(const lucid_dataset *ds, lucid_dataset_stats *out);
/* Human-readable summary ("137 images, 422 instances, 0 rejected ...,
 * cache 85.2 MB"); returns chars written like snprintf. */
int lucid_dataset_summary(const lucid_dataset *ds, char *buf, size_t len);
/* Messages of the rejected images, in file order ("<file>[:<line>]: ..."). */
int64_t lucid_dataset_num_rejects(const lucid_dataset *ds);
const char *lucid_dataset_reject_message(const lucid_dataset *ds, int64_t k);
const char *lucid_dataset_image_path(const lucid_dataset *ds, int64_t i);
/* Labels of image i (normalised, oriented). Borrowed pointer. */
const lucid_labels *lucid_dataset_labels(const lucid_dataset *ds, int64_t i);
/* The prepared image i (long side = imgsz, cv2.INTER_LINEAR, upscaling
 * too, w and h ceil'd and capped at imgsz — BaseDataset.load_image). With the
 * cache it is borrowed (*owned = 0); without it is decoded now into *img and
 * *owned = 1 (free with lucid_image_free). Thread-safe. */
lucid_status lucid_dataset_load_image(lucid_ctx *ctx, const lucid_dataset *ds,
                                      int64_t i, lucid_image *img, int *owned);

/* ------------------------------------------------------------ augmentation */

/* Standard hyper-parameter names (Ultralytics default.yaml). */
typedef struct lucid_aug_params {
    int augment;        /* 0: validation (letterbox only, no randomness) */
    float mosaic;       /* probability of mosaic (p) */
    float degrees;      /* rotation +/- deg */
    float translate;    /* fraction */
    float scale;        /* gain range 1 +/- scale */
    float shear;        /* +/- deg */
    float perspective;  /* +/- */
    float flipud;       /* probability */
    float fliplr;       /* probability */
    float hsv_h, hsv_s, hsv_v; /* gains */
    int hsv_on_cpu;     /* 0: skip the HSV stage (the device does it) */
} lucid_aug_params;

/* Pose defaults: augment 1, mosaic 1, degrees 0, translate 0.1, scale 0.5,
 * shear 0, perspective 0, flipud 0, fliplr 0.5, hsv 0.015/0.7/0.4, hsv on
 * the CPU. */
lucid_aug_params lucid_aug_params_default(void);

/* Per-sample random stream: Philox-4x32-10 keyed by seed, counter
 * ((epoch << 40) | (index << 12)) + block, blocks of 4 words (4096 words
 * per sample; index < 2^28, epoch < 2^24). */
typedef struct lucid_rng_stream {
    uint64_t seed, base, block;
    uint32_t buf[4];
    int pos;
} lucid_rng_stream;

void lucid_rng_stream_init(lucid_rng_stream *r, uint64_t seed, uint64_t epoch,
                           uint64_t index);
uint32_t lucid_rng_u32(lucid_rng_stream *r);
/* Continue from block `block` of this sample's stream (stage offsets). */
void lucid_rng_stream_seek(lucid_rng_stream *r, uint64_t block);
/* Uniform double in [lo, hi) from 53 bits of two words. */
double lucid_rng_uniform(lucid_rng_stream *r, double lo, double hi);

/* A working instance set in pixel units of a canvas (xyxy boxes). */
typedef struct lucid_instances {
    int n, cap, nkpt;
    float *cls;   /* [cap] */
    float *box;   /* [cap, 4] x1 y1 x2 y2 pixels */
    float *kpts;  /* [cap, K, 3] x y v pixels */
} lucid_instances;

lucid_status lucid_instances_reserve(lucid_ctx *ctx, lucid_instances *in,
                                     int cap, int nkpt);
void lucid_instances_free(lucid_instances *in);
/* Append labels (normalised) scaled by (w, h) and shifted by (padw, padh). */
lucid_status lucid_instances_append(lucid_ctx *ctx, lucid_instances *in,
                                    const lucid_labels *l, int nkpt, float w,
                                    float h, float padw, float padh);
/* Instances.clip: boxes clamped to [0,w]x[0,h]; keypoints outside get v=0
 * and are clamped. */
void lucid_instances_clip(lucid_instances *in, float w, float h);
/* Drop boxes of zero width or height (remove_zero_area_boxes). */
void lucid_instances_remove_zero_area(lucid_instances *in);

/* Mosaic._mosaic4: tiles imgs[0..3] (prepared images) and their labels
 * around the centre (xc, yc) of a 2s x 2s canvas filled with 114. canvas
 * must be allocated 2s x 2s by the caller. Labels are shifted, then clipped (keypoints
 * outside get v=0), zero-area boxes dropped. */
lucid_status lucid_aug_mosaic4(lucid_ctx *ctx, const lucid_image *imgs[4],
                               const lucid_labels *labels[4], int nkpt, int s,
                               int xc, int yc, lucid_image *canvas,
                               lucid_instances *out);

/* The 3x3 matrix M = T*S*R*P*C of RandomPerspective.affine_transform for an
 * input of (in_w, in_h) and output (out_w, out_h), drawing from r in the
 * reference order: perspective x, y; angle; scale; shear x, y; translate x,
 * y. *scale_out receives s. */
void lucid_aug_perspective_matrix(const lucid_aug_params *p, int in_w,
                                  int in_h, int out_w, int out_h,
                                  lucid_rng_stream *r, double M[9],
                                  double *scale_out);
/* Warp src by M into dst (out_w x out_h, allocated by caller through
 * lucid_image_alloc), bilinear, border 114 (warpAffine / warpPerspective
 * with pixel centres at i + 0.5). */
lucid_status lucid_aug_warp(lucid_ctx *ctx, const lucid_image *src,
                            const double M[9], lucid_image *dst);
/* Transform instances by M (apply_bboxes: 4 corners, min/max; apply_keypoints:
 * out-of-canvas -> v=0), clip to (out_w, out_h), then keep box_candidates
 * against the old boxes scaled by s. */
void lucid_aug_perspective_labels(lucid_instances *in, const double M[9],
                                  int out_w, int out_h, double s);
/* box_candidates(box1, box2, wh_thr=2, ar_thr=100, area_thr=0.1, eps=1e-16):
 * 1 when the transformed box is kept. */
int lucid_box_candidate(const float box1[4], const float box2[4],
                        float wh_thr, float ar_thr, float area_thr);

/* RandomHSV with gains r = U(-1,1)^3 * (hgain, sgain, vgain) drawn here:
 * LUTs hue = (x + r_h*180) mod 180, sat = clip(x*(1+r_s)) with sat[0] = 0,
 * val = clip(x*(1+r_v)), applied in OpenCV 8-bit HSV (H 0..179) and back. */
void lucid_aug_hsv(lucid_image *img, float hgain, float sgain, float vgain,
                   lucid_rng_stream *r);
/* Apply RandomHSV with fixed gains r_h, r_s, r_v (for tests / device parity). */
void lucid_aug_hsv_apply(lucid_image *img, double rh, double rs, double rv);
/* RandomFlip horizontal: pixels mirrored, x -> W - x for boxes and
 * keypoints, keypoints permuted by flip_idx. */
void lucid_aug_fliplr(lucid_image *img, lucid_instances *in,
                      const int *flip_idx);
/* RandomFlip vertical (flipud): y -> H - y; no keypoint permutation. */
void lucid_aug_flipud(lucid_image *img, lucid_instances *in);

/* LetterBox(new_shape, auto=False, scaleup=True, center=True): resize by
 * r = min(new_h/h, new_w/w) (unpadded size round(w*r), round(h*r)), pad 114
 * with top = round(dh - 0.1), left = round(dw - 0.1). dst must be allocated
 * new_w x new_h by the caller. Instances (in pixels of src, may be NULL) are
 * scaled by the unpadded/source size ratio per axis and shifted. */
lucid_status lucid_aug_letterbox(lucid_ctx *ctx, const lucid_image *src,
                                 int new_w, int new_h, lucid_image *dst,
                                 lucid_instances *in);

/* Reusable buffers of one worker (the 2s x 2s mosaic canvas, the s x s
 * letterbox canvas, tile instances); zero-initialise, free with
 * lucid_aug_work_free. */
typedef struct lucid_aug_work {
    lucid_image canvas;   /* 2s x 2s, allocated only when a warp needs the
                             mosaic written out (rotation, shear, perspective) */
    lucid_image square;   /* s x s */
    int s;
} lucid_aug_work;
void lucid_aug_work_free(lucid_aug_work *w);

/* The whole chain for dataset sample `index` in `epoch` (v8_transforms):
 *   augment: mosaic (probability p->mosaic, partners drawn uniformly from the
 *            whole dataset) or the LetterBox pre-transform, random
 *            perspective, HSV (only when p->hsv_on_cpu), flipud, fliplr
 *            (only with flip_idx);
 *   validation (p->augment = 0): LetterBox(s, s) only.
 * out must be allocated s x s (lucid_image_alloc); inst receives the
 * instances in pixels of out. hsv (may be NULL) receives the HSV gains
 * (r_h, r_s, r_v) drawn for this sample — applied here when hsv_on_cpu,
 * else for the device to apply; zeros without augmentation. */
lucid_status lucid_augment_sample(lucid_ctx *ctx, const lucid_dataset *ds,
                                  const lucid_aug_params *p, int s,
                                  uint64_t seed, uint64_t epoch, int64_t index,
                                  lucid_aug_work *work, lucid_image *out,
                                  lucid_instances *inst, float hsv[3]);

/* ------------------------------------------------------------------ loader */

typedef struct lucid_loader_options {
    int batch;        /* B */
    int imgsz;        /* output H = W (defaults to the dataset imgsz) */
    int max_gt;       /* instance slots per image in the target tensors */
    int threads;      /* persistent worker threads (0..256); 0: no
                         threads, lucid_loader_next assembles each batch in
                         the calling thread (same bytes; prefetch unused) */
    int prefetch;     /* batches prepared ahead (>= 1) */
    int shuffle;      /* shuffle order per epoch from (seed, epoch) */
    int drop_last;    /* 0: the short last batch is delivered (reference) */
    uint64_t seed;
} lucid_loader_options;

/* batch 16, imgsz 0 (dataset's), max_gt 64, threads 4, prefetch 4,
 * shuffle 1, drop_last 0, seed 0. prefetch = num_batches prepares a whole
 * epoch ahead (memory: prefetch+1 batches). */
lucid_loader_options lucid_loader_options_default(void);

/* One batch in host memory, pinned (page-locked) when the loader's context
 * drives a CUDA device (lucid_storage_create pinned=1). The tensors
 * always have the full batch shape B (static shapes); only the first n
 * images are real, the rest are zero with mask 0.
 *   images  u8  [B, 3, S, S]       RGB, CHW (the GPU side converts/normalises)
 *   cls     f32 [B, max_gt]
 *   boxes   f32 [B, max_gt, 4]     cx cy w h normalised by S
 *   kpts    f32 [B, max_gt, K, 3]  x y normalised by S, v (0/1/2); v=0
 *                                  keypoints have x = y = 0
 *   mask    u8  [B, max_gt]        1 for a real instance
 *   counts  i32 [B]                instances of each image before truncation
 *   hsv     f32 [B, 3]             HSV gains (r_h, r_s, r_v) drawn per image;
 *                                  already applied when hsv_on_cpu
 * overflow != 0 when an image had more than max_gt instances: its first
 * max_gt are in the tensors and max_count says how many there were — the
 * caller must grow max_gt (a contract change), nothing is dropped silently. */
typedef struct lucid_batch {
    int64_t index;          /* batch number in the epoch */
    uint64_t epoch;
    int n;                  /* real images (< B only for the last batch) */
    int overflow;           /* images with count > max_gt */
    int max_count;          /* largest instance count in the batch */
    lucid_tensor *images, *cls, *boxes, *kpts, *mask, *counts, *hsv;
    int64_t *sample_index;  /* [B] dataset index of each image, -1 = pad */
} lucid_batch;

typedef struct lucid_loader lucid_loader;

/* Start the workers. The loader keeps a reference to ds and to ctx (errors
 * of lucid_loader_next are left in ctx). */
lucid_status lucid_loader_create(lucid_ctx *ctx, lucid_dataset *ds,
                                 const lucid_loader_options *opt,
                                 lucid_loader **out);
/* Begin epoch `epoch` with the augmentation parameters p (copied): cancels
 * any unfinished work, draws the order from (seed, epoch) and starts
 * filling the prefetch slots. */
lucid_status lucid_loader_start_epoch(lucid_loader *ld, uint64_t epoch,
                                      const lucid_aug_params *p);
/* Next batch of the epoch in order; *out = NULL at the end of the epoch.
 * The batch stays valid until the next call of lucid_loader_next,
 * lucid_loader_start_epoch or lucid_loader_release. A worker failure is
 * returned here with its message (naming the file). */
lucid_status lucid_loader_next(lucid_loader *ld, lucid_batch **out);
int64_t lucid_loader_num_batches(const lucid_loader *ld);
/* Stop and join the workers, free the buffers, drop the dataset ref. */
void lucid_loader_release(lucid_loader *ld);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_DATA_H */
