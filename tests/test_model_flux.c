/* FluxTransformer2DModel (FLUX.1 schnell / dev) against the golden diffusers outputs, loaded
 * through the real component path; plus the rotary tables against diffusers'
 * get_1d_rotary_pos_embed, input/checkpoint/config errors, batching, the deprecated 3-D ids and
 * the relative-position property of RoPE on the text rows (which the golden case, with all-zero
 * txt_ids, cannot see).
 *
 * Tolerances (golden README "Tolerances observed"): diffusers builds the timestep frequency
 * table with torch's vectorised float32 exp, which differs by 1 ulp from a correctly rounded exp
 * on 15 of 128 entries; cdiffusers' cdf_timestep_embedding uses its own exp, and the README
 * measured that replacing torch's time projection changes the outputs by up to 1.4e-5 (schnell,
 * t = 750) and 1.05e-4 (dev, whose guidance embedding has argument 3500). Everything else agrees
 * to a few 1e-6 (fp64 rerun 1.4e-6 / 2.4e-6). Hence atol 5e-5 for schnell and 3e-4 for dev (the
 * README's "fair" bound for an own-exp implementation). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "cdiffusers/tensor.h"
#include "models/component.h"
#include "models/flux_common.h"
#include "models/flux_transformer.h"

#define SCHNELL_ATOL 5e-5
#define DEV_ATOL 3e-4
/* bf16 weight storage (CDF_BF16): the weights are the very bf16 values the reference upcast,
 * so an f32-accumulating kernel that widens them exactly reproduces the upcast run (it does
 * today: the measured errors equal the upcast ones). A bf16 fast path (oneDNN / AVX-512-BF16 /
 * AMX) may however also round the f32 activations to bf16 before its f32 accumulation. That is a
 * perturbation of the same relative size (2^-9) as rounding the weights to bf16, whose effect on
 * the output the README measured: 0.015 (schnell) and 0.037 (dev) max abs. The bound is 3x that,
 * still far below the output scale (std 1.15 / 1.39), so structural errors fail. */
#define SCHNELL_BF16_STORAGE_ATOL 0.045
#define DEV_BF16_STORAGE_ATOL 0.11

static const char *case_path(const char *cs, const char *rel) {
    static char buf[4][1024];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "golden/%s/%s", cs, rel);
    return tu_data(b);
}

