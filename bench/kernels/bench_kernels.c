/* Matmul throughput: fast paths (src/kernels/fast_onednn.c) vs the reference kernel, at the
 * shapes the DiT models run, plus register-only peaks of the CPU for scale.
 *
 *   bench_kernels [--quick | --verbose-probe | --attention [--no-reference] | --attention-bf16 [--quick] |
 *                  --gemm [--quick] | --quant [rounds [shape name part]] | --bf16 [rounds [shape name part]]]   (built and run by bench/kernels/run.sh)
 *
 * Linear layers are timed as the models call them: A = activations [M, K] f32, B = weight
 * [N, K] (trans_b), C f32. "bf16" = bf16 weights: the fast path rounds A to bf16 and runs
 * bf16 x bf16 -> f32; the reference keeps A in f32 and widens B (same inputs, f32 compute).
 * "f32" = f32 weights, f32 everywhere. Times are the best of repeated calls (the reference: one
 * call, it is slow). TFLOP/s = 2*batch*M*N*K / time; "x ref" = reference
 * time / fast time for the same shape and weight dtype. The first fast call (primitive
 * creation, weight prepack) is reported separately and not averaged in. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/io.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/fast_onednn.h"
#include "kernels/gemm_bf16w.h"
#include "kernels/gemm_vdpbf16.h"
#include "kernels/kernels.h"
#include "kernels/pack_cache.h"
#include "peak.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a shared machine, work per CPU-second is
 * what the load does not change much, where wall time is mostly the others' load. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

typedef struct shape {
    const char *name;
    int64_t batch, M, N, K;
    bool trans_b;
    bool attention; /* batched activations x activations (B per batch, f32 only) */
} shape;

typedef enum { RUN_REFERENCE, RUN_FAST } run_kind;

/* Best (minimum) seconds per call over calls made for >= min_s (at least 1, at most max_reps):
 * the machine may be shared, the minimum is the least disturbed call. *first_s gets the first
 * call's time when warm (fast path: primitive creation / prepack), which is excluded. */
static double time_matmul(const cdf_k_matmul_args *x, run_kind kind, bool warm, double min_s, int max_reps,
                          double *first_s) {
    bool handled = true;
    if (warm) {
        double t0 = now_s();
        cdf_status s = kind == RUN_FAST ? cdf_k_matmul_fast(x, &handled) : cdf_k_matmul(x);
        *first_s = now_s() - t0;
        if (s != CDF_OK || !handled) return -1.0;
    }
    int reps = 0;
    double t0 = now_s(), best = 1e30;
    do {
        double t1 = now_s();
        cdf_status s = kind == RUN_FAST ? cdf_k_matmul_fast(x, &handled) : cdf_k_matmul(x);
        if (s != CDF_OK || !handled) return -1.0;
        double t = now_s() - t1;
        if (t < best) best = t;
        reps++;
    } while (now_s() - t0 < min_s && reps < max_reps);
    return best;
}

static void bench_shape(const shape *s, bool quick) {
    const int64_t bA = s->batch, bB = s->attention ? s->batch : 1;
    const size_t na = (size_t)(bA * s->M * s->K), nb = (size_t)(bB * s->K * s->N), nc = (size_t)(s->batch * s->M * s->N);
    float *a = malloc(sizeof(float) * na), *bf = malloc(sizeof(float) * nb), *c = malloc(sizeof(float) * nc);
    uint16_t *bh = malloc(sizeof(uint16_t) * nb);
    if (!a || !bf || !c || !bh) {
        printf("| %s | out of memory |\n", s->name);
        free(a); free(bf); free(c); free(bh);
        return;
    }
    for (size_t i = 0; i < na; i++) a[i] = frand();
    for (size_t i = 0; i < nb; i++) bf[i] = frand() * 0.05f;
    cdf_convert(bh, CDF_BF16, bf, CDF_F32, nb);
    const double flop = 2.0 * (double)s->batch * (double)s->M * (double)s->N * (double)s->K;
    cdf_k_matmul_args x = {.batch = s->batch, .M = s->M, .N = s->N, .K = s->K, .a = a, .a_dt = CDF_F32,
                           .lda = s->K, .sa = s->M * s->K, .trans_b = s->trans_b,
                           .ldb = s->trans_b ? s->K : s->N, .sb = s->attention ? s->K * s->N : 0,
                           .c = c, .c_dt = CDF_F32, .ldc = s->N, .sc = s->M * s->N, .alpha = 1.0f};
    const double min_s = quick ? 0.3 : 1.0;
    const int ref_reps = 1;
    for (int wdt = 0; wdt < 2; wdt++) {
        if (s->attention && wdt == 0) continue; /* activations x activations: f32 only */
        const bool bf16 = wdt == 0;
        x.b = bf16 ? (const void *)bh : (const void *)bf;
        x.b_dt = bf16 ? CDF_BF16 : CDF_F32;
        const char *wname = bf16 ? "bf16" : "f32";
        double first = 0.0;
        double t_ref = time_matmul(&x, RUN_REFERENCE, false, 0.0, ref_reps, &first);
        cdf_k_fast_clear();
        cdf_k_pack_set_limit((size_t)8 << 30);
        double first_packed = 0.0;
        double t_fast = time_matmul(&x, RUN_FAST, true, min_s, 20, &first_packed);
        cdf_k_fast_stats st;
        cdf_k_fast_get_stats(&st);
        printf("| %s | %s | reference | %.2f | %.3f | 1.00 | |\n", s->name, wname, t_ref * 1e3, flop / t_ref * 1e-12);
        if (t_fast < 0) {
            printf("| %s | %s | fast | declined | | | |\n", s->name, wname);
            continue;
        }
        printf("| %s | %s | fast%s | %.2f | %.3f | %.2f | %s, first call %.0f ms |\n", s->name, wname,
               bf16 && !s->attention ? " (prepacked W)" : "", t_fast * 1e3, flop / t_fast * 1e-12, t_ref / t_fast,
               st.last_impl, first_packed * 1e3);
        if (bf16) { /* the same without a prepacked copy: weights reordered on every call */
            cdf_k_fast_clear();
            cdf_k_pack_set_limit(0);
            double first_np = 0.0, t_np = time_matmul(&x, RUN_FAST, true, min_s, 20, &first_np);
            if (t_np > 0)
                printf("| %s | %s | fast (no prepack) | %.2f | %.3f | %.2f | |\n", s->name, wname, t_np * 1e3,
                       flop / t_np * 1e-12, t_ref / t_np);
            cdf_k_pack_set_limit((size_t)8 << 30);
        }
        fflush(stdout);
    }
    cdf_k_fast_clear();
    free(a); free(bf); free(c); free(bh);
}

typedef struct conv_shape {
    const char *name;
    int64_t n, cin, h, w, cout, k, pad;
} conv_shape;

