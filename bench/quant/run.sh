#!/bin/sh
# Quantized weights in memory: one FLUX.1-width transformer forward (2 double + 4 single blocks,
# 512x512, 512 text tokens, random weights) with bf16 weights against the same weights quantized
# to Q8_0 at load (--weight-type q8_0), in compile mode, alternating the two, with the peak RSS
# of each process. Optionally a Q4_K .gguf of the same transformer (QUANT_GGUF=FILE, e.g. made by
# stable-diffusion.cpp's convert) as a third side.
#   BUILD_DIR=build-rel bench/quant/run.sh [workdir] [rounds] [repeat]
# Writes the random model (2.5 GB) and inputs into workdir (default /tmp/cdf_bench_quant) once.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
work=${1:-/tmp/cdf_bench_quant}
rounds=${2:-2}
repeat=${3:-3}
py=${PYTHON:-python3}
cli=$build/cdiffusers
[ -x "$cli" ] || { echo "run.sh: build cdiffusers in $build first" >&2; exit 1; }
mkdir -p "$work"
mrp=$work/make-random-pipeline
[ -x "$mrp" ] || gcc -std=gnu17 -O2 -o "$mrp" "$root/tools/make-random-pipeline/make_random_pipeline.c" -lm
model=$work/flux_2d4s
if [ ! -f "$model/model_index.json" ]; then
    "$mrp" --preset flux1 --set flux.layers=2 --set flux.single_layers=4 --set t5.layers=1 --set clip_l.layers=1 \
        --out "$model" --tokenizers "$root/tests/data/tokenizers" >/dev/null
fi
inputs=$work/flux_inputs.safetensors
[ -f "$inputs" ] || "$py" -c "import sys; sys.path.insert(0, '$root/bench/peers'); import bench_peers as b; b.make_inputs('flux', '$inputs')"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; flags: $(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M') UTC; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
side() { # name, extra arguments
    name=$1; shift
    log=$work/$name.log
    /usr/bin/time -f 'peak_rss_kb=%M' "$cli" run-model --model "$model/transformer" --inputs "$inputs" --output "$work/$name.out.safetensors" \
        --force --mode compile --dtype bf16 --repeat "$repeat" "$@" >"$log" 2>&1
    ms=$(grep -o 'forward_ms=[0-9.]*' "$log" | cut -d= -f2 | tail -n +2 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    first=$(grep -o 'forward_ms=[0-9.]*' "$log" | head -1 | cut -d= -f2)
    rss=$(grep -o 'peak_rss_kb=[0-9]*' "$log" | cut -d= -f2)
    printf '%-6s round %d: steady forward %8.0f ms (first, compiling: %8.0f ms), peak RSS %6.2f GiB, load %s\n' \
        "$name" "$r" "$ms" "$first" "$(echo "$rss / 1048576" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
}
r=1
while [ "$r" -le "$rounds" ]; do
    side bf16
    side q8_0 --weight-type q8_0
    [ -n "${QUANT_GGUF:-}" ] && side gguf --weights "$QUANT_GGUF"
    r=$((r + 1))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
