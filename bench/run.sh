#!/usr/bin/env bash
# make bench: builds and runs every benchmark program under bench/ that
# applies to this machine, printing each one's table. GPU benchmarks need
# a CUDA build and a device; CPU ones always run.
set -uo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
flags=$(make -s print-link-flags)
mkdir -p build/bench
rc=0
for src in bench/bench_*.c; do
  name=$(basename "$src" .c)
  case "$name" in *cuda*) make -s print-cuda | grep -q 1 || { echo "skip $name: CPU-only build"; continue; } ;; esac
  if ! $CC -O2 -std=c11 -D_GNU_SOURCE -Iengine $src build/libengine.a $flags -o build/bench/$name 2> build/bench/$name.build.log; then
    echo "FAILED to build $name:"; cat build/bench/$name.build.log; rc=1; continue
  fi
  echo "== $name"
  case "$name" in
    bench_nn_cpu) args="layers" ;;   # the whole-net CPU estimate takes minutes: run it by hand
    *) args="" ;;
  esac
  build/bench/$name $args || rc=1
done
# model-level benchmarks: lucid (Lua) and the PyTorch reference, same run
for lua in bench/bench_*.lua; do
  echo "== $(basename "$lua" .lua)"
  luajit "$lua" || rc=1
done
if python3 -c 'import torch' 2>/dev/null; then
  for py in bench/bench_*_torch.py; do
    echo "== $(basename "$py" .py)"
    python3 "$py" || rc=1
  done
else
  echo "skip PyTorch baselines: no torch on this machine"
fi
# the complete fit (issue 9): eager vs recorded in alternating fresh-process
# pairs, then the scaling screen and the recorded clip arm (issue 8), each
# under a time budget so that the whole of `make bench` fits in one
# 10-minute call on the GPU machine; the tables go into docs/BENCH.md.
# Skips itself without a CUDA device.
echo "== fit_pairs (eager vs recorded, 5 pairs)"
luajit bench/fit_pairs.lua pairs=5 budget_s=${FIT_BUDGET:-260} write=docs/BENCH.md || rc=1
echo "== fit_pairs (recorded vs recorded + capture_gradient_norm, 1 pair)"
luajit bench/fit_pairs.lua pairs=1 budget_s=0 armA="record=true" \
  armB="record=true clip.capture_gradient_norm=true" write=docs/BENCH.md || rc=1
echo "== fit_pairs (scaling screen)"
luajit bench/fit_pairs.lua screen=true budget_s=${SCREEN_BUDGET:-150} write=docs/BENCH.md || rc=1
exit $rc
