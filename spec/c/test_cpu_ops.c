/*
 * test_cpu_ops.c — C unit tests of the CPU backend (engine/cpu/) through the
 * public op API: copy/cast, fill, every binary and unary op, axpy,
 * reductions, matmul and the Philox random fills.
 *
 * Reference values are computed here in double from the inputs as stored
 * (already rounded to their dtype), on fresh pseudo-random inputs from a
 * host generator independent of the engine's. Tolerances (|got-ref| <=
 * atol + rtol*|ref|; NaN or a stray Inf never passes):
 *   f64  atol 1e-12 rtol 1e-12   (matmul/reductions scale atol by the length)
 *   f32  atol 1e-6  rtol 4e-6    (f32 libm is within a few ulp)
 *   bf16 atol 1e-5  rtol 8e-3    (one rounding to 8 significant bits: 2^-9)
 *   f16  atol 1e-6  rtol 1.5e-3  (one rounding to 11 significant bits: 2^-12)
 */
#include "test.h"
#include "internal.h"
#include <stdint.h>

static lucid_ctx *ctx_;
static const lucid_device CPU = {LUCID_CPU, 0};
static const lucid_dtype FLOATS[4] = {LUCID_F32, LUCID_F64, LUCID_BF16, LUCID_F16};

/* --------------------------------------------------------------- helpers */

static uint64_t rng_state_ = 0x9e3779b97f4a7c15ull;

/* splitmix64: the test's own generator, independent of Philox. */
static double urand(double lo, double hi) {
    uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) * (1.0 / 9007199254740992.0));
}

static lucid_tensor *mk(lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx_, CPU, dt, ndim, shape, &t) != LUCID_OK) {
        printf("# tensor_empty failed: %s\n", lucid_ctx_error(ctx_));
        exit(2);
    }
    return t;
}

static lucid_tensor *mk2(lucid_dtype dt, int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    return mk(dt, 2, s);
}

/* Fill t (any view) with uniform values in [lo, hi), mirrored to negative
 * when sym (|x| in [lo, hi), random sign). */
static void rand_fill(lucid_tensor *t, double lo, double hi, int sym) {
    int64_t n = lucid_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = urand(lo, hi);
        if (sym && urand(0, 1) < 0.5) v = -v;
        lucid_cpu_set(t, i, v);
    }
}

typedef struct tol { double atol, rtol; } tol;

static tol tol_of(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F64: return (tol){1e-12, 1e-12};
    case LUCID_F32: return (tol){1e-6, 4e-6};
    case LUCID_BF16: return (tol){1e-5, 8e-3};
    case LUCID_F16: return (tol){1e-6, 1.5e-3};
    default: return (tol){0, 0};
    }
}

/* NaN never passes; infinities pass only when equal. */
static int close_to(double got, double ref, tol t) {
    if (isnan(got) || isnan(ref)) return 0;
    if (isinf(got) || isinf(ref)) return got == ref;
    return fabs(got - ref) <= t.atol + t.rtol * fabs(ref);
}

/* Compare every element of got against ref[] (logical order); on failure
 * report the worst element. */
static void check_vals(const char *name, const lucid_tensor *got,
                       const double *ref, tol t) {
    int64_t n = lucid_tensor_numel(got), bad = 0, worst = -1;
    double worst_err = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = lucid_cpu_get(got, i);
        if (!close_to(g, ref[i], t)) {
            bad++;
            double e = isnan(g) || isnan(ref[i]) ? INFINITY : fabs(g - ref[i]);
            if (e > worst_err) { worst_err = e; worst = i; }
        }
    }
    if (bad == 0) TEST_OK(name);
    else
        TEST_FAIL(name, "%lld of %lld elements off; worst [%lld] got %.9g want %.9g",
                  (long long)bad, (long long)n, (long long)worst,
                  lucid_cpu_get(got, worst), ref[worst]);
}

static double *alloc_ref(const lucid_tensor *t) {
    double *r = malloc(sizeof(double) * (size_t)(lucid_tensor_numel(t) + 1));
    if (!r) exit(2);
    return r;
}

static void name_fmt(char *buf, size_t n, const char *a, const char *b,
                     lucid_dtype dt, const char *c) {
    snprintf(buf, n, "%s.%s.%s%s%s", a, b, lucid_dtype_name(dt), c ? "." : "",
             c ? c : "");
}

/* --------------------------------------------------------- references */

static double ref_binary(lucid_binary_op op, double x, double y) {
    switch (op) {
    case LUCID_OP_ADD: return x + y;
    case LUCID_OP_SUB: return x - y;
    case LUCID_OP_MUL: return x * y;
    case LUCID_OP_DIV: return x / y;
    case LUCID_OP_MAX: return isnan(x) || isnan(y) ? NAN : (x > y ? x : y);
    case LUCID_OP_MIN: return isnan(x) || isnan(y) ? NAN : (x < y ? x : y);
    case LUCID_OP_POW: return pow(x, y);
    default: return NAN;
    }
}

static double ref_unary(lucid_unary_op op, double x) {
    switch (op) {
    case LUCID_OP_NEG: return -x;
    case LUCID_OP_ABS: return fabs(x);
    case LUCID_OP_EXP: return exp(x);
    case LUCID_OP_LOG: return log(x);
    case LUCID_OP_SQRT: return sqrt(x);
    case LUCID_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case LUCID_OP_SILU: return x / (1.0 + exp(-x));
    case LUCID_OP_TANH: return tanh(x);
    case LUCID_OP_RELU: return x > 0 ? x : 0.0;
    case LUCID_OP_SQUARE: return x * x;
    default: return NAN;
    }
}

static const char *BIN_NAMES[] = {"add", "sub", "mul", "div", "max", "min", "pow"};
static const char *UN_NAMES[] = {"neg", "abs", "exp", "log", "sqrt", "sigmoid",
                                 "silu", "tanh", "relu", "square"};
static const char *RED_NAMES[] = {"sum", "mean", "max", "min", "norm2", "sumsq"};

/* Operand ranges that keep each op in its domain. */
static void binary_inputs(lucid_binary_op op, lucid_tensor *a, lucid_tensor *b) {
    if (op == LUCID_OP_POW) {
        rand_fill(a, 0.1, 3.0, 0);
        rand_fill(b, -2.0, 2.0, 0);
    } else if (op == LUCID_OP_DIV) {
        rand_fill(a, -3.0, 3.0, 0);
        rand_fill(b, 0.5, 2.0, 1);
    } else {
        rand_fill(a, -3.0, 3.0, 0);
        rand_fill(b, -3.0, 3.0, 0);
    }
}

/* ---------------------------------------------------------- elementwise */

enum { M_ = 37, N_ = 53 }; /* 1961 elements: several gather chunks */

