/*
 * The op layer on the GPU: strided views bit-exact with dense tensors on the GPU, and within SPEC 4 of
 * the float64 reference (the CPU op), under every verify strategy; flush and the slot operations on
 * device memory with pending work (bit-exact against each other on the GPU, within SPEC 4 of the CPU
 * op), and their refusals. Skips visibly without a GPU.
 */
#include <criterion/criterion.h>

#include "op_checks.h"
#include "support.h"

#define GPU_OP_TEST(name, preset, strategy, dtype, seed)                                            \
    Test(gpu_op, name, .timeout = 600)                                                              \
    {                                                                                               \
        test_require_gpu();                                                                         \
        op_check_views(GDN_BACKEND_CUDA, preset, strategy, dtype, seed);                            \
    }

GPU_OP_TEST(views_cache_f32, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 11)
GPU_OP_TEST(views_cache_bf16, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 12)
GPU_OP_TEST(views_fold_f32, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 13)
GPU_OP_TEST(views_fold_bf16, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 14)
GPU_OP_TEST(views_ring_f32, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 15)
GPU_OP_TEST(views_ring_bf16, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 16)
GPU_OP_TEST(views_qwen3_next_cache_f32, "qwen3-next", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 17)
GPU_OP_TEST(views_qwen3_next_fold_bf16, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 18)
GPU_OP_TEST(views_qwen3_next_ring_f32, "qwen3-next", GDN_VERIFY_RING, GDN_DTYPE_F32, 19)
/* Three stored tokens: a fold CTA's own token follows them (its staging warp and its preparing warp
 * must be the same whatever the CTA's warps). */
Test(gpu_op, views_qwen3_next_fold_bf16_three_tokens, .timeout = 600)
{
    test_require_gpu();
    op_check_views_tokens(GDN_BACKEND_CUDA, "qwen3-next", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 3, 20);
}

#define GPU_SLOT_OPS_TEST(name, strategy, seed)                                                     \
    Test(gpu_op, name, .timeout = 600)                                                              \
    {                                                                                               \
        test_require_gpu();                                                                         \
        op_check_slot_ops(GDN_BACKEND_CUDA, strategy, seed);                                        \
    }

GPU_SLOT_OPS_TEST(slot_operations_cache, GDN_VERIFY_CACHE, 31)
GPU_SLOT_OPS_TEST(slot_operations_fold, GDN_VERIFY_FOLD, 32)
GPU_SLOT_OPS_TEST(slot_operations_ring, GDN_VERIFY_RING, 33)

Test(gpu_op, slot_operation_refusals_change_nothing, .timeout = 600)
{
    test_require_gpu();
    op_check_slot_op_refusals(GDN_BACKEND_CUDA, 34);
}
