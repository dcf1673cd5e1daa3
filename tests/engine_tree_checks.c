/* Per-row token counts and token trees through the engine: see engine_tree_checks.h. */
#include "engine_tree_checks.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "tree_model.h"

enum {
    LAYERS = 2,
    SLOTS = 10,
    STEP_SLOTS = 8,  /* slots 0..7 take part in steps; 8 and 9 never do */
    MAX_BATCH = 8,
    MAXT = 16,
    BATCH = 6,       /* rows of a step: bucket 8, so two bucket padding rows too */
    PAD_ROW = 3,     /* the row with slot -1 */
    GARBAGE = 99,    /* a count or parent the engine must ignore */
};

typedef enum run_mode { RUN_STEP, RUN_LAYERS, RUN_CALLER_WORK } run_mode;

/* The engine and what the model needs of it: parameters, and every slot's state as the engine holds
 * it (read back through the API, so the model starts each round from exactly the engine's state). */
typedef struct fixture {
    gdn_engine *e;
    gdn_backend_kind backend;
    gdn_dtype sdt;
    int32_t HK, HV, K, V;
    double scale;
    int l2norm;
    float *params;         /* [L][2][HV]: A_log then dt_bias */
    size_t elems;          /* HV * V * K */
    double *mirror;        /* [SLOTS][L][elems] */
    unsigned char *idle[SLOTS - STEP_SLOTS]; /* raw pools of the slots in no step */
    double *node_states;   /* model scratch [MAXT][elems] */
    double *node_outs;     /* model scratch [MAXT][HV][V] */
    test_rng rng;
} fixture;

/* One verify step as the test drives it. */
typedef struct tree_step {
    int32_t T, batch;
    int32_t slots[MAX_BATCH];
    int32_t counts[MAX_BATCH];
    int32_t parents[MAX_BATCH * MAXT];
    int use_counts, use_parents;
    int32_t accepted[MAX_BATCH]; /* as written to the accepted buffer: a node with parents, else a count */
    run_mode mode;
} tree_step;

static double *mirror_of(const fixture *f, int32_t slot, int32_t layer)
{
    return f->mirror + ((size_t)slot * LAYERS + (size_t)layer) * f->elems;
}

static void sync_mirror(fixture *f, int32_t slot)
{
    for (int32_t l = 0; l < LAYERS; l++) {
        double *S = test_read_state(f->e, l, slot);
        memcpy(mirror_of(f, slot, l), S, f->elems * sizeof(double));
        free(S);
    }
}

static gdn_engine_config fixture_config(gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype sdt)
{
    gdn_engine_config c = test_config("tiny", LAYERS, sdt, SLOTS, MAX_BATCH, MAXT);
    c.backend = backend;
    c.verify_strategy = strategy;
    c.output_dtype = GDN_DTYPE_F32; /* the model's outputs compared unrounded */
    return c;
}

static void fixture_init(fixture *f, gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype sdt,
                         uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->rng = test_rng_seeded(seed);
    f->backend = backend;
    f->sdt = sdt;
    const gdn_engine_config config = fixture_config(backend, strategy, sdt);
    f->e = test_engine_create(&config, &f->rng, &f->params);
    const gdn_model_config *m = &gdn_engine_get_config(f->e)->model;
    f->HK = m->num_k_heads, f->HV = m->num_v_heads, f->K = m->head_dim_k, f->V = m->head_dim_v;
    f->scale = m->scale, f->l2norm = m->use_qk_l2norm;
    f->elems = test_state_elems(f->e);
    f->mirror = malloc(sizeof(double) * SLOTS * LAYERS * f->elems);
    f->node_states = malloc(sizeof(double) * MAXT * f->elems);
    f->node_outs = malloc(sizeof(double) * MAXT * (size_t)f->HV * (size_t)f->V);
    for (int32_t s = 0; s < SLOTS; s++) {
        int32_t slot = -1;
        cr_assert_eq(gdn_slot_alloc(f->e, &slot), GDN_OK);
        cr_assert_eq(slot, s);
        test_fill_slot_state(f->e, s, &f->rng);
        sync_mirror(f, s);
    }
    for (int32_t s = STEP_SLOTS; s < SLOTS; s++) f->idle[s - STEP_SLOTS] = test_snapshot_pool(f->e, s);
}

