/* LoRA adapters with tensor parallelism (issue #20; src/nn/lora.c, src/nn/sharded.c,
 * src/pipelines/lora.c). A shard gets its slice of each adapter: a column-wise (or packed
 * column-wise) layer all of A [r, in] and its rows of B, a row-wise (or packed row-wise) layer its
 * columns of A and all of B, whose partial product joins the layer's all-reduce; fused, each rank
 * adds its slice of the delta to its own shard.
 *
 * The reference is the single-process LoRA result, itself checked against diffusers + PEFT in
 * tests/test_lora.c and tests/test_lora_pipeline.c (tests/data/lora, made by
 * tools/make-lora-golden). Over MPI (2 ranks on loopback; skipped without MPI or mpirun):
 *   - this executable relaunched as 2 ranks loads the tiny golden FLUX.1-dev, SD3 and FLUX.2-dev
 *     transformers once whole and once sharded over the 2 ranks, with the reference adapters
 *     (diffusers/PEFT on every linear, kohya's fused qkv / linear1 split over several sharded
 *     layers, XLabs' proj_lora on the packed row-wise proj_out, FLUX.2's packed column-wise
 *     to_qkv_mlp_proj and packed row-wise to_out, two adapters at once), and compares: run time at
 *     scale 1, then 0.7 set without a reload (and without a recompile in a compiled mode), run-time
 *     unload, fused at 0.7, then unfused. Each rank keeps only its slices on the device (the
 *     A/B shapes of every sharded layer), fused layers change, and the fused unload gives every
 *     rank its shard back bit for bit (and the single process its weights; the unload reads the
 *     fused layers' weights again, see nn/lora.h) with the output of before the fuse exactly;
 *   - `cdiffusers generate --tp 2 --lora ...` on the tiny FLUX.1-dev pipeline (a kohya transformer
 *     adapter plus a CLIP-L text-encoder adapter, both sharded) and the tiny SD3.5 pipeline (CLIP-L
 *     and CLIP-G adapters, sharded), run time and fused: final latents equal the single-process
 *     run with the same adapters.
 *
 * Tolerance TP vs single process: TP_VS_SINGLE_TOL = 1e-4, the one tests/test_dist.c and
 * tests/test_dist_flux2.c use (row-wise layers sum partial products in another order, ~1 ulp per
 * layer; a wrong slice of an adapter moves the outputs by O(1): the adapters move them by 1.6-5.6).
 * TP vs diffusers: the golden transformers' own tolerances (test_lora.c). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/dist.h"
#include "compile/compile.h"
#include "dist_test_common.h"
#include "models/component.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"

#define TP_VS_SINGLE_TOL 1e-4

/* ---- MPI worker: this executable started as one rank of `mpirun -np 2 <self> --mpi-worker` ---- */
static int rank_g, failures_g;
#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "rank %d: check failed at line %d: %s (%s)\n", rank_g, __LINE__, #cond, cdf_last_error()); \
            failures_g++;                                                                                              \
        }                                                                                                              \
    } while (0)

typedef struct lcase {
    const char *folder;  /* golden/<x>: transformer/ and io.safetensors */
    const char *ref;     /* lora/<x>.safetensors: diffusers' outputs */
    const char *adapter; /* lora/<adapter>.safetensors, reference keys out.<adapter>.* */
    const char *second;  /* NULL, or a second adapter at 1.3 (reference key out.<adapter>.multi) */
    double atol;         /* the golden transformer's tolerance vs diffusers (test_lora.c) */
} lcase;

static const char *data(const char *rel) {
    static char buf[8][1024];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 1024, "%s/%s", CDF_TEST_DATA, rel);
    return b;
}

static cdf_component *load(const lcase *lc) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/transformer", data(lc->folder));
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_F32;
    cdf_component *c = NULL;
    if (cdf_component_load(dir, &o, &c) != CDF_OK) fprintf(stderr, "rank %d: loading %s: %s\n", rank_g, dir, cdf_last_error());
    return c;
}

