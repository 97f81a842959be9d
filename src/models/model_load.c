/* What the model files share and call (registry.c lists the classes and calls them; nothing
 * here calls back up): a model's own load entry point, its weights opened, loaded and closed,
 * and its inputs read by name. */
#include <cjson/cJSON.h>

#include "core/error_internal.h"
#include "models/component_impl.h"

cdf_status cdf_component_load_impl(cdf_status (*load)(const char *dir, const struct cJSON *cfg, const cdf_load_options *opt,
                                                      void **impl),
                                   const char *fn, const char *what, const char *dir, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    if (!dir) return cdf_error(CDF_ERR_INVALID_ARG, "%s: dir is NULL", fn);
    cJSON *cfg = NULL;
    CDF_TRY(cdf_config_load(dir, &cfg));
    cdf_status s = load(dir, cfg, opt, impl);
    cJSON_Delete(cfg);
    if (s != CDF_OK) cdf_error_prefix("loading %s from %s: ", what, dir);
    return s;
}

cdf_status cdf_model_load_weights(const char *dir, const cdf_load_options *opt, cdf_status (*load)(cdf_weights *w, void *model),
                                  void *model, cdf_device **dev, const cdf_tp *tp) {
    cdf_weights *w = NULL;
    cdf_status s = cdf_weights_open(dir, opt, &w);
    if (s == CDF_OK && dev) *dev = cdf_weights_options(w)->device;
    if (s == CDF_OK) s = load(w, model);
    cdf_weights_free(w); /* the loaded tensors are device copies; the mapping is no longer needed */
    if (s == CDF_OK && tp) s = cdf_tp_check_plan_used(tp);
    return s;
}

cdf_tensor *cdf_input(const cdf_tensor_map *in, const char *name, const char *model) {
    cdf_tensor *t = cdf_tensor_map_get(in, name);
    if (!t) cdf_error(CDF_ERR_NOT_FOUND, "%s: required input '%s' is missing", model, name);
    return t;
}
