/* test_frameworks.c - agent frameworks, from the npm registry at pinned
 * versions, against the real binary: the OpenAI Agents SDK resends each
 * run's whole history and must find the agent's memory reused
 * (tests/server/agents_sdk_resend.mjs). Each package set is installed on
 * first use into BUILD/npm-NAME, apart from the `openai` client's BUILD/npm,
 * so that one install never replaces another's packages. */
#include <libgen.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "server_rig.h"
#include "test.h"

#define AGENTS_NPM_VERSION "0.20.0"
#define OPENAI_NPM_VERSION "6.49.0"

/* BUILD/npm-agents/node_modules in mods, with @openai/agents and the openai
 * client installed at their pinned versions first if they are not. Tests
 * run in parallel processes and npm writes a package's package.json before
 * its dependencies, so the install runs under a lock and a marker file,
 * written only once npm has finished, says the set is complete. Returns 0,
 * or -1 having failed the test. */
static int agents_modules(ak_test_ctx *t, char *mods, size_t cap) {
    char dir[512], marker[700], cmd[2048], log[64];
    snprintf(dir, sizeof dir, "%s", test_bin());
    char *d = dirname(dir);
    snprintf(mods, cap, "%s/npm-agents/node_modules", d);
    snprintf(marker, sizeof marker, "%s/npm-agents/installed-" AGENTS_NPM_VERSION "-" OPENAI_NPM_VERSION, d);
    if (access(marker, F_OK) == 0) return 0;
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/npm-agents && flock %s/npm-agents.lock sh -c 'test -e %s || "
             "(npm install --no-audit --no-fund --silent --save-exact --prefix %s/npm-agents @openai/agents@%s openai@%s "
             "&& touch %s)'",
             d, d, marker, d, AGENTS_NPM_VERSION, OPENAI_NPM_VERSION, marker);
    snprintf(log, sizeof log, "npm_agents_install.%d.log", (int)getpid());
    if (run_script(t, cmd, log, 300) != 0) return -1;
    if (access(marker, F_OK) != 0) {
        ak_test_fail(t, __FILE__, __LINE__, "npm did not finish installing @openai/agents@%s", AGENTS_NPM_VERSION);
        return -1;
    }
    return 0;
}

TEST(server_agents_sdk_resent_history_reused) {
    char mods[600], model[512], cmd[2048];
    if (agents_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/agents_sdk_resend.mjs %s %s %s", test_bin(),
             test_path(model, sizeof model, "models/tiny-llama-h64-gqa-f32.gguf"), mods);
    run_script(t, cmd, "agents_sdk_resend.log", 200);
}

/* The Agents SDK on its default model, the Responses API
 * (tests/server/agents_responses.mjs): a triage agent with two handoffs and
 * a function tool completes its run in the SDK's default mode and with
 * previousResponseId; five tool round trips continue one stored chain,
 * the tokens prefilled per call flat. */
TEST(server_agents_sdk_responses) {
    char mods[600], cmd[2048];
    if (agents_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/agents_responses.mjs %s %s %s", test_bin(), test_shared_dir(), mods);
    run_script(t, cmd, "agents_responses.log", 300);
}
