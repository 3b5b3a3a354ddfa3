#!/usr/bin/env bash
# Runs on the GPU machine (device tool) after a build: per-kernel GPU time of
# (1) the network's eager forward+backward (bench/bench_model.lua, batch 4,
# 640, bf16) and (2) a slice of eager training steps of the main job (loss,
# optimizer, EMA and input copy included), under Nsight Compute with one
# metric (gpu__time_duration.sum), clocks and caches left alone. CSVs go to
# $OUT (or build/census); tools/kernel_census.py summarises them.
#   tools/kernel-census.sh [model|fit|all]
set -uo pipefail
what=${1:-all}
out=${OUT:-build/census}
mkdir -p "$out"
NCU=(ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw
  --print-units base)
if [ "$what" = model ] || [ "$what" = all ]; then
  "${NCU[@]}" luajit bench/bench_model.lua warmup=1 iters=2 > "$out/census_model.csv" 2> "$out/census_model.err"
  echo "census model: exit $?, $(grep -c '^"' "$out/census_model.csv") rows"
fi
if [ "$what" = fit ] || [ "$what" = all ]; then
  # kernels 20000.. are inside epoch 1's training steps (about 1.5k kernels per step)
  LUCID_PROGRESS=plain "${NCU[@]}" --launch-skip 20000 --launch-count 4000 \
    luajit recipes/pose_nano.lua epochs=1 record=false name=census exist_ok=true \
    > "$out/census_fit.csv" 2> "$out/census_fit.err"
  echo "census fit: exit $?, $(grep -c '^"' "$out/census_fit.csv") rows"
fi
