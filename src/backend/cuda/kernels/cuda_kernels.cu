/* The CUDA backend's kernels: plain, clearly structured CUDA, one thread (or one block / warp)
 * per output element or row, f32 arithmetic, every dtype through the same load/store helpers.
 * Correctness first: the fast paths (cuDNN convolution and SDPA, tensor-core attention,
 * vectorised elementwise) come later and are tested against these. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/kernels/cuda_kernels.h"

namespace {

constexpr int kThreads = 256;

/* ---- element access ---------------------------------------------------------------------- */

__device__ __forceinline__ bool is_int_dt(int dt) {
    return dt == CDF_I64 || dt == CDF_I32 || dt == CDF_I16 || dt == CDF_I8 || dt == CDF_U8 || dt == CDF_BOOL;
}

__device__ __forceinline__ float ldf(const void *p, int dt, long long i) {
    switch (dt) {
    case CDF_F32: return ((const float *)p)[i];
    case CDF_BF16: return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
    case CDF_F16: return __half2float(((const __half *)p)[i]);
    case CDF_F64: return (float)((const double *)p)[i];
    case CDF_I64: return (float)((const long long *)p)[i];
    case CDF_I32: return (float)((const int *)p)[i];
    case CDF_I16: return (float)((const short *)p)[i];
    case CDF_I8: return (float)((const signed char *)p)[i];
    case CDF_U8: return (float)((const unsigned char *)p)[i];
    case CDF_BOOL: return ((const unsigned char *)p)[i] != 0;
    default: return 0.0f;
    }
}

/* f32 -> bf16, round to nearest even, quiet NaN (the host's cdf_f32_to_bf16) */
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ long long trunc_sat(double d, double lo, double hi) {
    if (d != d) return 0;
    if (d <= lo) return (long long)lo;
    if (d >= hi) return (long long)hi;
    return (long long)d;
}

__device__ __forceinline__ void st_int(void *p, int dt, long long i, long long v) {
    switch (dt) {
    case CDF_I64: ((long long *)p)[i] = v; break;
    case CDF_I32: ((int *)p)[i] = (int)v; break;
    case CDF_I16: ((short *)p)[i] = (short)v; break;
    case CDF_I8: ((signed char *)p)[i] = (signed char)v; break;
    case CDF_U8: ((unsigned char *)p)[i] = (unsigned char)v; break;
    case CDF_BOOL: ((unsigned char *)p)[i] = v != 0; break;
    default: break;
    }
}

__device__ __forceinline__ void st_double_to_int(void *p, int dt, long long i, double d) {
    long long v;
    switch (dt) {
    case CDF_BOOL: v = d != 0.0; break;
    case CDF_I32: v = trunc_sat(d, -2147483648.0, 2147483647.0); break;
    case CDF_I16: v = trunc_sat(d, -32768.0, 32767.0); break;
    case CDF_I8: v = trunc_sat(d, -128.0, 127.0); break;
    case CDF_U8: v = trunc_sat(d, 0.0, 255.0); break;
    default: v = trunc_sat(d, -9223372036854775808.0, 9223372036854775807.0); break;
    }
    st_int(p, dt, i, v);
}

__device__ __forceinline__ void stf(void *p, int dt, long long i, float v) {
    switch (dt) {
    case CDF_F32: ((float *)p)[i] = v; break;
    case CDF_BF16: ((unsigned short *)p)[i] = f2bf(v); break;
    case CDF_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case CDF_F64: ((double *)p)[i] = v; break;
    default: st_double_to_int(p, dt, i, v); break;
    }
}

__device__ __forceinline__ long long ld_int(const void *p, int dt, long long i) {
    switch (dt) {
    case CDF_I64: return ((const long long *)p)[i];
    case CDF_I32: return ((const int *)p)[i];
    case CDF_I16: return ((const short *)p)[i];
    case CDF_I8: return ((const signed char *)p)[i];
    case CDF_U8: return ((const unsigned char *)p)[i];
    default: return ((const unsigned char *)p)[i] != 0; /* bool */
    }
}

/* ---- shapes and strides, passed by value ------------------------------------------------ */

struct Strided {
    int ndim;
    long long shape[CDF_MAX_DIMS];
    long long st[CDF_FUSE_MAX_INPUTS + 1][CDF_MAX_DIMS]; /* [0] = destination, [1 + i] = input i */
};

