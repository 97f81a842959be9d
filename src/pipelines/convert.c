/* cdf_convert_to_gguf (cdiffusers/convert.h): one component's weights as a GGUF file.
 *
 * Pass 1 loads the component the way a pipeline does, with a load hook (cdf_load_options.on_read)
 * listing every tensor the model reads under its diffusers name and whether a linear layer read
 * it as its [out, in] weight; the repeated blocks' weights stay in the mapped checkpoint
 * (blocks_on_host), so this takes little memory. Pass 2 reopens the same weights source and lets
 * the GGUF writer pull the tensors one at a time (fill), decoding, converting or quantizing each
 * into the writer's buffer. Reading through the same source as the loader is what makes the file
 * load back to the same values: names, splits and reorders of other layouts come out as the
 * loader sees them. */
#include "cdiffusers/convert.h"

#include "cdiffusers/device.h"
#include "cdiffusers/dtype.h"
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "models/component.h"
#include "nn/nn.h"
#include "nn/weights_source.h"
#include "pipelines/pipeline_impl.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

cdf_convert_params cdf_convert_params_default(void) {
    return (cdf_convert_params){.component = "transformer", .type = CDF_GGML_F32};
}

typedef struct entry {
    char *name;
    bool linear;   /* read as a linear layer's weight */
    uint32_t type; /* ggml type written */
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS];
} entry;

typedef struct conv {
    entry *e;
    int n, cap;
    bool oom;
    cdf_wsrc *src;
    uint32_t target;
    const char *src_path;
} conv;

static void on_read(void *ctx, const char *name, bool linear) {
    conv *c = ctx;
    for (int i = c->n - 1; i >= 0; i--) /* a linear layer's weight is read twice when kept as values */
        if (strcmp(c->e[i].name, name) == 0) {
            c->e[i].linear = c->e[i].linear || linear;
            return;
        }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        entry *ne = realloc(c->e, (size_t)cap * sizeof *ne);
        if (!ne) {
            c->oom = true;
            return;
        }
        c->e = ne;
        c->cap = cap;
    }
    if (!(c->e[c->n].name = strdup(name))) {
        c->oom = true;
        return;
    }
    c->e[c->n].linear = linear;
    c->e[c->n++].type = 0;
}

static uint32_t ggml_of(cdf_dtype dt) {
    return dt == CDF_F16 ? CDF_GGML_F16 : dt == CDF_BF16 ? CDF_GGML_BF16 : CDF_GGML_F32;
}

static cdf_dtype dtype_of(uint32_t type) {
    return type == CDF_GGML_F16 ? CDF_F16 : type == CDF_GGML_BF16 ? CDF_BF16 : CDF_F32;
}

/* The type tensor `e` is written in (see convert.h). */
static cdf_status choose_type(conv *c, entry *e, const cdf_wsrc_tensor *t) {
    if (t->qtype < 0 && !cdf_dtype_is_float(t->dtype))
        return cdf_error(CDF_ERR_UNSUPPORTED, "tensor '%s' in %s is %s: not a float tensor, which this GGUF conversion cannot write",
                         e->name, c->src_path, cdf_dtype_name(t->dtype));
    int64_t be = 1;
    cdf_ggml_type_block(c->target, &be, NULL);
    /* stored dtype kept: F32/F16/BF16 as they are, GGUF blocks and fp8 values as F32 */
    const uint32_t keep = t->qtype >= 0 ? CDF_GGML_F32 : ggml_of(t->dtype);
    switch (c->target) {
    case CDF_GGML_F32: e->type = CDF_GGML_F32; break;
    case CDF_GGML_BF16: e->type = t->ndim >= 2 ? CDF_GGML_BF16 : CDF_GGML_F32; break;
    default: e->type = e->linear && t->ndim == 2 && t->shape[1] % be == 0 ? c->target : keep; break;
    }
    return CDF_OK;
}

