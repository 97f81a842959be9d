/* Tensor parallelism over MPI (include/cdiffusers/dist.h, src/dist/, src/nn/sharded.c).
 *
 * In-process (no launcher): local / offline process groups; sharded loading of the tiny FLUX
 * transformer checked against slices of the full tensors read straight from the file, with the
 * exact bytes read; the non-divisible head-count error.
 *
 * Over MPI (2 ranks on loopback: mpirun --oversubscribe; skipped when the build has no MPI or
 * mpirun is missing):
 *   - this executable relaunched as 2 ranks checks the collectives (all-reduce, all-gather,
 *     broadcast, agreement) against values computed here;
 *   - `cdiffusers generate --tp 2` on the golden tiny FLUX.1-dev and SD3.5 pipelines: latents and
 *     image equal the single-process run (tolerance below) and diffusers' golden output (the
 *     pipeline tolerances of test_pipeline.c); rank 1 writes nothing; each rank's weight bytes
 *     read (CDIFFUSERS_LOG=io) equal the single-process bytes minus half of the sharded
 *     tensors' bytes, where the sharded tensors are picked from the checkpoints by this file's
 *     own reading of the plans (diffusers' FLUX _tp_plan; the same split for SD3 and CLIP);
 *     the same 2-rank runs compiled (--mode compile, fullgraph; FLUX.1 also with
 *     --compile-repeated-blocks): no graph break (the all-reduces are ops captured into the
 *     graphs), each graph compiled once per rank, latents equal the single process within the same
 *     tolerance, and the same collectives and bytes as the eager 2-rank run;
 *   (failures and launch mistakes: test_dist_failures.c)
 *
 * Tolerance TP vs single process: the row-wise layers sum partial products in a different
 * order, which moves float32 results by ~1e-7 relative per layer; 1e-4 on latents of magnitude
 * <= ~10 after 5-6 steps leaves room for that and nothing else (a wrong shard gives O(1)). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/dist.h"
#include "dist_test_common.h"
#include "nn/nn.h"

#define TP_VS_SINGLE_TOL 1e-4
#define GOLDEN_LATENT_TOL 5e-4

/* ---- shards of a GGUF file (a single file in place of the folder) ------------------------------- */
/* Q8_0 weights in diffusers' names: a colwise layer keeps its rows' blocks (and reads only them),
 * a rowwise one keeps its columns' blocks when its cut falls on a block boundary (128 inputs: 64
 * per rank, two blocks) and is decoded otherwise (96 inputs: 48 per rank); either way each rank's
 * slice equals the same slice of gguf-py's dequantization (cdf_ggml_dequantize), and a forward
 * of the colwise shard equals those rows of the whole layer's product (in-process); the rowwise
 * block shard's forward over two real ranks sums to the whole layer's (the MPI worker). */
static float *q8_blocks(int64_t rows, int64_t cols, uint32_t seed, uint8_t **blocks) {
    float *v = malloc(sizeof(float) * (size_t)(rows * cols));
    *blocks = malloc((size_t)(rows * cols / 32 * 34));
    if (!v || !*blocks) abort();
    for (int64_t i = 0; i < rows * cols; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((int)(seed >> 20) % 201 - 100) / 37.0f;
    }
    if (cdf_ggml_quantize(CDF_GGML_Q8_0, v, rows * cols, *blocks) != CDF_OK ||
        cdf_ggml_dequantize(CDF_GGML_Q8_0, *blocks, rows * cols, v) != CDF_OK) /* the reference values */
        abort();
    return v;
}

enum { OA = 6, IA = 128, OB = 4, IB = 128, OC = 4, IC = 96 };

/* Writes the test's GGUF (a: [OA, IA] Q8_0 + bias, b: [OB, IB], c: [OC, IC]) to path; v*: the
 * dequantized values of each weight (malloc'd), bias_a: a's bias [OA]. */
static bool write_shards_gguf(const char *path, float **va, float **vb, float **vc, float *bias_a) {
    uint8_t *ba, *bb, *bc;
    *va = q8_blocks(OA, IA, 1, &ba), *vb = q8_blocks(OB, IB, 2, &bb), *vc = q8_blocks(OC, IC, 3, &bc);
    for (int i = 0; i < OA; i++) bias_a[i] = (float)i - 2.5f;
    cdf_gguf_writer *gw = cdf_gguf_writer_new(0);
    const bool ok = gw && cdf_gguf_writer_add(gw, "a.weight", CDF_GGML_Q8_0, 2, (int64_t[]){OA, IA}, ba) == CDF_OK &&
                    cdf_gguf_writer_add(gw, "a.bias", CDF_GGML_F32, 1, (int64_t[]){OA}, bias_a) == CDF_OK &&
                    cdf_gguf_writer_add(gw, "b.weight", CDF_GGML_Q8_0, 2, (int64_t[]){OB, IB}, bb) == CDF_OK &&
                    cdf_gguf_writer_add(gw, "c.weight", CDF_GGML_Q8_0, 2, (int64_t[]){OC, IC}, bc) == CDF_OK &&
                    cdf_gguf_writer_save(gw, path, true, NULL, NULL) == CDF_OK;
    cdf_gguf_writer_free(gw);
    free(ba), free(bb), free(bc);
    return ok;
}

/* ---- MPI worker: this executable started as one rank of `mpirun -np 2 <self> --mpi-worker` ---- */
#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "rank %d: check failed at line %d: %s (%s)\n", rank, __LINE__, #cond, cdf_last_error()); \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

