/*
 * test_input.c — lucid_input_prepare (engine/data/input.h): the CPU
 * reference against a straightforward implementation (HSV through
 * lucid_aug_hsv_apply on an HWC copy, then /255), the value table against
 * exact arithmetic, argument errors, and, with a CUDA device, the kernel
 * (cuda/input.cu) bit for bit against the CPU for f32/bf16/f16 with and
 * without HSV (vector and scalar paths, misaligned views, all 2^24 colours),
 * no allocation, graph capture/replay, and a real loader batch made with
 * hsv_on_cpu = 0 + device HSV against the same batch with hsv_on_cpu = 1.
 * Without a CUDA device the GPU checks print "skip ..." lines.
 */
#include "test.h"
#include "data/data.h"
#include "data/input.h"
#include "train/graph.h"

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

static lucid_ctx *ctx;
static int have_gpu;
static const lucid_device CPU = {LUCID_CPU, 0};
static const lucid_device GPU = {LUCID_CUDA, 0};

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}
static float rnd_gain(float g) {
    return (float)(((double)(rnd() % 2000001) / 1000000.0 - 1.0) * g);
}

/* ------------------------------------------------------------ helpers */

static lucid_tensor *new_t(lucid_device dev, lucid_dtype dt, int nd,
                           const int64_t *sh) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_zeros(ctx, dev, dt, nd, sh, &t) != LUCID_OK) {
        printf("not ok alloc: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    return t;
}

/* Random images [N,3,H,W] on the CPU: random bytes, some gray pixels, some
 * extremes (0/255 channels). */
static lucid_tensor *rand_images(int N, int H, int W) {
    int64_t sh[4] = {N, 3, H, W};
    lucid_tensor *t = new_t(CPU, LUCID_U8, 4, sh);
    uint8_t *p = lucid_tensor_data(t);
    int64_t P = (int64_t)H * W;
    for (int n = 0; n < N; n++)
        for (int64_t i = 0; i < P; i++) {
            uint8_t *a = p + (int64_t)n * 3 * P + i;
            uint32_t k = rnd() % 8;
            uint8_t r = rnd(), g = rnd(), b = rnd();
            if (k == 0) g = b = r;                  /* gray */
            if (k == 1) { r = 255; b = 0; }         /* saturated */
            if (k == 2) { g = r; }                  /* two equal */
            a[0] = r;
            a[P] = g;
            a[2 * P] = b;
        }
    return t;
}

static lucid_tensor *gains_t(lucid_device dev, int N, const float *g) {
    int64_t sh[2] = {N, 3};
    lucid_tensor *c = new_t(CPU, LUCID_F32, 2, sh);
    memcpy(lucid_tensor_data(c), g, sizeof(float) * 3 * N);
    if (dev.type == LUCID_CPU) return c;
    lucid_tensor *d = new_t(dev, LUCID_F32, 2, sh);
    lucid_copy(ctx, d, c);
    lucid_tensor_release(c);
    return d;
}

/* The straightforward expected output: per image an HWC copy, RandomHSV
 * through lucid_aug_hsv_apply (the loader's function) when its gains are
 * not all zero, then v / 255 in dt. Returns a malloc'd buffer of x's bytes. */
static void *expected(const lucid_tensor *images, const float *g, lucid_dtype dt) {
    int64_t N = images->shape[0], H = images->shape[2], W = images->shape[3];
    int64_t P = H * W;
    size_t es = lucid_dtype_size(dt);
    uint8_t *out = malloc((size_t)(N * 3 * P) * es);
    const uint8_t *src = lucid_tensor_data(images);
    lucid_image img = {(int32_t)W, (int32_t)H, malloc((size_t)P * 3)};
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *s = src + n * 3 * P;
        for (int64_t i = 0; i < P; i++)
            for (int c = 0; c < 3; c++) img.data[i * 3 + c] = s[c * P + i];
        if (g && (g[n * 3] || g[n * 3 + 1] || g[n * 3 + 2]))
            lucid_aug_hsv_apply(&img, g[n * 3], g[n * 3 + 1], g[n * 3 + 2]);
        for (int64_t i = 0; i < P; i++)
            for (int c = 0; c < 3; c++) {
                int v = img.data[i * 3 + c];
                int64_t q = n * 3 * P + c * P + i;
                float f = (float)((double)v / 255.0);
                switch (dt) {
                case LUCID_F32: ((float *)out)[q] = f; break;
                case LUCID_F64: ((double *)out)[q] = (double)v / 255.0; break;
                case LUCID_BF16: ((uint16_t *)out)[q] = lucid_f32_to_bf16(f); break;
                default: ((uint16_t *)out)[q] = lucid_f32_to_f16(f); break;
                }
            }
    }
    free(img.data);
    return out;
}

