/* FlowMatchEulerDiscreteScheduler: every golden scheduler case bit for bit (sigmas, timesteps,
 * the transformer's timestep inputs, the pipelines' mu helpers) and the golden Euler step
 * loops, plus config parsing and error handling.
 * Golden data: tests/data/scheduler/ (byte-identical copies of golden scheduler/). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/rng.h"
#include "cdiffusers/scheduler.h"

/* ---- a tiny self-contained safetensors reader (the test must not depend on src/io) ------ */

typedef struct {
    char *buf;
    size_t len;
    cJSON *header;
    size_t data_start;
} st_file;

static int st_open(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->buf = tu_read_file(path, &f->len);
    if (!f->buf || f->len < 8) return -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)f->buf[i];
    if (hlen > f->len - 8) return -1;
    f->header = cJSON_ParseWithLength(f->buf + 8, (size_t)hlen);
    if (!f->header) return -1;
    f->data_start = 8 + (size_t)hlen;
    return 0;
}

static void st_close(st_file *f) {
    cJSON_Delete(f->header);
    free(f->buf);
}

/* float32 tensor `key` with exactly `numel` elements (fails the test otherwise). */
static const float *st_f32(const st_file *f, const char *key, int64_t numel) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, key);
    if (!t) fail_msg("golden tensor %s missing", key);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    assert_true(cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0);
    assert_int_equal(cJSON_GetArraySize(off), 2);
    size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, e = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    assert_true(e >= b && f->data_start + e <= f->len);
    assert_int_equal(e - b, (size_t)numel * 4);
    return (const float *)(f->buf + f->data_start + b);
}

static cJSON *load_json(const char *rel) {
    char *txt = tu_read_file(tu_data(rel), NULL);
    assert_non_null(txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    return j;
}

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static void expect_floats(const char *what, const char *name, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], 4) != 0)
            fail_msg("%s %s[%lld]: got %.9g want %.9g", name, what, (long long)i, (double)got[i], (double)want[i]);
    }
}

/* A JSON array of exact decimal float32 values -> floats (strtod is exact for these). */
static float *json_floats(const cJSON *arr, int64_t n) {
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), n);
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = (float)cJSON_GetArrayItem(arr, (int)i)->valuedouble;
    return v;
}

/* Write the case's scheduler_config to a file and load it through the JSON reader. */
static cdf_scheduler_config config_via_json(const cJSON *cfg_json, const char *name) {
    char *txt = cJSON_PrintUnformatted(cfg_json);
    char path[512];
    snprintf(path, sizeof path, "%s/%s_scheduler_config.json", tu_tmpdir(), name);
    assert_int_equal(tu_write_file(path, txt, strlen(txt)), 0);
    free(txt);
    cdf_scheduler_config c;
    cdf_status st = cdf_scheduler_config_from_json(path, &c);
    if (st != CDF_OK) fail_msg("%s: %s", name, cdf_last_error());
    return c;
}

