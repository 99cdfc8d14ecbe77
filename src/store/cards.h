/* cards.h - CacheCards: a range of an agent's KV cache handed to another
 * agent, each token at a bit width of its own (QKVShare).
 *
 * A card holds, for positions [from, to) of a source sequence, each token's
 * key and value quantized at a width chosen per token and per side, from
 * {2, 4, 8, 16} bits. A width names a format:
 *
 *     width   key format   value format
 *       2       q2           tq2
 *       4       q4           tq4
 *       8       q8           q8
 *      16       f16          f16
 *
 * Keys never use rotated formats: a card is read by attention in place, as
 * mixed blocks (blockpool.h: MIXED BLOCKS), where each key class is scored
 * against the plain query; values may be rotated (tq*), whose outputs are
 * summed in the rotated basis. Card vectors are never centered (mixed blocks
 * are not): a card is independent of the calibration of the pool it came
 * from or goes to.
 *
 * A card is also independent of block size: its vectors are stored per
 * (layer, side, width class) in token order, and cut into blocks of the
 * receiving pool's size only when it is imported (ak_card_to_blocks).
 *
 * Making a card reads each position of the source with ak_kv_read (the
 * dequantized floats, centering undone) and quantizes them into the token's
 * formats. A token the source holds in a mixed block (the source itself
 * imported a card) keeps or lowers its width, never raises it: its width is
 * capped at the width of the format it already has (ak_card_width_of_format).
 *
 * The file format (<store>/cards/<id>.safetensors) is in
 * docs/card-file-format.md and at the top of store_card.c; the store
 * functions are in store.h (CARDS); importing a card into an agent is in
 * agent.h (CARDS).
 *
 * A card is immutable once made; it may be read from any thread.
 */
#ifndef AK_CARDS_H
#define AK_CARDS_H

#include <stddef.h>
#include <stdint.h>

#include "kv/blockpool.h"
#include "kv/kvcache.h"
#include "kv/kvformat.h"
#include "engine/model.h"
#include "store/store.h"
#include "base/threadpool.h"
#include "base/util.h"

/* The widths, in increasing order, and their number (a width's class). */
#define AK_CARD_N_WIDTHS 4
#define AK_CARD_POLICY_MAX 32

typedef struct ak_card {
    char id[AK_AGENT_ID_MAX + 1];
    char source_agent[AK_AGENT_ID_MAX + 1];   /* "" if not made from an agent */
    char fingerprint[65];                     /* the model's */
    char model_name[128];                     /* informational */
    ak_cache_spec spec;
    int n_tokens;
    int32_t *tokens;        /* (n_tokens) token ids of the positions */
    int pos_offset;         /* the position of the first token in its source */
    uint8_t *widths_k;      /* (n_tokens) each token's key width: 2, 4, 8 or 16 */
    uint8_t *widths_v;      /* (n_tokens) value widths */
    char policy[AK_CARD_POLICY_MAX];   /* how the widths were chosen ("given", "uniform", ...) */
    double budget_k, budget_v;         /* the average bits asked for (informational) */
    int64_t created;        /* unix seconds */
    char hash[17];          /* content hash (ak_card_content_hash), 16 hex digits */
    /* The vectors: for layer l, side s (0 keys, 1 values) and class c (0..3:
     * widths 2, 4, 8, 16), count[s][c] tokens in token
     * order, each n_head_kv vectors of the class's format, split into the
     * format's components (ak_kv_format_components) like the file's
     * tensors: data[ak_card_slot(l, s, c, comp)] holds count[s][c] *
     * n_head_kv entries of component comp, token-major then head-major.
     * NULL where a class is empty or the format has no such component. */
    int count[2][AK_CARD_N_WIDTHS];
    uint8_t **data;         /* (n_layer * 2 * AK_CARD_N_WIDTHS * 2) */
} ak_card;

/* Index into card->data of (layer, side, class, component). */
static inline int ak_card_slot(int layer, int side, int cls, int comp) {
    return ((layer * 2 + side) * AK_CARD_N_WIDTHS + cls) * 2 + comp;
}

/* 1 if w is 2, 4, 8 or 16. */
int ak_card_width_valid(int w);
/* The class (0..3) of a valid width, or -1. */
int ak_card_width_class(int w);
/* The width of class c (0..3): 2, 4, 8, 16. */
int ak_card_class_width(int c);
/* The formats of a valid width for keys (q2, q4, q8, f16) and values (tq2,
 * tq4, q8, f16). */
ak_kv_format ak_card_key_format(int w);
ak_kv_format ak_card_value_format(int w);
/* The largest card width a token stored in format f can be given without
 * gaining precision it does not have: f32, f16, bf16 -> 16; q8 -> 8; q4,
 * tq4 -> 4; tq3, tcq3, q2, tq2 -> 2. */
int ak_card_width_of_format(ak_kv_format f);

