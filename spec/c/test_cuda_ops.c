/*
 * test_cuda_ops.c — the CUDA backend against the CPU reference, through the
 * public API only.
 *
 * Every check draws fresh random inputs on the host (a xorshift generator
 * seeded from the clock; the seed is printed so a failure can be replayed
 * with LUCID_TEST_SEED=<seed>), runs the op on the CPU backend and on the
 * GPU, and compares. GPU outputs are poisoned with NaN first, so an element
 * a kernel forgot to write fails; NaN never passes a comparison unless the
 * check is about NaN propagation.
 *
 * Tolerances (per dtype, stated once here):
 *   elementwise f32        relative 1e-6; transcendental (exp, log, sigmoid,
 *                          silu, tanh, pow) 2e-6
 *   elementwise bf16/f16   exact bits where both sides round the same f32
 *                          value (add sub mul div max min neg abs sqrt relu
 *                          square, axpy, casts, fill); 1 ulp for the
 *                          transcendental ops
 *   reductions             f32 accumulation vs the CPU's f64: 1e-5 relative
 *                          (to sum|x| for signed sums); bf16/f16 outputs 1 ulp
 *   matmul                 relative Frobenius error: f32 1e-5, bf16 1e-2,
 *                          f16 5e-3
 *   random                 uniform bitwise equal; normal 1e-6 absolute (f32),
 *                          1 ulp (bf16/f16)
 *   vector paths           bitwise equal, every dtype (contiguous add, mul,
 *                          square, scalar mul, axpy; nn add, upsample,
 *                          same-dtype channel_copy); mixed-dtype
 *                          channel_copy 1 ulp / 1e-6 relative
 * Without a CUDA device every group prints "skip ...: no CUDA device" and the
 * program exits 0.
 */
#include "test.h"
#include "nn/nn.h"

#include <stdint.h>
#include <time.h>

static const lucid_device CPU = {LUCID_CPU, 0};
static lucid_device GPU = {LUCID_CUDA, 0};

/* ------------------------------------------------------------ host rng */

static uint64_t rng_s = 88172645463325252ull;

static uint64_t rng_u64(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}

static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }

/* Value domain of random inputs: uniform in [lo, hi]; with sign=1 the
 * magnitude is drawn in [lo, hi] and the sign is random. */
typedef struct dom { double lo, hi; int sign; } dom;

static const dom D_SIGNED = {0.25, 2.0, 1};   /* away from 0 */
static const dom D_POS = {0.1, 4.0, 0};
static const dom D_WIDE = {-4.0, 4.0, 0};
static const dom D_CAST = {-300.0, 300.0, 0};

static double draw(dom d) {
    double v = d.lo + (d.hi - d.lo) * rng_unit();
    if (d.sign && (rng_u64() & 1)) v = -v;
    return v;
}

/* ------------------------------------------------------------ host tensors */

static void hset(lucid_tensor *t, int64_t i, double v) {
    void *p = lucid_tensor_data(t);
    switch (t->dtype) {
    case LUCID_F32: ((float *)p)[i] = (float)v; break;
    case LUCID_F64: ((double *)p)[i] = v; break;
    case LUCID_BF16: ((uint16_t *)p)[i] = lucid_f32_to_bf16((float)v); break;
    case LUCID_F16: ((uint16_t *)p)[i] = lucid_f32_to_f16((float)v); break;
    case LUCID_U8: ((uint8_t *)p)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    case LUCID_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case LUCID_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: break;
    }
}

static uint16_t hbits16(const lucid_tensor *t, int64_t i) {
    return ((const uint16_t *)lucid_tensor_data(t))[i];
}

/* New contiguous host tensor of random values (drawn in f64, rounded once). */
static lucid_tensor *host_rand(lucid_ctx *ctx, lucid_dtype dt, int ndim,
                               const int64_t *shape, dom d) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx, CPU, dt, ndim, shape, &t) != LUCID_OK)
        return NULL;
    int64_t n = lucid_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) hset(t, i, draw(d));
    return t;
}

/* Contiguous copy on the device / back on the host (synchronized). */
static lucid_tensor *to_dev(lucid_ctx *ctx, const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (lucid_tensor_to(ctx, t, GPU, t->dtype, &o) != LUCID_OK) return NULL;
    return o;
}

static lucid_tensor *to_host(lucid_ctx *ctx, const lucid_tensor *t) {
    lucid_tensor *o = NULL;
    if (lucid_tensor_to(ctx, t, CPU, t->dtype, &o) != LUCID_OK) return NULL;
    if (lucid_ctx_synchronize(ctx) != LUCID_OK) {
        lucid_tensor_release(o);
        return NULL;
    }
    return o;
}

/* Empty device tensor poisoned with NaN (floats) or 0xAB.. bytes (ints). */
static lucid_tensor *dev_poisoned(lucid_ctx *ctx, lucid_dtype dt, int ndim,
                                  const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx, GPU, dt, ndim, shape, &t) != LUCID_OK)
        return NULL;
    if (lucid_fill(ctx, t, lucid_dtype_is_float(dt) ? NAN : 171.0) != LUCID_OK) {
        lucid_tensor_release(t);
        return NULL;
    }
    return t;
}

static void rel(lucid_tensor *t) { lucid_tensor_release(t); }

/* ------------------------------------------------------------ comparison */

/* Compare got (host, contiguous) with ref (host, contiguous, same numel).
 * Same 16-bit float dtype: at most `ulps` ulps apart (0 = equal bits).
 * Otherwise: |got - ref| <= tol * max(|ref|, scale), or <= tol when scale
 * is negative (absolute). Integers: equal.
 * NaN fails unless allow_nan and both are NaN. */
static int compare(const char *name, const lucid_tensor *ref,
                   const lucid_tensor *got, double tol, int ulps, double scale,
                   int allow_nan) {
    if (!ref || !got) {
        TEST_FAIL(name, "missing tensor (an earlier call failed)");
        return 0;
    }
    int64_t n = lucid_tensor_numel(ref);
    if (lucid_tensor_numel(got) != n) {
        TEST_FAIL(name, "numel %lld vs %lld", (long long)lucid_tensor_numel(got),
                  (long long)n);
        return 0;
    }
    int half = ref->dtype == got->dtype &&
               (ref->dtype == LUCID_BF16 || ref->dtype == LUCID_F16);
    int integer = !lucid_dtype_is_float(ref->dtype) && ref->dtype == got->dtype;
    double maxerr = 0;
    int64_t bad = -1, nbad = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = test_hget(ref, i), g = test_hget(got, i);
        int fail;
        double err;
        if (isnan(r) || isnan(g)) {
            fail = !(allow_nan && isnan(r) && isnan(g));
            err = fail ? INFINITY : 0;
        } else if (half) {
            err = (double)test_ulp16(hbits16(ref, i), hbits16(got, i));
            fail = err > ulps;
        } else if (integer) {
            err = fabs(g - r);
            fail = err != 0;
        } else {
            double den = scale < 0 ? 1.0 : fabs(r) > scale ? fabs(r) : scale;
            if (den < 1e-30) den = 1e-30;
            err = fabs(g - r) / den;
            if (isinf(r) || isinf(g)) err = (r == g) ? 0 : INFINITY;
            fail = err > tol;
        }
        if (err > maxerr) maxerr = err;
        if (fail) {
            if (bad < 0) bad = i;
            nbad++;
        }
    }
    if (bad >= 0) {
        TEST_FAIL(name,
                  "%lld of %lld elements off; first at %lld: gpu %.9g cpu %.9g "
                  "(max err %.3g, tol %s %g)",
                  (long long)nbad, (long long)n, (long long)bad,
                  test_hget(got, bad), test_hget(ref, bad), maxerr,
                  half ? "ulps" : "rel", half ? (double)ulps : tol);
        return 0;
    }
    TEST_OK(name);
    return 1;
}

