#!/usr/bin/env python3
"""responses_chain.py - a multi-turn chain on agentkv's Responses API, its
stored state kept as agent KV, against llama.cpp's llama-server on the same
GGUF, side by side in one run. Python standard library only.

    python3 bench/responses_chain.py --bin build/agentkv \
        --llama-server /path/to/llama.cpp/build/bin/llama-server \
        --contexts 2048,8192 --svg docs/responses-chain.svg --out build/responses-chain

The model (--model) defaults to build/bench-models/llama-1b-q4_0-8k.gguf,
synthesized when absent (`agentkv synth --like llama-1b --type q4_0`, seed 1,
the largest context): Llama-3.2-1B's shape with random weights.

For each context C: a chain of --turns turns (default 20), each a short new
user input (about 20 tokens) under the same instructions, max_output_tokens
8, greedy; the first turn's input holds a long document, sized so that the
history reaches about C tokens at the chain's last turn. Series:
  a  agentkv, POST /v1/responses with previous_response_id
  b  agentkv, the whole history resent each turn as input items (the OpenAI
     Agents SDK's default; the server finds the stored response by its items)
  c  agentkv after a restart: after turn --turns the server of a gets SIGTERM
     (it saves its agents) and starts again on the same --memory-dir; chain a
     goes on for --after turns (default 3); the first is the warm restore
  d  llama-server, POST /v1/chat/completions with the whole history resent
     each turn (stream, cache_prompt at its default); restarted with the
     others (no slot save: its first request after the restart prefills all)
The server of b is restarted too and its chain goes on after the restart
(column b of the turns past --turns). a and b run on servers of their own
(fresh memory directories: no prefix shared between them), all servers
started here on 127.0.0.1 with the same threads and context; each turn
sends a, then b, then d, one request at a time; after each agentkv answer
the bench waits until that server has saved its agents (/metrics
agentkv_agents_unsaved 0: the save after a turn runs after the answer, and
would otherwise take the cores from the next series' request).

Per turn and series: TTFT measured here (request sent to the first text
delta: response.output_text.delta, or a chat chunk with content; to the end
of the answer when no text came, marked *) and the tokens prefilled
(usage.input_tokens - input_tokens_details.cached_tokens, checked against
the answer's agentkv.prefilled; llama-server's timings.prompt_n). Prints a
markdown table per C, the ratios at the restart turn and totals; writes
summary.json and the server logs under --out and the plot (TTFT per turn,
log scale, the four series) to --svg. Every loop is bounded in count and
time; every server is killed on every exit path and dies with this process
(PR_SET_PDEATHSIG).
"""
import argparse
import ctypes
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no __pycache__ left in bench/
from soak import metric_values  # noqa: E402  (bench/soak.py: GET /metrics read)

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 1800.0      # one request: a long prefill on a few busy cores
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 120.0
MAX_SSE_LINES = 100000          # a bound on the lines one streamed answer may have
INSTRUCTIONS = "You are a careful analyst. Answer in a few words, using only the document the user gave."
FILL = 0.95                     # the history at the last turn, as a fraction of C
OUT_TOKENS = 8
WORDS = ("river stone cloud market window garden silver orange planet engine signal marble harbor lantern "
         "forest copper meadow bridge candle thunder valley mirror ribbon canyon falcon island velvet "
         "compass anchor glacier prairie summit tunnel beacon orchard quarry saddle").split()
SERIES = ("a", "b", "c", "d")
COLORS = {"a": "#1f77b4", "b": "#2ca02c", "c": "#ff7f0e", "d": "#d62728"}
LABELS = {"a": "a: agentkv, previous_response_id", "b": "b: agentkv, history resent as items",
          "c": "c: agentkv after restart (a's chain)", "d": "d: llama-server, history resent"}


