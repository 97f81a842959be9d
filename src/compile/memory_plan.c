/* The compile memory planner (compile/memory_plan.h): lifetimes, placement, rebasing onto the arena. */
#include "compile/memory_plan.h"

#include <stdlib.h>

#include "core/error_internal.h"
#include "tensor/tensor_impl.h"

typedef struct slot {
    cdf_storage *s;
    int first, last;
    size_t size, offset;
} slot;

static int by_size_desc(const void *a, const void *b) {
    const slot *x = a, *y = b;
    return x->size < y->size ? 1 : (x->size > y->size ? -1 : 0);
}

static int find_slot(slot *sl, int ns, const cdf_storage *s) {
    for (int i = 0; i < ns; i++)
        if (sl[i].s == s) return i;
    return -1;
}

/* Rebase t (a reference to a placed slot) onto the arena placeholder: same view, its element
 * offset moved by the slot's byte offset (slots are 64-byte aligned, so any dtype divides it). */
static cdf_status rebase_on_arena(cdf_tensor **t, const slot *sl, int ns, cdf_storage *arena) {
    if (!*t) return CDF_OK;
    int j = find_slot((slot *)sl, ns, (*t)->storage);
    if (j < 0) return CDF_OK;
    const int64_t off = (*t)->offset + (int64_t)(sl[j].offset / cdf_dtype_size((*t)->dtype));
    cdf_tensor *r = cdf_tensor_view_of(arena, off, (*t)->dtype, (*t)->ndim, (*t)->shape, (*t)->strides);
    if (!r) return cdf_last_status();
    cdf_tensor_release(*t);
    *t = r;
    return CDF_OK;
}

/* Place the graph's virtual buffers (above) and move every reference to them onto one arena
 * placeholder; *arena_param receives a flat f32 view of the placeholder (NULL when the graph has
 * no buffers of its own), which the plan binds like a parameter. */
cdf_status cdf_memory_plan(cdf_node **nodes, int n, cdf_tensor **outs, int n_out, size_t *arena_bytes,
                           cdf_tensor **arena_param) {
    *arena_bytes = 0;
    *arena_param = NULL;
    int cap = 256, ns = 0;
    slot *sl = malloc((size_t)cap * sizeof *sl);
    if (!sl) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "compile: out of host memory planning buffers");
    cdf_device *dev = NULL;
    /* lifetimes of the virtual buffers the graph touches, in node order */
    for (int i = 0; i <= n; i++) {
        int nt = i < n ? nodes[i]->n_src + 1 : n_out;
        for (int k = 0; k < nt; k++) {
            const cdf_tensor *t = i < n ? (k == 0 ? nodes[i]->dst : nodes[i]->src[k - 1]) : outs[k];
            if (!t || !t->storage->is_virtual) continue;
            int j = find_slot(sl, ns, t->storage);
            if (j < 0) {
                if (ns == cap) {
                    cap *= 2;
                    slot *g = realloc(sl, (size_t)cap * sizeof *sl);
                    if (!g) {
                        free(sl);
                        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "compile: out of host memory planning buffers");
                    }
                    sl = g;
                }
                j = ns++;
                /* an empty buffer still gets a slot of its own: a graph whose buffers are all empty
                 * must not end up with an arena parameter of 0 bytes, which run_plan cannot bind */
                const size_t nb = t->storage->nbytes ? t->storage->nbytes : 1;
                sl[j] = (slot){.s = t->storage, .first = i, .size = (nb + 63) / 64 * 64};
                dev = t->storage->dev;
            }
            sl[j].last = i; /* i == n: an output, alive until copied out */
        }
    }
    qsort(sl, (size_t)ns, sizeof *sl, by_size_desc);
    size_t total = 0;
    for (int i = 0; i < ns; i++) {
        /* lowest offset free of every placed slot that is alive at the same time */
        size_t off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int j = 0; j < i; j++) {
                if (sl[j].last < sl[i].first || sl[i].last < sl[j].first) continue;
                if (off < sl[j].offset + sl[j].size && sl[j].offset < off + sl[i].size) {
                    off = sl[j].offset + sl[j].size;
                    moved = true;
                }
            }
        }
        sl[i].offset = off;
        if (off + sl[i].size > total) total = off + sl[i].size;
    }
    cdf_status st = CDF_OK;
    if (ns > 0) {
        cdf_storage *ph = cdf_storage_create(dev, total); /* the placeholder: no memory, bound per replay */
        if (!ph) {
            free(sl);
            return cdf_last_status();
        }
        /* the slots' buffers stay alive (and their addresses unique) until every reference moved */
        for (int i = 0; i < ns; i++) cdf_storage_retain(sl[i].s);
        cdf_scope_suppress(1);
        for (int i = 0; i < n && st == CDF_OK; i++) {
            st = rebase_on_arena(&nodes[i]->dst, sl, ns, ph);
            for (int k = 0; k < nodes[i]->n_src && st == CDF_OK; k++) st = rebase_on_arena(&nodes[i]->src[k], sl, ns, ph);
        }
        for (int k = 0; k < n_out && st == CDF_OK; k++) st = rebase_on_arena(&outs[k], sl, ns, ph);
        if (st == CDF_OK) {
            *arena_param = cdf_tensor_view_of(ph, 0, CDF_F32, 1, (int64_t[]){(int64_t)(total / 4)}, (int64_t[]){1});
            if (!*arena_param) st = cdf_last_status();
        }
        cdf_scope_suppress(-1);
        for (int i = 0; i < ns; i++) cdf_storage_release(sl[i].s);
        cdf_storage_release(ph); /* the views hold it now */
        if (st == CDF_OK) *arena_bytes = total;
    }
    free(sl);
    return st;
}