static int mpi_worker(void) {
    cdf_process_group *pg = NULL;
    if (cdf_dist_init("mpi", &pg) != CDF_OK) {
        fprintf(stderr, "worker: %s\n", cdf_last_error());
        return 1;
    }
    const int rank = cdf_dist_rank(pg), W = cdf_dist_world_size(pg);
    int failures = 0;
    cdf_device *dev = cdf_device_get("cpu");
    CHECK(dev && W == 2);
    cdf_scope_push();

    /* all-reduce of a tensor still being computed (the op is queued when the collective starts) */
    float x[6];
    for (int i = 0; i < 6; i++) x[i] = (float)(rank * 10 + i);
    cdf_tensor *t = cdf_add_scalar(cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){2, 3}, x, CDF_F32), 0.5f);
    CHECK(cdf_dist_all_reduce_sum(pg, t) == CDF_OK);
    float *y = cdf_tensor_read_f32(t);
    for (int i = 0; y && i < 6; i++) {
        double want = 0;
        for (int r = 0; r < W; r++) want += r * 10 + i + 0.5;
        CHECK(y[i] == (float)want);
    }
    free(y);

    /* i64 all-reduce */
    int64_t v[3] = {rank + 1, (int64_t)1 << 40, -rank};
    cdf_tensor *ti = cdf_tensor_from_host(dev, CDF_I64, 1, (int64_t[]){3}, v, CDF_I64);
    CHECK(cdf_dist_all_reduce_sum(pg, ti) == CDF_OK);
    int64_t vi[3] = {0};
    CHECK(cdf_tensor_read(ti, CDF_I64, vi, sizeof vi) == CDF_OK);
    CHECK(vi[0] == 3 && vi[1] == ((int64_t)1 << 41) && vi[2] == -1);

    /* all-gather along dim 1 and dim 0 of [2, 3]: element (a, b) of rank r is 100 r + 3 a + b */
    float g[6];
    for (int i = 0; i < 6; i++) g[i] = (float)(100 * rank + i);
    cdf_tensor *tg = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){2, 3}, g, CDF_F32);
    cdf_tensor *g1 = cdf_dist_all_gather(pg, tg, 1), *g0 = cdf_dist_all_gather(pg, tg, 0);
    CHECK(g1 && cdf_tensor_dim(g1, 0) == 2 && cdf_tensor_dim(g1, 1) == 6);
    CHECK(g0 && cdf_tensor_dim(g0, 0) == 4 && cdf_tensor_dim(g0, 1) == 3);
    float *h1 = cdf_tensor_read_f32(g1), *h0 = cdf_tensor_read_f32(g0);
    for (int a = 0; h1 && a < 2; a++)
        for (int c = 0; c < 6; c++) CHECK(h1[a * 6 + c] == (float)(100 * (c / 3) + 3 * a + c % 3));
    for (int a = 0; h0 && a < 4; a++)
        for (int b = 0; b < 3; b++) CHECK(h0[a * 3 + b] == (float)(100 * (a / 2) + 3 * (a % 2) + b));
    free(h1);
    free(h0);

    /* broadcast from rank 1 */
    float bsrc[4] = {(float)rank, 1.5f, -2.0f, (float)(7 * rank)};
    cdf_tensor *tb = cdf_tensor_from_host(dev, CDF_F32, 1, (int64_t[]){4}, bsrc, CDF_F32);
    CHECK(cdf_dist_broadcast(pg, tb, 1) == CDF_OK);
    float *hb = cdf_tensor_read_f32(tb);
    CHECK(hb && hb[0] == 1.0f && hb[1] == 1.5f && hb[2] == -2.0f && hb[3] == 7.0f);
    free(hb);

    /* a non-contiguous tensor is refused before any communication (on every rank alike) */
    CHECK(cdf_dist_all_reduce_sum(pg, cdf_transpose(t, 0, 1)) == CDF_ERR_INVALID_ARG);

    /* the all-reduce op: queued behind the op computing its input (the host does not wait), out
     * of place, any layout (a transposed view); its input is left as it was. The host collective
     * issued right after drains the queue first, so both ranks run the two in the same order
     * (MPI_THREAD_SERIALIZED: never two threads in MPI) */
    cdf_tensor *src = cdf_add_scalar(cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){2, 3}, x, CDF_F32), 0.25f);
    cdf_tensor *ro = cdf_all_reduce_sum(cdf_transpose(src, 0, 1), pg);
    CHECK(ro && cdf_tensor_dim(ro, 0) == 3 && cdf_tensor_dim(ro, 1) == 2);
    float bsrc0[2] = {(float)rank, 2.0f};
    cdf_tensor *tb0 = cdf_tensor_from_host(dev, CDF_F32, 1, (int64_t[]){2}, bsrc0, CDF_F32);
    CHECK(cdf_dist_broadcast(pg, tb0, 0) == CDF_OK);
    float *ho = cdf_tensor_read_f32(ro), *hs = cdf_tensor_read_f32(src), *hb0 = cdf_tensor_read_f32(tb0);
    for (int a = 0; ho && a < 3; a++)
        for (int b = 0; b < 2; b++) { /* ro[a][b] = sum_r src_r[b][a] */
            double want = 0;
            for (int r = 0; r < W; r++) want += r * 10 + (b * 3 + a) + 0.25;
            CHECK(ho[a * 2 + b] == (float)want);
        }
    for (int i = 0; hs && i < 6; i++) CHECK(hs[i] == (float)(rank * 10 + i) + 0.25f);
    CHECK(hb0 && hb0[0] == 0.0f && hb0[1] == 2.0f);
    free(ho), free(hs), free(hb0);
    /* a dtype MPI is not given is refused at the call, before anything is queued */
    CHECK(cdf_all_reduce_sum(cdf_cast(src, CDF_BF16), pg) == NULL && cdf_last_status() == CDF_ERR_DTYPE);

    /* agreement: all fine, then rank 1 reports a failure that every rank learns */
    CHECK(cdf_dist_agree(pg, CDF_OK) == CDF_OK);
    cdf_status mine = CDF_OK;
    if (rank == 1) mine = cdf_dist_all_reduce_sum(NULL, t); /* sets a real error: process group is NULL */
    cdf_status agreed = cdf_dist_agree(pg, mine);
    CHECK(agreed == CDF_ERR_INVALID_ARG);
    CHECK(strstr(cdf_last_error(), "rank 1 of 2 failed: all-reduce: process group is NULL") != NULL);

    cdf_dist_stats st;
    cdf_dist_get_stats(pg, &st);
    /* 2 host all-reduces, 1 all-reduce op, 2 all-gathers, 2 broadcasts, 2 agreements */
    CHECK(st.collectives == 9);
    /* + the two agreements' status messages */
    const uint64_t tensor_bytes = 6 * 4 + 3 * 8 + 6 * 4 + 2 * 6 * 4 + 4 * 4 + 2 * 4;
    CHECK(st.bytes > tensor_bytes && st.bytes < tensor_bytes + 4096);

    /* a GGUF layer split by input columns with its Q8_0 blocks kept (64 columns a rank): each
     * rank's partial product of the decoded blocks, summed by the forward's all-reduce, is the
     * whole layer's product of gguf-py's values */
    {
        static const cdf_tp_rule plan[] = {{"b", CDF_TP_ROWWISE}, {NULL, CDF_TP_REPLICATE}};
        char path[1100];
        snprintf(path, sizeof path, "%s/worker_q8_rank%d.gguf", tu_tmpdir(), rank);
        float *va, *vb, *vc, bias_a[OA], xb[IB];
        CHECK(write_shards_gguf(path, &va, &vb, &vc, bias_a));
        cdf_tp *tp = NULL;
        cdf_weights *w = NULL;
        cdf_load_options o = cdf_load_options_default();
        o.device = dev;
        o.weights_file = path;
        CHECK(cdf_tp_new(pg, "transformer", "test plan", plan, &tp) == CDF_OK);
        CHECK(cdf_weights_open(tu_tmpdir(), &o, &w) == CDF_OK);
        cdf_linear_layer l;
        CHECK(cdf_tp_linear_load(w, tp, &l, IB, OB, 0, "b") == CDF_OK);
        CHECK(l.qtype == CDF_GGML_Q8_0 && l.in == IB / 2);
        for (int k = 0; k < IB; k++) xb[k] = (float)(k % 5) - 2.0f;
        cdf_tensor *xs = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){1, IB / 2}, xb + rank * IB / 2, CDF_F32);
        float *yb = cdf_tensor_read_f32(cdf_linear_fwd(&l, xs));
        CHECK(yb != NULL);
        for (int r = 0; yb && r < OB; r++) {
            double ref = 0;
            for (int k = 0; k < IB; k++) ref += (double)vb[r * IB + k] * xb[k];
            CHECK(fabs(yb[r] - ref) <= 1e-4 * (1 + fabs(ref)));
        }
        free(yb);
        cdf_linear_free(&l);
        cdf_weights_free(w);
        cdf_tp_free(tp);
        free(va), free(vb), free(vc);
    }
    cdf_scope_pop(NULL, 0);
    CHECK(cdf_dist_barrier(pg) == CDF_OK);
    cdf_dist_finalize(pg);
    if (failures == 0) printf("rank %d: collectives ok\n", rank);
    return failures ? 1 : 0;
}

static void test_collectives_over_mpi(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    run_self_as_two_ranks("worker.txt", "collectives ok");
}

