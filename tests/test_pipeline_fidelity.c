/* The integer and branch decisions diffusers makes in Python doubles, against sweeps made by
 * diffusers' own pipelines (tests/data/fidelity, tools/make-fidelity-sweep/make_sweep.py):
 *
 *  - strength_sweep.txt: for FluxImg2ImgPipeline / FluxInpaintPipeline (flux1_dev_tiny,
 *    flux1_schnell_tiny) and StableDiffusion3Img2ImgPipeline / StableDiffusion3InpaintPipeline
 *    (sd35m_tiny) at 1024x1024, strengths i / 100 x steps 1..60: the mu, the schedule, the start
 *    index and so the first sigma each cell gets; a cell diffusers makes no image for must be
 *    refused (none of i / 100 is; strength 1e-30 is, for every pipeline).
 *  - mu_sweep.txt: widths and heights 256..2048 in steps of 16: the image sequence length (FLUX.1
 *    and FLUX.2) and FLUX.1's mu per cell, and a hash of all cells' FLUX.2 mu at every step count
 *    1..60 (its mu depends on the steps too: 760k values).
 *
 * Each cell goes through the code the pipelines run (cdf_pipe_schedule, cdf_pipe_schedule_mu,
 * cdf_pipeline_validate), bit for bit. And the CFG branches on the double scales, and
 * reference_sizes.txt: FLUX.2's reference image sizing over 254 x 254 sizes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"

#define MAX_STEPS 60
#define N_STRENGTHS 100

static uint64_t bits64(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static uint32_t bits32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* One section of strength_sweep.txt. */
typedef struct section {
    char cls[64], folder[64];
    bool has_mu;
    uint64_t mu;
    uint32_t sigmas[MAX_STEPS + 1][MAX_STEPS + 1];
    int start[MAX_STEPS + 1][N_STRENGTHS]; /* -1 = diffusers makes no image */
    const struct section *same;            /* "same CLASS": that section's cells */
} section;

static char *next_line(char **p) {
    if (!**p) return NULL;
    char *l = *p, *e = strchr(l, '\n');
    if (e) {
        *e = 0;
        *p = e + 1;
    } else {
        *p += strlen(l);
    }
    return l;
}

static int parse_strength_sweep(section *secs, int max) {
    size_t len;
    char *txt = tu_read_file(tu_data("fidelity/strength_sweep.txt"), &len);
    assert_non_null(txt);
    char *p = txt, *l;
    int n = -1;
    while ((l = next_line(&p))) {
        if (l[0] == '#' || !l[0]) continue;
        char *save = NULL, *tok = strtok_r(l, " ", &save);
        if (strcmp(tok, "pipeline") == 0) {
            assert_true(++n < max);
            section *s = &secs[n];
            memset(s, 0, sizeof *s);
            snprintf(s->cls, sizeof s->cls, "%s", strtok_r(NULL, " ", &save));
            snprintf(s->folder, sizeof s->folder, "%s", strtok_r(NULL, " ", &save));
            char *same = strtok_r(NULL, " ", &save);
            if (same) {
                assert_string_equal(same, "same");
                const char *other = strtok_r(NULL, " ", &save);
                for (int k = 0; k < n; k++)
                    if (strcmp(secs[k].cls, other) == 0 && strcmp(secs[k].folder, s->folder) == 0) s->same = &secs[k];
                assert_non_null(s->same);
            }
        } else if (strcmp(tok, "mu") == 0) {
            const char *v = strtok_r(NULL, " ", &save);
            secs[n].has_mu = strcmp(v, "none") != 0;
            if (secs[n].has_mu) secs[n].mu = strtoull(v, NULL, 16);
        } else if (strcmp(tok, "sigmas") == 0 || strcmp(tok, "start") == 0) {
            const bool sig = tok[1] == 'i';
            const int N = atoi(strtok_r(NULL, " ", &save));
            assert_true(N >= 1 && N <= MAX_STEPS);
            const int count = sig ? N + 1 : N_STRENGTHS;
            for (int i = 0; i < count; i++) {
                const char *v = strtok_r(NULL, " ", &save);
                assert_non_null(v);
                if (sig) secs[n].sigmas[N][i] = (uint32_t)strtoul(v, NULL, 16);
                else secs[n].start[N][i] = strcmp(v, "-") == 0 ? -1 : atoi(v);
            }
            assert_null(strtok_r(NULL, " ", &save));
        } else {
            fail_msg("strength_sweep.txt: unknown line '%s'", tok);
        }
    }
    free(txt);
    return n + 1;
}

