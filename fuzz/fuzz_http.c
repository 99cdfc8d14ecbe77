/* fuzz_http.c - libFuzzer target for the OpenAI request bodies the server
 * accepts (src/serve/api.c: /v1/chat/completions and /v1/completions parsing,
 * messages and content parts, stop strings, sampling fields, the agent id
 * from the header or the body, chat rendering and tokenization of every
 * template family).
 *
 * Input layout:
 *   byte 0    bit 0: chat (1) or completions (0); bits 1-4: chat family
 *             (ak_chat_family, taken mod the number of families); bit 5: an
 *             X-Agent-Id header follows
 *   if bit 5: byte 1 = header length L, then L bytes of header value (cut at
 *             a NUL, as HTTP headers cannot carry one)
 *   the rest  the request body, as received (any bytes, not NUL-terminated)
 * The tokenizer is loaded once from AK_FUZZ_MODEL (default
 * ../shared/models/stories260K.gguf; `make fuzz` passes the shared one).
 * Checked, besides crashes and sanitizer reports:
 *   - accepted: 1 <= tokens < context, every id inside the vocabulary,
 *     1 <= max_tokens <= context - tokens, the stop strings non-empty, valid
 *     UTF-8 (utf8_check.h) and at most AK_MAX_STOP, the agent id empty or
 *     valid, the logit biases inside the vocabulary and [-100, 100], the
 *     penalties inside OpenAI's ranges;
 *   - refused: status 400, 404 or 500 with a message.
 * Seeds: fuzz/corpus/http/ (realistic bodies of both endpoints, with an
 * agent header or not). Run with `make fuzz FUZZ_TARGETS=http`.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"
#include "base/gguf.h"
#include "utf8_check.h"

static ak_tokenizer *load_tokenizer(void) {
    const char *path = getenv("AK_FUZZ_MODEL");
    if (!path || !*path) path = "../shared/models/stories260K.gguf";
    gguf_file f;
    ak_error err = {0};
    if (gguf_open(&f, path, &err) < 0) {
        fprintf(stderr, "fuzz_http: %s (set AK_FUZZ_MODEL)\n", err.msg);
        abort();
    }
    ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
    gguf_close(&f);
    if (!tk) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        abort();
    }
    return tk;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ak_tokenizer *tk;
    if (!tk) tk = load_tokenizer();
    if (size < 1) return 0;
    int chat = data[0] & 1;
    ak_chat_family fam = (ak_chat_family)(((data[0] >> 1) & 15) % AK_CHAT_N_FAMILIES);
    size_t at = 1;
    char hdr[256];
    const char *header = NULL;
    if (data[0] & 32) {
        if (size < 2) return 0;
        size_t l = data[1];
        at = 2;
        if (l > size - at) l = size - at;
        memcpy(hdr, data + at, l);
        hdr[l] = 0;   /* a NUL inside cuts it, as a header value would be */
        header = hdr;
        at += l;
    }
    const int n_ctx = 4096;
    ak_api_config cfg = {.tok = tk, .model_id = "m", .family = fam, .n_ctx = n_ctx};
    /* the body in a buffer of its own size: reads past it are caught */
    size_t n = size - at;
    char *body = malloc(n ? n : 1);
    if (!body) return 0;
    memcpy(body, data + at, n);
    ak_api_request r;
    ak_api_error e;
    int rc = ak_api_parse(&cfg, body, n, chat, header, 42, &r, &e);
    free(body);
    if (rc == 0) {
        int32_t vocab = ak_tokenizer_vocab_size(tk);
        if (r.n_tokens < 1 || r.n_tokens >= (size_t)n_ctx) abort();
        for (size_t i = 0; i < r.n_tokens; i++)
            if (r.tokens[i] < 0 || r.tokens[i] >= vocab) abort();
        if (r.max_tokens < 1 || (size_t)r.max_tokens > (size_t)n_ctx - r.n_tokens) abort();
        if (r.n_stop < 0 || r.n_stop > AK_MAX_STOP) abort();
        for (int i = 0; i < r.n_stop; i++)
            if (!r.stop[i] || !r.stop[i][0] || !utf8_valid((const unsigned char *)r.stop[i], strlen(r.stop[i]))) abort();
        for (int i = 0; i < r.sp.n_logit_bias; i++)
            if (r.sp.logit_bias[i].id < 0 || r.sp.logit_bias[i].id >= vocab || !(fabsf(r.sp.logit_bias[i].bias) <= 100))
                abort();
        if (!(fabsf(r.sp.frequency_penalty) <= 2 && fabsf(r.sp.presence_penalty) <= 2)) abort();
        if (r.agent_id[0] && !ak_agent_id_valid(r.agent_id)) abort();
        if (r.chat != chat) abort();
    } else {
        if (e.status != 400 && e.status != 404 && e.status != 500) abort();
        if (!e.msg[0]) abort();
    }
    ak_api_request_free(&r);
    return 0;
}
