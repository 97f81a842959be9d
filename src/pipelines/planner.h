/* The device-memory planner's internals (planner.c), shared with offload.c, the CLI and the
 * calibration benchmark (bench/offload/calibrate.c).
 *
 * A model's device memory = its resident weights (from the checkpoint headers, converted to the
 * load policy's dtypes) + the activations one forward needs at its peak (a per-architecture
 * formula over the input shapes). "Needs" means: the smallest device budget under which the
 * forward succeeds. Without a budget the measured peak is higher and depends on timing, because
 * the host runs ahead of the device queue and every queued op's output is already allocated;
 * under a budget the allocator drains the queue before failing, so the need is what counts. */
#ifndef CDF_PIPELINES_PLANNER_H
#define CDF_PIPELINES_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

struct cJSON;

typedef enum cdf_plan_model_kind {
    CDF_PLAN_OTHER = 0, /* unknown class: weights only, no activation estimate */
    CDF_PLAN_CLIP,
    CDF_PLAN_T5,
    CDF_PLAN_FLUX,
    CDF_PLAN_SD3,
    CDF_PLAN_VAE,
    CDF_PLAN_FLUX2,   /* Flux2Transformer2DModel */
    CDF_PLAN_MISTRAL, /* FLUX.2's text encoder (mistral3_text.c) */
} cdf_plan_model_kind;

/* What the activation formulas need from a config.json. */
typedef struct cdf_plan_model_info {
    cdf_plan_model_kind kind;
    cdf_dtype weight_dtype; /* the load policy (from_config sets CDF_F32; callers override) */
    int64_t width;        /* hidden size / d_model / heads * head_dim */
    int64_t heads, head_dim;
    int64_t kv_heads;     /* grouped-query attention (Mistral); 0 = heads */
    int64_t mlp;          /* MLP hidden width (intermediate_size, d_ff, 4 * width) */
    int64_t layers, single_layers, dual_layers;
    int64_t in_channels, joint_dim, pooled_dim, patch;
    bool guidance_embeds, qk_norm;
    /* AutoencoderKL */
    int n_blocks;
    int64_t channels[8];  /* block_out_channels */
    int64_t layers_per_block, latent_channels;
    int vae_scale_factor; /* 2^(n_blocks - 1) */
    int64_t sample_size, out_channels; /* the tile of enable_tiling(); image channels */
} cdf_plan_model_info;

/* The shapes of one forward: batch, text tokens (text encoders; the transformer's context:
 * FLUX the T5 length, SD3 77 + T5 length), and the latent grid (transformers: the VAE latent
 * [latent_h, latent_w] before patching; VAE decode: its input). */
typedef struct cdf_plan_shape {
    int64_t batch, text_tokens, latent_h, latent_w;
    /* the transformer runs with repeated-block compile: each block is a graph whose buffers
     * share one arena by lifetime, allocated for the block's run (compile/compile.c) */
    bool repeated_blocks;
    /* VAE decode in tiles of this many latent rows/columns (overlap 0.25; 0 = untiled) */
    int64_t vae_tile_latent;
} cdf_plan_shape;

cdf_status cdf_plan_model_info_from_config(const char *class_name, const struct cJSON *cfg, cdf_plan_model_info *out);
/* Repeated-block compile (s->repeated_blocks, transformers): the activation bytes the block graphs'
 * arenas need (formulas read off compile/memory_plan.c's placement); 0 for other models and for
 * eager shapes, whose peaks are measured (cdf_plan_measure_activation_bytes). */
uint64_t cdf_plan_activation_bytes(const cdf_plan_model_info *m, const cdf_plan_shape *s);
/* The same per block family (as cdf_plan_blocks.largest_in_family) while a block of that family
 * runs; cdf_plan_activation_bytes is the larger. */
void cdf_plan_activation_bytes_by_family(const cdf_plan_model_info *m, const cdf_plan_shape *s, uint64_t out[2]);
/* Peak activation bytes (above the resident weights and the inputs) of one forward of the
 * component in folder dir at shape s, per block family as above, measured: its forward runs over
 * virtual buffers with weights sized from the checkpoint headers (no weight data read; see
 * planner.c). Repeated-block shapes fall back to the formulas above. */
