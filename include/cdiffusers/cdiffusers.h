/* cdiffusers — umbrella header. Runs Hugging Face diffusers text-to-image pipelines (FLUX.1,
 * Stable Diffusion 3/3.5) from ordinary diffusers model folders.
 *
 * Layers (bottom to top): io (files) -> tensor + device (the op API, async device queues) ->
 * models -> pipelines. See docs/ARCHITECTURE.md. */
#ifndef CDIFFUSERS_H
#define CDIFFUSERS_H

#define CDIFFUSERS_VERSION "0.1.0"

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
