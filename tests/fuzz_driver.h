/*
 * The host-API fuzz driver (issue 17): one fuzz input, decoded into an engine configuration (valid or
 * not) and a sequence of API calls on the CPU backend, each checked against a host model:
 *   - the status every call must return (a refused call returns the documented code and changes
 *     nothing: the pools, outputs, inputs and accepted counts are compared byte for byte around it,
 *     and, when the input asks for it, every live slot's state read before and after);
 *   - which slots are allocated and which slot the allocator hands out;
 *   - every accepted call's effect: a float64 model of each slot's state, advanced with SPEC 1
 *     directly (gdn__ref_gdn_token, one token of one head) for decode and for verify + commit, and
 *     compared with the engine's outputs and state reads within SPEC 4's tolerances; padding rows
 *     and bucket rows past the batch output zeros; output positions outside the step and the gaps of
 *     caller-owned pools and views stay untouched.
 * Linked by the libFuzzer harness (tests/fuzz_api.c) and by the Criterion suite that replays the
 * corpus (tests/test_fuzz_regressions.c). GDN_FUZZ_TRACE=1 in the environment prints every call.
 */
#ifndef GDN_TESTS_FUZZ_DRIVER_H
#define GDN_TESTS_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gdn_fuzz_result {
    int failed;            /* 1: a check failed (message says which) */
    char message[2048];
    int created;           /* an engine was created (the configuration was valid) */
    int32_t ops;           /* API operations decoded and run */
    int32_t steps_run;     /* layers run with rows (decode or verify) */
    int32_t commits;       /* verify commits with rows */
    int32_t refusals;      /* calls that were refused as expected */
    double worst_output;   /* largest output error as a fraction of SPEC 4's tolerance */
    double worst_state;    /* the same for states */
} gdn_fuzz_result;

/* Flags of gdn_fuzz_run_one. */
/* Library bugs the fuzzer has found and that are not fixed yet (listed in fuzz_driver.c, each with
 * the corpus input that shows it) fail the input. Without this flag the model steps around them (it
 * stops vouching for what they corrupt), so that a fuzzing run keeps looking for new ones; the
 * replay suite always sets it. */
#define GDN_FUZZ_STRICT 1u

/* Runs one input. Returns 0 when every check held, 1 otherwise (result->message says why). Never
 * aborts on a failed check (the caller decides); memory errors are the sanitizers' business. */
int gdn_fuzz_run_one(const uint8_t *data, size_t size, unsigned flags, gdn_fuzz_result *result);

#endif /* GDN_TESTS_FUZZ_DRIVER_H */
