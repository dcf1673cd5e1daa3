/*
 * gdn-engine: the decode step of Gated Delta Net (GDN) linear-attention layers.
 *
 * The engine owns, per layer, a pool of recurrent states [num_slots, HV, V, K] (K contiguous), static
 * input and output buffers, and the cache that speculative verify needs. A serving loop allocates one
 * slot per live request, then each step: picks the rows (slots) of the step, writes q, k, v, a, b into
 * the layer input buffers, runs the layers, reads the outputs, and after a verify step commits the
 * accepted token counts that its sampler wrote to device memory. ../shared/SPEC.md (the project's
 * contract) gives the math and the semantics.
 *
 * Memory spaces. "Backend memory" is device memory on the CUDA backend and ordinary host memory on
 * the CPU backend; every buffer the engine hands out lives there and stays valid (same address) until
 * gdn_engine_destroy. "Host" pointers are read before the call returns and never kept.
 *
 * Streams. Functions that enqueue work take `void *stream`: a cudaStream_t on the CUDA backend (NULL
 * is the legacy default stream), ignored on the CPU backend, where work completes before the call
 * returns. gdn_cuda.h has typed wrappers. The synchronous calls (gdn_engine_set_layer_params,
 * gdn_engine_set_mixer_params, gdn_slot_read_state, gdn_slot_write_state and their conv twins) take
 * no stream: they run on the engine's own private stream, ordered after the work that the engine's
 * last enqueuing call put on its stream (that stream must still exist), and wait for that alone:
 * never for the legacy default stream or the whole device. Work the caller launched itself (a graph it captured with GDN_STEP_CALLER_WORK, its
 * own kernels) is the caller's to order first. They return GDN_EMISUSE while that stream is being
 * captured.
 *
 * Errors. Every fallible call returns a gdn_status; GDN_OK is 0 and errors are negative. A call that
 * fails changes nothing. Nothing reachable from this API asserts, aborts or exits.
 *
 * Threads. An engine is not thread-safe: one thread drives it at a time. Distinct engines are
 * independent.
 */
#ifndef GDN_GDN_H
#define GDN_GDN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define GDN_API
#elif defined(__GNUC__) && defined(GDN_BUILDING_LIBRARY)
#define GDN_API __attribute__((visibility("default")))
#else
#define GDN_API
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Version                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

#define GDN_VERSION_MAJOR 0
#define GDN_VERSION_MINOR 1
#define GDN_VERSION_PATCH 0

/* Returns the library's version as MAJOR * 10000 + MINOR * 100 + PATCH. */
GDN_API int gdn_version(void);

/* ---------------------------------------------------------------------------------------------- */
/* Status codes                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

/*
 * One list generates the enum, gdn_status_name and gdn_status_string. The configuration codes name the
 * field that is wrong; the step codes name the rule the step broke. New codes may appear; treat any
 * unknown negative value as an error.
 */
#define GDN_STATUS_MAP(XX)                                                                          \
    XX(OK, 0, "success")                                                                           \
    XX(EINVAL, -1, "invalid argument (a required pointer is NULL or a value is out of range)")     \
    XX(ENOMEM, -2, "out of memory (host or device)")                                               \
    XX(ENOTSUP, -3, "not supported by this backend or build")                                      \
    XX(EMISUSE, -4, "call out of order (e.g. commit without a verify step to commit)")             \
    XX(ECUDA, -5, "CUDA runtime error (gdn_engine_last_error has the detail)")                     \
    XX(EDEVICE, -6, "a kernel raised the sticky device error flag (slot index out of range)")      \
    XX(ENODEV, -7, "the CUDA backend was requested but no usable GPU is present")                  \
    XX(ECONFIG_LAYERS, -20, "config: num_layers must be at least 1")                               \
    XX(ECONFIG_HEADS, -21, "config: num_k_heads and num_v_heads must be >= 1, HV a multiple of HK")\
    XX(ECONFIG_HEAD_DIM, -22, "config: head_dim_k and head_dim_v must each be 64, 128 or 256")     \
    XX(ECONFIG_STATE_DTYPE, -23, "config: state_dtype must be GDN_DTYPE_F32 or GDN_DTYPE_BF16")    \
    XX(ECONFIG_INPUT_DTYPE, -24, "config: input_dtype must be GDN_DTYPE_BF16 or GDN_DTYPE_F16")    \
    XX(ECONFIG_OUTPUT_DTYPE, -25, "config: output_dtype must be GDN_DTYPE_BF16 or GDN_DTYPE_F32")  \
    XX(ECONFIG_SLOTS, -26, "config: num_slots must be at least 1 and at most 2^31 - 1")            \
    XX(ECONFIG_MAX_BATCH, -27, "config: max_batch must be at least 1")                             \
    XX(ECONFIG_BUCKETS, -28, "config: buckets must be strictly increasing, >= 1, last == max_batch")\
    XX(ECONFIG_MAX_TOKENS, -29, "config: max_tokens must be between 1 and GDN_MAX_TOKENS")         \
    XX(ECONFIG_VERIFY, -30, "config: verify_strategy is not a known strategy")                     \
    XX(ECONFIG_BACKEND, -31, "config: backend is not a known backend")                             \
    XX(ECONFIG_SCALE, -32, "config: scale must be finite and >= 0 (0 selects K^-0.5)")             \
    XX(ECONFIG_GRAPHS, -33, "config: graph_mode is not a known mode")                              \
    XX(ECONFIG_RING, -34, "config: ring_length must be 0 (the default) or 4..32")                  \
    XX(ECONFIG_POOL, -35, "config: state_pool strides too small, or not 16-byte aligned")          \
    XX(ECONFIG_VIEWS, -36, "config: an io view has no data, or breaks the alignment its tensor needs") \
    XX(ECONFIG_MIXER, -37, "config: mixer: conv_width must be 0 or 2..4, conv_weight_dtype F32 or BF16, norm_eps finite and >= 0") \
    XX(ECONFIG_CONV_POOL, -38, "config: mixer.conv_pool without the conv, or its strides too small or not one block per slot") \
    XX(ECONFIG_RING_WRITE_THROUGH, -39, "config: ring_write_through must be -1 (never), 0 (the default) or a row count") \
    XX(ESTEP_KIND, -40, "step: kind must be GDN_STEP_DECODE or GDN_STEP_VERIFY (a verify needs max_tokens >= 2)") \
    XX(ESTEP_BATCH, -41, "step: batch must be between 0 and max_batch")                            \
    XX(ESTEP_TOKENS, -42, "step: tokens must be 1 for decode and 1..max_tokens for verify; token counts 1..tokens, verify only") \
    XX(ESLOT_RANGE, -43, "slot index is >= num_slots")                                             \
    XX(ESLOT_FREE, -44, "slot is not allocated (never allocated, or already freed)")               \
    XX(ESLOT_DUP, -45, "the same slot appears twice in one step (or is read by one row and written by another)") \
    XX(ESLOT_EXHAUSTED, -46, "every slot is allocated")                                            \
    XX(ELAYER, -47, "layer index is out of range")                                                 \
    XX(ESLOT_BUSY, -48, "slot belongs to the current step, which still has layers to run or a commit pending") \
    XX(ESTEP_PARENTS, -49, "step: a token's parent must be in -1..t-1 (token t < the row's count), verify only")