/* Offsets of linear index idx (row-major over shape) in each of the first n strided arrays. */
__device__ __forceinline__ void offsets(const Strided &s, long long idx, int n, long long *off) {
    for (int k = 0; k < n; k++) off[k] = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
        const long long c = idx % s.shape[d];
        idx /= s.shape[d];
        for (int k = 0; k < n; k++) off[k] += c * s.st[k][d];
    }
}

long long numel(int ndim, const int64_t *shape) {
    long long n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

unsigned blocks_for(long long n) {
    long long b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b > 65535LL * 1024 ? 65535LL * 1024 : b); /* grid-stride loops cover the rest */
}

#define GRID_LOOP(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

int launched() { return (int)cudaGetLastError(); }

/* ---- the scalar op definitions (those of kernels/reference_internal.h) ---------------------- */

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float unary_f(int op, float x, float p0, float p1) {
    switch (op) {
    case CDF_UN_NEG: return -x;
    case CDF_UN_EXP: return expf(x);
    case CDF_UN_LOG: return logf(x);
    case CDF_UN_SQRT: return sqrtf(x);
    case CDF_UN_RSQRT: return 1.0f / sqrtf(x);
    case CDF_UN_SQUARE: return x * x;
    case CDF_UN_ABS: return fabsf(x);
    case CDF_UN_SIGMOID: return sigmoidf_(x);
    case CDF_UN_TANH: return tanhf(x);
    case CDF_UN_SILU: return x / (1.0f + expf(-x));
    case CDF_UN_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    case CDF_UN_GELU_TANH: {
        const float k = 0.79788456080286535588f;
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case CDF_UN_QUICK_GELU: return x * sigmoidf_(1.702f * x);
    case CDF_UN_RELU: return x < 0.0f ? 0.0f : x;
    case CDF_UN_SIN: return sinf(x);
    case CDF_UN_COS: return cosf(x);
    case CDF_UN_SCALE: return x * p0;
    case CDF_UN_ADD_SCALAR: return x + p0;
    case CDF_UN_AFFINE: return x * p0 + p1;
    case CDF_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    case CDF_UN_POW: return powf(x, p0);
    default: return x;
    }
}

__device__ __forceinline__ float binary_f(int op, float a, float b) {
    switch (op) {
    case CDF_BIN_ADD: return a + b;
    case CDF_BIN_SUB: return a - b;
    case CDF_BIN_MUL: return a * b;
    case CDF_BIN_DIV: return a / b;
    case CDF_BIN_MAX: return (a > b || isnan(a)) ? a : b;
    case CDF_BIN_MIN: return (a < b || isnan(a)) ? a : b;
    default: return a;
    }
}

/* ---- block reductions ---------------------------------------------------------------------- */

__device__ float block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; w++) t += sh[w];
    return t;
}

__device__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < nw; w++) t = fmaxf(t, sh[w]);
    return t;
}

/* ---- data movement ------------------------------------------------------------------------ */

__global__ void k_copy(Strided s, long long n, void *dst, int ddt, const void *src, int sdt) {
    GRID_LOOP(i, n) {
        long long off[2];
        offsets(s, i, 2, off);
        if (is_int_dt(sdt) && is_int_dt(ddt)) st_int(dst, ddt, off[0], ld_int(src, sdt, off[1]));
        else if (is_int_dt(ddt)) st_double_to_int(dst, ddt, off[0], sdt == CDF_F64 ? ((const double *)src)[off[1]] : (double)ldf(src, sdt, off[1]));
        else if (ddt == CDF_F64) ((double *)dst)[off[0]] = is_int_dt(sdt) ? (double)ld_int(src, sdt, off[1]) : (sdt == CDF_F64 ? ((const double *)src)[off[1]] : (double)ldf(src, sdt, off[1]));
        else if (sdt == CDF_I64) stf(dst, ddt, off[0], (float)((const long long *)src)[off[1]]);
        else stf(dst, ddt, off[0], sdt == CDF_F64 ? (float)((const double *)src)[off[1]] : ldf(src, sdt, off[1]));
    }
}

