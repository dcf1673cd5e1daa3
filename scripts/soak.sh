#!/usr/bin/env bash
# CPU soak (issue 17): builds gdn-soak in its own build directory (GDN_SOAK_BUILD_DIR, default
# build-soak; CPU only) and runs it: random admit / retire / decode / verify / commit / padding rows /
# forks / slot reuse against an independent float64 model, host memory watched for growth. The GPU
# soak is the same program with --backend cuda, run on the GPU host by scripts/soak_gpu.sh.
#
#   scripts/soak.sh [STEPS] [gdn-soak options...]    default 100000 steps, every strategy in turn
#   scripts/soak.sh 100000 --verify ring --state bf16 --seed 7
#   scripts/soak.sh 3000 --preset qwen3-next --layers 3 --heads 2 --threads 2   (the GPU soak's sampled
#                                                    model, on the CPU backend: slow, for checking it)
#
# 1e5 steps (cache, fold and ring, a third each) take about 2.9 minutes (171 s) on one core of a
# 2-core machine (longer while other work loads it); 3e4 steps take about 49 s.
# Exit status: gdn-soak's (0: every check passed and memory stayed flat).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GDN_SOAK_BUILD_DIR:-build-soak}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dcuda=disabled -Dtests=enabled -Dexamples=false -Dbench=false >/dev/null
fi
ninja -C "$build" tests/gdn-soak >/dev/null
steps=${1:-100000}
[ $# -gt 0 ] && shift
exec "$build/tests/gdn-soak" --steps "$steps" "$@"
