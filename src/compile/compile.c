/* Graph caches: capture a forward once per input signature, replay it (compile.h). The capture
 * state and its hooks are exec/capture.c; the memory planner memory_plan.c; sequential
 * offload's weight streaming weight_stream.c. */
#include "compile/compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "exec/exec.h"
#include "compile/memory_plan.h"
#include "compile/weight_stream.h"
#include "exec/capture.h"
#include "graph/fuse.h"
#include "nn/nn.h"
#include "tensor/tensor_impl.h"


cdf_compile_options cdf_compile_options_default(void) {
    return (cdf_compile_options){.backend = "cpu", .fullgraph = true, .dynamic = false};
}

static bool g_forbid_recompile;
void cdf_compile_set_forbid_recompile(bool forbid) { g_forbid_recompile = forbid; }

/* this thread's capture (exec/capture.c) */
#define tl_cap (*cdf_exec_capture_state())

/* ---- plans --------------------------------------------------------------------------------- */
typedef struct plan {
    char *key;
    bool uncompilable; /* a graph break happened for this signature (fullgraph=false) */
    cdf_node **nodes;
    int n;
    int n_params;
    cdf_tensor *params[CDF_COMPILE_MAX_PARAMS]; /* traced parameter tensors (references); with an arena, the
                                       last one is its placeholder (cdf_memory_plan) */
    size_t arena_bytes;             /* allocated per replay (0: the graph has no buffers of its own) */
    int n_out;
    char **out_names;
    cdf_tensor **outs; /* traced outputs (views on plan buffers or parameters) */
    void *backend_graph; /* the plan instantiated on its device (graph_instantiate), made at the first replay */
    cdf_device *graph_dev;
} plan;

struct cdf_graph_cache {
    char name[128];
    cdf_compile_options opt;
    plan *plans;
    int n_plans;
    char static_names[CDF_MAX_STATIC_INPUTS][64];
    int n_static;
};

cdf_status cdf_graph_cache_set_static_inputs(cdf_graph_cache *c, const char *const *names) {
    c->n_static = 0;
    for (int i = 0; names && names[i]; i++) {
        if (i == CDF_MAX_STATIC_INPUTS || strlen(names[i]) >= sizeof c->static_names[0])
            return cdf_error(CDF_ERR_LIMIT, "compile: at most %d static inputs of < 64 characters", CDF_MAX_STATIC_INPUTS);
        snprintf(c->static_names[c->n_static++], sizeof c->static_names[0], "%s", names[i]);
    }
    return CDF_OK;
}

/* FNV-1a over bytes, from a seed: two seeds give a 128-bit digest of a static input's values. */
static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* Append the static inputs' values to the key (read on the host here, before any capture):
 * short ones verbatim, longer ones as a 128-bit digest. The capture may then read them. */
static cdf_status key_static_values(cdf_graph_cache *c, const cdf_tensor_map *cin, char **key, cdf_exec_capture *cap) {
    for (int i = 0; i < c->n_static; i++) {
        cdf_tensor *t = NULL;
        for (int j = 0; j < cin->n; j++)
            if (strcmp(cin->names[j], c->static_names[i]) == 0) t = cin->tensors[j];
        if (!t) continue;
        const int64_t n = cdf_tensor_numel(t);
        if (n > (1 << 22))
            return cdf_error(CDF_ERR_LIMIT, "compile: static input '%s' has %lld elements (at most 2^22)", c->static_names[i],
                             (long long)n);
        double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (!v) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        cdf_status s = cdf_tensor_read(t, CDF_F64, v, (size_t)n * sizeof *v);
        char buf[1200];
        size_t len = (size_t)snprintf(buf, sizeof buf, " static %s=", c->static_names[i]);
        if (n <= 64) {
            for (int64_t k = 0; k < n && len < sizeof buf; k++) len += (size_t)snprintf(buf + len, sizeof buf - len, "%.17g,", v[k]);
        } else {
            snprintf(buf + len, sizeof buf - len, "#%016llx%016llx",
                     (unsigned long long)fnv1a(v, (size_t)n * sizeof *v, 1469598103934665603ull),
                     (unsigned long long)fnv1a(v, (size_t)n * sizeof *v, 0x9e3779b97f4a7c15ull));
        }
        free(v);
        if (s != CDF_OK) return s;
        char *k2 = realloc(*key, strlen(*key) + strlen(buf) + 1);
        if (!k2) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        strcat(k2, buf);
        *key = k2;
        cap->static_st[cap->n_static++] = t->storage;
    }
    return CDF_OK;
}

