/* First Block Cache (docs/step-caches.md) benchmark, two parts:
 *
 *   quality MODEL N_PROMPTS STEPS [CACHE;CACHE;...]
 *     the trained default model (its cdiffusers_defaults.json request: 64x64, true CFG 3): N
 *     prompts from its grammar, each without a cache and with every --cache string (default
 *     first-block:0.05;first-block:0.1;first-block:0.2;mag); per cache the fraction of transformer calls computed in full (every cache context)
 *     and the PSNR of the 8-bit picture against the uncached one (mean over the pictures that
 *     differ, median and minimum over all).
 *   timing MODEL SIZE STEPS [CACHE;CACHE;...]
 *     per-step wall time of one image at SIZE² with each cache (default: first-block:0, every
 *     step in full; first-block:1e9, every step after the first skipped after the head block;
 *     mag with a huge threshold and retention 0, every step after the first skipped with no
 *     block; taylorseer computing steps 0 and 2 only, the others predicted); the first step (and
 *     each run's compile/warm-up) is left out: median of the rest.
 *
 * Build: bench/step_cache/run.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_step_cache: %s: %s\n", what, cdf_last_error());
    exit(1);
}

/* The default model's grammar (docs/default-model.md), prompts picked by a fixed LCG. */
static void make_prompt(unsigned *state, char *buf, size_t n) {
    static const char *const sizes[] = {"small", "medium", "large"};
    static const char *const colours[] = {"red", "green", "blue", "yellow", "purple", "orange", "white", "black"};
    static const char *const shapes[] = {"circle", "square", "triangle", "cross", "ring"};
    static const char *const pos[] = {"", " in the top left", " in the top right", " in the bottom left", " in the bottom right",
                                      " in the center"};
#define NEXT(m) ((*state = *state * 1103515245u + 12345u) >> 16) % (m)
    const char *sz = sizes[NEXT(3)], *c = colours[NEXT(8)], *sh = shapes[NEXT(5)], *p = pos[NEXT(6)];
    const char *bg;
    do bg = colours[NEXT(8)];
    while (bg == c);
#undef NEXT
    snprintf(buf, n, "a %s %s %s%s on a%s %s background", sz, c, sh, p, (bg[0] == 'o') ? "n" : "", bg);
}

static double psnr(const cdf_image *a, const cdf_image *b) {
    const size_t n = (size_t)a->width * a->height * 3;
    double se = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a->pixels[i] - (double)b->pixels[i];
        se += d * d;
    }
    return se == 0 ? INFINITY : 10.0 * log10(255.0 * 255.0 / (se / (double)n));
}

