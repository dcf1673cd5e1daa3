/*
 * The op layer on the GPU: strided views bit-exact with dense tensors on the GPU, and within SPEC 4 of
 * the float64 reference (the CPU op), under every verify strategy. Skips visibly without a GPU.
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
