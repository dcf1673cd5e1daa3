/* The host-API fuzz driver: see fuzz_driver.h. Test-side memory is plain malloc (ASan-checked). */
#include "fuzz_driver.h"
#include "row_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/alloc.h"
#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"

/* Small on purpose: every input runs in well under a millisecond to a few. */
#define FZ_MAX_LAYERS 3
#define FZ_MAX_SLOTS 8
#define FZ_MAX_BATCH 16
#define FZ_MAX_HV 4
#define FZ_ROWS_CAP (FZ_MAX_BATCH + 2)
#define FZ_MAX_OPS 48
/* State elements an input may push through the engine and the model (a row-token of a layer, a state
 * read, write, copy, import or export: HV * V * K each), about 48 states of the smallest shape. Past
 * it the expensive operations are skipped (their bytes still read); cheap calls and refusals go on. */
#define FZ_WORK_BUDGET (48 * 4096)

enum { T_Q, T_K, T_V, T_A, T_B, T_O, T_COUNT };
static const char *const tensor_name[T_COUNT] = {"q", "k", "v", "a", "b", "o"};

/* A per-token tensor as the engine reads or writes it (gdn_view semantics). */
typedef struct tensor {
    char *base;
    int64_t rs, ts, hs; /* all 0: dense [bucket, T, H, D] */
    int32_t H, D;
    gdn_dtype dtype;
} tensor;

/* Memory that a call must leave alone unless it is allowed to change it. */
typedef struct region {
    unsigned char *ptr;
    size_t bytes;
    unsigned char *snap;
    const char *what;
    int32_t layer;
} region;

/* The step as the model sees it. */
typedef struct mstep {
    int active, caller_work, committed;
    gdn_step_kind kind;
    int32_t T, batch, bucket, layers_done;
    uint8_t ran[FZ_MAX_LAYERS];
    int32_t rows[FZ_ROWS_CAP], writes[FZ_ROWS_CAP];
    uint8_t taint[FZ_MAX_LAYERS][FZ_ROWS_CAP]; /* the layer's gates changed after this row's verify ran */
} mstep;

typedef struct expect {
    int n;
    gdn_status codes[8];
} expect;

typedef struct fz {
    const uint8_t *data;
    size_t size, at;
    gdn__rng rng;
    gdn_fuzz_result *res;
    int trace;
    int32_t op_index;
    const char *op_name;

    gdn_engine_config req;
    const gdn_engine_config *cfg; /* the engine's resolved configuration */
    gdn_engine *e;
    int32_t L, HK, HV, K, V, S, MB, MT;
    size_t elems, ssize, isize, osize;
    gdn_dtype sd, id, od;
    gdn_verify_strategy strategy;
    double scale;
    int l2;
    float A_log[FZ_MAX_LAYERS][FZ_MAX_HV], dt_bias[FZ_MAX_LAYERS][FZ_MAX_HV];
    int deep, deep_now, use_cb, cb_commit, skip_inputs_ok, snap_valid;
    double gate_scale, beta_scale;
    uint8_t cb_perm[FZ_MAX_LAYERS];
    int32_t cb_calls;
    int in_callback;

    /* caller-owned memory */
    unsigned char *pool_buf;
    size_t pool_buf_bytes;
    unsigned char *view_buf[FZ_MAX_LAYERS][T_COUNT];
    size_t view_bytes[FZ_MAX_LAYERS][T_COUNT];
    gdn_layer_views views[FZ_MAX_LAYERS];
    int views_mode, pool_mode;

    /* the engine's memory as the checks see it */
    tensor ten[FZ_MAX_LAYERS][T_COUNT];
    unsigned char *pool0; /* layer 0, slot 0 */
    size_t slot_stride_b, layer_stride_b;
    region regs[2 + FZ_MAX_LAYERS * T_COUNT];
    int nregs, pool_reg, o_reg[FZ_MAX_LAYERS];
    unsigned char *o_scratch;
    size_t o_scratch_bytes;
    int32_t *accepted_dev;

    /* the model */
    uint8_t alloc[FZ_MAX_SLOTS], ever[FZ_MAX_SLOTS];
    int32_t free_stack[FZ_MAX_SLOTS], free_count;
    double *state; /* [S][L][elems] */
    uint8_t known[FZ_MAX_SLOTS][FZ_MAX_LAYERS];
    int32_t accepted_shadow[FZ_MAX_BATCH];
    int device_flag; /* the model's device error flag: a commit met a live row's count outside 0..T */
    mstep st;
    double *saved; /* [L][MB][MT * token_doubles]: the inputs each row's layer ran with */
    size_t token_doubles;
    int64_t work;
    double *S_scratch, *o_expect;
    int strict;                  /* GDN_FUZZ_STRICT */
    uint32_t known_bugs_hit;     /* bit i: known_bug[i] was stepped around */
    unsigned char *deep_before, *state_io;
    int failed;
} fz;

/* Library bugs found by this fuzzer and not fixed yet: without GDN_FUZZ_STRICT the model steps around
 * them (each use names its entry), so that a fuzzing run keeps looking for new ones. None is open now.
 * Fixed: "ring: gdn_slot_read_state between a verify and its commit corrupts the committed state" (the
 * read wrote the ring back and zeroed the count that the commit then added accepted[i] to, so the
 * slot re-applied its old records 0..n-1 instead of the verify's h..h+n-1); the engine now refuses
 * (GDN_ESLOT_BUSY) a state write of a slot the current step needs, and under the ring strategy a
 * read too. Its inputs stay in the corpus: tests/fuzz_corpus/seed-midstep-ring and
 * crash-ring-read-mid-verify-deep-9aa46464. */
static const char *const known_bug[] = {NULL};

/* ---------------------------------------------------------------------------------------------- */
/* Plumbing                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

static void fail(fz *f, const char *fmt, ...)
{
    if (f->failed) return;
    f->failed = 1;
    f->res->failed = 1;
    int n = snprintf(f->res->message, sizeof f->res->message, "op %d (%s): ", (int)f->op_index,
                     f->op_name ? f->op_name : "setup");
    if (n < 0 || (size_t)n >= sizeof f->res->message) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->res->message + n, sizeof f->res->message - (size_t)n, fmt, ap);
    va_end(ap);
    if (f->trace) fprintf(stderr, "FAIL %s\n", f->res->message);
}

static void trace(fz *f, const char *fmt, ...)
{
    if (!f->trace) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  [%d] ", (int)f->op_index);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static unsigned u8(fz *f) { return f->at < f->size ? f->data[f->at++] : 0u; }
static unsigned u16(fz *f) { return u8(f) | (u8(f) << 8); }
static uint32_t u32(fz *f) { return (uint32_t)u16(f) | ((uint32_t)u16(f) << 16); }
/* Roughly N(0, 1) and cheap: four 16-bit uniforms summed (Irwin-Hall), centred and scaled. The
 * shape of the tails does not matter here; states and inputs are drawn by the ten thousand. */
static double normal(fz *f)
{
    const uint64_t x = gdn__rng_next(&f->rng);
    const double sum = (double)(x & 0xffff) + (double)(x >> 16 & 0xffff) + (double)(x >> 32 & 0xffff) + (double)(x >> 48);
    return (sum / 65536.0 - 2.0) * 1.7320508075688772;
}

static void ex_add(expect *x, gdn_status s)
{
    for (int i = 0; i < x->n; i++)
        if (x->codes[i] == s) return;
    if (x->n < 8) x->codes[x->n++] = s;
}

static int ex_match(const expect *x, gdn_status got)
{
    if (x->n == 0) return got == GDN_OK;
    for (int i = 0; i < x->n; i++)
        if (x->codes[i] == got) return 1;
    return 0;
}

static const char *ex_text(const expect *x, char *buf, size_t n)
{
    if (x->n == 0) return "OK";
    buf[0] = 0;
    for (int i = 0; i < x->n; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", i ? "|" : "", gdn_status_name(x->codes[i]));
    }
    return buf;
}

/* Checks a call's status against the expectation; 1 when it matches. */
static int check_status(fz *f, const char *call, const expect *x, gdn_status got)
{
    char buf[128];
    trace(f, "%s -> %s (expected %s)", call, gdn_status_name(got), ex_text(x, buf, sizeof buf));
    if (ex_match(x, got)) {
        if (got != GDN_OK) f->res->refusals++;
        return 1;
    }
    fail(f, "%s returned %s, expected %s", call, gdn_status_name(got), ex_text(x, buf, sizeof buf));
    return 0;
}

static double round_to(double x, gdn_dtype dtype)
{
    uint32_t tmp[1];
    gdn__store_f32(tmp, dtype, 0, (float)x);
    return gdn__load_f32(tmp, dtype, 0);
}

static double *model_state(fz *f, int32_t slot, int32_t layer)
{
    return f->state + ((size_t)slot * (size_t)f->L + (size_t)layer) * f->elems;
}

/* The model stores a state as the engine's pool would: rounded once to the state dtype. */
static void model_store(fz *f, int32_t slot, int32_t layer, const double *S)
{
    double *dst = model_state(f, slot, layer);
    for (size_t j = 0; j < f->elems; j++) dst[j] = round_to(S[j], f->sd);
    f->known[slot][layer] = 1;
}

static unsigned char *pool_slot(fz *f, int32_t layer, int32_t slot)
{
    return f->pool0 + (size_t)layer * f->layer_stride_b + (size_t)slot * f->slot_stride_b;
}

static int64_t tensor_offset(const tensor *t, int32_t T, int32_t i, int32_t tok, int32_t h)
{
    if (t->rs == 0 && t->ts == 0 && t->hs == 0) return (((int64_t)i * T + tok) * t->H + h) * t->D;
    return (int64_t)i * t->rs + (int64_t)tok * t->ts + (int64_t)h * t->hs;
}

/* ---------------------------------------------------------------------------------------------- */
/* Guards: what a call may change                                                                   */
/* ---------------------------------------------------------------------------------------------- */

static void add_region(fz *f, void *ptr, size_t bytes, const char *what, int32_t layer)
{
    region *r = &f->regs[f->nregs++];
    r->ptr = ptr;
    r->bytes = bytes;
    r->snap = malloc(bytes ? bytes : 1);
    r->what = what;
    r->layer = layer;
}

/* The snapshots persist between calls: guard_check leaves them equal to memory, so a new one is taken
 * only after the test itself wrote into a region (snap_valid = 0) or a call ran unguarded. */
static void guard_take(fz *f)
{
    if (f->in_callback || f->snap_valid) return;
    for (int i = 0; i < f->nregs; i++) memcpy(f->regs[i].snap, f->regs[i].ptr, f->regs[i].bytes);
    f->snap_valid = 1;
}

/* After a call: only the pool slots in `slots_mask` and the outputs of the layers in `o_mask` may
 * have changed (inputs and accepted counts never). */
static void guard_check(fz *f, uint32_t slots_mask, uint32_t o_mask, const char *call)
{
    if (f->in_callback || f->failed) return;
    f->snap_valid = 0; /* until this check has passed */
    region *pool = &f->regs[f->pool_reg];
    for (int32_t s = 0; s < f->S; s++) {
        if (!(slots_mask >> s & 1u)) continue;
        for (int32_t l = 0; l < f->L; l++) {
            unsigned char *cur = pool_slot(f, l, s);
            memcpy(pool->snap + (cur - pool->ptr), cur, f->elems * f->ssize);
        }
    }
    for (int i = 0; i < f->nregs; i++) {
        region *r = &f->regs[i];
        if (i != f->pool_reg && r->layer >= 0 && strcmp(r->what, "o") == 0 && (o_mask >> r->layer & 1u)) {
            memcpy(r->snap, r->ptr, r->bytes); /* the outputs this call wrote (checked by model_layer) */
            continue;
        }
        if (memcmp(r->snap, r->ptr, r->bytes) == 0) continue;
        size_t at = 0;
        while (at < r->bytes && r->snap[at] == r->ptr[at]) at++;
        if (i == f->pool_reg) {
            const ptrdiff_t off = (r->ptr + at) - f->pool0;
            const int32_t layer = off >= 0 ? (int32_t)(off / (ptrdiff_t)f->layer_stride_b) : -1;
            const ptrdiff_t in_layer = off >= 0 ? off % (ptrdiff_t)f->layer_stride_b : off;
            const int32_t slot = in_layer >= 0 ? (int32_t)(in_layer / (ptrdiff_t)f->slot_stride_b) : -1;
            const int in_state = in_layer >= 0 && (size_t)(in_layer % (ptrdiff_t)f->slot_stride_b) < f->elems * f->ssize;
            fail(f, "%s changed the state pool at byte %zu (layer %d, slot %d, %s), which it may not touch", call, at,
                 (int)layer, (int)slot, in_state ? "inside the slot's state" : "in a gap of the caller's pool");
        } else {
            fail(f, "%s changed %s (layer %d) at byte %zu of %zu, which it may not touch", call, r->what, (int)r->layer, at,
                 r->bytes);
        }
        return;
    }
    f->snap_valid = 1;
}

