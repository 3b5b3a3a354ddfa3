/*
 * test_bn_coop_rounds.cu — host checks of the cooperative BatchNorm
 * route's grid choice (cuda/nn_norm.cuh: bn_coop_rounds, bn_coop_visit,
 * bn_coop_choose, bn_coop_queued, bn_coop_round_limit): needs nvcc, not a
 * GPU (runs in make test).  The kernels themselves are checked on the GPU
 * by spec/c/test_nn_bnsilu_cuda.c (test_coop).
 *
 *   - bn_coop_rounds, for parts 1..80, channels 1..300 and capacities from
 *     parts-1 up: 0 exactly when one column (parts blocks) exceeds the
 *     capacity; else gy columns with gy*parts <= cap, gy <= cy, the rounds
 *     returned = ceil(cy/gy), the fewest possible (ceil(cy / floor(cap /
 *     parts))), the columns spread evenly (gy = ceil(cy/rounds)), and one
 *     round exactly when the full grid parts*cy fits (then gy = cy);
 *   - the channel loop of the kernels on that grid (block (part, y) takes
 *     channels y, y+gy, ... below C, C up to 70000 with cy = min(C, 65535))
 *     visits every (part, channel) once and puts every part of a channel
 *     in one column (its barrier sees all `parts` arrivals);
 *   - bn_geom_of's parts of layer 0 (4x16x320x320): 52, with the test's
 *     copy of the partition rule;
 *   - the choice among candidate kernels (occupancy caches preset, so no
 *     CUDA call is made) with the H200's numbers (132 SMs; nvcc 13.0
 *     register counts, cuda/nn_norm.cuh): layer 0's forward takes the held
 *     kernel and backward the held lean copy, both on 52 x 8 (2 rounds);
 *     shapes whose full grid fits keep the first such candidate (the
 *     choice before the rounds existed); fewest rounds win over the order
 *     (the plain forward of 4x11x320x320 reading x again in 1 round rather
 *     than the held one in 2); LUCID_BN_COOP_LOOP=0 (limit 1) launches only
 *     full grids; one column too large launches nothing; a refused
 *     candidate (cudaErrorCooperativeLaunchTooLarge) passes to the next of
 *     as few rounds and is never counted again;
 *   - bn_coop_round_limit reads LUCID_BN_COOP_LOOP ("1": no limit, else 1: opt-in).
 * And the cluster route's host rules (cuda/nn_norm.cuh; the kernels are
 * checked on the GPU by test_nn_bnsilu_cuda.c, test_cluster):
 *   - bn_clu_size for parts 0..300 and every csmax up to BN_CLU_MAX: no
 *     cluster below 2 parts or past BN_CLU_ROUNDS rounds, else the fewest
 *     rounds, the parts spread evenly, every part computed once by the
 *     block the fold's DSMEM map names, in a slot below BN_CLU_ROUNDS; the
 *     model's shapes (layer 0: 13 blocks of 4 parts, 160x160: 16 of 1,
 *     80x80: 4 of 1);
 *   - bn_clu_choose tries the size for 16 blocks, then the portable one
 *     when it differs, and stops at the first launched;
 *   - bn_clu_queued: a refused cluster size is no launch and is cached;
 *   - bn_clu_fits with preset caches (no CUDA call): cached answers, no
 *     question asked while capturing, non-portable sizes only with the
 *     attribute set;
 *   - bn_cluster_parse, the rule of LUCID_BN_CLUSTER;
 *   - bn_unroll, the rule of LUCID_BN_UNROLL (3 keeps the default, read once).
 */
#include "nn_norm.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tap_host.h"

/* ------------------------------------------------------------ bn_coop_rounds */

