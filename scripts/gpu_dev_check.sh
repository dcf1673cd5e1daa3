#!/bin/sh
# Standalone build of the CUDA kernels, the float64 reference and gdn-bench with nvcc and gcc (no meson,
# no jemalloc: scripts/gpu_dev_shim.c stands in for the allocator). Usage:
#   scripts/gpu_dev_check.sh BUILD_DIR            build only
#   scripts/gpu_dev_check.sh BUILD_DIR ARGS...    build, then run gdn-bench ARGS...
set -eu
out=${1:-build-dev}; shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
arch=${GDN_CUDA_ARCH:--gencode=arch=compute_90a,code=sm_90a}
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
inc="-I$root/include -I$root -I$root/kernels"
for f in gdn_cuda_layer gdn_cuda_commit; do
  nvcc -std=c++17 --expt-relaxed-constexpr -O3 $arch -Xptxas -v $inc -c "$root/kernels/$f.cu" -o "$out/$f.o" 2> "$out/$f.ptxas.txt" || { cat "$out/$f.ptxas.txt"; exit 1; }
done
cflags="-std=c11 -O2 -Wall -Wextra -D_POSIX_C_SOURCE=200809L $inc -I$cuda_home/include"
gcc $cflags -c "$root/kernels/ref/gdn_ref.c" -o "$out/gdn_ref.o"
gcc $cflags -c "$root/scripts/gpu_dev_shim.c" -o "$out/shim.o"
gcc $cflags -c "$root/bench/gdn_bench.c" -o "$out/gdn_bench.o"
nvcc $arch -o "$out/gdn-bench" "$out/gdn_bench.o" "$out/gdn_cuda_layer.o" "$out/gdn_cuda_commit.o" "$out/gdn_ref.o" "$out/shim.o" -lm
if [ $# -gt 0 ]; then "$out/gdn-bench" "$@"; fi
