#!/bin/sh
# Builds bench/vae_tiling/vae_memory.c against a built static library: $BUILD_DIR/vae-memory.
#   BUILD_DIR=build bench/vae_tiling/build.sh
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
lib=$build/libcdiffusers.a
[ -f "$lib" ] || { echo "build.sh: $lib not found; build the library first" >&2; exit 1; }
# the library's link dependencies, as CMake linked the CLI (link.txt or its response file)
d=$build/CMakeFiles/cdiffusers_cli.dir
libs=$(cat "$d/linkLibs.rsp" 2>/dev/null || sed -n 's/.*libcdiffusers\.a//p' "$d/link.txt")
libs=$(printf '%s' "$libs" | sed 's/libcdiffusers\.a//')
dirs=$(tr ' ' '\n' < "$d/link.txt" | grep -- '^-L' | tr '\n' ' ' || true)
gcc -std=gnu17 -O2 -fopenmp -D_GNU_SOURCE -I"$root/include" -I"$root/src" -c "$root/bench/vae_tiling/vae_memory.c" \
    -o "$build/vae_memory.o"
# g++ links: the library may hold the CUDA backend (C++ runtime)
eval g++ "$build/vae_memory.o" "$lib" $dirs $libs -o "$build/vae-memory"
echo "built $build/vae-memory"
