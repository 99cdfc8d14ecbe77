#!/bin/sh
# store.sh BIN - warm restore of one agent from the local directory vs from
# Redis (a redis-server started here on a free loopback port, no
# persistence, stopped at the end) at 4K and 16K context on the
# Llama-3.2-1B cache shape (bench/store_restore.c: median ms, GB/s; every
# check of a load included), then TTFT on a synthetic Q4_0 llama-1b
# (agentkv bench ttft --store, the same redis-server): one cold re-prefill
# per context, its cache saved to the directory and put in Redis, then
# warm from the directory (page cache dropped, then cached), warm from
# Redis (no local copy) and hot. SKIP_TTFT=1 skips it (the 16K prefill
# takes minutes on 2 cores); SKIP_RESTORE=1 skips the restore part.
# Env: CONTEXTS (4096,16384), FORMATS ("f16 q4"), REPS (5), TTFT_KV (q4: the
# TTFT part's -ctk/-ctv), BENCH_DIR, ARCH (as BIN was built, e.g. native).
set -e
BIN=${1:-build/agentkv}
BUILD=$(dirname "$BIN")
BENCH_DIR=${BENCH_DIR:-$BUILD/bench-models}
CONTEXTS=${CONTEXTS:-4096,16384}
mkdir -p "$BENCH_DIR"
make -s BUILD="$BUILD" ${ARCH:+ARCH=$ARCH} "$BUILD/bench/store_restore"   # ARCH: as BIN was built
work=$(mktemp -d /tmp/agentkv-store-bench.XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --daemonize no \
    >"$work/redis.log" 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null; rm -rf "$work"' EXIT
for i in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "load: $(uptime)"
if [ -z "$SKIP_RESTORE" ]; then
    for f in ${FORMATS:-f16 q4}; do
        echo "== KV $f/$f"
        "$BUILD/bench/store_restore" "redis://127.0.0.1:$port/0" "$work/dir" "$CONTEXTS" "${REPS:-5}" $f $f
    done
fi
if [ -z "$SKIP_TTFT" ]; then
    m="$BENCH_DIR/llama-1b-q4_0-32k.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type q4_0 --ctx 32768 --seed 1
    kv=${TTFT_KV:-q4}
    echo "== TTFT, KV $kv/$kv: cold re-prefill, warm from the directory, warm from Redis, hot"
    "$BIN" bench ttft -m "$m" --contexts "$CONTEXTS" -ctk "$kv" -ctv "$kv" --memory-dir "$work/ttft" \
        --store "redis://127.0.0.1:$port/0"
    echo "load after: $(uptime)"
fi