cdf_graph_cache *cdf_graph_cache_new(const char *name, const cdf_compile_options *opt) {
    cdf_graph_cache *c = calloc(1, sizeof *c);
    if (!c) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    snprintf(c->name, sizeof c->name, "%s", name ? name : "module");
    c->opt = opt ? *opt : cdf_compile_options_default();
    return c;
}

static void plan_clear(plan *p) {
    if (p->backend_graph) p->graph_dev->iface->graph_free(p->graph_dev, p->backend_graph); /* before its nodes */
    for (int i = 0; i < p->n; i++) cdf_node_free(p->nodes[i]);
    free(p->nodes);
    for (int i = 0; i < p->n_params; i++) cdf_tensor_release(p->params[i]);
    for (int i = 0; i < p->n_out; i++) {
        free(p->out_names[i]);
        cdf_tensor_release(p->outs[i]);
    }
    free(p->out_names);
    free(p->outs);
    free(p->key);
}

void cdf_graph_cache_free(cdf_graph_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_plans; i++) plan_clear(&c->plans[i]);
    free(c->plans);
    free(c);
}

int cdf_graph_cache_size(const cdf_graph_cache *c) { return c ? c->n_plans : 0; }

static char *signature(const cdf_tensor_map *in) {
    size_t cap = 256, len = 0;
    char *k = malloc(cap);
    if (!k) return NULL;
    k[0] = 0;
    for (int i = 0; i < in->n; i++) {
        char d[160];
        cdf_tensor_describe(in->tensors[i], d, sizeof d);
        size_t need = strlen(in->names[i]) + strlen(d) + 4;
        if (len + need >= cap) {
            cap = (len + need) * 2;
            char *nk = realloc(k, cap);
            if (!nk) {
                free(k);
                return NULL;
            }
            k = nk;
        }
        len += (size_t)sprintf(k + len, "%s=%s; ", in->names[i], d);
    }
    return k;
}

/* A copy of node n with every reference to a traced parameter's storage rebound to the
 * corresponding new tensor (same offsets relative to the parameter). */
static cdf_node *bind_node(const cdf_node *n, cdf_tensor *const *traced, cdf_tensor *const *now, int np) {
    cdf_node *c = cdf_node_new(n->kind);
    if (!c) return NULL;
    if (!cdf_node_copy_params(c, n)) {
        free(c);
        return NULL;
    }
    for (int k = -1; k < n->n_src; k++) {
        cdf_tensor *t = k < 0 ? n->dst : n->src[k], *b = t;
        bool rebound = false;
        for (int j = 0; t && j < np; j++) {
            if (t->storage == traced[j]->storage) {
                b = cdf_tensor_view_of(now[j]->storage, t->offset - traced[j]->offset + now[j]->offset, t->dtype, t->ndim,
                                       t->shape, t->strides);
                rebound = true;
                break;
            }
        }
        if (!rebound && t) cdf_tensor_retain(t);
        if (k < 0) c->dst = b;
        else c->src[c->n_src++] = b;
    }
    return c;
}

/* After a capture the plan's nodes reference the traced parameters' buffers (the call's inputs
 * and, for a repeated block, its weights). A plan must not keep those alive: the inputs are
 * activations of one call, and the weights belong to the model (released by model offload, or
 * materialised per call by sequential offload). Every reference to a parameter's buffer is
 * moved to a placeholder buffer without memory, unique to the plan, which is what a replay binds
 * the new parameters in place of (bind_node matches buffers by identity). */
static cdf_tensor *rebased(const cdf_tensor *t, cdf_storage *to) {
    return cdf_tensor_view_of(to, t->offset, t->dtype, t->ndim, t->shape, t->strides);
}

