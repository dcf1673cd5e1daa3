/* The step-graph table: see graph_cache.h. */
#include "graph_cache.h"

#include <string.h>

#include "engine/alloc.h"

gdn__graph_key gdn__graph_key_make(int32_t kind, int32_t tokens, int32_t bucket, int32_t variant)
{
    gdn__graph_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.tokens = tokens;
    key.bucket = bucket;
    key.variant = variant;
    return key;
}

/* Entries per bucket: the decode step, then every (variant, T) verify step, then their commits. */
static int32_t columns(const gdn__graph_cache *cache) { return 1 + 2 * GDN__GRAPH_VARIANTS * cache->max_tokens; }

gdn_status gdn__graph_cache_init(gdn__graph_cache *cache, int32_t num_buckets, int32_t max_tokens)
{
    memset(cache, 0, sizeof *cache);
    cache->num_buckets = num_buckets;
    cache->max_tokens = max_tokens;
    cache->entries = gdn__calloc((size_t)num_buckets * (size_t)columns(cache), sizeof *cache->entries);
    if (!cache->entries) {
        memset(cache, 0, sizeof *cache);
        return GDN_ENOMEM;
    }
    return GDN_OK;
}

void gdn__graph_cache_release(gdn__graph_cache *cache)
{
    gdn__free(cache->entries);
    memset(cache, 0, sizeof *cache);
}

int32_t gdn__graph_cache_size(const gdn__graph_cache *cache) { return cache->num_buckets * columns(cache); }

gdn__graph_entry *gdn__graph_cache_entry_at(gdn__graph_cache *cache, int32_t i) { return &cache->entries[i]; }

gdn__graph_entry *gdn__graph_cache_slot(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    if (!cache->entries || bucket_index < 0 || bucket_index >= cache->num_buckets) return NULL;
    gdn__graph_entry *row = &cache->entries[bucket_index * columns(cache)];
    if (key->kind == GDN_STEP_DECODE) return key->tokens == 1 && key->variant == 0 ? row : NULL;
    if (key->kind != GDN_STEP_VERIFY && key->kind != GDN__GRAPH_COMMIT) return NULL;
    if (key->tokens < 1 || key->tokens > cache->max_tokens) return NULL;
    if (key->variant < 0 || key->variant >= GDN__GRAPH_VARIANTS) return NULL;
    const int32_t commits = key->kind == GDN__GRAPH_COMMIT ? GDN__GRAPH_VARIANTS * cache->max_tokens : 0;
    return &row[1 + commits + key->variant * cache->max_tokens + key->tokens - 1];
}

gdn__graph_entry *gdn__graph_cache_find(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    gdn__graph_entry *entry = gdn__graph_cache_slot(cache, key, bucket_index);
    if (!entry || !entry->exec || memcmp(&entry->key, key, sizeof *key) != 0) return NULL;
    return entry;
}

/* Captures `key` into its entry, which holds the key and handle only once the capture succeeded. */
static gdn_status capture_into(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index,
                               gdn__graph_capture_fn capture, void *ctx)
{
    gdn__graph_entry *entry = gdn__graph_cache_slot(cache, key, bucket_index);
    if (!entry) return GDN_EINVAL;
    gdn__graph_entry captured;
    memset(&captured, 0, sizeof captured);
    gdn_status status = capture(ctx, key, &captured);
    if (status != GDN_OK) return status;
    captured.key = *key;
    *entry = captured;
    return GDN_OK;
}

gdn_status gdn__graph_cache_get(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index,
                                gdn__graph_capture_fn capture, void *ctx, gdn__graph_entry **out)
{
    gdn__graph_entry *entry = gdn__graph_cache_find(cache, key, bucket_index);
    if (!entry) {
        gdn_status status = capture_into(cache, key, bucket_index, capture, ctx);
        if (status != GDN_OK) return status;
        entry = gdn__graph_cache_find(cache, key, bucket_index);
    }
    *out = entry;
    return GDN_OK;
}

gdn_status gdn__graph_cache_capture_all(gdn__graph_cache *cache, const int32_t *buckets, gdn__graph_capture_fn capture,
                                        void *ctx, void (*progress)(void *user, int32_t done, int32_t total),
                                        void *progress_user)
{
    const int32_t plain = cache->max_tokens > 1 ? 1 + 2 * cache->max_tokens : 1; /* max_tokens 1: decodes only */
    const int32_t total = cache->num_buckets * plain;
    int32_t done = 0;
    for (int32_t bi = 0; bi < cache->num_buckets; bi++) {
        for (int32_t column = 0; column < plain; column++) {
            const int32_t kind = column == 0 ? GDN_STEP_DECODE : (column <= cache->max_tokens ? GDN_STEP_VERIFY : GDN__GRAPH_COMMIT);
            const int32_t tokens = column == 0 ? 1 : (column <= cache->max_tokens ? column : column - cache->max_tokens);
            const gdn__graph_key key = gdn__graph_key_make(kind, tokens, buckets[bi], 0);
            gdn_status status = capture_into(cache, &key, bi, capture, ctx);
            if (status != GDN_OK) return status;
            if (progress) progress(progress_user, ++done, total);
        }
    }
    return GDN_OK;
}
