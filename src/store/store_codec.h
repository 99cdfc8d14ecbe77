/* store_codec.h - the image codec of the store (not an API): the agent,
 * pool and memory file format (specified at the top of store_codec.c and in
 * docs/agent-file-format.md), built from a sequence into a snapshot
 * (store_snapshot.c), and parsed and verified from bytes (store_codec.c,
 * with what both sides share: the layout, checksums, metadata hash). No
 * I/O: the save path (store_save.c) writes what this builds through a
 * backend, the load path (store_load.c) reads through a backend and hands
 * the bytes here.
 *
 * The content hashes that files record (a pool's or memory's, a card's)
 * are specified and computed in store_codec.c beside the format, and
 * declared where their users outside the store reach them:
 * ak_pool_content_hash in store.h (the agents hash their pools and
 * memories), ak_card_content_hash in cards.h.
 *
 * What it promises: an image built here parses here to the same metadata
 * and tensors (the round trip the store's tests check byte for byte); a
 * parse never trusts a size, count or offset before checking it against
 * the image's size (the fuzz targets feed it arbitrary bytes); every check
 * gives a verdict (status, a short quarantine reason word, a message) with
 * the taxonomy of store.h: CORRUPT for malformed, STALE for sound but not
 * usable here, ERROR for undecided (out of memory).
 */
#ifndef AK_STORE_CODEC_H
#define AK_STORE_CODEC_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "store/store_impl.h"

#define AK_FORMAT_VERSION 5
#define AK_FORMAT_VERSION_STR "5"
#define AK_FORMAT_VERSION_OLDEST 4   /* still read: a version 4 file is a version 5 file without "segments" */
/* Version 6 is version 5 with "corrections" (an agent whose sequence
 * carries AgentKVShift corrections: kvcache.h CORRECTIONS); only such
 * files are written as 6, every other file stays 5. */
#define AK_FORMAT_VERSION_CORR 6
/* Version 7 is version 6 (corrections optional) with "window_first": an
 * agent of a model with sliding-window layers whose local layers released
 * the blocks before that position (kvcache.h LAYER GROUPS); the local
 * layers' tensors hold only the blocks from there on. Only such files are
 * written as 7. */
#define AK_FORMAT_VERSION_WINDOW 7

/* A buffer for a whole cache (snapshot data, file images; free() it).
 * Plain 4 KiB pages: transparent huge pages (MADV_HUGEPAGE) made the first
 * touch cheaper in a fresh process, but with the kernel's usual
 * defrag=madvise a fault in such a region compacts memory when no free 2 MiB
 * page is at hand, and once the page cache had churned that stalled the
 * engine thread: saves took several times longer than with 4 KiB pages
 * (docs/store.md). */
static inline void *aks_big_alloc(size_t n) { return malloc(n ? n : 1); }

/* One tensor of an agent file. */
typedef struct {
    char name[48];
    int layer, is_v;
    int ci;                   /* component index (0 codes, 1 metadata) */
    ak_kv_component comp;
    int ndim;
    int64_t shape[5];         /* [blocks, heads, T] + the component's own (up to 2) */
    uint64_t offset, bytes;   /* within the data section */
    uint64_t piece;           /* bytes of one block: [n_head_kv][T] components */
    int64_t b0;               /* the first file block it holds (a version 7 file's local layers), else 0:
                                 file block b (>= b0) is its piece b - b0 */
} tensor_desc;

/* The geometry of an image's data section: a cache of spec in formats fk /
 * fv, nb file blocks of T positions, the local layers' tensors holding the
 * file blocks from lb0 on (a version 7 file's; else 0). */
typedef struct {
    const ak_cache_spec *spec;
    ak_kv_format fk, fv;
    int64_t nb;
    int T;
    int64_t lb0;
} aks_layout;

/* The runs of positions a file holds, in file order: each own segment of
 * its base, then its own positions [base_len, n_tokens) (the last run, maybe
 * empty). Run r holds [start[r], start[r] + len[r]) in file blocks
 * [blk0[r], blk0[r + 1]) of T positions, standard-mapped from its start. */
typedef struct {
    int n;
    int start[AK_KV_MAX_SEGMENTS + 1], len[AK_KV_MAX_SEGMENTS + 1];
    int64_t blk0[AK_KV_MAX_SEGMENTS + 2];
} file_runs;

/* The runs of positions of a file with base b and n_tokens positions in
 * blocks of T (see file_runs). */
void aks_runs_of(const ak_store_base *b, int n_tokens, int T, file_runs *r);
/* The first position of file block b. */
int64_t aks_block_pos(const file_runs *r, int64_t b, int T);
/* The file blocks (in blocks of T, runs r) that end at or before position
 * wf: those a version 7 file's local layers leave out (they come first:
 * the runs are in position order). */
