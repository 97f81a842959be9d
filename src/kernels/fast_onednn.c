/* Fast matmul and conv2d on oneDNN (C API), see kernels/fast_onednn.h for what is handled,
 * the numerics of the bf16 path, the weight prepacking and its aliasing defences.
 *
 * Structure
 *  - state: engine + stream, CPU features, a primitive cache (hash of a plain key struct ->
 *    primitives and the memory descriptors they were made for) and a few growable workspaces;
 *    all behind one mutex. Prepacked weights live in the shared cache (kernels/pack_cache.h).
 *  - matmul: A, B, C are described to oneDNN with their own strides (transposes and batch
 *    broadcast included). A is first converted to the compute dtype by a oneDNN reorder when
 *    its dtype differs (f32 -> bf16 rounds to nearest even); B is prepacked or reordered when
 *    oneDNN prefers a blocked layout. alpha is oneDNN's output scale, which it applies after
 *    the bias (dst = alpha (acc + bias)), so with alpha != 1 the bias passed is bias / alpha
 *    (an f32 rounding of the bias, far inside the accumulation error). A binary post-op would
 *    be exact but oneDNN 2.6.3's gemm:jit matmul gives wrong results with it on batched,
 *    strided operands (found by tests/test_kernels_fast.c). beta = 1 is a sum post-op.
 *  - conv2d: src/weights/dst layouts are left to oneDNN ("any"); the NCHW input is reordered
 *    (and converted to bf16 for bf16 weights) into its layout, the result reordered back.
 * Any oneDNN failure while building a primitive declines (the reference runs); a failure
 * while executing one is reported as CDF_ERR_DEVICE, because C may be partly written. */
#include "kernels/fast_onednn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/host_memory.h"
#include "kernels/cpu_features.h"
#include "kernels/pack_cache.h"
#include "kernels/reference_internal.h"

#ifdef CDF_HAVE_ONEDNN

#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

/* ---- CPU features --------------------------------------------------------------------- */

typedef struct cpu_caps {
    bool avx2_fma, avx512_core, avx512_bf16, amx_bf16, amx_permitted;
    bool dnnl_f32_ok, dnnl_bf16_ok; /* oneDNN's effective ISA (ONEDNN_MAX_CPU_ISA may cap it) */
} cpu_caps;

/* cpuid + the OS-enabled register state (kernels/cpu_features.c). */
static void detect_cpu(cpu_caps *c) {
    memset(c, 0, sizeof *c);
    const cdf_k_cpu_features *f = cdf_k_cpu();
    c->avx2_fma = f->avx2_fma;
    c->avx512_core = f->avx512_core;
    c->avx512_bf16 = f->avx512_bf16;
    c->amx_bf16 = f->amx_bf16;
}

/* ---- state ---------------------------------------------------------------------------- */

enum {
    N_BUCKETS = 256,
    MAX_ENTRIES = 4096,     /* primitive entries before the cache is flushed */
    N_WS = 4,               /* workspace slots */
};
#define WS_KEEP_BYTES ((size_t)256 << 20) /* larger workspaces are freed after each call */
#define REORDER_B_MIN_M 1024 /* rows from which an uncached B is reordered per call (see matmul) */

struct entry;

