/*
 * test_data_decode.c — image decoding: colour kinds, bit depths, interlace,
 * progressive, EXIF orientation (pixels), and every kind of bad file
 * (truncated JPEG, garbage bytes, empty file, bad PNG CRC, truncated PNG):
 * a clear error naming the path, never a crash.
 */
#include "test.h"
#include "test_data_util.h"

static lucid_ctx *ctx;
static char root[256];

static void path_of(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/images/train/%s", root, name);
}

/* Flat 8x8 blocks of distinct colours: JPEG keeps them exact (DC only). */
static void block_image(uint8_t *pix, int w, int h) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int bx = x / 8, by = y / 8;
            uint8_t *p = pix + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(40 + bx * 23 % 180);
            p[1] = (uint8_t)(30 + by * 41 % 200);
            p[2] = (uint8_t)(60 + (bx * 7 + by * 13) % 150);
        }
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
    }
    return m;
}

static void test_jpeg_kinds(void) {
    int w = 32, h = 24;
    uint8_t rgb[32 * 24 * 3], gray[32 * 24], cmyk[32 * 24 * 4];
    block_image(rgb, w, h);
    for (int i = 0; i < w * h; i++) {
        gray[i] = rgb[i * 3];
        /* Adobe-inverted CMYK of the RGB colour with K ink 0 */
        cmyk[i * 4] = rgb[i * 3];
        cmyk[i * 4 + 1] = rgb[i * 3 + 1];
        cmyk[i * 4 + 2] = rgb[i * 3 + 2];
        cmyk[i * 4 + 3] = 255;
    }
    char p[512];
    lucid_image img;
    int o;

    path_of(p, sizeof p, "rgb.jpg");
    tdu_write_jpeg(p, rgb, w, h, 3, 100, 0, 1);
    lucid_status st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode jpeg rgb baseline", st == LUCID_OK && img.w == w && img.h == h &&
          max_diff(img.data, rgb, sizeof rgb) <= 1,
          "st %d %s diff %d", st, lucid_ctx_error(ctx),
          st ? -1 : max_diff(img.data, rgb, sizeof rgb));
    lucid_image_free(&img);

    path_of(p, sizeof p, "prog.jpg");
    tdu_write_jpeg(p, rgb, w, h, 3, 100, 1, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode jpeg progressive", st == LUCID_OK &&
          max_diff(img.data, rgb, sizeof rgb) <= 1, "st %d %s", st,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "gray.jpg");
    tdu_write_jpeg(p, gray, w, h, 1, 100, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    int ok = st == LUCID_OK && img.w == w;
    for (int i = 0; ok && i < w * h; i++)
        ok = img.data[i * 3] == img.data[i * 3 + 1] &&
             img.data[i * 3] == img.data[i * 3 + 2] &&
             abs(img.data[i * 3] - gray[i]) <= 1;
    CHECK("decode jpeg grayscale -> 3 equal channels", ok, "st %d %s", st,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "cmyk.jpg");
    tdu_write_jpeg(p, cmyk, w, h, 4, 100, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode jpeg CMYK (Adobe inverted) -> RGB", st == LUCID_OK &&
          max_diff(img.data, rgb, sizeof rgb) <= 2, "st %d %s diff %d", st,
          lucid_ctx_error(ctx), st ? -1 : max_diff(img.data, rgb, sizeof rgb));
    lucid_image_free(&img);
}

