/*
 * graph.cu — CUDA-graph capture, launch and events on a context's compute
 * stream: the backend slots capture_begin / capture_end / graph_launch /
 * graph_destroy / capturing / event_* (engine/internal.h), used through
 * engine/train/graph.h.
 *
 * Capture
 *   - Work queued on the context's compute stream between capture_begin and
 *     capture_end is recorded, not run. The mode is
 *     cudaStreamCaptureModeThreadLocal: a potentially unsafe call from the
 *     capturing thread (cudaMalloc, a synchronize, an event query) fails and
 *     invalidates the capture instead of silently breaking it; other threads
 *     (loader workers) are not affected.
 *   - While capturing, the caching allocator refuses every device allocation
 *     (cache hits too) and pinned allocations from this thread
 *     (lucid_cuda_allocator_set_capture): memory handed out during a capture
 *     would be handed out again after it, while the graph still uses it. The
 *     nn arena refuses to grow for the same reason (nn_table.cu).
 *   - capture_end(ctx, NULL) ends and discards (the failure path);
 *     capture_end(ctx, &exec) instantiates. Either way the stream leaves
 *     capture mode and the allocator is unlocked, also when ending fails, so
 *     a failed capture never leaves the stream capturing.
 *   - One capture per context at a time (a second begin is LUCID_ERR_STATE).
 *   - capture_begin, capture_end and graph_launch move st->wcast_epoch (the
 *     epoch of the column caches' events) and st->shadow_epoch (the
 *     freshness epoch of the conv weight shadows, common.cuh). With
 *     LUCID_CAPTURE_KEEP_SHADOWS (engine/train/graph.h) capture_begin keeps
 *     st->shadow_epoch: shadows cast before stay trusted inside, so the
 *     capture queues no cast for them; a capture that queued no shadow cast
 *     at all (st->shadow_casts) yields a graph that keeps the shadows
 *     (*keeps = 1): it writes neither weights nor shadows, so its launch
 *     keeps st->shadow_epoch too (the caller casts the shadows again before
 *     each launch: the protocol of graph.h). Every other graph's
 *     launch moves it (an optimizer graph writes weights behind the host's
 *     storage versions).
 *   - Lanes (lane.cu): capture_begin refuses while a lane fork is open,
 *     joins every lane and forgets their marks; capture_end closes a fork
 *     left open and joins every lane (a capture cannot end with a forked
 *     stream unjoined); event_record joins (the event then covers the
 *     lanes' work); graph_launch refuses while a fork is open and joins
 *     first (the graph's lane work uses the lanes' scratch).
 *
 * Every CUDA call is checked; errors are returned with the message in the
 * context, never an abort.
 */
#include "common.cuh"
#include "train/graph.h"
#include "train/graph_slack.h"

#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* cuda/alloc.cu */
void lucid_cuda_allocator_set_capture(lucid_cuda_allocator *a, int on);

/* LUCID_GRAPH_HEAD (read once; "0" turns it off): a captured graph with
 * more than one root gets a head, one empty kernel node (graph_head) that
 * every old root hangs from, so the graph has ONE root (graph_add_head, at
 * capture end). Why: the pose step's graph had two roots (layer 0's conv on
 * the compute stream, the weight casts on the cast lane), and in a CUPTI
 * timeline of the recorded fit (H200, 2026-11-30, session 14) the casts
 * started 146-150 us after the replay's start in about half of the replays
 * (layer 1 waits for them), the GPU idle in between; the same with 16 or
 * 32 device connections, without the programmatic dependent launch and
 * without node priorities. With the head: 0 and 5 late starts in ~57
 * replays (DECISIONS 42). A graph with one root gets none: the head's own
 * successor started ~14 us after it in every replay (session 15, with the
 * casts out of the FB graph), while a first kernel without a head started
 * ~3.6 us after the replay began (DECISIONS 45). */
static int graph_head_on(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_GRAPH_HEAD", &off);
}

static __global__ void graph_head(void) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
}

