"""ktrace_csv.py — reads tools/ktrace.c's kernel timeline for the ktrace_*.py
reports (ktrace_report, ktrace_path, ktrace_gaps, ktrace_starts).

records(trace) yields every well-formed row of the CSV (gzipped when the
name ends in .gz) as a tuple (start_ns, end_ns, stream, graph_id,
graph_node_id, grid, name), the integers parsed; a malformed row (e.g. the
last one of a trace cut short) is skipped. OSError (a missing or unreadable
file) reaches the caller, which names itself in its message.
"""
import csv, gzip


def records(trace):
    op = gzip.open if trace.endswith(".gz") else open
    with op(trace, "rt", newline="", errors="replace") as f:
        for r in csv.DictReader(f):
            try:
                yield (int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["graph_id"]),
                       int(r["graph_node_id"]), r["grid"], r["name"])
            except (KeyError, ValueError, TypeError):
                continue