static double time_conv(const cdf_k_conv2d_args *a, run_kind kind, double min_s, int max_reps) {
    bool handled = true;
    int reps = 0;
    double t0 = now_s(), best = 1e30;
    do {
        double t1 = now_s();
        cdf_status s = kind == RUN_FAST ? cdf_k_conv2d_fast(a, &handled) : cdf_k_conv2d(a);
        if (s != CDF_OK || !handled) return -1.0;
        double t = now_s() - t1;
        if (t < best) best = t;
        reps++;
    } while (now_s() - t0 < min_s && reps < max_reps);
    return best;
}

static void bench_conv(const conv_shape *s, bool quick) {
    const size_t nx = (size_t)(s->n * s->cin * s->h * s->w), nw = (size_t)(s->cout * s->cin * s->k * s->k);
    const int64_t oh = s->h + 2 * s->pad - s->k + 1, ow = s->w + 2 * s->pad - s->k + 1;
    const size_t no = (size_t)(s->n * s->cout * oh * ow);
    float *x = malloc(sizeof(float) * nx), *wf = malloc(sizeof(float) * nw), *out = malloc(sizeof(float) * no);
    float *bias = calloc((size_t)s->cout, sizeof(float));
    uint16_t *wh = malloc(sizeof(uint16_t) * nw);
    if (!x || !wf || !out || !bias || !wh) {
        printf("| %s | out of memory |\n", s->name);
        free(x); free(wf); free(out); free(bias); free(wh);
        return;
    }
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    for (size_t i = 0; i < nw; i++) wf[i] = frand() * 0.05f;
    cdf_convert(wh, CDF_BF16, wf, CDF_F32, nw);
    const double flop = 2.0 * (double)no * (double)(s->cin * s->k * s->k);
    cdf_k_conv2d_args a = {.n = s->n, .cin = s->cin, .h = s->h, .w = s->w, .cout = s->cout, .kh = s->k, .kw = s->k,
                           .stride_h = 1, .stride_w = 1, .pad_h = s->pad, .pad_w = s->pad, .dil_h = 1, .dil_w = 1,
                           .groups = 1, .x = x, .x_dt = CDF_F32, .bias = bias, .b_dt = CDF_F32, .out = out,
                           .out_dt = CDF_F32};
    for (int wdt = 0; wdt < 2; wdt++) {
        const bool bf16 = wdt == 0;
        a.weight = bf16 ? (const void *)wh : (const void *)wf;
        a.w_dt = bf16 ? CDF_BF16 : CDF_F32;
        const char *wname = bf16 ? "bf16" : "f32";
        double t_ref = time_conv(&a, RUN_REFERENCE, 0.0, 1);
        cdf_k_fast_clear();
        double t0 = now_s();
        bool handled = false;
        cdf_k_conv2d_fast(&a, &handled);
        double first = now_s() - t0;
        double t_fast = handled ? time_conv(&a, RUN_FAST, quick ? 0.3 : 1.0, 20) : -1.0;
        cdf_k_fast_stats st;
        cdf_k_fast_get_stats(&st);
        printf("| %s | %s | reference | %.2f | %.3f | 1.00 | |\n", s->name, wname, t_ref * 1e3, flop / t_ref * 1e-12);
        if (t_fast < 0)
            printf("| %s | %s | fast | declined | | | |\n", s->name, wname);
        else
            printf("| %s | %s | fast | %.2f | %.3f | %.2f | %s, first call %.0f ms |\n", s->name, wname,
                   t_fast * 1e3, flop / t_fast * 1e-12, t_ref / t_fast, st.last_impl, first * 1e3);
        fflush(stdout);
    }
    cdf_k_fast_clear();
    free(x); free(wf); free(out); free(bias); free(wh);
}

/* One fast call per path, for ONEDNN_VERBOSE=1 to name the implementations. */
static void verbose_probe(void) {
    const int64_t M = 4429, K = 1536, N = 1536;
    float *a = calloc((size_t)(M * K), 4), *bf = calloc((size_t)(N * K), 4), *c = calloc((size_t)(M * N), 4);
    uint16_t *bh = calloc((size_t)(N * K), 2);
    if (!a || !bf || !c || !bh) return;
    cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .lda = K, .b = bh,
                           .b_dt = CDF_BF16, .ldb = K, .trans_b = true, .c = c, .c_dt = CDF_F32, .ldc = N,
                           .alpha = 1.0f};
    bool handled;
    cdf_k_matmul_fast(&x, &handled);
    x.b = bf;
    x.b_dt = CDF_F32;
    cdf_k_matmul_fast(&x, &handled);
    free(a); free(bf); free(c); free(bh);
    const int64_t C = 128, H = 64;
    float *xi = calloc((size_t)(C * H * H), 4), *w = calloc((size_t)(C * C * 9), 4), *o = calloc((size_t)(C * H * H), 4);
    uint16_t *wh = calloc((size_t)(C * C * 9), 2);
    if (!xi || !w || !o || !wh) return;
    cdf_k_conv2d_args cv = {.n = 1, .cin = C, .h = H, .w = H, .cout = C, .kh = 3, .kw = 3, .stride_h = 1,
                            .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1, .x = xi,
                            .x_dt = CDF_F32, .weight = wh, .w_dt = CDF_BF16, .out = o, .out_dt = CDF_F32};
    cdf_k_conv2d_fast(&cv, &handled);
    cv.weight = w;
    cv.w_dt = CDF_F32;
    cdf_k_conv2d_fast(&cv, &handled);
    free(xi); free(w); free(o); free(wh);
}

/* ---- attention --------------------------------------------------------------------------- */

typedef struct att_shape {
    const char *name;
    int64_t b, h, l, d;
    bool reference; /* also time the reference kernel (one call) */
} att_shape;

static double cpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* self-attention over s's shape: f32 q/k/v in the [B, L, H, D] layout, out f32 */
static cdf_k_attention_args att_args(const att_shape *s, const float *q, const float *k, const float *v, float *o) {
    const int64_t sl = s->h * s->d, sb = s->l * sl;
    return (cdf_k_attention_args){.b = s->b, .h = s->h, .lq = s->l, .lk = s->l, .d = s->d, .dv = s->d,
                                  .q = q, .q_dt = CDF_F32, .q_sb = sb, .q_sh = s->d, .q_sl = sl,
                                  .k = k, .k_dt = CDF_F32, .k_sb = sb, .k_sh = s->d, .k_sl = sl,
                                  .v = v, .v_dt = CDF_F32, .v_sb = sb, .v_sh = s->d, .v_sl = sl,
                                  .out = o, .out_dt = CDF_F32, .scale = 0.125f};
}

/* best of repeated calls of the fast kernel at `isa` (< 0: the reference kernel, one call);
 * *cpu_s: the least process CPU time of a call (all threads; a descheduled thread costs none) */
