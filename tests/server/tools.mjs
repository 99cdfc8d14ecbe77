// tools.mjs BIN SHARED_DIR NODE_MODULES_DIR - tool calls and reasoning
// through the official `openai` npm client, on the shared random-weight
// models with their families' published templates (--chat-template-file):
// qwen2-tiny with Qwen2.5's (chatml), qwen3-tiny with Qwen3's, tiny-llama
// without one (the documented format), deepseek2-tiny with DeepSeek
// V3.1's (reasoning). The models write gibberish: what is checked is the
// protocol and validity, against the tools' schemas written out here by hand:
//   - tool_choice "required": finish_reason tool_calls, content null, ids
//     "call_" + 24 letters and digits, each call naming a tool, its
//     arguments JSON valid for that tool (a Pydantic-style schema: $defs,
//     anyOf with null, titles, defaults);
//   - a named function: every call names it; parallel_tool_calls false: one;
//   - streamed: OpenAI's chunks (index, then id, type and name first, then
//     argument pieces), the calls equal to the same greedy request's
//     unstreamed ones, no markup in any content delta;
//   - n 2, sampled: each choice its own valid call (ids apart), usage's
//     prompt once; streamed, each index's deltas that choice's calls;
//   - auto: content without markup, or valid calls;
//   - the call sent back with its result (role tool) by the same agent:
//     cached_tokens equal to what the agent held after the call (chatml,
//     qwen3; the documented format: the prompt before the reply);
//   - reasoning (deepseek V3.1, thinking on): reasoning_content apart from
//     content, streamed as delta.reasoning_content, content a JSON object
//     under response_format; with thinking off no reasoning_content;
//   - refusals: an unknown tool in tool_choice, a tool message answering no
//     call, an unsupported keyword in a tool's parameters (400s naming them).
// Exits 1 on the first failed check. Servers are killed on every exit
// path; clients never retry; a watchdog ends the script first.
import { agentTokens, checker, guard, live, refusal, startServer, stopServer } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, shared, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-tools-"));
const STOP_GRACE_MS = 20000;
guard(400000);
let server;
const check = checker(() => server);

// Pydantic v2's model_json_schema() of
//   class Unit(str, Enum): c = "c"; f = "f"
//   class Weather(BaseModel): city: str = Field(max_length=12); unit: Optional[Unit] = None
const weatherParams = {
  $defs: { Unit: { enum: ["c", "f"], title: "Unit", type: "string" } },
  properties: {
    city: { maxLength: 12, title: "City", type: "string" },
    unit: { anyOf: [{ $ref: "#/$defs/Unit" }, { type: "null" }], default: null },
  },
  required: ["city"], title: "Weather", type: "object", additionalProperties: false,
};
const tools = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city", parameters: weatherParams } },
  { type: "function", function: { name: "get_time", description: "The time now",
                                  parameters: { type: "object", properties: {}, additionalProperties: false } } },
];
const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);

// Why call c is not a valid call of tools, or null.
function callInvalid(c) {
  if (!/^call_[A-Za-z0-9]{24}$/.test(c.id ?? "")) return `id ${c.id}`;
  if (c.type !== "function") return `type ${c.type}`;
  let a;
  try { a = JSON.parse(c.function.arguments); } catch (e) { return `arguments not JSON: ${c.function.arguments}`; }
  if (!isObj(a)) return "arguments not an object";
  if (c.function.name === "get_time") return Object.keys(a).length ? `get_time with ${Object.keys(a)}` : null;
  if (c.function.name !== "get_weather") return `name ${c.function.name}`;
  if (typeof a.city !== "string" || [...a.city].length > 12) return `city ${JSON.stringify(a.city)}`;
  if ("unit" in a && a.unit !== null && a.unit !== "c" && a.unit !== "f") return `unit ${JSON.stringify(a.unit)}`;
  if (Object.keys(a).some((k) => k !== "city" && k !== "unit")) return `members ${Object.keys(a)}`;
  return null;
}
const MARKUP = /<tool_call>|<\/tool_call>|<think>|<\/think>|\[TOOL_CALLS\]|tool▁/;

// A streamed chat: per choice index, the calls assembled from OpenAI's
// deltas (checking the order of their fields), the content and reasoning,
// the finish reason and how many chunks gave one; choice 0's at the top,
// every choice's in `choices`.
async function streamed(client, req, opts) {
  const s = await client.chat.completions.create({ ...req, stream: true }, opts);
  const choices = [];
  for await (const chunk of s)
    for (const ch of chunk.choices) {
      const o = (choices[ch.index] ??= { calls: [], content: "", reasoning: "", finish: null, finishes: 0, order: null });
      const d = ch.delta ?? {};
      o.content += d.content ?? "";
      o.reasoning += d.reasoning_content ?? "";
      for (const tc of d.tool_calls ?? []) {
        if (!o.calls[tc.index]) {
          if (!tc.id || tc.type !== "function" || !tc.function?.name) o.order ??= `call ${tc.index} began without id/type/name`;
          o.calls[tc.index] = { id: tc.id, type: tc.type, function: { name: tc.function?.name ?? "", arguments: "" } };
        } else if (tc.id || tc.function?.name) o.order ??= `call ${tc.index}: id or name again`;
        o.calls[tc.index].function.arguments += tc.function?.arguments ?? "";
      }
      if (ch.finish_reason) { o.finish = ch.finish_reason; o.finishes++; }
    }
  return { ...(choices[0] ?? { calls: [], content: "", reasoning: "", finish: null, finishes: 0, order: null }), choices };
}



