/*
 * test_bn_dy_terms_cuda.c — the training BatchNorm2d backward (plain and
 * fused with SiLU) reading its grad_output as a sum of terms
 * (lucid_nn_batchnorm2d_backward_terms, engine/nn/nn.h; the kernel
 * bn_grad_dx1_terms, cuda/nn_norm_bwd.cu) against the route it replaces:
 * lucid_nn_channel_copy_multi writing the same pieces into a fresh tensor
 * dy, then lucid_nn_batchnorm2d[_silu]_backward of that dy (bn_grad_dx1).
 * Compiles everywhere; without a CUDA device every group prints one skip
 * line.
 *
 * Inputs: Philox draws (test_cuda_util.h; the seed is printed), sources of
 * different magnitudes (1e2, 1, 1e-2: the roundings of the sums matter in
 * bf16/f16), random statistics (invstd > 0), weight and bias; dx, dweight
 * and dbias start from NaN (beta 0) or from the same random values (beta
 * 0.5 / 0.25) on both sides.  Every comparison is bitwise.
 *   taken              dy as 1..4 terms per piece, whole tensors and
 *                      channel slices of wider tensors (other batch
 *                      strides, odd first channels), 1..8 pieces (the C2f
 *                      split gradient: a copy piece and a three-term
 *                      piece), f32 / bf16 / f16, plain and +SiLU: taken,
 *                      dx, dweight and dbias equal to the reference's;
 *                      kernels: the terms call queues one BatchNorm kernel
 *                      (lucid_cuda_bn_launch_count), one terms kernel
 *                      (lucid_cuda_bn_terms_count) and no channel copy
 *                      (lucid_cuda_chan_copy_op_count); the shapes cover
 *                      the held kernel (bf16 4x?x40x40), dy read again
 *                      (f32 4x?x40x40), the scalar path (S = 35), vector
 *                      sums with a scalar dx (dx at element offset 1) and
 *                      grid.y striding over 70001 channels;
 *   declined           nothing written or queued, taken 0: multi-part
 *                      channels (4x?x80x80), eval, dx NULL, an unaligned
 *                      source on the vector path, 9 pieces,
 *                      LUCID_BN_ONEPASS=0 and lucid_nn_bn_dy_terms_override(0);
 *                      lucid_nn_batchnorm2d_terms_fit agrees;
 *   errors             ERR_ARG for pieces that do not tile [0, C), a piece
 *                      with a dst, a source of another dtype and dx
 *                      overlapping a source;
 *   capture            the terms call recorded in a CUDA graph, the
 *                      sources' contents changed, the graph replayed: the
 *                      reference route on the new contents, bitwise (the
 *                      pieces travel by value in the kernel node).
 */
#include "test_cuda_util.h"
#include "nn/nn.h"

#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_launch_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_terms_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_chan_copy_op_count(void);

static unsigned long bn_launches(void) {
    return lucid_cuda_bn_launch_count ? lucid_cuda_bn_launch_count() : 0;
}
static unsigned long terms_launches(void) {
    return lucid_cuda_bn_terms_count ? lucid_cuda_bn_terms_count() : 0;
}
static unsigned long copy_launches(void) {
    return lucid_cuda_chan_copy_op_count ? lucid_cuda_chan_copy_op_count() : 0;
}

/* ------------------------------------------------------------ tensors
 * Kept in a pool released at the end of each case (pool_free). */
#include "test_pool.h"

/* A device tensor [N, C, H, W] at element offset off of its own storage
 * (off 1: not 16-byte aligned) holding Philox draws in [lo, hi) (rounded
 * once to dt), or NaN when lo > hi. */
