/* Named tensor maps: the inputs and outputs of one component forward (run-model, tests). */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "nn/nn.h"
#include "tensor/tensor_impl.h"

void cdf_tensor_map_init(cdf_tensor_map *m) { memset(m, 0, sizeof *m); }

void cdf_tensor_map_clear(cdf_tensor_map *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->names[i]);
        cdf_tensor_release(m->tensors[i]);
    }
    free(m->names);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

cdf_status cdf_tensor_map_set(cdf_tensor_map *m, const char *name, cdf_tensor *t) {
    if (!t) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "tensor map: NULL tensor for '%s'", name);
    for (int i = 0; i < m->n; i++) {
        if (strcmp(m->names[i], name) == 0) {
            cdf_tensor_retain(t);
            cdf_tensor_release(m->tensors[i]);
            m->tensors[i] = t;
            return CDF_OK;
        }
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        char **nn = realloc(m->names, cap * sizeof *nn);
        if (!nn) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        m->names = nn;
        cdf_tensor **nt = realloc(m->tensors, cap * sizeof *nt);
        if (!nt) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        m->tensors = nt;
        m->cap = cap;
    }
    m->names[m->n] = strdup(name);
    m->tensors[m->n] = cdf_tensor_retain(t);
    m->n++;
    return CDF_OK;
}

cdf_tensor *cdf_tensor_map_get(const cdf_tensor_map *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0) return m->tensors[i];
    return NULL;
}

cdf_status cdf_tensor_map_load(cdf_tensor_map *m, const char *path, cdf_device *dev) {
    cdf_st_file *f;
    CDF_TRY(cdf_st_open(path, &f));
    cdf_status s = CDF_OK;
    cdf_scope_suppress(1);
    for (int i = 0; i < cdf_st_count(f) && s == CDF_OK; i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        cdf_tensor *x = cdf_tensor_from_host(dev, t->dtype, t->ndim, t->shape, cdf_st_data(f, t), t->dtype);
        if (!x) {
            s = cdf_error_prefix("loading '%s' from %s: ", t->name, path);
            break;
        }
        s = cdf_tensor_map_set(m, t->name, x);
        cdf_tensor_release(x);
    }
    cdf_scope_suppress(-1);
    cdf_st_close(f);
    return s;
}

cdf_status cdf_tensor_map_save(const cdf_tensor_map *m, const char *path, bool keep_dtype) {
    cdf_st_writer *w = cdf_st_writer_new();
    if (!w) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = cdf_st_writer_set_metadata(w, "format", "pt");
    for (int i = 0; i < m->n && s == CDF_OK; i++) {
        cdf_tensor *t = m->tensors[i];
        cdf_dtype dt = (!keep_dtype && cdf_dtype_is_float(t->dtype)) ? CDF_F32 : t->dtype;
        size_t bytes = (size_t)cdf_tensor_numel(t) * cdf_dtype_size(dt);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) {
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        s = cdf_tensor_read(t, dt, buf, bytes);
        if (s == CDF_OK) s = cdf_st_writer_add(w, m->names[i], dt, t->ndim, t->shape, buf);
        free(buf);
    }
    if (s == CDF_OK) s = cdf_st_writer_save(w, path);
    cdf_st_writer_free(w);
    return s;
}
