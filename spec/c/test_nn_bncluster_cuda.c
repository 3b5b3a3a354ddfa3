/*
 * test_nn_bncluster_cuda.c — the cluster route of the GPU BatchNorm2d
 * (plain and fused with SiLU; cuda/nn_norm.cuh, nn_norm_fwd.cu
 * bn_stats_apply_cl, nn_norm_bwd.cu bn_grad_dx_cl): channels of several
 * parts run each training direction in ONE launch, a cluster of blocks per
 * channel exchanging the part partials through distributed shared memory.
 * The route must give the two-launch route's bits.
 *
 * Each case runs the same calls on both routes in one context, switched
 * per context with lucid_cuda_nn_set_bn_cluster (0 follow
 * LUCID_BN_CLUSTER, 1 off = the two-launch route, 2..16 at most that many
 * blocks per cluster), and compares every output bitwise:
 *   two training forwards (x1 then x2): y, save_mean, save_invstd, the
 *   running stats after two updates, num_batches_tracked;
 *   the training backward with every output (beta 0, destinations
 *   NaN-prefilled), dx only, dweight only, dbias only, every output with
 *   beta_input 0.5 / beta_params 0.25 onto random values;
 *   an eval forward and backward (not affected by the switch).
 * The reference route's outputs are checked free of NaN (a NaN pair would
 * compare equal bitwise).  Kernels queued per call
 * (lucid_cuda_bn_launch_count) and cluster launches
 * (lucid_cuda_bn_cluster_count): on the cluster route, 1 per training
 * direction with dx, both cluster launches, when the shape is covered
 * (2 <= parts <= 8 * cluster size); 2 and none otherwise; the two-launch
 * route 2 per direction (1 for one-part channels: the one-pass kernels).
 * Shapes (parts per channel, cuda/nn_norm.cuh's partition): 2x3x80x80 (2
 * whole planes), 4x8x80x80 (4, YOLO 64x80x80's), 4x4x160x160 (16 chunks,
 * YOLO 32x160x160's), 4x2x320x320 (52 chunks, YOLO 16x320x320's; 52 is no
 * multiple of 16 or 8), 5x3x96x96 (10, odd N), 3x4x91x91 (6, odd S: scalar
 * path), 2x3x80x80 without affine parameters, activations at element
 * offset 1 (scalar path; y/dx only: statistics vectorised, apply scalar),
 * cluster caps 16 (default), 8, 7 (52 parts: 8 a block, the most), 3 (4
 * parts over 3 blocks), 2; not covered: 300x2x64x72 (300 parts: more than
 * 8 a block) and 4x8x40x40 (one part: the one-pass kernels).
 * f32, bf16, f16; plain and fused.
 * Capture: the cluster route recorded (fresh context: its arena warmed on
 * the two-launch route only, so each cluster kernel's first use may be
 * inside the capture), one training forward + backward, replayed 3 times:
 * every replay's y, save_mean, save_invstd, dx, dweight, dbias equal the
 * eager cluster call's bitwise, the running stats and num_batches_tracked
 * after 3 replays equal those after 3 eager calls, and the capture queued
 * 2 kernels (both cluster launches).
 * Without a CUDA device every group prints "skip ...: no CUDA device" and
 * the program exits 0.
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "train/graph.h"

#include <math.h>

#define MOM 0.03
#define EPS 1e-3

#if defined(__GNUC__)
#define WEAK __attribute__((weak))
#else
#define WEAK
#endif
WEAK unsigned long lucid_cuda_bn_launch_count(void);
WEAK unsigned long lucid_cuda_bn_cluster_count(void);
WEAK int lucid_cuda_nn_set_bn_cluster(lucid_ctx *ctx, int mode);

static unsigned long launches(void) {
    return lucid_cuda_bn_launch_count ? lucid_cuda_bn_launch_count() : 0;
}
static unsigned long clusters(void) {
    return lucid_cuda_bn_cluster_count ? lucid_cuda_bn_cluster_count() : 0;
}

/* ------------------------------------------------------------ tensors */

static lucid_tensor *pool[1024];
static int npool;