static double time_attention(const cdf_k_attention_args *a, int isa, double min_s, double *cpu_s) {
    double best = 1e30, spent = 0.0;
    *cpu_s = 1e30;
    for (int rep = 0; rep < 50 && (rep < 2 || spent < min_s); rep++) {
        double t0 = now_s(), c0 = cpu_now_s();
        bool handled = true;
        if (isa < 0)
            cdf_k_attention(a);
        else
            cdf_k_attention_fast_at(a, (cdf_k_isa)isa, &handled);
        double t = now_s() - t0, c = cpu_now_s() - c0;
        if (!handled) return -1.0;
        spent += t;
        if (t < best) best = t;
        if (c < *cpu_s) *cpu_s = c;
        if (isa < 0) break;
    }
    return best;
}

/* Self-attention over L tokens (image + text, as SD3/FLUX joint attention), q/k/v f32 in the
 * [B, L, H, D] layout the models' fused projections produce, no mask. FLOP = 4 B H L^2 D. */
static void bench_attention(const att_shape *s, bool quick, bool no_ref, double peak, double peak_cpu) {
    const int64_t n = s->b * s->l * s->h * s->d;
    float *q = malloc(sizeof(float) * (size_t)n), *k = malloc(sizeof(float) * (size_t)n);
    float *v = malloc(sizeof(float) * (size_t)n), *o = malloc(sizeof(float) * (size_t)n);
    if (!q || !k || !v || !o) {
        printf("| %s | out of memory | | | | |\n", s->name);
        free(q), free(k), free(v), free(o);
        return;
    }
    for (int64_t i = 0; i < n; i++) q[i] = frand(), k[i] = frand(), v[i] = frand();
    cdf_k_attention_args a = att_args(s, q, k, v, o);
    const double flop = 4.0 * (double)s->b * (double)s->h * (double)s->l * (double)s->l * (double)s->d;
    const double min_s = quick ? 0.3 : 1.0;
    double c_ref;
    const double t_ref = s->reference && !quick && !no_ref ? time_attention(&a, -1, 0, &c_ref) : -1.0;
    const cdf_k_isa native = cdf_k_isa_native();
    const double lxl_mb = 4.0 * (double)s->b * (double)s->h * (double)s->l * (double)s->l / 1048576.0;
    if (t_ref > 0)
        printf("| %s | reference (plain C) | %.1f | %.3f | 1.00 | |\n", s->name, t_ref * 1e3, flop / t_ref * 1e-12);
    for (int isa = CDF_K_ISA_AVX2; isa <= (int)native && isa <= CDF_K_ISA_AVX512; isa++) {
        double c;
        const double t = time_attention(&a, isa, min_s, &c);
        if (t < 0) continue;
        char ratio[32] = "";
        if (t_ref > 0) snprintf(ratio, sizeof ratio, "%.2f", t_ref / t);
        char pk[160] = "";
        if (peak > 0)
            snprintf(pk, sizeof pk, "%.0f%% of the f32 FMA peak; per CPU-second %.3f TFLOP/s = %.0f%% of the 1-thread peak; ",
                     100.0 * flop / t / peak, flop / c * 1e-12, 100.0 * flop / c / peak_cpu);
        printf("| %s | fast f32 %s | %.1f | %.3f | %s | %sL x L scores would be %.0f MB; none allocated |\n", s->name,
               cdf_k_isa_name((cdf_k_isa)isa), t * 1e3, flop / t * 1e-12, ratio, pk, lxl_mb);
    }
    free(q), free(k), free(v), free(o);
}

/* f32 vs bf16 q/k/v (the bf16 attention policy, kernels.h) at each level this CPU has, the two
 * timed alternately (rounds of f32 then bf16, best of each) so that load changes hit both: the
 * bf16 rows run vdpbf16ps at avx512_bf16, the f32 body with P rounded below; where AMX is usable
 * the avx512_bf16 level's bf16 row is the AMX body and a third row, timed in the same rounds, the
 * vdpbf16ps body (CDIFFUSERS_AMX_ATTENTION=0's). `dp`, `amx`: the all-thread vdpbf16ps and AMX
 * register peaks measured just before (0: none). */
static void bench_attention_bf16(const att_shape *s, bool quick, double dp, double amx) {
    const int64_t n = s->b * s->l * s->h * s->d;
    float *q = malloc(sizeof(float) * (size_t)n), *k = malloc(sizeof(float) * (size_t)n);
    float *v = malloc(sizeof(float) * (size_t)n), *o = malloc(sizeof(float) * (size_t)n);
    uint16_t *qb = malloc(2 * (size_t)n), *kb = malloc(2 * (size_t)n), *vb = malloc(2 * (size_t)n);
    if (!q || !k || !v || !o || !qb || !kb || !vb) {
        printf("| %s | out of memory | | | | |\n", s->name);
        free(q), free(k), free(v), free(o), free(qb), free(kb), free(vb);
        return;
    }
    /* the same (bf16-representable) values in both runs */
    for (int64_t i = 0; i < n; i++) {
        qb[i] = cdf_f32_to_bf16(frand()), kb[i] = cdf_f32_to_bf16(frand()), vb[i] = cdf_f32_to_bf16(frand());
        q[i] = cdf_bf16_to_f32(qb[i]), k[i] = cdf_bf16_to_f32(kb[i]), v[i] = cdf_bf16_to_f32(vb[i]);
    }
    cdf_k_attention_args a = att_args(s, q, k, v, o);
    cdf_k_attention_args ab = a;
    ab.q = qb, ab.k = kb, ab.v = vb, ab.q_dt = ab.k_dt = ab.v_dt = CDF_BF16;
    const double flop = 4.0 * (double)s->b * (double)s->h * (double)s->l * (double)s->l * (double)s->d;
    const double min_s = quick ? 0.2 : 0.5;
    for (int isa = CDF_K_ISA_AVX2; isa <= (int)cdf_k_isa_native(); isa++) {
        const bool two = isa >= CDF_K_ISA_AVX512_BF16 && cdf_k_amx_usable(); /* AMX and vdpbf16ps bodies */
        double tf = 1e30, tb = 1e30, tv = 1e30, c;
        for (int round = 0; round < 3; round++) {
            const double t1 = time_attention(&a, isa, min_s, &c), t2 = time_attention(&ab, isa, min_s, &c);
            if (t1 < 0 || t2 < 0) break;
            if (t1 < tf) tf = t1;
            if (t2 < tb) tb = t2;
            if (two) {
                cdf_k_attention_amx_set(0);
                const double t3 = time_attention(&ab, isa, min_s, &c);
                cdf_k_attention_amx_set(-1);
                if (t3 > 0 && t3 < tv) tv = t3;
            }
        }
        if (tf >= 1e30) continue;
        char pk[64] = "", pv[64] = "";
        if (two && amx > 0)
            snprintf(pk, sizeof pk, "; bf16 at %.0f%% of the AMX peak", 100.0 * flop / tb / amx);
        else if (dp > 0)
            snprintf(pk, sizeof pk, "; bf16 at %.0f%% of the vdpbf16ps peak", 100.0 * flop / tb / dp);
        if (dp > 0 && tv < 1e30) snprintf(pv, sizeof pv, "; at %.0f%% of the vdpbf16ps peak", 100.0 * flop / tv / dp);
        printf("| %s | %s: f32 q/k/v | %.1f | %.3f | | |\n", s->name, cdf_k_isa_name((cdf_k_isa)isa), tf * 1e3,
               flop / tf * 1e-12);
        printf("| %s | %s: bf16 q/k/v%s | %.1f | %.3f | | f32 / bf16 time %.2fx%s |\n", s->name,
               cdf_k_isa_name((cdf_k_isa)isa),
               two ? " (AMX tiles)" : isa >= CDF_K_ISA_AVX512_BF16 ? " (vdpbf16ps)" : " (f32 body, P rounded)", tb * 1e3,
               flop / tb * 1e-12, tf / tb, pk);
        if (tv < 1e30)
            printf("| %s | %s: bf16 q/k/v (vdpbf16ps, AMX off) | %.1f | %.3f | | AMX body %.2fx faster%s |\n", s->name,
                   cdf_k_isa_name((cdf_k_isa)isa), tv * 1e3, flop / tv * 1e-12, tv / tb, pv);
    }
    free(q), free(k), free(v), free(o), free(qb), free(kb), free(vb);
}

