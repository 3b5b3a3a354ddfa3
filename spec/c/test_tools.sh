#!/usr/bin/env bash
# test_tools.sh — the GPU diagnostics' offline halves on synthetic inputs
# whose answers are known:
#   tools/ktrace_report.py   a CUPTI kernel timeline (tools/ktrace.c's CSV):
#                            5 replays of a 4-node graph on 2 streams, an
#                            eager kernel between replays; checks the node
#                            count, replays, span, period, per-stream busy
#                            time and the critical chain's kernel time/gaps
#   tools/ktrace_starts.py   replay by replay: 4 replays after an input
#                            kernel, one starting 200 us late, one with a
#                            100 us idle stretch inside; checks the counts
#                            and the per-replay costs
#   tools/fit_line.py        a fit_once JSON line: the summary fields and the
#                            pacing diagnostics; "no result" for bad input
#   tools/kernel_census.py   --path: a census (Nsight Compute CSV rows) and
#                            a LUCID_GRAPH_STATS=path log; checks the path's
#                            estimated kernel time and the per-kernel rows
# make installs it as build/tests/test_tools; spec/run_tests.sh counts its
# "ok" / "not ok" lines like those of the C tests. Needs python3 and c++filt.
set -u
cd "$(dirname "$0")/../.." || exit 1
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() { # check NAME HAYSTACK NEEDLE
    if printf '%s\n' "$2" | grep -qF -- "$3"; then
        echo "ok tools $1"
    else
        echo "not ok tools $1: expected '$3' in the output:"
        printf '%s\n' "$2" | sed 's/^/#   /'
        failed=1
    fi
}

for tool in python3 c++filt; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "not ok tools: $tool not found"
        exit 1
    fi
done

# ---- ktrace_report.py: replay r starts at 100000*r ns; node 0 on stream 13
# [0, 10us), nodes 1 and 2 on streams 13 / 20 after it ([11, 31) and
# [11, 21) us), node 3 on 13 at [32, 40) us; an eager kernel at 60-61 us.
{
    echo "start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name"
    for r in 0 1 2 3 4; do
        b=$((r * 100000))
        echo "$((b)),$((b + 10000)),13,7,100,1.1.1,256.1.1,_Z5firstv"
        echo "$((b + 11000)),$((b + 31000)),13,7,101,2.1.1,256.1.1,_Z4longv"
        echo "$((b + 11000)),$((b + 21000)),20,7,102,3.1.1,256.1.1,_Z4sidev"
        echo "$((b + 32000)),$((b + 40000)),13,7,103,1.1.1,256.1.1,_Z4lastv"
        echo "$((b + 60000)),$((b + 61000)),13,0,0,1.1.1,64.1.1,_Z5inputv"
    done
} > "$tmp/trace.csv"
out=$(python3 tools/ktrace_report.py "$tmp/trace.csv" --last 3 2>&1)
check "ktrace nodes and replays" "$out" "graph 7: 4 kernel nodes, 5 replays; last 3 analysed"
check "ktrace span" "$out" "replay span: median 0.040 ms [0.040, 0.040]"
check "ktrace period" "$out" "replay period (start to next start): median 0.100 ms"
check "ktrace between replays" "$out" "input 1.0x 1.0 us"
check "ktrace stream busy" "$out" "stream 13: busy 0.038 ms, 3 kernels"
check "ktrace side stream" "$out" "stream 20: busy 0.010 ms, 1 kernels"
# chain: last (8 us) <- long (20 us, ended 1 us before) <- first (10 us, 1 us)
check "ktrace chain" "$out" "critical chain (walked back by times): 3 kernels, kernel time 0.038 ms, gaps 0.002 ms"
check "ktrace gap median" "$out" "median 1.00 us"