/* Build the scheduler and run the pipeline's "prepare timesteps" step for a golden case. */
static cdf_scheduler *prepare_case(const cJSON *c, const char *name) {
    cdf_scheduler_config cfg = config_via_json(jget(c, "scheduler_config"), name);
    cdf_scheduler *s = cdf_scheduler_new(&cfg);
    assert_non_null(s);
    const int N = (int)jget(c, "num_inference_steps")->valuedouble;
    const cJSON *mu_j = jget(c, "mu");
    const cJSON *sig_in = jget(c, "sigmas_in");
    if (cJSON_IsNull(sig_in) || !sig_in) {
        /* SD3: set_timesteps(N), no sigmas, no mu */
        assert_true(cJSON_IsNull(mu_j));
        assert_int_equal(cdf_scheduler_set_timesteps(s, N, NULL, 0, NULL), CDF_OK);
        return s;
    }
    /* The pipeline's np.linspace(1, 1/N, N): the json holds its float64 values exactly. */
    double *lin = malloc((size_t)N * sizeof(double));
    assert_int_equal(cdf_scheduler_linspace(1.0, 1.0 / N, N, lin), CDF_OK);
    for (int i = 0; i < N; i++) {
        double want = cJSON_GetArrayItem(sig_in, i)->valuedouble;
        if (memcmp(&lin[i], &want, 8) != 0) fail_msg("%s linspace[%d]: got %.17g want %.17g", name, i, lin[i], want);
    }
    float *sig = malloc((size_t)N * 4);
    assert_int_equal(cdf_scheduler_flux_sigmas(N, sig), CDF_OK);
    for (int i = 0; i < N; i++) assert_true(sig[i] == (float)lin[i]);

    /* mu from the pipeline helper, compared with the Python float bit for bit */
    const int64_t seq = (int64_t)jget(c, "image_seq_len")->valuedouble;
    const int64_t h = (int64_t)jget(c, "height")->valuedouble, w = (int64_t)jget(c, "width")->valuedouble;
    assert_int_equal(seq, (h / 16) * (w / 16)); /* 8x VAE, 2x2 patches */
    const char *mu_fn = jget(c, "mu_fn")->valuestring;
    double mu;
    if (strncmp(mu_fn, "calculate_shift", 15) == 0)
        mu = cdf_scheduler_calculate_shift(seq, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift);
    else if (strncmp(mu_fn, "compute_empirical_mu", 20) == 0)
        mu = cdf_scheduler_empirical_mu(seq, N);
    else
        fail_msg("%s: unknown mu_fn %s", name, mu_fn);
    double want_mu = mu_j->valuedouble;
    if (memcmp(&mu, &want_mu, 8) != 0) fail_msg("%s mu: got %.17g want %.17g", name, mu, want_mu);

    assert_int_equal(cdf_scheduler_set_timesteps(s, N, sig, N, &mu), CDF_OK);
    free(sig);
    free(lin);
    return s;
}

static void check_schedule(const cJSON *c, const st_file *f, const char *name, const char *tensor_prefix) {
    cdf_scheduler *s = prepare_case(c, name);
    const int N = (int)jget(c, "num_inference_steps")->valuedouble;
    assert_int_equal(cdf_scheduler_num_timesteps(s), N);
    assert_int_equal(cdf_scheduler_num_sigmas(s), N + 1);
    assert_int_equal((int)jget(c, "n_sigmas")->valuedouble, N + 1);
    const float *sig = cdf_scheduler_sigmas(s), *ts = cdf_scheduler_timesteps(s);
    char key[256];
    snprintf(key, sizeof key, "%s.sigmas", tensor_prefix);
    expect_floats("sigmas (safetensors)", name, sig, st_f32(f, key, N + 1), N + 1);
    snprintf(key, sizeof key, "%s.timesteps", tensor_prefix);
    expect_floats("timesteps (safetensors)", name, ts, st_f32(f, key, N), N);
    float *js = json_floats(jget(c, "sigmas"), N + 1), *jt = json_floats(jget(c, "timesteps"), N);
    expect_floats("sigmas (json)", name, sig, js, N + 1);
    expect_floats("timesteps (json)", name, ts, jt, N);
    /* what the pipeline feeds the transformer: Flux/Flux2 timesteps/1000 in float32, SD3 as is */
    float *jin = json_floats(jget(c, "transformer_timestep_inputs"), N);
    const char *family = jget(c, "family")->valuestring;
    int is_sd3 = strncmp(family, "sd3", 3) == 0;
    float *tin = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tin[i] = is_sd3 ? ts[i] : ts[i] / 1000.0f;
    expect_floats("transformer_timestep_inputs", name, tin, jin, N);
    free(tin);
    free(js);
    free(jt);
    free(jin);
    cdf_scheduler_free(s);
}

