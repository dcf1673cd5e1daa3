#!/usr/bin/env bash
# Coverage-guided fuzzing (issue 17) with libFuzzer, ASan and UBSan, on the CPU backend, of two targets:
#   api  the engine's host API (tests/fuzz_api.c + tests/fuzz_driver.c, seeds in tests/fuzz_corpus/)
#   op   the public op layer, gdn_op.h (tests/fuzz_op.c + tests/fuzz_op_driver.c, seeds in
#        tests/fuzz_corpus_op/)
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer options...]     fuzz for SECONDS in all (default 60), split
#                                                         evenly between the targets, api first
#   scripts/fuzz.sh replay FILE...                        run the given inputs once each (a crash, a
#                                                         seed); a file under a fuzz_corpus_op or
#                                                         corpus-op / artifacts-op folder goes to the op
#                                                         target, any other to the api target
#   GDN_FUZZ_TARGET=api|op|both (default both)            which targets fuzz (or replay, overriding the path rule)
#
# Builds the library with clang-14 (-fsanitize=address,undefined plus fuzzer coverage) in its own
# meson build directory (GDN_FUZZ_BUILD_DIR, default build-fuzz; CUDA, tests, examples and bench off),
# then links each harness and its driver with -fsanitize=fuzzer. The seed folders are read only; new
# inputs go to $GDN_FUZZ_BUILD_DIR/corpus (api) and corpus-op (op), crashes to artifacts/ and
# artifacts-op/. Exits nonzero when an input of either target crashes, leaks, hangs or fails a check
# (the driver's message is printed before the abort).
#
# jemalloc: the library is built with -DGDN_ALLOC_SYSTEM=1 (engine/alloc.h; also its default under
# ASan), so its host allocations go to malloc / free and ASan sees overflows and leaks of them.
# GDN_FUZZ_JOBS=N runs N fuzzing processes per target (libFuzzer -fork=N). GDN_FUZZ_KEEP_GOING=1 does not
# stop at the first crash (-fork with -ignore_crashes): every crashing input of the whole run is kept,
# and the script still exits nonzero if there was any. GDN_FUZZ_STRICT=1 also fails on the library bugs
# that are already known (tests/fuzz_driver.c, tests/fuzz_op_driver.c; by default the drivers step
# around them). CC defaults to clang-14.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GDN_FUZZ_BUILD_DIR:-build-fuzz}
cc=${CC:-$(command -v clang-14 || command -v clang || true)}
[ -n "$cc" ] || { echo "fuzz.sh: clang (14 or later, with libFuzzer) is required" >&2; exit 2; }

sanitize_flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Edge coverage everywhere; no comparison tracing (trace-cmp): in the float64 reference's and the
# model's inner loops it cost 4x the executions per second, and the inputs decode by arithmetic, not
# by magic values.
coverage_flags="-fsanitize=fuzzer-no-link -fno-sanitize-coverage=trace-cmp"
options=(-Dcuda=disabled -Dtests=disabled -Dexamples=false -Dbench=false -Dbuildtype=debugoptimized
         -Db_sanitize=address,undefined -Db_lundef=false
         "-Dc_args=$coverage_flags -DGDN_ALLOC_SYSTEM=1 -fno-sanitize-recover=undefined -fno-omit-frame-pointer")
if [ ! -f "$build/build.ninja" ]; then
    CC="$cc" meson setup "$build" "${options[@]}" >/dev/null
else
    meson configure "$build" "${options[@]}" >/dev/null
fi
ninja -C "$build" libgdn.a >/dev/null

# The harnesses: target name, harness, driver.
build_target() { # name harness driver
    local binary="$build/gdn-fuzz-$1" object="$build/${3##*/}.o"
    # shellcheck disable=SC2086
    "$cc" -std=c11 -D_POSIX_C_SOURCE=200809L -g -O2 $coverage_flags $sanitize_flags -Wall -Wextra \
        -I include -I . -c "$3" -o "$object"
    # shellcheck disable=SC2086
    "$cc" -std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fsanitize=fuzzer $sanitize_flags -Wall -Wextra \
        -I include -I . "$2" "$object" "$build/libgdn.a" -lm -o "$binary"
}
build_target api tests/fuzz_api.c tests/fuzz_driver.c
build_target op tests/fuzz_op.c tests/fuzz_op_driver.c

# A smaller quarantine than the default 256 MB: every input frees its engine's pools, and fresh pages
# for each new engine cost more than the checks (use-after-free is still caught within 64 MB).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:quarantine_size_mb=64}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

target=${GDN_FUZZ_TARGET:-both}
case "$target" in api | op | both) ;; *) echo "GDN_FUZZ_TARGET: api, op or both" >&2; exit 2 ;; esac

if [ "${1:-}" = replay ]; then
    shift
    rc=0
    for file in "$@"; do
        t=$target
        if [ "$t" = both ]; then
            case "$file" in *fuzz_corpus_op/* | *corpus-op/* | *artifacts-op/*) t=op ;; *) t=api ;; esac
        fi
        "$build/gdn-fuzz-$t" -runs=1 "$file" || rc=$?
    done
    exit $rc
fi

seconds=${1:-60}
[ $# -gt 0 ] && shift
jobs=()
if [ "${GDN_FUZZ_JOBS:-1}" -gt 1 ]; then jobs=(-fork="$GDN_FUZZ_JOBS"); fi
if [ "${GDN_FUZZ_KEEP_GOING:-0}" = 1 ]; then
    jobs=(-fork="${GDN_FUZZ_JOBS:-1}" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi
targets=(api op)
[ "$target" = both ] || targets=("$target")
share=$((seconds / ${#targets[@]}))
[ "$share" -ge 1 ] || share=1
status=0
for t in "${targets[@]}"; do
    suffix=""; seeds=tests/fuzz_corpus
    [ "$t" = op ] && suffix=-op && seeds=tests/fuzz_corpus_op
    corpus="$build/corpus$suffix" artifacts="$build/artifacts$suffix"
    mkdir -p "$corpus" "$artifacts"
    echo "fuzz.sh: $build/gdn-fuzz-$t for ${share}s (seeds: $seeds, corpus: $corpus)"
    before=$(find "$artifacts" -type f | wc -l)
    set +e
    "$build/gdn-fuzz-$t" "$corpus" "$seeds" -max_total_time="$share" -timeout=20 -rss_limit_mb=2048 \
        -max_len=512 -print_final_stats=1 -artifact_prefix="$artifacts/" "${jobs[@]}" "$@"
    rc=$?
    set -e
    after=$(find "$artifacts" -type f | wc -l)
    if [ $rc -eq 0 ] && [ "$after" -gt "$before" ]; then rc=1; fi
    if [ $rc -ne 0 ]; then
        echo "fuzz.sh: $t FAILED (exit $rc); inputs in $artifacts/ -- replay with: scripts/fuzz.sh replay FILE" >&2
        echo "fuzz.sh: GDN_FUZZ_TRACE=1 scripts/fuzz.sh replay FILE prints every call" >&2
        [ $status -eq 0 ] && status=$rc
    fi
done
exit $status
