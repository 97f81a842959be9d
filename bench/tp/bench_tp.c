/* Tensor-parallel transformer benchmark: one transformer forward (= one denoising step without
 * CFG) at FLUX.1 or SD3.5-Medium width with random weights, run whole or sharded over the ranks
 * of an MPI job.
 *
 *   bench_tp make DIR flux|sd3        write config.json + random bf16 weights into DIR
 *   bench_tp run DIR [--img N] [--txt N] [--steps N] [--threads N] [--dtype bf16|f32] [--device D] [--tp N]
 *       alone: the whole model in one process; under `mpirun -np R`: sharded over R ranks
 *       (cdf_tp_enable: the same path as `cdiffusers generate --tp R`), each on its device D
 *       (default cpu; pjrt: each rank its pjrt:0). --tp N without a launcher: one process over
 *       N devices of a backend that runs programs as replicas (pjrt: cdf_dist_init_devices, the
 *       all-reduce inside the programs, as `cdiffusers generate --tp N --device pjrt`).
 *       CDIFFUSERS_COMPILE=1 in the environment compiles the transformer at load.
 *   mpirun -np R bench_tp allreduce   cdf_dist_all_reduce_sum alone, 8 B .. 64 MiB (best of reps)
 *
 * Prints one line per rank: load time, weight bytes read, per-step time (median and minimum of
 * --steps forwards after one warm-up forward, each started after a barrier), all-reduces and
 * bytes all-reduced per step, peak device memory. Over replicas (--tp in one process) the process
 * reads every rank's slice, and the all-reduces counted are the ops recorded (0 per step once a
 * compiled forward replays: its sums run inside the program, not through the host). Built and driven by bench/tp/run.sh. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/dist.h"
#include "models/component.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* ---- make: a random-weight model folder ----------------------------------------------------- */
typedef struct maker {
    cdf_st_writer *w;
    uint64_t bytes;
    int failed;
} maker;

/* A bf16 tensor of the given shape, uniform in +-scale (scale < 0: all ones, for norm scales). */
static void add(maker *m, float scale, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    uint16_t *buf = malloc((size_t)n * 2);
    float *tmp = malloc((size_t)n * 4);
    if (buf && tmp) {
        for (int64_t i = 0; i < n; i++) tmp[i] = scale < 0 ? 1.0f : scale * frand();
        cdf_convert(buf, CDF_BF16, tmp, CDF_F32, (size_t)n);
        if (cdf_st_writer_add(m->w, name, CDF_BF16, ndim, shape, buf) != CDF_OK) {
            fprintf(stderr, "bench_tp: %s\n", cdf_last_error());
            m->failed = 1;
        }
        m->bytes += (uint64_t)n * 2;
    } else {
        m->failed = 1;
    }
    free(buf);
    free(tmp);
}

/* "<prefix>.weight" [out, in] (scaled 1/sqrt(in), keeping activations O(1)) and ".bias" [out]. */
static void linear(maker *m, int64_t in, int64_t out, const char *fmt, ...) {
    char p[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    add(m, 1.0f / sqrtf((float)in), 2, (int64_t[]){out, in}, "%s.weight", p);
    add(m, 0.01f, 1, (int64_t[]){out}, "%s.bias", p);
}

static void norm(maker *m, int64_t dim, const char *fmt, const char *a) {
    char p[256];
    snprintf(p, sizeof p, fmt, a);
    add(m, -1.0f, 1, (int64_t[]){dim}, "%s.weight", p);
}

static int write_text(const char *dir, const char *name, const char *text) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs(text, f);
    return fclose(f) != 0;
}