static void check_rounds(void) {
    int bad = 0;
    char first[256] = "";
    for (int64_t parts = 1; parts <= 80 && !bad; parts++)
        for (int64_t cy = 1; cy <= 300; cy++)
            for (int64_t cap = parts - 1; cap <= parts * 310; cap += 1 + cap / 7) {
                unsigned gy = 123;
                int64_t r = bn_coop_rounds(parts, cy, cap, &gy);
                const char *why_bad = NULL;
                if (cap < parts) {
                    if (r != 0 || gy != 0) why_bad = "one column too large, yet rounds";
                } else {
                    int64_t cols = cap / parts, fewest = (cy + cols - 1) / cols;
                    if (r < 1 || gy < 1 || (int64_t)gy > cy) why_bad = "gy out of 1..cy";
                    else if ((int64_t)gy * parts > cap) why_bad = "grid exceeds the capacity";
                    else if (r != (cy + gy - 1) / gy) why_bad = "rounds != ceil(cy/gy)";
                    else if (r != fewest) why_bad = "not the fewest rounds";
                    else if ((int64_t)gy != (cy + r - 1) / r) why_bad = "columns not spread evenly";
                    else if ((r == 1) != (parts * cy <= cap) || (r == 1 && (int64_t)gy != cy))
                        why_bad = "one round not exactly the full grid";
                }
                if (why_bad && !bad++)
                    snprintf(first, sizeof first,
                             "parts %lld, cy %lld, cap %lld: %s (rounds %lld, gy %u)",
                             (long long)parts, (long long)cy, (long long)cap, why_bad,
                             (long long)r, gy);
            }
    ok(bad == 0, "bn_coop_rounds: fewest rounds, columns spread evenly, within the capacity",
       WHY("%d bad; first: %s", bad, first));
}

/* The kernels' channel loop on grid (parts, gy): every (part, channel)
 * once, each channel's parts all in the column c % gy. */
static void check_loop(void) {
    static const int64_t CS[] = {1, 2, 3, 16, 17, 100, 65535, 65536, 70000};
    int bad = 0;
    char first[256] = "";
    for (int64_t C : CS)
        for (int64_t parts = 1; parts <= 7; parts += 3)
            for (int64_t cap = parts; cap <= parts * 40; cap += parts + 1) {
                int64_t cy = C < 65535 ? C : 65535;
                unsigned gy = 0;
                if (bn_coop_rounds(parts, cy, cap, &gy) < 1) continue;
                std::vector<int> seen((size_t)(C * parts), 0);
                std::vector<int64_t> col((size_t)C, -1);
                for (int64_t y = 0; y < (int64_t)gy; y++)
                    for (int64_t p = 0; p < parts; p++)
                        for (int64_t c = y; c < C; c += gy) {
                            seen[(size_t)(c * parts + p)]++;
                            if (col[(size_t)c] < 0) col[(size_t)c] = y;
                            else if (col[(size_t)c] != y && !bad++)
                                snprintf(first, sizeof first, "C %lld: channel %lld in two columns",
                                         (long long)C, (long long)c);
                        }
                for (size_t i = 0; i < seen.size(); i++)
                    if (seen[i] != 1 && !bad++)
                        snprintf(first, sizeof first,
                                 "C %lld, parts %lld, gy %u: (part, channel) %zu visited %d times",
                                 (long long)C, (long long)parts, gy, i, seen[i]);
            }
    ok(bad == 0, "channel loop on the chosen grid: every (part, channel) once, one column a channel",
       WHY("%d bad; first: %s", bad, first));
}

/* ------------------------------------------------------------ the choice */

/* A candidate kernel: its occupancy cache (preset: blocks per SM, so
 * bn_coop_cap makes no CUDA call) and the status its launch returns. */
struct Cand {
    const char *name;
    std::atomic<int> per_sm;
    cudaError_t launch;
};

static void cand_set(Cand *c, const char *name, int per_sm) {
    c->name = name;
    c->per_sm.store(per_sm);
    c->launch = cudaSuccess;
}

/* The launchers' visit (bn_visit_*_coop) emulated: the candidates in order,
 * each with bn_coop_visit, "launched" with its preset status; a launched
 * one ends the visit.  *who: the launched candidate's name. */
