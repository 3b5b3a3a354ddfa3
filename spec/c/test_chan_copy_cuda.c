/*
 * test_chan_copy_cuda.c — lucid_nn_channel_copy_multi on the GPU
 * (cuda/nn_pointwise.cu, chan_copy_multi) and the Concat / Split modules
 * that use it.  Compiles everywhere; without a CUDA device every group
 * prints one skip line.
 *
 * Inputs and starting destinations are random BITS (NaNs with payloads,
 * infinities, subnormals included), so every comparison is bitwise and
 * checks that bits move verbatim and untouched channels keep theirs:
 *   - the multi route (one launch per 16 pieces) = the CPU table (memcpy /
 *     memset per row) = the per-piece route (lucid_nn_chan_copy_multi_
 *     override(0): one lucid_nn_channel_copy per copy piece, lucid_fill(0)
 *     per zero piece) on the GPU, for f32 / bf16 / f16 over cases that take
 *     the vector path (16-byte aligned rows), the scalar path (odd plane
 *     sizes, odd channel offsets of 2-byte dtypes) and both in one launch,
 *     zero-fill pieces, an empty piece, 20 pieces (two launches), N past
 *     grid.y's 65535, grids scaled down to the cap (pieces that want more
 *     blocks than two waves), and one case of 2^31 destination elements
 *     (the 64-bit index kernel);
 *   - launches (lucid_cuda_chan_copy_op_count): a multi call queues
 *     ceil(pieces / 16) kernels; the per-piece route one per copy piece;
 *     LUCID_CHAN_COPY=memcpy one copy / memset per piece, same bits;
 *   - capture: the multi call recorded in a CUDA graph and replayed gives
 *     the eager bits;
 *   - errors: a src on the host next to a dst on the GPU, and f64 on the
 *     GPU;
 *   - modules: Concat(3) and Split([1, 5, 6]) (one gradient missing: zeros)
 *     forward and backward through both routes and on the CPU: bitwise
 *     equal, 4 channel-copy launches on the multi route against 11 on the
 *     per-piece route (3 + 3 + 3 + 2: the zero piece is a lucid_fill there);
 *   - sum pieces (addends: 2..4 sources) next to copy, zero and empty
 *     pieces, on values spread over 2^-12..2^12 with -0 and +inf: the
 *     multi route (chan_sum_multi) = the CPU table = the per-piece route (a
 *     copy, then one beta-1 channel_copy per addend) = LUCID_CHAN_COPY=
 *     memcpy = the whole-tensor chains they replace (lucid_binary ADD, i.e.
 *     map_contig_kernel, and lucid_nn_add_forward, i.e. add_fwd, over
 *     contiguous slice copies), bitwise, for f32 / bf16 / f16 over the
 *     vector path (aligned rows), the scalar path (odd planes, odd channel
 *     offsets), 20 pieces (two launches), N past grid.y and grids past the
 *     cap; launches: ceil(pieces / 16) on the multi route, one per source
 *     of a copy or sum piece on the per-piece route; captured and replayed;
 *   - lucid_nn_add_n, n = 1..4: one launch, bitwise the chain of
 *     lucid_binary ADD.
 */
#include "test_cuda_util.h"
#include "nn/nn.h"

/* A copy (src) or zero-fill (src NULL) piece, no addends. */
static inline lucid_chan_piece CP(lucid_tensor *dst, int64_t dst_c0, const lucid_tensor *src,
                                  int64_t src_c0, int64_t nch) {
    return (lucid_chan_piece){.dst = dst, .dst_c0 = dst_c0, .src = src, .src_c0 = src_c0,
                              .nch = nch};
}

/* cuda/nn_pointwise.cu test hook (nn_common.cuh); NULL in a CPU-only build */
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_chan_copy_op_count(void);

static unsigned long ops(void) {
    return lucid_cuda_chan_copy_op_count ? lucid_cuda_chan_copy_op_count() : 0;
}

static const char *dname(lucid_dtype dt) { return lucid_dtype_name(dt); }
static void rel1(lucid_tensor *t) { if (t) lucid_tensor_release(t); }

static uint64_t bits_state = 0x13198a2e03707344ull;

/* host tensor of random bits */
static lucid_tensor *hbits(lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx, CPU, dt, ndim, shape, &t) != LUCID_OK) return NULL;
    unsigned char *p = lucid_tensor_data(t);
    size_t n = lucid_tensor_nbytes(t);
    for (size_t i = 0; i < n; i += 8) {
        bits_state ^= bits_state << 13;
        bits_state ^= bits_state >> 7;
        bits_state ^= bits_state << 17;
        uint64_t v = bits_state;
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
    return t;
}

/* ------------------------------------------------------------ cases */

#define MAXT 4
#define MAXP 24

/* A piece over tensor indices: dst d, src s (-1: zero fill). */
typedef struct cpiece {
    int d;
    int64_t d0;
    int s;
    int64_t s0, nch;
} cpiece;

