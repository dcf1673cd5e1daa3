/*
 * gdn-bench --strategies: the verify strategies side by side (cache, fold, ring), per preset, state
 * dtype, T and batch size B, through the engine's public API (graphs captured lazily):
 *
 *   - memory beyond the pools (gdn_engine_memory: verify cache, token store or ring, over the pools);
 *   - GPU time per layer of a decode step and of a verify step of T tokens plus its commit;
 *   - bytes moved per layer step (a model, below), the achieved GB/s and its share of the
 *     device-to-device copy ceiling measured in the same run (2 GiB buffers, as gdn-bench).
 *
 * How a configuration is timed (CUDA events, every step a replayed step graph, times / layers):
 *   - Cold state: the rows are G groups of B slots (G * B <= --slots), G large enough that the
 *     groups' states exceed 4x the L2 size; step n runs group n mod G.
 *   - Decode: the groups' slots are reset, then staggered: for the ring strategy L decode steps per
 *     group in which row i of group g joins only from step (floor(i L / B) + g) mod L on (the others
 *     are padding rows), which leaves the rows at fill levels spread over 0..L-1 (distinct when
 *     B <= L). Then one whole cycle of G * L steps as warm-up, then samples of a whole number of
 *     G * L steps (each row goes through whole ring cycles: its write-back every L-th decode counts
 *     at its true rate). The reported time is the MEAN per step over all samples (min / max of the
 *     sample means beside it). Cache and fold: L = 1 in the above.
 *   - Verify + commit: accepted counts drawn uniformly from 0..T per row and step (a table of 61
 *     patterns on the device; before each commit one pattern is copied into gdn_engine_accepted, as
 *     a sampler would write it); G * max(4, 4 C) warm-up steps (C = max(L, T), the ring capacity)
 *     so that the fill levels reach steady state, then samples of G * ceil(16 / G) steps, mean per
 *     step. The accepted-count copy is timed alone (same count, behind the same spin kernel) and
 *     subtracted; its per-step cost is printed.
 *
 * Bytes per layer step (the floor a kernel must move), counted exactly over the timed steps by a host
 * mirror of every slot's ring count (or pending count) that follows the documented semantics
 * (kernels/gdn_kernel_params.h) through the same steps and accepted counts. Per row, with S the state
 * of one slot (HV V K state bytes) and a record HV (V 4) + HK K 2 + HV 2 bytes (u in fp32, k and a in
 * the 2-byte input dtype; per value head V 4 + K 2 HK / HV + 2):
 *   ring decode:  S read, h records read (h: the row's fill level; its mean is (L - 1) / 2 once
 *                 staggered), one record appended, or S written instead when h + 1 == L (1 / L of
 *                 the rows), or in every row of a bucket within ring_write_through (gdn.h);
 *   ring verify:  S read, h records read, T records appended, S written when h + T > C (the flushes
 *                 are COUNTED by the mirror, not estimated); commit: the counts only (~0);
 *   cache:        decode S read + S written; verify S read + T states written to the cache, commit
 *                 reads the accepted entry and writes the pool (2 S) for rows that accepted >= 1;
 *   fold:       decode S read, p pending tokens read, S written; verify the same plus T tokens
 *                 stored (a token: (HK K + HV V + 2 HV) 2 bytes); commit ~0;
 *   all:          q, k, v, a, b read and o written (bf16) for every row and token.
 * A header line shows the ring decode's components by the formula (h_avg = (L - 1) / 2, flush 1 / L)
 * for comparison with the counted ones.
 *
 * Without a GPU the engines run on the CPU backend and only memory is reported (engines of one layer:
 * the shares of the pools do not depend on it), unless --cpu-time is
 * given: then the whole procedure runs on the CPU backend with wall-clock times (a smoke test of the
 * procedure; the times mean nothing). --check compares, for a whole cycle of steps before the timing,
 * which pool entries of layer 0 each step changed against the mirror's prediction (ring: exactly the
 * rows that write back; cache: decode rows and committed rows; fold: decode rows and rows with
 * pending tokens), and counts mismatches. --pairs also times, after the verify, pairs of a verify +
 * commit and then a decode of the same rows (the decode that folds, or replays, what the verify
 * accepted; the accepted-count copy subtracted), reported per pair and layer ("pair" on the verify row).
 *
 *   gdn-bench --strategies [--preset qwen3-next,qwen3.5] [--state f32,bf16] [--tokens 4,8]
 *                          [--batch 64] [--strategy cache,fold,ring] [--ring-length 16]
 *                          [--slots 1024] [--layers 8] [--samples 20] [--groups G] [--cpu-time]
 *                          [--check] [--pairs] [--json FILE]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "engine/config.h"
#include "gdn/gdn.h"

#define MAX_LIST 16
#define PATTERNS 61 /* accepted-count patterns (prime, so that they do not line up with G) */

/* ---------------------------------------------------------------------------------------------- */
/* Options                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef struct variant {
    gdn_verify_strategy strategy;
    int32_t ring_length; /* ring only */
} variant;

typedef struct sopts {
    int npresets;
    char presets[4][32];
    int nstates;
    gdn_dtype states[2];
    int ntokens, tokens[MAX_LIST];
    int nbatch, batch[MAX_LIST];
    int nvariants;
    variant variants[2 + MAX_LIST];
    int32_t num_slots, layers, samples, groups;
    int cpu_time, check, pairs;
    const char *json;
} sopts;

static const char *sname(gdn_verify_strategy s)
{
    return s == GDN_VERIFY_CACHE ? "cache" : s == GDN_VERIFY_FOLD ? "fold" : s == GDN_VERIFY_RING ? "ring" : "auto";
}

static const char *dname(gdn_dtype d) { return d == GDN_DTYPE_F32 ? "f32" : "bf16"; }

/* ---------------------------------------------------------------------------------------------- */
/* Host mirror of the per-slot counts, and the bytes it implies                                      */
/* ---------------------------------------------------------------------------------------------- */

