/* chat_resend.c - see chat_resend.h. */
#include "text/chat_resend.h"

#include <stdlib.h>
#include <string.h>

/* A growable token list. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} toks;

static int toks_put(toks *t, const int32_t *ids, size_t n, ak_error *err) {
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n) cap *= 2;
        int32_t *v = realloc(t->v, sizeof *v * cap);
        if (!v) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        t->v = v;
        t->cap = cap;
    }
    if (n) memcpy(t->v + t->n, ids, sizeof *ids * n);
    t->n += n;
    return 0;
}

/* Tokenizes text[0..n) (plain: its content mask, NULL for all markup,
 * all_plain for all content) and appends the ids: special tokens parsed in
 * markup, no BOS, and no SentencePiece dummy space at its start when it
 * continues text (cont). Returns 0, or -1 with err set. */
static int put_text(toks *t, const ak_tokenizer *tok, const char *text, size_t n, const uint8_t *plain, int all_plain,
                    int cont, ak_error *err) {
    if (n == 0) return 0;
    uint8_t *mask = NULL;
    if (all_plain) {
        if (!(mask = malloc(n))) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
        memset(mask, 1, n);
        plain = mask;
    }
    int32_t *ids = NULL;
    size_t k = 0;
    int flags = AK_TOK_PARSE_SPECIAL | (cont ? AK_TOK_CONTINUE : 0);
    int rc = ak_tokenize_masked(tok, text, n, flags, plain, &ids, &k, err);
    if (rc == 0) rc = toks_put(t, ids, k, err);
    free(ids);
    free(mask);
    return rc;
}

/* Appends the rendering's [from, to) followed by the generation prompt gp,
 * tokenized as one piece (so that it splits as the prompt that ended with
 * gp did). Returns 0, or -1 with err set. */
