#!/usr/bin/env bash
# CPU soak (issue 17): builds gdn-soak in its own build directory (GDN_SOAK_BUILD_DIR, default
# build-soak; CPU only) and runs it: random admit / retire / decode / verify / commit / padding rows /
# forks / slot reuse against an independent float64 model, host memory watched for growth.
#
#   scripts/soak.sh [STEPS] [gdn-soak options...]    default 100000 steps, every strategy in turn
#   scripts/soak.sh 100000 --verify ring --state bf16 --seed 7
#
# 1e5 steps (cache, fold and ring, a third each) took 167 s of CPU (2.8 minutes) on one core of the
# 2-core machine this was written on (5.5 minutes of wall time while other builds loaded it); 3e4 steps
# take about 50 s. Exit status: gdn-soak's (0: every check passed and memory stayed flat).
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