static void fixture_free(fixture *f)
{
    gdn_engine_destroy(f->e);
    for (int32_t s = 0; s < SLOTS - STEP_SLOTS; s++) free(f->idle[s]);
    free(f->params), free(f->mirror), free(f->node_states), free(f->node_outs);
}

/* The CUDA kernels may not run counts and trees yet: the whole check skips then, visibly. */
static void begin_or_skip(fixture *f, const gdn_step *step)
{
    const gdn_status status = gdn_engine_begin_step(f->e, step, NULL, NULL);
    if (status == GDN_ENOTSUP && f->backend == GDN_BACKEND_CUDA && (step->token_counts || step->parents))
        cr_skip_test("this build's CUDA kernels do not run per-row token counts and token trees yet");
    cr_assert_eq(status, GDN_OK, "begin_step: %s", gdn_status_name(status));
}

static gdn_step step_desc(const tree_step *ts)
{
    return (gdn_step){
        .kind = GDN_STEP_VERIFY,
        .tokens = ts->T,
        .batch = ts->batch,
        .slots = ts->slots,
        .flags = ts->mode == RUN_CALLER_WORK ? GDN_STEP_CALLER_WORK : 0,
        .token_counts = ts->use_counts ? ts->counts : NULL,
        .parents = ts->use_parents ? ts->parents : NULL,
    };
}

/* Begins the step, writes fresh inputs (kept in in[L]), poisons the outputs and runs every layer the
 * way ts->mode says. */
static void run_tree_step(fixture *f, const tree_step *ts, test_inputs *in)
{
    const gdn_step step = step_desc(ts);
    begin_or_skip(f, &step);
    for (int32_t l = 0; l < LAYERS; l++) {
        test_write_inputs(f->e, l, ts->batch, ts->T, &f->rng, &in[l]);
        test_poison_outputs(f->e, l);
    }
    switch (ts->mode) {
    case RUN_STEP: cr_assert_eq(gdn_engine_run_step(f->e, NULL), GDN_OK); break;
    case RUN_LAYERS:
        for (int32_t l = LAYERS - 1; l >= 0; l--) cr_assert_eq(gdn_engine_run_layer(f->e, l, NULL), GDN_OK);
        break;
    case RUN_CALLER_WORK:
        cr_assert_eq(gdn_engine_enqueue_rows(f->e, NULL), GDN_OK);
        for (int32_t l = 0; l < LAYERS; l++) cr_assert_eq(gdn_engine_enqueue_layer(f->e, l, NULL), GDN_OK);
        break;
    }
}

static void commit_tree_step(fixture *f, const tree_step *ts)
{
    test_set_accepted(f->e, ts->accepted, ts->batch);
    const gdn_status status =
        ts->mode == RUN_CALLER_WORK ? gdn_engine_enqueue_commit(f->e, NULL) : gdn_engine_commit(f->e, NULL);
    cr_assert_eq(status, GDN_OK, "commit: %s", gdn_status_name(status));
}

/* Row i's count (T without counts) and its parents row (NULL: a chain). */
static int32_t count_of(const tree_step *ts, int32_t i) { return ts->use_counts ? ts->counts[i] : ts->T; }
static const int32_t *parents_of(const tree_step *ts, int32_t i)
{
    return ts->use_parents ? ts->parents + (size_t)i * ts->T : NULL;
}
/* The node the row's commit takes (-1: nothing). */
static int32_t accepted_node(const tree_step *ts, int32_t i)
{
    return ts->use_parents ? ts->accepted[i] : ts->accepted[i] - 1;
}

/* The model of row i in layer l: the state after each of its n nodes into node_states, every node's
 * output into node_outs, from the slot's state as the engine holds it. */
