// structured.mjs BIN MODEL NODE_MODULES_DIR - structured output through the
// official `openai` npm client: response_format json_schema with a schema
// as Pydantic writes it ($defs, anyOf with null, title, description,
// default) and one as Zod writes it for OpenAI (zod-to-json-schema:
// additionalProperties false, every property required, a nullable type
// list, $schema draft-07), and json_object; each streamed and not, greedy
// and sampled. Every reply is parsed with JSON.parse and checked against
// its schema's constraints here, by hand. An unsupported keyword comes back
// as the client's 400 naming the schema and the keyword. Exits 1 on the
// first failed check.
//
// The server is killed on every exit path (SIGTERM, then SIGKILL after
// STOP_GRACE_MS); clients never retry; a watchdog ends the script before
// test_server.c's limit.
import { checker, guard, live, startServer as spawnServer, stopServer as stopChild } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-structured-"));
const REQUEST_TIMEOUT_MS = 60000;
const STOP_GRACE_MS = 20000;
const WATCHDOG_MS = 170000;
guard(WATCHDOG_MS);
let server;
const check = checker(() => server);

// Pydantic v2's model_json_schema() of
//   class Address(BaseModel): city: str = Field(description="City name"); zip: Optional[str] = None
//   class Person(BaseModel): name: str = Field(max_length=20); age: int = Field(ge=0, le=130)
//                            address: Optional[Address] = None; role: Literal["admin", "user"]
const pydantic = {
  $defs: {
    Address: {
      properties: {
        city: { description: "City name", title: "City", type: "string" },
        zip: { anyOf: [{ type: "string" }, { type: "null" }], default: null, title: "Zip" },
      },
      required: ["city"], title: "Address", type: "object",
    },
  },
  properties: {
    name: { maxLength: 20, title: "Name", type: "string" },
    age: { maximum: 130, minimum: 0, title: "Age", type: "integer" },
    address: { anyOf: [{ $ref: "#/$defs/Address" }, { type: "null" }], default: null },
    role: { enum: ["admin", "user"], title: "Role", type: "string" },
  },
  required: ["name", "age", "role"], title: "Person", type: "object",
};

// zod-to-json-schema of z.object({ title: z.string().max(40), priority: z.enum(["low", "high"]),
//   tags: z.array(z.string()).max(3), done: z.boolean(), score: z.number().min(0).max(1),
//   note: z.string().nullable() }) as OpenAI's zodResponseFormat sends it
const zod = {
  type: "object",
  properties: {
    title: { type: "string", maxLength: 40 },
    priority: { type: "string", enum: ["low", "high"] },
    tags: { type: "array", items: { type: "string" }, maxItems: 3 },
    done: { type: "boolean" },
    score: { type: "number", minimum: 0, maximum: 1 },
    note: { type: ["string", "null"] },
  },
  required: ["title", "priority", "tags", "done", "score", "note"],
  additionalProperties: false,
  $schema: "http://json-schema.org/draft-07/schema#",
};

const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const chars = (s) => [...s].length;

// Why v is not a Person, or null.
function personInvalid(v) {
  if (!isObj(v)) return "not an object";
  for (const k of ["name", "age", "role"]) if (!(k in v)) return `${k} missing`;
  if (typeof v.name !== "string" || chars(v.name) > 20) return "name: not a string of <= 20 characters";
  if (!Number.isInteger(v.age) || v.age < 0 || v.age > 130) return "age: not an integer in [0, 130]";
  if (v.role !== "admin" && v.role !== "user") return "role: not admin or user";
  if ("address" in v && v.address !== null) {
    const a = v.address;
    if (!isObj(a) || typeof a.city !== "string") return "address: not null or an object with a string city";
    if ("zip" in a && a.zip !== null && typeof a.zip !== "string") return "address.zip: not a string or null";
  }
  return null;
}

// Why v is not the Zod object, or null.
function zodInvalid(v) {
  if (!isObj(v)) return "not an object";
  const keys = Object.keys(v).sort().join();
  if (keys !== "done,note,priority,score,tags,title") return `members ${keys}`;
  if (typeof v.title !== "string" || chars(v.title) > 40) return "title";
  if (v.priority !== "low" && v.priority !== "high") return "priority";
  if (!Array.isArray(v.tags) || v.tags.length > 3 || v.tags.some((x) => typeof x !== "string")) return "tags";
  if (typeof v.done !== "boolean") return "done";
  if (typeof v.score !== "number" || v.score < 0 || v.score > 1) return "score";
  if (v.note !== null && typeof v.note !== "string") return "note";
  return null;
}

// One chat call; streamed, the deltas concatenated. Resolves to {text, finish}.
async function ask(client, responseFormat, { stream, temperature, seed }) {
  const req = { model: "stories260K", max_tokens: 200, temperature, seed, response_format: responseFormat,
                messages: [{ role: "user", content: "Tell me about someone, as JSON." }] };
  if (!stream) {
    const r = await client.chat.completions.create(req);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }
  let text = "", finish = null;
  const s = await client.chat.completions.create({ ...req, stream: true });
  for await (const chunk of s)
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  return { text, finish };
}

// The error a call raised (status, param, code, message), or null when it succeeded.
async function refusal(call) {
  try {
    await call();
    return null;
  } catch (e) {
    return { status: e.status, param: e.param ?? e.error?.param, code: e.code ?? e.error?.code, message: e.message };
  }
}

try {
  server = await spawnServer(bin, ["-m", model, "--port", "0", "--memory-dir", memDir, "-t", "2", "-c", "512"]);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: "unused", maxRetries: 0,
                              timeout: REQUEST_TIMEOUT_MS });
  const formats = [
    ["pydantic", { type: "json_schema", json_schema: { name: "Person", schema: pydantic, strict: false } }, personInvalid],
    ["zod", { type: "json_schema", json_schema: { name: "task", schema: zod, strict: true } }, zodInvalid],
    ["json_object", { type: "json_object" }, (v) => (isObj(v) ? null : "not an object")],
  ];
  for (const [label, rf, invalid] of formats)
    for (const stream of [false, true])
      for (const [temperature, seed] of [[0, 1], [1, 7]]) {
        const { text, finish } = await ask(client, rf, { stream, temperature, seed });
        let v, why;
        try { v = JSON.parse(text); why = invalid(v); } catch (e) { why = `JSON.parse: ${e.message}`; }
        check(`${label}, ${stream ? "streamed" : "whole"}, temperature ${temperature}: the reply validates (${finish})`,
              !why && (finish === "stop" || finish === "length"), `${why}: ${text}`);
      }

  // an unsupported keyword: 400 naming the schema, the keyword and where it is
  const e = await refusal(() => client.chat.completions.create({
    model: "stories260K", max_tokens: 50, messages: [{ role: "user", content: "Hi." }],
    response_format: { type: "json_schema", json_schema: { name: "x", schema: {
      type: "object", properties: { n: { type: "integer", multipleOf: 5 } } } } } }));
  check("an unsupported keyword: 400 unsupported_schema_keyword naming multipleOf at /properties/n",
        e?.status === 400 && e.param === "response_format.json_schema.schema" && e.code === "unsupported_schema_keyword" &&
        e.message.includes("multipleOf") && e.message.includes("/properties/n"), JSON.stringify(e));
  console.log(`structured output: ${check.passed()} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopChild(p, STOP_GRACE_MS);
  rmSync(memDir, { recursive: true, force: true });
}