/* The forward arguments of an io file (everything except out.* and extra.*). */
static void load_io(const char *path, cdf_tensor_map *all, cdf_tensor_map *args) {
    cdf_tensor_map_init(all);
    cdf_tensor_map_init(args);
    cdf_status s = cdf_tensor_map_load(all, path, tu_device());
    if (s != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
    for (int i = 0; i < all->n; i++)
        if (strncmp(all->names[i], "out.", 4) && strncmp(all->names[i], "extra.", 6))
            assert_int_equal(cdf_tensor_map_set(args, all->names[i], all->tensors[i]), CDF_OK);
}

static cdf_component *load_model(const char *dir, cdf_dtype weight_dtype) {
    cdf_load_options opt = cdf_load_options_default();
    opt.weight_dtype = weight_dtype;
    cdf_component *c = NULL;
    cdf_status s = cdf_component_load(dir, &opt, &c);
    if (s != CDF_OK) fail_msg("loading %s: %s", dir, cdf_last_error());
    assert_string_equal(cdf_component_class_name(c), "FluxTransformer2DModel");
    return c;
}

static double compare(const cdf_tensor *got, const cdf_tensor *want) {
    assert_non_null(got);
    assert_non_null(want);
    assert_int_equal(cdf_tensor_ndim(got), cdf_tensor_ndim(want));
    for (int d = 0; d < cdf_tensor_ndim(want); d++) assert_int_equal(cdf_tensor_dim(got, d), cdf_tensor_dim(want, d));
    float *g = cdf_tensor_read_f32(got), *w = cdf_tensor_read_f32(want);
    assert_non_null(g);
    assert_non_null(w);
    double e = tu_max_abs_diff(g, w, (size_t)cdf_tensor_numel(want), NULL);
    free(g);
    free(w);
    return e;
}

/* Run one golden case and compare every out.* tensor. */
static void run_golden(const char *cs, const char *model_dir, const char *io_file, cdf_dtype weight_dtype, double atol) {
    cdf_component *c = load_model(case_path(cs, model_dir), weight_dtype);
    cdf_tensor_map all, args, out;
    load_io(case_path(cs, io_file), &all, &args);
    cdf_tensor_map_init(&out);
    int64_t attn0[2];
    tu_attention_counts(attn0);
    cdf_status s = cdf_component_run(c, "forward", &args, &out);
    if (s != CDF_OK) fail_msg("%s run: %s", cs, cdf_last_error());
    tu_expect_attention_policy(attn0, weight_dtype, cs);
    int compared = 0;
    for (int i = 0; i < all.n; i++) {
        if (strncmp(all.names[i], "out.", 4)) continue;
        double e = compare(cdf_tensor_map_get(&out, all.names[i]), all.tensors[i]);
        printf("  %s %s/%s weights %s: %s max abs err %.3g (atol %.3g)\n", cs, model_dir, io_file,
               weight_dtype == CDF_BF16 ? "bf16" : "f32", all.names[i], e, atol);
        assert_true(e <= atol);
        compared++;
    }
    assert_int_equal(compared, 1);
    cdf_tensor_map_clear(&out);
    cdf_tensor_map_clear(&args);
    cdf_tensor_map_clear(&all);
    cdf_component_free(c);
}

static void test_schnell_f32(void **st) {
    (void)st;
    run_golden("flux1_schnell", "transformer", "io.safetensors", CDF_F32, SCHNELL_ATOL);
}
static void test_dev_f32(void **st) {
    (void)st;
    run_golden("flux1_dev", "transformer", "io.safetensors", CDF_F32, DEV_ATOL);
}
static void test_schnell_bf16_upcast(void **st) {
    (void)st;
    run_golden("flux1_schnell", "transformer_bf16", "io_bf16.safetensors", CDF_F32, SCHNELL_ATOL);
}
static void test_dev_bf16_upcast(void **st) {
    (void)st;
    run_golden("flux1_dev", "transformer_bf16", "io_bf16.safetensors", CDF_F32, DEV_ATOL);
}
static void test_schnell_bf16_storage(void **st) {
    (void)st;
    run_golden("flux1_schnell", "transformer_bf16", "io_bf16.safetensors", CDF_BF16, SCHNELL_BF16_STORAGE_ATOL);
}
static void test_dev_bf16_storage(void **st) {
    (void)st;
    run_golden("flux1_dev", "transformer_bf16", "io_bf16.safetensors", CDF_BF16, DEV_BF16_STORAGE_ATOL);
}

/* ---- rotary tables vs diffusers' get_1d_rotary_pos_embed (tests/data/embeddings) ---------- */
static void test_rope_tables_golden(void **st) {
    (void)st;
    cdf_tensor_map m;
    cdf_tensor_map_init(&m);
    assert_int_equal(cdf_tensor_map_load(&m, tu_data("embeddings/embeddings.safetensors"), tu_device()), CDF_OK);
    cdf_scope_push(); /* tables and views below are released at the end */
    const struct {
        const char *key;
        int64_t dim;
        double theta;
    } cases[] = {{"rope_d16_theta10000", 16, 10000}, {"rope_d56_theta10000", 56, 10000}, {"rope_d32_theta2000", 32, 2000}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char k[96];
        snprintf(k, sizeof k, "%s.pos", cases[i].key);
        cdf_tensor *pos_t = cdf_tensor_map_get(&m, k);
        assert_non_null(pos_t);
        snprintf(k, sizeof k, "%s.cos", cases[i].key);
        cdf_tensor *want_cos = cdf_tensor_map_get(&m, k);
        snprintf(k, sizeof k, "%s.sin", cases[i].key);
        cdf_tensor *want_sin = cdf_tensor_map_get(&m, k);
        assert_non_null(want_cos);
        assert_non_null(want_sin);
        const int64_t n = cdf_tensor_numel(pos_t);
        float *pos = cdf_tensor_read_f32(pos_t);
        /* one axis alone, then the same axis twice (two blocks side by side, FluxPosEmbed's cat) */
        cdf_tensor *c1, *s1;
        assert_int_equal(cdf_flux_rope_tables(tu_device(), pos, n, 1, &cases[i].dim, cases[i].theta, &c1, &s1), CDF_OK);
        double ec = compare(c1, want_cos), es = compare(s1, want_sin);
        printf("  %s: cos err %.3g, sin err %.3g\n", cases[i].key, ec, es);
        assert_true(ec <= 6e-8 && es <= 6e-8); /* float64 angles rounded once: at most 1 ulp of a value <= 1 */
        /* the device op the transformers use (positions stay on the device), same golden tables */
        cdf_tensor *pos_col = cdf_reshape(pos_t, 2, (int64_t[]){n, 1});
        cdf_tensor *dc, *ds;
        assert_int_equal(cdf_rope_tables(pos_col, 1, &cases[i].dim, cases[i].theta, &dc, &ds), CDF_OK);
        double dec = compare(dc, want_cos), des = compare(ds, want_sin);
        printf("  %s (device op): cos err %.3g, sin err %.3g\n", cases[i].key, dec, des);
        assert_true(dec <= 6e-8 && des <= 6e-8);
        float *pos2 = malloc((size_t)n * 2 * sizeof *pos2);
        for (int64_t r = 0; r < n; r++) pos2[2 * r] = pos2[2 * r + 1] = pos[r];
        int64_t dims2[2] = {cases[i].dim, cases[i].dim};
        cdf_tensor *c2, *s2;
        assert_int_equal(cdf_flux_rope_tables(tu_device(), pos2, n, 2, dims2, cases[i].theta, &c2, &s2), CDF_OK);
        cdf_tensor *halves[2];
        assert_int_equal(cdf_chunk(c2, 2, 1, halves), CDF_OK);
        assert_true(compare(halves[0], c1) == 0 && compare(halves[1], c1) == 0);
        assert_int_equal(cdf_chunk(s2, 2, 1, halves), CDF_OK);
        assert_true(compare(halves[0], s1) == 0 && compare(halves[1], s1) == 0);
        /* two axes through the device op: each half equals the one-axis device table */
        cdf_tensor *pos2_t = cdf_tensor_from_host(tu_device(), CDF_F32, 2, (int64_t[]){n, 2}, pos2, CDF_F32);
        assert_int_equal(cdf_rope_tables(pos2_t, 2, dims2, cases[i].theta, &c2, &s2), CDF_OK);
        assert_int_equal(cdf_chunk(c2, 2, 1, halves), CDF_OK);
        assert_true(compare(halves[0], dc) == 0 && compare(halves[1], dc) == 0);
        assert_int_equal(cdf_chunk(s2, 2, 1, halves), CDF_OK);
        assert_true(compare(halves[0], ds) == 0 && compare(halves[1], ds) == 0);
        free(pos);
        free(pos2);
    }
    int64_t odd = 5;
    cdf_tensor *c, *s;
    float p = 1;
    assert_int_equal(cdf_flux_rope_tables(tu_device(), &p, 1, 1, &odd, 10000, &c, &s), CDF_ERR_INVALID_ARG);
    assert_null(c);
    assert_null(s);
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&m);
}