static void print_peaks(const cdf_k_fast_info *info) {
    const int nthr = omp_get_max_threads();
    const int64_t iters = 50000000;
    double one, all = 0.0;
    if (info->avx512_core) {
        one = peak_f32_fma(iters);
#pragma omp parallel reduction(+ : all)
        all += peak_f32_fma(iters);
        printf("| f32 FMA (AVX-512 vfmadd231ps) | %.3f | %.3f |\n", one * 1e-12, all * 1e-12);
    } else if (cdf_k_isa_native() >= CDF_K_ISA_AVX2) {
        one = peak_f32_fma_avx2(iters);
#pragma omp parallel reduction(+ : all)
        all += peak_f32_fma_avx2(iters);
        printf("| f32 FMA (AVX2 vfmadd231ps) | %.3f | %.3f |\n", one * 1e-12, all * 1e-12);
    }
    if (info->avx512_bf16) {
        all = 0.0;
        one = peak_bf16_dp(iters);
#pragma omp parallel reduction(+ : all)
        all += peak_bf16_dp(iters);
        printf("| bf16 dot product (AVX512-BF16 vdpbf16ps) | %.3f | %.3f |\n", one * 1e-12, all * 1e-12);
    }
    if (info->amx_bf16 && info->amx_permitted) {
        all = 0.0;
        one = peak_amx_bf16(iters / 8);
#pragma omp parallel reduction(+ : all)
        all += peak_amx_bf16(iters / 8);
        printf("| AMX-BF16 (tdpbf16ps) | %.3f | %.3f |\n", one * 1e-12, all * 1e-12);
    } else {
        printf("| AMX-BF16 (tdpbf16ps) | n/a: %s | |\n",
               info->amx_bf16 ? "AMX permission refused" : "this CPU has no AMX");
    }
    printf("\n(%d OpenMP threads for the all-threads column)\n", nthr);
}

/* --attention-bf16: f32 vs bf16 q/k/v at SD3.5-M's and FLUX's 512x512 shapes */
static void bench_attention_bf16_all(bool quick) {
    const att_shape atts[] = {
        {"SD3.5-M 512x512 CFG: B2 H24 L1357 (1024+333) D64", 2, 24, 1357, 64, false},
        {"FLUX 512x512: B1 H24 L1536 (1024+512) D128", 1, 24, 1536, 128, false},
    };
    printf("\n### Attention, f32 vs bf16 q/k/v (self-attention [B, L, H, D], no mask; FLOP = 4 B H L^2 D)\n\n"
           "| shape | level: operands | ms | TFLOP/s | | notes |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof atts / sizeof *atts; i++) {
        double dp = 0.0, amx = 0.0;
        const cdf_k_cpu_features *f = cdf_k_cpu();
        if (f->avx512_bf16) {
#pragma omp parallel reduction(+ : dp)
            dp += peak_bf16_dp(20000000);
        }
        if (cdf_k_amx_usable()) {
#pragma omp parallel reduction(+ : amx)
            amx += peak_amx_bf16(2000000);
        }
        printf("| (all-thread peaks just before: vdpbf16ps %.3f, AMX %.3f TFLOP/s) | | | | | |\n", dp * 1e-12,
               amx * 1e-12);
        bench_attention_bf16(&atts[i], quick, dp, amx);
    }
}

static void bench_attention_all(bool quick, bool no_ref) {
    const att_shape atts[] = {
        {"SD3.5-M 512x512 CFG: B2 H24 L1357 (1024+333) D64", 2, 24, 1357, 64, true},
        {"FLUX 512x512: B1 H24 L1536 (1024+512) D128", 1, 24, 1536, 128, true},
        {"FLUX 1024x1024: B1 H24 L4608 (4096+512) D128", 1, 24, 4608, 128, false},
    };
    printf("\n### Attention (self-attention, f32 q/k/v [B, L, H, D], no mask; FLOP = 4 B H L^2 D)\n\n"
           "| shape | path | ms | TFLOP/s | x ref | notes |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < (quick ? 1 : sizeof atts / sizeof *atts); i++) {
        /* the register peaks right before, under the same machine load, to read the figures against */
        double fma = 0.0, dp = 0.0;
        const cdf_k_cpu_features *f = cdf_k_cpu();
#pragma omp parallel reduction(+ : fma, dp)
        {
            if (f->avx512_core)
                fma += peak_f32_fma(20000000);
            else if (cdf_k_isa_native() >= CDF_K_ISA_AVX2)
                fma += peak_f32_fma_avx2(20000000);
            if (f->avx512_bf16) dp += peak_bf16_dp(20000000);
        }
        /* and the 1-thread f32 FMA peak per CPU-second, for the per-CPU-second figures */
        peak_use_cpu_time(1);
        const double fma_cpu = f->avx512_core                       ? peak_f32_fma(20000000)
                               : cdf_k_isa_native() >= CDF_K_ISA_AVX2 ? peak_f32_fma_avx2(20000000)
                                                                      : 0.0;
        peak_use_cpu_time(0);
        printf("| (all-thread peaks just before: f32 FMA (%s) %.3f, bf16 vdpbf16ps %.3f TFLOP/s; f32 FMA per CPU-second "
               "of one thread %.3f) | | | | | |\n",
               f->avx512_core ? "AVX-512" : "AVX2", fma * 1e-12, dp * 1e-12, fma_cpu * 1e-12);
        bench_attention(&atts[i], quick, no_ref, fma, fma_cpu);
    }
}

/* ---- own bf16-weight GEMM vs the oneDNN policy path (AVX2 level) ---------------------------- */

