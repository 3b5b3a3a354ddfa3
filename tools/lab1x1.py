#!/usr/bin/env python3
"""tools/lab1x1.py — the 1x1 convs of two conv_lab CSVs side by side.

conv_lab (bench/conv_lab) run twice, with LUCID_CONV1X1=gemm and =igemm,
writes per shape and pass the median ms of the engine's route ("lucid").
This prints, for every 1x1 stride-1 unpadded shape, the two routes' ms per
pass, the faster one, and the per-step sums (ms x calls per step) of each
pass under gemm, igemm and the per-(shape, pass) best.
  python3 tools/lab1x1.py lab_gemm.csv lab_igemm.csv
"""
import csv
import sys


def load(path):
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["route"] != "lucid" or r["status"] != "ok":
                continue
            if not (r["k"] == "1" and r["s"] == "1" and r["p"] == "0" and r["g"] == "1"):
                continue
            key = (int(r["idx"]), r["pass"])
            calls = int(r["dgrad_count"] if r["pass"].startswith("d") else r["count"])
            shape = "N%s C%s->%s %sx%s" % (r["N"], r["Cin"], r["Cout"], r["H"], r["W"])
            out[key] = (shape, calls, float(r["ms"]))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: lab1x1.py lab_gemm.csv lab_igemm.csv")
    g, i = load(sys.argv[1]), load(sys.argv[2])
    sums = {}
    print("%-4s %-24s %-6s %5s %9s %9s %s" % ("idx", "shape", "pass", "calls", "gemm", "igemm", "best"))
    for key in sorted(set(g) & set(i)):
        shape, calls, mg = g[key]
        mi = i[key][2]
        best = "gemm" if mg <= mi else "igemm"
        print("%-4d %-24s %-6s %5d %9.4f %9.4f %s" % (key[0], shape, key[1], calls, mg, mi, best))
        s = sums.setdefault(key[1], [0.0, 0.0, 0.0])
        s[0] += calls * mg
        s[1] += calls * mi
        s[2] += calls * min(mg, mi)
    print("per-step sums, ms (gemm / igemm / best of each):")
    for p, (a, b, c) in sorted(sums.items()):
        print("  %-6s %8.3f %8.3f %8.3f" % (p, a, b, c))


if __name__ == "__main__":
    main()
