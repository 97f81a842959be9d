#!/bin/sh
# Tensor-parallel benchmark: a FLUX.1-width and an SD3.5-Medium-width transformer with random
# weights (bench_tp.c), one forward per denoising step, in three configurations on this machine:
#   1 process, 1 thread | 1 process, 2 threads | 2 MPI ranks (sharded, --tp 2), 1 thread each.
#
#   BUILD_DIR=build-rel bench/tp/run.sh [--quick]
#   BUILD_DIR=build bench/tp/run.sh --pjrt      the FLUX-width model on the pjrt backend instead
#
# --pjrt (a build with the pjrt backend and the XLA CPU plugin): compile mode (CDIFFUSERS_COMPILE=1,
# the forward one compiled program per segment), f32 weights unless DTYPE is given, in three
# configurations: 1 process on 1 device | 1 process over 2 devices (--tp 2: replicas, the
# all-reduce inside the programs) | 2 MPI ranks, each its pjrt:0 (the sums over MPI between
# programs). The compiled programs are cached in $WORK/pjrt-cache; the warm-up forward (which
# compiles) is not timed.
#
# BUILD_DIR (default: build) holds libcdiffusers.a built with MPI found (a Release build:
# cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release). WORK (default /tmp/cdf_bench_tp) receives
# the random models (~1.1 GB FLUX, ~0.3 GB SD3, bf16) and is reused between runs.
# KERNELS (default fast) is passed as CDIFFUSERS_KERNELS; DTYPE (default bf16) is the weight dtype
# on the device. IMG / TXT: image and text tokens (default 256 / 128, a 256x256 FLUX image);
# STEPS: timed forwards after one warm-up (default 5; --quick: 2).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
work=${WORK:-/tmp/cdf_bench_tp}
kernels=${KERNELS:-fast}
dtype=${DTYPE:-bf16}
img=${IMG:-256}
txt=${TXT:-128}
steps=${STEPS:-5}
[ "${1:-}" = "--quick" ] && steps=2
pjrt=0
[ "${1:-}" = "--pjrt" ] && pjrt=1 && dtype=${DTYPE:-f32}
lib=$build/libcdiffusers.a
if [ ! -f "$lib" ]; then
    echo "run.sh: $lib not found; build the library first (cmake -S $root -B $build -DCMAKE_BUILD_TYPE=Release && cmake --build $build -j2)" >&2
    exit 1
fi
out=$build/bench_tp
mpicc -std=gnu17 -O2 -fopenmp -I"$root/include" -I"$root/src" "$root/bench/tp/bench_tp.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$out"
mkdir -p "$work"
models="flux sd3"
[ $pjrt = 1 ] && models=flux
for m in $models; do
    [ -f "$work/$m/diffusion_pytorch_model.safetensors" ] || "$out" make "$work/$m" "$m"
done
mpirun="mpirun --allow-run-as-root -np 2"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; Open MPI $(mpirun --version | head -1 | awk '{print $NF}')"
echo "date: $(date -u +%Y-%m-%d); kernels=$kernels dtype=$dtype img=$img txt=$txt steps=$steps"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ $pjrt = 1 ]; then
    export CDIFFUSERS_PJRT_CACHE=$work/pjrt-cache CDIFFUSERS_COMPILE=1
    args="run $work/flux --img $img --txt $txt --steps $steps --dtype $dtype --device pjrt"
    "$out" $args
    "$out" $args --tp 2
    $mpirun -x CDIFFUSERS_PJRT_CACHE -x CDIFFUSERS_COMPILE "$out" $args
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    exit 0
fi
$mpirun "$out" allreduce
for m in flux sd3; do
    args="run $work/$m --img $img --txt $txt --steps $steps --dtype $dtype"
    CDIFFUSERS_KERNELS=$kernels "$out" $args --threads 1
    CDIFFUSERS_KERNELS=$kernels "$out" $args --threads 2
    $mpirun -x CDIFFUSERS_KERNELS=$kernels "$out" $args --threads 1
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