typedef enum gdn_status {
#define GDN__STATUS_ENUM(name, value, text) GDN_##name = value,
    GDN_STATUS_MAP(GDN__STATUS_ENUM)
#undef GDN__STATUS_ENUM
} gdn_status;

/* The enumerator's name without the prefix ("EINVAL"), or "UNKNOWN". Never NULL. */
GDN_API const char *gdn_status_name(gdn_status status);
/* A one-line English description of the status. Never NULL. */
GDN_API const char *gdn_status_string(gdn_status status);

/* ---------------------------------------------------------------------------------------------- */
/* Handles and enums                                                                                */
/* ---------------------------------------------------------------------------------------------- */

typedef struct gdn_engine gdn_engine;

typedef enum gdn_dtype {
    GDN_DTYPE_F32 = 0,
    GDN_DTYPE_BF16 = 1,
    GDN_DTYPE_F16 = 2,
} gdn_dtype;

/* Bytes of one element of `dtype`, or 0 for an unknown value. */
GDN_API size_t gdn_dtype_size(gdn_dtype dtype);

typedef enum gdn_backend_kind {
    GDN_BACKEND_AUTO = 0, /* CUDA when this build has it and a GPU is present, else CPU */
    GDN_BACKEND_CUDA = 1,
    GDN_BACKEND_CPU = 2,  /* the float64 reference: correct everywhere, slow */
} gdn_backend_kind;

/* How a verify step's accepted tokens reach the state pool (SPEC 3.1 and 3.2). */
typedef enum gdn_verify_strategy {
    /* Verify writes the state after every token into a cache [max_batch, max_tokens, HV, V, K];
     * commit copies the accepted entry into the pool. */
    GDN_VERIFY_CACHE = 0,
    /* Verify writes no per-token state: each slot keeps its last verify's token inputs (k, v, a, b;
     * a few KB a head), commit only records the accepted count, and the next kernel that touches
     * the slot folds the accepted tokens into the state in registers before its own (SPEC 3.2): one
     * state read and one write per step whatever T is. Reading a state through the API folds first.
     * Less memory than the cache and a faster verify + commit; its decode steps are slower than the
     * cache strategy's (bench/results, README). Both backends. */
    GDN_VERIFY_FOLD = 1,
    /* The default (gdn_engine_config_init). With max_tokens > 1: without the mixer FOLD, except
     * CACHE for bf16 state with max_tokens 2 and max_batch <= 2; with the mixer FOLD from max_batch
     * 16 (fp32 state: from 4), else CACHE. With max_tokens 1 (decode only): RING where the engine
     * owns its state pools (state_pool NULL), has no mixer, and max_batch x num_v_heads exceeds
     * GDN_AUTO_RING_HEADS_F32 or _BF16 by the state's dtype (its ring decode reads the state without
     * writing it, and measured faster there, at the cost of a ring of 8 records a slot with
     * ring_length 0), else CACHE: the caller who hands its own pool may read it, and a ring lets it
     * lag. (The measurements behind the choice: bench/results/2026-11-27-h100-auto-strategy.md,
     * 2026-11-27-h100-mixer-verify-conv.md, 2026-11-30-h200-decode-only-ring.md.)
     * gdn_engine_get_config reports the choice. */
    GDN_VERIFY_AUTO = 2,
    /* Each slot keeps, per layer, a checkpoint state (the pool) and a ring of up to ring_length
     * recent token records (k as given, its norm scale and log decay, and the token's fp32
     * correction u; with the mixer's conv raw x and a as given, and u; SPEC 3 and the
     * ring issue's math): a decode reads the checkpoint and does not write it, computing its output
     * from the checkpoint plus the ring, and appends one record; a row whose ring would hold
     * ring_length records writes its state back (in the same kernel) and empties its ring. A verify
     * computes its T outputs the same way and appends T records tentatively; commit only moves the
     * ring's cursor by accepted[i]. A verify that does not fit the ring's free space, and any row
     * whose write slot differs from its read slot, writes the state back first. The pool therefore
     * lags for slots with ring records: reading a state through the API writes the slot's ring back
     * first. With bf16 state the state is rounded only at write-backs (closer to float64 than the
     * other strategies). Decode steps of few rows (with the mixer's conv, every decode step) write
     * every row back (ring_write_through below).
     * When each strategy wins: README and bench/results. Both backends. */
    GDN_VERIFY_RING = 3,
} gdn_verify_strategy;

/* Ring strategy: records a slot's ring holds before its state is written back (ring_length). */
#define GDN_MIN_RING_LENGTH 4
#define GDN_MAX_RING_LENGTH 32
#define GDN_DEFAULT_RING_LENGTH 16
/* Ring strategy: ring_length 0 in an engine (or op layer) with max_tokens 1 (decode only) */
#define GDN_DEFAULT_DECODE_RING_LENGTH 8
/* AUTO takes RING for a decode-only engine above this many row-heads (max_batch x num_v_heads), by
 * state dtype (GDN_VERIFY_AUTO) */