static void test_binary(void) {
    char name[96];
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        tol tl = tol_of(dt);
        for (int op = 0; op < LUCID_BINARY_OP_COUNT; op++) {
            lucid_binary_op bop = (lucid_binary_op)op;
            /* 1. contiguous */
            lucid_tensor *a = mk2(dt, M_, N_), *b = mk2(dt, M_, N_), *o = mk2(dt, M_, N_);
            binary_inputs(bop, a, b);
            double *r = alloc_ref(o);
            for (int64_t i = 0; i < M_ * N_; i++)
                r[i] = ref_binary(bop, lucid_cpu_get(a, i), lucid_cpu_get(b, i));
            lucid_status s = lucid_binary(ctx_, bop, o, a, b);
            name_fmt(name, sizeof name, "binary", BIN_NAMES[op], dt, "contiguous");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, tl);

            /* 2. in place: a = a (op) b */
            s = lucid_binary(ctx_, bop, a, a, b);
            name_fmt(name, sizeof name, "binary", BIN_NAMES[op], dt, "inplace");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, a, r, tl);

            /* 3. a transposed view, b broadcast [1,N] */
            lucid_tensor *at0 = mk2(dt, N_, M_), *at = NULL, *brow = mk2(dt, 1, N_);
            binary_inputs(bop, at0, brow);
            lucid_tensor_transpose(ctx_, at0, 0, 1, &at);
            lucid_tensor bv;
            lucid_tensor_broadcast_view(ctx_, brow, 2, o->shape, &bv);
            for (int64_t i = 0; i < M_ * N_; i++)
                r[i] = ref_binary(bop, lucid_cpu_get(at, i), lucid_cpu_get(&bv, i));
            s = lucid_binary(ctx_, bop, o, at, brow);
            name_fmt(name, sizeof name, "binary", BIN_NAMES[op], dt, "strided_bcast_row");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, tl);

            /* 4. strided out (narrowed), b broadcast [M,1] and a of rank 1 */
            lucid_tensor *big = mk2(dt, M_, N_ + 9), *on = NULL;
            lucid_tensor_narrow(ctx_, big, 1, 4, N_, &on);
            lucid_tensor *bcol = mk2(dt, M_, 1), *a1 = NULL;
            int64_t sn[1] = {N_};
            a1 = mk(dt, 1, sn);
            binary_inputs(bop, a1, bcol);
            lucid_fill(ctx_, big, -7.0);
            lucid_tensor av, cv;
            lucid_tensor_broadcast_view(ctx_, a1, 2, o->shape, &av);
            lucid_tensor_broadcast_view(ctx_, bcol, 2, o->shape, &cv);
            for (int64_t i = 0; i < M_ * N_; i++)
                r[i] = ref_binary(bop, lucid_cpu_get(&av, i), lucid_cpu_get(&cv, i));
            s = lucid_binary(ctx_, bop, on, a1, bcol);
            name_fmt(name, sizeof name, "binary", BIN_NAMES[op], dt, "strided_out_bcast_col");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, on, r, tl);
            int untouched = 1;
            for (int64_t i = 0; i < M_; i++) {
                for (int64_t j = 0; j < 4; j++)
                    untouched &= lucid_cpu_get(big, i * (N_ + 9) + j) == -7.0;
                for (int64_t j = N_ + 4; j < N_ + 9; j++)
                    untouched &= lucid_cpu_get(big, i * (N_ + 9) + j) == -7.0;
            }
            name_fmt(name, sizeof name, "binary", BIN_NAMES[op], dt, "outside_view_untouched");
            CHECK(name, untouched, "elements outside the output view were written");

            /* 5. scalar, both orders (a away from 0 for a reverse DIV) */
            for (int rev = 0; rev < 2; rev++) {
                double sc = op == LUCID_OP_POW ? (rev ? 1.5 : -1.25) : 1.75;
                if (op == LUCID_OP_POW && !rev) rand_fill(a, 0.1, 3.0, 0);
                else if (op == LUCID_OP_DIV) rand_fill(a, 0.5, 2.0, 1);
                else rand_fill(a, -3.0, 3.0, 0);
                for (int64_t i = 0; i < M_ * N_; i++) {
                    double x = lucid_cpu_get(a, i);
                    r[i] = rev ? ref_binary(bop, sc, x) : ref_binary(bop, x, sc);
                }
                s = lucid_binary_scalar(ctx_, bop, o, a, sc, rev);
                name_fmt(name, sizeof name, "binary_scalar", BIN_NAMES[op], dt,
                         rev ? "reverse" : "forward");
                if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
                else check_vals(name, o, r, tl);
            }
            free(r);
            lucid_tensor *ts[] = {a, b, o, at0, at, brow, big, on, bcol, a1};
            for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) lucid_tensor_release(ts[k]);
        }
    }
}

static void test_unary(void) {
    char name[96];
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        tol tl = tol_of(dt);
        for (int op = 0; op < LUCID_UNARY_OP_COUNT; op++) {
            lucid_unary_op uop = (lucid_unary_op)op;
            int pos = uop == LUCID_OP_LOG || uop == LUCID_OP_SQRT;
            lucid_tensor *a = mk2(dt, M_, N_), *o = mk2(dt, M_, N_);
            if (pos) rand_fill(a, 0.05, 4.0, 0);
            else rand_fill(a, -4.0, 4.0, 0);
            double *r = alloc_ref(o);
            for (int64_t i = 0; i < M_ * N_; i++) r[i] = ref_unary(uop, lucid_cpu_get(a, i));
            lucid_status s = lucid_unary(ctx_, uop, o, a);
            name_fmt(name, sizeof name, "unary", UN_NAMES[op], dt, "contiguous");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, tl);
            s = lucid_unary(ctx_, uop, a, a);
            name_fmt(name, sizeof name, "unary", UN_NAMES[op], dt, "inplace");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, a, r, tl);
            /* transposed input into a transposed output */
            lucid_tensor *x0 = mk2(dt, N_, M_), *x = NULL, *y0 = mk2(dt, N_, M_), *y = NULL;
            if (pos) rand_fill(x0, 0.05, 4.0, 0);
            else rand_fill(x0, -4.0, 4.0, 0);
            lucid_tensor_transpose(ctx_, x0, 0, 1, &x);
            lucid_tensor_transpose(ctx_, y0, 0, 1, &y);
            for (int64_t i = 0; i < M_ * N_; i++) r[i] = ref_unary(uop, lucid_cpu_get(x, i));
            s = lucid_unary(ctx_, uop, y, x);
            name_fmt(name, sizeof name, "unary", UN_NAMES[op], dt, "transposed");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, y, r, tl);
            free(r);
            lucid_tensor *ts[] = {a, o, x0, x, y0, y};
            for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) lucid_tensor_release(ts[k]);
        }
    }
}

