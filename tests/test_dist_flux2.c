/* Tensor parallelism for FLUX.2 (the Flux2Transformer2DModel plan of diffusers' _tp_plan, the
 * Mistral text encoder's plan of transformers' MistralConfig.base_model_tp_plan; see
 * src/models/flux2_transformer.c, src/models/mistral3_text.c, src/nn/sharded.c).
 *
 * In-process (no launcher):
 *   - packed column-wise shards (diffusers' PackedColwiseParallel) of the fused single-stream
 *     to_qkv_mlp_proj [q; k; v; gate; value] and of a SwiGLU linear_in [gate; value], for ranks 0
 *     and 1 of 2, element by element against the rows of the full tensor read from the file,
 *     with the exact bytes read; a plan that names a packed layer with the wrong style is refused;
 *   - loading the tiny pipeline's transformer and text encoder on an offline 2-rank mesh reads
 *     the single-process bytes minus half of every sharded tensor, where the sharded tensors are
 *     picked from the safetensors headers by this file's own reading of the two plans;
 *   - a head count that does not divide: the text encoder's 2 key/value heads over 4 ranks, its
 *     4 query heads and the transformer's 4 heads over 3 ranks; the message names the key.
 * Over MPI (2 ranks on loopback; skipped without MPI or mpirun):
 *   - `cdiffusers generate --tp 2` on tests/data/pipelines/flux2_dev_tiny (case 64x64): same
 *     initial noise, final latents and image equal the single-process run and diffusers' output;
 *     rank 1 writes nothing; each rank's weight bytes read (CDIFFUSERS_LOG=io) equal the
 *     single-process bytes minus the expected saving above;
 *     the same 2-rank run with --mode compile (fullgraph): no graph break (the all-reduces are
 *     ops of the compiled graph), equal to the single process, same collectives and bytes;
 *   - `cdiffusers run-model --tp 2` on the golden FLUX.2-dev transformer (io.safetensors) and on
 *     the golden FLUX.2 text encoder (two golden prompts): equal to the single-process run and to
 *     diffusers' / transformers' outputs.
 *
 * Tolerances. TP vs one process: a row-wise layer sums the ranks' partial products (one
 * all-reduce), a different summation order that moves a float32 result by ~1 ulp per layer; the
 * tiny models have 4 transformer blocks (4 row-wise layers in a double block, 1 in a single one)
 * and 4 text layers, 3 denoising steps: 1e-4 on latents of magnitude <= ~8 is ~100x what that
 * can produce (measured: 1.4e-6) and far below what a wrong shard gives (O(1)). TP vs the golden
 * output: the tolerances the single-process tests use (test_pipeline_flux2.c: 3e-4 on latents;
 * test_model_flux2.c: 1e-4 on the transformer output; test_model_mistral3.c: 1e-4 on
 * prompt_embeds); the image may differ by one 8-bit level where a value sits at a rounding
 * boundary. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/dist.h"
#include "dist_test_common.h"
#include "nn/nn.h"

#define TP_VS_SINGLE_TOL 1e-4
#define GOLDEN_LATENT_TOL 3e-4    /* test_pipeline_flux2.c STEP_ATOL */
#define GOLDEN_TRANSFORMER_TOL 1e-4 /* test_model_flux2.c DEV_ATOL */
#define GOLDEN_EMBEDS_TOL 1e-4    /* test_model_mistral3.c */

static const char *pipe_dir(void) { return tu_data("pipelines/flux2_dev_tiny"); }

/* ---- the plans as this test reads them -------------------------------------------------------
 * Bytes one rank of 2 does not read of a tensor: half of a sharded weight (column-, row- or
 * packed-split alike: with 2 ranks every split halves the tensor), nothing of a replicated one.
 * FLUX.2 has no biases; transformers' Mistral has none either. */
