/* nn/ — what models are written against besides the tensor API: named weights loaded from a
 * checkpoint folder (with shape checks that name the tensor), config.json access, and small
 * building blocks (Linear, norms) used by every model.
 *
 * A model never knows where its weights come from or in which mode it runs: it asks
 * cdf_weights for "transformer_blocks.0.attn.to_q.weight" with the shape its config implies
 * and gets a device tensor (converted to the compute dtype policy). */
#ifndef CDF_NN_H
#define CDF_NN_H

#include <stdarg.h>

#include "cdiffusers/io.h"
#include "cdiffusers/tensor.h"

struct cJSON;

/* How weights are materialised on the device. */
typedef struct cdf_load_options {
    cdf_device *device;      /* NULL = default device */
    cdf_dtype weight_dtype;  /* storage dtype of float weights on the device: CDF_F32 (upcast,
                                exact path) or CDF_BF16; norms' 1-D weights always stay f32 */
    cdf_dtype compute_dtype; /* activations: CDF_F32 */
} cdf_load_options;

cdf_load_options cdf_load_options_default(void);

typedef struct cdf_weights cdf_weights;

/* Open a component folder's weights (see cdf_checkpoint_open) for loading onto a device. */
cdf_status cdf_weights_open(const char *dir, const cdf_load_options *opt, cdf_weights **out);
void cdf_weights_free(cdf_weights *w);
const char *cdf_weights_path(const cdf_weights *w);
const cdf_load_options *cdf_weights_options(const cdf_weights *w);
cdf_checkpoint *cdf_weights_checkpoint(cdf_weights *w);

/* The tensor `name` (printf-style), which must have exactly `shape` (ndim dims; a dim of -1
 * accepts any size). Missing tensor: CDF_ERR_NOT_FOUND naming it and the folder; other shape:
 * CDF_ERR_SHAPE naming it with both shapes. Float tensors are converted to the load policy's
 * dtype (2-D+ weights) or f32 (1-D and 0-D: biases, norm scales). Integer tensors keep theirs.
 * Returns a new reference (not scope-recorded). */
cdf_tensor *cdf_weights_get(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, but an absent tensor returns NULL with no error recorded (check cdf_weights_has). */
cdf_tensor *cdf_weights_get_opt(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool cdf_weights_has(cdf_weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same as cdf_weights_get but always f32 (e.g. position-embedding tables). */
cdf_tensor *cdf_weights_get_f32(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Bytes of device memory the loaded weights hold (sum of materialised tensors). */
uint64_t cdf_weights_loaded_bytes(const cdf_weights *w);

/* ---- config.json ---------------------------------------------------------------------- */
/* Load <dir>/config.json. The caller frees with cJSON_Delete. */
cdf_status cdf_config_load(const char *dir, struct cJSON **out);
/* "_class_name" (diffusers) or architectures[0] (transformers); NULL if neither. */
const char *cdf_config_class_name(const struct cJSON *cfg);

/* ---- building blocks -------------------------------------------------------------------- */
typedef struct cdf_linear_layer {
    cdf_tensor *w; /* [out, in] */
    cdf_tensor *b; /* [out] or NULL */
    int64_t in, out;
} cdf_linear_layer;

/* Loads "<prefix>.weight" [out, in] and, if bias, "<prefix>.bias" [out]. bias: 1 = required,
 * 0 = none, -1 = optional (load if present). */
cdf_status cdf_linear_load(cdf_weights *w, cdf_linear_layer *l, int64_t in, int64_t out, int bias, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void cdf_linear_free(cdf_linear_layer *l);
static inline cdf_tensor *cdf_linear_fwd(const cdf_linear_layer *l, cdf_tensor *x) { return cdf_linear(x, l->w, l->b); }

typedef struct cdf_norm_layer {
    cdf_tensor *w, *b; /* [dim] or NULL */
    float eps;
} cdf_norm_layer;
/* bias/weight flags as for cdf_linear_load. */
cdf_status cdf_norm_load(cdf_weights *w, cdf_norm_layer *n, int64_t dim, int weight, int bias, float eps, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
void cdf_norm_free(cdf_norm_layer *n);

typedef struct cdf_conv_layer {
    cdf_tensor *w, *b;
    cdf_conv2d_params p;
} cdf_conv_layer;
cdf_status cdf_conv_load(cdf_weights *w, cdf_conv_layer *c, int64_t cin, int64_t cout, int k, int stride, int pad, int bias,
                         const char *fmt, ...) __attribute__((format(printf, 9, 10)));
void cdf_conv_free(cdf_conv_layer *c);
static inline cdf_tensor *cdf_conv_fwd(const cdf_conv_layer *c, cdf_tensor *x) { return cdf_conv2d(x, c->w, c->b, &c->p); }

/* ---- named tensor maps (component inputs/outputs) ---------------------------------------- */
typedef struct cdf_tensor_map {
    int n, cap;
    char **names;
    cdf_tensor **tensors; /* references owned by the map */
} cdf_tensor_map;
void cdf_tensor_map_init(cdf_tensor_map *m);
void cdf_tensor_map_clear(cdf_tensor_map *m);
/* Takes a new reference to t (replaces an existing entry). */
cdf_status cdf_tensor_map_set(cdf_tensor_map *m, const char *name, cdf_tensor *t);
cdf_tensor *cdf_tensor_map_get(const cdf_tensor_map *m, const char *name); /* borrowed, NULL if absent */
/* Read every tensor of a safetensors file onto dev (as stored dtypes). */
cdf_status cdf_tensor_map_load(cdf_tensor_map *m, const char *path, cdf_device *dev);
/* Write every tensor (as f32 for floats unless keep_dtype) to a safetensors file. */
cdf_status cdf_tensor_map_save(const cdf_tensor_map *m, const char *path, bool keep_dtype);

#endif