/* "..., full steps [cond ]0,3 (2 of 10)[, uncond ... (3 of 10)]": computed and total calls */
static void count_full(const char *rep, int *full, int *calls) {
    *full = *calls = 0;
    for (const char *p = rep; p && (p = strstr(p, " (")); p += 2) {
        int a, b;
        if (sscanf(p, " (%d of %d)", &a, &b) == 2) *full += a, *calls += b;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int quality(const char *model, int n_prompts, int steps, const char *caches) {
    char specs[8][128];
    int nt = 0;
    for (const char *p = caches; *p && nt < 8; nt++) {
        const char *semi = strchr(p, ';');
        const size_t len = semi ? (size_t)(semi - p) : strlen(p);
        snprintf(specs[nt], sizeof specs[nt], "%.*s", (int)len, p);
        p = semi ? semi + 1 : p + len;
    }
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(model, NULL, &pipe) != CDF_OK) die("load");
    /* the folder's own request defaults (true CFG 3 with "" for the default model) */
    cdf_generate_params base = cdf_generate_params_default();
    base.num_inference_steps = steps;
    base.negative_prompt = "";
    base.true_cfg_scale = 3.0f;
    base.guidance_scale = 0.0f;
    base.max_sequence_length = 24;
    base.height = base.width = 64;
    double *ps = calloc((size_t)n_prompts * nt, sizeof *ps), t_none = 0, t_cache[8] = {0};
    long full[8] = {0}, calls[8] = {0};
    unsigned st = 20261206u;
    for (int i = 0; i < n_prompts; i++) {
        char prompt[256];
        make_prompt(&st, prompt, sizeof prompt);
        cdf_generate_params gp = base;
        gp.prompt = prompt;
        gp.seed = 1000 + (uint64_t)i;
        cdf_image ref, img;
        double t0 = now_s();
        if (cdf_pipeline_generate(pipe, &gp, &ref) != CDF_OK) die("generate");
        t_none += now_s() - t0;
        for (int k = 0; k < nt; k++) {
            gp.cache = specs[k];
            t0 = now_s();
            if (cdf_pipeline_generate(pipe, &gp, &img) != CDF_OK) die("generate (cache)");
            t_cache[k] += now_s() - t0;
            int f, c;
            count_full(cdf_pipeline_cache_report(pipe, 0), &f, &c);
            full[k] += f, calls[k] += c;
            ps[(size_t)k * n_prompts + i] = psnr(&ref, &img);
            cdf_image_free(&img);
        }
        cdf_image_free(&ref);
    }
    (void)t_none;
    printf("| steps | cache | transformer calls in full (%d prompts) | PSNR dB vs no cache: mean / median / min |\n", n_prompts);
    printf("| --- | --- | --- | --- |\n");
    for (int k = 0; k < nt; k++) {
        double *v = ps + (size_t)k * n_prompts, mean = 0;
        int inf = 0;
        for (int i = 0; i < n_prompts; i++) {
            if (isinf(v[i])) inf++;
            else mean += v[i];
        }
        qsort(v, (size_t)n_prompts, sizeof *v, cmp_double);
        mean = n_prompts > inf ? mean / (n_prompts - inf) : INFINITY;
        printf("| %d | %s | %.1f%% (%ld of %ld) | %.1f / %.1f / %.1f%s |\n", steps, specs[k], 100.0 * full[k] / calls[k],
               full[k], calls[k], mean, v[n_prompts / 2], v[0], inf ? " (identical pictures left out of the mean)" : "");
    }
    free(ps);
    cdf_pipeline_free(pipe);
    return 0;
}

typedef struct step_log {
    double t[64];
    int n;
} step_log;

static bool on_step(int step, int num_steps, double secs, void *user) {
    (void)num_steps;
    step_log *l = user;
    if (step - 1 < 64) l->t[step - 1] = secs;
    l->n = step;
    return true;
}

static int timing(const char *model, int size, int steps, const char *list) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_BF16;
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(model, &lp, &pipe) != CDF_OK) die("load");
    char specs[6][128];
    int ns = 0;
    for (const char *p = list; *p && ns < 6; ns++) {
        const char *semi = strchr(p, ';');
        const size_t len = semi ? (size_t)(semi - p) : strlen(p);
        snprintf(specs[ns], sizeof specs[ns], "%.*s", (int)len, p);
        p = semi ? semi + 1 : p + len;
    }
    double med[6];
    for (int r = 0; r < ns; r++) {
        cdf_generate_params gp = cdf_generate_params_default();
        gp.prompt = "a red fox in the snow";
        gp.height = gp.width = size;
        gp.num_inference_steps = steps;
        gp.max_sequence_length = 64;
        gp.seed = 7;
        gp.cache = specs[r];
        step_log l = {0};
        gp.callback = on_step;
        gp.callback_user = &l;
        cdf_image img;
        if (cdf_pipeline_generate(pipe, &gp, &img) != CDF_OK) die("generate");
        cdf_image_free(&img);
        double v[64];
        int n = 0;
        for (int i = 1; i < l.n && i < 64; i++) v[n++] = l.t[i];
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        med[r] = v[n / 2];
        printf("%s: steps 2-%d %s", specs[r], l.n, "s:");
        for (int i = 1; i < l.n && i < 64; i++) printf(" %.3f", l.t[i]);
        printf("  (first step %.3f; %s)\n", l.t[0], cdf_pipeline_cache_report(pipe, 0));
    }
    for (int r = 1; r < ns; r++)
        printf("median step: %s %.3f s, %s %.3f s (%.1f%%)\n", specs[0], med[0], specs[r], med[r], 100.0 * med[r] / med[0]);
    cdf_pipeline_free(pipe);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "quality") == 0)
        return quality(argv[2], atoi(argv[3]), atoi(argv[4]), "first-block:0.05;first-block:0.1;first-block:0.2;mag;taylorseer");
    if (argc == 6 && strcmp(argv[1], "quality") == 0) return quality(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    /* every step in full; FBC skipping every step after the first; MagCache skipping every one after the first */
    if (argc == 5 && strcmp(argv[1], "timing") == 0)
        return timing(argv[2], atoi(argv[3]), atoi(argv[4]),
                      "first-block:0;first-block:1e9;mag:threshold=1e9,max_skip_steps=1000,retention_ratio=0;"
                      "taylorseer:disable_cache_before_step=1,cache_interval=1000");
    if (argc == 6 && strcmp(argv[1], "timing") == 0) return timing(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    fprintf(stderr, "usage: bench_step_cache quality MODEL N_PROMPTS STEPS [CACHE;CACHE;...]\n"
                    "       bench_step_cache timing MODEL SIZE STEPS [CACHE;CACHE;...] (the first: the reference)\n");
    return 2;
}