static uint64_t saved_per_rank(const char *name, uint64_t nbytes) {
    static const char *const double_block[] = {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight",
                                               ".attn.to_out.0.weight", ".attn.add_q_proj.weight", ".attn.add_k_proj.weight",
                                               ".attn.add_v_proj.weight", ".attn.to_add_out.weight", ".ff.linear_in.weight",
                                               ".ff.linear_out.weight", ".ff_context.linear_in.weight",
                                               ".ff_context.linear_out.weight"};
    static const char *const single_block[] = {".attn.to_qkv_mlp_proj.weight", ".attn.to_out.weight"};
    static const char *const text_layer[] = {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                                             ".self_attn.o_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight",
                                             ".mlp.down_proj.weight"};
    const struct {
        const char *prefix;
        const char *const *suffixes;
        size_t n;
    } groups[] = {
        {"transformer_blocks.", double_block, sizeof double_block / sizeof *double_block},
        {"single_transformer_blocks.", single_block, sizeof single_block / sizeof *single_block},
        /* the language model only: the vision tower's layers are never loaded */
        {"language_model.model.layers.", text_layer, sizeof text_layer / sizeof *text_layer},
        {"model.language_model.layers.", text_layer, sizeof text_layer / sizeof *text_layer},
    };
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
        if (strncmp(name, groups[g].prefix, strlen(groups[g].prefix)) != 0) continue;
        for (size_t i = 0; i < groups[g].n; i++)
            if (ends_with(name, groups[g].suffixes[i])) return nbytes / 2;
    }
    return 0;
}

/* Sum of saved_per_rank over a component folder of the tiny pipeline; *total = its tensors' bytes. */
static uint64_t saved_in_component(const char *component, uint64_t *total) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", pipe_dir(), component);
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    uint64_t saved = 0, all = 0;
    for (int i = 0; i < cdf_checkpoint_count(ck); i++) {
        const cdf_st_file *f;
        const cdf_st_tensor *t;
        assert_int_equal(cdf_checkpoint_tensor_at(ck, i, &f, &t), CDF_OK);
        saved += saved_per_rank(t->name, t->nbytes);
        all += t->nbytes;
    }
    cdf_checkpoint_close(ck);
    if (total) *total = all;
    return saved;
}

/* ---- in-process: packed column-wise slices against the file ---------------------------------- */
static float *full_tensor(cdf_checkpoint *ck, const char *name, int64_t *rows, int64_t *cols) {
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    assert_int_equal(cdf_checkpoint_find(ck, name, &f, &t), CDF_OK);
    assert_int_equal(t->ndim, 2);
    *rows = t->shape[0];
    *cols = t->shape[1];
    float *p = malloc((size_t)cdf_st_numel(t) * sizeof *p);
    cdf_convert(p, CDF_F32, cdf_st_data(f, t), t->dtype, (size_t)cdf_st_numel(t));
    return p;
}

/* got [sum(parts)/2, cols] must be, part by part, rows off_i + rank*p_i/2 .. of full. */
static void expect_packed_rows(const float *got, const float *full, int64_t cols, const int64_t *parts, int n_parts, int rank) {
    int64_t off = 0, dst = 0;
    for (int i = 0; i < n_parts; i++) {
        const int64_t n = parts[i] / 2;
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < cols; c++)
                if (got[(dst + r) * cols + c] != full[(off + rank * n + r) * cols + c])
                    fail_msg("rank %d, part %d: local row %lld column %lld differs from file row %lld", rank, i,
                             (long long)(dst + r), (long long)c, (long long)(off + rank * n + r));
        off += parts[i];
        dst += n;
    }
}

