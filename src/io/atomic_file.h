/* Atomic file creation: written under a temporary name, renamed into place (private: used by
 * the writers of io/ and by the CLI). */
#ifndef CDF_IO_ATOMIC_FILE_H
#define CDF_IO_ATOMIC_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "cdiffusers/error.h"

/* ------------------------------------------------------------------------------------------
 * Atomic file creation (used by the writers of io/; usable for any output)
 *
 * open: creates "<path>.tmp.XXXXXX" in the same folder (mode 0666 & ~umask).
 * commit: flush + fsync + close, then rename over path (or, without overwrite, a rename that
 *   fails if path appeared meanwhile); fsyncs the folder. Frees af whether or not it succeeds;
 *   on failure the temporary file is removed.
 * abort: removes the temporary file and frees af (NULL is fine).
 * If the process dies in between, a stale *.tmp.XXXXXX file can remain; nothing else changes.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_atomic_file cdf_atomic_file;

cdf_status cdf_atomic_file_open(const char *path, bool overwrite, cdf_atomic_file **out);
FILE *cdf_atomic_file_stream(cdf_atomic_file *af);
const char *cdf_atomic_file_temp_path(const cdf_atomic_file *af);
cdf_status cdf_atomic_file_commit(cdf_atomic_file *af);
void cdf_atomic_file_abort(cdf_atomic_file *af);

#endif
