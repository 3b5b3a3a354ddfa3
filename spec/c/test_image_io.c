/*
 * test_image_io.c — PNG writing (round trip through the decoder, atomic
 * replace, clear errors for unwritable paths), the drawing primitives
 * (exact pixel sets in small cases), the bitmap font, pose drawing and the
 * letterbox geometry of the validation path.
 */
#include "test.h"
#include "data/image_io.h"
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static lucid_ctx *ctx;
static char dir[256];

static const lucid_rgb RED = {255, 0, 0};

static void blank(lucid_image *img, int w, int h) {
    lucid_image_alloc(ctx, w, h, img);
    memset(img->data, 0, (size_t)w * h * 3);
}

static int is_set(const lucid_image *img, int x, int y) {
    const uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
    return p[0] || p[1] || p[2];
}

static int count_set(const lucid_image *img) {
    int n = 0;
    for (int y = 0; y < img->h; y++)
        for (int x = 0; x < img->w; x++) n += is_set(img, x, y);
    return n;
}

/* Exactly the pixels (xs[k], ys[k]) are set. */
static int exactly(const lucid_image *img, const int *xs, const int *ys, int n) {
    for (int k = 0; k < n; k++)
        if (!is_set(img, xs[k], ys[k])) return 0;
    return count_set(img) == n;
}

static void test_png_roundtrip(void) {
    lucid_image img, back;
    int w = 37, h = 23;
    lucid_image_alloc(ctx, w, h, &img);
    for (int i = 0; i < w * h * 3; i++) img.data[i] = (uint8_t)(i * 37 + (i >> 5));
    char path[512];
    snprintf(path, sizeof path, "%s/round.png", dir);
    lucid_status st = lucid_image_write_png(ctx, path, &img);
    CHECK_STATUS("png write", ctx, st);
    int o = 0;
    st = lucid_image_decode_file(ctx, path, &back, &o);
    CHECK("png read back: same size and pixels",
          st == LUCID_OK && back.w == w && back.h == h &&
              memcmp(back.data, img.data, (size_t)w * h * 3) == 0 && o == 1,
          "st %d %s", st, lucid_ctx_error(ctx));
    if (st == LUCID_OK) lucid_image_free(&back);

    uint8_t *buf = NULL;
    size_t len = 0;
    st = lucid_image_encode_png(ctx, &img, &buf, &len);
    int ok = st == LUCID_OK && len > 8 && memcmp(buf, "\x89PNG\r\n\x1a\n", 8) == 0;
    if (ok) {
        ok = lucid_image_decode_memory(ctx, buf, len, "mem", &back, NULL) == LUCID_OK &&
             memcmp(back.data, img.data, (size_t)w * h * 3) == 0;
        lucid_image_free(&back);
    }
    free(buf);
    CHECK("png encode in memory decodes to the same pixels", ok, "%s", lucid_ctx_error(ctx));

    /* 1x1 and a wide image */
    lucid_image one;
    lucid_image_alloc(ctx, 1, 1, &one);
    one.data[0] = 1, one.data[1] = 2, one.data[2] = 3;
    snprintf(path, sizeof path, "%s/one.png", dir);
    st = lucid_image_write_png(ctx, path, &one);
    ok = st == LUCID_OK && lucid_image_decode_file(ctx, path, &back, NULL) == LUCID_OK &&
         back.w == 1 && back.h == 1 && back.data[0] == 1 && back.data[1] == 2 && back.data[2] == 3;
    if (ok) lucid_image_free(&back);
    CHECK("png 1x1 round trip", ok, "%s", lucid_ctx_error(ctx));
    lucid_image_free(&one);

    lucid_image empty = {0, 0, NULL};
    snprintf(path, sizeof path, "%s/empty.png", dir);
    st = lucid_image_write_png(ctx, path, &empty);
    CHECK("png of an empty image is ERR_ARG naming the path",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), path) != NULL &&
              access(path, F_OK) != 0,
          "st %d %s", st, lucid_ctx_error(ctx));
    lucid_image_free(&img);
}

static int fail_rename(const char *stage, void *ud) {
    (void)ud;
    return strcmp(stage, "rename") == 0;
}

