/* The op-layer fuzz driver: see fuzz_op_driver.h. Test-side memory is plain malloc (ASan-checked). */
#include "fuzz_op_driver.h"
#include "row_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn_op.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"

/* Small on purpose: an input runs in a few milliseconds. */
#define OZ_MAX_SLOTS 7
#define OZ_MAX_BATCH 5
#define OZ_MAX_TOKENS 5
#define OZ_MAX_OPS 40
#define OZ_MAX_REGIONS 40
/* Head-tokens of 4096 state elements an input may model (a row's token of one value head), a few ms
 * of float64 work; past it the steps are skipped, slot operations and refusals go on. */
#define OZ_WORK_BUDGET 320
/* Guard bytes around every buffer (pattern-checked after every call). The pool's leading guard is two
 * slot strides: a write to slot -1 or -2 lands there, is reported, and corrupts nothing else. */
#define OZ_GUARD 64
#define OZ_GUARD_BYTE 0xA5

/* Library bugs found by this fuzzer and not fixed yet (bit i of known_bugs_hit): without
 * GDN_FUZZ_OP_STRICT the driver steps around each (it does not generate what shows it), so that a
 * fuzzing run keeps looking for new ones; each has a corpus input (tests/fuzz_corpus_op/open-bug-*)
 * that the replay suite runs strictly. */
/* (Fixed in 2026-11-23's session 10, inputs crash-*: a live row with a negative write slot wrote out
 * of bounds; gdn_op_slot_import(NULL) reset the slot; fold and ring stored strided inputs through a
 * size_t-wrapped negative offset.) */
enum { BUG_COUNT };
static const char *const known_bug[BUG_COUNT + 1] = {
    NULL,
};

const char *gdn_fuzz_op_known_bug(int index) { return index >= 0 && index < BUG_COUNT ? known_bug[index] : NULL; }

/* A buffer the op layer is given: lead guard | payload | tail guard. */
typedef struct region {
    const char *name;
    unsigned char *base;
    size_t lead, payload, tail;
    unsigned char *snap; /* the payload before a call */
    int whole;           /* the workspace: an accepted call may change all of it (snapshot only for refusals) */
    int snapped;         /* snap is this call's */
    /* Byte ranges the call may change, [start, end), sorted and merged when checked; more than fit
     * allow everything from the first one that does not (never the case at these sizes). */
    int nallow;
    size_t allow_lo[256], allow_hi[256];
} region;

/* A per-token tensor [B, T, H, D] where it lies in its region (element offsets in the payload). */
typedef struct tview {
    region *reg;
    gdn_dtype dtype;
    int32_t B, T, H, D;
    int64_t at;         /* element of (0, 0, 0, 0) */
    int64_t rs, ts, hs; /* as given to the op (all 0: dense) */
    int64_t r, t, h;    /* resolved */
} tview;

typedef enum call_kind { C_STEP, C_COMMIT, C_FLUSH, C_COPY, C_IMPORT, C_RESET, C_EXPORT } call_kind;
static const char *const call_name[] = {"layer_step", "commit", "flush", "slot_copy", "slot_import", "slot_reset", "slot_export"};

typedef struct oz {
    const uint8_t *data;
    size_t size, at;
    gdn__rng rng;
    gdn_fuzz_op_result *res;
    int strict, trace, failed;
    int32_t op_index;
    const char *op_name;

    /* geometry and the description's fixed fields */
    int32_t HK, HV, K, V, S, MB, MT, RL;
    gdn_dtype sd, id, od;
    gdn_verify_strategy strategy;
    float scale;  /* as given (0: K^-0.5) */
    double scale_used;
    int l2, flag_null;
    double in_scale, gate_scale;
    int64_t slot_stride;
    size_t elems, ssize, isize, osize;

    /* caller memory */
    region *regs[OZ_MAX_REGIONS];
    int nregs, nfixed; /* regions 0..nfixed-1 live for the whole input; the rest for the current step */
    region *pool, *ws, *alog, *dtb, *normw, *flag, *imp, *exp;
    size_t ws_bytes;

    /* The model. With a bf16 pool the strategies round the state at different points (cache at every
     * store, fold at the stores of a step, the ring only at write-backs: gdn.h), so the model keeps two
     * trajectories per slot, one rounded to bf16 at every store (SPEC 4's reference) and one never
     * rounded; a result passes within tolerance of the interval between them. */
    double *state;  /* [S][elems], rounded at every store */
    double *exact;  /* [S][elems], never rounded (bf16 pools; NULL otherwise: state serves) */
    uint8_t known[OZ_MAX_SLOTS], current[OZ_MAX_SLOTS];
    struct {
        int active; /* a verify whose commit may come */
        gdn_op_layer op;
        gdn_mixer mixer; /* op.mixer's copy (the step's own is on its stack) */
        int32_t batch, T;
        int32_t r[OZ_MAX_BATCH], w[OZ_MAX_BATCH];
        uint8_t live[OZ_MAX_BATCH], known[OZ_MAX_BATCH];
        double *after;       /* [MB][MT][elems]: each live row's state after each token */
        double *after_exact; /* the same from the unrounded trajectory (bf16 pools) */
    } pv;
    int64_t work;
    double *Sm, *row, *out; /* scratch: one state; one row's inputs; outputs [T][HV][V] */
    double *Sx, *out_x;     /* the same for the unrounded trajectory */
    double *floor;          /* [T][HV][V]: the gated norm's tolerance from o's (bf16 pools: norm_bounds) */
    double *zrow;           /* the row's z [T][HV][V] */
} oz;

/* ---------------------------------------------------------------------------------------------- */
/* Plumbing                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

static void fail(oz *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(oz *f, const char *fmt, ...)
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

static void trace(oz *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(oz *f, const char *fmt, ...)
{
    if (!f->trace) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  [%d] ", (int)f->op_index);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static unsigned u8(oz *f) { return f->at < f->size ? f->data[f->at++] : 0u; }
static double normal(oz *f)
{
    const uint64_t x = gdn__rng_next(&f->rng);
    const double sum = (double)(x & 0xffff) + (double)(x >> 16 & 0xffff) + (double)(x >> 32 & 0xffff) + (double)(x >> 48);
    return (sum / 65536.0 - 2.0) * 1.7320508075688772;
}
static double round_to(double x, gdn_dtype dtype)
{
    uint32_t tmp[1];
    gdn__store_f32(tmp, dtype, 0, (float)x);
    return gdn__load_f32(tmp, dtype, 0);
}

static region *region_new(oz *f, const char *name, size_t payload, size_t lead)
{
    if (f->nregs == OZ_MAX_REGIONS) {
        fail(f, "driver: too many regions");
        return NULL;
    }
    region *r = calloc(1, sizeof *r);
    r->name = name;
    /* The payload 16-byte aligned, as malloc hands memory out (the workspace's counts are int32). */
    r->lead = (lead + 15) / 16 * 16, r->payload = payload ? payload : 1, r->tail = OZ_GUARD;
    r->base = malloc(r->lead + r->payload + r->tail);
    r->snap = malloc(r->payload);
    memset(r->base, OZ_GUARD_BYTE, r->lead + r->payload + r->tail);
    f->regs[f->nregs++] = r;
    return r;
}
static unsigned char *P(const region *r) { return r->base + r->lead; }

static void region_free(region *r)
{
    if (!r) return;
    free(r->base), free(r->snap), free(r);
}

/* Frees the regions from `mark` on (a call's own buffers). */
static void drop_to(oz *f, int mark)
{
    for (int i = mark; i < f->nregs; i++) region_free(f->regs[i]);
    f->nregs = mark;
}

/* Frees the current step's regions (and so closes its commit window). */
static void drop_step_regions(oz *f)
{
    drop_to(f, f->nfixed);
    f->pv.active = 0;
}

/* Before a call: every buffer's payload saved (the workspace only when the call must be refused:
 * an accepted call may change all of it). */
static void snap_all(oz *f, int refusal)
{
    for (int i = 0; i < f->nregs; i++) {
        region *r = f->regs[i];
        r->snapped = !r->whole || refusal;
        r->nallow = 0;
        if (r->snapped) memcpy(r->snap, P(r), r->payload);
    }
}

static void allow(region *r, size_t offset, size_t bytes)
{
    if (!r->snapped || offset >= r->payload) return;
    const size_t end = bytes < r->payload - offset ? offset + bytes : r->payload;
    if (r->nallow == 256) { /* (a fallback that never runs at these sizes) */
        if (offset < r->allow_lo[255]) r->allow_lo[255] = offset;
        r->allow_hi[255] = r->payload;
        return;
    }
    r->allow_lo[r->nallow] = offset, r->allow_hi[r->nallow] = end, r->nallow++;
}

static int by_start(const void *a, const void *b)
{
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Every buffer's guard bytes intact (checked first after a call: a write out of bounds is the
 * clearest report of all). */
/* The first byte of [p, p + n) that is not the guard pattern, or n. */
static size_t guard_break(const unsigned char *p, size_t n)
{
    static unsigned char pattern[4096];
    if (pattern[0] != OZ_GUARD_BYTE) memset(pattern, OZ_GUARD_BYTE, sizeof pattern);
    for (size_t at = 0; at < n; at += sizeof pattern) {
        const size_t len = n - at < sizeof pattern ? n - at : sizeof pattern;
        if (memcmp(p + at, pattern, len) == 0) continue;
        for (size_t j = at; j < at + len; j++)
            if (p[j] != OZ_GUARD_BYTE) return j;
    }
    return n;
}

