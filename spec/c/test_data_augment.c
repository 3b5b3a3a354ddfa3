/*
 * test_data_augment.c — augmentation and loader properties:
 *   - visible keypoints drawn on marked pixels stay on their marks through
 *     mosaic, random perspective and flips (pixels and labels share M);
 *   - fliplr swaps left/right keypoints by flip_idx; v=0 stays v=0;
 *   - keypoints that leave the canvas get v=0;
 *   - an EXIF-rotated file and the physically rotated file give identical
 *     batches (labels stored in either frame, per exif_labels);
 *   - the tiled warp (mosaic sampled without writing the canvas out, HSV
 *     and flips on the way, HWC or CHW) equals the warp of the written
 *     canvas byte for byte;
 *   - batches are byte-identical with 0 (the calling thread), 1, 2 and 4
 *     worker threads;
 *   - overflow of max_gt is reported; the short last batch is padded;
 *   - validation letterbox.
 */
#include "test.h"
#include "test_data_util.h"
#include "data/data_internal.h"

static lucid_ctx *ctx;

#define K5 5
static const int FLIP5[K5] = {0, 2, 1, 4, 3};
static const uint8_t MARK[K5][3] = {
    {255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 0}, {255, 0, 255}};
static const uint8_t BG[3] = {60, 60, 60};

static lucid_pose_spec spec5(void) {
    lucid_pose_spec s;
    memset(&s, 0, sizeof s);
    s.nkpt = K5;
    s.ndim = 3;
    s.has_flip_idx = 1;
    memcpy(s.flip_idx, FLIP5, sizeof FLIP5);
    s.nc = 1;
    return s;
}

/* Image i of the marked dataset: w x h, background BG, keypoints 0..3 as
 * 13x13 blocks of MARK[k]; keypoint 4 is v=0 (no mark). One instance. */
static void make_marked(const char *root, int i, int w, int h) {
    uint8_t *pix = malloc((size_t)w * h * 3);
    for (int p = 0; p < w * h; p++) memcpy(pix + p * 3, BG, 3);
    int cx[K5], cy[K5];
    for (int k = 0; k < 4; k++) {
        cx[k] = w / 5 + (k * 37 + i * 11) % (w * 3 / 5);
        cy[k] = h / 5 + (k * 53 + i * 29) % (h * 3 / 5);
        for (int y = cy[k] - 6; y <= cy[k] + 6; y++)
            for (int x = cx[k] - 6; x <= cx[k] + 6; x++)
                memcpy(pix + ((size_t)y * w + x) * 3, MARK[k], 3);
    }
    char p[600], line[1024];
    snprintf(p, sizeof p, "%s/images/train/m%02d.png", root, i);
    tdu_write_png(p, pix, w, h, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, 1);
    int n = snprintf(line, sizeof line, "0 0.5 0.5 0.9 0.9");
    for (int k = 0; k < 4; k++)
        n += snprintf(line + n, sizeof line - n, " %.6f %.6f %d",
                      (cx[k] + 0.5) / w, (cy[k] + 0.5) / h, k == 3 ? 1 : 2);
    n += snprintf(line + n, sizeof line - n, " 0 0 0\n");
    snprintf(p, sizeof p, "%s/labels/train/m%02d.txt", root, i);
    tdu_write_text(p, line);
    free(pix);
}

static lucid_dataset *open_marked(char *root, size_t rlen, int n, int imgsz) {
    tdu_make_split(root, rlen, "train");
    int sizes[4][2] = {{200, 150}, {160, 210}, {240, 180}, {300, 120}};
    for (int i = 0; i < n; i++) make_marked(root, i, sizes[i % 4][0], sizes[i % 4][1]);
    lucid_dataset_options o = lucid_dataset_options_default();
    o.spec = spec5();
    o.imgsz = imgsz;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/images/train", root);
    lucid_dataset *ds = NULL;
    if (lucid_dataset_open_yolo(ctx, dir, &o, &ds) != LUCID_OK)
        printf("# open marked: %s\n", lucid_ctx_error(ctx));
    return ds;
}

