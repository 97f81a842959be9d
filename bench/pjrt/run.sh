#!/bin/sh
# The pjrt backend (XLA CPU plugin) against the cpu backend, per execution mode, in one run:
#   BUILD_DIR=build bench/pjrt/run.sh [workdir] [calls] [cases] [modes]
# For each case and mode: the cpu backend (first and steady forward), the pjrt backend with an
# empty disk cache (first = capture + XLA compile, steady), and the pjrt backend again in a new
# process with that cache warm (first = the cache's load). Defaults: cases "sd35m-512 flux-512",
# modes "eager fuse compile blocks", 2 steady calls. Prints the CPU and the load around each line.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
lib=$build/libcdiffusers.a
[ -f "$lib" ] || { echo "run.sh: build the library first" >&2; exit 1; }
gcc -std=gnu17 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/bench/pjrt/bench_pjrt.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$build/bench_pjrt"
work=${1:-/tmp/cdf_bench_pjrt}
calls=${2:-2}
cases=${3:-"sd35m-512 flux-512"}
modes=${4:-"eager fuse compile blocks"}
mkdir -p "$work"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores, flags: $(grep -o 'avx512_bf16\|amx_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '); $(date -u '+%Y-%m-%d %H:%M UTC')"
cd "$root"
for c in $cases; do
  for m in $modes; do
    cache="$work/cache-$c-$m"
    rm -rf "$cache"
    echo "load $(cut -d' ' -f1 /proc/loadavg): $("$build/bench_pjrt" "$work" tests/data/tokenizers cpu "$m" "$c" "$calls")"
    echo "load $(cut -d' ' -f1 /proc/loadavg): $(CDIFFUSERS_PJRT_CACHE="$cache" "$build/bench_pjrt" "$work" tests/data/tokenizers pjrt "$m" "$c" "$calls") (cold cache)"
    echo "load $(cut -d' ' -f1 /proc/loadavg): $(CDIFFUSERS_PJRT_CACHE="$cache" "$build/bench_pjrt" "$work" tests/data/tokenizers pjrt "$m" "$c" 1) (warm cache)"
  done
done
