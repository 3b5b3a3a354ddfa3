/*
 * bench_nn_cpu.c — speed of the CPU nn kernels (engine/nn/) on f32 tensors.
 *
 * Part 1 ("layers"): the layer shapes of the nano pose network (YOLO11n-pose)
 * at batch 4 / imgsz 640, forward and backward, as a table of ms per call
 * and GFLOP/s (convolutions) or GB/s (memory-bound kernels; bytes = tensors
 * read + written once).
 * Part 2 ("net"): an end-to-end estimate of one forward + backward of the
 * whole network (every Conv+BN+SiLU, depthwise conv, plain conv, maxpool,
 * upsample, concat/split, add, attention softmax, DFL of YOLO11n-pose; the
 * attention matmuls and the loss are not counted) at batch 4 for imgsz 640
 * and 128: each distinct layer is timed and multiplied by its count.
 *
 *   build: make CUDA=0 build/libengine.a && gcc -O2 -Iengine \
 *            bench/bench_nn_cpu.c build/libengine.a -lopenblas -lpng -ljpeg \
 *            -lyaml -lcjson -lm -lpthread -o build/bench_nn_cpu
 *   run:   build/bench_nn_cpu [layers|net|net128|all] [threads (0 = default)]
 *          (BENCH_BUDGET=seconds per op measurement, default 0.25)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/nn.h"

static lucid_ctx *ctx;
static const lucid_device CPU = {LUCID_CPU, 0};
static int N_BATCH = 4;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_nn_cpu: %s: %s\n", what, lucid_ctx_error(ctx));
    exit(1);
}

static lucid_tensor *mk(lucid_dtype dt, int nd, int64_t a, int64_t b, int64_t c,
                        int64_t d, double lo, double hi) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t;
    if (lucid_tensor_zeros(ctx, CPU, dt, nd, sh, &t)) die("alloc");
    if (!lucid_dtype_is_float(dt)) return t;
    static uint64_t off = 0;
    if (lucid_rand_uniform(ctx, t, 1234, off, lo, hi)) die("rand");
    off += (uint64_t)lucid_tensor_numel(t);
    return t;
}
static lucid_tensor *mk4(int64_t a, int64_t b, int64_t c, int64_t d) {
    return mk(LUCID_F32, 4, a, b, c, d, -1, 1);
}
static lucid_tensor *mk1(int64_t a, double lo, double hi) {
    return mk(LUCID_F32, 1, a, 0, 0, 0, lo, hi);
}
static void rel(lucid_tensor *t) {
    if (t) lucid_tensor_release(t);
}

/* ---------------------------------------------------------------- timing */

typedef lucid_status (*op_fn)(void *);

/* best ms per call: one warm-up call, then repeat until >= budget s (at
 * least 2, at most 50 timed calls) and take the minimum */
static double time_op(op_fn f, void *a, double budget) {
    double t0 = now();
    if (f(a) != LUCID_OK) die("op");
    double first = now() - t0, best = first;
    if (first > 4 * budget) return first * 1e3; /* very slow: one sample */
    double start = now();
    for (int r = 0; r < 50; r++) {
        double t = now();
        if (f(a) != LUCID_OK) die("op");
        t = now() - t;
        if (t < best) best = t;
        if (r >= 1 && now() - start > budget) break;
    }
    return best * 1e3;
}

/* ----------------------------------------------------------------- ops */

typedef struct conv_b {
    lucid_tensor *x, *y, *w, *b, *dy, *dx, *dw, *db;
    lucid_conv2d_params p;
} conv_b;
static lucid_status conv_fwd(void *v) {
    conv_b *c = v;
    return lucid_nn_conv2d_forward(ctx, c->x, c->y, c->w, c->b, &c->p);
}
static lucid_status conv_bwi(void *v) {
    conv_b *c = v;
    return lucid_nn_conv2d_backward_input(ctx, c->x, c->dy, c->dx, c->w, &c->p, 0);
}
static lucid_status conv_bww(void *v) {
    conv_b *c = v;
    return lucid_nn_conv2d_backward_params(ctx, c->x, c->dy, c->dw, c->db, &c->p, 1);
}

