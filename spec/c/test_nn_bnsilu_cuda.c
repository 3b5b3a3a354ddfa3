/*
 * test_nn_bnsilu_cuda.c — the fused BatchNorm2d + SiLU on the GPU
 * (cuda/nn_norm_fwd.cu and nn_norm_bwd.cu, lucid_nn_batchnorm2d_silu_* and
 * the module pair) against the CPU reference (engine/nn/batchnorm.c) and
 * against the separate GPU calls (batchnorm2d then silu; silu then
 * batchnorm2d backward).
 *
 * Inputs are drawn with the engine's Philox generator (the seed is printed;
 * LUCID_TEST_SEED=<n> replays it), rounded once to the activation dtype, and
 * the same values go to both sides.  GPU outputs are poisoned with NaN first
 * (forward outputs, beta-0 backward outputs); beta-1 destinations start from
 * the same random values on both sides.  NaN never passes.
 *
 * Tolerances (those of spec/c/test_nn_cuda.c for BatchNorm2d, which has a
 * reduction inside):
 *   GPU vs CPU, activations   f32: relative Frobenius <= 1e-6 (forward),
 *                             1e-5 (dx); bf16/f16: <= 1 ulp per element or
 *                             |diff| <= 1e-5 * max|ref|
 *   GPU vs CPU, f32 side      save_mean, save_invstd, running stats: relative
 *   outputs                   Frobenius 1e-6 (f32 input) / 1e-5 (bf16/f16);
 *                             dweight, dbias 1e-5; num_batches_tracked exact
 *   fused vs separate GPU     statistics, running stats, num_batches_tracked:
 *                             bitwise (the same kernels compute them);
 *                             f32 y: relative Frobenius 1e-6, f32 dx/dw/db
 *                             1e-5; bf16/f16 (the separate route rounds z and
 *                             dL/dz to the activation dtype): max|diff| <=
 *                             4u * max|ref| for y, 6u for dx, 10u for
 *                             dweight/dbias (u = 2^-8 bf16, 2^-11 f16; the
 *                             CPU's bf16/f16 routes, 40 draws of these
 *                             shapes, reach 2.0u, 2.0u and 4.5u)
 *   determinism               every fused call run twice is bitwise identical
 *   nullable outputs          dx only / dweight only / dbias only equal the
 *                             full call bitwise
 *   graph capture             forward + backward captured after one eager
 *                             warm-up and replayed equals the eager call
 *                             bitwise (outputs, statistics, running stats,
 *                             num_batches_tracked, gradients); replayed a
 *                             second time equals a second eager call (the
 *                             BN fold counters are back at zero after a
 *                             replay: running stats of two updates,
 *                             num_batches_tracked 2)
 *   capture before counters   a fresh context whose warm-up only ran BN on
 *                             more channels than the fold counters cover:
 *                             the capture records the fallback route
 *                             (separate final kernels when a channel has
 *                             more than one part), and its replay equals
 *                             the eager counter route bitwise; shapes with
 *                             1, 8, 52 and 300 parts per channel
 *   unaligned activations     x/dy and y/dx at an element offset of 1 of
 *                             their storage (the scalar path of a shape
 *                             the vector path would take): against the
 *                             CPU, and deterministic
 * Shapes (cuda/nn_norm.cuh's partition: a plane of S >= 8192 elements is cut
 * into chunks, smaller planes are grouped, floor(8192/S) to a part; the
 * vector path needs S a multiple of 8 (bf16/f16) or 4 (f32)): one part per
 * channel (4x16x32x32, 4x64x40x40, tiny planes 8x5x1x1, no affine
 * parameters 3x7x5x3, 3x5x6x10 with S = 60: vector path in f32 only);
 * several parts folded by warp 0 (2x8x100x90: 2 chunks a plane; 300x3x8x8:
 * 128 planes a part, the last part shorter; 3x4x91x91: odd S, scalar, 2
 * chunks; 5x3x96x96: odd N, vector, 2 chunks; 2x3x80x80: one plane a part);
 * more than 32 parts, folded by the whole block (5x2x160x330: 35 parts of
 * 7 chunks a plane) and more than the 256 threads that fold them
 * (300x2x64x72); C = 70001 (grid.y strides over channels: counter route)
 * and C = 131100 (more channels than the fold counters: fallback route);
 * f32, bf16, f16; train and eval.
 * One pass (LUCID_BN_ONEPASS, cuda/nn_norm.cuh): the cases above run the
 * default route, so their one-part shapes take the one-pass kernels.  Then,
 * for plain BatchNorm2d and the fused BatchNorm2d + SiLU, f32/bf16/f16:
 *   one pass = two launches   every output of two training forwards, the
 *                             training backward (all outputs, dx only,
 *                             dweight only, dbias only, beta_input 0.5 /
 *                             beta_params 0.25 and both betas 1 onto
 *                             random values) and an
 *                             eval forward + backward, on the one-pass
 *                             route and with LUCID_BN_ONEPASS=0 (setenv in
 *                             this process): bitwise equal; the kernels
 *                             queued per call (nn_norm_fwd.cu's test hook
 *                             lucid_cuda_bn_launch_count): 1 per training
 *                             direction with dx for one-part shapes on the
 *                             one-pass route, 2 otherwise, and the same on
 *                             both routes for multi-part shapes, dweight /
 *                             dbias only and eval; the one-pass side
 *                             against the CPU (tolerances above); and the
 *                             one-pass route again with LUCID_BN_HELD=0
 *                             (x and dy read again instead of the vectors
 *                             held in registers): the same bits and
 *                             launches.  Shapes:
 *                             4x5x20x20, 3x7x10x30 (S 300: bf16/f16
 *                             scalar, f32 vector), 2x3x40x40, 4x32x40x40,
 *                             3x4x5x7 (odd S, no affine), 8x5x1x1,
 *                             100x3x9x9 (100 planes, 8100 elements),
 *                             1x2x90x91 (S 8190), 1x3x64x128 (S = 8192),
 *                             2x70001x1x2 (grid.y strides), 2x3x40x40 with
 *                             y/dx and with every activation at element
 *                             offset 1; several parts: 2x3x80x80,
 *                             5x3x96x96, 3x4x91x91 unaligned
 *   conv columns              the one-pass backward writing the next
 *                             conv's im2col columns (LUCID_BN_EMIT_COLS):
 *                             see "the conv's backward-data columns" below
 *   one pass capture          both routes captured in one graph (the
 *                             switch flipped between the calls while
 *                             recording) after an eager warm-up of each:
 *                             the replay of each equals the eager one-pass
 *                             call bitwise, with as many kernels recorded
 *                             as queued eagerly (4x24x20x20, 3x7x10x30,
 *                             and 4x24x96x96 with 8 parts)
 *   (these cases set LUCID_BN_COOP=0: their multi-part shapes keep two
 *   launches on both sides)
 * Cooperative (LUCID_BN_COOP, cuda/nn_norm.cuh), multi-part shapes, plain
 * and fused, f32/bf16/f16:
 *   coop = two launches       the calls above (beta 0, 0.5/0.25 and 1)
 *                             on the default route three times, with
 *                             LUCID_BN_COOP=0, with LUCID_BN_HELD=0 and
 *                             with LUCID_BN_COOP_LOOP=0 (full grids only):
 *                             bitwise equal; the default route against the
 *                             CPU (tolerances above); 1 kernel per
 *                             training call with dx that took the
 *                             cooperative route (lucid_cuda_bn_coop_count),
 *                             2 otherwise and on LUCID_BN_COOP=0; its grid
 *                             (lucid_cuda_bn_coop_last_grid): one block per
 *                             part, channel columns spread evenly over the
 *                             rounds, LUCID_BN_COOP_LOOP=0 cooperative
 *                             exactly on one round; on a 132-SM sm_90+
 *                             device the rounds expected there (1 for
 *                             4x64x80x80, 4x32x160x160, 3x5x90x100,
 *                             3x5x91x99 scalar, 2x3x80x80 unaligned,
 *                             5x2x160x330, 300x1x64x72; 2 for layer 0,
 *                             4x16x320x320, 832 blocks; bf16 around the
 *                             thresholds: 4x10x320x320, 4x11x320x320,
 *                             40x2x320x320, 41x2x320x320 with no column
 *                             co-resident: two launches)
 *   coop capture              the default route and LUCID_BN_COOP=0
 *                             captured in one graph, replayed twice: equal
 *                             to the first and the second eager call
 *                             bitwise, as many kernels recorded as queued
 *                             eagerly (4x64x80x80, 4x32x160x160, 3x5x91x99,
 *                             4x16x320x320 in 2 rounds)
 *   (the one-pass and cooperative groups turn the cluster route below off
 *   for the context, lucid_cuda_nn_set_bn_cluster 1, so they keep testing
 *   those routes; the groups before them run the default route, where
 *   multi-part shapes of 2..128 parts take the cluster kernels on sm_90+,
 *   and the capture before the counters turns it off in its fresh context
 *   to keep recording the counters' fallback)
 * Clusters (LUCID_BN_CLUSTER, cuda/nn_norm.cuh), multi-part shapes, plain
 * and fused, f32/bf16/f16:
 *   cluster = two launches    the calls above on the cluster route twice,
 *                             with LUCID_BN_HELD=0 and with at most 3
 *                             channel columns (the kernels' channel loop):
 *                             bitwise equal to the two-launch route
 *                             (LUCID_BN_COOP=0, cluster off); against the
 *                             CPU; 1 kernel per training call with dx on
 *                             the route (lucid_cuda_bn_cluster_count), the
 *                             route taken for 2..128 parts on a device
 *                             with cluster launch and never otherwise; the
 *                             cluster size of the rule (parts 2, 4, 6, 8,
 *                             16, 17, 35, 52, 300: see test_cluster)
 *   cluster capture           the cluster route and the two-launch route
 *                             captured in one graph, replayed twice: equal
 *                             to the first and second eager call bitwise,
 *                             as many (cluster) kernels recorded as queued
 *                             eagerly (4x64x80x80, 4x32x160x160, 3x5x91x99
 *                             with 3 columns, 4x16x320x320 with all and
 *                             with 3 columns)
 * Without a CUDA device every group prints "skip ...: no CUDA device" and
 * the program exits 0.
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "train/graph.h"

#define MOM 0.03
#define EPS 1e-3

/* ------------------------------------------------------------ tensors
 * Every tensor made here is kept in a pool released at the end of a test
 * case (pool_free), so the cases need no per-tensor cleanup: the p*
 * constructors are those of test_cuda_util.h with their result kept. */
#include "test_pool.h"

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
static lucid_tensor *phpoison(lucid_dtype dt, int ndim, const int64_t *shape) {
    return keep(hpoison(dt, ndim, shape));
}

/* Device tensor of `shape` at element offset off of a fresh device storage
 * (off 1: data not 16-byte aligned, so the BN kernels take their scalar
 * path; off 0: aligned), filled with NaN. */
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

/* ------------------------------------------------------------ comparisons
 * (test_cuda_util.h) g: a device tensor; r: a host tensor (phost() a device
 * reference first). */

/* activation output vs the CPU: f32 relative Frobenius ftol; bf16/f16 1 ulp
 * or 1e-5 * max|ref| */
static void cmp_act(const char *name, const lucid_tensor *g, const lucid_tensor *r,
                    double ftol) {
    if (r->dtype == LUCID_F32) cmp_rel(name, g, r, ftol);
    else cmp_ulp(name, g, r, 1, 1e-5);
}

static double unit(lucid_dtype dt) {
    return dt == LUCID_BF16 ? 1.0 / 256.0 : dt == LUCID_F16 ? 1.0 / 2048.0 : 0.0;
}

/* ============================================ the cluster route's hooks
 * (cuda/nn_norm_fwd.cu, cuda/nn_table.cu; weak: NULL in a build without
 * them) */

#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_cluster_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
void lucid_cuda_bn_cluster_last_grid(unsigned *cs, unsigned *gy);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_bn_cluster_sm_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned lucid_cuda_bn_cluster_cap_columns(unsigned n);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_bn_cluster(lucid_ctx *ctx, int mode);

/* The cluster route of context c (lucid_cuda_nn_set_bn_cluster): 0 follow
 * LUCID_BN_CLUSTER (the default), 1 off (the cooperative / two-launch
 * routes: the groups that test those set it), 2 on. */
static void set_cluster_of(lucid_ctx *c, int mode) {
    if (lucid_cuda_nn_set_bn_cluster) lucid_cuda_nn_set_bn_cluster(c, mode);
}
static void set_cluster(int mode) { set_cluster_of(ctx, mode); }

/* ================================================= kernels: one case */