/* ---- in-process: local and offline groups --------------------------------------------------- */
static void test_local_and_offline_groups(void **state) {
    (void)state;
    cdf_process_group *pg = NULL;
    assert_int_equal(cdf_dist_init("nccl", &pg), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "nccl"));
    assert_int_equal(cdf_dist_init("local", &pg), CDF_OK);
    assert_int_equal(cdf_dist_rank(pg), 0);
    assert_int_equal(cdf_dist_world_size(pg), 1);
    cdf_device *dev = tu_cpu();
    cdf_scope_push();
    float x[3] = {1, 2, 3};
    cdf_tensor *t = cdf_tensor_from_host(dev, CDF_F32, 1, (int64_t[]){3}, x, CDF_F32);
    assert_int_equal(cdf_dist_all_reduce_sum(pg, t), CDF_OK); /* a group of one: the sum is t itself */
    float *y = cdf_tensor_read_f32(t);
    assert_true(y[0] == 1 && y[1] == 2 && y[2] == 3);
    free(y);
    cdf_tensor *g = cdf_dist_all_gather(pg, t, 0);
    assert_non_null(g);
    assert_int_equal(cdf_tensor_dim(g, 0), 3);
    cdf_tensor *ro = cdf_all_reduce_sum(t, pg); /* the op over a group of one: t's values */
    float *yo = cdf_tensor_read_f32(ro);
    assert_true(yo && yo[0] == 1 && yo[1] == 2 && yo[2] == 3);
    free(yo);
    assert_int_equal(cdf_dist_agree(pg, CDF_ERR_IO), CDF_ERR_IO);
    cdf_dist_finalize(pg);

    /* offline: knows rank and size, refuses to communicate */
    assert_int_equal(cdf_dist_init_offline(2, 2, &pg), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_dist_init_offline(1, 2, &pg), CDF_OK);
    assert_int_equal(cdf_dist_rank(pg), 1);
    assert_int_equal(cdf_dist_all_reduce_sum(pg, t), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "offline"));
    assert_null(cdf_dist_all_gather(pg, t, 0));
    assert_null(cdf_all_reduce_sum(t, pg)); /* refused at the call, nothing queued */
    assert_int_equal(cdf_last_status(), CDF_ERR_UNSUPPORTED);
    cdf_dist_finalize(pg);
    cdf_scope_pop(NULL, 0);
}

/* ---- in-process: sharded loading against the file ---------------------------------------------- */
/* The full tensor `name` of the tiny FLUX transformer as f32 (from the mapping, uncounted). */
static float *full_tensor(cdf_checkpoint *ck, const char *name, int64_t *rows, int64_t *cols) {
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    assert_int_equal(cdf_checkpoint_find(ck, name, &f, &t), CDF_OK);
    *rows = t->shape[0];
    *cols = t->ndim == 2 ? t->shape[1] : 1;
    float *p = malloc((size_t)cdf_st_numel(t) * sizeof *p);
    cdf_convert(p, CDF_F32, cdf_st_data(f, t), t->dtype, (size_t)cdf_st_numel(t));
    return p;
}

static void expect_block(const float *got, int64_t got_cols, const float *full, int64_t full_cols, int64_t rows, int64_t ncols,
                         int64_t src_col0, int64_t dst_col0, int64_t src_row0) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ncols; c++)
            if (got[r * got_cols + dst_col0 + c] != full[(src_row0 + r) * full_cols + src_col0 + c])
                fail_msg("element (%lld, %lld) differs from the file", (long long)r, (long long)(dst_col0 + c));
}

static void test_shard_gguf_blocks(void **state) {
    (void)state;
    float *va, *vb, *vc, bias_a[OA];
    const char *path = tu_tmp_path("shards_q8.gguf");
    assert_true(write_shards_gguf(path, &va, &vb, &vc, bias_a));
    static const cdf_tp_rule plan[] = {{"a", CDF_TP_COLWISE}, {"b", CDF_TP_ROWWISE}, {"c", CDF_TP_ROWWISE}, {NULL, CDF_TP_REPLICATE}};
    for (int rank = 0; rank < 2; rank++) {
        cdf_process_group *pg;
        cdf_tp *tp;
        cdf_weights *w;
        offline_tp(rank, plan, &pg, &tp);
        cdf_load_options o = cdf_load_options_default();
        o.device = tu_cpu();
        o.weights_file = path;
        assert_int_equal(cdf_weights_open(tu_tmpdir(), &o, &w), CDF_OK);
        cdf_linear_layer l;

        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load(w, tp, &l, IA, OA, 1, "a"), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), (OA / 2) * (IA / 32 * 34) + (OA / 2) * 4); /* its rows' blocks and bias */
        assert_int_equal(l.qtype, CDF_GGML_Q8_0);
        assert_int_equal(l.out, OA / 2);
        cdf_scope_push();
        float x[IA];
        for (int k = 0; k < IA; k++) x[k] = (float)(k % 7) - 3.0f;
        cdf_tensor *xt = cdf_tensor_from_host(tu_cpu(), CDF_F32, 2, (int64_t[]){1, IA}, x, CDF_F32);
        float *y = cdf_tensor_read_f32(cdf_linear_fwd(&l, xt));
        assert_non_null(y);
        for (int r = 0; r < OA / 2; r++) {
            const int row = rank * OA / 2 + r;
            double ref = bias_a[row];
            for (int k = 0; k < IA; k++) ref += (double)va[row * IA + k] * x[k];
            assert_float_equal(y[r], ref, 1e-4 * (1 + fabs(ref)));
        }
        free(y);
        cdf_scope_pop(NULL, 0);
        cdf_linear_free(&l);

        assert_int_equal(cdf_tp_linear_load(w, tp, &l, IB, OB, 0, "b"), CDF_OK);
        assert_int_equal(l.qtype, CDF_GGML_Q8_0); /* 64 columns a rank: whole blocks */
        assert_int_equal(l.in, IB / 2);
        assert_int_equal(cdf_linear_decode(&l), CDF_OK);
        float *g = cdf_tensor_read_f32(l.w);
        expect_block(g, IB / 2, vb, IB, OB, IB / 2, rank * IB / 2, 0, 0);
        free(g);
        cdf_linear_free(&l);

        assert_int_equal(cdf_tp_linear_load(w, tp, &l, IC, OC, 0, "c"), CDF_OK);
        assert_int_equal(l.qtype, 0); /* 48 columns a rank cut blocks: decoded */
        g = cdf_tensor_read_f32(l.w);
        expect_block(g, IC / 2, vc, IC, OC, IC / 2, rank * IC / 2, 0, 0);
        free(g);
        cdf_linear_free(&l);
        cdf_weights_free(w);
        cdf_tp_free(tp);
        cdf_dist_finalize(pg);
    }
    free(va), free(vb), free(vc);
}

/* A folder's "fp8_scaled" weight (tests/data/formats/fp8_scaled: lin.weight [8, 16] F8_E4M3 with
 * lin.scale_weight) sharded both ways: each rank's slice equals that slice of the whole layer as
 * a single process loads it (weight.to(f32) * scale_weight, checked against torch in
 * test_formats_fp8). */
static void test_shard_fp8_scaled(void **state) {
    (void)state;
    static const cdf_tp_rule cols[] = {{"lin", CDF_TP_COLWISE}, {NULL, CDF_TP_REPLICATE}};
    static const cdf_tp_rule rows[] = {{"lin", CDF_TP_ROWWISE}, {NULL, CDF_TP_REPLICATE}};
    const char *dir = tu_data("formats/fp8_scaled");
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    cdf_weights *w;
    assert_int_equal(cdf_weights_open(dir, &o, &w), CDF_OK);
    cdf_linear_layer whole;
    assert_int_equal(cdf_linear_load(w, &whole, 16, 8, 1, "lin"), CDF_OK);
    float *ref = cdf_tensor_read_f32(whole.w);
    cdf_linear_free(&whole);
    cdf_weights_free(w);
    for (int rank = 0; rank < 2; rank++)
        for (int k = 0; k < 2; k++) {
            cdf_process_group *pg;
            cdf_tp *tp;
            offline_tp(rank, k ? rows : cols, &pg, &tp);
            assert_int_equal(cdf_weights_open(dir, &o, &w), CDF_OK);
            cdf_linear_layer l;
            assert_int_equal(cdf_tp_linear_load(w, tp, &l, 16, 8, 1, "lin"), CDF_OK);
            float *g = cdf_tensor_read_f32(l.w);
            if (k) expect_block(g, 8, ref, 16, 8, 8, rank * 8, 0, 0); /* columns rank*8.. */
            else expect_block(g, 16, ref, 16, 4, 16, 0, 0, rank * 4); /* rows rank*4.. */
            free(g);
            cdf_linear_free(&l);
            cdf_weights_free(w);
            cdf_tp_free(tp);
            cdf_dist_finalize(pg);
        }
    free(ref);
}

