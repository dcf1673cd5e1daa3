#!/usr/bin/env bash
# GPU-host runs of everything that needs a GPU, from a bundle made by scripts/bundle.sh: every test
# suite, compute-sanitizer memcheck, racecheck, initcheck and synccheck on the GPU suites (in
# parallel: the suites are mostly CPU-bound by the float64 reference), the serving-loop example
# with both strategies, the model-loop example on the CUDA backend, and the engine and strategies
# benches (alone, for clean timings). Logs go to OUT_DIR; a summary is printed.
#
#   scripts/gpu_verify.sh [BUNDLE_DIR] [OUT_DIR]     (defaults: gpu-bundle, $OUT or gpu-verify-out)
#   GDN_VERIFY_PART: all (default), or one of three parts that each fit a 10-minute call on a
#     16-core H100 host (all of it at once oversubscribes the host: about 3000 CPU-seconds of
#     sanitized suites per tool): `tests` (every suite, memcheck, the examples), `racecheck`
#     (racecheck, then the benches) and `checks` (initcheck and synccheck).
#   GDN_VERIFY_SANITIZE=0 skips the sanitizers; GDN_VERIFY_BENCH=0 skips the benches.
#   GDN_VERIFY_LIMIT (seconds, default 420) bounds the parallel phase (a suite cut short shows up as
#   such in its log and in the summary).
#   GDN_VERIFY_SANITIZE_SCALE (default 0.1): the share of their steps that the random scenarios run
#   under racecheck and initcheck (GDN_TEST_SCALE; every kernel instance still runs, at least 12
#   steps each; the plain suites, memcheck and synccheck run them whole), so that those pieces
#   finish inside one call.
#   GDN_VERIFY_PACK=1 replaces the logs by one OUT_DIR/logs.tar.gz (for remote runners that return
#   only a few files).
set -u
bundle=$(cd "${1:-gpu-bundle}" && pwd) || exit 2
out=${2:-${OUT:-gpu-verify-out}}
part=${GDN_VERIFY_PART:-all}
case "$part" in all | tests | racecheck | checks) ;; *) echo "GDN_VERIFY_PART: all, tests, racecheck or checks" >&2; exit 2 ;; esac
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
limit=${GDN_VERIFY_LIMIT:-420}

# One sanitizer process per (tool, suite, Criterion filter): the slow suites are split so that each
# piece takes at most ~370 s on the H100 host (the fold suite under racecheck: one test a process).
sanitize() { # tool suite label [filter]
    [ "${GDN_VERIFY_SANITIZE:-1}" = 1 ] || return 0
    local tool=$1 suite=$2 label=$3
    local log="$out/${tool}_${suite}${label:+_$label}.log"
    # A suite left out of the bundle (GDN_BUNDLE_SKIP, e.g. test_gpu_tp on a one-GPU host) is said so.
    [ -x "$bundle/$suite" ] || { echo "not in the bundle" > "$log"; echo "exit 0" >> "$log"; return 0; }
    local filter=(); [ -n "${4:-}" ] && filter=(--filter "$4")
    local opts=(--tool "$tool"); [ "$tool" = memcheck ] && opts+=(--leak-check no)
    local scale=1; case "$tool" in racecheck | initcheck) scale=${GDN_VERIFY_SANITIZE_SCALE:-0.1} ;; esac
    (GDN_TEST_SCALE=$scale timeout "$limit" compute-sanitizer "${opts[@]}" \
        "$bundle/$suite" -j1 --verbose "${filter[@]}" \
        > "$log" 2>&1; echo "exit $?" >> "$log") &
}
if want tests; then
    (timeout "$limit" "$bundle/run-tests.sh" -j4 --verbose > "$out/all_tests.log" 2>&1
     echo "run-tests exit $?" >> "$out/all_tests.log") &
    sanitize memcheck test_gpu_kernels qwen3_5 'gpu_kernels/qwen3_5*'
    sanitize memcheck test_gpu_kernels others '!(gpu_kernels/qwen3_5*)'
    # The forced-failure test makes a launch fail on purpose; the sanitizers would report that API
    # error, so it runs only in the plain suites.
    sanitize memcheck test_gpu_engine "" '!(gpu_engine/a_failed_launch*)'
    sanitize memcheck test_gpu_fold ""
    sanitize memcheck test_gpu_op ""
    sanitize memcheck test_gpu_mixer ""
    sanitize memcheck test_gpu_tree ""
    sanitize memcheck test_gpu_tp ""
fi
if want racecheck; then
    sanitize racecheck test_gpu_kernels qwen3_5 'gpu_kernels/qwen3_5*'
    sanitize racecheck test_gpu_kernels others '!(gpu_kernels/qwen3_5*)'
    sanitize racecheck test_gpu_engine "" '!(gpu_engine/a_failed_launch*)'
    for test in both_strategies sixteen_token large_batches ring_matches ring_sixteen ring_large ring_slots; do
        sanitize racecheck test_gpu_fold $test "gpu_fold/$test*"
    done
    sanitize racecheck test_gpu_fold ring_directed "gpu_fold/ring_[afnrw]*"
    sanitize racecheck test_gpu_fold ring_small_streamed "gpu_fold/ring_s[mt]*"
    sanitize racecheck test_gpu_op ""
    sanitize racecheck test_gpu_mixer ""
    sanitize racecheck test_gpu_tree ""
