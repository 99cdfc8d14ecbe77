/* store_seal.c - encryption at rest for agent files: libsodium's
 * crypto_secretstream_xchacha20poly1305 over the safetensors image, in
 * chunks (layout in store_impl.h and docs/agent-file-format.md).
 *
 * Why secretstream: it authenticates every chunk and their order, and the
 * final tag makes truncation at a chunk boundary detectable, so a sealed file
 * can be opened as a stream without trusting a byte before its tag checked.
 * The plain header and the agent id are passed as additional data of every
 * chunk: changing the chunk size, image size or key id, or giving the file
 * another agent's name, breaks the first tag.
 */
#include "store/store_impl.h"

#include <string.h>

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* sodium_init is itself thread-safe and idempotent (returns 1 when already
 * done), so no once-flag of our own is needed. */
int ak_seal_init(void) { return sodium_init() < 0 ? -1 : 0; }

void ak_seal_key_id(const uint8_t key[32], uint8_t id[8]) {
    static const char label[] = "agentkv key id v1";
    crypto_generichash(id, 8, (const unsigned char *)label, sizeof label - 1, key, 32);
}

uint64_t ak_seal_file_bytes(uint64_t plain_bytes, uint32_t chunk) {
    if (chunk == 0) return 0;
    uint64_t n = plain_bytes / chunk + (plain_bytes % chunk != 0), r;
    if (__builtin_mul_overflow(n, (uint64_t)AK_SEAL_ABYTES, &r)) return 0;
    if (__builtin_add_overflow(r, plain_bytes, &r)) return 0;
    if (__builtin_add_overflow(r, (uint64_t)AK_SEAL_HEADER_BYTES, &r)) return 0;
    return r;
}

void ak_seal_parse(const uint8_t hdr[AK_SEAL_HEADER_BYTES], ak_seal_info *out) {
    out->version = get_u32(hdr + 8);
    out->chunk = get_u32(hdr + 12);
    out->plain_bytes = get_u64(hdr + 16);
    memcpy(out->key_id, hdr + 24, 8);
}

/* The additional data of every chunk: the header's first bytes, the id. */
static void set_ad(ak_seal *z, const uint8_t *hdr, const char *id) {
    size_t n = strnlen(id ? id : "", AK_SEAL_ID_MAX);
    memcpy(z->ad, hdr, AK_SEAL_AD_BYTES);
    memcpy(z->ad + AK_SEAL_AD_BYTES, id ? id : "", n);
    z->ad_len = AK_SEAL_AD_BYTES + n;
}

size_t ak_seal_next_bytes(const ak_seal *z) {
    uint64_t rest = z->plain_bytes - z->done;
    return rest < z->chunk ? (size_t)rest : z->chunk;
}

void ak_seal_begin(ak_seal *z, const uint8_t key[32], uint64_t plain_bytes, uint32_t chunk, const char *id,
                   uint8_t hdr[AK_SEAL_HEADER_BYTES]) {
    memcpy(hdr, AK_SEAL_MAGIC, 8);
    put_u32(hdr + 8, AK_SEAL_VERSION);
    put_u32(hdr + 12, chunk);
    put_u64(hdr + 16, plain_bytes);
    ak_seal_key_id(key, hdr + 24);
    set_ad(z, hdr, id);
    z->chunk = chunk;
    z->plain_bytes = plain_bytes;
    z->done = 0;
    crypto_secretstream_xchacha20poly1305_init_push(&z->st, hdr + AK_SEAL_AD_BYTES, key);
}

size_t ak_seal_push(ak_seal *z, const uint8_t *in, uint8_t *out) {
    size_t n = ak_seal_next_bytes(z);
    int last = z->done + n == z->plain_bytes;
    unsigned long long clen = 0;
    crypto_secretstream_xchacha20poly1305_push(&z->st, out, &clen, in, n, z->ad, z->ad_len,
                                               last ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
                                                    : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
    z->done += n;
    return (size_t)clen;
}

int ak_unseal_begin(ak_seal *z, const uint8_t key[32], const uint8_t hdr[AK_SEAL_HEADER_BYTES], const char *id) {
    ak_seal_info in;
    ak_seal_parse(hdr, &in);
    set_ad(z, hdr, id);
    z->chunk = in.chunk;
    z->plain_bytes = in.plain_bytes;
    z->done = 0;
    return crypto_secretstream_xchacha20poly1305_init_pull(&z->st, hdr + AK_SEAL_AD_BYTES, key) == 0 ? 0 : -1;
}

int ak_unseal_pull(ak_seal *z, const uint8_t *in, uint8_t *out) {
    size_t n = ak_seal_next_bytes(z);
    int last = z->done + n == z->plain_bytes;
    unsigned char tag = 0;
    unsigned long long mlen = 0;
    if (crypto_secretstream_xchacha20poly1305_pull(&z->st, out, &mlen, &tag, in, n + AK_SEAL_ABYTES, z->ad,
                                                   z->ad_len) != 0)
        return -1;
    if (mlen != n) return -1;
    unsigned char want = last ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
                              : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE;
    if (tag != want) return -2;
    z->done += n;
    return 0;
}
