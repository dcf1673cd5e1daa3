#!/usr/bin/env bash
# A change beside its base on one GPU host, in one call (bench/results' rule for every comparison):
# the 36-layer engine step and the kernel sweeps, each cell run by the base, then by the new build,
# alternating, then compared by scripts/bench_compare.py.
#
#   scripts/bench_ab.sh BASE_DIR NEW_DIR [OUT_DIR]   (folders holding gdn-bench and the libraries it
#                                                     loads, e.g. two scripts/bundle.sh bundles;
#                                                     OUT_DIR defaults to $OUT or bench-ab-out)
#   AB_BUCKETS   engine buckets, in order ("1 2 4 8 1": bucket 1 twice)
#   AB_VERIFY    engine strategies ("fold cache"); AB_TOKENS engine tokens ("1,2,4"); AB_STATE ("bf16")
#   AB_SWEEP=0   skips the sweeps (fold: T 2, 3, 4, 8, B 1-64, both presets and states; cache and
#                ring: T 4), which run base, new, base, new, so that the two base runs give the spread
#
# Writes OUT_DIR/engine.txt (lines: variant strategy bucket T graph-us kernel-sum-us),
# OUT_DIR/compare.txt, and each run's full output; prints the comparison.
set -u
base=$(cd "${1:?BASE_DIR}" && pwd) || exit 2
new=$(cd "${2:?NEW_DIR}" && pwd) || exit 2
out=${3:-${OUT:-bench-ab-out}}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/raw"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

bench() { # variant args...: gdn-bench of that build
    local dir=$base; [ "$1" = new ] && dir=$new
    shift
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$dir/gdn-bench" "$@"
}

: > "$out/engine.txt"
n=0
for bucket in ${AB_BUCKETS:-1 2 4 8 1}; do
    for strategy in ${AB_VERIFY:-fold cache}; do
        for variant in base new; do
            n=$((n + 1))
            log="$out/raw/engine_${n}_${variant}_${strategy}_b$bucket.txt"
            bench "$variant" --engine --state "${AB_STATE:-bf16}" --layers 36 --bucket "$bucket" \
                --tokens "${AB_TOKENS:-1,2,4}" --verify "$strategy" > "$log" 2>&1 ||
                echo "engine run failed: $log" >&2
            # rows: bucket T | host us, p90, commit | graph us, direct us, kernel sum | ratio
            awk -v v="$variant" -v s="$strategy" '/^ +[0-9]+ +[0-9]+ \|/ {printf "%s %s b%s T%s %s %s\n", v, s, $1, $2, $8, $10}' \
                "$log" >> "$out/engine.txt"
        done
    done
done
python3 "$here/bench_compare.py" engine "$out/engine.txt" | tee "$out/compare.txt"

if [ "${AB_SWEEP:-1}" = 1 ]; then
    for round in 1 2; do
        for variant in base new; do
            bench "$variant" --strategies --slots 1024 --layers 8 --samples 8 --tokens 2,3,4,8 \
                --preset qwen3-next,qwen3.5 --batch 1,2,4,8,16,32,64 --strategy fold --state bf16,f32 \
                > "$out/raw/sweep_fold_${variant}$round.txt" 2>&1 || echo "fold sweep failed ($variant $round)" >&2
            bench "$variant" --strategies --slots 1024 --layers 8 --samples 8 --tokens 4 \
                --preset qwen3-next,qwen3.5 --batch 1,2,4,8,16,64 --strategy cache,ring --state bf16,f32 \
                > "$out/raw/sweep_cache_ring_${variant}$round.txt" 2>&1 || echo "cache,ring sweep failed ($variant $round)" >&2
        done
    done
    for sweep in fold cache_ring; do
        for pair in "base1 base2" "base1 new1" "base2 new2"; do
            set -- $pair
            echo "== $sweep sweep: $1 -> $2"
            python3 "$here/bench_compare.py" sweep "$out/raw/sweep_${sweep}_$1.txt" "$out/raw/sweep_${sweep}_$2.txt" 6
        done
    done | tee -a "$out/compare.txt"
fi
