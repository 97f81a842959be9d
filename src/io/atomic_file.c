/* Atomic file creation: write "<path>.tmp.XXXXXX" next to the target, then rename it into place,
 * so readers never see a half-written output and a failure never damages an existing file. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct cdf_atomic_file {
    char *path;
    char *tmp_path;
    FILE *fp;
    bool overwrite;
};

char *cdf_io_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

/* Explains why a file could not be created in its folder: the folder is the usual culprit. */
cdf_status cdf_io_create_error(const char *what, const char *path, int err) {
    char *dir = cdf_io_dirname(path);
    const char *d = dir ? dir : "?";
    cdf_status s;
    switch (err) {
    case ENOENT: {
        /* usually a missing folder, but pseudo filesystems (/proc) also answer ENOENT */
        struct stat st;
        if (dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
            s = cdf_error(CDF_ERR_IO, "cannot create %s '%s': folder '%s' does not accept new files (%s)",
                          what, path, d, strerror(err));
        else
            s = cdf_error(CDF_ERR_IO, "cannot create %s '%s': folder '%s' does not exist (%s)", what,
                          path, d, strerror(err));
        break;
    }
    case ENOTDIR:
        s = cdf_error(CDF_ERR_IO, "cannot create %s '%s': a component of '%s' is not a folder (%s)",
                      what, path, d, strerror(err));
        break;
    case EACCES:
    case EPERM:
    case EROFS:
        s = cdf_error(CDF_ERR_IO, "cannot create %s '%s': folder '%s' is not writable (%s)", what,
                      path, d, strerror(err));
        break;
    default:
        s = cdf_error(CDF_ERR_IO, "cannot create %s '%s': %s", what, path, strerror(err));
        break;
    }
    free(dir);
    return s;
}

static cdf_status exists_error(const char *path) {
    return cdf_error(CDF_ERR_IO,
                     "output file '%s' already exists; refusing to overwrite it (use --force to "
                     "replace it)",
                     path);
}

cdf_status cdf_atomic_file_open(const char *path, bool overwrite, cdf_atomic_file **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_atomic_file_open: out is NULL");
    *out = NULL;
    if (!path || !path[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_atomic_file_open: empty path");
    size_t plen = strlen(path);
    if (path[plen - 1] == '/')
        return cdf_error(CDF_ERR_INVALID_ARG, "output path '%s' names a folder, not a file", path);

    struct stat st;
    if (lstat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return cdf_error(CDF_ERR_IO, "output path '%s' is an existing folder", path);
        if (!overwrite) return exists_error(path);
    }

    cdf_atomic_file *af = calloc(1, sizeof *af);
    char *tmp = malloc(plen + 16);
    char *p = strdup(path);
    if (!af || !tmp || !p) {
        free(af); free(tmp); free(p);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_atomic_file_open: out of memory");
    }
    /* O_EXCL with our own random suffix (not mkstemp) so the final file gets 0666 & ~umask
     * like any other created file instead of mkstemp's 0600. */
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^
                    (uint64_t)(uintptr_t)af;
    int fd = -1, err = 0;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        char suffix[7];
        for (int i = 0; i < 6; i++) {
            seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
            suffix[i] = alphabet[seed % (sizeof alphabet - 1)];
        }
        suffix[6] = 0;
        snprintf(tmp, plen + 16, "%s.tmp.%s", path, suffix);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            err = errno;
            if (err != EEXIST) break;
        }
    }
    if (fd < 0) {
        free(af); free(tmp); free(p);
        return cdf_io_create_error("file", path, err);
    }
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        err = errno;
        close(fd);
        unlink(tmp);
        free(af); free(tmp); free(p);
        return cdf_error(CDF_ERR_IO, "cannot open stream for '%s': %s", path, strerror(err));
    }
    af->path = p;
    af->tmp_path = tmp;
    af->overwrite = overwrite;
    *out = af;
    return CDF_OK;
}

FILE *cdf_atomic_file_stream(cdf_atomic_file *af) { return af ? af->fp : NULL; }
const char *cdf_atomic_file_temp_path(const cdf_atomic_file *af) { return af ? af->tmp_path : NULL; }

static void af_free(cdf_atomic_file *af) {
    free(af->path);
    free(af->tmp_path);
    free(af);
}

void cdf_atomic_file_abort(cdf_atomic_file *af) {
    if (!af) return;
    if (af->fp) fclose(af->fp);
    unlink(af->tmp_path);
    af_free(af);
}

/* Rename that refuses to replace an existing target: renameat2(RENAME_NOREPLACE) where the
 * filesystem supports it, else link()+unlink() (also atomic), else a check-then-rename. */
static int rename_noreplace(const char *from, const char *to) {
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;
#endif
    if (link(from, to) == 0) {
        unlink(from);
        return 0;
    }
    if (errno == EEXIST) return -1;
    struct stat st;
    if (lstat(to, &st) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

cdf_status cdf_atomic_file_commit(cdf_atomic_file *af) {
    if (!af) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_atomic_file_commit: NULL file");
    FILE *fp = af->fp;
    af->fp = NULL;
    int err = 0;
    if (ferror(fp)) err = EIO;
    if (fflush(fp) != 0 && !err) err = errno;
    if (fsync(fileno(fp)) != 0 && !err && errno != EINVAL) err = errno;
    if (fclose(fp) != 0 && !err) err = errno;
    if (err) {
        unlink(af->tmp_path);
        cdf_status s = cdf_error(CDF_ERR_IO, "writing '%s' failed: %s", af->path, strerror(err));
        af_free(af);
        return s;
    }
    int rc = af->overwrite ? rename(af->tmp_path, af->path) : rename_noreplace(af->tmp_path, af->path);
    if (rc != 0) {
        err = errno;
        unlink(af->tmp_path);
        cdf_status s = err == EEXIST ? exists_error(af->path)
                                     : cdf_error(CDF_ERR_IO, "cannot rename '%s' to '%s': %s",
                                                 af->tmp_path, af->path, strerror(err));
        af_free(af);
        return s;
    }
    /* make the rename itself durable (best effort: some filesystems refuse fsync on dirs) */
    char *dir = cdf_io_dirname(af->path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    af_free(af);
    return CDF_OK;
}