static lucid_tensor *keep(lucid_tensor *t) {
    if (!t) return NULL;
    if (npool == (int)(sizeof pool / sizeof pool[0])) {
        lucid_tensor_release(t);
        return NULL;
    }
    pool[npool++] = t;
    return t;
}

static void pool_free(void) {
    for (int i = 0; i < npool; i++) lucid_tensor_release(pool[i]);
    npool = 0;
}

static lucid_tensor *phrand(lucid_dtype dt, int ndim, const int64_t *shape, double lo,
                            double hi) {
    return keep(hrand(dt, ndim, shape, lo, hi));
}
static lucid_tensor *phzeros(lucid_dtype dt, int ndim, const int64_t *shape) {
    return keep(hzeros(dt, ndim, shape));
}
static lucid_tensor *pdev(const lucid_tensor *t) { return keep(dev(t)); }
static lucid_tensor *phost(const lucid_tensor *t) { return keep(host(t)); }
static lucid_tensor *pdpoison(lucid_dtype dt, int ndim, const int64_t *shape) {
    return keep(dpoison(dt, ndim, shape));
}

/* Device tensor of `shape` at element offset off of a fresh storage, NaN. */
static lucid_tensor *pdview(lucid_dtype dt, int ndim, const int64_t *shape, int64_t off) {
    int64_t n = 1, strides[LUCID_MAX_DIMS];
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = n;
        n *= shape[i];
    }
    lucid_storage *s = NULL;
    lucid_tensor *t = NULL;
    if (lucid_storage_create(ctx, GPU, (size_t)(n + off) * lucid_dtype_size(dt), 0, &s) !=
        LUCID_OK)
        return NULL;
    lucid_status st = lucid_tensor_from_storage(ctx, s, dt, ndim, shape, strides, off, &t);
    lucid_storage_release(s);
    if (st != LUCID_OK) return NULL;
    if (lucid_fill(ctx, t, NAN) != LUCID_OK) {
        lucid_tensor_release(t);
        return NULL;
    }
    return keep(t);
}

/* Device view at element offset off holding the host tensor h. */
static lucid_tensor *pdview_of(const lucid_tensor *h, int64_t off) {
    if (!h) return NULL;
    lucid_tensor *t = pdview(h->dtype, h->ndim, h->shape, off);
    if (t && lucid_copy(ctx, t, h) != LUCID_OK) return NULL;
    return t;
}

/* g (device) free of NaN. */
static void no_nan(const char *name, const lucid_tensor *g) {
    lucid_tensor *h = host(g);
    if (!h) {
        TEST_FAIL(name, "copy back: %s", lucid_ctx_error(ctx));
        return;
    }
    int64_t n = lucid_tensor_numel(h), i = 0;
    while (i < n && !isnan(test_hget(h, i))) i++;
    if (i < n) TEST_FAIL(name, "NaN at %lld", (long long)i);
    else TEST_OK(name);
    lucid_tensor_release(h);
}

/* ------------------------------------------------------------ calls */

static lucid_status bn_fwd(int silu, const lucid_tensor *x, lucid_tensor *y,
                           const lucid_tensor *w, const lucid_tensor *b, lucid_tensor *rm,
                           lucid_tensor *rv, lucid_tensor *nb, lucid_tensor *sm,
                           lucid_tensor *si, int training) {
    return silu ? lucid_nn_batchnorm2d_silu_forward(ctx, x, y, w, b, rm, rv, nb, sm, si,
                                                    training, MOM, EPS)
                : lucid_nn_batchnorm2d_forward(ctx, x, y, w, b, rm, rv, nb, sm, si, training,
                                               MOM, EPS);
}

static lucid_status bn_bwd(int silu, const lucid_tensor *x, const lucid_tensor *dy,
                           lucid_tensor *dx, const lucid_tensor *w, const lucid_tensor *b,
                           const lucid_tensor *sm, const lucid_tensor *si, lucid_tensor *dw,
                           lucid_tensor *db, int training, double bi, double bp) {
    return silu ? lucid_nn_batchnorm2d_silu_backward(ctx, x, dy, dx, w, b, sm, si, dw, db,
                                                     training, bi, bp)
                : lucid_nn_batchnorm2d_backward(ctx, x, dy, dx, w, sm, si, dw, db, training,
                                                bi, bp);
}

