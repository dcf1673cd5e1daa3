#!/usr/bin/env bash
# Packs the built tests, bench and examples, with every shared library they load, into one folder
# that runs on a GPU host that has the CUDA driver but neither Criterion nor jemalloc installed:
#
#   scripts/bundle.sh [BUILD_DIR] [OUT_DIR]      (defaults: build-gpu, gpu-bundle)
#   GDN_BUNDLE_GPU_ONLY=1 scripts/bundle.sh ...  (only the GPU suites, the bench, the examples and gdn-soak)
#   LD_LIBRARY_PATH=OUT_DIR OUT_DIR/test_gpu_kernels
#   OUT_DIR/run-tests.sh                          (runs every test binary, exit status = failures)
#
# System libraries that every Linux host has (libc, libm, libpthread, libdl, librt, the loader,
# libstdc++, libgcc_s) stay behind: copying them can break on a host with a different glibc. So do
# cuBLAS and cuBLASLt (gdn-model-loop's GEMMs; ~600 MB, far past what the archive may weigh): the GPU
# host has them with its CUDA toolkit, and gdn-model-loop finds them through its rpath to the build's
# toolkit lib64 (/usr/local/cuda/lib64), or LD_LIBRARY_PATH=OUT_DIR:/path/to/cuda/lib64 elsewhere.
set -euo pipefail
build=${1:-build-gpu}
out=${2:-gpu-bundle}
# The GPU machine's bundle must stay small (its copies are size-limited): configure the build folder
# for that machine's one target, e.g. meson setup build-gpu -Dcuda=enabled
# -Dgpu_arch=-gencode=arch=compute_90a,code=sm_90a (the default builds four targets).
[ -d "$build" ] || { echo "no build folder '$build' (meson setup $build -Dcuda=enabled -Dgpu_arch=-gencode=arch=compute_90a,code=sm_90a)" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"

binaries=()
for f in "$build"/tests/test_* "$build"/tests/gdn-soak "$build"/bench/gdn-bench "$build"/examples/gdn-serving-loop \
         "$build"/examples/gdn-model-loop; do
    # GDN_BUNDLE_GPU_ONLY=1: leave out the CPU-only suites (CI runs them), to keep the archive small.
    [ "${GDN_BUNDLE_GPU_ONLY:-0}" = 1 ] && [[ "$(basename "$f")" == test_* ]] && [[ "$(basename "$f")" != test_gpu_* ]] && continue
    # GDN_BUNDLE_SKIP='regex': leave out programs whose names match (each embeds every kernel, ~20 MB).
    [ -n "${GDN_BUNDLE_SKIP:-}" ] && [[ "$(basename "$f")" =~ ^(${GDN_BUNDLE_SKIP})$ ]] && continue
    [ -f "$f" ] && [ -x "$f" ] && binaries+=("$f")
done
[ ${#binaries[@]} -gt 0 ] || { echo "nothing built in $build" >&2; exit 2; }
cp "${binaries[@]}" "$out"/
cp -P "$build"/libgdn.so* "$out"/ 2>/dev/null || true

skip='^(libc|libm|libpthread|libdl|librt|ld-linux.*|libstdc\+\+|libgcc_s|linux-vdso|libcublas|libcublasLt)\.so'
for f in "${binaries[@]}"; do
    ldd "$f" | awk '/=> \//{print $1, $3}' | while read -r name path; do
        [[ "$name" =~ $skip ]] && continue
        [ -e "$out/$name" ] || cp -L "$path" "$out/$name"
    done
done

cat > "$out/run-tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary with the bundled libraries; prints one line per suite.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0
for t in "$here"/test_*; do
    "$t" "$@"; rc=$?
    case $rc in 0) echo "PASS $(basename "$t")";; 77) echo "SKIP $(basename "$t")";; *) echo "FAIL $(basename "$t") (exit $rc)"; failed=$((failed + 1));; esac
done
exit $failed
RUN
chmod +x "$out/run-tests.sh"
echo "bundled ${#binaries[@]} programs into $out ($(du -sh "$out" | cut -f1))"
# The device tool carries at most 64 MiB; every program links the same kernels' fat binaries, so the
# folder outgrows that. The archive is what travels (`tar xJf gpu-bundle.tar.xz` on the GPU host, a
# folder named as OUT_DIR's last part): one xz stream with a 64 MiB dictionary finds the kernels that
# the programs share (gzip's 32 KiB window and multi-threaded xz's separate blocks do not), about
# 8x smaller than gzip for the GPU-only bundle. Without xz: gzip, OUT_DIR.tar.gz.
rm -f "$out.tar.xz" "$out.tar.gz"
if command -v xz > /dev/null; then
    XZ_OPT="-9 -T1" tar cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")"
    archive=$out.tar.xz
else
    tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
    archive=$out.tar.gz
fi
echo "archive $archive ($(du -sh "$archive" | cut -f1))"