#define GDN_AUTO_RING_HEADS_F32 256
#define GDN_AUTO_RING_HEADS_BF16 4096
/* Ring strategy: the default ring_write_through covers decode steps of at most this many row-heads
 * (rows x num_v_heads), by state dtype; with the mixer's conv it covers every decode step
 * (ring_write_through). */
#define GDN_RING_WRITE_THROUGH_HEADS_F32 256
#define GDN_RING_WRITE_THROUGH_HEADS_BF16 1024

/* When the CUDA backend captures a step's CUDA graph (one per bucket, T and step kind; a verify step
 * with token_counts or parents, gdn_step, has its own, captured on its first use in every mode). */
typedef enum gdn_graph_mode {
    GDN_GRAPHS_LAZY = 0,      /* on the first step of that shape (that step pays for the capture) */
    GDN_GRAPHS_AT_CREATE = 1, /* every plain shape in gdn_engine_create: no plain step ever captures */
    GDN_GRAPHS_OFF = 2,       /* launch each layer directly (also forced by GDN_DISABLE_GRAPHS=1) */
} gdn_graph_mode;

typedef enum gdn_step_kind {
    GDN_STEP_DECODE = 0, /* T = 1, state updated in place */
    GDN_STEP_VERIFY = 1, /* T tokens, pool untouched until gdn_engine_commit */
} gdn_step_kind;

/* Largest T a verify step may have. */
#define GDN_MAX_TOKENS 16
/* Longest bucket list a configuration may carry. */
#define GDN_MAX_BUCKETS 64

/* ---------------------------------------------------------------------------------------------- */
/* Configuration                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/*
 * A per-token tensor where it lies: element (row i, token t, head h, d) is at
 * data + i * row_stride + t * token_stride + h * head_stride + d, in elements of its dtype (the last
 * dimension contiguous). All three strides 0 means dense [batch, tokens, heads, D]. A column slice of
 * a fused projection output [B, T, N] is (data + first column, T * N, N, D). On CUDA, q and k (and v
 * under the fold and ring strategies) are read in 16-byte pieces: their data and strides must keep
 * every head 16-byte aligned (v: 4-byte), else the op returns GDN_ENOTSUP.
 */
typedef struct gdn_view {
    void *data;
    int64_t row_stride;
    int64_t token_stride;
    int64_t head_stride;
} gdn_view;

/* One layer's step tensors where the caller keeps them (gdn_engine_config.io_views). */
typedef struct gdn_layer_views {
    gdn_view q, k, v, a, b; /* inputs [rows, T, HK, K] x 2, [rows, T, HV, V], [rows, T, HV] x 2 */
    gdn_view o;             /* output [rows, T, HV, V]: o, or y with the mixer's norm */
    gdn_view x;             /* with the mixer's conv: [rows, T, conv_dim] raw input (head_stride unused);
                             * q, k and v are then not read and may have no data */
    gdn_view z;             /* with the mixer's norm: [rows, T, HV, V] gate input */
} gdn_layer_views;

/*
 * The mixer's conv states (SPEC 6), one per slot: slot s's window of its previous W - 1 raw inputs x
 * (oldest first, input_dtype), row j, channel c at data + s * slot_stride + j * token_stride +
 * c * channel_stride elements. With token_stride and channel_stride both 0 it is dense
 * [W - 1][conv_dim] (vLLM's [conv_dim][W - 1] is token_stride 1, channel_stride W - 1); either way
 * a slot's window must be one contiguous block of (W - 1) * conv_dim elements.
 */
typedef struct gdn_conv_pool {
    void *data;
    int64_t slot_stride;    /* elements between slots, >= (W - 1) * conv_dim */
    int64_t token_stride;   /* elements between window rows */
    int64_t channel_stride; /* elements between channels */
} gdn_conv_pool;

/*
 * The whole mixer step (SPEC 6) around every layer's recurrence (gdn_engine_config.mixer; all zero:
 * the recurrence alone). Per row and token: with the conv, x = q | k | v before the conv
 * (conv_dim = 2 HK K + HV V channels, each head-major) goes through a depthwise causal conv of width
 * W over the slot's window of its previous W - 1 inputs (tap W - 1 meets x; + bias) and SiLU, giving
 * q, k and v; with the norm the output is y = o rsqrt(mean_V(o^2) + eps) norm_weight silu(z) per value
 * head instead of o. Weights per layer: gdn_engine_set_mixer_params. The window is per slot and
 * layer, in input_dtype, and follows the state: padding rows touch neither, a decode advances both,
 * a verify neither until its commit, which advances both by accepted[i] (every strategy); slot
 * reset zeroes both, slot copy carries both; gdn_slot_read_conv_state and the conv import / export
 * move a window. Both backends run it; on CUDA one fused kernel per layer runs conv, recurrence and
 * norm, for every strategy with head_dim_k 128 (another head size with a mixer: GDN_ENOTSUP from
 * gdn_engine_create), x 16-byte aligned with row and token strides multiples of 8 elements.
 */
typedef struct gdn_mixer_config {
    int32_t conv_width;          /* W in 2..4: the conv; 0: no conv (q, k, v are the step's inputs) */
    gdn_dtype conv_weight_dtype; /* F32 or BF16: conv weights and bias */
    int32_t use_norm;            /* nonzero: the gated RMSNorm (z input, norm weight per layer) */
    float norm_eps;              /* 0: 1e-6 */
    /* Caller-owned conv pools (data NULL: the engine allocates them, dense and zeroed): layer l's
     * pool at conv_pool.data + l * conv_layer_stride elements (0: num_slots * slot stride), a slot
     * stride of 0 meaning (W - 1) * conv_dim, num_slots slots each. The engine never zeroes them. */
    gdn_conv_pool conv_pool;
    int64_t conv_layer_stride;
} gdn_mixer_config;

