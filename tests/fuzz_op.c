/*
 * libFuzzer harness over the public op layer (issue 17; include/gdn/gdn_op.h, CPU backend): built by
 * scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined beside the engine-API harness
 * (tests/fuzz_api.c). Every input goes through tests/fuzz_op_driver.c (the same per-input function
 * that tests/test_fuzz_regressions.c replays without libFuzzer); a failed check prints the driver's
 * message and aborts, so libFuzzer keeps the input as a crash.
 *
 * GDN_FUZZ_STRICT=1 in the environment also fails the library bugs already known (fuzz_op_driver.c);
 * by default the driver steps around them so that fuzzing keeps finding new ones.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_op_driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned fuzz_flags(void)
{
    static int flags = -1;
    if (flags < 0) {
        const char *strict = getenv("GDN_FUZZ_STRICT");
        flags = strict && *strict && *strict != '0' ? (int)GDN_FUZZ_OP_STRICT : 0;
    }
    return (unsigned)flags;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gdn_fuzz_op_result result;
    if (gdn_fuzz_op_run_one(data, size, fuzz_flags(), &result) != 0) {
        fprintf(stderr, "gdn op fuzz check failed: %s\n", result.message);
        fflush(stderr);
        abort();
    }
    return 0;
}
