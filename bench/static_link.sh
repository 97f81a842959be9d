#!/bin/sh
# Prints what a program needs on its link line to link BUILD/libcdiffusers.a: the archive, then
# the libraries CMake linked the CLI with (oneDNN, OpenMP, MPI, the CUDA runtime and cuBLASLt when
# the build holds the CUDA backend, ...), with their search paths and rpaths, and the C++ runtime
# (the CUDA objects need it; harmless otherwise). Read from CMake's own link files for the CLI, so
# a bench program links exactly as cdiffusers does, whatever that build found on this machine.
#
#   gcc ... bench/x/bench_x.c $(sh bench/static_link.sh BUILD) -o ...
set -eu
build=$1
d=$build/CMakeFiles/cdiffusers_cli.dir
[ -f "$build/libcdiffusers.a" ] && [ -f "$d/link.txt" ] || {
    echo "static_link.sh: $build/libcdiffusers.a or its CMake link files not found; build the library first" >&2
    exit 1
}
# the libraries: in link.txt itself, or in the response file it names (newer CMake); without the
# quotes CMake puts around paths (no path here holds a space)
libs=$(cat "$d/linkLibs.rsp" 2>/dev/null || sed -n 's/.*libcdiffusers\.a//p' "$d/link.txt")
libs=$(printf '%s' "$libs" | sed -e 's/"//g' -e 's/[^ ]*libcdiffusers\.a//')
dirs=$(tr ' ' '\n' < "$d/link.txt" | grep -- '^-L\|^-Wl,-rpath' | tr -d '"' | tr '\n' ' ' || true)
echo "$build/libcdiffusers.a $dirs $libs -lstdc++"
