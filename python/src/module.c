/* cdiffusers._cdiffusers — the CPython extension under the `cdiffusers` Python package.
 *
 * A thin layer over the public C API (the headers in include/cdiffusers) only: a Pipeline type wrapping
 * cdf_pipeline, the execution-mode / compile / offload / LoRA / tensor-parallel calls, and the
 * mapping of cdf_status to Python exceptions carrying cdf_last_error(). diffusers' names and
 * argument conventions live in the pure-Python layer (python/cdiffusers); this file speaks
 * the C API's terms. Built against the stable ABI (3.11): images and tensors cross as bytes, so
 * the module needs neither numpy's nor Pillow's headers.
 *
 * The GIL is released while the library works (load, compile, generate); the step callback takes
 * it back, checks for Ctrl-C (PyErr_CheckSignals) and calls the Python callback, so a signal
 * cancels the run between steps and the KeyboardInterrupt propagates as Python raised it. */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"

/* ---- exceptions ---------------------------------------------------------------------------- */
/* One class per family of statuses, each also a subclass of the built-in exception diffusers
 * (or Python) raises for that kind of failure, so `except FileNotFoundError` keeps working. */
static PyObject *g_err_base, *g_err_not_found, *g_err_file, *g_err_value, *g_err_memory, *g_err_unsupported,
    *g_err_runtime;

static PyObject *status_class(cdf_status s) {
    switch (s) {
    case CDF_ERR_NOT_FOUND: return g_err_not_found;
    case CDF_ERR_IO:
    case CDF_ERR_FORMAT: return g_err_file;
    case CDF_ERR_INVALID_ARG:
    case CDF_ERR_SHAPE:
    case CDF_ERR_DTYPE:
    case CDF_ERR_LIMIT: return g_err_value;
    case CDF_ERR_OUT_OF_MEMORY: return g_err_memory;
    case CDF_ERR_UNSUPPORTED: return g_err_unsupported;
    default: return g_err_runtime;
    }
}

/* Raise the exception for the library's last failure on this thread; returns NULL. */
static PyObject *raise_status(cdf_status s) {
    if (s == CDF_OK) s = CDF_ERR_INTERNAL;
    if (s == CDF_ERR_INTERRUPTED) {
        PyErr_SetString(PyExc_KeyboardInterrupt, cdf_last_error());
        return NULL;
    }
    const char *msg = cdf_last_error();
    PyObject *cls = status_class(s);
    PyObject *exc = PyObject_CallFunction(cls, "s", msg && *msg ? msg : cdf_status_str(s));
    if (!exc) return NULL;
    PyObject *st = PyUnicode_FromString(cdf_status_str(s));
    if (st) PyObject_SetAttrString(exc, "status", st);
    Py_XDECREF(st);
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *new_error(PyObject *m, const char *name, PyObject *builtin) {
    char full[96];
    snprintf(full, sizeof full, "cdiffusers.%s", name);
    /* the built-in first: OSError's instance layout must come from the first base */
    PyObject *bases = builtin ? PyTuple_Pack(2, builtin, g_err_base) : PyTuple_Pack(1, PyExc_Exception);
    if (!bases) return NULL;
    PyObject *cls = PyErr_NewException(full, bases, NULL);
    Py_DECREF(bases);
    if (!cls) return NULL;
    Py_INCREF(cls);
    if (PyModule_AddObject(m, name, cls) < 0) {
        Py_DECREF(cls);
        return NULL;
    }
    return cls;
}

/* ---- small conversions --------------------------------------------------------------------- */
/* A cdf_image from (bytes, width, height, channels); the pixels stay owned by the bytes object,
 * which the caller keeps alive in *keep. */
static int image_arg(PyObject *o, const char *what, cdf_image *img, PyObject **keep) {
    PyObject *data;
    int w, h, c;
    if (!PyArg_ParseTuple(o, "Siii", &data, &w, &h, &c)) {
        PyErr_Format(PyExc_TypeError, "%s: expected (bytes, width, height, channels)", what);
        return -1;
    }
    Py_ssize_t n = PyBytes_Size(data);
    if (w <= 0 || h <= 0 || (c != 1 && c != 3) || n != (Py_ssize_t)w * h * c) {
        PyErr_Format(PyExc_ValueError, "%s: %d x %d x %d pixels do not match %zd bytes", what, w, h, c, n);
        return -1;
    }
    img->width = w, img->height = h, img->channels = c;
    img->pixels = (uint8_t *)PyBytes_AsString(data);
    Py_INCREF(data);
    *keep = data;
    return 0;
}

/* ---- Pipeline ------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    cdf_pipeline *p;
    cdf_capture *cap;
    bool busy; /* a call is running with the GIL released: refuse a second one on this pipeline */
} PipelineObject;

