/*
 * test_cuda_util.h — helpers shared by the C tests that run an op on the
 * GPU and compare it with a host reference (test_nn_cuda.c,
 * test_nn_bnsilu_cuda.c; test_conv_dw_cuda.c uses the context part).
 *
 * Context: ctx on GPU 0 (cuda_test_ctx_create), a fresh one for capture
 * tests (cuda_test_enter_fresh / cuda_test_leave_fresh), the devices CPU and GPU,
 * the nn state hook of cuda/nn_table.cu, check names through NAME, and
 * cuda_test_finish at the end of main.
 * Inputs: host tensors drawn with the engine's Philox generator
 * (lucid_rand_uniform, seed g_seed from LUCID_TEST_SEED or the clock and
 * printed, every draw advancing the offset g_off), drawn in f32 and rounded
 * once to the dtype asked for.  Every constructor returns a tensor that the
 * caller releases, or NULL with the reason in ctx (NULL inputs give NULL).
 * Comparisons take a device tensor g and a host reference r, copy g back
 * (synchronised), print one ok / not ok line and release the copy; NaN
 * never passes.
 */
#ifndef LUCID_TEST_CUDA_UTIL_H
#define LUCID_TEST_CUDA_UTIL_H

#include "test.h"
#include "train/graph.h"

#include <stdint.h>
#include <time.h>

/* cuda/nn_table.cu test hook; absent (NULL) in a CPU-only build */
#if defined(__GNUC__)
__attribute__((weak))
#endif
void lucid_cuda_nn_state_destroy(lucid_ctx *ctx);

static const lucid_device CPU = {LUCID_CPU, 0};
static const lucid_device GPU = {LUCID_CUDA, 0};
static lucid_ctx *ctx;
static uint64_t g_seed, g_off;
static char nm[320];

/* A check name from a printf format (one buffer: use it before the next). */
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

/* Run a lucid call; on failure print "not ok name: STATUS: message" and go
 * to the calling function's done: label. */
#define RUN(name, expr)                                                       \
    do {                                                                      \
        lucid_status s_ = (expr);                                             \
        if (s_ != LUCID_OK) {                                                 \
            TEST_FAIL(name, "%s: %s", lucid_status_name(s_), lucid_ctx_error(ctx)); \
            goto done;                                                        \
        }                                                                     \
    } while (0)

/* ------------------------------------------------------------ context */

/* Without a CUDA device: one "skip <group>: no CUDA device" line per group
 * and 1 (main then exits 0); with one: 0. */
static inline int cuda_test_no_device(const char *const *groups, size_t ngroups) {
    if (lucid_cuda_available()) return 0;
    for (size_t i = 0; i < ngroups; i++) TEST_SKIP(groups[i], "no CUDA device");
    return 1;
}

/* g_seed from LUCID_TEST_SEED (else the clock), printed as "# <prog>: seed
 * N (LUCID_TEST_SEED to replay)", then ctx on GPU with that seed, checked
 * as "cuda context create".  1 when ctx is ready. */
static inline int cuda_test_ctx_create(const char *prog) {
    const char *env = getenv("LUCID_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("# %s: seed %llu (LUCID_TEST_SEED to replay)\n", prog,
           (unsigned long long)g_seed);
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    o.seed = g_seed;
    char err[512] = "";
    lucid_status st = lucid_ctx_create(&o, &ctx, err, sizeof err);
    if (st != LUCID_OK) {
        TEST_FAIL("cuda context create", "%s: %s", lucid_status_name(st), err);
        return 0;
    }
    TEST_OK("cuda context create");
    return 1;
}

/* A second context on GPU 0 with seed g_seed (for tests that need a fresh
 * nn state: no counters, no arena yet), or NULL after a "not ok <pre>:
 * context" line.  The caller releases it. */
static inline lucid_ctx *cuda_test_fresh_ctx(const char *pre) {
    lucid_ctx *fresh = NULL;
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    o.seed = g_seed;
    char err[512] = "";
    lucid_status st = lucid_ctx_create(&o, &fresh, err, sizeof err);
    if (st != LUCID_OK) {
        TEST_FAIL(NAME("%s: context", pre), "%s: %s", lucid_status_name(st), err);
        return NULL;
    }
    return fresh;
}

/* 1 when ctx can capture CUDA graphs; else one "skip <pre>: graphs not
 * available on this context" line and 0. */