static void test_marked(lucid_dataset *ds, const char *name, float mosaic,
                        float fliplr) {
    lucid_aug_params p = lucid_aug_params_default();
    p.mosaic = mosaic;
    p.fliplr = fliplr;
    p.degrees = 10;
    p.shear = 5;
    p.scale = 0.3f;
    p.translate = 0.1f;
    p.hsv_h = p.hsv_s = p.hsv_v = 0;
    int S = 256;
    lucid_image out;
    lucid_image_alloc(ctx, S, S, &out);
    lucid_instances in;
    memset(&in, 0, sizeof in);
    lucid_aug_work work;
    memset(&work, 0, sizeof work);
    int checked = 0, bad = 0, v0bad = 0, oob = 0, inst = 0;
    char why[256] = "";
    for (uint64_t epoch = 0; epoch < 4; epoch++)
        for (int64_t i = 0; i < lucid_dataset_size(ds); i++) {
            lucid_status st = lucid_augment_sample(ctx, ds, &p, S, 7, epoch, i,
                                                   &work, &out, &in, NULL);
            if (st != LUCID_OK) { bad++; snprintf(why, sizeof why, "%s", lucid_ctx_error(ctx)); continue; }
            inst += in.n;
            for (int m = 0; m < in.n; m++)
                for (int k = 0; k < K5; k++) {
                    const float *kp = in.kpts + ((size_t)m * K5 + k) * 3;
                    int orig = fliplr >= 1 ? FLIP5[k] : k;
                    if (orig == 4 && kp[2] != 0) v0bad++;
                    if (kp[2] == 0) continue;
                    if (kp[0] < 0 || kp[0] > S || kp[1] < 0 || kp[1] > S) oob++;
                    int x = (int)kp[0], y = (int)kp[1];
                    if (x >= S) x = S - 1;
                    if (y >= S) y = S - 1;
                    const uint8_t *px = out.data + ((size_t)y * S + x) * 3;
                    checked++;
                    if (memcmp(px, MARK[orig], 3) != 0) {
                        if (!bad)
                            snprintf(why, sizeof why,
                                     "epoch %llu sample %lld kpt %d (orig %d) at %.2f,%.2f: "
                                     "pixel %d,%d,%d", (unsigned long long)epoch,
                                     (long long)i, k, orig, kp[0], kp[1], px[0], px[1], px[2]);
                        bad++;
                    }
                }
        }
    CHECK(name, bad == 0 && checked > 40 && inst > 8,
          "%d of %d visible keypoints off their mark, %d instances: %s", bad,
          checked, inst, why);
    char n2[160];
    snprintf(n2, sizeof n2, "%s: v=0 stays 0, visible keypoints inside canvas", name);
    CHECK(n2, v0bad == 0 && oob == 0, "v0 broken %d, outside %d", v0bad, oob);
    lucid_image_free(&out);
    lucid_instances_free(&in);
    lucid_aug_work_free(&work);
}

static void test_flip_unit(void) {
    lucid_image img;
    lucid_image_alloc(ctx, 4, 1, &img);
    for (int i = 0; i < 12; i++) img.data[i] = (uint8_t)i;
    lucid_instances in;
    memset(&in, 0, sizeof in);
    lucid_instances_reserve(ctx, &in, 1, 3);
    in.n = 1;
    in.cls[0] = 0;
    float box[4] = {0.5f, 0, 3.0f, 1}, kp[9] = {1, 0.5f, 2, 1.5f, 0.5f, 2, 3.5f, 0.5f, 0};
    memcpy(in.box, box, sizeof box);
    memcpy(in.kpts, kp, sizeof kp);
    int fi[3] = {0, 2, 1};
    lucid_aug_fliplr(&img, &in, fi);
    CHECK("fliplr mirrors pixels", img.data[0] == 9 && img.data[3] == 6 &&
          img.data[9] == 0, "got %d %d %d", img.data[0], img.data[3], img.data[9]);
    CHECK("fliplr: box x -> W - x", in.box[0] == 1.0f && in.box[2] == 3.5f,
          "box %g %g", in.box[0], in.box[2]);
    CHECK("fliplr swaps left/right keypoints by flip_idx, v=0 stays 0",
          in.kpts[0] == 3 && in.kpts[2] == 2 &&          /* kpt0: x 4-1 */
          in.kpts[3] == 0.5f && in.kpts[5] == 0 &&        /* new 1 = old 2 */
          in.kpts[6] == 2.5f && in.kpts[8] == 2,          /* new 2 = old 1 */
          "kpts %g %g | %g %g | %g %g", in.kpts[0], in.kpts[2], in.kpts[3],
          in.kpts[5], in.kpts[6], in.kpts[8]);
    /* a keypoint moved off the canvas gets v = 0 */
    double M[9] = {1, 0, 10, 0, 1, 0, 0, 0, 1};
    in.n = 1;
    float kp2[9] = {1, 0.5f, 2, 3.5f, 0.5f, 2, 0.2f, 0.5f, 1};
    memcpy(in.kpts, kp2, sizeof kp2);
    float box2[4] = {0, 0, 4, 4};
    memcpy(in.box, box2, sizeof box2);
    lucid_aug_perspective_labels(&in, M, 13, 8, 1.0);
    CHECK("perspective labels: keypoint leaving the canvas gets v=0",
          in.n == 1 && in.kpts[2] == 2 && in.kpts[5] == 0 && in.kpts[8] == 1 &&
          in.kpts[3] == 13 && in.kpts[0] == 11 && in.box[2] == 13,
          "n %d v %g %g %g x %g", in.n, in.kpts[2], in.kpts[5],
          in.kpts[8], in.kpts[3]);
    float b1[4] = {0, 0, 10, 10}, b2[4] = {0, 0, 1.5f, 10}, b3[4] = {0, 0, 10, 10};
    CHECK("box_candidates: w <= 2 px dropped, same box kept",
          !lucid_box_candidate(b1, b2, 2, 100, 0.1f) &&
          lucid_box_candidate(b1, b3, 2, 100, 0.1f), "%s", "");
    lucid_image_free(&img);
    lucid_instances_free(&in);
}