static int pipe_ready(PipelineObject *self) {
    if (!self->p) {
        PyErr_SetString(PyExc_RuntimeError, "the pipeline was closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the pipeline is running in another thread (one call at a time)");
        return -1;
    }
    return 0;
}

static int parse_offload(const char *s, cdf_offload_mode *out) {
    if (!s || !strcmp(s, "none")) *out = CDF_OFFLOAD_NONE;
    else if (!strcmp(s, "model")) *out = CDF_OFFLOAD_MODEL;
    else if (!strcmp(s, "sequential")) *out = CDF_OFFLOAD_SEQUENTIAL;
    else {
        PyErr_Format(PyExc_ValueError, "offload must be 'none', 'model' or 'sequential', got '%s'", s);
        return -1;
    }
    return 0;
}

static int Pipeline_init(PyObject *obj, PyObject *args, PyObject *kw) {
    PipelineObject *self = (PipelineObject *)obj;
    static char *kws[] = {"path", "device", "dtype", "offload", "component_files", "config", "allow_unused_keys", NULL};
    const char *path, *device = NULL, *dtype = "bfloat16", *offload = "none", *config = NULL;
    PyObject *files = Py_None;
    int allow_unused = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zzzOzp", kws, &path, &device, &dtype, &offload, &files, &config,
                                     &allow_unused))
        return -1;
    if (self->p) {
        PyErr_SetString(PyExc_RuntimeError, "Pipeline.__init__ called twice");
        return -1;
    }
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.device = device;
    if (dtype && cdf_dtype_parse(dtype, &lp.weight_dtype) != 0) {
        if (!strcmp(dtype, "bfloat16")) lp.weight_dtype = CDF_BF16;
        else if (!strcmp(dtype, "float32")) lp.weight_dtype = CDF_F32;
        else {
            PyErr_Format(PyExc_ValueError, "dtype must be bfloat16 or float32, got '%s'", dtype);
            return -1;
        }
    }
    if (lp.weight_dtype != CDF_BF16 && lp.weight_dtype != CDF_F32) {
        PyErr_Format(PyExc_ValueError, "dtype must be bfloat16 or float32, got '%s'", dtype);
        return -1;
    }
    if (parse_offload(offload, &lp.offload) < 0) return -1;
    lp.config = config;
    lp.allow_unused_keys = allow_unused;
    cdf_component_file cf[16];
    int ncf = 0;
    if (files != Py_None) {
        PyObject *seq = PySequence_Fast(files, "component_files must be a sequence of (component, path) pairs");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Size(seq);
        if (n > 16) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "at most 16 component files");
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *it = PySequence_GetItem(seq, i);
            const char *c = NULL, *pth = NULL;
            int ok = it && PyArg_ParseTuple(it, "ss", &c, &pth);
            Py_XDECREF(it); /* the strings live as long as `files` (the tuples' items) */
            if (!ok) {
                Py_DECREF(seq);
                return -1;
            }
            cf[ncf].component = c, cf[ncf].path = pth, ncf++;
        }
        Py_DECREF(seq);
        lp.component_files = cf, lp.num_component_files = ncf;
    }
    cdf_pipeline *p = NULL;
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_load(path, &lp, &p);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) {
        raise_status(s);
        return -1;
    }
    self->p = p;
    return 0;
}

static void Pipeline_dealloc(PyObject *obj) {
    PipelineObject *self = (PipelineObject *)obj;
    cdf_capture_free(self->cap);
    cdf_pipeline_free(self->p);
    PyTypeObject *tp = Py_TYPE(obj);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(obj);
    Py_DECREF(tp);
}

static PyObject *Pipeline_close(PyObject *obj, PyObject *unused) {
    (void)unused;
    PipelineObject *self = (PipelineObject *)obj;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the pipeline is running in another thread");
        return NULL;
    }
    cdf_capture_free(self->cap);
    self->cap = NULL;
    cdf_pipeline_free(self->p);
    self->p = NULL;
    Py_RETURN_NONE;
}

static PyObject *Pipeline_class_name(PyObject *obj, PyObject *unused) {
    (void)unused;
    PipelineObject *self = (PipelineObject *)obj;
    if (!self->p) {
        PyErr_SetString(PyExc_RuntimeError, "the pipeline was closed");
        return NULL;
    }
    return PyUnicode_FromString(cdf_pipeline_class_name(self->p));
}

