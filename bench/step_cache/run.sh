#!/bin/sh
# Builds bench/step_cache/bench_step_cache against the built static library and runs
#   quality (the default model, 50 prompts, 20 and 28 steps, the caches below) and
#   timing (a FLUX.1-width 2 + 4 block pipeline with random weights at 512², written once by
#   tools/make-random-pipeline to WORK).
#   BUILD_DIR=build bench/step_cache/run.sh [WORK] [N_PROMPTS]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
work=${1:-/tmp/cdf_bench_step_cache}
n=${2:-50}
gcc -std=gnu17 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/bench/step_cache/bench_step_cache.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$build/bench_step_cache"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; date: $(date -u '+%Y-%m-%d %H:%M'); load $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$root"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} # spinning OpenMP workers on a shared machine: see history/09-server.md
for steps in 20 28; do
    "$build/bench_step_cache" quality models/shapes-flux-tiny "$n" "$steps" \
        "first-block:0.05;first-block:0.1;first-block:0.2;mag;mag:threshold=0.1;taylorseer;taylorseer:cache_interval=3"
done
if [ ! -f "$work/flux1w/transformer/config.json" ]; then
    gcc -std=gnu17 -O2 -o "$build/make-random-pipeline" tools/make-random-pipeline/make_random_pipeline.c -lm
    "$build/make-random-pipeline" --preset flux1 --out "$work/flux1w" --tokenizers tests/data/tokenizers \
        --set flux.layers=2 --set flux.single_layers=4 --set t5.layers=1 --set clip_l.layers=1
fi
"$build/bench_step_cache" timing "$work/flux1w" 512 6
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
