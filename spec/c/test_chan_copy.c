/*
 * test_chan_copy.c — lucid_nn_channel_copy_multi (engine/nn/nn.h) on the
 * CPU, and the Concat / Split modules that use it.
 *
 * Sources and destinations are filled with random BITS (every pattern:
 * NaNs with payloads, infinities, subnormals), so "bitwise equal" checks
 * that bits move verbatim.  Each multi-piece call is compared bitwise with
 *   - a direct reference: memcpy / memset per batch row of every piece,
 *     untouched channels keeping their starting bits, and
 *   - the per-piece route (lucid_nn_chan_copy_multi_override(0): one
 *     lucid_nn_channel_copy per copy piece, lucid_fill(0) per zero piece),
 * over f32, bf16, f16 and f64, odd and even plane sizes, mixed piece sizes,
 * zero-fill pieces, empty pieces, more pieces than one GPU launch takes
 * (20 > 16), and a piece whose src has another dtype (converted as
 * lucid_nn_channel_copy converts: equal to it).  Errors: every rejected
 * argument returns ERR_ARG (ERR_UNSUPPORTED for a non-float dtype) with
 * the piece named in the message, and leaves dst untouched.
 * Modules: Concat(3) and Split([1, 5, 6]) forward and backward (one Split
 * gradient missing: zeros) give bitwise the same outputs and gradients on
 * both routes, and the values of torch.cat / torch.split.
 * Sum pieces (addends) and lucid_nn_add_n: the rounded left-to-right sum of
 * 2..4 channel slices equals, bitwise, the same chain computed as separate
 * whole-tensor additions (lucid_binary ADD, and lucid_nn_add_forward) of
 * contiguous copies of the slices, then copied in — on both routes (the
 * per-piece route: a copy then one beta-1 channel_copy per addend), for
 * f32, bf16, f16 and f64, odd and even plane sizes, odd channel offsets,
 * next to copy, zero and empty pieces in one call, 20 sum pieces; values
 * spread over 2^-12..2^12 (every addition rounds in bf16 / f16) with -0
 * and +inf among them.  Errors: an addend without a src, a gap in the
 * addends, an addend or a sum's src of another dtype, an addend's channels
 * out of range, a dst overlapping an addend; add_n's n, shapes, overlap.
 * lucid_module_ensure_buffer: keeps a matching buffer, reallocates on
 * another shape, refuses an index out of range.
 */
#define TEST_NN_SEED 0x6a09e667f3bcc909ull
#include "test_nn_util.h"
#include "nn/nn.h"

/* A copy (src) or zero-fill (src NULL) piece, no addends. */
static inline lucid_chan_piece CP(lucid_tensor *dst, int64_t dst_c0, const lucid_tensor *src,
                                  int64_t src_c0, int64_t nch) {
    return (lucid_chan_piece){.dst = dst, .dst_c0 = dst_c0, .src = src, .src_c0 = src_c0,
                              .nch = nch};
}

static uint64_t bits_state = 0x243f6a8885a308d3ull;

/* every byte of t random */
static void fill_bits(lucid_tensor *t) {
    unsigned char *p = lucid_tensor_data(t);
    size_t n = lucid_tensor_nbytes(t);
    for (size_t i = 0; i < n; i++) {
        bits_state ^= bits_state << 13;
        bits_state ^= bits_state >> 7;
        bits_state ^= bits_state << 17;
        p[i] = (unsigned char)(bits_state >> 24);
    }
}

static lucid_tensor *mkc(lucid_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W) {
    lucid_tensor *t = mk4(dt, N, C, H, W);
    fill_bits(t);
    return t;
}

static lucid_tensor *clone(const lucid_tensor *t) {
    lucid_tensor *c = mk(t->dtype, t->ndim, t->shape);
    memcpy(lucid_tensor_data(c), lucid_tensor_data(t), lucid_tensor_nbytes(t));
    return c;
}

static int same_bits(const lucid_tensor *a, const lucid_tensor *b) {
    return lucid_tensor_nbytes(a) == lucid_tensor_nbytes(b) &&
           memcmp(lucid_tensor_data(a), lucid_tensor_data(b), lucid_tensor_nbytes(a)) == 0;
}

/* the direct reference of one same-dtype piece */
static void ref_piece(const lucid_chan_piece *p) {
    int64_t N = p->dst->shape[0], Cd = p->dst->shape[1], S = 1;
    for (int d = 2; d < p->dst->ndim; d++) S *= p->dst->shape[d];
    size_t es = lucid_dtype_size(p->dst->dtype);
    char *d = lucid_tensor_data(p->dst);
    for (int64_t n = 0; n < N; n++) {
        char *dr = d + (size_t)((n * Cd + p->dst_c0) * S) * es;
        if (p->src) {
            const char *s = lucid_tensor_data(p->src);
            int64_t Cs = p->src->shape[1];
            memcpy(dr, s + (size_t)((n * Cs + p->src_c0) * S) * es, (size_t)(p->nch * S) * es);
        } else {
            memset(dr, 0, (size_t)(p->nch * S) * es);
        }
    }
}

/* Run pc (dsts dst[0..nd), pieces naming them) three ways from the same
 * starting bits: the multi route, the per-piece route, the direct
 * reference (ref 0: skip it, for pieces with a conversion); all bitwise
 * equal. */
