// A kernel that keeps the GPU busy: the engine bench queues work behind it so that the GPU then runs
// the queued launches back to back, without host launch gaps.
#include <cuda_runtime.h>

__global__ void gdn_bench_spin_kernel(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

extern "C" int gdn_bench_spin(cudaStream_t stream, double milliseconds)
{
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    if (khz <= 0) khz = 2000000;
    gdn_bench_spin_kernel<<<1, 1, 0, stream>>>((long long)(milliseconds * khz));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
