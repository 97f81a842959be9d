#!/bin/sh
# Builds bench/modes/bench_modes against the built static library and runs it.
#   BUILD_DIR=build bench/modes/run.sh [workdir] [calls] [rounds]  (BENCH=lora: its own arguments)
# rounds > 1: the modes alternate round by round (load printed per round), the table gives
# medians (bench_modes.c). CDF_BENCH_CASES=sd3-256,flux-256 picks cases.
# BENCH=lora builds and runs bench/lora/bench_lora instead (bench/lora/run.sh).
# The random-weight model folders are written to workdir (default /tmp/cdf_bench_modes) once.
set -eu
name=${BENCH:-modes}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
lib=$build/libcdiffusers.a
[ -f "$lib" ] || { echo "run.sh: build the library first (cmake -S $root -B $build -DCMAKE_BUILD_TYPE=Release && cmake --build $build -j2)" >&2; exit 1; }
gcc -std=gnu17 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/bench/$name/bench_$name.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$build/bench_$name"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; date: $(date -u +%Y-%m-%d)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$root"
work=${1:-/tmp/cdf_bench_$name}
calls=${2:-2}
[ $# -gt 2 ] && shift 2 || set --
mkdir -p "$work"
"$build/bench_$name" "$work" tests/data/tokenizers "$calls" "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
