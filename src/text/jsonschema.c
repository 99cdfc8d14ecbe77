/* jsonschema.c - JSON Schema to grammar rules. Contract: jsonschema.h.
 *
 * Each schema node becomes a rule (memoized by node, so a recursive $ref
 * calls the rule being built). A node is first normalized: its $ref and
 * allOf operands are merged into one node of plain keywords (cJSON
 * references, freed with the compiler); anyOf / oneOf groups are then
 * distributed: each alternative merged with the node's other keywords is a
 * rule of its own, called from the node's start. Scalars are byte automata
 * (regex.h for patterns and number bounds); objects and arrays are states
 * of the node's rule that call their members' rules. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jsonschema.h"
#include "text/imap.h"
#include "text/numregex.h"
#include "text/regex.h"

/* type bits */
enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_NUM = 64, T_ALL = 127 };

#define MAX_PATTERN_STATES 4096
#define MAX_COMBOS 256

typedef struct { const void *key; cJSON *norm; int rule; } memo_ent;

typedef struct {
    ak_gbuild *b;
    const cJSON *root;
    ak_js_opts o;
    ak_gram_error *e;
    int failed;
    memo_ent *memo;
    size_t mcap, mn;
    cJSON **owned;
    int nown, owncap;
    const void *nstack[AK_JS_MAX_DEPTH];
    int nsp, depth;
    char path[192];
    int any_rule, false_rule;
    cJSON *empty;   /* {} (the true schema as an object) */
} jsc;

/* ---- errors, paths, bookkeeping ---------------------------------------------- */

static int jfail(jsc *c, int code, const char *kw, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Records the first failure (code, keyword, the current path); returns -1. */
static int jfail(jsc *c, int code, const char *kw, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ak_gram_fail(c->e, code, kw, c->path, "%s%s%s (at '%s')", kw && *kw ? kw : "", kw && *kw ? ": " : "", msg,
                 c->path[0] ? c->path : "#");
    return -1;
}

/* Passes a failure of a lower layer (regex, automata) on with the path. */
static int jfail_from(jsc *c, const ak_gram_error *sub, const char *kw) {
    return jfail(c, sub->code, kw, "%s", sub->msg);
}

/* Appends "/seg" to the path (JSON pointer escaping); returns the old length. */
static size_t path_push(jsc *c, const char *seg) {
    size_t l = strlen(c->path), o = l;
    if (l + 1 < sizeof c->path) c->path[l++] = '/';
    for (const char *s = seg; *s && l + 2 < sizeof c->path; s++) {
        if (*s == '~' || *s == '/') {
            c->path[l++] = '~';
            c->path[l++] = *s == '~' ? '0' : '1';
        } else c->path[l++] = *s;
    }
    c->path[l] = 0;
    return o;
}
static void path_pop(jsc *c, size_t l) { c->path[l] = 0; }

/* Takes ownership of a node the compiler made (freed at the end). */
static cJSON *own(jsc *c, cJSON *n) {
    if (!n) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); return NULL; }
    if (c->nown == c->owncap) {
        int nc = c->owncap ? c->owncap * 2 : 64;
        cJSON **o = realloc(c->owned, (size_t)nc * sizeof *o);
        if (!o) { cJSON_Delete(n); jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); return NULL; }
        c->owned = o;
        c->owncap = nc;
    }
    c->owned[c->nown++] = n;
    return n;
}

/* A node's identity: a cJSON reference shares its target's children. */
static const void *nid(const cJSON *n) {
    return (cJSON_IsObject(n) || cJSON_IsArray(n)) && n->child ? (const void *)n->child : (const void *)n;
}

static size_t ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(x ^ (x >> 31));
}

/* The memo entry of key (added empty when absent); -1 on memory. */
static long memo_at(jsc *c, const void *key) {
    if ((c->mn + 1) * 2 > c->mcap) {
        size_t nc = c->mcap ? c->mcap * 2 : 128;
        memo_ent *m = calloc(nc, sizeof *m);
        if (!m) return -1;
        for (size_t i = 0; i < c->mcap; i++)
            if (c->memo[i].key) {
                size_t j = ptr_hash(c->memo[i].key) & (nc - 1);
                while (m[j].key) j = (j + 1) & (nc - 1);
                m[j] = c->memo[i];
            }
        free(c->memo);
        c->memo = m;
        c->mcap = nc;
    }
    size_t j = ptr_hash(key) & (c->mcap - 1);
    for (; c->memo[j].key; j = (j + 1) & (c->mcap - 1))
        if (c->memo[j].key == key) return (long)j;
    c->memo[j] = (memo_ent){.key = key, .norm = NULL, .rule = -1};
    c->mn++;
    return (long)j;
}

/* ---- keywords ------------------------------------------------------------------ */

static const char *const annotations[] = {
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "$defs", "definitions", "title",
    "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "format", "contentEncoding",
    "contentMediaType", "contentSchema", NULL};
static const char *const supported[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", NULL};
static const char *const unsupported[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "minProperties", "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "contains", "minContains", "maxContains",
    "uniqueItems", "multipleOf", "unevaluatedItems", "unevaluatedProperties", "$dynamicRef", "$recursiveRef",
    "$recursiveAnchor", NULL};

static int in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

/* Whether v is the true schema ({} or true). */
static int is_true_schema(const cJSON *v) { return cJSON_IsTrue(v) || (cJSON_IsObject(v) && !v->child); }

/* Whether unsupported keyword k with value v changes nothing in node n. */
static int neutral(const cJSON *n, const char *k, const cJSON *v) {
    if (!strcmp(k, "uniqueItems")) return cJSON_IsFalse(v);
    if (!strcmp(k, "minProperties")) return cJSON_IsNumber(v) && v->valuedouble <= 0;
    if (!strcmp(k, "minContains") || !strcmp(k, "maxContains")) return !cJSON_GetObjectItemCaseSensitive(n, "contains");
    if (!strcmp(k, "then") || !strcmp(k, "else")) return !cJSON_GetObjectItemCaseSensitive(n, "if");
    if (!strcmp(k, "if")) return !cJSON_GetObjectItemCaseSensitive(n, "then") && !cJSON_GetObjectItemCaseSensitive(n, "else");
    if (!strcmp(k, "patternProperties") || !strcmp(k, "dependentRequired") || !strcmp(k, "dependentSchemas") ||
        !strcmp(k, "dependencies"))
        return cJSON_IsObject(v) && !v->child;
    if (!strcmp(k, "propertyNames") || !strcmp(k, "unevaluatedItems") || !strcmp(k, "unevaluatedProperties"))
        return is_true_schema(v);
    if (!strcmp(k, "not")) return cJSON_IsFalse(v);
    if (!strcmp(k, "$recursiveAnchor")) return 1;
    return 0;
}

/* Fails with the first keyword of n that changes validity and is not
 * supported. */
static int check_keywords(jsc *c, const cJSON *n) {
    for (const cJSON *k = n->child; k; k = k->next) {
        if (!k->string || in_list(supported, k->string) || in_list(annotations, k->string)) continue;
        if (in_list(unsupported, k->string) && !neutral(n, k->string, k))
            return jfail(c, AK_GRAM_E_UNSUPPORTED, k->string, "keyword not supported");
    }
    return 0;
}

/* ---- $ref and normalization ----------------------------------------------------- */

/* The node under n (depth first) whose keyword kw is the string v[0..len),
 * or NULL; an anchor ($anchor) is looked for only in n's own resource (not
 * below a node with an $id of its own). Bounded by the document's size. */
static const cJSON *find_tagged(const cJSON *n, const char *kw, const char *v, size_t len, int depth) {
    if (depth > AK_JS_MAX_DEPTH * 4 || !(cJSON_IsObject(n) || cJSON_IsArray(n))) return NULL;
    if (depth > 0 && !strcmp(kw, "$anchor") && cJSON_IsObject(n) && cJSON_GetObjectItemCaseSensitive(n, "$id")) return NULL;
    const cJSON *t = cJSON_IsObject(n) ? cJSON_GetObjectItemCaseSensitive(n, kw) : NULL;
    if (cJSON_IsString(t) && strlen(t->valuestring) == len && !memcmp(t->valuestring, v, len)) return n;
    for (const cJSON *k = n->child; k; k = k->next) {
        const cJSON *f = find_tagged(k, kw, v, len, depth + 1);
        if (f) return f;
    }
    return NULL;
}

/* Resolves a $ref: a JSON pointer ("#", "#/..."), an anchor ("#name") or a
 * URI that some node's $id spells exactly (then a pointer or anchor inside
 * it). No other URI resolution (relative $id bases, remote documents):
 * those fail with AK_GRAM_E_UNSUPPORTED. NULL with the error set. */
static const cJSON *resolve_ref(jsc *c, const char *ref) {
    const cJSON *n = c->root;
    const char *hash = strchr(ref, '#');
    size_t ulen = hash ? (size_t)(hash - ref) : strlen(ref);
    if (ulen) {
        n = find_tagged(c->root, "$id", ref, ulen, 0);
        if (!n) {
            jfail(c, AK_GRAM_E_UNSUPPORTED, "$ref", "'%.80s' is not a pointer into this document", ref);
            return NULL;
        }
        if (!hash) return n;
    }
    const char *p = hash + 1;
    if (*p && *p != '/') {
        const cJSON *a = find_tagged(n, "$anchor", p, strlen(p), 0);
        if (!a) jfail(c, AK_GRAM_E_REF, "$ref", "anchor '%.80s' not found", ref);
        return a;
    }
    char seg[256];
    while (*p == '/' && n) {
        p++;
        size_t l = 0;
        while (*p && *p != '/' && l + 1 < sizeof seg) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) { seg[l++] = p[1] == '0' ? '~' : '/'; p += 2; continue; }
            if (*p == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                char *end;
                long v = strtol(h, &end, 16);
                if (!*end) { seg[l++] = (char)v; p += 3; continue; }
            }
            seg[l++] = *p++;
        }
        seg[l] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(seg, &end, 10);
            n = *seg && !*end ? cJSON_GetArrayItem(n, (int)i) : NULL;
        } else if (cJSON_IsObject(n)) n = cJSON_GetObjectItemCaseSensitive(n, seg);
        else n = NULL;
    }
    if (!n) jfail(c, AK_GRAM_E_REF, "$ref", "'%.80s' does not resolve", ref);
    return n;
}