static void test_packed_colwise_slices(void **state) {
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/transformer", pipe_dir());
    static const cdf_tp_rule plan[] = {
        {"single_transformer_blocks.*.attn.to_qkv_mlp_proj", CDF_TP_PACKED_COLWISE},
        {"transformer_blocks.*.ff.linear_in", CDF_TP_PACKED_COLWISE},
        {"transformer_blocks.*.ff.linear_out", CDF_TP_COLWISE}, /* deliberately wrong for the refusal below */
        {NULL, CDF_TP_REPLICATE},
    };
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    int64_t qr, qc, fr, fc;
    float *qkv = full_tensor(ck, "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight", &qr, &qc);
    float *ffin = full_tensor(ck, "transformer_blocks.0.ff.linear_in.weight", &fr, &fc);
    const int64_t D = qc, F = fr / 2; /* tiny config: inner_dim 64, mlp_hidden_dim 192 */
    assert_int_equal(qr, 3 * D + 2 * F);
    const int64_t qkv_parts[5] = {D, D, D, F, F}, ff_parts[2] = {F, F};
    for (int rank = 0; rank < 2; rank++) {
        cdf_process_group *pg;
        cdf_tp *tp;
        cdf_weights *w;
        offline_tp(rank, plan, &pg, &tp);
        assert_int_equal(cdf_weights_open(dir, NULL, &w), CDF_OK);
        cdf_linear_layer l;

        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load_packed_out(w, tp, &l, D, 5, qkv_parts, 0, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", 1),
                         CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), (uint64_t)(qr / 2) * qc * 4); /* f32 file: exactly the local rows */
        assert_int_equal(l.out, qr / 2);
        assert_int_equal(l.in, D);
        assert_null(l.tp); /* column shards need no all-reduce */
        assert_int_equal(cdf_tensor_dim(l.w, 0), qr / 2);
        float *got = cdf_tensor_read_f32(l.w);
        expect_packed_rows(got, qkv, qc, qkv_parts, 5, rank);
        free(got);
        cdf_linear_free(&l);

        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load_packed_out(w, tp, &l, D, 2, ff_parts, 0, "transformer_blocks.0.ff.linear_in"), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), (uint64_t)F * fc * 4);
        got = cdf_tensor_read_f32(l.w);
        expect_packed_rows(got, ffin, fc, ff_parts, 2, rank);
        free(got);
        cdf_linear_free(&l);

        /* a packed rule on a layer loaded as plain, and a plain colwise rule on a packed layer:
         * both would mix the parts, both are refused */
        assert_int_equal(cdf_tp_linear_load(w, tp, &l, D, 2 * F, 0, "transformer_blocks.1.ff.linear_in"), CDF_ERR_INTERNAL);
        assert_non_null(strstr(cdf_last_error(), "packed_colwise"));
        assert_int_equal(cdf_tp_linear_load_packed_out(w, tp, &l, F, 1, (int64_t[]){D}, 0, "transformer_blocks.0.ff.linear_out"),
                         CDF_ERR_INTERNAL);
        assert_non_null(strstr(cdf_last_error(), "use packed_colwise"));
        cdf_weights_free(w);
        cdf_tp_free(tp);
        cdf_dist_finalize(pg);
    }
    /* a part that does not divide (3 ranks, parts of 64 and 192): named */
    cdf_process_group *pg;
    cdf_tp *tp;
    cdf_weights *w;
    cdf_linear_layer l;
    assert_int_equal(cdf_dist_init_offline(0, 3, &pg), CDF_OK);
    assert_int_equal(cdf_tp_new(pg, "transformer", "test plan", plan, &tp), CDF_OK);
    assert_int_equal(cdf_weights_open(dir, NULL, &w), CDF_OK);
    assert_int_equal(cdf_tp_linear_load_packed_out(w, tp, &l, D, 5, qkv_parts, 0, "single_transformer_blocks.0.attn.to_qkv_mlp_proj"),
                     CDF_ERR_UNSUPPORTED);
    print_message("  %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "output part of 64 features, not divisible by 3"));
    cdf_weights_free(w);
    cdf_tp_free(tp);
    cdf_dist_finalize(pg);
    free(qkv);
    free(ffin);
    cdf_checkpoint_close(ck);
}

/* ---- in-process: component loading on an offline mesh ------------------------------------------ */
/* Loads <pipeline>/<component> and returns the weight bytes read (the component is freed). */
static uint64_t load_bytes(const char *component) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", pipe_dir(), component);
    cdf_io_reset_counters();
    cdf_component *c = tu_load_component(dir, CDF_F32);
    const uint64_t n = cdf_io_bytes_read();
    cdf_component_free(c);
    return n;
}

