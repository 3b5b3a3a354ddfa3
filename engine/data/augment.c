/*
 * augment.c — training augmentations and the validation letterbox, CPU.
 *
 * Contract (Ultralytics data/augment.py, v8_transforms; reference doc §4.2)
 *   - Mosaic._mosaic4: 2s x 2s canvas of 114, centre (xc, yc) = int(U(s/2,
 *     3s/2)), tiles top-left, top-right, bottom-left, bottom-right, labels
 *     shifted, clipped (keypoints outside get v = 0 and are clamped),
 *     zero-area boxes dropped.
 *   - RandomPerspective.affine_transform: M = T S R P C, output s x s,
 *     bilinear, border 114; boxes refitted from 4 corners, keypoints mapped
 *     by M with out-of-canvas -> v = 0, Instances.clip, box_candidates
 *     (wh_thr 2, ar_thr 100, area_thr 0.1) against the old boxes scaled by s.
 *   - Without mosaic the LetterBox(s, s) pre-transform centres the image on
 *     a 114 canvas first (RandomPerspective.pre_transform).
 *   - RandomHSV (LUT in OpenCV 8-bit HSV), RandomFlip vertical/horizontal;
 *     horizontal permutes keypoints by flip_idx.
 *   - A keypoint with v = 0 keeps v = 0 through every stage.
 *   - Pixel convention: pixel i covers [i, i+1) in label units. The warp maps
 *     the centre of every output pixel through M^-1 (dst (X+.5, Y+.5) ->
 *     src, minus .5 for the sample grid), so pixels and labels see the same
 *     matrix exactly. cv2.warpAffine maps pixel indices instead, which shifts
 *     the image by 0.5*(M - I) px relative to its labels; this is the one
 *     deliberate deviation from the reference (sub-pixel).
 *   - Bilinear weights are quantised to 1/32 (cv2 INTER_BITS = 5) and
 *     evaluated in integers, so the result is exact for a flat region and
 *     identical on every run and thread.
 *   - The mosaic canvas can stay virtual (lucid_tiles: 4 rectangles of the
 *     cached images on an unbounded 114 background). For an axis-aligned M
 *     (no rotation, shear or perspective: the pose defaults) the warp
 *     samples the tiles directly, separably (per output row: the two source
 *     rows blended per column, then two columns per pixel; the exact
 *     integer sum is the same), and writes HWC or CHW with HSV and flips;
 *     the bytes equal the warp of the written canvas.
 *   - Randomness: every sample has its own Philox stream keyed by seed with
 *     the counter derived from (epoch, index); each stage reads from its own
 *     block range (stage * 256), so turning a stage off does not change the
 *     draws of the others.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data_internal.h"
#include "hsv_pixel.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define PAD_VALUE 114

lucid_aug_params lucid_aug_params_default(void) {
    lucid_aug_params p;
    memset(&p, 0, sizeof p);
    p.augment = 1;
    p.mosaic = 1.0f;
    p.translate = 0.1f;
    p.scale = 0.5f;
    p.fliplr = 0.5f;
    p.hsv_h = 0.015f;
    p.hsv_s = 0.7f;
    p.hsv_v = 0.4f;
    p.hsv_on_cpu = 1;
    return p;
}

/* ------------------------------------------------------------------ rng */

void lucid_rng_stream_init(lucid_rng_stream *r, uint64_t seed, uint64_t epoch,
                           uint64_t index) {
    r->seed = seed;
    r->base = (epoch << 40) | ((index & ((1ull << 28) - 1)) << 12);
    r->block = 0;
    r->pos = 4;
}

void lucid_rng_stream_seek(lucid_rng_stream *r, uint64_t block) {
    r->block = block;
    r->pos = 4;
}

uint32_t lucid_rng_u32(lucid_rng_stream *r) {
    if (r->pos >= 4) {
        lucid_philox4x32(r->seed, r->base + r->block, r->buf);
        r->block++;
        r->pos = 0;
    }
    return r->buf[r->pos++];
}

