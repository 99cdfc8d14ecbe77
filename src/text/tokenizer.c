/* tokenizer.c - see tokenizer.h. Written to give the same ids as llama.cpp's
 * llama-vocab.cpp for the SPM ("llama") and BPE ("gpt2") vocabularies.
 *
 * Layout: vocabulary storage and hash tables; loading; special-token
 * partition; SPM; BPE (pre-tokenizer regexes, byte-level map, merges);
 * decoding and the streaming UTF-8 decoder.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

enum { MODEL_SPM, MODEL_BPE };

/* Pre-tokenizer regex sets, as llama.cpp defines them per pre-tokenizer type.
 * The regexes are applied in sequence: each one cuts every fragment left by
 * the previous one into matches and the gaps between them (both kept). */
enum { PRE_DEFAULT, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_DEEPSEEK_LLM, PRE_DEEPSEEK_CODER,
       PRE_FALCON, PRE_STARCODER, PRE_COUNT };

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CJK  "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define MAX_RE 6

static const char *const pre_regexes[PRE_COUNT][MAX_RE + 1] = {
    [PRE_DEFAULT] = { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL },
    [PRE_GPT2] = { RE_GPT2, NULL },
    [PRE_LLAMA3] = { "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                     "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL },
    [PRE_QWEN2] = { "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL },
    [PRE_DEEPSEEK_LLM] = {
        "[\\r\\n]",
        /* DeepSeek's explicit list of cased letters (not \p{L}) */
        "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
        "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
        "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
        "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
        "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
        "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
        "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"
        "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
        "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"
        "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
        "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
        "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
        "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
        "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
        "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        "\\s+$",
        RE_CJK,
        "\\p{N}+",
        NULL },
    [PRE_DEEPSEEK_CODER] = { "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}", NULL },
    [PRE_FALCON] = { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL },
    [PRE_STARCODER] = { "\\p{N}", RE_GPT2, NULL },
};

/* tokenizer.ggml.pre names -> regex set (llama.cpp's table). llama3 also turns
 * on ignore_merges and add_bos. */
static const struct { const char *name; int pre; int llama3; } pre_names[] = {
    { "default", PRE_DEFAULT, 0 },
    { "gpt-2", PRE_GPT2, 0 }, { "gpt2", PRE_GPT2, 0 }, { "phi-2", PRE_GPT2, 0 }, { "mpt", PRE_GPT2, 0 },
    { "olmo", PRE_GPT2, 0 }, { "jais", PRE_GPT2, 0 }, { "roberta-bpe", PRE_GPT2, 0 },
    { "gigachat", PRE_GPT2, 0 }, { "jina-es", PRE_GPT2, 0 }, { "jina-de", PRE_GPT2, 0 },
    { "jina-v1-en", PRE_GPT2, 0 }, { "jina-v2-es", PRE_GPT2, 0 }, { "jina-v2-de", PRE_GPT2, 0 },
    { "jina-v2-code", PRE_GPT2, 0 },
    { "llama3", PRE_LLAMA3, 1 }, { "llama-v3", PRE_LLAMA3, 1 }, { "llama-bpe", PRE_LLAMA3, 1 },
    { "falcon3", PRE_LLAMA3, 1 }, { "dbrx", PRE_LLAMA3, 0 }, { "smaug-bpe", PRE_LLAMA3, 0 },
    { "chatglm-bpe", PRE_LLAMA3, 0 },
    { "qwen2", PRE_QWEN2, 0 }, { "stablelm2", PRE_QWEN2, 0 }, { "megrez", PRE_QWEN2, 0 },
    { "deepseek-r1-qwen", PRE_QWEN2, 0 },
    { "deepseek-llm", PRE_DEEPSEEK_LLM, 0 },
    { "deepseek-coder", PRE_DEEPSEEK_CODER, 0 },
    { "falcon", PRE_FALCON, 0 },
    { "starcoder", PRE_STARCODER, 0 }, { "refact", PRE_STARCODER, 0 }, { "command-r", PRE_STARCODER, 0 },
    { "smollm", PRE_STARCODER, 0 }, { "codeshell", PRE_STARCODER, 0 }, { "exaone", PRE_STARCODER, 0 },
    { "minerva-7b", PRE_STARCODER, 0 },
};

typedef struct { uint32_t off, len; } span;   /* a string inside an arena */

struct ak_tokenizer {
    int model;
    int pre;
    char pre_name[64];
    int32_t n_vocab;

    char *text;          /* vocabulary strings, each followed by a NUL */
    span *tok;
    char *piece;         /* decoded bytes of each token */
    span *pc;
    float *score;
    uint8_t *type;       /* AK_TOKEN_* */
    size_t max_tok_len, max_piece;

    int32_t *vmap;       /* open addressing: vocabulary string -> id */
    size_t vmask;

    char *mtext;         /* merges: "left right" strings */
    struct merge { uint32_t off, llen, rlen; } *merge;
    int32_t n_merges;
    int32_t *mmap;       /* (left, right) -> rank */
    size_t mmask;

    /* Special tokens (CONTROL, USER_DEFINED, UNKNOWN with text), longest
     * first; smap finds them by text, slens are their distinct lengths. */
    int32_t *special;
    int32_t n_special;
    int32_t *sord;       /* id -> position in special[], or -1 */
    int32_t *smap;
    size_t smask;
    uint32_t *slens;
    int n_slens;
    uint8_t sfirst[256]; /* 1 if some special token starts with this byte */

    int32_t bos, eos, eot, eom, unk, pad;
    int32_t eog[16];
    int n_eog;
    int add_bos, add_eos, add_space_prefix, ignore_merges;

    int32_t byte_tok[256];             /* SPM byte fallback */

    pcre2_code *re[MAX_RE];
    int n_re;
    uint8_t b2u[256][2], b2u_len[256]; /* GPT-2 byte -> printable char (UTF-8) */
    int16_t u2b[512];                  /* and back (code points < 512) */
};

/* ---- small helpers --------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Bytes in the UTF-8 sequence a lead byte announces, llama.cpp's way (a stray
 * continuation byte counts as one; 0xF8..0xFF as four). */
static size_t utf8_len(uint8_t c) {
    static const uint8_t t[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return t[c >> 4];
}

static size_t utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 63); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 63); o[2] = 0x80 | (cp & 63);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 63);
    o[2] = 0x80 | ((cp >> 6) & 63); o[3] = 0x80 | (cp & 63);
    return 4;
}

/* Decodes one code point at s[*i] the lenient way llama.cpp does (no overlong
 * or range checks); a malformed sequence yields U+FFFD and advances one byte. */
