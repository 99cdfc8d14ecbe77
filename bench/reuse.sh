#!/bin/sh
# reuse.sh BIN - memory-chunk reuse (agentkv bench reuse), three runs:
# 1. quality on the trained tiny-llama-h64 (1024-token context) over its
#    held-out text: 16 contexts of BOS + 4 chunks x 128 tokens + a 64-token
#    continuation; chunks and context in f16, q4, tq2; methods none,
#    cacheblend, agentkvshift (and its unit-weight ablation), full; ratios
#    0..100%; one timed run per prefill (the speed figure is run 3's). Table to
#    reuse-tiny-llama.txt, plot reuse-kl-tiny-llama.svg.
# 2. the same on stories260K over its story (1254 tokens: chunks of 48,
#    continuation 32, as many contexts as the text holds, up to 8).
# 3. speed on a synthetic Llama-3.2-1B-shaped Q4_0 model (random weights:
#    --speed-only, no KL): 4 chunks x 512 tokens (2K chunk tokens), full
#    vs each method at 10%, median of REPS runs.
# About 10 minutes on 2 cores, most of it run 3 (synthesizing the model
# once, then its 2K-token prefills).
# Env: OUT (default build/bench-reuse), BENCH_DIR (build/bench-models),
# SHARED (../shared), THREADS (2), REPS (3), SKIP_QUALITY, SKIP_SPEED.
set -e
BIN=${1:-build/agentkv}
OUT=${OUT:-build/bench-reuse}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
SHARED=${SHARED:-../shared}
T=${THREADS:-2}
mkdir -p "$OUT" "$BENCH_DIR"
date -u
lscpu | sed -n 's/^Model name: *//p' | head -1
uptime
if [ -z "$SKIP_QUALITY" ]; then
    "$BIN" bench reuse -m "$SHARED/models/tiny-llama-h64-gqa-f32.gguf" --data "$SHARED/golden/tiny-llama-h64/val.txt" \
        --chunks 4 --chunk-tokens 128 --cont 64 --contexts 16 -t "$T" \
        --plot "$OUT/reuse-kl-tiny-llama.svg" | tee "$OUT/reuse-tiny-llama.txt"
    uptime
    "$BIN" bench reuse -m "$SHARED/models/stories260K.gguf" --data "$SHARED/golden/stories260K/story.txt" \
        --chunks 4 --chunk-tokens 48 --cont 32 --contexts 8 -t "$T" \
        --plot "$OUT/reuse-kl-stories260K.svg" | tee "$OUT/reuse-stories260K.txt"
    uptime
fi
if [ -z "$SKIP_SPEED" ]; then
    m="$BENCH_DIR/llama-1b-4k-q4_0.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --ctx 4096 --type q4_0 --seed 1
    "$BIN" bench reuse -m "$m" --data "$SHARED/golden/tiny-llama-h64/val.txt" --speed-only \
        --chunks 4 --chunk-tokens 512 --cont 16 --contexts 1 --cache-types f16 --ratios 10 -t "$T" \
        --reps "${REPS:-3}" --methods none,cacheblend,agentkvshift | tee "$OUT/reuse-speed-1b.txt"
    uptime
fi
