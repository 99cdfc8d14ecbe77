// responses.mjs BIN SHARED_DIR NODE_MODULES_DIR - the Responses API
// through the official `openai` npm client, on qwen2-tiny with Qwen2.5's
// template (random weights: the text is gibberish, the protocol is what is
// checked):
//   - responses.create: output items, output_text, usage with cached and
//     reasoning tokens, status completed or incomplete (max_output_tokens);
//   - streamed: response.created first, sequence numbers 0, 1, 2, ...,
//     the deltas concatenated equal the unstreamed text, a terminal
//     response.completed / response.incomplete holding the same output;
//     GET of a streamed response: that output; the SDK's streamed mode
//     (items resent, streamed) continues the stored response;
//   - previous_response_id: the continuation reuses the chain's agent
//     (cached_tokens = everything the agent held), after a server restart
//     too (tier warm); a branch (a response continued twice) gets an agent
//     of its own linking the common blocks, the first branch keeps its
//     agent; an unknown id is a 400 previous_response_not_found;
//   - a function call (tool_choice required) and its function_call_output
//     sent back: the result is read, the call's tokens reused;
//   - the SDK's default mode: no previous_response_id, the whole item list
//     resent each call: it continues the stored response (same agent,
//     cached_tokens = what the agent held);
//   - text.format json_schema: the output parses and validates;
//   - GET, input_items, DELETE (then GET 404), store: false (GET 404);
//   - conversations: created with items, used by two responses (the second
//     sees the first's items: cached tokens), items listed.
// Exits 1 on the first failed check; servers are killed on every exit path.
import { agentTokens, checker, guard, live, refusal, startServer, stopServer } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, shared, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-responses-"));
const STOP_GRACE_MS = 20000;
guard(280000);
let server;
const check = checker(() => server);

const serveArgs = ["-m", join(shared, "models", "qwen2-tiny.gguf"), "--port", "0", "--memory-dir", memDir, "-t", "2",
              "-c", "1024", "--model-id", "m", "--chat-template-file",
              join(shared, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")];
const connect = (port) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0,
                                       timeout: 120000 });
const textOf = (r) => r.output.filter((i) => i.type === "message").flatMap((i) => i.content)
  .filter((c) => c.type === "output_text").map((c) => c.text).join("");



