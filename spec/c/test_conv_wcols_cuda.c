/*
 * test_conv_wcols_cuda.c — the Conv2d column cache (engine/nn/nn.h
 * lucid_conv_wcols; engine/nn/conv_wcols.c, cuda/nn_conv_wcols.cu,
 * cuda/nn_conv.cu; DECISIONS 38): the filter gradient reading the forward's
 * im2col columns instead of building them again.
 *
 * Host checks (every build, no device needed): the freshness record with
 * CPU tensors — fresh after a mark; not fresh for another epoch, kernel,
 * stride, dilation, rows per image, tensor, shape (a view of the same
 * storage), offset (a narrowed view) or after an in-place write (storage
 * version); invalidate forgets; the process total (budget take / give,
 * the ceiling exactly), adopt retiring up to LUCID_CONV_WCOLS_RETIRED
 * buffers then refusing, release giving every byte back.
 * Device checks (skipped without a device), the reference being the same
 * calls with the cache off (lucid_cuda_nn_set_wcols 1: no cache, every
 * filter gradient runs its im2col), always the same routes
 * (lucid_cuda_nn_set_conv_col 8: the im2col route for every eligible pass;
 * lucid_cuda_nn_set_conv_small 2 for the cases whose forward is meant to
 * run the small-channel kernels, 1 for the others):
 *   - per case and mode (2 the default: side builds for stable inputs,
 *     with x_stable 1 and 0; 3 side builds for all; 4 no side builds):
 *     forward output and filter gradient (beta 0 on a branch lane, beta 1
 *     on the parameter-gradient lane: another stream than the forward's)
 *     bitwise equal to the reference; im2col launches counted
 *     (lucid_cuda_conv_col_launch_count): the forward 1 on the im2col route
 *     or with a side build, the filter gradient 0 when the columns are
 *     cached (lucid_cuda_conv_wcols_hit_count +1 per filter gradient) and 1
 *     otherwise; side builds counted (lucid_cuda_conv_wcols_side_count);
 *     the reference's filter gradient is checked to be on the im2col route;
 *   - cases: the network's real shapes at batch 4, 640 — layer 0 (3>16 s2
 *     640x640, K 27 padded to 32, forward on the small-channel kernels,
 *     filter gradient split in 64 chunks per image), 16>32 s2 320x320,
 *     16>8 160x160 (small forward), 64>64 s2 160x160, 64>64 80x80 (split
 *     4), 51>51 80x80 (K 459), 256>64 20x20 (no split) — and odd ones:
 *     5x5 pad 2, 3x3 dilation 2 with N*S 1 (one GEMM straight into dw), 3x3
 *     s2 on an odd plane, 3x1, 3>16 s2 small at 32x32, Cout 12;
 *   - the cache off (mode 1) given a cache: nothing allocated, the filter
 *     gradient builds its columns;
 *   - staleness: forward(x1), forward(x2), filter gradient of x2 reads x2's
 *     columns (a hit, bits of x2's reference) and that of x1 builds its own
 *     (bits of x1's); forward(x1), x1 written in place (a copy: version
 *     bump), filter gradient of x1 builds again (bits of the new values);
 *     forward(x1), filter gradient of x1 on a branch lane left unjoined,
 *     forward(x2) on the compute stream (it must wait for that read),
 *     filter gradient of x2: both bitwise their references;
 *   - memory: the buffer holds N*Kr*Ho*Wo*2 bytes rounded to 256 and the
 *     process total moves by that; a larger batch retires the buffer and
 *     allocates another (the total grows by the new size); with the
 *     ceiling at 1 byte (lucid_cuda_nn_set_wcols_cap) no buffer, same bits;
 *   - the per-context switch at 0 follows LUCID_WCOLS (read once per
 *     process: "0" no hit, else a hit);
 *   - capture on a fresh context (after an eager pass): forward + filter
 *     gradient on a branch lane recorded, 1 im2col recorded (the forward's
 *     or the side build), a hit, replayed bitwise equal to the reference;
 *     the input overwritten between replays (no host call sees it): the
 *     replay equals the new input's reference (the recorded forward writes
 *     the columns every replay); columns written eagerly are not trusted
 *     inside a capture (1 im2col recorded in the filter gradient, no hit):
 *     for a COL-forward case (64>64 40x40 N2) and a side-build case (3>16
 *     s2 64x64 N2).
 */
#include "test_cuda_util.h"

#include "internal.h" /* lucid_ctx_grad_lane_fork */
#include "nn/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* As in test_conv_col_cuda.c: strong references in a CUDA build, weak ones
 * in a CPU-only build (the host part runs either way). */
unsigned long lucid_cuda_conv_col_launch_count(void);     /* cuda/nn_conv_col.cu */
unsigned long lucid_cuda_conv_wcols_hit_count(void);      /* cuda/nn_conv_wcols.cu */
unsigned long lucid_cuda_conv_wcols_side_count(void);     /* cuda/nn_conv_wcols.cu */
int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route);   /* cuda/nn_table.cu */
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route); /* cuda/nn_table.cu */
int lucid_cuda_nn_set_wcols(lucid_ctx *ctx, int mode);       /* cuda/nn_table.cu */
long long lucid_cuda_nn_set_wcols_cap(lucid_ctx *ctx, long long bytes); /* cuda/nn_table.cu */
#if defined(__has_include)
#if __has_include("../../build/.config-cuda1")
#define WC_CUDA_BUILD 1
#endif
#endif
#ifdef WC_CUDA_BUILD
#define WC_LINKED() 1
#else
#pragma weak lucid_cuda_conv_col_launch_count
#pragma weak lucid_cuda_conv_wcols_hit_count
#pragma weak lucid_cuda_conv_wcols_side_count
#pragma weak lucid_cuda_nn_set_conv_col
#pragma weak lucid_cuda_nn_set_conv_small
#pragma weak lucid_cuda_nn_set_wcols
#pragma weak lucid_cuda_nn_set_wcols_cap
#define WC_LINKED()                                                           \
    (lucid_cuda_conv_col_launch_count && lucid_cuda_conv_wcols_hit_count &&   \
     lucid_cuda_conv_wcols_side_count && lucid_cuda_nn_set_conv_col &&        \
     lucid_cuda_nn_set_conv_small && lucid_cuda_nn_set_wcols && lucid_cuda_nn_set_wcols_cap)
#endif

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* modes of lucid_cuda_nn_set_wcols (1 + the LUCID_WCOLS value) */
enum { WC_OFF = 1, WC_STABLE = 2, WC_SIDE = 3, WC_NOSIDE = 4 };

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* ------------------------------------------------------------ host part */

