/*
 * test_conv_wcast_cuda.c — the Conv2d weight shadows of the cuBLAS 1x1 route
 * (engine/nn/nn.h lucid_conv_wshadow; cuda/nn_conv.cu, cuda/nn_conv_gemm.cu)
 * on the GPU, against the per-call casts (lucid_cuda_nn_set_wcast(ctx, 1),
 * what LUCID_WCAST_ONCE=0 selects) and the CPU reference.
 *
 * Every comparison with the per-call route is BITWISE (y, dx, dw); the CPU
 * reference is the bf16/f16 conv tolerance of test_nn_cuda.c (relative
 * Frobenius <= 1e-2).  Weight-cast launches are counted with
 * lucid_cuda_wcast_launch_count (cuda/nn_conv_gemm.cuh):
 *   - module: a 1x1 Conv2d (bias or not, N 1..3, odd channel counts and
 *     planes, a 256x128 weight of 32 group-kernel blocks): per-call route 1
 *     cast in the forward and 1 in the backward-data; shadows: 1 in the
 *     first forward, 0 in its backward-data, 0 in a second forward and
 *     backward with unchanged weights, 0 in a group cast of a fresh shadow;
 *     after an in-place weight write (an op: the storage version moves) the
 *     group cast launches 1 and the forward and backward-data 0, bitwise the
 *     per-call route on the new weights;
 *   - replaced parameter (nn level, one shadow, weights w1 / w2 / w1): each
 *     switch re-casts (1 launch), bitwise the per-call route; a larger
 *     weight than the shadow's buffer casts per call and leaves the shadow
 *     (still fresh for w1 afterwards: 0 launches);
 *   - the im2col route's flipped weight (group cast of a [32,16,3,3]
 *     weight) used through same-numel views of another shape ([16,32,3,3],
 *     [2,256,3,3]): dx bitwise the per-call route (the flip's shape is
 *     checked, not just the shadow's freshness);
 *   - group cast of 130 1x1 modules (and 3x3 / strided ones): 3
 *     launches (131 plain casts at 128 items a launch, then the 3x3's
 *     flipped weight on the cast lane: lucid_cuda_nn_set_wcast_side 2; the
 *     default env), then every forward and backward-data
 *     casts nothing and equals the per-call route bitwise; 0 launches when
 *     the 1x1 switch says implicit GEMM (lucid_cuda_nn_set_conv1x1 1);
 *   - capture: a shadow cast eagerly before a capture is re-cast inside it
 *     (1 launch recorded by the group cast; the forward and backward-data
 *     record none), the replay equals the eager per-call route; a graph that
 *     also updates the weight (axpy) replayed twice: each replay's y equals
 *     the per-call route on the updated weight, and the eager forward after
 *     each replay re-casts (1 launch: a launch moves the epoch) and equals it;
 *   - a capture that keeps the shadows (LUCID_CAPTURE_KEEP_SHADOWS, after
 *     lucid_ctx_shadows_stale and an eager group cast): nothing cast inside,
 *     the graph keeps the shadows, a group cast after a replay queues 0, after
 *     an eager weight write 1, and the replay equals the per-call route on
 *     the new weight; begun with the shadow stale it casts inside (1), the
 *     graph does not keep, and its launch makes the shadow stale; an unknown
 *     flag is ERR_ARG; a keeping graph of a 3x3 im2col conv after a weight
 *     write and an eager forward alone (the flipped copy stale): the group
 *     cast writes the flipped copy and the replay's dx equals the per-call
 *     route's;
 *   - first use inside a capture (no shadow buffer yet, the allocation is
 *     refused): the capture succeeds, the convs cast per call (2 launches),
 *     the group cast skips the shadow, the shadow stays empty, the replay
 *     equals the eager route;
 *   - the stride-phase backward-data's transposed weight (a stride-2 3x3
 *     module, 64>48 and 16>32; nn_conv_igemm.cuh): its first backward-data
 *     through the shadow transposes per call (1 launch counted by
 *     lucid_conv_igemm_wt_cast_count) and asks for the copy; the group cast
 *     then re-casts the fresh shadow once (2 launches: the weight on the
 *     compute stream, its flipped and transposed copies on the cast lane)
 *     and once after each weight write, and the backward-data transposes
 *     nothing (it waits for the cast lane instead); a group cast
 *     of a shadow that holds the copy queues nothing; y, dx, dw bitwise the
 *     per-call route each time; with the kernel's switch off the shadow's
 *     copy is neither written nor read and dx is bitwise the per-call
 *     switch-off route; captured (group cast, forward, backward) after the
 *     eager passes: the backward-data transposes nothing inside the capture
 *     (the cast lane's launch and the backward-data's wait for it are
 *     recorded as graph edges) and the replay equals the per-call route;
 *   - the copies themselves, read back from the shadow buffers (3x3
 *     [32,16] and [48,64], 5x5 [24,8]: the shared-memory tiled transpose
 *     with a partial last tile; 33x33 [2,8], 1089 taps: the element-wise
 *     transpose; a 1x1 [16,24]: plain only), for the single launch
 *     (lucid_cuda_nn_set_wcast_side 1: 1 launch) and the cast lane (2: 2
 *     launches), each after a weight version bump and with the three
 *     regions poisoned (NaN) first: no element left unwritten, every
 *     flipped / transposed element bitwise the plain cast of the weight
 *     element the per-call map names (nn_conv_col.cuh
 *     lucid_conv_col_wflip_src: [Cin][Kr], ci*Kr + co*KK + r*kw + q <-
 *     w[co][ci][kh-1-r][kw-1-q], 0 beyond Cout*KK; nn_conv_igemm.cuh
 *     lucid_conv_igemm_wt_src: [KK][Cout][Cin] <- w[co][ci][tap], written
 *     out here independently): the same single rounding of the same value,
 *     i.e. the per-call casts' bits; and the lane route's bytes of all three
 *     regions equal the single launch's.
 * Without a CUDA device every group prints a skip line and the program exits
 * 0.
 */
#include "test_cuda_util.h"

#include "internal.h"
#include "nn/nn.h"
#include "train/graph.h"

/* cuda/ test hooks; absent (NULL) in a CPU-only build */
#if defined(__GNUC__)
#define WEAK __attribute__((weak))
#else
#define WEAK
#endif
WEAK int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route);
WEAK int lucid_cuda_nn_set_wcast(lucid_ctx *ctx, int mode);
WEAK int lucid_cuda_nn_set_wcast_side(lucid_ctx *ctx, int mode);
WEAK int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route);
WEAK int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route);
WEAK unsigned long lucid_cuda_wcast_launch_count(void);
WEAK void lucid_conv_igemm_set_dgrad_phase(int v);
WEAK unsigned long lucid_conv_igemm_wt_cast_count(void);

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

static unsigned long casts(void) { return lucid_cuda_wcast_launch_count(); }

static void check_casts(const char *name, unsigned long got, unsigned long want) {
    CHECK(name, got == want, "%lu weight-cast launches, expected %lu", got, want);
}

typedef struct wc_case {
    const char *tag;
    int64_t N, Cin, Cout, H, W;
    int bias;
} wc_case;

static const wc_case CASES[] = {
    {"N2 32>24 12x10 bias", 2, 32, 24, 12, 10, 1},
    {"N1 24>40 16x16", 1, 24, 40, 16, 16, 0},
    {"N3 8>8 7x5 bias", 3, 8, 8, 7, 5, 1},
    {"N2 256>128 1x1", 2, 256, 128, 1, 1, 0},
    {"N2 13>21 9x7 bias", 2, 13, 21, 9, 7, 1},
};

/* A materialized 1x1 (or k x k, stride s) Conv2d on the GPU. */
static lucid_status make_conv(lucid_param_set **set, lucid_module **m, const char *name,
                              int64_t Cin, int64_t Cout, int k, int s, int bias) {
    LUCID_TRY(lucid_param_set_create(ctx, set));
    LUCID_TRY(lucid_module_conv2d_create(ctx, *set, name, (int)Cin, (int)Cout, k, s, -1, 1, 1,
                                         bias, m));
    return lucid_param_set_materialize(ctx, *set, GPU, LUCID_F32);
}

/* One forward + backward of m (grads zeroed first); host copies of y, dx,
 * dw into out[0..2] (caller releases); the cast launches of the forward and
 * of the backward into nc[0], nc[1]. */
