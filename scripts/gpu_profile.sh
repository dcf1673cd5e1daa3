#!/usr/bin/env bash
# Nsight Compute profiles of the layer-step kernel's decode, cache-verify and fold instances, run
# inside `gdn-bench --strategies` (qwen3-next first), from a bundle made by scripts/bundle.sh:
#   scripts/gpu_profile.sh [BUNDLE_DIR] [OUT_DIR]
# One report per instance kind, with the sections that say what bounds a kernel (throughput, warp
# stalls, pipe use, occupancy). Instances are picked by their mangled template flags
# <..., ONE_TOKEN, FOLD>: Lb1ELb0E decode, Lb0ELb0E cache verify, Lb0ELb1E fold verify,
# Lb1ELb1E fold decode.
set -u
bundle=$(cd "${1:-gpu-bundle}" && pwd) || exit 2
out=${2:-${OUT:-gpu-profile-out}}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis"
for kind in Lb1ELb0EEv Lb0ELb0EEv Lb0ELb1EEv Lb1ELb1EEv; do
    ncu --kernel-name-base mangled --kernel-name "regex:$kind" --launch-skip 30 --launch-count 1 $sections \
        "$bundle/gdn-bench" --strategies --slots 256 --batch 64 --layers 2 > "$out/ncu_$kind.txt" 2>&1
    echo "== $kind: $(grep -E 'layer_step_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy' "$out/ncu_$kind.txt" | tr -s ' ' | head -8 | tr '\n' ';')"
done