static inline int cuda_test_graphs(const char *pre) {
    if (lucid_ctx_graphs_available(ctx)) return 1;
    TEST_SKIP(pre, "graphs not available on this context");
    return 0;
}

/* For capture tests that need a fresh nn state: when ctx can capture, a
 * fresh context (cuda_test_fresh_ctx) becomes ctx, so every helper works on
 * it, and the previous ctx goes to *prev; 0 (after its skip or not-ok line)
 * otherwise. The test ends with cuda_test_leave_fresh(prev). */
static inline int cuda_test_enter_fresh(const char *pre, lucid_ctx **prev) {
    if (!cuda_test_graphs(pre)) return 0;
    lucid_ctx *fresh = cuda_test_fresh_ctx(pre);
    if (!fresh) return 0;
    *prev = ctx;
    ctx = fresh;
    return 1;
}

/* Release the fresh context of cuda_test_enter_fresh and make prev ctx again. */
static inline void cuda_test_leave_fresh(lucid_ctx *prev) {
    lucid_ctx_release(ctx);
    ctx = prev;
}

/* End of main: the nn state (when linked) and ctx released; the exit
 * status. */
static inline int cuda_test_finish(void) {
    if (lucid_cuda_nn_state_destroy) lucid_cuda_nn_state_destroy(ctx);
    lucid_ctx_release(ctx);
    return test_exit();
}

/* ------------------------------------------------------------ tensors */

/* Host tensor of dtype dt, uniform in [lo, hi) (Philox in f32, rounded
 * once to dt). */
static inline lucid_tensor *hrand(lucid_dtype dt, int ndim, const int64_t *shape,
                                  double lo, double hi) {
    lucid_tensor *f = NULL, *o = NULL;
    if (lucid_tensor_empty(ctx, CPU, LUCID_F32, ndim, shape, &f) != LUCID_OK) return NULL;
    int64_t n = lucid_tensor_numel(f);
    if (lucid_rand_uniform(ctx, f, g_seed, g_off, lo, hi) != LUCID_OK) {
        lucid_tensor_release(f);
        return NULL;
    }
    g_off += (uint64_t)n;
    if (dt == LUCID_F32) return f;
    if (lucid_tensor_to(ctx, f, CPU, dt, &o) != LUCID_OK) o = NULL;
    lucid_tensor_release(f);
    return o;
}

/* Host tensor of zeros. */
static inline lucid_tensor *hzeros(lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_zeros(ctx, CPU, dt, ndim, shape, &t) != LUCID_OK) return NULL;
    return t;
}

/* Device copy of a host tensor. */
static inline lucid_tensor *dev(const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (!t || lucid_tensor_to(ctx, t, GPU, t->dtype, &o) != LUCID_OK) return NULL;
    return o;
}

/* Host copy of a device tensor, after synchronising the context. */
static inline lucid_tensor *host(const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (!t || lucid_ctx_synchronize(ctx) != LUCID_OK) return NULL;
    if (lucid_tensor_to(ctx, t, CPU, t->dtype, &o) != LUCID_OK) return NULL;
    return o;
}

/* Empty tensor on device d filled with NaN (poison: an element a kernel
 * forgets to write fails the comparison). */
static inline lucid_tensor *poison(lucid_device d, lucid_dtype dt, int ndim,
                                   const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx, d, dt, ndim, shape, &t) != LUCID_OK) return NULL;
    if (lucid_fill(ctx, t, NAN) != LUCID_OK) {
        lucid_tensor_release(t);
        return NULL;
    }
    return t;
}

/* poison on the GPU / on the host */
static inline lucid_tensor *dpoison(lucid_dtype dt, int ndim, const int64_t *shape) {
    return poison(GPU, dt, ndim, shape);
}
static inline lucid_tensor *hpoison(lucid_dtype dt, int ndim, const int64_t *shape) {
    return poison(CPU, dt, ndim, shape);
}

/* ------------------------------------------------------------ comparisons */

/* g copied back to the host for a comparison with r; NULL after a not-ok
 * line when the copy or r is missing. */
static inline lucid_tensor *copy_back(const char *name, const lucid_tensor *g,
                                      const lucid_tensor *r) {
    lucid_tensor *h = host(g);
    if (h && r) return h;
    TEST_FAIL(name, "copy back failed: %s", lucid_ctx_error(ctx));
    if (h) lucid_tensor_release(h);
    return NULL;
}