static lucid_status fwd_bwd(lucid_module *m, const lucid_tensor *x, const lucid_tensor *dy,
                            lucid_tensor *out[3], unsigned long nc[2]) {
    lucid_tensor *y = NULL, *dx = NULL;
    LUCID_TRY(lucid_param_set_zero_grad(ctx, m->set));
    unsigned long c0 = casts();
    LUCID_TRY(lucid_module_forward1(ctx, m, x, &y));
    unsigned long c1 = casts();
    LUCID_TRY(lucid_module_backward1(ctx, m, x, dy, &dx));
    unsigned long c2 = casts();
    nc[0] = c1 - c0;
    nc[1] = c2 - c1;
    out[0] = host(y);
    out[1] = host(dx);
    out[2] = host(m->params[0]->grad);
    if (!out[0] || !out[1] || !out[2]) return lucid_ctx_last_status(ctx);
    return LUCID_OK;
}

static void rel3(lucid_tensor *t[3]) {
    for (int i = 0; i < 3; i++) {
        rel(t[i]);
        t[i] = NULL;
    }
}

/* The module's outputs now (device) against host copies, bitwise. */
static void cmp3(const char *pre, const char *what, lucid_module *m, lucid_tensor *ref[3]) {
    cmp_bits(NAME("%s: %s y", pre, what), m->outputs[0], ref[0]);
    cmp_bits(NAME("%s: %s dx", pre, what), m->grad_inputs[0], ref[1]);
    cmp_bits(NAME("%s: %s dw", pre, what), m->params[0]->grad, ref[2]);
}