static void verify_guards(oz *f, const char *call)
{
    for (int i = 0; i < f->nregs && !f->failed; i++) {
        const region *r = f->regs[i];
        const size_t lead = guard_break(r->base, r->lead), tail = guard_break(r->base + r->lead + r->payload, r->tail);
        if (lead < r->lead)
            fail(f, "%s wrote %zu bytes before %s (from %zu bytes before its start)", call, r->lead - lead, r->name,
                 r->lead - lead);
        else if (tail < r->tail)
            fail(f, "%s wrote byte %zu past the end of %s (%zu bytes)", call, tail, r->name, r->payload);
    }
}

/* Guards intact everywhere; payload bytes changed only where allowed. */
static void verify_untouched(oz *f, const char *call)
{
    verify_guards(f, call);
    for (int i = 0; i < f->nregs && !f->failed; i++) {
        region *r = f->regs[i];
        const unsigned char *now = P(r);
        if (!r->snapped || memcmp(r->snap, now, r->payload) == 0) continue;
        /* The gaps between the allowed ranges must be as they were. */
        size_t ranges[256][2];
        for (int k = 0; k < r->nallow; k++) ranges[k][0] = r->allow_lo[k], ranges[k][1] = r->allow_hi[k];
        qsort(ranges, (size_t)r->nallow, sizeof ranges[0], by_start);
        size_t at = 0;
        for (int k = 0; k <= r->nallow && !f->failed; k++) {
            const size_t end = k < r->nallow ? ranges[k][0] : r->payload;
            if (end > at && memcmp(r->snap + at, now + at, end - at) != 0)
                for (size_t j = at; j < end; j++)
                    if (r->snap[j] != now[j]) {
                        fail(f, "%s changed byte %zu of %s, which it must leave alone", call, j, r->name);
                        break;
                    }
            if (k < r->nallow && ranges[k][1] > at) at = ranges[k][1];
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Views                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

static int64_t view_elem(const tview *v, int32_t i, int32_t t, int32_t h) { return v->at + i * v->r + t * v->t + h * v->h; }

static gdn_view as_view(const tview *v)
{
    gdn_view out = {P(v->reg) + (size_t)v->at * gdn_dtype_size(v->dtype), v->rs, v->ts, v->hs};
    return out;
}

static int64_t lo(int64_t n, int64_t s) { return n > 1 && s < 0 ? (n - 1) * s : 0; }
static int64_t hi(int64_t n, int64_t s) { return n > 1 && s > 0 ? (n - 1) * s : 0; }

/* Lays out [B, T, H, D] in a region of its own: dense (strides 0), or strided with the three outer
 * dimensions in any order, gaps between them, some reversed (negative strides) and, for inputs, one
 * broadcast (stride 0: every row, token or head reads the same elements). */
static tview make_view(oz *f, const char *name, gdn_dtype dtype, int32_t B, int32_t T, int32_t H, int32_t D, int input)
{
    tview v;
    memset(&v, 0, sizeof v);
    v.dtype = dtype, v.B = B, v.T = T, v.H = H, v.D = D;
    const unsigned mode = u8(f);
    const int64_t n[3] = {B, T, H};
    int64_t s[3];
    if (mode % 8 < 3) { /* dense */
        s[0] = (int64_t)T * H * D, s[1] = (int64_t)H * D, s[2] = D;
    } else {
        static const int orders[6][3] = {{2, 1, 0}, {2, 0, 1}, {1, 2, 0}, {1, 0, 2}, {0, 2, 1}, {0, 1, 2}}; /* inner first */
        const int *o = orders[(mode >> 3) % 6];
        const unsigned pads = u8(f);
        int64_t stride = D + (pads & 1) * 8;
        for (int j = 0; j < 3; j++) {
            s[o[j]] = stride;
            stride = stride * (n[o[j]] > 0 ? n[o[j]] : 1) + ((pads >> (1 + j)) & 1) * 4;
        }
        unsigned flips = u8(f) & 7;
        for (int j = 0; j < 3; j++)
            if (flips >> j & 1) s[j] = -s[j];
        if (input && mode % 8 == 7) s[(mode >> 6) % 3] = 0; /* a broadcast dimension */
        if (s[0] == 0 && s[1] == 0 && s[2] == 0) s[2] = D;
        v.rs = s[0], v.ts = s[1], v.hs = s[2];
    }
    v.r = s[0], v.t = s[1], v.h = s[2];
    int64_t low = 0, high = D - 1;
    for (int j = 0; j < 3; j++) low += lo(n[j], s[j]), high += hi(n[j], s[j]);
    const int64_t lead_pad = u8(f) % 5;
    v.at = lead_pad - low;
    v.reg = region_new(f, name, (size_t)(high - low + 1 + lead_pad + 3) * gdn_dtype_size(dtype), OZ_GUARD);
    return v;
}

/* q, k and v as column slices of one fused projection output [B, T, 2 HK K + HV V (+ pad)]. */
static void make_fused_qkv(oz *f, int32_t B, int32_t T, tview *q, tview *k, tview *v)
{
    const int64_t N = 2 * (int64_t)f->HK * f->K + (int64_t)f->HV * f->V + (u8(f) & 1) * 8;
    region *reg = region_new(f, "fused qkv", (size_t)((int64_t)(B > 0 ? B : 1) * T * N + 8) * f->isize, OZ_GUARD);
    tview *views[3] = {q, k, v};
    const int64_t col[3] = {0, (int64_t)f->HK * f->K, 2 * (int64_t)f->HK * f->K};
    for (int j = 0; j < 3; j++) {
        tview *x = views[j];
        memset(x, 0, sizeof *x);
        x->reg = reg, x->dtype = f->id, x->B = B, x->T = T;
        x->H = j < 2 ? f->HK : f->HV, x->D = j < 2 ? f->K : f->V;
        x->at = col[j];
        x->rs = x->r = T * N, x->ts = x->t = N, x->hs = x->h = x->D;
    }
}

/* a and b interleaved in one [B, T, 2 HV] tensor. */
static void make_fused_ab(oz *f, int32_t B, int32_t T, tview *a, tview *b)
{
    const int64_t N = 2 * (int64_t)f->HV;
    region *reg = region_new(f, "fused ab", (size_t)((int64_t)(B > 0 ? B : 1) * T * N + 2) * f->isize, OZ_GUARD);
    tview *views[2] = {a, b};
    for (int j = 0; j < 2; j++) {
        tview *x = views[j];
        memset(x, 0, sizeof *x);
        x->reg = reg, x->dtype = f->id, x->B = B, x->T = T, x->H = f->HV, x->D = 1;
        x->at = j * f->HV;
        x->rs = x->r = T * N, x->ts = x->t = N, x->hs = x->h = 1;
    }
}

static void fill_random(oz *f, region *r, gdn_dtype dtype, double scale)
{
    const size_t n = r->payload / gdn_dtype_size(dtype);
    for (size_t j = 0; j < n; j++) gdn__store_f32(P(r), dtype, (int64_t)j, (float)(scale * normal(f)));
}

/* ---------------------------------------------------------------------------------------------- */
/* Setup                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

static gdn_op_layer base_op(const oz *f)
{
    gdn_op_layer op;
    memset(&op, 0, sizeof op);
    op.backend = GDN_BACKEND_CPU;
    op.model.num_layers = 1;
    op.model.num_k_heads = f->HK, op.model.num_v_heads = f->HV;
    op.model.head_dim_k = f->K, op.model.head_dim_v = f->V;
    op.model.scale = f->scale;
    op.model.use_qk_l2norm = f->l2;
    op.input_dtype = f->id, op.output_dtype = f->od;
    op.A_log = (const float *)P(f->alog), op.dt_bias = (const float *)P(f->dtb);
    op.pool.data = P(f->pool), op.pool.dtype = f->sd, op.pool.num_slots = f->S, op.pool.slot_stride = f->slot_stride;
    op.error_flag = f->flag_null ? NULL : (int32_t *)P(f->flag);
    op.strategy = f->strategy;
    op.workspace = f->ws ? P(f->ws) : NULL;
    op.max_batch = f->MB, op.max_tokens = f->MT, op.ring_length = f->RL;
    return op;
}

static size_t slot_offset(const oz *f, int32_t s) { return (size_t)s * (size_t)f->slot_stride * f->ssize; }
static double *model_of(oz *f, int32_t s) { return f->state + (size_t)s * f->elems; }
static double *exact_of(oz *f, int32_t s) { return f->exact ? f->exact + (size_t)s * f->elems : model_of(f, s); }

/* How far `got` lies outside [a, b], as a fraction of the tolerance at the nearer end. */
static double interval_ratio(double got, double a, double b, double abs_tol, double rel_tol)
{
    const double low = a < b ? a : b, high = a < b ? b : a;
    const double near = got < low ? low : (got > high ? high : got);
    return fabs(got - near) / (abs_tol + rel_tol * fabs(near));
}

/* Half a unit in the last place of x in dtype (the rounding of a result stored in it). */
static double half_ulp(double x, gdn_dtype dtype)
{
    if (x == 0.0 || !isfinite(x)) return 0.0;
    const int mantissa = dtype == GDN_DTYPE_BF16 ? 8 : (dtype == GDN_DTYPE_F16 ? 11 : 24);
    return ldexp(1.0, ilogb(x) - mantissa);
}

/* An output against the model's interval [a, b] (unrounded): the nearer of the ratio against the
 * endpoints rounded to the output dtype, and the ratio against the unrounded interval less half an
 * output ulp (a value on a rounding boundary may round either way: at |y| >= 0.5 one bf16 ulp is more
 * than SPEC 4's bf16-state tolerance). */
static double output_ratio(double got, double a, double b, gdn_dtype od, double abs_tol, double rel_tol, double floor)
{
    const double low = a < b ? a : b, high = a < b ? b : a;
    double near = got < low ? low : (got > high ? high : got);
    double tol = abs_tol + rel_tol * fabs(near);
    const double rounded = fabs(got - round_to(near, od)) / (tol > floor ? tol : floor);
    const double off = fabs(got - near) - half_ulp(near, od);
    const double unrounded = (off > 0.0 ? off : 0.0) / (tol > floor ? tol : floor);
    return rounded < unrounded ? rounded : unrounded;
}

/* The gated norm's output y = o g / rms(o) (g = norm_weight silu(z)) may move as far as o's SPEC 4
 * tolerance moves it: with a bf16 pool the strategies' rounding points differ within that tolerance,
 * and where o is small against the state (cancellation) dividing by rms(o) magnifies it past y's own.
 * The bound, per element c of one head: |g_c| / rms (do_c + |o_c| do_max / rms). */
static void norm_bounds(int32_t V, const double *o, const double *g, double eps, double abs_tol, double rel_tol,
                        double *bound)
{
    double sum = 0.0, dmax = 0.0;
    for (int32_t c = 0; c < V; c++) {
        sum += o[c] * o[c];
        const double d = abs_tol + rel_tol * fabs(o[c]);
        if (d > dmax) dmax = d;
    }
    const double rms = sqrt(sum / V + eps);
    for (int32_t c = 0; c < V; c++)
        bound[c] = fabs(g[c]) / rms * (abs_tol + rel_tol * fabs(o[c]) + fabs(o[c]) * dmax / rms);
}

/* Both trajectories of slot s become `values` (an import, a reset, the initial pool). */
static void model_set(oz *f, int32_t s, const double *values)
{
    memcpy(model_of(f, s), values, sizeof(double) * f->elems);
    if (f->exact) memcpy(exact_of(f, s), values, sizeof(double) * f->elems);
}

static int setup(oz *f)
{
    const unsigned g = u8(f), d = u8(f), sb = u8(f), tb = u8(f), lb = u8(f);
    f->HK = 1 + (int32_t)(g & 1);
    f->HV = f->HK * (1 + (int32_t)(g >> 1 & 1));
    f->K = (g >> 2 & 3) == 3 ? 128 : 64;
    f->V = (g >> 4 & 3) == 3 ? 128 : 64;
    f->l2 = (g >> 6) != 3;
    f->sd = d & 1 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
    f->id = d & 2 ? GDN_DTYPE_F16 : GDN_DTYPE_BF16;
    f->od = d & 4 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
    static const gdn_verify_strategy strategies[3] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_RING};
    f->strategy = strategies[(d >> 3) % 3];
    f->flag_null = (d >> 5 & 3) == 3;
    f->S = 2 + (int32_t)(sb % 6);
    f->MB = 1 + (int32_t)(sb / 6 % OZ_MAX_BATCH);
    f->MT = 1 + (int32_t)(tb % OZ_MAX_TOKENS);
    static const int32_t rings[4] = {0, 4, 6, 8};
    f->RL = rings[tb / OZ_MAX_TOKENS % 4];
    if (f->K == 128 || f->V == 128) { /* keep an input's memory and work small */
        if (f->MB > 3) f->MB = 3;
        if (f->MT > 3) f->MT = 3;
    }
    f->slot_stride = (int64_t)f->HV * f->V * f->K + (int64_t)(lb & 3) * 4;
    static const double gates[4] = {0.1, 0.1, 1.0, 8.0};
    f->gate_scale = gates[lb >> 2 & 3];
    f->scale = lb >> 4 & 1 ? (float)(0.05 + 0.01 * (u8(f) % 20)) : 0.0f;
    f->scale_used = f->scale > 0.0f ? (double)f->scale : (double)(1.0f / sqrtf((float)f->K));
    f->in_scale = f->l2 ? 1.0 : 1.0 / sqrt((double)f->K); /* without the l2 norm, |k| near 1 keeps S bounded */
    const uint32_t seed = u8(f) | u8(f) << 8 | (uint32_t)u8(f) << 16;
    f->rng = gdn__rng_seeded(seed);
    f->elems = (size_t)f->HV * f->V * f->K;
    f->ssize = gdn_dtype_size(f->sd), f->isize = gdn_dtype_size(f->id), f->osize = gdn_dtype_size(f->od);
    trace(f, "setup: HK %d HV %d K %d V %d l2 %d state %s in %s out %s %s slots %d max_batch %d max_tokens %d ring %d "
             "stride %lld scale %g flag %s",
          f->HK, f->HV, f->K, f->V, f->l2, f->sd == GDN_DTYPE_BF16 ? "bf16" : "f32", f->id == GDN_DTYPE_F16 ? "f16" : "bf16",
          f->od == GDN_DTYPE_F32 ? "f32" : "bf16",
          f->strategy == GDN_VERIFY_CACHE ? "cache" : f->strategy == GDN_VERIFY_FOLD ? "fold" : "ring", f->S, f->MB, f->MT,
          f->RL, (long long)f->slot_stride, (double)f->scale, f->flag_null ? "NULL" : "on");

    /* The pool: random states (~0.1 N(0, 1)) or zeros, the stride's gaps random too. */
    const size_t pool_bytes = slot_offset(f, f->S);
    f->pool = region_new(f, "the pool", pool_bytes, 2 * (size_t)f->slot_stride * f->ssize + OZ_GUARD);
    fill_random(f, f->pool, f->sd, 0.1);
    f->state = calloc((size_t)f->S * f->elems, sizeof(double));
    f->exact = f->sd == GDN_DTYPE_BF16 ? calloc((size_t)f->S * f->elems, sizeof(double)) : NULL;
    for (int32_t s = 0; s < f->S; s++) {
        f->known[s] = 1, f->current[s] = 1;
        for (size_t j = 0; j < f->elems; j++)
            model_of(f, s)[j] = gdn__load_f32(P(f->pool), f->sd, (int64_t)(s * f->slot_stride + (int64_t)j));
        if (f->exact) memcpy(exact_of(f, s), model_of(f, s), sizeof(double) * f->elems);
    }
    f->alog = region_new(f, "A_log", sizeof(float) * (size_t)f->HV, OZ_GUARD);
    f->dtb = region_new(f, "dt_bias", sizeof(float) * (size_t)f->HV, OZ_GUARD);
    f->normw = region_new(f, "norm_weight", sizeof(float) * (size_t)f->V, OZ_GUARD);
    for (int32_t h = 0; h < f->HV; h++) {
        ((float *)P(f->alog))[h] = (float)(0.1 * normal(f));
        ((float *)P(f->dtb))[h] = (float)(0.1 * normal(f));
    }
    for (int32_t x = 0; x < f->V; x++) ((float *)P(f->normw))[x] = (float)(1.0 + 0.2 * normal(f));
    f->flag = region_new(f, "the error flag", sizeof(int32_t), OZ_GUARD);
    memset(P(f->flag), 0, sizeof(int32_t));
    f->imp = region_new(f, "the import source", f->elems * f->ssize, OZ_GUARD);
    f->exp = region_new(f, "the export destination", f->elems * f->ssize, OZ_GUARD);

    /* The workspace, as gdn_op_workspace_bytes sizes it, zero-filled. */
    f->ws = NULL;
    gdn_op_layer op = base_op(f);
    f->ws_bytes = gdn_op_workspace_bytes(&op);
    if (f->ws_bytes == 0) {
        fail(f, "gdn_op_workspace_bytes is 0 for a valid description");
        return 0;
    }
    /* (A leading guard as large as the workspace: a slot -1 or -2's record, tokens or count land there.) */
    f->ws = region_new(f, "the workspace", f->ws_bytes,
                       f->strategy == GDN_VERIFY_CACHE ? OZ_GUARD : 2 * f->ws_bytes / (size_t)f->S + OZ_GUARD);
    f->ws->whole = 1;
    memset(P(f->ws), 0, f->ws_bytes);
    f->nfixed = f->nregs;

    f->pv.after = malloc(sizeof(double) * (size_t)f->MB * f->MT * f->elems);
    f->pv.after_exact = f->exact ? malloc(sizeof(double) * (size_t)f->MB * f->MT * f->elems) : f->pv.after;
    f->Sm = malloc(sizeof(double) * f->elems);
    f->Sx = malloc(sizeof(double) * f->elems);
    f->out_x = malloc(sizeof(double) * (size_t)OZ_MAX_TOKENS * f->HV * f->V);
    f->floor = malloc(sizeof(double) * (size_t)OZ_MAX_TOKENS * f->HV * f->V);
    const size_t per_token = 2 * (size_t)f->HK * f->K + (size_t)f->HV * f->V + 2 * (size_t)f->HV;
    f->row = malloc(sizeof(double) * per_token * OZ_MAX_TOKENS);
    f->out = malloc(sizeof(double) * (size_t)OZ_MAX_TOKENS * f->HV * f->V);
    f->zrow = malloc(sizeof(double) * (size_t)OZ_MAX_TOKENS * f->HV * f->V);
    return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* Checks                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

static void check_status(oz *f, gdn_status got, gdn_status want, const char *what)
{
    if (got != want) fail(f, "%s returned %s, expected %s", what, gdn_status_name(got), gdn_status_name(want));
}

/* Slot s of the pool against the model, within SPEC 4's state tolerance. */
static void check_pool_slot(oz *f, int32_t s, const char *after)
{
    if (!f->known[s] || f->failed) return;
    const gdn__tolerance tol = gdn__spec4_tolerance(f->sd);
    const double *m = model_of(f, s), *x = exact_of(f, s);
    const unsigned char *pool = P(f->pool) + slot_offset(f, s);
    for (size_t j = 0; j < f->elems; j++) {
        const double got = gdn__load_f32(pool, f->sd, (int64_t)j);
        const double ratio = interval_ratio(got, m[j], x[j], tol.state_abs, tol.state_rel);
        if (!(ratio <= 1.0)) {
            fail(f, "after %s, slot %d element %zu of the pool is %.6g, the model %.6g (%.0f%% of tolerance)", after, s, j,
                 got, m[j], 100 * ratio);
            return;
        }
        if (ratio > f->res->worst_state) f->res->worst_state = ratio;
    }
}

/* The error flag after a call: raised (1) when `raised`, else as it was. */
static void check_flag(oz *f, const gdn_op_layer *op, int raised, const char *what)
{
    if (!op->error_flag) return;
    allow(f->flag, 0, sizeof(int32_t));
    int32_t before;
    memcpy(&before, f->flag->snap, sizeof before); /* (the flag is never a whole-region buffer) */
    const int32_t got = *(int32_t *)P(f->flag);
    const int32_t want = raised ? 1 : before;
    if (got != want) fail(f, "%s left the error flag at %d, expected %d", what, (int)got, (int)want);
}

static void allow_slot(oz *f, int32_t s) { allow(f->pool, slot_offset(f, s), f->elems * f->ssize); }

/* ---------------------------------------------------------------------------------------------- */
/* Invalid fields                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

typedef struct call_args {
    int32_t count;
    const int32_t *slots;
    int32_t dst, src, slot;
    const void *src_buf;
    void *dst_buf;
    const int32_t *accepted;
    int null_op;
} call_args;

typedef struct mutation {
    gdn_status want; /* what the call must return */
    int ws_check;    /* gdn_op_workspace_bytes of the changed description: 1 the real size, 0 zero, -1 unchecked */
    const char *what;
} mutation;

enum { N_MUTATIONS = 48 };

/*
 * Changes one field of the call (most of them invalid) and returns the status the call must return:
 * the field's documented code where the call reads the field, GDN_OK where it does not (the call then
 * runs as it would have). With must_refuse, a change the call would accept becomes an invalid backend.
 */
static mutation mutate(oz *f, call_kind c, gdn_op_layer *op, gdn_mixer *mixer, call_args *a, int must_refuse)
{
    const int id = (int)(u8(f) % N_MUTATIONS);
    const unsigned v = u8(f);
    const int step_like = c == C_STEP || c == C_COMMIT;
    const int keeps = f->strategy != GDN_VERIFY_CACHE;
    void *dummy = P(f->normw); /* a non-NULL pointer a refused call never reads */
    const int64_t C = 2 * (int64_t)f->HK * f->K + (int64_t)f->HV * f->V;
    mutation m = {GDN_OK, 1, "nothing"};
    memset(mixer, 0, sizeof *mixer);
    switch (id) {
    case 0: op->backend = GDN_BACKEND_AUTO, m = (mutation){GDN_EINVAL, 0, "backend AUTO"}; break;
    case 1: op->backend = (gdn_backend_kind)(3 + v % 5), m = (mutation){GDN_EINVAL, 0, "an unknown backend"}; break;
    case 2:
#ifdef GDN_HAVE_CUDA /* host pointers must not reach the CUDA backend in a CUDA build */
        op->backend = GDN_BACKEND_AUTO, m = (mutation){GDN_EINVAL, 0, "backend AUTO"};
#else
        op->backend = GDN_BACKEND_CUDA, m = (mutation){GDN_ENODEV, -1, "the CUDA backend in a build without it"};
#endif
        break;
    case 3: op->strategy = GDN_VERIFY_AUTO, m = (mutation){GDN_EINVAL, 0, "strategy AUTO"}; break;
    case 4: op->strategy = (gdn_verify_strategy)(4 + v % 9), m = (mutation){GDN_EINVAL, 0, "an unknown strategy"}; break;
    case 5: op->pool.num_slots = v & 1 ? 0 : -1 - (int64_t)v, m = (mutation){GDN_ECONFIG_SLOTS, 0, "num_slots < 1"}; break;
    case 6: op->pool.num_slots = (int64_t)INT32_MAX + 1 + v, m = (mutation){GDN_ECONFIG_SLOTS, 0, "num_slots > INT32_MAX"}; break;
    case 7: op->model.num_k_heads = v & 1 ? 0 : -1, m = (mutation){GDN_ECONFIG_HEADS, 0, "HK < 1"}; break;
    case 8:
        op->model.num_v_heads = f->HK == 2 && (v & 1) ? 2 * (int32_t)(v % 3) + 1 : -(int32_t)(v % 3);
        m = (mutation){GDN_ECONFIG_HEADS, 0, "HV not a positive multiple of HK"};
        break;
    case 9: {
        static const int32_t bad[4] = {0, 32, 100, 512};
        op->model.head_dim_k = bad[v % 4], m = (mutation){GDN_ECONFIG_HEAD_DIM, 0, "K not 64, 128 or 256"};
        break;
    }
    case 10: {
        static const int32_t bad[4] = {-64, 16, 192, 1024};
        op->model.head_dim_v = bad[v % 4], m = (mutation){GDN_ECONFIG_HEAD_DIM, 0, "V not 64, 128 or 256"};
        break;
    }
    case 11: {
        const float bad[4] = {-1.0f, NAN, INFINITY, -INFINITY};
        op->model.scale = bad[v % 4], m = (mutation){GDN_ECONFIG_SCALE, 0, "scale negative or not finite"};
        break;
    }
    case 12: op->pool.dtype = v & 1 ? GDN_DTYPE_F16 : (gdn_dtype)(3 + v % 5), m = (mutation){GDN_ECONFIG_STATE_DTYPE, 0, "pool dtype"}; break;
    case 13: op->input_dtype = v & 1 ? GDN_DTYPE_F32 : (gdn_dtype)(3 + v % 5), m = (mutation){GDN_ECONFIG_INPUT_DTYPE, 0, "input dtype"}; break;
    case 14: op->output_dtype = v & 1 ? GDN_DTYPE_F16 : (gdn_dtype)(3 + v % 5), m = (mutation){GDN_ECONFIG_OUTPUT_DTYPE, 0, "output dtype"}; break;
    case 15: op->max_batch = v & 1 ? 0 : -1 - (int32_t)v, m = (mutation){GDN_ECONFIG_MAX_BATCH, 0, "max_batch < 1"}; break;
    case 16: op->max_tokens = v & 1 ? 0 : GDN_MAX_TOKENS + 1 + (int32_t)(v % 8), m = (mutation){GDN_ECONFIG_MAX_TOKENS, 0, "max_tokens"}; break;
    case 17: {
        static const int32_t bad[6] = {1, 2, 3, 33, 64, -1};
        op->ring_length = bad[v % 6], m = (mutation){GDN_ECONFIG_RING, 0, "ring_length"};
        break;
    }
    case 18: op->model.num_layers = (int32_t)v - 128, m = (mutation){GDN_OK, 1, "num_layers (ignored)"}; break;
    case 19: op->pool.data = NULL, m = (mutation){GDN_EINVAL, 1, "pool.data NULL"}; break;
    case 20: op->workspace = NULL, m = (mutation){GDN_EINVAL, 1, "workspace NULL"}; break;
    case 21: {
        const int64_t e = (int64_t)f->elems, bad[3] = {e - 1, 0, -e};
        op->pool.slot_stride = bad[v % 3], m = (mutation){GDN_EINVAL, 1, "slot_stride < HV V K"};
        break;
    }
    case 22: op->pool.slot_stride = INT64_MAX / 2 - (int64_t)v, m = (mutation){GDN_EINVAL, 1, "a pool extent past int64"}; break;
    case 23: {
        static const int32_t bad[4] = {1, 5, -1, 100};
        mixer->conv_width = bad[v % 4], mixer->conv_weight = dummy, mixer->conv.data = dummy;
        op->mixer = mixer, m = (mutation){GDN_EINVAL, -1, "conv_width outside 2..4"};
        break;
    }
    case 24: mixer->conv_width = 2 + (int32_t)(v % 3), mixer->conv.data = dummy, op->mixer = mixer;
        m = (mutation){GDN_EINVAL, -1, "conv weight NULL"};
        break;
    case 25: mixer->conv_width = 2 + (int32_t)(v % 3), mixer->conv_weight = dummy, mixer->conv.data = dummy;
        mixer->conv_weight_dtype = v & 8 ? GDN_DTYPE_F16 : (gdn_dtype)(3 + v % 4), op->mixer = mixer;
        m = (mutation){GDN_EINVAL, -1, "conv weight dtype"};
        break;
    case 26: mixer->conv_width = 2 + (int32_t)(v % 3), mixer->conv_weight = dummy, op->mixer = mixer;
        m = (mutation){GDN_EINVAL, -1, "conv pool NULL"};
        break;
    case 27: mixer->conv_width = 2 + (int32_t)(v % 3), mixer->conv_weight = dummy, mixer->conv.data = dummy;
        mixer->conv.slot_stride = 4 * C;
        if (v & 8) mixer->conv.token_stride = C + 1, mixer->conv.channel_stride = 1;
        else mixer->conv.token_stride = 1, mixer->conv.channel_stride = mixer->conv_width;
        op->mixer = mixer, m = (mutation){GDN_EINVAL, -1, "a conv window that is not one block"};
        break;
    case 28: mixer->conv_width = 2 + (int32_t)(v % 3), mixer->conv_weight = dummy, mixer->conv.data = dummy;
        mixer->conv.slot_stride = (mixer->conv_width - 1) * C - 1 - (int64_t)(v >> 4);
        op->mixer = mixer, m = (mutation){GDN_EINVAL, -1, "a conv slot stride below the window"};
        break;
    case 29: mixer->norm_eps = v & 1 ? -1e-6f : -1.0f, mixer->norm_weight = v & 2 ? (const float *)dummy : NULL;
        op->mixer = mixer, m = (mutation){GDN_EINVAL, -1, "norm_eps < 0"};
        break;
    case 30: op->error_flag = NULL, m = (mutation){GDN_OK, 1, "no error flag"}; break;
    case 31: mixer->conv_weight = dummy, mixer->conv_bias = dummy, mixer->conv_weight_dtype = GDN_DTYPE_F16;
        op->mixer = mixer, m = (mutation){GDN_OK, 1, "a mixer with neither conv nor norm"};
        break;
    case 32: op->kind = (gdn_step_kind)(v & 1 ? -1 : 2 + (int)(v % 5));
        m = (mutation){step_like ? GDN_ESTEP_KIND : GDN_OK, 1, "an unknown step kind"};
        break;
    case 33:
        if (op->kind == GDN_STEP_DECODE) op->tokens = v & 1 ? 2 : 0;
        else op->tokens = (int32_t[]){0, op->max_tokens + 1, -1, 17}[v % 4];
        m = (mutation){step_like ? GDN_ESTEP_TOKENS : GDN_OK, 1, "tokens outside the kind's range"};
        break;
    case 34: op->batch = v & 1 ? -1 : op->max_batch + 1 + (int32_t)(v % 4);
        m = (mutation){step_like ? GDN_ESTEP_BATCH : GDN_OK, 1, "batch outside 0..max_batch"};
        break;
    case 35: {
        gdn_view *views[6] = {&op->q, &op->k, &op->v, &op->a, &op->b, &op->o};
        views[v % 6]->data = NULL;
        m = (mutation){step_like ? GDN_EINVAL : GDN_OK, 1, "a tensor NULL"};
        break;
    }
    case 36:
        if (v & 1) op->A_log = NULL;
        else op->dt_bias = NULL;
        m = (mutation){step_like || c == C_FLUSH || (c == C_EXPORT && keeps) ? GDN_EINVAL : GDN_OK, 1, "A_log or dt_bias NULL"};
        break;
    case 37: op->read_slots = NULL, m = (mutation){step_like ? GDN_EINVAL : GDN_OK, 1, "read_slots NULL"}; break;
    case 38: mixer->norm_weight = (const float *)dummy, op->mixer = mixer, op->z.data = NULL;
        m = (mutation){step_like ? GDN_EINVAL : GDN_OK, 1, "the norm without z"};
        break;
    case 39:
        if (c == C_COMMIT) a->accepted = NULL, m = (mutation){GDN_EINVAL, 1, "accepted NULL"};
        break;
    case 40:
        if (c == C_COMMIT) op->kind = GDN_STEP_DECODE, op->tokens = 1, m = (mutation){GDN_ESTEP_KIND, 1, "commit of a decode"};
        break;
    case 41:
        if (c == C_FLUSH) a->count = v & 1 ? -1 : op->max_batch + 1 + (int32_t)(v % 3), m = (mutation){GDN_ESTEP_BATCH, 1, "count"};
        break;
    case 42:
        if (c == C_FLUSH) a->slots = NULL, a->count = a->count > 0 ? a->count : 1, m = (mutation){GDN_EINVAL, 1, "slots NULL"};
        break;
    case 43: {
        const int32_t bad[5] = {-1, f->S, f->S + 5, INT32_MIN, INT32_MAX};
        const int32_t slot = bad[v % 5];
        if (c == C_COPY && (v & 8)) a->dst = slot, m = (mutation){GDN_ESLOT_RANGE, 1, "dst out of range"};
        else if (c == C_COPY) a->src = slot, m = (mutation){GDN_ESLOT_RANGE, 1, "src out of range"};
        else if (c == C_IMPORT || c == C_RESET || c == C_EXPORT) a->slot = slot, m = (mutation){GDN_ESLOT_RANGE, 1, "slot out of range"};
        break;
    }
    case 44:
        if (c == C_COPY) a->dst = a->src, m = (mutation){GDN_EINVAL, 1, "dst == src"};
        break;
    case 45:
        if (c == C_EXPORT) a->dst_buf = NULL, m = (mutation){GDN_EINVAL, 1, "export to NULL"};
        break;
    case 46:
        if (c == C_IMPORT) a->src_buf = NULL, m = (mutation){GDN_EINVAL, 1, "import from NULL"};
        break;
    default: a->null_op = 1, m = (mutation){GDN_EINVAL, 0, "op NULL"}; break;
    }
    if (must_refuse && m.want == GDN_OK) {
        op->backend = GDN_BACKEND_AUTO;
        m = (mutation){GDN_EINVAL, 0, "backend AUTO"};
    }
    /* A refused call: the memory and status checks say it all; an accepted one runs as planned. */
    if (m.ws_check >= 0) {
        const size_t got = gdn_op_workspace_bytes(a->null_op ? NULL : op);
        const size_t want = m.ws_check ? f->ws_bytes : 0;
        if (got != want) fail(f, "gdn_op_workspace_bytes with %s: %zu, expected %zu", m.what, got, want);
    }
    trace(f, "%s with %s: expect %s", call_name[c], m.what, gdn_status_name(m.want));
    return m;
}

/* ---------------------------------------------------------------------------------------------- */
/* The layer step                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* A slot no row of the step holds yet (starting the search at `from`), or -1. */
static int32_t free_slot(oz *f, const uint8_t *taken, unsigned from)
{
    for (int32_t j = 0; j < f->S; j++) {
        const int32_t s = (int32_t)((from + (unsigned)j) % (unsigned)f->S);
        if (!taken[s]) return s;
    }
    return -1;
}

/* Row i's inputs as tests/row_model.h reads them: q [T][HK][K], k, v [T][HV][V], a [T][HV], b [T][HV]. */
static void gather_row(oz *f, const tview *q, const tview *k, const tview *v, const tview *a, const tview *b,
                       int32_t i, int32_t T)
{
    double *dst = f->row;
    const tview *qk[2] = {q, k};
    for (int j = 0; j < 2; j++) {
        const unsigned char *base = P(qk[j]->reg);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < f->HK; h++) {
                const int64_t at = view_elem(qk[j], i, t, h);
                for (int32_t d = 0; d < f->K; d++) *dst++ = gdn__load_f32(base, f->id, at + d);
            }
    }
    const unsigned char *vb = P(v->reg);
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < f->HV; h++) {
            const int64_t at = view_elem(v, i, t, h);
            for (int32_t d = 0; d < f->V; d++) *dst++ = gdn__load_f32(vb, f->id, at + d);
        }
    const tview *ab[2] = {a, b};
    for (int j = 0; j < 2; j++) {
        const unsigned char *base = P(ab[j]->reg);
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < f->HV; h++) *dst++ = gdn__load_f32(base, f->id, view_elem(ab[j], i, t, h));
    }
}

