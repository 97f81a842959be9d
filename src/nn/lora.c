/* LoRA on linear layers (see nn/lora.h). */
#include "nn/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "tensor/tensor_impl.h"

#define CDF_LORA_NAME_MAX_WHAT 320

/* ---- scale slots -------------------------------------------------------------------------- */
/* One [R] tensor for every layer that carries the same adapters with the same ranks, in order. */
typedef struct lora_slot {
    struct lora_slot *next;
    int n;
    int adapter[CDF_LORA_MAX_ADAPTERS];
    int64_t rank[CDF_LORA_MAX_ADAPTERS];
    int64_t total;
    cdf_tensor *t; /* replaced by cdf_lora_scales_set; links point at this field */
} lora_slot;

struct cdf_lora_scales {
    cdf_device *dev;
    float scale[CDF_LORA_MAX_ADAPTERS];
    lora_slot *slots;
};

typedef struct lora_part {
    int adapter;
    int64_t rank;
    cdf_tensor *a, *b;
} lora_part;

/* A layer's run-time adapters: its hook (nn/nn.h), the first member, so that the layer's
 * cdf_linear_hook pointer is the link's address. */
typedef struct cdf_lora_link {
    cdf_linear_hook hook;
    cdf_tensor *a, *b; /* concatenations of the parts */
    lora_slot *slot;
    int n_parts;
    lora_part parts[CDF_LORA_MAX_ADAPTERS];
} cdf_lora_link;

cdf_lora_scales *cdf_lora_scales_new(cdf_device *dev) {
    cdf_lora_scales *sc = calloc(1, sizeof *sc);
    if (!sc) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    sc->dev = dev;
    for (int i = 0; i < CDF_LORA_MAX_ADAPTERS; i++) sc->scale[i] = 1.0f;
    return sc;
}

void cdf_lora_scales_free(cdf_lora_scales *sc) {
    if (!sc) return;
    for (lora_slot *s = sc->slots, *n; s; s = n) {
        n = s->next;
        cdf_tensor_release(s->t);
        free(s);
    }
    free(sc);
}

static cdf_tensor *slot_tensor(const cdf_lora_scales *sc, const lora_slot *s) {
    float *v = malloc((size_t)s->total * sizeof *v);
    if (!v) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    int64_t k = 0;
    for (int i = 0; i < s->n; i++)
        for (int64_t j = 0; j < s->rank[i]; j++) v[k++] = sc->scale[s->adapter[i]];
    cdf_scope_suppress(1); /* owned by the slot */
    cdf_tensor *t = cdf_tensor_from_host(sc->dev, CDF_F32, 1, &s->total, v, CDF_F32);
    cdf_scope_suppress(-1);
    free(v);
    return t;
}

cdf_status cdf_lora_scales_set(cdf_lora_scales *sc, int adapter, float scale) {
    if (!sc || adapter < 0 || adapter >= CDF_LORA_MAX_ADAPTERS)
        return cdf_error(CDF_ERR_INVALID_ARG, "LoRA scale: no adapter %d", adapter);
    if (!isfinite(scale)) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA scale %g is not a finite number", (double)scale);
    const float old = sc->scale[adapter];
    sc->scale[adapter] = scale;
    for (lora_slot *s = sc->slots; s; s = s->next) {
        bool uses = false;
        for (int i = 0; i < s->n; i++) uses |= s->adapter[i] == adapter;
        if (!uses) continue;
        cdf_tensor *t = slot_tensor(sc, s);
        if (!t) {
            sc->scale[adapter] = old; /* slots already rebuilt keep the new value: rebuild them back */
            for (lora_slot *r = sc->slots; r != s; r = r->next) {
                cdf_tensor *b = slot_tensor(sc, r);
                if (b) {
                    cdf_tensor_release(r->t);
                    r->t = b;
                }
            }
            return cdf_last_status();
        }
        cdf_tensor_release(s->t);
        s->t = t;
    }
    return CDF_OK;
}

float cdf_lora_scales_get(const cdf_lora_scales *sc, int adapter) {
    return sc && adapter >= 0 && adapter < CDF_LORA_MAX_ADAPTERS ? sc->scale[adapter] : 0.0f;
}

int cdf_lora_scales_tensors(const cdf_lora_scales *sc, cdf_tensor **out, int max) {
    int n = 0;
    for (const lora_slot *s = sc ? sc->slots : NULL; s; s = s->next, n++)
        if (n < max) out[n] = s->t;
    return n;
}