/* Frobenius relative error ||got - ref|| / ||ref||. */
static void compare_frob(const char *name, const lucid_tensor *ref,
                         const lucid_tensor *got, double tol) {
    if (!ref || !got) {
        TEST_FAIL(name, "missing tensor (an earlier call failed)");
        return;
    }
    double num = 0, den = 0;
    int64_t n = lucid_tensor_numel(ref);
    for (int64_t i = 0; i < n; i++) {
        double r = test_hget(ref, i), g = test_hget(got, i);
        if (isnan(r) || isnan(g) || isinf(g)) {
            TEST_FAIL(name, "non-finite at %lld: gpu %g cpu %g", (long long)i, g,
                      r);
            return;
        }
        num += (g - r) * (g - r);
        den += r * r;
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(name, e <= tol, "relative Frobenius error %.3g > %g", e, tol);
}

#define FAILST(name)                                                          \
    TEST_FAIL(name, "%s: %s", lucid_status_name(lucid_ctx_last_status(ctx)),  \
              lucid_ctx_error(ctx))

static const lucid_dtype FLOATS[3] = {LUCID_F32, LUCID_BF16, LUCID_F16};

/* ------------------------------------------------------------ elementwise */

static const char *BIN_NAMES[] = {"add", "sub", "mul", "div", "max", "min", "pow"};
static const char *UN_NAMES[] = {"neg", "abs", "exp", "log", "sqrt",
                                 "sigmoid", "silu", "tanh", "relu", "square"};

static int bin_transcendental(int op) { return op == LUCID_OP_POW; }
static int un_transcendental(int op) {
    return op == LUCID_OP_EXP || op == LUCID_OP_LOG || op == LUCID_OP_SIGMOID ||
           op == LUCID_OP_SILU || op == LUCID_OP_TANH;
}

/* Compare host ref/got of a float dtype with the elementwise tolerances. */
static void compare_ew(const char *name, lucid_dtype dt, const lucid_tensor *ref,
                       const lucid_tensor *got, int transcendental) {
    (void)dt;
    compare(name, ref, got, transcendental ? 2e-6 : 1e-6, transcendental ? 1 : 0,
            0.0, 0);
}

/* variant 0: a [4,33,65] contiguous, b [33,1] broadcast;
 * variant 1: a a transposed view, b [4,33,65] contiguous. */
static void test_binary(lucid_ctx *ctx, lucid_dtype dt, int op, int variant) {
    char name[160];
    snprintf(name, sizeof name, "cuda binary %s %s %s", BIN_NAMES[op],
             lucid_dtype_name(dt), variant ? "strided" : "broadcast");
    int64_t shape[3] = {4, 33, 65}, tshape[3] = {4, 65, 33}, bshape[2] = {33, 1};
    dom da = op == LUCID_OP_POW ? D_POS : D_SIGNED;
    dom db = op == LUCID_OP_POW ? (dom){-2.0, 2.0, 0} : D_SIGNED;
    lucid_tensor *ah = NULL, *bh = NULL, *ag = NULL, *bg = NULL, *avh = NULL,
                 *avg = NULL, *oc = NULL, *og = NULL, *gh = NULL;
    if (variant == 0) {
        ah = host_rand(ctx, dt, 3, shape, da);
        bh = host_rand(ctx, dt, 2, bshape, db);
    } else {
        ah = host_rand(ctx, dt, 3, tshape, da);
        bh = host_rand(ctx, dt, 3, shape, db);
    }
    ag = ah ? to_dev(ctx, ah) : NULL;
    bg = bh ? to_dev(ctx, bh) : NULL;
    if (!ag || !bg) { FAILST(name); goto done; }
    if (variant == 1) {
        if (lucid_tensor_transpose(ctx, ah, 1, 2, &avh) != LUCID_OK ||
            lucid_tensor_transpose(ctx, ag, 1, 2, &avg) != LUCID_OK) {
            FAILST(name);
            goto done;
        }
    } else {
        lucid_tensor_retain(ah); avh = ah;
        lucid_tensor_retain(ag); avg = ag;
    }
    if (lucid_tensor_empty(ctx, CPU, dt, 3, shape, &oc) != LUCID_OK ||
        !(og = dev_poisoned(ctx, dt, 3, shape))) { FAILST(name); goto done; }
    if (lucid_binary(ctx, (lucid_binary_op)op, oc, avh, bh) != LUCID_OK) {
        FAILST(name); goto done;
    }
    if (lucid_binary(ctx, (lucid_binary_op)op, og, avg, bg) != LUCID_OK) {
        FAILST(name); goto done;
    }
    gh = to_host(ctx, og);
    if (!gh) { FAILST(name); goto done; }
    compare_ew(name, dt, oc, gh, bin_transcendental(op));
done:
    rel(ah); rel(bh); rel(ag); rel(bg); rel(avh); rel(avg); rel(oc); rel(og);
    rel(gh);
}

static void test_binary_scalar(lucid_ctx *ctx, lucid_dtype dt, int op,
                               int reverse) {
    char name[160];
    snprintf(name, sizeof name, "cuda binary_scalar %s%s %s", BIN_NAMES[op],
             reverse ? " reverse" : "", lucid_dtype_name(dt));
    int64_t shape[2] = {57, 129};
    double s = op == LUCID_OP_POW ? 1.5 : -0.75;
    dom da = op == LUCID_OP_POW ? D_POS : D_SIGNED;
    if (op == LUCID_OP_POW && reverse) { s = 1.5; da = D_WIDE; }
    lucid_tensor *ah = host_rand(ctx, dt, 2, shape, da), *ag = NULL, *oc = NULL,
                 *og = NULL, *gh = NULL;
    ag = ah ? to_dev(ctx, ah) : NULL;
    if (!ag || lucid_tensor_empty(ctx, CPU, dt, 2, shape, &oc) != LUCID_OK ||
        !(og = dev_poisoned(ctx, dt, 2, shape))) { FAILST(name); goto done; }
    if (lucid_binary_scalar(ctx, (lucid_binary_op)op, oc, ah, s, reverse) != LUCID_OK ||
        lucid_binary_scalar(ctx, (lucid_binary_op)op, og, ag, s, reverse) != LUCID_OK) {
        FAILST(name); goto done;
    }
    gh = to_host(ctx, og);
    if (!gh) { FAILST(name); goto done; }
    compare_ew(name, dt, oc, gh, bin_transcendental(op));
done:
    rel(ah); rel(ag); rel(oc); rel(og); rel(gh);
}

static void test_unary(lucid_ctx *ctx, lucid_dtype dt, int op) {
    char name[160];
    snprintf(name, sizeof name, "cuda unary %s %s", UN_NAMES[op],
             lucid_dtype_name(dt));
    int64_t shape[3] = {3, 41, 77};
    dom da = (op == LUCID_OP_LOG || op == LUCID_OP_SQRT) ? D_POS : D_WIDE;
    lucid_tensor *ah = host_rand(ctx, dt, 3, shape, da), *ag = NULL, *oc = NULL,
                 *og = NULL, *gh = NULL, *ahv = NULL, *agv = NULL;
    int64_t oshape[3] = {3, 77, 41};
    ag = ah ? to_dev(ctx, ah) : NULL;
    /* a strided input: the transposed view */
    if (!ag || lucid_tensor_transpose(ctx, ah, 1, 2, &ahv) != LUCID_OK ||
        lucid_tensor_transpose(ctx, ag, 1, 2, &agv) != LUCID_OK ||
        lucid_tensor_empty(ctx, CPU, dt, 3, oshape, &oc) != LUCID_OK ||
        !(og = dev_poisoned(ctx, dt, 3, oshape))) { FAILST(name); goto done; }
    if (lucid_unary(ctx, (lucid_unary_op)op, oc, ahv) != LUCID_OK ||
        lucid_unary(ctx, (lucid_unary_op)op, og, agv) != LUCID_OK) {
        FAILST(name); goto done;
    }
    gh = to_host(ctx, og);
    if (!gh) { FAILST(name); goto done; }
    compare_ew(name, dt, oc, gh, un_transcendental(op));
done:
    rel(ah); rel(ag); rel(oc); rel(og); rel(gh); rel(ahv); rel(agv);
}

static void test_unary_contig(lucid_ctx *ctx, lucid_dtype dt, int op) {
    char name[160];
    snprintf(name, sizeof name, "cuda unary %s %s contiguous", UN_NAMES[op],
             lucid_dtype_name(dt));
    int64_t shape[1] = {100003};
    dom da = (op == LUCID_OP_LOG || op == LUCID_OP_SQRT) ? D_POS : D_WIDE;
    lucid_tensor *ah = host_rand(ctx, dt, 1, shape, da), *ag = NULL, *oc = NULL,
                 *og = NULL, *gh = NULL;
    ag = ah ? to_dev(ctx, ah) : NULL;
    if (!ag || lucid_tensor_empty(ctx, CPU, dt, 1, shape, &oc) != LUCID_OK ||
        !(og = dev_poisoned(ctx, dt, 1, shape))) { FAILST(name); goto done; }
    if (lucid_unary(ctx, (lucid_unary_op)op, oc, ah) != LUCID_OK ||
        lucid_unary(ctx, (lucid_unary_op)op, og, ag) != LUCID_OK) {
        FAILST(name); goto done;
    }
    gh = to_host(ctx, og);
    if (!gh) { FAILST(name); goto done; }
    compare_ew(name, dt, oc, gh, un_transcendental(op));
done:
    rel(ah); rel(ag); rel(oc); rel(og); rel(gh);
}

static void test_axpy(lucid_ctx *ctx, lucid_dtype dt) {
    char name[160];
    snprintf(name, sizeof name, "cuda axpy %s", lucid_dtype_name(dt));
    int64_t shape[2] = {123, 77};
    lucid_tensor *xh = host_rand(ctx, dt, 2, shape, D_SIGNED);
    lucid_tensor *yh = host_rand(ctx, dt, 2, shape, D_SIGNED);
    lucid_tensor *xg = xh ? to_dev(ctx, xh) : NULL, *yg = yh ? to_dev(ctx, yh) : NULL;
    lucid_tensor *gh = NULL;
    if (!xg || !yg) { FAILST(name); goto done; }
    if (lucid_axpy(ctx, yh, -0.3, xh) != LUCID_OK ||
        lucid_axpy(ctx, yg, -0.3, xg) != LUCID_OK) { FAILST(name); goto done; }
    gh = to_host(ctx, yg);
    if (!gh) { FAILST(name); goto done; }
    compare_ew(name, dt, yh, gh, 0);
done:
    rel(xh); rel(yh); rel(xg); rel(yg); rel(gh);
}

/* ------------------------------------------------------------ fill / copy */

static void test_fill(lucid_ctx *ctx, lucid_dtype dt, double v) {
    char name[160];
    snprintf(name, sizeof name, "cuda fill %s %g (strided view)",
             lucid_dtype_name(dt), v);
    int64_t shape[2] = {6, 1001};
    lucid_tensor *hc = NULL, *gc = NULL, *hv = NULL, *gv = NULL, *gh = NULL;
    if (lucid_tensor_zeros(ctx, CPU, dt, 2, shape, &hc) != LUCID_OK ||
        lucid_tensor_zeros(ctx, GPU, dt, 2, shape, &gc) != LUCID_OK ||
        lucid_tensor_narrow(ctx, hc, 1, 3, 500, &hv) != LUCID_OK ||
        lucid_tensor_narrow(ctx, gc, 1, 3, 500, &gv) != LUCID_OK) {
        FAILST(name); goto done;
    }
    if (lucid_fill(ctx, hv, v) != LUCID_OK || lucid_fill(ctx, gv, v) != LUCID_OK) {
        FAILST(name); goto done;
    }
    gh = to_host(ctx, gc);
    compare(name, hc, gh, 0, 0, 0, 0);
done:
    rel(hc); rel(gc); rel(hv); rel(gv); rel(gh);
}

static const lucid_dtype CASTS[6] = {LUCID_F32, LUCID_BF16, LUCID_F16,
                                     LUCID_U8, LUCID_I32, LUCID_I64};

/* One cast sd -> dd in the three directions, plus strided views. */
static void test_cast(lucid_ctx *ctx, lucid_dtype sd, lucid_dtype dd) {
    char name[200];
    const char *sn = lucid_dtype_name(sd), *dn = lucid_dtype_name(dd);
    int64_t shape[2] = {37, 53}, tshape[2] = {53, 37};
    lucid_tensor *src = host_rand(ctx, sd, 2, shape, D_CAST);
    lucid_tensor *ref = NULL, *g = NULL, *gs = NULL, *gh = NULL, *h2 = NULL;
    lucid_tensor *srcT = NULL, *refT = NULL, *gT = NULL, *gsT = NULL;
    if (!src || lucid_tensor_empty(ctx, CPU, dd, 2, shape, &ref) != LUCID_OK ||
        lucid_copy(ctx, ref, src) != LUCID_OK) {
        snprintf(name, sizeof name, "cuda cast %s->%s (cpu reference)", sn, dn);
        FAILST(name); goto done;
    }
    /* host -> device with conversion */
    snprintf(name, sizeof name, "cuda copy host %s -> device %s", sn, dn);
    if (!(g = dev_poisoned(ctx, dd, 2, shape)) || lucid_copy(ctx, g, src) != LUCID_OK ||
        !(gh = to_host(ctx, g))) FAILST(name);
    else compare(name, ref, gh, 0, 0, 0, 0);
    rel(gh); gh = NULL;
    /* device -> device with conversion */
    snprintf(name, sizeof name, "cuda copy device %s -> device %s", sn, dn);
    rel(g); g = NULL;
    if (!(gs = to_dev(ctx, src)) || !(g = dev_poisoned(ctx, dd, 2, shape)) ||
        lucid_copy(ctx, g, gs) != LUCID_OK || !(gh = to_host(ctx, g))) FAILST(name);
    else compare(name, ref, gh, 0, 0, 0, 0);
    /* device -> host with conversion */
    snprintf(name, sizeof name, "cuda copy device %s -> host %s", sn, dn);
    if (!gs || lucid_tensor_empty(ctx, CPU, dd, 2, shape, &h2) != LUCID_OK ||
        lucid_fill(ctx, h2, NAN) != LUCID_OK || lucid_copy(ctx, h2, gs) != LUCID_OK ||
        lucid_ctx_synchronize(ctx) != LUCID_OK) FAILST(name);
    else compare(name, ref, h2, 0, 0, 0, 0);
    /* strided: host transposed view -> device, device transposed -> host */
    snprintf(name, sizeof name, "cuda copy host %s transposed -> device %s", sn, dn);
    rel(g); g = NULL; rel(gh); gh = NULL;
    if (lucid_tensor_transpose(ctx, src, 0, 1, &srcT) != LUCID_OK ||
        lucid_tensor_empty(ctx, CPU, dd, 2, tshape, &refT) != LUCID_OK ||
        lucid_copy(ctx, refT, srcT) != LUCID_OK ||
        !(g = dev_poisoned(ctx, dd, 2, tshape)) || lucid_copy(ctx, g, srcT) != LUCID_OK ||
        !(gh = to_host(ctx, g))) FAILST(name);
    else compare(name, refT, gh, 0, 0, 0, 0);
    snprintf(name, sizeof name, "cuda copy device %s transposed -> host %s", sn, dn);
    rel(h2); h2 = NULL;
    if (!gs || lucid_tensor_transpose(ctx, gs, 0, 1, &gsT) != LUCID_OK ||
        lucid_tensor_empty(ctx, CPU, dd, 2, tshape, &h2) != LUCID_OK ||
        lucid_copy(ctx, h2, gsT) != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK)
        FAILST(name);
    else compare(name, refT, h2, 0, 0, 0, 0);
    /* device -> host transposed view (staged unpack) */
    snprintf(name, sizeof name, "cuda copy device %s -> host %s transposed view", sn, dn);
    rel(h2); h2 = NULL;
    if (!gs || lucid_tensor_empty(ctx, CPU, dd, 2, tshape, &h2) != LUCID_OK ||
        lucid_tensor_transpose(ctx, h2, 0, 1, &gT) != LUCID_OK ||
        lucid_copy(ctx, gT, gs) != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK)
        FAILST(name);
    else compare(name, refT, h2, 0, 0, 0, 0);
done:
    rel(src); rel(ref); rel(g); rel(gs); rel(gh); rel(h2); rel(srcT); rel(refT);
    rel(gT); rel(gsT);
}

/* f64 exists only on the host: host f64 <-> device f32/bf16/f16. */
static void test_cast_f64(lucid_ctx *ctx, lucid_dtype dd) {
    char name[160];
    int64_t shape[1] = {4099};
    dom d = {-70000.0, 70000.0, 0}; /* f16 overflows to Inf for part of it */
    lucid_tensor *src = host_rand(ctx, LUCID_F64, 1, shape, d);
    lucid_tensor *ref = NULL, *g = NULL, *gh = NULL, *back = NULL, *backref = NULL;
    /* use values with more bits than f32 to exercise f64 -> bf16/f16 rounding */
    snprintf(name, sizeof name, "cuda copy host f64 -> device %s", lucid_dtype_name(dd));
    if (!src || lucid_tensor_empty(ctx, CPU, dd, 1, shape, &ref) != LUCID_OK ||
        lucid_copy(ctx, ref, src) != LUCID_OK ||
        !(g = dev_poisoned(ctx, dd, 1, shape)) || lucid_copy(ctx, g, src) != LUCID_OK ||
        !(gh = to_host(ctx, g))) { FAILST(name); goto done; }
    compare(name, ref, gh, 0, 0, 0, 0); /* Inf compared exactly */
    snprintf(name, sizeof name, "cuda copy device %s -> host f64", lucid_dtype_name(dd));
    if (lucid_tensor_empty(ctx, CPU, LUCID_F64, 1, shape, &back) != LUCID_OK ||
        lucid_tensor_empty(ctx, CPU, LUCID_F64, 1, shape, &backref) != LUCID_OK ||
        lucid_copy(ctx, back, g) != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK ||
        lucid_copy(ctx, backref, ref) != LUCID_OK) { FAILST(name); goto done; }
    compare(name, backref, back, 0, 0, 0, 0);
done:
    rel(src); rel(ref); rel(g); rel(gh); rel(back); rel(backref);
}

/* Pinned host memory: async copies both ways, complete after synchronize. */
static void test_pinned(lucid_ctx *ctx) {
    const char *name = "cuda copy through pinned host storage";
    int64_t shape[1] = {300001};
    size_t nb = (size_t)shape[0] * 4;
    lucid_storage *s = NULL;
    lucid_tensor *p = NULL, *src = host_rand(ctx, LUCID_F32, 1, shape, D_WIDE);
    lucid_tensor *g = NULL;
    if (!src || lucid_storage_create(ctx, CPU, nb, 1, &s) != LUCID_OK ||
        lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, shape, NULL, 0, &p) != LUCID_OK ||
        lucid_copy(ctx, p, src) != LUCID_OK) { FAILST(name); goto done; }
    /* pinned -> device is asynchronous: p may change only after a sync */
    if (lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, shape, &g) != LUCID_OK ||
        lucid_copy(ctx, g, p) != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK ||
        lucid_fill(ctx, p, NAN) != LUCID_OK) { FAILST(name); goto done; }
    /* device -> pinned is asynchronous too: complete after a sync */
    if (lucid_copy(ctx, p, g) != LUCID_OK || lucid_ctx_synchronize(ctx) != LUCID_OK) {
        FAILST(name); goto done;
    }
    compare(name, src, p, 0, 0, 0, 0);