static cdf_status load_lora(cdf_component *c, const char *adapter, int id, float scale, cdf_lora_mode mode) {
    char rel[256];
    snprintf(rel, sizeof rel, "lora/%s.safetensors", adapter);
    cdf_lora_components cs = {.n = 1, .name = {"transformer"}, .c = {c}};
    cdf_lora_params lp = cdf_lora_params_default();
    lp.scale = scale;
    lp.mode = mode;
    cdf_status s = cdf_lora_load_into(&cs, data(rel), &lp, id, NULL);
    if (s != CDF_OK) fprintf(stderr, "rank %d: LoRA %s: %s\n", rank_g, rel, cdf_last_error());
    return s;
}

/* The forward on the golden inputs: out.sample as host floats (*n elements), NULL on failure. */
static float *forward(cdf_component *c, const lcase *lc, int64_t *n) {
    char rel[512];
    snprintf(rel, sizeof rel, "%s/io.safetensors", lc->folder);
    cdf_tensor_map io, in, out;
    cdf_tensor_map_init(&io);
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    float *r = NULL;
    if (cdf_tensor_map_load(&io, data(rel), tu_cpu()) == CDF_OK) {
        for (int i = 0; i < io.n; i++)
            if (strncmp(io.names[i], "out.", 4) != 0 && strncmp(io.names[i], "extra.", 6) != 0)
                cdf_tensor_map_set(&in, io.names[i], io.tensors[i]);
        if (cdf_component_run(c, "forward", &in, &out) == CDF_OK) {
            cdf_tensor *t = cdf_tensor_map_get(&out, "out.sample");
            if (t) {
                *n = cdf_tensor_numel(t);
                r = cdf_tensor_read_f32(t);
            }
        }
    }
    if (!r) fprintf(stderr, "rank %d: forward: %s\n", rank_g, cdf_last_error());
    cdf_tensor_map_clear(&io);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return r;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    return a && b ? tu_max_abs_diff(a, b, (size_t)n, NULL) : INFINITY;
}

/* max |got - diffusers' out.<key>| */
static double golden_diff(const lcase *lc, const char *key, const float *got, int64_t n) {
    cdf_tensor_map ref;
    cdf_tensor_map_init(&ref);
    double d = INFINITY;
    if (cdf_tensor_map_load(&ref, data(lc->ref), tu_cpu()) == CDF_OK) {
        cdf_tensor *t = cdf_tensor_map_get(&ref, key);
        float *w = t && cdf_tensor_numel(t) == n ? cdf_tensor_read_f32(t) : NULL;
        d = maxdiff(got, w, n);
        free(w);
    }
    cdf_tensor_map_clear(&ref);
    return d;
}

static void set_scale(cdf_component *c, int id, float s) {
    cdf_lora_scales *sc = cdf_component_lora_scales(c, false);
    CHECK(sc && cdf_lora_scales_set(sc, id, s) == CDF_OK);
}

/* Every layer's weight as host floats, in the index's order. */
typedef struct snapshot {
    int n;
    float **w;
    int64_t *numel;
} snapshot;

static snapshot take(cdf_component *c) {
    cdf_layer_index *ix = cdf_component_layers(c);
    snapshot s = {.n = cdf_layer_index_count(ix)};
    s.w = calloc((size_t)s.n + 1, sizeof *s.w);
    s.numel = calloc((size_t)s.n + 1, sizeof *s.numel);
    for (int i = 0; i < s.n; i++) {
        cdf_linear_layer *l = cdf_layer_index_at(ix, i, NULL);
        s.numel[i] = cdf_tensor_numel(l->w);
        s.w[i] = cdf_tensor_read_f32(l->w);
    }
    return s;
}

static void snapshot_free(snapshot *s) {
    for (int i = 0; i < s->n; i++) free(s->w[i]);
    free(s->w);
    free(s->numel);
}

/* Elements of b that are not bit-equal to a's, summed over the layers; *changed: layers that
 * differ at all; *beyond: elements off by more than one rounding of an f32 of their magnitude
 * (fused value and restored value both considered: 2^-23 relative to the larger of the two). */
static int64_t compare(const snapshot *a, const snapshot *b, const snapshot *fused, int *changed, int64_t *beyond) {
    int64_t diff = 0;
    *changed = 0;
    if (beyond) *beyond = 0;
    for (int i = 0; i < a->n && i < b->n; i++) {
        int64_t d = 0;
        for (int64_t j = 0; j < a->numel[i]; j++) {
            if (memcmp(&a->w[i][j], &b->w[i][j], sizeof(float)) == 0) continue;
            d++;
            if (beyond && fused) {
                const double m = fmax(fabs(a->w[i][j]), fabs(fused->w[i][j]));
                if (fabs((double)a->w[i][j] - b->w[i][j]) > ldexp(m, -23)) (*beyond)++;
            }
        }
        diff += d;
        *changed += d > 0;
    }
    return diff;
}