/* ---- inputs beyond the golden call -------------------------------------------------------- */
static cdf_tensor *run_with(cdf_component *c, const cdf_tensor_map *args) {
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_component_run(c, "forward", args, &out);
    if (s != CDF_OK) fail_msg("run: %s", cdf_last_error());
    cdf_tensor *r = cdf_tensor_retain(cdf_tensor_map_get(&out, "out.sample"));
    cdf_tensor_map_clear(&out);
    return r;
}

/* ids + a constant per axis, for txt and img rows alike: RoPE scores depend only on position
 * differences, so the output must not change (up to rounding of the rotated values). A model
 * that rotated only the image rows, or misplaced the text rows in the table, would change. */
static void test_rope_relative_shift(void **st) {
    (void)st;
    cdf_component *c = load_model(case_path("flux1_dev", "transformer"), CDF_F32);
    cdf_tensor_map all, args;
    load_io(case_path("flux1_dev", "io.safetensors"), &all, &args);
    cdf_scope_push();
    cdf_tensor *base = run_with(c, &args);
    const float shift3[3] = {7, -3, 11};
    cdf_tensor *sh = cdf_tensor_from_host(tu_device(), CDF_F32, 1, (int64_t[]){3}, shift3, CDF_F32);
    cdf_tensor_map shifted;
    cdf_tensor_map_init(&shifted);
    for (int i = 0; i < args.n; i++) cdf_tensor_map_set(&shifted, args.names[i], args.tensors[i]);
    cdf_tensor_map_set(&shifted, "txt_ids", cdf_add(cdf_tensor_map_get(&args, "txt_ids"), sh));
    cdf_tensor_map_set(&shifted, "img_ids", cdf_add(cdf_tensor_map_get(&args, "img_ids"), sh));
    cdf_tensor *moved = run_with(c, &shifted);
    double e = compare(moved, base);
    printf("  shifted ids vs original: max abs diff %.3g\n", e);
    assert_true(e <= 5e-5);
    /* while shifting only the text rows must change the result */
    cdf_tensor_map_set(&shifted, "img_ids", cdf_tensor_map_get(&args, "img_ids"));
    cdf_tensor *text_only = run_with(c, &shifted);
    double e2 = compare(text_only, base);
    printf("  text ids shifted alone: max abs diff %.3g\n", e2);
    assert_true(e2 > 1e-2);
    cdf_tensor_release(base);
    cdf_tensor_release(moved);
    cdf_tensor_release(text_only);
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&shifted);
    cdf_tensor_map_clear(&args);
    cdf_tensor_map_clear(&all);
    cdf_component_free(c);
}