double lucid_rng_uniform(lucid_rng_stream *r, double lo, double hi) {
    uint64_t a = lucid_rng_u32(r) >> 5, b = lucid_rng_u32(r) >> 6;
    double u = ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

/* ------------------------------------------------------------ instances */

lucid_status lucid_instances_reserve(lucid_ctx *ctx, lucid_instances *in,
                                     int cap, int nkpt) {
    if (in->cap >= cap && in->nkpt == nkpt) return LUCID_OK;
    int nc = cap > 2 * in->cap ? cap : 2 * in->cap;
    if (nc < 16) nc = 16;
    float *cls = realloc(in->cls, sizeof(float) * nc);
    if (cls) in->cls = cls;
    float *box = realloc(in->box, sizeof(float) * nc * 4);
    if (box) in->box = box;
    float *kp = realloc(in->kpts, sizeof(float) * nc * (nkpt > 0 ? nkpt : 1) * 3);
    if (kp) in->kpts = kp;
    if (!cls || !box || !kp)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of memory for %d instances", cap);
    in->cap = nc;
    in->nkpt = nkpt;
    return LUCID_OK;
}

void lucid_instances_free(lucid_instances *in) {
    free(in->cls);
    free(in->box);
    free(in->kpts);
    memset(in, 0, sizeof *in);
}

lucid_status lucid_instances_append(lucid_ctx *ctx, lucid_instances *in,
                                    const lucid_labels *l, int nkpt, float w,
                                    float h, float padw, float padh) {
    LUCID_TRY(lucid_instances_reserve(ctx, in, in->n + l->n, nkpt));
    for (int i = 0; i < l->n; i++) {
        int j = in->n++;
        const float *b = l->box + i * 4;
        in->cls[j] = l->cls[i];
        /* xywh normalised -> xyxy pixels (Instances.convert_bbox/denormalize) */
        in->box[j * 4 + 0] = (b[0] - b[2] / 2) * w + padw;
        in->box[j * 4 + 1] = (b[1] - b[3] / 2) * h + padh;
        in->box[j * 4 + 2] = (b[0] + b[2] / 2) * w + padw;
        in->box[j * 4 + 3] = (b[1] + b[3] / 2) * h + padh;
        for (int k = 0; k < nkpt; k++) {
            const float *s = l->kpts + ((size_t)i * nkpt + k) * 3;
            float *d = in->kpts + ((size_t)j * nkpt + k) * 3;
            d[0] = s[0] * w + padw;
            d[1] = s[1] * h + padh;
            d[2] = s[2];
        }
    }
    return LUCID_OK;
}

static float clampf(float v, float lo, float hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

void lucid_instances_clip(lucid_instances *in, float w, float h) {
    int K = in->nkpt;
    for (int i = 0; i < in->n; i++) {
        float *b = in->box + i * 4;
        b[0] = clampf(b[0], 0, w);
        b[2] = clampf(b[2], 0, w);
        b[1] = clampf(b[1], 0, h);
        b[3] = clampf(b[3], 0, h);
        for (int k = 0; k < K; k++) {
            float *p = in->kpts + ((size_t)i * K + k) * 3;
            if (p[0] < 0 || p[0] > w || p[1] < 0 || p[1] > h) p[2] = 0;
            p[0] = clampf(p[0], 0, w);
            p[1] = clampf(p[1], 0, h);
        }
    }
}

static void instances_copy_row(lucid_instances *in, int dst, int src) {
    if (dst == src) return;
    int K = in->nkpt;
    in->cls[dst] = in->cls[src];
    memcpy(in->box + dst * 4, in->box + src * 4, sizeof(float) * 4);
    if (K > 0)
        memcpy(in->kpts + (size_t)dst * K * 3, in->kpts + (size_t)src * K * 3,
               sizeof(float) * K * 3);
}

void lucid_instances_remove_zero_area(lucid_instances *in) {
    int m = 0;
    for (int i = 0; i < in->n; i++) {
        const float *b = in->box + i * 4;
        if (b[2] - b[0] > 0 && b[3] - b[1] > 0) instances_copy_row(in, m++, i);
    }
    in->n = m;
}

/* --------------------------------------------------------------- mosaic */

static void fill_pad(lucid_image *img) {
    memset(img->data, PAD_VALUE, (size_t)img->w * img->h * 3);
}

/* Mosaic._mosaic4 placement: tile i covers canvas [x1a, x2a) x [y1a, y2a)
 * and shows image i from (x1b, y1b); a tile whose two rectangles disagree
 * (or are empty) is not drawn. pad[i] = (x1a - x1b, y1a - y1b), the label
 * shift, in every case. */
static void mosaic4_layout(const lucid_image *imgs[4], int s, int xc, int yc,
                           lucid_tiles *tiles, int pad[4][2]) {
    int S2 = 2 * s;
    tiles->w = tiles->h = S2;
    tiles->n = 0;
    for (int i = 0; i < 4; i++) {
        int w = imgs[i]->w, h = imgs[i]->h;
        int x1a, y1a, x2a, y2a, x1b, y1b, x2b, y2b;
        if (i == 0) {
            x1a = xc - w > 0 ? xc - w : 0; y1a = yc - h > 0 ? yc - h : 0;
            x2a = xc; y2a = yc;
            x1b = w - (x2a - x1a); y1b = h - (y2a - y1a); x2b = w; y2b = h;
        } else if (i == 1) {
            x1a = xc; y1a = yc - h > 0 ? yc - h : 0;
            x2a = xc + w < S2 ? xc + w : S2; y2a = yc;
            x1b = 0; y1b = h - (y2a - y1a);
            x2b = w < x2a - x1a ? w : x2a - x1a; y2b = h;
        } else if (i == 2) {
            x1a = xc - w > 0 ? xc - w : 0; y1a = yc;
            x2a = xc; y2a = yc + h < S2 ? yc + h : S2;
            x1b = w - (x2a - x1a); y1b = 0;
            x2b = w; y2b = y2a - y1a < h ? y2a - y1a : h;
        } else {
            x1a = xc; y1a = yc;
            x2a = xc + w < S2 ? xc + w : S2; y2a = yc + h < S2 ? yc + h : S2;
            x1b = 0; y1b = 0;
            x2b = w < x2a - x1a ? w : x2a - x1a;
            y2b = y2a - y1a < h ? y2a - y1a : h;
        }
        int cw = x2b - x1b, ch = y2b - y1b;
        if (cw > 0 && ch > 0 && x2a - x1a == cw && y2a - y1a == ch) {
            lucid_tile *t = &tiles->t[tiles->n++];
            t->x0 = x1a; t->y0 = y1a; t->x1 = x2a; t->y1 = y2a;
            t->stride = (size_t)w * 3;
            t->data = imgs[i]->data + (size_t)y1b * t->stride + (size_t)x1b * 3;
        }
        pad[i][0] = x1a - x1b;
        pad[i][1] = y1a - y1b;
    }
}

static lucid_status mosaic4_labels(lucid_ctx *ctx, const lucid_image *imgs[4],
                                   const lucid_labels *labels[4], int nkpt,
                                   int s, const int pad[4][2],
                                   lucid_instances *out) {
    out->n = 0;
    for (int i = 0; i < 4; i++)
        LUCID_TRY(lucid_instances_append(ctx, out, labels[i], nkpt,
                                         (float)imgs[i]->w, (float)imgs[i]->h,
                                         (float)pad[i][0], (float)pad[i][1]));
    lucid_instances_clip(out, (float)(2 * s), (float)(2 * s));
    lucid_instances_remove_zero_area(out);
    return LUCID_OK;
}

lucid_status lucid_aug_mosaic4_tiles(lucid_ctx *ctx, const lucid_image *imgs[4],
                                     const lucid_labels *labels[4], int nkpt,
                                     int s, int xc, int yc, lucid_tiles *tiles,
                                     lucid_instances *out) {
    int pad[4][2];
    mosaic4_layout(imgs, s, xc, yc, tiles, pad);
    return mosaic4_labels(ctx, imgs, labels, nkpt, s, pad, out);
}

lucid_status lucid_aug_mosaic4(lucid_ctx *ctx, const lucid_image *imgs[4],
                               const lucid_labels *labels[4], int nkpt, int s,
                               int xc, int yc, lucid_image *canvas,
                               lucid_instances *out) {
    if (canvas->w != 2 * s || canvas->h != 2 * s || !canvas->data)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "mosaic canvas must be %dx%d, got %dx%d", 2 * s,
                            2 * s, canvas->w, canvas->h);
    lucid_tiles tiles;
    int pad[4][2];
    mosaic4_layout(imgs, s, xc, yc, &tiles, pad);
    lucid_tiles_fill(&tiles, canvas);
    return mosaic4_labels(ctx, imgs, labels, nkpt, s, pad, out);
}

/* ---------------------------------------------------------------- tiles */

/* A run of canvas row y: columns [x0, x1) show tile pixels from p (3 bytes
 * per column), or the background when p is NULL. */
typedef struct row_span {
    int x0, x1;
    const uint8_t *p;
} row_span;

/* Row y of the tiled canvas over columns [lo, hi) as runs, left to right
 * (at most 2n + 1). */
static int tiles_row(const lucid_tiles *tl, int y, int lo, int hi,
                     row_span *sp) {
    const lucid_tile *on[4];
    int k = 0;
    for (int i = 0; i < tl->n; i++) {
        const lucid_tile *t = &tl->t[i];
        if (y < t->y0 || y >= t->y1 || t->x1 <= lo || t->x0 >= hi) continue;
        int j = k++;
        while (j > 0 && on[j - 1]->x0 > t->x0) {
            on[j] = on[j - 1];
            j--;
        }
        on[j] = t;
    }
    int n = 0, x = lo;
    for (int j = 0; j < k; j++) {
        const lucid_tile *t = on[j];
        int a = t->x0 > lo ? t->x0 : lo, b = t->x1 < hi ? t->x1 : hi;
        if (a > x) sp[n++] = (row_span){x, a, NULL};
        sp[n++] = (row_span){a, b,
                             t->data + (size_t)(y - t->y0) * t->stride +
                                 (size_t)(a - t->x0) * 3};
        x = b;
    }
    if (x < hi) sp[n++] = (row_span){x, hi, NULL};
    return n;
}

void lucid_tiles_fill(const lucid_tiles *tl, lucid_image *img) {
    row_span sp[9];
    for (int y = 0; y < img->h; y++) {
        uint8_t *row = img->data + (size_t)y * img->w * 3;
        int n = tiles_row(tl, y, 0, img->w, sp);
        for (int i = 0; i < n; i++) {
            size_t len = (size_t)(sp[i].x1 - sp[i].x0) * 3;
            if (sp[i].p) memcpy(row + (size_t)sp[i].x0 * 3, sp[i].p, len);
            else memset(row + (size_t)sp[i].x0 * 3, PAD_VALUE, len);
        }
    }
}

/* ---------------------------------------------------- random perspective */

static void mat3_mul(const double a[9], const double b[9], double c[9]) {
    double t[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            t[i * 3 + j] = a[i * 3] * b[j] + a[i * 3 + 1] * b[3 + j] +
                           a[i * 3 + 2] * b[6 + j];
    memcpy(c, t, sizeof t);
}

static void mat3_eye(double m[9]) {
    memset(m, 0, sizeof(double) * 9);
    m[0] = m[4] = m[8] = 1;
}

void lucid_aug_perspective_matrix(const lucid_aug_params *p, int in_w,
                                  int in_h, int out_w, int out_h,
                                  lucid_rng_stream *r, double M[9],
                                  double *scale_out) {
    const double PI = 3.14159265358979323846;
    double C[9], P[9], R[9], S[9], T[9];
    mat3_eye(C);
    C[2] = -in_w / 2.0;
    C[5] = -in_h / 2.0;
    mat3_eye(P);
    P[6] = lucid_rng_uniform(r, -p->perspective, p->perspective);
    P[7] = lucid_rng_uniform(r, -p->perspective, p->perspective);
    mat3_eye(R);
    double a = lucid_rng_uniform(r, -p->degrees, p->degrees);
    double s = lucid_rng_uniform(r, 1 - p->scale, 1 + p->scale);
    /* cv2.getRotationMatrix2D(center=(0,0), angle=a, scale=s) */
    double al = s * cos(a * PI / 180), be = s * sin(a * PI / 180);
    R[0] = al; R[1] = be;
    R[3] = -be; R[4] = al;
    mat3_eye(S);
    S[1] = tan(lucid_rng_uniform(r, -p->shear, p->shear) * PI / 180);
    S[3] = tan(lucid_rng_uniform(r, -p->shear, p->shear) * PI / 180);
    mat3_eye(T);
    T[2] = lucid_rng_uniform(r, 0.5 - p->translate, 0.5 + p->translate) * out_w;
    T[5] = lucid_rng_uniform(r, 0.5 - p->translate, 0.5 + p->translate) * out_h;
    /* M = T @ S @ R @ P @ C */
    mat3_mul(P, C, M);
    mat3_mul(R, M, M);
    mat3_mul(S, M, M);
    mat3_mul(T, M, M);
    *scale_out = s;
}

static int mat3_inv(const double m[9], double inv[9]) {
    double a = m[0], b = m[1], c = m[2], d = m[3], e = m[4], f = m[5],
           g = m[6], h = m[7], i = m[8];
    double A = e * i - f * h, B = -(d * i - f * g), Cc = d * h - e * g;
    double det = a * A + b * B + c * Cc;
    if (det == 0 || !isfinite(det)) return -1;
    double id = 1.0 / det;
    inv[0] = A * id; inv[1] = -(b * i - c * h) * id; inv[2] = (b * f - c * e) * id;
    inv[3] = B * id; inv[4] = (a * i - c * g) * id; inv[5] = -(a * f - c * d) * id;
    inv[6] = Cc * id; inv[7] = -(a * h - b * g) * id; inv[8] = (a * e - b * d) * id;
    return 0;
}

static inline int floor_int(double v) {
    int i = (int)v;
    return i - (v < i);
}

/* Bilinear sample at fixed-point source coordinates (ix, iy) in 1/32 pixel
 * units (pixel centres at multiples of 32), constant border PAD_VALUE. */
static inline void sample_fixed(const uint8_t *src, int w, int h, int ix,
                                int iy, uint8_t *d) {
    int x0 = ix >> 5, y0 = iy >> 5, fx = ix & 31, fy = iy & 31;
    int w00 = (32 - fx) * (32 - fy), w01 = fx * (32 - fy),
        w10 = (32 - fx) * fy, w11 = fx * fy;
    if ((unsigned)x0 < (unsigned)(w - 1) && (unsigned)y0 < (unsigned)(h - 1)) {
        const uint8_t *p = src + ((size_t)y0 * w + x0) * 3;
        const uint8_t *q = p + (size_t)w * 3;
        d[0] = (uint8_t)((p[0] * w00 + p[3] * w01 + q[0] * w10 + q[3] * w11 + 512) >> 10);
        d[1] = (uint8_t)((p[1] * w00 + p[4] * w01 + q[1] * w10 + q[4] * w11 + 512) >> 10);
        d[2] = (uint8_t)((p[2] * w00 + p[5] * w01 + q[2] * w10 + q[5] * w11 + 512) >> 10);
        return;
    }
    if (x0 < -1 || y0 < -1 || x0 >= w || y0 >= h) {
        d[0] = d[1] = d[2] = PAD_VALUE;
        return;
    }
    int xs[2] = {x0, x0 + 1}, ys[2] = {y0, y0 + 1};
    int ws[4] = {w00, w01, w10, w11};
    int acc[3] = {512, 512, 512};
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 2; i++) {
            int wt = ws[j * 2 + i];
            int inside = xs[i] >= 0 && xs[i] < w && ys[j] >= 0 && ys[j] < h;
            const uint8_t *p = inside ? src + ((size_t)ys[j] * w + xs[i]) * 3 : NULL;
            for (int c = 0; c < 3; c++) acc[c] += wt * (p ? p[c] : PAD_VALUE);
        }
    for (int c = 0; c < 3; c++) d[c] = (uint8_t)(acc[c] >> 10);
}

/* Three bytes in 21-bit lanes (bilinear weights sum to 1024). */
static inline uint64_t pack3(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 21) | ((uint64_t)p[2] << 42);
}
static const uint64_t LANE_ROUND = 512ull | (512ull << 21) | (512ull << 42);