__global__ void k_fill(Strided s, long long n, void *dst, int dt, double v) {
    GRID_LOOP(i, n) {
        long long off[1];
        offsets(s, i, 1, off);
        if (is_int_dt(dt)) st_double_to_int(dst, dt, off[0], v);
        else if (dt == CDF_F64) ((double *)dst)[off[0]] = v;
        else stf(dst, dt, off[0], (float)v);
    }
}

__global__ void k_embedding(void *out, int odt, const void *table, int tdt, long long rows, long long dim,
                            const void *ids, int idt, long long n, cdf_cu_error_word *err) {
    GRID_LOOP(i, n * dim) {
        const long long r = i / dim, c = i % dim;
        const long long id = idt == CDF_I64 ? ((const long long *)ids)[r] : ((const int *)ids)[r];
        if (id < 0 || id >= rows) {
            if (c == 0 && err && atomicCAS(&err->code, 0, CDF_CU_ERR_EMBEDDING_ID) == 0) err->value = id;
            stf(out, odt, i, 0.0f);
            continue;
        }
        stf(out, odt, i, ldf(table, tdt, id * dim + c));
    }
}

__global__ void k_upsample(void *out, int odt, const void *in, int idt, long long nc, long long h, long long w,
                           long long fh, long long fw) {
    const long long oh = h * fh, ow = w * fw;
    GRID_LOOP(i, nc * oh * ow) {
        const long long x = i % ow, y = (i / ow) % oh, p = i / (ow * oh);
        stf(out, odt, i, ldf(in, idt, (p * h + y / fh) * w + x / fw));
    }
}

/* ---- elementwise ---------------------------------------------------------------------------- */

__global__ void k_unary(int op, float p0, float p1, void *out, int odt, const void *in, int idt, long long n) {
    GRID_LOOP(i, n) stf(out, odt, i, unary_f(op, ldf(in, idt, i), p0, p1));
}

struct FusedArgs {
    cdf_fused_program prog;
    int n_in;
    const void *in[CDF_FUSE_MAX_INPUTS];
    int in_dt[CDF_FUSE_MAX_INPUTS];
};

__global__ void k_fused(Strided s, FusedArgs f, long long n, void *out, int odt) {
    GRID_LOOP(i, n) {
        long long off[CDF_FUSE_MAX_INPUTS + 1];
        offsets(s, i, f.n_in + 1, off);
        float v = ldf(f.in[0], f.in_dt[0], off[1]);
        for (int k = 0; k < f.prog.n_steps; k++) {
            const cdf_fused_step &st = f.prog.steps[k];
            if (st.binary) {
                const float o = ldf(f.in[st.input], f.in_dt[st.input], off[1 + st.input]);
                v = st.chain_rhs ? binary_f(st.op, o, v) : binary_f(st.op, v, o);
            } else {
                v = unary_f(st.op, v, st.p0, st.p1);
            }
        }
        stf(out, odt, off[0], v);
    }
}

/* ---- rows: softmax and norms (one block per row) ---------------------------------------------- */

__global__ void k_softmax(void *out, int odt, const void *in, int idt, long long cols, float scale) {
    __shared__ float sh[32];
    const long long base = blockIdx.x * cols;
    float m = -INFINITY;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, ldf(in, idt, base + c) * scale);
    m = block_max(m, sh);
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(ldf(in, idt, base + c) * scale - m);
    s = block_sum(s, sh);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x)
        stf(out, odt, base + c, expf(ldf(in, idt, base + c) * scale - m) / s);
}

/* mean and biased variance (two passes, as the reference) of n elements at base + k*stride */
__device__ void moments(const void *in, int idt, long long base, long long n, float *sh, float *mean, float *var) {
    float s = 0.0f;
    for (long long c = threadIdx.x; c < n; c += blockDim.x) s += ldf(in, idt, base + c);
    const float mu = block_sum(s, sh) / (float)n;
    float q = 0.0f;
    for (long long c = threadIdx.x; c < n; c += blockDim.x) {
        const float d = ldf(in, idt, base + c) - mu;
        q += d * d;
    }
    *mean = mu;
    *var = block_sum(q, sh) / (float)n;
}