/* The bf16 policy as the dispatch ran it before the own GEMM (dispatch.c round_matmul_a, then
 * oneDNN f32 on its prepacked f32 copy of the weights): A rounded into a bf16 buffer per call. */
static bool onednn_policy(const cdf_k_matmul_args *x) {
    const int64_t n = x->M * x->K;
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)n);
    if (!buf) return false;
    const float *a = x->a;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x->M; i++)
        for (int64_t p = 0; p < x->K; p++) buf[i * x->K + p] = cdf_f32_to_bf16(a[i * x->lda + p]);
    cdf_k_matmul_args r = *x;
    r.a = buf;
    r.a_dt = CDF_BF16;
    r.lda = x->K;
    bool handled = false;
    cdf_status s = cdf_k_matmul_fast(&r, &handled);
    free(buf);
    return s == CDF_OK && handled;
}

static bool own_gemm(const cdf_k_matmul_args *x) {
    bool handled = false;
    return cdf_k_gemm_bf16w(x, &handled) == CDF_OK && handled;
}

/* The AVX2 FMA register loop on every thread: FLOP per CPU-second of the process. */
static double peak_avx2_per_cpu_s(void) {
    const int64_t iters = 20000000;
    const double c0 = cpu_s();
    int nthr = 1;
#pragma omp parallel
    {
        peak_f32_fma_avx2(iters);
#pragma omp single
        nthr = omp_get_num_threads();
    }
    return (double)nthr * (double)iters * 12 * 8 * 2 / (cpu_s() - c0);
}

/* One call: wall and CPU seconds into *wall / *cpu when lower than what they hold. */
static bool timed(bool (*f)(const cdf_k_matmul_args *), const cdf_k_matmul_args *x, double *wall, double *cpu) {
    const double t0 = now_s(), c0 = cpu_s();
    const bool ok = f(x);
    const double t = now_s() - t0, c = cpu_s() - c0;
    if (t < *wall) *wall = t;
    if (c < *cpu) *cpu = c;
    return ok;
}

/* Alternates the two paths `rounds` times after one warm-up call each (weights packed there);
 * prints best wall times and their ratio, and FLOP per CPU-second (all threads, OpenMP waits
 * included) as % of the AVX2 FMA register loop's FLOP per CPU-second measured right before. */
static void bench_gemm_shape(const char *name, int64_t M, int64_t K, int64_t N, int rounds) {
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *c = malloc(sizeof(float) * (size_t)(M * N));
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(N * K));
    float *bias = malloc(sizeof(float) * (size_t)N);
    if (!a || !b || !c || !bias) {
        printf("| %s | out of memory |\n", name);
        free(a), free(b), free(c), free(bias);
        return;
    }
    for (int64_t i = 0; i < M * K; i++) a[i] = frand();
    for (int64_t i = 0; i < N * K; i++) b[i] = cdf_f32_to_bf16(frand() * 0.05f);
    for (int64_t i = 0; i < N; i++) bias[i] = frand();
    cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .lda = K, .b = b,
                           .b_dt = CDF_BF16, .ldb = K, .trans_b = true, .bias = bias, .bias_dt = CDF_F32, .c = c,
                           .c_dt = CDF_F32, .ldc = N, .alpha = 1.0f};
    cdf_k_fast_clear();
    cdf_k_pack_set_limit((size_t)8 << 30);
    const double peak = peak_avx2_per_cpu_s();
    double first_d = 1e30, first_o = 1e30, cpu_first = 1e30;
    bool ok_d = timed(onednn_policy, &x, &first_d, &cpu_first);
    bool ok_o = timed(own_gemm, &x, &first_o, &cpu_first);
    double best_d = 1e30, best_o = 1e30, cpu_d = 1e30, cpu_o = 1e30;
    for (int r = 0; r < rounds && ok_d && ok_o; r++) {
        ok_d = timed(onednn_policy, &x, &best_d, &cpu_d);
        ok_o = timed(own_gemm, &x, &best_o, &cpu_o);
    }
    cdf_k_fast_stats fs;
    cdf_k_fast_get_stats(&fs);
    cdf_k_gemm_bf16w_stats gs;
    cdf_k_gemm_bf16w_get_stats(&gs);
    if (!ok_d || !ok_o) {
        printf("| %s | failed (oneDNN %d, own %d) |\n", name, ok_d, ok_o);
    } else {
        const double flop = 2.0 * (double)M * (double)N * (double)K;
        printf("| %s | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.0f%% | **%.2f** | %.0f / %.0f | %.0f / %.0f |\n", name,
               best_d * 1e3, flop / cpu_d * 1e-9, 100.0 * flop / cpu_d / peak, best_o * 1e3, flop / cpu_o * 1e-9,
               100.0 * flop / cpu_o / peak, best_d / best_o, first_d * 1e3, first_o * 1e3,
               (double)fs.packed_bytes / 1048576.0, (double)gs.packed_bytes / 1048576.0);
    }
    cdf_k_fast_clear();
    free(a), free(b), free(c), free(bias);
}

static void bench_gemm_all(bool quick) {
    printf("### Own bf16-weight GEMM vs oneDNN (bf16 policy at the AVX2 level), %d OpenMP threads\n\n",
           omp_get_max_threads());
    printf("A f32 [M, K] (rounded to bf16 by either path), weight bf16 [N, K], f32 bias, C f32. oneDNN = the\n"
           "path before (A rounded into a bf16 buffer, oneDNN f32 matmul on its prepacked f32 copy of the\n"
           "weight); own = gemm_bf16w.c (A rounded while packed, weight prepacked in bf16 panels). Best of\n"
           "alternated calls after one warm-up call each (first: pack included). GFLOP/CPU-s = per CPU-second of\n"
           "all threads (OpenMP waits included); %% peak = that over the AVX2 FMA register loop's GFLOP per\n"
           "CPU-second on all threads, measured just before each shape.\n\n");
    printf("| shape M x K -> N | oneDNN ms | GFLOP/CPU-s | %% peak | own ms | GFLOP/CPU-s | %% peak | own speed-up (wall) | first call ms "
           "oneDNN / own | packed weight MiB oneDNN / own |\n|---|---|---|---|---|---|---|---|---|---|\n");
    struct { const char *name; int64_t M, K, N; int rounds; } shapes[] = {
        {"SD3.5-M proj 2048x1536->1536", 2048, 1536, 1536, 5},
        {"SD3.5-M MLP up 2048x1536->6144", 2048, 1536, 6144, 3},
        {"SD3.5-M MLP down 2048x6144->1536", 2048, 6144, 1536, 3},
        {"FLUX proj 4429x3072->3072", 4429, 3072, 3072, 2},
        {"FLUX MLP up 4429x3072->12288", 4429, 3072, 12288, 1},
        {"FLUX MLP down 4429x12288->3072", 4429, 12288, 3072, 1},
        {"context 333x1536->6144", 333, 1536, 6144, 5},
        {"T5 77x4096->4096", 77, 4096, 4096, 5},
        {"CLIP 77x768->3072", 77, 768, 3072, 5},
        {"AdaLN 2x1536->9216", 2, 1536, 9216, 5},
    };
    const int n = quick ? 2 : (int)(sizeof shapes / sizeof *shapes);
    for (int i = 0; i < n; i++) bench_gemm_shape(shapes[i].name, shapes[i].M, shapes[i].K, shapes[i].N, shapes[i].rounds);
}

