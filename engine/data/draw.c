/*
 * draw.c — drawing on RGB images for previews: filled discs, thick lines
 * (Bresenham with a disc stamp), rectangles, a 5x7 bitmap font, and COCO
 * pose skeletons in the Ultralytics pose palette (see image_io.h).
 *
 * No antialiasing: every primitive sets whole pixels, so the pixels a shape
 * touches are exactly predictable (spec/c/test_image_io.c checks them).
 * Everything clips to the image; coordinates far outside are harmless.
 */
#include "image_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ primitives */

static inline void put(lucid_image *img, int x, int y, lucid_rgb c) {
    if (x < 0 || y < 0 || x >= img->w || y >= img->h) return;
    uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
}

/* Filled axis-aligned block [x1, x2] x [y1, y2] (inclusive), clipped. */
static void fill_block(lucid_image *img, int x1, int y1, int x2, int y2,
                       lucid_rgb c) {
    if (x1 > x2) { int t = x1; x1 = x2; x2 = t; }
    if (y1 > y2) { int t = y1; y1 = y2; y2 = t; }
    if (x1 < 0) x1 = 0;
    if (y1 < 0) y1 = 0;
    if (x2 >= img->w) x2 = img->w - 1;
    if (y2 >= img->h) y2 = img->h - 1;
    for (int y = y1; y <= y2; y++)
        for (int x = x1; x <= x2; x++) put(img, x, y, c);
}

void lucid_draw_circle(lucid_image *img, int cx, int cy, int r, lucid_rgb c) {
    if (!img || !img->data || r < 0) return;
    if (cx + r < 0 || cy + r < 0 || cx - r >= img->w || cy - r >= img->h) return;
    long r2 = (long)r * r;
    for (int dy = -r; dy <= r; dy++) {
        int y = cy + dy;
        if (y < 0 || y >= img->h) continue;
        for (int dx = -r; dx <= r; dx++)
            if ((long)dx * dx + (long)dy * dy <= r2) put(img, cx + dx, y, c);
    }
}

void lucid_draw_line(lucid_image *img, int x0, int y0, int x1, int y1, int r,
                     lucid_rgb c) {
    if (!img || !img->data || r < 0) return;
    /* nothing to do when the stamped line's bounding box misses the image */
    int lo_x = x0 < x1 ? x0 : x1, hi_x = x0 < x1 ? x1 : x0;
    int lo_y = y0 < y1 ? y0 : y1, hi_y = y0 < y1 ? y1 : y0;
    if (hi_x + r < 0 || hi_y + r < 0 || lo_x - r >= img->w || lo_y - r >= img->h)
        return;
    long dx = labs((long)x1 - x0), dy = -labs((long)y1 - y0);
    int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    long err = dx + dy;
    int x = x0, y = y0;
    for (;;) {
        if (r == 0) put(img, x, y, c);
        else lucid_draw_circle(img, x, y, r, c);
        if (x == x1 && y == y1) break;
        long e2 = 2 * err;
        if (e2 >= dy) {
            err += dy;
            x += sx;
        }
        if (e2 <= dx) {
            err += dx;
            y += sy;
        }
    }
}

void lucid_draw_rect(lucid_image *img, int x1, int y1, int x2, int y2, int t,
                     lucid_rgb c) {
    if (!img || !img->data) return;
    if (x1 > x2) { int s = x1; x1 = x2; x2 = s; }
    if (y1 > y2) { int s = y1; y1 = y2; y2 = s; }
    /* filled: asked for, or the bands would overlap */
    if (t <= 0 || 2 * t >= x2 - x1 + 1 || 2 * t >= y2 - y1 + 1) {
        fill_block(img, x1, y1, x2, y2, c);
        return;
    }
    fill_block(img, x1, y1, x2, y1 + t - 1, c);         /* top */
    fill_block(img, x1, y2 - t + 1, x2, y2, c);         /* bottom */
    fill_block(img, x1, y1 + t, x1 + t - 1, y2 - t, c); /* left */
    fill_block(img, x2 - t + 1, y1 + t, x2, y2 - t, c); /* right */
}

/* ------------------------------------------------------------------ font */

/* 5x7 glyphs: 7 rows, bit 4 = leftmost column (the row pictures are in the
 * comments, '#' = ink). Upper case is folded to lower case. */
typedef struct glyph {
    char ch;
    uint8_t rows[7];
} glyph;