/* Relative Frobenius error of g against r <= tol. */
static inline void cmp_rel(const char *name, const lucid_tensor *g, const lucid_tensor *r,
                           double tol) {
    lucid_tensor *h = copy_back(name, g, r);
    if (!h) return;
    int64_t n = lucid_tensor_numel(r), bad = -1;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = test_hget(h, i), b = test_hget(r, i);
        if (!isfinite(a) || !isfinite(b)) {
            if (bad < 0) bad = i;
            continue;
        }
        num += (a - b) * (a - b);
        den += b * b;
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    if (bad >= 0)
        TEST_FAIL(name, "non-finite at %lld: gpu %g ref %g", (long long)bad,
                  test_hget(h, bad), test_hget(r, bad));
    else if (!(e <= tol))
        TEST_FAIL(name, "relative error %.3g > %.1g", e, tol);
    else
        TEST_OK(name);
    lucid_tensor_release(h);
}

/* bf16/f16: every element within maxulp ulp of r, or |g - r| <= absf *
 * max|r|. */
static inline void cmp_ulp(const char *name, const lucid_tensor *g, const lucid_tensor *r,
                           int64_t maxulp, double absf) {
    lucid_tensor *h = copy_back(name, g, r);
    if (!h) return;
    int64_t n = lucid_tensor_numel(r), nbad = 0, first = -1;
    double mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double b = fabs(test_hget(r, i));
        if (b > mx && isfinite(b)) mx = b;
    }
    const uint16_t *ha = lucid_tensor_data(h), *rb = lucid_tensor_data(r);
    for (int64_t i = 0; i < n; i++) {
        double a = test_hget(h, i), b = test_hget(r, i);
        int ok = isfinite(a) && isfinite(b) &&
                 (test_ulp16(ha[i], rb[i]) <= maxulp || fabs(a - b) <= absf * mx);
        if (!ok) {
            if (first < 0) first = i;
            nbad++;
        }
    }
    if (nbad)
        TEST_FAIL(name, "%lld of %lld elements off by > %lld ulp (first %lld: gpu %.8g "
                  "ref %.8g)",
                  (long long)nbad, (long long)n, (long long)maxulp, (long long)first,
                  test_hget(h, first), test_hget(r, first));
    else
        TEST_OK(name);
    lucid_tensor_release(h);
}

/* g and r bitwise equal (the same dtype and size). */
static inline void cmp_bits(const char *name, const lucid_tensor *g, const lucid_tensor *r) {
    lucid_tensor *h = copy_back(name, g, r);
    if (!h) return;
    const char *a = lucid_tensor_data(h), *b = lucid_tensor_data(r);
    if (memcmp(a, b, lucid_tensor_nbytes(r)) != 0) {
        size_t es = lucid_dtype_size(r->dtype);
        int64_t n = lucid_tensor_numel(r), i = 0;
        while (i < n && memcmp(a + i * es, b + i * es, es) == 0) i++;
        TEST_FAIL(name, "differs bitwise at %lld: gpu %.9g ref %.9g", (long long)i,
                  i < n ? test_hget(h, i) : 0.0, i < n ? test_hget(r, i) : 0.0);
    } else {
        TEST_OK(name);
    }
    lucid_tensor_release(h);
}

/* max|g - r| <= tol * max|r| (any float dtype). */
static inline void cmp_maxrel(const char *name, const lucid_tensor *g, const lucid_tensor *r,
                              double tol) {
    lucid_tensor *h = copy_back(name, g, r);
    if (!h) return;
    int64_t n = lucid_tensor_numel(r), worst = 0;
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = test_hget(h, i), b = test_hget(r, i), d = fabs(a - b);
        if (!isfinite(a) || !isfinite(b)) d = INFINITY;
        if (fabs(b) > mx) mx = fabs(b);
        if (!(d <= md)) md = d, worst = i;
    }
    if (!(md <= tol * mx))
        TEST_FAIL(name, "max diff %.3g at %lld (gpu %.8g ref %.8g) > %.2g * max|ref| %.3g", md,
                  (long long)worst, test_hget(h, worst), test_hget(r, worst), tol, mx);
    else
        TEST_OK(name);
    lucid_tensor_release(h);
}

#endif
