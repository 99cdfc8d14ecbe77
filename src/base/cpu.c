/* cpu.c - see cpu.h. CPU feature detection (cpuid, and XCR0 through xgetbv
 * for the register state the OS saves), the choice of the level, and in a
 * dispatched build (AK_DISPATCH) the filling of the jump table.
 *
 * The dispatched build's pieces (Makefile, scripts/dispatch.sh): each file
 * with SIMD code is compiled once per level and its global symbols renamed
 * NAME__LEVEL; a generated assembly file defines every renamed function's
 * original NAME as one `jmp *ak_dsp_slots[i]`, plus one table of the
 * NAME__LEVEL addresses per level (ak_dsp_tables, indexed by ak_cpu_level,
 * 0 for a level not built). Each slot starts at a lazy entry that saves the
 * argument registers, calls ak_dsp_init() and jumps again, so the first
 * call of any dispatched function, from any thread, fills the slots.
 *
 * Process-wide state: the chosen level, its note and the slots are written
 * once, inside pthread_once, and only read afterwards. The level cannot
 * change within a process (data made at one level, such as packed weights,
 * is only ever read by code of the same level).
 */
#include "base/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define AK_CPU_X86 1
#endif

static const char *const level_names[AK_CPU_NLEVELS] = {"scalar", "avx2", "avx2vnni", "avx512", "avx512vnni", "neon"};

/* Name of a level, "?" out of range. */
const char *ak_cpu_level_name(int level) {
    return level >= 0 && level < AK_CPU_NLEVELS ? level_names[level] : "?";
}

/* The level named s, or -1 (NULL and unknown names alike). */
int ak_cpu_level_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < AK_CPU_NLEVELS; i++)
        if (!strcmp(s, level_names[i])) return i;
    return -1;
}

/* ---- Features ---- */

#if defined(AK_CPU_X86)
enum {
    F_SSE2, F_AVX, F_AVX2, F_FMA, F_F16C, F_BMI1, F_BMI2, F_LZCNT, F_MOVBE, F_AVXVNNI,
    F_AVX512F, F_AVX512BW, F_AVX512CD, F_AVX512DQ, F_AVX512VL, F_AVX512VNNI, F_AVX512VBMI,
    F_OS_AVX, F_OS_AVX512, F_COUNT
};
static const char *const feature_names[F_COUNT] = {
    "sse2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe", "avxvnni",
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512vnni", "avx512vbmi",
    "os-ymm", "os-zmm"};

/* Bit F_x set where the CPU has feature x; F_OS_AVX / F_OS_AVX512 where the
 * OS saves the ymm / zmm and mask registers (XCR0), without which the
 * instructions fault however the CPU reports them. Pure: cpuid and xgetbv
 * only, no state. */
static unsigned detect_features(void) {
    unsigned f = 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (d & (1u << 26)) f |= 1u << F_SSE2;
    if (c & (1u << 12)) f |= 1u << F_FMA;
    if (c & (1u << 22)) f |= 1u << F_MOVBE;
    if (c & (1u << 28)) f |= 1u << F_AVX;
    if (c & (1u << 29)) f |= 1u << F_F16C;
    if (c & (1u << 27)) {   /* OSXSAVE: xgetbv is there */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & 0x6) == 0x6) f |= 1u << F_OS_AVX;          /* xmm, ymm */
        if ((lo & 0xe6) == 0xe6) f |= 1u << F_OS_AVX512;     /* + opmask, zmm0-15 upper, zmm16-31 */
    }
    unsigned max7 = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        max7 = a;
        if (b & (1u << 3)) f |= 1u << F_BMI1;
        if (b & (1u << 5)) f |= 1u << F_AVX2;
        if (b & (1u << 8)) f |= 1u << F_BMI2;
        if (b & (1u << 16)) f |= 1u << F_AVX512F;
        if (b & (1u << 17)) f |= 1u << F_AVX512DQ;
        if (b & (1u << 28)) f |= 1u << F_AVX512CD;
        if (b & (1u << 30)) f |= 1u << F_AVX512BW;
        if (b & (1u << 31)) f |= 1u << F_AVX512VL;
        if (c & (1u << 1)) f |= 1u << F_AVX512VBMI;
        if (c & (1u << 11)) f |= 1u << F_AVX512VNNI;
    }
    if (max7 >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4))) f |= 1u << F_AVXVNNI;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d) && (c & (1u << 5))) f |= 1u << F_LZCNT;
    return f;
}

