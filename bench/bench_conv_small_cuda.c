/*
 * bench_conv_small_cuda.c — the small-channel 3x3 conv kernels
 * (cuda/nn_conv_small.cu): v1 (CUDA-core fmaf) against v2 (tensor cores),
 * on the five (shape, pass) pairs of YOLO11n-pose at batch 4, 640, bf16
 * that the CUPTI trace of the recorded training step shows on its critical
 * path (layer 0 forward 3->16 s2 640->320; the 160x160 C3k2 bottleneck's
 * cv1 16->8 and cv2 8->16, forward and backward-data), plus the two
 * backward-data passes with beta 1 (dx accumulated).
 *
 * Each pass is called directly (lucid_conv_small_forward / _backward_data on
 * the context's compute stream: the kernel alone, no routing), eagerly,
 * with the generation forced by lucid_conv_small_set_version.  Per
 * generation and round: 10 warm-up calls, then REPS calls queued behind a
 * gate (a host function that holds the stream until every call and event
 * is queued, so the GPU never waits for the host), with a CUDA event after
 * each; interval i = call i's GPU time (plus one event record).  Two rounds
 * per generation, alternating v1, v2, v1, v2; the median of the 2*REPS
 * intervals.  Inputs are the same every call (L2-resident after the first,
 * as in the training step, where the producer has just written them).
 *
 * Output: one line per pair: old (v1) and new (v2) medians in
 * microseconds, new/old, the kernel generation each call took (a pass v2
 * does not take shows "v1" twice), and as a sanity check the largest
 * |new - old| over the largest |old| of one call on fresh buffers.
 *
 *   run (GPU machine, after make): make bench (every bench_*.c), or
 *     make build/bench/bench_conv_small_cuda && build/bench/bench_conv_small_cuda
 *   arguments (optional): [REPS (default 200)] [bf16|f16 (default bf16)]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/nn.h"
#include "../cuda/nn_conv_small.cuh"

#define BENCH_NAME "bench_conv_small_cuda"
#include "bench_cuda_util.h"

void *lucid_cuda_nn_stream(lucid_ctx *ctx); /* cuda/nn_table.cu */
void lucid_cuda_nn_state_destroy(lucid_ctx *ctx);

#define WARMUP 10
#define ROUNDS 2

typedef struct pair {
    const char *tag;
    int64_t N, Cin, H, W, Cout;
    int s, pass; /* 0 forward, 1 backward-data */
    double beta;
} pair;

static const pair PAIRS[] = {
    {"layer 0 3>16 s2 640 fwd", 4, 3, 640, 640, 16, 2, 0, 0.0},
    {"C3k2 cv1 16>8 160 fwd", 4, 16, 160, 160, 8, 1, 0, 0.0},
    {"C3k2 cv2 8>16 160 fwd", 4, 8, 160, 160, 16, 1, 0, 0.0},
    {"C3k2 cv1 16>8 160 dgrad", 4, 16, 160, 160, 8, 1, 1, 0.0},
    {"C3k2 cv2 8>16 160 dgrad", 4, 8, 160, 160, 16, 1, 1, 0.0},
    {"C3k2 cv1 16>8 160 dgrad b1", 4, 16, 160, 160, 8, 1, 1, 1.0},
    {"C3k2 cv2 8>16 160 dgrad b1", 4, 8, 160, 160, 16, 1, 1, 1.0},
};

static atomic_int gate_open;

/* Host function queued first on the stream: holds it until the calls
 * behind it are queued (at most 10 s). */
static void CUDART_CB gate(void *arg) {
    (void)arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!atomic_load(&gate_open)) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) break;
    }
}

typedef struct bench {
    const pair *p;
    lucid_dtype dt;
    lucid_conv_small_geom g;
    lucid_tensor *in, *w, *out;
    cudaStream_t stream;
} bench;