done:
    rel(p); rel(src); rel(g);
    lucid_storage_release(s);
}

/* ------------------------------------------------------------ reductions */

static const char *RED_NAMES[] = {"sum", "mean", "max", "min", "norm2", "sumsq"};

static double sum_abs(const lucid_tensor *t, int op) {
    double s = 0;
    int64_t n = lucid_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = test_hget(t, i);
        s += (op == LUCID_REDUCE_SUMSQ || op == LUCID_REDUCE_NORM2) ? v * v : fabs(v);
    }
    if (op == LUCID_REDUCE_MEAN) s /= (double)(n ? n : 1);
    if (op == LUCID_REDUCE_NORM2) s = sqrt(s);
    return s;
}

static void test_reduce_all(lucid_ctx *ctx, lucid_dtype dt, int op, int64_t n,
                            int strided) {
    char name[160];
    snprintf(name, sizeof name, "cuda reduce_all %s %s n=%lld%s", RED_NAMES[op],
             lucid_dtype_name(dt), (long long)n, strided ? " strided" : "");
    int64_t shape[2] = {n / 7, 7}, tshape[2] = {7, n / 7};
    int64_t flat[1] = {n};
    lucid_tensor *ah = strided ? host_rand(ctx, dt, 2, tshape, D_WIDE)
                               : host_rand(ctx, dt, 1, flat, D_WIDE);
    lucid_tensor *ag = NULL, *av = NULL, *ahv = NULL, *rc = NULL, *rg = NULL,
                 *rg2 = NULL, *h1 = NULL, *h2 = NULL;
    ag = ah ? to_dev(ctx, ah) : NULL;
    if (!ag) { FAILST(name); goto done; }
    if (strided) {
        if (lucid_tensor_transpose(ctx, ag, 0, 1, &av) != LUCID_OK ||
            lucid_tensor_transpose(ctx, ah, 0, 1, &ahv) != LUCID_OK) {
            FAILST(name); goto done;
        }
        (void)shape;
    } else {
        lucid_tensor_retain(ag); av = ag;
        lucid_tensor_retain(ah); ahv = ah;
    }
    if (lucid_tensor_empty(ctx, CPU, LUCID_F64, 0, NULL, &rc) != LUCID_OK ||
        !(rg = dev_poisoned(ctx, LUCID_F32, 0, NULL)) ||
        !(rg2 = dev_poisoned(ctx, LUCID_F32, 0, NULL)) ||
        lucid_reduce_all(ctx, (lucid_reduce_op)op, rc, ahv) != LUCID_OK ||
        lucid_reduce_all(ctx, (lucid_reduce_op)op, rg, av) != LUCID_OK ||
        lucid_reduce_all(ctx, (lucid_reduce_op)op, rg2, av) != LUCID_OK ||
        !(h1 = to_host(ctx, rg)) || !(h2 = to_host(ctx, rg2))) {
        FAILST(name); goto done;
    }
    /* sums of signed values are compared relative to sum|x| */
    compare(name, rc, h1, 1e-5, 0,
            (op == LUCID_REDUCE_MAX || op == LUCID_REDUCE_MIN) ? 0.0
                                                               : sum_abs(ahv, op),
            0);
    {
        char n2[200];
        snprintf(n2, sizeof n2, "%s deterministic", name);
        uint32_t b1, b2;
        memcpy(&b1, lucid_tensor_data(h1), 4);
        memcpy(&b2, lucid_tensor_data(h2), 4);
        CHECK(n2, b1 == b2, "two runs differ: %08x vs %08x", b1, b2);
    }
done:
    rel(ah); rel(ag); rel(av); rel(ahv); rel(rc); rel(rg); rel(rg2); rel(h1); rel(h2);
}

