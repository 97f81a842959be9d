/* Step caches against diffusers' own hooks (tests/data/golden/step_cache, made by
 * tools/make-step-cache-golden/make_golden.py: FluxPipeline / FluxImg2ImgPipeline with
 * pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold)) on the tiny FLUX.1 folders).
 *
 * Checked per case: the decision of every transformer call, per cache context ("cond", and
 * "uncond" with true CFG), exactly; the relative change of each call within 1e-3 (information:
 * the golden thresholds are at least 0.01 away from every change); the latents after every step,
 * the final latents and the image within the pipelines' tolerance (5e-4, that folder's README);
 * the report text names the computed steps. Also: threshold 0 (every call computes) gives the
 * uncached forward's latents bit for bit, and bad cache strings are clear errors.
 * The ctest entries test_step_cache_{fuse,compile,blocks} run the same in the other modes. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/flux2_pipeline.h"


/* TaylorSeer's lite mode with bf16 factors rounds the transformer's whole output to bf16 and
 * predicts from it: where a float32 output element lies within our ~1e-6 difference from
 * diffusers' of a bf16 rounding boundary, the two round it one bf16 ulp apart (2^-8 relative,
 * 0.004-0.008 at |v| 1-2), and that ulp times the step's sigma difference reaches the latents of
 * a few elements: one flip moves an element by up to 0.0078 x dt (about 6.5e-4 at 12 steps), and
 * an element can take several over the steps, as the run goes on with the flipped values
 * (measured: 1-8 of 1024 elements over 5e-4 per step, 1.9e-3 at worst after the last; every other
 * element within 5e-4, the image within 2e-4). For such a case (g_flips set) at most 1% of the
 * elements may differ by more than the 5e-4 tolerance, and those by at most g_flips; the bf16 lite
 * golden case is checked so, its float32 twin (ts_dev_lite_truecfg_f32_order2) with the plain 5e-4. */
static double g_flips, g_flip_max;

static double cmp_block(cdf_tensor *t, cdf_st_file *gf, const char *gkey, int64_t block) {
    const cdf_st_tensor *g = cdf_st_find(gf, gkey);
    assert_non_null(t);
    assert_non_null(g);
    float *ours = cdf_tensor_read_f32(t);
    assert_non_null(ours);
    const int64_t n = cdf_tensor_numel(t);
    assert_true((block + 1) * n <= cdf_st_numel(g));
    float *ref = malloc((size_t)n * sizeof *ref);
    cdf_convert(ref, CDF_F32, (const char *)cdf_st_data(gf, g) + block * n * cdf_dtype_size(g->dtype), g->dtype, (size_t)n);
    double d = tu_max_abs_diff(ours, ref, (size_t)n, NULL);
    if (g_flips > 0 && d > 5e-4) { /* see g_flips: few elements, each within g_flips */
        int64_t over = 0;
        for (int64_t i = 0; i < n; i++) over += fabs(ours[i] - ref[i]) > 5e-4;
        print_message("  %s[%lld]: max|diff| %.3g at %lld of %lld elements over 5e-4 (bf16 rounding flips: at most 1%%, each <= %g)\n",
                      gkey, (long long)block, d, (long long)over, (long long)n, g_flips);
        if (over * 100 <= n && d <= g_flips) g_flip_max = fmax(g_flip_max, d), d = 0;
    }
    free(ours);
    free(ref);
    return d;
}

/* The numbers of a printed Python list "[a, b, ...]" (at most cap). */
static int parse_list(const char *line, double *v, int cap) {
    int n = 0;
    const char *p = line + 1;
    while (n < cap && *p && *p != ']') {
        char *end;
        v[n++] = strtod(p, &end);
        if (end == p) return -1;
        p = end + strspn(end, ", ");
    }
    return n;
}

/* MagCache's calibrate=True against diffusers': the ratios measured per context (captured, and
 * printed) within CALIB_TOL of the ones diffusers printed, and the printed text line for line
 * (every line but the lists exactly). */
