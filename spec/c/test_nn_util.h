/*
 * test_nn_util.h — helpers shared by the nn C tests (test_nn.c,
 * test_nn_module.c): the CPU context, a seeded xorshift generator, tensor
 * construction and element access through the reference get/set, and the
 * float64 central-difference gradient check (step GC_H, bound GC_TOL on
 * max |numeric - analytic| / max(max |numeric|, 1e-3)).
 *
 * Define TEST_NN_SEED before including to pick the file's random stream.
 */
#ifndef LUCID_TEST_NN_UTIL_H
#define LUCID_TEST_NN_UTIL_H

#include "test.h"
#include "internal.h" /* lucid_cpu_get / lucid_cpu_set */
#include "nn/nn.h"
#include <stdint.h>

#ifndef TEST_NN_SEED
#define TEST_NN_SEED 0x9e3779b97f4a7c15ull
#endif

#define GC_H 1e-6
#define GC_TOL 1e-6

static lucid_ctx *ctx;
static const lucid_device CPU = {LUCID_CPU, 0};

/* ctx: a CPU context whose generator has this seed; exits 1 after a
 * "not ok context" line when it cannot be made. */
static inline void nn_ctx_open(uint64_t seed) {
    lucid_ctx_options o = lucid_ctx_options_default();
    o.seed = seed;
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        exit(1);
    }
}

static uint64_t rng_state = TEST_NN_SEED;
static inline double urand(double lo, double hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * ((double)(rng_state >> 11) * (1.0 / 9007199254740992.0));
}

static inline lucid_tensor *mk(lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx, CPU, dt, ndim, shape, &t) != LUCID_OK) {
        printf("not ok alloc: %s\n", lucid_ctx_error(ctx));
        exit(1);
    }
    return t;
}
static inline lucid_tensor *mk4(lucid_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t s[4] = {a, b, c, d};
    return mk(dt, 4, s);
}
static inline lucid_tensor *mk1(lucid_dtype dt, int64_t a) { return mk(dt, 1, &a); }

static inline double get(const lucid_tensor *t, int64_t i) { return lucid_cpu_get(t, i); }
static inline void set(lucid_tensor *t, int64_t i, double v) { lucid_cpu_set(t, i, v); }
static inline int64_t numel(const lucid_tensor *t) { return lucid_tensor_numel(t); }

static inline void fill_rand(lucid_tensor *t, double lo, double hi) {
    for (int64_t i = 0; i < numel(t); i++) set(t, i, urand(lo, hi));
}
static inline void fill_val(lucid_tensor *t, double v) {
    for (int64_t i = 0; i < numel(t); i++) set(t, i, v);
}
static inline lucid_tensor *like(const lucid_tensor *t, lucid_dtype dt) {
    return mk(dt, t->ndim, t->shape);
}
static inline double dot(const lucid_tensor *a, const lucid_tensor *b) {
    double s = 0;
    for (int64_t i = 0; i < numel(a); i++) s += get(a, i) * get(b, i);
    return s;
}

/* Release the n tensors of ts. */
static inline void rel(lucid_tensor **ts, int n) {
    for (int i = 0; i < n; i++) lucid_tensor_release(ts[i]);
}

/* A new tensor like t in dtype dt holding t's values (rounded once to dt). */
static inline lucid_tensor *conv_to(const lucid_tensor *t, lucid_dtype dt) {
    lucid_tensor *o = like(t, dt);
    for (int64_t i = 0; i < numel(t); i++) set(o, i, get(t, i));
    return o;
}

/* max |a| */
static inline double max_abs(const lucid_tensor *a) {
    double m = 0;
    for (int64_t i = 0; i < numel(a); i++)
        if (fabs(get(a, i)) > m) m = fabs(get(a, i));
    return m;
}

/* max |a - b| (+inf when any difference is NaN) */
static inline double max_abs_diff(const lucid_tensor *a, const lucid_tensor *b) {
    double m = 0;
    for (int64_t i = 0; i < numel(a); i++) {
        double d = fabs(get(a, i) - get(b, i));
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* Unit roundoff of the reduced-precision activation dtypes. */
#define U_BF16 (1.0 / 256.0)
#define U_F16 (1.0 / 2048.0)

/* A bf16/f16 result lo against the f32 result ref on the same values:
 * |lo - ref| <= u*|ref| + 1e-6 elementwise (one rounding of the output);
 * the failure names the worst element against its bound. */
static inline void check_lowp(const char *name, const lucid_tensor *lo,
                              const lucid_tensor *ref, double u) {
    double worst = 0;
    int64_t bad = -1;
    for (int64_t i = 0; i < numel(ref); i++) {
        double r = get(ref, i), d = fabs(get(lo, i) - r);
        double lim = u * fabs(r) + 1e-6;
        if (!(d <= lim) && (bad < 0 || d / lim > worst)) bad = i, worst = d / lim;
    }
    CHECK(name, bad < 0, "element %lld: %g vs f32 %g (%.2fx the bound)",
          (long long)bad, bad >= 0 ? get(lo, bad) : 0.0,
          bad >= 0 ? get(ref, bad) : 0.0, worst);
}

/* A scalar loss of the state; gradcheck perturbs var in place. */
typedef double (*loss_fn)(void *st);
static inline double gradcheck(loss_fn f, void *st, lucid_tensor *var,
                               const lucid_tensor *analytic) {
    double maxnum = 0, maxerr = 0;
    for (int64_t i = 0; i < numel(var); i++) {
        double v = get(var, i);
        set(var, i, v + GC_H);
        double lp = f(st);
        set(var, i, v - GC_H);
        double lm = f(st);
        set(var, i, v);
        double num = (lp - lm) / (2 * GC_H);
        double err = fabs(num - get(analytic, i));
        if (isnan(err)) return INFINITY;
        if (fabs(num) > maxnum) maxnum = fabs(num);
        if (err > maxerr) maxerr = err;
    }
    return maxerr / (maxnum > 1e-3 ? maxnum : 1e-3);
}

static inline void check_grad(const char *name, loss_fn f, void *st, lucid_tensor *var,
                              const lucid_tensor *analytic) {
    double e = gradcheck(f, st, var, analytic);
    CHECK(name, e < GC_TOL, "relative error %.3g >= %.0e", e, GC_TOL);
}

#endif
