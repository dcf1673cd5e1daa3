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
