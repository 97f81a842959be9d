/* nn/ — what models are written against besides the tensor API: named weights loaded from a
 * checkpoint folder (with shape checks that name the tensor), config.json access, and small
 * building blocks (Linear, norms) used by every model.
 *
 * A model never knows where its weights come from or in which mode it runs: it asks
 * cdf_weights for "transformer_blocks.0.attn.to_q.weight" with the shape its config implies
 * and gets a device tensor (converted to the compute dtype policy). */
#ifndef CDF_NN_H
#define CDF_NN_H

#include <stdarg.h>
#include <stdio.h>

#include "cdiffusers/io.h"
#include "cdiffusers/tensor.h"

struct cJSON;

/* The loaders' printf-style module name (fmt, ... of the enclosing function) formatted into the
 * char array buf. */
#define CDF_NN_FORMAT_NAME(buf, fmt)            \
    do {                                        \
        va_list ap_;                            \
        va_start(ap_, fmt);                     \
        vsnprintf(buf, sizeof buf, fmt, ap_);   \
        va_end(ap_);                            \
    } while (0)

/* How weights are materialised on the device. */
typedef struct cdf_load_options {
    cdf_device *device;      /* NULL = default device */
    cdf_dtype weight_dtype;  /* storage dtype of float weights on the device: CDF_F32 (upcast,
                                exact path) or CDF_BF16; norms' 1-D weights always stay f32 */
    cdf_dtype compute_dtype; /* activations: CDF_F32 */
    bool blocks_on_host;     /* sequential offload: weights of repeated blocks ("...blocks.<i>.")
                                stay in the mapped checkpoint (no device memory); cdf_block_run
                                materialises a block's weights just before it runs */
    const char *weights_file; /* NULL: the component folder's weights; else a single .safetensors
                                 or .gguf file read in their place (nn/weights_source.h); the
                                 folder still gives config.json */
    const char *weights_part; /* a text encoder's part of an all-in-one weights_file: "clip_l",
                                 "clip_g" or "t5xxl" ("text_encoders.<part>.transformer."), NULL
                                 for other components */
    struct cdf_weights_report *report; /* if set, cdf_weights_free fills it */
    struct cdf_layer_index *layers; /* if set, every linear layer loaded is registered there under
                                its module name (below: what LoRA adapters attach to) */
    bool decode_quantized;   /* decode GGUF block weights at load (weight_dtype values in memory);
                                by default a linear layer's blocks stay as they are in the file and
                                its matmul decodes them a panel at a time (cdf_linear_quantized) */
    uint32_t quantize_to;    /* 0, CDF_GGML_Q8_0 or CDF_GGML_Q4_K: a linear layer whose float weight
                                has a whole number of blocks per row is quantized at load and kept
                                as blocks */
    /* if set, called with the diffusers name of every tensor the load reads (linear: read as a
       linear layer's [out, in] weight); `cdiffusers convert` lists a component's tensors with it */
    void (*on_read)(void *ctx, const char *name, bool linear);
    void *on_read_ctx;
    bool shapes_only; /* the memory planner's measured forwards (exec/capture.h): every weight is a
                         buffer without memory or values, of the shape and dtype a load would give
                         it; no weight bytes are read (headers only). Such a model can only be run
                         in a measurement. GGUF blocks and --weight-type are not kept (values). */
} cdf_load_options;

/* What a component's load left unread in a single weights file (names as in the file). */
typedef struct cdf_weights_report {
    char *unused; /* comma-separated, malloc'd (the receiver frees it); NULL if none */
    int n_unused;
    char format[192]; /* "GGUF, BFL FLUX keys", "safetensors", ... */
} cdf_weights_report;

cdf_load_options cdf_load_options_default(void);

typedef struct cdf_weights cdf_weights;

/* Open a component folder's weights (see cdf_checkpoint_open) for loading onto a device. */
cdf_status cdf_weights_open(const char *dir, const cdf_load_options *opt, cdf_weights **out);
void cdf_weights_free(cdf_weights *w);
const char *cdf_weights_path(const cdf_weights *w);
const cdf_load_options *cdf_weights_options(const cdf_weights *w);
cdf_checkpoint *cdf_weights_checkpoint(cdf_weights *w);
/* The source behind w (nn/weights_source.h): a folder, or a converted single file / GGUF. */
struct cdf_wsrc *cdf_weights_source(cdf_weights *w);

