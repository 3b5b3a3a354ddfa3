/*
 * test_graph_slack.c — critical-path slack of a DAG and its priority levels
 * (engine/train/graph_slack.h), the ranking cuda/graph.cu gives the kernel
 * nodes of a recorded step.
 */
#include "test.h"
#include "train/graph_slack.h"

/* Builds CSR successors from an edge list (a -> b) of n nodes. */
static void csr(long n, int ne, const long (*e)[2], long *adj0, long *adj) {
    memset(adj0, 0, (size_t)(n + 1) * sizeof *adj0);
    for (int i = 0; i < ne; i++) adj0[e[i][0] + 1]++;
    for (long u = 0; u < n; u++) adj0[u + 1] += adj0[u];
    long fill[16] = {0};
    for (int i = 0; i < ne; i++) adj[adj0[e[i][0]] + fill[e[i][0]]++] = e[i][1];
}

static void expect_slack(const char *name, long n, int ne, const long (*e)[2], const double *w,
                         const double *want, double want_len) {
    long adj0[17], adj[32];
    double slack[16], len = -1;
    csr(n, ne, e, adj0, adj);
    int rc = lucid_graph_slack(n, adj0, adj, w, slack, &len);
    int ok = rc == 0 && len == want_len;
    for (long u = 0; ok && u < n; u++) ok = slack[u] == want[u];
    CHECK(name, ok, "rc %d, length %g (want %g), slack[0..] %g %g %g %g", rc, len, want_len,
          slack[0], n > 1 ? slack[1] : 0, n > 2 ? slack[2] : 0, n > 3 ? slack[3] : 0);
}

int main(void) {
    { /* a chain: every node is critical */
        const long e[][2] = {{0, 1}, {1, 2}, {2, 3}};
        const double w[] = {1, 1, 1, 1}, want[] = {0, 0, 0, 0};
        expect_slack("graph_slack: a chain has no slack", 4, 3, e, w, want, 4);
    }
    { /* a5 <- a4 <- a3 <- a2 <- a1 (nodes 0..4) with b (5) from a1 to a5 and
       * c (6) alone: b has slack 5 - (1 + 1 + 1) = 2, c 5 - 1 = 4 */
        const long e[][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {0, 5}, {5, 4}};
        const double w[] = {1, 1, 1, 1, 1, 1, 1}, want[] = {0, 0, 0, 0, 0, 2, 4};
        expect_slack("graph_slack: a side branch and a lone node get their slack", 7, 6, e, w,
                     want, 5);
    }
    { /* weights: the heavy single node is the critical path, the chain of
       * three light nodes beside it has slack 10 - 3 = 7; zero-weight join */
        const long e[][2] = {{0, 4}, {1, 2}, {2, 3}, {3, 4}};
        const double w[] = {10, 1, 1, 1, 0}, want[] = {0, 7, 7, 7, 0};
        expect_slack("graph_slack: weights decide the critical path", 5, 4, e, w, want, 10);
    }
    {
        double len = -1;
        CHECK("graph_slack: an empty graph", lucid_graph_slack(0, NULL, NULL, NULL, NULL, &len) == 0 &&
              len == 0, "length %g", len);
    }
    { /* a cycle and a bad index are refused */
        const long e[][2] = {{0, 1}, {1, 2}, {2, 0}};
        long adj0[4], adj[3];
        double w[3] = {1, 1, 1}, s[3];
        csr(3, 3, e, adj0, adj);
        int rc = lucid_graph_slack(3, adj0, adj, w, s, NULL);
        CHECK("graph_slack: a cycle is refused", rc == -1, "rc %d", rc);
        adj[1] = 7;
        rc = lucid_graph_slack(3, adj0, adj, w, s, NULL);
        CHECK("graph_slack: an out-of-range successor is refused", rc == -1, "rc %d", rc);
    }
    { /* levels: 0 | (0,2] | (2,6] | (6,14] | (14,30] | ..., capped */
        const double s[] = {0, 0.5, 2, 2.5, 6, 7, 14, 15, 30, 31, 1e9};
        const int want6[] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
        int ok = 1, bad = -1;
        for (int i = 0; i < 11; i++)
            if (lucid_graph_slack_level(s[i], 6) != want6[i]) ok = 0, bad = i;
        CHECK("graph_slack_level: doubling bands over 6 levels", ok, "slack %g -> %d",
              bad >= 0 ? s[bad] : 0, bad >= 0 ? lucid_graph_slack_level(s[bad], 6) : 0);
        CHECK("graph_slack_level: capped at levels - 1, one level is level 0",
              lucid_graph_slack_level(1e9, 2) == 1 && lucid_graph_slack_level(5, 1) == 0 &&
                  lucid_graph_slack_level(5, 0) == 0,
              "%d %d %d", lucid_graph_slack_level(1e9, 2), lucid_graph_slack_level(5, 1),
              lucid_graph_slack_level(5, 0));
    }
    return test_failures_ ? 1 : 0;
}
