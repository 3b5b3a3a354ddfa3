/*
 * graph_slack.h — critical-path slack of a dependency graph, and the
 * scheduling priority it gives each node.
 *
 * Why: a recorded training step at batch 4 is a graph of ~800 small kernels
 * on several streams (the pose head's branch lanes, the parameter-gradient
 * lanes). When independent kernels share the GPU, the block scheduler
 * starts the pending blocks of higher-priority kernels first. Kernels that
 * lie on the longest path through the graph (zero slack) gain from every
 * microsecond they are started earlier; kernels with slack do not. So a
 * node's priority follows its slack: list scheduling by "bottom level"
 * (the longest path from a node to the end), the classic HLFET heuristic
 * (Adam, Chandy, Dickson, "A comparison of list schedules for parallel
 * processing systems", CACM 17(12), 1974).
 *
 * Pure host C with no CUDA: cuda/graph.cu feeds it the captured graph's
 * nodes and edges and sets each kernel node's priority attribute from it.
 */
#ifndef LUCID_TRAIN_GRAPH_SLACK_H
#define LUCID_TRAIN_GRAPH_SLACK_H

#ifdef __cplusplus
extern "C" {
#endif

/* Slack of every node of a directed acyclic graph.
 *   n        number of nodes (>= 0)
 *   adj0     [n + 1] CSR row starts: the successors of node u are
 *            adj[adj0[u] .. adj0[u + 1] - 1]; adj0[0] == 0
 *   adj      [adj0[n]] successor indices, each in 0..n-1
 *   w        [n] node weights (>= 0; e.g. 1 per kernel, 0 per empty node),
 *            in any unit of time
 *   slack    [n] out: L - (top[u] + bot[u]), where top[u] is the heaviest
 *            path weight from a source up to u (u excluded), bot[u] the
 *            heaviest path weight from u (included) to a sink, and L the
 *            heaviest path of the graph; 0 on a heaviest path
 *   length   out (nullable): L
 * Returns 0; -1 when an index is out of range or the graph has a cycle
 * (slack is then unspecified); -2 when host memory runs out. */
int lucid_graph_slack(long n, const long *adj0, const long *adj, const double *w, double *slack,
                      double *length);

/* The priority level of a node of this slack, 0 (most urgent) ..
 * levels - 1 (least): 0 for slack <= 0, then one level per band of
 * widths 2, 4, 8, 16 ... weight units (slack in (0, 2] -> 1, (2, 6] -> 2,
 * (6, 14] -> 3, ...), capped at levels - 1. levels < 1 is taken as 1.
 * The doubling bands keep the nodes near the critical path apart while
 * everything far from it shares the lowest levels. */
int lucid_graph_slack_level(double slack, int levels);

#ifdef __cplusplus
}
#endif

#endif