static void test_component_bytes_offline(void **state) {
    (void)state;
    static const char *const components[] = {"transformer", "text_encoder"};
    uint64_t whole[2];
    for (int i = 0; i < 2; i++) whole[i] = load_bytes(components[i]);
    for (int rank = 0; rank < 2; rank++) {
        cdf_process_group *pg;
        cdf_device_mesh *mesh;
        assert_int_equal(cdf_dist_init_offline(rank, 2, &pg), CDF_OK);
        assert_int_equal(cdf_device_mesh_new(pg, tu_cpu(), &mesh), CDF_OK);
        assert_int_equal(cdf_tp_enable(mesh, NULL), CDF_OK);
        for (int i = 0; i < 2; i++) {
            uint64_t file_bytes;
            const uint64_t saved = saved_in_component(components[i], &file_bytes);
            const uint64_t got = load_bytes(components[i]);
            print_message("  %s rank %d of 2: reads %llu bytes (whole %llu, expected %llu; %llu of %llu file bytes are in "
                          "sharded tensors)\n",
                          components[i], rank, (unsigned long long)got, (unsigned long long)whole[i],
                          (unsigned long long)(whole[i] - saved), (unsigned long long)(2 * saved), (unsigned long long)file_bytes);
            assert_true(saved > 0);
            assert_int_equal(got, whole[i] - saved);
        }
        /* the transformer plan covers most of the model: the byte check above means something */
        uint64_t tf_bytes;
        assert_true(2 * saved_in_component("transformer", &tf_bytes) > tf_bytes / 2);
        cdf_tp_disable();
        cdf_device_mesh_free(mesh);
        cdf_dist_finalize(pg);
    }
}

/* Loading `component` sharded over `ranks` fails with CDF_ERR_UNSUPPORTED and `want` in the message. */
static void expect_not_divisible(const char *component, int ranks, const char *want) {
    cdf_process_group *pg;
    cdf_device_mesh *mesh;
    assert_int_equal(cdf_dist_init_offline(0, ranks, &pg), CDF_OK);
    assert_int_equal(cdf_device_mesh_new(pg, tu_cpu(), &mesh), CDF_OK);
    assert_int_equal(cdf_tp_enable(mesh, NULL), CDF_OK);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", pipe_dir(), component);
    cdf_load_options opt = cdf_load_options_default();
    opt.device = tu_cpu();
    cdf_component *c = NULL;
    assert_int_equal(cdf_component_load(dir, &opt, &c), CDF_ERR_UNSUPPORTED);
    print_message("  %s over %d ranks: %s\n", component, ranks, cdf_last_error());
    assert_null(c);
    if (!strstr(cdf_last_error(), want)) fail_msg("message lacks '%s'", want);
    assert_non_null(strstr(cdf_last_error(), "--tp-replicate"));
    /* replicated on request: loads whole */
    assert_int_equal(cdf_tp_enable(mesh, component), CDF_OK);
    assert_int_equal(cdf_component_load(dir, &opt, &c), CDF_OK);
    cdf_component_free(c);
    cdf_tp_disable();
    cdf_device_mesh_free(mesh);
    cdf_dist_finalize(pg);
}

static void test_not_divisible(void **state) {
    (void)state;
    /* grouped-query attention: 4 query heads divide by 4 ranks, the 2 key/value heads do not */
    expect_not_divisible("text_encoder", 4, "text_encoder (Mistral language model) has num_key_value_heads = 2, which is not "
                                            "divisible by 4");
    expect_not_divisible("text_encoder", 3, "has num_attention_heads = 4, which is not divisible by 3");
    expect_not_divisible("transformer", 3, "transformer (Flux2Transformer2DModel) has num_attention_heads = 4, which is not "
                                           "divisible by 3");
}

/* ---- over MPI ---------------------------------------------------------------------------------- */

/* Runs `cdiffusers <cmd> <args> --output A [--latents-out B]` once alone and once as 2 ranks
 * (MPMD: rank 1 gets its own output names, so that "writes nothing" can be seen); fails the test
 * on a non-zero exit. Paths are tu_tmp_path(tag + suffix). Logs are returned (free them). */