/* reduce_dim over each dim of `shape` (positive inputs: no cancellation),
 * out in dtype odt (f32 or the input dtype). */
static void test_reduce_dim(lucid_ctx *ctx, lucid_dtype dt, int op, int ndim,
                            const int64_t *shape, int dim, int keepdim) {
    char name[200], sh[64];
    int w = snprintf(sh, sizeof sh, "[");
    for (int i = 0; i < ndim; i++)
        w += snprintf(sh + w, sizeof sh - (size_t)w, "%s%lld", i ? "," : "",
                      (long long)shape[i]);
    snprintf(sh + w, sizeof sh - (size_t)w, "]");
    snprintf(name, sizeof name, "cuda reduce_dim %s %s %s dim=%d keepdim=%d",
             RED_NAMES[op], lucid_dtype_name(dt), sh, dim, keepdim);
    int64_t oshape[3];
    int ond = 0;
    for (int i = 0; i < ndim; i++) {
        if (i == dim) {
            if (keepdim) oshape[ond++] = 1;
        } else {
            oshape[ond++] = shape[i];
        }
    }
    lucid_tensor *ah = host_rand(ctx, dt, ndim, shape, D_POS);
    lucid_tensor *ag = ah ? to_dev(ctx, ah) : NULL;
    lucid_tensor *oc = NULL, *og = NULL, *gh = NULL;
    if (!ag || lucid_tensor_empty(ctx, CPU, dt, ond, oshape, &oc) != LUCID_OK ||
        !(og = dev_poisoned(ctx, dt, ond, oshape)) ||
        lucid_reduce_dim(ctx, (lucid_reduce_op)op, oc, ah, dim, keepdim) != LUCID_OK ||
        lucid_reduce_dim(ctx, (lucid_reduce_op)op, og, ag, dim, keepdim) != LUCID_OK ||
        !(gh = to_host(ctx, og))) { FAILST(name); goto done; }
    compare(name, oc, gh, 1e-5, 1, 0.0, 0);
done:
    rel(ah); rel(ag); rel(oc); rel(og); rel(gh);
}

static void test_reduce_nan(lucid_ctx *ctx, int op) {
    char name[160];
    snprintf(name, sizeof name, "cuda reduce_all %s propagates NaN", RED_NAMES[op]);
    int64_t shape[1] = {70001};
    lucid_tensor *ah = host_rand(ctx, LUCID_F32, 1, shape, D_WIDE);
    lucid_tensor *ag = NULL, *rg = NULL, *h = NULL, *rd = NULL, *hd = NULL;
    int64_t s2[2] = {7, 10000}, o2[1] = {7};
    if (!ah) { FAILST(name); goto done; }
    hset(ah, 31337, NAN);
    if (!(ag = to_dev(ctx, ah)) ||
        lucid_tensor_empty(ctx, GPU, LUCID_F32, 0, NULL, &rg) != LUCID_OK ||
        lucid_reduce_all(ctx, (lucid_reduce_op)op, rg, ag) != LUCID_OK ||
        !(h = to_host(ctx, rg))) { FAILST(name); goto done; }
    CHECK(name, isnan(test_hget(h, 0)), "got %g", test_hget(h, 0));
    /* reduce_dim: row 3 holds the NaN ([7,10000] view of 70000 elements) */
    snprintf(name, sizeof name, "cuda reduce_dim %s propagates NaN", RED_NAMES[op]);
    {
        lucid_tensor *v = NULL, *vv = NULL;
        if (lucid_tensor_narrow(ctx, ag, 0, 0, 70000, &v) != LUCID_OK ||
            lucid_tensor_view(ctx, v, 2, s2, &vv) != LUCID_OK ||
            lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, o2, &rd) != LUCID_OK ||
            lucid_reduce_dim(ctx, (lucid_reduce_op)op, rd, vv, 1, 0) != LUCID_OK ||
            !(hd = to_host(ctx, rd))) {
            FAILST(name);
        } else {
            int ok = isnan(test_hget(hd, 3));
            for (int i = 0; i < 7; i++)
                if (i != 3 && isnan(test_hget(hd, i))) ok = 0;
            CHECK(name, ok, "row 3 = %g (NaN expected), row 0 = %g", test_hget(hd, 3),
                  test_hget(hd, 0));
        }
        rel(v); rel(vv);
    }
done:
    rel(ah); rel(ag); rel(rg); rel(h); rel(rd); rel(hd);
}

/* ------------------------------------------------------------ matmul */

/* layout: 0 contiguous operands, 1 a is a transposed view (column-major),
 * 2 b's batch dims are not collapsible (forces the contiguous-copy path). */
static void test_matmul(lucid_ctx *ctx, lucid_dtype dt, int ta, int tb,
                        double beta, int layout) {
    char name[200];
    snprintf(name, sizeof name, "cuda matmul %s ta=%d tb=%d beta=%g layout=%s",
             lucid_dtype_name(dt), ta, tb, beta,
             layout == 0 ? "contiguous" : layout == 1 ? "a-transposed-view" : "b-permuted-batch");
    const int64_t B0 = 2, B1 = 3, M = 37, K = 61, N = 29;
    int64_t as[4] = {B0, B1, ta ? K : M, ta ? M : K};
    int64_t bs[4] = {B0, B1, tb ? N : K, tb ? K : N};
    int64_t os[4] = {B0, B1, M, N};
    double tol = dt == LUCID_F32 ? 1e-5 : dt == LUCID_BF16 ? 1e-2 : 5e-3;
    lucid_tensor *ah = NULL, *bh = NULL, *ch = NULL, *ag = NULL, *bg = NULL,
                 *cg = NULL, *gh = NULL, *avh = NULL, *avg = NULL, *bvh = NULL,
                 *bvg = NULL, *cpu_out = NULL;
    if (layout == 1) {
        /* a stored as [B0,B1,cols,rows] and viewed transposed */
        int64_t st[4] = {B0, B1, as[3], as[2]};
        ah = host_rand(ctx, dt, 4, st, D_SIGNED);
    } else {
        ah = host_rand(ctx, dt, 4, as, D_SIGNED);
    }
    if (layout == 2) {
        int64_t st[4] = {B1, B0, bs[2], bs[3]};
        bh = host_rand(ctx, dt, 4, st, D_SIGNED);
    } else {
        bh = host_rand(ctx, dt, 4, bs, D_SIGNED);
    }
    ch = host_rand(ctx, dt, 4, os, D_SIGNED);
    if (!ah || !bh || !ch || !(ag = to_dev(ctx, ah)) || !(bg = to_dev(ctx, bh))) {
        FAILST(name); goto done;
    }
    if (layout == 1) {
        if (lucid_tensor_transpose(ctx, ah, 2, 3, &avh) != LUCID_OK ||
            lucid_tensor_transpose(ctx, ag, 2, 3, &avg) != LUCID_OK) { FAILST(name); goto done; }
    } else {
        lucid_tensor_retain(ah); avh = ah; lucid_tensor_retain(ag); avg = ag;
    }
    if (layout == 2) {
        if (lucid_tensor_transpose(ctx, bh, 0, 1, &bvh) != LUCID_OK ||
            lucid_tensor_transpose(ctx, bg, 0, 1, &bvg) != LUCID_OK) { FAILST(name); goto done; }
    } else {
        lucid_tensor_retain(bh); bvh = bh; lucid_tensor_retain(bg); bvg = bg;
    }
    if (beta != 0) {
        if (!(cg = to_dev(ctx, ch))) { FAILST(name); goto done; }
    } else {
        if (!(cg = dev_poisoned(ctx, dt, 4, os)) ||
            lucid_fill(ctx, ch, NAN) != LUCID_OK) { FAILST(name); goto done; }
    }
    cpu_out = ch;
    if (lucid_matmul(ctx, cpu_out, avh, bvh, ta, tb, 0.7, beta) != LUCID_OK ||
        lucid_matmul(ctx, cg, avg, bvg, ta, tb, 0.7, beta) != LUCID_OK ||
        !(gh = to_host(ctx, cg))) { FAILST(name); goto done; }
    compare_frob(name, cpu_out, gh, tol);
done:
    rel(ah); rel(bh); rel(ch); rel(ag); rel(bg); rel(cg); rel(gh); rel(avh);
    rel(avg); rel(bvh); rel(bvg);
}