/* B = 2 (golden input + a sign-flipped copy) with the deprecated 3-D ids: row 0 must be the
 * golden output, row 1 the output of a separate B = 1 run on the flipped input. */
static void test_batch_and_3d_ids(void **st) {
    (void)st;
    cdf_component *c = load_model(case_path("flux1_schnell", "transformer"), CDF_F32);
    cdf_tensor_map all, args;
    load_io(case_path("flux1_schnell", "io.safetensors"), &all, &args);
    cdf_scope_push();
    cdf_tensor_map flipped, batch;
    cdf_tensor_map_init(&flipped);
    cdf_tensor_map_init(&batch);
    for (int i = 0; i < args.n; i++) cdf_tensor_map_set(&flipped, args.names[i], args.tensors[i]);
    const char *per_sample[] = {"hidden_states", "encoder_hidden_states", "pooled_projections"};
    for (int i = 0; i < 3; i++) cdf_tensor_map_set(&flipped, per_sample[i], cdf_neg(cdf_tensor_map_get(&args, per_sample[i])));
    cdf_tensor_map_set(&flipped, "timestep", cdf_tensor_full(tu_device(), CDF_F32, 1, (int64_t[]){1}, 0.25));
    cdf_tensor *single_flipped = run_with(c, &flipped);

    for (int i = 0; i < 3; i++) {
        cdf_tensor *pair[2] = {cdf_tensor_map_get(&args, per_sample[i]), cdf_tensor_map_get(&flipped, per_sample[i])};
        cdf_tensor_map_set(&batch, per_sample[i], cdf_cat(pair, 2, 0));
    }
    cdf_tensor *ts[2] = {cdf_tensor_map_get(&args, "timestep"), cdf_tensor_map_get(&flipped, "timestep")};
    cdf_tensor_map_set(&batch, "timestep", cdf_cat(ts, 2, 0));
    cdf_tensor_map_set(&batch, "img_ids", cdf_unsqueeze(cdf_tensor_map_get(&args, "img_ids"), 0));
    cdf_tensor_map_set(&batch, "txt_ids", cdf_unsqueeze(cdf_tensor_map_get(&args, "txt_ids"), 0));
    cdf_tensor *both = run_with(c, &batch);
    assert_int_equal(cdf_tensor_dim(both, 0), 2);
    double e0 = compare(cdf_narrow(both, 0, 0, 1), cdf_tensor_map_get(&all, "out.sample"));
    double e1 = compare(cdf_narrow(both, 0, 1, 1), single_flipped);
    printf("  batch row 0 vs golden %.3g, row 1 vs separate run %.3g\n", e0, e1);
    assert_true(e0 <= SCHNELL_ATOL);
    assert_true(e1 <= 1e-5); /* same model and input, only matmul blocking can differ */
    assert_true(compare(single_flipped, cdf_tensor_map_get(&all, "out.sample")) > 0.1); /* the rows differ */

    cdf_tensor_release(single_flipped);
    cdf_tensor_release(both);
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&batch);
    cdf_tensor_map_clear(&flipped);
    cdf_tensor_map_clear(&args);
    cdf_tensor_map_clear(&all);
    cdf_component_free(c);
}

static void expect_run_error(cdf_component *c, const cdf_tensor_map *args, cdf_status want, const char *needle) {
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_component_run(c, "forward", args, &out);
    printf("  expected error: %s\n", cdf_last_error());
    assert_int_equal(s, want);
    assert_non_null(strstr(cdf_last_error(), needle));
    assert_int_equal(out.n, 0);
    cdf_tensor_map_clear(&out);
}

