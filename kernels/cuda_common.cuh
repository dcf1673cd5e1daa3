/*
 * Device helpers shared by the CUDA kernel families (kernels/gdn_cuda_*.cu): CUDA error to gdn_status
 * conversion, and loads and stores of fp32 / bf16 / fp16 data as fp32 registers through 8- and 16-byte
 * vector accesses. Why one header: every kernel converts the same three storage types, and the rounding
 * rule (round to nearest even, once, at the store) must be the same everywhere.
 */
#ifndef GDN_CUDA_COMMON_CUH
#define GDN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <atomic>
#include <type_traits>

#include "gdn/gdn.h"

/* ---------------------------------------------------------------------------------------------- */
/* Host: CUDA status conversion                                                                     */
/* ---------------------------------------------------------------------------------------------- */

/* The last CUDA failure seen by a launcher on this thread ("file:line: expr: error string"); one
 * buffer for all translation units (a C++17 inline function's static is shared). */
inline char *gdn__cuda_error_detail(void)
{
    static thread_local char detail[256];
    return detail;
}

inline gdn_status gdn__cuda_status(cudaError_t err, const char *expr, const char *file, int line)
{
    if (err == cudaSuccess) return GDN_OK;
    snprintf(gdn__cuda_error_detail(), 256, "%s:%d: %s: %s", file, line, expr, cudaGetErrorString(err));
    return GDN_ECUDA;
}

/* Evaluates a cudaError_t expression; on failure records it and returns GDN_ECUDA from the caller. */
#define GDN__CUDA_TRY(expr)                                                                        \
    do {                                                                                           \
        gdn_status gdn__try_status = gdn__cuda_status((expr), #expr, __FILE__, __LINE__);          \
        if (gdn__try_status != GDN_OK) return gdn__try_status;                                     \
    } while (0)

/* Test hook (gdn__cuda_fail_next_launch in gdn_cuda.h): when set, the next launch check on this thread
 * makes a real failing launch (an empty grid), so that the error path is exercised end to end. */
inline bool &gdn__cuda_launch_failure_armed(void)
{
    static thread_local bool armed = false;
    return armed;
}
static __global__ void gdn__never_runs(void) {}

/* The error of the launch just made (and, when the test hook is armed, of a failing one). */
inline cudaError_t gdn__cuda_launch_error(void)
{
    if (gdn__cuda_launch_failure_armed()) {
        gdn__cuda_launch_failure_armed() = false;
        cudaGetLastError();
        gdn__never_runs<<<0, 1>>>();
    }
    return cudaGetLastError();
}

/* Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device:
 * the attribute is per device, so each call site keeps one flag per device for its kernel instance. */
constexpr int GDN__MAX_DEVICES = 64;
template <typename Kernel>
inline cudaError_t gdn__opt_in_shared(Kernel kernel, int bytes, std::atomic<bool> (&done)[GDN__MAX_DEVICES])
{
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const bool tracked = device >= 0 && device < GDN__MAX_DEVICES;
    if (tracked && done[device].load(std::memory_order_acquire)) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && tracked) done[device].store(true, std::memory_order_release);
    return err;
}

/* Programmatic dependent launch (PDL, compute capability 9.0 and up). A kernel launched with
 * overlap_preceding may start while the kernel before it on the stream is still running, as soon as
 * every CTA of that kernel has called gdn__allow_dependents() (or exited). Until it returns from
 * gdn__wait_preceding() it may read only memory that the preceding kernel does not write (slot rows,
 * the state of its own layer), and it writes nothing. Our kernels call gdn__allow_dependents() after
 * their own wait, except the layer kernel's small-grid decodes (allow_dependents_first), which call
 * it first thing: a kernel that starts early may then find the kernel before its predecessor still
 * running, which writes nothing it reads before its wait. The rows are written only by the fetch,
 * and the kernel after the fetch waits for it before any read and before it allows dependents
 * (rows_from_preceding); a layer's pool, counts and stored tokens are written only by that layer's
 * kernels and the commit, which end after their own wait, so after every kernel before them.
 * Launched without the attribute, a kernel skips the wait. */
