#!/usr/bin/env bash
# `cdiffusers serve` through a real client (curl), on loopback only, with the default model
# (models/shapes-flux-tiny). Starts servers on free ports (--port 0) and checks: the OpenAI and
# AUTOMATIC1111 endpoints, the same PNG bytes as `cdiffusers generate`, n=2, the job API
# (progress, ETA, cancel between steps), a client that hangs up cancels its queued job, 8
# concurrent clients served in arrival order, a full queue (429 + Retry-After), bad requests
# (400 with a message, the server still serving), the body, header and URL limits (413, 431, 414), the edit endpoints
# (img2img and inpainting == `generate --image [--mask]`, bad images / masks / strengths -> 400), the API key
# (401), SIGTERM during a run
# (the running and queued requests get 503, exit status 0), and a GGUF transformer given with
# --transformer (the same bytes as generate --transformer; a missing file or bad --weight-type
# refused before listening).
#
# usage: test_serve.sh CDIFFUSERS_BINARY MODEL_DIR
BIN=$1
MODEL=$2
. "$(dirname "$0")/lib.sh"

# req PORT METHOD PATH [curl args...]: body in $TMP/body, headers in $TMP/hdr, prints the status
req() {
  local port=$1 method=$2 path=$3
  shift 3
  curl -s -o "$TMP/body" -D "$TMP/hdr" -w '%{http_code}' --max-time 120 -X "$method" "http://127.0.0.1:$port$path" \
    ${AUTH[@]+"${AUTH[@]}"} "$@"
}
post_json() { req "$1" POST "$2" -H 'Content-Type: application/json' --data-binary "$3"; }
json_num() { grep -o "\"$1\":-\{0,1\}[0-9.e+-]*" "$2" | head -1 | sed 's/.*://'; }
json_str() { grep -o "\"$1\":\"[^\"]*\"" "$2" | head -1 | sed 's/^[^:]*:"//; s/"$//'; }
header() { grep -i "^$1:" "$TMP/hdr" | tr -d '\r' | sed 's/^[^:]*: *//'; }
# b64 images of a response (OpenAI "b64_json" or A1111 "images"), one per line
images() {
  if grep -q '"b64_json"' "$1"; then grep -o '"b64_json":"[^"]*"' "$1" | sed 's/^"b64_json":"//; s/"$//'
  else sed 's/.*"images":\[//; s/\].*//' "$1" | tr ',' '\n' | tr -d '"'; echo; fi
}
expect_400() { # expect_400 DESCRIPTION PATH BODY MESSAGE_PART
  local st
  st=$(post_json "$A" "$2" "$3")
  if [ "$st" = 400 ] && grep -q "$4" "$TMP/body"; then ok; else bad "$1: status $st, body $(head -c 300 "$TMP/body")"; fi
}
wait_for() { # wait_for SECONDS COMMAND...: polls every 0.1 s
  local n=$(($1 * 10))
  shift
  for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done
  return 1
}
health_field() { req "$1" GET /health >/dev/null; json_num "$2" "$TMP/body"; }
accepted_is() { [ "$(health_field "$1" accepted)" = "$2" ]; }
job_field() { req "$1" GET "/v1/jobs/$2" >/dev/null; json_num "$3" "$TMP/body"; }
job_state() { req "$1" GET "/v1/jobs/$2" >/dev/null; json_str state "$TMP/body"; }
job_step_at_least() { local s; s=$(job_field "$1" "$2" step); [ -n "$s" ] && [ "$s" -ge "$3" ]; }
job_state_is() { [ "$(job_state "$1" "$2")" = "$3" ]; }
new_job() { # new_job PORT BODY: prints the id
  post_json "$1" /v1/jobs "$2" >/dev/null
  json_str id "$TMP/body"
}

PROMPT="a large yellow triangle on a purple background"
AUTH=() # curl arguments every req sends (server B: the API key)
section() { echo "-- $(date +%T) $*"; }

# ---- server A: the default limits, body limit 1 MB, queue 8 -----------------------------------
start_server A --max-body-mb 1 --queue 8
A=$PORT_A

st=$(req "$A" GET /health)
check "health 200" [ "$st" = 200 ]
check "health names the model" grep -q '"model":"shapes-flux-tiny"' "$TMP/body"
st=$(req "$A" GET /v1/models)
check "models lists the model" grep -q '"id":"shapes-flux-tiny"' "$TMP/body"

