// serve.mjs - what the server scripts share: `agentkv serve` as a child on
// a free loopback port, and its stop. Every child started is in `live`
// until it exits; a script kills what is left there on its exit paths.
import { spawn } from "node:child_process";

export const live = new Set();

// Starts BIN serve ARGS (which should hold "--port", "0"); resolves to the
// child once it says where it listens (child.port; child.getLog() is its
// stderr so far), rejects if it exits first.
export function startServer(bin, args) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    live.add(p);
    let log = "";
    p.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !p.port) { p.port = Number(m[1]); resolve(p); }
    });
    p.on("exit", (code, signal) => {
      live.delete(p);
      p.exitCode_ = code ?? signal;
      if (!p.port) reject(new Error("server exited: " + log));
    });
    p.getLog = () => log;
  });
}

// SIGTERM, then SIGKILL after graceMs; resolves to the exit code (or the
// signal's name when it was killed).
export function stopServer(p, graceMs) {
  return new Promise((resolve) => {
    if (p.exitCode_ !== undefined) return resolve(p.exitCode_);
    const hard = setTimeout(() => p.kill("SIGKILL"), graceMs);
    p.on("exit", (code, signal) => { clearTimeout(hard); resolve(code ?? signal); });
    p.kill("SIGTERM");
  });
}

// Guards a script: every live server is killed when the process exits, and
// after ms the script ends (exit 1) with the servers' logs shown.
export function guard(ms) {
  process.on("exit", () => { for (const p of live) p.kill("SIGKILL"); });
  setTimeout(() => {
    console.log(`FAIL watchdog: the script ran past ${ms / 1000} s`);
    for (const p of live) { console.log(p.getLog()); p.kill("SIGKILL"); }
    process.exit(1);
  }, ms).unref();
}

// check(name, cond, detail) prints "ok   name", or "FAIL name detail" with
// the log of server() (when it returns one), sets the exit code 1 and
// throws; check.passed() is how many passed.
export function checker(server) {
  let passed = 0;
  const check = (name, cond, detail = "") => {
    if (!cond) {
      console.log(`FAIL ${name} ${detail}`);
      if (server()) console.log(server().getLog());
      process.exitCode = 1;
      throw new Error(name);
    }
    passed++;
    console.log(`ok   ${name}`);
  };
  check.passed = () => passed;
  return check;
}

// The error a call raised ({status, param, code, message}), or null when it succeeded.
export async function refusal(call) {
  try { await call(); return null; } catch (e) {
    return { status: e.status, param: e.param ?? e.error?.param, code: e.code ?? e.error?.code, message: e.message };
  }
}

// The tokens agent id holds (GET /v1/agents/{id} on the server at port), or -1.
export async function agentTokens(port, id) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/agents/${id}`, { signal: AbortSignal.timeout(30000) });
  return r.ok ? (await r.json()).tokens : -1;
}
