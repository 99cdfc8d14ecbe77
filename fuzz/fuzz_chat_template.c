/* fuzz_chat_template.c - libFuzzer target for chat-template detection from
 * hostile model metadata, and rendering (src/text/chat.c).
 *
 * Input layout (fields are cut from the front; a short input leaves the
 * later fields empty):
 *   u16 LE  A, then A bytes: general.architecture (any bytes)
 *   u16 LE  T, then T bytes: tokenizer.chat_template (any bytes, NULs too);
 *           T = 0xFFFF: the key is stored as a u32 instead of a string
 *   u8      flags: bit 0 add_generation_prompt, bit 1 bos/eos given
 *   the rest  messages separated by byte 0x1E: each one role byte (modulo
 *           6: 0 system, 1 user, 2 assistant, 3 an unknown role "function",
 *           4 a tool result, 5 an assistant message with a call of "f"
 *           whose arguments are its content), then its content (cut at a
 *           NUL byte, as C strings are)
 * A GGUF image holding the two keys is built in memory and parsed; then the
 * family is detected from it and the messages rendered in every family.
 * Checked, besides crashes and sanitizer reports:
 *   - detection from the metadata agrees with detection on the copied text
 *     (when the template holds no NUL, which a C string cannot carry);
 *   - rendering succeeds exactly when chat.h says it must (roles known;
 *     mistral, but in Small 3.2's form: no system message after the first),
 *     with *out NULL on failure;
 *   - chatml, which copies content verbatim, contains every message's content;
 *   - the tracked rendering (ak_chat_render_tracked) is the rendering with
 *     the generation prompt, its spans inside the text and in order;
 *   - a conversation resent over a history (chat_resend.h; the tokenizer of
 *     AK_FUZZ_MODEL), in the family flags bits 2.. pick: the history is the
 *     prompt before the last assistant message and that message's text one
 *     character at a time, then the input's last bytes as token ids; the
 *     rebuild never fails, replaces at most the assistant messages, returns
 *     a prompt exactly when it replaced one, of ids in the vocabulary.
 * Run with `make fuzz FUZZ_TARGETS=chat_template`. Seeds:
 * fuzz/corpus/chat_template/ (the real templates of ../shared/golden/templates).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/chat_resend.h"
#include "base/gguf.h"

#define MAX_MSG 16

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(buf *b, const void *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

/* Takes a u16-prefixed field from *d / *n; *len gets its length (0xFFFF is
 * returned as is, with no bytes taken). */
static const uint8_t *field(const uint8_t **d, size_t *n, size_t *len) {
    if (*n < 2) {
        *len = 0;
        *n = 0;
        return *d;
    }
    size_t l = (*d)[0] | (size_t)(*d)[1] << 8;
    *d += 2;
    *n -= 2;
    *len = l;
    if (l == 0xFFFF) return *d;
    if (l > *n) *len = l = *n;
    const uint8_t *f = *d;
    *d += l;
    *n -= l;
    return f;
}

/* The tokenizer of AK_FUZZ_MODEL, loaded once (NULL without one). */
static const ak_tokenizer *fuzz_tokenizer(void) {
    static int tried;
    static ak_tokenizer *tk;
    if (!tried) {
        tried = 1;
        const char *path = getenv("AK_FUZZ_MODEL");
        gguf_file f;
        ak_error err = {{0}};
        if (path && gguf_open(&f, path, &err) == 0) {
            tk = ak_tokenizer_load(&f, &err);
            gguf_close(&f);
        }
    }
    return tk;
}

/* Appends text's ids one UTF-8 character at a time to v (cap MAX_HIST). */
#define MAX_HIST 4096
static int push_chars(const ak_tokenizer *tk, const char *text, int32_t *v, int n) {
    for (size_t i = 0; text[i] && n < MAX_HIST;) {
        size_t k = 1;
        while (k < 4 && ((unsigned char)text[i + k] & 0xC0) == 0x80) k++;
        int32_t *ids = NULL;
        size_t m = 0;
        ak_error err = {{0}};
        if (ak_tokenize(tk, text + i, k, AK_TOK_CONTINUE, &ids, &m, &err) == 0)
            for (size_t j = 0; j < m && n < MAX_HIST; j++) v[n++] = ids[j];
        free(ids);
        i += k;
    }
    return n;
}

