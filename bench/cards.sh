#!/bin/sh
# cards.sh BIN - CacheCards benchmarks (agentkv bench cards), in two runs:
# 1. handoff TTFT on a synthetic Llama-3.2-1B-shaped Q4_0 model with a 16K
#    context (8K + the turn must fit): a sender prefills 1K, 4K, 8K tokens once; per rep a card
#    (uniform 8, uniform 4, importance 4 bits) is exported and imported into a
#    fresh receiver, which runs a 16-token turn, beside a warm restore of the
#    sender's agent file; once per context a receiver re-prefills the same
#    context. Bytes per token of cards at budgets 3, 4, 6, 8, 16 vs f16.
#    About 10 minutes on 2 cores (the 8K prefills, sender and re-prefill, are
#    most of it).
# 2. quality on the trained tiny-llama-h64 (1024-token context) over the
#    held-out golden text: a chain of 5 agents, each handing a card of its
#    whole context to the next, at budgets 3, 4, 6, 8 bits, policies uniform,
#    importance, topology (the adaptive two under the chain's allocation from
#    measured errors and under bitalloc.h's defaults): KL and delta
#    perplexity of the last agent over a held-out segment vs an f16 prefill.
#    About a minute.
# Writes cards-handoff.json, cards-quality.json and the plots
# cards-kl.svg (KL vs budget per policy) and cards-bytes.svg into $OUT.
# QUICK=1: a smoke run (a 4-layer dim-256 llama, contexts 256,512, 1 rep;
# quality on 2 windows) in seconds. Nothing in CI runs it.
# Env: QUICK, OUT (default build/bench-cards), BENCH_DIR, THREADS (2),
# CONTEXTS, REPS, TURN, BUDGETS, WINDOWS, SHARED (../shared), SKIP_HANDOFF,
# SKIP_QUALITY.
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
OUT=${OUT:-build/bench-cards}
SHARED=${SHARED:-../shared}
mkdir -p "$BENCH_DIR" "$OUT"
lscpu | sed -n 's/^Model name: *//p' | head -1
uptime
if [ -n "$QUICK" ]; then
    m="$BENCH_DIR/llama-tiny-q4_0.gguf"   # llama-1b's head size (64) and GQA, 4 layers of dim 256
    [ -n "$SKIP_HANDOFF" ] || [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --dim 256 --layers 4 --heads 4 \
        --kv-heads 2 --ffn 512 --vocab 1000 --ctx 2048 --type q4_0 --seed 1
    CONTEXTS=${CONTEXTS:-256,512}; REPS=${REPS:-1}; WINDOWS=${WINDOWS:-2}
else
    # a 16K context: an 8K context plus the receiver's turn must fit
    m="$BENCH_DIR/llama-1b-16k-q4_0.gguf"
    # (not made when only the quality run is asked for)
    [ -n "$SKIP_HANDOFF" ] || [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --ctx 16384 --type q4_0 --seed 1
fi
if [ -z "$SKIP_HANDOFF" ]; then
    "$BIN" bench cards -m "$m" --contexts "${CONTEXTS:-1024,4096,8192}" --reps "${REPS:-3}" --turn "${TURN:-16}" \
        -t "${THREADS:-2}" --dir "$OUT/store" --json-out "$OUT/cards-handoff.json"
fi
if [ -z "$SKIP_QUALITY" ]; then
    "$BIN" bench cards --quality -m "$SHARED/models/tiny-llama-h64-gqa-f32.gguf" \
        --text "$SHARED/golden/tiny-llama-h64/val.txt" --budgets "${BUDGETS:-3,4,6,8}" --windows "${WINDOWS:-4}" \
        -t "${THREADS:-2}" --json-out "$OUT/cards-quality.json"
fi
# the plots, drawn by hand: KL vs budget per policy (log scale), bytes per
# token vs budget
python3 - "$OUT" <<'PY'
import json, math, os, sys
out = sys.argv[1]
colors = {"uniform": "#d62728", "importance": "#1f77b4", "topology": "#2ca02c"}
def frame(W, H, L, R, T, B, title):
    return ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (W, H),
            '<rect width="100%" height="100%" fill="white"/>',
            '<text x="%d" y="%d" font-size="13">%s</text>' % (L, T - 18, title),
            '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, T, W - L - R, H - T - B)]
qp = os.path.join(out, "cards-quality.json")
if os.path.exists(qp):
    q = json.load(open(qp))
    rows = [r for r in q["rows"] if r["budget"] < 16]
    budgets = sorted(set(r["budget"] for r in rows))
    W, H, L, R, T, B = 720, 440, 80, 200, 40, 50
    vals = [r["mean_kl"] for r in rows if r["mean_kl"] > 0]
    llo, lhi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    if lhi == llo: lhi += 1
    x_of = lambda b: L + (W - L - R) * (b - budgets[0]) / max(budgets[-1] - budgets[0], 1)
    y_of = lambda v: T + (H - T - B) * (1 - (math.log10(v) - llo) / (lhi - llo))
    o = frame(W, H, L, R, T, B, "Mean KL of E over %d held-out tokens after 4 card hand-offs (nats, log scale)" % q["held_out"])
    for e in range(llo, lhi + 1):
        for k in (1, 2, 5):
            v = k * 10 ** e
            if llo <= math.log10(v) <= lhi:
                o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (L, y_of(v), W - R, y_of(v)))
                o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 5, y_of(v) + 4, v))
    for b in budgets:
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x_of(b), H - B + 15, b))
    o.append('<text x="%d" y="%d" text-anchor="middle">budget, average bits per token (keys and values)</text>' % ((L + W - R) // 2, H - B + 32))
    lines = [("uniform", "-", "uniform", ""), ("importance", "chain", "importance", ""),
             ("topology", "chain", "topology", ""), ("importance", "default", "importance, defaults", "5,3"),
             ("topology", "default", "topology, defaults", "5,3")]
    for k, (pol, alloc, label, dash) in enumerate(lines):
        pts = [(r["budget"], r["mean_kl"]) for r in rows
               if r["policy"] == pol and r.get("alloc", alloc) == alloc and r["mean_kl"] > 0]
        if not pts:
            continue
        da = ' stroke-dasharray="%s"' % dash if dash else ""
        o.append('<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>' % (
            colors[pol], da, " ".join("%.1f,%.1f" % (x_of(b), y_of(v)) for b, v in pts)))
        for b, v in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x_of(b), y_of(v), colors[pol]))
        ly = T + 12 + 20 * k
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (W - R + 12, ly - 4, W - R + 36, ly - 4, colors[pol], da))
        o.append('<text x="%d" y="%d">%s</text>' % (W - R + 42, ly, label))
    o.append('<text x="%d" y="%d" fill="#555">%s</text>' % (W - R + 12, T + 120, os.path.basename(q["model"])))
    o.append('<text x="%d" y="%d" fill="#555">%d windows of %d tokens</text>' % (W - R + 12, T + 134, q["windows"], q["tokens"]))
    o.append("</svg>")
    open(os.path.join(out, "cards-kl.svg"), "w").write("\n".join(o) + "\n")
    print("cards: %s" % os.path.join(out, "cards-kl.svg"))