typedef struct ccase {
    const char *tag;
    int64_t N, H, W;
    int nd, ns;
    int64_t dc[MAXT], sc[MAXT]; /* channel counts of dsts and srcs */
    int np;
    cpiece p[MAXP];
} ccase;

static const ccase CASES[] = {
    {"gather, odd plane 7x9", 2, 7, 9, 1, 2, {13}, {4, 7}, 4,
     {{0, 0, 0, 1, 3}, {0, 3, -1, 0, 2}, {0, 5, 1, 0, 7}, {0, 12, 0, 0, 0}}},
    {"gather, aligned 16x16", 4, 16, 16, 1, 2, {24}, {8, 16}, 2,
     {{0, 0, 0, 0, 8}, {0, 8, 1, 0, 16}}},
    {"mixed alignment 1x4 (odd channel offsets)", 3, 1, 4, 1, 2, {11}, {6, 5}, 3,
     {{0, 0, 0, 1, 5}, {0, 5, -1, 0, 1}, {0, 6, 1, 0, 5}}},
    {"scatter 20x20 (Split)", 2, 20, 20, 4, 1, {1, 5, 6, 3}, {12}, 5,
     {{0, 0, 0, 0, 1}, {1, 0, 0, 1, 5}, {2, 0, 0, 6, 6}, {3, 0, 0, 9, 2}, {3, 2, -1, 0, 1}}},
    {"N 70000 past grid.y, plane 1x2", 70000, 1, 2, 1, 2, {3}, {1, 2}, 2,
     {{0, 0, 1, 0, 2}, {0, 2, 0, 0, 1}}},
    {"grids past the cap, 256x256", 8, 256, 256, 1, 2, {33}, {16, 16}, 3,
     {{0, 0, 0, 0, 16}, {0, 16, 1, 0, 16}, {0, 32, -1, 0, 1}}},
};

/* the 20-piece case (two launches): one-channel pieces reversed, every
 * seventh a zero fill */
static ccase case20(void) {
    ccase c = {"20 pieces 5x5", 2, 5, 5, 1, 1, {21}, {20}, 20, {{0}}};
    for (int i = 0; i < 20; i++) c.p[i] = (cpiece){0, 20 - i, i % 7 == 3 ? -1 : 0, i, 1};
    return c;
}

typedef struct cset {
    lucid_tensor *d[MAXT], *s[MAXT];
    lucid_chan_piece p[MAXP];
} cset;

static void cset_pieces(const ccase *c, cset *t) {
    for (int i = 0; i < c->np; i++) {
        const cpiece *q = &c->p[i];
        t->p[i] = CP(t->d[q->d], q->d0, q->s < 0 ? NULL : t->s[q->s], q->s0, q->nch);
    }
}

static void cset_rel(cset *t) {
    for (int i = 0; i < MAXT; i++) {
        rel1(t->d[i]);
        rel1(t->s[i]);
        t->d[i] = t->s[i] = NULL;
    }
}

/* dsts of g equal dsts of h bitwise */
static void cmp_set(const char *name, const ccase *c, const cset *g, const cset *h) {
    for (int i = 0; i < c->nd; i++) {
        char n2[360];
        snprintf(n2, sizeof n2, "%s (dst %d)", name, i);
        cmp_bits(n2, g->d[i], h->d[i]);
    }
}

static unsigned long live_pieces(const ccase *c, int copies_only) {
    unsigned long k = 0;
    for (int i = 0; i < c->np; i++)
        if (c->p[i].nch > 0 && (!copies_only || c->p[i].s >= 0)) k++;
    return k;
}

/* One case in dtype dt: host (CPU table), GPU multi, GPU per-piece, and
 * (mode 1) GPU under LUCID_CHAN_COPY=memcpy, (mode 2) captured + replayed. */
