/* bench_reuse_data.c - see bench_reuse_data.h */
#include "bench_reuse_data.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "agents/memories.h"

/* ---- growing the set -------------------------------------------------------- */

/* Room for one more context of at most `tokens` tokens in s (cap_ctx and
 * cap_tok: the capacities of off/lens/ids and toks). Returns 0, or -1 with
 * err set. */
static int reserve(brd_set *s, int *cap_ctx, size_t *cap_tok, size_t tokens, int with_ids, ak_error *err) {
    if (s->n_ctx + 1 >= *cap_ctx) {
        int nc = *cap_ctx ? 2 * *cap_ctx : 16;
        size_t *off = realloc(s->off, sizeof *off * (size_t)(nc + 1));
        if (off) s->off = off;
        int *lens = realloc(s->lens, sizeof *lens * (size_t)nc * s->k);
        if (lens) s->lens = lens;
        char **ids = with_ids ? realloc(s->ids, sizeof *ids * (size_t)nc * (s->k + 1)) : NULL;
        if (ids) s->ids = ids;
        if (!off || !lens || (with_ids && !ids)) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        *cap_ctx = nc;
    }
    size_t need = s->off[s->n_ctx] + tokens;
    if (need > *cap_tok) {
        size_t nt = *cap_tok ? 2 * *cap_tok : 4096;
        while (nt < need) nt *= 2;
        int32_t *t = realloc(s->toks, sizeof *t * nt);
        if (!t) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        s->toks = t;
        *cap_tok = nt;
    }
    return 0;
}

/* Starts s empty for shape sh. Returns 0, or -1 with err set. */
static int set_init(brd_set *s, const brd_shape *sh, ak_error *err) {
    memset(s, 0, sizeof *s);
    s->k = sh->k;
    s->n_pre = sh->n_pre;
    s->C = sh->C;
    if (!(s->off = calloc(1, sizeof *s->off))) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    return 0;
}

void brd_free(brd_set *s) {
    if (s->ids)
        for (size_t i = 0; i < (size_t)s->n_ctx * (s->k + 1); i++) free(s->ids[i]);
    free(s->ids);
    free(s->toks);
    free(s->off);
    free(s->lens);
    memset(s, 0, sizeof *s);
}

/* ---- running text ----------------------------------------------------------- */

/* ASCII whitespace: where passages may be cut (between words). */
static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The next passage of text[0..len) from *pos: skips whitespace to a word,
 * then takes words until ak_memory_tokenize of the span gives at least
 * `want` tokens, and copies the first `want` into out. *pos moves past the
 * span. Returns 1 (a passage), 0 (the text ran out first), -1 with err set. */
static int next_passage(const ak_tokenizer *tk, const char *text, size_t len, size_t *pos, int want, int32_t *out,
                        ak_error *err) {
    size_t a = *pos;
    while (a < len && is_space(text[a])) a++;
    size_t b = a;
    while (b < len) {
        /* one more word (and the whitespace before it) */
        while (b < len && is_space(text[b])) b++;
        while (b < len && !is_space(text[b])) b++;
        int32_t *ids = NULL;
        int n = 0;
        if (ak_memory_tokenize(tk, text + a, b - a, &ids, &n, err) < 0) return -1;
        if (n >= want) {
            memcpy(out, ids, sizeof(int32_t) * (size_t)want);
            free(ids);
            *pos = b;
            return 1;
        }
        free(ids);
    }
    *pos = len;
    return 0;
}

int brd_from_text(const ak_tokenizer *tk, const char *text, size_t len, const brd_shape *sh, int max_ctx,
                  brd_set *out, ak_error *err) {
    if (set_init(out, sh, err) < 0) return -1;
    const int n_pre = sh->n_pre, k = sh->k, T = sh->T, C = sh->C, per = n_pre + k * T + C;
    int cap_ctx = 0;
    size_t cap_tok = 0, pos = 0;
    while (out->n_ctx < max_ctx) {
        if (reserve(out, &cap_ctx, &cap_tok, (size_t)per, 0, err) < 0) return -1;
        int32_t *c = out->toks + out->off[out->n_ctx];
        if (n_pre) c[0] = sh->bos;
        int got = 1;
        for (int j = 0; j <= k && got == 1; j++)
            got = next_passage(tk, text, len, &pos, j < k ? T : C, c + n_pre + j * T, err);
        if (got < 0) return -1;
        if (got == 0) break;
        for (int j = 0; j < k; j++) out->lens[(size_t)out->n_ctx * k + j] = T;
        out->off[out->n_ctx + 1] = out->off[out->n_ctx] + (size_t)per;
        out->n_ctx++;
    }
    return out->n_ctx;
}

