/* The request and the folder, before any model runs: the public parameter structs' defaults,
 * a request's defaults resolved for a loaded pipeline (size, steps, guidance, sequence length),
 * how many images it makes, and model_index.json's class entries. */
#include <stdlib.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"

cdf_pipeline_load_params cdf_pipeline_load_params_default(void) {
    /* bf16 compute by default (the speed issue): bf16 weights, matmul inputs rounded to bf16 */
    return (cdf_pipeline_load_params){.device = NULL, .weight_dtype = CDF_BF16};
}

cdf_generate_params cdf_generate_params_default(void) {
    return (cdf_generate_params){.prompt = "", .guidance_scale = -1.0, .true_cfg_scale = 1.0, .seed = 0, .strength = 0.6};
}

/* model_index.json entry: ["library", "Class"]. The component is absent (*cls = NULL) when the
 * key is missing, null, or its class is null (diffusers writes [null, null] for a left-out
 * optional component); any other shape (a number, an object, a one-element array, a class that
 * is not a string) is malformed, and saying "absent" there would send the user looking for a
 * folder instead of at the file. */
cdf_status cdf_model_index_class(const char *dir, const cJSON *idx, const char *key, const char **cls) {
    *cls = NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(idx, key);
    if (!e || cJSON_IsNull(e)) return CDF_OK;
    const cJSON *lib = cJSON_GetArrayItem(e, 0), *c = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !(cJSON_IsString(lib) || cJSON_IsNull(lib)) ||
        !(cJSON_IsString(c) || cJSON_IsNull(c)))
        return cdf_error(CDF_ERR_FORMAT, "%s/model_index.json: entry '%s' is malformed (expected [\"library\", \"ClassName\"] or [null, null])",
                         dir, key);
    if (cJSON_IsString(c)) *cls = c->valuestring;
    return CDF_OK;
}

void cdf_pipeline_resolve_defaults(const cdf_pipeline *p, cdf_generate_params *gp) {
    int64_t def = p->default_sample_size * p->vae_scale_factor;
    const int mult = p->vae_scale_factor * 2;
    if (gp->image && p->kind == CDF_PIPE_FLUX2 && gp->image->pixels) {
        /* Flux2Pipeline: the first reference image's (cropped) size */
        int w, h;
        cdf_pipe_reference_size(gp->image, &w, &h);
        if (gp->height <= 0) gp->height = h;
        if (gp->width <= 0) gp->width = w;
    } else if (gp->image && gp->image->width >= mult && gp->image->height >= mult) {
        /* img2img: the image's size, rounded down to what the model can take (diffusers would use
         * the model's default size and stretch the image) */
        if (gp->height <= 0) gp->height = gp->image->height / mult * mult;
        if (gp->width <= 0) gp->width = gp->image->width / mult * mult;
    }
    if (gp->height <= 0) gp->height = (int)def;
    if (gp->width <= 0) gp->width = (int)def;
    if (gp->num_inference_steps <= 0) gp->num_inference_steps = p->kind == CDF_PIPE_FLUX2 ? 50 : 28;
    if (gp->guidance_scale < 0) gp->guidance_scale = p->kind == CDF_PIPE_FLUX ? 3.5 : p->kind == CDF_PIPE_FLUX2 ? 4.0 : 7.0;
    if (gp->max_sequence_length <= 0) gp->max_sequence_length = p->kind == CDF_PIPE_SD3 ? 256 : 512;
    if (gp->true_cfg_scale <= 0) gp->true_cfg_scale = 1.0;
}

