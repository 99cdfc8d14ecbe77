/* rstore.h - the durable store of the Responses API's stored responses and
 * conversations: one small file per record, written atomically, checked
 * completely when read, expired after a time to live, bounded in bytes.
 *
 * A store is a directory <dir> (created, with its parents, mode 0700):
 *     <dir>/<id>.rec                      one record
 *     <dir>/.<id>.rec.tmp.<pid>.<tid>     a put in flight (or a dead one's:
 *                                         removed at open when its process
 *                                         is gone or it is over an hour old)
 *     <dir>/quarantine/<id>.rec.<reason>.<unix time>[.k]
 *                                         records found corrupt, moved aside
 *                                         (the newest AK_STORE_QUARANTINE_MAX
 *                                         kept)
 * Files are written by the store's directory backend (store_backend.h,
 * store_dir.c): temp file, write, fsync, rename over <id>.rec, fsync of the
 * directory; a crash or an I/O error at any step leaves the previous record
 * or the new one, whole.
 *
 * RECORD FILE FORMAT (version 1). A header line, then the body:
 *
 *   AKRS1 id=ID kind=K seq=N created=T expires=T chain=H agent=A conv=C len=N body=X head=X\n
 *   BODY
 *
 * Fields in exactly this order, ASCII, each after one space:
 *   AKRS1      magic and format version
 *   id=        the record's id, equal to the file name's (a file copied or
 *              renamed to another id is corrupt): 1 to 64 of [A-Za-z0-9_-]
 *   kind=      'r' a response, 'c' a conversation
 *   seq=       decimal 1 .. 2^63-1: the record's place in write order, given
 *              at its first write and kept when it is replaced; a store
 *              numbers new records after the largest it has seen
 *   created=   decimal unix seconds 0 .. 2^63-1 of the first write (kept
 *              when replaced)
 *   expires=   decimal unix seconds 1 .. 2^63-1: the latest write plus the
 *              time to live; the record is live while now < expires
 *   chain=     16 lowercase hex digits: the caller's chain hash (all zero:
 *              none)
 *   agent=     empty, or an agent id (base/ids.h: [A-Za-z0-9_.-]{1,128},
 *              not starting with '.')
 *   conv=      empty, or a conversation's record id (the id rule above)
 *   len=       decimal 0 .. 2^63-1: the body's bytes
 *   body=      16 lowercase hex digits: XXH64 (seed 0) of the body
 *   head=      16 lowercase hex digits: XXH64 (seed 0) of the line's bytes
 *              before " head=" (from the 'A' of AKRS1 to the last digit of
 *              body=)
 * then '\n', then the body: exactly len bytes (opaque to the store; any
 * bytes), and nothing after it. Decimals are canonical: digits only, no
 * sign, no leading zero but "0" itself. The line, '\n' included, is at most
 * AK_RSTORE_HEAD_MAX bytes.
 * A file is a record only if all of that holds; anything else is CORRUPT:
 * a torn or truncated file (its size is not the line plus len), a flipped
 * byte in the line (a field that does not parse, or head= differs), in the
 * body (body= differs) or in head=/body= themselves.
 *
 * THE INDEX. A store keeps in memory, per record: its id, kind, chain hash,
 * agent, conversation, seq, created, expires and file size, built at open
 * from each file's header line (checked: its head= hash, its fields, the
 * file's size; the body is checked when it is read) and kept current by
 * this store's puts, gets, deletes, expiries, evictions and quarantine
 * moves. Open also deletes expired records and moves corrupt ones to
 * quarantine/. A record another process writes is seen at the next open,
 * or when this store gets it by id.
 *
 * EXPIRY AND BUDGET. A record expires ttl_s after it was last written; an
 * expired record is ABSENT to get, skipped by find_chain and
 * each_in_conversation, and its file deleted by the first get, put, delete
 * or get_stats that meets it (and at open). After each put the records'
 * bytes on disk (file sizes, header lines included) are brought back to the
 * budget by deleting records oldest first (by seq), never the one just
 * written.
 *
 * Every function may be called from any thread (one mutex inside; the file
 * I/O of a put or get runs under it: records are small).
 */
#ifndef AK_RSTORE_H
#define AK_RSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define AK_RSTORE_MAGIC "AKRS1"
#define AK_RSTORE_SUFFIX ".rec"
#define AK_RSTORE_ID_MAX 64
#define AK_RSTORE_HEAD_MAX 512
#define AK_RSTORE_DEFAULT_TTL_S (30 * 24 * 3600)
#define AK_RSTORE_DEFAULT_BUDGET (1ull << 30)

typedef struct ak_rstore ak_rstore;

typedef struct {
    const char *dir;          /* the records live in <dir> (created 0700 if missing) */
    int64_t ttl_s;            /* a record expires this long after it was written (0: AK_RSTORE_DEFAULT_TTL_S = 30 days) */
    uint64_t budget_bytes;    /* records' bytes on disk at most (0: AK_RSTORE_DEFAULT_BUDGET = 1 GiB); past it the oldest records are removed first */
    int64_t (*now)(void *ud); void *now_ud;   /* clock in unix seconds (NULL: time()); tests move it */
} ak_rstore_opts;

