/*
 * conv_wgrad_split.h — what the filter-gradient split of the GEMM routes
 * (cuda/nn_conv_gemm.cuh, lucid_conv_gemm_wgrad_splits) should give,
 * derived here independently of the engine's code for
 * spec/c/test_conv_gemm_split.cu (which checks the engine's rule and its
 * environment switch against these) and spec/c/test_conv_col_maps.cu (whose
 * stand-in for the rule, nn_conv_gemm.cu not being linked there, is this
 * one): the least columns per chunk that LUCID_WGRAD_SPLIT gives
 * (conv_wgrad_env_chunk) and the chunks per image (conv_wgrad_splits).
 * C and C++.
 */
#ifndef LUCID_SPEC_CONV_WGRAD_SPLIT_H
#define LUCID_SPEC_CONV_WGRAD_SPLIT_H

#include <limits.h>
#include <stdint.h>

/* The contract of LUCID_WGRAD_SPLIT: unset or "": 1600; a string of decimal
 * digits only, at most INT_MAX: its value (0: no split); anything else (a
 * sign, a space, a letter, a larger number): -1 (the filter gradient then
 * fails with ERR_ARG naming the value). */
static int64_t conv_wgrad_env_chunk(const char *env) {
    if (!env || !env[0]) return 1600;
    int64_t v = 0;
    for (const char *c = env; *c; c++) {
        if (*c < '0' || *c > '9') return -1;
        v = v * 10 + (*c - '0');
        if (v > INT_MAX) return -1;
    }
    return v;
}

/* S for an N x [Cout, Cin] filter gradient over P columns per image and the
 * least chunk L: the largest power of two t <= 64 such that P is a multiple
 * of 8t (every chunk a whole number of 16-byte vectors), P/t >= L and the
 * N*t partials [Cout, Cin] hold at most 2^26 floats; 1 when none is, or
 * when L <= 0 (no split, or an unknown value).  Each condition also holds
 * for every smaller power of two, so this is where doubling from 1 stops. */
static int64_t conv_wgrad_splits(int64_t N, int64_t Cout, int64_t Cin, int64_t P, int64_t L) {
    if (L <= 0) return 1;
    for (int64_t t = 64; t > 1; t /= 2)
        if (P % (8 * t) == 0 && P / t >= L && N * Cout * Cin <= ((int64_t)1 << 26) / t) return t;
    return 1;
}

#endif
