/*
 * The serving-loop check (tests/test_serving_loop.c runs it; it was the serving-loop example's own
 * check before the example moved to the public API only): a simulated LLM serving loop driving the
 * GDN layers of a model through gdn-engine, checked against an independent float64 reference.
 *
 * What it shows, in the order a serving engine does it:
 *
 *   1. Create an engine (backend AUTO: CUDA when there is a GPU, else the float64 CPU backend), set
 *      each layer's A_log and dt_bias.
 *   2. Requests arrive at a varying rate. Admitting one takes a state slot (gdn_slot_alloc) and gives
 *      it an initial state: a random one in every layer (gdn_slot_write_state, as a prefill hand-off
 *      would) or zeros (gdn_slot_reset). When every slot is taken, arrivals wait (GDN_ESLOT_EXHAUSTED
 *      is an ordinary answer, not an error).
 *   3. Each step, the scheduler takes up to max_batch live requests, round-robin, as the rows of the
 *      step, and runs either a decode step (T = 1) or a speculative verify step (T = 2..max_tokens).
 *      For every layer it writes q, k, v, a, b into the layer's static input buffers, runs the layer
 *      and reads the output. After a verify step the "sampler" decides how many draft tokens each row
 *      accepts (0..T), writes the counts into the engine's accepted buffer (device memory on CUDA) and
 *      commits them. Requests advance by what they accepted and retire when they have their tokens
 *      (gdn_slot_free). Batch sizes move up and down, so different padding buckets get used.
 *      The verify strategy is the library's default (auto: fold when max_tokens > 1, cache for
 *      max_tokens 1); `--verify cache|fold` forces one. Fold keeps no per-token states: the
 *      accepted tokens are folded into the state by the slot's next kernel, or by a state read.
 *      With `--tree` every verify step is a token tree (gdn_step.token_counts and .parents): each row
 *      drafts a random tree of 1..T nodes, the sampler accepts one node (-1..n-1), and the request
 *      advances by that node's path.
 *   4. Independently of the engine, the example keeps every live request's state of every layer on the
 *      host in float64 and applies the same tokens with the reference (gdn__ref_head), rounding the
 *      state to the pool's dtype exactly where the engine stores it (which depends on the strategy). Every output the engine produced
 *      is compared with the reference; states are compared when a request retires, every few steps,
 *      and at the end, against SPEC section 4's tolerances.
 *
 * Only the check uses library internals (kernels/ref/gdn_ref.h, kernels/dtype_convert.h); everything
 * the serving loop does goes through the public API in gdn/gdn.h.
 *
 *   gdn_serving_loop_check(argc, argv) with the options [--preset tiny|qwen3-next|qwen3.5] [--layers N] [--steps N] [--seed N]
 *                    [--state f32|bf16] [--input bf16|f16] [--output bf16|f32]
 *                    [--backend auto|cpu|cuda] [--max-batch N] [--max-tokens N] [--slots N]
 *                    [--verify auto|cache|fold] [--tree] [--check-every N] [--verbose]
 *
 * Exit status: 0 when every check passed, 1 on a failed check or an API error, 2 on a bad argument.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving_loop_check.h"
#include "kernels/ref/gdn_spec.h"

#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_ref.h"

/* ---------------------------------------------------------------------------------------------- */
/* Errors                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* Any failing call ends the example: a real server would fail the affected requests instead. */
static void die_status(gdn_engine *engine, gdn_status status, const char *what, int line)
{
    fprintf(stderr, "serving_loop_check.c:%d: %s failed: GDN_%s: %s\n", line, what, gdn_status_name(status),
            gdn_status_string(status));
    const char *detail = engine ? gdn_engine_last_error(engine) : "";
    if (detail[0]) fprintf(stderr, "  last CUDA error: %s\n", detail);
    exit(1);
}

