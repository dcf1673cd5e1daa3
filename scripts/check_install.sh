#!/usr/bin/env bash
# A test (meson test install_and_examples): installs the build into a scratch DESTDIR, then builds the
# examples exactly as a user of the installed library would, with `pkg-config gdn` and nothing from
# the source tree but the example files, and runs them (CPU backend when there is no GPU).
#   scripts/check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
DESTDIR="$scratch/root" meson install -C "$build" --quiet --no-rebuild > "$scratch/install.log" 2>&1 ||
    { cat "$scratch/install.log"; exit 1; }
pc=$(find "$scratch/root" -name gdn.pc | head -n1)
[ -n "$pc" ] || { echo "gdn.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
prefix="$scratch/root$(pkg-config --variable=prefix gdn)" # the installed prefix, under DESTDIR
flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs gdn)
libdir=$(pkg-config --define-variable=prefix="$prefix" --variable=libdir gdn)
for example in serving_loop op_layer model_loop; do
    cc -std=c11 -Wall -Wextra -Werror -o "$scratch/$example" "$src/examples/$example.c" $flags -lm
    LD_LIBRARY_PATH="$libdir" "$scratch/$example" > "$scratch/$example.log" 2>&1 ||
        { cat "$scratch/$example.log"; echo "$example failed"; exit 1; }
    tail -n1 "$scratch/$example.log"
done