static void test_png_kinds(void) {
    int w = 13, h = 11; /* odd sizes exercise Adam7 passes */
    uint8_t rgb[13 * 11 * 3], rgba[13 * 11 * 4], g8[13 * 11], idx[13 * 11];
    uint16_t g16[13 * 11], rgb16[13 * 11 * 3];
    png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
    for (int i = 0; i < w * h; i++) {
        rgb[i * 3] = (uint8_t)(i * 7);
        rgb[i * 3 + 1] = (uint8_t)(i * 13 + 5);
        rgb[i * 3 + 2] = (uint8_t)(255 - i);
        memcpy(rgba + i * 4, rgb + i * 3, 3);
        rgba[i * 4 + 3] = (uint8_t)(i * 31); /* alpha must be ignored */
        g8[i] = (uint8_t)(i * 3);
        g16[i] = (uint16_t)(i * 4095 / (w * h - 1)); /* 12-bit data */
        for (int c = 0; c < 3; c++) rgb16[i * 3 + c] = (uint16_t)(rgb[i * 3 + c] * 257);
        idx[i] = (uint8_t)(i % 4);
    }
    char p[512];
    lucid_image img;
    int o;
    lucid_status st;

    path_of(p, sizeof p, "rgb_interlaced.png");
    tdu_write_png(p, rgb, w, h, PNG_COLOR_TYPE_RGB, 8, 1, 0, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode png rgb interlaced exact", st == LUCID_OK &&
          memcmp(img.data, rgb, sizeof rgb) == 0, "st %d %s", st,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "rgba.png");
    tdu_write_png(p, rgba, w, h, PNG_COLOR_TYPE_RGBA, 8, 0, 0, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode png rgba: alpha dropped", st == LUCID_OK &&
          memcmp(img.data, rgb, sizeof rgb) == 0, "st %d %s", st,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "pal.png");
    tdu_write_png(p, idx, w, h, PNG_COLOR_TYPE_PALETTE, 8, 0, 0, pal, 4, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    int ok = st == LUCID_OK;
    for (int i = 0; ok && i < w * h; i++)
        ok = img.data[i * 3] == pal[idx[i]].red &&
             img.data[i * 3 + 1] == pal[idx[i]].green &&
             img.data[i * 3 + 2] == pal[idx[i]].blue;
    CHECK("decode png palette expanded", ok, "st %d %s", st, lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "gray8.png");
    tdu_write_png(p, g8, w, h, PNG_COLOR_TYPE_GRAY, 8, 0, 0, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    ok = st == LUCID_OK;
    for (int i = 0; ok && i < w * h; i++)
        ok = img.data[i * 3] == g8[i] && img.data[i * 3 + 2] == g8[i];
    CHECK("decode png gray8 -> 3 channels", ok, "st %d %s", st, lucid_ctx_error(ctx));
    lucid_image_free(&img);

    /* 16-bit with 12 significant bits, without sBIT: the real range 0..4095
     * maps to 0..255 (a >>8 reduction would give at most 15). */
    path_of(p, sizeof p, "gray16.png");
    tdu_write_png(p, g16, w, h, PNG_COLOR_TYPE_GRAY, 16, 0, 0, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    ok = st == LUCID_OK;
    int maxv = 0;
    for (int i = 0; ok && i < w * h; i++) {
        int want = (int)((g16[i] * 255u + 2047) / 4095);
        ok = img.data[i * 3] == want;
        if (img.data[i * 3] > maxv) maxv = img.data[i * 3];
    }
    CHECK("decode png gray16 12-bit data reduced by real range", ok && maxv == 255,
          "st %d %s max %d", st, lucid_ctx_error(ctx), maxv);
    lucid_image_free(&img);

    path_of(p, sizeof p, "gray16_sbit.png");
    tdu_write_png(p, g16, w, h, PNG_COLOR_TYPE_GRAY, 16, 0, 12, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode png gray16 with sBIT 12", st == LUCID_OK && img.data[(w * h - 1) * 3] == 255,
          "st %d %s", st, lucid_ctx_error(ctx));
    lucid_image_free(&img);

    path_of(p, sizeof p, "rgb16.png");
    tdu_write_png(p, rgb16, w, h, PNG_COLOR_TYPE_RGB, 16, 1, 0, NULL, 0, 1);
    st = lucid_image_decode_file(ctx, p, &img, &o);
    CHECK("decode png rgb16 full range interlaced", st == LUCID_OK &&
          max_diff(img.data, rgb, sizeof rgb) == 0, "st %d %s", st,
          lucid_ctx_error(ctx));
    lucid_image_free(&img);
}

/* For each orientation o, a file of the stored pixels with EXIF o decodes
 * to the same pixels as the physically oriented image without EXIF. */
static void test_exif_pixels(void) {
    int w = 32, h = 16;
    uint8_t rgb[32 * 16 * 3];
    block_image(rgb, w, h);
    lucid_image stored = {w, h, rgb};
    int all_ok = 1;
    char why[256] = "";
    for (int o = 1; o <= 8; o++) {
        lucid_image disp;
        lucid_image_orient(ctx, &stored, o, &disp);
        char p1[512], p2[512], n1[64], n2[64];
        snprintf(n1, sizeof n1, "exif%d.jpg", o);
        snprintf(n2, sizeof n2, "rot%d.jpg", o);
        path_of(p1, sizeof p1, n1);
        path_of(p2, sizeof p2, n2);
        tdu_write_jpeg(p1, rgb, w, h, 3, 100, 0, o);
        tdu_write_jpeg(p2, disp.data, disp.w, disp.h, 3, 100, 0, 1);
        lucid_image a, b;
        int oa = 0, ob = 0;
        lucid_status s1 = lucid_image_decode_file(ctx, p1, &a, &oa);
        lucid_status s2 = lucid_image_decode_file(ctx, p2, &b, &ob);
        int ok = s1 == LUCID_OK && s2 == LUCID_OK && oa == o && ob == 1 &&
                 a.w == b.w && a.h == b.h &&
                 memcmp(a.data, b.data, (size_t)a.w * a.h * 3) == 0;
        if (!ok && all_ok) {
            snprintf(why, sizeof why, "orientation %d: st %d/%d o %d/%d size %dx%d vs %dx%d",
                     o, s1, s2, oa, ob, a.w, a.h, b.w, b.h);
            all_ok = 0;
        }
        /* PNG eXIf too, exactly */
        snprintf(n1, sizeof n1, "exif%d.png", o);
        path_of(p1, sizeof p1, n1);
        tdu_write_png(p1, rgb, w, h, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, o);
        lucid_image c;
        int oc = 0;
        lucid_status s3 = lucid_image_decode_file(ctx, p1, &c, &oc);
        if (!(s3 == LUCID_OK && oc == o && c.w == disp.w &&
              memcmp(c.data, disp.data, (size_t)c.w * c.h * 3) == 0) && all_ok) {
            snprintf(why, sizeof why, "png orientation %d: st %d o %d", o, s3, oc);
            all_ok = 0;
        }
        lucid_image_free(&a);
        lucid_image_free(&b);
        lucid_image_free(&c);
        lucid_image_free(&disp);
    }
    CHECK("exif orientation 1..8 applied to pixels (jpeg APP1, png eXIf)", all_ok, "%s", why);
}

static void expect_error(const char *name, const char *file, lucid_status want,
                         const char *needle) {
    char p[512];
    path_of(p, sizeof p, file);
    lucid_image img = {0, 0, NULL};
    lucid_ctx_clear_error(ctx);
    lucid_status st = lucid_image_decode_file(ctx, p, &img, NULL);
    const char *msg = lucid_ctx_error(ctx);
    CHECK(name, st == want && strstr(msg, p) && strstr(msg, needle) &&
          img.data == NULL, "status %s, message '%s'", lucid_status_name(st), msg);
    lucid_image_free(&img);
}

static void test_bad_files(void) {
    int w = 64, h = 48;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) rgb[i] = (uint8_t)(i * 7 + i / 97);
    char p[512];
    uint8_t *buf;
    path_of(p, sizeof p, "good.jpg");
    tdu_write_jpeg(p, rgb, w, h, 3, 90, 0, 1);
    long n = tdu_read_file(p, &buf);
    path_of(p, sizeof p, "truncated.jpg");
    tdu_write_bytes(p, buf, (size_t)(n * 6 / 10));
    expect_error("truncated jpeg -> format error naming the file", "truncated.jpg",
                 LUCID_ERR_FORMAT, "JPEG");
    path_of(p, sizeof p, "header_only.jpg");
    tdu_write_bytes(p, buf, 200);
    expect_error("jpeg cut inside the header -> format error", "header_only.jpg",
                 LUCID_ERR_FORMAT, "JPEG");
    /* JPEG magic followed by garbage */
    uint8_t junk[4096];
    for (int i = 0; i < 4096; i++) junk[i] = (uint8_t)(i * 2654435761u >> 13);
    junk[0] = 0xFF; junk[1] = 0xD8; junk[2] = 0xFF;
    path_of(p, sizeof p, "magic_garbage.jpg");
    tdu_write_bytes(p, junk, sizeof junk);
    expect_error("jpeg magic + garbage -> format error", "magic_garbage.jpg",
                 LUCID_ERR_FORMAT, "JPEG");
    junk[0] = 0x12;
    path_of(p, sizeof p, "garbage.jpg");
    tdu_write_bytes(p, junk, sizeof junk);
    expect_error("garbage bytes -> format error", "garbage.jpg", LUCID_ERR_FORMAT,
                 "not a JPEG or PNG");
    path_of(p, sizeof p, "empty.jpg");
    tdu_write_bytes(p, junk, 0);
    expect_error("empty file -> io error", "empty.jpg", LUCID_ERR_IO, "empty");
    expect_error("missing file -> io error", "nope.jpg", LUCID_ERR_IO, "cannot open");
    free(buf);

    path_of(p, sizeof p, "good.png");
    tdu_write_png(p, rgb, w, h, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, 1);
    n = tdu_read_file(p, &buf);
    /* flip one byte inside the IDAT data: CRC mismatch */
    long idat = -1;
    for (long i = 8; i + 4 < n; i++)
        if (!memcmp(buf + i, "IDAT", 4)) { idat = i; break; }
    uint8_t *bad = malloc(n);
    memcpy(bad, buf, n);
    long dlen = (long)buf[idat - 4] << 24 | buf[idat - 3] << 16 |
                buf[idat - 2] << 8 | buf[idat - 1];
    bad[idat + 4 + dlen] ^= 0x55; /* the CRC field of IDAT */
    path_of(p, sizeof p, "badcrc.png");
    tdu_write_bytes(p, bad, n);
    expect_error("png with bad CRC -> format error", "badcrc.png",
                 LUCID_ERR_FORMAT, "CRC");
    memcpy(bad, buf, n);
    bad[idat + 10] ^= 0x55; /* corrupt compressed data (CRC now wrong too) */
    path_of(p, sizeof p, "baddata.png");
    tdu_write_bytes(p, bad, n);
    expect_error("png with corrupt IDAT data -> format error", "baddata.png",
                 LUCID_ERR_FORMAT, "corrupt PNG");
    path_of(p, sizeof p, "truncated.png");
    tdu_write_bytes(p, buf, n / 2);
    expect_error("truncated png -> format error", "truncated.png",
                 LUCID_ERR_FORMAT, "PNG");
    free(bad);
    free(buf);
    free(rgb);
}

static void test_resize(void) {
    /* a flat image stays flat; a 2x downscale of a 2x2 checker of 0/200
     * averages to 100 (half-pixel centres) */
    lucid_image a, b;
    lucid_image_alloc(ctx, 8, 8, &a);
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 8; x++)
            for (int c = 0; c < 3; c++)
                a.data[(y * 8 + x) * 3 + c] = ((x + y) & 1) ? 200 : 0;
    lucid_image_resize(ctx, &a, 4, 4, &b);
    int ok = 1;
    for (int i = 0; i < 4 * 4 * 3; i++) ok &= b.data[i] == 100;
    CHECK("resize INTER_LINEAR half-pixel 2x down", ok, "got %d", b.data[0]);
    lucid_image_free(&b);
    lucid_image_free(&a);
}

static void test_hsv(void) {
    lucid_image a, b;
    lucid_image_alloc(ctx, 64, 64, &a);
    for (int i = 0; i < 64 * 64; i++) {
        a.data[i * 3] = (uint8_t)(i * 7);
        a.data[i * 3 + 1] = (uint8_t)(i * 13 + 40);
        a.data[i * 3 + 2] = (uint8_t)(255 - i % 256);
    }
    a.data[0] = a.data[1] = a.data[2] = 77; /* a gray pixel */
    lucid_image_alloc(ctx, 64, 64, &b);
    memcpy(b.data, a.data, 64 * 64 * 3);
    lucid_aug_hsv_apply(&b, 0, 0, 0);
    /* 8-bit HSV quantises hue to 180 steps, so the round trip is close,
     * not exact (as cv2); grays are exact */
    int md = max_diff(a.data, b.data, 64 * 64 * 3);
    CHECK("hsv zero gains: round trip within 4 levels, gray exact",
          md <= 4 && b.data[0] == 77 && b.data[2] == 77, "max diff %d", md);
    memcpy(b.data, a.data, 64 * 64 * 3);
    lucid_aug_hsv_apply(&b, 0, -1, 0);
    int gray = 1;
    for (int i = 0; i < 64 * 64; i++) {
        int v = a.data[i * 3] > a.data[i * 3 + 1] ? a.data[i * 3] : a.data[i * 3 + 1];
        v = v > a.data[i * 3 + 2] ? v : a.data[i * 3 + 2];
        gray &= b.data[i * 3] == v && b.data[i * 3 + 1] == v && b.data[i * 3 + 2] == v;
    }
    CHECK("hsv saturation gain -1: gray at V = max(R,G,B)", gray, "%s", "");
    memcpy(b.data, a.data, 64 * 64 * 3);
    lucid_aug_hsv_apply(&b, 0, 0, -1);
    int black = 1;
    for (int i = 0; i < 64 * 64 * 3; i++) black &= b.data[i] == 0;
    CHECK("hsv value gain -1: black", black, "%s", "");
    memcpy(b.data, a.data, 64 * 64 * 3);
    lucid_aug_hsv_apply(&b, 0.5, 0, 0); /* hue + 90 of 180: opposite hue */
    /* pure red (255,0,0) -> cyan (0,255,255) */
    lucid_image r;
    lucid_image_alloc(ctx, 1, 1, &r);
    r.data[0] = 255; r.data[1] = 0; r.data[2] = 0;
    lucid_aug_hsv_apply(&r, 0.5, 0, 0);
    CHECK("hsv hue +90 (of 180): red -> cyan", r.data[0] == 0 && r.data[1] == 255 &&
          r.data[2] == 255, "got %d %d %d", r.data[0], r.data[1], r.data[2]);
    lucid_image_free(&r);
    lucid_image_free(&a);
    lucid_image_free(&b);
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    tdu_make_split(root, sizeof root, "train");
    test_jpeg_kinds();
    test_png_kinds();
    test_exif_pixels();
    test_bad_files();
    test_resize();
    test_hsv();
    tdu_rm_rf(root);
    lucid_ctx_release(ctx);
    return test_exit();
}
