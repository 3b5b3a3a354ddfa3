/*
 * test_bn_cluster_maps.cu — host-side checks of the BatchNorm cluster
 * route's indexing (cuda/nn_norm.cuh; no GPU needed): for channels of
 * `parts` parts (bn_geom_of) and a cap maxcs, the cluster size
 * bn_cluster_size picks, the parts each block computes (rank r: parts r,
 * r+cs, ..., slot k for part r + k*cs, as bn_stats_apply_cl /
 * bn_grad_dx_cl walk them) and the slot the folds read part i from
 * (bn_ld_cluster3 / bn_ld_cluster2: rank i % cs, slot i / cs):
 *   - cs = 0 exactly when parts < 2, maxcs < 2, or more than BN_CL_SLOTS
 *     parts a block at min(parts, maxcs);
 *   - otherwise 2 <= cs <= min(parts, maxcs, BN_CL_MAX), every block has
 *     1..BN_CL_SLOTS parts, every part is computed by exactly one (rank,
 *     slot), and the fold's (rank, slot) of part i is that one;
 *   - the YOLO (N=4, 640 px) shapes: 16x320x320 52 parts -> clusters of 16
 *     (4 blocks of 4 parts, 12 of 3), 32x160x160 16 -> 16, 64x80x80 4 -> 4,
 *     40x40 and 20x20 1 -> none (one-pass kernels); with the portable cap
 *     8: 52 -> 8 (4 blocks of 7, 4 of 6);
 *   - spec/c/test_nn_bncluster_cuda.c's shapes have the part counts its
 *     names state.
 * Every (N, S) with N <= 64 and S <= 40000 (step 7) and every cap 0..17.
 */
#include "nn_norm.cuh"

/* cuda/backend.cu (lucid_pdl_for_stream, used by lucid_launch in the
 * included headers), not linked here */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }

#include <cstdio>
#include <vector>

static int fails, oks;

static void check(bool cond, const char *name, long long a, long long b, long long c) {
    if (cond) {
        oks++;
        return;
    }
    fails++;
    if (fails <= 20) printf("not ok %s (%lld, %lld, %lld)\n", name, a, b, c);
}

static void check_map(int64_t parts, int maxcs) {
    int cs = bn_cluster_size(maxcs, parts);
    int64_t m = parts < maxcs ? parts : maxcs;
    bool off = parts < 2 || maxcs < 2 || (parts + m - 1) / m > BN_CL_SLOTS;
    check((cs == 0) == off, "bn cluster maps: route taken iff covered", parts, maxcs, cs);
    if (!cs) return;
    check(cs >= 2 && cs <= parts && cs <= maxcs && cs <= BN_CL_MAX,
          "bn cluster maps: 2 <= cs <= min(parts, cap, 16)", parts, maxcs, cs);
    std::vector<int> seen((size_t)parts, 0);
    for (int r = 0; r < cs; r++) {
        int nmine = 0;
        for (int64_t part = r; part < parts; part += cs, nmine++) {
            seen[(size_t)part]++;
            /* the fold's loader: rank i % cs, slot i / cs */
            check(part % cs == r && part / cs == nmine, "bn cluster maps: fold reads the slot written",
                  parts, cs, part);
        }
        check(nmine >= 1 && nmine <= BN_CL_SLOTS, "bn cluster maps: 1..8 parts a block", parts,
              cs, nmine);
        /* the apply walks the block's parts back: rank + k*cs, k = nmine-1..0 */
        for (int k = nmine - 1; k >= 0; k--)
            check((int64_t)r + (int64_t)k * cs < parts, "bn cluster maps: applied part exists",
                  parts, cs, k);
    }
    for (int64_t i = 0; i < parts; i++)
        check(seen[(size_t)i] == 1, "bn cluster maps: each part computed once", parts, cs, i);
}

static int64_t parts_of(int64_t N, int64_t H, int64_t W) {
    return bn_geom_of(N, 1, H * W).parts;
}

int main(void) {
    for (int64_t N = 1; N <= 64; N++)
        for (int64_t S = 1; S <= 40000; S += 7) {
            int64_t parts = bn_geom_of(N, 3, S).parts;
            for (int maxcs = 0; maxcs <= 17; maxcs++) check_map(parts, maxcs > 16 ? 16 : maxcs);
        }
    for (int64_t parts = 1; parts <= 300; parts++)
        for (int maxcs = 0; maxcs <= 16; maxcs++) check_map(parts, maxcs);
    printf("%s bn cluster maps: partition, slots and fold reads (%d checks)\n",
           fails ? "not ok" : "ok", oks + fails);

    struct { int64_t N, H, W, parts; int cs16, cs8; } yolo[] = {
        {4, 320, 320, 52, 16, 8}, {4, 160, 160, 16, 16, 8}, {4, 80, 80, 4, 4, 4},
        {4, 40, 40, 1, 0, 0},     {4, 20, 20, 1, 0, 0},
        /* test_nn_bncluster_cuda.c */
        {2, 80, 80, 2, 2, 2},     {5, 96, 96, 10, 10, 8}, {3, 91, 91, 6, 6, 6},
        {4, 96, 96, 8, 8, 8},     {300, 64, 72, 300, 0, 0}};
    int bad = 0;
    for (auto &y : yolo) {
        int64_t p = parts_of(y.N, y.H, y.W);
        int c16 = bn_cluster_size(16, p), c8 = bn_cluster_size(8, p);
        if (p != y.parts || c16 != y.cs16 || c8 != y.cs8) {
            bad++;
            printf("# %lldx%lldx%lld: %lld parts, clusters %d / %d (want %lld, %d / %d)\n",
                   (long long)y.N, (long long)y.H, (long long)y.W, (long long)p, c16, c8,
                   (long long)y.parts, y.cs16, y.cs8);
        }
    }
    printf("%s bn cluster maps: YOLO and test shapes (parts, cluster sizes 16 / 8)\n",
           bad ? "not ok" : "ok");
    return fails || bad ? 1 : 0;
}
