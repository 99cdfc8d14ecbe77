#!/bin/sh
# test-arm.sh BIN SHARED - runs the AArch64 test binary BIN under qemu-aarch64:
# the kernel, weight-type, KV-format and golden tests (and the families'
# ones), once per emulated CPU in AK_ARM_CPUS (default: "max", which has the
# dot-product and int8 matrix-multiply extensions, and "cortex-a53", plain
# NEON; "cortex-a76" has dot products without i8mm). Prints each run's lines
# and, last, the sums as "N passed, N failed, N skipped"; exits 1 when any
# test failed or any run did not end with its summary line.
set -u
bin=$1
shared=${2:-../shared}
cpus=${AK_ARM_CPUS:-max cortex-a53}
# test-name substrings (tests/main.c takes one per run)
# (the golden perplexities over 512 and 1024 tokens take minutes under qemu:
# the greedy runs of every family and one perplexity stand for them;
# AK_ARM_TESTS=golden_ runs them all). The models' batch-invariance test
# (prefill = decode = batched decode, bit for bit: 3 minutes under qemu)
# runs with the first CPU only; kernel_neon_levels_agree_bitwise checks the
# same property of the kernels with every CPU.
filters=${AK_ARM_TESTS:-"kernel vmath kvformat kquant weights_types golden_greedy golden_ppl_stories attend_window gemma3_local_layers"}
first_only=${AK_ARM_TESTS_FIRST:-"golden_prefill_decode_batched_agree_bitwise"}
P=0 F=0 S=0 bad=0
out=$(mktemp)
first=1
for cpu in $cpus; do
    extra=
    [ "$first" = 1 ] && extra=$first_only
    first=0
    for f in $filters $extra; do
        echo "== qemu-aarch64 -cpu $cpu: tests matching '$f'"
        AK_SHARED=$shared qemu-aarch64 -cpu "$cpu" "$bin" "$f" >"$out" 2>&1
        cat "$out"
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$out" | tail -1)
        if [ -z "$line" ]; then
            echo "test-arm: -cpu $cpu '$f': no summary line (crashed?)"
            bad=1
            continue
        fi
        set -- $line
        P=$((P + $1)) F=$((F + $3)) S=$((S + $5))
    done
done
rm -f "$out"
echo "$P passed, $F failed, $S skipped"
[ "$F" = 0 ] && [ "$bad" = 0 ]
