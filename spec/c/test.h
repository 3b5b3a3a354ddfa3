/*
 * test.h — the C unit-test convention of lucid (spec/c/test_*.c).
 *
 * Each test file is one executable. A check prints one line:
 *     ok <name>
 *     not ok <name>: <reason>
 *     skip <name>: <reason>          (visible skip, e.g. no GPU)
 * and the program exits non-zero when any check failed. spec/run_tests.sh
 * counts these lines into the final "N passed, N failed" summary.
 */
#ifndef LUCID_TEST_H
#define LUCID_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lucid.h"

static int test_failures_ = 0;

#define TEST_OK(name) printf("ok %s\n", name)
#define TEST_FAIL(name, ...)                                                  \
    do {                                                                      \
        printf("not ok %s: ", name);                                          \
        printf(__VA_ARGS__);                                                  \
        printf(" (%s:%d)\n", __FILE__, __LINE__);                             \
        test_failures_++;                                                     \
    } while (0)
#define TEST_SKIP(name, ...)                                                  \
    do {                                                                      \
        printf("skip %s: ", name);                                            \
        printf(__VA_ARGS__);                                                  \
        printf("\n");                                                         \
    } while (0)

/* Check a condition; on failure print the formatted reason. */
#define CHECK(name, cond, ...)                                                \
    do {                                                                      \
        if (cond) TEST_OK(name);                                              \
        else TEST_FAIL(name, __VA_ARGS__);                                    \
    } while (0)

/* Check a lucid_status call; on failure print the context's message. */
#define CHECK_STATUS(name, ctx, expr)                                         \
    do {                                                                      \
        lucid_status st_ = (expr);                                            \
        if (st_ == LUCID_OK) TEST_OK(name);                                   \
        else TEST_FAIL(name, "%s: %s", lucid_status_name(st_),                \
                       lucid_ctx_error(ctx));                                 \
    } while (0)

/* Relative error |a-b| / max(|b|, tiny); NaN anywhere gives +inf. */
static inline double test_relerr(double a, double b) {
    if (isnan(a) || isnan(b)) return INFINITY;
    double d = fabs(a - b), m = fabs(b);
    return m > 1e-30 ? d / m : d;
}

/* Element i of a contiguous host tensor as double (f32, f64, bf16, f16, u8,
 * i32, i64; 0 for other dtypes). */
static inline double test_hget(const lucid_tensor *t, int64_t i) {
    const void *p = lucid_tensor_data(t);
    switch (t->dtype) {
    case LUCID_F32: return ((const float *)p)[i];
    case LUCID_F64: return ((const double *)p)[i];
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)p)[i]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)p)[i]);
    case LUCID_U8: return ((const uint8_t *)p)[i];
    case LUCID_I32: return ((const int32_t *)p)[i];
    case LUCID_I64: return (double)((const int64_t *)p)[i];
    default: return 0;
    }
}

/* Distance in units in the last place between two 16-bit floats (bf16 or
 * f16 bit patterns of one dtype). */
static inline int64_t test_ulp16(uint16_t a, uint16_t b) {
    int64_t x = (a & 0x8000) ? -(int64_t)(a & 0x7fff) : (int64_t)(a & 0x7fff);
    int64_t y = (b & 0x8000) ? -(int64_t)(b & 0x7fff) : (int64_t)(b & 0x7fff);
    return x > y ? x - y : y - x;
}

/* A fresh folder "/tmp/<prefix>_XXXXXX" written into dir[n]; 0 after printing
 * "not ok tmpdir" when it cannot be made. */
static inline int test_tmpdir(char *dir, size_t n, const char *prefix) {
    snprintf(dir, n, "/tmp/%s_XXXXXX", prefix);
    if (mkdtemp(dir)) return 1;
    printf("not ok tmpdir: %s\n", dir);
    return 0;
}

/* Remove a folder made by test_tmpdir and everything in it ("# could not
 * remove" is a comment line, not a failure). */
static inline void test_rmdir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}

/* A context on the CPU with the default options; NULL after printing
 * "not ok context: <message>". */
static inline lucid_ctx *test_cpu_ctx(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    lucid_ctx *ctx = NULL;
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) == LUCID_OK) return ctx;
    printf("not ok context: %s\n", err);
    return NULL;
}

static inline int test_exit(void) { return test_failures_ ? 1 : 0; }

#endif
