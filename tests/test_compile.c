/* compile mode: capture once per input signature, replay afterwards; results equal the
 * golden outputs (and eager); recompilation semantics asserted on the counters. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "compile/compile.h"
#include "models/component.h"

static double run_and_diff(cdf_component *c, const char *method, const cdf_tensor_map *in, const cdf_tensor_map *golden,
                           const char *key) {
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_component_run(c, method, in, &out);
    if (s != CDF_OK) fail_msg("run: %s", cdf_last_error());
    double d = tu_diff_tensors(cdf_tensor_map_get(&out, key), cdf_tensor_map_get(golden, key), key);
    cdf_tensor_map_clear(&out);
    return d;
}

static void test_sd3_compiled_matches_golden_and_reuses_graph(void **state) {
    (void)state;
    cdf_component *c = tu_load_component(tu_data("golden/sd35m/transformer"), CDF_F32);
    cdf_tensor_map io;
    tu_load_map(&io, "golden/sd35m/io.safetensors");
    cdf_compile_options o = cdf_compile_options_default(); /* fullgraph */
    assert_int_equal(cdf_component_compile(c, &o), CDF_OK);
    cdf_exec_stats s0, s1, s2;
    cdf_exec_get_stats(&s0);
    double d1 = run_and_diff(c, "forward", &io, &io, "out.sample");
    cdf_exec_get_stats(&s1);
    assert_int_equal(s1.compiles - s0.compiles, 1);
    assert_int_equal(s1.cache_hits - s0.cache_hits, 0);
    /* a different timestep (a later denoising step) is an input: no recompile */
    cdf_tensor_map io2;
    cdf_tensor_map_init(&io2);
    for (int i = 0; i < io.n; i++) cdf_tensor_map_set(&io2, io.names[i], io.tensors[i]);
    int64_t one[1] = {1};
    cdf_tensor *t2 = cdf_tensor_full(tu_cpu(), CDF_F32, 1, one, 500.0);
    cdf_tensor_map_set(&io2, "timestep", t2);
    cdf_tensor_release(t2);
    cdf_compile_set_forbid_recompile(true);
    cdf_tensor_map out2;
    cdf_tensor_map_init(&out2);
    assert_int_equal(cdf_component_run(c, "forward", &io2, &out2), CDF_OK);
    double d2 = run_and_diff(c, "forward", &io, &io, "out.sample");
    cdf_compile_set_forbid_recompile(false);
    cdf_exec_get_stats(&s2);
    assert_int_equal(s2.compiles - s1.compiles, 0);
    assert_int_equal(s2.cache_hits - s1.cache_hits, 2);
    assert_int_equal(cdf_component_compiled_graphs(c), 1);
    print_message("  sd35m compiled: first call %.3g, replay %.3g (golden tol 3e-4)\n", d1, d2);
    assert_true(d1 <= 3e-4 && d2 <= 3e-4);
    /* the replay with another timestep really used it: output differs from the golden one */
    double d3 = tu_diff_tensors(cdf_tensor_map_get(&out2, "out.sample"), cdf_tensor_map_get(&io, "out.sample"), "t=500");
    assert_true(d3 > 1e-3);
    /* and equals an eager run with the same inputs */
    cdf_component *e = tu_load_component(tu_data("golden/sd35m/transformer"), CDF_F32);
    cdf_tensor_map oute;
    cdf_tensor_map_init(&oute);
    assert_int_equal(cdf_component_run(e, "forward", &io2, &oute), CDF_OK);
    double d4 = tu_diff_tensors(cdf_tensor_map_get(&out2, "out.sample"), cdf_tensor_map_get(&oute, "out.sample"), "eager");
    assert_true(d4 == 0.0);
    cdf_tensor_map_clear(&oute);
    cdf_component_free(e);
    /* a new latent size compiles exactly once more */
    cdf_tensor_map io3;
    cdf_tensor_map_init(&io3);
    for (int i = 0; i < io.n; i++) cdf_tensor_map_set(&io3, io.names[i], io.tensors[i]);
    int64_t hs[4] = {1, 16, 8, 12};
    cdf_tensor *h3 = cdf_tensor_full(tu_cpu(), CDF_F32, 4, hs, 0.25);
    cdf_tensor_map_set(&io3, "hidden_states", h3);
    cdf_tensor_release(h3);
    cdf_tensor_map out3;
    cdf_tensor_map_init(&out3);
    assert_int_equal(cdf_component_run(c, "forward", &io3, &out3), CDF_OK);
    assert_int_equal(cdf_component_run(c, "forward", &io3, &out3), CDF_OK);
    cdf_exec_stats s3;
    cdf_exec_get_stats(&s3);
    assert_int_equal(s3.compiles - s2.compiles, 1);
    assert_int_equal(cdf_component_compiled_graphs(c), 2);
    cdf_tensor_map_clear(&out2);
    cdf_tensor_map_clear(&out3);
    cdf_tensor_map_clear(&io2);
    cdf_tensor_map_clear(&io3);
    cdf_tensor_map_clear(&io);
    cdf_component_free(c);
}