/* ---- Q8_0 weights: decode + oneDNN, the own Q8_0 GEMM, against bf16 weights (prepacked) ---- */

typedef struct quant_case {
    cdf_k_matmul_args bf16; /* bf16 weights: oneDNN, prepacked once */
    cdf_k_matmul_q_args q;  /* the same weights as Q8_0 */
} quant_case;

static int quant_path(const quant_case *qc, int path) {
    if (path == 0) {
        bool handled = false;
        return cdf_k_matmul_fast(&qc->bf16, &handled) == CDF_OK && handled;
    }
    cdf_k_matmul_q_set_own_gemm(path == 2 ? 2 : 0); /* own: forced outside its M range too */
    cdf_k_matmul_q_set_int8(path == 3 ? 2 : 0);     /* int8: likewise */
    const int ok = cdf_k_matmul_q(&qc->q) == CDF_OK;
    cdf_k_matmul_q_set_own_gemm(-1);
    cdf_k_matmul_q_set_int8(-1);
    return ok;
}

/* Alternates bf16 / Q8_0 panels / Q8_0 own GEMM / Q8_0 int8 GEMM `rounds` times after a warm-up call each; best
 * wall time per path, GFLOP/s and % of the vdpbf16ps register peak on all threads. */
static void bench_quant_shape(const char *name, int64_t M, int64_t K, int64_t N, int rounds, double peak) {
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *wf = malloc(sizeof(float) * (size_t)(N * K));
    float *c[4] = {malloc(sizeof(float) * (size_t)(M * N)), malloc(sizeof(float) * (size_t)(M * N)),
                   malloc(sizeof(float) * (size_t)(M * N)), malloc(sizeof(float) * (size_t)(M * N))};
    uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
    uint8_t *wq = malloc((size_t)(N * K / 32 * 34));
    float *bias = malloc(sizeof(float) * (size_t)N);
    if (!a || !wf || !c[0] || !c[1] || !c[2] || !c[3] || !wb || !wq || !bias) {
        printf("| %s | out of memory |\n", name);
        return;
    }
    for (int64_t i = 0; i < M * K; i++) a[i] = frand();
    for (int64_t i = 0; i < N * K; i++) wf[i] = frand() * 0.05f;
    for (int64_t i = 0; i < N; i++) bias[i] = frand();
    if (cdf_ggml_quantize(CDF_GGML_Q8_0, wf, N * K, wq) != CDF_OK || cdf_ggml_dequantize(CDF_GGML_Q8_0, wq, N * K, wf) != CDF_OK) {
        printf("| %s | quantize failed |\n", name);
        return;
    }
    for (int64_t i = 0; i < N * K; i++) wb[i] = cdf_f32_to_bf16(wf[i]);
    free(wf);
    quant_case qc = {
        .bf16 = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .lda = K, .b = wb, .b_dt = CDF_BF16, .ldb = K,
                 .trans_b = true, .bias = bias, .bias_dt = CDF_F32, .c = c[0], .c_dt = CDF_F32, .ldc = N, .alpha = 1.0f},
        .q = {.M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .w = wq, .qtype = CDF_GGML_Q8_0, .w_dt = CDF_BF16,
              .bias = bias, .bias_dt = CDF_F32, .c = c[1], .c_dt = CDF_F32},
    };
    double best[4] = {1e30, 1e30, 1e30, 1e30}, best_cpu[4] = {1e30, 1e30, 1e30, 1e30};
    bool ok = true;
    for (int r = -1; r < rounds && ok; r++)
        for (int p = 0; p < 4 && ok; p++) {
            quant_case x = qc;
            x.q.c = c[p];
            const double t0 = now_s(), c0 = cpu_s();
            ok = quant_path(&x, p);
            const double t = now_s() - t0, tc = cpu_s() - c0;
            if (r >= 0 && t < best[p]) best[p] = t; /* r = -1: warm-up (prepack, primitive creation) */
            if (r >= 0 && tc < best_cpu[p]) best_cpu[p] = tc;
        }
    if (!ok) {
        printf("| %s | failed |\n", name);
    } else {
        /* largest |own - panels| (summation order only) and |int8 - panels| (A quantized to int8)
         * relative to the largest |panels| */
        double dmax = 0, imax = 0, cmax = 0;
        for (int64_t i = 0; i < M * N; i++) {
            const double d = fabs((double)c[2][i] - (double)c[1][i]), e = fabs((double)c[3][i] - (double)c[1][i]);
            const double v = fabs((double)c[1][i]);
            if (d > dmax) dmax = d;
            if (e > imax) imax = e;
            if (v > cmax) cmax = v;
        }
        const double flop = 2.0 * (double)M * (double)N * (double)K;
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.0f%% / %.0f%% / %.0f%% / %.0f%% | %.3f | %.3f | **%.3f** | %.3f | %.3f | %.3f / %.3f / %.3f | %.1e / %.1e |\n",
               name, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, 100 * flop / best[0] / peak,
               100 * flop / best[1] / peak, 100 * flop / best[2] / peak, 100 * flop / best[3] / peak, best[1] / best[0],
               best[2] / best[0], best[3] / best[0], best[3] / best[1], best[3] / best[2], best_cpu[1] / best_cpu[0],
               best_cpu[2] / best_cpu[0], best_cpu[3] / best_cpu[0], dmax / cmax, imax / cmax);
    }
    cdf_k_fast_clear();
    free(a), free(c[0]), free(c[1]), free(c[2]), free(c[3]), free(wb), free(wq), free(bias);
}

/* The vdpbf16ps register loop on all threads, FLOP/s: best of 3 (the first region also starts the
 * threads and the clocks). */
static double all_thread_bf16_peak(void) {
    double peak = 0;
    for (int i = 0; i < 3; i++) {
        double p = 0;
#pragma omp parallel reduction(+ : p)
        p += peak_bf16_dp(20000000);
        if (p > peak) peak = p;
    }
    return peak;
}

