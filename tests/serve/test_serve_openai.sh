#!/usr/bin/env bash
# `cdiffusers serve` through the official openai Python client (tests/serve/openai_client.py), on
# loopback. The client comes from the package registry: $CDF_OPENAI_PYTHON if set, else a
# python with `openai` in an existing venv (/work/serve-openai-venv, VENV_DIR), else one is
# made in VENV_DIR with pip. When none can be had (no network, no pip) the test is skipped:
# exit 77 with the reason.
#
# usage: test_serve_openai.sh CDIFFUSERS_BINARY MODEL_DIR VENV_DIR
BIN=$1
MODEL=$2
VENV=$3
skip() { echo "SKIPPED: $*"; exit 77; }
has_openai() { [ -x "$1" ] && "$1" -c 'import openai' 2>/dev/null; }
PY=${CDF_OPENAI_PYTHON:-}
for cand in "$PY" /work/serve-openai-venv/bin/python "$VENV/bin/python"; do
  if [ -n "$cand" ] && has_openai "$cand"; then PY=$cand; break; fi
  PY=
done
if [ -z "$PY" ]; then
  command -v python3 >/dev/null || skip "no python3 to run the openai client"
  rm -rf "$VENV"
  python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (python3-venv missing?)"
  PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 180 "$VENV/bin/pip" install -q openai >"$VENV.log" 2>&1 ||
    skip "the openai package could not be installed from the package registry (no network?): $(tail -1 "$VENV.log")"
  has_openai "$VENV/bin/python" || skip "openai installed but does not import"
  PY=$VENV/bin/python
fi
. "$(dirname "$0")/lib.sh"
echo "openai client: $("$PY" -c 'import openai; print(openai.__version__)') ($PY)"
start_server A --api-key s3cret
"$BIN" generate --model "$MODEL" --prompt "a large yellow triangle on a purple background" --seed 7 --output "$TMP/seed7.png" --quiet
# images.edit: the PNG text names the input as uploaded (init_image.png), so generate reads a file of that name
cp "$(dirname "$0")/../../docs/img2img/circle.png" "$TMP/init_image.png"
(cd "$TMP" && "$BIN" generate --model "$MODEL" --prompt "a large yellow triangle on a purple background" --image init_image.png \
  --strength 0.6 --seed 5 --output edit5.png --quiet)
"$PY" "$(dirname "$0")/openai_client.py" "http://127.0.0.1:$PORT_A/v1" s3cret "$(basename "$MODEL")" "$TMP/seed7.png" \
  "$TMP/init_image.png" "$TMP/edit5.png"
check "the openai client's checks" [ $? = 0 ]
kill -TERM "$PID_A"
wait "$PID_A"
check "server exit status 0" [ $? = 0 ]
echo "$passes passed, $failures failed"
[ $failures = 0 ]
