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
 *
 * With KTRACE_GRAPH=<file>, each graph instantiated in the process (CUPTI
 * resource callback GRAPHEXEC_CREATED) also appends its structure there:
 *   node,<graph node id>,<type>      one line per node
 *   edge,<from node id>,<to node id> one line per dependency
 * with CUPTI's graph node ids (cuptiGetGraphNodeId), the ids the kernel
 * records carry, so tools/ktrace_path.py can walk the real dependencies
 * with the measured durations.  Needs -lcuda (cuGraphGetNodes/GetEdges).
 */
#include <cuda.h>
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

static FILE *kt_graph;

/* the structure of the graph being instantiated (KTRACE_GRAPH) */
static void kt_graph_dump(CUgraph g) {
    size_t n = 0, ne = 0;
    if (!kt_graph || cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS ||
        cuGraphGetEdges(g, NULL, NULL, NULL, &ne) != CUDA_SUCCESS)
        return;
    CUgraphNode *nodes = calloc(n + 1, sizeof *nodes), *from = calloc(ne + 1, sizeof *from),
                *to = calloc(ne + 1, sizeof *to);
    CUgraphEdgeData *ed = calloc(ne + 1, sizeof *ed);
    if (nodes && from && to && ed && cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS &&
        cuGraphGetEdges(g, from, to, ed, &ne) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            uint64_t id = 0;
            CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
            cuptiGetGraphNodeId(nodes[i], &id);
            cuGraphNodeGetType(nodes[i], &t);
            fprintf(kt_graph, "node,%llu,%d\n", (unsigned long long)id, (int)t);
        }
        for (size_t e = 0; e < ne; e++) {
            uint64_t a = 0, b = 0;
            cuptiGetGraphNodeId(from[e], &a);
            cuptiGetGraphNodeId(to[e], &b);
            fprintf(kt_graph, "edge,%llu,%llu\n", (unsigned long long)a, (unsigned long long)b);
        }
        fflush(kt_graph);
    }
    free(nodes); free(from); free(to); free(ed);
}

static void CUPTIAPI kt_callback(void *user, CUpti_CallbackDomain dom, CUpti_CallbackId cbid,
                                 const void *data) {
    (void)user;
    if (dom != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED) return;
    const CUpti_ResourceData *rd = (const CUpti_ResourceData *)data;
    const CUpti_GraphData *gd = (const CUpti_GraphData *)rd->resourceDescriptor;
    if (gd && gd->graph) kt_graph_dump(gd->graph);
}

static void kt_finish(void) {
    cuptiActivityFlushAll(1);
    if (kt_out) {
        fclose(kt_out);
        kt_out = NULL;
    }
    if (kt_graph) {
        fclose(kt_graph);
        kt_graph = NULL;
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
    const char *gp = getenv("KTRACE_GRAPH");
    if (gp && *gp) {
        CUpti_SubscriberHandle sub;
        kt_graph = fopen(gp, "w");
        if (!kt_graph || cuptiSubscribe(&sub, (CUpti_CallbackFunc)kt_callback, NULL) != CUPTI_SUCCESS ||
            cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                                CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED) != CUPTI_SUCCESS)
            fprintf(stderr, "ktrace: graph structure not recorded (%s)\n", gp);
    }
    atexit(kt_finish);
    return 1;
}