static lucid_status call(bench *b, lucid_tensor *out) {
    if (b->p->pass == 0)
        return lucid_conv_small_forward(ctx, b->stream, b->dt, &b->g, lucid_tensor_data(b->in),
                                        lucid_tensor_data(b->w), NULL, lucid_tensor_data(out));
    return lucid_conv_small_backward_data(ctx, b->stream, b->dt, &b->g, lucid_tensor_data(b->in),
                                          lucid_tensor_data(b->w), lucid_tensor_data(out),
                                          b->p->beta);
}

/* REPS intervals of the forced generation `ver` appended to ms[*n]. */
static void time_calls(bench *b, int ver, int reps, cudaEvent_t *ev, float *ms, int *n) {
    lucid_conv_small_set_version(ver);
    for (int i = 0; i < WARMUP; i++)
        if (call(b, b->out)) die("warm-up");
    if (cudaStreamSynchronize(b->stream) != cudaSuccess) die("cudaStreamSynchronize");
    atomic_store(&gate_open, 0);
    if (cudaLaunchHostFunc(b->stream, gate, NULL) != cudaSuccess) die("cudaLaunchHostFunc");
    cudaEventRecord(ev[0], b->stream);
    for (int i = 0; i < reps; i++) {
        if (call(b, b->out)) die("timed call");
        cudaEventRecord(ev[i + 1], b->stream);
    }
    atomic_store(&gate_open, 1);
    if (cudaEventSynchronize(ev[reps]) != cudaSuccess) die("cudaEventSynchronize");
    for (int i = 0; i < reps; i++) cudaEventElapsedTime(&ms[(*n)++], ev[i], ev[i + 1]);
}