static void run_one_and_tp(const char *cmd, const char *args, const char *tag, bool latents, char **log_one, char **log_tp) {
    char o1[300], l1[300], ot[300], lt[300], o2[300], l2[300], g1[300], gt[300];
    snprintf(o1, sizeof o1, "%s", tu_tmp_path(tag)), strcat(o1, "_one.out");
    snprintf(ot, sizeof ot, "%s", tu_tmp_path(tag)), strcat(ot, "_tp.out");
    snprintf(o2, sizeof o2, "%s", tu_tmp_path(tag)), strcat(o2, "_rank1.out");
    snprintf(l1, sizeof l1, "%s", tu_tmp_path(tag)), strcat(l1, "_one.lat");
    snprintf(lt, sizeof lt, "%s", tu_tmp_path(tag)), strcat(lt, "_tp.lat");
    snprintf(l2, sizeof l2, "%s", tu_tmp_path(tag)), strcat(l2, "_rank1.lat");
    snprintf(g1, sizeof g1, "%s", tu_tmp_path(tag)), strcat(g1, "_one.log");
    snprintf(gt, sizeof gt, "%s", tu_tmp_path(tag)), strcat(gt, "_tp.log");
    char lat_one[400] = "", lat_tp[400] = "", lat_r1[400] = "";
    if (latents) {
        snprintf(lat_one, sizeof lat_one, " --latents-out '%s'", l1);
        snprintf(lat_tp, sizeof lat_tp, " --latents-out '%s'", lt);
        snprintf(lat_r1, sizeof lat_r1, " --latents-out '%s'", l2);
    }
    double t0 = now_s();
    int rc = tu_system("CDIFFUSERS_LOG=io '%s' %s %s --force --output '%s'%s 2> '%s'", CDF_CLI_PATH, cmd, args, o1, lat_one, g1);
    *log_one = tu_read_file(g1, NULL);
    if (rc != 0) fail_msg("%s: single-process run failed (%d): %s", tag, rc, *log_one ? *log_one : "");
    double t1 = now_s();
    rc = tu_system(MPIRUN " -np 1%s -x CDIFFUSERS_LOG=io '%s' %s %s --force --output '%s'%s --tp 2"
                          " : -np 1%s -x CDIFFUSERS_LOG=io '%s' %s %s --force --output '%s'%s --tp 2 2> '%s'",
                   mpi_env(), CDF_CLI_PATH, cmd, args, ot, lat_tp, mpi_env(), CDF_CLI_PATH, cmd, args, o2, lat_r1, gt);
    *log_tp = tu_read_file(gt, NULL);
    if (rc != 0) fail_msg("%s: 2-rank run failed (%d): %s", tag, rc, *log_tp ? *log_tp : "");
    print_message("  %s: 1 process %.2f s, 2 ranks %.2f s (including MPI start-up)\n", tag, t1 - t0, now_s() - t1);
    assert_int_equal(access(ot, F_OK), 0);
    assert_int_not_equal(access(o2, F_OK), 0); /* rank 1 wrote nothing */
    if (latents) {
        assert_int_equal(access(lt, F_OK), 0);
        assert_int_not_equal(access(l2, F_OK), 0);
    }
}

static const char *out_path(const char *tag, const char *suffix) {
    static char b[2][400];
    static int slot;
    char *p = b[slot++ & 1];
    snprintf(p, 400, "%s%s", tu_tmp_path(tag), suffix);
    return p;
}