static void test_axpy_mixed(void) {
    char name[96];
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        lucid_tensor *y = mk2(dt, M_, N_), *x0 = mk2(dt, N_, M_), *x = NULL;
        rand_fill(y, -2, 2, 0);
        rand_fill(x0, -2, 2, 0);
        lucid_tensor_transpose(ctx_, x0, 0, 1, &x);
        double *r = alloc_ref(y);
        for (int64_t i = 0; i < M_ * N_; i++)
            r[i] = lucid_cpu_get(y, i) - 0.375 * lucid_cpu_get(x, i);
        lucid_status s = lucid_axpy(ctx_, y, -0.375, x);
        name_fmt(name, sizeof name, "axpy", "strided", dt, NULL);
        if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
        else check_vals(name, y, r, tol_of(dt));
        free(r);
        lucid_tensor_release(y);
        lucid_tensor_release(x0);
        lucid_tensor_release(x);
    }
}

/* Long contiguous rows are split over threads (3 here, uneven ranges);
 * the values must not change. */
static void test_threaded(void) {
    lucid_ctx_options opt = lucid_ctx_options_default();
    opt.cpu_threads = 3;
    lucid_ctx *c = NULL;
    lucid_ctx_create(&opt, &c, NULL, 0);
    int64_t n[1] = {300007};
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        lucid_tensor *a = NULL, *b = NULL, *o = NULL;
        lucid_tensor_empty(c, CPU, dt, 1, n, &a);
        lucid_tensor_empty(c, CPU, dt, 1, n, &b);
        lucid_tensor_empty(c, CPU, dt, 1, n, &o);
        rand_fill(a, -3, 3, 0);
        rand_fill(b, -3, 3, 0);
        double *r = alloc_ref(o);
        for (int64_t i = 0; i < n[0]; i++)
            r[i] = ref_unary(LUCID_OP_SILU, lucid_cpu_get(a, i)) * lucid_cpu_get(b, i);
        lucid_status s = lucid_unary(c, LUCID_OP_SILU, o, a);
        if (s == LUCID_OK) s = lucid_binary(c, LUCID_OP_MUL, o, o, b);
        char name[96];
        name_fmt(name, sizeof name, "threaded", "silu_mul", dt, "300007");
        tol t = tol_of(dt);
        t.rtol *= 2; /* two roundings */
        if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(c));
        else check_vals(name, o, r, t);
        free(r);
        lucid_tensor_release(a);
        lucid_tensor_release(b);
        lucid_tensor_release(o);
    }
    lucid_ctx_release(c);
}

/* Inputs of another dtype are converted to the output's compute type. */
static void test_mixed_inputs(void) {
    lucid_tensor *a = mk2(LUCID_F32, 4, 5), *b = mk2(LUCID_I32, 4, 5),
                 *o = mk2(LUCID_BF16, 4, 5);
    rand_fill(a, -3, 3, 0);
    double r[20];
    for (int64_t i = 0; i < 20; i++) {
        lucid_cpu_set(b, i, (double)(i - 7));
        r[i] = lucid_cpu_get(a, i) * (double)(i - 7);
    }
    lucid_status s = lucid_binary(ctx_, LUCID_OP_MUL, o, a, b);
    if (s != LUCID_OK) TEST_FAIL("binary.mixed_f32_i32_to_bf16", "%s", lucid_ctx_error(ctx_));
    else check_vals("binary.mixed_f32_i32_to_bf16", o, r, tol_of(LUCID_BF16));
    lucid_tensor *oi = mk2(LUCID_I32, 4, 5);
    s = lucid_binary(ctx_, LUCID_OP_ADD, oi, a, a);
    CHECK("binary.int_out_unsupported", s == LUCID_ERR_UNSUPPORTED &&
                                            strstr(lucid_ctx_error(ctx_), "i32"),
          "status %s: %s", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_tensor_release(a);
    lucid_tensor_release(b);
    lucid_tensor_release(o);
    lucid_tensor_release(oi);
}

/* NaN propagation and the documented edge semantics. */
static void test_nan_semantics(void) {
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        char name[96];
        int64_t s4[1] = {4};
        lucid_tensor *a = mk(dt, 1, s4), *b = mk(dt, 1, s4), *o = mk(dt, 1, s4);
        double av[4] = {NAN, 1.0, NAN, -0.5}, bv[4] = {1.0, NAN, NAN, 2.0};
        for (int i = 0; i < 4; i++) { lucid_cpu_set(a, i, av[i]); lucid_cpu_set(b, i, bv[i]); }
        int ok = 1;
        for (int op = LUCID_OP_MAX; op <= LUCID_OP_MIN; op++) {
            lucid_binary(ctx_, (lucid_binary_op)op, o, a, b);
            ok &= isnan(lucid_cpu_get(o, 0)) && isnan(lucid_cpu_get(o, 1)) &&
                  isnan(lucid_cpu_get(o, 2));
            ok &= lucid_cpu_get(o, 3) == (op == LUCID_OP_MAX ? 2.0 : -0.5);
            lucid_binary_scalar(ctx_, (lucid_binary_op)op, o, a, 1.0, 0);
            ok &= isnan(lucid_cpu_get(o, 0)) && lucid_cpu_get(o, 1) == 1.0;
            lucid_binary_scalar(ctx_, (lucid_binary_op)op, o, a, NAN, 1);
            ok &= isnan(lucid_cpu_get(o, 1)) && isnan(lucid_cpu_get(o, 3));
        }
        name_fmt(name, sizeof name, "nan", "max_min_propagate", dt, NULL);
        CHECK(name, ok, "max/min dropped a NaN");
        int uok = 1;
        for (int op = 0; op < LUCID_UNARY_OP_COUNT; op++) {
            lucid_unary(ctx_, (lucid_unary_op)op, o, a);
            uok &= isnan(lucid_cpu_get(o, 0));
        }
        name_fmt(name, sizeof name, "nan", "unary_propagate", dt, "relu_included");
        CHECK(name, uok, "a unary op turned NaN into a number");
        /* C pow semantics: pow(x, 0) = 1 and pow(1, y) = 1, NaN included */
        lucid_binary_scalar(ctx_, LUCID_OP_POW, o, a, 0.0, 0);
        int pok = lucid_cpu_get(o, 0) == 1.0;
        lucid_binary_scalar(ctx_, LUCID_OP_POW, o, a, 1.0, 1);
        pok &= lucid_cpu_get(o, 0) == 1.0 && lucid_cpu_get(o, 3) == 1.0;
        lucid_binary_scalar(ctx_, LUCID_OP_DIV, o, b, 0.0, 0);
        pok &= isinf(lucid_cpu_get(o, 0)) && lucid_cpu_get(o, 0) > 0;
        name_fmt(name, sizeof name, "edge", "pow_div", dt, NULL);
        CHECK(name, pok, "pow/div edge semantics differ from C");
        lucid_tensor_release(a);
        lucid_tensor_release(b);
        lucid_tensor_release(o);
    }
}

