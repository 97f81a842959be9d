/* Compiled PJRT programs in memory and on disk (pjrt_cache.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/pjrt/pjrt_cache.h"
#include "cdiffusers/device.h"
#include "core/error_internal.h"

#define N_BUCKETS 4096

void (*cdf_pjrt_cache_test_hook)(char *text, size_t len);
#define MAGIC "CDFPJRT1"

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    int replicas;
    char *text;
    size_t len;
    cdf_pjrt_exe exe;
} entry;

struct cdf_pjrt_cache {
    entry *buckets[N_BUCKETS];
    char dir[1024];     /* "" = no disk cache */
    uint64_t env_hash;  /* the plugin, its versions, the device kind, the host CPU, the options */
    uint64_t max_bytes;
    char xla_flags[512]; /* CDIFFUSERS_PJRT_XLA_FLAGS: XLA debug options for every compile */
    cdf_pjrt_cache_stats stats;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
static uint64_t fnv_str(uint64_t h, const char *s) { return fnv(h, s, strlen(s) + 1); }

/* the CPU's feature flags: an executable of the CPU plugin is compiled for them */
static uint64_t cpu_flags_hash(uint64_t h) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return h;
    char line[8192];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            h = fnv_str(h, line);
            break;
        }
    fclose(f);
    return h;
}

static int mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

void cdf_pjrt_cache_default_dir(char *out, size_t cap) {
    const char *env = getenv("CDIFFUSERS_PJRT_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env) snprintf(out, cap, "%s", strcmp(env, "off") == 0 ? "" : env);
    else if (xdg && *xdg) snprintf(out, cap, "%s/cdiffusers/pjrt", xdg);
    else if (home && *home) snprintf(out, cap, "%s/.cache/cdiffusers/pjrt", home);
    else snprintf(out, cap, "%s", "");
}

void cdf_pjrt_cache_folder(char *out, size_t cap) { cdf_pjrt_cache_default_dir(out, cap); }

cdf_status cdf_pjrt_cache_open(cdf_pjrt_cache **out, cdf_pjrt *rt) {
    cdf_pjrt_cache *c = calloc(1, sizeof *c);
    if (!c) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_pjrt_cache_default_dir(c->dir, sizeof c->dir);
    if (c->dir[0] && mkdirs(c->dir) != 0) {
        fprintf(stderr, "cdiffusers: warning: PJRT cache folder %s cannot be made (%s): compiling without a disk cache\n",
                c->dir, strerror(errno));
        c->dir[0] = 0;
    }
    const char *mx = getenv("CDIFFUSERS_PJRT_CACHE_MAX");
    int64_t m = mx && *mx ? cdf_parse_bytes(mx) : -1;
    c->max_bytes = m > 0 ? (uint64_t)m : (uint64_t)4 << 30;
    char kind[64], mem[128];
    cdf_pjrt_device_describe(rt, 0, kind, sizeof kind, mem, sizeof mem);
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv_str(h, rt->path);
    h = fnv_str(h, rt->platform);
    h = fnv_str(h, rt->platform_version);
    h = fnv_str(h, rt->stablehlo_version);
    h = fnv_str(h, kind);
    h = fnv(h, &rt->n_devices, sizeof rt->n_devices);
    const char *flags = getenv("CDIFFUSERS_PJRT_XLA_FLAGS");
    snprintf(c->xla_flags, sizeof c->xla_flags, "%s", flags ? flags : "");
    uint8_t opts[1024];
    size_t no = cdf_pjrt_compile_options(opts, sizeof opts, 1, 1, c->xla_flags);
    h = fnv(h, opts, no);
    c->env_hash = cpu_flags_hash(h);
    *out = c;
    return CDF_OK;
}

void cdf_pjrt_cache_get_stats(const cdf_pjrt_cache *c, cdf_pjrt_cache_stats *out) { *out = c->stats; }
const char *cdf_pjrt_cache_dir(const cdf_pjrt_cache *c) { return c->dir; }

/* ---- disk ------------------------------------------------------------------------------------------- */

static void entry_path(const cdf_pjrt_cache *c, uint64_t key, char *out, size_t cap) {
    snprintf(out, cap, "%s/%016llx.pjrtx", c->dir, (unsigned long long)key);
}

/* the executable stored for this text, or NULL (a miss, or a stale / corrupt entry: warned) */
static PJRT_LoadedExecutable *disk_load(cdf_pjrt_cache *c, cdf_pjrt *rt, uint64_t key, const char *text, size_t len) {
    char path[1100];
    entry_path(c, key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char magic[8];
    uint64_t hdr[3];
    PJRT_LoadedExecutable *exe = NULL;
    char *buf = NULL;
    const char *why = NULL;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, MAGIC, 8) || fread(hdr, sizeof hdr, 1, f) != 1 || hdr[2] != key)
        why = "not a cdiffusers PJRT cache entry";
    else if (hdr[0] != len)
        why = NULL; /* another program with the same key: a miss */
    if (!why && hdr[0] == len) {
        buf = malloc(len + hdr[1] + 1);
        if (!buf || fread(buf, 1, len + hdr[1], f) != len + hdr[1]) why = "truncated";
        else if (memcmp(buf, text, len) == 0) {
            if (cdf_pjrt_deserialize(rt, buf + len, hdr[1], &exe) != CDF_OK) why = cdf_last_error();
        }
    }
    fclose(f);
    if (why) {
        fprintf(stderr, "cdiffusers: warning: PJRT cache entry %s is unusable (%s): compiling again\n", path, why);
        c->stats.disk_errors++;
        unlink(path);
        exe = NULL;
    } else if (exe) {
        utimes(path, NULL); /* recently used */
    }
    free(buf);
    return exe;
}

