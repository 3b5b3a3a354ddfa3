/*
 * test_data_util.h — fixtures for the data-pipeline C tests: write JPEG/PNG
 * files (with optional EXIF orientation), label files and temporary
 * folders. Everything is generated at run time under a mkdtemp folder.
 */
#ifndef LUCID_TEST_DATA_UTIL_H
#define LUCID_TEST_DATA_UTIL_H

#include <jpeglib.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"

/* A TIFF/EXIF block "Exif\0\0" + little-endian IFD0 with one Orientation
 * entry. Returns its length (26 + 6). */
static inline size_t tdu_exif_block(uint8_t *b, int orientation) {
    static const uint8_t hdr[] = {'E', 'x', 'i', 'f', 0, 0,
                                  'I', 'I', 42, 0, 8, 0, 0, 0, /* IFD at 8 */
                                  1, 0,                        /* 1 entry */
                                  0x12, 0x01, 3, 0, 1, 0, 0, 0, /* SHORT x1 */
                                  0, 0, 0, 0,                  /* value */
                                  0, 0, 0, 0};                 /* next IFD */
    memcpy(b, hdr, sizeof hdr);
    b[6 + 18] = (uint8_t)orientation; /* IFD entry value field */
    return sizeof hdr;
}

/* Write an RGB (nc=3), gray (nc=1) or CMYK (nc=4, Adobe-inverted) JPEG. */
static inline int tdu_write_jpeg(const char *path, const uint8_t *pix, int w, int h,
                          int nc, int quality, int progressive,
                          int orientation) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = nc;
    c.in_color_space = nc == 1 ? JCS_GRAYSCALE : nc == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    for (int i = 0; i < c.num_components; i++) {
        c.comp_info[i].h_samp_factor = 1; /* 4:4:4 */
        c.comp_info[i].v_samp_factor = 1;
    }
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    if (orientation > 1) {
        uint8_t ex[64];
        size_t n = tdu_exif_block(ex, orientation);
        jpeg_write_marker(&c, JPEG_APP0 + 1, ex, (unsigned)n);
    }
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(pix + (size_t)c.next_scanline * w * nc);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
    return 0;
}

/* Write a PNG. color_type PNG_COLOR_TYPE_*, depth 8 or 16 (16-bit data is
 * native uint16), sbit > 0 writes an sBIT chunk, palette for PALETTE. */
static inline int tdu_write_png(const char *path, const void *pix, int w, int h,
                         int color_type, int depth, int interlace, int sbit,
                         const png_color *palette, int npal, int orientation) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL,
                                            NULL);
    png_infop info = png_create_info_struct(p);
    if (setjmp(png_jmpbuf(p))) {
        png_destroy_write_struct(&p, &info);
        fclose(f);
        return -1;
    }
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, depth, color_type,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(p, info, palette, npal);
    if (sbit) {
        png_color_8 sb;
        memset(&sb, 0, sizeof sb);
        sb.red = sb.green = sb.blue = sb.gray = (png_byte)sbit;
        png_set_sBIT(p, info, &sb);
    }
    if (orientation > 1) {
        uint8_t ex[64];
        size_t n = tdu_exif_block(ex, orientation);
        png_set_eXIf_1(p, info, (png_uint_32)(n - 6), ex + 6);
    }
    png_write_info(p, info);
    if (depth == 16) png_set_swap(p);
    int ch = color_type == PNG_COLOR_TYPE_GRAY ? 1
             : color_type == PNG_COLOR_TYPE_PALETTE ? 1
             : color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
             : color_type == PNG_COLOR_TYPE_RGB ? 3 : 4;
    size_t rowbytes = (size_t)w * ch * (depth == 16 ? 2 : 1);
    png_bytep *rows = malloc(sizeof(png_bytep) * h);
    for (int y = 0; y < h; y++) rows[y] = (png_bytep)pix + rowbytes * y;
    png_write_image(p, rows);
    png_write_end(p, NULL);
    free(rows);
    png_destroy_write_struct(&p, &info);
    fclose(f);
    return 0;
}

static inline int tdu_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    return 0;
}

static inline long tdu_read_file(const char *path, uint8_t **buf) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(n > 0 ? n : 1);
    if (fread(*buf, 1, n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

static inline int tdu_write_bytes(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fwrite(b, 1, n, f);
    fclose(f);
    return 0;
}

/* mkdtemp folder with images/<split> and labels/<split>. */
static inline void tdu_make_split(char *root, size_t len, const char *split) {
    snprintf(root, len, "/tmp/lucid_data_XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); exit(2); }
    char p[512];
    snprintf(p, sizeof p, "%s/images", root); mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/labels", root); mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/images/%s", root, split); mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/labels/%s", root, split); mkdir(p, 0755);
}

static inline void tdu_rm_rf(const char *root) {
    char cmd[600];
    if (strncmp(root, "/tmp/lucid_data_", 16) != 0) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", root);
}

/* The real mini dataset, or NULL: $LUCID_DATASETS/coco-pose-mini,
 * ../shared/datasets/coco-pose-mini, datasets/coco-pose-mini. */
static inline const char *tdu_mini_dataset(char *buf, size_t len) {
    const char *env = getenv("LUCID_DATASETS");
    const char *cands[3] = {env, "../shared/datasets", "datasets"};
    for (int i = 0; i < 3; i++) {
        if (!cands[i]) continue;
        snprintf(buf, len, "%s/coco-pose-mini/images/train", cands[i]);
        struct stat sb;
        if (stat(buf, &sb) == 0) {
            snprintf(buf, len, "%s/coco-pose-mini", cands[i]);
            return buf;
        }
    }
    return NULL;
}

#endif