static void conv_make(conv_b *c, int cin, int cout, int k, int s, int g, int64_t H,
                      int bias) {
    memset(c, 0, sizeof *c);
    int pad = k / 2;
    c->p = (lucid_conv2d_params){s, s, pad, pad, 1, 1, g};
    int64_t Ho = lucid_nn_conv_out_size(H, k, s, pad, 1);
    c->x = mk4(N_BATCH, cin, H, H);
    c->y = mk4(N_BATCH, cout, Ho, Ho);
    c->dy = mk4(N_BATCH, cout, Ho, Ho);
    c->dx = mk4(N_BATCH, cin, H, H);
    c->w = mk4(cout, cin / g, k, k);
    c->dw = mk4(cout, cin / g, k, k);
    if (bias) {
        c->b = mk1(cout, -1, 1);
        c->db = mk1(cout, -1, 1);
    }
}
static void conv_free(conv_b *c) {
    rel(c->x); rel(c->y); rel(c->w); rel(c->b);
    rel(c->dy); rel(c->dx); rel(c->dw); rel(c->db);
}
static double conv_flops(const conv_b *c) {
    return 2.0 * (double)lucid_tensor_numel(c->y) * (double)(c->w->shape[1] *
           c->w->shape[2] * c->w->shape[3]);
}

typedef struct bn_b {
    lucid_tensor *x, *y, *w, *b, *rm, *rv, *sm, *si, *dy, *dx, *dw, *db;
} bn_b;
static lucid_status bn_fwd(void *v) {
    bn_b *b = v;
    return lucid_nn_batchnorm2d_forward(ctx, b->x, b->y, b->w, b->b, b->rm, b->rv,
                                        NULL, b->sm, b->si, 1, 0.03, 1e-3);
}
static lucid_status bn_bwd(void *v) {
    bn_b *b = v;
    return lucid_nn_batchnorm2d_backward(ctx, b->x, b->dy, b->dx, b->w, b->sm, b->si,
                                         b->dw, b->db, 1, 0, 1);
}
static void bn_make(bn_b *b, int c, int64_t H) {
    b->x = mk4(N_BATCH, c, H, H); b->y = mk4(N_BATCH, c, H, H);
    b->dy = mk4(N_BATCH, c, H, H); b->dx = mk4(N_BATCH, c, H, H);
    b->w = mk1(c, 0.5, 1.5); b->b = mk1(c, -1, 1);
    b->rm = mk1(c, -1, 1); b->rv = mk1(c, 0.5, 2);
    b->sm = mk1(c, 0, 1); b->si = mk1(c, 0, 1);
    b->dw = mk1(c, 0, 1); b->db = mk1(c, 0, 1);
    if (bn_fwd(b)) die("bn");
}
static void bn_free(bn_b *b) {
    lucid_tensor *a[] = {b->x, b->y, b->w, b->b, b->rm, b->rv, b->sm, b->si,
                         b->dy, b->dx, b->dw, b->db};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) rel(a[i]);
}

