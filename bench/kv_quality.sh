#!/bin/sh
# kv_quality.sh BIN - perplexity and KL divergence of each KV cache format
# against the f16 cache, on the held-out text of tiny-llama-h64 (head dim 64)
# and on stories260K (head dim 8). Prints a markdown table. 4/3/2-bit formats
# are centered by default (docs/kv-formats.md); FLAGS=--no-center measures
# them without.
set -e
BIN=${1:-build/agentkv}
SHARED=${SHARED:-../shared}
OUT=${OUT:-build/kv-quality}
PAIRS=${PAIRS:-"q8/q8 q4/q4 q8/tq3 q8/tcq3 tq4/tq4 tq3/tq3 tcq3/tcq3 q8/q4 tq2/tq2 q2/q2"}
mkdir -p "$OUT"
run() { # model text ctx label
    m=$1; f=$2; c=$3; label=$4
    "$BIN" perplexity -m "$m" -f "$f" -c "$c" --kl-base "$OUT/$label.kl" --json > "$OUT/$label-f16.json"
    printf '\n%s (-c %s), f16 baseline PPL %s\n\n| K/V | bits K | bits V | PPL | ΔPPL %% | mean KL | argmax agrees |\n|---|---|---|---|---|---|---|\n' \
        "$label" "$c" "$(sed 's/.*"ppl": \([0-9.]*\).*/\1/' "$OUT/$label-f16.json")"
    for p in $PAIRS; do
        k=${p%/*}; v=${p#*/}
        j=$("$BIN" perplexity -m "$m" -f "$f" -c "$c" --kl "$OUT/$label.kl" -ctk "$k" -ctv "$v" --json ${FLAGS:-})
        echo "$j" > "$OUT/$label-$k-$v.json"
        echo "$j" | python3 -c '
import json,sys
j=json.load(sys.stdin)
print("| %s/%s | %.3g | %.3g | %.4f | %+.3f | %.5f | %.2f%% |" % (j["cache_type_k"], j["cache_type_v"], j["bits_k"], j["bits_v"], j["ppl"], j["delta_ppl_pct"], j["kl_mean"], 100*j["top1_agree"]))'
    done
}
run "$SHARED/models/tiny-llama-h64-gqa-f32.gguf" "$SHARED/golden/tiny-llama-h64/val.txt" 512 tiny-llama-h64
run "$SHARED/models/stories260K.gguf" "$SHARED/golden/stories260K/story.txt" 128 stories260K
