#!/usr/bin/env bash
# The CUDA benchmark of issue #18 (prepared; it has not run yet: it needs a lent GPU).
#
#   bench/cuda/run.sh [--quick] [workdir]
#
# Writes random-weight pipelines with the real configs (tools/make-random-pipeline: FLUX.1-dev,
# FLUX.1-schnell = the same without the guidance embedder, SD3.5-Medium; bf16), then on the same
# GPU, in the same run:
#   - cdiffusers: transformer forward time (run-model --repeat, forward_ms per call) and whole
#     pipelines at 1024x1024 (generate --device cuda) in eager and compile mode, wall seconds per
#     image and per step, peak device memory (--memory-stats);
#   - diffusers on PyTorch (bench/cuda/diffusers_bench.py): the same folders, bf16, eager and
#     torch.compile, seconds per step / per image, peak memory.
# --quick keeps the real widths but 2 double + 4 single blocks (FLUX) / 4 blocks (SD3) and small
# text encoders, so it fits in the device check's few minutes; per-block figures scale to the
# full depth. Results go to $OUT/bench-cuda.txt (OUT defaults to ./out). Needs: a CUDA build
# (CLI=path/to/cdiffusers, default build-gpu/cdiffusers), gcc, python3 with torch; diffusers
# from DIFFUSERS_SRC (a folder holding the `diffusers` package, carried as files: the GPU
# machine has no diffusers) or installed.
# Settings (environment): BENCH_DEVICES (default "cuda"; "cuda pjrt" also runs cdiffusers on the
# pjrt backend, the XLA GPU plugin there), BENCH_MODELS (default all three), BENCH_SIZE (1024),
# BENCH_STEPS (each case's), BENCH_PRESET (make-random-pipeline's preset for FLUX.1 instead of
# the real config: tiny-flux for scripts/device-check.sh --dry-run on a CPU), BENCH_DIFFUSERS=0
# (no diffusers runs).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
quick=0
[ "${1:-}" = "--quick" ] && { quick=1; shift; }
work=${1:-/tmp/cdf_bench_cuda}
OUT=${OUT:-$root/out}
CLI=${CLI:-$root/build-gpu/cdiffusers}
mkdir -p "$work" "$OUT"
res="$OUT/bench-cuda.txt"
log() { echo "$*" | tee -a "$res"; }

log "bench/cuda $(date -u +%FT%TZ) quick=$quick"
log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
log "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores"

gcc -std=gnu17 -O2 -o "$work/make-random-pipeline" "$root/tools/make-random-pipeline/make_random_pipeline.c" -lm || exit 1
small=()
if [ $quick = 1 ]; then
  small=(--set t5.layers=2 --set clip_l.layers=2 --set clip_g.layers=2)
  flux_small=(--set flux.layers=2 --set flux.single_layers=4)
  sd3_small=(--set sd3.layers=4 --set sd3.dual_layers=2)
else
  flux_small=()
  sd3_small=()
fi
declare -A models=(
  [flux1-dev]="--preset flux1 ${flux_small[*]:-} ${small[*]:-}"
  [flux1-schnell]="--preset flux1 --set flux.guidance_embeds=0 ${flux_small[*]:-} ${small[*]:-}"
  [sd35-medium]="--preset sd35-medium ${sd3_small[*]:-} ${small[*]:-}"
)
if [ -n "${BENCH_PRESET:-}" ]; then
  models[flux1-dev]="--preset $BENCH_PRESET"
  models[flux1-schnell]="--preset $BENCH_PRESET --set flux.guidance_embeds=0"
fi
want_models=${BENCH_MODELS:-"flux1-dev flux1-schnell sd35-medium"}
size=${BENCH_SIZE:-1024}
devices=${BENCH_DEVICES:-cuda}
log "models: $want_models; ${size}x${size}; devices: $devices"
for m in $want_models; do
  [ -f "$work/$m/model_index.json" ] && continue
  t=$(date +%s)
  # shellcheck disable=SC2086
  "$work/make-random-pipeline" ${models[$m]} --out "$work/$m" --tokenizers "$root/tests/data/tokenizers" >/dev/null || exit 1
  log "wrote $m in $(($(date +%s) - t)) s ($(du -sh "$work/$m" | cut -f1))"
done

# name steps guidance
cases=("flux1-dev 28 3.5" "flux1-schnell 4 0" "sd35-medium 28 4.5")
[ $quick = 1 ] && cases=("flux1-dev 4 3.5" "flux1-schnell 4 0" "sd35-medium 4 4.5")
sel=()
for c in "${cases[@]}"; do
  set -- $c
  case " $want_models " in *" $1 "*) sel+=("$1 ${BENCH_STEPS:-$2} $3") ;; esac
done
cases=("${sel[@]}")
for c in "${cases[@]}"; do
  set -- $c
  for dev in $devices; do
    for mode in eager compile; do
      # pjrt: a first run fills the program cache (XLA's compile), the timed one loads it
      runs=1
      [ "$dev" = pjrt ] && runs=2
      for r in $(seq $runs); do
        t=$(date +%s.%N)
        err=$("$CLI" generate --model "$work/$1" --prompt "a photo of a red fox in the snow" --height "$size" --width "$size" \
          --steps "$2" --guidance "$3" --seed 1 --output "$work/$1-$dev-$mode.png" --force --quiet --device "$dev" \
          --mode "$mode" --memory-stats 2>&1)
        rc=$?
        dt=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.3f", b - a}')
        first=""
        [ $runs = 2 ] && [ $r = 1 ] && first=" (first run: XLA compiles)"
        peak=$(echo "$err" | grep -i peak | tr '\n' ' ' | cut -c1-200)
        log "cdiffusers $1 ${size}x${size} $2 steps --device $dev mode=$mode$first: rc=$rc ${dt} s/image ($(awk -v a="$dt" -v n="$2" 'BEGIN{printf "%.4f", a / n}') s/step incl. text+VAE) $peak"
        [ $rc = 0 ] || { echo "$err" | tail -5 | tee -a "$res"; break; }
      done
    done
  done
done
[ "${BENCH_DIFFUSERS:-1}" = 0 ] && { log "diffusers: not run (BENCH_DIFFUSERS=0)"; exit 0; }

if [ -n "${DIFFUSERS_SRC:-}" ]; then export PYTHONPATH="$DIFFUSERS_SRC:${PYTHONPATH:-}"; fi
for c in "${cases[@]}"; do
  set -- $c
  PYTHONUNBUFFERED=1 python3 "$root/bench/cuda/diffusers_bench.py" --model "$work/$1" --steps "$2" --guidance "$3" \
    --size "$size" 2>&1 | tee -a "$res"
done
