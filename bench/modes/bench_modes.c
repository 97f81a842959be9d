/* bench/modes: one transformer forward in each execution mode (eager, defer-and-fuse, compile,
 * repeated-block compile) on random-weight models of real width and reduced depth.
 * Prints warm-up (first call, includes capture/compile), steady-state time (mean of the next
 * calls), device peak memory during the steady calls, kernels launched per forward and matmul
 * epilogues made (per forward; compile modes: at the capture, for the whole forward or for each
 * distinct block graph), with ratios to eager. With rounds > 1 the modes alternate (eager, fuse,
 * compile, blocks, eager, ...), each round's load average is printed with its times, and the
 * table gives medians over the rounds (the ratio column: the median of each round's ratio to
 * that round's eager). Not a test: numbers depend on the machine and its load. */
#define MRP_NO_MAIN
#include "../../tools/make-random-pipeline/make_random_pipeline.c"

#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "compile/compile.h"
#include "models/component.h"
#include "nn/nn.h"
#include "../flux_bench_inputs.h"

typedef enum { M_EAGER, M_FUSE, M_COMPILE, M_BLOCKS, M_COUNT } mode;
static const char *mode_name[M_COUNT] = {"eager", "defer-and-fuse", "compile", "compile-repeated-blocks"};

typedef struct result {
    double warm, steady, peak_mb;
    double kernels, epilogues;
} result;

