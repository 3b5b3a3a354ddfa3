#!/usr/bin/env python3
"""fit_line.py — one summary line from bench/fit_once.lua's output (its last
line, a JSON object), read on stdin; used by tools/gpu-run.sh after each
recorded fit of an A/B arm.

  luajit bench/fit_once.lua record=true | tail -1 | python3 tools/fit_line.py

Prints: fit s, steady step ms, contract check us per replay, route, model
hash, then the pacing diagnostics when present: stage_wait_us (the host's
mean wait for a staging set's last upload: near 0 when the host is the
slower side), loader_wait_ms (the host's wait for batches per steady step)
and the steady windows' per-step min..max in ms (seconds / steps of the
windows from steady_from, the trainer's choice; all without it). "no result <why>" when the input is not such
a JSON object.
"""
import json
import sys


def line(d):
    s = d.get("step") or {}
    out = "%.2f s, step %.3f ms, contract %.2f us, route %s, model %s" % (
        d["fit_s"], d["steady_step_ms"], s.get("contract_us_per_replay", -1), s.get("route"),
        d["hashes"]["model"])
    extra = []
    if s.get("pipelined"):
        extra.append("pipelined, lane B replays %s" % s.get("lane_b_replays"))
    elif s.get("pipeline_refused"):
        extra.append("pipeline refused: %s" % s["pipeline_refused"])
    if s.get("stage_wait_us") is not None:
        extra.append("stage wait %.1f us" % s["stage_wait_us"])
    if d.get("loader_wait_ms") is not None:
        extra.append("loader wait %.3f ms/step" % d["loader_wait_ms"])
    w = d.get("windows") or []
    steady = w[(d.get("steady_from") or 1) - 1:]  # the trainer's steady windows (1-based)
    per = [1000.0 * sec / n for sec, n in steady if n]
    if per:
        extra.append("windows %.3f..%.3f ms/step" % (min(per), max(per)))
    return out + ("; " + ", ".join(extra) if extra else "")


def main():
    try:
        print(line(json.loads(sys.stdin.read())))
    except Exception as e:  # any malformed input: say so, never fail the caller
        print("no result", e)


if __name__ == "__main__":
    main()