/* ------------------------------------------------------------ copy/cast */

static void test_copy_cast(void) {
    /* every dtype pair on values exact in all of them */
    int bad_pairs = 0;
    char first[64] = "";
    for (int sd = 0; sd < LUCID_DTYPE_COUNT; sd++)
        for (int dd = 0; dd < LUCID_DTYPE_COUNT; dd++) {
            lucid_tensor *s = mk2((lucid_dtype)sd, 3, 40), *d = mk2((lucid_dtype)dd, 3, 40);
            for (int64_t i = 0; i < 120; i++) lucid_cpu_set(s, i, (double)((i * 7) % 121));
            lucid_status st = lucid_copy(ctx_, d, s);
            int ok = st == LUCID_OK;
            for (int64_t i = 0; i < 120 && ok; i++)
                ok = lucid_cpu_get(d, i) == (double)((i * 7) % 121);
            if (!ok) {
                if (!bad_pairs)
                    snprintf(first, sizeof first, "%s->%s",
                             lucid_dtype_name((lucid_dtype)sd), lucid_dtype_name((lucid_dtype)dd));
                bad_pairs++;
            }
            lucid_tensor_release(s);
            lucid_tensor_release(d);
        }
    CHECK("copy.all_dtype_pairs", bad_pairs == 0, "%d pairs wrong (first %s)", bad_pairs, first);

    /* float -> integer: truncation, saturation, NaN -> 0 */
    int64_t s6[1] = {6};
    lucid_tensor *f = mk(LUCID_F32, 1, s6), *u = mk(LUCID_U8, 1, s6),
                 *i32 = mk(LUCID_I32, 1, s6), *i64 = mk(LUCID_I64, 1, s6);
    float fv[6] = {-5.0f, 300.0f, 3.7f, -3.7f, NAN, 3e10f};
    memcpy(lucid_tensor_data(f), fv, sizeof fv);
    lucid_copy(ctx_, u, f);
    lucid_copy(ctx_, i32, f);
    lucid_copy(ctx_, i64, f);
    const uint8_t *pu = lucid_tensor_data(u);
    const int32_t *pi = lucid_tensor_data(i32);
    const int64_t *pl = lucid_tensor_data(i64);
    CHECK("copy.to_u8_saturates", pu[0] == 0 && pu[1] == 255 && pu[2] == 3 &&
                                      pu[3] == 0 && pu[4] == 0 && pu[5] == 255,
          "u8 got %d %d %d %d %d %d", pu[0], pu[1], pu[2], pu[3], pu[4], pu[5]);
    CHECK("copy.to_i32_truncates_saturates",
          pi[0] == -5 && pi[1] == 300 && pi[2] == 3 && pi[3] == -3 && pi[4] == 0 &&
              pi[5] == INT32_MAX,
          "i32 got %d %d %d %d %d %d", pi[0], pi[1], pi[2], pi[3], pi[4], pi[5]);
    CHECK("copy.to_i64", pl[2] == 3 && pl[3] == -3 && pl[4] == 0 && pl[5] == (int64_t)3e10f,
          "i64 got %lld %lld", (long long)pl[4], (long long)pl[5]);
    /* same-dtype copies move bits: a large i64 survives exactly */
    lucid_tensor *l2 = mk(LUCID_I64, 1, s6);
    ((int64_t *)lucid_tensor_data(i64))[0] = (1LL << 62) + 1;
    lucid_copy(ctx_, l2, i64);
    CHECK("copy.i64_exact", ((int64_t *)lucid_tensor_data(l2))[0] == (1LL << 62) + 1,
          "i64 copy lost bits");
    lucid_tensor *ts[] = {f, u, i32, i64, l2};
    for (size_t k = 0; k < 5; k++) lucid_tensor_release(ts[k]);

    /* f32 -> bf16/f16 round once, same as the scalar conversions */
    for (int h = 0; h < 2; h++) {
        lucid_dtype dt = h ? LUCID_F16 : LUCID_BF16;
        lucid_tensor *x = mk2(LUCID_F32, 16, 64), *y = mk2(dt, 16, 64);
        rand_fill(x, -70000, 70000, 0);
        lucid_copy(ctx_, y, x);
        const float *px = lucid_tensor_data(x);
        const uint16_t *py = lucid_tensor_data(y);
        int ok = 1;
        for (int i = 0; i < 1024; i++)
            ok &= py[i] == (h ? lucid_f32_to_f16(px[i]) : lucid_f32_to_bf16(px[i]));
        CHECK(h ? "copy.f32_to_f16_bits" : "copy.f32_to_bf16_bits", ok,
              "cast differs from the scalar conversion");
        lucid_tensor_release(x);
        lucid_tensor_release(y);
    }

    /* f64 -> bf16/f16 is correctly rounded (no double rounding via f32) */
    lucid_tensor *d1 = mk2(LUCID_F64, 1, 2), *b1 = mk2(LUCID_BF16, 1, 2), *h1 = mk2(LUCID_F16, 1, 2);
    double *pd = lucid_tensor_data(d1);
    pd[0] = 1.0 + ldexp(1, -8) + ldexp(1, -40);  /* just above a bf16 tie */
    pd[1] = 1.0 + ldexp(1, -11) + ldexp(1, -40); /* just above an f16 tie */
    lucid_copy(ctx_, b1, d1);
    lucid_copy(ctx_, h1, d1);
    uint16_t rb = ((uint16_t *)lucid_tensor_data(b1))[0];
    uint16_t rh = ((uint16_t *)lucid_tensor_data(h1))[1];
    CHECK("copy.f64_to_half_correct_rounding", rb == 0x3f81 && rh == 0x3c01,
          "bf16 0x%04x (want 0x3f81), f16 0x%04x (want 0x3c01)", rb, rh);
    lucid_fill(ctx_, b1, pd[0]);
    lucid_fill(ctx_, h1, pd[1]);
    rb = ((uint16_t *)lucid_tensor_data(b1))[1];
    rh = ((uint16_t *)lucid_tensor_data(h1))[0];
    CHECK("fill.f64_to_half_correct_rounding", rb == 0x3f81 && rh == 0x3c01,
          "bf16 0x%04x, f16 0x%04x", rb, rh);
    lucid_tensor_release(d1);
    lucid_tensor_release(b1);
    lucid_tensor_release(h1);

    /* strided and broadcast sources, reshaping copy */
    lucid_tensor *src0 = mk2(LUCID_F32, 5, 7), *src = NULL, *dst = mk2(LUCID_F64, 7, 5);
    for (int64_t i = 0; i < 35; i++) lucid_cpu_set(src0, i, (double)i);
    lucid_tensor_transpose(ctx_, src0, 0, 1, &src);
    lucid_copy(ctx_, dst, src);
    int ok = 1;
    for (int64_t i = 0; i < 35; i++) ok &= lucid_cpu_get(dst, i) == (double)((i % 5) * 7 + i / 5);
    CHECK("copy.transposed_source", ok, "transposed copy wrong");
    lucid_tensor *row = mk2(LUCID_F32, 1, 5), bv;
    for (int64_t i = 0; i < 5; i++) lucid_cpu_set(row, i, (double)(i + 1));
    lucid_tensor_broadcast_view(ctx_, row, 2, dst->shape, &bv);
    lucid_copy(ctx_, dst, &bv);
    ok = 1;
    for (int64_t i = 0; i < 35; i++) ok &= lucid_cpu_get(dst, i) == (double)(i % 5 + 1);
    CHECK("copy.broadcast_source", ok, "stride-0 source copy wrong");
    int64_t flat[1] = {35};
    lucid_tensor *fl = mk(LUCID_F32, 1, flat);
    CHECK_STATUS("copy.reshaping_contiguous", ctx_, lucid_copy(ctx_, fl, src0));
    ok = 1;
    for (int64_t i = 0; i < 35; i++) ok &= lucid_cpu_get(fl, i) == (double)i;
    CHECK("copy.reshaping_values", ok, "reshaping copy wrong");
    lucid_status s = lucid_copy(ctx_, fl, src);
    CHECK("copy.shape_mismatch_error", s == LUCID_ERR_ARG &&
                                           strstr(lucid_ctx_error(ctx_), "[35]") &&
                                           strstr(lucid_ctx_error(ctx_), "[7,5]"),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor *ts2[] = {src0, src, dst, row, fl};
    for (size_t k = 0; k < 5; k++) lucid_tensor_release(ts2[k]);
}

static void test_fill(void) {
    int ok = 1;
    for (int d = 0; d < LUCID_DTYPE_COUNT; d++) {
        lucid_tensor *t = mk2((lucid_dtype)d, 9, 11), *v = NULL;
        lucid_fill(ctx_, t, 0.0);
        lucid_tensor_narrow(ctx_, t, 1, 3, 5, &v);
        lucid_fill(ctx_, v, 42.0);
        for (int64_t i = 0; i < 99; i++) {
            int64_t c = i % 11;
            ok &= lucid_cpu_get(t, i) == ((c >= 3 && c < 8) ? 42.0 : 0.0);
        }
        lucid_tensor_release(v);
        lucid_tensor_release(t);
    }
    CHECK("fill.all_dtypes_strided_view", ok, "fill wrote wrong values or outside the view");
    lucid_tensor *z = NULL;
    int64_t s[1] = {1000};
    lucid_tensor_zeros(ctx_, CPU, LUCID_F16, 1, s, &z);
    ok = 1;
    for (int64_t i = 0; i < 1000; i++) ok &= lucid_cpu_get(z, i) == 0.0;
    lucid_fill(ctx_, z, -0.0);
    ok &= ((uint16_t *)lucid_tensor_data(z))[999] == 0x8000;
    lucid_fill(ctx_, z, 1e9);
    ok &= isinf(lucid_cpu_get(z, 5));
    CHECK("fill.zeros_negzero_overflow", ok, "zeros / -0 / overflow fill wrong");
    lucid_tensor_release(z);
}

/* ----------------------------------------------------------- reductions */

static double ref_reduce(lucid_reduce_op op, const double *x, int64_t n) {
    double s = 0, m = op == LUCID_REDUCE_MAX ? -INFINITY : INFINITY;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) nan = 1;
        if (op == LUCID_REDUCE_SUMSQ || op == LUCID_REDUCE_NORM2) s += x[i] * x[i];
        else s += x[i];
        if (x[i] > m && op == LUCID_REDUCE_MAX) m = x[i];
        if (x[i] < m && op == LUCID_REDUCE_MIN) m = x[i];
    }
    switch (op) {
    case LUCID_REDUCE_SUM: case LUCID_REDUCE_SUMSQ: return s;
    case LUCID_REDUCE_MEAN: return s / (double)n;
    case LUCID_REDUCE_NORM2: return sqrt(s);
    default: return nan ? NAN : m;
    }
}

