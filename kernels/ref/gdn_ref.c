/*
 * float64 reference of the GDN update (SPEC 1) and of the slot, padding, verify-cache and commit
 * semantics (SPEC 3). Written for clarity, not speed: loops read like the SPEC's formulas. Inputs are
 * widened to float64 once; the state is widened on load and rounded once to the state dtype at the
 * store (per token for the verify cache, once per call for the pool).
 */
#include "gdn_ref.h"

#include <math.h>
#include <string.h>

#include "../../engine/alloc.h"
#include "../dtype_convert.h"

double gdn__ref_softplus(double x) { return x <= 20.0 ? log1p(exp(x)) : x; }

double gdn__ref_log_decay(double a, double A_log, double dt_bias) { return -exp(A_log) * gdn__ref_softplus(a + dt_bias); }
double gdn__ref_decay(double a, double A_log, double dt_bias) { return exp(gdn__ref_log_decay(a, A_log, dt_bias)); }

/* 1 / sqrt(sum x^2 + 1e-6) over x[0..n), or 1 when the norm is off. */
static double norm_scale(const double *x, int32_t n, int use_l2norm)
{
    if (!use_l2norm) return 1.0;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += x[i] * x[i];
    return 1.0 / sqrt(sum + 1e-6);
}

/* x[0..n) scaled by factor / sqrt(sum x^2 + 1e-6), or by factor alone when the norm is off. */
static void normalise(const double *x, int32_t n, double factor, int use_l2norm, double *out)
{
    const double inv = norm_scale(x, n, use_l2norm);
    for (int32_t i = 0; i < n; i++) out[i] = factor * x[i] * inv;
}

void gdn__ref_head(int32_t T, int32_t K, int32_t V, double *S, const double *q, const double *k,
                   int64_t qk_token_stride, const double *v, int64_t v_token_stride, const double *a,
                   const double *b, double A_log, double dt_bias, double scale, int use_qk_l2norm,
                   double *out, int64_t out_token_stride, gdn__ref_token_hook after_token, void *user)
{
    gdn__ref_head_updates(T, K, V, S, q, k, qk_token_stride, v, v_token_stride, a, b, A_log, dt_bias, scale,
                          use_qk_l2norm, out, out_token_stride, after_token, user, NULL);
}

void gdn__ref_head_updates(int32_t T, int32_t K, int32_t V, double *S, const double *q, const double *k,
                           int64_t qk_token_stride, const double *v, int64_t v_token_stride, const double *a,
                           const double *b, double A_log, double dt_bias, double scale, int use_qk_l2norm,
                           double *out, int64_t out_token_stride, gdn__ref_token_hook after_token, void *user,
                           double *updates)
{
    double q_hat[256], k_hat[256];
    for (int32_t t = 0; t < T; t++) {
        const double g = gdn__ref_decay(a[t], A_log, dt_bias);
        const double beta = 1.0 / (1.0 + exp(-b[t]));
        normalise(k + t * qk_token_stride, K, 1.0, use_qk_l2norm, k_hat);
        normalise(q + t * qk_token_stride, K, scale, use_qk_l2norm, q_hat);
        const double *v_t = v + t * v_token_stride;
        double *o_t = out + t * out_token_stride;
        for (int32_t row = 0; row < V; row++) {
            double *S_row = S + (int64_t)row * K;
            double Sk = 0.0;
            for (int32_t c = 0; c < K; c++) {
                S_row[c] *= g;
                Sk += S_row[c] * k_hat[c];
            }
            const double u = beta * (v_t[row] - Sk);
            if (updates) updates[(int64_t)t * V + row] = u;
            double o = 0.0;
            for (int32_t c = 0; c < K; c++) {
                S_row[c] += u * k_hat[c];
                o += S_row[c] * q_hat[c];
            }
            o_t[row] = o;
        }
        if (after_token) after_token(user, t, S);
    }
}

/* Widens n elements of `dtype` starting at element `offset` of `base` into out. */
static void widen(const void *base, gdn_dtype dtype, int64_t offset, int64_t n, double *out)
{
    for (int64_t i = 0; i < n; i++) out[i] = gdn__load_f32(base, dtype, offset + i);
}

static void narrow(void *base, gdn_dtype dtype, int64_t offset, int64_t n, const double *in)
{
    for (int64_t i = 0; i < n; i++) gdn__store_f32(base, dtype, offset + i, (float)in[i]);
}

typedef struct cache_hook_ctx {
    const gdn__layer_params *p;
    int64_t row_head_offset; /* cache offset of (row i, token 0, head h) */
} cache_hook_ctx;

static void store_to_cache(void *user, int32_t t, const double *S)
{
    const cache_hook_ctx *ctx = user;
    const gdn__layer_params *p = ctx->p;
    const int64_t token_stride = (int64_t)p->HV * p->V * p->K;
    narrow(p->cache, p->state_dtype, ctx->row_head_offset + t * token_stride, (int64_t)p->V * p->K, S);
}

size_t gdn__ref_scratch_bytes(void)
{
    /* The state, q, k, v, o and (ring) u of up to GDN_MAX_TOKENS tokens, and room for one folded
     * token's k and v (fold) or one ring record's k^ and u (ring) past them, one head's z, and (token
     * trees) the state the row's own tokens start from. */
    const size_t max_dim = 256;
    return sizeof(double) * (2 * max_dim * max_dim + 5 * GDN_MAX_TOKENS * max_dim + 3 * max_dim);
}

