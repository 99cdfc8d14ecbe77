// openai_http_guard.mjs BIN MODEL NODE_MODULES_DIR - the official `openai`
// npm client against `agentkv serve` with its guards against web pages on
// (the default): models.retrieve (the served model, and 404 for another),
// a chat call, a client whose baseURL names a reverse proxy (node's http
// module, here, on 127.0.0.1) that passes the client's Host on: served when
// the server was started with --allowed-host for the proxy's name, refused
// (403 host_not_allowed) without it; a client sending Host attacker.example
// or an Origin header is refused. Exits 1 on the first failed check.
//
// All traffic goes to 127.0.0.1: the proxy's name resolves to 127.0.0.1 in
// the client's own fetch (a lookup that never asks DNS). Every server is
// killed on every exit path; clients never retry and give up on a request
// after REQUEST_TIMEOUT_MS; a watchdog ends the script below the runner's
// limit.
import { live, startServer as spawnServer, stopServer as stopChild } from "./serve.mjs";
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { Readable } from "node:stream";

const [bin, model, nodeModules] = process.argv.slice(2);
const require = createRequire(join(resolve(nodeModules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const REQUEST_TIMEOUT_MS = 60000;
const STOP_GRACE_MS = 20000;
const WATCHDOG_MS = 180000;   // below test_server.c's limit (200 s), so this script reports first
const PROXY_NAME = "agents.proxy.test";
const memDir = mkdtempSync(join(tmpdir(), "agentkv-guard-"));
process.on("exit", () => {
  for (const p of live) p.kill("SIGKILL");
  rmSync(memDir, { recursive: true, force: true });
});
setTimeout(() => {
  console.log(`FAIL watchdog: the script ran past ${WATCHDOG_MS / 1000} s`);
  for (const p of live) { console.log(p.getLog()); p.kill("SIGKILL"); }
  process.exit(1);
}, WATCHDOG_MS).unref();

let passed = 0, server = null;
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

function startServer(extra, dir) {
  return spawnServer(bin, ["-m", model, "--port", "0", "--memory-dir", dir, "-t", "2", "-c", "256", ...extra]);
}

function stopServer(p) {
  return stopChild(p, STOP_GRACE_MS);
}

// A fetch for the client in which every name resolves to 127.0.0.1: the
// request keeps its URL's Host, as a browser or a client behind DNS would
// send it, without any DNS query.
function loopbackFetch(url, init = {}) {
  return new Promise((resolve, reject) => {
    const headers = {};
    new Headers(init.headers).forEach((v, k) => { headers[k] = v; });
    const lookup = (host, opts, cb) =>
      opts?.all ? cb(null, [{ address: "127.0.0.1", family: 4 }]) : cb(null, "127.0.0.1", 4);
    const req = http.request(new URL(url), { method: init.method ?? "GET", headers, signal: init.signal ?? undefined, lookup },
      (res) => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) for (const x of [].concat(v)) h.append(k, x);
        const body = res.statusCode === 204 || res.statusCode === 304 ? null : Readable.toWeb(res);
        resolve(new Response(body, { status: res.statusCode, statusText: res.statusMessage, headers: h }));
      });
    req.on("error", reject);
    req.end(init.body ?? undefined);
  });
}

// A reverse proxy on 127.0.0.1 to the server on target.port, passing the
// client's request (Host included) through; it records the Hosts it saw.
function startProxy(target) {
  const seen = [];
  const proxy = http.createServer((req, res) => {
    seen.push(req.headers.host);
    const up = http.request({ host: "127.0.0.1", port: target.port, method: req.method, path: req.url, headers: req.headers },
      (ur) => { res.writeHead(ur.statusCode, ur.headers); ur.pipe(res); });
    up.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
    req.pipe(up);
  });
  return new Promise((resolve) => proxy.listen(0, "127.0.0.1", () => {
    proxy.seen = seen;
    proxy.port = proxy.address().port;
    resolve(proxy);
  }));
}

const clientFor = (baseURL, extra = {}) =>
  new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: REQUEST_TIMEOUT_MS, ...extra });