static struct {
    pthread_mutex_t mu;
    int init; /* 0 = not tried, 1 = ready, -1 = unavailable */
    cpu_caps caps;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    struct entry *buckets[N_BUCKETS];
    int64_t n_entries;
    void *ws[N_WS];
    size_t ws_size[N_WS];
    cdf_k_fast_stats stats;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fast_init_locked(void) {
    if (g.init) return;
    g.init = -1;
    detect_cpu(&g.caps);
    /* CDIFFUSERS_ISA caps the level (kernels/cpu_features.h): oneDNN is capped to match, so a
     * forced fallback really runs the fallback's code (set before oneDNN's first primitive) */
    const cdf_k_isa level = cdf_k_isa_level();
    if (!g.caps.avx2_fma || level < CDF_K_ISA_AVX2) return;
    if (level == CDF_K_ISA_AVX2) {
        dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    } else if (level == CDF_K_ISA_AVX512) {
        dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core);
    } else if (g.caps.amx_bf16) {
        g.caps.amx_permitted = cdf_k_amx_usable(); /* asks Linux for the tile state (once) */
        /* without the permission an AMX kernel would fault: keep oneDNN below AMX */
        if (!g.caps.amx_permitted) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_bf16);
    }
    /* ISA values are nested bit sets: X is available when all its bits are in the effective one */
    const unsigned eff = (unsigned)dnnl_get_effective_cpu_isa();
    g.caps.dnnl_f32_ok = (eff & (unsigned)dnnl_cpu_isa_avx2) == (unsigned)dnnl_cpu_isa_avx2;
    g.caps.dnnl_bf16_ok = (eff & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16 ||
                          (eff & (unsigned)dnnl_cpu_isa_avx512_core_amx) == (unsigned)dnnl_cpu_isa_avx512_core_amx;
    if (!g.caps.dnnl_f32_ok) return;
    if (dnnl_engine_create(&g.eng, dnnl_cpu, 0) != dnnl_success) return;
    if (dnnl_stream_create(&g.stream, g.eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(g.eng);
        g.eng = NULL;
        return;
    }
    g.init = 1;
}

/* oneDNN's native bf16 kernels may run (else bf16 weights are widened to f32: emulation) */
static bool bf16_ok(void) {
    return cdf_k_isa_level() >= CDF_K_ISA_AVX512_BF16 && g.caps.dnnl_bf16_ok &&
           (g.caps.avx512_bf16 || (g.caps.amx_bf16 && g.caps.amx_permitted));
}

static void *ws_get(int slot, size_t bytes) {
    if (bytes == 0) bytes = 64;
    if (g.ws_size[slot] >= bytes) return g.ws[slot];
    cdf_host_free_large(g.ws[slot], g.ws_size[slot]);
    size_t rounded = (bytes + 63) & ~(size_t)63;
    g.ws[slot] = cdf_host_alloc_large(rounded); /* kept for reuse: core/host_memory.h */
    g.ws_size[slot] = g.ws[slot] ? rounded : 0;
    return g.ws[slot];
}

static void ws_trim(void) {
    for (int i = 0; i < N_WS; i++)
        if (g.ws_size[i] > WS_KEEP_BYTES) {
            cdf_host_free_large(g.ws[i], g.ws_size[i]);
            g.ws[i] = NULL;
            g.ws_size[i] = 0;
        }
}

static dnnl_data_type_t dnnl_dt(cdf_dtype dt) { return dt == CDF_BF16 ? dnnl_bf16 : dnnl_f32; }
static bool f32_or_bf16(cdf_dtype dt) { return dt == CDF_F32 || dt == CDF_BF16; }

/* ---- executing primitives --------------------------------------------------------------- */

typedef struct exec_args {
    int n;
    dnnl_exec_arg_t a[8];
} exec_args;

static void args_free(exec_args *e) {
    for (int i = 0; i < e->n; i++) dnnl_memory_destroy(e->a[i].memory);
    e->n = 0;
}

static bool args_add(exec_args *e, int arg, const dnnl_memory_desc_t *md, const void *ptr) {
    dnnl_memory_t m;
    if (e->n >= 8 || dnnl_memory_create(&m, md, g.eng, (void *)ptr) != dnnl_success) return false;
    e->a[e->n].arg = arg;
    e->a[e->n].memory = m;
    e->n++;
    return true;
}

/* Runs p on the stream and waits; frees the argument memories either way. */
static dnnl_status_t run_prim(dnnl_primitive_t p, exec_args *e) {
    dnnl_status_t s = dnnl_primitive_execute(p, g.stream, e->n, e->a);
    if (s == dnnl_success) s = dnnl_stream_wait(g.stream);
    args_free(e);
    return s;
}

static dnnl_status_t run_reorder(dnnl_primitive_t r, const dnnl_memory_desc_t *from_md, const void *from,
                                 const dnnl_memory_desc_t *to_md, void *to) {
    exec_args e = {0};
    if (!args_add(&e, DNNL_ARG_FROM, from_md, from) || !args_add(&e, DNNL_ARG_TO, to_md, to)) {
        args_free(&e);
        return dnnl_out_of_memory;
    }
    return run_prim(r, &e);
}

static dnnl_primitive_t make_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to) {
    dnnl_primitive_desc_t pd;
    if (dnnl_reorder_primitive_desc_create(&pd, from, g.eng, to, g.eng, NULL) != dnnl_success) return NULL;
    dnnl_primitive_t p = NULL;
    if (dnnl_primitive_create(&p, pd) != dnnl_success) p = NULL;
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* ---- prepacked weights ------------------------------------------------------------------ */

/* Elements from the first to the last element of a plain strided descriptor, inclusive (not
 * dnnl_memory_desc_get_size, which rounds a padded layout up past the last element). */
static size_t md_span_elems(const dnnl_memory_desc_t *md) {
    size_t last = 0;
    for (int i = 0; i < md->ndims; i++) last += (size_t)(md->dims[i] - 1) * (size_t)md->format_desc.blocking.strides[i];
    return last + 1;
}

/* A weight's layouts, as the prepack cache's layout tag: the user's and the primitive's. */
typedef struct w_layout {
    dnnl_memory_desc_t user_md, md;
} w_layout;

static bool w_layout_eq(const void *a, const void *b) {
    const w_layout *x = a, *y = b;
    return dnnl_memory_desc_equal(&x->user_md, &y->user_md) && dnnl_memory_desc_equal(&x->md, &y->md);
}

/* Fills a prepacked copy: the weights reordered into the primitive's layout (under g.mu). */
typedef struct reorder_fill {
    dnnl_primitive_t reorder;
    const w_layout *w;
    const void *src;
    dnnl_status_t st;
} reorder_fill;

static bool fill_reorder(void *ctx, void *dst) {
    reorder_fill *f = ctx;
    f->st = run_reorder(f->reorder, &f->w->user_md, f->src, &f->w->md, dst);
    return f->st == dnnl_success;
}

/* The weights operand for a run: the user pointer, the prepacked copy (*held set: release it
 * after the run), or a per-call reorder into workspace `slot` (the cap leaves no room, or the
 * weights may not be cached). NULL = failure (*st says which; success + NULL = out of memory). */
static const void *weights_for_run(const void *user, const w_layout *w, dnnl_primitive_t reorder, bool may_pack,
                                   int slot, cdf_k_pack **held, dnnl_status_t *st) {
    *st = dnnl_success;
    *held = NULL;
    if (!reorder) return user;
    if (may_pack) {
        const int64_t span = (int64_t)md_span_elems(&w->user_md);
        const cdf_k_pack_key key = {.kind = CDF_K_PACK_ONEDNN, .src = user, .bytes = dnnl_memory_desc_get_size(&w->md),
                                    .layout = w, .layout_size = sizeof *w, .layout_eq = w_layout_eq,
                                    .sum = cdf_k_pack_checksum(user, w->user_md.data_type == dnnl_bf16 ? 2 : 4, 1,
                                                               span, span)};
        reorder_fill f = {.reorder = reorder, .w = w, .src = user, .st = dnnl_success};
        const void *p = cdf_k_pack_get(&key, fill_reorder, &f, held);
        if (p || f.st != dnnl_success) {
            *st = f.st;
            return p;
        }
    }
    void *tmp = ws_get(slot, dnnl_memory_desc_get_size(&w->md));
    if (!tmp) return NULL;
    *st = run_reorder(reorder, &w->user_md, user, &w->md, tmp);
    if (*st != dnnl_success) return NULL;
    g.stats.unpacked_reorders++;
    return tmp;
}

/* ---- primitive cache -------------------------------------------------------------------- */

typedef enum { OP_MATMUL = 1, OP_CONV = 2 } op_kind;

/* Every field that changes the primitives. Built from a zeroed struct so memcmp is exact. */
typedef struct key {
    int32_t op, dts[5], flags, pad_;
    int64_t v[20];
    float alpha, beta;
} key;

typedef struct entry {
    struct entry *next;
    key k;
    bool usable;                /* false: oneDNN had nothing better than its reference impl */
    dnnl_primitive_t prim;
    char impl[64];
    /* source operand (matmul A / conv x): user layout -> primitive layout (NULL = use as is) */
    dnnl_memory_desc_t src_user_md, src_md;
    dnnl_primitive_t src_reorder;
    /* weights: user layout -> primitive layout (NULL = use as is) */
    w_layout w;
    dnnl_primitive_t w_reorder;
    bool w_may_pack;
    /* weights written in place by a caller (cdf_k_matmul_fast_filled): 0 = not looked at yet,
     * 1 = w.md described by w_off, -1 = a layout not handled */
    int w_fill;
    int64_t *w_off; /* [w_kp + w_np] byte offsets of k (padded) then n (padded) */
    int64_t w_kp, w_np;
    /* bias as an f32 [N] / [Cout] vector */
    dnnl_memory_desc_t bias_md;
    bool has_bias;
    /* destination: primitive layout -> user layout (conv only; NULL = written in place) */
    dnnl_memory_desc_t dst_md, dst_user_md;
    dnnl_primitive_t dst_reorder;
} entry;

static uint64_t key_hash(const key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void entry_free(entry *e) {
    free(e->w_off);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->src_reorder) dnnl_primitive_destroy(e->src_reorder);
    if (e->w_reorder) dnnl_primitive_destroy(e->w_reorder);
    if (e->dst_reorder) dnnl_primitive_destroy(e->dst_reorder);
    free(e);
}

static void entries_clear(void) {
    for (int b = 0; b < N_BUCKETS; b++) {
        entry *e = g.buckets[b];
        while (e) {
            entry *next = e->next;
            entry_free(e);
            e = next;
        }
        g.buckets[b] = NULL;
    }
    g.n_entries = 0;
    g.stats.primitives = 0;
}

static entry *entry_find(const key *k) {
    for (entry *e = g.buckets[key_hash(k) % N_BUCKETS]; e; e = e->next)
        if (memcmp(&e->k, k, sizeof *k) == 0) return e;
    return NULL;
}

static void entry_insert(entry *e) {
    if (g.n_entries >= MAX_ENTRIES) entries_clear();
    uint64_t b = key_hash(&e->k) % N_BUCKETS;
    e->next = g.buckets[b];
    g.buckets[b] = e;
    g.n_entries++;
    g.stats.primitives = g.n_entries;
}

/* Creates the primitive of `desc`; false when that fails or oneDNN only has a reference
 * implementation (slower than ours). Records the implementation name. */
static void (*g_new_primitive_hook)(void); /* set before the worker thread starts */
void cdf_k_fast_set_new_primitive_hook(void (*hook)(void)) { g_new_primitive_hook = hook; }

static bool make_prim(entry *e, const void *desc, dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd_out) {
    dnnl_primitive_desc_t pd;
    *pd_out = NULL;
    if (dnnl_primitive_desc_create(&pd, desc, attr, g.eng, NULL) != dnnl_success) return false;
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl ? impl : "?");
    if (strstr(e->impl, "ref") || dnnl_primitive_create(&e->prim, pd) != dnnl_success) {
        e->prim = NULL;
        dnnl_primitive_desc_destroy(pd);
        return false;
    }
    *pd_out = pd;
    void (*hook)(void) = g_new_primitive_hook;
    if (hook) hook();
    return true;
}

