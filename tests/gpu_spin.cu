// A kernel that keeps the GPU busy for a while: tests use it to show that a step call returns while
// earlier work is still running (no host synchronisation on the step path).
#include <cuda_runtime.h>

__global__ void gdn_test_spin_kernel(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

extern "C" int test_gpu_spin(void *stream, double milliseconds)
{
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    if (khz <= 0) khz = 2000000;
    gdn_test_spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((long long)(milliseconds * khz));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

// A caller's kernel that writes a layer's inputs late: it allows its dependents to launch at once
// (programmatic dependent launch), keeps the GPU busy, and only then copies `count` regions. A layer
// kernel launched with overlap may start during the wait; it must not read the inputs before this
// kernel ends.
struct test_regions {
    void *dst[6];
    const void *src[6];
    unsigned long long bytes[6];
    int count;
};

__global__ void gdn_test_late_writer_kernel(test_regions r, long long cycles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    for (int n = 0; n < r.count; n++)
        for (unsigned long long b = threadIdx.x; b < r.bytes[n]; b += blockDim.x)
            static_cast<unsigned char *>(r.dst[n])[b] = static_cast<const unsigned char *>(r.src[n])[b];
}

extern "C" int test_gpu_late_writer(void *stream, void *const *dst, const void *const *src, const size_t *bytes, int count,
                                    double milliseconds)
{
    if (count < 0 || count > 6) return -1;
    test_regions r = {};
    for (int n = 0; n < count; n++) r.dst[n] = dst[n], r.src[n] = src[n], r.bytes[n] = bytes[n];
    r.count = count;
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    if (khz <= 0) khz = 2000000;
    gdn_test_late_writer_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(r, (long long)(milliseconds * khz));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