static void test_strength_sweep(void **state) {
    (void)state;
    static section secs[8];
    const int n_secs = parse_strength_sweep(secs, 8);
    assert_int_equal(n_secs, 6); /* 2 Flux folders x img2img / inpaint, SD3 img2img / inpaint */
    const int S = 1024;
    uint8_t *px = calloc((size_t)S * S * 3, 1);
    assert_non_null(px);
    cdf_image img = {S, S, 3, px}, mask = {S, S, 1, px};
    long cells = 0, with_image = 0;
    for (int k = 0; k < n_secs; k++) {
        const section *sec = &secs[k], *t = sec->same ? sec->same : sec;
        cdf_pipeline *pipe = tu_load_tiny_pipeline(sec->folder);
        assert_string_equal(cdf_pipeline_class_name(pipe), strstr(sec->cls, "Flux") ? "FluxPipeline" : "StableDiffusion3Pipeline");
        cdf_generate_params gp = cdf_generate_params_default();
        gp.prompt = "x";
        gp.height = gp.width = S;
        gp.image = &img;
        gp.mask_image = strstr(sec->cls, "Inpaint") ? &mask : NULL;
        for (int N = 1; N <= MAX_STEPS; N++) {
            gp.num_inference_steps = N;
            for (int i = 1; i <= N_STRENGTHS; i++) {
                gp.strength = (double)i / 100.0; /* Python's i / 100: the correctly rounded quotient */
                const int want = t->start[N][i - 1];
                const cdf_status v = cdf_pipeline_validate(pipe, &gp);
                cells++;
                if (want < 0) {
                    if (v != CDF_ERR_INVALID_ARG) fail_msg("%s %s: %d steps, strength %d/100 accepted; diffusers makes no image", sec->cls, sec->folder, N, i);
                    continue;
                }
                if (v != CDF_OK) fail_msg("%s %s: %d steps, strength %d/100 refused: %s", sec->cls, sec->folder, N, i, cdf_last_error());
                cdf_scheduler *sched = NULL;
                cdf_pipe_schedule_info si;
                assert_int_equal(cdf_pipe_schedule(pipe, &gp, &sched, &si), CDF_OK);
                const float *sig = cdf_scheduler_sigmas(sched);
                assert_int_equal(cdf_scheduler_num_sigmas(sched), N + 1);
                if (si.t_start != want)
                    fail_msg("%s %s: %d steps, strength %d/100: start index %d, diffusers %d", sec->cls, sec->folder, N, i, si.t_start, want);
                if (bits32(sig[si.t_start]) != t->sigmas[N][want])
                    fail_msg("%s %s: %d steps, strength %d/100: first sigma %08x, diffusers %08x", sec->cls, sec->folder, N, i,
                             bits32(sig[si.t_start]), t->sigmas[N][want]);
                if (i == 1) { /* the whole schedule and mu once per step count */
                    for (int j = 0; j <= N; j++)
                        if (bits32(sig[j]) != t->sigmas[N][j])
                            fail_msg("%s %s: %d steps: sigma %d is %08x, diffusers %08x", sec->cls, sec->folder, N, j, bits32(sig[j]), t->sigmas[N][j]);
                    assert_int_equal(si.has_mu, t->has_mu);
                    if (si.has_mu && bits64(si.mu) != t->mu)
                        fail_msg("%s %s: mu %016llx, diffusers %016llx", sec->cls, sec->folder, (unsigned long long)bits64(si.mu), (unsigned long long)t->mu);
                }
                with_image++;
                cdf_scheduler_free(sched);
            }
        }
        /* the header's refusal: a strength that leaves no step (N - N * 1e-30 == N) */
        gp.num_inference_steps = 5;
        gp.strength = 1e-30;
        assert_int_equal(cdf_pipeline_validate(pipe, &gp), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), "no denoising step"));
        cdf_pipeline_free(pipe);
    }
    print_message("  %ld cells, %ld with a start index, all as diffusers\n", cells, with_image);
    assert_int_equal(cells, 6L * MAX_STEPS * N_STRENGTHS);
    free(px);
}

/* The strength as a float: the cells where it would change the start index (the ones the issue
 * names among them), to show the sweep can tell. */
static void test_float_strength_differs(void **state) {
    (void)state;
    static const struct {
        int n;
        double s;
        int t_start;
    } cases[] = {{5, 0.6, 2}, {10, 0.3, 7}, {20, 0.55, 9}, {25, 0.6, 10}, {5, 0.2, 4}, {50, 0.14, 43}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(cdf_pipe_t_start(cases[i].n, cases[i].s), cases[i].t_start);
        assert_int_equal(cdf_pipe_t_start(cases[i].n, (double)(float)cases[i].s), cases[i].t_start - 1);
    }
}