typedef struct un_b {
    lucid_tensor *x, *y, *dy, *dx, *idx, *x2;
    lucid_pool2d_params pp;
    int arg;
} un_b;
static lucid_status silu_fwd(void *v) { un_b *u = v; return lucid_nn_silu_forward(ctx, u->x, u->y); }
static lucid_status silu_bwd(void *v) { un_b *u = v; return lucid_nn_silu_backward(ctx, u->x, u->dy, u->dx, 0); }
static lucid_status pool_fwd(void *v) { un_b *u = v; return lucid_nn_maxpool2d_forward(ctx, u->x, u->y, u->idx, &u->pp); }
static lucid_status pool_bwd(void *v) { un_b *u = v; return lucid_nn_maxpool2d_backward(ctx, u->x, u->dy, u->dx, u->idx, &u->pp, 0); }
static lucid_status up_fwd(void *v) { un_b *u = v; return lucid_nn_upsample_nearest2d_forward(ctx, u->x, u->y, u->arg); }
static lucid_status up_bwd(void *v) { un_b *u = v; return lucid_nn_upsample_nearest2d_backward(ctx, u->x, u->dy, u->dx, u->arg, 0); }
static lucid_status sm_fwd(void *v) { un_b *u = v; return lucid_nn_softmax_forward(ctx, u->x, u->y); }
static lucid_status sm_bwd(void *v) { un_b *u = v; return lucid_nn_softmax_backward(ctx, u->y, u->dy, u->dx, 0); }
static lucid_status dfl_fwd(void *v) { un_b *u = v; return lucid_nn_dfl_forward(ctx, u->x, u->y, u->arg); }
static lucid_status dfl_bwd(void *v) { un_b *u = v; return lucid_nn_dfl_backward(ctx, u->x, u->dy, u->dx, u->arg, 0); }
static lucid_status add_fwd(void *v) { un_b *u = v; return lucid_nn_add_forward(ctx, u->x, u->x2, u->y); }
/* concat forward of x (first half) and x2 (second half) into y */
static lucid_status cat_fwd(void *v) {
    un_b *u = v;
    int64_t c = u->x->shape[1];
    lucid_status st = lucid_nn_channel_copy(ctx, u->y, 0, u->x, 0, c, 0);
    if (st) return st;
    return lucid_nn_channel_copy(ctx, u->y, c, u->x2, 0, u->x2->shape[1], 0);
}
/* concat backward: slices of dy into dx (and dx2 = x2 reused), beta 0 */
static lucid_status cat_bwd(void *v) {
    un_b *u = v;
    int64_t c = u->x->shape[1];
    lucid_status st = lucid_nn_channel_copy(ctx, u->dx, 0, u->dy, 0, c, 0);
    if (st) return st;
    return lucid_nn_channel_copy(ctx, u->x2, 0, u->dy, c, u->x2->shape[1], 0);
}
static void un_free(un_b *u) {
    rel(u->x); rel(u->y); rel(u->dy); rel(u->dx); rel(u->idx); rel(u->x2);
}
static double nbytes(const lucid_tensor *t) { return t ? (double)lucid_tensor_nbytes(t) : 0; }

/* ------------------------------------------------------------ part 1 */

static void row_conv(const char *name, int cin, int cout, int k, int s, int g,
                     int64_t H, double budget) {
    conv_b c;
    conv_make(&c, cin, cout, k, s, g, H, 0);
    double fl = conv_flops(&c);
    double t1 = time_op(conv_fwd, &c, budget);
    double t2 = time_op(conv_bwi, &c, budget);
    double t3 = time_op(conv_bww, &c, budget);
    printf("%-34s %9.2f %7.1f | %9.2f %7.1f | %9.2f %7.1f   GFLOP/s\n", name, t1,
           fl / t1 * 1e-6, t2, fl / t2 * 1e-6, t3, fl / t3 * 1e-6);
    conv_free(&c);
}

static void row_mem(const char *name, op_fn f, op_fn b, void *a, double bf,
                    double bb, double budget) {
    double t1 = time_op(f, a, budget), t2 = b ? time_op(b, a, budget) : 0;
    printf("%-34s %9.2f %7.1f | %9.2f %7.1f |                     GB/s\n", name, t1,
           bf / t1 * 1e-6, t2, b ? bb / t2 * 1e-6 : 0.0);
}

