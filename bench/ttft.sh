#!/bin/sh
# ttft.sh BIN - warm restore vs cold re-prefill on a synthetic Llama-3.2-1B-shaped
# Q4_0 model with a 32K context, q4 cache: cold / warm / hot TTFT and restore
# throughput at each context; then restores alone (no prefill: random caches)
# of 2000 tokens, llama.cpp's slot-restore comparison point (1.5 ms for its
# 18.4 MB q4_0 cache, 10.5 ms for 65.6 MB f16, from the page cache, without
# verification), and of each context, in q4 and f16, next to plain reads.
# Env: CONTEXTS (default 1024,4096,16384), CTK / CTV (q4), BENCH_DIR,
# SKIP_TTFT=1 (restores only). Cold prefill at 16K takes minutes on 2 cores.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
mkdir -p "$BENCH_DIR"
m="$BENCH_DIR/llama-1b-q4_0-32k.gguf"
[ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type q4_0 --ctx 32768 --seed 1
[ -n "$SKIP_TTFT" ] || "$BIN" bench ttft -m "$m" --contexts "${CONTEXTS:-1024,4096,16384}" -ctk "${CTK:-q4}" -ctv "${CTV:-q4}"
for f in q4 f16; do
    "$BIN" bench ttft -m "$m" --restore-only --contexts "2000,${CONTEXTS:-1024,4096,16384}" -ctk $f -ctv $f --reps 10
done