static void test_mu_sweep(void **state) {
    (void)state;
    size_t len;
    char *txt = tu_read_file(tu_data("fidelity/mu_sweep.txt"), &len);
    assert_non_null(txt);
    enum { MAXC = 256, MAXSEQ = 1 << 16 };
    int lo = 0, hi = 0, step = 0, nside = 0, rows = 0;
    static int64_t seq[MAXC][MAXC];
    static uint64_t mu1[MAXSEQ], hash[MAX_STEPS + 1];
    static bool have1[MAXSEQ];
    char *p = txt, *l;
    while ((l = next_line(&p))) {
        if (l[0] == '#' || !l[0]) continue;
        char *save = NULL, *tok = strtok_r(l, " ", &save);
        if (strcmp(tok, "sides") == 0) {
            lo = atoi(strtok_r(NULL, " ", &save));
            hi = atoi(strtok_r(NULL, " ", &save));
            step = atoi(strtok_r(NULL, " ", &save));
            nside = (hi - lo) / step + 1;
            assert_true(nside > 0 && nside <= MAXC);
        } else if (strcmp(tok, "seq") == 0) {
            const int h = atoi(strtok_r(NULL, " ", &save));
            assert_int_equal(h, lo + rows * step);
            for (int c = 0; c < nside; c++) seq[rows][c] = atoll(strtok_r(NULL, " ", &save));
            rows++;
        } else if (strcmp(tok, "flux1") == 0) {
            const long s = atol(strtok_r(NULL, " ", &save));
            assert_true(s > 0 && s < MAXSEQ);
            mu1[s] = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
            have1[s] = true;
        } else if (strcmp(tok, "flux2hash") == 0) {
            const int N = atoi(strtok_r(NULL, " ", &save));
            assert_true(N >= 1 && N <= MAX_STEPS);
            hash[N] = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
        } else {
            fail_msg("mu_sweep.txt: unknown line '%s'", tok);
        }
    }
    free(txt);
    assert_int_equal(rows, nside);
    assert_int_equal(lo, 256);
    assert_int_equal(hi, 2048);
    cdf_pipeline *f1 = tu_load_tiny_pipeline("flux1_dev_tiny"), *f2 = tu_load_tiny_pipeline("flux2_dev_tiny");
    cdf_generate_params gp = cdf_generate_params_default();
    cdf_pipe_schedule_info si;
    long cells = 0;
    for (int r = 0; r < nside; r++)
        for (int c = 0; c < nside; c++) {
            gp.height = lo + r * step;
            gp.width = lo + c * step;
            gp.num_inference_steps = 28;
            cdf_pipe_schedule_mu(f1, &gp, &si);
            if (si.image_seq_len != seq[r][c])
                fail_msg("FLUX.1 %dx%d: image_seq_len %lld, diffusers %lld", gp.width, gp.height, (long long)si.image_seq_len, (long long)seq[r][c]);
            assert_true(have1[seq[r][c]]);
            if (!si.has_mu || bits64(si.mu) != mu1[seq[r][c]])
                fail_msg("FLUX.1 %dx%d: mu %.17g, diffusers %016llx", gp.width, gp.height, si.mu, (unsigned long long)mu1[seq[r][c]]);
            cdf_pipe_schedule_mu(f2, &gp, &si);
            if (si.image_seq_len != seq[r][c])
                fail_msg("FLUX.2 %dx%d: image_seq_len %lld, diffusers %lld", gp.width, gp.height, (long long)si.image_seq_len, (long long)seq[r][c]);
            assert_true(si.has_mu);
            cells++;
        }
    for (int N = 1; N <= MAX_STEPS; N++) {
        uint64_t h = 0xCBF29CE484222325ULL;
        gp.num_inference_steps = N;
        for (int r = 0; r < nside; r++)
            for (int c = 0; c < nside; c++) {
                gp.height = lo + r * step;
                gp.width = lo + c * step;
                cdf_pipe_schedule_mu(f2, &gp, &si);
                const uint64_t b = bits64(si.mu);
                for (int k = 0; k < 8; k++) h = (h ^ ((b >> (8 * k)) & 0xff)) * 0x100000001B3ULL;
            }
        if (h != hash[N]) fail_msg("FLUX.2, %d steps: the cells' mu hash %016llx, diffusers %016llx", N, (unsigned long long)h, (unsigned long long)hash[N]);
    }
    print_message("  %ld sizes: FLUX.1 and FLUX.2 image_seq_len and mu as diffusers (FLUX.2 at 60 step counts)\n", cells);
    cdf_pipeline_free(f1);
    cdf_pipeline_free(f2);
}

/* FLUX.2 reference image sizes (reference_sizes.txt): check_image_input's refusals, the area
 * limit's int(side * sqrt(1024 * 1024 / (w * h))) and the crop to multiples of 16, for every
 * width and height 64..6136 in steps of 24, through cdf_pipe_check_inputs and
 * cdf_pipe_reference_size (what validate and the FLUX.2 pipeline call). */
