/*
 * Every host allocation of the library goes through these, and they go to jemalloc (the one module
 * that owns it: engine/alloc.c). Using jemalloc's own entry points, not malloc, keeps that true even
 * when the host program links another malloc, and lets tests read jemalloc's counters to prove the
 * step path allocates nothing.
 *
 * Sanitizer builds (meson -Db_sanitize=address...: the compiler defines __SANITIZE_ADDRESS__, or
 * clang's __has_feature(address_sanitizer)) route them to malloc / calloc / free instead: jemalloc's
 * mallocx hands out memory from its own arenas, which AddressSanitizer neither poisons nor tracks, so
 * overflows and leaks of the library's host buffers would go unseen. -DGDN_ALLOC_SYSTEM=1 or =0
 * forces one or the other.
 */
#ifndef GDN_ENGINE_ALLOC_H
#define GDN_ENGINE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* NULL for a zero size or when memory is exhausted. */
void *gdn__malloc(size_t bytes);
/* Zero-filled; NULL when count * size overflows or memory is exhausted. */
void *gdn__calloc(size_t count, size_t size);
/* NULL is a no-op. Only for pointers from gdn__malloc / gdn__calloc. */
void gdn__free(void *ptr);

/* Bytes this thread has allocated so far (jemalloc's thread.allocated: every jemalloc allocation of
 * the thread, malloc included when jemalloc is the program's malloc; in a sanitizer build, every
 * allocation of the thread as the sanitizer's allocator hooks see them), or 0 when the counter is
 * unavailable. Tests difference two readings. */
uint64_t gdn__thread_allocated_bytes(void);

/* Successful gdn__malloc / gdn__calloc calls since the process started (all threads). */
uint64_t gdn__allocation_count(void);

/* ---- test hooks (fault injection, issue 17.4) ---- */

/* Arms a one-shot failure: n >= 0 lets the next n allocations through gdn__malloc / gdn__calloc
 * succeed and makes the one after them return NULL (then the hook disarms itself); n < 0 disarms it.
 * Zero-size and overflowing requests (NULL anyway) do not count. Process-wide. */
void gdn__alloc_fail_after(int64_t n);

/* Allocations from gdn__malloc / gdn__calloc not yet given to gdn__free (all threads). */
int64_t gdn__allocation_live(void);

#ifdef __cplusplus
}
#endif

#endif /* GDN_ENGINE_ALLOC_H */