static const glyph FONT[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, /* .###. #...# #..## #.#.# ##..# #...# .###. */
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}}, /* ..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###. */
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, /* .###. #...# ....# ...#. ..#.. .#... ##### */
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}}, /* ##### ...#. ..#.. ...#. ....# #...# .###. */
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, /* ...#. ..##. .#.#. #..#. ##### ...#. ...#. */
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}}, /* ##### #.... ####. ....# ....# #...# .###. */
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, /* ..##. .#... #.... ####. #...# #...# .###. */
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}}, /* ##### ....# ...#. ..#.. .#... .#... .#... */
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, /* .###. #...# #...# .###. #...# #...# .###. */
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}}, /* .###. #...# #...# .#### ....# ...#. .##.. */
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, /* ..... ..... ..... ..... ..... .##.. .##.. */
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}}, /* ..... ..... ..... ##### ..... ..... ..... */
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}}, /* ..... .##.. .##.. ..... .##.. .##.. ..... */
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, /* ##... ##..# ...#. ..#.. .#... #..## ...## */
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}}, /* ..... ..... ..... ..... ..... ..... ##### */
    {' ', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}}, /* ..... ..... ..... ..... ..... ..... ..... */
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, /* ..... ..... .###. ....# .#### #...# .#### */
    {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}}, /* #.... #.... #.##. ##..# #...# #...# ####. */
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}}, /* ..... ..... .###. #.... #.... #...# .###. */
    {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}}, /* ....# ....# .##.# #..## #...# #...# .#### */
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}}, /* ..... ..... .###. #...# ##### #.... .###. */
    {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}}, /* ..##. .#..# .#... ###.. .#... .#... .#... */
    {'g', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, /* ..... .#### #...# #...# .#### ....# .###. */
    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}}, /* #.... #.... #.##. ##..# #...# #...# #...# */
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, /* ..#.. ..... .##.. ..#.. ..#.. ..#.. .###. */
    {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}}, /* ...#. ..... ..##. ...#. ...#. #..#. .##.. */
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, /* #.... #.... #..#. #.#.. ##... #.#.. #..#. */
    {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, /* .##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###. */
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, /* ..... ..... ##.#. #.#.# #.#.# #...# #...# */
    {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}}, /* ..... ..... #.##. ##..# #...# #...# #...# */
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, /* ..... ..... .###. #...# #...# #...# .###. */
    {'p', {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}}, /* ..... ..... ####. #...# ####. #.... #.... */
    {'q', {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01}}, /* ..... ..... .##.# #..## .#### ....# ....# */
    {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}}, /* ..... ..... #.##. ##..# #.... #.... #.... */
    {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}}, /* ..... ..... .###. #.... .###. ....# ####. */
    {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}}, /* .#... .#... ###.. .#... .#... .#..# ..##. */
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}}, /* ..... ..... #...# #...# #...# #..## .##.# */
    {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}}, /* ..... ..... #...# #...# #...# .#.#. ..#.. */
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}}, /* ..... ..... #...# #...# #.#.# #.#.# .#.#. */
    {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}}, /* ..... ..... #...# .#.#. ..#.. .#.#. #...# */
    {'y', {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, /* ..... ..... #...# #...# .#### ....# .###. */
    {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}}, /* ..... ..... ##### ...#. ..#.. .#... ##### */
};

static const uint8_t *glyph_rows(char ch) {
    if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
    for (size_t g = 0; g < sizeof FONT / sizeof FONT[0]; g++)
        if (FONT[g].ch == ch) return FONT[g].rows;
    return NULL;
}

void lucid_text_size(const char *s, int scale, int *w, int *h) {
    if (scale < 1) scale = 1;
    int n = s ? (int)strlen(s) : 0;
    *w = n > 0 ? (6 * n - 1) * scale : 0;
    *h = 7 * scale;
}

int lucid_draw_text(lucid_image *img, int x, int y, const char *s, int scale,
                    lucid_rgb c) {
    if (scale < 1) scale = 1;
    if (!s) return 0;
    int w, h;
    lucid_text_size(s, scale, &w, &h);
    if (!img || !img->data) return w;
    for (; *s; s++, x += 6 * scale) {
        const uint8_t *rows = glyph_rows(*s);
        if (!rows) {
            /* unknown character: a hollow box, so it is visibly missing */
            lucid_draw_rect(img, x, y + scale, x + 5 * scale - 1,
                            y + 7 * scale - 1, scale, c);
            continue;
        }
        for (int r = 0; r < 7; r++)
            for (int col = 0; col < 5; col++)
                if (rows[r] & (1u << (4 - col)))
                    fill_block(img, x + col * scale, y + r * scale,
                               x + col * scale + scale - 1,
                               y + r * scale + scale - 1, c);
    }
    return w;
}

/* ------------------------------------------------------------------ pose */

const int lucid_coco_skeleton[19][2] = {
    {15, 13}, {13, 11}, {16, 14}, {14, 12}, {11, 12}, {5, 11}, {6, 12},
    {5, 6},   {5, 7},   {6, 8},   {7, 9},   {8, 10},  {1, 2},  {0, 1},
    {0, 2},   {1, 3},   {2, 4},   {3, 5},   {4, 6}};

/* Ultralytics Annotator.pose_palette is used on BGR images by cv2; these
 * are the same colours as RGB (each triple reversed). */
const lucid_rgb lucid_pose_palette[20] = {
    {0, 128, 255},   {51, 153, 255},  {102, 178, 255}, {0, 230, 230},
    {255, 153, 255}, {255, 204, 153}, {255, 102, 255}, {255, 51, 255},
    {255, 178, 102}, {255, 153, 51},  {153, 153, 255}, {102, 102, 255},
    {51, 51, 255},   {153, 255, 153}, {102, 255, 102}, {51, 255, 51},
    {0, 255, 0},     {255, 0, 0},     {0, 0, 255},     {255, 255, 255}};