static lucid_tensor *dtensor(lucid_dtype dt, const int64_t *shape, int64_t off, double lo,
                             double hi) {
    int64_t n = 1, strides[4];
    for (int i = 3; i >= 0; i--) {
        strides[i] = n;
        n *= shape[i];
    }
    lucid_storage *s = NULL;
    lucid_tensor *t = NULL;
    if (lucid_storage_create(ctx, GPU, (size_t)(n + off) * lucid_dtype_size(dt), 0, &s) !=
        LUCID_OK)
        return NULL;
    lucid_status st = lucid_tensor_from_storage(ctx, s, dt, 4, shape, strides, off, &t);
    lucid_storage_release(s);
    if (st != LUCID_OK) return NULL;
    if (lo > hi) {
        st = lucid_fill(ctx, t, NAN);
    } else {
        lucid_tensor *h = hrand(dt, 4, shape, lo, hi);
        st = h ? lucid_copy(ctx, t, h) : LUCID_ERR_OOM;
        if (h) lucid_tensor_release(h);
    }
    if (st != LUCID_OK) {
        lucid_tensor_release(t);
        return NULL;
    }
    return keep(t);
}

/* A [C] f32 device tensor of draws in [lo, hi) (NaN when lo > hi). */
static lucid_tensor *dvec(int64_t C, double lo, double hi) {
    int64_t cs[1] = {C};
    if (lo > hi) return keep(dpoison(LUCID_F32, 1, cs));
    lucid_tensor *h = hrand(LUCID_F32, 1, cs, lo, hi);
    lucid_tensor *d = dev(h);
    if (h) lucid_tensor_release(h);
    return keep(d);
}

/* A device copy of a device tensor (same offset 0, contiguous). */
static lucid_tensor *dclone(const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (!t || lucid_tensor_empty(ctx, GPU, t->dtype, t->ndim, t->shape, &o) != LUCID_OK)
        return NULL;
    if (lucid_copy(ctx, o, t) != LUCID_OK) {
        lucid_tensor_release(o);
        return NULL;
    }
    return keep(o);
}

/* ------------------------------------------------------------ cases */

#define MAXS 6
#define MAXP 9

typedef struct tterm {
    int s;      /* source index */
    int64_t c0; /* its first channel */
} tterm;

typedef struct tpiece {
    int64_t nch;
    int nt;
    tterm t[LUCID_CHAN_SUM_MAX];
} tpiece;

typedef struct tcase {
    const char *tag;
    int64_t N, H, W;
    int ns;
    int64_t sc[MAXS];  /* channels of each source */
    int64_t off[MAXS]; /* element offset of each source (1: unaligned) */
    int np;
    tpiece p[MAXP];
    int64_t dx_off; /* element offset of dx */
} tcase;

/* the taken cases (every dtype and route) */
static const tcase CASES[] = {
    {"1 term: a slice of a wider tensor", 4, 20, 20, 1, {40}, {0}, 1,
     {{16, 1, {{0, 24}}}}, 0},
    {"2 terms: a whole tensor and a slice", 4, 20, 20, 2, {16, 48}, {0, 0}, 1,
     {{16, 2, {{0, 0}, {1, 32}}}}, 0},
    {"C2f split: a copy piece and a 3-term piece", 4, 20, 20, 2, {48, 16}, {0, 0}, 2,
     {{16, 1, {{0, 0}}}, {16, 3, {{1, 0}, {0, 32}, {0, 16}}}}, 0},
    {"4 terms, 4 batch strides, odd first channels", 4, 20, 20, 4, {8, 24, 12, 40}, {0, 0, 0, 0},
     1, {{8, 4, {{0, 0}, {1, 5}, {2, 3}, {3, 31}}}}, 0},
    {"8 pieces of 1..4 terms", 2, 10, 10, 3, {20, 9, 16}, {0, 0, 0}, 8,
     {{2, 1, {{0, 0}}},
      {1, 2, {{1, 0}, {0, 19}}},
      {3, 3, {{2, 13}, {0, 3}, {1, 6}}},
      {2, 4, {{0, 7}, {1, 1}, {2, 0}, {0, 9}}},
      {1, 1, {{2, 5}}},
      {4, 2, {{0, 12}, {2, 8}}},
      {2, 3, {{1, 2}, {1, 4}, {2, 2}}},
      {1, 4, {{0, 1}, {0, 2}, {0, 3}, {0, 4}}}},
     0},
    {"held vectors (bf16/f16), read again (f32): 4x?x40x40", 4, 40, 40, 2, {64, 32}, {0, 0}, 2,
     {{16, 2, {{0, 48}, {1, 16}}}, {16, 3, {{1, 0}, {0, 0}, {0, 16}}}}, 0},
    {"scalar path: S = 35", 3, 5, 7, 2, {12, 6}, {0, 1}, 2,
     {{5, 1, {{0, 7}}}, {6, 2, {{1, 0}, {0, 1}}}}, 0},
    {"vector sums, scalar dx (dx at offset 1)", 4, 20, 20, 2, {24, 8}, {0, 0}, 1,
     {{8, 3, {{1, 0}, {0, 16}, {0, 0}}}}, 1},
    {"grid.y strides: 70001 channels", 2, 1, 2, 2, {70001, 70003}, {0, 0}, 2,
     {{40000, 2, {{0, 0}, {1, 3}}}, {30001, 1, {{1, 40002}}}}, 0},
};