static void model_row(fixture *f, const tree_step *ts, const test_inputs *in, int32_t i, int32_t l)
{
    const int32_t T = ts->T, n = count_of(ts, i), HK = f->HK, HV = f->HV, K = f->K, V = f->V;
    const int32_t *par = parents_of(ts, i);
    const float *A_log = f->params + (size_t)l * 2 * HV, *dt_bias = A_log + HV;
    const double *start = mirror_of(f, ts->slots[i], l);
    for (int32_t t = 0; t < n; t++) {
        const int32_t p = par ? par[t] : t - 1;
        double *S = f->node_states + (size_t)t * f->elems;
        memcpy(S, p < 0 ? start : f->node_states + (size_t)p * f->elems, f->elems * sizeof(double));
        const int64_t tok = (int64_t)i * T + t;
        for (int32_t h = 0; h < HV; h++) {
            const int32_t kh = h / (HV / HK);
            tree_model_token(K, V, S + (size_t)h * V * K, in->q + (tok * HK + kh) * K, in->k + (tok * HK + kh) * K,
                             in->v + (tok * HV + h) * V, in->a[tok * HV + h], in->b[tok * HV + h], A_log[h], dt_bias[h],
                             f->scale, f->l2norm, f->node_outs + ((size_t)t * HV + h) * V);
        }
    }
}

/* Worst error over a step, as a fraction of SPEC 4's tolerance. */
typedef struct worst {
    double out, state;
} worst;

/*
 * Checks a run (and committed) step against the model: outputs of every node of every layer, zeros
 * past each count and in the padding row; each row's committed state; slots out of the step and the
 * idle slots unchanged; no device error. Then takes the engine's states as the model's next start.
 */
static void check_step(fixture *f, const tree_step *ts, const test_inputs *in, worst *w, const char *what)
{
    const gdn__tolerance tol = gdn__spec4_tolerance(f->sdt);
    const size_t row_out = (size_t)f->HV * (size_t)f->V;
    double *expected = malloc(sizeof(double) * MAX_BATCH * LAYERS * f->elems);
    for (int32_t l = 0; l < LAYERS; l++) {
        double *out = test_read_outputs(f->e, l, ts->batch, ts->T);
        for (int32_t i = 0; i < ts->batch; i++) {
            const int live = ts->slots[i] >= 0;
            const int32_t n = live ? count_of(ts, i) : 0;
            if (live) {
                model_row(f, ts, &in[l], i, l);
                const int32_t node = accepted_node(ts, i);
                memcpy(expected + ((size_t)i * LAYERS + l) * f->elems,
                       node < 0 ? mirror_of(f, ts->slots[i], l) : f->node_states + (size_t)node * f->elems,
                       f->elems * sizeof(double));
            }
            for (int32_t t = 0; t < ts->T; t++) {
                const double *got = out + ((size_t)i * ts->T + t) * row_out;
                if (t >= n) {
                    for (size_t e = 0; e < row_out; e++)
                        cr_assert_eq(got[e], 0.0, "%s: layer %d row %d token %d (past n = %d) is not zero", what, l, i,
                                     t, n);
                    continue;
                }
                const double r = test_error_ratio(got, f->node_outs + (size_t)t * row_out, row_out, tol.out_abs,
                                                  tol.out_rel);
                cr_assert_leq(r, 1.0, "%s: layer %d row %d node %d output at %.3g x tolerance", what, l, i, t, r);
                if (r > w->out) w->out = r;
            }
        }
        free(out);
    }
    cr_assert_eq(gdn_engine_check_device_error(f->e, NULL), GDN_OK, "%s raised the device error flag", what);

    /* Committed states, then the slots out of the step. */
    uint8_t in_step[SLOTS] = {0};
    for (int32_t i = 0; i < ts->batch; i++) {
        if (ts->slots[i] < 0) continue;
        in_step[ts->slots[i]] = 1;
        for (int32_t l = 0; l < LAYERS; l++) {
            double *got = test_read_state(f->e, l, ts->slots[i]);
            const double *want = expected + ((size_t)i * LAYERS + l) * f->elems;
            if (accepted_node(ts, i) < 0) {
                cr_assert_eq(memcmp(got, want, f->elems * sizeof(double)), 0,
                             "%s: row %d accepted nothing, but its slot changed in layer %d", what, i, l);
            } else {
                const double r = test_error_ratio(got, want, f->elems, tol.state_abs, tol.state_rel);
                cr_assert_leq(r, 1.0, "%s: layer %d row %d node %d state at %.3g x tolerance", what, l, i,
                              accepted_node(ts, i), r);
                if (r > w->state) w->state = r;
            }
            free(got);
        }
    }
    for (int32_t s = 0; s < STEP_SLOTS; s++) {
        if (in_step[s]) continue;
        for (int32_t l = 0; l < LAYERS; l++) {
            double *got = test_read_state(f->e, l, s);
            cr_assert_eq(memcmp(got, mirror_of(f, s, l), f->elems * sizeof(double)), 0,
                         "%s: slot %d is in no row but changed in layer %d", what, s, l);
            free(got);
        }
    }
    for (int32_t s = STEP_SLOTS; s < SLOTS; s++) {
        unsigned char *now = test_snapshot_pool(f->e, s);
        cr_assert_eq(memcmp(now, f->idle[s - STEP_SLOTS], LAYERS * test_state_bytes(f->e)), 0,
                     "%s: idle slot %d's pool changed", what, s);
        free(now);
    }
    for (int32_t s = 0; s < STEP_SLOTS; s++) sync_mirror(f, s);
    free(expected);
}