#define CALIB_TOL 2e-5 /* measured 2.4e-6 at worst (float32 norms over residuals that differ ~1e-6) */
static void check_calibration(const char *name, const cJSON *js, cdf_tensor_map *cap, FILE *printed) {
    const cJSON *lists = cJSON_GetObjectItem(js, "calibration_ratios"), *text = cJSON_GetObjectItem(js, "calibration_stdout");
    assert_true(cJSON_IsArray(lists) && cJSON_IsString(text));
    static const char *const ctx[2] = {"cond", "uncond"}; /* printed in this order (cond's last call comes first) */
    for (int c = 0; c < cJSON_GetArraySize(lists); c++) {
        char key[64];
        snprintf(key, sizeof key, "cache_calibration.%s", ctx[c]);
        cdf_tensor *t = cdf_tensor_map_get(cap, key);
        assert_non_null(t);
        const cJSON *want = cJSON_GetArrayItem(lists, c);
        assert_int_equal(cdf_tensor_numel(t), cJSON_GetArraySize(want));
        float *got = cdf_tensor_read_f32(t);
        double worst = 0;
        for (int i = 0; i < cJSON_GetArraySize(want); i++) {
            const double d = fabs(got[i] - cJSON_GetArrayItem(want, i)->valuedouble);
            worst = d > worst ? d : worst;
        }
        print_message("  %s calibration %s: %d ratios, max|diff| %.3g (tol %g)\n", name, ctx[c], cJSON_GetArraySize(want), worst, CALIB_TOL);
        assert_true(worst <= CALIB_TOL);
        free(got);
    }
    /* the text, line for line */
    static char ours[65536];
    rewind(printed);
    const size_t n = fread(ours, 1, sizeof ours - 1, printed);
    ours[n] = '\0';
    const char *a = ours, *b = text->valuestring;
    int lines = 0;
    while (*a || *b) {
        const size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (b[0] == '[' && b[1] != 'M') { /* a list: the same count, each value within CALIB_TOL */
            double va[1024], vb[1024];
            const int na = a[0] == '[' ? parse_list(a, va, 1024) : -1, nb = parse_list(b, vb, 1024);
            assert_int_equal(na, nb);
            for (int i = 0; i < nb; i++) assert_true(fabs(va[i] - vb[i]) <= CALIB_TOL);
        } else if (la != lb || memcmp(a, b, la) != 0) {
            fail_msg("%s: printed '%.*s', diffusers '%.*s'", name, (int)la, a, (int)lb, b);
        }
        a += la + (a[la] == '\n'), b += lb + (b[lb] == '\n'), lines++;
    }
    print_message("  %s: printed %d lines as diffusers does\n", name, lines);
}

static cdf_pipeline *load_tiny_offload(const char *folder, cdf_offload_mode offload) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", tu_data("pipelines"), folder);
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32; /* diffusers ran in float32 */
    lp.offload = offload;
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(dir, &lp, &pipe) != CDF_OK) fail_msg("load %s: %s", dir, cdf_last_error());
    return pipe;
}

static cdf_pipeline *load_tiny(const char *folder) { return load_tiny_offload(folder, CDF_OFFLOAD_NONE); }

