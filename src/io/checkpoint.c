/* A model component's weights: one safetensors file, a sharded set described by an index JSON,
 * or several safetensors files without an index. All shards are opened and cross-checked at
 * open time so that a broken checkpoint fails early with a message naming the file. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/json.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ck_entry {
    const char *name; /* points into the owning cdf_st_file */
    int file;
    const cdf_st_tensor *t;
} ck_entry;

struct cdf_checkpoint {
    char *path;
    int n_files;
    cdf_st_file **files;
    int n;
    ck_entry *entries; /* sorted by name */
};

static const char *const k_single_names[] = {"diffusion_pytorch_model.safetensors", "model.safetensors"};
static const char *const k_index_names[] = {"diffusion_pytorch_model.safetensors.index.json",
                                            "model.safetensors.index.json"};

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const ck_entry *)a)->name, ((const ck_entry *)b)->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void cdf_checkpoint_close(cdf_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) cdf_st_close(ck->files[i]);
    free(ck->files);
    free(ck->entries);
    free(ck->path);
    free(ck);
}

static cdf_status add_file(cdf_checkpoint *ck, const char *path, int *index) {
    cdf_st_file **nf = realloc(ck->files, ((size_t)ck->n_files + 1) * sizeof *nf);
    if (!nf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint '%s': out of memory", ck->path);
    ck->files = nf;
    cdf_st_file *f = NULL;
    CDF_TRY(cdf_st_open(path, &f));
    ck->files[ck->n_files] = f;
    *index = ck->n_files++;
    return CDF_OK;
}

/* Entries = every tensor of every opened file; names must be unique across files. */
static cdf_status collect_all(cdf_checkpoint *ck) {
    size_t total = 0;
    for (int i = 0; i < ck->n_files; i++) total += (size_t)cdf_st_count(ck->files[i]);
    ck->entries = malloc((total + 1) * sizeof *ck->entries);
    if (!ck->entries) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint '%s': out of memory", ck->path);
    for (int i = 0; i < ck->n_files; i++) {
        for (int j = 0; j < cdf_st_count(ck->files[i]); j++) {
            const cdf_st_tensor *t = cdf_st_tensor_at(ck->files[i], j);
            ck->entries[ck->n++] = (ck_entry){t->name, i, t};
        }
    }
    qsort(ck->entries, (size_t)ck->n, sizeof *ck->entries, cmp_entry);
    for (int i = 1; i < ck->n; i++) {
        if (strcmp(ck->entries[i - 1].name, ck->entries[i].name) == 0)
            return cdf_error(CDF_ERR_FORMAT, "checkpoint '%s': tensor '%s' is in both '%s' and '%s'",
                             ck->path, ck->entries[i].name,
                             cdf_st_path(ck->files[ck->entries[i - 1].file]),
                             cdf_st_path(ck->files[ck->entries[i].file]));
    }
    return CDF_OK;
}

/* A shard name from an index must stay inside the folder: a plain file name. */
static bool plain_file_name(const char *s) {
    if (!s[0] || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return false;
    return !strchr(s, '/') && !strchr(s, '\\');
}

static cdf_status open_index(cdf_checkpoint *ck, const char *dir, const char *index_path) {
    cJSON *root = NULL;
    CDF_TRY(cdf_json_load_file(index_path, &root));
    cdf_status s = CDF_OK;
    char **shards = NULL;
    int n_shards = 0;
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!wm || !cJSON_IsObject(wm)) {
        s = cdf_error(CDF_ERR_FORMAT, "checkpoint index '%s': missing \"weight_map\" object", index_path);
        goto done;
    }
    int n = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring) {
            s = cdf_error(CDF_ERR_FORMAT,
                          "checkpoint index '%s': weight_map entry for tensor '%s' is not a string",
                          index_path, e->string);
            goto done;
        }
        if (!plain_file_name(e->valuestring)) {
            s = cdf_error(CDF_ERR_FORMAT,
                          "checkpoint index '%s': shard file name '%s' for tensor '%s' must be a plain "
                          "file name inside the folder (no '/', '\\', '.' or '..')",
                          index_path, e->valuestring, e->string);
            goto done;
        }
        n++;
    }
    /* distinct shard names, in sorted order so files open in a stable order */
    shards = malloc(((size_t)n + 1) * sizeof *shards);
    ck->entries = malloc(((size_t)n + 1) * sizeof *ck->entries);
    if (!shards || !ck->entries) {
        s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint '%s': out of memory", ck->path);
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) shards[n_shards++] = e->valuestring;
    qsort(shards, (size_t)n_shards, sizeof *shards, cmp_str);
    int u = 0;
    for (int i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n_shards = u;
    for (int i = 0; i < n_shards; i++) {
        char *p = join(dir, shards[i]);
        if (!p) {
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint '%s': out of memory", ck->path);
            goto done;
        }
        if (!is_file(p)) {
            s = cdf_error(CDF_ERR_NOT_FOUND, "checkpoint index '%s' names shard '%s', which does not exist (%s)",
                          index_path, shards[i], p);
            free(p);
            goto done;
        }
        int idx;
        s = add_file(ck, p, &idx);
        free(p);
        if (s != CDF_OK) goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        /* file index by binary search over the sorted distinct shard names */
        int lo = 0, hi = n_shards - 1, fi = -1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2, c = strcmp(e->valuestring, shards[mid]);
            if (c == 0) { fi = mid; break; }
            if (c < 0) hi = mid - 1; else lo = mid + 1;
        }
        const cdf_st_tensor *t = fi >= 0 ? cdf_st_find(ck->files[fi], e->string) : NULL;
        if (!t) {
            s = cdf_error(CDF_ERR_FORMAT,
                          "checkpoint index '%s' maps tensor '%s' to shard '%s', but that shard has no "
                          "such tensor",
                          index_path, e->string, e->valuestring);
            goto done;
        }
        ck->entries[ck->n++] = (ck_entry){t->name, fi, t};
    }
    qsort(ck->entries, (size_t)ck->n, sizeof *ck->entries, cmp_entry);
    for (int i = 1; i < ck->n; i++) {
        if (strcmp(ck->entries[i - 1].name, ck->entries[i].name) == 0) {
            s = cdf_error(CDF_ERR_FORMAT, "checkpoint index '%s': tensor '%s' appears twice in weight_map",
                          index_path, ck->entries[i].name);
            goto done;
        }
    }