static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
    size_t k = *i;
    uint8_t c = s[k];
    if (c < 0x80) { *i = k + 1; return c; }
    size_t need = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
    if (need == 0 || need > n - k - 1) { *i = k + 1; return 0xFFFD; }
    uint32_t cp = c & (0x7Fu >> (need + 1));
    for (size_t j = 1; j <= need; j++) {
        if ((s[k + j] & 0xC0) != 0x80) { *i = k + 1; return 0xFFFD; }
        cp = (cp << 6) | (s[k + j] & 63u);
    }
    *i = k + need + 1;
    return cp;
}

/* Makes room for `need` elements; on failure frees p and returns NULL (the
 * caller reports it; freeing NULL later is harmless). */
static void *grow_(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elem);
    if (!q) { free(p); *cap = 0; return NULL; }
    *cap = c;
    return q;
}
#define GROW(p, cap, need) (((p) = grow_((p), &(cap), (need), sizeof *(p))) != NULL)

typedef struct { int32_t *v; size_t n, cap; } ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v; a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- vocabulary lookup ------------------------------------------------------ */

static int32_t vocab_find(const ak_tokenizer *tk, const char *s, size_t n) {
    if (n > tk->max_tok_len) return -1;
    for (size_t h = fnv(FNV0, s, n) & tk->vmask;; h = (h + 1) & tk->vmask) {
        int32_t id = tk->vmap[h];
        if (id < 0) return -1;
        if (tk->tok[id].len == n && memcmp(tk->text + tk->tok[id].off, s, n) == 0) return id;
    }
}

/* Later duplicates win, as with llama.cpp's token_to_id[word] = i. */
static void vocab_insert(ak_tokenizer *tk, int32_t id) {
    const char *s = tk->text + tk->tok[id].off;
    size_t n = tk->tok[id].len;
    for (size_t h = fnv(FNV0, s, n) & tk->vmask;; h = (h + 1) & tk->vmask) {
        int32_t o = tk->vmap[h];
        if (o < 0 || (tk->tok[o].len == n && memcmp(tk->text + tk->tok[o].off, s, n) == 0)) {
            tk->vmap[h] = id;
            return;
        }
    }
}

static int32_t special_find(const ak_tokenizer *tk, const char *s, size_t n) {
    for (size_t h = fnv(FNV0, s, n) & tk->smask;; h = (h + 1) & tk->smask) {
        int32_t id = tk->smap[h];
        if (id < 0) return -1;
        if (tk->tok[id].len == n && memcmp(tk->text + tk->tok[id].off, s, n) == 0) return id;
    }
}

static uint64_t merge_hash(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = fnv(FNV0, l, ln);
    h = (h ^ 0xFF) * 0x100000001b3ull;   /* 0xFF never occurs in UTF-8 */
    return fnv(h, r, rn);
}

static int32_t merge_rank(const ak_tokenizer *tk, const char *l, size_t ln, const char *r, size_t rn) {
    if (!tk->mmap) return -1;
    for (size_t h = merge_hash(l, ln, r, rn) & tk->mmask;; h = (h + 1) & tk->mmask) {
        int32_t i = tk->mmap[h];
        if (i < 0) return -1;
        const struct merge *m = &tk->merge[i];
        const char *ms = tk->mtext + m->off;
        if (m->llen == ln && m->rlen == rn && memcmp(ms, l, ln) == 0 && memcmp(ms + ln + 1, r, rn) == 0)
            return i;
    }
}

/* ---- loading ---------------------------------------------------------------- */

/* Reads an optional token id. Absent: leaves *id. Negative or 0xFFFFFFFF:
 * -1 ("none"). Otherwise it must be < n_vocab. */
static int read_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id, ak_error *err) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    int64_t v;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        v = kv->v.u64 == 0xFFFFFFFFull || kv->v.u64 > INT64_MAX ? -1 : (int64_t)kv->v.u64;
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        v = kv->v.i64;
        break;
    default:
        return ak_fail(err, "%s: metadata '%s' has type %s, expected a token id", f->path, key,
                       gguf_type_name(kv->type));
    }
    if (v < 0) { *id = -1; return 0; }
    if (v >= n_vocab)
        return ak_fail(err, "%s: metadata '%s' = %lld is out of range (vocabulary of %d tokens)",
                       f->path, key, (long long)v, n_vocab);
    *id = (int32_t)v;
    return 0;
}

static int read_bool(const gguf_file *f, const char *key, int *out, ak_error *err) {
    if (!gguf_find(f, key)) return 0;
    return gguf_get_bool(f, key, out, err);
}

/* First id whose text is one of names (in the order given), or -1. */
static int32_t find_by_text(const ak_tokenizer *tk, const char *const *names) {
    for (; *names; names++) {
        int32_t id = vocab_find(tk, *names, strlen(*names));
        if (id >= 0) return id;
    }
    return -1;
}

static void add_eog(ak_tokenizer *tk, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < tk->n_eog; i++) if (tk->eog[i] == id) return;
    if (tk->n_eog < (int)(sizeof tk->eog / sizeof tk->eog[0])) tk->eog[tk->n_eog++] = id;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes get the code points 256, 257, ... in byte order. */
static void init_byte_map(ak_tokenizer *tk) {
    int next = 256;
    for (int i = 0; i < 512; i++) tk->u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int cp = printable ? b : next++;
        tk->u2b[cp] = (int16_t)b;
        tk->b2u_len[b] = (uint8_t)utf8_put((uint32_t)cp, (char *)tk->b2u[b]);
    }
}

/* The bytes a token decodes to, written to out (room for 3 * its text). */
/* 1 when a CONTROL token's text s[0..n) is tool-call or reasoning markup
 * (Llama 3's "<|python_tag|>", Mistral's "[TOOL_CALLS]", "[ARGS]",
 * "[CALL_ID]", "[THINK]", "[/THINK]"): those decode to their text, so the
 * reply parser and the call grammar see where the model opened a call
 * (toolcall.h, toolgrammar.h); every other control token decodes to nothing. */
static int is_call_markup(const char *s, size_t n) {
    static const char *const markup[] = {"<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"};
    for (size_t i = 0; i < sizeof markup / sizeof *markup; i++)
        if (n == strlen(markup[i]) && !memcmp(s, markup[i], n)) return 1;
    return 0;
}