static void test_shard_slices_and_bytes(void **state) {
    (void)state;
    const char *dir = tu_data("pipelines/flux1_dev_tiny/transformer");
    static const cdf_tp_rule plan[] = {
        {"transformer_blocks.*.attn.to_q", CDF_TP_COLWISE},
        {"transformer_blocks.*.attn.to_out.0", CDF_TP_ROWWISE},
        {"single_transformer_blocks.*.proj_out", CDF_TP_PACKED_ROWWISE},
        {NULL, CDF_TP_REPLICATE},
    };
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    int64_t qr, qc, br, bc, orr, oc, pr, pc, ob_r, ob_c;
    float *q = full_tensor(ck, "transformer_blocks.1.attn.to_q.weight", &qr, &qc);
    float *qb = full_tensor(ck, "transformer_blocks.1.attn.to_q.bias", &br, &bc);
    float *o = full_tensor(ck, "transformer_blocks.0.attn.to_out.0.weight", &orr, &oc);
    float *ob = full_tensor(ck, "transformer_blocks.0.attn.to_out.0.bias", &ob_r, &ob_c);
    float *p = full_tensor(ck, "single_transformer_blocks.1.proj_out.weight", &pr, &pc);
    const int64_t D = qr, M = pc - D; /* proj_out: [D, D + M] */
    for (int rank = 0; rank < 2; rank++) {
        cdf_process_group *pg;
        cdf_tp *tp;
        cdf_weights *w;
        offline_tp(rank, plan, &pg, &tp);
        assert_int_equal(cdf_tp_style_for(tp, "transformer_blocks.7.attn.to_q"), CDF_TP_COLWISE);
        assert_int_equal(cdf_tp_style_for(tp, "transformer_blocks.attn.to_q"), CDF_TP_REPLICATE); /* '*' is one component */
        assert_int_equal(cdf_tp_style_for(tp, "x.transformer_blocks.7.attn.to_q"), CDF_TP_REPLICATE);
        assert_int_equal(cdf_weights_open(dir, NULL, &w), CDF_OK);
        cdf_linear_layer l;

        /* colwise: rows rank*D/2.., bias likewise; exactly those bytes read */
        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load(w, tp, &l, D, D, 1, "transformer_blocks.%d.attn.to_q", 1), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), (D / 2) * (D + 1) * 4);
        assert_int_equal(l.out, D / 2);
        assert_null(l.tp);
        float *gw = cdf_tensor_read_f32(l.w), *gb = cdf_tensor_read_f32(l.b);
        assert_int_equal(cdf_tensor_dim(l.w, 0), D / 2);
        expect_block(gw, D, q, D, D / 2, D, 0, 0, rank * D / 2);
        expect_block(gb, 1, qb, 1, D / 2, 1, 0, 0, rank * D / 2);
        free(gw);
        free(gb);
        cdf_linear_free(&l);

        /* rowwise: columns rank*D/2.., whole bias; the layer all-reduces in its forward */
        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load(w, tp, &l, D, D, 1, "transformer_blocks.0.attn.to_out.0"), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), D * (D / 2) * 4 + D * 4);
        assert_int_equal(l.in, D / 2);
        assert_ptr_equal(l.tp, tp);
        gw = cdf_tensor_read_f32(l.w);
        gb = cdf_tensor_read_f32(l.b);
        expect_block(gw, D / 2, o, D, D, D / 2, rank * D / 2, 0, 0);
        expect_block(gb, 1, ob, 1, D, 1, 0, 0, 0);
        free(gw);
        free(gb);
        /* its forward needs the other rank: an offline group cannot, and says so */
        cdf_scope_push();
        cdf_tensor *x = cdf_tensor_zeros(cdf_tensor_device(l.w), CDF_F32, 2, (int64_t[]){1, D / 2});
        assert_null(cdf_linear_fwd(&l, x));
        assert_non_null(strstr(cdf_last_error(), "offline"));
        cdf_scope_pop(NULL, 0);
        cdf_linear_free(&l);

        /* packed rowwise over [attention D, MLP M]: columns rank*D/2.. and D + rank*M/2.. */
        cdf_io_reset_counters();
        const int64_t parts[2] = {D, M};
        assert_int_equal(cdf_tp_linear_load_packed(w, tp, &l, 2, parts, D, 1, "single_transformer_blocks.1.proj_out"), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), D * ((D + M) / 2) * 4 + D * 4);
        assert_int_equal(l.in, (D + M) / 2);
        gw = cdf_tensor_read_f32(l.w);
        expect_block(gw, (D + M) / 2, p, D + M, D, D / 2, rank * D / 2, 0, 0);
        expect_block(gw, (D + M) / 2, p, D + M, D, M / 2, D + rank * M / 2, D / 2, 0);
        free(gw);
        cdf_linear_free(&l);

        /* a layer the plan does not name is read whole */
        cdf_io_reset_counters();
        assert_int_equal(cdf_tp_linear_load(w, tp, &l, D, D, 1, "transformer_blocks.0.attn.to_k"), CDF_OK);
        assert_int_equal(cdf_io_bytes_read(), D * (D + 1) * 4);
        assert_int_equal(l.out, D);
        cdf_linear_free(&l);

        /* a plan rule that never matched is reported (the packed rule matched; check the others) */
        assert_int_equal(cdf_tp_check_plan_used(tp), CDF_OK);
        assert_int_equal(cdf_tp_check_divisible(tp, "num_attention_heads", 3), CDF_ERR_UNSUPPORTED);
        assert_non_null(strstr(cdf_last_error(), "num_attention_heads = 3, which is not divisible by 2"));
        cdf_weights_free(w);
        cdf_tp_free(tp);
        cdf_dist_finalize(pg);
    }
    free(q);
    free(qb);
    free(o);
    free(ob);
    free(p);
    cdf_checkpoint_close(ck);
}

/* ---- the test's own reading of the plans: which checkpoint tensors are halved per rank ---------- */
/* Bytes of `name` (nbytes) that a rank of 2 does NOT read, under the FLUX / SD3 / CLIP / T5
 * plans: half of every column-wise weight and bias and of every row-wise weight (row-wise biases
 * are read whole), for layers inside the repeated blocks. */
static uint64_t bytes_saved_per_rank(const char *name, uint64_t nbytes) {
    static const char *const blocks[] = {"transformer_blocks.", "single_transformer_blocks.", "text_model.encoder.layers.",
                                         "encoder.block."};
    bool in_block = false;
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) in_block |= strncmp(name, blocks[i], strlen(blocks[i])) == 0;
    if (!in_block) return 0;
    static const char *const colwise[] = {".to_q", ".to_k", ".to_v", ".add_q_proj", ".add_k_proj", ".add_v_proj",
                                          ".ff.net.0.proj", ".ff_context.net.0.proj", ".proj_mlp", ".q_proj", ".k_proj",
                                          ".v_proj", ".mlp.fc1", "SelfAttention.q", "SelfAttention.k",
                                          "SelfAttention.v", "DenseReluDense.wi", "DenseReluDense.wi_0", "DenseReluDense.wi_1",
                                          "SelfAttention.relative_attention_bias"}; /* T5's bias table: its heads' columns */
    static const char *const rowwise[] = {".to_out.0", ".to_add_out", ".ff.net.2", ".ff_context.net.2", ".proj_out",
                                          ".out_proj", ".mlp.fc2", "SelfAttention.o", "DenseReluDense.wo"};
    char module[512];
    snprintf(module, sizeof module, "%s", name);
    char *dot = strrchr(module, '.');
    if (!dot) return 0;
    const bool is_weight = strcmp(dot, ".weight") == 0, is_bias = strcmp(dot, ".bias") == 0;
    *dot = '\0';
    for (size_t i = 0; i < sizeof colwise / sizeof *colwise; i++)
        if (ends_with(module, colwise[i]) && (is_weight || is_bias)) return nbytes / 2;
    for (size_t i = 0; i < sizeof rowwise / sizeof *rowwise; i++)
        if (ends_with(module, rowwise[i]) && is_weight) return nbytes / 2;
    return 0;
}