static cudaError_t visit_all(bn_coop_sel *s, Cand *c, int n, const char **who) {
    for (int i = 0; i < n; i++) {
        dim3 grid;
        bool go = false;
        cudaError_t e = bn_coop_visit((const void *)&c[i], &c[i].per_sm, s, &grid, &go);
        if (e != cudaSuccess) return e;
        if (!go) continue;
        bn_coop_queued(s, c[i].launch, &c[i].per_sm, grid);
        if (s->launched) {
            *who = c[i].name;
            return cudaSuccess;
        }
    }
    return cudaSuccess;
}

/* One choice for N x C x S on sm SMs: the launched candidate (or "none")
 * and grid against want / wx x wy. */
static void expect(const char *what, int64_t N, int64_t C, int64_t S, int sm, Cand *c, int n,
                   const char *want, unsigned wx, unsigned wy) {
    bn_coop_sel s = bn_coop_sel_of(bn_geom_of(N, C, S), sm);
    const char *who = "none";
    cudaError_t e = bn_coop_choose(&s, [&]() { return visit_all(&s, c, n, &who); });
    bool good = e == cudaSuccess && strcmp(who, want) == 0 &&
                (!s.launched || (s.grid.x == wx && s.grid.y == wy));
    ok(good, NAME("choice: %s: %s on %u x %u", what, want, wx, wy),
       WHY("%s on %u x %u (launched %d, status %d)", who, s.grid.x, s.grid.y, (int)s.launched,
           (int)e));
}

static void check_choice(void) {
    const int SM = 132;
    const int64_t S320 = 320 * 320, S160 = 160 * 160, S80 = 80 * 80;
    /* forward, bf16 held variant first (62 registers: 4 per SM), then the
     * one reading x again (plain 48: 5 per SM; SiLU 58: 4 per SM) */
    Cand fp[2], fs[2];
    cand_set(&fp[0], "held", 4), cand_set(&fp[1], "reread", 5);
    cand_set(&fs[0], "held", 4), cand_set(&fs[1], "reread", 4);
    /* backward: held uncapped (100: 2 per SM), held lean (64: 4), reading
     * again uncapped (102-107: 2), lean (64: 4) */
    Cand bw[4];
    cand_set(&bw[0], "held", 2), cand_set(&bw[1], "held lean", 4);
    cand_set(&bw[2], "reread", 2), cand_set(&bw[3], "reread lean", 4);

    /* unset: the default, one round (the rounds are opt-in, nn_norm.cuh) */
    unsetenv("LUCID_BN_COOP_LOOP");
    expect("LUCID_BN_COOP_LOOP unset: layer 0 backward", 4, 16, S320, SM, bw, 4, "none", 0, 0);
    expect("LUCID_BN_COOP_LOOP unset: 4x10x320x320 backward", 4, 10, S320, SM, bw, 4,
           "held lean", 52, 10);
    setenv("LUCID_BN_COOP_LOOP", "1", 1);
    expect("layer 0 forward (SiLU) 4x16x320x320", 4, 16, S320, SM, fs, 2, "held", 52, 8);
    expect("layer 0 forward (plain)", 4, 16, S320, SM, fp, 2, "held", 52, 8);
    expect("layer 0 backward", 4, 16, S320, SM, bw, 4, "held lean", 52, 8);
    expect("4x32x160x160 forward (full grid, 512 blocks)", 4, 32, S160, SM, fs, 2, "held", 16,
           32);
    expect("4x32x160x160 backward (full grid: lean)", 4, 32, S160, SM, bw, 4, "held lean", 16,
           32);
    expect("4x64x80x80 backward (full grid: uncapped, 256 blocks)", 4, 64, S80, SM, bw, 4,
           "held", 4, 64);
    expect("4x10x320x320 backward (520 blocks: full grid)", 4, 10, S320, SM, bw, 4, "held lean",
           52, 10);
    expect("4x11x320x320 backward (572: 2 rounds of 6)", 4, 11, S320, SM, bw, 4, "held lean", 52,
           6);
    expect("4x11x320x320 plain forward (reading again fits 660 in 1 round)", 4, 11, S320, SM, fp,
           2, "reread", 52, 11);
    expect("4x11x320x320 SiLU forward (2 rounds: held)", 4, 11, S320, SM, fs, 2, "held", 52, 6);
    expect("40x2x320x320 backward (520 parts: 2 rounds of 1)", 40, 2, S320, SM, bw, 4,
           "held lean", 520, 1);
    expect("41x2x320x320 backward (533 parts: no column fits)", 41, 2, S320, SM, bw, 4, "none", 0,
           0);
    expect("41x2x320x320 plain forward (reading again: 660)", 41, 2, S320, SM, fp, 2, "reread",
           533, 1);
    expect("no SMs known", 4, 16, S320, 0, bw, 4, "none", 0, 0);

    setenv("LUCID_BN_COOP_LOOP", "0", 1);
    expect("LUCID_BN_COOP_LOOP=0: layer 0 backward", 4, 16, S320, SM, bw, 4, "none", 0, 0);
    expect("LUCID_BN_COOP_LOOP=0: layer 0 forward", 4, 16, S320, SM, fs, 2, "none", 0, 0);
    expect("LUCID_BN_COOP_LOOP=0: 4x10x320x320 backward", 4, 10, S320, SM, bw, 4, "held lean", 52,
           10);
    expect("LUCID_BN_COOP_LOOP=0: 4x11x320x320 plain forward", 4, 11, S320, SM, fp, 2, "reread",
           52, 11);
    setenv("LUCID_BN_COOP_LOOP", "1", 1);

    /* refusal: the held lean copy refused for size -> the next candidate of
     * as few rounds (reread lean), and the refused one never again */
    bw[1].launch = cudaErrorCooperativeLaunchTooLarge;
    expect("layer 0 backward, held lean refused", 4, 16, S320, SM, bw, 4, "reread lean", 52, 8);
    ok(bw[1].per_sm.load() == 0, "refused candidate's occupancy cache set to 0",
       WHY("%d", bw[1].per_sm.load()));
    bw[1].launch = cudaSuccess;
    expect("layer 0 backward after the refusal", 4, 16, S320, SM, bw, 4, "reread lean", 52, 8);
    /* every candidate of the fewest rounds refused: none this call */
    bw[3].launch = cudaErrorCooperativeLaunchTooLarge;
    expect("layer 0 backward, both lean copies refused", 4, 16, S320, SM, bw, 4, "none", 0, 0);
    expect("layer 0 backward after both refusals: 4 rounds uncapped", 4, 16, S320, SM, bw, 4,
           "held", 52, 4);
    unsetenv("LUCID_BN_COOP_LOOP");
}