static size_t decode_piece(const ak_tokenizer *tk, int32_t id, char *out) {
    const char *s = tk->text + tk->tok[id].off;
    size_t n = tk->tok[id].len, o = 0;
    switch (tk->type[id]) {
    case AK_TOKEN_USER_DEFINED:
        memcpy(out, s, n);
        return n;
    case AK_TOKEN_NORMAL:
        if (tk->model == MODEL_SPM) {
            for (size_t i = 0; i < n; i++) {
                if (i + 2 < n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) { out[o++] = ' '; i += 2; }
                else out[o++] = s[i];
            }
            return o;
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp = utf8_next((const uint8_t *)s, n, &i);
            if (cp < 512 && tk->u2b[cp] >= 0) out[o++] = (char)tk->u2b[cp];
            else o += utf8_put(cp, out + o);   /* not in the byte map: keep it */
        }
        return o;
    case AK_TOKEN_BYTE:
        if (tk->model == MODEL_SPM && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            char hex[3] = { s[3], s[4], 0 }, *end;
            long v = strtol(hex, &end, 16);
            if (*end == 0) { out[0] = (char)v; return 1; }
        }
        return 0;
    case AK_TOKEN_CONTROL:
        if (!is_call_markup(s, n)) return 0;
        memcpy(out, s, n);
        return n;
    default:   /* UNKNOWN, UNUSED, UNDEFINED: nothing, like llama.cpp */
        return 0;
    }
}

typedef struct { uint32_t len; int32_t id; } len_id;

static int cmp_special(const void *a, const void *b) {   /* longest first, then by id */
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int load_vocab(ak_tokenizer *tk, const gguf_file *f, ak_error *err) {
    const gguf_kv *kv = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, err);
    if (!kv) return -1;
    uint64_t n = kv->v.arr.count;
    if (n == 0 || n > (1u << 24))
        return ak_fail(err, "%s: tokenizer.ggml.tokens has %llu entries", f->path, (unsigned long long)n);
    tk->n_vocab = (int32_t)n;

    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += (kv->v.arr.strs[i].len ? kv->v.arr.strs[i].len : 24) + 1;
    if (total > UINT32_MAX / 3) return ak_fail(err, "%s: vocabulary too large", f->path);
    tk->text = ak_malloc(total, err);
    tk->tok = ak_malloc(n * sizeof *tk->tok, err);
    tk->score = ak_calloc(n, sizeof *tk->score, err);
    tk->type = ak_malloc(n, err);
    if (!tk->text || !tk->tok || !tk->score || !tk->type) return -1;
    size_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = kv->v.arr.strs[i];
        tk->tok[i].off = (uint32_t)o;
        if (s.len == 0) {   /* llama.cpp renames empty tokens so they stay unique */
            o += (size_t)snprintf(tk->text + o, 24, "[EMPTY_%llu]", (unsigned long long)i);
        } else {
            memcpy(tk->text + o, s.data, s.len);
            o += s.len;
        }
        tk->tok[i].len = (uint32_t)(o - tk->tok[i].off);
        tk->text[o++] = 0;
        if (tk->tok[i].len > tk->max_tok_len) tk->max_tok_len = tk->tok[i].len;
    }

    const gguf_kv *sc = gguf_find(f, "tokenizer.ggml.scores");
    if (sc) {
        if (sc->type != GGUF_TYPE_ARRAY || sc->v.arr.type != GGUF_TYPE_FLOAT32 || sc->v.arr.count != n)
            return ak_fail(err, "%s: tokenizer.ggml.scores must be %llu FLOAT32 values", f->path,
                           (unsigned long long)n);
        memcpy(tk->score, sc->v.arr.data, n * sizeof(float));   /* little-endian host */
    }
    memset(tk->type, AK_TOKEN_NORMAL, n);
    const gguf_kv *ty = gguf_find(f, "tokenizer.ggml.token_type");
    if (ty) {
        if (ty->type != GGUF_TYPE_ARRAY || (ty->v.arr.type != GGUF_TYPE_INT32 && ty->v.arr.type != GGUF_TYPE_UINT32)
            || ty->v.arr.count != n)
            return ak_fail(err, "%s: tokenizer.ggml.token_type must be %llu INT32 values", f->path,
                           (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            int32_t t;
            memcpy(&t, ty->v.arr.data + 4 * i, 4);
            tk->type[i] = (uint8_t)(t >= AK_TOKEN_NORMAL && t <= AK_TOKEN_BYTE ? t : AK_TOKEN_UNDEFINED);
        }
    }

    tk->vmask = pow2_at_least(2 * n) - 1;
    tk->vmap = ak_malloc((tk->vmask + 1) * sizeof *tk->vmap, err);
    if (!tk->vmap) return -1;
    memset(tk->vmap, 0xFF, (tk->vmask + 1) * sizeof *tk->vmap);
    for (uint64_t i = 0; i < n; i++) vocab_insert(tk, (int32_t)i);
    return 0;
}

static int load_merges(ak_tokenizer *tk, const gguf_file *f, ak_error *err) {
    const gguf_kv *kv = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, err);
    if (!kv) return -1;
    uint64_t n = kv->v.arr.count;
    if (n > (1u << 24)) return ak_fail(err, "%s: too many merges", f->path);
    size_t total = 1;
    for (uint64_t i = 0; i < n; i++) total += kv->v.arr.strs[i].len;
    if (total > UINT32_MAX) return ak_fail(err, "%s: merges too large", f->path);
    tk->mtext = ak_malloc(total, err);
    tk->merge = ak_malloc((n ? n : 1) * sizeof *tk->merge, err);
    tk->mmask = pow2_at_least(2 * n) - 1;
    tk->mmap = ak_malloc((tk->mmask + 1) * sizeof *tk->mmap, err);
    if (!tk->mtext || !tk->merge || !tk->mmap) return -1;
    memset(tk->mmap, 0xFF, (tk->mmask + 1) * sizeof *tk->mmap);
    size_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = kv->v.arr.strs[i];
        /* split at the first space after the first byte, as llama.cpp does */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        struct merge *m = &tk->merge[i];
        m->off = (uint32_t)o;
        m->llen = m->rlen = 0;
        memcpy(tk->mtext + o, s.data, s.len);
        o += s.len;
        if (!sp) continue;   /* no pair: never matches */
        m->llen = (uint32_t)(sp - s.data);
        m->rlen = (uint32_t)(s.len - m->llen - 1);
        const char *l = tk->mtext + m->off, *r = l + m->llen + 1;
        for (size_t h = merge_hash(l, m->llen, r, m->rlen) & tk->mmask;; h = (h + 1) & tk->mmask) {
            int32_t j = tk->mmap[h];
            if (j < 0) { tk->mmap[h] = (int32_t)i; break; }
            const struct merge *q = &tk->merge[j];   /* the first rank of a pair wins */
            if (q->llen == m->llen && q->rlen == m->rlen && memcmp(tk->mtext + q->off, l, s.len) == 0) break;
        }
    }
    tk->n_merges = (int32_t)n;
    return 0;
}

