/* `cdiffusers serve`: an HTTP server that keeps one pipeline loaded and answers the image APIs
 * clients already speak (OpenAI images, AUTOMATIC1111's sdapi) plus an asynchronous job API.
 *
 * Threads: libmicrohttpd runs one thread per connection (the handlers below); one worker
 * thread owns the pipeline (loads it, compiles it, generates); the main thread waits for
 * SIGTERM/SIGINT. Requests become jobs in one FIFO queue (bounded: 429 when full); a handler of
 * a synchronous request waits for its job while watching its socket, and cancels the job when
 * the client goes away. The worker's step callback reports progress and is where a job is
 * cancelled (DELETE, a gone client, shutdown): between two denoising steps. Request bodies are
 * parsed and checked by cli/serve_parse.c, then by the pipeline's own checks
 * (cdf_pipeline_validate) before anything is queued. No path from a request reaches the file
 * system. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "common.h"
#include "core/error_internal.h"
#include "plan.h"
#include "serve_parse.h"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

#define JOBS_KEPT 64 /* finished asynchronous jobs kept for GET /v1/jobs/{id} (oldest dropped) */

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED } job_state;
static const char *const k_state_names[] = {"queued", "running", "succeeded", "failed", "cancelled"};

typedef struct job {
    char id[40];
    uint64_t seq, finished_seq; /* arrival and completion order (1-based) */
    int refs;                   /* under server.mu: queue/worker, waiting handler, job table */
    bool async, cancel;
    job_state state;
    serve_request req;
    cdf_generate_params gp; /* resolved at acceptance; points into req and the server's defaults */
    uint64_t seed;          /* image i uses seed + i */
    int step, image;        /* progress: step of image `image` (0-based) */
    int http_status;        /* of a failed job */
    char error[1024];
    double created, started, finished; /* unix seconds */
    char **b64;             /* n base64 PNGs when done */
    char **infotext;        /* n PNG "parameters" texts */
    cdf_png_image image_png, mask_png; /* img2img: the decoded request PNGs, behind gp.image/mask_image */
    cdf_image in_image, in_mask;
    struct job *qnext, *tnext;
} job;

typedef struct server {
    pthread_mutex_t mu;
    pthread_cond_t work, done; /* worker wake-up; a job changed (broadcast) */
    job *qhead, *qtail, *running, *table;
    int qlen, qmax, kept;
    bool stopping;
    uint64_t next_seq, finished, served, cancelled, failed;
    double step_seconds; /* running mean of a denoising step, for ETAs */
    /* load-time settings */
    const char *model, *dtype, *model_name, *api_key;
    cdf_pipeline_load_params lp;
    int mode;
    bool blocks;
    long threads;
    int64_t device_memory;
    const char *device; /* --device NAME (NULL: the default device) */
    const char *cache;  /* --cache: the step cache of requests that name none */
    size_t max_body;
    cdf_cli_model_defaults defaults;
    /* the worker's load result */
    cdf_pipeline *pipe;
    bool loaded;
    cdf_status load_status;
    char load_error[1024];
} server;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- jobs (all under srv->mu) ------------------------------------------------------------- */
/* noinline: inlined twice into one caller, GCC cannot see that the first call leaves a reference
 * and warns of a use after free */
__attribute__((noinline)) static void job_unref(job *j) {
    if (!j || --j->refs > 0) return;
    for (int i = 0; j->b64 && i < j->req.n; i++) free(j->b64[i]);
    for (int i = 0; j->infotext && i < j->req.n; i++) free(j->infotext[i]);
    free(j->b64);
    free(j->infotext);
    cdf_png_image_free(&j->image_png);
    cdf_png_image_free(&j->mask_png);
    serve_request_free(&j->req);
    free(j);
}

static bool job_terminal(const job *j) { return j->state >= JOB_DONE; }

static void queue_remove(server *srv, job *j) {
    for (job **p = &srv->qhead; *p; p = &(*p)->qnext) {
        if (*p != j) continue;
        *p = j->qnext;
        if (srv->qtail == j) {
            srv->qtail = NULL;
            for (job *q = srv->qhead; q; q = q->qnext) srv->qtail = q;
        }
        j->qnext = NULL;
        srv->qlen--;
        job_unref(j); /* the queue's reference */
        return;
    }
}

static void job_finish(server *srv, job *j, job_state st, int http_status, const char *msg) {
    j->state = st;
    j->http_status = http_status;
    if (msg) snprintf(j->error, sizeof j->error, "%s", msg);
    j->finished = now_s();
    j->finished_seq = ++srv->finished;
    if (st == JOB_DONE) srv->served++;
    else if (st == JOB_CANCELLED) srv->cancelled++;
    else srv->failed++;
    pthread_cond_broadcast(&srv->done);
}

/* Cancel: a queued job leaves the queue now, a running one stops after its current step. */
static void job_cancel(server *srv, job *j) {
    j->cancel = true;
    if (j->state == JOB_QUEUED) {
        job_finish(srv, j, JOB_CANCELLED, 499, "cancelled");
        queue_remove(srv, j);
    }
}

/* Drop the oldest finished asynchronous jobs beyond JOBS_KEPT. */
static void table_trim(server *srv) {
    while (srv->kept > JOBS_KEPT) {
        job **oldest = NULL;
        for (job **p = &srv->table; *p; p = &(*p)->tnext)
            if (job_terminal(*p) && (!oldest || (*p)->finished_seq < (*oldest)->finished_seq)) oldest = p;
        if (!oldest) return;
        job *j = *oldest;
        *oldest = j->tnext;
        srv->kept--;
        job_unref(j);
    }
}

