#!/usr/bin/env bash
# Every GPU check of the CUDA backend (issue #18) and of the pjrt backend on the XLA GPU plugin
# (issue #40) in one run, for a session that is lent a GPU. Not part of CI (CI machines have no
# GPU); scripts/test.sh never calls it.
#
#   scripts/device-check.sh --prepare
#       On the development machine (no GPU needed): builds build-device/ (CUDA on, sm_90 + PTX;
#       the pjrt backend on: its header pjrt_c_api.h is needed at build time only, and is carried
#       in .devbundle/include for a build there; the plugin itself is never bundled: the binary
#       dlopens the GPU machine's jax_plugins/xla_cuda13/xla_cuda_plugin.so; oneDNN and MPI off) and bundles its binaries and the shared libraries they need that a
#       CUDA image may lack (cJSON, libpng, PCRE2, utf8proc, cmocka) into .devbundle/ (git-ignored). Carry it: the GPU machine may have no -dev packages to build.
#   scripts/device-check.sh
#       On the GPU machine, e.g. through the device tool:
#         run(command="bash scripts/device-check.sh", carry=[".devbundle"], timeout_s=560)
#       Builds there when it can (falls back to the carried bundle), then in priority order, each
#       stage's results written to the summary before the next starts (a timeout keeps them):
#         1. `cdiffusers devices` (cuda:0; pjrt:0 on the GPU plugin), the host-logic test
#            (test_cuda_plan), the op suites: test_cuda_ops against the cpu backend, and
#            test_backend_ops with CDIFFUSERS_TEST_DEVICE=cuda, then =pjrt;
#         2. the golden tiny pipelines against diffusers, eager and compile, on cuda then on pjrt
#            (scripts/device_check_golden.py); then the rest of cuda's golden runs (components,
#            fuse/blocks, offload model/sequential, GGUF against its dequantized twin), an
#            out-of-memory run that must fail cleanly, compute-sanitizer (memcheck) on a short run;
#         3. with the time left, the FLUX.1-width benchmark (real widths, 2 double + 4 single
#            blocks, 1024^2) on cuda and pjrt against diffusers eager and torch.compile
#            (bench/cuda/run.sh --quick, BENCH_DEVICES="cuda pjrt").
#       Aims to finish within 8 minutes on an H200.
#       Writes $OUT/device-check.txt (summary: one PASS/FAIL/SKIP line per step) and
#       $OUT/device-check.log (everything). Exit status 0 only if no step failed.
#       DEVICE_CHECK_BUNDLE=1 skips the build there (uses .devbundle); DEVICE_CHECK_BENCH=0 skips
#       the benchmark. DEVICE_CHECK_PJRT_PLUGIN=/path/plugin.so: the plugin the pjrt stages open
#       (default: what `--device pjrt` picks, the GPU plugin where the NVIDIA driver is).
#   scripts/device-check.sh --dry-run
#       The same flow on a machine without a GPU (proves the script before a GPU session): no
#       build, the existing build/ (DEVICE_CHECK_BUILD=dir), the cuda steps SKIP, the pjrt stages
#       on the XLA CPU plugin (or DEVICE_CHECK_PJRT_PLUGIN) with tiny sizes (bench: the tiny
#       random FLUX.1 at 128^2, no diffusers unless torch is importable). Output in $OUT as above.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ "${1:-}" = "--prepare" ]; then
  set -e
  # the pjrt backend on (fails here, not there, without its header: scripts/install-deps.sh)
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DCDIFFUSERS_CUDA=ON -DCDIFFUSERS_PJRT=ON -DCDF_WITH_ONEDNN=OFF \
    -DCDF_WITH_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" >/dev/null
  targets=(cdiffusers_cli test_cuda_plan test_cuda_ops)
  [ -f tests/test_backend_ops.c ] && targets+=(test_backend_ops)
  cmake --build build-device -j"${JOBS:-2}" --target "${targets[@]}"
  rm -rf .devbundle && mkdir -p .devbundle/build-device/tests .devbundle/lib .devbundle/include
  cp build-device/cdiffusers .devbundle/build-device/
  # the PJRT C API header, for a build there (the GPU image has the plugin, not the header)
  cp "$(sed -n 's/^PJRT_C_API_INC:PATH=//p' build-device/CMakeCache.txt)/pjrt_c_api.h" .devbundle/include/
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
# cuda_step: as step, SKIP in a dry run (no GPU)
cuda_step() {
  if [ $DRY = 1 ]; then note "SKIP  $1 (--dry-run: no GPU)"; return 0; fi
  step "$@"
}

note "device-check$([ $DRY = 1 ] && echo ' --dry-run') of bundle $(cat .devbundle/COMMIT 2>/dev/null || echo '?') (tree there: $(git rev-parse --short HEAD 2>/dev/null || echo '?')) on $(hostname) at $(date -u +%FT%TZ)"
if [ $DRY = 0 ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader; } 2>&1 | tee -a "$SUMMARY"
  export PATH="/usr/local/cuda/bin:$PATH"
  nvcc --version 2>&1 | tail -1 | tee -a "$SUMMARY"