static void test_case(int64_t N, int64_t C, int64_t H, int64_t W, int affine,
                      lucid_dtype dt) {
    char pre[160];
    snprintf(pre, sizeof pre, "bn+silu %lldx%lldx%lldx%lld%s %s", (long long)N,
             (long long)C, (long long)H, (long long)W, affine ? "" : " no-affine",
             lucid_dtype_name(dt));
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const int lowp = dt != LUCID_F32;
    const double u = unit(dt);
    const double ptol = lowp ? 1e-5 : 1e-6; /* f32 side outputs */
    lucid_tensor *hw = affine ? phrand(LUCID_F32, 1, cs, 0.5, 1.5) : NULL;
    lucid_tensor *hb = affine ? phrand(LUCID_F32, 1, cs, -0.5, 0.5) : NULL;
    lucid_tensor *gw = affine ? pdev(hw) : NULL, *gb = affine ? pdev(hb) : NULL;
    lucid_tensor *hrm = phrand(LUCID_F32, 1, cs, -0.2, 0.2);
    lucid_tensor *hrv = phrand(LUCID_F32, 1, cs, 0.5, 2.0);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    /* fused (g*), fused again for determinism (g*2), separate (s*) */
    lucid_tensor *grm = pdev(hrm), *grv = pdev(hrv), *gnb = pdev(hnb);
    lucid_tensor *grm2 = pdev(hrm), *grv2 = pdev(hrv), *gnb2 = pdev(hnb);
    lucid_tensor *srm = pdev(hrm), *srv = pdev(hrv), *snb = pdev(hnb);
    lucid_tensor *hsm = phpoison(LUCID_F32, 1, cs), *hsi = phpoison(LUCID_F32, 1, cs);
    lucid_tensor *gsm = pdpoison(LUCID_F32, 1, cs), *gsi = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *gsm2 = pdpoison(LUCID_F32, 1, cs), *gsi2 = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *ssm = pdpoison(LUCID_F32, 1, cs), *ssi = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *hx = NULL, *gx = NULL, *hy = NULL, *gy = NULL, *gy2 = NULL, *sz = NULL,
                 *sy = NULL;
    if (!hrm || !hrv || !hnb || !grm || !grv || !gnb || !grm2 || !grv2 || !gnb2 || !srm ||
        !srv || !snb || !hsm || !hsi || !gsm || !gsi || !gsm2 || !gsi2 || !ssm || !ssi ||
        (affine && (!hw || !hb || !gw || !gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* ---- two training steps, fresh x each */
    for (int step = 1; step <= 2; step++) {
        hx = phrand(dt, 4, xs, -1.5 - step, 2.5 + step);
        gx = pdev(hx);
        hy = phpoison(dt, 4, xs);
        gy = pdpoison(dt, 4, xs);
        gy2 = pdpoison(dt, 4, xs);
        sz = pdpoison(dt, 4, xs);
        sy = pdpoison(dt, 4, xs);
        if (!gx || !hy || !gy || !gy2 || !sz || !sy) {
            TEST_FAIL(NAME("%s: setup step %d", pre, step), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        RUN(NAME("%s: train forward cpu", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, hx, hy, hw, hb, hrm, hrv, hnb, hsm, hsi,
                                              1, MOM, EPS));
        RUN(NAME("%s: train forward", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, gx, gy, gw, gb, grm, grv, gnb, gsm, gsi,
                                              1, MOM, EPS));
        RUN(NAME("%s: train forward again", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, gx, gy2, gw, gb, grm2, grv2, gnb2, gsm2,
                                              gsi2, 1, MOM, EPS));
        RUN(NAME("%s: separate train forward", pre),
            lucid_nn_batchnorm2d_forward(ctx, gx, sz, gw, gb, srm, srv, snb, ssm, ssi, 1,
                                         MOM, EPS));
        RUN(NAME("%s: separate silu forward", pre), lucid_nn_silu_forward(ctx, sz, sy));
        cmp_act(NAME("%s: train y = cpu, step %d", pre, step), gy, hy, 1e-6);
        cmp_rel(NAME("%s: save_mean = cpu, step %d", pre, step), gsm, hsm, ptol);
        cmp_rel(NAME("%s: save_invstd = cpu, step %d", pre, step), gsi, hsi, ptol);
        cmp_bits(NAME("%s: train y deterministic, step %d", pre, step), gy2, phost(gy));
        cmp_bits(NAME("%s: save_mean = separate (bitwise), step %d", pre, step), gsm,
                 phost(ssm));
        cmp_bits(NAME("%s: save_invstd = separate (bitwise), step %d", pre, step), gsi,
                 phost(ssi));
        if (!lowp)
            cmp_rel(NAME("%s: train y = separate, step %d", pre, step), gy, phost(sy), 1e-6);
        else
            cmp_maxrel(NAME("%s: train y = separate within 4u*max (z rounded there), step %d",
                            pre, step),
                       gy, phost(sy), 4 * u);
    }
    cmp_rel(NAME("%s: running_mean = cpu after 2 steps", pre), grm, hrm, ptol);
    cmp_rel(NAME("%s: running_var = cpu after 2 steps", pre), grv, hrv, ptol);
    cmp_bits(NAME("%s: num_batches_tracked = cpu (2)", pre), gnb, hnb);
    cmp_bits(NAME("%s: running_mean deterministic", pre), grm2, phost(grm));
    cmp_bits(NAME("%s: running_var deterministic", pre), grv2, phost(grv));
    cmp_bits(NAME("%s: running_mean = separate (bitwise)", pre), grm, phost(srm));
    cmp_bits(NAME("%s: running_var = separate (bitwise)", pre), grv, phost(srv));
    cmp_bits(NAME("%s: num_batches_tracked = separate", pre), gnb, phost(snb));

    /* ---- training backward (the last step's statistics, each side its own) */
    {
        lucid_tensor *hdy = phrand(dt, 4, xs, -1, 1), *gdy = pdev(hdy);
        lucid_tensor *hdx = phpoison(dt, 4, xs), *gdx = pdpoison(dt, 4, xs);
        lucid_tensor *hdw = phpoison(LUCID_F32, 1, cs), *gdw = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *hdb = phpoison(LUCID_F32, 1, cs), *gdb = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *hdx1 = phrand(dt, 4, xs, -1, 1), *gdx1 = pdev(hdx1);
        lucid_tensor *hdw1 = phrand(LUCID_F32, 1, cs, -1, 1), *gdw1 = pdev(hdw1);
        lucid_tensor *hdb1 = phrand(LUCID_F32, 1, cs, -1, 1), *gdb1 = pdev(hdb1);
        lucid_tensor *sg = pdpoison(dt, 4, xs), *sdx = pdpoison(dt, 4, xs);
        lucid_tensor *sdw = pdpoison(LUCID_F32, 1, cs), *sdb = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *odx = pdpoison(dt, 4, xs), *odw = pdpoison(LUCID_F32, 1, cs),
                     *odb = pdpoison(LUCID_F32, 1, cs);
        if (!gdy || !hdx || !gdx || !hdw || !gdw || !hdb || !gdb || !gdx1 || !gdw1 ||
            !gdb1 || !sg || !sdx || !sdw || !sdb || !odx || !odw || !odb) {
            TEST_FAIL(NAME("%s: setup backward", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        lucid_tensor *dwa = affine ? hdw : NULL, *dba = affine ? hdb : NULL;
        lucid_tensor *gdwa = affine ? gdw : NULL, *gdba = affine ? gdb : NULL;
        RUN(NAME("%s: train backward cpu", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, hx, hdy, hdx, hw, hb, hsm, hsi, dwa, dba,
                                               1, 0.0, 0.0));
        RUN(NAME("%s: train backward", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx, gw, gb, gsm, gsi, gdwa,
                                               gdba, 1, 0.0, 0.0));
        cmp_act(NAME("%s: train dx = cpu (beta 0)", pre), gdx, hdx, 1e-5);
        if (affine) {
            cmp_rel(NAME("%s: train dweight = cpu (beta 0)", pre), gdw, hdw, 1e-5);
            cmp_rel(NAME("%s: train dbias = cpu (beta 0)", pre), gdb, hdb, 1e-5);
        }
        lucid_tensor *s1 = phost(gdx), *s2 = affine ? phost(gdw) : NULL,
                     *s3 = affine ? phost(gdb) : NULL;
        RUN(NAME("%s: train backward again", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx, gw, gb, gsm, gsi, gdwa,
                                               gdba, 1, 0.0, 0.0));
        cmp_bits(NAME("%s: train dx deterministic", pre), gdx, s1);
        if (affine) {
            cmp_bits(NAME("%s: train dweight deterministic", pre), gdw, s2);
            cmp_bits(NAME("%s: train dbias deterministic", pre), gdb, s3);
        }
        /* nullable outputs: each alone equals the full call bitwise */
        RUN(NAME("%s: train backward dx only", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, odx, gw, gb, gsm, gsi, NULL,
                                               NULL, 1, 0.0, 0.0));
        cmp_bits(NAME("%s: train dx only = full call", pre), odx, s1);
        if (affine) {
            RUN(NAME("%s: train backward dweight only", pre),
                lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, NULL, gw, gb, gsm, gsi, odw,
                                                   NULL, 1, 0.0, 0.0));
            RUN(NAME("%s: train backward dbias only", pre),
                lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, NULL, gw, gb, gsm, gsi,
                                                   NULL, odb, 1, 0.0, 0.0));
            cmp_bits(NAME("%s: train dweight only = full call", pre), odw, s2);
            cmp_bits(NAME("%s: train dbias only = full call", pre), odb, s3);
        }
        /* beta 1: accumulate onto the same random values */
        RUN(NAME("%s: train backward cpu beta 1", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, hx, hdy, hdx1, hw, hb, hsm, hsi,
                                               affine ? hdw1 : NULL, affine ? hdb1 : NULL, 1,
                                               1.0, 1.0));
        RUN(NAME("%s: train backward beta 1", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx1, gw, gb, gsm, gsi,
                                               affine ? gdw1 : NULL, affine ? gdb1 : NULL, 1,
                                               1.0, 1.0));
        cmp_act(NAME("%s: train dx = cpu (beta 1)", pre), gdx1, hdx1, 1e-5);
        if (affine) {
            cmp_rel(NAME("%s: train dweight = cpu (beta 1)", pre), gdw1, hdw1, 1e-5);
            cmp_rel(NAME("%s: train dbias = cpu (beta 1)", pre), gdb1, hdb1, 1e-5);
        }
        /* the separate GPU route: silu backward on the stored z, then BN */
        RUN(NAME("%s: separate silu backward", pre),
            lucid_nn_silu_backward(ctx, sz, gdy, sg, 0.0));
        RUN(NAME("%s: separate batchnorm2d backward", pre),
            lucid_nn_batchnorm2d_backward(ctx, gx, sg, sdx, gw, ssm, ssi,
                                          affine ? sdw : NULL, affine ? sdb : NULL, 1, 0.0,
                                          0.0));
        if (!lowp) {
            cmp_rel(NAME("%s: train dx = separate", pre), gdx, phost(sdx), 1e-5);
            if (affine) {
                cmp_rel(NAME("%s: train dweight = separate", pre), gdw, phost(sdw), 1e-5);
                cmp_rel(NAME("%s: train dbias = separate", pre), gdb, phost(sdb), 1e-5);
            }
        } else {
            cmp_maxrel(NAME("%s: train dx = separate within 6u*max (dL/dz rounded there)",
                            pre),
                       gdx, phost(sdx), 6 * u);
            if (affine) {
                cmp_maxrel(NAME("%s: train dweight = separate within 10u*max", pre), gdw,
                           phost(sdw), 10 * u);
                cmp_maxrel(NAME("%s: train dbias = separate within 10u*max", pre), gdb,
                           phost(sdb), 10 * u);
            }
        }

        /* ---- eval: running statistics, no update; backward with dw, db */
        lucid_tensor *rm0 = phost(grm), *nb0 = phost(gnb);
        lucid_fill(ctx, gy, NAN);
        RUN(NAME("%s: eval forward cpu", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, hx, hy, hw, hb, hrm, hrv, hnb, hsm, hsi,
                                              0, MOM, EPS));
        RUN(NAME("%s: eval forward", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, gx, gy, gw, gb, grm, grv, gnb, gsm, gsi,
                                              0, MOM, EPS));
        cmp_act(NAME("%s: eval y = cpu", pre), gy, hy, 1e-6);
        cmp_rel(NAME("%s: eval save_invstd = cpu", pre), gsi, hsi, ptol);
        cmp_bits(NAME("%s: eval leaves running_mean", pre), grm, rm0);
        cmp_bits(NAME("%s: eval leaves num_batches_tracked", pre), gnb, nb0);
        RUN(NAME("%s: separate eval forward", pre),
            lucid_nn_batchnorm2d_forward(ctx, gx, sz, gw, gb, srm, srv, NULL, ssm, ssi, 0,
                                         MOM, EPS));
        RUN(NAME("%s: separate eval silu", pre), lucid_nn_silu_forward(ctx, sz, sy));
        if (!lowp) cmp_rel(NAME("%s: eval y = separate", pre), gy, phost(sy), 1e-6);
        else
            cmp_maxrel(NAME("%s: eval y = separate within 4u*max", pre), gy, phost(sy), 4 * u);
        lucid_fill(ctx, gdx, NAN);
        if (affine) {
            lucid_fill(ctx, gdw, NAN);
            lucid_fill(ctx, gdb, NAN);
        }
        RUN(NAME("%s: eval backward cpu", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, hx, hdy, hdx, hw, hb, hsm, hsi, dwa, dba,
                                               0, 0.0, 0.0));
        RUN(NAME("%s: eval backward", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx, gw, gb, gsm, gsi, gdwa,
                                               gdba, 0, 0.0, 0.0));
        cmp_act(NAME("%s: eval dx = cpu", pre), gdx, hdx, 1e-5);
        if (affine) {
            cmp_rel(NAME("%s: eval dweight = cpu", pre), gdw, hdw, 1e-5);
            cmp_rel(NAME("%s: eval dbias = cpu", pre), gdb, hdb, 1e-5);
        }
        lucid_fill(ctx, odx, NAN);
        RUN(NAME("%s: eval backward dx only", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, odx, gw, gb, gsm, gsi, NULL,
                                               NULL, 0, 0.0, 0.0));
        cmp_bits(NAME("%s: eval dx only = full call", pre), odx, phost(gdx));
    }
done:
    pool_free();
}

/* ======================================= graph capture of the fused calls */

static void test_capture(lucid_dtype dt, int64_t N, int64_t C, int64_t H, int64_t W) {
    char pre[96];
    snprintf(pre, sizeof pre, "bn+silu capture %lldx%lldx%lldx%lld %s", (long long)N,
             (long long)C, (long long)H, (long long)W, lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    lucid_graph *g = NULL;
    lucid_tensor *hw = phrand(LUCID_F32, 1, cs, 0.5, 1.5);
    lucid_tensor *hb = phrand(LUCID_F32, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(LUCID_F32, 1, cs, -0.2, 0.2);
    lucid_tensor *hrv = phrand(LUCID_F32, 1, cs, 0.5, 2);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *gx = pdev(hx), *gdy = pdev(hdy);
    /* E: eager, R: recorded; same starting running stats */
    lucid_tensor *erm = pdev(hrm), *erv = pdev(hrv), *enb = pdev(hnb);
    lucid_tensor *rrm = pdev(hrm), *rrv = pdev(hrv), *rnb = pdev(hnb);
    lucid_tensor *esm = pdpoison(LUCID_F32, 1, cs), *esi = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *rsm = pdpoison(LUCID_F32, 1, cs), *rsi = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *ey = pdpoison(dt, 4, xs), *ry = pdpoison(dt, 4, xs);
    lucid_tensor *edx = pdpoison(dt, 4, xs), *rdx = pdpoison(dt, 4, xs);
    lucid_tensor *edw = pdpoison(LUCID_F32, 1, cs), *rdw = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *edb = pdpoison(LUCID_F32, 1, cs), *rdb = pdpoison(LUCID_F32, 1, cs);
    if (!gw || !gb || !gx || !gdy || !erm || !erv || !enb || !rrm || !rrv || !rnb || !esm ||
        !esi || !rsm || !rsi || !ey || !ry || !edx || !rdx || !edw || !rdw || !edb || !rdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* eager (also the warm-up: the nn arena reaches its size here) */
    RUN(NAME("%s: eager forward", pre),
        lucid_nn_batchnorm2d_silu_forward(ctx, gx, ey, gw, gb, erm, erv, enb, esm, esi, 1,
                                          MOM, EPS));
    RUN(NAME("%s: eager backward", pre),
        lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, edx, gw, gb, esm, esi, edw, edb, 1,
                                           0.0, 0.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_status s1 = lucid_nn_batchnorm2d_silu_forward(ctx, gx, ry, gw, gb, rrm, rrv,
                                                            rnb, rsm, rsi, 1, MOM, EPS);
        lucid_status s2 = s1 ? s1
                             : lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, rdx, gw, gb,
                                                                  rsm, rsi, rdw, rdb, 1, 0.0,
                                                                  0.0);
        if (s2 != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s",
                      lucid_status_name(s2), lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    TEST_OK(NAME("%s: forward + backward capture without allocation", pre));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    cmp_bits(NAME("%s: replay y = eager (bitwise)", pre), ry, phost(ey));
    cmp_bits(NAME("%s: replay save_mean = eager", pre), rsm, phost(esm));
    cmp_bits(NAME("%s: replay save_invstd = eager", pre), rsi, phost(esi));
    cmp_bits(NAME("%s: replay running_mean = eager", pre), rrm, phost(erm));
    cmp_bits(NAME("%s: replay running_var = eager", pre), rrv, phost(erv));
    cmp_bits(NAME("%s: replay num_batches_tracked = eager", pre), rnb, phost(enb));
    cmp_bits(NAME("%s: replay dx = eager", pre), rdx, phost(edx));
    cmp_bits(NAME("%s: replay dweight = eager", pre), rdw, phost(edw));
    cmp_bits(NAME("%s: replay dbias = eager", pre), rdb, phost(edb));
    /* again: every replay leaves the fold counters at zero for the next */
    RUN(NAME("%s: eager forward 2", pre),
        lucid_nn_batchnorm2d_silu_forward(ctx, gx, ey, gw, gb, erm, erv, enb, esm, esi, 1,
                                          MOM, EPS));
    RUN(NAME("%s: eager backward 2", pre),
        lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, edx, gw, gb, esm, esi, edw, edb, 1,
                                           0.0, 0.0));
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
    cmp_bits(NAME("%s: replay 2 y = eager", pre), ry, phost(ey));
    cmp_bits(NAME("%s: replay 2 save_invstd = eager", pre), rsi, phost(esi));
    cmp_bits(NAME("%s: replay 2 running_mean = eager (2 updates)", pre), rrm, phost(erm));
    cmp_bits(NAME("%s: replay 2 running_var = eager (2 updates)", pre), rrv, phost(erv));
    cmp_bits(NAME("%s: replay 2 num_batches_tracked = eager", pre), rnb, phost(enb));
    {
        lucid_tensor *nb = phost(rnb);
        CHECK(NAME("%s: replay 2 num_batches_tracked == 2", pre),
              nb && test_hget(nb, 0) == 2.0, "num_batches_tracked %g",
              nb ? test_hget(nb, 0) : -1.0);
    }
    cmp_bits(NAME("%s: replay 2 dx = eager", pre), rdx, phost(edx));
    cmp_bits(NAME("%s: replay 2 dweight = eager", pre), rdw, phost(edw));
    cmp_bits(NAME("%s: replay 2 dbias = eager", pre), rdb, phost(edb));
done:
    if (g) lucid_graph_destroy(g);
    pool_free();
}

/* Capture before the nn state has its fold counters (cuda/nn_table.cu
 * allocates them on the first request made outside a capture, never inside
 * one): a fresh context whose warm-up only ran BN on more channels than the
 * counters cover (fallback route; the arena grows there, 4x131100x1x1 is
 * one part per channel so it needs more arena than the shapes below), then
 * the fused calls of an N x C x H x W shape captured (the fallback route is
 * recorded: with more than one part per channel, the separate final
 * kernels), replayed, and compared bitwise with the same calls run eagerly
 * afterwards (which allocate the counters and take the counter route: the
 * last block of a channel folds). */
static void test_capture_fallback(lucid_dtype dt, int64_t N, int64_t C, int64_t H,
                                  int64_t W) {
    char pre[112];
    snprintf(pre, sizeof pre, "bn+silu capture before the fold counters %lldx%lldx%lldx%lld %s",
             (long long)N, (long long)C, (long long)H, (long long)W, lucid_dtype_name(dt));
    lucid_ctx *main_ctx = NULL;
    if (!cuda_test_enter_fresh(pre, &main_ctx)) return; /* ctx: a fresh context */
    lucid_graph *g = NULL;
    set_cluster(1); /* the counters' fallback route, not the cluster kernels */
    {
        int64_t bxs[4] = {4, 131100, 1, 1}, bcs[1] = {131100};
        int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
        lucid_tensor *bx = pdev(phrand(dt, 4, bxs, -2, 3));
        lucid_tensor *bw = pdev(phrand(LUCID_F32, 1, bcs, 0.5, 1.5));
        lucid_tensor *bb = pdev(phrand(LUCID_F32, 1, bcs, -0.5, 0.5));
        lucid_tensor *brm = pdev(phzeros(LUCID_F32, 1, bcs));
        lucid_tensor *brv = pdev(phzeros(LUCID_F32, 1, bcs));
        lucid_tensor *bsm = pdpoison(LUCID_F32, 1, bcs), *bsi = pdpoison(LUCID_F32, 1, bcs);
        lucid_tensor *bdw = pdpoison(LUCID_F32, 1, bcs), *bdb = pdpoison(LUCID_F32, 1, bcs);
        lucid_tensor *by = pdpoison(dt, 4, bxs), *bdx = pdpoison(dt, 4, bxs);
        lucid_tensor *hw = phrand(LUCID_F32, 1, cs, 0.5, 1.5);
        lucid_tensor *hb = phrand(LUCID_F32, 1, cs, -0.5, 0.5);
        lucid_tensor *hrm = phrand(LUCID_F32, 1, cs, -0.2, 0.2);
        lucid_tensor *hrv = phrand(LUCID_F32, 1, cs, 0.5, 2);
        lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
        lucid_tensor *gx = pdev(phrand(dt, 4, xs, -2, 3)), *gdy = pdev(phrand(dt, 4, xs, -1, 1));
        lucid_tensor *gw = pdev(hw), *gb = pdev(hb);
        lucid_tensor *erm = pdev(hrm), *erv = pdev(hrv), *enb = pdev(hnb);
        lucid_tensor *rrm = pdev(hrm), *rrv = pdev(hrv), *rnb = pdev(hnb);
        lucid_tensor *esm = pdpoison(LUCID_F32, 1, cs), *esi = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *rsm = pdpoison(LUCID_F32, 1, cs), *rsi = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *ey = pdpoison(dt, 4, xs), *ry = pdpoison(dt, 4, xs);
        lucid_tensor *edx = pdpoison(dt, 4, xs), *rdx = pdpoison(dt, 4, xs);
        lucid_tensor *edw = pdpoison(LUCID_F32, 1, cs), *rdw = pdpoison(LUCID_F32, 1, cs);
        lucid_tensor *edb = pdpoison(LUCID_F32, 1, cs), *rdb = pdpoison(LUCID_F32, 1, cs);
        if (!bx || !bw || !bb || !brm || !brv || !bsm || !bsi || !bdw || !bdb || !by ||
            !bdx || !gx || !gdy || !gw || !gb || !erm || !erv || !enb || !rrm || !rrv ||
            !rnb || !esm || !esi || !rsm || !rsi || !ey || !ry || !edx || !rdx || !edw ||
            !rdw || !edb || !rdb) {
            TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        /* warm-up on 131100 channels: the arena grows, the counters stay
         * unallocated (too many channels for them) */
        RUN(NAME("%s: warm-up forward", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, bx, by, bw, bb, brm, brv, NULL, bsm, bsi,
                                              1, MOM, EPS));
        RUN(NAME("%s: warm-up backward", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, bx, by, bdx, bw, bb, bsm, bsi, bdw, bdb,
                                               1, 0.0, 0.0));
        RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
        RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
        {
            lucid_status s1 = lucid_nn_batchnorm2d_silu_forward(ctx, gx, ry, gw, gb, rrm, rrv,
                                                                rnb, rsm, rsi, 1, MOM, EPS);
            lucid_status s2 =
                s1 ? s1
                   : lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, rdx, gw, gb, rsm, rsi,
                                                        rdw, rdb, 1, 0.0, 0.0);
            if (s2 != LUCID_OK) {
                TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s",
                          lucid_status_name(s2), lucid_ctx_error(ctx));
                lucid_ctx_capture_end(ctx, NULL);
                goto done;
            }
        }
        RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
        TEST_OK(NAME("%s: captured without the counters", pre));
        RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
        RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
        for (int k = 0; k < 2; k++) {
            RUN(NAME("%s: eager forward", pre),
                lucid_nn_batchnorm2d_silu_forward(ctx, gx, ey, gw, gb, erm, erv, enb, esm,
                                                  esi, 1, MOM, EPS));
            RUN(NAME("%s: eager backward", pre),
                lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, edx, gw, gb, esm, esi, edw,
                                                   edb, 1, 0.0, 0.0));
        }
        cmp_bits(NAME("%s: fallback replay y = counter eager", pre), ry, phost(ey));
        cmp_bits(NAME("%s: fallback replay save_mean = counter eager", pre), rsm, phost(esm));
        cmp_bits(NAME("%s: fallback replay save_invstd = counter eager", pre), rsi,
                 phost(esi));
        cmp_bits(NAME("%s: fallback replay running_mean = counter eager (2 updates)", pre),
                 rrm, phost(erm));
        cmp_bits(NAME("%s: fallback replay running_var = counter eager (2 updates)", pre),
                 rrv, phost(erv));
        cmp_bits(NAME("%s: fallback replay num_batches_tracked = counter eager", pre), rnb,
                 phost(enb));
        cmp_bits(NAME("%s: fallback replay dx = counter eager", pre), rdx, phost(edx));
        cmp_bits(NAME("%s: fallback replay dweight = counter eager", pre), rdw, phost(edw));
        cmp_bits(NAME("%s: fallback replay dbias = counter eager", pre), rdb, phost(edb));
    }
done:
    if (g) lucid_graph_destroy(g);
    pool_free();
    cuda_test_leave_fresh(main_ctx);
}

/* ================================== unaligned activations (scalar path)
 * A shape the vector path would take (S a multiple of 8) with the inputs
 * x, dy at element offset in_off and the outputs y, dx at out_off of their
 * storages (1: not 16-byte aligned): in_off 1 sends every kernel to its
 * scalar path, in_off 0 / out_off 1 only the element-wise ones (the
 * statistics and gradient sums stay vectorised).  Fused training forward
 * and backward against the CPU (tolerances of test_case), and run twice:
 * bitwise identical. */
static void test_misaligned(lucid_dtype dt, int64_t in_off, int64_t out_off) {
    const int64_t N = 3, C = 4, H = 96, W = 96; /* S = 9216: 2 chunks a plane */
    char pre[128];
    snprintf(pre, sizeof pre, "bn+silu %lldx%lldx%lldx%lld x/dy at offset %lld, y/dx at %lld %s",
             (long long)N, (long long)C, (long long)H, (long long)W, (long long)in_off,
             (long long)out_off, lucid_dtype_name(dt));
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C};
    const double ptol = dt != LUCID_F32 ? 1e-5 : 1e-6;
    lucid_tensor *hw = phrand(LUCID_F32, 1, cs, 0.5, 1.5);
    lucid_tensor *hb = phrand(LUCID_F32, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(LUCID_F32, 1, cs, -0.2, 0.2);
    lucid_tensor *hrv = phrand(LUCID_F32, 1, cs, 0.5, 2.0);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *grm = pdev(hrm), *grv = pdev(hrv);
    lucid_tensor *gx = pdview(dt, 4, xs, in_off), *gdy = pdview(dt, 4, xs, in_off);
    lucid_tensor *gy = pdview(dt, 4, xs, out_off), *gdx = pdview(dt, 4, xs, out_off);
    lucid_tensor *hy = phpoison(dt, 4, xs), *hdx = phpoison(dt, 4, xs);
    lucid_tensor *hsm = phpoison(LUCID_F32, 1, cs), *hsi = phpoison(LUCID_F32, 1, cs);
    lucid_tensor *gsm = pdpoison(LUCID_F32, 1, cs), *gsi = pdpoison(LUCID_F32, 1, cs);
    lucid_tensor *hdw = phpoison(LUCID_F32, 1, cs), *hdb = phpoison(LUCID_F32, 1, cs);
    lucid_tensor *gdw = pdpoison(LUCID_F32, 1, cs), *gdb = pdpoison(LUCID_F32, 1, cs);
    if (!hw || !hb || !hrm || !hrv || !hx || !hdy || !gw || !gb || !grm || !grv || !gx ||
        !gdy || !gy || !gdx || !hy || !hdx || !hsm || !hsi || !gsm || !gsi || !hdw || !hdb ||
        !gdw || !gdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: copy x", pre), lucid_copy(ctx, gx, hx));
    RUN(NAME("%s: copy dy", pre), lucid_copy(ctx, gdy, hdy));
    RUN(NAME("%s: train forward cpu", pre),
        lucid_nn_batchnorm2d_silu_forward(ctx, hx, hy, hw, hb, hrm, hrv, NULL, hsm, hsi, 1,
                                          MOM, EPS));
    RUN(NAME("%s: train forward", pre),
        lucid_nn_batchnorm2d_silu_forward(ctx, gx, gy, gw, gb, grm, grv, NULL, gsm, gsi, 1,
                                          MOM, EPS));
    cmp_act(NAME("%s: train y = cpu", pre), gy, hy, 1e-6);
    cmp_rel(NAME("%s: save_mean = cpu", pre), gsm, hsm, ptol);
    cmp_rel(NAME("%s: save_invstd = cpu", pre), gsi, hsi, ptol);
    cmp_rel(NAME("%s: running_mean = cpu", pre), grm, hrm, ptol);
    cmp_rel(NAME("%s: running_var = cpu", pre), grv, hrv, ptol);
    RUN(NAME("%s: train backward cpu", pre),
        lucid_nn_batchnorm2d_silu_backward(ctx, hx, hdy, hdx, hw, hb, hsm, hsi, hdw, hdb, 1,
                                           0.0, 0.0));
    RUN(NAME("%s: train backward", pre),
        lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx, gw, gb, gsm, gsi, gdw, gdb, 1,
                                           0.0, 0.0));
    cmp_act(NAME("%s: train dx = cpu", pre), gdx, hdx, 1e-5);
    cmp_rel(NAME("%s: train dweight = cpu", pre), gdw, hdw, 1e-5);
    cmp_rel(NAME("%s: train dbias = cpu", pre), gdb, hdb, 1e-5);
    {
        lucid_tensor *y1 = phost(gy), *dx1 = phost(gdx), *dw1 = phost(gdw), *db1 = phost(gdb);
        RUN(NAME("%s: train backward again", pre),
            lucid_nn_batchnorm2d_silu_backward(ctx, gx, gdy, gdx, gw, gb, gsm, gsi, gdw, gdb,
                                               1, 0.0, 0.0));
        RUN(NAME("%s: train forward again", pre),
            lucid_nn_batchnorm2d_silu_forward(ctx, gx, gy, gw, gb, grm, grv, NULL, gsm, gsi,
                                              1, MOM, EPS));
        if (y1 && dx1 && dw1 && db1) {
            cmp_bits(NAME("%s: y deterministic", pre), gy, y1);
            cmp_bits(NAME("%s: dx deterministic", pre), gdx, dx1);
            cmp_bits(NAME("%s: dweight deterministic", pre), gdw, dw1);
            cmp_bits(NAME("%s: dbias deterministic", pre), gdb, db1);
        } else {
            TEST_FAIL(NAME("%s: snapshots", pre), "%s", lucid_ctx_error(ctx));
        }
    }
done:
    pool_free();
}

/* ==================== one pass vs two launches (LUCID_BN_ONEPASS)
 * cuda/nn_norm_*.cu fuse the two launches of a training direction into one
 * kernel when a channel is one part (N*H*W <= 8192); LUCID_BN_ONEPASS=0
 * keeps the two-launch route.  Each case runs the same calls on both
 * routes in this process (setenv between them), plain BatchNorm2d or the
 * fused BatchNorm2d + SiLU, and compares every output bitwise: two
 * training forwards (y, save_mean, save_invstd, running stats after two
 * updates, num_batches_tracked), the training backward with every output
 * (beta 0), dx only, dweight only, dbias only, every output with beta_input
 * 0.5 / beta_params 0.25 and with both betas 1 onto random values, and an
 * eval forward and
 * backward (not affected by the switch).  The kernels queued per call are
 * counted (lucid_cuda_bn_launch_count, nn_norm_fwd.cu's test hook): one-part
 * shapes take 1 per training direction with dx on the one-pass route and 2
 * on the other, multi-part shapes 2 on both (the counter route), dweight
 * only and eval the same on both.  The one-pass side is also checked
 * against the CPU (tolerances of test_case).  Activations at element
 * offset 1 of their storage (x/dy: every kernel scalar; y/dx only: the
 * statistics vectorised, the element-wise part scalar).  These cases and
 * their capture set LUCID_BN_COOP=0 (multi-part shapes keep the two-launch
 * route on both sides); the cooperative route of multi-part shapes has
 * its own cases below (test_coop). */

#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_launch_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_coop_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_bn_coop_sm_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
void lucid_cuda_bn_coop_last_grid(unsigned *gx, unsigned *gy);

static unsigned long bn_launches(void) {
    return lucid_cuda_bn_launch_count ? lucid_cuda_bn_launch_count() : 0;
}

/* cooperative launches so far (nn_norm_fwd.cu's test hook) */
static unsigned long bn_coops(void) {
    return lucid_cuda_bn_coop_count ? lucid_cuda_bn_coop_count() : 0;
}

/* The grid (parts, channel columns) of a cooperative launch (0 x 0: the
 * call took none). */
typedef struct coop_grid {
    unsigned x, y;
} coop_grid;

/* the grid of this thread's last cooperative launch (nn_norm_fwd.cu's test
 * hook; 0 x 0 without it) */
static void coop_last_grid(coop_grid *g) {
    g->x = g->y = 0;
    if (lucid_cuda_bn_coop_last_grid) lucid_cuda_bn_coop_last_grid(&g->x, &g->y);
}

/* cluster launches so far (nn_norm_fwd.cu's test hook) */
static unsigned long bn_clusters(void) {
    return lucid_cuda_bn_cluster_count ? lucid_cuda_bn_cluster_count() : 0;
}

/* the cluster size and channel columns of this thread's last cluster
 * launch (0 x 0 without the hook) */
static void cluster_last_grid(coop_grid *g) {
    g->x = g->y = 0;
    if (lucid_cuda_bn_cluster_last_grid) lucid_cuda_bn_cluster_last_grid(&g->x, &g->y);
}

/* 0: LUCID_BN_COOP=0; 1: unset (the default) */
static void set_coop(int mode) {
    if (mode == 0) setenv("LUCID_BN_COOP", "0", 1);
    else setenv("LUCID_BN_COOP", "1", 1); /* this program's "default": opt-in since session 13 */
}

/* 0: LUCID_BN_ONEPASS=0; 1: unset (the default); 2: "1" */
static void set_onepass(int mode) {
    if (mode == 0) setenv("LUCID_BN_ONEPASS", "0", 1);
    else if (mode == 2) setenv("LUCID_BN_ONEPASS", "1", 1);
    else unsetenv("LUCID_BN_ONEPASS");
}

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

/* outputs of one route */
enum {
    OP_Y, OP_SM, OP_SI, OP_RM, OP_RV, OP_NB, OP_DX, OP_DW, OP_DB, OP_ODX, OP_ODW, OP_ODB,
    OP_BDX, OP_BDW, OP_BDB, OP_B1DX, OP_B1DW, OP_B1DB, OP_EY, OP_EDX, OP_EDW, OP_EDB, OP_N
};
static const char *const OP_NAMES[OP_N] = {
    "train y", "save_mean", "save_invstd", "running_mean (2 updates)",
    "running_var (2 updates)", "num_batches_tracked", "train dx", "train dweight",
    "train dbias", "train dx only", "train dweight only", "train dbias only",
    "train dx (beta 0.5)", "train dweight (beta 0.25)", "train dbias (beta 0.25)",
    "train dx (beta 1)", "train dweight (beta 1)", "train dbias (beta 1)", "eval y",
    "eval dx", "eval dweight", "eval dbias"};

/* kernels queued per call */
enum {
    L_FWD, L_BWD, L_BWD_DX, L_BWD_DW, L_BWD_DB, L_BWD_BETA, L_BWD_BETA1, L_EVAL_F, L_EVAL_B,
    L_N
};
static const char *const L_NAMES[L_N] = {
    "train forward", "train backward", "train backward dx only", "train backward dweight only",
    "train backward dbias only", "train backward with beta", "train backward with beta 1",
    "eval forward", "eval backward"};

/* the training calls with dx (the kernels LUCID_BN_ONEPASS and LUCID_BN_COOP
 * fuse) */
static int l_fusable(int k) {
    return k == L_FWD || k == L_BWD || k == L_BWD_DX || k == L_BWD_BETA || k == L_BWD_BETA1;
}

typedef struct bn_in {
    lucid_dtype dt;
    int silu, affine;
    int64_t xs[4], cs[1], in_off, out_off;
    lucid_tensor *hx1, *hx2, *hdy, *hw, *hb, *hrm, *hrv, *hnb, *hbdx, *hbdw, *hbdb;
} bn_in;

/* in = the inputs of a [N, C, H, W] training case, drawn on the host in a
 * fixed order (x twice, dy, weight, bias, running stats, the backward's
 * accumulation targets); in_off / out_off: the element offsets of the
 * device views (pdview_of). */
static void bn_in_draw(bn_in *in, lucid_dtype dt, int silu, int affine, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t in_off, int64_t out_off) {
    int64_t one1[1] = {1};
    memset(in, 0, sizeof *in);
    in->dt = dt;
    in->silu = silu;
    in->affine = affine;
    in->xs[0] = N, in->xs[1] = C, in->xs[2] = H, in->xs[3] = W;
    in->cs[0] = C;
    in->in_off = in_off;
    in->out_off = out_off;
    in->hx1 = phrand(dt, 4, in->xs, -2, 3);
    in->hx2 = phrand(dt, 4, in->xs, -1.5, 2.5);
    in->hdy = phrand(dt, 4, in->xs, -1, 1);
    in->hw = phrand(LUCID_F32, 1, in->cs, 0.5, 1.5);
    in->hb = phrand(LUCID_F32, 1, in->cs, -0.5, 0.5);
    in->hrm = phrand(LUCID_F32, 1, in->cs, -0.2, 0.2);
    in->hrv = phrand(LUCID_F32, 1, in->cs, 0.5, 2.0);
    in->hnb = phzeros(LUCID_I64, 1, one1);
    in->hbdx = phrand(dt, 4, in->xs, -1, 1);
    in->hbdw = phrand(LUCID_F32, 1, in->cs, -1, 1);
    in->hbdb = phrand(LUCID_F32, 1, in->cs, -1, 1);
}

/* Device tensor at element offset off (pdview) holding the host tensor h. */
static lucid_tensor *pdview_of(const lucid_tensor *h, int64_t off) {
    if (!h) return NULL;
    lucid_tensor *t = pdview(h->dtype, h->ndim, h->shape, off);
    if (t && lucid_copy(ctx, t, h) != LUCID_OK) return NULL;
    return t;
}

/* The calls of the header on the current route: o[OP_*] (NULL where not
 * asked: no affine parameters), nl[L_*] the kernels queued per call, nc[L_*]
 * (nullable) the cooperative ones among them, cg[L_*] (nullable; needs nc)
 * the grid of the call's cooperative launch (nn_norm_fwd.cu's test hook
 * lucid_cuda_bn_coop_last_grid; 0 x 0 when it took none); nk[L_*] and
 * kg[L_*] (nullable; kg needs nk) the same for the cluster launches
 * (lucid_cuda_bn_cluster_count, lucid_cuda_bn_cluster_last_grid: cluster
 * size x channel columns).  LUCID_OK or the failing call's status (*what
 * names it). */
static lucid_status onepass_run(const bn_in *in, lucid_tensor **o, unsigned long *nl,
                                unsigned long *nc, coop_grid *cg, unsigned long *nk,
                                coop_grid *kg, const char **what) {
    const lucid_dtype dt = in->dt, F = LUCID_F32;
    const int64_t *xs = in->xs, *cs = in->cs, oo = in->out_off;
    const int silu = in->silu, af = in->affine;
    lucid_status s = LUCID_OK;
    unsigned long n0, c0, k0;
    memset(o, 0, sizeof(lucid_tensor *) * OP_N);
    memset(nl, 0, sizeof(unsigned long) * L_N);
    if (nc) memset(nc, 0, sizeof(unsigned long) * L_N);
    if (cg) memset(cg, 0, sizeof(coop_grid) * L_N);
    if (nk) memset(nk, 0, sizeof(unsigned long) * L_N);
    if (kg) memset(kg, 0, sizeof(coop_grid) * L_N);
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
    o[OP_B1DX] = pdview_of(in->hbdx, oo);
    o[OP_EY] = pdview(dt, 4, xs, oo);
    o[OP_EDX] = pdview(dt, 4, xs, oo);
    if (af) {
        o[OP_DW] = pdpoison(F, 1, cs);
        o[OP_DB] = pdpoison(F, 1, cs);
        o[OP_ODW] = pdpoison(F, 1, cs);
        o[OP_ODB] = pdpoison(F, 1, cs);
        o[OP_BDW] = pdev(in->hbdw);
        o[OP_BDB] = pdev(in->hbdb);
        o[OP_B1DW] = pdev(in->hbdw);
        o[OP_B1DB] = pdev(in->hbdb);
        o[OP_EDW] = pdpoison(F, 1, cs);
        o[OP_EDB] = pdpoison(F, 1, cs);
    }
    int ok = gx1 && gx2 && gdy && esm && esi && (!af || (gw && gb));
    for (int k = 0; k < OP_N; k++)
        if (!o[k] && (af || (k != OP_DW && k != OP_DB && k != OP_ODW && k != OP_ODB &&
                             k != OP_BDW && k != OP_BDB && k != OP_B1DW && k != OP_B1DB &&
                             k != OP_EDW && k != OP_EDB)))
            ok = 0;
    if (!ok) return LUCID_ERR_OOM;
#define STEP(name, slot, expr)                                                \
    do {                                                                      \
        *what = name;                                                         \
        n0 = bn_launches();                                                   \
        c0 = bn_coops();                                                      \
        k0 = bn_clusters();                                                   \
        if ((s = (expr)) != LUCID_OK) return s;                               \
        if ((slot) >= 0) nl[(slot)] = bn_launches() - n0;                     \
        if ((slot) >= 0 && nc) nc[(slot)] = bn_coops() - c0;                  \
        if ((slot) >= 0 && nc && cg && nc[(slot)])                            \
            coop_last_grid(&cg[(slot)]);                                      \
        if ((slot) >= 0 && nk) nk[(slot)] = bn_clusters() - k0;               \
        if ((slot) >= 0 && nk && kg && nk[(slot)])                            \
            cluster_last_grid(&kg[(slot)]);                                   \
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
        STEP("train backward dweight only", L_BWD_DW,
             bn_bwd(silu, gx2, gdy, NULL, gw, gb, o[OP_SM], o[OP_SI], o[OP_ODW], NULL, 1, 0.0,
                    0.0));
        STEP("train backward dbias only", L_BWD_DB,
             bn_bwd(silu, gx2, gdy, NULL, gw, gb, o[OP_SM], o[OP_SI], NULL, o[OP_ODB], 1, 0.0,
                    0.0));
    }
    STEP("train backward with beta", L_BWD_BETA,
         bn_bwd(silu, gx2, gdy, o[OP_BDX], gw, gb, o[OP_SM], o[OP_SI], o[OP_BDW], o[OP_BDB], 1,
                0.5, 0.25));
    STEP("train backward with beta 1", L_BWD_BETA1,
         bn_bwd(silu, gx2, gdy, o[OP_B1DX], gw, gb, o[OP_SM], o[OP_SI], o[OP_B1DW], o[OP_B1DB],
                1, 1.0, 1.0));
    STEP("eval forward", L_EVAL_F,
         bn_fwd(silu, gx2, o[OP_EY], gw, gb, o[OP_RM], o[OP_RV], NULL, esm, esi, 0));
    STEP("eval backward", L_EVAL_B,
         bn_bwd(silu, gx2, gdy, o[OP_EDX], gw, gb, esm, esi, o[OP_EDW], o[OP_EDB], 0, 0.0,
                0.0));
#undef STEP
    *what = "synchronize";
    return lucid_ctx_synchronize(ctx);
}

/* One route's outputs o[OP_*] of onepass_run (tag names the route)
 * against the CPU reference of the same calls (two training forwards, the
 * training backward with every output, beta 0), with the tolerances of
 * test_case: y and dx cmp_act (f32 relative Frobenius 1e-6 / 1e-5,
 * bf16/f16 1 ulp or 1e-5 * max|ref|), save_mean / save_invstd and the
 * running stats relative Frobenius 1e-6 (f32) / 1e-5 (bf16/f16),
 * dweight / dbias 1e-5 (times sqrt(N*H*W / 65536) beyond 65536 terms),
 * num_batches_tracked exact (2). */
static void route_vs_cpu(const char *pre, const char *tag, const bn_in *in, lucid_tensor **o) {
    const lucid_dtype dt = in->dt;
    const int silu = in->silu, affine = in->affine;
    const double ptol = dt != LUCID_F32 ? 1e-5 : 1e-6;
    int64_t one1[1] = {1};
    lucid_tensor *crm = pdev(in->hrm), *crv = pdev(in->hrv);
    lucid_tensor *hy = phpoison(dt, 4, in->xs), *hsm = phpoison(LUCID_F32, 1, in->cs),
                 *hsi = phpoison(LUCID_F32, 1, in->cs), *hdx = phpoison(dt, 4, in->xs);
    lucid_tensor *hdw = phpoison(LUCID_F32, 1, in->cs), *hdb = phpoison(LUCID_F32, 1, in->cs);
    lucid_tensor *rm = crm ? phost(crm) : NULL, *rv = crv ? phost(crv) : NULL;
    lucid_tensor *nb = phzeros(LUCID_I64, 1, one1);
    if (!hy || !hsm || !hsi || !hdx || !hdw || !hdb || !rm || !rv || !nb) {
        TEST_FAIL(NAME("%s: cpu setup", pre), "%s", lucid_ctx_error(ctx));
        return;
    }
    const lucid_tensor *hw = affine ? in->hw : NULL, *hb = affine ? in->hb : NULL;
    RUN(NAME("%s: cpu forward 1", pre),
        bn_fwd(silu, in->hx1, hy, hw, hb, rm, rv, nb, hsm, hsi, 1));
    RUN(NAME("%s: cpu forward 2", pre),
        bn_fwd(silu, in->hx2, hy, hw, hb, rm, rv, nb, hsm, hsi, 1));
    RUN(NAME("%s: cpu backward", pre),
        bn_bwd(silu, in->hx2, in->hdy, hdx, hw, hb, hsm, hsi, affine ? hdw : NULL,
               affine ? hdb : NULL, 1, 0.0, 0.0));
    cmp_act(NAME("%s: %s train y = cpu", pre, tag), o[OP_Y], hy, 1e-6);
    cmp_rel(NAME("%s: %s save_mean = cpu", pre, tag), o[OP_SM], hsm, ptol);
    cmp_rel(NAME("%s: %s save_invstd = cpu", pre, tag), o[OP_SI], hsi, ptol);
    cmp_rel(NAME("%s: %s running_mean = cpu", pre, tag), o[OP_RM], rm, ptol);
    cmp_rel(NAME("%s: %s running_var = cpu", pre, tag), o[OP_RV], rv, ptol);
    cmp_bits(NAME("%s: %s num_batches_tracked = cpu (2)", pre, tag), o[OP_NB], nb);
    cmp_act(NAME("%s: %s train dx = cpu", pre, tag), o[OP_DX], hdx, 1e-5);
    if (affine) {
        /* dweight / dbias: f32 sums of N*H*W terms per channel in another
         * order than the CPU's; their rounding error grows like the square
         * root of the count, and a channel whose terms cancel has a small
         * reference.  1e-5 up to 65536 terms, then scaled by sqrt(count /
         * 65536) (the H200 found 2.8e-5 on one channel of 300x1x64x72 f32,
         * 1.38M terms, in session 13: 4.6e-5 now) */
        const double m = (double)in->xs[0] * (double)in->xs[2] * (double)in->xs[3];
        const double ptol_g = 1e-5 * (m > 65536.0 ? sqrt(m / 65536.0) : 1.0);
        cmp_rel(NAME("%s: %s train dweight = cpu", pre, tag), o[OP_DW], hdw, ptol_g);
        cmp_rel(NAME("%s: %s train dbias = cpu", pre, tag), o[OP_DB], hdb, ptol_g);
    }
done:
    return;
}

static void test_onepass(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H, int64_t W,
                         int affine, int64_t in_off, int64_t out_off) {
    char pre[192];
    snprintf(pre, sizeof pre, "bn one-pass = two launches%s %lldx%lldx%lldx%lld%s%s %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             affine ? "" : " no-affine",
             in_off || out_off ? (in_off ? " x/dy/y/dx at offset 1" : " y/dx at offset 1") : "",
             lucid_dtype_name(dt));
    const int one = N * H * W <= 8192; /* one part per channel */
    bn_in in;
    bn_in_draw(&in, dt, silu, affine, N, C, H, W, in_off, out_off);
    lucid_tensor *o1[OP_N], *o0[OP_N];
    unsigned long l1[L_N], l0[L_N];
    const char *what = "";
    lucid_status st;
    if (!in.hx1 || !in.hx2 || !in.hdy || !in.hw || !in.hb || !in.hrm || !in.hrv || !in.hnb ||
        !in.hbdx || !in.hbdw || !in.hbdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK(NAME("%s: launch-count hook linked", pre), lucid_cuda_bn_launch_count != NULL,
          "lucid_cuda_bn_launch_count missing (cuda/nn_norm_fwd.cu)");
    set_coop(0); /* multi-part shapes: the two-launch route on both sides */
    set_onepass(2);
    st = onepass_run(&in, o1, l1, NULL, NULL, NULL, NULL, &what);
    if (st != LUCID_OK) {
        TEST_FAIL(NAME("%s: one pass: %s", pre, what), "%s: %s", lucid_status_name(st),
                  lucid_ctx_error(ctx));
        goto done;
    }
    set_onepass(0);
    st = onepass_run(&in, o0, l0, NULL, NULL, NULL, NULL, &what);
    set_onepass(1);
    if (st != LUCID_OK) {
        TEST_FAIL(NAME("%s: two launches: %s", pre, what), "%s: %s", lucid_status_name(st),
                  lucid_ctx_error(ctx));
        goto done;
    }
    for (int k = 0; k < OP_N; k++)
        if (o1[k]) cmp_bits(NAME("%s: %s bitwise", pre, OP_NAMES[k]), o1[k], phost(o0[k]));
    /* the one pass without its held vectors (LUCID_BN_HELD=0: x and dy read
     * again for y and dx) gives the same bits and launches */
    {
        lucid_tensor *oh[OP_N];
        unsigned long lh[L_N];
        setenv("LUCID_BN_HELD", "0", 1);
        set_onepass(2);
        st = onepass_run(&in, oh, lh, NULL, NULL, NULL, NULL, &what);
        set_onepass(1);
        unsetenv("LUCID_BN_HELD");
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: one pass, LUCID_BN_HELD=0: %s", pre, what), "%s: %s",
                      lucid_status_name(st), lucid_ctx_error(ctx));
            goto done;
        }
        for (int k = 0; k < OP_N; k++)
            if (o1[k])
                cmp_bits(NAME("%s: %s bitwise (LUCID_BN_HELD=0)", pre, OP_NAMES[k]), o1[k],
                         phost(oh[k]));
        for (int k = 0; k < L_N; k++)
            CHECK(NAME("%s: %s launches (LUCID_BN_HELD=0)", pre, L_NAMES[k]), lh[k] == l1[k],
                  "%lu with the held vectors, %lu without", l1[k], lh[k]);
    }
    /* launches: the switch changes only one-part training calls with dx */
    for (int k = 0; k < L_N; k++) {
        if (!affine && (k == L_BWD_DW || k == L_BWD_DB)) continue;
        int fused = one && l_fusable(k);
        unsigned long want0 = k == L_BWD_DW || k == L_BWD_DB ? 1
                              : k == L_EVAL_B                ? (affine ? 2 : 1)
                                                             : 2;
        unsigned long want1 = fused ? 1 : want0;
        CHECK(NAME("%s: %s launches %lu (one pass) / %lu (LUCID_BN_ONEPASS=0)", pre,
                   L_NAMES[k], want1, want0),
              l1[k] == want1 && l0[k] == want0, "one pass %lu, two-launch route %lu", l1[k],
              l0[k]);
    }
    /* the one-pass side against the CPU */
    route_vs_cpu(pre, "one-pass", &in, o1);
done:
    set_onepass(1);
    set_coop(1);
    pool_free();
}

/* Graph capture of both routes: an eager warm-up of each, then one capture
 * holding a training forward + backward (every output) on the one-pass
 * route (LUCID_BN_ONEPASS unset) and the same calls on the two-launch
 * route (set to "0" between the calls while capturing: the switch is read
 * per call), replayed once: both replays equal the eager one-pass call
 * bitwise (y, statistics, running stats after one update,
 * num_batches_tracked, dx, dweight, dbias), and the capture queued the
 * same number of kernels as the eager calls. */
static void test_onepass_capture(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H,
                                 int64_t W) {
    char pre[128];
    snprintf(pre, sizeof pre, "bn one-pass capture%s %lldx%lldx%lldx%lld %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const lucid_dtype F = LUCID_F32;
    lucid_graph *g = NULL;
    lucid_tensor *hw = phrand(F, 1, cs, 0.5, 1.5), *hb = phrand(F, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(F, 1, cs, -0.2, 0.2), *hrv = phrand(F, 1, cs, 0.5, 2);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *gx = pdev(hx), *gdy = pdev(hdy);
    /* [0]: eager one pass, [1]: eager two launches, [2]: recorded one pass,
     * [3]: recorded two launches */
    lucid_tensor *rm[4], *rv[4], *nb[4], *sm[4], *si[4], *y[4], *dx[4], *dw[4], *db[4];
    unsigned long nl[4] = {0, 0, 0, 0};
    int okk = gw && gb && gx && gdy;
    for (int k = 0; k < 4; k++) {
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
    set_coop(0); /* multi-part shapes: the two-launch route on both sides */
    for (int k = 0; k < 2; k++) {
        set_onepass(k == 0 ? 1 : 0);
        unsigned long n0 = bn_launches();
        RUN(NAME("%s: eager forward %d", pre, k),
            bn_fwd(silu, gx, y[k], gw, gb, rm[k], rv[k], nb[k], sm[k], si[k], 1));
        RUN(NAME("%s: eager backward %d", pre, k),
            bn_bwd(silu, gx, gdy, dx[k], gw, gb, sm[k], si[k], dw[k], db[k], 1, 0.0, 0.0));
        nl[k] = bn_launches() - n0;
    }
    set_onepass(1);
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    for (int k = 2; k < 4; k++) {
        set_onepass(k == 2 ? 1 : 0);
        unsigned long n0 = bn_launches();
        lucid_status s1 = bn_fwd(silu, gx, y[k], gw, gb, rm[k], rv[k], nb[k], sm[k], si[k], 1);
        lucid_status s2 =
            s1 ? s1 : bn_bwd(silu, gx, gdy, dx[k], gw, gb, sm[k], si[k], dw[k], db[k], 1, 0.0,
                             0.0);
        nl[k] = bn_launches() - n0;
        if (s2 != LUCID_OK) {
            set_onepass(1);
            TEST_FAIL(NAME("%s: calls while capturing (%s)", pre, k == 2 ? "one pass" : "two launches"),
                      "%s: %s", lucid_status_name(s2), lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    set_onepass(1);
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    {
        const int onep = N * H * W <= 8192;
        unsigned long w1 = onep ? 2 : 4;
        CHECK(NAME("%s: kernels per forward+backward: %lu one pass, 4 two launches, "
                   "eager = recorded",
                   pre, w1),
              nl[0] == w1 && nl[2] == w1 && nl[1] == 4 && nl[3] == 4,
              "eager %lu / %lu, recorded %lu / %lu", nl[0], nl[1], nl[2], nl[3]);
    }
    for (int k = 1; k < 4; k++) {
        const char *tag = k == 1 ? "eager two launches" : k == 2 ? "replay one pass"
                                                                 : "replay two launches";
        cmp_bits(NAME("%s: %s y = eager one pass", pre, tag), y[k], phost(y[0]));
        cmp_bits(NAME("%s: %s save_mean = eager one pass", pre, tag), sm[k], phost(sm[0]));
        cmp_bits(NAME("%s: %s save_invstd = eager one pass", pre, tag), si[k], phost(si[0]));
        cmp_bits(NAME("%s: %s running_mean = eager one pass", pre, tag), rm[k], phost(rm[0]));
        cmp_bits(NAME("%s: %s running_var = eager one pass", pre, tag), rv[k], phost(rv[0]));
        cmp_bits(NAME("%s: %s num_batches_tracked = eager one pass", pre, tag), nb[k],
                 phost(nb[0]));
        cmp_bits(NAME("%s: %s dx = eager one pass", pre, tag), dx[k], phost(dx[0]));
        cmp_bits(NAME("%s: %s dweight = eager one pass", pre, tag), dw[k], phost(dw[0]));
        cmp_bits(NAME("%s: %s dbias = eager one pass", pre, tag), db[k], phost(db[0]));
    }
done:
    set_onepass(1);
    set_coop(1);
    if (g) lucid_graph_destroy(g);
    pool_free();
}

/* ========== one cooperative launch = two launches (LUCID_BN_COOP)
 * cuda/nn_norm_*.cu run the training forward and the training backward with
 * dx of channels of SEVERAL parts as one cooperative launch each when the
 * grid is co-resident on the device; when the full grid (parts x
 * min(C, 65535) blocks) is not, a grid of fewer channel columns whose
 * blocks loop over the channels of their column (rounds; bn_coop_rounds,
 * cuda/nn_norm.cuh; LUCID_BN_COOP_LOOP=0: the full grid or two launches);
 * LUCID_BN_COOP=0 keeps the two-launch route.  Each case runs the calls of
 * onepass_run (the one-pass cases' header) on the default route three
 * times, once with LUCID_BN_COOP=0, once with LUCID_BN_HELD=0 (x and dy
 * read again after the channel barrier) and once with
 * LUCID_BN_COOP_LOOP=0, plain BatchNorm2d or the fused BatchNorm2d + SiLU:
 *   bitwise        every output of the default route equals the two-launch
 *                  route's; the second and third runs equal the first (the
 *                  arrival counters are back at zero after every launch, and
 *                  the "last block folds" calls between them, dweight only
 *                  and dbias only, share them); LUCID_BN_HELD=0 and
 *                  LUCID_BN_COOP_LOOP=0 too (the rounds change no bit)
 *   cpu            the default route's outputs against the CPU reference
 *                  (route_vs_cpu: test_case's tolerances)
 *   launches       a training call with dx that took the cooperative route
 *                  (nn_norm_fwd.cu's test hook lucid_cuda_bn_coop_count)
 *                  queued 1 kernel, 2 otherwise; LUCID_BN_COOP=0 never takes
 *                  it (2); dweight / dbias only and eval the same on both
 *                  routes; the three default runs take the same route
 *   grid           a cooperative call's grid (the test hook
 *                  lucid_cuda_bn_coop_last_grid) has one block per part
 *                  (grid.x = parts, coop_parts) and 1..min(C, 65535)
 *                  channel columns spread evenly over its rounds
 *                  (gy = ceil(cy / ceil(cy / gy))); the three default runs
 *                  have the same grid; LUCID_BN_COOP_LOOP=0 takes the
 *                  cooperative route exactly when the default one did with
 *                  every column (one round), on the same grid
 *   route taken    rf / rb (forward / backward) on an sm_90+ device of 132
 *                  SMs (H100 SXM, H200; lucid_cuda_bn_coop_sm_count): the
 *                  rounds expected there (0: the two-launch route; -1: not
 *                  asserted) from the register counts of nvcc 13.0 (see
 *                  cuda/nn_norm.cuh: 4 blocks per SM, 528 co-resident, for
 *                  the held forward and the backward's lean copies, 5 (660)
 *                  for the plain forward reading x again); on other
 *                  devices the route taken is only reported
 * Shapes: N=4 of YOLO11n-pose at 640: 4x64x80x80 (4 parts a channel, 256
 * blocks), 4x32x160x160 (16 parts, 512 blocks), 4x16x320x320 (layer 0: 52
 * parts, 832 blocks: 2 rounds of 8 columns, 416 blocks, on 132 SMs);
 * 3x5x90x100 (S 9000: 2 chunks a plane, vector path), 3x5x91x99 (S 9009:
 * scalar path), 2x3x80x80 with y/dx and with every activation at element
 * offset 1, 5x2x160x330 (35 parts: the fold across warps), 300x1x64x72
 * (300 parts: more than the fold's 256 threads).  Around the thresholds on
 * 132 SMs (bf16): 4x10x320x320 (520 blocks: the full grid fits, one
 * round), 4x11x320x320 (572: 2 rounds of 6 columns, or the plain forward's
 * full grid at 5 blocks per SM), 40x2x320x320 (520 parts: one column fits,
 * 2 rounds of 1) and 41x2x320x320 (533 parts: no column fits at 4 blocks
 * per SM, the two-launch route but for the plain forward at 5). */

/* the multiprocessors of a device that takes the cooperative kernels, else
 * 0 (nn_norm_fwd.cu's test hook) */
static int coop_sms(void) {
    return lucid_cuda_bn_coop_sm_count ? lucid_cuda_bn_coop_sm_count() : 0;
}

/* Parts per channel of cuda/nn_norm.cuh's partition (bn_geom_of; S = H*W):
 * a plane of S >= 8192 elements cut into ceil(S/chunk) chunks (chunk =
 * ceil(S / ceil(S/8192)) rounded up to a multiple of 8), one part per
 * (plane, chunk); smaller planes floor(8192/S) (at most N) to a part. */
static int64_t coop_parts(int64_t N, int64_t S) {
    if (S >= 8192) {
        int64_t p0 = (S + 8191) / 8192, ch = (S + p0 - 1) / p0;
        ch = (ch + 7) / 8 * 8;
        return N * ((S + ch - 1) / ch);
    }
    int64_t pp = 8192 / S;
    if (pp > N) pp = N;
    return (N + pp - 1) / pp;
}

/* The rounds of a cooperative grid over cy channels with gy columns (0
 * when gy is 0: no cooperative launch). */
static int64_t coop_rounds_of(int64_t cy, unsigned gy) {
    return gy ? (cy + gy - 1) / gy : 0;
}

static void test_coop(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H, int64_t W,
                      int64_t in_off, int64_t out_off, int rf, int rb) {
    char pre[192];
    snprintf(pre, sizeof pre, "bn coop = two launches%s %lldx%lldx%lldx%lld%s %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             in_off || out_off ? (in_off ? " x/dy/y/dx at offset 1" : " y/dx at offset 1") : "",
             lucid_dtype_name(dt));
    bn_in in;
    bn_in_draw(&in, dt, silu, 1, N, C, H, W, in_off, out_off);
    const int64_t parts = coop_parts(N, H * W), cy = C < 65535 ? C : 65535;
    /* [0..2]: the default route three times, [3]: LUCID_BN_COOP=0,
     * [4]: LUCID_BN_HELD=0, [5]: LUCID_BN_COOP_LOOP=0 */
    enum { NR = 6, R_OFF = 3, R_HELD = 4, R_LOOP = 5 };
    lucid_tensor *o[NR][OP_N];
    unsigned long l[NR][L_N], c[NR][L_N];
    coop_grid cg[NR][L_N];
    static const char *const RUNS[NR] = {"default", "default (run 2)", "default (run 3)",
                                         "LUCID_BN_COOP=0", "LUCID_BN_HELD=0",
                                         "LUCID_BN_COOP_LOOP=0"};
    const char *what = "";
    if (!in.hx1 || !in.hx2 || !in.hdy || !in.hw || !in.hb || !in.hrm || !in.hrv || !in.hnb ||
        !in.hbdx || !in.hbdw || !in.hbdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK(NAME("%s: coop-count and grid hooks linked", pre),
          lucid_cuda_bn_coop_count != NULL && lucid_cuda_bn_coop_last_grid != NULL,
          "lucid_cuda_bn_coop_count / lucid_cuda_bn_coop_last_grid missing "
          "(cuda/nn_norm_fwd.cu)");
    for (int r = 0; r < NR; r++) {
        set_coop(r == R_OFF ? 0 : 1);
        if (r == R_HELD) setenv("LUCID_BN_HELD", "0", 1);
        /* the rounds are opt-in (nn_norm.cuh): on for every run but R_LOOP */
        setenv("LUCID_BN_COOP_LOOP", r == R_LOOP ? "0" : "1", 1);
        lucid_status st = onepass_run(&in, o[r], l[r], c[r], cg[r], NULL, NULL, &what);
        unsetenv("LUCID_BN_HELD");
        unsetenv("LUCID_BN_COOP_LOOP");
        set_coop(1);
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: %s: %s", pre, RUNS[r], what), "%s: %s", lucid_status_name(st),
                      lucid_ctx_error(ctx));
            goto done;
        }
    }
    /* every run against the first default one */
    for (int k = 0; k < OP_N; k++) {
        lucid_tensor *ref = phost(o[0][k]);
        if (!ref) {
            TEST_FAIL(NAME("%s: copy of %s", pre, OP_NAMES[k]), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        for (int r = 1; r < NR; r++)
            cmp_bits(NAME("%s: %s %s = default (bitwise)", pre, RUNS[r], OP_NAMES[k]), o[r][k],
                     ref);
    }
    /* the default route against the CPU */
    route_vs_cpu(pre, "default", &in, o[0]);
    /* launches per call, and the route taken */
    for (int k = 0; k < L_N; k++) {
        unsigned long want0 = k == L_BWD_DW || k == L_BWD_DB ? 1 : 2;
        int took = c[0][k] == 1;
        unsigned long want1 = l_fusable(k) && took ? 1 : want0;
        CHECK(NAME("%s: %s launches: %lu (default, %s) / %lu (LUCID_BN_COOP=0)", pre,
                   L_NAMES[k], want1, took ? "cooperative" : "two-launch route", want0),
              l[0][k] == want1 && l[R_OFF][k] == want0 && c[R_OFF][k] == 0 &&
                  (l_fusable(k) ? c[0][k] <= 1 : c[0][k] == 0),
              "default %lu (%lu cooperative), LUCID_BN_COOP=0 %lu (%lu cooperative)", l[0][k],
              c[0][k], l[R_OFF][k], c[R_OFF][k]);
        CHECK(NAME("%s: %s: every default run and LUCID_BN_HELD=0 take one route", pre,
                   L_NAMES[k]),
              l[1][k] == l[0][k] && l[2][k] == l[0][k] && l[R_HELD][k] == l[0][k] &&
                  c[1][k] == c[0][k] && c[2][k] == c[0][k] && c[R_HELD][k] == c[0][k],
              "launches %lu %lu %lu %lu, cooperative %lu %lu %lu %lu", l[0][k], l[1][k], l[2][k],
              l[R_HELD][k], c[0][k], c[1][k], c[2][k], c[R_HELD][k]);
        if (!l_fusable(k)) continue;
        /* the grid of the cooperative calls */
        const coop_grid g0 = cg[0][k], gl = cg[R_LOOP][k];
        const int64_t rounds = coop_rounds_of(cy, g0.y);
        if (took)
            CHECK(NAME("%s: %s grid: %lld parts x 1..%lld columns, spread evenly over the rounds",
                       pre, L_NAMES[k], (long long)parts, (long long)cy),
                  g0.x == (unsigned)parts && g0.y >= 1 && (int64_t)g0.y <= cy &&
                      (int64_t)g0.y == (cy + rounds - 1) / rounds,
                  "grid %u x %u (%lld rounds)", g0.x, g0.y, (long long)rounds);
        CHECK(NAME("%s: %s: every default run has one grid", pre, L_NAMES[k]),
              cg[1][k].x == g0.x && cg[1][k].y == g0.y && cg[2][k].x == g0.x &&
                  cg[2][k].y == g0.y,
              "grids %ux%u %ux%u %ux%u", g0.x, g0.y, cg[1][k].x, cg[1][k].y, cg[2][k].x,
              cg[2][k].y);
        {
            const int full = took && (int64_t)g0.y == cy; /* one round */
            CHECK(NAME("%s: %s: LUCID_BN_COOP_LOOP=0 cooperative exactly on one round (%s), "
                       "same grid, %lu launches",
                       pre, L_NAMES[k], full ? "yes" : "no", full ? 1ul : 2ul),
                  c[R_LOOP][k] == (unsigned long)full && l[R_LOOP][k] == (full ? 1ul : 2ul) &&
                      (!full || (gl.x == g0.x && gl.y == g0.y)),
                  "default %s %ux%u, LUCID_BN_COOP_LOOP=0 %lu cooperative (%ux%u), %lu launches",
                  took ? "cooperative" : "two launches", g0.x, g0.y, c[R_LOOP][k], gl.x, gl.y,
                  l[R_LOOP][k]);
        }
    }
    {
        int fwd = c[0][L_FWD] == 1, bwd = c[0][L_BWD] == 1;
        int64_t rfg = fwd ? coop_rounds_of(cy, cg[0][L_FWD].y) : 0;
        int64_t rbg = bwd ? coop_rounds_of(cy, cg[0][L_BWD].y) : 0;
        CHECK(NAME("%s: one route per direction (backward calls with dx agree)", pre),
              c[0][L_BWD_DX] == c[0][L_BWD] && c[0][L_BWD_BETA] == c[0][L_BWD] &&
                  c[0][L_BWD_BETA1] == c[0][L_BWD] && cg[0][L_BWD_DX].y == cg[0][L_BWD].y &&
                  cg[0][L_BWD_BETA].y == cg[0][L_BWD].y &&
                  cg[0][L_BWD_BETA1].y == cg[0][L_BWD].y,
              "cooperative: backward %lu, dx only %lu, beta %lu, beta 1 %lu", c[0][L_BWD],
              c[0][L_BWD_DX], c[0][L_BWD_BETA], c[0][L_BWD_BETA1]);
        int sms = coop_sms();
        if (sms == 132) {
            CHECK(NAME("%s: rounds on 132 SMs: forward %d, backward %d (0: two launches, "
                       "-1: not asserted)",
                       pre, rf, rb),
                  (rf < 0 || rfg == rf) && (rb < 0 || rbg == rb), "forward %lld, backward %lld",
                  (long long)rfg, (long long)rbg);
        } else {
            TEST_SKIP(NAME("%s: route expectations (132-SM sm_90+ device)", pre),
                      "%d SMs with cooperative launch; rounds: forward %lld, backward %lld "
                      "(0: two launches)",
                      sms, (long long)rfg, (long long)rbg);
        }
    }
done:
    set_coop(1);
    unsetenv("LUCID_BN_HELD");
    unsetenv("LUCID_BN_COOP_LOOP");
    pool_free();
}

/* the tensors of test_coop_capture's forward + backward */
enum { T_Y, T_SM, T_SI, T_RM, T_RV, T_NB, T_DX, T_DW, T_DB, T_N };
static const char *const T_NAMES[T_N] = {"y", "save_mean", "save_invstd", "running_mean",
                                         "running_var", "num_batches_tracked", "dx", "dweight",
                                         "dbias"};

/* A training forward then backward (every output, beta 0) into t[T_*]. */
static lucid_status coop_fwd_bwd(int silu, const lucid_tensor *x, const lucid_tensor *dy,
                                 const lucid_tensor *w, const lucid_tensor *b,
                                 lucid_tensor **t) {
    lucid_status s = bn_fwd(silu, x, t[T_Y], w, b, t[T_RM], t[T_RV], t[T_NB], t[T_SM],
                            t[T_SI], 1);
    if (s != LUCID_OK) return s;
    return bn_bwd(silu, x, dy, t[T_DX], w, b, t[T_SM], t[T_SI], t[T_DW], t[T_DB], 1, 0.0, 0.0);
}

/* Graph capture of the cooperative route: an eager forward + backward
 * (every output, beta 0) on the default route (also the warm-up), its
 * outputs kept, and a second eager call; then one capture holding the same
 * calls on the default route and on LUCID_BN_COOP=0 (the switch flipped
 * while recording: it is read per call), replayed twice.  The first replay
 * of each equals the first eager call bitwise (y, statistics, running
 * stats, num_batches_tracked, dx, dweight, dbias), the second the second
 * eager call (running stats of two updates, num_batches_tracked 2: the
 * counters are back at zero after a replay); the capture recorded as many
 * kernels as the eager call queued, and 4 on LUCID_BN_COOP=0; want as for
 * test_coop (on a 132-SM sm_90+ device, the directions that take the
 * cooperative route). */
static void test_coop_capture(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H,
                              int64_t W, int want) {
    char pre[128];
    snprintf(pre, sizeof pre, "bn coop capture%s %lldx%lldx%lldx%lld %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const lucid_dtype F = LUCID_F32;
    lucid_graph *g = NULL;
    lucid_tensor *hw = phrand(F, 1, cs, 0.5, 1.5), *hb = phrand(F, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(F, 1, cs, -0.2, 0.2), *hrv = phrand(F, 1, cs, 0.5, 2);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *gx = pdev(hx), *gdy = pdev(hdy);
    /* [0]: eager (default route), [1]: recorded default, [2]: recorded
     * LUCID_BN_COOP=0; snap: [0] after its first call */
    lucid_tensor *t[3][T_N], *snap[T_N];
    unsigned long nl[3] = {0, 0, 0}, nc[3] = {0, 0, 0};
    int okk = gw && gb && gx && gdy;
    for (int k = 0; k < 3; k++) {
        t[k][T_RM] = pdev(hrm), t[k][T_RV] = pdev(hrv), t[k][T_NB] = pdev(hnb);
        t[k][T_SM] = pdpoison(F, 1, cs), t[k][T_SI] = pdpoison(F, 1, cs);
        t[k][T_Y] = pdpoison(dt, 4, xs), t[k][T_DX] = pdpoison(dt, 4, xs);
        t[k][T_DW] = pdpoison(F, 1, cs), t[k][T_DB] = pdpoison(F, 1, cs);
        for (int j = 0; j < T_N; j++) okk = okk && t[k][j];
    }
    if (!okk) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    set_coop(1);
    {
        unsigned long n0 = bn_launches(), c0 = bn_coops();
        RUN(NAME("%s: eager forward + backward", pre), coop_fwd_bwd(silu, gx, gdy, gw, gb, t[0]));
        nl[0] = bn_launches() - n0;
        nc[0] = bn_coops() - c0;
    }
    for (int j = 0; j < T_N; j++) {
        snap[j] = phost(t[0][j]);
        if (!snap[j]) {
            TEST_FAIL(NAME("%s: snapshot %s", pre, T_NAMES[j]), "%s", lucid_ctx_error(ctx));
            goto done;
        }
    }
    RUN(NAME("%s: eager forward + backward 2", pre), coop_fwd_bwd(silu, gx, gdy, gw, gb, t[0]));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    for (int k = 1; k < 3; k++) {
        set_coop(k == 1 ? 1 : 0);
        unsigned long n0 = bn_launches(), c0 = bn_coops();
        lucid_status st = coop_fwd_bwd(silu, gx, gdy, gw, gb, t[k]);
        nl[k] = bn_launches() - n0;
        nc[k] = bn_coops() - c0;
        set_coop(1);
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing (%s)", pre,
                           k == 1 ? "default" : "LUCID_BN_COOP=0"),
                      "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    /* each cooperative launch stands for two kernels */
    CHECK(NAME("%s: kernels recorded = queued eagerly (%lu, %lu cooperative), 4 with "
               "LUCID_BN_COOP=0",
               pre, nl[0], nc[0]),
          nl[1] == nl[0] && nc[1] == nc[0] && nl[0] == 4 - nc[0] && nl[2] == 4 && nc[2] == 0,
          "eager %lu (%lu cooperative), recorded %lu (%lu) / %lu (%lu)", nl[0], nc[0], nl[1],
          nc[1], nl[2], nc[2]);
    if (coop_sms() == 132) {
        unsigned long w = (unsigned long)((want & 1) + ((want >> 1) & 1));
        CHECK(NAME("%s: %lu cooperative kernels recorded (132 SMs)", pre, w), nc[1] == w,
              "%lu", nc[1]);
    }
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < T_N; j++)
            cmp_bits(NAME("%s: replay %s %s = eager call 1", pre,
                          k == 1 ? "default" : "LUCID_BN_COOP=0", T_NAMES[j]),
                     t[k][j], snap[j]);
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < T_N; j++)
            cmp_bits(NAME("%s: replay 2 %s %s = eager call 2", pre,
                          k == 1 ? "default" : "LUCID_BN_COOP=0", T_NAMES[j]),
                     t[k][j], phost(t[0][j]));
    {
        lucid_tensor *nb = phost(t[1][T_NB]);
        CHECK(NAME("%s: replay 2 num_batches_tracked == 2", pre),
              nb && test_hget(nb, 0) == 2.0, "num_batches_tracked %g",
              nb ? test_hget(nb, 0) : -1.0);
    }
done:
    set_coop(1);
    if (g) lucid_graph_destroy(g);
    pool_free();
}

/* ============ one cluster launch = two launches (LUCID_BN_CLUSTER)
 * cuda/nn_norm_*.cu run the training forward and the training backward with
 * dx of channels of SEVERAL parts (2..128) as one launch each on
 * thread-block clusters where the device takes cluster launches (sm_90+):
 * a cluster of cs blocks per channel row, block r computing parts r, r +
 * cs, ..., the partials folded from the blocks' shared memory (cuda/
 * nn_norm.cuh, bn_clu_size: cs = ceil(parts / ceil(parts / 16)), else the
 * portable 8's).  Each case runs the calls of onepass_run (the one-pass
 * cases' header) with the context's cluster route on
 * (lucid_cuda_nn_set_bn_cluster 2) twice, once with LUCID_BN_HELD=0 (x and
 * dy read again) and once with at most 3 channel columns
 * (lucid_cuda_bn_cluster_cap_columns: the kernels' channel loop, several
 * channels per cluster, the two partial buffers in turn), all with
 * LUCID_BN_COOP=0 (a shape the cluster route does not take runs two
 * launches), and once with the route off and LUCID_BN_COOP=0 (the
 * two-launch route), plain BatchNorm2d or the fused BatchNorm2d + SiLU:
 *   bitwise        every output of every cluster run (y, save_mean,
 *                  save_invstd, running stats of two updates,
 *                  num_batches_tracked, dx, dweight, dbias; beta 0,
 *                  0.5/0.25 and 1 onto random values; dx / dweight /
 *                  dbias only; eval) equals the two-launch route's
 *   cpu            the first cluster run's outputs against the CPU
 *                  reference (route_vs_cpu: test_case's tolerances)
 *   launches       a training call with dx that took the cluster route
 *                  (lucid_cuda_bn_cluster_count) queued 1 kernel, the
 *                  others as many as on the two-launch route and no
 *                  cluster launch; every cluster run takes one route; on
 *                  a device with cluster launch, the shapes of 2..128
 *                  parts take it in both directions, the others never
 *   grid           a cluster call's cluster size is the rule's for 16 or
 *                  for 8 blocks (on a 132-SM device: the one for 16) and
 *                  its columns min(C, 65535), or min(C, 3) when capped
 * Shapes: parts 2 (2x3x80x80, also with y/dx and with every activation at
 * element offset 1), 4 (4x64x80x80), 6 (3x5x91x99, scalar), 8 (8x3x80x80,
 * 2x3x181x181 scalar), 16 (4x32x160x160; 4x64x160x160, 1024 blocks, bf16
 * only), 17 (17x2x64x128,
 * 17x3x90x91 scalar: 2 rounds of 9), 35 (5x2x160x330: the fold across
 * warps, 3 rounds of 12), 52 (4x16x320x320, layer 0: 4 rounds of 13), 300
 * (300x1x64x72: not taken).  Without the hooks (a build without them) the
 * case fails visibly. */

/* cuda/nn_norm.cuh's bn_clu_size (the test's copy): cs for a channel of
 * `parts` parts with clusters of at most csmax blocks, 0 when parts < 2 or
 * more than 8 rounds would be needed. */
static unsigned clu_size(int64_t parts, unsigned csmax) {
    if (parts < 2) return 0;
    int64_t r = (parts + csmax - 1) / csmax;
    if (r > 8) return 0;
    return (unsigned)((parts + r - 1) / r);
}

/* the multiprocessors of a device that takes cluster launches, else 0
 * (nn_norm_fwd.cu's test hook) */
static int cluster_sms(void) {
    return lucid_cuda_bn_cluster_sm_count ? lucid_cuda_bn_cluster_sm_count() : 0;
}

static void test_cluster(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H, int64_t W,
                         int64_t in_off, int64_t out_off) {
    char pre[192];
    snprintf(pre, sizeof pre, "bn cluster = two launches%s %lldx%lldx%lldx%lld%s %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             in_off || out_off ? (in_off ? " x/dy/y/dx at offset 1" : " y/dx at offset 1") : "",
             lucid_dtype_name(dt));
    bn_in in;
    bn_in_draw(&in, dt, silu, 1, N, C, H, W, in_off, out_off);
    const int64_t parts = coop_parts(N, H * W), cy = C < 65535 ? C : 65535;
    const unsigned CAP = 3;
    /* [0], [1]: cluster route, [2]: LUCID_BN_HELD=0, [3]: columns capped,
     * [4]: the two-launch route (reference) */
    enum { NR = 5, R_HELD = 2, R_CAP = 3, R_REF = 4 };
    static const char *const RUNS[NR] = {"cluster", "cluster (run 2)", "cluster LUCID_BN_HELD=0",
                                         "cluster, 3 columns", "two launches"};
    lucid_tensor *o[NR][OP_N];
    unsigned long l[NR][L_N], k[NR][L_N];
    coop_grid kg[NR][L_N];
    const char *what = "";
    if (!in.hx1 || !in.hx2 || !in.hdy || !in.hw || !in.hb || !in.hrm || !in.hrv || !in.hnb ||
        !in.hbdx || !in.hbdw || !in.hbdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!lucid_cuda_bn_cluster_count || !lucid_cuda_bn_cluster_last_grid ||
        !lucid_cuda_nn_set_bn_cluster || !lucid_cuda_bn_cluster_cap_columns) {
        TEST_FAIL(NAME("%s: cluster hooks linked", pre), "%s",
                  "lucid_cuda_bn_cluster_* / lucid_cuda_nn_set_bn_cluster missing "
                  "(cuda/nn_norm_fwd.cu, cuda/nn_table.cu)");
        goto done;
    }
    set_coop(0);
    for (int r = 0; r < NR; r++) {
        set_cluster(r == R_REF ? 1 : 2);
        if (r == R_HELD) setenv("LUCID_BN_HELD", "0", 1);
        if (r == R_CAP) lucid_cuda_bn_cluster_cap_columns(CAP);
        lucid_status st = onepass_run(&in, o[r], l[r], NULL, NULL, k[r], kg[r], &what);
        lucid_cuda_bn_cluster_cap_columns(0);
        unsetenv("LUCID_BN_HELD");
        set_cluster(0);
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: %s: %s", pre, RUNS[r], what), "%s: %s", lucid_status_name(st),
                      lucid_ctx_error(ctx));
            goto done;
        }
    }
    set_coop(1);
    /* every run against the two-launch route */
    for (int j = 0; j < OP_N; j++) {
        lucid_tensor *ref = phost(o[R_REF][j]);
        if (!ref) {
            TEST_FAIL(NAME("%s: copy of %s", pre, OP_NAMES[j]), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        for (int r = 0; r < R_REF; r++)
            cmp_bits(NAME("%s: %s %s = two launches (bitwise)", pre, RUNS[r], OP_NAMES[j]),
                     o[r][j], ref);
    }
    route_vs_cpu(pre, "cluster", &in, o[0]);
    {
        const int sms = cluster_sms();
        const unsigned c16 = clu_size(parts, 16), c8 = clu_size(parts, 8);
        const int elig = c16 != 0 || c8 != 0;
        for (int j = 0; j < L_N; j++) {
            const int took = k[0][j] == 1;
            const unsigned long want = l_fusable(j) && took ? 1 : l[R_REF][j];
            CHECK(NAME("%s: %s launches: %lu (%s) / %lu (two launches)", pre, L_NAMES[j], want,
                       took ? "cluster" : "not taken", l[R_REF][j]),
                  l[0][j] == want && k[R_REF][j] == 0 && (l_fusable(j) ? k[0][j] <= 1
                                                                        : k[0][j] == 0),
                  "cluster run %lu (%lu cluster), two launches %lu (%lu cluster)", l[0][j],
                  k[0][j], l[R_REF][j], k[R_REF][j]);
            CHECK(NAME("%s: %s: every cluster run takes one route", pre, L_NAMES[j]),
                  l[1][j] == l[0][j] && l[R_HELD][j] == l[0][j] && l[R_CAP][j] == l[0][j] &&
                      k[1][j] == k[0][j] && k[R_HELD][j] == k[0][j] && k[R_CAP][j] == k[0][j],
                  "launches %lu %lu %lu %lu, cluster %lu %lu %lu %lu", l[0][j], l[1][j],
                  l[R_HELD][j], l[R_CAP][j], k[0][j], k[1][j], k[R_HELD][j], k[R_CAP][j]);
            if (!l_fusable(j)) continue;
            if (sms > 0)
                CHECK(NAME("%s: %s: cluster route %s (%lld parts, device with cluster launch)",
                           pre, L_NAMES[j], elig ? "taken" : "not taken", (long long)parts),
                      took == elig, "cluster launches %lu", k[0][j]);
            if (!took) continue;
            const coop_grid g0 = kg[0][j], gc = kg[R_CAP][j];
            const unsigned wy = (unsigned)cy, wcy = (unsigned)(cy < CAP ? cy : CAP);
            CHECK(NAME("%s: %s grid: cluster of %u (or %u) blocks x %u columns, %u capped", pre,
                       L_NAMES[j], c16, c8, wy, wcy),
                  (g0.x == c16 || g0.x == c8) && g0.y == wy && gc.x == g0.x && gc.y == wcy &&
                      kg[1][j].x == g0.x && kg[1][j].y == g0.y,
                  "grid %u x %u, capped %u x %u, run 2 %u x %u", g0.x, g0.y, gc.x, gc.y,
                  kg[1][j].x, kg[1][j].y);
            if (sms == 132)
                CHECK(NAME("%s: %s: cluster of %u blocks (132 SMs: the non-portable size "
                           "rule)", pre, L_NAMES[j], c16),
                      g0.x == c16, "cluster of %u", g0.x);
        }
        if (sms <= 0)
            TEST_SKIP(NAME("%s: route expectations (device with cluster launch)", pre),
                      "no cluster launch; cluster launches: forward %lu, backward %lu",
                      k[0][L_FWD], k[0][L_BWD]);
    }
done:
    if (lucid_cuda_bn_cluster_cap_columns) lucid_cuda_bn_cluster_cap_columns(0);
    set_cluster(0);
    set_coop(1);
    unsetenv("LUCID_BN_HELD");
    pool_free();
}

/* Graph capture of the cluster route: an eager forward + backward (every
 * output, beta 0) with the cluster route on (also the warm-up: the route's
 * cluster occupancy is asked there, never inside a capture), its outputs
 * kept, and a second eager call; then one capture holding the same calls
 * with the route on and with it off (the two-launch route; the context's
 * setting flipped while recording), replayed twice, all with
 * LUCID_BN_COOP=0 (so that the cluster kernels are the only one-launch
 * route):
 * the first replay of each equals the first eager call bitwise (y,
 * statistics, running stats, num_batches_tracked, dx, dweight, dbias), the
 * second the second eager call (running stats of two updates,
 * num_batches_tracked 2); the capture recorded as many kernels and cluster
 * kernels as the eager call queued, 4 and none on the two-launch route; on
 * a device with cluster launch, 2 cluster kernels.  cap: at most cap
 * channel columns for every call (0: none). */
static void test_cluster_capture(lucid_dtype dt, int silu, int64_t N, int64_t C, int64_t H,
                                 int64_t W, unsigned cap) {
    char pre[128];
    snprintf(pre, sizeof pre, "bn cluster capture%s %lldx%lldx%lldx%lld%s %s",
             silu ? " (+silu)" : "", (long long)N, (long long)C, (long long)H, (long long)W,
             cap ? ", 3 columns" : "", lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const lucid_dtype F = LUCID_F32;
    lucid_graph *g = NULL;
    lucid_tensor *hw = phrand(F, 1, cs, 0.5, 1.5), *hb = phrand(F, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = phrand(F, 1, cs, -0.2, 0.2), *hrv = phrand(F, 1, cs, 0.5, 2);
    lucid_tensor *hnb = phzeros(LUCID_I64, 1, one);
    lucid_tensor *hx = phrand(dt, 4, xs, -2, 3), *hdy = phrand(dt, 4, xs, -1, 1);
    lucid_tensor *gw = pdev(hw), *gb = pdev(hb), *gx = pdev(hx), *gdy = pdev(hdy);
    /* [0]: eager (cluster route), [1]: recorded cluster route, [2]:
     * recorded two-launch route; snap: [0] after its first call */
    lucid_tensor *t[3][T_N], *snap[T_N];
    unsigned long nl[3] = {0, 0, 0}, nk[3] = {0, 0, 0};
    int okk = gw && gb && gx && gdy;
    for (int k = 0; k < 3; k++) {
        t[k][T_RM] = pdev(hrm), t[k][T_RV] = pdev(hrv), t[k][T_NB] = pdev(hnb);
        t[k][T_SM] = pdpoison(F, 1, cs), t[k][T_SI] = pdpoison(F, 1, cs);
        t[k][T_Y] = pdpoison(dt, 4, xs), t[k][T_DX] = pdpoison(dt, 4, xs);
        t[k][T_DW] = pdpoison(F, 1, cs), t[k][T_DB] = pdpoison(F, 1, cs);
        for (int j = 0; j < T_N; j++) okk = okk && t[k][j];
    }
    if (!okk) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    if (!lucid_cuda_nn_set_bn_cluster || !lucid_cuda_bn_cluster_cap_columns) {
        TEST_FAIL(NAME("%s: cluster hooks linked", pre), "%s",
                  "lucid_cuda_nn_set_bn_cluster / lucid_cuda_bn_cluster_cap_columns missing");
        goto done;
    }
    lucid_cuda_bn_cluster_cap_columns(cap);
    set_cluster(2);
    set_coop(0); /* a shape the cluster route does not take: two launches */
    {
        unsigned long n0 = bn_launches(), k0 = bn_clusters();
        RUN(NAME("%s: eager forward + backward", pre), coop_fwd_bwd(silu, gx, gdy, gw, gb, t[0]));
        nl[0] = bn_launches() - n0;
        nk[0] = bn_clusters() - k0;
    }
    for (int j = 0; j < T_N; j++) {
        snap[j] = phost(t[0][j]);
        if (!snap[j]) {
            TEST_FAIL(NAME("%s: snapshot %s", pre, T_NAMES[j]), "%s", lucid_ctx_error(ctx));
            goto done;
        }
    }
    RUN(NAME("%s: eager forward + backward 2", pre), coop_fwd_bwd(silu, gx, gdy, gw, gb, t[0]));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    for (int k = 1; k < 3; k++) {
        set_cluster(k == 1 ? 2 : 1);
        unsigned long n0 = bn_launches(), k0 = bn_clusters();
        lucid_status st = coop_fwd_bwd(silu, gx, gdy, gw, gb, t[k]);
        nl[k] = bn_launches() - n0;
        nk[k] = bn_clusters() - k0;
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing (%s)", pre,
                           k == 1 ? "cluster" : "two launches"),
                      "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    set_cluster(2);
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &g));
    CHECK(NAME("%s: kernels recorded = queued eagerly (%lu, %lu cluster), 4 on the two-launch "
               "route",
               pre, nl[0], nk[0]),
          nl[1] == nl[0] && nk[1] == nk[0] && nl[0] == 4 - nk[0] && nl[2] == 4 && nk[2] == 0,
          "eager %lu (%lu cluster), recorded %lu (%lu) / %lu (%lu)", nl[0], nk[0], nl[1], nk[1],
          nl[2], nk[2]);
    if (cluster_sms() > 0)
        CHECK(NAME("%s: 2 cluster kernels recorded (device with cluster launch)", pre),
              nk[1] == 2, "%lu", nk[1]);
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < T_N; j++)
            cmp_bits(NAME("%s: replay %s %s = eager call 1", pre,
                          k == 1 ? "cluster" : "two launches", T_NAMES[j]),
                     t[k][j], snap[j]);
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
    for (int k = 1; k < 3; k++)
        for (int j = 0; j < T_N; j++)
            cmp_bits(NAME("%s: replay 2 %s %s = eager call 2", pre,
                          k == 1 ? "cluster" : "two launches", T_NAMES[j]),
                     t[k][j], phost(t[0][j]));
    {
        lucid_tensor *nb = phost(t[1][T_NB]);
        CHECK(NAME("%s: replay 2 num_batches_tracked == 2", pre),
              nb && test_hget(nb, 0) == 2.0, "num_batches_tracked %g",
              nb ? test_hget(nb, 0) : -1.0);
    }
done:
    if (lucid_cuda_bn_cluster_cap_columns) lucid_cuda_bn_cluster_cap_columns(0);
    set_cluster(0);
    set_coop(1);
    if (g) lucid_graph_destroy(g);
    pool_free();
}

/* ============================================ the module pair on the GPU */

typedef struct pair {
    lucid_param_set *set;
    lucid_module *bn, *act;
} pair;

static lucid_status pair_make(pair *p, int c, const lucid_tensor *hw, const lucid_tensor *hb) {
    memset(p, 0, sizeof *p);
    lucid_status st = lucid_param_set_create(ctx, &p->set);
    if (!st)
        st = lucid_module_batchnorm2d_create(ctx, p->set, "model.0.bn", c, EPS, MOM, &p->bn);
    if (!st) st = lucid_module_silu_create(ctx, &p->act);
    if (!st) st = lucid_param_set_materialize(ctx, p->set, GPU, LUCID_F32);
    if (!st) st = lucid_copy(ctx, p->bn->params[0]->data, hw);
    if (!st) st = lucid_copy(ctx, p->bn->params[1]->data, hb);
    return st;
}

static void pair_free(pair *p) {
    lucid_module_release(p->bn);
    lucid_module_release(p->act);
    lucid_param_set_release(p->set);
}

static void test_modules(lucid_dtype dt) {
    char pre[64];
    snprintf(pre, sizeof pre, "bn+silu modules %s", lucid_dtype_name(dt));
    int64_t xs[4] = {2, 12, 19, 23}, cs[1] = {12};
    const double u = unit(dt);
    pair f, s;
    memset(&f, 0, sizeof f);
    memset(&s, 0, sizeof s);
    lucid_tensor *hw = phrand(LUCID_F32, 1, cs, 0.5, 1.5);
    lucid_tensor *hb = phrand(LUCID_F32, 1, cs, -0.5, 0.5);
    lucid_status st = hw && hb ? pair_make(&f, 12, hw, hb) : LUCID_ERR_OOM;
    if (!st) st = pair_make(&s, 12, hw, hb);
    if (st) {
        TEST_FAIL(NAME("%s: setup", pre), "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
        goto done;
    }
    lucid_tensor *gx = pdev(phrand(dt, 4, xs, -2, 3)), *gdy = pdev(phrand(dt, 4, xs, -1, 1));
    lucid_tensor *y = NULL, *z = NULL, *ys = NULL, *dx = NULL, *g = NULL, *dxs = NULL;
    for (int step = 0; step < 2; step++) {
        RUN(NAME("%s: fused forward", pre),
            lucid_module_batchnorm2d_silu_forward(ctx, f.bn, f.act, gx, &y));
        RUN(NAME("%s: fused backward", pre),
            lucid_module_batchnorm2d_silu_backward(ctx, f.bn, f.act, gx, gdy, &dx));
        RUN(NAME("%s: bn forward", pre), lucid_module_forward1(ctx, s.bn, gx, &z));
        RUN(NAME("%s: silu forward", pre), lucid_module_forward1(ctx, s.act, z, &ys));
        RUN(NAME("%s: silu backward", pre), lucid_module_backward1(ctx, s.act, z, gdy, &g));
        RUN(NAME("%s: bn backward", pre), lucid_module_backward1(ctx, s.bn, gx, g, &dxs));
    }
    TEST_OK(NAME("%s: two fused and two separate steps run", pre));
    CHECK(NAME("%s: y in act's output slot, dx in bn's grad_input slot", pre),
          y == lucid_module_output(f.act, 0) && dx == lucid_module_grad_input(f.bn, 0),
          "slots differ");
    for (int i = 2; i < 5; i++)
        cmp_bits(NAME("%s: %s = separate (bitwise)", pre, f.bn->params[i]->name),
                 f.bn->params[i]->data, phost(s.bn->params[i]->data));
    if (dt == LUCID_F32) {
        cmp_rel(NAME("%s: y = separate", pre), y, phost(ys), 1e-6);
        cmp_rel(NAME("%s: dx = separate", pre), dx, phost(dxs), 1e-5);
        cmp_rel(NAME("%s: accumulated dweight = separate", pre), f.bn->params[0]->grad,
                phost(s.bn->params[0]->grad), 1e-5);
        cmp_rel(NAME("%s: accumulated dbias = separate", pre), f.bn->params[1]->grad,
                phost(s.bn->params[1]->grad), 1e-5);
    } else {
        cmp_maxrel(NAME("%s: y = separate within 4u*max", pre), y, phost(ys), 4 * u);
        cmp_maxrel(NAME("%s: dx = separate within 6u*max", pre), dx, phost(dxs), 6 * u);
        cmp_maxrel(NAME("%s: accumulated dweight = separate within 10u*max", pre),
                   f.bn->params[0]->grad, phost(s.bn->params[0]->grad), 10 * u);
        cmp_maxrel(NAME("%s: accumulated dbias = separate within 10u*max", pre),
                   f.bn->params[1]->grad, phost(s.bn->params[1]->grad), 10 * u);
    }
done:
    pair_free(&f);
    pair_free(&s);
    pool_free();
}

/* ================== the conv's backward-data columns (LUCID_BN_EMIT_COLS)
 * engine/nn/nn.h lucid_conv_dcols: the one-pass BatchNorm backward also
 * writes the im2col columns of the dx it produces into the scratch of the
 * following 3x3 stride-1 conv's backward-data, which then skips its im2col.
 * Blocks conv -> bn [-> silu] of modules on the GPU (the im2col route on
 * for every pass, lucid_cuda_nn_set_conv_col 8; the small-channel route
 * off), each backward run three ways on the same modules and inputs (the
 * same batch, so the same statistics):
 *   columns    lucid_module_conv2d_dcols_reserve, then
 *              lucid_module_batchnorm2d_backward_dcols, then the conv's
 *              module backward;
 *   switch off the same calls with LUCID_BN_EMIT_COLS=0 (setenv in this
 *              process around the reservation);
 *   plain      the module calls without columns (lucid_module_backward1 of
 *              bn, or lucid_module_batchnorm2d_silu_backward).
 * Checked: the conv's grad_input, its weight gradient and bn's dweight /
 * dbias bitwise equal on the three; the reservation armed (columns) or
 * not (switch off, and every geometry the fusion does not take); the
 * im2col launches of the backward (lucid_cuda_conv_col_launch_count: the
 * columns route one less than the others exactly when it fuses).  Fused:
 * 3x3 s1 p1 at N 4 on 40x40 and 20x20 maps, 32 / 64 / 128 channels (and
 * 64>32, 32>64), fused SiLU and plain BatchNorm2d, bf16 and f16, also
 * with the parameter-gradient lane on (lucid_ctx_set_grad_lane: the
 * filter gradient on its own stream and scratch) and off (the filter
 * gradient on the same stream, whose scratch the columns lie after).
 * Not fused, same bits: 80x80 (N*H*W > 8192: several BN parts, nothing
 * reserved), Cout 12 (Cout*9 not a multiple of 8), stride 2, a 5x5
 * kernel, 20x21 (H*W not a multiple of 8: not on the route), the
 * backward-data off the route (set_conv_col 6).  Entry points (lucid_nn_*_dcols): columns
 * filled and used (no im2col); the conv given another tensor with the
 * same values as dy, or the arena grown between the BatchNorm and the
 * conv (a reservation for a larger conv): the im2col runs, same bits; a
 * BatchNorm of another shape, in eval mode, or with LUCID_BN_ONEPASS=0:
 * not filled.  Capture: the columns route recorded after an eager step
 * and replayed equals the eager step bitwise, with the same launches. */

#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_conv_col_launch_count(void);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route);

static unsigned long col_launches(void) {
    return lucid_cuda_conv_col_launch_count ? lucid_cuda_conv_col_launch_count() : 0;
}

/* the im2col route for every pass (8) or another mask, the small route off */
static void dc_routes(int col) {
    if (lucid_cuda_nn_set_conv_col) lucid_cuda_nn_set_conv_col(ctx, col);
    if (lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, col ? 1 : 0);
}

typedef struct cblock {
    lucid_param_set *set;
    lucid_module *conv, *bn, *act;
} cblock;

static lucid_status cblock_make(cblock *b, int cin, int cout, int k, int s) {
    memset(b, 0, sizeof *b);
    int64_t cs[1] = {cout};
    lucid_tensor *hw = phrand(LUCID_F32, 1, cs, 0.5, 1.5), *hb = phrand(LUCID_F32, 1, cs, -0.5, 0.5);
    if (!hw || !hb) return LUCID_ERR_OOM;
    lucid_status st = lucid_param_set_create(ctx, &b->set);
    if (!st)
        st = lucid_module_conv2d_create(ctx, b->set, "m.conv", cin, cout, k, s, -1, 1, 1, 0,
                                        &b->conv);
    if (!st) st = lucid_module_batchnorm2d_create(ctx, b->set, "m.bn", cout, EPS, MOM, &b->bn);
    if (!st) st = lucid_module_silu_create(ctx, &b->act);
    if (!st) st = lucid_param_set_materialize(ctx, b->set, GPU, LUCID_F32);
    if (!st) st = lucid_copy(ctx, b->bn->params[0]->data, hw);
    if (!st) st = lucid_copy(ctx, b->bn->params[1]->data, hb);
    return st;
}

static void cblock_free(cblock *b) {
    lucid_module_release(b->conv);
    lucid_module_release(b->bn);
    lucid_module_release(b->act);
    lucid_param_set_release(b->set);
    memset(b, 0, sizeof *b);
}

enum { DC_COLS, DC_OFF, DC_PLAIN, DC_N };
static const char *const DC_NAMES[DC_N] = {"columns", "LUCID_BN_EMIT_COLS=0", "plain calls"};

typedef struct dc_out {
    lucid_tensor *gx, *cdw, *bdw, *bdb; /* host copies */
    int armed;
    unsigned long cols; /* im2col launches of the backward */
} dc_out;

/* return the status of a failing call */
#define DC_TRY(expr)                                                          \
    do {                                                                      \
        lucid_status s_ = (expr);                                             \
        if (s_ != LUCID_OK) return s_;                                        \
    } while (0)

/* One forward + backward of block b (silu: the fused pair) the way `mode`
 * says; *what names the failing call. */
static lucid_status dc_step(cblock *b, int silu, int mode, const lucid_tensor *x,
                            const lucid_tensor *gy, dc_out *o, const char **what) {
    lucid_tensor *y = NULL, *a = NULL, *g = NULL, *gx = NULL;
    memset(o, 0, sizeof *o);
    *what = "zero_grad";
    DC_TRY(lucid_param_set_zero_grad(ctx, b->set));
    *what = "forward";
    DC_TRY(lucid_module_forward1(ctx, b->conv, x, &y));
    if (silu) DC_TRY(lucid_module_batchnorm2d_silu_forward(ctx, b->bn, b->act, y, &a));
    else DC_TRY(lucid_module_forward1(ctx, b->bn, y, &a));
    const unsigned long c0 = col_launches();
    if (mode == DC_PLAIN) {
        *what = "bn backward (plain)";
        if (silu) DC_TRY(lucid_module_batchnorm2d_silu_backward(ctx, b->bn, b->act, y, gy, &g));
        else DC_TRY(lucid_module_backward1(ctx, b->bn, y, gy, &g));
    } else {
        *what = "reserve";
        if (mode == DC_OFF) setenv("LUCID_BN_EMIT_COLS", "0", 1);
        lucid_status s = lucid_module_conv2d_dcols_reserve(ctx, b->conv, x, &o->armed);
        setenv("LUCID_BN_EMIT_COLS", "1", 1); /* the group runs with the fusion on */
        DC_TRY(s);
        *what = "bn backward (columns)";
        DC_TRY(lucid_module_batchnorm2d_backward_dcols(ctx, b->bn, silu ? b->act : NULL, y, gy,
                                                          b->conv, &g));
    }
    *what = "conv backward";
    DC_TRY(lucid_module_backward1(ctx, b->conv, x, g, &gx));
    o->cols = col_launches() - c0;
    *what = "copy back";
    o->gx = phost(gx);
    o->cdw = phost(b->conv->params[0]->grad);
    o->bdw = phost(b->bn->params[0]->grad);
    o->bdb = phost(b->bn->params[1]->grad);
    return o->gx && o->cdw && o->bdw && o->bdb ? LUCID_OK : LUCID_ERR_OOM;
}

/* Block cin>cout kxk stride s on N x cin x H x W (col: set_conv_col's
 * route); armed_want: the reservation is made; fused_want: the BatchNorm
 * writes the columns and the conv skips its im2col; lane: the parameter
 * gradient lane on. */
static void test_dcols(lucid_dtype dt, int silu, int64_t N, int cin, int cout, int k, int s,
                       int64_t H, int64_t W, int col, int armed_want, int fused_want, int lane) {
    char pre[192];
    snprintf(pre, sizeof pre, "bn %scolumns %lldx%dx%lldx%lld conv %d>%d %dx%d s%d%s%s %s",
             silu ? "+silu " : "", (long long)N, cin, (long long)H, (long long)W, cin, cout, k,
             k, s, col != 8 ? " (backward-data off the route)" : "", lane ? " lane" : "",
             lucid_dtype_name(dt));
    cblock b;
    dc_out o[DC_N];
    memset(&b, 0, sizeof b);
    dc_routes(col);
    lucid_ctx_set_grad_lane(ctx, lane);
    const int p = k / 2;
    const int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
    int64_t xs[4] = {N, cin, H, W}, ys[4] = {N, cout, Ho, Wo};
    lucid_tensor *gx = pdev(phrand(dt, 4, xs, -1, 1)), *ggy = pdev(phrand(dt, 4, ys, -1, 1));
    lucid_status st = gx && ggy ? cblock_make(&b, cin, cout, k, s) : LUCID_ERR_OOM;
    if (st) {
        TEST_FAIL(NAME("%s: setup", pre), "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
        goto done;
    }
    for (int m = 0; m < DC_N; m++) {
        const char *what = "";
        st = dc_step(&b, silu, m, gx, ggy, &o[m], &what);
        if (st) {
            TEST_FAIL(NAME("%s: %s: %s", pre, DC_NAMES[m], what), "%s: %s",
                      lucid_status_name(st), lucid_ctx_error(ctx));
            goto done;
        }
    }
    CHECK(NAME("%s: reservation %s", pre, armed_want ? "made" : "declined"),
          o[DC_COLS].armed == armed_want && o[DC_OFF].armed == 0,
          "armed %d (LUCID_BN_EMIT_COLS=0: %d)", o[DC_COLS].armed, o[DC_OFF].armed);
    CHECK(NAME("%s: im2col launches %s", pre, fused_want ? "one fewer" : "unchanged"),
          o[DC_OFF].cols == o[DC_PLAIN].cols &&
              o[DC_COLS].cols + (fused_want ? 1 : 0) == o[DC_PLAIN].cols,
          "columns %lu, switch off %lu, plain %lu", o[DC_COLS].cols, o[DC_OFF].cols,
          o[DC_PLAIN].cols);
    for (int m = 1; m < DC_N; m++) {
        cmp_bits(NAME("%s: conv grad_input = %s (bitwise)", pre, DC_NAMES[m]), pdev(o[0].gx),
                 o[m].gx);
        cmp_bits(NAME("%s: conv dweight = %s (bitwise)", pre, DC_NAMES[m]), pdev(o[0].cdw),
                 o[m].cdw);
        cmp_bits(NAME("%s: bn dweight = %s (bitwise)", pre, DC_NAMES[m]), pdev(o[0].bdw),
                 o[m].bdw);
        cmp_bits(NAME("%s: bn dbias = %s (bitwise)", pre, DC_NAMES[m]), pdev(o[0].bdb),
                 o[m].bdb);
    }
done:
    lucid_ctx_synchronize(ctx);
    lucid_ctx_set_grad_lane(ctx, 0);
    dc_routes(0);
    cblock_free(&b);
    pool_free();
}

/* The entry points: x [N,C,H,W] through conv C>C 3x3 s1 p1, then the
 * BatchNorm (+SiLU) forward; the backward of the pair and the conv's
 * backward-data with the columns in the situations of the header, each
 * against the plain calls bitwise. */
static void test_dcols_entry(lucid_dtype dt, int silu) {
    char pre[96];
    snprintf(pre, sizeof pre, "bn %scolumns entry points %s", silu ? "+silu " : "",
             lucid_dtype_name(dt));
    const lucid_dtype F = LUCID_F32;
    const int64_t N = 4, C = 32, H = 40, W = 40;
    int64_t xs[4] = {N, C, H, W}, ws[4] = {C, C, 3, 3}, cs[1] = {C};
    /* the larger conv: 512>512 on 1x64x128 (N*H*W 8192: still reserved), about
     * 200 MB of scratch with its columns */
    int64_t xs2[4] = {N, C, 20, 20}, wsb[4] = {512, 512, 3, 3}, xsb[4] = {1, 512, 64, 128};
    const lucid_conv2d_params cp = {1, 1, 1, 1, 1, 1, 1};
    lucid_conv_dcols dc, dcb;
    dc_routes(8);
    lucid_tensor *x = pdev(phrand(dt, 4, xs, -1, 1)), *w = pdev(phrand(F, 4, ws, -0.2, 0.2));
    lucid_tensor *bw = pdev(phrand(F, 1, cs, 0.5, 1.5)), *bb = pdev(phrand(F, 1, cs, -0.5, 0.5));
    lucid_tensor *gy = pdev(phrand(dt, 4, xs, -1, 1)), *gy2 = pdev(phrand(dt, 4, xs2, -1, 1));
    lucid_tensor *y = pdpoison(dt, 4, xs), *a = pdpoison(dt, 4, xs), *sm = pdpoison(F, 1, cs),
                 *si = pdpoison(F, 1, cs);
    lucid_tensor *y2 = pdev(phrand(dt, 4, xs2, -1, 1)), *a2 = pdpoison(dt, 4, xs2),
                 *sm2 = pdpoison(F, 1, cs), *si2 = pdpoison(F, 1, cs);
    lucid_tensor *g = pdpoison(dt, 4, xs), *g2 = pdpoison(dt, 4, xs), *gref = pdpoison(dt, 4, xs);
    lucid_tensor *gs = pdpoison(dt, 4, xs2), *gsref = pdpoison(dt, 4, xs2);
    lucid_tensor *dx = pdpoison(dt, 4, xs), *dxref = pdpoison(dt, 4, xs);
    lucid_tensor *dw = pdpoison(F, 1, cs), *db = pdpoison(F, 1, cs), *dwr = pdpoison(F, 1, cs),
                 *dbr = pdpoison(F, 1, cs);
    lucid_tensor *xb = pdev(phzeros(dt, 4, xsb)), *wb = pdev(phzeros(F, 4, wsb));
    lucid_tensor *hdxref = NULL, *hgref = NULL, *hdwr = NULL, *hdbr = NULL;
    unsigned long c0;
    if (!x || !w || !bw || !bb || !gy || !gy2 || !y || !a || !sm || !si || !y2 || !a2 || !sm2 ||
        !si2 || !g || !g2 || !gref || !gs || !gsref || !dx || !dxref || !dw || !db || !dwr ||
        !dbr || !xb || !wb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
#define BNF(xx, yy, m, s, tr)                                                                 \
    (silu ? lucid_nn_batchnorm2d_silu_forward(ctx, xx, yy, bw, bb, NULL, NULL, NULL, m, s, tr, \
                                              MOM, EPS)                                        \
          : lucid_nn_batchnorm2d_forward(ctx, xx, yy, bw, bb, NULL, NULL, NULL, m, s, tr, MOM, \
                                         EPS))
    RUN(NAME("%s: conv forward", pre), lucid_nn_conv2d_forward(ctx, x, y, w, NULL, &cp));
    RUN(NAME("%s: bn forward", pre), BNF(y, a, sm, si, 1));
    RUN(NAME("%s: bn forward (20x20)", pre), BNF(y2, a2, sm2, si2, 1));
    /* the plain calls */
    RUN(NAME("%s: plain bn backward", pre),
        bn_bwd(silu, y, gy, gref, bw, bb, sm, si, dwr, dbr, 1, 0.0, 0.0));
    RUN(NAME("%s: plain conv backward", pre),
        lucid_nn_conv2d_backward_input(ctx, x, gref, dxref, w, &cp, 0.0));
    hgref = phost(gref), hdxref = phost(dxref), hdwr = phost(dwr), hdbr = phost(dbr);
    RUN(NAME("%s: plain bn backward (20x20)", pre),
        bn_bwd(silu, y2, gy2, gsref, bw, bb, sm2, si2, NULL, NULL, 1, 0.0, 0.0));
    if (!hgref || !hdxref || !hdwr || !hdbr) {
        TEST_FAIL(NAME("%s: copy back", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* 1. columns written and used: no im2col */
    RUN(NAME("%s: reserve", pre), lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    CHECK(NAME("%s: reservation made", pre), dc.armed == 1 && dc.filled == 0 && dc.data,
          "armed %d filled %d data %p", dc.armed, dc.filled, dc.data);
    RUN(NAME("%s: bn backward with columns", pre),
        lucid_nn_batchnorm2d_backward_dcols(ctx, y, gy, g, bw, bb, sm, si, dw, db, 1, 0.0, 0.0,
                                            silu, &dc));
    CHECK(NAME("%s: columns written", pre), dc.filled == 1 && dc.dy == lucid_tensor_data(g),
          "filled %d", dc.filled);
    c0 = col_launches();
    RUN(NAME("%s: conv backward with columns", pre),
        lucid_nn_conv2d_backward_input_dcols(ctx, x, g, dx, w, &cp, 0.0, NULL, &dc));
    CHECK(NAME("%s: no im2col", pre), col_launches() == c0, "%lu im2col launches",
          col_launches() - c0);
    cmp_bits(NAME("%s: bn dx = plain (bitwise)", pre), g, hgref);
    cmp_bits(NAME("%s: bn dweight = plain (bitwise)", pre), dw, hdwr);
    cmp_bits(NAME("%s: bn dbias = plain (bitwise)", pre), db, hdbr);
    cmp_bits(NAME("%s: conv dx = plain (bitwise)", pre), dx, hdxref);
    /* 2. the conv given a copy of dy: not the tensor the columns came from */
    RUN(NAME("%s: reserve (copy)", pre), lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    RUN(NAME("%s: bn backward with columns (copy)", pre),
        lucid_nn_batchnorm2d_backward_dcols(ctx, y, gy, g, bw, bb, sm, si, NULL, NULL, 1, 0.0,
                                            0.0, silu, &dc));
    RUN(NAME("%s: copy of dy", pre), lucid_copy(ctx, g2, g));
    RUN(NAME("%s: poison dx (copy)", pre), lucid_fill(ctx, dx, NAN));
    c0 = col_launches();
    RUN(NAME("%s: conv backward on the copy", pre),
        lucid_nn_conv2d_backward_input_dcols(ctx, x, g2, dx, w, &cp, 0.0, NULL, &dc));
    CHECK(NAME("%s: another dy tensor: im2col runs", pre), col_launches() == c0 + 1,
          "%lu im2col launches", col_launches() - c0);
    cmp_bits(NAME("%s: conv dx on the copy = plain (bitwise)", pre), dx, hdxref);
    /* 3. the arena grown between the BatchNorm and the conv */
    RUN(NAME("%s: reserve (growth)", pre), lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    RUN(NAME("%s: bn backward with columns (growth)", pre),
        lucid_nn_batchnorm2d_backward_dcols(ctx, y, gy, g, bw, bb, sm, si, NULL, NULL, 1, 0.0,
                                            0.0, silu, &dc));
    RUN(NAME("%s: reserve for a larger conv", pre),
        lucid_nn_conv2d_dcols_reserve(ctx, xb, wb, &cp, &dcb));
    /* an arena that earlier cases already grew past the larger conv's
     * need does not move (the growth cannot be provoked here): then the
     * columns stay valid and the GEMM reads them */
    const int moved = dcb.armed && dcb.base != dc.base;
    if (!moved)
        TEST_SKIP(NAME("%s: the larger reservation moved the arena", pre),
                  "the arena was already large enough (base %p)", dc.base);
    RUN(NAME("%s: poison dx (growth)", pre), lucid_fill(ctx, dx, NAN));
    c0 = col_launches();
    RUN(NAME("%s: conv backward after the growth", pre),
        lucid_nn_conv2d_backward_input_dcols(ctx, x, g, dx, w, &cp, 0.0, NULL, &dc));
    CHECK(NAME("%s: arena moved: im2col runs (else the columns are read)", pre),
          col_launches() == c0 + (moved ? 1 : 0), "%lu im2col launches (moved %d)",
          col_launches() - c0, (int)moved);
    cmp_bits(NAME("%s: conv dx after the growth = plain (bitwise)", pre), dx, hdxref);
    /* 4. a BatchNorm of another shape than the reservation's: not written */
    RUN(NAME("%s: reserve (shape)", pre), lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    RUN(NAME("%s: bn backward of another shape", pre),
        lucid_nn_batchnorm2d_backward_dcols(ctx, y2, gy2, gs, bw, bb, sm2, si2, NULL, NULL, 1,
                                            0.0, 0.0, silu, &dc));
    CHECK(NAME("%s: another shape: not written", pre), dc.armed && !dc.filled, "filled %d",
          dc.filled);
    cmp_bits(NAME("%s: bn dx of another shape = plain (bitwise)", pre), gs, phost(gsref));
    /* 5. eval mode, and the two-launch route: not written, same dx */
    RUN(NAME("%s: reserve (eval)", pre), lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    RUN(NAME("%s: bn backward in eval mode", pre),
        lucid_nn_batchnorm2d_backward_dcols(ctx, y, gy, g, bw, bb, sm, si, NULL, NULL, 0, 0.0,
                                            0.0, silu, &dc));
    CHECK(NAME("%s: eval: not written", pre), !dc.filled, "filled %d", dc.filled);
    RUN(NAME("%s: reserve (two launches)", pre),
        lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, &dc));
    setenv("LUCID_BN_ONEPASS", "0", 1);
    {
        lucid_status s2 = lucid_nn_batchnorm2d_backward_dcols(ctx, y, gy, g, bw, bb, sm, si,
                                                              NULL, NULL, 1, 0.0, 0.0, silu, &dc);
        unsetenv("LUCID_BN_ONEPASS");
        RUN(NAME("%s: bn backward, LUCID_BN_ONEPASS=0", pre), s2);
    }
    CHECK(NAME("%s: LUCID_BN_ONEPASS=0: not written", pre), !dc.filled, "filled %d", dc.filled);
    cmp_bits(NAME("%s: bn dx (LUCID_BN_ONEPASS=0) = plain (bitwise)", pre), g, hgref);
    /* 6. NULL */
    CHECK(NAME("%s: reserve with dcols NULL is ERR_ARG", pre),
          lucid_nn_conv2d_dcols_reserve(ctx, x, w, &cp, NULL) == LUCID_ERR_ARG, "%s",
          lucid_ctx_error(ctx));
#undef BNF
done:
    unsetenv("LUCID_BN_ONEPASS");
    dc_routes(0);
    pool_free();
}

/* Capture: an eager step on the columns route, then the same step recorded
 * and replayed: every output bitwise equal, the same im2col launches. */
static void test_dcols_capture(lucid_dtype dt, int silu, int64_t N, int c, int64_t H,
                               int64_t W) {
    char pre[128];
    snprintf(pre, sizeof pre, "bn %scolumns capture %lldx%dx%lldx%lld %s", silu ? "+silu " : "",
             (long long)N, c, (long long)H, (long long)W, lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    cblock b;
    dc_out e, r;
    lucid_graph *gr = NULL;
    memset(&b, 0, sizeof b);
    dc_routes(8);
    int64_t xs[4] = {N, c, H, W};
    lucid_tensor *x = pdev(phrand(dt, 4, xs, -1, 1)), *gy = pdev(phrand(dt, 4, xs, -1, 1));
    lucid_status st = x && gy ? cblock_make(&b, c, c, 3, 1) : LUCID_ERR_OOM;
    const char *what = "";
    if (st) {
        TEST_FAIL(NAME("%s: setup", pre), "%s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
        goto done;
    }
    st = dc_step(&b, silu, DC_COLS, x, gy, &e, &what);
    if (st) {
        TEST_FAIL(NAME("%s: eager: %s", pre, what), "%s: %s", lucid_status_name(st),
                  lucid_ctx_error(ctx));
        goto done;
    }
    {
        lucid_tensor *y = NULL, *a = NULL, *g = NULL, *gx = NULL;
        int armed = 0;
        RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
        lucid_status s = lucid_param_set_zero_grad(ctx, b.set);
        if (!s) s = lucid_module_forward1(ctx, b.conv, x, &y);
        if (!s && silu) s = lucid_module_batchnorm2d_silu_forward(ctx, b.bn, b.act, y, &a);
        if (!s && !silu) s = lucid_module_forward1(ctx, b.bn, y, &a);
        const unsigned long c1 = col_launches();
        if (!s) s = lucid_module_conv2d_dcols_reserve(ctx, b.conv, x, &armed);
        if (!s)
            s = lucid_module_batchnorm2d_backward_dcols(ctx, b.bn, silu ? b.act : NULL, y, gy,
                                                        b.conv, &g);
        if (!s) s = lucid_module_backward1(ctx, b.conv, x, g, &gx);
        r.cols = col_launches() - c1;
        if (s) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
        RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
        CHECK(NAME("%s: recorded with the columns, eager's im2col launches", pre),
              armed == 1 && r.cols == e.cols, "armed %d, %lu launches recorded, %lu eager", armed,
              r.cols, e.cols);
        RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
        cmp_bits(NAME("%s: replay conv grad_input = eager", pre), gx, e.gx);
        cmp_bits(NAME("%s: replay conv dweight = eager", pre), b.conv->params[0]->grad, e.cdw);
        cmp_bits(NAME("%s: replay bn dweight = eager", pre), b.bn->params[0]->grad, e.bdw);
        cmp_bits(NAME("%s: replay bn dbias = eager", pre), b.bn->params[1]->grad, e.bdb);
    }
done:
    if (gr) lucid_graph_destroy(gr);
    dc_routes(0);
    cblock_free(&b);
    pool_free();
}

/* ============================================================ main */

static const char *GROUPS[] = {"cuda bn+silu fused kernels", "cuda bn+silu capture",
                               "cuda bn+silu capture before the fold counters",
                               "cuda bn+silu modules",
                               "cuda bn one pass = two launches (LUCID_BN_ONEPASS)",
                               "cuda bn one pass capture",
                               "cuda bn coop = two launches (LUCID_BN_COOP)",
                               "cuda bn coop capture",
                               "cuda bn cluster = two launches (LUCID_BN_CLUSTER)",
                               "cuda bn cluster capture",
                               "cuda bn backward writes the conv's columns (LUCID_BN_EMIT_COLS)"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    const lucid_nn_kernels *k = lucid_nn_cuda_kernels();
    if (!k || !k->batchnorm2d_silu_forward || !k->batchnorm2d_silu_backward) {
        TEST_FAIL("cuda nn table has the fused BatchNorm2d+SiLU slots",
                  "table %p (cuda/nn_table.cu not linked or slots missing)", (const void *)k);
        return test_exit();
    }
    TEST_OK("cuda nn table has the fused BatchNorm2d+SiLU slots");
    /* the cooperative kernels are opt-in (LUCID_BN_COOP=1, nn_norm.cuh); this
     * program's "default route" is that route, as it was written for: on
     * unless the caller set the switch */
    setenv("LUCID_BN_COOP", "1", 0);
    if (!cuda_test_ctx_create("test_nn_bnsilu_cuda")) return test_exit();

    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 3; d++) {
        lucid_dtype dt = DTS[d];
        /* one part per channel (whole planes, no fold) */
        test_case(4, 16, 32, 32, 1, dt);
        test_case(4, 64, 40, 40, 1, dt);
        test_case(8, 5, 1, 1, 1, dt);
        test_case(3, 7, 5, 3, 0, dt);
        test_case(3, 5, 6, 10, 1, dt);
        /* several parts per channel, folded by warp 0 (<= 32 parts) */
        test_case(2, 8, 100, 90, 1, dt);
        test_case(300, 3, 8, 8, 1, dt);
        test_case(3, 4, 91, 91, 1, dt);
        test_case(5, 3, 96, 96, 1, dt);
        test_case(2, 3, 80, 80, 1, dt);
        /* more than 32 parts (the whole block folds), more than 256 */
        test_case(5, 2, 160, 330, 1, dt);
        test_case(300, 2, 64, 72, 1, dt);
        /* C past grid.y (counters) and past the counters (fallback) */
        test_case(2, 70001, 1, 2, 1, dt);
        test_case(2, 131100, 1, 2, 1, dt);
        test_misaligned(dt, 1, 1);
        test_misaligned(dt, 0, 1);
        test_capture(dt, 4, 24, 40, 40);
        test_capture(dt, 4, 24, 96, 96);
        test_capture_fallback(dt, 4, 24, 40, 40);
        test_capture_fallback(dt, 4, 24, 96, 96);
        test_capture_fallback(dt, 4, 8, 320, 320);
        test_capture_fallback(dt, 300, 2, 64, 72);
        test_modules(dt);
        /* the groups of the one-pass and cooperative routes keep today's
         * routes for multi-part channels: the cluster route off
         * (lucid_cuda_nn_set_bn_cluster; its own groups below) */
        set_cluster(1);
        /* one pass vs two launches (LUCID_BN_ONEPASS), plain and fused */
        for (int silu = 0; silu < 2; silu++) {
            /* one part per channel */
            test_onepass(dt, silu, 4, 5, 20, 20, 1, 0, 0);
            test_onepass(dt, silu, 3, 7, 10, 30, 1, 0, 0); /* S 300: bf16/f16 scalar */
            test_onepass(dt, silu, 2, 3, 40, 40, 1, 0, 0);
            test_onepass(dt, silu, 4, 32, 40, 40, 1, 0, 0);
            test_onepass(dt, silu, 3, 4, 5, 7, 0, 0, 0);   /* odd S, no affine */
            test_onepass(dt, silu, 8, 5, 1, 1, 1, 0, 0);   /* tiny planes */
            test_onepass(dt, silu, 100, 3, 9, 9, 1, 0, 0); /* 100 planes, 8100 elements */
            test_onepass(dt, silu, 1, 2, 90, 91, 1, 0, 0); /* S 8190 > 256 vectors */
            test_onepass(dt, silu, 1, 3, 64, 128, 1, 0, 0); /* S = 8192: one chunk */
            test_onepass(dt, silu, 2, 70001, 1, 2, 1, 0, 0); /* grid.y strides */
            test_onepass(dt, silu, 2, 3, 40, 40, 1, 0, 1);  /* y/dx unaligned */
            test_onepass(dt, silu, 2, 3, 40, 40, 1, 1, 1);  /* all unaligned */
            /* several parts per channel: the switch changes nothing */
            test_onepass(dt, silu, 2, 3, 80, 80, 1, 0, 0);
            test_onepass(dt, silu, 5, 3, 96, 96, 1, 0, 0);
            test_onepass(dt, silu, 3, 4, 91, 91, 1, 1, 1);
            test_onepass_capture(dt, silu, 4, 24, 20, 20);
            test_onepass_capture(dt, silu, 3, 7, 10, 30);
            test_onepass_capture(dt, silu, 4, 24, 96, 96);
        }
        /* one cooperative launch vs two launches (LUCID_BN_COOP): multi-part
         * shapes; want: 1 forward, 2 backward co-resident on 132 SMs */
        for (int silu = 0; silu < 2; silu++) {
            test_coop(dt, silu, 4, 64, 80, 80, 0, 0, 1, 1);   /* 4 parts, 256 blocks */
            test_coop(dt, silu, 4, 32, 160, 160, 0, 0, 1, 1); /* 16 parts, 512 blocks */
            test_coop(dt, silu, 4, 16, 320, 320, 0, 0, 2, 2); /* layer 0: 52 parts */
            test_coop(dt, silu, 3, 5, 90, 100, 0, 0, 1, 1);   /* S 9000: vector path */
            test_coop(dt, silu, 3, 5, 91, 99, 0, 0, 1, 1);    /* S 9009: scalar path */
            test_coop(dt, silu, 2, 3, 80, 80, 0, 1, 1, 1);    /* y/dx unaligned */
            test_coop(dt, silu, 2, 3, 80, 80, 1, 1, 1, 1);    /* all unaligned */
            test_coop(dt, silu, 5, 2, 160, 330, 0, 0, 1, 1);  /* 35 parts */
            test_coop(dt, silu, 300, 1, 64, 72, 0, 0, 1, 1);  /* 300 parts */
            if (dt == LUCID_BF16) {
                /* around the thresholds on 132 SMs (528 blocks at 4 per
                 * SM, 660 at 5: the plain forward reading x again) */
                test_coop(dt, silu, 4, 10, 320, 320, 0, 0, 1, 1); /* 520 blocks */
                test_coop(dt, silu, 4, 11, 320, 320, 0, 0, silu ? 2 : 1, 2); /* 572 */
                test_coop(dt, silu, 40, 2, 320, 320, 0, 0, 2, 2); /* 520 parts */
                test_coop(dt, silu, 41, 2, 320, 320, 0, 0, silu ? 0 : 2, 0); /* 533 */
            }
            test_coop_capture(dt, silu, 4, 64, 80, 80, 3);
            test_coop_capture(dt, silu, 4, 32, 160, 160, 3);
            test_coop_capture(dt, silu, 3, 5, 91, 99, 3);
            setenv("LUCID_BN_COOP_LOOP", "1", 1); /* the rounds are opt-in */
            test_coop_capture(dt, silu, 4, 16, 320, 320, 3); /* layer 0: 2 rounds */
            unsetenv("LUCID_BN_COOP_LOOP");
        }
        set_cluster(0);
        /* one launch on thread-block clusters vs two launches
         * (LUCID_BN_CLUSTER): multi-part shapes, plain and fused */
        for (int silu = 0; silu < 2; silu++) {
            test_cluster(dt, silu, 2, 3, 80, 80, 0, 0);     /* 2 parts */
            test_cluster(dt, silu, 2, 3, 80, 80, 0, 1);     /* y/dx unaligned */
            test_cluster(dt, silu, 2, 3, 80, 80, 1, 1);     /* all unaligned */
            test_cluster(dt, silu, 4, 64, 80, 80, 0, 0);    /* 4 parts (model) */
            test_cluster(dt, silu, 3, 5, 91, 99, 0, 0);     /* 6 parts, S odd: scalar */
            test_cluster(dt, silu, 8, 3, 80, 80, 0, 0);     /* 8 parts */
            test_cluster(dt, silu, 2, 3, 181, 181, 0, 0);   /* 8 parts, S odd */
            test_cluster(dt, silu, 4, 32, 160, 160, 0, 0);  /* 16 parts (model) */
            if (dt == LUCID_BF16) /* the model's dtype: 16 parts, 1024 blocks */
                test_cluster(dt, silu, 4, 64, 160, 160, 0, 0);
            test_cluster(dt, silu, 17, 2, 64, 128, 0, 0);   /* 17 parts: 2 rounds of 9 */
            test_cluster(dt, silu, 17, 3, 90, 91, 0, 0);    /* 17 parts, S odd */
            test_cluster(dt, silu, 5, 2, 160, 330, 0, 0);   /* 35: fold across warps */
            test_cluster(dt, silu, 4, 16, 320, 320, 0, 0);  /* layer 0: 52 parts */
            test_cluster(dt, silu, 300, 1, 64, 72, 0, 0);   /* 300 parts: not taken */
            test_cluster_capture(dt, silu, 4, 64, 80, 80, 0);
            test_cluster_capture(dt, silu, 4, 32, 160, 160, 0);
            test_cluster_capture(dt, silu, 3, 5, 91, 99, 3);
            test_cluster_capture(dt, silu, 4, 16, 320, 320, 0);
            test_cluster_capture(dt, silu, 4, 16, 320, 320, 3);
        }
    }
    /* the conv's backward-data columns written by the BatchNorm backward
     * (off by default: the group turns LUCID_BN_EMIT_COLS on) */
    setenv("LUCID_BN_EMIT_COLS", "1", 1);
    for (int d = 1; d < 3; d++) {
        lucid_dtype dt = DTS[d];
        for (int silu = 0; silu < 2; silu++) {
            static const int CH[3] = {32, 64, 128};
            for (int i = 0; i < 3; i++) {
                test_dcols(dt, silu, 4, CH[i], CH[i], 3, 1, 40, 40, 8, 1, 1, 0);
                test_dcols(dt, silu, 4, CH[i], CH[i], 3, 1, 20, 20, 8, 1, 1, 0);
            }
            test_dcols(dt, silu, 4, 64, 32, 3, 1, 40, 40, 8, 1, 1, 0);
            test_dcols(dt, silu, 4, 32, 64, 3, 1, 20, 20, 8, 1, 1, 0);
            test_dcols(dt, silu, 4, 64, 64, 3, 1, 40, 40, 8, 1, 1, 1); /* lane on */
            test_dcols(dt, silu, 4, 128, 128, 3, 1, 20, 20, 8, 1, 1, 1);
            /* not fused: same bits, no launch saved */
            test_dcols(dt, silu, 4, 32, 32, 3, 1, 80, 80, 8, 0, 0, 0); /* several BN parts */
            test_dcols(dt, silu, 4, 32, 12, 3, 1, 40, 40, 8, 0, 0, 0); /* Cout*9 % 8 */
            test_dcols(dt, silu, 4, 32, 32, 3, 2, 40, 40, 8, 0, 0, 0); /* stride 2 */
            test_dcols(dt, silu, 4, 32, 32, 5, 1, 20, 20, 8, 0, 0, 0); /* 5x5 */
            test_dcols(dt, silu, 4, 32, 32, 3, 1, 20, 21, 8, 0, 0, 0); /* H*W % 8 */
            test_dcols(dt, silu, 4, 32, 32, 3, 1, 40, 40, 6, 0, 0, 0); /* route: f, w */
            test_dcols_entry(dt, silu);
            test_dcols_capture(dt, silu, 4, 64, 20, 20);
            test_dcols_capture(dt, silu, 4, 32, 40, 40);
        }
    }
    unsetenv("LUCID_BN_EMIT_COLS");
    return cuda_test_finish();
}
