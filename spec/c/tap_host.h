/*
 * tap_host.h — the TAP helpers of the host-only .cu test programs (the
 * emulations of the CUDA kernels' index maps: test_conv_col_maps.cu,
 * test_conv_gemm_split.cu, test_conv_small_emu.cu): ok() prints one
 * "ok NAME" / "not ok NAME: WHY" line and counts failures; WHY(...) and
 * NAME(...) format into static buffers; urand(lo, hi) is a splitmix64
 * stream of uniform doubles from TAP_HOST_SEED (define it before the
 * include to give a program its own stream).  Include once per program.
 */
#ifndef LUCID_SPEC_TAP_HOST_H
#define LUCID_SPEC_TAP_HOST_H

#include <cstdio>

#ifndef TAP_HOST_SEED
#define TAP_HOST_SEED 0x9e3779b97f4a7c15ull
#endif

static int failures = 0;
static void ok(bool good, const char *name, const char *why) {
    if (good) {
        printf("ok %s\n", name);
    } else {
        printf("not ok %s: %s\n", name, why);
        failures++;
    }
}

static char why[1536]; /* room for a quoted g_msg (host_standins.h) */
#define WHY(...) (snprintf(why, sizeof why, __VA_ARGS__), why)
static char nm[640];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)

static unsigned long long rng = TAP_HOST_SEED;
static double urand(double lo, double hi) {
    unsigned long long z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) * (1.0 / 9007199254740992.0));
}

#endif