/* ------------------------------------------------------------ random */

static void test_random(lucid_ctx *ctx, lucid_dtype dt, int normal, int strided) {
    char name[160];
    snprintf(name, sizeof name, "cuda rand_%s %s%s", normal ? "normal" : "uniform",
             lucid_dtype_name(dt), strided ? " strided" : "");
    int64_t shape[2] = {301, 37}, tshape[2] = {37, 301};
    uint64_t seed = rng_u64(), off = rng_u64() >> 20;
    lucid_tensor *hc = NULL, *gc = NULL, *gv = NULL, *gh = NULL, *hv = NULL;
    if (lucid_tensor_empty(ctx, CPU, dt, 2, strided ? tshape : shape, &hc) != LUCID_OK ||
        !(gc = dev_poisoned(ctx, dt, 2, strided ? tshape : shape))) {
        FAILST(name); goto done;
    }
    if (strided) {
        if (lucid_tensor_transpose(ctx, gc, 0, 1, &gv) != LUCID_OK ||
            lucid_tensor_transpose(ctx, hc, 0, 1, &hv) != LUCID_OK) { FAILST(name); goto done; }
    } else {
        lucid_tensor_retain(gc); gv = gc; lucid_tensor_retain(hc); hv = hc;
    }
    lucid_status s1, s2;
    if (normal) {
        s1 = lucid_rand_normal(ctx, hv, seed, off, 0.5, 2.0);
        s2 = lucid_rand_normal(ctx, gv, seed, off, 0.5, 2.0);
    } else {
        s1 = lucid_rand_uniform(ctx, hv, seed, off, -2.0, 3.0);
        s2 = lucid_rand_uniform(ctx, gv, seed, off, -2.0, 3.0);
    }
    if (s1 != LUCID_OK || s2 != LUCID_OK || !(gh = to_host(ctx, gc))) {
        FAILST(name); goto done;
    }
    if (!normal) {
        compare(name, hc, gh, 0, 0, 0, 0); /* bitwise (f32: exact values) */
    } else if (dt == LUCID_F32) {
        compare(name, hc, gh, 1e-6, 1, -1.0, 0); /* 1e-6 absolute */
    } else {
        compare(name, hc, gh, 0, 1, 0, 0);
    }
done:
    rel(hc); rel(gc); rel(gv); rel(gh); rel(hv);
}

/* ------------------------------------------------------------ vector paths
 *
 * The contiguous kernels (cuda/elementwise.cu map_contig_kernel; nn add,
 * channel_copy and nearest upsample of cuda/nn_pointwise.cu) move 16-byte
 * vectors (V = 8 bf16/f16 or 4 f32) when every operand is suitably aligned,
 * with a scalar tail, and one element per thread otherwise. These checks
 * drive each route: lengths that are a multiple of V, with a tail, shorter
 * than V, long enough for several grid-stride steps, and operands placed
 * `skip` elements into their own allocation (skip 1: off every 16-byte
 * boundary, the scalar route). The ops are exact (copies, one f32 add or
 * mul rounded once, a fixed-order sum), so GPU and CPU agree bit for bit. */

/* A contiguous tensor of `shape` on dev whose element 0 lies `skip`
 * elements into a fresh storage of its own (skip 0: 16-byte aligned). */
static lucid_tensor *at_offset(lucid_ctx *ctx, lucid_device dev, lucid_dtype dt,
                               int ndim, const int64_t *shape, int64_t skip) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    lucid_storage *s = NULL;
    lucid_tensor *t = NULL;
    if (lucid_storage_create(ctx, dev, (size_t)(n + skip) * lucid_dtype_size(dt), 0,
                             &s) != LUCID_OK)
        return NULL;
    if (lucid_tensor_from_storage(ctx, s, dt, ndim, shape, NULL, skip, &t) != LUCID_OK)
        t = NULL;
    lucid_storage_release(s);
    return t;
}

/* Random host tensor at `skip` and its device twin at the same skip. */
static int rand_pair(lucid_ctx *ctx, lucid_dtype dt, int ndim, const int64_t *shape,
                     int64_t skip, dom d, lucid_tensor **h, lucid_tensor **g) {
    *h = at_offset(ctx, CPU, dt, ndim, shape, skip);
    *g = at_offset(ctx, GPU, dt, ndim, shape, skip);
    if (!*h || !*g) return 0;
    int64_t n = lucid_tensor_numel(*h);
    for (int64_t i = 0; i < n; i++) hset(*h, i, draw(d));
    return lucid_copy(ctx, *g, *h) == LUCID_OK;
}

/* An output pair at `skip`: host and device poisoned with NaN. */
static int nan_pair(lucid_ctx *ctx, lucid_dtype dt, int ndim, const int64_t *shape,
                    int64_t skip, lucid_tensor **h, lucid_tensor **g) {
    *h = at_offset(ctx, CPU, dt, ndim, shape, skip);
    *g = at_offset(ctx, GPU, dt, ndim, shape, skip);
    return *h && *g && lucid_fill(ctx, *h, NAN) == LUCID_OK &&
           lucid_fill(ctx, *g, NAN) == LUCID_OK;
}

/* ref and the device tensor g (copied back) hold the same bytes. */
static void compare_bits(const char *name, const lucid_tensor *ref,
                         lucid_ctx *ctx, const lucid_tensor *g) {
    lucid_tensor *got = g ? to_host(ctx, g) : NULL;
    if (!ref || !got) {
        TEST_FAIL(name, "missing tensor: %s", lucid_ctx_error(ctx));
        rel(got);
        return;
    }
    int64_t n = lucid_tensor_numel(ref);
    size_t es = lucid_dtype_size(ref->dtype);
    const char *r = lucid_tensor_data(ref), *q = lucid_tensor_data(got);
    if (lucid_tensor_numel(got) != n || got->dtype != ref->dtype) {
        TEST_FAIL(name, "shape or dtype differ");
    } else if (memcmp(r, q, (size_t)n * es) == 0) {
        TEST_OK(name);
    } else {
        int64_t first = -1, nbad = 0;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(r + (size_t)i * es, q + (size_t)i * es, es)) {
                if (first < 0) first = i;
                nbad++;
            }
        TEST_FAIL(name, "%lld of %lld elements differ in bits; first at %lld: gpu %.9g "
                  "cpu %.9g", (long long)nbad, (long long)n, (long long)first,
                  test_hget(got, first), test_hget(ref, first));
    }
    rel(got);
}

/* kinds of test_map_vec */
enum { MV_ADD, MV_MUL, MV_SQUARE, MV_SCALAR, MV_AXPY };
static const char *MV_NAMES[] = {"binary add", "binary mul", "unary square",
                                 "binary_scalar mul", "axpy"};

/* One contiguous map over n elements with out, a, b placed so, ao, bo
 * elements into their storages; inplace: out is a (axpy always is). */