/* Independent reference of the warp: dst pixel centre -> M^-1 -> source
 * grid (minus .5), 1/32 weights, border 114. Used with matrices whose
 * coordinates are exact in binary. */
static void ref_warp(const lucid_image *src, const double Mi[9], lucid_image *dst) {
    for (int Y = 0; Y < dst->h; Y++)
        for (int X = 0; X < dst->w; X++) {
            double sx = Mi[0] * (X + 0.5) + Mi[1] * (Y + 0.5) + Mi[2] - 0.5;
            double sy = Mi[3] * (X + 0.5) + Mi[4] * (Y + 0.5) + Mi[5] - 0.5;
            int qx = (int)floor(sx * 32), qy = (int)floor(sy * 32);
            int x0 = (int)floor(qx / 32.0), y0 = (int)floor(qy / 32.0);
            int fx = qx - 32 * x0, fy = qy - 32 * y0;
            for (int c = 0; c < 3; c++) {
                int acc = 512;
                for (int j = 0; j < 2; j++)
                    for (int i = 0; i < 2; i++) {
                        int x = x0 + i, y = y0 + j;
                        int w = (i ? fx : 32 - fx) * (j ? fy : 32 - fy);
                        int v = (x >= 0 && y >= 0 && x < src->w && y < src->h)
                                    ? src->data[((size_t)y * src->w + x) * 3 + c] : 114;
                        acc += w * v;
                    }
                dst->data[((size_t)Y * dst->w + X) * 3 + c] = (uint8_t)(acc >> 10);
            }
        }
}

static void test_warp_reference(void) {
    lucid_image src, a, b;
    lucid_image_alloc(ctx, 100, 80, &src);
    for (int i = 0; i < 100 * 80 * 3; i++) src.data[i] = (uint8_t)((i * 2654435761u) >> 24);
    lucid_image_alloc(ctx, 96, 96, &a);
    lucid_image_alloc(ctx, 96, 96, &b);
    /* scale 2 / 0.5 with translations: the axis-aligned path */
    double M1[9] = {2, 0, -7.5, 0, 0.5, 30.25, 0, 0, 1};
    double M1i[9] = {0.5, 0, 3.75, 0, 2, -60.5, 0, 0, 1};
    /* a 90-degree rotation: the general affine path */
    double M2[9] = {0, -1, 90, 1, 0, -4, 0, 0, 1};
    double M2i[9] = {0, 1, 4, -1, 0, 90, 0, 0, 1};
    lucid_aug_warp(ctx, &src, M1, &a);
    ref_warp(&src, M1i, &b);
    CHECK("warp (axis-aligned path) equals the reference bilinear bytes",
          memcmp(a.data, b.data, 96 * 96 * 3) == 0, "%s", "differs");
    lucid_aug_warp(ctx, &src, M2, &a);
    ref_warp(&src, M2i, &b);
    CHECK("warp (general affine path) equals the reference bilinear bytes",
          memcmp(a.data, b.data, 96 * 96 * 3) == 0, "%s", "differs");
    lucid_image_free(&src);
    lucid_image_free(&a);
    lucid_image_free(&b);
}

/* Reference of the axis-aligned warp with the coordinates rounded as the
 * engine documents (cv2.warpAffine: X and offset terms to 1/1024 px, then
 * >> 5), bilinear in 1/32 px, border 114: one pixel at a time. */
static int ref_coord(double v) {
    return (int)lrint(v < -1e9 ? -1e9 : v > 1e9 ? 1e9 : v);
}

static void ref_warp_fixed(const lucid_image *src, const double Mi[9],
                           lucid_image *dst) {
    for (int Y = 0; Y < dst->h; Y++)
        for (int X = 0; X < dst->w; X++) {
            int64_t qx = ((int64_t)ref_coord(Mi[0] * (X + 0.5) * 1024.0) +
                          ref_coord((Mi[2] - 0.5) * 1024.0)) >> 5;
            int64_t qy = (int64_t)ref_coord((Mi[4] * (Y + 0.5) + Mi[5] - 0.5) * 1024.0) >> 5;
            if (qx < -(1 << 26)) qx = -(1 << 26);
            if (qx > (1 << 26)) qx = 1 << 26;
            if (qy < -(1 << 26)) qy = -(1 << 26);
            if (qy > (1 << 26)) qy = 1 << 26;
            int x0 = (int)(qx >> 5), y0 = (int)(qy >> 5);
            int fx = (int)(qx & 31), fy = (int)(qy & 31);
            for (int c = 0; c < 3; c++) {
                int acc = 512;
                for (int j = 0; j < 2; j++)
                    for (int i = 0; i < 2; i++) {
                        int x = x0 + i, y = y0 + j;
                        int w = (i ? fx : 32 - fx) * (j ? fy : 32 - fy);
                        int v = (x >= 0 && y >= 0 && x < src->w && y < src->h)
                                    ? src->data[((size_t)y * src->w + x) * 3 + c] : 114;
                        acc += w * v;
                    }
                dst->data[((size_t)Y * dst->w + X) * 3 + c] = (uint8_t)(acc >> 10);
            }
        }
}