static void check_limit(void) {
    unsetenv("LUCID_BN_COOP_LOOP");
    bool unset = bn_coop_round_limit() == 1;
    setenv("LUCID_BN_COOP_LOOP", "0", 1);
    bool zero = bn_coop_round_limit() == 1;
    setenv("LUCID_BN_COOP_LOOP", "1", 1);
    bool one = bn_coop_round_limit() == INT64_MAX;
    unsetenv("LUCID_BN_COOP_LOOP");
    ok(unset && zero && one, "LUCID_BN_COOP_LOOP: \"1\" no limit, unset / \"0\" one round",
       WHY("unset %d, \"0\" %d, \"1\" %d", (int)unset, (int)zero, (int)one));
}

/* the partition's parts per channel (test_nn_bnsilu_cuda.c coop_parts) */
static void check_parts(void) {
    bn_geom g = bn_geom_of(4, 16, 320 * 320);
    ok(g.parts == 52 && g.P == 13 && g.chunk == 7880, "layer 0: 52 parts (13 chunks of 7880)",
       WHY("parts %lld, P %lld, chunk %lld", (long long)g.parts, (long long)g.P,
           (long long)g.chunk));
    g = bn_geom_of(41, 2, 320 * 320);
    ok(g.parts == 533, "41x2x320x320: 533 parts", WHY("%lld", (long long)g.parts));
}

/* ------------------------------------------------------------ the cluster route */

