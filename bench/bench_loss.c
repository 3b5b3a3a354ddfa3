/*
 * bench_loss.c — pose loss forward+backward time (engine/train/loss.h) at
 * batch 4, 640x640 (8400 anchors), with 10 and with 60 instances per image,
 * f32 and bf16 outputs.
 *
 *   GPU: CUDA events on the context's compute stream around each
 *        forward+backward (the loss kernel table's time_calls hook, so this
 *        file needs no CUDA header); 10 warm-up calls, median of 100.
 *        Target: < 0.5 ms on the H200 for 10 instances per image.
 *   CPU: the reference, wall clock, median of 5 (for reference).
 * Random outputs (uniform), random boxes with keypoints inside them.
 * Each GPU configuration is timed with the new loss kernels (k_topk2,
 * k_items + k_loss2, k_backward2) and with the old ones (LUCID_LOSS_TOPK=0
 * LUCID_LOSS_TERMS=0, cuda/loss.cu), alternating in one process; the two
 * give the same bits (spec/c/test_loss_cuda.c).
 *
 *   run: make bench (or build like bench/run.sh and run build/bench/bench_loss)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/loss.h"
#include "train/loss_backend.h"

#define WARMUP 10
#define REPS 100
#define CPU_REPS 5

static lucid_ctx *ctx;

static void die(const char *what) {
    fprintf(stderr, "bench_loss: %s: %s\n", what, lucid_ctx_error(ctx));
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct run {
    lucid_pose_loss_plan *plan;
    lucid_tensor *pb, *pc, *pk, *gb, *gc, *gk, *total, *items;
    lucid_tensor *tc, *tb, *tk, *tv;
    lucid_pose_targets tg;
} run;

static lucid_tensor *mk(lucid_device dev, lucid_dtype dt, int nd, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t;
    if (lucid_tensor_zeros(ctx, dev, dt, nd, sh, &t)) die("alloc");
    return t;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}

/* Host targets with n instances per image (G = max_gt rows). */
static void fill_targets(lucid_tensor *tc, lucid_tensor *tb, lucid_tensor *tk,
                         lucid_tensor *tv, int B, int G, int n) {
    float *c = lucid_tensor_data(tc), *bx = lucid_tensor_data(tb);
    float *k = lucid_tensor_data(tk);
    uint8_t *v = lucid_tensor_data(tv);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            int64_t r = (int64_t)b * G + g;
            c[r] = 0;
            v[r] = g < n;
            double w = 0.02 + 0.4 * urand(), h = 0.02 + 0.4 * urand();
            double x = w / 2 + (1 - w) * urand(), y = h / 2 + (1 - h) * urand();
            bx[r * 4 + 0] = (float)x, bx[r * 4 + 1] = (float)y;
            bx[r * 4 + 2] = (float)w, bx[r * 4 + 3] = (float)h;
            for (int j = 0; j < 17; j++) {
                float vis = urand() < 0.3 ? 0.0f : 2.0f;
                k[(r * 17 + j) * 3 + 0] = vis ? (float)(x + (urand() - .5) * w) : 0;
                k[(r * 17 + j) * 3 + 1] = vis ? (float)(y + (urand() - .5) * h) : 0;
                k[(r * 17 + j) * 3 + 2] = vis;
            }
        }
}

static void setup(run *R, lucid_device dev, lucid_dtype dt, int B, int G,
                  int n) {
    memset(R, 0, sizeof *R);
    const lucid_device cpu = {LUCID_CPU, 0};
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    cfg.batch = B, cfg.max_gt = G;
    lucid_pose_loss_config_levels(&cfg, 640, 640);
    if (lucid_pose_loss_plan_create(ctx, dev, &cfg, &R->plan)) die("plan");
    const int A = lucid_pose_loss_plan_anchors(R->plan);
    lucid_tensor *h[3] = {mk(cpu, LUCID_F32, 3, B, 64, A, 0),
                          mk(cpu, LUCID_F32, 3, B, 1, A, 0),
                          mk(cpu, LUCID_F32, 3, B, 51, A, 0)};
    lucid_rand_uniform(ctx, h[0], 5, 0, -3.0, 3.0);
    lucid_rand_uniform(ctx, h[1], 5, 1u << 28, -6.0, 1.0);
    lucid_rand_uniform(ctx, h[2], 5, 2u << 28, -1.0, 1.0);
    lucid_tensor **d[3] = {&R->pb, &R->pc, &R->pk};
    for (int i = 0; i < 3; i++) {
        if (lucid_tensor_to(ctx, h[i], dev, dt, d[i])) die("copy");
        lucid_tensor_release(h[i]);
    }
    R->gb = mk(dev, dt, 3, B, 64, A, 0);
    R->gc = mk(dev, dt, 3, B, 1, A, 0);
    R->gk = mk(dev, dt, 3, B, 51, A, 0);
    R->total = mk(dev, LUCID_F32, 1, 1, 0, 0, 0);
    R->items = mk(dev, LUCID_F32, 1, 5, 0, 0, 0);
    lucid_tensor *tc = mk(cpu, LUCID_F32, 2, B, G, 0, 0);
    lucid_tensor *tb = mk(cpu, LUCID_F32, 3, B, G, 4, 0);
    lucid_tensor *tk = mk(cpu, LUCID_F32, 4, B, G, 17, 3);
    lucid_tensor *tv = mk(cpu, LUCID_U8, 2, B, G, 0, 0);
    rs = 0x9E3779B97F4A7C15ull + (uint64_t)n;
    fill_targets(tc, tb, tk, tv, B, G, n);
    if (lucid_tensor_to(ctx, tc, dev, LUCID_F32, &R->tc) ||
        lucid_tensor_to(ctx, tb, dev, LUCID_F32, &R->tb) ||
        lucid_tensor_to(ctx, tk, dev, LUCID_F32, &R->tk) ||
        lucid_tensor_to(ctx, tv, dev, LUCID_U8, &R->tv))
        die("targets");
    lucid_tensor_release(tc), lucid_tensor_release(tb);
    lucid_tensor_release(tk), lucid_tensor_release(tv);
    R->tg = (lucid_pose_targets){R->tc, R->tb, R->tk, R->tv};
}