/* lucid_aug_warp_tiles on the 4 tiles of a mosaic == the reference warp of
 * the written canvas, then HSV and flips; HWC and CHW; random pose-default
 * matrices and hand-made ones (far outside, strong up/down scaling). */
static void test_warp_tiles(void) {
    const int s = 96, S2 = 2 * s;
    int sizes[4][2] = {{96, 70}, {50, 96}, {96, 96}, {33, 17}};
    lucid_image im[4], canvas, ref, got, chw_img;
    const lucid_image *ip[4];
    lucid_labels lab;
    memset(&lab, 0, sizeof lab);
    const lucid_labels *lp[4] = {&lab, &lab, &lab, &lab};
    uint32_t h = 12345;
    for (int i = 0; i < 4; i++) {
        lucid_image_alloc(ctx, sizes[i][0], sizes[i][1], &im[i]);
        for (int k = 0; k < sizes[i][0] * sizes[i][1] * 3; k++) {
            h = h * 1664525u + 1013904223u;
            im[i].data[k] = (uint8_t)(h >> 24);
        }
        ip[i] = &im[i];
    }
    lucid_image_alloc(ctx, S2, S2, &canvas);
    lucid_image_alloc(ctx, s, s, &ref);
    lucid_image_alloc(ctx, s, s, &got);
    lucid_image_alloc(ctx, s, s, &chw_img); /* 3 s s bytes as planes */
    lucid_instances in;
    memset(&in, 0, sizeof in);
    lucid_aug_params p = lucid_aug_params_default();
    p.scale = 0.9f;
    p.translate = 0.45f;
    int cases = 0, bad = 0;
    char why[200] = "";
    lucid_rng_stream r;
    for (int k = 0; k < 48; k++) {
        lucid_rng_stream_init(&r, 99, 0, (uint64_t)k);
        int xc = (int)lucid_rng_uniform(&r, 0, S2), yc = (int)lucid_rng_uniform(&r, 0, S2);
        if (k % 8 == 1) xc = 0;
        if (k % 8 == 2) yc = S2;
        lucid_tiles tl;
        lucid_aug_mosaic4_tiles(ctx, ip, lp, 0, s, xc, yc, &tl, &in);
        lucid_aug_mosaic4(ctx, ip, lp, 0, s, xc, yc, &canvas, &in);
        double M[9], sc, Mi[9];
        lucid_aug_perspective_matrix(&p, S2, S2, s, s, &r, M, &sc);
        if (k % 6 == 3) { M[0] = 4.25; M[4] = 3.5; }           /* upscale */
        if (k % 6 == 4) { M[0] = 0.3; M[4] = 0.45; }           /* downscale */
        if (k % 12 == 5) M[2] = -1e7;                           /* far outside */
        if (k % 12 == 11) M[5] = 5e8;
        /* Mi of an axis-aligned M, rounded as the engine's cofactor
         * inverse rounds it */
        memset(Mi, 0, sizeof Mi);
        double id = 1.0 / (M[0] * M[4]);
        Mi[0] = M[4] * id; Mi[4] = M[0] * id;
        Mi[2] = -(M[2] * M[4]) * id; Mi[5] = -(M[0] * M[5]) * id; Mi[8] = 1;
        if (!lucid_aug_warp_is_axis_aligned(M)) { bad++; snprintf(why, sizeof why, "case %d not axis-aligned", k); continue; }
        for (int f = 0; f < 8; f++) {
            int flips = f & 3, hsv = f >> 2;
            ref_warp_fixed(&canvas, Mi, &ref);
            if (hsv) lucid_aug_hsv_apply(&ref, 0.3, -0.4, 0.25);
            if (flips & LUCID_FLIP_UD) {
                for (int y = 0; y < s / 2; y++)
                    for (int b = 0; b < s * 3; b++) {
                        uint8_t t = ref.data[y * s * 3 + b];
                        ref.data[y * s * 3 + b] = ref.data[(s - 1 - y) * s * 3 + b];
                        ref.data[(s - 1 - y) * s * 3 + b] = t;
                    }
            }
            if (flips & LUCID_FLIP_LR) {
                for (int y = 0; y < s; y++)
                    for (int x = 0; x < s / 2; x++)
                        for (int c = 0; c < 3; c++) {
                            uint8_t *a = ref.data + (y * s + x) * 3 + c;
                            uint8_t *b = ref.data + (y * s + s - 1 - x) * 3 + c;
                            uint8_t t = *a; *a = *b; *b = t;
                        }
            }
            lucid_warp_out o = lucid_warp_out_hwc(&got);
            o.flips = flips; o.hsv = hsv; o.rh = 0.3; o.rs = -0.4; o.rv = 0.25;
            memset(got.data, 0, (size_t)s * s * 3);
            lucid_status st = lucid_aug_warp_tiles(ctx, &tl, M, &o);
            lucid_warp_out oc = lucid_warp_out_chw(chw_img.data, s, s);
            oc.flips = flips; oc.hsv = hsv; oc.rh = 0.3; oc.rs = -0.4; oc.rv = 0.25;
            memset(chw_img.data, 0, (size_t)s * s * 3);
            if (st == LUCID_OK) st = lucid_aug_warp_tiles(ctx, &tl, M, &oc);
            int same = st == LUCID_OK && !memcmp(got.data, ref.data, (size_t)s * s * 3);
            for (int i = 0; same && i < s * s; i++)
                for (int c = 0; c < 3; c++)
                    if (chw_img.data[c * s * s + i] != ref.data[i * 3 + c]) same = 0;
            cases++;
            if (!same && !bad++)
                snprintf(why, sizeof why, "case %d (xc %d yc %d M %g %g %g %g) flips %d hsv %d: %s",
                         k, xc, yc, M[0], M[2], M[4], M[5], flips, hsv,
                         st == LUCID_OK ? "bytes differ" : lucid_ctx_error(ctx));
        }
    }
    CHECK("tiled warp (mosaic not written out; HSV, flips; HWC and CHW) == reference warp of the canvas",
          bad == 0 && cases == 48 * 8, "%d of %d cases: %s", bad, cases, why);
    for (int i = 0; i < 4; i++) lucid_image_free(&im[i]);
    lucid_image_free(&canvas);
    lucid_image_free(&ref);
    lucid_image_free(&got);
    lucid_image_free(&chw_img);
    lucid_instances_free(&in);
}