static void test_generate_tp2(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    /* the 64x64 case of expected.json: 3 steps, guidance 4, seed 0, text_encoder_out_layers [1, 2, 3] */
    char path[1200], args[3000];
    snprintf(path, sizeof path, "%s/cases/64x64/expected.json", pipe_dir());
    char *txt = tu_read_file(path, NULL);
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    const cJSON *cs = cJSON_GetObjectItem(js, "case");
    assert_non_null(cs);
    const char *prompt = cJSON_GetObjectItem(cs, "prompt")->valuestring;
    assert_null(strchr(prompt, '\''));
    assert_non_null(strstr(cJSON_GetObjectItem(js, "call")->valuestring, "text_encoder_out_layers=[1, 2, 3]"));
    snprintf(args, sizeof args,
             "--model '%s' --prompt '%s' --height %d --width %d --steps %d --guidance %g --seed %.0f "
             "--text-encoder-out-layers 1,2,3 --threads 1 --quiet --dtype f32", /* golden: exact path */
             pipe_dir(), prompt, cJSON_GetObjectItem(cs, "height")->valueint, cJSON_GetObjectItem(cs, "width")->valueint,
             cJSON_GetObjectItem(cs, "steps")->valueint, cJSON_GetObjectItem(cs, "guidance")->valuedouble,
             cJSON_GetObjectItem(cs, "seed")->valuedouble);
    const int steps = cJSON_GetObjectItem(cs, "steps")->valueint;
    cJSON_Delete(js);
    char *log1, *log2;
    run_one_and_tp("generate", args, "flux2_gen", true, &log1, &log2);

    /* latents */
    char golden[1200];
    snprintf(golden, sizeof golden, "%s/cases/64x64/expected.safetensors", pipe_dir());
    int64_t n1, n2, ng;
    float *i1 = st_tensor(out_path("flux2_gen", "_one.lat"), "latents_initial", &n1);
    float *i2 = st_tensor(out_path("flux2_gen", "_tp.lat"), "latents_initial", &n2);
    assert_int_equal(n1, n2);
    assert_true(tu_max_abs_diff(i1, i2, (size_t)n1, NULL) == 0); /* every rank draws the same noise */
    float *f1 = st_tensor(out_path("flux2_gen", "_one.lat"), "latents_final", &n1);
    float *f2 = st_tensor(out_path("flux2_gen", "_tp.lat"), "latents_final", &n2);
    float *fg = st_tensor(golden, "final_latents", &ng);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, ng);
    const double d_tp = tu_max_abs_diff(f1, f2, (size_t)n1, NULL), d_gold = tu_max_abs_diff(f2, fg, (size_t)n1, NULL);
    print_message("  final latents: |tp - one| = %.3g (tol %.0e), |tp - diffusers| = %.3g (tol %.0e)\n", d_tp, TP_VS_SINGLE_TOL,
                  d_gold, GOLDEN_LATENT_TOL);
    assert_true(d_tp <= TP_VS_SINGLE_TOL);
    assert_true(d_gold <= GOLDEN_LATENT_TOL);
    free(i1), free(i2), free(f1), free(f2), free(fg);

    /* image */
    cdf_png_image a, b;
    assert_int_equal(cdf_png_read(out_path("flux2_gen", "_one.out"), &a), CDF_OK);
    assert_int_equal(cdf_png_read(out_path("flux2_gen", "_tp.out"), &b), CDF_OK);
    const size_t npx = (size_t)a.width * a.height * a.channels;
    assert_int_equal(npx, (size_t)b.width * b.height * b.channels);
    cdf_png_image g;
    snprintf(path, sizeof path, "%s/cases/64x64/image.png", pipe_dir()); /* diffusers' image, 8-bit */
    assert_int_equal(cdf_png_read(path, &g), CDF_OK);
    assert_int_equal(npx, (size_t)g.width * g.height * g.channels);
    const int lv_tp = max_level_diff(a.pixels, b.pixels, npx), lv_gold = max_level_diff(g.pixels, b.pixels, npx);
    print_message("  image: max level difference tp vs one %d, tp vs diffusers %d\n", lv_tp, lv_gold);
    assert_true(lv_tp <= 1 && lv_gold <= 1);
    cdf_png_image_free(&g);
    cdf_png_image_free(&a);
    cdf_png_image_free(&b);

    /* bytes read per rank: the single-process bytes minus half of every sharded tensor */
    io_line one[1] = {{0}}, tp[2] = {{0}, {0}};
    assert_int_equal(parse_io(log1, one, 1), 1);
    assert_int_equal(parse_io(log2, tp, 2), 2);
    const uint64_t saved = saved_in_component("transformer", NULL) + saved_in_component("text_encoder", NULL);
    for (int r = 0; r < 2; r++) {
        print_message("  rank %d: read %llu weight bytes (one process %llu, expected %llu), peak %llu B (one process %llu B), "
                      "%llu collectives, %llu bytes communicated\n",
                      r, tp[r].weight_bytes, one[0].weight_bytes, (unsigned long long)(one[0].weight_bytes - saved),
                      tp[r].peak_bytes, one[0].peak_bytes, tp[r].collectives, tp[r].comm_bytes);
        assert_int_equal(tp[r].world, 2);
        assert_int_equal(tp[r].weight_bytes, one[0].weight_bytes - saved);
        assert_true(tp[r].peak_bytes < one[0].peak_bytes);
        /* every step: 4 row-wise all-reduces per double block, 1 per single block */
        assert_true(tp[r].collectives >= (unsigned long long)steps * (2 * 4 + 2 * 1));
    }
    assert_int_equal(tp[0].collectives, tp[1].collectives);

    /* compiled (fullgraph): the all-reduces are captured into the transformer's graph, no graph
     * break; equal to the single process within the same tolerance, same collectives and bytes */
    static const char *const compiled[] = {"Flux2Transformer2DModel.forward", NULL};
    char *log3 = run_tp_compiled(args, "--mode compile", out_path("flux2_gen", "_tpc.out"), out_path("flux2_gen", "_tpc.lat"),
                                 compiled);
    expect_compiled_tp_matches(log3, out_path("flux2_gen", "_tpc.lat"), out_path("flux2_gen", "_one.lat"), tp,
                               TP_VS_SINGLE_TOL, "--mode compile");
    free(log1);
    free(log2);
}

