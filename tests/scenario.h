/*
 * A random multi-step serving scenario, checked against a float64 host reference at every step: the
 * harness behind the engine's scenario tests on both backends. Requests are admitted (random or zero
 * initial state), run in decode and verify steps of varying batch (so several buckets), with explicit
 * padding rows, forks into a new write slot, random acceptance (0 and T included), and retire. The
 * host model follows the strategy's rounding points: the cache strategy stores the state after the
 * accepted prefix; the fold strategy stores the folded state and keeps the accepted tokens pending
 * until the next step (or a state read) folds them; the ring strategy keeps a checkpoint (rounded only
 * where the engine writes the pool back) and every token since it, until a full ring, a verify that
 * does not fit, a fork or a state read writes the state back.
 */
#ifndef GDN_TESTS_SCENARIO_H
#define GDN_TESTS_SCENARIO_H

#include "gdn/gdn.h"

typedef struct scenario_options {
    const char *preset;
    gdn_backend_kind backend;
    gdn_graph_mode graph_mode;
    gdn_dtype state_dtype;
    gdn_verify_strategy strategy;
    int32_t layers, steps, num_slots, max_batch, max_tokens;
    int32_t check_every; /* compare every live state every this many steps (and at the end); 0 = 1 */
    int32_t min_live;    /* admit requests until at least this many are live (large batches); 0 = none */
    int32_t ring_length; /* GDN_VERIFY_RING: the engine's ring_length (0: the default) */
    /* GDN_VERIFY_RING: the engine's ring_write_through when nonzero; 0 here means -1 (never), so that a
     * scenario tests the ring's own decode unless it asks for write-throughs. */
    int32_t ring_write_through;
    int32_t request_scale; /* a request wants (1..24) x this many tokens (long requests fill long rings); 0 = 1 */
    int32_t small_every;   /* every this many steps, a step of at most two rows (0: none) */
    uint64_t seed;
    /* Optional (may be NULL): receives at the end the states of the requests still live, as
     * [num_slots requests][layers][HV*V*K] doubles indexed by request (zeros for the others), so that
     * runs with the same seed and other strategies can be compared request by request. */
    double *final_states;
} scenario_options;

typedef struct scenario_result {
    double worst_state;  /* largest error as a fraction of SPEC 4's tolerance */
    double worst_output;
    int32_t decode_steps, verify_steps, admitted, retired, forks, padding_rows;
    int32_t verify_steps_of_max_tokens; /* verifies of max_tokens tokens */
    int32_t buckets_seen;  /* distinct buckets used */
    int32_t largest_bucket;
    int32_t accepted_zero, accepted_full;
    double rms_vs_exact; /* at the end: RMS of (state - never-rounded float64 state) / RMS of the latter */
    /* Ring strategy: write-backs, counted per request (the scenario's steps and checks cover every layer,
     * so every layer's ring holds the same number of records), and what the rings held. */
    int32_t ring_capacity;     /* the engine's: max(ring_length, max_tokens) */
    gdn_verify_strategy strategy; /* the one the engine ran (AUTO resolved) */
    int32_t ring_flush_decode; /* a decode whose ring would hold ring_length records (h + 1 >= L) */
    int32_t ring_flush_verify; /* a verify that did not fit (h + T > capacity), not a fork */
    int32_t ring_flush_fork;   /* a fork (write slot != read slot) of a request with records (h > 0) */
    int32_t ring_flush_read;   /* a state check (gdn_slot_read_state) that found records */
    int32_t ring_write_throughs; /* a decode in a bucket of at most ring_write_through rows (not a fork) */
    int32_t ring_largest_through_bucket; /* the largest bucket of such a decode */
    int32_t ring_largest;      /* the most records a request held after a step */
    uint64_t ring_positions;   /* bit j: a step wrote a record at ring position j */
    uint64_t ring_flush_depths; /* bit h: a kernel write-back (decode, verify, fork) applied h records */
} scenario_result;

/* Runs the scenario, asserting (Criterion) at every step; returns the statistics. */
scenario_result run_scenario(const scenario_options *options);

/* K = 128 != V = 64 with the L2 norm off and a custom scale: a decode step and a verify + commit on
 * `backend`, outputs and states against the float64 reference. */
void run_odd_geometry_steps(gdn_backend_kind backend);

#endif /* GDN_TESTS_SCENARIO_H */