/* The step callback's state: the Python callable and the exception it (or a signal) raised. */
typedef struct {
    PyObject *callback; /* (step, num_steps, seconds) -> bool, or NULL */
    PyObject *exc_type, *exc_value, *exc_tb;
} step_ctx;

static bool step_cb(int step, int num_steps, double seconds, void *user) {
    step_ctx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    bool go_on = true;
    if (PyErr_CheckSignals() < 0) {
        go_on = false;
    } else if (c->callback) {
        PyObject *r = PyObject_CallFunction(c->callback, "iid", step, num_steps, seconds);
        if (!r) go_on = false;
        else {
            go_on = r == Py_None || PyObject_IsTrue(r) == 1;
            Py_DECREF(r);
        }
    }
    if (!go_on && PyErr_Occurred()) PyErr_Fetch(&c->exc_type, &c->exc_value, &c->exc_tb);
    PyGILState_Release(g);
    return go_on;
}

static int int_list(PyObject *o, const char *what, int64_t **out, int *n_out) {
    *out = NULL, *n_out = 0;
    if (o == Py_None) return 0;
    PyObject *seq = PySequence_Fast(o, what);
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Size(seq);
    int64_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        long long x = it ? PyLong_AsLongLong(it) : -1;
        Py_XDECREF(it);
        if (PyErr_Occurred()) {
            free(v);
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "%s must hold integers", what);
            return -1;
        }
        v[i] = x;
    }
    Py_DECREF(seq);
    *out = v, *n_out = (int)n;
    return 0;
}

/* A list of str -> a NULL-free array of borrowed UTF-8 pointers (valid while `o` lives). */
static int str_list(PyObject *o, const char *what, const char ***out, int *n_out) {
    *out = NULL, *n_out = 0;
    if (o == Py_None) return 0;
    Py_ssize_t n = PySequence_Size(o);
    if (n < 0) return -1;
    const char **v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_GetItem(o, i); /* a list's item: the list keeps it */
        v[i] = it && PyUnicode_Check(it) ? PyUnicode_AsUTF8AndSize(it, NULL) : NULL;
        Py_XDECREF(it);
        if (!v[i]) {
            free(v);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s must hold str", what);
            return -1;
        }
    }
    *out = v, *n_out = (int)n;
    return 0;
}

/* (float32 bytes, shape) -> a host tensor (the library moves it to the pipeline's device). */
static int embeds_arg(PyObject *o, const char *what, cdf_tensor **out) {
    *out = NULL;
    if (o == Py_None) return 0;
    PyObject *data = NULL, *shape = NULL;
    if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "SO", &data, &shape)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be (float32 bytes, shape)", what);
        return -1;
    }
    int64_t *dims = NULL;
    int nd = 0;
    if (int_list(shape, what, &dims, &nd) < 0) return -1;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) numel *= dims[i] > 0 ? dims[i] : 0;
    if (nd < 1 || nd > 3 || (Py_ssize_t)(numel * 4) != PyBytes_Size(data)) {
        free(dims);
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions, %lld bytes for %lld values", what, nd, (long long)PyBytes_Size(data),
                     (long long)numel);
        return -1;
    }
    cdf_device *cpu = cdf_device_get("cpu");
    *out = cpu ? cdf_tensor_from_host(cpu, CDF_F32, nd, dims, PyBytes_AsString(data), CDF_F32) : NULL;
    free(dims);
    if (!*out) {
        raise_status(cdf_last_status());
        return -1;
    }
    return 0;
}

/* generate(**kw) -> [(pixels bytes, width, height), ...]; with capture=True the intermediates
 * stay readable through captured(key) until the next call. */