static uint64_t saved_in_component(const char *pipeline_dir, const char *component, uint64_t *component_bytes) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", pipeline_dir, component);
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    uint64_t saved = 0, total = 0;
    for (int i = 0; i < cdf_checkpoint_count(ck); i++) {
        const cdf_st_file *f;
        const cdf_st_tensor *t;
        assert_int_equal(cdf_checkpoint_tensor_at(ck, i, &f, &t), CDF_OK);
        saved += bytes_saved_per_rank(t->name, t->nbytes);
        total += t->nbytes;
    }
    cdf_checkpoint_close(ck);
    if (component_bytes) *component_bytes = total;
    return saved;
}

/* ---- in-process: component loading with the process-wide switch (offline mesh) ------------------ */
static void test_component_sharding_offline(void **state) {
    (void)state;
    const char *pipe = tu_data("pipelines/flux1_dev_tiny");
    char dir[1200];
    cdf_process_group *pg;
    cdf_device_mesh *mesh;
    assert_int_equal(cdf_dist_init_offline(1, 2, &pg), CDF_OK);
    assert_int_equal(cdf_device_mesh_new(pg, tu_cpu(), &mesh), CDF_OK);
    assert_int_equal(cdf_device_mesh_size(mesh), 2);
    assert_int_equal(cdf_device_mesh_rank(mesh), 1);

    /* whole: the bytes of every tensor the model uses */
    snprintf(dir, sizeof dir, "%s/transformer", pipe);
    cdf_io_reset_counters();
    cdf_component *c = tu_load_component(dir, CDF_F32);
    const uint64_t whole = cdf_io_bytes_read();
    cdf_component_free(c);

    assert_int_equal(cdf_tp_enable(mesh, "vae,text_encoder_2"), CDF_OK);
    assert_ptr_equal(cdf_tp_mesh(), mesh);
    cdf_io_reset_counters();
    c = tu_load_component(dir, CDF_F32);
    const uint64_t sharded = cdf_io_bytes_read();
    cdf_component_free(c);
    uint64_t file_bytes;
    const uint64_t saved = saved_in_component(pipe, "transformer", &file_bytes);
    print_message("  transformer: whole %llu bytes, rank 1 of 2 reads %llu (%llu of %llu file bytes are in sharded tensors)\n",
                  (unsigned long long)whole, (unsigned long long)sharded, (unsigned long long)(2 * saved),
                  (unsigned long long)file_bytes);
    assert_true(2 * saved > file_bytes / 2); /* the plan covers most of the model: the check means something */
    assert_int_equal(sharded, whole - saved);

    /* T5 has 3 heads: named error... unless the component is replicated (it is, above) */
    snprintf(dir, sizeof dir, "%s/text_encoder_2", pipe);
    cdf_component *t5 = NULL;
    cdf_load_options opt = cdf_load_options_default();
    opt.device = tu_cpu();
    assert_int_equal(cdf_component_load(dir, &opt, &t5), CDF_OK);
    cdf_component_free(t5);
    assert_int_equal(cdf_tp_enable(mesh, NULL), CDF_OK);
    assert_int_equal(cdf_component_load(dir, &opt, &t5), CDF_ERR_UNSUPPORTED);
    print_message("  %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "text_encoder_2 (T5EncoderModel) has num_heads = 3, which is not divisible by 2"));
    assert_null(t5);
    cdf_tp_disable();
    assert_null(cdf_tp_mesh());
    cdf_device_mesh_free(mesh);
    cdf_dist_finalize(pg);
}

/* ---- end to end: cdiffusers generate --tp 2 vs one process vs the golden output --------------- */
/* Latents: the same initial latents (noise, or the unsharded VAE encode); final within the TP
 * tolerance of one process and within the golden tolerance of diffusers. */
static void expect_tp_latents(const char *one_lat, const char *tp_lat, const char *golden) {
    int64_t n1, n2, ng;
    float *i1 = st_tensor(one_lat, "latents_initial", &n1), *i2 = st_tensor(tp_lat, "latents_initial", &n2);
    assert_int_equal(n1, n2);
    assert_true(tu_max_abs_diff(i1, i2, (size_t)n1, NULL) == 0);
    float *f1 = st_tensor(one_lat, "latents_final", &n1), *f2 = st_tensor(tp_lat, "latents_final", &n2);
    float *fg = st_tensor(golden, "latents_final", &ng);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, ng);
    const double d_tp = tu_max_abs_diff(f1, f2, (size_t)n1, NULL), d_gold = tu_max_abs_diff(f2, fg, (size_t)n1, NULL);
    print_message("  latents_final: |tp - one| = %.3g (tol %.0e), |tp - diffusers| = %.3g (tol %.0e)\n", d_tp, TP_VS_SINGLE_TOL,
                  d_gold, GOLDEN_LATENT_TOL);
    assert_true(d_tp <= TP_VS_SINGLE_TOL);
    assert_true(d_gold <= GOLDEN_LATENT_TOL);
    free(i1), free(i2), free(f1), free(f2), free(fg);
}

/* A compiled mode to run the 2-rank case in as well (see run_tp_compiled): CLI arguments and the
 * graphs it must compile once per rank without a graph break. */
typedef struct tp_mode {
    const char *args;
    const char *compiled[3];
} tp_mode;