/* Geometry of one GDN layer (all layers of an engine share it). SPEC section 1 names. */
typedef struct gdn_model_config {
    int32_t num_layers;  /* GDN layers driven by the engine, >= 1 */
    int32_t num_k_heads; /* HK: query/key heads */
    int32_t num_v_heads; /* HV: value heads, a multiple of HK (grouped value attention) */
    int32_t head_dim_k;  /* K: 64, 128 or 256 */
    int32_t head_dim_v;  /* V: 64, 128 or 256 */
    float scale;         /* query scale; 0 selects K^-0.5 */
    int32_t use_qk_l2norm; /* nonzero: L2-normalise q and k in the kernel (the default) */
} gdn_model_config;

typedef struct gdn_engine_config {
    gdn_model_config model;
    gdn_dtype state_dtype;  /* F32 or BF16: storage of pools and verify cache */
    gdn_dtype input_dtype;  /* BF16 or F16: q, k, v, a, b */
    gdn_dtype output_dtype; /* BF16 or F32: o */
    int32_t num_slots;      /* state pool rows per layer */
    int32_t max_batch;      /* most rows in one step */
    int32_t max_tokens;     /* most tokens (T) in one verify step, 1..GDN_MAX_TOKENS; 1: decode steps
                             * only (a verify step is GDN_ESTEP_KIND; no strategy keeps verify memory) */
    int32_t num_buckets;    /* 0: the default list (1, 2, 4, 8, every 8 to 256, every 16 after) */
    int32_t buckets[GDN_MAX_BUCKETS]; /* padded batch sizes, strictly increasing, last == max_batch */
    gdn_verify_strategy verify_strategy;
    int32_t ring_length;    /* GDN_VERIFY_RING: 0 (GDN_DEFAULT_RING_LENGTH; with max_tokens 1
                             * GDN_DEFAULT_DECODE_RING_LENGTH) or 4..32, checked for every strategy */
    /* GDN_VERIFY_RING: a decode step of at most this many rows (its bucket) writes every row's state
     * back, as the cache strategy's decode does, instead of appending a record: on small grids the
     * step is bound by its latency chain, not by the state's bytes, and the write-back costs nothing
     * there while the ring's preparation does. With bf16 state such steps round the state to bf16
     * each time, like the cache strategy. 0: the default, steps of at most 256 / num_v_heads rows
     * with fp32 state and 1024 / num_v_heads with bf16 (GDN_RING_WRITE_THROUGH_HEADS_F32 / _BF16
     * row-heads), and with the mixer's conv every step (max_batch rows): its ring decode redoes the
     * conv over the records in every CTA, while a decode that writes through folds the records as
     * the fold strategy's decode does (the measurements: bench/results, README); -1: never (the
     * ring's rounding at write-backs only). Checked for every strategy (GDN_ECONFIG_RING_WRITE_THROUGH
     * below -1); gdn_engine_get_config reports the row count chosen, or -1. The environment variable
     * GDN_RING_WRITE_THROUGH=0 also turns it off (A/B runs). */
    int32_t ring_write_through;
    gdn_backend_kind backend;
    int32_t device;         /* CUDA device ordinal (CUDA backend) */
    /*
     * Programmatic dependent launch (CUDA, compute capability 9.0 and up; 1 from
     * gdn_engine_config_init, 0: off; the environment variable GDN_LAUNCH_OVERLAP=0 also turns it
     * off): a layer kernel starts while the kernel before it on the stream is still running, loads
     * its rows' state, and waits for that kernel only before it reads the step's inputs. It overlaps
     * the previous layer, or the caller's kernel that writes the inputs when that kernel allows its
     * dependents to launch early (cudaTriggerProgrammaticLaunchCompletion, or griddepcontrol.launch_dependents,
     * once its own reads of earlier kernels' results are done); a kernel that does not is simply
     * waited for, as without the option. The kernel right before a layer must not write that
     * layer's state pool (a caller-owned pool written by the caller's own kernel: turn this off).
     * A decode layer of few rows allows its own dependents to launch first thing: a caller's kernel
     * launched after it with the attribute may start while the kernel before the layer still runs,
     * and sees the layer's results (and that kernel's) once its griddepcontrol.wait returns.
     */
    int32_t launch_overlap;

    /* CUDA graphs (CUDA backend only; the CPU backend always runs directly). */
    gdn_graph_mode graph_mode;
    /* Called during creation with GDN_GRAPHS_AT_CREATE after each capture (may be NULL). */
    void (*graph_progress)(void *user, int32_t captured, int32_t total);
    void *graph_progress_user;
    /*
     * What a step's graph contains (may be NULL: every layer's GDN update, in layer order). When set,
     * the engine calls it inside the capture of each (bucket, T, kind; and, for a verify step,
     * each combination of token_counts and parents it meets, which the callback need not know:
     * run_layer and commit take them from the capture) with the capture stream; it
     * enqueues the caller's own work on that stream and calls gdn_engine_run_layer(engine, l,
     * capture_stream) for every layer exactly once (and, for a verify step, may end with
     * gdn_engine_commit(engine, capture_stream) so that the replayed graph commits too). Whatever the
     * caller's kernels read or write is baked into the graph: keep those buffers fixed. A status
     * other than GDN_OK aborts the capture and is returned by the step.
     */
    gdn_status (*capture)(void *user, gdn_engine *engine, gdn_step_kind kind, int32_t tokens,
                          int32_t bucket, void *capture_stream);
    void *capture_user;

    /* The whole mixer step (SPEC 6), optional; all zero (gdn_engine_config_init): none. */
    gdn_mixer_config mixer;

    /*
     * Caller-owned memory (backend memory that stays valid until gdn_engine_destroy; NULL: the
     * engine allocates its own). The engine then allocates only what is missing.
     * state_pool: every layer's pool, slot s of layer l at state_pool + l * state_layer_stride +
     *   s * state_slot_stride elements of state_dtype (a stride of 0: dense; the slot stride must be
     *   >= HV * V * K and the layer stride >= num_slots * slot stride, both multiples of 16 bytes, the
     *   pointer 16-byte aligned; else GDN_ECONFIG_POOL). The engine never zeroes it and touches only
     *   each slot's HV * V * K elements.
     * io_views: [num_layers] views of each layer's q, k, v, a, b and o, for max_batch rows and
     *   max_tokens tokens (copied at creation; their addresses are baked into the step graphs). A
     *   view whose strides are all 0 is the dense [bucket, T, H, D] prefix, as the engine's own
     *   buffers. q and k must keep every head 16-byte aligned and v 4-byte aligned (the CUDA kernels'
     *   vector copies), else GDN_ECONFIG_VIEWS. gdn_engine_layer_io then returns the views' pointers.
     *   With the mixer's conv, x is needed instead of q, k and v (which may be left without data);
     *   with its norm, z.
     */
    void *state_pool;
    int64_t state_slot_stride;
    int64_t state_layer_stride;
    const gdn_layer_views *io_views;
} gdn_engine_config;