def now():
    return time.monotonic()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Proc:
    """A server process: its command, log file and port. Ready when its log
    names the port (agentkv) or GET /health answers 200 (llama-server)."""

    def __init__(self, name, cmd, log_path, env=None, port=None):
        self.name, self.cmd, self.log_path, self.env, self.port = name, cmd, log_path, env, port
        self.p = None
        self.log = None

    def start(self):
        self.log = open(self.log_path, "a")
        self.log_from = self.log.tell()   # a restart's port line comes after the last run's
        libc = ctypes.CDLL(None, use_errno=True)

        def die_with_parent():
            libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: no server outlives the bench
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                  env=self.env, preexec_fn=die_with_parent)
        deadline = now() + START_TIMEOUT_S
        while now() < deadline and self.p.poll() is None:
            if self.ready():
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("%s did not start; its log: %s" % (self.name, self.log_path))

    def ready(self):
        if self.port is None:
            with open(self.log_path) as f:
                f.seek(self.log_from)
                m = re.search(r"on http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
            return self.port is not None
        try:
            conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False

    def restart(self):
        """SIGTERM (agentkv saves its agents), wait for exit 0, start again."""
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("%s did not exit %.0f s after SIGTERM" % (self.name, STOP_TIMEOUT_S))
        self.log.close()
        if rc != 0:
            raise RuntimeError("%s exited %d after SIGTERM; its log: %s" % (self.name, rc, self.log_path))
        if self.name.startswith("agentkv"):
            self.port = None     # --port 0: the new process's port is read from its log
        self.start()

    def kill(self):
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        if self.log and not self.log.closed:
            self.log.close()


def settle(proc):
    """Waits until an agentkv server has nothing running and every agent
    saved (its save after a turn runs after the answer: the next series'
    request must not share the cores with it). Returns the seconds waited."""
    t0 = now()
    while now() - t0 < SETTLE_TIMEOUT_S:
        m = metric_values(proc.port, ("agentkv_requests_active", "agentkv_agents_unsaved"))
        if m is None:
            raise RuntimeError("%s: no /metrics" % proc.name)
        if m == (0, 0):
            return now() - t0
        time.sleep(0.02)
    raise RuntimeError("%s: agents still unsaved after %.0f s" % (proc.name, SETTLE_TIMEOUT_S))


def stream_post(port, path, body, timeout_s=REQUEST_TIMEOUT_S, t0=None):
    """POSTs body (stream: true) and reads the SSE answer to its end, within
    timeout_s of t0 (default: now; a socket read past it raises OSError, a
    stream still going raises RuntimeError). Returns (ttft_s, total_s,
    text_seen, events): from t0, ttft to the first event carrying text, or
    to the end when none did."""
    t0 = now() if t0 is None else t0
    conn = http.client.HTTPConnection(HOST, port, timeout=max(0.05, timeout_s - (now() - t0)))
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError("POST %s on port %d: HTTP %d %s" % (path, port, resp.status, resp.read()[:500]))
        first, events = None, []
        sock = conn.sock or getattr(getattr(resp.fp, "raw", None), "_sock", None)   # closed conn: resp's own
        for _ in range(MAX_SSE_LINES):
            if sock:
                sock.settimeout(max(0.05, timeout_s - (now() - t0)))   # the socket's limit is per read
            line = resp.readline()
            if not line:
                break
            if now() - t0 > timeout_s:
                raise RuntimeError("POST %s on port %d: no end after %.0f s" % (path, port, timeout_s))
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            events.append(ev)
            if first is None and has_text(ev):
                first = now() - t0
        total = now() - t0
    finally:
        conn.close()
    return (first if first is not None else total), total, first is not None, events


def has_text(ev):
    if ev.get("type") == "response.output_text.delta":
        return bool(ev.get("delta"))
    for ch in ev.get("choices") or ():
        if (ch.get("delta") or {}).get("content"):
            return True
    return False


class AgentkvChain:
    """One chain on agentkv's /v1/responses: by previous_response_id, or the
    whole history resent as items."""

    def __init__(self, proc, model_id, resend):
        self.proc, self.model_id, self.resend = proc, model_id, resend
        self.prev = None
        self.items = []

    def turn(self, user):
        body = {"model": self.model_id, "instructions": INSTRUCTIONS, "max_output_tokens": OUT_TOKENS,
                "temperature": 0, "stream": True}
        if self.resend:
            self.items.append({"role": "user", "content": user})
            body["input"] = self.items
        else:
            body["input"] = user
            if self.prev:
                body["previous_response_id"] = self.prev
        ttft, total, text, events = stream_post(self.proc.port, "/v1/responses", body)
        settle_s = settle(self.proc)
        end = [e for e in events if e.get("type") in ("response.completed", "response.incomplete")]
        if not end:
            raise RuntimeError("agentkv: no response.completed/incomplete; last events: %s" % events[-3:])
        r = end[-1]["response"]
        self.prev = r["id"]
        if self.resend:
            self.items.extend(r["output"])   # as the SDK resends them: the output items as answered
        u, ak = r["usage"], r["agentkv"]
        pre = u["input_tokens"] - u["input_tokens_details"]["cached_tokens"]
        if pre != ak["prefilled"]:
            log("  note: usage says %d prefilled, agentkv.prefilled %d" % (pre, ak["prefilled"]))
        return {"ttft_ms": ttft * 1000, "total_ms": total * 1000, "text": text, "prefilled": pre,
                "input_tokens": u["input_tokens"], "ak_prefilled": ak["prefilled"], "tier": ak["tier"],
                "match": ak["match"], "server_ttft_ms": ak["ttft_ms"], "restore_ms": ak["restore_ms"],
                "settle_ms": settle_s * 1000}


class LlamaChain:
    """One chain on llama-server's /v1/chat/completions, the whole history
    resent each turn."""

    def __init__(self, proc, model_id):
        self.proc, self.model_id = proc, model_id
        self.msgs = [{"role": "system", "content": INSTRUCTIONS}]

    def turn(self, user):
        self.msgs.append({"role": "user", "content": user})
        body = {"model": self.model_id, "messages": self.msgs, "max_tokens": OUT_TOKENS, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        ttft, total, text, events = stream_post(self.proc.port, "/v1/chat/completions", body)
        reply = "".join((ch.get("delta") or {}).get("content") or "" for e in events for ch in e.get("choices") or ())
        self.msgs.append({"role": "assistant", "content": reply})
        timings = next((e["timings"] for e in reversed(events) if e.get("timings")), None)
        usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
        if timings:
            pre, n_in = timings["prompt_n"], timings["prompt_n"] + timings.get("cache_n", 0)
        elif usage:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            pre, n_in = usage["prompt_tokens"] - cached, usage["prompt_tokens"]
        else:
            raise RuntimeError("llama-server: neither timings nor usage in the answer")
        return {"ttft_ms": ttft * 1000, "total_ms": total * 1000, "text": text, "prefilled": pre,
                "input_tokens": n_in, "server_ttft_ms": timings["prompt_ms"] if timings else None}


def count_tokens(args, text):
    """Tokens of text (no BOS) by `agentkv tokenize`."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run([args.bin, "tokenize", "-m", args.model, "-f", f.name, "--no-bos"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        os.unlink(f.name)
    return len(out.split())


def question(rng, n):
    return "Question %d: what about the %s and the %s?" % (n, rng.choice(WORDS), rng.choice(WORDS))


def make_document(args, rng, n_tokens):
    """A document of about n_tokens tokens: sentences of the word list under
    numbered sections, grown and cut by measured token counts (bounded)."""
    def text_of(n_words):
        out, k = [], 0
        while k < n_words:
            if k % 120 == 0:
                out.append("\n\nSection %d." % (k // 120 + 1))
            sent = [rng.choice(WORDS) for _ in range(8)]
            out.append(" " + " ".join(sent).capitalize() + ".")
            k += 8
        return "".join(out).strip()
    n_words = max(16, n_tokens // 2)
    for _ in range(6):
        state = rng.getstate()
        doc = text_of(n_words)
        got = count_tokens(args, doc)
        if abs(got - n_tokens) <= max(16, n_tokens // 50):
            return doc, got
        rng.setstate(state)
        n_words = max(16, int(n_words * n_tokens / max(got, 1)))
    return doc, got


def turn_cost(args, rng):
    """Tokens one turn adds to the history: the user message and the answer
    in ChatML's framing (an estimate under another template)."""
    sample = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n" % question(rng, 10)
    return count_tokens(args, sample) + OUT_TOKENS + 2


def run_context(args, C, work):
    rng = random.Random(args.seed * 1000 + C)
    n_turns = args.turns + args.after
    per_turn = turn_cost(args, random.Random(0))
    head = count_tokens(args, "<|im_start|>system\n%s<|im_end|>\n" % INSTRUCTIONS)
    doc_target = int(FILL * C) - head - n_turns * per_turn
    if doc_target < 64:
        raise RuntimeError("C=%d is too small for %d turns of about %d tokens" % (C, n_turns, per_turn))
    log("[C=%d] document of about %d tokens (a turn adds about %d)" % (C, doc_target, per_turn))
    doc, doc_tokens = make_document(args, rng, doc_target)
    inputs = ["Here is the document.\n\n" + doc + "\n\n" + question(rng, 1)]
    inputs += [question(rng, n) for n in range(2, n_turns + 1)]

    model_id = os.path.basename(args.model)[:-5] if args.model.endswith(".gguf") else os.path.basename(args.model)
    ak_flags = ["-t", str(args.threads), "-c", str(C), "--chat-template", args.chat_template]
    ll_flags = ["-t", str(args.threads), "-c", str(C), "-np", "1", "-fa", "on", "--chat-template", args.chat_template]
    procs = {}
    rows = []
    load0 = os.getloadavg()   # the machine may be shared: the load beside the run is part of its figures
    try:
        for name in ("a", "b"):
            mem = os.path.join(work, "mem-%d-%s" % (C, name))
            procs[name] = Proc("agentkv-" + name, [args.bin, "serve", "-m", args.model, "--port", "0",
                                                   "--memory-dir", mem] + ak_flags,
                               os.path.join(args.out, "agentkv-%d-%s.log" % (C, name)))
        if args.llama_server:
            lport = free_port()
            env = dict(os.environ)
            libdir = os.path.dirname(os.path.abspath(args.llama_server))
            env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
            procs["d"] = Proc("llama-server", [args.llama_server, "-m", args.model, "--host", HOST,
                                               "--port", str(lport)] + ll_flags,
                              os.path.join(args.out, "llama-server-%d.log" % C), env=env, port=lport)
        for p in procs.values():
            log("[C=%d] starting %s: %s" % (C, p.name, " ".join(p.cmd)))
            p.start()
        chains = {"a": AgentkvChain(procs["a"], model_id, resend=False),
                  "b": AgentkvChain(procs["b"], model_id, resend=True)}
        if "d" in procs:
            chains["d"] = LlamaChain(procs["d"], model_id)
        deadline = now() + args.max_seconds
        for t in range(1, n_turns + 1):
            if t == args.turns + 1:
                for p in procs.values():
                    log("[C=%d] SIGTERM and restart: %s" % (C, p.name))
                    p.restart()
                chains["c"] = chains.pop("a")
            row = {"turn": t, "after_restart": t > args.turns}
            for name in SERIES:
                if name in chains:
                    if now() > deadline:
                        raise RuntimeError("past --max-seconds (%.0f s)" % args.max_seconds)
                    row[name] = chains[name].turn(inputs[t - 1])
            rows.append(row)
            log("[C=%d] turn %2d/%d  " % (C, t, n_turns) + "  ".join(
                "%s %.0f ms (%d prefilled%s)" % (n, row[n]["ttft_ms"], row[n]["prefilled"],
                                                 ", " + row[n]["tier"] if "tier" in row[n] else "")
                for n in SERIES if n in row))
    finally:
        for p in procs.values():
            p.kill()
    return {"C": C, "doc_tokens": doc_tokens, "rows": rows, "load_start": load0, "load_end": os.getloadavg(),
            "agentkv_cmd": "agentkv serve -m MODEL --port P --memory-dir DIR " + " ".join(ak_flags),
            "llama_cmd": ("llama-server -m MODEL --host 127.0.0.1 --port P " + " ".join(ll_flags))
            if args.llama_server else None}


def cell(row, name):
    r = row.get(name)
    if not r:
        return "", ""
    return "%.0f%s" % (r["ttft_ms"], "" if r["text"] else "*"), "%d" % r["prefilled"]


def report(res, turns):
    """The markdown table, the restart ratios and totals of one context."""
    C, rows = res["C"], res["rows"]
    out = ["### C = %d (document %d tokens; history at the last turn: %s tokens)" % (
        C, res["doc_tokens"], rows[-1].get("c", {}).get("input_tokens", "?")), "",
        "Load average (1 min) at the start and the end: %.1f, %.1f." % (res["load_start"][0], res["load_end"][0]), "",
        "| turn | a TTFT ms | a prefilled | b TTFT ms | b prefilled | c TTFT ms | c prefilled "
        "| d TTFT ms | d prefilled |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        cells = [c for n in SERIES for c in cell(row, n)]
        out.append("| %d%s | %s |" % (row["turn"], " (restart)" if row["turn"] == turns + 1 else "",
                                       " | ".join(cells)))
    out.append("")

    def tot(name, after):
        v = [row[name] for row in rows if name in row and row["after_restart"] == after]
        return (sum(x["ttft_ms"] for x in v), sum(x["prefilled"] for x in v)) if v else None
    out.append("| totals | a | b | c | d |")
    out.append("|---|---:|---:|---:|---:|")
    for after, what in ((False, "turns 1-%d" % turns), (True, "turns %d-%d (after the restart)" % (
            turns + 1, len(rows)))):
        cells = []
        for n in SERIES:
            s = tot(n, after)
            cells.append("%.0f ms, %d tok" % s if s else "")
        out.append("| %s | %s |" % (what, " | ".join(cells)))
    out.append("")
    rr = next((row for row in rows if row["turn"] == turns + 1), None)
    ratios = {}
    if rr and "c" in rr and "d" in rr:
        ratios["restart_ttft_d_over_c"] = rr["d"]["ttft_ms"] / rr["c"]["ttft_ms"]
        ratios["restart_prefilled_d_over_c"] = rr["d"]["prefilled"] / max(rr["c"]["prefilled"], 1)
        out.append("At the restart (turn %d): d/c TTFT %.1fx (%.0f ms / %.0f ms), prefilled %d vs %d; "
                   "c served %s." % (turns + 1, ratios["restart_ttft_d_over_c"], rr["d"]["ttft_ms"],
                                     rr["c"]["ttft_ms"], rr["d"]["prefilled"], rr["c"]["prefilled"],
                                     rr["c"]["tier"]))
    for n in ("a", "b", "d"):
        v = [row[n]["ttft_ms"] for row in rows if n in row and 2 <= row["turn"] <= turns]
        if v:
            ratios["%s_turns2_max_over_min" % n] = max(v) / min(v)
            out.append("%s, turns 2-%d: TTFT %.0f-%.0f ms (max/min %.2f)." % (
                n, turns, min(v), max(v), max(v) / min(v)))
    res["ratios"] = ratios
    return "\n".join(out)


def write_svg(path, results, turns):
    """One panel per context: TTFT per turn (log scale), a line per series,
    the restart as a dashed line."""
    W, PH, L, R, T, GAP = 760, 240, 70, 20, 64, 70
    H = T + len(results) * (PH + GAP)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="13">TTFT per turn (log scale): agentkv Responses API '
           'vs llama-server</text>' % L]
    for k, n in enumerate(SERIES):   # the legend: two rows of two
        x, y = L + 320 * (k % 2), 34 + 14 * (k // 2)
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>'
                   % (x, y, x + 14, y, COLORS[n], x + 18, y + 4, LABELS[n]))
    for i, res in enumerate(results):
        rows = res["rows"]
        top = T + i * (PH + GAP) + 20
        vals = [row[n]["ttft_ms"] for row in rows for n in SERIES if n in row and row[n]["ttft_ms"] > 0]
        llo = math.floor(math.log10(min(vals)))
        lhi = max(llo + 1, math.ceil(math.log10(max(vals))))
        nt = len(rows)
        x_of = lambda t: L + (W - L - R) * (t - 0.5) / nt
        y_of = lambda ms: top + PH - PH * (math.log10(max(ms, 10 ** llo)) - llo) / (lhi - llo)
        out.append('<text x="%d" y="%d" font-size="12">C = %d</text>' % (L, top - 6, res["C"]))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, top, W - L - R, PH))
        for e in range(llo, lhi + 1):
            y = y_of(10 ** e)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (L, y, W - R, y))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (
                L - 5, y + 4, "%g ms" % 10 ** e if e < 3 else "%g s" % 10 ** (e - 3)))
        for t in range(1, nt + 1):
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x_of(t), top + PH + 14, t))
        xr = x_of(turns + 0.5)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#555" stroke-dasharray="4,3"/>' % (
            xr, top, xr, top + PH))
        out.append('<text x="%.1f" y="%d" text-anchor="end">SIGTERM + restart</text>' % (xr - 3, top + 12))
        for n in SERIES:
            pts = [(row["turn"], row[n]["ttft_ms"]) for row in rows if n in row]
            for seg in ([p for p in pts if p[0] <= turns], [p for p in pts if p[0] > turns]):
                if len(seg) > 1:
                    out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (
                        COLORS[n], " ".join("%.1f,%.1f" % (x_of(t), y_of(ms)) for t, ms in seg)))
            for t, ms in pts:
                out.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x_of(t), y_of(ms), COLORS[n]))
        out.append('<text x="%d" y="%d" text-anchor="middle">turn</text>' % ((W + L) // 2, top + PH + 30))
    with open(path, "w") as f:
        f.write("\n".join(out + ["</svg>"]) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/agentkv")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (series d; without it: a-c)")
    ap.add_argument("--model", default="build/bench-models/llama-1b-q4_0-8k.gguf",
                    help="GGUF (default: Llama-3.2-1B's shape, Q4_0, random weights: synthesized when absent)")
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--after", type=int, default=3, help="turns after the restart")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chat-template", default="chatml",
                    help="the template both servers render with (a synthetic GGUF has none; both know chatml)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=7200, help="a bound on each context's chain")
    ap.add_argument("--out", default="build/responses-chain", help="directory for summary.json and server logs")
    ap.add_argument("--svg", default=None, help="the plot (default: OUT/responses-chain.svg)")
    args = ap.parse_args()
    if not 2 <= args.turns <= 200 or not 1 <= args.after <= 50:
        ap.error("--turns 2..200, --after 1..50")
    os.makedirs(args.out, exist_ok=True)
    if not os.path.exists(args.model):
        os.makedirs(os.path.dirname(args.model) or ".", exist_ok=True)
        log("synthesizing %s" % args.model)
        subprocess.run([args.bin, "synth", "-o", args.model, "--like", "llama-1b", "--type", "q4_0", "--ctx",
                        str(max(int(x) for x in args.contexts.split(","))), "--seed", "1"], check=True, timeout=1200)
    svg = args.svg or os.path.join(args.out, "responses-chain.svg")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    work = tempfile.mkdtemp(prefix="agentkv-resp-chain-")
    results = []
    try:
        for C in [int(x) for x in args.contexts.split(",")]:
            results.append(run_context(args, C, work))
    except (KeyboardInterrupt, RuntimeError) as e:
        print("responses_chain: stopped: %s" % e)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("agentkv:      %s" % results[0]["agentkv_cmd"])
    print("llama-server: %s" % (results[0]["llama_cmd"] or "(not run: no --llama-server)"))
    print("KV: f16 on both (each server's default); * = no text came, TTFT to the end of the answer\n")
    for res in results:
        print(report(res, args.turns) + "\n")
    write_svg(svg, results, args.turns)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"turns": args.turns, "after": args.after, "threads": args.threads, "results": results}, f,
                  indent=1)
    print("plot: %s\nsummary: %s" % (svg, os.path.join(args.out, "summary.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
