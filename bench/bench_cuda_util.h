/*
 * bench_cuda_util.h — what the GPU benchmark programs of bench/ share: the
 * context, fatal errors, random device tensors, a float comparison for
 * medians.  Header-only (each bench_*.c is built alone by bench/run.sh);
 * the includer defines BENCH_NAME (its program name, for messages) first.
 */
#ifndef LUCID_BENCH_CUDA_UTIL_H
#define LUCID_BENCH_CUDA_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "nn/nn.h"

static lucid_ctx *ctx;
static const lucid_device GPU = {LUCID_CUDA, 0};

/* Prints "BENCH_NAME: what: <the context's last error>" and exits 1. */
static void die(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, what, lucid_ctx_error(ctx));
    exit(1);
}

/* A [a, b, c, d] tensor of dt on the GPU, uniform in [lo, hi) from
 * lucid_rand_uniform(seed, running offset): different values in every
 * tensor of a run, the same in every run. */
static lucid_tensor *mk_seeded(uint64_t seed, lucid_dtype dt, int64_t a, int64_t b, int64_t c,
                               int64_t d, double lo, double hi) {
    int64_t sh[4] = {a, b, c, d};
    static uint64_t off = 0;
    lucid_tensor *t;
    if (lucid_tensor_empty(ctx, GPU, dt, 4, sh, &t)) die("alloc");
    if (lucid_rand_uniform(ctx, t, seed, off, lo, hi)) die("rand");
    off += (uint64_t)lucid_tensor_numel(t);
    return t;
}

/* qsort comparison of floats, ascending */
static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* One conv's GPU tensors and parameters, and one pass of it: 0 forward (no
 * bias), 1 backward-data with beta 0, 2 backward-filter with beta 1 (dw
 * accumulates, as in a training step). */
typedef struct bufs {
    lucid_tensor *x, *w, *y, *dy, *dx, *dw;
    lucid_conv2d_params p;
} bufs;

static lucid_status run_pass(bufs *b, int pass) {
    switch (pass) {
    case 0: return lucid_nn_conv2d_forward(ctx, b->x, b->y, b->w, NULL, &b->p);
    case 1: return lucid_nn_conv2d_backward_input(ctx, b->x, b->dy, b->dx, b->w, &b->p, 0.0);
    default: return lucid_nn_conv2d_backward_params(ctx, b->x, b->dy, b->dw, NULL, &b->p, 1.0);
    }
}

#endif
