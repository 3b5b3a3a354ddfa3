/*
 * test_conv_wcast_maps.cu — host checks of the group weight cast's tiled
 * transposed copy (cuda/nn_conv_gemm.cu, gemm_wcast_group: the stride-phase
 * backward-data's weight [kh*kw][Cout][Cin], lucid_conv_igemm_wt_src).
 * Needs nvcc, not a GPU (runs in make test); nothing is launched.
 *
 * nn_conv_gemm.cu is compiled into this program, so the block count of an
 * item (cast_item_blocks, what the launch's table gives each item), the
 * rows of a tile (wt_tile_rows, wt_tile_of) and the element map of its
 * write phase (wt_tile_elem) are the kernel's own.  A __global__ function
 * cannot run on the host: tile_emulated below is the tile branch of
 * gemm_wcast_group line for line (stage the rows' nr*KK floats in order,
 * then write element e of the write phase from staged element
 * wt_tile_elem(e)), run for every block of the item.
 *
 * Checks, for the six stride-2 3x3 convs of YOLO11n-pose, odd channel
 * counts, 2x2 / 5x5 / 32x32 kernels (KK 4, 25, 1024: one row per block)
 * and a partial last tile:
 *   - the staged range of each block lies inside the weight and inside the
 *     shared staging (GROUP_ELEMS floats); the blocks' rows cover [0,
 *     Cout*Cin) once;
 *   - every element of the copy is written exactly once, and its bf16 and
 *     f16 bits equal the element-wise gather's, dt(w[wt_src(i)]), i.e. the
 *     per-call igemm_wt_cast's and the previous kernel's;
 *   - each block writes runs of nr consecutive elements (one per tap: the
 *     coalesced writes the tile is for);
 *   - a kernel of more than GROUP_ELEMS taps (33x33) has no tile
 *     (wt_tile_rows 0) and keeps the element-wise blocks, as plain and
 *     flipped items do: ceil(count / GROUP_ELEMS).
 */
#include "nn_conv_gemm.cu"

#include "host_standins.h" /* lucid_seterr, lucid_dtype_name, error hooks */

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cublas_sm_stub.h"

/* cuda/backend.cu is not linked into this host-only test; nothing is
 * launched (lucid_launch would call this first). */
int lucid_pdl_for_stream(cudaStream_t) {
    fprintf(stderr, "test_conv_wcast_maps: unexpected launch\n");
    abort();
}
extern "C" size_t lucid_dtype_size(lucid_dtype dt) {
    return dt == LUCID_BF16 || dt == LUCID_F16 ? 2 : dt == LUCID_F64 ? 8 : 4;
}
/* referenced by nn_conv_gemm.cu's GEMM calls, never reached here */
extern "C" cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
    const void *, cudaDataType, int, long long int, const void *, cudaDataType, int,
    long long int, const void *, void *, cudaDataType, int, long long int, int,
    cublasComputeType_t, cublasGemmAlgo_t) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
extern "C" cublasStatus_t cublasGemmBatchedEx(cublasHandle_t, cublasOperation_t,
                                              cublasOperation_t, int, int, int, const void *,
                                              const void *const[], cudaDataType, int,
                                              const void *const[], cudaDataType, int,
                                              const void *, void *const[], cudaDataType, int, int,
                                              cublasComputeType_t, cublasGemmAlgo_t) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

#include "tap_host.h" /* ok(), NAME(...), WHY(...) */