static void test_map_vec(lucid_ctx *ctx, lucid_dtype dt, int kind, int64_t n,
                         int64_t so, int64_t ao, int64_t bo, int inplace) {
    char name[200];
    if (kind == MV_AXPY) inplace = 1;
    snprintf(name, sizeof name, "cuda vector %s %s n=%lld skip out/a/b %lld/%lld/%lld%s",
             MV_NAMES[kind], lucid_dtype_name(dt), (long long)n, (long long)so,
             (long long)ao, (long long)bo, inplace ? " in place" : "");
    lucid_tensor *ah = NULL, *ag = NULL, *bh = NULL, *bg = NULL, *oh = NULL, *og = NULL;
    if (!rand_pair(ctx, dt, 1, &n, ao, D_SIGNED, &ah, &ag) ||
        !rand_pair(ctx, dt, 1, &n, bo, D_SIGNED, &bh, &bg)) { FAILST(name); goto done; }
    if (inplace) {
        lucid_tensor_retain(ah); oh = ah;
        lucid_tensor_retain(ag); og = ag;
    } else if (!nan_pair(ctx, dt, 1, &n, so, &oh, &og)) { FAILST(name); goto done; }
    for (int side = 0; side < 2; side++) {
        lucid_tensor *o = side ? og : oh, *a = side ? ag : ah, *b = side ? bg : bh;
        lucid_status st = LUCID_OK;
        switch (kind) {
        case MV_ADD: st = lucid_binary(ctx, LUCID_OP_ADD, o, a, b); break;
        case MV_MUL: st = lucid_binary(ctx, LUCID_OP_MUL, o, a, b); break;
        case MV_SQUARE: st = lucid_unary(ctx, LUCID_OP_SQUARE, o, a); break;
        case MV_SCALAR: st = lucid_binary_scalar(ctx, LUCID_OP_MUL, o, a, -0.75, 0); break;
        default: st = lucid_axpy(ctx, a, -0.3, b); break;
        }
        if (st != LUCID_OK) { FAILST(name); goto done; }
    }
    compare_bits(name, oh, ctx, og);
done:
    rel(ah); rel(ag); rel(bh); rel(bg); rel(oh); rel(og);
}

/* nn add_forward over n elements at skip (y = a when alias). */
static void test_nn_add_vec(lucid_ctx *ctx, lucid_dtype dt, int64_t n, int64_t skip,
                            int alias) {
    char name[200];
    snprintf(name, sizeof name, "cuda vector nn add %s n=%lld skip %lld%s",
             lucid_dtype_name(dt), (long long)n, (long long)skip,
             alias ? " y = a" : "");
    lucid_tensor *ah = NULL, *ag = NULL, *bh = NULL, *bg = NULL, *yh = NULL, *yg = NULL;
    if (!rand_pair(ctx, dt, 1, &n, skip, D_SIGNED, &ah, &ag) ||
        !rand_pair(ctx, dt, 1, &n, skip, D_SIGNED, &bh, &bg)) { FAILST(name); goto done; }
    if (alias) {
        lucid_tensor_retain(ah); yh = ah;
        lucid_tensor_retain(ag); yg = ag;
    } else if (!nan_pair(ctx, dt, 1, &n, skip, &yh, &yg)) { FAILST(name); goto done; }
    if (lucid_nn_add_forward(ctx, ah, bh, yh) != LUCID_OK ||
        lucid_nn_add_forward(ctx, ag, bg, yg) != LUCID_OK) { FAILST(name); goto done; }
    compare_bits(name, yh, ctx, yg);
done:
    rel(ah); rel(ag); rel(bh); rel(bg); rel(yh); rel(yg);
}

/* Nearest upsample of x [N,C,H,W] by s, forward and backward (dx = beta*dx
 * + sum), every tensor placed skip elements into its storage. */
static void test_upsample_vec(lucid_ctx *ctx, lucid_dtype dt, int64_t N, int64_t C,
                              int64_t H, int64_t W, int s, int64_t skip, double beta) {
    char name[200];
    int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, H * s, W * s};
    lucid_tensor *xh = NULL, *xg = NULL, *yh = NULL, *yg = NULL, *dyh = NULL,
                 *dyg = NULL, *dxh = NULL, *dxg = NULL;
    snprintf(name, sizeof name, "cuda vector upsample x%d forward %s [%lld,%lld,%lld,%lld] skip %lld",
             s, lucid_dtype_name(dt), (long long)N, (long long)C, (long long)H,
             (long long)W, (long long)skip);
    if (!rand_pair(ctx, dt, 4, xs, skip, D_WIDE, &xh, &xg) ||
        !nan_pair(ctx, dt, 4, ys, skip, &yh, &yg) ||
        lucid_nn_upsample_nearest2d_forward(ctx, xh, yh, s) != LUCID_OK ||
        lucid_nn_upsample_nearest2d_forward(ctx, xg, yg, s) != LUCID_OK) {
        FAILST(name); goto done;
    }
    compare_bits(name, yh, ctx, yg);
    snprintf(name, sizeof name,
             "cuda vector upsample x%d backward %s [%lld,%lld,%lld,%lld] skip %lld beta %g",
             s, lucid_dtype_name(dt), (long long)N, (long long)C, (long long)H,
             (long long)W, (long long)skip, beta);
    if (!rand_pair(ctx, dt, 4, ys, skip, D_WIDE, &dyh, &dyg)) { FAILST(name); goto done; }
    if (beta != 0.0 ? !rand_pair(ctx, dt, 4, xs, skip, D_WIDE, &dxh, &dxg)
                    : !nan_pair(ctx, dt, 4, xs, skip, &dxh, &dxg)) {
        FAILST(name); goto done;
    }
    if (lucid_nn_upsample_nearest2d_backward(ctx, xh, dyh, dxh, s, beta) != LUCID_OK ||
        lucid_nn_upsample_nearest2d_backward(ctx, xg, dyg, dxg, s, beta) != LUCID_OK) {
        FAILST(name); goto done;
    }
    compare_bits(name, dxh, ctx, dxg);
done:
    rel(xh); rel(xg); rel(yh); rel(yg); rel(dyh); rel(dyg); rel(dxh); rel(dxg);
}

/* channel_copy dst[:, d0:d0+nch] = beta*dst + src[:, s0:s0+nch] with
 * dst [N,Cd,h,w] (placed skip elements into its storage), src [N,Cs,h,w];
 * kernel: LUCID_CHAN_COPY=kernel during the call, else =memcpy (beta 0, one
 * dtype: the vector kernel when aligned, or cudaMemcpy2DAsync). One dtype:
 * bitwise; mixed: 1 ulp (bf16/f16) or 1e-6 relative (f32), as the CPU
 * converts through f64. */
static void test_chan_copy_vec(lucid_ctx *ctx, lucid_dtype ddt, lucid_dtype sdt,
                               int64_t N, int64_t Cd, int64_t Cs, int64_t h, int64_t w,
                               int64_t d0, int64_t s0, int64_t nch, double beta,
                               int64_t skip, int kernel) {
    char name[240];
    snprintf(name, sizeof name,
             "cuda vector channel_copy %s <- %s N=%lld Cd=%lld Cs=%lld S=%lldx%lld "
             "[%lld,+%lld) <- [%lld,..) beta %g skip %lld%s",
             lucid_dtype_name(ddt), lucid_dtype_name(sdt), (long long)N, (long long)Cd,
             (long long)Cs, (long long)h, (long long)w, (long long)d0, (long long)nch,
             (long long)s0, beta, (long long)skip, kernel ? " LUCID_CHAN_COPY=kernel" : " LUCID_CHAN_COPY=memcpy");
    int64_t ds[4] = {N, Cd, h, w}, ss[4] = {N, Cs, h, w};
    lucid_tensor *dh = NULL, *dg = NULL, *sh = NULL, *sg = NULL, *gh = NULL;
    if (!rand_pair(ctx, ddt, 4, ds, skip, D_SIGNED, &dh, &dg) ||
        !rand_pair(ctx, sdt, 4, ss, 0, D_SIGNED, &sh, &sg)) { FAILST(name); goto done; }
    setenv("LUCID_CHAN_COPY", kernel ? "kernel" : "memcpy", 1);
    lucid_status s1 = lucid_nn_channel_copy(ctx, dh, d0, sh, s0, nch, beta);
    lucid_status s2 = lucid_nn_channel_copy(ctx, dg, d0, sg, s0, nch, beta);
    unsetenv("LUCID_CHAN_COPY");
    if (s1 != LUCID_OK || s2 != LUCID_OK) { FAILST(name); goto done; }
    if (ddt == sdt) {
        compare_bits(name, dh, ctx, dg);
    } else {
        gh = to_host(ctx, dg);
        compare(name, dh, gh, 1e-6, 1, 0.0, 0);
    }
done:
    rel(dh); rel(dg); rel(sh); rel(sg); rel(gh);
}

