#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with
# .runtime/ and .data/ carried (make gpu-pack). Builds with nvcc, then runs
# what is asked:
#   test       make test-gpu
#   reference  the PyTorch comparisons (network fp32, loss)
#   bench      make bench
#   lab        the conv kernel lab (bench/conv_lab) and the warm-up profile
#   fit        the default main job, eager then recorded, with LUCID_PROFILE=1
#   all        test + reference + bench
#   quick      the CUDA C tests, the conv/model/optimizer/loader benchmarks,
#              the layer profile and the default fit eager then recorded
#   verify     make test-gpu (timed, one command), then bench_optim (with and
#              without the programmatic dependent launch), bench_bnsilu,
#              bench_model; logs packed into $out/logs.tgz
#   ab         the CUDA C tests (AB_CTESTS="test_x ...": only those), busted
#              --tags=gpu, then A/B arms in one call
#              (AB_CONFIGS="ENV=a;ENV=b ..."): bench_model and a recorded fit
#              per arm, and the kernel census of the default; logs packed
#              into $out/logs.tgz. AB_TESTS=0 skips the tests; AB_BUSTED
#              (busted arguments, e.g. --filter=lanes) runs those gpu specs
#              (AB_BUSTED_TIMEOUT seconds, default 240)
#              AB_EXTRA="cmd": one more command after the tests (its log
#              extra.log, last lines shown; at most 200 s, within the
#              device call's own limit)
#              AB_KTRACE=1: also a CUPTI kernel timeline of one recorded fit
#              of the first arm (tools/ktrace.c, tools/ktrace_report.py);
#              AB_KTRACE=all: one traced fit per arm, in the arms' order
#              (logs/kt_<arm>/), and a table of their CUPTI replay spans
#              (median of the last 40 replays: steadier than one fit's
#              steady step, which moved by up to 0.2 ms in session 13)
#   testab     as ab, with make test-gpu (timed, one command) instead of the
#              separate test programs; both also run bench_bnsilu, and with
#              AB_LAB1X1=1 conv_lab on both 1x1 routes (tools/lab1x1.py)
#   final      fit_pairs (5 pairs + the recorded-clip pair) into docs/BENCH.md,
#              bench_model against PyTorch, the scaling screen with
#              FINAL_SCREEN=1, one recorded fit per FINAL_AB setting
#              ("ENV=a;ENV=b"), then make test-gpu with the time left of
#              FINAL_S (460) seconds (FINAL_S=0: no tests)
#   check      the CUDA C tests, every gpu-tagged busted spec, conv_lab
#              (lucid vs cuDNN NCHW), bench_model and the default fit (both
#              routes); logs packed into $out/logs.tgz
# Logs go to $OUT (or build/gpu-logs when OUT is unset).
set -uo pipefail
what=${1:-test}
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
source .runtime/env.sh
export LUCID_DATASETS=$PWD/.data
{
  echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1; nproc
  python3 -c 'import torch;print("torch", torch.__version__)' 2>/dev/null
} 2>&1 | tee "$out/env.log"
make -j"$(nproc)" all 2>&1 | tail -5 | tee "$out/build.log" || { echo BUILD FAILED; exit 1; }
# cuda_tests LOGDIR [EXTRA_SRC...]: builds and runs the CUDA C test programs
# (and the host emulation of the conv kernels, and any extra test sources),
# then every gpu-tagged busted spec; one summary line each
cuda_tests() {
  local l=$1; shift
  local srcs=(spec/c/test_*cuda*.c spec/c/test_conv_igemm_maps.cu "$@")
  make -j"$(nproc)" $(printf '%s\n' "${srcs[@]}" | sed -E 's#spec/c/(.*)\.cu?$#build/tests/\1#') >/dev/null 2>&1
  for src in "${srcs[@]}"; do
    local t n r
    t=build/tests/$(basename "${src%.*}")
    [ -x "$t" ] || continue
    n=$(basename "$t"); timeout 150 "$t" > "$l/$n.log" 2>&1; r=$?
    echo "$n: rc $r, $(grep -c '^ok' "$l/$n.log") ok, $(grep -c '^not ok' "$l/$n.log") not ok"
    grep '^not ok' "$l/$n.log" | head -8
  done
  timeout 240 busted --lua=luajit -o TAP --tags=gpu > "$l/busted_gpu.log" 2>&1; r=$?
  echo "busted gpu: rc $r, $(grep -c '^ok' "$l/busted_gpu.log") ok, $(grep -c '^not ok' "$l/busted_gpu.log") not ok"
  grep -A6 '^not ok' "$l/busted_gpu.log" | head -30
}
# ktrace_fit LOGDIR "ENV=a ...": one recorded fit under the CUPTI kernel
# tracer (tools/ktrace.c, loaded through CUDA_INJECTION64_PATH), then
# tools/ktrace_report.py, ktrace_path.py, ktrace_gaps.py and ktrace_starts.py
# (late replay starts, idle stretches) over its timeline; the reports and the last 60,000
# records (gzipped) stay in LOGDIR
ktrace_fit() {
  local l=$1 cfg=$2 cu=/usr/local/cuda lib
  lib=$(dirname "$(ls $cu/lib64/libcupti.so $cu/extras/CUPTI/lib64/libcupti.so $cu/lib/libcupti.so \
        2>/dev/null | head -1)")
  if ! gcc -std=c11 -O2 -shared -fPIC tools/ktrace.c -o build/ktrace.so -I$cu/include \
       -I$cu/extras/CUPTI/include -L"$lib" -Wl,-rpath,"$lib" -lcupti -L$cu/lib64/stubs -lcuda \
       > "$l/ktrace_build.log" 2>&1; then
    echo "ktrace: build failed"; tail -3 "$l/ktrace_build.log"; return
  fi
  env $cfg CUDA_INJECTION64_PATH=$PWD/build/ktrace.so KTRACE_OUT=$l/ktrace.csv \
    KTRACE_GRAPH=$l/ktrace_graph.csv timeout 150 luajit bench/fit_once.lua record=true > "$l/ktrace_fit.log" 2>&1
  echo "ktrace fit ($cfg): rc $?, $(wc -l < "$l/ktrace.csv") records, $(tail -1 "$l/ktrace_fit.log" |
    python3 -c 'import json,sys
try: d=json.loads(sys.stdin.read()); print("step %.3f ms" % d["steady_step_ms"])
except Exception as e: print("no result", e)')"
  python3 tools/ktrace_report.py "$l/ktrace.csv" --last 40 --top 30 > "$l/ktrace_report.txt"
  head -3 "$l/ktrace_report.txt"
  # the critical path through the graph's real edges, with measured durations
  python3 tools/ktrace_path.py "$l/ktrace.csv" "$l/ktrace_graph.csv" replays=40 top=40 \
    | tee "$l/ktrace_path.txt" | head -"${KTRACE_LINES:-70}"
  # the measured path with its gaps (waits for SMs, launch intervals)
  python3 tools/ktrace_gaps.py "$l/ktrace.csv" "$l/ktrace_graph.csv" replays=40 \
    regions=${KTRACE_REGIONS:-100,150,215,260} all=1 > "$l/ktrace_gaps.txt" 2>&1
  sed -n 2,8p "$l/ktrace_gaps.txt"
  # replay by replay: late starts after the input kernel, idle stretches inside
  python3 tools/ktrace_starts.py "$l/ktrace.csv" > "$l/ktrace_starts.txt" 2>&1
  head -4 "$l/ktrace_starts.txt"
  { head -1 "$l/ktrace.csv"; tail -60000 "$l/ktrace.csv"; } | gzip > "$l/ktrace_tail.csv.gz"
  rm -f "$l/ktrace.csv"
}
rc=0
if [ "$what" = test ] || [ "$what" = all ]; then
  timeout "${TEST_TIMEOUT:-420}" make -j"$(nproc)" test-gpu > "$out/test.log" 2>&1; rc=$?
  tar czf "$out/test-logs.tgz" build/test-logs 2>/dev/null
  grep -E '^(c/|busted|skipped|[0-9]+ passed)' "$out/test.log"
  grep -E '^    ' "$out/test.log" | head -40
