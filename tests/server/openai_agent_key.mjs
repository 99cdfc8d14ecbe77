// openai_agent_key.mjs BIN MODEL NODE_MODULES_DIR - the official `openai` npm
// client names an agent with prompt_cache_key, no header: the first call
// creates the agent (listed by GET /v1/agents), the next one with the same
// key reports cached prompt tokens; after a SIGTERM (which saves agents) and
// a restart on the same memory directory the next call is served warm from
// disk (tier "warm", cached tokens > 0, a restore counted in /metrics). A
// call with neither the header nor the key creates no agent; with both, the
// header names the agent. Refusals come back as the client's errors naming
// the field. Exits 1 on the first failed check.
//
// Every server it starts is killed on every exit path: SIGTERM, then SIGKILL
// after STOP_GRACE_MS. Clients never retry and give up on a request after
// REQUEST_TIMEOUT_MS; a watchdog ends the script before test_server.c's limit.
import { live, startServer as spawnServer, stopServer as stopChild } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-key-"));
const REQUEST_TIMEOUT_MS = 60000;
const STOP_GRACE_MS = 20000;
const WATCHDOG_MS = 170000;   // below test_server.c's timeout, so this script reports first
const newClient = (port) =>
  new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0, timeout: REQUEST_TIMEOUT_MS });
process.on("exit", () => { for (const p of live) p.kill("SIGKILL"); });
setTimeout(() => {
  console.log(`FAIL watchdog: the script ran past ${WATCHDOG_MS / 1000} s`);
  for (const p of live) { console.log(p.getLog()); p.kill("SIGKILL"); }
  process.exit(1);
}, WATCHDOG_MS).unref();

let server;
let passed = 0;
function check(name, cond, detail = "") {
  if (!cond) {
    console.log(`FAIL ${name} ${detail}`);
    if (server) console.log(server.getLog());
    process.exitCode = 1;
    throw new Error(name);
  }
  passed++;
  console.log(`ok   ${name}`);
}

function startServer() {
  return spawnServer(bin, ["-m", model, "--port", "0", "--memory-dir", memDir, "-t", "2", "-c", "512",
                          "--kv-budget", "120K", "-ctk", "q8", "-ctv", "q8"]);
}

// SIGTERM, then SIGKILL after STOP_GRACE_MS; resolves to the exit code (or the signal's name).
function stopServer(p) {
  return stopChild(p, STOP_GRACE_MS);
}

