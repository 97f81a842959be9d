/* A DiT norm and its AdaLN modulation, as SD3 / FLUX run it before a bf16 projection:
 * cast(layer_norm(x) * (1 + scale) + shift, bf16) on x [2, 1024, 1536] f32 (SD3.5-Medium's image
 * stream at 512² with CFG), per call, in eager mode (four kernels) and under defer-and-fuse (one
 * fused kernel when the norm heads the chain, graph/fuse.c; two before that). Each call ends in a
 * host read of the result (6 MiB), the same in both modes. Best of 5 repetitions of 40 calls.
 *
 *   gcc -std=gnu17 -O2 -fopenmp -Iinclude -Isrc bench/kernels/bench_norm_chain.c \
 *       $(sh bench/static_link.sh build) -o build/bench_norm_chain && OMP_NUM_THREADS=2 build/bench_norm_chain */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"

enum { B = 2, L = 1024, D = 1536, CALLS = 40, REPS = 5 };

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* best ms per call in the given mode, or a negative value on an error (printed) */
static double run(cdf_exec_mode mode, cdf_tensor *x, cdf_tensor *scale, cdf_tensor *shift, uint16_t *host) {
    if (cdf_exec_set_mode(mode) != CDF_OK) return -1;
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        const double t0 = now_ms();
        for (int i = 0; i < CALLS; i++) {
            cdf_scope_push();
            cdf_tensor *n = cdf_layer_norm(x, NULL, NULL, 1e-6f);
            cdf_tensor *y = cdf_cast(cdf_add(cdf_mul(n, cdf_add_scalar(scale, 1.0f)), shift), CDF_BF16);
            cdf_scope_pop(&y, 1);
            const cdf_status s = y ? cdf_tensor_read(y, CDF_BF16, host, sizeof(uint16_t) * B * L * D) : cdf_last_status();
            cdf_tensor_release(y);
            if (s != CDF_OK) {
                fprintf(stderr, "bench_norm_chain: %s\n", cdf_last_error());
                return -1;
            }
        }
        const double ms = (now_ms() - t0) / CALLS;
        if (ms < best) best = ms;
    }
    return best;
}

int main(void) {
    cdf_device *cpu = cdf_device_get("cpu");
    float *v = malloc(sizeof(float) * B * L * D);
    uint16_t *host = malloc(sizeof(uint16_t) * B * L * D);
    if (!cpu || !v || !host) {
        fprintf(stderr, "bench_norm_chain: no cpu device or out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < (int64_t)B * L * D; i++) v[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    const int64_t xs[3] = {B, L, D}, ms[3] = {B, 1, D};
    cdf_tensor *x = cdf_tensor_from_host(cpu, CDF_F32, 3, xs, v, CDF_F32);
    cdf_tensor *scale = cdf_tensor_from_host(cpu, CDF_F32, 3, ms, v + 7, CDF_F32);
    cdf_tensor *shift = cdf_tensor_from_host(cpu, CDF_F32, 3, ms, v + 5000, CDF_F32);
    if (!x || !scale || !shift) {
        fprintf(stderr, "bench_norm_chain: %s\n", cdf_last_error());
        return 1;
    }
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    const double fused = run(CDF_EXEC_DEFER_AND_FUSE, x, scale, shift, host);
    cdf_exec_get_stats(&s1);
    const double eager = run(CDF_EXEC_EAGER, x, scale, shift, host);
    if (fused < 0 || eager < 0) return 1;
    printf("norm + modulation + bf16 cast on [%d, %d, %d] f32: eager %.3f ms, defer-and-fuse %.3f ms per call "
           "(defer-and-fuse: %.2f kernels per call, %.2f of them a fused kernel headed by the norm)\n",
           B, L, D, eager, fused, (double)(s1.kernels_launched - s0.kernels_launched) / (REPS * CALLS),
           (double)(s1.fused_norms - s0.fused_norms) / (REPS * CALLS));
    cdf_tensor_release(x);
    cdf_tensor_release(scale);
    cdf_tensor_release(shift);
    free(v);
    free(host);
    return 0;
}