/*
 * Fills `model` with a named preset: "qwen3-next" (HK 16, HV 32, K = V = 128), "qwen3.5" (HK 16,
 * HV 64, K = V = 128) or "tiny" (HK 2, HV 4, K = V = 64), with `num_layers` layers, l2norm on and the
 * default scale. Returns GDN_EINVAL for a NULL pointer or an unknown name.
 */
GDN_API gdn_status gdn_model_preset(const char *name, int32_t num_layers, gdn_model_config *model);

/*
 * Fills `config` with defaults around `model`: fp32 state, bf16 inputs and outputs, 64 slots,
 * max_batch 64, max_tokens 4, the default buckets, the AUTO verify strategy, the AUTO backend,
 * device 0, lazily captured graphs, no callbacks. Returns GDN_EINVAL for NULL pointers.
 */
GDN_API gdn_status gdn_engine_config_init(gdn_engine_config *config, const gdn_model_config *model);

/*
 * Checks `config` without allocating: GDN_OK or the GDN_ECONFIG_* code of the first wrong field, in
 * the order the fields are declared (the mixer: GDN_ECONFIG_MIXER for its own fields, or for a
 * conv_dim past 2^29 with the conv, then GDN_ECONFIG_CONV_POOL for its conv pool).
 */
GDN_API gdn_status gdn_engine_config_validate(const gdn_engine_config *config);

/* ---------------------------------------------------------------------------------------------- */
/* Lifecycle                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/*
 * Validates `config` and allocates everything the engine will use (pools, verify cache, I/O buffers,
 * slot tables). State pools start zeroed; A_log and dt_bias start at zero for every layer (set them
 * with gdn_engine_set_layer_params). Returns GDN_ECONFIG_* for a bad field, GDN_ENODEV when
 * GDN_BACKEND_CUDA was asked for and no GPU (or no CUDA support in this build) is there, GDN_ENOTSUP
 * for a mixer (config.mixer) on the CUDA backend (its fused kernel is not built yet), GDN_ENOMEM when
 * an allocation fails. On success *out is the new engine.
 */
GDN_API gdn_status gdn_engine_create(const gdn_engine_config *config, gdn_engine **out);

/* Waits for the engine's outstanding work and frees everything. NULL is a no-op. */
GDN_API void gdn_engine_destroy(gdn_engine *engine);

/* The backend the engine runs on (never AUTO for a live engine; AUTO for NULL). */
GDN_API gdn_backend_kind gdn_engine_backend(const gdn_engine *engine);

/* The validated configuration, with the bucket list filled in (NULL for a NULL engine). */
GDN_API const gdn_engine_config *gdn_engine_get_config(const gdn_engine *engine);

/* The last CUDA error seen by the engine as "expr: message (file:line)", or "" if none. */
GDN_API const char *gdn_engine_last_error(const gdn_engine *engine);

/* Bytes of backend memory the engine holds, by component. */
typedef struct gdn_memory_report {
    uint64_t state_pools;  /* all layers' pools */
    uint64_t conv_pools;   /* all layers' conv states (the mixer's conv) */
    uint64_t verify_cache; /* intermediate-state cache (cache strategy) */
    uint64_t token_store;  /* per-slot token inputs and pending counts (fold strategy) */
    uint64_t ring;         /* per-slot token records and ring counts (ring strategy) */
    uint64_t io_buffers;   /* q, k, v (or x), a, b, z, o for every layer */
    uint64_t parameters;   /* A_log, dt_bias, the mixer's weights */
    uint64_t indices;      /* slot indices, token counts and parents, accepted counts, error flag */
    uint64_t total;
} gdn_memory_report;

GDN_API gdn_status gdn_engine_memory(const gdn_engine *engine, gdn_memory_report *report);

/*
 * Copies layer `layer`'s A_log [HV] and dt_bias [HV] (host, fp32) into the engine. Synchronous; not
 * for the step path. GDN_ELAYER for a bad layer, GDN_EINVAL for NULL pointers.
 */
GDN_API gdn_status gdn_engine_set_layer_params(gdn_engine *engine, int32_t layer,
                                               const float *A_log, const float *dt_bias);

/*
 * Copies layer `layer`'s mixer weights (host memory) into the engine: conv_weight [conv_dim][W] and
 * conv_bias [conv_dim] in the configuration's conv_weight_dtype (bias NULL: none, the same as zeros),
 * norm_weight [V] fp32. Each is given when the configuration has its part and NULL otherwise. They
 * start at zero. Synchronous; not for the step path. GDN_ELAYER for a bad layer, GDN_EINVAL for a
 * NULL weight that a part needs, or a weight of a part the engine does not have.
 */
GDN_API gdn_status gdn_engine_set_mixer_params(gdn_engine *engine, int32_t layer, const void *conv_weight,
                                               const void *conv_bias, const float *norm_weight);

/* ---------------------------------------------------------------------------------------------- */
/* Slots                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/*
 * Reserves a free slot and writes it to *slot: a fresh engine hands out 0, 1, 2, ... (slot 0 is an
 * ordinary slot), and freed slots are reused most-recently-freed first. The slot's
 * state is left as it is: call gdn_slot_reset or write it through the pool for a new request.
 * GDN_ESLOT_EXHAUSTED when every slot is taken.
 */