static int step_needs_slot(const fz *f, int32_t slot);

/* Deep refusal check: every live slot's state read before and after the refused call (under the ring
 * strategy the slots the current step needs cannot be read: GDN_ESLOT_BUSY). */
static int readable(const fz *f, int32_t s)
{
    return f->alloc[s] && (f->strategy != GDN_VERIFY_RING || !step_needs_slot(f, s));
}

static void deep_take(fz *f)
{
    const size_t bytes = f->elems * f->ssize;
    f->snap_valid = 0; /* reads write fold / ring work back */
    for (int32_t s = 0; s < f->S; s++)
        for (int32_t l = 0; l < f->L && readable(f, s); l++) {
            gdn_status st = gdn_slot_read_state(f->e, l, s, f->deep_before + ((size_t)s * f->L + l) * bytes);
            if (st != GDN_OK) fail(f, "read_state(layer %d, live slot %d) for the refusal check: %s", l, s, gdn_status_name(st));
        }
}

static void deep_check(fz *f, const char *call)
{
    const size_t bytes = f->elems * f->ssize;
    f->snap_valid = 0;
    for (int32_t s = 0; s < f->S && !f->failed; s++)
        for (int32_t l = 0; l < f->L && readable(f, s) && !f->failed; l++) {
            gdn_status st = gdn_slot_read_state(f->e, l, s, f->state_io);
            if (st != GDN_OK) fail(f, "read_state(layer %d, live slot %d) after refused %s: %s", l, s, call, gdn_status_name(st));
            if (st == GDN_OK && memcmp(f->state_io, f->deep_before + ((size_t)s * f->L + l) * bytes, bytes) != 0)
                fail(f, "refused %s changed the state of live slot %d, layer %d (read before and after)", call, s, l);
        }
}

static int over_budget(const fz *f) { return f->work >= FZ_WORK_BUDGET; }
static void charge(fz *f, int64_t states) { f->work += states * (int64_t)f->elems; }

/* Before a call that may be refused. */
static void pre_call(fz *f, const expect *x)
{
    f->deep_now = f->deep > 0 && x->n > 0 && !f->in_callback && !over_budget(f);
    if (f->deep_now) { /* a few per input: they read every live state, twice */
        f->deep--;
        for (int32_t s = 0; s < f->S; s++) charge(f, 2 * f->alloc[s] * f->L);
        deep_take(f);
    }
    guard_take(f);
}

/* After a refused call: nothing changed. */
static void refused_unchanged(fz *f, const char *call)
{
    guard_check(f, 0, 0, call);
    if (f->deep_now) deep_check(f, call);
}

/* ---------------------------------------------------------------------------------------------- */
/* The model's view of slots and steps                                                              */
/* ---------------------------------------------------------------------------------------------- */

static int step_needs_slot(const fz *f, int32_t slot)
{
    const mstep *st = &f->st;
    if (!st->active || st->batch == 0) return 0;
    if (st->layers_done == f->L && (st->kind == GDN_STEP_DECODE || st->committed)) return 0;
    for (int32_t i = 0; i < st->batch; i++)
        if (st->rows[i] >= 0 && (st->rows[i] == slot || st->writes[i] == slot)) return 1;
    return 0;
}

/* GDN_EINVAL (negative), GDN_ESLOT_RANGE, GDN_ESLOT_FREE, or OK. */
static void expect_live(const fz *f, int32_t slot, expect *x)
{
    if (slot < 0) ex_add(x, GDN_EINVAL);
    else if (slot >= f->S) ex_add(x, GDN_ESLOT_RANGE);
    else if (!f->alloc[slot]) ex_add(x, GDN_ESLOT_FREE);
}

static void expect_idle(const fz *f, int32_t slot, expect *x)
{
    expect y = {0};
    expect_live(f, slot, &y);
    if (y.n == 0 && step_needs_slot(f, slot)) ex_add(&y, GDN_ESLOT_BUSY);
    for (int i = 0; i < y.n; i++) ex_add(x, y.codes[i]);
}

static uint32_t step_slots_mask(const fz *f)
{
    uint32_t m = 0;
    for (int32_t i = 0; i < f->st.batch; i++)
        if (f->st.rows[i] >= 0) m |= 1u << f->st.rows[i] | 1u << f->st.writes[i];
    return m;
}

/* A slot index from the input: mostly live ones, sometimes free, out of range or negative. */
static int32_t pick_slot(fz *f)
{
    const unsigned c = u8(f);
    int32_t live[FZ_MAX_SLOTS], nlive = 0, dead[FZ_MAX_SLOTS], ndead = 0;
    for (int32_t s = 0; s < f->S; s++) {
        if (f->alloc[s]) live[nlive++] = s;
        else dead[ndead++] = s;
    }
    switch (c % 8) {
    case 5: if (ndead) return dead[(c >> 3) % ndead]; break;
    case 6: return f->S + (int32_t)((c >> 3) % 3);
    case 7: return (c >> 3) % 4 == 0 ? INT32_MIN : -1 - (int32_t)((c >> 3) % 3);
    default: break;
    }
    if (nlive) return live[(c >> 3) % nlive];
    return (int32_t)((c >> 3) % (uint32_t)(f->S + 1));
}

static int32_t pick_layer(fz *f)
{
    const unsigned c = u8(f);
    if (c % 16 == 15) return (c >> 4) % 2 ? f->L : -1;
    return (int32_t)(c % (unsigned)f->L);
}

/* ---------------------------------------------------------------------------------------------- */
/* Inputs and outputs                                                                               */
/* ---------------------------------------------------------------------------------------------- */

static void write_inputs(fz *f, int32_t layer)
{
    const mstep *st = &f->st;
    const double qk_scale = f->l2 ? 1.0 : 1.0 / sqrt((double)f->K); /* raw k with norm ~1: stable */
    for (int p = T_Q; p <= T_B; p++) {
        const tensor *t = &f->ten[layer][p];
        const double sc = p == T_A ? f->gate_scale : p == T_B ? f->beta_scale : (p == T_V ? 1.0 : qk_scale);
        for (int32_t i = 0; i < st->bucket; i++)
            for (int32_t tok = 0; tok < st->T; tok++)
                for (int32_t h = 0; h < t->H; h++) {
                    const int64_t off = tensor_offset(t, st->T, i, tok, h);
                    for (int32_t d = 0; d < t->D; d++) gdn__store_f32(t->base, t->dtype, off + d, (float)(sc * normal(f)));
                }
    }
}

static void poison_outputs(fz *f)
{
    for (int32_t l = 0; l < f->L; l++) {
        region *r = &f->regs[f->o_reg[l]];
        memset(r->ptr, 0x7f, r->bytes);
    }
}

/* Row i's inputs of `layer` widened: q[T][HK][K], k[T][HK][K], v[T][HV][V], a[T][HV], b[T][HV]. */
static double *saved_row(fz *f, int32_t layer, int32_t i)
{
    return f->saved + ((size_t)layer * (size_t)f->MB + (size_t)i) * (size_t)f->MT * f->token_doubles;
}

static void load_row(fz *f, int32_t layer, int32_t i, double *out)
{
    const int32_t T = f->st.T;
    double *q = out, *k = q + (size_t)T * f->HK * f->K, *v = k + (size_t)T * f->HK * f->K;
    double *a = v + (size_t)T * f->HV * f->V, *b = a + (size_t)T * f->HV;
    for (int32_t tok = 0; tok < T; tok++) {
        for (int32_t h = 0; h < f->HK; h++) {
            const tensor *tq = &f->ten[layer][T_Q], *tk = &f->ten[layer][T_K];
            const int64_t oq = tensor_offset(tq, T, i, tok, h), ok = tensor_offset(tk, T, i, tok, h);
            for (int32_t d = 0; d < f->K; d++) {
                q[((size_t)tok * f->HK + h) * f->K + d] = gdn__load_f32(tq->base, f->id, oq + d);
                k[((size_t)tok * f->HK + h) * f->K + d] = gdn__load_f32(tk->base, f->id, ok + d);
            }
        }
        for (int32_t h = 0; h < f->HV; h++) {
            const tensor *tv = &f->ten[layer][T_V];
            const int64_t ov = tensor_offset(tv, T, i, tok, h);
            for (int32_t d = 0; d < f->V; d++) v[((size_t)tok * f->HV + h) * f->V + d] = gdn__load_f32(tv->base, f->id, ov + d);
            a[(size_t)tok * f->HV + h] = gdn__load_f32(f->ten[layer][T_A].base, f->id, tensor_offset(&f->ten[layer][T_A], T, i, tok, h));
            b[(size_t)tok * f->HV + h] = gdn__load_f32(f->ten[layer][T_B].base, f->id, tensor_offset(&f->ten[layer][T_B], T, i, tok, h));
        }
    }
}

/* SPEC 1 for `count` tokens of a saved row (layout of load_row for a step of T tokens) from S
 * [HV][V][K]; outputs [count][HV][V] into o when not NULL. */
static void model_tokens(fz *f, int32_t layer, const double *row, int32_t T, int32_t count, double *S, double *o)
{
    const test_row_model m = {f->HK, f->HV, f->K, f->V, f->A_log[layer], f->dt_bias[layer], f->scale, f->l2};
    for (int32_t tok = 0; tok < count; tok++) test_model_token(&m, row, T, tok, S, o ? o + (size_t)tok * f->HV * f->V : NULL);
}

static double ratio_of(double got, double want, double abs_tol, double rel_tol)
{
    if (isnan(got) || isnan(want)) return INFINITY;
    return fabs(got - want) / (abs_tol + rel_tol * fabs(want));
}

/* After layer `layer` of the current step ran on the engine: its outputs against the model, the
 * model's states advanced (decode) or the row inputs kept for commit (verify), untouched output
 * positions still poison, the step's device rows as staged. */
static void model_layer(fz *f, int32_t layer)
{
    mstep *st = &f->st;
    const int32_t T = st->T;
    const tensor *to = &f->ten[layer][T_O];
    const gdn__tolerance tol = gdn__spec4_tolerance(f->sd);
    for (int32_t i = 0; i < st->bucket && !f->failed; i++) {
        const int live = i < st->batch && st->rows[i] >= 0;
        if (!live) {
            for (int32_t tok = 0; tok < T; tok++)
                for (int32_t h = 0; h < f->HV; h++) {
                    const int64_t off = tensor_offset(to, T, i, tok, h);
                    for (int32_t d = 0; d < f->V; d++) {
                        const double got = gdn__load_f32(to->base, f->od, off + d);
                        if (got != 0.0) {
                            fail(f, "layer %d: %s row %d token %d head %d output %d is %g, not zero", layer,
                                 i < st->batch ? "padding" : "bucket", i, tok, h, d, got);
                            return;
                        }
                    }
                }
            continue;
        }
        const int32_t r = st->rows[i], w = st->writes[i];
        double *row = saved_row(f, layer, i);
        load_row(f, layer, i, row);
        if (f->known[r][layer]) {
            memcpy(f->S_scratch, model_state(f, r, layer), f->elems * sizeof(double));
            model_tokens(f, layer, row, T, T, f->S_scratch, f->o_expect);
            for (int32_t tok = 0; tok < T && !f->failed; tok++)
                for (int32_t h = 0; h < f->HV && !f->failed; h++) {
                    const int64_t off = tensor_offset(to, T, i, tok, h);
                    for (int32_t d = 0; d < f->V; d++) {
                        const double got = gdn__load_f32(to->base, f->od, off + d);
                        const double want = round_to(f->o_expect[((size_t)tok * f->HV + h) * f->V + d], f->od);
                        const double ratio = ratio_of(got, want, tol.out_abs, tol.out_rel);
                        if (ratio > f->res->worst_output) f->res->worst_output = ratio;
                        if (ratio > 1.0) {
                            fail(f, "layer %d row %d (slot %d -> %d) token %d head %d output %d: %.6g, model %.6g (%.0f%% of tolerance)",
                                 layer, i, r, w, tok, h, d, got, want, 100 * ratio);
                            break;
                        }
                    }
                }
            if (st->kind == GDN_STEP_DECODE) model_store(f, w, layer, f->S_scratch);
        } else {
            for (int32_t tok = 0; tok < T; tok++)
                for (int32_t h = 0; h < f->HV; h++) {
                    const int64_t off = tensor_offset(to, T, i, tok, h);
                    for (int32_t d = 0; d < f->V; d++)
                        if (!isfinite(gdn__load_f32(to->base, f->od, off + d)))
                            fail(f, "layer %d row %d: output not finite (slot state unknown to the model)", layer, i);
                }
            if (st->kind == GDN_STEP_DECODE) f->known[w][layer] = 0;
        }
        /* A fork's verify leaves its write slot strategy-defined until commit (cache: as it was; fold
         * and ring: the read slot's state): the model stops vouching for it. */
        if (st->kind == GDN_STEP_VERIFY && w != r) f->known[w][layer] = 0;
    }
    if (f->failed) return;
    /* Every output byte outside the step's [bucket, T] positions is still poison (0x7f). */
    region *o = &f->regs[f->o_reg[layer]];
    memcpy(f->o_scratch, o->ptr, o->bytes);
    const unsigned char *base = (const unsigned char *)to->base;
    for (int32_t i = 0; i < st->bucket; i++)
        for (int32_t tok = 0; tok < T; tok++)
            for (int32_t h = 0; h < f->HV; h++) {
                const size_t at = (size_t)(base - o->ptr) + (size_t)tensor_offset(to, T, i, tok, h) * f->osize;
                memset(f->o_scratch + at, 0x7f, (size_t)f->V * f->osize);
            }
    for (size_t j = 0; j < o->bytes; j++)
        if (f->o_scratch[j] != 0x7f) {
            fail(f, "layer %d: output byte %zu of %zu, outside the step's %d rows x %d tokens, was written", layer, j,
                 o->bytes, (int)st->bucket, (int)T);
            return;
        }
    /* The step's rows as the kernels read them. */
    const int32_t *rd = NULL, *wr = NULL;
    int32_t bucket = -1;
    gdn_status s = gdn_engine_step_rows(f->e, &rd, &wr, &bucket);
    if (s != GDN_OK || bucket != st->bucket || !rd || !wr) {
        fail(f, "step_rows: %s, bucket %d (model %d)", gdn_status_name(s), (int)bucket, (int)st->bucket);
        return;
    }
    for (int32_t i = 0; i < st->bucket; i++) {
        const int live = i < st->batch && st->rows[i] >= 0;
        const int32_t want_r = live ? st->rows[i] : -1, want_w = live ? st->writes[i] : -1;
        if (rd[i] != want_r || wr[i] != want_w) {
            fail(f, "step_rows row %d: read %d write %d, expected %d %d", i, rd[i], wr[i], want_r, want_w);
            return;
        }
    }
    f->res->steps_run++;
}