static cdf_status unpin_params(plan *p, cdf_tensor *const *now, int np, cdf_tensor_map *traced_out) {
    cdf_storage *from[CDF_COMPILE_MAX_PARAMS], *to[CDF_COMPILE_MAX_PARAMS];
    int nm = 0;
    cdf_status s = CDF_OK;
    cdf_scope_suppress(1);
    for (int i = 0; i < np && s == CDF_OK; i++) {
        int j = 0;
        while (j < nm && from[j] != now[i]->storage) j++;
        if (j == nm) {
            cdf_storage *ph = cdf_storage_create(now[i]->storage->dev, now[i]->storage->nbytes);
            if (!ph) {
                s = cdf_last_status();
                break;
            }
            from[nm] = now[i]->storage;
            to[nm++] = ph;
        }
        p->params[i] = rebased(now[i], to[j]);
        if (!p->params[i]) s = cdf_last_status();
    }
    for (int i = 0; s == CDF_OK && i < p->n; i++) {
        cdf_node *n = p->nodes[i];
        for (int k = -1; k < n->n_src && s == CDF_OK; k++) {
            cdf_tensor **slot = k < 0 ? &n->dst : &n->src[k];
            for (int j = 0; *slot && j < nm; j++) {
                if ((*slot)->storage != from[j]) continue;
                cdf_tensor *r = rebased(*slot, to[j]);
                if (!r) {
                    s = cdf_last_status();
                    break;
                }
                cdf_tensor_release(*slot);
                *slot = r;
                break;
            }
        }
    }
    /* outputs that alias a parameter (a pass-through) are found by run_plan through params */
    for (int i = 0; s == CDF_OK && i < traced_out->n; i++)
        for (int j = 0; j < nm; j++)
            if (traced_out->tensors[i]->storage == from[j]) {
                cdf_tensor *r = rebased(traced_out->tensors[i], to[j]);
                if (!r) {
                    s = cdf_last_status();
                    break;
                }
                cdf_tensor_release(traced_out->tensors[i]);
                traced_out->tensors[i] = r;
                break;
            }
    for (int j = 0; j < nm; j++) cdf_storage_release(to[j]); /* the views hold them now */
    cdf_scope_suppress(-1);
    return s;
}

/* Run plan p with parameters now[] (same order as p->params, less the arena) and copy the
 * outputs into out. The replay's arena is allocated here (device memory, under the budget) and
 * only the replay's nodes hold it: it is freed when the last of them has run. */
