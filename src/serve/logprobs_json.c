/* logprobs_json.c - see logprobs_json.h */
#include "serve/logprobs_json.h"

#include <stdlib.h>
#include <string.h>

/* Characters (code points) of s[0..n): the bytes that start one. */
static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Token id's text into buf (ak_detok_bound(tk) + 1 bytes): its bytes with
 * each invalid UTF-8 part replaced by U+FFFD, NUL-terminated. */
static const char *token_text(const ak_tokenizer *tk, int32_t id, char *buf) {
    ak_detok d;
    ak_detok_init(&d);
    size_t cap = ak_detok_bound(tk), n = 0;
    if (ak_detok_push(&d, tk, id, buf, cap, &n) < 0) n = 0;
    n += ak_detok_flush(&d, buf + n, cap - n);
    buf[n] = 0;
    return buf;
}

/* {"token", "logprob", "bytes"} of token id into o. */
static void add_token(cJSON *o, const ak_tokenizer *tk, int32_t id, float logprob, char *buf) {
    cJSON_AddStringToObject(o, "token", token_text(tk, id, buf));
    cJSON_AddNumberToObject(o, "logprob", logprob);
    cJSON *b = cJSON_AddArrayToObject(o, "bytes");
    const char *raw;
    size_t len;
    if (ak_token_bytes(tk, id, &raw, &len) < 0) len = 0;
    for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
}

/* Chat's object over e[0..n). */
static cJSON *chat_json(const ak_tokenizer *tk, const ak_req_logprob *e, int n, char *buf) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToArray(content, t);
        add_token(t, tk, e[i].id, e[i].logprob, buf);
        cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
        for (int k = 0; k < e[i].n_top; k++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToArray(top, x);
            add_token(x, tk, e[i].top[k].id, e[i].top[k].logprob, buf);
        }
    }
    cJSON_AddNullToObject(lp, "refusal");
    return lp;
}

/* The legacy object over e[0..n), the text a->text starting at cur's
 * place. */
static cJSON *legacy_json(const ak_lp_add *a, const ak_lp_cursor *cur, const ak_req_logprob *e, int n, char *buf) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(lp, "text_offset");
    for (int i = 0; i < n; i++) {
        cJSON_AddItemToArray(tokens, cJSON_CreateString(token_text(a->tk, e[i].id, buf)));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(e[i].logprob));
        /* the alternatives, then the token itself when it is not one of them;
         * two tokens of the same text keep the likelier's key */
        cJSON *d = cJSON_CreateObject();
        cJSON_AddItemToArray(tops, d);
        int self = 0;
        for (int k = 0; k <= e[i].n_top; k++) {
            if (k == e[i].n_top && self) break;
            int32_t id = k < e[i].n_top ? e[i].top[k].id : e[i].id;
            float v = k < e[i].n_top ? e[i].top[k].logprob : e[i].logprob;
            self |= id == e[i].id;
            const char *key = token_text(a->tk, id, buf);
            if (!cJSON_GetObjectItemCaseSensitive(d, key)) cJSON_AddNumberToObject(d, key, v);
        }
        size_t at = e[i].offset > cur->bytes ? e[i].offset - cur->bytes : 0;
        if (at > a->n) at = a->n;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(cur->chars + utf8_chars(a->text, at))));
    }
    return lp;
}

/* Moves cur past a's text. */
static void advance(const ak_lp_add *a, ak_lp_cursor *cur) {
    cur->bytes += a->n;
    cur->chars += a->n ? utf8_chars(a->text, a->n) : 0;
}

int ak_logprobs_add(cJSON *c, const ak_lp_add *a, ak_lp_cursor *cur) {
    ak_req_logprob *e = NULL;
    int n = ak_request_logprobs_choice(a->r, a->choice, cur->next, a->upto, &e);
    if (!c || (!n && !a->always)) {
        free(e);
        advance(a, cur);
        return 0;
    }
    char *buf = malloc(ak_detok_bound(a->tk) + 1);
    cJSON *lp = buf ? (a->chat ? chat_json(a->tk, e, n, buf) : legacy_json(a, cur, e, n, buf)) : NULL;
    free(buf);
    free(e);
    if (!lp) return -1;
    if (cJSON_GetObjectItemCaseSensitive(c, "logprobs")) cJSON_ReplaceItemInObjectCaseSensitive(c, "logprobs", lp);
    else cJSON_AddItemToObject(c, "logprobs", lp);
    cur->next += n;
    advance(a, cur);
    return 0;
}