static void test_record(void) {
    const char *pre = "wcols record (host)";
    lucid_ctx *hc = NULL;
    lucid_ctx_options o = lucid_ctx_options_default();
    char err[256] = "";
    if (lucid_ctx_create(&o, &hc, err, sizeof err) != LUCID_OK) {
        TEST_FAIL(NAME("%s: cpu context", pre), "%s", err);
        return;
    }
    lucid_conv_wcols c;
    lucid_conv_wcols_init(&c);
    /* x and nar: the two halves of one storage (same shape, other offset);
     * v: x seen with another shape */
    lucid_tensor *base = NULL, *x = NULL, *x2 = NULL, *v = NULL, *nar = NULL;
    lucid_storage *b[LUCID_CONV_WCOLS_RETIRED + 2] = {NULL};
    const int64_t bs[4] = {4, 3, 4, 4}, xs[4] = {2, 3, 4, 4}, vs[4] = {2, 3, 2, 8};
    const lucid_conv2d_params p = {2, 2, 1, 1, 1, 1, 1};
    const size_t held0 = lucid_conv_wcols_held_total();
    if (lucid_tensor_zeros(hc, CPU, LUCID_BF16, 4, bs, &base) != LUCID_OK ||
        lucid_tensor_narrow(hc, base, 0, 0, 2, &x) != LUCID_OK ||
        lucid_tensor_narrow(hc, base, 0, 2, 2, &nar) != LUCID_OK ||
        lucid_tensor_zeros(hc, CPU, LUCID_BF16, 4, xs, &x2) != LUCID_OK ||
        lucid_tensor_view(hc, x, 4, vs, &v) != LUCID_OK) {
        TEST_FAIL(NAME("%s: tensors", pre), "%s", lucid_ctx_error(hc));
        goto done;
    }
    CHECK(NAME("%s: empty cache is not fresh", pre),
          !c.valid && !c.buf && !lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 1), "valid %d",
          c.valid);
    /* a buffer (the budget first, as the backend takes it) */
    for (int i = 0; i < LUCID_CONV_WCOLS_RETIRED + 2; i++)
        if (lucid_storage_create(hc, CPU, 1000 + (size_t)i, 0, &b[i]) != LUCID_OK) {
            TEST_FAIL(NAME("%s: storages", pre), "%s", lucid_ctx_error(hc));
            goto done;
        }
    CHECK(NAME("%s: budget take within the ceiling", pre),
          lucid_conv_wcols_budget_take(1000, held0 + 1000) &&
              lucid_conv_wcols_held_total() == held0 + 1000,
          "held %zu (start %zu)", lucid_conv_wcols_held_total(), held0);
    CHECK(NAME("%s: budget take past the ceiling refused", pre),
          !lucid_conv_wcols_budget_take(1, held0 + 1000) &&
              lucid_conv_wcols_held_total() == held0 + 1000,
          "held %zu", lucid_conv_wcols_held_total());
    CHECK(NAME("%s: adopt the first buffer", pre),
          lucid_conv_wcols_adopt(&c, b[0], 1000) && c.buf == b[0] && c.held == 1000, "held %zu",
          c.held);
    b[0] = NULL; /* owned by c now */
    lucid_conv_wcols_mark(&c, x, 3, 3, &p, 32, 7, 0);
    CHECK(NAME("%s: fresh after a mark", pre), lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 7),
          "not fresh");
    {
        lucid_conv2d_params q = p;
        int bad = 0;
        bad |= lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 8) << 0;  /* epoch */
        bad |= lucid_conv_wcols_fresh(&c, x, 1, 3, &p, 32, 7) << 1;  /* kernel */
        q.stride_w = 1;
        bad |= lucid_conv_wcols_fresh(&c, x, 3, 3, &q, 32, 7) << 2;  /* stride */
        q = p;
        q.dilation_h = 2;
        bad |= lucid_conv_wcols_fresh(&c, x, 3, 3, &q, 32, 7) << 3;  /* dilation */
        bad |= lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 40, 7) << 4;  /* rows */
        bad |= lucid_conv_wcols_fresh(&c, x2, 3, 3, &p, 32, 7) << 5; /* another tensor */
        bad |= lucid_conv_wcols_fresh(&c, v, 3, 3, &p, 32, 7) << 6;  /* shape */
        CHECK(NAME("%s: not fresh for another epoch, kernel, stride, dilation, rows, tensor or "
                   "shape", pre),
              bad == 0, "fresh for case mask 0x%x", bad);
    }
    lucid_conv_wcols_mark(&c, nar, 3, 3, &p, 32, 7, 1);
    CHECK(NAME("%s: the other half of the storage (same shape, another offset) is another x",
               pre),
          lucid_conv_wcols_fresh(&c, nar, 3, 3, &p, 32, 7) && c.side == 1 &&
              !lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 7),
          "fresh %d / %d", lucid_conv_wcols_fresh(&c, nar, 3, 3, &p, 32, 7),
          lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 7));
    lucid_conv_wcols_mark(&c, x, 3, 3, &p, 32, 7, 0);
    if (lucid_fill(hc, x, 1.0) != LUCID_OK) {
        TEST_FAIL(NAME("%s: fill", pre), "%s", lucid_ctx_error(hc));
        goto done;
    }
    CHECK(NAME("%s: not fresh after an in-place write (version bump)", pre),
          !lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 7), "still fresh");
    lucid_conv_wcols_mark(&c, x, 3, 3, &p, 32, 7, 0);
    lucid_conv_wcols_invalidate(&c);
    CHECK(NAME("%s: invalidate forgets (the buffer stays)", pre),
          !lucid_conv_wcols_fresh(&c, x, 3, 3, &p, 32, 7) && c.buf && !c.src, "valid %d",
          c.valid);
    /* growth: every adopt retires the current buffer, until the slots are used */
    {
        int ok = 1;
        size_t want = 1000;
        for (int i = 1; i <= LUCID_CONV_WCOLS_RETIRED; i++) {
            lucid_storage *prev = c.buf;
            const size_t by = 1000 + (size_t)i;
            ok = ok && lucid_conv_wcols_budget_take(by, (size_t)-1) &&
                 lucid_conv_wcols_adopt(&c, b[i], by) && c.buf == b[i] &&
                 c.retired[i - 1] == prev;
            if (ok) b[i] = NULL;
            want += by;
        }
        CHECK(NAME("%s: adopt retires the old buffer (%d slots)", pre, LUCID_CONV_WCOLS_RETIRED),
              ok && c.held == want && lucid_conv_wcols_held_total() == held0 + want,
              "held %zu (want %zu), total %zu", c.held, want, lucid_conv_wcols_held_total());
        const int i = LUCID_CONV_WCOLS_RETIRED + 1;
        lucid_storage *cur = c.buf;
        CHECK(NAME("%s: adopt refused with every slot used", pre),
              !lucid_conv_wcols_adopt(&c, b[i], 1) && c.buf == cur && c.held == want,
              "buf %p held %zu", (void *)c.buf, c.held);
    }
    lucid_conv_wcols_mark(&c, x, 3, 3, &p, 32, 7, 0);
    lucid_conv_wcols_release(&c);
    CHECK(NAME("%s: release gives every byte back", pre),
          !c.buf && !c.src && !c.valid && c.held == 0 &&
              lucid_conv_wcols_held_total() == held0,
          "total %zu (start %zu)", lucid_conv_wcols_held_total(), held0);