static void run3(const char *pre, int n, lucid_chan_piece *pc, lucid_tensor **dst, int nd,
                 int ref) {
    char name[200];
    lucid_tensor *start[8], *multi[8];
    for (int i = 0; i < nd; i++) start[i] = clone(dst[i]);
    lucid_nn_chan_copy_multi_override(1);
    lucid_status st = lucid_nn_channel_copy_multi(ctx, n, pc);
    snprintf(name, sizeof name, "%s: multi route runs", pre);
    CHECK_STATUS(name, ctx, st);
    for (int i = 0; i < nd; i++) {
        multi[i] = clone(dst[i]);
        memcpy(lucid_tensor_data(dst[i]), lucid_tensor_data(start[i]),
               lucid_tensor_nbytes(start[i]));
    }
    lucid_nn_chan_copy_multi_override(0);
    st = lucid_nn_channel_copy_multi(ctx, n, pc);
    lucid_nn_chan_copy_multi_override(-1);
    snprintf(name, sizeof name, "%s: per-piece route runs", pre);
    CHECK_STATUS(name, ctx, st);
    int eq = 1;
    for (int i = 0; i < nd; i++) eq = eq && same_bits(multi[i], dst[i]);
    snprintf(name, sizeof name, "%s: multi = per-piece, bitwise", pre);
    CHECK(name, eq, "outputs differ");
    if (ref) {
        for (int i = 0; i < nd; i++)
            memcpy(lucid_tensor_data(dst[i]), lucid_tensor_data(start[i]),
                   lucid_tensor_nbytes(start[i]));
        for (int i = 0; i < n; i++) ref_piece(&pc[i]);
        eq = 1;
        for (int i = 0; i < nd; i++) eq = eq && same_bits(multi[i], dst[i]);
        snprintf(name, sizeof name, "%s: multi = memcpy/memset reference, bitwise", pre);
        CHECK(name, eq, "outputs differ");
    }
    for (int i = 0; i < nd; i++) {
        lucid_tensor_release(start[i]);
        lucid_tensor_release(multi[i]);
    }
}

static const char *dn(lucid_dtype dt) { return lucid_dtype_name(dt); }

// ----------------------------------------------------------------------------
// sums

/* values u * 2^e, u in [-1, 1), e in [-12, 12]; element 0 is -0 and element
 * 1 +inf (when the tensor has them): sums that round in every dtype */
static void fill_vals(lucid_tensor *t) {
    for (int64_t i = 0; i < numel(t); i++)
        set(t, i, urand(-1, 1) * ldexp(1.0, (int)floor(urand(-12, 13))));
    if (numel(t) > 0) set(t, 0, -0.0);
    if (numel(t) > 1) set(t, 1, INFINITY);
}

static lucid_tensor *mkv(lucid_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W) {
    lucid_tensor *t = mk4(dt, N, C, H, W);
    fill_vals(t);
    return t;
}

