/* The Mistral language model as FLUX.2 uses it for text: transformers' Mistral3ForConditionalGeneration
 * (its language model only; the vision tower and projector are never loaded) or a plain
 * MistralModel / MistralForCausalLM checkpoint. The pipeline needs hidden states of chosen layers,
 * not logits, so lm_head is never loaded either.
 *
 * Registered as the component cdf_mistral3_text_class (run-model, tests); these functions give the
 * Flux2Pipeline direct, typed access and let it load only the layers it uses (FLUX.2-dev reads
 * layers 10, 20, 30 of 40: the last 9 layers and the final norm are never needed).
 *
 * Outputs are created like the result of a tensor op: inside a cdf_scope they are recorded in the
 * caller's current scope; outside any scope they are new references the caller releases. On
 * failure every output is NULL and nothing is left behind. */
#ifndef CDF_MISTRAL3_TEXT_H
#define CDF_MISTRAL3_TEXT_H

#include "nn/nn.h"

typedef struct cdf_mistral3_text cdf_mistral3_text;

/* FLUX.2's default text_encoder_out_layers. */
#define CDF_FLUX2_TEXT_LAYERS_DEFAULT {10, 20, 30}

/* Load <dir>/config.json + weights. config: Mistral3 form (text_config; absent keys take
 * transformers' MistralConfig defaults, an absent text_config Mistral3Config's default = the
 * Mistral-Small-3.1 text model) or plain Mistral form (architectures MistralModel /
 * MistralForCausalLM). Weight names: "model.language_model.", "language_model.model." (legacy
 * Mistral3), "model." (MistralForCausalLM) or "" (MistralModel) before "embed_tokens.weight",
 * "layers.{i}.self_attn.{q,k,v,o}_proj.weight", "layers.{i}.mlp.{gate,up,down}_proj.weight",
 * "layers.{i}.{input,post_attention}_layernorm.weight", "norm.weight" — the form is detected
 * from where embed_tokens.weight is.
 *
 * max_hidden_state: the largest hidden_states index the caller will ask for (0 = embeddings,
 * k = output of layer k, num_layers = final norm of the last layer's output); layers above it and
 * the final norm (unless it is num_layers) are not loaded. < 0 = everything.
 * Errors: those of the config/checkpoint readers; CDF_ERR_NOT_FOUND / CDF_ERR_SHAPE naming a
 * missing or wrongly shaped tensor; CDF_ERR_FORMAT / CDF_ERR_UNSUPPORTED for a bad or
 * unsupported config value (rope_scaling, an activation other than silu). */
cdf_status cdf_mistral3_text_load(const char *dir, const cdf_load_options *opt, int max_hidden_state,
                                  cdf_mistral3_text **out);
void cdf_mistral3_text_free(cdf_mistral3_text *m); /* NULL is fine */
int64_t cdf_mistral3_text_hidden_size(const cdf_mistral3_text *m);
int64_t cdf_mistral3_text_num_layers(const cdf_mistral3_text *m); /* the config's num_hidden_layers */

/* hidden_states[layers[i]] for each i, stacked: *hidden_states = [B, n_layers, S, hidden] f32.
 * input_ids: [B, S] i64 or i32, ids in [0, vocab_size), 1 <= S <= 16384.
 * attention_mask: NULL (every token real) or [B, S] of any dtype, nonzero = real token. Key j is
 * visible from query i iff j <= i, attention_mask[j] != 0 (and i - j < sliding_window when the
 * config sets one), as transformers builds the mask; position ids are 0..S-1 in every row (not
 * derived from the mask). A query that sees no key at all (only possible when attention_mask of
 * the first token is 0, i.e. left padding) gets a zero attention output.
 * layers: n_layers (1..64) indices in [-(num_layers + 1), num_layers]; negative ones count from
 * the end as in Python; each must be <= the max_hidden_state the model was loaded for. */
cdf_status cdf_mistral3_hidden_states(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask,
                                      const int *layers, int n_layers, cdf_tensor **hidden_states);

/* FLUX.2's prompt_embeds (Flux2Pipeline._get_mistral_3_small_prompt_embeds): the chosen hidden
 * states stacked and flattened per token, *prompt_embeds = [B, S, n_layers * hidden] with
 * channel i * hidden + h = hidden_states[layers[i]][..., h]. Arguments as above. */
cdf_status cdf_mistral3_encode(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask,
                               const int *layers, int n_layers, cdf_tensor **prompt_embeds);

/* The RoPE tables the model uses (transformers' "default" rope, float32 like torch): inv_freq[i] =
 * 1 / theta^(2i / head_dim) for i < head_dim / 2, cos/sin[p][j] = cos/sin(p * inv_freq[j mod
 * head_dim / 2]) for p < seq_len. Any output may be NULL; cos/sin hold seq_len * head_dim floats. */
cdf_status cdf_mistral3_rope_tables(const cdf_mistral3_text *m, int64_t seq_len, float *inv_freq, float *cos_out,
                                    float *sin_out);

#endif