/* Clamp a coordinate (1/32 px) to a range that cannot overflow int and
 * still lands outside the image. */
static inline int to_fixed32(double v) {
    double q = v * 32.0;
    if (q < -1e8) q = -1e8;
    if (q > 1e8) q = 1e8;
    return floor_int(q);
}

static int clamp_fixed(double v) {
    return (int)lrint(v < -1e9 ? -1e9 : v > 1e9 ? 1e9 : v);
}

/* ------------------------------------------------- axis-aligned warp */

/* M without rotation or shear (Mi[1] = Mi[3] = 0, positive scales; the
 * pose defaults degrees = shear = perspective = 0). The source point of
 * output pixel (X, Y) is (Mi[0] (X+.5) + Mi[2] - .5, Mi[4] (Y+.5) + Mi[5] -
 * .5) in 1/32 px, rounded as cv2.warpAffine does (AB_BITS = 10 for the
 * X and row terms, then INTER_BITS = 5) and clamped far outside; the
 * bilinear weights are (32 - f, f) per axis and the sum
 * sum_ij p_ij wx_i wy_j + 512 >> 10 is exact in integers, so it is
 * separable: per output row the two source rows are blended once per
 * source column (u8 -> u16, at most 255 * 32; vectorised), the columns
 * packed 3 channels to a uint64, then each output pixel blends two columns
 * with one multiply. Same coordinates and same sum as the general path
 * below, so the same bytes. */