static double load_avg(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int run_mode(const char *dir, mode m, const cdf_tensor_map *in, int calls, result *r) {
    cdf_device *dev = cdf_device_get("cpu");
    cdf_exec_set_mode(m == M_FUSE ? CDF_EXEC_DEFER_AND_FUSE : CDF_EXEC_EAGER);
    cdf_load_options o = cdf_load_options_default();
    o.device = dev;
    cdf_component *c = NULL;
    if (cdf_component_load(dir, &o, &c) != CDF_OK) {
        fprintf(stderr, "load %s: %s\n", dir, cdf_last_error());
        return 1;
    }
    if (m == M_COMPILE && cdf_component_compile(c, NULL) != CDF_OK) return fprintf(stderr, "%s\n", cdf_last_error()), 1;
    if (m == M_BLOCKS && cdf_component_compile_repeated_blocks(c, NULL) != CDF_OK) return fprintf(stderr, "%s\n", cdf_last_error()), 1;
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    cdf_exec_stats w0, w1;
    cdf_exec_get_stats(&w0);
    double t0 = now_s();
    if (cdf_component_run(c, "forward", in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK) {
        fprintf(stderr, "%s: %s\n", mode_name[m], cdf_last_error());
        return 1;
    }
    r->warm = now_s() - t0;
    cdf_exec_get_stats(&w1);
    cdf_tensor_map_clear(&out);
    cdf_device_synchronize(dev);
    cdf_device_reset_peak(dev);
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    t0 = now_s();
    for (int i = 0; i < calls; i++) {
        cdf_tensor_map_clear(&out);
        if (cdf_component_run(c, "forward", in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK) {
            fprintf(stderr, "%s: %s\n", mode_name[m], cdf_last_error());
            return 1;
        }
    }
    r->steady = (now_s() - t0) / calls;
    cdf_exec_get_stats(&s1);
    cdf_memory_stats ms;
    cdf_device_memory_stats(dev, &ms);
    r->peak_mb = ms.peak_bytes / 1048576.0;
    r->kernels = (double)(s1.kernels_launched - s0.kernels_launched) / calls;
    /* a compiled forward made its epilogues once, at the capture (the warm-up call) */
    r->epilogues = m == M_COMPILE || m == M_BLOCKS ? (double)(w1.matmul_epilogues - w0.matmul_epilogues)
                                                   : (double)(s1.matmul_epilogues - s0.matmul_epilogues) / calls;
    cdf_tensor_map_clear(&out);
    cdf_component_free(c);
    cdf_exec_set_mode(CDF_EXEC_EAGER);
    return 0;
}

int main(int argc, char **argv) {
    const char *work = argc > 1 ? argv[1] : "/tmp/cdf_bench_modes";
    const char *tok = argc > 2 ? argv[2] : "tests/data/tokenizers";
    int calls = argc > 3 ? atoi(argv[3]) : 2;
    int rounds = argc > 4 ? atoi(argv[4]) : 1;
    if (calls < 1) calls = 1;
    if (rounds < 1) rounds = 1;
    enum { MAX_ROUNDS = 32 };
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    cdf_device *dev = cdf_device_get("cpu");
    struct {
        const char *name;
        mrp_kind kind;
        int res;
    } cases[] = {
        {"SD3.5-Medium width (1536), 2 joint blocks (1 dual), CFG batch 2, 333 text tokens", MRP_SD3, 256},
        {"SD3.5-Medium width (1536), 2 joint blocks (1 dual), CFG batch 2, 333 text tokens", MRP_SD3, 512},
        {"FLUX.1 width (3072), 1 double + 1 single block, 512 text tokens", MRP_FLUX, 256},
        {"FLUX.1 width (3072), 1 double + 1 single block, 512 text tokens", MRP_FLUX, 512},
    };
    /* CDF_BENCH_CASES=sd3-256,flux-512,... runs only those cases (default: all) */
    const char *only = getenv("CDF_BENCH_CASES");
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "%s-%d", cases[k].kind == MRP_SD3 ? "sd3" : "flux", cases[k].res);
        if (only && *only && !strstr(only, tag)) continue;
        mrp_spec s;
        if (mrp_preset(cases[k].kind == MRP_SD3 ? "sd35-medium" : "flux1", &s)) return 1;
        s.tokenizers = tok;
        s.dtype = MRP_F32;
        bench_tiny_encoders(&s, cases[k].kind == MRP_SD3); /* only the transformer matters here */
        if (cases[k].kind == MRP_SD3) {
            s.sd3.layers = 2;
            s.sd3.dual_layers = 1;
        } else {
            s.flux.layers = 1;
            s.flux.single_layers = 1;
        }
        char dir[512], tdir[600];
        snprintf(dir, sizeof dir, "%s/%s", work, cases[k].kind == MRP_SD3 ? "sd35m" : "flux");
        snprintf(tdir, sizeof tdir, "%s/transformer", dir);
        if (access(tdir, F_OK) != 0 && mrp_write_pipeline(&s, dir)) return 1;
        /* inputs at this resolution */
        cdf_tensor_map in;
        cdf_tensor_map_init(&in);
        int64_t lat = cases[k].res / 8;
        if (cases[k].kind == MRP_SD3) {
            int64_t hs[4] = {2, 16, lat, lat}, es[3] = {2, 333, 4096}, ps[2] = {2, 2048}, ts[1] = {2};
            cdf_tensor_map_set(&in, "hidden_states", randt(dev, 4, hs, 1, 1));
            cdf_tensor_map_set(&in, "encoder_hidden_states", randt(dev, 3, es, 2, 1));
            cdf_tensor_map_set(&in, "pooled_projections", randt(dev, 2, ps, 3, 1));
            cdf_tensor_map_set(&in, "timestep", cdf_tensor_full(dev, CDF_F32, 1, ts, 500.0));
        } else {
            flux_bench_inputs(dev, cases[k].res, &in);
        }
        printf("\n### %s, %dx%d (%d rounds of %d steady calls)\n\n", cases[k].name, cases[k].res, cases[k].res,
               rounds, calls);
        result r[MAX_ROUNDS][M_COUNT];
        for (int q = 0; q < rounds; q++) {
            printf("round %d, load %.2f:", q, load_avg());
            for (int m = 0; m < M_COUNT; m++) {
                if (run_mode(tdir, (mode)m, &in, calls, &r[q][m])) return 1;
                printf(" %s %.2f s (%.2fx)%s", mode_name[m], r[q][m].steady, r[q][0].steady / r[q][m].steady,
                       m + 1 < M_COUNT ? "," : "");
                fflush(stdout);
            }
            printf("; load after %.2f\n", load_avg());
        }
        printf("\n| mode | warm-up s | steady s | vs eager | ratio range | peak MiB | kernels/forward | matmul epilogues |\n"
               "|---|---|---|---|---|---|---|---|\n");
        for (int m = 0; m < M_COUNT; m++) {
            double w[MAX_ROUNDS], st[MAX_ROUNDS], ra[MAX_ROUNDS], lo = 1e30, hi = 0;
            for (int q = 0; q < rounds; q++) {
                w[q] = r[q][m].warm;
                st[q] = r[q][m].steady;
                ra[q] = r[q][0].steady / r[q][m].steady;
                lo = ra[q] < lo ? ra[q] : lo;
                hi = ra[q] > hi ? ra[q] : hi;
            }
            printf("| %s | %.2f | %.2f | %.2fx | %.2f-%.2f | %.0f | %.0f | %.0f |\n", mode_name[m], median(w, rounds),
                   median(st, rounds), median(ra, rounds), lo, hi, r[rounds - 1][m].peak_mb, r[rounds - 1][m].kernels,
                   r[rounds - 1][m].epilogues);
        }
        fflush(stdout);
        cdf_tensor_map_clear(&in);
    }
    return 0;
}
