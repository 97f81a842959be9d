/* Vectorised flash attention for the AVX2, AVX-512 and AVX512-BF16 levels: the contract of
 * cdf_k_attention (kernels.h) with the same tiled online-softmax algorithm, written with GCC
 * vector extensions and compiled per ISA (attention_fast_impl.h). The L x L score matrix never
 * exists: per thread one AF_BQ x BK tile of scores, a chunk of query rows with their output
 * accumulators and a packed span of K and V (attention_fast_impl.h) — bounded memory whatever the
 * sequence lengths.
 *
 * Numerics: f32 products and sums like the reference kernel, the scores in log2 units (q scaled
 * by scale log2(e) once, as it loads) and a polynomial 2^x (~2 ulp) instead of libm's expf,
 * different summation order (keys are summed across vector lanes). Differences from the reference
 * are a few f32 ulps of the output scale (tests/test_kernels_attention.c).
 * bf16 q, k, v (the bf16 policy, kernels.h): the f32 bodies scale S instead of Q and round P to
 * bf16; at the AVX512-BF16 level a third build of the body multiplies in bf16 (vdpbf16ps) and
 * rounds P with vcvtne2ps2bf16. Those instructions flush subnormals to zero: P below 2^-126
 * counts as 0 (a change below 2^-126 of the row's weight), as do bf16 q/k/v values below
 * 2^-126 (products below 2^-126 |k|, |v|). Where AMX-BF16 is usable (cdf_k_amx_usable) and the
 * head dim is a multiple of 32, a fourth build runs both products of that body on AMX tiles
 * (tdpbf16ps, same packed operands, same softmax and P; only the f32 summation order of the
 * products differs, and AMX flushes subnormals as vdpbf16ps does); CDIFFUSERS_AMX_ATTENTION=0
 * keeps the vdpbf16ps body. */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/reference_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AF_HAVE_X86 1
#include <immintrin.h>
#endif

/* AF_BQ: query rows per block (one K/V tile is reused by this many rows); AF_QC, AF_KS: the most
 * query rows per work item and keys per packed span (bounding the scratch: (AF_QC + AF_KS) (d + dv)
 * floats per thread, 4 MB at d = dv = 128) */
enum { AF_BQ = 48, AF_RB = 6, AF_QC = 2016, AF_KS = 2048 }; /* AF_RB: rows per register block, divides AF_BQ */

#ifdef AF_HAVE_X86

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,tune=skylake-avx512")
#define VW 16
#define KV_VECS 4 /* 64 keys per tile */
#define CV 2
#define SFX avx512
#include "kernels/attention_fast_impl.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,tune=skylake-avx512")
#define VW 16
#define KV_VECS 4 /* 64 keys per tile */
#define CV 2
#define SFX avx512bf16
#define AF_DPBF16 1 /* the vdpbf16ps body: bf16 q, k, v only */
#include "kernels/attention_fast_impl.h"
#pragma GCC pop_options

/* the AMX build of the vdpbf16ps body: both products on tiles (GCC 11+ has the AMX intrinsics) */
#if __GNUC__ >= 11
#define AF_HAVE_AMX 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,tune=sapphirerapids")
#define VW 16
#define KV_VECS 4 /* 64 keys per tile */
#define CV 2
#define SFX amx
#define AF_DPBF16 1
#define AF_AMX 1
#include "kernels/amx_impl.h"
#include "kernels/attention_fast_impl.h"
#pragma GCC pop_options
#else /* no AMX build: use_amx() is false, the names only keep the dispatch below one piece */
#define scratch_floats_amx scratch_floats_avx512bf16
#define chunk_amx chunk_avx512bf16
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,tune=haswell") /* generic tuning splits unaligned 256-bit loads */
#define VW 8
#define KV_VECS 4 /* 32 keys per tile */
#define CV 2
#define SFX avx2
#include "kernels/attention_fast_impl.h"
#pragma GCC pop_options

#endif

static int g_amx_on = -1; /* -1: CDIFFUSERS_AMX_ATTENTION (read once; "0" = off), else the setter's */

static _Atomic int64_t g_amx_runs; /* calls the AMX body ran */

void cdf_k_attention_amx_set(int on) { g_amx_on = on < 0 ? -1 : on > 0; }

int64_t cdf_k_attention_amx_runs(void) { return g_amx_runs; }

/* the AMX body for this problem: bf16 policy (the caller checked), head dim in whole 32-dim steps,
 * AMX usable and not switched off */
