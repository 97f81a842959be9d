/* bench/pjrt: one transformer forward on a device in one execution mode, for the same-run table
 * of the pjrt backend (XLA CPU plugin) against the cpu backend (bench/pjrt/run.sh).
 *   bench_pjrt WORK TOKENIZERS DEVICE MODE CASE CALLS
 * MODE: eager | fuse | compile | blocks; CASE: sd35m-512 (SD3.5-Medium width, 6 joint blocks,
 * CFG batch 2, 512^2) | flux-512 (FLUX.1 width, 1 double + 2 single blocks, 512^2). Prints one
 * line: first forward (capture + compile, or the disk cache's load), steady mean of CALLS more,
 * the device's peak memory. Random weights (make_random_pipeline), written to WORK once. */
#define MRP_NO_MAIN
#include "../../tools/make-random-pipeline/make_random_pipeline.c"

#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "compile/compile.h"
#include "models/component.h"
#include "nn/nn.h"
#include "../flux_bench_inputs.h"

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_pjrt WORK TOKENIZERS DEVICE eager|fuse|compile|blocks sd35m-512|flux-512 CALLS\n");
        return 2;
    }
    const char *work = argv[1], *tok = argv[2], *devname = argv[3], *mode = argv[4], *cs = argv[5];
    int calls = atoi(argv[6]);
    if (calls < 1) calls = 1;
    const bool sd3 = !strncmp(cs, "sd35m", 5);
    mrp_spec s;
    if (mrp_preset(sd3 ? "sd35-medium" : "flux1", &s)) return 1;
    s.tokenizers = tok;
    s.dtype = MRP_F32;
    bench_tiny_encoders(&s, sd3);
    if (sd3) {
        s.sd3.layers = 6;
        s.sd3.dual_layers = 2;
    } else {
        s.flux.layers = 1;
        s.flux.single_layers = 2;
    }
    char dir[512], tdir[600];
    snprintf(dir, sizeof dir, "%s/%s", work, sd3 ? "sd35m6" : "flux12");
    snprintf(tdir, sizeof tdir, "%s/transformer", dir);
    if (access(tdir, F_OK) != 0 && mrp_write_pipeline(&s, dir)) return 1;

    cdf_device *dev = cdf_device_get(devname);
    if (!dev) return fprintf(stderr, "%s\n", cdf_last_error()), 1;
    cdf_exec_set_mode(!strcmp(mode, "fuse") ? CDF_EXEC_DEFER_AND_FUSE : CDF_EXEC_EAGER);
    cdf_load_options o = cdf_load_options_default();
    o.device = dev;
    o.weight_dtype = CDF_BF16;
    cdf_component *c = NULL;
    if (cdf_component_load(tdir, &o, &c) != CDF_OK) return fprintf(stderr, "load: %s\n", cdf_last_error()), 1;
    if (!strcmp(mode, "compile") && cdf_component_compile(c, NULL) != CDF_OK) return fprintf(stderr, "%s\n", cdf_last_error()), 1;
    if (!strcmp(mode, "blocks") && cdf_component_compile_repeated_blocks(c, NULL) != CDF_OK)
        return fprintf(stderr, "%s\n", cdf_last_error()), 1;
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    if (sd3) {
        int64_t hs[4] = {2, 16, 64, 64}, es[3] = {2, 333, 4096}, ps[2] = {2, 2048}, ts[1] = {2};
        cdf_tensor_map_set(&in, "hidden_states", randt(dev, 4, hs, 1, 1));
        cdf_tensor_map_set(&in, "encoder_hidden_states", randt(dev, 3, es, 2, 1));
        cdf_tensor_map_set(&in, "pooled_projections", randt(dev, 2, ps, 3, 1));
        cdf_tensor_map_set(&in, "timestep", cdf_tensor_full(dev, CDF_F32, 1, ts, 500.0));
    } else {
        flux_bench_inputs(dev, 512, &in);
    }
    cdf_device_synchronize(dev);
    double t0 = now_s();
    if (cdf_component_run(c, "forward", &in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK)
        return fprintf(stderr, "first forward: %s\n", cdf_last_error()), 1;
    const double first = now_s() - t0;
    cdf_device_reset_peak(dev);
    t0 = now_s();
    for (int i = 0; i < calls; i++) {
        cdf_tensor_map_clear(&out);
        if (cdf_component_run(c, "forward", &in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK)
            return fprintf(stderr, "forward: %s\n", cdf_last_error()), 1;
    }
    const double steady = (now_s() - t0) / calls;
    cdf_memory_stats ms;
    cdf_device_memory_stats(dev, &ms);
    printf("%s %s %s first %.3f s steady %.3f s peak %.0f MiB\n", cs, devname, mode, first, steady, ms.peak_bytes / 1048576.0);
    cdf_tensor_map_clear(&out);
    cdf_tensor_map_clear(&in);
    cdf_component_free(c);
    return 0;
}
