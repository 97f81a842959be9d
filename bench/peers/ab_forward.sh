#!/bin/sh
# Alternating before/after runs of the steady transformer forward of bench/peers/profile.sh's
# model (SD3.5-M width, 4 blocks, 512² CFG, compile mode, bf16, 2 threads): for each round and
# each NAME=BUILD_DIR[:VAR=VALUE...], `run-model --repeat 2` (the first forward compiles, the
# second is steady) under /usr/bin/time, with the OpenMP parallel regions counted by
# omp_regions.c. Run profile.sh once first (it writes the model and the inputs into WORK).
#
#   WORK=/work/peers bench/peers/ab_forward.sh ROUNDS before=/path/build-a after=build-b \
#       after_passive=build-b:OMP_WAIT_POLICY=PASSIVE
# MODEL, INPUTS, MODE (compile), REPEAT (2) and DTYPE (bf16) change the forward, e.g. FLUX.1
# width 2+4 blocks at 512² from bench_peers.py's work folder W:
#   MODEL=W/models/flux_2d4s/transformer INPUTS=W/in_flux_512.safetensors MODE=eager REPEAT=3 ...
# EXTRA adds options to every run (e.g. EXTRA="--offload sequential").
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/tmp/cdf-peers}
rounds=$1
shift
model=${MODEL:-$work/models/sd35m_4l/transformer}
inputs=${INPUTS:-$work/in_sd35m.safetensors}
mode=${MODE:-compile}
repeat=${REPEAT:-2}
dtype=${DTYPE:-bf16}
extra=${EXTRA:-}
gcc -O2 -shared -fPIC -o "$work/omp_regions.so" "$root/bench/peers/omp_regions.c" -ldl
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1); $model, $mode, $dtype, --repeat $repeat $extra"
for i in $(seq 1 "$rounds"); do
    for spec in "$@"; do
        name=${spec%%=*}
        rest=${spec#*=}
        build=${rest%%:*}
        envs=""
        [ "$rest" != "$build" ] && envs=$(echo "${rest#*:}" | tr ':' ' ')
        echo "== $name round $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) env [$envs]"
        # shellcheck disable=SC2086
        /usr/bin/time -f "wall %e s, user %U s, sys %S s, maxrss %M KB" env $envs \
            LD_PRELOAD="$work/omp_regions.so" OMP_NUM_THREADS=2 "$build/cdiffusers" run-model \
            --model "$model" --inputs "$inputs" \
            --output "$work/out_ab_$name.safetensors" --force --repeat "$repeat" --mode "$mode" --dtype "$dtype" --threads 2 $extra 2>&1 |
            grep -E "forward_ms|omp_regions|wall|rror" || true
    done
done
