/* cdiffusers — the pjrt backend's plugins and its compiled-program cache (docs/pjrt.md). */
#ifndef CDIFFUSERS_PJRT_H
#define CDIFFUSERS_PJRT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PJRT plugins the pjrt backend can load (none in a build without it): CDIFFUSERS_PJRT_PLUGIN,
 * then the Python packages xla_cpu_pjrt, xla_cuda13 and libtpu. Listing reads each library's
 * PJRT API version (dlopen + GetPjrtApi) without initialising it: libtpu's initialisation blocks
 * for minutes off Google Cloud, so a plugin is initialised only when it is the one asked for. */
typedef struct cdf_pjrt_plugin_info {
    char path[1024];
    char package[32];      /* "xla_cpu_pjrt", "xla_cuda13", "libtpu" or "env" (CDIFFUSERS_PJRT_PLUGIN) */
    int api_major, api_minor; /* -1 when the library could not be read (note says why) */
    bool chosen;           /* the plugin `--device pjrt` opens */
    char note[256];
} cdf_pjrt_plugin_info;
/* Fills up to cap entries; returns how many plugins were found. */
int cdf_pjrt_list_plugins(cdf_pjrt_plugin_info *out, int cap);
/* The folder of the pjrt backend's compiled-program cache the settings name
 * ($CDIFFUSERS_PJRT_CACHE, else $XDG_CACHE_HOME/cdiffusers/pjrt, else ~/.cache/cdiffusers/pjrt);
 * "" when the disk cache is off (CDIFFUSERS_PJRT_CACHE=off). Its entries are files *.pjrtx. */
void cdf_pjrt_cache_folder(char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
