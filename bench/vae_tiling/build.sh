#!/bin/sh
# Builds bench/vae_tiling/vae_memory.c against a built static library: $BUILD_DIR/vae-memory.
#   BUILD_DIR=build bench/vae_tiling/build.sh
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
lib=$build/libcdiffusers.a
[ -f "$lib" ] || { echo "build.sh: $lib not found; build the library first" >&2; exit 1; }
gcc -std=gnu17 -O2 -fopenmp -D_GNU_SOURCE -I"$root/include" -I"$root/src" "$root/bench/vae_tiling/vae_memory.c" \
    $(sh "$root/bench/static_link.sh" "$build") -o "$build/vae-memory"
echo "built $build/vae-memory"