typedef struct step_plan {
    gdn_step_kind kind;
    int32_t T, B;
    int32_t r[OZ_MAX_BATCH + 8], w[OZ_MAX_BATCH + 8];
    int shared; /* rows may share slots: not modelled */
} step_plan;

/* A live row reads and writes slots of the pool. */
static int live_row(const oz *f, int32_t r, int32_t w) { return r >= 0 && r < f->S && w >= 0 && w < f->S; }
/* A row that names a slot >= num_slots raises the flag (a padding read slot included). */
static int flags_row(const oz *f, int32_t r, int32_t w) { return r >= f->S || w >= f->S; }

static void plan_rows(oz *f, step_plan *sp)
{
    uint8_t taken[OZ_MAX_SLOTS] = {0};
    for (int32_t i = 0; i < sp->B; i++) {
        const unsigned t = u8(f);
        int32_t r = -1, w = -1;
        switch (t % 10) {
        case 0: /* padding; its write slot is never used */
            r = -1 - (int32_t)(t / 10 % 3);
            w = t & 0x40 ? r : (t & 0x80 ? f->S + (int32_t)(t / 10 % 2) : (int32_t)(t / 10 % (unsigned)f->S));
            break;
        case 1: /* a read slot >= num_slots: padding, and the flag */
            r = f->S + (int32_t)(t / 10 % 3), w = t & 0x80 ? r : (int32_t)(t / 10 % (unsigned)f->S);
            break;
        case 2: /* a write slot >= num_slots */
            r = (int32_t)(t / 10 % (unsigned)f->S), w = f->S + (int32_t)(t / 10 % 2);
            break;
        case 3: /* a live row with a negative write slot */
            r = sp->shared ? (int32_t)(t / 10 % (unsigned)f->S) : free_slot(f, taken, t / 10);
            w = -1 - (int32_t)(t / 10 % 2);
            break;
        case 4: /* a fork: read one slot, write another */
            if (sp->shared) {
                r = (int32_t)(t / 10 % (unsigned)f->S), w = (int32_t)(t / 30 % (unsigned)f->S);
                break;
            }
            r = free_slot(f, taken, t / 10);
            if (r >= 0) taken[r] = 1;
            w = free_slot(f, taken, t / 30);
            if (w < 0 && r >= 0) taken[r] = 0, w = r = -1;
            break;
        default: /* a live row */
            r = sp->shared ? (int32_t)(t / 10 % (unsigned)f->S) : free_slot(f, taken, t / 10);
            w = r;
            break;
        }
        if (!sp->shared && live_row(f, r, w)) taken[r] = taken[w] = 1;
        sp->r[i] = r, sp->w[i] = w;
    }
}