typedef struct mirror {
    gdn_verify_strategy strategy;
    int32_t L, C;          /* ring length and capacity max(L, max_tokens) */
    int32_t *count;        /* [num_slots]: ring records (ring) or pending tokens (fold) */
    const gdn_engine_config *resolved; /* ring: its buckets and ring_write_through */
    double state_b;        /* one slot's state, one layer */
    double rec_b;          /* one ring record of a row (all value heads) */
    double tok_b;          /* one stored fold token of a row */
    double io_tok_b;       /* one token of a row: q, k, v, a, b read, o written (bf16) */
    int counting;
    double steps, live, h_sum, writebacks;
    double st_r, st_w, rec_r, rec_w, commit, io; /* bytes, summed over counted steps */
    uint8_t *changed;      /* [max_batch]: the last step changed the row's pool entry (prediction) */
} mirror;

static void mirror_zero_counters(mirror *m)
{
    m->steps = m->live = m->h_sum = m->writebacks = 0;
    m->st_r = m->st_w = m->rec_r = m->rec_w = m->commit = m->io = 0;
}

static int32_t clamp_i(int32_t x, int32_t lo, int32_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Ring: whether a decode of B rows writes every row back (its bucket within ring_write_through). */
static int mirror_writes_through(const mirror *m, int32_t B)
{
    const gdn_engine_config *c = m->resolved;
    return c && c->ring_write_through >= 1 && gdn__bucket_for(c, B) <= c->ring_write_through;
}

static void mirror_decode(mirror *m, const int32_t *rows, int32_t B)
{
    double st_r = 0, st_w = 0, rec_r = 0, rec_w = 0, io = 0, live = 0, h_sum = 0, wb = 0;
    const int through = m->strategy == GDN_VERIFY_RING && mirror_writes_through(m, B);
    for (int32_t i = 0; i < B; i++) {
        const int32_t s = rows[i];
        m->changed[i] = 0;
        if (s < 0) continue;
        live++, io += m->io_tok_b, st_r += m->state_b;
        if (m->strategy == GDN_VERIFY_RING) {
            const int32_t h = clamp_i(m->count[s], 0, m->C);
            h_sum += h, rec_r += h * m->rec_b;
            if (through || h + 1 >= m->L) {
                st_w += m->state_b, wb++, m->count[s] = 0, m->changed[i] = 1;
            } else {
                rec_w += m->rec_b, m->count[s] = h + 1;
            }
        } else if (m->strategy == GDN_VERIFY_FOLD) {
            const int32_t p = m->count[s];
            h_sum += p, rec_r += p * m->tok_b, st_w += m->state_b, wb++, m->count[s] = 0, m->changed[i] = 1;
        } else {
            st_w += m->state_b, wb++, m->changed[i] = 1;
        }
    }
    if (!m->counting) return;
    m->steps++, m->live += live, m->h_sum += h_sum, m->writebacks += wb;
    m->st_r += st_r, m->st_w += st_w, m->rec_r += rec_r, m->rec_w += rec_w, m->io += io;
}

/* A verify step of T tokens and its commit with accepted[0..B). */
static void mirror_verify(mirror *m, const int32_t *rows, int32_t B, int32_t T, const int32_t *accepted)
{
    double st_r = 0, st_w = 0, rec_r = 0, rec_w = 0, io = 0, live = 0, h_sum = 0, wb = 0, commit = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t s = rows[i];
        m->changed[i] = 0;
        if (s < 0) continue;
        const int32_t a = clamp_i(accepted[i], 0, T);
        live++, io += T * m->io_tok_b, st_r += m->state_b;
        if (m->strategy == GDN_VERIFY_RING) {
            const int32_t h = clamp_i(m->count[s], 0, m->C);
            h_sum += h, rec_r += h * m->rec_b;
            const int flush = h + T > m->C;
            if (flush) st_w += m->state_b, wb++, m->changed[i] = 1;
            rec_w += T * m->rec_b;
            m->count[s] = (flush ? 0 : h) + a; /* the verify leaves the base, commit adds a */
        } else if (m->strategy == GDN_VERIFY_FOLD) {
            const int32_t p = m->count[s];
            h_sum += p, rec_r += p * m->tok_b, st_w += m->state_b, wb++, rec_w += T * m->tok_b;
            m->changed[i] = p > 0; /* the folded state is written; unchanged when nothing was pending */
            m->count[s] = a;
        } else {
            st_w += T * m->state_b; /* the cache entries */
            if (a > 0) commit += 2 * m->state_b, wb++, m->changed[i] = 1;
        }
    }
    if (!m->counting) return;
    m->steps++, m->live += live, m->h_sum += h_sum, m->writebacks += wb;
    m->st_r += st_r, m->st_w += st_w, m->rec_r += rec_r, m->rec_w += rec_w, m->io += io, m->commit += commit;
}

/* ---------------------------------------------------------------------------------------------- */
/* Timing context                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

typedef struct ctx {
    gdn_engine *e;
    int gpu;                 /* CUDA events; else wall clock (CPU backend smoke test) */
    cudaStream_t s;
    mirror m;
    const int32_t *slots;    /* [G * B]: group g is slots[g B .. g B + B) */
    int32_t B, T, G, layers, L; /* L: ring length, 1 for the other strategies (the stagger period) */
    int32_t *rows;           /* [B] scratch */
    int32_t *acc_host;       /* [PATTERNS][max_batch] */
    int32_t *acc_dev;        /* the same on the device (gpu) */
    int32_t max_batch;
    long long step_no, verify_no;
    /* --check */
    int check;
    long long check_rows, check_bad;
    gdn_state_pool pool0;
    size_t slot_bytes;
    unsigned char *snap0, *snap1;
    uint16_t *fresh_v;       /* [max_batch * T * HV * V] bf16 scratch */
    size_t v_elems;
} ctx;


/* --check: new random v in layer 0 before each checked step. With the same inputs every step a row's
 * state converges, and a bf16 write-back can then rewrite identical bits (seen on the CPU backend). */