#define CHECK(engine, call)                                                                         \
    do {                                                                                            \
        gdn_status status_ = (call);                                                                \
        if (status_ != GDN_OK) die_status((engine), status_, #call, __LINE__);                       \
    } while (0)

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* Random numbers: a small self-contained generator, so a seed gives the same run everywhere        */
/* ---------------------------------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; } /* [0, 1) */

static int rng_int(rng *r, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

static double rng_normal(rng *r) /* Box-Muller */
{
    const double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---------------------------------------------------------------------------------------------- */
/* Options                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef struct options {
    const char *preset;
    int layers, steps, max_batch, max_tokens, slots, check_every, verbose, tree;
    uint64_t seed;
    gdn_dtype state_dtype, input_dtype, output_dtype;
    gdn_backend_kind backend;
    gdn_verify_strategy verify;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gdn-serving-loop [options]\n"
            "  --preset NAME      tiny (default), qwen3-next or qwen3.5\n"
            "  --layers N         GDN layers (default 3)\n"
            "  --steps N          serving steps to simulate (default 96)\n"
            "  --seed N           random seed (default 42)\n"
            "  --state f32|bf16   state pool dtype (default f32)\n"
            "  --input bf16|f16   q, k, v, a, b dtype (default bf16)\n"
            "  --output bf16|f32  output dtype (default bf16)\n"
            "  --backend B        auto (default), cpu or cuda\n"
            "  --max-batch N      most rows in a step (default 16)\n"
            "  --max-tokens N     most tokens in a verify step, 1..%d (default 4)\n"
            "  --slots N          state slots = most live requests (default 1.25 x max-batch)\n"
            "  --verify S         verify strategy: auto (default: fold if max-tokens > 1), cache or fold\n"
            "  --tree             verify steps are token trees (a random tree of 1..T nodes per row)\n"
            "  --check-every N    compare every live state every N steps (default 20, 0: never)\n"
            "  --verbose          one line per step\n",
            GDN_MAX_TOKENS);
}

static int parse_int(const char *flag, const char *text, long lo, long hi, long *out)
{
    char *end = NULL;
    long value = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || value < lo || value > hi) {
        fprintf(stderr, "%s: expected an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, text ? text : "");
        return 0;
    }
    *out = value;
    return 1;
}

static int parse_dtype(const char *flag, const char *text, gdn_dtype *out)
{
    if (text && strcmp(text, "f32") == 0) *out = GDN_DTYPE_F32;
    else if (text && strcmp(text, "bf16") == 0) *out = GDN_DTYPE_BF16;
    else if (text && strcmp(text, "f16") == 0) *out = GDN_DTYPE_F16;
    else {
        fprintf(stderr, "%s: expected f32, bf16 or f16, got '%s'\n", flag, text ? text : "");
        return 0;
    }
    return 1; /* the engine's config validation says which dtype fits which tensor */
}

/* Returns 0 to run, 1 after --help, 2 on a bad argument. */
static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.preset = "tiny", .layers = 3, .steps = 96, .max_batch = 16, .max_tokens = 4,
                   .slots = 0, .check_every = 20, .seed = 42, .state_dtype = GDN_DTYPE_F32,
                   .input_dtype = GDN_DTYPE_BF16, .output_dtype = GDN_DTYPE_BF16,
                   .backend = GDN_BACKEND_AUTO, .verify = GDN_VERIFY_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *arg = i + 1 < argc ? argv[i + 1] : NULL;
        long n = 0;
        int ok = 1, takes_arg = 1;
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(flag, "--verbose") == 0) {
            o->verbose = 1, takes_arg = 0;
        } else if (strcmp(flag, "--tree") == 0) {
            o->tree = 1, takes_arg = 0;
        } else if (strcmp(flag, "--preset") == 0) {
            o->preset = arg, ok = arg != NULL;
        } else if (strcmp(flag, "--layers") == 0) {
            ok = parse_int(flag, arg, 1, 1024, &n), o->layers = (int)n;
        } else if (strcmp(flag, "--steps") == 0) {
            ok = parse_int(flag, arg, 0, 1000000, &n), o->steps = (int)n;
        } else if (strcmp(flag, "--seed") == 0) {
            ok = parse_int(flag, arg, 0, 0x7fffffffL, &n), o->seed = (uint64_t)n;
        } else if (strcmp(flag, "--max-batch") == 0) {
            ok = parse_int(flag, arg, 1, 4096, &n), o->max_batch = (int)n;
        } else if (strcmp(flag, "--max-tokens") == 0) {
            ok = parse_int(flag, arg, 1, GDN_MAX_TOKENS, &n), o->max_tokens = (int)n;
        } else if (strcmp(flag, "--slots") == 0) {
            ok = parse_int(flag, arg, 1, 1 << 20, &n), o->slots = (int)n;
        } else if (strcmp(flag, "--check-every") == 0) {
            ok = parse_int(flag, arg, 0, 1000000, &n), o->check_every = (int)n;
        } else if (strcmp(flag, "--state") == 0) {
            ok = parse_dtype(flag, arg, &o->state_dtype);
        } else if (strcmp(flag, "--input") == 0) {
            ok = parse_dtype(flag, arg, &o->input_dtype);
        } else if (strcmp(flag, "--output") == 0) {
            ok = parse_dtype(flag, arg, &o->output_dtype);
        } else if (strcmp(flag, "--verify") == 0) {
            if (arg && strcmp(arg, "auto") == 0) o->verify = GDN_VERIFY_AUTO;
            else if (arg && strcmp(arg, "cache") == 0) o->verify = GDN_VERIFY_CACHE;
            else if (arg && strcmp(arg, "fold") == 0) o->verify = GDN_VERIFY_FOLD;
            else ok = 0;
        } else if (strcmp(flag, "--backend") == 0) {
            if (arg && strcmp(arg, "auto") == 0) o->backend = GDN_BACKEND_AUTO;
            else if (arg && strcmp(arg, "cpu") == 0) o->backend = GDN_BACKEND_CPU;
            else if (arg && strcmp(arg, "cuda") == 0) o->backend = GDN_BACKEND_CUDA;
            else ok = 0;
        } else {
            fprintf(stderr, "unknown option '%s'\n", flag);
            ok = 0;
        }
        if (!ok) {
            usage(stderr);
            return 2;
        }
        i += takes_arg;
    }
    /* A few more slots than rows: in a burst, more requests are live than one step can take (the
     * scheduler rotates them), and when the slots run out arrivals wait. */
    if (o->slots == 0) o->slots = o->max_batch + (o->max_batch + 3) / 4;
    return 0;
}

static const char *dtype_name(gdn_dtype d)
{
    return d == GDN_DTYPE_F32 ? "f32" : d == GDN_DTYPE_BF16 ? "bf16" : d == GDN_DTYPE_F16 ? "f16" : "?";
}

/* ---------------------------------------------------------------------------------------------- */
/* The serving loop's state                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* One live request. The table is indexed by slot: a slot belongs to at most one live request. */
typedef struct request {
    int id;
    int wanted;   /* tokens this request will generate before it retires */
    int done;     /* tokens generated (committed to the state) so far */
    int unfolded; /* fold: accepted tokens are pending (ref includes them, not yet rounded) */
    double *ref;  /* the host reference state, [layers][HV][V][K] float64 */
} request;

/* The worst errors seen, as a fraction of the tolerance (1.0 = at the bound), and the misses. */
typedef struct error_stats {
    double worst_state, worst_output;
    long state_failures, output_failures;
} error_stats;

