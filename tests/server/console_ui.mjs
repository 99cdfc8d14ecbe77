// console_ui.mjs BIN MODEL CHROMIUM OUTDIR - the console (GET /) in a real
// browser: headless Chromium (cdp.mjs, its DevTools protocol on a pipe)
// against `agentkv serve --api-key-file`. Checks, against the API's own
// answers (fetched here with the key) as the reference:
//   - the page and its files load under their Content-Security-Policy with
//     no exception and no violation, and the CSP blocks an inline script;
//   - without the key the page shows the key form and no data; a wrong key
//     is refused; the right one stays in sessionStorage only;
//   - the agent table equals GET /v1/agents (id, tier, tokens, bytes,
//     private bytes, pool, card, last use), sorts by tokens both ways, and
//     filters by id; the pools and memories tables list /v1/pools and
//     /v1/memories; the gauges show /metrics' KV and disk budgets and use;
//   - a chat turn typed and sent with the mouse streams an answer and shows
//     the tier and cached tokens the server counted (/metrics' cached
//     tokens and hits by tier move by exactly what the page shows); text
//     with markup in it is shown as text;
//   - the TTFT chart's legend gets the chat's tier; deleting an agent asks
//     first, then it is gone from the API; "Forget the key" clears it all.
// Saves OUTDIR/console.png (a full-page screenshot; AK_CONSOLE_SHOT=PATH
// writes it there too: docs/console.png is made so). Exits 1 on the first
// failed check, printing the server's log and the page's errors.
import { live, startServer, stopServer } from "./serve.mjs";
import { launch, openPage, sleep } from "./cdp.mjs";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [bin, model, chromium, outDir] = process.argv.slice(2);
const WATCHDOG_MS = 110000;   // below test_console.c's limit, so this script reports first
const KEY = "sk-console-" + Math.random().toString(36).slice(2);
const KV_BUDGET = 4000000, DISK_BUDGET = 50000000;
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
const W = 1280, H = 900;
const work = mkdtempSync(join(tmpdir(), "agentkv-console-"));
let server, browser, page;

process.on("exit", () => {
  for (const p of live) p.kill("SIGKILL");
  if (browser) browser.proc.kill("SIGKILL");
  rmSync(work, { recursive: true, force: true });
});
setTimeout(() => fail("watchdog", `the script ran past ${WATCHDOG_MS / 1000} s`), WATCHDOG_MS).unref();

function fail(name, detail) {
  console.log(`FAIL ${name} ${detail}`);
  if (page) console.log("page errors:\n" + page.errors.join("\n"));
  if (server) console.log("server log:\n" + server.getLog());
  process.exit(1);
}
function check(name, cond, detail = "") {
  if (!cond) fail(name, detail);
  console.log(`ok   ${name}`);
}

const base = () => `http://127.0.0.1:${server.port}`;
const auth = { Authorization: "Bearer " + KEY };