/* FLUX.1 width (24 heads x 128 = 3072): 1 double-stream + 1 single-stream block. */
static int make_flux(const char *dir, maker *m) {
    const int64_t D = 3072, F = 4 * D, hd = 128;
    if (write_text(dir, "config.json",
                   "{\"_class_name\": \"FluxTransformer2DModel\", \"attention_head_dim\": 128, \"num_attention_heads\": 24, "
                   "\"num_layers\": 1, \"num_single_layers\": 1, \"in_channels\": 64, \"joint_attention_dim\": 4096, "
                   "\"pooled_projection_dim\": 768, \"guidance_embeds\": true, \"axes_dims_rope\": [16, 56, 56], "
                   "\"patch_size\": 1}\n"))
        return 1;
    linear(m, 64, D, "x_embedder");
    linear(m, 4096, D, "context_embedder");
    linear(m, 256, D, "time_text_embed.timestep_embedder.linear_1");
    linear(m, D, D, "time_text_embed.timestep_embedder.linear_2");
    linear(m, 256, D, "time_text_embed.guidance_embedder.linear_1");
    linear(m, D, D, "time_text_embed.guidance_embedder.linear_2");
    linear(m, 768, D, "time_text_embed.text_embedder.linear_1");
    linear(m, D, D, "time_text_embed.text_embedder.linear_2");
    const char *p = "transformer_blocks.0";
    linear(m, D, 6 * D, "%s.norm1.linear", p);
    linear(m, D, 6 * D, "%s.norm1_context.linear", p);
    static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                                       "to_add_out"};
    for (int i = 0; i < 8; i++) linear(m, D, D, "%s.attn.%s", p, proj[i]);
    static const char *const qk[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
    for (int i = 0; i < 4; i++) {
        char f[64];
        snprintf(f, sizeof f, "%%s.attn.%s", qk[i]);
        norm(m, hd, f, p);
    }
    linear(m, D, F, "%s.ff.net.0.proj", p);
    linear(m, F, D, "%s.ff.net.2", p);
    linear(m, D, F, "%s.ff_context.net.0.proj", p);
    linear(m, F, D, "%s.ff_context.net.2", p);
    p = "single_transformer_blocks.0";
    linear(m, D, 3 * D, "%s.norm.linear", p);
    linear(m, D, D, "%s.attn.to_q", p);
    linear(m, D, D, "%s.attn.to_k", p);
    linear(m, D, D, "%s.attn.to_v", p);
    norm(m, hd, "%s.attn.norm_q", p);
    norm(m, hd, "%s.attn.norm_k", p);
    linear(m, D, F, "%s.proj_mlp", p);
    linear(m, D + F, D, "%s.proj_out", p);
    linear(m, D, 2 * D, "norm_out.linear");
    linear(m, D, 64, "proj_out");
    return 0;
}

/* SD3.5-Medium width (24 heads x 64 = 1536, qk RMSNorm): 2 joint blocks, the first with the
 * SD3.5 dual attention (attn2), the last context_pre_only, as in the real model. */
static int make_sd3(const char *dir, maker *m) {
    const int64_t D = 1536, hd = 64, M = 32; /* pos_embed_max_size 32: latents up to 64 x 64 */
    if (write_text(dir, "config.json",
                   "{\"_class_name\": \"SD3Transformer2DModel\", \"attention_head_dim\": 64, \"num_attention_heads\": 24, "
                   "\"num_layers\": 2, \"caption_projection_dim\": 1536, \"dual_attention_layers\": [0], "
                   "\"in_channels\": 16, \"out_channels\": 16, \"joint_attention_dim\": 4096, \"patch_size\": 2, "
                   "\"pooled_projection_dim\": 2048, \"pos_embed_max_size\": 32, \"qk_norm\": \"rms_norm\", "
                   "\"sample_size\": 64}\n"))
        return 1;
    add(m, 0.1f, 4, (int64_t[]){D, 16, 2, 2}, "pos_embed.proj.weight");
    add(m, 0.01f, 1, (int64_t[]){D}, "pos_embed.proj.bias");
    add(m, 0.1f, 3, (int64_t[]){1, M * M, D}, "pos_embed.pos_embed");
    linear(m, 256, D, "time_text_embed.timestep_embedder.linear_1");
    linear(m, D, D, "time_text_embed.timestep_embedder.linear_2");
    linear(m, 2048, D, "time_text_embed.text_embedder.linear_1");
    linear(m, D, D, "time_text_embed.text_embedder.linear_2");
    linear(m, 4096, D, "context_embedder");
    for (int i = 0; i < 2; i++) {
        const bool dual = i == 0, last = i == 1;
        char p[64];
        snprintf(p, sizeof p, "transformer_blocks.%d", i);
        linear(m, D, (dual ? 9 : 6) * D, "%s.norm1.linear", p);
        linear(m, D, (last ? 2 : 6) * D, "%s.norm1_context.linear", p);
        static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj"};
        for (int j = 0; j < 7; j++) linear(m, D, D, "%s.attn.%s", p, proj[j]);
        if (!last) linear(m, D, D, "%s.attn.to_add_out", p);
        norm(m, hd, "%s.attn.norm_q", p);
        norm(m, hd, "%s.attn.norm_k", p);
        norm(m, hd, "%s.attn.norm_added_q", p);
        norm(m, hd, "%s.attn.norm_added_k", p);
        if (dual) {
            for (int j = 0; j < 4; j++) linear(m, D, D, "%s.attn2.%s", p, proj[j]);
            norm(m, hd, "%s.attn2.norm_q", p);
            norm(m, hd, "%s.attn2.norm_k", p);
        }
        linear(m, D, 4 * D, "%s.ff.net.0.proj", p);
        linear(m, 4 * D, D, "%s.ff.net.2", p);
        if (!last) {
            linear(m, D, 4 * D, "%s.ff_context.net.0.proj", p);
            linear(m, 4 * D, D, "%s.ff_context.net.2", p);
        }
    }
    linear(m, D, 2 * D, "norm_out.linear");
    linear(m, D, 2 * 2 * 16, "proj_out");
    return 0;
}