static PyObject *Pipeline_generate(PyObject *obj, PyObject *args, PyObject *kw) {
    PipelineObject *self = (PipelineObject *)obj;
    static char *kws[] = {"prompt",     "negative_prompt", "height",    "width",       "num_inference_steps",
                          "guidance_scale", "true_cfg_scale", "max_sequence_length", "seed", "seeds",
                          "num_images", "image",           "mask_image", "strength",   "text_encoder_out_layers",
                          "vae_tiling", "vae_tile_size",   "cache",     "callback",    "capture",
                          "prompts",    "negative_prompts", "prompt_embeds", "pooled_prompt_embeds",
                          "negative_prompt_embeds", "negative_pooled_prompt_embeds", NULL};
    cdf_generate_params gp = cdf_generate_params_default();
    const char *prompt = NULL, *neg = NULL, *cache = NULL;
    unsigned long long seed = 0;
    PyObject *seeds_o = Py_None, *image_o = Py_None, *mask_o = Py_None, *layers_o = Py_None, *cb = Py_None;
    PyObject *prompts_o = Py_None, *negs_o = Py_None, *emb_o[4] = {Py_None, Py_None, Py_None, Py_None};
    int capture = 0;
    if (pipe_ready(self) < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zziiiddiKOiOOdOiizOpOOOOOO", kws, &prompt, &neg, &gp.height, &gp.width,
                                     &gp.num_inference_steps, &gp.guidance_scale, &gp.true_cfg_scale,
                                     &gp.max_sequence_length, &seed, &seeds_o, &gp.num_images, &image_o, &mask_o,
                                     &gp.strength, &layers_o, &gp.vae_tiling, &gp.vae_tile_size, &cache, &cb, &capture,
                                     &prompts_o, &negs_o, &emb_o[0], &emb_o[1], &emb_o[2], &emb_o[3]))
        return NULL;
    gp.prompt = prompt ? prompt : "";
    gp.negative_prompt = neg;
    gp.seed = seed;
    gp.cache = cache;
    PyObject *result = NULL, *keep_img = NULL, *keep_mask = NULL;
    int64_t *seeds64 = NULL, *layers64 = NULL;
    uint64_t *seeds = NULL;
    int *layers = NULL, n_seeds = 0, n_layers = 0;
    cdf_image in_img, in_mask, *out = NULL;
    int count = 0;
    step_ctx ctx = {0};
    const char **prompts = NULL, **negs = NULL;
    int n_prompts = 0, n_negs = 0;
    cdf_tensor *emb[4] = {0};
    static const char *const emb_names[4] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                             "negative_pooled_prompt_embeds"};
    if (int_list(seeds_o, "seeds", &seeds64, &n_seeds) < 0 || int_list(layers_o, "text_encoder_out_layers", &layers64, &n_layers) < 0)
        goto done;
    if (str_list(prompts_o, "prompts", &prompts, &n_prompts) < 0 || str_list(negs_o, "negative_prompts", &negs, &n_negs) < 0)
        goto done;
    if (negs && n_negs != n_prompts) {
        PyErr_Format(PyExc_ValueError, "%d negative prompts for %d prompts", n_negs, n_prompts);
        goto done;
    }
    gp.prompts = prompts, gp.negative_prompts = negs, gp.num_prompts = n_prompts;
    for (int i = 0; i < 4; i++)
        if (embeds_arg(emb_o[i], emb_names[i], &emb[i]) < 0) goto done;
    gp.prompt_embeds = emb[0], gp.pooled_prompt_embeds = emb[1];
    gp.negative_prompt_embeds = emb[2], gp.negative_pooled_prompt_embeds = emb[3];
    if (n_seeds) {
        seeds = malloc((size_t)n_seeds * sizeof *seeds);
        if (!seeds) {
            PyErr_NoMemory();
            goto done;
        }
        for (int i = 0; i < n_seeds; i++) seeds[i] = (uint64_t)seeds64[i];
        gp.seeds = seeds, gp.num_seeds = n_seeds;
    }
    if (n_layers) {
        layers = malloc((size_t)n_layers * sizeof *layers);
        if (!layers) {
            PyErr_NoMemory();
            goto done;
        }
        for (int i = 0; i < n_layers; i++) layers[i] = (int)layers64[i];
        gp.text_encoder_out_layers = layers, gp.num_text_encoder_out_layers = n_layers;
    }
    if (image_o != Py_None) {
        if (image_arg(image_o, "image", &in_img, &keep_img) < 0) goto done;
        gp.image = &in_img;
    }
    if (mask_o != Py_None) {
        if (image_arg(mask_o, "mask_image", &in_mask, &keep_mask) < 0) goto done;
        gp.mask_image = &in_mask;
    }
    if (cb != Py_None) {
        if (!PyCallable_Check(cb)) {
            PyErr_SetString(PyExc_TypeError, "callback must be callable");
            goto done;
        }
        ctx.callback = cb;
    }
    gp.callback = step_cb, gp.callback_user = &ctx; /* always: Ctrl-C is checked between steps */
    if (capture) {
        if (!self->cap && cdf_capture_new(&self->cap) != CDF_OK) {
            raise_status(cdf_last_status());
            goto done;
        }
        cdf_capture_clear(self->cap);
        gp.capture = self->cap;
    } else if (self->cap) {
        cdf_capture_clear(self->cap);
    }
    count = cdf_generate_params_count(&gp);
    if (count < 1 || count > 4096) {
        PyErr_Format(PyExc_ValueError, "a request of %d images", count);
        goto done;
    }
    out = calloc((size_t)count, sizeof *out);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    cdf_status s;
    self->busy = true;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_generate_images(self->p, &gp, out, count);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (s != CDF_OK) {
        if (ctx.exc_type) { /* the callback's (or the signal handler's) own exception */
            PyErr_Restore(ctx.exc_type, ctx.exc_value, ctx.exc_tb);
            ctx.exc_type = ctx.exc_value = ctx.exc_tb = NULL;
        } else {
            raise_status(s);
        }
        count = 0; /* generate freed them */
        goto done;
    }
    result = PyList_New(count);
    for (int i = 0; result && i < count; i++) {
        PyObject *t = Py_BuildValue("(y#ii)", (const char *)out[i].pixels,
                                    (Py_ssize_t)out[i].width * out[i].height * out[i].channels, out[i].width, out[i].height);
        if (!t) {
            Py_CLEAR(result);
            break;
        }
        PyList_SetItem(result, i, t);
    }
