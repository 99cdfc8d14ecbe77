/* main.c - the agentkv command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include <agentkv.h>

#include "args.h"
#include "commands.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {.name = "run", .fn = cmd_run, .help = "generate text from a prompt"},
    {.name = "serve", .fn = cmd_serve, .help = "OpenAI-compatible HTTP server with persistent agent memory"},
    {.name = "tokenize", .fn = cmd_tokenize, .help = "print the token ids of a text"},
    {.name = "info", .fn = cmd_info, .help = "architecture, hyperparameters, tokenizer and tensors of a model"},
    {.name = "perplexity", .fn = cmd_perplexity, .help = "perplexity of a text (llama.cpp's method)"},
    {.name = "cache", .fn = cmd_cache,
     .help = "list, inspect, verify, remove and gc agent caches in a memory directory"},
    {.name = "pool", .fn = cmd_pool,
     .help = "create, list, inspect and remove pools (shared prefixes) in a memory directory"},
    {.name = "memory", .fn = cmd_memory,
     .help = "add, list and remove memory chunks (a text's KV computed once, placed in chat turns)"},
    {.name = "card", .fn = cmd_card,
     .help = "export, import, inspect, list and remove CacheCards (KV handoffs) in a memory directory"},
    {.name = "synth", .fn = cmd_synth, .help = "write a GGUF with random weights of a real model's shape"},
    {.name = "bench", .fn = cmd_bench,
     .help = "benchmarks: engine (prefill, decode), kv (formats), ttft (restore vs re-prefill), serve (batching), pools (shared pool vs private copies), cards (KV handoffs), reuse (memory chunks: none, cacheblend, agentkvshift vs full)"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: agentkv COMMAND [flags]   (agentkv COMMAND --help for its flags)\n"
                 "       agentkv --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return AK_EXIT_USAGE; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("agentkv %s\n", agentkv_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "agentkv: unknown command '%s' (see agentkv --help)\n", argv[1]);
    return AK_EXIT_USAGE;
}