// The tool checks on one model and template.
async function toolChecks(label, model, template, resend, extra = {}) {
  const args = ["-m", join(shared, "models", model), "--port", "0", "--memory-dir", join(memDir, label), "-t", "2", "--model-id", "m",
                "-c", "1024"];
  if (template) args.push("--chat-template-file", join(shared, "templates", template));
  server = await startServer(bin, args);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: "unused", maxRetries: 0,
                              timeout: 120000 });
  const user = { role: "user", content: "What is the weather in Paris, and the time?" };
  const base = { model: "m", max_tokens: 120, temperature: 0, tools, messages: [user], ...extra };

  const r = await client.chat.completions.create({ ...base, tool_choice: "required" });
  const m = r.choices[0].message, calls = m.tool_calls ?? [];
  check(`${label}: required: finish tool_calls, content null, at least one call`,
        r.choices[0].finish_reason === "tool_calls" && m.content === null && calls.length >= 1, JSON.stringify(r.choices[0]));
  for (const c of calls) check(`${label}: required: call ${c.function.name} valid`, !callInvalid(c), callInvalid(c));
  check(`${label}: ids differ`, new Set(calls.map((c) => c.id)).size === calls.length, JSON.stringify(calls));

  const s = await streamed(client, { ...base, tool_choice: "required" });
  check(`${label}: streamed: id, type and name first, then arguments`, s.order === null, s.order);
  check(`${label}: streamed: the unstreamed calls, no content`, s.finish === "tool_calls" && s.content === "" &&
        JSON.stringify(s.calls.map((c) => c.function)) === JSON.stringify(calls.map((c) => c.function)),
        JSON.stringify({ s, calls }));

  const named = await client.chat.completions.create({ ...base, tool_choice: { type: "function", function: { name: "get_time" } } });
  const nc = named.choices[0].message.tool_calls ?? [];
  check(`${label}: a named function: every call names it`, nc.length >= 1 && nc.every((c) => c.function.name === "get_time" &&
        !callInvalid(c)), JSON.stringify(named.choices[0]));

  const one = await client.chat.completions.create({ ...base, tool_choice: "required", parallel_tool_calls: false });
  check(`${label}: parallel_tool_calls false: one call`, (one.choices[0].message.tool_calls ?? []).length === 1,
        JSON.stringify(one.choices[0]));

  // n: 2 sampled: each choice parsed into calls of its own (ids apart), the prompt counted once;
  // streamed, each index's deltas make that choice's calls and one finish
  const two = { ...base, temperature: 1, seed: 11, n: 2, tool_choice: "required", parallel_tool_calls: false };
  const rn = await client.chat.completions.create(two);
  check(`${label}: n 2: choices 0 and 1, each a valid call`, rn.choices.length === 2 && rn.choices.every((c, i) =>
        c.index === i && c.finish_reason === "tool_calls" && (c.message.tool_calls ?? []).length === 1 &&
        !callInvalid(c.message.tool_calls[0])), JSON.stringify(rn.choices));
  const nIds = rn.choices.flatMap((c) => (c.message.tool_calls ?? []).map((x) => x.id));
  check(`${label}: n 2: ids differ across choices, usage counts the prompt once`, new Set(nIds).size === nIds.length &&
        rn.usage.prompt_tokens === r.usage.prompt_tokens, JSON.stringify({ nIds, usage: rn.usage }));
  const sn = await streamed(client, two);
  check(`${label}: n 2 streamed: each index the unstreamed choice's calls, one finish`, sn.choices.length === 2 &&
        sn.choices.every((o, i) => o.order === null && o.finishes === 1 && o.finish === "tool_calls" && o.content === "" &&
        JSON.stringify(o.calls.map((c) => c.function)) ===
        JSON.stringify((rn.choices[i].message.tool_calls ?? []).map((c) => c.function))), JSON.stringify(sn.choices));

  for (const seed of [1, 2]) {
    const a = await streamed(client, { ...base, temperature: 1, seed, tool_choice: "auto" });
    check(`${label}: auto (seed ${seed}): content without markup, calls valid`, !MARKUP.test(a.content) &&
          a.calls.every((c) => !callInvalid(c)) && (a.calls.length ? a.finish === "tool_calls" : a.finish !== "tool_calls"),
          JSON.stringify(a));
  }

  // the call and its result sent back by the same agent: its history is reused up to the result
  const agent = { headers: { "X-Agent-Id": `tools-${label}` } };
  const t1 = await client.chat.completions.create({ ...base, tool_choice: "required" }, agent);
  const held = await agentTokens(server.port, `tools-${label}`);
  const back = t1.choices[0].message;
  const results = back.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: "sunny, 21 C" }));
  const t2 = await client.chat.completions.create({ ...base, tool_choice: "none", max_tokens: 8,
                                                    messages: [user, back, ...results] }, agent);
  const cached = t2.usage.prompt_tokens_details?.cached_tokens;
  // the families whose replies with calls the history stands for (chat_resend.h); the others reuse
  // the prompt before the reply
  const whole = resend ? held : t1.usage.prompt_tokens;
  check(`${label}: the call sent back with its result: cached_tokens = ${resend ? "the agent's history" : "the first prompt"} (${whole})`,
        held > 0 && cached === whole && t2.usage.prompt_tokens > held && !t2.choices[0].message.tool_calls,
        JSON.stringify({ held, usage: t2.usage }));

  const e1 = await refusal(() => client.chat.completions.create({ ...base, tool_choice: { type: "function", function: { name: "nope" } } }));
  check(`${label}: an unknown tool in tool_choice: 400`, e1?.status === 400 && e1.param === "tool_choice.function.name", JSON.stringify(e1));
  const e2 = await refusal(() => client.chat.completions.create({ ...base,
    messages: [user, back, { role: "tool", tool_call_id: "call_unknown", content: "x" }] }));
  check(`${label}: a result answering no call: 400`, e2?.status === 400 && e2.param === "messages[2].tool_call_id", JSON.stringify(e2));
  const e3 = await refusal(() => client.chat.completions.create({ ...base, tools: [tools[0], { type: "function",
    function: { name: "odd", parameters: { type: "object", properties: { n: { type: "integer", multipleOf: 3 } } } } }] }));
  check(`${label}: an unsupported keyword in a tool's parameters: 400 naming it`, e3?.status === 400 &&
        e3.param === "tools[1].function.parameters" && e3.code === "unsupported_schema_keyword" &&
        e3.message.includes("multipleOf"), JSON.stringify(e3));
  await stopServer(server, STOP_GRACE_MS);
}

