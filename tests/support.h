/*
 * Shared helpers of the Criterion suites: a seeded random source with SPEC 4's distributions, engine
 * construction, host mirrors of what a step fed the engine, and an independent float64 reference run
 * of one row (straight through gdn__ref_head, not through the engine's parameter plumbing).
 */
#ifndef GDN_TESTS_SUPPORT_H
#define GDN_TESTS_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "gdn/gdn.h"
#include "kernels/ref/gdn_spec.h"

/* ---- random numbers (splitmix64 + Box-Muller), deterministic per seed ---- */
/* The one random source of tests and bench (kernels/ref/gdn_spec.h). */
typedef gdn__rng test_rng;

test_rng test_rng_seeded(uint64_t seed);
double test_rng_uniform(test_rng *rng); /* [0, 1) */
double test_rng_normal(test_rng *rng);  /* N(0, 1) */
int32_t test_rng_below(test_rng *rng, int32_t n);

/* ---- engines ---- */

/* A configuration for `preset` with the given sizes, CPU backend. */
gdn_engine_config test_config(const char *preset, int32_t layers, gdn_dtype state_dtype, int32_t num_slots,
                              int32_t max_batch, int32_t max_tokens);
/* Creates an engine (asserting success) and sets random A_log, dt_bias (~0.1 N(0,1)) per layer, kept in
 * *params as [L][2][HV] floats (A_log then dt_bias) when params != NULL (caller frees with free()). */
gdn_engine *test_engine_create(const gdn_engine_config *config, test_rng *rng, float **params);

/* Writes a random state (~0.1 N(0,1), rounded to the state dtype) into `slot` of every layer. */
void test_fill_slot_state(gdn_engine *engine, int32_t slot, test_rng *rng);

/* Reads `slot` of `layer` widened to double: [HV*V*K] (caller frees with free()). */
double *test_read_state(gdn_engine *engine, int32_t layer, int32_t slot);

/* Host copy of one layer's step inputs, widened to double after rounding to the input dtype, so the
 * reference sees exactly what the engine saw. */
typedef struct test_inputs {
    int32_t B, T;
    double *q, *k; /* [B, T, HK, K] */
    double *v;     /* [B, T, HV, V] */
    double *a, *b; /* [B, T, HV] */
} test_inputs;

/* Draws SPEC 4 inputs for B rows and T tokens, uploads them to `layer`'s buffers, fills *inputs. */
void test_write_inputs(gdn_engine *engine, int32_t layer, int32_t B, int32_t T, test_rng *rng,
                       test_inputs *inputs);
void test_inputs_free(test_inputs *inputs);

/* Poisons `layer`'s output buffer (every byte 0x7f: a large finite value in bf16 and fp32). */
void test_poison_outputs(gdn_engine *engine, int32_t layer);

/* Reads `layer`'s outputs [B, T, HV, V] widened to double (caller frees with free()). */
double *test_read_outputs(gdn_engine *engine, int32_t layer, int32_t B, int32_t T);

/*
 * Reference for one row: starting from state S0 (double [HV*V*K], updated in place), runs the first
 * `tokens` tokens of row `row` of `inputs`, writing outputs [tokens, HV, V] into out (may be NULL).
 * A_log, dt_bias: [HV] floats.
 */
void test_reference_row(const gdn_engine_config *config, const test_inputs *inputs, int32_t row,
                        int32_t tokens, const float *A_log, const float *dt_bias, double *S0, double *out);

/* Rounds every element of x[n] to `dtype` (F32 or BF16) and back, as a store would. */
void test_round_to(double *x, size_t n, gdn_dtype dtype);

/* Largest |a-b| / (abs_tol + rel_tol*|b|) over n elements: <= 1 passes. NaN anywhere gives +inf. */
double test_error_ratio(const double *actual, const double *expected, size_t n, double abs_tol, double rel_tol);

/* Bytes of one slot's state in one layer, and the element count. */
size_t test_state_bytes(const gdn_engine *engine);
size_t test_state_elems(const gdn_engine *engine);

/* Snapshot of every layer's state of `slot` as raw bytes (caller frees with free()). */
unsigned char *test_snapshot_slot(gdn_engine *engine, int32_t slot);

/* Snapshot of every layer's pool bytes of `slot`, copied straight from the pools (gdn_engine_state_pool
 * and gdn_engine_download), not through gdn_slot_read_state: a read through the API writes back what
 * the fold and ring strategies keep pending, so only this one sees a lagging pool as it is. */
unsigned char *test_snapshot_pool(gdn_engine *engine, int32_t slot);

/* Twin engines after the same step of `batch` rows and T tokens: every layer's outputs (none for an
 * empty step) and every slot's raw pools bit-exact; `step` names the step in the messages. */
void test_assert_twins_match(gdn_engine *a, gdn_engine *b, int32_t batch, int32_t T, int step);

/* Runs a step: begin (asserting success), run all layers. */
void test_run_step(gdn_engine *engine, gdn_step_kind kind, int32_t T, int32_t batch, const int32_t *slots,
                   const int32_t *write_slots);

/* Writes accepted[0..n) to the engine's accepted buffer. */
void test_set_accepted(gdn_engine *engine, const int32_t *accepted, int32_t n);

/* 1 when a CUDA GPU can be used by this build (an engine with GDN_BACKEND_CUDA can be created). */
int test_have_gpu(void);

/* Skips the calling test (visibly, with the reason) unless test_have_gpu(). */
void test_require_gpu(void);

/* The steps a random scenario runs: `steps`, or under GDN_TEST_SCALE (a factor in (0, 1], which
 * scripts/gpu_verify.sh sets for the compute-sanitizer runs, where every kernel instance is what is
 * checked and a long run does not fit the time) that share of them, at least 12. */
int32_t test_scaled_steps(int32_t steps);
/* True unless GDN_TEST_SCALE shortens the scenarios: the assertions that a scenario reached a path
 * (verify steps, write-backs) hold only for full-length runs. */
int test_full_length(void);

#endif /* GDN_TESTS_SUPPORT_H */
