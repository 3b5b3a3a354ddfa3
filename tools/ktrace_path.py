#!/usr/bin/env python3
"""The time-weighted critical path of the replayed training step.

Joins tools/ktrace.c's kernel timeline (ktrace CSV, gzipped or not) with the
graph structure it records under KTRACE_GRAPH (node/edge lines with CUPTI's
graph node ids), takes each kernel node's median duration over the last
`replays` replays of the graph with the most kernel records, and walks the
longest path through the real dependency edges (non-kernel nodes weigh 0).
Prints the path's length against the replay span, its kernels grouped by
name, and its largest entries.  A diagnostic (tools/gpu-run.sh ab with
AB_KTRACE=1); durations measured under the replay's own contention, and
every edge taken as a full dependency (with programmatic-launch edges,
LUCID_PDL=graph, the path is overstated).

usage: ktrace_path.py TRACE.csv[.gz] GRAPH.csv [replays=40] [top=40]
"""
import collections, statistics, subprocess, sys

from ktrace_csv import records


def main():
    trace, graph = sys.argv[1], sys.argv[2]
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    nrep, top = int(opts.get("replays", 40)), int(opts.get("top", 40))
    recs = collections.defaultdict(list)
    for s, e, _, g, n, grid, name in records(trace):
        if g:
            recs[g].append((s, e, n, name, grid))
    gid = max(recs, key=lambda g: len(recs[g]))
    rows = sorted(recs[gid])
    kn = {r[2] for r in rows}
    per = len(rows) // len(kn)
    use = rows[-min(nrep, per) * len(kn):]
    dur = collections.defaultdict(list)
    name, grid, first = {}, {}, collections.defaultdict(list)
    for s, e, n, nm, g in use:
        dur[n].append(e - s)
        name[n], grid[n] = nm, g
    med = {n: statistics.median(v) for n, v in dur.items()}
    # replay spans: consecutive groups of len(kn) records ordered by start
    spans = [max(x[1] for x in use[i:i + len(kn)]) - min(x[0] for x in use[i:i + len(kn)])
             for i in range(0, len(use) - len(kn) + 1, len(kn))]
    # CUPTI node ids are (graph id << 32) | local id; the kernel records name
    # the instantiated clone's graph, the dump the captured graph, whose
    # local ids the clone keeps: join on the local id, taking the dumped
    # graph with as many nodes as this one has kernel nodes
    dumped = collections.defaultdict(lambda: (set(), []))
    with open(graph) as f:
        for line in f:
            p = line.strip().split(",")
            if p[0] == "node":
                dumped[int(p[1]) >> 32][0].add(int(p[1]) & 0xffffffff)
            elif p[0] == "edge":
                dumped[int(p[1]) >> 32][1].append((int(p[1]) & 0xffffffff, int(p[2]) & 0xffffffff))
    local = lambda n: n & 0xffffffff
    med = {local(n): v for n, v in med.items()}
    name = {local(n): v for n, v in name.items()}
    grid = {local(n): v for n, v in grid.items()}
    kn = {local(n) for n in kn}
    pick = [g for g, (ns, _) in dumped.items() if kn <= ns]
    if not pick:
        sys.exit(f"no recorded graph structure holds the {len(kn)} kernel nodes of graph {gid}")
    nodes, edges = dumped[pick[-1]]
    succ, indeg = collections.defaultdict(list), collections.Counter()
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    missing = kn - nodes
    if missing:
        print(f"warning: {len(missing)} of {len(kn)} kernel nodes of graph {gid} not in {graph}")
    # keep the structure's component that holds this graph's kernels
    comp = set()
    stack = [n for n in kn if n in nodes]
    rev = collections.defaultdict(list)
    for a, bs in succ.items():
        for b in bs:
            rev[b].append(a)
    while stack:
        u = stack.pop()
        if u in comp:
            continue
        comp.add(u)
        stack.extend(succ[u])
        stack.extend(rev[u])
    deg = {u: sum(1 for a in rev[u] if a in comp) for u in comp}
    order, q = [], [u for u in comp if deg[u] == 0]
    while q:
        u = q.pop()
        order.append(u)
        for v in succ[u]:
            if v in comp:
                deg[v] -= 1
                if deg[v] == 0:
                    q.append(v)
    best, pred = {}, {}
    for u in order:
        w = med.get(u, 0.0)
        b0 = max(((best[a], a) for a in rev[u] if a in best), default=(0.0, None))
        best[u], pred[u] = b0[0] + w, b0[1]
    end = max(best, key=best.get)
    path = []
    while end is not None:
        path.append(end)
        end = pred[end]
    path.reverse()
    ks = [n for n in path if n in med]
    names = sorted({name[n] for n in ks})
    dm = dict(zip(names, subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                                        text=True).stdout.split("\n")))
    short = lambda n: dm.get(name[n], name[n]).replace("void ", "").split("(")[0][:60]
    tot = sum(med[n] for n in ks)
    print(f"graph {gid}: {len(kn)} kernel nodes, {len(use) // len(kn)} replays analysed; "
          f"replay span median {statistics.median(spans) / 1e6:.3f} ms")
    print(f"critical path by measured durations: {len(ks)} kernels, {tot / 1e6:.3f} ms of kernel time")
    groups = collections.defaultdict(lambda: [0, 0.0])
    for n in ks:
        k = short(n)
        parts = k.split("_")
        k = "cuBLAS " + parts[3] if k.startswith("nvjet") and len(parts) > 3 else k
        groups[k][0] += 1
        groups[k][1] += med[n]
    print(f"  {'kernel':60} {'n':>4} {'ms':>7} {'us each':>8}")
    for k, (c, t) in sorted(groups.items(), key=lambda x: -x[1][1])[:top]:
        print(f"  {k:60} {c:4d} {t / 1e6:7.3f} {t / c / 1e3:8.1f}")
    print("largest path entries (position, us, grid, kernel):")
    for i, n in sorted(enumerate(ks), key=lambda x: -med[x[1]])[:top // 2]:
        print(f"  {i:4d} {med[n] / 1e3:7.1f} {grid[n]:>12} {short(n)}")


if __name__ == "__main__":
    main()
