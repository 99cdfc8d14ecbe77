#!/bin/sh
# engine.sh BIN [BIN2 ...] - prefill/decode speed on synthetic Llama-3.2-1B-shaped models
# (dim 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied, 32000 vocab),
# one per weight type, 2 threads. Models are cached in $BENCH_DIR.
# Per type: pp (prefill tok/s), tg (decode tok/s), batched decode of BATCH
# sequences (aggregate tok/s) and its ratio to one sequence, and decode's
# bandwidth (weights + KV read per token / time) as a % of a copy bandwidth
# (STREAM-style, bytes read + written) measured in the same run; a read-only
# bandwidth is shown beside it; the thread pool's synchronizations per
# decoded token (syncs).
# Env: TYPES="f32 f16 bf16 q8_0 q4_0 q6_k q5_k q4_k", THREADS=2, PP=512,
#      TG=128, REPEATS=3, BATCH=8 (BATCH=0: no batched decode).
# KV=q8|q4|... (a quantized cache at long context: ours with -ctk/-ctv KV and
# --tg-after-prompt, so tg is the decode of TG tokens after the PP-token
# prompt; llama.cpp with flash attention, -ctk/-ctv LLAMA_KV (default: q8 ->
# q8_0, q4 -> q4_0, else f16), pp at -p PP and tg at depth -d PP). E.g. the
# 2K case: KV=q4 PP=2048 TG=32 BATCH=0 REPEATS=1.
# LLAMA_BENCH=/path/to/llama-bench (a llama.cpp CPU build of your own; none
# is shipped) runs llama.cpp on the same file right after each of ours and
# adds its pp/tg and our ratio to it: ratios from one run, not from memory.
# Several BINs (builds of two levels, e.g. `make ARCH=x86-64-v3
# BUILD=build-v3` beside the default; or before and after a change) run one
# right after the other on each type, a summary row each: on a shared
# machine the ratios between them then come from minutes apart, not from
# runs at different loads.
set -e
BIN=${1:-build/agentkv}
BINS=${*:-$BIN}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
TYPES=${TYPES:-"f32 f16 bf16 q8_0 q4_0 q6_k q5_k q4_k"}
THREADS=${THREADS:-2}
BATCH=${BATCH:-8}
KV=${KV:-}
case "$KV" in q8) LKV=${LLAMA_KV:-q8_0} ;; q4) LKV=${LLAMA_KV:-q4_0} ;; *) LKV=${LLAMA_KV:-f16} ;; esac
OURS_KV=""; [ -n "$KV" ] && OURS_KV="-ctk $KV -ctv $KV --tg-after-prompt"
OURS_BATCH=""; [ "$BATCH" != 0 ] && OURS_BATCH="--batch $BATCH"
mkdir -p "$BENCH_DIR"
S="$BENCH_DIR/summary.txt"
printf '%-6s %-28s %9s %9s %11s %7s %8s %8s %8s %6s %6s %s\n' type build pp_tok_s tg_tok_s batch${BATCH}_tok_s ratio tg_GB_s \
    copy_GB read_GB tg_bw% syncs "${LLAMA_BENCH:+llama.cpp_pp/tg ours/theirs}" > "$S"
# one JSON field's value
field() { echo "$1" | sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p"; }
# llama-bench's mean t/s for test $2 (pp512, tg128) in its markdown output $1
lb_field() { echo "$1" | awk -F'|' -v t="$2" 'NF > 3 && $(NF-2) ~ t { split($(NF-1), a, " "); print a[1] }'; }
for t in $TYPES; do
    m="$BENCH_DIR/llama-1b-$t.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type "$t" --seed 1
  for b in $BINS; do
    # shellcheck disable=SC2086
    j=$("$b" bench engine -m "$m" -p "${PP:-512}" -n "${TG:-128}" -t "$THREADS" -r "${REPEATS:-3}" \
        $OURS_BATCH $OURS_KV --json)
    echo "$b: $j"
    peer=""
    if [ -n "$LLAMA_BENCH" ]; then
        if [ -n "$KV" ]; then   # prefill of PP tokens; decode of TG at depth PP (two runs: -d applies to both)
            l=$("$LLAMA_BENCH" -m "$m" -t "$THREADS" -fa 1 -ctk "$LKV" -ctv "$LKV" -p "${PP:-512}" -n 0 \
                -r "${REPEATS:-3}" 2>/dev/null || true)
            l="$l
$("$LLAMA_BENCH" -m "$m" -t "$THREADS" -fa 1 -ctk "$LKV" -ctv "$LKV" -p 0 -n "${TG:-128}" -d "${PP:-512}" \
                -r "${REPEATS:-3}" 2>/dev/null || true)"
        else
            l=$("$LLAMA_BENCH" -m "$m" -t "$THREADS" -p "${PP:-512}" -n "${TG:-128}" -r "${REPEATS:-3}" 2>/dev/null || true)
        fi
        echo "$l"
        lpp=$(lb_field "$l" "pp${PP:-512}"); ltg=$(lb_field "$l" "tg${TG:-128}")
        if [ -n "$lpp" ] && [ -n "$ltg" ]; then
            peer=$(awk -v a="$(field "$j" pp_tok_s)" -v b="$(field "$j" tg_tok_s)" -v c="$lpp" -v d="$ltg" \
                'BEGIN { printf "%s/%s %.2fx/%.2fx", c, d, a / c, b / d }')
        else
            peer="(llama-bench gave no figures)"
        fi
    fi
    printf '%-6s %-28s %9s %9s %11s %7s %8s %8s %8s %6s %6s %s\n' "$t${KV:+/kv-$KV}" "$b" "$(field "$j" pp_tok_s)" \
        "$(field "$j" tg_tok_s)" "$(field "$j" batch_tok_s)" "$(field "$j" batch_ratio)" "$(field "$j" tg_gb_s)" \
        "$(field "$j" copy_gb_s)" "$(field "$j" read_gb_s)" "$(field "$j" tg_bw_pct)" \
        "$(field "$j" tg_pool_syncs_per_token)" "$peer" >> "$S"
  done
done
echo
echo "llama.cpp reference (same shape, 2 threads, pp512 / tg128): F16 145 / 21.4, Q8_0 109 / 31, Q4_0 173 / 54"
cat "$S"
