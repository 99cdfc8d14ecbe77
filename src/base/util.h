/* LAYER base/ (src/base/), the lowest: errors and checked allocation,
 * buffers, worker threads, CPU features, vector math, the GGUF container.
 * Promises: no function exits; each failure is an ak_err code with a
 * one-line message in the caller's ak_error; a GGUF file is read with every
 * offset and size checked before it is used. Knows nothing of models, KV
 * caches, agents or HTTP.
 * May use: nothing but the C library and POSIX (no other layer); every
 * layer above may use it. The table: scripts/check-layers.sh.
 *
 * util.h - errors, checked allocation, small helpers shared by every module.
 *
 * Library functions never exit: they return an error code and describe the
 * problem in an ak_error supplied by the caller. Only main() decides to exit.
 */
#ifndef AK_UTIL_H
#define AK_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What kind of failure an ak_error describes. Callers branch on the code,
 * never on the message (which is for people and may change). */
typedef enum {
    AK_ERR_NONE = 0,      /* no error */
    AK_ERR_GENERIC,       /* unclassified (ak_fail) */
    AK_ERR_INVALID,       /* an argument or request that can never work */
    AK_ERR_NOMEM,         /* out of memory */
    AK_ERR_IO,            /* an I/O error (read, write, fsync, rename ...) */
    AK_ERR_NOSPACE,       /* the disk or quota is full (ENOSPC, EDQUOT) */
    AK_ERR_KV_BUDGET,     /* the KV pool's RAM budget cannot fit the request now */
    AK_ERR_CORRUPT,       /* data failed a check (checksum, authentication, format) */
    AK_ERR_NOT_FOUND,     /* no such file, agent or item */
    AK_ERR_STALE,         /* sound data this caller cannot use (another model, format, key) */
    AK_ERR_BUSY,          /* the target is in use (a turn or restore in flight) */
    AK_ERR_PERMISSION,    /* refused for its permissions (e.g. a key file others can read) */
    AK_ERR_SHUTDOWN,      /* the component is stopping */
    AK_ERR_EXISTS         /* the item exists already (write-once things: pools) */
} ak_err_code;

typedef struct {
    char msg[512];   /* one line, no trailing newline; "" when no error */
    int code;        /* an ak_err_code; AK_ERR_NONE when no error. After msg so
                        that `ak_error e = {{0}}` stays a valid initializer */
} ak_error;

/* Formats a message into err (if err is not NULL) and sets its code to
 * AK_ERR_GENERIC. Always returns -1 so that callers can write
 * `return ak_fail(err, "...")`. */
int ak_fail(ak_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* ak_fail with a code (an ak_err_code). Always returns -1. */
int ak_failc(ak_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The code for a failed system call's errno: NOSPACE for ENOSPC/EDQUOT,
 * NOMEM for ENOMEM, NOT_FOUND for ENOENT, PERMISSION for EACCES/EPERM/EROFS,
 * else IO. */
int ak_err_code_of_errno(int e);
/* A short name of a code ("none", "generic", "invalid", "nomem", "io",
 * "nospace", "kv-budget", "corrupt", "not-found", "stale", "busy", "permission",
 * "shutdown"; "?" otherwise). */
const char *ak_err_code_name(int code);

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