static void test_case(const ccase *c, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "channel_copy_multi %s %s", dname(dt), c->tag);
    cset h, g1, g2, g3, g4;
    memset(&h, 0, sizeof h);
    g1 = g2 = g3 = g4 = h;
    lucid_graph *gr = NULL;
    int ok = 1;
    for (int i = 0; i < c->nd && ok; i++) {
        int64_t sh[4] = {c->N, c->dc[i], c->H, c->W};
        h.d[i] = hbits(dt, 4, sh);
        g1.d[i] = dev(h.d[i]);
        g2.d[i] = dev(h.d[i]);
        g3.d[i] = dev(h.d[i]);
        g4.d[i] = dev(h.d[i]);
        ok = h.d[i] && g1.d[i] && g2.d[i] && g3.d[i] && g4.d[i];
    }
    for (int i = 0; i < c->ns && ok; i++) {
        int64_t sh[4] = {c->N, c->sc[i], c->H, c->W};
        h.s[i] = hbits(dt, 4, sh);
        g1.s[i] = dev(h.s[i]);
        ok = h.s[i] && g1.s[i];
        if (ok) {
            lucid_tensor_retain(g1.s[i]);
            lucid_tensor_retain(g1.s[i]);
            lucid_tensor_retain(g1.s[i]);
            g2.s[i] = g3.s[i] = g4.s[i] = g1.s[i];
        }
    }
    if (!ok) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    cset_pieces(c, &h);
    cset_pieces(c, &g1);
    cset_pieces(c, &g2);
    cset_pieces(c, &g3);
    cset_pieces(c, &g4);
    RUN(NAME("%s: cpu", pre), lucid_nn_channel_copy_multi(ctx, c->np, h.p));
    unsigned long o0 = ops();
    lucid_nn_chan_copy_multi_override(1);
    lucid_status s1 = lucid_nn_channel_copy_multi(ctx, c->np, g1.p);
    unsigned long o1 = ops();
    lucid_nn_chan_copy_multi_override(0);
    lucid_status s2 = lucid_nn_channel_copy_multi(ctx, c->np, g2.p);
    unsigned long o2 = ops();
    lucid_nn_chan_copy_multi_override(1);
    RUN(NAME("%s: multi route", pre), s1);
    RUN(NAME("%s: per-piece route", pre), s2);
    cmp_set(NAME("%s: multi = cpu, bitwise", pre), c, &g1, &h);
    cmp_set(NAME("%s: per-piece = cpu, bitwise", pre), c, &g2, &h);
    unsigned long want1 = (live_pieces(c, 0) + 15) / 16, want2 = live_pieces(c, 1);
    CHECK(NAME("%s: multi route queues %lu launch(es), per-piece %lu", pre, want1, want2),
          o1 - o0 == want1 && o2 - o1 == want2, "got %lu and %lu", o1 - o0, o2 - o1);
    /* LUCID_CHAN_COPY=memcpy: one copy / memset per piece, same bits */
    setenv("LUCID_CHAN_COPY", "memcpy", 1);
    o0 = ops();
    lucid_status s3 = lucid_nn_channel_copy_multi(ctx, c->np, g3.p);
    o1 = ops();
    unsetenv("LUCID_CHAN_COPY");
    RUN(NAME("%s: LUCID_CHAN_COPY=memcpy", pre), s3);
    cmp_set(NAME("%s: LUCID_CHAN_COPY=memcpy = cpu, bitwise", pre), c, &g3, &h);
    CHECK(NAME("%s: LUCID_CHAN_COPY=memcpy queues one operation per piece", pre),
          o1 - o0 == live_pieces(c, 0), "got %lu, want %lu", o1 - o0, live_pieces(c, 0));
    /* capture: the multi call recorded and replayed */
    if (!lucid_ctx_graphs_available(ctx)) {
        TEST_SKIP(NAME("%s: capture", pre), "graphs not available on this context");
        goto done;
    }
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_status s = lucid_nn_channel_copy_multi(ctx, c->np, g4.p);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: call while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    cmp_set(NAME("%s: replay = cpu, bitwise", pre), c, &g4, &h);
done:
    if (gr) lucid_graph_destroy(gr);
    cset_rel(&h);
    cset_rel(&g1);
    cset_rel(&g2);
    cset_rel(&g3);
    cset_rel(&g4);
}

/* ------------------------------------------------------------ 64-bit */

/* dst [1, 8, 2^28] f16 (2^31 elements: the 64-bit index kernel), src [1, 1,
 * 2^28]: channels 7 and 0 copied, 6 zeroed, 5 untouched (NaN). */
static void test_wide(void) {
    const char *pre = "channel_copy_multi f16 2^31-element dst (64-bit index)";
    int64_t S = (int64_t)1 << 28, ds[3] = {1, 8, S}, ss[3] = {1, 1, S};
    lucid_tensor *gd = NULL, *hs = NULL, *gs = NULL, *v[4] = {NULL, NULL, NULL, NULL};
    lucid_tensor *hv[4] = {NULL, NULL, NULL, NULL}, *hz = NULL;
    if (lucid_tensor_empty(ctx, GPU, LUCID_F16, 3, ds, &gd) != LUCID_OK) {
        TEST_SKIP(pre, "4 GiB on the GPU not available: %s", lucid_ctx_error(ctx));
        return;
    }
    hs = hbits(LUCID_F16, 3, ss);
    gs = dev(hs);
    hz = hzeros(LUCID_F16, 3, ss);
    if (!hs || !gs || !hz) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: poison", pre), lucid_fill(ctx, gd, NAN));
    lucid_chan_piece pc[3] = {CP(gd, 7, gs, 0, 1), CP(gd, 6, NULL, 0, 1), CP(gd, 0, gs, 0, 1)};
    unsigned long o0 = ops();
    RUN(NAME("%s", pre), lucid_nn_channel_copy_multi(ctx, 3, pc));
    CHECK(NAME("%s: one launch", pre), ops() - o0 == 1, "got %lu", ops() - o0);
    static const int64_t CH[4] = {7, 6, 0, 5};
    for (int i = 0; i < 4; i++) /* N = 1: a channel is a contiguous view */
        RUN(NAME("%s: view", pre), lucid_tensor_narrow(ctx, gd, 1, CH[i], 1, &v[i]));
    cmp_bits(NAME("%s: channel 7 = src", pre), v[0], hs);
    cmp_bits(NAME("%s: channel 6 = 0", pre), v[1], hz);
    cmp_bits(NAME("%s: channel 0 = src", pre), v[2], hs);
    hv[3] = host(v[3]);
    {
        const uint16_t *p = hv[3] ? lucid_tensor_data(hv[3]) : NULL;
        int64_t bad = p ? -1 : 0;
        for (int64_t k = 0; p && k < S && bad < 0; k++)
            if ((p[k] & 0x7c00) != 0x7c00 || (p[k] & 0x03ff) == 0) bad = k;
        CHECK(NAME("%s: channel 5 untouched (NaN)", pre), bad < 0, "element %lld",
              (long long)bad);
    }
done:
    for (int i = 0; i < 4; i++) {
        rel1(v[i]);
        rel1(hv[i]);
    }
    rel1(gd); rel1(hs); rel1(gs); rel1(hz);
}

