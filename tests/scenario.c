/* Random multi-step scenario against a float64 host reference: see scenario.h. */
#include "scenario.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype_convert.h"
#include "support.h"

typedef struct request {
    int live;
    int32_t slot;
    int32_t remaining;        /* tokens still wanted */
    double *state;            /* [L][HV*V*K]: the reference, rounded where the engine stores */
    double *exact;            /* [L][HV*V*K]: the same tokens in float64, never rounded */
    int32_t npending;         /* fold: accepted tokens not yet folded into `state`; ring: the ring's
                               * records (every token since the checkpoint `state`), h */
    test_inputs *pending_in;  /* fold, ring: [L] one-row inputs of those tokens */
} request;

/* Appends the first `count` tokens of `row` of src to the one-row dst (zeroed: empty). */
static void append_row_tokens(const gdn_engine_config *c, const test_inputs *src, int32_t row, int32_t count,
                              test_inputs *dst)
{
    const size_t qk = (size_t)c->model.num_k_heads * (size_t)c->model.head_dim_k;
    const size_t vv = (size_t)c->model.num_v_heads * (size_t)c->model.head_dim_v, g = (size_t)c->model.num_v_heads;
    const size_t old = (size_t)dst->T, n = old + (size_t)count, first = (size_t)row * (size_t)src->T;
    const size_t alloc = n > 0 ? n : 1;
    dst->B = 1, dst->T = (int32_t)n;
    dst->q = realloc(dst->q, sizeof(double) * alloc * qk), dst->k = realloc(dst->k, sizeof(double) * alloc * qk);
    dst->v = realloc(dst->v, sizeof(double) * alloc * vv);
    dst->a = realloc(dst->a, sizeof(double) * alloc * g), dst->b = realloc(dst->b, sizeof(double) * alloc * g);
    memcpy(dst->q + old * qk, src->q + first * qk, sizeof(double) * (size_t)count * qk);
    memcpy(dst->k + old * qk, src->k + first * qk, sizeof(double) * (size_t)count * qk);
    memcpy(dst->v + old * vv, src->v + first * vv, sizeof(double) * (size_t)count * vv);
    memcpy(dst->a + old * g, src->a + first * g, sizeof(double) * (size_t)count * g);
    memcpy(dst->b + old * g, src->b + first * g, sizeof(double) * (size_t)count * g);
}

static void clear_pending(request *r, int32_t layers)
{
    if (r->pending_in)
        for (int32_t l = 0; l < layers; l++) test_inputs_free(&r->pending_in[l]);
    free(r->pending_in);
    r->pending_in = NULL;
    r->npending = 0;
}

/* Folds the request's pending tokens of `layer` into S (float64, no rounding). */
static void fold_pending(const gdn_engine_config *c, const request *r, int32_t layer, const float *params, double *S)
{
    if (r->npending == 0) return;
    const int32_t HV = c->model.num_v_heads;
    test_reference_row(c, &r->pending_in[layer], 0, r->npending, params + (size_t)layer * 2 * HV,
                       params + (size_t)layer * 2 * HV + HV, S, NULL);
}

/* Appends the first `count` tokens of row `row` of this step's inputs (every layer) to r's pending ones. */
static void append_pending(const gdn_engine_config *c, request *r, const test_inputs *in, int32_t row, int32_t count,
                           int32_t layers)
{
    if (count <= 0) return;
    if (!r->pending_in) r->pending_in = calloc((size_t)layers, sizeof *r->pending_in);
    for (int32_t l = 0; l < layers; l++) append_row_tokens(c, &in[l], row, count, &r->pending_in[l]);
    r->npending += count;
}

static double out_abs_tol(gdn_dtype s) { return gdn__spec4_tolerance(s).out_abs; }
static double out_rel_tol(gdn_dtype s) { return gdn__spec4_tolerance(s).out_rel; }
static double state_abs_tol(gdn_dtype s) { return gdn__spec4_tolerance(s).state_abs; }
static double state_rel_tol(gdn_dtype s) { return gdn__spec4_tolerance(s).state_rel; }