fi
if want checks; then # uninitialised device reads; barrier misuse
    for tool in initcheck synccheck; do
        sanitize $tool test_gpu_kernels "" ""
        sanitize $tool test_gpu_engine "" '!(gpu_engine/a_failed_launch*)'
        sanitize $tool test_gpu_fold "" ""
        sanitize $tool test_gpu_op "" ""
        sanitize $tool test_gpu_mixer "" ""
        sanitize $tool test_gpu_tree "" ""
    done
fi
wait
# A sanitizer cut at the limit can leave its target running on the GPU, which would skew the benches.
pkill -KILL -f "$bundle/test_" 2>/dev/null && { echo "killed leftover test processes"; sleep 2; }

if want tests; then
    echo "== tests"; grep -E "^(PASS|FAIL|SKIP) |run-tests exit" "$out/all_tests.log"
    echo "== fold scenarios (worst error as a share of the tolerance)"
    grep -E "T <= 16|B <= 64|RMS to float64" "$out/all_tests.log"
fi
for f in "$out"/memcheck_*.log "$out"/racecheck_*.log "$out"/initcheck_*.log "$out"/synccheck_*.log; do
    [ -f "$f" ] && grep -q "^not in the bundle" "$f" && { echo "== $(basename "$f"): not in the bundle"; continue; }
    [ -f "$f" ] && echo "== $(basename "$f"): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$f" | tail -1)," \
        "$(grep -c '^\[PASS\]' "$f") passed, $(grep -c '^\[FAIL\]' "$f") failed tests, $(tail -1 "$f") (124: cut at the limit)"
done
if want tests; then
    "$bundle/gdn-serving-loop" > "$out/example.log" 2>&1
    echo "== example (default: fold strategy, f32 state): $(tail -1 "$out/example.log")"
    "$bundle/gdn-serving-loop" --verify cache --state bf16 > "$out/example_cache.log" 2>&1
    echo "== example, cache strategy, bf16 state: $(tail -1 "$out/example_cache.log")"
    # The model loop on the CUDA backend (cuBLAS from the host's toolkit: its rpath, else CUDA_HOME);
    # exit 3 = the CUDA backend refused the mixer.
    for v in cache fold ring; do
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:${CUDA_HOME:-/usr/local/cuda}/lib64" "$bundle/gdn-model-loop" --backend cuda \
            --verify $v > "$out/model_loop_$v.log" 2>&1
        echo "== model-loop example, CUDA backend, $v strategy (exit $?; 3: mixer refused): $(tail -1 "$out/model_loop_$v.log")"
    done
fi
if want racecheck && [ "${GDN_VERIFY_BENCH:-1}" = 1 ]; then
    "$bundle/gdn-bench" --engine --state bf16 --max-batch 256 --tokens 1,2,4 --json "$out/engine_bf16.json" \
        > "$out/engine_bf16.txt" 2>&1
    "$bundle/gdn-bench" --engine --state bf16 --max-batch 256 --tokens 1,2,4 --verify cache \
        --json "$out/engine_bf16_cache.json" > "$out/engine_bf16_cache.txt" 2>&1
    "$bundle/gdn-bench" --engine --state bf16 --max-batch 256 --tokens 1,2,4 --verify ring --ring-length 16 \
        --json "$out/engine_bf16_ring.json" > "$out/engine_bf16_ring.txt" 2>&1
    # Cache, fold and the ring at L = 4, 8, 16, 32 (the L sweep), B = 64, both presets and dtypes.
    "$bundle/gdn-bench" --strategies --slots 1024 --batch 64 --layers 8 --ring-length 4,8,16,32 --samples 10 \
        --json "$out/strategies.json" > "$out/strategies.txt" 2>&1
    # Batch sizes beside 64: qwen3-next, ring L = 16.
    "$bundle/gdn-bench" --strategies --slots 1024 --batch 1,8,256 --layers 8 --preset qwen3-next --tokens 4 \
        --ring-length 16 --samples 10 --json "$out/strategies_batches.json" > "$out/strategies_batches.txt" 2>&1
    "$bundle/gdn-bench" --drift --json "$out/drift.json" > "$out/drift.txt" 2>&1
    echo "== engine bench (default strategy)"; grep -v capturing "$out/engine_bf16.txt"
    echo "== engine bench (cache strategy)";   grep -v capturing "$out/engine_bf16_cache.txt"
    echo "== engine bench (ring strategy, L = 16)"; grep -v capturing "$out/engine_bf16_ring.txt"
    summary() { grep -q '^# summary' "$1" && sed -n '/^# summary/,$p' "$1" || tail -20 "$1"; }
    echo "== strategies bench (B = 64)"; summary "$out/strategies.txt"
    echo "== strategies bench (B = 1, 8, 256)"; summary "$out/strategies_batches.txt"
    echo "== drift bench"; grep -v '^drift:' "$out/drift.txt"
fi
if [ "${GDN_VERIFY_PACK:-0}" = 1 ]; then
    (cd "$out" && tar czf logs.tar.gz --exclude logs.tar.gz ./* && find . -maxdepth 1 -type f ! -name logs.tar.gz -delete)
fi
