/*
 * cache.c — the prepared image: decoded once, EXIF-oriented, resized so the
 * long side equals imgsz (BaseDataset.load_image: r = imgsz / max(h, w),
 * resized whenever r != 1 — small images are upscaled too — with w and h
 * ceil'd and capped at imgsz, cv2.INTER_LINEAR), and optionally kept in RAM.
 *
 * Contract
 *   - With opt.cache the dataset holds every prepared image from scan time
 *     on; lucid_dataset_load_image then only lends a pointer (thread-safe,
 *     read-only). stats.cache_bytes is the RAM they take (w*h*3 each).
 *   - Without the cache, every call decodes and resizes again; the caller
 *     owns the result.
 */
#include "data_internal.h"

#include <math.h>
#include <stdlib.h>

void lucid_prepared_size(int w, int h, int imgsz, int *pw, int *ph) {
    int m = w > h ? w : h;
    if (m == imgsz || imgsz <= 0) {
        *pw = w;
        *ph = h;
        return;
    }
    double r = (double)imgsz / m;
    int nw = (int)ceil(w * r), nh = (int)ceil(h * r);
    *pw = nw < imgsz ? (nw < 1 ? 1 : nw) : imgsz;
    *ph = nh < imgsz ? (nh < 1 ? 1 : nh) : imgsz;
}

lucid_status lucid_prepare_image(lucid_ctx *ctx, const char *path, int imgsz,
                                 lucid_image *out, int *orient, int *ow,
                                 int *oh) {
    lucid_image full;
    LUCID_TRY(lucid_image_decode_file(ctx, path, &full, orient));
    if (ow) *ow = full.w;
    if (oh) *oh = full.h;
    int pw, ph;
    lucid_prepared_size(full.w, full.h, imgsz, &pw, &ph);
    if (pw == full.w && ph == full.h) {
        *out = full;
        return LUCID_OK;
    }
    lucid_status st = lucid_image_resize(ctx, &full, pw, ph, out);
    lucid_image_free(&full);
    return st;
}

lucid_status lucid_dataset_load_image(lucid_ctx *ctx, const lucid_dataset *ds,
                                      int64_t i, lucid_image *img, int *owned) {
    *owned = 0;
    if (i < 0 || i >= ds->n)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "image index %lld outside [0, %lld)", (long long)i,
                            (long long)ds->n);
    if (ds->cache) {
        *img = ds->cache[i];
        return LUCID_OK;
    }
    LUCID_TRY(lucid_prepare_image(ctx, ds->paths[i], ds->opt.imgsz, img, NULL,
                                  NULL, NULL));
    *owned = 1;
    return LUCID_OK;
}
