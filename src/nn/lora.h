/* nn/lora — LoRA adapters on linear layers, below any file format (models/lora_file.c parses
 * files; pipelines/lora.c decides which layer gets what).
 *
 * Run-time mode (PEFT's math): y = W x + b + sum_i s_i * (alpha_i / r_i) * B_i (A_i x). W is never
 * touched, so the same path serves any storage of W (f32, bf16, and quantized weights later): the
 * adapter is a separate low-rank product added to the linear's output. The adapters of one layer
 * are kept concatenated — A = [A_1; A_2; ...] ([R, in], R = sum r_i), B = [B_1 c_1, B_2 c_2, ...]
 * ([out, R], c_i = alpha_i / r_i folded in at attach) — and the scales are a separate [R] tensor
 * (s_i repeated r_i times) multiplied between the two products: three tensors per layer however
 * many adapters, and changing a scale replaces only that small tensor. Layers with the same
 * adapters and ranks share one scale tensor (a "slot"), so a model holds a handful of them; whole-
 * model compile binds them as graph parameters and repeated-block compile lists them with the
 * block's weights, which is why a new scale never recompiles.
 *
 * Fused mode: W <- W + s (alpha/r) B A once (diffusers' fuse_lora), computed on the device in f32
 * and stored back in W's dtype.
 *
 * A layer's run-time adapters are its one hook (cdf_linear_hook, nn/nn.h): the linear layer's
 * forward, block weight list and free call them through it, so nn/weights.c and nn/sharded.c never
 * call this file; this file calls theirs (cdf_linear_decode) and nn/layer_index.c. */
#ifndef CDF_NN_LORA_H
#define CDF_NN_LORA_H

#include "nn/nn.h"

#define CDF_LORA_MAX_ADAPTERS 16

/* The layers are found by module name in a cdf_layer_index (nn/nn.h, filled while a model loads). */

/* ---- the per-component scale state ------------------------------------------------------- */
typedef struct cdf_lora_scales cdf_lora_scales;
cdf_lora_scales *cdf_lora_scales_new(cdf_device *dev);
void cdf_lora_scales_free(cdf_lora_scales *sc); /* after every link using it is freed */
/* Set adapter `adapter`'s scale (0..CDF_LORA_MAX_ADAPTERS-1): every slot holding it gets a new
 * tensor (no device memory is written in place: queued and captured work keeps the old one). */
cdf_status cdf_lora_scales_set(cdf_lora_scales *sc, int adapter, float scale);
float cdf_lora_scales_get(const cdf_lora_scales *sc, int adapter);
/* The current slot tensors (borrowed), for binding as graph parameters: the first `max` go to
 * out; returns how many there are (may exceed max). */
int cdf_lora_scales_tensors(const cdf_lora_scales *sc, cdf_tensor **out, int max);

/* ---- attaching ---------------------------------------------------------------------------- */
/* Run-time: add adapter `adapter` to layer l. a: [r, l->in] f32, b: [l->out, r] f32 with the
 * alpha/r factor already applied (references are taken). For a tensor-parallel shard these are
 * the shard's slices (cdf_linear_shard_in_cols / _out_rows of the whole-layer pair): a colwise
 * shard keeps all of A and its rows of B, a rowwise one its columns of A and all of B (its
 * partial product joins the layer's all-reduce). Errors: shapes (naming `what`), the same
 * adapter twice on one layer. */
cdf_status cdf_lora_attach(cdf_lora_scales *sc, cdf_linear_layer *l, int adapter, cdf_tensor *a, cdf_tensor *b,
                           const char *what);
/* Fused: l->w <- l->w + scale * b @ a, in f32, stored in l->w's dtype (a new tensor replaces
 * l->w; compiled graphs that captured the old one must be dropped by the caller). A shard takes
 * its slices as for attach: the product is its slice of the whole delta. */
cdf_status cdf_lora_fuse(cdf_linear_layer *l, cdf_tensor *a, cdf_tensor *b, float scale, const char *what);
/* Remove every run-time adapter from l (nothing if none). */
void cdf_lora_detach(cdf_linear_layer *l);

/* ---- what was applied where: undo (unfuse) and replay (offload) ----------------------------- */
/* A log of applied adapters by module name: fused ones so that they can be taken out again
 * (diffusers' unfuse_lora; PEFT subtracts the same delta, W <- W - s B A, which cdiffusers does
 * only where it cannot read the original weight again), and
 * both kinds so that a model re-materialised by offload (new layer objects, weights read again
 * from its files) gets them again. The layers are found by module name each time. The A/B
 * tensors are kept (references, shared with the run-time links): rank x (in + out) per layer,
 * small next to W; they stay resident on the device while the model is offloaded. */
typedef struct cdf_lora_log cdf_lora_log;
/* Record that `layer` got adapter `adapter` (run time) or scale * b @ a (fused); references taken. */
cdf_status cdf_lora_log_add(cdf_lora_log **log, const char *layer, int adapter, cdf_tensor *a, cdf_tensor *b, float scale);
/* Apply every record again in order to the layers of ix: attached as run-time adapters to sc, or
 * fused (sc NULL). The same inputs in the same order: the same weights and links as before. */
cdf_status cdf_lora_log_replay(const cdf_lora_log *log, const cdf_layer_index *ix, cdf_lora_scales *sc);
/* Take every fused adapter out of the layers of ix, then empty the log. Each layer the log names
 * is first given to restore (when not NULL), which puts back the weight the layer had before any
 * fuse — bit for bit, by reading it again from its files (models/registry.c; a tensor-parallel
 * shard reads its own slice, cdf_linear_reload_weight). Where there is no restore or it fails
 * (a warning says why), the recorded deltas are subtracted, the last fused first, each computed
 * exactly as cdf_lora_fuse computed it (the negated product: W + (-s B) A): W + d - d is W up to
 * one rounding of W's dtype per element. A layer that is gone is an error naming it (the rest
 * are still undone). */
typedef cdf_status (*cdf_lora_restore_fn)(void *ctx, cdf_linear_layer *l, const char *layer);
cdf_status cdf_lora_log_unfuse(cdf_lora_log **log, const cdf_layer_index *ix, cdf_lora_restore_fn restore, void *ctx);
int cdf_lora_log_count(const cdf_lora_log *log);
void cdf_lora_log_free(cdf_lora_log *log); /* NULL is fine */

#endif