enum {
    OP_Y, OP_SM, OP_SI, OP_RM, OP_RV, OP_NB, OP_DX, OP_DW, OP_DB, OP_ODX, OP_ODW, OP_ODB,
    OP_BDX, OP_BDW, OP_BDB, OP_EY, OP_EDX, OP_EDW, OP_EDB, OP_N
};
static const char *const OP_NAMES[OP_N] = {
    "train y", "save_mean", "save_invstd", "running_mean (2 updates)",
    "running_var (2 updates)", "num_batches_tracked", "train dx (beta 0)",
    "train dweight (beta 0)", "train dbias (beta 0)", "train dx only", "train dweight only",
    "train dbias only", "train dx (beta 0.5)", "train dweight (beta 0.25)",
    "train dbias (beta 0.25)", "eval y", "eval dx", "eval dweight", "eval dbias"};
/* outputs that are NaN-prefilled and must be written (beta 0) */
static const int OP_FILLED[OP_N] = {1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};

enum { L_FWD, L_BWD, L_BWD_DX, L_BWD_BETA, L_N };
static const char *const L_NAMES[L_N] = {"train forward", "train backward",
                                         "train backward dx only",
                                         "train backward with beta"};

typedef struct bn_in {
    lucid_dtype dt;
    int silu, affine;
    int64_t xs[4], cs[1], in_off, out_off;
    lucid_tensor *hx1, *hx2, *hdy, *hw, *hb, *hrm, *hrv, *hnb, *hbdx, *hbdw, *hbdb;
} bn_in;

/* The calls of the header on the current route: o[OP_*] (NULL where not
 * asked), nl[L_*] kernels queued, ncl[L_*] cluster launches. */