static void test_golden_schedules(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("scheduler/flow_match_euler.safetensors")), 0);
    cJSON *j = load_json("scheduler/flow_match_euler.json");
    int count = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, jget(j, "cases")) {
        const char *name = jget(c, "name")->valuestring;
        check_schedule(c, &f, name, name);
        count++;
    }
    assert_int_equal(count, 10);
    cJSON_ArrayForEach(c, jget(j, "step_cases")) {
        const char *name = jget(c, "name")->valuestring;
        /* the step cases' schedules are the plain cases' ones; tensors are stored under those */
        check_schedule(c, &f, name, name + 5);
    }
    cJSON_Delete(j);
    st_close(&f);
}

/* The golden Euler loops: inputs drawn from the torch-compatible generator (checked against the
 * stored tensors), then every step bit for bit. */
static void test_golden_steps(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("scheduler/flow_match_euler.safetensors")), 0);
    cJSON *j = load_json("scheduler/flow_match_euler.json");
    int count = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, jget(j, "step_cases")) {
        const char *name = jget(c, "name")->valuestring;
        const cJSON *shp = jget(c, "sample_shape");
        int64_t numel = 1;
        for (int i = 0; i < cJSON_GetArraySize(shp); i++) numel *= (int64_t)cJSON_GetArrayItem(shp, i)->valuedouble;
        const int use_begin = cJSON_IsTrue(jget(c, "set_begin_index_0"));
        char key[256];

        for (int pass = 0; pass < 2; pass++) {
            /* pass 0: inputs from cdf_randn_f32 and diffusers' own calling convention
             *         (step with the timestep for SD3, set_begin_index(0) for Flux);
             * pass 1: inputs straight from the golden file, plain cdf_scheduler_step. */
            cdf_scheduler *s = prepare_case(c, name);
            const int N = (int)cdf_scheduler_num_timesteps(s);
            if (use_begin) assert_int_equal(cdf_scheduler_set_begin_index(s, 0), CDF_OK);
            cdf_generator *g = cdf_generator_new((uint64_t)jget(c, "input_seed")->valuedouble);
            float *sample = malloc((size_t)numel * 4), *mo = malloc((size_t)numel * 4);
            snprintf(key, sizeof key, "%s.sample_0", name);
            if (pass == 0) {
                assert_int_equal(cdf_randn_f32(g, sample, numel), CDF_OK);
                expect_floats("sample_0 (randn)", name, sample, st_f32(&f, key, numel), numel);
            } else {
                memcpy(sample, st_f32(&f, key, numel), (size_t)numel * 4);
            }
            for (int i = 0; i < N; i++) {
                snprintf(key, sizeof key, "%s.model_output_%d", name, i);
                if (pass == 0) {
                    assert_int_equal(cdf_randn_f32(g, mo, numel), CDF_OK);
                    expect_floats("model_output (randn)", name, mo, st_f32(&f, key, numel), numel);
                    assert_int_equal(cdf_scheduler_step_timestep(s, cdf_scheduler_timesteps(s)[i], mo, sample, sample, numel), CDF_OK);
                } else {
                    memcpy(mo, st_f32(&f, key, numel), (size_t)numel * 4);
                    assert_int_equal(cdf_scheduler_step(s, mo, sample, sample, numel), CDF_OK);
                }
                assert_int_equal(cdf_scheduler_step_index(s), i + 1);
                snprintf(key, sizeof key, "%s.sample_%d", name, i + 1);
                expect_floats(key, name, sample, st_f32(&f, key, numel), numel);
            }
            /* one step too many */
            assert_int_equal(cdf_scheduler_step(s, mo, sample, sample, numel), CDF_ERR_INVALID_ARG);
            assert_non_null(strstr(cdf_last_error(), "past the last step"));
            free(sample);
            free(mo);
            cdf_generator_free(g);
            cdf_scheduler_free(s);
        }
        count++;
    }
    assert_int_equal(count, 3);
    cJSON_Delete(j);
    st_close(&f);
}