/* Commit of the current verify step with the accepted counts the engine holds. */
static void model_commit(fz *f)
{
    mstep *st = &f->st;
    if (st->batch == 0 && !st->caller_work) return;
    for (int32_t l = 0; l < f->L; l++)
        for (int32_t i = 0; i < st->batch; i++) {
            if (st->rows[i] < 0) continue;
            const int32_t r = st->rows[i], w = st->writes[i];
            int32_t n = f->accepted_shadow[i];
            f->device_flag |= n < 0 || n > st->T; /* clamped, and flagged */
            n = n < 0 ? 0 : (n > st->T ? st->T : n);
            if (st->taint[l][i]) {
                f->known[w][l] = 0;
                continue;
            }
            if (n == 0) continue; /* a fork's write slot is already unknown */
            if (!f->known[r][l]) {
                f->known[w][l] = 0;
                continue;
            }
            memcpy(f->S_scratch, model_state(f, r, l), f->elems * sizeof(double));
            model_tokens(f, l, saved_row(f, l, i), st->T, n, f->S_scratch, NULL);
            model_store(f, w, l, f->S_scratch);
        }
    f->res->commits++;
}

/* A state read (or export) of `slot`, `layer` as raw state-dtype values: against the model, or
 * adopted by it when it does not know the state. */
static void compare_state(fz *f, int32_t slot, int32_t layer, const unsigned char *raw, const char *what)
{
    double *m = model_state(f, slot, layer);
    if (!f->known[slot][layer]) {
        for (size_t j = 0; j < f->elems; j++) m[j] = gdn__load_f32(raw, f->sd, (int64_t)j);
        f->known[slot][layer] = 1;
        return;
    }
    const gdn__tolerance tol = gdn__spec4_tolerance(f->sd);
    for (size_t j = 0; j < f->elems; j++) {
        const double got = gdn__load_f32(raw, f->sd, (int64_t)j);
        const double ratio = ratio_of(got, m[j], tol.state_abs, tol.state_rel);
        if (ratio > f->res->worst_state) f->res->worst_state = ratio;
        if (ratio > 1.0) {
            fail(f, "%s slot %d layer %d element %zu (head %zu row %zu col %zu): %.6g, model %.6g (%.0f%% of tolerance)", what,
                 slot, layer, j, j / ((size_t)f->V * f->K), j / f->K % f->V, j % f->K, got, m[j], 100 * ratio);
            return;
        }
    }
}

static void random_state(fz *f, unsigned char *raw)
{
    for (size_t j = 0; j < f->elems; j++) gdn__store_f32(raw, f->sd, (int64_t)j, (float)(0.1 * normal(f)));
}

/* ---------------------------------------------------------------------------------------------- */
/* Calls: each computes the expected status, runs the call between guards and updates the model     */
/* ---------------------------------------------------------------------------------------------- */

static void call_alloc(fz *f)
{
    expect x = {0};
    if (f->free_count == 0) ex_add(&x, GDN_ESLOT_EXHAUSTED);
    pre_call(f, &x);
    int32_t slot = 12345;
    gdn_status s = gdn_slot_alloc(f->e, &slot);
    if (!check_status(f, "slot_alloc", &x, s)) return;
    if (s != GDN_OK) {
        if (slot != 12345) fail(f, "refused slot_alloc wrote *slot = %d", slot);
        refused_unchanged(f, "slot_alloc");
        return;
    }
    guard_check(f, 0, 0, "slot_alloc");
    const int32_t want = f->free_stack[--f->free_count];
    if (slot != want) {
        fail(f, "slot_alloc handed out %d; fresh slots go 0, 1, ... and freed ones most recent first: expected %d", slot, want);
        return;
    }
    f->alloc[slot] = 1;
    /* "left as it is": exact for the cache strategy; under fold and ring the last owner's pending
     * work is dropped, so the model only knows a slot that was never allocated before. */
    if (f->ever[slot] && f->strategy != GDN_VERIFY_CACHE)
        for (int32_t l = 0; l < f->L; l++) f->known[slot][l] = 0;
    f->ever[slot] = 1;
    trace(f, "  slot %d", slot);
}

static void call_free(fz *f, int32_t slot)
{
    expect x = {0};
    expect_idle(f, slot, &x);
    pre_call(f, &x);
    gdn_status s = gdn_slot_free(f->e, slot);
    char name[64];
    snprintf(name, sizeof name, "slot_free(%d)", slot);
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    guard_check(f, 0, 0, name);
    f->alloc[slot] = 0;
    f->free_stack[f->free_count++] = slot;
}

static void call_reset(fz *f, int32_t slot)
{
    expect x = {0};
    expect_idle(f, slot, &x);
    pre_call(f, &x);
    charge(f, f->L);
    gdn_status s = gdn_slot_reset(f->e, slot, NULL);
    char name[64];
    snprintf(name, sizeof name, "slot_reset(%d)", slot);
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    guard_check(f, slot >= 0 && slot < f->S ? 1u << slot : 0, 0, name);
    for (int32_t l = 0; l < f->L; l++) {
        memset(model_state(f, slot, l), 0, f->elems * sizeof(double));
        f->known[slot][l] = 1;
    }
}

static void call_read(fz *f, int32_t layer, int32_t slot, int null_dst)
{
    expect x = {0};
    if (null_dst) ex_add(&x, GDN_EINVAL);
    if (layer < 0 || layer >= f->L) ex_add(&x, GDN_ELAYER);
    /* A read of a slot the current step needs: fine, except under the ring strategy (gdn.h). */
    if (f->strategy == GDN_VERIFY_RING) expect_idle(f, slot, &x);
    else expect_live(f, slot, &x);
    pre_call(f, &x);
    memset(f->state_io, 0xcd, f->elems * f->ssize);
    charge(f, 1);
    gdn_status s = gdn_slot_read_state(f->e, layer, slot, null_dst ? NULL : f->state_io);
    char name[64];
    snprintf(name, sizeof name, "read_state(layer %d, slot %d%s)", layer, slot, null_dst ? ", NULL" : "");
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    /* Fold and ring write the slot's pending work back into the pool first. */
    guard_check(f, 1u << slot, 0, name);
    compare_state(f, slot, layer, f->state_io, "read_state");
}

static void call_write(fz *f, int32_t layer, int32_t slot, int null_src)
{
    expect x = {0};
    if (null_src) ex_add(&x, GDN_EINVAL);
    if (layer < 0 || layer >= f->L) ex_add(&x, GDN_ELAYER);
    expect_idle(f, slot, &x);
    random_state(f, f->state_io);
    charge(f, 1);
    pre_call(f, &x);
    gdn_status s = gdn_slot_write_state(f->e, layer, slot, null_src ? NULL : f->state_io);
    char name[64];
    snprintf(name, sizeof name, "write_state(layer %d, slot %d%s)", layer, slot, null_src ? ", NULL" : "");
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    guard_check(f, 1u << slot, 0, name);
    /* The pool holds exactly what was written. */
    if (memcmp(pool_slot(f, layer, slot), f->state_io, f->elems * f->ssize) != 0)
        return fail(f, "%s: the pool does not hold the written bytes", name);
    double *m = model_state(f, slot, layer);
    for (size_t j = 0; j < f->elems; j++) m[j] = gdn__load_f32(f->state_io, f->sd, (int64_t)j);
    f->known[slot][layer] = 1;
}

static void call_copy(fz *f, int32_t dst, int32_t src)
{
    expect x = {0};
    expect_idle(f, dst, &x);
    expect_idle(f, src, &x);
    if (dst == src) ex_add(&x, GDN_EINVAL);
    pre_call(f, &x);
    charge(f, f->L);
    gdn_status s = gdn_slot_copy_async(f->e, dst, src, NULL);
    char name[64];
    snprintf(name, sizeof name, "slot_copy(dst %d, src %d)", dst, src);
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    guard_check(f, 1u << dst, 0, name);
    for (int32_t l = 0; l < f->L; l++) {
        memcpy(model_state(f, dst, l), model_state(f, src, l), f->elems * sizeof(double));
        f->known[dst][l] = f->known[src][l];
    }
}

static void call_import(fz *f, int32_t slot, unsigned mode)
{
    expect x = {0};
    expect_idle(f, slot, &x);
    const int64_t elems = (int64_t)f->elems;
    int64_t stride = elems + (int64_t)(mode >> 2) % 3 * 8;
    const int null_src = mode % 8 == 1;
    if (mode % 8 == 2) stride = (mode >> 3) % 2 ? elems - 1 : -(int64_t)(mode >> 4);
    if (null_src || stride < elems) ex_add(&x, GDN_EINVAL);
    const int64_t alloc_stride = stride > elems ? stride : elems;
    unsigned char *buf = malloc((size_t)alloc_stride * (size_t)f->L * f->ssize);
    for (int32_t l = 0; l < f->L; l++) random_state(f, buf + (size_t)(l * alloc_stride) * f->ssize);
    pre_call(f, &x);
    charge(f, f->L);
    gdn_status s = gdn_slot_import_async(f->e, slot, null_src ? NULL : buf, stride, NULL);
    char name[96];
    snprintf(name, sizeof name, "slot_import(%d, stride %lld%s)", slot, (long long)stride, null_src ? ", NULL" : "");
    if (check_status(f, name, &x, s)) {
        if (s != GDN_OK) {
            refused_unchanged(f, name);
        } else {
            guard_check(f, 1u << slot, 0, name);
            for (int32_t l = 0; l < f->L; l++) {
                const unsigned char *src = buf + (size_t)(l * stride) * f->ssize;
                if (memcmp(pool_slot(f, l, slot), src, f->elems * f->ssize) != 0)
                    fail(f, "%s: layer %d of the pool differs from the imported bytes", name, l);
                double *m = model_state(f, slot, l);
                for (size_t j = 0; j < f->elems; j++) m[j] = gdn__load_f32(src, f->sd, (int64_t)j);
                f->known[slot][l] = 1;
            }
        }
    }
    free(buf);
}