section "OpenAI generation"
# OpenAI generation: the same bytes as `cdiffusers generate` with the same seed
st=$(post_json "$A" /v1/images/generations "{\"prompt\":\"$PROMPT\",\"seed\":7,\"response_format\":\"b64_json\"}")
check "generations 200" [ "$st" = 200 ]
images "$TMP/body" | head -1 | base64 -d >"$TMP/srv7.png"
"$BIN" generate --model "$MODEL" --prompt "$PROMPT" --seed 7 --output "$TMP/cli7.png" --quiet
check "server PNG == generate PNG (seed 7)" cmp -s "$TMP/srv7.png" "$TMP/cli7.png"
check "seed header" [ "$(header X-Cdiffusers-Seed)" = 7 ]

section "n=2"
# n=2: seeds 7 and 8; the second equals generate --seed 8
st=$(post_json "$A" /v1/images/generations "{\"prompt\":\"$PROMPT\",\"seed\":7,\"n\":2,\"size\":\"64x64\"}")
check "n=2 200" [ "$st" = 200 ]
check "n=2 gives 2 images" [ "$(images "$TMP/body" | wc -l)" = 2 ]
images "$TMP/body" | sed -n 1p | base64 -d >"$TMP/n0.png"
images "$TMP/body" | sed -n 2p | base64 -d >"$TMP/n1.png"
"$BIN" generate --model "$MODEL" --prompt "$PROMPT" --seed 8 --output "$TMP/cli8.png" --quiet
check "n=2 first == seed 7" cmp -s "$TMP/n0.png" "$TMP/cli7.png"
check "n=2 second == seed 8" cmp -s "$TMP/n1.png" "$TMP/cli8.png"

section "A1111 txt2img"
# A1111 txt2img, batch_size 2
st=$(post_json "$A" /sdapi/v1/txt2img '{"prompt":"a small red circle on a white background","negative_prompt":"","steps":8,"cfg_scale":0,"width":64,"height":64,"seed":3,"batch_size":2,"sampler_name":"Euler"}')
check "txt2img 200" [ "$st" = 200 ]
check "txt2img 2 images" [ "$(images "$TMP/body" | wc -l)" = 2 ]
check "txt2img parameters" grep -q '"parameters":{"prompt":"a small red circle on a white background"' "$TMP/body"
check "txt2img info all_seeds" grep -q 'all_seeds\\":\[3,4\]' "$TMP/body"
images "$TMP/body" | sed -n 2p | base64 -d >"$TMP/a1.png"
"$BIN" generate --model "$MODEL" --prompt "a small red circle on a white background" --negative-prompt "" --steps 8 --guidance 0 \
  --seed 4 --output "$TMP/cli4.png" --quiet
check "txt2img second image == generate seed 4" cmp -s "$TMP/a1.png" "$TMP/cli4.png"