/* ------------------------------------------------------- batch compare */

/* Copy of all batches of `epochs` epochs (concatenated bytes). */
typedef struct run_bytes { uint8_t *data; size_t len, cap; int nb; } run_bytes;

static void rb_add(run_bytes *r, const void *p, size_t n) {
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2;
        r->data = realloc(r->data, r->cap);
    }
    memcpy(r->data + r->len, p, n);
    r->len += n;
}

static lucid_status run_loader(lucid_dataset *ds, int threads, int batch,
                               int imgsz, int epochs, const lucid_aug_params *p,
                               run_bytes *out) {
    lucid_loader_options o = lucid_loader_options_default();
    o.batch = batch;
    o.imgsz = imgsz;
    o.threads = threads;
    o.prefetch = 2;
    o.max_gt = 8;
    o.seed = 1234;
    lucid_loader *ld;
    lucid_status cst = lucid_loader_create(ctx, ds, &o, &ld);
    if (cst != LUCID_OK) return cst;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < epochs; e++) {
        lucid_loader_start_epoch(ld, (uint64_t)e, p);
        lucid_batch *b;
        for (;;) {
            lucid_status st = lucid_loader_next(ld, &b);
            if (st != LUCID_OK) { lucid_loader_release(ld); return st; }
            if (!b) break;
            const lucid_tensor *ts[7] = {b->images, b->cls, b->boxes, b->kpts,
                                         b->mask, b->counts, b->hsv};
            for (int i = 0; i < 7; i++)
                rb_add(out, lucid_tensor_data(ts[i]), lucid_tensor_nbytes(ts[i]));
            rb_add(out, &b->n, sizeof b->n);
            rb_add(out, b->sample_index, sizeof(int64_t) * batch);
            out->nb++;
        }
    }
    lucid_loader_release(ld);
    return LUCID_OK;
}

static void test_threads(lucid_dataset *ds, const char *name, int batch,
                         int imgsz, int epochs) {
    lucid_aug_params p = lucid_aug_params_default();
    p.degrees = 5;
    p.shear = 2;
    /* threads 0: the batches are made by lucid_loader_next itself */
    run_bytes r[4];
    int th[4] = {1, 2, 4, 0};
    memset(r, 0, sizeof r);
    lucid_status st = LUCID_OK;
    for (int i = 0; i < 4 && st == LUCID_OK; i++)
        st = run_loader(ds, th[i], batch, imgsz, epochs, &p, &r[i]);
    int same = st == LUCID_OK;
    for (int i = 1; i < 4 && same; i++)
        same = r[0].len == r[i].len && !memcmp(r[0].data, r[i].data, r[0].len);
    CHECK(name, same && r[0].nb > 0, "st %d %s; batches %d/%d/%d/%d bytes %zu/%zu/%zu/%zu",
          st, lucid_ctx_error(ctx), r[0].nb, r[1].nb, r[2].nb, r[3].nb, r[0].len,
          r[1].len, r[2].len, r[3].len);
    for (int i = 0; i < 4; i++) free(r[i].data);
}

/* Loader options whose batch buffers cannot be sized in int64 (the
 * products used to wrap to a small allocation) are a named ERR_ARG before
 * anything is allocated; a large but representable batch is not. */