typedef struct server {
    options opt;
    rng rng;
    gdn_engine *engine;

    /* Geometry, from the engine's resolved configuration. */
    int L, HK, HV, K, V, max_batch, max_tokens, num_slots;
    int64_t slot_elems; /* HV * V * K: one layer's state of one request */
    double scale;       /* the resolved query scale the engine uses */
    int use_qk_l2norm;
    gdn_dtype state_dtype, input_dtype, output_dtype;
    float *A_log, *dt_bias; /* [L][HV]: what the engine was given, kept for the reference */

    /* Tolerances (SPEC 4): |got - ref| <= abs + rel * |ref|. */
    double state_abs, state_rel, out_abs, out_rel;

    /* Requests. */
    request *req;        /* [num_slots], by slot */
    int32_t *order;      /* slots of the live requests in admission order (the scheduler's queue) */
    int live, pending;   /* live requests; arrivals waiting for a free slot */
    int next_id, cursor; /* round-robin position in `order` */

    /* Host staging for one step: every layer's inputs and outputs are kept until the step's check.
     * One buffer per layer also keeps the copy contract: on CUDA the uploads and downloads are
     * asynchronous, and no buffer is rewritten before the step's gdn_engine_synchronize. */
    void **q, **k, **v, **a, **b, **o; /* [L] each, max_batch * max_tokens rows */
    int32_t *rows;                     /* [max_batch]: slot of each row */
    int32_t *accepted;                 /* [max_batch]: a count, or with --tree the accepted node */
    int32_t *counts, *parents;         /* --tree: [max_batch] node counts, [max_batch][T] parents */
    double *node_states;               /* --tree: [max_tokens][V][K] one head's state after each node */
    void *state_io;                    /* one layer's state of one slot, in the pool's dtype */
    double *qd, *kd, *vd, *ad, *bd, *od, *S; /* reference scratch */

    /* Statistics. */
    long steps_decode, steps_verify, idle_steps, tokens_run, tokens_proposed, tokens_accepted;
    long admitted, admitted_zero, retired, waited, state_checks, state_reports;
    long *bucket_use; /* [max_batch + 1] */
    int max_live;
    error_stats err;
    uint64_t checksum; /* FNV-1a over every output the engine produced: same run, same sum */
} server;

static void checksum_bytes(server *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) s->checksum = (s->checksum ^ p[i]) * 0x100000001b3ull;
}

/* x rounded to `dtype` the way the engine stores it (round to fp32, then to the 16-bit type). */
static double round_to(gdn_dtype dtype, double x)
{
    uint16_t h[1];
    float f[1];
    gdn__store_f32(dtype == GDN_DTYPE_F32 ? (void *)f : (void *)h, dtype, 0, (float)x);
    return gdn__load_f32(dtype == GDN_DTYPE_F32 ? (void *)f : (void *)h, dtype, 0);
}

/* |got - ref| over the bound, as a fraction; NaN counts as infinitely wrong. */
static double error_ratio(double got, double ref, double abs_tol, double rel_tol)
{
    const double ratio = fabs(got - ref) / (abs_tol + rel_tol * fabs(ref));
    return ratio == ratio ? ratio : INFINITY;
}

/* ---------------------------------------------------------------------------------------------- */
/* Setup                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

static void create_engine(server *s)
{
    const options *o = &s->opt;
    gdn_model_config model;
    gdn_status status = gdn_model_preset(o->preset, o->layers, &model);
    if (status != GDN_OK) {
        fprintf(stderr, "unknown preset '%s' (tiny, qwen3-next or qwen3.5)\n", o->preset);
        exit(2);
    }
    gdn_engine_config config;
    CHECK(NULL, gdn_engine_config_init(&config, &model));
    config.state_dtype = o->state_dtype;
    config.input_dtype = o->input_dtype;
    config.output_dtype = o->output_dtype;
    config.num_slots = o->slots;
    config.max_batch = o->max_batch;
    config.max_tokens = o->max_tokens;
    config.backend = o->backend;
    config.verify_strategy = o->verify;
    /* num_buckets stays 0: the default list (1, 2, 4, 8, then every 8) up to max_batch. */

    /* Validation happens here too: a bad field comes back as the GDN_ECONFIG_* code naming it, and
     * --backend cuda without a GPU (or in a build without CUDA) as GDN_ENODEV. */
    status = gdn_engine_create(&config, &s->engine);
    if (status != GDN_OK) die_status(NULL, status, "gdn_engine_create", __LINE__);

    /* Everything below reads the engine's resolved configuration: the scale is filled in there. */
    const gdn_engine_config *c = gdn_engine_get_config(s->engine);
    s->L = c->model.num_layers, s->HK = c->model.num_k_heads, s->HV = c->model.num_v_heads;
    s->K = c->model.head_dim_k, s->V = c->model.head_dim_v;
    s->max_batch = c->max_batch, s->max_tokens = c->max_tokens, s->num_slots = c->num_slots;
    s->slot_elems = (int64_t)s->HV * s->V * s->K;
    s->scale = c->model.scale, s->use_qk_l2norm = c->model.use_qk_l2norm;
    s->state_dtype = c->state_dtype, s->input_dtype = c->input_dtype, s->output_dtype = c->output_dtype;
    s->opt.verify = c->verify_strategy; /* AUTO resolved: the reference follows the engine's choice */

    if (gdn_engine_backend(s->engine) == GDN_BACKEND_CUDA) {
        printf("backend: cuda (device %d)\n", (int)c->device);
    } else if (o->backend == GDN_BACKEND_CPU) {
        printf("backend: cpu (asked for: the float64 CPU reference backend)\n");
    } else {
#ifdef GDN_HAVE_CUDA
        printf("backend: cpu (no GPU found: running on the float64 CPU reference backend)\n");
#else
        printf("backend: cpu (this build has no CUDA backend: running on the float64 CPU reference "
               "backend)\n");
#endif
    }
    gdn_memory_report mem;
    CHECK(s->engine, gdn_engine_memory(s->engine, &mem));
    printf("model: %s, %d layers, HK %d, HV %d, K %d, V %d; state %s, inputs %s, outputs %s\n", o->preset,
           s->L, s->HK, s->HV, s->K, s->V, dtype_name(s->state_dtype), dtype_name(s->input_dtype),
           dtype_name(s->output_dtype));
    printf("engine: %d slots, max_batch %d, max_tokens %d, %d buckets, %s verify; %.1f MiB of backend "
           "memory (pools %.1f, verify cache %.1f, token store %.1f)\n",
           s->num_slots, s->max_batch, s->max_tokens, (int)c->num_buckets,
           c->verify_strategy == GDN_VERIFY_FOLD ? "fold" : "cache", (double)mem.total / 1048576.0,
           (double)mem.state_pools / 1048576.0, (double)mem.verify_cache / 1048576.0,
           (double)mem.token_store / 1048576.0);

    /* SPEC 4: bf16 pools are held to a tighter output bound against a bf16-rounded reference. */
    if (s->state_dtype == GDN_DTYPE_BF16) {
        const gdn__tolerance t = gdn__spec4_tolerance(GDN_DTYPE_BF16);
        s->state_abs = t.state_abs, s->state_rel = t.state_rel, s->out_abs = t.out_abs, s->out_rel = t.out_rel;
    } else {
        const gdn__tolerance t = gdn__spec4_tolerance(GDN_DTYPE_F32);
        s->state_abs = t.state_abs, s->state_rel = t.state_rel, s->out_abs = t.out_abs, s->out_rel = t.out_rel;
    }
}