/* Post-__init__ state and options the golden cases do not cover, against double-precision
 * references computed here (tolerance: a few float32 ulps). */
static void test_init_and_options(void **state) {
    (void)state;
    cdf_scheduler_config cfg = cdf_scheduler_config_default();
    cfg.shift = 3.0;
    cdf_scheduler *s = cdf_scheduler_new(&cfg);
    assert_non_null(s);
    assert_int_equal(cdf_scheduler_num_sigmas(s), 1000);
    assert_int_equal(cdf_scheduler_num_timesteps(s), 1000);
    const float *sig = cdf_scheduler_sigmas(s);
    for (int i = 0; i < 1000; i += 37) {
        double t = (1000.0 - i) / 1000.0, want = 3.0 * t / (1.0 + 2.0 * t);
        assert_true(fabs(sig[i] - want) <= 3e-7 * want);
        assert_true(fabs(cdf_scheduler_timesteps(s)[i] - 1000.0 * want) <= 3e-4 * want);
    }
    assert_true(sig[0] == 1.0f);
    /* README: SD3 schedule's low end is shifted twice -> last sigma 0.008928571827709675 */
    assert_int_equal(cdf_scheduler_set_timesteps(s, 28, NULL, 0, NULL), CDF_OK);
    assert_true(cdf_scheduler_sigmas(s)[27] == 0.008928571827709675f);
    /* set_shift affects later set_timesteps calls */
    cdf_scheduler_set_shift(s, 1.0);
    assert_true(cdf_scheduler_shift(s) == 1.0);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, NULL, 0, NULL), CDF_OK);
    double lo = 3.0 * 0.001 / (1.0 + 2.0 * 0.001); /* sigma_min from __init__, shift 3 */
    assert_true(fabs(cdf_scheduler_sigmas(s)[3] - lo) < 1e-8);
    cdf_scheduler_free(s);

    /* invert_sigmas: sigmas = 1 - s, timesteps from the inverted sigmas, terminal 1 */
    cfg = cdf_scheduler_config_default();
    cfg.invert_sigmas = 1;
    s = cdf_scheduler_new(&cfg);
    float in[4] = {1.0f, 0.75f, 0.5f, 0.25f};
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, in, 4, NULL), CDF_OK);
    const float want_inv[5] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f};
    expect_floats("inverted sigmas", "invert", cdf_scheduler_sigmas(s), want_inv, 5);
    assert_true(cdf_scheduler_timesteps(s)[3] == 750.0f);
    cdf_scheduler_free(s);

    /* shift_terminal: the schedule is stretched so that its last sigma is shift_terminal */
    for (int with_sigmas = 0; with_sigmas < 2; with_sigmas++) {
        cfg = cdf_scheduler_config_default();
        cfg.shift = 3.0;
        cfg.has_shift_terminal = 1;
        cfg.shift_terminal = 0.1;
        s = cdf_scheduler_new(&cfg);
        float fs[20];
        assert_int_equal(cdf_scheduler_flux_sigmas(20, fs), CDF_OK);
        assert_int_equal(cdf_scheduler_set_timesteps(s, 20, with_sigmas ? fs : NULL, with_sigmas ? 20 : 0, NULL), CDF_OK);
        const float *o = cdf_scheduler_sigmas(s);
        assert_true(fabs(o[19] - 0.1) < 1e-6);
        /* reference: the unstretched schedule computed in double, then stretched in double */
        double base[20];
        if (with_sigmas) {
            for (int i = 0; i < 20; i++) base[i] = 3.0 * fs[i] / (1.0 + 2.0 * fs[i]);
        } else {
            double smax = 1.0, smin = 3.0 * 0.001 / (1.0 + 2.0 * 0.001);
            for (int i = 0; i < 20; i++) {
                double t = smax + (smin - smax) * i / 19.0;
                base[i] = 3.0 * t / (1.0 + 2.0 * t);
            }
        }
        double scale = (1.0 - base[19]) / 0.9;
        for (int i = 0; i < 20; i++) assert_true(fabs(o[i] - (1.0 - (1.0 - base[i]) / scale)) < 2e-6);
        cdf_scheduler_free(s);
    }

    /* linear time shift: mu / (mu + (1/t - 1)) */
    cfg = cdf_scheduler_config_default();
    cfg.use_dynamic_shifting = 1;
    cfg.time_shift_type = CDF_TIME_SHIFT_LINEAR;
    s = cdf_scheduler_new(&cfg);
    double mu = 0.8;
    float fs[10];
    assert_int_equal(cdf_scheduler_flux_sigmas(10, fs), CDF_OK);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 10, fs, 10, &mu), CDF_OK);
    for (int i = 0; i < 10; i++) {
        double want = 0.8 / (0.8 + (1.0 / fs[i] - 1.0));
        assert_true(fabs(cdf_scheduler_sigmas(s)[i] - want) < 4e-7);
    }
    cdf_scheduler_free(s);
}