__global__ void k_layer_norm(void *out, int odt, const void *in, int idt, long long cols, float eps, const void *w,
                             const void *b, int wdt) {
    __shared__ float sh[32];
    const long long base = blockIdx.x * cols;
    float mean, var;
    moments(in, idt, base, cols, sh, &mean, &var);
    const float r = 1.0f / sqrtf(var + eps);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = (ldf(in, idt, base + c) - mean) * r;
        if (w) y *= ldf(w, wdt, c);
        if (b) y += ldf(b, wdt, c);
        stf(out, odt, base + c, y);
    }
}

__global__ void k_rms_norm(void *out, int odt, const void *in, int idt, long long cols, float eps, const void *w,
                           int wdt) {
    __shared__ float sh[32];
    const long long base = blockIdx.x * cols;
    float q = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float x = ldf(in, idt, base + c);
        q += x * x;
    }
    const float r = 1.0f / sqrtf(block_sum(q, sh) / (float)cols + eps);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = ldf(in, idt, base + c) * r;
        if (w) y *= ldf(w, wdt, c);
        stf(out, odt, base + c, y);
    }
}

/* one block per (n, group): the group's C/groups channels of S elements are contiguous */
__global__ void k_group_norm(void *out, int odt, const void *in, int idt, long long c, long long s, long long groups,
                             float eps, const void *w, const void *b, int wdt) {
    __shared__ float sh[32];
    const long long cg = c / groups, len = cg * s, base = blockIdx.x * len;
    const long long g = blockIdx.x % groups;
    float mean, var;
    moments(in, idt, base, len, sh, &mean, &var);
    const float r = 1.0f / sqrtf(var + eps);
    for (long long k = threadIdx.x; k < len; k += blockDim.x) {
        const long long ch = g * cg + k / s;
        float y = (ldf(in, idt, base + k) - mean) * r;
        if (w) y *= ldf(w, wdt, ch);
        if (b) y += ldf(b, wdt, ch);
        stf(out, odt, base + k, y);
    }
}

/* ---- reductions (one thread per output; sums accumulate in double) --------------------------- */

__global__ void k_reduce(int op, void *out, int odt, const void *in, int idt, long long outer, long long red,
                         long long inner) {
    GRID_LOOP(oi, outer * inner) {
        const long long o = oi / inner, i = oi % inner, off = o * red * inner + i;
        if (op == CDF_RED_ARGMAX) {
            long long best = 0;
            if (is_int_dt(idt)) {
                long long v = ld_int(in, idt, off);
                for (long long r = 1; r < red; r++) {
                    const long long e = ld_int(in, idt, off + r * inner);
                    if (e > v) v = e, best = r;
                }
            } else {
                double v = idt == CDF_F64 ? ((const double *)in)[off] : ldf(in, idt, off);
                for (long long r = 1; r < red && !isnan(v); r++) {
                    const double e = idt == CDF_F64 ? ((const double *)in)[off + r * inner] : ldf(in, idt, off + r * inner);
                    if (isnan(e) || e > v) v = e, best = r;
                }
            }
            ((long long *)out)[oi] = best;
            continue;
        }
        float v;
        if (op == CDF_RED_MAX || op == CDF_RED_MIN) {
            v = ldf(in, idt, off);
            for (long long r = 1; r < red && !isnan(v); r++) {
                const float e = ldf(in, idt, off + r * inner);
                if (isnan(e) || (op == CDF_RED_MAX ? e > v : e < v)) v = e;
            }
        } else {
            /* sums in double, rounded once: a plain f32 running sum over 10^5 values drifts by
             * ~sqrt(n) ulps (the op suite's var over 100003 values failed THR_ACC that way);
             * the reference's cascaded f32 sums are within a few ulps of the exact value, and so
             * is this */
            double s = 0.0;
            for (long long r = 0; r < red; r++) s += ldf(in, idt, off + r * inner);
            if (op == CDF_RED_SUM) {
                v = (float)s;
            } else {
                const double mean = red ? s / (double)red : NAN;
                if (op == CDF_RED_MEAN) {
                    v = (float)mean;
                } else { /* biased variance, two passes */
                    double q = 0.0;
                    for (long long r = 0; r < red; r++) {
                        const double d = (double)ldf(in, idt, off + r * inner) - mean;
                        q += d * d;
                    }
                    v = red ? (float)(q / (double)red) : NAN;
                }
            }
        }
        stf(out, odt, oi, v);
    }
}

/* ---- convolution (direct; cuDNN later) --------------------------------------------------------- */