static int build_special(ak_tokenizer *tk, ak_error *err) {
    int32_t n = tk->n_vocab, ns = 0;
    tk->special = ak_malloc((size_t)n * sizeof *tk->special, err);
    tk->sord = ak_malloc((size_t)n * sizeof *tk->sord, err);
    if (!tk->special || !tk->sord) return -1;
    for (int32_t i = 0; i < n; i++) {
        tk->sord[i] = -1;
        int t = tk->type[i];
        if ((t == AK_TOKEN_CONTROL || t == AK_TOKEN_USER_DEFINED || t == AK_TOKEN_UNKNOWN) && tk->tok[i].len)
            tk->special[ns++] = i;
    }
    tk->n_special = ns;
    len_id *li = ak_malloc(((size_t)ns + 1) * sizeof *li, err);
    if (!li) return -1;
    for (int32_t k = 0; k < ns; k++) li[k] = (len_id){ .len = tk->tok[tk->special[k]].len, .id = tk->special[k] };
    qsort(li, (size_t)ns, sizeof *li, cmp_special);
    for (int32_t k = 0; k < ns; k++) tk->special[k] = li[k].id;
    free(li);
    tk->smask = pow2_at_least(2 * (size_t)ns) - 1;
    tk->smap = ak_malloc((tk->smask + 1) * sizeof *tk->smap, err);
    tk->slens = ak_malloc(((size_t)ns + 1) * sizeof *tk->slens, err);
    if (!tk->smap || !tk->slens) return -1;
    memset(tk->smap, 0xFF, (tk->smask + 1) * sizeof *tk->smap);
    for (int32_t k = 0; k < ns; k++) {
        int32_t id = tk->special[k];
        tk->sord[id] = k;
        const char *s = tk->text + tk->tok[id].off;
        size_t len = tk->tok[id].len;
        tk->sfirst[(uint8_t)s[0]] = 1;
        if (tk->n_slens == 0 || tk->slens[tk->n_slens - 1] != len) tk->slens[tk->n_slens++] = (uint32_t)len;
        for (size_t h = fnv(FNV0, s, len) & tk->smask;; h = (h + 1) & tk->smask) {
            int32_t o = tk->smap[h];
            if (o < 0) { tk->smap[h] = id; break; }
            if (tk->tok[o].len == len && memcmp(tk->text + tk->tok[o].off, s, len) == 0) break;
        }
    }
    return 0;
}

static int compile_regexes(ak_tokenizer *tk, ak_error *err) {
    for (const char *const *p = pre_regexes[tk->pre]; *p; p++) {
        int code;
        PCRE2_SIZE at;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)*p, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            return ak_fail(err, "pre-tokenizer '%s': regex error at %zu: %s", tk->pre_name, (size_t)at,
                           (const char *)msg);
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* optional: the interpreter works too */
        tk->re[tk->n_re++] = re;
    }
    return 0;
}

static const char *const eot_names[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", NULL };
static const char *const eom_names[] = { "<|eom_id|>", NULL };
static const char *const fim_pad_names[] = { "<|fim_pad|>", "<fim-pad>", "<PAD>", NULL };
static const char *const fim_rep_names[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", NULL };
static const char *const fim_sep_names[] = { "<|file_sep|>", NULL };
static const char *const eog_names[] = { "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", NULL };

ak_tokenizer *ak_tokenizer_load(const gguf_file *f, ak_error *err) {
    gguf_str model;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err) < 0) return NULL;
    ak_tokenizer *tk = ak_calloc(1, sizeof *tk, err);
    if (!tk) return NULL;
    if (gguf_str_eq(model, "llama")) tk->model = MODEL_SPM;
    else if (gguf_str_eq(model, "gpt2")) tk->model = MODEL_BPE;
    else {
        ak_fail(err, "%s: unsupported tokenizer model '%.*s' (supported: llama, gpt2)", f->path,
                (int)(model.len > 64 ? 64 : model.len), model.data);
        goto fail;
    }

    if (load_vocab(tk, f, err) < 0) goto fail;
    int32_t n = tk->n_vocab;

    snprintf(tk->pre_name, sizeof tk->pre_name, "default");
    tk->bos = tk->eos = tk->eot = tk->eom = tk->unk = tk->pad = -1;
    int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
    if (tk->model == MODEL_SPM) {
        /* llama.cpp's defaults for SentencePiece vocabularies */
        tk->bos = n > 1 ? 1 : -1;
        tk->eos = n > 2 ? 2 : -1;
        tk->unk = 0;
        tk->add_bos = 1;
        tk->add_space_prefix = 1;
        tk->pre = PRE_DEFAULT;
    } else {
        const gguf_kv *pk = gguf_find(f, "tokenizer.ggml.pre");
        tk->pre = PRE_DEFAULT;
        if (pk) {
            if (pk->type != GGUF_TYPE_STRING) {
                ak_fail(err, "%s: tokenizer.ggml.pre is not a string", f->path);
                goto fail;
            }
            size_t i, np = sizeof pre_names / sizeof pre_names[0];
            for (i = 0; i < np; i++) if (gguf_str_eq(pk->v.str, pre_names[i].name)) break;
            if (i == np) {
                ak_fail(err, "%s: unknown pre-tokenizer '%.*s'", f->path,
                        (int)(pk->v.str.len > 64 ? 64 : pk->v.str.len), pk->v.str.data);
                goto fail;
            }
            tk->pre = pre_names[i].pre;
            tk->ignore_merges = tk->add_bos = pre_names[i].llama3;
            snprintf(tk->pre_name, sizeof tk->pre_name, "%s", pre_names[i].name);
        }
        if (load_merges(tk, f, err) < 0) goto fail;
        init_byte_map(tk);
        if (compile_regexes(tk, err) < 0) goto fail;
    }

    if (read_id(f, "tokenizer.ggml.bos_token_id", n, &tk->bos, err) < 0 ||
        read_id(f, "tokenizer.ggml.eos_token_id", n, &tk->eos, err) < 0 ||
        read_id(f, "tokenizer.ggml.eot_token_id", n, &tk->eot, err) < 0 ||
        read_id(f, "tokenizer.ggml.eom_token_id", n, &tk->eom, err) < 0 ||
        read_id(f, "tokenizer.ggml.unknown_token_id", n, &tk->unk, err) < 0 ||
        read_id(f, "tokenizer.ggml.padding_token_id", n, &tk->pad, err) < 0 ||
        read_id(f, "tokenizer.ggml.fim_pad_token_id", n, &fim_pad, err) < 0 ||
        read_id(f, "tokenizer.ggml.fim_rep_token_id", n, &fim_rep, err) < 0 ||
        read_id(f, "tokenizer.ggml.fim_sep_token_id", n, &fim_sep, err) < 0 ||
        read_bool(f, "tokenizer.ggml.add_bos_token", &tk->add_bos, err) < 0 ||
        read_bool(f, "tokenizer.ggml.add_eos_token", &tk->add_eos, err) < 0 ||
        read_bool(f, "tokenizer.ggml.add_space_prefix", &tk->add_space_prefix, err) < 0)
        goto fail;
    if (tk->add_bos && tk->bos < 0) {
        ak_fail(err, "%s: tokenizer.ggml.add_bos_token is set but there is no BOS token", f->path);
        goto fail;
    }
    if (tk->add_eos && tk->eos < 0) {
        ak_fail(err, "%s: tokenizer.ggml.add_eos_token is set but there is no EOS token", f->path);
        goto fail;
    }

    /* llama.cpp finds end-of-turn and FIM tokens by their text when the
     * metadata does not name them, and makes them CONTROL tokens. */
    if (tk->eot < 0) tk->eot = find_by_text(tk, eot_names);
    if (tk->eom < 0) tk->eom = find_by_text(tk, eom_names);
    if (fim_pad < 0) fim_pad = find_by_text(tk, fim_pad_names);
    if (fim_rep < 0) fim_rep = find_by_text(tk, fim_rep_names);
    if (fim_sep < 0) fim_sep = find_by_text(tk, fim_sep_names);
    int32_t fixed[] = { tk->eot, tk->eom, fim_pad, fim_rep, fim_sep };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i] >= 0) tk->type[fixed[i]] = AK_TOKEN_CONTROL;
    add_eog(tk, fim_pad);
    add_eog(tk, fim_rep);
    add_eog(tk, fim_sep);
    for (const char *const *p = eog_names; *p; p++) {
        int32_t id = vocab_find(tk, *p, strlen(*p));
        if (id >= 0) { add_eog(tk, id); tk->type[id] = AK_TOKEN_CONTROL; }
    }
    add_eog(tk, tk->eos);
    add_eog(tk, tk->eot);
    add_eog(tk, tk->eom);

    /* decoded pieces */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += 3 * (size_t)tk->tok[i].len;
    tk->piece = ak_malloc(total + 1, err);
    tk->pc = ak_malloc((size_t)n * sizeof *tk->pc, err);
    if (!tk->piece || !tk->pc) goto fail;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        tk->pc[i].off = (uint32_t)o;
        tk->pc[i].len = (uint32_t)decode_piece(tk, i, tk->piece + o);
        o += tk->pc[i].len;
        if (tk->pc[i].len > tk->max_piece) tk->max_piece = tk->pc[i].len;
    }

    if (tk->model == MODEL_SPM) {
        /* byte fallback: "<0xNN>", else the byte itself as a token, else <unk> */
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int32_t id = vocab_find(tk, name, 6);
            if (id < 0) { char c = (char)b; id = vocab_find(tk, &c, 1); }
            tk->byte_tok[b] = id >= 0 ? id : tk->unk;
        }
    }
    if (build_special(tk, err) < 0) goto fail;
    return tk;
