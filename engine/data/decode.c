/*
 * decode.c — JPEG (libjpeg-turbo) and PNG (libpng) decoding to RGB HWC uint8,
 * with the EXIF orientation applied to the pixels.
 *
 * Contract
 *   - Output is always 3-channel RGB: grayscale replicated, CMYK/YCCK
 *     converted (Adobe-inverted CMYK as Photoshop writes it), alpha dropped,
 *     palette expanded, 16-bit reduced by its real range (sBIT, else the bit
 *     length of the largest sample; v8 = round(v*255/(2^bits-1))).
 *   - Truncated or corrupt data is an error (ERR_FORMAT naming the path):
 *     libjpeg's "premature end of data" warning counts as corruption. Both
 *     libraries get an error handler that longjmps back here (the default
 *     libjpeg error_exit calls exit()); no message is ever printed.
 *   - The whole file is read into memory first, so a reader can never hang
 *     on a pipe or a short file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data.h"
#include "internal.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

/* ------------------------------------------------------------ image basics */

lucid_status lucid_image_alloc(lucid_ctx *ctx, int32_t w, int32_t h,
                               lucid_image *out) {
    out->w = out->h = 0;
    out->data = NULL;
    if (w <= 0 || h <= 0 || (int64_t)w * h > ((int64_t)1 << 31))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "image size %dx%d invalid", w,
                            h);
    out->data = malloc((size_t)w * h * 3);
    if (!out->data)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of memory for a %dx%d image", w, h);
    out->w = w;
    out->h = h;
    return LUCID_OK;
}

void lucid_image_free(lucid_image *img) {
    if (!img) return;
    free(img->data);
    img->data = NULL;
    img->w = img->h = 0;
}

/* ------------------------------------------------------------------- EXIF */