typedef enum { AK_RSTORE_OK = 0, AK_RSTORE_ABSENT, AK_RSTORE_CORRUPT, AK_RSTORE_ERROR } ak_rstore_status;

typedef struct {              /* what the store indexes about a record (besides its id) */
    char kind;                /* 'r' a response, 'c' a conversation */
    uint64_t chain_hash;      /* the caller's hash of the record's whole item list (0: none): find_chain looks it up */
    char agent[129];          /* the agent that holds its KV ("" none) */
    char conversation[65];    /* the conversation it belongs to ("" none) */
} ak_rstore_meta;

typedef struct { int records; uint64_t bytes, budget; uint64_t expired, evicted, quarantined; } ak_rstore_stats;

/* 1 if id is 1 to AK_RSTORE_ID_MAX characters of [A-Za-z0-9_-] (so names
 * a file inside the store's directory and nothing else), else 0 (NULL: 0). */
int ak_rstore_id_valid(const char *id);

/* "ok", "absent", "corrupt", "error". */
const char *ak_rstore_status_name(ak_rstore_status st);

/* Opens the store in o->dir: creates it if missing (0700), removes stale
 * temp files, scans the records' header lines into the index, deletes
 * expired records and moves corrupt ones to <dir>/quarantine/. In test
 * builds (AK_FAULT_INJECTION) the directory backend reads its
 * fault-injection variables here (store_dir.c). ttl_s < 0 is invalid.
 * Returns NULL with err set on failure. */
ak_rstore *ak_rstore_open(const ak_rstore_opts *o, ak_error *err);

/* Frees the store (no file is touched). NULL is fine. */
void ak_rstore_close(ak_rstore *s);

/* Writes record id (1..64 of [A-Za-z0-9_-]) atomically: body[0..len) is
 * opaque JSON text the caller owns the shape of (body may be NULL when len
 * is 0); meta indexed (kind 'r' or 'c', agent "" or a valid agent id,
 * conversation "" or a valid record id). Replaces an existing record, which
 * keeps its place in write order (seq, created) and gets a new expiry.
 * Then enforces the budget (oldest first, never the record just written).
 * Returns 0, or -1 with err: AK_ERR_INVALID for a bad id or meta or a body
 * larger than the budget; an I/O error (AK_ERR_IO, AK_ERR_NOSPACE for a
 * full disk, ...): nothing changed, the previous record, if any, is whole.
 * One exception: when only the directory's fsync after the rename fails,
 * the new record is in place (and indexed) but may not survive a power
 * loss; -1 then too, the message says so. */
int ak_rstore_put(ak_rstore *s, const char *id, const char *body, size_t len, const ak_rstore_meta *meta,
                  ak_error *err);

/* Reads record id: *body malloc'd (NUL-terminated after *len bytes; the
 * caller frees), *meta filled (each out pointer may be NULL), only on OK.
 * Returns a status: ABSENT (never written, deleted or expired: an expired
 * one is deleted then; also an invalid id, err's code AK_ERR_INVALID, else
 * AK_ERR_NOT_FOUND), CORRUPT (the file fails its checksum or is malformed:
 * moved to quarantine/), ERROR (I/O, memory: the file is left in place);
 * OK. err is set for every status but OK. The index takes what the file
 * says. */
ak_rstore_status ak_rstore_get(ak_rstore *s, const char *id, char **body, size_t *len, ak_rstore_meta *meta,
                               ak_error *err);

/* Removes record id. Returns OK; ABSENT if there was none (or it had
 * expired: its file is deleted all the same; or the id is invalid); ERROR
 * with err set if the file could not be removed. */
ak_rstore_status ak_rstore_delete(ak_rstore *s, const char *id, ak_error *err);

/* The id of a live (unexpired) response record (kind 'r') whose chain_hash
 * is h (h != 0), newest (largest seq) first when several, copied into
 * id_out (65 bytes); 0 when found, -1 when none. From the index: no I/O. */
int ak_rstore_find_chain(ak_rstore *s, uint64_t h, char *id_out);

/* Calls fn for each live record of conversation conv in the order written
 * (oldest first: by seq), with the store's lock released (fn may call the
 * store, e.g. ak_rstore_get); stops when fn returns non-zero. The records
 * are those indexed when the call starts. Returns how many times fn was
 * called, or -1 when out of memory (fn not called). */
int ak_rstore_each_in_conversation(ak_rstore *s, const char *conv, int (*fn)(const char *id, void *ud), void *ud);

/* The live records (count, bytes on disk) and, since open, the records
 * expired (deleted for their age, at open too), evicted (deleted for the
 * budget) and quarantined (moved aside as corrupt, at open too). Deletes
 * the expired records it meets first. */
void ak_rstore_get_stats(ak_rstore *s, ak_rstore_stats *st);

#endif