/* With more than one root: a graph_head kernel node above every root of
 * graph (see graph_head_on), at the device's greatest priority (the
 * compute stream's: the priority a captured head had). Errors: the CUDA
 * error (ERR_DEVICE), or ERR_OOM for the roots' host array. */
static lucid_status graph_add_head(lucid_ctx *ctx, cudaGraph_t graph) {
    size_t n = 0;
    CUDA_CHECK(ctx, cudaGraphGetRootNodes(graph, NULL, &n));
    if (n < 2) return LUCID_OK;
    cudaGraphNode_t *roots = (cudaGraphNode_t *)malloc(n * sizeof *roots);
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(n * sizeof *from);
    if (!roots || !from) {
        free(roots);
        free(from);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "graph head: out of host memory (%zu roots)", n);
    }
    cudaKernelNodeParams kp = {};
    kp.func = (void *)graph_head;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(32);
    cudaGraphNode_t head = NULL;
    int least = 0, greatest = 0;
    cudaError_t e = cudaGraphGetRootNodes(graph, roots, &n);
    if (e == cudaSuccess) e = cudaGraphAddKernelNode(&head, graph, NULL, 0, &kp);
    if (e == cudaSuccess) e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess) {
        cudaKernelNodeAttrValue v = {};
        v.priority = greatest;
        e = cudaGraphKernelNodeSetAttribute(head, cudaKernelNodeAttributePriority, &v);
    }
    if (e == cudaSuccess) {
        for (size_t i = 0; i < n; i++) from[i] = head;
        e = cudaGraphAddDependencies(graph, from, roots, NULL, n);
    }
    free(roots);
    free(from);
    if (e != cudaSuccess) return lucid_cuda_err(ctx, e, "graph head", __FILE__, __LINE__);
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_graph_capture_begin(lucid_ctx *ctx, unsigned flags) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(lucid_cuda_lane_before_capture(ctx));
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "capture_begin: the compute stream of cuda:%d is "
                            "already being captured",
                            st->device);
    lucid_cuda_allocator_set_capture(st->alloc, 1);
    st->wcast_epoch++; /* no column-cache event of before is waited on inside */
    /* a continuing capture reads the previous capture's column caches as
     * fresh (its graph runs right before this one on the stream) */
    st->wcast_alias = (flags & LUCID_CAPTURE_CONTINUE) ? st->capture_epoch : 0;
    st->capture_epoch = st->wcast_epoch;
    st->capture_keep = (flags & LUCID_CAPTURE_KEEP_SHADOWS) != 0;
    if (!st->capture_keep) st->shadow_epoch++; /* shadows cast before are not trusted inside */
    st->shadow_casts = 0;
    cudaError_t e = cudaStreamBeginCapture(st->stream,
                                           cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        lucid_cuda_allocator_set_capture(st->alloc, 0);
        st->capture_keep = 0;
        st->wcast_alias = 0;
        return lucid_cuda_err(ctx, e, "cudaStreamBeginCapture", __FILE__,
                              __LINE__);
    }
    return LUCID_OK;
}

/* Kernel nodes keep the priority of the stream they were captured from
 * (the compute stream and the branch lanes: the device's greatest; the
 * parameter-gradient lane: its least; lane.cu). A graph runs its nodes at
 * those priorities only when instantiated with UseNodePriority; otherwise
 * every node takes the launch stream's. LUCID_GRAPH_PRIORITY=0 (read once)
 * instantiates without it, for A/B measurements. Priorities change the
 * order blocks are scheduled in, never what a kernel computes. */
static int graph_node_priority(void) {
    static int off = -1;
    return !lucid_env_zero("LUCID_GRAPH_PRIORITY", &off);
}

/* LUCID_GRAPH_STATS=1 (read once): each instantiated graph prints one line
 * to stderr — its nodes by type, its edges, and its longest dependency path
 * counted in nodes and in kernel nodes (a topological pass over the edges).
 * A diagnostic for the launch-bound step: every kernel node on the longest
 * path costs its launch latency in a replay, whatever runs beside it. */
