/* FLUX.2 VAE: diffusers AutoencoderKLFlux2 (autoencoder_kl_flux2.py at 58eb52c) on top of the
 * shared KL autoencoder (models/vae.h), plus the pipeline's latent layout and BatchNorm
 * normalisation (see autoencoder_kl_flux2.h).
 *
 * AutoencoderKLFlux2 is AutoencoderKL with other class defaults (32 latent channels, four
 * 128/256/512/512 blocks, 2 layers per block), an optional decoder_block_out_channels, and a
 * BatchNorm2d(prod(patch_size) * latent_channels, affine=False) whose running statistics only the
 * pipeline reads. Tiling and slicing (off by default in diffusers) are not implemented. */
#include "models/autoencoder_kl_flux2.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "io/json.h"

#define MODEL "AutoencoderKLFlux2"

/* Largest latent grid side / cell count the unpacking accepts (a 16k x 16k image is 1024^2). */
#define MAX_GRID_SIDE (1 << 16)
#define MAX_GRID_CELLS (1 << 26)

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }

/* ==== config ================================================================================ */

/* AutoencoderKLFlux2.__init__ defaults. */
static cdf_vae_config flux2_defaults(void) {
    cdf_vae_config c = cdf_vae_config_kl_defaults();
    c.latent_channels = 32;
    c.layers_per_block = 2;
    c.norm_num_groups = 32;
    c.n_blocks = 4;
    const int64_t ch[4] = {128, 256, 512, 512};
    for (int i = 0; i < 4; i++) c.block_out_channels[i] = c.decoder_block_out_channels[i] = ch[i];
    c.use_quant_conv = c.use_post_quant_conv = true;
    c.scaling_factor = 1.0; /* the class has no scaling factor; Flux2Pipeline normalises with `bn` */
    c.sample_size = 1024;
    return c;
}

/* The shared parser takes an absent down/up_block_types as AutoencoderKL's one-entry default;
 * this class's default is four entries. A copy of the config gets the class default filled in,
 * so that a mismatch with block_out_channels is reported exactly as diffusers would fail. */
static cdf_status fill_block_type_defaults(const cJSON *cfg, cJSON **out) {
    *out = cJSON_Duplicate(cfg, 1);
    if (!*out) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (config copy)");
    const char *keys[2] = {"down_block_types", "up_block_types"};
    const char *types[2] = {"DownEncoderBlock2D", "UpDecoderBlock2D"};
    for (int k = 0; k < 2; k++) {
        if (cdf_json_has(*out, keys[k])) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(*out, keys[k]); /* an explicit null */
        cJSON *arr = cJSON_AddArrayToObject(*out, keys[k]);
        for (int i = 0; arr && i < 4; i++) {
            cJSON *s = cJSON_CreateString(types[k]);
            if (!s || !cJSON_AddItemToArray(arr, s)) arr = NULL;
        }
        if (!arr) {
            cJSON_Delete(*out);
            *out = NULL;
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (config copy)");
        }
    }
    return CDF_OK;
}