static int cmd_make(const char *dir, const char *which) {
    mkdir(dir, 0755);
    maker m = {.w = cdf_st_writer_new()};
    if (!m.w) return 1;
    int rc = 1;
    if (strcmp(which, "flux") == 0) rc = make_flux(dir, &m);
    else if (strcmp(which, "sd3") == 0) rc = make_sd3(dir, &m);
    else fprintf(stderr, "bench_tp: make needs flux or sd3, got '%s'\n", which);
    if (rc == 0 && !m.failed) {
        char path[1200];
        snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
        if (cdf_st_writer_save(m.w, path) != CDF_OK) {
            fprintf(stderr, "bench_tp: %s\n", cdf_last_error());
            rc = 1;
        } else {
            printf("wrote %s (%.2f GB of bf16 weights)\n", path, m.bytes / 1e9);
        }
    }
    cdf_st_writer_free(m.w);
    return rc || m.failed;
}

/* ---- run ------------------------------------------------------------------------------------ */
static cdf_tensor *rand_tensor(cdf_device *dev, int ndim, const int64_t *shape, float scale) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    cdf_tensor *t = cdf_tensor_from_host(dev, CDF_F32, ndim, shape, p, CDF_F32);
    free(p);
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmd_run(int argc, char **argv) {
    const char *dir = argv[2];
    long img = 256, txt = 128, steps = 5, threads = 0, tp = 1;
    const char *device = "cpu";
    cdf_dtype wdt = CDF_BF16;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--img") == 0) img = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--txt") == 0) txt = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0) steps = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0) threads = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0) wdt = strcmp(argv[i + 1], "f32") == 0 ? CDF_F32 : CDF_BF16;
        else if (strcmp(argv[i], "--device") == 0) device = argv[i + 1];
        else if (strcmp(argv[i], "--tp") == 0) tp = atol(argv[i + 1]);
        else {
            fprintf(stderr, "bench_tp: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    const long side = lround(sqrt((double)img));
    if (side * side != img || steps < 1 || steps > 1000) {
        fprintf(stderr, "bench_tp: --img must be a square number of tokens, --steps 1..1000\n");
        return 2;
    }
    char backend[32];
    snprintf(backend, sizeof backend, "%.*s", (int)strcspn(device, ":"), device);
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    cdf_process_group *pg = NULL;
    cdf_device_mesh *mesh = NULL;
    cdf_device *dev = NULL;
    if (tp > 1 && !(ws && atoi(ws) > 1)) { /* one process over tp devices (replicas) */
        if (cdf_dist_init_devices(device, (int)tp, &pg) != CDF_OK || !(dev = cdf_dist_replica_device(pg)) ||
            cdf_device_mesh_new(pg, dev, &mesh) != CDF_OK || cdf_tp_enable(mesh, NULL) != CDF_OK) {
            fprintf(stderr, "bench_tp: --tp %ld on %s: %s\n", tp, device, cdf_last_error());
            return 1;
        }
    } else if (cdf_backend_load(backend) != CDF_OK /* a no-op when loaded; pjrt loads on demand */ ||
               !(dev = cdf_device_get(device))) {
        fprintf(stderr, "bench_tp: device %s: %s\n", device, cdf_last_error());
        return 1;
    }
    if (threads > 0) cdf_device_set_threads(dev, (int)threads);
    if (!pg && ws && atoi(ws) > 1) {
        if (cdf_dist_init("mpi", &pg) != CDF_OK || cdf_device_mesh_new(pg, dev, &mesh) != CDF_OK ||
            cdf_tp_enable(mesh, NULL) != CDF_OK) {
            fprintf(stderr, "bench_tp: %s\n", cdf_last_error());
            return 1;
        }
    }
    const int rank = cdf_dist_rank(pg), world = cdf_dist_world_size(pg);
    cdf_load_options opt = cdf_load_options_default();
    opt.device = dev;
    opt.weight_dtype = wdt;
    cdf_io_reset_counters();
    double t0 = now_s();
    cdf_component *comp = NULL;
    cdf_status s = cdf_component_load(dir, &opt, &comp);
    const double load_s = now_s() - t0;
    const uint64_t weight_bytes = cdf_io_bytes_read();
    if (pg) s = cdf_dist_agree(pg, s);
    if (s != CDF_OK) {
        fprintf(stderr, "bench_tp: rank %d: %s\n", rank, cdf_last_error());
        cdf_dist_finalize(pg);
        return 1;
    }
    const bool flux = strcmp(cdf_component_class_name(comp), "FluxTransformer2DModel") == 0;

    /* the same inputs on every rank (same generator seed) */
    cdf_tensor_map in;
    cdf_tensor_map_init(&in);
    cdf_scope_push();
    if (flux) {
        float *ids = calloc((size_t)img * 3, sizeof *ids);
        for (long i = 0; i < img; i++) ids[i * 3 + 1] = (float)(i / side), ids[i * 3 + 2] = (float)(i % side);
        cdf_tensor_map_set(&in, "img_ids", cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){img, 3}, ids, CDF_F32));
        free(ids);
        cdf_tensor_map_set(&in, "txt_ids", cdf_tensor_zeros(dev, CDF_F32, 2, (int64_t[]){txt, 3}));
        cdf_tensor_map_set(&in, "hidden_states", rand_tensor(dev, 3, (int64_t[]){1, img, 64}, 1.0f));
        cdf_tensor_map_set(&in, "encoder_hidden_states", rand_tensor(dev, 3, (int64_t[]){1, txt, 4096}, 1.0f));
        cdf_tensor_map_set(&in, "pooled_projections", rand_tensor(dev, 2, (int64_t[]){1, 768}, 1.0f));
        cdf_tensor_map_set(&in, "timestep", cdf_tensor_full(dev, CDF_F32, 1, (int64_t[]){1}, 0.5));
        cdf_tensor_map_set(&in, "guidance", cdf_tensor_full(dev, CDF_F32, 1, (int64_t[]){1}, 3.5));
    } else {
        cdf_tensor_map_set(&in, "hidden_states", rand_tensor(dev, 4, (int64_t[]){1, 16, 2 * side, 2 * side}, 1.0f));
        cdf_tensor_map_set(&in, "encoder_hidden_states", rand_tensor(dev, 3, (int64_t[]){1, txt, 4096}, 1.0f));
        cdf_tensor_map_set(&in, "pooled_projections", rand_tensor(dev, 2, (int64_t[]){1, 2048}, 1.0f));
        cdf_tensor_map_set(&in, "timestep", cdf_tensor_full(dev, CDF_F32, 1, (int64_t[]){1}, 500.0));
    }
    cdf_scope_pop(NULL, 0);

    double *times = calloc((size_t)steps, sizeof *times);
    cdf_dist_stats st = {0};
    int rc = 0;
    for (long i = 0; i <= steps && rc == 0; i++) {
        if (i == 1) { /* after the warm-up forward (first-call costs: weight prepacking, page faults) */
            cdf_dist_reset_stats(pg);
            cdf_device_reset_peak(dev);
        }
        if (pg && cdf_dist_barrier(pg) != CDF_OK) rc = 1;
        cdf_tensor_map out;
        cdf_tensor_map_init(&out);
        double a = now_s();
        if (rc == 0 && (cdf_component_run(comp, "forward", &in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK)) {
            fprintf(stderr, "bench_tp: rank %d: forward: %s\n", rank, cdf_last_error());
            rc = 1;
        }
        if (i > 0) times[i - 1] = now_s() - a;
        cdf_tensor_map_clear(&out);
    }
    cdf_dist_get_stats(pg, &st);
    /* the barriers: MPI ones are collectives; over replicas a barrier drains the queues, and the
     * count is of all-reduce ops recorded (a compiled forward's once, at capture: not per step) */
    if (pg && cdf_dist_replicas(pg) == 0) st.collectives -= (uint64_t)steps;
    cdf_memory_stats ms;
    cdf_device_memory_stats(dev, &ms);
    if (rc == 0) {
        const double min = times[0];
        qsort(times, (size_t)steps, sizeof *times, cmp_double);
        printf("bench_tp: model=%s device=%s replicas=%d rank=%d world=%d threads=%ld img=%ld txt=%ld dtype=%s load_s=%.2f "
               "weight_bytes=%llu step_ms_median=%.1f step_ms_min=%.1f allreduces_per_step=%.1f comm_bytes_per_step=%.0f "
               "comm_ms_per_step=%.1f peak_bytes=%llu\n",
               flux ? "flux" : "sd3", device, cdf_dist_replicas(pg), rank, world, threads, img, txt, cdf_dtype_name(wdt), load_s,
               (unsigned long long)weight_bytes, 1e3 * times[steps / 2], 1e3 * fmin(min, times[0]),
               (double)st.collectives / steps, (double)st.bytes / steps, 1e3 * st.seconds / steps,
               (unsigned long long)ms.peak_bytes);
    }
    free(times);
    cdf_tensor_map_clear(&in);
    cdf_component_free(comp);
    cdf_tp_disable();
    cdf_device_mesh_free(mesh);
    if (rc && pg) cdf_dist_abort(pg, 1);
    cdf_dist_finalize(pg);
    return rc;
}