static int perturb_v(ctx *c)
{
    gdn_layer_io io;
    CHECK_GDN(gdn_engine_layer_io(c->e, 0, &io));
    for (size_t i = 0; i < c->v_elems; i++) {
        const float x = (float)((int32_t)(gdn_bench_rng_next() >> 48) - 32768) / 32768.0f; /* uniform [-1, 1) */
        uint32_t bits;
        memcpy(&bits, &x, 4);
        c->fresh_v[i] = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16); /* round to nearest even */
    }
    CHECK_GDN(gdn_engine_upload(c->e, io.v, c->fresh_v, 2 * c->v_elems, c->s));
    return 0;
}

static int set_accepted(ctx *c, const int32_t **pattern)
{
    const int p = (int)(c->verify_no++ % PATTERNS);
    *pattern = c->acc_host + (size_t)p * (size_t)c->max_batch;
    if (c->gpu) {
        CHECK_CUDA(cudaMemcpyAsync(gdn_engine_accepted(c->e), c->acc_dev + (size_t)p * (size_t)c->max_batch,
                                   sizeof(int32_t) * (size_t)c->B, cudaMemcpyDeviceToDevice, c->s));
    } else {
        CHECK_GDN(gdn_engine_upload(c->e, gdn_engine_accepted(c->e), *pattern, sizeof(int32_t) * (size_t)c->B, c->s));
    }
    return 0;
}

/* Layer 0's pool entries of the live rows into buf. */
static int snapshot(ctx *c, const int32_t *rows, unsigned char *buf)
{
    for (int32_t i = 0; i < c->B; i++)
        if (rows[i] >= 0)
            CHECK_GDN(gdn_engine_download(c->e, buf + (size_t)i * c->slot_bytes,
                                          (char *)c->pool0.data + (size_t)rows[i] * (size_t)c->pool0.slot_stride *
                                                                      gdn_dtype_size(c->pool0.dtype),
                                          c->slot_bytes, c->s));
    CHECK_GDN(gdn_engine_synchronize(c->e, c->s));
    return 0;
}

static int check_after(ctx *c, const int32_t *rows)
{
    if (snapshot(c, rows, c->snap1)) return -1;
    for (int32_t i = 0; i < c->B; i++) {
        if (rows[i] < 0) continue;
        const int changed = memcmp(c->snap0 + (size_t)i * c->slot_bytes, c->snap1 + (size_t)i * c->slot_bytes, c->slot_bytes) != 0;
        c->check_rows++;
        if (changed != c->m.changed[i]) {
            if (c->check_bad < 5)
                fprintf(stderr, "check: step %lld row %d slot %d: pool %s, the mirror predicted %s (count now %d)\n",
                        c->step_no, i, rows[i], changed ? "changed" : "unchanged", c->m.changed[i] ? "a change" : "none",
                        c->m.count ? c->m.count[rows[i]] : -1);
            c->check_bad++;
        }
    }
    return 0;
}

/* One decode (verify == 0) or verify + commit step of `rows`. */
static int issue(ctx *c, const int32_t *rows, int verify)
{
    if (c->check && (perturb_v(c) || snapshot(c, rows, c->snap0))) return -1;
    gdn_step step = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = verify ? c->T : 1, .batch = c->B,
                     .slots = rows};
    CHECK_GDN(gdn_engine_begin_step(c->e, &step, c->s, NULL));
    CHECK_GDN(gdn_engine_run_step(c->e, c->s));
    if (verify) {
        const int32_t *acc;
        if (set_accepted(c, &acc)) return -1;
        CHECK_GDN(gdn_engine_commit(c->e, c->s));
        mirror_verify(&c->m, rows, c->B, c->T, acc);
    } else {
        mirror_decode(&c->m, rows, c->B);
    }
    c->step_no++;
    return c->check ? check_after(c, rows) : 0;
}

/* The next group's step (groups in rotation). */
static int issue_next(ctx *c, int verify)
{
    const int32_t g = (int32_t)(c->step_no % c->G);
    return issue(c, c->slots + (size_t)g * (size_t)c->B, verify);
}

typedef struct stopwatch {
    int gpu;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    double t0;
} stopwatch;

static int watch_start(stopwatch *w)
{
    if (w->gpu) {
        CHECK_CUDA(cudaStreamSynchronize(w->s));
        if (gdn_bench_spin(w->s, 2.0)) return -1; /* the host queues the steps while this runs */
        CHECK_CUDA(cudaEventRecord(w->e0, w->s));
    } else {
        w->t0 = bench_now_s();
    }
    return 0;
}

static int watch_stop(stopwatch *w, double *us)
{
    if (w->gpu) {
        CHECK_CUDA(cudaEventRecord(w->e1, w->s));
        CHECK_CUDA(cudaEventSynchronize(w->e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, w->e0, w->e1));
        *us = 1000.0 * ms;
    } else {
        *us = 1e6 * (bench_now_s() - w->t0);
    }
    return 0;
}

/* `samples` samples of `steps` steps each; mean per step over all, min and max of the sample means. */
static int time_samples(ctx *c, stopwatch *w, int verify, int steps, int samples, double *mean, double *lo, double *hi)
{
    double sum = 0;
    *lo = INFINITY, *hi = 0;
    mirror_zero_counters(&c->m);
    c->m.counting = 1;
    for (int r = 0; r < samples; r++) {
        if (watch_start(w)) return -1;
        for (int n = 0; n < steps; n++)
            if (issue_next(c, verify)) return -1;
        double us;
        if (watch_stop(w, &us)) return -1;
        us /= steps;
        sum += us;
        if (us < *lo) *lo = us;
        if (us > *hi) *hi = us;
    }
    c->m.counting = 0;
    *mean = sum / samples;
    return 0;
}

