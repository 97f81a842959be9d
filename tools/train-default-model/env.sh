# Sourced by train.sh, continue.sh and recolour.sh (after `set -eu`): the paths every step uses, then
# cd to this directory. HERE comes from the calling script's $0 (all three live next to this file).
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLI=${CLI:-$REPO/build/cdiffusers}
INIT=${INIT:-$REPO/models/shapes-flux-tiny}
OUT=${OUT:-$REPO/models/shapes-flux-tiny}
PY=/usr/bin/python3
cd "$HERE"