async function get(path, headers = auth) {
  const r = await fetch(base() + path, { headers, signal: AbortSignal.timeout(30000) });
  return { status: r.status, headers: r.headers, text: await r.text() };
}
async function getJSON(path) {
  const r = await get(path);
  if (r.status !== 200) fail("GET " + path, `${r.status} ${r.text}`);
  return JSON.parse(r.text);
}
async function post(path, body, headers = {}) {
  const r = await fetch(base() + path, {
    method: "POST", headers: { ...auth, "Content-Type": "application/json", ...headers }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await r.text();
  if (r.status >= 300) fail("POST " + path, `${r.status} ${text}`);
  return JSON.parse(text);
}
// A request with headers fetch would not send as given (Origin): node:http.
function raw(method, path, headers) {
  return new Promise((resolve, reject) => {
    const q = request({ host: "127.0.0.1", port: server.port, method, path, headers, timeout: 30000 }, (r) => {
      let body = "";
      r.on("data", (d) => { body += d; });
      r.on("end", () => resolve({ status: r.statusCode, body }));
    });
    q.on("error", reject);
    q.end();
  });
}
function metric(text, name) {
  for (const line of text.split("\n")) if (line.startsWith(name + " ")) return Number(line.slice(name.length + 1));
  return NaN;
}
const metrics = async () => (await get("/metrics")).text;

// ---------------------------------------------------------------- server
const keyFile = join(work, "key");
writeFileSync(keyFile, KEY + "\n");
server = await startServer(bin, ["-m", model, "--port", "0", "--memory-dir", join(work, "mem"), "-t", "2", "-c", "512",
                                 "--kv-budget", String(KV_BUDGET), "--disk-budget", String(DISK_BUDGET),
                                 "--api-key-file", keyFile]);

// the page and its files need no key; the data does
{
  const r = await get("/", {});
  check("GET / without the key: the page", r.status === 200 && r.headers.get("content-type") === "text/html; charset=utf-8" &&
        r.text.includes("/console/console.js"), `${r.status} ${r.headers.get("content-type")}`);
  check("GET /: the strict CSP", r.headers.get("content-security-policy") === CSP, r.headers.get("content-security-policy"));
  check("GET /: nosniff, no framing", r.headers.get("x-content-type-options") === "nosniff" &&
        r.headers.get("x-frame-options") === "DENY");
  const js = await get("/console/console.js", {});
  check("GET /console/console.js", js.status === 200 && js.headers.get("content-type") === "text/javascript; charset=utf-8");
  const a = await get("/v1/agents", {});
  check("GET /v1/agents without the key: 401", a.status === 401, String(a.status));
  const m = await metrics();
  check("/metrics: the disk budget", metric(m, "agentkv_disk_budget_bytes") === DISK_BUDGET, String(metric(m, "agentkv_disk_budget_bytes")));
  // the page's own origin may POST and DELETE (browsers send Origin then); another may not
  const own = await raw("DELETE", "/v1/agents/nobody", { ...auth, Origin: base() });
  check("DELETE from the page's own origin passes the guard", own.status === 404, `${own.status} ${own.body}`);
  const other = await raw("DELETE", "/v1/agents/nobody", { ...auth, Origin: "http://evil.example" });
  check("DELETE from another origin: 403", other.status === 403 && other.body.includes("origin_not_allowed"), `${other.status}`);
}

// agents, a pool and a memory to show
const chatBody = (text) => ({ model: "stories260K", messages: [{ role: "user", content: text }], max_tokens: 8, temperature: 0 });
await post("/v1/chat/completions", chatBody("Once upon a time there was a cat."), { "X-Agent-Id": "alpha" });
await post("/v1/chat/completions", chatBody("The dog ran to the park and played with a ball."), { "X-Agent-Id": "beta.2" });
await post("/v1/chat/completions", chatBody("Lily liked the sun."), { "X-Agent-Id": "gamma_3" });
await post("/v1/pools", { id: "handbook", text: "Tim had a red boat. He sailed it on the lake every day." });
await post("/v1/memories", { id: "notes", text: "The bird sang a song in the tall tree." });

// ---------------------------------------------------------------- browser
mkdirSync(outDir, { recursive: true });
browser = await launch(chromium, join(work, "profile"), W, H);
page = await openPage(browser, W, H);
await page.goto(base() + "/");

await page.waitFor("!document.getElementById('key-form').hidden", "the key form");
check("without the key: the form, no data", await page.eval(
  "document.getElementById('main').hidden && document.querySelectorAll('#agents tbody tr').length === 0"));
await page.type("#key", "sk-wrong");
await page.click("#key-use");
await page.waitFor("document.getElementById('key-error').textContent.includes('refused')", "the wrong key refused");
check("a wrong key: refused, still no data", await page.eval(
  "document.getElementById('main').hidden && !sessionStorage.getItem('agentkv.apiKey')"));
await page.type("#key", KEY);
await page.click("#key-use");
await page.waitFor("!document.getElementById('main').hidden && document.querySelectorAll('#agents tbody tr').length > 0",
                   "the agent table");
check("the key is in this tab only", await page.eval(
  `sessionStorage.getItem('agentkv.apiKey') === ${JSON.stringify(KEY)} && localStorage.length === 0 && document.cookie === ""`));

// The agent table as the page shows it: {id: {column: data-value}}.
const COLS = ["id", "tier", "tokens", "bytes", "private_bytes", "pool", "card", "last_used_at"];
const tableNow = () => page.eval(`[...document.querySelectorAll('#agents tbody tr')].map((tr) =>
  [...tr.cells].slice(0, ${COLS.length}).map((td) => td.dataset.value))`);
// The API's agents in the same shape.
async function apiRows() {
  const a = await getJSON("/v1/agents");
  return a.data.map((x) => COLS.map((k) => (x[k] == null ? "" : String(x[k]))));
}
// Waits for the page's table (sorted as the page sorts) to hold the API's rows.
async function tableMatches(what) {
  let want, have;
  for (let i = 0; i < 60; i++) {
    want = (await apiRows()).map((r) => JSON.stringify(r)).sort();
    have = (await tableNow()).map((r) => JSON.stringify(r)).sort();
    if (JSON.stringify(want) === JSON.stringify(have)) break;
    await sleep(250);
  }
  check(what, JSON.stringify(want) === JSON.stringify(have), `\n  API:  ${want.join("\n        ")}\n  page: ${have.join("\n        ")}`);
}
await tableMatches("the agent table equals GET /v1/agents");

// sorting by tokens, both ways (ties by id), against the API's numbers
const byTokens = (rows, dir) => rows.slice().sort((a, b) => (Number(a[2]) - Number(b[2])) * dir || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)).map((r) => r[0]);
const api1 = await apiRows();
await page.click("#agents th[data-key=tokens]");
let order = (await tableNow()).map((r) => r[0]);
check("sorted by tokens, ascending", JSON.stringify(order) === JSON.stringify(byTokens(api1, 1)), `${order} vs ${byTokens(api1, 1)}`);
await page.click("#agents th[data-key=tokens]");
order = (await tableNow()).map((r) => r[0]);
check("sorted by tokens, descending", JSON.stringify(order) === JSON.stringify(byTokens(api1, -1)), `${order}`);

await page.type("#filter", "ETA");
order = (await tableNow()).map((r) => r[0]);
check("filtered by id (case ignored)", JSON.stringify(order) === JSON.stringify(["beta.2"]), `${order}`);
await page.type("#filter", "");

// pools, memories, gauges
const ids = (sel) => page.eval(`[...document.querySelectorAll('${sel} tbody tr')].map((tr) => tr.dataset.id).sort()`);
const pools = (await getJSON("/v1/pools")).data.map((p) => p.id).sort();
const mems = (await getJSON("/v1/memories")).data.map((p) => p.id).sort();
check("the pool table lists /v1/pools", JSON.stringify(await ids("#pools")) === JSON.stringify(pools) && pools.includes("handbook"));
check("the memory table lists /v1/memories", JSON.stringify(await ids("#memories")) === JSON.stringify(mems) && mems.includes("notes"));
{
  const g = await page.eval(`[...['kv-text', 'disk-text']].map((id) => ({...document.getElementById(id).dataset}))`);
  const m = await metrics();
  check("the KV gauge: /metrics' budget and hot bytes", Number(g[0].budget) === KV_BUDGET &&
        Number(g[0].used) === metric(m, 'agentkv_tier_bytes{tier="hot"}'), JSON.stringify(g[0]));
  check("the disk gauge: /metrics' budget and warm bytes", Number(g[1].budget) === DISK_BUDGET &&
        Number(g[1].used) === metric(m, 'agentkv_tier_bytes{tier="warm"}') && Number(g[1].used) > 0, JSON.stringify(g[1]));
}

// ---------------------------------------------------------------- chat
// Clicks Send until the page takes the message (a user turn number n in the
// log: a click can land beside the button while the tables above it are
// re-rendered by a poll), then waits for answer n; an error the page shows
// ends the wait at once, with the page's words.
async function sendTurn(n, what) {
  const userTurns = `document.querySelectorAll('#chat-log .turn.user').length >= ${n}`;
  for (let i = 0; i < 5 && !(await page.eval(userTurns)); i++) {
    await page.click("#chat-send");
    const t0 = Date.now();
    while (Date.now() - t0 < 2000 && !(await page.eval(userTurns))) await new Promise((r) => setTimeout(r, 100));
  }
  if (!(await page.eval(userTurns))) throw new Error(`${what}: five clicks on Send, no message sent`);
  await page.waitFor(`document.querySelectorAll('#chat-log .turn.assistant.done').length === ${n} ||
                      document.getElementById('chat-error').textContent !== ""`, what, 60000);
  const err = await page.eval("document.getElementById('chat-error').textContent");
  if (err) throw new Error(`${what}: the page says ${err}`);
}
const m0 = await metrics();
const MARKUP = 'Tell me <img src=x onerror="window.__xss=1"> a story & <b>more</b>';
await page.type("#chat-agent", "console-chat");
await page.type("#chat-input", MARKUP);
await sendTurn(1, "the first answer");
await page.type("#chat-input", "And then?");
await sendTurn(2, "the second answer");
const turns = await page.eval(`[...document.querySelectorAll('#chat-log .turn.assistant .stats')].map((s) => ({...s.dataset}))`);
const texts = await page.eval(`[...document.querySelectorAll('#chat-log .turn .text')].map((t) => t.textContent)`);
check("turn 1: a new agent, cold", turns[0].tier === "cold", JSON.stringify(turns[0]));
check("turn 2: hot, its history reused", turns[1].tier === "hot" && Number(turns[1].cached) > 0 &&
      Number(turns[1].cached) >= Number(turns[0].prompt) - 1, JSON.stringify(turns));
check("answers streamed into the log", texts.length === 4 && texts[1].length > 0 && texts[3].length > 0, JSON.stringify(texts));
check("markup in a message is text", texts[0] === MARKUP && await page.eval(
  "document.querySelectorAll('#chat-log img, #chat-log .text *').length === 0 && window.__xss === undefined"));
{
  const m1 = await metrics();
  const d = (name) => metric(m1, name) - metric(m0, name);
  check("the cached tokens shown are the server's", d("agentkv_cached_tokens_total") === Number(turns[0].cached) + Number(turns[1].cached),
        `metrics +${d("agentkv_cached_tokens_total")}, page ${turns[0].cached} + ${turns[1].cached}`);
  check("the tiers shown are the server's", d('agentkv_hits_total{tier="cold"}') === 1 && d('agentkv_hits_total{tier="hot"}') === 1);
  check("the tokens shown are the server's", d("agentkv_prompt_tokens_total") === Number(turns[0].prompt) + Number(turns[1].prompt));
}
await tableMatches("the chat's agent joins the table as GET /v1/agents lists it");
await page.waitFor(`document.querySelector('#ttft-legend [data-tier=hot]').dataset.p50 !== ""`, "a hot TTFT in the chart's window");
{
  const p = await page.eval(`Object.fromEntries(['hot', 'cold'].map((t) => [t, {...document.querySelector('#ttft-legend [data-tier=' + t + ']').dataset}]))`);
  check("the TTFT chart: p50 <= p99 for each tier with turns", Number(p.hot.p50) > 0 && Number(p.hot.p50) <= Number(p.hot.p99) &&
        Number(p.cold.p50) > 0 && Number(p.cold.p50) <= Number(p.cold.p99), JSON.stringify(p));
}
await page.waitFor(`document.querySelector('#rps-legend [data-rps]').dataset.rps !== ""`, "a requests/s figure");

// ---------------------------------------------------------------- CSP, screenshot
check("no exception, no CSP violation, no console error so far", page.errors.filter((e) =>
  !/status of 40[14]/.test(e)).length === 0, page.errors.join("\n"));
await page.eval("window.scrollTo(0, 0)");
await sleep(300);
const png = await page.screenshot();
check("a PNG screenshot", png.subarray(1, 4).toString() === "PNG" && png.length > 10000, String(png.length));
writeFileSync(join(outDir, "console.png"), png);
if (process.env.AK_CONSOLE_SHOT) copyFileSync(join(outDir, "console.png"), process.env.AK_CONSOLE_SHOT);
await page.eval(`(() => { const s = document.createElement("script"); s.textContent = "window.__inline = 1";
  document.body.append(s); })()`);
await sleep(200);
check("the CSP blocks an inline script", await page.eval("window.__inline === undefined") &&
      page.errors.some((e) => e.includes("Content Security Policy")), page.errors.join("\n"));

// ---------------------------------------------------------------- delete, forget
await page.click("#agents tr[data-id='beta.2'] button.delete");
await page.waitFor("document.getElementById('confirm').open", "the confirmation");
check("nothing deleted before the confirmation", (await get("/v1/agents/beta.2")).status === 200);
await page.click("#confirm-ok");
await page.waitFor("!document.querySelector(\"#agents tr[data-id='beta.2']\")", "the row to go");
check("deleted: GET /v1/agents/beta.2 is 404", (await get("/v1/agents/beta.2")).status === 404);
await tableMatches("the table after the delete equals GET /v1/agents");

await page.click("#forget-key");
await page.waitFor("!document.getElementById('key-form').hidden", "the key form again");
check("forgetting the key clears every view", await page.eval(
  "document.getElementById('main').hidden && !sessionStorage.getItem('agentkv.apiKey') && " +
  "document.querySelectorAll('#agents tbody tr, #pools tbody tr, #memories tbody tr, #chat-log .turn').length === 0"));

await browser.close();
browser = null;
const code = await stopServer(server, 20000);
check("the server exits 0", code === 0, String(code));
console.log("console in chromium: all checks passed");
