/* test_cpu.c - the SIMD level: detection against the compiler's own cpuid
 * code, the level running equals the level asked for (AGENTKV_SIMD) and the
 * level of the code actually reached, and every level the CPU supports runs
 * in a child process (agentkv info --cpu) when the build dispatches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "kernels/kernels.h"
#include "kv/kvformat.h"
#include "test.h"

/* The kernels' back end name each level runs ("avx2vnni" is AVX2 code,
 * "avx512vnni" AVX-512 code). */
static const char *backend_of(int level) {
    switch (level) {
    case AK_CPU_AVX512: case AK_CPU_AVX512VNNI: return "avx512";
    case AK_CPU_AVX2: case AK_CPU_AVX2VNNI: return "avx2";
    case AK_CPU_NEON: return "neon";
    default: return "scalar";
    }
}

TEST(cpu_level_names_parse_back) {
    for (int l = 0; l < AK_CPU_NLEVELS; l++)
        CHECK(ak_cpu_level_parse(ak_cpu_level_name(l)) == l, "level %d (%s)", l, ak_cpu_level_name(l));
    CHECK(ak_cpu_level_parse("AVX2") == -1 && ak_cpu_level_parse("") == -1 && ak_cpu_level_parse(NULL) == -1,
          "only exact lower-case names");
    CHECK(!strcmp(ak_cpu_level_name(AK_CPU_NLEVELS), "?") && !strcmp(ak_cpu_level_name(-1), "?"), "out of range");
}

#if defined(__x86_64__)
/* The detection against libgcc's (__builtin_cpu_supports, its own cpuid and
 * XCR0 reading): a level is supported exactly when every feature its
 * -march flags allow is there. */
TEST(cpu_detection_agrees_with_the_compiler) {
    __builtin_cpu_init();
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("lzcnt") &&
             __builtin_cpu_supports("movbe");
    int vnni = v3 && __builtin_cpu_supports("avxvnni");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    int v4vnni = v4 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
    CHECK(ak_cpu_supports(AK_CPU_SCALAR), "scalar always runs");
    CHECK(ak_cpu_supports(AK_CPU_AVX2) == v3, "avx2: ours %d, libgcc %d", ak_cpu_supports(AK_CPU_AVX2), v3);
    CHECK(ak_cpu_supports(AK_CPU_AVX2VNNI) == vnni, "avx2vnni: ours %d, libgcc %d", ak_cpu_supports(AK_CPU_AVX2VNNI),
          vnni);
    CHECK(ak_cpu_supports(AK_CPU_AVX512) == v4, "avx512: ours %d, libgcc %d", ak_cpu_supports(AK_CPU_AVX512), v4);
    CHECK(ak_cpu_supports(AK_CPU_AVX512VNNI) == v4vnni, "avx512vnni: ours %d, libgcc %d",
          ak_cpu_supports(AK_CPU_AVX512VNNI), v4vnni);
    CHECK(!ak_cpu_supports(AK_CPU_NEON), "no neon on x86");
    char f[512];
    ak_cpu_features(f, sizeof f);
    CHECK(!!strstr(f, "avx2") == !!__builtin_cpu_supports("avx2") &&
          !!strstr(f, "avx512f") == !!__builtin_cpu_supports("avx512f"), "features '%s'", f);
}
#endif

/* In this process: the level chosen is the one AGENTKV_SIMD asks for (when
 * built and supported; else the best), and the code running is that
 * level's (a function compiled per level, reached through the dispatch),
 * as are the kernels' and the KV formats' back ends. */
TEST(cpu_level_running_is_the_one_asked_for) {
    int level = ak_cpu_level();
    CHECK(ak_cpu_compiled_level() == level, "running code of level %s, chosen %s",
          ak_cpu_level_name(ak_cpu_compiled_level()), ak_cpu_level_name(level));
    CHECK(ak_cpu_supports(level) && ak_cpu_built(level), "level %s", ak_cpu_level_name(level));
    CHECK(!strcmp(ak_simd_name(), backend_of(level)), "kernels %s at level %s", ak_simd_name(),
          ak_cpu_level_name(level));
    CHECK(!strcmp(ak_kv_format_backend(), backend_of(level)), "kv formats %s at level %s", ak_kv_format_backend(),
          ak_cpu_level_name(level));
    const char *want = getenv("AGENTKV_SIMD");
    int asked = ak_cpu_level_parse(want);
    if (!ak_cpu_dispatched()) {
        CHECK(want && *want && asked != level ? ak_cpu_note()[0] != 0 : ak_cpu_note()[0] == 0,
              "a single-target build notes an ignored AGENTKV_SIMD: '%s'", ak_cpu_note());
        return;
    }
    int best = AK_CPU_SCALAR;
    for (int l = AK_CPU_AVX512VNNI; l > AK_CPU_SCALAR && best == AK_CPU_SCALAR; l--)
        if (ak_cpu_supports(l) && ak_cpu_built(l)) best = l;
    if (asked >= 0 && ak_cpu_supports(asked) && ak_cpu_built(asked)) {
        CHECK(level == asked, "AGENTKV_SIMD=%s, running %s", want, ak_cpu_level_name(level));
        CHECK(ak_cpu_note()[0] == 0, "note '%s'", ak_cpu_note());
    } else {
        CHECK(level == best, "AGENTKV_SIMD=%s, running %s, best %s", want ? want : "(unset)",
              ak_cpu_level_name(level), ak_cpu_level_name(best));
        CHECK((want && *want) == (ak_cpu_note()[0] != 0), "note '%s'", ak_cpu_note());
    }
}

