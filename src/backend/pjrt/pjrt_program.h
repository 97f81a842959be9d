/* Nodes -> one StableHLO program (MLIR text), the lowering of the values kind of backend.
 *
 * A PJRT buffer is an immutable, shaped value: no byte offsets, no writes in place. The program
 * sees each storage as one flat value (dtype[n], n = its bytes / the dtype's size) and turns
 * every operand view (offset, shape, strides) into slice / reshape / transpose / broadcast of it
 * (a gather where the strides do not nest), and every write into a view into a
 * dynamic_update_slice (a scatter where they do not nest) whose result is the storage's next
 * value. Float node parameters that change between calls (a fill value, a unary op's scale or
 * shift, a matmul's alpha, a softmax or attention scale) are program arguments, never text, so
 * the text (the cache key) of a denoising step is the same at every step; parameters fixed by
 * the model (eps, the timestep embedding's frequencies) stay in the text.
 *
 * Numerics are the cpu backend's (kernels/kernels.h, dispatch.h): f32 arithmetic; a matmul or
 * convolution with bf16 weights and f32 activations rounds the activations to bf16 and
 * multiplies bf16 x bf16 with an f32 result; f32 x f32 at HIGHEST precision; attention on bf16
 * q, k, v rounds P to bf16 before P V; everything stored rounds once to the destination dtype. */
#ifndef CDF_BACKEND_PJRT_PROGRAM_H
#define CDF_BACKEND_PJRT_PROGRAM_H

#include "graph/node.h"

typedef enum cdf_pjrt_arg_kind { CDF_PJRT_ARG_STORAGE, CDF_PJRT_ARG_F32 } cdf_pjrt_arg_kind;

/* One argument of a program: a storage's current value as flat dtype[n], or a float parameter. */
typedef struct cdf_pjrt_arg {
    cdf_pjrt_arg_kind kind;
    cdf_storage *st;
    cdf_dtype dt;
    int64_t n;
    float value;
} cdf_pjrt_arg;

/* One result: the storage's next value, flat dtype[n]. */
typedef struct cdf_pjrt_out {
    cdf_storage *st;
    cdf_dtype dt;
    int64_t n;
} cdf_pjrt_out;

/* An embedding's ids, checked on the host before the program runs where they still are host
 * bytes (the usual case: token ids uploaded from the tokenizer): a program cannot fail on a bad
 * index (XLA clamps it), and a silently clamped id would be a wrong picture. The view is copied
 * (its storage stays the node's). */
typedef struct cdf_pjrt_id_check {
    cdf_tensor ids;
    int64_t rows;
} cdf_pjrt_id_check;

typedef struct cdf_pjrt_program {
    char *text; /* MLIR, NUL-terminated */
    size_t len;
    cdf_pjrt_arg *args;
    int n_args;
    cdf_pjrt_out *outs;
    int n_outs;
    cdf_pjrt_id_check *checks;
    int n_checks;
} cdf_pjrt_program;

/* Which storages the program keeps to itself: their values never leave it (a compile capture's
 * unmaterialised buffers, the intermediates only the nodes of a deferred graph hold). Every other
 * storage a node writes is a result. */
typedef bool (*cdf_pjrt_internal_fn)(void *ctx, const cdf_storage *st);

/* Build the program for nodes[0..n) in order. Fails with CDF_ERR_UNSUPPORTED naming the op for
 * what has no lowering (a collective, a GGUF-quantized matmul, a matmul epilogue). */
cdf_status cdf_pjrt_program_build(cdf_node *const *nodes, int n, cdf_pjrt_internal_fn internal, void *ctx,
                                  cdf_pjrt_program *out);
void cdf_pjrt_program_free(cdf_pjrt_program *p);

/* Whether one node has a lowering (the backend's `supports`). */
bool cdf_pjrt_program_supports(const cdf_node *n);

/* A program turning flat from[n_from] into the same bytes as flat to[n_to] (a storage read
 * with another dtype than the one its buffer has). */
cdf_status cdf_pjrt_program_bitcast(cdf_dtype from, int64_t n_from, cdf_dtype to, int64_t n_to, cdf_pjrt_program *out);

#endif