/* The bias as f32 divided by `div` (workspace slot 2 unless it is already that); NULL when out
 * of memory or when the division overflows (the caller declines). */
static const float *bias_f32(const void *bias, cdf_dtype dt, int64_t n, float div) {
    if (dt == CDF_F32 && div == 1.0f) return bias;
    float *w = ws_get(2, sizeof(float) * (size_t)n);
    if (!w) return NULL;
    for (int64_t i = 0; i < n; i++) {
        const float b = cdf_k_ld(bias, dt, i);
        w[i] = div == 1.0f ? b : b / div;
        if (isfinite(b) && !isfinite(w[i])) return NULL;
    }
    return w;
}

static void set_last_impl(const entry *e) { snprintf(g.stats.last_impl, sizeof g.stats.last_impl, "%s", e->impl); }

/* ---- matmul ---------------------------------------------------------------------------- */

/* The problem after normalisation: operand batch counts (1 = broadcast) and strides. */
typedef struct mm_shape {
    int64_t batch, M, N, K, ba, bb; /* ba/bb: batch extents of A/B (batch or 1) */
    int64_t a_str[3], b_str[3], c_str[3];
    int nd; /* 2 when batch == 1, else 3 */
} mm_shape;

static void mm_normalise(const cdf_k_matmul_args *x, mm_shape *s) {
    s->batch = x->batch;
    s->M = x->M;
    s->N = x->N;
    s->K = x->K;
    int64_t sa = x->sa;
    /* one weight matrix for a batch of row-stacked A/C: fold the batch into M (2-D problem) */
    if (s->batch > 1 && (x->sb == 0) && !x->trans_a && x->sa == x->M * x->lda && x->sc == x->M * x->ldc) {
        s->M *= s->batch;
        s->batch = 1;
    }
    s->nd = s->batch == 1 ? 2 : 3;
    s->ba = (s->batch > 1 && sa != 0) ? s->batch : 1;
    s->bb = (s->batch > 1 && x->sb != 0) ? s->batch : 1;
    /* strides for (batch, rows, cols) of op(A) [M, K], op(B) [K, N], C [M, N] */
    s->a_str[0] = s->ba > 1 ? sa : s->M * s->K;
    s->a_str[1] = x->trans_a ? 1 : x->lda;
    s->a_str[2] = x->trans_a ? x->lda : 1;
    s->b_str[0] = s->bb > 1 ? x->sb : s->K * s->N;
    s->b_str[1] = x->trans_b ? 1 : x->ldb;
    s->b_str[2] = x->trans_b ? x->ldb : 1;
    s->c_str[0] = s->batch > 1 ? x->sc : s->M * s->N;
    s->c_str[1] = x->ldc;
    s->c_str[2] = 1;
}

/* A 2-D or 3-D (batch, rows, cols) descriptor with explicit strides, or dense when str is NULL
 * (tag ab/abc), or "any" layout when any is set. */
