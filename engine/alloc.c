/* The library's only use of jemalloc: see alloc.h. */
#include "alloc.h"

#include <jemalloc/jemalloc.h>

void *gdn__malloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    return mallocx(bytes, 0);
}

void *gdn__calloc(size_t count, size_t size)
{
    if (count == 0 || size == 0 || count > SIZE_MAX / size) return NULL;
    return mallocx(count * size, MALLOCX_ZERO);
}

void gdn__free(void *ptr)
{
    if (ptr) dallocx(ptr, 0);
}

uint64_t gdn__thread_allocated_bytes(void)
{
    uint64_t allocated = 0;
    size_t len = sizeof allocated;
    if (mallctl("thread.allocated", &allocated, &len, NULL, 0) != 0) return 0;
    return allocated;
}
