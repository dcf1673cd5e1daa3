#!/usr/bin/env bash
# GPU soak (issue 17) on the GPU host, from a bundle made by scripts/bundle.sh (which packs gdn-soak):
# gdn-soak --backend cuda, i.e. the qwen3-next geometry (HK 16, HV 32, K = V = 128), 3 layers, 32 slots,
# max_batch 8, max_tokens 8, graphs captured at creation, the cache, fold and ring strategies in turn
# (a third of the steps each), random admit / retire / decode / verify / commit / padding / forks /
# slot reuse, every output of the heads the model tracks checked against float64 each step, states at
# random points and at the end, host and device memory flat after warm-up (tests/soak.c says how).
#
#   scripts/soak_gpu.sh [BUNDLE_DIR] [OUT_DIR] [STEPS] [gdn-soak options...]
#       defaults: gpu-bundle, $OUT or soak-gpu-out, 100000 steps
#   scripts/soak_gpu.sh gpu-bundle "$OUT" 100000 --state bf16 --seed 2
#
#   GDN_SOAK_STATES   state dtypes to run, one run each (default "f32"; "f32 bf16" runs both)
#   GDN_SOAK_LIMIT    seconds each run may take (default 560: one 10-minute device call holds the f32
#                     run with room to spare; a run cut at the limit exits 124)
#
# Writes OUT_DIR/gpu.txt (the GPU), OUT_DIR/soak_gpu_<state>.log (gdn-soak's whole output) and prints
# each log's summary. Exit status: 0 when every run passed, else the first failing run's (1: a check
# failed or memory grew, 3: no usable GPU, 124: cut at the limit).
set -u
bundle=$(cd "${1:-gpu-bundle}" && pwd) || exit 2
out=${2:-${OUT:-soak-gpu-out}}
steps=${3:-100000}
[ $# -gt 3 ] && shift 3 || shift $#
[ -x "$bundle/gdn-soak" ] || { echo "soak_gpu.sh: no gdn-soak in $bundle (bundle a build with scripts/bundle.sh)" >&2; exit 2; }
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "(no nvidia-smi)"; } > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
echo "host: $(nproc) cores"
status=0
for state in ${GDN_SOAK_STATES:-f32}; do
    log="$out/soak_gpu_$state.log"
    start=$SECONDS
    timeout "${GDN_SOAK_LIMIT:-560}" "$bundle/gdn-soak" --backend cuda --steps "$steps" --state "$state" --quiet "$@" \
        > "$log" 2>&1
    rc=$?
    echo "exit $rc after $((SECONDS - start)) s" >> "$log"
    echo "== gdn-soak --backend cuda --steps $steps --state $state $*"
    cat "$log"
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
done
exit $status
