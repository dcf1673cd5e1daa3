#!/usr/bin/env bash
# Builds the library and runs the Criterion suites (the README's test command, and what CI runs).
# GPU suites skip visibly (SKIP in the summary) on a machine without a GPU. The last line totals the
# Criterion tests of every suite.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${GDN_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dtests=enabled || exit 1
fi
meson test -C "$build" --print-errorlogs "$@"
rc=$?
log="$build/meson-logs/testlog.txt"
if [ -f "$log" ]; then
    awk '/Synthesis: Tested:/ { for (i = 1; i <= NF; i++) { if ($i == "Passing:") p += $(i+1); if ($i == "Failing:" || $i == "Crashing:") f += $(i+1) } }
         /Skipped: [0-9]+ GPU tests/ { for (i = 1; i <= NF; i++) if ($i == "Skipped:") s += $(i+1) }
         END { printf "criterion: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
fi
exit $rc