static void test_helpers(void **state) {
    (void)state;
    /* calculate_shift at the ends of its line is base_shift / max_shift */
    assert_true(fabs(cdf_scheduler_calculate_shift(256, 256, 4096, 0.5, 1.15) - 0.5) < 1e-15);
    assert_true(fabs(cdf_scheduler_calculate_shift(4096, 256, 4096, 0.5, 1.15) - 1.15) < 1e-15);
    assert_true(isnan(cdf_scheduler_calculate_shift(100, 256, 256, 0.5, 1.15)));
    /* compute_empirical_mu: above 4300 tokens it ignores the step count */
    assert_true(cdf_scheduler_empirical_mu(9216, 4) == cdf_scheduler_empirical_mu(9216, 50));
    assert_true(fabs(cdf_scheduler_empirical_mu(9216, 50) - (0.00016927 * 9216 + 0.45666666)) < 1e-12);
    /* below: exact at 200 and 10 steps by construction */
    assert_true(fabs(cdf_scheduler_empirical_mu(4096, 200) - (0.00016927 * 4096 + 0.45666666)) < 1e-12);
    assert_true(fabs(cdf_scheduler_empirical_mu(4096, 10) - (8.73809524e-05 * 4096 + 1.89833333)) < 1e-12);
    /* numpy.linspace details: n = 1 gives start; the last element is exactly stop */
    double v[5];
    assert_int_equal(cdf_scheduler_linspace(2.5, 7.0, 1, v), CDF_OK);
    assert_true(v[0] == 2.5);
    assert_int_equal(cdf_scheduler_linspace(0.1, 0.7, 5, v), CDF_OK);
    assert_true(v[4] == 0.7 && v[0] == 0.1);
    assert_true(fabs(v[2] - 0.4) < 1e-16);
    assert_int_equal(cdf_scheduler_linspace(3.0, 3.0, 5, v), CDF_OK);
    for (int i = 0; i < 5; i++) assert_true(v[i] == 3.0);
    assert_int_equal(cdf_scheduler_linspace(0, 1, -1, v), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_linspace(0, 1, 0, NULL), CDF_OK);
    float f1;
    assert_int_equal(cdf_scheduler_flux_sigmas(1, &f1), CDF_OK);
    assert_true(f1 == 1.0f);
    assert_int_equal(cdf_scheduler_flux_sigmas(0, &f1), CDF_ERR_INVALID_ARG);
}

