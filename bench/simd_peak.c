/* simd_peak.c - the arithmetic ceiling of this CPU for the instruction mixes
 * the weight tiles are made of, per core: how many multiply-adds a second
 * the inner loops could do if nothing else (loads, unpacking, scales) cost
 * anything. Batched decode is bound by this, where one sequence's decode is
 * bound by memory bandwidth; their ratio bounds what batching can gain.
 *
 * Mixes (per instruction group, all on 256-bit vectors unless named):
 *   fma       vfmadd231ps: 8 multiply-adds (F32/F16/BF16 weights at AVX2)
 *   u8s8_16   vpmaddubsw + vpaddw: 32 products summed into 16-bit lanes
 *             (Q4_0, Q4_1, Q4_K at plain AVX2: 4-bit codes times int8)
 *   s8s8      vpsignb + vpmaddubsw + vpmaddwd + vpaddd: 32 products of two
 *             signed bytes, widened at once (Q8_0 at plain AVX2)
 *   vnni      vpdpbusd: 32 products into 32-bit lanes (AVX-VNNI)
 *   fma512, vnni512   the same on 512-bit vectors (AVX-512 levels)
 * Each mix runs on 12 independent chains, on one thread and then on every
 * thread at once (-t; do two vCPUs share one core's units?), and reports
 * the best of -r runs in G multiply-adds (products) per second per thread,
 * from the thread's own CPU time.
 *
 * With -m MACS (multiply-adds per token: about the weight count) and --tg
 * TOK_S (one sequence's decode, e.g. from bench engine) it also prints, per
 * mix, the most tokens per second any batch could reach on the threads and
 * that as a multiple of TOK_S: the ceiling of bench engine's batch ratio.
 * Built by `make bench-tools` (as BUILD/bench/simd_peak):
 *
 *   build/bench/simd_peak [-t 2] [-r 3] [-m 1.04e9 --tg 67]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define ITERS 20000000L   /* per run: 12 groups each; about 0.1 s */
#define PIN(v) __asm__ volatile("" : "+x"(v))
/* Twelve named accumulators (an array of them GCC keeps on the stack). */
#define EACH(M) M(a0) M(a1) M(a2) M(a3) M(a4) M(a5) M(a6) M(a7) M(a8) M(a9) M(a10) M(a11)
#define DECL(T, init) T a0 = init, a1 = init, a2 = init, a3 = init, a4 = init, a5 = init, a6 = init, a7 = init, \
                             a8 = init, a9 = init, a10 = init, a11 = init

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* MIX_FN(NAME, TARGET, VT, CONSTS, INIT, STEP, FOLD) defines
 * double NAME(int *sink): seconds of thread CPU time for ITERS iterations
 * of STEP on each of the twelve accumulators (of vector type VT, set to
 * INIT; CONSTS declares the operands w and x), built for TARGET; FOLD adds
 * each result into *sink so that nothing is optimized away. */
#define MIX_FN(NAME, TARGET, VT, CONSTS, INIT, STEP, FOLD)       \
    __attribute__((target(TARGET))) static double NAME(int *sink) { \
        CONSTS;                                                  \
        DECL(VT, INIT);                                          \
        double t0 = thread_cpu();                                \
        for (long n = 0; n < ITERS; n++) {                       \
            EACH(STEP)                                           \
            PIN(w);                                              \
        }                                                        \
        double t = thread_cpu() - t0;                            \
        EACH(FOLD)                                               \
        return t;                                                \
    }

/* Each step's products take the accumulator itself as an operand, so that
 * every chain computes its own (the same operands in every chain would be
 * computed once and shared). */
#define FMA256(a) a = _mm256_fmadd_ps(w, x, a); PIN(a);
#define U8S8_16(a) a = _mm256_add_epi16(a, _mm256_maddubs_epi16(a, x)); PIN(a);
#define S8S8(a) a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(x, a)), one)); PIN(a);
#define VNNI256(a) a = _mm256_dpbusd_avx_epi32(a, w, x); PIN(a);
#define FMA512(a) a = _mm512_fmadd_ps(w, x, a); PIN(a);
#define VNNI512(a) a = _mm512_dpbusd_epi32(a, w, x); PIN(a);
#define FOLD_PS(a) *sink += (int)_mm256_cvtss_f32(a);
#define FOLD_EPI16(a) *sink += _mm256_extract_epi16(a, 0);
#define FOLD_EPI32(a) *sink += _mm256_extract_epi32(a, 0);
#define FOLD_PS512(a) *sink += (int)_mm512_reduce_add_ps(a);
#define FOLD_EPI512(a) *sink += _mm512_reduce_add_epi32(a);

MIX_FN(run_fma, "avx2,fma", __m256, __m256 w = _mm256_set1_ps(1.0001f); __m256 x = _mm256_set1_ps(0.9999f),
       _mm256_set1_ps(1.0f), FMA256, FOLD_PS)
MIX_FN(run_u8s8_16, "avx2", __m256i, __m256i w = _mm256_set1_epi8(7); __m256i x = _mm256_set1_epi8(-3),
       w, U8S8_16, FOLD_EPI16)
MIX_FN(run_s8s8, "avx2", __m256i,
       __m256i w = _mm256_set1_epi8(7); __m256i x = _mm256_set1_epi8(-3); __m256i one = _mm256_set1_epi16(1),
       w, S8S8, FOLD_EPI32)
MIX_FN(run_vnni, "avx2,avxvnni", __m256i, __m256i w = _mm256_set1_epi8(7); __m256i x = _mm256_set1_epi8(-3),
       _mm256_set1_epi32(1), VNNI256, FOLD_EPI32)