static cJSON *merge(jsc *c, cJSON *a, cJSON *b);

/* A new {"allOf": [a, b]} (references), owned; NULL on failure. */
static cJSON *all_of2(jsc *c, cJSON *a, cJSON *b) {
    cJSON *w = own(c, cJSON_CreateObject());
    cJSON *arr = w ? cJSON_CreateArray() : NULL;
    if (!arr || !cJSON_AddItemToObject(w, "allOf", arr) || !cJSON_AddItemReferenceToArray(arr, a) ||
        !cJSON_AddItemReferenceToArray(arr, b)) {
        jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
        return NULL;
    }
    return w;
}

/* n with $ref and allOf merged in (n itself when it has neither); NULL on
 * failure. Booleans come back as they are. */
static cJSON *normalize(jsc *c, cJSON *n) {
    if (cJSON_IsBool(n)) return n;
    if (!cJSON_IsObject(n)) {
        jfail(c, AK_GRAM_E_SCHEMA, "", "a schema must be an object or a boolean");
        return NULL;
    }
    long mi = memo_at(c, nid(n));
    if (mi < 0) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); return NULL; }
    if (c->memo[mi].norm) return c->memo[mi].norm;
    if (check_keywords(c, n) < 0) return NULL;
    cJSON *ref = cJSON_GetObjectItemCaseSensitive(n, "$ref"), *all = cJSON_GetObjectItemCaseSensitive(n, "allOf");
    if (ref && !cJSON_IsString(ref)) { jfail(c, AK_GRAM_E_SCHEMA, "$ref", "must be a string"); return NULL; }
    if (all && (!cJSON_IsArray(all) || !all->child)) { jfail(c, AK_GRAM_E_SCHEMA, "allOf", "must be a non-empty array"); return NULL; }
    if (!ref && !all) {
        c->memo[mi].norm = n;
        return n;
    }
    for (int i = 0; i < c->nsp; i++)
        if (c->nstack[i] == nid(n)) {
            jfail(c, AK_GRAM_E_UNSATISFIABLE, ref ? "$ref" : "allOf", "a cycle of $ref / allOf that reads no value");
            return NULL;
        }
    if (c->nsp >= AK_JS_MAX_DEPTH) { jfail(c, AK_GRAM_E_DEPTH, "$ref", "references nested too deep"); return NULL; }
    c->nstack[c->nsp++] = nid(n);
    /* the node's own keywords, then each operand merged in */
    cJSON *acc = own(c, cJSON_CreateObject());
    for (cJSON *k = n->child; acc && k; k = k->next)
        if (strcmp(k->string, "$ref") && strcmp(k->string, "allOf") &&
            !cJSON_AddItemReferenceToObject(acc, k->string, k)) {
            jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
            acc = NULL;
        }
    if (acc && ref) {
        const cJSON *t = resolve_ref(c, ref->valuestring);
        cJSON *tn = t ? normalize(c, (cJSON *)t) : NULL;
        acc = tn ? merge(c, acc, tn) : NULL;
    }
    for (cJSON *op = all ? all->child : NULL; acc && op; op = op->next) {
        cJSON *on = normalize(c, op);
        acc = on ? merge(c, acc, on) : NULL;
    }
    c->nsp--;
    long m2 = acc ? memo_at(c, nid(n)) : -1;
    if (m2 >= 0) c->memo[m2].norm = acc;
    return acc;
}

/* Adds a reference to v under key k of m; -1 on memory. */
static int add_ref(jsc *c, cJSON *m, const char *k, cJSON *v) {
    if (!cJSON_AddItemReferenceToObject(m, k, v)) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
    return 0;
}

/* The schema of property k in object schema n (its properties, else its
 * additionalProperties, else NULL for true). */
static cJSON *prop_schema(cJSON *n, const char *k) {
    cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(n, "properties"), k);
    return p ? p : cJSON_GetObjectItemCaseSensitive(n, "additionalProperties");
}

/* The conjunction of two optional schemas (NULL: true). */
static cJSON *and2(jsc *c, cJSON *a, cJSON *b) {
    if (!a) return b;
    if (!b) return a;
    return all_of2(c, a, b);
}

/* Both normalized nodes at once: the keywords of each, with properties and
 * additionalProperties, items and prefixItems combined pairwise (they
 * depend on each other), everything else listed twice (the compiler reads
 * repeated keywords as "all of them hold"). */
static cJSON *merge(jsc *c, cJSON *a, cJSON *b) {
    if (cJSON_IsFalse(a) || cJSON_IsTrue(b)) return a;
    if (cJSON_IsFalse(b) || cJSON_IsTrue(a)) return b;
    cJSON *m = own(c, cJSON_CreateObject());
    if (!m) return NULL;
    static const char *const paired[] = {"properties", "additionalProperties", "items", "prefixItems",
                                         "additionalItems", "$defs", "definitions", NULL};
    cJSON *src[2] = {a, b};
    for (int s = 0; s < 2; s++)
        for (cJSON *k = src[s]->child; k; k = k->next)
            if (!in_list(paired, k->string) && !in_list(annotations, k->string) && add_ref(c, m, k->string, k) < 0)
                return NULL;
    /* properties */
    cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties"), *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    if (pa || pb) {
        cJSON *props = cJSON_CreateObject();
        if (!props || !cJSON_AddItemToObject(m, "properties", props)) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"), NULL;
        for (int s = 0; s < 2; s++)
            for (cJSON *k = (s ? pb : pa) ? (s ? pb : pa)->child : NULL; k; k = k->next) {
                if (cJSON_GetObjectItemCaseSensitive(props, k->string)) continue;
                cJSON *x = and2(c, prop_schema(a, k->string), prop_schema(b, k->string));
                if (c->failed || !x) return NULL;
                if (add_ref(c, props, k->string, x) < 0) return NULL;
            }
    }
    cJSON *xa = cJSON_GetObjectItemCaseSensitive(a, "additionalProperties"),
          *xb = cJSON_GetObjectItemCaseSensitive(b, "additionalProperties");
    if (xa || xb) {
        cJSON *x = and2(c, xa, xb);
        if (!x || add_ref(c, m, "additionalProperties", x) < 0) return NULL;
    }
    /* items: element-wise over the prefixes, then the rest */
    cJSON *ia = cJSON_GetObjectItemCaseSensitive(a, "items"), *ib = cJSON_GetObjectItemCaseSensitive(b, "items");
    cJSON *fa = cJSON_GetObjectItemCaseSensitive(a, "prefixItems"), *fb = cJSON_GetObjectItemCaseSensitive(b, "prefixItems");
    int na = fa ? cJSON_GetArraySize(fa) : 0, nb = fb ? cJSON_GetArraySize(fb) : 0;
    if (na || nb) {
        cJSON *pre = cJSON_CreateArray();
        if (!pre || !cJSON_AddItemToObject(m, "prefixItems", pre)) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"), NULL;
        for (int i = 0; i < (na > nb ? na : nb); i++) {
            cJSON *x = and2(c, i < na ? cJSON_GetArrayItem(fa, i) : ia, i < nb ? cJSON_GetArrayItem(fb, i) : ib);
            if (c->failed) return NULL;
            if (!x) x = c->empty;
            if (!cJSON_AddItemReferenceToArray(pre, x)) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"), NULL;
        }
    }
    if (ia || ib) {
        cJSON *x = and2(c, ia, ib);
        if (!x || add_ref(c, m, "items", x) < 0) return NULL;
    }
    return m;
}

/* ---- reading keywords ----------------------------------------------------------- */