done:
    lucid_conv_wcols_release(&c);
    for (int i = 0; i < LUCID_CONV_WCOLS_RETIRED + 2; i++) lucid_storage_release(b[i]);
    rel(nar);
    rel(v);
    rel(x2);
    rel(x);
    rel(base);
    lucid_ctx_release(hc);
}

/* ------------------------------------------------------------ device cases */

typedef struct wc_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int kh, kw, s, ph, pw, d;
    int small; /* the forward on the small-channel kernels (set_conv_small 2) */
} wc_case;

static const wc_case CASES[] = {
    /* the network's shapes at batch 4, 640 */
    {"layer 0 3>16 3x3 s2 640x640 N4 (K 27, small forward, split 64)", 4, 3, 640, 640, 16, 3, 3,
     2, 1, 1, 1, 1},
    {"16>32 3x3 s2 320x320 N4", 4, 16, 320, 320, 32, 3, 3, 2, 1, 1, 1, 0},
    {"16>8 3x3 s1 160x160 N4 (small forward)", 4, 16, 160, 160, 8, 3, 3, 1, 1, 1, 1, 1},
    {"64>64 3x3 s2 160x160 N4", 4, 64, 160, 160, 64, 3, 3, 2, 1, 1, 1, 0},
    {"64>64 3x3 s1 80x80 N4 (split 4)", 4, 64, 80, 80, 64, 3, 3, 1, 1, 1, 1, 0},
    {"51>51 3x3 s1 80x80 N4 (K 459)", 4, 51, 80, 80, 51, 3, 3, 1, 1, 1, 1, 0},
    {"256>64 3x3 s1 20x20 N4", 4, 256, 20, 20, 64, 3, 3, 1, 1, 1, 1, 0},
    /* odd ones */
    {"16>32 5x5 p2 24x20 N3", 3, 16, 24, 20, 32, 5, 5, 1, 2, 2, 1, 0},
    {"32>32 3x3 d2 p2 16x12 N1 (one GEMM into dw)", 1, 32, 16, 12, 32, 3, 3, 1, 2, 2, 2, 0},
    {"16>64 3x3 s2 odd 17x31 -> 9x16 N3", 3, 16, 17, 31, 64, 3, 3, 2, 1, 1, 1, 0},
    {"16>16 3x1 p1,0 12x12 N2", 2, 16, 12, 12, 16, 3, 1, 1, 1, 0, 1, 0},
    {"3>16 3x3 s2 32x32 N2 (K 27, small forward)", 2, 3, 32, 32, 16, 3, 3, 2, 1, 1, 1, 1},
    {"32>12 3x3 s1 16x16 N2 (Cout 12)", 2, 32, 16, 16, 12, 3, 3, 1, 1, 1, 1, 0},
};
/* smaller cases for the staleness, memory and capture checks */
static const wc_case COLC = {"64>64 3x3 s1 40x40 N2", 2, 64, 40, 40, 64, 3, 3, 1, 1, 1, 1, 0};
static const wc_case SIDEC = {"3>16 3x3 s2 64x64 N2 (small forward)", 2, 3, 64, 64, 16,
                              3, 3, 2, 1, 1, 1, 1};

/* 1 when the route takes the case's filter gradient here: K a multiple of
 * 8 or LUCID_CONV_COL_PAD not "0" (read once per process) */
static int case_on(const wc_case *cc) {
    const char *e = getenv("LUCID_CONV_COL_PAD");
    return (cc->Cin * cc->kh * cc->kw) % 8 == 0 || !(e && strcmp(e, "0") == 0);
}

/* 1 when the small-channel filter gradient (opt-in) could take the case:
 * the cache then has nothing to do; such a process skips small cases */
static int small_wgrad_env(void) {
    const char *e = getenv("LUCID_CONV_SMALL_WGRAD");
    return e && e[0] && strcmp(e, "0") != 0;
}

/* Column bytes of a case's cache (nn_conv_col.cuh: N*Kr*P*2 rounded to 256). */
static size_t case_cols_bytes(const wc_case *cc, int64_t N) {
    const int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->ph, cc->d);
    const int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->pw, cc->d);
    const int64_t Kr = (cc->Cin * cc->kh * cc->kw + 7) / 8 * 8;
    return ((size_t)(N * Kr * Ho * Wo) * 2 + 255) & ~(size_t)255;
}

/* Inputs of a case (device) and the host start of the beta-1 gradient. */
typedef struct wc_io {
    lucid_conv2d_params p;
    int64_t xs[4], ws[4], ys[4];
    lucid_tensor *hx, *gx, *gw, *gdy, *hdw1;
} wc_io;

static int io_make(wc_io *io, const wc_case *cc, lucid_dtype dt) {
    memset(io, 0, sizeof *io);
    lucid_conv2d_params p = {cc->s, cc->s, cc->ph, cc->pw, cc->d, cc->d, 1};
    io->p = p;
    int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->ph, cc->d);
    int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->pw, cc->d);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W}, ws[4] = {cc->Cout, cc->Cin, cc->kh, cc->kw};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo};
    memcpy(io->xs, xs, sizeof xs);
    memcpy(io->ws, ws, sizeof ws);
    memcpy(io->ys, ys, sizeof ys);
    double fan = 1.0 / sqrt((double)(cc->Cin * cc->kh * cc->kw));
    io->hx = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *hw = hrand(LUCID_F32, 4, ws, -fan, fan), *hdy = hrand(dt, 4, ys, -1, 1);
    io->hdw1 = hrand(LUCID_F32, 4, ws, -1, 1);
    io->gx = dev(io->hx);
    io->gw = dev(hw);
    io->gdy = dev(hdy);
    rel(hw);
    rel(hdy);
    return io->hx && io->gx && io->gw && io->gdy && io->hdw1;
}