static cdf_status parse_config(const cJSON *cfg, const char *source, cdf_vae_config *c, cdf_flux2_vae *v) {
    cJSON *filled = NULL;
    CDF_TRY(fill_block_type_defaults(cfg, &filled));
    const cdf_vae_config defaults = flux2_defaults();
    cdf_status s = cdf_vae_config_parse(filled, &defaults, source, c);
    cJSON_Delete(filled);
    CDF_TRY(s);

    /* decoder_block_out_channels: `decoder_block_out_channels or block_out_channels` */
    if (cdf_json_has(cfg, "decoder_block_out_channels")) {
        int n = 0;
        CDF_TRY(cdf_json_get_int_array(cfg, "decoder_block_out_channels", c->decoder_block_out_channels, CDF_VAE_MAX_BLOCKS, &n));
        if (n != c->n_blocks)
            return cdf_error(CDF_ERR_FORMAT, "%s: decoder_block_out_channels has %d entries but there are %d blocks", source, n,
                             c->n_blocks);
        CDF_TRY(cdf_vae_config_validate(c, source));
    }

    CDF_TRY(cdf_json_get_double(cfg, "batch_norm_eps", 1e-4, &v->batch_norm_eps));
    if (!(v->batch_norm_eps >= 0 && v->batch_norm_eps < 1))
        return cdf_error(CDF_ERR_FORMAT, "%s: batch_norm_eps = %g is outside [0, 1)", source, v->batch_norm_eps);
    if (cdf_json_has(cfg, "patch_size")) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cfg, "patch_size");
        if (cJSON_IsNumber(ps)) { /* a bare number: math.prod would fail in diffusers */
            return cdf_error(CDF_ERR_FORMAT, "%s: patch_size must be a list like [2, 2]", source);
        }
        CDF_TRY(cdf_json_get_int_array(cfg, "patch_size", v->patch_size, 4, &v->n_patch));
    } else {
        v->n_patch = 2;
        v->patch_size[0] = v->patch_size[1] = 2;
    }
    int64_t prod = 1;
    for (int i = 0; i < v->n_patch; i++) {
        if (v->patch_size[i] < 1 || v->patch_size[i] > 64)
            return cdf_error(CDF_ERR_FORMAT, "%s: patch_size[%d] = %lld is outside 1..64", source, i, (long long)v->patch_size[i]);
        prod *= v->patch_size[i];
    }
    v->bn_channels = prod * c->latent_channels;
    if (v->bn_channels > CDF_VAE_MAX_CHANNELS * 64)
        return cdf_error(CDF_ERR_FORMAT, "%s: prod(patch_size) x latent_channels = %lld is too large", source,
                         (long long)v->bn_channels);
    return CDF_OK;
}

/* ==== loading ================================================================================ */

static void flux2_vae_release(cdf_flux2_vae *v) {
    if (!v) return;
    cdf_autoencoder_kl_release(&v->kl);
    cdf_tensor_release(v->bn_mean);
    cdf_tensor_release(v->bn_var);
    v->bn_mean = v->bn_var = NULL;
}

static cdf_status flux2_vae_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    char source[4200];
    snprintf(source, sizeof source, "%s/config.json", dir);
    cdf_flux2_vae *v = calloc(1, sizeof *v);
    if (!v) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_vae_config c;
    cdf_status s = parse_config(cfg, source, &c, v);
    cdf_weights *w = NULL;
    if (s == CDF_OK) s = cdf_weights_open(dir, opt, &w);
    if (s == CDF_OK) s = cdf_autoencoder_kl_load_weights(w, &c, &v->kl);
    if (s == CDF_OK) {
        /* the statistics stay f32 whatever the weight dtype (a bf16 checkpoint upcasts exactly) */
        int64_t shape[1] = {v->bn_channels};
        v->bn_mean = cdf_weights_get_f32(w, 1, shape, "bn.running_mean");
        v->bn_var = v->bn_mean ? cdf_weights_get_f32(w, 1, shape, "bn.running_var") : NULL;
        if (!v->bn_mean || !v->bn_var) s = status_or_internal();
    }
    cdf_weights_free(w); /* the loaded tensors are device copies */
    if (s != CDF_OK) {
        flux2_vae_release(v);
        free(v);
        return s;
    }
    *impl = v;
    return CDF_OK;
}

static void flux2_vae_free(void *impl) {
    flux2_vae_release(impl);
    free(impl);
}

/* ==== latent layout =========================================================================== */

static cdf_tensor *shape_fail(const char *fn, const cdf_tensor *x, const char *want) {
    char buf[128];
    cdf_error(CDF_ERR_SHAPE, "%s: %s but must be %s", fn, cdf_tensor_describe(x, buf, sizeof buf), want);
    return NULL;
}

cdf_tensor *cdf_flux2_patchify_latents(cdf_tensor *x) {
    if (!x) return NULL;
    if (cdf_tensor_ndim(x) != 4 || cdf_tensor_dim(x, 2) % 2 || cdf_tensor_dim(x, 3) % 2)
        return shape_fail("flux2 patchify_latents", x, "[B, C, H, W] with even H and W");
    const int64_t B = cdf_tensor_dim(x, 0), C = cdf_tensor_dim(x, 1), H = cdf_tensor_dim(x, 2), W = cdf_tensor_dim(x, 3);
    int64_t s6[6] = {B, C, H / 2, 2, W / 2, 2};
    int perm[6] = {0, 1, 3, 5, 2, 4}; /* [B, C, dy, dx, H/2, W/2] */
    int64_t s4[4] = {B, C * 4, H / 2, W / 2};
    return cdf_reshape(cdf_permute(cdf_reshape(x, 6, s6), perm), 4, s4);
}