static void part_layers(double budget) {
    printf("\n== layers, batch %d, f32 (ms per call; conv columns: fwd | bwd-input | "
           "bwd-weight)\n", N_BATCH);
    printf("%-34s %9s %7s | %9s %7s | %9s %7s\n", "layer", "ms", "rate", "ms", "rate",
           "ms", "rate");
    row_conv("conv 3->16 3x3 s2 @640", 3, 16, 3, 2, 1, 640, budget);
    row_conv("conv 16->32 3x3 s2 @320", 16, 32, 3, 2, 1, 320, budget);
    row_conv("conv 16->16 3x3 s1 @160 (C3k2)", 16, 16, 3, 1, 1, 160, budget);
    row_conv("conv 32->32 1x1 @160 (C3k2 cv1)", 32, 32, 1, 1, 1, 160, budget);
    row_conv("conv 64->64 1x1 @80", 64, 64, 1, 1, 1, 80, budget);
    row_conv("conv 64->64 3x3 s1 @40", 64, 64, 3, 1, 1, 40, budget);
    row_conv("conv 128->256 3x3 s2 @40", 128, 256, 3, 2, 1, 40, budget);
    row_conv("conv 256->256 1x1 @20", 256, 256, 1, 1, 1, 20, budget);
    row_conv("dwconv 3x3 64 @80", 64, 64, 3, 1, 64, 80, budget);
    row_conv("dwconv 3x3 128 @20 (PSA pe)", 128, 128, 3, 1, 128, 20, budget);

    printf("%-34s %9s %7s | %9s %7s |\n", "", "fwd ms", "GB/s", "bwd ms", "GB/s");
    {
        bn_b b;
        bn_make(&b, 32, 160);
        double t = nbytes(b.x);
        row_mem("batchnorm train 32x160^2", bn_fwd, bn_bwd, &b, 3 * t, 5 * t, budget);
        bn_free(&b);
    }
    {
        un_b u = {0};
        u.x = mk4(N_BATCH, 32, 160, 160); u.y = mk4(N_BATCH, 32, 160, 160);
        u.dy = mk4(N_BATCH, 32, 160, 160); u.dx = mk4(N_BATCH, 32, 160, 160);
        double t = nbytes(u.x);
        row_mem("silu 32x160^2", silu_fwd, silu_bwd, &u, 2 * t, 3 * t, budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.pp = (lucid_pool2d_params){5, 5, 1, 1, 2, 2};
        u.x = mk4(N_BATCH, 256, 20, 20); u.y = mk4(N_BATCH, 256, 20, 20);
        u.dy = mk4(N_BATCH, 256, 20, 20); u.dx = mk4(N_BATCH, 256, 20, 20);
        u.idx = mk(LUCID_I32, 4, N_BATCH, 256, 20, 20, 0, 1);
        double t = nbytes(u.x);
        row_mem("maxpool 5 s1 256x20^2 (+indices)", pool_fwd, pool_bwd, &u, 2.5 * t,
                2.5 * t, budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.arg = 2;
        u.x = mk4(N_BATCH, 128, 40, 40); u.y = mk4(N_BATCH, 128, 80, 80);
        u.dy = mk4(N_BATCH, 128, 80, 80); u.dx = mk4(N_BATCH, 128, 40, 40);
        double t = nbytes(u.y);
        row_mem("upsample x2 128x40^2", up_fwd, up_bwd, &u, 1.25 * t, 1.25 * t, budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.x = mk4(N_BATCH, 128, 80, 80); u.x2 = mk4(N_BATCH, 128, 80, 80);
        u.y = mk4(N_BATCH, 256, 80, 80); u.dy = mk4(N_BATCH, 256, 80, 80);
        u.dx = mk4(N_BATCH, 128, 80, 80);
        double t = nbytes(u.y);
        row_mem("concat 128+128 @80", cat_fwd, cat_bwd, &u, 2 * t, 2 * t, budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.x = mk4(N_BATCH, 32, 160, 160); u.x2 = mk4(N_BATCH, 32, 160, 160);
        u.y = mk4(N_BATCH, 32, 160, 160);
        double t = nbytes(u.y);
        row_mem("add 32x160^2", add_fwd, NULL, &u, 3 * t, 0, budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.x = mk(LUCID_F32, 3, N_BATCH * 2, 400, 400, 0, -3, 3);
        u.y = mk(LUCID_F32, 3, N_BATCH * 2, 400, 400, 0, 0, 1);
        u.dy = mk(LUCID_F32, 3, N_BATCH * 2, 400, 400, 0, -1, 1);
        u.dx = mk(LUCID_F32, 3, N_BATCH * 2, 400, 400, 0, -1, 1);
        double t = nbytes(u.x);
        row_mem("softmax [8,400,400] (PSA attn)", sm_fwd, sm_bwd, &u, 2 * t, 3 * t,
                budget);
        un_free(&u);
    }
    {
        un_b u = {0};
        u.arg = 16;
        u.x = mk(LUCID_F32, 3, N_BATCH, 64, 8400, 0, -3, 3);
        u.y = mk(LUCID_F32, 3, N_BATCH, 4, 8400, 0, 0, 1);
        u.dy = mk(LUCID_F32, 3, N_BATCH, 4, 8400, 0, -1, 1);
        u.dx = mk(LUCID_F32, 3, N_BATCH, 64, 8400, 0, -1, 1);
        double t = nbytes(u.x);
        row_mem("dfl [4,64,8400]", dfl_fwd, dfl_bwd, &u, 1.06 * t, 2.1 * t, budget);
        un_free(&u);
    }
}

/* ------------------------------------------------------------ part 2 */

/* One layer kind of YOLO11n-pose.  div: input H = imgsz / div. */
typedef enum { L_CONV, L_POOL, L_UP, L_CAT, L_ADD, L_SOFTMAX, L_DFL } lkind;
typedef struct net_layer {
    lkind kind;
    int cin, cout, k, s, g; /* conv: cout; cat: cin + cout channels */
    int div;
    int bn_act;  /* 1 Conv (BN+SiLU), 2 Conv with BN, no act, 0 plain conv */
    int first;   /* no grad input (the network's first layer) */
    int count;
} net_layer;

#define CONV(ci, co, k, s, div, n) {L_CONV, ci, co, k, s, 1, div, 1, 0, n}
#define CONVNA(ci, co, k, div, n) {L_CONV, ci, co, k, 1, 1, div, 2, 0, n}
#define PCONV(ci, co, div, n) {L_CONV, ci, co, 1, 1, 1, div, 0, 0, n}
#define DW(c, div, ba, n) {L_CONV, c, c, 3, 1, c, div, ba, 0, n}

static const net_layer NET[] = {
    /* backbone */
    {L_CONV, 3, 16, 3, 2, 1, 1, 1, 1, 1},      /* 0 */
    CONV(16, 32, 3, 2, 2, 1),                  /* 1 */
    CONV(32, 32, 1, 1, 4, 1), CONV(16, 16, 3, 1, 4, 2), CONV(48, 64, 1, 1, 4, 1),
    {L_ADD, 16, 0, 0, 0, 0, 4, 0, 0, 1}, {L_CAT, 16, 32, 0, 0, 0, 4, 0, 0, 1},
    CONV(64, 64, 3, 2, 4, 1),                  /* 3 */
    CONV(64, 64, 1, 1, 8, 1), CONV(32, 32, 3, 1, 8, 2), CONV(96, 128, 1, 1, 8, 1),
    {L_ADD, 32, 0, 0, 0, 0, 8, 0, 0, 1}, {L_CAT, 32, 64, 0, 0, 0, 8, 0, 0, 1},
    CONV(128, 128, 3, 2, 8, 1),                /* 5 */
    CONV(128, 128, 1, 1, 16, 1), CONV(64, 32, 1, 1, 16, 2), CONV(32, 32, 3, 1, 16, 4),
    CONV(64, 64, 1, 1, 16, 1), CONV(192, 128, 1, 1, 16, 1),
    {L_ADD, 32, 0, 0, 0, 0, 16, 0, 0, 2}, {L_CAT, 32, 32, 0, 0, 0, 16, 0, 0, 1},
    {L_CAT, 64, 128, 0, 0, 0, 16, 0, 0, 1},
    CONV(128, 256, 3, 2, 16, 1),               /* 7 */
    CONV(256, 256, 1, 1, 32, 1), CONV(128, 64, 1, 1, 32, 2), CONV(64, 64, 3, 1, 32, 4),
    CONV(128, 128, 1, 1, 32, 1), CONV(384, 256, 1, 1, 32, 1),
    {L_ADD, 64, 0, 0, 0, 0, 32, 0, 0, 2}, {L_CAT, 64, 64, 0, 0, 0, 32, 0, 0, 1},
    {L_CAT, 128, 256, 0, 0, 0, 32, 0, 0, 1},
    CONV(256, 128, 1, 1, 32, 1), {L_POOL, 128, 0, 5, 1, 0, 32, 0, 0, 3}, /* 9 SPPF */
    {L_CAT, 256, 256, 0, 0, 0, 32, 0, 0, 1}, CONV(512, 256, 1, 1, 32, 1),
    CONV(256, 256, 1, 1, 32, 1),               /* 10 C2PSA */
    CONVNA(128, 256, 1, 32, 1), DW(128, 32, 2, 1), CONVNA(128, 128, 1, 32, 1),
    {L_SOFTMAX, 2, 0, 0, 0, 0, 32, 0, 0, 1},
    CONV(128, 256, 1, 1, 32, 1), CONVNA(256, 128, 1, 32, 1),
    {L_ADD, 128, 0, 0, 0, 0, 32, 0, 0, 2}, {L_CAT, 128, 128, 0, 0, 0, 32, 0, 0, 1},
    CONV(256, 256, 1, 1, 32, 1),
    /* head */
    {L_UP, 256, 0, 0, 0, 0, 32, 0, 0, 1}, {L_CAT, 256, 128, 0, 0, 0, 16, 0, 0, 1},
    CONV(384, 128, 1, 1, 16, 1), CONV(64, 64, 3, 1, 16, 2), CONV(192, 128, 1, 1, 16, 1),
    {L_ADD, 64, 0, 0, 0, 0, 16, 0, 0, 1}, {L_CAT, 64, 128, 0, 0, 0, 16, 0, 0, 1},
    {L_UP, 128, 0, 0, 0, 0, 16, 0, 0, 1}, {L_CAT, 128, 128, 0, 0, 0, 8, 0, 0, 1},
    CONV(256, 64, 1, 1, 8, 1), CONV(32, 32, 3, 1, 8, 2), CONV(96, 64, 1, 1, 8, 1),
    {L_ADD, 32, 0, 0, 0, 0, 8, 0, 0, 1}, {L_CAT, 32, 64, 0, 0, 0, 8, 0, 0, 1},
    CONV(64, 64, 3, 2, 8, 1), {L_CAT, 64, 128, 0, 0, 0, 16, 0, 0, 1},
    CONV(192, 128, 1, 1, 16, 1), CONV(64, 64, 3, 1, 16, 2), CONV(192, 128, 1, 1, 16, 1),
    {L_ADD, 64, 0, 0, 0, 0, 16, 0, 0, 1}, {L_CAT, 64, 128, 0, 0, 0, 16, 0, 0, 1},
    CONV(128, 128, 3, 2, 16, 1), {L_CAT, 128, 256, 0, 0, 0, 32, 0, 0, 1},
    CONV(384, 256, 1, 1, 32, 1), CONV(128, 64, 1, 1, 32, 2), CONV(64, 64, 3, 1, 32, 4),
    CONV(128, 128, 1, 1, 32, 1), CONV(384, 256, 1, 1, 32, 1),
    {L_ADD, 64, 0, 0, 0, 0, 32, 0, 0, 2}, {L_CAT, 64, 64, 0, 0, 0, 32, 0, 0, 1},
    {L_CAT, 128, 256, 0, 0, 0, 32, 0, 0, 1},
    /* Pose head at P3 (x 64, /8), P4 (128, /16), P5 (256, /32):
     * cv2 Conv(x,64,3) Conv(64,64,3) Conv2d(64,64,1); cv3 DWConv(x) Conv(x,64,1)
     * DWConv(64) Conv(64,64,1) Conv2d(64,1,1); cv4 Conv(x,51,3) Conv(51,51,3)
     * Conv2d(51,51,1) */
    CONV(64, 64, 3, 1, 8, 2), PCONV(64, 64, 8, 1), DW(64, 8, 1, 2), CONV(64, 64, 1, 1, 8, 2),
    PCONV(64, 1, 8, 1), CONV(64, 51, 3, 1, 8, 1), CONV(51, 51, 3, 1, 8, 1), PCONV(51, 51, 8, 1),
    CONV(128, 64, 3, 1, 16, 1), CONV(64, 64, 3, 1, 16, 1), PCONV(64, 64, 16, 1),
    DW(128, 16, 1, 1), CONV(128, 64, 1, 1, 16, 1), DW(64, 16, 1, 1), CONV(64, 64, 1, 1, 16, 1),
    PCONV(64, 1, 16, 1), CONV(128, 51, 3, 1, 16, 1), CONV(51, 51, 3, 1, 16, 1),
    PCONV(51, 51, 16, 1),
    CONV(256, 64, 3, 1, 32, 1), CONV(64, 64, 3, 1, 32, 1), PCONV(64, 64, 32, 1),
    DW(256, 32, 1, 1), CONV(256, 64, 1, 1, 32, 1), DW(64, 32, 1, 1), CONV(64, 64, 1, 1, 32, 1),
    PCONV(64, 1, 32, 1), CONV(256, 51, 3, 1, 32, 1), CONV(51, 51, 3, 1, 32, 1),
    PCONV(51, 51, 32, 1),
    {L_DFL, 64, 0, 0, 0, 0, 8, 0, 0, 1},
};

enum { T_CONVF, T_CONVB, T_BN, T_SILU, T_OTHER, T_N };
static const char *TNAME[T_N] = {"conv fwd", "conv bwd", "batchnorm", "silu", "other"};

static void part_net(int imgsz, double budget) {
    double tot[T_N] = {0}, flops = 0;
    double t0 = now();
    for (size_t i = 0; i < sizeof NET / sizeof NET[0]; i++) {
        const net_layer *L = &NET[i];
        int64_t H = imgsz / L->div;
        double n = L->count;
        if (L->kind == L_CONV) {
            conv_b c;
            conv_make(&c, L->cin, L->cout, L->k, L->s, L->g, H, L->bn_act == 0);
            flops += 3 * conv_flops(&c) * n;
            tot[T_CONVF] += n * time_op(conv_fwd, &c, budget);
            if (!L->first) tot[T_CONVB] += n * time_op(conv_bwi, &c, budget);
            tot[T_CONVB] += n * time_op(conv_bww, &c, budget);
            if (L->bn_act) {
                int64_t Ho = c.y->shape[2];
                bn_b b;
                bn_make(&b, L->cout, Ho);
                tot[T_BN] += n * (time_op(bn_fwd, &b, budget) + time_op(bn_bwd, &b, budget));
                if (L->bn_act == 1) {
                    un_b u = {0};
                    u.x = b.x; u.y = b.y; u.dy = b.dy; u.dx = b.dx;
                    tot[T_SILU] += n * (time_op(silu_fwd, &u, budget) +
                                        time_op(silu_bwd, &u, budget));
                }
                bn_free(&b);
            }
            conv_free(&c);
            continue;
        }
        un_b u = {0};
        switch (L->kind) {
        case L_POOL:
            u.pp = (lucid_pool2d_params){L->k, L->k, 1, 1, L->k / 2, L->k / 2};
            u.x = mk4(N_BATCH, L->cin, H, H); u.y = mk4(N_BATCH, L->cin, H, H);
            u.dy = mk4(N_BATCH, L->cin, H, H); u.dx = mk4(N_BATCH, L->cin, H, H);
            u.idx = mk(LUCID_I32, 4, N_BATCH, L->cin, H, H, 0, 1);
            tot[T_OTHER] += n * (time_op(pool_fwd, &u, budget) + time_op(pool_bwd, &u, budget));
            break;
        case L_UP:
            u.arg = 2;
            u.x = mk4(N_BATCH, L->cin, H, H); u.y = mk4(N_BATCH, L->cin, 2 * H, 2 * H);
            u.dy = mk4(N_BATCH, L->cin, 2 * H, 2 * H); u.dx = mk4(N_BATCH, L->cin, H, H);
            tot[T_OTHER] += n * (time_op(up_fwd, &u, budget) + time_op(up_bwd, &u, budget));
            break;
        case L_CAT:
            u.x = mk4(N_BATCH, L->cin, H, H); u.x2 = mk4(N_BATCH, L->cout, H, H);
            u.y = mk4(N_BATCH, L->cin + L->cout, H, H);
            u.dy = mk4(N_BATCH, L->cin + L->cout, H, H); u.dx = mk4(N_BATCH, L->cin, H, H);
            tot[T_OTHER] += n * (time_op(cat_fwd, &u, budget) + time_op(cat_bwd, &u, budget));
            break;
        case L_ADD: /* forward add; backward = two channel copies */
            u.x = mk4(N_BATCH, L->cin, H, H); u.x2 = mk4(N_BATCH, L->cin, H, H);
            u.y = mk4(N_BATCH, L->cin, H, H);
            tot[T_OTHER] += n * 2 * time_op(add_fwd, &u, budget);
            break;
        case L_SOFTMAX: {
            int64_t T = H * H;
            u.x = mk(LUCID_F32, 3, N_BATCH * L->cin, T, T, 0, -3, 3);
            u.y = mk(LUCID_F32, 3, N_BATCH * L->cin, T, T, 0, 0, 1);
            u.dy = mk(LUCID_F32, 3, N_BATCH * L->cin, T, T, 0, -1, 1);
            u.dx = mk(LUCID_F32, 3, N_BATCH * L->cin, T, T, 0, -1, 1);
            tot[T_OTHER] += n * (time_op(sm_fwd, &u, budget) + time_op(sm_bwd, &u, budget));
            break;
        }
        case L_DFL: {
            int64_t A = H * H + (H / 2) * (H / 2) + (H / 4) * (H / 4);
            u.arg = 16;
            u.x = mk(LUCID_F32, 3, N_BATCH, 64, A, 0, -3, 3);
            u.y = mk(LUCID_F32, 3, N_BATCH, 4, A, 0, 0, 1);
            u.dy = mk(LUCID_F32, 3, N_BATCH, 4, A, 0, -1, 1);
            u.dx = mk(LUCID_F32, 3, N_BATCH, 64, A, 0, -1, 1);
            tot[T_OTHER] += n * (time_op(dfl_fwd, &u, budget) + time_op(dfl_bwd, &u, budget));
            break;
        }
        default: break;
        }
        un_free(&u);
    }
    double all = 0;
    for (int k = 0; k < T_N; k++) all += tot[k];
    printf("\n== net: YOLO11n-pose fwd+bwd, batch %d, imgsz %d (conv GFLOP fwd+bwd "
           "%.1f; bench wall %.0f s)\n", N_BATCH, imgsz, flops * 1e-9, now() - t0);
    for (int k = 0; k < T_N; k++)
        printf("  %-10s %10.1f ms  (%4.1f%%)\n", TNAME[k], tot[k], 100 * tot[k] / all);
    printf("  %-10s %10.1f ms  -> %.2f s per step, %.1f GFLOP/s on convs\n", "TOTAL",
           all, all * 1e-3, flops / ((tot[T_CONVF] + tot[T_CONVB]) * 1e-3) * 1e-9);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    lucid_ctx_options o = lucid_ctx_options_default();
    o.cpu_threads = argc > 2 ? atoi(argv[2]) : 0;
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err)) {
        fprintf(stderr, "bench_nn_cpu: %s\n", err);
        return 1;
    }
    double budget = getenv("BENCH_BUDGET") ? atof(getenv("BENCH_BUDGET")) : 0.25;
    printf("bench_nn_cpu: cpu_threads %d (0 = all online CPUs)\n", o.cpu_threads);
    if (!strcmp(what, "layers") || !strcmp(what, "all")) part_layers(budget);
    if (!strcmp(what, "net128")) part_net(128, budget);
    if (!strcmp(what, "net") || !strcmp(what, "all")) {
        part_net(640, budget);
        part_net(128, budget);
    }
    lucid_ctx_release(ctx);
    return 0;
}
