#!/usr/bin/env bash
# Bounded load run against `cdiffusers serve` on loopback: C clients, each sending requests one
# after another (curl) to POST /v1/images/generations for T seconds (at most 40; a request still
# running then gets 20 s more, then is dropped and counted as an error), after one warm-up request. Prints requests/s and the latency percentiles seen by the clients (a request's
# latency includes its wait in the server's queue: with one worker, throughput is the
# generation rate and latency grows with C).
#
# usage: bench/serve/run.sh [-c CLIENTS] [-t SECONDS] [-s STEPS] [-b BUILD_DIR] [-- serve options]
#   defaults: 4 clients, 30 s, the model's default steps (20), build/, the default model 64x64
set -euo pipefail
cd "$(dirname "$0")/../.."
clients=4 secs=30 steps=0 build=build
while getopts "c:t:s:b:h" o; do
  case $o in
    c) clients=$OPTARG ;;
    t) secs=$OPTARG ;;
    s) steps=$OPTARG ;;
    b) build=$OPTARG ;;
    *) sed -n '2,9p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "$secs" -le 40 ] || { echo "at most 40 s (the whole run stays within 60 s)"; exit 2; }
# passive OpenMP waits unless told otherwise: on this shared 2-core machine, spinning workers made
# one 20-step request take 12 s instead of 1.4 s (the test suite runs the same way)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
tmp=$(mktemp -d)
"$build/cdiffusers" serve --host 127.0.0.1 --port 0 --queue $((clients + 4)) "$@" >"$tmp/server.log" 2>&1 &
srv=$!
trap 'kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf "$tmp"' EXIT
port=""
for _ in $(seq 1 600); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/server.log" | grep -o '[0-9]*$' || true)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$tmp/server.log"; exit 1; }
url="http://127.0.0.1:$port/v1/images/generations"
body() { printf '{"prompt":"a large yellow triangle on a purple background","seed":%d%s}' "$1" "$([ "$steps" -gt 0 ] && echo ",\"steps\":$steps")"; }
curl -s -o /dev/null --max-time 30 "$url" -d "$(body 0)" # warm-up (first-use costs)
end=$(($(date +%s%N) + secs * 1000000000))
client() {
  local i=$1 n=0
  while [ "$(date +%s%N)" -lt "$end" ]; do
    local left=$(((end - $(date +%s%N)) / 1000000000 + 20))
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --max-time "$left" "$url" -d "$(body $((i * 100000 + n)))" >>"$tmp/lat.$i"
    n=$((n + 1))
  done
}
t0=$(date +%s%N)
for i in $(seq 1 "$clients"); do client "$i" & done
wait $(jobs -p | grep -v "^$srv$") 2>/dev/null || true
t1=$(date +%s%N)
cat "$tmp"/lat.* >"$tmp/all"
errors=$(awk '$1 != 200' "$tmp/all" | wc -l)
awk '$1 == 200 {print $2}' "$tmp/all" | sort -n >"$tmp/ok"
n=$(wc -l <"$tmp/ok")
pct() { awk -v p="$1" '{a[NR] = $1} END {if (NR == 0) {print "-"; exit} i = int(p * NR + 0.999999); if (i < 1) i = 1; if (i > NR) i = NR; printf "%.3f", a[i]}' "$tmp/ok"; }
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
rps=$(awk -v n="$n" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", n / ((b - a) / 1e9)}')
echo "clients=$clients seconds=$wall steps=${steps/#0/default} ok=$n errors=$errors requests/s=$rps" \
  "latency_s p50=$(pct 0.5) p90=$(pct 0.9) p99=$(pct 0.99) max=$(pct 1.0)"