static int put_piece(toks *t, const ak_tokenizer *tok, const ak_chat_rendering *r, size_t from, size_t to,
                     const char *gp, ak_error *err) {
    size_t lg = strlen(gp), n = to - from + lg;
    char *text = malloc(n + 1);
    uint8_t *mask = malloc(n + 1);
    if (!text || !mask) {
        free(text);
        free(mask);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    memcpy(text, r->text + from, to - from);
    memcpy(mask, r->plain + from, to - from);
    memcpy(text + (to - from), gp, lg);
    memset(mask + (to - from), 0, lg);
    int rc = put_text(t, tok, text, n, mask, 0, from > 0, err);
    free(text);
    free(mask);
    return rc;
}

/* 1 if the template rendered content c as c itself or c with ASCII
 * whitespace trimmed from both ends (r[0..n) is what it rendered). */
static int rendered_as_is(const char *r, size_t n, const char *c) {
    size_t lc = strlen(c), a = 0, z = lc;
    if (n == lc && !memcmp(r, c, n)) return 1;
    while (a < z && strchr(" \t\n\v\f\r", c[a])) a++;
    while (z > a && strchr(" \t\n\v\f\r", c[z - 1])) z--;
    return n == z - a && !memcmp(r, c + a, n);
}

/* Matches hist[p..) against content c: the longest run hist[p..q) whose
 * decoding is a prefix of c. Returns 1 with *q set and *covered the bytes
 * of c it decodes to when that is all of c, when the next token's text
 * starts with the rest of c (the content ends inside it), or when the
 * history ends there; else 0. -1 with err set when out of memory. */
static int match_content(const ak_tokenizer *tok, const int32_t *hist, int n_hist, int p, const char *c, int *q,
                         size_t *covered, ak_error *err) {
    size_t lc = strlen(c), got = 0, cap = ak_detok_bound(tok);
    char *buf = malloc(cap);
    if (!buf) return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    ak_detok d;
    ak_detok_init(&d);
    int i = p, rc = 0;
    while (got < lc && i < n_hist) {
        size_t k = 0;
        unsigned held = d.n_pend;   /* bytes of earlier tokens this push may complete */
        if (ak_detok_push(&d, tok, hist[i], buf, cap, &k) < 0) break;
        if (got + k > lc) {
            /* the content ends inside this token: its text must go on with
             * c's rest, and hist[p..i) must decode to c's head alone */
            rc = !held && !memcmp(buf, c + got, lc - got);
            break;
        }
        if (memcmp(buf, c + got, k)) break;
        got += k;
        i++;
        if (got == lc && d.n_pend) {
            /* c ends with bytes still held back: not the same text */
            got = 0;
            break;
        }
    }
    /* the history ends inside the content: a turn cut by max_tokens (or
     * a client gone) keeps all but the last token it sampled */
    if (!rc && (got == lc || (i == n_hist && !d.n_pend))) rc = 1;
    if (rc) {
        *q = i;
        *covered = got;
    }
    free(buf);
    return rc;
}

int ak_chat_tokenize_resent(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok,
                            const int32_t *hist, int n_hist, ak_chat_resent *out, ak_error *err) {
    *out = (ak_chat_resent){0};
    ak_chat_rendering r;
    if (ak_chat_render_tracked(msgs, n, o, &r, err) < 0) return -1;
    toks t = {0};
    int rc = 0, replaced = 0;
    int32_t bos = ak_tokenizer_bos(tok);
    if (ak_tokenizer_add_bos(tok) && bos >= 0) rc = toks_put(&t, &bos, 1, err);
    size_t pos = 0;   /* the rendering's bytes before pos are placed */
    for (int i = 0; rc == 0 && i < n; i++) {
        const ak_chat_span *sp = &r.spans[i];
        if (strcmp(msgs[i].role, "assistant") || sp->open < (long)pos || sp->at < sp->open || sp->end < sp->at)
            continue;
        /* a reply with calls: the history must decode to its turn as rendered, text and calls */
        size_t at = (size_t)sp->at, len = (size_t)(sp->end - sp->at);
        char *turn = msgs[i].n_calls > 0 ? strndup(r.text + at, len) : NULL;
        const char *want = turn ? turn : msgs[i].content;
        if (!want || (!turn && !rendered_as_is(r.text + at, len, want))) {
            if (msgs[i].n_calls > 0) rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
            continue;
        }
        size_t mark = t.n;
        int q = 0, m = 0;
        size_t covered = 0;
        if ((rc = put_piece(&t, tok, &r, pos, (size_t)sp->open, r.gen_prompt, err)) == 0)
            m = t.n <= (size_t)n_hist && (t.n == 0 || !memcmp(t.v, hist, sizeof *t.v * t.n))
                    ? match_content(tok, hist, n_hist, (int)t.n, want, &q, &covered, err)
                    : 0;
        if (rc == 0 && m > 0) {
            size_t p = t.n;
            rc = toks_put(&t, hist + p, (size_t)q - p, err);
            /* what the history lacks: the turn's rest, markup and all, or the content's as text */
            if (rc == 0 && turn) rc = put_text(&t, tok, turn + covered, len - covered, r.plain + at + covered, 0, 1, err);
            else if (rc == 0) rc = put_text(&t, tok, want + covered, strlen(want + covered), NULL, 1, 1, err);
            pos = (size_t)sp->end;
            replaced++;
        }
        free(turn);
        if (rc < 0 || m < 0) {
            rc = -1;
            break;
        }
        if (!m) t.n = mark;   /* rendered as the template does */
    }
    if (rc == 0 && replaced) rc = put_text(&t, tok, r.text + pos, r.len - pos, r.plain + pos, 0, pos > 0, err);
    int32_t eos = ak_tokenizer_eos(tok);
    if (rc == 0 && replaced && ak_tokenizer_add_eos(tok) && eos >= 0) rc = toks_put(&t, &eos, 1, err);
    if (rc == 0 && replaced && !t.v && !(t.v = malloc(sizeof *t.v)))   /* an empty prompt is still one */
        rc = ak_failc(err, AK_ERR_NOMEM, "out of memory");
    ak_chat_rendering_free(&r);
    if (rc < 0 || !replaced) {
        free(t.v);
        return rc;
    }
    *out = (ak_chat_resent){.ids = t.v, .n_ids = t.n, .n_replaced = replaced};
    return 0;
}

struct ak_chat_resend {
    ak_chat_opts opts;   /* template text borrowed, tools owned */
    const ak_tokenizer *tok;
    ak_chat_msg *msgs;   /* (n) roles static, the rest owned */
    int n;
    int n_prefix, drop_first;   /* ak_chat_resend_set_prefix */
    int n_keep;                 /* ak_chat_resend_keep */
    void **own;                 /* what the copies allocated, n_own of them */
    int n_own, cap_own;
};

void ak_chat_resend_keep(ak_chat_resend *c, int n) { c->n_keep = n > 0 ? n : 0; }

void ak_chat_resend_set_prefix(ak_chat_resend *c, int n_prefix, int drop_first) {
    c->n_prefix = n_prefix > 0 ? n_prefix : 0;
    c->drop_first = c->n_prefix && drop_first;
}

/* Records p as c's to free; NULL stays NULL. Returns p, or NULL with *failed
 * set (p freed) when the list cannot grow. */
static void *own(ak_chat_resend *c, void *p, int *failed) {
    if (!p) return NULL;
    if (c->n_own == c->cap_own) {
        int cap = c->cap_own ? c->cap_own * 2 : 16;
        void **v = realloc(c->own, sizeof *v * (size_t)cap);
        if (!v) {
            free(p);
            *failed = 1;
            return NULL;
        }
        c->own = v;
        c->cap_own = cap;
    }
    return c->own[c->n_own++] = p;
}

/* A copy of s owned by c (NULL for NULL); *failed set when out of memory. */
static const char *own_str(ak_chat_resend *c, const char *s, int *failed) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *failed = 1;
    return own(c, d, failed);
}