__device__ __forceinline__ void gdn__wait_preceding()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void gdn__allow_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
}

/* True when the current device runs programmatic dependent launches (compute capability >= 9.0)
 * and the code it loads for our kernels has their waits: a build for several targets may hand a
 * 9.0+ device PTX of an older virtual arch (none of its own targets, or CUDA_FORCE_PTX_JIT=1), in
 * which gdn__wait_preceding is compiled out, and such a kernel must never start early. Every kernel
 * of the library is built for the same targets, so one of them stands for all. Read once per device. */
inline bool gdn__overlap_supported(void)
{
    static std::atomic<int> known[GDN__MAX_DEVICES]; /* 0 unknown, 1 no, 2 yes */
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    const bool tracked = device >= 0 && device < GDN__MAX_DEVICES;
    if (tracked) {
        const int k = known[device].load(std::memory_order_acquire);
        if (k) return k == 2;
    }
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    cudaFuncAttributes loaded = {};
    if (cudaFuncGetAttributes(&loaded, gdn__never_runs) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    const bool supported = major >= 9 && loaded.ptxVersion >= 90;
    if (tracked) known[device].store(supported ? 2 : 1, std::memory_order_release);
    return supported;
}

/* Launches `kernel` on `stream`, with programmatic stream serialization when `overlap` is set and the
 * device supports it (else in plain stream order). Returns the launch's error. */
template <typename... Params, typename... Args>
inline cudaError_t gdn__launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               bool overlap, Args... args)
{
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    if (overlap && gdn__overlap_supported()) {
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
    }
    const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args...);
    if (err != cudaSuccess) cudaGetLastError(); /* reported here: not again by the next check */
    return err;
}

/* How many CTAs of `threads` threads and `smem` bytes of shared memory an SM of this device holds at
 * once (0 when the runtime cannot tell). The occupancy is asked once per (device, threads, smem) in a
 * row: `memo` (the caller's, one per kernel and question) keeps the last answer. */
template <typename Kernel>
inline int gdn__ctas_per_sm(Kernel kernel, int threads, size_t smem, std::atomic<uint64_t> &memo)
{
    int device = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* bit 63: valid; 62-55: device; 54-44: threads; 43-16: smem; 15-0: CTAs an SM */
    const uint64_t key = (1ull << 63) | ((uint64_t)(device & 0xff) << 55) | ((uint64_t)(threads & 0x7ff) << 44) |
                         ((uint64_t)(smem & 0xfffffff) << 16);
    const uint64_t known = memo.load(std::memory_order_relaxed);
    if ((known & ~0xffffull) == key) return (int)(known & 0xffff);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    memo.store(key | (uint64_t)(per_sm & 0xffff), std::memory_order_relaxed);
    return per_sm;
}
/* This device's SMs (0 when the runtime cannot tell). */
inline int gdn__sm_count()
{
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return sms;
}
/* Whether a grid of `ctas` such CTAs all run at once on this device (false when the runtime cannot tell). */
template <typename Kernel>
inline bool gdn__in_one_wave(Kernel kernel, int threads, size_t smem, int64_t ctas, std::atomic<uint64_t> &memo)
{
    const int sms = gdn__sm_count();
    if (sms == 0) return false;
    const int per_sm = gdn__ctas_per_sm(kernel, threads, smem, memo);
    return per_sm > 0 && (int64_t)per_sm * sms >= ctas;
}

/* True when `p` is aligned to `bytes`. */
static inline __host__ __device__ bool gdn__aligned(const void *p, uintptr_t bytes) { return ((uintptr_t)p % bytes) == 0; }

/* ---------------------------------------------------------------------------------------------- */
/* Device: storage types                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* Elements of storage type S that fill one 16-byte vector. */
template <typename S> struct gdn__vec16 {
    static constexpr int elems = 16 / (int)sizeof(S);
};

