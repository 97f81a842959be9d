/* cdiffusers — umbrella header. Runs Hugging Face diffusers text-to-image pipelines (FLUX.1,
 * Stable Diffusion 3/3.5 and FLUX.2) from ordinary diffusers model folders, single files and
 * GGUF checkpoints.
 *
 * Layers of src/ (bottom to top): core -> io, kernels, graph, rng, schedulers, tokenizers ->
 * backend (devices, streams, memory) -> exec (eager, defer-and-fuse, capture) -> tensor (the op
 * API: tensor.h) -> dist (tensor parallelism: dist.h) -> nn (weights, layers) -> compile (graph
 * caches, memory plans) -> models (components) -> pipelines (pipeline.h, convert.h); the cli on
 * top. See docs/ARCHITECTURE.md; docs/c-api.md for what each header holds. */
#ifndef CDIFFUSERS_H
#define CDIFFUSERS_H

#define CDIFFUSERS_VERSION "0.1.0"

#include "cdiffusers/capture.h"
#include "cdiffusers/device.h"
#include "cdiffusers/dist.h"
#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"
#include "cdiffusers/exec.h"
#include "cdiffusers/io.h"
#include "cdiffusers/convert.h"
#include "cdiffusers/pipeline.h"
#include "cdiffusers/rng.h"
#include "cdiffusers/scheduler.h"
#include "cdiffusers/tensor.h"
#include "cdiffusers/tokenizer.h"

#endif