/* Rows over a random choice of the step slots, PAD_ROW a padding row carrying garbage. */
static void random_rows(fixture *f, tree_step *ts)
{
    int32_t order[STEP_SLOTS];
    for (int32_t s = 0; s < STEP_SLOTS; s++) order[s] = s;
    for (int32_t s = STEP_SLOTS - 1; s > 0; s--) {
        const int32_t j = test_rng_below(&f->rng, s + 1), x = order[s];
        order[s] = order[j], order[j] = x;
    }
    ts->batch = BATCH;
    for (int32_t i = 0; i < BATCH; i++) ts->slots[i] = i == PAD_ROW ? -1 : order[i];
}

/* Random counts (row 0: 1, row 1: T) and trees; garbage for the padding row and past each count. */
static void random_counts_and_trees(fixture *f, tree_step *ts)
{
    for (int32_t i = 0; i < ts->batch; i++) {
        int32_t *par = ts->parents + (size_t)i * ts->T;
        for (int32_t t = 0; t < ts->T; t++) par[t] = GARBAGE;
        if (ts->slots[i] < 0) {
            ts->counts[i] = 0; /* outside 1..T: ignored on a padding row */
            continue;
        }
        ts->counts[i] = i == 0 ? 1 : i == 1 ? ts->T : 1 + test_rng_below(&f->rng, ts->T);
        tree_random(&f->rng, count_of(ts, i), par);
    }
}