static bool md3(dnnl_memory_desc_t *md, int nd, int64_t bat, int64_t rows, int64_t cols, dnnl_data_type_t dt,
                const int64_t *str, bool any) {
    dnnl_dims_t dims = {0}, strides = {0};
    if (nd == 2) {
        dims[0] = rows;
        dims[1] = cols;
    } else {
        dims[0] = bat;
        dims[1] = rows;
        dims[2] = cols;
    }
    if (any) return dnnl_memory_desc_init_by_tag(md, nd, dims, dt, dnnl_format_tag_any) == dnnl_success;
    if (!str) return dnnl_memory_desc_init_by_tag(md, nd, dims, dt, nd == 2 ? dnnl_ab : dnnl_abc) == dnnl_success;
    if (nd == 2) {
        strides[0] = str[1];
        strides[1] = str[2];
    } else {
        strides[0] = str[0];
        strides[1] = str[1];
        strides[2] = str[2];
    }
    return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides) == dnnl_success;
}

/* Builds the entry for a matmul (one attempt = one choice of A/B layouts). */
static bool mm_try(entry *e, const cdf_k_matmul_args *x, const mm_shape *s, dnnl_data_type_t cdt, bool a_dense,
                   bool b_any) {
    const int nd = s->nd;
    if (!md3(&e->src_user_md, nd, s->ba, s->M, s->K, dnnl_dt(x->a_dt), s->a_str, false)) return false;
    if (a_dense) {
        if (!md3(&e->src_md, nd, s->ba, s->M, s->K, cdt, NULL, false)) return false;
    } else {
        e->src_md = e->src_user_md;
    }
    if (!md3(&e->w.user_md, nd, s->bb, s->K, s->N, dnnl_dt(x->b_dt), s->b_str, false)) return false;
    dnnl_memory_desc_t w_req = e->w.user_md;
    if (b_any && !md3(&w_req, nd, s->bb, s->K, s->N, cdt, NULL, true)) return false;
    if (!md3(&e->dst_user_md, nd, s->batch, s->M, s->N, dnnl_dt(x->c_dt), s->c_str, false)) return false;
    e->dst_md = e->dst_user_md;
    e->has_bias = x->bias != NULL;
    if (e->has_bias && !md3(&e->bias_md, nd, 1, 1, s->N, dnnl_f32, NULL, false)) return false;

    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, &e->src_md, &w_req, e->has_bias ? &e->bias_md : NULL, &e->dst_md) !=
        dnnl_success)
        return false;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && x->alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &x->alpha) == dnnl_success;
    if (ok && x->beta != 0.0f) {
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    dnnl_primitive_desc_t pd = NULL;
    if (ok) ok = make_prim(e, &desc, attr, &pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) return false;
    e->w.md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_desc_destroy(pd);
    if (a_dense && !(e->src_reorder = make_reorder(&e->src_user_md, &e->src_md))) return false;
    if (!dnnl_memory_desc_equal(&e->w.md, &e->w.user_md) && !(e->w_reorder = make_reorder(&e->w.user_md, &e->w.md)))
        return false;
    return true;
}

static void entry_reset(entry *e) {
    key k = e->k;
    free(e->w_off);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->src_reorder) dnnl_primitive_destroy(e->src_reorder);
    if (e->w_reorder) dnnl_primitive_destroy(e->w_reorder);
    if (e->dst_reorder) dnnl_primitive_destroy(e->dst_reorder);
    memset(e, 0, sizeof *e);
    e->k = k;
}

/* b_any: let oneDNN choose B's layout (reordering B into it); may_pack: keep that reordered copy
 * in the prepack cache instead of redoing it per call. */
static entry *mm_entry(const cdf_k_matmul_args *x, const mm_shape *s, dnnl_data_type_t cdt, bool b_any,
                       bool may_pack) {
    key k;
    memset(&k, 0, sizeof k);
    k.op = OP_MATMUL;
    k.dts[0] = x->a_dt;
    k.dts[1] = x->b_dt;
    k.dts[2] = x->c_dt;
    k.dts[3] = x->bias ? (int32_t)x->bias_dt : -1;
    k.dts[4] = (int32_t)cdt;
    k.flags = (x->trans_a ? 1 : 0) | (x->trans_b ? 2 : 0) | (b_any ? 4 : 0) | (may_pack ? 8 : 0);
    const int64_t v[] = {s->batch, s->M, s->N, s->K, s->ba, s->bb, s->a_str[0], s->a_str[1], s->a_str[2],
                         s->b_str[0], s->b_str[1], s->b_str[2], s->c_str[0], s->c_str[1]};
    memcpy(k.v, v, sizeof v);
    k.alpha = x->alpha;
    k.beta = x->beta;
    entry *e = entry_find(&k);
    if (e) return e;
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->k = k;
    const bool a_direct_ok = x->a_dt == (cdf_dtype)(cdt == dnnl_bf16 ? CDF_BF16 : CDF_F32);
    /* 1: A as it is (when already in the compute dtype), B as it is or in oneDNN's packed layout
     * 2: A dense (reordered), B in oneDNN's preferred layout */
    e->usable = mm_try(e, x, s, cdt, !a_direct_ok, b_any);
    if (!e->usable) {
        entry_reset(e);
        e->usable = mm_try(e, x, s, cdt, true, true);
    }
    if (!e->usable) entry_reset(e);
    e->w_may_pack = may_pack;
    entry_insert(e);
    return e;
}

static cdf_status dnnl_fail(const char *what, dnnl_status_t st) {
    return cdf_error(CDF_ERR_DEVICE, "%s: oneDNN execution failed (dnnl status %d)", what, (int)st);
}

static cdf_status mm_exec(entry *e, const cdf_k_matmul_args *x, const void *a, const void *b, bool *handled);

/* A caller's writer of B (cdf_k_matmul_fast_filled). */
typedef struct b_filler {
    cdf_k_fast_b_fill fill;
    void *ctx;
} b_filler;

/* Byte offset of index i along dimension d of a blocked descriptor, every other index 0. oneDNN
 * places an element at offset0 + sum over dimensions of (outer index * stride) + its position in
 * the inner blocks (memory_desc_wrapper::off_v); with offset0 = 0 and no padded offsets that is a
 * sum of one term per dimension, this one. */
