/* Text encoders as direct C calls for the pipelines: the CLIP text tower (transformers
 * CLIPTextModel / CLIPTextModelWithProjection) and the T5 v1.1 encoder (T5EncoderModel).
 *
 * The same models are also registered as components (cdf_clip_text_class,
 * cdf_t5_encoder_class) for `run-model` and the tests; these functions give the pipelines what
 * the component interface cannot: a choice of hidden state (clip_skip) and typed outputs.
 *
 * Outputs are created like the result of a tensor op: inside a cdf_scope they are recorded in
 * the caller's current scope (keep them with cdf_scope_pop(keep, n)); outside any scope they
 * are new references the caller releases with cdf_tensor_release. On failure every output is
 * NULL and nothing is left behind. */
#ifndef CDF_TEXT_ENCODERS_H
#define CDF_TEXT_ENCODERS_H

#include "nn/nn.h"

/* ---- CLIP text tower ------------------------------------------------------------------------ */
typedef struct cdf_clip_text cdf_clip_text;

/* Load <dir>/config.json + weights. architectures[0] "CLIPTextModelWithProjection" requires
 * text_projection.weight; "CLIPTextModel" (FLUX's text_encoder) has no projection. Errors:
 * those of the config/checkpoint readers, CDF_ERR_NOT_FOUND / CDF_ERR_SHAPE naming a missing or
 * wrongly shaped tensor, CDF_ERR_FORMAT / CDF_ERR_UNSUPPORTED for a bad config value. */
cdf_status cdf_clip_text_load(const char *dir, const cdf_load_options *opt, cdf_clip_text **out);
void cdf_clip_text_free(cdf_clip_text *m); /* NULL is fine */
int64_t cdf_clip_text_hidden_size(const cdf_clip_text *m);
int64_t cdf_clip_text_num_layers(const cdf_clip_text *m);
int64_t cdf_clip_text_max_positions(const cdf_clip_text *m);
/* projection_dim when the model has text_projection, else 0. */
int64_t cdf_clip_text_projection_dim(const cdf_clip_text *m);

typedef struct cdf_clip_text_output {
    cdf_tensor *last_hidden_state; /* [B, S, hidden] final_layer_norm(output of the last layer) */
    cdf_tensor *hidden_state;      /* [B, S, hidden] hidden_states[-(clip_skip + 2)], no final norm:
                                      clip_skip 0 = the penultimate layer's output (what SD3 uses) */
    cdf_tensor *pooler_output;     /* [B, hidden] last_hidden_state at the eos position */
    cdf_tensor *text_embeds;       /* [B, projection_dim] pooler_output @ text_projection^T; NULL
                                      for a model without projection */
} cdf_clip_text_output;

/* input_ids: [B, S] i64 or i32 (any device), 1 <= S <= max_position_embeddings, every id in
 * [0, vocab_size). Only the causal mask is applied (the pipelines pass no padding mask).
 * clip_skip: 0 .. num_layers - 1 (hidden_states has num_layers + 1 entries, the first being the
 * embeddings). The pooled position is argmax(input_ids) when the config's eos_token_id is 2 (the
 * legacy value real CLIP configs carry), else the first position holding eos_token_id. */
cdf_status cdf_clip_text_encode(cdf_clip_text *m, cdf_tensor *input_ids, int clip_skip, cdf_clip_text_output *out);

/* ---- T5 encoder ----------------------------------------------------------------------------- */
typedef struct cdf_t5_encoder cdf_t5_encoder;

/* Load <dir>/config.json + weights (architectures[0] "T5EncoderModel"). Errors as above. */
cdf_status cdf_t5_encoder_load(const char *dir, const cdf_load_options *opt, cdf_t5_encoder **out);
void cdf_t5_encoder_free(cdf_t5_encoder *m); /* NULL is fine */
int64_t cdf_t5_encoder_d_model(const cdf_t5_encoder *m);

/* input_ids [B, L] i64 or i32, ids in [0, vocab_size), no attention mask (padding tokens are
 * attended to, as in the FLUX/SD3 pipelines). *last_hidden_state = [B, L, d_model] f32. */
cdf_status cdf_t5_encode(cdf_t5_encoder *m, cdf_tensor *input_ids, cdf_tensor **last_hidden_state);

/* transformers T5Attention._relative_position_bucket for one relative position
 * (key_pos - query_pos), with the logarithmic part evaluated in float32 as torch does. */
int64_t cdf_t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                        int64_t max_distance);

#endif