static job *table_find(server *srv, const char *id) {
    for (job *j = srv->table; j; j = j->tnext)
        if (strcmp(j->id, id) == 0) return j;
    return NULL;
}

static int job_total_steps(const job *j) { return j->req.n * j->gp.num_inference_steps; }
static int job_done_steps(const job *j) {
    return j->state == JOB_DONE ? job_total_steps(j) : j->image * j->gp.num_inference_steps + j->step;
}

/* Seconds until j finishes: its remaining steps and those of every job before it. -1: unknown. */
static double job_eta(server *srv, const job *j) {
    if (srv->step_seconds <= 0) return -1;
    if (job_terminal(j)) return 0;
    double steps = 0;
    if (srv->running) steps += job_total_steps(srv->running) - job_done_steps(srv->running);
    if (j->state == JOB_QUEUED)
        for (job *q = srv->qhead; q; q = q->qnext) {
            steps += job_total_steps(q);
            if (q == j) break;
        }
    return steps * srv->step_seconds;
}

/* ---- the worker: owns the pipeline -------------------------------------------------------- */
static server *g_srv; /* for the step callback's user pointer only the job is passed */

static bool on_step(int step, int num_steps, double step_seconds, void *user) {
    job *j = user;
    server *srv = g_srv;
    pthread_mutex_lock(&srv->mu);
    j->step = step;
    srv->step_seconds = srv->step_seconds > 0 ? 0.8 * srv->step_seconds + 0.2 * step_seconds : step_seconds;
    bool go = !j->cancel && !srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    (void)num_steps;
    return go;
}

/* One image of j: generate, encode the PNG exactly as `generate` writes it, base64. Image i is
 * generated alone with seed + i (AUTOMATIC1111's numbering), an input image encoded with that seed:
 * it equals `generate --seed (seed + i)`, not image i of `generate --batch-seeds` (diffusers'
 * generator list, which encodes the input image with the first generator). */
static cdf_status run_image(server *srv, job *j, int i) {
    cdf_generate_params gp = j->gp;
    gp.seed = j->seed + (uint64_t)i;
    gp.callback = on_step;
    gp.callback_user = j;
    cdf_image img;
    CDF_TRY(cdf_pipeline_generate(srv->pipe, &gp, &img));
    cdf_cli_png_text *text = malloc(sizeof *text);
    uint8_t *png = NULL;
    size_t len = 0;
    cdf_status s = text ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (s == CDF_OK) {
        char init[1200];
        const char *names[1] = {j->req.image_name};
        cdf_cli_png_init_text(init, sizeof init, srv->pipe, &gp, names, 1, j->req.mask_name);
        cdf_cli_png_text_make(text, srv->pipe, &gp, srv->dtype, srv->model, gp.seed, NULL, init, 0);
        s = cdf_png_encode(img.width, img.height, 3, img.pixels, text->keys, text->values, 2, &png, &len);
    }
    cdf_image_free(&img);
    char *b64 = s == CDF_OK ? serve_base64_encode(png, len, NULL) : NULL;
    char *info = s == CDF_OK ? strdup(text->parameters) : NULL;
    if (s == CDF_OK && (!b64 || !info)) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory encoding the image");
    free(png);
    free(text);
    pthread_mutex_lock(&srv->mu);
    if (s == CDF_OK) {
        j->b64[i] = b64;
        j->infotext[i] = info;
    }
    pthread_mutex_unlock(&srv->mu);
    if (s != CDF_OK) {
        free(b64);
        free(info);
    }
    return s;
}

static cdf_status worker_load(server *srv) {
    cdf_device *dev = srv->device ? cdf_device_get(srv->device) : cdf_device_default();
    if (!dev) return cdf_last_status();
    if (srv->threads) cdf_device_set_threads(dev, (int)srv->threads);
    if (srv->device_memory >= 0) cdf_device_set_memory_limit(dev, (uint64_t)srv->device_memory);
    if (cdf_cli_apply_mode(srv->mode) != CDF_OK) return cdf_error_prefix("setting the execution mode: ");
    if (cdf_pipeline_load(srv->model, &srv->lp, &srv->pipe) != CDF_OK) return cdf_error_prefix("loading the pipeline: ");
    if (cdf_cli_compile(srv->pipe, srv->mode, srv->blocks) != CDF_OK) return cdf_error_prefix("compiling: ");
    return CDF_OK;
}

static void *worker_main(void *arg) {
    server *srv = arg;
    cdf_status ls = worker_load(srv);
    pthread_mutex_lock(&srv->mu);
    srv->load_status = ls;
    snprintf(srv->load_error, sizeof srv->load_error, "%s", ls == CDF_OK ? "" : cdf_last_error());
    srv->loaded = true;
    pthread_cond_broadcast(&srv->done);
    pthread_mutex_unlock(&srv->mu);
    if (ls != CDF_OK) return NULL;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        while (!srv->qhead && !srv->stopping) pthread_cond_wait(&srv->work, &srv->mu);
        if (srv->stopping) {
            pthread_mutex_unlock(&srv->mu);
            break;
        }
        job *j = srv->qhead; /* the queue's reference becomes the worker's */
        srv->qhead = j->qnext;
        if (!srv->qhead) srv->qtail = NULL;
        j->qnext = NULL;
        srv->qlen--;
        srv->running = j;
        j->state = JOB_RUNNING;
        j->started = now_s();
        pthread_mutex_unlock(&srv->mu);

        cdf_status s = CDF_OK;
        for (int i = 0; i < j->req.n && s == CDF_OK; i++) {
            pthread_mutex_lock(&srv->mu);
            j->image = i;
            j->step = 0;
            pthread_mutex_unlock(&srv->mu);
            s = run_image(srv, j, i);
        }
        pthread_mutex_lock(&srv->mu);
        if (s == CDF_OK) job_finish(srv, j, JOB_DONE, 200, NULL);
        else if (j->cancel) job_finish(srv, j, JOB_CANCELLED, 499, "cancelled");
        else if (srv->stopping && s == CDF_ERR_INTERRUPTED)
            job_finish(srv, j, JOB_FAILED, 503, "the server is shutting down; the request was stopped between two steps");
        else {
            const bool client = s == CDF_ERR_INVALID_ARG || s == CDF_ERR_LIMIT;
            job_finish(srv, j, JOB_FAILED, client ? 400 : s == CDF_ERR_OUT_OF_MEMORY ? 507 : 500, cdf_last_error());
        }
        srv->running = NULL;
        job_unref(j);
        pthread_mutex_unlock(&srv->mu);
    }
    return NULL;
}

