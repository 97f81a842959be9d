#!/bin/sh
# Offload on the pjrt backend (XLA CPU plugin): a reduced-width FLUX.1 pipeline with random bf16
# weights (tools/make-random-pipeline, preset flux1 with the --set options below), 256x256, 2
# steps, eager; --offload none / model / sequential, each twice in the same run: "before"
# (CDIFFUSERS_PJRT_ASYNC_UPLOADS=0 CDIFFUSERS_HOST_STAGING=0: uploads wait and happen at a
# program's first read, sequential's block weights converted and uploaded from host bytes at
# every block call, as before asynchronous uploads) and "after" (asynchronous uploads started
# when a storage is set, sequential's block weights staged once in pinned_host and copied per
# block with PJRT_Buffer_CopyToMemory). Prints the wall time of the generate call (programs
# loaded from a warm disk cache: one untimed run first), the measured device peak
# (--memory-stats) and the peak RSS; the pinned_host counters (CDIFFUSERS_LOG=pjrt) for "after".
#
#   BUILD_DIR=build bench/offload/pjrt.sh [--set options replacing SHAPE]
# Environment: WORK (default /tmp/cdf-offload-pjrt), STEPS (2), SIZE (256), REPEAT (1).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
work=${WORK:-/tmp/cdf-offload-pjrt}
steps=${STEPS:-2}
size=${SIZE:-256}
repeat=${REPEAT:-1}
cli=$build/cdiffusers
[ -x "$cli" ] || { echo "pjrt.sh: $cli not built" >&2; exit 1; }
gcc -std=gnu17 -O2 -Wall -o "$build/make-random-pipeline" "$root/tools/make-random-pipeline/make_random_pipeline.c" -lm
SHAPE="--set flux.heads=8 --set flux.head_dim=128 --set flux.layers=2 --set flux.single_layers=4 --set t5.d_model=1024
 --set t5.layers=2 --set t5.heads=16 --set t5.d_ff=2048 --set clip_l.layers=2"
[ $# -gt 0 ] && SHAPE="$*"
model=$work/flux
if [ ! -f "$model/model_index.json" ] || [ "$(cat "$work/spec" 2>/dev/null)" != "$SHAPE" ]; then
    rm -rf "$model"
    mkdir -p "$work"
    # shellcheck disable=SC2086
    "$build/make-random-pipeline" --preset flux1 --out "$model" --tokenizers "$root/tests/data/tokenizers" $SHAPE >/dev/null
    echo "$SHAPE" > "$work/spec"
fi
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores, avx512_bf16: $(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "pipeline: flux1 preset with $(echo $SHAPE) ($(du -sh "$model" | cut -f1) on disk); ${size}^2, $steps steps, bf16, eager, --device pjrt"
export CDIFFUSERS_PJRT_CACHE="$work/cache"
gen() { # mode, then env words
    mode=$1
    shift
    env "$@" CDIFFUSERS_LOG=pjrt /usr/bin/time -f "TIME %e %M" "$cli" generate --device pjrt --model "$model" \
        --prompt "a photo of a cat" --height "$size" --width "$size" --steps "$steps" --dtype bf16 --offload "$mode" \
        --output "$work/out-$mode.png" --force --quiet --memory-stats 2> "$work/err.txt" || { tail -5 "$work/err.txt"; return 1; }
}
for mode in none model sequential; do
    gen "$mode" >/dev/null # programs compiled and cached
    for r in $(seq "$repeat"); do
        for v in before after; do
            if [ $v = before ]; then gen "$mode" CDIFFUSERS_PJRT_ASYNC_UPLOADS=0 CDIFFUSERS_HOST_STAGING=0
            else gen "$mode" CDIFFUSERS_HOST_STAGING=1; fi
            t=$(sed -n 's/^TIME \([0-9.]*\) .*/\1/p' "$work/err.txt")
            rss=$(sed -n 's/^TIME [0-9.]* \([0-9]*\)$/\1/p' "$work/err.txt")
            peak=$(grep -o 'peak [0-9.]* [KMG]\{0,1\}i\{0,1\}B' "$work/err.txt" | tail -1)
            dn=$(grep -o 'denoising [0-9.]* [KMG]\{0,1\}i\{0,1\}B' "$work/err.txt" | tail -1)
            pin=$(sed -n 's/.*pjrt: uploads: \(.*\)/\1/p' "$work/err.txt")
            printf 'load %s: --offload %-10s %-6s %6.1f s, device %s (%s), RSS %d MiB; %s\n' "$(cut -d' ' -f1 /proc/loadavg)" \
                "$mode" "$v" "$t" "$peak" "$dn" $((rss / 1024)) "$pin"
        done
    done
done
