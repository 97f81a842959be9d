#!/bin/sh
# Same-run A/B of two builds on bench/modes: runs each build's bench_modes alternately
# (A B A B ...), so both see the same machine load; prints each run's table. Ratios are read off
# the steady columns of matching rows.
#   bench/modes/ab.sh A_ROOT B_ROOT [rounds] [calls]
# A_ROOT/B_ROOT: source trees with a Release build in ROOT/build (bench_modes is built from each
# tree's own sources against its own library). CDF_BENCH_CASES picks cases (e.g. sd3-256,flux-256).
set -eu
a=$1 b=$2 rounds=${3:-2} calls=${4:-2}
work=${WORK:-/tmp/cdf_bench_modes} # WORK: the random-weight models (generated once)
mkdir -p "$work"
i=0
while [ $i -lt "$rounds" ]; do
  for root in "$a" "$b"; do
    echo "=== round $i: $root ($(git -C "$root" rev-parse --short HEAD))"
    BUILD_DIR="$root/build" sh "$root/bench/modes/run.sh" "$work" "$calls"
  done
  i=$((i + 1))
done