void engine_tree_check_random(gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype sdt, uint64_t seed)
{
    fixture f;
    fixture_init(&f, backend, strategy, sdt, seed);
    worst w = {0, 0};
    test_inputs in[LAYERS];
    tree_step ts;
    char what[96];

    /* Trees with counts, every node index accepted in turn (node round % (n + 1) - 1). */
    for (int32_t round = 0; round <= MAXT; round++) {
        memset(&ts, 0, sizeof ts);
        ts.T = MAXT, ts.use_counts = 1, ts.use_parents = 1, ts.mode = (run_mode)(round % 3);
        random_rows(&f, &ts);
        random_counts_and_trees(&f, &ts);
        for (int32_t i = 0; i < ts.batch; i++) ts.accepted[i] = ts.slots[i] < 0 ? GARBAGE : round % (ts.counts[i] + 1) - 1;
        snprintf(what, sizeof what, "trees with counts, round %d", round);
        run_tree_step(&f, &ts, in);
        commit_tree_step(&f, &ts);
        check_step(&f, &ts, in, &w, what);
        for (int32_t l = 0; l < LAYERS; l++) test_inputs_free(&in[l]);
    }
    /* Trees without counts (every row runs T nodes), then counts alone (chains; accepted holds a
     * count), each with a random T. */
    for (int32_t round = 0; round < 6; round++) {
        memset(&ts, 0, sizeof ts);
        ts.T = 1 + test_rng_below(&f.rng, MAXT);
        ts.use_parents = round < 3, ts.use_counts = round >= 3, ts.mode = (run_mode)(round % 3);
        random_rows(&f, &ts);
        random_counts_and_trees(&f, &ts);
        for (int32_t i = 0; i < ts.batch; i++) {
            const int32_t n = count_of(&ts, i);
            ts.accepted[i] = ts.slots[i] < 0 ? GARBAGE : ts.use_parents ? test_rng_below(&f.rng, n + 1) - 1 : test_rng_below(&f.rng, n + 1);
        }
        snprintf(what, sizeof what, "%s, round %d (T = %d)", ts.use_parents ? "trees without counts" : "counts alone",
                 round, ts.T);
        run_tree_step(&f, &ts, in);
        commit_tree_step(&f, &ts);
        check_step(&f, &ts, in, &w, what);
        for (int32_t l = 0; l < LAYERS; l++) test_inputs_free(&in[l]);
    }
    /* A plain decode step after them: one token on each row, the state advanced in place. */
    memset(&ts, 0, sizeof ts);
    ts.T = 1;
    random_rows(&f, &ts);
    for (int32_t i = 0; i < ts.batch; i++) ts.accepted[i] = 1; /* a decode advances by its token */
    const gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = ts.batch, .slots = ts.slots};
    cr_assert_eq(gdn_engine_begin_step(f.e, &decode, NULL, NULL), GDN_OK);
    for (int32_t l = 0; l < LAYERS; l++) {
        test_write_inputs(f.e, l, ts.batch, 1, &f.rng, &in[l]);
        test_poison_outputs(f.e, l);
    }
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_OK);
    check_step(&f, &ts, in, &w, "the decode step after the trees");
    for (int32_t l = 0; l < LAYERS; l++) test_inputs_free(&in[l]);

    cr_log_info("engine trees, %s backend, strategy %d, %s state: worst output %.1f%%, state %.1f%% of tolerance",
                backend == GDN_BACKEND_CUDA ? "CUDA" : "CPU", strategy, sdt == GDN_DTYPE_BF16 ? "bf16" : "f32",
                100 * w.out, 100 * w.state);
    fixture_free(&f);
}

/* ---------------------------------------------------------------------------------------------- */

/* Every slot's state as the API reads it (pending work written back), all layers, raw bytes. */
static void assert_states_match(fixture *a, fixture *b, const char *what)
{
    for (int32_t s = 0; s < SLOTS; s++) {
        unsigned char *sa = test_snapshot_slot(a->e, s), *sb = test_snapshot_slot(b->e, s);
        cr_assert_eq(memcmp(sa, sb, LAYERS * test_state_bytes(a->e)), 0, "%s: slot %d differs", what, s);
        free(sa), free(sb);
    }
}