// GET path (under the server's root) as text, bounded in time.
async function getText(port, path) {
  const r = await fetch(`http://127.0.0.1:${port}${path}`, { signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
  return r.text();
}

// The ids GET /v1/agents lists.
async function agentIds(client) {
  const a = await client.get("/agents");
  return a.data.map((x) => x.id).sort();
}

// The value of a Prometheus counter line "name value" (0 when absent).
function metric(text, name) {
  const m = text.match(new RegExp(`^${name} ([0-9.e+]+)$`, "m"));
  return m ? Number(m[1]) : 0;
}

// The error a call raised (status, param, code), or null when it succeeded.
async function refusal(call) {
  try {
    await call();
    return null;
  } catch (e) {
    return { status: e.status, param: e.param ?? e.error?.param, code: e.code ?? e.error?.code, message: e.message };
  }
}

const system = { role: "system", content: "You are the writer. You write short tales." };
const asks = ["Write about a cat.", "Now the cat finds a ball.", "End the tale."];
const history = [];
async function writerTurn(client, phase) {
  const messages = [system, ...history, { role: "user", content: asks[phase] }];
  const r = await client.chat.completions.create({ model: "stories260K", messages, max_tokens: 12, temperature: 0,
                                                   prompt_cache_key: "writer-1" });
  history.push({ role: "user", content: asks[phase] }, { role: "assistant", content: r.choices[0].message.content });
  return r;
}

try {
  server = await startServer();
  let client = newClient(server.port);
  check("a fresh server has no agents", (await agentIds(client)).length === 0);

  // the key alone names the agent
  const r1 = await writerTurn(client, 0);
  check("prompt_cache_key creates agent writer-1", r1.agentkv?.agent_id === "writer-1", JSON.stringify(r1.agentkv));
  check("GET /v1/agents lists writer-1", JSON.stringify(await agentIds(client)) === JSON.stringify(["writer-1"]));
  const r2 = await writerTurn(client, 1);
  const cached2 = r2.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  check(`the second call with the key reports ${cached2} cached tokens, tier ${r2.agentkv?.tier}`,
        cached2 > 0 && r2.agentkv.agent_id === "writer-1" && r2.agentkv.tier === "hot", JSON.stringify(r2.usage));

  // neither the header nor the key: no agent
  const anon = await client.chat.completions.create({ model: "stories260K", max_tokens: 4, temperature: 0,
                                                      messages: [{ role: "user", content: "Hello there." }] });
  check("a call with neither header nor key is anonymous", anon.agentkv?.agent_id === null, JSON.stringify(anon.agentkv));
  const anonC = await client.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 4 });
  check("a completion with neither is anonymous", anonC.agentkv?.agent_id === null, JSON.stringify(anonC.agentkv));
  check("... and creates no agent", JSON.stringify(await agentIds(client)) === JSON.stringify(["writer-1"]));

  // completions take the key too; the header wins over it
  const c1 = await client.completions.create({ model: "stories260K", prompt: "The sun was warm.", max_tokens: 4,
                                               prompt_cache_key: "teller" });
  check("completions: prompt_cache_key names the agent", c1.agentkv?.agent_id === "teller", JSON.stringify(c1.agentkv));
  const h = await client.chat.completions.create(
    { model: "stories260K", max_tokens: 4, messages: [{ role: "user", content: "Hi." }], prompt_cache_key: "other" },
    { headers: { "X-Agent-Id": "by-header" } });
  check("with both, the header names the agent", h.agentkv?.agent_id === "by-header", JSON.stringify(h.agentkv));
  check("GET /v1/agents: writer-1, teller, by-header (no 'other')",
        JSON.stringify(await agentIds(client)) === JSON.stringify(["by-header", "teller", "writer-1"]));

  // refusals name the field
  let e = await refusal(() => client.chat.completions.create(
    { model: "stories260K", messages: [{ role: "user", content: "Hi." }], prompt_cache_key: "../etc" }));
  check("an invalid key: 400 invalid_agent_id naming prompt_cache_key",
        e?.status === 400 && e.param === "prompt_cache_key" && e.code === "invalid_agent_id", JSON.stringify(e));
  e = await refusal(() => client.chat.completions.create(
    { model: "stories260K", messages: [{ role: "user", content: "Hi." }], tools: 5 }));
  check("tools: 5 is 400 invalid_type naming tools", e?.status === 400 && e.param === "tools" && e.code === "invalid_type",
        JSON.stringify(e));
  // (tools themselves: tools.mjs; their prompt does not fit this server's small KV budget)
  // what SDKs and frameworks send along is accepted
  const extras = await client.chat.completions.create({
    model: "stories260K", messages: [{ role: "user", content: "Hi." }], max_completion_tokens: 4, temperature: 0,
    store: false, metadata: { run: "7" }, parallel_tool_calls: true, user: "u", service_tier: "auto",
    stream_options: null, logprobs: false, n: 1, seed: 3, frequency_penalty: 0.5, presence_penalty: 0.25,
    logit_bias: { "5": -100 }, top_k: 20, min_p: 0.05, prompt_cache_key: "writer-extras" });
  check("an SDK's extras are accepted", extras.choices[0].message.content !== undefined &&
        extras.agentkv.agent_id === "writer-extras");

  const code = await stopServer(server);
  check("SIGTERM: the server exits 0 after saving", code === 0, server.getLog());

  // the same memory directory: writer-1 comes back warm from disk
  server = await startServer();
  client = newClient(server.port);
  check("after the restart GET /v1/agents still lists writer-1", (await agentIds(client)).includes("writer-1"));
  const before = metric(await getText(server.port, "/metrics"), "agentkv_restores_total");
  const r3 = await writerTurn(client, 2);
  const cached3 = r3.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  check(`after the restart the key is served warm: tier ${r3.agentkv?.tier}, ${cached3} cached tokens`,
        r3.agentkv?.agent_id === "writer-1" && r3.agentkv.tier === "warm" && cached3 > 0, JSON.stringify(r3.agentkv));
  const after = metric(await getText(server.port, "/metrics"), "agentkv_restores_total");
  check(`/metrics counts the restore (${before} -> ${after})`, after > before);
  console.log(`openai agent key: ${passed} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p);
  rmSync(memDir, { recursive: true, force: true });
}
