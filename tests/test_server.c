/* test_server.c - runs the HTTP tests against the real binary: curl
 * (tests/server/http_test.sh), the official `openai` npm client
 * (tests/server/openai_workflow.mjs, the pinned version installed on first
 * use into BUILD/npm) and the isolation check of 64 concurrent agents
 * (tests/server/isolation.py). Each script checks its own expectations and
 * exits non-zero on any failure; its output is shown when it fails.
 *
 * Every script runs under `timeout -k`: GNU timeout signals its whole process
 * group, so a hung script and every server it started get SIGTERM at the
 * limit and SIGKILL 10 s later (run_script, server_rig.c); `make test` cannot hang on them. */
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "server_rig.h"
#include "test.h"

/* The exact `openai` npm version the workflow runs against: the newest that
 * npm installs on the Node.js of Debian stable (20; 7.x needs Node >= 22).
 * An installed copy of another version is replaced. */
#define OPENAI_NPM_VERSION "6.49.0"

static const char *bin(void) { return test_bin(); }

TEST(server_http_with_curl) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh tests/server/http_test.sh %s %s", bin(), test_shared_dir());
    run_script(t, cmd, "http_test.log", 300);
}

/* The node_modules directory beside the binary (BUILD/npm/node_modules)
 * in mods, with the pinned `openai` installed there first if it is not
 * (the test setup: the official client from the npm registry, exact
 * version). Tests run in parallel processes and npm writes package.json
 * before the files beside it, so one install runs at a time, under a lock,
 * and a marker written after it finishes says the install is whole.
 * Returns 0, or -1 having failed the test. */
static int openai_npm_modules(ak_test_ctx *t, char *mods, size_t cap) {
    char dir[512], marker[700], cmd[2048], log[64];
    snprintf(dir, sizeof dir, "%s", bin());
    char *d = dirname(dir);
    snprintf(mods, cap, "%s/npm/node_modules", d);
    snprintf(marker, sizeof marker, "%s/npm/installed-openai-" OPENAI_NPM_VERSION, d);
    if (access(marker, F_OK) == 0) return 0;
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/npm && flock %s/npm.lock sh -c 'test -e %s || "
             "(npm install --no-audit --no-fund --silent --save-exact --prefix %s/npm openai@%s && touch %s)'",
             d, d, marker, d, OPENAI_NPM_VERSION, marker);
    snprintf(log, sizeof log, "npm_install.%d.log", (int)getpid());
    if (run_script(t, cmd, log, 300) != 0) {
        ak_test_fail(t, __FILE__, __LINE__, "cannot install openai@%s from npm", OPENAI_NPM_VERSION);
        return -1;
    }
    if (access(marker, F_OK) != 0) {
        ak_test_fail(t, __FILE__, __LINE__, "npm did not finish installing openai@%s", OPENAI_NPM_VERSION);
        return -1;
    }
    return 0;
}

/* Runs tests/server/SCRIPT.mjs with the official client (installed first
 * if need be) against the binary on stories260K, its output in SCRIPT.log,
 * bounded by limit_s. */
static void openai_script(ak_test_ctx *t, const char *script, int limit_s) {
    char cmd[2048], mods[600], model[512], log[128];
    if (openai_npm_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/%s.mjs %s %s %s", script, bin(),
             test_path(model, sizeof model, "models/stories260K.gguf"), mods);
    snprintf(log, sizeof log, "%s.log", script);
    run_script(t, cmd, log, limit_s);
}

TEST(server_openai_npm_client_workflow) { openai_script(t, "openai_workflow", 300); }

/* The official client against the guards for web pages
 * (tests/server/openai_http_guard.mjs): models.retrieve, a chat call with
 * the guards on, a client whose baseURL is a reverse proxy that passes its
 * own Host on (served with --allowed-host), and a request with a foreign
 * Host refused. */
TEST(server_openai_npm_client_http_guard) { openai_script(t, "openai_http_guard", 200); }

/* 64 agents at once under a small KV budget: every answer equals the same
 * conversation on a fresh server, every cached-token count is the agent's
 * own (tests/server/isolation.py). */
TEST(server_isolation_64_agents) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 tests/server/isolation.py %s %s", bin(), test_shared_dir());
    run_script(t, cmd, "isolation.log", 300);
}

/* prompt_cache_key names an agent for frameworks that cannot set a header:
 * created, cached, saved at SIGTERM and served warm after a restart
 * (tests/server/openai_agent_key.mjs, the same pinned `openai` client). */
TEST(server_openai_prompt_cache_key_agent) { openai_script(t, "openai_agent_key", 200); }

/* response_format through the official client (tests/server/structured.mjs):
 * Pydantic- and Zod-style schemas and json_object, streamed and not, each
 * reply checked against its schema by hand; an unsupported keyword is the
 * client's 400 naming it. */
TEST(server_openai_npm_client_structured_output) { openai_script(t, "structured", 200); }

/* Tool calls and reasoning through the official client
 * (tests/server/tools.mjs): required, named, parallel off, auto, streamed
 * and not, on three families with their published templates; the call sent
 * back with its result reuses the agent's history; DeepSeek V3.1's
 * reasoning apart from its content; the 400s of bad tools. */
TEST(server_openai_npm_client_tools) {
    char cmd[2048], mods[600];
    if (openai_npm_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/tools.mjs %s %s %s", bin(), test_shared_dir(), mods);
    run_script(t, cmd, "tools.log", 420);
}

/* The Responses API through the official client (tests/server/responses.mjs):
 * create, stream, previous_response_id (across a restart too), function
 * calls and their outputs, a resent conversation, structured output, GET,
 * input_items, DELETE, store: false, conversations. */
TEST(server_openai_npm_client_responses) {
    char cmd[2048], mods[600];
    if (openai_npm_modules(t, mods, sizeof mods) < 0) return;
    snprintf(cmd, sizeof cmd, "node tests/server/responses.mjs %s %s %s", bin(), test_shared_dir(), mods);
    run_script(t, cmd, "responses.log", 300);
}

/* logprobs through the official client (tests/server/logprobs.mjs): a
 * greedy chat's choices[0].logprobs.content, whole and streamed, and the
 * 400 of top_logprobs without logprobs. */
TEST(server_openai_npm_client_logprobs) { openai_script(t, "logprobs", 120); }
