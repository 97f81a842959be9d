/* compile for pipelines: the denoiser and the VAE. */
#include "cdiffusers/exec.h"
#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"

cdf_status cdf_pipeline_compile(cdf_pipeline *p, const cdf_compile_options *opt) {
    if (!p) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_compile: pipeline is NULL");
    CDF_TRY(cdf_component_compile(p->transformer, opt));
    /* sequential offload compiles the transformer per block (offload.c) */
    if (p->offload == CDF_OFFLOAD_SEQUENTIAL) CDF_TRY(cdf_component_set_blocks_on_host(p->transformer, true));
    return cdf_component_compile(p->vae, opt);
}

cdf_status cdf_pipeline_compile_repeated_blocks(cdf_pipeline *p, const cdf_compile_options *opt) {
    if (!p) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_compile_repeated_blocks: pipeline is NULL");
    return cdf_component_compile_repeated_blocks(p->transformer, opt);
}