static int graph_stats_on(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LUCID_GRAPH_STATS");
        v = e && *e && strcmp(e, "0") != 0;
        if (v && strcmp(e, "path") == 0) v = 2;
    }
    return v;
}

/* LUCID_GRAPH_STATS=path: also one stderr line per kernel node of the
 * longest path (in kernel nodes), in dependency order:
 *   lucid graph path: <i> <kernel name> grid <x,y,z> block <x,y,z>
 * joined offline with a kernel census (tools/kernel_census.py --path) to
 * see which kernels the critical path is made of. */
static void graph_path_print(const cudaGraphNode_t *nodes, const int *type, const long *pred,
                             long end) {
    long len = 0;
    for (long u = end; u >= 0; u = pred[u]) len++;
    long *seq = (long *)calloc((size_t)len + 1, sizeof *seq);
    if (!seq) { fprintf(stderr, "lucid graph path: out of host memory\n"); return; }
    long i = len;
    for (long u = end; u >= 0; u = pred[u]) seq[--i] = u;
    long k = 0;
    for (i = 0; i < len; i++) {
        if (type[seq[i]] != 0) continue;
        cudaKernelNodeParams kp;
        const char *name = "?";
        if (cudaGraphKernelNodeGetParams(nodes[seq[i]], &kp) == cudaSuccess) {
            if (cudaFuncGetName(&name, kp.func) != cudaSuccess || !name) name = "?";
            fprintf(stderr, "lucid graph path: %ld %s grid %u,%u,%u block %u,%u,%u\n", k++, name,
                    kp.gridDim.x, kp.gridDim.y, kp.gridDim.z, kp.blockDim.x, kp.blockDim.y,
                    kp.blockDim.z);
        } else {
            fprintf(stderr, "lucid graph path: %ld ? (no kernel parameters)\n", k++);
        }
        (void)cudaGetLastError();
    }
    free(seq);
}

static int node_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(const cudaGraphNode_t *)a, y = (uintptr_t)*(const cudaGraphNode_t *)b;
    return x < y ? -1 : x > y;
}

static long node_index(cudaGraphNode_t *sorted, size_t n, cudaGraphNode_t v) {
    cudaGraphNode_t *hit = (cudaGraphNode_t *)bsearch(&v, sorted, n, sizeof v, node_cmp);
    return hit ? (long)(hit - sorted) : -1;
}

/* A captured graph's structure in host arrays: nodes[n] (sorted by handle),
 * type[n] (0 kernel, 1 memcpy, 2 memset, 3 other) and the successors in CSR
 * form (adj0[n + 1], adj[ne]). */
typedef struct {
    size_t n, ne;
    cudaGraphNode_t *nodes;
    int *type;
    long *adj0, *adj;
} graph_topo;

static void graph_topo_free(graph_topo *t) {
    free(t->nodes); free(t->type); free(t->adj0); free(t->adj);
    memset(t, 0, sizeof *t);
}

/* Reads graph's nodes and edges into t. NULL on success, else why not (t
 * freed). */