/* Random A_log and dt_bias per layer (~0.1 * N(0, 1)), as a checkpoint loader would set them. */
static void set_layer_params(server *s)
{
    s->A_log = xcalloc((size_t)s->L * (size_t)s->HV, sizeof(float));
    s->dt_bias = xcalloc((size_t)s->L * (size_t)s->HV, sizeof(float));
    for (int l = 0; l < s->L; l++) {
        float *A_log = s->A_log + (size_t)l * (size_t)s->HV, *dt_bias = s->dt_bias + (size_t)l * (size_t)s->HV;
        for (int h = 0; h < s->HV; h++) {
            A_log[h] = (float)(0.1 * rng_normal(&s->rng));
            dt_bias[h] = (float)(0.1 * rng_normal(&s->rng));
        }
        CHECK(s->engine, gdn_engine_set_layer_params(s->engine, l, A_log, dt_bias));
    }
}

static void allocate_host_buffers(server *s)
{
    const size_t rows = (size_t)s->max_batch * (size_t)s->max_tokens;
    const size_t in = gdn_dtype_size(s->input_dtype), out = gdn_dtype_size(s->output_dtype);
    const size_t L = (size_t)s->L;
    s->q = xcalloc(L, sizeof(void *)), s->k = xcalloc(L, sizeof(void *)), s->v = xcalloc(L, sizeof(void *));
    s->a = xcalloc(L, sizeof(void *)), s->b = xcalloc(L, sizeof(void *)), s->o = xcalloc(L, sizeof(void *));
    for (size_t l = 0; l < L; l++) {
        s->q[l] = xcalloc(rows * (size_t)(s->HK * s->K), in);
        s->k[l] = xcalloc(rows * (size_t)(s->HK * s->K), in);
        s->v[l] = xcalloc(rows * (size_t)(s->HV * s->V), in);
        s->a[l] = xcalloc(rows * (size_t)s->HV, in);
        s->b[l] = xcalloc(rows * (size_t)s->HV, in);
        s->o[l] = xcalloc(rows * (size_t)(s->HV * s->V), out);
    }
    s->req = xcalloc((size_t)s->num_slots, sizeof(request));
    s->order = xcalloc((size_t)s->num_slots, sizeof(int32_t));
    s->rows = xcalloc((size_t)s->max_batch, sizeof(int32_t));
    s->accepted = xcalloc((size_t)s->max_batch, sizeof(int32_t));
    s->counts = xcalloc((size_t)s->max_batch, sizeof(int32_t));
    s->parents = xcalloc((size_t)s->max_batch * (size_t)s->max_tokens, sizeof(int32_t));
    s->node_states = xcalloc((size_t)s->max_tokens * (size_t)(s->V * s->K), sizeof(double));
    s->state_io = xcalloc((size_t)s->slot_elems, gdn_dtype_size(s->state_dtype));
    s->qd = xcalloc((size_t)(GDN_MAX_TOKENS * s->K), sizeof(double));
    s->kd = xcalloc((size_t)(GDN_MAX_TOKENS * s->K), sizeof(double));
    s->vd = xcalloc((size_t)(GDN_MAX_TOKENS * s->V), sizeof(double));
    s->od = xcalloc((size_t)(GDN_MAX_TOKENS * s->V), sizeof(double));
    s->ad = xcalloc(GDN_MAX_TOKENS, sizeof(double));
    s->bd = xcalloc(GDN_MAX_TOKENS, sizeof(double));
    s->S = xcalloc((size_t)(s->V * s->K), sizeof(double));
    s->bucket_use = xcalloc((size_t)s->max_batch + 1, sizeof(long));
}

/* ---------------------------------------------------------------------------------------------- */
/* Checking a request's state against the host reference                                            */
/* ---------------------------------------------------------------------------------------------- */

/* Reads the request's state in every layer back from the pool and compares it with the reference. */
static void check_state(server *s, int32_t slot)
{
    request *r = &s->req[slot];
    /* Fold: the read first folds the pending tokens and stores the state, rounded there. */
    if (r->unfolded)
        for (int64_t e = 0; e < (int64_t)s->L * s->slot_elems; e++) r->ref[e] = round_to(s->state_dtype, r->ref[e]);
    r->unfolded = 0;
    for (int l = 0; l < s->L; l++) {
        CHECK(s->engine, gdn_slot_read_state(s->engine, l, slot, s->state_io));
        const double *ref = r->ref + (int64_t)l * s->slot_elems;
        long failures = 0;
        for (int64_t i = 0; i < s->slot_elems; i++) {
            const double e = error_ratio(gdn__load_f32(s->state_io, s->state_dtype, i), ref[i], s->state_abs,
                                         s->state_rel);
            if (e > s->err.worst_state) s->err.worst_state = e;
            failures += !(e <= 1.0);
        }
        if (failures) {
            if (s->state_reports < 5) /* the first few tell the story */
                fprintf(stderr, "state mismatch: request %d (slot %d), layer %d: %ld elements out of tolerance\n",
                        r->id, (int)slot, l, failures);
            s->state_reports++;
            s->err.state_failures += failures;
        }
    }
    s->state_checks++;
}

static void check_all_live(server *s)
{
    for (int i = 0; i < s->live; i++) check_state(s, s->order[i]);
    /* A kernel that met an out-of-range slot would have raised the sticky flag; a correct loop never
     * does. This synchronises, so it belongs to these periodic checks, not to every step. */
    CHECK(s->engine, gdn_engine_check_device_error(s->engine, NULL));
}

