/*
 * test_optim_fixture.h — shared fixture of the optimizer C tests
 * (test_optim*.c): a small segment table with every kind of segment
 * (conv weight, norm weight, bias, head linear weight, a frozen weight, a
 * BN running-stat buffer and a gap), a deterministic LCG for data, and
 * helpers to wrap host arrays as CPU tensors.
 */
#ifndef LUCID_OPTIM_FIXTURE_H
#define LUCID_OPTIM_FIXTURE_H

#include "test.h"
#include "train/optim.h"

/* Layout: offsets chosen to leave a 3-element gap at [180, 183). */
#define FX_NSEG 6
#define FX_TOTAL 207
static const lucid_param_segment fx_segs[FX_NSEG] = {
    {"model.0.conv.weight", 0, 108, LUCID_KIND_WEIGHT, 4, {4, 3, 3, 3}, 1, 0},
    {"model.0.bn.weight", 108, 4, LUCID_KIND_NORM, 1, {4}, 1, 0},
    {"model.0.bn.bias", 112, 4, LUCID_KIND_BIAS, 1, {4}, 1, 0},
    {"model.23.cv3.weight", 116, 60, LUCID_KIND_WEIGHT, 2, {6, 10}, 1, 1},
    {"model.0.bn.running_mean", 176, 4, LUCID_KIND_NORM, 1, {4}, 0, 0},
    {"model.23.dfl.conv.weight", 183, 24, LUCID_KIND_WEIGHT, 4, {1, 24, 1, 1}, 0, 0},
};

static uint64_t fx_rng = 0x9E3779B97F4A7C15ull;
static inline double fx_uniform(void) { /* [0,1) */
    fx_rng = fx_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(fx_rng >> 11) * (1.0 / 9007199254740992.0);
}
static inline float fx_randn(void) {
    double u1 = fx_uniform() + 1e-12, u2 = fx_uniform();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static inline int fx_seg_of(int64_t i) {
    for (int s = 0; s < FX_NSEG; s++)
        if (i >= fx_segs[s].offset && i < fx_segs[s].offset + fx_segs[s].numel)
            return s;
    return -1;
}
static inline int fx_trainable(int64_t i) {
    int s = fx_seg_of(i);
    return s >= 0 && fx_segs[s].trainable;
}

static inline lucid_tensor *fx_tensor(lucid_ctx *ctx, lucid_dtype dt, int64_t n) {
    lucid_tensor *t = NULL;
    lucid_device cpu = {LUCID_CPU, 0};
    if (lucid_tensor_empty(ctx, cpu, dt, 1, &n, &t) != LUCID_OK) {
        printf("not ok fixture: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    memset(lucid_tensor_data(t), 0, (size_t)n * lucid_dtype_size(dt));
    return t;
}

static inline lucid_ctx *fx_ctx(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    lucid_ctx *ctx = NULL;
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        exit(1);
    }
    return ctx;
}

static inline lucid_param_layout *fx_layout(lucid_ctx *ctx, lucid_device dev) {
    lucid_param_layout *l = NULL;
    if (lucid_param_layout_create(ctx, dev, FX_TOTAL, fx_segs, FX_NSEG, &l) !=
        LUCID_OK) {
        printf("not ok layout: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    return l;
}

static inline float *fx_f(lucid_tensor *t) { return (float *)lucid_tensor_data(t); }

#endif