static const char *graph_topo_build(cudaGraph_t graph, graph_topo *t) {
    memset(t, 0, sizeof *t);
    size_t n = 0, ne = 0;
    cudaGraphNode_t *from = NULL, *to = NULL;
    cudaGraphEdgeData *ed = NULL;
    long *fill = NULL;
    const char *why = NULL;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess ||
        cudaGraphGetEdges(graph, NULL, NULL, NULL, &ne) != cudaSuccess)
        return "cudaGraphGetNodes/GetEdges failed";
    t->nodes = (cudaGraphNode_t *)calloc(n + 1, sizeof *t->nodes);
    t->type = (int *)calloc(n + 1, sizeof *t->type);
    t->adj0 = (long *)calloc(n + 2, sizeof *t->adj0);
    t->adj = (long *)calloc(ne + 1, sizeof *t->adj);
    from = (cudaGraphNode_t *)calloc(ne + 1, sizeof *from);
    to = (cudaGraphNode_t *)calloc(ne + 1, sizeof *to);
    ed = (cudaGraphEdgeData *)calloc(ne + 1, sizeof *ed);
    fill = (long *)calloc(n + 1, sizeof *fill);
    if (!t->nodes || !t->type || !t->adj0 || !t->adj || !from || !to || !ed || !fill) {
        why = "out of host memory";
        goto done;
    }
    /* the array queries only when there is something to fill (the H200's
     * driver failed the edge query of a one-node graph with no edges:
     * spec/c/test_lane_cuda.c, session 12) */
    if ((n > 0 && cudaGraphGetNodes(graph, t->nodes, &n) != cudaSuccess) ||
        (ne > 0 && cudaGraphGetEdges(graph, from, to, ed, &ne) != cudaSuccess)) {
        why = "cudaGraphGetNodes/GetEdges failed";
        goto done;
    }
    t->n = n;
    t->ne = ne;
    qsort(t->nodes, n, sizeof *t->nodes, node_cmp);
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType ty = cudaGraphNodeTypeEmpty;
        (void)cudaGraphNodeGetType(t->nodes[i], &ty);
        t->type[i] = ty == cudaGraphNodeTypeKernel ? 0 : ty == cudaGraphNodeTypeMemcpy ? 1
                   : ty == cudaGraphNodeTypeMemset ? 2 : 3;
    }
    for (size_t e = 0; e < ne; e++) { /* adjacency in CSR form */
        long a = node_index(t->nodes, n, from[e]), b = node_index(t->nodes, n, to[e]);
        if (a < 0 || b < 0) { why = "an edge names an unknown node"; goto done; }
        t->adj0[a + 1]++;
    }
    for (size_t i = 0; i < n; i++) t->adj0[i + 1] += t->adj0[i];
    for (size_t e = 0; e < ne; e++) {
        long a = node_index(t->nodes, n, from[e]);
        t->adj[t->adj0[a] + fill[a]++] = node_index(t->nodes, n, to[e]);
    }
done:
    free(from); free(to); free(ed); free(fill);
    if (why) graph_topo_free(t);
    (void)cudaGetLastError();
    return why;
}

/* The second statistics line: the kernel nodes by the priority the graph
 * will run them at (read back from each node), and how many kernel nodes
 * of the longest path (ending at endk, through pred) have the device's
 * greatest priority:
 *   lucid graph priorities: range <greatest>..<least>; <p>:<count> ...;
 *   longest path at greatest <k>/<kernel nodes>
 * (spec/graph_prio_spec.lua reads it). */
/* *p = the priority attribute of kernel node `node`; false when the
 * driver does not give it. */
static bool kernel_node_priority(cudaGraphNode_t node, int *p) {
    cudaKernelNodeAttrValue v;
    memset(&v, 0, sizeof v);
    if (cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributePriority, &v) != cudaSuccess)
        return false;
    *p = v.priority;
    return true;
}

static void graph_priorities_print(const graph_topo *t, const long *pred, long endk) {
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess || least < greatest ||
        least - greatest > 63) {
        (void)cudaGetLastError();
        fprintf(stderr, "lucid graph priorities: no priority range\n");
        return;
    }
    size_t count[64] = {0}, other = 0;
    for (size_t i = 0; i < t->n; i++) {
        int p = 0;
        if (t->type[i] != 0) continue;
        if (!kernel_node_priority(t->nodes[i], &p) || p < greatest || p > least)
            other++;
        else
            count[p - greatest]++;
    }
    long on = 0, all = 0;
    for (long u = endk; u >= 0; u = pred[u]) {
        int p = 0;
        if (t->type[u] != 0) continue;
        all++;
        if (kernel_node_priority(t->nodes[u], &p) && p == greatest) on++;
    }
    (void)cudaGetLastError();
    fprintf(stderr, "lucid graph priorities: range %d..%d;", greatest, least);
    for (int p = 0; p <= least - greatest; p++)
        if (count[p]) fprintf(stderr, " %d:%zu", greatest + p, count[p]);
    if (other) fprintf(stderr, " unreadable:%zu", other);
    fprintf(stderr, "; longest path at greatest %ld/%ld\n", on, all);
}

