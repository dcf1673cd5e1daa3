/*
 * Per-row token counts and token trees (SPEC 3) through the op layer, the same checks on either
 * backend (tests/test_tree.c: CPU, tests/test_gpu_tree.c: CUDA). tree_checks.c says what each asserts.
 */
#ifndef GDN_TESTS_TREE_CHECKS_H
#define GDN_TESTS_TREE_CHECKS_H

#include <stdint.h>

#include "gdn/gdn.h"

/* Random trees (chain: chains with mixed counts) of up to 16 nodes on B rows of `preset`, `rounds`
 * accepted nodes (every node when rounds > T). */
void tree_check_random(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                       int chain, int32_t B, int32_t rounds, uint64_t seed);
/* The same for random trees of up to `nodes` nodes (the step's T; row i's count 1..nodes). */
void tree_check_random_nodes(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                             int32_t nodes, int32_t B, int32_t rounds, uint64_t seed);
void tree_check_chain_is_chain(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                               uint64_t seed);
void tree_check_bad_values(gdn_backend_kind backend, gdn_verify_strategy strategy);
void tree_check_commit_node_refusals(gdn_backend_kind backend);

#endif /* GDN_TESTS_TREE_CHECKS_H */
