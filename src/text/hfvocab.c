/* hfvocab.c - a Hugging Face tokenizer.json as tokenizer.ggml.* metadata
 * (the rules: hfvocab.h). Token and merge strings point into the parsed
 * documents, which live as long as the vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "text/hfvocab.h"

#define MAX_VOCAB (1 << 24)

struct ak_hfvocab {
    cJSON *doc, *cfg;          /* tokenizer.json; tokenizer_config.json or NULL */
    int32_t n;
    gguf_str *toks;
    int32_t *types;
    int32_t n_merges;
    gguf_str *merges;
    char *pads, *joined;       /* "[PAD<id>]" names; merges joined from pairs */
    const char *pre;
    int32_t bos, eos, pad;     /* -1: none */
    int add_bos, add_eos;      /* -1: not said */
    const char *chat_template; /* NULL: none */
};

/* The pre-tokenizers llama.cpp names that the tokenizer.json's Split regex
 * identifies, with the family's BOS / EOS when the config names none. */
static const struct hf_pre {
    const char *name, *regex;
    int ignore_merges;
    const char *bos, *eos;
} pres[] = {
    {.name = "llama-bpe",
     .regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     .ignore_merges = 1, .bos = "<|begin_of_text|>", .eos = "<|eot_id|>"},
    {.name = "qwen2",
     .regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     .ignore_merges = 0, .bos = "<|endoftext|>", .eos = "<|im_end|>"},
};

/* Parses the JSON file at path into *out. A missing file is an error only
 * when required (else *out is NULL and 0 is returned). Returns 0 or -1
 * with err set. */
static int read_json(const char *path, int required, cJSON **out, ak_error *err) {
    *out = NULL;
    struct stat st;
    if (!required && stat(path, &st) != 0) return 0;
    char *txt = ak_read_file(path, NULL, err);
    if (!txt) return -1;
    *out = cJSON_Parse(txt);
    free(txt);
    return *out ? 0 : ak_fail(err, "%s: not valid JSON", path);
}

/* The string member key of o, or NULL. */
static const char *str_of(const cJSON *o, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* Whether o's member key is the JSON value true. */
static int is_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* The id of a token entry's number j, or -1 when it is not an integer in
 * [0, MAX_VOCAB). */
static int32_t id_of(const cJSON *j) {
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble >= MAX_VOCAB ||
        j->valuedouble != (double)(int32_t)j->valuedouble)
        return -1;
    return (int32_t)j->valuedouble;
}

/* The pre-tokenizer of doc (path for messages) after checking that the
 * tokenizer is a byte-level BPE one of a supported pre-tokenizer; NULL with
 * err set otherwise. */
