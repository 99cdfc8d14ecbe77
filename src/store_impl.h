/* store_impl.h - internals shared by store.c and store_seal.c (not an API).
 *
 * A sealed file (see docs/agent-file-format.md) is
 *     plain header   56 bytes:
 *         0  "AKVSEAL1"            magic
 *         8  u32 LE version        2
 *         12 u32 LE chunk_bytes    plaintext bytes per chunk (4 KiB .. 16 MiB)
 *         16 u64 LE plain_bytes    size of the sealed safetensors image
 *         24 8 bytes key id        BLAKE2b-64 keyed by the key, of "agentkv key id v1"
 *         32 24 bytes              crypto_secretstream_xchacha20poly1305 header
 *     chunks         ceil(plain_bytes / chunk_bytes) of them, each the next
 *                    chunk_bytes (the last: the rest) of the image pushed
 *                    through the secretstream with additional data the first
 *                    32 header bytes followed by the agent id (its bytes, no
 *                    terminator), so 17 bytes longer; the last carries
 *                    TAG_FINAL, every other TAG_MESSAGE.
 * The id in the additional data binds the file to its agent: the file of one
 * agent copied or renamed to another's name fails authentication in its
 * first chunk. Version 1 (additional data: the 32 header bytes only) is no
 * longer read (STALE: the agent recomputes and is re-saved as version 2).
 */
#ifndef AK_STORE_IMPL_H
#define AK_STORE_IMPL_H

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#define AK_SEAL_MAGIC "AKVSEAL1"
#define AK_SEAL_VERSION 2u
#define AK_SEAL_AD_BYTES 32            /* the header bytes in the additional data */
#define AK_SEAL_ID_MAX 128             /* = AK_AGENT_ID_MAX: the id after them */
#define AK_SEAL_HEADER_BYTES (AK_SEAL_AD_BYTES + crypto_secretstream_xchacha20poly1305_HEADERBYTES)
#define AK_SEAL_ABYTES crypto_secretstream_xchacha20poly1305_ABYTES
#define AK_SEAL_CHUNK (64u * 1024)
#define AK_SEAL_MIN_CHUNK 4096u
#define AK_SEAL_MAX_CHUNK (16u * 1024 * 1024)

typedef struct {
    uint32_t version;
    uint32_t chunk;
    uint64_t plain_bytes;
    uint8_t key_id[8];
} ak_seal_info;

typedef struct {
    crypto_secretstream_xchacha20poly1305_state st;
    uint8_t ad[AK_SEAL_AD_BYTES + AK_SEAL_ID_MAX];   /* header bytes, agent id */
    size_t ad_len;
    uint32_t chunk;
    uint64_t plain_bytes;
    uint64_t done;      /* plaintext bytes pushed or pulled so far */
} ak_seal;

/* Calls sodium_init once (thread-safe). Returns 0, or -1 if libsodium cannot
 * start. */
int ak_seal_init(void);
/* The 8-byte public identifier of a key (a keyed hash: reveals nothing). */
void ak_seal_key_id(const uint8_t key[32], uint8_t id[8]);
/* Size of the sealed file for an image of plain_bytes in chunks of chunk
 * bytes; 0 on overflow. */
uint64_t ak_seal_file_bytes(uint64_t plain_bytes, uint32_t chunk);
/* Decodes the fixed fields of a plain header (the caller checked the
 * magic). */
void ak_seal_parse(const uint8_t hdr[AK_SEAL_HEADER_BYTES], ak_seal_info *out);

/* Starts sealing an image of plain_bytes (>= 1) for agent id (at most
 * AK_SEAL_ID_MAX bytes; longer is cut) and writes the header. */
void ak_seal_begin(ak_seal *z, const uint8_t key[32], uint64_t plain_bytes, uint32_t chunk, const char *id,
                   uint8_t hdr[AK_SEAL_HEADER_BYTES]);
/* Seals the next chunk: in holds the next min(chunk, plain_bytes - done)
 * bytes of the image; out gets that many + AK_SEAL_ABYTES. Returns the bytes
 * written to out. */
size_t ak_seal_push(ak_seal *z, const uint8_t *in, uint8_t *out);

/* Starts opening a sealed file of agent id whose header is hdr (key
 * already matched by key id). Returns 0, or -1 if the secretstream header is
 * rejected. */
int ak_unseal_begin(ak_seal *z, const uint8_t key[32], const uint8_t hdr[AK_SEAL_HEADER_BYTES], const char *id);
/* Opens the next chunk (in: its min(chunk, rest) + AK_SEAL_ABYTES bytes) into
 * out. Returns 0; -1 if authentication fails (tampered, wrong key, torn);
 * -2 if the tag is wrong for the position (a final tag before the end, or
 * none at the end: chunks dropped or reordered). */
int ak_unseal_pull(ak_seal *z, const uint8_t *in, uint8_t *out);
/* Plaintext bytes of the next chunk (0 when done). */
size_t ak_seal_next_bytes(const ak_seal *z);

#endif
