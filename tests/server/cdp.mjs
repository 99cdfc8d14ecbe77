// cdp.mjs - headless Chromium driven over its DevTools protocol on a pipe
// (--remote-debugging-pipe: NUL-terminated JSON on file descriptors 3 and
// 4), without puppeteer or a WebSocket client: what a browser test needs
// (a page, script evaluation, real mouse clicks and typing, console and
// exception capture, screenshots).
import { spawn } from "node:child_process";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `chromium` (its path) headless with a fresh profile in profileDir
// and a width x height window; resolves to a browser {send, on, close, proc}.
export async function launch(chromium, profileDir, width, height) {
  const args = [
    "--headless", "--disable-gpu", "--remote-debugging-pipe", `--user-data-dir=${profileDir}`,
    "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
    "--password-store=basic", "--use-mock-keychain", "--force-color-profile=srgb", `--window-size=${width},${height}`,
  ];
  // Chromium's sandbox refuses to run as root (CI containers): without it then
  if (process.getuid && process.getuid() === 0) args.push("--no-sandbox");
  args.push("about:blank");
  const proc = spawn(chromium, args, {
    stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"],
    env: { ...process.env, DBUS_SESSION_BUS_ADDRESS: "disabled:" },
  });
  let log = "";
  proc.stderr.on("data", (d) => { log = (log + d).slice(-20000); });
  const out = proc.stdio[3], inp = proc.stdio[4];
  let next = 0;
  const pending = new Map(), listeners = [];
  let buf = Buffer.alloc(0);
  inp.on("data", (d) => {
    buf = Buffer.concat([buf, d]);
    let i;
    while ((i = buf.indexOf(0)) >= 0) {
      const msg = JSON.parse(buf.subarray(0, i).toString("utf8"));
      buf = buf.subarray(i + 1);
      if (msg.id !== undefined && pending.has(msg.id)) {
        const p = pending.get(msg.id);
        pending.delete(msg.id);
        if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}`));
        else p.resolve(msg.result);
      } else {
        for (const l of listeners) l(msg);
      }
    }
  });
  const exited = new Promise((resolve) => proc.on("exit", resolve));
  exited.then(() => {
    for (const p of pending.values()) p.reject(new Error(`chromium exited during ${p.method}:\n${log}`));
    pending.clear();
  });
  out.on("error", () => {});
  const browser = {
    proc,
    getLog: () => log,
    send(method, params = {}, sessionId) {
      const id = ++next;
      const msg = { id, method, params };
      if (sessionId) msg.sessionId = sessionId;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject, method });
        out.write(JSON.stringify(msg) + "\0");
      });
    },
    on(fn) { listeners.push(fn); },
    async close() {
      try { await Promise.race([browser.send("Browser.close"), sleep(3000)]); } catch { /* gone already */ }
      const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(t);
    },
  };
  await browser.send("Browser.getVersion");
  return browser;
}

// A page of browser: its first tab (a new one if it has none) attached
// (flat session) with Page, Runtime and Log on. page.errors collects
// exceptions and console or log errors as text; page.events every event of
// the session.
export async function openPage(browser, width, height) {
  const { targetInfos } = await browser.send("Target.getTargets");
  const tab = targetInfos.find((x) => x.type === "page");
  const { targetId } = tab || (await browser.send("Target.createTarget", { url: "about:blank" }));
  const { sessionId } = await browser.send("Target.attachToTarget", { targetId, flatten: true });
  const send = (method, params) => browser.send(method, params, sessionId);
  const page = { send, errors: [], events: [] };
  browser.on((m) => {
    if (m.sessionId !== sessionId) return;
    page.events.push(m);
    if (m.method === "Runtime.exceptionThrown") {
      const d = m.params.exceptionDetails;
      page.errors.push("exception: " + ((d.exception && d.exception.description) || d.text));
    } else if (m.method === "Log.entryAdded" && m.params.entry.level === "error") {
      page.errors.push(`log (${m.params.entry.source}): ${m.params.entry.text} ${m.params.entry.url || ""}`);
    } else if (m.method === "Runtime.consoleAPICalled" && m.params.type === "error") {
      page.errors.push("console.error: " + m.params.args.map((a) => a.value ?? a.description).join(" "));
    }
  });
  await send("Page.enable");
  await send("Runtime.enable");
  await send("Log.enable");
  await send("Emulation.setDeviceMetricsOverride", { width, height, deviceScaleFactor: 1, mobile: false });

  // The value of expression (awaited when a promise); throws its exception.
  page.eval = async (expression) => {
    const r = await send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) {
      const d = r.exceptionDetails;
      throw new Error(`evaluate ${expression.slice(0, 80)}: ${(d.exception && d.exception.description) || d.text}`);
    }
    return r.result.value;
  };
  // Waits until expression is truthy (returns its value), or throws after ms.
  page.waitFor = async (expression, what, ms = 15000) => {
    const t0 = Date.now();
    for (;;) {
      const v = await page.eval(expression);
      if (v) return v;
      if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
      await sleep(100);
    }
  };
  page.goto = async (url) => {
    const r = await send("Page.navigate", { url });
    if (r.errorText) throw new Error(`navigate ${url}: ${r.errorText}`);
    await page.waitFor("document.readyState === 'complete'", "the page to load");
  };
  // A real mouse click (pressed and released) at the middle of the element
  // selector names, scrolled into view first.
  page.click = async (selector) => {
    const box = await page.eval(`(() => { const e = document.querySelector(${JSON.stringify(selector)});
      if (!e) return null; e.scrollIntoView({block: "center"}); const r = e.getBoundingClientRect();
      return {x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width}; })()`);
    if (!box || !box.w) throw new Error(`click: no visible ${selector}`);
    for (const type of ["mousePressed", "mouseReleased"])
      await send("Input.dispatchMouseEvent", { type, x: box.x, y: box.y, button: "left", clickCount: 1 });
  };
  // Focuses the element (clearing its value) and types text as input events.
  page.type = async (selector, text) => {
    await page.eval(`(() => { const e = document.querySelector(${JSON.stringify(selector)}); e.focus(); e.value = "";
      e.dispatchEvent(new Event("input", {bubbles: true})); })()`);
    await send("Input.insertText", { text });
  };
  // The whole page as PNG bytes.
  page.screenshot = async () => {
    const m = await send("Page.getLayoutMetrics");
    const h = Math.ceil(m.cssContentSize ? m.cssContentSize.height : m.contentSize.height);
    await send("Emulation.setDeviceMetricsOverride", { width, height: Math.max(height, h), deviceScaleFactor: 1, mobile: false });
    await sleep(200);
    const r = await send("Page.captureScreenshot", { format: "png" });
    await send("Emulation.setDeviceMetricsOverride", { width, height, deviceScaleFactor: 1, mobile: false });
    return Buffer.from(r.data, "base64");
  };
  return page;
}