/* Copies m into c->msgs[i]: roles canonical (compared by text later). */
static void copy_msg(ak_chat_resend *c, int i, const ak_chat_msg *m, int *failed) {
    static const char *const roles[] = {"assistant", "user", "tool", "system"};
    const char *role = roles[3];
    for (int k = 0; k < 3; k++)
        if (!strcmp(m->role, roles[k])) role = roles[k];
    ak_chat_call *calls = NULL;
    if (m->n_calls > 0 && (calls = own(c, calloc((size_t)m->n_calls, sizeof *calls), failed)) == NULL) *failed = 1;
    for (int k = 0; calls && k < m->n_calls; k++)
        calls[k] = (ak_chat_call){.id = own_str(c, m->calls[k].id, failed), .name = own_str(c, m->calls[k].name, failed),
                                  .arguments = own_str(c, m->calls[k].arguments, failed)};
    c->msgs[i] = (ak_chat_msg){.role = role, .content = own_str(c, m->content, failed),
                               .reasoning = own_str(c, m->reasoning, failed), .calls = calls,
                               .n_calls = calls ? m->n_calls : 0, .tool_call_id = own_str(c, m->tool_call_id, failed)};
}

ak_chat_resend *ak_chat_resend_new(const ak_chat_msg *msgs, int n, const ak_chat_opts *o, const ak_tokenizer *tok,
                                   ak_error *err) {
    ak_chat_resend *c = ak_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    *c = (ak_chat_resend){.opts = *o, .tok = tok};
    c->opts.bos = c->opts.eos = NULL;   /* not used, not kept */
    c->opts.tools = NULL;
    c->opts.n_tools = 0;
    int failed = 0;
    ak_chat_tool *tools = NULL;
    if (o->n_tools > 0 && !(tools = own(c, calloc((size_t)o->n_tools, sizeof *tools), &failed))) failed = 1;
    for (int k = 0; tools && k < o->n_tools; k++)
        tools[k] = (ak_chat_tool){.name = own_str(c, o->tools[k].name, &failed),
                                  .description = own_str(c, o->tools[k].description, &failed),
                                  .parameters = own_str(c, o->tools[k].parameters, &failed),
                                  .strict = o->tools[k].strict};
    if (tools) {
        c->opts.tools = tools;
        c->opts.n_tools = o->n_tools;
    }
    if (!(c->msgs = calloc((size_t)(n > 0 ? n : 1), sizeof *c->msgs))) failed = 1;
    for (int i = 0; c->msgs && i < n; i++) copy_msg(c, i, &msgs[i], &failed);
    c->n = c->msgs ? n : 0;
    if (failed) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        ak_chat_resend_free(c);
        return NULL;
    }
    return c;
}

void ak_chat_resend_free(ak_chat_resend *c) {
    if (!c) return;
    for (int i = 0; i < c->n_own; i++) free(c->own[i]);
    free(c->own);
    free(c->msgs);
    free(c);
}

int ak_chat_resend_prompt(const ak_chat_resend *c, const int32_t *hist, int n_hist, int32_t **ids, int *n_ids,
                          ak_error *err) {
    size_t n = 0;
    int np = c->n_prefix, d = c->drop_first;
    *ids = NULL;
    *n_ids = 0;
    if (n_hist < np + d) return 0;
    /* the conversation's own history: what follows the prefix, with the
     * first token it was tokenized with (the one dropped) put back */
    int32_t first = -1;
    if (d && ak_tokenizer_add_bos(c->tok)) first = ak_tokenizer_bos(c->tok);
    if (d && first < 0) return 0;
    int nv = n_hist - np + d;
    int32_t *v = ak_malloc(sizeof *v * (size_t)(nv ? nv : 1), err);
    if (!v) return -1;
    if (d) v[0] = first;
    memcpy(v + d, hist + np, sizeof *v * (size_t)(n_hist - np));
    ak_chat_resent rs;
    int rc = ak_chat_tokenize_resent(c->msgs, c->n, &c->opts, c->tok, v, nv, &rs, err);
    free(v);
    if (rc < 0 || !rs.n_replaced) return rc;
    int32_t *conv = rs.ids;
    n = rs.n_ids;
    if (c->n_keep && (n_hist < c->n_keep || n < (size_t)c->n_keep || memcmp(conv, hist, sizeof *conv * (size_t)c->n_keep))) {
        free(conv);
        return 0;
    }
    int32_t *out = ak_malloc(sizeof *out * (np + n - (size_t)d), err);
    if (!out) {
        free(conv);
        return -1;
    }
    memcpy(out, hist, sizeof *out * (size_t)np);
    memcpy(out + np, conv + d, sizeof *out * (n - (size_t)d));
    free(conv);
    *ids = out;
    *n_ids = (int)(np + n - (size_t)d);
    return 1;
}
