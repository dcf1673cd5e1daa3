/*
 * Per-row token counts and token trees (SPEC 3) through the op layer on the CPU backend (the float64
 * reference): tests/tree_checks.c.
 */
#include <criterion/criterion.h>

#include "tree_checks.h"

#define CPU GDN_BACKEND_CPU

Test(tree, random_trees_cache_f32) { tree_check_random(CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 0, 4, 99, 1); }
Test(tree, random_trees_cache_bf16) { tree_check_random(CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 0, 4, 99, 2); }
Test(tree, random_trees_fold_f32) { tree_check_random(CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 0, 4, 99, 3); }
Test(tree, random_trees_fold_bf16) { tree_check_random(CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 0, 4, 99, 4); }
Test(tree, random_trees_ring_f32) { tree_check_random(CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 0, 4, 99, 5); }
Test(tree, random_trees_ring_bf16) { tree_check_random(CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 0, 4, 99, 6); }
Test(tree, mixed_counts_cache) { tree_check_random(CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1, 4, 99, 7); }
Test(tree, mixed_counts_fold) { tree_check_random(CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 1, 4, 99, 8); }
Test(tree, mixed_counts_ring) { tree_check_random(CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 1, 4, 99, 9); }
Test(tree, four_node_trees_fold_bf16) { tree_check_random_nodes(CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4, 4, 5, 27); }

Test(tree, chain_tree_is_chain_cache) { tree_check_chain_is_chain(CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 11); }
Test(tree, chain_tree_is_chain_fold) { tree_check_chain_is_chain(CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 12); }
Test(tree, chain_tree_is_chain_ring) { tree_check_chain_is_chain(CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 13); }

Test(tree, bad_values_are_padding_cache) { tree_check_bad_values(CPU, GDN_VERIFY_CACHE); }
Test(tree, bad_values_are_padding_fold) { tree_check_bad_values(CPU, GDN_VERIFY_FOLD); }
Test(tree, bad_values_are_padding_ring) { tree_check_bad_values(CPU, GDN_VERIFY_RING); }

Test(tree, commit_node_refusals) { tree_check_commit_node_refusals(CPU); }