/* The golden kl16 VAE, compiled (default options), and its golden inputs/outputs in *io. */
static cdf_component *compiled_golden_vae(cdf_tensor_map *io) {
    cdf_component *c = tu_load_component(tu_data("golden/vae_kl16/vae"), CDF_F32);
    tu_load_map(io, "golden/vae_kl16/io.safetensors");
    assert_int_equal(cdf_component_compile(c, NULL), CDF_OK);
    return c;
}

static void test_vae_decode_compiled(void **state) {
    (void)state;
    cdf_tensor_map io;
    cdf_component *c = compiled_golden_vae(&io);
    double d1 = run_and_diff(c, "decode", &io, &io, "out.decode_sample");
    double d2 = run_and_diff(c, "decode", &io, &io, "out.decode_sample");
    double d3 = run_and_diff(c, "encode", &io, &io, "out.encode_mean");
    print_message("  vae compiled decode %.3g / replay %.3g, encode %.3g (tol 2e-5)\n", d1, d2, d3);
    assert_true(d1 <= 2e-5 && d2 <= 2e-5 && d3 <= 2e-5);
    assert_int_equal(cdf_component_compiled_graphs(c), 2);
    cdf_tensor_map_clear(&io);
    cdf_component_free(c);
}

/* A cached graph holds no device memory between calls: each replay allocates its arena and frees
 * it after its last kernel, so two cached shapes do not each keep one (the memory planner's
 * repeated-block plan counts one arena at a time). */
static uint64_t device_bytes(void) {
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_memory_stats st;
    cdf_device_memory_stats(tu_cpu(), &st);
    return st.current_bytes;
}

static void test_graph_arena_lives_only_while_it_runs(void **state) {
    (void)state;
    cdf_tensor_map io;
    cdf_component *c = compiled_golden_vae(&io);
    const uint64_t base = device_bytes();
    cdf_device_reset_peak(tu_cpu());
    for (int call = 0; call < 3; call++) { /* capture, then two replays */
        cdf_tensor_map out;
        cdf_tensor_map_init(&out);
        assert_int_equal(cdf_component_run(c, "decode", &io, &out), CDF_OK);
        assert_true(device_bytes() > base); /* the output */
        cdf_tensor_map_clear(&out);
        assert_int_equal(device_bytes(), base);
    }
    cdf_memory_stats st;
    cdf_device_memory_stats(tu_cpu(), &st);
    assert_true(st.peak_bytes > base); /* the arena existed while the graph ran */
    /* a second shape: a second graph, still nothing held between calls */
    cdf_tensor_map io2;
    cdf_tensor_map_init(&io2);
    for (int i = 0; i < io.n; i++) cdf_tensor_map_set(&io2, io.names[i], io.tensors[i]);
    const cdf_tensor *z = cdf_tensor_map_get(&io, "z");
    assert_non_null(z);
    int64_t shape[4];
    for (int d = 0; d < 4; d++) shape[d] = cdf_tensor_dim(z, d);
    shape[2] *= 2;
    cdf_tensor *z2 = cdf_tensor_full(tu_cpu(), CDF_F32, 4, shape, 0.1);
    cdf_tensor_map_set(&io2, "z", z2);
    cdf_tensor_release(z2);
    const uint64_t base2 = device_bytes();
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    assert_int_equal(cdf_component_run(c, "decode", &io2, &out), CDF_OK);
    cdf_tensor_map_clear(&out);
    assert_int_equal(cdf_component_compiled_graphs(c), 2);
    assert_int_equal(device_bytes(), base2);
    cdf_tensor_map_clear(&io2);
    cdf_tensor_map_clear(&io);
    cdf_component_free(c);
}

