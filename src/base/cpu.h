/* cpu.h - which SIMD level the kernels run at, and what the CPU offers.
 *
 * Levels, lowest first (x86-64; an ARM build is NEON, whose extensions the
 * kernels pick at run time: ak_cpu_neon_level):
 *   scalar    plain C (the x86-64 baseline: SSE2 where the compiler uses it)
 *   avx2      x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE
 *   avx2vnni  avx2 + AVX-VNNI (vpdpbusd on 256-bit vectors)
 *   avx512    x86-64-v4: AVX-512 F, BW, CD, DQ, VL (Skylake-SP/X; Cascade
 *             Lake, which has VNNI but not VBMI): the packed quantized
 *             tiles are AVX2's (vpmaddubsw), the rest AVX-512's
 *   avx512vnni  avx512 + AVX512-VNNI + AVX512-VBMI (Ice Lake, Sapphire
 *             Rapids, Zen 4/5): vpdpbusd tiles on 64-byte vectors
 *
 * A build made with ARCH=dispatch (the default on x86-64) carries every
 * level: the files with SIMD code are compiled once per level and renamed
 * (scripts/dispatch.sh), and each of their global functions is reached
 * through one jump in a table filled once per process (src/base/cpu.c). The
 * level is the best one the CPU and the OS support, or a lower one named by
 * the environment variable AGENTKV_SIMD (scalar, avx2, avx2vnni, avx512,
 * avx512vnni);
 * naming a level this CPU lacks (or one not built in) prints one warning
 * and runs the best available one; an unknown name likewise. A build made
 * for one target (ARCH=native, ARCH=x86-64-v3, ...) runs the level its
 * compiler flags give and ignores AGENTKV_SIMD (with a warning when it
 * names another level).
 */
#ifndef AK_CPU_H
#define AK_CPU_H

#include <stddef.h>

typedef enum {
    AK_CPU_SCALAR = 0,
    AK_CPU_AVX2 = 1,
    AK_CPU_AVX2VNNI = 2,
    AK_CPU_AVX512 = 3,
    AK_CPU_AVX512VNNI = 4,
    AK_CPU_NEON = 5,      /* ARM builds only; not above the x86 levels in any sense */
    AK_CPU_NLEVELS = 6
} ak_cpu_level_id;

/* The level's name ("scalar", "avx2", "avx2vnni", "avx512", "avx512vnni",
 * "neon"), or
 * "?" out of range. */
const char *ak_cpu_level_name(int level);
/* The level named s (exact, lower case), or -1. */
int ak_cpu_level_parse(const char *s);

/* 1 if this CPU and the OS (the register state enabled in XCR0) support
 * every instruction set of the level; scalar always, neon on ARM builds. */
int ak_cpu_supports(int level);
/* 1 if this binary carries code for the level (every level of a dispatched
 * build; the one level of a single-target build). */
int ak_cpu_built(int level);
/* 1 if this binary picks its level at run time (ARCH=dispatch). */
int ak_cpu_dispatched(void);

/* The level the kernels run at in this process: chosen on the first call
 * (or the first call of any dispatched function), never changes after. */
int ak_cpu_level(void);
/* The level of the code actually reached through the dispatch (compiled
 * into src/kernels/cpu_level.c once per level): equals ak_cpu_level() unless the
 * dispatch is broken. Tests compare the two. */
int ak_cpu_compiled_level(void);
/* A line explaining a level other than the one asked for (AGENTKV_SIMD
 * unknown, above this CPU, or ignored by a single-target build), or "". */
const char *ak_cpu_note(void);

/* AArch64 builds: the NEON level the matrix kernels use, chosen per product
 * (not once per process like the level above): 0 plain NEON, 1 + the
 * dot-product extension (sdot), 2 + the int8 matrix multiply (smmla); what
 * this CPU has (getauxval: HWCAP_ASIMDDP, HWCAP2_I8MM), lowered to the one
 * the environment variable AGENTKV_NEON names (plain, dotprod, i8mm) where
 * that is lower (a higher or unknown name is ignored). Every NEON level
 * gives the same bits. -1 on other builds. */
int ak_cpu_neon_level(void);
/* The NEON level's name ("plain", "dotprod", "i8mm"), or "?" out of range. */
const char *ak_cpu_neon_level_name(int level);

/* The CPU's SIMD features the levels are made of, as space-separated
 * names ("sse2 avx avx2 fma f16c ..."), into buf (always terminated).
 * Returns buf. On AArch64: "neon", and "dotprod", "i8mm" where this CPU
 * has them (getauxval). */
char *ak_cpu_features(char *buf, size_t n);

#endif
