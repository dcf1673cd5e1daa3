/* The library's only use of jemalloc (or, in a sanitizer build, of malloc): see alloc.h. */
#include "alloc.h"

#include <stdatomic.h>

/* Sanitizer builds: the system allocator, which AddressSanitizer intercepts (alloc.h). */
#if !defined(GDN_ALLOC_SYSTEM)
#if defined(__SANITIZE_ADDRESS__)
#define GDN_ALLOC_SYSTEM 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GDN_ALLOC_SYSTEM 1
#endif
#endif
#endif
#if !defined(GDN_ALLOC_SYSTEM)
#define GDN_ALLOC_SYSTEM 0
#endif

/* Under AddressSanitizer its allocator hooks stand in for jemalloc's thread.allocated counter. */
#define GDN_ALLOC_ASAN_HOOKS 0
#if GDN_ALLOC_SYSTEM && defined(__SANITIZE_ADDRESS__)
#undef GDN_ALLOC_ASAN_HOOKS
#define GDN_ALLOC_ASAN_HOOKS 1
#elif GDN_ALLOC_SYSTEM && defined(__has_feature)
#if __has_feature(address_sanitizer)
#undef GDN_ALLOC_ASAN_HOOKS
#define GDN_ALLOC_ASAN_HOOKS 1
#endif
#endif

#if GDN_ALLOC_SYSTEM
#include <stdlib.h>
#if GDN_ALLOC_ASAN_HOOKS
/* The sanitizer runtime's interface (sanitizer/allocator_interface.h, which GCC does not always
 * install): hooks run on every allocation and free of the process. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
#endif
#else
#include <jemalloc/jemalloc.h>
#endif

/* Successful allocations since start, for the tests that prove the step path allocates nothing. */
static atomic_uint_fast64_t allocation_count;
/* Allocations not yet freed (fault-injection tests: nothing leaks on a failed create). */
static atomic_int_fast64_t live_count;
/* Fault injection: allocations left before the one that fails; -1: disarmed. */
static atomic_int_fast64_t fail_countdown = -1;

/* The armed failure, counted down once per allocation attempt: nonzero when this one must fail. */
static int injected_failure(void)
{
    int_fast64_t n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    while (n >= 0)
        if (atomic_compare_exchange_weak_explicit(&fail_countdown, &n, n - 1, memory_order_relaxed, memory_order_relaxed))
            return n == 0; /* 0 -> -1: this one fails, and the hook is disarmed */
    return 0;
}

static void *counted(void *ptr)
{
    if (ptr) {
        atomic_fetch_add_explicit(&allocation_count, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&live_count, 1, memory_order_relaxed);
    }
    return ptr;
}

#if GDN_ALLOC_SYSTEM
/* Bytes allocated by this thread (initial-exec: the hook may run inside any malloc, and must not
 * reach __tls_get_addr, which may itself allocate). */
static _Thread_local uint64_t thread_bytes __attribute__((tls_model("initial-exec")));
#if GDN_ALLOC_ASAN_HOOKS
/* Every allocation of the thread, as jemalloc's thread.allocated counts every jemalloc allocation. */
static void count_allocation(const volatile void *ptr, size_t bytes)
{
    (void)ptr;
    thread_bytes += bytes;
}
static void ignore_free(const volatile void *ptr) { (void)ptr; }
__attribute__((constructor)) static void install_allocation_hook(void)
{
    __sanitizer_install_malloc_and_free_hooks(count_allocation, ignore_free); /* both: NULL is refused */
}
#define COUNT_OWN_BYTES(bytes) ((void)0)
#else
#define COUNT_OWN_BYTES(bytes) (thread_bytes += (bytes))
#endif
#endif

void *gdn__malloc(size_t bytes)
{
    if (bytes == 0 || injected_failure()) return NULL;
#if GDN_ALLOC_SYSTEM
    void *ptr = malloc(bytes);
    if (ptr) COUNT_OWN_BYTES(bytes);
    return counted(ptr);
#else
    return counted(mallocx(bytes, 0));
#endif
}

void *gdn__calloc(size_t count, size_t size)
{
    if (count == 0 || size == 0 || count > SIZE_MAX / size || injected_failure()) return NULL;
#if GDN_ALLOC_SYSTEM
    void *ptr = calloc(count, size);
    if (ptr) COUNT_OWN_BYTES(count * size);
    return counted(ptr);
#else
    return counted(mallocx(count * size, MALLOCX_ZERO));
#endif
}

void gdn__free(void *ptr)
{
    if (!ptr) return;
    atomic_fetch_sub_explicit(&live_count, 1, memory_order_relaxed);
#if GDN_ALLOC_SYSTEM
    free(ptr);
#else
    dallocx(ptr, 0);
#endif
}

uint64_t gdn__thread_allocated_bytes(void)
{
#if GDN_ALLOC_SYSTEM
    return thread_bytes;
#else
    uint64_t allocated = 0;
    size_t len = sizeof allocated;
    if (mallctl("thread.allocated", &allocated, &len, NULL, 0) != 0) return 0;
    return allocated;
#endif
}

uint64_t gdn__allocation_count(void) { return atomic_load_explicit(&allocation_count, memory_order_relaxed); }

void gdn__alloc_fail_after(int64_t n) { atomic_store_explicit(&fail_countdown, n < 0 ? -1 : n, memory_order_relaxed); }

int64_t gdn__allocation_live(void) { return atomic_load_explicit(&live_count, memory_order_relaxed); }
