#!/bin/sh
# test-levels.sh BUILD - `make test`'s runs of the SIMD-dependent tests at
# every level below the chosen one that this binary and CPU support
# (agentkv info --simd-levels), each with AGENTKV_SIMD forcing the level:
# kernels, KV formats, K-quants, golden outputs (tokens; perplexity on the
# short contexts: the 512 and 1024-token ones take minutes in scalar code;
# the prefill = decode = batched bit test), weight types, attention, the
# architectures' own paths and the batch-invariance of shared prefixes.
# One line per level and filter, or the whole output (prefixed "[LEVEL] ")
# of a run that failed; exits 1 if any failed.
set -u
build=$1
filters="cpu_ kernel_ vmath_ kvformat kquant golden_greedy golden_prefill_decode golden_ppl_stories _c128 weights_ kvcache_attention kvcache_centering gemma3 deepseek2 attend_window batch_invariant"
levels=$(AGENTKV_SIMD= "$build/agentkv" info --simd-levels) || exit 1
chosen=$(echo "$levels" | head -n 1)
status=0
for level in $(echo "$levels" | tail -n +2); do
    echo "== the SIMD tests again at level $level (below $chosen)"
    for f in $filters; do
        if AGENTKV_SIMD=$level "$build/agentkv-tests" "$f" > "$build/test-level.log" 2>&1; then
            echo "[$level] $f: $(tail -n 1 "$build/test-level.log")"
        else
            status=1
            sed "s/^/[$level] /" "$build/test-level.log"
        fi
    done
done
rm -f "$build/test-level.log"
[ $status = 0 ] || echo "test-levels.sh: failures at a lower SIMD level (lines above)"
exit $status
