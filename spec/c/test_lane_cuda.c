/*
 * test_lane_cuda.c — the lanes of a CUDA context (cuda/lane.cu): the
 * parameter-gradient lane (lucid_ctx_set_grad_lane, used by the Conv2d
 * module's backward) and the branch lanes (lucid_ctx_branch_fork / return /
 * join), through the public C API (engine/lucid.h, engine/nn/nn.h,
 * engine/train/graph.h).
 *
 * Checks
 *   arguments     branch_fork of branch 0 and 4, branch_join of 0 and 7:
 *                 LUCID_ERR_ARG with a message, forked stays 0; a return
 *                 with no fork open is a no-op; joining a branch whose fork
 *                 is open: LUCID_ERR_STATE with a message; a second fork of
 *                 an open lane runs inline (forked 0); on a CPU context every
 *                 call is a no-op (forked 0).
 *   nesting       inside an open branch 1, a Conv2d module backward with the
 *                 grad lane on forks lane 0 from lane 1 and returns: lane 1
 *                 is still the open fork afterwards (its join is still
 *                 ERR_STATE), and after branch_return + join + grad lane off
 *                 the gradients and grad input equal the single-stream ones
 *                 bitwise.
 *   grad lane     a stack of three Conv2d modules (bf16 activations, f32
 *                 parameters): 3x3 16>32, 1x1 32>32 with bias (the cuBLAS
 *                 1x1 route when the test hook is linked), 3x3 32>16 with
 *                 bias; forward + backward with the lane (a) off, (b) on,
 *                 (c) on inside a graph capture (the lane turned off inside
 *                 the capture; and left on, so that capture_end joins it),
 *                 replayed: output, grad inputs and the flat gradient
 *                 buffer bitwise equal to (a); two passes without zeroing
 *                 (two eager passes with the lane, two replays) equal two
 *                 eager passes with the lane off bitwise (accumulation).
 *   branches      three independent towers (Conv2d 3x3 16>16, bias on one,
 *                 BatchNorm2d in training mode, SiLU; forward + backward),
 *                 tower b queued on branch lane b, then branch_join(-1):
 *                 outputs, grad inputs and gradients bitwise equal to the
 *                 same calls on one stream; with the grad lane on as well
 *                 (lane 0 nested in each branch); captured into a graph with
 *                 branch_join, and without it (capture_end joins the lanes
 *                 itself), replayed: bitwise equal.
 *   joins         work left pending on a lane (200 dependent adds on a 32 MiB
 *                 tensor, queued faster than the device runs them) is
 *                 complete for a host read after lucid_ctx_synchronize, and
 *                 after lucid_event_record + lucid_event_synchronize, with
 *                 no explicit join.
 *   first fork    on a fresh context, a branch fork inside a capture, before
 *                 the lane's resources exist, runs inline (forked 0) and the
 *                 capture ends and replays; the next eager fork creates the
 *                 lane (forked 1).
 * LUCID_BRANCH_LANES=0 / LUCID_GRAD_LANE=0 in the environment switch the
 * lanes off: the "forked" expectations follow them and the equalities
 * still hold.  Without a CUDA device every group prints one skip line and
 * the program exits 0.
 */
#include "test_cuda_util.h"

#include "nn/nn.h"
#include "train/graph.h"

/* cuda/nn_table.cu test hook: 1x1 route 0 LUCID_CONV1X1, 1 igemm, 2 gemm */
#if defined(__GNUC__)
__attribute__((weak))
#endif
int lucid_cuda_nn_set_conv1x1(lucid_ctx *ctx, int route);

/* Return the status of a lucid call that fails (engine/internal.h's
 * LUCID_TRY, which tests do not include). */
#define TRY(expr)                                                             \
    do {                                                                      \
        lucid_status try_s_ = (expr);                                         \
        if (try_s_ != LUCID_OK) return try_s_;                                \
    } while (0)

static int g_branch_on, g_grad_on; /* the lanes are not switched off */