/* x (any device) to a host buffer of its bytes. */
static void *host_bytes(lucid_tensor *x) {
    lucid_tensor *h = NULL;
    if (lucid_tensor_to(ctx, x, CPU, x->dtype, &h) != LUCID_OK) return NULL;
    lucid_ctx_synchronize(ctx);
    size_t nb = lucid_tensor_nbytes(h);
    void *b = malloc(nb);
    memcpy(b, lucid_tensor_data(h), nb);
    lucid_tensor_release(h);
    return b;
}

static int64_t first_diff(const void *a, const void *b, size_t n, size_t es) {
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es))
            return (int64_t)i;
    return -1;
}

static const lucid_dtype DTS[4] = {LUCID_F32, LUCID_BF16, LUCID_F16, LUCID_F64};

/* ------------------------------------------------------------ CPU */

/* v / 255 for all 256 v: the nearest value of the dtype (no ties). */
static void test_values(void) {
    int64_t sh[4] = {1, 3, 16, 16};
    lucid_tensor *im = new_t(CPU, LUCID_U8, 4, sh);
    uint8_t *p = lucid_tensor_data(im);
    for (int i = 0; i < 768; i++) p[i] = (uint8_t)(i * 7 + i / 256);
    for (int d = 0; d < 4; d++) {
        lucid_dtype dt = DTS[d];
        lucid_tensor *x = new_t(CPU, dt, 4, sh);
        lucid_status st = lucid_input_prepare(ctx, x, im, NULL);
        int bad = -1;
        for (int i = 0; i < 768 && st == LUCID_OK && bad < 0; i++) {
            int v = p[i];
            double y = test_hget(x, i);
            if (dt == LUCID_F64) {
                if (y != (double)v / 255.0) bad = i;
                continue;
            }
            /* neighbours of y in the dtype */
            double lo, hi;
            if (dt == LUCID_F32) {
                lo = nextafterf((float)y, -1.0f);
                hi = nextafterf((float)y, 2.0f);
            } else {
                uint16_t b = ((const uint16_t *)lucid_tensor_data(x))[i];
                float (*dec)(uint16_t) =
                    dt == LUCID_BF16 ? lucid_bf16_to_f32 : lucid_f16_to_f32;
                lo = b > 0 ? dec((uint16_t)(b - 1)) : -1.0;
                hi = dec((uint16_t)(b + 1));
            }
            /* y*255 is exact in double for <= 24-bit y */
            double e = fabs(y * 255.0 - v);
            if (!(e < fabs(lo * 255.0 - v) && e < fabs(hi * 255.0 - v))) bad = i;
        }
        char nm[128];
        snprintf(nm, sizeof nm, "cpu %s: x = v/255 correctly rounded for all 256 v",
                 lucid_dtype_name(dt));
        CHECK(nm, st == LUCID_OK && bad < 0, "%s; first bad element %d (v %d)",
              lucid_status_name(st), bad, bad >= 0 ? p[bad] : -1);
        lucid_tensor_release(x);
    }
    lucid_tensor_release(im);
}

