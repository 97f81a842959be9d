/* generate: input images, batches, prompt files and numbered outputs (see batch.h). */
#include "batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "core/error_internal.h"
#include "models/component.h"
#include "io/atomic_file.h"

bool cdf_cli_file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

bool cdf_cli_output_writable(const char *path, bool overwrite) {
    cdf_atomic_file *af = NULL;
    if (cdf_atomic_file_open(path, overwrite, &af) != CDF_OK) return false;
    cdf_atomic_file_abort(af);
    return true;
}

bool cdf_cli_parse_seeds(const char *s, cdf_cli_gen *g) {
    g->n_seeds = 0;
    const char *p = s;
    while (*p) {
        if (g->n_seeds == CDF_CLI_MAX_SEEDS || *p < '0' || *p > '9') return false;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || end == p || (*end && *end != ',')) return false;
        g->seeds[g->n_seeds++] = v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return false; /* trailing comma */
    }
    return g->n_seeds > 0;
}

static cdf_status load_png(const char *path, const char *what, cdf_png_image *png, cdf_image *img) {
    cdf_status s = cdf_png_read(path, png);
    if (s != CDF_OK) {
        cdf_error_prefix("%s: ", what);
        return s;
    }
    *img = (cdf_image){.width = png->width, .height = png->height, .channels = png->channels, .pixels = png->pixels};
    return CDF_OK;
}

