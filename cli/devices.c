/* `cdiffusers devices`: the backends compiled in, the devices they found, and for a backend
 * with none, why. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/dist.h"
#include "cdiffusers/cdiffusers.h"
#include "devices.h"

static void print_bytes(uint64_t b) {
    if (!b) printf("memory unknown");
    else printf("%.1f GiB", b / 1073741824.0);
}

int cdf_cli_devices(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: cdiffusers devices\n  lists the compiled-in backends and the devices they found; the first\n"
                   "  device is the default (--device NAME on generate / run-model picks another)\n");
            return 0;
        }
        fprintf(stderr, "cdiffusers: devices: unexpected argument '%s'\n", argv[i]);
        return 2;
    }
    /* PJRT plugins: each found one's API version; the one `--device pjrt` opens is loaded so
     * that its devices are listed below (libtpu only when CDIFFUSERS_PJRT_PLUGIN names it) */
    cdf_pjrt_plugin_info plugins[8];
    int np = cdf_pjrt_list_plugins(plugins, 8);
    bool open_pjrt = false;
    for (int i = 0; i < np && i < 8; i++) {
        const cdf_pjrt_plugin_info *p = &plugins[i];
        printf("  pjrt plugin: %s (%s", p->path, p->package);
        if (p->api_major >= 0) printf(", PJRT API %d.%d", p->api_major, p->api_minor);
        printf(")%s%s%s\n", p->chosen ? "  [--device pjrt]" : "", p->note[0] ? ": " : "", p->note);
        open_pjrt |= p->chosen && p->api_major >= 0;
    }
    if (open_pjrt && !cdf_device_get("pjrt")) printf("  pjrt: %s\n", cdf_last_error());
    printf("backends compiled in:");
    for (int i = 0; i < cdf_backend_compiled_count(); i++) printf(" %s", cdf_backend_compiled_name(i));
    printf("\n");
    for (int i = 0; i < cdf_backend_compiled_count(); i++) {
        const char *why = cdf_backend_why_no_device(i);
        if (why) printf("  %s: no device (%s)\n", cdf_backend_compiled_name(i), why);
    }
    printf("devices:\n");
    for (int i = 0; i < cdf_device_count(); i++) {
        cdf_device *d = cdf_device_at(i);
        cdf_device_info info;
        if (cdf_device_get_info(d, &info) != CDF_OK) continue;
        printf("  %-8s %s%s\n           ", cdf_device_name(d), info.description, i == 0 ? "  [default]" : "");
        print_bytes(info.memory_bytes);
        printf("; %s; memory %s\n", info.features, info.host_visible ? "shared with the host" : "separate (discrete)");
    }
    if (cdf_device_count() == 0) {
        printf("  (none)\n");
        return 1;
    }
    /* which path tensor parallelism takes on each kind of device */
    printf("tensor parallelism (--tp N):\n");
    for (int i = 0; i < cdf_backend_compiled_count(); i++) {
        const char *b = cdf_backend_compiled_name(i);
        if (cdf_backend_runs_replicas(b))
            printf("  %-8s one process: --tp N --device %s runs every program as N replicas on %s:0..N-1, the all-reduce "
                   "inside it (the XLA CPU plugin is opened with N devices); under mpirun -np N: one device per process, the "
                   "all-reduce on the host between programs\n", b, b, b);
        else
            printf("  %-8s mpirun -np N cdiffusers ... --tp N: one process per device, the all-reduce over MPI%s\n", b,
                   cdf_dist_backend_available("mpi") ? "" : " (this build has no MPI)");
    }
    return 0;
}

/* `cdiffusers cache list|clear`: the pjrt backend's compiled programs on disk. */
int cdf_cli_cache(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "--help") || !strcmp(what, "-h") || (strcmp(what, "list") && strcmp(what, "clear")) || argc > 2) {
        FILE *f = !strcmp(what, "--help") || !strcmp(what, "-h") ? stdout : stderr;
        fprintf(f, "usage: cdiffusers cache list|clear\n"
                   "  the pjrt backend's compiled programs on disk ($CDIFFUSERS_PJRT_CACHE, else\n"
                   "  $XDG_CACHE_HOME/cdiffusers/pjrt, else ~/.cache/cdiffusers/pjrt): list them, or remove them all\n");
        return f == stdout ? 0 : 2;
    }
    char dir[1024];
    cdf_pjrt_cache_folder(dir, sizeof dir);
    if (!dir[0]) {
        printf("the pjrt program cache is off (CDIFFUSERS_PJRT_CACHE=off, or no pjrt backend in this build)\n");
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d) {
        printf("%s: no cache yet\n", dir);
        return 0;
    }
    int n = 0;
    unsigned long long total = 0, removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".pjrtx")) continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st)) continue;
        n++;
        total += (unsigned long long)st.st_size;
        if (!strcmp(what, "clear")) {
            if (!unlink(p)) removed += (unsigned long long)st.st_size;
        } else {
            char when[32];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime(&st.st_mtime));
            printf("  %s  %9.1f KiB  last used %s\n", e->d_name, st.st_size / 1024.0, when);
        }
    }
    closedir(d);
    if (!strcmp(what, "clear")) printf("%s: removed %d programs, %.1f MiB\n", dir, n, removed / 1048576.0);
    else printf("%s: %d programs, %.1f MiB\n", dir, n, total / 1048576.0);
    return 0;
}
