#!/bin/sh
# Where cdiffusers' time goes in the SD3.5-Medium forward (512x512, CFG batch 2, 333 text tokens,
# compile mode, bf16, 2 threads): a sampling profile (perf, software cpu-clock event: this VM has
# no hardware counters) of `run-model --repeat N` on the real width with REDUCED depth (4 blocks,
# 2 with dual attention: the same 1.5 attentions per block as the real 24/13), grouped into kernel
# classes by profile_summary.py, over the LAST forward only (perf report --time, as a share of
# the recorded time: load, compile and the earlier forwards are left out). oneDNN's JIT kernels are named through its perf map
# (ONEDNN_JIT_PROFILE=2). Samples count only this process's CPU time, so the shares hold on a
# loaded machine (except OpenMP spin-waiting, which grows when a thread is descheduled).
#
#   BUILD_DIR=build-peers WORK=/work/peers bench/peers/profile.sh [repeat]
#
# PYTHON (default /usr/bin/python3) writes the inputs once and needs numpy (e.g. a venv's python).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
work=${WORK:-/tmp/cdf-peers}
repeat=${1:-3}
py=${PYTHON:-/usr/bin/python3}
model=$work/models/sd35m_4l
mrp=$build/make-random-pipeline
mkdir -p "$work/models"
if [ ! -f "$model/transformer/config.json" ]; then
    [ -x "$mrp" ] || gcc -std=gnu17 -O2 -o "$mrp" "$root/tools/make-random-pipeline/make_random_pipeline.c" -lm
    "$mrp" --preset sd35-medium --out "$model" --tokenizers "$root/tests/data/tokenizers" --set t5.enabled=0 \
        --set clip_l.layers=1 --set clip_g.layers=1 --set sd3.layers=4 --set sd3.dual_layers=2 >/dev/null
    rm -rf "$model"/text_encoder*
fi
[ -f "$work/in_sd35m.safetensors" ] || "$py" -c "import sys; sys.path.insert(0, '$root/bench/peers'); \
import bench_peers; bench_peers.make_inputs('sd35m', '$work/in_sd35m.safetensors')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
ONEDNN_JIT_PROFILE=2 DNNL_JIT_PROFILE=2 OMP_NUM_THREADS=2 perf record -q -e cpu-clock -F 499 -o "$work/perf_sd35m_4l.data" -- \
    "$build/cdiffusers" run-model --model "$model/transformer" --inputs "$work/in_sd35m.safetensors" \
    --output "$work/out_sd35m_4l.safetensors" --force --repeat "$((repeat + 1))" --mode compile --dtype bf16 --threads 2 \
    2> "$work/profile_forward_ms.txt"
cat "$work/profile_forward_ms.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
last_ms=$(sed -n 's/^forward_ms=//p' "$work/profile_forward_ms.txt" | tail -1)
dur_ms=$(perf report -i "$work/perf_sd35m_4l.data" --header-only 2>/dev/null | sed -n 's/^# sample duration : *\([0-9.]*\) ms/\1/p')
start=$(awk -v l="$last_ms" -v d="$dur_ms" 'BEGIN { p = 100 * (1 - l / d); if (p < 0) p = 0; printf "%d", p + 1 }')
echo "last forward: $last_ms ms of $dur_ms ms recorded -> perf report --time $start%-100%"
perf report -i "$work/perf_sd35m_4l.data" --time "$start%-100%" --no-children --sort dso,sym --stdio 2>/dev/null |
    "$py" "$root/bench/peers/profile_summary.py"
