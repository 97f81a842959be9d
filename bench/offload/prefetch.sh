#!/bin/sh
# Offload prefetch benchmark: model offload with the next model's materialisation started before
# the previous model's last forward has finished (the default) vs after it
# (CDIFFUSERS_OFFLOAD_PREFETCH=0), on the SD3.5-Medium-shaped pipeline of run.sh (random bf16
# weights, reduced depth), per device: time per image (the generate command's wall time,
# including the process's load and, on pjrt, programs from the disk cache, which a first warm-up
# run fills), the seconds the host spent at the two phase changes (CDIFFUSERS_LOG=offload: the
# next model's materialisation plus the wait for the previous one's work; what prefetch
# overlaps), the device peak and the prefetches made (--memory-stats). Runs alternate on / off
# so that the shared machine's load falls on both alike; the median of REPEAT runs is reported.
# On a CPU the "device" computes on the cores the host converts weights on, so the overlap can
# only use what the compute leaves idle; a GPU or TPU computes beside the host.
#
#   BUILD_DIR=build bench/offload/prefetch.sh
#
# Environment: WORK (default /tmp/cdf-offload-bench, shared with run.sh), DEVICES (default
# "cpu-discrete pjrt": the cpu backend with CDIFFUSERS_CPU_DISCRETE=1, the pjrt backend's XLA CPU
# plugin), SIZE (default 256), STEPS (default 2), REPEAT (default 3), BUDGET (default 16G: the
# pjrt device reports no memory size, so without a budget generate does not prefetch there).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
work=${WORK:-/tmp/cdf-offload-bench}
size=${SIZE:-256}
steps=${STEPS:-2}
repeat=${REPEAT:-3}
budget=${BUDGET:-16G}
BUILD_DIR=$build "$root/bench/offload/build.sh" >/dev/null
cli=$build/cdiffusers
DEPTH="--set sd3.layers=4 --set sd3.dual_layers=2 --set t5.layers=2 --set clip_g.layers=4 --set clip_l.layers=2"
model=$work/sd35m
if [ ! -f "$model/model_index.json" ] || [ "$(cat "$work/spec" 2>/dev/null)" != "$DEPTH" ]; then
    rm -rf "$model"
    mkdir -p "$work"
    # shellcheck disable=SC2086
    "$build/make-random-pipeline" --preset sd35-medium --out "$model" --tokenizers "$root/tests/data/tokenizers" $DEPTH
    echo "$DEPTH" > "$work/spec"
fi
export CDIFFUSERS_KERNELS=fast CDIFFUSERS_PREPACK_MB=0
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
bf16=$(grep -q avx512_bf16 /proc/cpuinfo && echo "avx512_bf16" || echo "no avx512_bf16")
echo "CPU: $cpu ($bf16), $(nproc) cores; date: $(date -u +%Y-%m-%d); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pipeline: sd35-medium preset with $DEPTH; ${size}x${size}, CFG, $steps steps, bf16, --offload model --mode eager --device-memory $budget"
req="--height $size --width $size --dtype bf16 --guidance 5 --max-sequence-length 128 --steps $steps --prompt 'a photo of a cat' --negative-prompt blurry --offload model --mode eager --device-memory $budget --memory-stats --quiet --force"
"$cli" plan --model "$model" --height "$size" --width "$size" --dtype bf16 --guidance 5 --max-sequence-length 128 --offload model \
    --device-memory "$budget" | grep -E '^prefetch|^expected'
one() { # device, prefetch 0/1 -> "seconds peak_bytes prefetches"
    d=$1 # (sh has no locals: the caller's loop variable is $dev)
    env_=""
    [ "$d" = cpu-discrete ] && env_="CDIFFUSERS_CPU_DISCRETE=1" && d=cpu
    out=$work/prefetch-err.txt
    eval "env $env_ CDIFFUSERS_LOG=offload CDIFFUSERS_OFFLOAD_PREFETCH=$2 /usr/bin/time -f 'TIME %e' '$cli' generate --model '$model' $req --device $d --output '$work/prefetch-$1-$2.png'" 2> "$out" || { cat "$out" >&2; exit 1; }
    t=$(sed -n 's/^TIME \([0-9.]*\)$/\1/p' "$out")
    pk=$(sed -n 's/.*; peak .* (\([0-9]*\) bytes).*/\1/p' "$out")
    pf=$(sed -n 's/.*prefetched: \([0-9]*\).*/\1/p' "$out")
    sw=$(sed -n 's/^cdiffusers: offload: .*; \([0-9.]*\) s in all$/\1/p' "$out" | awk '{s += $1} END {printf "%.2f", s}')
    echo "$t $pk $pf $sw"
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| device | prefetch | time per image, s: median of $repeat (all) | at the phase changes, s: median (all) | device peak | prefetches |"
echo "|---|---|---|---|---|---|"
for dev in ${DEVICES:-cpu-discrete pjrt}; do
    one "$dev" 1 >/dev/null # warm-up: page cache, pjrt's program cache
    on="" off="" sw_on="" sw_off="" pk_on="" pk_off="" n_on="" n_off=""
    i=0
    while [ $i -lt "$repeat" ]; do
        set -- $(one "$dev" 1); on="$on $1"; pk_on=$2; n_on=$3; sw_on="$sw_on $4"
        set -- $(one "$dev" 0); off="$off $1"; pk_off=$2; n_off=$3; sw_off="$sw_off $4"
        i=$((i + 1))
    done
    cmp -s "$work/prefetch-$dev-1.png" "$work/prefetch-$dev-0.png" || echo "$dev: the pictures differ with and without prefetch" >&2
    echo "| $dev | on | $(echo $on | tr ' ' '\n' | median) ($on) | $(echo $sw_on | tr ' ' '\n' | median) ($sw_on) | $pk_on B | $n_on |"
    echo "| $dev | off | $(echo $off | tr ' ' '\n' | median) ($off) | $(echo $sw_off | tr ' ' '\n' | median) ($sw_off) | $pk_off B | $n_off |"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
