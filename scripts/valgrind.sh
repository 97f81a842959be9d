#!/usr/bin/env bash
# Valgrind memcheck over the success paths: test executables of a Release (or RelWithDebInfo)
# build, and the command-line tool generating, tokenizing and describing the tiny FLUX.1-schnell
# pipeline. Every memcheck error and every definite, indirect or possible leak fails the run;
# the only suppressions are in scripts/valgrind.supp, each justified there.
#
# usage: scripts/valgrind.sh [-b BUILD_DIR] [TEST...]
#   -b DIR   build folder (default: build), configured and built here if it has no cdiffusers
#   TEST     test executables under DIR/tests (default: a representative subset, below);
#            "all" = every tests/test_* executable except the MPI ones (test_dist*)
# Logs: DIR/valgrind/<name>.log. Exit 1 if any run reported an error or a leak.
# Runs with CDIFFUSERS_ISA=generic (the reference kernels; override with CDF_VALGRIND_ISA):
# memcheck cannot analyse oneDNN's JIT-generated code (see scripts/valgrind.supp).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
while getopts "b:h" opt; do
  case $opt in
    b) build=$OPTARG ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
# default subset: the parsers (JSON, safetensors, PNG, tokenizers), tensors, random numbers and
# the scheduler, and two models end to end against golden data
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(test_io_json test_io_safetensors test_io_png test_scheduler test_tensor test_rng
  test_tokenizer_clip test_model_flux test_model_vae)
if [ ! -x "$build/cdiffusers" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)"
fi
if [ "${tests[0]}" = all ]; then
  tests=()
  for t in "$build"/tests/test_*; do
    n=$(basename "$t")
    case $n in test_dist*) continue ;; esac
    [ -x "$t" ] && tests+=("$n")
  done
fi
build=$(cd "$build" && pwd)
logs="$build/valgrind"
rm -rf "$logs"
mkdir -p "$logs/work"
vg=(valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect,possible
  --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=99
  --suppressions="$(pwd)/scripts/valgrind.supp" --gen-suppressions=all --num-callers=30)
export CDIFFUSERS_ISA=${CDF_VALGRIND_ISA:-generic}
status=0
summary=""
run() { # name, command...
  local name=$1 start rc errs
  shift
  start=$(date +%s)
  set +e
  "${vg[@]}" --log-file="$logs/$name.log" "$@" >"$logs/$name.out" 2>&1
  rc=$?
  set -e
  errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$logs/$name.log" | tail -1)
  if [ $rc -ne 0 ]; then
    status=1
    summary+=$(printf '%-26s FAILED: exit %d, %s errors, %ss; see %s' "$name" $rc "${errs:-?}" $(($(date +%s) - start)) "$logs/$name.log")$'\n'
  else
    summary+=$(printf '%-26s ok: 0 errors, no leaks, %ss' "$name" $(($(date +%s) - start)))$'\n'
  fi
}
for t in "${tests[@]}"; do
  run "$t" "$build/tests/$t"
done
# the command-line tool on its success paths (the tiny pipeline: every component, 2 steps)
model=$(pwd)/tests/data/pipelines/flux1_schnell_tiny
run cli_generate "$build/cdiffusers" generate --model "$model" --prompt "a red fox" --height 64 --width 64 --steps 2 \
  --seed 1 --output "$logs/work/out.png" --force --quiet
run cli_tokenize "$build/cdiffusers" tokenize --model "$model" --prompt "a red fox"
run cli_info "$build/cdiffusers" info --model "$model"
printf '%s' "$summary"
exit $status