done:
    if (out)
        for (int i = 0; i < count; i++) cdf_image_free(&out[i]);
    free(out);
    Py_XDECREF(ctx.exc_type);
    Py_XDECREF(ctx.exc_value);
    Py_XDECREF(ctx.exc_tb);
    Py_XDECREF(keep_img);
    Py_XDECREF(keep_mask);
    free(seeds64), free(layers64), free(seeds), free(layers);
    free(prompts), free(negs);
    for (int i = 0; i < 4; i++) cdf_tensor_release(emb[i]);
    return result;
}

/* captured(key) -> (f32 bytes, shape tuple) or None. */
static PyObject *Pipeline_captured(PyObject *obj, PyObject *args) {
    PipelineObject *self = (PipelineObject *)obj;
    const char *key;
    if (!PyArg_ParseTuple(args, "s", &key)) return NULL;
    cdf_tensor *t = self->cap ? cdf_capture_get(self->cap, key) : NULL;
    if (!t) Py_RETURN_NONE;
    int64_t n = cdf_tensor_numel(t);
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    if (!b) return NULL;
    cdf_status s;
    char *dst = PyBytes_AsString(b);
    Py_BEGIN_ALLOW_THREADS
    s = cdf_tensor_read(t, CDF_F32, dst, (size_t)n * 4);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) {
        Py_DECREF(b);
        return raise_status(s);
    }
    int nd = cdf_tensor_ndim(t);
    PyObject *shape = PyTuple_New(nd);
    for (int i = 0; shape && i < nd; i++) PyTuple_SetItem(shape, i, PyLong_FromLongLong(cdf_tensor_shape(t)[i]));
    PyObject *r = shape ? Py_BuildValue("(NN)", b, shape) : NULL;
    if (!r) Py_XDECREF(b);
    return r;
}

static PyObject *do_compile(PyObject *obj, PyObject *args, PyObject *kw, bool blocks) {
    PipelineObject *self = (PipelineObject *)obj;
    static char *kws[] = {"backend", "fullgraph", "dynamic", NULL};
    cdf_compile_options co = cdf_compile_options_default();
    const char *backend = NULL;
    int fullgraph = co.fullgraph, dynamic = 0;
    if (pipe_ready(self) < 0) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zpp", kws, &backend, &fullgraph, &dynamic)) return NULL;
    if (backend) co.backend = backend;
    co.fullgraph = fullgraph, co.dynamic = dynamic;
    cdf_status s;
    self->busy = true;
    Py_BEGIN_ALLOW_THREADS
    s = blocks ? cdf_pipeline_compile_repeated_blocks(self->p, &co) : cdf_pipeline_compile(self->p, &co);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}
static PyObject *Pipeline_compile(PyObject *o, PyObject *a, PyObject *k) { return do_compile(o, a, k, false); }
static PyObject *Pipeline_compile_blocks(PyObject *o, PyObject *a, PyObject *k) { return do_compile(o, a, k, true); }

static PyObject *Pipeline_set_offload(PyObject *obj, PyObject *args) {
    PipelineObject *self = (PipelineObject *)obj;
    const char *mode;
    cdf_offload_mode m;
    if (pipe_ready(self) < 0 || !PyArg_ParseTuple(args, "s", &mode) || parse_offload(mode, &m) < 0) return NULL;
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_set_offload(self->p, m);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}

