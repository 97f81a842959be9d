/* The public face of generate's capture map (cdiffusers/capture.h). A cdf_capture is a
 * cdf_tensor_map: cdf_generate_params.capture is documented as one, so the pipelines keep
 * storing into it unchanged. */
#include "cdiffusers/capture.h"

#include <stdlib.h>

#include "core/error_internal.h"
#include "nn/nn.h"

cdf_status cdf_capture_new(cdf_capture **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_capture_new: out is NULL");
    cdf_tensor_map *m = malloc(sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (capture)");
    cdf_tensor_map_init(m);
    *out = (cdf_capture *)m;
    return CDF_OK;
}

void cdf_capture_clear(cdf_capture *c) {
    if (c) cdf_tensor_map_clear((cdf_tensor_map *)c);
}

void cdf_capture_free(cdf_capture *c) {
    if (!c) return;
    cdf_tensor_map_clear((cdf_tensor_map *)c);
    free(c);
}

cdf_tensor *cdf_capture_get(const cdf_capture *c, const char *key) {
    return c && key ? cdf_tensor_map_get((const cdf_tensor_map *)c, key) : NULL;
}