/* What a card is made from. */
typedef struct {
    const char *id;              /* the card's id (ak_agent_id_valid); required */
    const char *source_agent;    /* recorded; may be NULL */
    const char *fingerprint;     /* the model's (1..64 printable characters); required */
    const char *model_name;      /* may be NULL */
    int from, to;                /* the range of the source: 0 <= from < to <= length */
    const uint8_t *widths_k;     /* (to - from) widths, each 2, 4, 8 or 16; NULL: all 16 */
    const uint8_t *widths_v;     /* likewise for values */
    const char *policy;          /* recorded (<= 31 characters of [a-z0-9_-]); NULL: "given" */
    double budget_k, budget_v;   /* recorded; <= 0: the mean of the widths */
    ak_threads *threads;            /* the layers are quantized on these threads; NULL: the caller's */
} ak_card_params;

/* Makes a card of positions [p->from, p->to) of kv, whose token ids are
 * tokens[0..ak_kv_length(kv)). A token in a mixed block of kv gets at most
 * the width of its slot's format (on each side); the widths the card
 * records are those it holds (after the cap). Returns NULL with err set:
 * AK_ERR_INVALID (a bad id, fingerprint, range, width or policy; a format
 * that cannot store the head dims), AK_ERR_NOMEM. */
ak_card *ak_card_make(const ak_kv *kv, const int32_t *tokens, const ak_card_params *p, ak_error *err);

/* Frees a card. NULL is fine. */
void ak_card_free(ak_card *c);

/* Bytes of one component tensor of (side, class) at head dim d: count *
 * n_head_kv entries (0 if the format has no component comp). */
size_t ak_card_component_bytes(const ak_card *c, int side, int cls, int comp);
/* Bytes the card's vectors take (every tensor but the widths). */
size_t ak_card_vector_bytes(const ak_card *c);
/* Bytes an f16 cache of the same tokens takes (n_tokens * n_layer *
 * n_head_kv * (head_dim_k + head_dim_v) * 2), to compare with. */
size_t ak_card_f16_bytes(const ak_card *c);

/* The content hash of a card (16 hex digits): XXH3-64 over "agentkv card
 * v1", the fingerprint, the cache spec, n_tokens, pos_offset, the token
 * ids, both width arrays and every vector tensor's bytes (store_codec.c
 * has the exact byte order). Two cards of equal contents have one hash whatever
 * their ids; an agent that imported a card records it, so a card re-made
 * under the same id with other contents is told apart. */
void ak_card_content_hash(const ak_card *c, char out[17]);

/* Builds the card as mixed blocks of pool (its spec must be the card's):
 * ceil(n_tokens / T) blocks of T slots (the last partial), each slot in the
 * formats of its token's widths, filled with the card's stored bytes (no
 * re-quantization), copied on threads (NULL: the caller). On success *blocks (malloc'd array, the caller frees
 * it) holds *nb blocks, each with one reference for the caller (hand them to
 * ak_kv_attach_blocks, then ak_block_unref each). Returns 0, or -1 with err
 * set (AK_ERR_INVALID: another spec; AK_ERR_KV_BUDGET; AK_ERR_NOMEM), having
 * allocated nothing. */
int ak_card_to_blocks(const ak_card *c, ak_block_pool *pool, ak_threads *threads, ak_block ***blocks, int *nb,
                      ak_error *err);

/* Makes the empty sequence kv (of c's pool's spec) hold the card: positions
 * [0, n_tokens) as mixed blocks (its base), read in place; positions past
 * them are kv's own, in kv's formats. Returns 0, or -1 with err set (kv not
 * empty, the card longer than kv's capacity, ak_card_to_blocks' errors),
 * kv then still empty. */
int ak_card_attach(const ak_card *c, ak_kv *kv, ak_error *err);
/* ak_card_attach with the blocks filled on threads (NULL: the caller). */
int ak_card_attach_on(const ak_card *c, ak_kv *kv, ak_threads *threads, ak_error *err);

/* A copy of c moved to position offset `offset`: every key rotated by
 * offset - c->pos_offset with ak_model_shift_keys (through a private f32
 * sequence) and quantized again into its width's format; values, widths and
 * tokens unchanged; pos_offset = offset, the content hash recomputed. An
 * import places a card cut from the middle of a context at position 0 this
 * way (RoPE attention depends only on relative positions). Deterministic.
 * m must be the card's model. Returns NULL with err set (AK_ERR_INVALID: a
 * model without RoPE, another cache spec; AK_ERR_NOMEM). */
ak_card *ak_card_shift(const ak_card *c, const ak_model *m, int offset, ak_error *err);

/* The width of the token at position pos of kv on each side if it is held
 * by a mixed block (*wk, *wv get ak_card_width_of_format of its slot's
 * formats), returning 1; 0 (nothing set) for a position of a uniform block
 * or not held. */
int ak_card_slot_widths(const ak_kv *kv, int pos, int *wk, int *wv);

#endif
