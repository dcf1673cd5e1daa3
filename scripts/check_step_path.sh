#!/usr/bin/env bash
# Static check (a meson test): the step path has no hidden host synchronisation or allocation.
# - engine/ and graphs/ host code calls the CUDA runtime only in engine/backend_cuda.c and
#   graphs/graph_cuda.c;
# - in those two files, blocking or allocating calls (device/stream/event synchronize, plain
#   cudaMemcpy/cudaMemset, cudaMalloc/cudaFree and their host variants) appear only inside the
#   functions that are not on the step path: creation, destruction, allocation, explicit synchronize.
# Exit 0 when clean; otherwise prints each offending line and exits 1.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
status=0
for f in "$root"/engine/*.c "$root"/graphs/*.c; do
    case "$(basename "$f")" in backend_cuda.c|graph_cuda.c) continue ;; esac
    if grep -nE '\bcuda[A-Z][A-Za-z]*\s*\(|cuda_runtime\.h' "$f"; then
        echo "check_step_path: $f calls the CUDA runtime outside the CUDA backend" >&2
        status=1
    fi
done
allowed='^(cuda_alloc|cuda_alloc_here|cuda_free|cuda_free_here|cuda_synchronize|cuda_synchronize_here|cuda_destroy|gdn__backend_cuda_create|gdn__graph_capture_end|gdn__graph_destroy)$'
banned='cuda(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|Memset|Malloc|MallocHost|HostAlloc|Free|FreeHost)\s*\('
for f in "$root"/engine/backend_cuda.c "$root"/graphs/graph_cuda.c; do
    awk -v allowed="$allowed" -v banned="$banned" -v file="$f" '
        /^[A-Za-z_].*\(/ && !/;[[:space:]]*$/ { # a function definition line: remember its name
            line = $0; sub(/\(.*/, "", line); n = split(line, words, /[ \t*]+/); current = words[n] }
        $0 ~ banned && current !~ allowed { printf "%s:%d: in %s: %s\n", file, NR, current, $0; bad = 1 }
        END { exit bad }' "$f" || status=1
done
[ $status = 0 ] && echo "check_step_path: no blocking or allocating CUDA call on the step path"
exit $status