fail:
    ak_tokenizer_free(tk);
    return NULL;
}

void ak_tokenizer_free(ak_tokenizer *tk) {
    if (!tk) return;
    for (int i = 0; i < tk->n_re; i++) pcre2_code_free(tk->re[i]);
    free(tk->text); free(tk->tok); free(tk->piece); free(tk->pc); free(tk->score); free(tk->type);
    free(tk->vmap); free(tk->mtext); free(tk->merge); free(tk->mmap);
    free(tk->special); free(tk->sord); free(tk->smap); free(tk->slens);
    free(tk);
}

/* ---- the merge queue (shared by SPM and BPE) ---------------------------------
 * A binary max-heap of candidate merges of two adjacent symbols. SPM orders by
 * score (higher first), BPE by rank (lower first: key = -rank); ties go to the
 * leftmost pair, exactly like llama.cpp's comparators. */

typedef struct { int32_t prev, next; uint32_t n; size_t off; } sym;
typedef struct { double key; int32_t left, right; uint32_t len; } bigram;
typedef struct { bigram *v; size_t n, cap; } heap;

static int before(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        bigram *v = realloc(h->v, cap * sizeof *v);
        if (!v) return -1;
        h->v = v; h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&b, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
    return 0;
}

static bigram heap_pop(heap *h) {
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Scratch memory for one ak_tokenize call (the tokenizer itself is const). */
typedef struct {
    ivec out;
    char *buf;  size_t buf_cap;   /* SPM escaped text / BPE cleaned text */
    char *wb;   size_t wb_cap;    /* BPE: one word in the byte-level alphabet */
    sym *sy;    size_t sy_cap;
    heap hp;
    struct frag { size_t off, len; } *fa, *fb;   /* pre-tokenizer fragments */
    size_t fa_n, fb_n, fa_cap, fb_cap;
    pcre2_match_data *md;
} scratch;

/* Merges adjacent symbols of sc->sy[0..nsym) in `text`, best pair first, until
 * no pair can merge. score_of returns a pair's key, or 0 with *ok = 0 when the
 * pair cannot merge. */
typedef double (*pair_fn)(const ak_tokenizer *tk, const char *l, size_t ln, const char *r, size_t rn, int *ok);

static int try_pair(const ak_tokenizer *tk, scratch *sc, const char *text, int32_t l, int32_t r, pair_fn fn) {
    if (l < 0 || r < 0) return 0;
    const sym *a = &sc->sy[l], *b = &sc->sy[r];
    int ok = 0;
    double key = fn(tk, text + a->off, a->n, text + b->off, b->n, &ok);
    if (!ok) return 0;
    bigram g = { .key = key, .left = l, .right = r, .len = a->n + b->n };
    return heap_push(&sc->hp, g);
}

static int merge_all(const ak_tokenizer *tk, scratch *sc, const char *text, size_t nsym, pair_fn fn) {
    sc->hp.n = 0;
    for (size_t i = 1; i < nsym; i++)
        if (try_pair(tk, sc, text, (int32_t)i - 1, (int32_t)i, fn) < 0) return -1;
    while (sc->hp.n) {
        bigram g = heap_pop(&sc->hp);
        sym *a = &sc->sy[g.left], *b = &sc->sy[g.right];
        /* stale: one side already merged into something else */
        if (a->n == 0 || b->n == 0 || a->n + b->n != g.len) continue;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) sc->sy[b->next].prev = g.left;
        if (try_pair(tk, sc, text, a->prev, g.left, fn) < 0) return -1;
        if (try_pair(tk, sc, text, g.left, a->next, fn) < 0) return -1;
    }
    return 0;
}