/* The features each level's code may use (its -march flags, Makefile). */
#define BIT(x) (1u << (x))
static const unsigned level_needs[AK_CPU_NLEVELS] = {
    [AK_CPU_SCALAR] = 0,
    [AK_CPU_AVX2] = BIT(F_AVX) | BIT(F_AVX2) | BIT(F_FMA) | BIT(F_F16C) | BIT(F_BMI1) | BIT(F_BMI2) |
                    BIT(F_LZCNT) | BIT(F_MOVBE) | BIT(F_OS_AVX),
    [AK_CPU_AVX2VNNI] = BIT(F_AVX) | BIT(F_AVX2) | BIT(F_FMA) | BIT(F_F16C) | BIT(F_BMI1) | BIT(F_BMI2) |
                        BIT(F_LZCNT) | BIT(F_MOVBE) | BIT(F_OS_AVX) | BIT(F_AVXVNNI),
    [AK_CPU_AVX512] = BIT(F_AVX) | BIT(F_AVX2) | BIT(F_FMA) | BIT(F_F16C) | BIT(F_BMI1) | BIT(F_BMI2) |
                      BIT(F_LZCNT) | BIT(F_MOVBE) | BIT(F_OS_AVX) | BIT(F_AVX512F) | BIT(F_AVX512BW) |
                      BIT(F_AVX512CD) | BIT(F_AVX512DQ) | BIT(F_AVX512VL) | BIT(F_OS_AVX512),
    [AK_CPU_AVX512VNNI] = BIT(F_AVX) | BIT(F_AVX2) | BIT(F_FMA) | BIT(F_F16C) | BIT(F_BMI1) | BIT(F_BMI2) |
                          BIT(F_LZCNT) | BIT(F_MOVBE) | BIT(F_OS_AVX) | BIT(F_AVX512F) | BIT(F_AVX512BW) |
                          BIT(F_AVX512CD) | BIT(F_AVX512DQ) | BIT(F_AVX512VL) | BIT(F_AVX512VNNI) |
                          BIT(F_AVX512VBMI) | BIT(F_OS_AVX512),
    [AK_CPU_NEON] = 0,
};
#endif

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)   /* <asm/hwcap.h>'s values, where the libc headers lack them */
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
/* 0 plain NEON, 1 dotprod, 2 dotprod + i8mm: what the CPU (and the kernel,
 * which reports the hardware capabilities) offers. */
static int neon_hw_level(void) {
    unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    return (h & HWCAP_ASIMDDP) ? ((h2 & HWCAP2_I8MM) ? 2 : 1) : 0;
}
#endif

/* 1 if the CPU and OS can run the level's code. */
int ak_cpu_supports(int level) {
    if (level < 0 || level >= AK_CPU_NLEVELS) return 0;
#if defined(AK_CPU_X86)
    if (level == AK_CPU_NEON) return 0;
    unsigned f = detect_features();
    return (f & level_needs[level]) == level_needs[level];
#elif defined(__aarch64__)
    return level == AK_CPU_SCALAR || level == AK_CPU_NEON;
#else
    return level == AK_CPU_SCALAR;
#endif
}

/* Space-separated names of the features present. */
char *ak_cpu_features(char *buf, size_t n) {
    if (!n) return buf;
    buf[0] = 0;
#if defined(AK_CPU_X86)
    size_t o = 0;
    unsigned f = detect_features();
    for (int i = 0; i < F_COUNT; i++) {
        if (!(f & BIT(i))) continue;
        int w = snprintf(buf + o, n - o, "%s%s", o ? " " : "", feature_names[i]);
        if (w < 0 || (size_t)w >= n - o) break;
        o += (size_t)w;
    }
#elif defined(__aarch64__)
    int hw = neon_hw_level();
    snprintf(buf, n, "neon%s%s", hw >= 1 ? " dotprod" : "", hw >= 2 ? " i8mm" : "");
#endif
    return buf;
}

static const char *const neon_level_names[3] = {"plain", "dotprod", "i8mm"};

/* Name of a NEON level, "?" out of range. */
const char *ak_cpu_neon_level_name(int level) {
    return level >= 0 && level < 3 ? neon_level_names[level] : "?";
}