static lora_slot *find_slot(cdf_lora_scales *sc, const cdf_lora_link *k) {
    for (lora_slot *s = sc->slots; s; s = s->next) {
        bool same = s->n == k->n_parts;
        for (int i = 0; same && i < s->n; i++) same = s->adapter[i] == k->parts[i].adapter && s->rank[i] == k->parts[i].rank;
        if (same) return s;
    }
    lora_slot *s = calloc(1, sizeof *s);
    if (!s) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    s->n = k->n_parts;
    for (int i = 0; i < s->n; i++) {
        s->adapter[i] = k->parts[i].adapter;
        s->rank[i] = k->parts[i].rank;
        s->total += s->rank[i];
    }
    if (!(s->t = slot_tensor(sc, s))) {
        free(s);
        return NULL;
    }
    s->next = sc->slots;
    sc->slots = s;
    return s;
}

/* ---- links -------------------------------------------------------------------------------- */
static void link_free(cdf_lora_link *k) {
    if (!k) return;
    cdf_tensor_release(k->a);
    cdf_tensor_release(k->b);
    for (int i = 0; i < k->n_parts; i++) {
        cdf_tensor_release(k->parts[i].a);
        cdf_tensor_release(k->parts[i].b);
    }
    free(k);
}

/* The hook's three calls. Only this file installs hooks, so a layer's hook is always a link. */
static cdf_lora_link *link_of(cdf_linear_hook *h) { return (cdf_lora_link *)h; }
static const cdf_lora_link *link_of_c(const cdf_linear_hook *h) { return (const cdf_lora_link *)h; }

static void hook_free(cdf_linear_hook *h) { link_free(link_of(h)); }

static int hook_list_weights(const cdf_linear_hook *h, cdf_tensor **w, int n) {
    const cdf_lora_link *k = link_of_c(h);
    w[n++] = k->a;
    w[n++] = k->b;
    w[n++] = k->slot->t;
    return n;
}

static cdf_tensor *hook_delta(const cdf_linear_hook *h, cdf_tensor *x) {
    /* x [.., in] -> A x [.., R] -> per-rank scales -> B (.) [.., out] */
    const cdf_lora_link *k = link_of_c(h);
    return x ? cdf_linear(cdf_mul(cdf_linear(x, k->a, NULL), k->slot->t), k->b, NULL) : NULL;
}

void cdf_lora_detach(cdf_linear_layer *l) {
    if (!l) return;
    if (l->lora) l->lora->free(l->lora);
    l->lora = NULL;
}

static cdf_status check_shapes(const cdf_linear_layer *l, cdf_tensor *a, cdf_tensor *b, const char *what) {
    if (!a || !b || cdf_tensor_ndim(a) != 2 || cdf_tensor_ndim(b) != 2)
        return cdf_error(CDF_ERR_SHAPE, "LoRA %s: lora_A and lora_B must be 2-D matrices", what);
    const int64_t r = cdf_tensor_dim(a, 0);
    if (cdf_tensor_dim(b, 1) != r)
        return cdf_error(CDF_ERR_SHAPE, "LoRA %s: rank mismatch: lora_A has rank %lld (shape [%lld, %lld]) but lora_B has %lld "
                         "(shape [%lld, %lld])", what, (long long)r, (long long)r, (long long)cdf_tensor_dim(a, 1),
                         (long long)cdf_tensor_dim(b, 1), (long long)cdf_tensor_dim(b, 0), (long long)cdf_tensor_dim(b, 1));
    if (cdf_tensor_dim(a, 1) != l->in || cdf_tensor_dim(b, 0) != l->out)
        return cdf_error(CDF_ERR_SHAPE, "LoRA %s: the adapter maps %lld -> %lld features but the layer is %lld -> %lld", what,
                         (long long)cdf_tensor_dim(a, 1), (long long)cdf_tensor_dim(b, 0), (long long)l->in, (long long)l->out);
    return CDF_OK;
}