static void test_input_errors(void **st) {
    (void)st;
    cdf_component *c = load_model(case_path("flux1_dev", "transformer"), CDF_F32);
    cdf_tensor_map all, args, bad;
    load_io(case_path("flux1_dev", "io.safetensors"), &all, &args);
    cdf_scope_push();
    cdf_tensor_map_init(&bad);
    for (int i = 0; i < args.n; i++)
        if (strcmp(args.names[i], "guidance")) cdf_tensor_map_set(&bad, args.names[i], args.tensors[i]);
    expect_run_error(c, &bad, CDF_ERR_NOT_FOUND, "'guidance'");
    cdf_tensor_map_set(&bad, "guidance", cdf_tensor_map_get(&args, "guidance"));
    cdf_tensor_map_set(&bad, "hidden_states", cdf_narrow(cdf_tensor_map_get(&args, "hidden_states"), 2, 0, 32));
    expect_run_error(c, &bad, CDF_ERR_SHAPE, "'hidden_states'");
    cdf_tensor_map_set(&bad, "hidden_states", cdf_tensor_map_get(&args, "hidden_states"));
    cdf_tensor_map_set(&bad, "img_ids", cdf_narrow(cdf_tensor_map_get(&args, "img_ids"), 0, 0, 63));
    expect_run_error(c, &bad, CDF_ERR_SHAPE, "'img_ids'");
    cdf_tensor_map_set(&bad, "img_ids", cdf_narrow(cdf_tensor_map_get(&args, "img_ids"), 1, 0, 2));
    expect_run_error(c, &bad, CDF_ERR_SHAPE, "'img_ids'");
    cdf_tensor_map_set(&bad, "img_ids", cdf_tensor_map_get(&args, "img_ids"));
    cdf_tensor_map_set(&bad, "pooled_projections", cdf_unsqueeze(cdf_tensor_map_get(&args, "pooled_projections"), 0));
    expect_run_error(c, &bad, CDF_ERR_SHAPE, "'pooled_projections'");
    cdf_tensor_map_set(&bad, "pooled_projections", cdf_tensor_map_get(&args, "pooled_projections"));
    cdf_tensor_map_set(&bad, "timestep", cdf_tensor_zeros(tu_device(), CDF_F32, 1, (int64_t[]){3}));
    expect_run_error(c, &bad, CDF_ERR_SHAPE, "'timestep'");
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&bad);
    cdf_tensor_map_clear(&args);
    cdf_tensor_map_clear(&all);
    cdf_component_free(c);

    /* schnell has no guidance embedding: passing one is an error, as in diffusers */
    c = load_model(case_path("flux1_schnell", "transformer"), CDF_F32);
    load_io(case_path("flux1_schnell", "io.safetensors"), &all, &args);
    cdf_scope_push();
    cdf_tensor_map_set(&args, "guidance", cdf_tensor_full(tu_device(), CDF_F32, 1, (int64_t[]){1}, 3.5));
    expect_run_error(c, &args, CDF_ERR_INVALID_ARG, "guidance");
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&args);
    cdf_tensor_map_clear(&all);
    cdf_component_free(c);
}

/* ---- broken checkpoints and configs ------------------------------------------------------- */
/* Copy the schnell checkpoint into a fresh folder, dropping `drop` and giving `reshape` the
 * shape [new_dim0] (its first elements), with config.json text `config`. */