static const struct hf_pre *find_pre(const cJSON *doc, const char *path, ak_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const char *type = str_of(model, "type"), *dec = str_of(cJSON_GetObjectItemCaseSensitive(doc, "decoder"), "type");
    if (!type || strcmp(type, "BPE") || is_true(model, "byte_fallback") || !dec || strcmp(dec, "ByteLevel")) {
        ak_fail(err, "%s: not a byte-level BPE tokenizer (model %s, decoder %s); supported: Llama 3's and Qwen 2's",
                path, type ? type : "none", dec ? dec : "none");
        return NULL;
    }
    /* a Split by the family's regex, then ByteLevel without a regex of its own */
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(doc, "pre_tokenizer");
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    const cJSON *split = cJSON_GetArrayItem(seq, 0), *bl = cJSON_GetArrayItem(seq, 1);
    const char *st = str_of(split, "type"), *bt = str_of(bl, "type");
    const char *re = str_of(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    int shape = cJSON_GetArraySize(seq) == 2 && st && !strcmp(st, "Split") && bt && !strcmp(bt, "ByteLevel") &&
                !is_true(bl, "use_regex") && re;
    for (size_t i = 0; shape && i < sizeof pres / sizeof pres[0]; i++) {
        if (strcmp(re, pres[i].regex)) continue;
        if (is_true(model, "ignore_merges") != pres[i].ignore_merges) {
            ak_fail(err, "%s: the pre-tokenizer is %s's but model.ignore_merges is %s", path, pres[i].name,
                    pres[i].ignore_merges ? "not set" : "set");
            return NULL;
        }
        return &pres[i];
    }
    ak_fail(err, "%s: the pre-tokenizer is none that agentkv names (supported: Llama 3's \"llama-bpe\" and "
            "Qwen 2's \"qwen2\" Split regex, then ByteLevel)", path);
    return NULL;
}

/* Whether an added token's text looks special to the converter
 * (does_token_look_special): it then becomes CONTROL even when not marked. */
static int looks_special(const char *s) {
    static const char *const named[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (!strcmp(s, named[i])) return 1;
    size_t n = strlen(s);
    static const struct { const char *open, *close; } pairs[] = {
        {.open = "<|", .close = "|>"}, {.open = "<\xEF\xBD\x9C", .close = "\xEF\xBD\x9C>"}, {.open = "<unused", .close = ">"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        size_t lo = strlen(pairs[i].open), lc = strlen(pairs[i].close);
        if (n >= lo + lc && !memcmp(s, pairs[i].open, lo) && !memcmp(s + n - lc, pairs[i].close, lc)) return 1;
    }
    return 0;
}

/* Sets v->toks and v->types from model.vocab and added_tokens (v->n
 * tokens, gaps named "[PAD<id>]"). Returns 0 or -1 with err set. */
static int fill_tokens(ak_hfvocab *v, const char *path, ak_error *err) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(v->doc, "model"), "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(v->doc, "added_tokens");
    if (!cJSON_IsObject(vocab) || !vocab->child) return ak_fail(err, "%s: model.vocab is not a non-empty object", path);
    int32_t n = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = id_of(e);
        if (id < 0) return ak_fail(err, "%s: model.vocab[\"%.64s\"] is not a token id", path, e->string);
        if (id >= n) n = id + 1;
    }
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        int32_t id = id_of(cJSON_GetObjectItemCaseSensitive(a, "id"));
        if (id < 0 || !str_of(a, "content")) return ak_fail(err, "%s: an added token without an id or content", path);
        if (id >= n) n = id + 1;
    }
    v->n = n;
    v->toks = ak_calloc((size_t)n, sizeof *v->toks, err);
    v->types = ak_calloc((size_t)n, sizeof *v->types, err);
    if (!v->toks || !v->types) return -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = id_of(e);
        if (v->toks[id].data) return ak_fail(err, "%s: token id %d is in model.vocab twice", path, id);
        v->toks[id] = (gguf_str){.len = strlen(e->string), .data = e->string};
        v->types[id] = 1;   /* NORMAL */
    }
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        int32_t id = id_of(cJSON_GetObjectItemCaseSensitive(a, "id"));
        const char *c = str_of(a, "content");
        v->toks[id] = (gguf_str){.len = strlen(c), .data = c};
        v->types[id] = is_true(a, "special") || looks_special(c) ? 3 : 4;   /* CONTROL : USER_DEFINED */
    }
    int32_t gaps = 0;
    for (int32_t i = 0; i < n; i++) gaps += !v->toks[i].data;
    if (!gaps) return 0;
    v->pads = ak_malloc((size_t)gaps * 20, err);   /* "[PAD16777215]" and NUL fit */
    if (!v->pads) return -1;
    char *p = v->pads;
    for (int32_t i = 0; i < n; i++) {
        if (v->toks[i].data) continue;
        int len = snprintf(p, 20, "[PAD%d]", i);
        v->toks[i] = (gguf_str){.len = (uint64_t)len, .data = p};
        v->types[i] = 5;   /* UNUSED */
        p += len + 1;
    }
    return 0;
}

/* Sets v->merges from model.merges ("a b" strings, or ["a", "b"] pairs
 * joined with a space inside a part written as U+0120). Returns 0 or -1
 * with err set. */
static int fill_merges(ak_hfvocab *v, const char *path, ak_error *err) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(v->doc, "model"), "merges");
    if (!cJSON_IsArray(m)) return ak_fail(err, "%s: model.merges is not an array", path);
    size_t room = 0;
    int32_t n = 0;
    for (const cJSON *e = m->child; e; e = e->next, n++) {
        if (cJSON_IsString(e)) continue;
        const char *a = cJSON_GetStringValue(cJSON_GetArrayItem(e, 0)), *b = cJSON_GetStringValue(cJSON_GetArrayItem(e, 1));
        if (!a || !b || cJSON_GetArraySize(e) != 2) return ak_fail(err, "%s: merge %d is not \"a b\" nor [a, b]", path, n);
        room += 2 * (strlen(a) + strlen(b)) + 2;   /* a space may double */
    }
    v->n_merges = n;
    v->merges = ak_calloc(n ? (size_t)n : 1, sizeof *v->merges, err);
    v->joined = ak_malloc(room ? room : 1, err);
    if (!v->merges || !v->joined) return -1;
    char *p = v->joined;
    int32_t i = 0;
    for (const cJSON *e = m->child; e; e = e->next, i++) {
        if (cJSON_IsString(e)) {
            v->merges[i] = (gguf_str){.len = strlen(e->valuestring), .data = e->valuestring};
            continue;
        }
        char *start = p;
        for (int k = 0; k < 2; k++) {
            if (k) *p++ = ' ';
            for (const char *s = cJSON_GetArrayItem(e, k)->valuestring; *s; s++)
                if (*s == ' ') { *p++ = (char)0xC4; *p++ = (char)0xA0; }
                else *p++ = *s;
        }
        v->merges[i] = (gguf_str){.len = (uint64_t)(p - start), .data = start};
        *p++ = 0;
    }
    return 0;
}

