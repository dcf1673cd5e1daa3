/*
 * Host-side conversions between fp32 and the 16-bit storage types (bf16, fp16), bit-exact with the
 * CUDA intrinsics (__float2bfloat16_rn, __float2half_rn): round to nearest, ties to even; NaN stays
 * NaN. Header-only so that the reference, the CPU backend, tests and bench share one copy.
 */
#ifndef GDN_DTYPE_CONVERT_H
#define GDN_DTYPE_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gdn/gdn.h"

static inline float gdn__bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t gdn__f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float gdn__bf16_to_f32(uint16_t h) { return gdn__bits_to_f32((uint32_t)h << 16); }

static inline uint16_t gdn__f32_to_bf16(float f)
{
    uint32_t u = gdn__f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, keep the sign */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float gdn__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) /* inf or NaN */
        return gdn__bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in fp32 */
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    return gdn__bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t gdn__f32_to_f16(float f)
{
    uint32_t u = gdn__f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* rounds to inf */
    if (magnitude < 0x38800000u) {                                       /* fp16 subnormal or 0 */
        /* Scale so the fp16 subnormal unit (2^-24) is 1, then round to nearest even in fp32. */
        float scaled = gdn__bits_to_f32(magnitude) * 16777216.0f;
        float rounded = nearbyintf(scaled); /* default rounding mode: ties to even */
        return (uint16_t)(sign | (uint16_t)rounded);
    }
    uint32_t mantissa_odd = (magnitude >> 13) & 1u;
    magnitude += 0xfffu + mantissa_odd;
    return (uint16_t)(sign | (uint16_t)((magnitude - 0x38000000u) >> 13));
}

/* Element `i` of an array of `dtype` (F32, BF16 or F16) as fp32. */
static inline float gdn__load_f32(const void *base, gdn_dtype dtype, int64_t i)
{
    switch (dtype) {
    case GDN_DTYPE_BF16: return gdn__bf16_to_f32(((const uint16_t *)base)[i]);
    case GDN_DTYPE_F16: return gdn__f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

/* Stores `x` rounded once (to nearest even) into element `i` of an array of `dtype`. */
static inline void gdn__store_f32(void *base, gdn_dtype dtype, int64_t i, float x)
{
    switch (dtype) {
    case GDN_DTYPE_BF16: ((uint16_t *)base)[i] = gdn__f32_to_bf16(x); break;
    case GDN_DTYPE_F16: ((uint16_t *)base)[i] = gdn__f32_to_f16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

#endif /* GDN_DTYPE_CONVERT_H */
