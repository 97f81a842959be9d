#!/bin/sh
# What the int8 Q8_0 GEMM (CDIFFUSERS_Q8_INT8=1, src/kernels/matmul_quant.c) costs in accuracy on
# a real-width forward: `run-model` forwards of a transformer as a Q8_0 GGUF under --dtype bf16
# with the int8 path on and off, against the same GGUF under --dtype f32 (its dequantized weights,
# exact compute); as the yardstick, the bf16 folder under --dtype bf16 against --dtype f32.
# Prints the relative L2 differences of the outputs (sqrt(sum (x - y)^2 / sum y^2), in double)
# and each run's forward_ms (--repeat 2: the second forward is the steady one).
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
        --mode "$mode" --repeat 2 "$@" 2>&1 | grep -E 'forward_ms|rror' | tr '\n' ' ' | sed "s/^/$name: /"
    echo
}
run f32 "" --dtype f32
run bf16 "" --dtype bf16
run q8_f32 "" --weights "$gguf" --dtype f32
run q8_off CDIFFUSERS_Q8_INT8=0 --weights "$gguf" --dtype bf16
run q8_int8 CDIFFUSERS_Q8_INT8=1 --weights "$gguf" --dtype bf16
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" - "$work" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
w = sys.argv[1]
out = {n: load_file(f"{w}/int8_acc_{n}.safetensors") for n in ("f32", "bf16", "q8_f32", "q8_off", "q8_int8")}
def rel(x, y):
    return max(float(np.sqrt(np.sum((out[x][k].astype(np.float64) - out[y][k].astype(np.float64)) ** 2)
                             / np.sum(out[y][k].astype(np.float64) ** 2))) for k in out[y])
for x, y, what in (("bf16", "f32", "yardstick: the bf16 policy against f32, bf16 folder"),
                   ("q8_off", "q8_f32", "Q8_0 under bf16, int8 off, against the Q8_0 file under f32"),
                   ("q8_int8", "q8_f32", "Q8_0 under bf16, int8 on, against the Q8_0 file under f32"),
                   ("q8_int8", "q8_off", "int8 on against off")):
    print(f"rel L2 {x} vs {y}: {rel(x, y):.3e}  ({what})")
PY