static void test_png_errors(void) {
    lucid_image img;
    blank(&img, 4, 4);
    char path[512];
    snprintf(path, sizeof path, "%s/no/such/folder/x.png", dir);
    lucid_status st = lucid_image_write_png(ctx, path, &img);
    CHECK("png write to a missing folder: ERR_IO naming the path",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), path) != NULL,
          "st %d msg '%s'", st, lucid_ctx_error(ctx));

    /* a folder where the file should be */
    snprintf(path, sizeof path, "%s/adir", dir);
    mkdir(path, 0755);
    st = lucid_image_write_png(ctx, path, &img);
    CHECK("png write over a folder fails with ERR_IO naming the path",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), path) != NULL,
          "st %d msg '%s'", st, lucid_ctx_error(ctx));

    /* a failed replace leaves the old file intact */
    snprintf(path, sizeof path, "%s/keep.png", dir);
    img.data[0] = 200;
    st = lucid_image_write_png(ctx, path, &img);
    img.data[0] = 10;
    lucid_atomic_file_set_fail_hook(fail_rename, NULL);
    lucid_status st2 = lucid_image_write_png(ctx, path, &img);
    lucid_atomic_file_set_fail_hook(NULL, NULL);
    lucid_image back;
    int ok = st == LUCID_OK && st2 == LUCID_ERR_IO &&
             lucid_image_decode_file(ctx, path, &back, NULL) == LUCID_OK && back.data[0] == 200;
    if (ok) lucid_image_free(&back);
    CHECK("failed png replace keeps the previous file", ok, "st %d st2 %d %s", st, st2,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);
}

static void test_lines(void) {
    lucid_image img;
    blank(&img, 12, 10);
    lucid_draw_line(&img, 2, 5, 8, 5, 0, RED);
    int xs[16], ys[16];
    for (int k = 0; k < 7; k++) xs[k] = 2 + k, ys[k] = 5;
    CHECK("horizontal line r=0: 7 pixels, ends included", exactly(&img, xs, ys, 7),
          "count %d", count_set(&img));

    memset(img.data, 0, 12 * 10 * 3);
    lucid_draw_line(&img, 0, 0, 4, 4, 0, RED);
    for (int k = 0; k < 5; k++) xs[k] = k, ys[k] = k;
    CHECK("diagonal line r=0: the 5 diagonal pixels", exactly(&img, xs, ys, 5),
          "count %d", count_set(&img));

    /* Bresenham (1,1)-(5,3): (1,1) (2,2) (3,2) (4,3) (5,3) */
    memset(img.data, 0, 12 * 10 * 3);
    lucid_draw_line(&img, 1, 1, 5, 3, 0, RED);
    int bx[] = {1, 2, 3, 4, 5}, by[] = {1, 2, 2, 3, 3};
    CHECK("shallow line r=0: the Bresenham pixels", exactly(&img, bx, by, 5),
          "count %d", count_set(&img));
    /* reversed direction covers the same pixel count and both ends */
    memset(img.data, 0, 12 * 10 * 3);
    lucid_draw_line(&img, 5, 3, 1, 1, 0, RED);
    CHECK("reversed line has 5 pixels and both ends",
          count_set(&img) == 5 && is_set(&img, 1, 1) && is_set(&img, 5, 3),
          "count %d", count_set(&img));

    /* radius 1: a plus-shaped stamp along (3,3)-(6,3): rows 2 and 4 x=3..6,
     * row 3 x=2..7 */
    memset(img.data, 0, 12 * 10 * 3);
    lucid_draw_line(&img, 3, 3, 6, 3, 1, RED);
    int n = 0;
    for (int x = 3; x <= 6; x++) xs[n] = x, ys[n++] = 2;
    for (int x = 2; x <= 7; x++) xs[n] = x, ys[n++] = 3;
    for (int x = 3; x <= 6; x++) xs[n] = x, ys[n++] = 4;
    CHECK("thick line r=1: 14 pixels", exactly(&img, xs, ys, n), "count %d",
          count_set(&img));

    /* entirely outside: nothing, no crash; huge coordinates clip */
    memset(img.data, 0, 12 * 10 * 3);
    lucid_draw_line(&img, -50, -50, -10, -3, 2, RED);
    lucid_draw_line(&img, 100, 0, 200, 9, 0, RED);
    CHECK("lines outside the image set nothing", count_set(&img) == 0, "count %d",
          count_set(&img));
    lucid_draw_line(&img, -1000, 5, 1000, 5, 0, RED);
    CHECK("a long line through the image is clipped to its width",
          count_set(&img) == 12, "count %d", count_set(&img));
    lucid_image_free(&img);
}