/* The CPU reference against expected() on random images. */
static void test_cpu_reference(int N, int H, int W) {
    lucid_tensor *im = rand_images(N, H, W);
    float *g = malloc(sizeof(float) * 3 * N);
    for (int n = 0; n < N; n++) {
        g[n * 3] = rnd_gain(0.015f);
        g[n * 3 + 1] = rnd_gain(0.7f);
        g[n * 3 + 2] = rnd_gain(0.4f);
    }
    if (N > 1) g[3] = g[4] = g[5] = 0;                       /* pass-through */
    if (N > 2) { g[6] = 0.5f; g[7] = -1.0f; g[8] = 1.0f; }   /* extremes */
    if (N > 3) { g[9] = -0.015f; g[10] = 0.7f; g[11] = -0.4f; }
    lucid_tensor *gt = gains_t(CPU, N, g);
    int64_t sh[4] = {N, 3, H, W};
    for (int d = 0; d < 4; d++) {
        for (int hsv = 0; hsv < 2; hsv++) {
            lucid_dtype dt = DTS[d];
            lucid_tensor *x = new_t(CPU, dt, 4, sh);
            lucid_status st = lucid_input_prepare(ctx, x, im, hsv ? gt : NULL);
            void *e = expected(im, hsv ? g : NULL, dt);
            size_t n = (size_t)lucid_tensor_numel(x), es = lucid_dtype_size(dt);
            int64_t k = st == LUCID_OK ? first_diff(lucid_tensor_data(x), e, n, es) : -2;
            char nm[160];
            snprintf(nm, sizeof nm,
                     "cpu %s [%d,3,%d,%d]%s: bitwise equal to aug_hsv_apply on "
                     "HWC + /255",
                     lucid_dtype_name(dt), N, H, W, hsv ? " hsv" : "");
            CHECK(nm, k == -1, "%s %s; first differing element %lld",
                  lucid_status_name(st), st ? lucid_ctx_error(ctx) : "",
                  (long long)k);
            free(e);
            lucid_tensor_release(x);
        }
    }
    lucid_tensor_release(gt);
    lucid_tensor_release(im);
    free(g);
}

static void expect_arg(const char *name, lucid_tensor *x, lucid_tensor *im,
                       lucid_tensor *g) {
    lucid_status st = lucid_input_prepare(ctx, x, im, g);
    CHECK(name, st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "input_prepare"),
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_ctx_clear_error(ctx);
}