static int axis_aligned_inverse(const double M[9], double Mi[9]) {
    if (mat3_inv(M, Mi)) return 0;
    int affine = M[6] == 0 && M[7] == 0 && M[8] == 1;
    return affine && Mi[1] == 0 && Mi[3] == 0 && Mi[0] > 0 && Mi[4] > 0;
}

int lucid_aug_warp_is_axis_aligned(const double M[9]) {
    double Mi[9];
    return axis_aligned_inverse(M, Mi);
}

static int clamp_coord(int64_t f) {
    return (int)(f < -(1 << 26) ? -(1 << 26) : f > (1 << 26) ? 1 << 26 : f);
}

/* source x of output column X, 1/32 px (x term + offset term, as the
 * general affine path tabulates them) */
static int col_coord(const double Mi[9], int X) {
    int64_t bx = (int64_t)clamp_fixed((Mi[2] - 0.5) * 1024.0);
    return clamp_coord(((int64_t)clamp_fixed(Mi[0] * (X + 0.5) * 1024.0) + bx) >> 5);
}

/* source y of output row Y, 1/32 px */
static int row_coord(const double Mi[9], int Y) {
    return clamp_coord((int64_t)clamp_fixed((Mi[4] * (Y + 0.5) + Mi[5] - 0.5) * 1024.0) >> 5);
}

/* v[i] = a[i] * wa + b[i] * wb for n bytes (wa + wb = 32: at most 8160).
 * Fixed blocks of 32 so that -O2 vectorises the inner loop. */
static void blend_bytes(const uint8_t *restrict a, const uint8_t *restrict b,
                        size_t n, unsigned wa, unsigned wb,
                        uint16_t *restrict v) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (size_t k = 0; k < 32; k++)
            v[i + k] = (uint16_t)(a[i + k] * wa + b[i + k] * wb);
    for (; i < n; i++) v[i] = (uint16_t)(a[i] * wa + b[i] * wb);
}

/* Columns [lo, hi) of the vertical blend of runs ra (weight 32 - wy) and rb
 * (weight wy) into v (3 u16 per column); pad: hi - lo pixels of 114. */
static void blend_runs(const row_span *ra, const row_span *rb, int lo, int hi,
                       unsigned wy, const uint8_t *pad, uint16_t *v) {
    for (int x = lo; x < hi;) {
        while (ra->x1 <= x) ra++;
        while (rb->x1 <= x) rb++;
        int e = ra->x1 < rb->x1 ? ra->x1 : rb->x1;
        const uint8_t *pa = ra->p ? ra->p + (size_t)(x - ra->x0) * 3 : pad;
        const uint8_t *pb = rb->p ? rb->p + (size_t)(x - rb->x0) * 3 : pad;
        blend_bytes(pa, pb, (size_t)(e - x) * 3, 32 - wy, wy,
                    v + (size_t)(x - lo) * 3);
        x = e;
    }
}

/* Columns [0, n) of v (3 u16 each) as one uint64 each, the 3 channels in
 * 21-bit lanes, so that one multiply weighs all three. */
static void pack_cols(const uint16_t *restrict v, int n, uint64_t *restrict q) {
    for (int x = 0; x < n; x++)
        q[x] = (uint64_t)v[3 * x] | (uint64_t)v[3 * x + 1] << 21 |
               (uint64_t)v[3 * x + 2] << 42;
}

/* Output pixels [0, n): left column q[col[i]], weight wx[i] for the right
 * one; written with `step` bytes between pixels. Per lane a*l + b*r + 512
 * with a = 32 - b, as l*32 + (r - l)*b: a lane stays below 8160 * 32 +
 * 512 < 2^21 (no carry into the next), so the wrap-around of r - l cancels
 * and the sum is exact. */