static void test_circles_rects(void) {
    lucid_image img;
    blank(&img, 9, 9);
    lucid_draw_circle(&img, 4, 4, 0, RED);
    int xs[32], ys[32];
    xs[0] = 4, ys[0] = 4;
    CHECK("circle r=0 sets one pixel", exactly(&img, xs, ys, 1), "count %d", count_set(&img));
    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_circle(&img, 4, 4, 1, RED);
    int px[] = {4, 3, 4, 5, 4}, py[] = {3, 4, 4, 4, 5};
    CHECK("circle r=1 is the 5-pixel plus", exactly(&img, px, py, 5), "count %d",
          count_set(&img));
    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_circle(&img, 4, 4, 2, RED);
    CHECK("circle r=2 has 13 pixels (dx^2+dy^2 <= 4)",
          count_set(&img) == 13 && !is_set(&img, 2, 2) && is_set(&img, 2, 4) &&
              is_set(&img, 3, 3),
          "count %d", count_set(&img));
    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_circle(&img, 0, 0, 2, RED);
    int cx[] = {0, 1, 2, 0, 1, 0}, cy[] = {0, 0, 0, 1, 1, 2};
    CHECK("circle clipped at the corner: its 6 pixels inside", exactly(&img, cx, cy, 6),
          "count %d", count_set(&img));

    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_rect(&img, 2, 2, 6, 5, 1, RED);
    int n = 0;
    for (int y = 2; y <= 5; y++)
        for (int x = 2; x <= 6; x++)
            if (x == 2 || x == 6 || y == 2 || y == 5) xs[n] = x, ys[n++] = y;
    CHECK("rectangle outline t=1: 14 border pixels", n == 14 && exactly(&img, xs, ys, n),
          "count %d", count_set(&img));
    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_rect(&img, 6, 5, 2, 2, 0, RED);
    CHECK("filled rectangle (corners in any order): 20 pixels", count_set(&img) == 20,
          "count %d", count_set(&img));
    memset(img.data, 0, 9 * 9 * 3);
    lucid_draw_rect(&img, 0, 0, 8, 8, 2, RED);
    CHECK("rectangle t=2 on the full 9x9 image: 81 - 25 pixels", count_set(&img) == 56,
          "count %d", count_set(&img));
    lucid_image_free(&img);
}

static void test_text(void) {
    lucid_image img;
    blank(&img, 40, 12);
    int w = lucid_draw_text(&img, 1, 1, "1", 1, RED);
    /* the glyph "1": ..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###. = 10 pixels */
    CHECK("text '1': width 5, 10 pixels, top of the stem at (3,1)",
          w == 5 && count_set(&img) == 10 && is_set(&img, 3, 1) && is_set(&img, 2, 7) &&
              is_set(&img, 4, 7) && !is_set(&img, 1, 1),
          "w %d count %d", w, count_set(&img));
    memset(img.data, 0, 40 * 12 * 3);
    w = lucid_draw_text(&img, 0, 0, "PERSON 0.9", 1, RED);
    int tw, th;
    lucid_text_size("PERSON 0.9", 1, &tw, &th);
    CHECK("text 'PERSON 0.9': width 59, height 7, ink only inside",
          w == 59 && tw == 59 && th == 7 && count_set(&img) > 40,
          "w %d tw %d th %d count %d", w, tw, th, count_set(&img));
    int outside = 0;
    for (int y = 7; y < 12; y++)
        for (int x = 0; x < 40; x++) outside += is_set(&img, x, y);
    CHECK("text draws nothing below its 7 rows", outside == 0, "%d pixels", outside);
    lucid_image_free(&img);
    blank(&img, 16, 16);
    lucid_draw_text(&img, 0, 0, "8", 2, RED);
    /* "8" has 17 ink pixels; at scale 2 each is a 2x2 block */
    CHECK("text scale 2: 4x the pixels of scale 1", count_set(&img) == 4 * 17, "count %d",
          count_set(&img));
    lucid_image_free(&img);
}

