/*
 * Per-row token counts and token trees through the engine API on the GPU: the checks of
 * test_engine_tree.c (engine_tree_checks.c) with GDN_BACKEND_CUDA, step graphs on (captured lazily,
 * one per variant). Skips visibly without a GPU, and while this build's CUDA kernels do not run
 * counts and trees (begin_step answers GDN_ENOTSUP).
 */
#include <criterion/criterion.h>

#include "engine_tree_checks.h"
#include "support.h"

#define GPU_TREE_TEST(name, call)                                                                   \
    Test(gpu_engine_tree, name, .timeout = 600)                                                     \
    {                                                                                               \
        test_require_gpu();                                                                         \
        call;                                                                                       \
    }

GPU_TREE_TEST(random_trees_cache_f32, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1))
GPU_TREE_TEST(random_trees_cache_bf16, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 2))
GPU_TREE_TEST(random_trees_fold_f32, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_FOLD, GDN_DTYPE_F32, 3))
GPU_TREE_TEST(random_trees_fold_bf16, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4))
GPU_TREE_TEST(random_trees_ring_f32, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_RING, GDN_DTYPE_F32, 5))
GPU_TREE_TEST(random_trees_ring_bf16, engine_tree_check_random(GDN_BACKEND_CUDA, GDN_VERIFY_RING, GDN_DTYPE_BF16, 6))
GPU_TREE_TEST(chain_tree_is_chain_cache, engine_tree_check_chain_is_chain(GDN_BACKEND_CUDA, GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 11))
GPU_TREE_TEST(chain_tree_is_chain_fold, engine_tree_check_chain_is_chain(GDN_BACKEND_CUDA, GDN_VERIFY_FOLD, GDN_DTYPE_F32, 12))
GPU_TREE_TEST(chain_tree_is_chain_ring, engine_tree_check_chain_is_chain(GDN_BACKEND_CUDA, GDN_VERIFY_RING, GDN_DTYPE_BF16, 13))
GPU_TREE_TEST(refusals_change_nothing_cache, engine_tree_check_refusals(GDN_BACKEND_CUDA, GDN_VERIFY_CACHE, 21))
GPU_TREE_TEST(refusals_change_nothing_fold, engine_tree_check_refusals(GDN_BACKEND_CUDA, GDN_VERIFY_FOLD, 22))
GPU_TREE_TEST(refusals_change_nothing_ring, engine_tree_check_refusals(GDN_BACKEND_CUDA, GDN_VERIFY_RING, 23))