static void admit(gdn_engine *e, request *r, test_rng *rng, int32_t layers, size_t elems, int32_t request_scale)
{
    if (gdn_slot_alloc(e, &r->slot) != GDN_OK) return;
    r->live = 1;
    r->remaining = (1 + test_rng_below(rng, 24)) * (request_scale > 0 ? request_scale : 1);
    r->state = calloc(elems * (size_t)layers, sizeof(double));
    r->exact = calloc(elems * (size_t)layers, sizeof(double));
    if (test_rng_uniform(rng) < 0.25) {
        cr_assert_eq(gdn_slot_reset(e, r->slot, NULL), GDN_OK);
        return;
    }
    test_fill_slot_state(e, r->slot, rng);
    for (int32_t l = 0; l < layers; l++) {
        double *s = test_read_state(e, l, r->slot);
        memcpy(r->state + elems * (size_t)l, s, elems * sizeof(double));
        memcpy(r->exact + elems * (size_t)l, s, elems * sizeof(double));
        free(s);
    }
}

scenario_result run_scenario(const scenario_options *o)
{
    scenario_result result;
    memset(&result, 0, sizeof result);
    test_rng rng = test_rng_seeded(o->seed);
    gdn_engine_config config = test_config(o->preset, o->layers, o->state_dtype, o->num_slots, o->max_batch, o->max_tokens);
    config.backend = o->backend;
    config.graph_mode = o->graph_mode;
    config.verify_strategy = o->strategy;
    config.ring_length = o->ring_length;
    config.ring_write_through = o->ring_write_through ? o->ring_write_through : -1;
    const int32_t check_every = o->check_every > 0 ? o->check_every : 1;
    float *params = NULL;
    gdn_engine *e = test_engine_create(&config, &rng, &params);
    config = *gdn_engine_get_config(e);
    /* the strategy the engine runs (AUTO resolved) */
    const int fold = config.verify_strategy == GDN_VERIFY_FOLD, ring = config.verify_strategy == GDN_VERIFY_RING;
    result.strategy = config.verify_strategy;
    const int32_t L = o->layers, HV = config.model.num_v_heads, V = config.model.head_dim_v;
    /* Ring: a decode writes back when its ring would hold ring_length records, a verify when its T
     * records do not fit the capacity. */
    const int32_t ring_length = config.ring_length;
    const int32_t ring_capacity = config.ring_length > config.max_tokens ? config.ring_length : config.max_tokens;
    if (ring) result.ring_capacity = ring_capacity;
    const size_t elems = test_state_elems(e), out_per_token = (size_t)HV * (size_t)V;
    const int32_t max_requests = o->num_slots;
    request *reqs = calloc((size_t)max_requests, sizeof *reqs);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)o->max_batch), *writes = malloc(sizeof(int32_t) * (size_t)o->max_batch);
    int32_t *row_req = malloc(sizeof(int32_t) * (size_t)o->max_batch), *accepted = malloc(sizeof(int32_t) * (size_t)o->max_batch);
    int32_t *forked_from = malloc(sizeof(int32_t) * (size_t)o->max_batch); /* the row's old slot, or -1 */
    double *expected_out = malloc(sizeof(double) * out_per_token * GDN_MAX_TOKENS);
    double *scratch = malloc(sizeof(double) * elems), *current = malloc(sizeof(double) * elems);
    uint8_t *row_flush = calloc((size_t)o->max_batch, 1); /* ring: the row writes the state back */
    uint8_t bucket_seen[4096] = {0};

    const int32_t steps = test_scaled_steps(o->steps);
    for (int32_t step = 0; step < steps; step++) {
        /* Arrivals: bursts, so the batch grows and shrinks through the buckets. */
        const int busy = (step / 25) % 2 == 0;
        int32_t arrivals = test_rng_below(&rng, busy ? 4 : 2), live = 0;
        for (int32_t i = 0; i < max_requests; i++) live += reqs[i].live;
        if (live + arrivals < o->min_live) arrivals = o->min_live - live;
        for (int32_t a = 0; a < arrivals; a++)
            for (int32_t i = 0; i < max_requests; i++)
                if (!reqs[i].live) {
                    admit(e, &reqs[i], &rng, L, elems, o->request_scale);
                    result.admitted += reqs[i].live;
                    break;
                }

        /* Rows: a random subset of live requests in random order, with padding rows and forks. */
        int32_t n = 0;
        const int32_t batch_cap = o->small_every > 0 && step % o->small_every == 0 ? 2 : o->max_batch;
        for (int32_t i = 0; i < max_requests && n < batch_cap; i++) {
            if (!reqs[i].live || test_rng_uniform(&rng) < 0.2) continue;
            if (n < batch_cap - 1 && test_rng_uniform(&rng) < 0.08) { /* explicit padding row */
                rows[n] = -1, writes[n] = -1, row_req[n] = -1;
                n++, result.padding_rows++;
            }
            rows[n] = reqs[i].slot, writes[n] = reqs[i].slot, row_req[n] = i;
            n++;
        }
        for (int32_t i = n - 1; i > 0; i--) { /* shuffle rows */
            const int32_t j = test_rng_below(&rng, i + 1);
            int32_t t = rows[i]; rows[i] = rows[j], rows[j] = t;
            t = writes[i]; writes[i] = writes[j], writes[j] = t;
            t = row_req[i]; row_req[i] = row_req[j], row_req[j] = t;
        }
        for (int32_t i = 0; i < n; i++) {
            forked_from[i] = -1;
            if (rows[i] < 0 || test_rng_uniform(&rng) > 0.1) continue;
            int32_t fresh;
            if (gdn_slot_alloc(e, &fresh) != GDN_OK) continue;
            writes[i] = fresh, forked_from[i] = rows[i];
            result.forks++;
        }

        const int verify = o->max_tokens > 1 && test_rng_uniform(&rng) < 0.5;
        const int32_t T = verify ? 2 + test_rng_below(&rng, o->max_tokens - 1) : 1;
        test_inputs *in = calloc((size_t)L, sizeof *in);
        for (int32_t l = 0; l < L; l++) {
            test_write_inputs(e, l, n, T, &rng, &in[l]);
            test_poison_outputs(e, l);
        }
        gdn_step st = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = n, .slots = rows,
                       .write_slots = writes};
        int32_t bucket = 0;
        gdn_status status = gdn_engine_begin_step(e, &st, NULL, &bucket);
        cr_assert_eq(status, GDN_OK, "step %d: begin_step %s", step, gdn_status_name(status));
        if (bucket < 4096) result.buckets_seen += !bucket_seen[bucket], bucket_seen[bucket] = 1;
        if (bucket > result.largest_bucket) result.largest_bucket = bucket;
        status = gdn_engine_run_step(e, NULL);
        cr_assert_eq(status, GDN_OK, "step %d: run_step %s (%s)", step, gdn_status_name(status), gdn_engine_last_error(e));
        /* Ring: which rows write the state back (the same decision in every layer). */
        for (int32_t i = 0; i < n && ring; i++) {
            if (rows[i] < 0) continue;
            const int32_t h = reqs[row_req[i]].npending;
            const int fork = forked_from[i] >= 0;
            const int through = !verify && bucket <= config.ring_write_through; /* resolved: -1 never */
            row_flush[i] = (uint8_t)(fork || through || (verify ? h + T > ring_capacity : h + 1 >= ring_length));
            if (row_flush[i] && h < 64) result.ring_flush_depths |= 1ull << h;
            if (fork) result.ring_flush_fork += h > 0;
            else if (through) {
                result.ring_write_throughs++;
                if (bucket > result.ring_largest_through_bucket) result.ring_largest_through_bucket = bucket;
            }
            else if (row_flush[i] && verify) result.ring_flush_verify++;
            else if (row_flush[i]) result.ring_flush_decode++;
            /* Records written: a verify's T (tentatively) after the ring's records, or from 0 after its
             * write-back; a decode's one unless it writes back. */
            const int32_t first = row_flush[i] ? 0 : h, count = verify ? T : !row_flush[i];
            for (int32_t j = first; j < first + count && j < 64; j++) result.ring_positions |= 1ull << j;
        }
        if (verify) {
            for (int32_t i = 0; i < n; i++) {
                const double u = test_rng_uniform(&rng);
                accepted[i] = u < 0.2 ? 0 : (u < 0.4 ? T : test_rng_below(&rng, T + 1));
                if (rows[i] >= 0) result.accepted_zero += accepted[i] == 0, result.accepted_full += accepted[i] == T;
            }
            test_set_accepted(e, accepted, n);
            cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
            result.verify_steps++;
            result.verify_steps_of_max_tokens += T == o->max_tokens;
        } else {
            result.decode_steps++;
        }

        /* Check every row: outputs of every token, and the reference advanced by what it kept. */
        for (int32_t l = 0; l < L; l++) {
            double *out = test_read_outputs(e, l, n, T);
            for (int32_t i = 0; i < n; i++) {
                double *got = out + (size_t)i * T * out_per_token;
                if (rows[i] < 0) {
                    for (size_t j = 0; j < (size_t)T * out_per_token; j++)
                        cr_assert_eq(got[j], 0.0, "step %d: padding row %d output", step, i);
                    continue;
                }
                request *r = &reqs[row_req[i]];
                const int32_t keep = verify ? accepted[i] : 1;
                const float *A_log = params + (size_t)l * 2 * HV, *dt_bias = A_log + HV;
                double *S = r->state + elems * (size_t)l;
                if (ring) { /* the current state: the checkpoint with the ring's records, never rounded */
                    memcpy(current, S, elems * sizeof(double));
                    fold_pending(&config, r, l, params, current);
                } else {
                    fold_pending(&config, r, l, params, S); /* fold: the kernel folds before its own tokens */
                }
                const double *before = ring ? current : S;
                test_reference_row(&config, &in[l], i, keep, A_log, dt_bias, r->exact + elems * (size_t)l, NULL);
                memcpy(scratch, before, elems * sizeof(double));
                test_reference_row(&config, &in[l], i, T, params + (size_t)l * 2 * HV, params + (size_t)l * 2 * HV + HV,
                                   scratch, expected_out);
                test_round_to(expected_out, (size_t)T * out_per_token, config.output_dtype);
                const double ratio = test_error_ratio(got, expected_out, (size_t)T * out_per_token,
                                                      out_abs_tol(o->state_dtype), out_rel_tol(o->state_dtype));
                cr_assert_leq(ratio, 1.0, "step %d layer %d row %d: outputs at %.0f%% of tolerance", step, l, i, 100 * ratio);
                if (ratio > result.worst_output) result.worst_output = ratio;
                if (ring) { /* the pool changes only at a write-back: a decode's state after its token, a verify's
                             * before its own tokens (which become the ring's records) */
                    if (row_flush[i]) {
                        if (!verify) test_reference_row(&config, &in[l], i, 1, A_log, dt_bias, current, NULL);
                        memcpy(S, current, elems * sizeof(double));
                        test_round_to(S, elems, o->state_dtype);
                    }
                } else if (fold && verify) { /* the pool gets the folded state; the accepted tokens stay pending */
                    test_round_to(S, elems, o->state_dtype);
                } else if (keep > 0) { /* the state after `keep` tokens, rounded once where the engine stores it */
                    test_reference_row(&config, &in[l], i, keep, A_log, dt_bias, S, NULL);
                    test_round_to(S, elems, o->state_dtype);
                }
            }
            free(out);
        }
        for (int32_t i = 0; i < n; i++) {
            if (rows[i] < 0) continue;
            request *r = &reqs[row_req[i]];
            const int32_t keep = verify ? accepted[i] : 1;
            if (fold) { /* folded by this step; a verify leaves its accepted tokens pending */
                clear_pending(r, L);
                if (verify) append_pending(&config, r, in, i, keep, L);
            }
            if (ring) { /* a write-back empties the ring; the kept tokens are its new records */
                if (row_flush[i]) clear_pending(r, L);
                if (verify || !row_flush[i]) append_pending(&config, r, in, i, keep, L);
                if (r->npending > result.ring_largest) result.ring_largest = r->npending;
                cr_assert_leq(r->npending, ring_capacity, "the model's ring overflowed");
            }
            if (forked_from[i] >= 0) { /* the request moves to its new slot; the old one retires */
                /* Nothing was committed into the new slot: carry the state over. Not with the ring: a fork
                 * writes the read slot's current state into the write slot whatever is accepted. */
                if (keep == 0 && !ring) {
                    for (int32_t l = 0; l < L; l++) {
                        void *raw = malloc(test_state_bytes(e));
                        cr_assert_eq(gdn_slot_read_state(e, l, r->slot, raw), GDN_OK);
                        cr_assert_eq(gdn_slot_write_state(e, l, writes[i], raw), GDN_OK);
                        free(raw);
                    }
                }
                cr_assert_eq(gdn_slot_free(e, r->slot), GDN_OK);
                r->slot = writes[i];
            }
            r->remaining -= keep;
        }

        /* Every live request's state, every layer, against the reference (fold: reading a state
         * folds its pending tokens first, so the model does too; ring: a read writes the current state
         * back into the pool, rounded, and empties the ring). */
        const int check_now = step % check_every == check_every - 1 || step == steps - 1;
        for (int32_t q = 0; q < max_requests && check_now; q++) {
            if (!reqs[q].live) continue;
            /* The raw pool, before the read: the model's stored state (the fold and ring strategies'
             * pools lag by the pending tokens, and a write-back at another point than the model's shows
             * here as a whole token's difference, not only as rounding). */
            unsigned char *pool = test_snapshot_pool(e, reqs[q].slot);
            for (int32_t l = 0; l < L; l++) {
                const unsigned char *raw = pool + test_state_bytes(e) * (size_t)l;
                for (size_t j = 0; j < elems; j++) scratch[j] = gdn__load_f32(raw, config.state_dtype, (int64_t)j);
                const double ratio = test_error_ratio(scratch, reqs[q].state + elems * (size_t)l, elems,
                                                      state_abs_tol(o->state_dtype), state_rel_tol(o->state_dtype));
                cr_assert_leq(ratio, 1.0, "step %d request %d layer %d (%d pending): raw pool at %.0f%% of tolerance", step, q,
                              l, reqs[q].npending, 100 * ratio);
            }
            free(pool);
            if ((fold || ring) && reqs[q].npending > 0) { /* ring: the read writes the state back */
                result.ring_flush_read += ring;
                for (int32_t l = 0; l < L; l++) {
                    fold_pending(&config, &reqs[q], l, params, reqs[q].state + elems * (size_t)l);
                    test_round_to(reqs[q].state + elems * (size_t)l, elems, o->state_dtype);
                }
                clear_pending(&reqs[q], L);
            }
            for (int32_t l = 0; l < L; l++) {
                double *s = test_read_state(e, l, reqs[q].slot);
                const double ratio = test_error_ratio(s, reqs[q].state + elems * (size_t)l, elems,
                                                      state_abs_tol(o->state_dtype), state_rel_tol(o->state_dtype));
                cr_assert_leq(ratio, 1.0, "step %d request %d layer %d: state at %.0f%% of tolerance", step, q, l, 100 * ratio);
                if (ratio > result.worst_state) result.worst_state = ratio;
                free(s);
            }
        }

        /* Retire finished requests (and a few early, as cancelled ones). */
        for (int32_t q = 0; q < max_requests; q++) {
            if (!reqs[q].live || (reqs[q].remaining > 0 && test_rng_uniform(&rng) > 0.02)) continue;
            cr_assert_eq(gdn_slot_free(e, reqs[q].slot), GDN_OK);
            free(reqs[q].state), free(reqs[q].exact);
            clear_pending(&reqs[q], L);
            memset(&reqs[q], 0, sizeof reqs[q]);
            result.retired++;
        }
        for (int32_t l = 0; l < L; l++) test_inputs_free(&in[l]);
        free(in);
    }
    cr_assert_eq(gdn_engine_check_device_error(e, NULL), GDN_OK);
    /* How far the stored states are from the never-rounded float64 run of the same tokens. */
    double err2 = 0.0, ref2 = 0.0;
    if (o->final_states) memset(o->final_states, 0, sizeof(double) * elems * (size_t)L * (size_t)o->num_slots);
    for (int32_t q = 0; q < max_requests; q++) {
        if (!reqs[q].live) continue;
        for (int32_t l = 0; l < L; l++) {
            double *s = test_read_state(e, l, reqs[q].slot);
            const double *x = reqs[q].exact + elems * (size_t)l;
            if (o->final_states) memcpy(o->final_states + ((size_t)q * (size_t)L + (size_t)l) * elems, s, sizeof(double) * elems);
            for (size_t j = 0; j < elems; j++) err2 += (s[j] - x[j]) * (s[j] - x[j]), ref2 += x[j] * x[j];
            free(s);
        }
    }
    result.rms_vs_exact = ref2 > 0 ? sqrt(err2 / ref2) : 0.0;
    for (int32_t q = 0; q < max_requests; q++) {
        free(reqs[q].state), free(reqs[q].exact);
        clear_pending(&reqs[q], L);
    }
    free(reqs), free(rows), free(writes), free(row_req), free(accepted), free(forked_from), free(expected_out), free(scratch), free(params);
    free(current), free(row_flush);
    gdn_engine_destroy(e);
    return result;
}

