/* Flux2Pipeline entry points besides cdf_pipeline_generate (private to the library and its tests). */
#ifndef CDF_FLUX2_PIPELINE_H
#define CDF_FLUX2_PIPELINE_H

#include "pipelines/pipeline_impl.h"

/* The whole pipeline from precomputed prompt embeddings, like diffusers'
 * pipe(prompt_embeds=...): the tokenizer and text encoder are not used; text ids follow the
 * embeddings' length. prompt_embeds: [1, L, joint_attention_dim]. params are resolved and
 * checked like cdf_pipeline_generate's; the prompt is ignored. */
cdf_status cdf_flux2_generate_from_embeds(cdf_pipeline *p, const cdf_generate_params *params, cdf_tensor *prompt_embeds,
                                          cdf_image *out);

#endif