const uint8_t lucid_limb_color_idx[19] = {9, 9, 9, 9, 7, 7, 7, 0, 0, 0,
                                          0, 0, 16, 16, 16, 16, 16, 16, 16};
const uint8_t lucid_kpt_color_idx[17] = {16, 16, 16, 16, 16, 0, 0, 0, 0,
                                         0, 0, 9, 9, 9, 9, 9, 9};

/* Ultralytics utils.plotting.Colors (hex RGB). */
static const uint32_t CLASS_HEX[20] = {
    0x042AFF, 0x0BDBEB, 0xF3F3F3, 0x00DFB7, 0x111F68, 0xFF6FDD, 0xFF444F,
    0xCCED00, 0x00F344, 0xBD00FF, 0x00B4FF, 0xDD00BA, 0x00FFFF, 0x26C000,
    0x01FFB3, 0x7D24FF, 0x7B0068, 0xFF1B6C, 0xFC6D2F, 0xA2FF0B};

lucid_rgb lucid_class_color(int c) {
    if (c < 0) c = -c;
    uint32_t h = CLASS_HEX[c % 20];
    lucid_rgb r = {(uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h};
    return r;
}

lucid_pose_draw_opts lucid_pose_draw_opts_default(void) {
    lucid_pose_draw_opts o;
    o.kpt_threshold = 0.5f;
    o.boxes = 1;
    o.labels = 1;
    o.line_width = 0;
    o.radius = 0;
    return o;
}

/* A float coordinate -> pixel index (floor), kept in a sane range. */
static int pix(float v) {
    if (!(v > -1e6f)) return -1000000; /* NaN and very negative */
    if (v > 1e6f) return 1000000;
    return (int)floorf(v);
}

static int kpt_ok(const lucid_image *img, const float *k, float thr) {
    if (isnan(k[0]) || isnan(k[1]) || isnan(k[2])) return 0;
    if (!(k[2] > thr)) return 0;
    if (k[0] == 0 && k[1] == 0) return 0; /* "no keypoint" as Ultralytics */
    return k[0] >= 0 && k[1] >= 0 && k[0] < img->w && k[1] < img->h;
}

void lucid_draw_pose(lucid_image *img, const float *box, int cls, float conf,
                     const char *label, const float *kpts, int K,
                     const lucid_pose_draw_opts *opts) {
    if (!img || !img->data) return;
    lucid_pose_draw_opts o = opts ? *opts : lucid_pose_draw_opts_default();
    int lw = o.line_width > 0 ? o.line_width
                              : (int)lround((img->w + img->h) / 2.0 * 0.003);
    if (lw < 2 && o.line_width <= 0) lw = 2;
    int radius = o.radius > 0 ? o.radius : lw + 1;
    lucid_rgb bc = lucid_class_color(cls);
    if (box && o.boxes) {
        int x1 = pix(box[0]), y1 = pix(box[1]), x2 = pix(box[2]), y2 = pix(box[3]);
        lucid_draw_rect(img, x1, y1, x2, y2, lw, bc);
        if (o.labels && label) {
            char text[96];
            snprintf(text, sizeof text, "%s %.2f", label, (double)conf);
            int scale = lw > 1 ? lw - 1 : 1, tw, th;
            lucid_text_size(text, scale, &tw, &th);
            int pad = scale;
            /* above the box when it fits, else inside its top edge */
            int ty = y1 - th - 2 * pad >= 0 ? y1 - th - 2 * pad : y1;
            int tx = x1 < 0 ? 0 : x1;
            fill_block(img, tx, ty, tx + tw + 2 * pad - 1, ty + th + 2 * pad - 1, bc);
            double lum = 0.299 * bc.r + 0.587 * bc.g + 0.114 * bc.b;
            lucid_rgb tc = lum > 160 ? (lucid_rgb){0, 0, 0} : (lucid_rgb){255, 255, 255};
            lucid_draw_text(img, tx + pad, ty + pad, text, scale, tc);
        }
    }
    if (!kpts || K <= 0) return;
    if (K == 17) {
        int lr = lw / 2;
        for (int l = 0; l < 19; l++) {
            const float *a = kpts + 3 * lucid_coco_skeleton[l][0];
            const float *b = kpts + 3 * lucid_coco_skeleton[l][1];
            if (!kpt_ok(img, a, o.kpt_threshold) || !kpt_ok(img, b, o.kpt_threshold))
                continue;
            lucid_draw_line(img, pix(a[0]), pix(a[1]), pix(b[0]), pix(b[1]), lr,
                            lucid_pose_palette[lucid_limb_color_idx[l]]);
        }
    }
    for (int k = 0; k < K; k++) {
        const float *p = kpts + 3 * k;
        if (!kpt_ok(img, p, o.kpt_threshold)) continue;
        lucid_rgb c = K == 17 ? lucid_pose_palette[lucid_kpt_color_idx[k]]
                              : lucid_pose_palette[k % 20];
        lucid_draw_circle(img, pix(p[0]), pix(p[1]), radius, c);
    }
}