cdf_status cdf_plan_measure_activation_bytes(const char *dir, cdf_dtype weight_dtype, const cdf_plan_shape *s, uint64_t out[2]);
/* Device bytes the weights of the component folder `dir` take once loaded with weight_dtype:
 * float tensors of 2+ dims at weight_dtype, 1-D ones (biases, norm scales) at f32, and the
 * loaders' exceptions (tables kept in f32, T5's relative bias kept on the host). */
cdf_status cdf_plan_weight_bytes(const char *dir, cdf_dtype weight_dtype, uint64_t *out);
/* The same, split into the repeated blocks' weights (nn/weights.c: cdf_weights_block_prefix),
 * which sequential offload keeps host-side, and the rest. */
typedef struct cdf_plan_blocks {
    uint64_t total_bytes;         /* every weight (= cdf_plan_weight_bytes) */
    uint64_t blocks_bytes;        /* the blocks' weights, all of them */
    uint64_t largest_block_bytes; /* the largest single block */
    /* the largest block of each family: [0] transformer_blocks.<i>, [1] single_transformer_blocks.<i>
     * (FLUX's double- and single-stream blocks differ in weights and in activations, so under
     * sequential offload the peak is the family whose weights + activations are the larger) */
    uint64_t largest_in_family[2];
    int n_blocks;
} cdf_plan_blocks;
cdf_status cdf_plan_block_bytes(const char *dir, cdf_dtype weight_dtype, cdf_plan_blocks *out);
/* What the load does to the weights besides the dtype: a GGUF file read in place of the folder's
 * (its block weights kept as blocks by linear layers, the rest decoded), --weight-type's
 * quantization, decoding at load. */
typedef struct cdf_plan_weights_opts {
    const char *class_name; /* the component's class: which 2-d weights its linear layers read */
    const char *file;       /* NULL, or the component's file, planned from its own tensors (of an
                               all-in-one file: those of this component's part) */
    const char *key;        /* the component's model_index name ("transformer", "vae", ...) */
    const char *text_part;  /* a text encoder's part of an all-in-one file ("clip_l", ...), or NULL */
    uint32_t quantize_to;   /* cdf_pipeline_load_params.quantize_weights */
    bool decode_quantized;
} cdf_plan_weights_opts;
/* cdf_plan_block_bytes with o (NULL: a plain folder load): quantized linear weights count their
 * block bytes exactly (numel / block * block bytes). */
cdf_status cdf_plan_block_bytes_opts(const char *dir, cdf_dtype weight_dtype, const cdf_plan_weights_opts *o,
                                     cdf_plan_blocks *out);
/* True if a model of class_name loads the 2-d tensor `name` as a linear layer's [out, in] weight
 * (cdf_linear_load: the weights GGUF blocks stay blocks for, and --weight-type quantizes);
 * tests/test_memory_plan.c checks it against what the loaders actually read. */
bool cdf_plan_is_linear_weight(const char *class_name, const char *name, int ndim);

/* Offload's prefetch of the next phase's model (offload.c, cdf_memory_plan.phase[].prefetch) for
 * a device whose memory is (host_memory) or is not the host's. By default only where the device
 * has its own memory (cuda, pjrt, the cpu backend's discrete test mode): on the cpu backend a
 * model's "upload" is the conversion from the memory-mapped file, which a prefetch cannot
 * overlap with anything (measured slower: bench/history/06-offload.md) while it raises the peak
 * by the previous model's weights, the memory offload is asked to save.
 * CDIFFUSERS_OFFLOAD_PREFETCH=0 turns it off, =1 on everywhere (read at each call). */
bool cdf_plan_prefetch_enabled(bool host_memory);

/* "12.3 MiB" */
void cdf_plan_format_bytes(char *buf, size_t n, uint64_t bytes);

#endif
