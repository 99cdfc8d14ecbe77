#!/bin/sh
# arm-insns.sh ARM_BUILD - instructions executed per 32 weights per token by
# each NEON level's matrix-product loops, against the same product built
# with NEON disabled (-march=armv8-a+nosimd: the scalar kernels), counted
# under qemu-aarch64 (-d exec with one instruction per block: every executed
# instruction is one log line). For each case the product (scripts/
# arm_insns.c) runs 1 and 3 times with R and 2R rows; the difference of the
# four counts is the cost of the extra rows' blocks alone (setup, the
# activations' quantization and per-call work cancel; what is left beside
# the inner loop is the per-group work, spread over COLS / 32 blocks):
#   (n(2R, 3) - n(2R, 1) - n(R, 3) + n(R, 1)) / 2 / (R * COLS / 32 * NTOK)
# ARM_BUILD holds the cross-built library (make test-arm's build). Prints a
# markdown table. Needs what make test-arm needs (scripts/deps-cross.sh).
set -eu
arm=${1:-build-arm}
CC=${ARM_CC:-aarch64-linux-gnu-gcc}
ROWS=${ROWS:-16}
TYPES=${TYPES:-"q4_0 q8_0 q4_k q6_k f16"}
out=$arm/arm-insns
mkdir -p "$out/scalar"
CF="-std=c11 -O2 -D_GNU_SOURCE -Isrc -pthread"
LIBS="-lpcre2-8 -lmicrohttpd -lcjson -lxxhash -lsodium -lhiredis -lm -pthread"
$CC $CF -march=armv8-a scripts/arm_insns.c "$arm/libagentkv.a" -o "$out/neon" $LIBS
for f in kernels/kernels kernels/kquant kernels/kernels_packed kernels/kernels_packed_k kernels/kernels_arm \
         kernels/kernels_kquant_arm kernels/kernels_packed_arm kernels/kernels_packed_k_arm base/util base/threadpool \
         base/gguf; do
    $CC $CF -march=armv8-a+nosimd -c src/$f.c -o "$out/scalar/$(basename $f).o"
done
$CC $CF -march=armv8-a+nosimd scripts/arm_insns.c "$out"/scalar/*.o -o "$out/scalar-bin" -lm -pthread

count() {   # BIN LEVEL TYPE COLS NTOK REPS ROWS
    AGENTKV_NEON=$2 qemu-aarch64 -cpu max -singlestep -d exec,nochain -D /dev/stderr "$1" "$3" "$7" "$4" "$5" "$6" \
        2>&1 >/dev/null | grep -c '^Trace'
}
per32() {   # BIN LEVEL TYPE NTOK
    case $3 in q4_k|q5_k|q6_k) C=1024 ;; *) C=256 ;; esac
    a=$(count "$1" "$2" "$3" "$C" "$4" 3 $((2 * ROWS))); b=$(count "$1" "$2" "$3" "$C" "$4" 1 $((2 * ROWS)))
    c=$(count "$1" "$2" "$3" "$C" "$4" 3 "$ROWS"); d=$(count "$1" "$2" "$3" "$C" "$4" 1 "$ROWS")
    awk -v n=$((a - b - c + d)) -v blocks=$((ROWS * C / 32 * $4)) 'BEGIN { printf "%.1f", n / 2 / blocks }'
}
echo "| weights | tokens | scalar (nosimd) | NEON plain | NEON dotprod | NEON i8mm |"
echo "|---|---|---|---|---|---|"
for t in $TYPES; do
    for n in 1 4; do
        s=$(per32 "$out/scalar-bin" plain "$t" "$n")
        p=$(per32 "$out/neon" plain "$t" "$n")
        case $t in   # the float tiles are the same at every level
        f32|f16|bf16) d="= plain" i="= plain" ;;
        *) d=$(per32 "$out/neon" dotprod "$t" "$n"); i=$(per32 "$out/neon" i8mm "$t" "$n") ;;
        esac
        echo "| $t | $n | $s | $p | $d | $i |"
    done
done