static cdf_status run_plan(plan *p, cdf_tensor *const *now_in, cdf_tensor_map *out, const char *who) {
    cdf_tensor *now[CDF_COMPILE_MAX_PARAMS];
    const int n_in = p->arena_bytes ? p->n_params - 1 : p->n_params;
    for (int i = 0; i < n_in; i++) now[i] = now_in[i];
    cdf_tensor *arena = NULL;
    if (p->arena_bytes) {
        cdf_storage *st = cdf_storage_new(p->params[n_in]->storage->dev, p->arena_bytes);
        if (!st) return cdf_last_status();
        cdf_scope_suppress(1);
        arena = cdf_tensor_view_of(st, 0, CDF_F32, 1, p->params[n_in]->shape, p->params[n_in]->strides);
        cdf_scope_suppress(-1);
        cdf_storage_release(st);
        if (!arena) return cdf_last_status();
        now[n_in] = arena;
    }
    cdf_scope_suppress(1);
    cdf_status s = CDF_OK;
    cdf_device *dev = p->n ? p->nodes[0]->dst->storage->dev : NULL;
    if (dev && dev->iface->graph_launch) {
        /* the whole plan is one graph of the backend, launched with this call's buffers bound */
        if (!p->backend_graph) {
            p->backend_graph = dev->iface->graph_instantiate(dev, p->nodes, p->n, p->params, p->n_params, who);
            p->graph_dev = dev;
            if (!p->backend_graph) s = cdf_last_status();
        }
        if (s == CDF_OK) s = dev->iface->graph_launch(dev, p->backend_graph, now);
    } else {
        /* a backend without graphs: a bound copy of every node, one by one */
        for (int i = 0; i < p->n && s == CDF_OK; i++) {
            cdf_node *b = bind_node(p->nodes[i], p->params, now, p->n_params);
            if (!b) s = cdf_last_status();
            else s = cdf_device_enqueue(b->dst->storage->dev, b);
        }
    }
    cdf_exec_count_kernels((uint64_t)p->n + (uint64_t)p->n_out);
    for (int i = 0; i < p->n_out && s == CDF_OK; i++) {
        /* outputs live in the plan's buffers, which the next replay overwrites: copy out */
        cdf_tensor *o = p->outs[i];
        cdf_tensor *src = o;
        for (int j = 0; j < p->n_params; j++)
            if (o->storage == p->params[j]->storage)
                src = cdf_tensor_view_of(now[j]->storage, o->offset - p->params[j]->offset + now[j]->offset, o->dtype,
                                         o->ndim, o->shape, o->strides);
        cdf_tensor *copy = cdf_tensor_alloc(o->storage->dev, o->dtype, o->ndim, o->shape);
        cdf_node *cn = copy ? cdf_node_new(CDF_OP_COPY) : NULL;
        if (cn) {
            cdf_node_add_src(cn, src);
            cn->dst = cdf_tensor_retain(copy);
            s = cdf_device_enqueue(copy->storage->dev, cn);
            if (s == CDF_OK) s = cdf_tensor_map_set(out, p->out_names[i], copy);
        } else {
            s = cdf_last_status() ? cdf_last_status() : CDF_ERR_OUT_OF_MEMORY;
        }
        if (src != o) cdf_tensor_release(src);
        cdf_tensor_release(copy);
    }
    cdf_tensor_release(arena); /* the queued nodes hold it until they have run */
    cdf_scope_suppress(-1);
    return s;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static bool log_compile(void) {
    const char *v = getenv("CDIFFUSERS_LOG");
    return v && strstr(v, "compile");
}

cdf_status cdf_graph_cache_run(cdf_graph_cache *c, cdf_traced_fn fn, void *ctx, const cdf_tensor_map *in,
                               cdf_tensor_map *out, cdf_tensor *const *extra, int n_extra) {
    if (c->opt.dynamic) return cdf_error(CDF_ERR_UNSUPPORTED, "compile: dynamic shapes are not supported (use dynamic=false)");
    if (in->n + n_extra >= CDF_COMPILE_MAX_PARAMS) /* one place stays for the arena */
        return cdf_error(CDF_ERR_LIMIT, "compile: more than %d parameters", CDF_COMPILE_MAX_PARAMS - 1);
    if (tl_cap.active) return fn(ctx, in, out); /* nested: part of the enclosing capture */
    /* parameters: named inputs (made contiguous so every call has the same layout) + extras */
    cdf_tensor *now[CDF_COMPILE_MAX_PARAMS];
    int np = 0;
    cdf_status s = CDF_OK;
    cdf_tensor_map cin;
    cdf_tensor_map_init(&cin);
    cdf_scope_suppress(1);
    for (int i = 0; i < in->n && s == CDF_OK; i++) {
        cdf_tensor *t = cdf_contiguous(in->tensors[i]);
        if (!t) s = cdf_last_status();
        else {
            s = cdf_tensor_map_set(&cin, in->names[i], t);
            now[np++] = t;          /* borrowed: the map holds it until the end of the call */
            cdf_tensor_release(t);
        }
    }
    cdf_scope_suppress(-1);
    for (int i = 0; i < n_extra; i++) now[np++] = extra[i];
    char *key = s == CDF_OK ? signature(&cin) : NULL;
    if (s == CDF_OK && !key) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (key && n_extra > 0) {
        /* bound weights are not in the key by value, but their shapes must match the graph */
        size_t len = strlen(key), cap = len + (size_t)n_extra * 48 + 16;
        char *k2 = realloc(key, cap);
        if (!k2) {
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        } else {
            key = k2;
            for (int i = 0; i < n_extra && len + 48 < cap; i++) {
                char d[160];
                cdf_tensor_describe(extra[i], d, sizeof d);
                len += (size_t)snprintf(key + len, cap - len, "w%d=%.40s;", i, d);
            }
        }
    }
    cdf_exec_capture statics = {0};
    if (s == CDF_OK && key) s = key_static_values(c, &cin, &key, &statics);
    plan *p = NULL;
    for (int i = 0; key && i < c->n_plans; i++)
        if (strcmp(c->plans[i].key, key) == 0) p = &c->plans[i];
    if (s == CDF_OK && p && !p->uncompilable) {
        cdf_exec_count_cache_hit();
        /* deferred ops may still have to produce the inputs: they go to the queue first */
        s = cdf_exec_flush();
        if (s == CDF_OK) s = run_plan(p, now, out, c->name);
    } else if (s == CDF_OK && p && p->uncompilable) {
        s = fn(ctx, &cin, out); /* known graph break: eager */
    } else if (s == CDF_OK && g_forbid_recompile && c->n_plans > 0) {
        s = cdf_error(CDF_ERR_UNSUPPORTED, "compile: unexpected recompile of %s for %s", c->name, key);
    } else if (s == CDF_OK) {
        /* capture */
        double t0 = now_ms();
        s = cdf_exec_flush();
        plan np_ = {0};
        if (s == CDF_OK) {
            tl_cap = (cdf_exec_capture){.active = true, .fullgraph = c->opt.fullgraph, .who = c->name, .n_static = statics.n_static};
            memcpy(tl_cap.static_st, statics.static_st, sizeof statics.static_st);
            cdf_tensor_map traced_out;
            cdf_tensor_map_init(&traced_out);
            cdf_scope_push();
            s = fn(ctx, &cin, &traced_out);
            cdf_scope_pop(NULL, 0);
            cdf_exec_capture cap = tl_cap;
            tl_cap = (cdf_exec_capture){0};
            if (cap.broken) {
                /* buffers created after the break were real; those before were materialised */
                if (s == CDF_OK) s = cdf_exec_flush();
                np_.uncompilable = true;
                /* the forward finished eagerly after the break: its outputs are real */
                for (int i = 0; s == CDF_OK && i < traced_out.n; i++) s = cdf_tensor_map_set(out, traced_out.names[i], traced_out.tensors[i]);
                if (log_compile()) fprintf(stderr, "cdiffusers: compile %s [%s]: graph break, runs eagerly\n", c->name, key);
            } else if (s != CDF_OK) {
                for (int i = 0; i < cap.n; i++) cdf_node_free(cap.nodes[i]);
            } else {
                /* buffers held outside the graph get memory of their own (not arena slots) */
                for (int v = 0; s == CDF_OK && v < cap.n_virt; v++)
                    if (!cdf_graph_holds_only(cap.nodes, cap.n, traced_out.tensors, traced_out.n, cap.virt[v], 1))
                        s = cdf_storage_materialize(cap.virt[v]);
                /* only the graph (and the outputs) hold the captured buffers from here on, which
                 * is what the fusion pass checks before removing an intermediate */
                cdf_exec_capture_release_virtuals(&cap);
                cdf_fuse_stats fs = {0};
                size_t arena = 0;
                cdf_tensor *arena_param = NULL;
                if (!cdf_device_is_values_kind(cap.n ? cap.nodes[0]->dst->storage->dev : NULL)) {
                    cdf_fuse_matmul_epilogues(cap.nodes, &cap.n, cdf_device_supports_node, &fs);
                    cdf_fuse_elementwise(cap.nodes, &cap.n, cdf_device_supports_node, &fs);
                    cdf_exec_count_fusions((uint64_t)fs.epilogues, (uint64_t)fs.norm_heads);
                    s = cdf_memory_plan(cap.nodes, cap.n, traced_out.tensors, traced_out.n, &arena, &arena_param);
                }
                else /* the values kind (pjrt): the captured nodes go to graph_instantiate unfused
                      * and without an arena (the program's compiler fuses and plans memory); the
                      * outputs get buffers of their own, which the program's results become */
                    for (int o = 0; s == CDF_OK && o < traced_out.n; o++) s = cdf_storage_materialize(traced_out.tensors[o]->storage);
                np_.nodes = cap.nodes;
                np_.n = cap.n;
                cap.nodes = NULL;
                np_.n_params = np;
                if (s == CDF_OK) s = unpin_params(&np_, now, np, &traced_out);
                if (arena_param && s == CDF_OK) {
                    np_.params[np_.n_params++] = arena_param;
                    np_.arena_bytes = arena;
                } else {
                    cdf_tensor_release(arena_param);
                }
                np_.n_out = traced_out.n;
                np_.out_names = calloc((size_t)traced_out.n + 1, sizeof *np_.out_names);
                np_.outs = calloc((size_t)traced_out.n + 1, sizeof *np_.outs);
                if (!np_.out_names || !np_.outs) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
                for (int i = 0; s == CDF_OK && i < traced_out.n; i++) {
                    np_.out_names[i] = strdup(traced_out.names[i]);
                    np_.outs[i] = cdf_tensor_retain(traced_out.tensors[i]);
                }
                cdf_exec_count_compile();
                if (s == CDF_OK && log_compile())
                    fprintf(stderr,
                            "cdiffusers: compile %s [%s]: %d kernels (%d fused: %d matmul epilogues, %d norm heads), arena %.2f MiB, "
                            "%.1f ms\n",
                            c->name, key, np_.n, fs.chains, fs.epilogues, fs.norm_heads, arena / 1048576.0, now_ms() - t0);
                if (s == CDF_OK) s = run_plan(&np_, now, out, c->name);
            }
            free(cap.nodes);
            cdf_exec_capture_release_virtuals(&cap);
            cdf_tensor_map_clear(&traced_out);
        }
        if (s == CDF_OK || np_.uncompilable) {
            plan *grown = realloc(c->plans, (size_t)(c->n_plans + 1) * sizeof *grown);
            if (grown) {
                c->plans = grown;
                np_.key = key;
                key = NULL;
                c->plans[c->n_plans++] = np_;
            } else {
                plan_clear(&np_);
            }
        } else {
            plan_clear(&np_);
        }
    }
    free(key);
    cdf_tensor_map_clear(&cin);
    return s;
}

/* ---- repeated-block compile ---------------------------------------------------------------- */
#define MAX_BLOCK_CLASSES 8

struct cdf_block_caches {
    cdf_compile_options opt;
    int n;
    char names[MAX_BLOCK_CLASSES][64];
    cdf_graph_cache *caches[MAX_BLOCK_CLASSES];
};

static _Thread_local cdf_block_caches *tl_blocks;

cdf_block_caches *cdf_block_caches_new(const cdf_compile_options *opt) {
    cdf_block_caches *bc = calloc(1, sizeof *bc);
    if (!bc) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    bc->opt = opt ? *opt : cdf_compile_options_default();
    return bc;
}

void cdf_block_caches_free(cdf_block_caches *bc) {
    if (!bc) return;
    for (int i = 0; i < bc->n; i++) cdf_graph_cache_free(bc->caches[i]);
    free(bc);
}

void cdf_block_caches_clear(cdf_block_caches *bc) {
    if (!bc) return;
    for (int i = 0; i < bc->n; i++) cdf_graph_cache_free(bc->caches[i]);
    bc->n = 0;
}

int cdf_block_caches_graphs(const cdf_block_caches *bc) {
    int n = 0;
    for (int i = 0; bc && i < bc->n; i++) n += cdf_graph_cache_size(bc->caches[i]);
    return n;
}

cdf_block_caches *cdf_block_caches_activate(cdf_block_caches *bc) {
    cdf_block_caches *prev = tl_blocks;
    tl_blocks = bc;
    return prev;
}

cdf_status cdf_block_run(const char *block_class, cdf_traced_fn fn, void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out,
                         cdf_tensor *const *weights, int n_weights) {
    cdf_block_caches *bc = tl_blocks;
    bool host_side = false;
    for (int i = 0; i < n_weights && !host_side; i++) host_side = weights[i] && weights[i]->storage->host_src;
    if (host_side) {
        /* a whole-forward capture would keep every block's weights as constants of one graph,
         * but they exist only during their block's call: a graph break (the block and the rest
         * of the forward run without the capture; repeated-block compile is the way to compile
         * a sequentially offloaded transformer, and the pipeline switches to it) */
        if (cdf_exec_capture_tracing()) CDF_TRY(cdf_exec_capture_graph_break("a block with host-side weights (sequential offload)"));
        int i = -1;
        if (bc) {
            i = 0;
            while (i < bc->n && strcmp(bc->names[i], block_class) != 0) i++;
            if (i == bc->n) {
                if (bc->n == MAX_BLOCK_CLASSES) i = -1;
                else {
                    bc->caches[i] = cdf_graph_cache_new(block_class, &bc->opt);
                    if (!bc->caches[i]) return cdf_last_status();
                    snprintf(bc->names[i], sizeof bc->names[i], "%s", block_class);
                    bc->n++;
                }
            }
        }
        return cdf_weight_stream_run(cdf_graph_cache_run, i >= 0 ? bc->caches[i] : NULL, fn, ctx, in, out, weights, n_weights);
    }
    if (cdf_measuring()) {
        /* the planner's measured forward: tag the block's allocations by block family, as the
         * planner's weights count blocks (cdf_plan_blocks.largest_in_family: [0] double-stream,
         * [1] single-stream) -> tags 1 and 2; 0 is outside any block */
        const int prev = cdf_measure_set_tag(strstr(block_class, "Single") ? 2 : 1);
        const cdf_status s = fn(ctx, in, out);
        cdf_measure_set_tag(prev);
        return s;
    }
    if (!bc || tl_cap.active) return fn(ctx, in, out);
    int i = 0;
    while (i < bc->n && strcmp(bc->names[i], block_class) != 0) i++;
    if (i == bc->n) {
        if (bc->n == MAX_BLOCK_CLASSES) return fn(ctx, in, out);
        bc->caches[i] = cdf_graph_cache_new(block_class, &bc->opt);
        if (!bc->caches[i]) return cdf_last_status();
        snprintf(bc->names[i], sizeof bc->names[i], "%s", block_class);
        bc->n++;
    }
    return cdf_graph_cache_run(bc->caches[i], fn, ctx, in, out, weights, n_weights);
}