/* Prints the statistics of `graph`; any failure prints why instead (a
 * diagnostic never fails the capture). */
static void graph_stats_print(cudaGraph_t graph) {
    graph_topo t;
    const char *why = graph_topo_build(graph, &t);
    if (why) {
        fprintf(stderr, "lucid graph: no statistics (%s)\n", why);
        return;
    }
    const size_t n = t.n;
    int *indeg = (int *)calloc(n + 1, sizeof *indeg);
    int *best = (int *)calloc(n + 1, sizeof *best);
    int *bestk = (int *)calloc(n + 1, sizeof *bestk);
    long *queue = (long *)calloc(n + 1, sizeof *queue);
    long *pred = (long *)calloc(n + 1, sizeof *pred);
    if (!indeg || !best || !bestk || !queue || !pred) {
        fprintf(stderr, "lucid graph: no statistics (out of host memory)\n");
    } else {
        size_t counts[4] = {0, 0, 0, 0}; /* kernel, memcpy, memset, other */
        for (size_t i = 0; i < n; i++) counts[t.type[i]]++;
        for (size_t e = 0; e < t.ne; e++) indeg[t.adj[e]]++;
        long qh = 0, qt = 0;
        for (size_t i = 0; i < n; i++) {
            best[i] = 1;
            bestk[i] = t.type[i] == 0;
            pred[i] = -1;
            if (!indeg[i]) queue[qt++] = (long)i;
        }
        size_t roots = (size_t)qt;
        int lp = 0, lpk = 0;
        long endk = -1;
        while (qh < qt) { /* Kahn: longest path in nodes and in kernel nodes */
            long u = queue[qh++];
            if (best[u] > lp) lp = best[u];
            if (bestk[u] > lpk || endk < 0) { lpk = bestk[u]; endk = u; }
            for (long j = t.adj0[u]; j < t.adj0[u + 1]; j++) {
                long v = t.adj[j];
                int k = t.type[v] == 0;
                if (best[u] + 1 > best[v]) best[v] = best[u] + 1;
                if (bestk[u] + k > bestk[v]) { bestk[v] = bestk[u] + k; pred[v] = u; }
                if (--indeg[v] == 0) queue[qt++] = v;
            }
        }
        fprintf(stderr,
                "lucid graph: %zu nodes (%zu kernels, %zu memcpy, %zu memset, %zu other), %zu "
                "edges, %zu roots; longest path %d nodes, %d kernel nodes\n",
                n, counts[0], counts[1], counts[2], counts[3], t.ne, roots, lp, lpk);
        graph_priorities_print(&t, pred, endk);
        if (graph_stats_on() == 2 && endk >= 0) graph_path_print(t.nodes, t.type, pred, endk);
    }
    (void)cudaGetLastError();
    free(indeg); free(best); free(bestk); free(queue); free(pred);
    graph_topo_free(&t);
}

/* LUCID_GRAPH_SLACK (read once): how the kernel nodes of a recorded graph
 * get their priorities. 1 (default): from their critical-path slack with
 * one unit of weight per kernel node (graph_slack_priorities); 2: the same
 * with each kernel weighed by its waves of threads (kernel_node_waves; an
 * A/B arm); 0: the priority of the stream each was captured
 * from (compute stream and branch lanes greatest, parameter-gradient lanes
 * least; lane.cu), the behaviour before 2026-11-30 (session 12). Either way
 * only with UseNodePriority (LUCID_GRAPH_PRIORITY, above); priorities never
 * change what a kernel computes. */
static int graph_slack_on(void) {
    static int mode = -1;
    return lucid_env_int("LUCID_GRAPH_SLACK", 0, 2, 1, &mode);
}

/* The weight of a kernel node under LUCID_GRAPH_SLACK=2: the waves its
 * threads make on the device, ceil(blocks * threads / (SMs * 2048)), at
 * least 1 (a first model of a kernel's length when it is not alone: one
 * launch interval per wave); 1 when its parameters cannot be read. */