static void write_cfg(const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", tu_tmpdir(), name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

static void expect_cfg_error(const char *text, cdf_status want, const char *fragment) {
    char path[512];
    write_cfg("bad_scheduler_config.json", text, path, sizeof path);
    cdf_scheduler_config c = cdf_scheduler_config_default();
    c.shift = 42.0; /* must stay untouched on failure */
    cdf_status st = cdf_scheduler_config_from_json(path, &c);
    if (st != want) fail_msg("config %s: status %d (%s), want %d", text, st, cdf_last_error(), want);
    if (!strstr(cdf_last_error(), fragment)) fail_msg("config %s: message \"%s\" lacks \"%s\"", text, cdf_last_error(), fragment);
    assert_true(c.shift == 42.0);
}

static void test_config_json(void **state) {
    (void)state;
    char path[512];
    /* published FLUX.1-dev config */
    write_cfg("flux_dev.json",
              "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"_diffusers_version\": \"0.30.0.dev0\","
              " \"base_image_seq_len\": 256, \"base_shift\": 0.5, \"max_image_seq_len\": 4096, \"max_shift\": 1.15,"
              " \"num_train_timesteps\": 1000, \"shift\": 3.0, \"use_dynamic_shifting\": true}",
              path, sizeof path);
    cdf_scheduler_config c;
    assert_int_equal(cdf_scheduler_config_from_json(path, &c), CDF_OK);
    assert_true(c.shift == 3.0 && c.use_dynamic_shifting == 1 && c.num_train_timesteps == 1000);
    assert_true(c.max_shift == 1.15 && c.base_image_seq_len == 256 && !c.has_shift_terminal);
    assert_int_equal(c.time_shift_type, CDF_TIME_SHIFT_EXPONENTIAL);
    /* minimal SD3 config: everything else defaults; an integer shift is accepted */
    write_cfg("sd3.json", "{\"num_train_timesteps\": 1000, \"shift\": 3}", path, sizeof path);
    assert_int_equal(cdf_scheduler_config_from_json(path, &c), CDF_OK);
    assert_true(c.shift == 3.0 && !c.use_dynamic_shifting && c.base_shift == 0.5);
    write_cfg("term.json", "{\"shift_terminal\": 0.02, \"time_shift_type\": \"linear\", \"invert_sigmas\": true}", path, sizeof path);
    assert_int_equal(cdf_scheduler_config_from_json(path, &c), CDF_OK);
    assert_true(c.has_shift_terminal && c.shift_terminal == 0.02 && c.invert_sigmas);
    assert_int_equal(c.time_shift_type, CDF_TIME_SHIFT_LINEAR);

    expect_cfg_error("{\"use_karras_sigmas\": true}", CDF_ERR_UNSUPPORTED, "use_karras_sigmas");
    expect_cfg_error("{\"use_exponential_sigmas\": true}", CDF_ERR_UNSUPPORTED, "use_exponential_sigmas");
    expect_cfg_error("{\"use_beta_sigmas\": true}", CDF_ERR_UNSUPPORTED, "use_beta_sigmas");
    expect_cfg_error("{\"stochastic_sampling\": true}", CDF_ERR_UNSUPPORTED, "stochastic_sampling");
    expect_cfg_error("{\"_class_name\": \"EulerDiscreteScheduler\"}", CDF_ERR_UNSUPPORTED, "EulerDiscreteScheduler");
    expect_cfg_error("{\"shift\": \"3.0\"}", CDF_ERR_FORMAT, "\"shift\"");
    expect_cfg_error("{\"use_dynamic_shifting\": 1}", CDF_ERR_FORMAT, "use_dynamic_shifting");
    expect_cfg_error("{\"num_train_timesteps\": 10.5}", CDF_ERR_FORMAT, "num_train_timesteps");
    expect_cfg_error("{\"num_train_timesteps\": 0}", CDF_ERR_FORMAT, "num_train_timesteps");
    expect_cfg_error("{\"num_train_timesteps\": 1e12}", CDF_ERR_LIMIT, "num_train_timesteps");
    expect_cfg_error("{\"time_shift_type\": \"cubic\"}", CDF_ERR_FORMAT, "cubic");
    expect_cfg_error("{\"shift\": 3.0,", CDF_ERR_FORMAT, "not valid JSON");
    expect_cfg_error("[1, 2]", CDF_ERR_FORMAT, "not a JSON object");
    expect_cfg_error("{\"shift_terminal\": 1.0}", CDF_ERR_INVALID_ARG, "shift_terminal");

    cdf_scheduler_config d = cdf_scheduler_config_default();
    assert_int_equal(cdf_scheduler_config_from_json("/nonexistent/dir/scheduler_config.json", &d), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "/nonexistent/dir/scheduler_config.json"));
    /* a file over the 1 MiB limit is refused before parsing */
    size_t big = (1u << 20) + 16;
    char *txt = malloc(big + 1);
    memset(txt, ' ', big);
    txt[0] = '{';
    txt[big - 1] = '}';
    txt[big] = 0;
    write_cfg("huge.json", txt, path, sizeof path);
    free(txt);
    assert_int_equal(cdf_scheduler_config_from_json(path, &d), CDF_ERR_LIMIT);
    assert_int_equal(cdf_scheduler_config_from_json(NULL, &d), CDF_ERR_INVALID_ARG);
}