/* Which layers of a loaded sharded component are shards, and that their adapters were cut to
 * them: every run-time link's A is [R, l->in] and B [l->out, R] (cdf_linear_list_weights lists
 * weight, bias, A, B, scales). Returns the number of sharded layers with an adapter. */
static int check_slices(cdf_component *c) {
    cdf_layer_index *ix = cdf_component_layers(c);
    int n = 0;
    for (int i = 0; i < cdf_layer_index_count(ix); i++) {
        const char *name;
        cdf_linear_layer *l = cdf_layer_index_at(ix, i, &name);
        if (!l->lora || l->shard.style == CDF_TP_REPLICATE) continue;
        cdf_tensor *w[8];
        const int k = cdf_linear_list_weights(w, 0, l);
        cdf_tensor *a = w[k - 3], *b = w[k - 2];
        const bool ok = cdf_tensor_dim(a, 1) == l->in && cdf_tensor_dim(b, 0) == l->out &&
                        cdf_tensor_dim(a, 0) == cdf_tensor_dim(b, 1);
        if (!ok)
            fprintf(stderr, "rank %d: %s: A [%lld, %lld], B [%lld, %lld], shard %lld -> %lld\n", rank_g, name,
                    (long long)cdf_tensor_dim(a, 0), (long long)cdf_tensor_dim(a, 1), (long long)cdf_tensor_dim(b, 0),
                    (long long)cdf_tensor_dim(b, 1), (long long)l->in, (long long)l->out);
        CHECK(ok);
        CHECK(l->in < cdf_linear_full_in(l) || l->out < cdf_linear_full_out(l));
        n++;
    }
    return n;
}