/* Time per accepted-count copy, timed like the steps (subtracted from verify + commit). */
static int time_accepted_copy(ctx *c, stopwatch *w, int n, double *us)
{
    if (watch_start(w)) return -1;
    for (int i = 0; i < n; i++) {
        const int32_t *acc;
        if (set_accepted(c, &acc)) return -1;
    }
    if (watch_stop(w, us)) return -1;
    *us /= n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* Results                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef struct srow {
    char preset[32];
    gdn_dtype state;
    int32_t T, B, G, L; /* L: ring length, 0 for cache and fold */
    gdn_verify_strategy strategy;
    int verify;         /* 0: decode; 1: verify + commit */
    double us, us_lo, us_hi, copy_us; /* per layer step; copy_us: accepted copy per step (subtracted) */
    double pair_us;                   /* verify rows, --pairs: a verify + commit and then a decode of the same rows */
    double h_avg, writeback_pct;      /* mean fill level (ring) / pending tokens (fold); rows writing S */
    double st_r, st_w, rec_r, rec_w, commit, io, total; /* bytes per layer step */
    double gbps, pct_copy;
    long long check_rows, check_bad;
} srow;

typedef struct mrow {
    char preset[32];
    gdn_dtype state;
    int32_t T, L;
    gdn_verify_strategy strategy;
    gdn_memory_report mem;
    double beyond_pct; /* (cache + token store + ring) / pools */
    double ring_bytes_per_slot_layer, state_bytes_per_slot_layer;
} mrow;

static double copy_gbps;

static void print_row(const srow *r, const srow *own_decode, const srow *cache_decode)
{
    char lbl[24];
    if (r->strategy == GDN_VERIFY_RING) snprintf(lbl, sizeof lbl, "ring L=%d", r->L);
    else snprintf(lbl, sizeof lbl, "%s", sname(r->strategy));
    printf("%-10s %4s %2d %-11s %4d %3d %-6s | %9.2f %9.2f %9.2f | %6.2f %6.1f | %8.2f %8.2f %8.2f %8.2f %7.2f %7.2f %8.2f "
           "| %7.1f %6.1f |",
           r->preset, dname(r->state), r->T, lbl, r->B, r->G, r->verify ? "verify" : "decode", r->us, r->us_lo, r->us_hi,
           r->h_avg, r->writeback_pct, r->st_r / 1e6, r->st_w / 1e6, r->rec_r / 1e6, r->rec_w / 1e6, r->commit / 1e6,
           r->io / 1e6, r->total / 1e6, r->gbps, r->pct_copy);
    if (r->verify && own_decode) printf(" %7.3f", r->us / own_decode->us);
    else printf(" %7s", "-");
    if (cache_decode) printf(" %8.3f", r->us / cache_decode->us);
    else printf(" %8s", "-");
    if (r->check_rows) printf("  check %lld/%lld bad", r->check_bad, r->check_rows);
    if (r->pair_us > 0) printf("  pair %.2f", r->pair_us);
    printf("\n");
    fflush(stdout);
}

static void fill_bytes(srow *r, const mirror *m)
{
    const double n = m->steps > 0 ? m->steps : 1;
    r->st_r = m->st_r / n, r->st_w = m->st_w / n, r->rec_r = m->rec_r / n, r->rec_w = m->rec_w / n;
    r->commit = m->commit / n, r->io = m->io / n;
    r->total = r->st_r + r->st_w + r->rec_r + r->rec_w + r->commit + r->io;
    r->h_avg = m->live > 0 ? m->h_sum / m->live : 0;
    r->writeback_pct = m->live > 0 ? 100.0 * m->writebacks / m->live : 0;
    r->gbps = r->us > 0 ? r->total / (r->us * 1e-6) / 1e9 : 0;
    r->pct_copy = copy_gbps > 0 ? 100.0 * r->gbps / copy_gbps : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* One engine                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

/* Groups of B slots whose states exceed 4x L2 (cold state), within the slots there are. */
static int32_t group_count(const sopts *o, int32_t B, size_t state_bytes_per_slot, size_t l2_bytes)
{
    if (o->groups > 0) return o->groups * B <= o->num_slots ? o->groups : o->num_slots / B;
    const double per_group = (double)B * o->layers * (double)state_bytes_per_slot;
    int32_t g = (int32_t)ceil(4.0 * (double)l2_bytes / per_group);
    if (g < 1) g = 1;
    if ((int64_t)g * B > o->num_slots) g = o->num_slots / B;
    return g < 1 ? 1 : g;
}

/* Decode and verify + commit of one batch size on engine e; appends two rows. */
static int run_batch(ctx *c, const sopts *o, srow *out, int *nout, const srow *proto)
{
    stopwatch w = {.gpu = c->gpu, .s = c->s};
    if (c->gpu) {
        CHECK_CUDA(cudaEventCreate(&w.e0));
        CHECK_CUDA(cudaEventCreate(&w.e1));
    }
    const int32_t B = c->B, G = c->G, L = c->L;
    /* Fresh slots: state zeroed, rings and pending counts emptied (mirror too). */
    for (int32_t i = 0; i < G * B; i++) {
        CHECK_GDN(gdn_slot_reset(c->e, c->slots[i], c->s));
        if (c->m.count) c->m.count[c->slots[i]] = 0;
    }
    CHECK_GDN(gdn_engine_synchronize(c->e, c->s));
    c->step_no = 0;

    /* Stagger (ring): row i of group g joins at step (floor(i L / B) + g) mod L of L steps. */
    for (int32_t j = 0; j < L && L > 1; j++)
        for (int32_t g = 0; g < G; g++) {
            int live = 0;
            for (int32_t i = 0; i < B; i++) {
                const int32_t join = (int32_t)(((int64_t)i * L / B + g) % L);
                c->rows[i] = j >= join ? c->slots[(size_t)g * B + i] : -1;
                live += c->rows[i] >= 0;
            }
            if (live && issue(c, c->rows, 0)) return -1;
        }
    c->step_no = 0; /* whole cycles from here: group n mod G */
    for (int32_t n = 0; n < G * L; n++) /* warm-up: one whole cycle (graph capture, caches) */
        if (issue_next(c, 0)) return -1;
    if (o->check) { /* one more whole cycle, checked */
        c->check = 1, c->check_rows = c->check_bad = 0;
        for (int32_t n = 0; n < G * L; n++)
            if (issue_next(c, 0)) return -1;
        c->check = 0;
    }
    srow *d = &out[(*nout)++];
    *d = *proto;
    d->verify = 0, d->check_rows = c->check_rows, d->check_bad = c->check_bad;
    {
        const int cycle = G * L;
        int steps = cycle * ((16 + cycle - 1) / cycle);
        int samples = o->samples;
        while (samples > 3 && (long long)samples * steps > 4000) samples--;
        double mean, lo, hi;
        if (time_samples(c, &w, 0, steps, samples, &mean, &lo, &hi)) return -1;
        d->us = mean / c->layers, d->us_lo = lo / c->layers, d->us_hi = hi / c->layers;
        fill_bytes(d, &c->m);
    }

    /* Verify + commit in steady state. */
    const int32_t C = c->m.C > 0 ? c->m.C : c->T;
    const int warm = G * (c->m.strategy == GDN_VERIFY_RING ? 4 * C : 4);
    c->step_no = 0;
    for (int n = 0; n < warm; n++)
        if (issue_next(c, 1)) return -1;
    c->check_rows = c->check_bad = 0;
    if (o->check) {
        c->check = 1;
        for (int n = 0; n < G * (c->m.strategy == GDN_VERIFY_RING ? 2 * C : 4); n++)
            if (issue_next(c, 1)) return -1;
        c->check = 0;
    }
    srow *v = &out[(*nout)++];
    *v = *proto;
    v->verify = 1, v->check_rows = c->check_rows, v->check_bad = c->check_bad;
    {
        int steps = G * ((16 + G - 1) / G);
        int samples = o->samples;
        while (samples > 3 && (long long)samples * steps > 4000) samples--;
        double mean, lo, hi, copy_us;
        if (time_samples(c, &w, 1, steps, samples, &mean, &lo, &hi)) return -1;
        if (time_accepted_copy(c, &w, steps, &copy_us)) return -1;
        v->copy_us = copy_us;
        v->us = (mean - copy_us) / c->layers, v->us_lo = (lo - copy_us) / c->layers, v->us_hi = (hi - copy_us) / c->layers;
        fill_bytes(v, &c->m);
        if (o->pairs) { /* each group: verify + commit, then a decode, which folds or replays what was accepted */
            const int pairs = G * ((8 + G - 1) / G);
            double sum = 0;
            for (int r = -1; r < samples; r++) { /* r = -1: warm-up */
                if (watch_start(&w)) return -1;
                for (int n = 0; n < pairs; n++) {
                    const int32_t *rows = c->slots + (size_t)(n % G) * (size_t)B;
                    if (issue(c, rows, 1) || issue(c, rows, 0)) return -1;
                }
                double us;
                if (watch_stop(&w, &us)) return -1;
                if (r >= 0) sum += us / pairs - copy_us;
            }
            v->pair_us = sum / samples / c->layers;
        }
    }
    CHECK_GDN(gdn_engine_check_device_error(c->e, c->s));
    if (c->gpu) {
        cudaEventDestroy(w.e0);
        cudaEventDestroy(w.e1);
    }
    return 0;
}

static const srow *find_row(const srow *rows, int n, const srow *like, gdn_verify_strategy strategy, int32_t L, int verify)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].preset, like->preset) && rows[i].state == like->state && rows[i].T == like->T &&
            rows[i].B == like->B && rows[i].strategy == strategy && rows[i].L == L && rows[i].verify == verify)
            return &rows[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Main                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: gdn-bench --strategies [--preset qwen3-next,qwen3.5,tiny] [--state f32,bf16] [--tokens 4,8]\n"
            "                              [--batch 64,...] [--strategy cache,fold,ring] [--ring-length 16,...]\n"
            "                              [--slots 1024] [--layers 8] [--samples 20] [--groups G] [--cpu-time]\n"
            "                              [--check] [--pairs] [--json FILE]\n");
}