static void test_reduce(void) {
    char name[96];
    int64_t sh[3] = {7, 300, 5};
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        lucid_tensor *a0 = mk(dt, 3, sh), *a = NULL;
        rand_fill(a0, -3, 3, 0);
        int perm[3] = {2, 0, 1}; /* a strided [5,7,300] view */
        lucid_tensor_permute(ctx_, a0, perm, &a);
        int64_t n = 7 * 300 * 5;
        double *x = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) x[i] = lucid_cpu_get(a, i);
        tol tl = tol_of(dt);
        tol tacc = {dt == LUCID_F64 ? 1e-10 : tl.atol * 10, tl.rtol}; /* sums of 1e4 terms */
        for (int op = 0; op < LUCID_REDUCE_OP_COUNT; op++) {
            lucid_reduce_op rop = (lucid_reduce_op)op;
            double ref = ref_reduce(rop, x, n);
            /* out in the input's dtype */
            lucid_tensor *o = mk(dt, 0, NULL);
            lucid_status s = lucid_reduce_all(ctx_, rop, o, a);
            name_fmt(name, sizeof name, "reduce_all", RED_NAMES[op], dt, "strided");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, &ref, tacc);
            /* reduce_item: f64 accumulation read back exactly */
            double item = NAN;
            s = lucid_reduce_item(ctx_, rop, a, &item);
            name_fmt(name, sizeof name, "reduce_item", RED_NAMES[op], dt, NULL);
            CHECK(name, s == LUCID_OK && close_to(item, ref, (tol){1e-9, 1e-12}),
                  "got %.17g want %.17g", item, ref);
            lucid_tensor_release(o);
            /* reduce_dim over each dim of the view, keepdim 0 and 1 */
            for (int dim = 0; dim < 3; dim++) {
                for (int keep = 0; keep < 2; keep++) {
                    int64_t osh[3];
                    int on = 0;
                    for (int d = 0; d < 3; d++) {
                        if (d == dim) { if (keep) osh[on++] = 1; }
                        else osh[on++] = a->shape[d];
                    }
                    lucid_tensor *od = mk(dt, on, osh);
                    int64_t no = lucid_tensor_numel(od), len = a->shape[dim];
                    double *r = malloc(sizeof(double) * (size_t)no);
                    double *col = malloc(sizeof(double) * (size_t)len);
                    int64_t st[3] = {a->shape[1] * a->shape[2], a->shape[2], 1};
                    int64_t k = 0;
                    for (int64_t i0 = 0; i0 < (dim == 0 ? 1 : a->shape[0]); i0++)
                        for (int64_t i1 = 0; i1 < (dim == 1 ? 1 : a->shape[1]); i1++)
                            for (int64_t i2 = 0; i2 < (dim == 2 ? 1 : a->shape[2]); i2++) {
                                for (int64_t j = 0; j < len; j++) {
                                    int64_t idx[3] = {i0, i1, i2};
                                    idx[dim] = j;
                                    col[j] = x[idx[0] * st[0] + idx[1] * st[1] + idx[2] * st[2]];
                                }
                                r[k++] = ref_reduce(rop, col, len);
                            }
                    s = lucid_reduce_dim(ctx_, rop, od, a, dim, keep);
                    char tag[32];
                    snprintf(tag, sizeof tag, "dim%d.keep%d", dim, keep);
                    name_fmt(name, sizeof name, "reduce_dim", RED_NAMES[op], dt, tag);
                    if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
                    else check_vals(name, od, r, tacc);
                    free(r);
                    free(col);
                    lucid_tensor_release(od);
                }
            }
        }
        free(x);
        lucid_tensor_release(a0);
        lucid_tensor_release(a);
    }

    /* NaN propagates through every reduction, max/min included, wherever it is */
    int64_t n1[1] = {1001};
    lucid_tensor *v = mk(LUCID_F32, 1, n1), *o = mk(LUCID_F32, 0, NULL);
    int ok = 1;
    int64_t where[3] = {0, 500, 1000};
    for (int w = 0; w < 3; w++) {
        rand_fill(v, -1, 1, 0);
        lucid_cpu_set(v, where[w], NAN);
        for (int op = 0; op < LUCID_REDUCE_OP_COUNT; op++) {
            lucid_reduce_all(ctx_, (lucid_reduce_op)op, o, v);
            ok &= isnan(lucid_cpu_get(o, 0));
        }
    }
    CHECK("reduce_all.nan_propagates", ok, "a reduction dropped a NaN");
    lucid_tensor *m = mk2(LUCID_F32, 4, 6), *mo = NULL;
    int64_t s6[1] = {6};
    mo = mk(LUCID_F32, 1, s6);
    rand_fill(m, -1, 1, 0);
    lucid_cpu_set(m, 0 * 6 + 2, NAN); /* column 2, first row */
    ok = 1;
    for (int op = LUCID_REDUCE_MAX; op <= LUCID_REDUCE_MIN; op++) {
        lucid_reduce_dim(ctx_, (lucid_reduce_op)op, mo, m, 0, 0);
        for (int j = 0; j < 6; j++) ok &= (j == 2) == (isnan(lucid_cpu_get(mo, j)) != 0);
    }
    CHECK("reduce_dim.nan_propagates_per_slice", ok, "NaN lost or leaked across slices");
    /* empty inputs */
    int64_t z0[2] = {3, 0}, z3[1] = {3};
    lucid_tensor *e = mk(LUCID_F32, 2, z0), *eo = mk(LUCID_F32, 1, z3);
    double item = -1;
    lucid_status s = lucid_reduce_item(ctx_, LUCID_REDUCE_SUM, e, &item);
    lucid_fill(ctx_, eo, 5.0);
    lucid_status s2 = lucid_reduce_dim(ctx_, LUCID_REDUCE_SUM, eo, e, 1, 0);
    lucid_status s3 = lucid_reduce_item(ctx_, LUCID_REDUCE_MAX, e, &item);
    CHECK("reduce.empty", s == LUCID_OK && s2 == LUCID_OK && lucid_cpu_get(eo, 1) == 0.0 &&
                              s3 == LUCID_ERR_ARG,
          "empty sum/max handling wrong (%d %d %d)", s, s2, s3);
    lucid_tensor *bad = mk2(LUCID_F32, 7, 1);
    s = lucid_reduce_dim(ctx_, LUCID_REDUCE_SUM, bad, m, 1, 1);
    CHECK("reduce_dim.shape_error", s == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx_), "[4,6]"),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor *ts[] = {v, o, m, mo, e, eo, bad};
    for (size_t k = 0; k < 7; k++) lucid_tensor_release(ts[k]);
}