static uint32_t rd16(const uint8_t *p, int le) {
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8
              : (uint32_t)p[0] << 8 | (uint32_t)p[1];
}
static uint32_t rd32(const uint8_t *p, int le) {
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                    (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
                    (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int lucid_exif_orientation(const uint8_t *exif, size_t len) {
    if (!exif) return 1;
    if (len >= 6 && memcmp(exif, "Exif\0\0", 6) == 0) {
        exif += 6;
        len -= 6;
    }
    if (len < 8) return 1;
    int le;
    if (exif[0] == 'I' && exif[1] == 'I') le = 1;
    else if (exif[0] == 'M' && exif[1] == 'M') le = 0;
    else return 1;
    if (rd16(exif + 2, le) != 42) return 1;
    uint32_t ifd = rd32(exif + 4, le);
    if (ifd > len - 2) return 1;
    uint32_t n = rd16(exif + ifd, le);
    for (uint32_t i = 0; i < n; i++) {
        size_t e = (size_t)ifd + 2 + 12 * (size_t)i;
        if (e + 12 > len) return 1;
        if (rd16(exif + e, le) == 0x0112) {           /* Orientation */
            uint32_t type = rd16(exif + e + 2, le);   /* SHORT = 3 */
            uint32_t v = type == 3 ? rd16(exif + e + 8, le)
                                   : rd32(exif + e + 8, le);
            return (v >= 1 && v <= 8) ? (int)v : 1;
        }
    }
    return 1;
}

/* display(X, Y) = stored(x, y) for the 8 EXIF orientations (see data.h). */
lucid_status lucid_image_orient(lucid_ctx *ctx, const lucid_image *src,
                                int o, lucid_image *out) {
    int w = src->w, h = src->h;
    int swap = o >= 5 && o <= 8;
    LUCID_TRY(lucid_image_alloc(ctx, swap ? h : w, swap ? w : h, out));
    int W = out->w, H = out->h;
    for (int Y = 0; Y < H; Y++) {
        for (int X = 0; X < W; X++) {
            int x, y;
            switch (o) {
            case 2: x = w - 1 - X; y = Y; break;
            case 3: x = w - 1 - X; y = h - 1 - Y; break;
            case 4: x = X; y = h - 1 - Y; break;
            case 5: x = Y; y = X; break;
            case 6: x = Y; y = h - 1 - X; break;
            case 7: x = w - 1 - Y; y = h - 1 - X; break;
            case 8: x = w - 1 - Y; y = X; break;
            default: x = X; y = Y; break;
            }
            const uint8_t *s = src->data + ((size_t)y * w + x) * 3;
            uint8_t *d = out->data + ((size_t)Y * W + X) * 3;
            d[0] = s[0]; d[1] = s[1]; d[2] = s[2];
        }
    }
    return LUCID_OK;
}

/* ------------------------------------------------------------------- JPEG */

typedef struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warnings;
    char warnmsg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    e->pub.format_message(cinfo, e->msg);
    longjmp(e->jb, 1);
}

/* level -1 = warning (e.g. premature end of data); >= 0 = trace: ignored. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    jpeg_err *e = (jpeg_err *)cinfo->err;
    if (level < 0) {
        if (e->warnings++ == 0) e->pub.format_message(cinfo, e->warnmsg);
    }
}

static lucid_status decode_jpeg(lucid_ctx *ctx, const uint8_t *buf, size_t len,
                                const char *name, lucid_image *out,
                                int *orientation) {
    struct jpeg_decompress_struct cinfo;
    jpeg_err err;
    /* volatile: modified between setjmp and longjmp */
    uint8_t *volatile pix = NULL;
    uint8_t *volatile row = NULL;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_on_error;
    err.pub.emit_message = jpeg_on_message;
    err.warnings = 0;
    err.msg[0] = err.warnmsg[0] = 0;
    if (setjmp(err.jb)) {
        jpeg_destroy_decompress(&cinfo);
        free(pix);
        free(row);
        return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: corrupt JPEG: %s",
                            name, err.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);

    int orient = 1;
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 &&
            memcmp(m->data, "Exif\0\0", 6) == 0) {
            orient = lucid_exif_orientation(m->data, m->data_length);
            break;
        }
    }
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK ||
               cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    int w = (int)cinfo.output_width, h = (int)cinfo.output_height;
    int nc = cinfo.output_components;
    if (w <= 0 || h <= 0 || (int64_t)w * h > ((int64_t)1 << 28)) {
        snprintf(err.msg, sizeof err.msg, "bad size %dx%d", w, h);
        longjmp(err.jb, 1);
    }
    pix = malloc((size_t)w * h * 3);
    row = malloc((size_t)w * nc);
    if (!pix || !row) {
        snprintf(err.msg, sizeof err.msg, "out of memory (%dx%d)", w, h);
        longjmp(err.jb, 1);
    }
    int inverted = cmyk && cinfo.saw_Adobe_marker;
    while (cinfo.output_scanline < cinfo.output_height) {
        int y = (int)cinfo.output_scanline;
        JSAMPROW r = nc == 3 ? (JSAMPROW)(pix + (size_t)y * w * 3)
                             : (JSAMPROW)row;
        jpeg_read_scanlines(&cinfo, &r, 1);
        if (nc == 4) {
            uint8_t *d = pix + (size_t)y * w * 3;
            for (int x = 0; x < w; x++) {
                int c = row[4 * x], m = row[4 * x + 1], yy = row[4 * x + 2],
                    k = row[4 * x + 3];
                if (!inverted) { c = 255 - c; m = 255 - m; yy = 255 - yy; k = 255 - k; }
                /* inverted CMYK: R = C*K/255 (ImageMagick / Pillow rule) */
                d[3 * x] = (uint8_t)((c * k + 127) / 255);
                d[3 * x + 1] = (uint8_t)((m * k + 127) / 255);
                d[3 * x + 2] = (uint8_t)((yy * k + 127) / 255);
            }
        }
    }
    jpeg_finish_decompress(&cinfo);
    int warnings = err.warnings;
    jpeg_destroy_decompress(&cinfo);
    free(row);
    row = NULL;
    if (warnings) {
        free(pix);
        return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                            "%s: corrupt or truncated JPEG: %s", name,
                            err.warnmsg);
    }
    lucid_image img = {w, h, pix};
    if (orientation) *orientation = orient;
    if (orient != 1) {
        lucid_status st = lucid_image_orient(ctx, &img, orient, out);
        free(pix);
        return st;
    }
    *out = img;
    return LUCID_OK;
}

/* -------------------------------------------------------------------- PNG */

