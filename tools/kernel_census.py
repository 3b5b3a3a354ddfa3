#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV (tools/kernel-census.sh): per kernel name,
the number of launches and the summed GPU time, over one repeating period of
the launch sequence (one iteration), largest first.

  python3 tools/kernel_census.py census_model.csv [--period auto|N] [--top 40]

The period is the smallest L such that the last L launch names equal the L
before them (one forward+backward, or one training step); --period N forces
it, --period all takes every row.  After the per-kernel table, the same
period by category (implicit-GEMM convs, cuBLAS, BatchNorm, split-K folds,
depthwise, elementwise, loss, optimizer, other: see CATEGORIES)."""
import csv, sys, argparse, collections, re


def rows(path):
    with open(path, newline="") as f:
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--period", default="auto")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    r = rows(a.csv)
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
    return 0


def lo_ok(t, buckets, i):
    lo = buckets[i - 1][0] if i > 0 else 0
    return lo <= t < buckets[i][0]


if __name__ == "__main__":
    sys.exit(main())