/* The id of the added token whose content is s, or -1 (also for NULL). */
static int32_t added_id(const cJSON *doc, const char *s) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(doc, "added_tokens");
    for (const cJSON *a = s && cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        const char *c = str_of(a, "content");
        if (c && !strcmp(c, s)) return id_of(cJSON_GetObjectItemCaseSensitive(a, "id"));
    }
    return -1;
}

/* The content the config gives for key ("bos_token": a string, or an
 * object with "content"), or NULL. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsObject(e) ? str_of(e, "content") : cJSON_GetStringValue(e);
}

/* The config's boolean key as 0 / 1, or else fallback. */
static int config_bool(const cJSON *cfg, const char *key, int fallback) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsBool(e) ? cJSON_IsTrue(e) : fallback;
}

/* The content of the SpecialToken that opens (at 0) or closes (at 1) the
 * single-sequence template of a TemplateProcessing post-processor (alone or
 * in a Sequence), or NULL. */
static const char *template_special(const cJSON *doc, int at_end) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(doc, "post_processor");
    const cJSON *procs = cJSON_GetObjectItemCaseSensitive(pp, "processors"), *single = NULL;
    for (const cJSON *p = procs ? procs->child : pp; p && !single; p = procs ? p->next : NULL) {
        const char *type = str_of(p, "type");
        if (type && !strcmp(type, "TemplateProcessing")) single = cJSON_GetObjectItemCaseSensitive(p, "single");
    }
    int n = cJSON_GetArraySize(single);
    if (n < 1 + at_end) return NULL;
    return str_of(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, at_end ? n - 1 : 0), "SpecialToken"), "id");
}

/* Sets the special ids and the add_* flags (the rules of hfvocab.h). */
static void fill_specials(ak_hfvocab *v, const struct hf_pre *pre) {
    const char *first = template_special(v->doc, 0), *last = template_special(v->doc, 1);
    const char *bos = config_token(v->cfg, "bos_token"), *eos = config_token(v->cfg, "eos_token");
    v->bos = added_id(v->doc, bos ? bos : first ? first : pre->bos);
    v->eos = added_id(v->doc, eos ? eos : last ? last : pre->eos);
    v->pad = added_id(v->doc, config_token(v->cfg, "pad_token"));
    v->add_bos = config_bool(v->cfg, "add_bos_token", first ? 1 : -1);
    v->add_eos = config_bool(v->cfg, "add_eos_token", last ? 1 : -1);
    v->chat_template = str_of(v->cfg, "chat_template");
}

ak_hfvocab *ak_hfvocab_load(const char *path, ak_error *err) {
    ak_hfvocab *v = ak_calloc(1, sizeof *v, err);
    if (!v) return NULL;
    char cfg[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    if (snprintf(cfg, sizeof cfg, "%.*stokenizer_config.json", dl, path) >= (int)sizeof cfg) {
        ak_fail(err, "%s: path too long", path);
        goto fail;
    }
    if (read_json(path, 1, &v->doc, err) < 0 || read_json(cfg, 0, &v->cfg, err) < 0) goto fail;
    const struct hf_pre *pre = find_pre(v->doc, path, err);
    if (!pre || fill_tokens(v, path, err) < 0 || fill_merges(v, path, err) < 0) goto fail;
    v->pre = pre->name;
    fill_specials(v, pre);
    return v;
fail:
    ak_hfvocab_free(v);
    return NULL;
}

void ak_hfvocab_free(ak_hfvocab *v) {
    if (!v) return;
    cJSON_Delete(v->doc);
    cJSON_Delete(v->cfg);
    free(v->toks);
    free(v->types);
    free(v->merges);
    free(v->pads);
    free(v->joined);
    free(v);
}

int32_t ak_hfvocab_size(const ak_hfvocab *v) { return v->n; }

const char *ak_hfvocab_pre(const ak_hfvocab *v) { return v->pre; }

void ak_hfvocab_write(const ak_hfvocab *v, gguf_writer *w) {
    gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_kv_str(w, "tokenizer.ggml.pre", v->pre);
    gguf_writer_kv_arr_str_len(w, "tokenizer.ggml.tokens", v->toks, (uint64_t)v->n);
    gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, (uint64_t)v->n);
    gguf_writer_kv_arr_str_len(w, "tokenizer.ggml.merges", v->merges, (uint64_t)v->n_merges);
    if (v->bos >= 0) gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->eos >= 0) gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->pad >= 0) gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    if (v->add_bos >= 0) gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (v->add_eos >= 0) gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (v->chat_template) gguf_writer_kv_str(w, "tokenizer.chat_template", v->chat_template);
}