static void io_free(wc_io *io) {
    rel(io->hx); rel(io->gx); rel(io->gw); rel(io->gdy); rel(io->hdw1);
}

/* References (host copies) of the forward output and the filter gradient
 * (beta 0, and beta 1 from hdw1) with the cache off, plain calls on the
 * compute stream.  *col_w: the im2col launches of the beta-0 filter
 * gradient (1: the route takes it). */
typedef struct wc_ref {
    lucid_tensor *y, *dw0, *dw1;
    long col_w;
} wc_ref;

static int ref_make(const char *pre, wc_ref *r, const wc_io *io, const lucid_tensor *x,
                    lucid_dtype dt) {
    memset(r, 0, sizeof *r);
    lucid_tensor *y = dpoison(dt, 4, io->ys), *dw0 = dpoison(LUCID_F32, 4, io->ws);
    lucid_tensor *dw1 = dev(io->hdw1);
    int ok = 0;
    if (!y || !dw0 || !dw1) {
        TEST_FAIL(NAME("%s: reference setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcols(ctx, WC_OFF);
    RUN(NAME("%s: reference forward", pre), lucid_nn_conv2d_forward(ctx, x, y, io->gw, NULL, &io->p));
    unsigned long c0 = lucid_cuda_conv_col_launch_count();
    RUN(NAME("%s: reference filter gradient", pre),
        lucid_nn_conv2d_backward_params(ctx, x, io->gdy, dw0, NULL, &io->p, 0.0));
    r->col_w = (long)(lucid_cuda_conv_col_launch_count() - c0);
    RUN(NAME("%s: reference filter gradient beta 1", pre),
        lucid_nn_conv2d_backward_params(ctx, x, io->gdy, dw1, NULL, &io->p, 1.0));
    r->y = host(y);
    r->dw0 = host(dw0);
    r->dw1 = host(dw1);
    ok = r->y && r->dw0 && r->dw1;
    if (!ok) TEST_FAIL(NAME("%s: reference copy back", pre), "%s", lucid_ctx_error(ctx));
done:
    lucid_cuda_nn_set_wcols(ctx, 0);
    rel(y); rel(dw0); rel(dw1);
    return ok;
}

static void ref_free(wc_ref *r) {
    rel(r->y); rel(r->dw0); rel(r->dw1);
    memset(r, 0, sizeof *r);
}

/* Where a filter gradient runs. */
enum { ON_COMPUTE = 0, ON_BRANCH = 1, ON_GRAD = 2 };

/* The filter gradient of (x, dy) into dw with the cache wc (NULL: the plain
 * call), on the compute stream, branch lane 1 or the parameter-gradient
 * lane; joined afterwards unless !join (branch lane only). */
static lucid_status wgrad_at(int where, int join, const lucid_tensor *x, const wc_io *io,
                             lucid_tensor *dw, double beta, lucid_conv_wcols *wc) {
    int f = 0;
    lucid_status s = LUCID_OK;
    if (where == ON_BRANCH) s = lucid_ctx_branch_fork(ctx, 1, &f);
    if (where == ON_GRAD) {
        s = lucid_ctx_set_grad_lane(ctx, 1);
        if (!s) s = lucid_ctx_grad_lane_fork(ctx, GPU, lucid_tensor_data(dw), &f);
    }
    if (!s)
        s = wc ? lucid_nn_conv2d_backward_params_cols(ctx, x, io->gdy, dw, NULL, &io->p, beta, wc)
               : lucid_nn_conv2d_backward_params(ctx, x, io->gdy, dw, NULL, &io->p, beta);
    if (f) lucid_ctx_branch_return(ctx);
    lucid_status j = LUCID_OK;
    if (where == ON_BRANCH && join) j = lucid_ctx_branch_join(ctx, 1);
    if (where == ON_GRAD) j = lucid_ctx_set_grad_lane(ctx, 0); /* joins */
    return s ? s : j;
}

/* Launch counters around a call. */
typedef struct counts {
    unsigned long col, hit, side;
} counts;
static counts counts_now(void) {
    counts c = {lucid_cuda_conv_col_launch_count(), lucid_cuda_conv_wcols_hit_count(),
                lucid_cuda_conv_wcols_side_count()};
    return c;
}
#define DCOL(c0) ((long)(lucid_cuda_conv_col_launch_count() - (c0).col))
#define DHIT(c0) ((long)(lucid_cuda_conv_wcols_hit_count() - (c0).hit))
#define DSIDE(c0) ((long)(lucid_cuda_conv_wcols_side_count() - (c0).side))

/* One arm: mode (WC_*) and x_stable; forward, the filter gradient beta 0 on
 * branch lane 1 and beta 1 on the parameter-gradient lane, against r. */
static void run_arm(const char *pre, const wc_case *cc, const wc_io *io, const wc_ref *r,
                    lucid_dtype dt, int mode, int stable) {
    char sub[232];
    snprintf(sub, sizeof sub, "%s: mode %d x_stable %d", pre, mode - 1, stable);
    lucid_conv_wcols wc;
    lucid_conv_wcols_init(&wc);
    lucid_tensor *y = dpoison(dt, 4, io->ys), *dw0 = dpoison(LUCID_F32, 4, io->ws);
    lucid_tensor *dw1 = dev(io->hdw1);
    const int side = mode != WC_OFF && cc->small &&
                     (mode == WC_SIDE || (mode == WC_STABLE && stable));
    const int cached = mode != WC_OFF && (!cc->small || side);
    const int fwd_cols = !cc->small || side; /* the forward's im2col or the side build */
    const size_t held0 = lucid_conv_wcols_held_total();
    if (!y || !dw0 || !dw1) {
        TEST_FAIL(NAME("%s: setup", sub), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcols(ctx, mode);
    counts c = counts_now();
    RUN(NAME("%s: forward", sub),
        lucid_nn_conv2d_forward_cols(ctx, io->gx, y, io->gw, NULL, &io->p, NULL, &wc, stable));
    CHECK(NAME("%s: forward im2col launches %d, side builds %d", sub, fwd_cols, side),
          DCOL(c) == fwd_cols && DSIDE(c) == side, "%ld im2col, %ld side", DCOL(c), DSIDE(c));
    CHECK(NAME("%s: cache buffer %s", sub, cached ? "allocated (N*Kr*P*2 bytes)" : "none"),
          cached ? wc.buf && lucid_storage_nbytes(wc.buf) == case_cols_bytes(cc, cc->N) &&
                       lucid_conv_wcols_held_total() == held0 + case_cols_bytes(cc, cc->N)
                 : !wc.buf && lucid_conv_wcols_held_total() == held0,
          "buf %p (%zu bytes, want %zu), total %zu (start %zu)", (void *)wc.buf,
          wc.buf ? lucid_storage_nbytes(wc.buf) : 0, case_cols_bytes(cc, cc->N),
          lucid_conv_wcols_held_total(), held0);
    cmp_bits(NAME("%s: forward = cache off", sub), y, r->y);
    c = counts_now();
    RUN(NAME("%s: filter gradient (branch lane)", sub),
        wgrad_at(ON_BRANCH, 1, io->gx, io, dw0, 0.0, &wc));
    CHECK(NAME("%s: filter gradient %s", sub, cached ? "reads the cached columns" : "builds its columns"),
          DCOL(c) == !cached && DHIT(c) == cached, "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: filter gradient beta 0 = cache off", sub), dw0, r->dw0);
    c = counts_now();
    RUN(NAME("%s: filter gradient beta 1 (parameter-gradient lane)", sub),
        wgrad_at(ON_GRAD, 1, io->gx, io, dw1, 1.0, &wc));
    CHECK(NAME("%s: filter gradient beta 1 %s", sub, cached ? "reads the cached columns" : "builds its columns"),
          DCOL(c) == !cached && DHIT(c) == cached, "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: filter gradient beta 1 = cache off", sub), dw1, r->dw1);
done:
    lucid_cuda_nn_set_wcols(ctx, 0);
    if (lucid_ctx_synchronize(ctx) != LUCID_OK)
        TEST_FAIL(NAME("%s: synchronize", sub), "%s", lucid_ctx_error(ctx));
    lucid_conv_wcols_release(&wc);
    rel(y); rel(dw0); rel(dw1);
}

/* The routes a case is meant to take. */
static void routes_set(const wc_case *cc) {
    lucid_cuda_nn_set_conv_col(ctx, 8);
    lucid_cuda_nn_set_conv_small(ctx, cc->small ? 2 : 1);
}
static void routes_reset(void) {
    lucid_cuda_nn_set_conv_col(ctx, 0);
    lucid_cuda_nn_set_conv_small(ctx, 0);
}

static void test_case(const wc_case *cc, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "wcols %s %s", cc->tag, lucid_dtype_name(dt));
    if (!case_on(cc) || (cc->small && small_wgrad_env())) {
        TEST_SKIP(pre, "the filter gradient is not on the im2col route in this process "
                       "(LUCID_CONV_COL_PAD=0 or LUCID_CONV_SMALL_WGRAD set)");
        return;
    }
    wc_io io;
    wc_ref r;
    memset(&r, 0, sizeof r);
    routes_set(cc);
    if (!io_make(&io, cc, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!ref_make(pre, &r, &io, io.gx, dt)) goto done;
    CHECK(NAME("%s: the reference's filter gradient runs its im2col", pre), r.col_w == 1,
          "%ld im2col launches", r.col_w);
    run_arm(pre, cc, &io, &r, dt, WC_STABLE, 1);
    run_arm(pre, cc, &io, &r, dt, WC_NOSIDE, 1);
    run_arm(pre, cc, &io, &r, dt, WC_OFF, 1);
    if (cc->small) {
        run_arm(pre, cc, &io, &r, dt, WC_STABLE, 0);
        run_arm(pre, cc, &io, &r, dt, WC_SIDE, 0);
    }
done:
    routes_reset();
    ref_free(&r);
    io_free(&io);
}

/* ------------------------------------------------------------ staleness */

static void test_stale(lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "wcols stale %s %s", COLC.tag, lucid_dtype_name(dt));
    wc_io io;
    wc_ref r1, r2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    lucid_conv_wcols wc;
    lucid_conv_wcols_init(&wc);
    lucid_tensor *hx2 = NULL, *gx2 = NULL, *y = NULL, *dwa = NULL, *dwb = NULL;
    routes_set(&COLC);
    if (!io_make(&io, &COLC, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    hx2 = hrand(dt, 4, io.xs, -1, 1);
    gx2 = dev(hx2);
    y = dpoison(dt, 4, io.ys);
    dwa = dpoison(LUCID_F32, 4, io.ws);
    dwb = dpoison(LUCID_F32, 4, io.ws);
    if (!hx2 || !gx2 || !y || !dwa || !dwb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!ref_make(pre, &r1, &io, io.gx, dt) || !ref_make(pre, &r2, &io, gx2, dt)) goto done;
    lucid_cuda_nn_set_wcols(ctx, WC_STABLE);
    counts c;
    /* forward(x1), forward(x2): the record follows the last write */
    RUN(NAME("%s: forward x1", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 0));
    RUN(NAME("%s: forward x2", pre),
        lucid_nn_conv2d_forward_cols(ctx, gx2, y, io.gw, NULL, &io.p, NULL, &wc, 0));
    c = counts_now();
    RUN(NAME("%s: filter gradient x2", pre), wgrad_at(ON_BRANCH, 1, gx2, &io, dwa, 0.0, &wc));
    CHECK(NAME("%s: forward x1, forward x2: the filter gradient of x2 reads x2's columns", pre),
          DCOL(c) == 0 && DHIT(c) == 1, "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: filter gradient x2 = x2's reference", pre), dwa, r2.dw0);
    c = counts_now();
    RUN(NAME("%s: filter gradient x1", pre), wgrad_at(ON_COMPUTE, 1, io.gx, &io, dwb, 0.0, &wc));
    CHECK(NAME("%s: ... and that of x1 builds its own", pre), DCOL(c) == 1 && DHIT(c) == 0,
          "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: filter gradient x1 = x1's reference", pre), dwb, r1.dw0);

    /* forward(x1), x1 written in place: built again from the new values */
    RUN(NAME("%s: forward x1 again", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    RUN(NAME("%s: x1 = x2's values in place", pre), lucid_copy(ctx, io.gx, hx2));
    c = counts_now();
    RUN(NAME("%s: filter gradient of the written x1", pre),
        wgrad_at(ON_GRAD, 1, io.gx, &io, dwa, 0.0, &wc));
    CHECK(NAME("%s: an in-place write between forward and filter gradient: columns built again",
               pre),
          DCOL(c) == 1 && DHIT(c) == 0, "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: filter gradient of the written x1 = x2's reference", pre), dwa, r2.dw0);
    RUN(NAME("%s: x1 back", pre), lucid_copy(ctx, io.gx, io.hx));

    /* forward(x1), its filter gradient on a branch lane left running,
     * forward(x2) on the compute stream (waits for that read), filter
     * gradient of x2 */
    RUN(NAME("%s: war forward x1", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    c = counts_now();
    RUN(NAME("%s: war filter gradient x1 (unjoined lane)", pre),
        wgrad_at(ON_BRANCH, 0, io.gx, &io, dwa, 0.0, &wc));
    RUN(NAME("%s: war forward x2", pre),
        lucid_nn_conv2d_forward_cols(ctx, gx2, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    RUN(NAME("%s: war filter gradient x2", pre), wgrad_at(ON_COMPUTE, 1, gx2, &io, dwb, 0.0, &wc));
    RUN(NAME("%s: war join", pre), lucid_ctx_branch_join(ctx, 1));
    CHECK(NAME("%s: war: both filter gradients read cached columns", pre),
          DCOL(c) == 1 && DHIT(c) == 2, "%ld im2col (the forward's), %ld hits", DCOL(c),
          DHIT(c));
    cmp_bits(NAME("%s: war: filter gradient x1 (read before the overwrite) = x1's reference",
                  pre),
             dwa, r1.dw0);
    cmp_bits(NAME("%s: war: filter gradient x2 = x2's reference", pre), dwb, r2.dw0);
done:
    lucid_cuda_nn_set_wcols(ctx, 0);
    if (lucid_ctx_synchronize(ctx) != LUCID_OK)
        TEST_FAIL(NAME("%s: synchronize", pre), "%s", lucid_ctx_error(ctx));
    routes_reset();
    lucid_conv_wcols_release(&wc);
    rel(hx2); rel(gx2); rel(y); rel(dwa); rel(dwb);
    ref_free(&r1);
    ref_free(&r2);
    io_free(&io);
}

/* ------------------------------------------------------------ memory */

static void test_memory(lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "wcols memory %s %s", COLC.tag, lucid_dtype_name(dt));
    wc_io io;
    wc_ref r;
    memset(&r, 0, sizeof r);
    lucid_conv_wcols wc;
    lucid_conv_wcols_init(&wc);
    lucid_tensor *x1 = NULL, *y1 = NULL, *y = NULL, *dw = NULL;
    routes_set(&COLC);
    if (!io_make(&io, &COLC, dt) || !ref_make(pre, &r, &io, io.gx, dt)) goto done;
    {
        int64_t ys1[4] = {1, io.ys[1], io.ys[2], io.ys[3]};
        y1 = dpoison(dt, 4, ys1);
    }
    y = dpoison(dt, 4, io.ys);
    dw = dpoison(LUCID_F32, 4, io.ws);
    if (!y1 || !y || !dw || lucid_tensor_narrow(ctx, io.gx, 0, 0, 1, &x1) != LUCID_OK) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    const size_t held0 = lucid_conv_wcols_held_total();
    const size_t b1 = case_cols_bytes(&COLC, 1), b2 = case_cols_bytes(&COLC, COLC.N);
    lucid_cuda_nn_set_wcols(ctx, WC_STABLE);
    /* the ceiling at 1 byte: no buffer, the same bits */
    lucid_cuda_nn_set_wcols_cap(ctx, 1);
    RUN(NAME("%s: forward under a 1-byte ceiling", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    counts c = counts_now();
    RUN(NAME("%s: filter gradient under a 1-byte ceiling", pre),
        wgrad_at(ON_BRANCH, 1, io.gx, &io, dw, 0.0, &wc));
    CHECK(NAME("%s: past the ceiling: no buffer, the filter gradient builds its columns", pre),
          !wc.buf && lucid_conv_wcols_held_total() == held0 && DCOL(c) == 1 && DHIT(c) == 0,
          "buf %p, total %zu (start %zu), %ld im2col, %ld hits", (void *)wc.buf,
          lucid_conv_wcols_held_total(), held0, DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: past the ceiling: filter gradient = reference", pre), dw, r.dw0);
    CHECK(NAME("%s: set_wcols_cap returns the previous ceiling", pre),
          lucid_cuda_nn_set_wcols_cap(ctx, 0) == 1 && lucid_cuda_nn_set_wcols_cap(ctx, -5) == -1,
          "unexpected");
    /* batch 1 first, then the batch of 2: a larger buffer, the old one retired */
    RUN(NAME("%s: forward batch 1", pre),
        lucid_nn_conv2d_forward_cols(ctx, x1, y1, io.gw, NULL, &io.p, NULL, &wc, 1));
    lucid_storage *first = wc.buf;
    CHECK(NAME("%s: batch 1: a buffer of %zu bytes", pre, b1),
          first && lucid_storage_nbytes(first) == b1 &&
              lucid_conv_wcols_held_total() == held0 + b1,
          "buf %p, total %zu", (void *)first, lucid_conv_wcols_held_total());
    RUN(NAME("%s: forward batch 2", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    CHECK(NAME("%s: batch 2: a buffer of %zu bytes, the first retired", pre, b2),
          wc.buf && wc.buf != first && lucid_storage_nbytes(wc.buf) == b2 &&
              wc.retired[0] == first && wc.held == b1 + b2 &&
              lucid_conv_wcols_held_total() == held0 + b1 + b2,
          "buf %p retired %p held %zu total %zu", (void *)wc.buf, (void *)wc.retired[0], wc.held,
          lucid_conv_wcols_held_total());
    c = counts_now();
    RUN(NAME("%s: filter gradient batch 2", pre),
        wgrad_at(ON_GRAD, 1, io.gx, &io, dw, 0.0, &wc));
    CHECK(NAME("%s: batch 2: the filter gradient reads the new buffer", pre),
          DCOL(c) == 0 && DHIT(c) == 1, "%ld im2col, %ld hits", DCOL(c), DHIT(c));
    cmp_bits(NAME("%s: batch 2: filter gradient = reference", pre), dw, r.dw0);
    /* a smaller batch again fits the buffer: no new allocation */
    RUN(NAME("%s: forward batch 1 again", pre),
        lucid_nn_conv2d_forward_cols(ctx, x1, y1, io.gw, NULL, &io.p, NULL, &wc, 1));
    CHECK(NAME("%s: batch 1 again: the same buffer", pre),
          lucid_conv_wcols_held_total() == held0 + b1 + b2 && wc.retired[1] == NULL,
          "total %zu", lucid_conv_wcols_held_total());
    lucid_conv_wcols_release(&wc);
    CHECK(NAME("%s: release gives the bytes back", pre), lucid_conv_wcols_held_total() == held0,
          "total %zu (start %zu)", lucid_conv_wcols_held_total(), held0);
done:
    lucid_cuda_nn_set_wcols(ctx, 0);
    lucid_cuda_nn_set_wcols_cap(ctx, 0);
    if (lucid_ctx_synchronize(ctx) != LUCID_OK)
        TEST_FAIL(NAME("%s: synchronize", pre), "%s", lucid_ctx_error(ctx));
    routes_reset();
    lucid_conv_wcols_release(&wc);
    rel(x1); rel(y1); rel(y); rel(dw);
    ref_free(&r);
    io_free(&io);
}

/* ------------------------------------------------------------ the switch */

/* LUCID_WCOLS as lucid_conv_wcols_switch reads it: 0..3, else 1. */
static int env_mode(void) {
    const char *e = getenv("LUCID_WCOLS");
    char *end = NULL;
    long v = e && *e ? strtol(e, &end, 10) : -1;
    return end && *end == '\0' && v >= 0 && v <= 3 ? (int)v : 1;
}

static void test_env(lucid_dtype dt) {
    char pre[200];
    const char *e = getenv("LUCID_WCOLS");
    snprintf(pre, sizeof pre, "wcols switch 0 follows LUCID_WCOLS=\"%s\": %s %s",
             e ? e : "(unset)", COLC.tag, lucid_dtype_name(dt));
    wc_io io;
    lucid_conv_wcols wc;
    lucid_conv_wcols_init(&wc);
    lucid_tensor *y = NULL, *dw = NULL;
    routes_set(&COLC);
    if (!io_make(&io, &COLC, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    y = dpoison(dt, 4, io.ys);
    dw = dpoison(LUCID_F32, 4, io.ws);
    if (!y || !dw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcols(ctx, 0);
    RUN(NAME("%s: forward", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    counts c = counts_now();
    RUN(NAME("%s: filter gradient", pre), wgrad_at(ON_BRANCH, 1, io.gx, &io, dw, 0.0, &wc));
    const int on = env_mode() != 0;
    CHECK(NAME("%s: %s", pre, on ? "a hit" : "no cache"), DHIT(c) == on && DCOL(c) == !on,
          "%ld hits, %ld im2col", DHIT(c), DCOL(c));
done:
    if (lucid_ctx_synchronize(ctx) != LUCID_OK)
        TEST_FAIL(NAME("%s: synchronize", pre), "%s", lucid_ctx_error(ctx));
    routes_reset();
    lucid_conv_wcols_release(&wc);
    rel(y); rel(dw);
    io_free(&io);
}

/* ------------------------------------------------------------ capture */

/* One call recorded alone: a capture begun with `flags`, the forward
 * (fwd != 0, into y) or the filter gradient on branch lane 1 (beta 0, into
 * dw), the capture ended into *g. *d: the counters' moves during the call.
 * Returns 0 after a failure (reported as "<pre>: <what>"). */
static int captured(const char *pre, const char *what, unsigned flags, int fwd, wc_io *io,
                    lucid_tensor *y, lucid_tensor *dw, lucid_conv_wcols *wc, lucid_graph **g,
                    counts *d) {
    lucid_status s = lucid_ctx_capture_begin_ex(ctx, flags);
    counts c = counts_now();
    if (!s)
        s = fwd ? lucid_nn_conv2d_forward_cols(ctx, io->gx, y, io->gw, NULL, &io->p, NULL, wc, 1)
                : wgrad_at(ON_BRANCH, 1, io->gx, io, dw, 0.0, wc);
    d->col = (unsigned long)DCOL(c);
    d->hit = (unsigned long)DHIT(c);
    d->side = (unsigned long)DSIDE(c);
    lucid_status e = lucid_ctx_capture_end(ctx, s ? NULL : g);
    if (s || e) {
        TEST_FAIL(NAME("%s: %s", pre, what), "%s: %s", lucid_status_name(s ? s : e),
                  lucid_ctx_error(ctx));
        return 0;
    }
    return 1;
}

static void test_capture(const wc_case *cc, lucid_dtype dt) {
    char pre[200];
    snprintf(pre, sizeof pre, "wcols capture %s %s", cc->tag, lucid_dtype_name(dt));
    if (!case_on(cc) || (cc->small && small_wgrad_env())) {
        TEST_SKIP(pre, "the filter gradient is not on the im2col route in this process");
        return;
    }
    lucid_ctx *prev = NULL;
    if (!cuda_test_enter_fresh(pre, &prev)) return;
    wc_io io;
    wc_ref r1, r2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    lucid_conv_wcols wc;
    lucid_conv_wcols_init(&wc);
    lucid_graph *gr = NULL, *gr2 = NULL, *gf = NULL, *gb = NULL, *g4 = NULL;
    counts d;
    lucid_tensor *hx2 = NULL, *gx2 = NULL, *y = NULL, *dw = NULL;
    routes_set(cc);
    if (!io_make(&io, cc, dt)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    hx2 = hrand(dt, 4, io.xs, -1, 1);
    gx2 = dev(hx2);
    y = dpoison(dt, 4, io.ys);
    dw = dpoison(LUCID_F32, 4, io.ws);
    if (!hx2 || !gx2 || !y || !dw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!ref_make(pre, &r1, &io, io.gx, dt) || !ref_make(pre, &r2, &io, gx2, dt)) goto done;
    lucid_cuda_nn_set_wcols(ctx, WC_STABLE);
    /* the eager pass: the buffer, the lanes, the scratch */
    RUN(NAME("%s: eager forward", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    RUN(NAME("%s: eager filter gradient", pre), wgrad_at(ON_BRANCH, 1, io.gx, &io, dw, 0.0, &wc));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    counts c = counts_now();
    {
        lucid_status s =
            lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1);
        if (!s) s = wgrad_at(ON_BRANCH, 1, io.gx, &io, dw, 0.0, &wc);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    CHECK(NAME("%s: recorded 1 im2col (%s), the filter gradient reading it", pre,
               cc->small ? "the side build" : "the forward's"),
          DCOL(c) == 1 && DHIT(c) == 1 && DSIDE(c) == cc->small, "%ld im2col, %ld hits, %ld side",
          DCOL(c), DHIT(c), DSIDE(c));
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    RUN(NAME("%s: poison", pre), lucid_fill(ctx, y, NAN));
    RUN(NAME("%s: poison dw", pre), lucid_fill(ctx, dw, NAN));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    cmp_bits(NAME("%s: replay forward = cache off", pre), y, r1.y);
    cmp_bits(NAME("%s: replay filter gradient = cache off", pre), dw, r1.dw0);
    /* new input values behind the recording: the replay's forward writes
     * the columns again */
    RUN(NAME("%s: new input", pre), lucid_copy(ctx, io.gx, hx2));
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, gr));
    cmp_bits(NAME("%s: replay on the new input: forward = its reference", pre), y, r2.y);
    cmp_bits(NAME("%s: replay on the new input: filter gradient = its reference", pre), dw,
             r2.dw0);
    /* columns written eagerly are not trusted inside a capture */
    RUN(NAME("%s: eager forward after the replays", pre),
        lucid_nn_conv2d_forward_cols(ctx, io.gx, y, io.gw, NULL, &io.p, NULL, &wc, 1));
    RUN(NAME("%s: synchronize 2", pre), lucid_ctx_synchronize(ctx));
    if (!captured(pre, "capture 2 (filter gradient)", 0, 0, &io, y, dw, &wc, &gr2, &d)) goto done;
    CHECK(NAME("%s: eager columns not trusted inside a capture: the filter gradient records "
               "its im2col", pre),
          d.col == 1 && d.hit == 0, "%lu im2col, %lu hits", d.col, d.hit);
    RUN(NAME("%s: poison dw 2", pre), lucid_fill(ctx, dw, NAN));
    RUN(NAME("%s: replay capture 2", pre), lucid_graph_launch(ctx, gr2));
    cmp_bits(NAME("%s: capture 2 replay filter gradient = reference", pre), dw, r2.dw0);
    /* LUCID_CAPTURE_CONTINUE (graph.h): the forward in one capture (F), the
     * filter gradient in the next, begun with the flag (B), reads F's
     * columns; the graphs replayed F then B on the stream give the
     * references, also after new input values (the pipelined route's F and
     * B graphs, lua/lucid/step_pipeline.lua) */
    RUN(NAME("%s: synchronize 3", pre), lucid_ctx_synchronize(ctx));
    if (!captured(pre, "capture F (forward)", 0, 1, &io, y, dw, &wc, &gf, &d)) goto done;
    if (!captured(pre, "capture B (filter gradient, continuing)", LUCID_CAPTURE_CONTINUE, 0, &io,
                  y, dw, &wc, &gb, &d))
        goto done;
    CHECK(NAME("%s: a continuing capture reads the previous capture's columns", pre),
          d.col == 0 && d.hit == 1, "%lu im2col, %lu hits", d.col, d.hit);
    RUN(NAME("%s: poison y 3", pre), lucid_fill(ctx, y, NAN));
    RUN(NAME("%s: poison dw 3", pre), lucid_fill(ctx, dw, NAN));
    RUN(NAME("%s: replay F", pre), lucid_graph_launch(ctx, gf));
    RUN(NAME("%s: replay B", pre), lucid_graph_launch(ctx, gb));
    cmp_bits(NAME("%s: F then B: forward = reference", pre), y, r2.y);
    cmp_bits(NAME("%s: F then B: filter gradient = reference", pre), dw, r2.dw0);
    RUN(NAME("%s: the first input again", pre), lucid_copy(ctx, io.gx, io.hx));
    RUN(NAME("%s: poison dw 4", pre), lucid_fill(ctx, dw, NAN));
    RUN(NAME("%s: replay F 2", pre), lucid_graph_launch(ctx, gf));
    RUN(NAME("%s: replay B 2", pre), lucid_graph_launch(ctx, gb));
    cmp_bits(NAME("%s: F then B on the first input: forward = its reference", pre), y, r1.y);
    cmp_bits(NAME("%s: F then B on the first input: filter gradient = its reference", pre), dw,
             r1.dw0);
    /* the flag lasts one capture: the next plain capture trusts nothing */
    if (!captured(pre, "capture 4 (filter gradient)", 0, 0, &io, y, dw, &wc, &g4, &d)) goto done;
    CHECK(NAME("%s: a plain capture after the continuing one builds its columns", pre),
          d.col == 1 && d.hit == 0, "%lu im2col, %lu hits", d.col, d.hit);
done:
    if (gr) lucid_graph_destroy(gr);
    if (gr2) lucid_graph_destroy(gr2);
    if (gf) lucid_graph_destroy(gf);
    if (gb) lucid_graph_destroy(gb);
    if (g4) lucid_graph_destroy(g4);
    lucid_cuda_nn_set_wcols(ctx, 0);
    routes_reset();
    if (lucid_ctx_synchronize(ctx) != LUCID_OK)
        TEST_FAIL(NAME("%s: synchronize at the end", pre), "%s", lucid_ctx_error(ctx));
    lucid_conv_wcols_release(&wc);
    rel(hx2); rel(gx2); rel(y); rel(dw);
    ref_free(&r1);
    ref_free(&r2);
    io_free(&io);
    cuda_test_leave_fresh(prev);
}

/* ------------------------------------------------------------ main */

int main(void) {
    test_record();
    if (!WC_LINKED()) {
        TEST_SKIP("wcols cuda (forward, filter gradient, staleness, memory, capture)",
                  "CPU-only build (no cuda/nn_conv_wcols.o)");
        return test_exit();
    }
    CHECK("wcols hit and side counters start at 0",
          lucid_cuda_conv_wcols_hit_count() == 0 && lucid_cuda_conv_wcols_side_count() == 0,
          "%lu / %lu", lucid_cuda_conv_wcols_hit_count(), lucid_cuda_conv_wcols_side_count());
    if (!lucid_cuda_available()) {
        TEST_SKIP("wcols cuda (forward, filter gradient, staleness, memory, capture; bf16/f16)",
                  "no CUDA device");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_conv_wcols_cuda")) return test_exit();
    CHECK("wcols per-context switch starts at 0 and returns the previous value",
          lucid_cuda_nn_set_wcols(ctx, 2) == 0 && lucid_cuda_nn_set_wcols(ctx, 4) == 2 &&
              lucid_cuda_nn_set_wcols(ctx, 9) == 4 && lucid_cuda_nn_set_wcols(ctx, 0) == 0,
          "unexpected previous values");
    for (size_t i = 0; i < NELEM(CASES); i++) test_case(&CASES[i], LUCID_BF16);
    test_case(&CASES[4], LUCID_F16);  /* 64>64 80x80 */
    test_case(&CASES[11], LUCID_F16); /* 3>16 s2 32x32 small */
    test_stale(LUCID_BF16);
    test_stale(LUCID_F16);
    test_memory(LUCID_BF16);
    test_env(LUCID_BF16);
    test_capture(&COLC, LUCID_BF16);
    test_capture(&SIDEC, LUCID_BF16);
    test_capture(&CASES[0], LUCID_BF16); /* layer 0 at 640, batch 4 */
    return cuda_test_finish();
}
