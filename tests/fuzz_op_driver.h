/*
 * The op-layer fuzz driver (issue 17): one fuzz input, decoded into one layer's geometry, a caller-owned
 * state pool and workspace (sized by gdn_op_workspace_bytes), and a sequence of calls of the public op
 * layer (include/gdn/gdn_op.h) on the CPU backend: gdn_op_layer_step (decode and verify; strided,
 * fused, reversed and broadcast views; padding, out-of-range and forked rows; the mixer's gated norm),
 * gdn_op_commit, gdn_op_flush, gdn_op_slot_copy / _import / _reset / _export, with valid descriptions
 * and with one field made invalid (every documented status), each checked against a host model:
 *   - the status every call must return; a refused call changes nothing (the pool, the workspace,
 *     every tensor, slot array, accepted array, error flag and export buffer compared byte for byte);
 *   - an accepted call changes only what it may (the pool slots it writes, the workspace, the output
 *     positions of the step's rows, the error flag, the export buffer; every buffer's guard bytes and
 *     the gaps of strided views and of the pool's slot stride stay as they were);
 *   - its effect: a float64 model of each slot's current state (SPEC 1 per token through
 *     tests/row_model.h, the gated norm through gdn__ref_gated_rmsnorm), the same for every strategy
 *     (a verify's commit advances the write slot by the accepted tokens), compared with the outputs,
 *     with exported states and with the pool where the op layer promises it is current (cache
 *     strategy; after flush, export, import, reset), within SPEC 4's tolerances; padding rows output
 *     zeros, and the error flag is raised exactly when a row names a slot >= num_slots.
 * Steps whose rows share slots (a race on the GPU, undefined results) run now and then: the model
 * stops vouching for the slots involved until they are imported or reset, and checks that nothing
 * else changed.
 * Linked by the libFuzzer harness (tests/fuzz_op.c) and by the Criterion suite that replays the corpus
 * (tests/test_fuzz_regressions.c, tests/fuzz_corpus_op/). GDN_FUZZ_TRACE=1 prints every call.
 */
#ifndef GDN_TESTS_FUZZ_OP_DRIVER_H
#define GDN_TESTS_FUZZ_OP_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gdn_fuzz_op_result {
    int failed;           /* 1: a check failed (message says which) */
    char message[2048];
    int32_t ops;          /* op-layer calls decoded and run */
    int32_t steps_run;    /* accepted layer steps with rows */
    int32_t commits;      /* accepted commits with rows */
    int32_t slot_ops;     /* accepted flush, copy, import, reset, export */
    int32_t refusals;     /* calls refused as expected */
    int32_t shared_rows;  /* steps whose rows shared slots (results not modelled) */
    double worst_output;  /* largest output error as a fraction of SPEC 4's tolerance */
    double worst_state;   /* the same for states */
    uint32_t known_bugs_hit; /* bit i: known library bug i was stepped around (fuzz_op_driver.c) */
} gdn_fuzz_op_result;

/* Flags of gdn_fuzz_op_run_one. */
/* Library bugs this fuzzer found that are not fixed yet (listed in fuzz_op_driver.c, each with the
 * corpus input that shows it) fail the input. Without it the driver steps around them, so that a
 * fuzzing run keeps looking for new ones. */
#define GDN_FUZZ_OP_STRICT 1u

/* Runs one input. Returns 0 when every check held, 1 otherwise (result->message says why). Never
 * aborts on a failed check; memory errors are the sanitizers' business. */
int gdn_fuzz_op_run_one(const uint8_t *data, size_t size, unsigned flags, gdn_fuzz_op_result *result);

/* Names of the known library bugs (index = bit of known_bugs_hit), NULL past the last. */
const char *gdn_fuzz_op_known_bug(int index);

#endif /* GDN_TESTS_FUZZ_OP_DRIVER_H */
