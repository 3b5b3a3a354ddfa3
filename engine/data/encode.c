/*
 * encode.c — PNG writing (libpng) and the letterbox geometry of the
 * validation path (see image_io.h).
 *
 * PNG: 8-bit RGB, no interlace, default zlib level 6 with the adaptive
 * filters (libpng defaults): small enough for annotated previews and
 * lossless, so a written image decodes back to the same bytes. The file is
 * encoded in memory first and then written by engine/io's atomic writer, so
 * a failure never leaves a half-written PNG where a good one was.
 */
#include "data_internal.h"
#include "image_io.h"
#include "io/safetensors.h"

#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ PNG */

typedef struct png_sink {
    uint8_t *buf;
    size_t len, cap;
    int oom;
    char msg[200];
    jmp_buf jb;
} png_sink;

static void sink_error(png_structp png, png_const_charp msg) {
    png_sink *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    longjmp(s->jb, 1);
}

static void sink_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void sink_write(png_structp png, png_bytep data, size_t n) {
    png_sink *s = png_get_io_ptr(png);
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n) cap *= 2;
        uint8_t *nb = realloc(s->buf, cap);
        if (!nb) {
            s->oom = 1;
            png_error(png, "out of memory");
        }
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
}

static void sink_flush(png_structp png) { (void)png; }

lucid_status lucid_image_encode_png(lucid_ctx *ctx, const lucid_image *img,
                                    uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    if (!img || !img->data || img->w <= 0 || img->h <= 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "encode png: empty image (%dx%d)",
                            img ? img->w : 0, img ? img->h : 0);
    png_sink *s = calloc(1, sizeof *s);
    if (!s) return lucid_seterr(ctx, LUCID_ERR_OOM, "encode png: out of memory");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, s,
                                              sink_error, sink_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, NULL);
        free(s);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "encode png: libpng init failed");
    }
    if (setjmp(s->jb)) {
        lucid_status st = s->oom ? LUCID_ERR_OOM : LUCID_ERR_FORMAT;
        lucid_seterr(ctx, st, "encode png (%dx%d): %s", img->w, img->h, s->msg);
        png_destroy_write_struct(&png, &info);
        free(s->buf);
        free(s);
        return st;
    }
    png_set_write_fn(png, s, sink_write, sink_flush);
    png_set_compression_level(png, 3); /* previews: speed over the last few percent of size */
    png_set_IHDR(png, info, (png_uint_32)img->w, (png_uint_32)img->h, 8,
                 PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    size_t stride = (size_t)img->w * 3;
    for (int y = 0; y < img->h; y++)
        png_write_row(png, (png_const_bytep)(img->data + (size_t)y * stride));
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    *buf = s->buf;
    *len = s->len;
    free(s);
    return LUCID_OK;
}

lucid_status lucid_image_write_png(lucid_ctx *ctx, const char *path,
                                   const lucid_image *img) {
    if (!path || !*path)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "write png: empty path");
    uint8_t *buf;
    size_t len;
    lucid_status st = lucid_image_encode_png(ctx, img, &buf, &len);
    if (st != LUCID_OK) {
        /* prefix the path: the message of encode does not know it */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lucid_ctx_error(ctx));
        return lucid_seterr(ctx, st, "%s: %s", path, msg);
    }
    st = lucid_atomic_write(ctx, path, buf, len);
    free(buf);
    if (st != LUCID_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lucid_ctx_error(ctx));
        if (!strstr(msg, path))
            return lucid_seterr(ctx, st, "write png %s: %s", path, msg);
        return lucid_seterr(ctx, st, "write png: %s", msg);
    }
    return LUCID_OK;
}

/* ------------------------------------------------------------ letterbox */

void lucid_letterbox_geometry(int w, int h, int size,
                              lucid_letterbox_geom *g) {
    memset(g, 0, sizeof *g);
    g->src_w = w;
    g->src_h = h;
    g->size = size;
    if (w <= 0 || h <= 0 || size <= 0) return;
    lucid_prepared_size(w, h, size, &g->pw, &g->ph);
    /* lucid_aug_letterbox on the prepared image */
    double r = fmin((double)size / g->ph, (double)size / g->pw);
    g->uw = (int)rint(g->pw * r);
    g->uh = (int)rint(g->ph * r);
    double dw = (size - g->uw) / 2.0, dh = (size - g->uh) / 2.0;
    g->pad_y = (int)rint(dh - 0.1);
    g->pad_x = (int)rint(dw - 0.1);
    g->rx = (double)g->uw / w;
    g->ry = (double)g->uh / h;
}

void lucid_letterbox_unmap(const lucid_letterbox_geom *g, float *x, float *y) {
    if (g->rx <= 0 || g->ry <= 0) return;
    double X = (*x - g->pad_x) / g->rx, Y = (*y - g->pad_y) / g->ry;
    if (X < 0) X = 0;
    if (X > g->src_w) X = g->src_w;
    if (Y < 0) Y = 0;
    if (Y > g->src_h) Y = g->src_h;
    *x = (float)X;
    *y = (float)Y;
}

lucid_status lucid_image_letterbox_val(lucid_ctx *ctx, const lucid_image *src,
                                       int size, lucid_image *dst,
                                       lucid_letterbox_geom *g) {
    dst->w = dst->h = 0;
    dst->data = NULL;
    if (!src || !src->data || src->w <= 0 || src->h <= 0 || size <= 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "letterbox: empty image or size %d", size);
    lucid_letterbox_geom geom;
    lucid_letterbox_geometry(src->w, src->h, size, &geom);
    lucid_image prep = *src, tmp = {0, 0, NULL};
    if (geom.pw != src->w || geom.ph != src->h) {
        LUCID_TRY(lucid_image_resize(ctx, src, geom.pw, geom.ph, &tmp));
        prep = tmp;
    }
    lucid_status st = lucid_image_alloc(ctx, size, size, dst);
    if (st == LUCID_OK) st = lucid_aug_letterbox(ctx, &prep, size, size, dst, NULL);
    lucid_image_free(&tmp);
    if (st != LUCID_OK) {
        lucid_image_free(dst);
        return st;
    }
    if (g) *g = geom;
    return LUCID_OK;
}

lucid_status lucid_dataset_orig_size(lucid_ctx *ctx, const lucid_dataset *ds,
                                     int64_t i, int *w, int *h) {
    if (!ds || i < 0 || i >= ds->n)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "dataset image index %lld outside [0, %lld)",
                            (long long)i, (long long)(ds ? ds->n : 0));
    *w = ds->orig_wh[2 * i];
    *h = ds->orig_wh[2 * i + 1];
    return LUCID_OK;
}