static void run_case(const lcase *lc, cdf_device_mesh *mesh) {
    char key[160];
    int64_t n = 0, m = 0;
    const bool multi = lc->second != NULL;
    const float s_first = multi ? 0.7f : 1.0f;

    /* ---- single process (tensor parallelism off): the reference ---- */
    cdf_tp_disable();
    cdf_component *c = load(lc);
    CHECK(c);
    if (!c) return;
    snapshot one_orig = take(c);
    float *one_base = forward(c, lc, &n);
    CHECK(load_lora(c, lc->adapter, 0, s_first, CDF_LORA_RUNTIME) == CDF_OK);
    if (multi) CHECK(load_lora(c, lc->second, 1, 1.3f, CDF_LORA_RUNTIME) == CDF_OK);
    float *one_s1 = forward(c, lc, &m);
    set_scale(c, multi ? 1 : 0, multi ? 0.0f : 0.7f);
    float *one_s07 = forward(c, lc, &m);
    cdf_component_free(c);
    float *one_f07 = NULL;
    int64_t one_unexact = 0;
    if (!multi) {
        c = load(lc);
        CHECK(c && load_lora(c, lc->adapter, 0, 0.7f, CDF_LORA_FUSE) == CDF_OK);
        one_f07 = forward(c, lc, &m);
        CHECK(cdf_component_lora_unfuse(c) == CDF_OK);
        snapshot back = take(c);
        int changed;
        one_unexact = compare(&one_orig, &back, NULL, &changed, NULL);
        snapshot_free(&back);
        cdf_component_free(c);
    }

    /* ---- 2 ranks ---- */
    CHECK(cdf_tp_enable(mesh, NULL) == CDF_OK);
    c = load(lc);
    CHECK(c);
    if (!c) goto done;
    float *tp_base = forward(c, lc, &m);
    CHECK(m == n);
    CHECK(maxdiff(one_base, tp_base, n) <= TP_VS_SINGLE_TOL);
    CHECK(load_lora(c, lc->adapter, 0, s_first, CDF_LORA_RUNTIME) == CDF_OK);
    if (multi) CHECK(load_lora(c, lc->second, 1, 1.3f, CDF_LORA_RUNTIME) == CDF_OK);
    const int sharded = check_slices(c);
    CHECK(sharded > 0);
    float *tp_s1 = forward(c, lc, &m);
    snprintf(key, sizeof key, "out.%s.%s", lc->adapter, multi ? "multi" : "runtime_s1");
    const double d_s1 = maxdiff(one_s1, tp_s1, n), g_s1 = golden_diff(lc, key, tp_s1, n);
    /* a new scale: no reload, no recompile (compiled modes) */
    const int graphs = cdf_component_compiled_graphs(c);
    set_scale(c, multi ? 1 : 0, multi ? 0.0f : 0.7f);
    cdf_compile_set_forbid_recompile(true);
    float *tp_s07 = forward(c, lc, &m);
    cdf_compile_set_forbid_recompile(false);
    CHECK(cdf_component_compiled_graphs(c) == graphs);
    snprintf(key, sizeof key, "out.%s.runtime_s07", lc->adapter);
    const double d_s07 = maxdiff(one_s07, tp_s07, n), g_s07 = golden_diff(lc, key, tp_s07, n);
    /* run-time unload: the weights were never touched, the base model again */
    cdf_component_lora_reset(c);
    float *tp_unloaded = forward(c, lc, &m);
    const double d_unl = maxdiff(one_base, tp_unloaded, n);
    cdf_component_free(c);
    fprintf(stderr,
            "rank %d: %-18s run time: %d sharded layers with adapters; |tp - one| %s %.3g, s0.7 %.3g, unloaded %.3g (tol %.0e); "
            "|tp - diffusers| %.3g, %.3g (tol %.0e)\n",
            rank_g, lc->adapter, sharded, multi ? "multi" : "s1", d_s1, d_s07, d_unl, TP_VS_SINGLE_TOL, g_s1, g_s07, lc->atol);
    CHECK(d_s1 <= TP_VS_SINGLE_TOL && d_s07 <= TP_VS_SINGLE_TOL && d_unl <= TP_VS_SINGLE_TOL);
    CHECK(g_s1 <= lc->atol && g_s07 <= lc->atol);
    /* the adapter does move the output (a dropped one would pass nothing above, but say so) */
    CHECK(maxdiff(one_base, one_s1, n) > 0.1);

    if (!multi) {
        c = load(lc);
        CHECK(c);
        if (!c) goto done_tp;
        snapshot orig = take(c);
        CHECK(load_lora(c, lc->adapter, 0, 0.7f, CDF_LORA_FUSE) == CDF_OK);
        CHECK(cdf_component_lora_scales(c, false) == NULL); /* nothing at run time */
        snapshot fused = take(c);
        int changed = 0, restored_changed = 0;
        compare(&orig, &fused, NULL, &changed, NULL);
        CHECK(changed > 0);
        float *tp_f07 = forward(c, lc, &m);
        snprintf(key, sizeof key, "out.%s.fused_s07", lc->adapter);
        const double d_f = maxdiff(one_f07, tp_f07, n), g_f = golden_diff(lc, key, tp_f07, n);
        CHECK(cdf_component_lora_unfuse(c) == CDF_OK);
        snapshot back = take(c);
        int64_t beyond = 0;
        const int64_t unexact = compare(&orig, &back, &fused, &restored_changed, &beyond);
        float *tp_unfused = forward(c, lc, &m);
        const double d_unf = maxdiff(tp_base, tp_unfused, n);
        fprintf(stderr,
                "rank %d: %-18s fused: %d layers changed; |tp - one| %.3g (tol %.0e), |tp - diffusers| %.3g (tol %.0e); "
                "unfused: %lld elements not bit-equal to the loaded shard (single process: %lld of its whole weights), "
                "%lld beyond one rounding; output vs before %.3g\n",
                rank_g, lc->adapter, changed, d_f, TP_VS_SINGLE_TOL, g_f, lc->atol, (long long)unexact,
                (long long)one_unexact, (long long)beyond, d_unf);
        CHECK(d_f <= TP_VS_SINGLE_TOL && g_f <= lc->atol);
        /* the unload reads every fused layer's original weight (this rank's slice) again: bit for
         * bit, on every rank and in the single process alike (a subtraction would leave ~1e4
         * elements one rounding off here) */
        CHECK(unexact == 0 && one_unexact == 0 && beyond == 0);
        CHECK(d_unf == 0);
        snapshot_free(&orig);
        snapshot_free(&fused);
        snapshot_free(&back);
        free(tp_f07);
        free(tp_unfused);
        cdf_component_free(c);
    }
done_tp:
    free(tp_base), free(tp_s1), free(tp_s07), free(tp_unloaded);
done:
    cdf_tp_disable();
    snapshot_free(&one_orig);
    free(one_base), free(one_s1), free(one_s07), free(one_f07);
}