/* max |new - old| / max |old| of one call each on fresh copies of out. */
static double check(bench *b) {
    lucid_tensor *o[2] = {NULL, NULL}, *h[2] = {NULL, NULL};
    const lucid_device CPU = {LUCID_CPU, 0};
    double dmax = 0, omax = 0;
    for (int v = 0; v < 2; v++) {
        if (lucid_tensor_clone(ctx, b->out, &o[v])) die("clone");
        lucid_conv_small_set_version(v + 1);
        if (call(b, o[v])) die("check call");
        if (lucid_tensor_to(ctx, o[v], CPU, LUCID_F32, &h[v])) die("copy back");
    }
    const float *x = lucid_tensor_data(h[0]), *y = lucid_tensor_data(h[1]);
    for (int64_t i = 0; i < lucid_tensor_numel(h[0]); i++) {
        double d = fabs((double)y[i] - x[i]);
        if (!(d <= dmax)) dmax = d; /* NaN sticks */
        if (fabs(x[i]) > omax) omax = fabs(x[i]);
    }
    for (int v = 0; v < 2; v++) {
        lucid_tensor_release(o[v]);
        lucid_tensor_release(h[v]);
    }
    return omax > 0 ? dmax / omax : dmax;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    lucid_dtype dt = argc > 2 && strcmp(argv[2], "f16") == 0 ? LUCID_F16 : LUCID_BF16;
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "%s: REPS %d out of 1..1000\n", BENCH_NAME, reps);
        return 1;
    }
    if (!lucid_cuda_available()) {
        printf("skip %s: no CUDA device\n", BENCH_NAME);
        return 0;
    }
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[512] = "";
    if (lucid_ctx_create(&o, &ctx, err, sizeof err)) {
        fprintf(stderr, "%s: context: %s\n", BENCH_NAME, err);
        return 1;
    }
    const int prev = lucid_conv_small_set_version(0);
    const char *venv = NULL;
    lucid_conv_small_version(&venv);
    cudaEvent_t *ev = malloc(sizeof *ev * (size_t)(reps + 1));
    float *ms[2] = {malloc(sizeof(float) * (size_t)(ROUNDS * reps)),
                    malloc(sizeof(float) * (size_t)(ROUNDS * reps))};
    if (!ev || !ms[0] || !ms[1]) {
        fprintf(stderr, "%s: out of host memory\n", BENCH_NAME);
        return 1;
    }
    for (int i = 0; i <= reps; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess) die("cudaEventCreate");
    printf("%s: %s, median of %d calls per generation (CUDA events, calls queued behind a "
           "gate); LUCID_CONV_SMALL_V=\"%s\" (overridden here)\n",
           BENCH_NAME, lucid_dtype_name(dt), ROUNDS * reps, venv ? venv : "");
    printf("%-28s %9s %9s %7s %7s %11s\n", "shape pass", "old us", "new us", "new/old", "kernels",
           "max|d|/max");
    double tot[2] = {0, 0};
    for (size_t k = 0; k < sizeof PAIRS / sizeof PAIRS[0]; k++) {
        const pair *p = &PAIRS[k];
        bench b;
        memset(&b, 0, sizeof b);
        b.p = p;
        b.dt = dt;
        b.g.N = p->N; b.g.Cin = p->Cin; b.g.H = p->H; b.g.W = p->W; b.g.Cout = p->Cout;
        b.g.Ho = (p->H - 1) / p->s + 1; b.g.Wo = (p->W - 1) / p->s + 1;
        b.g.kh = b.g.kw = 3; b.g.sh = b.g.sw = p->s; b.g.ph = b.g.pw = 1;
        b.g.dh = b.g.dw = 1; b.g.groups = 1;
        if (!lucid_conv_small_eligible(&b.g, dt)) {
            fprintf(stderr, "%s: %s not eligible\n", BENCH_NAME, p->tag);
            return 1;
        }
        const lucid_conv_small_geom *g = &b.g;
        b.w = mk_seeded(1234, LUCID_F32, g->Cout, g->Cin, 3, 3, -0.3, 0.3);
        if (p->pass == 0) {
            b.in = mk_seeded(1234, dt, g->N, g->Cin, g->H, g->W, -1, 1);
            b.out = mk_seeded(1234, dt, g->N, g->Cout, g->Ho, g->Wo, -1, 1);
        } else {
            b.in = mk_seeded(1234, dt, g->N, g->Cout, g->Ho, g->Wo, -1, 1);
            b.out = mk_seeded(1234, dt, g->N, g->Cin, g->H, g->W, -1, 1);
        }
        b.stream = (cudaStream_t)lucid_cuda_nn_stream(ctx);
        if (!b.stream || lucid_ctx_synchronize(ctx)) die("stream");
        int kern[2];
        for (int v = 0; v < 2; v++) {
            lucid_conv_small_set_version(v + 1);
            kern[v] = lucid_conv_small_kernel(&b.g, dt, p->pass);
        }
        double rel = check(&b);
        int n[2] = {0, 0};
        for (int r = 0; r < ROUNDS; r++)
            for (int v = 0; v < 2; v++) time_calls(&b, v + 1, reps, ev, ms[v], &n[v]);
        double med[2];
        for (int v = 0; v < 2; v++) {
            qsort(ms[v], (size_t)n[v], sizeof(float), cmp_f);
            med[v] = 1e3 * ms[v][n[v] / 2];
            if (p->beta == 0.0) tot[v] += med[v];
        }
        printf("%-28s %9.1f %9.1f %7.2f  v%d/v%d %11.2e\n", p->tag, med[0], med[1],
               med[1] / med[0], kern[0], kern[1], rel);
        lucid_tensor_release(b.in);
        lucid_tensor_release(b.w);
        lucid_tensor_release(b.out);
    }
    printf("%-28s %9.1f %9.1f %7.2f\n", "sum of the five (beta 0)", tot[0], tot[1],
           tot[1] / tot[0]);
    lucid_conv_small_set_version(prev);
    for (int i = 0; i <= reps; i++) cudaEventDestroy(ev[i]);
    free(ev);
    free(ms[0]);
    free(ms[1]);
    lucid_cuda_nn_state_destroy(ctx);
    lucid_ctx_release(ctx);
    return 0;
}