static int parse(int argc, char **argv, sopts *o)
{
    memset(o, 0, sizeof *o);
    const char *presets = "qwen3-next,qwen3.5", *states = "f32,bf16", *strategies = "cache,fold,ring";
    int rings[MAX_LIST] = {GDN_DEFAULT_RING_LENGTH}, nrings = 1;
    o->ntokens = 2, o->tokens[0] = 4, o->tokens[1] = 8;
    o->nbatch = 1, o->batch[0] = 64;
    o->num_slots = 1024, o->layers = 8, o->samples = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cpu-time")) o->cpu_time = 1;
        else if (!strcmp(a, "--check")) o->check = 1;
        else if (!strcmp(a, "--pairs")) o->pairs = 1;
        else if (!v) return -1;
        else if (!strcmp(a, "--preset")) presets = v, i++;
        else if (!strcmp(a, "--state")) states = v, i++;
        else if (!strcmp(a, "--strategy") || !strcmp(a, "--strategies")) strategies = v, i++;
        else if (!strcmp(a, "--tokens")) o->ntokens = bench_parse_list(v, o->tokens, MAX_LIST), i++;
        else if (!strcmp(a, "--batch")) o->nbatch = bench_parse_list(v, o->batch, MAX_LIST), i++;
        else if (!strcmp(a, "--ring-length")) nrings = bench_parse_list(v, rings, MAX_LIST), i++;
        else if (!strcmp(a, "--slots")) o->num_slots = atoi(v), i++;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v), i++;
        else if (!strcmp(a, "--samples")) o->samples = atoi(v), i++;
        else if (!strcmp(a, "--groups")) o->groups = atoi(v), i++;
        else if (!strcmp(a, "--json")) o->json = v, i++;
        else return -1;
    }
    /* Presets: comma-separated names. */
    for (const char *p = presets; *p && o->npresets < 4;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof o->presets[0]) {
            memcpy(o->presets[o->npresets], p, n);
            o->presets[o->npresets++][n] = 0;
        }
        p += n + (p[n] == ',');
    }
    if (strstr(states, "f32")) o->states[o->nstates++] = GDN_DTYPE_F32;
    if (strstr(states, "bf16")) o->states[o->nstates++] = GDN_DTYPE_BF16;
    if (strstr(strategies, "cache")) o->variants[o->nvariants++] = (variant){GDN_VERIFY_CACHE, 0};
    if (strstr(strategies, "fold")) o->variants[o->nvariants++] = (variant){GDN_VERIFY_FOLD, 0};
    if (strstr(strategies, "ring"))
        for (int j = 0; j < nrings; j++) o->variants[o->nvariants++] = (variant){GDN_VERIFY_RING, rings[j]};
    for (int j = 0; j < o->ntokens; j++)
        if (o->tokens[j] < 2 || o->tokens[j] > GDN_MAX_TOKENS) return -1;
    for (int j = 0; j < o->nbatch; j++)
        if (o->batch[j] < 1 || o->batch[j] > o->num_slots) return -1;
    for (int j = 0; j < nrings; j++)
        if (rings[j] < GDN_MIN_RING_LENGTH || rings[j] > GDN_MAX_RING_LENGTH) return -1;
    if (!o->npresets || !o->nstates || !o->nvariants || !o->ntokens || !o->nbatch || o->layers < 1 || o->samples < 1)
        return -1;
    return 0;
}