static void test_loader_size_overflow(lucid_dataset *ds) {
    lucid_loader_options o = lucid_loader_options_default();
    o.threads = 0;
    o.batch = 1 << 30;
    o.imgsz = 1 << 30;
    lucid_loader *ld = NULL;
    lucid_status st = lucid_loader_create(ctx, ds, &o, &ld);
    CHECK("loader: batch x imgsz^2 overflowing int64 is a named error",
          st == LUCID_ERR_ARG && !ld &&
              strstr(lucid_ctx_error(ctx), "tensor size overflows"),
          "status %d: %s", st, lucid_ctx_error(ctx));
    if (ld) lucid_loader_release(ld);
    o.batch = 2; /* control: the same call with sizes that fit */
    o.imgsz = 64;
    ld = NULL;
    st = lucid_loader_create(ctx, ds, &o, &ld);
    CHECK("loader: size overflow control (batch 2, imgsz 64) opens",
          st == LUCID_OK && ld, "%s", lucid_ctx_error(ctx));
    if (ld) lucid_loader_release(ld);
}

/* The loader's rows (HSV fused into the CHW transpose) equal
 * lucid_augment_sample for the same (seed, epoch, index). */
static void test_loader_matches_sample(lucid_dataset *ds) {
    int S = 256;
    lucid_aug_params p = lucid_aug_params_default();
    p.degrees = 3;
    lucid_loader_options o = lucid_loader_options_default();
    o.batch = 2;
    o.imgsz = S;
    o.threads = 2;
    o.max_gt = 4;
    o.seed = 5;
    lucid_loader *ld;
    if (lucid_loader_create(ctx, ds, &o, &ld) != LUCID_OK) {
        TEST_FAIL("loader rows == augment_sample", "%s", lucid_ctx_error(ctx));
        return;
    }
    lucid_loader_start_epoch(ld, 1, &p);
    lucid_image img;
    lucid_image_alloc(ctx, S, S, &img);
    lucid_instances in;
    memset(&in, 0, sizeof in);
    lucid_batch *b;
    int rows = 0, bad = 0;
    while (lucid_loader_next(ld, &b) == LUCID_OK && b) {
        for (int j = 0; j < b->n; j++) {
            float hsv[3];
            lucid_augment_sample(ctx, ds, &p, S, 5, 1, b->sample_index[j], NULL,
                                 &img, &in, hsv);
            const uint8_t *chw = (const uint8_t *)lucid_tensor_data(b->images) +
                                 (size_t)j * 3 * S * S;
            for (int i = 0; i < S * S && !bad; i++)
                for (int c = 0; c < 3; c++)
                    if (chw[(size_t)c * S * S + i] != img.data[i * 3 + c]) bad = 1;
            const float *h = (const float *)lucid_tensor_data(b->hsv) + j * 3;
            if (h[0] != hsv[0] || h[1] != hsv[1] || h[2] != hsv[2]) bad = 2;
            const float *kp = (const float *)lucid_tensor_data(b->kpts) + (size_t)j * 4 * K5 * 3;
            for (int m = 0; m < in.n && m < 4; m++)
                for (int k = 0; k < K5; k++) {
                    const float *q = in.kpts + ((size_t)m * K5 + k) * 3;
                    const float *r = kp + ((size_t)m * K5 + k) * 3;
                    if (q[2] != r[2] || (q[2] > 0 && (r[0] != q[0] / S || r[1] != q[1] / S)))
                        bad = 3;
                }
            rows++;
        }
    }
    CHECK("loader rows (HSV fused in CHW) == augment_sample bytes and targets",
          !bad && rows == (int)lucid_dataset_size(ds), "bad %d rows %d", bad, rows);
    lucid_image_free(&img);
    lucid_instances_free(&in);
    lucid_loader_release(ld);
}

/* ------------------------------------------------------------ EXIF */

