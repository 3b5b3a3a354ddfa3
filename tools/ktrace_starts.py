#!/usr/bin/env python3
"""Replay by replay: when each replay of the recorded step started, and where
the GPU sat idle inside it.

Reads tools/ktrace.c's kernel timeline (CSV, gzipped or not). A replay is the
run of kernels of the graph with the most kernel records that follows one
launch of the eager input kernel (`input=`, a substring of its mangled name;
the recorded step's input_prepare runs right before each FB replay), up to
the next input kernel. For each replay:
  start   its first kernel's start after the input kernel's end (the host's
          launch and the graph's first node; ~2 us when the host is ahead);
  before  the input kernel's start after the previous replay's last kernel
          (the uploads the input kernel waits for, or a host that is late);
  idle    the time inside the replay (first start to last end) with no kernel
          of any stream running, counted in stretches longer than idle_us.
Prints the medians, p90 and maxima, how many replays started more than
late_us after their input kernel and what those starts cost in all, and how
many had an idle stretch, with the five worst. Session 14 (docs/PERF.md) found
the two stalls of DECISIONS 42 and 44 this way (a second graph root starting
146 us late; replays starting 0.5-1.9 ms late after a host pause).

usage: ktrace_starts.py TRACE.csv[.gz] [input=input_prepare] [late_us=50]
                        [idle_us=20] [last=0 (0: every replay)]
"""
import bisect, collections, statistics, sys

from ktrace_csv import records


def fail(msg):
    print("ktrace_starts: " + msg)
    sys.exit(1)


def load(trace):
    try:  # rows cut short skipped
        rows = [(s, e, g, name) for s, e, _, g, _, _, name in records(trace)]
    except OSError as e:
        fail("cannot read %s: %s" % (trace, e.strerror or e))
    rows.sort()
    return rows


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv):
    if len(argv) < 2:
        fail("usage: ktrace_starts.py TRACE.csv[.gz] [input=input_prepare] [late_us=50] "
             "[idle_us=20] [last=0]")
    opt = {"input": "input_prepare", "late_us": "50", "idle_us": "20", "last": "0"}
    for a in argv[2:]:
        k, _, v = a.partition("=")
        if k not in opt:
            fail("unknown option %r" % a)
        opt[k] = v
    late_ns, idle_ns = float(opt["late_us"]) * 1e3, float(opt["idle_us"]) * 1e3
    rows = load(argv[1])
    graphs = collections.Counter(g for _, _, g, _ in rows if g)
    if not graphs:
        fail("no graph kernels in " + argv[1])
    gid = graphs.most_common(1)[0][0]
    inputs = [i for i, r in enumerate(rows) if r[2] == 0 and opt["input"] in r[3]]
    reps = []  # (input start, input end, replay kernels, previous replay end)
    prev_end = None
    for n, i in enumerate(inputs):
        stop = inputs[n + 1] if n + 1 < len(inputs) else len(rows)
        ks = [r for r in rows[i + 1:stop] if r[2] == gid]
        if not ks:
            continue
        reps.append((rows[i][0], rows[i][1], ks, prev_end))
        prev_end = max(r[1] for r in ks)
    if int(opt["last"]) > 0:
        reps = reps[-int(opt["last"]):]
    if not reps:
        fail("no replay follows an input kernel (%r) in %s" % (opt["input"], argv[1]))
    starts_all = [r[0] for r in rows]
    starts, befores, idles, late = [], [], [], []
    for s_in, e_in, ks, pe in reps:
        t0, t1 = ks[0][0], max(r[1] for r in ks)
        st = t0 - e_in
        starts.append(st)
        if pe is not None:
            befores.append(s_in - pe)
        if st > late_ns:
            late.append(st)
        # idle stretches inside the replay: every kernel of any stream counts
        lo = bisect.bisect_left(starts_all, t0 - 10_000_000)  # kernels begun up to 10 ms before
        hi = bisect.bisect_left(starts_all, t1)
        iv = sorted((a, b) for a, b, _, _ in rows[lo:hi] if b > t0)
        cur, idle = t0, []
        for a, b in iv:
            if a > cur and a - cur > idle_ns:
                idle.append(a - cur)
            cur = max(cur, b)
        idles.append(sum(idle))
    us = lambda x: x / 1e3
    print("graph %d: %d replays after an input kernel (%r)" % (gid, len(reps), opt["input"]))
    print("start after the input kernel: median %.1f us, p90 %.1f, max %.1f; %d later than %g us "
          "(%.1f us in all, %.1f us per replay)" % (us(statistics.median(starts)), us(pct(starts, 0.9)),
          us(max(starts)), len(late), float(opt["late_us"]), us(sum(late)), us(sum(late)) / len(reps)))
    if befores:
        print("input kernel after the previous replay: median %.1f us, p90 %.1f, max %.1f"
              % (us(statistics.median(befores)), us(pct(befores, 0.9)), us(max(befores))))
    with_idle = [x for x in idles if x > 0]
    print("idle inside replays (stretches > %g us): %d of %d replays, %.1f us per replay"
          % (float(opt["idle_us"]), len(with_idle), len(reps), us(sum(idles)) / len(reps)))
    worst = sorted(range(len(reps)), key=lambda k: -(max(starts[k] - late_ns, 0) + idles[k]))[:5]
    for k in worst:
        if starts[k] > late_ns or idles[k] > 0:
            print("  replay %d: start +%.1f us, idle %.1f us" % (k, us(starts[k]), us(idles[k])))


if __name__ == "__main__":
    main(sys.argv)