fi
if [ "$what" = reference ] || [ "$what" = all ]; then
  # PyTorch references (spec/reference/): the network (fp32, GPU route of
  # lucid vs torch on the GPU) and the loss (CPU reference vs torch)
  for m in yolo11 yolov8; do
    d=build/ref_$m
    luajit spec/reference/lucid_dump.lua $d $m 2 128 cuda > "$out/ref_$m.log" 2>&1 &&
    python3 spec/reference/yolo11_pose_ref.py --model $m --device cuda --weights $d/weights.safetensors \
      --io $d/io.safetensors --out $d/ref.safetensors --compare $d/lucid.safetensors >> "$out/ref_$m.log" 2>&1
    echo "reference $m: exit $? ($(grep -c . "$out/ref_$m.log") lines)"; tail -3 "$out/ref_$m.log"
  done
  mkdir -p build/loss_ref
  LUCID_LOSS_DUMP=build/loss_ref build/tests/test_loss_ref > "$out/loss_ref.log" 2>&1 &&
  python3 spec/reference/pose_loss_ref.py build/loss_ref >> "$out/loss_ref.log" 2>&1
  echo "reference loss: exit $?"; tail -3 "$out/loss_ref.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  make bench > "$out/bench.log" 2>&1 || rc=1
  tail -40 "$out/bench.log"