/* The writer asks for tensor i's bytes. */
static cdf_status fill(void *ctx, int i, void *buf, uint64_t nbytes) {
    conv *c = ctx;
    const entry *e = &c->e[i];
    cdf_wsrc_tensor t;
    if (!cdf_wsrc_find(c->src, e->name, &t))
        return cdf_error(CDF_ERR_FORMAT, "tensor '%s' disappeared from %s", e->name, c->src_path);
    int64_t n = 1;
    for (int d = 0; d < t.ndim; d++) n *= t.shape[d];
    cdf_status s = CDF_OK;
    if (t.qtype >= 0 && (uint32_t)t.qtype == e->type) { /* already in the target blocks: copy them */
        int64_t row_bytes = 0;
        const void *blocks = cdf_wsrc_load_blocks(c->src, &t, e->name, &row_bytes);
        if (!blocks) s = cdf_last_status();
        else if ((uint64_t)(row_bytes * t.shape[0]) != nbytes)
            s = cdf_error(CDF_ERR_FORMAT, "tensor '%s': %lld stored bytes, %llu expected", e->name,
                          (long long)(row_bytes * t.shape[0]), (unsigned long long)nbytes);
        else memcpy(buf, blocks, (size_t)nbytes);
        cdf_wsrc_tensor_release(&t);
        return s;
    }
    const void *vals = cdf_wsrc_load(c->src, &t, e->name); /* t.dtype values (f32 if decoded) */
    if (!vals) return cdf_last_status();
    int64_t be = 1;
    cdf_ggml_type_block(e->type, &be, NULL);
    if (be == 1) {
        cdf_convert(buf, dtype_of(e->type), vals, t.dtype, (size_t)n);
    } else {
        float *f32 = t.dtype == CDF_F32 ? NULL : malloc((size_t)n * sizeof *f32 + 1);
        if (t.dtype != CDF_F32 && !f32) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "tensor '%s': no host memory to quantize it", e->name);
        if (s == CDF_OK && f32) cdf_convert(f32, CDF_F32, vals, t.dtype, (size_t)n);
        if (s == CDF_OK) s = cdf_ggml_quantize(e->type, f32 ? f32 : vals, n, buf);
        if (s != CDF_OK) cdf_error_prefix("tensor '%s': ", e->name);
        free(f32);
    }
    cdf_wsrc_tensor_release(&t);
    return s;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A text encoder's part of an all-in-one weights file: by its key, the second one T5 when its
 * config says so (FLUX.1) and CLIP-G otherwise (SD3). */
static const char *text_part(const char *dir, const char *comp) {
    cJSON *cfg = NULL;
    if (cdf_config_load(dir, &cfg) != CDF_OK) {
        cdf_clear_error(); /* the load reports it */
        return NULL;
    }
    const char *cls = cdf_config_class_name(cfg);
    const bool t5 = cls && strcmp(cls, "T5EncoderModel") == 0;
    cJSON_Delete(cfg);
    return cdf_pipe_text_part(comp, t5);
}

/* Checks the parameters, finds the component folder (dir) and lists what its model reads (pass 1),
 * then opens the weights source for pass 2. */
static cdf_status collect(const cdf_convert_params *p, bool gguf, conv *c, char *dir, size_t dir_n, char *class_name,
                          size_t class_n) {
    if (!p || !p->model || !p->model[0] || !p->output || !p->output[0])
        return cdf_error(CDF_ERR_INVALID_ARG, "convert: the model folder and the output path are required");
    if (gguf ? p->type != CDF_GGML_F32 && p->type != CDF_GGML_BF16 && p->type != CDF_GGML_Q8_0 && p->type != CDF_GGML_Q4_K
             : p->type != CDF_GGML_F32 && p->type != CDF_GGML_BF16)
        return cdf_error(CDF_ERR_INVALID_ARG, "convert: type %u (%s) is not one of %s", p->type,
                         cdf_ggml_type_name(p->type) ? cdf_ggml_type_name(p->type) : "unknown",
                         gguf ? "F32, BF16, Q8_0, Q4_K" : "F32, BF16 (a diffusers folder holds no ggml blocks)");
    /* the component's folder: <model>/<component>, or the model folder itself if it is one */
    const char *comp = p->component && p->component[0] ? p->component : "transformer";
    char cfg[4200];
    snprintf(dir, dir_n, "%s/%s", p->model, comp);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (!is_file(cfg)) {
        char own[4200];
        snprintf(own, sizeof own, "%s/config.json", p->model);
        if (!is_dir(p->model)) return cdf_error(CDF_ERR_NOT_FOUND, "model folder '%s' does not exist", p->model);
        if (!is_file(own) || is_dir(dir))
            return cdf_error(CDF_ERR_NOT_FOUND, "'%s' has no component '%s' (no %s)", p->model, comp, cfg);
        snprintf(dir, dir_n, "%s", p->model);
    }
    if (p->weights_file && !is_file(p->weights_file))
        return cdf_error(CDF_ERR_NOT_FOUND, "weights file '%s' does not exist", p->weights_file);

    cdf_status s = cdf_backend_load("cpu");
    cdf_device *cpu = s == CDF_OK ? cdf_device_get("cpu") : NULL;
    if (!cpu) return s != CDF_OK ? s : cdf_error(CDF_ERR_NOT_FOUND, "convert: no cpu device");

    /* pass 1: what the model reads */
    c->target = p->type;
    c->src_path = p->weights_file ? p->weights_file : dir;
    cdf_load_options o = cdf_load_options_default();
    o.device = cpu;
    o.weight_dtype = CDF_F32;
    o.blocks_on_host = true; /* repeated blocks' weights stay in the mapping */
    o.weights_file = p->weights_file;
    o.weights_part = text_part(dir, comp);
    o.on_read = on_read;
    o.on_read_ctx = c;
    cdf_component *model = NULL;
    s = cdf_component_load(dir, &o, &model);
    if (s == CDF_OK) snprintf(class_name, class_n, "%s", cdf_component_class_name(model));
    cdf_component_free(model);
    if (s == CDF_OK && c->oom) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "convert: out of host memory listing the tensors");
    if (s == CDF_OK && c->n == 0) s = cdf_error(CDF_ERR_FORMAT, "convert: the component in '%s' read no tensors", dir);
    if (s == CDF_OK) s = cdf_wsrc_open(p->weights_file ? p->weights_file : dir, p->weights_file != NULL, o.weights_part, &c->src);
    /* pass 2 needs every tensor's type and shape up front */
    for (int i = 0; s == CDF_OK && i < c->n; i++) {
        cdf_wsrc_tensor t;
        if (!cdf_wsrc_find(c->src, c->e[i].name, &t))
            s = cdf_error(CDF_ERR_FORMAT, "tensor '%s' is not in %s", c->e[i].name, c->src_path);
        else s = choose_type(c, &c->e[i], &t);
        if (s != CDF_OK) break;
        c->e[i].ndim = t.ndim;
        memcpy(c->e[i].shape, t.shape, sizeof t.shape);
    }
    return s;
}

