/*
 * bench_nn_cuda.c — speed of the CUDA convolution (cuda/nn_conv.cu) on a few
 * layer shapes of the nano pose network at batch 4, f32 and bf16.
 *
 * Each pass (forward, backward-data, backward-weight) is timed with CUDA
 * events recorded on the context's compute stream around every call: 5
 * warm-up calls (plan creation, arena growth), then 50 timed calls; the
 * table shows the median in ms and the effective TFLOP/s (2*N*Cout*Ho*Wo*
 * Cin/g*kh*kw per pass).  Inputs are uniform random (never zeros).
 * Depthwise convs are timed on both routes: "auto" (direct kernels) and
 * "cudnn" (lucid_cuda_nn_set_conv_mode 2), to decide which one auto takes.
 *
 *   build: make CUDA=1 build/libengine.a && gcc -O2 -Iengine \
 *            -I$CUDA_HOME/include bench/bench_nn_cuda.c build/libengine.a \
 *            <the Makefile's ALL_LIBS> -o build/bench_nn_cuda
 *   run:   build/bench_nn_cuda
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

#define BENCH_NAME "bench_nn_cuda"
#include "bench_cuda_util.h"

int lucid_cuda_nn_set_conv_mode(lucid_ctx *ctx, int mode); /* cuda/nn_table.cu */
void *lucid_cuda_nn_stream(lucid_ctx *ctx);
void lucid_cuda_nn_state_destroy(lucid_ctx *ctx);

#define WARMUP 5
#define REPS 50

static void cuda_die(const char *what, cudaError_t e) {
    fprintf(stderr, "bench_nn_cuda: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

static lucid_tensor *mk(lucid_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, double lo,
                        double hi) {
    return mk_seeded(4321, dt, a, b, c, d, lo, hi);
}

typedef struct shape {
    const char *name;
    int64_t N, Cin, H, W, Cout;
    int k, s, g;
} shape;

/* median ms of REPS calls of one pass */
static double time_pass(bufs *b, int pass) {
    cudaStream_t s = (cudaStream_t)lucid_cuda_nn_stream(ctx);
    cudaEvent_t ev[REPS + 1];
    float ms[REPS];
    cudaError_t e;
    for (int i = 0; i < WARMUP; i++)
        if (run_pass(b, pass)) die("warm-up");
    if (lucid_ctx_synchronize(ctx)) die("sync");
    for (int i = 0; i <= REPS; i++)
        if ((e = cudaEventCreate(&ev[i])) != cudaSuccess) cuda_die("cudaEventCreate", e);
    if ((e = cudaEventRecord(ev[0], s)) != cudaSuccess) cuda_die("cudaEventRecord", e);
    for (int i = 0; i < REPS; i++) {
        if (run_pass(b, pass)) die("run");
        if ((e = cudaEventRecord(ev[i + 1], s)) != cudaSuccess) cuda_die("cudaEventRecord", e);
    }
    if ((e = cudaEventSynchronize(ev[REPS])) != cudaSuccess) cuda_die("cudaEventSynchronize", e);
    for (int i = 0; i < REPS; i++)
        if ((e = cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1])) != cudaSuccess)
            cuda_die("cudaEventElapsedTime", e);
    for (int i = 0; i <= REPS; i++) cudaEventDestroy(ev[i]);
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    return 0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]);
}

int main(void) {
    if (!lucid_cuda_available()) {
        printf("skip bench_nn_cuda: no CUDA device\n");
        return 0;
    }
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[512] = "";
    if (lucid_ctx_create(&o, &ctx, err, sizeof err)) {
        fprintf(stderr, "bench_nn_cuda: context: %s\n", err);
        return 1;
    }
    static const shape SH[] = {
        {"16->32 k3 s2 @320", 4, 16, 320, 320, 32, 3, 2, 1},
        {"32->32 k3 s1 @160", 4, 32, 160, 160, 32, 3, 1, 1},
        {"64->64 k3 s1 @80", 4, 64, 80, 80, 64, 3, 1, 1},
        {"128->64 k1 s1 @40", 4, 128, 40, 40, 64, 1, 1, 1},
        {"256->256 k3 s1 @20", 4, 256, 20, 20, 256, 3, 1, 1},
        {"dw64 k3 s1 @80", 4, 64, 80, 80, 64, 3, 1, 64},
        {"dw128 k3 s1 @40", 4, 128, 40, 40, 128, 3, 1, 128},
    };
    static const lucid_dtype DT[2] = {LUCID_F32, LUCID_BF16};
    static const char *PASS[3] = {"fwd", "bwd_data", "bwd_filter"};
    printf("%-20s %-5s %-6s %-10s %9s %8s\n", "shape (N=4)", "dtype", "route", "pass",
           "median ms", "TFLOP/s");
    for (size_t i = 0; i < sizeof SH / sizeof SH[0]; i++) {
        const shape *sh = &SH[i];
        int64_t Ho = lucid_nn_conv_out_size(sh->H, sh->k, sh->s, sh->k / 2, 1);
        int64_t Wo = lucid_nn_conv_out_size(sh->W, sh->k, sh->s, sh->k / 2, 1);
        double flops = 2.0 * sh->N * sh->Cout * Ho * Wo * (sh->Cin / sh->g) * sh->k * sh->k;
        int dw = sh->g == sh->Cin && sh->g == sh->Cout;
        for (int d = 0; d < 2; d++) {
            bufs b;
            b.p = (lucid_conv2d_params){sh->s, sh->s, sh->k / 2, sh->k / 2, 1, 1, sh->g};
            b.x = mk(DT[d], sh->N, sh->Cin, sh->H, sh->W, -1, 1);
            b.w = mk(LUCID_F32, sh->Cout, sh->Cin / sh->g, sh->k, sh->k, -0.1, 0.1);
            b.y = mk(DT[d], sh->N, sh->Cout, Ho, Wo, -1, 1);
            b.dy = mk(DT[d], sh->N, sh->Cout, Ho, Wo, -1, 1);
            b.dx = mk(DT[d], sh->N, sh->Cin, sh->H, sh->W, -1, 1);
            b.dw = mk(LUCID_F32, sh->Cout, sh->Cin / sh->g, sh->k, sh->k, -1, 1);
            for (int route = 0; route < (dw ? 2 : 1); route++) {
                lucid_cuda_nn_set_conv_mode(ctx, route ? 2 : 0);
                for (int pass = 0; pass < 3; pass++) {
                    double ms = time_pass(&b, pass);
                    printf("%-20s %-5s %-6s %-10s %9.4f %8.2f\n", sh->name,
                           lucid_dtype_name(DT[d]), route ? "cudnn" : "auto", PASS[pass], ms,
                           flops / (ms * 1e-3) / 1e12);
                }
            }
            lucid_cuda_nn_set_conv_mode(ctx, 0);
            lucid_tensor_release(b.x); lucid_tensor_release(b.w); lucid_tensor_release(b.y);
            lucid_tensor_release(b.dy); lucid_tensor_release(b.dx); lucid_tensor_release(b.dw);
        }
    }
    lucid_cuda_nn_state_destroy(ctx);
    lucid_ctx_release(ctx);
    return 0;
}
