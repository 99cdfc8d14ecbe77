/* buf.h - a growable byte buffer: the one checked appender for formatted
 * output whose size is not known in advance (SSE events, rendered text).
 *
 * Invariants, kept by every function here:
 *   - when p is not NULL, len < cap and p[len] == '\0' (the contents are
 *     always a C string as well as len bytes);
 *   - no function writes at or past p + cap;
 *   - after a failed allocation (or a size that would overflow size_t) the
 *     buffer is marked failed: its contents are left as they were and every
 *     later append is refused, so one check at the end is enough.
 * A zero-initialized ak_buf ({0}) is an empty buffer.
 */
#ifndef AK_BUF_H
#define AK_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct {
    char *p;        /* NULL until the first append */
    size_t len;     /* bytes held, without the terminating NUL */
    size_t cap;     /* bytes allocated at p */
    int failed;     /* an allocation failed; later appends are refused */
} ak_buf;

/* Makes room for `extra` more bytes plus the NUL. Returns 0, or -1 (and marks
 * the buffer failed) when out of memory or when the size overflows. */
int ak_buf_reserve(ak_buf *b, size_t extra);

/* Appends n bytes of s (s may contain NULs). Returns 0, or -1 when the buffer
 * is (or becomes) failed; nothing is appended then. */
int ak_buf_append(ak_buf *b, const void *s, size_t n);

/* Appends a NUL-terminated string (NULL appends nothing). Returns as ak_buf_append. */
int ak_buf_puts(ak_buf *b, const char *s);

/* Appends printf-style formatted text. Returns 0, or -1 (nothing appended)
 * when the buffer is failed, allocation fails or the format is invalid. */
int ak_buf_printf(ak_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ak_buf_vprintf(ak_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Drops the first n bytes (all of them when n >= len), keeping the allocation. */
void ak_buf_consume(ak_buf *b, size_t n);

/* Empties the buffer and clears `failed`, keeping the allocation. */
void ak_buf_clear(ak_buf *b);

/* Hands the contents to the caller (a malloc'd C string, or NULL when the
 * buffer is empty-and-unallocated or failed) and resets b to empty. */
char *ak_buf_take(ak_buf *b);

/* Frees the allocation; b is empty afterwards. NULL is fine. */
void ak_buf_free(ak_buf *b);

#endif
