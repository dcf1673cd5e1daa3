/* The step-graph table: see graph_cache.h. */
#include "graph_cache.h"

#include <string.h>

#include "engine/alloc.h"

gdn__graph_key gdn__graph_key_make(gdn_step_kind kind, int32_t tokens, int32_t bucket)
{
    gdn__graph_key key;
    memset(&key, 0, sizeof key);
    key.kind = (int32_t)kind;
    key.tokens = tokens;
    key.bucket = bucket;
    return key;
}

gdn_status gdn__graph_cache_init(gdn__graph_cache *cache, int32_t num_buckets, int32_t max_tokens)
{
    memset(cache, 0, sizeof *cache);
    cache->entries = gdn__calloc((size_t)num_buckets * (size_t)(1 + max_tokens), sizeof *cache->entries);
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

int32_t gdn__graph_cache_size(const gdn__graph_cache *cache) { return cache->num_buckets * (1 + cache->max_tokens); }

gdn__graph_entry *gdn__graph_cache_entry_at(gdn__graph_cache *cache, int32_t i) { return &cache->entries[i]; }

gdn__graph_entry *gdn__graph_cache_slot(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    if (!cache->entries || bucket_index < 0 || bucket_index >= cache->num_buckets) return NULL;
    const int32_t column = key->kind == GDN_STEP_DECODE ? 0 : key->tokens;
    if (column < 0 || column > cache->max_tokens || (key->kind == GDN_STEP_VERIFY && column == 0)) return NULL;
    return &cache->entries[bucket_index * (1 + cache->max_tokens) + column];
}

gdn__graph_entry *gdn__graph_cache_find(gdn__graph_cache *cache, const gdn__graph_key *key, int32_t bucket_index)
{
    gdn__graph_entry *entry = gdn__graph_cache_slot(cache, key, bucket_index);
    if (!entry || !entry->exec || memcmp(&entry->key, key, sizeof *key) != 0) return NULL;
    return entry;
}