static int64_t blk_dim_off(const dnnl_memory_desc_t *md, int d, int64_t i) {
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    int64_t off = 0, blk_stride = 1;
    for (int j = b->inner_nblks - 1; j >= 0; j--) {
        if (b->inner_idxs[j] == d) {
            off += i % b->inner_blks[j] * blk_stride;
            i /= b->inner_blks[j];
        }
        blk_stride *= b->inner_blks[j];
    }
    return (off + i * b->strides[d]) * (int64_t)(md->data_type == dnnl_bf16 ? 2 : 4);
}

/* e->w_fill: whether the primitive's B layout (2-D [K, N]) can be written through offset tables,
 * which are made here once. Anything not understood (compensation, padded offsets, other
 * formats) is refused: the caller then writes plain B, reordered as usual. */
static bool w_fill_ready(entry *e) {
    if (e->w_fill) return e->w_fill > 0;
    e->w_fill = -1;
    const dnnl_memory_desc_t *md = &e->w.md;
    if (md->ndims != 2 || md->format_kind != dnnl_blocked || md->offset0 != 0 ||
        md->extra.flags != dnnl_memory_extra_flag_none || (md->data_type != dnnl_bf16 && md->data_type != dnnl_f32))
        return false;
    for (int d = 0; d < 2; d++)
        if (md->padded_offsets[d] != 0 || md->padded_dims[d] < md->dims[d]) return false;
    const int64_t kp = md->padded_dims[0], np = md->padded_dims[1];
    const int64_t esz = md->data_type == dnnl_bf16 ? 2 : 4, size = (int64_t)dnnl_memory_desc_get_size(md);
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(kp + np));
    if (!off) return false;
    int64_t max_k = 0, max_n = 0;
    for (int64_t k = 0; k < kp; k++) {
        off[k] = blk_dim_off(md, 0, k);
        if (off[k] < 0) max_k = size;
        else if (off[k] > max_k) max_k = off[k];
    }
    for (int64_t n = 0; n < np; n++) {
        off[kp + n] = blk_dim_off(md, 1, n);
        if (off[kp + n] < 0) max_n = size;
        else if (off[kp + n] > max_n) max_n = off[kp + n];
    }
    if (max_k + max_n + esz > size) { /* not the layout it seems: every element must lie inside */
        free(off);
        return false;
    }
    e->w_off = off;
    e->w_kp = kp;
    e->w_np = np;
    e->w_fill = 1;
    return true;
}

/* The weights written by the caller into workspace 1 in the primitive's layout, the padding
 * (elements past K or N, which the primitive may read) zeroed first. NULL: out of memory (*cs
 * CDF_OK) or the fill's error (*cs). */
static const void *weights_filled(entry *e, const b_filler *f, cdf_status *cs) {
    *cs = CDF_OK;
    const dnnl_memory_desc_t *md = &e->w.md;
    char *buf = ws_get(1, dnnl_memory_desc_get_size(md));
    if (!buf) return NULL;
    const int64_t K = md->dims[0], N = md->dims[1], kp = e->w_kp, np = e->w_np;
    const int64_t *off_k = e->w_off, *off_n = e->w_off + kp;
    const size_t esz = md->data_type == dnnl_bf16 ? 2 : 4;
    for (int64_t n = 0; n < np; n++)
        for (int64_t k = n < N ? K : 0; k < kp; k++) memset(buf + off_k[k] + off_n[n], 0, esz);
    cdf_k_fast_b_layout l = {.K = K, .N = N, .off_k = off_k, .off_n = off_n,
                             .dt = md->data_type == dnnl_bf16 ? CDF_BF16 : CDF_F32, .k_run = 1};
    const int64_t runs[2] = {K, 2};
    for (int i = 0; i < 2 && l.k_run == 1; i++) {
        bool ok = runs[i] > 1 && K % runs[i] == 0;
        for (int64_t k = 0; k < K && ok; k++) ok = off_k[k] == off_k[k - k % runs[i]] + k % runs[i] * (int64_t)esz;
        if (ok) l.k_run = runs[i];
    }
    *cs = f->fill(f->ctx, buf, &l);
    if (*cs != CDF_OK) return NULL;
    g.stats.direct_fills++;
    return buf;
}

/* f: B is written by the caller into the primitive's layout instead of read from x->b. */
static cdf_status mm_run(entry *e, const cdf_k_matmul_args *x, const b_filler *f, bool *handled) {
    static const char *fn = "cdf_k_matmul_fast";
    dnnl_status_t st = dnnl_success;
    /* A: converted / made dense into workspace 0 when the primitive wants that */
    const void *a = x->a;
    if (e->src_reorder) {
        void *buf = ws_get(0, dnnl_memory_desc_get_size(&e->src_md));
        if (!buf) return CDF_OK; /* decline: the reference needs less memory */
        st = run_reorder(e->src_reorder, &e->src_user_md, x->a, &e->src_md, buf);
        if (st != dnnl_success) return dnnl_fail(fn, st);
        a = buf;
    }
    cdf_k_pack *held = NULL;
    const void *b;
    if (f) {
        cdf_status cs;
        b = weights_filled(e, f, &cs);
        if (cs != CDF_OK) return cs;
    } else {
        b = weights_for_run(x->b, &e->w, e->w_reorder, e->w_may_pack, 1, &held, &st);
        if (st != dnnl_success) return dnnl_fail(fn, st);
    }
    if (!b) return CDF_OK;
    const cdf_status s = mm_exec(e, x, a, b, handled);
    cdf_k_pack_release(held);
    return s;
}

/* mm_run with A and B in the primitive's layouts. */
static cdf_status mm_exec(entry *e, const cdf_k_matmul_args *x, const void *a, const void *b, bool *handled) {
    const float *bias = NULL;
    if (e->has_bias && !(bias = bias_f32(x->bias, x->bias_dt, x->N, x->alpha))) return CDF_OK;

    exec_args ea = {0};
    bool ok = args_add(&ea, DNNL_ARG_SRC, &e->src_md, a) && args_add(&ea, DNNL_ARG_WEIGHTS, &e->w.md, b) &&
              args_add(&ea, DNNL_ARG_DST, &e->dst_md, x->c);
    if (ok && e->has_bias) ok = args_add(&ea, DNNL_ARG_BIAS, &e->bias_md, bias);
    if (!ok) {
        args_free(&ea);
        return CDF_OK;
    }
    const dnnl_status_t st = run_prim(e->prim, &ea);
    if (st != dnnl_success) return dnnl_fail("cdf_k_matmul_fast", st);
    set_last_impl(e);
    *handled = true;
    return CDF_OK;
}

