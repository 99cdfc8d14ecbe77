/* cmd_tokenize.c - agentkv tokenize: print token ids of a text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "common.h"

static const char *usage_text =
    "usage: agentkv tokenize -m MODEL (-p TEXT | -f FILE) [--no-bos] [--special]\n"
    "  prints the token ids separated by spaces on one line\n"
    "  --no-bos    don't add BOS/EOS even if the vocabulary asks for them\n"
    "  --special   parse special-token text (e.g. <|im_start|>) as special tokens\n";

int cmd_tokenize(int argc, char **argv) {
    ak_args a;
    args_init(&a, "tokenize", argc, argv);
    const char *model_path = NULL, *text = NULL, *file = NULL;
    int no_bos = 0, special = 0;
    const char *f;
    while ((f = args_next(&a))) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model_path = args_value(&a, f);
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) text = args_value(&a, f);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = args_value(&a, f);
        else if (!strcmp(f, "--no-bos")) no_bos = 1;
        else if (!strcmp(f, "--special")) special = 1;
        else args_unknown(&a, f);
    }
    if (!a.failed && !model_path) args_error(&a, "-m MODEL is required");
    if (!a.failed && !text == !file) args_error(&a, "give exactly one of -p TEXT or -f FILE");
    if (a.failed) return AK_EXIT_USAGE;

    size_t len = text ? strlen(text) : 0;
    char *buf = NULL;
    if (file && !(buf = read_prompt_file("tokenize", file, &len))) return 1;
    if (buf) text = buf;
    /* tokenizing needs only the vocabulary: don't page in the weights */
    gguf_file g;
    ak_error err = {{0}};
    ak_tokenizer *tk = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (gguf_open(&g, model_path, &err) < 0) goto out;
    tk = ak_tokenizer_load(&g, &err);
    gguf_close(&g);
    if (!tk) goto out;
    int flags = (no_bos ? 0 : AK_TOK_ADD_SPECIAL) | (special ? AK_TOK_PARSE_SPECIAL : 0);
    if (ak_tokenize(tk, text, len, flags, &ids, &n, &err) < 0) goto out;
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    rc = 0;
out:
    if (rc) fprintf(stderr, "agentkv tokenize: %s\n", err.msg);
    free(ids);
    free(buf);
    ak_tokenizer_free(tk);
    return rc;
}