/* The tensor `name` (printf-style), which must have exactly `shape` (ndim dims; a dim of -1
 * accepts any size). Missing tensor: CDF_ERR_NOT_FOUND naming it and the folder; other shape:
 * CDF_ERR_SHAPE naming it with both shapes. Float tensors are converted to the load policy's
 * dtype (2-D+ weights) or f32 (1-D and 0-D: biases, norm scales). Integer tensors keep theirs.
 * Returns a new reference (not scope-recorded). */
cdf_tensor *cdf_weights_get(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, but an absent tensor returns NULL with no error recorded (check cdf_weights_has). */
cdf_tensor *cdf_weights_get_opt(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool cdf_weights_has(cdf_weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same as cdf_weights_get but always f32 (e.g. position-embedding tables). */
cdf_tensor *cdf_weights_get_f32(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sequential offload: if `name` is a weight of a repeated block ("transformer_blocks.3.attn...",
 * "single_transformer_blocks.0...."), the length of its block prefix ("transformer_blocks.3");
 * else 0. Such weights stay host-side with cdf_load_options.blocks_on_host. */
size_t cdf_weights_block_prefix(const char *name);
/* Bytes of device memory the loaded weights hold (sum of materialised tensors). */
uint64_t cdf_weights_loaded_bytes(const cdf_weights *w);

/* ---- module name -> linear layer, filled while a model loads (cdf_load_options.layers) ----
 * What LoRA adapters are attached to by module name (nn/lora.h). nn/layer_index.c. */
typedef struct cdf_linear_layer cdf_linear_layer;
typedef struct cdf_layer_index cdf_layer_index;
cdf_layer_index *cdf_layer_index_new(void);
void cdf_layer_index_free(cdf_layer_index *ix); /* NULL is fine */
void cdf_layer_index_clear(cdf_layer_index *ix);
/* Called by the linear loaders; sharded = a tensor-parallel shard (holds part of the layer). An
 * allocation failure only leaves the layer out (a LoRA naming it then reports it unmatched). */
void cdf_layer_index_add(cdf_layer_index *ix, const char *name, cdf_linear_layer *l, bool sharded);
/* NULL if no layer has that module name. */
cdf_linear_layer *cdf_layer_index_find(const cdf_layer_index *ix, const char *name, bool *sharded);
int cdf_layer_index_count(const cdf_layer_index *ix);
cdf_linear_layer *cdf_layer_index_at(const cdf_layer_index *ix, int i, const char **name);

/* ---- config.json ---------------------------------------------------------------------- */
/* Load <dir>/config.json. The caller frees with cJSON_Delete. */
cdf_status cdf_config_load(const char *dir, struct cJSON **out);
/* "_class_name" (diffusers) or architectures[0] (transformers); NULL if neither. */
const char *cdf_config_class_name(const struct cJSON *cfg);
/* The integer `key` (default def) of a config, which must be in 1..max: a size, bounded so that
 * products of a few of them cannot overflow. Else CDF_ERR_FORMAT naming the key and the range. */
cdf_status cdf_config_get_dim(const struct cJSON *cfg, const char *key, int64_t def, int64_t max, int64_t *out);

/* ---- feed-forward activations by their transformers name (ACT2FN) ------------------------ */
typedef enum cdf_act { CDF_ACT_QUICK_GELU, CDF_ACT_GELU, CDF_ACT_GELU_TANH, CDF_ACT_RELU, CDF_ACT_SILU } cdf_act;
/* name -> *out: quick_gelu (only where allow_quick_gelu), gelu, gelu_new and gelu_pytorch_tanh
 * (the tanh approximation), relu, silu and swish. Any other name: CDF_ERR_UNSUPPORTED
 * "config.json: <what> '<name>' is not supported (<listed>)". nn/activation.c. */
cdf_status cdf_act_parse(const char *name, bool allow_quick_gelu, const char *what, const char *listed, cdf_act *out);
cdf_tensor *cdf_act_fwd(cdf_act act, cdf_tensor *x);

/* ---- building blocks -------------------------------------------------------------------- */
struct cdf_tp;
/* Which slice of the whole layer a tensor-parallel shard holds (filled by the cdf_tp_linear_load*
 * loaders, nn/sharded.c): what a LoRA adapter, given for the whole layer, is cut to. The split
 * dimension (output features for the colwise styles, input features for the rowwise ones) is the
 * concatenation of n_parts parts of the given whole widths; this rank holds features
 * [rank*p_i/size, (rank+1)*p_i/size) of every part i, concatenated in part order. style 0
 * (CDF_TP_REPLICATE): the whole layer. */
#define CDF_LINEAR_MAX_PARTS 8
typedef struct cdf_linear_shard {
    int style; /* cdf_tp_style */
    int rank, size;
    int replicas; /* > 1: one process over `size` devices (rank 0): w holds rank r's slice on replica r */
    int n_parts;
    int64_t parts[CDF_LINEAR_MAX_PARTS];
} cdf_linear_shard;

struct cdf_linear_layer {
    cdf_tensor *w; /* [out, in] */
    cdf_tensor *b; /* [out] or NULL */
    int64_t in, out;
    /* Set (by cdf_tp_linear_load) when the layer is a row-wise tensor-parallel shard: w holds
     * this rank's input columns, and the forward sums the ranks' partial outputs. NULL for a
     * whole layer (then the forward is plain cdf_linear). Borrowed from the model. */
    const struct cdf_tp *tp;
    /* The slice of the whole layer this one holds (colwise and rowwise shards alike). in/out
     * above are the shard's; cdf_linear_full_in/out give the whole layer's. */
    cdf_linear_shard shard;
    /* The layer's one hook (below), NULL when none: the LoRA adapters applied at run time
     * (nn/lora.h installs them). The forward adds its term to the output (a row-wise shard adds
     * its partial term before the all-reduce, so the sum holds it once); w itself is never
     * modified in this mode. */
    struct cdf_linear_hook *lora;
    /* 0: w is a float weight. Else the GGUF block type w keeps (cdiffusers/io.h): w is U8
     * [out, row bytes] and the forward decodes it to qwdt inside the matmul. */
    uint32_t qtype;
    cdf_dtype qwdt;
};

/* Loads "<prefix>.weight" [out, in] and, if bias, "<prefix>.bias" [out]. bias: 1 = required,
 * 0 = none, -1 = optional (load if present). */
cdf_status cdf_linear_load(cdf_weights *w, cdf_linear_layer *l, int64_t in, int64_t out, int bias, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void cdf_linear_free(cdf_linear_layer *l);
/* A layer that keeps GGUF blocks (qtype != 0) gets its weight decoded to qwdt values in place
 * (what fusing a LoRA into it needs); a no-op for a float layer. */
cdf_status cdf_linear_decode(cdf_linear_layer *l);
/* A term added to a linear layer's output at run time: the layer's one hook. Run-time LoRA
 * adapters are what installs one (nn/lora.c, cdf_lora_attach), so that the layer code (here,
 * nn/weights.c, nn/sharded.c) reaches them only through these three calls and never depends on
 * nn/lora.c. The layer owns its hook: cdf_linear_free frees it. */
typedef struct cdf_linear_hook cdf_linear_hook;
struct cdf_linear_hook {
    /* the term: x [.., in] -> [.., out] (for a row-wise shard, this rank's partial term) */
    cdf_tensor *(*delta)(const cdf_linear_hook *h, cdf_tensor *x);
    /* append the tensors the term reads to a block's weight list at w[n]; returns the new count */
    int (*list_weights)(const cdf_linear_hook *h, cdf_tensor **w, int n);
    void (*free)(cdf_linear_hook *h);
};
/* Forward of a row-wise shard: this rank's partial x @ w^T (+ bias on rank 0 only, + its hook's
 * partial term), summed over the ranks with one all-reduce. Defined in nn/sharded.c. */
cdf_tensor *cdf_tp_linear_rowwise_fwd(const cdf_linear_layer *l, cdf_tensor *x);
/* The forward of a (not row-wise) layer with a hook: its own product plus the hook's term
 * (nn/weights.c). */
cdf_tensor *cdf_linear_hooked_fwd(const cdf_linear_layer *l, cdf_tensor *x);
/* The layer's own local product, without run-time LoRA adapters (and, for a row-wise shard,
 * before the all-reduce). */
static inline cdf_tensor *cdf_linear_base_fwd(const cdf_linear_layer *l, cdf_tensor *x) {
    /* f32 products always: x may be the bf16 rounding of an activation (cdf_linear_shared_input) */
    return l->qtype ? cdf_linear_quantized_as(x, l->w, l->qtype, l->in, l->qwdt, l->b, CDF_F32)
                    : cdf_linear_as(x, l->w, l->b, CDF_F32);
}
static inline cdf_tensor *cdf_linear_fwd(const cdf_linear_layer *l, cdf_tensor *x) {
    if (l->tp) return cdf_tp_linear_rowwise_fwd(l, x);
    return l->lora ? cdf_linear_hooked_fwd(l, x) : cdf_linear_base_fwd(l, x);
}
/* The dtype the compute policy (kernels/dispatch.h) multiplies this layer's inputs in: bf16 for
 * bf16 weights (or GGUF blocks decoded to bf16), else f32. A model gives its attention bf16 q, k,
 * v (the bf16 attention policy) where the projections feeding it compute in bf16. */
static inline cdf_dtype cdf_linear_compute_dtype(const cdf_linear_layer *l) {
    const cdf_dtype w = l->qtype ? l->qwdt : l->w ? cdf_tensor_dtype(l->w) : CDF_F32;
    return w == CDF_BF16 ? CDF_BF16 : CDF_F32;
}

/* The input x of n layers that each round it to bf16 before multiplying (bf16 float weights or GGUF
 * blocks decoded to bf16, the bf16 policy; no run-time LoRA, which multiplies x in f32; not a
 * row-wise shard): x rounded once (cdf_cast, to nearest even: the rounding each product applies to
 * an f32 x, so the products are the same values) instead of once per layer, and half the bytes
 * for each to read. In
 * defer-and-fuse and compile the cast is the last step of the elementwise chain that computes x
 * (graph/fuse.c), so x is written once, as bf16. Otherwise x itself. Results stay f32
 * (cdf_linear_base_fwd). The opt-in int8 path of Q8_0 layers (CDIFFUSERS_Q8_INT8=1, not
 * faithful by design) then quantizes the bf16 values of x instead of its f32 ones.
 * cdf_linear_rounds_input: whether one layer is such a layer; cdf_linears_round_input: all n. */
static inline bool cdf_linear_rounds_input(const cdf_linear_layer *l) {
    return l->w && !l->lora && !l->tp && cdf_linear_compute_dtype(l) == CDF_BF16;
}
static inline bool cdf_linears_round_input(int n, const cdf_linear_layer *const *ls) {
    for (int i = 0; i < n; i++)
        if (!cdf_linear_rounds_input(ls[i])) return false;
    return n > 0;
}
static inline cdf_tensor *cdf_linear_shared_input(cdf_tensor *x, int n, const cdf_linear_layer *const *ls) {
    return x && cdf_linears_round_input(n, ls) ? cdf_cast(x, CDF_BF16) : x;
}

typedef struct cdf_norm_layer {
    cdf_tensor *w, *b; /* [dim] or NULL */
    float eps;
} cdf_norm_layer;
/* bias/weight flags as for cdf_linear_load. */
cdf_status cdf_norm_load(cdf_weights *w, cdf_norm_layer *n, int64_t dim, int weight, int bias, float eps, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
void cdf_norm_free(cdf_norm_layer *n);

/* Append a layer's tensors (weight, then bias when present, then its hook's tensors) to a
 * block's weight list at w[n]; returns the new count. Used to list what cdf_block_run binds
 * (repeated-block compile) or materialises (sequential offload). A list holds at most
 * CDF_BLOCK_MAX_WEIGHTS (5 per linear layer, 2 per norm). */
#define CDF_BLOCK_MAX_WEIGHTS 256
static inline int cdf_linear_list_weights(cdf_tensor **w, int n, const cdf_linear_layer *l) {
    if (l->w) w[n++] = l->w;
    if (l->b) w[n++] = l->b;
    if (l->lora) n = l->lora->list_weights(l->lora, w, n);
    return n;
}
static inline int cdf_norm_list_weights(cdf_tensor **w, int n, const cdf_norm_layer *l) {
    if (l->w) w[n++] = l->w;
    if (l->b) w[n++] = l->b;
    return n;
}

typedef struct cdf_conv_layer {
    cdf_tensor *w, *b;
    cdf_conv2d_params p;
} cdf_conv_layer;
cdf_status cdf_conv_load(cdf_weights *w, cdf_conv_layer *c, int64_t cin, int64_t cout, int k, int stride, int pad, int bias,
                         const char *fmt, ...) __attribute__((format(printf, 9, 10)));
void cdf_conv_free(cdf_conv_layer *c);
static inline cdf_tensor *cdf_conv_fwd(const cdf_conv_layer *c, cdf_tensor *x) { return cdf_conv2d(x, c->w, c->b, &c->p); }

/* ---- named tensor maps (component inputs/outputs) ---------------------------------------- */
typedef struct cdf_tensor_map {
    int n, cap;
    char **names;
    cdf_tensor **tensors; /* references owned by the map */
} cdf_tensor_map;
void cdf_tensor_map_init(cdf_tensor_map *m);
void cdf_tensor_map_clear(cdf_tensor_map *m);
/* Takes a new reference to t (replaces an existing entry). */
cdf_status cdf_tensor_map_set(cdf_tensor_map *m, const char *name, cdf_tensor *t);
cdf_tensor *cdf_tensor_map_get(const cdf_tensor_map *m, const char *name); /* borrowed, NULL if absent */
/* Read every tensor of a safetensors file onto dev (as stored dtypes). */
cdf_status cdf_tensor_map_load(cdf_tensor_map *m, const char *path, cdf_device *dev);
/* Write every tensor (as f32 for floats unless keep_dtype) to a safetensors file. */
cdf_status cdf_tensor_map_save(const cdf_tensor_map *m, const char *path, bool keep_dtype);


/* ---- tensor parallelism: plans and sharded loading (nn/sharded.c) ---------------------------
 * Like diffusers' `_tp_plan`, a model class declares, as data, how its linear layers split over
 * the ranks of a 1-D mesh; the loader reads only this rank's slice of each sharded weight from
 * the safetensors files (cdf_st_read_rows / cdf_st_read_cols, counted by cdf_io_bytes_read) and
 * the forward of a row-wise layer sums the partial results (cdf_linear_fwd does it). Whatever
 * the plan does not name is replicated: read whole by every rank. Enabled process-wide with
 * cdf_tp_enable (cdiffusers/dist.h); a model asks cdf_tp_for_component whether it is sharded. */
typedef enum cdf_tp_style {
    CDF_TP_REPLICATE = 0,  /* the whole layer on every rank */
    CDF_TP_COLWISE,        /* output features split: rows of w [out, in] and of the bias; each rank
                              produces its slice of the output (e.g. its attention heads) */
    CDF_TP_ROWWISE,        /* input features split: columns of w; partial outputs are summed over
                              the ranks (one all-reduce), the bias is added once */
    CDF_TP_PACKED_ROWWISE, /* row-wise over an input concatenated from parts ([attention, MLP]):
                              every part is split separately, each rank's columns are the
                              concatenation of its slice of every part */
    CDF_TP_PACKED_COLWISE, /* column-wise over an output concatenated from parts (diffusers'
                              PackedColwiseParallel: fused q/k/v/MLP-in, SwiGLU gate+value): every
                              part's rows are split separately, each rank's rows are the
                              concatenation of its slice of every part (cdf_tp_linear_load_packed_out) */
} cdf_tp_style;

/* One plan entry: a module name whose '*' stands for exactly one dotted component (a layer
 * index), e.g. "transformer_blocks.*.attn.to_q". A plan is an array ended by {NULL}. */
typedef struct cdf_tp_rule {
    const char *pattern;
    cdf_tp_style style;
} cdf_tp_rule;

struct cdf_process_group; /* cdiffusers/dist.h */
typedef struct cdf_tp cdf_tp; /* one component's sharding: group, rank, size, plan */

/* The sharding of the component in folder `dir` (model class `model`, plan `plan`): *out = NULL
 * (and CDF_OK) when tensor parallelism is not enabled, the mesh has one rank, or the component
 * is named in the replicate list. The model frees it with cdf_tp_free. */
cdf_status cdf_tp_for_component(const char *dir, const char *model, const cdf_tp_rule *plan, cdf_tp **out);
/* An explicit sharding over pg (ignores the process-wide switch); component names it in messages. */
cdf_status cdf_tp_new(struct cdf_process_group *pg, const char *component, const char *model, const cdf_tp_rule *plan,
                      cdf_tp **out);
void cdf_tp_free(cdf_tp *tp); /* NULL is fine */
int cdf_tp_rank(const cdf_tp *tp); /* 0 for NULL */
int cdf_tp_size(const cdf_tp *tp); /* 1 for NULL */
/* > 1: one process over that many replicas (cdf_dist_init_devices; rank 0 loads every rank's
 * slice, each into its replica); 0 for a group of processes or NULL. */
int cdf_tp_replicas(const cdf_tp *tp);
struct cdf_process_group *cdf_tp_group(const cdf_tp *tp);
/* The plan's style for a module name (CDF_TP_REPLICATE when no rule matches or tp is NULL). */
cdf_tp_style cdf_tp_style_for(const cdf_tp *tp, const char *module);
/* CDF_ERR_UNSUPPORTED naming the component, model, config key, value and rank count unless
 * value divides by the number of ranks (always CDF_OK for NULL). */
cdf_status cdf_tp_check_divisible(const cdf_tp *tp, const char *key, int64_t value);
/* Loads "<prefix>.weight" (full shape [out, in]) and the bias like cdf_linear_load, as the plan
 * says for <prefix>: colwise -> l->out = out / size; rowwise -> l->in = in / size and l->tp set.
 * With tp NULL or a replicated layer this is cdf_linear_load. */
cdf_status cdf_tp_linear_load(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int64_t out, int bias,
                              const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* Same for a layer whose input is the concatenation of n_parts parts of the given widths (their
 * sum is `in`); a packed_rowwise rule splits every part. */
cdf_status cdf_tp_linear_load_packed(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int n_parts,
                                     const int64_t *parts, int64_t out, int bias, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* A layer whose OUTPUT is the concatenation of n_parts parts of the given widths (their sum is
 * the output width), e.g. FLUX.2's fused [q, k, v, gate, value] projection: a packed_colwise rule
 * gives this rank rows r*p_i/N .. (r+1)*p_i/N of every part i (and of the bias), concatenated in
 * part order, so l->out = sum(p_i)/N and the local output splits into the parts' local slices at
 * the same proportions. Replicated (or tp NULL): cdf_linear_load of the whole layer. A plain
 * colwise rule on such a layer is refused (it would mix the parts). */
cdf_status cdf_tp_linear_load_packed_out(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int n_parts,
                                         const int64_t *out_parts, int bias, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* A per-head table [rows, cols] whose columns are the heads (T5's relative position bias
 * [buckets, heads]), split over the ranks as a column-wise q/k/v splits the heads: this rank's
 * columns [rank*cols/N, (rank+1)*cols/N) as f32 (in one process over replicas, each replica's
 * columns on its device, so one program reads every rank's own heads); the whole table when tp
 * is NULL or has one rank (cdf_weights_get_f32). NULL with the error set when cols does not
 * divide or the read fails. */
cdf_tensor *cdf_tp_head_table_f32(cdf_weights *w, const cdf_tp *tp, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The whole layer's widths (l->in / l->out for a layer that is not a shard). */
int64_t cdf_linear_full_in(const cdf_linear_layer *l);
int64_t cdf_linear_full_out(const cdf_linear_layer *l);
/* This shard's slice of a host f32 matrix given for the whole layer (a LoRA pair: lora_A
 * [rank, full_in] -> [rank, l->in], lora_B [full_out, rank] -> [l->out, rank]): the rows of src
 * [full_out, width] this layer's outputs are, into dst [l->out, width]; the columns of src
 * [rows, full_in] its inputs are, into dst [rows, l->in]. A plain copy where the layer is whole
 * along that dimension. */
void cdf_linear_shard_out_rows(const cdf_linear_layer *l, const float *src, int64_t width, float *dst);
void cdf_linear_shard_in_cols(const cdf_linear_layer *l, const float *src, int64_t rows, float *dst);
/* The shard's slice of a host f32 matrix given for the whole layer, times mult, as an f32 tensor on
 * dev: its rows (out_rows: src is [full_out, n]) or its columns (src is [n, full_in]). Over the
 * replicas of one process (shard.replicas > 1) each replica gets its own rank's slice, as the
 * sharded weight does; otherwise this rank's. */
cdf_tensor *cdf_linear_shard_tensor(const cdf_linear_layer *l, cdf_device *dev, bool out_rows, const float *src, int64_t n,
                                    float mult);
/* Read l's weight again from w as it was loaded (the same slice for a tensor-parallel shard,
 * the same dtype, blocks for a layer that keeps GGUF blocks) and put it in place of l->w (bias
 * and run-time adapters untouched): what undoing a fused LoRA exactly needs. w must be opened
 * like the layer's model was (the same folder or file and load options, no layer index). */
cdf_status cdf_linear_reload_weight(cdf_weights *w, cdf_linear_layer *l, const char *prefix);
/* After loading: CDF_ERR_INTERNAL if a rule of the plan matched no layer (a typo in a plan). */
cdf_status cdf_tp_check_plan_used(const cdf_tp *tp);

#endif