cdf_tensor *cdf_flux2_unpatchify_latents(cdf_tensor *x) {
    if (!x) return NULL;
    if (cdf_tensor_ndim(x) != 4 || cdf_tensor_dim(x, 1) % 4)
        return shape_fail("flux2 unpatchify_latents", x, "[B, 4C, h, w]");
    const int64_t B = cdf_tensor_dim(x, 0), C4 = cdf_tensor_dim(x, 1), h = cdf_tensor_dim(x, 2), w = cdf_tensor_dim(x, 3);
    int64_t s6[6] = {B, C4 / 4, 2, 2, h, w};
    int perm[6] = {0, 1, 4, 2, 5, 3}; /* [B, C, h, dy, w, dx] */
    int64_t s4[4] = {B, C4 / 4, h * 2, w * 2};
    return cdf_reshape(cdf_permute(cdf_reshape(x, 6, s6), perm), 4, s4);
}

cdf_tensor *cdf_flux2_pack_latents(cdf_tensor *x) {
    if (!x) return NULL;
    if (cdf_tensor_ndim(x) != 4) return shape_fail("flux2 pack_latents", x, "[B, C, H, W]");
    const int64_t B = cdf_tensor_dim(x, 0), C = cdf_tensor_dim(x, 1);
    int64_t s3[3] = {B, C, cdf_tensor_dim(x, 2) * cdf_tensor_dim(x, 3)};
    return cdf_contiguous(cdf_transpose(cdf_reshape(x, 3, s3), 1, 2));
}

/* Rows and columns (ids columns 1 and 2, truncated to int64 like .to(torch.int64)) of every batch
 * entry of ids [N, L, n] into rows/cols [N * L]. */
static cdf_status read_grid_ids(cdf_tensor *ids, int64_t N, int64_t L, int64_t *rows, int64_t *cols) {
    cdf_scope_push();
    cdf_tensor *r = cdf_narrow(ids, 2, 1, 1), *c = cdf_narrow(ids, 2, 2, 1);
    cdf_status s = (r && c) ? cdf_tensor_read(r, CDF_I64, rows, (size_t)(N * L) * sizeof *rows) : status_or_internal();
    if (s == CDF_OK) s = cdf_tensor_read(c, CDF_I64, cols, (size_t)(N * L) * sizeof *cols);
    cdf_scope_pop(NULL, 0);
    return s;
}