static void bench_quant_all(int rounds, const char *only) {
    cdf_k_pack_set_limit((size_t)8 << 30);
    const double peak = all_thread_bf16_peak();
    printf("### Q8_0 weights vs bf16 weights at FLUX.1's layer shapes, %d OpenMP threads\n\n"
           "A f32 [M, K], weight [N, K], f32 bias, C f32. bf16 = oneDNN on its prepacked copy; panels = the Q8_0\n"
           "weight decoded per call into oneDNN's layout, then oneDNN (CDIFFUSERS_Q8_GEMM=0); own = the own\n"
           "AVX512-BF16 GEMM decoding column slabs (matmul_quant.c; forced here: by default it runs for 128 <= M <\n"
           "1024); int8 = the AVX512-VNNI GEMM on int8-quantized A (forced here too). Best of %d alternated calls after a warm-up "
           "each; %% peak = over the vdpbf16ps register loop on all threads (%.0f GFLOP/s); ratio = wall time / bf16's\n"
           "(int8 / panels, int8 / own: against the other Q8_0 paths);\n"
           "CPU-s = the same with the process's CPU seconds per call (best of the rounds: less moved by other load);\n"
           "diff = max |own - panels| / max |panels|, then the same for int8.\n\n",
           omp_get_max_threads(), rounds, peak * 1e-9);
    printf("| shape M x K -> N | bf16 ms | panels ms | own ms | int8 ms | %% peak bf16 / panels / own / int8 | panels / bf16 | own / bf16 "
           "| int8 / bf16 | int8 / panels | int8 / own | CPU-s panels, own, int8 / bf16 | diff own, int8 |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const struct { const char *name; int64_t M, K, N; } shapes[] = {
        {"attn proj 1536x3072->3072", 1536, 3072, 3072},   {"qkv 1536x3072->9216", 1536, 3072, 9216},
        {"MLP up 1536x3072->12288", 1536, 3072, 12288},     {"MLP down 1536x12288->3072", 1536, 12288, 3072},
        {"single lin1 1536x3072->21504", 1536, 3072, 21504}, {"single lin2 1536x15360->3072", 1536, 15360, 3072},
        /* double blocks run the image and text streams apart: M = 1024 and 512 at 512^2 */
        {"img attn proj 1024x3072->3072", 1024, 3072, 3072}, {"img MLP up 1024x3072->12288", 1024, 3072, 12288},
        {"img MLP down 1024x12288->3072", 1024, 12288, 3072}, {"text 512x3072->3072", 512, 3072, 3072},
        {"text MLP up 512x3072->12288", 512, 3072, 12288}, {"short 256x3072->3072", 256, 3072, 3072},
        {"short 128x3072->3072", 128, 3072, 3072},
        /* FLUX at 1024^2 (4096 image + 512 text tokens) and more M at the widest shapes */
        {"M4096 proj 4096x3072->3072", 4096, 3072, 3072}, {"M4096 qkv 4096x3072->9216", 4096, 3072, 9216},
        {"M4096 MLP up 4096x3072->12288", 4096, 3072, 12288}, {"M4096 MLP down 4096x12288->3072", 4096, 12288, 3072},
        {"M2048 MLP down 2048x12288->3072", 2048, 12288, 3072}, {"M256 MLP down 256x12288->3072", 256, 12288, 3072},
        {"M128 MLP up 128x3072->12288", 128, 3072, 12288},
        /* few rows: the modulation (AdaLN, M = batch) and short prompts */
        {"few AdaLN 2x3072->18432", 2, 3072, 18432}, {"few 16x3072->3072", 16, 3072, 3072}, {"few 64x3072->3072", 64, 3072, 3072},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!only || strstr(shapes[i].name, only))
            bench_quant_shape(shapes[i].name, shapes[i].M, shapes[i].K, shapes[i].N, rounds, peak);
}

/* ---- bf16 weights at the avx512_bf16 level: the vdpbf16ps slab GEMM vs oneDNN ---------------- */

/* path 0: the own slab GEMM (gemm_vdpbf16.c); 1: oneDNN on its prepacked copy; 2: oneDNN with the
 * prepack cap at 0 (what weights over CDIFFUSERS_PREPACK_MB run) */
static bool bf16_path(const cdf_k_matmul_args *x, int path) {
    bool handled = false;
    if (path == 0) return cdf_k_gemm_vdp_bf16(x, &handled) == CDF_OK && handled;
    cdf_k_pack_set_limit(path == 1 ? (size_t)8 << 30 : 0);
    const bool ok = cdf_k_matmul_fast(x, &handled) == CDF_OK && handled;
    cdf_k_pack_set_limit((size_t)8 << 30);
    return ok;
}

/* Alternates the three paths `rounds` times after a warm-up call each (prepack there); best wall
 * and CPU time per path. */
static void bench_bf16_shape(const char *name, int64_t M, int64_t K, int64_t N, int rounds, double peak) {
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *c[3];
    uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
    float *bias = malloc(sizeof(float) * (size_t)N);
    for (int p = 0; p < 3; p++) c[p] = malloc(sizeof(float) * (size_t)(M * N));
    if (!a || !wb || !bias || !c[0] || !c[1] || !c[2]) {
        printf("| %s | out of memory |\n", name);
        return;
    }
    for (int64_t i = 0; i < M * K; i++) a[i] = frand();
    for (int64_t i = 0; i < N * K; i++) wb[i] = cdf_f32_to_bf16(frand() * 0.05f);
    for (int64_t i = 0; i < N; i++) bias[i] = frand();
    cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .lda = K, .b = wb,
                           .b_dt = CDF_BF16, .ldb = K, .trans_b = true, .bias = bias, .bias_dt = CDF_F32,
                           .c_dt = CDF_F32, .ldc = N, .alpha = 1.0f};
    double best[3] = {1e30, 1e30, 1e30}, best_cpu[3] = {1e30, 1e30, 1e30};
    bool ok = true;
    for (int r = -1; r < rounds && ok; r++)
        for (int p = 0; p < 3 && ok; p++) {
            x.c = c[p];
            const double t0 = now_s(), c0 = cpu_s();
            ok = bf16_path(&x, p);
            const double t = now_s() - t0, tc = cpu_s() - c0;
            if (r >= 0 && t < best[p]) best[p] = t;
            if (r >= 0 && tc < best_cpu[p]) best_cpu[p] = tc;
        }
    if (!ok) {
        printf("| %s | failed |\n", name);
    } else {
        double dmax = 0, cmax = 0; /* |own - prepacked oneDNN| over max |C|: summation order only */
        for (int64_t i = 0; i < M * N; i++) {
            const double d = fabs((double)c[0][i] - (double)c[1][i]), v = fabs((double)c[1][i]);
            if (d > dmax) dmax = d;
            if (v > cmax) cmax = v;
        }
        const double flop = 2.0 * (double)M * (double)N * (double)K;
        printf("| %s | %.1f | %.1f | %.1f | %.0f%% / %.0f%% / %.0f%% | **%.3f** | **%.3f** | %.3f / %.3f | %.1e |\n", name,
               best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, 100 * flop / best[0] / peak, 100 * flop / best[1] / peak,
               100 * flop / best[2] / peak, best[0] / best[1], best[0] / best[2], best_cpu[0] / best_cpu[1],
               best_cpu[0] / best_cpu[2], dmax / cmax);
    }
    cdf_k_fast_clear();
    free(a), free(c[0]), free(c[1]), free(c[2]), free(wb), free(bias);
}

