/* exec/capture — the capture of a forward in progress on this thread, and the hooks the op path
 * calls while one is active (the graph caches of compile/ start and end captures).
 *
 * While a capture is active, cdf_exec_submit records nodes instead of running them (every buffer
 * they allocate is virtual: no memory until the memory planner places it), and a host read is a
 * graph break: an error naming the read when fullgraph is set, otherwise the capture is
 * abandoned and what was recorded runs eagerly. Reads of declared static inputs are allowed
 * (their values are part of the plan's key). */
#ifndef CDF_EXEC_CAPTURE_H
#define CDF_EXEC_CAPTURE_H

#include <stdint.h>

#include "graph/node.h"
#include "graph/value.h"

#define CDF_MAX_STATIC_INPUTS 4

/* One event of a measured forward's allocation log (cdf_measure_begin below); the peak of a log is
 * compile/memory_plan.h's cdf_memory_peak. */
typedef enum { CDF_MEM_ALLOC = 0, CDF_MEM_RELEASE = 1 } cdf_mem_event_kind;
typedef struct cdf_mem_event {
    cdf_mem_event_kind kind;
    uint64_t id;
    uint64_t bytes; /* ALLOC: the buffer's size; RELEASE: ignored (the ALLOC's size counts) */
    int tag;        /* ALLOC: what was running, 0..CDF_MEM_TAGS-1 (cdf_measure_set_tag) */
} cdf_mem_event;
#define CDF_MEM_TAGS 4

typedef struct cdf_exec_capture {
    bool active, broken, fullgraph;
    bool measure;     /* measure mode (below): nodes are dropped, allocations logged */
    uint64_t session; /* the measure session the log belongs to */
    cdf_mem_event *log;
    size_t n_log, cap_log;
    int tag; /* given to the ALLOCs logged now */
    /* measure mode: the scratch an op needs while it runs (cdf_measure_set_scratch) */
    uint64_t (*scratch)(const struct cdf_node *n, void *user);
    void *scratch_user;
    const char *who;
    cdf_node **nodes;
    int n, cap;
    cdf_status break_status;
    cdf_storage **virt; /* buffers created during the capture (references) */
    int n_virt, cap_virt;
    /* static inputs (cdf_graph_cache_set_static_inputs): their values are part of the plan's
     * key, so the forward may read them on the host without a graph break */
    const cdf_storage *static_st[CDF_MAX_STATIC_INPUTS];
    int n_static;
} cdf_exec_capture;
/* This thread's capture (inactive unless a graph cache is capturing). */
cdf_exec_capture *cdf_exec_capture_state(void);

/* Hooks for exec.c / tensor.c */
/* A virtual buffer was created during the active capture (tensor.c). */
void cdf_exec_capture_note_virtual(cdf_storage *s);
bool cdf_exec_capture_tracing(void);
/* Record a node into the active capture; false if no capture is active. */
bool cdf_exec_capture_record(cdf_node *n);
/* A host read during capture: returns CDF_OK (capture abandoned, eager from here; or a static
 * input) or the fullgraph error. */
cdf_status cdf_exec_capture_host_read(const cdf_tensor *t);

/* For the graph caches (compile/compile.c): a graph break of the active capture for `what`; give
 * every virtual buffer memory; launch recorded nodes (ownership passes to the queues); drop the
 * capture's references to its virtual buffers. */
cdf_status cdf_exec_capture_graph_break(const char *what);
cdf_status cdf_exec_capture_materialize_all(cdf_exec_capture *c);
cdf_status cdf_exec_capture_launch_all(cdf_node **nodes, int n);
void cdf_exec_capture_release_virtuals(cdf_exec_capture *c);

/* ---- measure mode (the memory planner, pipelines/planner.c) ------------------------------------
 * Between cdf_measure_begin and cdf_measure_end this thread runs forwards without running them:
 * every buffer allocated is virtual (no device memory; a host upload into one is skipped), every
 * op node is dropped at submit instead of being executed (so its operands are released at once,
 * as eager execution releases them once the queue has run the node: the live set the allocator
 * sees when it drains the queue before declaring out-of-memory), and each buffer's creation and
 * final release are logged with its size. A host read of a virtual buffer is an error naming it
 * (a forward whose shape depends on computed values cannot be measured); reads of real buffers
 * made before the session (inputs) are allowed. Not nestable, and not inside a compile capture. */
cdf_status cdf_measure_begin(void);
bool cdf_measuring(void);
/* Tag the allocations logged from now on (0..CDF_MEM_TAGS-1; the session starts at 0); returns the
 * previous tag. cdf_block_run tags a repeated block's allocations by its family (compile/compile.c). */
int cdf_measure_set_tag(int tag);
/* Scratch the target device needs while an op runs, beside its operands and output (a pjrt
 * program's compiled temporaries, which its device peak counts): fn(node, user) bytes are logged
 * for each op as an allocation released right after it, so the log's peak counts them on top of
 * what is live while the op runs. For the session in progress (it starts without). */
void cdf_measure_set_scratch(uint64_t (*fn)(const struct cdf_node *n, void *user), void *user);
/* End the session: *log receives its events (malloc'd, the caller frees; NULL when none) and *n
 * their count. Returns the first failure of the session (a host read, an untracked buffer). */
cdf_status cdf_measure_end(cdf_mem_event **log, size_t *n);

#endif