hp = os.path.join(out, "cards-handoff.json")
series = []
if os.path.exists(hp):
    h = json.load(open(hp))
    f16 = h["f16_bytes_per_token"]
    series += [("%s, uniform" % os.path.basename(h["model"]), "#d62728", "", [(r["budget"], r["uniform"] / f16) for r in h["bytes_per_token"]]),
               ("%s, importance" % os.path.basename(h["model"]), "#1f77b4", "4,3", [(r["budget"], r["importance"] / f16) for r in h["bytes_per_token"]])]
if os.path.exists(qp):
    q = json.load(open(qp))
    series.append(("%s, uniform" % os.path.basename(q["model"]), "#2ca02c", "2,3",
                   [(r["budget"], r["first_card_bytes_per_token"] / r["f16_bytes_per_token"]) for r in q["rows"] if r["policy"] == "uniform"]))
if series:
    W, H, L, R, T, B = 760, 420, 70, 290, 40, 50
    x_of = lambda b: L + (W - L - R) * (b - 2) / 14
    y_of = lambda v: T + (H - T - B) * (1 - v / 1.1)
    o = frame(W, H, L, R, T, B, "Card bytes per token / f16 bytes per token, vs budget")
    for k in range(0, 12):
        v = k / 10
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (L, y_of(v), W - R, y_of(v)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (L - 5, y_of(v) + 4, v))
    for b in (2, 4, 6, 8, 10, 12, 14, 16):
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x_of(b), H - B + 15, b))
    o.append('<text x="%d" y="%d" text-anchor="middle">budget, average bits per token</text>' % ((L + W - R) // 2, H - B + 32))
    for k, (name, c, dash, pts) in enumerate(series):
        o.append('<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>' % (c, ' stroke-dasharray="%s"' % dash if dash else "",
                 " ".join("%.1f,%.1f" % (x_of(b), y_of(v)) for b, v in pts)))
        for b, v in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x_of(b), y_of(v), c))
        ly = T + 12 + 20 * k
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (W - R + 12, ly - 4, W - R + 36, ly - 4, c,
                 ' stroke-dasharray="%s"' % dash if dash else ""))
        o.append('<text x="%d" y="%d">%s</text>' % (W - R + 42, ly, name))
    o.append("</svg>")
    open(os.path.join(out, "cards-bytes.svg"), "w").write("\n".join(o) + "\n")
    print("cards: %s" % os.path.join(out, "cards-bytes.svg"))
PY