/* K != V and the L2 norm off, through a decode step and a verify + commit, against the reference. */
void run_odd_geometry_steps(gdn_backend_kind backend)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 6, 4, 3);
    c.model.head_dim_k = 128, c.model.head_dim_v = 64, c.model.use_qk_l2norm = 0, c.model.scale = 0.05f;
    c.output_dtype = GDN_DTYPE_F32;
    c.backend = backend;
    test_rng rng = test_rng_seeded(77);
    float *params;
    gdn_engine *e = test_engine_create(&c, &rng, &params);
    c = *gdn_engine_get_config(e);
    const size_t elems = test_state_elems(e);
    cr_assert_eq(elems, 4 * 64 * 128);
    int32_t slots[3];
    for (int i = 0; i < 3; i++) {
        gdn_slot_alloc(e, &slots[i]);
        test_fill_slot_state(e, slots[i], &rng);
    }
    const int32_t rows[] = {2, 0};
    for (int verify = 0; verify < 2; verify++) {
        const int32_t T = verify ? 3 : 1, accepted[] = {2, 3};
        double *before[2][2], out[3 * 4 * 64];
        for (int i = 0; i < 2; i++)
            for (int32_t l = 0; l < 2; l++) before[i][l] = test_read_state(e, l, rows[i]);
        test_inputs in[2];
        for (int32_t l = 0; l < 2; l++) test_write_inputs(e, l, 2, T, &rng, &in[l]), test_poison_outputs(e, l);
        test_run_step(e, verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, 2, rows, NULL);
        if (verify) {
            test_set_accepted(e, accepted, 2);
            cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
        }
        for (int32_t l = 0; l < 2; l++) {
            double *o = test_read_outputs(e, l, 2, T);
            for (int i = 0; i < 2; i++) {
                double scratch_state[4 * 64 * 128];
                memcpy(scratch_state, before[i][l], sizeof scratch_state);
                test_reference_row(&c, &in[l], i, T, params + l * 8, params + l * 8 + 4, scratch_state, out);
                const double ratio = test_error_ratio(o + (size_t)i * T * 4 * 64, out, (size_t)T * 4 * 64, 1e-2, 1e-2);
                cr_assert_leq(ratio, 1.0, "layer %d row %d outputs at %.0f%%", l, i, 100 * ratio);
                const int32_t keep = verify ? accepted[i] : 1;
                test_reference_row(&c, &in[l], i, keep, params + l * 8, params + l * 8 + 4, before[i][l], NULL);
                double *now = test_read_state(e, l, rows[i]);
                const double sr = test_error_ratio(now, before[i][l], elems, 1e-2, 1e-2);
                cr_assert_leq(sr, 1.0, "layer %d row %d state at %.0f%%", l, i, 100 * sr);
                free(now), free(before[i][l]);
            }
            free(o);
            test_inputs_free(&in[l]);
        }
    }
    free(params);
    gdn_engine_destroy(e);
}

