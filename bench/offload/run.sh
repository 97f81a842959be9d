#!/bin/sh
# Model offload benchmark: an SD3.5-Medium-shaped pipeline with random bf16 weights
# (tools/make-random-pipeline), 512x512, CFG (batch 2), --offload none vs model vs sequential:
# the planner's expected peaks, the measured device peaks per phase, peak RSS and wall time; then
# the same request under a device budget between the largest model and the sum of all models,
# where none must be refused up front and model must run; under planned/1.1, where model should
# fail (the planner's peak is within 10% of what the run needs); and under the sequential plan
# / 0.9 (below the transformer alone), where model must be refused and sequential must run, and
# sequential plan / 1.1, where sequential should fail. Sequential without a budget runs twice:
# with the copy stream (the next block's uploads beside the compute) and without
# (CDIFFUSERS_COPY_STREAM=0: on the compute stream, as before it existed).
#
#   BUILD_DIR=build-offload bench/offload/run.sh [generator --set options...]
#
# Depth is reduced by default to fit a small shared machine (see DEPTH below); pass your own
# --set options to change it, e.g. "--set sd3.layers=24 --set sd3.dual_layers=13" for the real
# transformer (2.5 B parameters, ~5 GB in bf16 plus a 0.9 GB f32 position table).
# Environment: WORK (default /tmp/cdf-offload-bench) holds the generated pipeline (~2.6 GB with
# the default depth); STEPS (default 2); RUNS (a word: only the runs whose label contains it);
# KERNELS (default fast: CDIFFUSERS_KERNELS=fast with
# prepacking off, CDIFFUSERS_PREPACK_MB=0, so that RSS is not inflated by packed copies of the
# weights; "reference" for the reference kernels, ~5x slower).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
work=${WORK:-/tmp/cdf-offload-bench}
steps=${STEPS:-2}
kernels=${KERNELS:-fast}
BUILD_DIR=$build "$root/bench/offload/build.sh" >/dev/null
cli=$build/cdiffusers
[ -x "$cli" ] || { echo "run.sh: $cli not built (cmake --build $build --target cdiffusers_cli)" >&2; exit 1; }

DEPTH="--set sd3.layers=4 --set sd3.dual_layers=2 --set t5.layers=2 --set clip_g.layers=4 --set clip_l.layers=2"
[ $# -gt 0 ] && DEPTH="$*"
model=$work/sd35m
if [ ! -f "$model/model_index.json" ] || [ "$(cat "$work/spec" 2>/dev/null)" != "$DEPTH" ]; then
    rm -rf "$model"
    mkdir -p "$work"
    # shellcheck disable=SC2086
    "$build/make-random-pipeline" --preset sd35-medium --out "$model" --tokenizers "$root/tests/data/tokenizers" $DEPTH
    echo "$DEPTH" > "$work/spec"
fi
if [ "$kernels" = fast ]; then export CDIFFUSERS_KERNELS=fast CDIFFUSERS_PREPACK_MB=0; fi

echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; date: $(date -u +%Y-%m-%d)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pipeline: sd35-medium preset with $DEPTH ($(du -sh "$model" | cut -f1) on disk); kernels: $kernels; steps: $steps"
echo
req="--height 512 --width 512 --dtype bf16 --guidance 5 --max-sequence-length 256"
for mode in none model sequential; do
    echo "### plan, --offload $mode"
    # shellcheck disable=SC2086
    "$cli" plan --model "$model" $req --offload $mode | sed -n '/^phase/,$p'
    echo
done
peak_model=$("$cli" plan --model "$model" $req --offload model | sed -n 's/^expected peak: .*(\([0-9]*\) bytes).*/\1/p')
budget=$((peak_model * 10 / 9))
below=$((peak_model * 10 / 11))
peak_seq=$("$cli" plan --model "$model" $req --offload sequential | sed -n 's/^expected peak: .*(\([0-9]*\) bytes).*/\1/p')
budget_seq=$((peak_seq * 10 / 9))
below_seq=$((peak_seq * 10 / 11))

run() { # label, extra args (RUNS=sequential: only the runs whose label has that word; RUN_ENV:
         # VAR=value words for the run's environment)
    label=$1
    shift
    case "$label" in *"${RUNS:-}"*) ;; *) return 0 ;; esac
    out=$work/err.txt
    set +e
    # shellcheck disable=SC2086
    env ${RUN_ENV:-} /usr/bin/time -f "TIME %e %M" "$cli" generate --model "$model" --prompt "a photo of a cat" $req --steps "$steps" \
        --negative-prompt "blurry" --output "$work/out.png" --force --quiet --memory-stats "$@" 2> "$out"
    rc=$?
    set -e
    t=$(sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\1/p' "$out")
    rss=$(sed -n 's/^TIME \([0-9.]*\) \([0-9]*\)$/\2/p' "$out")
    peaks=$(sed -n 's/^cdiffusers: device memory peaks (offload [a-z]*): \(.*\); peak.*/\1/p' "$out")
    loads=$(sed -n 's/.*models materialised: \([0-9]*\).*/\1/p' "$out")
    if [ $rc -eq 0 ]; then
        printf '| %s | ok | %s | %s | %.2f GiB | %s |\n' "$label" "$peaks" "$loads" "$(echo "$rss / 1048576" | bc -l)" "$t"
    else
        printf '| %s | exit %d: %s | | | %.2f GiB | %s |\n' "$label" $rc "$(grep -v '^TIME' "$out" | head -1 | cut -c1-160)" \
            "$(echo "$rss / 1048576" | bc -l)" "$t"
    fi
}
echo "| run | result | measured device peaks per phase | models materialised | peak RSS | wall s |"
echo "|---|---|---|---|---|---|"
run "none, no budget" --offload none
run "model, no budget" --offload model
run "none, budget $budget B" --offload none --device-memory "$budget"
run "model, budget $budget B (planned / 0.9)" --offload model --device-memory "$budget"
run "model, budget $below B (planned / 1.1)" --offload model --device-memory "$below"
run "sequential, no budget" --offload sequential
# the same without the copy stream (the uploads queued on the compute stream, in order with the
# compute): the copy stream's effect, in the same run
RUN_ENV=CDIFFUSERS_COPY_STREAM=0
run "sequential, no budget, no copy stream" --offload sequential
RUN_ENV=
run "model, budget $budget_seq B (sequential plan / 0.9)" --offload model --device-memory "$budget_seq"
run "sequential, budget $budget_seq B (sequential plan / 0.9)" --offload sequential --device-memory "$budget_seq"
run "sequential, budget $below_seq B (sequential plan / 1.1)" --offload sequential --device-memory "$below_seq"
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