fi
if [ "$what" = lab ]; then
  bash bench/conv_lab/build.sh > "$out/conv_lab_build.log" 2>&1 && build/conv_lab/conv_lab > "$out/conv_lab.log" 2>&1 || rc=1
  cp -f conv_lab.csv "$out/" 2>/dev/null
  tail -30 "$out/conv_lab.log"
  LUCID_PROFILE=1 luajit bench/bench_warmup.lua > "$out/warmup.log" 2>&1 || rc=1
  tail -15 "$out/warmup.log"
  luajit bench/profile_layers.lua > "$out/profile_layers.log" 2>&1 || rc=1
  tail -60 "$out/profile_layers.log"
fi
if [ "$what" = fit ]; then
  export LUCID_PROGRESS=plain
  for r in false true; do
    LUCID_PROFILE=1 timeout 280 luajit recipes/pose_nano.lua name=fit_rec_$r exist_ok=true record=$r > "$out/fit_$r.log" 2>&1 || rc=1
    grep -E 'epoch [0-9]+/|time by phase|recorded step|final|lucid profile|rror' "$out/fit_$r.log" | tail -16
  done
fi
if [ "$what" = check ]; then
  l=$out/logs; mkdir -p "$l"
  cuda_tests "$l" spec/c/test_input.c
  bash bench/conv_lab/build.sh > "$l/conv_lab_build.log" 2>&1 &&
    timeout 100 build/conv_lab/conv_lab bench/conv_lab/shapes.txt routes=lucid,dnnNCHW csv="$l/conv_lab.csv" > "$l/conv_lab.log" 2>&1
  tail -24 "$l/conv_lab.log"
  timeout 100 luajit bench/bench_model.lua > "$l/bench_model.log" 2>&1; tail -2 "$l/bench_model.log"
  export LUCID_PROGRESS=plain
  for r in false true; do
    timeout 100 luajit recipes/pose_nano.lua name=fit_rec_$r exist_ok=true record=$r > "$l/fit_$r.log" 2>&1 || rc=1
    grep -E 'epoch (1|10)/|time by phase|recorded step|final|rror' "$l/fit_$r.log" | tail -6
  done
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$l"
fi
if [ "$what" = verify ]; then
  l=$out/logs; mkdir -p "$l"
  t0=$(date +%s)
  timeout "${TEST_TIMEOUT:-420}" make -j"$(nproc)" test-gpu > "$l/test.log" 2>&1; rc=$?
  echo "make test-gpu: rc $rc, $(( $(date +%s) - t0 )) s"
  tar czf "$l/test-logs.tgz" build/test-logs 2>/dev/null
  grep -E '^(c/|busted|skipped|[0-9]+ passed)' "$l/test.log"
  grep -E '^    (not ok|busted exited)' "$l/test.log" | head -30
  flags=$(make -s print-link-flags); mkdir -p build/bench
  gcc -O2 -std=c11 -D_GNU_SOURCE -Iengine bench/bench_optim.c build/libengine.a $flags -o build/bench/bench_optim &&
    { timeout 60 build/bench/bench_optim > "$l/bench_optim.log" 2>&1;
      LUCID_OPTIM_PDL=0 timeout 60 build/bench/bench_optim > "$l/bench_optim_nopdl.log" 2>&1; }
  grep -E '  cuda ' "$l/bench_optim.log" | cut -c1-120; echo "-- LUCID_OPTIM_PDL=0"; grep -E '  cuda ' "$l/bench_optim_nopdl.log" | cut -c1-120
  timeout 90 luajit bench/bench_bnsilu.lua > "$l/bench_bnsilu.log" 2>&1; tail -3 "$l/bench_bnsilu.log"
  timeout 90 luajit bench/bench_model.lua > "$l/bench_model.log" 2>&1; tail -1 "$l/bench_model.log"
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$l"
fi
if [ "$what" = ab ] || [ "$what" = testab ]; then
  l=$out/logs; mkdir -p "$l"
  if [ "$what" = testab ]; then
    t0=$(date +%s)
    timeout "${TEST_TIMEOUT:-400}" make -j"$(nproc)" test-gpu > "$l/test.log" 2>&1; rc=$?
    echo "make test-gpu: rc $rc, $(( $(date +%s) - t0 )) s"
    tar czf "$l/test-logs.tgz" build/test-logs 2>/dev/null
    grep -E '^(c/|busted|skipped|[0-9]+ passed)' "$l/test.log"
    grep -E '^    (not ok|busted exited)' "$l/test.log" | head -30
  elif [ "${AB_TESTS:-1}" = 1 ]; then # AB_TESTS=0: no tests; AB_BUSTED="--filter=x": those specs only
    cuda_tests "$l"
  fi
  if [ -n "${AB_CTESTS:-}" ]; then # AB_CTESTS="test_x test_y": those C test programs only
    for n in $AB_CTESTS; do
      make -j"$(nproc)" "build/tests/$n" > /dev/null 2>&1 || echo "$n: build failed"
      [ -x "build/tests/$n" ] || continue
      timeout 150 "build/tests/$n" > "$l/$n.log" 2>&1; r=$?
      echo "$n: rc $r, $(grep -c '^ok' "$l/$n.log") ok, $(grep -c '^not ok' "$l/$n.log") not ok, $(grep -c '^skip' "$l/$n.log") skip"
      grep -E '^(not ok|skip)' "$l/$n.log" | head -8
    done
  fi
  if [ -n "${AB_BUSTED:-}" ]; then
    timeout "${AB_BUSTED_TIMEOUT:-240}" busted --lua=luajit -o TAP --tags=gpu $AB_BUSTED > "$l/busted_sel.log" 2>&1
    echo "busted $AB_BUSTED: rc $?, $(grep -c '^ok' "$l/busted_sel.log") ok, $(grep -c '^not ok' "$l/busted_sel.log") not ok"
    grep -A8 '^not ok' "$l/busted_sel.log" | head -30
  fi
  if [ -n "${AB_EXTRA:-}" ]; then # AB_EXTRA="cmd": one more command (a benchmark), its last lines shown
    timeout 200 bash -c "$AB_EXTRA" > "$l/extra.log" 2>&1; echo "extra: rc $?"; tail -4 "$l/extra.log"
  fi
  export LUCID_PROGRESS=plain
  # AB_CONFIGS: ';'-separated environment settings, one A/B arm each
  IFS=';' read -r -a cfgs <<< "${AB_CONFIGS:-LUCID_PDL=1;LUCID_PDL=0;LUCID_PDL=graph}"
  arm=0
  for cfg in "${cfgs[@]}"; do
    arm=$((arm + 1))
    tag=$(echo "$cfg" | tr ' =' '_-')_$arm # repeated configs keep each fit's log
    # AB_MODEL=0: no bench_model per arm (the recorded fit only)
    if [ "${AB_MODEL:-1}" = 1 ]; then env $cfg timeout 100 luajit bench/bench_model.lua > "$l/model_$tag.log" 2>&1; fi
    # the first arm also lists its graph's critical path (joined with the census below)
    gs=1; [ -z "${first_tag:-}" ] && { gs=path; first_tag=$tag; }
    env $cfg LUCID_GRAPH_STATS=$gs timeout 100 luajit bench/fit_once.lua record=true > "$l/fit_$tag.log" 2>&1
    grep '^lucid graph:' "$l/fit_$tag.log" | sort | uniq -c | sort -rn | head -3
    echo "$cfg: $(tail -1 "$l/model_$tag.log" 2>/dev/null | cut -c1-80) | fit $(tail -1 "$l/fit_$tag.log" | python3 tools/fit_line.py)"
  done
  timeout 90 luajit bench/bench_bnsilu.lua > "$l/bench_bnsilu.log" 2>&1; tail -3 "$l/bench_bnsilu.log"
  if [ -n "${AB_LAB1X1:-}" ]; then
    # the 1x1 convs' passes on both 1x1 routes (conv_lab, isolated calls)
    bash bench/conv_lab/build.sh > "$l/conv_lab_build.log" 2>&1 || echo "conv_lab build failed"
    for r in gemm igemm; do
      LUCID_CONV1X1=$r timeout 120 build/conv_lab/conv_lab bench/conv_lab/shapes.txt routes=lucid \
        csv="$l/lab_$r.csv" > "$l/lab_$r.log" 2>&1 || echo "conv_lab $r: rc $?"
    done
    python3 tools/lab1x1.py "$l/lab_gemm.csv" "$l/lab_igemm.csv"
  fi
  if [ "${AB_KTRACE:-0}" = 1 ]; then # a CUPTI kernel timeline of one recorded fit (tools/ktrace.c)
    ktrace_fit "$l" "${cfgs[0]}"
  elif [ "${AB_KTRACE:-0}" = all ]; then # one per arm, then their replay spans side by side
    spans=()
    for cfg in "${cfgs[@]}"; do
      tag=$(echo "$cfg" | tr ' =' '_-'); k=$l/kt_$tag; n=2
      while [ -e "$k" ]; do k=$l/kt_${tag}_$n; n=$((n + 1)); done # a repeated arm keeps both
      mkdir -p "$k"
      ktrace_fit "$k" "$cfg" > "$k/summary.txt" 2>&1
      spans+=("$cfg: $(grep -m1 '^replay span' "$k/ktrace_report.txt" 2>/dev/null || echo 'no trace')")
    done
    echo "replay spans (CUPTI, one traced fit per arm):"; printf '  %s\n' "${spans[@]}"
  fi
  if [ "${AB_CENSUS:-1}" = 1 ]; then # AB_CENSUS=0: no census
    OUT=$l tools/kernel-census.sh model > /dev/null 2>&1
    python3 tools/kernel_census.py "$l/census_model.csv" --top 25 --path "$l/fit_$first_tag.log" |
      head -60
  fi
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$l"
fi
if [ "$what" = final ]; then
  # the closing measurement in one call: the complete-fit table (5 pairs)
  # and the recorded-clip pair into docs/BENCH.md, the network fwd+bwd
  # against PyTorch, with FINAL_SCREEN=1 the scaling screen, then make
  # test-gpu with what is left of FINAL_S seconds (FINAL_S=0: no tests).
  # docs/BENCH.md is copied to $OUT after each table, so a call cut short
  # still brings back what was measured.
  l=$out/logs; mkdir -p "$l"; t0=$(date +%s)
  luajit bench/fit_pairs.lua pairs=5 budget_s=${FIT_BUDGET:-100} write=docs/BENCH.md > "$l/fit_pairs.log" 2>&1 || rc=1
  cp docs/BENCH.md "$out/BENCH.md"
  luajit bench/fit_pairs.lua pairs=1 budget_s=0 armA="record=true" \
    armB="record=true clip.capture_gradient_norm=true" write=docs/BENCH.md > "$l/fit_clip.log" 2>&1 || rc=1
  cp docs/BENCH.md "$out/BENCH.md"
  grep -E '^\| (A|B) ' "$l/fit_pairs.log" "$l/fit_clip.log" | cut -c1-260; grep -h 'Hashes' "$l/fit_pairs.log" "$l/fit_clip.log" | cut -c1-120
  timeout 60 luajit bench/bench_model.lua > "$l/bench_model.log" 2>&1; tail -1 "$l/bench_model.log"
  timeout 90 python3 bench/bench_model_torch.py > "$l/bench_torch.log" 2>&1; tail -4 "$l/bench_torch.log"
  if [ -n "${FINAL_SCREEN:-}" ]; then
    luajit bench/fit_pairs.lua screen=true budget_s=${SCREEN_BUDGET:-150} write=docs/BENCH.md > "$l/fit_screen.log" 2>&1 || rc=1
    cp docs/BENCH.md "$out/BENCH.md"
    grep -E '^\| (batch|image)' "$l/fit_screen.log" | cut -c1-200
  fi
  # FINAL_AB="ENV=a;ENV=b": one recorded fit per setting (after the tables,
  # before the tests), against the default fits of the table above
  if [ -n "${FINAL_AB:-}" ]; then
    IFS=';' read -r -a cfgs <<< "$FINAL_AB"
    for cfg in "${cfgs[@]}"; do
      tag=$(echo "$cfg" | tr ' =' '_-')
      env $cfg LUCID_PROGRESS=plain timeout 100 luajit bench/fit_once.lua record=true > "$l/fit_$tag.log" 2>&1
      echo "$cfg: fit $(tail -1 "$l/fit_$tag.log" | python3 tools/fit_line.py)"
    done
  fi
  left=$(( ${FINAL_S:-460} - ($(date +%s) - t0) ))
  if [ "${FINAL_S:-460}" != 0 ]; then
    echo "make test-gpu with ${left} s left"
    timeout "$left" make -j"$(nproc)" test-gpu > "$l/test.log" 2>&1; r=$?
    echo "make test-gpu: rc $r, $(( $(date +%s) - t0 )) s since start"
    grep -E '^(c/|busted|skipped|[0-9]+ passed)' "$l/test.log" | grep -v ' 0 failed' ; tail -1 "$l/test.log"
    grep -E '^    (not ok|busted exited)' "$l/test.log" | head -20
  fi
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$l"
fi
if [ "$what" = quick ]; then
  make -j"$(nproc)" build/tests/test_conv_igemm_maps >/dev/null 2>&1
  for t in build/tests/test_conv_igemm_maps build/tests/test_nn_cuda build/tests/test_conv_dw_cuda \
           build/tests/test_optim_cuda build/tests/test_input build/tests/test_optim; do
    [ -x "$t" ] || continue
    n=$(basename "$t"); timeout 120 "$t" > "$out/$n.log" 2>&1; r=$?
    echo "$n: rc $r, $(grep -c '^ok' "$out/$n.log") ok, $(grep -c '^not ok' "$out/$n.log") not ok"
    grep '^not ok' "$out/$n.log" | head -8
  done
  flags=$(make -s print-link-flags); mkdir -p build/bench
  for n in bench_nn_cuda bench_optim bench_loader; do
    gcc -O2 -std=c11 -D_GNU_SOURCE -Iengine bench/$n.c build/libengine.a $flags -o build/bench/$n &&
      timeout 120 build/bench/$n > "$out/$n.log" 2>&1 || rc=1
  done
  grep -E 'cuda|threads 4' "$out/bench_optim.log" "$out/bench_loader.log" | cut -c1-150
  tail -30 "$out/bench_nn_cuda.log"
  timeout 120 luajit bench/bench_model.lua > "$out/bench_model.log" 2>&1; tail -4 "$out/bench_model.log"
  timeout 150 luajit bench/profile_layers.lua > "$out/profile_layers.log" 2>&1; tail -32 "$out/profile_layers.log"
  export LUCID_PROGRESS=plain
  for r in false true; do
    LUCID_PROFILE=1 timeout 170 luajit recipes/pose_nano.lua name=fit_rec_$r exist_ok=true record=$r > "$out/fit_$r.log" 2>&1 || rc=1
    grep -E 'epoch [0-9]+/|time by phase|recorded step|final|lucid profile|rror' "$out/fit_$r.log" | tail -14
  done
fi
exit $rc