static int mpi_worker(void) {
    cdf_process_group *pg = NULL;
    if (cdf_dist_init("mpi", &pg) != CDF_OK) {
        fprintf(stderr, "worker: %s\n", cdf_last_error());
        return 1;
    }
    rank_g = cdf_dist_rank(pg);
    cdf_device_mesh *mesh = NULL;
    CHECK(cdf_dist_world_size(pg) == 2);
    CHECK(cdf_device_mesh_new(pg, tu_cpu(), &mesh) == CDF_OK);
    static const lcase cases[] = {
        {"golden/flux1_dev", "lora/flux.safetensors", "flux_peft", NULL, 3e-4},
        {"golden/flux1_dev", "lora/flux.safetensors", "flux_kohya", NULL, 3e-4},
        {"golden/flux1_dev", "lora/flux.safetensors", "flux_xlabs", NULL, 3e-4},
        {"golden/flux1_dev", "lora/flux.safetensors", "flux_peft", "flux_second", 3e-4},
        {"golden/sd3", "lora/sd3.safetensors", "sd3_peft", NULL, 3e-4},
        {"golden/flux2_dev", "lora/flux2_dev.safetensors", "flux2_dev_peft", NULL, 1e-4},
        {"golden/flux2_dev", "lora/flux2_dev.safetensors", "flux2_dev_kohya", NULL, 1e-4},
    };
    for (size_t i = 0; mesh && i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], mesh);
    cdf_device_mesh_free(mesh);
    CHECK(cdf_dist_barrier(pg) == CDF_OK);
    cdf_dist_finalize(pg);
    if (failures_g == 0) printf("rank %d: lora tp ok\n", rank_g);
    return failures_g ? 1 : 0;
}

static void test_transformers_tp2_lora(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    run_self_as_two_ranks("lora_worker.txt", "lora tp ok");
}

/* ---- whole pipelines through the CLI ------------------------------------------------------------ */
#define GOLDEN_LATENT_TOL 5e-4 /* test_lora_pipeline's LAT_TOL (test_pipeline's) */

typedef struct pipe_case {
    const char *args;      /* the pipeline call of reference.json text_encoder_pipelines (CLI spelling) */
    const char *replicate; /* --tp-replicate: the T5 of the tiny pipelines has 3 heads */
    const char *lora;      /* --lora value, relative to tests/data/lora */
    const char *golden;    /* NULL, or lora/<file> with diffusers' "<key>.{runtime,fused}_s07.latents_final" */
    const char *key;
} pipe_case;

