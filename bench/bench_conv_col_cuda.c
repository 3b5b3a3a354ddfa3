/*
 * bench_conv_col_cuda.c — the im2col + cuBLAS conv route (cuda/nn_conv_col.cu)
 * against the implicit GEMM, per conv shape and pass, to set which passes
 * and shapes the route takes by default (cuda/nn_conv_col.cuh).
 *
 * Shapes: every groups-1 conv with a spatial kernel of YOLO11n-pose at
 * batch 4, 640 (bench/conv_lab/shapes.txt, or the file given as argv[1]),
 * bf16.  Each pass (forward, backward-data with beta 0, backward-filter with
 * beta 1) is timed on the GPU alone (time_pass: 30 calls recorded into a
 * CUDA graph, the median of 11 replays); the implicit GEMM with the route
 * off (lucid_cuda_nn_set_conv_col 1), then the route on for every pass
 * (set_conv_col 8; "-" where the route does not apply to the shape).
 * Shapes the small-channel route takes (forward, backward-data) are timed
 * with that route off, so both columns are the two routes named.  Times
 * are of calls one at a time (in a training step several streams share the
 * GPU); "calls" is the calls per training step (shapes.txt counts).
 *
 *   run: make bench (bench/run.sh builds every bench_*.c), or
 *        build/bench/bench_conv_col_cuda [shapes.txt]
 *
 * The route's im2col kernel follows LUCID_COL_IM2COL (nn_conv_col.cuh:
 * unset: the tiled shared-memory kernel, "0": the per-thread one; the
 * first line printed names it): run the bench once with each to compare
 * them (the "col us" column; the GEMMs are the same), and
 * LUCID_COL_IM2COL_TILE to try another tile cap.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

#define BENCH_NAME "bench_conv_col_cuda"
#include "bench_cuda_util.h"

int lucid_cuda_nn_set_conv_col(lucid_ctx *ctx, int route);   /* cuda/nn_table.cu */
int lucid_cuda_nn_set_conv_small(lucid_ctx *ctx, int route); /* cuda/nn_table.cu */
void *lucid_cuda_nn_stream(lucid_ctx *ctx);
void lucid_cuda_nn_state_destroy(lucid_ctx *ctx);
unsigned long lucid_cuda_conv_col_launch_count(void);

#define WARMUP 5
#define REPS 30

static lucid_tensor *mk(lucid_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, double lo,
                        double hi) {
    return mk_seeded(1234, dt, a, b, c, d, lo, hi);
}

/* GPU microseconds per call of one pass: after WARMUP eager calls (plan,
 * arena, cuBLAS's kernels), REPS calls are captured into one CUDA graph on
 * the context's compute stream, and the graph is replayed GRAPHS times;
 * the median replay over REPS.  The host's launch cost (cuBLAS calls cost
 * several microseconds each) is left out, as in a recorded training step. */
