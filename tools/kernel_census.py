#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV (tools/kernel-census.sh): per kernel name,
the number of launches and the summed GPU time, over one repeating period of
the launch sequence (one iteration), largest first.

  python3 tools/kernel_census.py census_model.csv [--period auto|N] [--top 40]

The period is the smallest L such that the last L launch names equal the L
before them (one forward+backward, or one training step); --period N forces
it, --period all takes every row.  After the per-kernel table, the same
period by category (implicit-GEMM convs, cuBLAS, BatchNorm, split-K folds,
depthwise, elementwise, loss, optimizer, other: see CATEGORIES).

  --path LOG: a log of a run with LUCID_GRAPH_STATS=path (cuda/graph.cu),
  whose "lucid graph path:" lines list the kernel nodes of a graph's longest
  dependency path; each is matched to the census by kernel name (demangled
  with c++filt) and grid, and given the median duration of those launches
  (of that name alone when the grid differs; cuBLAS kernels, unnamed in the
  graph, by grid among the nvjet launches; 3 us when nothing matches, named
  in the output).  Prints the path's estimated kernel time by kernel
  (--path-seq: and the path node by node).  An estimate: the census times
  kernels one at a time, while in a replay the lanes' kernels share the
  GPU with the path."""
import csv, sys, argparse, collections, re, statistics, subprocess


def rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    r = list(csv.DictReader(lines))
    out = []
    for x in r:
        t = x.get("gpu__time_duration.sum", "")
        try:
            t = float(t.replace(",", ""))
        except ValueError:
            continue  # the units row
        name = x.get("Kernel Name", "?")
        out.append((name, t, x.get("Grid Size", ""), x.get("Block Size", ""), x.get("Stream", "?")))
    return out


def period(names):
    n = len(names)
    for L in range(50, n // 2 + 1):
        if names[n - L:] == names[n - 2 * L:n - L]:
            return L
    return n


# (category, substrings of the kernel name), first match wins
CATEGORIES = [
    ("implicit-GEMM conv", ("igemm_nchw",)),
    ("split-K / image folds", ("reduce_splits", "reduce_out", "wgrad_fold")),
    ("cuBLAS (1x1 convs, matmul) + casts", ("nvjet", "cutlass", "gemm_wcast", "gemm_bias", "sm90_xmma", "gemv")),
    ("BatchNorm (+SiLU)", ("bn_",)),
    ("depthwise conv", ("dw_",)),
    ("loss", ("loss", "assign", "tal_", "kpt_", "dfl")),
    ("optimizer / EMA / clip", ("optim", "adamw", "sgd", "musgd", "ema_", "clip", "norm_")),
    ("elementwise / copies / upsample / pool", ("map_", "add_fwd", "up_", "up2_", "chan_copy", "pool_", "cast_",
                                                "fill_", "silu", "softmax")),
]


def category(name):
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other"


def short(name):
    name = re.sub(r"\(.*$", "", name)
    return name[:70]


def demangle(names):
    """{mangled: demangled} for the names, through c++filt (each name maps to
    itself when c++filt is missing or fails). Also used by ktrace_report.py."""
    names = list(names)
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.splitlines()
        if len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        pass
    return {n: n for n in names}


def base_name(name):
    """Census / demangled kernel name without parameters, bools as 0/1
    (ncu prints template bools as 1/0, c++filt as true/false)."""
    b = re.sub(r"\(.*$", "", name).replace("void ", "").strip()
    b = re.sub(r"\btrue\b", "1", b)
    return re.sub(r"\bfalse\b", "0", b)


def critical_path(sel, log, seq):
    try:
        with open(log, errors="replace") as f:
            # node lines only: "lucid graph path: <i> <name> grid <g> block <b>"
            lines = [l for l in f if l.startswith("lucid graph path:") and len(l.split()) >= 7
                     and l.split()[3].isdigit()]
    except OSError as e:
        print(f"kernel_census: cannot read {log}: {e.strerror or e}", file=sys.stderr)
        return 1
    starts = [i for i, l in enumerate(lines) if l.split()[3] == "0"]
    if not starts:
        print(f"{log}: no 'lucid graph path: 0 ...' node lines (run with LUCID_GRAPH_STATS=path)")
        return 1
    # one graph's path: the lines of the last graph printed (indices restart at 0)
    lines = lines[starts[-1]:]
    mangled = [l.split()[4] for l in lines]
    grids = [l.split()[6] if len(l.split()) > 6 else "" for l in lines]
    dm = demangle(set(mangled))
    dem = [dm[m] for m in mangled]
    dur = collections.defaultdict(list)
    dur_name = collections.defaultdict(list)
    for name, t, g, b, st in sel:
        g = g.strip("()").replace(" ", "")
        dur[(base_name(name), g)].append(t / 1e3)
        dur_name[base_name(name)].append(t / 1e3)
    total, missing, nodes = 0.0, collections.Counter(), []
    by = collections.defaultdict(lambda: [0, 0.0])
    for m, d, g in zip(mangled, dem, grids):
        if m == "?":
            key = "cuBLAS (unnamed in the graph)"
            v = [t for (k, gg), ts in dur.items() if k.startswith("nvjet") and gg == g for t in ts]
        else:
            key = base_name(d)
            v = dur.get((key, g)) or dur_name.get(key)
        if v:
            t = statistics.median(v)
        else:
            t = 3.0
            missing[key] += 1
        total += t
        by[key][0] += 1
        by[key][1] += t
        nodes.append((key, g, t))
    print(f"critical path ({log}): {len(nodes)} kernel nodes, estimated kernel time "
          f"{total / 1e3:.3f} ms (census medians)")
    if missing:
        print("  not in the census (3 us each): " + ", ".join(f"{k} x{c}" for k, c in missing.items()))
    for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k[:66]:66s} {c:5d} {t / 1e3:8.3f} ms {t / c:7.1f} us")
    if seq:
        for i, (k, g, t) in enumerate(nodes):
            print(f"  {i:4d} {k[:60]:60s} grid {g:12s} {t:7.1f} us")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--period", default="auto")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--path", default=None)
    ap.add_argument("--path-seq", action="store_true")
    a = ap.parse_args()
    try:
        r = rows(a.csv)
    except OSError as e:
        print(f"kernel_census: cannot read {a.csv}: {e.strerror or e}", file=sys.stderr)
        return 1
    if not r:
        print("no kernel rows in", a.csv)
        return 1
    names = [x[0] for x in r]
    L = len(r) if a.period == "all" else (period(names) if a.period == "auto" else int(a.period))
    sel = r[len(r) - L:]
    tot = sum(x[1] for x in sel)
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, t, g, b, st in sel:
        e = by[short(name)]
        e[0] += 1
        e[1] += t
    print(f"{a.csv}: {len(r)} launches profiled; period {L} launches, GPU time {tot / 1e6:.3f} ms "
          f"(sum of kernel durations, ns -> ms)")
    print(f"{'kernel':70s} {'calls':>6s} {'ms':>8s} {'%':>6s} {'us/call':>8s}")
    for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"{k:70s} {c:6d} {t / 1e6:8.3f} {100 * t / tot:6.1f} {t / c / 1e3:8.2f}")
    cats = collections.defaultdict(lambda: [0, 0.0])
    for name, t, g, b, st in sel:
        e = cats[category(name)]
        e[0] += 1
        e[1] += t
    print("by category:")
    for k, (c, t) in sorted(cats.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:40s} {c:6d} calls {t / 1e6:8.3f} ms {100 * t / tot:6.1f} %")
    # by stream (the compute stream carries the critical path; the lanes'
    # side streams overlap it), and each stream's categories
    streams = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for name, t, g, b, st in sel:
        e = streams[st][category(name)]
        e[0] += 1
        e[1] += t
    print("by stream (ncu's stream id):")
    for st, cs in sorted(streams.items(), key=lambda kv: -sum(v[1] for v in kv[1].values())):
        n = sum(v[0] for v in cs.values())
        t = sum(v[1] for v in cs.values())
        print(f"  stream {st}: {n} calls {t / 1e6:.3f} ms; " + ", ".join(
            f"{k.split(' ')[0]} {c}/{v / 1e6:.3f}" for k, (c, v) in sorted(cs.items(), key=lambda kv: -kv[1][1])))
    # size classes: how much of the time is in short kernels
    buckets = [(2e3, "<2us"), (5e3, "2-5us"), (10e3, "5-10us"), (20e3, "10-20us"), (50e3, "20-50us"),
               (1e12, ">=50us")]
    print("duration classes:", ", ".join(
        f"{lab} {sum(1 for x in sel if lo_ok(x[1], buckets, i))} calls/"
        f"{sum(x[1] for x in sel if lo_ok(x[1], buckets, i)) / 1e6:.2f} ms" for i, (_, lab) in enumerate(buckets)))
    if a.path:
        return critical_path(sel, a.path, a.path_seq)
    return 0


def lo_ok(t, buckets, i):
    lo = buckets[i - 1][0] if i > 0 else 0
    return lo <= t < buckets[i][0]


if __name__ == "__main__":
    sys.exit(main())
