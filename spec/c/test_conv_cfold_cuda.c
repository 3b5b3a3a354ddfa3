/*
 * test_conv_cfold_cuda.c — the split-K fold of the implicit-GEMM Conv2d
 * forward and backward-data (cuda/nn_conv_igemm.cu) across a thread-block
 * cluster of each output tile's split blocks (route on:
 * lucid_cuda_nn_set_igemm_cluster(ctx, 2); the default, LUCID_IGEMM_CLUSTER)
 * against the two-kernel route (1: the kernel writes f32 partials to the
 * arena and igemm_reduce_out folds them; LUCID_IGEMM_CLUSTER=0).
 *
 * Checks, for bf16 and f16, each case of CASES (split counts 2..16 in both
 * passes; K with and without a short last chunk; one and several output
 * tiles, partial row and column tiles; 1x1 scalar and vector, 3x3
 * tap-major, generic 5x5; stride 2 forward; bias and none), on the auto
 * route with the 1x1 switch forced to the implicit GEMM and the
 * small-channel route off:
 *   - split counts: lucid_conv_igemm_split_count of each pass equals the
 *     count written in CASES, and CASES covers 2..16 in both passes (host
 *     only: runs without a GPU, so a planner change that loses coverage
 *     fails here and not only on the GPU machine)
 *   - route taken: the two-kernel route queues one igemm_reduce_out and no
 *     cluster launch per split call (lucid_conv_igemm_reduce_count,
 *     lucid_conv_igemm_cluster_count), the cluster route one cluster launch
 *     and no igemm_reduce_out
 *   - forward y and backward-data dx with beta 0 (outputs poisoned with NaN
 *     before each call: an element no block folds stays NaN, and beta 0
 *     must never read dx) and beta 1 (dx starting from the same random
 *     values), cluster route run 3 times: every run bitwise equal to the
 *     two-kernel route; y and beta-0 dx against the CPU (relative Frobenius
 *     <= 1e-2, test_nn_cuda.c's bf16/f16 conv tolerance)
 *   - CUDA graph: forward, backward-data beta 0 and beta 1 captured on the
 *     cluster route after the eager runs and replayed 3 times (outputs
 *     poisoned / beta-1 dx reset before each replay): every replay bitwise
 *     equal to the two-kernel route, one cluster launch and no
 *     igemm_reduce_out recorded per split call
 *   - fresh context, cluster route first (nothing warmed up, so the
 *     occupancy query and the attribute run inside the capture too): a
 *     capture right away records the cluster route and its replay gives
 *     the two-kernel bits of the first context.
 * Each case's name carries its split counts (fwd S / dgrad S).  Without a
 * CUDA device the GPU groups print one skip line each.
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "train/graph.h"

/* cuda/ test hooks; absent (NULL) in a CPU-only build */
#if defined(__GNUC__)
#define WEAK __attribute__((weak))
#else
#define WEAK
#endif
WEAK int lucid_cuda_nn_set_conv_mode(lucid_ctx *ctx, int mode);
WEAK int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route);
WEAK int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route);
WEAK int lucid_cuda_nn_set_igemm_cluster(lucid_ctx *ctx, int route);
WEAK int lucid_conv_igemm_split_count(const int geom[15], int pass);
WEAK unsigned long lucid_conv_igemm_reduce_count(void);
WEAK unsigned long lucid_conv_igemm_cluster_count(void);

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* A conv (groups 1, dilation 1, square kernel k, stride s, padding p) and
 * the split counts its forward (fs) and backward-data (ds) passes must have
 * (1: not split; a strided backward-data runs by stride phases, never
 * split).  The comment: each pass's kernel variant, K, chunk and output
 * tiles ("tail": the last split is shorter). */
typedef struct kcase {
    const char *tag;
    int N, Cin, H, W, Cout, k, s, p, bias, fs, ds;
} kcase;