typedef struct file_age {
    char name[300];
    time_t mtime;
    off_t size;
} file_age;

static int by_age(const void *a, const void *b) {
    const file_age *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* evict the least recently used entries until the folder fits its bound */
static void disk_trim(cdf_pjrt_cache *c) {
    DIR *d = opendir(c->dir);
    if (!d) return;
    file_age *v = NULL;
    int n = 0, cap = 0;
    uint64_t total = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".pjrtx")) continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name);
        struct stat st;
        if (stat(p, &st)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            file_age *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
        v[n].mtime = st.st_mtime;
        v[n].size = st.st_size;
        total += (uint64_t)st.st_size;
        n++;
    }
    closedir(d);
    if (total > c->max_bytes) {
        qsort(v, (size_t)n, sizeof *v, by_age);
        for (int i = 0; i < n && total > c->max_bytes; i++) {
            char p[1400];
            snprintf(p, sizeof p, "%s/%s", c->dir, v[i].name);
            if (!unlink(p)) total -= (uint64_t)v[i].size;
        }
    }
    free(v);
}

static void disk_store(cdf_pjrt_cache *c, cdf_pjrt *rt, uint64_t key, const char *text, size_t len, PJRT_LoadedExecutable *e) {
    char *bytes = NULL;
    size_t nb = 0;
    if (cdf_pjrt_serialize(rt, e, &bytes, &nb) != CDF_OK) {
        c->stats.disk_errors++;
        return;
    }
    char path[1100], tmp[1200];
    entry_path(c, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    uint64_t hdr[3] = {len, nb, key};
    bool ok = f && fwrite(MAGIC, 1, 8, f) == 8 && fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(text, 1, len, f) == len &&
              fwrite(bytes, 1, nb, f) == nb;
    if (f && fclose(f)) ok = false;
    if (ok && rename(tmp, path) == 0) {
        c->stats.disk_writes++;
        disk_trim(c);
    } else {
        unlink(tmp);
        c->stats.disk_errors++;
    }
    free(bytes);
}

/* ---- lookups ------------------------------------------------------------------------------------------ */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

cdf_status cdf_pjrt_cache_get(cdf_pjrt_cache *c, cdf_pjrt *rt, const char *text, size_t len, int replicas, const char *who,
                              cdf_pjrt_exe **out) {
    if (replicas < 1) replicas = 1;
    const uint64_t h = fnv(0xcbf29ce484222325ULL, text, len);
    entry **slot = &c->buckets[h % N_BUCKETS];
    for (entry *e = *slot; e; e = e->next)
        if (e->hash == h && e->replicas == replicas && e->len == len && !memcmp(e->text, text, len)) {
            c->stats.memory_hits++;
            *out = &e->exe;
            return CDF_OK;
        }
    entry *e = calloc(1, sizeof *e);
    char *copy = e ? malloc(len + 1) : NULL;
    if (!copy) {
        free(e);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (program cache)");
    }
    memcpy(copy, text, len);
    copy[len] = 0;
    /* the replica count is in the compile options: in the key (one replica keeps the keys it had) */
    const uint64_t key = fnv(replicas > 1 ? fnv(c->env_hash, &replicas, sizeof replicas) : c->env_hash, text, len);
    double t0 = now_seconds();
    PJRT_LoadedExecutable *exe = c->dir[0] ? disk_load(c, rt, key, text, len) : NULL;
    if (exe) {
        c->stats.disk_hits++;
        c->stats.load_seconds += now_seconds() - t0;
    } else {
        const char *log = getenv("CDIFFUSERS_LOG"); /* pjrt, or compile as on every backend */
        if (cdf_pjrt_log_on() || (log && strstr(log, "compile")) || len > (1u << 16))
            fprintf(stderr, "cdiffusers: compiling %s (first run for this shape)\n", who);
        if (getenv("CDIFFUSERS_PJRT_TRACE")) fprintf(stderr, "---- %s\n%.*s", who, (int)len, text);
        if (cdf_pjrt_cache_test_hook) cdf_pjrt_cache_test_hook(copy, len);
        cdf_status s = cdf_pjrt_compile(rt, cdf_pjrt_cache_test_hook ? copy : text, len, c->xla_flags, replicas, &exe);
        if (s != CDF_OK) {
            free(copy);
            free(e);
            if (getenv("CDIFFUSERS_PJRT_DUMP")) {
                FILE *f = fopen(getenv("CDIFFUSERS_PJRT_DUMP"), "w");
                if (f) {
                    fwrite(text, 1, len, f);
                    fclose(f);
                }
            }
            return cdf_error_prefix("%s: ", who);
        }
        c->stats.compiles++;
        c->stats.compile_seconds += now_seconds() - t0;
        if (c->dir[0]) disk_store(c, rt, key, text, len, exe);
    }
    cdf_status s = cdf_pjrt_num_outputs(rt, exe, &e->exe.n_outputs);
    if (s == CDF_OK && replicas > 1) s = cdf_pjrt_check_assignment(rt, exe, replicas);
    if (s == CDF_OK) {
        cdf_pjrt_compiled_mem m;
        if (cdf_pjrt_compiled_memory(rt, exe, &m) == CDF_OK) e->exe.temp_bytes = m.temp_bytes;
        else cdf_clear_error();
    }
    if (s != CDF_OK) {
        cdf_pjrt_executable_free(rt, exe);
        free(copy);
        free(e);
        return s;
    }
    e->exe.exe = exe;
    e->hash = h;
    e->replicas = replicas;
    e->text = copy;
    e->len = len;
    e->next = *slot;
    *slot = e;
    *out = &e->exe;
    return CDF_OK;
}
