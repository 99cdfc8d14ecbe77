#!/bin/sh
# ttft.sh BIN - warm restore vs cold re-prefill on a synthetic Llama-3.2-1B-shaped
# Q4_0 model with a 32K context, q4 cache: cold / warm / hot TTFT and restore
# throughput at each context. Env: CONTEXTS (default 1024,4096,16384),
# CTK / CTV (q4), BENCH_DIR. Cold prefill at 16K takes minutes on 2 cores.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
mkdir -p "$BENCH_DIR"
m="$BENCH_DIR/llama-1b-q4_0-32k.gguf"
[ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type q4_0 --ctx 32768 --seed 1
"$BIN" bench ttft -m "$m" --contexts "${CONTEXTS:-1024,4096,16384}" -ctk "${CTK:-q4}" -ctv "${CTV:-q4}"