/* ---- HTTP helpers ------------------------------------------------------------------------- */
typedef struct request_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
} request_ctx;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, char *text, const char *type,
                                 const char *const *headers) {
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Server", "cdiffusers/" CDIFFUSERS_VERSION);
    for (int i = 0; headers && headers[i]; i += 2) MHD_add_response_header(r, headers[i], headers[i + 1]);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *o, const char *const *headers) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return send_text(c, status, text, "application/json", headers);
}

/* An error both kinds of client read: OpenAI's {"error": {...}} and FastAPI's/A1111's "detail". */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *const *headers) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status == 401   ? "authentication_error"
                                       : status < 500  ? "invalid_request_error"
                                       : status == 501 ? "not_implemented"
                                                       : "server_error");
    cJSON_AddNumberToObject(e, "code", status);
    cJSON_AddStringToObject(o, "detail", msg);
    return send_json(c, status, o, headers);
}

/* The client's socket closed (or reset) while its request waits. */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0; /* pipelined data is not a hang-up */
}

/* Constant-time comparison of the Authorization header with "Bearer <key>". */
static bool authorized(server *srv, struct MHD_Connection *c) {
    if (!srv->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    const char *k = h + 7, *want = srv->api_key;
    size_t kl = strlen(k), wl = strlen(want);
    unsigned char diff = kl != wl;
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)(want[i] ^ (i < kl ? k[i] : 0));
    return diff == 0;
}

/* ---- request -> job ------------------------------------------------------------------------- */
static uint64_t random_seed(void) {
    uint32_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = (uint32_t)(now_s() * 1e6);
    return v; /* A1111 seeds are 32-bit */
}

/* img2img: decode the request's PNGs (as `generate` reads --image/--mask files) into j and point
 * gp at them; the pipeline's checks (channels, mask size, strength, steps left) follow. */
static cdf_status job_inputs(job *j, cdf_generate_params *gp) {
    const bool a1111 = j->req.api == SERVE_API_A1111;
    CDF_TRY(cdf_png_read_memory(j->req.image, j->req.image_len, a1111 ? "init_images[0]" : "image", &j->image_png));
    const cdf_png_image *ip = &j->image_png;
    j->in_image = (cdf_image){.width = ip->width, .height = ip->height, .channels = ip->channels, .pixels = ip->pixels};
    gp->image = &j->in_image;
    gp->num_input_images = 1;
    if (j->req.mask) {
        CDF_TRY(cdf_png_read_memory(j->req.mask, j->req.mask_len, "mask", &j->mask_png));
        const cdf_png_image *mp = &j->mask_png;
        j->in_mask = (cdf_image){.width = mp->width, .height = mp->height, .channels = mp->channels, .pixels = mp->pixels};
        gp->mask_image = &j->in_mask;
    }
    if (j->req.strength >= 0) gp->strength = j->req.strength;
    return CDF_OK;
}

/* Takes ownership of *req (zeroed on return). The generate parameters exactly as `generate`
 * builds them from the same options, then the pipeline's checks. NULL + message on a bad request. */
static job *job_new(server *srv, serve_request *req, bool async) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        serve_request_free(req);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->refs = 1;
    j->async = async;
    j->created = now_s();
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = j->req.prompt;
    gp.negative_prompt = j->req.negative_prompt;
    gp.width = j->req.width;
    gp.height = j->req.height;
    gp.num_inference_steps = j->req.steps;
    if (j->req.guidance >= 0) gp.guidance_scale = j->req.guidance;
    if (j->req.have_true_cfg) gp.true_cfg_scale = j->req.true_cfg_scale;
    gp.cache = j->req.cache ? j->req.cache : srv->cache;
    cdf_cli_model_defaults_apply(&srv->defaults, &gp, j->req.have_true_cfg);
    if (j->req.img2img && job_inputs(j, &gp) != CDF_OK) {
        job_unref(j);
        return NULL;
    }
    j->seed = j->req.seed >= 0 ? (uint64_t)j->req.seed : random_seed();
    j->b64 = calloc((size_t)j->req.n, sizeof *j->b64);
    j->infotext = calloc((size_t)j->req.n, sizeof *j->infotext);
    if (!j->b64 || !j->infotext) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        job_unref(j);
        return NULL;
    }
    if (cdf_pipeline_validate(srv->pipe, &gp) != CDF_OK) {
        job_unref(j);
        return NULL;
    }
    cdf_pipeline_resolve_defaults(srv->pipe, &gp); /* for progress and the responses */
    j->gp = gp;
    return j;
}