static bool use_amx(const cdf_k_attention_args *x) {
#ifdef AF_HAVE_AMX
    if (g_amx_on < 0) {
        const char *e = getenv("CDIFFUSERS_AMX_ATTENTION");
        g_amx_on = !(e && strcmp(e, "0") == 0);
    }
    return g_amx_on && (x->d + 1) / 2 * 2 % 32 == 0 && cdf_k_amx_usable();
#else
    (void)x;
    return false;
#endif
}

cdf_status cdf_k_attention_fast(const cdf_k_attention_args *x, bool *handled) {
    return cdf_k_attention_fast_at(x, cdf_k_isa_level(), handled);
}

cdf_status cdf_k_attention_fast_at(const cdf_k_attention_args *x, cdf_k_isa isa, bool *handled) {
    static const char *fn = "cdf_k_attention_fast";
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "%s: handled is NULL", fn);
    *handled = false;
#ifdef AF_HAVE_X86
    if (!x) return CDF_OK;
    if (isa > cdf_k_isa_native()) isa = cdf_k_isa_native(); /* never run what the CPU lacks */
    if (isa < CDF_K_ISA_AVX2) return CDF_OK;
    /* the reference handles (and reports) everything unusual: bad dtypes/sizes, empty problems */
    if (!cdf_k_is_float_storage(x->q_dt) || !cdf_k_is_float_storage(x->k_dt) || !cdf_k_is_float_storage(x->v_dt) ||
        !cdf_k_is_float_storage(x->out_dt) || (x->mask && !cdf_k_is_float_storage(x->mask_dt)))
        return CDF_OK;
    if (x->b < 1 || x->h < 1 || x->lq < 1 || x->lk < 1 || x->d < 1 || x->dv < 1) return CDF_OK;
    if (!x->q || !x->k || !x->v || !x->out) return CDF_OK;
    const bool wide = isa >= CDF_K_ISA_AVX512;
    /* the vdpbf16ps body where the bf16 policy holds and the CPU has the instruction; the f32
     * bodies compute the same policy otherwise (kernels.h) */
    const bool dp = isa >= CDF_K_ISA_AVX512_BF16 && cdf_k_attention_bf16_policy(x);
    const bool amx = dp && use_amx(x);
    const int64_t bk = wide ? 64 : 32; /* BK of the level (KV_VECS * VW) */
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    /* query chunks: as few as bound the memory (AF_QC rows) and still give every thread ~4 items;
     * key spans: as few as bound the memory (AF_KS keys), of near-equal lengths */
    const int64_t bh = x->b * x->h, qblocks = (x->lq + AF_BQ - 1) / AF_BQ;
    int64_t nch = (x->lq + AF_QC - 1) / AF_QC;
    const int64_t want = (4 * (int64_t)nthr + bh - 1) / bh;
    if (nch < want) nch = want < qblocks ? want : qblocks;
    const int64_t qc = ((x->lq + nch - 1) / nch + AF_BQ - 1) / AF_BQ * AF_BQ;
    nch = (x->lq + qc - 1) / qc;
    const int64_t nsp = (x->lk + AF_KS - 1) / AF_KS;
    const int64_t ks = ((x->lk + nsp - 1) / nsp + bk - 1) / bk * bk;
    const size_t per = amx    ? scratch_floats_amx(x->d, x->dv, qc, ks)
                       : dp   ? scratch_floats_avx512bf16(x->d, x->dv, qc, ks)
                       : wide ? scratch_floats_avx512(x->d, x->dv, qc, ks)
                              : scratch_floats_avx2(x->d, x->dv, qc, ks);
    float *mem = aligned_alloc(64, ((sizeof(float) * per * (size_t)nthr) + 63) & ~(size_t)63);
    if (!mem) return CDF_OK; /* the reference needs less memory */
    const int64_t items = bh * nch;
    const double work = 2.0 * (double)x->b * (double)x->h * (double)x->lq * (double)x->lk * (double)(x->d + x->dv);
#pragma omp parallel if (work > CDF_K_PAR_MIN_WORK && items > 1)
    {
        float *w = mem + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < items; u++) {
            const int64_t i = u / nch, q0 = (u % nch) * qc;
            const int64_t nq = x->lq - q0 < qc ? x->lq - q0 : qc;
            if (amx)
                chunk_amx(x, i / x->h, i % x->h, q0, nq, qc, ks, w);
            else if (dp)
                chunk_avx512bf16(x, i / x->h, i % x->h, q0, nq, qc, ks, w);
            else if (wide)
                chunk_avx512(x, i / x->h, i % x->h, q0, nq, qc, ks, w);
            else
                chunk_avx2(x, i / x->h, i % x->h, q0, nq, qc, ks, w);
        }
    }
    free(mem);
    if (amx) g_amx_runs++;
    *handled = true;
#else
    (void)x;
    (void)isa;
#endif
    return CDF_OK;
}
