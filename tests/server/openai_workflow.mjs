// openai_workflow.mjs BIN MODEL NODE_MODULES_DIR - the official `openai` npm
// client against `agentkv serve`: a planner / worker / critic workflow over
// three phases, streaming and not. Phase 2 of every agent must report
// cached_tokens > 0 and tier hot or warm; the server is then restarted and
// phase 3 must report tier warm. Greedy replies must equal `agentkv run` on
// the same rendered prompt. Exits 1 on the first failed check.
//
// Every server it starts is killed on every exit path (a failed check, a
// thrown request, the watchdog): SIGTERM, then SIGKILL if it has not exited
// within STOP_GRACE_MS. Clients never retry (maxRetries 0: an error cannot
// hide behind a retry) and give up on a request after REQUEST_TIMEOUT_MS.
import { execFileSync } from "node:child_process";
import { live, startServer as spawnServer, stopServer as stopChild } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-openai-"));
const REQUEST_TIMEOUT_MS = 120000;
const STOP_GRACE_MS = 20000;
const WATCHDOG_MS = 280000;   // below test_server.c's timeout, so this script reports first
const newClient = (port) =>
  new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0, timeout: REQUEST_TIMEOUT_MS });
// the last resort: whatever ends the process, no server outlives it
process.on("exit", () => { for (const p of live) p.kill("SIGKILL"); });
setTimeout(() => {
  console.log(`FAIL watchdog: the workflow ran past ${WATCHDOG_MS / 1000} s`);
  for (const p of live) { console.log(p.getLog()); p.kill("SIGKILL"); }
  process.exit(1);
}, WATCHDOG_MS).unref();
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

function startServer(extra = ["--kv-budget", "120K", "-ctk", "q8", "-ctv", "q8"], dir = memDir) {
  return spawnServer(bin, ["-m", model, "--port", "0", "--memory-dir", dir, "-t", "2", "-c", "512", ...extra]);
}

// SIGTERM, then SIGKILL after STOP_GRACE_MS; resolves to the exit code (or
// the signal's name when it was killed).
function stopServer(p) {
  return stopChild(p, STOP_GRACE_MS);
}

const roles = {
  planner: "You are the planner. You break a task into steps.",
  worker: "You are the worker. You do the steps.",
  critic: "You are the critic. You find what is wrong.",
};
const asks = ["The task: a story about a red ball.", "Go on with the next part.", "Finish it in one line."];
const history = { planner: [], worker: [], critic: [] };

async function turn(client, agent, phase, stream) {
  const messages = [{ role: "system", content: roles[agent] }, ...history[agent], { role: "user", content: asks[phase] }];
  const req = { model: "stories260K", messages, max_tokens: 16, temperature: 0 };
  const opts = { headers: { "X-Agent-Id": agent } };
  let text = "", usage, agentkv;
  if (stream) {
    const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }, opts);
    for await (const chunk of s) {
      for (const c of chunk.choices) text += c.delta?.content ?? "";
      if (chunk.usage) { usage = chunk.usage; agentkv = chunk.agentkv; }
    }
  } else {
    const r = await client.chat.completions.create(req, opts);
    text = r.choices[0].message.content;
    usage = r.usage;
    agentkv = r.agentkv;
  }
  history[agent].push({ role: "user", content: asks[phase] }, { role: "assistant", content: text });
  return { text, usage, agentkv };
}

// 32 agents, each told its own secret, then asked for it: all at once under
// a KV budget that holds a few of them (evictions to disk), vs one agent at a
// time on a fresh server with no budget. Greedy: the replies must be equal.
async function secrets(extra, concurrent) {
  const dir = mkdtempSync(join(tmpdir(), "agentkv-secrets-"));
  const srv = await startServer(extra, dir);
  const client = newClient(srv.port);
  const names = ["Tom", "Lily", "Sue", "Max", "Ben", "Anna", "Sam", "Mia"];
  const out = {};
  const one = async (i, phase) => {
    const id = `secret-${i}`;
    const first = { role: "user", content: `${names[i % 8]} has a secret. The secret number is ${i * 37 + 11}.` };
    const msgs = phase === 0 ? [first] : [first, { role: "assistant", content: out[id][0] }, { role: "user", content: "What is the secret number?" }];
    const r = await client.chat.completions.create({ model: "stories260K", messages: msgs, max_tokens: 12, temperature: 0 },
                                                   { headers: { "X-Agent-Id": id } });
    (out[id] ??= []).push(r.choices[0].message.content);
    return r.agentkv.tier;
  };
  const tiers = [];
  let code;
  try {
    for (const phase of [0, 1]) {
      if (concurrent) tiers.push(...await Promise.all([...Array(32).keys()].map((i) => one(i, phase))));
      else for (let i = 0; i < 32; i++) tiers.push(await one(i, phase));
    }
  } catch (e) {
    console.log(srv.getLog());
    throw e;
  } finally {
    code = await stopServer(srv);
    rmSync(dir, { recursive: true, force: true });
  }
  return { out, tiers, code };
}

