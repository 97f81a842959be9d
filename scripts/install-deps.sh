#!/usr/bin/env bash
# Installs every build and test dependency of cdiffusers from Debian 12 packages.
# Idempotent: re-running it installs nothing new. Needs root (or sudo).
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config
  libcjson-dev        # config.json / model_index.json / tokenizer JSON
  libpng-dev          # PNG output
  libpcre2-dev        # tokenizer pre-tokenisation regexes
  libutf8proc-dev     # unicode normalisation for tokenizers
  libcmocka-dev       # unit tests
  libmicrohttpd-dev   # HTTP server of `cdiffusers serve`
  curl                # the server's tests (tests/serve/) talk to it with curl
  libomp-dev          # (clang's OpenMP runtime, for sanitizer/fuzz builds)
  clang-14 libclang-rt-14-dev  # libFuzzer + ASan/UBSan runtimes: scripts/fuzz.sh (run by scripts/test.sh)
  valgrind            # scripts/valgrind.sh (memcheck over the success paths, run by scripts/test.sh)
  libdnnl-dev         # oneDNN: matmul/conv on AVX-512 / AMX
  libopenmpi-dev openmpi-bin  # tensor parallelism
  python3             # test helpers that generate data
  python3-pip         # installs the XLA CPU PJRT plugin below
  python3-dev python3-venv  # the Python package (python/, docs/python.md): its extension, pip install . in a venv
  python3-numpy python3-pil python3-pytest python3-tqdm  # ... its arrays, images, tests and progress bar
)
# The CUDA toolkit (optional: the CUDA backend, -DCDIFFUSERS_CUDA=AUTO) is not installed here: the
# machines that have it carry it in /usr/local/cuda, and without it the build skips the backend.
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The PJRT backend's CPU plugin and header: the xla-cpu-pjrt package of the Python registry (63 MB),
# installed with pip --target into a folder of its own (Debian's pip refuses system-wide installs;
# --target touches no Python environment). The build finds the header there
# (-DCDIFFUSERS_PJRT=AUTO) and the binary finds the plugin there with no environment variable.
# CDF_SKIP_PJRT=1 skips it (the build then leaves the pjrt backend out).
PJRT_DIR=/usr/local/lib/cdiffusers/python
PJRT_VERSION=0.0.1
if [ "${CDF_SKIP_PJRT:-0}" != 1 ]; then
  if [ -f "$PJRT_DIR/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" ] && [ -f "$PJRT_DIR/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h" ]; then
    echo "install-deps: XLA CPU PJRT plugin present in $PJRT_DIR"
  else
    $SUDO mkdir -p "$PJRT_DIR"
    $SUDO python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$PJRT_DIR" "xla-cpu-pjrt==$PJRT_VERSION"
    echo "install-deps: installed xla-cpu-pjrt $PJRT_VERSION into $PJRT_DIR"
  fi
fi