/* FLUX.1 computes its RoPE tables on the device: the whole transformer is one graph. */
static void test_flux_compiles_fullgraph(void **state) {
    (void)state;
    cdf_component *c = tu_load_component(tu_data("golden/flux1_dev/transformer"), CDF_F32);
    cdf_tensor_map io;
    tu_load_map(&io, "golden/flux1_dev/io.safetensors");
    assert_int_equal(cdf_component_compile(c, NULL), CDF_OK);
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    double d1 = run_and_diff(c, "forward", &io, &io, "out.sample");
    double d2 = run_and_diff(c, "forward", &io, &io, "out.sample");
    cdf_exec_get_stats(&s1);
    print_message("  flux1-dev compiled: %.3g / replay %.3g (tol 3e-4)\n", d1, d2);
    assert_true(d1 <= 3e-4 && d2 <= 3e-4);
    assert_int_equal(s1.compiles - s0.compiles, 1);
    assert_int_equal(s1.cache_hits - s0.cache_hits, 1);
    assert_int_equal(s1.graph_breaks - s0.graph_breaks, 0);
    cdf_tensor_map_clear(&io);
    cdf_component_free(c);
}

/* A forward whose computation depends on values read on the host: y = x * sum(x), the sum
 * taken on the host from x's values. */
static cdf_status reading_forward(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    (void)ctx;
    cdf_tensor *x = cdf_tensor_map_get(in, "x");
    float v[3];
    cdf_status s = cdf_tensor_read(x, CDF_F32, v, sizeof v);
    if (s != CDF_OK) return s;
    return cdf_tensor_map_set(out, "out.y", cdf_scale(x, v[0] + v[1] + v[2]));
}

static cdf_tensor *vec3(float a, float b, float c) {
    float v[3] = {a, b, c};
    return cdf_tensor_from_host(tu_cpu(), CDF_F32, 1, (int64_t[]){3}, v, CDF_F32);
}

static float run_y0(cdf_graph_cache *gc, cdf_tensor *x, cdf_status *st) {
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_tensor_map_set(&in, "x", x);
    *st = cdf_graph_cache_run(gc, reading_forward, NULL, &in, &out, NULL, 0);
    float y[3] = {0};
    if (*st == CDF_OK) *st = cdf_tensor_read(cdf_tensor_map_get(&out, "out.y"), CDF_F32, y, sizeof y);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return y[0];
}

/* A host read inside a capture is a graph break: fullgraph refuses it with an error naming the
 * module and the read; without fullgraph the forward falls back to eager and the signature is not
 * retried. Declared static, the input's values become part of the key instead: no break, and a
 * new value compiles a new plan (never a stale replay). */
static void test_graph_break_and_static_inputs(void **state) {
    (void)state;
    cdf_scope_push();
    cdf_tensor *x1 = vec3(1, 2, 3), *x2 = vec3(2, 2, 2);
    cdf_status st;
    cdf_graph_cache *full = cdf_graph_cache_new("Reader.forward", NULL); /* fullgraph by default */
    run_y0(full, x1, &st);
    assert_int_equal(st, CDF_ERR_GRAPH_BREAK);
    assert_non_null(strstr(cdf_last_error(), "graph break in Reader.forward"));
    assert_non_null(strstr(cdf_last_error(), "[3] f32"));
    cdf_device_synchronize(tu_cpu());
    cdf_graph_cache_free(full);

    cdf_compile_options o = cdf_compile_options_default();
    o.fullgraph = false;
    cdf_graph_cache *lax = cdf_graph_cache_new("Reader.forward", &o);
    cdf_exec_stats b0, b1;
    cdf_exec_get_stats(&b0);
    float y = run_y0(lax, x1, &st);
    if (st != CDF_OK) fail_msg("eager fallback: %s", cdf_last_error());
    assert_float_equal(y, 6.0f, 0);
    assert_float_equal(run_y0(lax, x2, &st), 12.0f, 0);
    cdf_exec_get_stats(&b1);
    assert_int_equal(b1.graph_breaks - b0.graph_breaks, 1); /* remembered: not retried */
    assert_int_equal(b1.compiles - b0.compiles, 0);
    cdf_graph_cache_free(lax);

    cdf_graph_cache *guarded = cdf_graph_cache_new("Reader.forward", NULL);
    assert_int_equal(cdf_graph_cache_set_static_inputs(guarded, (const char *const[]){"x", NULL}), CDF_OK);
    cdf_exec_get_stats(&b0);
    assert_float_equal(run_y0(guarded, x1, &st), 6.0f, 0);
    assert_int_equal(st, CDF_OK);
    assert_float_equal(run_y0(guarded, x1, &st), 6.0f, 0);  /* replay */
    assert_float_equal(run_y0(guarded, x2, &st), 12.0f, 0); /* new values: a new plan */
    cdf_exec_get_stats(&b1);
    assert_int_equal(b1.graph_breaks - b0.graph_breaks, 0);
    assert_int_equal(b1.compiles - b0.compiles, 2);
    assert_int_equal(b1.cache_hits - b0.cache_hits, 1);
    assert_int_equal(cdf_graph_cache_size(guarded), 2);
    cdf_graph_cache_free(guarded);
    cdf_scope_pop(NULL, 0);
}