/* Queue j (the caller keeps its reference); 0, or the HTTP status of the refusal. */
static unsigned enqueue(server *srv, job *j, char *retry_after, size_t n) {
    if (srv->stopping) return 503;
    if (srv->qlen >= srv->qmax) {
        /* a place frees when the running job ends and the worker takes the head of the queue */
        double eta = srv->running ? job_eta(srv, srv->running) : 1;
        snprintf(retry_after, n, "%.0f", fmax(1.0, ceil(eta)));
        return 429;
    }
    j->seq = ++srv->next_seq;
    snprintf(j->id, sizeof j->id, "job-%llu-%08x", (unsigned long long)j->seq, (unsigned)random_seed());
    j->refs++; /* the queue's */
    if (srv->qtail) srv->qtail->qnext = j;
    else srv->qhead = j;
    srv->qtail = j;
    srv->qlen++;
    pthread_cond_signal(&srv->work);
    return 0;
}

static enum MHD_Result refuse(struct MHD_Connection *c, unsigned status, const char *retry_after) {
    char msg[256];
    if (status == 429) {
        snprintf(msg, sizeof msg, "the queue is full; retry in %s s", retry_after);
        const char *h[] = {"Retry-After", retry_after, NULL};
        return send_error(c, 429, msg, h);
    }
    return send_error(c, 503, "the server is shutting down", NULL);
}

/* ---- responses ------------------------------------------------------------------------------ */
static void add_progress(server *srv, cJSON *o, const job *j) {
    const int total = job_total_steps(j), done = job_done_steps(j);
    cJSON_AddNumberToObject(o, "progress", total ? (double)done / total : 0);
    cJSON_AddNumberToObject(o, "step", j->step);
    cJSON_AddNumberToObject(o, "steps", j->gp.num_inference_steps);
    cJSON_AddNumberToObject(o, "image", j->state == JOB_DONE ? j->req.n : j->image);
    cJSON_AddNumberToObject(o, "images", j->req.n);
    double eta = job_eta(srv, j);
    if (eta >= 0) cJSON_AddNumberToObject(o, "eta_seconds", eta);
    else cJSON_AddNullToObject(o, "eta_seconds");
}

/* OpenAI's images response: {"created", "data": [{"b64_json"}]}. Under srv->mu. */
static cJSON *openai_result(const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "created", floor(j->created));
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int i = 0; i < j->req.n; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "b64_json", j->b64[i]);
        cJSON_AddItemToArray(data, d);
    }
    return o;
}

/* AUTOMATIC1111's txt2img / img2img response: images, the parameters as understood, info (a JSON string). */
static cJSON *a1111_result(const job *j) {
    cJSON *o = cJSON_CreateObject(), *imgs = cJSON_AddArrayToObject(o, "images");
    for (int i = 0; i < j->req.n; i++) cJSON_AddItemToArray(imgs, cJSON_CreateString(j->b64[i]));
    const cdf_generate_params *gp = &j->gp;
    cJSON *p = cJSON_AddObjectToObject(o, "parameters");
    cJSON_AddStringToObject(p, "prompt", gp->prompt);
    cJSON_AddStringToObject(p, "negative_prompt", gp->negative_prompt ? gp->negative_prompt : "");
    cJSON_AddNumberToObject(p, "seed", (double)j->seed);
    cJSON_AddNumberToObject(p, "steps", gp->num_inference_steps);
    cJSON_AddNumberToObject(p, "cfg_scale", gp->guidance_scale);
    cJSON_AddNumberToObject(p, "true_cfg_scale", gp->true_cfg_scale);
    cJSON_AddNumberToObject(p, "width", gp->width);
    cJSON_AddNumberToObject(p, "height", gp->height);
    cJSON_AddNumberToObject(p, "batch_size", j->req.n);
    cJSON_AddStringToObject(p, "sampler_name", "FlowMatchEulerDiscrete");
    if (gp->cache && *gp->cache) cJSON_AddStringToObject(p, "cache", gp->cache);
    if (gp->image) cJSON_AddNumberToObject(p, "denoising_strength", gp->strength);
    cJSON *info = cJSON_Duplicate(p, 1);
    cJSON *all = cJSON_AddArrayToObject(info, "all_seeds"), *texts = cJSON_AddArrayToObject(info, "infotexts");
    for (int i = 0; i < j->req.n; i++) {
        cJSON_AddItemToArray(all, cJSON_CreateNumber((double)(j->seed + (uint64_t)i)));
        cJSON_AddItemToArray(texts, cJSON_CreateString(j->infotext[i]));
    }
    char *s = cJSON_PrintUnformatted(info);
    cJSON_Delete(info);
    cJSON_AddStringToObject(o, "info", s ? s : "{}");
    free(s);
    return o;
}

/* Locks srv->mu and queues a job for req; NULL (unlocked, *answer set: 400, 429 or 503) when
 * the request is refused. */
static job *accept_job(server *srv, struct MHD_Connection *c, serve_request *req, bool async, enum MHD_Result *answer) {
    /* outside the lock: decoding an input image must not hold up the worker's step callback */
    job *j = job_new(srv, req, async);
    if (!j) {
        *answer = send_error(c, cdf_last_status() == CDF_ERR_OUT_OF_MEMORY ? 500 : 400, cdf_last_error(), NULL);
        return NULL;
    }
    pthread_mutex_lock(&srv->mu);
    char retry[32];
    unsigned refused = enqueue(srv, j, retry, sizeof retry);
    if (refused) {
        job_unref(j);
        pthread_mutex_unlock(&srv->mu);
        *answer = refuse(c, refused, retry);
        return NULL;
    }
    return j;
}

