/*
 * What the float64 reference is compared with, in one place for the tests and the bench's checks:
 * SPEC 4's tolerances, and the one random source that draws SPEC 4's inputs (splitmix64; Box-Muller
 * normals). Header-only, C11.
 */
#ifndef GDN_REF_SPEC_H
#define GDN_REF_SPEC_H

#include <math.h>
#include <stdint.h>

#include "gdn/gdn.h"

/* SPEC 4: |got - ref| <= abs + rel * |ref|. bf16 state: outputs against a bf16-rounded reference. */
typedef struct gdn__tolerance {
    double out_abs, out_rel, state_abs, state_rel;
} gdn__tolerance;

static inline gdn__tolerance gdn__spec4_tolerance(gdn_dtype state_dtype)
{
    if (state_dtype == GDN_DTYPE_BF16) return (gdn__tolerance){1e-3, 5e-3, 0.016, 5e-3};
    return (gdn__tolerance){1e-2, 1e-2, 1e-2, 1e-2};
}

typedef struct gdn__rng {
    uint64_t state;
} gdn__rng;

static inline gdn__rng gdn__rng_seeded(uint64_t seed) { return (gdn__rng){seed * 0x9e3779b97f4a7c15ull + 1}; }

static inline uint64_t gdn__rng_next(gdn__rng *rng)
{
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* [0, 1) */
static inline double gdn__rng_uniform(gdn__rng *rng) { return (double)(gdn__rng_next(rng) >> 11) * 0x1.0p-53; }

/* N(0, 1) */
static inline double gdn__rng_normal(gdn__rng *rng)
{
    const double u1 = 1.0 - gdn__rng_uniform(rng), u2 = gdn__rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* GDN_REF_SPEC_H */
