/* generate's inputs and outputs beyond one prompt -> one PNG (cli/batch.c): --image / --mask
 * (img2img, inpainting), --num-images / --batch-seeds (batches), --prompts-file (one prompt per
 * line, the loaded model reused), numbered outputs (out-000.png, ...) with the parameters of each
 * image in its PNG. */
#ifndef CDF_CLI_BATCH_H
#define CDF_CLI_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/cdiffusers.h"

#define CDF_CLI_MAX_SEEDS 256
#define CDF_CLI_MAX_IMAGES 16 /* --image given more often is a usage error; the pipeline says how many it takes */

typedef struct cdf_cli_gen {
    /* from the command line */
    const char *output, *latents_out, *model, *dtype, *mask_path, *prompts_file;
    const char *image_paths[CDF_CLI_MAX_IMAGES]; /* --image (FLUX.2: several reference images) */
    int n_images;
    bool force, quiet;
    uint64_t seeds[CDF_CLI_MAX_SEEDS];
    int n_seeds;
    /* owned, filled by cdf_cli_gen_prepare */
    char **prompts;
    int n_prompts;
    cdf_png_image image_png[CDF_CLI_MAX_IMAGES], mask_png;
    cdf_image image[CDF_CLI_MAX_IMAGES], mask;
} cdf_cli_gen;

/* "1,2,3" -> seeds; false on anything but 1..CDF_CLI_MAX_SEEDS non-negative integers. */
bool cdf_cli_parse_seeds(const char *s, cdf_cli_gen *g);
/* Read the image, mask and prompts file and point gp at them (image/mask/seeds); a clear error
 * naming the file on failure. */
cdf_status cdf_cli_gen_prepare(cdf_cli_gen *g, cdf_generate_params *gp);
/* Refuse before any work: an existing output without --force, an unwritable destination, or
 * --latents-out with more than one image. */
cdf_status cdf_cli_gen_check_outputs(const cdf_cli_gen *g, const cdf_generate_params *gp);
/* Generate every prompt's images and (writer) write them; *generating tells the caller whether a
 * failure happened while generating (true) or while writing. */
cdf_status cdf_cli_gen_run(const cdf_cli_gen *g, cdf_pipeline *pipe, cdf_generate_params *gp, bool writer, bool *generating);
void cdf_cli_gen_free(cdf_cli_gen *g);

bool cdf_cli_file_exists(const char *p);
/* Create and remove the temporary file the writer will use (a missing, unwritable or non-folder
 * destination is reported before minutes of work, not after). */
bool cdf_cli_output_writable(const char *path, bool overwrite);

#endif
