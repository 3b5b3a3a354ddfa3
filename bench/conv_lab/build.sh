#!/usr/bin/env bash
# bench/conv_lab/build.sh — build the conv kernel lab (bench/conv_lab/README.md).
#   bash bench/conv_lab/build.sh            -> build/conv_lab/conv_lab
# Finds nvcc and cuDNN the way the Makefile does: CUDA_HOME/include, /usr/include,
# or the nvidia/cudnn package of the Python environment. Knobs: NVCC, CUDA_HOME,
# CUDNN_HOME, ARCH (sm_90), OUTDIR (build/conv_lab).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
[ -n "$NVCC" ] || { echo "conv_lab build: nvcc not found" >&2; exit 1; }
CUDA_HOME=${CUDA_HOME:-${NVCC%/bin/nvcc}}
if [ -z "${CUDNN_HOME:-}" ]; then
  if [ -f "$CUDA_HOME/include/cudnn.h" ]; then CUDNN_HOME=$CUDA_HOME
  elif [ -f /usr/include/cudnn.h ] || [ -f /usr/include/x86_64-linux-gnu/cudnn.h ]; then CUDNN_HOME=/usr
  else CUDNN_HOME=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null || true)
  fi
fi
[ -n "$CUDNN_HOME" ] || { echo "conv_lab build: cuDNN not found (set CUDNN_HOME)" >&2; exit 1; }
ARCH=${ARCH:-sm_90}
OUTDIR=${OUTDIR:-$root/build/conv_lab}
mkdir -p "$OUTDIR"
# cuDNN's libraries: lib or lib64 beside its include, or the multiarch dir for /usr
libdirs=()
for d in "$CUDNN_HOME/lib" "$CUDNN_HOME/lib64" "$CUDNN_HOME/lib/x86_64-linux-gnu"; do
  [ -d "$d" ] && [ "$d" != "$CUDA_HOME/lib64" ] && libdirs+=("-L$d" "-Xlinker" "-rpath=$d")
done
# pip's nvidia-cudnn ships libcudnn.so.9 without the unversioned link
cudnnlib=-lcudnn
for d in "$CUDNN_HOME/lib" "$CUDNN_HOME/lib64" "$CUDNN_HOME/lib/x86_64-linux-gnu"; do
  if [ -e "$d/libcudnn.so" ]; then cudnnlib=-lcudnn; break; fi
  if [ -e "$d/libcudnn.so.9" ]; then cudnnlib=-l:libcudnn.so.9; break; fi
done
set -x
"$NVCC" -std=c++17 -O3 -lineinfo -arch="$ARCH" -Xcompiler -Wall,-Wextra \
  -I"$CUDNN_HOME/include" "$here/conv_lab.cu" -o "$OUTDIR/conv_lab" \
  -L"$CUDA_HOME/lib64" -Xlinker -rpath="$CUDA_HOME/lib64" ${libdirs[@]+"${libdirs[@]}"} \
  "$cudnnlib" -lcublas -Xptxas -warn-spills,-warn-lmem-usage
