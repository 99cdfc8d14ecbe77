#!/bin/sh
# pools.sh BIN - agents sharing one pool vs private copies (agentkv bench
# pools) on a synthetic Llama-3.2-1B-shaped Q4_0 model with an 8K context:
# a 4096-token document prefilled once into a pool (q8 keys, tq3 values),
# 1, 2, 4, 8, 16 agents attached, each with 64 tokens of its own: bytes in
# use vs N private copies vs the floor; first-turn TTFT pooled vs private;
# decode of 8 agents together, pooled vs private copies. Writes the JSON
# object and a plot of bytes vs N (SVG) into $OUT. About 5 minutes on 2
# cores (the pool's and the private agents' 4K prefills are most of it).
# QUICK=1: a smoke run (a 4-layer dim-256 llama, 500-token pool, agents
# 1,2,4, 2 decoding) in seconds; nothing in CI runs it.
# Env: QUICK, OUT (default build/bench-pools), BENCH_DIR, THREADS (2),
# POOL_TOKENS, SUFFIX, AGENTS, TTFT_REPS, REPS, CTK / CTV (q8 / tq3).
set -e
BIN=${1:-build/agentkv}
BENCH_DIR=${BENCH_DIR:-build/bench-models}
OUT=${OUT:-build/bench-pools}
mkdir -p "$BENCH_DIR" "$OUT"
if [ -n "$QUICK" ]; then
    m="$BENCH_DIR/llama-tiny-q4_0.gguf"   # llama-1b's head size (64) and GQA, 4 layers of dim 256
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 \
        --vocab 1000 --ctx 2048 --type q4_0 --seed 1
    set -- --pool-tokens "${POOL_TOKENS:-500}" --suffix "${SUFFIX:-32}" --agents "${AGENTS:-1,2,4}" \
        --decode-agents 2 --decode-tokens 32 --reps "${REPS:-3}" --ttft-reps "${TTFT_REPS:-1}"
else
    m="$BENCH_DIR/llama-1b-q4_0.gguf"
    [ -f "$m" ] || "$BIN" synth -o "$m" --like llama-1b --type q4_0 --seed 1
    set -- --pool-tokens "${POOL_TOKENS:-4096}" --suffix "${SUFFIX:-64}" --agents "${AGENTS:-1,2,4,8,16}" \
        --reps "${REPS:-3}" --ttft-reps "${TTFT_REPS:-3}"
fi
lscpu | sed -n 's/^Model name: *//p' | head -1
"$BIN" bench pools -m "$m" "$@" -ctk "${CTK:-q8}" -ctv "${CTV:-tq3}" -t "${THREADS:-2}" --json-out "$OUT/pools.json"
# the plot: bytes in use vs N, log-log (pooled and floor are a few % apart,
# private copies N times more)
python3 - "$OUT/pools.json" "$OUT/pools.svg" <<'EOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
rows = r["memory"]
ns = [x["agents"] for x in rows]
series = [("N private copies (measured x N)", "#d62728", "", [x["private_copies_bytes"] for x in rows]),
          ("N private f16 copies (computed)", "#999999", "6,4", [x["f16_private_copies_bytes"] for x in rows]),
          ("no pool, content index (measured)", "#ff7f0e", "2,3", [x["content_index_bytes"] for x in rows]),
          ("pool + agents (measured)", "#1f77b4", "", [x["pooled_bytes"] for x in rows]),
          ("floor (formats' bytes per token)", "#2ca02c", "4,3", [x["floor_bytes"] for x in rows])]
W, H, L, R, T, B = 760, 460, 80, 250, 40, 50
vals = [v / 1e6 for s in series for v in s[3] if v > 0]
llo, lhi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
xlo, xhi = math.log2(ns[0]), math.log2(ns[-1]) if ns[-1] > ns[0] else math.log2(ns[0]) + 1
x_of = lambda n: L + (W - L - R) * (math.log2(n) - xlo) / (xhi - xlo)
y_of = lambda mb: T + (H - T - B) * (1 - (math.log10(mb) - llo) / (lhi - llo))
o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (W, H),
     '<rect width="100%" height="100%" fill="white"/>',
     '<text x="%d" y="%d" font-size="13">KV bytes of N agents sharing a %d-token document, %d tokens each of their own '
     '(MB, log scale)</text>' % (L, T - 18, r["pool_tokens"], r["suffix"]),
     '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, T, W - L - R, H - T - B)]
for e in range(llo, lhi + 1):
    for k in (1, 2, 5):
        mb = k * 10 ** e
        if llo <= math.log10(mb) <= lhi:
            y = y_of(mb)
            o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (L, y, W - R, y))
            o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 5, y + 4, mb))
for n in ns:
    o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x_of(n), H - B + 15, n))
o.append('<text x="%d" y="%d" text-anchor="middle">agents N</text>' % ((L + W - R) // 2, H - B + 32))
for k, (name, c, dash, v) in enumerate(series):
    pts = " ".join("%.1f,%.1f" % (x_of(n), y_of(b / 1e6)) for n, b in zip(ns, v) if b > 0)
    o.append('<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>' % (
        c, ' stroke-dasharray="%s"' % dash if dash else "", pts))
    for n, b in zip(ns, v):
        if b > 0:
            o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x_of(n), y_of(b / 1e6), c))
    ly = T + 12 + 32 * k
    o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (
        W - R + 12, ly - 4, W - R + 36, ly - 4, c, ' stroke-dasharray="%s"' % dash if dash else ""))
    o.append('<text x="%d" y="%d">%s</text>' % (W - R + 42, ly, name))
    # the value at the largest N: lines that coincide are told apart there
    o.append('<text x="%d" y="%d" fill="#555">%.1f MB at N = %d</text>' % (W - R + 42, ly + 13, v[-1] / 1e6, ns[-1]))
o.append('<text x="%d" y="%d" fill="#555">%s, K %s / V %s</text>' % (W - R + 12, T + 12 + 32 * len(series) + 6,
         r["weight_type"] + " weights", r["cache_type_k"], r["cache_type_v"]))
o.append("</svg>")
open(sys.argv[2], "w").write("\n".join(o) + "\n")
print("pools: %s, %s" % (sys.argv[1], sys.argv[2]))
EOF
