/* Pipeline-level model offload and per-phase device memory.
 *
 * Every component of a loaded pipeline is made offloadable (models/component_offload.c) with a
 * hook that runs before each of its forwards. The hook knows the phase the component belongs to
 * (text encoders: text encoding, transformer: denoising, VAE: decode) and:
 *   - with CDF_OFFLOAD_MODEL, when a different model is about to run, waits for the device,
 *     releases every other resident model, then lets the wrapper re-materialise this one
 *     (diffusers' enable_model_cpu_offload: text encoders, then the transformer for the whole
 *     loop, then the VAE; the peak is the largest model plus its activations);
 *   - in both modes, at each phase change, records the device peak of the phase that ended and
 *     restarts the peak counter, so cdf_pipeline_last_memory_stats reports a peak per phase.
 * Between generations nothing runs, so with CDF_OFFLOAD_MODEL every model is released at the end
 * of cdf_pipeline_generate (diffusers' maybe_free_model_hooks).
 *
 * Prefetch: at a phase change (the last text encoder -> the transformer, the transformer's last
 * step -> the VAE) the host reaches the next model's hook as soon as the previous model's last
 * forward is queued, while the device still computes it (for the VAE earlier still: the
 * denoising loop calls p->last_forward_queued once the last step's forward is queued, before
 * a progress callback waits for the step). Materialising the next model there,
 * before waiting for the device and releasing the previous one, overlaps its conversion and
 * upload with that compute; its weights then meet the previous model's at its last forward's
 * peak. So it is done only when the planner's peak for that (cdf_memory_plan.phase[]
 * .prefetch_peak_bytes, computed per request by cdf_pipe_prefetch_resolve) fits the budget left:
 * the device's limit (its memory without one; unknown memory: never) less the bytes in use when
 * generate began. Otherwise the order and the peak are diffusers' enable_model_cpu_offload's, as
 * without prefetch. The same bytes are converted the same way either way, so outputs are
 * bit-identical; CDIFFUSERS_OFFLOAD_PREFETCH=0 turns it off. Switches inside the text phase
 * (CLIP -> T5) are not prefetched: the planner's phase peak has no place for two text encoders.
 *
 * CDF_OFFLOAD_SEQUENTIAL is MODEL for every component, and the transformer is loaded with its
 * repeated blocks' weights host-side (cdf_load_options.blocks_on_host): materialising it puts
 * only its other weights (embedders, final norm and projection) on the device, and each block
 * call materialises its own weights (compile/compile.c, cdf_block_run). A transformer compiled
 * whole switches to repeated-block compile meanwhile (a whole-forward graph would hold every
 * block's weights). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error_internal.h"
#include "models/component_impl.h"
#include "nn/lora.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

static cdf_component **components(cdf_pipeline *p, int *n) {
    static _Thread_local cdf_component *list[CDF_PIPE_MAX_TEXT + 2];
    int k = 0;
    for (int i = 0; i < CDF_PIPE_MAX_TEXT; i++)
        if (p->text_encoder[i]) list[k++] = p->text_encoder[i];
    if (p->transformer) list[k++] = p->transformer;
    if (p->vae) list[k++] = p->vae;
    *n = k;
    return list;
}

static int phase_of(const cdf_pipeline *p, const cdf_component *c) {
    if (c == p->transformer) return CDF_PHASE_DENOISE;
    if (c == p->vae) return CDF_PHASE_DECODE;
    return CDF_PHASE_TEXT;
}

const char *cdf_pipeline_phase_name(cdf_pipeline_phase ph) {
    switch (ph) {
    case CDF_PHASE_TEXT: return "text encoding";
    case CDF_PHASE_DENOISE: return "denoising";
    case CDF_PHASE_DECODE: return "VAE decode";
    default: return "?";
    }
}

static void record_phase_peak(cdf_pipeline *p) {
    cdf_memory_stats st;
    cdf_device_memory_stats(p->device, &st);
    if (p->phase >= 0 && p->phase < CDF_PHASE_COUNT && st.peak_bytes > p->mem.phase_peak_bytes[p->phase])
        p->mem.phase_peak_bytes[p->phase] = st.peak_bytes;
}

static void apply_phase_limit(cdf_pipeline *p) {
    if (!p->phase_limit_active) return;
    uint64_t lim = p->phase_limit[p->phase];
    (void)cdf_device_set_memory_limit(p->device, lim ? lim : p->saved_limit);
}

static cdf_status release_others(cdf_pipeline *p, const cdf_component *keep) {
    int n;
    cdf_component **list = components(p, &n);
    for (int i = 0; i < n; i++)
        if (list[i] != keep && cdf_component_is_loaded(list[i])) CDF_TRY(cdf_component_offload(list[i]));
    return CDF_OK;
}

/* CDIFFUSERS_LOG=offload: each phase change's materialisation and wait, timed (stderr) */
static bool offload_log(void) {
    const char *v = getenv("CDIFFUSERS_LOG");
    return v && strstr(v, "offload");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The budget left to this generate now: the limit in force (a phase's own in the tests), else
 * the device's memory; less what was in use when generate began. 0: unknown (no prefetch). */
static uint64_t budget_left(const cdf_pipeline *p) {
    cdf_memory_stats st;
    cdf_device_memory_stats(p->device, &st);
    uint64_t lim = st.limit_bytes;
    if (!lim) {
        cdf_device_info info;
        if (cdf_device_get_info(p->device, &info) != CDF_OK) {
            cdf_clear_error();
            return 0;
        }
        lim = info.memory_bytes;
    }
    return lim > p->base_bytes ? lim - p->base_bytes : 0;
}

/* Whether the phase ending now may materialise the next model before its work has finished. */
static bool prefetch_fits(const cdf_pipeline *p) {
    if (p->phase < 0 || p->phase >= CDF_PHASE_COUNT) return false;
    const uint64_t need = p->prefetch_peak[p->phase];
    return need && need <= budget_left(p);
}

/* Materialise c before the previous model's queued work is waited for. The device limit is
 * lowered to the planned prefetch peak (+10%) meanwhile (when that is below it, or there is none): the
 * host may be ahead of the device, so more of the last forward's outputs can be allocated than
 * its peak needs; the allocator then lets the queue run until c's weights fit, and the phase's
 * peak stays the plan's whatever the budget (and, without one, within the device's memory).
 * What the plan leaves out (a loader's compiled temporaries on pjrt, which are refused rather
 * than waited for) can still run out of memory there: then c is materialised as without
 * prefetch, after the wait. */
static cdf_status prefetch(cdf_pipeline *p, cdf_component *c) {
    /* the phase's peak so far is kept; the counter then measures the prefetch's own window */
    record_phase_peak(p);
    cdf_device_reset_peak(p->device);
    cdf_memory_stats st;
    cdf_device_memory_stats(p->device, &st);
    /* the plan's tolerance (10%) above its peak: what the pipeline holds by the switch is planned
     * from formulas (planner.c plan_held), and a prefetch must not be refused for their error */
    const uint64_t pk = p->prefetch_peak[p->phase], cap = p->base_bytes + pk + pk / 10;
    const bool capped = !st.limit_bytes || cap < st.limit_bytes;
    if (capped) (void)cdf_device_set_memory_limit(p->device, cap);
    const cdf_status s = cdf_component_ensure_loaded(c);
    if (capped) (void)cdf_device_set_memory_limit(p->device, st.limit_bytes);
    if (s == CDF_ERR_OUT_OF_MEMORY) {
        cdf_clear_error();
        return CDF_OK;
    }
    CDF_TRY(s);
    cdf_memory_stats after;
    cdf_device_memory_stats(p->device, &after);
    p->mem.prefetches++;
    p->mem.prefetch_peak_bytes[p->phase] = after.peak_bytes;
    return CDF_OK;
}

static double g_prefetch_s; /* CDIFFUSERS_LOG=offload: the last prefetch's materialisation time */

static cdf_status prefetch_timed(cdf_pipeline *p, cdf_component *c) {
    const double t0 = now_s();
    const cdf_status s = prefetch(p, c);
    g_prefetch_s = now_s() - t0;
    return s;
}

/* pipeline_impl.h's last_forward_queued: the VAE's prefetch within the last denoising step */
static cdf_status prefetch_decoder(cdf_pipeline *p) {
    if (!p->tracking || p->offload == CDF_OFFLOAD_NONE || p->phase != CDF_PHASE_DENOISE || !p->vae ||
        cdf_component_is_loaded(p->vae) || !prefetch_fits(p))
        return CDF_OK;
    return prefetch_timed(p, p->vae);
}

static cdf_status before_run(cdf_component *c, void *user) {
    cdf_pipeline *p = user;
    const bool model = p->offload != CDF_OFFLOAD_NONE;
    if (!p->tracking) /* a component run outside generate: only the offload policy applies */
        return model && !cdf_component_is_loaded(c) ? release_others(p, c) : CDF_OK;
    if (c == p->active) return CDF_OK; /* the same model again (every denoising step) */
    const int ph = phase_of(p, c);
    const bool switching_phase = ph != p->phase;
    if (!model && !switching_phase) {
        p->active = c;
        return CDF_OK;
    }
    const bool log = model && switching_phase && offload_log();
    const double t0 = log ? now_s() : 0;
    /* prefetch: materialise c while the previous model's queued work still runs (see the top) */
    const bool was_loaded = cdf_component_is_loaded(c); /* prefetched already (prefetch_decoder) */
    const bool early = model && switching_phase && !was_loaded && prefetch_fits(p);
    if (early) CDF_TRY(prefetch_timed(p, c));
    const double t1 = log ? now_s() : 0;
    /* the previous model's queued work must finish before its memory (or the phase's peak)
     * can be accounted; a queued kernel's error surfaces here, as at any sync */
    CDF_TRY(cdf_device_synchronize(p->device));
    const double t2 = log ? now_s() : 0;
    record_phase_peak(p);
    if (model) CDF_TRY(release_others(p, c));
    const int from = p->phase;
    p->active = c;
    p->phase = ph;
    apply_phase_limit(p);
    cdf_device_reset_peak(p->device);
    if (!log) return CDF_OK;
    /* what the run does next anyway (the wrapper materialises c after this hook), here to time it */
    const bool late = !cdf_component_is_loaded(c);
    CDF_TRY(cdf_component_ensure_loaded(c));
    const double t3 = now_s();
    fprintf(stderr, "cdiffusers: offload: %s -> %s: %s materialised in %.3f s %s; waited %.3f s for the device; %.3f s in all\n",
            cdf_pipeline_phase_name((cdf_pipeline_phase)from), cdf_pipeline_phase_name((cdf_pipeline_phase)ph), cdf_component_class_name(c),
            late ? t3 - t2 : g_prefetch_s,
            late ? (early ? "after the wait (the prefetch ran out of memory)" : "after the wait")
                 : was_loaded ? "during the last step (prefetch)" : "before the wait (prefetch)",
            t2 - t1, t3 - t0);
    return CDF_OK;
}

cdf_load_options cdf_pipe_load_options(const cdf_pipeline *p, const char *key) {
    cdf_load_options o = p->opt;
    o.blocks_on_host = p->offload == CDF_OFFLOAD_SEQUENTIAL && key && strcmp(key, "transformer") == 0;
    for (int i = 0; key && i < p->n_files; i++)
        if (strcmp(p->file_key[i], key) == 0) o.weights_file = p->file_path[i];
    if (o.weights_file) o.weights_part = cdf_pipe_text_part(key, p->kind == CDF_PIPE_FLUX);
    o.report = (cdf_weights_report *)&p->report;
    return o;
}

cdf_status cdf_pipe_offload_adopt(cdf_pipeline *p, cdf_component *c, const char *dir, const char *key) {
    const cdf_load_options o = cdf_pipe_load_options(p, key);
    CDF_TRY(cdf_component_enable_offload(c, dir, &o, before_run, p));
    if (o.blocks_on_host) CDF_TRY(cdf_component_set_blocks_on_host(c, true)); /* whole compile -> blocks */
    /* loading with offload keeps one model at a time on the device, the load included */
    if (p->offload != CDF_OFFLOAD_NONE) CDF_TRY(cdf_component_offload(c));
    return CDF_OK;
}

static int total_loads(cdf_pipeline *p) {
    int n, t = 0;
    cdf_component **list = components(p, &n);
    for (int i = 0; i < n; i++) t += cdf_component_load_count(list[i]);
    return t;
}

void cdf_pipe_generate_begin(cdf_pipeline *p) {
    memset(&p->mem, 0, sizeof p->mem);
    p->tracking = true;
    p->active = NULL;
    p->phase = CDF_PHASE_TEXT;
    p->loads_at_start = total_loads(p);
    memset(p->prefetch_peak, 0, sizeof p->prefetch_peak);
    p->last_forward_queued = prefetch_decoder;
    cdf_memory_stats st;
    cdf_device_memory_stats(p->device, &st);
    p->saved_limit = st.limit_bytes;
    p->base_bytes = st.current_bytes;
    apply_phase_limit(p);
    cdf_device_reset_peak(p->device);
}

void cdf_pipe_prefetch_resolve(cdf_pipeline *p, const cdf_generate_params *gp) {
    memset(p->prefetch_peak, 0, sizeof p->prefetch_peak);
    cdf_device_info info;
    const bool host_memory = cdf_device_get_info(p->device, &info) == CDF_OK && info.host_visible;
    if (p->offload == CDF_OFFLOAD_NONE || !cdf_plan_prefetch_enabled(host_memory)) return;
    /* planning reads every component's headers and measures its forward (~0.1 s for SD3.5-sized
     * folders): once per request shape, not per image. The fields the plan depends on: */
    char key[sizeof p->prefetch_key];
    snprintf(key, sizeof key, "%d %d %dx%d %d %.17g %.17g %d %d %d %d %s", (int)p->offload, p->transformer && p->transformer->blocks,
             gp->width, gp->height, gp->max_sequence_length, gp->guidance_scale, gp->true_cfg_scale, gp->negative_prompt != NULL,
             gp->vae_tiling, gp->vae_tile_size, (int)p->opt.weight_dtype, gp->cache ? gp->cache : "");
    if (strcmp(key, p->prefetch_key) == 0) {
        memcpy(p->prefetch_peak, p->prefetch_key_peak, sizeof p->prefetch_peak);
        return;
    }
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.device = cdf_device_name(p->device); /* pjrt: buffers freed at release, compiled temporaries */
    lp.weight_dtype = p->opt.weight_dtype;
    lp.offload = p->offload;
    lp.quantize_weights = p->opt.quantize_to;
    lp.decode_quantized = p->opt.decode_quantized;
    cdf_component_file files[8];
    for (int i = 0; i < p->n_files && i < 8; i++) files[i] = (cdf_component_file){p->file_key[i], p->file_path[i]};
    lp.component_files = files;
    lp.num_component_files = p->n_files < 8 ? p->n_files : 8;
    /* the transformer's blocks compiled (or switched to blocks by sequential offload): their
     * arenas, not the eager forward's live set */
    const cdf_plan_execution exec = p->transformer && p->transformer->blocks ? CDF_PLAN_REPEATED_BLOCKS : CDF_PLAN_EAGER;
    cdf_memory_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return; /* no prefetch: the run itself is unaffected */
    if (cdf_pipeline_plan_memory_exec(p->dir, &lp, gp, exec, plan) == CDF_OK) {
        for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) p->prefetch_peak[ph] = plan->phase[ph].prefetch_peak_bytes;
        memcpy(p->prefetch_key, key, sizeof key);
        memcpy(p->prefetch_key_peak, p->prefetch_peak, sizeof p->prefetch_peak);
    } else {
        cdf_clear_error(); /* a folder the planner cannot read: offload as without prefetch */
    }
    free(plan);
}

cdf_status cdf_pipe_generate_end(cdf_pipeline *p, cdf_status s) {
    /* the caller synchronised the device: the last phase's peak is complete */
    record_phase_peak(p);
    for (int i = 0; i < CDF_PHASE_COUNT; i++)
        if (p->mem.phase_peak_bytes[i] > p->mem.peak_bytes) p->mem.peak_bytes = p->mem.phase_peak_bytes[i];
    p->mem.materialisations = total_loads(p) - p->loads_at_start;
    p->tracking = false;
    p->active = NULL;
    if (p->phase_limit_active) (void)cdf_device_set_memory_limit(p->device, p->saved_limit);
    if (p->offload != CDF_OFFLOAD_NONE) {
        cdf_status r = release_others(p, NULL);
        if (s == CDF_OK) s = r;
    }
    return s;
}

void cdf_pipeline_last_memory_stats(const cdf_pipeline *p, cdf_pipeline_memory_stats *out) {
    memset(out, 0, sizeof *out);
    if (p) *out = p->mem;
}

cdf_offload_mode cdf_pipeline_offload_mode(const cdf_pipeline *p) { return p ? p->offload : CDF_OFFLOAD_NONE; }

cdf_status cdf_pipeline_set_offload(cdf_pipeline *p, cdf_offload_mode mode) {
    if (!p) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_set_offload: pipeline is NULL");
    if (mode != CDF_OFFLOAD_NONE && mode != CDF_OFFLOAD_MODEL && mode != CDF_OFFLOAD_SEQUENTIAL)
        return cdf_error(CDF_ERR_INVALID_ARG, "unknown offload mode %d (none = 0, model = 1, sequential = 2)", (int)mode);
    if (p->tracking) return cdf_error(CDF_ERR_INVALID_ARG, "cannot change the offload mode during generate");
    /* run-time adapters and fused ones are logged on their components and re-applied whenever a
     * model is materialised again (pipelines/lora.c); fusing into host-side block weights is not
     * done */
    if (mode == CDF_OFFLOAD_SEQUENTIAL && p->transformer && cdf_lora_log_count(*cdf_component_lora_log(p->transformer, true)))
        return cdf_error(CDF_ERR_UNSUPPORTED, "sequential offload with a LoRA adapter fused into the transformer is not "
                         "supported (its block weights stay host-side); unload it or load it in run-time mode");
    p->offload = mode;
    /* the transformer's blocks: host-side with SEQUENTIAL (this releases it if that changes) */
    if (p->transformer) CDF_TRY(cdf_component_set_blocks_on_host(p->transformer, mode == CDF_OFFLOAD_SEQUENTIAL));
    if (mode != CDF_OFFLOAD_NONE) return release_others(p, NULL);
    /* back to everything resident (pipe.to(device)): materialise what is released */
    int n;
    cdf_component **list = components(p, &n);
    for (int i = 0; i < n; i++) CDF_TRY(cdf_component_ensure_loaded(list[i]));
    return CDF_OK;
}

cdf_status cdf_pipeline_enable_model_cpu_offload(cdf_pipeline *p) { return cdf_pipeline_set_offload(p, CDF_OFFLOAD_MODEL); }

cdf_status cdf_pipeline_enable_sequential_cpu_offload(cdf_pipeline *p) { return cdf_pipeline_set_offload(p, CDF_OFFLOAD_SEQUENTIAL); }