static int64_t case_C(const tcase *c) {
    int64_t C = 0;
    for (int i = 0; i < c->np; i++) C += c->p[i].nch;
    return C;
}

/* The case's lucid_chan_piece list over sources src (dst: NULL for the
 * terms call, else dy at the piece's channel). */
static void case_pieces(const tcase *c, lucid_tensor *const *src, lucid_tensor *dy,
                        lucid_chan_piece *pc) {
    int64_t c0 = 0;
    memset(pc, 0, sizeof(lucid_chan_piece) * MAXP);
    for (int i = 0; i < c->np; i++) {
        const tpiece *q = &c->p[i];
        lucid_chan_piece *p = &pc[i];
        p->dst = dy;
        p->dst_c0 = c0;
        p->nch = q->nch;
        p->src = src[q->t[0].s];
        p->src_c0 = q->t[0].c0;
        for (int k = 1; k < q->nt; k++) {
            p->add[k - 1] = src[q->t[k].s];
            p->add_c0[k - 1] = q->t[k].c0;
        }
        c0 += q->nch;
    }
}

static lucid_status bwd(int silu, const lucid_tensor *x, const lucid_tensor *dy, lucid_tensor *dx,
                        const lucid_tensor *w, const lucid_tensor *b, const lucid_tensor *sm,
                        const lucid_tensor *si, lucid_tensor *dw, lucid_tensor *db, double bi,
                        double bp) {
    return silu ? lucid_nn_batchnorm2d_silu_backward(ctx, x, dy, dx, w, b, sm, si, dw, db, 1, bi,
                                                     bp)
                : lucid_nn_batchnorm2d_backward(ctx, x, dy, dx, w, sm, si, dw, db, 1, bi, bp);
}

/* Everything a case needs on the device. */
typedef struct tset {
    lucid_tensor *src[MAXS], *x, *w, *b, *sm, *si;
    lucid_tensor *dx[2], *dw[2], *db[2]; /* [0]: reference, [1]: terms */
    int64_t xs[4], C;
} tset;

/* Draw the case's tensors (beta: dx / dweight / dbias start from the same
 * random values on both sides, else NaN). */