GDN_API gdn_status gdn_slot_alloc(gdn_engine *engine, int32_t *slot);

/*
 * Returns `slot` to the free list. GDN_ESLOT_RANGE, GDN_ESLOT_FREE when it is not allocated, and
 * GDN_ESLOT_BUSY while the current step still needs it (a row of that step reads or writes it and
 * some layer has not run yet, or the step is a verify step that has not been committed): the engine
 * would otherwise write into a slot that may already belong to another request.
 */
GDN_API gdn_status gdn_slot_free(gdn_engine *engine, int32_t slot);

/* Zeroes the state (and the mixer's conv window) of allocated `slot` in every layer, enqueued on
 * `stream`. Same errors as free. */
GDN_API gdn_status gdn_slot_reset(gdn_engine *engine, int32_t slot, void *stream);

/*
 * Device-side slot operations: enqueued on `stream`, no host copy and no synchronisation, all layers
 * in one launch, valid inside a capture (the slots are checked at the call and baked into the
 * launch). Both slots must be allocated and not needed by the current step (GDN_ESLOT_BUSY, as
 * gdn_slot_free); GDN_ESLOT_RANGE, GDN_ESLOT_FREE, GDN_EINVAL (NULL buffer, dst == src, a layer
 * stride below HV * V * K).
 *   copy: dst's state becomes src's current state in every layer (under fold and ring the
 *     pending tokens or ring records travel with it, so nothing is folded or written back);
 *   import: slot's state in layer l becomes src[l * layer_stride ...] (HV * V * K elements in the
 *     pool's dtype, backend memory: e.g. a prefill kernel's final states), pending tokens / ring
 *     records dropped;
 *   export: dst[l * layer_stride ...] becomes slot's current state in layer l; under fold and ring
 *     a slot with pending tokens or records is first written back in place (one zero-token launch a
 *     layer before the copy).
 * With the mixer's conv: copy carries the window too; import replaces the state only and drops the
 * pending tokens, whose inputs would have advanced the window: import the window as well (a prefill
 * hands over both) with gdn_slot_import_conv_async; export writes the pending work back, which
 * brings the window in the conv pool up to date too (gdn_slot_export_conv_async copies it out).
 */
GDN_API gdn_status gdn_slot_copy_async(gdn_engine *engine, int32_t dst, int32_t src, void *stream);
GDN_API gdn_status gdn_slot_import_async(gdn_engine *engine, int32_t slot, const void *src, int64_t layer_stride,
                                         void *stream);
GDN_API gdn_status gdn_slot_export_async(gdn_engine *engine, int32_t slot, void *dst, int64_t layer_stride,
                                         void *stream);

/*
 * The same for the mixer's conv window (engines with the conv; else GDN_EINVAL): (W - 1) * conv_dim
 * elements of input_dtype per layer, in the conv pool's window layout (the engine's own pool: dense
 * [W - 1][conv_dim], oldest first), layer l at l * layer_stride elements (>= (W - 1) * conv_dim).
 *   import_conv: the slot's window becomes src's in every layer (its state and pending tokens are
 *     left alone: import the state first, which drops them, for a prefill's hand-off);
 *   export_conv: dst becomes the slot's current window (pending work written back first, as export).
 * Same errors as the state's import and export.
 */
GDN_API gdn_status gdn_slot_import_conv_async(gdn_engine *engine, int32_t slot, const void *src, int64_t layer_stride,
                                              void *stream);
GDN_API gdn_status gdn_slot_export_conv_async(gdn_engine *engine, int32_t slot, void *dst, int64_t layer_stride,
                                              void *stream);

/* Nonzero when `slot` is allocated. */
GDN_API int gdn_slot_is_allocated(const gdn_engine *engine, int32_t slot);

/* Number of allocated slots. */
GDN_API int32_t gdn_slot_count(const gdn_engine *engine);

/* ---------------------------------------------------------------------------------------------- */
/* Buffers                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

/* One layer's state pool: element (slot, h, v, k) is at data + slot*slot_stride + (h*V + v)*K + k. */
typedef struct gdn_state_pool {
    void *data;          /* backend memory, dtype elements */
    gdn_dtype dtype;
    int64_t num_slots;
    int64_t slot_stride; /* elements between slots, >= HV*V*K */
} gdn_state_pool;

GDN_API gdn_status gdn_engine_state_pool(gdn_engine *engine, int32_t layer, gdn_state_pool *pool);

/*
 * One layer's static step buffers, all backend memory, each sized for max_batch rows and max_tokens
 * tokens. A step of B rows and T tokens uses the dense prefix [B, T, ...] of each: q and k
 * [B, T, HK, K], v [B, T, HV, V], a and b [B, T, HV] (input_dtype), o [B, T, HV, V] (output_dtype).
 * The caller writes q, k, v, a, b before running the layer and reads o after. With the mixer's conv
 * the input is x [B, T, conv_dim] instead of q, k and v (NULL then); with its norm z [B, T, HV, V]
 * (input_dtype) is an input too and o holds y; x and z are NULL without their parts.
 */
typedef struct gdn_layer_io {
    void *q, *k, *v, *a, *b;
    void *o;
    void *x, *z;
} gdn_layer_io;

GDN_API gdn_status gdn_engine_layer_io(gdn_engine *engine, int32_t layer, gdn_layer_io *io);

/*
 * One layer's conv pool (the mixer's conv; GDN_EINVAL without it), num_slots windows: read a slot's
 * window there only after gdn_slot_export_conv_async or a flush (under fold and ring it lags by the
 * pending tokens, as the state pool does); gdn_slot_read_conv_state does both.
 */
GDN_API gdn_status gdn_engine_conv_pool(gdn_engine *engine, int32_t layer, gdn_conv_pool *pool);

