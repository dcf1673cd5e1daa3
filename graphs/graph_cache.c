/* The step-graph table: see graph_cache.h. */
#include "graph_cache.h"

#include <string.h>

#include "engine/alloc.h"

gdn__graph_key gdn__graph_key_make(int32_t kind, int32_t tokens, int32_t bucket)
{
    gdn__graph_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.tokens = tokens;
    key.bucket = bucket;
    return key;
}

gdn_status gdn__graph_cache_init(gdn__graph_cache *cache, int32_t num_buckets, int32_t max_tokens)
{
    memset(cache, 0, sizeof *cache);
    cache->entries = gdn__calloc((size_t)num_buckets * (size_t)(1 + 2 * max_tokens), sizeof *cache->entries);
    if (!cache->entries) return GDN_ENOMEM;
    cache->num_buckets = num_buckets;
    cache->max_tokens = max_tokens;
    return GDN_OK;
}

void gdn__graph_cache_release(gdn__graph_cache *cache)
{
    gdn__free(cache->entries);
    memset(cache, 0, sizeof *cache);
}

int32_t gdn__graph_cache_size(const gdn__graph_cache *cache) { return cache->num_buckets * (1 + 2 * cache->max_tokens); }

gdn__graph_entry *gdn__graph_cache_entry_at(gdn__graph_cache *cache, int32_t i) { return &cache->entries[i]; }

gdn__graph_entry *gdn__graph_cache_slot(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    if (!cache->entries || bucket_index < 0 || bucket_index >= cache->num_buckets) return NULL;
    if (key->kind == GDN_STEP_DECODE) {
        if (key->tokens != 1) return NULL;
        return &cache->entries[bucket_index * (1 + 2 * cache->max_tokens)];
    }
    if (key->kind != GDN_STEP_VERIFY && key->kind != GDN__GRAPH_COMMIT) return NULL;
    if (key->tokens < 1 || key->tokens > cache->max_tokens) return NULL;
    const int32_t column = key->tokens + (key->kind == GDN__GRAPH_COMMIT ? cache->max_tokens : 0);
    return &cache->entries[bucket_index * (1 + 2 * cache->max_tokens) + column];
}

gdn__graph_entry *gdn__graph_cache_find(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    gdn__graph_entry *entry = gdn__graph_cache_slot(cache, key, bucket_index);
    if (!entry || !entry->exec || memcmp(&entry->key, key, sizeof *key) != 0) return NULL;
    return entry;
}