/* --------------------------------------------------------------- matmul */

/* out = alpha*op(a)@op(b) + beta*out0 in double, all [batch, M, N]. */
static void ref_matmul(const lucid_tensor *a, const lucid_tensor *b, int ta, int tb,
                       double alpha, double beta, const double *out0, int64_t batch,
                       int64_t M, int64_t N, int64_t K, double *r) {
    for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ia = ta ? (bi * K + k) * M + i : (bi * M + i) * K + k;
                    int64_t ib = tb ? (bi * N + j) * K + k : (bi * K + k) * N + j;
                    acc += lucid_cpu_get(a, ia) * lucid_cpu_get(b, ib);
                }
                int64_t io = (bi * M + i) * N + j;
                r[io] = alpha * acc + (beta != 0 ? beta * out0[io] : 0.0);
            }
}

static tol mm_tol(lucid_dtype dt, int64_t K) {
    tol t = tol_of(dt);
    if (dt == LUCID_F64) t.atol = 1e-13 * (double)K;
    else if (dt == LUCID_F32) t.atol = 2e-6 * (double)K;
    else t.atol = 1e-6 * (double)K; /* f32 accumulation, then one rounding */
    return t;
}

static void test_matmul(void) {
    char name[96];
    const int64_t B0 = 2, B1 = 3, M = 5, K = 7, N = 4;
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t sa[4] = {B0, B1, ta ? K : M, ta ? M : K};
                int64_t sb[4] = {B0, B1, tb ? N : K, tb ? K : N};
                int64_t so[4] = {B0, B1, M, N};
                lucid_tensor *a = mk(dt, 4, sa), *b = mk(dt, 4, sb), *o = mk(dt, 4, so);
                rand_fill(a, -1, 1, 0);
                rand_fill(b, -1, 1, 0);
                rand_fill(o, -1, 1, 0);
                int64_t no = B0 * B1 * M * N;
                double *o0 = malloc(sizeof(double) * (size_t)no), *r = malloc(sizeof(double) * (size_t)no);
                for (int64_t i = 0; i < no; i++) o0[i] = lucid_cpu_get(o, i);
                ref_matmul(a, b, ta, tb, 0.5, 0.25, o0, B0 * B1, M, N, K, r);
                lucid_status s = lucid_matmul(ctx_, o, a, b, ta, tb, 0.5, 0.25);
                char tag[32];
                snprintf(tag, sizeof tag, "batched.t%d%d.alpha_beta", ta, tb);
                name_fmt(name, sizeof name, "matmul", "ref", dt, tag);
                if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
                else check_vals(name, o, r, mm_tol(dt, K));
                /* beta = 0 ignores old contents, NaN included */
                lucid_fill(ctx_, o, NAN);
                ref_matmul(a, b, ta, tb, 1.0, 0.0, o0, B0 * B1, M, N, K, r);
                s = lucid_matmul(ctx_, o, a, b, ta, tb, 1.0, 0.0);
                snprintf(tag, sizeof tag, "batched.t%d%d.beta0_nan_out", ta, tb);
                name_fmt(name, sizeof name, "matmul", "ref", dt, tag);
                if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
                else check_vals(name, o, r, mm_tol(dt, K));
                free(o0);
                free(r);
                lucid_tensor_release(a);
                lucid_tensor_release(b);
                lucid_tensor_release(o);
            }
        /* views: a column-major (transposed view), b narrowed (ld > N),
         * then layouts BLAS cannot read in place (copied first) */
        {
            const int64_t m = 65, k = 33, n = 17;
            lucid_tensor *at0 = mk2(dt, k, m), *a = NULL, *bw = mk2(dt, k, n + 6), *b = NULL;
            lucid_tensor *o = mk2(dt, m, n);
            rand_fill(at0, -1, 1, 0);
            rand_fill(bw, -1, 1, 0);
            lucid_tensor_transpose(ctx_, at0, 0, 1, &a);
            lucid_tensor_narrow(ctx_, bw, 1, 3, n, &b);
            lucid_tensor *ac = NULL, *bc = NULL;
            lucid_tensor_clone(ctx_, a, &ac);
            lucid_tensor_clone(ctx_, b, &bc);
            double *r = malloc(sizeof(double) * (size_t)(m * n));
            ref_matmul(ac, bc, 0, 0, 1.0, 0.0, NULL, 1, m, n, k, r);
            lucid_status s = lucid_matmul(ctx_, o, a, b, 0, 0, 1.0, 0.0);
            name_fmt(name, sizeof name, "matmul", "views", dt, "colmajor_a_ld_b");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, mm_tol(dt, k));
            /* every other column of a wider tensor: no unit stride at all */
            lucid_tensor *w = mk(dt, 3, (int64_t[]){m, k, 2}), *a2 = NULL;
            rand_fill(w, -1, 1, 0);
            lucid_tensor_select(ctx_, w, 2, 1, &a2); /* [m,k] strides [2k,2] */
            lucid_tensor *a2c = NULL;
            lucid_tensor_clone(ctx_, a2, &a2c);
            ref_matmul(a2c, bc, 0, 0, 1.0, 0.0, NULL, 1, m, n, k, r);
            s = lucid_matmul(ctx_, o, a2, b, 0, 0, 1.0, 0.0);
            name_fmt(name, sizeof name, "matmul", "views", dt, "gapped_copy_path");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, mm_tol(dt, k));
            free(r);
            lucid_tensor *ts[] = {at0, a, bw, b, o, ac, bc, w, a2, a2c};
            for (size_t i = 0; i < 10; i++) lucid_tensor_release(ts[i]);
        }
        /* stride-0 batch dim (one matrix broadcast over the batch) */
        {
            lucid_tensor *a1 = mk(dt, 3, (int64_t[]){1, M, K}), *b = mk(dt, 3, (int64_t[]){3, K, N});
            lucid_tensor *o = mk(dt, 3, (int64_t[]){3, M, N}), av;
            rand_fill(a1, -1, 1, 0);
            rand_fill(b, -1, 1, 0);
            lucid_tensor_broadcast_view(ctx_, a1, 3, (int64_t[]){3, M, K}, &av);
            lucid_tensor *ac = NULL;
            lucid_tensor_clone(ctx_, &av, &ac);
            double r[3 * M * N];
            ref_matmul(ac, b, 0, 0, 1.0, 0.0, NULL, 3, M, N, K, r);
            lucid_status s = lucid_matmul(ctx_, o, &av, b, 0, 0, 1.0, 0.0);
            name_fmt(name, sizeof name, "matmul", "views", dt, "broadcast_batch");
            if (s != LUCID_OK) TEST_FAIL(name, "%s", lucid_ctx_error(ctx_));
            else check_vals(name, o, r, mm_tol(dt, K));
            lucid_tensor_release(a1);
            lucid_tensor_release(b);
            lucid_tensor_release(o);
            lucid_tensor_release(ac);
        }
    }
    /* K = 0: out = beta * out */
    lucid_tensor *a = mk2(LUCID_F32, 3, 0), *b = mk2(LUCID_F32, 0, 2), *o = mk2(LUCID_F32, 3, 2);
    lucid_fill(ctx_, o, 4.0);
    lucid_status s = lucid_matmul(ctx_, o, a, b, 0, 0, 1.0, 0.5);
    CHECK("matmul.k0_scales_out", s == LUCID_OK && lucid_cpu_get(o, 5) == 2.0,
          "K=0 gave %g (%s)", lucid_cpu_get(o, 5), lucid_ctx_error(ctx_));
    lucid_tensor *b2 = mk2(LUCID_F32, 5, 2);
    s = lucid_matmul(ctx_, o, o, b2, 0, 0, 1.0, 0.0);
    CHECK("matmul.shape_error", s == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx_), "3x2") &&
                                    strstr(lucid_ctx_error(ctx_), "5x2"),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor_release(a);
    lucid_tensor_release(b);
    lucid_tensor_release(o);
    lucid_tensor_release(b2);
    /* a context with cpu_threads set: BLAS threading does not change results */
    lucid_ctx_options opt = lucid_ctx_options_default();
    opt.cpu_threads = 2;
    lucid_ctx *c2 = NULL;
    lucid_ctx_create(&opt, &c2, NULL, 0);
    lucid_tensor *x = NULL, *y = NULL, *z = NULL;
    int64_t sq[2] = {128, 128};
    lucid_tensor_empty(c2, CPU, LUCID_F64, 2, sq, &x);
    lucid_tensor_empty(c2, CPU, LUCID_F64, 2, sq, &y);
    lucid_tensor_empty(c2, CPU, LUCID_F64, 2, sq, &z);
    rand_fill(x, -1, 1, 0);
    rand_fill(y, -1, 1, 0);
    double *r = malloc(sizeof(double) * 128 * 128);
    ref_matmul(x, y, 0, 1, 1.0, 0.0, NULL, 1, 128, 128, 128, r);
    s = lucid_matmul(c2, z, x, y, 0, 1, 1.0, 0.0);
    if (s != LUCID_OK) TEST_FAIL("matmul.cpu_threads_ctx", "%s", lucid_ctx_error(c2));
    else check_vals("matmul.cpu_threads_ctx", z, r, mm_tol(LUCID_F64, 128));
    free(r);
    lucid_tensor_release(x);
    lucid_tensor_release(y);
    lucid_tensor_release(z);
    lucid_ctx_release(c2);
}

