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
# the complete fit, eager vs recorded: one pair here (~2.5 min at today's
# fit times) to leave room for the rest; `make bench-fit` runs the table of
# docs/BENCH.md (bench/fit_pairs.lua). Skips itself without a CUDA device.
echo "== fit_pairs (one pair; make bench-fit for the full table)"
luajit bench/fit_pairs.lua pairs=1 || rc=1
if python3 -c 'import torch' 2>/dev/null; then
  for py in bench/bench_*_torch.py; do
    echo "== $(basename "$py" .py)"
    python3 "$py" || rc=1
  done
else
  echo "skip PyTorch baselines: no torch on this machine"
fi
exit $rc