/* The tracked rendering and the rebuild over a history (see the top). */
static void check_resend(ak_chat_family fam, const ak_chat_msg *msgs, int n, const char *text, const uint8_t *tail,
                         size_t tail_len) {
    ak_chat_rendering r;
    ak_error err = {{0}};
    char *plain = NULL;
    const ak_chat_opts o = {.family = fam, .template_text = text, .add_generation_prompt = 1};
    if (ak_chat_render_tracked(msgs, n, &o, &r, &err) < 0) __builtin_trap();   /* rendered above */
    if (ak_chat_render(msgs, n, &o, &plain, &err) < 0 || strlen(plain) != r.len ||
        memcmp(plain, r.text, r.len))
        __builtin_trap();
    free(plain);
    long last = -1;
    for (int i = 0; i < n; i++) {
        const ak_chat_span *sp = &r.spans[i];
        if (sp->at < 0) continue;
        if (sp->open < 0 || sp->open > sp->at || sp->at > sp->end || sp->end > (long)r.len) __builtin_trap();
        if (!strcmp(msgs[i].role, "assistant")) {
            if (sp->open < last) __builtin_trap();
            last = sp->end;
        }
    }
    ak_chat_rendering_free(&r);
    const ak_tokenizer *tk = fuzz_tokenizer();
    if (!tk) return;
    int la = -1, n_assistant = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(msgs[i].role, "assistant")) la = i, n_assistant++;
    static int32_t hist[MAX_HIST];
    int nh = 0;
    if (la > 0) {
        int32_t *ids = NULL;
        size_t k = 0;
        if (ak_chat_tokenize(msgs, la, &o, tk, AK_TOK_ADD_SPECIAL, &ids, &k, &err) == 0)
            for (size_t j = 0; j < k && nh < MAX_HIST; j++) hist[nh++] = ids[j];
        free(ids);
        nh = push_chars(tk, msgs[la].content, hist, nh);
    }
    int vocab = ak_tokenizer_vocab_size(tk);
    for (size_t j = 0; j + 1 < tail_len && nh < MAX_HIST; j += 2) hist[nh++] = (tail[j] | tail[j + 1] << 8) % vocab;
    ak_chat_resent rs = {.n_replaced = -1};
    if (ak_chat_tokenize_resent(msgs, n, &o, tk, hist, nh, &rs, &err) < 0) __builtin_trap();
    if (rs.n_replaced < 0 || rs.n_replaced > n_assistant || (rs.n_replaced == 0) != (rs.ids == NULL)) __builtin_trap();
    for (size_t j = 0; j < rs.n_ids; j++)
        if (rs.ids[j] < 0 || rs.ids[j] >= vocab) __builtin_trap();
    free(rs.ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t alen, tlen;
    const uint8_t *arch = field(&data, &size, &alen);
    if (alen == 0xFFFF) alen = 0;
    const uint8_t *tmpl = field(&data, &size, &tlen);
    int flags = 0;
    if (size) {
        flags = data[0];
        data++;
        size--;
    }

    buf g = {0};
    put_u32(&g, GGUF_MAGIC);
    put_u32(&g, 3);
    put_u64(&g, 0);   /* tensors */
    put_u64(&g, 2);   /* metadata pairs */
    put_str(&g, "general.architecture", 20);
    put_u32(&g, GGUF_TYPE_STRING);
    put_str(&g, arch, alen);
    put_str(&g, "tokenizer.chat_template", 23);
    if (tlen == 0xFFFF) {
        put_u32(&g, GGUF_TYPE_UINT32);
        put_u32(&g, 7);
    } else {
        put_u32(&g, GGUF_TYPE_STRING);
        put_str(&g, tmpl, tlen);
    }
    gguf_file f;
    ak_error err = {{0}};
    if (gguf_open_buffer(&f, g.p, g.n, "chat-fuzz", &err) < 0) __builtin_trap();  /* a well-formed image */

    ak_chat_family fam = ak_chat_detect_gguf(&f);
    char *text = ak_chat_template_gguf(&f, &err);
    if (tlen == 0xFFFF) {
        if (text || fam != AK_CHAT_PLAIN) __builtin_trap();   /* not a string: no template */
    } else {
        if (!text) __builtin_trap();
        if (!memchr(tmpl, 0, tlen) && ak_chat_detect(text) != fam) __builtin_trap();
    }
    (void)ak_chat_family_name(fam);

    /* messages; the last 16 bytes also serve as token ids (check_resend) */
    const uint8_t *tail = size > 16 ? data + size - 16 : data;
    size_t tail_len = size > 16 ? 16 : size;
    static const char *const roles[] = {"system", "user", "assistant", "function", "tool", "assistant"};
    ak_chat_msg msgs[MAX_MSG];
    char *contents[MAX_MSG];
    ak_chat_call calls[MAX_MSG];
    int n = 0, bad_role = 0, late_system = 0;
    while (size && n < MAX_MSG) {
        const uint8_t *end = memchr(data, 0x1E, size);
        size_t l = end ? (size_t)(end - data) : size;
        int r = l ? data[0] % 6 : 1;   /* an empty field: an empty user message */
        size_t cl = l ? l - 1 : 0;
        char *c = malloc(cl + 1);
        if (!c) abort();
        if (cl) memcpy(c, data + 1, cl);
        c[cl] = 0;
        contents[n] = c;
        calls[n] = (ak_chat_call){.id = "call_x", .name = "f", .arguments = c};
        msgs[n] = (ak_chat_msg){.role = roles[r], .content = c, .calls = r == 5 ? &calls[n] : NULL, .n_calls = r == 5};
        bad_role |= r == 3;
        late_system |= r == 0 && n > 0;
        n++;
        data += end ? l + 1 : l;
        size -= end ? l + 1 : l;
    }
    const char *bos = flags & 2 ? "<s>" : NULL, *eos = flags & 2 ? "</s>" : NULL;
    for (int fi = 0; fi < AK_CHAT_N_FAMILIES; fi++) {
        char *out = (char *)1;
        const ak_chat_opts o = {.family = (ak_chat_family)fi, .template_text = text, .add_generation_prompt = flags & 1,
                                .bos = bos, .eos = eos};
        int rc = ak_chat_render(msgs, n, &o, &out, &err);
        int must_fail = n < 1 || bad_role ||
                        (fi == AK_CHAT_MISTRAL && late_system && !(text && strstr(text, "[SYSTEM_PROMPT]")));
        if (must_fail != (rc < 0)) __builtin_trap();
        if (rc < 0) {
            if (out) __builtin_trap();
            continue;
        }
        if (!out) __builtin_trap();
        if (fi == AK_CHAT_CHATML)
            for (int i = 0; i < n; i++)
                if (!strstr(out, msgs[i].content)) __builtin_trap();
        free(out);
        if (fi == (flags >> 2) % AK_CHAT_N_FAMILIES) check_resend((ak_chat_family)fi, msgs, n, text, tail, tail_len);
    }
    for (int i = 0; i < n; i++) free(contents[i]);
    free(text);
    gguf_close(&f);
    free(g.p);
    return 0;
}
