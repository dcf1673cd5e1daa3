/*
 * Stand-ins for the library's host allocator and gdn_dtype_size, for the standalone kernel build of
 * scripts/gpu_dev_check.sh (no jemalloc there). The meson build links the real ones.
 */
#include <stdlib.h>

#include "engine/alloc.h"
#include "gdn/gdn.h"

void *gdn__malloc(size_t bytes) { return bytes ? malloc(bytes) : NULL; }
void *gdn__calloc(size_t count, size_t size) { return calloc(count, size); }
void gdn__free(void *ptr) { free(ptr); }
uint64_t gdn__thread_allocated_bytes(void) { return 0; }
size_t gdn_dtype_size(gdn_dtype dtype) { return dtype == GDN_DTYPE_F32 ? 4 : (dtype == GDN_DTYPE_BF16 || dtype == GDN_DTYPE_F16) ? 2 : 0; }