#define GRAPHS 11
static double time_pass(bufs *b, int pass) {
    cudaStream_t s = (cudaStream_t)lucid_cuda_nn_stream(ctx);
    for (int i = 0; i < WARMUP; i++)
        if (run_pass(b, pass)) die("warm-up");
    if (lucid_ctx_synchronize(ctx)) die("sync");
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        die("cudaStreamBeginCapture");
    for (int i = 0; i < REPS; i++)
        if (run_pass(b, pass)) die("run (capture)");
    if (cudaStreamEndCapture(s, &g) != cudaSuccess) die("cudaStreamEndCapture");
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) die("cudaGraphInstantiate");
    cudaEvent_t ev[GRAPHS + 1];
    float ms[GRAPHS];
    for (int i = 0; i <= GRAPHS; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess) die("cudaEventCreate");
    cudaGraphLaunch(ge, s); /* upload */
    cudaEventRecord(ev[0], s);
    for (int i = 0; i < GRAPHS; i++) {
        cudaGraphLaunch(ge, s);
        cudaEventRecord(ev[i + 1], s);
    }
    if (cudaEventSynchronize(ev[GRAPHS]) != cudaSuccess) die("cudaEventSynchronize");
    for (int i = 0; i < GRAPHS; i++) cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]);
    for (int i = 0; i <= GRAPHS; i++) cudaEventDestroy(ev[i]);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    qsort(ms, GRAPHS, sizeof ms[0], cmp_f);
    return 1e3 * ms[GRAPHS / 2] / REPS;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "bench/conv_lab/shapes.txt";
    if (!lucid_cuda_available()) {
        printf("skip bench_conv_col_cuda: no CUDA device\n");
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_conv_col_cuda: cannot open %s\n", path);
        return 1;
    }
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[512] = "";
    if (lucid_ctx_create(&o, &ctx, err, sizeof err)) {
        fprintf(stderr, "bench_conv_col_cuda: context: %s\n", err);
        return 1;
    }
    lucid_cuda_nn_set_conv_small(ctx, 1);
    static const char *PASS[3] = {"fwd", "dgrad", "wgrad"};
    double tot[3][2] = {{0}};
    {
        const char *ik = getenv("LUCID_COL_IM2COL"), *tc = getenv("LUCID_COL_IM2COL_TILE");
        printf("im2col kernel: %s (LUCID_COL_IM2COL=%s, LUCID_COL_IM2COL_TILE=%s)\n",
               ik && strcmp(ik, "0") == 0 ? "per-thread" : "tiled", ik ? ik : "",
               tc ? tc : "");
    }
    printf("%-30s %5s %-5s %9s %9s %6s\n", "shape N Cin HxW Cout k s", "calls", "pass",
           "igemm us", "col us", "ratio");
    printf("(GPU time per call: calls recorded into a CUDA graph, replayed)\n");
    char line[512];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n') continue;
        long long N, Cin, H, W, Cout, k, s, pad, g, Ho, Wo, cnt, dcnt;
        if (sscanf(line, "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &N,
                   &Cin, &H, &W, &Cout, &k, &s, &pad, &g, &Ho, &Wo, &cnt, &dcnt) != 13) {
            fprintf(stderr, "bench_conv_col_cuda: %s:%d: expected 13 numbers: %s", path, lineno,
                    line);
            return 1;
        }
        if (g != 1 || k == 1) continue;
        bufs b;
        b.p = (lucid_conv2d_params){(int)s, (int)s, (int)pad, (int)pad, 1, 1, 1};
        b.x = mk(LUCID_BF16, N, Cin, H, W, -1, 1);
        b.w = mk(LUCID_F32, Cout, Cin, k, k, -0.1, 0.1);
        b.y = mk(LUCID_BF16, N, Cout, Ho, Wo, -1, 1);
        b.dy = mk(LUCID_BF16, N, Cout, Ho, Wo, -1, 1);
        b.dx = mk(LUCID_BF16, N, Cin, H, W, -1, 1);
        b.dw = mk(LUCID_F32, Cout, Cin, k, k, -1, 1);
        char name[64];
        snprintf(name, sizeof name, "%lld %lld %lldx%lld %lld k%lld s%lld", N, Cin, H, W, Cout, k,
                 s);
        for (int pass = 0; pass < 3; pass++) {
            long long calls = pass == 1 ? dcnt : cnt;
            if (calls == 0) continue;
            lucid_cuda_nn_set_conv_col(ctx, 1);
            double ig = time_pass(&b, pass);
            lucid_cuda_nn_set_conv_col(ctx, 8);
            unsigned long c0 = lucid_cuda_conv_col_launch_count();
            double co = time_pass(&b, pass);
            int took = lucid_cuda_conv_col_launch_count() != c0;
            if (took) {
                printf("%-30s %5lld %-5s %9.1f %9.1f %6.2f\n", name, calls, PASS[pass], ig, co,
                       co / ig);
                tot[pass][0] += calls * ig;
                tot[pass][1] += calls * co;
            } else {
                printf("%-30s %5lld %-5s %9.1f %9s %6s\n", name, calls, PASS[pass], ig, "-", "-");
            }
        }
        lucid_cuda_nn_set_conv_col(ctx, 0);
        lucid_tensor_release(b.x); lucid_tensor_release(b.w); lucid_tensor_release(b.y);
        lucid_tensor_release(b.dy); lucid_tensor_release(b.dx); lucid_tensor_release(b.dw);
    }
    fclose(f);
    for (int pass = 0; pass < 3; pass++)
        printf("sum over the shapes the route takes, x calls: %-5s igemm %8.1f us, col %8.1f us\n",
               PASS[pass], tot[pass][0], tot[pass][1]);
    lucid_cuda_nn_state_destroy(ctx);
    lucid_ctx_release(ctx);
    return 0;
}