/* The transformer from single files over 2 ranks (weights_source.c converts, sharded.c cuts the
 * converted tensors): BFL's FLUX.2 layout gives the folder's 2-rank latents bit for bit, its
 * Q8_0/Q4_0/Q5_1 GGUF (row-wise layers cut on block boundaries) those of the diffusers file
 * holding gguf-py's dequantization of it, and that diffusers-layout file, read straight from its
 * checkpoint by the shards, counts its tensors as used (no "unused tensors" refusal). */
static void test_generate_tp2_single_file(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    char *files[4] = {NULL, strdup(tu_data("formats/flux2_single/flux2_bfl.safetensors")),
                      strdup(tu_data("formats/flux2_single/flux2_bfl_q8.gguf")),
                      strdup(tu_data("formats/flux2_single/q8_dequant/transformer/diffusion_pytorch_model.safetensors"))};
    float *lat[4];
    int64_t n[4];
    for (int k = 0; k < 4; k++) {
        char tr[1300] = "", lp[400], log[400];
        if (files[k]) snprintf(tr, sizeof tr, " --transformer '%s'", files[k]);
        snprintf(lp, sizeof lp, "%s", out_path("flux2_sf", k == 0 ? "_0.lat" : k == 1 ? "_1.lat" : k == 2 ? "_2.lat" : "_3.lat"));
        snprintf(log, sizeof log, "%s", out_path("flux2_sf", ".log"));
        int rc = tu_system(MPIRUN " -np 2%s '%s' generate --model '%s'%s --prompt 'a red square' --height 64 --width 64 --steps 2 "
                                  "--seed 3 --text-encoder-out-layers 1,2,3 --threads 1 --quiet --dtype f32 --tp 2 --force "
                                  "--output '%s' --latents-out '%s' 2> '%s'",
                           mpi_env(), CDF_CLI_PATH, pipe_dir(), tr, out_path("flux2_sf", ".png"), lp, log);
        if (rc != 0) fail_msg("2 ranks, transformer %s: rc %d: %s", files[k] ? files[k] : "(folder)", rc, tu_read_file(log, NULL));
        lat[k] = st_tensor(lp, "latents_final", &n[k]);
        assert_int_equal(n[k], n[0]);
    }
    assert_memory_equal(lat[1], lat[0], (size_t)n[0] * 4);
    assert_memory_equal(lat[2], lat[3], (size_t)n[0] * 4);
    assert_true(tu_max_abs_diff(lat[2], lat[0], (size_t)n[0], NULL) > 0); /* the quantized weights ran */
    for (int k = 0; k < 4; k++) free(lat[k]), free(files[k]);
}

/* Max |a - b| of tensor `key` of two safetensors files (b's tensor may be named key_b). */
static double file_diff(const char *a, const char *key_a, const char *b, const char *key_b) {
    int64_t na, nb;
    float *x = st_tensor(a, key_a, &na), *y = st_tensor(b, key_b, &nb);
    assert_int_equal(na, nb);
    double d = tu_max_abs_diff(x, y, (size_t)na, NULL);
    free(x);
    free(y);
    return d;
}