static uint16_t bf16_bits(float v) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static uint16_t f16_bits(float v) {
    __half h = __float2half_rn(v);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* What the tile branch of gemm_wcast_group does in block lb of a wt item
 * (Cin, Cout, KK) with tr rows a block: d[i] = the bits of staged element
 * k for each element e of the write phase.  writes[i] counts the writes of
 * element i; false (with *bad) when a staged index leaves the weight or the
 * staging, or a write leaves the copy. */
static bool tile_emulated(const float *s, std::vector<uint16_t> &dbf, std::vector<uint16_t> &dh,
                          std::vector<int> &writes, int Cin, int Cout, int KK, unsigned tr,
                          unsigned lb, std::string *bad) {
    char buf[160];
    const int64_t R = (int64_t)Cin * Cout, count = R * KK;
    const wt_tile tl = wt_tile_of(lb, tr, R);
    const unsigned ne = tl.nr * (unsigned)KK;
    if (tl.nr == 0 || ne > GROUP_ELEMS || tl.r0 * KK + ne > count) {
        snprintf(buf, sizeof buf, "block %u: rows %lld + %u, %u staged", lb, (long long)tl.r0,
                 tl.nr, ne);
        *bad = buf;
        return false;
    }
    float stage[GROUP_ELEMS];
    const float *sr = s + tl.r0 * KK;
    for (unsigned e = 0; e < ne; e++) stage[e] = sr[e];
    for (unsigned e = 0; e < ne; e++) {
        int64_t i;
        const unsigned k = wt_tile_elem(e, tl, (unsigned)KK, R, &i);
        if (k >= ne || i < 0 || i >= count) {
            snprintf(buf, sizeof buf, "block %u element %u: staged %u of %u, index %lld", lb, e,
                     k, ne, (long long)i);
            *bad = buf;
            return false;
        }
        /* runs of nr consecutive indices, one per tap */
        if (e % tl.nr != 0) {
            int64_t prev;
            (void)wt_tile_elem(e - 1, tl, (unsigned)KK, R, &prev);
            if (i != prev + 1) {
                snprintf(buf, sizeof buf, "block %u element %u: index %lld after %lld", lb, e,
                         (long long)i, (long long)prev);
                *bad = buf;
                return false;
            }
        }
        dbf[(size_t)i] = bf16_bits(stage[k]);
        dh[(size_t)i] = f16_bits(stage[k]);
        writes[(size_t)i]++;
    }
    return true;
}

static void check_item(int Cin, int Cout, int KK) {
    const int64_t R = (int64_t)Cin * Cout, count = R * KK;
    char p[96];
    snprintf(p, sizeof p, "wt tile %d>%d KK %d", Cin, Cout, KK);
    lucid_conv_gemm_cast_item it = {NULL, NULL, count, {0, 0, 0, 0, 0}, {Cin, Cout, KK}};
    const unsigned tr = wt_tile_rows(KK);
    const uint64_t blocks = cast_item_blocks(it);
    if (tr == 0) { /* no tile: the element-wise blocks */
        const uint64_t want = ((uint64_t)count + GROUP_ELEMS - 1) / GROUP_ELEMS;
        ok(KK > GROUP_ELEMS && blocks == want, NAME("%s: element-wise blocks", p),
           WHY("%llu blocks, expected %llu", (unsigned long long)blocks,
               (unsigned long long)want));
        return;
    }
    ok(tr == (unsigned)(GROUP_ELEMS / KK) && blocks == (uint64_t)((R + tr - 1) / tr),
       NAME("%s: %u rows a block, %llu blocks", p, tr, (unsigned long long)blocks),
       WHY("%u rows, %llu blocks", tr, (unsigned long long)blocks));
    std::vector<float> s((size_t)count);
    for (int64_t i = 0; i < count; i++) s[(size_t)i] = ((float)rand() / RAND_MAX * 2 - 1) * 0.3f;
    std::vector<uint16_t> dbf((size_t)count, 0xffff), dh((size_t)count, 0xffff);
    std::vector<int> writes((size_t)count, 0);
    std::string bad;
    bool in = true;
    for (uint64_t lb = 0; lb < blocks && in; lb++)
        in = tile_emulated(s.data(), dbf, dh, writes, Cin, Cout, KK, tr, (unsigned)lb, &bad);
    ok(in, NAME("%s: staged and written inside, runs of nr per tap", p), bad.c_str());
    if (!in) return;
    int64_t once = -1, bits = -1;
    for (int64_t i = 0; i < count && (once < 0 || bits < 0); i++) {
        if (once < 0 && writes[(size_t)i] != 1) once = i;
        const float v = s[(size_t)lucid_conv_igemm_wt_src(i, Cin, Cout, KK)];
        if (bits < 0 && (dbf[(size_t)i] != bf16_bits(v) || dh[(size_t)i] != f16_bits(v)))
            bits = i;
    }
    ok(once < 0, NAME("%s: every element written once", p),
       WHY("element %lld written %d times", (long long)once,
           once < 0 ? 1 : writes[(size_t)once]));
    ok(bits < 0, NAME("%s: bf16 and f16 bits of the element-wise gather", p),
       WHY("element %lld differs", (long long)bits));
}

int main() {
    srand(12345);
    /* YOLO11n-pose's stride-2 3x3 convs with Cin % 8 == 0 (the transposed
     * copy's users; Cin, Cout), then odd shapes and other kernel sizes */
    static const int CASES[][3] = {
        {16, 32, 9},  {64, 64, 9},  {128, 128, 9}, {128, 256, 9}, {64, 64, 9},
        {3, 5, 9},    {13, 21, 9},  {113, 1, 9},   {114, 1, 9},   {8, 8, 4},
        {8, 24, 25},  {24, 40, 25}, {16, 16, 1024}, {7, 3, 1023}, {8, 2, 1089},
        {1, 1, 1},    {40, 17, 1},
    };
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++)
        check_item(CASES[c][0], CASES[c][1], CASES[c][2]);
    /* plain and flipped items keep GROUP_ELEMS elements a block */
    {
        lucid_conv_gemm_cast_item plain = {NULL, NULL, 5000, {0, 0, 0, 0, 0}, {0, 0, 0}};
        lucid_conv_gemm_cast_item flip = {NULL, NULL, 16 * 296, {16, 32, 3, 3, 296}, {0, 0, 0}};
        ok(cast_item_blocks(plain) == 5 && cast_item_blocks(flip) == 5,
           "plain and flipped items: ceil(count / GROUP_ELEMS) blocks",
           WHY("%llu and %llu", (unsigned long long)cast_item_blocks(plain),
               (unsigned long long)cast_item_blocks(flip)));
    }
    return failures != 0;
}
