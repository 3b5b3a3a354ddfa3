/*
 * graph_slack.c — critical-path slack of a dependency graph (graph_slack.h).
 * Two passes over a topological order (Kahn's algorithm): top levels
 * forward, bottom levels backward.
 */
#include "train/graph_slack.h"

#include <stdlib.h>

int lucid_graph_slack(long n, const long *adj0, const long *adj, const double *w, double *slack,
                      double *length) {
    if (length) *length = 0.0;
    if (n <= 0) return 0;
    long *indeg = (long *)calloc((size_t)n, sizeof *indeg);
    long *order = (long *)malloc((size_t)n * sizeof *order);
    double *top = (double *)calloc((size_t)n, sizeof *top);
    double *bot = (double *)calloc((size_t)n, sizeof *bot);
    int rc = 0;
    if (!indeg || !order || !top || !bot) {
        rc = -2;
        goto done;
    }
    for (long u = 0; u < n; u++)
        for (long j = adj0[u]; j < adj0[u + 1]; j++) {
            if (adj[j] < 0 || adj[j] >= n) {
                rc = -1;
                goto done;
            }
            indeg[adj[j]]++;
        }
    long qt = 0;
    for (long u = 0; u < n; u++)
        if (!indeg[u]) order[qt++] = u;
    for (long qh = 0; qh < qt; qh++) { /* forward: top[v] = max over preds (top + w) */
        long u = order[qh];
        for (long j = adj0[u]; j < adj0[u + 1]; j++) {
            long v = adj[j];
            if (top[u] + w[u] > top[v]) top[v] = top[u] + w[u];
            if (--indeg[v] == 0) order[qt++] = v;
        }
    }
    if (qt != n) { /* a cycle: some nodes never reached indegree 0 */
        rc = -1;
        goto done;
    }
    double L = 0.0;
    for (long i = n - 1; i >= 0; i--) { /* backward: bot[u] = w[u] + max over succs bot */
        long u = order[i];
        double b = 0.0;
        for (long j = adj0[u]; j < adj0[u + 1]; j++)
            if (bot[adj[j]] > b) b = bot[adj[j]];
        bot[u] = w[u] + b;
        if (top[u] + bot[u] > L) L = top[u] + bot[u];
    }
    for (long u = 0; u < n; u++) {
        double s = L - (top[u] + bot[u]);
        slack[u] = s > 0.0 ? s : 0.0;
    }
    if (length) *length = L;
done:
    free(indeg);
    free(order);
    free(top);
    free(bot);
    return rc;
}

int lucid_graph_slack_level(double slack, int levels) {
    if (levels < 1) levels = 1;
    int lv = 0;
    double edge = 0.0, band = 2.0;
    while (lv < levels - 1 && slack > edge) {
        lv++;
        edge += band;
        band *= 2.0;
    }
    return lv;
}
