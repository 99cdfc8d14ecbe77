/* test_frameworks.c - agent frameworks, from the npm registry at pinned
 * versions, against the real binary: the OpenAI Agents SDK resends each
 * run's whole history and must find the agent's memory reused
 * (tests/server/agents_sdk_resend.mjs). Each package set is installed on
 * first use into BUILD/npm-NAME, apart from the `openai` client's BUILD/npm,
 * so that one install never replaces another's packages. */
#include <libgen.h>
#include <string.h>
#include <sys/wait.h>

#include "../src/util.h"
#include "test.h"

#define AGENTS_NPM_VERSION "0.20.0"
#define OPENAI_NPM_VERSION "6.49.0"
#define KILL_GRACE_S 10

static const char *bin(void) {
    const char *b = getenv("AK_BIN");
    return b && *b ? b : "build/agentkv";
}

/* Runs cmd under `timeout -k` with its output to a log in the test's temp
 * dir; a non-zero exit fails the test with the log's tail. Returns the code. */
static int run_logged(ak_test_ctx *t, const char *cmd, const char *log_name, int limit_s) {
    char log[512], full[4096];
    snprintf(log, sizeof log, "%s/%s", test_tmp_dir(), log_name);
    snprintf(full, sizeof full, "timeout -k %d %d %s >%s 2>&1 </dev/null", KILL_GRACE_S, limit_s, cmd, log);
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

/* BUILD/npm-agents/node_modules in mods, with @openai/agents and the openai
 * client installed at their pinned versions first if they are not. Returns
 * 0, or -1 having failed the test. */
static int agents_modules(ak_test_ctx *t, char *mods, size_t cap) {
    char dir[512], probe[700], cmd[2048];
    snprintf(dir, sizeof dir, "%s", bin());
    char *d = dirname(dir);
    snprintf(mods, cap, "%s/npm-agents/node_modules", d);
    snprintf(probe, sizeof probe, "%s/@openai/agents/package.json", mods);
    char *pkg = ak_read_file(probe, NULL, NULL);
    int ok = pkg && strstr(pkg, "\"version\": \"" AGENTS_NPM_VERSION "\"");
    free(pkg);
    if (ok) return 0;
    snprintf(cmd, sizeof cmd,
             "npm install --no-audit --no-fund --silent --save-exact --prefix %s/npm-agents @openai/agents@%s openai@%s", d,
             AGENTS_NPM_VERSION, OPENAI_NPM_VERSION);
    return run_logged(t, cmd, "npm_agents_install.log", 300) == 0 ? 0 : -1;
}

TEST(server_agents_sdk_resent_history_reused) {
    char mods[600], model[512], cmd[2048];
    if (agents_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/agents_sdk_resend.mjs %s %s %s", bin(),
             test_path(model, sizeof model, "models/tiny-llama-h64-gqa-f32.gguf"), mods);
    run_logged(t, cmd, "agents_sdk_resend.log", 200);
}
