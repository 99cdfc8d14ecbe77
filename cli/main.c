/* main.c - the agentkv command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with persistent agent memory"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"info", cmd_info, "architecture, hyperparameters, tokenizer and tensors of a model"},
    {"perplexity", cmd_perplexity, "perplexity of a text (llama.cpp's method)"},
    {"cache", cmd_cache, "list, inspect, verify, remove and gc agent caches in a memory directory"},
    {"pool", cmd_pool, "create, list, inspect and remove pools (shared prefixes) in a memory directory"},
    {"memory", cmd_memory, "add, list and remove memory chunks (a text's KV computed once, placed in chat turns)"},
    {"card", cmd_card, "export, import, inspect, list and remove CacheCards (KV handoffs) in a memory directory"},
    {"synth", cmd_synth, "write a GGUF with random weights of a real model's shape"},
    {"bench", cmd_bench, "benchmarks: engine (prefill, decode), kv (formats), ttft (restore vs re-prefill), serve (batching), pools (shared pool vs private copies), cards (KV handoffs), reuse (memory chunks: none, cacheblend, agentkvshift vs full)"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: agentkv COMMAND [flags]   (agentkv COMMAND --help for its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return AK_EXIT_USAGE; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "agentkv: unknown command '%s' (see agentkv --help)\n", argv[1]);
    return AK_EXIT_USAGE;
}