/* The type bits of n: all its "type" keywords intersected (T_ALL when none). */
static int type_mask(jsc *c, const cJSON *n) {
    int m = T_ALL;
    for (const cJSON *k = n->child; k; k = k->next) {
        if (strcmp(k->string, "type")) continue;
        int t = 0;
        const cJSON *one = cJSON_IsArray(k) ? k->child : k;
        for (; one; one = cJSON_IsArray(k) ? one->next : NULL) {
            const char *s = cJSON_IsString(one) ? one->valuestring : "";
            int bit = !strcmp(s, "null") ? T_NULL : !strcmp(s, "boolean") ? T_BOOL : !strcmp(s, "object") ? T_OBJ
                    : !strcmp(s, "array") ? T_ARR : !strcmp(s, "string") ? T_STR : !strcmp(s, "integer") ? T_INT
                    : !strcmp(s, "number") ? T_NUM | T_INT : 0;
            if (!bit) { jfail(c, AK_GRAM_E_SCHEMA, "type", "unknown type"); return 0; }
            t |= bit;
        }
        m &= t;
    }
    return m;
}

/* The type bit of a JSON value (integral numbers are integers too). */
static int value_bits(const cJSON *v) {
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsString(v)) return T_STR;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsObject(v)) return T_OBJ;
    return v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e300 ? T_INT | T_NUM : T_NUM;
}

/* Number keyword k of n, tightest over repeats (max for minima, min for
 * maxima); returns 1 when present. Non-numbers fail (returns -1). */
static int num_kw(jsc *c, const cJSON *n, const char *k, int want_max, double *out) {
    int found = 0;
    for (const cJSON *x = n->child; x; x = x->next) {
        if (strcmp(x->string, k)) continue;
        if (!cJSON_IsNumber(x)) {
            if (cJSON_IsBool(x) && !strncmp(k, "exclusive", 9)) continue;   /* draft 4: read with the bound */
            return jfail(c, AK_GRAM_E_SCHEMA, k, "must be a number");
        }
        double v = x->valuedouble;
        if (!found || (want_max ? v > *out : v < *out)) *out = v;
        found = 1;
    }
    return found;
}

/* A count keyword (minLength ...): a non-negative integer; -1 on failure. */
static int count_kw(jsc *c, const cJSON *n, const char *k, int want_max, long *out) {
    double v;
    int f = num_kw(c, n, k, want_max, &v);
    if (f <= 0) return f;
    if (v < 0 || v != floor(v)) return jfail(c, AK_GRAM_E_SCHEMA, k, "must be a non-negative integer");
    *out = v > 1e9 ? 1000000000L : (long)v;
    return 1;
}

/* Canonical JSON text of scalar v: cJSON's compact print, numbers in the
 * shortest text that reads back as the same double (integers below 1e15
 * without a point); malloc'd or NULL. */
static char *canon(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return cJSON_PrintUnformatted(v);
    char t[64];
    double x = v->valuedouble;
    if (x == floor(x) && fabs(x) < 1e15) snprintf(t, sizeof t, "%.0f", x);
    else
        for (int p = 1; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, x);
            if (strtod(t, NULL) == x) break;
        }
    return strdup(t);
}

/* Code points of a UTF-8 string. */
static long utf8_count(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((uint8_t)*s & 0xC0) != 0x80;
    return n;
}

/* The bounds of a number schema: lo/hi and whether each is exclusive;
 * returns -1 on a malformed keyword. */
typedef struct { int has_lo, has_hi, lo_ex, hi_ex; double lo, hi; } bounds;
static int read_bounds(jsc *c, const cJSON *n, bounds *bd) {
    *bd = (bounds){0};
    double v;
    int f;
    if ((f = num_kw(c, n, "minimum", 1, &v)) < 0) return -1;
    if (f) { bd->has_lo = 1; bd->lo = v; }
    if ((f = num_kw(c, n, "maximum", 0, &v)) < 0) return -1;
    if (f) { bd->has_hi = 1; bd->hi = v; }
    if ((f = num_kw(c, n, "exclusiveMinimum", 1, &v)) < 0) return -1;
    if (f && (!bd->has_lo || v >= bd->lo)) { bd->has_lo = 1; bd->lo = v; bd->lo_ex = 1; }
    if ((f = num_kw(c, n, "exclusiveMaximum", 0, &v)) < 0) return -1;
    if (f && (!bd->has_hi || v <= bd->hi)) { bd->has_hi = 1; bd->hi = v; bd->hi_ex = 1; }
    for (const cJSON *x = n->child; x; x = x->next) {   /* draft 4 booleans */
        if (!strcmp(x->string, "exclusiveMinimum") && cJSON_IsTrue(x)) bd->lo_ex = 1;
        if (!strcmp(x->string, "exclusiveMaximum") && cJSON_IsTrue(x)) bd->hi_ex = 1;
    }
    return 0;
}

/* Whether literal value v meets n's scalar keywords (type, lengths,
 * patterns, bounds); objects and arrays are checked by type only. -1 on a
 * malformed keyword. */
static int lit_ok(jsc *c, const cJSON *n, int mask, const cJSON *v) {
    if (!(value_bits(v) & mask)) return 0;
    if (cJSON_IsString(v)) {
        long len = utf8_count(v->valuestring), mn = 0, mx = -1;
        if (count_kw(c, n, "minLength", 1, &mn) < 0 || count_kw(c, n, "maxLength", 0, &mx) < 0) return -1;
        if (len < mn || (mx >= 0 && len > mx)) return 0;
        for (const cJSON *x = n->child; x; x = x->next) {
            if (strcmp(x->string, "pattern")) continue;
            if (!cJSON_IsString(x)) return jfail(c, AK_GRAM_E_SCHEMA, "pattern", "must be a string");
            ak_bdfa d = {0};
            ak_gram_error sub = {0};
            if (ak_regex_compile(x->valuestring, strlen(x->valuestring), AK_RE_SEARCH, MAX_PATTERN_STATES, &d, &sub) < 0)
                return jfail_from(c, &sub, "pattern");
            int ok = ak_bdfa_match(&d, v->valuestring, strlen(v->valuestring));
            ak_bdfa_free(&d);
            if (!ok) return 0;
        }
    }
    if (cJSON_IsNumber(v)) {
        bounds bd;
        if (read_bounds(c, n, &bd) < 0) return -1;
        double x = v->valuedouble;
        if (bd.has_lo && (bd.lo_ex ? x <= bd.lo : x < bd.lo)) return 0;
        if (bd.has_hi && (bd.hi_ex ? x >= bd.hi : x > bd.hi)) return 0;
    }
    return 1;
}

/* ---- strings ------------------------------------------------------------------------ */

/* The content of a string: code points min..max (max -1: none), all of the
 * patterns (pat: their intersection, NULL for none), and which \u escapes
 * are allowed. A content state packs (pattern state + 1, UTF-8 state, count). */
enum { U_NONE, U_COUNTED, U_ANY };
typedef struct { const ak_bdfa *pat; long min, max, cap; int umode; ak_bdfa utf8; } strspec;

#define CS(p, u, k) (((int64_t)(p) << 36) | ((int64_t)(u) << 32) | (int64_t)(k))
#define CS_P(s) ((int)((s) >> 36))
#define CS_U(s) ((int)(((s) >> 32) & 15))
#define CS_K(s) ((long)((s) & 0xFFFFFFFF))

/* The content state after byte b, or -1. */
static int64_t cs_next(const strspec *sp, int64_t s, int b) {
    int p = CS_P(s), u = CS_U(s);
    long k = CS_K(s);
    if (sp->pat) {
        p = sp->pat->next[(size_t)p * 256 + b];
        if (p < 0) return -1;
    }
    u = sp->utf8.next[u * 256 + b];
    if (u < 0) return -1;
    if (b < 0x80 || b > 0xBF) {
        k++;
        if (k > sp->cap) {
            if (sp->max >= 0) return -1;
            k = sp->cap;
        }
    }
    return CS(p, u, k);
}

static int cs_accept(const strspec *sp, int64_t s) {
    return (!sp->pat || sp->pat->tag[CS_P(s)] >= 0) && CS_U(s) == 0 && CS_K(s) >= sp->min;
}

/* The decoded byte of short escape x, or -1. */
static int short_escape(int x) {
    switch (x) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return 8;
    case 'f': return 12;
    case 'n': return 10;
    case 'r': return 13;
    case 't': return 9;
    default: return -1;
    }
}

/* The grammar state of content state t (made and queued when new); -1 on
 * failure. */