static void teardown(run *R) {
    lucid_tensor *ts[] = {R->pb, R->pc, R->pk, R->gb, R->gc, R->gk,
                          R->total, R->items, R->tc, R->tb, R->tk, R->tv};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lucid_tensor_release(ts[i]);
    lucid_pose_loss_plan_destroy(R->plan);
}

static lucid_status step(void *arg) {
    run *R = arg;
    lucid_status s = lucid_pose_loss_forward(ctx, R->plan, R->pb, R->pc, R->pk,
                                             &R->tg, R->total, R->items);
    if (s != LUCID_OK) return s;
    return lucid_pose_loss_backward(ctx, R->plan, R->pb, R->pc, R->pk, NULL,
                                    R->gb, R->gc, R->gk);
}

int main(void) {
    const int gpu = lucid_cuda_available();
    lucid_ctx_options opt = lucid_ctx_options_default();
    if (gpu) opt.device = (lucid_device){LUCID_CUDA, 0};
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        fprintf(stderr, "bench_loss: context: %s\n", err);
        return 1;
    }
    const int B = 4, inst[2] = {10, 60};
    const lucid_dtype dts[2] = {LUCID_F32, LUCID_BF16};
    printf("pose loss forward+backward, batch %d, 640x640 (8400 anchors), "
           "max_gt = instances per image\n", B);
    if (!gpu) printf("(no CUDA device: CPU reference only)\n");
    for (int ii = 0; ii < 2; ii++) {
        const int n = inst[ii];
        /* CPU reference, f32 */
        run R;
        setup(&R, (lucid_device){LUCID_CPU, 0}, LUCID_F32, B, n, n);
        float t[CPU_REPS];
        for (int r = 0; r < CPU_REPS; r++) {
            double t0 = now();
            if (step(&R)) die("cpu step");
            t[r] = (float)((now() - t0) * 1e3);
        }
        qsort(t, CPU_REPS, sizeof *t, cmp_f);
        printf("  cpu  f32   %2d inst/img: %9.3f ms (median of %d)\n", n,
               t[CPU_REPS / 2], CPU_REPS);
        teardown(&R);
        if (!gpu) continue;
        const lucid_pose_loss_kernels *k = lucid_pose_loss_cuda_kernels();
        if (!k) die("no CUDA loss kernels");
        for (int di = 0; di < 2; di++) {
            setup(&R, (lucid_device){LUCID_CUDA, 0}, dts[di], B, n, n);
            for (int old = 0; old < 2; old++) {
                /* the kernel switches of cuda/loss.cu, read at every call */
                setenv("LUCID_LOSS_TOPK", old ? "0" : "1", 1);
                setenv("LUCID_LOSS_TERMS", old ? "0" : "1", 1);
                float ms[REPS];
                for (int w = 0; w < WARMUP; w++)
                    if (step(&R)) die("gpu step");
                if (k->time_calls(ctx, step, &R, REPS, ms)) die("timing");
                qsort(ms, REPS, sizeof *ms, cmp_f);
                double nfg = 0;
                lucid_pose_loss_read_assignment(ctx, R.plan, NULL, NULL, &nfg,
                                                NULL);
                printf("  cuda %-4s  %2d inst/img %s kernels: %9.4f ms median "
                       "(min %.4f, p90 %.4f) of %d; n_fg %g%s\n",
                       dts[di] == LUCID_F32 ? "f32" : "bf16", n,
                       old ? "old" : "new", ms[REPS / 2], ms[0],
                       ms[REPS * 9 / 10], REPS, nfg,
                       n == 10 && !old
                           ? (ms[REPS / 2] < 0.5 ? "  [target < 0.5 ms: met]"
                                                 : "  [target < 0.5 ms: MISSED]")
                           : "");
            }
            unsetenv("LUCID_LOSS_TOPK");
            unsetenv("LUCID_LOSS_TERMS");
            teardown(&R);
        }
    }
    lucid_ctx_release(ctx);
    return 0;
}