static lucid_status route_run(const bn_in *in, lucid_tensor **o, unsigned long *nl,
                              unsigned long *ncl, const char **what) {
    const lucid_dtype dt = in->dt, F = LUCID_F32;
    const int64_t *xs = in->xs, *cs = in->cs, oo = in->out_off;
    const int silu = in->silu, af = in->affine;
    lucid_status s = LUCID_OK;
    unsigned long n0, c0;
    memset(o, 0, sizeof(lucid_tensor *) * OP_N);
    memset(nl, 0, sizeof(unsigned long) * L_N);
    memset(ncl, 0, sizeof(unsigned long) * L_N);
    *what = "setup";
    lucid_tensor *gw = af ? pdev(in->hw) : NULL, *gb = af ? pdev(in->hb) : NULL;
    lucid_tensor *gx1 = pdview_of(in->hx1, in->in_off), *gx2 = pdview_of(in->hx2, in->in_off);
    lucid_tensor *gdy = pdview_of(in->hdy, in->in_off);
    lucid_tensor *esm = pdpoison(F, 1, cs), *esi = pdpoison(F, 1, cs);
    o[OP_Y] = pdview(dt, 4, xs, oo);
    o[OP_SM] = pdpoison(F, 1, cs);
    o[OP_SI] = pdpoison(F, 1, cs);
    o[OP_RM] = pdev(in->hrm);
    o[OP_RV] = pdev(in->hrv);
    o[OP_NB] = pdev(in->hnb);
    o[OP_DX] = pdview(dt, 4, xs, oo);
    o[OP_ODX] = pdview(dt, 4, xs, oo);
    o[OP_BDX] = pdview_of(in->hbdx, oo);
    o[OP_EY] = pdview(dt, 4, xs, oo);
    o[OP_EDX] = pdview(dt, 4, xs, oo);
    if (af) {
        o[OP_DW] = pdpoison(F, 1, cs);
        o[OP_DB] = pdpoison(F, 1, cs);
        o[OP_ODW] = pdpoison(F, 1, cs);
        o[OP_ODB] = pdpoison(F, 1, cs);
        o[OP_BDW] = pdev(in->hbdw);
        o[OP_BDB] = pdev(in->hbdb);
        o[OP_EDW] = pdpoison(F, 1, cs);
        o[OP_EDB] = pdpoison(F, 1, cs);
    }
    int ok = gx1 && gx2 && gdy && esm && esi && (!af || (gw && gb));
    for (int k = 0; k < OP_N; k++)
        if (!o[k] && (af || (k != OP_DW && k != OP_DB && k != OP_ODW && k != OP_ODB &&
                             k != OP_BDW && k != OP_BDB && k != OP_EDW && k != OP_EDB)))
            ok = 0;
    if (!ok) return LUCID_ERR_OOM;
#define STEP(name, slot, expr)                                                \
    do {                                                                      \
        *what = name;                                                         \
        n0 = launches();                                                      \
        c0 = clusters();                                                      \
        if ((s = (expr)) != LUCID_OK) return s;                               \
        if ((slot) >= 0) {                                                    \
            nl[(slot)] = launches() - n0;                                     \
            ncl[(slot)] = clusters() - c0;                                    \
        }                                                                     \
    } while (0)
    STEP("train forward 1", -1,
         bn_fwd(silu, gx1, o[OP_Y], gw, gb, o[OP_RM], o[OP_RV], o[OP_NB], o[OP_SM], o[OP_SI],
                1));
    STEP("train forward 2", L_FWD,
         bn_fwd(silu, gx2, o[OP_Y], gw, gb, o[OP_RM], o[OP_RV], o[OP_NB], o[OP_SM], o[OP_SI],
                1));
    STEP("train backward", L_BWD,
         bn_bwd(silu, gx2, gdy, o[OP_DX], gw, gb, o[OP_SM], o[OP_SI], o[OP_DW], o[OP_DB], 1,
                0.0, 0.0));
    STEP("train backward dx only", L_BWD_DX,
         bn_bwd(silu, gx2, gdy, o[OP_ODX], gw, gb, o[OP_SM], o[OP_SI], NULL, NULL, 1, 0.0,
                0.0));
    if (af) {
        STEP("train backward dweight only", -1,
             bn_bwd(silu, gx2, gdy, NULL, gw, gb, o[OP_SM], o[OP_SI], o[OP_ODW], NULL, 1, 0.0,
                    0.0));
        STEP("train backward dbias only", -1,
             bn_bwd(silu, gx2, gdy, NULL, gw, gb, o[OP_SM], o[OP_SI], NULL, o[OP_ODB], 1, 0.0,
                    0.0));
    }
    STEP("train backward with beta", L_BWD_BETA,
         bn_bwd(silu, gx2, gdy, o[OP_BDX], gw, gb, o[OP_SM], o[OP_SI], o[OP_BDW], o[OP_BDB], 1,
                0.5, 0.25));
    STEP("eval forward", -1,
         bn_fwd(silu, gx2, o[OP_EY], gw, gb, o[OP_RM], o[OP_RV], NULL, esm, esi, 0));
    STEP("eval backward", -1,
         bn_bwd(silu, gx2, gdy, o[OP_EDX], gw, gb, esm, esi, o[OP_EDW], o[OP_EDB], 0, 0.0,
                0.0));
#undef STEP
    return lucid_ctx_synchronize(ctx);
}

/* parts per channel of cuda/nn_norm.cuh's partition (bn_geom_of) */
static int64_t parts_of(int64_t N, int64_t S) {
    const int64_t PART = 8192;
    if (S >= PART) {
        int64_t p0 = (S + PART - 1) / PART, ch = (S + p0 - 1) / p0;
        ch = (ch + 7) / 8 * 8;
        return N * ((S + ch - 1) / ch);
    }
    int64_t pp = PART / S;
    if (pp > N) pp = N;
    return (N + pp - 1) / pp;
}

/* cluster size the route takes for `parts` under the cap maxcs, 0: not
 * covered (nn_norm.cuh bn_cluster_size) */
static int64_t cluster_of(int maxcs, int64_t parts) {
    if (maxcs < 2 || parts < 2) return 0;
    int64_t cs = parts < maxcs ? parts : maxcs;
    return (parts + cs - 1) / cs > 8 ? 0 : cs;
}