static void test_vector_paths(lucid_ctx *ctx, lucid_dtype dt) {
    const int64_t V = 16 / (int64_t)lucid_dtype_size(dt);
    /* more vectors than one grid-stride step covers (2 waves of 2048
     * threads on 132 SMs, 4 vectors each: 2.2M vectors) */
    const int64_t big = V * 2300000 + 3;
    for (int k = MV_ADD; k <= MV_AXPY; k++) {
        test_map_vec(ctx, dt, k, 100003, 0, 0, 0, 0);   /* vectors + tail */
        test_map_vec(ctx, dt, k, 100003, 1, 1, 1, 0);   /* unaligned: scalar */
    }
    test_map_vec(ctx, dt, MV_ADD, 8000, 0, 0, 0, 0);    /* vectors only */
    test_map_vec(ctx, dt, MV_ADD, V - 1, 0, 0, 0, 0);   /* tail only */
    test_map_vec(ctx, dt, MV_ADD, 1, 0, 0, 0, 0);
    test_map_vec(ctx, dt, MV_ADD, 4099, V, V, 2 * V, 0); /* aligned views */
    test_map_vec(ctx, dt, MV_ADD, 4099, 0, 0, 1, 0);    /* b unaligned */
    test_map_vec(ctx, dt, MV_ADD, 4099, 1, 0, 0, 0);    /* out unaligned */
    test_map_vec(ctx, dt, MV_ADD, 4099, 2, 2, 2, 0);    /* 4/8-byte aligned */
    test_map_vec(ctx, dt, MV_ADD, 100003, 0, 0, 0, 1);  /* a += b (grads) */
    test_map_vec(ctx, dt, MV_ADD, 100003, 1, 1, 1, 1);
    test_map_vec(ctx, dt, MV_ADD, big, 0, 0, 0, 1);     /* grid-stride */

    test_nn_add_vec(ctx, dt, 100003, 0, 0);
    test_nn_add_vec(ctx, dt, 8000, 0, 0);
    test_nn_add_vec(ctx, dt, V - 1, 0, 0);
    test_nn_add_vec(ctx, dt, 100003, 1, 0);
    test_nn_add_vec(ctx, dt, 100003, 0, 1);
    test_nn_add_vec(ctx, dt, 100003, 1, 1);
    test_nn_add_vec(ctx, dt, big, 0, 0);

    /* s = 2 vector route: W % (V/2) == 0, x/dx 8-byte, y/dy 16-byte aligned */
    const double betas[3] = {0.0, 1.0, 0.5};
    for (int b = 0; b < 3; b++) {
        test_upsample_vec(ctx, dt, 2, 3, 20, 20, 2, 0, betas[b]);
        test_upsample_vec(ctx, dt, 2, 3, 7, 5, 2, 0, betas[b]);   /* odd W */
        test_upsample_vec(ctx, dt, 2, 3, 5, 8, 3, 0, betas[b]);   /* s = 3 */
        test_upsample_vec(ctx, dt, 2, 3, 20, 20, 2, 1, betas[b]); /* unaligned */
    }
    test_upsample_vec(ctx, dt, 2, 3, 6, 6, 2, 0, 0.0);  /* f32 vector, 16-bit not */
    test_upsample_vec(ctx, dt, 1, 1, 1, 4, 2, 0, 1.0);  /* one unit (16-bit) */
    test_upsample_vec(ctx, dt, 2, 3, 4, 12, 2, 2, 0.0); /* skip 2: 16-bit x 4-byte */
    test_upsample_vec(ctx, dt, 2, 3, 4, 12, 2, V / 2, 1.0); /* x 8-byte, y 8 off */
    test_upsample_vec(ctx, dt, 4, 128, 40, 40, 2, 0, 0.0); /* 3.3M outputs */
    test_upsample_vec(ctx, dt, 4, 64, 20, 20, 2, 0, 1.0);
    /* more units (V/2 inputs each) than one grid-stride step covers */
    test_upsample_vec(ctx, dt, 4, V == 4 ? 33 : 66, 184, 184, 2, 0, 0.0);

    /* channel_copy: S = V/2 elements per channel keeps rows aligned and
     * leaves a tail; S = 5 is unaligned; N = 70000 > 65535 rows on grid y */
    for (int kern = 0; kern < 2; kern++) {
        test_chan_copy_vec(ctx, dt, dt, 4, 64, 32, 40, 40, 16, 8, 16, 0.0, 0, kern);
        test_chan_copy_vec(ctx, dt, dt, 2, 8, 12, 1, V / 2, 2, 4, 3, 0.0, 0, kern);
        test_chan_copy_vec(ctx, dt, dt, 2, 8, 12, 1, 5, 1, 3, 4, 0.0, 0, kern);
    }
    test_chan_copy_vec(ctx, dt, dt, 4, 64, 32, 40, 40, 16, 8, 16, 1.0, 0, 0);
    test_chan_copy_vec(ctx, dt, dt, 4, 64, 32, 40, 40, 16, 8, 16, 0.5, 0, 0);
    test_chan_copy_vec(ctx, dt, dt, 2, 8, 12, 1, V / 2, 2, 4, 3, 1.0, 0, 0);
    test_chan_copy_vec(ctx, dt, dt, 2, 8, 12, 1, 5, 1, 3, 4, 1.0, 0, 0);
    test_chan_copy_vec(ctx, dt, dt, 4, 64, 32, 40, 40, 16, 8, 16, 1.0, 1, 0);
    test_chan_copy_vec(ctx, dt, dt, 70000, 2, 2, 1, V, 0, 1, 1, 1.0, 0, 0);
    test_chan_copy_vec(ctx, dt, dt, 70000, 2, 2, 1, V, 0, 1, 1, 0.0, 0, 1);
    for (int o = 0; o < 3; o++)
        if (FLOATS[o] != dt) {
            test_chan_copy_vec(ctx, dt, FLOATS[o], 4, 64, 32, 40, 40, 16, 8, 16, 0.0, 0, 0);
            test_chan_copy_vec(ctx, dt, FLOATS[o], 2, 8, 12, 1, 5, 1, 3, 4, 1.0, 0, 0);
        }
}

/* ------------------------------------------------------------ allocator */

static int stats(lucid_ctx *ctx, lucid_memory_stats *s) {
    return lucid_memory_stats_get(ctx, GPU, s) == LUCID_OK;
}

static void test_allocator(lucid_ctx *ctx) {
    lucid_memory_stats s0, s1, s2, s3;
    const int64_t n = 10 << 20; /* 10 MiB of u8 */
    lucid_tensor *t = NULL, *t2 = NULL;
    if (!stats(ctx, &s0)) { FAILST("cuda allocator stats"); return; }
    CHECK("cuda allocator reserved >= allocated", s0.reserved >= s0.allocated,
          "reserved %llu allocated %llu", (unsigned long long)s0.reserved,
          (unsigned long long)s0.allocated);
    if (lucid_tensor_empty(ctx, GPU, LUCID_U8, 1, &n, &t) != LUCID_OK || !stats(ctx, &s1)) {
        FAILST("cuda allocator alloc"); return;
    }
    CHECK("cuda allocator allocated goes up",
          s1.allocated >= s0.allocated + (uint64_t)n && s1.num_allocs == s0.num_allocs + 1,
          "allocated %llu -> %llu, num_allocs %llu -> %llu",
          (unsigned long long)s0.allocated, (unsigned long long)s1.allocated,
          (unsigned long long)s0.num_allocs, (unsigned long long)s1.num_allocs);
    CHECK("cuda allocator peak", s1.peak_allocated >= s1.allocated &&
          s1.peak_reserved >= s1.reserved, "peak %llu allocated %llu",
          (unsigned long long)s1.peak_allocated, (unsigned long long)s1.allocated);
    rel(t); t = NULL;
    stats(ctx, &s2);
    CHECK("cuda allocator allocated goes back down", s2.allocated == s0.allocated &&
          s2.reserved == s1.reserved, "allocated %llu (was %llu), reserved %llu (was %llu)",
          (unsigned long long)s2.allocated, (unsigned long long)s0.allocated,
          (unsigned long long)s2.reserved, (unsigned long long)s1.reserved);
    /* cache hit: same size again does not call cudaMalloc */
    if (lucid_tensor_empty(ctx, GPU, LUCID_U8, 1, &n, &t) != LUCID_OK) {
        FAILST("cuda allocator reuse"); return;
    }
    stats(ctx, &s3);
    CHECK("cuda allocator reuses cached block",
          s3.num_device_allocs == s2.num_device_allocs && s3.num_allocs == s2.num_allocs + 1,
          "num_device_allocs %llu -> %llu", (unsigned long long)s2.num_device_allocs,
          (unsigned long long)s3.num_device_allocs);
    rel(t); t = NULL;
    lucid_memory_reset_peak(ctx);
    stats(ctx, &s3);
    CHECK("cuda allocator reset_peak", s3.peak_allocated == s3.allocated,
          "peak %llu allocated %llu", (unsigned long long)s3.peak_allocated,
          (unsigned long long)s3.allocated);
    /* empty_cache: every cached byte goes back; what stays reserved is live
     * (the context's cuBLAS workspace, allocated at init) */
    if (lucid_memory_empty_cache(ctx) != LUCID_OK) { FAILST("cuda allocator empty_cache"); return; }
    stats(ctx, &s3);
    CHECK("cuda allocator empty_cache releases the cache",
          s3.reserved == s3.allocated && s3.allocated == s0.allocated,
          "reserved %llu allocated %llu (baseline allocated %llu)",
          (unsigned long long)s3.reserved, (unsigned long long)s3.allocated,
          (unsigned long long)s0.allocated);
    /* small blocks share a segment and are split/merged */
    {
        int64_t k = 1000;
        lucid_tensor *v[8];
        int ok = 1;
        for (int i = 0; i < 8; i++)
            if (lucid_tensor_empty(ctx, GPU, LUCID_F32, 1, &k, &v[i]) != LUCID_OK) ok = 0, v[i] = NULL;
        lucid_memory_stats a;
        stats(ctx, &a);
        CHECK("cuda allocator small blocks share one segment", ok &&
              a.num_device_allocs == s3.num_device_allocs + 1,
              "num_device_allocs %llu -> %llu", (unsigned long long)s3.num_device_allocs,
              (unsigned long long)a.num_device_allocs);
        for (int i = 0; i < 8; i++) rel(v[i]);
        lucid_memory_empty_cache(ctx);
        stats(ctx, &a);
        CHECK("cuda allocator small segment merged and released",
              a.reserved == a.allocated, "reserved %llu allocated %llu",
              (unsigned long long)a.reserved, (unsigned long long)a.allocated);
    }
    /* absurd request: OOM with sizes in the message, context still usable */
    {
        int64_t huge = (int64_t)1 << 50;
        lucid_status st = lucid_tensor_empty(ctx, GPU, LUCID_U8, 1, &huge, &t2);
        const char *msg = lucid_ctx_error(ctx);
        CHECK("cuda allocator 2^50 bytes is LUCID_ERR_OOM", st == LUCID_ERR_OOM && t2 == NULL,
              "status %s: %s", lucid_status_name(st), msg);
        CHECK("cuda allocator OOM message names the sizes",
              strstr(msg, "1125899906842624") != NULL && strstr(msg, "allocated") != NULL &&
              strstr(msg, "reserved") != NULL, "message: %s", msg);
        rel(t2);
        lucid_ctx_clear_error(ctx);
        int64_t sh[1] = {1000};
        lucid_tensor *h = host_rand(ctx, LUCID_F32, 1, sh, D_WIDE), *g = NULL, *b = NULL;
        int ok = h && (g = to_dev(ctx, h)) && (b = to_host(ctx, g));
        if (ok) compare("cuda context works after OOM", h, b, 0, 0, 0, 0);
        else FAILST("cuda context works after OOM");
        rel(h); rel(g); rel(b);
    }
}

