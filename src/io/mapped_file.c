/* Read-only whole-file mappings for the weight-file readers (safetensors, GGUF). */
#include "core/error_internal.h"
#include "io/io_internal.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

cdf_status cdf_io_map_file(const char *path, const char *kind, size_t min_bytes, const char *min_what, int *fd,
                           const uint8_t **map, size_t *size) {
    *fd = -1;
    *map = NULL;
    *size = 0;
    int d = open(path, O_RDONLY | O_CLOEXEC);
    if (d < 0) {
        int err = errno;
        return err == ENOENT ? cdf_error(CDF_ERR_NOT_FOUND, "%s file '%s' does not exist", kind, path)
                             : cdf_error(CDF_ERR_IO, "cannot open %s file '%s': %s", kind, path, strerror(err));
    }
    struct stat st;
    cdf_status s = CDF_OK;
    if (fstat(d, &st) != 0) s = cdf_error(CDF_ERR_IO, "cannot stat %s file '%s': %s", kind, path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = cdf_error(CDF_ERR_IO, "%s file '%s': not a regular file", kind, path);
    else if ((size_t)st.st_size < min_bytes)
        s = cdf_error(CDF_ERR_FORMAT, "%s file '%s': file is %zu bytes, shorter than %s (truncated?)", kind, path,
                      (size_t)st.st_size, min_what);
    if (s != CDF_OK) {
        close(d);
        return s;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, d, 0);
    if (m == MAP_FAILED) {
        s = cdf_error(CDF_ERR_IO, "cannot mmap %s file '%s' (%zu bytes): %s", kind, path, (size_t)st.st_size,
                      strerror(errno));
        close(d);
        return s;
    }
    *fd = d;
    *map = m;
    *size = (size_t)st.st_size;
    return CDF_OK;
}

void cdf_io_drop_pages(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (!p || page <= 0) return;
    uintptr_t a = (uintptr_t)p, end = a + n, ps = (uintptr_t)page;
    uintptr_t lo = (a + ps - 1) / ps * ps, hi = end / ps * ps;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