/* ---- allreduce: the collective alone, through the library (sync + MPI on the buffer) ------------ */
static int cmd_allreduce(void) {
    if (cdf_backend_count() == 0) cdf_backend_load("cpu");
    cdf_device *dev = cdf_device_get("cpu");
    cdf_process_group *pg = NULL;
    if (cdf_dist_init("mpi", &pg) != CDF_OK) {
        fprintf(stderr, "bench_tp: %s\n", cdf_last_error());
        return 1;
    }
    static const int64_t sizes[] = {2, 1 << 18, 3 << 18, 3 << 20, 16 << 20}; /* f32 elements: 8 B .. 64 MiB */
    int rc = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes && rc == 0; i++) {
        cdf_scope_push();
        cdf_tensor *t = cdf_tensor_full(dev, CDF_F32, 1, &sizes[i], 1.0);
        const int reps = sizes[i] > (1 << 20) ? 5 : 50;
        double best = 1e30;
        for (int r = 0; r < reps && rc == 0; r++) {
            cdf_dist_barrier(pg);
            double a = now_s();
            if (cdf_dist_all_reduce_sum(pg, t) != CDF_OK) rc = 1;
            best = fmin(best, now_s() - a);
        }
        if (cdf_dist_rank(pg) == 0)
            printf("bench_tp: allreduce world=%d bytes=%lld best_ms=%.3f GB_per_s=%.2f\n", cdf_dist_world_size(pg),
                   (long long)sizes[i] * 4, best * 1e3, sizes[i] * 4 / best / 1e9);
        cdf_scope_pop(NULL, 0);
    }
    cdf_dist_finalize(pg);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "allreduce") == 0) return cmd_allreduce();
    if (argc >= 4 && strcmp(argv[1], "make") == 0) return cmd_make(argv[2], argv[3]);
    if (argc >= 3 && strcmp(argv[1], "run") == 0) return cmd_run(argc, argv);
    fprintf(stderr, "usage: bench_tp make DIR flux|sd3\n"
                    "       [mpirun -np R] bench_tp run DIR [--img N] [--txt N] [--steps N] [--threads N] [--dtype bf16|f32]\n"
                    "                               [--device D] [--tp N (one process over N devices)]\n");
    return 2;
}