static void call_export(fz *f, int32_t slot, unsigned mode)
{
    expect x = {0};
    expect_idle(f, slot, &x);
    const int64_t elems = (int64_t)f->elems;
    int64_t stride = elems + (int64_t)(mode >> 2) % 3 * 8;
    const int null_dst = mode % 8 == 1;
    if (mode % 8 == 2) stride = (mode >> 3) % 2 ? elems - 8 : 0;
    if (null_dst || stride < elems) ex_add(&x, GDN_EINVAL);
    const int64_t alloc_stride = stride > elems ? stride : elems;
    const size_t bytes = (size_t)alloc_stride * (size_t)f->L * f->ssize + 64;
    unsigned char *buf = malloc(bytes);
    memset(buf, 0x3c, bytes);
    pre_call(f, &x);
    charge(f, f->L);
    gdn_status s = gdn_slot_export_async(f->e, slot, null_dst ? NULL : buf, stride, NULL);
    char name[96];
    snprintf(name, sizeof name, "slot_export(%d, stride %lld%s)", slot, (long long)stride, null_dst ? ", NULL" : "");
    if (check_status(f, name, &x, s)) {
        if (s != GDN_OK) {
            refused_unchanged(f, name);
            for (size_t j = 0; j < bytes; j++)
                if (buf[j] != 0x3c) {
                    fail(f, "refused %s wrote into the destination", name);
                    break;
                }
        } else {
            guard_check(f, 1u << slot, 0, name); /* fold, ring: written back in place first */
            for (int32_t l = 0; l < f->L && !f->failed; l++) {
                compare_state(f, slot, l, buf + (size_t)(l * stride) * f->ssize, "export");
                /* Between layers and past the last one, the destination is untouched. */
                const size_t from = (size_t)(l * stride) * f->ssize + f->elems * f->ssize;
                const size_t to = l + 1 < f->L ? (size_t)((l + 1) * stride) * f->ssize : bytes;
                for (size_t j = from; j < to; j++)
                    if (buf[j] != 0x3c) {
                        fail(f, "%s wrote byte %zu of the destination, outside layer %d's state", name, j, l);
                        break;
                    }
            }
        }
    }
    free(buf);
}

static int32_t bucket_for(const fz *f, int32_t batch)
{
    const int32_t want = batch < 1 ? 1 : batch;
    for (int32_t i = 0; i < f->cfg->num_buckets; i++)
        if (f->cfg->buckets[i] >= want) return f->cfg->buckets[i];
    return f->MB;
}

/* begin_step with rows already built; on success the model's step starts (inputs written, outputs
 * poisoned). */
static int call_begin(fz *f, gdn_step_kind kind, int32_t T, int32_t batch, const int32_t *slots, const int32_t *writes,
                      uint32_t flags, unsigned input_mask)
{
    expect x = {0};
    if (flags & ~GDN_STEP_CALLER_WORK) ex_add(&x, GDN_EMISUSE);
    const int kind_ok = kind == GDN_STEP_DECODE || kind == GDN_STEP_VERIFY;
    if (!kind_ok) ex_add(&x, GDN_ESTEP_KIND);
    const int batch_ok = batch >= 0 && batch <= f->MB;
    if (!batch_ok) ex_add(&x, GDN_ESTEP_BATCH);
    else if (batch > 0 && !slots) ex_add(&x, GDN_EINVAL);
    if (kind_ok && kind == GDN_STEP_VERIFY && f->MT == 1) ex_add(&x, GDN_ESTEP_KIND); /* decode only */
    if (kind_ok && (kind == GDN_STEP_DECODE ? T != 1 : (T < 1 || T > f->MT))) ex_add(&x, GDN_ESTEP_TOKENS);
    if (x.n == 0 && batch > 0) { /* the rows */
        uint8_t read_by[FZ_MAX_SLOTS + 8];
        int32_t reader[FZ_MAX_SLOTS + 8];
        uint8_t written[FZ_MAX_SLOTS + 8];
        memset(read_by, 0, sizeof read_by), memset(written, 0, sizeof written);
        for (int32_t i = 0; i < batch; i++) {
            const int32_t r = slots[i];
            if (r < 0) continue;
            if (r >= f->S) ex_add(&x, GDN_ESLOT_RANGE);
            else if (!f->alloc[r]) ex_add(&x, GDN_ESLOT_FREE);
            else if (read_by[r]) ex_add(&x, GDN_ESLOT_DUP);
            else read_by[r] = 1, reader[r] = i;
        }
        for (int32_t i = 0; i < batch; i++) {
            if (slots[i] < 0) continue;
            const int32_t w = writes ? writes[i] : slots[i];
            if (w < 0) ex_add(&x, GDN_EINVAL);
            else if (w >= f->S) ex_add(&x, GDN_ESLOT_RANGE);
            else if (!f->alloc[w]) ex_add(&x, GDN_ESLOT_FREE);
            else if (written[w]) ex_add(&x, GDN_ESLOT_DUP);
            else if (read_by[w] && reader[w] != i) ex_add(&x, GDN_ESLOT_DUP);
            else written[w] = 1;
        }
        /* A row reading a bad slot stops the read checks before the write checks run. */
    }
    pre_call(f, &x);
    gdn_step step = {.kind = kind, .tokens = T, .batch = batch, .slots = slots, .write_slots = writes, .flags = flags};
    int32_t bucket = -77;
    gdn_status s = gdn_engine_begin_step(f->e, &step, NULL, &bucket);
    char name[160];
    int len = snprintf(name, sizeof name, "begin_step(%s T=%d batch=%d%s%s rows", kind == GDN_STEP_DECODE ? "decode" : kind == GDN_STEP_VERIFY ? "verify" : "badkind",
                       (int)T, (int)batch, flags & GDN_STEP_CALLER_WORK ? " CALLER_WORK" : "", flags & ~1u ? " badflags" : "");
    for (int32_t i = 0; i < batch && batch <= FZ_ROWS_CAP && slots && len < 130; i++)
        len += snprintf(name + len, sizeof name - (size_t)len, " %d>%d", slots[i], writes ? writes[i] : slots[i]);
    if (len < 0 || len > (int)sizeof name - 2) len = (int)sizeof name - 2;
    snprintf(name + len, sizeof name - (size_t)len, ")");
    if (!check_status(f, name, &x, s)) return 0;
    if (s != GDN_OK) {
        if (bucket != -77) fail(f, "refused %s wrote *bucket", name);
        refused_unchanged(f, name);
        return 0;
    }
    guard_check(f, 0, 0, name);
    const int32_t want_bucket = bucket_for(f, batch);
    if (bucket != want_bucket) {
        fail(f, "%s: bucket %d, expected the smallest bucket >= batch, %d", name, (int)bucket, (int)want_bucket);
        return 0;
    }
    /* The previous step ends here (an uncommitted verify is dropped: nothing to do in the model). */
    mstep *st = &f->st;
    memset(st, 0, sizeof *st);
    st->active = 1, st->kind = kind, st->T = T, st->batch = batch, st->bucket = bucket;
    st->caller_work = (flags & GDN_STEP_CALLER_WORK) != 0;
    for (int32_t i = 0; i < batch; i++) {
        st->rows[i] = slots[i] < 0 ? -1 : slots[i];
        st->writes[i] = slots[i] < 0 ? -1 : (writes ? writes[i] : slots[i]);
    }
    if (st->caller_work) {
        st->layers_done = f->L;
        memset(st->ran, 1, sizeof st->ran);
        st->committed = kind == GDN_STEP_VERIFY;
    }
    poison_outputs(f);
    for (int32_t l = 0; l < f->L; l++)
        if (!(input_mask >> l & 1u) || !f->skip_inputs_ok) write_inputs(f, l);
    f->snap_valid = 0;
    return 1;
}

