/* The list of model classes and the generic component loader. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "cdiffusers/exec.h"
#include "compile/compile.h"
#include "models/component_impl.h"
#include "nn/lora.h"

/* Strong references: they also make a static link pull every model's object file in. */
extern const cdf_component_class cdf_clip_text_class;
extern const cdf_component_class cdf_t5_encoder_class;
extern const cdf_component_class cdf_flux_transformer_class;
extern const cdf_component_class cdf_sd3_transformer_class;
extern const cdf_component_class cdf_autoencoder_kl_class;
extern const cdf_component_class cdf_flux2_transformer_class;
extern const cdf_component_class cdf_autoencoder_kl_flux2_class;
extern const cdf_component_class cdf_mistral3_text_class;

static const cdf_component_class *const *classes(int *n) {
    static const cdf_component_class *list[16];
    static int count = -1;
    if (count < 0) {
        int k = 0;
        const cdf_component_class *all[] = {
            &cdf_clip_text_class, &cdf_t5_encoder_class, &cdf_flux_transformer_class, &cdf_sd3_transformer_class,
            &cdf_autoencoder_kl_class,
            &cdf_flux2_transformer_class,
            &cdf_autoencoder_kl_flux2_class,
            &cdf_mistral3_text_class,
        };
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i]) list[k++] = all[i];
        count = k;
    }
    *n = count;
    return list;
}


cdf_status cdf_component_load(const char *dir, const cdf_load_options *opt, cdf_component **out) {
    *out = NULL;
    cJSON *cfg = NULL;
    cdf_status s = cdf_config_load(dir, &cfg);
    if (s != CDF_OK) return s;
    const char *name = cdf_config_class_name(cfg);
    if (!name) {
        cJSON_Delete(cfg);
        return cdf_error(CDF_ERR_FORMAT, "%s/config.json names no model class (_class_name or architectures)", dir);
    }
    int n;
    const cdf_component_class *const *list = classes(&n);
    const cdf_component_class *cls = NULL;
    char known[1024] = "";
    for (int i = 0; i < n && !cls; i++) {
        for (const char *const *nm = list[i]->names; *nm; nm++) {
            if (strcmp(*nm, name) == 0) cls = list[i];
            strncat(known, known[0] ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, *nm, sizeof known - strlen(known) - 1);
        }
    }
    if (!cls) {
        cdf_status e = cdf_error(CDF_ERR_UNSUPPORTED, "%s: model class '%s' is not supported (supported: %s)", dir, name,
                                 known[0] ? known : "none in this build");
        cJSON_Delete(cfg);
        return e;
    }
    cdf_component *c = calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(cfg);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    snprintf(c->class_name, sizeof c->class_name, "%s", name);
    c->cls = cls;
    c->reapply = cdf_component_lora_replay;
    c->cfg = cfg;
    c->layers = cdf_layer_index_new();
    cdf_load_options o = opt ? *opt : cdf_load_options_default();
    o.layers = c->layers;
    c->load_opt = o;
    c->load_opt.layers = NULL;
    c->load_opt.report = NULL;
    c->load_opt.blocks_on_host = false; /* a fused layer is never host-side (refused) */
    c->dir = strdup(dir);
    c->weights_file = o.weights_file ? strdup(o.weights_file) : NULL;
    c->load_opt.weights_file = c->weights_file;
    s = !c->layers || !c->dir || (o.weights_file && !c->weights_file) ? cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory")
                                                                     : cls->load(dir, cfg, &o, &c->impl);
    if (s != CDF_OK) {
        cdf_error_prefix("loading %s from %s: ", name, dir);
        cdf_layer_index_free(c->layers);
        cJSON_Delete(cfg);
        free(c->dir);
        free(c->weights_file);
        free(c);
        return s;
    }
    if ((s = cdf_component_apply_env_compile(c)) != CDF_OK) {
        cdf_component_free(c);
        return s;
    }
    *out = c;
    return CDF_OK;
}

cdf_status cdf_component_run(cdf_component *c, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    if (!c) return cdf_error(CDF_ERR_INVALID_ARG, "component is NULL");
    cdf_scope_push();
    cdf_block_caches *prev = c->blocks ? cdf_block_caches_activate(c->blocks) : NULL;
    cdf_status s = c->compiled ? cdf_component_run_compiled(c, method ? method : "forward", in, out)
                               : c->cls->run(c->impl, method ? method : "forward", in, out);
    if (c->blocks) cdf_block_caches_activate(prev);
    cdf_scope_pop(NULL, 0); /* outputs live on through the references `out` holds */
    /* the end of a forward is a sync point for defer-and-fuse: by now every intermediate is
     * released, so the pending graph fuses as much as it can */
    cdf_status f = cdf_exec_flush();
    return s != CDF_OK ? s : f;
}