__global__ void k_conv2d(cdf_k_conv2d_args a, long long oh, long long ow) {
    const long long total = a.n * a.cout * oh * ow;
    const long long cin_g = a.cin / a.groups, cout_g = a.cout / a.groups;
    /* the bf16 compute policy (kernels/dispatch.h): f32 activations meet bf16 weights rounded to
     * bf16, as every CPU path does and the op suite's reference expects */
    const bool round_x = a.x_dt == CDF_F32 && a.w_dt == CDF_BF16;
    GRID_LOOP(i, total) {
        const long long x = i % ow, y = (i / ow) % oh, co = (i / (ow * oh)) % a.cout, n = i / (ow * oh * a.cout);
        const long long g = co / cout_g;
        float acc = a.bias ? ldf(a.bias, a.b_dt, co) : 0.0f;
        for (long long ci = 0; ci < cin_g; ci++) {
            const long long xc = g * cin_g + ci;
            for (long long ky = 0; ky < a.kh; ky++) {
                const long long iy = y * a.stride_h - a.pad_h + ky * a.dil_h;
                if (iy < 0 || iy >= a.h) continue;
                for (long long kx = 0; kx < a.kw; kx++) {
                    const long long ix = x * a.stride_w - a.pad_w + kx * a.dil_w;
                    if (ix < 0 || ix >= a.w) continue;
                    float xv = ldf(a.x, a.x_dt, ((n * a.cin + xc) * a.h + iy) * a.w + ix);
                    if (round_x) xv = __uint_as_float((unsigned)f2bf(xv) << 16);
                    acc += xv * ldf(a.weight, a.w_dt, ((co * cin_g + ci) * a.kh + ky) * a.kw + kx);
                }
            }
        }
        stf(a.out, a.out_dt, i, acc);
    }
}

/* ---- attention: one warp per query row, online softmax over the keys ------------------------
 * bf16 q, k, v: the bf16 attention policy (kernels/kernels.h): scores in log2 units, the running
 * max taken up to an integer, P rounded to bf16 before it multiplies V, l from the f32 P. */

constexpr int kAttnPerLane = CDF_CU_ATTN_MAX_D / 32;

__global__ void k_attention(cdf_k_attention_args a) {
    const long long row = blockIdx.x * (long long)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= a.b * a.h * a.lq) return;
    const long long qi = row % a.lq, hh = (row / a.lq) % a.h, bb = row / (a.lq * a.h);
    float q[kAttnPerLane], acc[kAttnPerLane];
    const long long qo = bb * a.q_sb + hh * a.q_sh + qi * a.q_sl;
    for (int j = 0; j < kAttnPerLane; j++) {
        const long long d = lane + 32LL * j;
        q[j] = d < a.d ? ldf(a.q, a.q_dt, qo + d) : 0.0f;
        acc[j] = 0.0f;
    }
    const bool round_p = a.q_dt == CDF_BF16 && a.k_dt == CDF_BF16 && a.v_dt == CDF_BF16;
    float m = -INFINITY, l = 0.0f;
    for (long long kk = 0; kk < a.lk; kk++) {
        const long long ko = bb * a.k_sb + hh * a.k_sh + kk * a.k_sl;
        float s = 0.0f;
        for (int j = 0; j < kAttnPerLane; j++) {
            const long long d = lane + 32LL * j;
            if (d < a.d) s += q[j] * ldf(a.k, a.k_dt, ko + d);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= a.scale;
        if (a.mask) s += ldf(a.mask, a.mask_dt, bb * a.m_sb + hh * a.m_sh + qi * a.m_sq + kk * a.m_sk);
        if (s == -INFINITY) continue; /* masked out */
        float mn, corr, p, pv;
        if (round_p) {
            s *= 1.44269504088896341f;
            mn = ceilf(fmaxf(m, s));
            corr = exp2f(m - mn);
            p = exp2f(s - mn);
            pv = __uint_as_float((unsigned)f2bf(p) << 16);
        } else {
            mn = fmaxf(m, s);
            corr = expf(m - mn);
            p = pv = expf(s - mn);
        }
        m = mn;
        l = l * corr + p;
        const long long vo = bb * a.v_sb + hh * a.v_sh + kk * a.v_sl;
        for (int j = 0; j < kAttnPerLane; j++) {
            const long long d = lane + 32LL * j;
            if (d < a.dv) acc[j] = acc[j] * corr + pv * ldf(a.v, a.v_dt, vo + d);
        }
    }
    const long long oo = row * a.dv;
    for (int j = 0; j < kAttnPerLane; j++) {
        const long long d = lane + 32LL * j;
        if (d < a.dv) stf(a.out, a.out_dt, oo + d, l > 0.0f ? acc[j] / l : 0.0f);
    }
}