__device__ __forceinline__ float gdn__to_f32(float x) { return x; }
__device__ __forceinline__ float gdn__to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float gdn__to_f32(__half x) { return __half2float(x); }

template <typename S> __device__ __forceinline__ S gdn__from_f32(float x);
template <> __device__ __forceinline__ float gdn__from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 gdn__from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half gdn__from_f32<__half>(float x) { return __float2half_rn(x); }

/* Raw vector of N elements of S (N * sizeof(S) in {8, 16}), loaded or stored in one access. */
template <typename S, int N> struct alignas(N * sizeof(S)) gdn__raw_vec {
    S v[N];
};

/* bf16 pairs widened a 32-bit word at a time: the low element is the word shifted up, the high one
 * the word with its low half cleared (one instruction each; the element-wise conversion extracts
 * the high one first). Taken only where it measured faster (gdn__widen_raw's WORDS, set in
 * gdn_cuda_layer_kernel.cuh for the big-grid decodes); elsewhere the changed code generation
 * measured slower. */
template <int N> __device__ __forceinline__ void gdn__bf16_words_to_f32(const void *raw, float (&out)[N])
{
    static_assert(N % 2 == 0, "whole words");
    uint32_t words[N / 2];
    memcpy(words, raw, sizeof(words));
#pragma unroll
    for (int j = 0; j < N / 2; j++) {
        out[2 * j] = __uint_as_float(words[j] << 16);
        out[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
}

/* n / d for 0 <= n < 2^16 and 1 <= d < 2^16 in a few instructions (a block index over a head count,
 * where the general integer division is a chain of some twenty): (n + 1/2) / d lies at least 1/(2d)
 * from an integer, and the fp32 quotient's error, below 2^-21 (n + 1/2) / d, is far smaller. */
__device__ __forceinline__ int gdn__small_quotient(int n, int d)
{
    return (int)__fdividef((float)n + 0.5f, (float)d);
}

/* N elements of S held raw in registers, widened to fp32: element by element, or with WORDS (and
 * bf16) a 32-bit word at a time (gdn__bf16_words_to_f32). */
template <typename S, int N, bool WORDS = false>
__device__ __forceinline__ void gdn__widen_raw(const gdn__raw_vec<S, N> &raw, float (&out)[N])
{
    if constexpr (WORDS && std::is_same<S, __nv_bfloat16>::value) {
        gdn__bf16_words_to_f32(&raw, out);
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) out[j] = gdn__to_f32(raw.v[j]);
    }
}

/* Loads N consecutive elements of S at `p` (aligned to N * sizeof(S)) into fp32 registers. */
template <typename S, int N, bool WORDS = false> __device__ __forceinline__ void gdn__load_vec(const S *p, float (&out)[N])
{
    static_assert(N * sizeof(S) == 16 || N * sizeof(S) == 8 || N * sizeof(S) == 4, "vector width");
    gdn__raw_vec<S, N> raw; /* loaded as one integer vector, like the stores below */
    if constexpr (N * sizeof(S) == 16) {
        const uint4 bits = *reinterpret_cast<const uint4 *>(p);
        memcpy(&raw, &bits, 16);
    } else if constexpr (N * sizeof(S) == 8) {
        const uint2 bits = *reinterpret_cast<const uint2 *>(p);
        memcpy(&raw, &bits, 8);
    } else {
        const uint32_t bits = *reinterpret_cast<const uint32_t *>(p);
        memcpy(&raw, &bits, 4);
    }
    gdn__widen_raw<S, N, WORDS>(raw, out);
}

/* The same through the read-only path with an evict-first hint: for data read exactly once. */
template <typename S, int N, bool WORDS = false> __device__ __forceinline__ void gdn__load_vec_stream(const S *p, float (&out)[N])
{
    static_assert(N * sizeof(S) == 16, "streaming loads are 16 bytes");
    const int4 bits = __ldcs(reinterpret_cast<const int4 *>(p));
    gdn__raw_vec<S, N> raw;
    memcpy(&raw, &bits, 16);
    gdn__widen_raw<S, N, WORDS>(raw, out);
}

/* Asks L2 to fetch the line holding p (no register result: the load that follows finds it there). */
__device__ __forceinline__ void gdn__prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

/* 16 bytes from global to shared memory without passing through registers (cp.async, cached in L2
 * only); the copies of a thread complete at its gdn__copy_async_wait_all. */
__device__ __forceinline__ void gdn__copy_async16(void *shared_dst, const void *global_src)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
/* 4 bytes, the same way (cached in L1 too: cp.async.cg takes only 16-byte copies). */
__device__ __forceinline__ void gdn__copy_async4(void *shared_dst, const void *global_src)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(global_src) : "memory");
}
/* Waits for all but the `pending` most recently committed groups of the thread's copies. */
template <int pending> __device__ __forceinline__ void gdn__copy_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
__device__ __forceinline__ void gdn__copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void gdn__copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* 0, but only once `x` is available: an address offset that orders a later access after the loads `x`
 * was computed from (the compiler cannot fold it away). */
