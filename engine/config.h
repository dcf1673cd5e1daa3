/* Internal configuration helpers (engine/config.c). */
#ifndef GDN_ENGINE_CONFIG_H
#define GDN_ENGINE_CONFIG_H

#include "gdn/gdn.h"

/* Writes the default bucket list for max_batch (1, 2, 4, 8, every 8 up to 256, every 16 after, the
 * last entry always max_batch, at most `capacity` entries) and returns its length. */
int32_t gdn__default_buckets(int32_t max_batch, int32_t *buckets, int32_t capacity);

/* Validates `config` and writes a copy with the defaults filled in (bucket list, scale). */
gdn_status gdn__config_resolve(const gdn_engine_config *config, gdn_engine_config *resolved);

/* The mixer (gdn_engine_config.mixer): whether any part is on, conv_dim
 * (2 HK K + HV V), and the conv pools' strides in elements (the caller's, or the engine's own dense
 * ones: slot (W - 1) conv_dim, token conv_dim, channel 1, layer num_slots slots). */
int gdn__config_mixer_on(const gdn_engine_config *c);
int64_t gdn__conv_dim(const gdn_model_config *m);
void gdn__conv_pool_strides(const gdn_engine_config *c, int64_t *slot, int64_t *token, int64_t *channel, int64_t *layer);
/* Tokens the CPU reference convolves per row at most (folded or replayed ones, then the step's own). */
int32_t gdn__mixer_scratch_tokens(const gdn_engine_config *c);

/* The ring strategy's write-through rule (gdn.h, ring_write_through): the most rows a decode step may
 * have for it to write its states back, or -1 (never), from the option (0: the default, rows x HV <=
 * GDN_RING_WRITE_THROUGH_HEADS_F32 or _BF16 by the state's dtype, or with the mixer's conv (`conv`
 * nonzero) every step: max_batch) and GDN_RING_WRITE_THROUGH=0 in the environment (never). */
int32_t gdn__ring_write_through_rows(int32_t option, int32_t num_v_heads, gdn_dtype state_dtype, int conv,
                                     int32_t max_batch);

/* The ring length for the option `ring_length` (0: the default, GDN_DEFAULT_RING_LENGTH, or
 * GDN_DEFAULT_DECODE_RING_LENGTH with max_tokens 1). */
static inline int32_t gdn__ring_length_or_default(int32_t ring_length, int32_t max_tokens)
{
    return ring_length ? ring_length : max_tokens > 1 ? GDN_DEFAULT_RING_LENGTH : GDN_DEFAULT_DECODE_RING_LENGTH;
}

/* A layer's workspace is at least this (one aligned block), so that gdn_op_workspace_bytes' 0 keeps
 * meaning an invalid description: a decode-only cache layer without the mixer's parts needs none. */
#define GDN__WORKSPACE_MIN_BYTES 256

/* The smallest bucket >= batch of a resolved configuration (batch <= max_batch). */
int32_t gdn__bucket_for(const gdn_engine_config *resolved, int32_t batch);

#endif /* GDN_ENGINE_CONFIG_H */
