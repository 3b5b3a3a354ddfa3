/*
 * parallel.c — split an index range over short-lived threads.
 *
 * Contract: cpu_parallel_for(ctx, n, grain, fn, arg) calls fn(arg, begin,
 * end) on disjoint ranges covering [0, n) exactly once, and returns when all
 * are done. The number of workers is ctx->cpu_threads when > 0, else the
 * online CPUs (at most CPU_MAX_THREADS), and at most n / grain; below two
 * ranges, or when a thread cannot be started, the work runs on the caller's
 * thread. Used only for element-independent work (elementwise ops, random
 * fills), so results never depend on the thread count.
 */
#include "cpu.h"
#include <pthread.h>
#include <unistd.h>

#define CPU_MAX_THREADS 32

typedef struct range_job {
    cpu_range_fn fn;
    void *arg;
    int64_t begin, end;
} range_job;

static void *range_main(void *p) {
    range_job *j = p;
    j->fn(j->arg, j->begin, j->end);
    return NULL;
}

int cpu_num_threads(const lucid_ctx *ctx) {
    int t = ctx && ctx->cpu_threads > 0 ? ctx->cpu_threads : 0;
    if (t == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        t = c > 0 ? (int)c : 1;
    }
    return t > CPU_MAX_THREADS ? CPU_MAX_THREADS : t;
}

void cpu_parallel_for(lucid_ctx *ctx, int64_t n, int64_t grain,
                      cpu_range_fn fn, void *arg) {
    int64_t t = cpu_num_threads(ctx);
    if (grain < 1) grain = 1;
    if (t > n / grain) t = n / grain;
    if (t < 2) {
        if (n > 0) fn(arg, 0, n);
        return;
    }
    pthread_t th[CPU_MAX_THREADS];
    range_job jobs[CPU_MAX_THREADS];
    int started[CPU_MAX_THREADS] = {0};
    int64_t per = (n + t - 1) / t;
    for (int64_t k = 0; k < t; k++) {
        jobs[k].fn = fn;
        jobs[k].arg = arg;
        jobs[k].begin = k * per;
        jobs[k].end = (k + 1) * per < n ? (k + 1) * per : n;
    }
    /* workers take ranges 1..t-1, the caller takes range 0 */
    for (int64_t k = 1; k < t; k++)
        started[k] = pthread_create(&th[k], NULL, range_main, &jobs[k]) == 0;
    fn(arg, jobs[0].begin, jobs[0].end);
    for (int64_t k = 1; k < t; k++) {
        if (started[k]) pthread_join(th[k], NULL);
        else fn(arg, jobs[k].begin, jobs[k].end); /* could not start: run here */
    }
}