static inline void gather_cols(const uint64_t *restrict q,
                               const int32_t *restrict col,
                               const uint8_t *restrict wx, int n,
                               uint8_t *restrict d0, uint8_t *restrict d1,
                               uint8_t *restrict d2, const ptrdiff_t step) {
    const uint64_t round = 512ull | (512ull << 21) | (512ull << 42);
    for (int i = 0; i < n; i++) {
        const uint64_t *p = q + col[i];
        uint64_t acc = (p[0] << 5) + (p[1] - p[0]) * wx[i] + round;
        d0[i * step] = (uint8_t)(acc >> 10);
        d1[i * step] = (uint8_t)(acc >> 31);
        d2[i * step] = (uint8_t)(acc >> 52);
    }
}

static void fill_cols(uint8_t *const d[3], int a, int b, ptrdiff_t step) {
    if (b <= a) return;
    if (step == 1) {
        for (int c = 0; c < 3; c++) memset(d[c] + a, PAD_VALUE, (size_t)(b - a));
        return;
    }
    for (int c = 0; c < 3; c++)
        for (int i = a; i < b; i++) d[c][i * step] = PAD_VALUE;
}

lucid_warp_out lucid_warp_out_hwc(lucid_image *img) {
    lucid_warp_out o;
    memset(&o, 0, sizeof o);
    o.w = img->w;
    o.h = img->h;
    for (int c = 0; c < 3; c++) o.ch[c] = img->data + c;
    o.step = 3;
    o.stride = (ptrdiff_t)img->w * 3;
    return o;
}

lucid_warp_out lucid_warp_out_chw(uint8_t *chw, int w, int h) {
    lucid_warp_out o;
    memset(&o, 0, sizeof o);
    o.w = w;
    o.h = h;
    for (int c = 0; c < 3; c++) o.ch[c] = chw + (size_t)c * w * h;
    o.step = 1;
    o.stride = w;
    return o;
}

/* Scratch of one lucid_aug_warp_tiles call. */
typedef struct warp_cols {
    int32_t *col;   /* [W] by output column (flips applied): x0 - lo */
    uint8_t *wx;    /* [W] weight of x0 + 1 */
    uint64_t *q;    /* [hi - lo] packed blended columns */
    uint16_t *v;    /* [3 (hi - lo)] blended columns */
    uint8_t *pad;   /* [3 (hi - lo)] of PAD_VALUE */
    int lo, hi;     /* source columns blended per row */
    int da, db;     /* output columns [da, db) that touch a tile */
} warp_cols;

/* Column tables for output width W. An output column whose left source
 * column x0 is outside [bx0 - 1, bx1) (the tiles span [bx0, bx1)) sees
 * only background: it is not in [da, db). Returns 0 when out of memory. */
static int warp_cols_init(warp_cols *wc, const double Mi[9], int W, int lr,
                          int bx0, int bx1) {
    memset(wc, 0, sizeof *wc);
    int xa = W, xb = 0;
    for (int X = 0; X < W; X++) {
        int x0 = col_coord(Mi, X) >> 5;
        if (x0 >= bx0 - 1 && x0 < bx1) {
            if (X < xa) xa = X;
            xb = X + 1;
        }
    }
    if (xa >= xb) {
        wc->da = wc->db = 0;
        return 1;
    }
    wc->lo = col_coord(Mi, xa) >> 5;
    wc->hi = (col_coord(Mi, xb - 1) >> 5) + 2;
    size_t nc = (size_t)(wc->hi - wc->lo), n = nc * 3;
    wc->q = malloc(sizeof(uint64_t) * nc + sizeof(int32_t) * (size_t)W +
                   sizeof(uint16_t) * n + n + W);
    if (!wc->q) return 0;
    wc->col = (int32_t *)(wc->q + nc);
    wc->v = (uint16_t *)(wc->col + W);
    wc->pad = (uint8_t *)(wc->v + n);
    wc->wx = wc->pad + n;
    memset(wc->pad, PAD_VALUE, n);
    wc->da = lr ? W - xb : xa;
    wc->db = lr ? W - xa : xb;
    for (int X = xa; X < xb; X++) {
        int f = col_coord(Mi, X), Xd = lr ? W - 1 - X : X;
        wc->col[Xd] = (f >> 5) - wc->lo;
        wc->wx[Xd] = (uint8_t)(f & 31);
    }
    return 1;
}

static void hsv_row(const lucid_hsv_tables *t, uint8_t *const d[3], int W,
                    ptrdiff_t step) {
    for (int i = 0; i < W; i++) {
        uint8_t *p0 = d[0] + i * step, *p1 = d[1] + i * step, *p2 = d[2] + i * step;
        lucid_hsv_pixel(t, *p0, *p1, *p2, p0, p1, p2);
    }
}

lucid_status lucid_aug_warp_tiles(lucid_ctx *ctx, const lucid_tiles *tl,
                                  const double M[9], const lucid_warp_out *o) {
    double Mi[9];
    if (!axis_aligned_inverse(M, Mi))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "warp_tiles: M must be affine without rotation "
                            "or shear, with positive scales");
    const int W = o->w, H = o->h;
    const int lr = (o->flips & LUCID_FLIP_LR) != 0, ud = (o->flips & LUCID_FLIP_UD) != 0;
    /* bounding box of the tiles: outside it (and its 1-px rim) only 114 */
    int bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;
    for (int i = 0; i < tl->n; i++) {
        const lucid_tile *t = &tl->t[i];
        if (i == 0 || t->x0 < bx0) bx0 = t->x0;
        if (i == 0 || t->y0 < by0) by0 = t->y0;
        if (i == 0 || t->x1 > bx1) bx1 = t->x1;
        if (i == 0 || t->y1 > by1) by1 = t->y1;
    }
    warp_cols wc;
    if (!warp_cols_init(&wc, Mi, W, lr, bx0, bx1))
        return lucid_seterr(ctx, LUCID_ERR_OOM, "warp: out of memory");
    lucid_hsv_tables t;
    if (o->hsv) lucid_hsv_tables_init(&t, o->rh, o->rs, o->rv);
    const ptrdiff_t step = o->step;
    row_span ra[9], rb[9];
    for (int Y = 0; Y < H; Y++) {
        int Yd = ud ? H - 1 - Y : Y;
        uint8_t *d[3];
        for (int c = 0; c < 3; c++) d[c] = o->ch[c] + (ptrdiff_t)Yd * o->stride;
        int fy = row_coord(Mi, Y), y0 = fy >> 5;
        if (wc.da >= wc.db || y0 < by0 - 1 || y0 >= by1) {
            fill_cols(d, 0, W, step);
        } else {
            tiles_row(tl, y0, wc.lo, wc.hi, ra);
            tiles_row(tl, y0 + 1, wc.lo, wc.hi, rb);
            blend_runs(ra, rb, wc.lo, wc.hi, (unsigned)(fy & 31), wc.pad, wc.v);
            pack_cols(wc.v, wc.hi - wc.lo, wc.q);
            int n = wc.db - wc.da;
            uint8_t *e0 = d[0] + wc.da * step, *e1 = d[1] + wc.da * step,
                    *e2 = d[2] + wc.da * step;
            if (step == 1)
                gather_cols(wc.q, wc.col + wc.da, wc.wx + wc.da, n, e0, e1, e2, 1);
            else
                gather_cols(wc.q, wc.col + wc.da, wc.wx + wc.da, n, e0, e1, e2, 3);
            fill_cols(d, 0, wc.da, step);
            fill_cols(d, wc.db, W, step);
        }
        if (o->hsv) hsv_row(&t, d, W, step);
    }
    free(wc.q);
    return LUCID_OK;
}