/* bn_clu_size for parts 1..300 and csmax 2..16: 0 exactly when parts < 2
 * or more than BN_CLU_ROUNDS rounds are needed; else cs <= csmax, rounds =
 * ceil(parts / csmax) (the fewest), cs = ceil(parts / rounds) (spread
 * evenly), and the kernels' walk (block r: parts r, r + cs, ...) gives
 * every block 1..rounds parts, every part once, and slots (part / cs)
 * below BN_CLU_ROUNDS; the DSMEM map of the fold (part i in rank i % cs,
 * slot i / cs) names the block and slot that computed it. */
static void check_clu_size(void) {
    int bad = 0;
    char first[256] = "";
    for (unsigned csmax = 0; csmax <= BN_CLU_MAX; csmax++)
        for (int64_t parts = 0; parts <= 300; parts++) {
            unsigned rounds = 99;
            const unsigned cs = bn_clu_size(parts, csmax, &rounds);
            const char *why_bad = NULL;
            const int64_t fewest = csmax ? (parts + csmax - 1) / csmax : 0;
            if (parts < 2 || csmax < 2 || fewest > BN_CLU_ROUNDS) {
                if (cs != 0 || rounds != 0) why_bad = "a cluster where none is allowed";
            } else if (cs < 2 || cs > csmax) {
                why_bad = "cs out of 2..csmax";
            } else if ((int64_t)rounds != fewest) {
                why_bad = "not the fewest rounds";
            } else if ((int64_t)cs != (parts + rounds - 1) / rounds) {
                why_bad = "parts not spread evenly";
            } else {
                std::vector<int> seen((size_t)parts, 0);
                for (unsigned r = 0; r < cs && !why_bad; r++) {
                    unsigned k = 0;
                    for (int64_t p = r; p < parts; p += cs, k++) {
                        seen[(size_t)p]++;
                        if (k >= BN_CLU_ROUNDS) why_bad = "slot past BN_CLU_ROUNDS";
                        /* the fold's map */
                        if ((unsigned)p % cs != r || (unsigned)p / cs != k)
                            why_bad = "DSMEM map names another block or slot";
                    }
                    if (k < 1 || k > rounds) why_bad = "a block without parts or past the rounds";
                }
                for (int64_t p = 0; p < parts && !why_bad; p++)
                    if (seen[(size_t)p] != 1) why_bad = "a part not computed exactly once";
            }
            if (why_bad && !bad++)
                snprintf(first, sizeof first, "parts %lld, csmax %u: %s (cs %u, rounds %u)",
                         (long long)parts, csmax, why_bad, cs, rounds);
        }
    ok(bad == 0, "bn_clu_size: fewest rounds, parts spread evenly, every part once",
       WHY("%d bad; first: %s", bad, first));
    /* the model's shapes (N = 4, 640 px) */
    unsigned r = 0, c = bn_clu_size(bn_geom_of(4, 16, 320 * 320).parts, BN_CLU_MAX, &r);
    ok(c == 13 && r == 4, "layer 0 (52 parts): 4 rounds of 13 blocks", WHY("%u x %u", c, r));
    c = bn_clu_size(bn_geom_of(4, 16, 320 * 320).parts, BN_CLU_PORTABLE, &r);
    ok(c == 8 && r == 7, "layer 0 portable: 7 rounds of 8 blocks", WHY("%u x %u", c, r));
    c = bn_clu_size(bn_geom_of(4, 32, 160 * 160).parts, BN_CLU_MAX, &r);
    ok(c == 16 && r == 1, "160x160 (16 parts): one part per block, 16 blocks",
       WHY("%u x %u", c, r));
    c = bn_clu_size(bn_geom_of(4, 64, 80 * 80).parts, BN_CLU_MAX, &r);
    ok(c == 4 && r == 1, "80x80 (4 parts): 4 blocks", WHY("%u x %u", c, r));
    c = bn_clu_size(bn_geom_of(4, 128, 40 * 40).parts, BN_CLU_MAX, &r);
    ok(c == 0 && r == 0, "40x40 (one part): no cluster", WHY("%u x %u", c, r));
    c = bn_clu_size(129, BN_CLU_MAX, &r);
    ok(c == 0, "129 parts: more than BN_CLU_ROUNDS rounds at 16, no cluster", WHY("%u", c));
}