static void run_case(const char *name, cdf_offload_mode offload) {
    char dir[1024], path[1200], spec[1024];
    snprintf(dir, sizeof dir, "%s/golden/step_cache/%s", tu_data(""), name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    cJSON *js = tu_read_json(path);
    const cJSON *call = cJSON_GetObjectItem(js, "call");
    cdf_generate_params gp = cdf_generate_params_default();
    const cJSON *prompt = cJSON_GetObjectItem(call, "prompt");
    gp.prompt = cJSON_IsString(prompt) ? prompt->valuestring : NULL; /* FLUX.2: the golden prompt_embeds */
    const cJSON *neg = cJSON_GetObjectItem(call, "negative_prompt"), *tcfg = cJSON_GetObjectItem(call, "true_cfg_scale");
    if (neg) gp.negative_prompt = neg->valuestring;
    if (tcfg) gp.true_cfg_scale = (float)tcfg->valuedouble;
    gp.height = cJSON_GetObjectItem(call, "height")->valueint;
    gp.width = cJSON_GetObjectItem(call, "width")->valueint;
    gp.num_inference_steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    const cJSON *gs = cJSON_GetObjectItem(call, "guidance_scale"), *strength = cJSON_GetObjectItem(call, "strength");
    if (gs) gp.guidance_scale = (float)gs->valuedouble;
    if (strength) gp.strength = (float)strength->valuedouble;
    const cJSON *msl = cJSON_GetObjectItem(call, "max_sequence_length");
    if (msl) gp.max_sequence_length = msl->valueint;
    gp.seed = (uint64_t)cJSON_GetObjectItem(js, "seeds")->valuedouble;
    /* the cache string, and the report's head the decisions must follow */
    const cJSON *mag = cJSON_GetObjectItem(js, "mag"), *ts = cJSON_GetObjectItem(js, "taylorseer");
    char want_report[1024];
    int wn;
    bool calibrate = false; /* MagCache's calibrate=True: what it prints is checked too */
    if (cJSON_IsObject(ts)) {
        /* TaylorSeerCacheConfig's defaults where the case sets none */
        const cJSON *ci = cJSON_GetObjectItem(ts, "cache_interval"), *bf = cJSON_GetObjectItem(ts, "disable_cache_before_step"),
                    *af = cJSON_GetObjectItem(ts, "disable_cache_after_step"), *mo = cJSON_GetObjectItem(ts, "max_order"),
                    *dt = cJSON_GetObjectItem(ts, "taylor_factors_dtype");
        char after[16] = "None";
        if (af) snprintf(after, sizeof after, "%d", af->valueint);
        snprintf(spec, sizeof spec, "taylorseer:cache_interval=%d,disable_cache_before_step=%d,disable_cache_after_step=%s,max_order=%d,"
                 "taylor_factors_dtype=%s%s", ci ? ci->valueint : 5, bf ? bf->valueint : 3, after, mo ? mo->valueint : 1,
                 dt ? dt->valuestring : "bfloat16", cJSON_IsTrue(cJSON_GetObjectItem(ts, "use_lite_mode")) ? ",use_lite_mode=True" : "");
        wn = snprintf(want_report, sizeof want_report, "%s, full steps", spec);
    } else if (cJSON_IsObject(mag)) {
        /* MagCacheConfig's defaults where the case sets none */
        const cJSON *t = cJSON_GetObjectItem(mag, "threshold"), *k = cJSON_GetObjectItem(mag, "max_skip_steps"),
                    *r = cJSON_GetObjectItem(mag, "retention_ratio"), *n = cJSON_GetObjectItem(mag, "num_inference_steps");
        const double th = t ? t->valuedouble : 0.06, rr = r ? r->valuedouble : 0.2;
        const int ks = k ? k->valueint : 3;
        int sn = snprintf(spec, sizeof spec, "mag:threshold=%.17g,max_skip_steps=%d,retention_ratio=%.17g,num_inference_steps=%d", th,
                          ks, rr, n->valueint);
        wn = snprintf(want_report, sizeof want_report, "mag:threshold=%g,max_skip_steps=%d,retention_ratio=%g,num_inference_steps=%d",
                      th, ks, rr, n->valueint);
        /* the case's own mag_ratios, as a Python list (the report: each value's shortest float32
         * text, which for these short decimals is %g's) */
        const cJSON *mr = cJSON_GetObjectItem(mag, "mag_ratios"), *v;
        int i = 0;
        cJSON_ArrayForEach(v, mr) {
            sn += snprintf(spec + sn, sizeof spec - sn, "%s%.17g", i ? ", " : ",mag_ratios=[", v->valuedouble);
            wn += snprintf(want_report + wn, sizeof want_report - wn, "%s%g", i++ ? ", " : ",mag_ratios=[", v->valuedouble);
        }
        if (i) sn += snprintf(spec + sn, sizeof spec - sn, "]"), wn += snprintf(want_report + wn, sizeof want_report - wn, "]");
        if ((calibrate = cJSON_IsTrue(cJSON_GetObjectItem(mag, "calibrate")))) {
            sn += snprintf(spec + sn, sizeof spec - sn, ",calibrate=True");
            wn += snprintf(want_report + wn, sizeof want_report - wn, ",calibrate=True");
        }
        wn += snprintf(want_report + wn, sizeof want_report - wn, ", full steps");
    } else {
        const double threshold = cJSON_GetObjectItem(js, "threshold")->valuedouble;
        snprintf(spec, sizeof spec, "first-block:%.17g", threshold);
        wn = snprintf(want_report, sizeof want_report, "first-block:%g, full steps", threshold);
    }
    gp.cache = spec;
    cdf_png_image png = {0}, png_mask = {0};
    cdf_image img, mask_img;
    const cJSON *img_in = cJSON_GetObjectItem(js, "image_in");
    if (cJSON_IsString(img_in)) {
        snprintf(path, sizeof path, "%s/%s", dir, img_in->valuestring);
        if (cdf_png_read(path, &png) != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
        img = (cdf_image){.width = png.width, .height = png.height, .channels = png.channels, .pixels = png.pixels};
        gp.image = &img;
    }
    const cJSON *mask_in = cJSON_GetObjectItem(js, "mask_in");
    if (cJSON_IsString(mask_in)) {
        snprintf(path, sizeof path, "%s/%s", dir, mask_in->valuestring);
        if (cdf_png_read(path, &png_mask) != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
        mask_img = (cdf_image){.width = png_mask.width, .height = png_mask.height, .channels = png_mask.channels, .pixels = png_mask.pixels};
        gp.mask_image = &mask_img;
    }
    cdf_pipeline *pipe = load_tiny_offload(strrchr(cJSON_GetObjectItem(js, "folder")->valuestring, '/') + 1, offload);
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image out;
    cdf_tensor_map f2;
    cdf_tensor_map_init(&f2);
    /* calibration prints to stdout (as diffusers does): catch it in a file */
    FILE *printed = calibrate ? tmpfile() : NULL;
    int saved_stdout = -1;
    if (calibrate) {
        assert_non_null(printed);
        fflush(stdout);
        saved_stdout = dup(1);
        assert_true(saved_stdout >= 0 && dup2(fileno(printed), 1) >= 0);
    }
    if (!prompt) { /* Flux2Pipeline with the flux2_dev_tiny 64x64 case's prompt_embeds; the image is a reference */
        if (gp.image) gp.num_input_images = 1;
        tu_load_map(&f2, "pipelines/flux2_dev_tiny/cases/64x64/expected.safetensors");
        if (cdf_flux2_generate_from_embeds(pipe, &gp, cdf_tensor_map_get(&f2, "prompt_embeds"), &out) != CDF_OK)
            fail_msg("generate %s: %s", name, cdf_last_error());
        for (int st = 0; st < cJSON_GetObjectItem(js, "steps_run")->valueint; st++) { /* FLUX.2's step captures */
            char from[64], to[64];
            snprintf(from, sizeof from, "step%02d.latents", st);
            snprintf(to, sizeof to, "latents_after_step.%d", st);
            assert_int_equal(cdf_tensor_map_set(&cap, to, cdf_tensor_map_get(&cap, from)), CDF_OK);
        }
    } else if (cdf_pipeline_generate(pipe, &gp, &out) != CDF_OK) {
        fail_msg("generate %s: %s", name, cdf_last_error());
    }
    if (calibrate) {
        fflush(stdout);
        dup2(saved_stdout, 1);
        close(saved_stdout);
        check_calibration(name, js, &cap, printed);
        fclose(printed);
    }

    /* decisions, per context in call order */
    const cJSON *decisions = cJSON_GetObjectItem(js, "decisions");
    const char *ctxs[2] = {"cond", "uncond"};
    const bool two = cJSON_GetObjectItem(cJSON_GetObjectItem(js, "computed_steps"), "uncond") != NULL;
    for (int c = 0; c < 2; c++) {
        char key[64];
        snprintf(key, sizeof key, "cache_computed.%s", ctxs[c]);
        cdf_tensor *flags = cdf_tensor_map_get(&cap, key);
        snprintf(key, sizeof key, "cache_change.%s", ctxs[c]);
        cdf_tensor *change = cdf_tensor_map_get(&cap, key);
        float *f = flags ? cdf_tensor_read_f32(flags) : NULL, *ch = change ? cdf_tensor_read_f32(change) : NULL;
        int k = 0, full = 0;
        bool first = true;
        const cJSON *d;
        cJSON_ArrayForEach(d, decisions) {
            /* MagCache without a pipeline context (img2img) names its one context "inference" */
            const char *dc = cJSON_GetObjectItem(d, "context")->valuestring;
            if (strcmp(strcmp(dc, "inference") == 0 ? "cond" : dc, ctxs[c]) != 0) continue;
            if (first) wn += snprintf(want_report + wn, sizeof want_report - wn, "%s%s%s", c ? ", " : " ", two ? ctxs[c] : "", two ? " " : "");
            first = false;
            assert_non_null(f);
            assert_true(k < cdf_tensor_numel(flags));
            const bool want = cJSON_IsTrue(cJSON_GetObjectItem(d, "computed"));
            const cJSON *gc = cJSON_GetObjectItem(d, "change");
            print_message("  %s %s call %d: change %.6f (diffusers %.6f) %s (diffusers %s)\n", name, ctxs[c], k, (double)ch[k],
                          cJSON_IsNumber(gc) ? gc->valuedouble : NAN, f[k] != 0 ? "full" : "skip", want ? "full" : "skip");
            if ((f[k] != 0) != want) fail_msg("%s %s call %d: %s, diffusers %s", name, ctxs[c], k, f[k] != 0 ? "full" : "skipped", want ? "full" : "skipped");
            if (cJSON_IsNumber(gc)) assert_true(fabs(ch[k] - gc->valuedouble) <= 1e-3);
            else if (!cJSON_IsObject(mag) && !cJSON_IsObject(ts)) assert_true(isnan(ch[k])); /* FBC's first call */
            if (want) wn += snprintf(want_report + wn, sizeof want_report - wn, "%s%d", full++ ? "," : "", k);
            k++;
        }
        if (!first) wn += snprintf(want_report + wn, sizeof want_report - wn, " (%d of %d)", full, k);
        if (flags) assert_int_equal(cdf_tensor_numel(flags), k);
        else assert_int_equal(k, 0);
        free(f);
        free(ch);
    }
    const char *rep = cdf_pipeline_cache_report(pipe, 0);
    assert_non_null(rep);
    print_message("  %s report: %s\n", name, rep);
    if (calibrate) { /* + ", calibrated mag_ratios [...]": the values are checked above */
        assert_memory_equal(rep, want_report, strlen(want_report));
        assert_non_null(strstr(rep + strlen(want_report), ", calibrated mag_ratios "));
    } else {
        assert_string_equal(rep, want_report);
    }

    /* latents and image */
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    cdf_st_file *gf;
    assert_int_equal(cdf_st_open(path, &gf), CDF_OK);
    const int steps_run = cJSON_GetObjectItem(js, "steps_run")->valueint;
    for (int s = 0; s < steps_run; s++) {
        char key[64];
        snprintf(key, sizeof key, "latents_after_step.%d", s);
        double d = cmp_block(cdf_tensor_map_get(&cap, key), gf, "latents_after_step", s);
        if (!(d <= 5e-4)) fail_msg("%s latents after step %d: max|diff| %.3g > 5e-4", name, s, d);
    }
    double dl = cmp_block(cdf_tensor_map_get(&cap, "latents_final"), gf, "latents_final", 0);
    double di = cmp_block(cdf_tensor_map_get(&cap, "image"), gf, "image", 0);
    print_message("  %s latents_final max|diff| %.3g, image %.3g (tol 5e-4)\n", name, dl, di);
    assert_true(dl <= 5e-4);
    assert_true(di <= 5e-4);
    cdf_st_close(gf);
    cdf_image_free(&out);
    cdf_tensor_map_clear(&cap);
    cdf_tensor_map_clear(&f2);
    cdf_pipeline_free(pipe);
    cdf_png_image_free(&png);
    cdf_png_image_free(&png_mask);
    cJSON_Delete(js);
}

static void test_fbc_dev(void **state) { (void)state, run_case("fbc_dev_64x64", CDF_OFFLOAD_NONE); }
static void test_fbc_dev_truecfg(void **state) { (void)state, run_case("fbc_dev_truecfg_64x64", CDF_OFFLOAD_NONE); }
static void test_fbc_schnell(void **state) { (void)state, run_case("fbc_schnell_48x80", CDF_OFFLOAD_NONE); }
static void test_fbc_img2img(void **state) { (void)state, run_case("fbc_img2img_s08_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_dev(void **state) { (void)state, run_case("mag_dev_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_dev_truecfg_fields(void **state) { (void)state, run_case("mag_dev_truecfg_fields_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_schnell_28steps(void **state) { (void)state, run_case("mag_schnell_28steps_48x80", CDF_OFFLOAD_NONE); }
static void test_mag_img2img(void **state) { (void)state, run_case("mag_img2img_s08_64x64", CDF_OFFLOAD_NONE); }
static void test_taylorseer_dev(void **state) { (void)state, run_case("ts_dev_64x64", CDF_OFFLOAD_NONE); }
static void test_taylorseer_truecfg_f32_order2(void **state) {
    (void)state, run_case("ts_dev_truecfg_f32_order2_64x64", CDF_OFFLOAD_NONE);
}
static void test_taylorseer_schnell_after(void **state) { (void)state, run_case("ts_schnell_after8_48x80", CDF_OFFLOAD_NONE); }
static void test_mag_inpaint(void **state) { (void)state, run_case("mag_inpaint_s09_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_flux2(void **state) { (void)state, run_case("mag_flux2_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_flux2_reference(void **state) { (void)state, run_case("mag_flux2_ref1_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_ratios(void **state) { (void)state, run_case("mag_dev_ratios_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_calibrate(void **state) { (void)state, run_case("mag_dev_calibrate_truecfg_64x64", CDF_OFFLOAD_NONE); }
static void test_mag_calibrate_flux2(void **state) { (void)state, run_case("mag_flux2_calibrate_64x64", CDF_OFFLOAD_NONE); }
static void test_taylorseer_lite(void **state) {
    (void)state;
    g_flips = 5e-3, g_flip_max = 0; /* see g_flips */
    run_case("ts_dev_lite_64x64", CDF_OFFLOAD_NONE);
    print_message("  ts_dev_lite_64x64: the bf16 rounding flips moved the latents by %.3g at most\n", g_flip_max);
    g_flips = 0;
}
static void test_taylorseer_lite_truecfg_f32_order2(void **state) {
    (void)state, run_case("ts_dev_lite_truecfg_f32_order2_64x64", CDF_OFFLOAD_NONE);
}

/* 4 steps at 32x32 of "a cat", seed 3 */
static cdf_generate_params small_request(const char *cache) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a cat", gp.seed = 3, gp.cache = cache;
    gp.height = gp.width = 32, gp.num_inference_steps = 4, gp.max_sequence_length = 16;
    return gp;
}

/* final latents of a small dev run with the given cache string (NULL = none) */
static float *final_latents(cdf_pipeline *pipe, const char *cache, bool true_cfg, int64_t *n) {
    cdf_generate_params gp = small_request(cache);
    if (true_cfg) {
        gp.negative_prompt = "a dog";
        gp.true_cfg_scale = 1.5f;
    }
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image out;
    if (cdf_pipeline_generate(pipe, &gp, &out) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
    cdf_tensor *t = cdf_tensor_map_get(&cap, "latents_final");
    assert_non_null(t);
    *n = cdf_tensor_numel(t);
    float *v = cdf_tensor_read_f32(t);
    cdf_image_free(&out);
    cdf_tensor_map_clear(&cap);
    return v;
}

/* Model and sequential offload (the transformer's blocks host-side, materialised per block call)
 * run the same parts: diffusers' decisions and latents. */
static void test_offload(void **state) {
    (void)state;
    run_case("fbc_dev_truecfg_64x64", CDF_OFFLOAD_MODEL);
    run_case("fbc_dev_truecfg_64x64", CDF_OFFLOAD_SEQUENTIAL);
    run_case("mag_dev_truecfg_fields_64x64", CDF_OFFLOAD_SEQUENTIAL);
    run_case("ts_dev_truecfg_f32_order2_64x64", CDF_OFFLOAD_SEQUENTIAL);
}

/* LoRA (run-time and fused): threshold 0 through the split forward equals the uncached run with
 * the adapter bit for bit; a huge threshold changes the result. */
static void test_lora(void **state) {
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/lora/pipe_flux_te_peft.safetensors", CDF_TEST_DATA); /* transformer + text encoder */
    for (int mode = 0; mode < 2; mode++) {
        cdf_pipeline *pipe = load_tiny("flux1_dev_tiny");
        cdf_lora_params lp = cdf_lora_params_default();
        lp.mode = mode ? CDF_LORA_FUSE : CDF_LORA_RUNTIME;
        lp.scale = 0.7f;
        if (cdf_pipeline_load_lora(pipe, path, &lp, NULL) != CDF_OK) fail_msg("lora: %s", cdf_last_error());
        int64_t n0, n1, n2;
        float *plain = final_latents(pipe, NULL, true, &n0), *t0 = final_latents(pipe, "first-block:0", true, &n1);
        float *big = final_latents(pipe, "first-block:1e9", true, &n2);
        assert_int_equal(n0, n1);
        assert_memory_equal(plain, t0, (size_t)n0 * sizeof *plain);
        assert_true(memcmp(plain, big, (size_t)n0 * sizeof *plain) != 0);
        free(plain), free(t0), free(big);
        cdf_pipeline_free(pipe);
    }
}

/* Threshold 0: every call computes (a change is > 0), through fbc_head + fbc_tail: the same
 * latents as the plain forward, bit for bit; a huge threshold skips every call after the first,
 * which must change them. */
static void test_split_forward_is_exact(void **state) {
    (void)state;
    cdf_pipeline *pipe = load_tiny("flux1_dev_tiny");
    for (int cfg = 0; cfg < 2; cfg++) {
        int64_t n0, n1, n2;
        float *plain = final_latents(pipe, NULL, cfg, &n0);
        float *t0 = final_latents(pipe, "first-block:0", cfg, &n1);
        assert_int_equal(n0, n1);
        assert_memory_equal(plain, t0, (size_t)n0 * sizeof *plain);
        assert_string_equal(cdf_pipeline_cache_report(pipe, 0), cfg ? "first-block:0, full steps cond 0,1,2,3 (4 of 4), uncond 0,1,2,3 (4 of 4)"
                                                                 : "first-block:0, full steps 0,1,2,3 (4 of 4)");
        float *big = final_latents(pipe, "first-block:1e9", cfg, &n2);
        assert_string_equal(cdf_pipeline_cache_report(pipe, 0), cfg ? "first-block:1e+09, full steps cond 0 (1 of 4), uncond 0 (1 of 4)"
                                                                  : "first-block:1e+09, full steps 0 (1 of 4)");
        assert_true(memcmp(plain, big, (size_t)n0 * sizeof *plain) != 0);
        float *none = final_latents(pipe, "none", cfg, &n2);
        assert_memory_equal(plain, none, (size_t)n0 * sizeof *plain);
        assert_null(cdf_pipeline_cache_report(pipe, 0));
        free(plain), free(t0), free(big), free(none);
    }
    cdf_pipeline_free(pipe);
}

/* Compile mode: each cache's parts are graphs compiled once per shape; more steps and other
 * decisions replay them (a recompile would be an error); First Block Cache adds one host read per
 * call after the first (the change), MagCache's calibration likewise (the ratio), MagCache and
 * TaylorSeer (lite mode too) none. */
static void test_compiled_parts_never_recompile(void **state) {
    (void)state;
    /* each cache with settings that both compute and skip within 4 steps, and the host reads it
     * adds per generation: First Block Cache one per call after the first, the others none */
    static const struct {
        const char *cache;
        uint64_t reads;
    } cases[] = {
        {"first-block:0.9", 3},
        {"mag:retention_ratio=0", 0},
        {"taylorseer:disable_cache_before_step=1,cache_interval=2", 0},
        {"taylorseer:disable_cache_before_step=1,cache_interval=2,use_lite_mode=True", 0},
        {"mag:calibrate=True", 3}, /* one read per call after the first (the ratio); never skips */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        cdf_pipeline *pipe = load_tiny("flux1_dev_tiny");
        cdf_compile_options o = cdf_compile_options_default();
        assert_int_equal(cdf_pipeline_compile(pipe, &o), CDF_OK);
        int64_t n;
        free(final_latents(pipe, cases[ci].cache, false, &n)); /* compiles the parts */
        const char *rep = cdf_pipeline_cache_report(pipe, 0);
        print_message("  %s\n", rep);
        if (!strstr(cases[ci].cache, "calibrate")) /* both kinds of step ran */
            assert_true(!strstr(rep, "(1 of 4)") && !strstr(rep, "(4 of 4)"));
        cdf_exec_stats a, b, c;
        cdf_exec_get_stats(&a);
        cdf_compile_set_forbid_recompile(true);
        free(final_latents(pipe, NULL, false, &n));
        cdf_exec_get_stats(&b);
        free(final_latents(pipe, cases[ci].cache, false, &n));
        cdf_exec_get_stats(&c);
        cdf_compile_set_forbid_recompile(false);
        print_message("  compiles %llu -> %llu -> %llu, host syncs uncached %llu, cached %llu\n", (unsigned long long)a.compiles,
                      (unsigned long long)b.compiles, (unsigned long long)c.compiles,
                      (unsigned long long)(b.host_syncs - a.host_syncs), (unsigned long long)(c.host_syncs - b.host_syncs));
        assert_true(c.compiles == b.compiles); /* (the uncached run may compile forward, once) */
        assert_true(c.host_syncs - b.host_syncs == (b.host_syncs - a.host_syncs) + cases[ci].reads);
        cdf_pipeline_free(pipe);
    }
}

/* Batches: each image of a seed list takes its own decisions (docs/step-caches.md) and equals its
 * single-seed image with the same cache; each has its own report. */
static void test_batch_images_decide_alone(void **state) {
    (void)state;
    cdf_pipeline *pipe = load_tiny("flux1_dev_tiny");
    uint64_t seeds[2] = {5, 6};
    cdf_generate_params gp = small_request("first-block:0.9");
    gp.num_inference_steps = 6, gp.seeds = seeds, gp.num_seeds = 2;
    cdf_image batch[2], one;
    if (cdf_pipeline_generate_images(pipe, &gp, batch, 2) != CDF_OK) fail_msg("batch: %s", cdf_last_error());
    char rep[2][512];
    for (int k = 0; k < 2; k++) {
        assert_non_null(cdf_pipeline_cache_report(pipe, k));
        snprintf(rep[k], sizeof rep[k], "%s", cdf_pipeline_cache_report(pipe, k));
    }
    assert_null(cdf_pipeline_cache_report(pipe, 2));
    gp.seeds = NULL;
    gp.num_seeds = 0;
    for (int k = 0; k < 2; k++) {
        gp.seed = seeds[k];
        const cdf_status st = cdf_pipeline_generate(pipe, &gp, &one);
        const char *alone = st == CDF_OK ? cdf_pipeline_cache_report(pipe, 0) : NULL;
        print_message("  image %d: %s (alone: %s)\n", k, rep[k], alone ? alone : "-");
        assert_true(alone && strcmp(alone, rep[k]) == 0);
        const bool same = one.width == batch[k].width && one.height == batch[k].height &&
                          memcmp(one.pixels, batch[k].pixels, (size_t)one.width * one.height * 3) == 0;
        cdf_image_free(&batch[k]);
        cdf_image_free(&one);
        assert_true(same);
    }
    cdf_pipeline_free(pipe);
}

static void test_bad_cache_strings(void **state) {
    (void)state;
    assert_int_equal(cdf_pipeline_cache_check(NULL), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check(""), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("none"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("first-block"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("first-block:0.2"), CDF_OK);
    const char *bad[] = {"first-blok", "first-block:", "first-block:abc", "first-block:0.2x", "first-block:-0.1",
                         "first-block:nan", "first-block:inf", "first-block0.2", "fbc", "First-Block"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(cdf_pipeline_cache_check(bad[i]), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), bad[i]));
    }
    assert_int_equal(cdf_pipeline_cache_check("mag"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("mag:threshold=0.1,max_skip_steps=2,retention_ratio=0,num_inference_steps=28"), CDF_OK);
    const char *bad_mag[] = {"mag:", "mag:threshold", "mag:threshold=", "mag:threshold=x", "mag:threshold=-1", "mag:foo=1",
                             "mag:max_skip_steps=1.5", "mag:num_inference_steps=0", "mag:threshold=0.1,", "magic"};
    for (size_t i = 0; i < sizeof bad_mag / sizeof *bad_mag; i++) {
        assert_int_equal(cdf_pipeline_cache_check(bad_mag[i]), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), bad_mag[i]));
    }
    assert_int_equal(cdf_pipeline_cache_check("mag:calibrate=True"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("mag:mag_ratios=[1.0, 1.2109400033950806,0.9],threshold=0.1"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("mag:threshold=0.1,mag_ratios=[ 1 ],calibrate=False"), CDF_OK);
    const char *bad_mag2[] = {"mag:calibrate=yes", "mag:mag_ratios=1", "mag:mag_ratios=[]", "mag:mag_ratios=[1,]", "mag:mag_ratios=[1,x]",
                              "mag:mag_ratios=[1,nan]", "mag:mag_ratios=[1,inf]", "mag:mag_ratios=[1,2", "mag:mag_ratios=[1]x",
                              "mag:mag_ratios=[1],", "mag:mag_ratios=(1,2)"};
    for (size_t i = 0; i < sizeof bad_mag2 / sizeof *bad_mag2; i++) {
        assert_int_equal(cdf_pipeline_cache_check(bad_mag2[i]), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), bad_mag2[i]));
    }
    char many[16384] = "mag:mag_ratios=[1";
    for (int i = 0; i < 1000; i++) strcat(many, ",1");
    strcat(many, "]");
    assert_int_equal(cdf_pipeline_cache_check(many), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "more than 1000 mag_ratios"));
    assert_int_equal(cdf_pipeline_cache_check("taylorseer"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("taylorseer:use_lite_mode=True"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("taylorseer:use_lite_mode=False,max_order=2"), CDF_OK);
    assert_int_equal(cdf_pipeline_cache_check("taylorseer:use_lite_mode=maybe"), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_pipeline_cache_check("taylorseer:cache_identifiers=x"), CDF_ERR_UNSUPPORTED);
    assert_int_equal(cdf_pipeline_cache_check("taylorseer:cache_interval=2,disable_cache_after_step=None,taylor_factors_dtype=float16"), CDF_OK);
    const char *bad_ts[] = {"taylorseer:", "taylorseer:cache_interval=0", "taylorseer:max_order=-1", "taylorseer:max_order=9",
                            "taylorseer:taylor_factors_dtype=int8", "taylorseer:disable_cache_after_step=x", "taylorseer:x=1",
                            "taylorseer:cache_interval", "taylorseers"};
    for (size_t i = 0; i < sizeof bad_ts / sizeof *bad_ts; i++) {
        assert_int_equal(cdf_pipeline_cache_check(bad_ts[i]), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), bad_ts[i]));
    }
    /* generate refuses them before any work, and a model without the cache */
    cdf_pipeline *pipe = load_tiny("flux1_dev_tiny");
    cdf_generate_params gp = small_request("first-block:x");
    cdf_image out;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &out), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "first-block:x"));
    cdf_pipeline_free(pipe);
    pipe = load_tiny("sd35m_tiny");
    gp.cache = "mag";
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &out), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "MagCache runs on FLUX.1 and FLUX.2 only"));
    gp.cache = "first-block";
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &out), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "first-block cache runs on FLUX.1 only"));
    cdf_pipeline_free(pipe);
    /* TaylorSeer (lite mode too) on FLUX.2: diffusers raises there (no cache context), so does cdiffusers */
    pipe = load_tiny("flux2_dev_tiny");
    const char *ts_flux2[] = {"taylorseer", "taylorseer:use_lite_mode=True"};
    for (int i = 0; i < 2; i++) {
        gp.cache = ts_flux2[i];
        assert_int_equal(cdf_pipeline_generate(pipe, &gp, &out), CDF_ERR_UNSUPPORTED);
        assert_non_null(strstr(cdf_last_error(), "TaylorSeer does not run on FLUX.2"));
        assert_non_null(strstr(cdf_last_error(), "No cache context is set"));
    }
    cdf_pipeline_free(pipe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fbc_dev),          cmocka_unit_test(test_fbc_dev_truecfg),
        cmocka_unit_test(test_fbc_schnell),      cmocka_unit_test(test_fbc_img2img),
        cmocka_unit_test(test_mag_dev),          cmocka_unit_test(test_mag_dev_truecfg_fields),
        cmocka_unit_test(test_mag_schnell_28steps), cmocka_unit_test(test_mag_img2img),
        cmocka_unit_test(test_mag_inpaint),      cmocka_unit_test(test_mag_flux2),
        cmocka_unit_test(test_mag_flux2_reference),
        cmocka_unit_test(test_taylorseer_dev),   cmocka_unit_test(test_taylorseer_truecfg_f32_order2),
        cmocka_unit_test(test_taylorseer_schnell_after),
        cmocka_unit_test(test_taylorseer_lite),  cmocka_unit_test(test_taylorseer_lite_truecfg_f32_order2),
        cmocka_unit_test(test_mag_ratios),       cmocka_unit_test(test_mag_calibrate),
        cmocka_unit_test(test_mag_calibrate_flux2),
        cmocka_unit_test(test_split_forward_is_exact), cmocka_unit_test(test_offload),
        cmocka_unit_test(test_lora),             cmocka_unit_test(test_compiled_parts_never_recompile),
        cmocka_unit_test(test_batch_images_decide_alone), cmocka_unit_test(test_bad_cache_strings),
    };
    return cmocka_run_group_tests_name("step_cache", tests, NULL, NULL);
}
