/* Internal configuration helpers (engine/config.c). */
#ifndef GDN_ENGINE_CONFIG_H
#define GDN_ENGINE_CONFIG_H

#include "gdn/gdn.h"

/* Writes the default bucket list for max_batch (1, 2, 4, 8, every 8 up to 256, every 16 after, the
 * last entry always max_batch, at most `capacity` entries) and returns its length. */
int32_t gdn__default_buckets(int32_t max_batch, int32_t *buckets, int32_t capacity);

/* Validates `config` and writes a copy with the defaults filled in (bucket list, scale). */
gdn_status gdn__config_resolve(const gdn_engine_config *config, gdn_engine_config *resolved);

/* The smallest bucket >= batch of a resolved configuration (batch <= max_batch). */
int32_t gdn__bucket_for(const gdn_engine_config *resolved, int32_t batch);

#endif /* GDN_ENGINE_CONFIG_H */