static void test_errors(void **state) {
    (void)state;
    cdf_scheduler_config cfg = cdf_scheduler_config_default();
    cfg.use_karras_sigmas = 1;
    assert_null(cdf_scheduler_new(&cfg));
    assert_int_equal(cdf_last_status(), CDF_ERR_UNSUPPORTED);
    cfg = cdf_scheduler_config_default();
    cfg.stochastic_sampling = 1;
    assert_null(cdf_scheduler_new(&cfg));
    assert_non_null(strstr(cdf_last_error(), "stochastic_sampling"));
    assert_null(cdf_scheduler_new(NULL));

    cfg = cdf_scheduler_config_default();
    cfg.use_dynamic_shifting = 1;
    cdf_scheduler *s = cdf_scheduler_new(&cfg);
    float sig[4] = {1.0f, 0.75f, 0.5f, 0.25f};
    double mu = 1.15;
    assert_int_equal(cdf_scheduler_set_timesteps(s, 0, NULL, 0, &mu), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "num_inference_steps must be >= 1, got 0"));
    assert_int_equal(cdf_scheduler_set_timesteps(s, -3, NULL, 0, &mu), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 5, sig, 4, &mu), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "4 sigmas given for 5 inference steps"));
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, NULL, 4, &mu), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, sig, 4, NULL), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "mu must be passed when use_dynamic_shifting"));
    assert_int_equal(cdf_scheduler_set_timesteps(s, 2000000, NULL, 0, &mu), CDF_ERR_LIMIT);
    /* failed calls leave the previous (training) schedule in place */
    assert_int_equal(cdf_scheduler_num_sigmas(s), 1000);

    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, sig, 4, &mu), CDF_OK);
    float x[3] = {1, 2, 3}, m[3] = {1, 1, 1}, y[3];
    assert_int_equal(cdf_scheduler_set_begin_index(s, -1), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_step(s, NULL, x, y, 3), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_step(s, m, x, y, -1), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_scheduler_step_timestep(s, 123.0f, m, x, y, 3), CDF_ERR_NOT_FOUND);
    assert_int_equal(cdf_scheduler_step_index(s), -1);
    /* the lookup finds the 3rd timestep; stepping continues from there */
    const float t2 = cdf_scheduler_timesteps(s)[2];
    assert_int_equal(cdf_scheduler_step_timestep(s, t2, m, x, y, 3), CDF_OK);
    assert_int_equal(cdf_scheduler_step_index(s), 3);
    const float dt = cdf_scheduler_sigmas(s)[3] - cdf_scheduler_sigmas(s)[2];
    for (int i = 0; i < 3; i++) assert_true(y[i] == x[i] + dt);
    assert_int_equal(cdf_scheduler_step(s, m, x, y, 3), CDF_OK);
    assert_int_equal(cdf_scheduler_step(s, m, x, y, 3), CDF_ERR_INVALID_ARG);
    /* set_timesteps resets the step and begin indices */
    assert_int_equal(cdf_scheduler_set_begin_index(s, 1), CDF_OK);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, sig, 4, &mu), CDF_OK);
    assert_int_equal(cdf_scheduler_step_index(s), -1);
    assert_int_equal(cdf_scheduler_begin_index(s), -1);
    cdf_scheduler_free(s);
    cdf_scheduler_free(NULL);

    /* fuzz_json finding 14: shift 0 (or below) makes the first training sigma 0/0 = NaN in
     * diffusers; refused at validation, and set_shift(0) refused at set_timesteps */
    cfg = cdf_scheduler_config_default();
    for (int k = 0; k < 2; k++) {
        cfg.shift = k ? -2.0 : 0.0;
        assert_int_equal(cdf_scheduler_config_validate(&cfg), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), "shift must be > 0"));
        assert_null(cdf_scheduler_new(&cfg));
    }
    cfg = cdf_scheduler_config_default();
    s = cdf_scheduler_new(&cfg);
    cdf_scheduler_set_shift(s, 0.0);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 4, NULL, 0, NULL), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "shift must be > 0"));
    assert_int_equal(cdf_scheduler_num_sigmas(s), 1000); /* the previous schedule stays */
    cdf_scheduler_free(s);
    /* a linear time shift mu / (mu + (1/t - 1)) with mu = 0: one step has t = 1, so 0 / 0; the
     * sigma is not a number and the schedule is refused */
    cfg = cdf_scheduler_config_default();
    cfg.use_dynamic_shifting = 1;
    cfg.time_shift_type = CDF_TIME_SHIFT_LINEAR;
    s = cdf_scheduler_new(&cfg);
    mu = 0.0;
    assert_int_equal(cdf_scheduler_set_timesteps(s, 1, NULL, 0, &mu), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "sigma 0 of 1 is"));
    assert_int_equal(cdf_scheduler_num_sigmas(s), 1000);
    cdf_scheduler_free(s);

    /* duplicate timesteps: diffusers' lookup takes the second match */
    cfg = cdf_scheduler_config_default();
    s = cdf_scheduler_new(&cfg);
    float dup[3] = {0.5f, 0.5f, 0.25f};
    assert_int_equal(cdf_scheduler_set_timesteps(s, 3, dup, 3, NULL), CDF_OK);
    assert_int_equal(cdf_scheduler_step(s, m, x, y, 3), CDF_OK);
    assert_int_equal(cdf_scheduler_step_index(s), 2);
    cdf_scheduler_free(s);

    /* A huge shift saturates the first sigmas at 1, so timesteps[0] repeats: without a begin
     * index the first step starts at the second match and only 27 of 28 steps run before the
     * schedule ends (diffusers raises IndexError after 27: tools/scheduler-repeat-check.py). */
    cfg = cdf_scheduler_config_default();
    cfg.shift = 1e7;
    s = cdf_scheduler_new(&cfg);
    assert_int_equal(cdf_scheduler_set_timesteps(s, 28, NULL, 0, NULL), CDF_OK);
    assert_true(cdf_scheduler_timesteps(s)[0] == 1000.0f && cdf_scheduler_timesteps(s)[1] == 1000.0f);
    int ran = 0;
    while (ran < 40 && cdf_scheduler_step(s, m, x, y, 3) == CDF_OK) ran++;
    assert_int_equal(ran, 27);
    assert_non_null(strstr(cdf_last_error(), "past the last step"));
    /* with set_begin_index(0), as the pipelines do, all 28 run */
    assert_int_equal(cdf_scheduler_set_timesteps(s, 28, NULL, 0, NULL), CDF_OK);
    assert_int_equal(cdf_scheduler_set_begin_index(s, 0), CDF_OK);
    ran = 0;
    while (ran < 40 && cdf_scheduler_step(s, m, x, y, 3) == CDF_OK) ran++;
    assert_int_equal(ran, 28);
    cdf_scheduler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_schedules),
        cmocka_unit_test(test_golden_steps),
        cmocka_unit_test(test_init_and_options),
        cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
