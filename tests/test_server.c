/* test_server.c - runs the HTTP tests against the real binary: curl
 * (tests/server/http_test.sh) and the official `openai` npm client
 * (tests/server/openai_workflow.mjs, installed on first use into
 * BUILD/npm). Each script checks its own expectations and exits non-zero on
 * any failure; its output is shown when it fails. */
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "../src/util.h"
#include "test.h"

static const char *bin(void) {
    const char *b = getenv("AK_BIN");
    return b && *b ? b : "build/agentkv";
}

/* Runs cmd with output to a log; on failure records it with the log's tail. */
static int run_script(ak_test_ctx *t, const char *cmd, const char *log_name) {
    char log[512], full[4096];
    snprintf(log, sizeof log, "%s/%s", test_tmp_dir(), log_name);
    snprintf(full, sizeof full, "%s >%s 2>&1 </dev/null", cmd, log);
    int st = system(full);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0) {
        char *out = ak_read_file(log, NULL, NULL);
        size_t n = out ? strlen(out) : 0;
        ak_test_fail(t, __FILE__, __LINE__, "`%s` exited %d:\n%s", cmd, code, out ? out + (n > 6000 ? n - 6000 : 0) : "");
        free(out);
    }
    return code;
}

TEST(server_http_with_curl) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh tests/server/http_test.sh %s %s", bin(), test_shared_dir());
    run_script(t, cmd, "http_test.log");
}

TEST(server_openai_npm_client_workflow) {
    char dir[512], cmd[2048], mods[600];
    snprintf(dir, sizeof dir, "%s", bin());
    char *d = dirname(dir);
    snprintf(mods, sizeof mods, "%s/npm/node_modules", d);
    char probe[700];
    snprintf(probe, sizeof probe, "%s/openai/package.json", mods);
    struct stat sb;
    if (stat(probe, &sb) != 0) {
        /* the test setup: the official client from the npm registry */
        snprintf(cmd, sizeof cmd, "npm install --no-audit --no-fund --silent --prefix %s/npm openai", d);
        REQUIRE(run_script(t, cmd, "npm_install.log") == 0, "cannot install the openai npm package");
    }
    char model[512];
    snprintf(cmd, sizeof cmd, "node tests/server/openai_workflow.mjs %s %s %s", bin(),
             test_path(model, sizeof model, "models/stories260K.gguf"), mods);
    run_script(t, cmd, "openai_workflow.log");
}
