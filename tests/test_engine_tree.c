/*
 * Per-row token counts and token trees through the engine API (gdn_step.token_counts / .parents) on
 * the CPU backend: random trees and mixed counts against a float64 model under every verify strategy
 * with fp32 and bf16 state, through run_step, run_layer and caller-owned work; a tree that is a chain
 * bit-exact with the chain step; every refusal returns its code and changes nothing. The checks live
 * in engine_tree_checks.c; test_gpu_engine_tree.c runs them on the GPU.
 */
#include <criterion/criterion.h>

#include "engine_tree_checks.h"

Test(engine_tree, random_trees_cache_f32) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1); }
Test(engine_tree, random_trees_cache_bf16) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 2); }
Test(engine_tree, random_trees_fold_f32) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, GDN_DTYPE_F32, 3); }
Test(engine_tree, random_trees_fold_bf16) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4); }
Test(engine_tree, random_trees_ring_f32) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_RING, GDN_DTYPE_F32, 5); }
Test(engine_tree, random_trees_ring_bf16) { engine_tree_check_random(GDN_BACKEND_CPU, GDN_VERIFY_RING, GDN_DTYPE_BF16, 6); }

Test(engine_tree, chain_tree_is_chain_cache) { engine_tree_check_chain_is_chain(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 11); }
Test(engine_tree, chain_tree_is_chain_fold) { engine_tree_check_chain_is_chain(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, GDN_DTYPE_F32, 12); }
Test(engine_tree, chain_tree_is_chain_ring) { engine_tree_check_chain_is_chain(GDN_BACKEND_CPU, GDN_VERIFY_RING, GDN_DTYPE_BF16, 13); }

Test(engine_tree, refusals_change_nothing_cache) { engine_tree_check_refusals(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, 21); }
Test(engine_tree, refusals_change_nothing_fold) { engine_tree_check_refusals(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, 22); }
Test(engine_tree, refusals_change_nothing_ring) { engine_tree_check_refusals(GDN_BACKEND_CPU, GDN_VERIFY_RING, 23); }