MIX_FN(run_fma512, "avx512f", __m512, __m512 w = _mm512_set1_ps(1.0001f); __m512 x = _mm512_set1_ps(0.9999f),
       _mm512_set1_ps(1.0f), FMA512, FOLD_PS512)
MIX_FN(run_vnni512, "avx512f,avx512vnni", __m512i, __m512i w = _mm512_set1_epi8(7); __m512i x = _mm512_set1_epi8(-3),
       _mm512_set1_epi32(1), VNNI512, FOLD_EPI512)

typedef struct {
    const char *name;
    double (*run)(int *);
    double macs;        /* multiply-adds per group */
    const char *needs;  /* __builtin_cpu_supports names, comma-separated */
    const char *for_what;
} mix;

static const mix mixes[] = {
    { .name = "fma", .run = run_fma, .macs = 8, .needs = "avx2,fma", .for_what = "F32/F16/BF16 weights, AVX2" },
    { .name = "u8s8_16", .run = run_u8s8_16, .macs = 32, .needs = "avx2", .for_what = "Q4_0/Q4_1/Q4_K, plain AVX2" },
    { .name = "s8s8", .run = run_s8s8, .macs = 32, .needs = "avx2", .for_what = "Q8_0, plain AVX2" },
    { .name = "vnni", .run = run_vnni, .macs = 32, .needs = "avxvnni", .for_what = "8/4-bit weights, AVX-VNNI" },
    { .name = "fma512", .run = run_fma512, .macs = 16, .needs = "avx512f", .for_what = "float weights, AVX-512" },
    { .name = "vnni512", .run = run_vnni512, .macs = 64, .needs = "avx512vnni",
     .for_what = "8/4-bit weights, AVX-512 VNNI" },
};

/* Whether the CPU has every feature in the comma-separated list. */
static int supported(const char *needs) {
    __builtin_cpu_init();
    char buf[64];
    snprintf(buf, sizeof buf, "%s", needs);
    for (char *f = strtok(buf, ","); f; f = strtok(NULL, ",")) {
        int ok = !strcmp(f, "avx2") ? __builtin_cpu_supports("avx2")
               : !strcmp(f, "fma") ? __builtin_cpu_supports("fma")
               : !strcmp(f, "avxvnni") ? __builtin_cpu_supports("avxvnni")
               : !strcmp(f, "avx512f") ? __builtin_cpu_supports("avx512f")
               : !strcmp(f, "avx512vnni") ? __builtin_cpu_supports("avx512vnni") : 0;
        if (!ok) return 0;
    }
    return 1;
}

typedef struct {
    const mix *m;
    int reps;
    double gmacs;   /* best G multiply-adds per second of thread CPU time */
    int sink;
} job;

static void *worker(void *arg) {
    job *j = arg;
    double best = 1e30;
    for (int r = 0; r < j->reps; r++) {
        double t = j->m->run(&j->sink);
        if (t < best) best = t;
    }
    j->gmacs = (double)ITERS * 12 * j->m->macs / best / 1e9;
    return NULL;
}

/* Runs mix m on nth threads at once; returns the slowest thread's rate. */
static double measure(const mix *m, int nth, int reps, int *sink) {
    job jobs[64];
    pthread_t tid[64];
    if (nth > 64) nth = 64;
    for (int i = 0; i < nth; i++) {
        jobs[i] = (job){ .m = m, .reps = reps };
        if (i && pthread_create(&tid[i], NULL, worker, &jobs[i]) != 0) {
            fprintf(stderr, "simd_peak: cannot start thread %d\n", i);
            exit(1);
        }
    }
    worker(&jobs[0]);
    double slowest = jobs[0].gmacs;
    for (int i = 1; i < nth; i++) {
        pthread_join(tid[i], NULL);
        if (jobs[i].gmacs < slowest) slowest = jobs[i].gmacs;
    }
    for (int i = 0; i < nth; i++) *sink += jobs[i].sink;
    return slowest;
}

int main(int argc, char **argv) {
    int nth = 2, reps = 3;
    double macs = 0, tg = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) macs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tg") && i + 1 < argc) tg = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: simd_peak [-t THREADS] [-r REPEATS] [-m MACS_PER_TOKEN --tg TOK_S]\n");
            return 2;
        }
    }
    if (nth < 1 || reps < 1) { fprintf(stderr, "simd_peak: -t and -r must be at least 1\n"); return 2; }
    int sink = 0;
    printf("%-8s %-32s %14s %14s", "mix", "used by", "1 thread G/s", "each of N G/s");
    if (macs > 0 && tg > 0) printf(" %14s %10s", "max batch tok/s", "x one seq");
    printf("\n");
    for (size_t k = 0; k < sizeof mixes / sizeof mixes[0]; k++) {
        const mix *m = &mixes[k];
        if (!supported(m->needs)) {
            printf("%-8s %-32s %14s\n", m->name, m->for_what, "(not on this CPU)");
            continue;
        }
        fprintf(stderr, "simd_peak: %s...\r", m->name);
        double one = measure(m, 1, reps, &sink), all = measure(m, nth, reps, &sink);
        printf("%-8s %-32s %14.1f %14.1f", m->name, m->for_what, one, all);
        if (macs > 0 && tg > 0) {
            double most = all * 1e9 * nth / macs;
            printf(" %14.1f %9.2fx", most, most / tg);
        }
        printf("\n");
    }
    printf("(N = %d threads at once; G/s = 1e9 multiply-adds a second of each thread's CPU time)\n", nth);
    return sink == 42424242;   /* never: keeps the sums alive */
}
#else
int main(void) {
    printf("simd_peak: x86-64 only (the NEON mixes are counted, not timed: scripts/neon-counts.sh)\n");
    return 0;
}
#endif