static double kernel_node_waves(cudaGraphNode_t node, int sms) {
    cudaKernelNodeParams kp;
    if (sms < 1 || cudaGraphKernelNodeGetParams(node, &kp) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1.0;
    }
    const double threads = (double)kp.gridDim.x * kp.gridDim.y * kp.gridDim.z *
                           ((double)kp.blockDim.x * kp.blockDim.y * kp.blockDim.z);
    const double waves = ceil(threads / ((double)sms * 2048.0));
    return waves > 1.0 ? waves : 1.0;
}

/* Sets every kernel node's priority from its slack on the graph's heaviest
 * path, one unit of weight per kernel node (the step's kernels are a few
 * microseconds each, and a replay is latency-bound: each kernel on a path
 * costs about one launch-to-launch interval whatever its size): slack 0 ->
 * the device's greatest priority, then one step per doubling band of slack
 * (lucid_graph_slack_level, engine/train/graph_slack.h) down to its least.
 * Why: the CUPTI timeline of the recorded pose step (H200, session 12)
 * showed the neck's kernels after the P3 output waiting 10-25 us for SMs
 * held by the P3 head chains that started beside them at the same
 * priority, and the head's backward waiting likewise. sm_count: the
 * context device's multiprocessors (LUCID_GRAPH_SLACK=2's waves). Returns a status;
 * the caller fails the capture on error (a priority that cannot be set is
 * a broken driver call, not a preference). */