/* ---------------------------------------------------------------------------------------------- */
/* Admission and retirement                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Admits one waiting request. Returns 0 when every slot is taken (it keeps waiting). */
static int admit(server *s)
{
    int32_t slot;
    gdn_status status = gdn_slot_alloc(s->engine, &slot);
    if (status == GDN_ESLOT_EXHAUSTED) return 0; /* full: the request stays in the queue */
    CHECK(s->engine, status);

    request *r = &s->req[slot];
    *r = (request){.id = s->next_id++, .wanted = rng_int(&s->rng, 1, 16), .done = 0};
    r->ref = xcalloc((size_t)(s->L * s->slot_elems), sizeof(double));

    /* The slot's previous contents belong to whoever had it before: every new request must start
     * from a state of its own. Most arrive with a prefilled state (here random, ~0.1 * N(0, 1)); one
     * in four starts from zeros. */
    if (rng_uniform(&s->rng) < 0.25) {
        CHECK(s->engine, gdn_slot_reset(s->engine, slot, NULL)); /* r->ref is already zero */
        s->admitted_zero++;
    } else {
        for (int l = 0; l < s->L; l++) {
            double *ref = r->ref + (int64_t)l * s->slot_elems;
            for (int64_t i = 0; i < s->slot_elems; i++) {
                gdn__store_f32(s->state_io, s->state_dtype, i, (float)(0.1 * rng_normal(&s->rng)));
                ref[i] = gdn__load_f32(s->state_io, s->state_dtype, i); /* exactly what the pool holds */
            }
            CHECK(s->engine, gdn_slot_write_state(s->engine, l, slot, s->state_io));
        }
    }
    s->order[s->live++] = slot;
    if (s->live > s->max_live) s->max_live = s->live;
    s->admitted++;
    return 1;
}

/* Retires a finished request: a last comparison of its state, then its slot goes back to the pool. */
static void retire(server *s, int32_t slot, int finished)
{
    check_state(s, slot);
    CHECK(s->engine, gdn_slot_free(s->engine, slot));
    request *r = &s->req[slot];
    free(r->ref);
    *r = (request){0};
    for (int i = 0; i < s->live; i++) {
        if (s->order[i] != slot) continue;
        memmove(s->order + i, s->order + i + 1, (size_t)(s->live - i - 1) * sizeof(int32_t));
        s->live--;
        if (s->cursor > i) s->cursor--;
        break;
    }
    if (s->cursor >= s->live) s->cursor = 0;
    s->retired += finished;
}

/* New arrivals: a burst of traffic (8 steps) then a quiet spell (16 steps), so the batch fills up,
 * overflows the slots for a while, then drains to a few rows: every bucket gets used. */
static void arrivals(server *s, int step)
{
    const int busy = step % 24 < 8;
    for (int i = 0; i < (busy ? 4 : 1); i++)
        if (rng_uniform(&s->rng) < (busy ? 0.8 : 0.1)) s->pending++;
    if (s->live == 0 && s->pending == 0) s->pending = 1; /* keep the example busy */
    while (s->pending > 0 && admit(s)) s->pending--;
    s->waited += s->pending; /* request-steps spent waiting for a slot */
}

/* ---------------------------------------------------------------------------------------------- */
/* One step                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Random inputs for one layer of the step, written in the input dtype: q, k, v ~ N(0, 1) and the gate
 * inputs a, b ~ 0.1 * N(0, 1). In a model they come from the previous layer's projections. */
static void make_inputs(server *s, int l, int batch, int T)
{
    const int64_t rows = (int64_t)batch * T;
    const gdn_dtype dt = s->input_dtype;
    for (int64_t i = 0; i < rows * s->HK * s->K; i++) {
        gdn__store_f32(s->q[l], dt, i, (float)rng_normal(&s->rng));
        gdn__store_f32(s->k[l], dt, i, (float)rng_normal(&s->rng));
    }
    for (int64_t i = 0; i < rows * s->HV * s->V; i++) gdn__store_f32(s->v[l], dt, i, (float)rng_normal(&s->rng));
    for (int64_t i = 0; i < rows * s->HV; i++) {
        gdn__store_f32(s->a[l], dt, i, (float)(0.1 * rng_normal(&s->rng)));
        gdn__store_f32(s->b[l], dt, i, (float)(0.1 * rng_normal(&s->rng)));
    }
}

/* The reference hook: keep the state after the last accepted token (the verify cache entry that
 * commit copies; for decode, the only token). */
typedef struct keep_state {
    int32_t token; /* -1: keep nothing */
    int64_t elems;
    double *dst;
} keep_state;

static void keep_state_hook(void *user, int32_t t, const double *S)
{
    const keep_state *k = user;
    if (t == k->token) memcpy(k->dst, S, (size_t)k->elems * sizeof(double));
}

/* Runs the first T tokens staged in qd, kd, vd, ad, bd through head h of layer l from `state` (a
 * scratch copy in s->S), outputs into s->od; the hook keeps the state after token keep->token. */
static void ref_head(server *s, int l, int h, int T, const double *state, keep_state *keep)
{
    memcpy(s->S, state, (size_t)s->V * (size_t)s->K * sizeof(double));
    gdn__ref_head(T, s->K, s->V, s->S, s->qd, s->kd, s->K, s->vd, s->V, s->ad, s->bd, s->A_log[l * s->HV + h],
                  s->dt_bias[l * s->HV + h], s->scale, s->use_qk_l2norm, s->od, s->V, keep_state_hook, keep);
}

/* Stages the T tokens of row i, head h of layer l into qd, kd, vd, ad, bd, widened from the inputs
 * the engine saw. */
