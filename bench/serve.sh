#!/bin/sh
# serve.sh BIN - the scheduler on a synthetic Llama-3.2-1B-shaped Q4_0 model
# (memory-bound decode): aggregate decode tokens/s of 1, 2, 4, 8 agents
# batched vs one after another, and the TTFT of a warm agent restored by the
# I/O thread while another decodes vs restored on demand. Env: AGENTS
# (1,2,4,8), CTK / CTV (q4), WARM_CTX (1024), THREADS (2), BENCH_DIR.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
mkdir -p "$BENCH_DIR"
m="$BENCH_DIR/llama-1b-q4_0.gguf"
[ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type q4_0 --seed 1
"$BIN" bench serve -m "$m" --agents "${AGENTS:-1,2,4,8}" -ctk "${CTK:-q4}" -ctv "${CTV:-q4}" \
    --warm-ctx "${WARM_CTX:-1024}" -t "${THREADS:-2}"