/* ---- notes ------------------------------------------------------------------ */

/* A note or a query of the file: its id, text and (queries) note ids. */
typedef struct {
    const char *id, *text;
    cJSON *notes;       /* a query's "notes" array */
    int line;
    int32_t *tok;       /* notes: the tokens, once tokenized */
    int n_tok;
} record;

/* The note with this id among notes[0..n), or NULL. */
static record *find_note(record *notes, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(notes[i].id, id)) return &notes[i];
    return NULL;
}

/* A notes file's records: its parsed lines (owning the strings) and the
 * notes and queries among them. */
typedef struct {
    cJSON **lines;
    int n_lines;
    record *notes, *queries;
    int n_notes, n_queries;
} records;

/* Frees r's lines, arrays and the notes' tokens. */
static void records_free(records *r) {
    for (int i = 0; i < r->n_notes; i++) free(r->notes[i].tok);
    for (int i = 0; i < r->n_lines; i++) cJSON_Delete(r->lines[i]);
    free(r->lines);
    free(r->notes);
    free(r->queries);
}

/* Parses jsonl[0..len) into *r (filled even on failure: records_free it):
 * every non-blank line a JSON object, notes and queries checked. Returns 0,
 * or -1 with err set. */
static int records_parse(const char *jsonl, size_t len, records *r, ak_error *err) {
    memset(r, 0, sizeof *r);
    size_t n_nl = 1;
    for (size_t i = 0; i < len; i++) n_nl += jsonl[i] == '\n';
    r->lines = calloc(n_nl, sizeof *r->lines);
    r->notes = calloc(n_nl, sizeof *r->notes);
    r->queries = calloc(n_nl, sizeof *r->queries);
    if (!r->lines || !r->notes || !r->queries) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    size_t a = 0;
    for (int line = 1; a < len; line++) {
        size_t b = a;
        while (b < len && jsonl[b] != '\n') b++;
        size_t e = b;
        while (e > a && (jsonl[e - 1] == '\r' || jsonl[e - 1] == ' ' || jsonl[e - 1] == '\t')) e--;
        const char *s = jsonl + a;
        a = b + 1;
        if (e == (size_t)(s - jsonl)) continue;   /* a blank line */
        cJSON *j = cJSON_ParseWithLength(s, e - (size_t)(s - jsonl));
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            return ak_failc(err, AK_ERR_INVALID, "notes line %d: not a JSON object", line);
        }
        r->lines[r->n_lines++] = j;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
        int is_note = cJSON_IsString(type) && !strcmp(type->valuestring, "note");
        int is_query = cJSON_IsString(type) && !strcmp(type->valuestring, "query");
        if (!is_note && !is_query) continue;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id"), *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!cJSON_IsString(id) || !cJSON_IsString(text))
            return ak_failc(err, AK_ERR_INVALID, "notes line %d: a %s needs a string \"id\" and \"text\"", line,
                            type->valuestring);
        record *rec = is_note ? &r->notes[r->n_notes] : &r->queries[r->n_queries];
        rec->id = id->valuestring;
        rec->text = text->valuestring;
        rec->line = line;
        if (is_note) {
            if (find_note(r->notes, r->n_notes, rec->id))
                return ak_failc(err, AK_ERR_INVALID, "notes line %d: note id '%s' given twice", line, rec->id);
            r->n_notes++;
        } else {
            rec->notes = cJSON_GetObjectItemCaseSensitive(j, "notes");
            if (!cJSON_IsArray(rec->notes))
                return ak_failc(err, AK_ERR_INVALID, "notes line %d: a query needs a \"notes\" array of ids", line);
            r->n_queries++;
        }
    }
    return 0;
}

/* Query q's first k notes into picked (k entries), tokenized (once per
 * note). Returns 1, 0 when the query names fewer than k, or -1 with err
 * set (an id that is not a string or not a note). */
