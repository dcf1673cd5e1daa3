/*
 * libFuzzer harness over the host API (issue 17): built by scripts/fuzz.sh with
 * clang -fsanitize=fuzzer,address,undefined. Every input goes through tests/fuzz_driver.c (the same
 * per-input function that tests/test_fuzz_regressions.c replays without libFuzzer); a failed check
 * prints the driver's message and aborts, so libFuzzer keeps the input as a crash.
 *
 * jemalloc under ASan: engine/alloc.c routes the library's host allocations to malloc / free in a
 * sanitizer build (GDN_ALLOC_SYSTEM, which scripts/fuzz.sh also sets explicitly), so ASan sees the
 * pools, workspaces and tables; jemalloc is not linked.
 *
 * GDN_FUZZ_STRICT=1 in the environment also fails the library bugs already known (fuzz_driver.h);
 * by default the model steps around them so that fuzzing keeps finding new ones.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned fuzz_flags(void)
{
    static int flags = -1;
    if (flags < 0) {
        const char *strict = getenv("GDN_FUZZ_STRICT");
        flags = strict && *strict && *strict != '0' ? (int)GDN_FUZZ_STRICT : 0;
    }
    return (unsigned)flags;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gdn_fuzz_result result;
    if (gdn_fuzz_run_one(data, size, fuzz_flags(), &result) != 0) {
        fprintf(stderr, "gdn fuzz check failed: %s\n", result.message);
        fflush(stderr);
        abort();
    }
    return 0;
}
