/* fuzz_store.c - libFuzzer target for plain agent cache files (the
 * safetensors header, the metadata, every check before a value reaches
 * attention); the body is fuzz/store_target.h. Run with `make fuzz
 * FUZZ_TARGETS=store`.
 *
 * Seeds (fuzz/corpus/store/) are real agent files written by `agentkv run
 * --agent` on stories260K (f16/f16, q8/tq3, q4/q2, tq4/tq4, --no-center).
 */
#include "store_target.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    store_target_init(NULL);
    const char *seeds = getenv("AK_FUZZ_STORE_SEEDS");   /* fuzz/mkseeds.py: write seeds, exit */
    if (seeds && *seeds) exit(store_target_write_seeds(seeds) ? 1 : 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return store_target_run(data, size); }
