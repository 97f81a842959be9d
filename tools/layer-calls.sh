#!/bin/sh
# Cross-layer calls from the built objects (build/CMakeFiles/cdf_objects.dir/src/<layer>/*.o):
# for each layer, which other layers define the functions it calls. Complements
# tools/layer-deps.py (includes): a call through a public header shows up here only.
#   sh tools/layer-calls.sh [build]
set -eu
b=${1:-build}/CMakeFiles/cdf_objects.dir/src
tmp=$(mktemp -d)
for d in "$b"/*/; do
  l=$(basename "$d")
  find "$d" -name '*.o' -exec nm --defined-only -g {} \; | awk 'NF==3{print $3}' | sed "s/$/ $l/" >> "$tmp/defs"
done
sort -u "$tmp/defs" > "$tmp/defs.sorted"
for d in "$b"/*/; do
  l=$(basename "$d")
  find "$d" -name '*.o' -exec nm -u {} \; | awk '{print $2}' | sort -u > "$tmp/undef"
  join "$tmp/undef" "$tmp/defs.sorted" | awk -v l="$l" '$2!=l{print $2}' | sort -u | tr '\n' ' ' | sed "s/^/$l -> /"
  echo
done
rm -rf "$tmp"