typedef struct { imap seen; int64_t *queue; size_t qn, qcap; } cs_walk;
static int cs_state(jsc *c, int r, cs_walk *w, int64_t t) {
    int tq = imap_get(&w->seen, t);
    if (tq >= 0) return tq;
    if (ak_gbuild_n_states(c->b) >= c->o.max_states)
        return jfail(c, AK_GRAM_E_TOO_LARGE, "maxLength", "string automaton past %d states", c->o.max_states);
    tq = ak_gbuild_state(c->b, r);
    if (tq < 0 || imap_put(&w->seen, t, tq) < 0) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
    if (w->qn == w->qcap) {
        size_t nc = w->qcap ? w->qcap * 2 : 64;
        int64_t *nq = realloc(w->queue, nc * sizeof *nq);
        if (!nq) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
        w->queue = nq;
        w->qcap = nc;
    }
    w->queue[w->qn++] = t;
    return tq;
}

/* Byte edges src -> tgt[b] for every b with a target, as ranges. */
static void edges_from(jsc *c, int src, const int32_t *tgt) {
    for (int b = 0; b < 256;) {
        if (tgt[b] < 0) { b++; continue; }
        int e = b;
        while (e + 1 < 256 && tgt[e + 1] == tgt[b]) e++;
        ak_gbuild_bytes(c->b, src, b, e, tgt[b]);
        b = e + 1;
    }
}

/* A \uXXXX chain from a new state to `to` (no surrogates unless any). */
static int u_chain(jsc *c, int r, int to, int any) {
    int h1 = ak_gbuild_state(c->b, r), h2 = ak_gbuild_state(c->b, r), h3 = ak_gbuild_state(c->b, r),
        h4 = ak_gbuild_state(c->b, r), h2s = ak_gbuild_state(c->b, r);
    if (h1 < 0 || h2 < 0 || h3 < 0 || h4 < 0 || h2s < 0) return -1;
    static const char hex[][2] = {{'0', '9'}, {'a', 'f'}, {'A', 'F'}};
    if (any)
        for (int i = 0; i < 3; i++) ak_gbuild_bytes(c->b, h1, hex[i][0], hex[i][1], h2);
    else {   /* D800-DFFF left out */
        ak_gbuild_bytes(c->b, h1, '0', '9', h2);
        ak_gbuild_bytes(c->b, h1, 'a', 'c', h2);
        ak_gbuild_bytes(c->b, h1, 'e', 'f', h2);
        ak_gbuild_bytes(c->b, h1, 'A', 'C', h2);
        ak_gbuild_bytes(c->b, h1, 'E', 'F', h2);
        ak_gbuild_bytes(c->b, h1, 'd', 'd', h2s);
        ak_gbuild_bytes(c->b, h1, 'D', 'D', h2s);
        ak_gbuild_bytes(c->b, h2s, '0', '7', h3);
    }
    for (int i = 0; i < 3; i++) {
        ak_gbuild_bytes(c->b, h2, hex[i][0], hex[i][1], h3);
        ak_gbuild_bytes(c->b, h3, hex[i][0], hex[i][1], h4);
        ak_gbuild_bytes(c->b, h4, hex[i][0], hex[i][1], to);
    }
    return h1;
}

/* Adds a JSON string ('"' content '"') from state `from` of rule r; returns
 * its end state (not marked accepting), or -1. The content states are made
 * as they are reached. */
static int embed_string(jsc *c, int r, int from, const strspec *sp) {
    cs_walk w = {0};
    imap uchain = {0};
    int end = ak_gbuild_state(c->b, r), rc = -1;
    int body0 = end >= 0 ? cs_state(c, r, &w, CS(0, 0, 0)) : -1;
    if (body0 < 0) goto out;
    ak_gbuild_bytes(c->b, from, '"', '"', body0);
    for (size_t qi = 0; qi < w.qn && !c->failed; qi++) {
        int64_t s = w.queue[qi];
        int q = imap_get(&w.seen, s);
        int32_t tgt[256];
        /* raw bytes */
        for (int b = 0; b < 256; b++) {
            int64_t t = b >= 0x20 && b != '"' && b != '\\' ? cs_next(sp, s, b) : -1;
            tgt[b] = t >= 0 ? cs_state(c, r, &w, t) : -1;
        }
        edges_from(c, q, tgt);
        /* escapes: the short ones by their decoded byte, \u as one character
         * ('a' stands for it in the count) */
        int need = 0;
        for (int b = 0; b < 256; b++) {
            int d = short_escape(b);
            int64_t t = d >= 0 ? cs_next(sp, s, d) : -1;
            tgt[b] = t >= 0 ? cs_state(c, r, &w, t) : -1;
            need |= tgt[b] >= 0;
        }
        int64_t tu = sp->umode != U_NONE && CS_U(s) == 0 ? cs_next(sp, s, 'a') : -1;
        int uq = tu >= 0 ? cs_state(c, r, &w, tu) : -1;
        if (c->failed) goto out;
        if (need || uq >= 0) {
            int esc = ak_gbuild_state(c->b, r);
            if (esc < 0) goto nomem;
            ak_gbuild_bytes(c->b, q, '\\', '\\', esc);
            edges_from(c, esc, tgt);
            if (uq >= 0) {
                int h1 = imap_get(&uchain, uq);
                if (h1 < 0) {
                    h1 = u_chain(c, r, uq, sp->umode == U_ANY);
                    if (h1 < 0 || imap_put(&uchain, uq, h1) < 0) goto nomem;
                }
                ak_gbuild_bytes(c->b, esc, 'u', 'u', h1);
            }
        }
        if (cs_accept(sp, s)) ak_gbuild_bytes(c->b, q, '"', '"', end);
    }
    rc = end;
    goto out;
nomem:
    jfail(c, ak_gbuild_n_states(c->b) >= AK_GRAM_MAX_STATES ? AK_GRAM_E_TOO_LARGE : AK_GRAM_E_NOMEM, "",
          "out of memory or states building a string");
out:
    imap_free(&w.seen);
    imap_free(&uchain);
    free(w.queue);
    return c->failed ? -1 : rc;
}

/* Adds n's string automaton from `from`; returns the end state or -1. */
static int string_value(jsc *c, const cJSON *n, int r, int from) {
    strspec sp = {.min = 0, .max = -1, .umode = U_ANY};
    ak_bdfa pat = {0};
    int rc = -1;
    if (count_kw(c, n, "minLength", 1, &sp.min) < 0 || count_kw(c, n, "maxLength", 0, &sp.max) < 0) return -1;
    for (const cJSON *x = n->child; x; x = x->next) {
        if (strcmp(x->string, "pattern")) continue;
        if (!cJSON_IsString(x)) { jfail(c, AK_GRAM_E_SCHEMA, "pattern", "must be a string"); goto out; }
        ak_bdfa d = {0}, prod;
        ak_gram_error sub = {0};
        if (ak_regex_compile(x->valuestring, strlen(x->valuestring), AK_RE_SEARCH, MAX_PATTERN_STATES, &d, &sub) < 0) {
            jfail_from(c, &sub, "pattern");
            goto out;
        }
        if (!pat.n) pat = d;
        else {
            int pr = ak_bdfa_product(&pat, &d, AK_BDFA_AND, MAX_PATTERN_STATES, &prod, &sub);
            ak_bdfa_free(&d);
            ak_bdfa_free(&pat);
            if (pr < 0) { jfail_from(c, &sub, "pattern"); goto out; }
            pat = prod;
        }
        sp.pat = &pat;
        sp.umode = U_NONE;
    }
    if (sp.umode == U_ANY && (sp.min > 0 || sp.max >= 0)) sp.umode = U_COUNTED;
    sp.cap = sp.max >= 0 ? sp.max : sp.min;
    if (sp.cap > c->o.max_states) { jfail(c, AK_GRAM_E_TOO_LARGE, sp.max >= 0 ? "maxLength" : "minLength", "too large"); goto out; }
    {
        ak_gram_error sub = {0};
        if (ak_bdfa_utf8_len(0, -1, 64, &sp.utf8, &sub) < 0) { jfail_from(c, &sub, ""); goto out; }
    }
    rc = embed_string(c, r, from, &sp);
out:
    ak_bdfa_free(&pat);
    ak_bdfa_free(&sp.utf8);
    return rc;
}

/* ---- numbers ---------------------------------------------------------------------------- */

static int full_regex(jsc *c, const char *re, const char *kw, ak_bdfa *d) {
    ak_gram_error sub = {0};
    if (ak_regex_compile(re, strlen(re), AK_RE_FULL, MAX_PATTERN_STATES, d, &sub) < 0) return jfail_from(c, &sub, kw);
    return 0;
}

