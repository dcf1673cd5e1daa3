/* The library's only use of jemalloc: see alloc.h. */
#include "alloc.h"

#include <stdatomic.h>

#include <jemalloc/jemalloc.h>

/* Successful allocations since start, for the tests that prove the step path allocates nothing. */
static atomic_uint_fast64_t allocation_count;

void *gdn__malloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    void *ptr = mallocx(bytes, 0);
    if (ptr) atomic_fetch_add_explicit(&allocation_count, 1, memory_order_relaxed);
    return ptr;
}

void *gdn__calloc(size_t count, size_t size)
{
    if (count == 0 || size == 0 || count > SIZE_MAX / size) return NULL;
    void *ptr = mallocx(count * size, MALLOCX_ZERO);
    if (ptr) atomic_fetch_add_explicit(&allocation_count, 1, memory_order_relaxed);
    return ptr;
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

uint64_t gdn__allocation_count(void) { return atomic_load_explicit(&allocation_count, memory_order_relaxed); }
