#!/usr/bin/env bash
# Packs what the GPU machine lacks into ignored folders that a device run
# carries: .runtime/ (LuaJIT + busted via ../shared/tools/pack-lua-runtime,
# plus the headers and small libraries the build needs there: LuaJIT headers,
# libyaml, cJSON, OpenBLAS's cblas headers) and .data/ (the mini dataset).
# On the GPU machine: `source .runtime/env.sh`; the Makefile finds
# .runtime/include and .runtime/lib by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
rt=.runtime
../shared/tools/pack-lua-runtime "$rt"
mkdir -p "$rt/include" "$rt/lib"
cp -rL /usr/include/luajit-2.1 "$rt/include/"
cp -L /usr/include/yaml.h "$rt/include/"
cp -rL /usr/include/cjson "$rt/include/"
cp -L /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
      /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h "$rt/include/"
cp -L /usr/lib/x86_64-linux-gnu/libyaml-0.so.2 /usr/lib/x86_64-linux-gnu/libcjson.so.1 "$rt/lib/"
ln -sf libyaml-0.so.2 "$rt/lib/libyaml.so"
ln -sf libcjson.so.1 "$rt/lib/libcjson.so"
ln -sf libluajit-5.1.so.2 "$rt/lib/libluajit-5.1.so"
rm -rf .data && mkdir -p .data && cp -r ../shared/datasets/coco-pose-mini .data/
du -sh "$rt" .data