static void test_reference_sizes(void **state) {
    (void)state;
    size_t len;
    char *txt = tu_read_file(tu_data("fidelity/reference_sizes.txt"), &len);
    assert_non_null(txt);
    int lo = 0, hi = 0, step = 0, want_refused = -1, n_cells = 0;
    uint64_t want_hash = 0;
    char *p = txt, *l;
    static uint8_t px[1];
    cdf_generate_params gp = cdf_generate_params_default();
    cdf_image img = {0, 0, 3, px};
    gp.image = &img;
    gp.num_input_images = 1;
    while ((l = next_line(&p))) {
        if (l[0] == '#' || !l[0]) continue;
        char *save = NULL, *tok = strtok_r(l, " ", &save);
        if (strcmp(tok, "sides") == 0) {
            lo = atoi(strtok_r(NULL, " ", &save));
            hi = atoi(strtok_r(NULL, " ", &save));
            step = atoi(strtok_r(NULL, " ", &save));
        } else if (strcmp(tok, "hash") == 0) {
            want_hash = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
        } else if (strcmp(tok, "refused") == 0) {
            want_refused = atoi(strtok_r(NULL, " ", &save));
        } else if (strcmp(tok, "cell") == 0) {
            int v[4], w, h;
            for (int i = 0; i < 4; i++) v[i] = atoi(strtok_r(NULL, " ", &save));
            img.width = v[0];
            img.height = v[1];
            assert_int_equal(cdf_pipe_check_inputs(&gp, true), CDF_OK);
            cdf_pipe_reference_size(&img, &w, &h);
            if (w != v[2] || h != v[3]) fail_msg("reference %dx%d: %dx%d, diffusers %dx%d", v[0], v[1], w, h, v[2], v[3]);
            n_cells++;
        } else {
            fail_msg("reference_sizes.txt: unknown line '%s'", tok);
        }
    }
    free(txt);
    assert_true(step > 0 && lo >= 1 && hi > lo && want_refused >= 0);
    uint64_t hsh = 0xCBF29CE484222325ULL;
    int refused = 0;
    for (int h = lo; h <= hi; h += step)
        for (int w = lo; w <= hi; w += step) {
            img.width = w;
            img.height = h;
            int r[2] = {0, 0};
            if (cdf_pipe_check_inputs(&gp, true) == CDF_OK) cdf_pipe_reference_size(&img, &r[0], &r[1]);
            else refused++;
            for (int k = 0; k < 2; k++)
                for (int b = 0; b < 4; b++) hsh = (hsh ^ (((uint32_t)r[k] >> (8 * b)) & 0xff)) * 0x100000001B3ULL;
        }
    assert_int_equal(refused, want_refused);
    if (hsh != want_hash) fail_msg("reference sizes: hash %016llx, diffusers %016llx", (unsigned long long)hsh, (unsigned long long)want_hash);
    print_message("  %d refused, %d cells near an int() boundary, all sizes as diffusers\n", refused, n_cells);
}

/* `guidance_scale > 1` (SD3's CFG) and `true_cfg_scale > 1 and has_neg_prompt` (Flux's true CFG)
 * decide on the Python float: 1 + 1e-9 guides (as a float it would be 1.0f and not guide); 1 does
 * not. The negative prompt is encoded only when guiding. */
static bool guides(cdf_pipeline *pipe, double g, bool flux) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a cat";
    gp.negative_prompt = "blurry";
    gp.height = gp.width = 32;
    gp.num_inference_steps = 1;
    gp.max_sequence_length = 16;
    if (flux) gp.true_cfg_scale = g;
    else gp.guidance_scale = g;
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image out;
    if (cdf_pipeline_generate(pipe, &gp, &out) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
    cdf_image_free(&out);
    const bool neg = cdf_tensor_map_get(&cap, "negative_prompt_embeds") != NULL;
    cdf_tensor_map_clear(&cap);
    return neg;
}

static void test_cfg_branches_on_double(void **state) {
    (void)state;
    assert_true((float)(1.0 + 1e-9) == 1.0f); /* what a float field would have made of it */
    cdf_pipeline *sd3 = tu_load_tiny_pipeline("sd35m_tiny"), *flux = tu_load_tiny_pipeline("flux1_dev_tiny");
    assert_true(guides(sd3, 1.0 + 1e-9, false));
    assert_false(guides(sd3, 1.0, false));
    assert_true(guides(flux, 1.0 + 1e-9, true));
    assert_false(guides(flux, 1.0, true));
    cdf_pipeline_free(sd3);
    cdf_pipeline_free(flux);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_strength_differs),
        cmocka_unit_test(test_strength_sweep),
        cmocka_unit_test(test_mu_sweep),
        cmocka_unit_test(test_reference_sizes),
        cmocka_unit_test(test_cfg_branches_on_double),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