/*
 * The accepted buffer, int32 [max_batch] in backend memory. After a verify step the caller's sampler
 * writes one value per row i (on the device, on the CUDA backend), then calls gdn_engine_commit. What
 * the value means depends on the step (gdn_step):
 *   - a plain step: the accepted count in [0, T];
 *   - a step with token_counts and no parents: the accepted count in [0, n[i]];
 *   - a step with parents (a token tree): the ACCEPTED NODE in [-1, n[i] - 1] (n[i] = T without
 *     counts), -1 meaning nothing accepted; the row's state becomes the state after that node, its
 *     path being the node's ancestors and itself.
 * A count out of range is clamped, the row commits the clamped count; a node out of range (or a
 * row the step treated as padding for a bad count or parent) leaves the row's state unchanged. Both
 * raise the device error flag (gdn_engine_check_device_error: GDN_EDEVICE).
 */
GDN_API int32_t *gdn_engine_accepted(gdn_engine *engine);

/* ---------------------------------------------------------------------------------------------- */
/* Steps                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* gdn_step.flags. */
/* The caller runs this step's work itself, with gdn_engine_enqueue_rows / _layer / _commit, usually
 * by replaying a CUDA graph it captured from those calls (with its own kernels around them): see
 * "Caller-owned graphs" below. */
#define GDN_STEP_CALLER_WORK 1u

typedef struct gdn_step {
    gdn_step_kind kind;
    int32_t tokens;             /* T: 1 for decode; 1..max_tokens for verify */
    int32_t batch;              /* rows, 0..max_batch */
    const int32_t *slots;       /* host [batch]: the slot each row reads; < 0 marks a padding row */
    const int32_t *write_slots; /* host [batch] or NULL (= slots): where the row's new state goes */
    uint32_t flags;             /* 0, or GDN_STEP_CALLER_WORK */
    /*
     * Per-row token counts and token trees (SPEC 3), verify steps only; both NULL (a zeroed
     * gdn_step) is the plain step: every row runs its T tokens as a chain. Both are host arrays,
     * checked and staged by begin_step with the rows (they reach the device in the same copy) and
     * not read after it returns. Padding rows (slot < 0) ignore theirs.
     *   token_counts: host [batch] or NULL. Row i runs n[i] in 1..tokens tokens (requests with
     *     different draft lengths, and plain decode rows with n[i] = 1, in one step); its positions
     *     t >= n[i] are padding: zero output, no state effect. A count outside 1..tokens, or any
     *     counts on a decode step: GDN_ESTEP_TOKENS.
     *   parents: host [batch][tokens] (row i at parents + i * tokens) or NULL (chains). Token t of
     *     row i runs from the state after its parent p in -1..t-1 (-1: the slot's state) and its
     *     output is read from the state after it; a chain is p = t - 1. Entries at t >= n[i] are
     *     ignored. A parent outside -1..t-1, or any parents on a decode step: GDN_ESTEP_PARENTS.
     * What the commit reads from gdn_engine_accepted follows: with parents, the accepted node of
     * each row; with counts alone, the accepted count clamped to 0..n[i]. Each combination (counts
     * or not, parents or not) has its own step and commit graphs, captured on first use.
     */
    const int32_t *token_counts;
    const int32_t *parents;
} gdn_step;

/*
 * Starts a step: checks the rows, picks the smallest bucket >= batch (rows past `batch` are padding),
 * and stages the slot indices on the host (no CUDA call: the step's first work, on the stream given to
 * run_step or run_layer, copies them to the device; its launch carries them where they fit, so that
 * the device reads no host memory, and a step graph's launch updates that kernel's parameters when
 * they differ from the graph's last launch). `stream` is unused and kept for symmetry. An engine's
 * steps must reach the GPU in the order they were begun: drive one engine from one stream (or
 * streams ordered by events). Rows that travel through host memory instead (GDN_STEP_CALLER_WORK,
 * or more than a launch carries: over 254 values of read and write slots (2 x bucket), counts,
 * parents and the slots freed since the last step) take a slot of a 64-entry staging ring: if the
 * GPU falls a whole ring behind, this call waits for it. Errors, each leaving the engine unchanged:
 * GDN_ESTEP_KIND (also a verify step with max_tokens 1), GDN_ESTEP_BATCH, GDN_ESTEP_TOKENS,
 * GDN_ESLOT_RANGE (>= num_slots), GDN_ESLOT_FREE
 * (not allocated), GDN_ESLOT_DUP (a slot read by two rows, written by two rows, or written by a row
 * that does not read it while another row reads it); for token_counts and parents (gdn_step):
 * GDN_ESTEP_TOKENS (a count outside 1..tokens, or counts on a decode step), GDN_ESTEP_PARENTS (a
 * parent outside -1..t-1, or parents on a decode step). These are checked on the host; nothing of
 * them is left to the device flag. A
 * verify step that was run but not committed is dropped by the next begin (as if every row accepted
 * 0 tokens). *bucket (may be NULL) receives the padded batch size.
 */
GDN_API gdn_status gdn_engine_begin_step(gdn_engine *engine, const gdn_step *step, void *stream,
                                         int32_t *bucket);

/*
 * Runs layer `layer` of the current step on `stream`: reads its q, k, v, a, b buffers, writes o, and
 * updates the pool (decode) or the verify cache (verify). Layers may run in any order, each once.
 * GDN_EMISUSE without a begun step, for a layer that already ran in this step, or after the step was
 * committed; GDN_ELAYER for a bad index.
 */
GDN_API gdn_status gdn_engine_run_layer(gdn_engine *engine, int32_t layer, void *stream);

/* Runs every layer of the current step in layer order. GDN_EMISUSE if any layer of the step already
 * ran (then nothing runs). */
GDN_API gdn_status gdn_engine_run_step(gdn_engine *engine, void *stream);

/*
 * Advances each row of the current verify step by accepted[i] tokens (gdn_engine_accepted), for all
 * layers, reading the counts in backend memory on `stream`: no host synchronisation. Rows with 0 keep
 * their state. A step with token_counts clamps each count to 0..n[i]; a step with parents reads
 * accepted[i] as the accepted node (-1..n[i] - 1, -1: the row keeps its state) and sets the row's
 * state to the state after that node. GDN_EMISUSE unless the current step is a verify step that ran
 * on every layer and has not been committed.
 */