static const kcase CASES[] = {
    {"1x1 100>5 9x5 N2 bias", 2, 100, 9, 5, 5, 1, 1, 0, 1, 2, 1}, /* fwd k1 K 100 chunk 64 tiles 2 tail */
    {"1x1 5>100 8x8 (vector)", 1, 5, 8, 8, 100, 1, 1, 0, 0, 1, 2}, /* dgrad kv1 K 100 chunk 64 tiles 1 tail */
    {"5x5 8>5 9x5 bias", 1, 8, 9, 5, 5, 5, 1, 2, 1, 3, 2}, /* fwd K 200 chunk 96 tail; dgrad K 125 chunk 64 tail */
    {"5x5 5>8 9x5", 1, 5, 9, 5, 8, 5, 1, 2, 0, 2, 3},      /* fwd K 125 chunk 64 tail; dgrad K 200 chunk 96 tail */
    {"1x1 256>5 9x5", 1, 256, 9, 5, 5, 1, 1, 0, 0, 4, 1},  /* fwd k1 K 256 chunk 64 */
    {"1x1 5>256 8x8 (vector) bias", 1, 5, 8, 8, 256, 1, 1, 0, 1, 1, 4}, /* dgrad kv1 K 256 chunk 64 */
    {"1x1 300>5 8x8 (vector)", 1, 300, 8, 8, 5, 1, 1, 0, 0, 5, 1},  /* fwd kv1 K 300 chunk 64 tail */
    {"1x1 5>300 9x5 bias", 1, 5, 9, 5, 300, 1, 1, 0, 1, 1, 5},      /* dgrad k1 K 300 chunk 64 tail */
    /* tap-major: fwd K 576 chunk 96, 38 tiles (Cout 70: a 6-row tile); dgrad K 864 chunk 96, 19 tiles */
    {"3x3 40>70 20x20 N3 bias", 3, 40, 20, 20, 70, 3, 1, 1, 1, 6, 9},
    {"5x5 17>5 9x5", 1, 17, 9, 5, 5, 5, 1, 2, 0, 7, 2},           /* fwd K 425 chunk 64 tail */
    {"5x5 5>17 9x5 bias", 1, 5, 9, 5, 17, 5, 1, 2, 1, 2, 7},      /* dgrad K 425 chunk 64 tail */
    /* fwd K 1000 chunk 128 tail, 30 tiles; dgrad K 1750 chunk 128 tail, 15 tiles */
    {"5x5 40>70 30x10 N3", 3, 40, 30, 10, 70, 5, 1, 2, 0, 8, 14},
    /* fwd K 1750 chunk 128 tail, 15 tiles; dgrad K 1000 chunk 128 tail, 30 tiles */
    {"5x5 70>40 30x10 N3 bias", 3, 70, 30, 10, 40, 5, 1, 2, 1, 14, 8},
    {"3x3 40>5 9x5 bias", 1, 40, 9, 5, 5, 3, 1, 1, 1, 9, 1},      /* fwd tap-major K 576 chunk 64 */
    /* fwd K 1275 chunk 128 tail, 24 tiles; dgrad K 1750 chunk 128 tail, 12 tiles */
    {"5x5 51>70 16x16 N3", 3, 51, 16, 16, 70, 5, 1, 2, 0, 10, 14},
    /* fwd K 1750 chunk 128 tail, 12 tiles; dgrad K 1275 chunk 128 tail, 24 tiles */
    {"5x5 70>51 16x16 N3", 3, 70, 16, 16, 51, 5, 1, 2, 0, 14, 10},
    /* fwd K 1000 chunk 96 tail, 19 tiles (5 rows of 64); dgrad K 125 */
    {"5x5 40>5 20x20 N3 bias", 3, 40, 20, 20, 5, 5, 1, 2, 1, 11, 2},
    {"5x5 5>40 20x20 N3", 3, 5, 20, 20, 40, 5, 1, 2, 0, 2, 11},   /* dgrad K 1000 chunk 96 tail */
    {"3x3 100>5 9x5", 1, 100, 9, 5, 5, 3, 1, 1, 0, 12, 1},        /* fwd tap-major K 1152 chunk 96 */
    {"3x3 5>100 9x5 bias", 1, 5, 9, 5, 100, 3, 1, 1, 1, 1, 12},   /* dgrad tap-major K 1152 chunk 96 */
    {"5x5 64>5 9x5 bias", 1, 64, 9, 5, 5, 5, 1, 2, 1, 13, 2},     /* fwd K 1600 chunk 128 tail */
    {"5x5 5>64 9x5", 1, 5, 9, 5, 64, 5, 1, 2, 0, 2, 13},          /* dgrad K 1600 chunk 128 tail */
    {"3x3 130>5 9x5", 1, 130, 9, 5, 5, 3, 1, 1, 0, 15, 1},        /* fwd tap-major K 1440 chunk 96 */
    {"3x3 200>5 9x5 bias", 1, 200, 9, 5, 5, 3, 1, 1, 1, 16, 1},   /* fwd tap-major K 2016 chunk 128 tail */
    {"3x3 5>200 9x5", 1, 5, 9, 5, 200, 3, 1, 1, 0, 1, 16},        /* dgrad tap-major K 2016 chunk 128 tail */
    /* fwd K 864 chunk 96, 19 tiles; dgrad K 576 chunk 96, 38 tiles (Cin 70) */
    {"3x3 70>40 20x20 N3", 3, 70, 20, 20, 40, 3, 1, 1, 0, 9, 6},
    /* fwd K 1152 chunk 96, 12 tiles (Cout 130: 3 row tiles); dgrad K 1440 chunk 96, 8 tiles */
    {"3x3 100>130 16x16", 1, 100, 16, 16, 130, 3, 1, 1, 0, 12, 15},
    /* stride 2: fwd K 1152 chunk 96, 4 tiles; dgrad by stride phases */
    {"3x3 s2 100>70 20x20 bias", 1, 100, 20, 20, 70, 3, 2, 1, 1, 12, 1},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static int64_t out_size(int in, int k, int s, int p) {
    return lucid_nn_conv_out_size(in, k, s, p, 1);
}

/* lucid_igemm_geom's 15 ints (cuda/nn_conv_igemm.cuh) */
static void geom_of(const kcase *c, int g[15]) {
    int Ho = (int)out_size(c->H, c->k, c->s, c->p), Wo = (int)out_size(c->W, c->k, c->s, c->p);
    int v[15] = {c->N, c->Cin, c->H, c->W, c->Cout, Ho, Wo, c->k, c->k, c->s, c->s, c->p, c->p, 1, 1};
    memcpy(g, v, sizeof v);
}

/* Host: every case's split counts as written, and 2..16 covered per pass. */
static void test_split_counts(void) {
    const char *pre = "cfold split counts";
    if (!lucid_conv_igemm_split_count) {
        TEST_SKIP(pre, "no CUDA build (lucid_conv_igemm_split_count absent)");
        return;
    }
    unsigned seen[2] = {0, 0};
    int bad = 0;
    for (size_t i = 0; i < NCASES; i++) {
        int g[15];
        geom_of(&CASES[i], g);
        for (int pass = 0; pass < 2; pass++) {
            int got = lucid_conv_igemm_split_count(g, pass);
            int want = pass == 0 ? CASES[i].fs : CASES[i].ds;
            if (got != want) {
                TEST_FAIL(NAME("%s: %s %s", pre, CASES[i].tag, pass ? "dgrad" : "fwd"),
                          "split count %d, the case expects %d", got, want);
                bad = 1;
            }
            if (got >= 1 && got <= 16) seen[pass] |= 1u << got;
        }
    }
    if (!bad) TEST_OK(NAME("%s: %zu cases as written", pre, NCASES));
    for (int pass = 0; pass < 2; pass++) {
        unsigned want = 0;
        for (int s = 2; s <= 16; s++) want |= 1u << s;
        if ((seen[pass] & want) == want)
            TEST_OK(NAME("%s: %s covers 2..16", pre, pass ? "dgrad" : "fwd"));
        else
            TEST_FAIL(NAME("%s: %s covers 2..16", pre, pass ? "dgrad" : "fwd"),
                      "missing mask 0x%x", want & ~seen[pass]);
    }
}

/* The launches of the routes around a call: igemm_reduce_out and cluster
 * launches since (r0, c0) must be (wr, wc). */
static void check_launches(const char *name, unsigned long r0, unsigned long c0, unsigned long wr,
                           unsigned long wc) {
    unsigned long dr = lucid_conv_igemm_reduce_count() - r0;
    unsigned long dc = lucid_conv_igemm_cluster_count() - c0;
    if (dr == wr && dc == wc) TEST_OK(name);
    else
        TEST_FAIL(name, "%lu igemm_reduce_out and %lu cluster launches, expected %lu and %lu", dr,
                  dc, wr, wc);
}

/* The conv's tensors: host inputs, their device copies, outputs. */
typedef struct kbufs {
    lucid_tensor *hx, *hw, *hb, *hdy, *hdx1;
    lucid_tensor *gx, *gw, *gb, *gdy;
    lucid_tensor *y, *dx0, *dx1;     /* outputs of the route under test */
    lucid_tensor *ry, *rdx0, *rdx1;  /* two-kernel route (host copies) */
} kbufs;

static void kbufs_free(kbufs *b) {
    lucid_tensor **t = (lucid_tensor **)b;
    for (size_t i = 0; i < sizeof *b / sizeof(lucid_tensor *); i++) rel(t[i]);
    memset(b, 0, sizeof *b);
}

/* The outputs reset before a run: y, dx0 NaN; dx1 = the beta-1 start. */
static lucid_status reset_out(kbufs *b) {
    lucid_status s = lucid_fill(ctx, b->y, NAN);
    if (!s) s = lucid_fill(ctx, b->dx0, NAN);
    if (!s) s = lucid_copy(ctx, b->dx1, b->hdx1);
    return s;
}

/* forward, backward-data beta 0, backward-data beta 1 */
static lucid_status run_passes(kbufs *b, const lucid_conv2d_params *p) {
    lucid_status s = lucid_nn_conv2d_forward(ctx, b->gx, b->y, b->gw, b->gb, p);
    if (!s) s = lucid_nn_conv2d_backward_input(ctx, b->gx, b->gdy, b->dx0, b->gw, p, 0.0);
    if (!s) s = lucid_nn_conv2d_backward_input(ctx, b->gx, b->gdy, b->dx1, b->gw, p, 1.0);
    return s;
}

static void cmp_routes(const char *pre, const char *what, kbufs *b) {
    cmp_bits(NAME("%s: %s y = two-kernel route", pre, what), b->y, b->ry);
    cmp_bits(NAME("%s: %s dx beta 0 = two-kernel route", pre, what), b->dx0, b->rdx0);
    cmp_bits(NAME("%s: %s dx beta 1 = two-kernel route", pre, what), b->dx1, b->rdx1);
}

/* Device tensors of one case (hrand inputs with a seed per case and dtype,
 * NaN outputs); 0 on failure. */
static int kbufs_make(kbufs *b, const kcase *c, lucid_dtype dt, const char *pre) {
    int64_t Ho = out_size(c->H, c->k, c->s, c->p), Wo = out_size(c->W, c->k, c->s, c->p);
    int64_t xs[4] = {c->N, c->Cin, c->H, c->W}, ws[4] = {c->Cout, c->Cin, c->k, c->k};
    int64_t ys[4] = {c->N, c->Cout, Ho, Wo}, bs[1] = {c->Cout};
    double fan = 1.0 / sqrt((double)(c->Cin * c->k * c->k));
    memset(b, 0, sizeof *b);
    b->hx = hrand(dt, 4, xs, -1, 1);
    b->hw = hrand(LUCID_F32, 4, ws, -fan, fan);
    b->hb = c->bias ? hrand(LUCID_F32, 1, bs, -fan, fan) : NULL;
    b->hdy = hrand(dt, 4, ys, -1, 1);
    b->hdx1 = hrand(dt, 4, xs, -1, 1);
    b->gx = dev(b->hx);
    b->gw = dev(b->hw);
    b->gb = c->bias ? dev(b->hb) : NULL;
    b->gdy = dev(b->hdy);
    b->y = dpoison(dt, 4, ys);
    b->dx0 = dpoison(dt, 4, xs);
    b->dx1 = dev(b->hdx1);
    if (!b->hx || !b->hw || !b->hdy || !b->hdx1 || !b->gx || !b->gw || !b->gdy || !b->y ||
        !b->dx0 || !b->dx1 || (c->bias && (!b->hb || !b->gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        return 0;
    }
    return 1;
}

/* Routes of ctx for these tests: conv mode auto, 1x1 on the implicit GEMM,
 * the small-channel route off, the split-K fold as `cluster` (1 off, 2 on). */
static void set_routes(int cluster) {
    lucid_cuda_nn_set_conv_mode(ctx, 0);
    lucid_cuda_nn_set_conv1x1(ctx, 1);
    lucid_cuda_nn_set_conv_small(ctx, 1);
    lucid_cuda_nn_set_igemm_cluster(ctx, cluster);
}

static void reset_routes(void) {
    lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_cuda_nn_set_conv_small(ctx, 0);
    lucid_cuda_nn_set_igemm_cluster(ctx, 0);
}

/* Capture run_passes into *gr; 0 on failure (reported). */
static int capture(const char *pre, kbufs *b, const lucid_conv2d_params *p, lucid_graph **gr) {
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    lucid_status s = run_passes(b, p);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        lucid_ctx_capture_end(ctx, NULL);
        return 0;
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, gr));
    return *gr != NULL;
done:
    return 0;
}

static void test_case(const kcase *c, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv cfold %s (fwd S %d, dgrad S %d) %s", c->tag, c->fs, c->ds,
             lucid_dtype_name(dt));
    lucid_conv2d_params p = {c->s, c->s, c->p, c->p, 1, 1, 1};
    int64_t Ho = out_size(c->H, c->k, c->s, c->p), Wo = out_size(c->W, c->k, c->s, c->p);
    int64_t xs[4] = {c->N, c->Cin, c->H, c->W}, ys[4] = {c->N, c->Cout, Ho, Wo};
    unsigned long nsplit = (c->fs > 1) + 2ul * (c->ds > 1); /* split calls of run_passes */
    lucid_tensor *cy = hpoison(dt, 4, ys), *cdx = hpoison(dt, 4, xs);
    lucid_graph *gr = NULL;
    kbufs b;
    unsigned long r0, c0;
    int ok = kbufs_make(&b, c, dt, pre); /* prints its own failure */
    if (ok && (!cy || !cdx)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        ok = 0;
    }
    if (!ok) goto done;

    /* the reference: the two-kernel route */
    set_routes(1);
    r0 = lucid_conv_igemm_reduce_count();
    c0 = lucid_conv_igemm_cluster_count();
    RUN(NAME("%s: two-kernel route", pre), run_passes(&b, &p));
    check_launches(NAME("%s: two-kernel route launches igemm_reduce_out", pre), r0, c0, nsplit, 0);
    b.ry = host(b.y);
    b.rdx0 = host(b.dx0);
    b.rdx1 = host(b.dx1);
    if (!b.ry || !b.rdx0 || !b.rdx1) {
        TEST_FAIL(NAME("%s: copy back", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* the cluster fold, 3 runs */
    set_routes(2);
    for (int rep = 0; rep < 3; rep++) {
        char what[32];
        snprintf(what, sizeof what, "cluster run %d", rep + 1);
        RUN(NAME("%s: reset", pre), reset_out(&b));
        r0 = lucid_conv_igemm_reduce_count();
        c0 = lucid_conv_igemm_cluster_count();
        RUN(NAME("%s: %s", pre, what), run_passes(&b, &p));
        check_launches(NAME("%s: %s: cluster launches, no igemm_reduce_out", pre, what), r0, c0,
                       0, nsplit);
        cmp_routes(pre, what, &b);
    }
    /* against the CPU (the last run's y and beta-0 dx) */
    RUN(NAME("%s: forward cpu", pre), lucid_nn_conv2d_forward(ctx, b.hx, cy, b.hw, b.hb, &p));
    RUN(NAME("%s: backward_input cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, b.hx, b.hdy, cdx, b.hw, &p, 0.0));
    cmp_rel(NAME("%s: cluster y vs cpu", pre), b.y, cy, 1e-2);
    cmp_rel(NAME("%s: cluster dx beta 0 vs cpu", pre), b.dx0, cdx, 1e-2);

    /* captured on the cluster route, replayed 3 times */
    if (!lucid_ctx_graphs_available(ctx)) {
        TEST_SKIP(NAME("%s: graph", pre), "graphs not available on this context");
        goto done;
    }
    r0 = lucid_conv_igemm_reduce_count();
    c0 = lucid_conv_igemm_cluster_count();
    if (!capture(pre, &b, &p, &gr)) goto done;
    check_launches(NAME("%s: graph records cluster launches, no igemm_reduce_out", pre), r0, c0,
                   0, nsplit);
    for (int rep = 0; rep < 3; rep++) {
        char what[32];
        snprintf(what, sizeof what, "replay %d", rep + 1);
        RUN(NAME("%s: reset", pre), reset_out(&b));
        RUN(NAME("%s: %s", pre, what), lucid_graph_launch(ctx, gr));
        cmp_routes(pre, what, &b);
    }
done:
    if (gr) lucid_graph_destroy(gr);
    reset_routes();
    rel(cy);
    rel(cdx);
    kbufs_free(&b);
}

/* A fresh context captured on the cluster route before any eager call
 * (main runs these first: the process has not queried these kernels'
 * clusters yet, so the attribute and occupancy queries run inside the
 * capture, and no arena exists for partials).  The replay must give the
 * bits of the two-kernel route, run eagerly afterwards on the same inputs. */
static void test_capture_first(const kcase *c, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "conv cfold capture first %s (fwd S %d, dgrad S %d) %s", c->tag,
             c->fs, c->ds, lucid_dtype_name(dt));
    lucid_ctx *main_ctx = NULL;
    if (!cuda_test_enter_fresh(pre, &main_ctx)) return;
    lucid_conv2d_params p = {c->s, c->s, c->p, c->p, 1, 1, 1};
    unsigned long nsplit = (c->fs > 1) + 2ul * (c->ds > 1);
    lucid_graph *gr = NULL;
    lucid_tensor *gy = NULL, *gdx0 = NULL, *gdx1 = NULL;
    unsigned long r0, c0;
    kbufs b;
    if (!kbufs_make(&b, c, dt, pre)) goto done;
    if (!lucid_ctx_graphs_available(ctx)) {
        TEST_SKIP(NAME("%s: graph", pre), "graphs not available on this context");
        goto done;
    }
    set_routes(2);
    r0 = lucid_conv_igemm_reduce_count();
    c0 = lucid_conv_igemm_cluster_count();
    if (!capture(pre, &b, &p, &gr)) goto done;
    check_launches(NAME("%s: graph records cluster launches", pre), r0, c0, 0, nsplit);
    RUN(NAME("%s: reset", pre), reset_out(&b));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    gy = host(b.y);
    gdx0 = host(b.dx0);
    gdx1 = host(b.dx1);
    if (!gy || !gdx0 || !gdx1) {
        TEST_FAIL(NAME("%s: copy back", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* the two-kernel route, eager, as the reference */
    set_routes(1);
    RUN(NAME("%s: reset", pre), reset_out(&b));
    RUN(NAME("%s: two-kernel route", pre), run_passes(&b, &p));
    cmp_bits(NAME("%s: replay y = two-kernel route", pre), gy, b.y);
    cmp_bits(NAME("%s: replay dx beta 0 = two-kernel route", pre), gdx0, b.dx0);
    cmp_bits(NAME("%s: replay dx beta 1 = two-kernel route", pre), gdx1, b.dx1);
done:
    if (gr) lucid_graph_destroy(gr);
    rel(gy);
    rel(gdx0);
    rel(gdx1);
    reset_routes();
    kbufs_free(&b);
    cuda_test_leave_fresh(main_ctx);
}

static const char *GROUPS[] = {"conv cfold routes", "conv cfold capture first"};

int main(void) {
    test_split_counts();
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return test_exit();
    if (!lucid_cuda_nn_set_igemm_cluster || !lucid_conv_igemm_reduce_count ||
        !lucid_conv_igemm_cluster_count || !lucid_cuda_nn_set_conv_mode ||
        !lucid_cuda_nn_set_conv1x1 || !lucid_cuda_nn_set_conv_small) {
        TEST_FAIL("conv cfold hooks linked", "a cuda/ test hook is missing in a build with a "
                                             "CUDA device");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_conv_cfold_cuda")) return test_exit();
    /* first (nothing queried yet): one-tile and many-tile cases, both passes
     * split; 16 splits (a non-portable cluster size) */
    test_capture_first(&CASES[2], LUCID_BF16);
    test_capture_first(&CASES[8], LUCID_F16);
    test_capture_first(&CASES[24], LUCID_BF16);
    static const lucid_dtype DTS[2] = {LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < NCASES; i++) test_case(&CASES[i], DTS[d]);
    return cuda_test_finish();
}