/* load_lora(path, scale=1.0, fuse=False, allow_unused=False) -> (adapter, layers, format) */
static PyObject *Pipeline_load_lora(PyObject *obj, PyObject *args, PyObject *kw) {
    PipelineObject *self = (PipelineObject *)obj;
    static char *kws[] = {"path", "scale", "fuse", "allow_unused", NULL};
    const char *path;
    double scale = 1.0;
    int fuse = 0, allow = 0;
    if (pipe_ready(self) < 0 || !PyArg_ParseTupleAndKeywords(args, kw, "s|dpp", kws, &path, &scale, &fuse, &allow))
        return NULL;
    cdf_lora_params lp = cdf_lora_params_default();
    lp.scale = (float)scale, lp.mode = fuse ? CDF_LORA_FUSE : CDF_LORA_RUNTIME, lp.allow_unused = allow;
    cdf_lora_info info;
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_load_lora(self->p, path, &lp, &info);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) return raise_status(s);
    return Py_BuildValue("(iis)", info.adapter, info.layers, info.format);
}

static PyObject *Pipeline_set_lora_scale(PyObject *obj, PyObject *args) {
    PipelineObject *self = (PipelineObject *)obj;
    int adapter;
    double scale;
    if (pipe_ready(self) < 0 || !PyArg_ParseTuple(args, "id", &adapter, &scale)) return NULL;
    cdf_status s = cdf_pipeline_set_lora_scale(self->p, adapter, (float)scale);
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}

static PyObject *Pipeline_unload_lora(PyObject *obj, PyObject *unused) {
    (void)unused;
    PipelineObject *self = (PipelineObject *)obj;
    if (pipe_ready(self) < 0) return NULL;
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_unload_lora(self->p);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}