GDN_API gdn_status gdn_engine_commit(gdn_engine *engine, void *stream);

/*
 * Caller-owned graphs. A serving loop that captures its own CUDA graph per (bucket, kind, T), with
 * its own kernels and the engine's work inside, splits a step in two:
 *   - gdn_engine_begin_step with flags = GDN_STEP_CALLER_WORK plans the step on the host and
 *     advances all of its bookkeeping at once: its rows are staged for the work that follows, every
 *     layer counts as run and a verify step as committed (so slots may be freed right away). The
 *     step's work must then reach the stream before the next begin_step.
 *   - The work is pure enqueues for the begun step's (bucket, kind, T, and whether it has
 *     token_counts and whether it has parents: their device arrays are baked into the layer and
 *     commit launches), valid inside a capture:
 *     gdn_engine_enqueue_rows first (the step's rows, counts and parents to the device), then gdn_engine_enqueue_layer
 *     for every layer, each once, in any order between the caller's own kernels, then, for a verify
 *     step, gdn_engine_enqueue_commit after the caller's sampler has written the accepted counts
 *     (or nodes: gdn_engine_accepted).
 * Capture those calls once per shape (a step with counts or parents is another shape than the
 * plain step of the same bucket and T); afterwards each step is begin_step(..., CALLER_WORK) and a
 * launch of the graph of the returned bucket. The engine-tracked calls (run_layer, run_step,
 * commit) refuse a CALLER_WORK step, and return GDN_EMISUSE on a stream that a capture not made by
 * the engine is recording (they would bake one step's bookkeeping into a graph), as do
 * gdn_slot_reset, gdn_engine_synchronize and gdn_engine_check_device_error.
 * The enqueue calls return GDN_EMISUSE unless the current step was begun with GDN_STEP_CALLER_WORK
 * (and enqueue_commit unless it is a verify step), GDN_ELAYER for a bad layer.
 */
GDN_API gdn_status gdn_engine_enqueue_rows(gdn_engine *engine, void *stream);

/*
 * The current step's rows in backend memory, as its kernels read them: read_slots[bucket] and
 * write_slots[bucket] (padding rows -1; write = read unless the step gave write slots), for the
 * caller's own per-slot kernels (conv state, sampling) on the same rows. They are filled on the
 * stream by the step's first work (run_step, the first run_layer, or gdn_engine_enqueue_rows) and
 * stay valid for work ordered after it until the next step's first work; the addresses are fixed per
 * bucket (a caller's graph may bake them in). Any output pointer may be NULL. GDN_EMISUSE without
 * a begun step.
 */
GDN_API gdn_status gdn_engine_step_rows(const gdn_engine *engine, const int32_t **read_slots,
                                        const int32_t **write_slots, int32_t *bucket);
GDN_API gdn_status gdn_engine_enqueue_layer(gdn_engine *engine, int32_t layer, void *stream);
GDN_API gdn_status gdn_engine_enqueue_commit(gdn_engine *engine, void *stream);

/*
 * Waits for the engine's work on `stream`, then reads and clears the sticky device error flag:
 * GDN_EDEVICE if a kernel met a slot index >= num_slots or an accepted count outside [0, T] since the
 * last check, else GDN_OK. Not for
 * the step path (it synchronises).
 */
GDN_API gdn_status gdn_engine_check_device_error(gdn_engine *engine, void *stream);

/* Waits until the work enqueued on `stream` is done (no-op on the CPU backend). */
GDN_API gdn_status gdn_engine_synchronize(gdn_engine *engine, void *stream);

/*
 * Copies `bytes` between host memory and backend memory (a buffer the engine handed out, or any
 * device pointer on the CUDA backend), enqueued on `stream`; the host side must stay valid until the
 * stream reaches the copy (use pinned memory for a truly asynchronous copy). GDN_EINVAL for NULL.
 */
GDN_API gdn_status gdn_engine_upload(gdn_engine *engine, void *backend_dst, const void *host_src,
                                     size_t bytes, void *stream);
GDN_API gdn_status gdn_engine_download(gdn_engine *engine, void *host_dst, const void *backend_src,
                                       size_t bytes, void *stream);

/*
 * Copies a slot's state between the pool of `layer` and host memory (dtype elements, HV*V*K of them),
 * synchronously. For tests, prefill hand-off and inspection; not for the step path. The slot must be
 * allocated. A write, and under the ring strategy a read too, returns GDN_ESLOT_BUSY while the
 * current step still needs the slot (from begin_step until its last layer ran and, for a verify,
 * until its commit, as gdn_slot_free): a write would change what a layer still to run reads or be
 * lost at the commit, and a ring read writes back the records the commit is about to count. With
 * the fold and ring strategies a read first writes the layer's pending work back into the pool (so
 * it returns the current state), and a write replaces it with the written state. With the mixer's
 * conv a write writes the pending work back first instead (so that the window stays the slot's
 * current one) and then replaces the state alone.
 */
GDN_API gdn_status gdn_slot_read_state(gdn_engine *engine, int32_t layer, int32_t slot, void *host_dst);
GDN_API gdn_status gdn_slot_write_state(gdn_engine *engine, int32_t layer, int32_t slot,
                                        const void *host_src);

/*
 * The same for the mixer's conv window of `slot` in `layer` ((W - 1) * conv_dim elements of
 * input_dtype in the conv pool's window layout; the engine's own: dense [W - 1][conv_dim], oldest
 * first), synchronously, with the same rules: a read writes the layer's pending work back first (the
 * window it returns is current); a write does too and then replaces the window alone. A prefill's
 * hand-off writes both the state and the window. GDN_EINVAL without the conv.
 */
GDN_API gdn_status gdn_slot_read_conv_state(gdn_engine *engine, int32_t layer, int32_t slot, void *host_dst);
GDN_API gdn_status gdn_slot_write_conv_state(gdn_engine *engine, int32_t layer, int32_t slot, const void *host_src);

#ifdef __cplusplus
}
#endif

#endif /* GDN_GDN_H */
