/* cdiffusers — a checkpoint: one model component's weights as a .safetensors file or a folder of
 * (possibly sharded) ones. Part of the model-file IO layer (cdiffusers/io.h). An opened
 * cdf_checkpoint is immutable: any number of threads may read from it. */
#ifndef CDIFFUSERS_CHECKPOINT_H
#define CDIFFUSERS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------
 * Checkpoint folder (one model component, e.g. "transformer/")
 *
 * cdf_checkpoint_open(path) accepts, in this order of preference:
 *   1. a path to a single .safetensors file;
 *   2. a folder with diffusion_pytorch_model.safetensors.index.json or
 *      model.safetensors.index.json (sharded: weight_map tensor -> shard file);
 *   3. a folder with diffusion_pytorch_model.safetensors or model.safetensors;
 *   4. a folder with exactly one *.safetensors.index.json;
 *   5. a folder with one or more *.safetensors files and no index (merged; a tensor name in two
 *      files is an error).
 * Shards are opened (mmap + header validation) eagerly, so every problem surfaces at open:
 * a shard name that is not a plain file name (contains '/' or '\\', or is "." or ".."),
 * a missing shard (CDF_ERR_NOT_FOUND), a mapped tensor absent from its shard (CDF_ERR_FORMAT).
 * The tensor list of a sharded checkpoint is the index's weight_map; tensors a shard holds but
 * the index does not map are not visible. Variant files (*.fp16.safetensors) get no special
 * treatment. Errors: CDF_ERR_NOT_FOUND (no weights found), plus those of cdf_st_open and
 * cdf_json_load_file.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_checkpoint cdf_checkpoint;

cdf_status cdf_checkpoint_open(const char *path, cdf_checkpoint **out);
void cdf_checkpoint_close(cdf_checkpoint *ck); /* NULL is fine */
const char *cdf_checkpoint_path(const cdf_checkpoint *ck);
/* Tensor names, sorted (strcmp order). */
int cdf_checkpoint_count(const cdf_checkpoint *ck);
const char *cdf_checkpoint_name_at(const cdf_checkpoint *ck, int i);
/* i-th tensor in name order with its file; CDF_ERR_INVALID_ARG if i is out of range. */
cdf_status cdf_checkpoint_tensor_at(const cdf_checkpoint *ck, int i, const cdf_st_file **file,
                                    const cdf_st_tensor **t);
/* CDF_ERR_NOT_FOUND (message names the tensor and the folder) if absent. file may be NULL. */
cdf_status cdf_checkpoint_find(const cdf_checkpoint *ck, const char *name,
                               const cdf_st_file **file, const cdf_st_tensor **t);
bool cdf_checkpoint_has(const cdf_checkpoint *ck, const char *name); /* no error recorded */
int cdf_checkpoint_file_count(const cdf_checkpoint *ck);
const cdf_st_file *cdf_checkpoint_file_at(const cdf_checkpoint *ck, int i);

#ifdef __cplusplus
}
#endif
#endif