/* Cuts text[0..n) into symbols of one UTF-8 character each. */
static int split_chars(scratch *sc, const char *text, size_t n, size_t *nsym) {
    if (!GROW(sc->sy, sc->sy_cap, n + 1)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        size_t l = utf8_len((uint8_t)text[i]);
        if (l > n - i) l = n - i;
        sc->sy[k] = (sym){ .prev = (int32_t)k - 1, .next = i + l == n ? -1 : (int32_t)k + 1, .n = (uint32_t)l, .off = i };
        i += l;
    }
    *nsym = k;
    return 0;
}

/* ---- SPM ---------------------------------------------------------------------- */

static double spm_pair(const ak_tokenizer *tk, const char *l, size_t ln, const char *r, size_t rn, int *ok) {
    (void)r;   /* r follows l in the same buffer */
    int32_t id = vocab_find(tk, l, ln + rn);
    *ok = id >= 0;
    return id >= 0 ? (double)tk->score[id] : 0;
}

static int spm_encode(const ak_tokenizer *tk, scratch *sc, const char *s, size_t n, int prefix, ak_error *err) {
    size_t spaces = prefix;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    size_t len = n + prefix + 2 * spaces;
    if (!GROW(sc->buf, sc->buf_cap, len + 1)) return ak_fail(err, "out of memory");
    char *t = sc->buf;
    size_t o = 0;
    if (prefix) { memcpy(t, "\xE2\x96\x81", 3); o = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(t + o, "\xE2\x96\x81", 3); o += 3; }
        else t[o++] = s[i];
    }
    size_t nsym;
    if (split_chars(sc, t, o, &nsym) < 0 || merge_all(tk, sc, t, nsym, spm_pair) < 0)
        return ak_fail(err, "out of memory");
    for (int32_t i = nsym ? 0 : -1; i >= 0; i = sc->sy[i].next) {
        const sym *y = &sc->sy[i];
        int32_t id = vocab_find(tk, t + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(&sc->out, id) < 0) return ak_fail(err, "out of memory");
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {   /* byte fallback */
            uint8_t b = (uint8_t)t[y->off + j];
            if (tk->byte_tok[b] < 0) return ak_fail(err, "cannot encode byte 0x%02X: no byte token and no <unk>", b);
            if (ivec_push(&sc->out, tk->byte_tok[b]) < 0) return ak_fail(err, "out of memory");
        }
    }
    return 0;
}

/* ---- BPE ---------------------------------------------------------------------- */

static double bpe_pair(const ak_tokenizer *tk, const char *l, size_t ln, const char *r, size_t rn, int *ok) {
    int32_t rank = merge_rank(tk, l, ln, r, rn);
    *ok = rank >= 0;
    return -(double)rank;
}

/* One pre-tokenized word (raw bytes) -> ids. */
static int bpe_word(const ak_tokenizer *tk, scratch *sc, const char *w, size_t n, ak_error *err) {
    if (!GROW(sc->wb, sc->wb_cap, 2 * n + 1) || !GROW(sc->sy, sc->sy_cap, n + 1))
        return ak_fail(err, "out of memory");
    /* one symbol per byte, spelled in the byte-level alphabet */
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        sc->sy[i] = (sym){ .prev = (int32_t)i - 1, .next = i + 1 == n ? -1 : (int32_t)i + 1, .n = tk->b2u_len[b], .off = o };
        memcpy(sc->wb + o, tk->b2u[b], tk->b2u_len[b]);
        o += tk->b2u_len[b];
    }
    const char *t = sc->wb;
    if (tk->ignore_merges) {   /* llama3: a word that is a token is taken whole */
        int32_t id = vocab_find(tk, t, o);
        if (id >= 0) return ivec_push(&sc->out, id) < 0 ? ak_fail(err, "out of memory") : 0;
    }
    if (merge_all(tk, sc, t, n, bpe_pair) < 0) return ak_fail(err, "out of memory");
    for (int32_t i = n ? 0 : -1; i >= 0; i = sc->sy[i].next) {
        const sym *y = &sc->sy[i];
        int32_t id = vocab_find(tk, t + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(&sc->out, id) < 0) return ak_fail(err, "out of memory");
            continue;
        }
        /* not a token (odd vocabularies): llama.cpp emits the single bytes of the
         * spelling that are tokens and drops the rest */
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = vocab_find(tk, t + y->off + j, 1);
            if (b >= 0 && ivec_push(&sc->out, b) < 0) return ak_fail(err, "out of memory");
        }
    }
    return 0;
}

static int frag_push(scratch *sc, size_t off, size_t len) {
    if (!GROW(sc->fb, sc->fb_cap, sc->fb_n + 1)) return -1;
    sc->fb[sc->fb_n++] = (struct frag){ .off = off, .len = len };
    return 0;
}

static int re_match(pcre2_code *re, const char *s, size_t n, size_t at, pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)   /* very long runs: the interpreter has no such limit */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

static int bpe_encode(const ak_tokenizer *tk, scratch *sc, const char *s, size_t n, ak_error *err) {
    /* Valid UTF-8 for PCRE2: decode the lenient way llama.cpp does (bad bytes
     * become U+FFFD), re-encode canonically. Surrogates and code points past
     * U+10FFFF also become U+FFFD. */
    if (!GROW(sc->buf, sc->buf_cap, 3 * n + 1)) return ak_fail(err, "out of memory");
    char *t = sc->buf;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if ((uint8_t)s[i] < 0x80) { t[m++] = s[i++]; continue; }
        uint32_t cp = utf8_next((const uint8_t *)s, n, &i);
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
        m += utf8_put(cp, t + m);
    }

    /* pre-tokenize: every regex cuts every fragment into matches and gaps */
    sc->fb_n = 0;
    if (frag_push(sc, 0, m) < 0) return ak_fail(err, "out of memory");
    for (int r = 0; r < tk->n_re; r++) {
        struct frag *tmp = sc->fa; sc->fa = sc->fb; sc->fb = tmp;
        size_t tcap = sc->fa_cap; sc->fa_cap = sc->fb_cap; sc->fb_cap = tcap;
        sc->fa_n = sc->fb_n;
        sc->fb_n = 0;
        for (size_t k = 0; k < sc->fa_n; k++) {
            struct frag f = sc->fa[k];
            const char *fs = t + f.off;
            size_t gap = 0, at = 0;
            while (at < f.len) {
                int rc = re_match(tk->re[r], fs, f.len, at, sc->md);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[160];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    return ak_fail(err, "pre-tokenizer regex failed: %s", (const char *)msg);
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
                size_t ms = ov[0], me = ov[1];
                if (me <= ms) {   /* empty match: look again one character on */
                    at = ms + utf8_len((uint8_t)fs[ms]);
                    continue;
                }
                if ((ms > gap && frag_push(sc, f.off + gap, ms - gap) < 0) ||
                    frag_push(sc, f.off + ms, me - ms) < 0)
                    return ak_fail(err, "out of memory");
                gap = at = me;
            }
            if (gap < f.len && frag_push(sc, f.off + gap, f.len - gap) < 0) return ak_fail(err, "out of memory");
        }
    }
    for (size_t k = 0; k < sc->fb_n; k++)
        if (bpe_word(tk, sc, t + sc->fb[k].off, sc->fb[k].len, err) < 0) return -1;
    return 0;
}