static void test_case(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H, int64_t W,
                      int affine, int maxcs, int64_t in_off, int64_t out_off) {
    char pre[200];
    const int64_t parts = parts_of(N, H * W), cl = cluster_of(maxcs, parts);
    snprintf(pre, sizeof pre, "bn cluster%s %lldx%lldx%lldx%lld%s%s %s, %lld parts, cap %d%s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             affine ? "" : " no-affine",
             in_off ? " all unaligned" : out_off ? " y/dx unaligned" : "", lucid_dtype_name(dt),
             (long long)parts, maxcs, cl ? "" : " (not covered)");
    bn_in in;
    memset(&in, 0, sizeof in);
    in.dt = dt;
    in.silu = silu;
    in.affine = affine;
    in.xs[0] = N, in.xs[1] = C, in.xs[2] = H, in.xs[3] = W;
    in.cs[0] = C;
    in.in_off = in_off;
    in.out_off = out_off;
    int64_t one[1] = {1};
    const lucid_dtype F = LUCID_F32;
    in.hx1 = phrand(dt, 4, in.xs, -2, 3);
    in.hx2 = phrand(dt, 4, in.xs, -1.5, 2.5);
    in.hdy = phrand(dt, 4, in.xs, -1, 1);
    in.hw = phrand(F, 1, in.cs, 0.5, 1.5);
    in.hb = phrand(F, 1, in.cs, -0.5, 0.5);
    in.hrm = phrand(F, 1, in.cs, -0.2, 0.2);
    in.hrv = phrand(F, 1, in.cs, 0.5, 2);
    in.hnb = phzeros(LUCID_I64, 1, one);
    in.hbdx = phrand(dt, 4, in.xs, -1, 1);
    in.hbdw = phrand(F, 1, in.cs, -1, 1);
    in.hbdb = phrand(F, 1, in.cs, -1, 1);
    lucid_tensor *o1[OP_N], *o0[OP_N];
    unsigned long nl1[L_N], nl0[L_N], nc1[L_N], nc0[L_N];
    const char *what = "";
    lucid_status s;
    if (!in.hx1 || !in.hx2 || !in.hdy || !in.hw || !in.hb || !in.hrm || !in.hrv || !in.hnb ||
        !in.hbdx || !in.hbdw || !in.hbdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_bn_cluster(ctx, maxcs);
    s = route_run(&in, o1, nl1, nc1, &what);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: cluster route: %s", pre, what), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_bn_cluster(ctx, 1);
    s = route_run(&in, o0, nl0, nc0, &what);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: two-launch route: %s", pre, what), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        goto done;
    }
    for (int k = 0; k < OP_N; k++) {
        if (!o0[k]) continue;
        if (OP_FILLED[k]) no_nan(NAME("%s: two-launch %s written (no NaN)", pre, OP_NAMES[k]),
                                 o0[k]);
        cmp_bits(NAME("%s: %s = two launches (bitwise)", pre, OP_NAMES[k]), o1[k],
                 phost(o0[k]));
    }
    for (int l = 0; l < L_N; l++) {
        /* one part: the one-pass kernels on both routes */
        unsigned long want0 = parts == 1 ? 1 : 2;
        unsigned long want = cl ? 1 : want0, wantc = cl ? 1 : 0;
        CHECK(NAME("%s: %s: %lu kernel(s), %lu cluster launch(es); switched off %lu, none", pre,
                   L_NAMES[l], want, wantc, want0),
              nl1[l] == want && nc1[l] == wantc && nl0[l] == want0 && nc0[l] == 0,
              "cluster route %lu kernels (%lu cluster), two-launch route %lu (%lu)%s", nl1[l],
              nc1[l], nl0[l], nc0[l],
              cl && nc1[l] == 0 ? " (cluster not schedulable on this device?)" : "");
    }
done:
    lucid_cuda_nn_set_bn_cluster(ctx, 0);
    pool_free();
}