static PyMethodDef Pipeline_methods[] = {
    {"close", Pipeline_close, METH_NOARGS, "Free the pipeline now (the object is unusable after)."},
    {"class_name", Pipeline_class_name, METH_NOARGS, "cdf_pipeline_class_name: 'FluxPipeline', ..."},
    {"generate", (PyCFunction)(void (*)(void))Pipeline_generate, METH_VARARGS | METH_KEYWORDS,
     "cdf_pipeline_generate_images: the fields of cdf_generate_params -> [(pixels, width, height)]"},
    {"captured", Pipeline_captured, METH_VARARGS, "An intermediate of the last generate(capture=True): (f32 bytes, shape) or None"},
    {"compile", (PyCFunction)(void (*)(void))Pipeline_compile, METH_VARARGS | METH_KEYWORDS, "cdf_pipeline_compile"},
    {"compile_repeated_blocks", (PyCFunction)(void (*)(void))Pipeline_compile_blocks, METH_VARARGS | METH_KEYWORDS,
     "cdf_pipeline_compile_repeated_blocks"},
    {"set_offload", Pipeline_set_offload, METH_VARARGS, "cdf_pipeline_set_offload: 'none', 'model' or 'sequential'"},
    {"load_lora", (PyCFunction)(void (*)(void))Pipeline_load_lora, METH_VARARGS | METH_KEYWORDS, "cdf_pipeline_load_lora"},
    {"set_lora_scale", Pipeline_set_lora_scale, METH_VARARGS, "cdf_pipeline_set_lora_scale"},
    {"unload_lora", Pipeline_unload_lora, METH_NOARGS, "cdf_pipeline_unload_lora"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Pipeline_slots[] = {
    {Py_tp_doc, "A loaded cdf_pipeline (cdf_pipeline_load). Pipeline(path, device=None, dtype='bfloat16', "
                "offload='none', component_files=None, config=None, allow_unused_keys=False)"},
    {Py_tp_init, Pipeline_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Pipeline_dealloc},
    {Py_tp_methods, Pipeline_methods},
    {0, NULL},
};
static PyType_Spec Pipeline_spec = {"cdiffusers._cdiffusers.Pipeline", sizeof(PipelineObject), 0, Py_TPFLAGS_DEFAULT,
                                    Pipeline_slots};

/* ---- module functions ---------------------------------------------------------------------- */
static PyObject *m_set_exec_mode(PyObject *m, PyObject *args) {
    (void)m;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    cdf_exec_mode mode;
    if (!strcmp(name, "eager")) mode = CDF_EXEC_EAGER;
    else if (!strcmp(name, "defer_and_fuse")) mode = CDF_EXEC_DEFER_AND_FUSE;
    else return PyErr_Format(PyExc_ValueError, "execution mode must be 'eager' or 'defer_and_fuse', got '%s'", name);
    cdf_status s = cdf_exec_set_mode(mode);
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}

static PyObject *m_get_exec_mode(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    return PyUnicode_FromString(cdf_exec_get_mode() == CDF_EXEC_DEFER_AND_FUSE ? "defer_and_fuse" : "eager");
}

static PyObject *m_exec_stats(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    cdf_exec_stats st;
    cdf_exec_get_stats(&st);
    return Py_BuildValue("{sKsKsKsKsKsK}", "ops", (unsigned long long)st.ops, "kernels_launched",
                         (unsigned long long)st.kernels_launched, "fused_kernels", (unsigned long long)st.fused_kernels,
                         "compiles", (unsigned long long)st.compiles, "cache_hits", (unsigned long long)st.cache_hits,
                         "graph_breaks", (unsigned long long)st.graph_breaks);
}

static PyObject *m_devices(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    int n = cdf_device_count();
    PyObject *l = PyList_New(0);
    for (int i = 0; l && i < n; i++) {
        PyObject *s = PyUnicode_FromString(cdf_device_name(cdf_device_at(i)));
        if (!s || PyList_Append(l, s) < 0) Py_CLEAR(l);
        Py_XDECREF(s);
    }
    return l;
}

static PyObject *m_set_forbid_recompile(PyObject *m, PyObject *args) {
    (void)m;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    cdf_compile_set_forbid_recompile(on);
    Py_RETURN_NONE;
}

/* The process group and the mesh tensor parallelism loads over: process-wide in the library
 * (cdf_tp_enable), so one of each here. */
static cdf_process_group *g_pg;
static cdf_device_mesh *g_mesh;

static PyObject *m_dist_init(PyObject *m, PyObject *args) {
    (void)m;
    const char *backend;
    if (!PyArg_ParseTuple(args, "s", &backend)) return NULL;
    if (g_pg) return PyErr_Format(PyExc_RuntimeError, "the process group is already initialised");
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_dist_init(backend, &g_pg);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) return raise_status(s);
    return Py_BuildValue("(ii)", cdf_dist_rank(g_pg), cdf_dist_world_size(g_pg));
}

static PyObject *m_dist_info(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    if (!g_pg) Py_RETURN_NONE;
    return Py_BuildValue("(iis)", cdf_dist_rank(g_pg), cdf_dist_world_size(g_pg), cdf_dist_backend_name(g_pg));
}

static PyObject *m_dist_collectives(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    cdf_dist_stats st = {0};
    if (g_pg) cdf_dist_get_stats(g_pg, &st);
    return PyLong_FromUnsignedLongLong((unsigned long long)st.collectives);
}

static PyObject *m_dist_barrier(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    if (!g_pg) return PyErr_Format(PyExc_RuntimeError, "no process group (call init_process_group first)");
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_dist_barrier(g_pg);
    Py_END_ALLOW_THREADS
    if (s != CDF_OK) return raise_status(s);
    Py_RETURN_NONE;
}

/* tp_enable(device or None, replicate or None): shard what loads next over every rank. */
static PyObject *m_tp_enable(PyObject *m, PyObject *args) {
    (void)m;
    const char *device = NULL, *replicate = NULL;
    if (!PyArg_ParseTuple(args, "zz", &device, &replicate)) return NULL;
    if (!g_pg) return PyErr_Format(PyExc_RuntimeError, "tensor parallelism needs init_process_group() first");
    if (!g_mesh) {
        cdf_device *dev = NULL;
        if (device && !(dev = cdf_device_get(device)))
            return PyErr_Format(g_err_not_found, "no device '%s' (loaded: see cdiffusers.devices())", device);
        if (cdf_device_mesh_new(g_pg, dev, &g_mesh) != CDF_OK) return raise_status(cdf_last_status());
    }
    if (cdf_tp_enable(g_mesh, replicate) != CDF_OK) return raise_status(cdf_last_status());
    Py_RETURN_NONE;
}

static PyObject *m_tp_disable(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    cdf_tp_disable();
    Py_RETURN_NONE;
}

static PyObject *m_dist_finalize(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    cdf_tp_disable();
    cdf_device_mesh_free(g_mesh);
    g_mesh = NULL;
    cdf_dist_finalize(g_pg);
    g_pg = NULL;
    Py_RETURN_NONE;
}

static PyObject *m_dist_backend_available(PyObject *m, PyObject *args) {
    (void)m;
    const char *b;
    if (!PyArg_ParseTuple(args, "s", &b)) return NULL;
    return PyBool_FromLong(cdf_dist_backend_available(b));
}

/* inspect(path, config=None) -> pipeline class name, from the configs and checkpoint headers
 * only (cdf_pipeline_plan_memory / cdf_pipeline_single_file_model): from_pretrained's early
 * check, with the library's message for a missing or broken folder, before any weight is read. */
static PyObject *m_inspect(PyObject *m, PyObject *args) {
    (void)m;
    const char *path, *config = NULL;
    if (!PyArg_ParseTuple(args, "s|z", &path, &config)) return NULL;
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.config = config;
    /* the plan itself is discarded; FLUX.2's text-encoder layers are named by the call (the
     * default 10, 20, 30 does not exist in a small encoder), so layer 0 stands in here */
    cdf_generate_params gp = cdf_generate_params_default();
    static const int layer0[1] = {0};
    gp.text_encoder_out_layers = layer0, gp.num_text_encoder_out_layers = 1;
    cdf_memory_plan *plan = malloc(sizeof *plan);
    if (!plan) return PyErr_NoMemory();
    cdf_status s;
    Py_BEGIN_ALLOW_THREADS
    s = cdf_pipeline_plan_memory(path, &lp, &gp, plan);
    Py_END_ALLOW_THREADS
    PyObject *r = s == CDF_OK ? PyUnicode_FromString(plan->pipeline_class) : raise_status(s);
    free(plan);
    return r;
}

static PyMethodDef module_methods[] = {
    {"inspect", m_inspect, METH_VARARGS, "the pipeline class of a folder or file, read from its configs (cdf_pipeline_plan_memory)"},
    {"set_exec_mode", m_set_exec_mode, METH_VARARGS, "cdf_exec_set_mode: 'eager' or 'defer_and_fuse'"},
    {"get_exec_mode", m_get_exec_mode, METH_NOARGS, "cdf_exec_get_mode"},
    {"exec_stats", m_exec_stats, METH_NOARGS, "cdf_exec_get_stats as a dict"},
    {"devices", m_devices, METH_NOARGS, "the registered devices, the default first"},
    {"set_forbid_recompile", m_set_forbid_recompile, METH_VARARGS, "cdf_compile_set_forbid_recompile (testing hook)"},
    {"dist_init", m_dist_init, METH_VARARGS, "cdf_dist_init(backend) -> (rank, world_size)"},
    {"dist_info", m_dist_info, METH_NOARGS, "(rank, world_size, backend) or None"},
    {"dist_collectives", m_dist_collectives, METH_NOARGS, "collectives this rank ran (cdf_dist_get_stats)"},
    {"dist_barrier", m_dist_barrier, METH_NOARGS, "cdf_dist_barrier"},
    {"dist_finalize", m_dist_finalize, METH_NOARGS, "cdf_tp_disable + cdf_dist_finalize"},
    {"dist_backend_available", m_dist_backend_available, METH_VARARGS, "cdf_dist_backend_available"},
    {"tp_enable", m_tp_enable, METH_VARARGS, "cdf_device_mesh_new (once) + cdf_tp_enable(mesh, replicate)"},
    {"tp_disable", m_tp_disable, METH_NOARGS, "cdf_tp_disable"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "cdiffusers._cdiffusers",
                                        "The C layer of the cdiffusers package (see cdiffusers/__init__.py).", -1,
                                        module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cdiffusers(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    PyObject *tp = PyType_FromSpec(&Pipeline_spec);
    if (!tp || PyModule_AddObject(m, "Pipeline", tp) < 0) goto fail;
    if (!(g_err_base = new_error(m, "CdiffusersError", NULL))) goto fail;
    if (!(g_err_not_found = new_error(m, "NotFoundError", PyExc_FileNotFoundError))) goto fail;
    if (!(g_err_file = new_error(m, "ModelFileError", PyExc_OSError))) goto fail;
    if (!(g_err_value = new_error(m, "InvalidArgumentError", PyExc_ValueError))) goto fail;
    if (!(g_err_memory = new_error(m, "OutOfMemoryError", PyExc_MemoryError))) goto fail;
    if (!(g_err_unsupported = new_error(m, "UnsupportedError", PyExc_NotImplementedError))) goto fail;
    if (!(g_err_runtime = new_error(m, "RuntimeFailure", PyExc_RuntimeError))) goto fail;
    if (PyModule_AddStringConstant(m, "version", CDIFFUSERS_VERSION) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
