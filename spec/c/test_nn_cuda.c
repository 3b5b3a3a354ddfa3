/*
 * test_nn_cuda.c — the CUDA nn kernel table (cuda/nn_*.cu) against the CPU
 * reference table (engine/nn/), through the checked entry points of nn.h.
 *
 * Every check draws fresh random inputs with the engine's Philox generator
 * (lucid_rand_uniform on the host; the seed is printed, LUCID_TEST_SEED=<n>
 * replays it), rounds them once to the activation dtype, runs the op on the
 * CPU and on the GPU from the same values, and compares.  GPU outputs are
 * poisoned with NaN first (forward outputs, and beta-0 backward outputs: a
 * kernel that reads them or forgets an element fails); beta-1 destinations
 * start from the same random values on both sides.  NaN never passes.
 *
 * Tolerances (stated once here):
 *   conv2d f32             relative Frobenius error <= 1e-5 (y, dx, dw, db)
 *   conv2d bf16/f16        <= 1e-2 against the CPU run on the same rounded
 *                          inputs (the GPU also rounds the weights)
 *   pointwise f32          (BN, SiLU, Add, channel_copy, Upsample, MaxPool,
 *                          softmax, DFL) relative Frobenius <= 1e-6
 *   pointwise bf16/f16     <= 1 ulp per element; ops with a reduction inside
 *                          (BN, softmax, DFL backward) may also differ by
 *                          1e-5 * max|ref| absolute (f32 vs f64 cancellation)
 *   f32 side outputs       (BN statistics, running stats, dw/db of a bf16
 *                          run) relative Frobenius <= 1e-5
 *   integer outputs        (maxpool indices, num_batches_tracked) exact
 *   determinism            every conv pass, every other backward (and the BN
 *                          forward) run twice on the GPU is bitwise identical
 *   BN reduction routes    the counter route (the last block of a channel
 *                          folds its partials) and the fallback route (a
 *                          separate final kernel; C > 131072 =
 *                          LUCID_CUDA_NN_COUNTERS) agree bitwise on the
 *                          channels they share (a channel's result depends
 *                          on its own data only; one part per channel
 *                          there, so both finish in the partial kernel);
 *                          with several parts per channel (10, 52, 130:
 *                          warp-0 and whole-block folds, vector and scalar
 *                          paths) the fallback recorded by a capture made
 *                          before the counters exist equals the eager
 *                          counter route bitwise
 * Conv cases: 3x3 s1/s2 pad 1, 1x1, dilation 2, groups 2, depthwise (s1 and
 * s2), odd sizes, 5x5, the network's implicit-GEMM shapes (layer 0 with
 * Cin 3, Cout 51, split-K filter gradient), with and without bias; each on
 * the auto route (bf16/f16 groups 1 = implicit GEMM), the direct kernels
 * (lucid_cuda_nn_set_conv_mode 1) and cuDNN (mode 2) for depthwise and for
 * bf16/f16 groups 1.  bf16/f16 1x1 convs with groups 1 run the auto route
 * twice, with the 1x1 switch forced to the implicit GEMM and to cuBLAS
 * (lucid_cuda_nn_set_conv1x1 1 / 2; only stride 1, pad 0, dilation 1 takes
 * cuBLAS, the other 1x1 cases check that the switch leaves them alone); the
 * 1x1 cases cover N 1 (the filter gradient's single GEMM) and N > 1 (its
 * partials fold), odd channel counts and plane sizes, bias or not, and
 * planes of P = H*W >= 3200 whose filter gradient the cuBLAS route cuts into S
 * chunks per image (nn_conv_gemm.cu, L 1600 unless LUCID_WGRAD_SPLIT says
 * otherwise): P 3200 with N 1 and N 3 (S 2), P 4096 with N 3 (S 2 < N: a
 * GEMM per chunk), P 25600 with N 1 (S 16: one GEMM batched over the
 * chunks), each beta 0 and 1 against the CPU and repeatable bitwise.
 * Capture: forward, backward-data (beta 0 and 1) and backward-params (beta 0
 * and 1) of 1x1 convs on both 1x1 routes (N 1, N 3, and N 1 at 64x64 whose
 * filter gradient splits), and of two stride-2 3x3 convs (the stride-phase
 * backward-data kernel, 1 and 4 k-slices), captured after one eager pass
 * into a CUDA graph (no allocation while capturing), replayed: bitwise
 * equal to the eager results.
 * Stride-phase backward-data (nn_conv_igemm.cuh, igemm_dgrad_ph; bf16/f16):
 * the six stride-2 3x3 convs of YOLO11n-pose with their channel counts
 * (16>32, 64>64, 128>128, 128>256, 64>64, 128>128) on smaller planes, the
 * full-size 16>32 320x320 and 128>256 40x40 at batch 4, a 16>128 (16-row
 * tiles, 4 k-slices) and a stride-2 1x1: beta 0 (poisoned) and beta 1
 * against the CPU (the conv tolerance above), beta 0 run twice bitwise, the
 * kernel's per-call weight transposition counted (one launch a call: the
 * route was taken), then the same with the switch off
 * (lucid_conv_igemm_set_dgrad_phase 0: igemm_nchw's phase form, no
 * transposition) against the CPU too.
 * BatchNorm cases (cuda/nn_norm.cuh's partition: planes of S >= 8192
 * elements cut into chunks of <= 8192, smaller planes grouped floor(8192/S)
 * to a part; vector path when S % 8 == 0, f32 S % 4 == 0): one part per
 * channel (4x16x32x32, tiny and odd planes, no affine, 3x5x6x10: vector in
 * f32 only), several parts per plane (2x8x100x90, 5x3x96x96 with odd N),
 * grouped planes (300x3x8x8: 128 planes a part); many parts per channel
 * (130x65x65: odd S, scalar, a plane a part; 300x2x64x72: 300 parts, more
 * than the 256 threads that fold them; the network's first layer
 * 4x16x320x320: 13 parts a plane, 52 a channel); C = 70001 > 65535 (grid.y
 * strides over channels, not a multiple of it) on the counter route and
 * C = 131100 on the fallback route; each with two training steps (running
 * stats, num_batches_tracked == 2) and every output run twice and compared
 * bitwise.  The one-part shapes run the default one-pass kernels
 * (LUCID_BN_ONEPASS), the multi-part ones of 2..128 parts the default
 * cluster kernels where the device takes cluster launches
 * (LUCID_BN_CLUSTER), the others the cooperative kernels where the grid
 * is co-resident (LUCID_BN_COOP; a grid of fewer channel columns looping
 * over the channels where the full one is not, opt-in:
 * LUCID_BN_COOP_LOOP=1); spec/c/test_nn_bnsilu_cuda.c compares each
 * bitwise with the two-launch route, plain and fused with SiLU.  A 3x3 conv with
 * bias on 100x90 planes sums its bias gradient over 2 parts a plane.
 * BatchNorm on more than INT32_MAX elements (test_bn_wide, the 64-bit
 * route of the element-wise kernels; also on the cluster route, where the
 * device takes it, and the cooperative one in rounds): 2x65539x24x683 bf16, training
 * forward and backward, plain and fused with SiLU, against the same calls
 * on channel slices (the 32-bit route): statistics, running stats and
 * gradient sums bitwise, y and dx every element equal (device difference
 * exactly 0) and bitwise on three channel ranges, which are also checked
 * against the CPU (the bf16 tolerances above); the reasons are given at
 * the case.  Needs about 14.5 GiB of device memory: with less free it
 * prints one skip line.
 * Without a CUDA device every group prints "skip ...: no CUDA device" and the
 * program exits 0.
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "train/graph.h"

/* cuda/nn_table.cu test hook; absent (NULL) in a CPU-only build */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv_mode(lucid_ctx *ctx, int mode);
/* cuda/nn_table.cu test hook: 1x1 route 0 LUCID_CONV1X1, 1 igemm, 2 gemm */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route);

/* cuda/nn_conv_igemm.cu test hooks (nn_conv_igemm.cuh) */
#if defined(__GNUC__)
__attribute__((weak))
#endif
void lucid_conv_igemm_set_dgrad_phase(int v);
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_conv_igemm_wt_cast_count(void);

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

static const char *dname(lucid_dtype dt) { return lucid_dtype_name(dt); }

/* ------------------------------------------------------------ comparisons
 * (test_cuda_util.h; g: a device tensor, r: its host reference) */

/* pointwise output: f32 rel 1e-6; bf16/f16 1 ulp (+ absf*max for reductions) */
static void cmp_pw(const char *name, const lucid_tensor *g,
                   const lucid_tensor *r, double absf) {
    if (r->dtype == LUCID_F32) cmp_rel(name, g, r, 1e-6);
    else cmp_ulp(name, g, r, 1, absf);
}

static double conv_tol(lucid_dtype dt) { return dt == LUCID_F32 ? 1e-5 : 1e-2; }

/* Snapshot of a device tensor (host copy) for the determinism checks. */
static lucid_tensor *snap(const lucid_tensor *g) { return host(g); }

/* ============================================================ Conv2d */

typedef struct conv_case {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int kh, kw, s, p, d, g, bias;
} conv_case;