lucid_status lucid_aug_warp(lucid_ctx *ctx, const lucid_image *src,
                            const double M[9], lucid_image *dst) {
    double Mi[9];
    if (mat3_inv(M, Mi))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "warp: singular matrix");
    int affine = M[6] == 0 && M[7] == 0 && M[8] == 1;
    int W = dst->w, H = dst->h;
    if (axis_aligned_inverse(M, Mi)) {
        /* one tile: the source image at (0, 0) */
        lucid_tiles tl;
        memset(&tl, 0, sizeof tl);
        tl.w = src->w;
        tl.h = src->h;
        tl.n = 1;
        tl.t[0] = (lucid_tile){0, 0, src->w, src->h, src->data, (size_t)src->w * 3};
        lucid_warp_out o = lucid_warp_out_hwc(dst);
        return lucid_aug_warp_tiles(ctx, &tl, M, &o);
    }
    if (affine) {
        /* src = Mi (X+.5, Y+.5) - .5, as cv2.warpAffine evaluates it: the
         * X terms are tabulated once (AB_BITS = 10 fixed point), the row
         * terms added per row, then reduced to 1/32 px (INTER_BITS = 5). */
        int *ax = malloc(sizeof(int) * 2 * (size_t)W);
        if (!ax) return lucid_seterr(ctx, LUCID_ERR_OOM, "warp: out of memory");
        int *ay = ax + W;
        for (int X = 0; X < W; X++) {
            double xc = X + 0.5;
            double vx = Mi[0] * xc * 1024.0, vy = Mi[3] * xc * 1024.0;
            ax[X] = (int)lrint(vx < -1e9 ? -1e9 : vx > 1e9 ? 1e9 : vx);
            ay[X] = (int)lrint(vy < -1e9 ? -1e9 : vy > 1e9 ? 1e9 : vy);
        }
        for (int Y = 0; Y < H; Y++) {
            uint8_t *d = dst->data + (size_t)Y * W * 3;
            double yc = Y + 0.5;
            double rx = (Mi[1] * yc + Mi[2] - 0.5) * 1024.0;
            double ry = (Mi[4] * yc + Mi[5] - 0.5) * 1024.0;
            int64_t bx = (int64_t)llrint(rx < -1e9 ? -1e9 : rx > 1e9 ? 1e9 : rx);
            int64_t by = (int64_t)llrint(ry < -1e9 ? -1e9 : ry > 1e9 ? 1e9 : ry);
            const uint8_t *sp = src->data;
            int sw = src->w, sh = src->h;
            size_t stride = (size_t)sw * 3;
            for (int X = 0; X < W; X++) {
                int64_t fx = (ax[X] + bx) >> 5, fy = (ay[X] + by) >> 5;
                int x0 = (int)(fx >> 5), y0 = (int)(fy >> 5);
                uint8_t *o = d + X * 3;
                if (fx >= 0 && fy >= 0 && x0 < sw - 1 && y0 < sh - 1) {
                    /* interior: the 4 neighbours exist */
                    int wx = (int)(fx & 31), wy = (int)(fy & 31);
                    const uint8_t *p = sp + (size_t)y0 * stride + (size_t)x0 * 3;
                    const uint8_t *q = p + stride;
                    uint64_t w00 = (uint64_t)((32 - wx) * (32 - wy)),
                             w01 = (uint64_t)(wx * (32 - wy)),
                             w10 = (uint64_t)((32 - wx) * wy),
                             w11 = (uint64_t)(wx * wy);
                    /* the 3 channels in 21-bit lanes of one uint64: a lane
                     * holds at most 255*1024 + 512 < 2^21, no carries */
                    uint64_t acc = pack3(p) * w00 + pack3(p + 3) * w01 +
                                   pack3(q) * w10 + pack3(q + 3) * w11 +
                                   LANE_ROUND;
                    o[0] = (uint8_t)((acc >> 10) & 0x7FF);
                    o[1] = (uint8_t)((acc >> 31) & 0x7FF);
                    o[2] = (uint8_t)((acc >> 52) & 0x7FF);
                    continue;
                }
                if (fx < -(1 << 26)) fx = -(1 << 26);
                if (fx > (1 << 26)) fx = 1 << 26;
                if (fy < -(1 << 26)) fy = -(1 << 26);
                if (fy > (1 << 26)) fy = 1 << 26;
                sample_fixed(sp, sw, sh, (int)fx, (int)fy, o);
            }
        }
        free(ax);
        return LUCID_OK;
    }
    for (int Y = 0; Y < H; Y++) {
        uint8_t *d = dst->data + (size_t)Y * W * 3;
        double yc = Y + 0.5;
        for (int X = 0; X < W; X++) {
            double xc = X + 0.5;
            double z = Mi[6] * xc + Mi[7] * yc + Mi[8];
            double sx = -1e9, sy = -1e9;
            if (z > 0) {
                sx = (Mi[0] * xc + Mi[1] * yc + Mi[2]) / z - 0.5;
                sy = (Mi[3] * xc + Mi[4] * yc + Mi[5]) / z - 0.5;
            }
            sample_fixed(src->data, src->w, src->h, to_fixed32(sx),
                         to_fixed32(sy), d + X * 3);
        }
    }
    return LUCID_OK;
}