/* The number automaton of n (integers only when int_only). */
static int number_dfa(jsc *c, const cJSON *n, int int_only, ak_bdfa *out) {
    bounds bd;
    if (read_bounds(c, n, &bd) < 0) return -1;
    const char *plain = int_only ? "-?(?:0|[1-9][0-9]*)" : "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";
    if (!bd.has_lo && !bd.has_hi) return full_regex(c, plain, "type", out);
    ak_bdfa acc = {0};
    if (full_regex(c, int_only ? plain : "-?" AK_NN_ANY, "type", &acc) < 0) return -1;
    for (int side = 0; side < 2; side++) {
        if (side == 0 ? !bd.has_lo : !bd.has_hi) continue;
        ak_sbuf rb = {0};
        if (ak_numregex_side(&rb, side == 0 ? bd.lo : bd.hi, side == 0 ? bd.lo_ex : bd.hi_ex, side == 0) < 0 || rb.oom) {
            free(rb.s);
            ak_bdfa_free(&acc);
            return jfail(c, AK_GRAM_E_SCHEMA, side == 0 ? "minimum" : "maximum", "bound not finite");
        }
        ak_bdfa d = {0}, p;
        int rc = full_regex(c, rb.s, side == 0 ? "minimum" : "maximum", &d);
        free(rb.s);
        if (rc < 0) { ak_bdfa_free(&acc); return -1; }
        ak_gram_error sub = {0};
        rc = ak_bdfa_product(&acc, &d, AK_BDFA_AND, MAX_PATTERN_STATES * 4, &p, &sub);
        ak_bdfa_free(&d);
        ak_bdfa_free(&acc);
        if (rc < 0) return jfail_from(c, &sub, "minimum");
        acc = p;
    }
    *out = acc;
    return 0;
}

/* ---- rules ----------------------------------------------------------------------------------- */

static int compile(jsc *c, cJSON *n);
static int body(jsc *c, cJSON *n, int r);

/* A ':' or ',' (ch) from state from to state to of rule r: followed by one
 * space in AK_JS_WS_PY (as Python's json.dumps and Hugging Face's tojson
 * print them). */
static void punct(jsc *c, int r, int from, int ch, int to) {
    if (c->o.ws != AK_JS_WS_PY) {
        ak_gbuild_bytes(c->b, from, ch, ch, to);
        return;
    }
    int mid = ak_gbuild_state(c->b, r);
    if (mid < 0) return;   /* the builder fails at finish */
    ak_gbuild_bytes(c->b, from, ch, ch, mid);
    ak_gbuild_bytes(c->b, mid, ' ', ' ', to);
}

/* Whitespace loops on s (AK_JS_WS_ANY). */
static void ws(jsc *c, int s) {
    if (c->o.ws != AK_JS_WS_ANY) return;
    ak_gbuild_bytes(c->b, s, '\t', '\n', s);
    ak_gbuild_bytes(c->b, s, '\r', '\r', s);
    ak_gbuild_bytes(c->b, s, ' ', ' ', s);
}

/* The rule of the true schema (any value). */
static int any_rule(jsc *c) {
    if (c->any_rule < 0) {
        c->any_rule = ak_gbuild_rule(c->b);
        if (c->any_rule < 0 || body(c, c->empty, c->any_rule) < 0) return -1;
    }
    return c->any_rule;
}

/* The rule of the false schema (nothing: no edges, dropped at finish). */
static int false_rule(jsc *c) {
    if (c->false_rule < 0) c->false_rule = ak_gbuild_rule(c->b);
    return c->false_rule;
}

/* The rule of schema n (NULL: true). */
static int compile(jsc *c, cJSON *n) {
    if (c->failed) return -1;
    if (!n || is_true_schema(n)) return any_rule(c);
    if (cJSON_IsFalse(n)) return false_rule(c);
    long mi = memo_at(c, nid(n));
    if (mi < 0) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
    if (c->memo[mi].rule >= 0) return c->memo[mi].rule;
    if (c->depth >= AK_JS_MAX_DEPTH) return jfail(c, AK_GRAM_E_DEPTH, "", "schema nested deeper than %d", AK_JS_MAX_DEPTH);
    cJSON *nn = normalize(c, n);
    if (!nn) return -1;
    if (nn != n) {
        int r = compile(c, nn);
        long m2 = r >= 0 ? memo_at(c, nid(n)) : -1;
        if (m2 >= 0) c->memo[m2].rule = r;
        return r;
    }
    int r = ak_gbuild_rule(c->b);
    if (r < 0) return jfail(c, AK_GRAM_E_TOO_LARGE, "", "grammar too large");
    mi = memo_at(c, nid(n));   /* normalize may have grown the table */
    if (mi < 0) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
    c->memo[mi].rule = r;
    c->depth++;
    int rc = body(c, nn, r);
    c->depth--;
    return rc < 0 ? -1 : r;
}

/* The first enum/const values of n: its literal candidates (vals, count);
 * 0 when n has neither. -1 on failure. */
static int literals(jsc *c, const cJSON *n, const cJSON ***vals, int *count) {
    *vals = NULL;
    *count = 0;
    for (const cJSON *x = n->child; x; x = x->next) {
        if (!strcmp(x->string, "const")) {
            *vals = malloc(sizeof **vals);
            if (!*vals) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
            (*vals)[0] = x;
            *count = 1;
            return 1;
        }
        if (!strcmp(x->string, "enum")) {
            if (!cJSON_IsArray(x)) return jfail(c, AK_GRAM_E_SCHEMA, "enum", "must be an array");
            int k = cJSON_GetArraySize(x);
            if (k > AK_JS_MAX_ENUM) return jfail(c, AK_GRAM_E_TOO_LARGE, "enum", "more than %d values", AK_JS_MAX_ENUM);
            *vals = malloc(((size_t)k + 1) * sizeof **vals);
            if (!*vals) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
            for (const cJSON *v = x->child; v; v = v->next) (*vals)[(*count)++] = v;
            return 1;
        }
    }
    return 0;
}

/* Whether literal v is in every enum/const of n. */
static int in_all_enums(const cJSON *n, const cJSON *v) {
    for (const cJSON *x = n->child; x; x = x->next) {
        if (!strcmp(x->string, "const") && !cJSON_Compare(x, v, 1)) return 0;
        if (!strcmp(x->string, "enum")) {
            int found = 0;
            for (const cJSON *y = x->child; y && !found; y = y->next) found = cJSON_Compare(y, v, 1);
            if (!found) return 0;
        }
    }
    return 1;
}

/* The schema that only literal v meets, for objects and arrays (their
 * members in any order the options allow): const members, nothing else. */
static cJSON *literal_schema(jsc *c, const cJSON *v) {
    cJSON *s = own(c, cJSON_CreateObject());
    if (!s) return NULL;
    int ok = 1;
    if (cJSON_IsObject(v)) {
        cJSON *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
        ok = props && req && cJSON_AddItemToObject(s, "properties", props) && cJSON_AddItemToObject(s, "required", req) &&
             cJSON_AddStringToObject(s, "type", "object") && cJSON_AddFalseToObject(s, "additionalProperties");
        for (const cJSON *k = v->child; ok && k; k = k->next) {
            cJSON *one = cJSON_CreateObject();
            ok = one && cJSON_AddItemToObject(props, k->string, one) && cJSON_AddItemReferenceToObject(one, "const", (cJSON *)k) &&
                 cJSON_AddItemToArray(req, cJSON_CreateString(k->string));
        }
    } else {
        cJSON *pre = cJSON_CreateArray();
        int n = cJSON_GetArraySize(v);
        ok = pre && cJSON_AddItemToObject(s, "prefixItems", pre) && cJSON_AddStringToObject(s, "type", "array") &&
             cJSON_AddFalseToObject(s, "items") && cJSON_AddNumberToObject(s, "minItems", n);
        for (const cJSON *k = v->child; ok && k; k = k->next) {
            cJSON *one = cJSON_CreateObject();
            ok = one && cJSON_AddItemToArray(pre, one) && cJSON_AddItemReferenceToObject(one, "const", (cJSON *)k);
        }
    }
    if (!ok) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); return NULL; }
    return s;
}

/* Literal alternatives from the start of rule r: scalars as their text,
 * objects and arrays as a rule of their own (so member order may vary as
 * in any object). */
static int enum_rule(jsc *c, const cJSON *n, int mask, int r, const cJSON **vals, int count) {
    int s = ak_gbuild_start(c->b, r), done = -1;
    size_t total = 0;
    for (int i = 0; i < count; i++) {
        int ok = lit_ok(c, n, mask, vals[i]);
        if (ok < 0) return -1;
        if (!ok || !in_all_enums(n, vals[i])) continue;
        if (cJSON_IsObject(vals[i]) || cJSON_IsArray(vals[i])) {
            cJSON *ls = literal_schema(c, vals[i]);
            int lr = ls ? compile(c, ls) : -1;
            if (lr < 0) return -1;
            if (done < 0) {
                done = ak_gbuild_state(c->b, r);
                ak_gbuild_accept(c->b, done);
            }
            ak_gbuild_call(c->b, s, lr, done);
            continue;
        }
        char *t = canon(vals[i]);
        if (!t) return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
        total += strlen(t);
        if (total > 4u << 20) { free(t); return jfail(c, AK_GRAM_E_TOO_LARGE, "enum", "values too large"); }
        int e = ak_gbuild_literal(c->b, s, t, strlen(t));
        free(t);
        if (e < 0) return jfail(c, AK_GRAM_E_TOO_LARGE, "enum", "grammar too large");
        ak_gbuild_accept(c->b, e);
    }
    return c->failed ? -1 : 0;
}