static int query_notes(const ak_tokenizer *tk, records *r, const record *q, int k, record **picked, ak_error *err) {
    if (cJSON_GetArraySize(q->notes) < k) return 0;
    for (int j = 0; j < k; j++) {
        const cJSON *id = cJSON_GetArrayItem(q->notes, j);
        record *n = cJSON_IsString(id) ? find_note(r->notes, r->n_notes, id->valuestring) : NULL;
        if (!n)
            return ak_failc(err, AK_ERR_INVALID, "notes line %d: query '%s' names %s%s%s, not a note of the file",
                            q->line, q->id, cJSON_IsString(id) ? "'" : "", cJSON_IsString(id) ? id->valuestring : "a non-string",
                            cJSON_IsString(id) ? "'" : "");
        if (!n->tok) {
            if (ak_memory_tokenize(tk, n->text, strlen(n->text), &n->tok, &n->n_tok, err) < 0) return -1;
            if (n->n_tok < 1) return ak_failc(err, AK_ERR_INVALID, "notes line %d: note '%s' has no tokens", n->line, n->id);
        }
        picked[j] = n;
    }
    return 1;
}

int brd_from_notes(const ak_tokenizer *tk, const char *jsonl, size_t len, const brd_shape *sh, int max_ctx,
                   uint64_t seed, brd_set *out, ak_error *err) {
    if (set_init(out, sh, err) < 0) return -1;
    const int n_pre = sh->n_pre, k = sh->k, T = sh->T, C = sh->C;
    records r;
    record **picked = calloc((size_t)k, sizeof *picked);
    int rc = -1, cap_ctx = 0;
    size_t cap_tok = 0;
    if (!picked) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto out; }
    if (records_parse(jsonl, len, &r, err) < 0) goto out;
    for (int qi = 0; qi < r.n_queries && out->n_ctx < max_ctx; qi++) {
        const record *q = &r.queries[qi];
        int got = query_notes(tk, &r, q, k, picked, err);
        if (got < 0) goto out;
        int32_t *cont = NULL;
        int n_cont = 0;
        if (got && ak_memory_tokenize(tk, q->text, strlen(q->text), &cont, &n_cont, err) < 0) goto out;
        if (!got || n_cont < C) {
            free(cont);
            out->n_skipped++;
            continue;
        }
        /* the notes' order: a shuffle drawn from the seed and the query's index */
        ak_rng g;
        ak_rng_seed(&g, seed + 0x9E3779B97F4A7C15ull * (uint64_t)(qi + 1));
        for (int j = k - 1; j > 0; j--) {
            int x = (int)(ak_rng_u32(&g) % (uint32_t)(j + 1));
            record *t = picked[j];
            picked[j] = picked[x];
            picked[x] = t;
        }
        if (reserve(out, &cap_ctx, &cap_tok, (size_t)(n_pre + k * T + C), 1, err) < 0) { free(cont); goto out; }
        int32_t *c = out->toks + out->off[out->n_ctx];
        int at = 0;
        if (n_pre) c[at++] = sh->bos;
        char **ids = out->ids + (size_t)out->n_ctx * (k + 1);
        memset(ids, 0, sizeof *ids * (size_t)(k + 1));
        out->n_ctx++;   /* counted now: brd_free frees its ids even when one strdup fails */
        int fail = !(ids[0] = strdup(q->id));
        for (int j = 0; j < k; j++) {
            int n = picked[j]->n_tok < T ? picked[j]->n_tok : T;
            out->n_truncated += picked[j]->n_tok > T;
            memcpy(c + at, picked[j]->tok, sizeof(int32_t) * (size_t)n);
            at += n;
            out->lens[(size_t)(out->n_ctx - 1) * k + j] = n;
            fail |= !(ids[j + 1] = strdup(picked[j]->id));
        }
        memcpy(c + at, cont, sizeof(int32_t) * (size_t)C);
        at += C;
        free(cont);
        out->off[out->n_ctx] = out->off[out->n_ctx - 1] + (size_t)at;
        if (fail) { ak_failc(err, AK_ERR_NOMEM, "out of memory"); goto out; }
    }
    rc = out->n_ctx;
out:
    if (picked) records_free(&r);
    free(picked);
    return rc;
}
