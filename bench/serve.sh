#!/bin/sh
# serve.sh BIN - the scheduler on synthetic Llama-3.2-1B-shaped models, one
# per weight type in TYPES (default "q4_0 f16"): aggregate decode tokens/s of
# 1, 2, 4, 8 agents batched vs one after another, and the TTFT of a warm
# agent restored by the I/O thread while another decodes vs restored on
# demand (first type only).
# Why two types: the 0.7 N goal is for a memory-bound model. F16 stays
# memory-bound at 8 agents on two cores (8 tokens of FMAs take less time than
# reading 2 GB of weights); Q4_0 turns compute-bound there, its 8-token step
# bounded by the integer dot-product instructions (see docs/speed.md).
# Env: TYPES, AGENTS (1,2,4,8), CTK / CTV (q4), WARM_CTX (1024), THREADS (2),
# BENCH_DIR.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
mkdir -p "$BENCH_DIR"
warm=${WARM_CTX:-1024}
for t in ${TYPES:-q4_0 f16}; do
    m="$BENCH_DIR/llama-1b-$t.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type "$t" --seed 1
    echo "== $t weights"
    "$BIN" bench serve -m "$m" --agents "${AGENTS:-1,2,4,8}" -ctk "${CTK:-q4}" -ctv "${CTV:-q4}" \
        --warm-ctx "$warm" -t "${THREADS:-2}"
    warm=0
done