typedef struct png_src {
    const uint8_t *buf;
    size_t len, pos;
    jmp_buf jb;
    char msg[256];
} png_src;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    longjmp(s->jb, 1);
}
static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}
static void png_on_read(png_structp png, png_bytep data, size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->pos) png_error(png, "truncated PNG (unexpected end of data)");
    memcpy(data, s->buf + s->pos, n);
    s->pos += n;
}

static lucid_status decode_png(lucid_ctx *ctx, const uint8_t *buf, size_t len,
                               const char *name, lucid_image *out,
                               int *orientation) {
    png_src src;
    memset(&src, 0, sizeof src);
    src.buf = buf;
    src.len = len;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src,
                                             png_on_error, png_on_warning);
    if (!png) return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: png_create_read_struct failed", name);
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile raw = NULL;
    uint8_t *volatile pix = NULL;
    png_bytep *volatile rows = NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "%s: png_create_info_struct failed", name);
    }
    if (setjmp(src.jb)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(raw);
        free(pix);
        free(rows);
        return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: corrupt PNG: %s", name,
                            src.msg);
    }
    png_set_read_fn(png, &src, png_on_read);
    /* CRC errors are errors (the default), also in ancillary chunks. */
    png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, ctype, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    if (w == 0 || h == 0 || (uint64_t)w * h > ((uint64_t)1 << 28)) {
        snprintf(src.msg, sizeof src.msg, "bad size %ux%u", (unsigned)w,
                 (unsigned)h);
        longjmp(src.jb, 1);
    }
    /* significant bits of 16-bit data (sBIT), before transforms */
    int sbits = 0;
    if (depth == 16) {
        png_color_8p sb;
        if (png_get_sBIT(png, info, &sb)) {
            int m = sb->red > sb->green ? sb->red : sb->green;
            if (sb->blue > m) m = sb->blue;
            if (sb->gray > m) m = sb->gray;
            if (m > 0 && m <= 16) sbits = m;
        }
    }
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (ctype & PNG_COLOR_MASK_ALPHA || png_get_valid(png, info, PNG_INFO_tRNS))
        png_set_strip_alpha(png);
    if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    if (depth == 16) png_set_swap(png); /* little-endian uint16 in memory */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    int bps = depth == 16 ? 2 : 1;
    if (rowbytes != (size_t)w * 3 * bps) {
        snprintf(src.msg, sizeof src.msg, "unexpected row size %zu", rowbytes);
        longjmp(src.jb, 1);
    }
    raw = malloc(rowbytes * h);
    rows = malloc(sizeof(png_bytep) * h);
    if (!raw || !rows) {
        snprintf(src.msg, sizeof src.msg, "out of memory (%ux%u)",
                 (unsigned)w, (unsigned)h);
        longjmp(src.jb, 1);
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = raw + rowbytes * y;
    png_read_image(png, rows);
    png_read_end(png, info);
    int orient = 1;
#if defined(PNG_eXIf_SUPPORTED)
    {
        png_bytep exif = NULL;
        png_uint_32 exlen = 0;
        if (png_get_eXIf_1(png, info, &exlen, &exif) && exif)
            orient = lucid_exif_orientation(exif, exlen);
    }
#endif
    size_t n = (size_t)w * h * 3;
    if (depth == 16) {
        const uint16_t *v = (const uint16_t *)raw;
        uint32_t maxv = 0;
        for (size_t i = 0; i < n; i++) if (v[i] > maxv) maxv = v[i];
        int bits = sbits;
        if (!bits) { bits = 1; while (bits < 16 && (maxv >> bits)) bits++; }
        uint32_t full = (bits >= 16) ? 65535u : ((1u << bits) - 1u);
        if (maxv > full) full = 65535u; /* sBIT lied: never clip */
        pix = malloc(n);
        if (!pix) {
            snprintf(src.msg, sizeof src.msg, "out of memory");
            longjmp(src.jb, 1);
        }
        for (size_t i = 0; i < n; i++)
            pix[i] = (uint8_t)(((uint64_t)v[i] * 255u + full / 2) / full);
        free(raw);
    } else {
        pix = raw;
    }
    raw = NULL;
    free(rows);
    rows = NULL;
    png_destroy_read_struct(&png, &info, NULL);
    lucid_image img = {(int32_t)w, (int32_t)h, pix};
    if (orientation) *orientation = orient;
    if (orient != 1) {
        lucid_status st = lucid_image_orient(ctx, &img, orient, out);
        free(pix);
        return st;
    }
    *out = img;
    return LUCID_OK;
}

