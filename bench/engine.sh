#!/bin/sh
# engine.sh BIN - prefill/decode speed on synthetic Llama-3.2-1B-shaped models
# (dim 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied, 32000 vocab),
# one per weight type, 2 threads. Models are cached in $BENCH_DIR.
# Per type: pp (prefill tok/s), tg (decode tok/s), batched decode of BATCH
# sequences (aggregate tok/s) and its ratio to one sequence, and decode's
# bandwidth (weights + KV read per token / time) as a % of a copy bandwidth
# (STREAM-style, bytes read + written) measured in the same run; a read-only
# bandwidth is shown beside it.
# Env: TYPES="f32 f16 bf16 q8_0 q4_0 q6_k q5_k q4_k", THREADS=2, PP=512,
#      TG=128, REPEATS=3, BATCH=8.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
TYPES=${TYPES:-"f32 f16 bf16 q8_0 q4_0 q6_k q5_k q4_k"}
THREADS=${THREADS:-2}
BATCH=${BATCH:-8}
mkdir -p "$BENCH_DIR"
S="$BENCH_DIR/summary.txt"
printf '%-6s %9s %9s %11s %7s %8s %8s %8s %6s\n' type pp_tok_s tg_tok_s batch${BATCH}_tok_s ratio tg_GB_s copy_GB read_GB tg_bw% > "$S"
# one JSON field's value
field() { echo "$1" | sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p"; }
for t in $TYPES; do
    m="$BENCH_DIR/llama-1b-$t.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type "$t" --seed 1
    j=$("$BIN" bench engine -m "$m" -p "${PP:-512}" -n "${TG:-128}" -t "$THREADS" -r "${REPEATS:-3}" \
        --batch "$BATCH" --json)
    echo "$j"
    printf '%-6s %9s %9s %11s %7s %8s %8s %8s %6s\n' "$t" "$(field "$j" pp_tok_s)" "$(field "$j" tg_tok_s)" \
        "$(field "$j" batch_tok_s)" "$(field "$j" batch_ratio)" "$(field "$j" tg_gb_s)" \
        "$(field "$j" copy_gb_s)" "$(field "$j" read_gb_s)" "$(field "$j" tg_bw_pct)" >> "$S"
done
echo
echo "llama.cpp reference (same shape, 2 threads, pp512 / tg128): F16 145 / 21.4, Q8_0 109 / 31, Q4_0 173 / 54"
cat "$S"
