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
)
# The CUDA toolkit (optional: the CUDA backend, -DCDIFFUSERS_CUDA=AUTO) is not installed here: the
# machines that have it carry it in /usr/local/cuda, and without it the build skips the backend.
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
