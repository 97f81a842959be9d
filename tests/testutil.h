/* Shared helpers for the cmocka tests. Test data lives in tests/data (copied from the golden
 * set, see tests/data/README.md); CDF_TEST_DATA is its absolute path. */
#ifndef CDF_TESTUTIL_H
#define CDF_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* "<CDF_TEST_DATA>/<rel>" in a static rotating buffer (8 slots). */
const char *tu_data(const char *rel);
/* Whole file into a malloc'd NUL-terminated buffer (NULL on failure); *len if non-NULL. */
char *tu_read_file(const char *path, size_t *len);
/* The JSON document in file `path` (cJSON_Delete it); fails the test when it cannot be read or
 * parsed. */
struct cJSON *tu_read_json(const char *path);
/* Write bytes to a file; 0 on success. */
int tu_write_file(const char *path, const void *data, size_t len);
/* A fresh empty temporary directory (removed at exit); returns its path. */
const char *tu_tmpdir(void);
/* "<tu_tmpdir()>/<name>" in a static rotating buffer (8 slots). */
const char *tu_tmp_path(const char *name);
/* max |a-b| over n floats; also the index of the worst element. */
double tu_max_abs_diff(const float *a, const float *b, size_t n, size_t *worst);
/* Fill with deterministic pseudo-random values in [-1, 1) (xorshift; seed != 0). */
void tu_fill_random(float *x, size_t n, uint64_t seed);
/* Run a shell command and return its exit status (-1 if it could not run). */
int tu_system(const char *fmt, ...);


/* ---- helpers for model tests (component loading and output comparison) ---- */
#include "cdiffusers/tensor.h"
#include "models/component.h"
/* The cpu device (fails the test if absent). */
cdf_device *tu_cpu(void);
/* The device the golden model and pipeline tests run on: cdf_device_default(), which is
 * $CDIFFUSERS_DEVICE when set (scripts/test.sh runs them again with CDIFFUSERS_DEVICE=pjrt). */
cdf_device *tu_device(void);
/* Whether tu_device() is the cpu backend's (checks of the cpu kernels' own counters apply). */
bool tu_device_is_cpu(void);
/* Every tensor of tests/data/<rel> onto the cpu (fails the test on error). */
void tu_load_map(cdf_tensor_map *m, const char *rel);
/* cdf_component_load of dir with the given weight dtype (fails the test on error). */
cdf_component *tu_load_component(const char *dir, cdf_dtype weight_dtype);
/* The cpu kernels' attention calls so far ([0] f32 q/k/v, [1] bf16: kernels/dispatch.h), and the
 * check that the calls since `before` all ran the policy weights of weight_dtype ask for: bf16
 * q, k, v exactly when the projections compute in bf16 (fails the test otherwise). */
void tu_attention_counts(int64_t out[2]);
void tu_expect_attention_policy(const int64_t before[2], cdf_dtype weight_dtype, const char *what);
/* max |got - want| after checking both exist and have the same shape (fails otherwise). */
double tu_diff_tensors(cdf_tensor *got, cdf_tensor *want, const char *what);
/* Device bytes the cpu device holds now (after a synchronize). */
uint64_t tu_device_bytes(void);
/* The formats tests' generation: "a red square", 64x64, 2 steps, seed 7 (FLUX.2: text encoder
 * layers 1, 2, 3 of the tiny Mistral), of a loaded pipeline;
 * the f32 values of the intermediate `key` ("latents_final", "vae_decode_output", ...),
 * malloc'd, *n of them (fails the test on error). */
struct cdf_pipeline;
float *tu_generate_capture(struct cdf_pipeline *p, const char *key, size_t *n);
/* tests/data/pipelines/<name> loaded with the default load parameters (fails the test on error). */
struct cdf_pipeline *tu_load_tiny_pipeline(const char *name);
#endif
