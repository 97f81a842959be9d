/* `cdiffusers convert --model DIR [--component NAME] [--transformer|--vae|--weights FILE]
 *  --output OUT.gguf --type f32|bf16|q8_0|q4_k [--force] [--quiet]`: cdf_convert_to_gguf;
 *  `--format diffusers --output DIR [--type f32|bf16]`: cdf_convert_to_diffusers. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "common.h"
#include "convert.h"

int cdf_cli_convert(int argc, char **argv) {
    enum { O_MODEL = 1, O_COMPONENT, O_WEIGHTS, O_TRANSFORMER, O_VAE, O_OUTPUT, O_TYPE, O_FORCE, O_QUIET, O_FORMAT };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},         {"component", required_argument, 0, O_COMPONENT},
        {"weights", required_argument, 0, O_WEIGHTS},     {"transformer", required_argument, 0, O_TRANSFORMER},
        {"vae", required_argument, 0, O_VAE},             {"output", required_argument, 0, O_OUTPUT},
        {"type", required_argument, 0, O_TYPE},           {"force", no_argument, 0, O_FORCE},
        {"quiet", no_argument, 0, O_QUIET},               {"format", required_argument, 0, O_FORMAT},
        {0, 0, 0, 0}};
    cdf_convert_params p = cdf_convert_params_default();
    const char *type = NULL, *file_for = NULL;
    bool quiet = false, diffusers = false;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: p.model = optarg; break;
        case O_COMPONENT: p.component = optarg; break;
        case O_WEIGHTS: p.weights_file = optarg; break;
        case O_TRANSFORMER:
        case O_VAE:
            if (file_for) return cdf_cli_usage_error("convert writes one component: give one of --transformer, --vae%s", "");
            file_for = c == O_VAE ? "vae" : "transformer";
            p.weights_file = optarg;
            break;
        case O_OUTPUT: p.output = optarg; break;
        case O_TYPE: type = optarg; break;
        case O_FORCE: p.overwrite = true; break;
        case O_QUIET: quiet = true; break;
        case O_FORMAT:
            if (strcmp(optarg, "gguf") != 0 && strcmp(optarg, "diffusers") != 0)
                return cdf_cli_usage_error("convert --format %s: must be gguf or diffusers", optarg);
            diffusers = optarg[0] == 'd';
            break;
        default: return cdf_cli_usage_error("convert: unknown option%s", "");
        }
    }
    if (optind < argc) return cdf_cli_usage_error("convert: unexpected argument '%s'", argv[optind]);
    if (!p.model) return cdf_cli_usage_error("convert needs --model DIR%s", "");
    if (!p.output) return cdf_cli_usage_error("convert needs --output FILE.gguf%s", "");
    if (file_for) p.component = file_for;
    if (!type || strcmp(type, "f32") == 0) p.type = CDF_GGML_F32;
    else if (strcmp(type, "bf16") == 0) p.type = CDF_GGML_BF16;
    else if (strcmp(type, "q8_0") == 0) p.type = CDF_GGML_Q8_0;
    else if (strcmp(type, "q4_k") == 0) p.type = CDF_GGML_Q4_K;
    else return cdf_cli_usage_error("convert --type %s: must be f32, bf16, q8_0 or q4_k", type);
    if (diffusers && p.type != CDF_GGML_F32 && p.type != CDF_GGML_BF16)
        return cdf_cli_usage_error("convert --format diffusers --type %s: a diffusers folder takes f32 or bf16", type);
    /* a file-size limit (ulimit -f) becomes a write error (EFBIG) that removes the temporary,
     * instead of a SIGXFSZ that would kill the process and leave it behind */
    signal(SIGXFSZ, SIG_IGN);
    cdf_convert_report r;
    cdf_status s = diffusers ? cdf_convert_to_diffusers(&p, &r) : cdf_convert_to_gguf(&p, &r);
    if (s != CDF_OK) {
        fprintf(stderr, "cdiffusers: convert: %s\n", cdf_last_error());
        return 1;
    }
    if (!quiet && r.quantized)
        fprintf(stderr, "cdiffusers: wrote %s: %d tensors (%d as %s, the others float), %.1f MiB\n", p.output, r.tensors,
                r.quantized, cdf_ggml_type_name(p.type), (double)r.file_bytes / 1048576.0);
    else if (!quiet)
        fprintf(stderr, "cdiffusers: wrote %s: %d tensors, %.1f MiB\n", p.output, r.tensors, (double)r.file_bytes / 1048576.0);
    return 0;
}
