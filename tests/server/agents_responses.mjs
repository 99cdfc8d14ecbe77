// agents_responses.mjs BIN SHARED_DIR NODE_MODULES_DIR - the OpenAI Agents
// SDK (@openai/agents) on its default model, the Responses API, against
// `agentkv serve` (qwen2-tiny with Qwen2.5's template: random weights, the
// protocol is what is checked):
//   - a triage agent with two handoffs and one function tool,
//     toolChoice "required" so the model must call, every agent with a
//     structured output (Zod) so that a random model's answer ends: the run
//     completes
//     (a final output), in the SDK's default mode (every item resent) and
//     with previousResponseId (only new items sent);
//   - five tool round trips in the default mode: every model call after the
//     first continues the stored chain (the same agent), the tokens
//     prefilled per call stay flat (the new call and its output, not the
//     history), and the chain is one agent holding each token once.
// Exits 1 on the first failed check; the server is killed on every exit
// path; no client retries; a watchdog ends the script first.
import { checker, guard, live, startServer, stopServer } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, shared, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const agents = require("@openai/agents");
const OpenAI = require("openai").default ?? require("openai");
const { z } = require("zod");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-agents-resp-"));
guard(280000);
let server;
const check = checker(() => server);
agents.setTracingDisabled(true);

server = await startServer(bin, ["-m", join(shared, "models", "qwen2-tiny.gguf"), "--port", "0", "--memory-dir", memDir,
  "-t", "2", "-c", "2048", "--model-id", "m", "--chat-template-file",
  join(shared, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")]);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120000 });
const model = new agents.OpenAIResponsesModel(client, "m");

try {
  let looked = 0;
  const lookup = agents.tool({ name: "lookup", description: "Look an order up",
                               parameters: z.object({ order: z.string().max(8) }),
                               execute: async ({ order }) => { looked++; return `order ${order}: shipped`; } });
  // a structured output, so that a random model's answer ends (the grammar closes it); one call a turn
  const settings = { temperature: 0, maxTokens: 160, parallelToolCalls: false };
  const outputType = z.object({ answer: z.string().max(12) });
  const billing = new agents.Agent({ name: "billing", instructions: "You handle invoices.", model, outputType,
                                    modelSettings: settings });
  const support = new agents.Agent({ name: "support", instructions: "You fix problems.", model, outputType,
                                    modelSettings: settings });
  const triage = new agents.Agent({ name: "triage", instructions: "Route the customer.", model, tools: [lookup], outputType,
                                    handoffs: [billing, support], modelSettings: { ...settings, toolChoice: "required" } });

  // the default mode: each model call resends the run's items
  const r1 = await agents.run(triage, "Where is my order 42?", { maxTurns: 8 });
  const calls1 = r1.rawResponses.length;
  check("triage, default mode: the run completes with a final output after a call",
        typeof r1.finalOutput?.answer === "string" && calls1 >= 2 && (looked > 0 || r1.lastAgent.name !== "triage"),
        JSON.stringify({ out: r1.finalOutput, calls1, looked, last: r1.lastAgent.name }));

  // previousResponseId: the next run sends only its new items
  const r2 = await agents.run(triage, "And my invoice?", { maxTurns: 8, previousResponseId: r1.lastResponseId });
  check("triage, previousResponseId: the run completes", typeof r2.finalOutput?.answer === "string" && r2.rawResponses.length >= 1,
        JSON.stringify({ out: r2.finalOutput, n: r2.rawResponses.length }));
  const u2 = r2.rawResponses[0].usage;
  check("previousResponseId: the first call reuses the stored chain", (u2.inputTokensDetails?.[0]?.cached_tokens ??
        u2.inputTokensDetails?.cached_tokens ?? 0) > 0, JSON.stringify(u2));

  // five tool round trips, default mode
  let n = 0;
  const counter = agents.tool({ name: "count", description: "Count one more", parameters: z.object({}),
                                execute: async () => `count ${++n}` });
  const worker = new agents.Agent({ name: "worker", instructions: "Count.", model, tools: [counter],
    modelSettings: { ...settings, toolChoice: "required" }, resetToolChoice: false,
    toolUseBehavior: async (_ctx, results) => ({ isFinalOutput: n >= 5, isInterrupted: undefined,
                                                 finalOutput: n >= 5 ? results.map((r) => r.output).join(";") : undefined }) });
  const r3 = await agents.run(worker, "Count to five.", { maxTurns: 10 });
  const u = r3.rawResponses.map((r) => {
    const d = r.usage.inputTokensDetails;
    const cachedTok = (Array.isArray(d) ? d[0] : d)?.cached_tokens ?? 0;
    return { input: r.usage.inputTokens, cached: cachedTok, prefilled: r.usage.inputTokens - cachedTok };
  });
  check("five round trips: five model calls, five tool results", n === 5 && u.length === 5, JSON.stringify({ n, u }));
  const later = u.slice(1).map((x) => x.prefilled);
  check("five round trips: every later call continues the chain (the history cached)",
        u.slice(1).every((x, i) => x.cached >= u[i].input), JSON.stringify(u));
  check("five round trips: the tokens prefilled per call stay flat",
        Math.max(...later) - Math.min(...later) <= 12 && u[4].prefilled * 3 < u[4].input, JSON.stringify(u));
  const ids = r3.rawResponses.map((r) => r.responseId);
  const listed = await (await fetch(`http://127.0.0.1:${server.port}/v1/agents`)).json();
  const rec = await (await fetch(`http://127.0.0.1:${server.port}/v1/responses/${ids[4]}`)).json();
  const agentId = rec.agentkv?.agent_id;
  const mine = listed.data.filter((a) => a.id === agentId);
  const chainAgents = listed.data.filter((a) => ids.includes(a.id));
  check("five round trips: one agent holds the chain, each token once",
        mine.length === 1 && chainAgents.length <= 1 &&
        /* the history and the last reply (its final token, the end of the turn, is never fed back) */
        Math.abs(mine[0].tokens - (u[4].input + r3.rawResponses[4].usage.outputTokens - 1)) <= 1,
        JSON.stringify({ agentId, mine, u4: u[4], out4: r3.rawResponses[4].usage.outputTokens, chainAgents: chainAgents.map((a) => a.id) }));
  console.log(`agents responses: ${check.passed()} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p, 20000);
  rmSync(memDir, { recursive: true, force: true });
}
