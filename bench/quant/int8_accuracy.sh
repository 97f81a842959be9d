#!/bin/sh
# What the int8 Q8_0 GEMM (CDIFFUSERS_Q8_INT8, src/kernels/matmul_quant.c) costs in accuracy on a
# real-width forward: one `run-model` forward of the same transformer as a Q8_0 GGUF with the
# int8 path on and off, and, as the yardstick, the bf16 folder under --dtype bf16 and --dtype f32.
# Prints the relative L2 differences of the outputs (sqrt(sum (x - y)^2 / sum y^2), in double).
#
#   BUILD_DIR=build bench/quant/int8_accuracy.sh FOLDER GGUF INPUTS WORK [mode]
# e.g. FOLDER=/work/peers/w/models/flux_2d4s/transformer GGUF=/work/peers/w/dit_q8_0.gguf
# INPUTS=/work/peers/w/in_flux_512.safetensors (bench/peers writes them). PYTHON: an interpreter
# with numpy + safetensors (default python3). mode: eager (default) or compile.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
folder=$1; gguf=$2; inputs=$3; work=$4; mode=${5:-eager}
py=${PYTHON:-python3}
cli=$build/cdiffusers
mkdir -p "$work"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # name, env, extra args...
    name=$1 envs=$2
    shift 2
    # shellcheck disable=SC2086
    env $envs "$cli" run-model --model "$folder" --inputs "$inputs" --output "$work/int8_acc_$name.safetensors" --force \
        --mode "$mode" "$@" 2>&1 | grep -E 'forward_ms|rror' | sed "s/^/$name: /"
}
run f32 "" --dtype f32
run bf16 "" --dtype bf16
run q8_off CDIFFUSERS_Q8_INT8=0 --weights "$gguf" --dtype bf16
run q8_int8 "" --weights "$gguf" --dtype bf16
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" - "$work" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
w = sys.argv[1]
out = {n: load_file(f"{w}/int8_acc_{n}.safetensors") for n in ("f32", "bf16", "q8_off", "q8_int8")}
def rel(x, y):
    return max(float(np.sqrt(np.sum((out[x][k].astype(np.float64) - out[y][k].astype(np.float64)) ** 2)
                             / np.sum(out[y][k].astype(np.float64) ** 2))) for k in out[y])
for x, y, what in (("bf16", "f32", "yardstick: bf16 policy vs f32 on the bf16 folder"),
                   ("q8_off", "f32", "Q8_0, int8 off, vs f32 folder"),
                   ("q8_int8", "f32", "Q8_0, int8 on, vs f32 folder"),
                   ("q8_int8", "q8_off", "Q8_0 int8 on vs off"),
                   ("q8_off", "bf16", "Q8_0 int8 off vs bf16 folder (weight quantization)")):
    print(f"rel L2 {x} vs {y}: {rel(x, y):.3e}  ({what})")
PY
