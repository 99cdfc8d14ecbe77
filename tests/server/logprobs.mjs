// logprobs.mjs BIN MODEL NODE_MODULES_DIR - logprobs through the official
// `openai` npm client: a greedy chat turn with logprobs and top_logprobs
// read from choices[0].logprobs.content, whole and streamed. Each entry's
// token texts make the reply, its top list is sorted with the token itself
// first (greedy), the entries are as many as the completion's tokens, and
// the streamed entries concatenated equal the whole answer's. Also
// top_logprobs without logprobs: the client's 400. Exits 1 on the first
// failed check.
//
// The server is killed on every exit path (SIGTERM, then SIGKILL after
// STOP_GRACE_MS); the client never retries; a watchdog ends the script
// before the C test's limit.
import { live, startServer, stopServer } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const memDir = mkdtempSync(join(tmpdir(), "agentkv-logprobs-"));
const STOP_GRACE_MS = 20000;
const WATCHDOG_MS = 110000;
process.on("exit", () => { for (const p of live) p.kill("SIGKILL"); });
setTimeout(() => {
  console.log(`FAIL watchdog: the script ran past ${WATCHDOG_MS / 1000} s`);
  for (const p of live) p.kill("SIGKILL");
  process.exit(1);
}, WATCHDOG_MS).unref();

let server, passed = 0;
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

try {
  server = await startServer(bin, ["-m", model, "--port", "0", "--memory-dir", memDir, "-t", "2", "-c", "512"]);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: "unused", maxRetries: 0,
                              timeout: 60000 });
  const req = { model: "stories260K", messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 10,
                temperature: 0, logprobs: true, top_logprobs: 5 };
  const whole = await client.chat.completions.create(req);
  const content = whole.choices[0].logprobs?.content;
  check("choices[0].logprobs.content is an array", Array.isArray(content), JSON.stringify(whole.choices[0]));
  check("one entry per completion token", content.length === whole.usage.completion_tokens,
        `${content.length} vs ${whole.usage.completion_tokens}`);
  check("the tokens' texts make the reply", content.map((e) => e.token).join("") === whole.choices[0].message.content);
  for (const [i, e] of content.entries()) {
    const top = e.top_logprobs;
    check(`entry ${i}: a logprob <= 0, bytes the token's UTF-8`,
          e.logprob <= 0 && Buffer.from(e.bytes).toString("utf8") === e.token, JSON.stringify(e));
    check(`entry ${i}: 5 alternatives, sorted, the token first (greedy)`,
          top.length === 5 && top.every((x, k) => k === 0 || x.logprob <= top[k - 1].logprob) &&
          top[0].token === e.token && top[0].logprob === e.logprob, JSON.stringify(top));
  }

  const streamed = [];
  const stream = await client.chat.completions.create({ ...req, stream: true });
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  check("streamed entries concatenated equal the whole answer's", JSON.stringify(streamed) === JSON.stringify(content));

  let e = null;
  try {
    await client.chat.completions.create({ ...req, logprobs: false });
  } catch (err) {
    e = err;
  }
  check("top_logprobs without logprobs: 400 invalid_value", e?.status === 400 && e.param === "top_logprobs" &&
        e.code === "invalid_value", String(e));
  console.log(`logprobs: ${passed} passed, 0 failed`);
} catch (err) {
  if (!process.exitCode) { console.log("FAIL", err?.stack ?? err); process.exitCode = 1; }
} finally {
  for (const p of [...live]) await stopServer(p, STOP_GRACE_MS);
  rmSync(memDir, { recursive: true, force: true });
}