try {
  server = await startServer(bin, serveArgs);
  let client = connect(server.port);
  const base = { model: "m", max_output_tokens: 16, temperature: 0, instructions: "You are terse." };

  // a response
  const r1 = await client.responses.create({ ...base, input: "Name a colour." });
  check("create: a completed or incomplete response with a message", r1.object === "response" &&
        ["completed", "incomplete"].includes(r1.status) && r1.output.length >= 1 && r1.output[0].type === "message" &&
        typeof r1.output_text === "string" && r1.output_text === textOf(r1), JSON.stringify(r1));
  check("create: usage", r1.usage.input_tokens > 0 && r1.usage.output_tokens === 16 &&
        r1.usage.input_tokens_details.cached_tokens === 0 && r1.usage.output_tokens_details.reasoning_tokens === 0 &&
        r1.usage.total_tokens === r1.usage.input_tokens + r1.usage.output_tokens, JSON.stringify(r1.usage));
  check("create: cut by max_output_tokens: incomplete", r1.status === "incomplete" &&
        r1.incomplete_details?.reason === "max_output_tokens", JSON.stringify(r1));

  // streamed: the same greedy text
  const events = [];
  const stream = await client.responses.create({ ...base, input: "Name a colour.", stream: true });
  for await (const e of stream) events.push(e);
  const types = events.map((e) => e.type);
  const deltas = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  const last = events[events.length - 1];
  check("stream: created, in_progress first; sequence numbers in order",
        types[0] === "response.created" && types[1] === "response.in_progress" &&
        events.every((e, i) => e.sequence_number === i), JSON.stringify(types));
  check("stream: item and part events around the deltas", types.includes("response.output_item.added") &&
        types.includes("response.content_part.added") && types.includes("response.output_text.done") &&
        types.includes("response.content_part.done") && types.includes("response.output_item.done"), JSON.stringify(types));
  check("stream: the deltas are the unstreamed text, the terminal event holds it",
        deltas === r1.output_text && last.type === "response.incomplete" && textOf(last.response) === deltas,
        JSON.stringify({ deltas, text: r1.output_text, last: last.type }));

  // a streamed response is stored as the terminal event has it (GET), and the SDK's streamed mode
  // (every item resent, streamed) continues it: its agent, its history reused. Another input than
  // r1's: a record with r1's items would match the resent conversation whatever the stream stored.
  const streamed = async (body) => {
    const evs = [];
    for await (const e of await client.responses.create({ ...body, stream: true })) evs.push(e);
    return evs[evs.length - 1].response;
  };
  const f1 = await streamed({ ...base, input: [{ role: "user", content: "Name a fruit." }] });
  const gf = await client.responses.retrieve(f1.id);
  check("stream: GET holds the output of the terminal event", JSON.stringify(gf.output) === JSON.stringify(f1.output) &&
        f1.output.every((i) => i.status !== "in_progress"), JSON.stringify({ get: gf.output, streamed: f1.output }));
  const heldF = await agentTokens(server.port, f1.agentkv.agent_id);
  const f2 = await streamed({ ...base,
    input: [{ role: "user", content: "Name a fruit." }, ...f1.output, { role: "user", content: "Why?" }] });
  check("stream, resent conversation: the stored response continued (same agent, its history reused)",
        heldF > 0 && f2.agentkv.agent_id === f1.agentkv.agent_id && f2.usage.input_tokens_details.cached_tokens === heldF,
        JSON.stringify({ heldF, a1: f1.agentkv.agent_id, a2: f2.agentkv.agent_id, usage: f2.usage }));

  // previous_response_id: the chain's agent serves the continuation
  const agent1 = r1.agentkv?.agent_id;
  const held1 = await agentTokens(server.port, agent1);
  const r2 = await client.responses.create({ ...base, input: "Another.", previous_response_id: r1.id });
  check("previous_response_id: the chain's history reused", held1 > 0 && r2.agentkv.agent_id === agent1 &&
        r2.usage.input_tokens_details.cached_tokens === held1 && r2.usage.input_tokens > held1,
        JSON.stringify({ held1, usage: r2.usage, agent: r2.agentkv }));
  // a branch: r1 continued a second time gets an agent of its own that links the chain's common blocks;
  // the first branch keeps its agent and its whole history
  const heldR2 = await agentTokens(server.port, agent1);
  const b2 = await client.responses.create({ ...base, input: "Or else?", previous_response_id: r1.id });
  check("a branch: an agent of its own, the common history's blocks linked",
        b2.agentkv.agent_id !== agent1 && b2.agentkv.shared >= 32 && b2.usage.input_tokens_details.cached_tokens >= 32,
        JSON.stringify({ agent: b2.agentkv, usage: b2.usage }));
  const r2b = await client.responses.create({ ...base, input: "Still?", previous_response_id: r2.id });
  check("the first branch goes on on its agent, its whole history reused",
        r2b.agentkv.agent_id === agent1 && r2b.usage.input_tokens_details.cached_tokens === heldR2,
        JSON.stringify({ heldR2, usage: r2b.usage }));
  const e1 = await refusal(() => client.responses.create({ ...base, input: "x", previous_response_id: "resp-nope" }));
  check("an unknown previous_response_id: 400 previous_response_not_found", e1?.status === 400 &&
        e1.code === "previous_response_not_found" && e1.param === "previous_response_id", JSON.stringify(e1));

  // a function call and its output
  const tools = [{ type: "function", name: "get_weather", description: "The weather",
                   parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"],
                                 additionalProperties: false }, strict: true }];
  const c1 = await client.responses.create({ ...base, max_output_tokens: 60, input: "Weather in Oslo?", tools,
                                             tool_choice: "required" });
  const call = c1.output.find((i) => i.type === "function_call");
  let args = null;
  try { args = JSON.parse(call?.arguments); } catch (e) { /* checked below */ }
  check("a required call: a function_call item with valid arguments", call && call.name === "get_weather" &&
        call.status === "completed" && typeof call.call_id === "string" && typeof args?.city === "string" &&
        (c1.status === "completed" || c1.incomplete_details?.reason === "max_output_tokens"), JSON.stringify(c1));
  const heldC = await agentTokens(server.port, c1.agentkv.agent_id);
  const c2 = await client.responses.create({ ...base, previous_response_id: c1.id, tools, tool_choice: "none",
    input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny" }] });
  check("the call's output sent back: the call's tokens reused", c2.status !== "failed" &&
        c2.usage.input_tokens_details.cached_tokens === heldC, JSON.stringify({ heldC, usage: c2.usage }));

  // the SDK's default mode: everything resent, no previous_response_id
  const d1 = await client.responses.create({ ...base, input: [{ role: "user", content: "Hello there." }] });
  const heldD = await agentTokens(server.port, d1.agentkv.agent_id);
  const d2 = await client.responses.create({ ...base,
    input: [{ role: "user", content: "Hello there." }, ...d1.output, { role: "user", content: "And?" }] });
  check("resent conversation: the stored response continued (same agent, its history reused)",
        d2.agentkv.agent_id === d1.agentkv.agent_id && d2.usage.input_tokens_details.cached_tokens === heldD,
        JSON.stringify({ heldD, a1: d1.agentkv.agent_id, a2: d2.agentkv.agent_id, usage: d2.usage }));
  const items = await client.responses.inputItems.list(d2.id);
  check("input_items: only what the request added", items.data.length === 1 && items.data[0].role === "user",
        JSON.stringify(items.data));

  // structured output
  const s1 = await client.responses.create({ ...base, max_output_tokens: 80, input: "A person as JSON.",
    text: { format: { type: "json_schema", name: "p", strict: true, schema: { type: "object",
      properties: { name: { type: "string", maxLength: 8 }, age: { type: "integer", minimum: 0, maximum: 99 } },
      required: ["name", "age"], additionalProperties: false } } } });
  let person = null;
  try { person = JSON.parse(s1.output_text); } catch (e) { /* checked below */ }
  check("text.format json_schema: the output validates", person && typeof person.name === "string" &&
        [...person.name].length <= 8 && Number.isInteger(person.age) && person.age >= 0 && person.age <= 99 &&
        Object.keys(person).length === 2, s1.output_text);

  // GET, DELETE, store: false
  const g = await client.responses.retrieve(r1.id);
  check("GET: the response as answered", g.id === r1.id && g.output_text === r1.output_text, JSON.stringify(g));
  const del = await client.responses.delete(d2.id).catch((e) => e);
  const e2 = await refusal(() => client.responses.retrieve(d2.id));
  check("DELETE, then GET: 404", e2?.status === 404, JSON.stringify({ del, e2 }));
  const nos = await client.responses.create({ ...base, input: "x", store: false });
  const e3 = await refusal(() => client.responses.retrieve(nos.id));
  check("store: false keeps nothing", nos.store === false && e3?.status === 404, JSON.stringify(e3));

  // conversations
  const conv = await client.conversations.create({ items: [{ type: "message", role: "user", content: "Hi." }] });
  const v1 = await client.responses.create({ ...base, conversation: conv.id, input: "Go on." });
  const heldV = await agentTokens(server.port, v1.agentkv.agent_id);
  const v2 = await client.responses.create({ ...base, conversation: conv.id, input: "More." });
  const citems = await client.conversations.items.list(conv.id);
  check("a conversation: its responses share its agent and history",
        v1.agentkv.agent_id === v2.agentkv.agent_id && v2.usage.input_tokens_details.cached_tokens === heldV &&
        citems.data.length === 1 + 1 + v1.output.length + 1 + v2.output.length,
        JSON.stringify({ heldV, usage: v2.usage, n: citems.data.length }));

  // /metrics counts the records
  const metrics = await (await fetch(`http://127.0.0.1:${server.port}/metrics`)).text();
  const stored = Number(/^agentkv_responses_stored (\d+)/m.exec(metrics)?.[1] ?? -1);
  const budget = Number(/^agentkv_responses_budget_bytes (\d+)/m.exec(metrics)?.[1] ?? -1);
  check("/metrics: the stored records and their budget", stored >= 10 && budget === 1073741824,
        JSON.stringify({ stored, budget }));

  // a restart: the chain continues warm from disk
  const held2 = await agentTokens(server.port, agent1);
  check("the server saves and exits on SIGTERM", (await stopServer(server, STOP_GRACE_MS)) === 0);
  server = await startServer(bin, serveArgs);
  client = connect(server.port);
  const r3 = await client.responses.create({ ...base, input: "Again.", previous_response_id: r2b.id });
  check("after a restart: previous_response_id served warm, the history reused",
        r3.agentkv.tier === "warm" && r3.usage.input_tokens_details.cached_tokens === held2,
        JSON.stringify({ held2, usage: r3.usage, agent: r3.agentkv }));
  console.log(`responses: ${check.passed()} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p, STOP_GRACE_MS);
  rmSync(memDir, { recursive: true, force: true });
}