void cdf_component_free(cdf_component *c) {
    if (!c) return;
    cdf_component_drop_graphs(c);
    c->cls->free(c->impl); /* frees the layers' LoRA links, then the scales they point at */
    cdf_layer_index_free(c->layers);
    cdf_lora_scales_free(c->lora_scales);
    cdf_lora_log_free(c->lora_fused);
    cdf_lora_log_free(c->lora_runtime);
    cJSON_Delete(c->cfg);
    free(c->dir);
    free(c->weights_file);
    free(c);
}

cdf_layer_index *cdf_component_layers(cdf_component *c) { return c ? c->layers : NULL; }

cdf_lora_scales *cdf_component_lora_scales(cdf_component *c, bool create) {
    if (c && !c->lora_scales && create) {
        cdf_device *dev = NULL;
        for (int i = 0; !dev && i < cdf_layer_index_count(c->layers); i++) {
            cdf_linear_layer *l = cdf_layer_index_at(c->layers, i, NULL);
            if (l && l->w) dev = cdf_tensor_device(l->w);
        }
        if (!dev) dev = cdf_device_default();
        c->lora_scales = dev ? cdf_lora_scales_new(dev) : NULL;
    }
    return c ? c->lora_scales : NULL;
}

void cdf_component_weights_changed(cdf_component *c) {
    if (!c) return;
    if (c->compiled) cdf_component_drop_graphs(c);
    cdf_block_caches_clear(c->blocks);
}

void cdf_component_lora_reset(cdf_component *c) {
    if (!c) return;
    cdf_component_weights_changed(c);
    for (int i = 0; i < cdf_layer_index_count(c->layers); i++) cdf_lora_detach(cdf_layer_index_at(c->layers, i, NULL));
    cdf_lora_scales_free(c->lora_scales);
    c->lora_scales = NULL;
    cdf_lora_log_free(c->lora_runtime);
    c->lora_runtime = NULL;
}

cdf_lora_log **cdf_component_lora_log(cdf_component *c, bool fused) {
    return c ? (fused ? &c->lora_fused : &c->lora_runtime) : NULL;
}

static cdf_status restore_weight(void *w, cdf_linear_layer *l, const char *layer) {
    return cdf_linear_reload_weight(w, l, layer);
}

cdf_status cdf_component_lora_unfuse(cdf_component *c) {
    if (!c || !c->lora_fused) return CDF_OK;
    if (!cdf_component_is_loaded(c)) { /* released: the next load reads the original weights */
        cdf_lora_log_free(c->lora_fused);
        c->lora_fused = NULL;
        return CDF_OK;
    }
    cdf_component_weights_changed(c);
    /* exact: every fused layer's weight is read again from the files the model was loaded from
     * (a tensor-parallel shard reads only its slice); subtracting the deltas (up to one rounding)
     * only where that fails */
    cdf_weights *w = NULL;
    if (cdf_weights_open(c->dir, &c->load_opt, &w) != CDF_OK) {
        fprintf(stderr, "cdiffusers: warning: LoRA unfuse: %s\n", cdf_last_error());
        w = NULL;
    }
    cdf_status s = cdf_lora_log_unfuse(&c->lora_fused, c->layers, w ? restore_weight : NULL, w);
    cdf_weights_free(w);
    return s;
}

cdf_status cdf_component_lora_replay(cdf_component *c) {
    if (!c) return CDF_OK;
    CDF_TRY(cdf_lora_log_replay(c->lora_fused, c->layers, NULL));
    if (c->lora_runtime) {
        cdf_lora_scales *sc = cdf_component_lora_scales(c, true);
        if (!sc) return cdf_last_status();
        CDF_TRY(cdf_lora_log_replay(c->lora_runtime, c->layers, sc));
    }
    return CDF_OK;
}

const char *cdf_component_class_name(const cdf_component *c) { return c ? c->class_name : NULL; }
const struct cJSON *cdf_component_config(const cdf_component *c) { return c ? c->cfg : NULL; }
