#!/usr/bin/env bash
# Builds the library and runs the Criterion suites (the README's test command, and what CI runs).
# GPU suites skip visibly (SKIP in the summary) on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GDN_BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" -Dtests=enabled
meson test -C "$build" --print-errorlogs "$@"