/* A synchronous request: queue, wait (watching the client), answer. */
static enum MHD_Result run_sync(server *srv, struct MHD_Connection *c, serve_request *req) {
    enum MHD_Result answer;
    job *j = accept_job(srv, c, req, false, &answer);
    if (!j) return answer;
    while (!job_terminal(j)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&srv->done, &srv->mu, &ts);
        if (job_terminal(j)) break;
        pthread_mutex_unlock(&srv->mu);
        bool gone = client_gone(c);
        pthread_mutex_lock(&srv->mu);
        if (gone && !job_terminal(j)) {
            job_cancel(srv, j); /* queued: now; running: after this step */
            job_unref(j);
            pthread_mutex_unlock(&srv->mu);
            return MHD_NO; /* nobody to answer: close */
        }
    }
    char seq[24], fin[24], seed[24];
    snprintf(seq, sizeof seq, "%llu", (unsigned long long)j->seq);
    snprintf(fin, sizeof fin, "%llu", (unsigned long long)j->finished_seq);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->seed);
    const char *h[] = {"X-Cdiffusers-Job", seq, "X-Cdiffusers-Finished", fin, "X-Cdiffusers-Seed", seed, NULL};
    cJSON *o = j->state == JOB_DONE ? (j->req.api == SERVE_API_A1111 ? a1111_result(j) : openai_result(j)) : NULL;
    unsigned status = j->state == JOB_DONE ? 200 : j->http_status;
    char err[sizeof j->error];
    snprintf(err, sizeof err, "%s", j->error);
    job_unref(j);
    pthread_mutex_unlock(&srv->mu);
    if (o) return send_json(c, 200, o, h);
    return send_error(c, status, err, h);
}

static cJSON *job_json(server *srv, const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "image.job");
    cJSON_AddStringToObject(o, "state", j->cancel && j->state == JOB_RUNNING ? "cancelling" : k_state_names[j->state]);
    cJSON_AddNumberToObject(o, "created", floor(j->created));
    cJSON_AddNumberToObject(o, "seed", (double)j->seed);
    if (j->state == JOB_QUEUED) {
        int pos = 0;
        for (job *q = srv->qhead; q && q != j; q = q->qnext) pos++;
        cJSON_AddNumberToObject(o, "queue_position", pos);
    }
    add_progress(srv, o, j);
    if (j->state == JOB_DONE) cJSON_AddItemToObject(o, "result", openai_result(j));
    if (j->state == JOB_FAILED) cJSON_AddStringToObject(o, "error", j->error);
    return o;
}

static enum MHD_Result jobs_post(server *srv, struct MHD_Connection *c, serve_request *req) {
    enum MHD_Result answer;
    job *j = accept_job(srv, c, req, true, &answer);
    if (!j) return answer;
    j->tnext = srv->table; /* the table takes the handler's reference */
    srv->table = j;
    srv->kept++;
    table_trim(srv);
    cJSON *o = job_json(srv, j);
    pthread_mutex_unlock(&srv->mu);
    return send_json(c, 202, o, NULL);
}

