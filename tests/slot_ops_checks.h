/*
 * Checks of the device-side slot operations (gdn_slot_copy_async, _import_async, _export_async)
 * shared by the CPU suite (test_engine.c) and the GPU suite (test_gpu_engine.c).
 */
#ifndef GDN_TESTS_SLOT_OPS_CHECKS_H
#define GDN_TESTS_SLOT_OPS_CHECKS_H

#include <stdint.h>

#include "gdn/gdn.h"

/* A 2-layer tiny engine whose slots 0..5 hold random states and, under fold and ring, pending
 * tokens or ring records (verify + commit, decode, verify + commit); 8 slots, all allocated. */
gdn_engine *slot_ops_engine_with_pending(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed);

/* copy, export and import against states read through the API (which write back first): bit-exact;
 * copies from and into slots freed and taken again since the last step, across the next step. */
void slot_ops_keep_current_states(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed);

#endif