static int env_is_zero(const char *name) {
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* Error message set: the context holds a non-empty message. */
static int has_msg(lucid_ctx *c) {
    const char *m = lucid_ctx_error(c);
    return m && m[0];
}

/* ================================================================ arguments */

static void test_arguments(void) {
    const char *pre = "lane arguments";
    int f = 7;
    lucid_status s;

    /* CPU context: no lanes, every call succeeds and forks nothing */
    lucid_ctx *cpu = test_cpu_ctx();
    if (cpu) {
        s = lucid_ctx_branch_fork(cpu, 1, &f);
        CHECK(NAME("%s: cpu branch_fork(1) ok, forked 0", pre), s == LUCID_OK && f == 0,
              "status %s forked %d", lucid_status_name(s), f);
        s = lucid_ctx_branch_join(cpu, -1);
        CHECK(NAME("%s: cpu branch_join(-1) ok", pre), s == LUCID_OK, "status %s",
              lucid_status_name(s));
        s = lucid_ctx_set_grad_lane(cpu, 1);
        if (!s) s = lucid_ctx_set_grad_lane(cpu, 0);
        CHECK(NAME("%s: cpu set_grad_lane on/off ok", pre), s == LUCID_OK, "status %s",
              lucid_status_name(s));
        lucid_ctx_release(cpu);
    }

    static const int BAD_FORK[2] = {0, 4};
    for (int i = 0; i < 2; i++) {
        lucid_ctx_clear_error(ctx);
        f = 7;
        s = lucid_ctx_branch_fork(ctx, BAD_FORK[i], &f);
        CHECK(NAME("%s: branch_fork(%d) is ERR_ARG with a message, forked 0", pre, BAD_FORK[i]),
              s == LUCID_ERR_ARG && has_msg(ctx) && f == 0, "status %s forked %d message \"%s\"",
              lucid_status_name(s), f, lucid_ctx_error(ctx));
    }
    static const int BAD_JOIN[3] = {0, 4, 7};
    for (int i = 0; i < 3; i++) {
        lucid_ctx_clear_error(ctx);
        s = lucid_ctx_branch_join(ctx, BAD_JOIN[i]);
        CHECK(NAME("%s: branch_join(%d) is ERR_ARG with a message", pre, BAD_JOIN[i]),
              s == LUCID_ERR_ARG && has_msg(ctx), "status %s message \"%s\"",
              lucid_status_name(s), lucid_ctx_error(ctx));
    }
    lucid_ctx_clear_error(ctx);

    /* a return with nothing open does nothing */
    lucid_ctx_branch_return(ctx);
    s = lucid_ctx_branch_join(ctx, -1);
    CHECK(NAME("%s: return with no fork open, then join(-1): ok", pre), s == LUCID_OK,
          "%s: %s", lucid_status_name(s), lucid_ctx_error(ctx));

    /* an open lane: join refused, a second fork inline */
    f = 7;
    s = lucid_ctx_branch_fork(ctx, 2, &f);
    CHECK(NAME("%s: branch_fork(2) ok, forked %d", pre, g_branch_on),
          s == LUCID_OK && f == g_branch_on, "status %s forked %d: %s", lucid_status_name(s), f,
          lucid_ctx_error(ctx));
    if (s == LUCID_OK && f) {
        int f2 = 7;
        lucid_status s2 = lucid_ctx_branch_fork(ctx, 2, &f2);
        CHECK(NAME("%s: second fork of open lane 2: ok, forked 0", pre),
              s2 == LUCID_OK && f2 == 0, "status %s forked %d", lucid_status_name(s2), f2);
        if (s2 == LUCID_OK && f2) lucid_ctx_branch_return(ctx);
        lucid_ctx_clear_error(ctx);
        s2 = lucid_ctx_branch_join(ctx, 2);
        CHECK(NAME("%s: branch_join(2) while its fork is open is ERR_STATE with a message", pre),
              s2 == LUCID_ERR_STATE && has_msg(ctx), "status %s message \"%s\"",
              lucid_status_name(s2), lucid_ctx_error(ctx));
        lucid_ctx_clear_error(ctx);
        lucid_ctx_branch_return(ctx);
        s2 = lucid_ctx_branch_join(ctx, 2);
        CHECK(NAME("%s: branch_join(2) after its return: ok", pre), s2 == LUCID_OK, "%s: %s",
              lucid_status_name(s2), lucid_ctx_error(ctx));
    }
}

/* ================================================================ nesting */

static void test_nesting(void) {
    const char *pre = "lane nesting";
    lucid_param_set *set = NULL;
    lucid_module *cv = NULL;
    lucid_tensor *x = NULL, *dy = NULL, *hg = NULL, *hdx = NULL;
    int64_t xs[4] = {2, 16, 12, 12}, ys[4] = {2, 24, 12, 12};
    int open = 0, lane = 0;
    lucid_tensor *y = NULL, *dx = NULL;
    RUN(NAME("%s: set", pre), lucid_param_set_create(ctx, &set));
    RUN(NAME("%s: conv", pre),
        lucid_module_conv2d_create(ctx, set, "n.conv", 16, 24, 3, 1, 1, 1, 1, 1, &cv));
    RUN(NAME("%s: materialize", pre), lucid_param_set_materialize(ctx, set, GPU, LUCID_F32));
    x = dev(hrand(LUCID_BF16, 4, xs, -1, 1));
    dy = dev(hrand(LUCID_BF16, 4, ys, -1, 1));
    if (!x || !dy) {
        TEST_FAIL(NAME("%s: inputs", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* reference: one stream */
    RUN(NAME("%s: zero_grad", pre), lucid_param_set_zero_grad(ctx, set));
    RUN(NAME("%s: forward", pre), lucid_module_forward1(ctx, cv, x, &y));
    RUN(NAME("%s: backward", pre), lucid_module_backward1(ctx, cv, x, dy, &dx));
    hg = host(lucid_param_set_flat_grads(set));
    hdx = host(dx);
    if (!hg || !hdx) {
        TEST_FAIL(NAME("%s: reference copy", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    /* the same backward inside branch 1, with lane 0 forked from lane 1 */
    RUN(NAME("%s: zero_grad 2", pre), lucid_param_set_zero_grad(ctx, set));
    RUN(NAME("%s: branch_fork(1)", pre), lucid_ctx_branch_fork(ctx, 1, &open));
    RUN(NAME("%s: grad lane on", pre), lucid_ctx_set_grad_lane(ctx, 1));
    lane = 1;
    RUN(NAME("%s: backward in branch 1, grad lane on", pre),
        lucid_module_backward1(ctx, cv, x, dy, &dx));
    if (open) {
        lucid_status s = lucid_ctx_branch_join(ctx, 1);
        CHECK(NAME("%s: after the module's inner fork returned, lane 1 is still open", pre),
              s == LUCID_ERR_STATE, "branch_join(1) gave %s", lucid_status_name(s));
        lucid_ctx_clear_error(ctx);
        lucid_ctx_branch_return(ctx);
        open = 0;
    }
    RUN(NAME("%s: branch_join(1)", pre), lucid_ctx_branch_join(ctx, 1));
    lane = 0;
    RUN(NAME("%s: grad lane off (joins)", pre), lucid_ctx_set_grad_lane(ctx, 0));
    cmp_bits(NAME("%s: gradients = one stream (bitwise)", pre), lucid_param_set_flat_grads(set),
             hg);
    cmp_bits(NAME("%s: grad input = one stream (bitwise)", pre), dx, hdx);
done:
    if (open) lucid_ctx_branch_return(ctx);
    if (lane) lucid_ctx_set_grad_lane(ctx, 0);
    lucid_ctx_clear_error(ctx);
    rel(x); rel(dy); rel(hg); rel(hdx);
    if (cv) lucid_module_release(cv);
    if (set) lucid_param_set_release(set);
}

/* ================================================================ grad lane */

#define NCONV 3

typedef struct conv_stack {
    lucid_param_set *set;
    lucid_module *m[NCONV];
    lucid_tensor *x, *dy;     /* device inputs */
    lucid_tensor *y, *dx[NCONV]; /* module-owned results of the last pass */
} conv_stack;

/* forward through the three convs, backward back: y = m2(m1(m0(x))) and the
 * grad inputs dx[i] of each module; parameter gradients accumulate. */
static lucid_status stack_pass(conv_stack *s) {
    lucid_tensor *a = NULL, *b = NULL;
    TRY(lucid_module_forward1(ctx, s->m[0], s->x, &a));
    TRY(lucid_module_forward1(ctx, s->m[1], a, &b));
    TRY(lucid_module_forward1(ctx, s->m[2], b, &s->y));
    TRY(lucid_module_backward1(ctx, s->m[2], b, s->dy, &s->dx[2]));
    TRY(lucid_module_backward1(ctx, s->m[1], a, s->dx[2], &s->dx[1]));
    return lucid_module_backward1(ctx, s->m[0], s->x, s->dx[1], &s->dx[0]);
}

/* host copies of y, dx[0..2] and the flat gradients (5 tensors) */
static int stack_snap(conv_stack *s, lucid_tensor **h) {
    h[0] = host(s->y);
    for (int i = 0; i < NCONV; i++) h[1 + i] = host(s->dx[i]);
    h[4] = host(lucid_param_set_flat_grads(s->set));
    for (int i = 0; i < 5; i++)
        if (!h[i]) return 0;
    return 1;
}

static void stack_cmp(const char *pre, const char *what, conv_stack *s, lucid_tensor **h,
                      int grads_only) {
    if (!grads_only) {
        cmp_bits(NAME("%s: %s: output = lane off (bitwise)", pre, what), s->y, h[0]);
        for (int i = 0; i < NCONV; i++)
            cmp_bits(NAME("%s: %s: grad input of conv %d = lane off (bitwise)", pre, what, i),
                     s->dx[i], h[1 + i]);
    }
    cmp_bits(NAME("%s: %s: gradients = lane off (bitwise)", pre, what),
             lucid_param_set_flat_grads(s->set), h[4]);
}

/* Capture body(arg) (the grad lane on inside when grad) and end it; join,
 * when given, runs inside the capture before its end (else capture_end
 * joins the lanes itself). The grad lane is off again afterwards. */
static lucid_status capture_run(lucid_status (*body)(void *), void *arg, int grad,
                                lucid_status (*join)(void), lucid_graph **g) {
    *g = NULL;
    TRY(lucid_ctx_synchronize(ctx));
    TRY(lucid_ctx_capture_begin(ctx));
    lucid_status st = grad ? lucid_ctx_set_grad_lane(ctx, 1) : LUCID_OK;
    if (!st) st = body(arg);
    if (!st && join) st = join();
    if (st) {
        lucid_ctx_capture_end(ctx, NULL);
        lucid_ctx_set_grad_lane(ctx, 0);
        return st;
    }
    st = lucid_ctx_capture_end(ctx, g);
    lucid_status s2 = lucid_ctx_set_grad_lane(ctx, 0);
    return st ? st : s2;
}

static lucid_status join_grad_lane(void) { return lucid_ctx_set_grad_lane(ctx, 0); }
static lucid_status stack_body(void *s) { return stack_pass((conv_stack *)s); }

/* Capture one pass with the grad lane on (join_inside: turned off inside the
 * capture; else left on until after capture_end, which joins it). */
static lucid_status stack_capture(conv_stack *s, int join_inside, lucid_graph **g) {
    return capture_run(stack_body, s, 1, join_inside ? join_grad_lane : NULL, g);
}

static void test_grad_lane(int route) {
    char pre[96];
    snprintf(pre, sizeof pre, "grad lane conv stack (1x1 route %s)",
             route == 2 ? "cuBLAS" : route == 1 ? "igemm" : "default");
    conv_stack s;
    memset(&s, 0, sizeof s);
    lucid_tensor *h1[5] = {0}, *h2[5] = {0};
    lucid_graph *g = NULL;
    int lane = 0;
    int prev_route = -1;
    int64_t xs[4] = {2, 16, 20, 20}, ys[4] = {2, 16, 20, 20};
    if (lucid_cuda_nn_set_conv1x1) prev_route = lucid_cuda_nn_set_conv1x1(ctx, route);
    RUN(NAME("%s: set", pre), lucid_param_set_create(ctx, &s.set));
    RUN(NAME("%s: conv 0", pre),
        lucid_module_conv2d_create(ctx, s.set, "s.0", 16, 32, 3, 1, 1, 1, 1, 0, &s.m[0]));
    RUN(NAME("%s: conv 1", pre),
        lucid_module_conv2d_create(ctx, s.set, "s.1", 32, 32, 1, 1, 0, 1, 1, 1, &s.m[1]));
    RUN(NAME("%s: conv 2", pre),
        lucid_module_conv2d_create(ctx, s.set, "s.2", 32, 16, 3, 1, 1, 1, 1, 1, &s.m[2]));
    RUN(NAME("%s: materialize", pre), lucid_param_set_materialize(ctx, s.set, GPU, LUCID_F32));
    s.x = dev(hrand(LUCID_BF16, 4, xs, -1, 1));
    s.dy = dev(hrand(LUCID_BF16, 4, ys, -1, 1));
    if (!s.x || !s.dy) {
        TEST_FAIL(NAME("%s: inputs", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* (a) lane off: one pass (h1), two passes accumulated (h2) */
    RUN(NAME("%s: zero_grad", pre), lucid_param_set_zero_grad(ctx, s.set));
    RUN(NAME("%s: pass, lane off", pre), stack_pass(&s));
    if (!stack_snap(&s, h1)) {
        TEST_FAIL(NAME("%s: copies", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }
    RUN(NAME("%s: second pass, lane off", pre), stack_pass(&s));
    if (!stack_snap(&s, h2)) {
        TEST_FAIL(NAME("%s: copies 2", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* (b) lane on, eager */
    RUN(NAME("%s: zero_grad b", pre), lucid_param_set_zero_grad(ctx, s.set));
    RUN(NAME("%s: grad lane on", pre), lucid_ctx_set_grad_lane(ctx, 1));
    lane = 1;
    CHECK(NAME("%s: lucid_ctx_grad_lane reads 1", pre), lucid_ctx_grad_lane(ctx) == 1,
          "reads %d", lucid_ctx_grad_lane(ctx));
    RUN(NAME("%s: pass, lane on", pre), stack_pass(&s));
    RUN(NAME("%s: grad lane off", pre), lucid_ctx_set_grad_lane(ctx, 0));
    lane = 0;
    stack_cmp(pre, "lane on", &s, h1, 0);
    RUN(NAME("%s: grad lane on again", pre), lucid_ctx_set_grad_lane(ctx, 1));
    lane = 1;
    RUN(NAME("%s: second pass, lane on", pre), stack_pass(&s));
    /* no set_grad_lane(0): the host copies synchronize, which joins */
    stack_cmp(pre, "lane on, two passes, joined by synchronize", &s, h2, 0);
    RUN(NAME("%s: grad lane off 2", pre), lucid_ctx_set_grad_lane(ctx, 0));
    lane = 0;

    /* (c) lane on inside a capture: turned off inside, replayed twice */
    RUN(NAME("%s: zero_grad c", pre), lucid_param_set_zero_grad(ctx, s.set));
    RUN(NAME("%s: capture, lane joined inside", pre), stack_capture(&s, 1, &g));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    stack_cmp(pre, "captured, one replay", &s, h1, 0);
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
    stack_cmp(pre, "captured, two replays", &s, h2, 0);
    lucid_graph_destroy(g);
    g = NULL;
    /* ... and left on at capture_end (which joins it) */
    RUN(NAME("%s: zero_grad c2", pre), lucid_param_set_zero_grad(ctx, s.set));
    RUN(NAME("%s: capture, lane joined by capture_end", pre), stack_capture(&s, 0, &g));
    RUN(NAME("%s: replay (capture_end joined)", pre), lucid_graph_launch(ctx, g));
    stack_cmp(pre, "captured (capture_end joined), one replay", &s, h1, 0);
done:
    if (lane) lucid_ctx_set_grad_lane(ctx, 0);
    lucid_ctx_clear_error(ctx);
    if (g) lucid_graph_destroy(g);
    if (prev_route >= 0) lucid_cuda_nn_set_conv1x1(ctx, prev_route);
    for (int i = 0; i < 5; i++) {
        rel(h1[i]);
        rel(h2[i]);
    }
    rel(s.x);
    rel(s.dy);
    for (int i = 0; i < NCONV; i++)
        if (s.m[i]) lucid_module_release(s.m[i]);
    if (s.set) lucid_param_set_release(s.set);
}

/* ================================================================ branches */

#define NB LUCID_BRANCHES

typedef struct towers {
    lucid_param_set *set;
    lucid_module *conv[NB], *bn[NB], *act[NB];
    lucid_tensor *x, *dy[NB];
    lucid_tensor *y[NB], *dx[NB]; /* module-owned */
} towers;

static lucid_status tower_pass(towers *t, int b) {
    lucid_tensor *c = NULL, *n = NULL, *g1 = NULL, *g2 = NULL;
    TRY(lucid_module_forward1(ctx, t->conv[b], t->x, &c));
    TRY(lucid_module_forward1(ctx, t->bn[b], c, &n));
    TRY(lucid_module_forward1(ctx, t->act[b], n, &t->y[b]));
    TRY(lucid_module_backward1(ctx, t->act[b], n, t->dy[b], &g2));
    TRY(lucid_module_backward1(ctx, t->bn[b], c, g2, &g1));
    return lucid_module_backward1(ctx, t->conv[b], t->x, g1, &t->dx[b]);
}

/* Every tower, tower b on branch lane b+1 when lanes (its fork always
 * returned, also on errors); *nforked counts the forks that forked. */
static lucid_status towers_run(towers *t, int lanes, int *nforked) {
    *nforked = 0;
    for (int b = 0; b < NB; b++) {
        int f = 0;
        if (lanes) TRY(lucid_ctx_branch_fork(ctx, b + 1, &f));
        lucid_status s = tower_pass(t, b);
        if (f) lucid_ctx_branch_return(ctx);
        *nforked += f;
        TRY(s);
    }
    return LUCID_OK;
}

/* host copies: y[0..2], dx[0..2], flat gradients (7 tensors) */
static int towers_snap(towers *t, lucid_tensor **h) {
    for (int b = 0; b < NB; b++) {
        h[b] = host(t->y[b]);
        h[NB + b] = host(t->dx[b]);
    }
    h[2 * NB] = host(lucid_param_set_flat_grads(t->set));
    for (int i = 0; i <= 2 * NB; i++)
        if (!h[i]) return 0;
    return 1;
}

static void towers_cmp(const char *pre, const char *what, towers *t, lucid_tensor **h) {
    for (int b = 0; b < NB; b++) {
        cmp_bits(NAME("%s: %s: output of tower %d = one stream (bitwise)", pre, what, b), t->y[b],
                 h[b]);
        cmp_bits(NAME("%s: %s: grad input of tower %d = one stream (bitwise)", pre, what, b),
                 t->dx[b], h[NB + b]);
    }
    cmp_bits(NAME("%s: %s: gradients = one stream (bitwise)", pre, what),
             lucid_param_set_flat_grads(t->set), h[2 * NB]);
}

static lucid_status join_branches(void) { return lucid_ctx_branch_join(ctx, -1); }
static lucid_status towers_body(void *t) {
    int nf = 0;
    return towers_run((towers *)t, 1, &nf);
}

/* Capture one run of the towers on the branch lanes (join: branch_join(-1)
 * before capture_end; grad: the grad lane on inside the branches). */
static lucid_status towers_capture(towers *t, int join, int grad, lucid_graph **g) {
    return capture_run(towers_body, t, grad, join ? join_branches : NULL, g);
}

static void test_branches(void) {
    const char *pre = "branch lanes";
    towers t;
    memset(&t, 0, sizeof t);
    lucid_tensor *h[2 * NB + 1] = {0};
    lucid_graph *g = NULL;
    int lane = 0, nf = 0;
    int64_t xs[4] = {2, 16, 24, 24};
    RUN(NAME("%s: set", pre), lucid_param_set_create(ctx, &t.set));
    for (int b = 0; b < NB; b++) {
        char p[32];
        snprintf(p, sizeof p, "t%d.conv", b);
        RUN(NAME("%s: conv %d", pre, b),
            lucid_module_conv2d_create(ctx, t.set, p, 16, 16, 3, 1, 1, 1, 1, b == 1, &t.conv[b]));
        snprintf(p, sizeof p, "t%d.bn", b);
        RUN(NAME("%s: bn %d", pre, b),
            lucid_module_batchnorm2d_create(ctx, t.set, p, 16, 1e-3, 0.03, &t.bn[b]));
        RUN(NAME("%s: silu %d", pre, b), lucid_module_silu_create(ctx, &t.act[b]));
    }
    RUN(NAME("%s: materialize", pre), lucid_param_set_materialize(ctx, t.set, GPU, LUCID_F32));
    t.x = dev(hrand(LUCID_BF16, 4, xs, -1, 1));
    for (int b = 0; b < NB; b++) t.dy[b] = dev(hrand(LUCID_BF16, 4, xs, -1, 1));
    if (!t.x || !t.dy[0] || !t.dy[1] || !t.dy[2]) {
        TEST_FAIL(NAME("%s: inputs", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* reference: one stream */
    RUN(NAME("%s: zero_grad", pre), lucid_param_set_zero_grad(ctx, t.set));
    RUN(NAME("%s: towers on one stream", pre), towers_run(&t, 0, &nf));
    if (!towers_snap(&t, h)) {
        TEST_FAIL(NAME("%s: copies", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    }

    /* eager, one tower per branch lane */
    RUN(NAME("%s: zero_grad lanes", pre), lucid_param_set_zero_grad(ctx, t.set));
    RUN(NAME("%s: towers on the branch lanes", pre), towers_run(&t, 1, &nf));
    CHECK(NAME("%s: %d forks forked", pre, g_branch_on ? NB : 0), nf == (g_branch_on ? NB : 0),
          "%d forked", nf);
    RUN(NAME("%s: branch_join(-1)", pre), lucid_ctx_branch_join(ctx, -1));
    towers_cmp(pre, "eager", &t, h);

    /* eager, with the grad lane nested in each branch */
    RUN(NAME("%s: zero_grad nested", pre), lucid_param_set_zero_grad(ctx, t.set));
    RUN(NAME("%s: grad lane on", pre), lucid_ctx_set_grad_lane(ctx, 1));
    lane = 1;
    RUN(NAME("%s: towers on the branch lanes, grad lane on", pre), towers_run(&t, 1, &nf));
    RUN(NAME("%s: branch_join(-1) nested", pre), lucid_ctx_branch_join(ctx, -1));
    RUN(NAME("%s: grad lane off", pre), lucid_ctx_set_grad_lane(ctx, 0));
    lane = 0;
    towers_cmp(pre, "eager, grad lane nested", &t, h);

    /* captured with branch_join */
    RUN(NAME("%s: zero_grad capture", pre), lucid_param_set_zero_grad(ctx, t.set));
    RUN(NAME("%s: capture with branch_join", pre), towers_capture(&t, 1, 0, &g));
    RUN(NAME("%s: replay", pre), lucid_graph_launch(ctx, g));
    towers_cmp(pre, "captured with join, replayed", &t, h);
    lucid_graph_destroy(g);
    g = NULL;

    /* captured without branch_join (capture_end joins), grad lane nested */
    RUN(NAME("%s: zero_grad capture 2", pre), lucid_param_set_zero_grad(ctx, t.set));
    RUN(NAME("%s: capture without branch_join (capture_end joins)", pre),
        towers_capture(&t, 0, 1, &g));
    RUN(NAME("%s: replay 2", pre), lucid_graph_launch(ctx, g));
    towers_cmp(pre, "captured without join, grad lane nested, replayed", &t, h);
done:
    if (lane) lucid_ctx_set_grad_lane(ctx, 0);
    lucid_ctx_clear_error(ctx);
    if (g) lucid_graph_destroy(g);
    for (int i = 0; i <= 2 * NB; i++) rel(h[i]);
    rel(t.x);
    for (int b = 0; b < NB; b++) {
        rel(t.dy[b]);
        if (t.conv[b]) lucid_module_release(t.conv[b]);
        if (t.bn[b]) lucid_module_release(t.bn[b]);
        if (t.act[b]) lucid_module_release(t.act[b]);
    }
    if (t.set) lucid_param_set_release(t.set);
}

/* ================================================================ joins */

#define JOIN_N ((int64_t)8 << 20) /* 32 MiB of f32 */
#define JOIN_ADDS 200

/* Every element of the host copy of t equals v (t copied without a
 * synchronize of its own: the copy is queued on the compute stream). */
static void check_all(const char *name, const lucid_tensor *t, double v) {
    lucid_tensor *h = NULL;
    if (lucid_tensor_to(ctx, t, CPU, LUCID_F32, &h) != LUCID_OK) {
        TEST_FAIL(name, "copy: %s", lucid_ctx_error(ctx));
        return;
    }
    const float *p = lucid_tensor_data(h);
    int64_t n = lucid_tensor_numel(h), bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (p[i] != (float)v) bad = i;
    if (bad >= 0) TEST_FAIL(name, "element %lld is %g, expected %g", (long long)bad, p[bad], v);
    else TEST_OK(name);
    lucid_tensor_release(h);
}

/* JOIN_ADDS dependent adds of 1 on t, queued on branch lane 3; no join. */
static lucid_status lane_adds(lucid_tensor *t) {
    int f = 0;
    TRY(lucid_fill(ctx, t, 0.0));
    TRY(lucid_ctx_branch_fork(ctx, 3, &f));
    lucid_status s = LUCID_OK;
    for (int i = 0; i < JOIN_ADDS && !s; i++)
        s = lucid_binary_scalar(ctx, LUCID_OP_ADD, t, t, 1.0, 0);
    if (f) lucid_ctx_branch_return(ctx);
    return s;
}

static void test_joins(void) {
    const char *pre = "lane joins";
    int64_t n[1] = {JOIN_N};
    lucid_tensor *t = NULL;
    lucid_event *ev = NULL;
    RUN(NAME("%s: tensor", pre), lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, n, &t));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: adds on lane 3", pre), lane_adds(t));
    RUN(NAME("%s: synchronize with lane work pending", pre), lucid_ctx_synchronize(ctx));
    check_all(NAME("%s: host read after synchronize sees all %d adds", pre, JOIN_ADDS), t,
              JOIN_ADDS);
    RUN(NAME("%s: event", pre), lucid_event_create(ctx, &ev));
    RUN(NAME("%s: adds on lane 3 again", pre), lane_adds(t));
    RUN(NAME("%s: event record with lane work pending", pre), lucid_event_record(ev));
    RUN(NAME("%s: event synchronize", pre), lucid_event_synchronize(ev));
    check_all(NAME("%s: host read after an event record sees all %d adds", pre, JOIN_ADDS), t,
              JOIN_ADDS);
done:
    lucid_ctx_clear_error(ctx);
    if (ev) lucid_event_destroy(ev);
    rel(t);
}

/* ================================================================ marks, guards */

/* Marks: a mark inside lane 3's fork after JOIN_ADDS adds, JOIN_ADDS more
 * after it; the compute stream waits for the mark and copies t: the copy
 * sees at least the first JOIN_ADDS (and at most all); a mark outside a
 * fork and a wait on an unmarked slot are no-ops; bad slots are ERR_ARG.
 * Guards: capture_begin with a fork open is ERR_STATE; a graph launched
 * while eager lane work is queued runs after it (launch joins first: the
 * graph's own add on the lane would otherwise race the eager adds). */
static void test_marks_and_guards(void) {
    const char *pre = "lane marks and guards";
    int64_t n[1] = {JOIN_N};
    lucid_tensor *t = NULL, *u = NULL, *h = NULL;
    lucid_graph *g = NULL;
    int f = 0;
    lucid_status s;
    RUN(NAME("%s: tensors", pre), lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, n, &t));
    RUN(NAME("%s: tensor u", pre), lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, n, &u));
    RUN(NAME("%s: fill", pre), lucid_fill(ctx, t, 0.0));
    RUN(NAME("%s: fork 3", pre), lucid_ctx_branch_fork(ctx, 3, &f));
    s = LUCID_OK;
    for (int i = 0; i < JOIN_ADDS && !s; i++) s = lucid_binary_scalar(ctx, LUCID_OP_ADD, t, t, 1.0, 0);
    if (!s) s = lucid_ctx_branch_mark(ctx, 3, 1);
    for (int i = 0; i < JOIN_ADDS && !s; i++) s = lucid_binary_scalar(ctx, LUCID_OP_ADD, t, t, 1.0, 0);
    if (f) lucid_ctx_branch_return(ctx);
    RUN(NAME("%s: adds and a mark on lane 3", pre), s);
    RUN(NAME("%s: wait for the mark", pre), lucid_ctx_branch_wait(ctx, 3, 1));
    RUN(NAME("%s: copy after the wait", pre), lucid_copy(ctx, u, t));
    RUN(NAME("%s: join", pre), lucid_ctx_branch_join(ctx, 3));
    RUN(NAME("%s: synchronize", pre), lucid_ctx_synchronize(ctx));
    check_all(NAME("%s: all %d adds after the join", pre, 2 * JOIN_ADDS), t, 2 * JOIN_ADDS);
    if (lucid_tensor_to(ctx, u, CPU, LUCID_F32, &h) != LUCID_OK) {
        TEST_FAIL(NAME("%s: copy u", pre), "%s", lucid_ctx_error(ctx));
        goto done;
    } else {
        const float *p = lucid_tensor_data(h);
        int64_t bad = -1;
        for (int64_t i = 0; i < n[0] && bad < 0; i++)
            if (p[i] < (float)JOIN_ADDS || p[i] > (float)(2 * JOIN_ADDS)) bad = i;
        CHECK(NAME("%s: the copy after the wait sees the %d adds before the mark", pre, JOIN_ADDS),
              bad < 0, "element %lld is %g", (long long)bad, bad < 0 ? 0.0 : p[bad]);
    }
    RUN(NAME("%s: mark outside a fork is a no-op", pre), lucid_ctx_branch_mark(ctx, 2, 2));
    RUN(NAME("%s: wait on an unmarked slot is a no-op", pre), lucid_ctx_branch_wait(ctx, 2, 2));
    s = lucid_ctx_branch_mark(ctx, 1, 5);
    CHECK(NAME("%s: mark slot 5 is ERR_ARG", pre), s == LUCID_ERR_ARG && has_msg(ctx), "status %s",
          lucid_status_name(s));
    lucid_ctx_clear_error(ctx);
    s = lucid_ctx_branch_wait(ctx, 0, 1);
    CHECK(NAME("%s: wait branch 0 is ERR_ARG", pre), s == LUCID_ERR_ARG && has_msg(ctx), "status %s",
          lucid_status_name(s));
    lucid_ctx_clear_error(ctx);

    /* capture_begin inside an open fork */
    RUN(NAME("%s: fork 2", pre), lucid_ctx_branch_fork(ctx, 2, &f));
    if (f) {
        s = lucid_ctx_capture_begin(ctx);
        CHECK(NAME("%s: capture_begin with a fork open is ERR_STATE with a message", pre),
              s == LUCID_ERR_STATE && has_msg(ctx), "status %s", lucid_status_name(s));
        if (s == LUCID_OK) lucid_ctx_capture_end(ctx, NULL);
        lucid_ctx_clear_error(ctx);
        lucid_ctx_branch_return(ctx);
    }
    RUN(NAME("%s: join 2", pre), lucid_ctx_branch_join(ctx, 2));

    /* a graph whose lane work would race eager lane work */
    RUN(NAME("%s: fill 0", pre), lucid_fill(ctx, t, 0.0));
    RUN(NAME("%s: synchronize 2", pre), lucid_ctx_synchronize(ctx));
    RUN(NAME("%s: capture_begin", pre), lucid_ctx_capture_begin(ctx));
    s = lucid_ctx_branch_fork(ctx, 3, &f);
    if (!s) s = lucid_binary_scalar(ctx, LUCID_OP_ADD, t, t, 1.0, 0);
    if (f) lucid_ctx_branch_return(ctx);
    if (s) {
        TEST_FAIL(NAME("%s: captured add on lane 3", pre), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(ctx));
        lucid_ctx_capture_end(ctx, NULL);
        goto done;
    }
    RUN(NAME("%s: capture_end (joins lane 3 itself)", pre), lucid_ctx_capture_end(ctx, &g));
    RUN(NAME("%s: eager adds on lane 3, not joined", pre), lane_adds(t));
    RUN(NAME("%s: graph launch", pre), lucid_graph_launch(ctx, g));
    RUN(NAME("%s: synchronize 3", pre), lucid_ctx_synchronize(ctx));
    check_all(NAME("%s: the graph's add ran after the %d eager adds", pre, JOIN_ADDS), t,
              JOIN_ADDS + 1);
done:
    lucid_ctx_clear_error(ctx);
    if (g) lucid_graph_destroy(g);
    if (h) lucid_tensor_release(h);
    rel(t);
    rel(u);
}

/* ================================================================ first fork */

static void test_first_fork_in_capture(void) {
    const char *pre = "lane first fork inside a capture";
    lucid_ctx *fresh = cuda_test_fresh_ctx(pre);
    if (!fresh) return;
    lucid_tensor *t = NULL, *h = NULL;
    lucid_graph *g = NULL;
    int64_t n[1] = {4096};
    int f = 7;
    lucid_status s = lucid_tensor_empty(fresh, GPU, LUCID_F32, 1, n, &t);
    if (!s) s = lucid_ctx_synchronize(fresh);
    if (!s) s = lucid_ctx_capture_begin(fresh);
    if (s) {
        TEST_FAIL(NAME("%s: setup", pre), "%s: %s", lucid_status_name(s), lucid_ctx_error(fresh));
        goto done;
    }
    s = lucid_ctx_branch_fork(fresh, 1, &f);
    CHECK(NAME("%s: ok, forked 0 (no lane resources yet)", pre), s == LUCID_OK && f == 0,
          "status %s forked %d: %s", lucid_status_name(s), f, lucid_ctx_error(fresh));
    if (s == LUCID_OK) s = lucid_fill(fresh, t, 3.0);
    if (f) lucid_ctx_branch_return(fresh);
    if (s) {
        TEST_FAIL(NAME("%s: fill while capturing", pre), "%s: %s", lucid_status_name(s),
                  lucid_ctx_error(fresh));
        lucid_ctx_capture_end(fresh, NULL);
        goto done;
    }
    s = lucid_ctx_capture_end(fresh, &g);
    CHECK(NAME("%s: capture_end ok", pre), s == LUCID_OK && g, "%s: %s", lucid_status_name(s),
          lucid_ctx_error(fresh));
    if (s || !g) goto done;
    s = lucid_graph_launch(fresh, g);
    if (!s) s = lucid_ctx_synchronize(fresh);
    if (!s) s = lucid_tensor_to(fresh, t, CPU, LUCID_F32, &h);
    if (s) {
        TEST_FAIL(NAME("%s: replay", pre), "%s: %s", lucid_status_name(s), lucid_ctx_error(fresh));
        goto done;
    }
    {
        const float *p = lucid_tensor_data(h);
        int ok = 1;
        for (int64_t i = 0; i < n[0]; i++) ok &= p[i] == 3.0f;
        CHECK(NAME("%s: replay ran the captured work", pre), ok, "values differ from 3");
    }
    f = 7;
    s = lucid_ctx_branch_fork(fresh, 1, &f);
    CHECK(NAME("%s: the next eager fork forks (%d)", pre, g_branch_on),
          s == LUCID_OK && f == g_branch_on, "status %s forked %d: %s", lucid_status_name(s), f,
          lucid_ctx_error(fresh));
    if (s == LUCID_OK && f) {
        lucid_ctx_branch_return(fresh);
        s = lucid_ctx_branch_join(fresh, 1);
        CHECK(NAME("%s: its join", pre), s == LUCID_OK, "%s: %s", lucid_status_name(s),
              lucid_ctx_error(fresh));
    }
done:
    if (g) lucid_graph_destroy(g);
    if (h) lucid_tensor_release(h);
    if (t) lucid_tensor_release(t);
    lucid_ctx_release(fresh);
}

/* ================================================================ main */

static const char *GROUPS[] = {"lane arguments", "lane nesting", "grad lane conv stack",
                               "branch lanes", "lane joins", "lane marks and guards",
                               "lane first fork inside a capture"};

int main(void) {
    if (cuda_test_no_device(GROUPS, sizeof GROUPS / sizeof GROUPS[0])) return 0;
    if (!cuda_test_ctx_create("test_lane_cuda")) return test_exit();
    g_branch_on = !env_is_zero("LUCID_BRANCH_LANES");
    g_grad_on = !env_is_zero("LUCID_GRAD_LANE");
    printf("# branch lanes %s, grad lane %s\n", g_branch_on ? "on" : "off (LUCID_BRANCH_LANES=0)",
           g_grad_on ? "on" : "off (LUCID_GRAD_LANE=0)");
    test_arguments();
    test_nesting();
    test_grad_lane(0);
    if (lucid_cuda_nn_set_conv1x1) test_grad_lane(2);
    test_branches();
    test_joins();
    test_marks_and_guards();
    test_first_fork_in_capture();
    return cuda_test_finish();
}