/* The CPU's NEON level, capped by AGENTKV_NEON. Read on every call (two
 * reads of the auxiliary vector and an environment look-up): nothing is
 * kept, so a test may change the variable between products. */
int ak_cpu_neon_level(void) {
#if defined(__aarch64__)
    int lv = neon_hw_level();
    const char *e = getenv("AGENTKV_NEON");
    if (e) {
        int want = lv;
        for (int i = 0; i < 3; i++)
            if (!strcmp(e, neon_level_names[i])) want = i;
        if (want < lv) lv = want;
    }
    return lv;
#else
    return -1;
#endif
}

/* ---- The choice ---- */

#if defined(AK_DISPATCH)
/* Generated (scripts/dispatch.sh stubs): the slots every dispatched
 * function jumps through, their number, and one address table per level. */
extern void *ak_dsp_slots[];
extern const unsigned long ak_dsp_count;
extern void *const *const ak_dsp_tables[AK_CPU_AVX512VNNI + 1];
void ak_dsp_init(void);
#endif

/* 1 for a dispatched build. */
int ak_cpu_dispatched(void) {
#if defined(AK_DISPATCH)
    return 1;
#else
    return 0;
#endif
}

/* 1 if the binary has code for the level. */
int ak_cpu_built(int level) {
    if (level < 0 || level >= AK_CPU_NLEVELS) return 0;
#if defined(AK_DISPATCH)
    return level <= AK_CPU_AVX512VNNI && ak_dsp_tables[level] != 0;
#else
    return level == ak_cpu_compiled_level();
#endif
}

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;
static int chosen_level;
static char chosen_note[200];

/* Runs once: reads AGENTKV_SIMD, picks the level, and (dispatched) fills the
 * slots; a level other than the one asked for is explained in chosen_note
 * and printed once to stderr (the library's only output of its own: the
 * variable is read before any caller could be asked where to log). */
static void choose(void) {
    const char *want = getenv("AGENTKV_SIMD");
    if (want && !*want) want = NULL;
    int asked = ak_cpu_level_parse(want);
#if defined(AK_DISPATCH)
    int best = AK_CPU_SCALAR;
    for (int l = AK_CPU_AVX512VNNI; l > AK_CPU_SCALAR; l--)
        if (ak_cpu_built(l) && ak_cpu_supports(l)) { best = l; break; }
    int level = best;
    if (want && asked < 0)
        snprintf(chosen_note, sizeof chosen_note,
                 "AGENTKV_SIMD=%.40s is not a level (scalar, avx2, avx2vnni, avx512, avx512vnni); running %s", want,
                 level_names[best]);
    else if (want && !(ak_cpu_built(asked) && ak_cpu_supports(asked)))
        snprintf(chosen_note, sizeof chosen_note, "AGENTKV_SIMD=%s: %s; running %s", want,
                 ak_cpu_built(asked) ? "this CPU (or OS) lacks it" : "not built into this binary",
                 level_names[best]);
    else if (want)
        level = asked;   /* lower or equal: the point of the variable */
    void *const *tab = ak_dsp_tables[level];
    for (unsigned long i = 0; i < ak_dsp_count; i++) __atomic_store_n(&ak_dsp_slots[i], tab[i], __ATOMIC_RELEASE);
    chosen_level = level;
#else
    chosen_level = ak_cpu_compiled_level();
    if (want && asked != chosen_level)
        snprintf(chosen_note, sizeof chosen_note,
                 "AGENTKV_SIMD=%.40s ignored: this binary is built for %s only (build with ARCH=dispatch to choose)",
                 want, level_names[chosen_level]);
#endif
    if (chosen_note[0]) fprintf(stderr, "agentkv: %s\n", chosen_note);
}

/* The running level. */
int ak_cpu_level(void) {
    pthread_once(&choose_once, choose);
    return chosen_level;
}

/* Why the level differs from AGENTKV_SIMD, or "". */
const char *ak_cpu_note(void) {
    pthread_once(&choose_once, choose);
    return chosen_note;
}

#if defined(AK_DISPATCH)
/* Called by the generated lazy entries on the first call of a dispatched
 * function: fills the slots (once, whichever thread comes first). */
void ak_dsp_init(void) { pthread_once(&choose_once, choose); }
#endif