/* bn_clu_choose: the sizes tried in order (the largest cluster's, then the
 * portable one's when it differs), stopping at the first launched. */
static void check_clu_choose(void) {
    struct Case {
        int64_t parts;
        int fits16; /* whether the emulated kernel runs the first size */
        unsigned want[2][2]; /* (cs, rounds) tried, 0: none */
        unsigned launched_cs;
    };
    static const Case CASES[] = {
        {52, 1, {{13, 4}, {0, 0}}, 13}, {52, 0, {{13, 4}, {8, 7}}, 8},
        {16, 1, {{16, 1}, {0, 0}}, 16}, {16, 0, {{16, 1}, {8, 2}}, 8},
        {4, 0, {{4, 1}, {0, 0}}, 0},    {17, 1, {{9, 2}, {0, 0}}, 9},
        {17, 0, {{9, 2}, {6, 3}}, 6},   {100, 0, {{15, 7}, {0, 0}}, 0},
        {128, 1, {{16, 8}, {0, 0}}, 16}, {129, 1, {{0, 0}, {0, 0}}, 0},
        {1, 1, {{0, 0}, {0, 0}}, 0}};
    for (const Case &k : CASES) {
        bn_clu_sel s;
        memset(&s, 0, sizeof s);
        s.parts = k.parts;
        s.gy = 1;
        unsigned tried[3][2] = {{0, 0}, {0, 0}, {0, 0}};
        int n = 0;
        cudaError_t e = bn_clu_choose(&s, [&](unsigned cs, unsigned rounds) -> cudaError_t {
            if (n < 3) tried[n][0] = cs, tried[n][1] = rounds;
            n++;
            if (n == 1 ? k.fits16 : 1) {
                bn_clu_cache cc = {};
                bn_clu_queued(&s, cudaSuccess, &cc, cs, rounds);
            }
            return cudaSuccess;
        });
        bool good = e == cudaSuccess && n <= 2 && tried[0][0] == k.want[0][0] &&
                    tried[0][1] == k.want[0][1] && tried[1][0] == k.want[1][0] &&
                    tried[1][1] == k.want[1][1] &&
                    (k.launched_cs ? s.launched && s.cs == k.launched_cs : !s.launched);
        ok(good,
           NAME("bn_clu_choose: %lld parts, first size %s: tries %ux%u then %ux%u", (long long)k.parts,
                k.fits16 ? "runs" : "refused", k.want[0][0], k.want[0][1], k.want[1][0],
                k.want[1][1]),
           WHY("tried %d: %ux%u, %ux%u; launched %d (cs %u)", n, tried[0][0], tried[0][1],
               tried[1][0], tried[1][1], (int)s.launched, s.cs));
    }
}

/* bn_clu_queued: a refusal of the cluster size (cudaErrorInvalidClusterSize)
 * is not a launch and caches the size as not running; any other status
 * counts as launched (left for CUDA_CHECK_LAUNCH). */
static void check_clu_queued(void) {
    bn_clu_cache cc = {};
    bn_clu_sel s;
    memset(&s, 0, sizeof s);
    bn_clu_queued(&s, cudaErrorInvalidClusterSize, &cc, 13, 4);
    ok(!s.launched && cc.fit[13].load() == 2, "refused cluster size: not launched, cached no",
       WHY("launched %d, fit %d", (int)s.launched, cc.fit[13].load()));
    bn_clu_queued(&s, cudaErrorLaunchOutOfResources, &cc, 8, 7);
    ok(s.launched && s.cs == 8 && s.rounds == 7, "other launch error: counted as launched",
       WHY("launched %d, cs %u, rounds %u", (int)s.launched, s.cs, s.rounds));
}

/* bn_clu_fits with preset caches makes no CUDA call: yes / no as cached;
 * inside a capture an unknown size or attribute is not asked (no); sizes
 * outside 2..BN_CLU_MAX never run. */
