#!/bin/sh
# handoff.sh AGENTKV [OUT] - handoff reuse's accuracy (docs/handoff.md,
# "Measured"): on both trained models, a history computed after a 40-token
# head is placed after a 57-token head by none, cacheblend and agentkvshift
# at each ratio and scored against full prefill (bench reuse --handoff),
# in f16 and q4; then the residual tables. Tables in OUT (default
# build/bench-handoff), plots in docs/. About 3 minutes on 2 cores.
set -eu
B=${1:?usage: handoff.sh AGENTKV [OUT]}
OUT=${2:-build/bench-handoff}
S=${AK_SHARED:-../shared}
mkdir -p "$OUT"
run() {   # name model data chunk-tokens cont contexts
    "$B" bench reuse -m "$S/models/$2" --data "$S/golden/$3" --chunks 2 --chunk-tokens "$4" --cont "$5" \
        --contexts "$6" -t 2 --cache-types f16,q4 --handoff 40,57 --methods none,cacheblend,agentkvshift,full \
        --plot "docs/handoff-kl-$1.svg" > "$OUT/$1.txt"
    "$B" bench reuse -m "$S/models/$2" --data "$S/golden/$3" --chunks 2 --chunk-tokens "$4" --cont "$5" \
        --contexts "$6" -t 2 --cache-types f16 --handoff 40,57 --residual > "$OUT/$1-residual.txt"
    echo "$OUT/$1.txt, $OUT/$1-residual.txt, docs/handoff-kl-$1.svg"
}
run tiny-llama tiny-llama-h64-gqa-f32.gguf tiny-llama-h64/val.txt 192 64 16
run stories260K stories260K.gguf stories260K/story.txt 128 32 8