/* ---- the peak of an allocation log (compile/memory_plan.h) ------------------------------------ */
/* Open addressing over the live ids: a slot is empty when its size is UINT64_MAX. */
typedef struct live_slot {
    uint64_t id, bytes;
} live_slot;

static size_t live_home(uint64_t id, size_t cap) { return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1); }

static size_t live_find(const live_slot *t, size_t cap, uint64_t id) {
    size_t h = live_home(id, cap);
    while (t[h].bytes != UINT64_MAX && t[h].id != id) h = (h + 1) & (cap - 1);
    return h;
}

cdf_status cdf_memory_peak(const cdf_mem_event *ev, size_t n, uint64_t *peak, uint64_t *live_at_end, uint64_t *tag_peaks) {
    if (!peak || (n && !ev)) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_memory_peak: NULL argument");
    *peak = 0;
    if (live_at_end) *live_at_end = 0;
    uint64_t tp[CDF_MEM_TAGS] = {0};
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2; /* at most n ids live at once: load factor <= 1/2 */
    live_slot *t = malloc(cap * sizeof *t);
    if (!t) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_memory_peak: out of host memory");
    for (size_t i = 0; i < cap; i++) t[i].bytes = UINT64_MAX;
    uint64_t live = 0, top = 0;
    cdf_status st = CDF_OK;
    for (size_t i = 0; i < n && st == CDF_OK; i++) {
        size_t h = live_find(t, cap, ev[i].id);
        const bool is_live = t[h].bytes != UINT64_MAX;
        if (ev[i].kind == CDF_MEM_ALLOC) {
            if (is_live) {
                st = cdf_error(CDF_ERR_INVALID_ARG, "allocation log: event %zu allocates id %llu, which is live", i,
                               (unsigned long long)ev[i].id);
                break;
            }
            if (ev[i].tag < 0 || ev[i].tag >= CDF_MEM_TAGS) {
                st = cdf_error(CDF_ERR_INVALID_ARG, "allocation log: event %zu has tag %d (0..%d)", i, ev[i].tag, CDF_MEM_TAGS - 1);
                break;
            }
            t[h] = (live_slot){ev[i].id, ev[i].bytes == UINT64_MAX ? UINT64_MAX - 1 : ev[i].bytes};
            live += t[h].bytes;
            if (live > top) top = live;
            if (live > tp[ev[i].tag]) tp[ev[i].tag] = live;
        } else if (ev[i].kind == CDF_MEM_RELEASE) {
            if (!is_live) {
                st = cdf_error(CDF_ERR_INVALID_ARG, "allocation log: event %zu releases id %llu, which is not live", i,
                               (unsigned long long)ev[i].id);
                break;
            }
            live -= t[h].bytes;
            /* backward-shift deletion keeps every probe chain intact: an entry after the hole
             * moves into it unless its home slot lies cyclically in (hole, entry] */
            for (size_t j = h;;) {
                j = (j + 1) & (cap - 1);
                if (t[j].bytes == UINT64_MAX) break;
                const size_t k = live_home(t[j].id, cap);
                if (h <= j ? (h < k && k <= j) : (h < k || k <= j)) continue;
                t[h] = t[j];
                h = j;
            }
            t[h].bytes = UINT64_MAX;
        } else {
            st = cdf_error(CDF_ERR_INVALID_ARG, "allocation log: event %zu has kind %d", i, (int)ev[i].kind);
        }
    }
    free(t);
    if (st != CDF_OK) return st;
    *peak = top;
    if (live_at_end) *live_at_end = live;
    if (tag_peaks)
        for (int k = 0; k < CDF_MEM_TAGS; k++) tag_peaks[k] = tp[k];
    return CDF_OK;
}