static void conv_free(conv *c) {
    cdf_wsrc_close(c->src);
    for (int i = 0; i < c->n; i++) free(c->e[i].name);
    free(c->e);
}

cdf_status cdf_convert_to_gguf(const cdf_convert_params *p, cdf_convert_report *report) {
    if (report) memset(report, 0, sizeof *report);
    conv c = {0};
    char dir[4096], class_name[128] = "";
    cdf_status s = collect(p, true, &c, dir, sizeof dir, class_name, sizeof class_name);
    cdf_gguf_writer *w = NULL;
    if (s == CDF_OK && !(w = cdf_gguf_writer_new(0))) s = cdf_last_status();
    if (s == CDF_OK) {
        const char *arch = strcmp(class_name, "FluxTransformer2DModel") == 0   ? "flux"
                           : strcmp(class_name, "SD3Transformer2DModel") == 0 ? "sd3"
                                                                              : class_name;
        s = cdf_gguf_writer_set_string(w, "general.architecture", arch);
        if (s == CDF_OK) s = cdf_gguf_writer_set_u32(w, "general.quantization_version", 2);
        if (s == CDF_OK) s = cdf_gguf_writer_set_string(w, "cdiffusers.class_name", class_name);
    }
    int quantized = 0;
    for (int i = 0; s == CDF_OK && i < c.n; i++) {
        s = cdf_gguf_writer_add(w, c.e[i].name, c.e[i].type, c.e[i].ndim, c.e[i].shape, NULL);
        int64_t be = 1;
        cdf_ggml_type_block(c.e[i].type, &be, NULL);
        quantized += be > 1;
    }
    if (s == CDF_OK) s = cdf_gguf_writer_save(w, p->output, p->overwrite, fill, &c);
    if (s == CDF_OK && report) {
        report->tensors = c.n;
        report->quantized = quantized;
        report->file_bytes = cdf_gguf_writer_file_size(w);
    }
    cdf_gguf_writer_free(w);
    conv_free(&c);
    return s;
}

/* ---- a diffusers folder ----------------------------------------------------------------------- */