/* cdf_k_matmul_fast, with B written by f when f is set (x->b then unused). */
static cdf_status mm_fast(const cdf_k_matmul_args *x, const b_filler *f, bool *handled) {
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_matmul_fast: handled is NULL");
    *handled = false;
    if (!x) return CDF_OK;
    /* only well-formed, non-empty problems in supported dtypes; the reference reports the rest */
    if (x->batch < 1 || x->M < 1 || x->N < 1 || x->K < 1 || !x->a || !(x->b || f) || !x->c) return CDF_OK;
    if (f && (x->batch != 1 || x->b_dt != CDF_BF16)) return CDF_OK;
    if (!f32_or_bf16(x->a_dt) || !f32_or_bf16(x->b_dt) || !f32_or_bf16(x->c_dt)) return CDF_OK;
    if (x->bias && !f32_or_bf16(x->bias_dt)) return CDF_OK;
    if (x->beta != 0.0f && x->beta != 1.0f) return CDF_OK;
    if (x->bias && !(x->alpha != 0.0f && isfinite(x->alpha))) return CDF_OK; /* bias is passed as bias / alpha */
    if (x->lda < (x->trans_a ? x->M : x->K) || x->ldb < (x->trans_b ? x->K : x->N) || x->ldc < x->N) return CDF_OK;
    if (x->sa < 0 || x->sb < 0 || x->sc < 0) return CDF_OK;
    if (x->batch > 1 && (x->sc == 0 || (x->sa == 0 && x->sb == 0))) return CDF_OK; /* degenerate batches */

    pthread_mutex_lock(&g.mu);
    fast_init_locked();
    cdf_status s = CDF_OK;
    /* bf16 weights: oneDNN's bf16 kernels where the CPU has them; otherwise f32 compute on the
     * weights widened to f32 (exact), with A already rounded to bf16 by the dispatch (an f32 A
     * is declined there: the bf16 policy needs it rounded first) */
    const dnnl_data_type_t cdt = x->b_dt == CDF_BF16 && bf16_ok() ? dnnl_bf16 : dnnl_f32;
    const bool widen_b = x->b_dt == CDF_BF16 && cdt == dnnl_f32;
    const bool ok_dts = cdt == dnnl_bf16 || (x->c_dt == CDF_F32 && !(widen_b && x->a_dt == CDF_F32));
    if (g.init == 1 && ok_dts) {
        mm_shape sh;
        mm_normalise(x, &sh);
        /* bf16 weights (one matrix for the batch) are prepacked. f32 B is never cached (f32
         * operands are as often activations as weights). Uncached, with many rows a per-call
         * reorder into oneDNN's blocked layout pays for itself (f32 4429 x 1536 x 1536: ~1.7x;
         * bf16 4429 x 6144 x 1536: ~2x over oneDNN copying plain B blocks itself); with few
         * rows the reorder would cost as much as the product. A B the caller writes (f) goes
         * straight into whatever layout the primitive prefers, which costs no reorder at all: the
         * text stream's M = 512 of FLUX at 512² ran 8% slower in the plain layout (Q8_0 weights). */
        const bool may_pack = x->b_dt == CDF_BF16 && sh.bb == 1 && cdf_k_pack_limit() > 0 && !x->b_transient && !f;
        const bool b_any = widen_b || (sh.bb == 1 && (may_pack || f || sh.M >= REORDER_B_MIN_M));
        entry *e = mm_entry(x, &sh, cdt, b_any, may_pack);
        if (e && e->usable && (!f || w_fill_ready(e))) s = mm_run(e, x, f, handled);
        ws_trim();
    }
    if (*handled)
        g.stats.matmul_handled++;
    else
        g.stats.matmul_declined++;
    pthread_mutex_unlock(&g.mu);
    /* outside the lock: the epilogue is the caller's code and other matmuls may run meanwhile */
    if (s == CDF_OK && *handled) cdf_k_matmul_run_epilogue(x);
    return s;
}

cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *x, bool *handled) { return mm_fast(x, NULL, handled); }

cdf_status cdf_k_matmul_fast_filled(const cdf_k_matmul_args *x, cdf_k_fast_b_fill fill, void *ctx, bool *handled) {
    if (!fill) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_matmul_fast_filled: no fill");
    const b_filler f = {.fill = fill, .ctx = ctx};
    return mm_fast(x, &f, handled);
}

/* ---- conv2d ---------------------------------------------------------------------------- */

