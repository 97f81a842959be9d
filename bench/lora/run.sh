#!/bin/sh
# Builds bench/lora/bench_lora against the built static library and runs it (see bench_lora.c).
#   BUILD_DIR=build bench/lora/run.sh [workdir] [calls] [resolution]
# The random-weight FLUX.1-width model and the adapters are written to workdir
# (default /tmp/cdf_bench_lora) once.
BENCH=lora exec "$(dirname "$0")/../modes/run.sh" "$@"
