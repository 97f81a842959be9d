# Shared by the tests of `cdiffusers serve` (sourced): temporary folder, servers started on free
# loopback ports and killed at exit, pass/fail counting. Needs BIN and MODEL set.
set -u
command -v curl >/dev/null || { echo "curl is missing (scripts/install-deps.sh installs it)"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [ "${failures:-0}" != 0 ]; then # the servers' own account of what went wrong
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
failures=0
passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() { # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then ok; else bad "$what"; fi
}

# start_server NAME ARGS...: sets PORT_<NAME> and PID_<NAME>
start_server() {
  local name=$1
  shift
  "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port 0 "$@" >"$TMP/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local port=""
  for _ in $(seq 1 600); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$TMP/$name.log" | grep -o '[0-9]*$')
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "server $name did not start:"
    cat "$TMP/$name.log"
    exit 1
  fi
  eval "PORT_$name=$port PID_$name=$pid"
}
