/* A shared library that looks like a PJRT plugin of another major version (test_pjrt: the
 * backend must refuse it by name, never call into it). */
#include <stddef.h>
#include <string.h>

#include "pjrt_c_api.h"

static PJRT_Api g_api;

const PJRT_Api *GetPjrtApi(void) {
    memset(&g_api, 0, sizeof g_api);
    g_api.struct_size = PJRT_Api_STRUCT_SIZE;
    g_api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    g_api.pjrt_api_version.major_version = PJRT_API_MAJOR + 1;
    g_api.pjrt_api_version.minor_version = 0;
    return &g_api;
}