/* The canonical-key automaton: '"', a string as cJSON writes it, '"'
 * (tag 0 after the closing quote). */
static int key_dfa(ak_bdfa *k) {
    ak_bdfa u = {0};
    ak_gram_error sub = {0};
    if (ak_bdfa_utf8_len(0, -1, 64, &u, &sub) < 0) return -1;
    /* states: 0 start, 1.. body utf8 states (u.n of them), then ESC, UA, UB, UC, UD0, UD1, END */
    int nb = u.n, esc = 1 + nb, ua = esc + 1, ub = ua + 1, uc = ub + 1, ud0 = uc + 1, ud1 = ud0 + 1, end = ud1 + 1;
    for (int i = 0; i <= end; i++)
        if (ak_bdfa_add(k, end + 1) < 0) { ak_bdfa_free(&u); return -1; }
    int32_t *nx = k->next;
    nx['"'] = 1;
    for (int s = 0; s < nb; s++)
        for (int b = 0; b < 256; b++) {
            if (s == 0 && (b < 0x20 || b == '"' || b == '\\')) continue;
            int t = u.next[s * 256 + b];
            if (t >= 0) nx[(1 + s) * 256 + b] = 1 + t;
        }
    nx[1 * 256 + '\\'] = esc;
    nx[1 * 256 + '"'] = end;
    for (const char *p = "\"\\bfnrt"; *p; p++) nx[esc * 256 + (uint8_t)*p] = 1;
    nx[esc * 256 + 'u'] = ua;
    nx[ua * 256 + '0'] = ub;
    nx[ub * 256 + '0'] = uc;
    nx[uc * 256 + '0'] = ud0;
    nx[uc * 256 + '1'] = ud1;
    for (const char *p = "01234567bef"; *p; p++) nx[ud0 * 256 + (uint8_t)*p] = 1;
    for (const char *p = "0123456789abcdef"; *p; p++) nx[ud1 * 256 + (uint8_t)*p] = 1;
    k->tag[end] = 0;
    ak_bdfa_free(&u);
    return 0;
}

/* One property of an object schema: its key as written, its rule. */
typedef struct { char *key; int rule, required; } prop;

/* The object automaton from state `open` (after '{') to a new end state;
 * returns the end state or -1. */
static int object_body(jsc *c, cJSON *n, int r, int open) {
    cJSON *props = NULL, *addl = NULL;
    for (cJSON *x = n->child; x; x = x->next) {
        if (!strcmp(x->string, "properties")) {
            if (!cJSON_IsObject(x)) return jfail(c, AK_GRAM_E_SCHEMA, "properties", "must be an object");
            props = x;
        }
        if (!strcmp(x->string, "additionalProperties")) addl = x;
    }
    int np = 0, cap = 0, rc = -1;
    prop *P = NULL;
    ak_bdfa kd = {0}, trie = {0}, lab = {0};
    int32_t *map = NULL, *kstate = NULL, *astate = NULL;
    int npos = 0, end = -1;
    /* named properties, then required names that only additionalProperties covers */
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *list = NULL;
        if (pass == 0) list = props ? props->child : NULL;
        for (const cJSON *x = n->child; pass == 1 && x; x = x->next)
            if (!strcmp(x->string, "required")) {
                if (!cJSON_IsArray(x)) { jfail(c, AK_GRAM_E_SCHEMA, "required", "must be an array"); goto out; }
                for (const cJSON *q = x->child; q; q = q->next) {
                    if (!cJSON_IsString(q)) { jfail(c, AK_GRAM_E_SCHEMA, "required", "must list strings"); goto out; }
                    int found = -1;
                    cJSON tmp = {.type = cJSON_String, .valuestring = q->valuestring};
                    char *key = canon(&tmp);
                    if (!key) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
                    for (int i = 0; i < np && found < 0; i++)
                        if (!strcmp(P[i].key, key)) found = i;
                    if (found >= 0) { P[found].required = 1; free(key); continue; }
                    if (np == cap) {
                        cap = cap ? cap * 2 : 8;
                        prop *nP = realloc(P, (size_t)cap * sizeof *P);
                        if (!nP) { free(key); jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
                        P = nP;
                    }
                    size_t pl = path_push(c, "additionalProperties");
                    P[np] = (prop){.key = key, .rule = cJSON_IsFalse(addl) ? false_rule(c) : compile(c, addl), .required = 1};
                    path_pop(c, pl);
                    np++;
                    if (c->failed) goto out;
                }
            }
        for (; list; list = list->next) {
            if (np == cap) {
                cap = cap ? cap * 2 : 8;
                prop *nP = realloc(P, (size_t)cap * sizeof *P);
                if (!nP) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
                P = nP;
            }
            cJSON tmp = {.type = cJSON_String, .valuestring = list->string};
            P[np].key = canon(&tmp);
            P[np].required = 0;
            P[np].rule = -1;
            np++;
            if (!P[np - 1].key) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
            size_t pl = path_push(c, "properties");
            path_push(c, list->string);
            P[np - 1].rule = compile(c, (cJSON *)list);
            path_pop(c, pl);
            if (c->failed) goto out;
        }
    }
    int addl_rule = -1;
    if (!cJSON_IsFalse(addl)) {
        size_t pl = path_push(c, "additionalProperties");
        addl_rule = compile(c, addl);
        path_pop(c, pl);
        if (addl_rule < 0) goto out;
    }
    if (c->o.any_order && np > AK_JS_ANY_ORDER_MAX) {
        jfail(c, AK_GRAM_E_TOO_LARGE, "properties", "more than %d properties in any order", AK_JS_ANY_ORDER_MAX);
        goto out;
    }
    /* the key automaton: canonical keys, labelled with the property index + 1 */
    if (key_dfa(&kd) < 0 || ak_bdfa_add(&trie, 1 << 20) < 0) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
    for (int i = 0; i < np; i++) {
        int q = 0;
        for (const char *s = P[i].key; *s && q >= 0; s++) {
            int32_t *slot = &trie.next[(size_t)q * 256 + (uint8_t)*s];
            if (*slot < 0) {
                int t = ak_bdfa_add(&trie, 1 << 20);
                if (t < 0) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
                slot = &trie.next[(size_t)q * 256 + (uint8_t)*s];
                *slot = t;
            }
            q = *slot;
        }
        trie.tag[q] = i + 1;
    }
    {
        ak_gram_error sub = {0};
        if (ak_bdfa_product(&kd, &trie, AK_BDFA_LABEL, c->o.max_states, &lab, &sub) < 0) { jfail_from(c, &sub, "properties"); goto out; }
    }
    map = malloc((size_t)lab.n * sizeof *map);
    npos = c->o.any_order ? 1 << np : np + 1;
    kstate = malloc((size_t)npos * sizeof *kstate);
    astate = malloc((size_t)npos * sizeof *astate);
    if (!map || !kstate || !astate) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
    for (int i = 0; i < npos; i++) kstate[i] = astate[i] = -1;
    end = ak_gbuild_state(c->b, r);
    if (end < 0) goto big;
    /* positions: ORDERED, the index of the next property that may come;
     * ANY, the set of properties seen. Worklist over reached positions. */
    int *work = malloc((size_t)npos * sizeof *work), nw = 0;
    if (!work) { jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); goto out; }
    kstate[0] = open;
    work[nw++] = 0;
    for (int wi = 0; wi < nw && !c->failed; wi++) {
        int p = work[wi];
        /* what position p allows */
        int close = 1, generic = addl_rule >= 0;
        for (int j = 0; j < np; j++)
            if (P[j].required && (c->o.any_order ? !(p >> j & 1) : j >= p)) close = 0;
        if (!c->o.any_order) generic = generic && close;
        int ks = kstate[p];
        ws(c, ks);
        if (ak_gbuild_dfa(c->b, r, ks, &lab, map) < 0) break;
        for (int i = 0; i < lab.n; i++) {
            int t = lab.tag[i];
            if (t < 0) continue;
            int j = t - 1, next, rule;
            if (t == 0) {
                if (!generic) continue;
                next = c->o.any_order ? p : np;
                rule = addl_rule;
            } else {
                int ok = c->o.any_order ? !(p >> j & 1) : j >= p;
                for (int q = p; ok && !c->o.any_order && q < j; q++) ok = !P[q].required;
                if (!ok) continue;
                next = c->o.any_order ? p | 1 << j : j + 1;
                rule = P[j].rule;
            }
            if (rule < 0) continue;
            int colon = ak_gbuild_state(c->b, r);
            if (colon < 0) break;
            ws(c, map[i]);
            punct(c, r, map[i], ':', colon);
            ws(c, colon);
            if (astate[next] < 0) {
                astate[next] = ak_gbuild_state(c->b, r);
                if (astate[next] < 0) break;
                ws(c, astate[next]);
                if (kstate[next] < 0) {
                    kstate[next] = ak_gbuild_state(c->b, r);
                    if (kstate[next] < 0) break;
                    work[nw++] = next;
                }
                punct(c, r, astate[next], ',', kstate[next]);
            }
            ak_gbuild_call(c->b, colon, rule, astate[next]);
        }
        if (close) {
            if (p == 0) ak_gbuild_bytes(c->b, open, '}', '}', end);
            if (astate[p] >= 0) ak_gbuild_bytes(c->b, astate[p], '}', '}', end);
        }
        if (ak_gbuild_n_states(c->b) >= c->o.max_states) break;
    }
    free(work);
    if (ak_gbuild_n_states(c->b) >= c->o.max_states) goto big;
    rc = c->failed ? -1 : end;
    goto out;
