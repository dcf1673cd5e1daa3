/*
 * Every host allocation of the library goes through these, and they go to jemalloc (the one module
 * that owns it: engine/alloc.c). Using jemalloc's own entry points, not malloc, keeps that true even
 * when the host program links another malloc, and lets tests read jemalloc's counters to prove the
 * step path allocates nothing.
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

/* Bytes this thread has allocated through jemalloc so far (jemalloc's thread.allocated), or 0 when
 * the counter is unavailable. Tests difference two readings. */
uint64_t gdn__thread_allocated_bytes(void);

/* Successful gdn__malloc / gdn__calloc calls since the process started (all threads). */
uint64_t gdn__allocation_count(void);

#ifdef __cplusplus
}
#endif

#endif /* GDN_ENGINE_ALLOC_H */