/* ---- positional ------------------------------------------------------------------------------ */

__global__ void k_rope(void *out, int odt, const void *x, int xdt, const float *cs, const float *sn, long long rows,
                       long long l, long long d) {
    GRID_LOOP(i, rows * (d / 2)) {
        const long long r = i / (d / 2), k = 2 * (i % (d / 2)), p = (r % l) * d;
        const float x0 = ldf(x, xdt, r * d + k), x1 = ldf(x, xdt, r * d + k + 1);
        stf(out, odt, r * d + k, x0 * cs[p + k] - x1 * sn[p + k]);
        stf(out, odt, r * d + k + 1, x1 * cs[p + k + 1] + x0 * sn[p + k + 1]);
    }
}

__global__ void k_timestep(float *out, const float *t, long long n, long long dim, bool flip, float shift,
                           float scale, float max_period) {
    const long long half = dim / 2;
    GRID_LOOP(i, n * dim) {
        const long long r = i / dim, c = i % dim;
        if (c >= 2 * half) {
            out[i] = 0.0f; /* odd dim: zero pad */
            continue;
        }
        const long long k = c % half;
        const bool first = c < half; /* sin half unless flipped */
        /* every step rounded to f32 as diffusers does; sin/cos of the f32 argument in double,
         * rounded once (the reference kernel's definition). The f32 exp goes through double too:
         * CUDA's expf is within 2 ulp, glibc's (the reference, torch on the CPU) correctly
         * rounded, and an ulp of a frequency moved sin(t f) at t ~ 1000 by 1e-11 nmse on the H200 */
        const float neg_log_period = (float)(-log((double)max_period));
        const float denom = (float)((double)half - (double)shift);
        const float exponent = (neg_log_period * (float)k) / denom;
        const float emb = scale * (t[r] * (float)exp((double)exponent));
        out[i] = (float)((first != flip) ? sin((double)emb) : cos((double)emb));
    }
}

struct RopeAxes {
    int n_axes;
    long long dim[CDF_MAX_DIMS], col0[CDF_MAX_DIMS];
    long long width;
};

__global__ void k_rope_table(float *out, const float *pos, long long rows, RopeAxes ax, double theta) {
    GRID_LOOP(i, rows * ax.width) {
        const long long r = i / ax.width, c = i % ax.width;
        int a = 0;
        while (a + 1 < ax.n_axes && c >= ax.col0[a + 1]) a++;
        const long long k = (c - ax.col0[a]) / 2, dim = ax.dim[a];
        const double freq = 1.0 / pow(theta, (double)(2 * k) / (double)dim);
        const double angle = (double)pos[r * ax.n_axes + a] * freq;
        out[i] = (float)cos(angle);
        out[rows * ax.width + i] = (float)sin(angle);
    }
}

/* c[r, j] = (src ? src[r, j] : c[r, j]) + bias[j], rounded once to c's dtype */
__global__ void k_bias_add(void *c, int cdt, long long ldc, const float *src, const void *bias, int bdt, long long rows,
                           long long n) {
    GRID_LOOP(i, rows * n) {
        const long long o = i / n * ldc + i % n;
        stf(c, cdt, o, (src ? src[i] : ldf(c, cdt, o)) + ldf(bias, bdt, i % n));
    }
}

Strided make_strided(int ndim, const int64_t *shape, int n_arrays, const int64_t *const *st) {
    Strided s = {};
    s.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        s.shape[d] = shape[d];
        for (int k = 0; k < n_arrays; k++) s.st[k][d] = st[k] ? st[k][d] : 0;
    }
    return s;
}

int row_threads(long long cols) { return cols >= 1024 ? 1024 : (cols >= 256 ? 256 : 128); }

} // namespace

#define STREAM ((cudaStream_t)stream)

