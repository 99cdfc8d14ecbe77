/* util.h - errors, checked allocation, small helpers shared by every module.
 *
 * Library functions never exit: they return an error code and describe the
 * problem in an ak_error supplied by the caller. Only main() decides to exit.
 */
#ifndef AK_UTIL_H
#define AK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char msg[512];   /* one line, no trailing newline; "" when no error */
} ak_error;

/* Formats a message into err (if err is not NULL). Always returns -1 so that
 * callers can write `return ak_fail(err, "...")`. */
int ak_fail(ak_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checked allocation: on failure sets err (naming file:line) and returns NULL. */
void *ak_malloc_(size_t n, ak_error *err, const char *file, int line);
void *ak_calloc_(size_t n, size_t sz, ak_error *err, const char *file, int line);
#define ak_malloc(n, err) ak_malloc_((n), (err), __FILE__, __LINE__)
#define ak_calloc(n, sz, err) ak_calloc_((n), (sz), (err), __FILE__, __LINE__)

/* Reads a whole file into a NUL-terminated malloc'd buffer. Returns NULL and
 * sets err on failure; *len gets the byte count (without the NUL). */
char *ak_read_file(const char *path, size_t *len, ak_error *err);

/* Monotonic clock in seconds. */
double ak_now(void);

/* IEEE half and bfloat16 conversions (scalar, exact round-to-nearest-even). */
float ak_f16_to_f32(uint16_t h);
uint16_t ak_f32_to_f16(float f);
float ak_bf16_to_f32(uint16_t h);
uint16_t ak_f32_to_bf16(float f);

/* Makes the calling thread flush denormal floats to zero (inputs and
 * results) and returns the previous mode for ak_restore_denormals. Tiny
 * activations (SiLU of large negative inputs) would otherwise fall into
 * microcode assists that make a matrix product several times slower; values
 * below 1e-38 carry nothing the model needs. No-op where unsupported. */
unsigned ak_flush_denormals(void);
void ak_restore_denormals(unsigned mode);

/* Where modules send one-line log messages (servers, agents); ud is the
 * caller's. ak_logf formats into a line and calls fn (nothing if fn is NULL). */
typedef void (*ak_log_fn)(void *ud, const char *line);
void ak_logf(ak_log_fn fn, void *ud, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Number of online CPUs (>= 1). */
int ak_num_cpus(void);

/* Writes s to out as a JSON string literal (with quotes), escaping as needed. */
void ak_json_write_string(FILE *out, const char *s, size_t len);

/* Simple deterministic RNG (xorshift64*), for synth weights and sampling. */
typedef struct { uint64_t s; } ak_rng;
void ak_rng_seed(ak_rng *r, uint64_t seed);
uint32_t ak_rng_u32(ak_rng *r);
float ak_rng_uniform(ak_rng *r);   /* [0, 1) */
float ak_rng_normal(ak_rng *r);    /* N(0, 1) */

#endif
