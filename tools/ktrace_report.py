#!/usr/bin/env python3
"""Per-replay statistics of a CUDA graph from a kernel timeline written by
tools/ktrace.c (CUPTI, concurrent kernels, graph kernel nodes included).

  python3 tools/ktrace_report.py trace.csv [--last 30] [--top 25]

The graph analysed is the one with the most kernel records (the training
step's forward+backward graph in a recorded fit).  Its records are cut into
replays (sorted by start; a replay is one record of each of its nodes), and
the last --last replays are summarised:
  - replay span (first kernel start to last kernel end) and the period from
    one replay's start to the next (the step, with what runs between);
  - busy time per stream (union of kernel intervals) and launches;
  - a critical chain, walked back from the last kernel to end: each link is
    the kernel that ended last before the current one started (an estimate
    of the dependency path from times alone); its kernel time and its gaps
    (start of a link minus end of the link before it), by kernel name;
  - the gap distribution along that chain.
All times are from CUPTI's timestamps of the real replay (kernels sharing
the GPU), unlike a Nsight Compute census (kernels one at a time)."""
import argparse, bisect, collections, statistics, sys

from ktrace_csv import records

from kernel_census import demangle  # tools/kernel_census.py, beside this file


def short(n):
    n = n.split("(")[0].replace("void ", "")
    return n[:64]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    try:
        rows = list(records(a.csv))  # malformed rows (a trace cut short) skipped
    except OSError as e:
        print(f"ktrace_report: cannot read {a.csv}: {e.strerror or e}", file=sys.stderr)
        return 1
    if not rows:
        print("no kernel records in", a.csv)
        return 1
    by_graph = collections.Counter(r[3] for r in rows if r[3] != 0)
    if not by_graph:
        print("no graph kernel records in", a.csv)
        return 1
    gid = max(by_graph, key=lambda g: (len({r[4] for r in rows if r[3] == g}), by_graph[g]))
    recs = sorted((r for r in rows if r[3] == gid), key=lambda r: r[0])
    nodes = len({r[4] for r in recs})
    nrep = len(recs) // nodes
    reps = [recs[i * nodes:(i + 1) * nodes] for i in range(nrep)]
    reps = [rp for rp in reps if len({r[4] for r in rp}) == nodes]  # whole replays only
    sel = reps[-a.last:]
    if not sel:
        print("no complete replay of graph", gid)
        return 1
    dm = demangle({r[6] for rp in sel for r in rp})
    spans = [max(r[1] for r in rp) - min(r[0] for r in rp) for rp in sel]
    starts = [min(r[0] for r in rp) for rp in reps]
    periods = [b - a_ for a_, b in zip(starts[-a.last - 1:], starts[-a.last:])]
    print(f"{a.csv}: {len(rows)} kernel records; graph {gid}: {nodes} kernel nodes, {nrep} replays; "
          f"last {len(sel)} analysed")
    print(f"replay span: median {statistics.median(spans) / 1e6:.3f} ms "
          f"[{min(spans) / 1e6:.3f}, {max(spans) / 1e6:.3f}]")
    if periods:
        print(f"replay period (start to next start): median {statistics.median(periods) / 1e6:.3f} ms")
    # between replays: what ran outside the graph
    outside = collections.defaultdict(list)
    for rp, nxt in zip(reps[-a.last - 1:-1], reps[-a.last:]):
        e, s = max(r[1] for r in rp), min(r[0] for r in nxt)
        for r in rows:
            if r[3] != gid and e <= r[0] and r[1] <= s:
                outside[r[6]].append(r[1] - r[0])
    if outside:
        dmo = demangle(outside)
        print("kernels between replays (per replay): " + ", ".join(
            f"{short(dmo[k])} {len(v) / max(len(sel), 1):.1f}x {statistics.median(v) / 1e3:.1f} us"
            for k, v in sorted(outside.items(), key=lambda kv: -sum(kv[1]))[:6]))
    # streams
    busy = collections.defaultdict(list)
    launches = collections.Counter()
    for rp in sel:
        per = collections.defaultdict(list)
        for r in rp:
            per[r[2]].append((r[0], r[1]))
        for st, iv in per.items():
            iv.sort()
            tot, cs, ce = 0, None, None
            for s, e in iv:
                if cs is None or s > ce:
                    if cs is not None:
                        tot += ce - cs
                    cs, ce = s, e
                else:
                    ce = max(ce, e)
            tot += ce - cs
            busy[st].append(tot)
            launches[st] += len(iv)
    print("per stream (median busy time per replay, launches per replay):")
    for st in sorted(busy, key=lambda s: -statistics.median(busy[s])):
        print(f"  stream {st}: busy {statistics.median(busy[st]) / 1e6:.3f} ms, "
              f"{launches[st] / len(sel):.0f} kernels")
    # critical chain per replay
    chain_len, chain_k, chain_g = [], [], []
    kt = collections.defaultdict(lambda: [0, 0.0, 0.0])  # name -> n, kernel ns, gap ns before it
    gaps = []
    for rp in sel:
        ends = sorted(rp, key=lambda r: r[1])
        endv = [r[1] for r in ends]
        cur = ends[-1]
        k = g = n = 0
        while True:
            n += 1
            k += cur[1] - cur[0]
            i = bisect.bisect_right(endv, cur[0]) - 1
            if i < 0:
                kt[cur[6]][0] += 1
                kt[cur[6]][1] += cur[1] - cur[0]
                break
            prev = ends[i]
            gap = cur[0] - prev[1]
            g += gap
            gaps.append(gap)
            kt[cur[6]][0] += 1
            kt[cur[6]][1] += cur[1] - cur[0]
            kt[cur[6]][2] += gap
            cur = prev
        chain_len.append(n)
        chain_k.append(k)
        chain_g.append(g)
    m = len(sel)
    print(f"critical chain (walked back by times): {statistics.median(chain_len):.0f} kernels, kernel time "
          f"{statistics.median(chain_k) / 1e6:.3f} ms, gaps {statistics.median(chain_g) / 1e6:.3f} ms "
          f"(medians per replay)")
    gs = sorted(gaps)
    if gs:
        q = lambda p: gs[min(len(gs) - 1, int(p * len(gs)))] / 1e3
        print(f"  gap between links: p10 {q(0.1):.2f} us, median {q(0.5):.2f} us, p90 {q(0.9):.2f} us, "
              f"max {gs[-1] / 1e3:.2f} us")
    print(f"  {'kernel':64s} {'n/replay':>8s} {'kernel ms':>9s} {'us each':>8s} {'gap us':>7s}")
    for name, (n, kns, gns) in sorted(kt.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:a.top]:
        print(f"  {short(dm.get(name, name)):64s} {n / m:8.1f} {kns / m / 1e6:9.3f} {kns / n / 1e3:8.1f} "
              f"{gns / n / 1e3:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