static void test_pose(void) {
    lucid_image img;
    blank(&img, 64, 64);
    float k[17 * 3];
    memset(k, 0, sizeof k);
    /* shoulders (5, 6) visible: limb 7 (5-6) is drawn in palette entry 0 */
    k[5 * 3 + 0] = 10.5f, k[5 * 3 + 1] = 30.5f, k[5 * 3 + 2] = 0.9f;
    k[6 * 3 + 0] = 50.5f, k[6 * 3 + 1] = 30.5f, k[6 * 3 + 2] = 0.9f;
    /* a low-confidence elbow: neither it nor its limb is drawn */
    k[7 * 3 + 0] = 10.5f, k[7 * 3 + 1] = 50.5f, k[7 * 3 + 2] = 0.3f;
    lucid_pose_draw_opts o = lucid_pose_draw_opts_default();
    o.boxes = 0;
    lucid_draw_pose(&img, NULL, 0, 0.9f, NULL, k, 17, &o);
    const uint8_t *mid = img.data + ((size_t)30 * 64 + 30) * 3;
    lucid_rgb limb = lucid_pose_palette[lucid_limb_color_idx[7]];
    CHECK("pose: the shoulder limb colours the pixels between the shoulders",
          mid[0] == limb.r && mid[1] == limb.g && mid[2] == limb.b,
          "got %d %d %d", mid[0], mid[1], mid[2]);
    lucid_rgb kc = lucid_pose_palette[lucid_kpt_color_idx[5]];
    const uint8_t *kp = img.data + ((size_t)30 * 64 + 10) * 3;
    CHECK("pose: keypoint disc in the keypoint colour",
          kp[0] == kc.r && kp[1] == kc.g && kp[2] == kc.b, "got %d %d %d", kp[0], kp[1], kp[2]);
    int below = 0;
    for (int y = 40; y < 64; y++)
        for (int x = 0; x < 64; x++) below += is_set(&img, x, y);
    CHECK("pose: keypoints with v <= 0.5 and their limbs are not drawn", below == 0,
          "%d pixels", below);

    memset(img.data, 0, 64 * 64 * 3);
    float box[4] = {8.2f, 20.7f, 40.1f, 60.9f};
    o = lucid_pose_draw_opts_default();
    o.line_width = 1;
    lucid_draw_pose(&img, box, 0, 0.87f, "person", NULL, 0, &o);
    CHECK("pose: box outline at floor of the corners, label drawn above",
          is_set(&img, 8, 40) && is_set(&img, 40, 40) && is_set(&img, 20, 60) &&
              !is_set(&img, 20, 40) && is_set(&img, 9, 15),
          "count %d", count_set(&img));
    /* NaN and absurd values do not crash */
    float bad[4] = {NAN, -1e30f, 1e30f, NAN};
    float badk[17 * 3];
    for (int i = 0; i < 17 * 3; i++) badk[i] = (i % 2) ? NAN : 1e20f;
    lucid_draw_pose(&img, bad, 3, NAN, "x", badk, 17, NULL);
    TEST_OK("pose: NaN / huge coordinates are harmless");
    lucid_image_free(&img);
}

static void test_letterbox(void) {
    lucid_letterbox_geom g;
    lucid_letterbox_geometry(640, 480, 320, &g);
    CHECK("geometry 640x480 -> 320: 320x240 at pad (0, 40), ratio 0.5",
          g.pw == 320 && g.ph == 240 && g.uw == 320 && g.uh == 240 && g.pad_x == 0 &&
              g.pad_y == 40 && g.rx == 0.5 && g.ry == 0.5,
          "pw %d ph %d uw %d uh %d pad %d %d r %g %g", g.pw, g.ph, g.uw, g.uh, g.pad_x,
          g.pad_y, g.rx, g.ry);
    lucid_letterbox_geometry(333, 500, 128, &g);
    /* r = 128/500: w = ceil(85.248) = 86, h = 128; pad_x = rint(21 - 0.1) = 21 */
    CHECK("geometry 333x500 -> 128: 86x128, pad_x 21",
          g.uw == 86 && g.uh == 128 && g.pad_x == 21 && g.pad_y == 0, "uw %d uh %d pad %d %d",
          g.uw, g.uh, g.pad_x, g.pad_y);
    float x = 100.25f, y = 333.5f;
    float nx = (float)(x * g.rx + g.pad_x), ny = (float)(y * g.ry + g.pad_y);
    lucid_letterbox_unmap(&g, &nx, &ny);
    CHECK("letterbox map then unmap returns the point", fabsf(nx - x) < 1e-3f &&
          fabsf(ny - y) < 1e-3f, "%g %g", nx, ny);
    float ox = -5, oy = 1000;
    lucid_letterbox_unmap(&g, &ox, &oy);
    CHECK("unmap clamps to the image", ox == 0 && oy == 500, "%g %g", ox, oy);

    lucid_image src, dst;
    lucid_image_alloc(ctx, 64, 32, &src);
    memset(src.data, 50, 64 * 32 * 3);
    lucid_status st = lucid_image_letterbox_val(ctx, &src, 32, &dst, &g);
    int ok = st == LUCID_OK && dst.w == 32 && dst.h == 32 && g.pad_y == 8 &&
             dst.data[0] == 114 && dst.data[((size_t)8 * 32) * 3] == 50 &&
             dst.data[((size_t)24 * 32) * 3] == 114;
    CHECK("letterbox_val: 64x32 -> 32: rows 8..23 image, pad 114", ok, "st %d %s", st,
          lucid_ctx_error(ctx));
    if (st == LUCID_OK) lucid_image_free(&dst);
    lucid_image_free(&src);
}

int main(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    if (lucid_ctx_create(&o, &ctx, NULL, 0) != LUCID_OK) {
        printf("not ok context\n");
        return 1;
    }
    if (!test_tmpdir(dir, sizeof dir, "lucid_image_io")) return 1;
    test_png_roundtrip();
    test_png_errors();
    test_lines();
    test_circles_rects();
    test_text();
    test_pose();
    test_letterbox();
    test_rmdir(dir);
    lucid_ctx_release(ctx);
    return test_exit();
}