/* out.y = table[ids] * 2: a gather whose ids are an input */
static cdf_status gather_forward(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    cdf_tensor *table = ctx;
    return cdf_tensor_map_set(out, "out.y", cdf_scale(cdf_embedding(table, cdf_tensor_map_get(in, "ids")), 2.0f));
}

/* A replayed plan runs as one graph of the backend with this call's buffers bound; a kernel that
 * fails inside it is reported at the next sync naming the op, and the device and the plan stay
 * usable for the next call. */
static void test_failure_inside_a_replayed_graph(void **state) {
    (void)state;
    cdf_scope_push();
    float tv[6] = {1, 2, 3, 4, 5, 6};
    cdf_tensor *table = cdf_tensor_from_host(tu_cpu(), CDF_F32, 2, (int64_t[]){3, 2}, tv, CDF_F32);
    cdf_graph_cache *gc = cdf_graph_cache_new("Gather.forward", NULL);
    int64_t good[2] = {2, 0}, bad[2] = {1, 7};
    float y[4];
    for (int round = 0; round < 3; round++) {
        const int64_t *ids = round == 1 ? bad : good;
        cdf_tensor *t = cdf_tensor_from_host(tu_cpu(), CDF_I64, 1, (int64_t[]){2}, ids, CDF_I64);
        cdf_tensor_map in, out;
        cdf_tensor_map_init(&in);
        cdf_tensor_map_init(&out);
        cdf_tensor_map_set(&in, "ids", t);
        assert_int_equal(cdf_graph_cache_run(gc, gather_forward, table, &in, &out, NULL, 0), CDF_OK);
        cdf_status st = cdf_tensor_read(cdf_tensor_map_get(&out, "out.y"), CDF_F32, y, sizeof y);
        if (round == 1) {
            assert_int_equal(st, CDF_ERR_DEVICE);
            assert_non_null(strstr(cdf_last_error(), "queued op 'embedding' failed (node 0 of a compiled graph)"));
            assert_non_null(strstr(cdf_last_error(), "id 7 at position 1"));
        } else {
            assert_int_equal(st, CDF_OK);
            assert_true(y[0] == 10 && y[1] == 12 && y[2] == 2 && y[3] == 4);
        }
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&out);
    }
    assert_int_equal(cdf_graph_cache_size(gc), 1); /* one capture, two replays */
    cdf_graph_cache_free(gc);
    cdf_scope_pop(NULL, 0);
}

/* Every golden component compiles as one graph (fullgraph): text encoders, both VAEs (encode and
 * decode), every transformer. The replay matches the golden output; and the eager forward reads
 * nothing on the host (no sync for a read: the forward can run ahead of the device whole). */
typedef struct golden_case {
    const char *model, *io, *method;
    const char *inputs[7];  /* names in the io file (NULL-terminated) */
    const char *out, *want; /* output name, golden name */
    double tol;
    bool layers;            /* Mistral: text_encoder_out_layers (1, 2, 3), a static input */
} golden_case;

