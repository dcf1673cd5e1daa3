/*
 * Checks of the op layer (include/gdn/gdn_op.h) shared by the CPU suite (test_op.c) and the GPU suite
 * (test_gpu_op.c): each takes the backend whose memory the op's buffers live in.
 */
#ifndef GDN_TESTS_OP_CHECKS_H
#define GDN_TESTS_OP_CHECKS_H

#include <stdint.h>

#include "gdn/gdn_op.h"

/*
 * Runs one random sequence of decode and verify + commit steps (padding rows, rows writing another
 * slot, every accepted count) on ops over dense tensors and over strided views (q, k, v column
 * slices of one fused projection buffer, a and b interleaved in another, a padded output, a pool whose
 * slot stride exceeds HV * V * K), on the CPU backend and, when `backend` is CUDA, on the GPU too.
 * After every step: outputs and pools of the strided ops are bit-exact with the dense ops of the same
 * backend; the GPU's are within SPEC 4 of the CPU's (the float64 reference); padding rows' outputs
 * are zero; the pool's gaps between slots are untouched.
 */
void op_check_views(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype state_dtype,
                    uint64_t seed);
/* The same with max_tokens 1..4 (op_check_views: 4); a fold CTA's stored tokens are max_tokens, so a
 * count that is not a multiple of its warps checks how it splits token staging over warps. */
void op_check_views_tokens(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy,
                           gdn_dtype state_dtype, int32_t max_tokens, uint64_t seed);

/*
 * Flush and the slot operations of a tiny op (fp32 pool of 8 slots) whose slots 0..2 hold pending work
 * (two verify + commit steps under `strategy`), every buffer in `backend` memory (device memory on
 * CUDA): export of a slot is bit-exact with the state a flush of it leaves; a copy carries the pending
 * work (flushing source and copy gives bit-equal states, which under fold and ring differ from the
 * unflushed one); import then export returns exactly what was imported; reset then export gives zeros.
 * On CUDA the same scenario also runs on the CPU backend (the float64 reference): the GPU's flushed
 * pool, its copied and flushed slot and its step outputs are within SPEC 4 (fp32) of the CPU's.
 */
void op_check_slot_ops(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed);

/*
 * Refused slot operations and flushes (slot out of range, dst == src, NULL buffers and parameters, a
 * count outside 0..max_batch, AUTO backend) on a fold op with pending work in `backend` memory: each
 * returns its code, and the pool and workspace are byte-for-byte unchanged.
 */
void op_check_slot_op_refusals(gdn_backend_kind backend, uint64_t seed);

#endif /* GDN_TESTS_OP_CHECKS_H */