static const conv_case CONV_CASES[] = {
    {"3x3 s1 p1 bias", 2, 8, 13, 11, 16, 3, 3, 1, 1, 1, 1, 1},
    {"3x3 s2 p1", 2, 16, 17, 15, 8, 3, 3, 2, 1, 1, 1, 0},
    {"1x1 bias", 3, 32, 9, 10, 24, 1, 1, 1, 0, 1, 1, 1},
    {"3x3 dil2 p2", 2, 8, 12, 13, 8, 3, 3, 1, 2, 2, 1, 0},
    {"3x3 groups2 bias", 2, 8, 10, 9, 12, 3, 3, 1, 1, 1, 2, 1},
    {"dw3x3 s1", 2, 16, 15, 14, 16, 3, 3, 1, 1, 1, 16, 0},
    {"dw3x3 s2 bias", 2, 12, 13, 17, 12, 3, 3, 2, 1, 1, 12, 1},
    {"3x3 s1 64x64", 4, 16, 64, 64, 32, 3, 3, 1, 1, 1, 1, 0},
    /* shapes of the network's bf16 implicit-GEMM route (nn_conv_igemm.cu) */
    {"1x1 64>64 40x40", 4, 64, 40, 40, 64, 1, 1, 1, 0, 1, 1, 0},
    {"3x3 s2 3>16 (layer 0)", 1, 3, 64, 64, 16, 3, 3, 2, 1, 1, 1, 0},
    {"3x3 51>51 bias", 2, 51, 20, 20, 51, 3, 3, 1, 1, 1, 1, 1},
    {"3x3 32>32 40x40 split-K", 4, 32, 40, 40, 32, 3, 3, 1, 1, 1, 1, 0},
    {"5x5 p2 bias", 1, 5, 11, 9, 7, 5, 5, 1, 2, 1, 1, 1},
    /* bias gradient over planes of 9000: 2 parts a plane (nn_norm_bwd.cu's sum) */
    {"3x3 bias 100x90", 2, 4, 100, 90, 4, 3, 3, 1, 1, 1, 1, 1},
    /* 1x1 shapes for the cuBLAS 1x1 route (nn_conv_gemm.cu) and its switch */
    {"1x1 N1 16>48 bias", 1, 16, 20, 20, 48, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 odd 7>5 13x11", 2, 7, 13, 11, 5, 1, 1, 1, 0, 1, 1, 0},
    {"1x1 128>32 N5 bias", 5, 128, 10, 12, 32, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 51>17 N1 7x9", 1, 51, 7, 9, 17, 1, 1, 1, 0, 1, 1, 0},
    {"1x1 32>64 80x80", 2, 32, 80, 80, 64, 1, 1, 1, 0, 1, 1, 0},
    /* P >= 3200: the cuBLAS filter gradient splits each image's columns
     * (nn_conv_gemm.cu; S with L 1600) */
    {"1x1 N1 24>16 40x80 (P 3200, wgrad split 2)", 1, 24, 40, 80, 16, 1, 1, 1, 0, 1, 1, 0},
    {"1x1 N3 24>16 40x80 bias (P 3200, wgrad split 2)", 3, 24, 40, 80, 16, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 N3 16>24 64x64 (wgrad split 2 < N)", 3, 16, 64, 64, 24, 1, 1, 1, 0, 1, 1, 0},
    {"1x1 N1 16>32 160x160 bias (wgrad split 16)", 1, 16, 160, 160, 32, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 s2 (not GEMM)", 2, 8, 9, 9, 16, 1, 1, 2, 0, 1, 1, 0},
    {"1x1 p1 bias (not GEMM)", 2, 8, 6, 7, 12, 1, 1, 1, 1, 1, 1, 1},
};

/* bf16/f16 1x1 groups 1: the auto route runs under both 1x1 switch values;
 * gemm_route: the cuBLAS route actually takes it. */
static int is_1x1(const conv_case *cc, lucid_dtype dt) {
    return dt != LUCID_F32 && cc->g == 1 && cc->kh == 1 && cc->kw == 1;
}
static int gemm_route(const conv_case *cc, lucid_dtype dt) {
    return is_1x1(cc, dt) && cc->s == 1 && cc->p == 0 && cc->d == 1;
}

/* mode: lucid_cuda_nn_set_conv_mode; c1: 1x1 switch (lucid_cuda_nn_set_conv1x1;
 * 0 leaves it to LUCID_CONV1X1). */
static void test_conv(const conv_case *cc, lucid_dtype dt, int mode, int c1) {
    const char *mname = mode == 0 ? (dt != LUCID_F32 && cc->g == 1
                                         ? (c1 == 2 ? (gemm_route(cc, dt) ? "auto=gemm"
                                                                          : "auto=igemm, 1x1 switch gemm")
                                                    : "auto=igemm")
                                         : "auto")
                        : mode == 1 ? "direct" : "cudnn";
    char pre[160];
    snprintf(pre, sizeof pre, "conv2d %s %s [%s]", cc->tag, dname(dt), mname);
    lucid_conv2d_params p = {cc->s, cc->s, cc->p, cc->p, cc->d, cc->d, cc->g};
    int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->p, cc->d);
    int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->p, cc->d);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W};
    int64_t ws[4] = {cc->Cout, cc->Cin / cc->g, cc->kh, cc->kw};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo};
    int64_t bs[1] = {cc->Cout};
    double fan = 1.0 / sqrt((double)(ws[1] * cc->kh * cc->kw));
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hw = hrand(LUCID_F32, 4, ws, -fan, fan);
    lucid_tensor *hb = cc->bias ? hrand(LUCID_F32, 1, bs, -fan, fan) : NULL;
    lucid_tensor *hdy = hrand(dt, 4, ys, -1, 1);
    lucid_tensor *hdx1 = hrand(dt, 4, xs, -1, 1), *hdw1 = hrand(LUCID_F32, 4, ws, -1, 1);
    lucid_tensor *hdb1 = hrand(LUCID_F32, 1, bs, -1, 1);
    lucid_tensor *dx_ = dev(hx), *dw_ = dev(hw), *db_ = hb ? dev(hb) : NULL, *ddy = dev(hdy);
    lucid_tensor *ry = hpoison(dt, 4, ys), *gy = dpoison(dt, 4, ys);
    lucid_tensor *rdx0 = hpoison(dt, 4, xs), *gdx0 = dpoison(dt, 4, xs);
    lucid_tensor *gdx1 = dev(hdx1), *rdx1 = NULL;
    lucid_tensor *rdw0 = hpoison(LUCID_F32, 4, ws), *gdw0 = dpoison(LUCID_F32, 4, ws);
    lucid_tensor *rdb0 = hpoison(LUCID_F32, 1, bs), *gdb0 = dpoison(LUCID_F32, 1, bs);
    lucid_tensor *gdw1 = dev(hdw1), *gdb1 = dev(hdb1), *s1 = NULL, *s2 = NULL, *s3 = NULL;
    lucid_tensor *rdw1 = NULL, *rdb1 = NULL, *s0 = NULL;
    if (!hx || !hw || !hdy || !dx_ || !dw_ || !ddy || !ry || !gy || !rdx0 || !gdx0 ||
        !gdx1 || !rdw0 || !gdw0 || !rdb0 || !gdb0 || !gdw1 || !gdb1 || (cc->bias && !db_)) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_tensor_clone(ctx, hdx1, &rdx1);
    lucid_tensor_clone(ctx, hdw1, &rdw1);
    lucid_tensor_clone(ctx, hdb1, &rdb1);
    if (lucid_cuda_nn_set_conv_mode) lucid_cuda_nn_set_conv_mode(ctx, mode);
    if (c1 && lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, c1);

    /* forward */
    RUN(NAME("%s: forward cpu", pre), lucid_nn_conv2d_forward(ctx, hx, ry, hw, hb, &p));
    RUN(NAME("%s: forward", pre), lucid_nn_conv2d_forward(ctx, dx_, gy, dw_, db_, &p));
    cmp_rel(NAME("%s: forward", pre), gy, ry, conv_tol(dt));
    s0 = snap(gy);
    lucid_fill(ctx, gy, NAN);
    RUN(NAME("%s: forward again", pre), lucid_nn_conv2d_forward(ctx, dx_, gy, dw_, db_, &p));
    cmp_bits(NAME("%s: forward deterministic", pre), gy, s0);

    /* backward data, beta 0 (poisoned) and beta 1 */
    RUN(NAME("%s: backward_input cpu", pre),
        lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx0, hw, &p, 0.0));
    RUN(NAME("%s: backward_input", pre),
        lucid_nn_conv2d_backward_input(ctx, dx_, ddy, gdx0, dw_, &p, 0.0));
    cmp_rel(NAME("%s: backward_input beta 0", pre), gdx0, rdx0, conv_tol(dt));
    s1 = snap(gdx0);
    RUN(NAME("%s: backward_input again", pre),
        lucid_nn_conv2d_backward_input(ctx, dx_, ddy, gdx0, dw_, &p, 0.0));
    cmp_bits(NAME("%s: backward_input deterministic", pre), gdx0, s1);
    RUN(NAME("%s: backward_input cpu beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx1, hw, &p, 1.0));
    RUN(NAME("%s: backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, dx_, ddy, gdx1, dw_, &p, 1.0));
    cmp_rel(NAME("%s: backward_input beta 1", pre), gdx1, rdx1, conv_tol(dt));

    /* backward params, beta 0 (poisoned) and beta 1 */
    RUN(NAME("%s: backward_params cpu", pre),
        lucid_nn_conv2d_backward_params(ctx, hx, hdy, rdw0, rdb0, &p, 0.0));
    RUN(NAME("%s: backward_params", pre),
        lucid_nn_conv2d_backward_params(ctx, dx_, ddy, gdw0, gdb0, &p, 0.0));
    cmp_rel(NAME("%s: backward_params dw beta 0", pre), gdw0, rdw0, conv_tol(dt));
    cmp_rel(NAME("%s: backward_params db beta 0", pre), gdb0, rdb0,
            dt == LUCID_F32 ? 1e-5 : 1e-5);
    s2 = snap(gdw0);
    s3 = snap(gdb0);
    RUN(NAME("%s: backward_params again", pre),
        lucid_nn_conv2d_backward_params(ctx, dx_, ddy, gdw0, gdb0, &p, 0.0));
    cmp_bits(NAME("%s: backward_params dw deterministic", pre), gdw0, s2);
    cmp_bits(NAME("%s: backward_params db deterministic", pre), gdb0, s3);
    RUN(NAME("%s: backward_params cpu beta 1", pre),
        lucid_nn_conv2d_backward_params(ctx, hx, hdy, rdw1, rdb1, &p, 1.0));
    RUN(NAME("%s: backward_params beta 1", pre),
        lucid_nn_conv2d_backward_params(ctx, dx_, ddy, gdw1, gdb1, &p, 1.0));
    cmp_rel(NAME("%s: backward_params dw beta 1", pre), gdw1, rdw1, conv_tol(dt));
    cmp_rel(NAME("%s: backward_params db beta 1", pre), gdb1, rdb1, 1e-5);
    /* bias only (frozen weight): dw NULL */
    if (cc->bias) {
        lucid_fill(ctx, gdb0, NAN);
        RUN(NAME("%s: backward_params bias-only", pre),
            lucid_nn_conv2d_backward_params(ctx, dx_, ddy, NULL, gdb0, &p, 0.0));
        cmp_rel(NAME("%s: backward_params bias-only db", pre), gdb0, rdb0, 1e-5);
    }
done:
    if (lucid_cuda_nn_set_conv_mode) lucid_cuda_nn_set_conv_mode(ctx, 0);
    if (c1 && lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    rel(s0);
    rel(hx); rel(hw); rel(hb); rel(hdy); rel(hdx1); rel(hdw1); rel(hdb1);
    rel(dx_); rel(dw_); rel(db_); rel(ddy); rel(ry); rel(gy); rel(rdx0); rel(gdx0);
    rel(gdx1); rel(rdx1); rel(rdw0); rel(gdw0); rel(rdb0); rel(gdb0); rel(gdw1);
    rel(gdb1); rel(rdw1); rel(rdb1); rel(s1); rel(s2); rel(s3);
}

/* Forward, backward-data (beta 0, 1) and backward-params (beta 0, 1) of a
 * conv on the auto route with the 1x1 switch at c1, eager (the warm-up:
 * the nn arena reaches its size) and then captured into a CUDA graph and
 * replayed once: every output bitwise equal to the eager one. */
static void test_conv_capture(const conv_case *cc, lucid_dtype dt, int c1) {
    char pre[160];
    snprintf(pre, sizeof pre, "conv2d capture %s %s [%s]", cc->tag, dname(dt),
             c1 == 2 ? "gemm" : "igemm");
    if (!cuda_test_graphs(pre)) return;
    lucid_conv2d_params p = {cc->s, cc->s, cc->p, cc->p, cc->d, cc->d, cc->g};
    int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->p, cc->d);
    int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->p, cc->d);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W};
    int64_t ws[4] = {cc->Cout, cc->Cin / cc->g, cc->kh, cc->kw};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo};
    int64_t bs[1] = {cc->Cout};
    lucid_graph *gr = NULL;
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hw = hrand(LUCID_F32, 4, ws, -0.5, 0.5);
    lucid_tensor *hb = cc->bias ? hrand(LUCID_F32, 1, bs, -0.5, 0.5) : NULL;
    lucid_tensor *hdy = hrand(dt, 4, ys, -1, 1), *hdx1 = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *hdw1 = hrand(LUCID_F32, 4, ws, -1, 1), *hdb1 = hrand(LUCID_F32, 1, bs, -1, 1);
    lucid_tensor *gx = dev(hx), *gw = dev(hw), *gb = hb ? dev(hb) : NULL, *gdy = dev(hdy);
    /* e*: eager, r*: recorded; beta-1 destinations start equal */
    lucid_tensor *ey = dpoison(dt, 4, ys), *ry = dpoison(dt, 4, ys);
    lucid_tensor *edx0 = dpoison(dt, 4, xs), *rdx0 = dpoison(dt, 4, xs);
    lucid_tensor *edx1 = dev(hdx1), *rdx1 = dev(hdx1);
    lucid_tensor *edw0 = dpoison(LUCID_F32, 4, ws), *rdw0 = dpoison(LUCID_F32, 4, ws);
    lucid_tensor *edb0 = dpoison(LUCID_F32, 1, bs), *rdb0 = dpoison(LUCID_F32, 1, bs);
    lucid_tensor *edw1 = dev(hdw1), *rdw1 = dev(hdw1), *edb1 = dev(hdb1), *rdb1 = dev(hdb1);
    lucid_tensor *h[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (!hx || !hw || !hdy || !hdx1 || !hdw1 || !hdb1 || !gx || !gw || !gdy || !ey || !ry ||
        !edx0 || !rdx0 || !edx1 || !rdx1 || !edw0 || !rdw0 || !edb0 || !rdb0 || !edw1 ||
        !rdw1 || !edb1 || !rdb1 || (cc->bias && (!hb || !gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv_mode(ctx, 0);
    lucid_cuda_nn_set_conv1x1(ctx, c1);
    RUN(NAME("%s: eager forward", pre), lucid_nn_conv2d_forward(ctx, gx, ey, gw, gb, &p));
    RUN(NAME("%s: eager backward_input", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx0, gw, &p, 0.0));
    RUN(NAME("%s: eager backward_input beta 1", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx1, gw, &p, 1.0));
    RUN(NAME("%s: eager backward_params", pre),
        lucid_nn_conv2d_backward_params(ctx, gx, gdy, edw0, gb ? edb0 : NULL, &p, 0.0));
    RUN(NAME("%s: eager backward_params beta 1", pre),
        lucid_nn_conv2d_backward_params(ctx, gx, gdy, edw1, gb ? edb1 : NULL, &p, 1.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_status s = lucid_nn_conv2d_forward(ctx, gx, ry, gw, gb, &p);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx0, gw, &p, 0.0);
        if (!s) s = lucid_nn_conv2d_backward_input(ctx, gx, gdy, rdx1, gw, &p, 1.0);
        if (!s)
            s = lucid_nn_conv2d_backward_params(ctx, gx, gdy, rdw0, gb ? rdb0 : NULL, &p, 0.0);
        if (!s)
            s = lucid_nn_conv2d_backward_params(ctx, gx, gdy, rdw1, gb ? rdb1 : NULL, &p, 1.0);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    TEST_OK(NAME("%s: captured without allocation", pre));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    h[0] = host(ey); h[1] = host(edx0); h[2] = host(edx1); h[3] = host(edw0);
    h[4] = host(edw1); h[5] = host(edb0); h[6] = host(edb1);
    cmp_bits(NAME("%s: replay y = eager", pre), ry, h[0]);
    cmp_bits(NAME("%s: replay dx beta 0 = eager", pre), rdx0, h[1]);
    cmp_bits(NAME("%s: replay dx beta 1 = eager", pre), rdx1, h[2]);
    cmp_bits(NAME("%s: replay dw beta 0 = eager", pre), rdw0, h[3]);
    cmp_bits(NAME("%s: replay dw beta 1 = eager", pre), rdw1, h[4]);
    if (gb) {
        cmp_bits(NAME("%s: replay db beta 0 = eager", pre), rdb0, h[5]);
        cmp_bits(NAME("%s: replay db beta 1 = eager", pre), rdb1, h[6]);
    }
done:
    if (gr) lucid_graph_destroy(gr);
    lucid_cuda_nn_set_conv1x1(ctx, 0);
    for (int i = 0; i < 7; i++) rel(h[i]);
    rel(hx); rel(hw); rel(hb); rel(hdy); rel(hdx1); rel(hdw1); rel(hdb1);
    rel(gx); rel(gw); rel(gb); rel(gdy); rel(ey); rel(ry); rel(edx0); rel(rdx0);
    rel(edx1); rel(rdx1); rel(edw0); rel(rdw0); rel(edb0); rel(rdb0); rel(edw1);
    rel(rdw1); rel(edb1); rel(rdb1);
}

static const conv_case CAPTURE_CASES[] = {
    {"1x1 N3 32>24 bias", 3, 32, 12, 10, 24, 1, 1, 1, 0, 1, 1, 1},
    {"1x1 N1 24>40", 1, 24, 16, 16, 40, 1, 1, 1, 0, 1, 1, 0},
    {"1x1 N1 16>32 64x64 bias (wgrad split 2)", 1, 16, 64, 64, 32, 1, 1, 1, 0, 1, 1, 1},
    /* the stride-phase backward-data kernel: 1 and 4 k-slices */
    {"3x3 s2 16>32 34x30", 2, 16, 34, 30, 32, 3, 3, 2, 1, 1, 1, 0},
    {"3x3 s2 128>256 20x20", 1, 128, 20, 20, 256, 3, 3, 2, 1, 1, 1, 0},
};

/* ---- the stride-phase backward-data kernel (nn_conv_igemm.cuh) */

static const conv_case PHASE_CASES[] = {
    /* YOLO11n-pose's stride-2 3x3 convs (model.1, 3, 5, 7, 17, 20), channel
     * counts kept, planes smaller (odd sizes too) */
    {"s2 16>32 (model.1) 50x46", 2, 16, 50, 46, 32, 3, 3, 2, 1, 1, 1, 0},
    {"s2 64>64 (model.3) 33x40", 2, 64, 33, 40, 64, 3, 3, 2, 1, 1, 1, 0},
    {"s2 128>128 (model.5) 24x24", 2, 128, 24, 24, 128, 3, 3, 2, 1, 1, 1, 0},
    {"s2 128>256 (model.7) 20x18", 2, 128, 20, 18, 256, 3, 3, 2, 1, 1, 1, 0},
    {"s2 64>64 (model.17) 24x21", 3, 64, 24, 21, 64, 3, 3, 2, 1, 1, 1, 0},
    {"s2 128>128 (model.20) 12x12", 4, 128, 12, 12, 128, 3, 3, 2, 1, 1, 1, 0},
    /* full size, batch 4, 640 */
    {"s2 16>32 (model.1) N4 320x320", 4, 16, 320, 320, 32, 3, 3, 2, 1, 1, 1, 0},
    {"s2 128>256 (model.7) N4 40x40", 4, 128, 40, 40, 256, 3, 3, 2, 1, 1, 1, 0},
    /* 16-row tiles with 4 k-slices; a 1x1 stride 2 (phases without taps) */
    {"s2 16>128 9x13", 1, 16, 9, 13, 128, 3, 3, 2, 1, 1, 1, 0},
    {"1x1 s2 32>24 11x9", 2, 32, 11, 9, 24, 1, 1, 2, 0, 1, 1, 0},
};

/* Backward-data of cc on the auto route with the stride-phase kernel's
 * switch at `on` (1: the kernel; 0: igemm_nchw's phase form): beta 0
 * (poisoned) and beta 1 against the CPU, beta 0 twice bitwise; the
 * kernel's per-call weight transposition launches counted (no shadow here:
 * one per call when on, none when off). */
static void test_dgrad_phase(const conv_case *cc, lucid_dtype dt, int on) {
    char pre[192];
    snprintf(pre, sizeof pre, "conv2d dgrad phase kernel %s %s [switch %s]", cc->tag, dname(dt),
             on ? "on" : "off");
    lucid_conv2d_params p = {cc->s, cc->s, cc->p, cc->p, cc->d, cc->d, cc->g};
    int64_t Ho = lucid_nn_conv_out_size(cc->H, cc->kh, cc->s, cc->p, cc->d);
    int64_t Wo = lucid_nn_conv_out_size(cc->W, cc->kw, cc->s, cc->p, cc->d);
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W};
    int64_t ws[4] = {cc->Cout, cc->Cin, cc->kh, cc->kw};
    int64_t ys[4] = {cc->N, cc->Cout, Ho, Wo};
    double fan = 1.0 / sqrt((double)(ws[1] * cc->kh * cc->kw));
    lucid_tensor *hx = hzeros(dt, 4, xs), *hw = hrand(LUCID_F32, 4, ws, -fan, fan);
    lucid_tensor *hdy = hrand(dt, 4, ys, -1, 1), *hdx1 = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *gx = dev(hx), *gw = dev(hw), *gdy = dev(hdy);
    lucid_tensor *rdx0 = hpoison(dt, 4, xs), *gdx0 = dpoison(dt, 4, xs);
    lucid_tensor *gdx1 = dev(hdx1), *rdx1 = NULL, *s0 = NULL;
    if (!hx || !hw || !hdy || !hdx1 || !gx || !gw || !gdy || !rdx0 || !gdx0 || !gdx1) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_tensor_clone(ctx, hdx1, &rdx1);
    lucid_conv_igemm_set_dgrad_phase(on);
    RUN(NAME("%s: cpu beta 0", pre), lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx0, hw, &p, 0.0));
    {
        unsigned long c0 = lucid_conv_igemm_wt_cast_count();
        RUN(NAME("%s: beta 0", pre), lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
        unsigned long nc = lucid_conv_igemm_wt_cast_count() - c0;
        CHECK(NAME("%s: %s", pre, on ? "the kernel ran (one weight transposition)"
                                      : "no weight transposition"),
              nc == (on ? 1ul : 0ul), "%lu transposition launches", nc);
    }
    cmp_rel(NAME("%s: beta 0", pre), gdx0, rdx0, conv_tol(dt));
    s0 = snap(gdx0);
    lucid_fill(ctx, gdx0, NAN);
    RUN(NAME("%s: beta 0 again", pre), lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx0, gw, &p, 0.0));
    cmp_bits(NAME("%s: beta 0 deterministic", pre), gdx0, s0);
    RUN(NAME("%s: cpu beta 1", pre), lucid_nn_conv2d_backward_input(ctx, hx, hdy, rdx1, hw, &p, 1.0));
    RUN(NAME("%s: beta 1", pre), lucid_nn_conv2d_backward_input(ctx, gx, gdy, gdx1, gw, &p, 1.0));
    cmp_rel(NAME("%s: beta 1", pre), gdx1, rdx1, conv_tol(dt));
done:
    lucid_conv_igemm_set_dgrad_phase(-1);
    rel(hx); rel(hw); rel(hdy); rel(hdx1); rel(gx); rel(gw); rel(gdy);
    rel(rdx0); rel(gdx0); rel(gdx1); rel(rdx1); rel(s0);
}

/* ============================================================ BatchNorm2d */

static void test_bn(int64_t N, int64_t C, int64_t H, int64_t W, int affine,
                    lucid_dtype dt) {
    char pre[160];
    snprintf(pre, sizeof pre, "batchnorm2d %lldx%lldx%lldx%lld%s %s", (long long)N,
             (long long)C, (long long)H, (long long)W, affine ? "" : " no-affine",
             dname(dt));
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    const double mom = 0.03, eps = 1e-3;
    double ptol = dt == LUCID_F32 ? 1e-6 : 1e-5; /* f32 side outputs */
    lucid_tensor *hw = affine ? hrand(LUCID_F32, 1, cs, 0.5, 1.5) : NULL;
    lucid_tensor *hb = affine ? hrand(LUCID_F32, 1, cs, -0.5, 0.5) : NULL;
    lucid_tensor *hrm = hrand(LUCID_F32, 1, cs, -0.2, 0.2);
    lucid_tensor *hrv = hrand(LUCID_F32, 1, cs, 0.5, 2.0);
    lucid_tensor *hnb = hzeros(LUCID_I64, 1, one);
    lucid_tensor *gw = hw ? dev(hw) : NULL, *gb = hb ? dev(hb) : NULL;
    lucid_tensor *grm = dev(hrm), *grv = dev(hrv), *gnb = dev(hnb);
    lucid_tensor *hsm = hpoison(LUCID_F32, 1, cs), *hsi = hpoison(LUCID_F32, 1, cs);
    lucid_tensor *gsm = dpoison(LUCID_F32, 1, cs), *gsi = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *hx = NULL, *gx = NULL, *hy = NULL, *gy = NULL, *hdy = NULL, *gdy = NULL;
    lucid_tensor *hdx = NULL, *gdx = NULL, *hdx1 = NULL, *gdx1 = NULL, *s1 = NULL, *s2 = NULL;
    lucid_tensor *hdwt = NULL, *gdwt = NULL, *hdbs = NULL, *gdbs = NULL;
    lucid_tensor *hdw1 = NULL, *gdw1 = NULL, *hdb1 = NULL, *gdb1 = NULL, *s3 = NULL;
    lucid_tensor *grm2 = NULL, *grv2 = NULL, *gnb2 = NULL, *gsm2 = NULL, *gsi2 = NULL;
    lucid_tensor *gy2 = NULL;
    if (!hrm || !hrv || !hnb || !grm || !grv || !gnb || !hsm || !hsi || !gsm || !gsi ||
        (affine && (!hw || !hb || !gw || !gb))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* clones of the running stats for the determinism re-run */
    grm2 = dev(hrm); grv2 = dev(hrv); gnb2 = dev(hnb);
    gsm2 = dpoison(LUCID_F32, 1, cs); gsi2 = dpoison(LUCID_F32, 1, cs);
    gy2 = dpoison(dt, 4, xs);
    /* two training steps, fresh x each */
    for (int step = 0; step < 2; step++) {
        rel(hx); rel(gx); rel(hy); rel(gy);
        hx = hrand(dt, 4, xs, -1.5, 2.5);
        gx = dev(hx);
        hy = hpoison(dt, 4, xs);
        gy = dpoison(dt, 4, xs);
        if (!hx || !gx || !hy || !gy) {
            TEST_FAIL(NAME("%s: setup step", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        RUN(NAME("%s: train forward cpu", pre),
            lucid_nn_batchnorm2d_forward(ctx, hx, hy, hw, hb, hrm, hrv, hnb, hsm, hsi, 1,
                                         mom, eps));
        RUN(NAME("%s: train forward", pre),
            lucid_nn_batchnorm2d_forward(ctx, gx, gy, gw, gb, grm, grv, gnb, gsm, gsi, 1,
                                         mom, eps));
        RUN(NAME("%s: train forward again", pre),
            lucid_nn_batchnorm2d_forward(ctx, gx, gy2, gw, gb, grm2, grv2, gnb2, gsm2, gsi2,
                                         1, mom, eps));
        cmp_pw(NAME("%s: train forward y step %d", pre, step + 1), gy, hy, 1e-5);
        cmp_rel(NAME("%s: save_mean step %d", pre, step + 1), gsm, hsm, ptol);
        cmp_rel(NAME("%s: save_invstd step %d", pre, step + 1), gsi, hsi, ptol);
        s1 = snap(gy);
        cmp_bits(NAME("%s: train forward deterministic step %d", pre, step + 1), gy2, s1);
        rel(s1); s1 = NULL;
    }
    cmp_rel(NAME("%s: running_mean after 2 steps", pre), grm, hrm, ptol);
    cmp_rel(NAME("%s: running_var after 2 steps", pre), grv, hrv, ptol);
    cmp_bits(NAME("%s: num_batches_tracked after 2 steps", pre), gnb, hnb);
    s1 = snap(grm); s2 = snap(grv);
    cmp_bits(NAME("%s: running_mean deterministic", pre), grm2, s1);
    cmp_bits(NAME("%s: running_var deterministic", pre), grv2, s2);
    rel(s1); rel(s2); s1 = s2 = NULL;

    /* training backward (uses the last step's saved statistics) */
    hdy = hrand(dt, 4, xs, -1, 1);
    gdy = dev(hdy);
    hdx = hpoison(dt, 4, xs); gdx = dpoison(dt, 4, xs);
    hdx1 = hrand(dt, 4, xs, -1, 1); gdx1 = dev(hdx1);
    hdwt = hpoison(LUCID_F32, 1, cs); gdwt = dpoison(LUCID_F32, 1, cs);
    hdbs = hpoison(LUCID_F32, 1, cs); gdbs = dpoison(LUCID_F32, 1, cs);
    hdw1 = hrand(LUCID_F32, 1, cs, -1, 1); gdw1 = dev(hdw1);
    hdb1 = hrand(LUCID_F32, 1, cs, -1, 1); gdb1 = dev(hdb1);
    if (!gdy || !gdx || !gdx1 || !gdwt || !gdbs || !gdw1 || !gdb1 || !hdx || !hdwt ||
        !hdbs) {
        TEST_FAIL(NAME("%s: setup backward", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: train backward cpu", pre),
        lucid_nn_batchnorm2d_backward(ctx, hx, hdy, hdx, hw, hsm, hsi, hdwt, hdbs, 1, 0.0,
                                      0.0));
    RUN(NAME("%s: train backward", pre),
        lucid_nn_batchnorm2d_backward(ctx, gx, gdy, gdx, gw, gsm, gsi, gdwt, gdbs, 1, 0.0,
                                      0.0));
    /* the CPU's saved stats are f64-exact roundings, the GPU's f32 sums: use
     * each side's own statistics (compared above) */
    cmp_pw(NAME("%s: train backward dx beta 0", pre), gdx, hdx, 1e-5);
    cmp_rel(NAME("%s: train backward dweight beta 0", pre), gdwt, hdwt, 1e-5);
    cmp_rel(NAME("%s: train backward dbias beta 0", pre), gdbs, hdbs, 1e-5);
    s1 = snap(gdx); s2 = snap(gdwt); s3 = snap(gdbs);
    RUN(NAME("%s: train backward again", pre),
        lucid_nn_batchnorm2d_backward(ctx, gx, gdy, gdx, gw, gsm, gsi, gdwt, gdbs, 1, 0.0,
                                      0.0));
    cmp_bits(NAME("%s: train backward dx deterministic", pre), gdx, s1);
    cmp_bits(NAME("%s: train backward dweight deterministic", pre), gdwt, s2);
    cmp_bits(NAME("%s: train backward dbias deterministic", pre), gdbs, s3);
    RUN(NAME("%s: train backward cpu beta 1", pre),
        lucid_nn_batchnorm2d_backward(ctx, hx, hdy, hdx1, hw, hsm, hsi, hdw1, hdb1, 1, 1.0,
                                      1.0));
    RUN(NAME("%s: train backward beta 1", pre),
        lucid_nn_batchnorm2d_backward(ctx, gx, gdy, gdx1, gw, gsm, gsi, gdw1, gdb1, 1, 1.0,
                                      1.0));
    cmp_pw(NAME("%s: train backward dx beta 1", pre), gdx1, hdx1, 1e-5);
    cmp_rel(NAME("%s: train backward dweight beta 1", pre), gdw1, hdw1, 1e-5);
    cmp_rel(NAME("%s: train backward dbias beta 1", pre), gdb1, hdb1, 1e-5);

    /* eval forward + backward (running statistics; dx only) */
    RUN(NAME("%s: eval forward cpu", pre),
        lucid_nn_batchnorm2d_forward(ctx, hx, hy, hw, hb, hrm, hrv, NULL, hsm, hsi, 0, mom,
                                     eps));
    lucid_fill(ctx, gy, NAN);
    RUN(NAME("%s: eval forward", pre),
        lucid_nn_batchnorm2d_forward(ctx, gx, gy, gw, gb, grm, grv, NULL, gsm, gsi, 0, mom,
                                     eps));
    /* 1 ulp, or 1e-6 of the largest |y|: the running statistics the two sides
     * use come from their own training steps (equal within ptol, not bitwise),
     * and y = x*scale + shift cancels to ~1e-7 where x ~ mean (seen on the
     * H200: 8.0e-08 vs 8.6e-08 in a tensor of max |y| ~ 3) */
    cmp_pw(NAME("%s: eval forward y", pre), gy, hy, 1e-6);
    cmp_rel(NAME("%s: eval save_invstd", pre), gsi, hsi, ptol);
    lucid_fill(ctx, gdx, NAN);
    RUN(NAME("%s: eval backward cpu", pre),
        lucid_nn_batchnorm2d_backward(ctx, hx, hdy, hdx, hw, hsm, hsi, NULL, NULL, 0, 0.0,
                                      0.0));
    RUN(NAME("%s: eval backward", pre),
        lucid_nn_batchnorm2d_backward(ctx, gx, gdy, gdx, gw, gsm, gsi, NULL, NULL, 0, 0.0,
                                      0.0));
    cmp_pw(NAME("%s: eval backward dx", pre), gdx, hdx, 0.0);
done:
    rel(hw); rel(hb); rel(hrm); rel(hrv); rel(hnb); rel(gw); rel(gb); rel(grm); rel(grv);
    rel(gnb); rel(hsm); rel(hsi); rel(gsm); rel(gsi); rel(hx); rel(gx); rel(hy); rel(gy);
    rel(hdy); rel(gdy); rel(hdx); rel(gdx); rel(hdx1); rel(gdx1); rel(s1); rel(s2); rel(s3);
    rel(hdwt); rel(gdwt); rel(hdbs); rel(gdbs); rel(hdw1); rel(gdw1); rel(hdb1); rel(gdb1);
    rel(grm2); rel(grv2); rel(gnb2); rel(gsm2); rel(gsi2); rel(gy2);
}

/* Host copy of the first Cs channels (dim 1; dim 0 of a 1-D tensor) of a
 * host tensor. */
static lucid_tensor *hfirst(const lucid_tensor *t, int64_t Cs) {
    if (!t) return NULL;
    int64_t shape[LUCID_MAX_DIMS], outer = 1, inner = 1;
    int cd = t->ndim == 1 ? 0 : 1;
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    for (int i = 0; i < cd; i++) outer *= t->shape[i];
    for (int i = cd + 1; i < t->ndim; i++) inner *= t->shape[i];
    shape[cd] = Cs;
    lucid_tensor *o = NULL;
    if (lucid_tensor_empty(ctx, CPU, t->dtype, t->ndim, shape, &o) != LUCID_OK) return NULL;
    size_t es = lucid_dtype_size(t->dtype), row = (size_t)(Cs * inner) * es;
    const char *src = lucid_tensor_data(t);
    char *dst = lucid_tensor_data(o);
    for (int64_t i = 0; i < outer; i++)
        memcpy(dst + (size_t)i * row, src + (size_t)(i * t->shape[cd] * inner) * es, row);
    return o;
}

/* The two reduction routes of the GPU BatchNorm2d (cuda/nn_norm.cuh): Cb
 * channels (> LUCID_CUDA_NN_COUNTERS: no counters) and the first Cs of
 * them alone (the counter route).  With 5x3x4 elements a channel is one
 * part, which both routes finish in the partial kernel (no fold; the
 * folds are compared by test_bn_routes_capture).  Channel c's results
 * depend on channel c's data only, so the shared channels must agree
 * bitwise: y, save_mean, save_invstd, running stats, num_batches_tracked,
 * dx, dweight, dbias. */
static void test_bn_routes(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "batchnorm2d routes counters = fallback %s", dname(dt));
    const int64_t N = 5, Cb = 131100, Cs = 77, H = 3, W = 4;
    const double mom = 0.1, eps = 1e-3;
    int64_t xb[4] = {N, Cb, H, W}, xs[4] = {N, Cs, H, W}, cb[1] = {Cb}, one[1] = {1};
    lucid_tensor *hx = hrand(dt, 4, xb, -1.5, 2.5), *hdy = hrand(dt, 4, xb, -1, 1);
    lucid_tensor *hw = hrand(LUCID_F32, 1, cb, 0.5, 1.5), *hb = hrand(LUCID_F32, 1, cb, -0.5, 0.5);
    lucid_tensor *hrm = hrand(LUCID_F32, 1, cb, -0.2, 0.2), *hrv = hrand(LUCID_F32, 1, cb, 0.5, 2);
    lucid_tensor *hnb = hzeros(LUCID_I64, 1, one);
    lucid_tensor *sx = hfirst(hx, Cs), *sdy = hfirst(hdy, Cs), *sw = hfirst(hw, Cs);
    lucid_tensor *sb = hfirst(hb, Cs), *srm = hfirst(hrm, Cs), *srv = hfirst(hrv, Cs);
    /* b*: all Cb channels (fallback), s*: the first Cs (counters) */
    lucid_tensor *bx = dev(hx), *bdy = dev(hdy), *bw = dev(hw), *bb = dev(hb);
    lucid_tensor *brm = dev(hrm), *brv = dev(hrv), *bnb = dev(hnb);
    lucid_tensor *gx = dev(sx), *gdy = dev(sdy), *gw = dev(sw), *gb = dev(sb);
    lucid_tensor *grm = dev(srm), *grv = dev(srv), *gnb = dev(hnb);
    lucid_tensor *by = dpoison(dt, 4, xb), *gy = dpoison(dt, 4, xs);
    lucid_tensor *bdx = dpoison(dt, 4, xb), *gdx = dpoison(dt, 4, xs);
    lucid_tensor *bsm = dpoison(LUCID_F32, 1, cb), *bsi = dpoison(LUCID_F32, 1, cb);
    lucid_tensor *bdw = dpoison(LUCID_F32, 1, cb), *bdb = dpoison(LUCID_F32, 1, cb);
    int64_t cs[1] = {Cs};
    lucid_tensor *gsm = dpoison(LUCID_F32, 1, cs), *gsi = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *gdw = dpoison(LUCID_F32, 1, cs), *gdb = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *r[10] = {NULL};
    if (!bx || !bdy || !bw || !bb || !brm || !brv || !bnb || !gx || !gdy || !gw || !gb ||
        !grm || !grv || !gnb || !by || !gy || !bdx || !gdx || !bsm || !bsi || !bdw || !bdb ||
        !gsm || !gsi || !gdw || !gdb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    for (int step = 1; step <= 2; step++) {
        RUN(NAME("%s: fallback forward", pre),
            lucid_nn_batchnorm2d_forward(ctx, bx, by, bw, bb, brm, brv, bnb, bsm, bsi, 1, mom,
                                         eps));
        RUN(NAME("%s: counters forward", pre),
            lucid_nn_batchnorm2d_forward(ctx, gx, gy, gw, gb, grm, grv, gnb, gsm, gsi, 1, mom,
                                         eps));
    }
    RUN(NAME("%s: fallback backward", pre),
        lucid_nn_batchnorm2d_backward(ctx, bx, bdy, bdx, bw, bsm, bsi, bdw, bdb, 1, 0.0, 0.0));
    RUN(NAME("%s: counters backward", pre),
        lucid_nn_batchnorm2d_backward(ctx, gx, gdy, gdx, gw, gsm, gsi, gdw, gdb, 1, 0.0, 0.0));
    {
        const lucid_tensor *big[9] = {by, bsm, bsi, brm, brv, bdx, bdw, bdb, bnb};
        const lucid_tensor *small[9] = {gy, gsm, gsi, grm, grv, gdx, gdw, gdb, gnb};
        const char *what[9] = {"y", "save_mean", "save_invstd", "running_mean (2 steps)",
                               "running_var (2 steps)", "dx", "dweight", "dbias",
                               "num_batches_tracked (2)"};
        for (int i = 0; i < 9; i++) {
            lucid_tensor *h = host(big[i]);
            r[i] = i == 8 ? h : hfirst(h, Cs);
            if (i != 8) rel(h);
            if (!r[i]) {
                TEST_FAIL(NAME("%s: %s copy back", pre, what[i]), "%s", lucid_ctx_error(ctx));
                continue;
            }
            cmp_bits(NAME("%s: %s (bitwise)", pre, what[i]), small[i], r[i]);
        }
        if (r[8])
            CHECK(NAME("%s: num_batches_tracked == 2", pre), test_hget(r[8], 0) == 2.0,
                  "num_batches_tracked %g", test_hget(r[8], 0));
    }
done:
    rel(hx); rel(hdy); rel(hw); rel(hb); rel(hrm); rel(hrv); rel(hnb);
    rel(sx); rel(sdy); rel(sw); rel(sb); rel(srm); rel(srv);
    rel(bx); rel(bdy); rel(bw); rel(bb); rel(brm); rel(brv); rel(bnb);
    rel(gx); rel(gdy); rel(gw); rel(gb); rel(grm); rel(grv); rel(gnb);
    rel(by); rel(gy); rel(bdx); rel(gdx); rel(bsm); rel(bsi); rel(bdw); rel(bdb);
    rel(gsm); rel(gsi); rel(gdw); rel(gdb);
    for (int i = 0; i < 10; i++) rel(r[i]);
}

/* The two reduction routes with more than one part per channel
 * (cuda/nn_norm.cuh): a fresh context whose warm-up ran BN only on more
 * channels than the fold counters cover (so the counters do not exist yet;
 * the arena grows there: 4x131100x1x1 needs more than the shapes below),
 * then the training forward, backward (dx, dweight, dbias) and a dbias-only
 * backward (the sums without x) of an N x C x H x W shape captured (the
 * fallback route is recorded: partial kernels, then the separate final
 * kernels), replayed twice, and compared bitwise with the same calls run
 * twice eagerly afterwards (the counter route: the last block of each
 * channel folds). */
static void test_bn_routes_capture(lucid_dtype dt, int64_t N, int64_t C, int64_t H,
                                   int64_t W) {
    char pre[128];
    snprintf(pre, sizeof pre, "batchnorm2d routes counters = captured fallback %lldx%lldx%lldx%lld %s",
             (long long)N, (long long)C, (long long)H, (long long)W, dname(dt));
    lucid_ctx *main_ctx = NULL;
    if (!cuda_test_enter_fresh(pre, &main_ctx)) return; /* ctx: a fresh context */
    const double mom = 0.1, eps = 1e-3;
    int64_t bxs[4] = {4, 131100, 1, 1}, bcs[1] = {131100};
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    lucid_graph *g = NULL;
    lucid_tensor *hx = hrand(dt, 4, xs, -1.5, 2.5), *hdy = hrand(dt, 4, xs, -1, 1);
    lucid_tensor *hw = hrand(LUCID_F32, 1, cs, 0.5, 1.5), *hb = hrand(LUCID_F32, 1, cs, -0.5, 0.5);
    lucid_tensor *hrm = hrand(LUCID_F32, 1, cs, -0.2, 0.2), *hrv = hrand(LUCID_F32, 1, cs, 0.5, 2);
    lucid_tensor *hnb = hzeros(LUCID_I64, 1, one), *hbx = hrand(dt, 4, bxs, -2, 3);
    lucid_tensor *hbw = hrand(LUCID_F32, 1, bcs, 0.5, 1.5);
    /* b*: the warm-up; e*: eager (counters); r*: recorded (fallback) */
    lucid_tensor *bx = dev(hbx), *bw = dev(hbw), *by = dpoison(dt, 4, bxs);
    lucid_tensor *bdx = dpoison(dt, 4, bxs), *bsm = dpoison(LUCID_F32, 1, bcs);
    lucid_tensor *bsi = dpoison(LUCID_F32, 1, bcs), *bdw = dpoison(LUCID_F32, 1, bcs);
    lucid_tensor *bdb = dpoison(LUCID_F32, 1, bcs);
    lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *gw = dev(hw), *gb = dev(hb);
    lucid_tensor *erm = dev(hrm), *erv = dev(hrv), *enb = dev(hnb);
    lucid_tensor *rrm = dev(hrm), *rrv = dev(hrv), *rnb = dev(hnb);
    lucid_tensor *ey = dpoison(dt, 4, xs), *ry = dpoison(dt, 4, xs);
    lucid_tensor *edx = dpoison(dt, 4, xs), *rdx = dpoison(dt, 4, xs);
    lucid_tensor *esm = dpoison(LUCID_F32, 1, cs), *rsm = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *esi = dpoison(LUCID_F32, 1, cs), *rsi = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *edw = dpoison(LUCID_F32, 1, cs), *rdw = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *edb = dpoison(LUCID_F32, 1, cs), *rdb = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *edb2 = dpoison(LUCID_F32, 1, cs), *rdb2 = dpoison(LUCID_F32, 1, cs);
    lucid_tensor *all[] = {hx,  hdy, hw,  hb,  hrm, hrv, hnb, hbx, hbw,  bx,   bw,  by,
                           bdx, bsm, bsi, bdw, bdb, gx,  gdy, gw,  gb,   erm,  erv, enb,
                           rrm, rrv, rnb, ey,  ry,  edx, rdx, esm, rsm,  esi,  rsi, edw,
                           rdw, edb, rdb, edb2, rdb2};
    const int nall = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < nall; i++)
        if (!all[i]) {
            TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
    RUN(NAME("%s: warm-up forward", pre),
        lucid_nn_batchnorm2d_forward(ctx, bx, by, bw, NULL, NULL, NULL, NULL, bsm, bsi, 1,
                                     mom, eps));
    RUN(NAME("%s: warm-up backward", pre),
        lucid_nn_batchnorm2d_backward(ctx, bx, by, bdx, bw, bsm, bsi, bdw, bdb, 1, 0.0, 0.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_status s = lucid_nn_batchnorm2d_forward(ctx, gx, ry, gw, gb, rrm, rrv, rnb, rsm,
                                                      rsi, 1, mom, eps);
        if (!s)
            s = lucid_nn_batchnorm2d_backward(ctx, gx, gdy, rdx, gw, rsm, rsi, rdw, rdb, 1, 0.0,
                                              0.0);
        if (!s)
            s = lucid_nn_batchnorm2d_backward(ctx, gx, gdy, NULL, gw, rsm, rsi, NULL, rdb2, 1,
                                              0.0, 0.0);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
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
            lucid_nn_batchnorm2d_forward(ctx, gx, ey, gw, gb, erm, erv, enb, esm, esi, 1, mom,
                                         eps));
        RUN(NAME("%s: eager backward", pre),
            lucid_nn_batchnorm2d_backward(ctx, gx, gdy, edx, gw, esm, esi, edw, edb, 1, 0.0,
                                          0.0));
        RUN(NAME("%s: eager backward dbias only", pre),
            lucid_nn_batchnorm2d_backward(ctx, gx, gdy, NULL, gw, esm, esi, NULL, edb2, 1, 0.0,
                                          0.0));
    }
    {
        const lucid_tensor *rr[10] = {ry, rsm, rsi, rrm, rrv, rnb, rdx, rdw, rdb, rdb2};
        const lucid_tensor *ee[10] = {ey, esm, esi, erm, erv, enb, edx, edw, edb, edb2};
        const char *what[10] = {"y", "save_mean", "save_invstd", "running_mean (2 updates)",
                                "running_var (2 updates)", "num_batches_tracked", "dx",
                                "dweight", "dbias", "dbias (alone)"};
        for (int i = 0; i < 10; i++) {
            lucid_tensor *h = snap(ee[i]);
            if (!h) {
                TEST_FAIL(NAME("%s: %s copy back", pre, what[i]), "%s", lucid_ctx_error(ctx));
                continue;
            }
            cmp_bits(NAME("%s: fallback replay %s = counter eager", pre, what[i]), rr[i], h);
            rel(h);
        }
    }
done:
    if (g) lucid_graph_destroy(g);
    for (int i = 0; i < nall; i++) rel(all[i]);
    cuda_test_leave_fresh(main_ctx);
}

/* ============================================================ BatchNorm2d, 64-bit route
 *
 * The element-wise BatchNorm kernels (bn_apply, bn_dx) index in 32 bits
 * when N*C*S <= INT32_MAX and take the 64-bit route BN_ROUTE_WIDE
 * otherwise (cuda/nn_norm.cuh, bn_route).  test_bn_wide runs the training
 * forward (statistics + apply) and the training backward (dx, dweight,
 * dbias) in bf16 on WIDE_N x WIDE_C x WIDE_H x WIDE_W = 2 x 65539 x 24 x
 * 683 = 2^31 + 1146928 elements (4.0 GiB a tensor):
 *   - S = 16392 >= 8192: 3 chunks a plane, 6 parts a channel, so neither
 *     direction takes the one-pass kernels (they have no 32-bit route) and
 *     every channel's partials are folded by its last block (C = 65539 <=
 *     LUCID_CUDA_NN_COUNTERS: the counter route);
 *   - C > 65535: channels 65535.. are reached by grid.y striding; element
 *     2^31 lies in channel 65469 of image 1, so channels 65469.. of image 1
 *     are past INT32_MAX;
 *   - S % 8 == 0 and 16-byte aligned storage: the reductions take the
 *     vector path on both sides of the comparison, the element-wise kernels
 *     the scalar 64-bit route on the big tensor and the 32-bit vector route
 *     on the slices.
 * Reference: the same call on channel slices of at most WIDE_SLICE
 * channels (contiguous device copies made with lucid_tensor_clone; 32-bit
 * route), whose own correctness the cases above check against the CPU.  A
 * channel's results depend only on its own data and on the partition,
 * which is a function of (N, S) only, and the vector choice of the
 * reductions is the same on both sides, so the statistics and gradient sums
 * must agree bitwise; y and dx are computed per element by the same
 * expressions from the same f32 per-channel values (the route changes only
 * the indexing), so they must agree exactly too.  Tolerances:
 *   save_mean, save_invstd, running stats, dweight, dbias: bitwise;
 *   num_batches_tracked: exactly 1;
 *   y, dx over all 2^31+ elements: every difference (big - slice, computed
 *     on the device in f32 and rounded to bf16, which is nonzero whenever
 *     two bf16 values differ, NaN when either is NaN) exactly 0: max = min
 *     = 0;
 *   y, dx of three channel ranges (channels 0-1; 65468-65470 around element
 *     2^31; 65536-65538, the last, strided by grid.y): bitwise against the
 *     slice call, and against the CPU with the tolerances of test_bn for
 *     bf16 (y, dx: 1 ulp or 1e-5 * max|ref|; save_mean, save_invstd,
 *     running stats, dweight, dbias: relative Frobenius 1e-5), each side
 *     with its own statistics.
 * The test hook lucid_cuda_bn_wide_count (cuda/nn_norm_fwd.cu) checks that
 * the big calls took BN_ROUTE_WIDE (one launch per direction) and the slice
 * calls did not.  Both the plain and the fused BatchNorm2d + SiLU run.
 * Memory: x, y (then dy, drawn into y's storage after the forward checks),
 * dx: 12.0 GiB, plus 3 slice tensors of 0.5 GiB; given back to the driver
 * afterwards (lucid_memory_empty_cache).  With less free device memory
 * than that and 1 GiB to spare (cudaMemGetInfo), or when an allocation
 * fails with ERR_OOM, the case prints one "skip" line. */

/* cudart's free-memory query (cudaError_t: an int-sized enum, 0 =
 * cudaSuccess); weak: NULL in a build without cudart */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
/* cuda/nn_norm_fwd.cu test hook: BatchNorm element-wise launches this
 * thread queued on BN_ROUTE_WIDE; absent (NULL) in a CPU-only build */
#if defined(__GNUC__)
__attribute__((weak))
#endif
unsigned long lucid_cuda_bn_wide_count(void);

#define WIDE_N 2
#define WIDE_C 65539
#define WIDE_H 24
#define WIDE_W 683
#define WIDE_SLICE 8192 /* channels per reference call */
#define WIDE_NR 3       /* channel ranges checked bitwise and against the CPU */

static unsigned long wide_count(void) {
    return lucid_cuda_bn_wide_count ? lucid_cuda_bn_wide_count() : 0;
}

/* A view of t narrowed along dim, or NULL. */
static lucid_tensor *wnarrow(const lucid_tensor *t, int dim, int64_t start, int64_t len) {
    lucid_tensor *o = NULL;
    if (!t || lucid_tensor_narrow(ctx, t, dim, start, len, &o) != LUCID_OK) return NULL;
    return o;
}

/* A contiguous copy of t on t's device, or NULL. */
static lucid_tensor *wclone(const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (!t || lucid_tensor_clone(ctx, t, &o) != LUCID_OK) return NULL;
    return o;
}

/* Training forward / backward (beta 0), plain or fused with SiLU. */
static lucid_status wide_fwd(int silu, const lucid_tensor *x, lucid_tensor *y,
                             const lucid_tensor *w, const lucid_tensor *b, lucid_tensor *rm,
                             lucid_tensor *rv, lucid_tensor *nb, lucid_tensor *sm,
                             lucid_tensor *si) {
    return silu ? lucid_nn_batchnorm2d_silu_forward(ctx, x, y, w, b, rm, rv, nb, sm, si, 1,
                                                    0.03, 1e-3)
                : lucid_nn_batchnorm2d_forward(ctx, x, y, w, b, rm, rv, nb, sm, si, 1, 0.03,
                                               1e-3);
}

static lucid_status wide_bwd(int silu, const lucid_tensor *x, const lucid_tensor *dy,
                             lucid_tensor *dx, const lucid_tensor *w, const lucid_tensor *b,
                             const lucid_tensor *sm, const lucid_tensor *si, lucid_tensor *dw,
                             lucid_tensor *db) {
    return silu ? lucid_nn_batchnorm2d_silu_backward(ctx, x, dy, dx, w, b, sm, si, dw, db, 1,
                                                     0.0, 0.0)
                : lucid_nn_batchnorm2d_backward(ctx, x, dy, dx, w, sm, si, dw, db, 1, 0.0, 0.0);
}

/* d = a - b on the device (a: any strides; b, d contiguous of a's shape and
 * dtype), then *dmax = max d, *dmin = min d (NaN propagates).  LUCID_OK or
 * the failing call's status. */
static lucid_status wide_diff(const lucid_tensor *a, const lucid_tensor *b, lucid_tensor *d,
                              double *dmax, double *dmin) {
    lucid_status s = lucid_binary(ctx, LUCID_OP_SUB, d, a, b);
    if (!s) s = lucid_reduce_item(ctx, LUCID_REDUCE_MAX, d, dmax);
    if (!s) s = lucid_reduce_item(ctx, LUCID_REDUCE_MIN, d, dmin);
    return s;
}

/* A setup step of test_bn_wide failed: a skip when the device ran out of
 * memory (other tests share it), else a failure. */
static void wide_setup_fail(const char *name) {
    if (lucid_ctx_last_status(ctx) == LUCID_ERR_OOM)
        TEST_SKIP(name, "device memory: %s", lucid_ctx_error(ctx));
    else
        TEST_FAIL(name, "%s", lucid_ctx_error(ctx));
}

/* Range r's n GPU results gg[i] (the first per element, dimension 1; the
 * others per channel, dimension 0) against the CPU's cc[i]: 1 ulp or 1e-5 of
 * the largest for the first, relative 1e-5 for the others. */
static void wide_cmp_cpu(const char *pre, const char *rg, int n, const lucid_tensor *const *gg,
                         const lucid_tensor *const *cc, const char *const *what, int64_t r0,
                         int64_t rn) {
    for (int i = 0; i < n; i++) {
        lucid_tensor *t = wnarrow(gg[i], i == 0 ? 1 : 0, r0, rn);
        const char *nm_ = NAME("%s: %s %s vs cpu", pre, rg, what[i]);
        if (!t) TEST_FAIL(nm_, "view: %s", lucid_ctx_error(ctx));
        else if (i == 0) cmp_ulp(nm_, t, cc[i], 1, 1e-5);
        else cmp_rel(nm_, t, cc[i], 1e-5);
        rel(t);
    }
}

/* Host copies of the channel ranges [r0[r], r0[r]+rn[r]) of t (dimension 1)
 * into out[r]; 0 (one failed check named "<pre>: copy <what> back") when a
 * copy fails. */
static int wide_host_ranges(const char *pre, const char *what, const lucid_tensor *t,
                            const int64_t *r0, const int64_t *rn, lucid_tensor **out) {
    for (int r = 0; r < WIDE_NR; r++) {
        lucid_tensor *v = wnarrow(t, 1, r0[r], rn[r]);
        out[r] = host(v);
        rel(v);
        if (!out[r]) {
            TEST_FAIL(NAME("%s: copy %s back", pre, what), "%s", lucid_ctx_error(ctx));
            return 0;
        }
    }
    return 1;
}

/* The channel ranges [r0[r], r0[r]+rn[r]) of the big result big that fall in
 * the slice [c0, c0+cn) compared bitwise with the slice result sl (channel
 * dimension 1), one check each, named "<pre>: <what> channels a..b". */
static void wide_cmp_ranges(const char *pre, const char *what, const lucid_tensor *big,
                            const lucid_tensor *sl, int64_t c0, int64_t cn,
                            const int64_t *r0, const int64_t *rn) {
    for (int r = 0; r < WIDE_NR; r++) {
        if (r0[r] < c0 || r0[r] + rn[r] > c0 + cn) continue;
        lucid_tensor *t1 = wnarrow(big, 1, r0[r], rn[r]);
        lucid_tensor *t2 = wnarrow(sl, 1, r0[r] - c0, rn[r]);
        lucid_tensor *h = host(t2);
        if (t1 && h)
            cmp_bits(NAME("%s: %s channels %lld..%lld = 32-bit route (bitwise)", pre, what,
                          (long long)r0[r], (long long)(r0[r] + rn[r] - 1)),
                     t1, h);
        else
            TEST_FAIL(NAME("%s: %s range copy", pre, what), "%s", lucid_ctx_error(ctx));
        rel(h); rel(t1); rel(t2);
    }
}

/* The wide launches test_bn_wide expects per training call: 1 with
 * LUCID_BN_COOP_LOOP=0 (the default: the two-launch 64-bit kernels, the
 * route it was written for), 0 with LUCID_BN_COOP_LOOP=1 (the cooperative
 * kernels in rounds of channel columns take these shapes: DECISIONS 37; on the H200, session 12 call 3,
 * their values around element 2^31 matched the CPU while the route checks
 * still expected the 64-bit kernels) and 0 on the cluster route (a cluster
 * of 6 blocks per channel row, 65535 rows, the channel loop for the last
 * 4: LUCID_BN_CLUSTER; the other arms turn it off for the context,
 * lucid_cuda_nn_set_bn_cluster).  g_wide_route names the arm. */
static int g_wide_expect = 1;
static const char *g_wide_route = "64-bit two-launch";
static const char *wide_route_name(void) { return g_wide_route; }

/* cuda/nn_table.cu and nn_norm_fwd.cu: the context's cluster route (0
 * LUCID_BN_CLUSTER, 1 off, 2 on) and whether the device takes cluster
 * launches (its SM count, else 0); NULL in a CPU-only build */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_bn_cluster(lucid_ctx *ctx, int mode);
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_bn_cluster_sm_count(void);
static void wide_cluster(int mode) {
    if (lucid_cuda_nn_set_bn_cluster) lucid_cuda_nn_set_bn_cluster(ctx, mode);
}

static void test_bn_wide(int silu) {
    const lucid_dtype dt = LUCID_BF16, F = LUCID_F32;
    const int64_t N = WIDE_N, C = WIDE_C, H = WIDE_H, W = WIDE_W, S = H * W;
    const int64_t NCS = N * C * S, CS = C * S;
    const double GiB = 1073741824.0;
    const double need = 2.0 * (3.0 * (double)NCS + 3.0 * (double)(N * WIDE_SLICE * S)) + GiB;
    char pre[128];
    snprintf(pre, sizeof pre, "batchnorm2d%s over 2^31 elements, %s route, %lldx%lldx%lldx%lld bf16",
             silu ? "+silu" : "", wide_route_name(), (long long)N, (long long)C, (long long)H,
             (long long)W);
    /* channel ranges: the first two, three around element 2^31 (image
     * 2^31 / CS, channel (2^31 % CS) / S), the last three */
    const int64_t cx = ((int64_t)1 << 31) % CS / S;
    const int64_t r0[WIDE_NR] = {0, cx - 1, C - 3}, rn[WIDE_NR] = {2, 3, 3};
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C}, one[1] = {1};
    lucid_tensor *gx = NULL, *gy = NULL, *gdx = NULL;
    lucid_tensor *hw = NULL, *hb = NULL, *hrm = NULL, *hrv = NULL, *hnb = NULL;
    lucid_tensor *gw = NULL, *gb = NULL, *grm = NULL, *grv = NULL, *gnb = NULL;
    lucid_tensor *gsm = NULL, *gsi = NULL, *gdw = NULL, *gdb = NULL;
    lucid_tensor *rrm = NULL, *rrv = NULL, *rsm = NULL, *rsi = NULL, *rdw = NULL, *rdb = NULL;
    /* one slice call: views v* of the big tensors, copies and outputs s* */
    lucid_tensor *vx = NULL, *vy = NULL, *vw = NULL, *vb = NULL, *vrm = NULL, *vrv = NULL;
    lucid_tensor *vsm = NULL, *vsi = NULL, *vdw = NULL, *vdb = NULL;
    lucid_tensor *sx = NULL, *sy = NULL, *sdy = NULL, *t1 = NULL, *t2 = NULL;
    /* per range: host x, dy and the CPU's outputs */
    lucid_tensor *hxr[WIDE_NR] = {NULL}, *hyr[WIDE_NR] = {NULL}, *hsmr[WIDE_NR] = {NULL};
    lucid_tensor *hsir[WIDE_NR] = {NULL}, *hdyr[WIDE_NR] = {NULL}, *hdxr[WIDE_NR] = {NULL};
    lucid_tensor *hdwr[WIDE_NR] = {NULL}, *hdbr[WIDE_NR] = {NULL};
    unsigned long w0;
    lucid_status s;
    int nslice = 0;
    int64_t bad0 = -1;
    double bmax = 0, bmin = 0;

    lucid_ctx_clear_error(ctx); /* wide_setup_fail reads the last status */
    lucid_memory_empty_cache(ctx); /* blocks cached by the cases before */
    if (cudaMemGetInfo) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == 0 && (double)fr < need) {
            TEST_SKIP(pre, "needs about %.1f GiB of free device memory, %.1f GiB free",
                      need / GiB, (double)fr / GiB);
            return;
        }
    }
    if (!lucid_cuda_bn_wide_count) {
        TEST_FAIL(NAME("%s: route hook linked", pre),
                  "lucid_cuda_bn_wide_count missing (cuda/nn_norm_fwd.cu)");
        return;
    }
    /* the three big tensors: running out of device memory is a skip */
    s = lucid_tensor_empty(ctx, GPU, dt, 4, xs, &gx);
    if (!s) s = lucid_tensor_empty(ctx, GPU, dt, 4, xs, &gy);
    if (!s) s = lucid_tensor_empty(ctx, GPU, dt, 4, xs, &gdx);
    if (s != LUCID_OK) {
        wide_setup_fail(NAME("%s: allocate %.1f GiB", pre, 3.0 * 2.0 * (double)NCS / GiB));
        goto done;
    }
    RUN(NAME("%s: draw x", pre), lucid_rand_uniform(ctx, gx, g_seed, g_off, -1.5, 2.5));
    g_off += (uint64_t)NCS;
    RUN(NAME("%s: poison y", pre), lucid_fill(ctx, gy, NAN));
    RUN(NAME("%s: poison dx", pre), lucid_fill(ctx, gdx, NAN));
    hw = hrand(F, 1, cs, 0.5, 1.5);
    hb = hrand(F, 1, cs, -0.5, 0.5);
    hrm = hrand(F, 1, cs, -0.2, 0.2);
    hrv = hrand(F, 1, cs, 0.5, 2.0);
    hnb = hzeros(LUCID_I64, 1, one);
    gw = dev(hw); gb = dev(hb); grm = dev(hrm); grv = dev(hrv); gnb = dev(hnb);
    rrm = dev(hrm); rrv = dev(hrv);
    gsm = dpoison(F, 1, cs); gsi = dpoison(F, 1, cs);
    gdw = dpoison(F, 1, cs); gdb = dpoison(F, 1, cs);
    rsm = dpoison(F, 1, cs); rsi = dpoison(F, 1, cs);
    rdw = dpoison(F, 1, cs); rdb = dpoison(F, 1, cs);
    if (!hw || !hb || !hrm || !hrv || !hnb || !gw || !gb || !grm || !grv || !gnb || !rrm ||
        !rrv || !gsm || !gsi || !gdw || !gdb || !rsm || !rsi || !rdw || !rdb) {
        wide_setup_fail(NAME("%s: setup", pre));
        goto done;
    }
    /* host copies of the ranges' x (the CPU side) */
    if (!wide_host_ranges(pre, "x", gx, r0, rn, hxr)) goto done;

    /* ---- forward: the big call, then the slices */
    w0 = wide_count();
    RUN(NAME("%s: train forward", pre), wide_fwd(silu, gx, gy, gw, gb, grm, grv, gnb, gsm, gsi));
    CHECK(NAME("%s: train forward takes the %s route", pre, wide_route_name()),
          wide_count() - w0 == (unsigned long)g_wide_expect,
          "%lu wide launches (N*C*S = %lld)", wide_count() - w0, (long long)NCS);
    w0 = wide_count();
    nslice = 0;
    for (int64_t c0 = 0; c0 < C; c0 += WIDE_SLICE, nslice++) {
        const int64_t cn = C - c0 < WIDE_SLICE ? C - c0 : WIDE_SLICE;
        int64_t ss[4] = {N, cn, H, W};
        double dmax = 0, dmin = 0;
        vx = wnarrow(gx, 1, c0, cn); vy = wnarrow(gy, 1, c0, cn);
        vw = wnarrow(gw, 0, c0, cn); vb = wnarrow(gb, 0, c0, cn);
        vrm = wnarrow(rrm, 0, c0, cn); vrv = wnarrow(rrv, 0, c0, cn);
        vsm = wnarrow(rsm, 0, c0, cn); vsi = wnarrow(rsi, 0, c0, cn);
        sx = wclone(vx); sy = dpoison(dt, 4, ss);
        if (!vx || !vy || !vw || !vb || !vrm || !vrv || !vsm || !vsi || !sx || !sy) {
            wide_setup_fail(NAME("%s: forward slice %lld setup", pre, (long long)c0));
            goto done;
        }
        RUN(NAME("%s: forward slice %lld", pre, (long long)c0),
            wide_fwd(silu, sx, sy, vw, vb, vrm, vrv, NULL, vsm, vsi));
        /* sx (no longer needed): the difference */
        RUN(NAME("%s: forward slice %lld difference", pre, (long long)c0),
            wide_diff(vy, sy, sx, &dmax, &dmin));
        if (!(dmax == 0.0 && dmin == 0.0) && bad0 < 0) {
            bad0 = c0;
            bmax = dmax;
            bmin = dmin;
        }
        wide_cmp_ranges(pre, "y", gy, sy, c0, cn, r0, rn);
        rel(vx); rel(vy); rel(vw); rel(vb); rel(vrm); rel(vrv); rel(vsm); rel(vsi);
        rel(sx); rel(sy);
        vx = vy = vw = vb = vrm = vrv = vsm = vsi = sx = sy = NULL;
    }
    CHECK(NAME("%s: y = 32-bit route on %d channel slices (every element)", pre, nslice),
          bad0 < 0, "slice from channel %lld: y - y_slice in [%g, %g]", (long long)bad0, bmin,
          bmax);
    CHECK(NAME("%s: the slice calls take the 32-bit route", pre), wide_count() == w0,
          "%lu wide launches", wide_count() - w0);
    {
        const lucid_tensor *g[4] = {gsm, gsi, grm, grv}, *rr[4] = {rsm, rsi, rrm, rrv};
        const char *what[4] = {"save_mean", "save_invstd", "running_mean", "running_var"};
        for (int i = 0; i < 4; i++) {
            lucid_tensor *h = host(rr[i]);
            if (h) cmp_bits(NAME("%s: %s = 32-bit route (bitwise)", pre, what[i]), g[i], h);
            else TEST_FAIL(NAME("%s: %s copy", pre, what[i]), "%s", lucid_ctx_error(ctx));
            rel(h);
        }
        lucid_tensor *h = host(gnb);
        if (h)
            CHECK(NAME("%s: num_batches_tracked == 1", pre), test_hget(h, 0) == 1.0,
                  "num_batches_tracked %g", test_hget(h, 0));
        else
            TEST_FAIL(NAME("%s: num_batches_tracked copy", pre), "%s", lucid_ctx_error(ctx));
        rel(h);
    }
    /* the CPU on the ranges (its running stats: the slices of hrm, hrv) */
    for (int r = 0; r < WIDE_NR; r++) {
        int64_t rs[4] = {N, rn[r], H, W}, rc[1] = {rn[r]};
        char rg[48];
        snprintf(rg, sizeof rg, "channels %lld..%lld", (long long)r0[r],
                 (long long)(r0[r] + rn[r] - 1));
        lucid_tensor *hw_ = wnarrow(hw, 0, r0[r], rn[r]), *hb_ = wnarrow(hb, 0, r0[r], rn[r]);
        lucid_tensor *hrm_ = wnarrow(hrm, 0, r0[r], rn[r]);
        lucid_tensor *hrv_ = wnarrow(hrv, 0, r0[r], rn[r]);
        hyr[r] = hpoison(dt, 4, rs);
        hsmr[r] = hpoison(F, 1, rc);
        hsir[r] = hpoison(F, 1, rc);
        s = hw_ && hb_ && hrm_ && hrv_ && hyr[r] && hsmr[r] && hsir[r]
                ? wide_fwd(silu, hxr[r], hyr[r], hw_, hb_, hrm_, hrv_, NULL, hsmr[r], hsir[r])
                : LUCID_ERR_OOM;
        if (s == LUCID_OK) {
            const lucid_tensor *gg[5] = {gy, gsm, gsi, grm, grv};
            const lucid_tensor *cc[5] = {hyr[r], hsmr[r], hsir[r], hrm_, hrv_};
            const char *what[5] = {"y", "save_mean", "save_invstd", "running_mean",
                                   "running_var"};
            wide_cmp_cpu(pre, rg, 5, gg, cc, what, r0[r], rn[r]);
        } else {
            TEST_FAIL(NAME("%s: %s cpu forward", pre, rg), "%s", lucid_ctx_error(ctx));
        }
        rel(hw_); rel(hb_); rel(hrm_); rel(hrv_);
    }

    /* ---- backward: dy drawn into y's storage; the slices use the big call's
     * saved statistics, so this half does not depend on the forward's */
    RUN(NAME("%s: draw dy", pre), lucid_rand_uniform(ctx, gy, g_seed, g_off, -1.0, 1.0));
    g_off += (uint64_t)NCS;
    if (!wide_host_ranges(pre, "dy", gy, r0, rn, hdyr)) goto done;
    w0 = wide_count();
    RUN(NAME("%s: train backward", pre),
        wide_bwd(silu, gx, gy, gdx, gw, gb, gsm, gsi, gdw, gdb));
    CHECK(NAME("%s: train backward takes the %s route", pre, wide_route_name()),
          wide_count() - w0 == (unsigned long)g_wide_expect,
          "%lu wide launches (N*C*S = %lld)", wide_count() - w0, (long long)NCS);
    w0 = wide_count();
    nslice = 0;
    bad0 = -1;
    for (int64_t c0 = 0; c0 < C; c0 += WIDE_SLICE, nslice++) {
        const int64_t cn = C - c0 < WIDE_SLICE ? C - c0 : WIDE_SLICE;
        int64_t ss[4] = {N, cn, H, W};
        double dmax = 0, dmin = 0;
        vx = wnarrow(gx, 1, c0, cn); vy = wnarrow(gy, 1, c0, cn);
        vw = wnarrow(gw, 0, c0, cn); vb = wnarrow(gb, 0, c0, cn);
        vsm = wnarrow(gsm, 0, c0, cn); vsi = wnarrow(gsi, 0, c0, cn);
        vdw = wnarrow(rdw, 0, c0, cn); vdb = wnarrow(rdb, 0, c0, cn);
        sx = wclone(vx); sdy = wclone(vy); sy = dpoison(dt, 4, ss);
        if (!vx || !vy || !vw || !vb || !vsm || !vsi || !vdw || !vdb || !sx || !sdy || !sy) {
            wide_setup_fail(NAME("%s: backward slice %lld setup", pre, (long long)c0));
            goto done;
        }
        /* sy: the slice's dx */
        RUN(NAME("%s: backward slice %lld", pre, (long long)c0),
            wide_bwd(silu, sx, sdy, sy, vw, vb, vsm, vsi, vdw, vdb));
        rel(vy); vy = wnarrow(gdx, 1, c0, cn);
        if (!vy) {
            TEST_FAIL(NAME("%s: dx view", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        /* sx (no longer needed): the difference */
        RUN(NAME("%s: backward slice %lld difference", pre, (long long)c0),
            wide_diff(vy, sy, sx, &dmax, &dmin));
        if (!(dmax == 0.0 && dmin == 0.0) && bad0 < 0) {
            bad0 = c0;
            bmax = dmax;
            bmin = dmin;
        }
        wide_cmp_ranges(pre, "dx", gdx, sy, c0, cn, r0, rn);
        rel(vx); rel(vy); rel(vw); rel(vb); rel(vsm); rel(vsi); rel(vdw); rel(vdb);
        rel(sx); rel(sdy); rel(sy);
        vx = vy = vw = vb = vsm = vsi = vdw = vdb = sx = sdy = sy = NULL;
    }
    CHECK(NAME("%s: dx = 32-bit route on %d channel slices (every element)", pre, nslice),
          bad0 < 0, "slice from channel %lld: dx - dx_slice in [%g, %g]", (long long)bad0, bmin,
          bmax);
    CHECK(NAME("%s: the slice calls take the 32-bit route (backward)", pre), wide_count() == w0,
          "%lu wide launches", wide_count() - w0);
    {
        const lucid_tensor *g[2] = {gdw, gdb}, *rr[2] = {rdw, rdb};
        const char *what[2] = {"dweight", "dbias"};
        for (int i = 0; i < 2; i++) {
            lucid_tensor *h = host(rr[i]);
            if (h) cmp_bits(NAME("%s: %s = 32-bit route (bitwise)", pre, what[i]), g[i], h);
            else TEST_FAIL(NAME("%s: %s copy", pre, what[i]), "%s", lucid_ctx_error(ctx));
            rel(h);
        }
    }
    /* the CPU on the ranges, with its own saved statistics */
    for (int r = 0; r < WIDE_NR; r++) {
        int64_t rs[4] = {N, rn[r], H, W}, rc[1] = {rn[r]};
        char rg[48];
        snprintf(rg, sizeof rg, "channels %lld..%lld", (long long)r0[r],
                 (long long)(r0[r] + rn[r] - 1));
        lucid_tensor *hw_ = wnarrow(hw, 0, r0[r], rn[r]), *hb_ = wnarrow(hb, 0, r0[r], rn[r]);
        hdxr[r] = hpoison(dt, 4, rs);
        hdwr[r] = hpoison(F, 1, rc);
        hdbr[r] = hpoison(F, 1, rc);
        s = hw_ && hb_ && hdxr[r] && hdwr[r] && hdbr[r]
                ? wide_bwd(silu, hxr[r], hdyr[r], hdxr[r], hw_, hb_, hsmr[r], hsir[r], hdwr[r],
                           hdbr[r])
                : LUCID_ERR_OOM;
        if (s == LUCID_OK) {
            const lucid_tensor *gg[3] = {gdx, gdw, gdb}, *cc[3] = {hdxr[r], hdwr[r], hdbr[r]};
            const char *what[3] = {"dx", "dweight", "dbias"};
            wide_cmp_cpu(pre, rg, 3, gg, cc, what, r0[r], rn[r]);
        } else {
            TEST_FAIL(NAME("%s: %s cpu backward", pre, rg), "%s", lucid_ctx_error(ctx));
        }
        rel(hw_); rel(hb_);
    }
done:
    rel(gx); rel(gy); rel(gdx);
    rel(hw); rel(hb); rel(hrm); rel(hrv); rel(hnb);
    rel(gw); rel(gb); rel(grm); rel(grv); rel(gnb);
    rel(gsm); rel(gsi); rel(gdw); rel(gdb);
    rel(rrm); rel(rrv); rel(rsm); rel(rsi); rel(rdw); rel(rdb);
    rel(vx); rel(vy); rel(vw); rel(vb); rel(vrm); rel(vrv); rel(vsm); rel(vsi); rel(vdw);
    rel(vdb); rel(sx); rel(sy); rel(sdy); rel(t1); rel(t2);
    for (int r = 0; r < WIDE_NR; r++) {
        rel(hxr[r]); rel(hyr[r]); rel(hsmr[r]); rel(hsir[r]); rel(hdyr[r]); rel(hdxr[r]);
        rel(hdwr[r]); rel(hdbr[r]);
    }
    /* give the 12+ GiB back to the driver (other tests share the device) */
    lucid_ctx_synchronize(ctx);
    lucid_memory_empty_cache(ctx);
}

/* ============================================================ pointwise */

/* A unary-shaped op pair: forward y = f(x), backward dx = beta*dx + g(x, dy).
 * kind: 0 silu, 1 softmax (backward takes y), 2 dfl (y has 4 channels),
 * 3 upsample (scale arg), 4 maxpool (pool params) */
typedef struct pw_op {
    int kind;
    int arg;                 /* dfl reg_max, upsample scale */
    lucid_pool2d_params pool;
    int use_indices;
} pw_op;

static lucid_status pw_fwd(const pw_op *o, const lucid_tensor *x, lucid_tensor *y,
                           lucid_tensor *idx) {
    switch (o->kind) {
    case 0: return lucid_nn_silu_forward(ctx, x, y);
    case 1: return lucid_nn_softmax_forward(ctx, x, y);
    case 2: return lucid_nn_dfl_forward(ctx, x, y, o->arg);
    case 3: return lucid_nn_upsample_nearest2d_forward(ctx, x, y, o->arg);
    default: return lucid_nn_maxpool2d_forward(ctx, x, y, idx, &o->pool);
    }
}

static lucid_status pw_bwd(const pw_op *o, const lucid_tensor *x, const lucid_tensor *y,
                           const lucid_tensor *dy, lucid_tensor *dx,
                           const lucid_tensor *idx, double beta) {
    switch (o->kind) {
    case 0: return lucid_nn_silu_backward(ctx, x, dy, dx, beta);
    case 1: return lucid_nn_softmax_backward(ctx, y, dy, dx, beta);
    case 2: return lucid_nn_dfl_backward(ctx, x, dy, dx, o->arg, beta);
    case 3: return lucid_nn_upsample_nearest2d_backward(ctx, x, dy, dx, o->arg, beta);
    default: return lucid_nn_maxpool2d_backward(ctx, x, dy, dx, o->use_indices ? idx : NULL,
                                                &o->pool, beta);
    }
}

static void test_pw(const char *tag, const pw_op *o, int ndim, const int64_t *xs,
                    lucid_dtype dt, double lo, double hi) {
    char pre[160];
    snprintf(pre, sizeof pre, "%s %s", tag, dname(dt));
    int64_t ys[LUCID_MAX_DIMS];
    memcpy(ys, xs, sizeof(int64_t) * (size_t)ndim);
    if (o->kind == 2) ys[1] = 4;
    if (o->kind == 3) { ys[2] *= o->arg; ys[3] *= o->arg; }
    if (o->kind == 4) {
        ys[2] = lucid_nn_conv_out_size(xs[2], o->pool.kernel_h, o->pool.stride_h, o->pool.pad_h, 1);
        ys[3] = lucid_nn_conv_out_size(xs[3], o->pool.kernel_w, o->pool.stride_w, o->pool.pad_w, 1);
    }
    /* reductions inside the backward: softmax, dfl */
    double absf = (o->kind == 1 || o->kind == 2) ? 1e-5 : 0.0;
    lucid_tensor *hx = hrand(dt, ndim, xs, lo, hi), *gx = dev(hx);
    lucid_tensor *hy = hpoison(dt, ndim, ys), *gy = dpoison(dt, ndim, ys);
    lucid_tensor *hi_ = NULL, *gi = NULL;
    lucid_tensor *hdy = hrand(dt, ndim, ys, -1, 1), *gdy = dev(hdy);
    lucid_tensor *hdx = hpoison(dt, ndim, xs), *gdx = dpoison(dt, ndim, xs);
    lucid_tensor *hdx1 = hrand(dt, ndim, xs, -1, 1), *gdx1 = dev(hdx1), *s1 = NULL;
    if (o->kind == 4) {
        hi_ = hzeros(LUCID_I32, ndim, ys);
        lucid_tensor_empty(ctx, GPU, LUCID_I32, ndim, ys, &gi);
        if (gi) lucid_fill(ctx, gi, -7);
    }
    if (!hx || !gx || !hy || !gy || !hdy || !gdy || !hdx || !gdx || !hdx1 || !gdx1 ||
        (o->kind == 4 && (!hi_ || !gi))) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: forward cpu", pre), pw_fwd(o, hx, hy, hi_));
    RUN(NAME("%s: forward", pre), pw_fwd(o, gx, gy, gi));
    cmp_pw(NAME("%s: forward", pre), gy, hy, o->kind == 1 || o->kind == 2 ? 1e-6 : 0.0);
    if (o->kind == 4) cmp_bits(NAME("%s: forward indices", pre), gi, hi_);
    /* the backward of softmax takes y: give both sides the CPU's y */
    if (o->kind == 1) {
        rel(gy);
        gy = dev(hy);
    }
    RUN(NAME("%s: backward cpu", pre), pw_bwd(o, hx, hy, hdy, hdx, hi_, 0.0));
    RUN(NAME("%s: backward", pre), pw_bwd(o, gx, gy, gdy, gdx, gi, 0.0));
    cmp_pw(NAME("%s: backward beta 0", pre), gdx, hdx, absf);
    s1 = snap(gdx);
    RUN(NAME("%s: backward again", pre), pw_bwd(o, gx, gy, gdy, gdx, gi, 0.0));
    cmp_bits(NAME("%s: backward deterministic", pre), gdx, s1);
    RUN(NAME("%s: backward cpu beta 1", pre), pw_bwd(o, hx, hy, hdy, hdx1, hi_, 1.0));
    RUN(NAME("%s: backward beta 1", pre), pw_bwd(o, gx, gy, gdy, gdx1, gi, 1.0));
    cmp_pw(NAME("%s: backward beta 1", pre), gdx1, hdx1, absf);
done:
    rel(hx); rel(gx); rel(hy); rel(gy); rel(hi_); rel(gi); rel(hdy); rel(gdy);
    rel(hdx); rel(gdx); rel(hdx1); rel(gdx1); rel(s1);
}

static void test_add(lucid_dtype dt) {
    char pre[64];
    snprintf(pre, sizeof pre, "add %s", dname(dt));
    int64_t s[4] = {3, 5, 17, 19};
    lucid_tensor *ha = hrand(dt, 4, s, -2, 2), *hb = hrand(dt, 4, s, -2, 2);
    lucid_tensor *ga = dev(ha), *gb = dev(hb), *hy = hpoison(dt, 4, s), *gy = dpoison(dt, 4, s);
    if (!ha || !hb || !ga || !gb || !hy || !gy) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: cpu", pre), lucid_nn_add_forward(ctx, ha, hb, hy));
    RUN(NAME("%s", pre), lucid_nn_add_forward(ctx, ga, gb, gy));
    cmp_pw(NAME("%s: forward", pre), gy, hy, 0.0);
    /* aliased output: a = a + b */
    RUN(NAME("%s: aliased cpu", pre), lucid_nn_add_forward(ctx, ha, hb, ha));
    RUN(NAME("%s: aliased", pre), lucid_nn_add_forward(ctx, ga, gb, ga));
    cmp_pw(NAME("%s: forward aliased (y = a)", pre), ga, ha, 0.0);
done:
    rel(ha); rel(hb); rel(ga); rel(gb); rel(hy); rel(gy);
}

static void test_channel_copy(lucid_dtype ddt, lucid_dtype sdt, double beta) {
    char pre[96];
    snprintf(pre, sizeof pre, "channel_copy %s <- %s beta %g", dname(ddt), dname(sdt), beta);
    int64_t ds[4] = {2, 10, 7, 9}, ss[4] = {2, 6, 7, 9};
    lucid_tensor *hd = hrand(ddt, 4, ds, -1, 1), *hs = hrand(sdt, 4, ss, -1, 1);
    lucid_tensor *gd = dev(hd), *gs = dev(hs);
    if (!hd || !hs || !gd || !gs) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: cpu", pre), lucid_nn_channel_copy(ctx, hd, 3, hs, 1, 4, beta));
    RUN(NAME("%s", pre), lucid_nn_channel_copy(ctx, gd, 3, gs, 1, 4, beta));
    /* untouched channels must stay bitwise as they were */
    if (ddt == LUCID_F32) cmp_rel(NAME("%s", pre), gd, hd, 1e-6);
    else cmp_ulp(NAME("%s", pre), gd, hd, 1, 0.0);
    /* bitwise: same dtype copies move bits */
    if (ddt == sdt && beta == 0.0) cmp_bits(NAME("%s: bitwise", pre), gd, hd);
done:
    rel(hd); rel(hs); rel(gd); rel(gs);
}

/* ============================================================ main */

static const char *GROUPS[] = {"cuda nn conv2d", "cuda nn batchnorm2d", "cuda nn silu",
                               "cuda nn add", "cuda nn channel_copy", "cuda nn upsample",
                               "cuda nn maxpool2d", "cuda nn softmax", "cuda nn dfl"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!lucid_nn_cuda_kernels()) {
        TEST_FAIL("cuda nn table linked",
                  "lucid_nn_cuda_kernels() is NULL in a build with a CUDA "
                  "device (cuda/nn_table.cu not linked?)");
        return test_exit();
    }
    TEST_OK("cuda nn table linked");
    /* the cooperative BatchNorm kernels are opt-in (LUCID_BN_COOP=1,
     * nn_norm.cuh); the wide case's arms were written with them on */
    setenv("LUCID_BN_COOP", "1", 0);
    if (!cuda_test_ctx_create("test_nn_cuda")) return test_exit();

    static const lucid_dtype DTS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 3; d++) {
        lucid_dtype dt = DTS[d];
        /* ---- conv */
        for (size_t c = 0; c < sizeof CONV_CASES / sizeof CONV_CASES[0]; c++) {
            const conv_case *cc = &CONV_CASES[c];
            if (is_1x1(cc, dt) && lucid_cuda_nn_set_conv1x1) {
                test_conv(cc, dt, 0, 1); /* implicit GEMM */
                test_conv(cc, dt, 0, 2); /* cuBLAS where eligible */
            } else {
                test_conv(cc, dt, 0, 0);
            }
            if (lucid_cuda_nn_set_conv_mode) {
                test_conv(cc, dt, 1, 0);
                /* cuDNN: depthwise (auto takes the direct kernels) and bf16/f16
                 * groups 1 (auto takes the implicit GEMM) */
                if ((cc->g == cc->Cin && cc->g == cc->Cout) || (dt != LUCID_F32 && cc->g == 1))
                    test_conv(cc, dt, 2, 0);
            }
        }
        if (dt != LUCID_F32 && lucid_cuda_nn_set_conv_mode && lucid_cuda_nn_set_conv1x1)
            for (size_t c = 0; c < sizeof CAPTURE_CASES / sizeof CAPTURE_CASES[0]; c++) {
                test_conv_capture(&CAPTURE_CASES[c], dt, 1);
                test_conv_capture(&CAPTURE_CASES[c], dt, 2);
            }
        if (dt != LUCID_F32 && lucid_conv_igemm_set_dgrad_phase && lucid_conv_igemm_wt_cast_count)
            for (size_t c = 0; c < sizeof PHASE_CASES / sizeof PHASE_CASES[0]; c++) {
                test_dgrad_phase(&PHASE_CASES[c], dt, 1);
                test_dgrad_phase(&PHASE_CASES[c], dt, 0);
            }
        /* ---- batchnorm: single part, multi-part planes, tiny, odd */
        test_bn(4, 16, 32, 32, 1, dt);
        test_bn(2, 8, 100, 90, 1, dt);
        test_bn(8, 5, 1, 1, 1, dt);
        test_bn(3, 7, 5, 3, 0, dt);
        /* ---- batchnorm: many parts per channel, short last parts, the
         * first layer; C past grid.y (counters) and past the counters */
        test_bn(300, 3, 8, 8, 1, dt);
        test_bn(130, 2, 65, 65, 1, dt);
        test_bn(4, 16, 320, 320, 1, dt);
        test_bn(300, 2, 64, 72, 1, dt);
        /* ---- vector path (S % 8; f32: S % 4) with odd N, and f32 only */
        test_bn(5, 3, 96, 96, 1, dt);
        test_bn(3, 5, 6, 10, 1, dt);
        test_bn(2, 70001, 1, 2, 1, dt);
        test_bn(2, 131100, 1, 2, 0, dt);
        test_bn_routes(dt);
        test_bn_routes_capture(dt, 5, 3, 96, 96);
        test_bn_routes_capture(dt, 4, 3, 320, 320);
        test_bn_routes_capture(dt, 130, 2, 65, 65);
        /* ---- silu */
        pw_op silu = {0, 0, {0, 0, 0, 0, 0, 0}, 0};
        int64_t s4[4] = {3, 5, 17, 19};
        test_pw("silu", &silu, 4, s4, dt, -6, 6);
        /* ---- add, channel_copy */
        test_add(dt);
        test_channel_copy(dt, dt, 0.0);
        test_channel_copy(dt, dt, 1.0);
        test_channel_copy(dt, LUCID_F32, 0.0);
        test_channel_copy(LUCID_F32, dt, 0.5);
        /* ---- upsample */
        pw_op up2 = {3, 2, {0, 0, 0, 0, 0, 0}, 0}, up3 = {3, 3, {0, 0, 0, 0, 0, 0}, 0};
        int64_t su[4] = {2, 3, 7, 5};
        test_pw("upsample x2", &up2, 4, su, dt, -1, 1);
        test_pw("upsample x3", &up3, 4, su, dt, -1, 1);
        /* ---- maxpool: SPPF 5/1/2, 3/2/1, 2/2/0; with and without indices */
        pw_op mp[3] = {{4, 0, {5, 5, 1, 1, 2, 2}, 1},
                       {4, 0, {3, 3, 2, 2, 1, 1}, 1},
                       {4, 0, {2, 2, 2, 2, 0, 0}, 1}};
        const char *mpn[3] = {"maxpool2d k5 s1 p2", "maxpool2d k3 s2 p1", "maxpool2d k2 s2"};
        /* planes of 13x11 take the shared-memory plane route of
         * nn_pointwise.cu, 80x70 (over POOL_PLANE_MAX elements) the generic
         * kernels; both must equal the CPU exactly */
        int64_t sm[4] = {2, 3, 13, 11}, sbig[4] = {2, 3, 80, 70};
        for (int k = 0; k < 3; k++) {
            test_pw(NAME("%s indices", mpn[k]), &mp[k], 4, sm, dt, -3, 3);
            test_pw(NAME("%s 80x70 indices", mpn[k]), &mp[k], 4, sbig, dt, -3, 3);
            mp[k].use_indices = 0;
            test_pw(NAME("%s no-indices", mpn[k]), &mp[k], 4, sm, dt, -3, 3);
            test_pw(NAME("%s 80x70 no-indices", mpn[k]), &mp[k], 4, sbig, dt, -3, 3);
        }
        /* ---- softmax */
        pw_op smx = {1, 0, {0, 0, 0, 0, 0, 0}, 0};
        int64_t sa[3] = {3, 4, 37}, sb[2] = {2, 400}, sc[2] = {3, 1030}, sd[2] = {5, 1};
        test_pw("softmax [3,4,37]", &smx, 3, sa, dt, -4, 4);
        test_pw("softmax [2,400]", &smx, 2, sb, dt, -4, 4);
        test_pw("softmax [3,1030]", &smx, 2, sc, dt, -4, 4);
        test_pw("softmax [5,1]", &smx, 2, sd, dt, -4, 4);
        /* ---- dfl */
        pw_op dfl = {2, 16, {0, 0, 0, 0, 0, 0}, 0}, dfl7 = {2, 7, {0, 0, 0, 0, 0, 0}, 0};
        int64_t da[3] = {2, 64, 50}, db[4] = {2, 64, 3, 7}, dc[3] = {3, 28, 11};
        test_pw("dfl R16 [2,64,50]", &dfl, 3, da, dt, -3, 3);
        test_pw("dfl R16 [2,64,3,7]", &dfl, 4, db, dt, -3, 3);
        test_pw("dfl R7 [3,28,11]", &dfl7, 3, dc, dt, -3, 3);
    }
    /* ---- batchnorm on more than INT32_MAX elements: the cluster kernels
     * (the default where the device takes cluster launches), the
     * cooperative kernels in rounds, then the 64-bit two-launch route */
    if (lucid_cuda_bn_cluster_sm_count && lucid_cuda_bn_cluster_sm_count() > 0) {
        wide_cluster(2);
        g_wide_expect = 0;
        g_wide_route = "cluster";
        test_bn_wide(0);
        test_bn_wide(1);
    } else {
        TEST_SKIP("batchnorm2d over 2^31 elements, cluster route", "%s",
                  "the device takes no cluster launches (or the hook is missing)");
    }
    wide_cluster(1); /* the arms below: today's routes */
    setenv("LUCID_BN_COOP_LOOP", "1", 1); /* read on each call (nn_norm.cuh) */
    g_wide_expect = 0;
    g_wide_route = "cooperative (rounds)";
    test_bn_wide(0);
    test_bn_wide(1);
    setenv("LUCID_BN_COOP_LOOP", "0", 1);
    g_wide_expect = 1;
    g_wide_route = "64-bit two-launch";
    test_bn_wide(0);
    test_bn_wide(1);
    unsetenv("LUCID_BN_COOP_LOOP");
    wide_cluster(0);

    return cuda_test_finish();
}