static void test_errors(void) {
    int64_t sh[4] = {2, 3, 8, 8}, sh2[4] = {2, 3, 8, 6}, shg[2] = {2, 3},
            shg2[2] = {2, 2}, sh1[4] = {2, 1, 8, 8};
    lucid_tensor *im = new_t(CPU, LUCID_U8, 4, sh);
    lucid_tensor *x = new_t(CPU, LUCID_F32, 4, sh);
    lucid_tensor *xi = new_t(CPU, LUCID_I32, 4, sh);
    lucid_tensor *x2 = new_t(CPU, LUCID_F32, 4, sh2);
    lucid_tensor *imf = new_t(CPU, LUCID_F32, 4, sh);
    lucid_tensor *im1 = new_t(CPU, LUCID_U8, 4, sh1);
    lucid_tensor *g = new_t(CPU, LUCID_F32, 2, shg);
    lucid_tensor *g2 = new_t(CPU, LUCID_F32, 2, shg2);
    lucid_tensor *g64 = new_t(CPU, LUCID_F64, 2, shg);
    lucid_tensor *xt = NULL;
    lucid_tensor_transpose(ctx, x, 2, 3, &xt);
    expect_arg("error: x of dtype i32", xi, im, NULL);
    expect_arg("error: x shape differs from images", x2, im, NULL);
    expect_arg("error: images not u8", x, imf, NULL);
    expect_arg("error: images with 1 channel", x, im1, NULL);
    expect_arg("error: hsv [N,2]", x, im, g2);
    expect_arg("error: hsv f64", x, im, g64);
    expect_arg("error: x not contiguous", xt, im, g);
    CHECK_STATUS("well-formed call accepted", ctx, lucid_input_prepare(ctx, x, im, g));
    if (have_gpu) {
        lucid_tensor *xg = new_t(GPU, LUCID_F32, 4, sh);
        expect_arg("error: images on the cpu, x on the gpu", xg, im, NULL);
        lucid_tensor *img = new_t(GPU, LUCID_U8, 4, sh);
        expect_arg("error: hsv on the cpu, x on the gpu", xg, img, g);
        /* f64 x on the gpu: the engine refuses an f64 device tensor when it
         * is allocated (f64 is CPU-only, engine/core/tensor.c), so
         * input_prepare can never be handed one; the allocation is tried
         * directly (new_t would exit on the refusal). Should f64 device
         * tensors become possible, input_prepare itself must reject them. */
        lucid_tensor *x64 = NULL;
        lucid_status s64 = lucid_tensor_zeros(ctx, GPU, LUCID_F64, 4, sh, &x64);
        if (s64 == LUCID_OK && x64) {
            expect_arg("error: f64 x on the gpu", x64, img, NULL);
            lucid_tensor_release(x64);
        } else {
            CHECK("error: f64 x on the gpu (refused at allocation: f64 is CPU-only)",
                  s64 == LUCID_ERR_UNSUPPORTED && !x64 &&
                      strstr(lucid_ctx_error(ctx), "CPU-only"),
                  "%s: %s", lucid_status_name(s64), lucid_ctx_error(ctx));
            lucid_ctx_clear_error(ctx);
        }
        lucid_tensor_release(img);
        lucid_tensor_release(xg);
    }
    lucid_tensor *ts[] = {im, x, xi, x2, imf, im1, g, g2, g64, xt};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) lucid_tensor_release(ts[i]);
}

/* ------------------------------------------------------------ GPU */

/* images (CPU) and gains g: CUDA output vs the CPU reference, bitwise.
 * off_im / off_x: element offsets of the device views (misalignment). */
static void gpu_case(const char *what, lucid_tensor *im, const float *g,
                     lucid_dtype dt, int off_im, int off_x) {
    int N = (int)im->shape[0];
    int64_t sh[4] = {im->shape[0], 3, im->shape[2], im->shape[3]};
    int64_t n = lucid_tensor_numel(im);
    char nm[200];
    snprintf(nm, sizeof nm, "gpu %s %s [%d,3,%lld,%lld]%s%s: bitwise equal to the cpu",
             what, lucid_dtype_name(dt), N, (long long)sh[2], (long long)sh[3],
             g ? " hsv" : "", off_im || off_x ? " misaligned" : "");
    /* device views at an offset inside a larger storage */
    lucid_storage *sim = NULL, *sx = NULL;
    lucid_tensor *dim = NULL, *dx = NULL;
    size_t es = lucid_dtype_size(dt);
    lucid_status st = lucid_storage_create(ctx, GPU, (size_t)(n + off_im), 0, &sim);
    if (st == LUCID_OK) st = lucid_storage_create(ctx, GPU, (size_t)(n + off_x) * es, 0, &sx);
    if (st == LUCID_OK)
        st = lucid_tensor_from_storage(ctx, sim, LUCID_U8, 4, sh, NULL, off_im, &dim);
    if (st == LUCID_OK)
        st = lucid_tensor_from_storage(ctx, sx, dt, 4, sh, NULL, off_x, &dx);
    if (st == LUCID_OK) st = lucid_copy(ctx, dim, im);
    lucid_tensor *dg = g ? gains_t(GPU, N, g) : NULL;
    lucid_tensor *cx = new_t(CPU, dt, 4, sh);
    lucid_tensor *cg = g ? gains_t(CPU, N, g) : NULL;
    if (st == LUCID_OK) st = lucid_fill(ctx, dx, 7.0);
    if (st == LUCID_OK) st = lucid_input_prepare(ctx, dx, dim, dg);
    if (st == LUCID_OK) st = lucid_input_prepare(ctx, cx, im, cg);
    void *hb = st == LUCID_OK ? host_bytes(dx) : NULL;
    int64_t k = hb ? first_diff(hb, lucid_tensor_data(cx), (size_t)n, es) : -2;
    CHECK(nm, st == LUCID_OK && k == -1, "%s %s; first differing element %lld",
          lucid_status_name(st), st ? lucid_ctx_error(ctx) : "", (long long)k);
    lucid_ctx_clear_error(ctx);
    free(hb);
    lucid_tensor *ts[] = {dim, dx, dg, cx, cg};
    for (size_t i = 0; i < 5; i++)
        if (ts[i]) lucid_tensor_release(ts[i]);
    if (sim) lucid_storage_release(sim);
    if (sx) lucid_storage_release(sx);
}