int64_t aks_local_b0(const file_runs *r, int wf, int T);
/* Copies the positions of the runs (the last run's from its start + skip)
 * of every vector between a sequence and tensor bytes laid out by t (nt
 * tensors, file blocks of Tf positions as the runs say). to_kv = 1: into kv
 * (positions prepared and exclusively owned), 0: out of it, and then each
 * run's last file block's slots past its end are zeroed. Returns 0, or -1
 * if a vector is not available. */
int aks_transfer(ak_kv *kv, int to_kv, uint8_t *data, const tensor_desc *t, int nt, const file_runs *ru, int skip,
                 int Tf);
/* XXH3_64bits of the 8-byte little-endian values h[0..nt) (a block's
 * checksum from its pieces' hashes); scratch holds nt * 8 bytes. */
uint64_t aks_combine_hashes(const uint64_t *h, int nt, uint8_t *scratch);

/* THE WRITER'S AND THE READER'S COMMON PARTS (store_codec.c), so that an
 * image built by store_snapshot.c parses in store_codec.c. */
/* The tensors of layout ly in file order into a malloc'd array (*out,
 * their count returned) and the data section's size (*data_bytes).
 * Returns -1 (why set) if a format cannot store the head dims or the sizes
 * overflow. The reader requires a file's table to be exactly this one. */
int aks_layout_tensors(const aks_layout *ly, tensor_desc **out, uint64_t *data_bytes, char *why, size_t whyn);
/* File blocks of a table t (nt tensors): tensor 0's b0 plus its blocks. */
int64_t aks_table_blocks(const tensor_desc *t, int nt);
/* h as 16 lowercase hex digits. */
void aks_hex64(uint64_t h, char out[17]);
/* The "format" metadata value of a file of kind. */
const char *aks_kind_format(int kind);
/* 1 if fp is a model fingerprint: 1..64 printable ASCII characters, no
 * space. */
int aks_fingerprint_ok(const char *fp);
/* 1 if h is 16 lowercase hex digits. */
int aks_hash_ok(const char *h);
/* Puts base b in its canonical form (store.h: SEGMENTS): its segments
 * listed (the single base as one), the single-base fields naming the first
 * segment when it is a pool's or a card's, base_len their total. Returns 0,
 * or -1 (why set) when the segments are not sound. */
int aks_base_normalize(ak_store_base *b, int n_tokens, char *why, size_t whyn);

/* One metadata entry (key and value strings). */
typedef struct {
    const char *key;
    const char *val;
} aks_pair;
/* The metadata_checksum over the n pairs p (sorted in place), skipping the
 * entry "metadata_checksum" itself, as 16 hex digits into out. Returns 0,
 * or -1 on a duplicate key or out of memory. */
int aks_metadata_hash(aks_pair *p, int n, char out[17]);
/* Wipes the "tokens" and "source" metadata strings of a parsed or built
 * header tree (plaintext of a sealed file) before it is freed. */
void aks_wipe_tokens(cJSON *root);

/* A snapshot: an image's metadata and its data section, built from a
 * sequence (ak_store_snapshot_kind, store_snapshot.c). */
struct ak_snapshot {
    int kind;               /* AK_FILE_AGENT or AK_FILE_POOL */
    char id[AK_AGENT_ID_MAX + 1];
    char fingerprint[65];
    char model_name[128];
    ak_cache_spec spec;
    ak_kv_format fk, fv;
    int block_tokens;
    int n_tokens;
    int64_t created;
    char center[2][33];     /* key_center, value_center: a calibration id or "none" */
    ak_store_base base;     /* agents: the base (pool_id "" if none) */
    char pool_hash[17];     /* pools: their content hash */
    char *source;           /* pools: malloc'd, or NULL */
    int32_t *tokens;
    tensor_desc *t;
    int nt;
    uint8_t *data;
    uint64_t data_bytes;
    char *corrections;      /* agents: the "corrections" metadata (malloc'd), or NULL when the sequence has none */
    int window_first;       /* agents: the first position the local layers hold (version 7), 0: all */
};

/* Builds the safetensors header of sn (u64 length + padded JSON) into a
 * malloc'd buffer of *len bytes; hashes every block on the way
 * (store_snapshot.c). NULL with err set out of memory. */
uint8_t *aks_build_header(const ak_snapshot *sn, size_t *len, ak_error *err);

/* The outcome of a check: a status, a short reason word for the quarantine
 * file name, and a message. */
typedef struct {
    ak_store_status st;
    const char *slug;
    char msg[400];
    int code;           /* the ak_err_code the caller's ak_error gets */
} verdict;

/* Records a verdict (status, quarantine slug, the status's error code,
 * message) and returns its status. */
__attribute__((format(printf, 4, 5))) ak_store_status aks_judge(verdict *v, ak_store_status st, const char *slug,
                                                                const char *fmt, ...);