static void run_tp_case(const char *pipeline, const char *case_name, const char *replicate, const char *const *sharded_components,
                        const tp_mode *modes, int n_modes) {
    char pipe[1024], args[4096];
    snprintf(pipe, sizeof pipe, "%s", tu_data("pipelines"));
    snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), "/%s", pipeline);
    int steps;
    case_args(pipe, case_name, args, sizeof args, &steps);
    char tag[64];
    snprintf(tag, sizeof tag, "%s", pipeline);
    char one_png[1100], one_lat[1100], one_log[1100], tp_png[1100], tp_lat[1100], r1_png[1100], r1_lat[1100], tp_log[1100];
    snprintf(one_png, sizeof one_png, "%s/%s_one.png", tu_tmpdir(), tag);
    snprintf(one_lat, sizeof one_lat, "%s/%s_one.safetensors", tu_tmpdir(), tag);
    snprintf(one_log, sizeof one_log, "%s/%s_one.log", tu_tmpdir(), tag);
    snprintf(tp_png, sizeof tp_png, "%s/%s_tp.png", tu_tmpdir(), tag);
    snprintf(tp_lat, sizeof tp_lat, "%s/%s_tp.safetensors", tu_tmpdir(), tag);
    snprintf(r1_png, sizeof r1_png, "%s/%s_rank1.png", tu_tmpdir(), tag);
    snprintf(r1_lat, sizeof r1_lat, "%s/%s_rank1.safetensors", tu_tmpdir(), tag);
    snprintf(tp_log, sizeof tp_log, "%s/%s_tp.log", tu_tmpdir(), tag);

    double t0 = now_s();
    int rc = tu_system("CDIFFUSERS_LOG=io '%s' generate %s --output '%s' --latents-out '%s' 2> '%s'", CDF_CLI_PATH, args, one_png,
                       one_lat, one_log);
    double t1 = now_s();
    char *log1 = tu_read_file(one_log, NULL);
    if (rc != 0) fail_msg("single-process run failed (%d): %s", rc, log1 ? log1 : "");
    /* MPMD: rank 1 is given its own output names, so that "writes nothing" can be seen */
    rc = tu_system(MPIRUN " -np 1%s -x CDIFFUSERS_LOG=io '%s' generate %s --output '%s' --latents-out '%s' --tp 2 --tp-replicate %s"
                   " : -np 1%s -x CDIFFUSERS_LOG=io '%s' generate %s --output '%s' --latents-out '%s' --tp 2 --tp-replicate %s 2> '%s'",
                   mpi_env(), CDF_CLI_PATH, args, tp_png, tp_lat, replicate, mpi_env(), CDF_CLI_PATH, args, r1_png, r1_lat,
                   replicate, tp_log);
    double t2 = now_s();
    char *log2 = tu_read_file(tp_log, NULL);
    if (rc != 0) fail_msg("2-rank run failed (%d): %s", rc, log2 ? log2 : "");
    print_message("  %s/%s: 1 process %.2f s, 2 ranks %.2f s (including MPI start-up)\n", pipeline, case_name, t1 - t0, t2 - t1);

    /* rank 0 wrote, rank 1 did not */
    assert_int_equal(access(tp_png, F_OK), 0);
    assert_int_equal(access(tp_lat, F_OK), 0);
    assert_int_not_equal(access(r1_png, F_OK), 0);
    assert_int_not_equal(access(r1_lat, F_OK), 0);

    char golden[1200];
    snprintf(golden, sizeof golden, "%s/cases/%s/expected.safetensors", pipe, case_name);
    expect_tp_latents(one_lat, tp_lat, golden);

    /* image: at most one level from the single-process image and from diffusers' */
    cdf_png_image a, b;
    assert_int_equal(cdf_png_read(one_png, &a), CDF_OK);
    assert_int_equal(cdf_png_read(tp_png, &b), CDF_OK);
    assert_int_equal(a.width * a.height * a.channels, b.width * b.height * b.channels);
    const size_t npx = (size_t)a.width * a.height * a.channels;
    cdf_st_file *gf;
    assert_int_equal(cdf_st_open(golden, &gf), CDF_OK);
    const cdf_st_tensor *u8 = cdf_st_find(gf, "image_uint8");
    assert_non_null(u8);
    assert_int_equal(cdf_st_numel(u8), (int64_t)npx);
    const int lv_tp = max_level_diff(a.pixels, b.pixels, npx), lv_gold = max_level_diff(cdf_st_data(gf, u8), b.pixels, npx);
    print_message("  image: max level difference tp vs one %d, tp vs diffusers %d\n", lv_tp, lv_gold);
    assert_true(lv_tp <= 1 && lv_gold <= 1);
    cdf_st_close(gf);
    cdf_png_image_free(&a);
    cdf_png_image_free(&b);

    /* bytes read from weight files: each rank reads everything the single process reads, minus
     * half of every sharded tensor (the test's own list, see bytes_saved_per_rank) */
    io_line one[1] = {{0}}, tp[2] = {{0}, {0}};
    assert_int_equal(parse_io(log1, one, 1), 1);
    assert_int_equal(parse_io(log2, tp, 2), 2);
    uint64_t saved = 0;
    for (const char *const *c = sharded_components; *c; c++) saved += saved_in_component(pipe, *c, NULL);
    for (int r = 0; r < 2; r++) {
        print_message("  rank %d: read %llu weight bytes (one process %llu, expected %llu), peak %llu B (one process %llu B), "
                      "%llu collectives, %llu bytes all-reduced\n",
                      r, tp[r].weight_bytes, one[0].weight_bytes, (unsigned long long)(one[0].weight_bytes - saved),
                      tp[r].peak_bytes, one[0].peak_bytes, tp[r].collectives, tp[r].comm_bytes);
        assert_int_equal(tp[r].world, 2);
        assert_int_equal(tp[r].weight_bytes, one[0].weight_bytes - saved);
        assert_true(tp[r].peak_bytes < one[0].peak_bytes);
        assert_true(tp[r].collectives > (unsigned long long)steps); /* at least one all-reduce per block per step */
    }
    assert_int_equal(tp[0].collectives, tp[1].collectives);
    assert_true(saved > 0);

    /* the same 2-rank run compiled (fullgraph, or repeated blocks): the all-reduces are captured
     * into the graphs; the result equals the single process within the TP tolerance and every
     * rank runs and sends exactly the collectives of the eager run */
    for (int m = 0; m < n_modes; m++) {
        char mpng[1100], mlat[1100], margs[4400];
        snprintf(mpng, sizeof mpng, "%s/%s_tp_mode%d.png", tu_tmpdir(), tag, m);
        snprintf(mlat, sizeof mlat, "%s/%s_tp_mode%d.safetensors", tu_tmpdir(), tag, m);
        snprintf(margs, sizeof margs, "%s --tp-replicate %s", args, replicate);
        char *log3 = run_tp_compiled(margs, modes[m].args, mpng, mlat, modes[m].compiled);
        expect_compiled_tp_matches(log3, mlat, one_lat, tp, TP_VS_SINGLE_TOL, modes[m].args);
    }
    free(log1);
    free(log2);
}

static void test_flux_tp2_equals_single_process(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    /* T5 of the tiny pipeline has 3 heads: kept whole (test_failures shows the error otherwise) */
    static const char *const sharded[] = {"transformer", "text_encoder", NULL};
    static const tp_mode modes[] = {
        {"--mode compile", {"FluxTransformer2DModel.forward", NULL}},
        {"--compile-repeated-blocks", {"FluxTransformerBlock", "FluxSingleTransformerBlock", NULL}},
    };
    run_tp_case("flux1_dev_tiny", "64x64", "text_encoder_2", sharded, modes, 2);
}

static void test_sd3_tp2_equals_single_process(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    static const char *const sharded[] = {"transformer", "text_encoder", "text_encoder_2", NULL};
    static const tp_mode modes[] = {{"--mode compile", {"SD3Transformer2DModel.forward", NULL}}};
    run_tp_case("sd35m_tiny", "64x64_neg", "text_encoder_3", sharded, modes, 1);
}

/* Quantized weights over 2 ranks: the tiny FLUX.1 pipeline with its transformer from a GGUF file
 * of mixed block types in BFL names (tests/data/formats/flux_single/flux_bfl_q8.gguf), eager and
 * compiled, and the folder quantized at load (--weight-type q8_0): 2 ranks equal one process
 * with the same weights (a colwise shard holds its rows' blocks; the tiny model's rowwise cuts
 * fall inside blocks, so those shards hold the decoded values of the whole layer's blocks), and
 * each rank of the GGUF runs reads fewer weight bytes than the one process. */