fi

# ---- build (there), else the carried bundle; a dry run uses the existing build ----
BIN=""
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# the pjrt backend there: the carried header (the GPU image has the plugin, not the header)
PJRT_CFG=()
[ -f .devbundle/include/pjrt_c_api.h ] && PJRT_CFG=(-DCDIFFUSERS_PJRT=ON -DCDIFFUSERS_PJRT_INCLUDE="$ROOT/.devbundle/include")
echo "==== build there" >>"$LOG"
tb=$(date +%s)
built=0
if [ $DRY = 1 ]; then
  BIN="${DEVICE_CHECK_BUILD:-$ROOT/build}"
  [ -x "$BIN/cdiffusers" ] || { note "FAIL  --dry-run: no $BIN/cdiffusers (build it, or set DEVICE_CHECK_BUILD)"; exit 1; }
  note "NOTE  --dry-run: no build, using $BIN; the cuda steps are skipped, pjrt runs on the plugin it finds here"
elif [ "${DEVICE_CHECK_BUNDLE:-0}" = 1 ]; then
  echo "DEVICE_CHECK_BUNDLE=1: no build there" >>"$LOG"
elif timeout 300 bash -c 'cmake -S . -B build-gpu "$@" -DCMAKE_BUILD_TYPE=Release -DCDIFFUSERS_CUDA=ON \
      -DCDF_WITH_ONEDNN=OFF -DCDF_WITH_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" &&
    t=(cdiffusers_cli test_cuda_plan test_cuda_ops); [ -f tests/test_backend_ops.c ] && t+=(test_backend_ops);
    cmake --build build-gpu -j16 --target "${t[@]}"' _ "${GEN[@]}" "${PJRT_CFG[@]}" >>"$LOG" 2>&1; then
  built=1
fi
if [ $DRY = 1 ]; then
  :
elif [ $built = 1 ]; then
  BIN="$ROOT/build-gpu"
  note "PASS  build there (CUDA on, sm_90; pjrt $(grep -q '^CDF_HAVE_PJRT\|PJRT_C_API_INC:PATH=/' build-gpu/CMakeCache.txt && echo on || echo off); $(($(date +%s) - tb)) s)"
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
# the plugin the pjrt stages open: DEVICE_CHECK_PJRT_PLUGIN, else what `--device pjrt` picks
# (the GPU plugin jax_plugins/xla_cuda13 in the Python site-packages where the driver is)
[ -n "${DEVICE_CHECK_PJRT_PLUGIN:-}" ] && export CDIFFUSERS_PJRT_PLUGIN="$DEVICE_CHECK_PJRT_PLUGIN"
if [ $DRY = 0 ] && [ -z "${DEVICE_CHECK_PJRT_PLUGIN:-}" ] && ! "$CLI" devices 2>&1 | grep -q '^  pjrt:0 .*(xla_cuda13)'; then
  # not where the backend searches (src/backend/pjrt/pjrt_runtime.c): ask this machine's Python
  gp=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("jax_plugins.xla_cuda13"); print(os.path.join(os.path.dirname(s.origin), "xla_cuda_plugin.so"))' 2>/dev/null)
  if [ -n "$gp" ] && [ -f "$gp" ]; then
    export CDIFFUSERS_PJRT_PLUGIN="$gp"
    note "NOTE  pjrt: the GPU plugin is outside the backend's search path; found by python3 at $gp (CDIFFUSERS_PJRT_PLUGIN)"
  else
    note "NOTE  pjrt: no jax_plugins/xla_cuda13 on this machine (python3 finds none): pjrt runs on the plugin it finds"
  fi
fi
export CDIFFUSERS_PJRT_CACHE="$ROOT/build-check/pjrt-cache"
mkdir -p "$ROOT/build-check"
export CLI ROOT DRY

# ======== stage 1: the devices are there; the op suites ========
note "---- stage 1: devices and op suites ($(elapsed) s)"
cuda_step "cdiffusers devices lists cuda:0" 60 bash -c "'$CLI' devices | tee /dev/stderr | grep -q '^  cuda:0'"
pjrt_devices() {
  local out
  out=$("$CLI" devices 2>&1)
  echo "$out"
  echo "$out" | grep -q '^  pjrt:0' || return 1
  # on the GPU machine, unless a plugin was named, pjrt must have opened the GPU plugin
  [ "$DRY" = 1 ] || [ -n "${DEVICE_CHECK_PJRT_PLUGIN:-}" ] || echo "$out" | grep -q '^  pjrt:0 .*(xla_cuda13)'
}
export -f pjrt_devices
step "cdiffusers devices lists pjrt:0$([ $DRY = 1 ] || echo ' (the GPU plugin)')" 120 bash -c pjrt_devices
grep -m1 '^  pjrt:0 ' "$LOG" | sed 's/^/      /' >>"$SUMMARY"
export CDIFFUSERS_TEST=1
for t in test_cuda_plan test_cuda_ops test_backend_ops; do
  [ -x "$BIN/tests/$t" ] || { note "SKIP  $t on cuda (not built)"; continue; }
  cuda_step "$t on cuda" 180 env CDIFFUSERS_TEST_DEVICE=cuda CDIFFUSERS_DEVICE=cuda "$BIN/tests/$t"
