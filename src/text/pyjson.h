/* pyjson.h - JSON read and printed the way Python's json module does, for
 * chat templates' `tojson` (what Hugging Face's renderer gives a template:
 * json.dumps with ensure_ascii=False, keys in the order given, no HTML
 * escaping, indent honoured).
 *
 * Reading follows json.loads: RFC 8259 JSON, one value with whitespace
 * around it, and the literals NaN, Infinity and -Infinity (doubles); strings
 * with control characters are refused, and so are lone surrogates (\ud800
 * not followed by a low one), which Python keeps but UTF-8 cannot hold. An object
 * with a key given twice keeps the key where it first appeared and the value
 * it had last (a dict). Integers keep their digits ("-0" is 0); a number
 * with a fraction or an exponent is a double.
 *
 * Printing follows json.dumps: separators ", " and ": " (with an indent:
 * "," at line ends and ": "), strings escaped as \" \\ \n \r \t \b \f and
 * \u00XX (lower-case hex) for other control characters, everything else as
 * is (UTF-8); a double as Python's repr (shortest text that reads back the
 * same; exponent form below 1e-4 and from 1e16: "1e-05", "1e+16"; a whole
 * number gets ".0"); "Infinity", "-Infinity" and "NaN".
 */
#ifndef AK_PYJSON_H
#define AK_PYJSON_H

#include <stddef.h>

#include "base/buf.h"
#include "base/util.h"

typedef enum {
    AK_PYJSON_NULL,
    AK_PYJSON_FALSE,
    AK_PYJSON_TRUE,
    AK_PYJSON_INT,     /* s: the digits as written */
    AK_PYJSON_FLOAT,   /* s: the number as written */
    AK_PYJSON_STRING,  /* s: the decoded UTF-8 */
    AK_PYJSON_ARRAY,
    AK_PYJSON_OBJECT
} ak_pyjson_kind;

/* One value. Children (array elements, object members) are linked from
 * first through next; an object member has its key in key/klen. */
typedef struct {
    ak_pyjson_kind kind;
    const char *s;      /* INT, FLOAT, STRING: len bytes (not NUL-terminated) */
    size_t len;
    const char *key;    /* an object member's key (decoded), else NULL */
    size_t klen;
    int first, next;    /* node indexes; -1 for none */
    int n;              /* ARRAY, OBJECT: how many children */
} ak_pyjson_node;

/* A parsed document: node 0 is the root. */
typedef struct {
    ak_pyjson_node *v;
    int n, cap;
    char *arena;        /* the decoded strings */
} ak_pyjson;

/* Parses text[0..len) into *doc. Returns 0, or -1 with doc zeroed: err set
 * to AK_ERR_INVALID when the text is not JSON as json.loads reads it (also
 * when nested deeper than 512), AK_ERR_NOMEM when memory runs out. */
int ak_pyjson_parse(const char *text, size_t len, ak_pyjson *doc, ak_error *err);

/* Frees what doc holds and zeroes it; a zeroed doc is fine. */
void ak_pyjson_free(ak_pyjson *doc);

/* The member of object node obj whose key is the NUL-terminated key, or -1
 * (also when obj is not an object). */
int ak_pyjson_get(const ak_pyjson *doc, int obj, const char *key);

/* Appends node i as json.dumps(value, ensure_ascii=False, indent=indent)
 * prints it (indent < 0: None, the one-line form). Returns 0, or -1 when the
 * buffer fails (out of memory). */
int ak_pyjson_dump(ak_buf *b, const ak_pyjson *doc, int i, int indent);

/* Appends s[0..n) as json.dumps prints a str (quoted and escaped as above).
 * Returns as ak_pyjson_dump. */
int ak_pyjson_dump_string(ak_buf *b, const char *s, size_t n);

/* Appends the JSON text[0..len) as json.dumps(json.loads(text)) prints it
 * (indent as for ak_pyjson_dump). Returns 0; 1 with nothing appended when
 * the text is not JSON (err untouched); -1 with err set when memory runs out. */
int ak_pyjson_reprint(ak_buf *b, const char *text, size_t len, int indent, ak_error *err);

#endif