static void bench_bf16_all(int rounds, const char *only) {
    const double peak = all_thread_bf16_peak();
    printf("### bf16 weights, avx512_bf16 level: own slab GEMM vs oneDNN prepacked / unprepacked, %d OpenMP threads\n\n"
           "A f32 [M, K], weight bf16 [N, K], f32 bias, C f32. own = gemm_vdpbf16.c (slabs repacked per call, no\n"
           "kept copy); pre = oneDNN on its prepacked copy; unpre = oneDNN with CDIFFUSERS_PREPACK_MB=0's cap.\n"
           "Best of %d alternated calls after a warm-up each; %% peak = over the vdpbf16ps register loop on all\n"
           "threads (%.0f GFLOP/s); ratios own / pre and own / unpre (< 1: own faster); CPU-s: the same in\n"
           "process CPU seconds; diff = max |own - pre| / max |pre|.\n\n",
           omp_get_max_threads(), rounds, peak * 1e-9);
    printf("| shape M x K -> N | own ms | pre ms | unpre ms | %% peak own / pre / unpre | own / pre | own / unpre "
           "| CPU-s own / pre, own / unpre | diff |\n|---|---|---|---|---|---|---|---|---|\n");
    const struct { const char *name; int64_t M, K, N; } shapes[] = {
        {"FLUX proj 4429x3072->3072", 4429, 3072, 3072},      {"FLUX qkv 4429x3072->9216", 4429, 3072, 9216},
        {"FLUX MLP up 4429x3072->12288", 4429, 3072, 12288},  {"FLUX MLP down 4429x12288->3072", 4429, 12288, 3072},
        {"FLUX lin1 1536x3072->21504", 1536, 3072, 21504},   {"FLUX lin2 1536x15360->3072", 1536, 15360, 3072},
        {"FLUX proj 1536x3072->3072", 1536, 3072, 3072},      {"FLUX MLP down 1536x12288->3072", 1536, 12288, 3072},
        {"img proj 1024x3072->3072", 1024, 3072, 3072},       {"img MLP up 1024x3072->12288", 1024, 3072, 12288},
        {"text 512x3072->3072", 512, 3072, 3072},             {"text MLP up 512x3072->12288", 512, 3072, 12288},
        {"SD3.5 proj 2048x1536->1536", 2048, 1536, 1536},     {"SD3.5 MLP up 2048x1536->6144", 2048, 1536, 6144},
        {"SD3.5 MLP down 2048x6144->1536", 2048, 6144, 1536}, {"SD3.5 text 333x1536->1536", 333, 1536, 1536},
        {"SD3.5 text MLP up 333x1536->6144", 333, 1536, 6144}, {"AdaLN 1x3072->18432", 1, 3072, 18432},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!only || strstr(shapes[i].name, only))
            bench_bf16_shape(shapes[i].name, shapes[i].M, shapes[i].K, shapes[i].N, rounds, peak);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows appear as they are measured */
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (argc > 1 && strcmp(argv[1], "--attention") == 0) {
        bench_attention_all(false, argc > 2 && strcmp(argv[2], "--no-reference") == 0);
        bench_attention_bf16_all(false);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--attention-bf16") == 0) {
        bench_attention_bf16_all(argc > 2 && strcmp(argv[2], "--quick") == 0);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--gemm") == 0) {
        bench_gemm_all(argc > 2 && strcmp(argv[2], "--quick") == 0);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--quant") == 0) {
        bench_quant_all(argc > 2 ? atoi(argv[2]) : 3, argc > 3 ? argv[3] : NULL);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--bf16") == 0) {
        bench_bf16_all(argc > 2 ? atoi(argv[2]) : 3, argc > 3 ? argv[3] : NULL);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--verbose-probe") == 0) {
        verbose_probe();
        return 0;
    }
    cdf_k_fast_info info;
    cdf_k_fast_get_info(&info);
    printf("oneDNN %s, effective ISA %s; CPU: avx2+fma %d, avx512_core %d, avx512_bf16 %d, amx_bf16 %d "
           "(permitted %d); fast paths available %d, bf16 %d; %d OpenMP threads\n\n",
           info.onednn_version[0] ? info.onednn_version : "(not built in)", info.onednn_isa, info.avx2_fma,
           info.avx512_core, info.avx512_bf16, info.amx_bf16, info.amx_permitted, info.available,
           info.bf16_supported, omp_get_max_threads());

    printf("### Peaks (register-only loops), TFLOP/s\n\n| instruction | 1 thread | all threads |\n|---|---|---|\n");
    print_peaks(&info);

    const shape full[] = {
        {"FLUX attn proj 4429x3072x3072", 1, 4429, 3072, 3072, true, false},
        {"FLUX MLP up 4429x3072->12288", 1, 4429, 12288, 3072, true, false},
        {"SD3.5-M proj 4429x1536x1536", 1, 4429, 1536, 1536, true, false},
        {"SD3.5-M MLP up 4429x1536->6144", 1, 4429, 6144, 1536, true, false},
        {"SD3.5-M MLP down 4429x6144->1536", 1, 4429, 1536, 6144, true, false},
        {"T5 proj 77x4096x4096 (small M)", 1, 77, 4096, 4096, true, false},
        {"timestep MLP 1x256->3072 (M=1)", 1, 1, 3072, 256, true, false},
        {"attention q.kT 4 heads 4429x4429x64", 4, 4429, 4429, 64, true, true},
    };
    const shape quick_set[] = {
        {"SD3.5-M proj 4429x1536x1536", 1, 4429, 1536, 1536, true, false},
        {"T5 proj 77x4096x4096 (small M)", 1, 77, 4096, 4096, true, false},
    };
    const shape *set = quick ? quick_set : full;
    const size_t n = quick ? sizeof quick_set / sizeof *quick_set : sizeof full / sizeof *full;
    printf("\n### Matmul\n\n| shape (M x K -> N) | weights | path | ms | TFLOP/s | x ref | oneDNN impl / notes |\n"
           "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) bench_shape(&set[i], quick);

    const conv_shape convs[] = {
        {"VAE conv 3x3 512->512 @ 64x64", 1, 512, 64, 64, 512, 3, 1},
        {"VAE conv 3x3 128->128 @ 256x256", 1, 128, 256, 256, 128, 3, 1},
        {"VAE conv_in 3x3 16->512 @ 128x128", 1, 16, 128, 128, 512, 3, 1},
    };
    printf("\n### Conv2d (NCHW, stride 1, pad 1, f32 input)\n\n| shape | weights | path | ms | TFLOP/s | x ref | oneDNN impl / notes |\n"
           "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < (quick ? 1 : sizeof convs / sizeof *convs); i++) bench_conv(&convs[i], quick);
    bench_attention_all(quick, false);
    return 0;
}
