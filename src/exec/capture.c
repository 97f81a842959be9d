/* The capture in progress on this thread and the hooks the op path calls (exec/capture.h). */
#include "exec/capture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "exec/stats.h"

/* ---- the capture in progress on this thread ------------------------------------------------ */
static _Thread_local cdf_exec_capture tl_cap;

cdf_exec_capture *cdf_exec_capture_state(void) { return &tl_cap; }


/* ---- measure mode -------------------------------------------------------------------------- */
/* What a measured buffer carries as its owner: the session that allocated it (its id is the
 * tag's address, unique while the buffer lives). */
typedef struct measure_tag {
    uint64_t session;
} measure_tag;

static void measure_log(cdf_mem_event_kind kind, uint64_t id, uint64_t bytes) {
    if (tl_cap.break_status != CDF_OK) return;
    if (tl_cap.n_log == tl_cap.cap_log) {
        size_t cap = tl_cap.cap_log ? tl_cap.cap_log * 2 : 4096;
        cdf_mem_event *p = realloc(tl_cap.log, cap * sizeof *p);
        if (!p) {
            tl_cap.break_status = cdf_error(CDF_ERR_OUT_OF_MEMORY, "measuring a forward: out of host memory for its log");
            return;
        }
        tl_cap.log = p;
        tl_cap.cap_log = cap;
    }
    tl_cap.log[tl_cap.n_log++] = (cdf_mem_event){kind, id, bytes, tl_cap.tag};
}

/* owner_release of a measured buffer: it holds no memory, only the log hears of it (a buffer
 * outliving its session, released on another thread or after the end, is not logged) */
static void measured_release(void *owner) {
    measure_tag *t = owner;
    if (tl_cap.measure && t->session == tl_cap.session) measure_log(CDF_MEM_RELEASE, (uint64_t)(uintptr_t)t, 0);
    free(t);
}

static _Atomic uint64_t g_sessions;

cdf_status cdf_measure_begin(void) {
    if (tl_cap.active) return cdf_error(CDF_ERR_INVALID_ARG, "cannot measure a forward inside a capture or another measurement");
    tl_cap = (cdf_exec_capture){.active = true, .fullgraph = true, .measure = true, .who = "a measured forward",
                           .session = ++g_sessions};
    return CDF_OK;
}

bool cdf_measuring(void) { return tl_cap.active && tl_cap.measure; }

int cdf_measure_set_tag(int tag) {
    const int prev = tl_cap.tag;
    tl_cap.tag = tag >= 0 && tag < CDF_MEM_TAGS ? tag : 0;
    return prev;
}

void cdf_measure_set_scratch(uint64_t (*fn)(const struct cdf_node *n, void *user), void *user) {
    if (!cdf_measuring()) return;
    tl_cap.scratch = fn;
    tl_cap.scratch_user = user;
}

cdf_status cdf_measure_end(cdf_mem_event **log, size_t *n) {
    *log = NULL;
    *n = 0;
    if (!cdf_measuring()) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_measure_end: no measurement in progress");
    const cdf_status st = tl_cap.break_status;
    if (st == CDF_OK) {
        *log = tl_cap.log;
        *n = tl_cap.n_log;
    } else {
        free(tl_cap.log);
    }
    free(tl_cap.nodes);
    tl_cap = (cdf_exec_capture){0};
    return st;
}

void cdf_exec_capture_note_virtual(cdf_storage *s) {
    if (!cdf_exec_capture_tracing()) return;
    if (tl_cap.measure) {
        measure_tag *t = malloc(sizeof *t);
        if (!t) {
            if (tl_cap.break_status == CDF_OK)
                tl_cap.break_status = cdf_error(CDF_ERR_OUT_OF_MEMORY, "measuring a forward: out of host memory");
            return;
        }
        t->session = tl_cap.session;
        s->owner = t;
        s->owner_release = measured_release;
        measure_log(CDF_MEM_ALLOC, (uint64_t)(uintptr_t)t, s->nbytes);
        return;
    }
    if (tl_cap.n_virt == tl_cap.cap_virt) {
        int cap = tl_cap.cap_virt ? tl_cap.cap_virt * 2 : 512;
        cdf_storage **p = realloc(tl_cap.virt, (size_t)cap * sizeof *p);
        if (!p) {
            /* cannot track it: give it real memory now so it is never left without any */
            (void)cdf_storage_materialize(s);
            return;
        }
        tl_cap.virt = p;
        tl_cap.cap_virt = cap;
    }
    cdf_storage_retain(s);
    tl_cap.virt[tl_cap.n_virt++] = s;
}

