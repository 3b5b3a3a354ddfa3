/*
 * ktrace.c — a kernel timeline of any CUDA process, for the replayed
 * training step (the GPU machine has no Nsight Systems).  Built as a shared
 * library and loaded by the CUDA driver through its injection hook:
 *
 *   CUDA_INJECTION64_PATH=$PWD/build/ktrace.so KTRACE_OUT=trace.csv \
 *       luajit bench/fit_once.lua record=true
 *
 * It enables CUPTI's concurrent-kernel activity records (kernels keep
 * running concurrently; CUPTI only timestamps them) and writes one CSV line
 * per kernel, graph kernel nodes included:
 *   start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name
 * (grid/block as x.y.z; names are mangled).  tools/ktrace_report.py turns
 * it into per-replay statistics.  KTRACE_MAX caps the number of lines
 * (default 3,000,000).  Build (tools/gpu-run.sh does it):
 *   gcc -std=c11 -O2 -shared -fPIC tools/ktrace.c -o build/ktrace.so \
 *       -I<cuda>/include -L<dir of libcupti.so> -lcupti
 * Source: CUPTI documentation, "Activity API" and "CUPTI injection"
 * (InitializeInjection).  A diagnostic; not part of the engine.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define KT_BUF (16u << 20)

static FILE *kt_out;
static unsigned long kt_lines, kt_max = 3000000ul;

static void CUPTIAPI kt_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = (uint8_t *)aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                 size_t valid) {
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (!kt_out || kt_lines >= kt_max) continue;
        fprintf(kt_out, "%llu,%llu,%u,%u,%llu,%d.%d.%d,%d.%d.%d,%s\n",
                (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                k->graphId, (unsigned long long)k->graphNodeId, k->gridX, k->gridY, k->gridZ,
                k->blockX, k->blockY, k->blockZ, k->name ? k->name : "?");
        kt_lines++;
    }
    free(buf);
}

static void kt_finish(void) {
    cuptiActivityFlushAll(1);
    if (kt_out) {
        fclose(kt_out);
        kt_out = NULL;
    }
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT");
    const char *mx = getenv("KTRACE_MAX");
    if (mx && *mx) kt_max = strtoul(mx, NULL, 10);
    kt_out = fopen(path && *path ? path : "ktrace.csv", "w");
    if (!kt_out) {
        fprintf(stderr, "ktrace: cannot open %s\n", path && *path ? path : "ktrace.csv");
        return 0;
    }
    fprintf(kt_out, "start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name\n");
    if (cuptiActivityRegisterCallbacks(kt_request, kt_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: CUPTI activity setup failed\n");
        return 0;
    }
    atexit(kt_finish);
    return 1;
}