const chat = (client) =>
  client.chat.completions.create({ model: "stories260K", messages: [{ role: "user", content: "Tell me a story." }],
                                   max_tokens: 8, temperature: 0 });
// The status and OpenAI error code of a call that must fail.
async function refusal(call) {
  try {
    await call();
    return { status: 200, code: null };
  } catch (e) {
    return { status: e.status, code: e.code ?? e.error?.code, name: e.constructor?.name };
  }
}

async function main() {
  server = await startServer(["--allowed-host", PROXY_NAME], join(memDir, "a"));
  const direct = clientFor(`http://127.0.0.1:${server.port}/v1`);

  const m = await direct.models.retrieve("stories260K");
  check("models.retrieve: the served model", m.id === "stories260K" && m.object === "model" &&
        typeof m.created === "number" && typeof m.owned_by === "string", JSON.stringify(m));
  let r = await refusal(() => direct.models.retrieve("gpt-4o"));
  check("models.retrieve of another id: NotFoundError, model_not_found", r.status === 404 && r.code === "model_not_found" &&
        r.name === "NotFoundError", JSON.stringify(r));

  const c = await chat(direct);
  check("chat with the guards on", typeof c.choices[0].message.content === "string" && c.usage.completion_tokens > 0,
        JSON.stringify(c));

  const proxy = await startProxy(server);
  const viaProxy = clientFor(`http://${PROXY_NAME}:${proxy.port}/v1`, { fetch: loopbackFetch });
  const p = await chat(viaProxy);
  check("through the proxy (--allowed-host): chat served",
        p.choices[0].message.content === c.choices[0].message.content, JSON.stringify(p));
  const s = await viaProxy.chat.completions.create({ model: "stories260K", messages: [{ role: "user", content: "Tell me a story." }],
                                                     max_tokens: 8, temperature: 0, stream: true });
  let text = "";
  for await (const chunk of s) for (const ch of chunk.choices) text += ch.delta?.content ?? "";
  check("through the proxy: streamed, the same text", text === c.choices[0].message.content, JSON.stringify(text));
  check("the proxy passed the client's Host on", proxy.seen.length >= 2 && proxy.seen.every((h) => h === `${PROXY_NAME}:${proxy.port}`),
        JSON.stringify(proxy.seen));

  const attacker = clientFor(`http://attacker.example:${proxy.port}/v1`, { fetch: loopbackFetch });
  r = await refusal(() => chat(attacker));
  check("Host attacker.example: 403 host_not_allowed", r.status === 403 && r.code === "host_not_allowed", JSON.stringify(r));
  r = await refusal(() => attacker.models.list());
  check("Host attacker.example, GET /v1/models: 403", r.status === 403 && r.code === "host_not_allowed", JSON.stringify(r));

  const withOrigin = clientFor(`http://127.0.0.1:${server.port}/v1`, { defaultHeaders: { Origin: "http://evil.example" } });
  r = await refusal(() => chat(withOrigin));
  check("an Origin without --cors-origin: 403 origin_not_allowed", r.status === 403 && r.code === "origin_not_allowed",
        JSON.stringify(r));
  check("server stopped cleanly", (await stopServer(server)) === 0);

  // the same proxied client, a server without --allowed-host: refused
  server = await startServer([], join(memDir, "b"));
  const proxy2 = await startProxy(server);
  r = await refusal(() => chat(clientFor(`http://${PROXY_NAME}:${proxy2.port}/v1`, { fetch: loopbackFetch })));
  check("through the proxy without --allowed-host: 403 host_not_allowed", r.status === 403 && r.code === "host_not_allowed",
        JSON.stringify(r));
  check("second server stopped cleanly", (await stopServer(server)) === 0);
  proxy.close();
  proxy2.close();
  console.log(`openai http guard: ${passed} passed`);
}

main().then(() => process.exit(process.exitCode ?? 0), (e) => {
  if (!process.exitCode) console.log(`FAIL ${e.stack ?? e}`);
  process.exit(1);
});