static void stage_tokens(server *s, int l, int h, int i, int T)
{
    const int kh = h / (s->HV / s->HK);
    const gdn_dtype in = s->input_dtype;
    for (int t = 0; t < T; t++) {
        const int64_t tok = (int64_t)i * T + t;
        for (int c = 0; c < s->K; c++) {
            s->qd[t * s->K + c] = gdn__load_f32(s->q[l], in, (tok * s->HK + kh) * s->K + c);
            s->kd[t * s->K + c] = gdn__load_f32(s->k[l], in, (tok * s->HK + kh) * s->K + c);
        }
        for (int c = 0; c < s->V; c++) s->vd[t * s->V + c] = gdn__load_f32(s->v[l], in, (tok * s->HV + h) * s->V + c);
        s->ad[t] = gdn__load_f32(s->a[l], in, tok * s->HV + h);
        s->bd[t] = gdn__load_f32(s->b[l], in, tok * s->HV + h);
    }
}

/* The engine's output of row i, token t, head h of layer l against the reference `want` [V] rounded
 * to the output dtype, or against exact zeros when want is NULL (a position past the row's count). */
static void compare_output(server *s, const request *r, int l, int i, int T, int t, int h, const double *want)
{
    const int64_t base = (((int64_t)i * T + t) * s->HV + h) * s->V;
    for (int c = 0; c < s->V; c++) {
        const double ref = want ? round_to(s->output_dtype, want[c]) : 0.0;
        const double got = gdn__load_f32(s->o[l], s->output_dtype, base + c);
        const double e = want ? error_ratio(got, ref, s->out_abs, s->out_rel) : (got == 0.0 ? 0.0 : INFINITY);
        if (e > s->err.worst_output) s->err.worst_output = e;
        if (!(e <= 1.0)) {
            if (s->err.output_failures < 5)
                fprintf(stderr, "output mismatch: request %d, layer %d, token %d, head %d, v %d: got %.6g, want %.6g\n",
                        r->id, l, t, h, c, got, ref);
            s->err.output_failures++;
        }
    }
}

/*
 * Replays row i of the step on the host reference, layer by layer and head by head, from the very
 * bf16/fp16 inputs the engine saw: all T tokens are run (from a scratch copy of the state) so that
 * every output can be compared, and the reference state takes the state after the `n` accepted tokens.
 * With the fold strategy a verify's accepted tokens are not stored yet: the pool gets the state the
 * verify started from, and the next kernel that touches the slot applies them to it (so does ref).
 */
static void reference_row(server *s, int i, int T, int n, int verify)
{
    request *r = &s->req[s->rows[i]];
    const int64_t head_elems = (int64_t)s->V * s->K;
    const int pending_after = verify && s->opt.verify == GDN_VERIFY_FOLD;
    for (int l = 0; l < s->L; l++) {
        for (int h = 0; h < s->HV; h++) {
            stage_tokens(s, l, h, i, T);
            double *state = r->ref + (int64_t)l * s->slot_elems + (int64_t)h * head_elems;
            keep_state keep = {.token = pending_after ? -1 : n - 1, .elems = head_elems, .dst = state};
            ref_head(s, l, h, T, state, &keep);

            /* Outputs of every token, against the reference rounded to the output dtype. */
            for (int t = 0; t < T; t++) compare_output(s, r, l, i, T, t, h, s->od + t * s->V);

            /* The engine keeps the state in fp32 between the tokens of one call and rounds it once to
             * the pool's dtype where it stores it. Cache strategy: after a decode token, and (through
             * the verify cache) after the last accepted token; rows that accepted nothing keep their
             * stored state. Fold verify: the state it started from (pending tokens folded) is
             * stored, and the accepted tokens are applied to that stored value, unrounded, later. */
            if (pending_after) {
                for (int64_t e = 0; e < head_elems; e++) state[e] = round_to(s->state_dtype, state[e]);
                if (n > 0) {
                    keep = (keep_state){.token = n - 1, .elems = head_elems, .dst = state};
                    ref_head(s, l, h, n, state, &keep);
                }
            } else if (n > 0) {
                for (int64_t e = 0; e < head_elems; e++) state[e] = round_to(s->state_dtype, state[e]);
            }
        }
    }
    if (pending_after) r->unfolded = n > 0;
    else if (n > 0) r->unfolded = 0;
}

/* The path of `node` in a row's parents, root first, into path[]: its length (0 for node -1). */
static int tree_path(const int32_t *par, int node, int *path)
{
    int len = 0;
    for (int t = node; t >= 0; t = par[t]) path[len++] = t;
    for (int j = 0; j < len / 2; j++) {
        const int x = path[j];
        path[j] = path[len - 1 - j], path[len - 1 - j] = x;
    }
    return len;
}

/*
 * The same for a token tree (--tree): row i ran n nodes, node t from the state after its parent
 * par[t] (-1: the slot's state), and accepted `node`. Every node's output is compared (positions past
 * n must be zero), and the reference state becomes the state after the node, rounded where the engine
 * stores it: the cache strategy's commit copies the node's cache entry; fold stores the state the
 * verify started from and applies the node's path to it later, unrounded.
 */
static void reference_row_tree(server *s, int i, int T, int n, const int32_t *par, int node)
{
    request *r = &s->req[s->rows[i]];
    const int64_t head_elems = (int64_t)s->V * s->K;
    const int fold = s->opt.verify == GDN_VERIFY_FOLD;
    int path[GDN_MAX_TOKENS];
    const int len = tree_path(par, node, path);
    for (int l = 0; l < s->L; l++) {
        for (int h = 0; h < s->HV; h++) {
            stage_tokens(s, l, h, i, T);
            double *state = r->ref + (int64_t)l * s->slot_elems + (int64_t)h * head_elems;
            for (int t = 0; t < n; t++) { /* parents come first: each node from its parent's state */
                double *S = s->node_states + (int64_t)t * head_elems;
                memcpy(S, par[t] < 0 ? state : s->node_states + (int64_t)par[t] * head_elems,
                       (size_t)head_elems * sizeof(double));
                gdn__ref_head(1, s->K, s->V, S, s->qd + t * s->K, s->kd + t * s->K, s->K, s->vd + t * s->V, s->V,
                              s->ad + t, s->bd + t, s->A_log[l * s->HV + h], s->dt_bias[l * s->HV + h], s->scale,
                              s->use_qk_l2norm, s->od + t * s->V, s->V, NULL, NULL);
                compare_output(s, r, l, i, T, t, h, s->od + t * s->V);
            }
            for (int t = n; t < T; t++) compare_output(s, r, l, i, T, t, h, NULL);
            if (fold) {
                for (int64_t e = 0; e < head_elems; e++) state[e] = round_to(s->state_dtype, state[e]);
                for (int j = 0; j < len; j++) {
                    const int t = path[j];
                    gdn__ref_head(1, s->K, s->V, state, s->qd + t * s->K, s->kd + t * s->K, s->K, s->vd + t * s->V,
                                  s->V, s->ad + t, s->bd + t, s->A_log[l * s->HV + h], s->dt_bias[l * s->HV + h],
                                  s->scale, s->use_qk_l2norm, s->od, s->V, NULL, NULL);
                }
            } else if (len > 0) {
                const double *after = s->node_states + (int64_t)node * head_elems;
                for (int64_t e = 0; e < head_elems; e++) state[e] = round_to(s->state_dtype, after[e]);
            }
        }
    }
    if (fold) r->unfolded = len > 0;
    else if (len > 0) r->unfolded = 0;
}

