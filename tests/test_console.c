/* test_console.c - the console (GET /, src/serve/routes_console.c): its
 * files are embedded byte for byte (against the files of
 * src/serve/console/), /metrics reports the disk budget the agents were
 * given (the console's disk gauge reads it), and the page works in a real
 * browser: headless Chromium driven by tests/server/console_ui.mjs
 * against the real binary with an API key. The HTTP side (the key, the
 * Content-Security-Policy, the same-origin rule) is also checked without a
 * browser in test_server_hard.c (server_console_*). */
#include <dirent.h>
#include <string.h>

#include "agents/agent.h"
#include "base/util.h"
#include "kv/blockpool.h"
#include "serve/console.h"
#include "serve/metrics.h"
#include "server_rig.h"
#include "store/store.h"
#include "test.h"

#define CONSOLE_DIR "src/serve/console"

TEST(console_files_embedded_as_they_are) {
    DIR *d = opendir(CONSOLE_DIR);
    REQUIRE(d, "cannot open %s (the tests run from the repository's root)", CONSOLE_DIR);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        files++;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CONSOLE_DIR, e->d_name);
        size_t len = 0;
        char *want = ak_read_file(path, &len, NULL);
        REQUIRE(want, "read %s", path);
        const ak_asset *a = NULL;
        for (int i = 0; i < ak_console_n_assets && !a; i++)
            if (!strcmp(ak_console_assets[i].name, e->d_name)) a = &ak_console_assets[i];
        CHECK(a && a->len == len && !memcmp(a->data, want, len) && a->data[len] == 0,
              "%s: embedded %zu bytes, the file has %zu (rebuild: the Makefile's console rule)", path, a ? a->len : 0, len);
        free(want);
    }
    closedir(d);
    CHECK(files == ak_console_n_assets && files >= 3, "%d files, %d embedded", files, ak_console_n_assets);
    static const char *const types[][2] = {{"console.html", "text/html; charset=utf-8"},
                                           {"console.js", "text/javascript; charset=utf-8"},
                                           {"console.css", "text/css; charset=utf-8"}};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        const char *type = NULL;
        for (int i = 0; i < ak_console_n_assets; i++)
            if (!strcmp(ak_console_assets[i].name, types[k][0])) type = ak_console_assets[i].type;
        CHECK(type && !strcmp(type, types[k][1]), "%s: type %s", types[k][0], type ? type : "(none)");
    }
}

/* The disk budget of an agents object reaches /metrics' gauge (0: none). */
TEST(console_metrics_disk_budget) {
    char path[512], dir[512];
    ak_error err = {0};
    ak_model *m = ak_model_load(test_path(path, sizeof path, "models/stories260K.gguf"), NULL, NULL, &err);
    REQUIRE(m, "%s", err.msg);
    ak_block_pool *pool = ak_block_pool_new(&m->spec, 0, 0, &err);
    snprintf(dir, sizeof dir, "%s/console-disk", test_tmp_dir());
    ak_store *store = pool ? ak_store_open(dir, NULL, &err) : NULL;
    ak_metrics *mx = store ? ak_metrics_new(&err) : NULL;
    REQUIRE(mx, "%s", err.msg);
    static const uint64_t budgets[] = {123456789, 0};
    for (size_t i = 0; i < 2; i++) {
        ak_agents_config c = {.model = m, .pool = pool, .store = store, .fk = AK_KV_F16, .fv = AK_KV_F16, .n_ctx = 256,
                              .save = AK_SAVE_EVERY_TURN, .disk_budget = budgets[i]};
        ak_agents *ag = ak_agents_new(&c, &err);
        REQUIRE(ag, "%s", err.msg);
        ak_metrics_gauges g = {0};
        ak_metrics_gauges_collect(&g, ag, pool, 0, 0, 0, 0, 0);
        char *text = ak_metrics_render(mx, &g);
        char want[96];
        snprintf(want, sizeof want, "\nagentkv_disk_budget_bytes %llu\n", (unsigned long long)budgets[i]);
        CHECK(text && strstr(text, want) && strstr(text, "# TYPE agentkv_disk_budget_bytes gauge\n"),
              "no line '%s' in /metrics", want + 1);
        free(text);
        ak_agents_free(ag);
    }
    ak_metrics_free(mx);
    ak_store_close(store);
    ak_block_pool_free(pool);
    ak_model_free(m);
}

/* The chromium the UI test drives: AK_CHROMIUM, else `chromium` on PATH
 * (Debian's; scripts/deps.sh installs it). NULL when there is none. */
static const char *chromium(char *buf, size_t cap) {
    const char *env = getenv("AK_CHROMIUM");
    if (env && *env) return env;
    FILE *p = popen("command -v chromium 2>/dev/null", "r");
    if (!p) return NULL;
    size_t n = fread(buf, 1, cap - 1, p);
    pclose(p);
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] ? buf : NULL;
}

/* The console in headless Chromium (tests/server/console_ui.mjs): the key,
 * the agent table against /v1/agents, a streamed chat turn, the CSP; its
 * screenshot lands in the test's temp dir (console/console.png), and at
 * AK_CONSOLE_SHOT too when set (make test-ui CONSOLE_SHOT=...). Skipped
 * only when no chromium is installed (scripts/deps.sh could not install
 * it) and AK_REQUIRE_CHROMIUM is not set. */
TEST(server_console_in_chromium) {
    char browser[512], model[512], cmd[2048];
    if (!chromium(browser, sizeof browser)) {
        /* CI (.ci/run) sets AK_REQUIRE_CHROMIUM: there the test must run */
        const char *req = getenv("AK_REQUIRE_CHROMIUM");
        REQUIRE(!req || !*req, "no chromium, and AK_REQUIRE_CHROMIUM is set (scripts/deps.sh installs it)");
        SKIP("no chromium: scripts/deps.sh installs Debian's (apt-get install chromium), or set AK_CHROMIUM");
    }
    snprintf(cmd, sizeof cmd, "node tests/server/console_ui.mjs %s %s %s %s/console", test_bin(),
             test_path(model, sizeof model, "models/stories260K.gguf"), browser, test_tmp_dir());
    run_script(t, cmd, "console_ui.log", 150);
}
