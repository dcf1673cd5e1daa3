/*
 * CUDA-typed conveniences over gdn.h for callers that use the CUDA runtime: the same functions with
 * cudaStream_t instead of void *. Include after (or instead of) gdn.h in CUDA-aware code.
 */
#ifndef GDN_GDN_CUDA_H
#define GDN_GDN_CUDA_H

#include <cuda_runtime.h>

#include "gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline gdn_status gdn_cuda_begin_step(gdn_engine *engine, const gdn_step *step, cudaStream_t stream,
                                             int32_t *bucket)
{
    return gdn_engine_begin_step(engine, step, (void *)stream, bucket);
}

static inline gdn_status gdn_cuda_run_layer(gdn_engine *engine, int32_t layer, cudaStream_t stream)
{
    return gdn_engine_run_layer(engine, layer, (void *)stream);
}

static inline gdn_status gdn_cuda_run_step(gdn_engine *engine, cudaStream_t stream)
{
    return gdn_engine_run_step(engine, (void *)stream);
}

static inline gdn_status gdn_cuda_commit(gdn_engine *engine, cudaStream_t stream)
{
    return gdn_engine_commit(engine, (void *)stream);
}

static inline gdn_status gdn_cuda_slot_reset(gdn_engine *engine, int32_t slot, cudaStream_t stream)
{
    return gdn_slot_reset(engine, slot, (void *)stream);
}

#ifdef __cplusplus
}
#endif

#endif /* GDN_GDN_CUDA_H */