static void test_gpu_random(void) {
    const int shapes[3][3] = {{4, 64, 64}, {3, 37, 23}, {2, 640, 640}};
    const lucid_dtype dts[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0];
        lucid_tensor *im = rand_images(N, shapes[s][1], shapes[s][2]);
        float g[12];
        for (int i = 0; i < N; i++) {
            g[i * 3] = rnd_gain(0.015f);
            g[i * 3 + 1] = rnd_gain(0.7f);
            g[i * 3 + 2] = rnd_gain(0.4f);
        }
        if (N > 1) g[3] = g[4] = g[5] = 0; /* image 1 passes through */
        for (int d = 0; d < 3; d++) {
            gpu_case("random", im, NULL, dts[d], 0, 0);
            gpu_case("random", im, g, dts[d], 0, 0);
        }
        if (s == 0) {
            gpu_case("random", im, g, LUCID_F32, 1, 0);
            gpu_case("random", im, g, LUCID_BF16, 0, 1);
            gpu_case("random", im, g, LUCID_F16, 4, 2);
        }
        lucid_tensor_release(im);
    }
}

/* Every RGB colour (a 4096 x 4096 image) under several gain triples: the
 * kernel against the straightforward route (lucid_aug_hsv_apply). */
static void test_gpu_all_colours(void) {
    int64_t sh[4] = {1, 3, 4096, 4096};
    const int64_t P = 4096 * 4096;
    lucid_tensor *im = new_t(CPU, LUCID_U8, 4, sh);
    uint8_t *p = lucid_tensor_data(im);
    for (int64_t i = 0; i < P; i++) {
        p[i] = (uint8_t)(i & 255);
        p[P + i] = (uint8_t)((i >> 8) & 255);
        p[2 * P + i] = (uint8_t)(i >> 16);
    }
    const float gains[6][3] = {{0.0123f, 0.55f, -0.31f}, {-0.015f, -0.7f, 0.4f},
                               {0.5f, 0.0f, 0.0f},      {-0.0031f, -1.0f, 1.0f},
                               {0.007f, 0.7f, -0.4f},   {0.0f, 0.0f, 0.0f}};
    lucid_tensor *dim = new_t(GPU, LUCID_U8, 4, sh);
    lucid_tensor *dx = new_t(GPU, LUCID_F32, 4, sh);
    lucid_copy(ctx, dim, im);
    int bad = 0;
    char why[200] = "";
    for (int k = 0; k < 6 && !bad; k++) {
        lucid_tensor *dg = gains_t(GPU, 1, gains[k]);
        lucid_status st = lucid_input_prepare(ctx, dx, dim, dg);
        void *hb = st == LUCID_OK ? host_bytes(dx) : NULL;
        void *e = expected(im, gains[k], LUCID_F32);
        int64_t d = hb ? first_diff(hb, e, (size_t)(3 * P), 4) : -2;
        if (d != -1) {
            bad = 1;
            snprintf(why, sizeof why, "gains %d: %s, first differing element %lld",
                     k, lucid_status_name(st), (long long)d);
        }
        free(hb);
        free(e);
        lucid_tensor_release(dg);
    }
    CHECK("gpu all 2^24 colours x 6 gain triples: bitwise equal to aug_hsv_apply + /255",
          !bad, "%s", why);
    lucid_tensor_release(dx);
    lucid_tensor_release(dim);
    lucid_tensor_release(im);
}