done
if [ -x "$BIN/tests/test_backend_ops" ]; then
  step "test_backend_ops on pjrt" 240 env CDIFFUSERS_TEST_DEVICE=pjrt CDIFFUSERS_DEVICE=pjrt "$BIN/tests/test_backend_ops"
else
  note "SKIP  test_backend_ops on pjrt (not built)"
fi

# ======== stage 2: the golden pipelines, eager and compile, on cuda then pjrt ========
note "---- stage 2: golden pipelines against diffusers ($(elapsed) s)"
golden() { # golden DEVICE LABEL BUDGET ARGS...
  local dev="$1" label="$2" budget="$3"
  shift 3
  step "$label" $((budget + 60)) env PYTHONUNBUFFERED=1 python3 scripts/device_check_golden.py --cli "$CLI" --device "$dev" \
    --out "$ROOT/build-check/$dev" --budget "$budget" "$@"
  mkdir -p "$ROOT/build-check/$dev"
  awk -v l="==== $label:" 'index($0, l) == 1 {on = 1; next} /^==== / {on = 0} on' "$LOG" |
    grep -E '^(PASS|FAIL|SKIP) |^golden on' | sed 's/^/      /' >>"$SUMMARY"
}
mkdir -p "$ROOT/build-check/cuda" "$ROOT/build-check/pjrt"
if [ $DRY = 1 ]; then
  note "SKIP  golden pipelines eager+compile on cuda (--dry-run: no GPU)"
else
  golden cuda "golden pipelines eager+compile on cuda" 90 --sections pipelines --modes eager,compile --offloads none
fi
golden pjrt "golden pipelines eager+compile on pjrt" 150 --sections pipelines --modes eager,compile --offloads none
if [ $DRY = 0 ]; then
  golden cuda "golden components, fuse/blocks, offload, GGUF on cuda" 150 --sections components,gguf,pipelines \
    --skip eager:none,compile:none

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
  export -f oom_check
  step "a 64K budget fails cleanly (message, exit 1, no output file)" 60 bash -c oom_check

  # ---- compute-sanitizer on a short run ----
  if command -v compute-sanitizer >/dev/null; then
    if ! step "compute-sanitizer memcheck (flux schnell tiny, f32, eager)" 120 compute-sanitizer --tool memcheck \
      --error-exitcode 9 "$CLI" run-model --model tests/data/golden/flux1_schnell/transformer \
      --inputs tests/data/golden/flux1_schnell/io.safetensors --output "$ROOT/build-check/san.safetensors" --force \
      --device cuda --dtype f32; then
      grep -q 'Device not supported' "$LOG" && note "      (the sanitizer does not support this runtime's GPU: gVisor? KINDS.md)"
    fi
  else
    note "SKIP  compute-sanitizer (not installed)"
  fi
else
  note "SKIP  golden components, fuse/blocks, offload, GGUF on cuda; out-of-memory check; compute-sanitizer (--dry-run)"
fi

# ======== stage 3: the benchmark, with what is left of the 8 minutes ========
note "---- stage 3: benchmark ($(elapsed) s)"
left=$((450 - $(elapsed)))
if [ "${DEVICE_CHECK_BENCH:-1}" = 0 ]; then
  note "SKIP  benchmark (DEVICE_CHECK_BENCH=0)"
elif [ -x bench/cuda/run.sh ] && [ "$left" -gt 90 ]; then
  if [ $DRY = 1 ]; then
    # tiny sizes on the CPU: the tiny random FLUX.1, 128^2, 2 steps; diffusers only if torch is there
    step "benchmark on pjrt (--dry-run: tiny FLUX.1, 128^2; ${left} s left)" "$left" env OUT="$OUT" CLI="$CLI" \
      BENCH_DEVICES=pjrt BENCH_MODELS=flux1-dev BENCH_SIZE=128 BENCH_STEPS=2 BENCH_PRESET=tiny-flux \
      BENCH_DIFFUSERS="$(python3 -c 'import torch, diffusers' 2>/dev/null && echo 1 || echo 0)" bench/cuda/run.sh --quick "$ROOT/build-check/bench"
  else
    step "benchmark FLUX.1 widths, 1024^2, cuda + pjrt vs diffusers (${left} s left)" "$left" env OUT="$OUT" CLI="$CLI" \
      BENCH_DEVICES="cuda pjrt" BENCH_MODELS=flux1-dev bench/cuda/run.sh --quick
  fi
  sed 's/^/      /' "$OUT/bench-cuda.txt" >>"$SUMMARY" 2>/dev/null
else
  note "SKIP  benchmark (${left} s left)"
fi

note "total $(elapsed) s; $([ $FAILED -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
exit $FAILED