gdn_status gdn__ref_layer_step(const gdn__layer_params *p)
{
    void *scratch = gdn__malloc(gdn__ref_scratch_bytes());
    if (!scratch) return GDN_ENOMEM;
    gdn__ref_layer_step_in(p, scratch);
    gdn__free(scratch);
    return GDN_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The mixer's conv state and gated norm (SPEC 6)                                                   */
/* ---------------------------------------------------------------------------------------------- */

static int conv_on(const gdn__layer_params *p) { return p->mixer.conv_width > 0; }

/* Element (row j, channel c) of slot s's window. */
static int64_t window_at(const gdn__mixer_params *m, int64_t s, int32_t j, int32_t c)
{
    return s * m->conv_slot_stride + (int64_t)j * m->conv_token_stride + (int64_t)c * m->conv_channel_stride;
}

/* The resolved window strides: both 0 means dense [W - 1][conv_dim]. */
static gdn__mixer_params mixer_resolved(const gdn__mixer_params *in)
{
    gdn__mixer_params m = *in;
    gdn__conv_window_strides(in->conv_token_stride, in->conv_channel_stride, in->conv_dim, &m.conv_token_stride,
                             &m.conv_channel_stride);
    return m;
}

static void load_window(const gdn__layer_params *p, const gdn__mixer_params *m, int64_t s, double *win)
{
    for (int32_t j = 0; j + 1 < m->conv_width; j++)
        for (int32_t c = 0; c < m->conv_dim; c++)
            win[(int64_t)j * m->conv_dim + c] = gdn__load_f32(m->conv_state, p->input_dtype, window_at(m, s, j, c));
}

static void store_window(const gdn__layer_params *p, const gdn__mixer_params *m, int64_t s, const double *win)
{
    for (int32_t j = 0; j + 1 < m->conv_width; j++)
        for (int32_t c = 0; c < m->conv_dim; c++)
            gdn__store_f32(m->conv_state, p->input_dtype, window_at(m, s, j, c), (float)win[(int64_t)j * m->conv_dim + c]);
}

/* One token through the conv: out = SiLU(sum_j w[c, j] [win; x]_j + bias), then the window moves
 * on by x. win [W - 1][C], x [C] raw inputs (exact in double), out [C]. */
static void conv_token(const gdn__mixer_params *m, double *win, const double *x, double *out)
{
    const int32_t W = m->conv_width, C = m->conv_dim;
    for (int32_t c = 0; c < C; c++) {
        double acc = m->conv_bias ? gdn__load_f32(m->conv_bias, m->conv_weight_dtype, c) : 0.0;
        for (int32_t j = 0; j < W; j++) {
            const double in = j + 1 < W ? win[(int64_t)j * C + c] : x[c];
            acc += (double)gdn__load_f32(m->conv_weight, m->conv_weight_dtype, (int64_t)c * W + j) * in;
        }
        out[c] = acc / (1.0 + exp(-acc));
    }
    for (int32_t j = 0; j + 2 < W; j++) memcpy(win + (int64_t)j * C, win + (int64_t)(j + 1) * C, sizeof(double) * (size_t)C);
    if (W > 1) memcpy(win + (int64_t)(W - 2) * C, x, sizeof(double) * (size_t)C);
}

/* y = o rsqrt(mean(o^2) + eps) norm_weight z sigmoid(z) over one head's V values, in place. */
static void gated_norm(const gdn__mixer_params *m, int32_t V, double *o, const double *z)
{
    double sum = 0.0;
    for (int32_t c = 0; c < V; c++) sum += o[c] * o[c];
    const double scale = 1.0 / sqrt(sum / V + (m->norm_eps > 0.0f ? m->norm_eps : 1e-6));
    for (int32_t c = 0; c < V; c++) o[c] = o[c] * scale * m->norm_weight[c] * z[c] / (1.0 + exp(-z[c]));
}

/* Scratch of the mixer's row preparation past the base scratch: the window and every token's conv
 * output (folded or recorded ones, then the step's own), one raw input, and (token trees) a window
 * and a conv output for the walk along a token's path. */
size_t gdn__ref_mixer_scratch_bytes(int32_t conv_dim, int32_t conv_width, int32_t tokens)
{
    return sizeof(double) * ((size_t)(conv_width > 1 ? conv_width - 1 : 0) * (size_t)conv_dim * 3 +
                             (size_t)tokens * (size_t)conv_dim + 2 * (size_t)conv_dim);
}

/* ---------------------------------------------------------------------------------------------- */
/* Per-row token counts and token trees (SPEC 3)                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* A live row's own tokens: how many run, and which of them are live (t < n, every parent on the
 * path in -1..t-1); with a tree each one's parent. */
typedef struct row_tokens {
    int bad;                            /* the row's count is outside 1..T: the row is padding */
    int32_t n;                          /* tokens run: token_counts[i], or T */
    int tree;                           /* parents given */
    int all_live;                       /* every token t < n is live */
    int32_t parent[GDN_MAX_TOKENS];     /* checked: -1..t-1 where live */
    unsigned char live[GDN_MAX_TOKENS];
} row_tokens;

static row_tokens plan_row_tokens(const gdn__layer_params *p, int32_t i)
{
    row_tokens rt;
    memset(&rt, 0, sizeof rt);
    rt.n = p->T;
    rt.all_live = 1;
    if (p->T <= 0) return rt; /* a write-back runs no tokens of its own */
    const gdn__row_plan plan = gdn__plan_row(p->token_counts, p->parents, p->T, i, rt.parent);
    if (plan.bad && p->error_flag) *p->error_flag = 1;
    if (plan.n == 0) {
        rt.bad = 1, rt.n = 0;
        return rt;
    }
    rt.n = plan.n;
    rt.tree = p->parents != NULL;
    for (int32_t t = 0; t < rt.n; t++) rt.live[t] = (plan.live >> t) & 1u;
    rt.all_live = plan.live == (1u << rt.n) - 1u;
    return rt;
}

/* ---------------------------------------------------------------------------------------------- */
/* Stored tokens (fold) and ring records                                                            */
/* ---------------------------------------------------------------------------------------------- */

static int64_t stored_token_elems(const gdn__layer_params *p)
{
    return conv_on(p) ? gdn__mixer_token_elems(p->mixer.conv_dim, p->HV) : gdn__token_elems(p->HK, p->HV, p->K, p->V);
}
/* Where a stored token's a gates start (b follow HV later). */
static int64_t stored_gates_at(const gdn__layer_params *p)
{
    return conv_on(p) ? p->mixer.conv_dim : gdn__token_gates_offset(p->HK, p->HV, p->K, p->V);
}

/* Fold strategy: widens stored token t of `slot` for value head h (key head kh); with the conv only
 * its gates (k and v come from the row's conv outputs). */
static void load_stored_token(const gdn__layer_params *p, int64_t slot, int32_t t, int32_t h, int32_t kh, double *k,
                              double *v, double *a, double *b)
{
    const int64_t base = (slot * p->store_tokens + t) * stored_token_elems(p);
    const int64_t gates_at = base + stored_gates_at(p);
    if (!conv_on(p)) {
        widen(p->token_store, p->input_dtype, base + (int64_t)kh * p->K, p->K, k);
        widen(p->token_store, p->input_dtype, base + gdn__token_v_offset(p->HK, p->K) + (int64_t)h * p->V, p->V, v);
    }
    *a = gdn__load_f32(p->token_store, p->input_dtype, gates_at + h);
    *b = gdn__load_f32(p->token_store, p->input_dtype, gates_at + p->HV + h);
}

/* Row i's raw x of token t (conv), widened. */
static void load_x(const gdn__layer_params *p, int32_t i, int32_t t, double *x)
{
    widen(p->mixer.x, p->input_dtype, i * p->mixer.x_strides.row + t * p->mixer.x_strides.token, p->mixer.conv_dim, x);
}

/* Copies row i's raw x of token t (conv_dim elements) to dst. */
static void copy_x(const gdn__layer_params *p, int32_t i, int32_t t, char *dst)
{
    const size_t esize = gdn_dtype_size(p->input_dtype);
    memcpy(dst, (const char *)p->mixer.x + (size_t)(i * p->mixer.x_strides.row + t * p->mixer.x_strides.token) * esize,
           (size_t)p->mixer.conv_dim * esize);
}

/* Fold strategy: copies row i's live tokens (k, v, a, b as given; with the conv raw x, a, b) into
 * `slot`'s stored tokens at their positions. */
static void store_row_tokens(const gdn__layer_params *p, int32_t i, int64_t slot, const row_tokens *rt)
{
    const size_t esize = gdn_dtype_size(p->input_dtype);
    const int64_t token = stored_token_elems(p), gates = stored_gates_at(p);
    const int64_t v_at = gdn__token_v_offset(p->HK, p->K);
    for (int32_t t = 0; t < rt->n; t++) {
        if (!rt->live[t]) continue;
        char *dst = (char *)p->token_store + (size_t)((slot * p->store_tokens + t) * token) * esize;
        if (conv_on(p)) {
            copy_x(p, i, t, dst);
        } else {
            for (int32_t kh = 0; kh < p->HK; kh++)
                memcpy(dst + (size_t)kh * p->K * esize,
                       (const char *)p->k + gdn__at(p->k_strides, i, t, kh) * (int64_t)esize, (size_t)p->K * esize);
            for (int32_t h = 0; h < p->HV; h++)
                memcpy(dst + (size_t)(v_at + (int64_t)h * p->V) * esize,
                       (const char *)p->v + gdn__at(p->v_strides, i, t, h) * (int64_t)esize, (size_t)p->V * esize);
        }
        for (int32_t h = 0; h < p->HV; h++) {
            memcpy(dst + (size_t)(gates + h) * esize, (const char *)p->a + gdn__at(p->a_strides, i, t, h) * (int64_t)esize,
                   esize);
            memcpy(dst + (size_t)(gates + p->HV + h) * esize,
                   (const char *)p->b + gdn__at(p->b_strides, i, t, h) * (int64_t)esize, esize);
        }
    }
}

/* Ring strategy: record layout (with the conv: raw x and a instead of k and its norm scales and log
 * decays). */
static int64_t record_bytes(const gdn__layer_params *p)
{
    return conv_on(p) ? gdn__mixer_record_bytes(p->mixer.conv_dim, p->HV, p->V) : gdn__ring_record_bytes(p->HK, p->HV, p->K, p->V);
}
static int64_t record_u_offset(const gdn__layer_params *p)
{
    return conv_on(p) ? gdn__mixer_record_u_offset(p->mixer.conv_dim, p->HV) : gdn__ring_u_offset(p->HK, p->HV, p->K);
}

/* Ring strategy: the bytes of record j of `slot`. */
static char *ring_record(const gdn__layer_params *p, int64_t slot, int32_t j)
{
    return (char *)p->ring + (size_t)((slot * p->ring_capacity + j) * record_bytes(p));
}

/* Ring strategy: applies record j of `slot` to value head h's state S [V, K]: S = g S + u k^T. k_raw:
 * the record's k before the norm, the conv's output (its record holds raw x and a), or NULL: the
 * record's k, normalised and decayed by the scale and log decay it holds. */
static void apply_ring_record(const gdn__layer_params *p, int64_t slot, int32_t j, int32_t h, int32_t kh,
                              const double *k_raw, double *S, double *k_hat, double *u)
{
    const char *rec = ring_record(p, slot, j);
    double g;
    if (k_raw) {
        normalise(k_raw, p->K, 1.0, p->use_qk_l2norm, k_hat);
        g = gdn__ref_decay(gdn__load_f32(rec + gdn__mixer_record_a_offset(p->mixer.conv_dim), p->input_dtype, h), p->A_log[h],
                           p->dt_bias[h]);
    } else {
        double pair[2]; /* the head's {norm scale, log decay} */
        widen(rec + gdn__ring_norm_decay_offset(p->HK, p->K), GDN_DTYPE_F32, 2 * (int64_t)h, 2, pair);
        widen(rec, p->input_dtype, (int64_t)kh * p->K, p->K, k_hat);
        for (int32_t c = 0; c < p->K; c++) k_hat[c] *= pair[0];
        g = exp(pair[1]);
    }
    widen(rec + record_u_offset(p), GDN_DTYPE_F32, (int64_t)h * p->V, p->V, u);
    for (int32_t row = 0; row < p->V; row++)
        for (int32_t c = 0; c < p->K; c++) S[(int64_t)row * p->K + c] = g * S[(int64_t)row * p->K + c] + u[row] * k_hat[c];
}

/* Ring strategy: records base..base+n-1 of `slot` get row i's live tokens, token t in record base + t:
 * its k as given and each value head's {norm scale of its key head's k, log decay} (fp32), or with
 * the conv its raw x and a as given. k_scratch: K doubles. */
static void store_ring_inputs(const gdn__layer_params *p, int32_t i, int64_t slot, int32_t base, const row_tokens *rt,
                              double *k_scratch)
{
    const size_t esize = gdn_dtype_size(p->input_dtype);
    const int32_t per_key = p->HV / p->HK;
    for (int32_t t = 0; t < rt->n; t++) {
        if (!rt->live[t]) continue;
        char *rec = ring_record(p, slot, base + t);
        if (conv_on(p)) {
            copy_x(p, i, t, rec);
            for (int32_t h = 0; h < p->HV; h++)
                memcpy(rec + gdn__mixer_record_a_offset(p->mixer.conv_dim) + (size_t)h * esize,
                       (const char *)p->a + gdn__at(p->a_strides, i, t, h) * (int64_t)esize, esize);
            continue;
        }
        for (int32_t kh = 0; kh < p->HK; kh++) {
            memcpy(rec + (size_t)kh * p->K * esize, (const char *)p->k + gdn__at(p->k_strides, i, t, kh) * (int64_t)esize,
                   (size_t)p->K * esize);
            widen(p->k, p->input_dtype, gdn__at(p->k_strides, i, t, kh), p->K, k_scratch);
            const double scale = norm_scale(k_scratch, p->K, p->use_qk_l2norm);
            for (int32_t h = kh * per_key; h < (kh + 1) * per_key; h++) {
                const double a = gdn__load_f32(p->a, p->input_dtype, gdn__at(p->a_strides, i, t, h));
                const double pair[2] = {scale, gdn__ref_log_decay(a, p->A_log[h], p->dt_bias[h])};
                narrow(rec + gdn__ring_norm_decay_offset(p->HK, p->K), GDN_DTYPE_F32, 2 * (int64_t)h, 2, pair);
            }
        }
    }
}

/* What the ring strategy does with row (r, w) holding h records, as gdn_kernel_params.h states it. */
typedef struct ring_plan {
    int32_t h;     /* records folded from slot r */
    int flush;     /* the pool of w gets a state */
    int32_t base;  /* first record the step's tokens take in slot w (when they are kept) */
    int keep;      /* the step's tokens become records */
} ring_plan;

/* A verify writes back when the step's T records do not fit: T, not the row's count, as in the CUDA
 * kernel, which reserves a record for every token; both backends then round a bf16 state at the
 * same steps. */
static ring_plan plan_ring_row(const gdn__layer_params *p, int64_t r, int64_t w)
{
    ring_plan plan;
    int32_t h = p->ring_count[r];
    plan.h = h < 0 ? 0 : (h > p->ring_capacity ? p->ring_capacity : h);
    if (p->T == 0) plan.flush = plan.h > 0, plan.keep = 0;
    else if (!p->deferred_verify) plan.flush = r != w || plan.h + 1 >= p->ring_length, plan.keep = !plan.flush;
    else plan.flush = r != w || plan.h + p->T > p->ring_capacity, plan.keep = 1;
    plan.base = plan.flush ? 0 : plan.h;
    return plan;
}

/* The row's conv outputs (conv on): the tokens that reach the state before the step's own (fold:
 * the read slot's pending tokens; ring: its records), then the step's live tokens, each [conv_dim]
 * post-SiLU, in `out` (own token t at first + t); `win_before_own` receives the window after the
 * first group, `win` after the own tokens (a tree: after the last live token's path). With a tree,
 * token t's conv runs over the window along its own path, walked in `path_win`. */
typedef struct row_conv {
    double *out;
    double *win, *win_before_own;
    double *path_win, *discard; /* token trees */
    int32_t first; /* tokens before the step's own */
} row_conv;

static void prepare_row_conv(const gdn__layer_params *p, const gdn__mixer_params *m, int32_t i, int64_t r,
                             int32_t first, const row_tokens *rt, row_conv *rc)
{
    const int32_t C = m->conv_dim;
    const int64_t window_elems = (int64_t)(m->conv_width - 1) * C;
    rc->first = first;
    load_window(p, m, r, rc->win);
    double *x = rc->out + (int64_t)(first + p->T) * C; /* one token's raw input, past the outputs */
    for (int32_t j = 0; j < first; j++) {
        if (p->token_store)
            widen(p->token_store, p->input_dtype, (r * p->store_tokens + j) * stored_token_elems(p), C, x);
        else
            widen(ring_record(p, r, j), p->input_dtype, 0, C, x);
        conv_token(m, rc->win, x, rc->out + (int64_t)j * C);
    }
    memcpy(rc->win_before_own, rc->win, sizeof(double) * (size_t)window_elems);
    if (!rt->tree) {
        for (int32_t t = 0; t < rt->n; t++) {
            load_x(p, i, t, x);
            conv_token(m, rc->win, x, rc->out + (int64_t)(first + t) * C);
        }
        return;
    }
    rc->path_win = x + C, rc->discard = rc->path_win + window_elems;
    for (int32_t t = 0; t < rt->n; t++) {
        if (!rt->live[t]) continue;
        int32_t path[GDN_MAX_TOKENS];
        const int32_t len = gdn__tree_path(rt->parent, rt->n, t, path);
        memcpy(rc->path_win, rc->win_before_own, sizeof(double) * (size_t)window_elems);
        for (int32_t j = 0; j < len; j++) {
            load_x(p, i, path[j], x);
            conv_token(m, rc->path_win, x, j + 1 == len ? rc->out + (int64_t)(first + t) * C : rc->discard);
        }
        memcpy(rc->win, rc->path_win, sizeof(double) * (size_t)window_elems);
    }
}

/* Runs the row's own tokens for value head h from S (fold, ring: after the slot's pending work):
 * a chain runs tokens 0..n-1 in order; a tree runs each live token from the state after its parent
 * (replaying its path from the row's starting state, kept in S0), S ending after the last live one.
 * Outputs o [n, V], corrections u [n, V] (when not NULL) and cache entries (p->cache) per live token. */
static void run_own_tokens(const gdn__layer_params *p, const row_tokens *rt, int32_t h, double *S, double *S0,
                           const double *tq, const double *tk, int64_t qk_stride, const double *tv, int64_t v_stride,
                           const double *a, const double *b, double *o, double *u, cache_hook_ctx *ctx)
{
    const int32_t K = p->K, V = p->V;
    const gdn__ref_token_hook hook = p->cache ? store_to_cache : NULL;
    if (!rt->tree) { /* the chain: nothing reads parents */
        gdn__ref_head_updates(rt->n, K, V, S, tq, tk, qk_stride, tv, v_stride, a, b, p->A_log[h], p->dt_bias[h], p->scale,
                              p->use_qk_l2norm, o, V, hook, ctx, u);
        return;
    }
    const size_t bytes = sizeof(double) * (size_t)V * K;
    double discard[256];
    memcpy(S0, S, bytes);
    for (int32_t t = 0; t < rt->n; t++) {
        if (!rt->live[t]) continue;
        int32_t path[GDN_MAX_TOKENS];
        const int32_t len = gdn__tree_path(rt->parent, rt->n, t, path);
        memcpy(S, S0, bytes);
        for (int32_t m = 0; m < len; m++) {
            const int32_t j = path[m];
            const int last = m + 1 == len;
            gdn__ref_head_updates(1, K, V, S, tq + j * qk_stride, tk + j * qk_stride, qk_stride, tv + j * v_stride, v_stride,
                                  a + j, b + j, p->A_log[h], p->dt_bias[h], p->scale, p->use_qk_l2norm,
                                  last ? o + (int64_t)t * V : discard, V, NULL, NULL, last && u ? u + (int64_t)t * V : NULL);
        }
        if (hook) hook(ctx, t, S);
    }
}

/* The output of head h for T tokens of row i, through the gated norm when it is on; padding tokens
 * (past n, or not live) output zeros. */
static void store_outputs(const gdn__layer_params *p, int32_t i, int32_t h, double *o, double *z_scratch,
                          const row_tokens *rt)
{
    const int64_t out_row = gdn__at(p->out_strides, i, 0, h), v_token = p->out_strides.token;
    for (int32_t t = 0; t < p->T; t++) {
        double *ot = o + (int64_t)t * p->V;
        if (t >= rt->n || !rt->live[t]) {
            for (int32_t c = 0; c < p->V; c++) gdn__store_f32(p->out, p->output_dtype, out_row + (int64_t)t * v_token + c, 0.0f);
            continue;
        }
        if (p->mixer.norm_weight) {
            widen(p->mixer.z, p->input_dtype, gdn__at(p->mixer.z_strides, i, t, h), p->V, z_scratch);
            gated_norm(&p->mixer, p->V, ot, z_scratch);
        }
        for (int32_t c = 0; c < p->V; c++) gdn__store_f32(p->out, p->output_dtype, out_row + (int64_t)t * v_token + c, (float)ot[c]);
    }
}

void gdn__ref_layer_step_in(const gdn__layer_params *params, void *scratch)
{
    gdn__layer_params resolved = gdn__layer_params_resolved(params);
    resolved.mixer = mixer_resolved(&params->mixer);
    if (resolved.mixer.norm_weight && resolved.mixer.z_strides.row == 0 && resolved.mixer.z_strides.token == 0 &&
        resolved.mixer.z_strides.head == 0)
        resolved.mixer.z_strides = gdn__dense(resolved.T, resolved.HV, resolved.V);
    if (conv_on(&resolved) && resolved.mixer.x_strides.row == 0 && resolved.mixer.x_strides.token == 0)
        resolved.mixer.x_strides = gdn__dense(resolved.T, 1, resolved.mixer.conv_dim);
    const gdn__layer_params *p = &resolved;
    const gdn__mixer_params *m = &p->mixer;
    const int conv = conv_on(p);
    const int32_t T = p->T, HK = p->HK, HV = p->HV, K = p->K, V = p->V, C = m->conv_dim;
    const int32_t heads_per_key = HV / HK;
    const int64_t state_elems = (int64_t)V * K;
    double *S = scratch;
    double *q = S + state_elems;
    double *k = q + (int64_t)T * K;
    double *v = k + (int64_t)T * K;
    double *o = v + (int64_t)T * V;
    double *u = o + (int64_t)GDN_MAX_TOKENS * V; /* ring: the tokens' corrections [T, V] */
    double *record_k = u + (int64_t)GDN_MAX_TOKENS * V, *record_u = record_k + 256;
    double *zbuf = record_u + 256; /* the norm's z of one head (room in the base scratch: see its size) */
    double *S0 = zbuf + 256;       /* token trees: the state the row's own tokens start from */
    double a[GDN_MAX_TOKENS], b[GDN_MAX_TOKENS];
    row_conv rc = {0};
    if (conv) { /* past the base scratch */
        const int64_t window_elems = (int64_t)(m->conv_width - 1) * C;
        rc.win = (double *)((char *)scratch + gdn__ref_scratch_bytes());
        rc.win_before_own = rc.win + window_elems;
        rc.out = rc.win_before_own + window_elems;
    }

    for (int32_t i = 0; i < p->B; i++) {
        const int64_t r = p->read_slots[i];
        const int64_t w = p->write_slots ? p->write_slots[i] : r;
        const int out_of_range = gdn__row_slots_invalid(r, w, p->num_slots);
        if (out_of_range && p->error_flag) *p->error_flag = 1;
        const int verify = p->cache || p->deferred_verify;
        row_tokens rt = {.n = T, .all_live = 1};
        if (r >= 0 && !out_of_range && (p->token_counts || p->parents)) rt = plan_row_tokens(p, i);
        else memset(rt.live, 1, sizeof rt.live);
        /* a bad count, or a step that writes its state (a decode) with a padding token: padding row */
        const int padding = r < 0 || out_of_range || rt.bad || (!verify && !rt.all_live);
        const ring_plan plan = p->ring && !padding ? plan_ring_row(p, r, w) : (ring_plan){0, 0, 0, 0};
        int32_t folded = 0; /* fold: the read slot's pending tokens */
        if (p->token_store && !padding) {
            folded = p->pending[r];
            folded = folded < 0 ? 0 : (folded > p->store_tokens ? p->store_tokens : folded);
        }
        if (conv && !padding) prepare_row_conv(p, m, i, r, p->ring ? plan.h : folded, &rt, &rc);
        for (int32_t h = 0; h < HV; h++) {
            const int64_t out_row = gdn__at(p->out_strides, i, 0, h), v_token = p->out_strides.token;
            if (padding) {
                for (int32_t t = 0; t < T; t++)
                    for (int32_t c = 0; c < V; c++)
                        gdn__store_f32(p->out, p->output_dtype, out_row + (int64_t)t * v_token + c, 0.0f);
                continue;
            }
            const int32_t kh = h / heads_per_key;
            /* The step's own tokens: q, k with token stride qk_stride, v with v_stride. */
            const double *tq = q, *tk = k, *tv = v;
            int64_t qk_stride = K, v_stride = V;
            if (conv) {
                const double *own = rc.out + (int64_t)rc.first * C;
                tq = own + (int64_t)kh * K, tk = own + (int64_t)HK * K + (int64_t)kh * K;
                tv = own + 2 * (int64_t)HK * K + (int64_t)h * V;
                qk_stride = v_stride = C;
            }
            for (int32_t t = 0; t < T; t++) {
                if (!conv) {
                    widen(p->q, p->input_dtype, gdn__at(p->q_strides, i, t, kh), K, q + (int64_t)t * K);
                    widen(p->k, p->input_dtype, gdn__at(p->k_strides, i, t, kh), K, k + (int64_t)t * K);
                    widen(p->v, p->input_dtype, gdn__at(p->v_strides, i, t, h), V, v + (int64_t)t * V);
                }
                a[t] = gdn__load_f32(p->a, p->input_dtype, gdn__at(p->a_strides, i, t, h));
                b[t] = gdn__load_f32(p->b, p->input_dtype, gdn__at(p->b_strides, i, t, h));
            }
            widen(p->state, p->state_dtype, r * p->slot_stride + h * state_elems, state_elems, S);
            if (p->ring) { /* ring: S_h, then the tokens (their corrections kept as records) */
                for (int32_t j = 0; j < plan.h; j++)
                    apply_ring_record(p, r, j, h, kh, conv ? rc.out + (int64_t)j * C + (int64_t)HK * K + (int64_t)kh * K : NULL,
                                      S, record_k, record_u);
                const int flush_first = plan.flush && (p->T == 0 || p->deferred_verify);
                if (flush_first) narrow(p->state, p->state_dtype, w * p->slot_stride + h * state_elems, state_elems, S);
                if (T == 0) continue;
                run_own_tokens(p, &rt, h, S, S0, tq, tk, qk_stride, tv, v_stride, a, b, o, u, NULL);
                store_outputs(p, i, h, o, zbuf, &rt);
                if (plan.flush && !flush_first) /* a decode that writes its state back */
                    narrow(p->state, p->state_dtype, w * p->slot_stride + h * state_elems, state_elems, S);
                if (plan.keep)
                    for (int32_t t = 0; t < rt.n; t++)
                        if (rt.live[t])
                            narrow(ring_record(p, w, plan.base + t) + record_u_offset(p), GDN_DTYPE_F32, (int64_t)h * V, V,
                                   u + (int64_t)t * V);
                continue;
            }
            if (p->token_store) { /* fold: fold the slot's accepted tokens first (their outputs unused) */
                /* o is free until the own tokens run; the scratch has room past it for k and v. */
                double fa[GDN_MAX_TOKENS], fb[GDN_MAX_TOKENS], *fk = o, *fv = o + K;
                double fo[256];
                for (int32_t t = 0; t < folded; t++) {
                    load_stored_token(p, r, t, h, kh, fk, fv, &fa[t], &fb[t]);
                    const double *ck = fk, *cv = fv;
                    if (conv) {
                        const double *c = rc.out + (int64_t)t * C;
                        ck = c + (int64_t)HK * K + (int64_t)kh * K, cv = c + 2 * (int64_t)HK * K + (int64_t)h * V;
                    }
                    gdn__ref_head(1, K, V, S, ck, ck, K, cv, V, &fa[t], &fb[t], p->A_log[h], p->dt_bias[h], p->scale,
                                  p->use_qk_l2norm, fo, V, NULL, NULL);
                }
                if (p->deferred_verify || T == 0)
                    narrow(p->state, p->state_dtype, w * p->slot_stride + h * state_elems, state_elems, S);
                if (T == 0) continue;
            }
            cache_hook_ctx ctx = {p, (int64_t)i * p->cache_row_stride + h * state_elems};
            run_own_tokens(p, &rt, h, S, S0, tq, tk, qk_stride, tv, v_stride, a, b, o, NULL, &ctx);
            store_outputs(p, i, h, o, zbuf, &rt);
            if (!p->cache && !(p->token_store && p->deferred_verify))
                narrow(p->state, p->state_dtype, w * p->slot_stride + h * state_elems, state_elems, S);
        }
        if (padding) continue;
        if (conv) { /* the row's window, as its state went */
            const double *keep = NULL;
            if (p->ring)
                keep = !plan.flush ? NULL : (p->T == 0 || p->deferred_verify) ? rc.win_before_own : rc.win;
            else if (p->token_store)
                keep = p->deferred_verify || T == 0 ? rc.win_before_own : rc.win;
            else if (!p->cache)
                keep = rc.win; /* a decode */
            if (keep) store_window(p, m, w, keep);
            if (p->cache && m->x_store) /* a cache verify: the commit advances the window by these */
                for (int32_t t = 0; t < rt.n; t++)
                    if (rt.live[t])
                        copy_x(p, i, t, (char *)m->x_store + (size_t)(((int64_t)i * m->x_store_tokens + t) * C) *
                                                             gdn_dtype_size(p->input_dtype));
        }
        if (p->token_store) { /* the row's bookkeeping, once every head has folded */
            if (p->deferred_verify) store_row_tokens(p, i, w, &rt);
            p->pending[w] = 0;
        }
        if (p->ring) { /* the row's bookkeeping, once every head has read slot r's records */
            if (plan.keep) store_ring_inputs(p, i, w, plan.base, &rt, record_k);
            p->ring_count[w] = p->deferred_verify ? plan.base : (plan.keep ? plan.h + 1 : 0);
        }
    }
}

/* Cache strategy with the conv: in every layer, the window of w becomes the last W - 1 rows of
 * [window of r; row i's stored x of the accepted path, path[0..n) (NULL: tokens 0..n-1)]. */
static void advance_windows(const gdn__commit_params *p, int32_t i, int64_t r, int64_t w, const int32_t *path, int32_t n)
{
    const int32_t rows = p->conv_width - 1, C = p->conv_dim;
    int64_t token, channel;
    gdn__conv_window_strides(p->conv_token_stride, p->conv_channel_stride, C, &token, &channel);
    for (int32_t l = 0; l < p->num_layers; l++) {
        const int64_t state_at = l * p->conv_layer_stride, x_at = l * p->x_store_layer_stride + (int64_t)i * p->x_store_tokens * C;
        for (int32_t c = 0; c < C; c++) {
            float seq[GDN_MAX_TOKENS + GDN__MAX_CONV_WIDTH - 1]; /* [window of r; x_0..x_{n-1}] of channel c */
            for (int32_t j = 0; j < rows; j++)
                seq[j] = gdn__load_f32(p->conv_state, p->input_dtype, state_at + r * p->conv_slot_stride + j * token + c * channel);
            for (int32_t t = 0; t < n; t++)
                seq[rows + t] = gdn__load_f32(p->x_store, p->input_dtype, x_at + (int64_t)(path ? path[t] : t) * C + c);
            for (int32_t j = 0; j < rows; j++)
                gdn__store_f32(p->conv_state, p->input_dtype, state_at + w * p->conv_slot_stride + j * token + c * channel,
                               seq[n + j]);
        }
    }
}

/* Fold, ring with a tree: in layer l, slot w's entries base + path[j] move to base + j (base 0 for
 * the fold, the ring's count where the verify left it), in path order: path[j] >= j, so no copy
 * overwrites an entry still to be read. 0 when the base leaves the path outside the slot's entries
 * (a corrupted count), before anything moves; each layer decides alone (as the CUDA commit, whose
 * layers run in parallel). */
static int compact_layer_entries(const gdn__commit_params *p, int32_t l, int64_t w, const int32_t *path, int32_t n)
{
    if (n == 0) return 1;
    const int32_t base = p->ring_count ? p->ring_count[(int64_t)l * p->counts_layer_stride + w] : 0;
    if (base < 0 || base > p->entries_per_slot - 1 - path[n - 1]) return 0;
    char *slot = (char *)p->entries + (size_t)(l * p->entries_layer_bytes + w * p->entry_slot_bytes);
    for (int32_t j = 0; j < n; j++)
        if (path[j] != j)
            memcpy(slot + (size_t)((base + j) * p->entry_bytes), slot + (size_t)((base + path[j]) * p->entry_bytes),
                   (size_t)p->entry_bytes);
    return 1;
}

void gdn__ref_commit(const gdn__commit_params *p)
{
    const size_t elem = gdn_dtype_size(p->state_dtype);
    const int64_t slot_elems = (int64_t)p->HV * p->V * p->K;
    for (int32_t i = 0; i < p->B; i++) {
        const int64_t r = p->read_slots[i];
        if (r < 0) continue;
        const int64_t w = p->write_slots ? p->write_slots[i] : r;
        if (gdn__row_slots_invalid(r, w, p->num_slots)) {
            if (p->error_flag) *p->error_flag = 1;
            continue;
        }
        int32_t path[GDN_MAX_TOKENS];
        int flag = 0;
        const int32_t n = gdn__commit_path(p, i, path, &flag); /* -1: nothing to commit */
        if (flag && p->error_flag) *p->error_flag = 1;
        if (n < 0) continue;
        if (p->ring_count || p->pending) { /* ring: the verify left each count at its records' base; fold:
                                              * the next kernel that touches the slot folds them */
            for (int32_t l = 0; l < p->num_layers; l++) {
                if (p->parents && !compact_layer_entries(p, l, w, path, n)) {
                    if (p->error_flag) *p->error_flag = 1;
                    continue;
                }
                int32_t *count = (p->ring_count ? p->ring_count : p->pending) + (int64_t)l * p->counts_layer_stride + w;
                *count = p->ring_count ? *count + n : n;
            }
            continue;
        }
        if (n == 0) continue;
        if (p->conv_width > 0 && p->x_store) advance_windows(p, i, r, w, p->parents ? path : NULL, n);
        for (int32_t l = 0; l < p->num_layers; l++) {
            char *dst = (char *)p->state + (size_t)(l * p->state_layer_stride + w * p->slot_stride) * elem;
            const char *src = (const char *)p->cache +
                              (size_t)(l * p->cache_layer_stride + i * p->cache_row_stride +
                                       (int64_t)(p->parents ? path[n - 1] : n - 1) * slot_elems) * elem;
            memcpy(dst, src, (size_t)slot_elems * elem);
        }
    }
}

void gdn__ref_slot_copy(const gdn__slot_copy_params *p)
{
    if (p->set_at) *p->set_at = p->set_value;
    for (int32_t r = 0; r < p->regions; r++) {
        const gdn__slot_region *g = &p->region[r];
        for (int32_t l = 0; l < p->layers; l++) {
            char *dst = (char *)g->dst + (size_t)(l * g->dst_layer_stride);
            if (g->src) memcpy(dst, (const char *)g->src + (size_t)(l * g->src_layer_stride), (size_t)g->bytes);
            else memset(dst, 0, (size_t)g->bytes);
        }
    }
}
