#!/bin/sh
# http_test.sh BIN SHARED - drives `agentkv serve` over real HTTP with curl:
# greedy output equals `agentkv run` (plain and streamed), stop strings,
# agents (list, get, delete), metrics, bad input of every kind (each a 4xx
# with an OpenAI error body, the server still serving), API keys, the guards
# against web pages (Host, Origin, Content-Type; CORS with --cors-origin),
# and a clean SIGTERM that saves agents for a warm restart.
# Prints one line per check and exits non-zero if any failed. The server is
# killed on every exit path (normal end, a signal such as the runner's
# timeout); every curl call gives up after 60 s.
set -u
BIN=${1:-build/agentkv}
SHARED=${2:-../shared}
MODEL=$SHARED/models/stories260K.gguf
WORK=$(mktemp -d /tmp/agentkv-http.XXXXXX)
PID=
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$PID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
# every request bounded in time, whatever the call site passes
curl() { command curl --max-time 60 "$@"; }
FAILED=0
PASSED=0
ok() { PASSED=$((PASSED + 1)); echo "ok   $1"; }
bad() { FAILED=$((FAILED + 1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# jq-like field access with python3 (stdlib): jget FILE EXPR
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }

printf 'sk-test-%s\n' 0123456789 > "$WORK/key"
start() {
    "$BIN" serve -m "$MODEL" --port 0 --memory-dir "$WORK/mem" -t 2 -c 256 --max-body 65536 \
        --api-key-file "$WORK/key" "$@" 2> "$WORK/log" &
    PID=$!
    for _ in $(seq 1 100); do
        PORT=$(sed -n 's|.*serving .* on http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/log")
        [ -n "$PORT" ] && break
        sleep 0.1
    done
    URL=http://127.0.0.1:$PORT
}
AUTH="Authorization: Bearer sk-test-0123456789"
post() { # post PATH BODY OUT [extra curl args] -> prints the HTTP status
    p=$1; b=$2; o=$3; shift 3
    curl -s -o "$o" -w '%{http_code}' -H "$AUTH" -H 'Content-Type: application/json' "$@" -d "$b" "$URL$p"
}
post_nokey() { # as post, without the API key
    p=$1; b=$2; o=$3; shift 3
    curl -s -o "$o" -w '%{http_code}' -H 'Content-Type: application/json' "$@" -d "$b" "$URL$p"
}

start
check "server started and printed its port" '[ -n "$PORT" ]'
check "/health answers without a key" '[ "$(curl -s -o /dev/null -w %{http_code} $URL/health)" = 200 ]'
st=$(curl -s -o "$WORK/m.json" -w '%{http_code}' -H "$AUTH" "$URL/v1/models")
check "/v1/models lists the model" '[ "$st" = 200 ] && [ "$(jget $WORK/m.json "d[\"data\"][0][\"id\"]")" = stories260K ]'

# --- greedy over HTTP equals agentkv run
PROMPT="Once upon a time"
"$BIN" run -m "$MODEL" -p "$PROMPT" -n 24 --temp 0 -c 256 2>/dev/null > "$WORK/run.txt"
st=$(post /v1/completions "{\"model\":\"stories260K\",\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0}" "$WORK/c.json")
jget "$WORK/c.json" 'd["choices"][0]["text"]' > "$WORK/http.txt"
check "completions: greedy text equals agentkv run" '[ "$st" = 200 ] && cmp -s "$WORK/run.txt" "$WORK/http.txt"'
check "completions: usage and finish_reason" \
    '[ "$(jget $WORK/c.json "d[\"usage\"][\"completion_tokens\"], d[\"choices\"][0][\"finish_reason\"]")" = "24 length" ]'
curl -sN -H "$AUTH" -H 'Content-Type: application/json' -d "{\"model\":\"stories260K\",\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
    "$URL/v1/completions" > "$WORK/sse.txt"
python3 - "$WORK/sse.txt" > "$WORK/sse_text.txt" <<'EOF'
import json, sys
text, usage, done = "", None, False
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if not line: continue
    assert line.startswith("data: "), line
    if line == "data: [DONE]": done = True; continue
    d = json.loads(line[6:])
    for c in d["choices"]: text += c.get("text", "")
    if d.get("usage"): usage = d["usage"]
assert done and usage and usage["completion_tokens"] == 24
print(text)
EOF
check "completions streamed (SSE, [DONE], usage): same text" '[ $? = 0 ] && cmp -s "$WORK/run.txt" "$WORK/sse_text.txt"'

# --- batched with other agents: three requests at once, each equal to its own agentkv run
i=0
PIDS=""
for P in "Lily and Tom went to the park" "The little dog was sad because" "Once upon a time"; do
    i=$((i + 1))
    "$BIN" run -m "$MODEL" -p "$P" -n 32 --temp 0 -c 256 2>/dev/null > "$WORK/run$i.txt"
    (post /v1/completions "{\"model\":\"stories260K\",\"prompt\":\"$P\",\"max_tokens\":32,\"temperature\":0,\"stream\":$([ $i = 2 ] && echo true || echo false)}" "$WORK/b$i.json" -H "X-Agent-Id: batch-$i" > /dev/null) &
    PIDS="$PIDS $!"
done
wait $PIDS   # not a bare wait: the server is a child too
for i in 1 3; do jget "$WORK/b$i.json" 'd["choices"][0]["text"]' > "$WORK/b$i.txt"; done
python3 -c "import json,sys; print(''.join(c.get('text','') for l in open(sys.argv[1]) if l.startswith('data: {') for c in json.loads(l[6:])['choices']))" "$WORK/b2.json" > "$WORK/b2.txt"
check "three agents at once (one streamed): each equals its agentkv run" \
    'cmp -s $WORK/run1.txt $WORK/b1.txt && cmp -s $WORK/run2.txt $WORK/b2.txt && cmp -s $WORK/run3.txt $WORK/b3.txt'

# --- stop strings are enforced and not echoed
WORD=$(cut -c 12-16 "$WORK/run.txt")   # a piece of the greedy text
st=$(post /v1/completions "{\"model\":\"stories260K\",\"prompt\":\"$PROMPT\",\"max_tokens\":24,\"temperature\":0,\"stop\":[\"$WORD\"]}" "$WORK/s.json")
STOPPED=$(jget "$WORK/s.json" 'd["choices"][0]["text"]')
check "stop: text ends before the stop string ('$WORD')" \
    '[ "$st" = 200 ] && [ "$(jget $WORK/s.json "d[\"choices\"][0][\"finish_reason\"]")" = stop ] && head -c 11 "$WORK/run.txt" | cmp -s - "$(printf "%s" "$STOPPED" > $WORK/st.txt; echo $WORK/st.txt)"'

# --- an agent over two turns: cached tokens
CHAT1='{"model":"stories260K","messages":[{"role":"system","content":"You are a planner."},{"role":"user","content":"Plan a walk in the park."}],"max_tokens":12,"temperature":0}'
st=$(post /v1/chat/completions "$CHAT1" "$WORK/a1.json" -H 'X-Agent-Id: planner')
check "chat turn 1: 200, cold" '[ "$st" = 200 ] && [ "$(jget $WORK/a1.json "d[\"agentkv\"][\"tier\"]")" = cold ]'
REPLY=$(jget "$WORK/a1.json" 'json.dumps(d["choices"][0]["message"]["content"])')
CHAT2="{\"model\":\"stories260K\",\"agent_id\":\"planner\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a planner.\"},{\"role\":\"user\",\"content\":\"Plan a walk in the park.\"},{\"role\":\"assistant\",\"content\":$REPLY},{\"role\":\"user\",\"content\":\"Now the second step.\"}],\"max_tokens\":12,\"temperature\":0}"
st=$(post /v1/chat/completions "$CHAT2" "$WORK/a2.json")
check "chat turn 2 (agent_id in the body): cached_tokens > 0, tier hot" \
    '[ "$st" = 200 ] && [ "$(jget $WORK/a2.json "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"] > 0 and d[\"agentkv\"][\"tier\"]")" = hot ]'

# --- agents resource
st=$(curl -s -o "$WORK/ag.json" -w '%{http_code}' -H "$AUTH" "$URL/v1/agents")
check "GET /v1/agents lists planner" '[ "$st" = 200 ] && jget $WORK/ag.json "[a[\"id\"] for a in d[\"data\"]]" | grep -q planner'
st=$(curl -s -o "$WORK/g.json" -w '%{http_code}' -H "$AUTH" "$URL/v1/agents/planner")
check "GET /v1/agents/planner: tokens and tier" '[ "$st" = 200 ] && [ "$(jget $WORK/g.json "d[\"tokens\"] > 0 and d[\"tier\"]")" = hot ]'
post /v1/completions '{"model":"stories260K","prompt":"The dog","max_tokens":4,"temperature":0}' /dev/null -H 'X-Agent-Id: doomed' > /dev/null
for _ in $(seq 1 50); do [ -f "$WORK/mem/doomed.safetensors" ] && break; sleep 0.1; done  # saved in the background
check "a saved agent has its file" '[ -f "$WORK/mem/doomed.safetensors" ]'
st=$(curl -s -o "$WORK/d.json" -w '%{http_code}' -X DELETE -H "$AUTH" "$URL/v1/agents/doomed")
check "DELETE /v1/agents/doomed: deleted, file gone" '[ "$st" = 200 ] && [ ! -f "$WORK/mem/doomed.safetensors" ]'
st=$(curl -s -o "$WORK/d.json" -w '%{http_code}' -H "$AUTH" "$URL/v1/agents/doomed")
check "GET a deleted agent: 404" '[ "$st" = 404 ] && [ "$(jget $WORK/d.json "d[\"error\"][\"code\"]")" = agent_not_found ]'

# --- bad input: each a 4xx with an OpenAI error body; the server keeps serving
expect_error() { # name status body [curl args]
    name=$1; want=$2; body=$3; shift 3
    case "$*" in
    *Authorization*) st=$(post_nokey /v1/chat/completions "$body" "$WORK/e.json" "$@") ;;
    *) st=$(post /v1/chat/completions "$body" "$WORK/e.json" "$@") ;;
    esac
    msg=$(jget "$WORK/e.json" 'd["error"]["message"] and d["error"]["type"]')
    if [ "$st" = "$want" ] && [ -n "$msg" ] && [ "$(curl -s -o /dev/null -w %{http_code} $URL/health)" = 200 ]; then
        ok "bad input: $name -> $want ($(jget "$WORK/e.json" 'd["error"]["message"][:70]'))"
    else
        bad "bad input: $name -> got $st, want $want: $(cat "$WORK/e.json")"
    fi
}
MSG='"messages":[{"role":"user","content":"hi"}]'
expect_error "malformed JSON" 400 '{"model": "stories260K", "messages": [}'
expect_error "max_tokens of the wrong type" 400 "{\"model\":\"stories260K\",$MSG,\"max_tokens\":\"many\"}"
expect_error "temperature out of range" 400 "{\"model\":\"stories260K\",$MSG,\"temperature\":7}"
expect_error "missing messages" 400 '{"model":"stories260K"}'
expect_error "messages not an array" 400 '{"model":"stories260K","messages":"hi"}'
expect_error "unknown role" 400 '{"model":"stories260K","messages":[{"role":"wizard","content":"hi"}]}'
expect_error "unknown model" 404 "{\"model\":\"gpt-17\",$MSG}"
expect_error "n = 9 (at most 8)" 400 "{\"model\":\"stories260K\",$MSG,\"n\":9}"
expect_error "invalid agent id" 400 "{\"model\":\"stories260K\",$MSG,\"agent_id\":\"../../etc/passwd\"}"
expect_error "invalid agent id in the header" 400 "{\"model\":\"stories260K\",$MSG}" -H 'X-Agent-Id: .hidden'
LONG=$(python3 -c 'print("word " * 400)')
expect_error "prompt longer than the context" 400 "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}]}"
BIG=$(python3 -c 'print("x" * 70000)')
expect_error "body over the size limit" 413 "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"$BIG\"}]}"
expect_error "no API key" 401 "{\"model\":\"stories260K\",$MSG}" -H 'Authorization: none'
expect_error "wrong API key" 401 "{\"model\":\"stories260K\",$MSG}" -H 'Authorization: Bearer sk-wrong'
st=$(curl -s -o "$WORK/e.json" -w '%{http_code}' -H "$AUTH" "$URL/v1/nothing")
check "unknown URL: 404 error body" '[ "$st" = 404 ] && [ -n "$(jget $WORK/e.json "d[\"error\"][\"message\"]")" ]'

# --- web pages cannot drive the server; curl as documented still can
st=$(curl -s -o "$WORK/e.json" -w '%{http_code}' -H "$AUTH" -d "{\"model\":\"stories260K\",$MSG}" "$URL/v1/chat/completions")
check "curl -d without a JSON Content-Type: 415" \
    '[ "$st" = 415 ] && [ "$(jget $WORK/e.json "d[\"error\"][\"code\"]")" = unsupported_media_type ]'
st=$(curl -s -o "$WORK/e.json" -w '%{http_code}' -H "$AUTH" -H 'Host: attacker.example' "$URL/v1/agents")
check "Host attacker.example: 403 host_not_allowed" \
    '[ "$st" = 403 ] && [ "$(jget $WORK/e.json "d[\"error\"][\"code\"]")" = host_not_allowed ]'
st=$(curl -s -o "$WORK/e.json" -w '%{http_code}' -H "$AUTH" -H 'Origin: http://evil.example' "$URL/v1/agents")
check "an Origin without --cors-origin: 403 origin_not_allowed" \
    '[ "$st" = 403 ] && [ "$(jget $WORK/e.json "d[\"error\"][\"code\"]")" = origin_not_allowed ]'
st=$(curl -s -o "$WORK/e.json" -w '%{http_code}' -H "$AUTH" "http://localhost:$PORT/v1/models/stories260K")
check "curl to localhost: GET /v1/models/stories260K" \
    '[ "$st" = 200 ] && [ "$(jget $WORK/e.json "d[\"id\"], d[\"object\"]")" = "stories260K model" ]'

# --- metrics
curl -s -H "$AUTH" "$URL/metrics" > "$WORK/metrics.txt"
check "/metrics: Prometheus text with hits, TTFT histogram, batch sizes, bad requests" \
    'grep -q "^agentkv_hits_total{tier=\"hot\"} [1-9]" $WORK/metrics.txt && grep -q "^agentkv_ttft_seconds_bucket{tier=\"cold\",le=\"+Inf\"} [1-9]" $WORK/metrics.txt && grep -q "^agentkv_batch_size_count [1-9]" $WORK/metrics.txt && grep -q "status=\"400\"" $WORK/metrics.txt'

# --- SIGTERM: saves every agent, exits 0; a restart serves planner warm
kill -TERM $PID
wait $PID
rc=$?
check "SIGTERM: exit 0, agents saved" '[ $rc = 0 ] && grep -q "every agent saved" $WORK/log && [ -f $WORK/mem/planner.safetensors ]'
start
st=$(post /v1/chat/completions "$CHAT2" "$WORK/a3.json")
check "after a restart: tier warm, cached_tokens > 0, same greedy reply" \
    '[ "$st" = 200 ] && [ "$(jget $WORK/a3.json "d[\"agentkv\"][\"tier\"], d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"] > 0")" = "warm True" ] && [ "$(jget $WORK/a3.json "d[\"choices\"][0][\"message\"][\"content\"]")" = "$(jget $WORK/a2.json "d[\"choices\"][0][\"message\"][\"content\"]")" ]'
kill -TERM $PID
wait $PID

# --- with --cors-origin: a browser's preflight and its answers
start --cors-origin http://app.example:5173
curl -s -D "$WORK/pre.h" -o /dev/null -X OPTIONS -H 'Origin: http://app.example:5173' \
    -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: content-type,authorization' \
    "$URL/v1/chat/completions"
check "--cors-origin: preflight 204 with the origin, methods and headers" \
    'head -1 $WORK/pre.h | grep -q " 204" && grep -qi "^access-control-allow-origin: http://app.example:5173" $WORK/pre.h && grep -qi "^access-control-allow-methods:.*POST" $WORK/pre.h && grep -qi "^access-control-allow-headers:.*authorization" $WORK/pre.h'
curl -s -D "$WORK/get.h" -o /dev/null -H "$AUTH" -H 'Origin: http://app.example:5173' "$URL/v1/agents"
check "--cors-origin: an answer carries Access-Control-Allow-Origin and Vary" \
    'head -1 $WORK/get.h | grep -q " 200" && grep -qi "^access-control-allow-origin: http://app.example:5173" $WORK/get.h && grep -qi "^vary: origin" $WORK/get.h'
kill -TERM $PID
wait $PID
echo "http: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
