/*
 * Per-row token counts and token trees (SPEC 3) through the op layer on the GPU, against the float64
 * model of tests/tree_checks.c: random trees and mixed counts under every strategy and state dtype
 * (the tiny preset, and qwen3-next at a batch whose fold runs several row sets per CTA), chains given
 * as trees bit-exact with the chain path, bad values as padding with the flag. Skips visibly without
 * a GPU.
 */
#include <criterion/criterion.h>

#include "support.h"
#include "tree_checks.h"

#define GPU GDN_BACKEND_CUDA

#define GPU_TREE_TEST(name, call)                                                                   \
    Test(gpu_tree, name, .timeout = 900)                                                            \
    {                                                                                               \
        test_require_gpu();                                                                         \
        call;                                                                                       \
    }

GPU_TREE_TEST(random_trees_cache_f32, tree_check_random(GPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 0, 4, 99, 1))
GPU_TREE_TEST(random_trees_cache_bf16, tree_check_random(GPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 0, 4, 99, 2))
GPU_TREE_TEST(random_trees_fold_f32, tree_check_random(GPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 0, 4, 99, 3))
GPU_TREE_TEST(random_trees_fold_bf16, tree_check_random(GPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 0, 4, 99, 4))
GPU_TREE_TEST(random_trees_ring_f32, tree_check_random(GPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 0, 4, 99, 5))
GPU_TREE_TEST(random_trees_ring_bf16, tree_check_random(GPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 0, 4, 99, 6))
GPU_TREE_TEST(mixed_counts_cache, tree_check_random(GPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1, 4, 99, 7))
GPU_TREE_TEST(mixed_counts_fold, tree_check_random(GPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 1, 4, 99, 8))
GPU_TREE_TEST(mixed_counts_ring, tree_check_random(GPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 1, 4, 99, 9))
GPU_TREE_TEST(qwen3_next_trees_cache_bf16, tree_check_random(GPU, "qwen3-next", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 0, 40, 2, 21))
GPU_TREE_TEST(qwen3_next_trees_fold_bf16, tree_check_random(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 0, 40, 2, 22))
GPU_TREE_TEST(qwen3_next_trees_fold_f32, tree_check_random(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 0, 40, 2, 23))
GPU_TREE_TEST(qwen3_next_trees_ring_f32, tree_check_random(GPU, "qwen3-next", GDN_VERIFY_RING, GDN_DTYPE_F32, 0, 40, 2, 24))
/* Trees of up to 8 nodes: the big bf16 fold verify's one-node-tile form; fp32's split form at T = 8 */
GPU_TREE_TEST(qwen3_next_small_trees_fold_bf16, tree_check_random_nodes(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 8, 40, 2, 25))
GPU_TREE_TEST(qwen3_next_four_node_trees_fold_bf16, tree_check_random_nodes(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4, 40, 5, 26))
GPU_TREE_TEST(qwen3_next_small_trees_fold_f32, tree_check_random_nodes(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 8, 40, 2, 28))

GPU_TREE_TEST(chain_tree_is_chain_cache, tree_check_chain_is_chain(GPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 11))
GPU_TREE_TEST(chain_tree_is_chain_fold, tree_check_chain_is_chain(GPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 12))
GPU_TREE_TEST(chain_tree_is_chain_ring, tree_check_chain_is_chain(GPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 13))
GPU_TREE_TEST(chain_tree_is_chain_fold_qwen3_next, tree_check_chain_is_chain(GPU, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 14))

GPU_TREE_TEST(bad_values_are_padding_cache, tree_check_bad_values(GPU, GDN_VERIFY_CACHE))
GPU_TREE_TEST(bad_values_are_padding_fold, tree_check_bad_values(GPU, GDN_VERIFY_FOLD))
GPU_TREE_TEST(bad_values_are_padding_ring, tree_check_bad_values(GPU, GDN_VERIFY_RING))

GPU_TREE_TEST(commit_node_refusals, tree_check_commit_node_refusals(GPU))