/* A random draft tree of n nodes in par[0..n): mostly chains (a draft model's most likely path),
 * branching at random. */
static void random_tree(server *s, int n, int32_t *par)
{
    for (int t = 0; t < n; t++) par[t] = t == 0 || rng_uniform(&s->rng) < 0.5 ? t - 1 : rng_int(&s->rng, -1, t - 1);
}

/* Picks up to max_batch live requests round-robin, so that every live request keeps moving even when
 * more are live than a step can hold. */
static int schedule(server *s)
{
    const int batch = s->live < s->max_batch ? s->live : s->max_batch;
    for (int i = 0; i < batch; i++) s->rows[i] = s->order[(s->cursor + i) % s->live];
    if (s->live > 0) s->cursor = (s->cursor + batch) % s->live;
    return batch;
}

static void run_step(server *s, int step_no)
{
    const int batch = schedule(s);
    if (batch == 0) {
        s->idle_steps++;
        return;
    }
    /* Decode and speculative verify steps are mixed at random, as a scheduler that enables drafting
     * per step would. */
    const int verify = s->max_tokens >= 2 && rng_uniform(&s->rng) < 0.5;
    const int T = verify ? rng_int(&s->rng, 2, s->max_tokens) : 1;
    /* --tree: each row drafts its own tree of 1..T nodes (a row of 1 node is a plain decode row). */
    const int tree = verify && s->opt.tree;
    for (int i = 0; tree && i < batch; i++) {
        s->counts[i] = rng_int(&s->rng, 1, T);
        random_tree(s, s->counts[i], s->parents + (size_t)i * T);
    }
    gdn_step step = {
        .kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE,
        .tokens = T,
        .batch = batch,
        .slots = s->rows,
        .write_slots = NULL, /* each row writes back the slot it reads */
        .token_counts = tree ? s->counts : NULL,
        .parents = tree ? s->parents : NULL,
    };
    int32_t bucket = 0;
    CHECK(s->engine, gdn_engine_begin_step(s->engine, &step, NULL, &bucket));
    s->bucket_use[bucket]++;

    /* Layer by layer, as the model's forward pass reaches each GDN layer: fill the static input
     * buffers (only the dense [batch, T] prefix), run the layer, read its output. */
    const size_t in = gdn_dtype_size(s->input_dtype), out = gdn_dtype_size(s->output_dtype);
    const size_t rows = (size_t)batch * (size_t)T;
    const size_t qk_bytes = rows * (size_t)(s->HK * s->K) * in, v_bytes = rows * (size_t)(s->HV * s->V) * in;
    const size_t gate_bytes = rows * (size_t)s->HV * in, o_bytes = rows * (size_t)(s->HV * s->V) * out;
    for (int l = 0; l < s->L; l++) {
        gdn_layer_io io;
        CHECK(s->engine, gdn_engine_layer_io(s->engine, l, &io));
        make_inputs(s, l, batch, T);
        CHECK(s->engine, gdn_engine_upload(s->engine, io.q, s->q[l], qk_bytes, NULL));
        CHECK(s->engine, gdn_engine_upload(s->engine, io.k, s->k[l], qk_bytes, NULL));
        CHECK(s->engine, gdn_engine_upload(s->engine, io.v, s->v[l], v_bytes, NULL));
        CHECK(s->engine, gdn_engine_upload(s->engine, io.a, s->a[l], gate_bytes, NULL));
        CHECK(s->engine, gdn_engine_upload(s->engine, io.b, s->b[l], gate_bytes, NULL));
        /* Poison the output (all bits set: NaN in bf16 and fp32) so that a row the engine forgot to
         * write cannot pass for the previous step's result. */
        memset(s->o[l], 0xff, o_bytes);
        CHECK(s->engine, gdn_engine_upload(s->engine, io.o, s->o[l], o_bytes, NULL));
        CHECK(s->engine, gdn_engine_run_layer(s->engine, l, NULL));
        CHECK(s->engine, gdn_engine_download(s->engine, s->o[l], io.o, o_bytes, NULL));
    }

    /* The sampler: after a verify step it decides, per row, how many draft tokens survive (0..T) and
     * writes the counts where commit reads them, in backend memory. Decode rows advance by 1. A tree
     * step's sampler picks the accepted node instead (-1..n-1: one root path survives). */
    for (int i = 0; i < batch; i++)
        s->accepted[i] = tree ? rng_int(&s->rng, -1, s->counts[i] - 1) : verify ? rng_int(&s->rng, 0, T) : 1;
    if (verify) {
        CHECK(s->engine, gdn_engine_upload(s->engine, gdn_engine_accepted(s->engine), s->accepted,
                                           (size_t)batch * sizeof(int32_t), NULL));
        CHECK(s->engine, gdn_engine_commit(s->engine, NULL));
    }
    /* The downloads above are asynchronous on CUDA: wait before reading the outputs on the host. */
    CHECK(s->engine, gdn_engine_synchronize(s->engine, NULL));
    for (int l = 0; l < s->L; l++) checksum_bytes(s, s->o[l], o_bytes);

    /* The independent check: the same tokens through the host reference. */
    int accepted_sum = 0;
    for (int i = 0; i < batch; i++) {
        if (tree) {
            const int32_t *par = s->parents + (size_t)i * T;
            int path[GDN_MAX_TOKENS];
            reference_row_tree(s, i, T, s->counts[i], par, s->accepted[i]);
            s->accepted[i] = tree_path(par, s->accepted[i], path); /* the tokens the request advances by */
        } else {
            reference_row(s, i, T, s->accepted[i], verify);
        }
        accepted_sum += s->accepted[i];
    }

    long tokens = 0; /* run through the layers: a tree row's nodes, else T a row */
    for (int i = 0; i < batch; i++) tokens += tree ? s->counts[i] : T;
    if (verify) {
        s->steps_verify++;
        s->tokens_proposed += tokens;
        s->tokens_accepted += accepted_sum;
    } else {
        s->steps_decode++;
    }
    s->tokens_run += tokens;
    if (s->opt.verbose)
        printf("step %4d: %-6s T=%d batch %2d -> bucket %2d, accepted %3d/%3d, live %2d, waiting %d\n",
               step_no, verify ? "verify" : "decode", T, batch, (int)bucket, accepted_sum, batch * T,
               s->live, s->pending);

    /* Requests advance by what they accepted; the finished ones retire. */
    for (int i = 0; i < batch; i++) {
        request *r = &s->req[s->rows[i]];
        r->done += s->accepted[i];
        if (r->done >= r->wanted) retire(s, s->rows[i], 1);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Main                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

static void report_progress(server *s, int step_no)
{
    printf("step %4d: live %2d, waiting %d, admitted %ld, retired %ld; worst error so far: state %.3g%%, "
           "output %.3g%% of tolerance\n",
           step_no, s->live, s->pending, s->admitted, s->retired, 100.0 * s->err.worst_state,
           100.0 * s->err.worst_output);
}

int gdn_serving_loop_check(int argc, char **argv)
{
    server s;
    memset(&s, 0, sizeof s);
    const int parsed = parse_options(argc, argv, &s.opt);
    if (parsed) return parsed == 1 ? 0 : 2;
    s.rng.s = s.opt.seed;
    s.checksum = 0xcbf29ce484222325ull;

    printf("gdn-engine %d.%d.%d serving loop, seed %llu, %d steps\n", gdn_version() / 10000,
           gdn_version() / 100 % 100, gdn_version() % 100, (unsigned long long)s.opt.seed, s.opt.steps);
    create_engine(&s);
    set_layer_params(&s);
    allocate_host_buffers(&s);

    for (int step_no = 1; step_no <= s.opt.steps; step_no++) {
        arrivals(&s, step_no - 1);
        run_step(&s, step_no);
        if (s.opt.check_every > 0 && step_no % s.opt.check_every == 0) {
            check_all_live(&s);
            report_progress(&s, step_no);
        }
    }

    /* Final check: every live request's state in every layer, then shut down: free the slots. */
    const int live_at_end = s.live;
    check_all_live(&s);
    while (s.live > 0) retire(&s, s.order[0], 0);
    if (gdn_slot_count(s.engine) != 0) {
        fprintf(stderr, "slot accounting: %d slots still allocated after every request left\n",
                (int)gdn_slot_count(s.engine));
        s.err.state_failures++;
    }

    printf("steps: %ld (%ld decode, %ld verify, %ld idle)\n", s.steps_decode + s.steps_verify + s.idle_steps,
           s.steps_decode, s.steps_verify, s.idle_steps);
    printf("tokens: %ld run through the layers; verify accepted %ld of %ld drafted (%.0f%%); "
           "%ld committed to states\n",
           s.tokens_run, s.tokens_accepted, s.tokens_proposed,
           s.tokens_proposed ? 100.0 * (double)s.tokens_accepted / (double)s.tokens_proposed : 0.0,
           s.tokens_run - s.tokens_proposed + s.tokens_accepted); /* decode tokens + accepted drafts */
    printf("requests: %ld admitted (%ld from a zero state), %ld retired, %d live at the end; at most %d "
           "live, %ld request-steps waiting for a slot\n",
           s.admitted, s.admitted_zero, s.retired, live_at_end, s.max_live, s.waited);
    printf("buckets used:");
    for (int b = 1; b <= s.max_batch; b++)
        if (s.bucket_use[b]) printf(" %d x%ld", b, s.bucket_use[b]);
    printf("\n");
    printf("checks: %ld request states compared (every layer), every output of every step compared\n",
           s.state_checks);
    printf("max error: state %.3g%% of tolerance (abs %g + rel %g), output %.3g%% of tolerance "
           "(abs %g + rel %g)\n",
           100.0 * s.err.worst_state, s.state_abs, s.state_rel, 100.0 * s.err.worst_output, s.out_abs,
           s.out_rel);
    printf("checksum: %016llx\n", (unsigned long long)s.checksum);

    const int pass = s.err.state_failures == 0 && s.err.output_failures == 0;
    if (!pass)
        printf("failures: %ld state elements, %ld output elements out of tolerance\n", s.err.state_failures,
               s.err.output_failures);
    printf("final check: %s\n", pass ? "PASS" : "FAIL");

    gdn_engine_destroy(s.engine);
    for (int l = 0; l < s.L; l++) {
        free(s.q[l]), free(s.k[l]), free(s.v[l]), free(s.a[l]), free(s.b[l]), free(s.o[l]);
    }
    free(s.q), free(s.k), free(s.v), free(s.a), free(s.b), free(s.o);
    free(s.req), free(s.order), free(s.rows), free(s.accepted), free(s.state_io);
    free(s.counts), free(s.parents), free(s.node_states);
    free(s.qd), free(s.kd), free(s.vd), free(s.od), free(s.ad), free(s.bd), free(s.S);
    free(s.bucket_use), free(s.A_log), free(s.dt_bias);
    return pass ? 0 : 1;
}