static void test_module(const wc_case *cc, lucid_dtype dt) {
    char pre[160];
    snprintf(pre, sizeof pre, "wcast module %s %s", cc->tag, lucid_dtype_name(dt));
    lucid_param_set *set = NULL;
    lucid_module *m = NULL;
    int64_t xs[4] = {cc->N, cc->Cin, cc->H, cc->W}, ys[4] = {cc->N, cc->Cout, cc->H, cc->W};
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
    lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *off[3] = {0}, *on[3] = {0}, *hw = NULL,
                 *hb = NULL, *cy = NULL;
    unsigned long nc[2];
    if (!hx || !hdy || !gx || !gdy ||
        make_conv(&set, &m, "c", cc->Cin, cc->Cout, 1, 1, cc->bias) != LUCID_OK) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv1x1(ctx, 2);
    lucid_cuda_nn_set_wcast(ctx, 1);
    RUN(NAME("%s: per-call route", pre), fwd_bwd(m, gx, gdy, off, nc));
    check_casts(NAME("%s: per-call route casts in the forward", pre), nc[0], 1);
    check_casts(NAME("%s: per-call route casts in the backward-data", pre), nc[1], 1);
    lucid_cuda_nn_set_wcast(ctx, 2);
    RUN(NAME("%s: shadow route", pre), fwd_bwd(m, gx, gdy, on, nc));
    check_casts(NAME("%s: first forward casts into the shadow", pre), nc[0], 1);
    check_casts(NAME("%s: backward-data reuses the shadow", pre), nc[1], 0);
    cmp3(pre, "shadow = per-call", m, off);
    rel3(on);
    RUN(NAME("%s: shadow route again", pre), fwd_bwd(m, gx, gdy, on, nc));
    check_casts(NAME("%s: unchanged weight: forward and backward cast nothing", pre),
                nc[0] + nc[1], 0);
    cmp3(pre, "second shadow pass = per-call", m, off);
    rel3(on);
    {
        unsigned long c0 = casts();
        RUN(NAME("%s: group cast", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
        check_casts(NAME("%s: group cast of a fresh shadow queues nothing", pre), casts() - c0, 0);
        /* an in-place write of the weight (an op: bumps the storage version) */
        lucid_tensor *w = m->params[0]->data;
        RUN(NAME("%s: in-place weight write", pre),
            lucid_binary_scalar(ctx, LUCID_OP_MUL, w, w, -0.75, 0));
        c0 = casts();
        RUN(NAME("%s: group cast after the write", pre),
            lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
        check_casts(NAME("%s: group cast after the write launches once", pre), casts() - c0, 1);
    }
    RUN(NAME("%s: shadow route after the write", pre), fwd_bwd(m, gx, gdy, on, nc));
    check_casts(NAME("%s: after the group cast the convs cast nothing", pre), nc[0] + nc[1], 0);
    lucid_cuda_nn_set_wcast(ctx, 1);
    rel3(off);
    RUN(NAME("%s: per-call route after the write", pre), fwd_bwd(m, gx, gdy, off, nc));
    cmp3(pre, "new weight: per-call = shadow", m, on);
    /* CPU reference on the same rounded input and the current weight */
    {
        lucid_conv2d_params p = {1, 1, 0, 0, 1, 1, 1};
        hw = host(m->params[0]->data);
        hb = cc->bias ? host(m->params[1]->data) : NULL;
        cy = hpoison(dt, 4, ys);
        if (!hw || !cy || (cc->bias && !hb)) {
            TEST_FAIL(NAME("%s: cpu setup", pre), "%s", lucid_ctx_error(ctx));
            goto done;
        }
        RUN(NAME("%s: cpu forward", pre), lucid_nn_conv2d_forward(ctx, hx, cy, hw, hb, &p));
        cmp_rel(NAME("%s: y = cpu", pre), m->outputs[0], cy, 1e-2);
    }
done:
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_ctx_synchronize(ctx);
    rel3(off);
    rel3(on);
    rel(hx); rel(hdy); rel(gx); rel(gdy); rel(hw); rel(hb); rel(cy);
    lucid_module_release(m);
    lucid_param_set_release(set);
}

/* nn level: one shadow, the weight tensor replaced (w1 -> w2 -> w1), and a
 * weight larger than the shadow's buffer. */
static void test_replace(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast replaced weight %s", lucid_dtype_name(dt));
    const int64_t N = 2, Ci = 16, Co = 24, H = 6, W = 5, Co3 = 40;
    int64_t xs[4] = {N, Ci, H, W}, ys[4] = {N, Co, H, W}, y3s[4] = {N, Co3, H, W};
    int64_t ws[4] = {Co, Ci, 1, 1}, w3s[4] = {Co3, Ci, 1, 1};
    lucid_conv2d_params p = {1, 1, 0, 0, 1, 1, 1};
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
    lucid_tensor *hw1 = hrand(LUCID_F32, 4, ws, -0.5, 0.5), *hw2 = hrand(LUCID_F32, 4, ws, -0.5, 0.5);
    lucid_tensor *hw3 = hrand(LUCID_F32, 4, w3s, -0.5, 0.5);
    lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *w1 = dev(hw1), *w2 = dev(hw2), *w3 = dev(hw3);
    lucid_tensor *ya = dpoison(dt, 4, ys), *yb = dpoison(dt, 4, ys), *y3a = dpoison(dt, 4, y3s),
                 *y3b = dpoison(dt, 4, y3s), *dxa = dpoison(dt, 4, xs), *dxb = dpoison(dt, 4, xs);
    lucid_tensor *h = NULL;
    if (!hx || !hdy || !hw1 || !hw2 || !hw3 || !gx || !gdy || !w1 || !w2 || !w3 || !ya || !yb ||
        !y3a || !y3b || !dxa || !dxb) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv1x1(ctx, 2);
    lucid_cuda_nn_set_wcast(ctx, 2);
    const lucid_tensor *seq[3] = {w1, w2, w1};
    for (int i = 0; i < 3; i++) {
        unsigned long c0 = casts();
        RUN(NAME("%s: forward %d", pre, i), lucid_nn_conv2d_forward_shadow(ctx, gx, ya, seq[i], NULL, &p, &s));
        check_casts(NAME("%s: weight %s re-casts", pre, i == 1 ? "w2" : i ? "w1 again" : "w1"),
                    casts() - c0, 1);
        RUN(NAME("%s: reference forward %d", pre, i), lucid_nn_conv2d_forward(ctx, gx, yb, seq[i], NULL, &p));
        h = host(yb);
        cmp_bits(NAME("%s: y with weight %d = per-call", pre, i), ya, h);
        rel(h);
        h = NULL;
    }
    {
        unsigned long c0 = casts();
        RUN(NAME("%s: backward-data", pre),
            lucid_nn_conv2d_backward_input_shadow(ctx, gx, gdy, dxa, w1, &p, 0.0, &s));
        check_casts(NAME("%s: backward-data reuses the shadow", pre), casts() - c0, 0);
        RUN(NAME("%s: reference backward-data", pre),
            lucid_nn_conv2d_backward_input(ctx, gx, gdy, dxb, w1, &p, 0.0));
        h = host(dxb);
        cmp_bits(NAME("%s: dx = per-call", pre), dxa, h);
        rel(h);
        h = NULL;
        /* a larger weight than the buffer: cast per call, shadow untouched */
        c0 = casts();
        RUN(NAME("%s: forward larger weight", pre),
            lucid_nn_conv2d_forward_shadow(ctx, gx, y3a, w3, NULL, &p, &s));
        check_casts(NAME("%s: larger weight casts per call", pre), casts() - c0, 1);
        RUN(NAME("%s: reference larger weight", pre), lucid_nn_conv2d_forward(ctx, gx, y3b, w3, NULL, &p));
        h = host(y3b);
        cmp_bits(NAME("%s: larger weight y = per-call", pre), y3a, h);
        rel(h);
        h = NULL;
        c0 = casts();
        RUN(NAME("%s: forward w1 after", pre), lucid_nn_conv2d_forward_shadow(ctx, gx, ya, w1, NULL, &p, &s));
        check_casts(NAME("%s: shadow of w1 survived the larger weight", pre), casts() - c0, 0);
        RUN(NAME("%s: reference w1 after", pre), lucid_nn_conv2d_forward(ctx, gx, yb, w1, NULL, &p));
        h = host(yb);
        cmp_bits(NAME("%s: y with w1 after = per-call", pre), ya, h);
    }
done:
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_ctx_synchronize(ctx);
    lucid_conv_wshadow_release(&s);
    rel(h);
    rel(hx); rel(hdy); rel(hw1); rel(hw2); rel(hw3); rel(gx); rel(gdy); rel(w1); rel(w2);
    rel(w3); rel(ya); rel(yb); rel(y3a); rel(y3b); rel(dxa); rel(dxb);
}

/* The im2col route's flipped weight (written by the group cast after the
 * forward weight in the shadow's buffer) belongs to the shape it was cast
 * for: a view of the same data with the same numel but another shape is
 * "fresh" by the shadow's rule (storage, data pointer, numel, version), so
 * the backward-data must check the flip's shape and cast per call for the
 * view.  [32,16,3,3] cast, used as [16,32,3,3] (same flip size, other
 * layout) and as [2,256,3,3] (Cin*Kr' = 256*24 = 6144 read at offset 4608
 * of a 13824-element buffer, the cast, flipped and transposed weights: the
 * transposed one's bytes without the check): dx bitwise the shadow-less
 * route's. */
static void test_flip_view(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast flipped weight of a view %s", lucid_dtype_name(dt));
    static const int64_t VIEWS[2][4] = {{16, 32, 3, 3}, {2, 256, 3, 3}};
    const int64_t N = 2, H = 8, W = 8;
    int64_t ws[4] = {32, 16, 3, 3};
    lucid_conv2d_params p = {1, 1, 1, 1, 1, 1, 1};
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    lucid_conv_wshadow *sp = &s;
    lucid_tensor *hw = hrand(LUCID_F32, 4, ws, -0.5, 0.5), *gw = dev(hw), *h = NULL;
    if (!hw || !gw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcast(ctx, 2);
    if (lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, 1); /* im2col route */
    for (int v = 0; v < 2; v++) {
        const int64_t Co = VIEWS[v][0], Ci = VIEWS[v][1];
        int64_t xs[4] = {N, Ci, H, W}, ys[4] = {N, Co, H, W};
        lucid_tensor *wv = NULL, *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
        lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *dxa = dpoison(dt, 4, xs),
                     *dxb = dpoison(dt, 4, xs);
        const lucid_tensor *wc = gw;
        if (lucid_tensor_view(ctx, gw, 4, VIEWS[v], &wv) != LUCID_OK || !gx || !gdy || !dxa ||
            !dxb) {
            TEST_FAIL(NAME("%s: view %d setup", pre, v), "%s", lucid_ctx_error(ctx));
        } else {
            RUN(NAME("%s: group cast of [32,16,3,3]", pre),
                lucid_nn_conv2d_cast_shadows(ctx, &wc, &sp, 1, dt));
            RUN(NAME("%s: backward-data of the view [%lld,%lld,3,3] with the shadow", pre,
                     (long long)Co, (long long)Ci),
                lucid_nn_conv2d_backward_input_shadow(ctx, gx, gdy, dxa, wv, &p, 0.0, &s));
            RUN(NAME("%s: reference backward-data", pre),
                lucid_nn_conv2d_backward_input(ctx, gx, gdy, dxb, wv, &p, 0.0));
            h = host(dxb);
            cmp_bits(NAME("%s: view [%lld,%lld,3,3]: dx = per-call", pre, (long long)Co,
                          (long long)Ci),
                     dxa, h);
            rel(h);
            h = NULL;
        }
        rel(wv); rel(hx); rel(hdy); rel(gx); rel(gdy); rel(dxa); rel(dxb);
    }
done:
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, 0);
    lucid_ctx_synchronize(ctx);
    lucid_conv_wshadow_release(&s);
    rel(h);
    rel(hw); rel(gw);
}

#define NGROUP 130
#define NOTHER 4

/* NGROUP (130) eligible 1x1 convs (and 3x3 / strided ones) cast in one call. */
static void test_group(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast group %s", lucid_dtype_name(dt));
    static const int64_t CH[5] = {8, 16, 24, 13, 40};
    lucid_param_set *set = NULL;
    lucid_module *m[NGROUP + NOTHER] = {0};
    lucid_tensor *x[5] = {0}, *dy[5 * 5] = {0}, *ref[NGROUP][3];
    memset(ref, 0, sizeof ref);
    int ok = lucid_param_set_create(ctx, &set) == LUCID_OK;
    for (int i = 0; ok && i < NGROUP; i++) {
        char nmb[32];
        snprintf(nmb, sizeof nmb, "g%d", i);
        ok = lucid_module_conv2d_create(ctx, set, nmb, (int)CH[i % 5], (int)CH[(i / 5) % 5], 1,
                                        1, -1, 1, 1, i % 3 == 0, &m[i]) == LUCID_OK;
    }
    if (ok) ok = !lucid_module_conv2d_create(ctx, set, "o0", 16, 16, 3, 1, -1, 1, 1, 0, &m[NGROUP]);
    if (ok) ok = !lucid_module_conv2d_create(ctx, set, "o1", 16, 8, 1, 2, -1, 1, 1, 0, &m[NGROUP + 1]);
    if (ok) ok = !lucid_module_conv2d_create(ctx, set, "o2", 16, 16, 1, 1, -1, 1, 2, 0, &m[NGROUP + 2]);
    if (ok) ok = !lucid_module_conv2d_create(ctx, set, "o3", 8, 8, 1, 1, -1, 2, 1, 0, &m[NGROUP + 3]);
    if (ok) ok = !lucid_param_set_materialize(ctx, set, GPU, LUCID_F32);
    for (int a = 0; ok && a < 5; a++) {
        int64_t xs[4] = {2, CH[a], 5, 7};
        lucid_tensor *hx = hrand(dt, 4, xs, -1, 1);
        x[a] = dev(hx);
        rel(hx);
        ok = x[a] != NULL;
        for (int b = 0; ok && b < 5; b++) {
            int64_t ys[4] = {2, CH[b], 5, 7};
            lucid_tensor *hd = hrand(dt, 4, ys, -1, 1);
            dy[a * 5 + b] = dev(hd);
            rel(hd);
            ok = dy[a * 5 + b] != NULL;
        }
    }
    if (!ok) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv1x1(ctx, 2);
    lucid_cuda_nn_set_wcast(ctx, 1);
    for (int i = 0; i < NGROUP; i++) {
        unsigned long nc[2];
        RUN(NAME("%s: per-call route %d", pre, i),
            fwd_bwd(m[i], x[i % 5], dy[(i % 5) * 5 + (i / 5) % 5], ref[i], nc));
    }
    lucid_cuda_nn_set_wcast(ctx, 2);
    lucid_cuda_nn_set_wcast_side(ctx, 2);
    {
        unsigned long c0 = casts();
        RUN(NAME("%s: group cast", pre), lucid_nn_conv_cast_weights(ctx, m, NGROUP + NOTHER, dt));
        /* 130 1x1 weights and o0's (the other three take no cuBLAS route):
         * two launches of plain casts, o0's flipped weight (im2col
         * backward-data, on by default) in one on the cast lane */
        check_casts(NAME("%s: %d weights in two launches, a flipped one on the cast lane", pre,
                         NGROUP + 1),
                    casts() - c0, 3);
        c0 = casts();
        int same = 1;
        for (int i = 0; i < NGROUP; i++) {
            unsigned long nc[2];
            lucid_tensor *o[3] = {0};
            RUN(NAME("%s: shadow route %d", pre, i),
                fwd_bwd(m[i], x[i % 5], dy[(i % 5) * 5 + (i / 5) % 5], o, nc));
            for (int k = 0; k < 3; k++)
                same = same && memcmp(lucid_tensor_data(o[k]), lucid_tensor_data(ref[i][k]),
                                      lucid_tensor_nbytes(o[k])) == 0;
            rel3(o);
            if (!same) {
                TEST_FAIL(NAME("%s: conv %d", pre, i), "y, dx or dw differ from the per-call route");
                break;
            }
        }
        check_casts(NAME("%s: the 130 forwards and backward-data cast nothing", pre),
                    casts() - c0, 0);
        CHECK(NAME("%s: every y, dx, dw = per-call (bitwise)", pre), same, "differs");
        /* implicit-GEMM 1x1 route: nothing to cast (weights changed first) */
        RUN(NAME("%s: weight write", pre),
            lucid_binary_scalar(ctx, LUCID_OP_MUL, lucid_param_set_flat_params(set),
                                lucid_param_set_flat_params(set), 0.5, 0));
        lucid_cuda_nn_set_conv1x1(ctx, 1);
        c0 = casts();
        RUN(NAME("%s: group cast igemm", pre), lucid_nn_conv_cast_weights(ctx, m, NGROUP, dt));
        check_casts(NAME("%s: 1x1 switch igemm: group cast queues nothing", pre), casts() - c0, 0);
    }
done:
    if (lucid_cuda_nn_set_wcast_side) lucid_cuda_nn_set_wcast_side(ctx, 0);
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_ctx_synchronize(ctx);
    for (int i = 0; i < NGROUP; i++) rel3(ref[i]);
    for (int i = 0; i < 5; i++) rel(x[i]);
    for (int i = 0; i < 25; i++) rel(dy[i]);
    for (int i = 0; i < NGROUP + NOTHER; i++) lucid_module_release(m[i]);
    lucid_param_set_release(set);
}

/* The conv and the data of the capture tests: host and device x, dy and a
 * weight delta d. */
typedef struct cap_fix {
    lucid_param_set *set;
    lucid_module *m;
    lucid_tensor *hx, *hdy, *hd, *gx, *gdy, *gd;
} cap_fix;

/* Builds f (zeroed first): a Conv2d Ci>Co, k x k, stride 1, autopad, with
 * a bias when k == 1, on N=2 inputs of H x W; 1 on success, else a setup
 * failure is reported under pre and 0 returned (cap_fix_release still
 * applies). Sets the shadows on, the 1x1 switch to cuBLAS and (k > 1) the
 * small-channel kernels off and the im2col route on for every pass (the
 * flipped copy), whatever LUCID_CONV_COL says (cap_fix_release resets all
 * four). */
static int cap_fix_init(cap_fix *f, lucid_dtype dt, const char *pre, int64_t Ci, int64_t Co,
                        int k, int64_t H, int64_t W) {
    memset(f, 0, sizeof *f);
    int64_t xs[4] = {2, Ci, H, W}, ys[4] = {2, Co, H, W}, ws[4] = {Co, Ci, k, k};
    f->hx = hrand(dt, 4, xs, -1, 1);
    f->hdy = hrand(dt, 4, ys, -1, 1);
    f->hd = hrand(LUCID_F32, 4, ws, -0.5, 0.5);
    f->gx = dev(f->hx);
    f->gdy = dev(f->hdy);
    f->gd = dev(f->hd);
    if (!f->hx || !f->hdy || !f->hd || !f->gx || !f->gdy || !f->gd ||
        make_conv(&f->set, &f->m, "c", Ci, Co, k, 1, k == 1) != LUCID_OK) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        return 0;
    }
    lucid_cuda_nn_set_conv1x1(ctx, 2);
    lucid_cuda_nn_set_wcast(ctx, 2);
    if (k > 1 && lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, 1);
    if (k > 1 && lucid_cuda_nn_set_conv_col) lucid_cuda_nn_set_conv_col(ctx, 1 + 7);
    return 1;
}

static void cap_fix_release(cap_fix *f) {
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    if (lucid_cuda_nn_set_conv_small) lucid_cuda_nn_set_conv_small(ctx, 0);
    if (lucid_cuda_nn_set_conv_col) lucid_cuda_nn_set_conv_col(ctx, 0);
    lucid_ctx_synchronize(ctx);
    rel(f->hx); rel(f->hdy); rel(f->hd); rel(f->gx); rel(f->gdy); rel(f->gd);
    lucid_module_release(f->m);
    lucid_param_set_release(f->set);
    memset(f, 0, sizeof *f);
}

/* Captures into *g (begun with flags): the weight += 0.25 d first when
 * axpy, the group cast when cast, zero_grad, the forward, the backward when
 * backward. *cast_n / *fb_n (may be NULL): the cast launches queued by the
 * group cast, and by the forward and backward. 1 on success; a failing call
 * is reported under "<pre>: <what>" and the capture discarded (0). */
static int cap_fix_capture(cap_fix *f, lucid_dtype dt, const char *pre, const char *what,
                           unsigned flags, int axpy, int cast, int backward, lucid_graph **g,
                           unsigned long *cast_n, unsigned long *fb_n) {
    lucid_status s = lucid_ctx_capture_begin_ex(ctx, flags);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: %s: capture begin", pre, what), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        return 0;
    }
    lucid_tensor *y = NULL, *dx = NULL;
    if (axpy) s = lucid_axpy(ctx, f->m->params[0]->data, 0.25, f->gd);
    const unsigned long c0 = casts();
    if (!s && cast) s = lucid_nn_conv_cast_weights(ctx, &f->m, 1, dt);
    const unsigned long c1 = casts();
    if (!s) s = lucid_param_set_zero_grad(ctx, f->set);
    if (!s) s = lucid_module_forward1(ctx, f->m, f->gx, &y);
    if (!s && backward) s = lucid_module_backward1(ctx, f->m, f->gx, f->gdy, &dx);
    const unsigned long c2 = casts();
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: %s: calls while capturing", pre, what), "%s: %s",
                  lucid_status_name(s), lucid_ctx_error(ctx));
        lucid_ctx_capture_end(ctx, NULL);
        return 0;
    }
    if (cast_n) *cast_n = c1 - c0;
    if (fb_n) *fb_n = c2 - c1;
    s = lucid_ctx_capture_end(ctx, g);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: %s: capture end", pre, what), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        return 0;
    }
    TEST_OK(NAME("%s: %s: captured", pre, what));
    return 1;
}