/* ------------------------------------------------------------ errors */

static void test_errors(void) {
    int64_t sh[4] = {2, 4, 3, 3};
    lucid_tensor *gd = NULL, *hs = hbits(LUCID_F32, 4, sh), *g64 = NULL, *gs = NULL;
    gd = dev(hs);
    gs = dev(hs);
    if (!gd || !hs || !gs) {
        TEST_FAIL("channel_copy_multi cuda errors: setup", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_chan_piece p1[2] = {CP(gd, 0, gs, 0, 2), CP(gd, 2, hs, 0, 2)};
    lucid_status st = lucid_nn_channel_copy_multi(ctx, 2, p1);
    CHECK("channel_copy_multi cuda error: a src on the host", st == LUCID_ERR_ARG &&
          strstr(lucid_ctx_error(ctx), "piece 1 src is on another device"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    if (lucid_tensor_empty(ctx, GPU, LUCID_F64, 4, sh, &g64) == LUCID_OK) {
        lucid_chan_piece p2[1] = {CP(g64, 0, NULL, 0, 2)};
        st = lucid_nn_channel_copy_multi(ctx, 1, p2);
        CHECK("channel_copy_multi cuda error: f64 is CPU-only", st == LUCID_ERR_UNSUPPORTED &&
              strstr(lucid_ctx_error(ctx), "channel_copy_multi"),
              "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    } else {
        TEST_SKIP("channel_copy_multi cuda error: f64 is CPU-only",
                  "no f64 tensors on the GPU: %s", lucid_ctx_error(ctx));
    }
done:
    rel1(gd); rel1(hs); rel1(g64); rel1(gs);
}

/* ------------------------------------------------------------ modules */

static void test_modules(lucid_dtype dt) {
    char pre[120];
    snprintf(pre, sizeof pre, "Concat(3) / Split([1,5,6]) cuda %s", dname(dt));
    lucid_module *cat[3] = {NULL, NULL, NULL}, *spl[3] = {NULL, NULL, NULL};
    int64_t sizes[3] = {1, 5, 6};
    int64_t xs0[4] = {2, 3, 10, 12}, xs1[4] = {2, 1, 10, 12}, xs2[4] = {2, 8, 10, 12};
    int64_t s12[4] = {2, 12, 10, 12}, g0s[4] = {2, 1, 10, 12}, g2s[4] = {2, 6, 10, 12};
    lucid_tensor *hx[3] = {hbits(dt, 4, xs0), hbits(dt, 4, xs1), hbits(dt, 4, xs2)};
    lucid_tensor *hgy = hbits(dt, 4, s12), *hxs = hbits(dt, 4, s12);
    lucid_tensor *hgo[3] = {hbits(dt, 4, g0s), NULL, hbits(dt, 4, g2s)};
    lucid_tensor *gx[3] = {dev(hx[0]), dev(hx[1]), dev(hx[2])}, *ggy = dev(hgy), *gxs = dev(hxs);
    lucid_tensor *ggo[3] = {dev(hgo[0]), NULL, dev(hgo[2])};
    unsigned long n_ops[2] = {0, 0};
    /* run 0: per-piece on the GPU, 1: multi on the GPU, 2: the CPU */
    for (int r = 0; r < 3; r++) {
        int gpu = r < 2;
        lucid_tensor **x = gpu ? gx : hx, *gy = gpu ? ggy : hgy, *xsp = gpu ? gxs : hxs;
        lucid_tensor **go = gpu ? ggo : hgo;
        if (!x[0] || !x[1] || !x[2] || !gy || !xsp || !go[0] || !go[2]) {
            TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        RUN(NAME("%s: create", pre), lucid_module_concat_create(ctx, 3, &cat[r]));
        RUN(NAME("%s: create", pre), lucid_module_split_create(ctx, 3, sizes, &spl[r]));
        lucid_nn_chan_copy_multi_override(r == 1);
        unsigned long o0 = ops();
        const lucid_tensor *sx = xsp;
        lucid_status s = lucid_module_forward(ctx, cat[r], 3, (const lucid_tensor *const *)x);
        if (!s)
            s = lucid_module_backward(ctx, cat[r], 3, (const lucid_tensor *const *)x, 1,
                                      (const lucid_tensor *const *)&gy);
        if (!s) s = lucid_module_forward(ctx, spl[r], 1, &sx);
        if (!s)
            s = lucid_module_backward(ctx, spl[r], 1, &sx, 3, (const lucid_tensor *const *)go);
        if (gpu) n_ops[r] = ops() - o0;
        lucid_nn_chan_copy_multi_override(1);
        RUN(NAME("%s: forward + backward (%s)", pre,
                 r == 0 ? "per-piece" : r == 1 ? "multi" : "cpu"), s);
    }
    {
        lucid_tensor *h[8] = {NULL};
        h[0] = host(lucid_module_output(cat[0], 0));
        for (int i = 0; i < 3; i++) h[1 + i] = host(lucid_module_grad_input(cat[0], i));
        for (int i = 0; i < 3; i++) h[4 + i] = host(lucid_module_output(spl[0], i));
        h[7] = host(lucid_module_grad_input(spl[0], 0));
        /* multi = per-piece, and per-piece = cpu: all three bitwise equal */
        cmp_bits(NAME("%s: Concat forward multi = per-piece", pre),
                 lucid_module_output(cat[1], 0), h[0]);
        for (int i = 0; i < 3; i++)
            cmp_bits(NAME("%s: Concat grad %d multi = per-piece", pre, i),
                     lucid_module_grad_input(cat[1], i), h[1 + i]);
        for (int i = 0; i < 3; i++)
            cmp_bits(NAME("%s: Split output %d multi = per-piece", pre, i),
                     lucid_module_output(spl[1], i), h[4 + i]);
        cmp_bits(NAME("%s: Split grad (piece 1 missing: zeros) multi = per-piece", pre),
                 lucid_module_grad_input(spl[1], 0), h[7]);
        lucid_tensor *c[8] = {lucid_module_output(cat[2], 0), lucid_module_grad_input(cat[2], 0),
                              lucid_module_grad_input(cat[2], 1),
                              lucid_module_grad_input(cat[2], 2), lucid_module_output(spl[2], 0),
                              lucid_module_output(spl[2], 1), lucid_module_output(spl[2], 2),
                              lucid_module_grad_input(spl[2], 0)};
        int eq = 1;
        for (int i = 0; i < 8; i++)
            eq = eq && h[i] && c[i] && lucid_tensor_nbytes(h[i]) == lucid_tensor_nbytes(c[i]) &&
                 memcmp(lucid_tensor_data(h[i]), lucid_tensor_data(c[i]),
                        lucid_tensor_nbytes(c[i])) == 0;
        CHECK(NAME("%s: per-piece (gpu) = cpu, bitwise", pre), eq, "outputs differ");
        CHECK(NAME("%s: channel-copy launches: multi 4, per-piece 11", pre),
              n_ops[1] == 4 && n_ops[0] == 11, "multi %lu, per-piece %lu", n_ops[1], n_ops[0]);
        for (int i = 0; i < 8; i++) rel1(h[i]);
    }
done:
    for (int r = 0; r < 3; r++) {
        if (cat[r]) lucid_module_release(cat[r]);
        if (spl[r]) lucid_module_release(spl[r]);
    }
    for (int i = 0; i < 3; i++) {
        rel1(hx[i]); rel1(gx[i]); rel1(hgo[i]); rel1(ggo[i]);
    }
    rel1(hgy); rel1(hxs); rel1(ggy); rel1(gxs);
}

/* ------------------------------------------------------------ sums */

/* host tensor of values u * 2^e (u in [-1, 1), e in [-12, 12]) rounded to
 * dt; element 0 is -0, element 1 +inf */
static lucid_tensor *hvals(lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *f = NULL, *o = NULL;
    if (lucid_tensor_empty(ctx, CPU, LUCID_F32, ndim, shape, &f) != LUCID_OK) return NULL;
    float *p = lucid_tensor_data(f);
    int64_t n = lucid_tensor_numel(f);
    for (int64_t i = 0; i < n; i++) {
        bits_state ^= bits_state << 13;
        bits_state ^= bits_state >> 7;
        bits_state ^= bits_state << 17;
        double u = (double)(bits_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
        p[i] = (float)ldexp(u, (int)((bits_state >> 3) % 25) - 12);
    }
    if (n > 0) p[0] = -0.0f;
    if (n > 1) p[1] = INFINITY;
    if (dt == LUCID_F32) return f;
    if (lucid_tensor_to(ctx, f, CPU, dt, &o) != LUCID_OK) o = NULL;
    lucid_tensor_release(f);
    return o;
}

/* A piece over tensor indices: dst d, ns sources s[k] at channel s0[k]
 * (0: zero fill, 1: copy, 2..4: sum). */
typedef struct spiece {
    int d;
    int64_t d0;
    int ns;
    int s[LUCID_CHAN_SUM_MAX];
    int64_t s0[LUCID_CHAN_SUM_MAX];
    int64_t nch;
} spiece;

typedef struct scase {
    const char *tag;
    int64_t N, H, W;
    int nd, ns;
    int64_t dc[MAXT], sc[MAXT];
    int np;
    spiece p[MAXP];
} scase;

static const scase SCASES[] = {
    {"sums, odd plane 7x9", 2, 7, 9, 1, 4, {16}, {5, 7, 3, 4}, 6,
     {{0, 0, 2, {0, 1}, {1, 4}, 3},
      {0, 3, 3, {2, 1, 0}, {0, 1, 2}, 3},
      {0, 6, 4, {3, 2, 1, 0}, {1, 1, 0, 3}, 2},
      {0, 8, 1, {1}, {0}, 4},
      {0, 12, 0, {0}, {0}, 3},
      {0, 15, 2, {0, 1}, {0, 0}, 0}}},
    {"sums, aligned 16x16", 4, 16, 16, 1, 3, {24}, {8, 16, 8}, 3,
     {{0, 0, 3, {0, 1, 2}, {0, 8, 0}, 8}, {0, 8, 2, {1, 0}, {0, 0}, 8}, {0, 16, 1, {2}, {0}, 8}}},
    {"sums, mixed alignment 1x4 (odd channel offsets)", 3, 1, 4, 1, 2, {11}, {6, 5}, 3,
     {{0, 0, 2, {0, 1}, {1, 0}, 5}, {0, 5, 0, {0}, {0}, 1}, {0, 6, 3, {1, 0, 1}, {0, 1, 0}, 5}}},
    {"sums, N 70000 past grid.y, plane 1x2", 70000, 1, 2, 1, 2, {3}, {1, 2}, 3,
     {{0, 0, 2, {1, 1}, {0, 1}, 1}, {0, 1, 3, {1, 0, 1}, {0, 0, 1}, 1}, {0, 2, 1, {0}, {0}, 1}}},
    {"sums, grids past the cap, 256x256", 8, 256, 256, 1, 2, {33}, {16, 16}, 3,
     {{0, 0, 2, {0, 1}, {0, 0}, 16}, {0, 16, 4, {1, 0, 1, 0}, {0, 0, 0, 0}, 16},
      {0, 32, 0, {0}, {0}, 1}}},
};

/* 20 one-channel sum pieces into two dsts (two launches) */
static scase scase20(void) {
    scase c = {"sums, 20 pieces 5x5", 2, 5, 5, 2, 3, {10, 10}, {7, 5, 3}, 20, {{0}}};
    for (int i = 0; i < 20; i++)
        c.p[i] = (spiece){i % 2, i / 2, i % 3 ? 3 : 2, {0, 1, 2}, {i % 7, i % 5, i % 3}, 1};
    return c;
}

static void sset_pieces(const scase *c, cset *t) {
    for (int i = 0; i < c->np; i++) {
        const spiece *q = &c->p[i];
        lucid_chan_piece *p = &t->p[i];
        *p = CP(t->d[q->d], q->d0, q->ns ? t->s[q->s[0]] : NULL, q->s0[0], q->nch);
        for (int k = 1; k < q->ns; k++) {
            p->add[k - 1] = t->s[q->s[k]];
            p->add_c0[k - 1] = q->s0[k];
        }
    }
}

/* launches: multi ceil(live / 16); per-piece one per source of a live
 * piece (zero pieces: lucid_fill, not counted); memcpy one per source, one
 * per zero piece */
static unsigned long sum_ops(const scase *c, int route) {
    unsigned long live = 0, srcs = 0, zeros = 0;
    for (int i = 0; i < c->np; i++) {
        if (c->p[i].nch == 0) continue;
        live++;
        srcs += (unsigned long)c->p[i].ns;
        zeros += c->p[i].ns == 0;
    }
    return route == 0 ? (live + 15) / 16 : route == 1 ? srcs : srcs + zeros;
}

/* channels [c0, c0+nch) of a GPU tensor, contiguous (NULL on failure) */
static lucid_tensor *gslice(const lucid_tensor *t, int64_t c0, int64_t nch) {
    lucid_tensor *v = NULL, *o = NULL;
    int64_t sh[LUCID_MAX_DIMS];
    memcpy(sh, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    sh[1] = nch;
    if (lucid_tensor_narrow(ctx, t, 1, c0, nch, &v) == LUCID_OK &&
        lucid_tensor_empty(ctx, GPU, t->dtype, t->ndim, sh, &o) == LUCID_OK &&
        lucid_copy(ctx, o, v) != LUCID_OK) {
        lucid_tensor_release(o);
        o = NULL;
    }
    rel1(v);
    return o;
}

/* The unfused composition on the GPU: each sum piece as whole-tensor
 * additions of contiguous slice copies (add_fwd 0: lucid_binary ADD in
 * place, map_contig_kernel; 1: lucid_nn_add_forward, add_fwd), copied in
 * with a beta-0 channel_copy; copy and zero pieces through the per-piece
 * route. */
static lucid_status gpu_unfused(const scase *c, cset *t, int add_fwd) {
    for (int i = 0; i < c->np; i++) {
        const spiece *q = &c->p[i];
        lucid_chan_piece *p = &t->p[i];
        if (q->nch == 0) continue;
        if (q->ns < 2) {
            lucid_nn_chan_copy_multi_override(0);
            lucid_status st = lucid_nn_channel_copy_multi(ctx, 1, p);
            lucid_nn_chan_copy_multi_override(1);
            if (st) return st;
            continue;
        }
        lucid_tensor *r = gslice(p->src, p->src_c0, q->nch);
        lucid_status st = r ? LUCID_OK : LUCID_ERR_STATE;
        for (int k = 1; k < q->ns && !st; k++) {
            lucid_tensor *a = gslice(p->add[k - 1], p->add_c0[k - 1], q->nch);
            st = !a ? LUCID_ERR_STATE
                 : add_fwd ? lucid_nn_add_forward(ctx, r, a, r)
                           : lucid_binary(ctx, LUCID_OP_ADD, r, r, a);
            rel1(a);
        }
        if (!st) st = lucid_nn_channel_copy(ctx, p->dst, p->dst_c0, r, 0, q->nch, 0.0);
        rel1(r);
        if (st) return st;
    }
    return LUCID_OK;
}

static void test_sum_case(const scase *c, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "channel_copy_multi %s %s", dname(dt), c->tag);
    enum { R = 6 }; /* 0 multi, 1 per-piece, 2 memcpy, 3 ADD chain, 4 add_fwd chain, 5 capture */
    cset h, g[R];
    memset(&h, 0, sizeof h);
    for (int r = 0; r < R; r++) g[r] = h;
    lucid_graph *gr = NULL;
    int ok = 1;
    for (int i = 0; i < c->nd && ok; i++) {
        int64_t sh[4] = {c->N, c->dc[i], c->H, c->W};
        h.d[i] = hvals(dt, 4, sh);
        ok = h.d[i] != NULL;
        for (int r = 0; r < R && ok; r++) ok = (g[r].d[i] = dev(h.d[i])) != NULL;
    }
    for (int i = 0; i < c->ns && ok; i++) {
        int64_t sh[4] = {c->N, c->sc[i], c->H, c->W};
        h.s[i] = hvals(dt, 4, sh);
        g[0].s[i] = dev(h.s[i]);
        ok = h.s[i] && g[0].s[i];
        for (int r = 1; r < R && ok; r++) {
            lucid_tensor_retain(g[0].s[i]);
            g[r].s[i] = g[0].s[i];
        }
    }
    if (!ok) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    sset_pieces(c, &h);
    for (int r = 0; r < R; r++) sset_pieces(c, &g[r]);
    RUN(NAME("%s: cpu", pre), lucid_nn_channel_copy_multi(ctx, c->np, h.p));
    unsigned long o[4];
    o[0] = ops();
    lucid_nn_chan_copy_multi_override(1);
    RUN(NAME("%s: multi route", pre), lucid_nn_channel_copy_multi(ctx, c->np, g[0].p));
    o[1] = ops();
    lucid_nn_chan_copy_multi_override(0);
    lucid_status s1 = lucid_nn_channel_copy_multi(ctx, c->np, g[1].p);
    lucid_nn_chan_copy_multi_override(1);
    RUN(NAME("%s: per-piece route", pre), s1);
    o[2] = ops();
    setenv("LUCID_CHAN_COPY", "memcpy", 1);
    lucid_status s2 = lucid_nn_channel_copy_multi(ctx, c->np, g[2].p);
    unsetenv("LUCID_CHAN_COPY");
    RUN(NAME("%s: LUCID_CHAN_COPY=memcpy", pre), s2);
    o[3] = ops();
    RUN(NAME("%s: unfused ADD chain", pre), gpu_unfused(c, &g[3], 0));
    RUN(NAME("%s: unfused add_forward chain", pre), gpu_unfused(c, &g[4], 1));
    ccase cc = {.nd = c->nd}; /* cmp_set reads nd only */
    cmp_set(NAME("%s: multi = cpu, bitwise", pre), &cc, &g[0], &h);
    static const char *const WHAT[] = {"per-piece route", "LUCID_CHAN_COPY=memcpy",
                                       "chained lucid_binary ADD (map_contig_kernel)",
                                       "chained lucid_nn_add_forward (add_fwd)"};
    for (int r = 1; r < 5; r++)
        cmp_set(NAME("%s: %s = cpu, bitwise", pre, WHAT[r - 1]), &cc, &g[r], &h);
    unsigned long w0 = sum_ops(c, 0), w1 = sum_ops(c, 1), w2 = sum_ops(c, 2);
    CHECK(NAME("%s: launches: multi %lu, per-piece %lu, memcpy %lu", pre, w0, w1, w2),
          o[1] - o[0] == w0 && o[2] - o[1] == w1 && o[3] - o[2] == w2, "got %lu, %lu, %lu",
          o[1] - o[0], o[2] - o[1], o[3] - o[2]);
    if (!lucid_ctx_graphs_available(ctx)) {
        TEST_SKIP(NAME("%s: capture", pre), "graphs not available on this context");
        goto done;
    }
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_status st = lucid_nn_channel_copy_multi(ctx, c->np, g[5].p);
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: call while capturing", pre), "%s: %s", lucid_status_name(st),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    cmp_set(NAME("%s: replay = cpu, bitwise", pre), &cc, &g[5], &h);
done:
    if (gr) lucid_graph_destroy(gr);
    cset_rel(&h);
    for (int r = 0; r < R; r++) cset_rel(&g[r]);
}

/* lucid_nn_add_n on the GPU: n = 1..4, one launch each, the bits of the
 * chain of lucid_binary ADD (and of the CPU) */
static void test_add_n(lucid_dtype dt) {
    int64_t sh[4] = {3, 5, 7, 9};
    lucid_tensor *hx[4], *gx[4], *gy = NULL, *gr = NULL, *hy = NULL;
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        hx[i] = hvals(dt, 4, sh);
        gx[i] = dev(hx[i]);
        ok = ok && hx[i] && gx[i];
    }
    ok = ok && lucid_tensor_empty(ctx, GPU, dt, 4, sh, &gy) == LUCID_OK &&
         lucid_tensor_empty(ctx, GPU, dt, 4, sh, &gr) == LUCID_OK &&
         lucid_tensor_empty(ctx, CPU, dt, 4, sh, &hy) == LUCID_OK;
    if (!ok) {
        TEST_FAIL(NAME("add_n cuda %s: setup", dname(dt)), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    for (int n = 1; n <= 4; n++) {
        unsigned long o0 = ops();
        RUN(NAME("add_n cuda %s n=%d", dname(dt), n),
            lucid_nn_add_n(ctx, n, (const lucid_tensor *const *)gx, gy));
        CHECK(NAME("add_n cuda %s n=%d: one launch", dname(dt), n), ops() - o0 == 1, "got %lu",
              ops() - o0);
        lucid_status st = lucid_copy(ctx, gr, gx[0]);
        for (int i = 1; i < n && !st; i++) st = lucid_binary(ctx, LUCID_OP_ADD, gr, gr, gx[i]);
        RUN(NAME("add_n cuda %s n=%d: chain", dname(dt), n), st);
        lucid_tensor *hr = host(gr);
        if (hr) cmp_bits(NAME("add_n cuda %s n=%d = x0:add(x1)..., bitwise", dname(dt), n), gy, hr);
        rel1(hr);
        RUN(NAME("add_n cpu %s n=%d", dname(dt), n),
            lucid_nn_add_n(ctx, n, (const lucid_tensor *const *)hx, hy));
        cmp_bits(NAME("add_n cuda %s n=%d = cpu, bitwise", dname(dt), n), gy, hy);
    }
done:
    for (int i = 0; i < 4; i++) {
        rel1(hx[i]);
        rel1(gx[i]);
    }
    rel1(gy); rel1(gr); rel1(hy);
}

/* ============================================================ main */

static const char *GROUPS[] = {"cuda channel_copy_multi", "cuda channel_copy_multi 64-bit",
                               "cuda channel_copy_multi errors", "cuda Concat / Split modules",
                               "cuda channel_copy_multi sum pieces", "cuda add_n"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!lucid_nn_cuda_kernels() || !lucid_cuda_chan_copy_op_count) {
        TEST_FAIL("cuda nn table linked", "no CUDA nn table or chan_copy op counter");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_chan_copy_cuda")) return test_exit();
    /* the multi route unless a check asks for the per-piece one, whatever
     * LUCID_CHAN_COPY_MULTI says */
    lucid_nn_chan_copy_multi_override(1);
    CHECK("cuda nn table has channel_copy_multi",
          lucid_nn_cuda_kernels()->channel_copy_multi != NULL, "slot NULL");
    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    ccase c20 = case20();
    for (int d = 0; d < 3; d++) {
        for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) test_case(&CASES[c], DTS[d]);
        test_case(&c20, DTS[d]);
        test_modules(DTS[d]);
        for (size_t c = 0; c < sizeof SCASES / sizeof SCASES[0]; c++)
            test_sum_case(&SCASES[c], DTS[d]);
        scase s20 = scase20();
        test_sum_case(&s20, DTS[d]);
        test_add_n(DTS[d]);
    }
    test_errors();
    test_wide();
    return cuda_test_finish();
}
