/* cdiffusers — compile options (cdf_pipeline_compile, cdf_component_compile); the execution
 * modes and their counters are in cdiffusers/exec.h. */
#ifndef CDIFFUSERS_COMPILE_H
#define CDIFFUSERS_COMPILE_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* compile: a model forward is captured once per input signature (names, dtypes, shapes) into a
 * static graph, optimised (elementwise fusion) and replayed for later calls with the same
 * signature; intermediate buffers are allocated once per graph. Timesteps, sigmas and guidance
 * are inputs, so changing the step count never recompiles; a new height/width compiles once.
 * fullgraph: a host read inside the forward (a graph break) is an error naming it instead of a
 * silent fallback to eager. dynamic shapes are not supported (dynamic must be false). */
typedef struct cdf_compile_options {
    const char *backend; /* "cpu" */
    bool fullgraph;
    bool dynamic;
} cdf_compile_options;
cdf_compile_options cdf_compile_options_default(void); /* cpu, fullgraph, static shapes */
/* Testing hook: make any compile after the first one of a module an error (CDF_ERR_GRAPH_BREAK
 * is not used; CDF_ERR_UNSUPPORTED "unexpected recompile"), to assert that a call reused a graph. */
void cdf_compile_set_forbid_recompile(bool forbid);

#ifdef __cplusplus
}
#endif
#endif
