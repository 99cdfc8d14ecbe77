#!/bin/sh
# neon-counts.sh [ARM_BUILD] - instructions in the inner loop of each NEON
# matrix kernel per 32 weights per token, read from the cross compiler's
# disassembly of the AArch64 build's objects (make test-arm's build, or any
# `make CC=aarch64-linux-gnu-gcc ARCH=armv8-a` build: its objects carry -g's
# line table). Prints a markdown table: Q4_0, Q8_0, Q4_K, Q6_K and F16, the
# packed tiles (kernels_packed_arm.c, kernels_packed_k_arm.c) and the
# row-major kernels (kernels_arm.c, kernels_kquant_arm.c) at each NEON level
# they have, for one token and for the tile's tokens, against the scalar
# reference kernels (kernels.c, kquant.c) as the same build compiled them.
#
# How a cell is counted: in the function holding the kernel (one per level
# and tile size), every backward branch closes a loop (from its target to
# the branch). Of the innermost loops (no other loop inside) holding the
# kernel's multiplies (with a source line given, only those holding an
# instruction of that line: the scalar kernels of several types share a
# function), the one with the most multiply-accumulates is taken. Its
# instructions, counted once each as written (a branch inside it counts
# whether taken or not), are divided by the weight x token products it makes
# per pass, over 32. Products per instruction: sdot 16, smmla 32, smull /
# smlal (8-bit, 8 lanes) 8, fmla / fmul 4 per .4s vector, a scalar
# multiply 1 (quantized kernels count only their integer multiplies: the
# float scaling is not a weight product; float kernels their float ones).
# Static counts: not cycles, and what the loop's setup, the activations'
# quantization and the per-block or per-row work outside it cost is left
# out (scripts/arm-insns.sh counts executed instructions under qemu).
set -eu
arm=${1:-build-arm}
OBJDUMP=${OBJDUMP:-aarch64-linux-gnu-objdump}
command -v "$OBJDUMP" >/dev/null 2>&1 || { echo "neon-counts.sh: no $OBJDUMP (scripts/deps-cross.sh)" >&2; exit 1; }
for o in kernels kquant kernels_arm kernels_kquant_arm kernels_packed_arm kernels_packed_k_arm; do
    [ -f "$arm/src/kernels/$o.o" ] || { echo "neon-counts.sh: no $arm/src/kernels/$o.o (make test-arm builds it)" >&2; exit 1; }
done

# line FILE TEXT: "FILE:N", N the first line of src/kernels/FILE holding TEXT.
line() {
    n=$(grep -n -F -- "$2" "src/kernels/$1" | head -n 1 | cut -d: -f1)
    [ -n "$n" ] || { echo "neon-counts.sh: '$2' not in src/kernels/$1" >&2; exit 1; }
    echo "$1:$n"
}