/* aks_judge(v, AK_STORE_ERROR, ...) with an error code other than IO (out
 * of memory, KV budget). */
__attribute__((format(printf, 3, 4))) ak_store_status aks_judge_error(verdict *v, int code, const char *fmt, ...);

/* What the metadata says (after parse_header). */
typedef struct {
    char agent_id[AK_AGENT_ID_MAX + 1];
    char fingerprint[65];
    char model_name[128];
    ak_cache_spec spec;
    ak_kv_format fk, fv;
    int block_tokens;
    int n_tokens;
    int64_t created;
    char center[2][33];     /* key_center, value_center */
    int kind;               /* AK_FILE_AGENT or AK_FILE_POOL (its "format") */
    int version;            /* its format_version */
    ak_store_base base;     /* agents: the base (canonical: base_normalize; pool_id "" and no segment if none) */
    char pool_hash[17];     /* pools: their content hash */
    const char *source;     /* pools: the "source" string (inside root) */
    int32_t *tokens;        /* malloc'd */
    uint64_t hdr_end;       /* 8 + N: where the data section begins */
    cJSON *root;            /* the parsed header */
    const char *corrections; /* version 6: the "corrections" string (inside root), else NULL */
    int window_first;       /* version 7: the first position the local layers hold, else 0 */
} agent_meta;

void aks_meta_free(agent_meta *m);
/* Attaches the corrections the metadata records (m->corrections, if any)
 * to kv, which holds the file's m->n_tokens positions and no correction.
 * Returns AK_STORE_HIT, or CORRUPT (a malformed record: the metadata
 * checksum passed, so a writer bug or a forged file) with v set. */
ak_store_status aks_apply_corrections(const agent_meta *m, ak_kv *kv, verdict *v);

/* The length N of the header of an image of img_size bytes whose first 8
 * bytes are img8: HIT with *n set (8 + N <= img_size), or CORRUPT. */
ak_store_status aks_header_length(const uint8_t *img8, uint64_t img_size, uint64_t *n, verdict *v);
/* Parses and checks the header img[0, 8 + N) of an image of img_size bytes,
 * a file of kind: JSON, padding, the metadata (the format of kind, every
 * required key, canonical integers, known version, matching metadata
 * checksum, agent id equal to `id`, a sound base or none; for pools a
 * content hash equal to the one recomputed from the metadata and token
 * ids), and parses the token ids. CORRUPT for anything malformed; STALE for
 * another format version or an unknown KV format. Does not look at the
 * tensor table. m is filled (free with aks_meta_free in any case). */
ak_store_status aks_parse_header(const uint8_t *img, uint64_t N, int kind, const char *id, agent_meta *m,
                                 verdict *v);
/* An image's tensor table as checked (aks_check_table): its tensors in
 * file order and each file block's checksum as the file states it. */
typedef struct {
    tensor_desc *t;     /* malloc'd */
    int nt;             /* tensors */
    uint64_t *sums;     /* malloc'd, nb of them */
    int64_t nb;         /* file blocks */
} aks_table;

/* Frees a table's arrays (a zeroed table is fine). */
void aks_table_free(aks_table *tb);
/* The tensor table of the header against the layout the metadata implies
 * and the image size: on HIT *tb holds the table (free it with
 * aks_table_free); else *tb is zeroed. */
ak_store_status aks_check_table(uint64_t img_size, const agent_meta *m, aks_table *tb, verdict *v);
/* CORRUPT unless got is the checksum the file states for its block b. */
ak_store_status aks_check_block(const agent_meta *m, int64_t b, uint64_t want, uint64_t got, verdict *v);
/* The token ids against vocab (> 0; else not checked). */
ak_store_status aks_check_tokens(const agent_meta *m, int vocab, verdict *v);
/* The checksums of file blocks [j0, tb->nb) of an image whose data
 * section is data (in memory), against the table's. */
ak_store_status aks_check_blocks(const agent_meta *m, const uint8_t *data, const aks_table *tb, int64_t j0,
                                 verdict *v);
/* STALE unless the file is for this model (fingerprint NULL: any), and,
 * if kv is not NULL, its cache spec, formats, centering and capacity. */
ak_store_status aks_check_expect(const agent_meta *m, const char *fingerprint, const ak_kv *kv, verdict *v);
/* The metadata part of a listing entry. */
void aks_entry_from_meta(ak_store_entry *e, const agent_meta *m);

/* Fills e from the image of kind and id (store_load.c): size and time
 * always (returns 1 if absent), the metadata when the header is readable
 * and sound (0; -1 with v set otherwise); for a pool pe (if not NULL) gets
 * e, the content hash and a copy of the source; metadata_json (if not NULL)
 * the whole __metadata__ as JSON. */
int aks_read_entry(const ak_store *s, int kind, const char *id, ak_store_entry *e, ak_store_pool_entry *pe,
                   char **metadata_json, verdict *v);

#endif
