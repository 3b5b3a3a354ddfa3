/*
 * test_conv_fold_cuda.cu — the split-K filter-gradient folds of
 * cuda/nn_conv_igemm.cu on the GPU: igemm_reduce_splits_lanes (coalesced,
 * one thread per element) must give the same bits as
 * igemm_reduce_splits_warp (one warp per element, xor-shuffle tree) for
 * every element count and split count, with beta 0 and beta != 0, and both
 * must match a float64 sum of the partials to f32 rounding (relative 1e-5).
 * Skips (visibly) without a GPU.
 */
#include "nn_conv_igemm.cu"
/* cuda/backend.cu is not linked: launches go without programmatic dependent
 * launch. */
int lucid_pdl_for_stream(cudaStream_t) { return 0; }
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int fails = 0, oks = 0;

static void report(bool ok, const char *name, const char *why) {
    if (ok) { printf("ok %s\n", name); oks++; }
    else { printf("not ok %s: %s\n", name, why); fails++; }
}

/* one case: n elements, `splits` partials of each, beta */
static void run(int n, int splits, float beta, unsigned seed) {
    char name[160];
    snprintf(name, sizeof name, "fold n %d splits %d beta %g: lanes == warp bitwise, ~ f64", n, splits,
             (double)beta);
    std::vector<float> part((size_t)n * splits), dw0(n);
    srand(seed);
    for (size_t i = 0; i < part.size(); i++) {
        /* mixed magnitudes so that the order of the additions shows in the bits */
        float u = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        part[i] = (i % 7 == 0) ? u * 1e3f : (i % 5 == 0 ? u * 1e-3f : u);
    }
    for (int i = 0; i < n; i++) dw0[i] = (float)rand() / RAND_MAX - 0.5f;
    float *dp = NULL, *dwa = NULL, *dwb = NULL;
    size_t pb = part.size() * sizeof(float), wb = (size_t)n * sizeof(float);
    if (cudaMalloc(&dp, pb) != cudaSuccess || cudaMalloc(&dwa, wb) != cudaSuccess ||
        cudaMalloc(&dwb, wb) != cudaSuccess) {
        report(false, name, "cudaMalloc failed");
        cudaFree(dp); cudaFree(dwa); cudaFree(dwb);
        return;
    }
    cudaMemcpy(dp, part.data(), pb, cudaMemcpyHostToDevice);
    cudaMemcpy(dwa, dw0.data(), wb, cudaMemcpyHostToDevice);
    cudaMemcpy(dwb, dw0.data(), wb, cudaMemcpyHostToDevice);
    unsigned bw = (unsigned)((n + 7) / 8), bl = (unsigned)((n + 255) / 256);
    if (bw > 4096) bw = 4096;
    if (bl > 4096) bl = 4096;
    igemm_reduce_splits_warp<<<bw, 256>>>(dp, dwa, n, splits, beta);
    igemm_reduce_splits_lanes<<<bl, 256>>>(dp, dwb, n, splits, beta);
    cudaError_t e = cudaDeviceSynchronize();
    std::vector<float> a(n), b(n);
    cudaMemcpy(a.data(), dwa, wb, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), dwb, wb, cudaMemcpyDeviceToHost);
    cudaFree(dp); cudaFree(dwa); cudaFree(dwb);
    if (e != cudaSuccess) { report(false, name, cudaGetErrorString(e)); return; }
    char why[200] = "";
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            snprintf(why, sizeof why, "element %d: warp %.9g, lanes %.9g", i, (double)a[i], (double)b[i]);
            ok = false;
            break;
        }
        double s = 0.0, mag = 0.0;
        for (int k = 0; k < splits; k++) {
            s += part[(size_t)k * n + i];
            mag += fabs(part[(size_t)k * n + i]);
        }
        s += (double)beta * dw0[i];
        mag += fabs((double)beta * dw0[i]);
        if (fabs(s - (double)b[i]) > 1e-5 * (mag + 1e-30)) {
            snprintf(why, sizeof why, "element %d: %.9g vs f64 %.9g", i, (double)b[i], s);
            ok = false;
        }
    }
    report(ok, name, why);
}

int main() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("skip split-K folds: no CUDA device\n");
        return 0;
    }
    /* splits 17..528 (the warp fold's range starts above 16), element counts
     * below and above one block, not multiples of 32 or 256 */
    run(1, 17, 0.0f, 1);
    run(432, 528, 0.0f, 2);
    run(4608, 33, 0.0f, 3);
    run(8192, 100, 0.0f, 4);
    run(9001, 64, 0.5f, 5);
    run(36864, 58, 0.0f, 6);
    run(36864, 58, 1.0f, 7);
    run(295000, 31, 0.0f, 8);
    run(1100000, 20, 0.0f, 9); /* more elements than the grid cap x 256: the grid-stride loop */
    printf("%d passed, %d failed\n", oks, fails);
    return fails != 0;
}