extern "C" {

int cdf_cu_copy_strided(void *stream, void *dst, cdf_dtype dst_dt, const int64_t *dst_strides, const void *src,
                        cdf_dtype src_dt, const int64_t *src_strides, int ndim, const int64_t *shape) {
    const long long n = numel(ndim, shape);
    if (n == 0) return 0;
    const int64_t *st[2] = {dst_strides, src_strides};
    k_copy<<<blocks_for(n), kThreads, 0, STREAM>>>(make_strided(ndim, shape, 2, st), n, dst, dst_dt, src, src_dt);
    return launched();
}

int cdf_cu_fill(void *stream, void *dst, cdf_dtype dt, const int64_t *strides, int ndim, const int64_t *shape,
                double value) {
    const long long n = numel(ndim, shape);
    if (n == 0) return 0;
    const int64_t *st[1] = {strides};
    k_fill<<<blocks_for(n), kThreads, 0, STREAM>>>(make_strided(ndim, shape, 1, st), n, dst, dt, value);
    return launched();
}

int cdf_cu_embedding(void *stream, void *out, cdf_dtype out_dt, const void *table, cdf_dtype table_dt, int64_t rows,
                     int64_t dim, const void *ids, cdf_dtype ids_dt, int64_t n, cdf_cu_error_word *err) {
    if (n * dim == 0) return 0;
    k_embedding<<<blocks_for(n * dim), kThreads, 0, STREAM>>>(out, out_dt, table, table_dt, rows, dim, ids, ids_dt, n,
                                                               err);
    return launched();
}

int cdf_cu_unary(void *stream, cdf_unary_op op, float p0, float p1, void *out, cdf_dtype out_dt, const void *in,
                 cdf_dtype in_dt, int64_t n) {
    if (n == 0) return 0;
    k_unary<<<blocks_for(n), kThreads, 0, STREAM>>>(op, p0, p1, out, out_dt, in, in_dt, n);
    return launched();
}

int cdf_cu_fused(void *stream, const cdf_fused_program *p, void *out, cdf_dtype out_dt, int n_in,
                 const void *const *in, const cdf_dtype *in_dt, const int64_t *const *in_strides, int ndim,
                 const int64_t *shape) {
    const long long n = numel(ndim, shape);
    if (n == 0) return 0;
    if (n_in < 1 || n_in > CDF_FUSE_MAX_INPUTS) return (int)cudaErrorInvalidValue;
    /* the output is contiguous */
    int64_t out_st[CDF_MAX_DIMS];
    long long acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        out_st[d] = acc;
        acc *= shape[d];
    }
    const int64_t *st[CDF_FUSE_MAX_INPUTS + 1] = {out_st};
    FusedArgs f = {};
    f.prog = *p;
    f.n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        st[1 + i] = in_strides[i];
        f.in[i] = in[i];
        f.in_dt[i] = in_dt[i];
    }
    k_fused<<<blocks_for(n), kThreads, 0, STREAM>>>(make_strided(ndim, shape, n_in + 1, st), f, n, out, out_dt);
    return launched();
}

int cdf_cu_softmax(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                   int64_t cols, float scale) {
    if (rows == 0 || cols == 0) return 0;
    k_softmax<<<(unsigned)rows, row_threads(cols), 0, STREAM>>>(out, out_dt, in, in_dt, cols, scale);
    return launched();
}

int cdf_cu_layer_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                      int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt) {
    if (rows == 0 || cols == 0) return 0;
    k_layer_norm<<<(unsigned)rows, row_threads(cols), 0, STREAM>>>(out, out_dt, in, in_dt, cols, eps, weight, bias,
                                                                     wdt);
    return launched();
}

int cdf_cu_rms_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                    int64_t cols, float eps, const void *weight, cdf_dtype wdt) {
    if (rows == 0 || cols == 0) return 0;
    k_rms_norm<<<(unsigned)rows, row_threads(cols), 0, STREAM>>>(out, out_dt, in, in_dt, cols, eps, weight, wdt);
    return launched();
}

