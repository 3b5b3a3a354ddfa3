/*
 * conv_col_env.h — the pass mask LUCID_CONV_COL should give (the contract of
 * lucid_conv_col_switch, cuda/nn_conv_col.cuh), derived here independently
 * of the engine's parser for spec/c/test_conv_col_maps.cu and
 * spec/c/test_conv_col_cuda.c: unset, "" or "1": 7 (every pass); "0": 0;
 * a set of the letters f (1), d (2), w (4), each at most once: their mask;
 * anything else: -1.  C and C++.
 */
#ifndef LUCID_SPEC_CONV_COL_ENV_H
#define LUCID_SPEC_CONV_COL_ENV_H

#include <string.h>

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

#endif