static void remove_tree(const char *dir) { /* the temporary folder: plain files only */
    DIR *d = opendir(dir);
    if (d) {
        char path[8192];
        for (struct dirent *e; (e = readdir(d));) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static cdf_status copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return cdf_error(CDF_ERR_NOT_FOUND, "cannot read '%s': %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return cdf_io_create_error("file", to, errno);
    }
    char buf[65536];
    size_t k;
    bool ok = true;
    while (ok && (k = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, k, out) == k;
    ok = ok && !ferror(in);
    int err = errno;
    fclose(in);
    if (fclose(out) != 0) ok = false;
    return ok ? CDF_OK : cdf_error(CDF_ERR_IO, "writing '%s' failed: %s", to, strerror(err ? err : EIO));
}

cdf_status cdf_convert_to_diffusers(const cdf_convert_params *p, cdf_convert_report *report) {
    if (report) memset(report, 0, sizeof *report);
    conv c = {0};
    char dir[4096], class_name[128] = "";
    cdf_status s = collect(p, false, &c, dir, sizeof dir, class_name, sizeof class_name);
    if (s != CDF_OK) {
        conv_free(&c);
        return s;
    }
    /* the folder is built as "<output>.tmp.XXXXXX" next to the output and renamed into place */
    char out[4096], tmp[4200];
    snprintf(out, sizeof out, "%s", p->output);
    for (size_t k = strlen(out); k > 1 && out[k - 1] == '/'; k--) out[k - 1] = 0;
    struct stat st;
    if (stat(out, &st) == 0) {
        conv_free(&c);
        return cdf_error(CDF_ERR_IO, "output folder '%s' already exists (convert does not replace folders)", out);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", out);
    if (!mkdtemp(tmp)) {
        s = cdf_io_create_error("folder", out, errno);
        conv_free(&c);
        return s;
    }
    char path[8400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char to[8400];
    snprintf(to, sizeof to, "%s/config.json", tmp);
    s = copy_file(path, to);
    /* transformers' classes name their weights model*.safetensors, diffusers' diffusion_pytorch_model* */
    const bool hf = strncmp(class_name, "CLIP", 4) == 0 || strncmp(class_name, "T5", 2) == 0 || strncmp(class_name, "Mistral", 7) == 0;
    const char *base = hf ? "model" : "diffusion_pytorch_model";
    const uint64_t max_shard = p->max_shard_bytes ? p->max_shard_bytes : (4ull << 30);
    /* shards: consecutive tensors (in read order) up to max_shard bytes each */
    int *shard = calloc((size_t)c.n + 1, sizeof *shard);
    if (!shard && s == CDF_OK) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "convert: out of host memory");
    int n_shards = 0;
    uint64_t cur = 0, total = 0;
    for (int i = 0; s == CDF_OK && i < c.n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < c.e[i].ndim; d++) numel *= c.e[i].shape[d];
        const uint64_t b = (uint64_t)numel * cdf_dtype_size(dtype_of(c.e[i].type));
        if (n_shards == 0 || (cur > 0 && cur + b > max_shard)) n_shards++, cur = 0;
        cur += b;
        total += b;
        shard[i] = n_shards - 1;
    }
    cJSON *index = n_shards > 1 ? cJSON_CreateObject() : NULL, *map = NULL;
    if (index) {
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        map = cJSON_AddObjectToObject(index, "weight_map");
    }
    for (int sh = 0, i = 0; s == CDF_OK && sh < n_shards; sh++) {
        char name[256];
        if (n_shards == 1) snprintf(name, sizeof name, "%s.safetensors", base);
        else snprintf(name, sizeof name, "%s-%05d-of-%05d.safetensors", base, sh + 1, n_shards);
        cdf_st_writer *w = cdf_st_writer_new();
        if (!w) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "convert: out of host memory");
        for (; s == CDF_OK && i < c.n && shard[i] == sh; i++) {
            int64_t numel = 1;
            for (int d = 0; d < c.e[i].ndim; d++) numel *= c.e[i].shape[d];
            const uint64_t b = (uint64_t)numel * cdf_dtype_size(dtype_of(c.e[i].type));
            void *buf = malloc((size_t)b + 1);
            s = buf ? fill(&c, i, buf, b) : cdf_error(CDF_ERR_OUT_OF_MEMORY, "convert: no host memory for '%s'", c.e[i].name);
            if (s == CDF_OK) s = cdf_st_writer_add(w, c.e[i].name, dtype_of(c.e[i].type), c.e[i].ndim, c.e[i].shape, buf);
            free(buf);
            if (map) cJSON_AddStringToObject(map, c.e[i].name, name);
        }
        snprintf(to, sizeof to, "%s/%s", tmp, name);
        if (s == CDF_OK) s = cdf_st_writer_save(w, to);
        cdf_st_writer_free(w);
    }
    if (s == CDF_OK && index) {
        char *json = cJSON_Print(index);
        snprintf(to, sizeof to, "%s/%s.safetensors.index.json", tmp, base);
        FILE *f = json ? fopen(to, "wb") : NULL;
        bool ok = f && fputs(json, f) >= 0;
        if (f && fclose(f) != 0) ok = false;
        if (!ok) s = json ? cdf_error(CDF_ERR_IO, "writing '%s' failed: %s", to, strerror(errno))
                          : cdf_error(CDF_ERR_OUT_OF_MEMORY, "convert: out of host memory");
        free(json);
    }
    cJSON_Delete(index);
    free(shard);
    if (s == CDF_OK && rename(tmp, out) != 0)
        s = cdf_error(CDF_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, out, strerror(errno));
    if (s != CDF_OK) remove_tree(tmp);
    if (s == CDF_OK && report) {
        report->tensors = c.n;
        report->file_bytes = total;
    }
    conv_free(&c);
    return s;
}
