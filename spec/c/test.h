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

static inline int test_exit(void) { return test_failures_ ? 1 : 0; }

#endif