int lucid_box_candidate(const float box1[4], const float box2[4],
                        float wh_thr, float ar_thr, float area_thr) {
    const double eps = 1e-16;
    double w1 = box1[2] - box1[0], h1 = box1[3] - box1[1];
    double w2 = box2[2] - box2[0], h2 = box2[3] - box2[1];
    double ar1 = w2 / (h2 + eps), ar2 = h2 / (w2 + eps);
    double ar = ar1 > ar2 ? ar1 : ar2;
    return w2 > wh_thr && h2 > wh_thr && w2 * h2 / (w1 * h1 + eps) > area_thr &&
           ar < ar_thr;
}

static void apply_point(const double M[9], double x, double y, double *ox,
                        double *oy) {
    double z = M[6] * x + M[7] * y + M[8];
    *ox = (M[0] * x + M[1] * y + M[2]) / z;
    *oy = (M[3] * x + M[4] * y + M[5]) / z;
}

void lucid_aug_perspective_labels(lucid_instances *in, const double M[9],
                                  int out_w, int out_h, double s) {
    int K = in->nkpt, m = 0;
    for (int i = 0; i < in->n; i++) {
        float *b = in->box + i * 4;
        float old[4] = {b[0] * (float)s, b[1] * (float)s, b[2] * (float)s,
                        b[3] * (float)s};
        /* apply_bboxes: corners (x1,y1) (x2,y2) (x1,y2) (x2,y1) */
        double cx[4], cy[4];
        apply_point(M, b[0], b[1], &cx[0], &cy[0]);
        apply_point(M, b[2], b[3], &cx[1], &cy[1]);
        apply_point(M, b[0], b[3], &cx[2], &cy[2]);
        apply_point(M, b[2], b[1], &cx[3], &cy[3]);
        double x1 = cx[0], x2 = cx[0], y1 = cy[0], y2 = cy[0];
        for (int c = 1; c < 4; c++) {
            x1 = cx[c] < x1 ? cx[c] : x1; x2 = cx[c] > x2 ? cx[c] : x2;
            y1 = cy[c] < y1 ? cy[c] : y1; y2 = cy[c] > y2 ? cy[c] : y2;
        }
        b[0] = (float)x1; b[1] = (float)y1; b[2] = (float)x2; b[3] = (float)y2;
        /* apply_keypoints: v = 0 when outside [0, W] x [0, H] */
        for (int k = 0; k < K; k++) {
            float *p = in->kpts + ((size_t)i * K + k) * 3;
            double ox, oy;
            apply_point(M, p[0], p[1], &ox, &oy);
            p[0] = (float)ox;
            p[1] = (float)oy;
            if (ox < 0 || oy < 0 || ox > out_w || oy > out_h) p[2] = 0;
        }
        /* Instances.clip(out_w, out_h) for this row */
        b[0] = clampf(b[0], 0, (float)out_w); b[2] = clampf(b[2], 0, (float)out_w);
        b[1] = clampf(b[1], 0, (float)out_h); b[3] = clampf(b[3], 0, (float)out_h);
        for (int k = 0; k < K; k++) {
            float *p = in->kpts + ((size_t)i * K + k) * 3;
            if (p[0] < 0 || p[0] > out_w || p[1] < 0 || p[1] > out_h) p[2] = 0;
            p[0] = clampf(p[0], 0, (float)out_w);
            p[1] = clampf(p[1], 0, (float)out_h);
        }
        if (lucid_box_candidate(old, b, 2.f, 100.f, 0.1f))
            instances_copy_row(in, m++, i);
    }
    in->n = m;
}

/* ------------------------------------------------------------------- HSV */

/* The per-pixel code and its tables are in hsv_pixel.h (shared with the
 * device input kernel, cuda/input.cu). */

void lucid_aug_hsv_apply(lucid_image *img, double rh, double rs, double rv) {
    lucid_hsv_tables t;
    lucid_hsv_tables_init(&t, rh, rs, rv);
    size_t n = (size_t)img->w * img->h;
    uint8_t *p = img->data;
    for (size_t i = 0; i < n; i++, p += 3)
        lucid_hsv_pixel(&t, p[0], p[1], p[2], &p[0], &p[1], &p[2]);
}

/* One row of 3-channel pixels into three planes, reading forwards (dir 1)
 * or backwards from the last pixel (dir -1, a horizontal flip); 8 pixels
 * per step are packed into one 64-bit store per plane. */
static inline void deinterleave_row(const uint8_t *row, int w, int dir,
                                    uint8_t *c0, uint8_t *c1, uint8_t *c2) {
    const int st = 3 * dir;
    const uint8_t *p = dir > 0 ? row : row + 3 * (w - 1);
    int i = 0;
    for (; i + 8 <= w; i += 8, p += 8 * st) {
        uint64_t r = 0, g = 0, b = 0;
        for (int k = 0; k < 8; k++) {
            r |= (uint64_t)p[k * st] << (8 * k);
            g |= (uint64_t)p[k * st + 1] << (8 * k);
            b |= (uint64_t)p[k * st + 2] << (8 * k);
        }
        /* byte k of the word goes to c[i + k]: little-endian order */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        r = __builtin_bswap64(r);
        g = __builtin_bswap64(g);
        b = __builtin_bswap64(b);
#endif
        memcpy(c0 + i, &r, 8);
        memcpy(c1 + i, &g, 8);
        memcpy(c2 + i, &b, 8);
    }
    for (; i < w; i++, p += st) {
        c0[i] = p[0];
        c1[i] = p[1];
        c2[i] = p[2];
    }
}