/* ------------------------------------------------------------ two contexts */

static void test_two_contexts(lucid_ctx *ctx) {
    const char *name = "cuda two contexts";
    int ndev = lucid_cuda_device_count();
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device.type = LUCID_CUDA;
    o.device.index = ndev > 1 ? 1 : 0;
    char err[512] = "";
    lucid_ctx *c2 = NULL;
    if (lucid_ctx_create(&o, &c2, err, sizeof err) != LUCID_OK) {
        TEST_FAIL(name, "second context on cuda:%d: %s", o.device.index, err);
        return;
    }
    lucid_device g2 = o.device;
    int64_t as[2] = {64, 48}, bs[2] = {48, 80}, os[2] = {64, 80};
    lucid_tensor *ah = host_rand(ctx, LUCID_F32, 2, as, D_SIGNED);
    lucid_tensor *bh = host_rand(ctx, LUCID_F32, 2, bs, D_SIGNED);
    lucid_tensor *a1 = NULL, *b1 = NULL, *o1 = NULL, *a2 = NULL, *b2 = NULL, *o2 = NULL;
    lucid_tensor *h1 = NULL, *h2 = NULL;
    lucid_memory_stats s_before, s_after;
    stats(ctx, &s_before);
    int ok = ah && bh &&
             lucid_tensor_to(ctx, ah, GPU, LUCID_F32, &a1) == LUCID_OK &&
             lucid_tensor_to(ctx, bh, GPU, LUCID_F32, &b1) == LUCID_OK &&
             lucid_tensor_empty(ctx, GPU, LUCID_F32, 2, os, &o1) == LUCID_OK &&
             lucid_tensor_to(c2, ah, g2, LUCID_F32, &a2) == LUCID_OK &&
             lucid_tensor_to(c2, bh, g2, LUCID_F32, &b2) == LUCID_OK &&
             lucid_tensor_empty(c2, g2, LUCID_F32, 2, os, &o2) == LUCID_OK &&
             lucid_matmul(ctx, o1, a1, b1, 0, 0, 1.0, 0.0) == LUCID_OK &&
             lucid_matmul(c2, o2, a2, b2, 0, 0, 1.0, 0.0) == LUCID_OK &&
             lucid_tensor_to(ctx, o1, CPU, LUCID_F32, &h1) == LUCID_OK &&
             lucid_tensor_to(c2, o2, CPU, LUCID_F32, &h2) == LUCID_OK &&
             lucid_ctx_synchronize(ctx) == LUCID_OK && lucid_ctx_synchronize(c2) == LUCID_OK;
    if (!ok) {
        TEST_FAIL(name, "ctx1: %s / ctx2: %s", lucid_ctx_error(ctx), lucid_ctx_error(c2));
    } else {
        compare("cuda two contexts give equal results", h1, h2, 0, 0, 0, 0);
        lucid_memory_stats m2;
        lucid_memory_stats_get(c2, g2, &m2);
        stats(ctx, &s_after);
        /* a1, b1, o1 (sizes are multiples of 512) count in ctx1 only */
        uint64_t mine = (64 * 48 + 48 * 80 + 64 * 80) * 4;
        CHECK("cuda two contexts have separate allocators",
              m2.num_allocs >= 3 && s_after.allocated == s_before.allocated + mine &&
              m2.allocated >= mine,
              "ctx1 allocated %llu -> %llu (expected +%llu), ctx2 allocated %llu",
              (unsigned long long)s_before.allocated,
              (unsigned long long)s_after.allocated, (unsigned long long)mine,
              (unsigned long long)m2.allocated);
    }
    rel(a2); rel(b2); rel(o2); rel(h2);
    lucid_ctx_release(c2); /* the last reference: streams and cache go */
    /* the first context still works */
    lucid_tensor *h3 = NULL;
    if (ok && lucid_matmul(ctx, o1, a1, b1, 0, 0, 1.0, 0.0) == LUCID_OK &&
        (h3 = to_host(ctx, o1)))
        compare("cuda first context works after the second is gone", h1, h3, 0, 0, 0, 0);
    else
        FAILST("cuda first context works after the second is gone");
    rel(ah); rel(bh); rel(a1); rel(b1); rel(o1); rel(h1); rel(h3);
}

/* ------------------------------------------------------------ main */

static const char *GROUPS[] = {
    "cuda fill", "cuda copy/cast", "cuda binary", "cuda binary_scalar",
    "cuda unary", "cuda axpy", "cuda reduce_all", "cuda reduce_dim",
    "cuda matmul", "cuda random", "cuda vector paths", "cuda allocator",
    "cuda two contexts"};

int main(void) {
    if (!lucid_cuda_available()) {
        for (size_t i = 0; i < sizeof GROUPS / sizeof GROUPS[0]; i++)
            TEST_SKIP(GROUPS[i], "no CUDA device");
        return 0;
    }
    const char *env = getenv("LUCID_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ 0x9E3779B97F4A7C15ull;
    if (seed == 0) seed = 1;
    rng_s = seed;
    printf("# test_cuda_ops: seed %llu (LUCID_TEST_SEED to replay), %d device(s)\n",
           (unsigned long long)seed, lucid_cuda_device_count());

    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[512] = "";
    lucid_ctx *ctx = NULL;
    lucid_status st = lucid_ctx_create(&o, &ctx, err, sizeof err);
    if (st != LUCID_OK) {
        TEST_FAIL("cuda context create", "%s: %s", lucid_status_name(st), err);
        return test_exit();
    }
    TEST_OK("cuda context create");

    for (int d = 0; d < 3; d++) {
        lucid_dtype dt = FLOATS[d];
        test_fill(ctx, dt, 0.1);
        test_fill(ctx, dt, -3.7e5);
        for (int op = 0; op < LUCID_BINARY_OP_COUNT; op++) {
            test_binary(ctx, dt, op, 0);
            test_binary(ctx, dt, op, 1);
            test_binary_scalar(ctx, dt, op, 0);
            test_binary_scalar(ctx, dt, op, 1);
        }
        for (int op = 0; op < LUCID_UNARY_OP_COUNT; op++) {
            test_unary(ctx, dt, op);
            test_unary_contig(ctx, dt, op);
        }
        test_axpy(ctx, dt);
        for (int op = 0; op < LUCID_REDUCE_OP_COUNT; op++) {
            test_reduce_all(ctx, dt, op, 1, 0);
            test_reduce_all(ctx, dt, op, 1001, 0);
            test_reduce_all(ctx, dt, op, 3000003, 0);
            test_reduce_all(ctx, dt, op, 70007, 1);
            int64_t s3[3] = {7, 300, 33}, sb[2] = {3, 5000}, sc[2] = {5000, 3};
            for (int dim = 0; dim < 3; dim++)
                test_reduce_dim(ctx, dt, op, 3, s3, dim, dim & 1);
            test_reduce_dim(ctx, dt, op, 2, sb, 1, 0); /* block per output */
            test_reduce_dim(ctx, dt, op, 2, sc, 0, 1); /* block, strided dim */
        }
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                test_matmul(ctx, dt, ta, tb, 0.0, 0);
                test_matmul(ctx, dt, ta, tb, 0.5, 0);
            }
        test_matmul(ctx, dt, 0, 0, 0.0, 1);
        test_matmul(ctx, dt, 1, 1, 0.0, 1);
        test_matmul(ctx, dt, 0, 1, 0.25, 2);
        test_random(ctx, dt, 0, 0);
        test_random(ctx, dt, 0, 1);
        test_random(ctx, dt, 1, 0);
        test_random(ctx, dt, 1, 1);
        test_vector_paths(ctx, dt);
    }
    test_fill(ctx, LUCID_U8, 300.0);
    test_fill(ctx, LUCID_I32, -2.9);
    test_fill(ctx, LUCID_I64, 1e12);
    for (int s = 0; s < 6; s++)
        for (int d = 0; d < 6; d++) test_cast(ctx, CASTS[s], CASTS[d]);
    for (int d = 0; d < 3; d++) test_cast_f64(ctx, FLOATS[d]);
    test_pinned(ctx);
    for (int op = 0; op < LUCID_REDUCE_OP_COUNT; op++) test_reduce_nan(ctx, op);
    test_allocator(ctx);
    test_two_contexts(ctx);

    lucid_ctx_release(ctx);
    return test_exit();
}