static const char *write_variant(const char *drop, const char *reshape, int64_t new_dim0, const char *config) {
    const char *dir = tu_tmpdir();
    cdf_st_file *f;
    char src[1024];
    snprintf(src, sizeof src, "%s/diffusion_pytorch_model.safetensors", case_path("flux1_schnell", "transformer"));
    assert_int_equal(cdf_st_open(src, &f), CDF_OK);
    cdf_st_writer *w = cdf_st_writer_new();
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        int64_t shape[CDF_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (reshape && !strcmp(t->name, reshape)) {
            assert_true(new_dim0 <= t->shape[0]);
            shape[0] = new_dim0;
        }
        assert_int_equal(cdf_st_writer_add(w, t->name, t->dtype, t->ndim, shape, cdf_st_data(f, t)), CDF_OK);
    }
    assert_int_equal(cdf_st_writer_set_metadata(w, "format", "pt"), CDF_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(f);
    if (!config) {
        snprintf(src, sizeof src, "%s/config.json", case_path("flux1_schnell", "transformer"));
        config = tu_read_file(src, NULL);
        assert_non_null(config);
        snprintf(path, sizeof path, "%s/config.json", dir);
        assert_int_equal(tu_write_file(path, config, strlen(config)), 0);
        free((void *)config);
    } else {
        snprintf(path, sizeof path, "%s/config.json", dir);
        assert_int_equal(tu_write_file(path, config, strlen(config)), 0);
    }
    return dir;
}

static void expect_load_error(const char *dir, cdf_status want, const char *needle1, const char *needle2) {
    cdf_load_options opt = cdf_load_options_default();
    cdf_component *c = NULL;
    cdf_status s = cdf_component_load(dir, &opt, &c);
    printf("  expected error: %s\n", cdf_last_error());
    assert_int_equal(s, want);
    assert_null(c);
    assert_non_null(strstr(cdf_last_error(), needle1));
    if (needle2) assert_non_null(strstr(cdf_last_error(), needle2));
}

static void test_checkpoint_errors(void **st) {
    (void)st;
    const char *dir = write_variant("single_transformer_blocks.1.proj_mlp.weight", NULL, 0, NULL);
    expect_load_error(dir, CDF_ERR_NOT_FOUND, "single_transformer_blocks.1.proj_mlp.weight", NULL);
    dir = write_variant(NULL, "transformer_blocks.1.attn.norm_added_k.weight", 8, NULL);
    expect_load_error(dir, CDF_ERR_SHAPE, "transformer_blocks.1.attn.norm_added_k.weight", "[8]");
    dir = write_variant(NULL, "proj_out.weight", 32, NULL);
    expect_load_error(dir, CDF_ERR_SHAPE, "proj_out.weight", "[32, 64]");
}

static void test_config_errors(void **st) {
    (void)st;
    /* schnell: head_dim 16 = 4 + 6 + 6; here the axes sum to 18 */
    const char *cfg = "{\"_class_name\": \"FluxTransformer2DModel\", \"attention_head_dim\": 16, \"axes_dims_rope\": [4, 6, 8],"
                      " \"in_channels\": 64, \"joint_attention_dim\": 48, \"num_attention_heads\": 4, \"num_layers\": 2,"
                      " \"num_single_layers\": 2, \"pooled_projection_dim\": 40}";
    expect_load_error(write_variant(NULL, NULL, 0, cfg), CDF_ERR_FORMAT, "axes_dims_rope", "attention_head_dim is 16");
    cfg = "{\"_class_name\": \"FluxTransformer2DModel\", \"attention_head_dim\": 16, \"axes_dims_rope\": [5, 5, 6],"
          " \"in_channels\": 64, \"joint_attention_dim\": 48, \"num_attention_heads\": 4, \"num_layers\": 2,"
          " \"num_single_layers\": 2, \"pooled_projection_dim\": 40}";
    expect_load_error(write_variant(NULL, NULL, 0, cfg), CDF_ERR_FORMAT, "axes_dims_rope[0]", "even");
    cfg = "{\"_class_name\": \"FluxTransformer2DModel\", \"attention_head_dim\": 16, \"axes_dims_rope\": [4, 6, 6],"
          " \"in_channels\": -64}";
    expect_load_error(write_variant(NULL, NULL, 0, cfg), CDF_ERR_FORMAT, "in_channels", NULL);
    /* a config that is consistent but does not match the weights: heads 2 x 32 = 64, axes 8+12+12
     * (dev's layout) against schnell's q/k norms of 16 */
    cfg = "{\"_class_name\": \"FluxTransformer2DModel\", \"attention_head_dim\": 32, \"axes_dims_rope\": [8, 12, 12],"
          " \"in_channels\": 64, \"joint_attention_dim\": 48, \"num_attention_heads\": 2, \"num_layers\": 2,"
          " \"num_single_layers\": 2, \"pooled_projection_dim\": 40}";
    expect_load_error(write_variant(NULL, NULL, 0, cfg), CDF_ERR_SHAPE, "attn.norm_q.weight", "[16]");
}

/* The class object itself: the name the registry matches config.json's _class_name against. */
static void test_class_registered(void **st) {
    (void)st;
    assert_string_equal(cdf_flux_transformer_class.names[0], "FluxTransformer2DModel");
    assert_null(cdf_flux_transformer_class.names[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_registered),
        cmocka_unit_test(test_rope_tables_golden),
        cmocka_unit_test(test_schnell_f32),
        cmocka_unit_test(test_dev_f32),
        cmocka_unit_test(test_schnell_bf16_upcast),
        cmocka_unit_test(test_dev_bf16_upcast),
        cmocka_unit_test(test_schnell_bf16_storage),
        cmocka_unit_test(test_dev_bf16_storage),
        cmocka_unit_test(test_rope_relative_shift),
        cmocka_unit_test(test_batch_and_3d_ids),
        cmocka_unit_test(test_input_errors),
        cmocka_unit_test(test_checkpoint_errors),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
