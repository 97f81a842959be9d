#!/usr/bin/env bash
# Build the libFuzzer targets in fuzz/ (clang-14, ASan + UBSan), seed their corpora from
# tests/data, and run each target for a while. Exits 1 if any target found a crash, a leak, a
# sanitizer report, a timeout or an out-of-memory; the reproducer is in $WORK/findings/<target>/
# and the log in $WORK/logs/<target>.log.
#
# usage: scripts/fuzz.sh [-t SECONDS_PER_TARGET] [-n EXECUTIONS] [TARGET...]
#   -t N      run each target at most N seconds (default 30)
#   -n N      stop a target after N executions (default: no limit; -t still applies)
#   (targets run side by side, CDF_FUZZ_PARALLEL at a time, default one per core)
#   TARGET    fuzz_safetensors fuzz_gguf fuzz_single_file fuzz_checkpoint fuzz_json fuzz_tokenizer_files
#             fuzz_prompt fuzz_cli fuzz_lora_keys fuzz_serve_json fuzz_serve_multipart
#             (default: all)
# environment: CC (default clang-14), CDF_FUZZ_BUILD (build folder, default build-fuzz),
#   CDF_FUZZ_WORK (corpora, findings and logs, default $CDF_FUZZ_BUILD/work; corpora grow
#   across runs), CDF_FUZZ_JOBS (build parallelism, default 2), CDF_FUZZ_NO_BUILD=1 (run the
#   targets already built in $CDF_FUZZ_BUILD, e.g. while the sources are being edited)
#
# Reproduce a finding: build-fuzz/<target> build-fuzz/work/findings/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

secs=30
runs=-1
while getopts "t:n:h" opt; do
  case $opt in
    t) secs=$OPTARG ;;
    n) runs=$OPTARG ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
all=(fuzz_safetensors fuzz_gguf fuzz_single_file fuzz_checkpoint fuzz_json fuzz_tokenizer_files fuzz_prompt fuzz_cli
  fuzz_lora_keys fuzz_serve_json fuzz_serve_multipart)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

cc=${CC:-clang-14}
build=${CDF_FUZZ_BUILD:-build-fuzz}
work=${CDF_FUZZ_WORK:-$build/work}
mkdir -p "$work"
work=$(cd "$work" && pwd) # absolute: fuzz_cli changes its working folder
if [ "${CDF_FUZZ_NO_BUILD:-0}" != 1 ]; then
  cmake -S fuzz -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j"${CDF_FUZZ_JOBS:-2}" --target "${targets[@]}"
fi

# inputs larger than these only slow a target down (tokenizer files: room for the 232 KiB T5
# charsmap seed; safetensors: the 128 KiB golden io files)
max_len() {
  case $1 in
    fuzz_tokenizer_files) echo 262144 ;;
    fuzz_safetensors) echo 131072 ;;
    fuzz_gguf) echo 16384 ;;
    fuzz_single_file) echo 16384 ;;
    fuzz_json) echo 65536 ;;
    fuzz_checkpoint) echo 16384 ;;
    fuzz_prompt) echo 512 ;;
    fuzz_serve_json | fuzz_serve_multipart) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

mkdir -p "$work/logs" "$work/results"
# one target: seeds, then libFuzzer for $secs; its summary line goes to $work/results/<target>
# (failure lines start with "!!"), its messages to stdout
fuzz_one() {
  local t=$1
  local seeds="$work/seeds/$t" corpus="$work/corpus/$t" findings="$work/findings/$t" result="$work/results/$t"
  rm -rf "$seeds" "$result"
  mkdir -p "$work/seeds" "$corpus" "$findings"
  CDF_FUZZ_WRITE_SEEDS="$seeds" "$build/$t" >/dev/null 2>&1
  local extra=()
  [ "$t" = fuzz_cli ] && extra=(-close_fd_mask=3) # the tool's own messages and usage text
  echo "== $t: ${secs}s, $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus entries"
  local start rc
  start=$(date +%s)
  set +e
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
    "$build/$t" -max_total_time="$secs" -runs="$runs" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "${extra[@]}" "$corpus" "$seeds" >"$work/logs/$t.log" 2>&1
  rc=$?
  set -e
  local wall=$(($(date +%s) - start))
  local execs eps cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/logs/$t.log" | tail -1 || true)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/logs/$t.log" | tail -1 || true)
  cov=$( (grep -o 'cov: [0-9]*' "$work/logs/$t.log" || true) | tail -1)
  if [ $rc -ne 0 ]; then
    echo "!! $t FAILED (exit $rc); log: $work/logs/$t.log; reproducer(s): $(ls "$findings" | tr '\n' ' ')"
    grep -m1 -E "ERROR: |fuzz invariant failed|SUMMARY" "$work/logs/$t.log" || true
    printf '!! %-19s FAILED (exit %d)\n' "$t" $rc >"$result"
  else
    printf '%-22s %10s execs %6ss %8s exec/s  %s\n' "$t" "${execs:-?}" "$wall" "${eps:-?}" "${cov:-}" >"$result"
  fi
}

# The targets run side by side, CDF_FUZZ_PARALLEL at a time (default: one per core): each is
# single-threaded, so on 2 cores the whole run takes half the time at the same seconds per target.
par=${CDF_FUZZ_PARALLEL:-$(nproc 2>/dev/null || echo 1)}
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$par" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
status=0
echo
echo "target                 executions   wall     exec/s  coverage"
for t in "${targets[@]}"; do
  if [ -f "$work/results/$t" ]; then
    cat "$work/results/$t"
    grep -q '^!!' "$work/results/$t" && status=1
  else
    printf '!! %-19s FAILED (no result)\n' "$t"
    status=1
  fi
done
exit $status
