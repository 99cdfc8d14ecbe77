#!/bin/sh
# reuse_notes.sh BIN - memory-chunk reuse on memory notes vs running text
# (agentkv bench reuse --notes / --data, and --residual), docs/reuse-notes.md:
# 1. the note sets: bench/make_notes.py from the held-out text, A-MEM-style
#    notes (amem) and LoCoMo-style dated sessions (locomo), into OUT;
# 2. per trained model (tiny-llama-h64, stories260K) and data (amem, locomo,
#    running text of the same held-out file): the methods' table (f16, q4;
#    none, cacheblend, agentkvshift, full; ratios 0..100%) with its plot, and
#    the residual table;
# 3. the check-layer ablation on tiny-llama's amem notes (f16).
# About 15 minutes on 2 shared cores. Quality figures are deterministic.
# Env: OUT (default build/bench-reuse-notes), SHARED (../shared), THREADS (2),
# CONTEXTS (16), SKIP_ABLATIONS.
set -e
BIN=${1:-build/agentkv}
OUT=${OUT:-build/bench-reuse-notes}
SHARED=${SHARED:-../shared}
T=${THREADS:-2}
N=${CONTEXTS:-16}
mkdir -p "$OUT"
date -u
uptime
VAL="$SHARED/golden/tiny-llama-h64/val.txt"
for shape in amem locomo; do
    python3 bench/make_notes.py --shape $shape --out "$OUT/$shape.jsonl" "$VAL" "$SHARED/golden/stories260K/story.txt"
done
METHODS=none,cacheblend,agentkvshift,full
# tiny-llama: context 1024 (4 notes of at most 224 tokens + a 64-token query);
# stories260K: trained on 512-token texts (3 notes of at most 144 + 32)
for model in tiny-llama stories260K; do
    if [ $model = tiny-llama ]; then
        m="$SHARED/models/tiny-llama-h64-gqa-f32.gguf"; shape="--chunks 4 --cont 64"; tn=224; tt=192
    else
        m="$SHARED/models/stories260K.gguf"; shape="--chunks 3 --cont 32"; tn=144; tt=128
    fi
    for data in amem locomo text; do
        if [ $data = text ]; then src="--data $VAL --chunk-tokens $tt"; else src="--notes $OUT/$data.jsonl --chunk-tokens $tn"; fi
        # shellcheck disable=SC2086
        "$BIN" bench reuse -m "$m" $src $shape --contexts "$N" -t "$T" --cache-types f16,q4 --methods $METHODS \
            --plot "$OUT/reuse-$model-$data.svg" | tee "$OUT/reuse-$model-$data.txt"
        # shellcheck disable=SC2086
        "$BIN" bench reuse -m "$m" $src $shape --contexts "$N" -t "$T" --cache-types f16,q4 --residual \
            | tee "$OUT/residual-$model-$data.txt"
        uptime
    done
done
if [ -z "$SKIP_ABLATIONS" ]; then
    for cl in 0 2 3; do
        "$BIN" bench reuse -m "$SHARED/models/tiny-llama-h64-gqa-f32.gguf" --notes "$OUT/amem.jsonl" --chunks 4 \
            --chunk-tokens 224 --cont 64 --contexts "$N" -t "$T" --cache-types f16 --methods cacheblend,agentkvshift \
            --ratios 10,30 --check-layer $cl | tee "$OUT/ablation-check$cl.txt"
    done
    uptime
fi
