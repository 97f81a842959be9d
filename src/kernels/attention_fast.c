/* Vectorised flash attention (f32 compute) for the AVX2 and AVX-512 levels: the contract of
 * cdf_k_attention (kernels.h) with the same tiled online-softmax algorithm, written with GCC
 * vector extensions and compiled per ISA (attention_fast_impl.h). The L x L score matrix never
 * exists: per thread one AF_BQ x BK tile of scores, the query block and its output accumulator
 * (AF_BQ rows), one K and one V tile — bounded memory whatever the sequence length.
 *
 * Numerics: f32 products and sums like the reference kernel, a polynomial exp (~2 ulp) instead
 * of libm's expf, different summation order (keys are summed across vector lanes). Differences
 * from the reference are a few f32 ulps of the output scale (tests/test_kernels_fast.c). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/reference_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AF_HAVE_X86 1
#endif

enum { AF_BQ = 64 }; /* query rows per block: one K/V tile is reused by this many rows */

#ifdef AF_HAVE_X86

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,tune=skylake-avx512")
#define VW 16
#define KV_VECS 4 /* 64 keys per tile */
#define CV 2
#define SFX avx512
#include "kernels/attention_fast_impl.h"
#undef VW
#undef KV_VECS
#undef CV
#undef SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,tune=haswell") /* generic tuning splits unaligned 256-bit loads */
#define VW 8
#define KV_VECS 4 /* 32 keys per tile */
#define CV 2
#define SFX avx2
#include "kernels/attention_fast_impl.h"
#undef VW
#undef KV_VECS
#undef CV
#undef SFX
#pragma GCC pop_options

#endif

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
    const size_t per = wide ? scratch_floats_avx512(x->d, x->dv) : scratch_floats_avx2(x->d, x->dv);
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    float *mem = aligned_alloc(64, ((sizeof(float) * per * (size_t)nthr) + 63) & ~(size_t)63);
    if (!mem) return CDF_OK; /* the reference needs less memory */
    const int64_t qblocks = (x->lq + AF_BQ - 1) / AF_BQ;
    const int64_t items = x->b * x->h * qblocks;
    const double work = 2.0 * (double)x->b * (double)x->h * (double)x->lq * (double)x->lk * (double)(x->d + x->dv);
#pragma omp parallel if (work > CDF_K_PAR_MIN_WORK && items > 1)
    {
        float *w = mem + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < items; u++) {
            const int64_t bh = u / qblocks, q0 = (u % qblocks) * AF_BQ;
            const int64_t nq = x->lq - q0 < AF_BQ ? x->lq - q0 : AF_BQ;
            if (wide)
                block_avx512(x, bh / x->h, bh % x->h, q0, nq, w);
            else
                block_avx2(x, bh / x->h, bh % x->h, q0, nq, w);
        }
    }
    free(mem);
    *handled = true;
#else
    (void)x;
    (void)isa;
#endif
    return CDF_OK;
}