void cdf_exec_capture_release_virtuals(cdf_exec_capture *c) {
    for (int i = 0; i < c->n_virt; i++) cdf_storage_release(c->virt[i]);
    free(c->virt);
    c->virt = NULL;
    c->n_virt = c->cap_virt = 0;
}

cdf_status cdf_exec_capture_materialize_all(cdf_exec_capture *c) {
    for (int i = 0; i < c->n_virt; i++) CDF_TRY(cdf_storage_materialize(c->virt[i]));
    return CDF_OK;
}

bool cdf_exec_capture_tracing(void) { return tl_cap.active && !tl_cap.broken; }

bool cdf_exec_capture_record(cdf_node *n) {
    if (!cdf_exec_capture_tracing()) return false;
    if (tl_cap.measure) { /* nothing runs: the node's operands are released now */
        const uint64_t scratch = tl_cap.scratch ? tl_cap.scratch(n, tl_cap.scratch_user) : 0;
        if (scratch) { /* beside the live operands and output, gone with the op; an id no buffer has (odd) */
            const uint64_t id = ((uint64_t)tl_cap.n_log << 1) | 1u;
            measure_log(CDF_MEM_ALLOC, id, scratch);
            measure_log(CDF_MEM_RELEASE, id, 0);
        }
        cdf_node_free(n);
        return true;
    }
    if (tl_cap.n == tl_cap.cap) {
        int cap = tl_cap.cap ? tl_cap.cap * 2 : 512;
        cdf_node **p = realloc(tl_cap.nodes, (size_t)cap * sizeof *p);
        if (!p) return false; /* caller runs it eagerly: the capture then is incomplete */
        tl_cap.nodes = p;
        tl_cap.cap = cap;
    }
    tl_cap.nodes[tl_cap.n++] = n;
    return true;
}

/* Launch recorded nodes (ownership passes to the queues). */
cdf_status cdf_exec_capture_launch_all(cdf_node **nodes, int n) {
    cdf_status s = CDF_OK;
    int i = 0;
    for (; i < n && s == CDF_OK; i++) s = cdf_device_enqueue(nodes[i]->dst->storage->dev, nodes[i]);
    for (; i < n; i++) cdf_node_free(nodes[i]);
    return s;
}


cdf_status cdf_exec_capture_host_read(const cdf_tensor *t) {
    if (!cdf_exec_capture_tracing()) return CDF_OK;
    if (tl_cap.measure) {
        if (!t->storage->is_virtual) return CDF_OK; /* an input made before the measurement: it has values */
        char d[96];
        cdf_tensor_describe(t, d, sizeof d);
        if (tl_cap.break_status == CDF_OK)
            tl_cap.break_status = cdf_error(CDF_ERR_GRAPH_BREAK, "measuring a forward: it reads a computed %s tensor on the "
                                            "host, which a measurement has no values for", d);
        return tl_cap.break_status;
    }
    for (int i = 0; i < tl_cap.n_static; i++)
        if (t->storage == tl_cap.static_st[i]) return CDF_OK; /* a guard of the plan, not a break */
    char d[96], what[256];
    cdf_tensor_describe(t, d, sizeof d);
    snprintf(what, sizeof what, "the forward reads a %s tensor on the host (a value-dependent computation)", d);
    return cdf_exec_capture_graph_break(what);
}

cdf_status cdf_exec_capture_graph_break(const char *what) {
    cdf_exec_count_graph_break();
    if (tl_cap.fullgraph) {
        /* the capture stays active: whatever the forward still does is recorded and thrown
         * away with it, so no op ever runs on a buffer the capture left without memory */
        tl_cap.break_status = cdf_error(CDF_ERR_GRAPH_BREAK,
                                        "compile(fullgraph=true): graph break in %s: %s; compile with fullgraph=false to "
                                        "fall back to eager for this module",
                                        tl_cap.who ? tl_cap.who : "forward", what);
        return tl_cap.break_status;
    }
    tl_cap.broken = true;
    /* abandon the capture: what was recorded gets real buffers and runs now, the rest of the
     * forward runs eagerly */
    cdf_status s = cdf_exec_capture_materialize_all(&tl_cap);
    if (s == CDF_OK) s = cdf_exec_capture_launch_all(tl_cap.nodes, tl_cap.n);
    else
        for (int i = 0; i < tl_cap.n; i++) cdf_node_free(tl_cap.nodes[i]);
    tl_cap.n = 0;
    return s;
}