/* ---- tokenize --------------------------------------------------------------------
 * Special tokens are cut out first, as llama.cpp's tokenizer_st_partition does:
 * for each special token, longest first, every remaining text fragment is
 * split at its occurrences (leftmost first). Only the tokens that occur in the
 * text at all are tried; they are found by hashing the text at each position
 * for each distinct special-token length. */

typedef struct { int32_t tok; size_t off, len; } part;   /* tok < 0: raw text */

static int eligible(const ak_tokenizer *tk, int32_t id, int parse_special) {
    return parse_special || tk->type[id] == AK_TOKEN_USER_DEFINED;
}

static int part_push(part **p, size_t *n, size_t *cap, part x) {
    if (!GROW(*p, *cap, *n + 1)) return -1;
    (*p)[(*n)++] = x;
    return 0;
}

/* Cuts text into raw fragments and special tokens. *parts is malloc'd (also
 * on failure, when it may be NULL). */
static int partition(const ak_tokenizer *tk, const char *text, size_t len, int parse_special,
                     const uint8_t *plain, part **parts, size_t *n_parts) {
    part *p = NULL;
    size_t n = 0, cap = 0;
    *parts = NULL;
    *n_parts = 0;
    if (len && part_push(&p, &n, &cap, (part){ .tok = -1, .off = 0, .len = len }) < 0) return -1;
    *parts = p; *n_parts = n;
    if (!len || !tk->n_special) return 0;

    /* which special tokens occur? (marked by their rank in tk->special) */
    uint8_t *seen = calloc((size_t)tk->n_special, 1);
    if (!seen) return -1;
    int any = 0;
    for (size_t i = 0; i < len; i++) {
        if (!tk->sfirst[(uint8_t)text[i]]) continue;
        for (int k = 0; k < tk->n_slens; k++) {
            size_t l = tk->slens[k];
            if (l > len - i) continue;
            int32_t id = special_find(tk, text + i, l);
            if (id >= 0 && eligible(tk, id, parse_special)) { seen[tk->sord[id]] = 1; any = 1; }
        }
    }
    int rc = 0;
    for (int32_t k = 0; any && k < tk->n_special && rc == 0; k++) {
        if (!seen[k]) continue;
        int32_t id = tk->special[k];
        const char *st = tk->text + tk->tok[id].off;
        size_t sl = tk->tok[id].len;
        part *q = NULL;
        size_t qn = 0, qcap = 0;
        for (size_t j = 0; j < n && rc == 0; j++) {
            if (p[j].tok >= 0) { rc = part_push(&q, &qn, &qcap, p[j]); continue; }
            size_t pos = p[j].off, end = p[j].off + p[j].len, from = pos;
            const char *hit;
            while (rc == 0 && (hit = memmem(text + from, end - from, st, sl)) != NULL) {
                size_t h = (size_t)(hit - text);
                /* a control token may not take any byte the caller marked plain */
                if (plain && tk->type[id] != AK_TOKEN_USER_DEFINED && memchr(plain + h, 1, sl)) {
                    from = h + 1;
                    continue;
                }
                if (h > pos) rc = part_push(&q, &qn, &qcap, (part){ .tok = -1, .off = pos, .len = h - pos });
                if (rc == 0) rc = part_push(&q, &qn, &qcap, (part){ .tok = id, .off = h, .len = sl });
                pos = from = h + sl;
            }
            if (rc == 0 && pos < end) rc = part_push(&q, &qn, &qcap, (part){ .tok = -1, .off = pos, .len = end - pos });
        }
        free(p);
        p = q; n = qn;
        *parts = p; *n_parts = n;
    }
    free(seen);
    return rc;
}

int ak_tokenize(const ak_tokenizer *tk, const char *text, size_t len, int flags,
                int32_t **ids, size_t *n_ids, ak_error *err) {
    return ak_tokenize_masked(tk, text, len, flags, NULL, ids, n_ids, err);
}

int ak_tokenize_masked(const ak_tokenizer *tk, const char *text, size_t len, int flags, const uint8_t *plain,
                       int32_t **ids, size_t *n_ids, ak_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return ak_fail(err, "ak_tokenize: NULL text");
    if (len > (size_t)INT32_MAX / 4) return ak_fail(err, "ak_tokenize: text of %zu bytes is too long", len);
    int add = flags & AK_TOK_ADD_SPECIAL, parse = flags & AK_TOK_PARSE_SPECIAL;
    scratch sc = { 0 };
    part *parts = NULL;
    size_t n_parts = 0;
    int rc = -1;
    if (partition(tk, text, len, parse, plain, &parts, &n_parts) < 0) { ak_fail(err, "out of memory"); goto done; }
    if (tk->model == MODEL_BPE) {
        sc.md = pcre2_match_data_create(8, NULL);
        if (!sc.md) { ak_fail(err, "out of memory"); goto done; }
    }
    if (add && tk->add_bos && ivec_push(&sc.out, tk->bos) < 0) { ak_fail(err, "out of memory"); goto done; }
    /* SPM: the dummy prefix goes at the start and after special tokens */
    int prev_special = !(flags & AK_TOK_CONTINUE);
    for (size_t i = 0; i < n_parts; i++) {
        if (parts[i].tok >= 0) {
            if (ivec_push(&sc.out, parts[i].tok) < 0) { ak_fail(err, "out of memory"); goto done; }
            prev_special = 1;
            continue;
        }
        const char *s = text + parts[i].off;
        if (tk->model == MODEL_SPM) {
            if (spm_encode(tk, &sc, s, parts[i].len, tk->add_space_prefix && prev_special, err) < 0) goto done;
        } else {
            if (bpe_encode(tk, &sc, s, parts[i].len, err) < 0) goto done;
        }
        prev_special = 0;
    }
    if (add && tk->add_eos && ivec_push(&sc.out, tk->eos) < 0) { ak_fail(err, "out of memory"); goto done; }
    if (!sc.out.v && !(sc.out.v = malloc(sizeof(int32_t)))) { ak_fail(err, "out of memory"); goto done; }
    *ids = sc.out.v;
    *n_ids = sc.out.n;
    sc.out.v = NULL;
    rc = 0;
done:
    free(parts);
    free(sc.out.v); free(sc.buf); free(sc.wb); free(sc.sy); free(sc.hp.v); free(sc.fa); free(sc.fb);
    if (sc.md) pcre2_match_data_free(sc.md);
    return rc;
}