/* 64x32 stored image of flat 8x8 blocks, keypoints on block centres. */
static void exif_case(const char *name, lucid_exif_labels mode) {
    int w = 64, h = 32, o = 6;
    uint8_t rgb[64 * 32 * 3];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(20 + (x / 8) * 29);
            p[1] = (uint8_t)(20 + (y / 8) * 51);
            p[2] = (uint8_t)(200 - (x / 8) * 11 - (y / 8) * 17);
        }
    lucid_image stored = {w, h, rgb}, disp;
    lucid_image_orient(ctx, &stored, o, &disp);
    /* stored-frame labels (normalised) and their display-frame twins by
     * the pixel rule display(X, Y) = stored(x = Y, y = h-1-X) */
    int bx[K5] = {1, 3, 5, 6, 2}, by[K5] = {1, 2, 1, 3, 0};
    char ls[1024], ld[1024];
    int ns = snprintf(ls, sizeof ls, "0 %.6f %.6f %.6f %.6f", 0.5, 0.5, 0.75, 0.75);
    int nd = snprintf(ld, sizeof ld, "0 %.6f %.6f %.6f %.6f", 0.5, 0.5, 0.75, 0.75);
    for (int k = 0; k < K5; k++) {
        double px = bx[k] * 8 + 4, py = by[k] * 8 + 4; /* stored, label units */
        double X = h - py, Y = px;                      /* display */
        int v = k == 4 ? 0 : 2;
        ns += snprintf(ls + ns, sizeof ls - ns, " %.6f %.6f %d", v ? px / w : 0, v ? py / h : 0, v);
        nd += snprintf(ld + nd, sizeof ld - nd, " %.6f %.6f %d", v ? X / h : 0, v ? Y / w : 0, v);
    }
    strcat(ls, "\n");
    strcat(ld, "\n");
    char ra[256], rb2[256], p[600];
    tdu_make_split(ra, sizeof ra, "train");
    tdu_make_split(rb2, sizeof rb2, "train");
    snprintf(p, sizeof p, "%s/images/train/a.jpg", ra);
    tdu_write_jpeg(p, rgb, w, h, 3, 100, 0, o);
    snprintf(p, sizeof p, "%s/labels/train/a.txt", ra);
    tdu_write_text(p, mode == LUCID_EXIF_LABELS_STORED ? ls : ld);
    snprintf(p, sizeof p, "%s/images/train/a.jpg", rb2);
    tdu_write_jpeg(p, disp.data, disp.w, disp.h, 3, 100, 0, 1);
    snprintf(p, sizeof p, "%s/labels/train/a.txt", rb2);
    tdu_write_text(p, ld);
    lucid_dataset_options opt = lucid_dataset_options_default();
    opt.spec = spec5();
    opt.imgsz = 64;
    opt.exif_labels = mode;
    lucid_dataset *da = NULL, *db = NULL;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/images/train", ra);
    lucid_status st = lucid_dataset_open_yolo(ctx, dir, &opt, &da);
    snprintf(dir, sizeof dir, "%s/images/train", rb2);
    if (st == LUCID_OK) st = lucid_dataset_open_yolo(ctx, dir, &opt, &db);
    int ok = st == LUCID_OK;
    char why[256] = "";
    if (!ok) snprintf(why, sizeof why, "%s", lucid_ctx_error(ctx));
    for (int aug = 0; ok && aug < 2; aug++) {
        lucid_aug_params pr = lucid_aug_params_default();
        pr.augment = aug;
        pr.degrees = 7;
        run_bytes x, y;
        lucid_status s1 = run_loader(da, 2, 1, 64, 3, &pr, &x);
        lucid_status s2 = run_loader(db, 1, 1, 64, 3, &pr, &y);
        ok = s1 == LUCID_OK && s2 == LUCID_OK && x.len == y.len &&
             !memcmp(x.data, y.data, x.len);
        if (!ok) snprintf(why, sizeof why, "augment %d: st %d/%d len %zu/%zu differ", aug, s1, s2, x.len, y.len);
        free(x.data);
        free(y.data);
    }
    CHECK(name, ok, "%s", why);
    if (da) lucid_dataset_release(da);
    if (db) lucid_dataset_release(db);
    lucid_image_free(&disp);
    tdu_rm_rf(ra);
    tdu_rm_rf(rb2);
}

/* ------------------------------------------------ overflow, short batch */