static void test_quantized_tp2_equals_single_process(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    static const struct {
        bool gguf;
        const char *extra;
    } runs[] = {{true, ""}, {true, "--mode compile"}, {false, "--weight-type q8_0"}};
    char one_lat[1100], tp_lat[1100], log_one[1100], log_tp[1100];
    snprintf(one_lat, sizeof one_lat, "%s", tu_tmp_path("quant_one.safetensors"));
    snprintf(tp_lat, sizeof tp_lat, "%s", tu_tmp_path("quant_tp.safetensors"));
    snprintf(log_one, sizeof log_one, "%s", tu_tmp_path("quant_one.log"));
    snprintf(log_tp, sizeof log_tp, "%s", tu_tmp_path("quant_tp.log"));
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        char args[3000];
        snprintf(args, sizeof args,
                 "--model '%s' %s%s%s --prompt 'a red square' --height 64 --width 64 --steps 2 --seed 3 --threads 1 "
                 "--quiet --dtype f32 --force --output '%s' %s",
                 tu_data("pipelines/flux1_dev_tiny"), runs[k].gguf ? "--transformer '" : "",
                 runs[k].gguf ? tu_data("formats/flux_single/flux_bfl_q8.gguf") : "", runs[k].gguf ? "'" : "",
                 tu_tmp_path("quant_tp.png"), runs[k].extra);
        assert_int_equal(tu_system("CDIFFUSERS_LOG=io '%s' generate %s --latents-out '%s' 2> '%s'", CDF_CLI_PATH, args, one_lat,
                                   log_one), 0);
        int rc = tu_system(MPIRUN " -np 2%s -x CDIFFUSERS_LOG=io '%s' generate %s --latents-out '%s' --tp 2 "
                           "--tp-replicate text_encoder_2 2> '%s'",
                           mpi_env(), CDF_CLI_PATH, args, tp_lat, log_tp);
        char *l1 = tu_read_file(log_one, NULL), *l2 = tu_read_file(log_tp, NULL);
        if (rc != 0) fail_msg("2-rank run '%s' failed (%d): %s", args, rc, l2 ? l2 : "");
        int64_t n1, n2;
        float *f1 = st_tensor(one_lat, "latents_final", &n1), *f2 = st_tensor(tp_lat, "latents_final", &n2);
        assert_int_equal(n1, n2);
        const double d = tu_max_abs_diff(f1, f2, (size_t)n1, NULL);
        io_line one[1] = {{0}}, tp[2] = {{0}, {0}};
        assert_int_equal(parse_io(l1, one, 1), 1);
        assert_int_equal(parse_io(l2, tp, 2), 2);
        print_message("  %s %s: |tp - one| = %.3g (tol %.0e); weight bytes read: one process %llu, ranks %llu / %llu\n",
                      runs[k].gguf ? "GGUF transformer" : "folder", runs[k].extra, d, TP_VS_SINGLE_TOL, one[0].weight_bytes,
                      tp[0].weight_bytes, tp[1].weight_bytes);
        assert_true(d <= TP_VS_SINGLE_TOL);
        for (int r = 0; runs[k].gguf && r < 2; r++) assert_true(tp[r].weight_bytes < one[0].weight_bytes);
        free(f1), free(f2), free(l1), free(l2);
    }
}

/* Inpainting (FluxInpaintPipeline golden case) over 2 ranks: the VAE encode, the start latents and
 * the per-step blend go through the sharded transformer the same way; latents and image within
 * the TP tolerance of one process and of diffusers'. */
static void test_inpaint_tp2_equals_single_process(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    const char *dir = tu_data("golden/img2img/flux_inpaint_s08_64x64");
    char args[3000], one_png[1100], one_lat[1100], tp_png[1100], tp_lat[1100], golden[1200];
    snprintf(args, sizeof args,
             "--model '%s/flux1_dev_tiny' --prompt 'a red house by a lake' --height 64 --width 64 --steps 8 --guidance 3.5 "
             "--max-sequence-length 32 --seed 9 --image '%s/image_in.png' --mask '%s/mask_in.png' --strength 0.8 "
             "--threads 1 --quiet --dtype f32 --force",
             tu_data("pipelines"), dir, dir);
    snprintf(one_png, sizeof one_png, "%s/inpaint_one.png", tu_tmpdir());
    snprintf(one_lat, sizeof one_lat, "%s/inpaint_one.safetensors", tu_tmpdir());
    snprintf(tp_png, sizeof tp_png, "%s/inpaint_tp.png", tu_tmpdir());
    snprintf(tp_lat, sizeof tp_lat, "%s/inpaint_tp.safetensors", tu_tmpdir());
    snprintf(golden, sizeof golden, "%s/expected.safetensors", dir);
    int rc = tu_system("'%s' generate %s --output '%s' --latents-out '%s'", CDF_CLI_PATH, args, one_png, one_lat);
    assert_int_equal(rc, 0);
    rc = tu_system(MPIRUN " -np 2%s '%s' generate %s --output '%s' --latents-out '%s' --tp 2 --tp-replicate text_encoder_2",
                   mpi_env(), CDF_CLI_PATH, args, tp_png, tp_lat);
    assert_int_equal(rc, 0);
    expect_tp_latents(one_lat, tp_lat, golden);
    cdf_png_image a, b;
    assert_int_equal(cdf_png_read(one_png, &a), CDF_OK);
    assert_int_equal(cdf_png_read(tp_png, &b), CDF_OK);
    assert_true(max_level_diff(a.pixels, b.pixels, (size_t)a.width * a.height * 3) <= 1);
    cdf_png_image_free(&a);
    cdf_png_image_free(&b);
}

/* Step caches over 2 ranks (tests/data/golden/step_cache: diffusers' hooks; true CFG, two cache
 * contexts): First Block Cache, where every rank takes rank 0's decision, and TaylorSeer, whose
 * factors of the single blocks' attention are each rank's shard of it. The steps computed in full
 * are diffusers' (the PNG text names them), the latents within the TP tolerance of one process
 * and the golden tolerance of diffusers', eager and compiled. */
static void tp_cache_case(const char *name, const char *cache, const char *report_head) {
    char dir[1100], args[3000], one_png[1100], one_lat[1100], tp_png[1100], tp_lat[1100], golden[1200], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", tu_data("golden/step_cache"), name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    cJSON *js = tu_read_json(path);
    /* the report diffusers' decisions make */
    char want[1024];
    int n = snprintf(want, sizeof want, "Cache: %s, full steps", report_head);
    const cJSON *cs = cJSON_GetObjectItem(js, "computed_steps");
    const char *ctx[2] = {"cond", "uncond"};
    for (int c = 0; c < 2; c++) {
        const cJSON *l = cJSON_GetObjectItem(cs, ctx[c]), *e;
        assert_non_null(l);
        n += snprintf(want + n, sizeof want - n, "%s%s ", c ? ", " : " ", ctx[c]);
        int k = 0;
        cJSON_ArrayForEach(e, l) n += snprintf(want + n, sizeof want - n, "%s%d", k++ ? "," : "", e->valueint);
        n += snprintf(want + n, sizeof want - n, " (%d of %d)", k, cJSON_GetObjectItem(js, "steps_run")->valueint);
    }
    const cJSON *call = cJSON_GetObjectItem(js, "call");
    snprintf(args, sizeof args,
             "--model '%s/flux1_dev_tiny' --prompt '%s' --negative-prompt '%s' --true-cfg-scale %g --height %d --width %d "
             "--steps %d --guidance %g --max-sequence-length %d --seed %d --cache '%s' --threads 1 --quiet --dtype f32 --force",
             tu_data("pipelines"), cJSON_GetObjectItem(call, "prompt")->valuestring,
             cJSON_GetObjectItem(call, "negative_prompt")->valuestring, cJSON_GetObjectItem(call, "true_cfg_scale")->valuedouble,
             cJSON_GetObjectItem(call, "height")->valueint, cJSON_GetObjectItem(call, "width")->valueint,
             cJSON_GetObjectItem(call, "num_inference_steps")->valueint, cJSON_GetObjectItem(call, "guidance_scale")->valuedouble,
             cJSON_GetObjectItem(call, "max_sequence_length")->valueint, cJSON_GetObjectItem(js, "seeds")->valueint, cache);
    cJSON_Delete(js);
    snprintf(one_png, sizeof one_png, "%s/%s_one.png", tu_tmpdir(), name);
    snprintf(one_lat, sizeof one_lat, "%s/%s_one.safetensors", tu_tmpdir(), name);
    snprintf(golden, sizeof golden, "%s/expected.safetensors", dir);
    assert_int_equal(tu_system("'%s' generate %s --output '%s' --latents-out '%s'", CDF_CLI_PATH, args, one_png, one_lat), 0);
    const char *modes[2] = {"", "--mode compile"};
    for (int m = 0; m < 2; m++) {
        snprintf(tp_png, sizeof tp_png, "%s/%s_tp%d.png", tu_tmpdir(), name, m);
        snprintf(tp_lat, sizeof tp_lat, "%s/%s_tp%d.safetensors", tu_tmpdir(), name, m);
        int rc = tu_system(MPIRUN " -np 2%s '%s' generate %s %s --output '%s' --latents-out '%s' --tp 2 --tp-replicate text_encoder_2",
                           mpi_env(), CDF_CLI_PATH, args, modes[m], tp_png, tp_lat);
        assert_int_equal(rc, 0);
        expect_tp_latents(one_lat, tp_lat, golden);
        const char *pngs[2] = {one_png, tp_png};
        for (int i = 0; i < 2; i++) {
            cdf_png_image a;
            assert_int_equal(cdf_png_read(pngs[i], &a), CDF_OK);
            const char *t = cdf_png_image_text(&a, "parameters");
            if (!t || !strstr(t, want)) fail_msg("%s: parameters lack '%s':\n%s", pngs[i], want, t ? t : "(none)");
            cdf_png_image_free(&a);
        }
    }
}

