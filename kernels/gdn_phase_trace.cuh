/*
 * A developer's trace of where a layer-kernel (or ring streamed kernel) CTA spends its time (`meson
 * setup -Dphase_trace=true`; off by default, and then every marker compiles to nothing). Thread 0 of
 * each CTA (GDN__PHASE_BY: whichever one thread calls it) records clock64 at the kernel's phase
 * boundaries (gdn__phase), %globaltimer at its start and end, and its SM, into a buffer of its
 * translation unit that every launch overwrites: the records are the last launch's of each CTA
 * index. gdn-bench writes them to GDN_PHASE_TRACE_DIR/{layer,mixer,ring_stream}.bin when that is set;
 * scripts/phase_trace.py reads them (bench/results/2026-11-29-h200-mixer-decode-conv-taps.md).
 */
#ifndef GDN_PHASE_TRACE_CUH
#define GDN_PHASE_TRACE_CUH

#include <stdio.h>

/* Slots of a CTA's record (GDN__PHASE_RECORD 64-bit words). */
enum gdn__phase {
    GDN__PHASE_START,    /* after blockIdx */
    GDN__PHASE_ISSUED,   /* the state's loads and the copies before the wait issued */
    GDN__PHASE_WAITED,   /* past the wait for the preceding kernel (the instances that wait late) */
    GDN__PHASE_INPUTS,   /* the mixer's raw sequence in shared memory (barrier) */
    GDN__PHASE_CONV,     /* the mixer's conv pass done (barrier) */
    GDN__PHASE_PREPARED, /* the tokens prepared (barrier) */
    GDN__PHASE_SET0,     /* row set s's end at GDN__PHASE_SET0 + s, s < 4 (later sets at + 3) */
    GDN__PHASE_NORM = GDN__PHASE_SET0 + 4, /* the mixer's gated norm begins */
    GDN__PHASE_END,
    GDN__PHASE_START_NS, /* %globaltimer */
    GDN__PHASE_END_NS,
    GDN__PHASE_SM, /* %smid, and the grid's CTA count in the upper 32 bits */
    GDN__PHASE_RECORD = 16
};

#ifdef GDN_PHASE_TRACE
#define GDN__PHASE_TRACE_CTAS 8192
__device__ unsigned long long gdn__phase_records[GDN__PHASE_TRACE_CTAS * GDN__PHASE_RECORD];

/* Slot `at` of the calling CTA's record (one thread of the CTA calls it) */
__device__ __forceinline__ void gdn__phase_record(int at, unsigned long long value)
{
    const unsigned cta = blockIdx.y * gridDim.x + blockIdx.x;
    if (cta < GDN__PHASE_TRACE_CTAS) gdn__phase_records[cta * GDN__PHASE_RECORD + at] = value;
}
__device__ __forceinline__ void gdn__phase_put(int at, unsigned long long value)
{
    if (threadIdx.x == 0) gdn__phase_record(at, value);
}
__device__ __forceinline__ unsigned long long gdn__phase_ns()
{
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}
__device__ __forceinline__ void gdn__phase_begin()
{
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    gdn__phase_put(GDN__PHASE_START, clock64());
    gdn__phase_put(GDN__PHASE_START_NS, gdn__phase_ns());
    gdn__phase_put(GDN__PHASE_SM, sm | (unsigned long long)(gridDim.x * gridDim.y) << 32);
}
#define GDN__PHASE(at) gdn__phase_put((at), clock64())
#define GDN__PHASE_BY(at) gdn__phase_record((at), clock64()) /* from whichever one thread calls it */
#define GDN__PHASE_BEGIN() gdn__phase_begin()
#define GDN__PHASE_FINISH() (GDN__PHASE(GDN__PHASE_END), gdn__phase_put(GDN__PHASE_END_NS, gdn__phase_ns()))
/* The host side of one translation unit's buffer: extern "C" void gdn__phase_trace_dump_NAME(path). */
#define GDN__PHASE_TRACE_DUMPER(name)                                                                 \
    extern "C" void gdn__phase_trace_dump_##name(const char *path)                                  \
    {                                                                                                \
        static unsigned long long records[GDN__PHASE_TRACE_CTAS * GDN__PHASE_RECORD];                \
        if (cudaDeviceSynchronize() != cudaSuccess ||                                                \
            cudaMemcpyFromSymbol(records, gdn__phase_records, sizeof records) != cudaSuccess)        \
            return;                                                                                  \
        FILE *f = fopen(path, "wb");                                                                 \
        if (f) fwrite(records, sizeof records, 1, f), fclose(f);                                     \
    }
#else
#define GDN__PHASE(at) ((void)0)
#define GDN__PHASE_BY(at) ((void)0)
#define GDN__PHASE_BEGIN() ((void)0)
#define GDN__PHASE_FINISH() ((void)0)
#define GDN__PHASE_TRACE_DUMPER(name)
#endif

#endif /* GDN_PHASE_TRACE_CUH */
