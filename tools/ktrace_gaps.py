#!/usr/bin/env python3
"""The measured critical path of the replayed training step, with its gaps.

Joins tools/ktrace.c's kernel timeline (ktrace CSV, gzipped or not) with the
graph structure it records under KTRACE_GRAPH, takes each kernel node's
median start and end (relative to its replay's first kernel) over the last
`replays` complete replays of the graph with the most kernel records, and
walks back from the kernel that ends last: at each node, to the graph
predecessor (through non-kernel nodes) that ended last. Unlike
tools/ktrace_path.py (the longest path by durations, every edge a full
dependency), this is the chain that actually held the replay up, and the
"gap" of a node is how long it started after that predecessor ended: a
launch interval (~0.4 us on one stream) or a wait for SMs that other kernels
held. Prints the path's kernel time, gaps and span, the gaps summed over
position ranges (regions=a,b,... cut points), the nodes whose gap exceeds
gap_us (all=1: every node), and the mean number of kernels running per
window of window_us (the replay's concurrency).

usage: ktrace_gaps.py TRACE.csv[.gz] GRAPH.csv [replays=40] [gap_us=3]
                      [regions=100,200] [window_us=100] [all=0]
Session 12 (docs/PERF.md) used it to find the head region's waits.
"""
import collections, statistics, subprocess, sys

from ktrace_csv import records


def fail(msg):
    print("ktrace_gaps: " + msg)
    sys.exit(1)


def load(trace):
    try:  # rows cut short skipped
        rows = [(s, e, n & 0xffffffff, name, grid, g, stream)
                for s, e, stream, g, n, grid, name in records(trace) if g]
    except OSError as e:
        fail(f"cannot read {trace}: {e.strerror}")
    if not rows:
        fail(f"no graph kernel records in {trace}")
    return rows


def structure(graph, kn):
    dumped = collections.defaultdict(lambda: (set(), []))
    try:
        with open(graph) as f:
            for line in f:
                p = line.strip().split(",")
                try:
                    if p[0] == "node":
                        dumped[int(p[1]) >> 32][0].add(int(p[1]) & 0xffffffff)
                    elif p[0] == "edge":
                        dumped[int(p[1]) >> 32][1].append(
                            (int(p[1]) & 0xffffffff, int(p[2]) & 0xffffffff))
                except (ValueError, IndexError):
                    pass
    except OSError as e:
        fail(f"cannot read {graph}: {e.strerror}")
    pick = [g for g, (ns, _) in dumped.items() if kn <= ns]
    if not pick:
        fail(f"no recorded graph structure holds the {len(kn)} kernel nodes")
    rev = collections.defaultdict(list)
    for a, b in dumped[pick[-1]][1]:
        rev[b].append(a)
    return rev


def main():
    if len(sys.argv) < 3:
        fail("usage: ktrace_gaps.py TRACE.csv[.gz] GRAPH.csv [replays=40] [gap_us=3] "
             "[regions=a,b] [window_us=100] [all=0]")
    try:
        opts = dict(a.split("=", 1) for a in sys.argv[3:])
        nrep, gap_us = int(opts.get("replays", 40)), float(opts.get("gap_us", 3))
        cuts = [int(c) for c in opts.get("regions", "").split(",") if c]
        window, show_all = float(opts.get("window_us", 100)), opts.get("all", "0") == "1"
    except ValueError:
        fail("options: replays=N gap_us=X regions=a,b window_us=X all=0|1")
    rows = load(sys.argv[1])
    gid = collections.Counter(r[5] for r in rows).most_common(1)[0][0]
    rows = sorted(r for r in rows if r[5] == gid)
    byn = collections.defaultdict(list)
    for r in rows:
        byn[r[2]].append(r)
    kn = set(byn)
    full = min(len(v) for v in byn.values())
    # replay j = every node's j-th record from the end (the trace keeps its
    # tail, so the oldest records may be a partial replay: j stops at the
    # fewest records of a node); the newest is left out, as it may be cut
    # short by the process's exit
    reps = [{n: byn[n][-j] for n in kn} for j in range(1, full + 1)]
    reps = (reps[1:] if len(reps) > 1 else reps)[:nrep]
    S, E = collections.defaultdict(list), collections.defaultdict(list)
    for d in reps:
        t0 = min(v[0] for v in d.values())
        for n, v in d.items():
            S[n].append(v[0] - t0)
            E[n].append(v[1] - t0)
    S = {n: statistics.median(v) for n, v in S.items()}
    E = {n: statistics.median(v) for n, v in E.items()}
    last = reps[0]
    name = {n: v[3] for n, v in last.items()}
    grid = {n: v[4] for n, v in last.items()}
    stream = {n: v[6] for n, v in last.items()}
    rev = structure(sys.argv[2], kn)

    def kpreds(u, seen):
        out = []
        for a in rev[u]:
            if a in seen:
                continue
            seen.add(a)
            out.extend([a] if a in S else kpreds(a, seen))
        return out

    names = sorted(set(name.values()))
    dm = dict(zip(names, subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                                        text=True).stdout.split("\n")))
    short = lambda n: dm.get(name[n], name[n]).replace("void ", "").split("(")[0][:48]
    path = [max(E, key=E.get)]
    while True:
        ps = kpreds(path[-1], set())
        if not ps:
            break
        path.append(max(ps, key=lambda a: E[a]))
    path.reverse()
    gaps = [0.0] + [S[path[i]] - E[path[i - 1]] for i in range(1, len(path))]
    kern = sum(E[n] - S[n] for n in path)
    print(f"graph {gid}: {len(kn)} kernel nodes, {len(reps)} replays analysed")
    print(f"measured path: {len(path)} kernels, kernel time {kern / 1e3:.1f} us, gaps "
          f"{sum(max(g, 0.0) for g in gaps) / 1e3:.1f} us, span "
          f"{(E[path[-1]] - S[path[0]]) / 1e3:.1f} us")
    bounds = [0] + [c for c in cuts if 0 < c < len(path)] + [len(path)]
    for a, b in zip(bounds, bounds[1:]):
        sel = range(a, b)
        print(f"  positions {a}-{b - 1}: t {S[path[a]] / 1e3:.1f}..{E[path[b - 1]] / 1e3:.1f} us, "
              f"kernel {sum(E[path[i]] - S[path[i]] for i in sel) / 1e3:.1f} us, gaps "
              f"{sum(max(gaps[i], 0.0) for i in sel if i) / 1e3:.1f} us")
    print(f"path nodes{'' if show_all else f' with a gap over {gap_us:g} us'} "
          "(position, start us, duration us, gap us, grid, stream, kernel):")
    for i, n in enumerate(path):
        if show_all or gaps[i] / 1e3 > gap_us:
            print(f"  {i:4d} {S[n] / 1e3:8.1f} {(E[n] - S[n]) / 1e3:6.1f} {gaps[i] / 1e3:6.1f} "
                  f"{grid[n]:>12} s{stream[n]:<4d} {short(n)}")
    span = max(E.values())
    w = window * 1e3
    print(f"kernels running per {window:g} us window (mean):")
    k = 0
    while k * w < span:
        a, b = k * w, (k + 1) * w
        busy = sum(max(0.0, min(b, E[n]) - max(a, S[n])) for n in S)
        print(f"  {a / 1e3:8.0f} {busy / w:5.2f}")
        k += 1


if __name__ == "__main__":
    main()
