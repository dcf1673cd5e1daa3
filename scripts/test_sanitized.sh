#!/usr/bin/env bash
# The sanitizer run (issue 17, what CI runs after ./scripts/test.sh): a CPU-only AddressSanitizer +
# UndefinedBehaviorSanitizer build of the library, the tests and the examples, then every CPU
# Criterion suite of tests/meson.build and the serving-loop example (default options, --verify cache
# and --tree) under the sanitizers. Exits nonzero on any test failure and on any sanitizer report.
# 3-5 minutes on 2 cores, build included (fold and ring about a minute each).
#
#   GDN_ASAN_BUILD_DIR   build directory (default build-asan; configured on first use)
#   GDN_DETECT_LEAKS=0   turn LeakSanitizer off (it needs ptrace-like access some sandboxes refuse)
#
# What the sanitizers see: in this build engine/alloc.c routes the library's host allocations to
# malloc / free (jemalloc's mallocx would bypass ASan: alloc.h), so ASan checks every host buffer of
# the library and LSan finds what it leaks.
set -uo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1
build=${GDN_ASAN_BUILD_DIR:-build-asan}
start=$SECONDS

if [ ! -f "$build/build.ninja" ]; then
    # b_lundef=false: a sanitized shared library leaves the sanitizer runtime's symbols to the program.
    # debugoptimized: -O2 -g, so that reports carry file:line.
    meson setup "$build" -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false \
        -Dbuildtype=debugoptimized -Dc_args=-fno-omit-frame-pointer \
        -Dtests=enabled -Dexamples=true -Dbench=false || exit 1
fi
ninja -C "$build" || exit 1
echo "sanitizer build: $((SECONDS - start)) s"

# Every ASan / LSan report goes to a file under $reports (log_path) as well as failing its process:
# Criterion runs each test in a worker process and ignores a worker's exit status once the test has
# passed, so a LeakSanitizer report at a worker's exit would otherwise go unnoticed. UBSan, linked
# into the ASan runtime here, keeps writing to stderr: each command's output is searched for reports
# too.
#   ASan: detect_leaks (LSan at every process exit); allocator_may_return_null=1 makes an impossible
#     request (test_config asks create for the largest configuration that passes validation, some
#     2^63 bytes) return NULL as malloc does, instead of aborting: the library handles NULL. ASan
#     still logs "WARNING: AddressSanitizer failed to allocate 0x... bytes" for each: not a report.
#   UBSan: halt_on_error (the first report ends the process), print_stacktrace.
# No suppressions are needed: Criterion's own code is not instrumented, and neither its runner nor
# its workers leave a leak report of their own; jemalloc is still linked (the build's dependency)
# but nothing allocates from it, and ASan's malloc comes first.
reports=$(mktemp -d "${TMPDIR:-/tmp}/gdn-sanitizer-reports.XXXXXX")
trap 'rm -rf "$reports"' EXIT
export ASAN_OPTIONS="detect_leaks=${GDN_DETECT_LEAKS:-1}:allocator_may_return_null=1:detect_stack_use_after_return=1:strict_init_order=1:log_path=$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"

expected_warning='^==[0-9]*==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]* bytes$'
failed=()
# Runs one command (name, then the command); a failure or any new sanitizer report fails it.
run() {
    local name=$1
    shift
    local t0=$SECONDS
    timeout 1800 "$@" 2>&1 | tee "$reports/output"
    local rc=${PIPESTATUS[0]}
    if grep -qE 'runtime error:|ERROR: (Address|Leak)Sanitizer|SUMMARY: UndefinedBehaviorSanitizer' "$reports/output"; then
        echo "---- $name: sanitizer report(s) above"
        [ "$rc" -eq 0 ] && rc=1
    fi
    local found=("$reports"/asan.* "$reports"/ubsan.*) reported=() f
    for f in "${found[@]}"; do # a file of nothing but the expected NULL-return warnings is no report
        grep -qv "$expected_warning" "$f" && reported+=("$f")
    done
    if [ ${#reported[@]} -ne 0 ]; then
        echo "---- $name: sanitizer report(s):"
        cat "${reported[@]}"
        [ "$rc" -eq 0 ] && rc=1
    fi
    [ ${#found[@]} -eq 0 ] || rm -f "${found[@]}"
    if [ "$rc" -ne 0 ]; then
        failed+=("$name")
        echo "---- $name: FAIL (exit $rc, $((SECONDS - t0)) s)"
    else
        echo "---- $name: ok ($((SECONDS - t0)) s)"
    fi
}

# The Criterion suites: every test of the build that runs a tests/test_* executable, but the GPU
# suites (they only skip here); Criterion's own -j spreads each suite over the cores.
suites=$(meson introspect --tests "$build" | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    exe = t["cmd"][0]
    if "/tests/test_" in exe and not t["name"].startswith("gpu_"):
        print(exe)') || exit 1
[ -n "$suites" ] || { echo "no test suites in $build"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
for exe in $suites; do
    run "$(basename "$exe")" "$exe" --verbose=0 -j"$jobs"
done
run "gdn-serving-loop" "$build/examples/gdn-serving-loop"
run "gdn-serving-loop --verify cache" "$build/examples/gdn-serving-loop" --verify cache
run "gdn-serving-loop --tree" "$build/examples/gdn-serving-loop" --tree

echo "sanitizer run: $((SECONDS - start)) s"
if [ ${#failed[@]} -ne 0 ]; then
    printf 'FAILED under the sanitizers:'
    printf ' [%s]' "${failed[@]}"
    echo
    exit 1
fi
echo "sanitizers: every CPU suite and the serving-loop example clean"