/* ------------------------------------------------------------ entry points */

lucid_status lucid_image_decode_memory(lucid_ctx *ctx, const uint8_t *buf,
                                       size_t len, const char *name,
                                       lucid_image *out, int *orientation) {
    out->w = out->h = 0;
    out->data = NULL;
    if (orientation) *orientation = 1;
    if (!name) name = "<memory>";
    if (len == 0)
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: empty file (0 bytes)", name);
    if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF)
        return decode_jpeg(ctx, buf, len, name, out, orientation);
    if (len >= 8 && png_sig_cmp((png_const_bytep)buf, 0, 8) == 0)
        return decode_png(ctx, buf, len, name, out, orientation);
    return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                        "%s: not a JPEG or PNG file (first bytes %02x %02x "
                        "%02x %02x, %zu bytes)",
                        name, buf[0], len > 1 ? buf[1] : 0,
                        len > 2 ? buf[2] : 0, len > 3 ? buf[3] : 0, len);
}

lucid_status lucid_image_decode_file(lucid_ctx *ctx, const char *path,
                                     lucid_image *out, int *orientation) {
    out->w = out->h = 0;
    out->data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open image: %s",
                            path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
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
    if (!buf)
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory reading",
                            path);
    if (rerr) {
        free(buf);
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: read error", path);
    }
    lucid_status st =
        lucid_image_decode_memory(ctx, buf, len, path, out, orientation);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------ resize */

/* cv2.INTER_LINEAR: src = (dst + 0.5) * scale - 0.5, clamped at the border;
 * 11-bit fixed-point weights (INTER_RESIZE_COEF_BITS), rounded result. */
lucid_status lucid_image_resize(lucid_ctx *ctx, const lucid_image *src,
                                int32_t w, int32_t h, lucid_image *dst) {
    LUCID_TRY(lucid_image_alloc(ctx, w, h, dst));
    const int BITS = 11, ONE = 1 << 11;
    int *xo = malloc(sizeof(int) * w * 2);
    int *xw = xo + w;
    if (!xo) {
        lucid_image_free(dst);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "resize: out of memory");
    }
    double sx = (double)src->w / w, sy = (double)src->h / h;
    for (int x = 0; x < w; x++) {
        double f = (x + 0.5) * sx - 0.5;
        int i = (int)(f >= 0 ? f : f - 1); /* floor */
        double fr = f - i;
        if (i < 0) { i = 0; fr = 0; }
        if (i >= src->w - 1) { i = src->w - 1; fr = 0; }
        xo[x] = i;
        xw[x] = (int)(fr * ONE + 0.5);
    }
    int sw = src->w;
    for (int y = 0; y < h; y++) {
        double f = (y + 0.5) * sy - 0.5;
        int j = (int)(f >= 0 ? f : f - 1);
        double fr = f - j;
        if (j < 0) { j = 0; fr = 0; }
        if (j >= src->h - 1) { j = src->h - 1; fr = 0; }
        int wy = (int)(fr * ONE + 0.5);
        const uint8_t *r0 = src->data + (size_t)j * sw * 3;
        const uint8_t *r1 = j + 1 < src->h ? r0 + (size_t)sw * 3 : r0;
        uint8_t *d = dst->data + (size_t)y * w * 3;
        for (int x = 0; x < w; x++) {
            int i = xo[x], wx = xw[x];
            int i1 = i + 1 < sw ? i + 1 : i;
            for (int c = 0; c < 3; c++) {
                int a = r0[i * 3 + c] * (ONE - wx) + r0[i1 * 3 + c] * wx;
                int b = r1[i * 3 + c] * (ONE - wx) + r1[i1 * 3 + c] * wx;
                int64_t v = (int64_t)a * (ONE - wy) + (int64_t)b * wy;
                d[x * 3 + c] = (uint8_t)((v + ((int64_t)1 << (2 * BITS - 1))) >> (2 * BITS));
            }
        }
    }
    free(xo);
    return LUCID_OK;
}
