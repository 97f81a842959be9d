#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one run (issue #18), for a session that is lent a GPU.
# Not part of CI (CI machines have no GPU); scripts/test.sh never calls it.
#
#   scripts/device-check.sh --prepare
#       On the development machine (no GPU needed): builds build-device/ (CUDA on, sm_90 + PTX;
#       oneDNN and MPI off) and bundles its binaries and the shared libraries they need that a
#       CUDA image may lack (cJSON, libpng, PCRE2, utf8proc, cmocka) into .devbundle/ (git-ignored). Carry it: the GPU machine may have no -dev packages to build.
#   scripts/device-check.sh
#       On the GPU machine, e.g. through the device tool:
#         run(command="bash scripts/device-check.sh", carry=[".devbundle"], timeout_s=560)
#       Builds there when it can (falls back to the carried bundle), then: `cdiffusers devices`,
#       the host-logic test (test_cuda_plan), the op suite against the cpu backend (test_cuda_ops)
#       and the lead's device op suite (test_backend_ops, if present) with CDIFFUSERS_TEST_DEVICE=cuda, the golden components
#       and pipelines on cuda in eager/fuse/compile/blocks with offload none/model/sequential, a GGUF
#       transformer against its dequantized twin (scripts/device_check_golden.py), an out-of-memory run that must fail cleanly,
#       compute-sanitizer (memcheck) on a short run, and, if time is left, the benchmark
#       (bench/cuda/run.sh --quick). Aims to finish within 8 minutes on an H200.
#       Writes $OUT/device-check.txt (summary: one PASS/FAIL/SKIP line per step) and
#       $OUT/device-check.log (everything). Exit status 0 only if no step failed.
#       DEVICE_CHECK_BUNDLE=1 skips the build there (uses .devbundle); DEVICE_CHECK_BENCH=0 skips
#       the benchmark.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DCDIFFUSERS_CUDA=ON -DCDF_WITH_ONEDNN=OFF -DCDF_WITH_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" >/dev/null
  targets=(cdiffusers_cli test_cuda_plan test_cuda_ops)
  [ -f tests/test_backend_ops.c ] && targets+=(test_backend_ops)
  cmake --build build-device -j"${JOBS:-2}" --target "${targets[@]}"
  rm -rf .devbundle && mkdir -p .devbundle/build-device/tests .devbundle/lib
  cp build-device/cdiffusers .devbundle/build-device/
  for t in "${targets[@]:1}"; do cp "build-device/tests/$t" .devbundle/build-device/tests/; done
  # the libraries the CUDA image may lack; never libc, the CUDA runtime or the driver
  for b in .devbundle/build-device/cdiffusers .devbundle/build-device/tests/*; do
    ldd "$b" | awk '/=> \//{print $3}' | grep -E 'libcjson|libpng|libpcre2|libutf8proc|libcmocka|libz\.|libgomp|libmicrohttpd|libgnutls|libp11-kit|libidn2|libunistring|libtasn1|libnettle|libhogweed|libgmp|libffi' || true
  done | sort -u | xargs -r -I{} cp -L {} .devbundle/lib/
  echo "$ROOT" >.devbundle/ROOT
  # the tree the bundle was built from (the GPU machine's copy may carry another .git)
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src cli include CMakeLists.txt || echo '+changes')" >.devbundle/COMMIT
  du -sh .devbundle
  echo "device-check: bundle ready; on the GPU machine run scripts/device-check.sh with carry=[\".devbundle\"]"
  exit 0
fi

OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
SUMMARY="$OUT/device-check.txt"
LOG="$OUT/device-check.log"
: >"$SUMMARY"
: >"$LOG"
T0=$(date +%s)
FAILED=0
elapsed() { echo $(($(date +%s) - T0)); }
note() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME TIMEOUT CMD...: runs CMD (output to the log), one summary line with the time
step() {
  local name="$1" limit="$2"
  shift 2
  local t=$(date +%s)
  echo "==== $name: $*" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t))
  if [ $rc -eq 0 ]; then note "PASS  $name (${dt} s)"; else note "FAIL  $name (exit $rc, ${dt} s)"; FAILED=1; fi
  return $rc
}

note "device-check of bundle $(cat .devbundle/COMMIT 2>/dev/null || echo '?') (tree there: $(git rev-parse --short HEAD 2>/dev/null || echo '?')) on $(hostname) at $(date -u +%FT%TZ)"
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader; } 2>&1 | tee -a "$SUMMARY"
export PATH="/usr/local/cuda/bin:$PATH"
nvcc --version 2>&1 | tail -1 | tee -a "$SUMMARY"

# ---- build (there), else the carried bundle ----
BIN=""
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
echo "==== build there" >>"$LOG"
tb=$(date +%s)
built=0
if [ "${DEVICE_CHECK_BUNDLE:-0}" = 1 ]; then
  echo "DEVICE_CHECK_BUNDLE=1: no build there" >>"$LOG"
elif timeout 300 bash -c 'cmake -S . -B build-gpu "$@" -DCMAKE_BUILD_TYPE=Release -DCDIFFUSERS_CUDA=ON \
      -DCDF_WITH_ONEDNN=OFF -DCDF_WITH_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" &&
    t=(cdiffusers_cli test_cuda_plan test_cuda_ops); [ -f tests/test_backend_ops.c ] && t+=(test_backend_ops);
    cmake --build build-gpu -j16 --target "${t[@]}"' _ "${GEN[@]}" >>"$LOG" 2>&1; then
  built=1
fi
if [ $built = 1 ]; then
  BIN="$ROOT/build-gpu"
  note "PASS  build there (CUDA on, sm_90; $(($(date +%s) - tb)) s)"
elif [ -f .devbundle/ROOT ]; then
  # the binaries carry absolute paths (tests/data, the CLI) of the checkout they were built in
  PREP_ROOT="$(cat .devbundle/ROOT)"
  if [ "$PREP_ROOT" != "$ROOT" ]; then mkdir -p "$(dirname "$PREP_ROOT")" && ln -sfn "$ROOT" "$PREP_ROOT"; fi
  [ -e "$ROOT/build-device" ] || ln -s "$ROOT/.devbundle/build-device" "$ROOT/build-device"
  export LD_LIBRARY_PATH="$ROOT/.devbundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  BIN="$ROOT/build-device"
  note "NOTE  no build there (missing -dev packages? see the log); using the carried bundle prepared in $PREP_ROOT"
else
  note "FAIL  no build there and no .devbundle (run scripts/device-check.sh --prepare and carry .devbundle)"
  exit 1
fi
CLI="$BIN/cdiffusers"
# cuBLASLt may live outside the toolkit's lib64 on that image (e.g. in the nvidia-cublas wheel)
if ldd "$CLI" | grep -q 'libcublasLt.*not found'; then
  lt=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}" && note "NOTE  cuBLASLt from $lt"
fi
ldd "$CLI" | grep 'not found' | tee -a "$SUMMARY"

# ---- the device is there ----
step "cdiffusers devices lists cuda:0" 60 bash -c "'$CLI' devices | tee /dev/stderr | grep -q '^  cuda:0'"

# ---- host logic + GPU smoke, op suite ----
export CDIFFUSERS_TEST=1 CDIFFUSERS_TEST_DEVICE=cuda CDIFFUSERS_DEVICE=cuda
for t in test_cuda_plan test_cuda_ops test_backend_ops; do
  [ -x "$BIN/tests/$t" ] || { note "SKIP  $t (not built)"; continue; }
  step "$t on cuda" 180 "$BIN/tests/$t"
done

# ---- golden components and pipelines, every mode and offload ----
step "golden components + pipelines on cuda" 300 env PYTHONUNBUFFERED=1 python3 scripts/device_check_golden.py \
  --cli "$CLI" --device cuda --out "$ROOT/build-check" --budget 240
grep -E '^(PASS|FAIL|SKIP) ' "$LOG" | grep -E 'run-model|generate' | sed 's/^/      /' >>"$SUMMARY"
grep -E '^golden on' "$LOG" | sed 's/^/      /' >>"$SUMMARY"

# ---- out of memory is a clear error, not a crash ----
oom_check() {
  local out rc
  out=$(CDIFFUSERS_CUDA_MEMORY_LIMIT=64K "$CLI" run-model --model tests/data/golden/vae_kl16/vae \
    --inputs tests/data/golden/vae_kl16/io.safetensors --output "$ROOT/build-check/oom.safetensors" --method decode \
    --force --device cuda 2>&1)
  rc=$?
  echo "$out (exit $rc)"
  [ $rc -ne 0 ] && [ $rc -lt 128 ] && echo "$out" | grep -q 'out of memory on cuda:0' && [ ! -e "$ROOT/build-check/oom.safetensors" ]
}
mkdir -p "$ROOT/build-check"
export -f oom_check
export CLI ROOT
step "a 64K budget fails cleanly (message, exit 1, no output file)" 60 bash -c oom_check

# ---- compute-sanitizer on a short run ----
if command -v compute-sanitizer >/dev/null; then
  if ! step "compute-sanitizer memcheck (flux schnell tiny, f32, eager)" 180 compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$CLI" run-model --model tests/data/golden/flux1_schnell/transformer \
    --inputs tests/data/golden/flux1_schnell/io.safetensors --output "$ROOT/build-check/san.safetensors" --force \
    --device cuda --dtype f32; then
    grep -q 'Device not supported' "$LOG" && note "      (the sanitizer does not support this runtime's GPU: gVisor? KINDS.md)"
  fi
else
  note "SKIP  compute-sanitizer (not installed)"
fi

# ---- benchmark, with what is left of the 8 minutes ----
left=$((450 - $(elapsed)))
if [ "${DEVICE_CHECK_BENCH:-1}" = 0 ]; then
  note "SKIP  bench/cuda (DEVICE_CHECK_BENCH=0)"
elif [ -x bench/cuda/run.sh ] && [ "$left" -gt 90 ]; then
  step "bench/cuda --quick (${left} s left)" "$left" env OUT="$OUT" CLI="$CLI" bench/cuda/run.sh --quick
else
  note "SKIP  bench/cuda (${left} s left)"
fi

note "total $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
exit $FAILED
