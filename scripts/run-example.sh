#!/usr/bin/env bash
# Builds the library and runs the serving-loop example (the README's main command): on the GPU when
# there is one, otherwise on the CPU reference backend (the example says which).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GDN_BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build"
meson compile -C "$build" gdn-serving-loop
"$build/examples/gdn-serving-loop" "$@"
