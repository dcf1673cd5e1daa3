/*
 * The table of instantiated step graphs: one entry per (step kind, T, bucket, variant), allocated whole at
 * engine creation so that lookups on the step path allocate nothing. Keys are whole structs, zeroed
 * before use and compared with memcmp, so a field added to the key can never be left out of the
 * comparison. Backend-neutral: the graph itself is an opaque handle of the backend.
 */
#ifndef GDN_GRAPHS_GRAPH_CACHE_H
#define GDN_GRAPHS_GRAPH_CACHE_H

#include "gdn/gdn.h"

/* What a graph holds: a step's work (gdn_step_kind values), or the commit of a verify step. */
#define GDN__GRAPH_COMMIT 2

/* A verify step's variant (gdn_step.token_counts, .parents): bits of these. Its layer and commit
 * launches carry the device arrays of the present ones, so each variant is its own graph; the
 * plain step (0) reads neither. Decode steps are always variant 0. */
#define GDN__VARIANT_COUNTS 1
#define GDN__VARIANT_PARENTS 2
#define GDN__GRAPH_VARIANTS 4

typedef struct gdn__graph_key {
    int32_t kind;    /* GDN_STEP_DECODE, GDN_STEP_VERIFY or GDN__GRAPH_COMMIT */
    int32_t tokens;  /* T */
    int32_t bucket;  /* padded rows */
    int32_t variant; /* GDN__VARIANT_* bits; 0 for decode */
} gdn__graph_key;

typedef struct gdn__graph_entry {
    gdn__graph_key key;
    void *exec;          /* backend graph handle; NULL while not captured */
    int includes_commit; /* the capture callback committed inside the graph */
} gdn__graph_entry;

typedef struct gdn__graph_cache {
    gdn__graph_entry *entries; /* [num_buckets][1 + 2 * VARIANTS * max_tokens]: decode at 0, verify
                                * (T, variant) at 1 + variant * max_tokens + T - 1, and its commit
                                * VARIANTS * max_tokens further */
    int32_t num_buckets;
    int32_t max_tokens;
} gdn__graph_cache;

/* A zeroed key of these fields. */
gdn__graph_key gdn__graph_key_make(int32_t kind, int32_t tokens, int32_t bucket, int32_t variant);

gdn_status gdn__graph_cache_init(gdn__graph_cache *cache, int32_t num_buckets, int32_t max_tokens);
/* Frees the table; the caller destroys the backend graphs first (gdn__graph_cache_entry_at). */
void gdn__graph_cache_release(gdn__graph_cache *cache);

/* Number of entries, and entry i (for iterating at creation and destruction). */
int32_t gdn__graph_cache_size(const gdn__graph_cache *cache);
gdn__graph_entry *gdn__graph_cache_entry_at(gdn__graph_cache *cache, int32_t i);

/* The entry that holds `key` (bucket_index: the bucket's position in the bucket list), or NULL for a
 * key outside the table. */
gdn__graph_entry *gdn__graph_cache_slot(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index);

/* The captured graph of `key`, or NULL when it has not been captured (or its entry holds another
 * key). */
gdn__graph_entry *gdn__graph_cache_find(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index);

/* Records and instantiates the graph of `key` into `entry` (the engine's work for that shape). */
typedef gdn_status (*gdn__graph_capture_fn)(void *ctx, const gdn__graph_key *key, gdn__graph_entry *entry);

/* The graph of `key`: found in the table, or captured into it first (lazy capture). GDN_EINVAL for
 * a key outside the table; the capture's status when it fails (the entry stays empty). */
gdn_status gdn__graph_cache_get(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index,
                                gdn__graph_capture_fn capture, void *ctx, gdn__graph_entry **out);

/* Captures the plain entries of the table (GDN_GRAPHS_AT_CREATE): for each bucket, the decode step,
 * the verify step of each T and the commit of each T, all of variant 0 (the variants with counts or
 * parents are captured on first use); progress (may be NULL) after each. */
gdn_status gdn__graph_cache_capture_all(gdn__graph_cache *cache, const int32_t *buckets, gdn__graph_capture_fn capture,
                                        void *ctx, void (*progress)(void *user, int32_t done, int32_t total),
                                        void *progress_user);

#endif /* GDN_GRAPHS_GRAPH_CACHE_H */
