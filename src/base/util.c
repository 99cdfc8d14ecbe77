/* util.c - see util.h */
#include "base/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

int ak_fail(ak_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = AK_ERR_GENERIC;
    }
    return -1;
}

int ak_failc(ak_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return -1;
}

int ak_err_code_of_errno(int e) {
    switch (e) {
    case ENOSPC:
    case EDQUOT: return AK_ERR_NOSPACE;
    case ENOMEM: return AK_ERR_NOMEM;
    case ENOENT: return AK_ERR_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS: return AK_ERR_PERMISSION;
    default: return AK_ERR_IO;
    }
}

const char *ak_err_code_name(int code) {
    static const char *names[] = {"none", "generic", "invalid", "nomem", "io", "nospace", "kv-budget",
                                  "corrupt", "not-found", "stale", "busy", "permission", "shutdown"};
    return code >= 0 && code < (int)(sizeof names / sizeof *names) ? names[code] : "?";
}

void *ak_malloc_(size_t n, ak_error *err, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) ak_failc(err, AK_ERR_NOMEM, "out of memory allocating %zu bytes (%s:%d)", n, file, line);
    return p;
}

void *ak_calloc_(size_t n, size_t sz, ak_error *err, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) ak_failc(err, AK_ERR_NOMEM, "out of memory allocating %zu x %zu bytes (%s:%d)", n, sz, file, line);
    return p;
}

char *ak_read_file(const char *path, size_t *len, ak_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        ak_failc(err, ak_err_code_of_errno(e), "%s: %s", path, strerror(e));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); ak_failc(err, AK_ERR_NOMEM, "%s: out of memory", path); return NULL; }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); ak_failc(err, AK_ERR_NOMEM, "%s: out of memory", path); return NULL; }
            buf = nb; cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) { free(buf); fclose(f); ak_failc(err, AK_ERR_IO, "%s: read error", path); return NULL; }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

double ak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

float ak_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: renormalize */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000 | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ak_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
    if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (absx < 0x38800000) { /* result is subnormal (or zero) in half */
        if (absx < 0x33000000) return (uint16_t)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
        int s = 126 - (int)e; /* value = m * 2^(e-150); half subnormal unit is 2^-24 */
        uint32_t half_m = m >> s, rem = m & ((1u << s) - 1), halfway = 1u << (s - 1);
        if (rem > halfway || (rem == halfway && (half_m & 1))) half_m++;
        return (uint16_t)(sign | half_m);
    }
    uint32_t h = ((absx >> 13) - (112u << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float ak_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ak_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

int ak_num_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void ak_json_write_string(FILE *out, const char *s, size_t len) {
    fputc('"', out);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (c < 0x20) fprintf(out, "\\u%04x", c);
            else fputc(c, out);
        }
    }
    fputc('"', out);
}

void ak_rng_seed(ak_rng *r, uint64_t seed) {
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!r->s) r->s = 1;
}

uint32_t ak_rng_u32(ak_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}

float ak_rng_uniform(ak_rng *r) { return (ak_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float ak_rng_normal(ak_rng *r) {
    float u1 = ak_rng_uniform(r), u2 = ak_rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

unsigned ak_flush_denormals(void) {
#if defined(__SSE2__)
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040); /* FTZ (bit 15) and DAZ (bit 6) */
    return old;
#elif defined(__aarch64__)
    uint64_t old;
    __asm__ volatile("mrs %0, fpcr" : "=r"(old));
    __asm__ volatile("msr fpcr, %0" : : "r"(old | (1ull << 24))); /* FZ */
    return (unsigned)old;
#else
    return 0;
#endif
}

void ak_restore_denormals(unsigned mode) {
#if defined(__SSE2__)
    _mm_setcsr(mode);
#elif defined(__aarch64__)
    uint64_t m = mode;
    __asm__ volatile("msr fpcr, %0" : : "r"(m));
#else
    (void)mode;
#endif
}

void ak_logf(ak_log_fn fn, void *ud, const char *fmt, ...) {
    if (!fn) return;
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(ud, line);
}