static int tset_make(const tcase *c, lucid_dtype dt, int beta, tset *t) {
    static const double MAG[3] = {100.0, 1.0, 0.01};
    memset(t, 0, sizeof *t);
    t->C = case_C(c);
    int64_t xs[4] = {c->N, t->C, c->H, c->W};
    memcpy(t->xs, xs, sizeof xs);
    int ok = 1;
    for (int i = 0; i < c->ns && ok; i++) {
        int64_t sh[4] = {c->N, c->sc[i], c->H, c->W};
        double m = MAG[i % 3];
        t->src[i] = dtensor(dt, sh, c->off[i], -m, m);
        ok = t->src[i] != NULL;
    }
    t->x = dtensor(dt, xs, 0, -2, 3);
    t->w = dvec(t->C, 0.5, 1.5);
    t->b = dvec(t->C, -0.5, 0.5);
    t->sm = dvec(t->C, -0.3, 0.3);
    t->si = dvec(t->C, 0.5, 2.0);
    ok = ok && t->x && t->w && t->b && t->sm && t->si;
    if (!ok) return 0;
    t->dx[0] = dtensor(dt, xs, c->dx_off, beta ? -1 : 1, beta ? 1 : 0);
    t->dx[1] = t->dx[0] ? dtensor(dt, xs, c->dx_off, 1, 0) : NULL;
    t->dw[0] = dvec(t->C, beta ? -1 : 1, beta ? 1 : 0);
    t->db[0] = dvec(t->C, beta ? -1 : 1, beta ? 1 : 0);
    t->dw[1] = dclone(t->dw[0]);
    t->db[1] = dclone(t->db[0]);
    ok = t->dx[0] && t->dx[1] && t->dw[0] && t->db[0] && t->dw[1] && t->db[1];
    if (ok && beta) ok = lucid_copy(ctx, t->dx[1], t->dx[0]) == LUCID_OK;
    return ok;
}

/* The reference: chan_copy_multi into a fresh dy, then the plain backward
 * into side 0.  *nc, *nb: the copy and BatchNorm kernels it queued. */
static lucid_status ref_run(const tcase *c, int silu, tset *t, double bi, double bp,
                            unsigned long *nc, unsigned long *nb) {
    lucid_tensor *dy = dtensor(t->x->dtype, t->xs, 0, 1, 0);
    if (!dy) return lucid_ctx_last_status(ctx);
    lucid_chan_piece pc[MAXP];
    case_pieces(c, t->src, dy, pc);
    unsigned long c0 = copy_launches(), b0 = bn_launches();
    lucid_status st = lucid_nn_channel_copy_multi(ctx, c->np, pc);
    if (st != LUCID_OK) return st;
    st = bwd(silu, t->x, dy, t->dx[0], t->w, silu ? t->b : NULL, t->sm, t->si, t->dw[0], t->db[0],
             bi, bp);
    if (st != LUCID_OK) return st;
    *nc = copy_launches() - c0;
    *nb = bn_launches() - b0;
    return LUCID_OK;
}

/* The terms call into side 1. */
static lucid_status terms_run(const tcase *c, int silu, tset *t, double bi, double bp,
                              int *taken) {
    lucid_chan_piece pc[MAXP];
    case_pieces(c, t->src, NULL, pc);
    return lucid_nn_batchnorm2d_backward_terms(ctx, t->x, c->np, pc, t->dx[1], t->w,
                                               silu ? t->b : NULL, t->sm, t->si, t->dw[1],
                                               t->db[1], 1, bi, bp, silu, taken);
}