static void write_json(const sopts *o, const mrow *mem, int nmem, const srow *rows, int nrows, int timed, const char *device)
{
    FILE *f = fopen(o->json, "w");
    if (!f) {
        perror(o->json);
        return;
    }
    fprintf(f, "{\"mode\": \"strategies\", \"device\": \"%s\", \"timed\": %d, \"copy_gbps\": %.1f, \"slots\": %d, "
               "\"layers\": %d, \"samples\": %d,\n \"timing\": \"us per layer step; decode: mean over whole ring cycles "
               "after a stagger; verify: verify + commit, accepted uniform in 0..T, steady state, accepted copy "
               "subtracted\",\n \"memory\": [\n", device, timed, copy_gbps, o->num_slots, o->layers, o->samples);
    for (int i = 0; i < nmem; i++) {
        const mrow *m = &mem[i];
        fprintf(f, "  {\"preset\": \"%s\", \"state\": \"%s\", \"T\": %d, \"strategy\": \"%s\", \"ring_length\": %d, "
                   "\"state_pools\": %llu, \"verify_cache\": %llu, \"token_store\": %llu, \"ring\": %llu, "
                   "\"beyond_pools_pct\": %.4f, \"ring_bytes_per_slot_layer\": %.0f, \"state_bytes_per_slot_layer\": %.0f}%s\n",
                m->preset, dname(m->state), m->T, sname(m->strategy), m->L, (unsigned long long)m->mem.state_pools,
                (unsigned long long)m->mem.verify_cache, (unsigned long long)m->mem.token_store,
                (unsigned long long)m->mem.ring, m->beyond_pct, m->ring_bytes_per_slot_layer, m->state_bytes_per_slot_layer,
                i + 1 < nmem ? "," : "");
    }
    fprintf(f, " ],\n \"rows\": [\n");
    for (int i = 0; i < nrows; i++) {
        const srow *r = &rows[i];
        fprintf(f, "  {\"preset\": \"%s\", \"state\": \"%s\", \"T\": %d, \"strategy\": \"%s\", \"ring_length\": %d, "
                   "\"B\": %d, \"groups\": %d, \"kind\": \"%s\", \"us\": %.3f, \"us_min\": %.3f, \"us_max\": %.3f, "
                   "\"accepted_copy_us_per_step\": %.3f, \"fill_avg\": %.3f, \"writeback_pct\": %.3f, "
                   "\"bytes\": {\"state_read\": %.0f, \"state_write\": %.0f, \"records_read\": %.0f, \"records_write\": %.0f, "
                   "\"commit\": %.0f, \"io\": %.0f, \"total\": %.0f}, \"gbps\": %.1f, \"pct_copy\": %.2f, "
                   "\"check_rows\": %lld, \"check_bad\": %lld, \"pair_us\": %.3f}%s\n",
                r->preset, dname(r->state), r->T, sname(r->strategy), r->L, r->B, r->G, r->verify ? "verify_commit" : "decode",
                r->us, r->us_lo, r->us_hi, r->copy_us, r->h_avg, r->writeback_pct, r->st_r, r->st_w, r->rec_r, r->rec_w,
                r->commit, r->io, r->total, r->gbps, r->pct_copy, r->check_rows, r->check_bad, r->pair_us,
                i + 1 < nrows ? "," : "");
    }
    fprintf(f, " ]\n}\n");
    fclose(f);
}

