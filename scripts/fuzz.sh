#!/usr/bin/env bash
# Coverage-guided fuzzing of the host API (issue 17) with libFuzzer, ASan and UBSan, on the CPU backend.
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer options...]     fuzz for SECONDS (default 60)
#   scripts/fuzz.sh replay FILE...                        run the given inputs once each (a crash, a seed)
#
# Builds the library with clang-14 (-fsanitize=address,undefined plus fuzzer coverage) in its own
# meson build directory (GDN_FUZZ_BUILD_DIR, default build-fuzz; CUDA, tests, examples and bench off),
# then links tests/fuzz_api.c + tests/fuzz_driver.c with -fsanitize=fuzzer. The seeds in
# tests/fuzz_corpus/ are read only; new inputs go to $GDN_FUZZ_BUILD_DIR/corpus, crashes to
# $GDN_FUZZ_BUILD_DIR/artifacts/. Exits nonzero when an input crashes, leaks, hangs or fails a check
# (the driver's message is printed before the abort).
#
# jemalloc: the library is built with -DGDN_ALLOC_SYSTEM=1 (engine/alloc.h; also its default under
# ASan), so its host allocations go to malloc / free and ASan sees overflows and leaks of them.
# GDN_FUZZ_JOBS=N runs N fuzzing processes (libFuzzer -fork=N). GDN_FUZZ_KEEP_GOING=1 does not stop at
# the first crash (-fork with -ignore_crashes): every crashing input of the whole run is kept, and the
# script still exits nonzero if there was any. GDN_FUZZ_STRICT=1 also fails on the library bugs that are
# already known (tests/fuzz_driver.c; by default the model steps around them). CC defaults to clang-14.
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

binary="$build/gdn-fuzz-api"
# shellcheck disable=SC2086
"$cc" -std=c11 -D_POSIX_C_SOURCE=200809L -g -O2 $coverage_flags $sanitize_flags -Wall -Wextra \
    -I include -I . -c tests/fuzz_driver.c -o "$build/fuzz_driver.o"
# shellcheck disable=SC2086
"$cc" -std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fsanitize=fuzzer $sanitize_flags -Wall -Wextra \
    -I include -I . tests/fuzz_api.c "$build/fuzz_driver.o" "$build/libgdn.a" -lm -o "$binary"

# A smaller quarantine than the default 256 MB: every input frees its engine's pools, and fresh pages
# for each new engine cost more than the checks (use-after-free is still caught within 64 MB).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:quarantine_size_mb=64}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "${1:-}" = replay ]; then
    shift
    exec "$binary" -runs=1 "$@"
fi

seconds=${1:-60}
[ $# -gt 0 ] && shift
mkdir -p "$build/corpus" "$build/artifacts"
jobs=()
if [ "${GDN_FUZZ_JOBS:-1}" -gt 1 ]; then jobs=(-fork="$GDN_FUZZ_JOBS"); fi
if [ "${GDN_FUZZ_KEEP_GOING:-0}" = 1 ]; then
    jobs=(-fork="${GDN_FUZZ_JOBS:-1}" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi
echo "fuzz.sh: $binary for ${seconds}s (seeds: tests/fuzz_corpus, corpus: $build/corpus)"
before=$(find "$build/artifacts" -type f | wc -l)
set +e
"$binary" "$build/corpus" tests/fuzz_corpus -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
    -max_len=512 -print_final_stats=1 -artifact_prefix="$build/artifacts/" "${jobs[@]}" "$@"
rc=$?
set -e
after=$(find "$build/artifacts" -type f | wc -l)
if [ $rc -eq 0 ] && [ "$after" -gt "$before" ]; then rc=1; fi
if [ $rc -ne 0 ]; then
    echo "fuzz.sh: FAILED (exit $rc); inputs in $build/artifacts/ -- replay with: scripts/fuzz.sh replay FILE" >&2
    echo "fuzz.sh: GDN_FUZZ_TRACE=1 scripts/fuzz.sh replay FILE prints every call" >&2
fi
exit $rc