static enum MHD_Result jobs_get_delete(server *srv, struct MHD_Connection *c, const char *id, bool del) {
    pthread_mutex_lock(&srv->mu);
    job *j = table_find(srv, id);
    if (!j) {
        pthread_mutex_unlock(&srv->mu);
        return send_error(c, 404, "no such job (finished jobs are kept until 64 newer ones finish)", NULL);
    }
    if (del && !job_terminal(j)) job_cancel(srv, j);
    cJSON *o = job_json(srv, j);
    pthread_mutex_unlock(&srv->mu);
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result progress_get(server *srv, struct MHD_Connection *c) {
    pthread_mutex_lock(&srv->mu);
    cJSON *o = cJSON_CreateObject(), *st = cJSON_CreateObject();
    const job *j = srv->running;
    double eta = j ? job_eta(srv, j) : 0;
    cJSON_AddNumberToObject(o, "progress", j && job_total_steps(j) ? (double)job_done_steps(j) / job_total_steps(j) : 0);
    cJSON_AddNumberToObject(o, "eta_relative", eta > 0 ? eta : 0);
    cJSON_AddNumberToObject(st, "job_count", srv->qlen + (j ? 1 : 0));
    cJSON_AddStringToObject(st, "job", j ? j->id : "");
    cJSON_AddNumberToObject(st, "sampling_step", j ? j->step : 0);
    cJSON_AddNumberToObject(st, "sampling_steps", j ? j->gp.num_inference_steps : 0);
    cJSON_AddBoolToObject(st, "interrupted", j && j->cancel);
    cJSON_AddBoolToObject(st, "skipped", false);
    cJSON_AddItemToObject(o, "state", st);
    cJSON_AddNullToObject(o, "current_image");
    cJSON_AddNullToObject(o, "textinfo");
    pthread_mutex_unlock(&srv->mu);
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result health_get(server *srv, struct MHD_Connection *c) {
    pthread_mutex_lock(&srv->mu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", srv->stopping ? "stopping" : "ok");
    cJSON_AddStringToObject(o, "model", srv->model_name);
    cJSON_AddStringToObject(o, "pipeline", cdf_pipeline_class_name(srv->pipe));
    cJSON_AddNumberToObject(o, "queued", srv->qlen);
    cJSON_AddNumberToObject(o, "queue_limit", srv->qmax);
    cJSON_AddBoolToObject(o, "running", srv->running != NULL);
    cJSON_AddNumberToObject(o, "accepted", (double)srv->next_seq);
    cJSON_AddNumberToObject(o, "served", (double)srv->served);
    cJSON_AddNumberToObject(o, "cancelled", (double)srv->cancelled);
    cJSON_AddNumberToObject(o, "failed", (double)srv->failed);
    const bool stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    return send_json(c, stopping ? 503 : 200, o, NULL);
}

static enum MHD_Result models_get(server *srv, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "cdiffusers");
    cJSON_AddStringToObject(m, "pipeline", cdf_pipeline_class_name(srv->pipe));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
    return send_json(c, 200, o, NULL);
}

/* ---- routing ------------------------------------------------------------------------------------ */
static enum MHD_Result route(server *srv, struct MHD_Connection *c, const char *url, const char *method, request_ctx *rc) {
    const bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/health") == 0 && get) return health_get(srv, c);
    if (srv->stopping) return send_error(c, 503, "the server is shutting down", NULL);
    const char *body = rc->body ? rc->body : "";
    serve_request req;
    if (strcmp(url, "/v1/models") == 0 && get) return models_get(srv, c);
    if (strcmp(url, "/sdapi/v1/progress") == 0 && get) return progress_get(srv, c);
    if (strcmp(url, "/v1/images/generations") == 0 && post) {
        if (serve_parse_generation(body, rc->len, &req) != CDF_OK)
            return send_error(c, 400, cdf_last_error(), NULL);
        return run_sync(srv, c, &req);
    }
    if (strcmp(url, "/sdapi/v1/txt2img") == 0 && post) {
        if (serve_parse_a1111(body, rc->len, false, &req) != CDF_OK) return send_error(c, 400, cdf_last_error(), NULL);
        return run_sync(srv, c, &req);
    }
    if (strcmp(url, "/v1/images/edits") == 0 && post) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (serve_parse_edit(ct, (const uint8_t *)body, rc->len, &req) != CDF_OK) return send_error(c, 400, cdf_last_error(), NULL);
        return run_sync(srv, c, &req);
    }
    if (strcmp(url, "/sdapi/v1/img2img") == 0 && post) {
        if (serve_parse_a1111(body, rc->len, true, &req) != CDF_OK) return send_error(c, 400, cdf_last_error(), NULL);
        return run_sync(srv, c, &req);
    }
    if (strcmp(url, "/v1/jobs") == 0 && post) {
        if (serve_parse_generation(body, rc->len, &req) != CDF_OK) return send_error(c, 400, cdf_last_error(), NULL);
        return jobs_post(srv, c, &req);
    }
    if (strncmp(url, "/v1/jobs/", 9) == 0 && (get || strcmp(method, "DELETE") == 0))
        return jobs_get_delete(srv, c, url + 9, !get);
    static const char *const known[] = {"/health", "/v1/models", "/sdapi/v1/progress", "/v1/images/generations",
                                        "/sdapi/v1/txt2img", "/v1/images/edits", "/sdapi/v1/img2img", "/v1/jobs"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(url, known[i]) == 0) return send_error(c, 405, "method not allowed on this path", NULL);
    if (strncmp(url, "/v1/jobs/", 9) == 0) return send_error(c, 405, "method not allowed on this path", NULL);
    return send_error(c, 404, "no such endpoint", NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *srv = cls;
    request_ctx *rc = *con_cls;
    if (!rc) { /* the headers have arrived: refuse early what needs no body */
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *con_cls = rc;
        if (!(strcmp(url, "/health") == 0) && !authorized(srv, c)) {
            const char *h[] = {"WWW-Authenticate", "Bearer", NULL};
            return send_error(c, 401, "missing or wrong API key (Authorization: Bearer KEY)", h);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->max_body) rc->too_large = true;
        if (rc->too_large) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes", srv->max_body);
            return send_error(c, 413, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rc->too_large && rc->len + *upload_size > srv->max_body) {
            rc->too_large = true;
            free(rc->body);
            rc->body = NULL;
            rc->len = rc->cap = 0;
        }
        if (!rc->too_large) {
            if (rc->len + *upload_size + 1 > rc->cap) {
                size_t cap = rc->cap ? rc->cap : 4096;
                while (cap < rc->len + *upload_size + 1) cap *= 2;
                char *b = realloc(rc->body, cap);
                if (!b) return MHD_NO;
                rc->body = b;
                rc->cap = cap;
            }
            memcpy(rc->body + rc->len, upload, *upload_size);
            rc->len += *upload_size;
            rc->body[rc->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes", srv->max_body);
        return send_error(c, 413, msg, NULL);
    }
    (void)version;
    return route(srv, c, url, method, rc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    request_ctx *rc = *con_cls;
    if (rc) free(rc->body);
    free(rc);
    *con_cls = NULL;
}

/* ---- the command ------------------------------------------------------------------------------- */
void cdf_cli_serve_usage(FILE *f) {
    fprintf(f,
            "  cdiffusers serve [--model DIR|FILE] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--queue 16]\n"
            "                   [--max-body-mb 32] [--max-connections 64] [--dtype bf16|f32] [--offload none|model|sequential]\n"
            "                   [--device-memory SIZE] [--mode eager|fuse|compile] [--compile-repeated-blocks] [--threads N]\n"
            "                   [--transformer FILE] [--vae FILE] [--text-encoder N=FILE] [--allow-unused-keys]\n"
            "                   [--weight-type q8_0|q4_k|f32|bf16] [--config DIR]  (the model's files as generate takes them)\n"
            "                   [--device NAME] [--pjrt-cache DIR|off]  (the device to run on, as generate)\n"
            "                   [--cache first-block[:T]|mag[:k=v,...]|taylorseer[:k=v,...]]  (the step cache of requests\n"
            "                   without a \"cache\" field)\n"
            "      an HTTP server keeping the pipeline loaded: POST /v1/images/generations (OpenAI), POST /sdapi/v1/txt2img\n"
            "      (AUTOMATIC1111), POST /v1/images/edits (OpenAI, multipart image [+ mask]) and /sdapi/v1/img2img\n"
            "      (img2img / inpainting), POST /v1/jobs + GET/DELETE /v1/jobs/ID (asynchronous, cancel between steps),\n"
            "      GET /v1/models, /sdapi/v1/progress, /health. One worker runs the requests in arrival order; a full\n"
            "      queue answers 429, SIGTERM stops after the current step (queued requests get 503). A host other\n"
            "      than loopback needs --api-key (clients send Authorization: Bearer KEY). --port 0: any free port.\n");
}

static bool is_loopback(const struct sockaddr *a) {
    if (a->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return false;
}

/* SIGTERM/SIGINT: queued requests get 503 now, the running one stops after its current step. */
static void shut_down(server *srv, struct MHD_Daemon *d, pthread_t worker) {
    pthread_mutex_lock(&srv->mu);
    srv->stopping = true;
    while (srv->qhead) {
        job *j = srv->qhead;
        job_finish(srv, j, JOB_FAILED, 503, "the server is shutting down; the request was not started");
        queue_remove(srv, j);
    }
    pthread_cond_broadcast(&srv->work);
    pthread_mutex_unlock(&srv->mu);
    pthread_join(worker, NULL);
    /* let the waiting handlers send their answers before the connections close */
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    for (int i = 0; i < 50; i++) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0) break;
        usleep(100 * 1000);
    }
    MHD_stop_daemon(d);
}

/* SIGTERM/SIGINT: the handler (any thread may run it: threads started before serve, e.g. by a
 * sanitizer runtime, do not have them blocked) writes the signal number to a pipe the main
 * thread reads. */
static int g_signal_pipe[2] = {-1, -1};
static void on_signal(int sig) {
    unsigned char c = (unsigned char)sig;
    ssize_t r = write(g_signal_pipe[1], &c, 1);
    (void)r;
}

static int serve(int argc, char **argv);

int cdf_cli_serve(int argc, char **argv) {
    struct sigaction old_term, old_int, old_pipe;
    sigaction(SIGTERM, NULL, &old_term);
    sigaction(SIGINT, NULL, &old_int);
    sigaction(SIGPIPE, NULL, &old_pipe);
    int rc = serve(argc, argv);
    /* as they were (the tool returns; a caller in-process goes on) */
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    for (int i = 0; i < 2; i++)
        if (g_signal_pipe[i] >= 0) close(g_signal_pipe[i]), g_signal_pipe[i] = -1;
    return rc;
}

static int serve(int argc, char **argv) {
    static server srv_storage;
    server *srv = &srv_storage;
    memset(srv, 0, sizeof *srv);
    const char *host = "127.0.0.1";
    long port = 8080, queue = 16, max_body_mb = 32, conns = 64;
    cdf_cli_run_opts ro = cdf_cli_run_opts_default(); /* as generate */
    static cdf_cli_component_files cf; /* static: the load parameters point into it for the server's life */
    memset(&cf, 0, sizeof cf);
    const char *weight_type = NULL, *config = NULL;
    bool allow_unused = false;
    static const struct option opts[] = {
        CDF_CLI_RUN_OPTIONS,                         CDF_CLI_LOAD_OPTIONS,
        CDF_CLI_COMPONENT_OPTIONS, /* as generate: a GGUF / single-file transformer, --model FILE --config DIR */
        {"host", required_argument, 0, 'H'},
        {"port", required_argument, 0, 'p'},         {"api-key", required_argument, 0, 'k'},
        {"queue", required_argument, 0, 'q'},        {"max-body-mb", required_argument, 0, 'b'},
        {"max-connections", required_argument, 0, 'c'}, {"device", required_argument, 0, 'D'},
        {"cache", required_argument, 0, CDF_CLI_OPT_NEXT},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    while ((c = cdf_cli_next_option(argc, argv, opts, &ro)) != -1) {
        switch (c) {
        case CDF_CLI_OPT_NEXT:
            if (cdf_pipeline_cache_check(optarg) != CDF_OK) return cdf_cli_usage_error("--cache: %s", cdf_last_error());
            srv->cache = optarg;
            break;
        case 'H': host = optarg; break;
        case 'p':
            if (!cdf_cli_parse_long(optarg, 0, 65535, &port)) return cdf_cli_usage_error("--port needs a port number 0..65535, got '%s'", optarg);
            break;
        case 'k': srv->api_key = optarg; break;
        case 'D': srv->device = optarg; break;
        case 'q':
            if (!cdf_cli_parse_long(optarg, 1, 100000, &queue)) return cdf_cli_usage_error("--queue needs a positive integer, got '%s'", optarg);
            break;
        case 'b':
            if (!cdf_cli_parse_long(optarg, 1, 4096, &max_body_mb)) return cdf_cli_usage_error("--max-body-mb needs 1..4096, got '%s'", optarg);
            break;
        case 'c':
            if (!cdf_cli_parse_long(optarg, 2, 10000, &conns)) return cdf_cli_usage_error("--max-connections needs 2..10000, got '%s'", optarg);
            break;
        case CDF_CLI_OPT_TRANSFORMER_FILE:
        case CDF_CLI_OPT_VAE_FILE:
        case CDF_CLI_OPT_TEXT_ENCODER_FILE:
            if (cdf_cli_add_component_file(&cf, c, optarg) != 0) return EXIT_USAGE;
            break;
        case CDF_CLI_OPT_ALLOW_UNUSED_KEYS: allow_unused = true; break;
        case CDF_CLI_OPT_WEIGHT_TYPE: weight_type = optarg; break;
        case CDF_CLI_OPT_CONFIG: config = optarg; break;
        case 'h': cdf_cli_serve_usage(stdout); return EXIT_OK;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc) return cdf_cli_usage_error("unexpected argument '%s'", argv[optind]);
    if (srv->api_key && !srv->api_key[0]) return cdf_cli_usage_error("%s", "--api-key must not be empty");
    char default_model[4096];
    if (!ro.model) {
        if (!cdf_cli_find_default_model(default_model, sizeof default_model))
            return cdf_cli_usage_error("%s", "serve needs --model DIR (the default model " CDF_CLI_DEFAULT_MODEL_NAME " was not found)");
        ro.model = default_model;
    }
    srv->model = ro.model;
    srv->dtype = ro.dtype;
    srv->mode = ro.mode;
    srv->blocks = ro.blocks;
    srv->threads = ro.threads;
    srv->lp = cdf_pipeline_load_params_default();
    if (!cdf_cli_run_opts_load(&ro, &srv->lp, &srv->device_memory)) return EXIT_USAGE;
    srv->lp.device = srv->device;
    srv->lp.component_files = cf.files;
    srv->lp.num_component_files = cf.n;
    srv->lp.allow_unused_keys = allow_unused;
    srv->lp.config = config;
    const char *wt_err = cdf_cli_parse_weight_type(weight_type, ro.dtype, &srv->lp.decode_quantized, &srv->lp.quantize_weights);
    if (wt_err) return cdf_cli_usage_error("%s", wt_err);
    srv->qmax = (int)queue;
    srv->max_body = (size_t)max_body_mb << 20;
    const char *slash = strrchr(srv->model, '/');
    srv->model_name = slash && slash[1] ? slash + 1 : srv->model;

    /* where to listen: refuse a non-loopback address without a key before loading anything */
    /* numeric addresses only (and "localhost"): no name lookup, so no DNS traffic or delay */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICHOST},
                    *ai = NULL;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%ld", port);
    int gai = getaddrinfo(strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, portstr, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "cdiffusers serve: --host must be an IPv4 or IPv6 address or localhost, got '%s' (%s)\n", host,
                gai_strerror(gai));
        return EXIT_USAGE;
    }
    if (!is_loopback(ai->ai_addr) && !srv->api_key) {
        freeaddrinfo(ai);
        return cdf_cli_usage_error("--host '%s' is not a loopback address: --api-key KEY is required to serve beyond this machine", host);
    }
    if (cdf_cli_model_defaults_load(config ? config : srv->model, &srv->defaults) != CDF_OK) {
        freeaddrinfo(ai);
        fprintf(stderr, "cdiffusers serve: %s\n", cdf_last_error());
        return EXIT_FAIL;
    }

    if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
        freeaddrinfo(ai);
        fprintf(stderr, "cdiffusers serve: pipe: %s\n", strerror(errno));
        return EXIT_FAIL;
    }
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->work, NULL);
    pthread_cond_init(&srv->done, NULL);
    g_srv = srv;
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, srv) != 0) {
        freeaddrinfo(ai);
        fprintf(stderr, "cdiffusers serve: cannot start the worker thread\n");
        return EXIT_FAIL;
    }
    pthread_mutex_lock(&srv->mu);
    while (!srv->loaded) pthread_cond_wait(&srv->done, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    if (srv->load_status != CDF_OK) {
        pthread_join(worker, NULL);
        freeaddrinfo(ai);
        fprintf(stderr, "cdiffusers serve: %s\n", srv->load_error);
        cdf_pipeline_free(srv->pipe);
        return EXIT_FAIL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)conns, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "cdiffusers serve: cannot listen on %s port %ld: %s\n", host, port, strerror(errno));
        pthread_mutex_lock(&srv->mu);
        srv->stopping = true;
        pthread_cond_broadcast(&srv->work);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(worker, NULL);
        cdf_pipeline_free(srv->pipe);
        return EXIT_FAIL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "cdiffusers serve: %s (%s) listening on http://%s%s%s:%u/ (queue %d%s)\n", srv->model,
            cdf_pipeline_class_name(srv->pipe), strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
            di ? di->port : (unsigned)port, srv->qmax, srv->api_key ? ", API key required" : "");
    int sig = 0;
    unsigned char sc = 0;
    while (read(g_signal_pipe[0], &sc, 1) != 1 && errno == EINTR) {
    }
    sig = sc;
    fprintf(stderr, "cdiffusers serve: %s: finishing the current step, refusing the queue, exiting\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
    shut_down(srv, d, worker);
    pthread_mutex_lock(&srv->mu);
    while (srv->table) {
        job *j = srv->table;
        srv->table = j->tnext;
        job_unref(j);
    }
    fprintf(stderr, "cdiffusers serve: stopped (%llu served, %llu cancelled, %llu failed)\n", (unsigned long long)srv->served,
            (unsigned long long)srv->cancelled, (unsigned long long)srv->failed);
    pthread_mutex_unlock(&srv->mu);
    cdf_pipeline_free(srv->pipe);
    return EXIT_OK;
}