/* ---- accessors ---------------------------------------------------------------- */

int ak_token_bytes(const ak_tokenizer *tk, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= tk->n_vocab) { *bytes = ""; *len = 0; return -1; }
    *bytes = tk->piece + tk->pc[id].off;
    *len = tk->pc[id].len;
    return 0;
}

int ak_token_text(const ak_tokenizer *tk, int32_t id, const char **text, size_t *len) {
    if (id < 0 || id >= tk->n_vocab) { *text = ""; *len = 0; return -1; }
    *text = tk->text + tk->tok[id].off;
    *len = tk->tok[id].len;
    return 0;
}

int32_t ak_token_lookup(const ak_tokenizer *tk, const char *piece, size_t len) {
    return vocab_find(tk, piece, len);
}

int ak_token_type(const ak_tokenizer *tk, int32_t id) {
    return id < 0 || id >= tk->n_vocab ? -1 : tk->type[id];
}

int ak_token_is_eog(const ak_tokenizer *tk, int32_t id) {
    if (id < 0) return 0;
    for (int i = 0; i < tk->n_eog; i++) if (tk->eog[i] == id) return 1;
    return 0;
}

int32_t ak_tokenizer_vocab_size(const ak_tokenizer *tk) { return tk->n_vocab; }
int32_t ak_tokenizer_bos(const ak_tokenizer *tk) { return tk->bos; }
int32_t ak_tokenizer_eos(const ak_tokenizer *tk) { return tk->eos; }
int32_t ak_tokenizer_eot(const ak_tokenizer *tk) { return tk->eot; }
int32_t ak_tokenizer_unk(const ak_tokenizer *tk) { return tk->unk; }
int32_t ak_tokenizer_pad(const ak_tokenizer *tk) { return tk->pad; }
int ak_tokenizer_add_bos(const ak_tokenizer *tk) { return tk->add_bos; }
int ak_tokenizer_add_eos(const ak_tokenizer *tk) { return tk->add_eos; }
int ak_tokenizer_add_space_prefix(const ak_tokenizer *tk) { return tk->add_space_prefix; }
const char *ak_tokenizer_model_name(const ak_tokenizer *tk) { return tk->model == MODEL_SPM ? "llama" : "gpt2"; }
const char *ak_tokenizer_pre_name(const ak_tokenizer *tk) { return tk->pre_name; }
size_t ak_tokenizer_max_piece(const ak_tokenizer *tk) { return tk->max_piece; }

char *ak_detokenize(const ak_tokenizer *tk, const int32_t *ids, size_t n, size_t *len, ak_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tk->n_vocab) {
            ak_fail(err, "token id %d out of range (vocabulary of %d tokens)", ids[i], tk->n_vocab);
            return NULL;
        }
        total += tk->pc[ids[i]].len;
    }
    char *s = ak_malloc(total + 1, err);
    if (!s) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + o, tk->piece + tk->pc[ids[i]].off, tk->pc[ids[i]].len);
        o += tk->pc[ids[i]].len;
    }
    s[o] = 0;
    if (len) *len = o;
    return s;
}

/* ---- streaming UTF-8 decoder ----------------------------------------------------- */

/* Classifies the bytes b[0..n) as the start of one UTF-8 character:
 *   > 0  a complete valid character of that many bytes (== n)
 *   0    a valid but incomplete prefix
 *   < 0  invalid: the first -r bytes are a maximal invalid subpart */
static int utf8_classify(const uint8_t *b, unsigned n) {
    uint8_t c = b[0];
    if (c < 0x80) return 1;
    unsigned need;
    uint8_t lo = 0x80, hi = 0xBF;   /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (unsigned i = 1; i < n && i < need; i++) {
        uint8_t x = b[i];
        int ok = i == 1 ? (x >= lo && x <= hi) : (x & 0xC0) == 0x80;
        if (!ok) return -(int)i;
    }
    return n >= need ? (int)need : 0;
}

void ak_detok_init(ak_detok *d) { memset(d, 0, sizeof *d); }

size_t ak_detok_bound(const ak_tokenizer *tk) { return 3 * (tk->max_piece + 3); }

int ak_detok_push(ak_detok *d, const ak_tokenizer *tk, int32_t id, char *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (id < 0 || id >= tk->n_vocab) return -1;
    const uint8_t *s = (const uint8_t *)tk->piece + tk->pc[id].off;
    size_t n = tk->pc[id].len, o = 0;
    if (cap < 3 * (n + d->n_pend)) return -1;
    for (size_t i = 0; i < n; i++) {
        if (d->n_pend == 0 && s[i] < 0x80) { out[o++] = (char)s[i]; continue; }
        d->pend[d->n_pend++] = s[i];
        while (d->n_pend) {
            int r = utf8_classify(d->pend, d->n_pend);
            if (r == 0) break;   /* wait for more bytes */
            if (r > 0) {
                memcpy(out + o, d->pend, (size_t)r);
                o += (size_t)r;
                d->n_pend = 0;
                break;
            }
            memcpy(out + o, "\xEF\xBF\xBD", 3);   /* U+FFFD for the invalid part */
            o += 3;
            unsigned k = (unsigned)-r;
            memmove(d->pend, d->pend + k, d->n_pend - k);
            d->n_pend -= k;
        }
    }
    *n_out = o;
    return 0;
}

size_t ak_detok_flush(ak_detok *d, char *out, size_t cap) {
    if (!d->n_pend) return 0;
    if (cap < 3) return 0;
    memcpy(out, "\xEF\xBF\xBD", 3);   /* an incomplete character is one maximal subpart */
    d->n_pend = 0;
    return 3;
}