/* No allocation in a call; captured into a graph, the replay computes the
 * same bits and reads the buffers' current contents. */
static void test_gpu_capture(void) {
    int N = 4, H = 96, W = 80;
    int64_t sh[4] = {N, 3, H, W};
    lucid_tensor *im = rand_images(N, H, W), *im2 = rand_images(N, H, W);
    float g[12];
    for (int i = 0; i < 12; i++) g[i] = rnd_gain(i % 3 == 0 ? 0.015f : 0.5f);
    lucid_tensor *dim = new_t(GPU, LUCID_U8, 4, sh);
    lucid_tensor *dx = new_t(GPU, LUCID_BF16, 4, sh);
    lucid_tensor *dg = gains_t(GPU, N, g), *cg = gains_t(CPU, N, g);
    lucid_tensor *c1 = new_t(CPU, LUCID_BF16, 4, sh), *c2 = new_t(CPU, LUCID_BF16, 4, sh);
    lucid_input_prepare(ctx, c1, im, cg);
    lucid_input_prepare(ctx, c2, im2, cg);
    lucid_copy(ctx, dim, im);
    lucid_input_prepare(ctx, dx, dim, dg); /* warm */
    lucid_ctx_synchronize(ctx);
    lucid_memory_stats m0, m1;
    lucid_memory_stats_get(ctx, GPU, &m0);
    lucid_status st = lucid_input_prepare(ctx, dx, dim, dg);
    lucid_ctx_synchronize(ctx);
    lucid_memory_stats_get(ctx, GPU, &m1);
    CHECK("gpu: no device allocation in a call", st == LUCID_OK &&
          m1.num_allocs == m0.num_allocs, "%s; %llu allocations",
          lucid_status_name(st), (unsigned long long)(m1.num_allocs - m0.num_allocs));

    lucid_fill(ctx, dx, 0.0);
    lucid_ctx_synchronize(ctx);
    lucid_graph *gr = NULL;
    st = lucid_ctx_capture_begin(ctx);
    if (st == LUCID_OK) {
        lucid_status s2 = lucid_input_prepare(ctx, dx, dim, dg);
        st = lucid_ctx_capture_end(ctx, s2 == LUCID_OK ? &gr : NULL);
        if (s2 != LUCID_OK) st = s2;
    }
    CHECK("gpu: input_prepare captured into a CUDA graph", st == LUCID_OK && gr,
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_ctx_clear_error(ctx);
    if (st == LUCID_OK && gr) {
        size_t nb = lucid_tensor_nbytes(c1);
        st = lucid_graph_launch(ctx, gr);
        void *h1 = host_bytes(dx);
        CHECK("gpu: graph replay gives the cpu bits", st == LUCID_OK && h1 &&
              memcmp(h1, lucid_tensor_data(c1), nb) == 0, "%s", lucid_status_name(st));
        lucid_copy(ctx, dim, im2); /* new images in the same buffer */
        st = lucid_graph_launch(ctx, gr);
        void *h2 = host_bytes(dx);
        CHECK("gpu: replay reads the buffer's new images", st == LUCID_OK && h2 &&
              memcmp(h2, lucid_tensor_data(c2), nb) == 0, "%s", lucid_status_name(st));
        free(h1);
        free(h2);
        lucid_graph_destroy(gr);
    }
    lucid_tensor *ts[] = {im, im2, dim, dx, dg, cg, c1, c2};
    for (size_t i = 0; i < 8; i++) lucid_tensor_release(ts[i]);
}

/* Time per call at the training shape (a note, not a check). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void note_gpu_time(void) {
    int64_t sh[4] = {4, 3, 640, 640};
    lucid_tensor *im = rand_images(4, 640, 640);
    float g[12];
    for (int i = 0; i < 12; i++) g[i] = rnd_gain(i % 3 == 0 ? 0.015f : 0.5f);
    lucid_tensor *dim = new_t(GPU, LUCID_U8, 4, sh), *dg = gains_t(GPU, 4, g);
    lucid_tensor *dx = new_t(GPU, LUCID_BF16, 4, sh);
    lucid_copy(ctx, dim, im);
    for (int hsv = 0; hsv < 2; hsv++) {
        lucid_input_prepare(ctx, dx, dim, hsv ? dg : NULL);
        lucid_ctx_synchronize(ctx);
        double t0 = now_s();
        for (int r = 0; r < 200; r++) lucid_input_prepare(ctx, dx, dim, hsv ? dg : NULL);
        lucid_ctx_synchronize(ctx);
        printf("# gpu input_prepare [4,3,640,640] u8 -> bf16%s: %.1f us per call "
               "(200 back-to-back calls)\n",
               hsv ? " + HSV" : "", (now_s() - t0) / 200 * 1e6);
    }
    lucid_tensor_release(dx);
    lucid_tensor_release(dg);
    lucid_tensor_release(dim);
    lucid_tensor_release(im);
}

/* ------------------------------------------------------------ loader */

static const char *mini_dataset(char *buf, size_t len) {
    const char *env = getenv("LUCID_DATASETS");
    const char *c[4] = {env, "../shared/datasets", "datasets", ".data"};
    for (int i = 0; i < 4; i++) {
        if (!c[i]) continue;
        snprintf(buf, len, "%s/coco-pose-mini/images/train", c[i]);
        struct stat sb;
        if (stat(buf, &sb) == 0) return buf;
    }
    return NULL;
}

/* Batches of the real mini dataset (640, batch 4, pose defaults): with
 * hsv_on_cpu = 0 and input_prepare(images, hsv) against hsv_on_cpu = 1 and
 * input_prepare(images, NULL), bitwise (bf16), on the CPU and on the GPU. */
static void test_loader(void) {
    char buf[512];
    const char *dir = mini_dataset(buf, sizeof buf);
    if (!dir) {
        TEST_SKIP("loader batches: device HSV equals CPU HSV",
                  "coco-pose-mini not found ($LUCID_DATASETS, ../shared/datasets, "
                  "datasets, .data)");
        return;
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.threads = 2;
    lucid_dataset *ds = NULL;
    if (lucid_dataset_open_yolo(ctx, dir, &o, &ds) != LUCID_OK) {
        TEST_FAIL("loader: open mini dataset", "%s", lucid_ctx_error(ctx));
        return;
    }
    lucid_loader_options lo = lucid_loader_options_default();
    lo.batch = 4;
    lo.imgsz = 640;
    lo.threads = 2;
    lo.max_gt = 128;
    lo.seed = 3;
    lucid_loader *ld = NULL;
    if (lucid_loader_create(ctx, ds, &lo, &ld) != LUCID_OK) {
        TEST_FAIL("loader: create", "%s", lucid_ctx_error(ctx));
        lucid_dataset_release(ds);
        return;
    }
    enum { NB = 3 };
    int64_t sh[4] = {4, 3, 640, 640};
    lucid_tensor *ref[2][NB]; /* [epoch][batch]: CPU HSV, then /255 (bf16) */
    int ok_cpu = 1, ok_gpu = 1, differs = 0;
    lucid_status st = LUCID_OK;
    for (int pass = 0; pass < 2; pass++) {
        lucid_aug_params p = lucid_aug_params_default();
        p.hsv_on_cpu = pass == 0;
        for (int e = 0; e < 2; e++) {
            lucid_loader_start_epoch(ld, (uint64_t)e, &p);
            for (int k = 0; k < NB; k++) {
                lucid_batch *b = NULL;
                st = lucid_loader_next(ld, &b);
                if (st != LUCID_OK || !b) {
                    ok_cpu = ok_gpu = 0;
                    break;
                }
                lucid_tensor *x = new_t(CPU, LUCID_BF16, 4, sh);
                if (pass == 0) {
                    lucid_input_prepare(ctx, x, b->images, NULL);
                    ref[e][k] = x;
                    continue;
                }
                st = lucid_input_prepare(ctx, x, b->images, b->hsv);
                size_t nb = lucid_tensor_nbytes(x);
                if (st != LUCID_OK ||
                    memcmp(lucid_tensor_data(x), lucid_tensor_data(ref[e][k]), nb))
                    ok_cpu = 0;
                /* the images really were left without HSV */
                lucid_tensor *x0 = new_t(CPU, LUCID_BF16, 4, sh);
                lucid_input_prepare(ctx, x0, b->images, NULL);
                differs += memcmp(lucid_tensor_data(x0), lucid_tensor_data(ref[e][k]), nb) != 0;
                lucid_tensor_release(x0);
                if (have_gpu) {
                    lucid_tensor *di = new_t(GPU, LUCID_U8, 4, sh);
                    lucid_tensor *dg = new_t(GPU, LUCID_F32, 2, b->hsv->shape);
                    lucid_tensor *dx = new_t(GPU, LUCID_BF16, 4, sh);
                    lucid_copy(ctx, di, b->images);
                    lucid_copy(ctx, dg, b->hsv);
                    st = lucid_input_prepare(ctx, dx, di, dg);
                    void *hb = st == LUCID_OK ? host_bytes(dx) : NULL;
                    if (!hb || memcmp(hb, lucid_tensor_data(ref[e][k]), nb)) ok_gpu = 0;
                    free(hb);
                    lucid_tensor_release(di);
                    lucid_tensor_release(dg);
                    lucid_tensor_release(dx);
                }
                lucid_tensor_release(x);
                lucid_tensor_release(ref[e][k]);
            }
        }
    }
    CHECK("loader batches (mini, 640, 2 epochs x 3): hsv_on_cpu=0 + cpu "
          "input_prepare(hsv) == hsv_on_cpu=1 + /255, bitwise bf16",
          ok_cpu && differs == 2 * NB, "%s %s; %d of %d raw batches differ",
          lucid_status_name(st), st ? lucid_ctx_error(ctx) : "", differs, 2 * NB);
    if (have_gpu)
        CHECK("loader batches: hsv_on_cpu=0 + gpu input_prepare(hsv) == "
              "hsv_on_cpu=1 + /255, bitwise bf16",
              ok_gpu, "%s %s", lucid_status_name(st), st ? lucid_ctx_error(ctx) : "");
    else
        TEST_SKIP("loader batches: gpu device HSV equals CPU HSV", "no CUDA device");
    lucid_loader_release(ld);
    lucid_dataset_release(ds);
}

/* ------------------------------------------------------------ main */

int main(void) {
    have_gpu = lucid_cuda_available();
    lucid_ctx_options opt = lucid_ctx_options_default();
    if (have_gpu) opt.device = GPU;
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_values();
    test_cpu_reference(5, 48, 40);
    test_cpu_reference(3, 300, 300); /* several threads, ranges across images */
    test_errors();
    if (have_gpu) {
        if (!lucid_input_cuda_kernels())
            TEST_FAIL("gpu kernel table", "lucid_input_cuda_kernels() is NULL "
                                          "in a build with a CUDA device");
        test_gpu_random();
        test_gpu_all_colours();
        test_gpu_capture();
        note_gpu_time();
    } else {
        TEST_SKIP("gpu input_prepare (random, misaligned, all colours, capture)",
                  "no CUDA device");
    }
    test_loader();
    lucid_ctx_release(ctx);
    return test_exit();
}
