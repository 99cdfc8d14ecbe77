#!/bin/sh
# check-layers.sh [SRC_DIR [README]] - the layer rule of src/: each folder is
# a layer, and a file may include only headers of its own layer and of the
# layers the table below lets it use. Prints "FILE:LINE: ..." for each
# include that breaks the rule (a header of a layer not allowed, a header
# without a layer, a folder not in the table, a file loose in src/), and
# fails when there is one. With README, also fails unless the README's
# layer table (between the lines "<!-- layers -->" and "<!-- /layers -->")
# is exactly `check-layers.sh --table`. `check-layers.sh --table` prints that
# table. Run by `make check-layers` (and so by `make test`). The public
# header, `#include <agentkv.h>` (include/), counts as a header of lib/.
#
# THE TABLE: layer, what it may use (besides itself), what it is. Lowest
# first. This is the one copy; the README's is derived from it.
table() {
    cat <<'EOF'
base|-|errors and checked allocation, buffers, threads, CPU features, vector math, the GGUF container
kernels|base|weight formats and their SIMD matrix products, K-quants, run-time dispatch
text|base|tokenizers, chat templates, resent conversations, stop strings, sampling, the generation step
kv|base|KV formats, the cache spec, the block pool, sequences (kvcache), content-addressed prefixes, spans found at any offset
engine|base kernels text kv|models and the forward pass, attention statistics, calibration, reuse methods, synthetic models, perplexity
store|base kv engine|agent, pool, memory and card files: codec, directory and Redis backends, sealing, the index; CacheCards
agents|base text kv engine store|agents: registry, tiers, turns, save queue, restore; pools, memories, handoff spans, card bit allocation
serve|base text kv engine store agents|the HTTP server, request parsing, the scheduler, metrics
lib|base text kv engine store agents|the public C API of include/agentkv.h: opaque handles over models, stores, agents, turns, pools, cards, memories
EOF
}

if [ "${1:-}" = "--table" ]; then
    echo "| layer | may use | what |"
    echo "|---|---|---|"
    table | while IFS='|' read -r l uses what; do
        echo "| \`$l/\` | $(echo "$uses" | sed 's/^-$/(nothing)/') | $what |"
    done
    exit 0
fi

src=${1:-src}
readme=${2:-}
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
layers=$(table | cut -d'|' -f1 | tr '\n' ' ')

for f in "$src"/*; do
    case $f in
    *.c|*.h) echo "$f:1: a source file outside the layer folders" >>"$bad" ;;
    esac
    [ -d "$f" ] || continue
    l=$(basename "$f")
    case " $layers " in
    *" $l "*) ;;
    *) echo "$f:1: folder '$l' is not a layer of scripts/check-layers.sh's table" >>"$bad" ;;
    esac
done

table | while IFS='|' read -r l uses what; do
    [ -d "$src/$l" ] || continue
    allowed=" $l $(echo "$uses" | sed 's/^-$//') "
    for f in "$src/$l"/*.c "$src/$l"/*.h; do
        [ -f "$f" ] || continue
        grep -n -e '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' -e '^[[:space:]]*#[[:space:]]*include[[:space:]]*<agentkv\.h>' "$f" |
        while IFS= read -r hit; do
            n=${hit%%:*}
            case $hit in
            *'<agentkv.h>'*) h=lib/agentkv.h ;;
            *) h=$(echo "$hit" | sed 's/^[0-9]*:[^"]*"\([^"]*\)".*/\1/') ;;
            esac
            case $h in
            */*) hl=${h%%/*} ;;
            *) echo "$f:$n: #include \"$h\" names no layer (write \"LAYER/$h\")" >>"$bad"; continue ;;
            esac
            case $allowed in
            *" $hl "*) ;;
            *) echo "$f:$n: layer $l may not include $h (it may use: $(echo "$uses" | sed 's/^-$/nothing but itself/'))" >>"$bad" ;;
            esac
        done
    done
done

if [ -n "$readme" ]; then
    want=$(sh "$0" --table)
    have=$(sed -n '/^<!-- layers -->$/,/^<!-- \/layers -->$/p' "$readme" | sed '1d;$d')
    [ "$want" = "$have" ] || echo "$readme:1: the layer table differs from scripts/check-layers.sh --table" >>"$bad"
fi

if [ -s "$bad" ]; then
    cat "$bad"
    echo "check-layers: $(wc -l <"$bad") violation(s)"
    exit 1
fi
echo "check-layers: ok ($(echo $layers | wc -w) layers)"
