/*
 * conv_col_env.h — what the im2col conv route (cuda/nn_conv_col.cuh) should
 * do, derived here independently of the engine's code for
 * spec/c/test_conv_col_maps.cu and spec/c/test_conv_col_cuda.c: the pass
 * mask LUCID_CONV_COL gives (conv_col_env_mask) and which geometries it
 * takes the backward-data of (conv_col_dgrad_takes).  C and C++.
 */
#ifndef LUCID_SPEC_CONV_COL_ENV_H
#define LUCID_SPEC_CONV_COL_ENV_H

#include <string.h>

/* The contract of lucid_conv_col_switch: unset, "" or "1": 7 (every pass);
 * "0": 0; a set of the letters f (1), d (2), w (4), each at most once: their
 * mask; anything else: -1. */
static int conv_col_env_mask(const char *env) {
    if (!env || !env[0] || strcmp(env, "1") == 0) return 7;
    if (strcmp(env, "0") == 0) return 0;
    int m = 0;
    for (const char *c = env; *c; c++) {
        int bit = *c == 'f' ? 1 : *c == 'd' ? 2 : *c == 'w' ? 4 : 0;
        if (!bit || (m & bit)) return -1;
        m |= bit;
    }
    return m;
}

/* 1 when the route may take the backward-data of a geometry (besides the
 * alignment rules every pass shares): stride 1 and padding at most
 * (kernel-1)*dilation along both axes, so that the transposed forward has
 * padding >= 0 (nn_conv_col.cuh). */
static int conv_col_dgrad_takes(int sh, int sw, int kh, int kw, int ph, int pw, int dh, int dw) {
    return sh == 1 && sw == 1 && ph <= (kh - 1) * dh && pw <= (kw - 1) * dw;
}

#endif
