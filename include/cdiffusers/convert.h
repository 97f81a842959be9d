/* cdiffusers — converting one component's weights to a GGUF file (`cdiffusers convert`).
 *
 * The component is read exactly as a pipeline load reads it (from its folder, or from a single
 * .safetensors / .gguf file in any layout the loader converts: BFL FLUX, Stability SD3, ComfyUI
 * prefixes, GGUF), and every tensor the model reads is written under its diffusers name, in the
 * order the model reads them, to a GGUF v3 file (32-byte alignment) that `--transformer FILE`
 * (cdf_component_file) loads back:
 *   - type F32: every tensor as F32 (GGUF blocks decoded);
 *   - type BF16: tensors of 2 or more dims as BF16, 1-d ones (norm weights, biases) as F32;
 *   - type Q8_0 / Q4_K: each linear layer's [out, in] weight whose rows are whole blocks (32 /
 *     256 values) is quantized with cdf_ggml_quantize: the same encoder as `--weight-type`, so the
 *     file gives bit for bit the generation of the folder loaded with that weight type. The other
 *     tensors (norms, biases, 1-d, convolutions, layers whose rows are not whole blocks) keep their
 *     stored dtype (F32, F16 or BF16; decoded GGUF blocks as F32), as city96's files keep them
 *     unquantized. A weight stored in the target block type already is copied, not re-encoded.
 * Metadata: general.architecture ("flux", "sd3", or the class name), general.quantization_version
 * 2, cdiffusers.class_name. The file is written to a temporary next to the output and renamed into
 * place: a failure leaves no partial file (and an existing output untouched).
 *
 * Memory: the component is loaded once to learn its tensors, with its repeated blocks' weights
 * left in the mapped checkpoint (as sequential offload does); then one tensor at a time is read,
 * converted and written. */
#ifndef CDIFFUSERS_CONVERT_H
#define CDIFFUSERS_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_convert_params {
    const char *model;        /* a pipeline folder (model_index.json), or a component's own folder */
    const char *component;    /* the pipeline's sub-folder to convert; default "transformer" */
    const char *weights_file; /* NULL: the folder's weights; else a .safetensors / .gguf file read
                                 in their place (the folder still gives config.json) */
    const char *output;       /* the .gguf file to write */
    uint32_t type;            /* CDF_GGML_F32 (default), CDF_GGML_BF16, CDF_GGML_Q8_0, CDF_GGML_Q4_K */
    bool overwrite;           /* replace an existing output file (else it is an error; folders are
                                 never replaced) */
    uint64_t max_shard_bytes; /* cdf_convert_to_diffusers: the largest safetensors shard; 0 = 4 GiB */
} cdf_convert_params;
cdf_convert_params cdf_convert_params_default(void);

typedef struct cdf_convert_report {
    int tensors;        /* written */
    int quantized;      /* of them, encoded to the block type */
    uint64_t file_bytes;
} cdf_convert_report;

/* Convert; report may be NULL. Returns CDF_OK, or:
 *   CDF_ERR_INVALID_ARG   a NULL/empty model or output, a type other than the four above;
 *   CDF_ERR_NOT_FOUND     the component folder, its config.json or the weights file is missing;
 *   CDF_ERR_UNSUPPORTED   the component's class is not one cdiffusers loads, or it holds a tensor
 *                         GGUF cannot take (an integer tensor);
 *   CDF_ERR_FORMAT, CDF_ERR_SHAPE  the weights do not load (missing, misshapen, malformed file);
 *   CDF_ERR_IO            the output cannot be created or written (the message names the path and
 *                         why: no such folder, not writable, disk full, file size limit); nothing
 *                         is left at the output path;
 *   CDF_ERR_OUT_OF_MEMORY host memory.
 * The message (cdf_last_error) names the file and tensor concerned. */
cdf_status cdf_convert_to_gguf(const cdf_convert_params *params, cdf_convert_report *report);

/* The same tensors as a diffusers component folder at params->output: config.json (copied) and
 * diffusion_pytorch_model.safetensors (model.safetensors for the transformers text encoders), or
 * shards of at most max_shard_bytes each ("-00001-of-0000N") with their .index.json, which the
 * loader reads as it reads diffusers' own. type: CDF_GGML_F32 or CDF_GGML_BF16 (2+ dims BF16, 1-d
 * F32) only. Useful to turn a single file (BFL, Stability, GGUF) into a folder. Built in a
 * temporary folder next to the output and renamed into place; an existing output is refused
 * (CDF_ERR_IO). Host memory: one shard. Return codes as cdf_convert_to_gguf (report->quantized 0,
 * file_bytes the tensors' bytes). */
cdf_status cdf_convert_to_diffusers(const cdf_convert_params *params, cdf_convert_report *report);

#ifdef __cplusplus
}
#endif

#endif
