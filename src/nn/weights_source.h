/* Where cdf_weights finds a tensor by its diffusers name: a diffusers checkpoint folder (or one
 * .safetensors file in diffusers layout), or a single-file checkpoint in another layout
 * (.safetensors or .gguf, BFL FLUX.1 / FLUX.2 or Stability SD3/SD3.5 transformer key names with or without
 * ComfyUI's "model.diffusion_model." prefix, LDM VAE names bare or under "first_stage_model." /
 * "vae."; text encoders under ComfyUI's / Stability's "text_encoders.{clip_l,clip_g,t5xxl}.transformer."
 * prefixes; an all-in-one file may hold several) whose tensors are renamed, split and reordered the way
 * diffusers' single_file_utils converts them, with sizes taken from the tensors' shapes.
 *
 * A tensor comes back either as a zero-copy view of mapped bytes (a plain safetensors tensor,
 * a row slice of one, an F32/F16/BF16 GGUF tensor) or as a host buffer the source made: a
 * dequantized GGUF tensor (f32), an fp8 weight multiplied by its "scale_weight" (f32), a
 * tensor with its halves swapped (swap_scale_shift). */
#ifndef CDF_NN_WEIGHTS_SOURCE_H
#define CDF_NN_WEIGHTS_SOURCE_H

#include "cdiffusers/io.h"

typedef struct cdf_wsrc cdf_wsrc;

typedef struct cdf_wsrc_tensor {
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS];
    cdf_dtype dtype;   /* of the values cdf_wsrc_load returns (f32 for dequantized ones) */
    bool zero_copy;    /* cdf_wsrc_load returns mapped bytes that live as long as the source */
    int qtype;         /* GGUF block type the values are stored in (cdf_wsrc_load decodes them;
                          cdf_wsrc_load_blocks gives the blocks), -1 for plain values */
    /* private */
    char src_name[512];
    const char *prefix;  /* of src_name in the file */
    int64_t row0, nrows; /* dim-0 slice of the source tensor (nrows -1: all) */
    bool swap_halves;
    bool identity;       /* no source tensor: the [n, n] identity (SD3 CLIP-L's text_projection) */
    void *owned;
    const void *mapped;    /* zero-copy values: their pages, dropped by cdf_wsrc_tensor_release */
    uint64_t mapped_bytes;
} cdf_wsrc_tensor;

/* A folder or a diffusers-layout .safetensors file (cdf_checkpoint_open) or, for a path ending
 * in .gguf or a .safetensors file in another layout, a converted single file. single_file: the
 * path is a component file given in place of a folder's (its unused tensors are tracked).
 * part: for a text encoder, which one of an all-in-one file's "text_encoders.<part>.transformer."
 * parts it is ("clip_l", "clip_g", "t5xxl"); NULL for other components. A file without
 * text_encoders.* names ignores it. */
cdf_status cdf_wsrc_open(const char *path, bool single_file, const char *part, cdf_wsrc **out);
void cdf_wsrc_close(cdf_wsrc *s);
/* The checkpoint behind a diffusers-layout source (NULL for converted files and GGUF). */
cdf_checkpoint *cdf_wsrc_checkpoint(cdf_wsrc *s);
/* "diffusers", "BFL FLUX (safetensors)", "GGUF (BFL FLUX keys)", ... for messages and `info`. */
const char *cdf_wsrc_format(const cdf_wsrc *s);

/* Looks the diffusers name up: false (no error recorded) if the source has no such tensor. */
bool cdf_wsrc_find(cdf_wsrc *s, const char *name, cdf_wsrc_tensor *t);
/* The values (t->dtype, contiguous); NULL with an error on failure. Valid until
 * cdf_wsrc_tensor_release (owned buffers) or cdf_wsrc_close (mapped bytes). Values copied out of
 * the file's mapping release the mapped pages they were read from at once. */
const void *cdf_wsrc_load(cdf_wsrc *s, cdf_wsrc_tensor *t, const char *name);
/* The stored blocks of a quantized tensor (t->qtype >= 0), dim-0 rows whole: *row_bytes per row,
 * t->shape[0] rows, contiguous. Mapped bytes, or a buffer owned by t (rows reordered). */
const void *cdf_wsrc_load_blocks(cdf_wsrc *s, cdf_wsrc_tensor *t, const char *name, int64_t *row_bytes);
/* Frees an owned buffer and, for mapped (zero-copy) values, lets the kernel drop their pages from
 * this process (cdf_io_drop_pages): call it once the values are copied. Mapped bytes stay
 * readable until cdf_wsrc_close (a later read faults them in again), so a caller that keeps
 * pointing at them (sequential offload's host-side weights) simply does not call it. */
void cdf_wsrc_tensor_release(cdf_wsrc_tensor *t);

/* For a missing-weight message: when nothing has been found in a single file yet, a sentence
 * saying that the file does not look like this model (its layout and first tensor names);
 * else "". */
const char *cdf_wsrc_missing_hint(cdf_wsrc *s);

/* "84 tensors, 0.54 MB: 56 F32, 28 Q8_0" (counts per stored type, in the file's units). */
void cdf_wsrc_summary(const cdf_wsrc *s, char *buf, size_t n);

/* Source tensors that no cdf_wsrc_find has used so far (their original names), as one
 * comma-separated malloc'd string; NULL if there are none. Only single files keep track (a
 * diffusers folder may carry tensors a model does not read). Another component's part of an
 * all-in-one file (under "vae.", "model.diffusion_model.", "text_encoders.", ... when this
 * component read none of it) does not count. */
char *cdf_wsrc_unused(const cdf_wsrc *s, int *count);

#endif