int cdf_cu_group_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t n,
                      int64_t c, int64_t s, int64_t groups, float eps, const void *weight, const void *bias,
                      cdf_dtype wdt) {
    if (n == 0 || c == 0 || s == 0) return 0;
    if (groups <= 0 || c % groups) return (int)cudaErrorInvalidValue;
    k_group_norm<<<(unsigned)(n * groups), 256, 0, STREAM>>>(out, out_dt, in, in_dt, c, s, groups, eps, weight, bias,
                                                             wdt);
    return launched();
}

int cdf_cu_reduce(void *stream, cdf_reduce_op op, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt,
                  int64_t outer, int64_t red, int64_t inner) {
    if (outer * inner == 0) return 0;
    k_reduce<<<blocks_for(outer * inner), kThreads, 0, STREAM>>>(op, out, out_dt, in, in_dt, outer, red, inner);
    return launched();
}

int cdf_cu_conv2d(void *stream, const cdf_k_conv2d_args *a) {
    const long long oh = (a->h + 2 * a->pad_h - a->dil_h * (a->kh - 1) - 1) / a->stride_h + 1;
    const long long ow = (a->w + 2 * a->pad_w - a->dil_w * (a->kw - 1) - 1) / a->stride_w + 1;
    const long long n = a->n * a->cout * oh * ow;
    if (n <= 0) return 0;
    k_conv2d<<<blocks_for(n), kThreads, 0, STREAM>>>(*a, oh, ow);
    return launched();
}

int cdf_cu_upsample_nearest(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t nc,
                            int64_t h, int64_t w, int64_t fh, int64_t fw) {
    const long long n = nc * h * fh * w * fw;
    if (n == 0) return 0;
    k_upsample<<<blocks_for(n), kThreads, 0, STREAM>>>(out, out_dt, in, in_dt, nc, h, w, fh, fw);
    return launched();
}

int cdf_cu_attention(void *stream, const cdf_k_attention_args *a) {
    if (a->d > CDF_CU_ATTN_MAX_D || a->dv > CDF_CU_ATTN_MAX_D) return (int)cudaErrorInvalidValue;
    const long long rows = a->b * a->h * a->lq;
    if (rows == 0 || a->dv == 0) return 0;
    const int warps = 4;
    k_attention<<<(unsigned)((rows + warps - 1) / warps), 32 * warps, 0, STREAM>>>(*a);
    return launched();
}

int cdf_cu_rope(void *stream, void *out, cdf_dtype out_dt, const void *x, cdf_dtype x_dt, const float *cos_t,
                const float *sin_t, int64_t b, int64_t h, int64_t l, int64_t d) {
    const long long rows = b * h * l;
    if (rows * (d / 2) == 0) return 0;
    k_rope<<<blocks_for(rows * (d / 2)), kThreads, 0, STREAM>>>(out, out_dt, x, x_dt, cos_t, sin_t, rows, l, d);
    return launched();
}

int cdf_cu_timestep_embedding(void *stream, float *out, const float *t, int64_t n, int64_t dim, bool flip_sin_to_cos,
                              float downscale_freq_shift, float scale, float max_period) {
    if (n * dim == 0) return 0;
    k_timestep<<<blocks_for(n * dim), kThreads, 0, STREAM>>>(out, t, n, dim, flip_sin_to_cos, downscale_freq_shift,
                                                             scale, max_period);
    return launched();
}

int cdf_cu_rope_table(void *stream, float *out, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim,
                      double theta) {
    if (n_axes <= 0 || n_axes > CDF_MAX_DIMS) return (int)cudaErrorInvalidValue;
    RopeAxes ax = {};
    ax.n_axes = n_axes;
    for (int a = 0; a < n_axes; a++) {
        ax.dim[a] = axes_dim[a];
        ax.col0[a] = ax.width;
        ax.width += axes_dim[a];
    }
    if (rows * ax.width == 0) return 0;
    k_rope_table<<<blocks_for(rows * ax.width), kThreads, 0, STREAM>>>(out, pos, rows, ax, theta);
    return launched();
}

int cdf_cu_bias_add(void *stream, void *c, cdf_dtype c_dt, int64_t ldc, const float *src, const void *bias,
                    cdf_dtype bias_dt, int64_t rows, int64_t n) {
    if (rows * n == 0) return 0;
    k_bias_add<<<blocks_for(rows * n), kThreads, 0, STREAM>>>(c, c_dt, ldc, src, bias, bias_dt, rows, n);
    return launched();
}

} // extern "C"