# cell OBJ FUNC MODE [SEL [PER]]: instructions per 32 weights per token of
# FUNC's inner loop ("-" when FUNC is not in OBJ). MODE q or f: which
# multiplies count; SEL "FILE:LINE" or ""; PER products per weight x token
# (2 where the scalar reference also multiplies by the scale per element).
cell() {
    "$OBJDUMP" -d -l --no-show-raw-insn --disassemble="$2" "$arm/src/kernels/$1.o" 2>/dev/null |
    awk -v mode="$3" -v sel="${4:-}" -v per="${5:-1}" '
    function hex(s,   v, i) {
        v = 0
        for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
        return v
    }
    function lanes(op, dflt) {
        if (op ~ /\.16b/) return 16; if (op ~ /\.8h/) return 8; if (op ~ /\.4s/) return 4
        if (op ~ /\.2s/ || op ~ /\.2d/) return 2; return dflt
    }
    function macs(m, op,   d, opa) {
        split(op, opa, ","); d = opa[1]
        if (mode == "q") {
            if (m ~ /^[su]s?dot$/) return d ~ /\.4s/ ? 16 : 8
            if (m ~ /^(s|u|us)mmla$/) return 32
            if (m ~ /^[su]ml[as]l2?$/ || m ~ /^[su]mull2?$/) return d ~ /\.8h/ ? 8 : 0
            if (m ~ /^(madd|msub|mul|smaddl|umaddl|smull|umull|mneg)$/ && op !~ /v[0-9]/) return 1
            return 0
        }
        if (m ~ /^(fmla|fmls|fmul)$/) return lanes(d, 1)
        if (m ~ /^(fmadd|fmsub|fnmadd|fnmsub)$/) return 1
        return 0
    }
    /^\/.*:[0-9]+/ {   # a line-table entry: the source line of what follows
        src = $1; sub(/.*\/src\/kernels\//, "", src); next
    }
    /^ *[0-9a-f]+:\t/ {
        split($0, f, "\t")
        a = f[1]; sub(/^ */, "", a); sub(/:$/, "", a)
        n++; addr[n] = hex(a); mn[n] = f[2]; ops[n] = f[3]; at[n] = src
        mac[n] = macs(f[2], f[3])
    }
    END {
        if (!n) { print "-"; exit }
        nl = 0
        for (i = 1; i <= n; i++) {
            if (mn[i] !~ /^(b|b\..*|cbn?z|tbn?z)$/ || !match(ops[i], /[0-9a-f]+ </)) continue
            t = hex(substr(ops[i], RSTART, RLENGTH - 2))
            if (t > addr[i]) continue
            for (j = 1; j <= n && addr[j] != t; j++);
            if (j <= n) { nl++; lo[nl] = j; hi[nl] = i }
        }
        best = 0
        for (l = 1; l <= nl; l++) {
            inner = 1   # no other loop inside this one
            for (o = 1; o <= nl; o++)
                if (o != l && lo[o] >= lo[l] && hi[o] <= hi[l] && hi[o] - lo[o] < hi[l] - lo[l]) inner = 0
            if (!inner) continue
            m = 0; hit = sel == ""
            for (k = lo[l]; k <= hi[l]; k++) { m += mac[k]; if (at[k] == sel) hit = 1 }
            len = hi[l] - lo[l] + 1
            if (!hit || m == 0) continue
            if (m > bm || (m == bm && len < bl)) { bm = m; bl = len; best = 1 }
        }
        if (!best) { print "?"; exit }
        printf "%.1f (%d/%d)", bl * 32 / (bm / per), bl, bm / per
    }'
}

# A row: TYPE FORM TOKENS, then the scalar, plain, dotprod and i8mm cells.
row() { echo "| $1 | $2 | $3 | $4 | $5 | $6 | $7 |"; }

sq40=$(cell kernels scalar_mm_q q "$(line kernels.c 'isum += ((blk[2 + j] & 15) - 8) * xq[j]')")
sq80=$(cell kernels scalar_mm_q q "$(line kernels.c 'isum += qw[i] * xq[i]')")
sf16=$(cell kernels scalar_mm_f f "$(line kernels.c 'sum += ak_f16_to_f32(ak_load_u16(w + 2 * i)) * x[i]')")
sq4k=$(cell kquant scalar_mm_q q "$(line kquant.c 'ia += a * x->q[64 * c + l]')")
sq6k=$(cell kquant scalar_mm_q q "$(line kquant.c 'isum += sc[e / 16] * (lo | hi << 4) * x->q[e]')" 2)

echo "| weights | kernel | tokens | scalar reference | NEON plain | NEON dotprod | NEON i8mm |"
echo "|---|---|---|---|---|---|---|"
for t in q4_0 q8_0; do
    case $t in q4_0) k=0 s=$sq40 ;; *) k=1 s=$sq80 ;; esac
    for T in 1 4; do
        row "$t" packed "$T" "$s" "$(cell kernels_packed_arm "qt_${k}__plain$T" q)" \
            "$(cell kernels_packed_arm "qt_${k}__dot$T" q)" "$(cell kernels_packed_arm "qt_${k}__i8mm$T" q)"
    done
    for T in 1 2; do
        row "$t" row-major "$T" "$s" "$(cell kernels_arm "qt_plain_${k}_4_$T" q)" \
            "$(cell kernels_arm "qt_dot_${k}_4_$T" q)" "= dotprod"
    done
done
for t in q4_k q6_k; do
    case $t in q4_k) k=0 s=$sq4k ;; *) k=2 s=$sq6k ;; esac
    for T in 1 4; do
        row "$t" packed "$T" "$s" "$(cell kernels_packed_k_arm "kt_${k}__plain$T" q)" \
            "$(cell kernels_packed_k_arm "kt_${k}__dot$T" q)" "= dotprod"
    done
    f=row_dot_$(echo "$t" | tr -d _)
    row "$t" row-major 1 "$s" "$(cell kernels_kquant_arm "${f}_plain" q)" "$(cell kernels_kquant_arm "${f}_dot" q)" \
        "= dotprod"
done
for T in 1 4; do
    row f16 packed "$T" "$sf16" "$(cell kernels_packed_arm "ft_1__plain$T" f)" "= plain" "= plain"
    row f16 row-major "$T" "$sf16" "$(cell kernels_arm "ft_1_4_$T" f)" "= plain" "= plain"
done
