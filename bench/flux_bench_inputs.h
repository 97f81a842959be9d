/* Shared by bench/modes, bench/lora and bench/pjrt: a monotonic clock, pseudo-random device tensors and the
 * inputs of one FLUX.1 transformer forward at a given resolution (512 text tokens, T5-XXL and
 * CLIP-L widths, guidance 3.5). Header-only: each bench is one translation unit built by run.sh. */
#ifndef CDF_BENCH_FLUX_BENCH_INPUTS_H
#define CDF_BENCH_FLUX_BENCH_INPUTS_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"

#ifdef MRP_NO_MAIN /* with tools/make-random-pipeline/make_random_pipeline.c included */
/* Only the transformer runs in these benches: the text encoders and the VAE of the random
 * pipeline stay tiny, keeping the pooled widths real (SD3: the 768 + 1280 projections; FLUX:
 * CLIP-L's 768) and T5-XXL's 4096 (the transformer's context width). */
static void bench_tiny_encoders(mrp_spec *s, bool sd3) {
    s->clip_l = sd3 ? (mrp_clip){.hidden = 8, .layers = 1, .heads = 2, .intermediate = 16, .projection = 768}
                    : (mrp_clip){.hidden = 768, .layers = 1, .heads = 2, .intermediate = 16, .projection = 0};
    s->clip_g = (mrp_clip){.hidden = 8, .layers = 1, .heads = 2, .intermediate = 16, .projection = 1280};
    s->t5 = (mrp_t5){.d_model = 4096, .layers = 1, .heads = 2, .d_kv = 8, .d_ff = 16};
    s->vae = (mrp_vae){.n_blocks = 4, .channels = {8, 8, 8, 8}, .layers_per_block = 1, .groups = 4};
}
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* uniform in [-scale, scale], xorshift seeded by `seed` */
static cdf_tensor *randt(cdf_device *d, int nd, const int64_t *shape, uint64_t seed, float scale) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v[i] = scale * (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    cdf_tensor *t = cdf_tensor_from_host(d, CDF_F32, nd, shape, v, CDF_F32);
    free(v);
    return t;
}

/* FluxTransformer2DModel.forward's arguments for a res x res image (latents res/8, 2x2 patches). */
static void flux_bench_inputs(cdf_device *dev, int res, cdf_tensor_map *in) {
    const int64_t lat = res / 8, L = (lat / 2) * (lat / 2);
    int64_t hs[3] = {1, L, 64}, es[3] = {1, 512, 4096}, ps[2] = {1, 768}, ts[1] = {1}, is[2] = {L, 3}, xs[2] = {512, 3};
    cdf_tensor_map_set(in, "hidden_states", randt(dev, 3, hs, 1, 1));
    cdf_tensor_map_set(in, "encoder_hidden_states", randt(dev, 3, es, 2, 1));
    cdf_tensor_map_set(in, "pooled_projections", randt(dev, 2, ps, 3, 1));
    cdf_tensor_map_set(in, "timestep", cdf_tensor_full(dev, CDF_F32, 1, ts, 0.5));
    cdf_tensor_map_set(in, "guidance", cdf_tensor_full(dev, CDF_F32, 1, ts, 3.5));
    float *ids = calloc((size_t)L * 3, sizeof *ids);
    for (int64_t r = 0; r < lat / 2; r++)
        for (int64_t c = 0; c < lat / 2; c++) {
            ids[(r * (lat / 2) + c) * 3 + 1] = (float)r;
            ids[(r * (lat / 2) + c) * 3 + 2] = (float)c;
        }
    cdf_tensor_map_set(in, "img_ids", cdf_tensor_from_host(dev, CDF_F32, 2, is, ids, CDF_F32));
    cdf_tensor_map_set(in, "txt_ids", cdf_tensor_zeros(dev, CDF_F32, 2, xs));
    free(ids);
}
#endif
