// agents_sdk_resend.mjs BIN MODEL NODE_MODULES_DIR - the OpenAI Agents SDK
// (@openai/agents, its Chat Completions model) runs a three-turn conversation
// against `agentkv serve` the way users write it: each run gets the whole
// history of the last one (result.history) plus a new user message, the
// agent named by providerData.prompt_cache_key. The SDK resends every reply
// as the server returned it; each turn after the first must reuse the
// agent's whole history (cached prompt tokens equal to the tokens the agent
// held, GET /v1/agents/{id}), and after a restart the next run is served
// warm with the whole history reused. Exits 1 on the first failed check.
//
// The server is killed on every exit path; no client retries; a watchdog
// ends the script before the C test's limit.
import { live, startServer as spawnServer, stopServer as stopChild } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const agents = require("@openai/agents");
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-sdk-"));
const WATCHDOG_MS = 170000;
process.on("exit", () => { for (const p of live) p.kill("SIGKILL"); rmSync(memDir, { recursive: true, force: true }); });
setTimeout(() => { console.log(`FAIL watchdog: past ${WATCHDOG_MS / 1000} s`); process.exit(1); }, WATCHDOG_MS).unref();

function check(name, cond, detail = "") {
  if (!cond) {
    console.log(`FAIL ${name} ${detail}`);
    process.exit(1);
  }
  console.log(`ok   ${name} ${detail}`);
}

const startServer = () => spawnServer(bin, ["-m", model, "--port", "0", "--memory-dir", memDir, "-t", "2", "-c", "1024",
                                          "--model-id", "m", "--chat-template", "llama3"]);
const stopServer = (p) => stopChild(p, 20000);

async function agentTokens(port, id) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/agents/${id}`, { signal: AbortSignal.timeout(30000) });
  return r.status === 200 ? (await r.json()).tokens : -1;
}

// The cached prompt tokens the server reported for a run's one model call.
function cached(result) {
  const u = result.rawResponses[result.rawResponses.length - 1].usage;
  const d = u.inputTokensDetails;
  const one = Array.isArray(d) ? d[d.length - 1] : d;
  return one?.cached_tokens ?? -1;
}

agents.setTracingDisabled(true);
const makeAgent = (port) => new agents.Agent({
  name: "git-helper",
  instructions: "You answer questions about git, briefly.",
  model: new agents.OpenAIChatCompletionsModel(
    new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60000 }), "m"),
  modelSettings: { temperature: 0, maxTokens: 12, providerData: { prompt_cache_key: "git-helper" } },
});

const questions = ["How do I make a branch?", "And then?", "What about merging?", "One more thing?"];
let server = await startServer();
let agent = makeAgent(server.port);
let history = [];
let held = 0;
for (let turn = 0; turn < 3; turn++) {
  history.push(agents.user(questions[turn]));
  const result = await agents.run(agent, history);
  history = result.history;
  const c = cached(result);
  if (turn > 0) check(`turn ${turn + 1} reuses the agent's whole history`, c === held, `(cached ${c}, the agent held ${held})`);
  held = await agentTokens(server.port, "git-helper");
  check(`turn ${turn + 1}: the agent holds its history`, held > 0, `(${held} tokens; reply ${JSON.stringify(result.finalOutput)})`);
}
check("the server saves and exits on SIGTERM", (await stopServer(server)) === 0);
server = await startServer();
agent = makeAgent(server.port);
history.push(agents.user(questions[3]));
const result = await agents.run(agent, history);
check("after a restart the run is served warm with the whole history", cached(result) === held,
      `(cached ${cached(result)}, the agent held ${held})`);
await stopServer(server);
console.log("agents sdk: all checks passed");