static lucid_status graph_slack_priorities(lucid_ctx *ctx, cudaGraph_t graph, int sm_count) {
    lucid_cuda_state *side = (lucid_cuda_state *)ctx->backend_state;
    if (side && !side->side_green) side = NULL; /* nodes of the side partition: green.cu */
    int least = 0, greatest = 0;
    CUDA_CHECK(ctx, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int levels = least - greatest + 1;
    if (levels < 2) return LUCID_OK; /* one priority: nothing to choose */
    graph_topo t;
    const char *why = graph_topo_build(graph, &t);
    if (why) return lucid_seterr(ctx, LUCID_ERR_DEVICE, "graph priorities: %s", why);
    double *w = (double *)calloc(t.n + 1, sizeof *w), *slack = (double *)calloc(t.n + 1, sizeof *slack);
    lucid_status s = LUCID_OK;
    if (!w || !slack) {
        s = lucid_seterr(ctx, LUCID_ERR_OOM, "graph priorities: out of host memory (%zu nodes)", t.n);
        goto done;
    }
    for (size_t i = 0; i < t.n; i++) w[i] = t.type[i] == 0 ? 1.0 : 0.0;
    if (graph_slack_on() == 2) /* kernels weighed by their waves of threads */
        for (size_t i = 0; i < t.n; i++)
            if (t.type[i] == 0) w[i] = kernel_node_waves(t.nodes[i], sm_count);
    {
        int rc = lucid_graph_slack((long)t.n, t.adj0, t.adj, w, slack, NULL);
        if (rc) {
            s = lucid_seterr(ctx, rc == -2 ? LUCID_ERR_OOM : LUCID_ERR_DEVICE,
                             "graph priorities: %s", rc == -2 ? "out of host memory"
                                                             : "the graph has a cycle");
            goto done;
        }
    }
    for (size_t i = 0; i < t.n; i++) {
        if (t.type[i] != 0) continue;
        cudaKernelNodeAttrValue v;
        memset(&v, 0, sizeof v);
        v.priority = greatest + lucid_graph_slack_level(slack[i], levels);
        cudaError_t e = cudaGraphKernelNodeSetAttribute(t.nodes[i], cudaKernelNodeAttributePriority, &v);
        if (e == cudaErrorDeviceUninitialized && side) { /* a node of the side partition */
            (void)cudaGetLastError();
            s = lucid_cuda_side_node_priority(ctx, side, (void *)t.nodes[i], v.priority);
            if (s != LUCID_OK) goto done;
            continue;
        }
        if (e != cudaSuccess) {
            s = lucid_cuda_err(ctx, e, "cudaGraphKernelNodeSetAttribute (priority)", __FILE__,
                               __LINE__);
            goto done;
        }
    }
done:
    free(w);
    free(slack);
    graph_topo_free(&t);
    return s;
}

extern "C" lucid_status lucid_cuda_graph_capture_end(lucid_ctx *ctx, void **graph_exec,
                                                     int *keeps) {
    if (graph_exec) *graph_exec = NULL;
    if (keeps) *keeps = 0;
    CUDA_ENTER(ctx, st);
    st->wcast_epoch++;
    st->wcast_alias = 0;
    /* shadow casts queued in the capture never ran; a keeping capture that
     * queued none leaves the shadows as they were */
    const int keep = st->capture_keep && st->shadow_casts == 0;
    if (!keep) st->shadow_epoch++;
    st->capture_keep = 0;
    /* a fork left open (an error between fork and return) has the lane's
     * stream in st->stream: close it, so the capture ends on its own stream */
    lucid_cuda_lane_unwind(ctx);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t q = cudaStreamIsCapturing(st->stream, &cs);
    if (q != cudaSuccess) (void)cudaGetLastError();
    if (q == cudaSuccess && cs == cudaStreamCaptureStatusNone) {
        lucid_cuda_allocator_set_capture(st->alloc, 0);
        if (!graph_exec) return LUCID_OK; /* nothing to discard */
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "capture_end: the compute stream of cuda:%d is "
                            "not being captured",
                            st->device);
    }
    /* a capture ends only with every forked stream joined (lane.cu) */
    lucid_status js = lucid_cuda_lane_join(ctx, -1);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &graph);
    lucid_cuda_allocator_set_capture(st->alloc, 0);
    if (!graph_exec) { /* discard */
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return LUCID_OK;
    }
    if (js != LUCID_OK) {
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        return js;
    }
    if (e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        return lucid_cuda_err(ctx, e,
                              e == cudaErrorStreamCaptureInvalidated
                                  ? "cudaStreamEndCapture (the capture was "
                                    "invalidated by an unsupported call "
                                    "during recording)"
                                  : "cudaStreamEndCapture",
                              __FILE__, __LINE__);
    }
    if (!graph)
        return lucid_seterr(ctx, LUCID_ERR_DEVICE,
                            "cudaStreamEndCapture returned no graph");
    if (graph_head_on()) {
        lucid_status hs = graph_add_head(ctx, graph);
        if (hs != LUCID_OK) {
            cudaGraphDestroy(graph);
            return hs;
        }
    }
    if (graph_node_priority() && graph_slack_on()) {
        lucid_status ps = graph_slack_priorities(ctx, graph, st->sm_count);
        if (ps != LUCID_OK) {
            cudaGraphDestroy(graph);
            return ps;
        }
    }
    if (graph_stats_on()) graph_stats_print(graph);
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, graph_node_priority() ?
                             (unsigned long long)cudaGraphInstantiateFlagUseNodePriority : 0ULL);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
        return lucid_cuda_err(ctx, e, "cudaGraphInstantiate", __FILE__,
                              __LINE__);
    *graph_exec = (void *)exec;
    if (keeps) *keeps = keep;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_graph_launch(lucid_ctx *ctx, void *graph_exec, int keeps) {
    CUDA_ENTER(ctx, st);
    if (!graph_exec)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "graph_launch: no graph");
    if (st->lane_depth)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "graph_launch: lane %d is open (its fork "
                            "has not returned)", st->lane_stack[st->lane_depth - 1]);
    /* the graph's lane work uses the lanes' scratch: eager lane work still
     * queued must finish first */
    LUCID_TRY(lucid_cuda_lane_join(ctx, -1));
    /* the replay may write weights (and rewrites the shadows it recorded)
     * behind the host's storage versions: eager casts are stale after it,
     * unless its capture kept the shadows (it writes neither) */
    st->wcast_epoch++;
    if (!keeps) st->shadow_epoch++;
    CUDA_CHECK(ctx, cudaGraphLaunch((cudaGraphExec_t)graph_exec, st->stream));
    return LUCID_OK;
}