cdf_tensor *cdf_flux2_unpack_latents_with_ids(cdf_tensor *x, cdf_tensor *ids) {
    static const char *fn = "flux2 unpack_latents_with_ids";
    if (!x || !ids) return NULL;
    if (cdf_tensor_ndim(x) != 3) return shape_fail(fn, x, "latents [B, L, C]");
    const int64_t B = cdf_tensor_dim(x, 0), L = cdf_tensor_dim(x, 1), C = cdf_tensor_dim(x, 2);
    cdf_tensor *ids3 = cdf_tensor_ndim(ids) == 2 ? cdf_unsqueeze(ids, 0) : ids; /* a view recorded in the caller's scope */
    if (!ids3) return NULL;
    cdf_tensor *result = NULL;
    char want[128];
    snprintf(want, sizeof want, "position ids [%lld, %lld, >=3] or [%lld, >=3] (one (t, row, col, ...) row per token)",
             (long long)B, (long long)L, (long long)L);
    const int64_t N = cdf_tensor_dim(ids3, 0);
    if (cdf_tensor_ndim(ids3) != 3 || (N != B && N != 1) || cdf_tensor_dim(ids3, 1) != L || cdf_tensor_dim(ids3, 2) < 3 || L < 1) {
        return shape_fail(fn, ids, want);
    }
    int64_t *rows = malloc((size_t)(N * L) * sizeof *rows), *cols = malloc((size_t)(N * L) * sizeof *cols);
    int64_t *src = NULL;
    cdf_status s = (rows && cols) ? read_grid_ids(ids3, N, L, rows, cols)
                                  : cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld ids", fn, (long long)(N * L));
    /* the grid: h = max(row) + 1, w = max(col) + 1, the same for every batch entry */
    int64_t h = 0, w = 0;
    for (int64_t n = 0; s == CDF_OK && n < N; n++) {
        int64_t hn = 0, wn = 0;
        for (int64_t i = 0; i < L && s == CDF_OK; i++) {
            const int64_t r = rows[n * L + i], c = cols[n * L + i];
            if (r < 0 || c < 0 || r >= MAX_GRID_SIDE || c >= MAX_GRID_SIDE)
                s = cdf_error(CDF_ERR_INVALID_ARG, "%s: token %lld of batch entry %lld has position (row %lld, col %lld) outside 0..%d",
                              fn, (long long)i, (long long)n, (long long)r, (long long)c, MAX_GRID_SIDE - 1);
            if (r + 1 > hn) hn = r + 1;
            if (c + 1 > wn) wn = c + 1;
        }
        if (s == CDF_OK && n > 0 && (hn != h || wn != w))
            s = cdf_error(CDF_ERR_INVALID_ARG, "%s: batch entry %lld spans a %lldx%lld grid but entry 0 spans %lldx%lld", fn,
                          (long long)n, (long long)hn, (long long)wn, (long long)h, (long long)w);
        h = hn, w = wn;
    }
    if (s == CDF_OK && h * w > MAX_GRID_CELLS)
        s = cdf_error(CDF_ERR_LIMIT, "%s: a %lldx%lld grid exceeds %d cells", fn, (long long)h, (long long)w, MAX_GRID_CELLS);
    if (s == CDF_OK && !(src = malloc((size_t)(h * w) * sizeof *src)))
        s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %lldx%lld grid", fn, (long long)h, (long long)w);

    /* scatter as a gather: cell -> the token written there (the last one, like a sequential
     * scatter), or row L of the table, an appended row of zeros */
    cdf_scope_push();
    cdf_tensor *zero_row = s == CDF_OK ? cdf_tensor_zeros(cdf_tensor_device(x), CDF_F32, 2, (int64_t[]){1, C}) : NULL;
    cdf_tensor **per_batch = s == CDF_OK ? calloc((size_t)B, sizeof *per_batch) : NULL;
    if (s == CDF_OK && !per_batch) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int64_t b = 0; s == CDF_OK && b < B; b++) {
        const int64_t n = N == 1 ? 0 : b;
        for (int64_t k = 0; k < h * w; k++) src[k] = L;
        for (int64_t i = 0; i < L; i++) src[rows[n * L + i] * w + cols[n * L + i]] = i;
        cdf_tensor *idx = cdf_tensor_from_host(cdf_tensor_device(x), CDF_I64, 1, (int64_t[]){h * w}, src, CDF_I64);
        cdf_tensor *tokens = cdf_cast(cdf_squeeze(cdf_narrow(x, 0, b, 1), 0), CDF_F32); /* [L, C] */
        cdf_tensor *table = cdf_cat((cdf_tensor *[]){tokens, zero_row}, 2, 0);         /* [L + 1, C] */
        cdf_tensor *cells = cdf_reshape(cdf_embedding(table, idx), 3, (int64_t[]){h, w, C});
        per_batch[b] = cdf_unsqueeze(cdf_permute(cells, (int[]){2, 0, 1}), 0); /* [1, C, h, w] */
        if (!per_batch[b]) s = status_or_internal();
    }
    if (s == CDF_OK) {
        result = cdf_cat(per_batch, (int)B, 0);
        if (!result) s = status_or_internal();
    }
    free(per_batch);
    cdf_scope_pop(result ? &result : NULL, result ? 1 : 0);
    free(src);
    free(rows);
    free(cols);
    return result;
}

/* ==== BatchNorm statistics ===================================================================== */