let server;
try {
  const alone = await secrets(["--max-agents", "1"], false);
  const crowd = await secrets(["--kv-budget", "256K", "--max-agents", "8"], true);
  const warm = crowd.tiers.slice(32).filter((t) => t === "warm").length;
  check(`32 agents at once under a small budget: ${warm} of 32 came back warm from disk`, warm >= 8);
  const diff = Object.keys(alone.out).filter((id) => JSON.stringify(alone.out[id]) !== JSON.stringify(crowd.out[id]));
  check("32 agents: every reply equals the agent's reply when run alone (no leaks)", diff.length === 0,
        JSON.stringify(diff.map((id) => [id, alone.out[id], crowd.out[id]])));
  check("32 agents: both servers exit 0", alone.code === 0 && crowd.code === 0);

  server = await startServer();
  let client = newClient(server.port);
  const models = await client.models.list();
  check("models.list names the model", models.data.some((m) => m.id === "stories260K"));

  // greedy over the client equals agentkv run on the same text (plain template)
  const c = await client.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 20, temperature: 0 });
  const ref = execFileSync(bin, ["run", "-m", model, "-p", "Once upon a time", "-n", "20", "--temp", "0"],
                           { stdio: ["ignore", "pipe", "ignore"], timeout: REQUEST_TIMEOUT_MS, killSignal: "SIGKILL" }).toString().replace(/\n$/, "");
  check("completions.create greedy == agentkv run", c.choices[0].text === ref, JSON.stringify([c.choices[0].text, ref]));

  // phase 1 and 2, all three agents concurrently; streaming for the worker
  for (const phase of [0, 1]) {
    const results = await Promise.all(Object.keys(roles).map((a) => turn(client, a, phase, a === "worker")));
    Object.keys(roles).forEach((a, i) => {
      const r = results[i];
      check(`phase ${phase + 1} ${a}: a reply with usage`, r.text.length > 0 && r.usage?.prompt_tokens > 0, JSON.stringify(r));
      if (phase === 1)
        check(`phase 2 ${a}: cached_tokens > 0, tier ${r.agentkv?.tier}`,
              r.usage.prompt_tokens_details.cached_tokens > 0 && ["hot", "warm"].includes(r.agentkv.tier), JSON.stringify(r.usage));
    });
  }
  const code = await stopServer(server);
  check("SIGTERM: the server exits 0 after saving", code === 0, server.getLog());

  server = await startServer();
  client = newClient(server.port);
  const results = await Promise.all(Object.keys(roles).map((a) => turn(client, a, 2, a !== "worker")));
  Object.keys(roles).forEach((a, i) => {
    const r = results[i];
    check(`phase 3 after restart ${a}: tier warm, cached_tokens ${r.usage.prompt_tokens_details.cached_tokens}`,
          r.agentkv.tier === "warm" && r.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(r.agentkv));
  });
  const agents = await client.get("/agents");
  check("GET /v1/agents through the client lists the three", ["planner", "worker", "critic"].every((a) => agents.data.some((x) => x.id === a)));
  let status = 0;
  try {
    await client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "hi" }] });
  } catch (e) {
    status = e.status;
  }
  check("an unknown model raises the client's 404 error", status === 404);
  console.log(`openai: ${passed} passed, 0 failed`);
} catch (e) {
  if (!process.exitCode) { console.log("FAIL", e?.stack ?? e); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p);
  rmSync(memDir, { recursive: true, force: true });
}
