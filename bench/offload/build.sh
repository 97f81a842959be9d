#!/bin/sh
# Builds the offload benchmark tools against a built static library:
#   $BUILD_DIR/make-random-pipeline   (tools/make-random-pipeline, no library needed)
#   $BUILD_DIR/offload-calibrate      (bench/offload/calibrate.c)
#
#   BUILD_DIR=build bench/offload/build.sh
#
# BUILD_DIR (default: build) is a CMake build directory holding libcdiffusers.a (a Release
# build: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
lib=$build/libcdiffusers.a
if [ ! -f "$lib" ]; then
    echo "build.sh: $lib not found; build the library first (cmake -S $root -B $build && cmake --build $build -j2)" >&2
    exit 1
fi
gcc -std=gnu17 -O2 -Wall -Wextra -o "$build/make-random-pipeline" "$root/tools/make-random-pipeline/make_random_pipeline.c" -lm
gcc -std=gnu17 -O2 -fopenmp -D_GNU_SOURCE -I"$root/include" -I"$root/src" "$root/bench/offload/calibrate.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$build/offload-calibrate"
echo "built $build/make-random-pipeline $build/offload-calibrate"