section "bad requests"
# bad requests: 400 with a message naming the problem; the server keeps serving
G=/v1/images/generations
expect_400 "malformed JSON" $G '{"prompt":"x"' "not valid JSON"
expect_400 "not an object" $G '[1,2]' "must be a JSON object"
expect_400 "empty body" $G '' "empty"
expect_400 "prompt missing" $G '{"n":1}' "'prompt' is required"
expect_400 "prompt wrong type" $G '{"prompt":5}' "'prompt' must be a string"
expect_400 "n wrong type" $G '{"prompt":"x","n":"2"}' "'n' must be an integer"
expect_400 "n too large" $G '{"prompt":"x","n":100}' "'n' must be between 1 and 8"
expect_400 "n fractional" $G '{"prompt":"x","n":1.5}' "'n' must be an integer"
expect_400 "size malformed" $G '{"prompt":"x","size":"big"}' "size must be"
expect_400 "size not a multiple" $G '{"prompt":"x","size":"72x64"}' "multiples of 16"
expect_400 "size over the limit" $G '{"prompt":"x","size":"8192x8192"}' "limit per side"
expect_400 "steps over the limit" $G '{"prompt":"x","steps":5000}' "steps must be between 1 and 1000"
expect_400 "steps wrong type" $G '{"prompt":"x","steps":[1]}' "'steps' must be an integer"
expect_400 "negative guidance" $G '{"prompt":"x","guidance":-1}' "'guidance' must be between"
expect_400 "seed out of range" $G '{"prompt":"x","seed":-5}' "'seed' must be between"
expect_400 "url response_format" $G '{"prompt":"x","response_format":"url"}' "'url' is not supported"
expect_400 "jpeg output" $G '{"prompt":"x","output_format":"jpeg"}' "output_format"
expect_400 "deep nesting" $G "$(printf '%0.s[' $(seq 1 200))" "deeper than"
big=$(head -c 40000 /dev/zero | tr '\0' 'a')
expect_400 "huge prompt" $G "{\"prompt\":\"$big\"}" "over the limit of 32768"
expect_400 "invalid UTF-8" $G "$(printf '{"prompt":"\xff\xfe"}')" "UTF-8"
expect_400 "txt2img wrong type" /sdapi/v1/txt2img '{"prompt":"x","width":"64"}' "'width' must be an integer"
expect_400 "txt2img batch limit" /sdapi/v1/txt2img '{"prompt":"x","batch_size":4,"n_iter":4}' "over the limit of 8 images"
st=$(req "$A" POST $G -H 'Content-Type: application/json' --data-binary @<(head -c 2000000 /dev/zero | tr '\0' ' '))
check "body over the limit -> 413 ($st)" [ "$st" = 413 ]
st=$(req "$A" GET /health -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' a)")
check "header over the limit -> 431 ($st)" [ "$st" = 431 ]
st=$(req "$A" GET "/health?$(head -c 70000 /dev/zero | tr '\0' a)")
check "URL over the limit -> 414 ($st)" [ "$st" = 414 ]
st=$(req "$A" GET /no/such/path)
check "unknown path 404" [ "$st" = 404 ]
st=$(req "$A" GET $G)
check "wrong method 405" [ "$st" = 405 ]
st=$(post_json "$A" $G '{"prompt":"a small blue square on a black background","seed":1,"steps":4}')
check "still serving after bad requests" [ "$st" = 200 ]

section "edit endpoints"
# edit endpoints: img2img and inpainting give the same PNG bytes as `generate --image [--mask]`.
# The PNG text names the inputs as `generate` writes their paths: the uploaded file names
# (OpenAI) or init_image.png / mask.png (A1111), so the CLI runs on files of those names.
IMG_DIR="$(cd "$(dirname "$0")/../../docs/img2img" && pwd)"
cp "$IMG_DIR/circle.png" "$TMP/init_image.png"
cp "$IMG_DIR/mask-bottom-right.png" "$TMP/mask.png"
(cd "$TMP" && "$BIN" generate --model "$MODEL" --prompt "$PROMPT" --image init_image.png --strength 0.6 --seed 5 \
  --output cli_i2i.png --quiet &&
  "$BIN" generate --model "$MODEL" --prompt "$PROMPT" --image init_image.png --mask mask.png --strength 1 --seed 5 \
    --output cli_inp.png --quiet) || bad "generate --image failed"
E=/v1/images/edits
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png;type=image/png" -F "prompt=$PROMPT" -F seed=5 -F strength=0.6 \
  -F response_format=b64_json)
check "edits img2img 200 ($st)" [ "$st" = 200 ]
images "$TMP/body" | head -1 | base64 -d >"$TMP/srv_i2i.png"
check "edits img2img PNG == generate --image PNG" cmp -s "$TMP/srv_i2i.png" "$TMP/cli_i2i.png"
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png;type=image/png" -F "mask=@$TMP/mask.png;type=image/png" \
  -F "prompt=$PROMPT" -F seed=5 -F strength=1)
check "edits inpainting 200 ($st)" [ "$st" = 200 ]
images "$TMP/body" | head -1 | base64 -d >"$TMP/srv_inp.png"
check "edits inpainting PNG == generate --image --mask PNG" cmp -s "$TMP/srv_inp.png" "$TMP/cli_inp.png"
b64=$(base64 -w0 "$TMP/init_image.png")
m64=$(base64 -w0 "$TMP/mask.png")
st=$(post_json "$A" /sdapi/v1/img2img "{\"prompt\":\"$PROMPT\",\"init_images\":[\"data:image/png;base64,$b64\"],\"denoising_strength\":0.6,\"seed\":5}")
check "A1111 img2img 200 ($st)" [ "$st" = 200 ]
check "A1111 img2img parameters give the strength" grep -q '"denoising_strength":0.6' "$TMP/body"
images "$TMP/body" | head -1 | base64 -d >"$TMP/a_i2i.png"
check "A1111 img2img PNG == generate --image PNG" cmp -s "$TMP/a_i2i.png" "$TMP/cli_i2i.png"
st=$(post_json "$A" /sdapi/v1/img2img "{\"prompt\":\"$PROMPT\",\"init_images\":[\"$b64\"],\"mask\":\"$m64\",\"denoising_strength\":1,\"seed\":5}")
check "A1111 inpainting 200 ($st)" [ "$st" = 200 ]
images "$TMP/body" | head -1 | base64 -d >"$TMP/a_inp.png"
check "A1111 inpainting PNG == generate --image --mask PNG" cmp -s "$TMP/a_inp.png" "$TMP/cli_inp.png"
# bad inputs: 400 with a message, the server keeps serving
st=$(req "$A" POST $E -F "prompt=make it red")
check "edits without image -> 400" [ "$st" = 400 ]
check "edits names the image" grep -q "'image' (a PNG file) is required" "$TMP/body"
st=$(req "$A" POST $E -F "image=@$MODEL/model_index.json" -F "prompt=x")
check "edits with a non-PNG -> 400 ($st)" [ "$st" = 400 ]
check "non-PNG says so" grep -qi "png" "$TMP/body"
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png" -F "prompt=x" -F "n=abc")
check "edits with bad n -> 400" [ "$st" = 400 ]
st=$(req "$A" POST $E -H 'Content-Type: application/json' --data-binary '{"prompt":"x"}')
check "edits not multipart -> 400" [ "$st" = 400 ]
OTHER="$(dirname "$0")/../data/golden/img2img/sd3_inpaint_s10_48x80/image_in.png"
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png" -F "mask=@$OTHER" -F "prompt=x" -F strength=1)
check "edits mask of another size -> 400 ($st)" [ "$st" = 400 ]
check "mask size message" grep -q "mask" "$TMP/body"
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png" -F "prompt=x" -F strength=0)
check "edits strength 0 -> 400 ($st)" [ "$st" = 400 ]
check "strength 0 message" grep -q "strength" "$TMP/body"
st=$(req "$A" POST $E -F "image=@$TMP/init_image.png" -F "prompt=x" -F strength=1.5)
check "edits strength 1.5 -> 400 ($st)" [ "$st" = 400 ]
check "strength 1.5 message" grep -q "strength" "$TMP/body"
o64=$(base64 -w0 "$OTHER")
expect_400 "img2img bad base64" /sdapi/v1/img2img '{"prompt":"x","init_images":["@@@@"]}' "not valid base64"
expect_400 "img2img no image" /sdapi/v1/img2img '{"prompt":"x"}' "init_images must be"
expect_400 "img2img non-PNG" /sdapi/v1/img2img "{\"prompt\":\"x\",\"init_images\":[\"$(base64 -w0 "$MODEL/model_index.json")\"]}" "PNG"
expect_400 "img2img mask of another size" /sdapi/v1/img2img "{\"prompt\":\"x\",\"init_images\":[\"$b64\"],\"mask\":\"$o64\"}" "mask"
expect_400 "img2img strength 0" /sdapi/v1/img2img "{\"init_images\":[\"$b64\"],\"denoising_strength\":0}" "strength"
expect_400 "img2img strength 1.5" /sdapi/v1/img2img "{\"init_images\":[\"$b64\"],\"denoising_strength\":1.5}" "denoising_strength"
st=$(post_json "$A" /sdapi/v1/img2img "{\"prompt\":\"$PROMPT\",\"init_images\":[\"$b64\"],\"denoising_strength\":0.6,\"seed\":5}")
check "still serving after bad edits ($st)" [ "$st" = 200 ]

section "job API"
# job API: progress with an ETA, cancel between steps
id=$(new_job "$A" '{"prompt":"a red ring","steps":1000,"seed":2}')
check "job created" [ -n "$id" ]
check "job reaches step 3" wait_for 60 job_step_at_least "$A" "$id" 3
req "$A" GET "/v1/jobs/$id" >/dev/null
check "job is running" grep -q '"state":"running"' "$TMP/body"
eta=$(json_num eta_seconds "$TMP/body")
check "job has an ETA ($eta)" [ -n "$eta" ]
req "$A" GET /sdapi/v1/progress >/dev/null
check "A1111 progress shows the job" grep -q "\"job\":\"$id\"" "$TMP/body"
check "A1111 progress steps" grep -q '"sampling_steps":1000' "$TMP/body"
# a client that hangs up while queued behind it: its job is cancelled and leaves the queue
before=$(health_field "$A" cancelled)
curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$A$G" -d '{"prompt":"x","seed":1}'
check "hung-up client's job cancelled" wait_for 10 bash -c "curl -s http://127.0.0.1:$A/health | grep -q '\"cancelled\":$((before + 1))'"
check "queue empty again" [ "$(health_field "$A" queued)" = 0 ]
st=$(req "$A" DELETE "/v1/jobs/$id")
check "DELETE 200" [ "$st" = 200 ]
check "job cancelled" wait_for 30 job_state_is "$A" "$id" cancelled
step=$(job_field "$A" "$id" step)
check "cancelled between steps ($step < 1000)" [ "$step" -lt 1000 ]
id=$(new_job "$A" "{\"prompt\":\"$PROMPT\",\"seed\":7}")
check "short job succeeds" wait_for 60 job_state_is "$A" "$id" succeeded
req "$A" GET "/v1/jobs/$id" >/dev/null
images "$TMP/body" | head -1 | base64 -d >"$TMP/job7.png"
check "job result == generate PNG" cmp -s "$TMP/job7.png" "$TMP/cli7.png"
check "job progress 1" grep -q '"progress":1' "$TMP/body"
st=$(req "$A" GET /v1/jobs/job-nope)
check "unknown job 404" [ "$st" = 404 ]

section "8 concurrent"
# 8 concurrent clients: each is sent once the previous one is accepted, all are answered, and
# they finish in the order they arrived
base=$(health_field "$A" accepted)
clients=()
for i in 1 2 3 4 5 6 7 8; do
  curl -s -o "$TMP/c$i.json" -D "$TMP/c$i.hdr" -w '%{http_code}' --max-time 120 "http://127.0.0.1:$A$G" \
    -d "{\"prompt\":\"a medium green cross on a white background\",\"seed\":$i,\"steps\":4}" >"$TMP/c$i.status" &
  clients+=($!)
  wait_for 30 accepted_is "$A" $((base + i)) || bad "client $i not accepted"
done
wait "${clients[@]}"
prev_job=0 prev_fin=0 inorder=1
for i in 1 2 3 4 5 6 7 8; do
  [ "$(cat "$TMP/c$i.status")" = 200 ] || bad "client $i status $(cat "$TMP/c$i.status")"
  j=$(grep -i '^X-Cdiffusers-Job:' "$TMP/c$i.hdr" | tr -dc 0-9)
  f=$(grep -i '^X-Cdiffusers-Finished:' "$TMP/c$i.hdr" | tr -dc 0-9)
  if [ -z "$j" ] || [ -z "$f" ] || [ "$j" -le "$prev_job" ] || [ "$f" -le "$prev_fin" ]; then inorder=0; fi
  prev_job=${j:-0} prev_fin=${f:-0}
done
check "8 concurrent clients served in arrival order" [ $inorder = 1 ]

section "server B"
# ---- server B: an API key and a queue of 1 -------------------------------------------------------
start_server B --api-key s3cret --queue 1
B=$PORT_B
st=$(req "$B" GET /v1/models)
check "no key -> 401" [ "$st" = 401 ]
st=$(req "$B" GET /v1/models -H 'Authorization: Bearer wrong')
check "wrong key -> 401" [ "$st" = 401 ]
check "401 says why" grep -q "API key" "$TMP/body"
st=$(req "$B" POST $G -H 'Authorization: Bearer s3cre' -d '{"prompt":"x"}')
check "prefix of the key -> 401" [ "$st" = 401 ]
st=$(req "$B" GET /health)
check "health needs no key" [ "$st" = 200 ]
AUTH=(-H 'Authorization: Bearer s3cret')
st=$(req "$B" POST /v1/jobs -d '{"prompt":"a red ring","steps":1000}')
check "right key -> accepted" [ "$st" = 202 ]
id1=$(json_str id "$TMP/body")
wait_for 30 bash -c "curl -s http://127.0.0.1:$B/health | grep -q '\"running\":true'" || bad "first job not running"
st=$(req "$B" POST /v1/jobs -d '{"prompt":"a red ring","steps":1000}')
id2=$(json_str id "$TMP/body")
check "second job queued" [ "$st" = 202 ]
st=$(req "$B" POST $G -d '{"prompt":"x"}')
check "queue full -> 429 ($st)" [ "$st" = 429 ]
ra=$(header Retry-After)
check "429 has Retry-After ($ra)" [ -n "$ra" ]
st=$(req "$B" POST /v1/jobs -d '{"prompt":"x"}')
check "queue full (jobs) -> 429" [ "$st" = 429 ]
req "$B" DELETE "/v1/jobs/$id2" >/dev/null
req "$B" DELETE "/v1/jobs/$id1" >/dev/null
check "both cancelled" wait_for 30 job_state_is "$B" "$id1" cancelled
"$BIN" serve --model "$MODEL" --host 0.0.0.0 --port 0 >"$TMP/open.log" 2>&1
rc=$?
check "non-loopback host without a key refused (exit $rc)" [ $rc = 2 ]
check "refusal says why" grep -q "api-key KEY is required" "$TMP/open.log"

AUTH=()

section "SIGTERM"
# ---- SIGTERM on server A during a run: the run stops after its step, the queue gets 503 ----------
curl -s -o "$TMP/t1.json" -w '%{http_code}' --max-time 120 "http://127.0.0.1:$A$G" -d '{"prompt":"a red ring","steps":1000}' >"$TMP/t1.status" &
c1=$!
wait_for 30 bash -c "curl -s http://127.0.0.1:$A/health | grep -q '\"running\":true'" || bad "run did not start"
curl -s -o "$TMP/t2.json" -w '%{http_code}' --max-time 120 "http://127.0.0.1:$A$G" -d '{"prompt":"x"}' >"$TMP/t2.status" &
c2=$!
wait_for 30 bash -c "curl -s http://127.0.0.1:$A/health | grep -q '\"queued\":1'" || bad "second request not queued"
wait_for 60 bash -c "curl -s http://127.0.0.1:$A/sdapi/v1/progress | grep -q '\"sampling_step\":[1-9]'" || bad "no step done"
kill -TERM "$PID_A"
for _ in $(seq 1 300); do kill -0 "$PID_A" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PID_A" 2>/dev/null; then bad "server still running 30 s after SIGTERM"; fi
wait "$PID_A"
rc=$?
check "SIGTERM exit status 0 ($rc)" [ $rc = 0 ]
wait $c1 $c2
check "running request -> 503 ($(cat "$TMP/t1.status"))" [ "$(cat "$TMP/t1.status")" = 503 ]
check "queued request -> 503 ($(cat "$TMP/t2.status"))" [ "$(cat "$TMP/t2.status")" = 503 ]
check "503 says shutting down" grep -q "shutting down" "$TMP/t1.json"
check "log: stopped cleanly" grep -q "stopped (" "$TMP/A.log"

kill -TERM "$PID_B"
wait "$PID_B"
check "server B exit status 0" [ $? = 0 ]

section "server C: a GGUF transformer (--transformer FILE --weight-type)"
# the model's files as generate takes them: a Q8_0 GGUF of the transformer (written by convert)
# serves the bytes `generate --transformer` writes, which differ from the folder's picture
"$BIN" convert --model "$MODEL" --output "$TMP/t_q8.gguf" --type q8_0 >"$TMP/convert.log" 2>&1 || bad "convert to Q8_0: $(tail -3 "$TMP/convert.log")"
start_server C --transformer "$TMP/t_q8.gguf"
st=$(post_json "$PORT_C" /v1/images/generations "{\"prompt\":\"$PROMPT\",\"seed\":7,\"response_format\":\"b64_json\"}")
check "GGUF server: generations 200 ($st)" [ "$st" = 200 ]
images "$TMP/body" | head -1 | base64 -d >"$TMP/srvq8.png"
"$BIN" generate --model "$MODEL" --transformer "$TMP/t_q8.gguf" --prompt "$PROMPT" --seed 7 --output "$TMP/cliq8.png" --quiet
check "GGUF server PNG == generate --transformer PNG (seed 7)" cmp -s "$TMP/srvq8.png" "$TMP/cliq8.png"
check "the GGUF transformer was used (PNG differs from the folder's)" bash -c "! cmp -s '$TMP/srvq8.png' '$TMP/srv7.png'"
kill -TERM "$PID_C"
wait "$PID_C"
check "server C exit status 0" [ $? = 0 ]
# a missing component file: a clear error before listening, nonzero exit
timeout 120 "$BIN" serve --model "$MODEL" --port 0 --transformer "$TMP/missing.gguf" >"$TMP/D.log" 2>&1 # a server that starts anyway ends by the timeout (124)
rc=$?
check "missing --transformer file: exit 1 ($rc)" [ $rc = 1 ]
check "missing --transformer file: named" grep -q "missing.gguf" "$TMP/D.log"
check "missing --transformer file: never listened" bash -c "! grep -q listening '$TMP/D.log'"
timeout 120 "$BIN" serve --model "$MODEL" --port 0 --weight-type q5 >"$TMP/E.log" 2>&1
rc=$?
check "bad --weight-type: usage error 2 ($rc)" [ $rc = 2 ]

echo "$passes passed, $failures failed"
[ $failures = 0 ]
