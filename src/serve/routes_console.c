/* routes_console.c - the console: GET / (and /console) serves a page that
 * shows the agents, pools, memories, budgets and latencies and talks to
 * one agent, reading only the public API from the browser; GET
 * /console/NAME serves its script and style sheet. The files are
 * src/serve/console/, embedded at build time (console.h). They hold no
 * data, so they need no API key (ak_route_keyless): the page asks for the
 * key when the API wants one and keeps it in the tab. */
#include "serve/console.h"
#include "serve/server_impl.h"

#include <string.h>

/* Only this server's own files run or style the page: no inline script or
 * style, no other origin, no plugin, no framing, no form posts; fetch()
 * reaches this server alone. */
#define CONSOLE_CSP                                                                                                    \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "                    \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const char *const console_headers[] = {
    "Content-Security-Policy", CONSOLE_CSP,
    "X-Content-Type-Options", "nosniff",
    "X-Frame-Options", "DENY",
    "Referrer-Policy", "no-referrer",
    "Cache-Control", "no-cache",
    NULL,
};

/* GET /, /console: the page; GET /console/NAME: the file NAME of the
 * console, or 404 unknown_url. */
enum MHD_Result ak_route_console(const ak_route_req *q) {
    const char *name = q->param[0] ? q->param : "console.html";
    for (int i = 0; i < ak_console_n_assets; i++) {
        const ak_asset *a = &ak_console_assets[i];
        if (!strcmp(a->name, name)) return ak_http_static(q, a->data, a->len, a->type, console_headers);
    }
    return ak_http_error(q->s, q->c, q->ep, 404, NULL, "unknown_url", "unknown URL %.200s", q->url);
}