cdf_status cdf_lora_attach(cdf_lora_scales *sc, cdf_linear_layer *l, int adapter, cdf_tensor *a, cdf_tensor *b,
                           const char *what) {
    if (!sc || !l || adapter < 0 || adapter >= CDF_LORA_MAX_ADAPTERS)
        return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: bad arguments", what);
    CDF_TRY(check_shapes(l, a, b, what));
    cdf_lora_link *old = l->lora ? link_of(l->lora) : NULL;
    if (old && old->n_parts == CDF_LORA_MAX_ADAPTERS)
        return cdf_error(CDF_ERR_LIMIT, "LoRA %s: more than %d adapters on one layer", what, CDF_LORA_MAX_ADAPTERS);
    for (int i = 0; old && i < old->n_parts; i++)
        if (old->parts[i].adapter == adapter) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: the adapter names this layer twice", what);
    cdf_lora_link *k = calloc(1, sizeof *k);
    if (!k) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    k->hook = (cdf_linear_hook){.delta = hook_delta, .list_weights = hook_list_weights, .free = hook_free};
    for (int i = 0; old && i < old->n_parts; i++) {
        k->parts[i] = old->parts[i];
        cdf_tensor_retain(k->parts[i].a);
        cdf_tensor_retain(k->parts[i].b);
    }
    k->n_parts = old ? old->n_parts : 0;
    k->parts[k->n_parts++] = (lora_part){adapter, cdf_tensor_dim(a, 0), cdf_tensor_retain(a), cdf_tensor_retain(b)};
    cdf_status s = CDF_OK;
    cdf_scope_suppress(1); /* the concatenations belong to the layer */
    if (k->n_parts == 1) {
        k->a = cdf_tensor_retain(a);
        k->b = cdf_tensor_retain(b);
    } else {
        cdf_tensor *as[CDF_LORA_MAX_ADAPTERS], *bs[CDF_LORA_MAX_ADAPTERS];
        for (int i = 0; i < k->n_parts; i++) as[i] = k->parts[i].a, bs[i] = k->parts[i].b;
        k->a = cdf_cat(as, k->n_parts, 0);
        k->b = k->a ? cdf_cat(bs, k->n_parts, 1) : NULL;
        if (!k->b) s = cdf_last_status();
    }
    cdf_scope_suppress(-1);
    if (s == CDF_OK && !(k->slot = find_slot(sc, k))) s = cdf_last_status();
    if (s != CDF_OK) {
        link_free(k);
        return cdf_error_prefix("LoRA %s: ", what);
    }
    link_free(old);
    l->lora = &k->hook;
    return CDF_OK;
}

/* l->w <- l->w + scale * b @ a in f32, stored back in l->w's dtype. For a tensor-parallel shard a
 * and b are already cut to it (pipelines/lora.c): colwise b holds its rows, rowwise a its
 * columns, so the product is exactly this shard's slice of the whole delta and no rank ever
 * holds more of it. */
static cdf_status add_delta(cdf_linear_layer *l, cdf_tensor *a, cdf_tensor *b, float scale, const char *what) {
    cdf_scope_push();
    const cdf_dtype dt = cdf_tensor_dtype(l->w);
    cdf_tensor *w32 = dt == CDF_F32 ? l->w : cdf_cast(l->w, CDF_F32);
    cdf_tensor *delta = cdf_matmul(cdf_scale(b, scale), a); /* [out, r] @ [r, in] */
    cdf_tensor *sum = w32 && delta ? cdf_add(w32, delta) : NULL;
    cdf_tensor *nw = sum && dt != CDF_F32 ? cdf_cast(sum, dt) : sum;
    /* the new weight belongs to the layer, not to any scope: one reference beyond the scope's */
    cdf_tensor_retain(nw);
    cdf_scope_pop(NULL, 0);
    if (!nw) return cdf_error_prefix("LoRA %s: ", what);
    cdf_tensor_release(l->w);
    l->w = nw;
    return CDF_OK;
}

static cdf_status check_fusable(const cdf_linear_layer *l, float scale, const char *what) {
    if (!isfinite(scale)) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: scale %g is not a finite number", what, (double)scale);
    if (l->w->storage->host_src)
        return cdf_error(CDF_ERR_UNSUPPORTED, "LoRA %s: fusing into a host-side weight (sequential offload) is not supported; "
                         "use the run-time mode", what);
    return CDF_OK;
}

cdf_status cdf_lora_fuse(cdf_linear_layer *l, cdf_tensor *a, cdf_tensor *b, float scale, const char *what) {
    CDF_TRY(check_shapes(l, a, b, what));
    CDF_TRY(check_fusable(l, scale, what));
    CDF_TRY(cdf_linear_decode(l)); /* every value changes: the layer stops keeping blocks */
    return add_delta(l, a, b, scale, what);
}

