/* VAE tiling for the pipelines (cdf_generate_params.vae_tiling): which tile size a request's VAE
 * calls use (the component inputs that switch it on, models/vae.h's CDF_VAE_TILING_INPUTS, are
 * added by steps.c's cdf_pipe_vae_tiling_inputs).
 *
 * AUTO asks the memory planner (planner.c) whether the decode phase fits the device budget; if
 * not, it tries tiles from the VAE's sample_size down, halving, until the planned tiled decode
 * fits (or the smallest sensible tile is reached), and says so on stderr: the image then differs
 * slightly from the untiled one, so it must not happen silently. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

/* The VAE config's sample_size (enable_tiling()'s tile; a list: its first entry). */
static int64_t vae_sample_size(const cdf_pipeline *p) {
    const cJSON *cfg = p->vae ? cdf_component_config(p->vae) : NULL;
    const cJSON *ss = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "sample_size") : NULL;
    if (cJSON_IsArray(ss)) ss = ss->child;
    if (cJSON_IsNumber(ss) && ss->valuedouble >= 1) return (int64_t)ss->valuedouble;
    return p->kind == CDF_PIPE_FLUX2 ? 1024 : 32; /* the classes' defaults */
}

cdf_status cdf_pipe_vae_tiling_check(const cdf_pipeline *p, const cdf_generate_params *gp) {
    if (gp->vae_tiling < CDF_VAE_TILING_AUTO || gp->vae_tiling > CDF_VAE_TILING_OFF)
        return cdf_error(CDF_ERR_INVALID_ARG, "vae_tiling must be auto (0), on (1) or off (2), got %d", gp->vae_tiling);
    /* tiles of 4k latents keep diffusers' blend and step consistent (the output has the image's
     * size): a step of 3k latents = 3k * f pixels = the tile minus its blended quarter */
    const int mult = 4 * p->vae_scale_factor;
    if (gp->vae_tile_size < 0 || gp->vae_tile_size % mult || gp->vae_tile_size > 4096)
        return cdf_error(CDF_ERR_INVALID_ARG, "the VAE tile size must be a multiple of %d pixels up to 4096 (got %d)", mult,
                         gp->vae_tile_size);
    return CDF_OK;
}

/* The decode phase's planned peak with tiles of `tile` pixels (0: untiled). */
static cdf_status planned_decode(const cdf_pipeline *p, const cdf_generate_params *gp, int tile, uint64_t *peak) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.device = cdf_device_name(p->device); /* pjrt with the XLA CPU plugin: its convolutions' temporaries */
    lp.weight_dtype = p->opt.weight_dtype;
    lp.offload = p->offload;
    cdf_generate_params g = *gp;
    g.vae_tiling = tile ? CDF_VAE_TILING_ON : CDF_VAE_TILING_OFF;
    g.vae_tile_size = tile;
    cdf_memory_plan plan;
    CDF_TRY(cdf_pipeline_plan_memory(p->dir, &lp, &g, &plan));
    *peak = plan.phase[CDF_PHASE_DECODE].peak_bytes;
    return CDF_OK;
}

void cdf_pipe_vae_tiling_resolve(cdf_pipeline *p, const cdf_generate_params *gp) {
    p->vae_tile = 0;
    if (gp->vae_tiling == CDF_VAE_TILING_OFF) return;
    const int64_t sample = gp->vae_tile_size > 0 ? gp->vae_tile_size : vae_sample_size(p);
    if (gp->vae_tiling == CDF_VAE_TILING_ON) {
        p->vae_tile = sample;
        return;
    }
    uint64_t limit = 0;
    if (p->phase_limit_active) limit = p->phase_limit[CDF_PHASE_DECODE];
    if (!limit) {
        cdf_memory_stats st;
        cdf_device_memory_stats(p->device, &st);
        limit = st.limit_bytes;
    }
    if (!limit) return; /* no budget: nothing to fit */
    uint64_t untiled = 0;
    if (planned_decode(p, gp, 0, &untiled) != CDF_OK) {
        cdf_clear_error(); /* a folder the planner cannot read: decode as asked */
        return;
    }
    if (untiled <= limit) return;
    /* from the sample size down, halving, in multiples of 4 latents, the first that fits; not
     * below a quarter of the sample size (FLUX/SD3: 256 pixels): smaller tiles see too little
     * context and their seams show (bench/RESULTS.md, "VAE tiling") */
    const int64_t mult = 4 * (int64_t)p->vae_scale_factor;
    const int64_t smallest = sample / 4 > mult ? (sample / 4 + mult - 1) / mult * mult : mult;
    const int64_t longest = (gp->height > gp->width ? gp->height : gp->width);
    int64_t tile = sample - sample % mult, fits = 0;
    uint64_t need = untiled;
    for (; tile >= smallest && tile >= mult; tile = (tile / 2) - (tile / 2) % mult) {
        if (tile >= longest) continue; /* no tiling at this size */
        if (planned_decode(p, gp, (int)tile, &need) != CDF_OK) {
            cdf_clear_error();
            return;
        }
        fits = tile;
        if (need <= limit) break;
    }
    if (!fits) return;
    char b1[32], b2[32], b3[32];
    cdf_plan_format_bytes(b1, sizeof b1, untiled);
    cdf_plan_format_bytes(b2, sizeof b2, limit);
    cdf_plan_format_bytes(b3, sizeof b3, need);
    fprintf(stderr,
            "cdiffusers: the VAE decode of %dx%d would need about %s, over the %s device budget: decoding in tiles of %lld "
            "pixels (about %s; diffusers' enable_tiling(), the image differs slightly from an untiled decode; "
            "--vae-tiling off refuses)\n",
            gp->width, gp->height, b1, b2, (long long)fits, b3);
    p->vae_tile = fits;
}