/* channels [c0, c0+nch) of t as a new contiguous tensor */
static lucid_tensor *slice_copy(const lucid_tensor *t, int64_t c0, int64_t nch) {
    lucid_tensor *v = NULL, *o = NULL;
    int64_t sh[LUCID_MAX_DIMS];
    memcpy(sh, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    sh[1] = nch;
    o = mk(t->dtype, t->ndim, sh);
    if (lucid_tensor_narrow(ctx, t, 1, c0, nch, &v) != LUCID_OK ||
        lucid_copy(ctx, o, v) != LUCID_OK) {
        printf("not ok slice copy: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    lucid_tensor_release(v);
    return o;
}

/* The reference of one piece: copies and zero fills as ref_piece; a sum as
 * whole-tensor additions of contiguous slice copies, left to right
 * (add_fwd 0: lucid_binary ADD in place; 1: lucid_nn_add_forward), then
 * its bits copied into dst. */
static void ref_sum_piece(const lucid_chan_piece *p, int add_fwd) {
    int ns = lucid_chan_piece_nsrc(p);
    if (ns < 2 || p->nch == 0) {
        if (p->nch > 0 || ns < 2) ref_piece(p);
        return;
    }
    lucid_tensor *r = slice_copy(p->src, p->src_c0, p->nch);
    lucid_status st = LUCID_OK;
    for (int k = 1; k < ns && !st; k++) {
        lucid_tensor *a = slice_copy(p->add[k - 1], p->add_c0[k - 1], p->nch);
        st = add_fwd ? lucid_nn_add_forward(ctx, r, a, r) : lucid_binary(ctx, LUCID_OP_ADD, r, r, a);
        lucid_tensor_release(a);
    }
    if (!st) st = lucid_nn_channel_copy(ctx, p->dst, p->dst_c0, r, 0, p->nch, 0.0);
    if (st) {
        printf("not ok sum reference: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    lucid_tensor_release(r);
}

/* Run pc (dsts dst[0..nd)) from the same starting bits: the multi route,
 * the per-piece route, and the two whole-tensor references; all bitwise
 * equal. */
static void run_sums(const char *pre, int n, lucid_chan_piece *pc, lucid_tensor **dst, int nd) {
    char name[240];
    lucid_tensor *start[8], *multi[8];
    for (int i = 0; i < nd; i++) start[i] = clone(dst[i]);
    lucid_nn_chan_copy_multi_override(1);
    lucid_status st = lucid_nn_channel_copy_multi(ctx, n, pc);
    snprintf(name, sizeof name, "%s: multi route runs", pre);
    CHECK_STATUS(name, ctx, st);
    for (int i = 0; i < nd; i++) multi[i] = clone(dst[i]);
    for (int route = 0; route < 3; route++) {
        for (int i = 0; i < nd; i++)
            memcpy(lucid_tensor_data(dst[i]), lucid_tensor_data(start[i]),
                   lucid_tensor_nbytes(start[i]));
        const char *what;
        if (route == 0) {
            lucid_nn_chan_copy_multi_override(0);
            st = lucid_nn_channel_copy_multi(ctx, n, pc);
            lucid_nn_chan_copy_multi_override(-1);
            what = "per-piece route (copy, then beta-1 channel_copy per addend)";
            snprintf(name, sizeof name, "%s: per-piece route runs", pre);
            CHECK_STATUS(name, ctx, st);
        } else {
            for (int i = 0; i < n; i++) ref_sum_piece(&pc[i], route == 2);
            what = route == 1 ? "chained lucid_binary ADD of slice copies"
                              : "chained lucid_nn_add_forward of slice copies";
        }
        int eq = 1;
        for (int i = 0; i < nd; i++) eq = eq && same_bits(multi[i], dst[i]);
        snprintf(name, sizeof name, "%s: multi = %s, bitwise", pre, what);
        CHECK(name, eq, "outputs differ");
    }
    for (int i = 0; i < nd; i++) {
        lucid_tensor_release(start[i]);
        lucid_tensor_release(multi[i]);
    }
}

static void test_sums(lucid_dtype dt, int64_t N, int64_t H, int64_t W) {
    char pre[160];
    /* one dst: a 2-, 3- and 4-source sum (odd channel offsets), a copy, a
     * zero fill, an empty sum; channel 15 untouched */
    snprintf(pre, sizeof pre, "channel_copy_multi sums %s [%lld,*,%lld,%lld]", dn(dt),
             (long long)N, (long long)H, (long long)W);
    lucid_tensor *d = mkc(dt, N, 16, H, W), *a = mkv(dt, N, 5, H, W), *b = mkv(dt, N, 7, H, W);
    lucid_tensor *c = mkv(dt, N, 3, H, W), *e = mkv(dt, N, 4, H, W);
    lucid_chan_piece pc[6] = {
        {.dst = d, .dst_c0 = 0, .src = a, .src_c0 = 1, .nch = 3, .add = {b}, .add_c0 = {4}},
        {.dst = d, .dst_c0 = 3, .src = c, .src_c0 = 0, .nch = 3, .add = {b, a},
         .add_c0 = {1, 2}},
        {.dst = d, .dst_c0 = 6, .src = e, .src_c0 = 1, .nch = 2, .add = {c, b, a},
         .add_c0 = {1, 0, 3}},
        CP(d, 8, b, 0, 4),
        {.dst = d, .dst_c0 = 12, .nch = 3},
        {.dst = d, .dst_c0 = 15, .src = a, .nch = 0, .add = {b}},
    };
    run_sums(pre, 6, pc, &d, 1);
    /* one source read twice (same channels), another one in between */
    snprintf(pre, sizeof pre, "channel_copy_multi sums %s [%lld,*,%lld,%lld] one source twice",
             dn(dt), (long long)N, (long long)H, (long long)W);
    lucid_chan_piece pt[1] = {
        {.dst = d, .dst_c0 = 2, .src = b, .src_c0 = 3, .nch = 4, .add = {b, a, b},
         .add_c0 = {3, 1, 0}}};
    run_sums(pre, 1, pt, &d, 1);
    /* the order of the chain is kept: ((e + c) + b) + a and ((a + b) + c) + e
     * (the same four sources) differ somewhere on these values */
    if (N * H * W >= 15) {
        lucid_tensor *d2 = clone(d);
        lucid_chan_piece fw[1] = {{.dst = d, .dst_c0 = 6, .src = e, .src_c0 = 1, .nch = 2,
                                   .add = {c, b, a}, .add_c0 = {1, 0, 3}}};
        lucid_chan_piece bw[1] = {{.dst = d2, .dst_c0 = 6, .src = a, .src_c0 = 3, .nch = 2,
                                   .add = {b, c, e}, .add_c0 = {0, 1, 1}}};
        lucid_status s1 = lucid_nn_channel_copy_multi(ctx, 1, fw);
        lucid_status s2 = lucid_nn_channel_copy_multi(ctx, 1, bw);
        snprintf(pre, sizeof pre, "channel_copy_multi sums %s [%lld,*,%lld,%lld]: the chain's order "
                 "shows in the bits", dn(dt), (long long)N, (long long)H, (long long)W);
        CHECK(pre, s1 == LUCID_OK && s2 == LUCID_OK && !same_bits(d, d2),
              "both orders gave the same bits");
        lucid_tensor_release(d2);
    }
    /* 20 one-channel sum pieces into two dsts (past one GPU launch's 16) */
    snprintf(pre, sizeof pre, "channel_copy_multi sums %s [%lld,*,%lld,%lld] 20 pieces", dn(dt),
             (long long)N, (long long)H, (long long)W);
    lucid_tensor *y = mkc(dt, N, 10, H, W), *z = mkc(dt, N, 10, H, W);
    lucid_tensor *yz[2] = {y, z};
    lucid_chan_piece pr[20];
    for (int i = 0; i < 20; i++)
        pr[i] = (lucid_chan_piece){.dst = yz[i % 2], .dst_c0 = i / 2, .src = b,
                                   .src_c0 = i % 7, .nch = 1, .add = {a, i % 3 ? c : NULL},
                                   .add_c0 = {i % 5, i % 3}};
    run_sums(pre, 20, pr, yz, 2);
    lucid_tensor *all[] = {d, a, b, c, e, y, z};
    rel(all, 7);
}

/* lucid_nn_add_n: n = 1..4 against the chain of lucid_binary ADD (and n = 2
 * against lucid_nn_add_forward); rank 3 and 2 */
static void test_add_n(lucid_dtype dt) {
    char name[160];
    int64_t s3[3] = {3, 5, 7}, s2[2] = {4, 9};
    for (int r = 0; r < 2; r++) {
        int nd = r ? 2 : 3;
        const int64_t *sh = r ? s2 : s3;
        lucid_tensor *x[4], *y = mk(dt, nd, sh), *ref = mk(dt, nd, sh);
        for (int i = 0; i < 4; i++) {
            x[i] = mk(dt, nd, sh);
            fill_vals(x[i]);
        }
        for (int n = 1; n <= 4; n++) {
            lucid_status st = lucid_nn_add_n(ctx, n, (const lucid_tensor *const *)x, y);
            lucid_status s2_ = lucid_copy(ctx, ref, x[0]);
            for (int i = 1; i < n && !s2_; i++) s2_ = lucid_binary(ctx, LUCID_OP_ADD, ref, ref, x[i]);
            snprintf(name, sizeof name, "add_n %s rank %d n=%d = x0:add(x1)... bitwise", dn(dt),
                     nd, n);
            CHECK(name, st == LUCID_OK && s2_ == LUCID_OK && same_bits(y, ref),
                  "status %s / %s: %s", lucid_status_name(st), lucid_status_name(s2_),
                  lucid_ctx_error(ctx));
        }
        lucid_status st = lucid_nn_add_forward(ctx, x[0], x[1], ref);
        lucid_status s2_ = lucid_nn_add_n(ctx, 2, (const lucid_tensor *const *)x, y);
        snprintf(name, sizeof name, "add_n %s rank %d n=2 = add_forward bitwise", dn(dt), nd);
        CHECK(name, st == LUCID_OK && s2_ == LUCID_OK && same_bits(y, ref), "status %s / %s",
              lucid_status_name(st), lucid_status_name(s2_));
        lucid_tensor *all[] = {x[0], x[1], x[2], x[3], y, ref};
        rel(all, 6);
    }
}

// ----------------------------------------------------------------------------
// values

static void test_values(lucid_dtype dt, int64_t N, int64_t H, int64_t W) {
    char pre[120];
    /* Concat-like: one dst, copies, a zero fill, an empty piece; channel 12
     * untouched */
    snprintf(pre, sizeof pre, "channel_copy_multi %s [%lld,*,%lld,%lld] gather", dn(dt),
             (long long)N, (long long)H, (long long)W);
    lucid_tensor *d = mkc(dt, N, 13, H, W), *a = mkc(dt, N, 4, H, W), *b = mkc(dt, N, 7, H, W);
    lucid_chan_piece pc[4] = {CP(d, 0, a, 1, 3), CP(d, 3, NULL, 0, 2), CP(d, 5, b, 0, 7),
                              CP(d, 12, a, 0, 0)};
    run3(pre, 4, pc, &d, 1, 1);
    /* Split-like: one src, four dsts (one zero-filled in part) */
    snprintf(pre, sizeof pre, "channel_copy_multi %s [%lld,*,%lld,%lld] scatter", dn(dt),
             (long long)N, (long long)H, (long long)W);
    lucid_tensor *x = mkc(dt, N, 12, H, W);
    lucid_tensor *o[4] = {mkc(dt, N, 1, H, W), mkc(dt, N, 5, H, W), mkc(dt, N, 6, H, W),
                          mkc(dt, N, 3, H, W)};
    lucid_chan_piece ps[5] = {CP(o[0], 0, x, 0, 1), CP(o[1], 0, x, 1, 5), CP(o[2], 0, x, 6, 6),
                              CP(o[3], 0, x, 9, 2), CP(o[3], 2, NULL, 0, 1)};
    run3(pre, 5, ps, o, 4, 1);
    /* 20 one-channel pieces, reversed (past one GPU launch's 16) */
    snprintf(pre, sizeof pre, "channel_copy_multi %s [%lld,*,%lld,%lld] 20 pieces", dn(dt),
             (long long)N, (long long)H, (long long)W);
    lucid_tensor *y = mkc(dt, N, 21, H, W), *z = mkc(dt, N, 20, H, W);
    lucid_chan_piece pr[20];
    for (int i = 0; i < 20; i++)
        pr[i] = (lucid_chan_piece){.dst = y, .dst_c0 = 20 - i, .src = i % 7 == 3 ? NULL : z,
                                   .src_c0 = i, .nch = 1};
    run3(pre, 20, pr, &y, 1, 1);
    lucid_tensor *all[] = {d, a, b, x, o[0], o[1], o[2], o[3], y, z};
    rel(all, 10);
}

/* a src of another dtype is converted (as lucid_nn_channel_copy), next to
 * same-dtype pieces */
static void test_convert(void) {
    const char *pre = "channel_copy_multi bf16 <- f32 piece next to bf16 pieces";
    lucid_tensor *d = mkc(LUCID_BF16, 2, 9, 3, 3), *a = mk4(LUCID_F32, 2, 4, 3, 3);
    lucid_tensor *b = mkc(LUCID_BF16, 2, 5, 3, 3);
    fill_rand(a, -3, 3);
    lucid_chan_piece pc[3] = {CP(d, 0, a, 0, 4), CP(d, 4, b, 0, 4), CP(d, 8, NULL, 0, 1)};
    run3(pre, 3, pc, &d, 1, 0);
    /* the converted channels equal a single channel_copy's */
    lucid_tensor *e = clone(d);
    lucid_status st = lucid_nn_channel_copy(ctx, e, 0, a, 0, 4, 0.0);
    CHECK("channel_copy_multi bf16 <- f32: converted channels = channel_copy's",
          st == LUCID_OK && same_bits(d, e), "status %s", lucid_status_name(st));
    lucid_tensor *all[] = {d, a, b, e};
    rel(all, 4);
}

// ----------------------------------------------------------------------------
// errors

static void expect_err(const char *name, lucid_status want, int n, const lucid_chan_piece *pc,
                       const char *needle, lucid_tensor *watch) {
    lucid_tensor *before = watch ? clone(watch) : NULL;
    lucid_status st = lucid_nn_channel_copy_multi(ctx, n, pc);
    const char *msg = lucid_ctx_error(ctx);
    int ok = st == want && strstr(msg, "channel_copy_multi") && strstr(msg, needle) &&
             (!watch || same_bits(before, watch));
    CHECK(name, ok, "status %s, message '%s' (want %s and '%s')", lucid_status_name(st), msg,
          lucid_status_name(want), needle);
    if (before) lucid_tensor_release(before);
}

static void test_errors(void) {
    lucid_tensor *d = mkc(LUCID_F32, 2, 8, 3, 3), *a = mkc(LUCID_F32, 2, 4, 3, 3);
    lucid_tensor *wide = mkc(LUCID_F32, 2, 4, 3, 4), *n3 = mkc(LUCID_F32, 3, 4, 3, 3);
    lucid_tensor *h = mkc(LUCID_BF16, 2, 4, 3, 3), *i32 = NULL, *v = NULL, *r1 = NULL;
    int64_t s1[1] = {8};
    lucid_tensor_empty(ctx, CPU, LUCID_I32, 4, d->shape, &i32);
    lucid_tensor_narrow(ctx, d, 1, 2, 4, &v); /* channels 2..5: not contiguous */
    r1 = mk(LUCID_F32, 1, s1);
    lucid_chan_piece ok1 = CP(d, 0, a, 0, 4);
    expect_err("channel_copy_multi error: n = 65", LUCID_ERR_ARG, 65, &ok1, "65 pieces", d);
    expect_err("channel_copy_multi error: n = -1", LUCID_ERR_ARG, -1, &ok1, "-1 pieces", d);
    expect_err("channel_copy_multi error: pieces NULL", LUCID_ERR_ARG, 1, NULL, "NULL", NULL);
    lucid_chan_piece p0[2] = {ok1, CP(NULL, 4, a, 0, 4)};
    expect_err("channel_copy_multi error: NULL dst", LUCID_ERR_ARG, 2, p0, "piece 1 dst is NULL",
               d);
    lucid_chan_piece p1[2] = {ok1, CP(d, 4, wide, 0, 4)};
    expect_err("channel_copy_multi error: src of another plane size", LUCID_ERR_ARG, 2, p1,
               "piece 1 src [2,4,3,4] and piece 0 dst [2,8,3,3] differ outside dim 1", d);
    lucid_chan_piece p2[2] = {ok1, CP(d, 4, n3, 0, 4)};
    expect_err("channel_copy_multi error: src of another batch size", LUCID_ERR_ARG, 2, p2,
               "differ outside dim 1", d);
    lucid_chan_piece p3[2] = {ok1, CP(d, 5, a, 0, 4)};
    expect_err("channel_copy_multi error: dst range past C", LUCID_ERR_ARG, 2, p3,
               "piece 1: channels [0, 4) of src (4) into [5, 9) of dst (8) out of range", d);
    lucid_chan_piece p4[2] = {ok1, CP(d, 4, a, 1, 4)};
    expect_err("channel_copy_multi error: src range past C", LUCID_ERR_ARG, 2, p4,
               "channels [1, 5) of src (4)", d);
    lucid_chan_piece p5[2] = {ok1, CP(d, 6, NULL, 0, 3)};
    expect_err("channel_copy_multi error: zero fill past C", LUCID_ERR_ARG, 2, p5,
               "piece 1: zero fill of channels [6, 9) of dst (8) out of range", d);
    lucid_chan_piece p6[2] = {ok1, CP(d, 4, a, 0, -1)};
    expect_err("channel_copy_multi error: nch < 0", LUCID_ERR_ARG, 2, p6, "out of range", d);
    lucid_chan_piece p6b[2] = {ok1, CP(d, -1, a, 0, 1)};
    expect_err("channel_copy_multi error: dst_c0 < 0", LUCID_ERR_ARG, 2, p6b, "out of range", d);
    lucid_chan_piece p7[2] = {ok1, CP(h, 0, a, 0, 4)};
    expect_err("channel_copy_multi error: dst dtype differs from piece 0's", LUCID_ERR_ARG, 2, p7,
               "piece 1 dst has dtype bf16 but the input has f32", d);
    lucid_chan_piece p8[2] = {ok1, CP(d, 4, i32, 0, 4)};
    expect_err("channel_copy_multi error: integer src", LUCID_ERR_UNSUPPORTED, 2, p8,
               "piece 1 src has dtype i32", d);
    lucid_chan_piece p9[2] = {ok1, CP(v, 0, a, 0, 4)};
    expect_err("channel_copy_multi error: non-contiguous dst", LUCID_ERR_ARG, 2, p9,
               "piece 1 dst must be contiguous", d);
    lucid_chan_piece p10[1] = {CP(r1, 0, NULL, 0, 1)};
    expect_err("channel_copy_multi error: rank 1", LUCID_ERR_ARG, 1, p10,
               "piece 0 dst needs rank >= 2", r1);
    lucid_chan_piece p11[2] = {CP(d, 0, a, 0, 4), CP(d, 3, NULL, 0, 2)};
    expect_err("channel_copy_multi error: two dst ranges overlap", LUCID_ERR_ARG, 2, p11,
               "piece 0's dst may overlap piece 1's dst", d);
    lucid_chan_piece p12[2] = {CP(d, 0, a, 0, 4), CP(a, 0, d, 2, 4)};
    expect_err("channel_copy_multi error: a dst is another piece's src", LUCID_ERR_ARG, 2, p12,
               "piece 0's dst may overlap piece 1's src", d);
    lucid_chan_piece p13[1] = {CP(d, 0, d, 2, 4)};
    expect_err("channel_copy_multi error: dst and src channels of one tensor overlap",
               LUCID_ERR_ARG, 1, p13, "piece 0's dst may overlap piece 0's src", d);
    /* disjoint channels of one tensor are fine, as are shared sources */
    lucid_chan_piece p14[3] = {CP(d, 0, d, 4, 4), CP(a, 0, d, 4, 2), CP(a, 2, d, 6, 2)};
    lucid_tensor *dw[2] = {d, a};
    run3("channel_copy_multi: one tensor's disjoint channels, shared sources", 3, p14, dw, 2, 1);
    CHECK_STATUS("channel_copy_multi: n = 0 is a no-op", ctx,
                 lucid_nn_channel_copy_multi(ctx, 0, NULL));
    lucid_tensor *all[] = {d, a, wide, n3, h, i32, v, r1};
    rel(all, 8);
}

static void test_sum_errors(void) {
    lucid_tensor *d = mkc(LUCID_F32, 2, 8, 3, 3), *a = mkc(LUCID_F32, 2, 4, 3, 3);
    lucid_tensor *b = mkc(LUCID_F32, 2, 4, 3, 3), *h = mkc(LUCID_BF16, 2, 4, 3, 3);
    lucid_tensor *dh = mkc(LUCID_BF16, 2, 8, 3, 3);
    lucid_chan_piece e1[1] = {{.dst = d, .nch = 2, .add = {a}}};
    expect_err("channel_copy_multi error: addends without a src", LUCID_ERR_ARG, 1, e1,
               "piece 0 has addends but no src", d);
    lucid_chan_piece e2[1] = {{.dst = d, .src = a, .nch = 2, .add = {NULL, b}}};
    expect_err("channel_copy_multi error: an addend after a NULL one", LUCID_ERR_ARG, 1, e2,
               "piece 0: addend 1 follows a NULL addend", d);
    lucid_chan_piece e3[1] = {{.dst = d, .src = a, .nch = 2, .add = {h}}};
    expect_err("channel_copy_multi error: an addend of another dtype", LUCID_ERR_ARG, 1, e3,
               "piece 0 addend 0 has dtype bf16 but the input has f32", d);
    lucid_chan_piece e4[1] = {{.dst = dh, .src = a, .nch = 2, .add = {h}}};
    expect_err("channel_copy_multi error: a sum's src of another dtype (no conversion in a sum)",
               LUCID_ERR_ARG, 1, e4, "piece 0 src has dtype f32 but the input has bf16", dh);
    lucid_chan_piece e5[1] = {{.dst = d, .src = a, .nch = 2, .add = {b, a}, .add_c0 = {0, 3}}};
    expect_err("channel_copy_multi error: an addend's channels out of range", LUCID_ERR_ARG, 1,
               e5, "piece 0: channels [3, 5) of addend 1 (4) out of range", d);
    lucid_chan_piece e6[2] = {{.dst = d, .src = a, .nch = 4},
                              {.dst = a, .src = b, .nch = 2, .add = {d}, .add_c0 = {2}}};
    expect_err("channel_copy_multi error: a dst overlaps an addend", LUCID_ERR_ARG, 2, e6,
               "piece 0's dst may overlap piece 1's addend", d);
    lucid_chan_piece e7[1] = {{.dst = d, .src = a, .nch = 2, .add = {d}, .add_c0 = {1}}};
    expect_err("channel_copy_multi error: a dst overlaps its own addend", LUCID_ERR_ARG, 1, e7,
               "piece 0's dst may overlap piece 0's addend", d);
    /* add_n */
    const lucid_tensor *xs[5] = {a, b, a, b, a};
    lucid_tensor *before = clone(d);
    lucid_status st = lucid_nn_add_n(ctx, 5, xs, b);
    CHECK("add_n error: 5 inputs", st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "add_n: 5 inputs"),
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    st = lucid_nn_add_n(ctx, 0, xs, b);
    CHECK("add_n error: 0 inputs", st == LUCID_ERR_ARG, "%s", lucid_status_name(st));
    st = lucid_nn_add_n(ctx, 2, xs, d);
    CHECK("add_n error: y of another shape",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "add_n: input 1 of 2"),
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    const lucid_tensor *xh[2] = {a, h};
    lucid_tensor *y = mkc(LUCID_F32, 2, 4, 3, 3);
    st = lucid_nn_add_n(ctx, 2, xh, y);
    CHECK("add_n error: an input of another dtype",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "input 2 of 2 has dtype bf16"),
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    st = lucid_nn_add_n(ctx, 2, xs, (lucid_tensor *)b);
    CHECK("add_n error: y is one of the inputs",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "may overlap"),
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    CHECK("add_n errors leave other tensors untouched", same_bits(before, d), "d changed");
    lucid_tensor *all[] = {d, a, b, h, dh, before, y};
    rel(all, 7);
}

/* lucid_module_ensure_buffer on a Concat module's slots */
static void test_ensure_buffer(void) {
    lucid_module *cat = NULL;
    lucid_status st = lucid_module_concat_create(ctx, 2, &cat);
    CHECK_STATUS("ensure_buffer: create Concat(2)", ctx, st);
    if (st) return;
    int64_t s1[4] = {2, 6, 3, 3}, s2[4] = {2, 7, 3, 3};
    lucid_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL;
    st = lucid_module_ensure_buffer(ctx, cat, 0, 0, CPU, LUCID_BF16, 4, s1, &t1);
    CHECK("ensure_buffer: output 0 allocated with the shape and dtype asked",
          st == LUCID_OK && t1 && t1 == lucid_module_output(cat, 0) && t1->dtype == LUCID_BF16 &&
              t1->shape[1] == 6,
          "%s", lucid_ctx_error(ctx));
    st = lucid_module_ensure_buffer(ctx, cat, 0, 0, CPU, LUCID_BF16, 4, s1, &t2);
    CHECK("ensure_buffer: a matching buffer is kept", st == LUCID_OK && t2 == t1, "reallocated");
    st = lucid_module_ensure_buffer(ctx, cat, 0, 0, CPU, LUCID_BF16, 4, s2, &t3);
    CHECK("ensure_buffer: another shape reallocates",
          st == LUCID_OK && t3 && t3 == lucid_module_output(cat, 0) && t3->shape[1] == 7,
          "%s", lucid_ctx_error(ctx));
    st = lucid_module_ensure_buffer(ctx, cat, 1, 1, CPU, LUCID_F32, 4, s1, &t4);
    CHECK("ensure_buffer: grad_input 1", st == LUCID_OK && t4 == lucid_module_grad_input(cat, 1),
          "%s", lucid_ctx_error(ctx));
    st = lucid_module_ensure_buffer(ctx, cat, 1, 2, CPU, LUCID_F32, 4, s1, &t4);
    CHECK("ensure_buffer error: grad_input 2 of a 2-input module",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "grad_input 2 out of range") &&
              t4 == NULL,
          "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    st = lucid_module_ensure_buffer(ctx, cat, 0, 1, CPU, LUCID_F32, 4, s1, &t4);
    CHECK("ensure_buffer error: output 1 of a 1-output module", st == LUCID_ERR_ARG,
          "%s", lucid_status_name(st));
    lucid_module_release(cat);
}

// ----------------------------------------------------------------------------
// modules

static void test_modules(lucid_dtype dt) {
    char pre[120], name[200];
    snprintf(pre, sizeof pre, "Concat(3) / Split([1,5,6]) %s", dn(dt));
    lucid_module *cat = NULL, *spl = NULL;
    int64_t sizes[3] = {1, 5, 6};
    lucid_status st = lucid_module_concat_create(ctx, 3, &cat);
    if (!st) st = lucid_module_split_create(ctx, 3, sizes, &spl);
    snprintf(name, sizeof name, "%s: create", pre);
    CHECK_STATUS(name, ctx, st);
    if (st) return;
    lucid_tensor *x[3] = {mkc(dt, 2, 3, 5, 3), mkc(dt, 2, 1, 5, 3), mkc(dt, 2, 8, 5, 3)};
    lucid_tensor *gy = mkc(dt, 2, 12, 5, 3), *xs = mkc(dt, 2, 12, 5, 3);
    lucid_tensor *go[3] = {mkc(dt, 2, 1, 5, 3), NULL, mkc(dt, 2, 6, 5, 3)};
    lucid_tensor *res[2][8] = {{0}};
    for (int route = 0; route < 2; route++) {
        lucid_nn_chan_copy_multi_override(route);
        const lucid_tensor *const *xin = (const lucid_tensor *const *)x;
        st = lucid_module_forward(ctx, cat, 3, xin);
        if (!st) st = lucid_module_backward(ctx, cat, 3, xin, 1, (const lucid_tensor *const *)&gy);
        const lucid_tensor *sx = xs;
        if (!st) st = lucid_module_forward(ctx, spl, 1, &sx);
        if (!st)
            st = lucid_module_backward(ctx, spl, 1, &sx, 3, (const lucid_tensor *const *)go);
        snprintf(name, sizeof name, "%s: forward + backward, %s route", pre,
                 route ? "multi" : "per-piece");
        CHECK_STATUS(name, ctx, st);
        if (st) break;
        res[route][0] = clone(lucid_module_output(cat, 0));
        for (int i = 0; i < 3; i++) res[route][1 + i] = clone(lucid_module_grad_input(cat, i));
        for (int i = 0; i < 3; i++) res[route][4 + i] = clone(lucid_module_output(spl, i));
        res[route][7] = clone(lucid_module_grad_input(spl, 0));
    }
    lucid_nn_chan_copy_multi_override(-1);
    if (!st) {
        int eq = 1;
        for (int i = 0; i < 8; i++) eq = eq && same_bits(res[0][i], res[1][i]);
        snprintf(name, sizeof name, "%s: both routes bitwise equal", pre);
        CHECK(name, eq, "outputs or gradients differ");
        /* values: torch.cat / torch.split, the missing gradient zero */
        lucid_tensor *c = res[1][0], *dxs = res[1][7];
        size_t es = lucid_dtype_size(dt), S = 15;
        int ok = 1;
        int64_t off = 0;
        for (int i = 0; i < 3; i++) {
            int64_t C = x[i]->shape[1];
            for (int n = 0; n < 2; n++)
                ok = ok && memcmp((char *)lucid_tensor_data(c) + ((n * 12 + off) * S) * es,
                                  (char *)lucid_tensor_data(x[i]) + (n * C * S) * es,
                                  C * S * es) == 0 &&
                     memcmp((char *)lucid_tensor_data(res[1][1 + i]) + (n * C * S) * es,
                            (char *)lucid_tensor_data(gy) + ((n * 12 + off) * S) * es,
                            C * S * es) == 0;
            off += C;
        }
        snprintf(name, sizeof name, "%s: Concat = torch.cat, its gradient = slices", pre);
        CHECK(name, ok, "values differ");
        ok = 1;
        off = 0;
        for (int i = 0; i < 3; i++) {
            int64_t C = sizes[i];
            for (int n = 0; n < 2; n++) {
                const char *dr = (char *)lucid_tensor_data(dxs) + ((n * 12 + off) * S) * es;
                ok = ok && memcmp((char *)lucid_tensor_data(res[1][4 + i]) + (n * C * S) * es,
                                  (char *)lucid_tensor_data(xs) + ((n * 12 + off) * S) * es,
                                  C * S * es) == 0;
                if (go[i])
                    ok = ok && memcmp(dr, (char *)lucid_tensor_data(go[i]) + (n * C * S) * es,
                                      C * S * es) == 0;
                else
                    for (size_t k = 0; k < C * S * es; k++) ok = ok && dr[k] == 0;
            }
            off += C;
        }
        snprintf(name, sizeof name,
                 "%s: Split = torch.split, its gradient = cat (missing piece zero)", pre);
        CHECK(name, ok, "values differ");
    }
    for (int r = 0; r < 2; r++) rel(res[r], 8);
    lucid_tensor *all[] = {x[0], x[1], x[2], gy, xs, go[0], go[2]};
    rel(all, 7);
    lucid_module_release(cat);
    lucid_module_release(spl);
}

int main(void) {
    nn_ctx_open(TEST_NN_SEED);
    const lucid_dtype DTS[4] = {LUCID_F32, LUCID_BF16, LUCID_F16, LUCID_F64};
    for (int d = 0; d < 4; d++) {
        test_values(DTS[d], 2, 3, 5);
        test_values(DTS[d], 3, 4, 4);
        test_values(DTS[d], 1, 1, 1);
        test_modules(DTS[d]);
        test_sums(DTS[d], 2, 3, 5);
        test_sums(DTS[d], 3, 4, 4);
        test_sums(DTS[d], 1, 1, 1);
        test_sums(DTS[d], 2, 1, 7);
        test_add_n(DTS[d]);
    }
    test_convert();
    test_errors();
    test_sum_errors();
    test_ensure_buffer();
    CHECK("channel_copy_multi: the cpu table has the slot",
          lucid_nn_cpu_kernels()->channel_copy_multi != NULL, "slot NULL");
    lucid_ctx_release(ctx);
    return test_exit();
}