static entry *conv_entry(const cdf_k_conv2d_args *x, dnnl_data_type_t cdt, int64_t oh, int64_t ow, int64_t pr_h,
                         int64_t pr_w) {
    key k;
    memset(&k, 0, sizeof k);
    k.op = OP_CONV;
    k.dts[0] = x->x_dt;
    k.dts[1] = x->w_dt;
    k.dts[2] = x->out_dt;
    k.dts[3] = x->bias ? (int32_t)x->b_dt : -1;
    k.dts[4] = (int32_t)cdt;
    const int64_t v[] = {x->n, x->cin, x->h, x->w, x->cout, x->kh, x->kw, x->stride_h, x->stride_w,
                         x->pad_h, x->pad_w, x->dil_h, x->dil_w, x->groups};
    memcpy(k.v, v, sizeof v);
    entry *e = entry_find(&k);
    if (e) return e;
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->k = k;
    e->w_may_pack = true;

    const int64_t g_ = x->groups;
    /* a negative right padding means trailing input rows/columns no window reaches: describe
     * the input cropped to the rows/columns used (same strides) and pad nothing on the right */
    const int64_t h_used = x->h + (pr_h < 0 ? pr_h : 0), w_used = x->w + (pr_w < 0 ? pr_w : 0);
    if (pr_h < 0) pr_h = 0;
    if (pr_w < 0) pr_w = 0;
    dnnl_dims_t src_d = {x->n, x->cin, h_used, w_used}, dst_d = {x->n, x->cout, oh, ow};
    dnnl_dims_t src_str = {x->cin * x->h * x->w, x->h * x->w, x->w, 1};
    dnnl_dims_t w_d = {0};
    int w_nd;
    if (g_ == 1) {
        w_nd = 4;
        w_d[0] = x->cout; w_d[1] = x->cin; w_d[2] = x->kh; w_d[3] = x->kw;
    } else {
        w_nd = 5;
        w_d[0] = g_; w_d[1] = x->cout / g_; w_d[2] = x->cin / g_; w_d[3] = x->kh; w_d[4] = x->kw;
    }
    dnnl_dims_t bias_d = {x->cout};
    dnnl_dims_t strides = {x->stride_h, x->stride_w}, dil = {x->dil_h - 1, x->dil_w - 1};
    dnnl_dims_t pad_l = {x->pad_h, x->pad_w}, pad_r = {pr_h, pr_w};
    dnnl_memory_desc_t src_any, w_any, dst_any;
    /* the f32 accumulator leaves the primitive as f32; the reorder back rounds once to bf16 */
    bool ok = dnnl_memory_desc_init_by_strides(&e->src_user_md, 4, src_d, dnnl_dt(x->x_dt), src_str) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->dst_user_md, 4, dst_d, dnnl_dt(x->out_dt), dnnl_nchw) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->w.user_md, w_nd, w_d, dnnl_dt(x->w_dt), g_ == 1 ? dnnl_oihw : dnnl_goihw) ==
                  dnnl_success &&
              dnnl_memory_desc_init_by_tag(&src_any, 4, src_d, cdt, dnnl_format_tag_any) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&w_any, w_nd, w_d, cdt, dnnl_format_tag_any) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&dst_any, 4, dst_d, dnnl_f32, dnnl_format_tag_any) == dnnl_success;
    e->has_bias = x->bias != NULL;
    if (ok && e->has_bias) ok = dnnl_memory_desc_init_by_tag(&e->bias_md, 1, bias_d, dnnl_f32, dnnl_a) == dnnl_success;
    dnnl_convolution_desc_t desc;
    if (ok)
        ok = dnnl_dilated_convolution_forward_desc_init(&desc, dnnl_forward_inference, dnnl_convolution_direct,
                                                        &src_any, &w_any, e->has_bias ? &e->bias_md : NULL, &dst_any,
                                                        strides, dil, pad_l, pad_r) == dnnl_success;
    dnnl_primitive_desc_t pd = NULL;
    if (ok) ok = make_prim(e, &desc, NULL, &pd);
    if (ok) {
        e->src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        e->w.md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        e->dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        dnnl_primitive_desc_destroy(pd);
        if (!dnnl_memory_desc_equal(&e->src_md, &e->src_user_md))
            ok = (e->src_reorder = make_reorder(&e->src_user_md, &e->src_md)) != NULL;
        if (ok && !dnnl_memory_desc_equal(&e->w.md, &e->w.user_md))
            ok = (e->w_reorder = make_reorder(&e->w.user_md, &e->w.md)) != NULL;
        if (ok && !dnnl_memory_desc_equal(&e->dst_md, &e->dst_user_md))
            ok = (e->dst_reorder = make_reorder(&e->dst_md, &e->dst_user_md)) != NULL;
    }
    e->usable = ok;
    if (!ok) {
        entry_reset(e);
        e->w_may_pack = true;
    }
    entry_insert(e);
    return e;
}

static cdf_status conv_exec(entry *e, const cdf_k_conv2d_args *x, const void *src, const void *w, bool *handled);

static cdf_status conv_run(entry *e, const cdf_k_conv2d_args *x, bool *handled) {
    static const char *fn = "cdf_k_conv2d_fast";
    dnnl_status_t st = dnnl_success;
    const void *src = x->x;
    if (e->src_reorder) {
        void *buf = ws_get(0, dnnl_memory_desc_get_size(&e->src_md));
        if (!buf) return CDF_OK;
        st = run_reorder(e->src_reorder, &e->src_user_md, x->x, &e->src_md, buf);
        if (st != dnnl_success) return dnnl_fail(fn, st);
        src = buf;
    }
    cdf_k_pack *held;
    const void *w = weights_for_run(x->weight, &e->w, e->w_reorder, e->w_may_pack, 1, &held, &st);
    if (st != dnnl_success) return dnnl_fail(fn, st);
    if (!w) return CDF_OK;
    const cdf_status s = conv_exec(e, x, src, w, handled);
    cdf_k_pack_release(held);
    return s;
}

/* conv_run with the input and weights in the primitive's layouts. */
static cdf_status conv_exec(entry *e, const cdf_k_conv2d_args *x, const void *src, const void *w, bool *handled) {
    const float *bias = NULL;
    if (e->has_bias && !(bias = bias_f32(x->bias, x->b_dt, x->cout, 1.0f))) return CDF_OK;
    void *dst = x->out;
    if (e->dst_reorder && !(dst = ws_get(3, dnnl_memory_desc_get_size(&e->dst_md)))) return CDF_OK;

    exec_args ea = {0};
    bool ok = args_add(&ea, DNNL_ARG_SRC, &e->src_md, src) && args_add(&ea, DNNL_ARG_WEIGHTS, &e->w.md, w) &&
              args_add(&ea, DNNL_ARG_DST, &e->dst_md, dst);
    if (ok && e->has_bias) ok = args_add(&ea, DNNL_ARG_BIAS, &e->bias_md, bias);
    if (!ok) {
        args_free(&ea);
        return CDF_OK;
    }
    dnnl_status_t st = run_prim(e->prim, &ea);
    if (st == dnnl_success && e->dst_reorder) st = run_reorder(e->dst_reorder, &e->dst_md, dst, &e->dst_user_md, x->out);
    if (st != dnnl_success) return dnnl_fail("cdf_k_conv2d_fast", st);
    set_last_impl(e);
    *handled = true;
    return CDF_OK;
}

cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *x, bool *handled) {
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_conv2d_fast: handled is NULL");
    *handled = false;
    if (!x) return CDF_OK;
    if (!f32_or_bf16(x->x_dt) || !f32_or_bf16(x->w_dt) || !f32_or_bf16(x->out_dt)) return CDF_OK;
    if (x->bias && !f32_or_bf16(x->b_dt)) return CDF_OK;
    if (x->n < 1 || x->h < 1 || x->w < 1 || x->pad_h < 0 || x->pad_w < 0 || x->kh < 1 || x->kw < 1 ||
        x->stride_h < 1 || x->stride_w < 1 || x->dil_h < 1 || x->dil_w < 1 || x->groups < 1 || x->cin < 1 ||
        x->cout < 1 || x->cin % x->groups || x->cout % x->groups || !x->x || !x->weight || !x->out)
        return CDF_OK;
    const int64_t ekh = x->dil_h * (x->kh - 1) + 1, ekw = x->dil_w * (x->kw - 1) + 1;
    if (x->h + 2 * x->pad_h < ekh || x->w + 2 * x->pad_w < ekw) return CDF_OK;
    const int64_t oh = (x->h + 2 * x->pad_h - ekh) / x->stride_h + 1;
    const int64_t ow = (x->w + 2 * x->pad_w - ekw) / x->stride_w + 1;
    /* oneDNN wants the right padding that makes its size formula give torch's (floored) size;
     * it comes out negative when input rows/columns at the end are reached by no window */
    const int64_t pr_h = (oh - 1) * x->stride_h + ekh - x->h - x->pad_h;
    const int64_t pr_w = (ow - 1) * x->stride_w + ekw - x->w - x->pad_w;

    pthread_mutex_lock(&g.mu);
    fast_init_locked();
    cdf_status s = CDF_OK;
    /* as matmul: bf16 weights without native bf16 kernels are widened, x must be rounded already */
    const dnnl_data_type_t cdt = x->w_dt == CDF_BF16 && bf16_ok() ? dnnl_bf16 : dnnl_f32;
    const bool widen_w = x->w_dt == CDF_BF16 && cdt == dnnl_f32;
    if (g.init == 1 && !(widen_w && x->x_dt == CDF_F32)) {
        entry *e = conv_entry(x, cdt, oh, ow, pr_h, pr_w);
        if (e && e->usable) s = conv_run(e, x, handled);
        ws_trim();
    }
    if (*handled)
        g.stats.conv_handled++;
    else
        g.stats.conv_declined++;
    pthread_mutex_unlock(&g.mu);
    return s;
}

/* ---- controls --------------------------------------------------------------------------- */

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    default: return "all/other";
    }
}

void cdf_k_fast_get_info(cdf_k_fast_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&g.mu);
    fast_init_locked();
    out->available = g.init == 1;
    out->avx2_fma = g.caps.avx2_fma;
    out->avx512_core = g.caps.avx512_core;
    out->avx512_bf16 = g.caps.avx512_bf16;
    out->amx_bf16 = g.caps.amx_bf16;
    out->amx_permitted = g.caps.amx_permitted;
    out->bf16_supported = g.init == 1 && bf16_ok();
    const dnnl_version_t *v = dnnl_version();
    snprintf(out->onednn_version, sizeof out->onednn_version, "%d.%d.%d", v->major, v->minor, v->patch);
    snprintf(out->onednn_isa, sizeof out->onednn_isa, "%s", isa_name(dnnl_get_effective_cpu_isa()));
    snprintf(out->level, sizeof out->level, "%s", cdf_k_isa_name(cdf_k_isa_level()));
    pthread_mutex_unlock(&g.mu);
}

/* The prepack counters are the cache's; oneDNN's "packs" has always counted first copies only
 * (a copy made again for changed data at a known address is a repack). */
static void pack_stats_into(cdf_k_fast_stats *out) {
    cdf_k_pack_stats ps;
    cdf_k_pack_get_stats(CDF_K_PACK_ONEDNN, &ps);
    out->packed_weights = ps.packed_weights;
    out->packed_bytes = ps.packed_bytes;
    out->packs = ps.packs - ps.refreshes;
    out->repacks = ps.repacks;
}

void cdf_k_fast_get_stats(cdf_k_fast_stats *out) {
    if (!out) return;
    pthread_mutex_lock(&g.mu);
    *out = g.stats;
    pthread_mutex_unlock(&g.mu);
    pack_stats_into(out);
}

void cdf_k_fast_reset_stats(void) {
    pthread_mutex_lock(&g.mu);
    const int64_t primitives = g.stats.primitives; /* describes the cache, not a counter */
    memset(&g.stats, 0, sizeof g.stats);
    g.stats.primitives = primitives;
    pthread_mutex_unlock(&g.mu);
    cdf_k_pack_reset_stats(CDF_K_PACK_ONEDNN);
}

void cdf_k_fast_clear(void) {
    cdf_k_pack_clear();
    pthread_mutex_lock(&g.mu);
    entries_clear();
    for (int i = 0; i < N_WS; i++) {
        cdf_host_free_large(g.ws[i], g.ws_size[i]);
        g.ws[i] = NULL;
        g.ws_size[i] = 0;
    }
    pthread_mutex_unlock(&g.mu);
}

#else /* !CDF_HAVE_ONEDNN: everything declines, so the reference kernels run */

cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *x, bool *handled) {
    (void)x;
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_matmul_fast: handled is NULL");
    *handled = false;
    return CDF_OK;
}

cdf_status cdf_k_matmul_fast_filled(const cdf_k_matmul_args *x, cdf_k_fast_b_fill fill, void *ctx, bool *handled) {
    (void)x, (void)fill, (void)ctx;
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_matmul_fast_filled: handled is NULL");
    *handled = false;
    return CDF_OK;
}

cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *x, bool *handled) {
    (void)x;
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_conv2d_fast: handled is NULL");
    *handled = false;
    return CDF_OK;
}

void cdf_k_fast_get_info(cdf_k_fast_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    snprintf(out->level, sizeof out->level, "%s", cdf_k_isa_name(cdf_k_isa_level()));
}
void cdf_k_fast_get_stats(cdf_k_fast_stats *out) {
    if (out) memset(out, 0, sizeof *out);
}
void cdf_k_fast_reset_stats(void) {}
void cdf_k_fast_clear(void) { cdf_k_pack_clear(); }
void cdf_k_fast_set_new_primitive_hook(void (*hook)(void)) { (void)hook; }

#endif