big:
    jfail(c, AK_GRAM_E_TOO_LARGE, "properties", "grammar past %d states", c->o.max_states);
out:
    for (int i = 0; i < np; i++) free(P[i].key);
    free(P);
    ak_bdfa_free(&kd);
    ak_bdfa_free(&trie);
    ak_bdfa_free(&lab);
    free(map);
    free(kstate);
    free(astate);
    return rc;
}

/* The array automaton from `open` (after '['); returns the end state or -1. */
static int array_body(jsc *c, cJSON *n, int r, int open) {
    cJSON *items = NULL, *prefix = NULL, *addi = NULL;
    for (cJSON *x = n->child; x; x = x->next) {
        if (!strcmp(x->string, "items")) items = x;
        if (!strcmp(x->string, "prefixItems")) prefix = x;
        if (!strcmp(x->string, "additionalItems")) addi = x;
    }
    if (cJSON_IsArray(items)) {   /* draft 7 tuples */
        prefix = items;
        items = addi;
    }
    if (prefix && !cJSON_IsArray(prefix)) return jfail(c, AK_GRAM_E_SCHEMA, "prefixItems", "must be an array");
    long mn = 0, mx = -1;
    if (count_kw(c, n, "minItems", 1, &mn) < 0 || count_kw(c, n, "maxItems", 0, &mx) < 0) return -1;
    int npre = prefix ? cJSON_GetArraySize(prefix) : 0;
    long cap = mx >= 0 ? mx : (mn > npre ? mn : npre);
    if (cap < 1) cap = 1;
    if (2 * cap + 4 > c->o.max_states) return jfail(c, AK_GRAM_E_TOO_LARGE, mx >= 0 ? "maxItems" : "minItems", "too large");
    int end = ak_gbuild_state(c->b, r);
    if (end < 0) return -1;
    ws(c, open);
    if (mn == 0) ak_gbuild_bytes(c->b, open, ']', ']', end);
    if (mx == 0) return end;
    int after_prev = -1, item_rule_rest = -2;
    for (long i = 0; i < cap || (i == cap && mx < 0); i++) {
        /* the rule of item i */
        int ir;
        if (i < npre) {
            char seg[32];
            snprintf(seg, sizeof seg, "%ld", i);
            size_t pl = path_push(c, "prefixItems");
            path_push(c, seg);
            ir = compile(c, cJSON_GetArrayItem(prefix, (int)i));
            path_pop(c, pl);
        } else {
            if (item_rule_rest == -2) {
                size_t pl = path_push(c, "items");
                item_rule_rest = cJSON_IsFalse(items) ? -1 : compile(c, items);
                path_pop(c, pl);
                if (c->failed) return -1;
            }
            ir = item_rule_rest;
        }
        if (c->failed) return -1;
        if (ir < 0) break;
        int from = open;
        if (i > 0) {
            from = ak_gbuild_state(c->b, r);
            if (from < 0) return -1;
            punct(c, r, after_prev, ',', from);
            ws(c, from);
        }
        if (i == cap) {   /* no maximum: item `cap` and more loop on the last state */
            ak_gbuild_call(c->b, from, ir, after_prev);
            break;
        }
        int after = ak_gbuild_state(c->b, r);
        if (after < 0) return -1;
        ws(c, after);
        ak_gbuild_call(c->b, from, ir, after);
        if (i + 1 >= mn) ak_gbuild_bytes(c->b, after, ']', ']', end);
        after_prev = after;
    }
    return c->failed ? -1 : end;
}

/* Whether literal sets of a and b (their first enum/const) share no value;
 * 0 when either has none. */
static int literals_disjoint(jsc *c, const cJSON *a, const cJSON *b) {
    const cJSON **va, **vb;
    int na, nb;
    if (literals(c, a, &va, &na) <= 0) return 0;
    if (literals(c, b, &vb, &nb) <= 0) { free(va); return 0; }
    int dis = 1;
    for (int i = 0; i < na && dis; i++)
        for (int j = 0; j < nb && dis; j++)
            if (cJSON_Compare(va[i], vb[j], 1)) dis = 0;
    free(va);
    free(vb);
    return dis;
}

/* The type bits a normalized schema allows, narrowed by its literals. */
static int effective_types(jsc *c, const cJSON *n) {
    if (cJSON_IsBool(n)) return cJSON_IsTrue(n) ? T_ALL : 0;
    int m = type_mask(c, n);
    const cJSON **v;
    int k;
    if (literals(c, n, &v, &k) > 0) {
        int lm = 0;
        for (int i = 0; i < k; i++) lm |= value_bits(v[i]);
        free(v);
        m &= lm;
    }
    return m;
}

/* Whether two (normalized) alternatives provably share no instance: by
 * type, by literals, by a discriminating required property, or by a
 * required property the other forbids. */
static int disjoint(jsc *c, cJSON *a, cJSON *b) {
    int ta = effective_types(c, a), tb = effective_types(c, b);
    if (!(ta & tb)) return 1;
    if (cJSON_IsBool(a) || cJSON_IsBool(b)) return 0;
    if (literals_disjoint(c, a, b)) return 1;
    if ((ta & tb) != T_OBJ) return 0;
    cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties"), *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "required"), *rb = cJSON_GetObjectItemCaseSensitive(b, "required");
    for (cJSON *q = ra ? ra->child : NULL; q; q = q->next) {
        if (!cJSON_IsString(q)) continue;
        int in_b = 0;
        for (cJSON *w = rb ? rb->child : NULL; w && !in_b; w = w->next) in_b = cJSON_IsString(w) && !strcmp(w->valuestring, q->valuestring);
        cJSON *sa = cJSON_GetObjectItemCaseSensitive(pa, q->valuestring), *sb = cJSON_GetObjectItemCaseSensitive(pb, q->valuestring);
        if (in_b && sa && sb) {
            cJSON *na = normalize(c, sa), *nb = normalize(c, sb);
            if (na && nb && literals_disjoint(c, na, nb)) return 1;
        }
        /* a requires q; b allows no property q */
        cJSON *xb = cJSON_GetObjectItemCaseSensitive(b, "additionalProperties");
        if (!sb && cJSON_IsFalse(xb)) return 1;
        if (sb && cJSON_IsFalse(sb)) return 1;
    }
    for (cJSON *q = rb ? rb->child : NULL; q; q = q->next) {
        if (!cJSON_IsString(q)) continue;
        cJSON *sa = cJSON_GetObjectItemCaseSensitive(pa, q->valuestring);
        cJSON *xa = cJSON_GetObjectItemCaseSensitive(a, "additionalProperties");
        if ((!sa && cJSON_IsFalse(xa)) || (sa && cJSON_IsFalse(sa))) return 1;
    }
    return 0;
}

/* Whether n has a keyword besides annotations, anyOf and oneOf. */
static int has_constraints(const cJSON *n) {
    for (const cJSON *k = n->child; k; k = k->next)
        if (strcmp(k->string, "anyOf") && strcmp(k->string, "oneOf") && !in_list(annotations, k->string)) return 1;
    return 0;
}

/* anyOf / oneOf groups of n: every combination of one alternative per group,
 * merged with n's other keywords, a rule called from r's start. */
