/*
 * bench_loader.c — training batches per second of the data loader.
 *
 * Batch 4, imgsz 640, mosaic + affine + HSV + flip (pose defaults), prepared
 * images cached in RAM, with 1, 2 and 4 worker threads (and the HSV stage
 * skipped, as with device HSV; 8 threads for reference). Target (issue 5): 4 threads deliver a batch
 * in < 2.5 ms (400 batches/s) on the GPU machine's CPU.
 *
 *   build:  make build/libengine.a && gcc -std=c11 -O2 -D_GNU_SOURCE -Iengine \
 *             bench/bench_loader.c build/libengine.a <ALL_LIBS> -o build/bench_loader
 *   run:    build/bench_loader [dataset_images_dir] [seconds_per_config]
 *                                [threads,...] [hsv: both|cpu|device]
 *           e.g. build/bench_loader "" 3 1,2 device
 *
 * Besides wall ms/batch it prints the CPU time of the process per batch
 * (all threads), the work the loader costs whatever the core count.
 *
 * Default dataset: $LUCID_DATASETS/coco-pose-mini/images/train, then
 * ../shared/datasets/..., then datasets/....
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "data/data.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *find_dataset(char *buf, size_t len) {
    const char *env = getenv("LUCID_DATASETS");
    const char *c[3] = {env, "../shared/datasets", "datasets"};
    for (int i = 0; i < 3; i++) {
        if (!c[i]) continue;
        snprintf(buf, len, "%s/coco-pose-mini/images/train", c[i]);
        struct stat sb;
        if (stat(buf, &sb) == 0) return buf;
    }
    return NULL;
}

/* batches per second over at least `secs` seconds (after one warm epoch) */
static int measure(lucid_ctx *ctx, lucid_dataset *ds, int threads,
                   const lucid_aug_params *p, double secs, double *bps,
                   double *ms, double *cpu_ms) {
    lucid_loader_options o = lucid_loader_options_default();
    o.batch = 4;
    o.imgsz = 640;
    o.threads = threads;
    o.prefetch = 8;
    o.max_gt = 128;
    lucid_loader *ld;
    if (lucid_loader_create(ctx, ds, &o, &ld) != LUCID_OK) return -1;
    lucid_batch *b;
    uint64_t epoch = 0;
    lucid_loader_start_epoch(ld, epoch++, p);
    while (lucid_loader_next(ld, &b) == LUCID_OK && b) {}
    long n = 0;
    double t0 = now(), t = t0, c0 = cpu_now();
    while (t - t0 < secs) {
        lucid_loader_start_epoch(ld, epoch++, p);
        for (;;) {
            lucid_status st = lucid_loader_next(ld, &b);
            if (st != LUCID_OK) {
                fprintf(stderr, "loader: %s\n", lucid_ctx_error(ctx));
                lucid_loader_release(ld);
                return -1;
            }
            if (!b) break;
            n++;
        }
        t = now();
    }
    double c1 = cpu_now();
    lucid_loader_release(ld);
    *bps = n / (t - t0);
    *ms = 1000.0 / *bps;
    *cpu_ms = 1000.0 * (c1 - c0) / (n > 0 ? n : 1);
    return 0;
}

int main(int argc, char **argv) {
    char buf[512];
    const char *dir = argc > 1 && argv[1][0] ? argv[1] : find_dataset(buf, sizeof buf);
    double secs = argc > 2 ? atof(argv[2]) : 3.0;
    if (!dir) {
        printf("skip bench_loader: coco-pose-mini not found\n");
        return 0;
    }
    lucid_ctx *ctx;
    char err[256];
    if (lucid_ctx_create(NULL, &ctx, err, sizeof err) != LUCID_OK) {
        fprintf(stderr, "context: %s\n", err);
        return 1;
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.threads = 4;
    lucid_dataset *ds;
    double t0 = now();
    if (lucid_dataset_open_yolo(ctx, dir, &o, &ds) != LUCID_OK) {
        fprintf(stderr, "dataset: %s\n", lucid_ctx_error(ctx));
        return 1;
    }
    char sum[512];
    lucid_dataset_summary(ds, sum, sizeof sum);
    printf("dataset %s: %s (scan %.2f s)\n", dir, sum, now() - t0);
    lucid_aug_params p = lucid_aug_params_default();
    int threads[16] = {1, 2, 4, 8}, nth = 4;
    if (argc > 3 && argv[3][0]) {
        nth = 0;
        for (const char *c = argv[3]; *c && nth < 16;) {
            char *e;
            long v = strtol(c, &e, 10);
            if (e == c || v < 1) break;
            threads[nth++] = (int)v;
            c = *e == ',' ? e + 1 : e;
            if (!*e) break;
        }
    }
    const char *modes = argc > 4 ? argv[4] : "both";
    int hsv_hi = strcmp(modes, "device") ? 1 : 0, hsv_lo = strcmp(modes, "cpu") ? 0 : 1;
    for (int hsv = hsv_hi; hsv >= hsv_lo; hsv--) {
        p.hsv_on_cpu = hsv;
        for (int i = 0; i < nth; i++) {
            double bps, ms, cpu_ms;
            if (measure(ctx, ds, threads[i], &p, secs, &bps, &ms, &cpu_ms)) {
                fprintf(stderr, "failed: %s\n", lucid_ctx_error(ctx));
                return 1;
            }
            printf("loader batch 4 imgsz 640 mosaic+affine%s+flip cache threads %d: "
                   "%.1f batches/s (%.2f ms/batch, cpu %.2f ms/batch)\n",
                   hsv ? "+HSV" : " (HSV on device)", threads[i], bps, ms,
                   cpu_ms);
            fflush(stdout);
        }
    }
    lucid_dataset_release(ds);
    lucid_ctx_release(ctx);
    return 0;
}
