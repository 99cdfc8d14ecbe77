#!/bin/sh
# engine.sh BIN - prefill/decode speed on synthetic Llama-3.2-1B-shaped models
# (dim 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied, 32000 vocab),
# one per weight type, 2 threads. Models are cached in $BENCH_DIR.
# Env: TYPES="f16 q8_0 q4_0", THREADS=2, PP=512, TG=128, REPEATS=3.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
TYPES=${TYPES:-"f32 f16 bf16 q8_0 q4_0"}
THREADS=${THREADS:-2}
mkdir -p "$BENCH_DIR"
printf '%-6s %12s %12s %10s\n' type pp_tok_s tg_tok_s tg_GB_s > "$BENCH_DIR/summary.txt"
for t in $TYPES; do
    m="$BENCH_DIR/llama-1b-$t.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type "$t" --seed 1
    j=$("$BIN" bench engine -m "$m" -p "${PP:-512}" -n "${TG:-128}" -t "$THREADS" -r "${REPEATS:-3}" --json)
    echo "$j"
    echo "$j" | sed -n 's/.*"pp_tok_s": \([0-9.]*\).*"tg_tok_s": \([0-9.]*\).*"tg_weight_gb_s": \([0-9.]*\).*/\1 \2 \3/p' |
        while read pp tg gb; do printf '%-6s %12s %12s %10s\n' "$t" "$pp" "$tg" "$gb"; done >> "$BENCH_DIR/summary.txt"
done
echo
echo "llama.cpp reference (same shape, 2 threads, pp512 / tg128): F16 145 / 21.4, Q8_0 109 / 31, Q4_0 173 / 54"
cat "$BENCH_DIR/summary.txt"