// Reasoning: DeepSeek V3.1 with thinking on leaves the model inside its
// reasoning; the JSON reply is held from after "</think>".
async function reasoningChecks() {
  server = await startServer(bin, ["-m", join(shared, "models", "deepseek2-tiny.gguf"), "--port", "0", "--memory-dir",
    join(memDir, "ds"), "-t", "2", "-c", "1024", "--model-id", "m", "--chat-template-file",
    join(shared, "templates", "deepseek-ai-DeepSeek-V3.1.jinja")]);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: "unused", maxRetries: 0,
                              timeout: 120000 });
  const req = { model: "m", max_tokens: 40, temperature: 0, messages: [{ role: "user", content: "Think, then answer in JSON." }],
                response_format: { type: "json_object" }, chat_template_kwargs: { enable_thinking: true } };
  const r = await client.chat.completions.create(req);
  const m = r.choices[0].message;
  let parsed = null;
  try { parsed = JSON.parse(m.content); } catch (e) { /* checked below */ }
  check("reasoning: reasoning_content apart, content a JSON object without markup",
        typeof m.reasoning_content === "string" && m.reasoning_content.length > 0 && isObj(parsed) &&
        !MARKUP.test(m.content) && !MARKUP.test(m.reasoning_content), JSON.stringify(r.choices[0]));
  const s = await streamed(client, req);
  check("reasoning: streamed as delta.reasoning_content, the same texts",
        s.reasoning === m.reasoning_content && s.content === m.content, JSON.stringify({ s, m }));
  const off = await client.chat.completions.create({ ...req, chat_template_kwargs: { enable_thinking: false } });
  let p2 = null;
  try { p2 = JSON.parse(off.choices[0].message.content); } catch (e) { /* checked below */ }
  check("reasoning off: no reasoning_content, the content a JSON object",
        !off.choices[0].message.reasoning_content && isObj(p2), JSON.stringify(off.choices[0]));
  await stopServer(server, STOP_GRACE_MS);
}

try {
  await toolChecks("chatml", "qwen2-tiny.gguf", "Qwen-Qwen2.5-7B-Instruct.jinja", true);
  await toolChecks("qwen3", "qwen3-tiny.gguf", "Qwen-Qwen3-0.6B.jinja", true, { reasoning_effort: "none" });
  await toolChecks("plain", "tiny-llama-h64-gqa-f16.gguf", null, false);
  await reasoningChecks();
  console.log(`tools: ${check.passed()} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p, STOP_GRACE_MS);
  rmSync(memDir, { recursive: true, force: true });
}