static void call_run_layer(fz *f, int32_t layer)
{
    mstep *st = &f->st;
    expect x = {0};
    if (layer < 0 || layer >= f->L) ex_add(&x, GDN_ELAYER);
    else if (!st->active || st->committed || st->ran[layer] || st->caller_work) ex_add(&x, GDN_EMISUSE);
    pre_call(f, &x);
    gdn_status s = gdn_engine_run_layer(f->e, layer, NULL);
    char name[48];
    snprintf(name, sizeof name, "run_layer(%d)", layer);
    if (!check_status(f, name, &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, name);
    guard_check(f, step_slots_mask(f), st->batch > 0 ? 1u << layer : 0, name);
    st->ran[layer] = 1;
    st->layers_done++;
    if (st->batch > 0) {
        model_layer(f, layer);
        f->work += (int64_t)st->batch * st->T * (int64_t)f->elems;
    }
}

static void call_commit(fz *f);

/* The capture callback: on the CPU backend run_step calls it directly (no graphs). */
static gdn_status capture_cb(void *user, gdn_engine *engine, gdn_step_kind kind, int32_t tokens, int32_t bucket,
                             void *stream)
{
    fz *f = user;
    f->cb_calls++;
    if (engine != f->e || kind != f->st.kind || tokens != f->st.T || bucket != f->st.bucket || stream != NULL) {
        fail(f, "capture callback got (kind %d, T %d, bucket %d), step is (%d, %d, %d)", (int)kind, (int)tokens, (int)bucket,
             (int)f->st.kind, (int)f->st.T, (int)f->st.bucket);
        return GDN_OK;
    }
    const int outer = f->in_callback;
    f->in_callback = 1;
    for (int32_t k = 0; k < f->L && !f->failed; k++) call_run_layer(f, f->cb_perm[k]);
    if (f->cb_commit && kind == GDN_STEP_VERIFY && !f->failed) call_commit(f);
    f->in_callback = outer;
    return GDN_OK;
}

static void call_run_step(fz *f)
{
    mstep *st = &f->st;
    expect x = {0};
    if (!st->active || st->committed || st->layers_done > 0) ex_add(&x, GDN_EMISUSE);
    pre_call(f, &x);
    const int32_t calls_before = f->cb_calls;
    const int with_cb = f->use_cb && x.n == 0 && st->batch > 0;
    gdn_status s = gdn_engine_run_step(f->e, NULL);
    if (!check_status(f, "run_step", &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, "run_step");
    if (f->failed) return;
    const int32_t calls = f->cb_calls - calls_before;
    if (calls != (with_cb ? 1 : 0)) return fail(f, "run_step called the capture callback %d times, expected %d", calls, with_cb);
    guard_check(f, step_slots_mask(f), st->batch > 0 ? 0xffffffffu : 0, "run_step");
    if (with_cb) return; /* the callback's run_layer calls did the rest */
    for (int32_t l = 0; l < f->L && l < FZ_MAX_LAYERS && !f->failed; l++) {
        st->ran[l] = 1;
        st->layers_done++;
        if (st->batch > 0) {
            model_layer(f, l);
            f->work += (int64_t)st->batch * st->T * (int64_t)f->elems;
        }
    }
}

static void upload_accepted(fz *f, unsigned mode)
{
    int32_t vals[FZ_MAX_BATCH];
    const int32_t T = f->st.active ? f->st.T : 4;
    for (int32_t i = 0; i < f->MB; i++) {
        const unsigned c = u8(f);
        if (mode % 4 == 0 || c % 8 < 6) vals[i] = (int32_t)(c % (unsigned)(T + 1));
        else if (c % 8 == 6) vals[i] = c & 8 ? T + 1 + (int32_t)(c >> 5) : -1 - (int32_t)(c >> 5);
        else vals[i] = c & 8 ? INT32_MAX : INT32_MIN;
    }
    expect x = {0};
    pre_call(f, &x);
    gdn_status s = gdn_engine_upload(f->e, f->accepted_dev, vals, sizeof(int32_t) * (size_t)f->MB, NULL);
    f->snap_valid = 0;
    if (!check_status(f, "upload(accepted)", &x, s)) return;
    /* The one region this call may change. */
    memcpy(f->accepted_shadow, vals, sizeof(int32_t) * (size_t)f->MB);
    memcpy(f->regs[f->nregs - 1].snap, vals, sizeof(int32_t) * (size_t)f->MB);
    guard_check(f, 0, 0, "upload(accepted)");
    if (memcmp(f->accepted_dev, vals, sizeof(int32_t) * (size_t)f->MB) != 0) fail(f, "upload(accepted) did not copy");
}

static void call_commit(fz *f)
{
    mstep *st = &f->st;
    expect x = {0};
    if (!st->active || st->kind != GDN_STEP_VERIFY || st->committed || st->layers_done != f->L) ex_add(&x, GDN_EMISUSE);
    pre_call(f, &x);
    gdn_status s = gdn_engine_commit(f->e, NULL);
    if (!check_status(f, "commit", &x, s)) return;
    if (s != GDN_OK) return refused_unchanged(f, "commit");
    uint32_t w = 0;
    for (int32_t i = 0; i < st->batch; i++)
        if (st->rows[i] >= 0) w |= 1u << st->writes[i];
    guard_check(f, w, 0, "commit");
    st->committed = 1;
    model_commit(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* Composite operations                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* Rows of a step from the input (valid most of the time). Returns the batch; *slots_null when the
 * slots pointer is to be NULL; writes_out NULL when the step gives no write slots. */
static int32_t build_rows(fz *f, int32_t *rows, int32_t *writes, int *use_writes, int *slots_null)
{
    const unsigned nb = u8(f);
    int32_t batch = (int32_t)(nb % (unsigned)(f->MB + 1));
    if (nb % 61 == 60) batch = (nb >> 6) % 2 ? f->MB + 1 : -1;
    *slots_null = batch > 0 && nb % 53 == 52;
    const int32_t n = batch < 0 ? 0 : (batch > FZ_ROWS_CAP ? FZ_ROWS_CAP : batch);
    uint8_t used[FZ_MAX_SLOTS] = {0};
    int32_t live[FZ_MAX_SLOTS], nlive = 0, dead[FZ_MAX_SLOTS], ndead = 0;
    for (int32_t s = 0; s < f->S; s++) {
        if (f->alloc[s]) live[nlive++] = s;
        else dead[ndead++] = s;
    }
    for (int32_t i = 0; i < n; i++) {
        const unsigned c = u8(f);
        int32_t r = -1;
        switch (c & 15) { /* low nibble: what; high nibble: which */
        case 6: r = c & 16 ? INT32_MIN : -1 - (int32_t)(c >> 5); break;
        case 7: r = (int32_t)((c >> 4) % (unsigned)(f->S + 2)) - 1; break; /* anything: free, range, dup */
        case 8: if (i > 0) r = rows[(c >> 4) % (unsigned)i]; break;
        case 9: if (ndead) r = dead[(c >> 4) % (unsigned)ndead]; break;
        default: {
            int32_t k = nlive ? (int32_t)((c >> 4) % (unsigned)nlive) : 0;
            for (int32_t tries = 0; tries < nlive; tries++, k = (k + 1) % nlive)
                if (!used[live[k]]) {
                    r = live[k];
                    break;
                }
        }
        }
        rows[i] = r;
        if (r >= 0 && r < f->S) used[r] = 1;
    }
    const unsigned wm = u8(f);
    *use_writes = wm % 4 >= 2;
    for (int32_t i = 0; i < n; i++) {
        writes[i] = rows[i];
        if (!*use_writes) continue;
        const unsigned c = u8(f);
        if (rows[i] < 0) { /* a padding row's write slot is ignored, whatever it is */
            writes[i] = c % 3 == 0 ? f->S + 5 : (c % 3 == 1 ? -3 : (int32_t)(c % (unsigned)(f->S + 1)));
            continue;
        }
        if (c % 4 == 0) { /* a fork into a live slot that no row reads or writes */
            for (int32_t k = 0; k < nlive; k++) {
                const int32_t s = live[(k + (int32_t)(c >> 2)) % nlive];
                int taken = used[s];
                for (int32_t j = 0; j < i && !taken; j++) taken = writes[j] == s;
                if (!taken) {
                    writes[i] = s;
                    used[s] = 1;
                    break;
                }
            }
        } else if (wm % 4 == 3 && c % 8 == 5) { /* invalid write slots */
            switch ((c >> 3) % 5) {
            case 0: writes[i] = -1; break;
            case 1: writes[i] = f->S; break;
            case 2: if (n > 1) writes[i] = rows[(i + 1) % n]; break;
            case 3: if (ndead) writes[i] = dead[(c >> 6) % (unsigned)ndead]; break;
            case 4: if (i > 0) writes[i] = writes[i - 1]; break;
            }
        }
    }
    return batch;
}

static void op_step(fz *f, int caller_work)
{
    const unsigned k = u8(f);
    gdn_step_kind kind = k % 2 ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
    if (k % 64 == 63) kind = (gdn_step_kind)(2 + (k >> 7));
    int32_t T = kind == GDN_STEP_VERIFY ? 1 + (int32_t)((k >> 1) % (unsigned)f->MT) : 1;
    if (k % 32 == 30) T = (k >> 6) % 2 ? (kind == GDN_STEP_VERIFY ? f->MT + 1 : 2) : 0;
    int32_t rows[FZ_ROWS_CAP], writes[FZ_ROWS_CAP];
    int use_writes, slots_null;
    const int32_t batch = build_rows(f, rows, writes, &use_writes, &slots_null);
    const unsigned m = u8(f);
    uint32_t flags = caller_work ? GDN_STEP_CALLER_WORK : 0;
    if (m % 97 == 96) flags |= 2u << (m % 5);
    if (!call_begin(f, kind, T, batch, slots_null ? NULL : rows, use_writes ? writes : NULL, flags, m >> 4)) return;
    mstep *st = &f->st;
    if (caller_work) {
        /* The engine-tracked calls refuse a CALLER_WORK step. */
        if (m & 1) call_run_layer(f, (int32_t)((m >> 1) % (unsigned)f->L));
        if (m & 2) call_run_step(f);
        if (m & 4 && kind == GDN_STEP_VERIFY) call_commit(f);
        expect x = {0};
        pre_call(f, &x);
        gdn_status s = gdn_engine_enqueue_rows(f->e, NULL);
        if (!check_status(f, "enqueue_rows", &x, s)) return;
        guard_check(f, 0, 0, "enqueue_rows");
        for (int32_t j = 0; j < f->L && !f->failed; j++) {
            const int32_t l = (int32_t)((j + (int32_t)(m >> 3)) % f->L);
            pre_call(f, &x);
            s = gdn_engine_enqueue_layer(f->e, l, NULL);
            if (!check_status(f, "enqueue_layer", &x, s)) return;
            guard_check(f, step_slots_mask(f), 1u << l, "enqueue_layer");
            model_layer(f, l);
            f->work += (int64_t)(st->batch > 0 ? st->batch : 1) * st->T * (int64_t)f->elems;
        }
        if (kind == GDN_STEP_VERIFY && !f->failed) {
            upload_accepted(f, m);
            pre_call(f, &x);
            s = gdn_engine_enqueue_commit(f->e, NULL);
            if (!check_status(f, "enqueue_commit", &x, s)) return;
            uint32_t w = 0;
            for (int32_t i = 0; i < st->batch; i++)
                if (st->rows[i] >= 0) w |= 1u << st->writes[i];
            guard_check(f, w, 0, "enqueue_commit");
            model_commit(f);
        }
        return;
    }
    const unsigned how = u8(f);
    if (how % 3 == 0) {
        call_run_step(f);
    } else { /* layer by layer in a rotated order; how % 3 == 2 leaves the last one out sometimes */
        const int32_t first = (int32_t)((how >> 2) % (unsigned)f->L);
        const int32_t n = how % 3 == 2 && (how >> 4) % 4 == 0 ? f->L - 1 : f->L;
        for (int32_t j = 0; j < n && !f->failed; j++) call_run_layer(f, (first + (how & 2 ? -j + f->L : j)) % f->L);
    }
    if (kind == GDN_STEP_VERIFY && !f->failed && (how >> 6) != 3) {
        upload_accepted(f, how);
        call_commit(f);
    }
}

static void op_misc(fz *f)
{
    const unsigned c = u8(f);
    expect x = {0};
    gdn_status s;
    switch (c % 12) {
    case 0: { /* NULL engine and NULL arguments */
        gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1};
        ex_add(&x, GDN_EINVAL);
        pre_call(f, &x);
        int32_t slot = 0, bucket = 0;
        const gdn_status got[] = {
            gdn_engine_begin_step(NULL, &step, NULL, &bucket), gdn_engine_begin_step(f->e, NULL, NULL, &bucket),
            gdn_slot_alloc(NULL, &slot), gdn_slot_alloc(f->e, NULL), gdn_slot_free(NULL, 0), gdn_slot_reset(NULL, 0, NULL),
            gdn_engine_run_layer(NULL, 0, NULL), gdn_engine_run_step(NULL, NULL), gdn_engine_commit(NULL, NULL),
            gdn_engine_enqueue_rows(NULL, NULL), gdn_engine_enqueue_layer(NULL, 0, NULL), gdn_engine_enqueue_commit(NULL, NULL),
            gdn_engine_step_rows(NULL, NULL, NULL, NULL), gdn_engine_check_device_error(NULL, NULL),
            gdn_engine_synchronize(NULL, NULL), gdn_engine_memory(NULL, NULL), gdn_engine_memory(f->e, NULL),
            gdn_slot_read_state(NULL, 0, 0, f->state_io), gdn_slot_write_state(NULL, 0, 0, f->state_io),
            gdn_slot_copy_async(NULL, 0, 1, NULL), gdn_slot_import_async(NULL, 0, f->state_io, 1 << 20, NULL),
            gdn_slot_export_async(NULL, 0, f->state_io, 1 << 20, NULL), gdn_engine_upload(f->e, NULL, &slot, 4, NULL),
            gdn_engine_upload(f->e, f->accepted_dev, NULL, 4, NULL), gdn_engine_download(f->e, NULL, f->accepted_dev, 4, NULL),
            gdn_engine_download(f->e, &slot, NULL, 4, NULL), gdn_engine_upload(NULL, f->accepted_dev, &slot, 4, NULL),
            gdn_engine_set_layer_params(f->e, 0, NULL, f->A_log[0]), gdn_engine_set_layer_params(NULL, 0, f->A_log[0], f->A_log[0]),
            gdn_engine_layer_io(f->e, 0, NULL), gdn_engine_state_pool(f->e, 0, NULL), gdn_engine_config_validate(NULL),
            gdn_engine_create(NULL, NULL), gdn_engine_config_init(NULL, NULL), gdn_model_preset(NULL, 1, NULL),
        };
        for (size_t i = 0; i < sizeof got / sizeof got[0]; i++)
            if (got[i] != GDN_EINVAL) return fail(f, "NULL-argument call #%zu returned %s, expected EINVAL", i, gdn_status_name(got[i]));
        refused_unchanged(f, "NULL-argument calls");
        gdn_engine_destroy(NULL);
        if (gdn_slot_is_allocated(NULL, 0) || gdn_slot_count(NULL) != 0 || gdn_engine_get_config(NULL) != NULL ||
            gdn_engine_accepted(NULL) != NULL || gdn_engine_backend(NULL) != GDN_BACKEND_AUTO || !gdn_engine_last_error(NULL))
            fail(f, "a NULL-engine query did not return its documented empty value");
        return;
    }
    case 1: { /* layer indices out of range */
        const int32_t bad = c & 16 ? f->L + (int32_t)(c >> 5) : -1 - (int32_t)(c >> 5);
        ex_add(&x, GDN_ELAYER);
        pre_call(f, &x);
        gdn_layer_io io;
        gdn_state_pool pool;
        const gdn_status got[] = {gdn_engine_set_layer_params(f->e, bad, f->A_log[0], f->dt_bias[0]),
                                  gdn_engine_layer_io(f->e, bad, &io), gdn_engine_state_pool(f->e, bad, &pool)};
        for (size_t i = 0; i < 3; i++)
            if (got[i] != GDN_ELAYER) return fail(f, "bad layer %d call #%zu returned %s", bad, i, gdn_status_name(got[i]));
        return refused_unchanged(f, "bad-layer calls");
    }
    case 2: { /* enqueue calls outside a CALLER_WORK step */
        const int32_t layer = pick_layer(f);
        if (f->st.active && f->st.caller_work) return; /* only the misuse is fuzzed here */
        ex_add(&x, GDN_EMISUSE);
        pre_call(f, &x);
        s = gdn_engine_enqueue_rows(f->e, NULL);
        if (!check_status(f, "enqueue_rows", &x, s)) return;
        expect y = {0};
        if (layer < 0 || layer >= f->L) ex_add(&y, GDN_ELAYER);
        else ex_add(&y, GDN_EMISUSE);
        s = gdn_engine_enqueue_layer(f->e, layer, NULL);
        if (!check_status(f, "enqueue_layer", &y, s)) return;
        s = gdn_engine_enqueue_commit(f->e, NULL);
        if (!check_status(f, "enqueue_commit", &x, s)) return;
        return refused_unchanged(f, "enqueue misuse");
    }
    case 3: { /* step_rows, device error, synchronize, memory report, last error */
        const int32_t *rd = NULL;
        int32_t bucket = -1;
        s = gdn_engine_step_rows(f->e, &rd, NULL, &bucket);
        if (!f->st.active) ex_add(&x, GDN_EMISUSE);
        if (!check_status(f, "step_rows", &x, s)) return;
        if (s == GDN_OK && bucket != f->st.bucket) return fail(f, "step_rows bucket %d, model %d", bucket, f->st.bucket);
        expect ok = {0}, flag = {0};
        if (f->device_flag) ex_add(&flag, GDN_EDEVICE);
        pre_call(f, &flag);
        if (!check_status(f, "check_device_error", &flag, gdn_engine_check_device_error(f->e, NULL))) return;
        f->device_flag = 0;
        if (!check_status(f, "synchronize", &ok, gdn_engine_synchronize(f->e, NULL))) return;
        gdn_memory_report m;
        if (!check_status(f, "memory", &ok, gdn_engine_memory(f->e, &m))) return;
        if (m.total != m.state_pools + m.verify_cache + m.token_store + m.ring + m.io_buffers + m.parameters + m.indices)
            return fail(f, "memory report: total %llu is not the sum of its parts", (unsigned long long)m.total);
        if ((f->pool_mode != 0) != (m.state_pools == 0) || (f->views_mode != 0) != (m.io_buffers == 0))
            return fail(f, "memory report counts caller-owned memory (pools %llu, io %llu)", (unsigned long long)m.state_pools,
                        (unsigned long long)m.io_buffers);
        if (strcmp(gdn_engine_last_error(f->e), "") != 0) return fail(f, "last_error not empty on the CPU backend");
        return guard_check(f, 0, 0, "queries");
    }
    case 4: { /* gdn_engine_set_layer_params, valid */
        const int32_t layer = (int32_t)((c >> 4) % (unsigned)f->L);
        float A[FZ_MAX_HV], D[FZ_MAX_HV];
        for (int32_t h = 0; h < f->HV; h++) A[h] = (float)(0.5 * normal(f)), D[h] = (float)(0.5 * normal(f));
        pre_call(f, &x);
        s = gdn_engine_set_layer_params(f->e, layer, A, D);
        if (!check_status(f, "set_layer_params", &x, s)) return;
        guard_check(f, 0, 0, "set_layer_params");
        memcpy(f->A_log[layer], A, sizeof A), memcpy(f->dt_bias[layer], D, sizeof D);
        /* "At load time": pending fold / ring work and an uncommitted verify's cache were computed
         * with the old gates; the model stops vouching for what they touch. */
        for (int32_t slot = 0; slot < f->S; slot++)
            if (f->strategy != GDN_VERIFY_CACHE) f->known[slot][layer] = 0;
        if (f->st.active && f->st.kind == GDN_STEP_VERIFY && !f->st.committed)
            for (int32_t i = 0; i < f->st.batch; i++) f->st.taint[layer][i] = 1;
        return;
    }
    case 5: { /* status names never NULL */
        const gdn_status v = (gdn_status)(int32_t)(int8_t)(c * 37u);
        if (!gdn_status_name(v) || !gdn_status_string(v)) fail(f, "status %d: NULL name or text", (int)v);
        return;
    }
    case 6: upload_accepted(f, c >> 4); return;
    case 7: { /* reads of a layer's whole output (download of a backend buffer) */
        const int32_t layer = (int32_t)((c >> 4) % (unsigned)f->L);
        gdn_layer_io io;
        if (gdn_engine_layer_io(f->e, layer, &io) != GDN_OK || !io.o) return fail(f, "layer_io(%d) failed", layer);
        if (f->views_mode == 0 && io.o != f->ten[layer][T_O].base) return fail(f, "layer_io(%d).o moved", layer);
        const region *o = &f->regs[f->o_reg[layer]];
        unsigned char *copy = malloc(o->bytes);
        pre_call(f, &x);
        s = gdn_engine_download(f->e, copy, o->ptr, o->bytes, NULL);
        if (check_status(f, "download(o)", &x, s) && memcmp(copy, o->ptr, o->bytes) != 0) fail(f, "download(o) did not copy");
        free(copy);
        return guard_check(f, 0, 0, "download(o)");
    }
    default: { /* check every live slot */
        for (int32_t slot = 0; slot < f->S && !f->failed; slot++)
            for (int32_t l = 0; l < f->L && f->alloc[slot] && !f->failed; l++) call_read(f, l, slot, 0);
        return;
    }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Configuration                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* The documented validation, field by field in declaration order (gdn.h). */
static gdn_status expected_config_status(const gdn_engine_config *c)
{
    const gdn_model_config *m = &c->model;
    if (m->num_layers < 1) return GDN_ECONFIG_LAYERS;
    if (m->num_k_heads < 1 || m->num_v_heads < 1 || m->num_v_heads % m->num_k_heads) return GDN_ECONFIG_HEADS;
    const int dk = m->head_dim_k, dv = m->head_dim_v;
    if (!(dk == 64 || dk == 128 || dk == 256) || !(dv == 64 || dv == 128 || dv == 256)) return GDN_ECONFIG_HEAD_DIM;
    if (!(m->scale >= 0.0f) || isinf(m->scale)) return GDN_ECONFIG_SCALE;
    if (c->state_dtype != GDN_DTYPE_F32 && c->state_dtype != GDN_DTYPE_BF16) return GDN_ECONFIG_STATE_DTYPE;
    if (c->input_dtype != GDN_DTYPE_BF16 && c->input_dtype != GDN_DTYPE_F16) return GDN_ECONFIG_INPUT_DTYPE;
    if (c->output_dtype != GDN_DTYPE_BF16 && c->output_dtype != GDN_DTYPE_F32) return GDN_ECONFIG_OUTPUT_DTYPE;
    if (c->num_slots < 1) return GDN_ECONFIG_SLOTS;
    if (c->max_batch < 1) return GDN_ECONFIG_MAX_BATCH;
    if (c->max_tokens < 1 || c->max_tokens > GDN_MAX_TOKENS) return GDN_ECONFIG_MAX_TOKENS;
    if (c->num_buckets < 0 || c->num_buckets > GDN_MAX_BUCKETS) return GDN_ECONFIG_BUCKETS;
    for (int32_t i = 0; i < c->num_buckets; i++)
        if (c->buckets[i] < 1 || (i > 0 && c->buckets[i] <= c->buckets[i - 1])) return GDN_ECONFIG_BUCKETS;
    if (c->num_buckets > 0 && c->buckets[c->num_buckets - 1] != c->max_batch) return GDN_ECONFIG_BUCKETS;
    const int vs = (int)c->verify_strategy;
    if (vs != GDN_VERIFY_CACHE && vs != GDN_VERIFY_FOLD && vs != GDN_VERIFY_AUTO && vs != GDN_VERIFY_RING)
        return GDN_ECONFIG_VERIFY;
    if (c->ring_length != 0 && (c->ring_length < GDN_MIN_RING_LENGTH || c->ring_length > GDN_MAX_RING_LENGTH))
        return GDN_ECONFIG_RING;
    if (c->ring_write_through < -1) return GDN_ECONFIG_RING_WRITE_THROUGH;
    const int be = (int)c->backend;
    if (be != GDN_BACKEND_AUTO && be != GDN_BACKEND_CUDA && be != GDN_BACKEND_CPU) return GDN_ECONFIG_BACKEND;
    const int gm = (int)c->graph_mode;
    if (gm != GDN_GRAPHS_LAZY && gm != GDN_GRAPHS_AT_CREATE && gm != GDN_GRAPHS_OFF) return GDN_ECONFIG_GRAPHS;
    if (c->state_pool) {
        const int64_t elems = (int64_t)m->num_v_heads * dv * dk, size = (int64_t)gdn_dtype_size(c->state_dtype);
        const int64_t slot = c->state_slot_stride ? c->state_slot_stride : elems;
        const int64_t layer = c->state_layer_stride ? c->state_layer_stride : slot * c->num_slots;
        if (c->state_slot_stride < 0 || c->state_layer_stride < 0 || slot < elems || layer < slot * c->num_slots ||
            slot * size % 16 || layer * size % 16 || (uintptr_t)c->state_pool % 16)
            return GDN_ECONFIG_POOL;
    }
    if (c->io_views)
        for (int32_t l = 0; l < m->num_layers; l++) {
            const gdn_layer_views *v = &c->io_views[l];
            const gdn_view *all[] = {&v->q, &v->k, &v->v, &v->a, &v->b, &v->o};
            for (int i = 0; i < 6; i++)
                if (!all[i]->data) return GDN_ECONFIG_VIEWS;
            for (int i = 0; i < 3; i++) { /* q, k: 16-byte heads; v: 4-byte */
                const uintptr_t align = i < 2 ? 16 : 4;
                const int64_t el = i < 2 ? 8 : 2;
                if ((uintptr_t)all[i]->data % align || all[i]->row_stride % el || all[i]->token_stride % el ||
                    all[i]->head_stride % el)
                    return GDN_ECONFIG_VIEWS;
            }
        }
    return GDN_OK;
}

static unsigned char *alloc_buf(size_t bytes, int fill)
{
    unsigned char *p = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
    memset(p, fill, (bytes + 64 + 63) / 64 * 64);
    return p;
}

/* One tensor in caller memory; mode 1 dense (zero strides), 2 strided. */
static void make_view(fz *f, int32_t l, int which, int mode, int32_t H, int32_t D, size_t esize, int64_t align_el)
{
    gdn_view *vw = which == T_Q ? &f->views[l].q : which == T_K ? &f->views[l].k : which == T_V ? &f->views[l].v
                 : which == T_A ? &f->views[l].a : which == T_B ? &f->views[l].b : &f->views[l].o;
    size_t elems;
    int64_t offset = 0;
    if (mode == 1) {
        elems = (size_t)f->MB * (size_t)f->MT * (size_t)H * (size_t)D;
        vw->row_stride = vw->token_stride = vw->head_stride = 0;
    } else {
        vw->head_stride = D + align_el * (int64_t)(u8(f) % 2);
        vw->token_stride = H * vw->head_stride + align_el * (int64_t)(u8(f) % 3);
        vw->row_stride = f->MT * vw->token_stride + align_el * (int64_t)(u8(f) % 3);
        offset = align_el * (int64_t)(u8(f) % 2);
        elems = (size_t)(offset + (f->MB - 1) * vw->row_stride + (f->MT - 1) * vw->token_stride + (H - 1) * vw->head_stride + D);
    }
    f->view_bytes[l][which] = elems * esize;
    f->view_buf[l][which] = alloc_buf(elems * esize, which == T_O ? 0x7f : 0xa5);
    vw->data = f->view_buf[l][which] + (size_t)offset * esize;
}

static void make_views(fz *f)
{
    for (int32_t l = 0; l < f->L; l++) {
        if (f->views_mode == 3) { /* fused: q | k | v in one projection, a | b in another */
            const int64_t qk = (int64_t)f->HK * f->K, N = 2 * qk + (int64_t)f->HV * f->V + 8 * (int64_t)(u8(f) % 2);
            const size_t e = f->isize;
            const size_t n1 = (size_t)(f->MB * f->MT * N), M = (size_t)(2 * f->HV + (int32_t)(u8(f) % 3));
            const size_t n2 = (size_t)f->MB * (size_t)f->MT * M;
            f->view_buf[l][T_Q] = alloc_buf(n1 * e, 0xa5), f->view_bytes[l][T_Q] = n1 * e;
            f->view_buf[l][T_A] = alloc_buf(n2 * e, 0xa5), f->view_bytes[l][T_A] = n2 * e;
            unsigned char *p = f->view_buf[l][T_Q], *g = f->view_buf[l][T_A];
            f->views[l].q = (gdn_view){p, f->MT * N, N, f->K};
            f->views[l].k = (gdn_view){p + (size_t)qk * e, f->MT * N, N, f->K};
            f->views[l].v = (gdn_view){p + (size_t)(2 * qk) * e, f->MT * N, N, f->V};
            f->views[l].a = (gdn_view){g, f->MT * (int64_t)M, (int64_t)M, 1};
            f->views[l].b = (gdn_view){g + (size_t)f->HV * e, f->MT * (int64_t)M, (int64_t)M, 1};
            make_view(f, l, T_O, 2, f->HV, f->V, f->osize, 1);
            continue;
        }
        make_view(f, l, T_Q, f->views_mode, f->HK, f->K, f->isize, 8);
        make_view(f, l, T_K, f->views_mode, f->HK, f->K, f->isize, 8);
        make_view(f, l, T_V, f->views_mode, f->HV, f->V, f->isize, 2);
        make_view(f, l, T_A, f->views_mode, f->HV, 1, f->isize, 1);
        make_view(f, l, T_B, f->views_mode, f->HV, 1, f->isize, 1);
        make_view(f, l, T_O, f->views_mode, f->HV, f->V, f->osize, 1);
    }
}

/* Breaks one field of the configuration (the expected status follows from the validator above). */
static void corrupt(fz *f, gdn_engine_config *c, unsigned field, unsigned v)
{
    switch (field % 19) {
    case 0: c->model.num_layers = v % 2 ? 0 : -1 - (int32_t)(v >> 1); break;
    case 1: c->model.num_k_heads = v % 2 ? 0 : -2; break;
    case 2:
        if (v % 3 == 0) c->model.num_v_heads = 0;
        else c->model.num_k_heads = 2, c->model.num_v_heads = v % 3 == 1 ? 3 : 1;
        break;
    case 3: { static const int32_t bad[] = {0, 32, 96, 512, -64, 100}; c->model.head_dim_k = bad[v % 6]; break; }
    case 4: { static const int32_t bad[] = {0, 32, 96, 512, -64, 192}; c->model.head_dim_v = bad[v % 6]; break; }
    case 5: c->model.scale = v % 3 == 0 ? NAN : (v % 3 == 1 ? INFINITY : -0.5f); break;
    case 6: c->state_dtype = v % 2 ? GDN_DTYPE_F16 : (gdn_dtype)(3 + v % 5); break;
    case 7: c->input_dtype = v % 2 ? GDN_DTYPE_F32 : (gdn_dtype)(3 + v % 5); break;
    case 8: c->output_dtype = v % 2 ? GDN_DTYPE_F16 : (gdn_dtype)(3 + v % 5); break;
    case 9: c->num_slots = v % 2 ? 0 : -1 - (int32_t)(v >> 1); break;
    case 10: c->max_batch = v % 2 ? 0 : -1; break;
    case 11: c->max_tokens = v % 3 == 0 ? 0 : (v % 3 == 1 ? GDN_MAX_TOKENS + 1 : -4); break;
    case 12:
        switch (v % 5) {
        case 0: c->num_buckets = -1; break;
        case 1: c->num_buckets = GDN_MAX_BUCKETS + 1; break;
        case 2: c->num_buckets = 2, c->buckets[0] = 0, c->buckets[1] = c->max_batch; break;
        case 3: c->num_buckets = 2, c->buckets[0] = c->max_batch, c->buckets[1] = c->max_batch; break;
        default: c->num_buckets = 1, c->buckets[0] = c->max_batch + 1; break;
        }
        break;
    case 13: c->verify_strategy = (gdn_verify_strategy)(v % 2 ? 4 + (int)(v % 7) : 99); break;
    case 14:
        if (v % 4 == 3) { c->ring_write_through = -2 - (int32_t)(v % 1000); break; }
        { static const int32_t bad[] = {1, 3, 33, -1, 1000}; c->ring_length = bad[v % 5]; break; }
    case 15: c->backend = (gdn_backend_kind)(3 + (int)(v % 4)); break;
    case 16: c->graph_mode = (gdn_graph_mode)(3 + (int)(v % 4)); break;
    case 17: /* the caller's pool */
        if (!c->state_pool) break;
        switch (v % 5) {
        case 0: c->state_pool = (char *)c->state_pool + 4; break;
        case 1: c->state_slot_stride = (int64_t)f->elems - 8; break;
        case 2: c->state_slot_stride = (int64_t)f->elems + 1; break;
        case 3: c->state_layer_stride = (int64_t)f->elems * (c->num_slots > 1 ? c->num_slots - 1 : 1) - 8; break;
        default: c->state_slot_stride = -(int64_t)f->elems; break;
        }
        break;
    default: /* the caller's views */
        if (!c->io_views) break;
        {
            gdn_layer_views *v0 = &f->views[(v >> 3) % (unsigned)f->L];
            switch (v % 6) {
            case 0: v0->q.data = NULL; break;
            case 1: v0->o.data = NULL; break;
            case 2: v0->k.data = (char *)v0->k.data + 2; break;
            case 3: v0->q.token_stride += 1; if (!v0->q.row_stride) v0->q.row_stride = 1, v0->q.head_stride = 1; break;
            case 4: v0->v.data = (char *)v0->v.data + 2; break;
            default: v0->b.data = NULL; break;
            }
        }
        break;
    }
}

static int setup(fz *f)
{
    const unsigned b_layers = u8(f), geo = u8(f), d = u8(f), b_slots = u8(f), b_batch = u8(f), b_tok = u8(f);
    const unsigned b_strat = u8(f), b_buckets = u8(f), b_modes = u8(f), b_flags = u8(f), b_inv = u8(f);
    f->rng = gdn__rng_seeded(u32(f));
    /* Mostly the smallest shapes (one layer, one head: 4096 state elements), so that an input costs
     * about a millisecond; more layers and heads (grouped: HV = 2 HK) a fraction of the time. */
    static const int32_t layers_of[8] = {1, 1, 1, 1, 2, 2, 2, 3};
    static const int32_t hk_of[8] = {1, 1, 1, 1, 1, 2, 2, 2}, hv_of[8] = {1, 1, 1, 1, 2, 2, 4, 4};
    f->L = layers_of[b_layers % 8];
    f->HK = hk_of[geo % 8], f->HV = hv_of[geo % 8];
    f->K = (geo >> 3) % 4 == 3 ? 128 : 64;
    f->V = (geo >> 5) % 4 == 3 ? 128 : 64;
    if ((size_t)f->HV * f->K * f->V > 32768) f->HV = f->HK = 1;
    f->sd = d & 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
    f->id = d & 2 ? GDN_DTYPE_F16 : GDN_DTYPE_BF16;
    f->od = d & 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    f->l2 = !(d & 8);
    f->S = 1 + (int32_t)(b_slots % FZ_MAX_SLOTS);
    f->MB = b_batch % 8 == 7 ? 16 : 1 + (int32_t)(b_batch % 4);
    f->MT = b_tok % 16 == 15 ? GDN_MAX_TOKENS : 1 + (int32_t)(b_tok % 6);
    if (f->MB == 16 && f->MT == GDN_MAX_TOKENS && (b_batch >> 3) % 2) f->MT = 8; /* the largest buffers, rarely */
    f->elems = (size_t)f->HV * f->V * f->K;
    f->ssize = gdn_dtype_size(f->sd), f->isize = gdn_dtype_size(f->id), f->osize = gdn_dtype_size(f->od);
    f->gate_scale = (b_tok >> 4) % 8 == 7 ? 30.0 : ((b_tok >> 4) % 8 == 6 ? 3.0 : 0.1);
    f->beta_scale = (b_slots >> 3) % 4 == 3 ? 3.0 : 0.1;
    /* A quarter of the inputs check their first refusals by reading every live state before and after
     * (reads write fold / ring work back, so not all inputs do). */
    f->deep = (b_flags >> 3) % 4 == 3 ? 6 : 0;
    f->use_cb = (b_flags & 3) == 3;
    f->cb_commit = (b_flags >> 2) & 1;
    f->skip_inputs_ok = (b_flags >> 6) & 1;
    for (int32_t l = 0; l < f->L; l++) f->cb_perm[l] = (uint8_t)l;
    for (int32_t l = f->L - 1; l > 0; l--) { /* a permutation of the layers for the callback */
        const int32_t j = (int32_t)(gdn__rng_next(&f->rng) % (uint64_t)(l + 1));
        const uint8_t t = f->cb_perm[l];
        f->cb_perm[l] = f->cb_perm[j], f->cb_perm[j] = t;
    }

    gdn_model_config model;
    if (gdn_model_preset("tiny", f->L, &model) != GDN_OK) return fail(f, "preset tiny"), 0;
    model.num_k_heads = f->HK, model.num_v_heads = f->HV, model.head_dim_k = f->K, model.head_dim_v = f->V;
    model.use_qk_l2norm = f->l2;
    if (d & 16) model.scale = (float)(1 + (d >> 5)) / 16.0f;
    gdn_engine_config *c = &f->req;
    if (gdn_engine_config_init(c, &model) != GDN_OK) return fail(f, "config_init"), 0;
    c->state_dtype = f->sd, c->input_dtype = f->id, c->output_dtype = f->od;
    c->num_slots = f->S, c->max_batch = f->MB, c->max_tokens = f->MT;
    static const gdn_verify_strategy strategies[] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_AUTO, GDN_VERIFY_RING};
    c->verify_strategy = strategies[b_strat % 4];
    switch ((b_strat >> 2) % 4) {
    case 0: c->ring_length = 0; break;
    case 1: c->ring_length = 4; break;
    case 2: c->ring_length = 5 + (int32_t)((b_strat >> 4) % 4); break;
    default: c->ring_length = 4 + (int32_t)((b_strat >> 4) % 29); break;
    }
    if (b_buckets % 4 == 0 && f->MB > 1) { /* a custom bucket list ending at max_batch */
        int32_t n = 0;
        for (int32_t size = 1; size < f->MB; size++)
            if ((b_buckets >> (2 + size % 6)) & 1) c->buckets[n++] = size;
        c->buckets[n++] = f->MB;
        c->num_buckets = n;
    }
    c->graph_mode = (gdn_graph_mode)(b_modes % 3);
    c->backend = GDN_BACKEND_CPU;
    f->pool_mode = (int)((b_modes >> 2) % 3);
    f->views_mode = (int)((b_modes >> 4) % 4);
    if (f->use_cb) c->capture = capture_cb, c->capture_user = f;

    if (f->pool_mode) { /* the caller's pool: random states in the slots, canaries in the gaps */
        const int64_t align_el = (int64_t)(16 / f->ssize);
        int64_t slot_stride = 0, layer_stride = 0;
        if (f->pool_mode == 2) {
            slot_stride = (int64_t)f->elems + align_el * (int64_t)(u8(f) % 3);
            layer_stride = u8(f) % 2 ? 0 : slot_stride * f->S + align_el * (int64_t)(u8(f) % 3);
        }
        const int64_t ss = slot_stride ? slot_stride : (int64_t)f->elems;
        const int64_t ls = layer_stride ? layer_stride : ss * f->S;
        f->pool_buf_bytes = (size_t)(ls * f->L) * f->ssize + 64;
        f->pool_buf = alloc_buf(f->pool_buf_bytes, 0x5a);
        c->state_pool = f->pool_buf + 16 * (u8(f) % 2);
        c->state_slot_stride = slot_stride, c->state_layer_stride = layer_stride;
        for (int32_t l = 0; l < f->L; l++)
            for (int32_t s = 0; s < f->S; s++)
                random_state(f, (unsigned char *)c->state_pool + (size_t)(l * ls + s * ss) * f->ssize);
    }
    if (f->views_mode) {
        make_views(f);
        c->io_views = f->views;
    }
    if (b_inv < 40) { /* break one or two fields */
        corrupt(f, c, u8(f), u8(f));
        if (b_inv < 10) corrupt(f, c, u8(f), u8(f));
    }

    const gdn_status want = expected_config_status(c);
    const gdn_status validated = gdn_engine_config_validate(c);
    gdn_engine *sentinel = (gdn_engine *)(uintptr_t)0x1234;
    gdn_engine *e = sentinel;
    if (want == GDN_OK && (b_flags & 0x80)) { /* host allocation n of the creation fails: ENOMEM, nothing kept */
        const unsigned n = u8(f) % 32;
        gdn__alloc_fail_after((int64_t)n);
        const gdn_status failed = gdn_engine_create(c, &e);
        gdn__alloc_fail_after(-1);
        trace(f, "create with host allocation %u failing -> %s", n, gdn_status_name(failed));
        if (failed == GDN_OK) { /* fewer allocations than n: a normal engine */
            f->e = e;
            f->res->created = 1;
            return 1;
        }
        if (failed != GDN_ENOMEM) return fail(f, "engine_create with allocation %u failing returned %s, not ENOMEM", n, gdn_status_name(failed)), 0;
        if (e != sentinel) return fail(f, "engine_create that ran out of memory wrote *out"), 0;
        f->res->refusals++;
    }
    const gdn_status created = gdn_engine_create(c, &e);
    trace(f, "create(L=%d HK=%d HV=%d K=%d V=%d state %s in %s out %s slots %d batch %d tokens %d strategy %d ring %d "
             "pool %d views %d cb %d deep %d) -> %s (expected %s)",
          c->model.num_layers, c->model.num_k_heads, c->model.num_v_heads, c->model.head_dim_k, c->model.head_dim_v,
          f->sd == GDN_DTYPE_BF16 ? "bf16" : "f32", f->id == GDN_DTYPE_F16 ? "f16" : "bf16", f->od == GDN_DTYPE_F32 ? "f32" : "bf16",
          c->num_slots, c->max_batch, c->max_tokens, (int)c->verify_strategy, c->ring_length, f->pool_mode, f->views_mode,
          f->use_cb, f->deep, gdn_status_name(created), gdn_status_name(want));
    if (validated != want) return fail(f, "config_validate returned %s, expected %s", gdn_status_name(validated), gdn_status_name(want)), 0;
    if (created != want) {
        if (created == GDN_OK) gdn_engine_destroy(e);
        return fail(f, "engine_create returned %s, expected %s", gdn_status_name(created), gdn_status_name(want)), 0;
    }
    if (want != GDN_OK) {
        if (e != sentinel) fail(f, "refused engine_create wrote *out");
        f->res->refusals++;
        return 0;
    }
    f->e = e;
    f->res->created = 1;
    return 1;
}

/* After creation: the resolved configuration, the engine's memory, the model. */
static int attach(fz *f)
{
    const gdn_engine_config *r = gdn_engine_get_config(f->e);
    f->cfg = r;
    if (gdn_engine_backend(f->e) != GDN_BACKEND_CPU) return fail(f, "backend is not CPU"), 0;
    gdn_verify_strategy want = f->req.verify_strategy;
    if (want == GDN_VERIFY_AUTO && f->MT <= 1) { /* (no mixer here) */
        const int64_t above = f->sd == GDN_DTYPE_F32 ? GDN_AUTO_RING_HEADS_F32 : GDN_AUTO_RING_HEADS_BF16;
        want = f->pool_mode == 0 && (int64_t)f->MB * f->HV > above ? GDN_VERIFY_RING : GDN_VERIFY_CACHE;
    } else if (want == GDN_VERIFY_AUTO) {
        want = f->sd == GDN_DTYPE_BF16 && f->MT == 2 && f->MB <= 2 ? GDN_VERIFY_CACHE : GDN_VERIFY_FOLD;
    }
    if (r->verify_strategy != want) return fail(f, "resolved strategy %d, expected %d", (int)r->verify_strategy, (int)want), 0;
    f->strategy = r->verify_strategy;
    const int32_t default_length = f->MT > 1 ? GDN_DEFAULT_RING_LENGTH : GDN_DEFAULT_DECODE_RING_LENGTH;
    if (r->ring_length != (f->req.ring_length ? f->req.ring_length : default_length))
        return fail(f, "resolved ring_length %d", r->ring_length), 0;
    const float want_scale = f->req.model.scale == 0.0f ? 1.0f / sqrtf((float)f->K) : f->req.model.scale;
    if (r->model.scale != want_scale) return fail(f, "resolved scale %g, expected %g", r->model.scale, want_scale), 0;
    f->scale = r->model.scale;
    if (f->req.num_buckets == 0) { /* 1, 2, 4, 8, every 8 to 256, then max_batch */
        int32_t n = 0, want_b[GDN_MAX_BUCKETS];
        for (int32_t size = 1; size < f->MB; size = size < 8 ? size * 2 : size + 8) want_b[n++] = size;
        want_b[n++] = f->MB;
        if (r->num_buckets != n || memcmp(r->buckets, want_b, sizeof(int32_t) * (size_t)n) != 0)
            return fail(f, "default bucket list differs (%d buckets)", r->num_buckets), 0;
    } else if (r->num_buckets != f->req.num_buckets || memcmp(r->buckets, f->req.buckets, sizeof(int32_t) * (size_t)r->num_buckets)) {
        return fail(f, "the bucket list changed at creation"), 0;
    }

    /* Pools as the checks see them. */
    gdn_state_pool p0, p1;
    if (gdn_engine_state_pool(f->e, 0, &p0) != GDN_OK) return fail(f, "state_pool(0)"), 0;
    f->pool0 = p0.data;
    f->slot_stride_b = (size_t)p0.slot_stride * f->ssize;
    if (p0.dtype != f->sd || p0.num_slots != f->S || p0.slot_stride < (int64_t)f->elems)
        return fail(f, "state_pool(0) describes dtype %d, %lld slots, stride %lld", (int)p0.dtype, (long long)p0.num_slots,
                    (long long)p0.slot_stride), 0;
    if (f->L > 1) {
        if (gdn_engine_state_pool(f->e, 1, &p1) != GDN_OK) return fail(f, "state_pool(1)"), 0;
        f->layer_stride_b = (size_t)((unsigned char *)p1.data - f->pool0);
    } else {
        f->layer_stride_b = f->slot_stride_b * (size_t)f->S;
    }
    if (f->pool_mode) {
        if (f->pool0 != (unsigned char *)f->req.state_pool) return fail(f, "state_pool is not the caller's"), 0;
        f->pool_reg = f->nregs;
        add_region(f, f->pool_buf, f->pool_buf_bytes, "caller pool", -1);
    } else {
        f->pool_reg = f->nregs;
        add_region(f, f->pool0, f->layer_stride_b * (size_t)f->L, "pool", -1);
    }
    /* Tensors. */
    for (int32_t l = 0; l < f->L; l++) {
        gdn_layer_io io;
        if (gdn_engine_layer_io(f->e, l, &io) != GDN_OK) return fail(f, "layer_io(%d)", l), 0;
        void *ptrs[T_COUNT] = {io.q, io.k, io.v, io.a, io.b, io.o};
        const int32_t H[T_COUNT] = {f->HK, f->HK, f->HV, f->HV, f->HV, f->HV};
        const int32_t D[T_COUNT] = {f->K, f->K, f->V, 1, 1, f->V};
        for (int t = 0; t < T_COUNT; t++) {
            tensor *x = &f->ten[l][t];
            x->base = ptrs[t];
            x->H = H[t], x->D = D[t];
            x->dtype = t == T_O ? f->od : f->id;
            if (f->views_mode) {
                const gdn_view *vw = t == T_Q ? &f->views[l].q : t == T_K ? &f->views[l].k : t == T_V ? &f->views[l].v
                                   : t == T_A ? &f->views[l].a : t == T_B ? &f->views[l].b : &f->views[l].o;
                if (ptrs[t] != vw->data) return fail(f, "layer_io(%d).%s is not the caller's view", l, tensor_name[t]), 0;
                x->rs = vw->row_stride, x->ts = vw->token_stride, x->hs = vw->head_stride;
                if (f->view_buf[l][t]) add_region(f, f->view_buf[l][t], f->view_bytes[l][t], tensor_name[t], l);
            } else {
                const size_t bytes = (size_t)f->MB * f->MT * (size_t)H[t] * D[t] * (t == T_O ? f->osize : f->isize);
                add_region(f, ptrs[t], bytes, tensor_name[t], l);
            }
            if (t == T_O) f->o_reg[l] = f->nregs - 1;
        }
    }
    f->accepted_dev = gdn_engine_accepted(f->e);
    if (!f->accepted_dev) return fail(f, "accepted buffer NULL"), 0;
    add_region(f, f->accepted_dev, sizeof(int32_t) * (size_t)f->MB, "accepted", -1); /* last: upload_accepted knows */
    memcpy(f->accepted_shadow, f->accepted_dev, sizeof(int32_t) * (size_t)f->MB);
    for (int32_t l = 0; l < f->L; l++) {
        const size_t b = f->regs[f->o_reg[l]].bytes;
        if (b > f->o_scratch_bytes) f->o_scratch_bytes = b;
    }
    f->o_scratch = malloc(f->o_scratch_bytes ? f->o_scratch_bytes : 1);

    /* The model: zeroed pools, or the caller's states. */
    f->state = calloc((size_t)f->S * f->L * f->elems, sizeof(double));
    f->token_doubles = 2 * (size_t)f->HK * f->K + (size_t)f->HV * f->V + 2 * (size_t)f->HV;
    f->saved = calloc((size_t)f->L * f->MB * f->MT * f->token_doubles, sizeof(double));
    f->S_scratch = malloc(f->elems * sizeof(double));
    f->o_expect = malloc((size_t)f->MT * f->HV * f->V * sizeof(double));
    f->deep_before = malloc((size_t)f->S * f->L * f->elems * f->ssize);
    f->state_io = malloc(f->elems * f->ssize);
    for (int32_t s = 0; s < f->S; s++) {
        f->free_stack[s] = f->S - 1 - s;
        for (int32_t l = 0; l < f->L; l++) {
            const unsigned char *raw = pool_slot(f, l, s);
            double *m = model_state(f, s, l);
            for (size_t j = 0; j < f->elems; j++) {
                m[j] = gdn__load_f32(raw, f->sd, (int64_t)j);
                if (!f->pool_mode && m[j] != 0.0) return fail(f, "a fresh pool is not zeroed (slot %d layer %d)", s, l), 0;
            }
            f->known[s][l] = 1;
        }
    }
    f->free_count = f->S;
    /* Layer parameters: random for most layers (the default is zeros). */
    for (int32_t l = 0; l < f->L; l++) {
        if (u8(f) % 4 == 0) continue;
        for (int32_t h = 0; h < f->HV; h++)
            f->A_log[l][h] = (float)(0.3 * normal(f)), f->dt_bias[l][h] = (float)(0.3 * normal(f));
        gdn_status s = gdn_engine_set_layer_params(f->e, l, f->A_log[l], f->dt_bias[l]);
        if (s != GDN_OK) return fail(f, "set_layer_params(%d): %s", l, gdn_status_name(s)), 0;
    }
    return 1;
}

static void teardown(fz *f)
{
    if (f->e) gdn_engine_destroy(f->e);
    for (int i = 0; i < f->nregs; i++) free(f->regs[i].snap);
    for (int32_t l = 0; l < FZ_MAX_LAYERS; l++)
        for (int t = 0; t < T_COUNT; t++) free(f->view_buf[l][t]);
    free(f->pool_buf), free(f->o_scratch), free(f->state), free(f->saved), free(f->S_scratch), free(f->o_expect);
    free(f->deep_before), free(f->state_io);
}

/* ---------------------------------------------------------------------------------------------- */
/* The input                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

int gdn_fuzz_run_one(const uint8_t *data, size_t size, unsigned flags, gdn_fuzz_result *result)
{
    memset(result, 0, sizeof *result);
    fz *f = calloc(1, sizeof *f);
    f->data = data, f->size = size, f->res = result;
    f->strict = (flags & GDN_FUZZ_STRICT) != 0;
    const int64_t live_before = gdn__allocation_live(); /* the library's allocations not yet freed */
    const char *t = getenv("GDN_FUZZ_TRACE");
    f->trace = t && *t && *t != '0';
    f->op_index = -1;
    if (setup(f) && attach(f)) {
        static const char *const names[] = {"alloc", "free", "reset", "step", "begin", "run_layer", "run_step", "commit",
                                            "read", "write", "copy", "import", "export", "caller_step", "misc", "step"};
        while (f->at < f->size && f->op_index + 1 < FZ_MAX_OPS && !f->failed) {
            f->op_index++;
            const unsigned op = u8(f) % 16;
            f->op_name = names[op];
            result->ops++;
            if (over_budget(f) && op != 0 && op != 1 && op != 5 && op != 6 && op != 7 && op != 14) {
                (void)u8(f); /* the expensive ones stop here; their first byte still goes */
                continue;
            }
            switch (op) {
            case 0: call_alloc(f); break;
            case 1: call_free(f, pick_slot(f)); break;
            case 2: call_reset(f, pick_slot(f)); break;
            case 3: case 15: op_step(f, 0); break;
            case 4: { /* begin alone: the layers and the commit come as their own operations */
                int32_t rows[FZ_ROWS_CAP], writes[FZ_ROWS_CAP];
                int use_writes, slots_null;
                const unsigned k = u8(f);
                const gdn_step_kind kind = k % 2 ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
                const int32_t T = kind == GDN_STEP_VERIFY ? 1 + (int32_t)((k >> 1) % (unsigned)f->MT) : 1;
                const int32_t batch = build_rows(f, rows, writes, &use_writes, &slots_null);
                call_begin(f, kind, T, batch, slots_null ? NULL : rows, use_writes ? writes : NULL, 0, k >> 4);
                break;
            }
            case 5: call_run_layer(f, pick_layer(f)); break;
            case 6: call_run_step(f); break;
            case 7: {
                const unsigned c = u8(f);
                if (c % 2) upload_accepted(f, c);
                call_commit(f);
                break;
            }
            case 8: {
                const int32_t layer = pick_layer(f), slot = pick_slot(f);
                call_read(f, layer, slot, u8(f) % 32 == 31);
                break;
            }
            case 9: {
                const int32_t layer = pick_layer(f), slot = pick_slot(f);
                call_write(f, layer, slot, u8(f) % 32 == 31);
                break;
            }
            case 10: {
                const int32_t dst = pick_slot(f), src = pick_slot(f);
                call_copy(f, dst, src);
                break;
            }
            case 11: {
                const int32_t slot = pick_slot(f);
                call_import(f, slot, u8(f));
                break;
            }
            case 12: {
                const int32_t slot = pick_slot(f);
                call_export(f, slot, u8(f));
                break;
            }
            case 13: op_step(f, 1); break;
            default: op_misc(f); break;
            }
        }
        /* The end: the step finished (its slots can be read then), every live slot's state, the device
         * flag, the slot count. */
        f->op_name = "final checks";
        mstep *st = &f->st;
        if (!f->failed && st->active && !st->caller_work) {
            for (int32_t l = 0; l < f->L && !f->failed; l++)
                if (!st->ran[l]) call_run_layer(f, l);
            if (st->kind == GDN_STEP_VERIFY && !st->committed && !f->failed) call_commit(f);
        }
        for (int32_t slot = 0; slot < f->S && !f->failed; slot++)
            for (int32_t l = 0; l < f->L && f->alloc[slot] && !f->failed; l++) call_read(f, l, slot, 0);
        if (!f->failed) {
            gdn_status s = gdn_engine_check_device_error(f->e, NULL);
            if (s != (f->device_flag ? GDN_EDEVICE : GDN_OK))
                fail(f, "device error flag: %s, the model's %s", gdn_status_name(s), f->device_flag ? "raised" : "clear");
            int32_t live = 0;
            for (int32_t slot = 0; slot < f->S; slot++) {
                live += f->alloc[slot];
                if (!!gdn_slot_is_allocated(f->e, slot) != f->alloc[slot]) fail(f, "slot %d allocation differs from the model", slot);
            }
            if (gdn_slot_count(f->e) != live) fail(f, "slot_count %d, model %d", gdn_slot_count(f->e), live);
        }
    }
    teardown(f);
    const int64_t leaked = gdn__allocation_live() - live_before;
    if (leaked != 0) fail(f, "the library holds %lld more host allocations than before the input (a leak)", (long long)leaked);
    for (size_t i = 0; i < sizeof known_bug / sizeof known_bug[0]; i++)
        if (f->trace && known_bug[i] && (f->known_bugs_hit >> i & 1u))
            fprintf(stderr, "  stepped around known bug: %s\n", known_bug[i]);
    const int failed = f->failed;
    free(f);
    return failed;
}
