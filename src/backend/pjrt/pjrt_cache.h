/* Compiled PJRT programs, kept in memory by their text and on disk across processes
 * (PJRT_Executable_Serialize / DeserializeAndLoad) under $CDIFFUSERS_PJRT_CACHE, else
 * $XDG_CACHE_HOME/cdiffusers/pjrt, else ~/.cache/cdiffusers/pjrt ("off": memory only).
 *
 * A disk entry is keyed on what makes an executable valid: the plugin (path, platform version,
 * StableHLO version), the device kind, the host CPU's features (the CPU plugin compiles for
 * them), the compile options and the program text, which the entry also stores and compares
 * (a hash collision is a miss, never a wrong program). Entries are written to a temporary file
 * and renamed, so a reader sees a whole entry or none; a stale or corrupt entry is compiled
 * again with a warning. The folder is bounded (CDIFFUSERS_PJRT_CACHE_MAX, default 4G): the least
 * recently used entries go first. */
#ifndef CDF_BACKEND_PJRT_CACHE_H
#define CDF_BACKEND_PJRT_CACHE_H

#include "backend/pjrt/pjrt_runtime.h"

typedef struct cdf_pjrt_exe {
    PJRT_LoadedExecutable *exe;
    size_t n_outputs;
    uint64_t temp_bytes; /* its compiled temporaries (cdf_pjrt_compiled_memory; 0 where not reported) */
} cdf_pjrt_exe;

typedef struct cdf_pjrt_cache cdf_pjrt_cache;

typedef struct cdf_pjrt_cache_stats {
    uint64_t memory_hits, disk_hits, compiles, disk_writes, disk_errors;
    double compile_seconds, load_seconds; /* in the plugin's compile / the disk cache's load */
} cdf_pjrt_cache_stats;

cdf_status cdf_pjrt_cache_open(cdf_pjrt_cache **out, cdf_pjrt *rt);
/* The executable of a program text compiled for `replicas` replicas (1: one device): from
 * memory, else from disk, else compiled (and written to disk); text and replica count are the
 * key. who names the program in errors and in the compile notice. The cache owns *out. */
cdf_status cdf_pjrt_cache_get(cdf_pjrt_cache *c, cdf_pjrt *rt, const char *text, size_t len, int replicas, const char *who,
                              cdf_pjrt_exe **out);
void cdf_pjrt_cache_get_stats(const cdf_pjrt_cache *c, cdf_pjrt_cache_stats *out);
/* The cache folder in use ("" when the disk cache is off). */
const char *cdf_pjrt_cache_dir(const cdf_pjrt_cache *c);

/* Tests only: called with each program text before it is compiled (a refused program). */
extern void (*cdf_pjrt_cache_test_hook)(char *text, size_t len);

/* The folder the settings name (for `cdiffusers cache`; "" when off). */
void cdf_pjrt_cache_default_dir(char *out, size_t cap);

#endif
