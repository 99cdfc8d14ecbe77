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
# AK_ARM_TESTS=golden_ runs them all). The first CPU runs all of them and the
# models' batch-invariance test (prefill = decode = batched decode, bit for
# bit); the others, whose differences are in the kernels only, run the
# kernel, format and K-quant tests and one model's greedy tokens
# (kernel_neon_levels_agree_bitwise and kernel_neon_rowmajor_levels_agree_bitwise
# compare every NEON level's bits, packed and row-major, with every CPU). CI time is the limit here: qemu is 20-50x slower than native.
filters=${AK_ARM_TESTS:-"kernel vmath kvformat kquant weights_types golden_greedy golden_ppl_stories attend_window gemma3_local_layers golden_prefill_decode_batched_agree_bitwise"}
others=${AK_ARM_TESTS_OTHERS:-"kernel vmath kvformat kquant golden_greedy_stories260K"}
tmo=${AK_ARM_TIMEOUT:-900}   # seconds per filter and CPU; the longest takes a few minutes
# One CPU's runs, one after another: every run's output to stdout, and a
# line "sums P F S BAD" into the file $3.
run_cpu() {
    cpu=$1 list=$2 log=$3
    p=0 fl=0 sk=0 bd=0
    one=$(mktemp)
    : >"$log"
    for f in $list; do
        echo "== qemu-aarch64 -cpu $cpu: tests matching '$f'"
        # A run that hangs must not eat CI's time: it stops after
        # AK_ARM_TIMEOUT seconds and fails below (no summary line). A hang
        # is a bug (the one seen was the pool's lost wake-up), not retried.
        rc=0
        AK_SHARED=$shared timeout "$tmo" qemu-aarch64 -cpu "$cpu" "$bin" "$f" >"$one" 2>&1 || rc=$?
        [ "$rc" = 124 ] && echo "test-arm: -cpu $cpu '$f': no result after $tmo s (hung)"
        cat "$one"
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$one" | tail -1)
        if [ -z "$line" ]; then
            echo "test-arm: -cpu $cpu '$f': no summary line (crashed?)"
            bd=1
            continue
        fi
        set -- $line
        if [ $(($1 + $3 + $5)) = 0 ]; then
            echo "test-arm: -cpu $cpu '$f' matched no test"
            bd=1
        fi
        p=$((p + $1)) fl=$((fl + $3)) sk=$((sk + $5))
    done
    rm -f "$one"
    echo "sums $p $fl $sk $bd" >>"$log"
}

# One CPU after the other: side by side, the tests' two-thread pools would
# share two cores four ways, and their spinning hand-offs slow qemu down
# several times over.
logs=
first=1
for cpu in $cpus; do
    list=$others
    [ "$first" = 1 ] && list=$filters
    first=0
    log=$(mktemp)
    logs="$logs $log"
    run_cpu "$cpu" "$list" "$log"
done
P=0 F=0 S=0 bad=0
for log in $logs; do
    sums=$(grep '^sums ' "$log" | tail -1)
    if [ -z "$sums" ]; then
        echo "test-arm: a CPU's runs ended without their sums"
        bad=1
    else
        set -- $sums
        P=$((P + $2)) F=$((F + $3)) S=$((S + $4))
        [ "$5" = 0 ] || bad=1
    fi
    rm -f "$log"
done
echo "$P passed, $F failed, $S skipped"
[ "$F" = 0 ] && [ "$bad" = 0 ]