/* Runs `AGENTKV_SIMD=want agentkv info --cpu` and returns its output
 * (stdout and stderr), or NULL. */
static char *info_cpu(const char *want) {
    const char *bin = getenv("AK_BIN");
    if (!bin) bin = "build/agentkv";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "AGENTKV_SIMD='%s' '%s' info --cpu 2>&1", want, bin);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    static const size_t cap = 8192;
    char *out = calloc(1, cap);
    size_t n = out ? fread(out, 1, cap - 1, p) : 0;
    if (out) out[n] = 0;
    if (pclose(p) != 0) { free(out); return NULL; }
    return out;
}

/* Every level the machine supports, forced in a child: the child reports
 * running it (its kernels and the code reached through the dispatch); a
 * level the CPU lacks, or a name that is none, gets one warning and the
 * best level. */
TEST(cpu_every_supported_level_runs_when_forced) {
    if (!ak_cpu_dispatched()) SKIP("a single-target build (ARCH=%s-like) has one level", ak_simd_name());
    int best = AK_CPU_SCALAR;
    for (int l = AK_CPU_AVX512VNNI; l > AK_CPU_SCALAR && best == AK_CPU_SCALAR; l--)
        if (ak_cpu_supports(l) && ak_cpu_built(l)) best = l;
    for (int l = AK_CPU_SCALAR; l <= AK_CPU_AVX512VNNI; l++) {
        char *out = info_cpu(ak_cpu_level_name(l));
        REQUIRE(out, "agentkv info --cpu failed (AK_BIN)");
        char want[160];
        int ok = ak_cpu_supports(l) && ak_cpu_built(l);
        snprintf(want, sizeof want, "level          %s (code running: %s, kernels %s)\n",
                 ak_cpu_level_name(ok ? l : best), ak_cpu_level_name(ok ? l : best), backend_of(ok ? l : best));
        CHECK(strstr(out, want) != NULL, "AGENTKV_SIMD=%s: want '%s' in:\n%s", ak_cpu_level_name(l), want, out);
        CHECK(!!strstr(out, "agentkv: AGENTKV_SIMD=") == !ok, "AGENTKV_SIMD=%s: warning iff unsupported:\n%s",
              ak_cpu_level_name(l), out);
        free(out);
    }
    char *out = info_cpu("avx-9000");
    REQUIRE(out, "agentkv info --cpu failed");
    CHECK(strstr(out, "agentkv: AGENTKV_SIMD=avx-9000 is not a level") != NULL, "no warning for a bad name:\n%s", out);
    char want[64];
    snprintf(want, sizeof want, "level          %s ", ak_cpu_level_name(best));
    CHECK(strstr(out, want) != NULL, "a bad name runs the best level (%s):\n%s", ak_cpu_level_name(best), out);
    free(out);
}

#if defined(__x86_64__)
/* Instructions of VNNI (vpdpbusd, vpdpwssd and their saturating forms) or
 * VBMI (vpermb, vpermt2b / vpermi2b, vpmultishiftqb) in the disassembly of
 * the level's objects (the .o files of BUILD/dsp/LEVEL/src beside AK_BIN),
 * or -1 when they cannot be read (no objdump, no such objects). */
static long vnni_vbmi_instructions(const char *level) {
    const char *bin = getenv("AK_BIN");
    if (!bin) bin = "build/agentkv";
    char dir[400];
    snprintf(dir, sizeof dir, "%s", bin);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "ls '%s'/dsp/%s/src/*.o >/dev/null 2>&1 && objdump -d '%s'/dsp/%s/src/*.o 2>/dev/null | "
             "grep -c -E '\\s(vpdpbusds?|vpdpwssds?|vpermb|vpermt2b|vpermi2b|vpmultishiftqb)\\s' || true",
             dir, level, dir, level);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    long n = -1;
    if (fscanf(p, "%ld", &n) != 1) n = -1;
    pclose(p);
    return n;
}

/* The avx512 level (Skylake-SP: AVX-512 F/CD/BW/DQ/VL only) must never
 * execute VNNI or VBMI: its objects hold none of their instructions, while
 * the avx512vnni level's do (so the search would find them). */
TEST(cpu_avx512_level_has_no_vnni_or_vbmi_code) {
    if (!ak_cpu_dispatched()) SKIP("a single-target build has no per-level objects");
    long top = vnni_vbmi_instructions("avx512vnni"), base = vnni_vbmi_instructions("avx512");
    if (top < 0 || base < 0) SKIP("the level objects or objdump are not at hand (AK_BIN's build)");
    printf("    VNNI/VBMI instructions: avx512vnni %ld, avx512 %ld\n", top, base);
    CHECK(top > 0, "the avx512vnni level's objects hold no VNNI/VBMI instruction: the search finds nothing");
    CHECK(base == 0, "the avx512 level's objects hold %ld VNNI/VBMI instructions", base);
}
#endif