/* [1, bn_channels, 1, 1] views of running_mean and sqrt(running_var + eps), after checking x. */
static bool bn_stats(const cdf_flux2_vae *v, cdf_tensor *x, const char *fn, cdf_tensor **mean, cdf_tensor **std) {
    if (!v) {
        cdf_error(CDF_ERR_INVALID_ARG, "%s: the VAE is NULL", fn);
        return false;
    }
    if (cdf_tensor_ndim(x) != 4 || cdf_tensor_dim(x, 1) != v->bn_channels) {
        char want[96];
        snprintf(want, sizeof want, "[B, %lld, h, w] (bn channels = prod(patch_size) x latent_channels)", (long long)v->bn_channels);
        shape_fail(fn, x, want);
        return false;
    }
    int64_t s4[4] = {1, v->bn_channels, 1, 1};
    *mean = cdf_reshape(v->bn_mean, 4, s4);
    /* torch: sqrt(running_var + eps), the python float eps applied as a float32 scalar */
    *std = cdf_reshape(cdf_sqrt(cdf_add_scalar(v->bn_var, (float)v->batch_norm_eps)), 4, s4);
    return *mean && *std;
}

cdf_tensor *cdf_flux2_vae_bn_normalize(const cdf_flux2_vae *v, cdf_tensor *x) {
    if (!x) return NULL;
    cdf_tensor *mean, *std;
    if (!bn_stats(v, x, "flux2 bn normalize", &mean, &std)) return NULL;
    return cdf_div(cdf_sub(x, mean), std);
}

cdf_tensor *cdf_flux2_vae_bn_denormalize(const cdf_flux2_vae *v, cdf_tensor *x) {
    if (!x) return NULL;
    cdf_tensor *mean, *std;
    if (!bn_stats(v, x, "flux2 bn denormalize", &mean, &std)) return NULL;
    return cdf_add(cdf_mul(x, std), mean);
}

/* ==== pipeline entry points ====================================================================== */

static cdf_tensor *decode_packed_tiled(const cdf_flux2_vae *v, cdf_tensor *packed, cdf_tensor *ids, const cdf_vae_tiling *tiling,
                                       cdf_tensor **decode_latents);

cdf_tensor *cdf_flux2_vae_decode_packed(const cdf_flux2_vae *v, cdf_tensor *packed, cdf_tensor *ids,
                                        cdf_tensor **decode_latents) {
    return decode_packed_tiled(v, packed, ids, NULL, decode_latents);
}

static cdf_tensor *decode_packed_tiled(const cdf_flux2_vae *v, cdf_tensor *packed, cdf_tensor *ids, const cdf_vae_tiling *tiling,
                                       cdf_tensor **decode_latents) {
    if (decode_latents) *decode_latents = NULL;
    if (!v) {
        cdf_error(CDF_ERR_INVALID_ARG, "%s: decode_packed: the VAE is NULL", MODEL);
        return NULL;
    }
    cdf_tensor *z = cdf_flux2_unpatchify_latents(cdf_flux2_vae_bn_denormalize(v, cdf_flux2_unpack_latents_with_ids(packed, ids)));
    if (!z) return NULL;
    if (decode_latents) *decode_latents = z;
    return cdf_autoencoder_kl_decode_tiled(&v->kl, z, tiling);
}

cdf_tensor *cdf_flux2_vae_encode_latents(const cdf_flux2_vae *v, cdf_tensor *image) {
    if (!v) {
        cdf_error(CDF_ERR_INVALID_ARG, "%s: encode_latents: the VAE is NULL", MODEL);
        return NULL;
    }
    /* retrieve_latents(sample_mode="argmax") = latent_dist.mode() = the mean */
    cdf_tensor *mean = cdf_vae_encode_mean((void *)&v->kl, image);
    return cdf_flux2_vae_bn_normalize(v, cdf_flux2_patchify_latents(mean));
}

/* ==== component class ============================================================================== */

/* decode: z -> out.decode_sample; with packed_latents (+ packed_ids) also the pipeline's decode
 * (out.pipeline_decode_latents, out.pipeline_decode_sample); unpacked_latents [B, 4C, h, w] is
 * the same decode after the pipeline has scattered the tokens by their ids itself (what
 * Flux2Pipeline passes: the scatter reads the ids on the host and its output size depends on their
 * values, so inside a compiled decode it would be a graph break). encode: x -> out.encode_mean /
 * logvar / std and the pipeline's normalised latents (out.pipeline_encode_latents). */