static int union_body(jsc *c, cJSON *n, int r) {
    cJSON *groups[16];
    int ng = 0;
    for (cJSON *x = n->child; x; x = x->next)
        if (!strcmp(x->string, "anyOf") || !strcmp(x->string, "oneOf")) {
            if (!cJSON_IsArray(x) || !x->child) return jfail(c, AK_GRAM_E_SCHEMA, x->string, "must be a non-empty array");
            if (ng == 16) return jfail(c, AK_GRAM_E_TOO_LARGE, x->string, "too many groups");
            groups[ng++] = x;
        }
    cJSON *sib = own(c, cJSON_CreateObject());
    if (!sib) return -1;
    for (cJSON *k = n->child; k; k = k->next)
        if (strcmp(k->string, "anyOf") && strcmp(k->string, "oneOf") && add_ref(c, sib, k->string, k) < 0) return -1;
    int constrained = has_constraints(sib);
    /* oneOf: each group's alternatives, merged with the rest, pairwise disjoint */
    for (int g = 0; g < ng; g++) {
        if (strcmp(groups[g]->string, "oneOf")) continue;
        int k = cJSON_GetArraySize(groups[g]);
        if (k > 64) return jfail(c, AK_GRAM_E_TOO_LARGE, "oneOf", "more than 64 alternatives");
        cJSON *alt[64];
        for (int i = 0; i < k; i++) {
            char seg[16];
            snprintf(seg, sizeof seg, "%d", i);
            size_t pl = path_push(c, "oneOf");
            path_push(c, seg);
            cJSON *an = normalize(c, cJSON_GetArrayItem(groups[g], i));
            path_pop(c, pl);
            if (!an) return -1;
            alt[i] = constrained ? merge(c, sib, an) : an;
            if (!alt[i]) return -1;
        }
        for (int i = 0; i < k; i++)
            for (int j = i + 1; j < k; j++)
                if (!disjoint(c, alt[i], alt[j])) {
                    if (c->failed) return -1;
                    size_t pl = path_push(c, "oneOf");
                    jfail(c, AK_GRAM_E_UNSUPPORTED, "oneOf",
                          "alternatives %d and %d may both match (exclusivity is only kept when provable: disjoint "
                          "types, literals or a discriminating property)", i, j);
                    path_pop(c, pl);
                    return -1;
                }
    }
    long combos = 1;
    for (int g = 0; g < ng; g++) {
        combos *= cJSON_GetArraySize(groups[g]);
        if (combos > MAX_COMBOS) return jfail(c, AK_GRAM_E_TOO_LARGE, groups[g]->string, "too many combinations");
    }
    int start = ak_gbuild_start(c->b, r), done = ak_gbuild_state(c->b, r);
    if (done < 0) return -1;
    ak_gbuild_accept(c->b, done);
    for (long ci = 0; ci < combos; ci++) {
        cJSON *acc = constrained ? sib : NULL;
        long rest = ci;
        for (int g = 0; g < ng; g++) {
            int k = cJSON_GetArraySize(groups[g]);
            cJSON *a = cJSON_GetArrayItem(groups[g], (int)(rest % k));
            rest /= k;
            if (!acc) acc = a;
            else {
                cJSON *an = normalize(c, a), *ac = acc == sib ? sib : normalize(c, acc);
                acc = an && ac ? merge(c, ac, an) : NULL;
            }
            if (!acc) return -1;
        }
        char seg[24];
        snprintf(seg, sizeof seg, "%ld", ci);
        size_t pl = path_push(c, groups[0]->string);
        path_push(c, seg);
        int ar = compile(c, acc);
        path_pop(c, pl);
        if (ar < 0) return -1;
        ak_gbuild_call(c->b, start, ar, done);
    }
    return 0;
}

/* The rule of normalized node n (its rule r already made). */
static int body(jsc *c, cJSON *n, int r) {
    if (c->failed) return -1;
    for (cJSON *x = n->child; x; x = x->next)
        if (!strcmp(x->string, "anyOf") || !strcmp(x->string, "oneOf")) return union_body(c, n, r);
    int mask = type_mask(c, n);
    if (c->failed) return -1;
    int s = ak_gbuild_start(c->b, r);
    const cJSON **vals;
    int nv;
    int lit = literals(c, n, &vals, &nv);
    if (lit < 0) return -1;
    if (lit > 0) {
        int rc = enum_rule(c, n, mask, r, vals, nv);
        free(vals);
        return rc;
    }
    if (mask & T_NULL) ak_gbuild_accept(c->b, ak_gbuild_literal(c->b, s, "null", 4));
    if (mask & T_BOOL) {
        ak_gbuild_accept(c->b, ak_gbuild_literal(c->b, s, "true", 4));
        ak_gbuild_accept(c->b, ak_gbuild_literal(c->b, s, "false", 5));
    }
    if (mask & (T_INT | T_NUM)) {
        ak_bdfa d = {0};
        if (number_dfa(c, n, !(mask & T_NUM), &d) < 0) return -1;
        int32_t *map = malloc((size_t)d.n * sizeof *map);
        if (!map) { ak_bdfa_free(&d); return jfail(c, AK_GRAM_E_NOMEM, "", "out of memory"); }
        if (ak_gbuild_dfa(c->b, r, s, &d, map) == 0)
            for (int i = 0; i < d.n; i++)
                if (d.tag[i] >= 0) ak_gbuild_accept(c->b, map[i]);
        free(map);
        ak_bdfa_free(&d);
    }
    if (mask & T_STR) {
        int e = string_value(c, n, r, s);
        if (e < 0) return -1;
        ak_gbuild_accept(c->b, e);
    }
    if (mask & T_OBJ) {
        int o = ak_gbuild_state(c->b, r);
        if (o < 0) return jfail(c, AK_GRAM_E_TOO_LARGE, "", "grammar too large");
        ak_gbuild_bytes(c->b, s, '{', '{', o);
        int e = object_body(c, n, r, o);
        if (e < 0) return -1;
        ak_gbuild_accept(c->b, e);
    }
    if (mask & T_ARR) {
        int o = ak_gbuild_state(c->b, r);
        if (o < 0) return jfail(c, AK_GRAM_E_TOO_LARGE, "", "grammar too large");
        ak_gbuild_bytes(c->b, s, '[', '[', o);
        int e = array_body(c, n, r, o);
        if (e < 0) return -1;
        ak_gbuild_accept(c->b, e);
    }
    if (ak_gbuild_n_states(c->b) >= c->o.max_states)
        return jfail(c, AK_GRAM_E_TOO_LARGE, "", "grammar past %d states", c->o.max_states);
    return c->failed ? -1 : 0;
}

/* ---- entry points ---------------------------------------------------------------------------- */

static void jsc_init(jsc *c, ak_gbuild *b, const cJSON *root, const ak_js_opts *o, ak_gram_error *e) {
    memset(c, 0, sizeof *c);
    c->b = b;
    c->root = root;
    if (o) c->o = *o;
    if (c->o.max_states <= 0 || c->o.max_states > AK_GRAM_MAX_STATES) c->o.max_states = AK_GRAM_MAX_STATES;
    c->e = e;
    c->any_rule = c->false_rule = -1;
    c->empty = cJSON_CreateObject();
    if (!c->empty) jfail(c, AK_GRAM_E_NOMEM, "", "out of memory");
}

static void jsc_done(jsc *c) {
    for (int i = c->nown - 1; i >= 0; i--) cJSON_Delete(c->owned[i]);
    free(c->owned);
    free(c->memo);
    cJSON_Delete(c->empty);
}

/* Adds schema to b; returns its rule or -1. Contract: jsonschema.h. */
int ak_jsonschema_add(ak_gbuild *b, const cJSON *schema, const ak_js_opts *opts, ak_gram_error *e) {
    jsc c;
    jsc_init(&c, b, schema, opts, e);
    int r = c.failed ? -1 : compile(&c, (cJSON *)schema);
    if (!c.failed && r < 0) jfail(&c, AK_GRAM_E_INVALID, "", "compilation failed");
    jsc_done(&c);
    return c.failed ? -1 : r;
}

/* The deepest nesting of [ and { in JSON text (outside strings). */
static long json_depth(const char *t, size_t n) {
    long d = 0, mx = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = t[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = 0;
        } else if (ch == '"') in_str = 1;
        else if (ch == '{' || ch == '[') { if (++d > mx) mx = d; }
        else if (ch == '}' || ch == ']') d--;
    }
    return mx;
}

/* Parses, compiles and finishes. Contract: jsonschema.h. */
ak_grammar *ak_jsonschema_compile(const char *text, size_t len, const ak_js_opts *opts, ak_gram_error *e) {
    if (!text) { ak_gram_fail(e, AK_GRAM_E_INVALID, "", "", "no schema"); return NULL; }
    long depth = json_depth(text, len);
    if (depth > AK_JS_MAX_DEPTH * 4) {
        ak_gram_fail(e, AK_GRAM_E_DEPTH, "", "", "schema nested %ld deep (limit %d schema levels)", depth, AK_JS_MAX_DEPTH);
        return NULL;
    }
    cJSON *doc = cJSON_ParseWithLength(text, len);
    if (!doc) {
        ak_gram_fail(e, AK_GRAM_E_JSON, "", "", "the schema is not valid JSON");
        return NULL;
    }
    ak_gbuild *b = ak_gbuild_new();
    ak_grammar *g = NULL;
    if (!b) ak_gram_fail(e, AK_GRAM_E_NOMEM, "", "", "out of memory");
    else {
        int r = ak_jsonschema_add(b, doc, opts, e);
        if (r >= 0) g = ak_gbuild_finish(b, r, e);
    }
    ak_gbuild_free(b);
    cJSON_Delete(doc);
    return g;
}

/* Any JSON object. */
ak_grammar *ak_json_object_grammar(const ak_js_opts *opts, ak_gram_error *e) {
    return ak_jsonschema_compile("{\"type\":\"object\"}", 17, opts, e);
}