static void test_taken(const tcase *c, lucid_dtype dt, int silu, int beta) {
    char pre[150];
    snprintf(pre, sizeof pre, "bn%s dy as terms %s %s%s", silu ? "+silu" : "", c->tag,
             lucid_dtype_name(dt), beta ? " beta 0.5/0.25" : "");
    const double bi = beta ? 0.5 : 0.0, bp = beta ? 0.25 : 0.0;
    tset t;
    int taken = -1;
    if (!tset_make(c, dt, beta, &t)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    unsigned long nc = 0, nb = 0;
    RUN(NAME("%s: reference", pre), ref_run(c, silu, &t, bi, bp, &nc, &nb));
    unsigned long c0 = copy_launches(), b0 = bn_launches(), k0 = terms_launches();
    RUN(NAME("%s: terms call", pre), terms_run(c, silu, &t, bi, bp, &taken));
    unsigned long tc = copy_launches() - c0, tb = bn_launches() - b0, tk = terms_launches() - k0;
    CHECK(NAME("%s: taken", pre), taken == 1, "taken %d", taken);
    CHECK(NAME("%s: kernels 1 copy + 1 BN -> 1 terms", pre),
          nc == 1 && nb == 1 && tc == 0 && tb == 1 && tk == 1,
          "reference %lu copies %lu BN; terms %lu copies %lu BN %lu terms", nc, nb, tc, tb, tk);
    lucid_tensor *hdx = keep(host(t.dx[0])), *hdw = keep(host(t.dw[0])),
                 *hdb = keep(host(t.db[0]));
    cmp_bits(NAME("%s: dx = copy + plain backward", pre), t.dx[1], hdx);
    cmp_bits(NAME("%s: dweight = copy + plain backward", pre), t.dw[1], hdw);
    cmp_bits(NAME("%s: dbias = copy + plain backward", pre), t.db[1], hdb);
done:
    pool_free();
}

/* A declined call: taken 0, dx / dweight / dbias untouched, no kernel. */
static void expect_declined(const char *pre, const tcase *c, lucid_dtype dt, int silu,
                            int training, int with_dx, int np_override) {
    tset t;
    int taken = -1;
    if (!tset_make(c, dt, 1, &t)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_tensor *hdx = keep(host(t.dx[1])), *hdw = keep(host(t.dw[1])),
                 *hdb = keep(host(t.db[1]));
    lucid_chan_piece pc[MAXP + 1];
    memset(pc, 0, sizeof pc);
    case_pieces(c, t.src, NULL, pc);
    int np = c->np;
    if (np_override) {
        /* the last piece cut into one-channel pieces: more than the most */
        np = 0;
        int64_t c0 = 0;
        for (int i = 0; i < np_override; i++) {
            pc[i] = (lucid_chan_piece){.src = t.src[0], .src_c0 = i, .dst_c0 = c0, .nch = 1};
            c0 += 1;
            np++;
        }
        pc[np - 1].nch = t.C - (np - 1);
        pc[np - 1].src_c0 = 0;
    }
    unsigned long c0 = copy_launches(), b0 = bn_launches();
    RUN(NAME("%s: call", pre),
        lucid_nn_batchnorm2d_backward_terms(ctx, t.x, np, pc, with_dx ? t.dx[1] : NULL, t.w,
                                            silu ? t.b : NULL, t.sm, t.si, t.dw[1], t.db[1],
                                            training, 0.5, 0.25, silu, &taken));
    CHECK(NAME("%s: not taken, nothing queued", pre),
          taken == 0 && copy_launches() == c0 && bn_launches() == b0, "taken %d, %lu kernels",
          taken, copy_launches() - c0 + bn_launches() - b0);
    cmp_bits(NAME("%s: dx untouched", pre), t.dx[1], hdx);
    cmp_bits(NAME("%s: dweight untouched", pre), t.dw[1], hdw);
    cmp_bits(NAME("%s: dbias untouched", pre), t.db[1], hdb);
done:
    pool_free();
}

static void test_declined(lucid_dtype dt) {
    char pre[150];
    const tcase multi = {"multi-part 4x?x80x80", 4, 80, 80, 2, {16, 8}, {0, 0}, 1,
                         {{8, 2, {{0, 8}, {1, 0}}}}, 0};
    const tcase base = {"4x?x20x20", 4, 20, 20, 2, {16, 8}, {0, 0}, 1,
                        {{8, 2, {{0, 8}, {1, 0}}}}, 0};
    const tcase unal = {"4x?x20x20, a source at offset 1", 4, 20, 20, 2, {16, 8}, {0, 1}, 1,
                        {{8, 2, {{0, 8}, {1, 0}}}}, 0};
    const tcase wide = {"4x16x20x20", 4, 20, 20, 1, {16}, {0}, 1, {{16, 1, {{0, 0}}}}, 0};
    const char *dn = lucid_dtype_name(dt);
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: %s %s", multi.tag, dn);
    expect_declined(pre, &multi, dt, 1, 1, 1, 0);
    snprintf(pre, sizeof pre, "bn dy as terms declined: eval %s %s", base.tag, dn);
    expect_declined(pre, &base, dt, 0, 0, 1, 0);
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: dx NULL %s %s", base.tag, dn);
    expect_declined(pre, &base, dt, 1, 1, 0, 0);
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: 9 pieces %s %s", wide.tag, dn);
    expect_declined(pre, &wide, dt, 1, 1, 1, 9);
    /* the vector path (S = 400 a multiple of the vector) with a source that
     * is not 16-byte aligned */
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: %s %s", unal.tag, dn);
    expect_declined(pre, &unal, dt, 1, 1, 1, 0);
    setenv("LUCID_BN_ONEPASS", "0", 1);
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: LUCID_BN_ONEPASS=0 %s %s", base.tag, dn);
    expect_declined(pre, &base, dt, 1, 1, 1, 0);
    unsetenv("LUCID_BN_ONEPASS");
    int prev = lucid_nn_bn_dy_terms_override(0);
    snprintf(pre, sizeof pre, "bn+silu dy as terms declined: LUCID_BN_DY_TERMS=0 %s %s", base.tag,
             dn);
    expect_declined(pre, &base, dt, 1, 1, 1, 0);
    lucid_nn_bn_dy_terms_override(prev);
}

static void test_fit(void) {
    const char *pre = "bn dy as terms fit";
    int64_t one[4] = {4, 8, 20, 20}, multi[4] = {4, 8, 80, 80};
    lucid_tensor *a = dtensor(LUCID_BF16, one, 0, 1, 0), *b = dtensor(LUCID_BF16, multi, 0, 1, 0);
    int f1 = -1, f2 = -1, f3 = -1;
    if (!a || !b) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: one part", pre), lucid_nn_batchnorm2d_terms_fit(ctx, a, 1, &f1));
    RUN(NAME("%s: multi-part", pre), lucid_nn_batchnorm2d_terms_fit(ctx, b, 1, &f2));
    RUN(NAME("%s: eval", pre), lucid_nn_batchnorm2d_terms_fit(ctx, a, 0, &f3));
    CHECK(NAME("%s: one part 1, multi-part 0, eval 0", pre), f1 == 1 && f2 == 0 && f3 == 0,
          "%d %d %d", f1, f2, f3);
done:
    pool_free();
}

static void test_errors(void) {
    const char *pre = "bn dy as terms errors";
    const tcase base = {"", 4, 20, 20, 2, {16, 8}, {0, 0}, 1, {{8, 2, {{0, 8}, {1, 0}}}}, 0};
    tset t;
    int taken = -1;
    if (!tset_make(&base, LUCID_BF16, 0, &t)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_chan_piece pc[2];
#define TRY_ERR(tag, npieces, dxx)                                                          \
    do {                                                                                   \
        lucid_status s_ = lucid_nn_batchnorm2d_backward_terms(                             \
            ctx, t.x, npieces, pc, dxx, t.w, t.b, t.sm, t.si, t.dw[1], t.db[1], 1, 0.0, 0.0, \
            1, &taken);                                                                    \
        CHECK(NAME("%s: %s is ERR_ARG", pre, tag), s_ == LUCID_ERR_ARG && taken == 0,      \
              "%s, taken %d: %s", lucid_status_name(s_), taken, lucid_ctx_error(ctx));      \
    } while (0)
    case_pieces(&base, t.src, NULL, pc);
    pc[0].nch = 7; /* covers [0, 7) of 8 */
    TRY_ERR("pieces covering [0, 7) of 8 channels", 1, t.dx[1]);
    case_pieces(&base, t.src, NULL, pc);
    pc[1] = pc[0];
    pc[0].nch = 4;
    pc[1].dst_c0 = 5; /* a gap */
    pc[1].nch = 3;
    TRY_ERR("pieces with a gap", 2, t.dx[1]);
    case_pieces(&base, t.src, NULL, pc);
    pc[0].dst = t.dx[0];
    TRY_ERR("a piece with a dst", 1, t.dx[1]);
    case_pieces(&base, t.src, NULL, pc);
    pc[0].src = t.w; /* f32 [C], not an activation of x's dtype and rank */
    TRY_ERR("a source of another rank and dtype", 1, t.dx[1]);
    case_pieces(&base, t.src, NULL, pc);
    TRY_ERR("dx overlapping a source", 1, t.src[1]);
#undef TRY_ERR
done:
    pool_free();
}

/* The terms call recorded, the sources changed, the graph replayed: equal
 * to the reference route run eagerly on the new contents. */
static void test_capture(lucid_dtype dt, int silu) {
    char pre[160];
    snprintf(pre, sizeof pre, "bn%s dy as terms capture %s", silu ? "+silu" : "",
             lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    const tcase *c = &CASES[2]; /* the C2f split */
    lucid_graph *g = NULL;
    tset t;
    int taken = -1;
    if (!tset_make(c, dt, 0, &t)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* eager warm-up of both routes (the nn state, arena, counters) */
    unsigned long nc, nb;
    RUN(NAME("%s: warm-up reference", pre), ref_run(c, silu, &t, 0.0, 0.0, &nc, &nb));
    RUN(NAME("%s: warm-up terms", pre), terms_run(c, silu, &t, 0.0, 0.0, &taken));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        unsigned long k0 = terms_launches();
        lucid_status s = terms_run(c, silu, &t, 0.0, 0.0, &taken);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: terms call while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
        CHECK(NAME("%s: recorded one terms kernel", pre), taken == 1 && terms_launches() == k0 + 1,
              "taken %d, %lu kernels", taken, terms_launches() - k0);
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    /* new contents in the same sources */
    for (int i = 0; i < c->ns; i++) {
        int64_t sh[4] = {c->N, c->sc[i], c->H, c->W};
        lucid_tensor *h = keep(hrand(dt, 4, sh, -3, 3));
        RUN(NAME("%s: new source %d", pre, i), h ? lucid_copy(ctx, t.src[i], h) : LUCID_ERR_OOM);
    }
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    RUN(NAME("%s: reference on the new sources", pre), ref_run(c, silu, &t, 0.0, 0.0, &nc, &nb));
    cmp_bits(NAME("%s: replayed dx = reference", pre), t.dx[1], keep(host(t.dx[0])));
    cmp_bits(NAME("%s: replayed dweight = reference", pre), t.dw[1], keep(host(t.dw[0])));
    cmp_bits(NAME("%s: replayed dbias = reference", pre), t.db[1], keep(host(t.db[0])));
done:
    if (g) lucid_graph_destroy(g);
    pool_free();
}

static const char *GROUPS[] = {"cuda bn dy as terms", "cuda bn dy as terms declined",
                               "cuda bn dy as terms errors", "cuda bn dy as terms capture"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!lucid_nn_cuda_kernels() || !lucid_cuda_bn_terms_count) {
        TEST_FAIL("cuda nn table linked", "no CUDA nn table or BatchNorm terms counter");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_bn_dy_terms_cuda")) return test_exit();
    unsetenv("LUCID_BN_ONEPASS");
    lucid_nn_bn_dy_terms_override(1);
    lucid_nn_chan_copy_multi_override(1);
    CHECK("cuda nn table has batchnorm2d_backward_terms",
          lucid_nn_cuda_kernels()->batchnorm2d_backward_terms != NULL, "slot NULL");
    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 3; d++) {
        for (int silu = 0; silu < 2; silu++)
            for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
                test_taken(&CASES[c], DTS[d], silu, 0);
                test_taken(&CASES[c], DTS[d], silu, 1);
            }
        test_declined(DTS[d]);
        test_capture(DTS[d], 0);
        test_capture(DTS[d], 1);
    }
    test_fit();
    test_errors();
    return cuda_test_finish();
}
