/* Private layout of a loaded component, for the files that extend components (registry,
 * offload, compile) without widening the public component API. */
#ifndef CDF_COMPONENT_IMPL_H
#define CDF_COMPONENT_IMPL_H

#include <cjson/cJSON.h>

#include "models/component.h"

struct cdf_component {
    const cdf_component_class *cls;
    void *impl; /* NULL while offloaded (weights released) */
    cJSON *cfg;
    char class_name[128];
};

#endif