/* --------------------------------------------------------------- random */

static double philox_uniform(uint64_t seed, uint64_t ctr, double lo, double hi) {
    uint32_t w[4];
    lucid_philox4x32(seed, ctr, w);
    return lo + (hi - lo) * ((double)(w[0] >> 8) * (1.0 / 16777216.0));
}

static double philox_normal(uint64_t seed, uint64_t ctr, double mean, double std) {
    uint32_t w[4];
    lucid_philox4x32(seed, ctr, w);
    double u1 = ((double)(w[0] >> 8) + 1.0) * (1.0 / 16777216.0);
    double u2 = (double)(w[1] >> 8) * (1.0 / 16777216.0);
    return mean + std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void moments(const lucid_tensor *t, double *mean, double *sd, double *mn, double *mx) {
    int64_t n = lucid_tensor_numel(t);
    double s = 0, s2 = 0;
    *mn = INFINITY;
    *mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = lucid_cpu_get(t, i);
        s += v;
        s2 += v * v;
        if (v < *mn) *mn = v;
        if (v > *mx) *mx = v;
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

static void test_random(void) {
    int64_t n1m[1] = {1000000};
    lucid_tensor *u = mk(LUCID_F32, 1, n1m), *g = mk(LUCID_F32, 1, n1m);
    double mean, sd, mn, mx;
    CHECK_STATUS("rand.uniform_run", ctx_, lucid_rand_uniform(ctx_, u, 42, 0, 0.0, 1.0));
    moments(u, &mean, &sd, &mn, &mx);
    /* std error of the mean 2.9e-4: bounds are ~7 sigma */
    CHECK("rand.uniform_stats_1e6", fabs(mean - 0.5) < 2e-3 &&
                                        fabs(sd - sqrt(1.0 / 12)) < 2e-3 && mn >= 0 && mx < 1,
          "mean %.5f sd %.5f min %g max %g", mean, sd, mn, mx);
    CHECK_STATUS("rand.normal_run", ctx_, lucid_rand_normal(ctx_, g, 42, 0, 2.0, 3.0));
    moments(g, &mean, &sd, &mn, &mx);
    CHECK("rand.normal_stats_1e6", fabs(mean - 2.0) < 0.02 && fabs(sd - 3.0) < 0.02 &&
                                       mn < 2.0 - 4 * 3.0 && mx > 2.0 + 4 * 3.0,
          "mean %.5f sd %.5f min %g max %g", mean, sd, mn, mx);
    /* the documented formula, element by element */
    int ok = 1;
    for (int64_t i = 0; i < 1000000; i += 997) {
        ok &= lucid_cpu_get(u, i) == (double)(float)philox_uniform(42, (uint64_t)i, 0, 1);
        ok &= lucid_cpu_get(g, i) == (double)(float)philox_normal(42, (uint64_t)i, 2, 3);
    }
    CHECK("rand.documented_formula", ok, "values differ from lucid.h's formula");
    lucid_tensor_release(u);
    lucid_tensor_release(g);

    /* exact reproducibility and the offset property, each dtype */
    for (int di = 0; di < 4; di++) {
        lucid_dtype dt = FLOATS[di];
        char name[96];
        const int64_t n = 3000, k = 777;
        int64_t sn[1] = {n}, snk[1] = {n + k};
        lucid_tensor *a = mk(dt, 1, sn), *b = mk(dt, 1, sn), *c = mk(dt, 1, snk);
        for (int normal = 0; normal < 2; normal++) {
            lucid_status (*fn)(lucid_ctx *, lucid_tensor *, uint64_t, uint64_t, double, double) =
                normal ? lucid_rand_normal : lucid_rand_uniform;
            fn(ctx_, a, 0xdeadbeefcafeull, k, -1.0, 2.0);
            fn(ctx_, b, 0xdeadbeefcafeull, k, -1.0, 2.0);
            fn(ctx_, c, 0xdeadbeefcafeull, 0, -1.0, 2.0);
            size_t es = lucid_dtype_size(dt);
            int same = memcmp(lucid_tensor_data(a), lucid_tensor_data(b), (size_t)n * es) == 0;
            int shift = memcmp(lucid_tensor_data(a), (char *)lucid_tensor_data(c) + k * es,
                               (size_t)n * es) == 0;
            fn(ctx_, b, 0xdeadbeefcaffull, k, -1.0, 2.0);
            int differ = memcmp(lucid_tensor_data(a), lucid_tensor_data(b), (size_t)n * es) != 0;
            name_fmt(name, sizeof name, "rand", normal ? "normal" : "uniform", dt,
                     "reproducible_offset_shift");
            CHECK(name, same && shift && differ, "same %d offset-shift %d seed-differs %d",
                  same, shift, differ);
        }
        /* half dtypes: the f64 value rounded once (equals an f64 fill cast) */
        lucid_tensor *d = mk(LUCID_F64, 1, sn), *h = mk(dt, 1, sn);
        lucid_rand_normal(ctx_, d, 5, 9, 0.0, 1.0);
        lucid_rand_normal(ctx_, a, 5, 9, 0.0, 1.0);
        lucid_copy(ctx_, h, d);
        name_fmt(name, sizeof name, "rand", "normal", dt, "rounded_once_from_f64");
        CHECK(name, memcmp(lucid_tensor_data(a), lucid_tensor_data(h),
                           (size_t)n * lucid_dtype_size(dt)) == 0,
              "fill differs from the f64 draw rounded to %s", lucid_dtype_name(dt));
        lucid_tensor *ts[] = {a, b, c, d, h};
        for (size_t i = 0; i < 5; i++) lucid_tensor_release(ts[i]);
    }
    /* a strided destination draws in logical row-major order */
    lucid_tensor *t0 = mk2(LUCID_F64, 30, 20), *t = NULL;
    lucid_tensor_transpose(ctx_, t0, 0, 1, &t); /* [20,30] view */
    lucid_rand_uniform(ctx_, t, 3, 100, 0.0, 1.0);
    ok = 1;
    for (int64_t i = 0; i < 600; i++) ok &= lucid_cpu_get(t, i) == philox_uniform(3, 100 + (uint64_t)i, 0, 1);
    CHECK("rand.strided_logical_order", ok, "strided fill not in logical order");
    lucid_status s = lucid_rand_uniform(ctx_, t, 3, 0, 1.0, 0.0);
    CHECK("rand.bad_range_error", s == LUCID_ERR_ARG, "lo > hi accepted");
    lucid_tensor_release(t0);
    lucid_tensor_release(t);
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx_, err, sizeof err) != LUCID_OK) {
        printf("not ok ctx.create: %s\n", err);
        return 1;
    }
    lucid_memory_stats st0, st1;
    lucid_memory_stats_get(ctx_, CPU, &st0);
    test_binary();
    test_unary();
    test_axpy_mixed();
    test_threaded();
    test_mixed_inputs();
    test_nan_semantics();
    test_copy_cast();
    test_fill();
    test_reduce();
    test_matmul();
    test_random();
    lucid_memory_stats_get(ctx_, CPU, &st1);
    CHECK("memory.no_leaks", st1.allocated == st0.allocated,
          "cpu allocated %llu at start, %llu at the end",
          (unsigned long long)st0.allocated, (unsigned long long)st1.allocated);
    lucid_ctx_release(ctx_);
    return test_exit();
}