static void test_run_model_tp2(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    char args[3000];
    char *log1, *log2;

    /* the transformer on diffusers' recorded forward */
    const char *io = tu_data("golden/flux2_dev/io.safetensors");
    snprintf(args, sizeof args, "--model '%s' --inputs '%s' --threads 1 --dtype f32", tu_data("golden/flux2_dev/transformer"), io);
    run_one_and_tp("run-model", args, "flux2_rm_tf", false, &log1, &log2);
    double d_tp = file_diff(out_path("flux2_rm_tf", "_one.out"), "out.sample", out_path("flux2_rm_tf", "_tp.out"), "out.sample");
    double d_gold = file_diff(out_path("flux2_rm_tf", "_tp.out"), "out.sample", io, "out.sample");
    print_message("  transformer: |tp - one| = %.3g (tol %.0e), |tp - diffusers| = %.3g (tol %.0e)\n", d_tp, TP_VS_SINGLE_TOL,
                  d_gold, GOLDEN_TRANSFORMER_TOL);
    assert_true(d_tp <= TP_VS_SINGLE_TOL && d_gold <= GOLDEN_TRANSFORMER_TOL);
    io_line tp[2] = {{0}, {0}};
    assert_int_equal(parse_io(log2, tp, 2), 2);
    assert_true(tp[0].collectives >= 2 * 4 + 2 * 1);
    free(log1);
    free(log2);

    /* the text encoder on two golden prompts (rows 0-1 of the golden batch), layers 1, 2, 3 */
    cdf_tensor_map g, in;
    tu_load_map(&g, "golden/flux2_text/outputs/prompt_embeds.safetensors");
    cdf_tensor_map_init(&in);
    cdf_scope_push();
    int64_t lv[3] = {1, 2, 3};
    assert_int_equal(cdf_tensor_map_set(&in, "input_ids", cdf_contiguous(cdf_narrow(cdf_tensor_map_get(&g, "input_ids"), 0, 0, 2))),
                     CDF_OK);
    assert_int_equal(
        cdf_tensor_map_set(&in, "attention_mask", cdf_contiguous(cdf_narrow(cdf_tensor_map_get(&g, "attention_mask"), 0, 0, 2))),
        CDF_OK);
    assert_int_equal(cdf_tensor_map_set(&in, "text_encoder_out_layers",
                                        cdf_tensor_from_host(tu_cpu(), CDF_I64, 1, (int64_t[]){3}, lv, CDF_I64)),
                     CDF_OK);
    cdf_tensor_map want;
    cdf_tensor_map_init(&want);
    assert_int_equal(
        cdf_tensor_map_set(&want, "prompt_embeds", cdf_contiguous(cdf_narrow(cdf_tensor_map_get(&g, "prompt_embeds"), 0, 0, 2))),
        CDF_OK);
    char te_in[400], te_want[400]; /* copies: tmp_path's buffers are reused */
    snprintf(te_in, sizeof te_in, "%s", tu_tmp_path("flux2_te_in.safetensors"));
    snprintf(te_want, sizeof te_want, "%s", tu_tmp_path("flux2_te_want.safetensors"));
    assert_int_equal(cdf_tensor_map_save(&in, te_in, true), CDF_OK);
    assert_int_equal(cdf_tensor_map_save(&want, te_want, false), CDF_OK);
    cdf_scope_pop(NULL, 0);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&want);
    cdf_tensor_map_clear(&g);
    snprintf(args, sizeof args, "--model '%s' --inputs '%s' --threads 1 --dtype f32", tu_data("golden/flux2_text/text_encoder"), te_in);
    run_one_and_tp("run-model", args, "flux2_rm_te", false, &log1, &log2);
    d_tp = file_diff(out_path("flux2_rm_te", "_one.out"), "out.prompt_embeds", out_path("flux2_rm_te", "_tp.out"),
                     "out.prompt_embeds");
    d_gold = file_diff(out_path("flux2_rm_te", "_tp.out"), "out.prompt_embeds", te_want, "prompt_embeds");
    print_message("  text encoder: |tp - one| = %.3g (tol %.0e), |tp - transformers| = %.3g (tol %.0e)\n", d_tp,
                  TP_VS_SINGLE_TOL, d_gold, GOLDEN_EMBEDS_TOL);
    assert_true(d_tp <= TP_VS_SINGLE_TOL && d_gold <= GOLDEN_EMBEDS_TOL);
    assert_int_equal(parse_io(log2, tp, 2), 2);
    assert_true(tp[0].collectives >= 3 * 2); /* layers 1..3 run: o_proj and down_proj each */
    free(log1);
    free(log2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_colwise_slices),
        cmocka_unit_test(test_component_bytes_offline),
        cmocka_unit_test(test_not_divisible),
        cmocka_unit_test(test_generate_tp2),
        cmocka_unit_test(test_generate_tp2_single_file),
        cmocka_unit_test(test_run_model_tp2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