/* One prompt per line; empty lines (and a trailing newline) are skipped, "\r\n" is accepted. */
static cdf_status read_prompts(cdf_cli_gen *g) {
    FILE *f = fopen(g->prompts_file, "rb");
    if (!f) return cdf_error(errno == ENOENT ? CDF_ERR_NOT_FOUND : CDF_ERR_IO, "--prompts-file %s: %s", g->prompts_file, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    cdf_status s = CDF_OK;
    int lineno = 0;
    while (s == CDF_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (strlen(line) != (size_t)len) {
            s = cdf_error(CDF_ERR_FORMAT, "--prompts-file %s, line %d: contains a NUL byte (not a text file?)", g->prompts_file, lineno);
            break;
        }
        char **np = realloc(g->prompts, sizeof *np * (size_t)(g->n_prompts + 1));
        char *copy = strdup(line);
        if (!np || !copy) {
            free(copy);
            if (np) g->prompts = np;
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading %s", g->prompts_file);
            break;
        }
        g->prompts = np;
        g->prompts[g->n_prompts++] = copy;
    }
    free(line);
    fclose(f);
    if (s == CDF_OK && g->n_prompts == 0) s = cdf_error(CDF_ERR_INVALID_ARG, "--prompts-file %s has no prompt (one per line)", g->prompts_file);
    return s;
}

cdf_status cdf_cli_gen_prepare(cdf_cli_gen *g, cdf_generate_params *gp) {
    for (int i = 0; i < g->n_images; i++) {
        char what[32];
        snprintf(what, sizeof what, g->n_images > 1 ? "--image #%d" : "--image", i + 1);
        CDF_TRY(load_png(g->image_paths[i], what, &g->image_png[i], &g->image[i]));
    }
    if (g->n_images > 0) {
        gp->image = g->image;
        gp->num_input_images = g->n_images;
    }
    if (g->mask_path) {
        CDF_TRY(load_png(g->mask_path, "--mask", &g->mask_png, &g->mask));
        gp->mask_image = &g->mask;
    }
    if (g->n_seeds > 0) {
        gp->seeds = g->seeds;
        gp->num_seeds = g->n_seeds;
    }
    if (g->prompts_file) CDF_TRY(read_prompts(g));
    return CDF_OK;
}

static int n_prompts(const cdf_cli_gen *g) { return g->prompts_file ? g->n_prompts : 1; }

/* out.png -> out-007.png when the run writes several images (or --prompts-file is used). */
static bool numbered(const cdf_cli_gen *g, const cdf_generate_params *gp) {
    return g->prompts_file || cdf_generate_params_count(gp) > 1;
}

static void output_name(const cdf_cli_gen *g, const cdf_generate_params *gp, int index, char *buf, size_t n) {
    if (!numbered(g, gp)) {
        snprintf(buf, n, "%s", g->output);
        return;
    }
    size_t len = strlen(g->output);
    const char *dot = strrchr(g->output, '.'), *slash = strrchr(g->output, '/');
    if (dot && (!slash || dot > slash) && strcmp(dot, ".png") == 0) len = (size_t)(dot - g->output);
    snprintf(buf, n, "%.*s-%03d.png", (int)len, g->output, index);
}

cdf_status cdf_cli_gen_check_outputs(const cdf_cli_gen *g, const cdf_generate_params *gp) {
    const int total = n_prompts(g) * cdf_generate_params_count(gp);
    if (g->latents_out && total > 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "--latents-out writes one image's latents; this run makes %d images", total);
    char name[4200];
    for (int i = 0; i < total; i++) {
        output_name(g, gp, i, name, sizeof name);
        if (!g->force && cdf_cli_file_exists(name)) return cdf_error(CDF_ERR_IO, "%s already exists (use --force to overwrite)", name);
    }
    if (g->latents_out && !g->force && cdf_cli_file_exists(g->latents_out))
        return cdf_error(CDF_ERR_IO, "%s already exists (use --force to overwrite)", g->latents_out);
    output_name(g, gp, 0, name, sizeof name);
    if (!cdf_cli_output_writable(name, g->force) || (g->latents_out && !cdf_cli_output_writable(g->latents_out, g->force)))
        return cdf_last_status();
    return CDF_OK;
}

static cdf_status write_image(const cdf_cli_gen *g, cdf_pipeline *pipe, const cdf_generate_params *gp, int k, int n,
                              const cdf_image *img, const char *path) {
    /* the seed that reproduces this image alone: its own seed from a list; with one generator the
     * seed and the image's row of the batch; with a list and an input image (not FLUX.2's
     * references), images past the first also name the seed their input image was encoded with
     * (the list's first: diffusers encodes the one image with generator[0]) */
    unsigned long long seed = gp->num_seeds > 0 ? (unsigned long long)gp->seeds[k] : (unsigned long long)gp->seed;
    char batch[96] = "", init[1200] = "";
    if (gp->num_seeds == 0 && n > 1) snprintf(batch, sizeof batch, ", Batch index: %d of %d", k, n);
    if (gp->num_seeds > 0 && k > 0 && gp->image && strcmp(cdf_pipeline_class_name(pipe), "Flux2Pipeline") != 0)
        snprintf(batch, sizeof batch, ", Batch index: %d of %d, Image encoded with seed: %llu", k, n,
                 (unsigned long long)gp->seeds[0]);
    cdf_cli_png_init_text(init, sizeof init, pipe, gp, (const char *const *)g->image_paths, g->n_images, g->mask_path);
    cdf_cli_png_text *text = malloc(sizeof *text);
    if (!text) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_cli_png_text_make(text, pipe, gp, g->dtype, g->model, seed, batch, init, k);
    cdf_status s = cdf_png_write(path, img->width, img->height, 3, img->pixels, text->keys, text->values, 2, g->force);
    free(text);
    CDF_TRY(s);
    if (!g->quiet) fprintf(stderr, "cdiffusers: wrote %s (%dx%d)\n", path, img->width, img->height);
    return CDF_OK;
}

cdf_status cdf_cli_gen_run(const cdf_cli_gen *g, cdf_pipeline *pipe, cdf_generate_params *gp, bool writer, bool *generating) {
    const int n = cdf_generate_params_count(gp);
    cdf_image *imgs = calloc((size_t)n, sizeof *imgs);
    if (!imgs) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    if (g->latents_out && writer) gp->capture = (cdf_capture *)&cap;
    cdf_status s = CDF_OK;
    for (int pi = 0; pi < n_prompts(g) && s == CDF_OK; pi++) {
        if (g->prompts_file) gp->prompt = g->prompts[pi];
        *generating = true;
        s = cdf_pipeline_generate_images(pipe, gp, imgs, n);
        if (s != CDF_OK) break;
        *generating = false;
        if (writer && g->latents_out) {
            cdf_tensor_map lm;
            cdf_tensor_map_init(&lm);
            cdf_tensor_map_set(&lm, "latents_initial", cdf_tensor_map_get(&cap, "latents_initial"));
            cdf_tensor_map_set(&lm, "latents_final", cdf_tensor_map_get(&cap, "latents_final"));
            s = cdf_tensor_map_save(&lm, g->latents_out, false);
            if (s != CDF_OK) cdf_error_prefix("writing latents: ");
            cdf_tensor_map_clear(&lm);
        }
        for (int k = 0; k < n; k++) {
            char path[4200];
            output_name(g, gp, pi * n + k, path, sizeof path);
            if (writer && s == CDF_OK) {
                s = write_image(g, pipe, gp, k, n, &imgs[k], path);
                if (s != CDF_OK) cdf_error_prefix("writing the image: ");
            }
            cdf_image_free(&imgs[k]);
        }
    }
    gp->capture = NULL;
    cdf_tensor_map_clear(&cap);
    free(imgs);
    return s;
}

void cdf_cli_gen_free(cdf_cli_gen *g) {
    for (int i = 0; i < g->n_prompts; i++) free(g->prompts[i]);
    free(g->prompts);
    g->prompts = NULL;
    g->n_prompts = 0;
    for (int i = 0; i < g->n_images; i++) cdf_png_image_free(&g->image_png[i]);
    cdf_png_image_free(&g->mask_png);
}