void engine_tree_check_chain_is_chain(gdn_backend_kind backend, gdn_verify_strategy strategy, gdn_dtype sdt,
                                      uint64_t seed)
{
    fixture f[2]; /* 0: chains (run_step, counts), 1: chain trees (caller work, nodes) */
    fixture_init(&f[0], backend, strategy, sdt, seed);
    fixture_init(&f[1], backend, strategy, sdt, seed);
    test_rng pick = test_rng_seeded(seed * 7 + 3);
    for (int32_t round = 0; round < 4; round++) {
        tree_step ts[2];
        memset(ts, 0, sizeof ts);
        ts[0].T = round == 0 ? MAXT : 2 + test_rng_below(&pick, MAXT - 1);
        ts[0].use_counts = round % 2 == 0; /* counts, then parents alone against the plain step */
        ts[0].batch = BATCH;
        for (int32_t i = 0; i < BATCH; i++) {
            ts[0].slots[i] = i == PAD_ROW ? -1 : (i + round) % STEP_SLOTS;
            ts[0].counts[i] = i == 0 ? 1 : 1 + test_rng_below(&pick, ts[0].T);
            for (int32_t t = 0; t < ts[0].T; t++) ts[0].parents[i * ts[0].T + t] = t - 1;
            ts[0].accepted[i] = test_rng_below(&pick, count_of(&ts[0], i) + 1); /* a count */
        }
        ts[1] = ts[0];
        ts[1].use_parents = 1, ts[1].mode = RUN_CALLER_WORK;
        for (int32_t i = 0; i < BATCH; i++) ts[1].accepted[i] = ts[0].accepted[i] - 1; /* the same, as a node */
        test_inputs in[2][LAYERS];
        for (int k = 0; k < 2; k++) run_tree_step(&f[k], &ts[k], in[k]);
        char what[64];
        snprintf(what, sizeof what, "round %d (T = %d, %s)", round, ts[0].T, ts[0].use_counts ? "counts" : "no counts");
        test_assert_twins_match(f[0].e, f[1].e, BATCH, ts[0].T, round);
        for (int k = 0; k < 2; k++) commit_tree_step(&f[k], &ts[k]);
        test_assert_twins_match(f[0].e, f[1].e, BATCH, ts[0].T, round);
        assert_states_match(&f[0], &f[1], what);
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(gdn_engine_check_device_error(f[k].e, NULL), GDN_OK);
            for (int32_t l = 0; l < LAYERS; l++) test_inputs_free(&in[k][l]);
        }
    }
    fixture_free(&f[0]), fixture_free(&f[1]);
}

/* ---------------------------------------------------------------------------------------------- */

/* What a refused begin_step must leave as it was. */
typedef struct engine_snapshot {
    unsigned char *pools[SLOTS];
    int32_t accepted[MAX_BATCH];
    int32_t bucket;
} engine_snapshot;

static void snapshot_take(fixture *f, engine_snapshot *snap)
{
    for (int32_t s = 0; s < SLOTS; s++) snap->pools[s] = test_snapshot_pool(f->e, s);
    cr_assert_eq(gdn_engine_download(f->e, snap->accepted, gdn_engine_accepted(f->e), sizeof snap->accepted, NULL),
                 GDN_OK);
    cr_assert_eq(gdn_engine_synchronize(f->e, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_step_rows(f->e, NULL, NULL, &snap->bucket), GDN_OK);
}

static void snapshot_assert_same(fixture *f, const engine_snapshot *before, const char *what)
{
    engine_snapshot now;
    snapshot_take(f, &now);
    for (int32_t s = 0; s < SLOTS; s++) {
        cr_assert_eq(memcmp(now.pools[s], before->pools[s], LAYERS * test_state_bytes(f->e)), 0,
                     "%s changed slot %d's pool", what, s);
        free(now.pools[s]);
    }
    cr_assert_eq(memcmp(now.accepted, before->accepted, sizeof now.accepted), 0, "%s changed the accepted buffer", what);
    cr_assert_eq(now.bucket, before->bucket, "%s changed the current step", what);
}

/* begin_step of `step` returns `expected` and changes nothing. */
static void assert_refused(fixture *f, const gdn_step *step, gdn_status expected, const engine_snapshot *before,
                           const char *what)
{
    const gdn_status status = gdn_engine_begin_step(f->e, step, NULL, NULL);
    cr_assert_eq(status, expected, "%s: GDN_%s, expected GDN_%s", what, gdn_status_name(status),
                 gdn_status_name(expected));
    snapshot_assert_same(f, before, what);
}

/* An engine with the mixer's gated norm runs a verify with counts and one with a tree (their numbers:
 * test_op_mixer and test_gpu_mixer), and a plain verify, under every strategy. */
static void check_mixer_steps(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    gdn_engine_config c = fixture_config(backend, strategy, GDN_DTYPE_F32);
    c.model.head_dim_k = c.model.head_dim_v = 128; /* the CUDA mixer kernel's key head size */
    c.mixer.use_norm = 1;
    test_rng rng = test_rng_seeded(seed);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t slots[2], counts[2] = {1, 2}, parents[4] = {-1, 0, -1, -1}, accepted[2] = {1, 2}, nodes[2] = {1, 0};
    for (int k = 0; k < 2; k++) cr_assert_eq(gdn_slot_alloc(e, &slots[k]), GDN_OK);
    gdn_step step = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 2, .slots = slots, .token_counts = counts};
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK, "the mixer with counts");
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    test_set_accepted(e, accepted, 2);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
    step.token_counts = NULL, step.parents = parents;
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK, "the mixer with a tree");
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    test_set_accepted(e, nodes, 2);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
    step.parents = NULL;
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    test_set_accepted(e, accepted, 2);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_check_device_error(e, NULL), GDN_OK);
    gdn_engine_destroy(e);
}