done:
    free(shards);
    cJSON_Delete(root);
    return s;
}

/* Folder listing of names with a suffix, sorted; *out malloc'd (free each name and the array). */
static cdf_status list_suffix(const char *dir, const char *suffix, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return cdf_error(CDF_ERR_IO, "cannot list folder '%s': %s", dir, strerror(errno));
    char **names = NULL;
    int count = 0, cap = 0;
    struct dirent *de;
    cdf_status s = CDF_OK;
    while ((de = readdir(d))) {
        if (!ends_with(de->d_name, suffix) || de->d_name[0] == '.') continue;
        char *p = join(dir, de->d_name);
        bool reg = p && is_file(p);
        free(p);
        if (!reg) continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) { s = CDF_ERR_OUT_OF_MEMORY; break; }
            names = nn;
        }
        if (!(names[count] = strdup(de->d_name))) { s = CDF_ERR_OUT_OF_MEMORY; break; }
        count++;
    }
    closedir(d);
    if (s != CDF_OK) {
        for (int i = 0; i < count; i++) free(names[i]);
        free(names);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "listing folder '%s': out of memory", dir);
    }
    if (count) qsort(names, (size_t)count, sizeof *names, cmp_str);
    *out = names;
    *n = count;
    return CDF_OK;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static cdf_status open_folder(cdf_checkpoint *ck, const char *dir) {
    for (size_t i = 0; i < sizeof k_index_names / sizeof *k_index_names; i++) {
        char *p = join(dir, k_index_names[i]);
        if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
        if (is_file(p)) {
            cdf_status s = open_index(ck, dir, p);
            free(p);
            return s;
        }
        free(p);
    }
    for (size_t i = 0; i < sizeof k_single_names / sizeof *k_single_names; i++) {
        char *p = join(dir, k_single_names[i]);
        if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
        if (is_file(p)) {
            int idx;
            cdf_status s = add_file(ck, p, &idx);
            free(p);
            return s != CDF_OK ? s : collect_all(ck);
        }
        free(p);
    }
    char **names;
    int n;
    CDF_TRY(list_suffix(dir, ".safetensors.index.json", &names, &n));
    if (n > 1) {
        cdf_status s = cdf_error(CDF_ERR_FORMAT,
                                 "checkpoint folder '%s' has %d index files ('%s', '%s', ...); cannot "
                                 "tell which one to use",
                                 dir, n, names[0], names[1]);
        free_list(names, n);
        return s;
    }
    if (n == 1) {
        char *p = join(dir, names[0]);
        free_list(names, n);
        if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
        cdf_status s = open_index(ck, dir, p);
        free(p);
        return s;
    }
    free_list(names, n);
    CDF_TRY(list_suffix(dir, ".safetensors", &names, &n));
    if (n == 0) {
        free_list(names, n);
        return cdf_error(CDF_ERR_NOT_FOUND,
                         "no safetensors weights in folder '%s' (looked for "
                         "diffusion_pytorch_model.safetensors, model.safetensors, "
                         "*.safetensors.index.json and *.safetensors)",
                         dir);
    }
    cdf_status s = CDF_OK;
    for (int i = 0; i < n && s == CDF_OK; i++) {
        char *p = join(dir, names[i]);
        if (!p) { s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "checkpoint: out of memory"); break; }
        int idx;
        s = add_file(ck, p, &idx);
        free(p);
    }
    free_list(names, n);
    return s != CDF_OK ? s : collect_all(ck);
}