__device__ __forceinline__ uint32_t gdn__zero_after(uint32_t x)
{
    uint32_t zero;
    asm volatile("and.b32 %0, %1, 0;\n" : "=r"(zero) : "r"(x));
    return zero;
}

/* d += A B on the tensor cores: A 16 x 16 bf16 (a0..a3), B 16 x 8 bf16 (b0, b1), d 16 x 8 fp32, in the
 * PTX ISA's m16n8k16 fragment layouts. */
__device__ __forceinline__ void gdn__mma_bf16_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                       uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
/* Two fp32 values rounded once (to nearest even) to S and packed into one 32-bit word, the first in
 * the low half (memory order); for S = float, one value per word. */
template <typename S> __device__ __forceinline__ uint32_t gdn__pack_word(const float *x);
template <> __device__ __forceinline__ uint32_t gdn__pack_word<float>(const float *x) { return __float_as_uint(x[0]); }
template <> __device__ __forceinline__ uint32_t gdn__pack_word<__nv_bfloat16>(const float *x)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x[0], x[1]);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}
template <> __device__ __forceinline__ uint32_t gdn__pack_word<__half>(const float *x)
{
    const __half2 h = __floats2half2_rn(x[0], x[1]);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}

/* x0, x1 as a bf16 pair (hi) and the pair of what that rounding left (lo): hi + lo carries about 16
 * bits of each value, so an MMA pair hi.B + lo.B keeps about 2^-17 of each product's size. */
__device__ __forceinline__ void gdn__split_bf16x2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 back = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - back.x, x1 - back.y);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
}

/* Rounds N fp32 values once (to nearest even) to S and stores them in one access at `p` (aligned to
 * N * sizeof(S)). Built as integer words and stored through the vector intrinsics: a plain copy of
 * an element struct was measured to compile to one 2-byte store per bf16 element (8 stores where
 * one does, half the bandwidth of a bf16 verify). */
template <typename S, int N> __device__ __forceinline__ void gdn__store_vec(S *p, const float (&in)[N])
{
    static_assert(N * sizeof(S) == 16 || N * sizeof(S) == 8 || N * sizeof(S) == 4, "vector width");
    constexpr int PER_WORD = 4 / (int)sizeof(S);
    uint32_t w[N / PER_WORD];
#pragma unroll
    for (int j = 0; j < N / PER_WORD; j++) w[j] = gdn__pack_word<S>(in + j * PER_WORD);
    if constexpr (N * sizeof(S) == 16) __stwb(reinterpret_cast<uint4 *>(p), make_uint4(w[0], w[1], w[2], w[3]));
    else if constexpr (N * sizeof(S) == 8) __stwb(reinterpret_cast<uint2 *>(p), make_uint2(w[0], w[1]));
    else *reinterpret_cast<uint32_t *>(p) = w[0];
}

#endif /* GDN_CUDA_COMMON_CUH */