/* One process and 2 ranks with the same adapter in `mode`; returns |tp - one| on latents_final. */
static double pipeline_tp_vs_one(const pipe_case *pc, const char *mode, const char *tag) {
    char args[4096], one[1100], tp[1100], log[1100];
    snprintf(args, sizeof args, "%s --lora '%s/lora/%s' --lora-mode %s --threads 1 --quiet --dtype f32 --force", pc->args,
             CDF_TEST_DATA, pc->lora, mode);
    snprintf(one, sizeof one, "%s/%s_%s_one.safetensors", tu_tmpdir(), tag, mode);
    snprintf(tp, sizeof tp, "%s/%s_%s_tp.safetensors", tu_tmpdir(), tag, mode);
    snprintf(log, sizeof log, "%s/%s_%s.log", tu_tmpdir(), tag, mode);
    int rc = tu_system("'%s' generate %s --output '%s/%s_one.png' --latents-out '%s' 2> '%s'", CDF_CLI_PATH, args, tu_tmpdir(),
                       tag, one, log);
    char *l1 = tu_read_file(log, NULL);
    if (rc != 0) fail_msg("single-process run failed (%d): %s", rc, l1 ? l1 : "");
    free(l1);
    rc = tu_system(MPIRUN " -np 2%s '%s' generate %s --output '%s/%s_tp.png' --latents-out '%s' --tp 2 --tp-replicate %s 2> '%s'",
                   mpi_env(), CDF_CLI_PATH, args, tu_tmpdir(), tag, tp, pc->replicate, log);
    char *l2 = tu_read_file(log, NULL);
    if (rc != 0) fail_msg("2-rank run failed (%d): %s", rc, l2 ? l2 : "");
    free(l2);
    int64_t n1, n2;
    float *a = st_tensor(one, "latents_final", &n1), *b = st_tensor(tp, "latents_final", &n2);
    assert_int_equal(n1, n2);
    const double d = tu_max_abs_diff(a, b, (size_t)n1, NULL);
    double g = -1;
    if (pc->golden) {
        char gpath[1100], key[256];
        int64_t ng;
        snprintf(gpath, sizeof gpath, "%s/lora/%s", CDF_TEST_DATA, pc->golden);
        snprintf(key, sizeof key, "%s.%s_s07.latents_final", pc->key, strcmp(mode, "fuse") == 0 ? "fused" : "runtime");
        float *w = st_tensor(gpath, key, &ng);
        assert_int_equal(ng, n2);
        g = tu_max_abs_diff(b, w, (size_t)n2, NULL);
        free(w);
    }
    print_message("  %s, %s: latents_final |tp - one| = %.3g (tol %.0e)%s", tag, mode, d, TP_VS_SINGLE_TOL,
                  g >= 0 ? "" : "\n");
    if (g >= 0) print_message(", |tp - diffusers| = %.3g (tol %.0e)\n", g, GOLDEN_LATENT_TOL);
    assert_true(g <= GOLDEN_LATENT_TOL);
    free(a), free(b);
    return d;
}

#define FLUX_CALL                                                                                                      \
    "--model '" CDF_TEST_DATA "/pipelines/flux1_dev_tiny' --prompt 'A capybara wearing a tiny astronaut helmet, studio "   \
    "photo' --height 64 --width 64 --steps 3 --guidance 3.5 --max-sequence-length 64 --seed 1234"
#define SD3_CALL                                                                                                       \
    "--model '" CDF_TEST_DATA "/pipelines/sd35m_tiny' --prompt 'A capybara holding a sign that reads Hello World' "        \
    "--negative-prompt 'blurry, low quality, distorted' --height 64 --width 64 --steps 3 --guidance 4.5 "                \
    "--max-sequence-length 64 --seed 0"

static void run_pipe_case(const pipe_case *pc, const char *tag) {
    if (!have_mpi()) skip();
    assert_true(pipeline_tp_vs_one(pc, "runtime", tag) <= TP_VS_SINGLE_TOL);
    assert_true(pipeline_tp_vs_one(pc, "fuse", tag) <= TP_VS_SINGLE_TOL);
}

/* CLIP-L adapter (sharded text encoder) plus one transformer module, at 0.7: also diffusers' */
static void test_flux_pipeline_te_lora_tp2(void **state) {
    (void)state;
    const pipe_case pc = {FLUX_CALL, "text_encoder_2", "pipe_flux_te_peft.safetensors:0.7", "pipe_flux_te.safetensors",
                          "pipe_flux_te_peft"};
    run_pipe_case(&pc, "flux_te");
}

/* kohya transformer adapter at 0.8 (fused q/k/v and linear1 split over column-wise shards) */
static void test_flux_pipeline_transformer_lora_tp2(void **state) {
    (void)state;
    const pipe_case pc = {FLUX_CALL, "text_encoder_2", "pipe_flux1_dev_tiny_kohya.safetensors:0.8", NULL, NULL};
    run_pipe_case(&pc, "flux_kohya");
}

/* CLIP-L and CLIP-G adapters (both sharded) at 0.7: also diffusers' */
static void test_sd3_pipeline_te_lora_tp2(void **state) {
    (void)state;
    const pipe_case pc = {SD3_CALL, "text_encoder_3", "pipe_sd3_te_peft.safetensors:0.7", "pipe_sd3_te.safetensors",
                          "pipe_sd3_te_peft"};
    run_pipe_case(&pc, "sd3_te");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--mpi-worker") == 0) return mpi_worker();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_tp2_lora),
        cmocka_unit_test(test_flux_pipeline_te_lora_tp2),
        cmocka_unit_test(test_flux_pipeline_transformer_lora_tp2),
        cmocka_unit_test(test_sd3_pipeline_te_lora_tp2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
