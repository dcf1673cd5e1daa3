/*
 * Checks of the op layer (include/gdn/gdn_op.h) shared by the CPU suite (test_op.c) and the GPU suite
 * (test_gpu_op.c).
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

#endif /* GDN_TESTS_OP_CHECKS_H */
