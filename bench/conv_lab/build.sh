#!/usr/bin/env bash
# bench/conv_lab/build.sh — build the conv kernel lab (bench/conv_lab/README.md).
#   bash bench/conv_lab/build.sh            -> build/conv_lab/conv_lab
# Finds nvcc and cuDNN the way the Makefile does: CUDA_HOME/include, /usr/include,
# or the nvidia/cudnn package of the Python environment. Knobs: NVCC, CUDA_HOME,
# CUDNN_HOME, ARCH (sm_90), OUTDIR (build/conv_lab), EXTRA_NVCCFLAGS (added to the
# engine files' compiles, e.g. -DLUCID_IGEMM_MINB=6 for an A/B build).
# The "lucid" route is the engine's own kernels: cuda/nn_conv_igemm.cu,
# cuda/nn_conv_dw.cu and cuda/nn_conv_gemm.cu (the 1x1 cuBLAS route, taken
# under LUCID_CONV1X1=gemm) are compiled from the working tree with the
# Makefile's nvcc flags (-O2 -lineinfo, -DLUCID_HAVE_CUDNN=1) and linked in;
# conv_lab.cu defines the engine helpers those files call, so neither
# build/libengine.a nor `make` is needed.
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
# four compiles in parallel (each fails the build on its own), then the link
nv=("$NVCC" -std=c++17 -arch="$ARCH" -lineinfo -I"$CUDNN_HOME/include" -I"$root/engine" -I"$root/cuda")
pids=()
for f in nn_conv_igemm nn_conv_dw nn_conv_gemm; do
  ( set -x; "${nv[@]}" -O2 -Xcompiler -Wall -DLUCID_HAVE_CUDNN=1 ${EXTRA_NVCCFLAGS:-} -c "$root/cuda/$f.cu" -o "$OUTDIR/$f.o" ) &
  pids+=($!)
done
( set -x; "${nv[@]}" -O3 -Xcompiler -Wall,-Wextra -Xptxas -warn-spills,-warn-lmem-usage \
    -c "$here/conv_lab.cu" -o "$OUTDIR/conv_lab.o" ) &
pids+=($!)
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "conv_lab build: compile failed" >&2; exit 1; }
set -x
"$NVCC" -arch="$ARCH" "$OUTDIR/conv_lab.o" "$OUTDIR/nn_conv_igemm.o" "$OUTDIR/nn_conv_dw.o" "$OUTDIR/nn_conv_gemm.o" \
  -o "$OUTDIR/conv_lab" \
  -L"$CUDA_HOME/lib64" -Xlinker -rpath="$CUDA_HOME/lib64" ${libdirs[@]+"${libdirs[@]}"} \
  "$cudnnlib" -lcublas