# ---- ktrace_starts.py: replay r's input kernel at 10000*r us (10 us long);
# the replay's two kernels (graph 7) start 2 us after it, replay 2 200 us
# after it; replay 3's second kernel starts 100 us after its first ends
{
    echo "start_ns,end_ns,stream,graph_id,graph_node_id,grid,block,name"
    for r in 0 1 2 3; do
        b=$((r * 10000000)); d=2000; [ "$r" = 2 ] && d=200000
        s0=$((b + 10000 + d)); gap=1000; [ "$r" = 3 ] && gap=100000
        echo "$b,$((b + 10000)),13,0,0,132.4.1,256.1.1,_Z20input_prepare_kernelv"
        echo "$s0,$((s0 + 30000)),13,7,100,1.1.1,256.1.1,_Z5firstv"
        echo "$((s0 + 30000 + gap)),$((s0 + 60000 + gap)),13,7,101,1.1.1,256.1.1,_Z4lastv"
    done
} > "$tmp/starts.csv"
out=$(python3 tools/ktrace_starts.py "$tmp/starts.csv" 2>&1)
check "starts replays" "$out" "graph 7: 4 replays after an input kernel ('input_prepare')"
check "starts late" "$out" "1 later than 50 us (200.0 us in all, 50.0 us per replay)"
check "starts median" "$out" "start after the input kernel: median 2.0 us"
check "starts idle" "$out" "idle inside replays (stretches > 20 us): 1 of 4 replays, 25.0 us per replay"
check "starts worst" "$out" "replay 2: start +200.0 us, idle 0.0 us"
{ cat "$tmp/starts.csv"; printf '300,4'; } > "$tmp/starts_cut.csv" # cut short mid-row
out=$(python3 tools/ktrace_starts.py "$tmp/starts_cut.csv" 2>&1)
check "starts cut-short row skipped" "$out" "graph 7: 4 replays after an input kernel ('input_prepare')"
out=$(python3 tools/ktrace_starts.py "$tmp/missing.csv" 2>&1)
check "starts missing file" "$out" "ktrace_starts: cannot read $tmp/missing.csv: No such file or directory"

# ---- ktrace_gaps.py over the same trace and its graph (CUPTI node ids are
# graph << 32 | local id): first -> long, first -> side, long -> last,
# side -> last. The measured path is first, long (it ended last of last's
# predecessors), last: 38 us of kernels, gaps 1 + 1 us, span 40 us.
{
    for n in 100 101 102 103; do echo "node,$(( (7 << 32) + n )),0"; done
    echo "edge,$(( (7 << 32) + 100 )),$(( (7 << 32) + 101 ))"
    echo "edge,$(( (7 << 32) + 100 )),$(( (7 << 32) + 102 ))"
    echo "edge,$(( (7 << 32) + 101 )),$(( (7 << 32) + 103 ))"
    echo "edge,$(( (7 << 32) + 102 )),$(( (7 << 32) + 103 ))"
} > "$tmp/graph.csv"
out=$(python3 tools/ktrace_gaps.py "$tmp/trace.csv" "$tmp/graph.csv" gap_us=0.5 regions=2 window_us=20 2>&1)
check "gaps replays" "$out" "graph 7: 4 kernel nodes, 4 replays analysed"
check "gaps path" "$out" "measured path: 3 kernels, kernel time 38.0 us, gaps 2.0 us, span 40.0 us"
check "gaps region 1" "$out" "positions 0-1: t 0.0..31.0 us, kernel 30.0 us, gaps 1.0 us"
check "gaps region 2" "$out" "positions 2-2: t 32.0..40.0 us, kernel 8.0 us, gaps 1.0 us"
check "gaps node" "$out" "     2     32.0    8.0    1.0        1.1.1 s13   last"
# windows: [0, 20) first 10 + long 9 + side 9 us = 1.40; [20, 40) long 11 +
# side 1 + last 8 us = 1.00
check "gaps concurrency" "$out" "         0  1.40"
check "gaps concurrency 2" "$out" "        20  1.00"
out=$(python3 tools/ktrace_gaps.py "$tmp/trace.csv" "$tmp/missing.csv" 2>&1)
check "gaps missing graph" "$out" "ktrace_gaps: cannot read $tmp/missing.csv: No such file or directory"
if printf '%s\n' "$out" | grep -q Traceback; then echo "not ok tools: ktrace_gaps traceback"; failed=1; fi

