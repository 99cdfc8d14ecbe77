/* fuzz_sealed.c - libFuzzer target for sealed (encrypted and authenticated)
 * agent files: the same reads as fuzz_store.c (fuzz/store_target.h), by a
 * store that holds the key the seeds were sealed with, so that inputs reach
 * the plain header checks, the chunk stream's authentication and, when the
 * tags hold, the decrypted image's checks. Run with `make fuzz
 * FUZZ_TARGETS=sealed`.
 *
 * Seeds (fuzz/corpus/sealed/) are agent files of agent "a" written by
 * `agentkv run --agent a --memory-key-file K` on stories260K under this key
 * (fuzz/mkseeds.py).
 */
#include "store_target.h"

/* The key of the seeds: bytes 1, 2, ..., 32. */
static uint8_t key[AK_STORE_KEY_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < AK_STORE_KEY_BYTES; i++) key[i] = (uint8_t)(i + 1);
    store_target_init(key);
    const char *seeds = getenv("AK_FUZZ_STORE_SEEDS");   /* fuzz/mkseeds.py: write seeds, exit */
    if (seeds && *seeds) exit(store_target_write_seeds(seeds) ? 1 : 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return store_target_run(data, size); }
