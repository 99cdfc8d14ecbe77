#!/bin/sh
# arm-insns.sh ARM_BUILD - instructions executed per 32 weights per token by
# each NEON level's matrix-product loops, against the same product built
# with NEON disabled (-march=armv8-a+nosimd: the scalar kernels), counted
# under qemu-aarch64 (-d exec with one instruction per block: every executed
# instruction is one log line). For each case the product runs 1 and 3
# times at COLS and 2 x COLS columns (scripts/arm_insns.c); the difference
# of the four counts is the cost of the extra 32-column blocks alone:
#   (n(2C, 3) - n(2C, 1) - n(C, 3) + n(C, 1)) / 2 / (ROWS * C / 32 * NTOK)
# ARM_BUILD holds the cross-built library (make test-arm's build). Prints a
# markdown table. Needs what make test-arm needs (scripts/deps-cross.sh).
set -eu
arm=${1:-build-arm}
CC=${ARM_CC:-aarch64-linux-gnu-gcc}
ROWS=${ROWS:-32}
TYPES=${TYPES:-"q4_0 q8_0 q4_k q6_k f16"}
out=$arm/arm-insns
mkdir -p "$out/scalar"
CF="-std=c11 -O2 -D_GNU_SOURCE -pthread"
LIBS="-lpcre2-8 -lmicrohttpd -lcjson -lxxhash -lsodium -lm -pthread"
$CC $CF -march=armv8-a scripts/arm_insns.c "$arm/libagentkv.a" -o "$out/neon" $LIBS
for f in kernels kquant kernels_packed kernels_packed_k kernels_arm kernels_kquant_arm kernels_packed_arm \
         kernels_packed_k_arm util threadpool gguf; do
    $CC $CF -march=armv8-a+nosimd -c src/$f.c -o "$out/scalar/$f.o"
done
$CC $CF -march=armv8-a+nosimd scripts/arm_insns.c "$out"/scalar/*.o -o "$out/scalar-bin" -lm -pthread

count() {   # BIN LEVEL TYPE COLS NTOK REPS
    AGENTKV_NEON=$2 qemu-aarch64 -cpu max -singlestep -d exec,nochain -D /dev/stderr "$1" "$3" "$ROWS" "$4" "$5" "$6" \
        2>&1 >/dev/null | grep -c '^Trace'
}
per32() {   # BIN LEVEL TYPE NTOK
    case $3 in q4_k|q5_k|q6_k) C=256 ;; *) C=128 ;; esac
    a=$(count "$1" "$2" "$3" $((2 * C)) "$4" 3); b=$(count "$1" "$2" "$3" $((2 * C)) "$4" 1)
    c=$(count "$1" "$2" "$3" "$C" "$4" 3); d=$(count "$1" "$2" "$3" "$C" "$4" 1)
    awk -v n=$((a - b - c + d)) -v blocks=$((ROWS * C / 32 * $4)) 'BEGIN { printf "%.1f", n / 2 / blocks }'
}
echo "| weights | tokens | scalar (nosimd) | NEON plain | NEON dotprod | NEON i8mm |"
echo "|---|---|---|---|---|---|"
for t in $TYPES; do
    for n in 1 4; do
        s=$(per32 "$out/scalar-bin" plain "$t" "$n")
        p=$(per32 "$out/neon" plain "$t" "$n")
        d=$(per32 "$out/neon" dotprod "$t" "$n")
        i=$(per32 "$out/neon" i8mm "$t" "$n")
        echo "| $t | $n | $s | $p | $d | $i |"
    done
done
