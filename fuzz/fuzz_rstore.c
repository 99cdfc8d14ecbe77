/* fuzz_rstore.c - libFuzzer target for the record files of the stored
 * responses and conversations (src/store/rstore.h: the header line, its
 * fields and checksums, the body's length and checksum). Run with `make
 * fuzz FUZZ_TARGETS=rstore`.
 *
 * Each input is written as <tmp>/f.rec and read twice: by ak_rstore_get of
 * a store opened before (the file unknown to its index), then, written
 * again, by a store opened on it (its scan reads the header line into the
 * index; then ak_rstore_get). The stores' clock stands at 0, before every
 * record's expiry (expires >= 1), so no answer may be ABSENT for age.
 * Beyond no crash and no sanitizer report, checked: the first get is OK or
 * CORRUPT, never ABSENT or ERROR; an OK body is the input's last len bytes,
 * NUL-terminated, its meta within the format's rules, the file left in
 * place; a CORRUPT file is moved out of the directory; the second store
 * answers OK exactly when the first did (ABSENT when its scan quarantined
 * the file).
 *
 * Seed mode (fuzz/mkseeds.py; AK_FUZZ_STORE_SEEDS=DIR): writes records of
 * id "f" through ak_rstore_put to DIR and exits: "resp" (a response with a
 * chain hash, an agent and a conversation), "conv" (a conversation, empty
 * body), "binary" (a body with newlines, NULs and high bytes).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ids.h"
#include "store/rstore.h"

static char dir[] = "/tmp/agentkv-fuzz-rstore-XXXXXX";
static char path[600];
static ak_rstore *store;

static int64_t clock_zero(void *ud) {
    (void)ud;
    return 0;
}

static ak_rstore *open_store(void) {
    ak_error err = {{0}};
    return ak_rstore_open(&(ak_rstore_opts){.dir = dir, .now = clock_zero}, &err);
}

/* Removes the files of the directory d (not below it). */
static void empty_dir(const char *d) {
    DIR *h = opendir(d);
    for (struct dirent *e; h && (e = readdir(h));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        unlink(p);
    }
    if (h) closedir(h);
}

/* At exit: the temporary store goes. */
static void cleanup(void) {
    char q[700];
    ak_rstore_close(store);
    snprintf(q, sizeof q, "%s/quarantine", dir);
    empty_dir(q);
    rmdir(q);
    empty_dir(dir);
    rmdir(dir);
}

/* Writes data to the record file; aborts on failure. */
static void put_file(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

/* Puts record "f" into the store s of directory out_dir, then renames its
 * file there to name. 0, or -1. */
static int seed(ak_rstore *s, const char *out_dir, const char *name, const char *body, size_t len,
                const ak_rstore_meta *m) {
    ak_error err = {{0}};
    char src[1200], dst[1200];
    snprintf(src, sizeof src, "%s/f%s", out_dir, AK_RSTORE_SUFFIX);
    snprintf(dst, sizeof dst, "%s/%s", out_dir, name);
    return ak_rstore_put(s, "f", body, len, m, &err) == 0 && rename(src, dst) == 0 ? 0 : -1;
}

/* Seed mode: the records named at the top, written by a store opened on
 * out_dir (its clock at 0 too). 0, or -1. */
static int write_seeds(const char *out_dir) {
    ak_error err = {{0}};
    ak_rstore *s = ak_rstore_open(&(ak_rstore_opts){.dir = out_dir, .now = clock_zero}, &err);
    if (!s) return -1;
    ak_rstore_meta m = {.kind = 'r', .chain_hash = 0x0123456789abcdefull};
    snprintf(m.agent, sizeof m.agent, "agent-1");
    snprintf(m.conversation, sizeof m.conversation, "conv_1");
    const char *resp = "{\"id\":\"f\",\"object\":\"response\",\"output\":[{\"type\":\"message\",\"content\":"
                       "[{\"type\":\"output_text\",\"text\":\"hi\"}]}]}";
    const char bin[] = "{\"a\":\n\"\x00\xff\xfe\"}\n\n";
    const ak_rstore_meta conv = {.kind = 'c'};
    int rc = seed(s, out_dir, "resp", resp, strlen(resp), &m) || seed(s, out_dir, "conv", NULL, 0, &conv) ||
                     seed(s, out_dir, "binary", bin, sizeof bin - 1, &m)
                 ? -1
                 : 0;
    ak_rstore_close(s);
    return rc;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!mkdtemp(dir)) abort();
    snprintf(path, sizeof path, "%s/f%s", dir, AK_RSTORE_SUFFIX);
    store = open_store();
    if (!store) abort();
    atexit(cleanup);
    const char *seeds = getenv("AK_FUZZ_STORE_SEEDS");
    if (seeds && *seeds) exit(write_seeds(seeds) ? 1 : 0);
    return 0;
}

/* 1 if s is a C string in cap bytes that is "" or valid() accepts. */
static int field_ok(const char *s, size_t cap, int (*valid)(const char *)) {
    return memchr(s, 0, cap) && (!s[0] || valid(s));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    put_file(data, size);
    ak_error err = {{0}};
    char *body = NULL;
    size_t len = 0;
    ak_rstore_meta m;
    ak_rstore_status st = ak_rstore_get(store, "f", &body, &len, &m, &err);
    if (st == AK_RSTORE_OK) {
        if (len > size || memcmp(body, data + size - len, len) || body[len] != 0) abort();
        if ((m.kind != 'r' && m.kind != 'c') || !field_ok(m.agent, sizeof m.agent, ak_agent_id_valid) ||
            !field_ok(m.conversation, sizeof m.conversation, ak_rstore_id_valid))
            abort();
        if (access(path, F_OK) != 0) abort();
    } else if (st == AK_RSTORE_CORRUPT) {
        if (access(path, F_OK) == 0) abort();
    } else {
        abort();
    }
    free(body);

    /* the scan of a store opened on the file */
    put_file(data, size);
    ak_rstore *s2 = open_store();
    if (!s2) abort();
    ak_rstore_status st2 = ak_rstore_get(s2, "f", NULL, NULL, NULL, &err);
    if ((st == AK_RSTORE_OK) != (st2 == AK_RSTORE_OK) || st2 == AK_RSTORE_ERROR) abort();
    ak_rstore_close(s2);
    /* the record goes, for the next input: first the index that holds it */
    ak_rstore_delete(store, "f", &err);
    unlink(path);
    return 0;
}