static const golden_case k_cases[] = {
    {"golden/text_models/clip_l_tiny", "golden/text_models/outputs/clip_l_tiny.safetensors", "forward", {"input_ids"},
     "out.pooler_output", "pooler_output", 1e-4, false},
    {"golden/text_models/clip_g_tiny", "golden/text_models/outputs/clip_g_tiny.safetensors", "forward", {"input_ids"},
     "out.text_embeds", "text_embeds", 1e-4, false},
    {"golden/text_models/t5_tiny", "golden/text_models/outputs/t5_tiny_256.safetensors", "forward", {"input_ids"},
     "out.last_hidden_state", "last_hidden_state", 1e-4, false},
    {"golden/flux2_text/text_encoder", "golden/flux2_text/outputs/prompt_embeds.safetensors", "forward",
     {"input_ids", "attention_mask"}, "out.prompt_embeds", "prompt_embeds", 1e-4, true},
    {"golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "encode", {"x"}, "out.encode_mean", "out.encode_mean", 2e-5, false},
    {"golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "decode", {"z"}, "out.decode_sample", "out.decode_sample", 2e-5, false},
    {"golden/vae_flux2/vae", "golden/vae_flux2/io.safetensors", "encode", {"x"}, "out.encode_mean", "out.encode_mean", 2e-5, false},
    {"golden/vae_flux2/vae", "golden/vae_flux2/io.safetensors", "decode", {"packed_latents", "packed_ids"},
     "out.pipeline_decode_sample", "out.pipeline_decode_sample", 2e-5, false},
    {"golden/flux1_schnell/transformer", "golden/flux1_schnell/io.safetensors", "forward",
     {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids"}, "out.sample",
     "out.sample", 3e-4, false},
    {"golden/sd3/transformer", "golden/sd3/io.safetensors", "forward",
     {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"}, "out.sample", "out.sample", 3e-4, false},
    {"golden/flux2_klein/transformer", "golden/flux2_klein/io.safetensors", "forward",
     {"hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids"}, "out.sample", "out.sample", 3e-4, false},
};

static void set_inputs(const golden_case *gc, const cdf_tensor_map *io, cdf_tensor_map *in) {
    cdf_tensor_map_init(in);
    for (int k = 0; gc->inputs[k]; k++) assert_int_equal(cdf_tensor_map_set(in, gc->inputs[k], cdf_tensor_map_get(io, gc->inputs[k])), CDF_OK);
    if (gc->layers) {
        int64_t l[3] = {1, 2, 3};
        cdf_tensor *t = cdf_tensor_from_host(tu_cpu(), CDF_I64, 1, (int64_t[]){3}, l, CDF_I64);
        cdf_tensor_map_set(in, "text_encoder_out_layers", t);
        cdf_tensor_release(t);
    }
}

static void test_every_component_compiles_fullgraph(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        const golden_case *gc = &k_cases[i];
        cdf_tensor_map io, in, out;
        tu_load_map(&io, gc->io);
        set_inputs(gc, &io, &in);
        cdf_tensor_map_init(&out);
        /* eager: no host read during the forward (a static input is read: one read) */
        cdf_component *e = tu_load_component(tu_data(gc->model), CDF_F32);
        cdf_exec_stats s0, s1, s2;
        cdf_exec_get_stats(&s0);
        assert_int_equal(cdf_component_run(e, gc->method, &in, &out), CDF_OK);
        cdf_exec_get_stats(&s1);
        const bool has_static = gc->layers || strcmp(gc->inputs[1] ? gc->inputs[1] : "", "packed_ids") == 0;
        if (!has_static) assert_int_equal(s1.host_syncs - s0.host_syncs, 0);
        double de = tu_diff_tensors(cdf_tensor_map_get(&out, gc->out), cdf_tensor_map_get(&io, gc->want), gc->out);
        cdf_tensor_map_clear(&out);
        cdf_component_free(e);
        /* compile, fullgraph: one capture, then a replay; no graph break */
        cdf_component *c = tu_load_component(tu_data(gc->model), CDF_F32);
        assert_int_equal(cdf_component_compile(c, NULL), CDF_OK);
        cdf_exec_get_stats(&s0);
        cdf_status st = cdf_component_run(c, gc->method, &in, &out);
        if (st != CDF_OK) fail_msg("%s.%s: %s", gc->model, gc->method, cdf_last_error());
        cdf_tensor_map_clear(&out);
        cdf_exec_get_stats(&s1);
        assert_int_equal(cdf_component_run(c, gc->method, &in, &out), CDF_OK);
        cdf_exec_get_stats(&s2);
        double dc = tu_diff_tensors(cdf_tensor_map_get(&out, gc->out), cdf_tensor_map_get(&io, gc->want), gc->out);
        print_message("  %-34s %-7s eager %.3g, compiled replay %.3g (tol %.0e)\n", gc->model, gc->method, de, dc, gc->tol);
        assert_int_equal(s2.graph_breaks - s0.graph_breaks, 0);
        assert_int_equal(s1.compiles - s0.compiles, 1);
        assert_int_equal(s2.cache_hits - s1.cache_hits, 1);
        /* the replay reads nothing on the host (with static inputs: their values, for the key) */
        if (!has_static) assert_int_equal(s2.host_syncs - s1.host_syncs, 0);
        assert_true(de <= gc->tol && dc <= gc->tol);
        cdf_tensor_map_clear(&out);
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&io);
        cdf_component_free(c);
    }
}

static void test_dynamic_refused(void **state) {
    (void)state;
    cdf_component *c = tu_load_component(tu_data("golden/vae_kl16/vae"), CDF_F32);
    cdf_compile_options o = cdf_compile_options_default();
    o.dynamic = true;
    assert_int_equal(cdf_component_compile(c, &o), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "dynamic"));
    cdf_component_free(c);
}

/* Repeated-block compile: one graph per block class and shape, shared by every instance
 * (weights are parameters), results equal to the golden outputs. */
static void check_repeated_blocks(const char *model, const char *io, int expect_graphs, double tol) {
    cdf_component *c = tu_load_component(tu_data(model), CDF_F32);
    cdf_tensor_map g;
    tu_load_map(&g, io);
    assert_int_equal(cdf_component_compile_repeated_blocks(c, NULL), CDF_OK);
    cdf_exec_stats s0, s1, s2;
    cdf_exec_get_stats(&s0);
    double d1 = run_and_diff(c, "forward", &g, &g, "out.sample");
    cdf_exec_get_stats(&s1);
    double d2 = run_and_diff(c, "forward", &g, &g, "out.sample");
    cdf_exec_get_stats(&s2);
    print_message("  %s repeated blocks: %d graphs, first %.3g, replay %.3g (tol %.1g)\n", model,
                  cdf_component_compiled_graphs(c), d1, d2, tol);
    assert_true(d1 <= tol && d2 <= tol);
    assert_int_equal(cdf_component_compiled_graphs(c), expect_graphs);
    assert_int_equal(s1.compiles - s0.compiles, expect_graphs);
    assert_int_equal(s2.compiles - s1.compiles, 0); /* second forward: every block replays */
    assert_true(s2.cache_hits > s1.cache_hits);
    cdf_tensor_map_clear(&g);
    cdf_component_free(c);
}

/* FLUX.1: 2 double + 2 single blocks -> 2 graphs (FluxTransformerBlock, FluxSingleTransformerBlock) */
static void test_repeated_blocks_flux(void **s) {
    (void)s;
    check_repeated_blocks("golden/flux1_dev/transformer", "golden/flux1_dev/io.safetensors", 2, 3e-4);
}
/* SD3.5: blocks 0-1 dual-attention, block 2 context_pre_only -> 2 graphs; SD3: 2 plain + last -> 2 */
static void test_repeated_blocks_sd3(void **s) {
    (void)s;
    check_repeated_blocks("golden/sd35m/transformer", "golden/sd35m/io.safetensors", 2, 3e-4);
    check_repeated_blocks("golden/sd3/transformer", "golden/sd3/io.safetensors", 2, 3e-4);
}

int main(void) {
    /* these tests compile explicitly and count compiles: the suite-wide switch would add more */
    unsetenv("CDIFFUSERS_COMPILE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sd3_compiled_matches_golden_and_reuses_graph),
        cmocka_unit_test(test_vae_decode_compiled),
        cmocka_unit_test(test_graph_arena_lives_only_while_it_runs),
        cmocka_unit_test(test_flux_compiles_fullgraph),
        cmocka_unit_test(test_graph_break_and_static_inputs),
        cmocka_unit_test(test_every_component_compiles_fullgraph),
        cmocka_unit_test(test_failure_inside_a_replayed_graph),
        cmocka_unit_test(test_dynamic_refused),
        cmocka_unit_test(test_repeated_blocks_flux),
        cmocka_unit_test(test_repeated_blocks_sd3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
