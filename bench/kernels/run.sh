#!/bin/sh
# Builds bench/kernels/bench_kernels against a built static library and runs it.
#
#   bench/kernels/run.sh [--quick | --attention [--no-reference] | --attention-bf16 [--quick] | --gemm [--quick] | --quant [rounds [name]] | --bf16 [rounds [name]]]
#   (--attention-bf16: f32 vs bf16 q/k/v attention only; --attention: only the
#   flash-attention table; --gemm: only the own bf16-weight GEMM against oneDNN, AVX2 level)
#
# BUILD_DIR (default: build) is the CMake build directory holding libcdiffusers.a, configured
# with oneDNN found (a Release build: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release). The
# binary goes to $BUILD_DIR/bench_kernels. Also prints the CPU model and, with ONEDNN_VERBOSE=1,
# the implementation oneDNN runs for one bf16 and one f32 linear layer.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
lib=$build/libcdiffusers.a
if [ ! -f "$lib" ]; then
    echo "run.sh: $lib not found; build the library first (cmake -S $root -B $build && cmake --build $build -j2)" >&2
    exit 1
fi
out=$build/bench_kernels
# peak.c carries per-function target attributes; the rest is compiled for the generic x86-64.
gcc -std=gnu17 -O2 -fopenmp -I"$root/include" -I"$root/src" \
    "$root/bench/kernels/bench_kernels.c" "$root/bench/kernels/peak.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$out"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
echo "date: $(date -u +%Y-%m-%d)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews the figures)"
echo
"$out" "$@"
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "### oneDNN implementation choice (ONEDNN_VERBOSE=1, one call each)"
echo
# the last field (time in ms) is dropped so repeated calls collapse
ONEDNN_VERBOSE=1 "$out" --verbose-probe 2>&1 | grep -E '^onednn_verbose,exec' | sed 's/,[^,]*$//' | uniq || true