static void test_layout(void) {
    char root[256], p[600];
    tdu_make_split(root, sizeof root, "train");
    uint8_t rgb[64 * 32 * 3];
    memset(rgb, 200, sizeof rgb);
    for (int i = 0; i < 10; i++) {
        snprintf(p, sizeof p, "%s/images/train/i%d.png", root, i);
        tdu_write_png(p, rgb, 64, 32, PNG_COLOR_TYPE_RGB, 8, 0, 0, NULL, 0, 1);
        char lines[2048] = "";
        int rows = i == 3 ? 5 : 1;
        for (int r = 0; r < rows; r++) {
            char l[256];
            snprintf(l, sizeof l, "0 %.4f 0.5 0.125 0.5 0.5 0.5 2 0 0 0 0.25 0.5 1 0 0 0 0 0 0\n",
                     0.1 + 0.15 * r);
            strcat(lines, l);
        }
        snprintf(p, sizeof p, "%s/labels/train/i%d.txt", root, i);
        tdu_write_text(p, lines);
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.spec = spec5();
    o.imgsz = 64;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/images/train", root);
    lucid_dataset *ds = NULL;
    lucid_status st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    if (st != LUCID_OK) {
        TEST_FAIL("layout dataset", "%s", lucid_ctx_error(ctx));
        tdu_rm_rf(root);
        return;
    }
    lucid_loader_options lo = lucid_loader_options_default();
    lo.batch = 4;
    lo.max_gt = 3;
    lo.threads = 2;
    lo.shuffle = 0;
    lucid_loader *ld;
    lucid_loader_create(ctx, ds, &lo, &ld);
    lucid_aug_params val = lucid_aug_params_default();
    val.augment = 0;
    lucid_loader_start_epoch(ld, 0, &val);
    lucid_batch *b;
    int nb = 0, ok_over = 0, ok_short = 0, ok_lb = 0;
    char why[256] = "";
    while (lucid_loader_next(ld, &b) == LUCID_OK && b) {
        const uint8_t *mask = lucid_tensor_data(b->mask);
        const int32_t *cnt = lucid_tensor_data(b->counts);
        const float *box = lucid_tensor_data(b->boxes);
        const float *kp = lucid_tensor_data(b->kpts);
        const uint8_t *im = lucid_tensor_data(b->images);
        if (nb == 0) {
            ok_over = b->overflow == 1 && b->max_count == 5 && cnt[3] == 5 &&
                      mask[3 * 3 + 0] && mask[3 * 3 + 2] && cnt[0] == 1 &&
                      mask[0] == 1 && mask[1] == 0;
            if (!ok_over) snprintf(why, sizeof why, "overflow %d max %d cnt3 %d", b->overflow, b->max_count, cnt[3]);
            /* letterbox 64x32 -> 64x64: rows 0..15 pad 114, cy 0.5 -> 0.5,
             * h 0.5 -> 0.25; keypoint (0.5,0.5) -> (0.5, 0.5); v=0 -> 0,0,0 */
            ok_lb = im[0] == 114 && im[15 * 64] == 114 && im[16 * 64] == 200 &&
                    im[47 * 64] == 200 && im[48 * 64] == 114 &&
                    fabsf(box[1] - 0.5f) < 1e-6f && fabsf(box[3] - 0.25f) < 1e-6f &&
                    fabsf(box[2] - 0.125f) < 1e-6f && kp[0] == 0.5f && kp[1] == 0.5f &&
                    kp[2] == 2 && kp[3] == 0 && kp[4] == 0 && kp[5] == 0 &&
                    kp[7] == 0.5f && kp[8] == 1;
        }
        if (nb == 2) {
            ok_short = b->n == 2 && mask[2 * 3] == 0 && mask[3 * 3] == 0 &&
                       b->sample_index[2] == -1 && b->sample_index[1] == 9 &&
                       im[(size_t)3 * 3 * 64 * 64] == 0 && mask[0] == 1;
        }
        nb++;
    }
    CHECK("max_gt overflow reported (count kept, first max_gt in tensors)", ok_over, "%s", why);
    CHECK("validation letterbox: pad 114, labels scaled+shifted, v=0 zeroed", ok_lb, "%s", "");
    CHECK("short last batch delivered (n=2 of 4, pad rows zero, mask 0)",
          nb == 3 && ok_short, "nb %d", nb);
    CHECK("num_batches = ceil(10/4)", lucid_loader_num_batches(ld) == 3, "%lld",
          (long long)lucid_loader_num_batches(ld));
    lucid_loader_release(ld);
    lo.drop_last = 1;
    lucid_loader_create(ctx, ds, &lo, &ld);
    CHECK("drop_last gives floor(10/4)", lucid_loader_num_batches(ld) == 2, "%lld",
          (long long)lucid_loader_num_batches(ld));
    lucid_loader_release(ld);
    lucid_dataset_release(ds);
    tdu_rm_rf(root);
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_flip_unit();
    test_warp_reference();
    test_warp_tiles();
    char root[256];
    lucid_dataset *ds = open_marked(root, sizeof root, 6, 256);
    if (ds) {
        test_marked(ds, "marked keypoints stay on marks: mosaic+affine, no flip", 1.0f, 0.0f);
        test_marked(ds, "marked keypoints stay on marks: mosaic+affine+fliplr", 1.0f, 1.0f);
        test_marked(ds, "marked keypoints stay on marks: letterbox+affine+fliplr", 0.0f, 1.0f);
        test_threads(ds, "batches byte-identical with 0/1/2/4 threads (synthetic, 2 epochs)", 4, 256, 2);
        test_loader_matches_sample(ds);
        test_loader_size_overflow(ds);
        lucid_dataset_release(ds);
    } else {
        TEST_FAIL("marked dataset", "%s", lucid_ctx_error(ctx));
    }
    tdu_rm_rf(root);
    exif_case("EXIF-rotated file == physically rotated file (labels in stored frame)",
              LUCID_EXIF_LABELS_STORED);
    exif_case("EXIF-rotated file == physically rotated file (labels in display frame)",
              LUCID_EXIF_LABELS_DISPLAY);
    test_layout();
    char base[512], dir[600];
    if (tdu_mini_dataset(base, sizeof base)) {
        snprintf(dir, sizeof dir, "%s/images/train", base);
        lucid_dataset_options o = lucid_dataset_options_default();
        o.threads = 2;
        lucid_dataset *mini = NULL;
        if (lucid_dataset_open_yolo(ctx, dir, &o, &mini) == LUCID_OK) {
            test_threads(mini, "mini train: batches byte-identical with 0/1/2/4 threads (640, batch 4)", 4, 640, 1);
            lucid_dataset_release(mini);
        } else {
            TEST_FAIL("mini dataset open", "%s", lucid_ctx_error(ctx));
        }
    } else {
        TEST_SKIP("mini train thread determinism", "coco-pose-mini not found");
    }
    lucid_ctx_release(ctx);
    return test_exit();
}