cdf_status cdf_checkpoint_open(const char *path, cdf_checkpoint **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_checkpoint_open: out is NULL");
    *out = NULL;
    if (!path || !path[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_checkpoint_open: empty path");
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        if (err == ENOENT) return cdf_error(CDF_ERR_NOT_FOUND, "checkpoint '%s' does not exist", path);
        return cdf_error(CDF_ERR_IO, "cannot access checkpoint '%s': %s", path, strerror(err));
    }
    cdf_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_checkpoint_open: out of memory");
    }
    cdf_status s;
    if (S_ISDIR(st.st_mode)) {
        s = open_folder(ck, path);
    } else {
        int idx;
        s = add_file(ck, path, &idx);
        if (s == CDF_OK) s = collect_all(ck);
    }
    if (s != CDF_OK) {
        cdf_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return CDF_OK;
}

const char *cdf_checkpoint_path(const cdf_checkpoint *ck) { return ck ? ck->path : NULL; }
int cdf_checkpoint_count(const cdf_checkpoint *ck) { return ck ? ck->n : 0; }

const char *cdf_checkpoint_name_at(const cdf_checkpoint *ck, int i) {
    if (!ck || i < 0 || i >= ck->n) return NULL;
    return ck->entries[i].name;
}

cdf_status cdf_checkpoint_tensor_at(const cdf_checkpoint *ck, int i, const cdf_st_file **file,
                                    const cdf_st_tensor **t) {
    if (!ck || i < 0 || i >= ck->n)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_checkpoint_tensor_at: index %d outside 0..%d", i,
                         ck ? ck->n - 1 : -1);
    if (file) *file = ck->files[ck->entries[i].file];
    if (t) *t = ck->entries[i].t;
    return CDF_OK;
}

static const ck_entry *lookup(const cdf_checkpoint *ck, const char *name) {
    if (!ck || !name) return NULL;
    int lo = 0, hi = ck->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, ck->entries[mid].name);
        if (c == 0) return &ck->entries[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

bool cdf_checkpoint_has(const cdf_checkpoint *ck, const char *name) { return lookup(ck, name) != NULL; }

cdf_status cdf_checkpoint_find(const cdf_checkpoint *ck, const char *name, const cdf_st_file **file,
                               const cdf_st_tensor **t) {
    if (!ck || !name) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_checkpoint_find: NULL checkpoint or name");
    const ck_entry *e = lookup(ck, name);
    if (!e)
        return cdf_error(CDF_ERR_NOT_FOUND, "tensor '%s' not found in checkpoint '%s' (%d tensors)", name,
                         ck->path, ck->n);
    if (file) *file = ck->files[e->file];
    if (t) *t = e->t;
    return CDF_OK;
}

int cdf_checkpoint_file_count(const cdf_checkpoint *ck) { return ck ? ck->n_files : 0; }

const cdf_st_file *cdf_checkpoint_file_at(const cdf_checkpoint *ck, int i) {
    if (!ck || i < 0 || i >= ck->n_files) return NULL;
    return ck->files[i];
}
