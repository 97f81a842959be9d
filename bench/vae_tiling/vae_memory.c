/* VAE decode memory, tiled vs untiled: loads an AutoencoderKL / AutoencoderKLFlux2 folder, decodes
 * a smooth random latent (a sum of a few low-frequency waves per channel plus a little noise, like
 * a real latent's large-scale structure) of the given size once, and prints the device peak the
 * backend counted during the decode (above what was allocated before it: weights and input) and
 * the process peak RSS. With --compare it also decodes untiled and prints the largest difference
 * tiled vs untiled (the seams' size on a smooth input).
 *
 *   vae-memory VAE_DIR LATENT_H LATENT_W [--tile PX] [--dtype f32|bf16] [--compare] [--threads N]
 *
 * Build: BUILD_DIR=build bench/vae_tiling/build.sh. One decode per process: ru_maxrss is a
 * process-lifetime peak. Not a timing benchmark (the wall time printed is for orientation). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"
#include "models/component.h"
#include "models/vae.h"
#include "nn/nn.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *smooth_latent(int64_t C, int64_t H, int64_t W) {
    float *z = malloc((size_t)(C * H * W) * sizeof *z);
    uint64_t s = 88172645463325252ull;
    for (int64_t c = 0; c < C; c++) {
        double a[3], b[3], ph[3];
        for (int k = 0; k < 3; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            a[k] = 0.02 + 0.1 * (double)(s % 1000) / 1000.0;
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            b[k] = 0.02 + 0.1 * (double)(s % 1000) / 1000.0;
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ph[k] = 6.28 * (double)(s % 1000) / 1000.0;
        }
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                double v = 0;
                for (int k = 0; k < 3; k++) v += sin(a[k] * (double)x + b[k] * (double)y + ph[k]);
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                z[(c * H + y) * W + x] = (float)(0.6 * v + 0.05 * ((double)(s % 2001) / 1000.0 - 1.0));
            }
    }
    return z;
}

static cdf_tensor *decode(cdf_component *vae, cdf_tensor *z, int64_t tile) {
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_tensor_map_set(&in, "z", z);
    if (tile > 0) {
        const int64_t one = 1;
        cdf_tensor_map_set(&in, "tile_sample_min_size", cdf_tensor_from_host(cdf_tensor_device(z), CDF_I64, 1, &one, &tile, CDF_I64));
    }
    cdf_tensor *r = NULL;
    if (cdf_component_run(vae, "decode", &in, &out) == CDF_OK) r = cdf_tensor_retain(cdf_tensor_map_get(&out, "out.decode_sample"));
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    if (r && cdf_device_synchronize(cdf_tensor_device(r)) != CDF_OK) r = NULL;
    return r;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: vae-memory VAE_DIR LATENT_H LATENT_W [--tile PX] [--dtype f32|bf16] [--compare]\n");
        return 2;
    }
    const char *dir = argv[1];
    const int64_t H = atoll(argv[2]), W = atoll(argv[3]);
    int64_t tile = 0;
    bool compare = false;
    cdf_dtype wdt = CDF_F32;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--tile") == 0 && i + 1 < argc) tile = atoll(argv[++i]);
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) wdt = strcmp(argv[++i], "bf16") == 0 ? CDF_BF16 : CDF_F32;
        else if (strcmp(argv[i], "--compare") == 0) compare = true;
    }
    cdf_load_options o = cdf_load_options_default();
    o.weight_dtype = wdt;
    cdf_component *vae = NULL;
    if (cdf_component_load(dir, &o, &vae) != CDF_OK) {
        fprintf(stderr, "load: %s\n", cdf_last_error());
        return 1;
    }
    cdf_device *dev = cdf_device_default();
    const int64_t C = 16;
    float *zh = smooth_latent(C, H, W);
    const int64_t shape[4] = {1, C, H, W};
    cdf_tensor *z = cdf_tensor_from_host(dev, CDF_F32, 4, shape, zh, CDF_F32);
    cdf_device_synchronize(dev);
    cdf_memory_stats st;
    cdf_device_reset_peak(dev);
    cdf_device_memory_stats(dev, &st);
    const uint64_t base = st.current_bytes;
    double t0 = now();
    cdf_tensor *img = decode(vae, z, tile);
    double t1 = now();
    if (!img) {
        fprintf(stderr, "decode: %s\n", cdf_last_error());
        return 1;
    }
    cdf_device_memory_stats(dev, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("vae-memory: latent %lldx%lld -> image %lldx%lld, %s, weights %s: device peak during decode %.3f GiB above %.3f GiB "
           "resident (total %.3f GiB), process peak RSS %.3f GiB, decode %.1f s\n",
           (long long)H, (long long)W, (long long)cdf_tensor_dim(img, 2), (long long)cdf_tensor_dim(img, 3),
           tile ? "tiled" : "untiled", wdt == CDF_BF16 ? "bf16" : "f32", (double)(st.peak_bytes - base) / (1 << 30),
           (double)base / (1 << 30), (double)st.peak_bytes / (1 << 30), (double)ru.ru_maxrss / (1 << 20), t1 - t0);
    if (tile) printf("  tiles of %lld pixels\n", (long long)tile);
    if (compare && tile) {
        cdf_tensor *ref = decode(vae, z, 0);
        if (!ref) {
            fprintf(stderr, "untiled decode: %s\n", cdf_last_error());
            return 1;
        }
        float *a = cdf_tensor_read_f32(img), *b = cdf_tensor_read_f32(ref);
        double worst = 0, sum = 0;
        const size_t n = (size_t)cdf_tensor_numel(img);
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - b[i]);
            if (d > worst) worst = d;
            sum += d;
        }
        printf("  tiled vs untiled on a smooth random latent: max |diff| %.4f, mean |diff| %.5f (image range [-1, 1])\n", worst,
               sum / (double)n);
        free(a);
        free(b);
        cdf_tensor_release(ref);
    }
    cdf_tensor_release(img);
    cdf_tensor_release(z);
    free(zh);
    cdf_component_free(vae);
    return 0;
}