static void check_clu_fits(void) {
    bn_clu_cache cc = {};
    bool f = true;
    cudaError_t e = bn_clu_fits(nullptr, &cc, 4, true, &f);
    ok(e == cudaSuccess && !f && cc.fit[4].load() == 0,
       "capturing, size not asked yet: not taken, not asked", WHY("%d %d", (int)f, (int)e));
    cc.fit[4].store(1);
    e = bn_clu_fits(nullptr, &cc, 4, true, &f);
    ok(e == cudaSuccess && f, "cached yes: taken (also while capturing)", WHY("%d", (int)f));
    cc.fit[13].store(1);
    e = bn_clu_fits(nullptr, &cc, 13, true, &f);
    ok(e == cudaSuccess && !f && cc.np.load() == 0,
       "capturing, non-portable attribute not set yet: not taken", WHY("%d", (int)f));
    cc.np.store(1);
    e = bn_clu_fits(nullptr, &cc, 13, false, &f);
    ok(e == cudaSuccess && f, "non-portable set, size 13 cached yes: taken", WHY("%d", (int)f));
    cc.np.store(2);
    e = bn_clu_fits(nullptr, &cc, 13, false, &f);
    ok(e == cudaSuccess && !f, "non-portable refused: sizes above 8 not taken", WHY("%d", (int)f));
    cc.fit[6].store(2);
    e = bn_clu_fits(nullptr, &cc, 6, false, &f);
    ok(e == cudaSuccess && !f, "cached no: not taken", WHY("%d", (int)f));
    bool f1 = true, f17 = true;
    bn_clu_fits(nullptr, &cc, 1, false, &f1);
    bn_clu_fits(nullptr, &cc, BN_CLU_MAX + 1, false, &f17);
    ok(!f1 && !f17, "sizes 1 and BN_CLU_MAX + 1: never", WHY("%d %d", (int)f1, (int)f17));
}

/* LUCID_BN_CLUSTER's rule (opt-in): "1" on; unset, "" or "0" off; else -1
 * (ERR_ARG). */
static void check_clu_parse(void) {
    bool good = bn_cluster_parse(nullptr) == 0 && bn_cluster_parse("") == 0 &&
                bn_cluster_parse("1") == 1 && bn_cluster_parse("0") == 0 &&
                bn_cluster_parse("2") == -1 && bn_cluster_parse("yes") == -1 &&
                bn_cluster_parse("01") == -1;
    ok(good, "LUCID_BN_CLUSTER: \"1\" on, unset / \"\" / \"0\" off, anything else an error",
       WHY("unset %d, \"\" %d, \"1\" %d, \"0\" %d, \"2\" %d", bn_cluster_parse(nullptr),
           bn_cluster_parse(""), bn_cluster_parse("1"), bn_cluster_parse("0"),
           bn_cluster_parse("2")));
}

/* bn_unroll (LUCID_BN_UNROLL, read once per process): here "3", which is
 * in lucid_env_int's range but not a supported unroll, keeps the default
 * (2, DECISIONS 46). The other values' effect on the kernels (none on the
 * bits) is checked on the GPU by spec/bn_unroll_gpu_spec.lua. */
static void check_unroll(void) {
    setenv("LUCID_BN_UNROLL", "3", 1);
    const int u = bn_unroll();
    ok(u == BN_UNROLL_2L && BN_UNROLL_2L == 2, "LUCID_BN_UNROLL=3 keeps the default unroll 2",
       WHY("bn_unroll() %d, BN_UNROLL_2L %d", u, BN_UNROLL_2L));
    setenv("LUCID_BN_UNROLL", "1", 1);
    ok(bn_unroll() == u, "bn_unroll is read once per process",
       WHY("after setting 1: %d", bn_unroll()));
}

int main(void) {
    check_unroll();
    check_rounds();
    check_loop();
    check_parts();
    check_limit();
    check_choice();
    check_clu_size();
    check_clu_choose();
    check_clu_queued();
    check_clu_fits();
    check_clu_parse();
    return failures ? 1 : 0;
}