static void test_step_caches_tp2(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    tp_cache_case("fbc_dev_truecfg_64x64", "first-block:0.75", "first-block:0.75");
    tp_cache_case("ts_dev_truecfg_f32_order2_64x64",
                  "taylorseer:cache_interval=3,disable_cache_before_step=2,max_order=2,taylor_factors_dtype=float32",
                  "taylorseer:cache_interval=3,disable_cache_before_step=2,disable_cache_after_step=None,max_order=2,"
                  "taylor_factors_dtype=float32");
}

/* T5 sharded over 2 ranks (heads and FFN; two all-reduces per block). The tiny pipelines' T5s
 * have 3 heads and stay whole in the generate cases above, so this runs the golden 4-head
 * t5_tiny through `run-model --tp 2`: output equal to one process and to transformers' within
 * tolerance, each rank reads exactly its slices, rank 1 writes nothing. */
static void test_t5_tp2_run_model(void **state) {
    (void)state;
    if (!have_mpi()) skip();
    const char *models = tu_data("golden/text_models");
    char model[1200], io[1200], args[3000];
    snprintf(model, sizeof model, "%s/t5_tiny", models);
    snprintf(io, sizeof io, "%s/outputs/t5_tiny_256.safetensors", models);
    snprintf(args, sizeof args, "run-model --model '%s' --inputs '%s' --threads 1 --dtype f32 --force", model, io);
    char one[1100], tp[1100], r1[1100], log_one[1100], log_tp[1100];
    snprintf(one, sizeof one, "%s/t5_one.safetensors", tu_tmpdir());
    snprintf(tp, sizeof tp, "%s/t5_tp.safetensors", tu_tmpdir());
    snprintf(r1, sizeof r1, "%s/t5_rank1.safetensors", tu_tmpdir());
    snprintf(log_one, sizeof log_one, "%s/t5_one.log", tu_tmpdir());
    snprintf(log_tp, sizeof log_tp, "%s/t5_tp.log", tu_tmpdir());
    int rc = tu_system("CDIFFUSERS_LOG=io '%s' %s --output '%s' 2> '%s'", CDF_CLI_PATH, args, one, log_one);
    char *log1 = tu_read_file(log_one, NULL);
    if (rc != 0) fail_msg("single-process run failed (%d): %s", rc, log1 ? log1 : "");
    rc = tu_system(MPIRUN " -np 1%s -x CDIFFUSERS_LOG=io '%s' %s --output '%s' --tp 2"
                          " : -np 1%s -x CDIFFUSERS_LOG=io '%s' %s --output '%s' --tp 2 2> '%s'",
                   mpi_env(), CDF_CLI_PATH, args, tp, mpi_env(), CDF_CLI_PATH, args, r1, log_tp);
    char *log2 = tu_read_file(log_tp, NULL);
    if (rc != 0) fail_msg("2-rank run failed (%d): %s", rc, log2 ? log2 : "");
    assert_int_equal(access(tp, F_OK), 0);
    assert_int_not_equal(access(r1, F_OK), 0);

    int64_t n1, n2, ng;
    float *a = st_tensor(one, "out.last_hidden_state", &n1), *b = st_tensor(tp, "out.last_hidden_state", &n2),
          *g = st_tensor(io, "last_hidden_state", &ng);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, ng);
    const double d_tp = tu_max_abs_diff(a, b, (size_t)n1, NULL), d_gold = tu_max_abs_diff(b, g, (size_t)n1, NULL);
    print_message("  t5_tiny: |tp - one| = %.3g (tol %.0e), |tp - transformers| = %.3g (tol 1e-4, test_model_t5's)\n", d_tp,
                  TP_VS_SINGLE_TOL, d_gold);
    assert_true(d_tp <= TP_VS_SINGLE_TOL);
    assert_true(d_gold <= 1e-4);
    free(a), free(b), free(g);

    io_line o[1] = {{0}}, t[2] = {{0}, {0}};
    assert_int_equal(parse_io(log1, o, 1), 1);
    assert_int_equal(parse_io(log2, t, 2), 2);
    uint64_t total;
    const uint64_t saved = saved_in_component(models, "t5_tiny", &total);
    /* the plan halves every attention and FFN projection weight (T5 has no biases) and the
     * relative-bias table (split by heads like q/k/v) and nothing else: the token table (most of
     * this tiny model's bytes) and norms stay whole */
    uint64_t proj = 0;
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(model, &ck), CDF_OK);
    for (int i = 0; i < cdf_checkpoint_count(ck); i++) {
        const cdf_st_file *f;
        const cdf_st_tensor *tt;
        assert_int_equal(cdf_checkpoint_tensor_at(ck, i, &f, &tt), CDF_OK);
        if (strstr(tt->name, ".SelfAttention.") || strstr(tt->name, ".DenseReluDense."))
            proj += tt->nbytes;
    }
    cdf_checkpoint_close(ck);
    print_message("  t5_tiny: %llu of %llu bytes are attention/FFN projections and the bias table\n", (unsigned long long)proj,
                  (unsigned long long)total);
    assert_true(proj > 0);
    assert_int_equal(2 * saved, proj);
    for (int r = 0; r < 2; r++) {
        print_message("  rank %d: read %llu weight bytes (one process %llu, expected %llu), %llu collectives\n", r,
                      t[r].weight_bytes, o[0].weight_bytes, (unsigned long long)(o[0].weight_bytes - saved), t[r].collectives);
        assert_int_equal(t[r].weight_bytes, o[0].weight_bytes - saved);
        assert_true(t[r].collectives >= 2 * 2); /* o and wo of each of the 2 blocks */
    }
    free(log1);
    free(log2);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--mpi-worker") == 0) return mpi_worker();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_and_offline_groups),
        cmocka_unit_test(test_shard_slices_and_bytes), cmocka_unit_test(test_shard_gguf_blocks), cmocka_unit_test(test_shard_fp8_scaled),
        cmocka_unit_test(test_component_sharding_offline),
        cmocka_unit_test(test_collectives_over_mpi),
        cmocka_unit_test(test_flux_tp2_equals_single_process),
        cmocka_unit_test(test_sd3_tp2_equals_single_process),
        cmocka_unit_test(test_quantized_tp2_equals_single_process), cmocka_unit_test(test_inpaint_tp2_equals_single_process),
        cmocka_unit_test(test_step_caches_tp2),
        cmocka_unit_test(test_t5_tp2_run_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