/* The module's y and dx now (a replay's) against the per-call route's
 * (lucid_cuda_nn_set_wcast 1) on the same inputs, bitwise, under
 * "<pre>: <what> y / dx = per-call". */
static void cap_fix_vs_per_call(cap_fix *f, const char *pre, const char *what) {
    lucid_tensor *ry = host(f->m->outputs[0]), *rdx = host(f->m->grad_inputs[0]), *r[3] = {0};
    unsigned long nc[2];
    lucid_cuda_nn_set_wcast(ctx, 1);
    lucid_status s = fwd_bwd(f->m, f->gx, f->gdy, r, nc);
    lucid_cuda_nn_set_wcast(ctx, 2);
    if (s != LUCID_OK) {
        TEST_FAIL(NAME("%s: %s: per-call route", pre, what), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
    } else {
        cmp_bits(NAME("%s: %s y = per-call", pre, what), f->m->outputs[0], ry);
        cmp_bits(NAME("%s: %s dx = per-call", pre, what), f->m->grad_inputs[0], rdx);
    }
    rel(ry);
    rel(rdx);
    rel3(r);
}

/* Capture: a shadow cast before the capture is re-cast inside it; replays
 * after device-side weight updates equal the per-call route, and eager use
 * after a replay re-casts. */
static void test_capture(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast capture %s", lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    cap_fix f;
    lucid_module *m = NULL;
    lucid_graph *g1 = NULL, *g2 = NULL;
    lucid_tensor *r[3] = {0}, *e[3] = {0}, *ry = NULL, *rdx = NULL;
    unsigned long nc[2];
    if (!cap_fix_init(&f, dt, pre, 32, 24, 1, 10, 6)) goto done;
    m = f.m;
    RUN(NAME("%s: eager warm-up", pre), fwd_bwd(m, f.gx, f.gdy, e, nc));
    rel3(e);
    RUN(NAME("%s: eager group cast", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    /* graph 1: group cast, forward, backward (weights unchanged) */
    {
        unsigned long cn = 0, fbn = 0;
        if (!cap_fix_capture(&f, dt, pre, "graph 1", 0u, 0, 1, 1, &g1, &cn, &fbn)) goto done;
        check_casts(NAME("%s: a shadow cast before the capture is re-cast inside", pre), cn, 1);
        check_casts(NAME("%s: captured forward and backward-data cast nothing", pre), fbn, 0);
    }
    RUN(NAME("%s: replay 1", pre), lucid_graph_launch(ctx, g1));
    cap_fix_vs_per_call(&f, pre, "replay 1");
    /* graph 2: the weight moves on the device (axpy) before the forward */
    RUN(NAME("%s: synchronize 2", pre), lucid_ctx_synchronize(ctx));
    if (!cap_fix_capture(&f, dt, pre, "graph 2", 0u, 1, 1, 1, &g2, NULL, NULL)) goto done;
    for (int rep = 0; rep < 2; rep++) {
        RUN(NAME("%s: replay 2 #%d", pre, rep), lucid_graph_launch(ctx, g2));
        ry = host(m->outputs[0]);
        rdx = host(m->grad_inputs[0]);
        /* eager, shadow route: the replay moved the epoch, so it re-casts */
        RUN(NAME("%s: eager after replay #%d", pre, rep), fwd_bwd(m, f.gx, f.gdy, e, nc));
        check_casts(NAME("%s: eager forward after replay #%d re-casts", pre, rep), nc[0], 1);
        check_casts(NAME("%s: eager backward-data after replay #%d reuses", pre, rep), nc[1], 0);
        lucid_cuda_nn_set_wcast(ctx, 1);
        RUN(NAME("%s: per-call after replay #%d", pre, rep), fwd_bwd(m, f.gx, f.gdy, r, nc));
        lucid_cuda_nn_set_wcast(ctx, 2);
        cmp_bits(NAME("%s: replay 2 #%d y = per-call on the updated weight", pre, rep),
                 m->outputs[0], ry);
        cmp_bits(NAME("%s: replay 2 #%d dx = per-call on the updated weight", pre, rep),
                 m->grad_inputs[0], rdx);
        cmp_bits(NAME("%s: eager shadow y after replay #%d = per-call", pre, rep), m->outputs[0],
                 e[0]);
        cmp_bits(NAME("%s: eager shadow dx after replay #%d = per-call", pre, rep),
                 m->grad_inputs[0], e[1]);
        rel(ry);
        rel(rdx);
        ry = rdx = NULL;
        rel3(r);
        rel3(e);
    }
done:
    lucid_ctx_synchronize(ctx);
    if (g1) lucid_graph_destroy(g1);
    if (g2) lucid_graph_destroy(g2);
    rel3(r);
    rel3(e);
    rel(ry);
    rel(rdx);
    cap_fix_release(&f);
}

/* A capture that keeps the shadows (LUCID_CAPTURE_KEEP_SHADOWS, graph.h):
 * stale-make, group cast, capture: the capture casts nothing and the graph
 * keeps the shadows; its replays leave them fresh (a group cast after one
 * queues nothing); after an eager weight write one group cast refreshes
 * them and the next replay equals the per-call route on the new weight.
 * A keeping capture begun with a stale shadow casts inside: that graph does
 * not keep the shadows, and its launch makes them stale. An unknown flag is
 * ERR_ARG. */
static void test_capture_keep(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast capture keeping the shadows %s", lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    cap_fix f;
    lucid_module *m = NULL;
    lucid_graph *g = NULL, *g2 = NULL;
    lucid_tensor *e[3] = {0};
    unsigned long nc[2], c0;
    if (!cap_fix_init(&f, dt, pre, 32, 24, 1, 10, 6)) goto done;
    m = f.m;
    CHECK(NAME("%s: unknown flag refused", pre),
          lucid_ctx_capture_begin_ex(ctx, 4u) == LUCID_ERR_ARG && !lucid_ctx_capturing(ctx),
          "%s", lucid_ctx_error(ctx));
    RUN(NAME("%s: eager warm-up", pre), fwd_bwd(m, f.gx, f.gdy, e, nc));
    rel3(e);
    RUN(NAME("%s: shadows stale", pre), lucid_ctx_shadows_stale(ctx));
    c0 = casts();
    RUN(NAME("%s: group cast before the capture", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    check_casts(NAME("%s: the stale shadow is cast before the capture", pre), casts() - c0, 1);
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    {
        unsigned long cn = 0, fbn = 0;
        if (!cap_fix_capture(&f, dt, pre, "kept", LUCID_CAPTURE_KEEP_SHADOWS, 0, 1, 1, &g, &cn,
                             &fbn))
            goto done;
        check_casts(NAME("%s: the capture casts nothing", pre), cn + fbn, 0);
    }
    CHECK(NAME("%s: the graph keeps the shadows", pre), lucid_graph_keeps_shadows(g) == 1, "%d",
          lucid_graph_keeps_shadows(g));
    for (int rep = 0; rep < 2; rep++) {
        if (rep == 1) { /* an eager weight write (an op: the version moves), then the refresh */
            RUN(NAME("%s: weight update", pre), lucid_axpy(ctx, m->params[0]->data, 0.25, f.gd));
            c0 = casts();
            RUN(NAME("%s: group cast after the update", pre),
                lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
            check_casts(NAME("%s: the updated weight is cast once", pre), casts() - c0, 1);
        }
        RUN(NAME("%s: replay #%d", pre, rep), lucid_graph_launch(ctx, g));
        c0 = casts();
        RUN(NAME("%s: group cast after replay #%d", pre, rep),
            lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
        check_casts(NAME("%s: the replay #%d left the shadow fresh", pre, rep), casts() - c0, 0);
        cap_fix_vs_per_call(&f, pre, rep ? "replay #1 (updated weight)" : "replay #0");
    }
    /* begun with the shadow stale: cast inside, the graph does not keep it */
    RUN(NAME("%s: shadows stale 2", pre), lucid_ctx_shadows_stale(ctx));
    RUN(NAME("%s: synchronize 2", pre), lucid_ctx_synchronize(ctx));
    {
        unsigned long cn = 0, fbn = 0;
        if (!cap_fix_capture(&f, dt, pre, "kept, begun stale", LUCID_CAPTURE_KEEP_SHADOWS, 0, 1, 0,
                             &g2, &cn, &fbn))
            goto done;
        check_casts(NAME("%s: a stale shadow is cast inside", pre), cn + fbn, 1);
    }
    CHECK(NAME("%s: that graph does not keep the shadows", pre), lucid_graph_keeps_shadows(g2) == 0,
          "%d", lucid_graph_keeps_shadows(g2));
    RUN(NAME("%s: group cast after capture 2", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    RUN(NAME("%s: replay of graph 2", pre), lucid_graph_launch(ctx, g2));
    c0 = casts();
    RUN(NAME("%s: group cast after graph 2", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    check_casts(NAME("%s: its launch made the shadow stale", pre), casts() - c0, 1);
done:
    lucid_ctx_synchronize(ctx);
    if (g) lucid_graph_destroy(g);
    if (g2) lucid_graph_destroy(g2);
    rel3(e);
    cap_fix_release(&f);
}

/* A keeping graph reads the flipped copy it was captured with: a 3x3
 * stride-1 conv on the im2col route (its backward-data reads the shadow's
 * flipped weight), captured with the shadows kept; then a weight write and an
 * eager forward alone (its shadow_take recasts the plain part only, the
 * flipped copy goes stale); the group cast before the replay must write the
 * flipped copy too (1 launch or more), and the replay's dx must equal the
 * per-call route's on the new weight (review of session 15). */
static void test_capture_keep_flip(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast keeping graph, flipped copy %s", lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    cap_fix f;
    lucid_module *m = NULL;
    lucid_graph *g = NULL;
    lucid_tensor *e[3] = {0};
    unsigned long nc[2], c0;
    if (!cap_fix_init(&f, dt, pre, 16, 32, 3, 8, 8)) goto done;
    m = f.m;
    RUN(NAME("%s: eager warm-up", pre), fwd_bwd(m, f.gx, f.gdy, e, nc));
    rel3(e);
    RUN(NAME("%s: shadows stale", pre), lucid_ctx_shadows_stale(ctx));
    RUN(NAME("%s: group cast", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    if (!cap_fix_capture(&f, dt, pre, "kept", LUCID_CAPTURE_KEEP_SHADOWS, 0, 0, 1, &g, NULL, NULL))
        goto done;
    CHECK(NAME("%s: the graph keeps the shadows", pre), lucid_graph_keeps_shadows(g) == 1, "%d",
          lucid_graph_keeps_shadows(g));
    RUN(NAME("%s: weight update", pre), lucid_axpy(ctx, m->params[0]->data, 0.25, f.gd));
    {
        lucid_tensor *y = NULL;
        RUN(NAME("%s: eager forward alone", pre), lucid_module_forward1(ctx, m, f.gx, &y));
    }
    c0 = casts();
    RUN(NAME("%s: group cast before the replay", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    CHECK(NAME("%s: the stale flipped copy is cast", pre), casts() - c0 >= 1, "%lu launches",
          casts() - c0);
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    cap_fix_vs_per_call(&f, pre, "replay on the new weight");
done:
    lucid_ctx_synchronize(ctx);
    if (g) lucid_graph_destroy(g);
    rel3(e);
    cap_fix_release(&f);
}

/* A shadow first used inside a capture (no buffer: allocation refused). */
static void test_first_use_in_capture(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast first use in a capture %s", lucid_dtype_name(dt));
    if (!cuda_test_graphs(pre)) return;
    const int64_t N = 2, Ci = 24, Co = 16, H = 8, W = 8;
    int64_t xs[4] = {N, Ci, H, W}, ys[4] = {N, Co, H, W}, ws[4] = {Co, Ci, 1, 1};
    lucid_conv2d_params p = {1, 1, 0, 0, 1, 1, 1};
    lucid_conv_wshadow s, *sp = &s;
    lucid_conv_wshadow_init(&s);
    lucid_graph *gr = NULL;
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
    lucid_tensor *hw = hrand(LUCID_F32, 4, ws, -0.5, 0.5);
    lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *gw = dev(hw);
    lucid_tensor *ey = dpoison(dt, 4, ys), *ry = dpoison(dt, 4, ys), *edx = dpoison(dt, 4, xs),
                 *rdx = dpoison(dt, 4, xs), *h0 = NULL, *h1 = NULL;
    if (!hx || !hdy || !hw || !gx || !gdy || !gw || !ey || !ry || !edx || !rdx) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_conv1x1(ctx, 2);
    lucid_cuda_nn_set_wcast(ctx, 2);
    /* eager, no shadow: plans and scratch of the shape exist */
    RUN(NAME("%s: eager forward", pre), lucid_nn_conv2d_forward(ctx, gx, ey, gw, NULL, &p));
    RUN(NAME("%s: eager backward-data", pre),
        lucid_nn_conv2d_backward_input(ctx, gx, gdy, edx, gw, &p, 0.0));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        const lucid_tensor *wv = gw;
        unsigned long c0 = casts();
        lucid_status st = lucid_nn_conv2d_cast_shadows(ctx, &wv, &sp, 1, dt);
        unsigned long c1 = casts();
        if (!st) st = lucid_nn_conv2d_forward_shadow(ctx, gx, ry, gw, NULL, &p, &s);
        if (!st) st = lucid_nn_conv2d_backward_input_shadow(ctx, gx, gdy, rdx, gw, &p, 0.0, &s);
        unsigned long c2 = casts();
        if (st != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(st),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
        check_casts(NAME("%s: group cast skips a shadow without buffer", pre), c1 - c0, 0);
        check_casts(NAME("%s: the convs cast per call", pre), c2 - c1, 2);
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    CHECK(NAME("%s: the shadow stays empty", pre), !s.buf && !s.valid, "buf %p valid %d",
          (void *)s.buf, s.valid);
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    h0 = host(ey);
    h1 = host(edx);
    cmp_bits(NAME("%s: replay y = eager", pre), ry, h0);
    cmp_bits(NAME("%s: replay dx = eager", pre), rdx, h1);
done:
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_ctx_synchronize(ctx);
    if (gr) lucid_graph_destroy(gr);
    lucid_conv_wshadow_release(&s);
    rel(h0); rel(h1); rel(hx); rel(hdy); rel(hw); rel(gx); rel(gdy); rel(gw);
    rel(ey); rel(ry); rel(edx); rel(rdx);
}

/* The stride-phase backward-data's transposed weight in the shadow of a
 * stride-2 3x3 module (Ci > Co, H x W input). */
static unsigned long wtc(void) { return lucid_conv_igemm_wt_cast_count(); }

static void test_phase(lucid_dtype dt, int64_t Ci, int64_t Co, int64_t H, int64_t W) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast phase %lld>%lld %s", (long long)Ci, (long long)Co,
             lucid_dtype_name(dt));
    const int64_t N = 2, Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    int64_t xs[4] = {N, Ci, H, W}, ys[4] = {N, Co, Ho, Wo};
    lucid_param_set *set = NULL;
    lucid_module *m = NULL;
    lucid_graph *gr = NULL;
    lucid_tensor *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
    lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *off[3] = {0}, *on[3] = {0}, *rdx = NULL;
    unsigned long nc[2], t0, c0;
    if (!hx || !hdy || !gx || !gdy || make_conv(&set, &m, "p", Ci, Co, 3, 2, 0) != LUCID_OK) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* the copies on the cast lane (the default env; set for the counts) */
    lucid_cuda_nn_set_wcast_side(ctx, 2);
    /* the per-call route (no shadows): one transposition per backward-data */
    lucid_cuda_nn_set_wcast(ctx, 1);
    t0 = wtc();
    RUN(NAME("%s: per-call route", pre), fwd_bwd(m, gx, gdy, off, nc));
    CHECK(NAME("%s: per-call route transposes once", pre), wtc() - t0 == 1, "%lu", wtc() - t0);
    lucid_cuda_nn_set_wcast(ctx, 2);
    t0 = wtc();
    RUN(NAME("%s: shadow route", pre), fwd_bwd(m, gx, gdy, on, nc));
    CHECK(NAME("%s: first backward-data transposes per call", pre), wtc() - t0 == 1, "%lu",
          wtc() - t0);
    cmp3(pre, "first shadow pass = per-call", m, off);
    rel3(on);
    c0 = casts();
    RUN(NAME("%s: group cast", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    check_casts(NAME("%s: group cast re-casts the fresh shadow for the copy (the weight, then "
                     "its copies on the cast lane)", pre),
                casts() - c0, 2);
    t0 = wtc();
    RUN(NAME("%s: shadow route with the copy", pre), fwd_bwd(m, gx, gdy, on, nc));
    CHECK(NAME("%s: backward-data reads the shadow's copy", pre), wtc() - t0 == 0, "%lu",
          wtc() - t0);
    check_casts(NAME("%s: forward and backward-data cast nothing", pre), nc[0] + nc[1], 0);
    cmp3(pre, "copy = per-call", m, off);
    rel3(on);
    c0 = casts();
    RUN(NAME("%s: group cast again", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    check_casts(NAME("%s: group cast of a shadow holding the copy queues nothing", pre),
                casts() - c0, 0);
    /* a weight write: the group cast writes the copy with the weight */
    RUN(NAME("%s: in-place weight write", pre),
        lucid_binary_scalar(ctx, LUCID_OP_MUL, m->params[0]->data, m->params[0]->data, -0.75, 0));
    c0 = casts();
    RUN(NAME("%s: group cast after the write", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    check_casts(NAME("%s: group cast after the write launches twice (one on the cast lane)", pre),
                casts() - c0, 2);
    t0 = wtc();
    RUN(NAME("%s: shadow route after the write", pre), fwd_bwd(m, gx, gdy, on, nc));
    CHECK(NAME("%s: after the write: no transposition", pre), wtc() - t0 == 0, "%lu", wtc() - t0);
    lucid_cuda_nn_set_wcast(ctx, 1);
    rel3(off);
    RUN(NAME("%s: per-call route after the write", pre), fwd_bwd(m, gx, gdy, off, nc));
    cmp3(pre, "new weight: per-call = shadow", m, on);
    rel3(on);
    rel3(off);
    /* the kernel's switch off: the shadow's copy is neither written nor read */
    lucid_conv_igemm_set_dgrad_phase(0);
    RUN(NAME("%s: switch off, per-call route", pre), fwd_bwd(m, gx, gdy, off, nc));
    lucid_cuda_nn_set_wcast(ctx, 2);
    RUN(NAME("%s: switch off, weight write", pre),
        lucid_binary_scalar(ctx, LUCID_OP_MUL, m->params[0]->data, m->params[0]->data, 1.0, 0));
    RUN(NAME("%s: switch off, group cast", pre), lucid_nn_conv_cast_weights(ctx, &m, 1, dt));
    t0 = wtc();
    RUN(NAME("%s: switch off, shadow route", pre), fwd_bwd(m, gx, gdy, on, nc));
    CHECK(NAME("%s: switch off: no transposition", pre), wtc() - t0 == 0, "%lu", wtc() - t0);
    cmp3(pre, "switch off: shadow = per-call", m, off);
    lucid_conv_igemm_set_dgrad_phase(-1);
    rel3(on);
    rel3(off);
    /* captured after the eager passes: group cast, forward, backward */
    if (!cuda_test_graphs(pre)) goto done;
    RUN(NAME("%s: eager warm-up", pre), fwd_bwd(m, gx, gdy, on, nc));
    rel3(on);
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture begin", pre), lucid_ctx_capture_begin(ctx));
    {
        lucid_tensor *y = NULL, *dx = NULL;
        t0 = wtc();
        lucid_status s = lucid_nn_conv_cast_weights(ctx, &m, 1, dt);
        if (!s) s = lucid_param_set_zero_grad(ctx, set);
        if (!s) s = lucid_module_forward1(ctx, m, gx, &y);
        if (!s) s = lucid_module_backward1(ctx, m, gx, gdy, &dx);
        if (s != LUCID_OK) {
            TEST_FAIL(NAME("%s: calls while capturing", pre), "%s: %s", lucid_status_name(s),
                      lucid_ctx_error(ctx));
            lucid_ctx_capture_end(ctx, NULL);
            goto done;
        }
        CHECK(NAME("%s: captured backward-data transposes nothing", pre), wtc() - t0 == 0, "%lu",
              wtc() - t0);
    }
    RUN(NAME("%s: capture end", pre), lucid_ctx_capture_end(ctx, &gr));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, gr));
    rdx = host(m->grad_inputs[0]);
    lucid_cuda_nn_set_wcast(ctx, 1);
    RUN(NAME("%s: per-call route after the replay", pre), fwd_bwd(m, gx, gdy, off, nc));
    cmp_bits(NAME("%s: replay dx = per-call", pre), m->grad_inputs[0], rdx);
done:
    if (lucid_conv_igemm_set_dgrad_phase) lucid_conv_igemm_set_dgrad_phase(-1);
    if (lucid_cuda_nn_set_wcast_side) lucid_cuda_nn_set_wcast_side(ctx, 0);
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    lucid_ctx_synchronize(ctx);
    if (gr) lucid_graph_destroy(gr);
    rel3(off);
    rel3(on);
    rel(rdx); rel(hx); rel(hdy); rel(gx); rel(gdy);
    lucid_module_release(m);
    lucid_param_set_release(set);
}

/* The transposed weight belongs to the shape it was cast for, as the
 * flipped one: [32,16,3,3] (its stride-2 backward-data asked for it, the
 * group cast wrote it), then a stride-2 backward-data of the view
 * [16,32,3,3] through the same shadow transposes per call (1 launch) and
 * equals the shadow-less route bitwise; the weight itself reads the copy
 * (0 launches). */
static void test_phase_view(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast phase copy of a view %s", lucid_dtype_name(dt));
    static const int64_t SH[2][4] = {{32, 16, 3, 3}, {16, 32, 3, 3}};
    const int64_t N = 2, H = 12, W = 10;
    lucid_conv2d_params p = {2, 2, 1, 1, 1, 1, 1};
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    lucid_conv_wshadow *sp = &s;
    lucid_tensor *hw = hrand(LUCID_F32, 4, SH[0], -0.5, 0.5), *gw = dev(hw), *h = NULL;
    const lucid_tensor *wc = gw;
    if (!hw || !gw) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcast(ctx, 2);
    for (int v = 0; v < 3; v++) { /* the weight (asks), the weight (reads), the view */
        const int64_t *sh = SH[v == 2];
        const int64_t Co = sh[0], Ci = sh[1];
        int64_t xs[4] = {N, Ci, H, W}, ys[4] = {N, Co, H / 2, W / 2};
        lucid_tensor *wv = NULL, *hx = hrand(dt, 4, xs, -1, 1), *hdy = hrand(dt, 4, ys, -1, 1);
        lucid_tensor *gx = dev(hx), *gdy = dev(hdy), *dxa = dpoison(dt, 4, xs),
                     *dxb = dpoison(dt, 4, xs);
        if (lucid_tensor_view(ctx, gw, 4, sh, &wv) != LUCID_OK || !gx || !gdy || !dxa || !dxb) {
            TEST_FAIL(NAME("%s: %d setup", pre, v), "%s", lucid_ctx_error(ctx));
        } else {
            if (v > 0)
                RUN(NAME("%s: group cast of [32,16,3,3] (%d)", pre, v),
                    lucid_nn_conv2d_cast_shadows(ctx, &wc, &sp, 1, dt));
            unsigned long t0 = wtc();
            RUN(NAME("%s: backward-data of [%lld,%lld,3,3] with the shadow (%d)", pre,
                     (long long)Co, (long long)Ci, v),
                lucid_nn_conv2d_backward_input_shadow(ctx, gx, gdy, dxa, wv, &p, 0.0, &s));
            unsigned long want = v == 1 ? 0 : 1;
            CHECK(NAME("%s: [%lld,%lld,3,3] (%d): %lu transpositions", pre, (long long)Co,
                       (long long)Ci, v, want),
                  wtc() - t0 == want, "%lu", wtc() - t0);
            RUN(NAME("%s: reference backward-data (%d)", pre, v),
                lucid_nn_conv2d_backward_input(ctx, gx, gdy, dxb, wv, &p, 0.0));
            h = host(dxb);
            cmp_bits(NAME("%s: [%lld,%lld,3,3] (%d): dx = per-call", pre, (long long)Co,
                          (long long)Ci, v),
                     dxa, h);
            rel(h);
            h = NULL;
        }
        rel(wv); rel(hx); rel(hdy); rel(gx); rel(gdy); rel(dxa); rel(dxb);
    }
done:
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    lucid_ctx_synchronize(ctx);
    lucid_conv_wshadow_release(&s);
    rel(hw); rel(gw);
}

/* The three regions of a shadow's buffer as host tensors of dt: [0] the
 * cast weight (numel), [1] the flipped weight (Cin*Kr at flip_off; NULL
 * when none), [2] the transposed weight (numel at phase_off; NULL when
 * none).  With poison, the device regions are filled with NaN instead
 * (nothing is read back).  0 with a not-ok line on a failure. */
#define NCOPY 5
static int shadow_regions(const char *name, const lucid_conv_wshadow *s, const lucid_tensor *w,
                          lucid_dtype dt, int poison, lucid_tensor *out[3]) {
    const int64_t numel = lucid_tensor_numel(w), Co = w->shape[0], Ci = w->shape[1],
                  KK = w->shape[2] * w->shape[3];
    const int64_t len[3] = {numel, Ci * ((Co * KK + 7) / 8 * 8), numel};
    const int64_t off[3] = {0, s->flip_off, s->phase_off};
    for (int r = 0; r < 3; r++) {
        out[r] = NULL;
        if (r > 0 && off[r] <= 0) continue;
        lucid_tensor *v = NULL;
        lucid_status st = lucid_tensor_from_storage(ctx, s->buf, dt, 1, &len[r], NULL, off[r], &v);
        if (st == LUCID_OK && poison) st = lucid_fill(ctx, v, NAN);
        if (st == LUCID_OK && !poison && !(out[r] = host(v))) st = lucid_ctx_last_status(ctx);
        rel(v);
        if (st != LUCID_OK) {
            TEST_FAIL(name, "region %d: %s", r, lucid_ctx_error(ctx));
            return 0;
        }
    }
    return 1;
}

/* Every element of the regions finite (none left poisoned), the flipped
 * and transposed ones bitwise the plain cast's element at the per-call
 * maps' source (written out from their definitions). */
static void check_regions(const char *pre, const char *what, const lucid_tensor *w,
                          lucid_tensor *const reg[3]) {
    const int64_t Co = w->shape[0], Ci = w->shape[1], kh = w->shape[2], kw = w->shape[3],
                  KK = kh * kw, numel = lucid_tensor_numel(w), Kr = (Co * KK + 7) / 8 * 8;
    int64_t bad[3] = {-1, -1, -1};
    for (int r = 0; r < 3; r++)
        for (int64_t i = 0; reg[r] && i < lucid_tensor_numel(reg[r]) && bad[r] < 0; i++)
            if (!isfinite(test_hget(reg[r], i))) bad[r] = i;
    CHECK(NAME("%s: %s: every element written", pre, what), bad[0] < 0 && bad[1] < 0 && bad[2] < 0,
          "unwritten (NaN) at %lld / %lld / %lld of the cast / flipped / transposed weight",
          (long long)bad[0], (long long)bad[1], (long long)bad[2]);
    const uint16_t *p = lucid_tensor_data(reg[0]);
    if (reg[1]) {
        const uint16_t *f = lucid_tensor_data(reg[1]);
        int64_t first = -1;
        for (int64_t ci = 0; ci < Ci && first < 0; ci++)
            for (int64_t k = 0; k < Kr && first < 0; k++) {
                uint16_t want = 0; /* +0: the padding of each row */
                if (k < Co * KK) {
                    const int64_t co = k / KK, rq = k % KK, r = rq / kw, q = rq % kw;
                    want = p[(co * Ci + ci) * KK + (kh - 1 - r) * kw + (kw - 1 - q)];
                }
                if (f[ci * Kr + k] != want) first = ci * Kr + k;
            }
        CHECK(NAME("%s: %s: flipped weight = the cast at the flip map", pre, what), first < 0,
              "differs at %lld", (long long)first);
    }
    if (reg[2]) {
        const uint16_t *t = lucid_tensor_data(reg[2]);
        int64_t first = -1;
        for (int64_t i = 0; i < numel && first < 0; i++) {
            const int64_t rr = i / Ci, ci = i % Ci, tap = rr / Co, co = rr % Co;
            if (t[i] != p[(co * Ci + ci) * KK + tap]) first = i;
        }
        CHECK(NAME("%s: %s: transposed weight = the cast at the transpose map", pre, what),
              first < 0, "differs at %lld", (long long)first);
    }
}

/* The copies of the backward-data written by the group cast, on both routes
 * (see the file comment). */
static void test_copies(lucid_dtype dt) {
    char pre[96];
    snprintf(pre, sizeof pre, "wcast copies %s", lucid_dtype_name(dt));
    static const int64_t SH[NCOPY][4] = {
        {32, 16, 3, 3}, {48, 64, 3, 3}, {24, 8, 5, 5}, {2, 8, 33, 33}, {16, 24, 1, 1}};
    lucid_conv_wshadow s[NCOPY], *sp[NCOPY];
    lucid_tensor *gw[NCOPY] = {0}, *first[NCOPY][3], *now[NCOPY][3];
    const lucid_tensor *wc[NCOPY];
    memset(first, 0, sizeof first);
    memset(now, 0, sizeof now);
    int ok = 1;
    for (int i = 0; i < NCOPY; i++) {
        lucid_conv_wshadow_init(&s[i]);
        sp[i] = &s[i];
        lucid_tensor *hw = hrand(LUCID_F32, 4, SH[i], -0.5, 0.5);
        gw[i] = dev(hw);
        rel(hw);
        wc[i] = gw[i];
        ok = ok && gw[i];
        /* as the first stride-2 backward-data would: the group cast then
         * writes the transposed weight (Cin % 8 == 0, spatial) */
        if (SH[i][2] * SH[i][3] > 1) lucid_conv_wshadow_want_phase(&s[i]);
    }
    if (!ok || !lucid_cuda_nn_set_conv_col) {
        TEST_FAIL(NAME("%s: setup", pre), "%s", ok ? "lucid_cuda_nn_set_conv_col missing"
                                                   : lucid_ctx_error(ctx));
        goto done;
    }
    lucid_cuda_nn_set_wcast(ctx, 2);
    lucid_cuda_nn_set_conv1x1(ctx, 2);                        /* the 1x1 weight's route */
    lucid_cuda_nn_set_conv_col(ctx, 1 + 7);                   /* every pass: the flips */
    lucid_conv_igemm_set_dgrad_phase(1);                      /* the transposed copies */
    /* the buffers, allocated by a first cast (then poisoned before each) */
    lucid_cuda_nn_set_wcast_side(ctx, 1);
    RUN(NAME("%s: first group cast", pre), lucid_nn_conv2d_cast_shadows(ctx, wc, sp, NCOPY, dt));
    for (int i = 0; i < NCOPY; i++) {
        const int spatial = SH[i][2] * SH[i][3] > 1;
        CHECK(NAME("%s: %d: cast, flipped and transposed weights written", pre, i),
              s[i].valid && s[i].buf && (s[i].flip_off > 0) == spatial &&
                  (s[i].phase_off > 0) == spatial,
              "valid %d flip_off %lld phase_off %lld", s[i].valid, (long long)s[i].flip_off,
              (long long)s[i].phase_off);
        if (!s[i].valid || !s[i].buf) goto done;
    }
    /* the routes: single launch, cast lane, single launch again (each after a
     * version bump of every weight, same values, and the regions poisoned) */
    static const int ROUTE[3] = {1, 2, 1};
    for (int k = 0; k < 3; k++) {
        const int side = ROUTE[k];
        const char *what = side == 2 ? "cast lane" : k ? "single launch again" : "single launch";
        for (int i = 0; i < NCOPY; i++) {
            RUN(NAME("%s: %s: version bump %d", pre, what, i),
                lucid_binary_scalar(ctx, LUCID_OP_MUL, gw[i], gw[i], 1.0, 0));
            if (!shadow_regions(NAME("%s: %s: poison %d", pre, what, i), &s[i], gw[i], dt, 1,
                                now[i]))
                goto done;
        }
        lucid_cuda_nn_set_wcast_side(ctx, side);
        unsigned long c0 = casts();
        RUN(NAME("%s: %s: group cast", pre, what),
            lucid_nn_conv2d_cast_shadows(ctx, wc, sp, NCOPY, dt));
        check_casts(NAME("%s: %s: %s", pre, what,
                         side == 2 ? "two launches (the copies on the cast lane)" : "one launch"),
                    casts() - c0, side == 2 ? 2 : 1);
        for (int i = 0; i < NCOPY; i++) {
            char w[64];
            snprintf(w, sizeof w, "%s, [%lld,%lld,%lld,%lld]", what, (long long)SH[i][0],
                     (long long)SH[i][1], (long long)SH[i][2], (long long)SH[i][3]);
            if (!shadow_regions(NAME("%s: %s: read back", pre, w), &s[i], gw[i], dt, 0, now[i]))
                goto done;
            check_regions(pre, w, gw[i], now[i]);
            if (k == 0) {
                memcpy(first[i], now[i], sizeof first[i]);
                memset(now[i], 0, sizeof now[i]);
                continue;
            }
            int same = 1;
            for (int r = 0; r < 3; r++)
                same = same && !first[i][r] == !now[i][r] &&
                       (!now[i][r] || memcmp(lucid_tensor_data(now[i][r]),
                                             lucid_tensor_data(first[i][r]),
                                             lucid_tensor_nbytes(now[i][r])) == 0);
            CHECK(NAME("%s: %s: the bytes of the single launch", pre, w), same,
                  "a region differs");
            rel3(now[i]);
        }
    }
done:
    if (lucid_conv_igemm_set_dgrad_phase) lucid_conv_igemm_set_dgrad_phase(-1);
    if (lucid_cuda_nn_set_conv_col) lucid_cuda_nn_set_conv_col(ctx, 0);
    if (lucid_cuda_nn_set_wcast_side) lucid_cuda_nn_set_wcast_side(ctx, 0);
    if (lucid_cuda_nn_set_wcast) lucid_cuda_nn_set_wcast(ctx, 0);
    if (lucid_cuda_nn_set_conv1x1) lucid_cuda_nn_set_conv1x1(ctx, 0);
    lucid_ctx_synchronize(ctx);
    for (int i = 0; i < NCOPY; i++) {
        lucid_conv_wshadow_release(&s[i]);
        rel3(first[i]);
        rel3(now[i]);
        rel(gw[i]);
    }
}

static const char *GROUPS[] = {"cuda conv weight shadows"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!lucid_cuda_nn_set_wcast || !lucid_cuda_nn_set_wcast_side || !lucid_cuda_nn_set_conv1x1 ||
        !lucid_cuda_wcast_launch_count) {
        TEST_FAIL("cuda conv weight shadow hooks linked", "a test hook of cuda/ is missing");
        return test_exit();
    }
    if (!cuda_test_ctx_create("test_conv_wcast_cuda")) return test_exit();
    static const lucid_dtype DTS[2] = {LUCID_BF16, LUCID_F16};
    for (int d = 0; d < 2; d++) {
        for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) test_module(&CASES[c], DTS[d]);
        test_replace(DTS[d]);
        test_flip_view(DTS[d]);
        test_group(DTS[d]);
        test_capture(DTS[d]);
        test_capture_keep(DTS[d]);
        test_capture_keep_flip(DTS[d]);
        test_first_use_in_capture(DTS[d]);
        if (lucid_conv_igemm_set_dgrad_phase && lucid_conv_igemm_wt_cast_count) {
            test_phase(DTS[d], 64, 48, 18, 16);
            test_phase(DTS[d], 16, 32, 22, 20);
            test_phase_view(DTS[d]);
            test_copies(DTS[d]);
        }
    }
    return cuda_test_finish();
}
