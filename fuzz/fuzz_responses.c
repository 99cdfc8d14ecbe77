/* fuzz_responses.c - libFuzzer target for the Responses API's reading
 * (src/serve/responses_in.c): a POST /v1/responses body, parsed as JSON,
 * read into the chat body it means, and its input items' chain hash.
 *
 * Input layout: bytes 0..n-1 a JSON text; when it holds a byte 0, the text
 * before it is the request and the text after it the history (an array of
 * items, as a stored chain gives).
 * Checked, besides crashes and sanitizer reports:
 *   - a body that is read gives a chat body with a "messages" array whose
 *     every message has a string role among system, developer, user,
 *     assistant, tool;
 *   - a refusal carries a status of 400 or 500 and a message;
 *   - the chain hash of the input items, whole, equals the hash continued
 *     item by item (the rule a resent conversation is matched by).
 * Run with `make fuzz FUZZ_TARGETS=responses`. Seeds: fuzz/corpus/responses/.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/responses.h"

#define MUST(cond, what)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "fuzz_responses: %s (line %d)\n", what, __LINE__);  \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* 1 when m is {"role": one of the chat roles, ...}. */
static int message_ok(const cJSON *m) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsObject(m) || !cJSON_IsString(r)) return 0;
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (!strcmp(r->valuestring, roles[i])) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n_req = nul ? (size_t)(nul - data) : size;
    cJSON *req = cJSON_ParseWithLength((const char *)data, n_req);
    cJSON *hist = nul ? cJSON_ParseWithLength((const char *)nul + 1, size - n_req - 1) : NULL;
    if (hist && !cJSON_IsArray(hist)) {
        cJSON_Delete(hist);
        hist = NULL;
    }
    cJSON *chat = NULL;
    ak_api_error b = {0};
    if (req && ak_resp_chat_body(req, hist, &chat, &b) == 0) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages"), *m;
        MUST(cJSON_IsArray(msgs), "no messages array");
        cJSON_ArrayForEach(m, msgs) MUST(message_ok(m), "a message without a chat role");
        cJSON *items = ak_resp_input_items(req);
        if (items) {
            int k = cJSON_GetArraySize(items);
            uint64_t h = 0;
            const cJSON *it;
            cJSON_ArrayForEach(it, items) h = ak_resp_item_hash(h, it);
            MUST(h == ak_resp_chain_hash(0, items, k), "the chain hash is not the items' hashes chained");
            cJSON_Delete(items);
        }
    } else if (req) {
        MUST((b.status == 400 || b.status == 500) && b.msg[0], "a refusal without status or message");
    }
    cJSON_Delete(chat);
    cJSON_Delete(req);
    cJSON_Delete(hist);
    return 0;
}