extern "C" void lucid_cuda_graph_destroy(lucid_ctx *ctx, void *graph_exec) {
    if (!graph_exec) return;
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (st && cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    /* launches in flight complete; the memory they use is owned elsewhere
     * (stream-ordered frees make its reuse safe) */
    if (cudaGraphExecDestroy((cudaGraphExec_t)graph_exec) != cudaSuccess)
        (void)cudaGetLastError();
}

/* Every conv weight shadow of the context stale (graph.h
 * lucid_ctx_shadows_stale): the next cast of each recasts it. */
extern "C" lucid_status lucid_cuda_shadows_stale(lucid_ctx *ctx) {
    CUDA_ENTER(ctx, st);
    st->shadow_epoch++;
    return LUCID_OK;
}

extern "C" int lucid_cuda_graph_capturing(lucid_ctx *ctx) {
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (!st) return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st->stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* *event, created on first use (no timing: ordering only). */
static lucid_status event_ensure(lucid_ctx *ctx, void **event) {
    if (*event) return LUCID_OK;
    cudaEvent_t ev = NULL;
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *event = (void *)ev;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_event_record(lucid_ctx *ctx, void **event) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(lucid_cuda_lane_join(ctx, -1)); /* the event covers lane work too */
    LUCID_TRY(event_ensure(ctx, event));
    CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)*event, st->stream));
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_event_record_node(lucid_ctx *ctx, void **event) {
    CUDA_ENTER(ctx, st);
    LUCID_TRY(event_ensure(ctx, event));
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
    CUDA_CHECK(ctx, cudaEventRecordWithFlags((cudaEvent_t)*event, st->stream,
                                             cs != cudaStreamCaptureStatusNone
                                                 ? cudaEventRecordExternal
                                                 : cudaEventRecordDefault));
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_event_synchronize(lucid_ctx *ctx, void *event) {
    if (!event) return LUCID_OK; /* never recorded */
    CUDA_ENTER(ctx, st);
    (void)st;
    CUDA_CHECK(ctx, cudaEventSynchronize((cudaEvent_t)event));
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_event_wait(lucid_ctx *ctx, void *event) {
    if (!event) return LUCID_OK; /* never recorded */
    CUDA_ENTER(ctx, st);
    CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, (cudaEvent_t)event, 0));
    return LUCID_OK;
}

/* Side copies: the copy stream (created with the context, backend.cu) is
 * ordered against the compute stream only by the events the caller passes,
 * so a copy overlaps whatever the compute stream runs meanwhile. Eager only:
 * a capture records the compute stream, and a copy stream's work would not
 * be part of it. */
extern "C" lucid_status lucid_cuda_side_copy(lucid_ctx *ctx, int n, void *const *dst,
                                             const void *const *src, const size_t *bytes,
                                             void *after, void **done) {
    CUDA_ENTER(ctx, st);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "side_copy: the compute stream of cuda:%d is "
                            "being captured (side copies are eager only)", st->device);
    if (after) CUDA_CHECK(ctx, cudaStreamWaitEvent(st->copy_stream, (cudaEvent_t)after, 0));
    for (int i = 0; i < n; i++)
        if (bytes[i])
            CUDA_CHECK(ctx, cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDefault,
                                            st->copy_stream));
    if (done) {
        LUCID_TRY(event_ensure(ctx, done));
        CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)*done, st->copy_stream));
    }
    return LUCID_OK;
}

extern "C" void lucid_cuda_event_destroy(lucid_ctx *ctx, void *event) {
    if (!event) return;
    lucid_cuda_state *st = (lucid_cuda_state *)ctx->backend_state;
    if (st && cudaSetDevice(st->device) != cudaSuccess) (void)cudaGetLastError();
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess)
        (void)cudaGetLastError();
}
