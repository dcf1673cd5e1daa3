/*
 * Per-row token counts and token trees through the engine (gdn_step.token_counts / .parents, SPEC 3),
 * shared by the CPU suite (test_engine_tree.c) and the GPU suite (test_gpu_engine_tree.c): each check
 * takes the backend to run on. On a backend whose kernels do not run counts and trees yet
 * (begin_step answers GDN_ENOTSUP), the check skips visibly.
 */
#ifndef GDN_TESTS_ENGINE_TREE_CHECKS_H
#define GDN_TESTS_ENGINE_TREE_CHECKS_H

#include <stdint.h>

#include "gdn/gdn.h"

/*
 * A tiny 2-layer engine (10 slots, max_batch 8, max_tokens 16, fp32 outputs) whose slots hold random
 * states: rounds of verify steps of 6 rows (one a padding row, bucket 8) with random trees of 1..16
 * nodes (depth 1..n, branching 1..4) and mixed counts (an n = 1 row, an n = T row), then rounds with
 * parents alone, with counts alone, and a decode step. Rounds cycle through run_step, run_layer (in
 * reverse layer order) and GDN_STEP_CALLER_WORK with the enqueue calls. Per round: inputs random,
 * outputs poisoned first; every node's output of every layer within SPEC 4 of a float64 model run
 * from the engine's own starting state, positions past a row's count and the padding row exactly zero;
 * the accepted node (every node index in turn) committed: its state within SPEC 4 in every layer,
 * node -1 bit-exact, slots out of the step bit-exact, two slots in no step untouched in the raw pool;
 * the device error flag clear. The padding row's count and parents, and parents past a row's count,
 * are garbage that must be ignored.
 */
void engine_tree_check_random(gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype state_dtype,
                              uint64_t seed);

/*
 * Twin engines fed the same inputs: a tree that is a chain (p = t - 1) with counts, run with
 * GDN_STEP_CALLER_WORK and committed by node, against the chain step with counts run by run_step and
 * committed by count (node + 1); then parents alone against the plain step. Outputs and raw pools
 * bit-exact after each step, and every slot's state after its commit.
 */
void engine_tree_check_chain_is_chain(gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype state_dtype,
                                      uint64_t seed);

/*
 * With a tree step run and awaiting its commit: begin_step with a count of 0 or T + 1, a parent of -2
 * or t, counts or parents on a decode step (also with GDN_STEP_CALLER_WORK) each returns its code
 * (GDN_ESTEP_TOKENS, GDN_ESTEP_PARENTS) and changes nothing: the raw pools, the accepted buffer and
 * the current step's bucket are as before, and the pending commit then commits the tree as the model
 * says. An engine with the mixer (the gated norm) refuses counts and parents with GDN_ENOTSUP and
 * then runs a plain verify step and its commit.
 */
void engine_tree_check_refusals(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed);

#endif /* GDN_TESTS_ENGINE_TREE_CHECKS_H */