static cdf_status flux2_vae_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const cdf_flux2_vae *v = impl;
    cdf_vae_tiling tiling; /* AutoencoderKLFlux2 tiles exactly as AutoencoderKL does */
    CDF_TRY(cdf_vae_tiling_from_inputs(&v->kl.config, in, MODEL, &tiling));
    if (strcmp(method, "decode") == 0) {
        cdf_tensor *z = cdf_input_opt(in, "z"), *packed = cdf_input_opt(in, "packed_latents"),
                   *unpacked = cdf_input_opt(in, "unpacked_latents");
        if (!z && !packed && !unpacked)
            return cdf_error(CDF_ERR_NOT_FOUND,
                             "%s.decode: required input 'z' (or 'packed_latents' with 'packed_ids', or 'unpacked_latents') is missing",
                             MODEL);
        if (unpacked) {
            if (cdf_tensor_ndim(unpacked) != 4 || cdf_tensor_dim(unpacked, 1) != v->bn_channels)
                return cdf_error(CDF_ERR_SHAPE, "%s.decode: input 'unpacked_latents' must be [B, %lld, h, w] (4 x latent channels)",
                                 MODEL, (long long)v->bn_channels);
            cdf_tensor *latents = cdf_flux2_unpatchify_latents(cdf_flux2_vae_bn_denormalize(v, unpacked));
            cdf_tensor *sample = latents ? cdf_autoencoder_kl_decode_tiled(&v->kl, latents, &tiling) : NULL;
            if (!sample) return status_or_internal();
            CDF_TRY(cdf_tensor_map_set(out, "out.pipeline_decode_latents", latents));
            CDF_TRY(cdf_tensor_map_set(out, "out.pipeline_decode_sample", sample));
        }
        if (z) {
            cdf_tensor *sample = cdf_autoencoder_kl_decode_tiled(&v->kl, z, &tiling);
            if (!sample) return status_or_internal();
            CDF_TRY(cdf_tensor_map_set(out, "out.decode_sample", sample));
        }
        if (packed) {
            cdf_tensor *ids = cdf_input(in, "packed_ids", MODEL ".decode (with packed_latents)");
            if (!ids) return cdf_last_status();
            cdf_tensor *latents = NULL;
            cdf_tensor *sample = decode_packed_tiled(v, packed, ids, &tiling, &latents);
            if (!sample) return status_or_internal();
            CDF_TRY(cdf_tensor_map_set(out, "out.pipeline_decode_latents", latents));
            CDF_TRY(cdf_tensor_map_set(out, "out.pipeline_decode_sample", sample));
        }
        return CDF_OK;
    }
    if (strcmp(method, "encode") == 0) {
        cdf_tensor *x = cdf_input(in, "x", MODEL ".encode");
        if (!x) return cdf_last_status();
        cdf_tensor *mean, *logvar, *std;
        CDF_TRY(cdf_vae_posterior(cdf_autoencoder_kl_encode_moments_tiled(&v->kl, x, &tiling), &mean, &logvar, &std));
        CDF_TRY(cdf_tensor_map_set(out, "out.encode_mean", mean));
        CDF_TRY(cdf_tensor_map_set(out, "out.encode_logvar", logvar));
        CDF_TRY(cdf_tensor_map_set(out, "out.encode_std", std));
        /* the pipeline's latents exist only where its 2x2 patchify applies (vae.encode itself
         * accepts any size) */
        if (cdf_tensor_dim(mean, 2) % 2 || cdf_tensor_dim(mean, 3) % 2 || v->bn_channels != 4 * cdf_tensor_dim(mean, 1))
            return CDF_OK;
        cdf_tensor *latents = cdf_flux2_vae_bn_normalize(v, cdf_flux2_patchify_latents(mean));
        if (!latents) return status_or_internal();
        return cdf_tensor_map_set(out, "out.pipeline_encode_latents", latents);
    }
    return cdf_error(CDF_ERR_UNSUPPORTED, "%s: method '%s' is not supported (decode, encode)", MODEL, method);
}

const cdf_component_class cdf_autoencoder_kl_flux2_class = {
    .names = (const char *const[]){MODEL, NULL},
    .load = flux2_vae_load,
    .free = flux2_vae_free,
    .run = flux2_vae_run,
    /* the token positions decide the grid the tokens are scattered into (its size too) */
    .static_inputs = (const char *const[]){"packed_ids", CDF_VAE_TILING_INPUTS, NULL},
};