void lucid_hwc_to_chw(const lucid_image *img, uint8_t *chw, int hsv,
                      double rh, double rs, double rv, int flips) {
    const int W = img->w, H = img->h;
    const size_t n = (size_t)W * H;
    const int lr = (flips & LUCID_FLIP_LR) != 0, ud = (flips & LUCID_FLIP_UD) != 0;
    lucid_hsv_tables t;
    if (hsv) lucid_hsv_tables_init(&t, rh, rs, rv);
    for (int y = 0; y < H; y++) {
        const uint8_t *row = img->data + (size_t)(ud ? H - 1 - y : y) * W * 3;
        uint8_t *c0 = chw + (size_t)y * W, *c1 = c0 + n, *c2 = c1 + n;
        if (!hsv) {
            deinterleave_row(row, W, lr ? -1 : 1, c0, c1, c2);
            continue;
        }
        const uint8_t *p = lr ? row + 3 * (size_t)(W - 1) : row;
        const ptrdiff_t st = lr ? -3 : 3;
        for (int x = 0; x < W; x++, p += st) {
            uint8_t o[3];
            lucid_hsv_pixel(&t, p[0], p[1], p[2], &o[0], &o[1], &o[2]);
            c0[x] = o[0];
            c1[x] = o[1];
            c2[x] = o[2];
        }
    }
}

void lucid_aug_hsv(lucid_image *img, float hgain, float sgain, float vgain,
                   lucid_rng_stream *r) {
    double rh = lucid_rng_uniform(r, -1, 1) * hgain;
    double rs = lucid_rng_uniform(r, -1, 1) * sgain;
    double rv = lucid_rng_uniform(r, -1, 1) * vgain;
    if (hgain || sgain || vgain) lucid_aug_hsv_apply(img, rh, rs, rv);
}

/* ------------------------------------------------------------------ flips */

void lucid_instances_fliplr(lucid_instances *in, int W, const int *flip_idx) {
    int K = in->nkpt;
    float tmp[LUCID_MAX_KPT * 3];
    for (int i = 0; i < in->n; i++) {
        float *b = in->box + i * 4;
        float x1 = W - b[2], x2 = W - b[0];
        b[0] = x1;
        b[2] = x2;
        float *kp = in->kpts + (size_t)i * K * 3;
        for (int k = 0; k < K; k++) kp[k * 3] = W - kp[k * 3];
        if (flip_idx && K > 0) {
            memcpy(tmp, kp, sizeof(float) * K * 3);
            for (int k = 0; k < K; k++)
                memcpy(kp + k * 3, tmp + flip_idx[k] * 3, sizeof(float) * 3);
        }
    }
}

static void image_fliplr(lucid_image *img) {
    int W = img->w;
    for (int y = 0; y < img->h; y++) {
        uint8_t *row = img->data + (size_t)y * W * 3;
        for (int a = 0, b = W - 1; a < b; a++, b--) {
            uint8_t *pa = row + a * 3, *pb = row + b * 3;
            uint8_t t0 = pa[0], t1 = pa[1], t2 = pa[2];
            pa[0] = pb[0]; pa[1] = pb[1]; pa[2] = pb[2];
            pb[0] = t0; pb[1] = t1; pb[2] = t2;
        }
    }
}

void lucid_aug_fliplr(lucid_image *img, lucid_instances *in,
                      const int *flip_idx) {
    image_fliplr(img);
    lucid_instances_fliplr(in, img->w, flip_idx);
}

void lucid_instances_flipud(lucid_instances *in, int H) {
    int K = in->nkpt;
    for (int i = 0; i < in->n; i++) {
        float *b = in->box + i * 4;
        float y1 = H - b[3], y2 = H - b[1];
        b[1] = y1;
        b[3] = y2;
        float *kp = in->kpts + (size_t)i * K * 3;
        for (int k = 0; k < K; k++) kp[k * 3 + 1] = H - kp[k * 3 + 1];
    }
}

static void image_flipud(lucid_image *img) {
    int W = img->w, H = img->h;
    size_t rb = (size_t)W * 3;
    for (int a = 0, b = H - 1; a < b; a++, b--) {
        uint8_t *ra = img->data + a * rb, *rbp = img->data + b * rb;
        for (size_t j = 0; j < rb; j++) {
            uint8_t t = ra[j];
            ra[j] = rbp[j];
            rbp[j] = t;
        }
    }
}

void lucid_aug_flipud(lucid_image *img, lucid_instances *in) {
    image_flipud(img);
    lucid_instances_flipud(in, img->h);
}

void lucid_image_flip(lucid_image *img, int flips) {
    if (flips & LUCID_FLIP_UD) image_flipud(img);
    if (flips & LUCID_FLIP_LR) image_fliplr(img);
}

/* -------------------------------------------------------------- letterbox */

lucid_status lucid_aug_letterbox(lucid_ctx *ctx, const lucid_image *src,
                                 int new_w, int new_h, lucid_image *dst,
                                 lucid_instances *in) {
    if (dst->w != new_w || dst->h != new_h || !dst->data)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "letterbox output must be %dx%d, got %dx%d", new_w,
                            new_h, dst->w, dst->h);
    double r = fmin((double)new_h / src->h, (double)new_w / src->w);
    int uw = (int)rint(src->w * r), uh = (int)rint(src->h * r);
    double dw = (new_w - uw) / 2.0, dh = (new_h - uh) / 2.0;
    int top = (int)rint(dh - 0.1), left = (int)rint(dw - 0.1);
    fill_pad(dst);
    lucid_image rs = *src, tmp = {0, 0, NULL};
    if (uw != src->w || uh != src->h) {
        LUCID_TRY(lucid_image_resize(ctx, src, uw, uh, &tmp));
        rs = tmp;
    }
    for (int y = 0; y < uh; y++) {
        int Y = y + top;
        if (Y < 0 || Y >= new_h) continue;
        int x0 = left < 0 ? -left : 0;
        int x1 = uw + left > new_w ? new_w - left : uw;
        if (x1 > x0)
            memcpy(dst->data + ((size_t)Y * new_w + left + x0) * 3,
                   rs.data + ((size_t)y * uw + x0) * 3, (size_t)(x1 - x0) * 3);
    }
    lucid_image_free(&tmp);
    if (in) {
        /* ratio: the unpadded size over the source size (per axis) */
        float rx = (float)uw / src->w, ry = (float)uh / src->h;
        int K = in->nkpt;
        for (int i = 0; i < in->n; i++) {
            float *b = in->box + i * 4;
            b[0] = b[0] * rx + left; b[2] = b[2] * rx + left;
            b[1] = b[1] * ry + top; b[3] = b[3] * ry + top;
            for (int k = 0; k < K; k++) {
                float *p = in->kpts + ((size_t)i * K + k) * 3;
                p[0] = p[0] * rx + left;
                p[1] = p[1] * ry + top;
            }
        }
    }
    return LUCID_OK;
}
