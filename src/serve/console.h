/* console.h - internal to src/serve/: the files of the console (the page
 * GET / serves, its script and its style sheet: src/serve/console/),
 * embedded into the binary at build time. scripts/embed.sh writes
 * BUILD/gen/console_assets.c from them (od and sed: no network, no build
 * step of the page's own); routes_console.c serves them. */
#ifndef AK_CONSOLE_H
#define AK_CONSOLE_H

#include <stddef.h>

typedef struct {
    const char *name;          /* the file's base name (console.html, console.js, ...) */
    const char *type;          /* its Content-Type */
    const unsigned char *data; /* len bytes (a NUL follows them) */
    size_t len;
} ak_asset;

extern const ak_asset ak_console_assets[];
extern const int ak_console_n_assets;

#endif
