/* `cdiffusers devices`: the backends compiled in, the devices they found, and for a backend
 * with none, why. */
#include <stdio.h>
#include <string.h>

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
    return 0;
}