/* ---- fused log ------------------------------------------------------------------------------ */
typedef struct fused_rec {
    char *layer;
    int adapter;
    cdf_tensor *a, *b;
    float scale;
} fused_rec;

struct cdf_lora_log {
    int n, cap;
    fused_rec *r;
};

cdf_status cdf_lora_log_add(cdf_lora_log **log, const char *layer, int adapter, cdf_tensor *a, cdf_tensor *b, float scale) {
    if (!*log && !(*log = calloc(1, sizeof **log))) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_lora_log *g = *log;
    if (g->n == g->cap) {
        const int cap = g->cap ? 2 * g->cap : 64;
        fused_rec *r = realloc(g->r, (size_t)cap * sizeof *r);
        if (!r) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        g->r = r;
        g->cap = cap;
    }
    char *name = strdup(layer);
    if (!name) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    g->r[g->n++] = (fused_rec){name, adapter, cdf_tensor_retain(a), cdf_tensor_retain(b), scale};
    return CDF_OK;
}

static void rec_free(fused_rec *r) {
    free(r->layer);
    cdf_tensor_release(r->a);
    cdf_tensor_release(r->b);
}

cdf_status cdf_lora_log_unfuse(cdf_lora_log **log, const cdf_layer_index *ix, cdf_lora_restore_fn restore, void *ctx) {
    cdf_lora_log *g = *log;
    cdf_status s = CDF_OK;
    /* restored[i]: record i's layer has its original weight back (whatever was fused into it) */
    bool *restored = g && g->n ? calloc((size_t)g->n, sizeof *restored) : NULL;
    for (int i = 0; restore && restored && i < g->n; i++) {
        int first = 0;
        while (strcmp(g->r[first].layer, g->r[i].layer) != 0) first++;
        if (first < i) {
            restored[i] = restored[first];
            continue;
        }
        cdf_linear_layer *l = cdf_layer_index_find(ix, g->r[i].layer, NULL);
        if (!l) continue; /* reported below */
        restored[i] = restore(ctx, l, g->r[i].layer) == CDF_OK;
        if (!restored[i])
            fprintf(stderr, "cdiffusers: warning: LoRA unfuse: %s: %s; subtracting the fused delta instead (the weights are "
                    "the originals up to one rounding)\n", g->r[i].layer, cdf_last_error());
    }
    for (int i = g ? g->n - 1 : -1; i >= 0; i--) {
        fused_rec *r = &g->r[i];
        cdf_linear_layer *l = cdf_layer_index_find(ix, r->layer, NULL);
        char what[CDF_LORA_NAME_MAX_WHAT];
        snprintf(what, sizeof what, "unfusing %s", r->layer);
        /* -(s B) is exactly the negation of s B, so the product is exactly the delta fused */
        cdf_status e = !l                           ? cdf_error(CDF_ERR_NOT_FOUND, "LoRA unfuse: layer %s is gone", r->layer)
                       : restored && restored[i]    ? CDF_OK
                                                    : add_delta(l, r->a, r->b, -r->scale, what);
        if (s == CDF_OK) s = e;
        rec_free(r);
        g->n = i; /* freed */
    }
    free(restored);
    cdf_lora_log_free(g);
    *log = NULL;
    return s;
}

cdf_status cdf_lora_log_replay(const cdf_lora_log *log, const cdf_layer_index *ix, cdf_lora_scales *sc) {
    for (int i = 0; log && i < log->n; i++) {
        const fused_rec *r = &log->r[i];
        cdf_linear_layer *l = cdf_layer_index_find(ix, r->layer, NULL);
        if (!l) return cdf_error(CDF_ERR_NOT_FOUND, "LoRA: re-applying an adapter: layer %s is gone", r->layer);
        char what[CDF_LORA_NAME_MAX_WHAT];
        snprintf(what, sizeof what, "re-applying to %s", r->layer);
        CDF_TRY(sc ? cdf_lora_attach(sc, l, r->adapter, r->a, r->b, what) : cdf_lora_fuse(l, r->a, r->b, r->scale, what));
    }
    return CDF_OK;
}

int cdf_lora_log_count(const cdf_lora_log *log) { return log ? log->n : 0; }

void cdf_lora_log_free(cdf_lora_log *log) {
    if (!log) return;
    for (int i = 0; i < log->n; i++) rec_free(&log->r[i]);
    free(log->r);
    free(log);
}