static void do_commit(oz *f);

static void do_step(oz *f, int shared, int decode)
{
    drop_step_regions(f);
    step_plan sp;
    memset(&sp, 0, sizeof sp);
    const unsigned k = u8(f);
    sp.kind = k & 1 && !decode && f->MT > 1 ? GDN_STEP_VERIFY : GDN_STEP_DECODE; /* max_tokens 1: decodes only */
    sp.T = sp.kind == GDN_STEP_VERIFY ? 1 + (int32_t)(k / 2 % (unsigned)f->MT) : 1;
    sp.B = (int32_t)(u8(f) % (unsigned)(f->MB + 1));
    sp.shared = shared;
    plan_rows(f, &sp);
    const int32_t B = sp.B, T = sp.T;

    /* Work: the rows the model runs (and the reference as much again). */
    int64_t work = 0;
    for (int32_t i = 0; i < B; i++) work += live_row(f, sp.r[i], sp.w[i]) ? (int64_t)T * f->HV * f->K * f->V / 4096 : 0;
    if (f->work + work > OZ_WORK_BUDGET) {
        trace(f, "step skipped (work budget)");
        return;
    }
    f->work += work;

    /* Tensors. */
    const unsigned layout = u8(f);
    tview q, kk, v, a, b, o, z;
    memset(&z, 0, sizeof z);
    if (layout % 4 == 0) {
        make_fused_qkv(f, B, T, &q, &kk, &v);
        fill_random(f, q.reg, f->id, f->in_scale);
    } else {
        q = make_view(f, "q", f->id, B, T, f->HK, f->K, 1);
        kk = make_view(f, "k", f->id, B, T, f->HK, f->K, 1);
        v = make_view(f, "v", f->id, B, T, f->HV, f->V, 1);
        fill_random(f, q.reg, f->id, f->in_scale), fill_random(f, kk.reg, f->id, f->in_scale);
        fill_random(f, v.reg, f->id, 1.0);
    }
    if (layout / 4 % 4 == 0) {
        make_fused_ab(f, B, T, &a, &b);
        fill_random(f, a.reg, f->id, f->gate_scale);
    } else {
        a = make_view(f, "a", f->id, B, T, f->HV, 1, 1);
        b = make_view(f, "b", f->id, B, T, f->HV, 1, 1);
        fill_random(f, a.reg, f->id, f->gate_scale), fill_random(f, b.reg, f->id, f->gate_scale);
    }
    o = make_view(f, "o", f->od, B, T, f->HV, f->V, 0);
    fill_random(f, o.reg, f->od, 1000.0); /* poison: far from any output */
    gdn_mixer norm;
    memset(&norm, 0, sizeof norm);
    const int with_norm = layout / 16 % 4 == 0;
    if (with_norm) {
        z = make_view(f, "z", f->id, B, T, f->HV, f->V, 1);
        fill_random(f, z.reg, f->id, 1.0);
        norm.norm_weight = (const float *)P(f->normw);
        norm.norm_eps = layout & 0x40 ? 0.0f : 1e-5f;
    }
    const int write_array = layout >> 7 || sp.shared;
    int same = 1;
    for (int32_t i = 0; i < B; i++) same &= sp.r[i] == sp.w[i];
    region *rs = region_new(f, "read_slots", sizeof(int32_t) * (size_t)B, OZ_GUARD);
    region *ws = write_array || !same ? region_new(f, "write_slots", sizeof(int32_t) * (size_t)B, OZ_GUARD) : NULL;
    if (f->failed) return;
    memcpy(P(rs), sp.r, sizeof(int32_t) * (size_t)B);
    if (ws) memcpy(P(ws), sp.w, sizeof(int32_t) * (size_t)B);

    gdn_op_layer op = base_op(f);
    op.kind = sp.kind, op.tokens = T, op.batch = B;
    op.q = as_view(&q), op.k = as_view(&kk), op.v = as_view(&v), op.a = as_view(&a), op.b = as_view(&b);
    op.o = as_view(&o);
    if (with_norm) op.mixer = &norm, op.z = as_view(&z);
    op.read_slots = (const int32_t *)P(rs);
    op.write_slots = ws ? (const int32_t *)P(ws) : NULL;

    call_args args;
    memset(&args, 0, sizeof args);
    gdn_mixer mixer;
    mutation m = {GDN_OK, 1, "nothing"};
    if (u8(f) % 6 == 0) m = mutate(f, C_STEP, &op, &mixer, &args, 0);
    trace(f, "%s T %d batch %d%s%s, rows:", sp.kind == GDN_STEP_VERIFY ? "verify" : "decode", T, B,
          shared ? " (rows share slots)" : "", with_norm ? ", gated norm" : "");
    for (int32_t i = 0; i < B; i++) trace(f, "    row %d: read %d write %d", i, sp.r[i], sp.w[i]);
    snap_all(f, m.want != GDN_OK);
    const gdn_status got = gdn_op_layer_step(args.null_op ? NULL : &op, NULL);
    verify_guards(f, "gdn_op_layer_step");
    check_status(f, got, m.want, "gdn_op_layer_step");
    if (f->failed) return;
    if (m.want != GDN_OK) {
        verify_untouched(f, "a refused step");
        f->res->refusals++;
        return;
    }

    /* Outputs: every position of the step's rows, checked where the model knows the row; the model
     * of each row's write slot advances as the row goes (no row reads a slot another row writes). */
    const gdn__tolerance tol = gdn__spec4_tolerance(f->sd);
    const int norm_on = op.mixer && op.mixer->norm_weight; /* (a mutation may have swapped the mixer) */
    int raised = 0;
    memset(f->pv.live, 0, sizeof f->pv.live);
    memset(f->pv.known, 0, sizeof f->pv.known);
    allow(f->ws, 0, f->ws_bytes);
    for (int32_t i = 0; i < B && !f->failed; i++) {
        const int32_t r = sp.r[i], w = sp.w[i];
        raised |= flags_row(f, r, w) || (r >= 0 && r < f->S && w < 0);
        const int live = live_row(f, r, w);
        const int known = live && !shared && f->known[r];
        if (known) {
            gather_row(f, &q, &kk, &v, &a, &b, i, T);
            const float *A_log = (const float *)P(f->alog), *dt_bias = (const float *)P(f->dtb);
            const test_row_model model = {f->HK, f->HV, f->K, f->V, A_log, dt_bias, f->scale_used, f->l2};
            for (int traj = 0; traj < (f->exact ? 2 : 1); traj++) {
                double *S = traj ? f->Sx : f->Sm, *out = traj ? f->out_x : f->out;
                double *after = traj ? f->pv.after_exact : f->pv.after;
                memcpy(S, traj ? exact_of(f, r) : model_of(f, r), sizeof(double) * f->elems);
                for (int32_t t = 0; t < T; t++) {
                    double *out_t = out + (size_t)t * f->HV * f->V;
                    test_model_token(&model, f->row, T, t, S, out_t);
                    if (sp.kind == GDN_STEP_VERIFY)
                        memcpy(after + ((size_t)i * f->MT + (size_t)t) * f->elems, S, sizeof(double) * f->elems);
                    if (!norm_on) continue;
                    const double eps = op.mixer->norm_eps > 0.0f ? (double)op.mixer->norm_eps : 1e-6;
                    double wts[256], zz[256], g[256];
                    for (int32_t x = 0; x < f->V; x++) wts[x] = ((const float *)P(f->normw))[x];
                    for (int32_t h = 0; h < f->HV; h++) {
                        double *oh = out_t + (size_t)h * f->V;
                        for (int32_t x = 0; x < f->V; x++) {
                            zz[x] = gdn__load_f32(P(z.reg), f->id, view_elem(&z, i, t, h) + x);
                            g[x] = wts[x] * zz[x] / (1.0 + exp(-zz[x]));
                        }
                        if (traj == 0 && f->sd == GDN_DTYPE_BF16)
                            norm_bounds(f->V, oh, g, eps, tol.out_abs, tol.out_rel, f->floor + ((size_t)t * f->HV + h) * f->V);
                        gdn__ref_gated_rmsnorm(f->V, oh, zz, wts, eps, oh);
                    }
                }
            }
        }
        for (int32_t t = 0; t < T && !f->failed; t++)
            for (int32_t h = 0; h < f->HV && !f->failed; h++) {
                const int64_t at = view_elem(&o, i, t, h);
                allow(o.reg, (size_t)at * f->osize, (size_t)f->V * f->osize);
                const unsigned char *obase = P(o.reg);
                for (int32_t x = 0; x < f->V; x++) {
                    const double got_o = gdn__load_f32(obase, f->od, at + x);
                    if (!live) {
                        if (got_o != 0.0) {
                            fail(f, "padding row %d (read %d, write %d) token %d head %d output %d is %g, not 0", i, r, w, t, h,
                                 x, got_o);
                            break;
                        }
                        continue;
                    }
                    if (!known) continue;
                    const size_t at_out = ((size_t)t * f->HV + h) * f->V + (size_t)x;
                    const double want = f->out[at_out], want_x = f->exact ? f->out_x[at_out] : want;
                    const double floor = norm_on && f->sd == GDN_DTYPE_BF16 ? f->floor[at_out] : 0.0;
                    const double ratio = output_ratio(got_o, want, want_x, f->od, tol.out_abs, tol.out_rel, floor);
                    if (!(ratio <= 1.0)) {
                        fail(f, "row %d (slot %d -> %d) token %d head %d output %d: %.6g, model %.6g (%.0f%% of tolerance)", i,
                             r, w, t, h, x, got_o, want, 100 * ratio);
                        break;
                    }
                    if (ratio > f->res->worst_output) f->res->worst_output = ratio;
                }
            }
        if (!live) continue;
        /* Which pool slots the step may write: a decode's write slot; a verify's under fold and ring. */
        if (sp.kind == GDN_STEP_DECODE || f->strategy != GDN_VERIFY_CACHE) allow_slot(f, w);
        if (shared) { /* not modelled: both slots unknown until imported or reset */
            f->known[r] = f->known[w] = 0, f->current[r] = f->current[w] = 0;
            continue;
        }
        f->pv.live[i] = 1, f->pv.known[i] = (uint8_t)known;
        if (sp.kind == GDN_STEP_DECODE) { /* w becomes the state after the token */
            if (known) {
                for (size_t j = 0; j < f->elems; j++) model_of(f, w)[j] = round_to(f->Sm[j], f->sd);
                if (f->exact) memcpy(exact_of(f, w), f->Sx, sizeof(double) * f->elems);
            }
            f->known[w] = (uint8_t)known;
            f->current[w] = f->strategy == GDN_VERIFY_CACHE;
        } else if (f->strategy != GDN_VERIFY_CACHE) { /* fold and ring: w holds r's state, the tokens wait */
            if (known && w != r) {
                memcpy(model_of(f, w), model_of(f, r), sizeof(double) * f->elems);
                if (f->exact) memcpy(exact_of(f, w), exact_of(f, r), sizeof(double) * f->elems);
            }
            f->known[w] = (uint8_t)known;
            f->current[w] = 0;
        }
    }
    if (f->failed) return;
    check_flag(f, &op, raised, "the step");
    verify_untouched(f, "the step");
    if (f->failed) return;
    f->res->steps_run += B > 0;
    if (f->strategy == GDN_VERIFY_CACHE && sp.kind == GDN_STEP_DECODE)
        for (int32_t i = 0; i < B; i++)
            if (live_row(f, sp.r[i], sp.w[i])) check_pool_slot(f, sp.w[i], "a cache decode");
    /* A verify opens the commit window: the same description commits it. */
    if (sp.kind == GDN_STEP_VERIFY && !shared) {
        f->pv.active = 1;
        f->pv.op = op;
        if (op.mixer) f->pv.mixer = *op.mixer, f->pv.op.mixer = &f->pv.mixer;
        f->pv.batch = B, f->pv.T = T;
        memcpy(f->pv.r, sp.r, sizeof(int32_t) * (size_t)B);
        memcpy(f->pv.w, sp.w, sizeof(int32_t) * (size_t)B);
        /* Two verifies in three commit at once (a sampler's usual order); the rest wait for a commit
         * op, with other work between (or are abandoned). */
        if (u8(f) % 3 != 0) {
            f->op_name = "commit";
            do_commit(f);
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Commit, flush and the slot operations                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* A slot a row of the open commit window reads or writes. */
static int in_window(const oz *f, int32_t s)
{
    if (!f->pv.active) return 0;
    for (int32_t i = 0; i < f->pv.batch; i++)
        if (f->pv.live[i] && (f->pv.r[i] == s || f->pv.w[i] == s)) return 1;
    return 0;
}

/* A verify's description for a commit that must be refused when no verify is open (nothing of it is
 * read: every pointer is a placeholder). */
static gdn_op_layer placeholder_verify(oz *f)
{
    gdn_op_layer op = base_op(f);
    void *dummy = P(f->normw);
    op.kind = GDN_STEP_VERIFY, op.tokens = 1, op.batch = 0;
    op.q.data = op.k.data = op.v.data = op.a.data = op.b.data = op.o.data = dummy;
    op.read_slots = (const int32_t *)dummy;
    return op;
}

static void commit_with(oz *f, gdn_op_layer *op_in, int legal, int32_t B, int32_t T, region *acc);

static void do_commit(oz *f)
{
    const int legal = f->pv.active;
    gdn_op_layer op = legal ? f->pv.op : placeholder_verify(f);
    const int32_t B = legal ? f->pv.batch : 0, T = legal ? f->pv.T : 1;
    const int mark = f->nregs;
    region *acc = region_new(f, "accepted", sizeof(int32_t) * (size_t)(B > 0 ? B : 1), OZ_GUARD);
    if (!f->failed) commit_with(f, &op, legal, B, T, acc);
    drop_to(f, mark);
}

static void commit_with(oz *f, gdn_op_layer *op_in, int legal, int32_t B, int32_t T, region *acc)
{
    gdn_op_layer op = *op_in;
    int32_t *accepted = (int32_t *)P(acc);
    for (int32_t i = 0; i < B; i++) {
        const unsigned x = u8(f);
        const int32_t values[8] = {0, T, (int32_t)(x / 8 % (unsigned)(T + 1)), (int32_t)(x / 8 % (unsigned)(T + 1)), -1 - (int32_t)(x / 8),
                                   T + 1 + (int32_t)(x / 8), INT32_MIN, INT32_MAX};
        accepted[i] = values[x % 8];
    }
    call_args args;
    memset(&args, 0, sizeof args);
    args.accepted = accepted;
    gdn_mixer mixer;
    mutation m = {GDN_OK, 1, "nothing"};
    if (!legal || u8(f) % 6 == 0) m = mutate(f, C_COMMIT, &op, &mixer, &args, !legal);
    trace(f, "commit of %d rows (T %d)%s", B, T, legal ? "" : " (no verify open: must be refused)");
    snap_all(f, m.want != GDN_OK);
    const gdn_status got = gdn_op_commit(args.null_op ? NULL : &op, args.accepted, NULL);
    verify_guards(f, "gdn_op_commit");
    check_status(f, got, m.want, "gdn_op_commit");
    if (f->failed) return;
    if (m.want != GDN_OK) {
        verify_untouched(f, "a refused commit");
        f->res->refusals++;
        return;
    }
    int raised = 0;
    allow(f->ws, 0, f->ws_bytes);
    for (int32_t i = 0; i < B; i++) {
        const int32_t r = f->pv.r[i], w = f->pv.w[i];
        raised |= (r >= 0 && flags_row(f, r, w)) || (r >= 0 && r < f->S && w < 0);
        if (!f->pv.live[i]) continue;
        raised |= accepted[i] < 0 || accepted[i] > T; /* clamped, and flagged */
        const int32_t n = accepted[i] < 0 ? 0 : (accepted[i] > T ? T : accepted[i]);
        trace(f, "    row %d: %d -> %d accepts %d (%d)", i, r, w, n, (int)accepted[i]);
        if (n == 0) continue; /* cache: nothing; fold, ring: w already holds r's state */
        if (f->strategy == GDN_VERIFY_CACHE) allow_slot(f, w);
        if (f->pv.known[i]) {
            const size_t at = ((size_t)i * f->MT + (size_t)(n - 1)) * f->elems;
            for (size_t j = 0; j < f->elems; j++) model_of(f, w)[j] = round_to(f->pv.after[at + j], f->sd);
            if (f->exact) memcpy(exact_of(f, w), f->pv.after_exact + at, sizeof(double) * f->elems);
        }
        f->known[w] = f->pv.known[i];
        f->current[w] = f->strategy == GDN_VERIFY_CACHE;
    }
    check_flag(f, &op, raised, "the commit");
    verify_untouched(f, "the commit");
    if (f->failed) return;
    f->res->commits += B > 0;
    f->pv.active = 0; /* one commit per verify */
    if (f->strategy == GDN_VERIFY_CACHE)
        for (int32_t i = 0; i < B; i++)
            if (f->pv.live[i]) check_pool_slot(f, f->pv.w[i], "a cache commit");
}

/* Step fields garbage: the slot operations and flush do not read them. */
static void scramble_step_fields(oz *f, gdn_op_layer *op)
{
    if (u8(f) % 4) return;
    op->kind = (gdn_step_kind)7, op->tokens = -5, op->batch = 1 << 30;
    op->read_slots = NULL, op->write_slots = NULL;
}

static void flush_with(oz *f, int32_t *slots);

static void do_flush(oz *f)
{
    const int mark = f->nregs;
    region *sl = region_new(f, "flush slots", sizeof(int32_t) * (size_t)(f->MB + 1), OZ_GUARD);
    if (!f->failed) flush_with(f, (int32_t *)P(sl));
    drop_to(f, mark);
}

static void flush_with(oz *f, int32_t *slots)
{
    const int32_t count = (int32_t)(u8(f) % (unsigned)(f->MB + 1));
    uint8_t taken[OZ_MAX_SLOTS] = {0};
    int raised = 0;
    for (int32_t i = 0; i < count; i++) {
        const unsigned x = u8(f);
        int32_t s = x % 8 == 0 ? -1 - (int32_t)(x / 8 % 3) : (x % 8 == 1 ? f->S + (int32_t)(x / 8 % 3) : free_slot(f, taken, x / 8));
        if (s >= 0 && s < f->S) taken[s] = 1;
        slots[i] = s;
        raised |= s >= f->S;
    }
    gdn_op_layer op = base_op(f);
    scramble_step_fields(f, &op);
    call_args args;
    memset(&args, 0, sizeof args);
    args.count = count, args.slots = slots;
    gdn_mixer mixer;
    mutation m = {GDN_OK, 1, "nothing"};
    if (u8(f) % 5 == 0) m = mutate(f, C_FLUSH, &op, &mixer, &args, 0);
    trace(f, "flush of %d slots", args.count);
    snap_all(f, m.want != GDN_OK);
    const gdn_status got = gdn_op_flush(args.null_op ? NULL : &op, args.slots, args.count, NULL);
    check_status(f, got, m.want, "gdn_op_flush");
    if (f->failed) return;
    if (m.want != GDN_OK) {
        verify_untouched(f, "a refused flush");
        f->res->refusals++;
        return;
    }
    const int keeps = f->strategy != GDN_VERIFY_CACHE;
    if (keeps) {
        allow(f->ws, 0, f->ws_bytes);
        for (int32_t i = 0; i < count; i++)
            if (slots[i] >= 0 && slots[i] < f->S) allow_slot(f, slots[i]);
        check_flag(f, &op, raised && count > 0, "the flush");
    } else {
        check_flag(f, &op, 0, "a flush under the cache strategy");
    }
    verify_untouched(f, "the flush");
    f->res->slot_ops++;
    for (int32_t i = 0; i < count && !f->failed; i++) {
        const int32_t s = slots[i];
        if (s < 0 || s >= f->S) continue;
        if (in_window(f, s)) f->pv.active = 0;
        f->current[s] = 1;
        check_pool_slot(f, s, "a flush");
    }
}

/* Two distinct slots from the input. */
static void two_slots(oz *f, int32_t *a, int32_t *b)
{
    const unsigned x = u8(f);
    *a = (int32_t)(x % (unsigned)f->S);
    *b = (int32_t)((unsigned)*a + 1 + x / 16 % (unsigned)(f->S - 1)) % f->S;
}

/* Runs a slot operation with its description (maybe changed); returns 1 when it was accepted. */
static int slot_call(oz *f, call_kind c, call_args *args)
{
    gdn_op_layer op = base_op(f);
    scramble_step_fields(f, &op);
    gdn_mixer mixer;
    mutation m = {GDN_OK, 1, "nothing"};
    if (u8(f) % 5 == 0) m = mutate(f, c, &op, &mixer, args, 0);
    const gdn_op_layer *p = args->null_op ? NULL : &op;
    snap_all(f, m.want != GDN_OK);
    gdn_status got = GDN_OK;
    switch (c) {
    case C_COPY: got = gdn_op_slot_copy(p, args->dst, args->src, NULL); break;
    case C_IMPORT: got = gdn_op_slot_import(p, args->slot, args->src_buf, NULL); break;
    case C_RESET: got = gdn_op_slot_reset(p, args->slot, NULL); break;
    default: got = gdn_op_slot_export(p, args->slot, args->dst_buf, NULL); break;
    }
    char what[64];
    snprintf(what, sizeof what, "gdn_op_%s", call_name[c]);
    check_status(f, got, m.want, what);
    if (f->failed) return 0;
    if (m.want != GDN_OK) {
        verify_untouched(f, "a refused slot operation");
        f->res->refusals++;
        return 0;
    }
    allow(f->ws, 0, f->ws_bytes);
    f->res->slot_ops++;
    return 1;
}

static void do_copy(oz *f)
{
    call_args args;
    memset(&args, 0, sizeof args);
    two_slots(f, &args.dst, &args.src);
    trace(f, "slot_copy %d <- %d", args.dst, args.src);
    if (!slot_call(f, C_COPY, &args)) return;
    allow_slot(f, args.dst);
    verify_untouched(f, "slot_copy");
    if (f->failed) return;
    /* dst's pool state is src's, byte for byte (pending work travels, nothing is folded). */
    if (memcmp(P(f->pool) + slot_offset(f, args.dst), P(f->pool) + slot_offset(f, args.src), f->elems * f->ssize) != 0) {
        fail(f, "after slot_copy %d <- %d the pool states differ", args.dst, args.src);
        return;
    }
    if (in_window(f, args.dst)) f->pv.active = 0;
    memcpy(model_of(f, args.dst), model_of(f, args.src), sizeof(double) * f->elems);
    if (f->exact) memcpy(exact_of(f, args.dst), exact_of(f, args.src), sizeof(double) * f->elems);
    f->known[args.dst] = f->known[args.src], f->current[args.dst] = f->current[args.src];
}

static void do_import(oz *f, int reset)
{
    call_args args;
    memset(&args, 0, sizeof args);
    args.slot = (int32_t)(u8(f) % (unsigned)f->S);
    if (!reset) {
        fill_random(f, f->imp, f->sd, 0.1);
        args.src_buf = P(f->imp);
    }
    trace(f, "slot_%s %d", reset ? "reset" : "import", args.slot);
    if (!slot_call(f, reset ? C_RESET : C_IMPORT, &args)) return;
    allow_slot(f, args.slot);
    verify_untouched(f, reset ? "slot_reset" : "slot_import");
    if (f->failed) return;
    const unsigned char *pool = P(f->pool) + slot_offset(f, args.slot);
    for (size_t j = 0; j < f->elems * f->ssize; j++) {
        const unsigned char want = reset ? 0 : P(f->imp)[j];
        if (pool[j] != want) {
            fail(f, "after slot_%s %d, byte %zu of the slot's state is %u, not %u", reset ? "reset" : "import", args.slot, j,
                 pool[j], want);
            return;
        }
    }
    if (in_window(f, args.slot)) f->pv.active = 0;
    for (size_t j = 0; j < f->elems; j++) f->Sm[j] = gdn__load_f32(pool, f->sd, (int64_t)j);
    model_set(f, args.slot, f->Sm);
    f->known[args.slot] = 1, f->current[args.slot] = 1;
}

static void do_export(oz *f)
{
    call_args args;
    memset(&args, 0, sizeof args);
    args.slot = (int32_t)(u8(f) % (unsigned)f->S);
    args.dst_buf = P(f->exp);
    trace(f, "slot_export %d", args.slot);
    if (!slot_call(f, C_EXPORT, &args)) return;
    allow(f->exp, 0, f->elems * f->ssize);
    if (f->strategy != GDN_VERIFY_CACHE) allow_slot(f, args.slot);
    verify_untouched(f, "slot_export");
    if (f->failed) return;
    const unsigned char *pool = P(f->pool) + slot_offset(f, args.slot);
    if (memcmp(P(f->exp), pool, f->elems * f->ssize) != 0) {
        fail(f, "slot_export %d: the exported state is not the slot's pool state (after its write-back)", args.slot);
        return;
    }
    if (in_window(f, args.slot) && f->strategy != GDN_VERIFY_CACHE) f->pv.active = 0;
    f->current[args.slot] = 1;
    check_pool_slot(f, args.slot, "slot_export");
}

/* ---------------------------------------------------------------------------------------------- */
/* One input                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

int gdn_fuzz_op_run_one(const uint8_t *data, size_t size, unsigned flags, gdn_fuzz_op_result *result)
{
    memset(result, 0, sizeof *result);
    oz *f = calloc(1, sizeof *f);
    f->data = data, f->size = size, f->res = result;
    f->strict = (flags & GDN_FUZZ_OP_STRICT) != 0;
    const char *tr = getenv("GDN_FUZZ_TRACE");
    f->trace = tr && *tr && *tr != '0';
    if (setup(f)) {
        for (f->op_index = 1; f->op_index <= OZ_MAX_OPS && f->at < f->size && !f->failed; f->op_index++) {
            const unsigned c = u8(f) % 16;
            result->ops++;
            switch (c) {
            case 0: case 1: case 2: f->op_name = "step"; do_step(f, 0, 0); break;
            case 3: f->op_name = "step"; do_step(f, u8(f) % 4 == 0, 0); break;
            case 4: case 5: f->op_name = "commit"; do_commit(f); break;
            case 6: { /* a run of decodes (the ring's write-backs, fold's in-place steps) */
                const unsigned n = 2 + u8(f) % 8;
                for (unsigned j = 0; j < n && !f->failed; j++) {
                    f->op_name = "decode run";
                    do_step(f, 0, 1);
                }
                break;
            }
            case 7: f->op_name = "flush"; do_flush(f); break;
            case 8: f->op_name = "slot_copy"; do_copy(f); break;
            case 9: f->op_name = "slot_import"; do_import(f, 0); break;
            case 10: f->op_name = "slot_reset"; do_import(f, 1); break;
            case 11: case 12: f->op_name = "slot_export"; do_export(f); break;
            case 13: /* the caller clears the sticky flag */
                f->op_name = "clear flag";
                memset(P(f->flag), 0, sizeof(int32_t));
                break;
            case 14: { /* cache: the pool is always current; fold and ring: where a flush or export left it so */
                f->op_name = "pool check";
                const int32_t s = (int32_t)(u8(f) % (unsigned)f->S);
                if (f->current[s] || f->strategy == GDN_VERIFY_CACHE) check_pool_slot(f, s, "the last call");
                break;
            }
            default: /* a commit window a caller abandons (as if every row accepted 0) */
                f->op_name = "drop";
                drop_step_regions(f);
                break;
            }
        }
        /* At the end, every slot the model knows, exported and compared. */
        f->op_name = "final exports";
        for (int32_t s = 0; s < f->S && !f->failed; s++) {
            if (!f->known[s]) continue;
            gdn_op_layer op = base_op(f);
            snap_all(f, 0);
            const gdn_status got = gdn_op_slot_export(&op, s, P(f->exp), NULL);
            check_status(f, got, GDN_OK, "gdn_op_slot_export");
            allow(f->exp, 0, f->elems * f->ssize), allow(f->ws, 0, f->ws_bytes);
            if (f->strategy != GDN_VERIFY_CACHE) allow_slot(f, s);
            verify_untouched(f, "the final export");
            check_pool_slot(f, s, "the final export");
        }
    }
    for (int i = 0; i < f->nregs; i++) region_free(f->regs[i]);
    if (f->exact) free(f->exact), free(f->pv.after_exact);
    free(f->state), free(f->pv.after), free(f->Sm), free(f->Sx), free(f->row), free(f->out), free(f->out_x), free(f->zrow), free(f->floor);
    const int failed = f->failed;
    free(f);
    return failed;
}