void engine_tree_check_refusals(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    fixture f;
    fixture_init(&f, backend, strategy, GDN_DTYPE_F32, seed);
    tree_step ts;
    memset(&ts, 0, sizeof ts);
    ts.T = 6, ts.use_counts = 1, ts.use_parents = 1, ts.mode = RUN_STEP;
    random_rows(&f, &ts);
    random_counts_and_trees(&f, &ts);
    for (int32_t i = 0; i < ts.batch; i++) ts.accepted[i] = ts.slots[i] < 0 ? GARBAGE : count_of(&ts, i) - 1;
    test_inputs in[LAYERS];
    run_tree_step(&f, &ts, in);
    test_set_accepted(f.e, ts.accepted, ts.batch);
    engine_snapshot before;
    snapshot_take(&f, &before);

    /* The live row 1 (n = T) carries each bad value in turn; the rest of the step is valid. */
    const int32_t T = ts.T;
    tree_step bad = ts;
    gdn_step step = step_desc(&bad);
    bad.counts[1] = 0;
    assert_refused(&f, &step, GDN_ESTEP_TOKENS, &before, "a count of 0");
    bad.counts[1] = T + 1;
    assert_refused(&f, &step, GDN_ESTEP_TOKENS, &before, "a count of T + 1");
    bad.counts[1] = T;
    bad.parents[1 * T + 2] = -2;
    assert_refused(&f, &step, GDN_ESTEP_PARENTS, &before, "a parent of -2");
    bad.parents[1 * T + 2] = 2;
    assert_refused(&f, &step, GDN_ESTEP_PARENTS, &before, "a parent of t");
    bad.parents[1 * T + 2] = T - 1;
    assert_refused(&f, &step, GDN_ESTEP_PARENTS, &before, "a parent after t");
    bad.parents[1 * T + 2] = ts.parents[1 * T + 2];
    step.flags = GDN_STEP_CALLER_WORK;
    bad.counts[1] = 0;
    assert_refused(&f, &step, GDN_ESTEP_TOKENS, &before, "a bad count in a caller-work step");
    bad.counts[1] = T;
    const int32_t ones[MAX_BATCH] = {1, 1, 1, 1, 1, 1, 1, 1}, roots[MAX_BATCH] = {-1, -1, -1, -1, -1, -1, -1, -1};
    gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = ts.batch, .slots = ts.slots, .token_counts = ones};
    assert_refused(&f, &decode, GDN_ESTEP_TOKENS, &before, "counts on a decode step");
    decode.token_counts = NULL, decode.parents = roots;
    assert_refused(&f, &decode, GDN_ESTEP_PARENTS, &before, "parents on a decode step");
    decode.flags = GDN_STEP_CALLER_WORK;
    assert_refused(&f, &decode, GDN_ESTEP_PARENTS, &before, "parents on a caller-work decode step");
    for (int32_t s = 0; s < SLOTS; s++) free(before.pools[s]);

    /* The step the refusals found is still the current one: its commit lands as the model says. */
    const gdn_status status = gdn_engine_commit(f.e, NULL);
    cr_assert_eq(status, GDN_OK, "commit after the refusals: %s", gdn_status_name(status));
    worst w = {0, 0};
    check_step(&f, &ts, in, &w, "the tree committed after the refusals");
    for (int32_t l = 0; l < LAYERS; l++) test_inputs_free(&in[l]);
    fixture_free(&f);
    check_mixer_steps(backend, strategy, seed + 1);
}