# ---- kernel_census.py --path: a census of one 3-launch period repeated
# twice, and a path of 4 kernel nodes (one of them cuBLAS, one unknown)
{
    echo '"ID","Kernel Name","Stream","Block Size","Grid Size","gpu__time_duration.sum"'
    echo '"","","","","","nsecond"'
    i=0
    for rep in 0 1; do
        echo "\"$i\",\"void conv_k<__nv_bfloat16, true>(int)\",\"13\",\"(128, 1, 1)\",\"(400, 1, 1)\",\"20,000\""; i=$((i + 1))
        echo "\"$i\",\"bn_k(float *)\",\"13\",\"(256, 1, 1)\",\"(1, 64, 1)\",\"6,000\""; i=$((i + 1))
        echo "\"$i\",\"nvjet_sm90_tst_64x64\",\"13\",\"(384, 1, 1)\",\"(4, 28, 1)\",\"4,000\""; i=$((i + 1))
    done
} > "$tmp/census.csv"
{
    echo "lucid graph: 9 nodes (9 kernels, 0 memcpy, 0 memset, 0 other), 8 edges, 1 roots; longest path 4 nodes, 4 kernel nodes"
    echo "lucid graph path: 0 _Z6conv_kI13__nv_bfloat16Lb1EEvi grid 400,1,1 block 128,1,1"
    echo "lucid graph path: 1 _Z4bn_kPf grid 1,64,1 block 256,1,1"
    echo "lucid graph path: 2 ? grid 4,28,1 block 384,1,1"
    echo "lucid graph path: 3 _Z7unknownv grid 1,1,1 block 32,1,1"
} > "$tmp/path.log"
out=$(python3 tools/kernel_census.py "$tmp/census.csv" --period 3 --path "$tmp/path.log" 2>&1)
check "census period" "$out" "period 3 launches, GPU time 0.030 ms"
check "census path total" "$out" "4 kernel nodes, estimated kernel time 0.033 ms"
check "census path missing" "$out" "not in the census (3 us each): unknown x1"
check "census path conv row" "$out" "conv_k<__nv_bfloat16, 1>"
check "census path cublas row" "$out" "cuBLAS (unnamed in the graph)"
# ---- fit_line.py: the summary line of a fit_once JSON line (4 windows: the
# steady one is the fourth, 0.070 s / 20 steps = 3.500 ms per step)
printf '%s\n' '{"fit_s":3.5,"steady_step_ms":3.3,"hashes":{"model":"abc"},"windows":[[0.6,20],[0.07,20],[0.07,20],[0.07,20]],"steady_from":4,"loader_wait_ms":0.25,"step":{"contract_us_per_replay":1.5,"route":"eager clip","stage_wait_us":812.5}}' > "$tmp/fit.json"
out=$(python3 tools/fit_line.py < "$tmp/fit.json" 2>&1)
check "fit_line fields" "$out" "3.50 s, step 3.300 ms, contract 1.50 us, route eager clip, model abc"
check "fit_line pacing" "$out" "stage wait 812.5 us, loader wait 0.250 ms/step, windows 3.500..3.500 ms/step"
out=$(printf 'not json\n' | python3 tools/fit_line.py 2>&1)
check "fit_line bad input" "$out" "no result"
# ---- bad input: one clear line, never a traceback
{ cat "$tmp/trace.csv"; printf '300,4'; } > "$tmp/cut.csv" # a trace cut short mid-row
out=$(python3 tools/ktrace_report.py "$tmp/cut.csv" --last 3 2>&1)
check "ktrace cut-short row skipped" "$out" "graph 7: 4 kernel nodes, 5 replays; last 3 analysed"
out=$(python3 tools/ktrace_report.py "$tmp/missing.csv" 2>&1)
check "ktrace missing file" "$out" "ktrace_report: cannot read $tmp/missing.csv: No such file or directory"
printf 'lucid graph path: out of host memory\nlucid graph path:\n' > "$tmp/oom.log"
out=$(python3 tools/kernel_census.py "$tmp/census.csv" --period 3 --path "$tmp/oom.log" 2>&1)
check "census path without node lines" "$out" "no 'lucid graph path: 0 ...' node lines"
out=$(python3 tools/kernel_census.py "$tmp/missing.csv" 2>&1)
check "census missing file" "$out" "kernel_census: cannot read $tmp/missing.csv: No such file or directory"
if printf '%s\n' "$out" | grep -q Traceback; then echo "not ok tools: a traceback"; failed=1; fi
exit $failed