int gdn_bench_strategies_main(int argc, char **argv)
{
    sopts o;
    gdn_bench_rng_seed(0x853c49e6748fea9bull);
    if (parse(argc, argv, &o)) {
        usage();
        return 2;
    }
    int max_b = 1;
    for (int j = 0; j < o.nbatch; j++)
        if (o.batch[j] > max_b) max_b = o.batch[j];

    /* GPU present? Then the copy ceiling, the L2 size and a stream. */
    int ndev = 0, gpu = 0;
    char device[256] = "cpu backend";
    size_t l2 = 0;
    cudaStream_t s = NULL;
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
        struct cudaDeviceProp prop;
        CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
        snprintf(device, sizeof device, "%s", prop.name);
        l2 = (size_t)prop.l2CacheSize;
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        if (gdn_bench_copy_ceiling(s, &copy_gbps)) return 3;
        gpu = 1;
        printf("# %s, L2 %.0f MB, copy ceiling %.1f GB/s (2 GiB D2D, read + write)\n", device, l2 / 1048576.0, copy_gbps);
    } else {
        cudaGetLastError();
        printf("# no GPU: engines on the CPU backend; %s\n",
               o.cpu_time ? "--cpu-time: the procedure runs with wall-clock times (a smoke test; times mean nothing)"
                          : "memory only (--cpu-time runs the timing procedure on the CPU backend)");
    }
    const int timed = gpu || o.cpu_time;
    if (!timed && o.layers > 1) { /* the shares do not depend on the layer count; the CPU backend's pools are host memory */
        printf("# memory only: engines of 1 layer (the shares of the pools are the same for any layer count)\n");
        o.layers = 1;
    }
    printf("# %d layers, %d slots; us per layer step, graph replay; decode: mean over whole ring cycles after a stagger; "
           "verify: verify + commit, accepted uniform in 0..T, steady state, the accepted-count copy subtracted\n",
           o.layers, o.num_slots);
    printf("# columns: G groups of B slots rotated (cold state); us mean, min, max of sample means; fill: mean ring fill\n"
           "#   level read (fold: pending tokens folded); wb%%: rows writing the state back (ring flushes; cache decode\n"
           "#   and commits; fold all); MB per layer step: state read, state (or cache) written, records (fold:\n"
           "#   tokens) read and written, commit, q k v a b o; total; GB/s and %% of the copy ceiling; verify / own\n"
           "#   decode; this row / the cache strategy's decode (same preset, state, T, B)\n");

    const int max_rows = o.npresets * o.nstates * o.ntokens * o.nvariants * o.nbatch * 2;
    const int max_mem = o.npresets * o.nstates * o.ntokens * o.nvariants;
    srow *rows = calloc((size_t)max_rows + 1, sizeof *rows);
    mrow *mem = calloc((size_t)max_mem + 1, sizeof *mem);
    int nrows = 0, nmem = 0, failures = 0;
    int32_t *all_slots = malloc(sizeof(int32_t) * (size_t)o.num_slots);
    int32_t *acc_host = malloc(sizeof(int32_t) * PATTERNS * (size_t)max_b);
    int32_t *acc_dev = NULL;
    if (gpu) CHECK_CUDA(cudaMalloc((void **)&acc_dev, sizeof(int32_t) * PATTERNS * (size_t)max_b));

    for (int pi = 0; pi < o.npresets; pi++)
        for (int si = 0; si < o.nstates; si++)
            for (int ti = 0; ti < o.ntokens; ti++) {
                const int32_t T = o.tokens[ti];
                for (int vi = 0; vi < o.nvariants; vi++) {
                    const variant *va = &o.variants[vi];
                    gdn_model_config model;
                    if (gdn_model_preset(o.presets[pi], o.layers, &model) != GDN_OK) {
                        fprintf(stderr, "unknown preset %s\n", o.presets[pi]);
                        return 2;
                    }
                    gdn_engine_config cfg;
                    CHECK_GDN(gdn_engine_config_init(&cfg, &model));
                    cfg.state_dtype = o.states[si];
                    cfg.num_slots = o.num_slots;
                    cfg.max_batch = max_b;
                    cfg.max_tokens = T;
                    cfg.verify_strategy = va->strategy;
                    cfg.ring_length = va->ring_length;
                    cfg.graph_mode = GDN_GRAPHS_LAZY;
                    cfg.backend = gpu ? GDN_BACKEND_CUDA : GDN_BACKEND_CPU;
                    gdn_engine *e = NULL;
                    const gdn_status st = gdn_engine_create(&cfg, &e);
                    char lbl[24];
                    if (va->strategy == GDN_VERIFY_RING) snprintf(lbl, sizeof lbl, "ring L=%d", va->ring_length);
                    else snprintf(lbl, sizeof lbl, "%s", sname(va->strategy));
                    if (st != GDN_OK) {
                        printf("== %s %s T=%d %s: engine not created (%s): skipped\n", o.presets[pi], dname(o.states[si]),
                               T, lbl, gdn_status_name(st));
                        continue;
                    }
                    const gdn_engine_config *rc = gdn_engine_get_config(e);
                    const int32_t HK = model.num_k_heads, HV = model.num_v_heads, K = model.head_dim_k, V = model.head_dim_v;
                    const double state_b = (double)HV * V * K * (double)gdn_dtype_size(cfg.state_dtype);
                    const double rec_b = (double)HV * V * 4 + (double)HK * K * 2 + (double)HV * 2;
                    const int32_t L = va->strategy == GDN_VERIFY_RING ? rc->ring_length : 0;
                    const int32_t C = L ? (L > T ? L : T) : 0;

                    mrow *m = &mem[nmem++];
                    memset(m, 0, sizeof *m);
                    snprintf(m->preset, sizeof m->preset, "%s", o.presets[pi]);
                    m->state = cfg.state_dtype, m->T = T, m->L = L, m->strategy = va->strategy;
                    CHECK_GDN(gdn_engine_memory(e, &m->mem));
                    m->beyond_pct = 100.0 * (double)(m->mem.verify_cache + m->mem.token_store + m->mem.ring) /
                                    (double)m->mem.state_pools;
                    m->state_bytes_per_slot_layer = state_b;
                    m->ring_bytes_per_slot_layer = (double)m->mem.ring / ((double)o.num_slots * o.layers);
                    printf("== %s %s T=%d %s: memory beyond the pools %.2f%% (verify cache %.3f GiB, token store %.3f GiB, "
                           "ring %.3f GiB; pools %.3f GiB)",
                           o.presets[pi], dname(cfg.state_dtype), T, lbl, m->beyond_pct, m->mem.verify_cache / 1073741824.0,
                           m->mem.token_store / 1073741824.0, m->mem.ring / 1073741824.0, m->mem.state_pools / 1073741824.0);
                    if (L)
                        printf("; per slot and layer %.1f KB of ring (capacity %d records) vs %.1f KB of state\n"
                               "   formula, per row and layer: state read %.1f KB, ring read (h_avg %.1f) %.1f KB, append "
                               "%.1f KB x %.3f, flush write %.1f KB / %d; a record %.1f KB",
                               m->ring_bytes_per_slot_layer / 1024.0, C, state_b / 1024.0, state_b / 1024.0, (L - 1) / 2.0,
                               (L - 1) / 2.0 * rec_b / 1024.0, rec_b / 1024.0, (L - 1.0) / L, state_b / 1024.0, L,
                               rec_b / 1024.0);
                    printf("\n");
                    if (!timed) {
                        gdn_engine_destroy(e);
                        continue;
                    }
                    printf("%-10s %4s %2s %-11s %4s %3s %-6s | %9s %9s %9s | %6s %6s | %8s %8s %8s %8s %7s %7s %8s | %7s %6s | "
                           "%7s %8s\n",
                           "preset", "st", "T", "strategy", "B", "G", "kind", "us", "min", "max", "fill", "wb%", "stR MB",
                           "stW MB", "recR MB", "recW MB", "commit", "io MB", "total MB", "GB/s", "%copy", "/decode",
                           "/cache-d");

                    /* Slots: all of them, in a shuffled order (rows land anywhere in the pool). */
                    for (int32_t i = 0; i < o.num_slots; i++) CHECK_GDN(gdn_slot_alloc(e, &all_slots[i]));
                    for (int32_t i = o.num_slots - 1; i > 0; i--) {
                        const int32_t j = (int32_t)((uint32_t)(gdn_bench_rng_next() >> 32) % (uint32_t)(i + 1)), t = all_slots[i];
                        all_slots[i] = all_slots[j], all_slots[j] = t;
                    }
                    if (gdn_bench_fill_inputs(e, rc)) return 1;
                    for (int j = 0; j < PATTERNS * max_b; j++) acc_host[j] = (int32_t)((uint32_t)(gdn_bench_rng_next() >> 32) % (uint32_t)(T + 1));
                    if (gpu)
                        CHECK_CUDA(cudaMemcpy(acc_dev, acc_host, sizeof(int32_t) * PATTERNS * (size_t)max_b,
                                              cudaMemcpyHostToDevice));

                    ctx c;
                    memset(&c, 0, sizeof c);
                    c.e = e, c.gpu = gpu, c.s = s, c.slots = all_slots, c.T = T, c.layers = o.layers;
                    c.L = L ? L : 1;
                    c.acc_host = acc_host, c.acc_dev = acc_dev, c.max_batch = max_b;
                    c.rows = malloc(sizeof(int32_t) * (size_t)max_b);
                    c.m.strategy = va->strategy, c.m.L = L, c.m.C = C, c.m.resolved = rc;
                    c.m.count = calloc((size_t)o.num_slots, sizeof(int32_t));
                    c.m.changed = calloc((size_t)max_b, 1);
                    c.m.state_b = state_b, c.m.rec_b = rec_b;
                    c.m.tok_b = ((double)HK * K + (double)HV * V + 2.0 * HV) * 2;
                    c.m.io_tok_b = ((2.0 * HK * K + HV * V + 2.0 * HV) + (double)HV * V) * 2; /* bf16 in, bf16 out */
                    if (o.check) {
                        CHECK_GDN(gdn_engine_state_pool(e, 0, &c.pool0));
                        c.slot_bytes = (size_t)state_b;
                        c.snap0 = malloc(c.slot_bytes * (size_t)max_b);
                        c.snap1 = malloc(c.slot_bytes * (size_t)max_b);
                        c.v_elems = (size_t)max_b * (size_t)T * (size_t)HV * (size_t)V;
                        c.fresh_v = malloc(2 * c.v_elems);
                    }
                    for (int bi = 0; bi < o.nbatch; bi++) {
                        c.B = o.batch[bi];
                        c.G = group_count(&o, c.B, (size_t)state_b, l2);
                        srow proto;
                        memset(&proto, 0, sizeof proto);
                        snprintf(proto.preset, sizeof proto.preset, "%s", o.presets[pi]);
                        proto.state = cfg.state_dtype, proto.T = T, proto.B = c.B, proto.G = c.G, proto.L = L;
                        proto.strategy = va->strategy;
                        if (run_batch(&c, &o, rows, &nrows, &proto)) return 3;
                        const srow *dec = &rows[nrows - 2], *ver = &rows[nrows - 1];
                        const srow *cd = find_row(rows, nrows, dec, GDN_VERIFY_CACHE, 0, 0);
                        print_row(dec, NULL, cd);
                        print_row(ver, dec, cd);
                        failures += dec->check_bad > 0 || ver->check_bad > 0;
                    }
                    free(c.rows), free(c.m.count), free(c.m.changed), free(c.snap0), free(c.snap1), free(c.fresh_v);
                    gdn_engine_destroy(e);
                }
            }

    if (timed && nrows) { /* summary: one line per (preset, state, T, B, strategy) */
        printf("\n# summary (us per layer step): decode, verify + commit, their ratio, both over the cache decode, memory "
               "beyond the pools\n%-10s %4s %2s %4s %-11s | %9s %9s | %8s %9s %9s | %8s\n",
               "preset", "st", "T", "B", "strategy", "decode", "verify", "ver/dec", "dec/cache", "ver/cache", "mem %");
        for (int i = 0; i + 1 < nrows; i += 2) {
            const srow *d = &rows[i], *v = &rows[i + 1];
            const srow *cd = find_row(rows, nrows, d, GDN_VERIFY_CACHE, 0, 0);
            double memp = NAN;
            for (int j = 0; j < nmem; j++)
                if (!strcmp(mem[j].preset, d->preset) && mem[j].state == d->state && mem[j].T == d->T &&
                    mem[j].strategy == d->strategy && mem[j].L == d->L)
                    memp = mem[j].beyond_pct;
            char lbl[24];
            if (d->strategy == GDN_VERIFY_RING) snprintf(lbl, sizeof lbl, "ring L=%d", d->L);
            else snprintf(lbl, sizeof lbl, "%s", sname(d->strategy));
            printf("%-10s %4s %2d %4d %-11s | %9.2f %9.2f | %8.3f ", d->preset, dname(d->state), d->T, d->B, lbl, d->us,
                   v->us, v->us / d->us);
            if (cd) printf("%9.3f %9.3f", d->us / cd->us, v->us / cd->us);
            else printf("%9s %9s", "-", "-");
            printf(" | %8.2f\n", memp);
        }
    }
    if (o.check) printf("# check: %d configuration(s) with pool writes the mirror did not predict\n", failures);
    if (o.json) write_json(&o, mem, nmem, rows, nrows, timed, device);
    free(rows), free(mem), free(all_slots), free(acc_host);
    if (acc_dev) cudaFree(acc_dev);
    if (s) cudaStreamDestroy(s);
    return failures ? 1 : 0;
}