/* Capture of the cluster route, replayed 3 times (see the header). */
static void test_capture(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H, int64_t W,
                         int maxcs) {
    char pre[160];
    snprintf(pre, sizeof pre, "bn cluster capture%s %lldx%lldx%lldx%lld %s, cap %d",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             lucid_dtype_name(dt), maxcs);
    lucid_ctx *prev = NULL;
    if (!cuda_test_enter_fresh(pre, &prev)) return;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const lucid_dtype F = LUCID_F32;
    lucid_graph *g = NULL;
    unsigned long nrec = 0, ncrec = 0;
    lucid_tensor *hw = phrand(F, 1, cs, 0.5, 1.5), *hb = phrand(F, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(F, 1, cs, -0.2, 0.2), *hrv = phrand(F, 1, cs, 0.5, 2);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *gx = pdev(hx), *gdy = pdev(hdy);
    /* [0]: eager cluster route, [1]: recorded; [2]: warm-up (two launches) */
    lucid_tensor *rm[3], *rv[3], *nb[3], *sm[3], *si[3], *y[3], *dx[3], *dw[3], *db[3];
    int okk = gw && gb && gx && gdy;
    for (int k = 0; k < 3; k++) {
        rm[k] = pdev(hrm), rv[k] = pdev(hrv), nb[k] = pdev(hnb);
        sm[k] = pdpoison(F, 1, cs), si[k] = pdpoison(F, 1, cs);
        y[k] = pdpoison(dt, 4, xs), dx[k] = pdpoison(dt, 4, xs);
        dw[k] = pdpoison(F, 1, cs), db[k] = pdpoison(F, 1, cs);
        okk = okk && rm[k] && rv[k] && nb[k] && sm[k] && si[k] && y[k] && dx[k] && dw[k] &&
              db[k];
    }
    if (!okk) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* warm the fresh context's arena and counters on the two-launch route */
    lucid_cuda_nn_set_bn_cluster(ctx, 1);
    RUN(NAME("%s: warm-up forward", pre),
        bn_fwd(silu, gx, y[2], gw, gb, rm[2], rv[2], nb[2], sm[2], si[2], 1));
    RUN(NAME("%s: warm-up backward", pre),
        bn_bwd(silu, gx, gdy, dx[2], gw, gb, sm[2], si[2], dw[2], db[2], 1, 0.0, 0.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    lucid_cuda_nn_set_bn_cluster(ctx, maxcs);
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        unsigned long n0 = launches(), c0 = clusters();
        lucid_status s1 = bn_fwd(silu, gx, y[1], gw, gb, rm[1], rv[1], nb[1], sm[1], si[1], 1);
        lucid_status s2 =
            s1 ? s1 : bn_bwd(silu, gx, gdy, dx[1], gw, gb, sm[1], si[1], dw[1], db[1], 1, 0.0,
                             0.0);
        nrec = launches() - n0;
        ncrec = clusters() - c0;
        if (s2 != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s2),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    CHECK(NAME("%s: 2 kernels recorded, both cluster launches", pre), nrec == 2 && ncrec == 2,
          "%lu kernels, %lu cluster launches", nrec, ncrec);
    for (int r = 0; r < 3; r++) {
        /* the eager cluster call r+1 */
        RUN(NAME("%s: eager forward %d", pre, r + 1),
            bn_fwd(silu, gx, y[0], gw, gb, rm[0], rv[0], nb[0], sm[0], si[0], 1));
        RUN(NAME("%s: eager backward %d", pre, r + 1),
            bn_bwd(silu, gx, gdy, dx[0], gw, gb, sm[0], si[0], dw[0], db[0], 1, 0.0, 0.0));
        RUN(NAME("%s: replay %d", pre, r + 1), lucid_graph_launch(ctx, g));
        RUN(NAME("%s: synchronize %d", pre, r + 1), lucid_ctx_synchronize(ctx));
        if (r == 0) {
            no_nan(NAME("%s: eager y written", pre), y[0]);
            no_nan(NAME("%s: eager dx written", pre), dx[0]);
            cmp_bits(NAME("%s: eager cluster y = two launches (warm-up)", pre), y[0],
                     phost(y[2]));
            cmp_bits(NAME("%s: eager cluster dx = two launches (warm-up)", pre), dx[0],
                     phost(dx[2]));
            cmp_bits(NAME("%s: eager cluster dweight = two launches (warm-up)", pre), dw[0],
                     phost(dw[2]));
            cmp_bits(NAME("%s: eager cluster running_var = two launches (warm-up)", pre),
                     rv[0], phost(rv[2]));
        }
        cmp_bits(NAME("%s: replay %d y = eager", pre, r + 1), y[1], phost(y[0]));
        cmp_bits(NAME("%s: replay %d save_mean = eager", pre, r + 1), sm[1], phost(sm[0]));
        cmp_bits(NAME("%s: replay %d save_invstd = eager", pre, r + 1), si[1], phost(si[0]));
        cmp_bits(NAME("%s: replay %d dx = eager", pre, r + 1), dx[1], phost(dx[0]));
        cmp_bits(NAME("%s: replay %d dweight = eager", pre, r + 1), dw[1], phost(dw[0]));
        cmp_bits(NAME("%s: replay %d dbias = eager", pre, r + 1), db[1], phost(db[0]));
        cmp_bits(NAME("%s: replay %d running_mean = eager (%d updates)", pre, r + 1, r + 1),
                 rm[1], phost(rm[0]));
        cmp_bits(NAME("%s: replay %d running_var = eager (%d updates)", pre, r + 1, r + 1),
                 rv[1], phost(rv[0]));
        cmp_bits(NAME("%s: replay %d num_batches_tracked = eager", pre, r + 1), nb[1],
                 phost(nb[0]));
    }
done:
    if (g) lucid_graph_destroy(g);
    pool_free();
    if (lucid_cuda_nn_state_destroy) lucid_cuda_nn_state_destroy(ctx);
    cuda_test_leave_fresh(prev);
}

/* ============================================================ main */

static const char *GROUPS[] = {"cuda bn cluster route = two launches",
                               "cuda bn cluster route capture"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!lucid_cuda_nn_set_bn_cluster || !lucid_cuda_bn_cluster_count ||
        !lucid_cuda_bn_launch_count) {
        TEST_FAIL("cuda bn cluster hooks linked",
                  "lucid_cuda_nn_set_bn_cluster / lucid_cuda_bn_cluster_count / "
                  "lucid_cuda_bn_launch_count missing (cuda/nn_table.cu, nn_norm_fwd.cu)");
        return test_exit();
    }
    TEST_OK("cuda bn cluster hooks linked");
    if (!cuda_test_ctx_create("test_nn_bncluster_cuda")) return test_exit();

    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    /* first: the capture, so the cluster kernels' first use (occupancy
     * query, non-portable size attribute) happens while capturing */
    test_capture(LUCID_F16, 1, 4, 2, 320, 320, 16);
    test_capture(LUCID_BF16, 0, 4, 4, 160, 160, 16);
    for (int d = 0; d < 3; d++) {
        lucid_dtype dt = DTS[d];
        for (int silu = 0; silu < 2; silu++) {
            test_case(dt, silu, 2, 3, 80, 80, 1, 16, 0, 0);   /* 2 parts */
            test_case(dt, silu, 4, 8, 80, 80, 1, 16, 0, 0);   /* 4 */
            test_case(dt, silu, 4, 4, 160, 160, 1, 16, 0, 0); /* 16 */
            test_case(dt, silu, 4, 2, 320, 320, 1, 16, 0, 0); /* 52 over 16 */
            test_case(dt, silu, 4, 2, 320, 320, 1, 8, 0, 0);  /* 52 over 8 */
            test_case(dt, silu, 4, 2, 320, 320, 1, 7, 0, 0);  /* 52 over 7: 8 a block */
            test_case(dt, silu, 4, 8, 80, 80, 1, 3, 0, 0);    /* 4 over 3 */
            test_case(dt, silu, 4, 4, 160, 160, 1, 2, 0, 0);  /* 16 over 2 */
            test_case(dt, silu, 5, 3, 96, 96, 1, 16, 0, 0);   /* 10, odd N */
            test_case(dt, silu, 3, 4, 91, 91, 1, 16, 0, 0);   /* 6, odd S: scalar */
            test_case(dt, silu, 2, 3, 80, 80, 0, 16, 0, 0);   /* no affine */
            test_case(dt, silu, 4, 3, 96, 96, 1, 16, 0, 1);   /* y/dx unaligned */
            test_case(dt, silu, 4, 3, 96, 96, 1, 16, 1, 1);   /* all unaligned */
            test_case(dt, silu, 300, 2, 64, 72, 1, 16, 0, 0); /* 300: not covered */
            test_case(dt, silu, 4, 8, 40, 40, 1, 16, 0, 0);   /* 1: one pass */
        }
        test_capture(dt, dt == LUCID_F32, 4, 8, 80, 80, 16);
        test_capture(dt, dt != LUCID_F32, 4, 2, 320, 320, 8);
    }
    return cuda_test_finish();
}
