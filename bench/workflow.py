#!/usr/bin/env python3
"""workflow.py - a multi-agent workflow over HTTP (triage, handoff to a
specialist with a tool call, a restart, a follow-up), on agentkv's server
and on llama.cpp's llama-server with the same GGUF, side by side in one run.
Python standard library only.

    # the agreement size: a real small model, greedy answers checked
    python3 bench/workflow.py --bin build/agentkv \
        --llama-server /path/to/llama.cpp/build/bin/llama-server \
        --sizes agreement --out build/workflow-agreement
    # the speed size: Llama-3.2-1B's shape, a 4K-token document, 8 and 32 agents
    python3 bench/workflow.py --bin build/agentkv \
        --llama-server /path/to/llama.cpp/build/bin/llama-server \
        --sizes speed --agents 8,32 --phase-cap-s 80 \
        --svg docs/workflow-ttft.svg --out build/workflow-speed

Sizes (--sizes, a list):
  speed      build/bench-models/llama-1b-q4_0-8k.gguf (synthesized when
             absent: `agentkv synth --like llama-1b --type q4_0`, seed 1,
             random weights), a document of about 4,000 tokens, context 6144
             per agent, --agents (default 8,32)
  agreement  ../shared/models/tiny-llama-h64-gqa-f32.gguf (a real model,
             context 1,024), a document of about 600 tokens, 8 agents; every
             answer is compared with a reference: the same request answered
             by a fresh agentkv server (handoff reuse off) on a fresh agent,
             alone
The document is real text: the tree's own docs (DOC_FILES, in order), cut
at the target token count as `agentkv tokenize` counts it.

The workflow, the same requests to every server (chat completions, greedy,
max_tokens 16, streamed), for agents i = 1..N:
  1 triage      agent triage-i: [system: triage][user: document + question i]
  2 handoff     agent specialist-i: [system: the specialist's own prompt, of
                another length than triage's and not a multiple of 32
                tokens][user: document + question i][assistant: triage-i's
                answer, with a tool call][tool: its result] (--tool-turns
                plain: the call and the result as text, in an assistant and
                a user turn)
  3 follow-up   after --idle-gap-s and a server restart: agent specialist-i,
                phase 2's conversation + [assistant: its answer][user: one
                more question]
Within a phase the requests run concurrently (agentkv: N at once;
llama-server: one per slot), each phase capped at --phase-cap-s: what has not
answered by then is cut (its connection closed) and counted as not completed;
a later phase uses an empty answer in its place.

Series per N:
  agentkv       `agentkv serve`, agents named by the body's agent_id,
                --kv-budget the same RAM llama-server holds for KV; one series
                per --handoff-modes entry (`--handoff-reuse MODE`, when
                `serve --help` lists it; otherwise only the off series runs)
  llama-server  -np S slots (S = min(N, --slots)), -c S*context (one
                context per slot), --slot-save-path, --cache-reuse 256, -fa on,
                f16 K and V (both servers' default), --cache-ram the rest of
                the same KV RAM. The bench keeps each agent's KV as a careful
                user would: before a request it restores the agent's slot file
                into the slot (a specialist's first request: its triage
                agent's file, the handoff), after the answer it saves the slot
                to the agent's file (POST /slots/ID?action=restore|save);
                TTFT counts from the restore call
Both servers render with one template (--chat-template-file, default the
llama.cpp tree's models/templates/Qwen-Qwen2.5-7B-Instruct.jinja: ChatML with
Hermes tool calls and the tool result in a user turn, as agentkv's chatml
renders them; llama-server's built-in chatml drops an assistant's tool call),
so both get the same prompt tokens.
Restart: agentkv gets SIGTERM (it saves its agents) and starts again on the
same --memory-dir; llama-server has saved every agent's slot after each
answer, gets SIGTERM and starts again on the same --slot-save-path.

Per series: wall time (the three phases and the restart), TTFT p50/p99 per
phase (to the first content delta; a request cut by the cap counts as
slower than the cap), tokens prefilled per phase (agentkv: usage
prompt_tokens - cached_tokens, checked against agentkv.prefilled;
llama-server: timings.prompt_n), peak RSS of the server process (VmHWM,
the largest of its runs before and after the restart), greedy agreement.
Prints markdown tables and the agentkv/llama-server ratios; writes
summary.json and the server logs under --out and the plot (TTFT p50 per
phase, log scale) to --svg. Every loop is bounded in count and time; every
server is killed on every exit path and dies with this process
(PR_SET_PDEATHSIG).
"""
import argparse
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no __pycache__ left in bench/
from responses_chain import HOST, Proc, count_tokens, free_port, log, now, stream_post  # noqa: E402
from soak import metric_values, pct  # noqa: E402

OUT_TOKENS = 16
PHASES = (1, 2, 3)
PHASE_NAMES = {1: "triage", 2: "handoff", 3: "follow-up"}
# Per size: the model, the document's tokens, the context per agent, the KV
# bytes of one token in f16 (layers x KV heads x head dim x 2 x 2 bytes) and
# the llama-server prompt cache (--cache-ram) beside its slots, in MiB.
SIZES = {
    "speed": {"model": "build/bench-models/llama-1b-q4_0-8k.gguf", "doc_tokens": 4000, "ctx": 6144,
              "agents": "8,32", "kv_token_bytes": 16 * 8 * 64 * 2 * 2, "cache_ram_mib": 512},
    "agreement": {"model": "../shared/models/tiny-llama-h64-gqa-f32.gguf", "doc_tokens": 600, "ctx": 1024,
                  "agents": "8", "kv_token_bytes": 6 * 2 * 64 * 2 * 2, "cache_ram_mib": 16},
}
DOC_FILES = ("docs/architecture.md", "docs/server.md", "docs/agents.md", "docs/responses.md")
TRIAGE_SYSTEM = ("You are the triage agent. Read the document and the question, then say in one short sentence "
                 "which part of the document answers it.")
SPECIALIST_SYSTEM = ("You are the specialist agent for questions about this server. The triage agent read the "
                     "question first and looked it up; use its note and the tool's result, and answer "
                     "precisely in one or two sentences.")
SPECIALIST_PAD = " Quote the document where you can."
TOPICS = ("the KV budget", "a restart", "agent names", "the memory directory", "streaming", "evictions",
          "the engine thread", "the warm tier", "shared prefixes", "metrics", "the API key", "stop strings",
          "tool calls", "the chat template", "continuous batching", "disk budget", "the console", "SIGTERM",
          "cached tokens", "prefill chunks", "the content index", "pools", "memories", "cards",
          "the Responses API", "conversations", "sampling", "logprobs", "timeouts", "the I/O thread",
          "admission", "model names", "request limits", "agent files")
FOLLOW_UP = "Thank you. Now give your final recommendation on that point in five words."
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
LLAMA_COLOR = "#d62728"
# ChatML with Hermes tool calls and tool results in a user turn, as agentkv's
# chatml renders them; llama-server's built-in chatml drops a tool call.
QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
JOIN_SLACK_S = 60.0             # a phase's workers end by the cap; this bounds the join past it
SLOT_CALL_TIMEOUT_S = 120.0     # one slot save or restore
RSS_POLL_S = 0.25


def question(i):
    return "Question %d: what does the document say about %s?" % (i, TOPICS[(i - 1) % len(TOPICS)])


def make_document(args, model, n_tokens):
    """Real text of about n_tokens tokens: the DOC_FILES in order, cut at a
    word boundary found by measured token counts (bounded)."""
    text = "\n\n".join(open(os.path.join(args.root, p)).read() for p in DOC_FILES)
    text = re.sub(r"\n{3,}", "\n\n", text)
    counting = argparse.Namespace(bin=args.bin, model=model)
    n_chars = n_tokens * 3
    got = 0
    for _ in range(8):
        cut = text.rfind(" ", 0, n_chars)
        doc = text[:cut if cut > 0 else n_chars]
        got = count_tokens(counting, doc)
        if abs(got - n_tokens) <= max(8, n_tokens // 100) or len(doc) >= len(text):
            break
        n_chars = max(64, int(n_chars * n_tokens / max(got, 1)))
    return doc, got


def system_prompts(args, model):
    """The triage and specialist system prompts. The specialist's rendered
    system turn is padded until its token count differs from triage's and is
    not a multiple of 32 (the document then starts at another offset, not on
    a block boundary). Returns (triage, specialist, their token counts)."""
    counting = argparse.Namespace(bin=args.bin, model=model)

    def turn_len(s):
        return count_tokens(counting, "<|im_start|>system\n%s<|im_end|>\n" % s)
    n_tri = turn_len(TRIAGE_SYSTEM)
    spec = SPECIALIST_SYSTEM
    n_spec = turn_len(spec)
    for _ in range(8):
        if n_spec != n_tri and n_spec % 32:
            break
        spec += SPECIALIST_PAD
        n_spec = turn_len(spec)
    return TRIAGE_SYSTEM, spec, (n_tri, n_spec)


def tool_turns(i, triage_answer, plain):
    """The triage agent's answer with its tool call, and the tool's result:
    as tool_calls and a tool message, or (plain) as text in an assistant and
    a user turn."""
    call_id = "call_%d" % i
    topic = TOPICS[(i - 1) % len(TOPICS)]
    result = "Section found: the part of the document on %s, %d paragraphs." % (topic, 1 + i % 4)
    if plain:
        return [{"role": "assistant", "content": "%s\nCalling lookup_section on %s." % (triage_answer, topic)},
                {"role": "user", "content": "The lookup_section tool says: " + result}]
    return [{"role": "assistant", "content": triage_answer,
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": "lookup_section", "arguments": json.dumps({"topic": topic})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]


class RssWatch(threading.Thread):
    """Samples VmHWM of a Proc's processes (a restart makes a new one); peak()
    is the largest seen, in MiB."""

    def __init__(self, proc):
        super().__init__(daemon=True)
        self.proc, self.hwm, self.stop_ev = proc, {}, threading.Event()

    def sample(self):
        p = self.proc.p
        if p is None:
            return
        try:
            with open("/proc/%d/status" % p.pid) as f:
                m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
        except OSError:
            return
        if m:
            self.hwm[p.pid] = max(self.hwm.get(p.pid, 0), int(m.group(1)))

    def run(self):
        while not self.stop_ev.wait(RSS_POLL_S):
            self.sample()

    def peak(self):
        return max(self.hwm.values()) / 1024.0 if self.hwm else None


def post_json(port, path, body, timeout):
    """A plain POST; returns (status, parsed JSON or None)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, None


def chat_body(model_id, messages):
    return {"model": model_id, "messages": messages, "max_tokens": OUT_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def answer_text(events):
    return "".join((ch.get("delta") or {}).get("content") or "" for e in events for ch in e.get("choices") or ())


class AgentkvSide:
    """Requests to an agentkv server; an agent is the body's agent_id."""

    def __init__(self, proc, model_id):
        self.proc, self.model_id = proc, model_id
        self.concurrency = None

    def request(self, task, deadline):
        body = chat_body(self.model_id, task["messages"])
        body["agent_id"] = task["agent"]
        ttft, total, text_seen, events = stream_post(self.proc.port, "/v1/chat/completions", body,
                                                     timeout_s=deadline - now())
        u = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
        ak = next((e["agentkv"] for e in reversed(events) if e.get("agentkv")), None)
        if u is None:
            raise RuntimeError("agentkv: no usage in the stream")
        details = u.get("prompt_tokens_details") or {}
        pre = u["prompt_tokens"] - details.get("cached_tokens", 0)
        out = {"ttft_ms": ttft * 1000, "total_ms": total * 1000, "text_seen": text_seen,
               "text": answer_text(events), "prompt_tokens": u["prompt_tokens"],
               "cached": details.get("cached_tokens", 0), "prefilled": pre}
        extra = {k: v for k, v in details.items() if k != "cached_tokens"}
        if extra:
            out["usage_details"] = extra   # e.g. tokens reused from another agent (handoff reuse)
        if ak:
            out.update(ak_prefilled=ak.get("prefilled"), tier=ak.get("tier"), shared=ak.get("shared"),
                       restore_ms=ak.get("restore_ms"), handoff_from=ak.get("handoff_from"))
            if ak.get("prefilled") is not None and ak["prefilled"] != pre:
                out["note"] = "usage says %d prefilled, agentkv.prefilled %d" % (pre, ak["prefilled"])
        return out

    def after_restart(self):
        pass


class LlamaSide:
    """Requests to llama-server: worker k holds slot k; an agent's KV is
    restored into the slot before its request (a specialist's first request:
    its triage agent's, the handoff) and saved after the answer."""

    def __init__(self, proc, model_id, slots):
        self.proc, self.model_id, self.concurrency = proc, model_id, slots
        self.lock = threading.Lock()
        self.owner = {}       # slot -> the agent whose KV it holds
        self.files = set()    # agents with a saved slot file

    def slot_call(self, slot, action, agent):
        t0 = now()
        st, js = post_json(self.proc.port, "/slots/%d?action=%s" % (slot, action), {"filename": agent + ".bin"},
                           SLOT_CALL_TIMEOUT_S)
        if st != 200:
            raise RuntimeError("llama-server /slots/%d?action=%s %s: HTTP %d %s" % (slot, action, agent, st, js))
        return (now() - t0) * 1000

    def request(self, task, deadline, slot):
        t0 = now()
        agent = task["agent"]
        out = {}
        with self.lock:
            held = self.owner.get(slot)
            src = agent if agent in self.files else task.get("handoff_from")
            src = src if src in self.files else None
        if held != agent and src:
            out["restore_ms"] = self.slot_call(slot, "restore", src)
            out["restored"] = src
        body = chat_body(self.model_id, task["messages"])
        body.update(id_slot=slot, cache_prompt=True)
        ttft, total, text_seen, events = stream_post(self.proc.port, "/v1/chat/completions", body,
                                                     timeout_s=deadline - t0, t0=t0)
        timings = next((e["timings"] for e in reversed(events) if e.get("timings")), None)
        if not timings:
            raise RuntimeError("llama-server: no timings in the stream")
        out.update(ttft_ms=ttft * 1000, total_ms=total * 1000, text_seen=text_seen, text=answer_text(events),
                   prefilled=timings["prompt_n"], cached=timings.get("cache_n", 0),
                   prompt_tokens=timings["prompt_n"] + timings.get("cache_n", 0))
        with self.lock:
            self.owner[slot] = None
        out["save_ms"] = self.slot_call(slot, "save", agent)
        with self.lock:
            self.owner[slot] = agent
            self.files.add(agent)
        return out

    def after_restart(self):
        with self.lock:
            self.owner = {}


def run_phase(side, tasks, cap_s):
    """Runs tasks (dicts with agent, messages) on side with its concurrency,
    all within cap_s. Returns (results in task order, wall seconds)."""
    q = queue.Queue()
    for k, t in enumerate(tasks):
        q.put((k, t))
    results = [None] * len(tasks)
    t0 = now()
    deadline = t0 + cap_s

    def worker(slot):
        for _ in range(len(tasks)):
            try:
                k, t = q.get_nowait()
            except queue.Empty:
                return
            if now() >= deadline:
                results[k] = {"ok": False, "error": "not sent: the phase cap came first"}
                continue
            try:
                r = side.request(t, deadline, slot) if isinstance(side, LlamaSide) else side.request(t, deadline)
                r["ok"] = now() <= deadline or r["total_ms"] <= cap_s * 1000
                r["end_s"] = now() - t0
            except (OSError, RuntimeError, ValueError, KeyError, http.client.HTTPException) as e:
                r = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
            results[k] = r
    n = min(len(tasks), side.concurrency or len(tasks))
    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.1, deadline + JOIN_SLACK_S - now()))
    cut = any(not (r and r.get("ok")) for r in results)
    wall = min(cap_s, now() - t0) if cut else max(r["end_s"] for r in results)   # a cut phase took the cap
    return [r or {"ok": False, "error": "worker still running after the cap"} for r in results], wall


def settle_agentkv(proc, limit_s):
    """Waits (bounded) until an agentkv server has no request running and no
    agent unsaved; returns the seconds waited."""
    t0 = now()
    while now() - t0 < limit_s:
        m = metric_values(proc.port, ("agentkv_requests_active", "agentkv_agents_unsaved"))
        if m is None or m == (0, 0):
            break
        time.sleep(0.05)
    return now() - t0


def workflow_tasks(doc, prompts, n, phase, prev, plain):
    """The requests of one phase; prev: the previous phase's tasks and
    results (answers feed the next phase)."""
    tri, spec = prompts
    tasks = []
    for i in range(1, n + 1):
        user = {"role": "user", "content": doc + "\n\n" + question(i)}
        if phase == 1:
            tasks.append({"agent": "triage-%d" % i, "messages": [{"role": "system", "content": tri}, user]})
            continue
        pt, pr = prev[0][i - 1], prev[1][i - 1]
        ans = pr.get("text", "") if pr.get("ok") else ""
        if phase == 2:
            msgs = [{"role": "system", "content": spec}, user] + tool_turns(i, ans, plain)
            tasks.append({"agent": "specialist-%d" % i, "messages": msgs, "handoff_from": "triage-%d" % i})
        else:
            msgs = pt["messages"] + [{"role": "assistant", "content": ans}, {"role": "user", "content": FOLLOW_UP}]
            tasks.append({"agent": "specialist-%d" % i, "messages": msgs})
    return tasks


def run_series(args, name, proc, side, setup):
    """One series: start, phases 1-2, idle gap, restart, phase 3, stop."""
    watch = RssWatch(proc)
    res = {"series": name, "cmd": " ".join(proc.cmd), "phases": {}}
    try:
        log("[%s] starting: %s" % (name, " ".join(proc.cmd)))
        proc.start()
        watch.start()
        prev, wall = None, 0.0
        for ph in PHASES:
            if ph == 3:
                time.sleep(args.idle_gap_s)
                watch.sample()
                t0 = now()
                log("[%s] SIGTERM and restart" % name)
                proc.restart()
                side.after_restart()
                res["restart_s"] = now() - t0
                wall += res["restart_s"]
            tasks = workflow_tasks(setup["doc"], setup["prompts"], setup["n"], ph, prev, args.tool_turns == "plain")
            results, w = run_phase(side, tasks, args.phase_cap_s)
            wall += w
            res["phases"][ph] = {"wall_s": w, "tasks": tasks, "results": results}
            done = sum(1 for r in results if r.get("ok"))
            log("[%s] phase %d (%s): %d/%d within the cap, %.1f s" % (name, ph, PHASE_NAMES[ph], done, len(tasks), w))
            for r in results:
                if r.get("note") or (r.get("error") and not r["error"].startswith("not sent")):
                    log("  %s" % (r.get("note") or r["error"]))
            if isinstance(side, AgentkvSide):
                res["phases"][ph]["settle_s"] = settle_agentkv(proc, args.phase_cap_s)
            prev = (tasks, results)
        res["wall_s"] = wall
    finally:
        watch.sample()
        watch.stop_ev.set()
        proc.kill()
        res["peak_rss_mib"] = watch.peak()
    return res


def reference_answers(args, setup, model, work, series_list):
    """The greedy answer of every distinct request of the series, each on a
    fresh agentkv server (handoff reuse off) on a fresh agent, alone."""
    refs = {}
    k = 0
    for s in series_list:
        for ph in PHASES:
            for t in s["phases"].get(ph, {}).get("tasks", []):
                key = json.dumps(t["messages"], sort_keys=True)
                if key in refs:
                    continue
                k += 1
                proc = Proc("agentkv-ref", [args.bin, "serve", "-m", model, "--port", "0", "--memory-dir",
                                            os.path.join(work, "ref-%d" % k)] + setup["ak_flags"],
                            os.path.join(args.out, "agentkv-reference.log"))
                try:
                    proc.start()
                    body = chat_body(setup["model_id"], t["messages"])
                    body["agent_id"] = "ref-%d" % k
                    _, _, _, events = stream_post(proc.port, "/v1/chat/completions", body, timeout_s=600)
                    refs[key] = answer_text(events)
                finally:
                    proc.kill()
    for s in series_list:
        for ph in PHASES:
            p = s["phases"].get(ph)
            if not p:
                continue
            for t, r in zip(p["tasks"], p["results"]):
                if r.get("ok"):
                    r["agrees"] = r["text"] == refs[json.dumps(t["messages"], sort_keys=True)]
    log("reference: %d distinct requests answered on fresh servers" % k)


def handoff_supported(binary):
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=60)
    return "--handoff-reuse" in out.stdout + out.stderr


def run_size(args, size, work, modes):
    cfg = SIZES[size]
    model = args.model if args.model and len(args.sizes) == 1 else cfg["model"]
    if not os.path.exists(model):
        if size != "speed":
            raise RuntimeError("no model %s" % model)
        os.makedirs(os.path.dirname(model), exist_ok=True)
        log("synthesizing %s" % model)
        subprocess.run([args.bin, "synth", "-o", model, "--like", "llama-1b", "--type", "q4_0", "--ctx", "8192",
                        "--seed", "1"], check=True, timeout=1800)
    model_id = os.path.basename(model)[:-5] if model.endswith(".gguf") else os.path.basename(model)
    doc, doc_tokens = make_document(args, model, cfg["doc_tokens"])
    tri, spec, sys_tokens = system_prompts(args, model)
    log("[%s] document %d tokens; system turns: triage %d, specialist %d tokens" % (size, doc_tokens, *sys_tokens))
    ctx = cfg["ctx"]
    agents = [int(x) for x in (args.agents or cfg["agents"]).split(",")]
    out = {"size": size, "model": model, "doc_tokens": doc_tokens, "system_tokens": sys_tokens, "ctx": ctx,
           "runs": []}
    for n in agents:
        slots = min(n, args.slots)
        slot_kv_mib = slots * ctx * cfg["kv_token_bytes"] / 2 ** 20
        budget_mib = int(slot_kv_mib + cfg["cache_ram_mib"])
        ak_flags = (["-t", str(args.threads), "-c", str(ctx)] + args.template_flags
                    + ["--kv-budget", "%dMiB" % budget_mib])
        setup = {"doc": doc, "prompts": (tri, spec), "n": n, "model_id": model_id, "ak_flags": ak_flags}
        run = {"n": n, "slots": slots, "kv_budget_mib": budget_mib, "series": [], "load_start": os.getloadavg()}
        for k, mode in enumerate(modes):
            name = "agentkv" if mode == "none" else "agentkv handoff %s" % mode
            flags = ak_flags + (["--handoff-reuse", mode] if args.handoff_flag else [])
            mem = os.path.join(work, "mem-%s-%d-%d" % (size, n, k))
            proc = Proc("agentkv-" + mode, [args.bin, "serve", "-m", model, "--port", "0", "--memory-dir", mem]
                        + flags, os.path.join(args.out, "agentkv-%s-%d-%d.log" % (size, n, k)))
            side = AgentkvSide(proc, model_id)
            side.concurrency = n
            run["series"].append(run_series(args, name, proc, side, setup))
        if args.llama_server:
            save_dir = os.path.join(work, "slots-%s-%d" % (size, n))
            os.makedirs(save_dir)
            env = dict(os.environ)
            libdir = os.path.dirname(os.path.abspath(args.llama_server))
            env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
            port = free_port()
            ll_flags = ["-t", str(args.threads), "-c", str(slots * ctx), "-np", str(slots), "-fa", "on",
                        "-ctk", "f16", "-ctv", "f16", "--cache-reuse", "256", "--cache-ram",
                        str(cfg["cache_ram_mib"]), "--slot-save-path", save_dir] + args.template_flags
            proc = Proc("llama-server", [args.llama_server, "-m", model, "--host", HOST, "--port", str(port)]
                        + ll_flags, os.path.join(args.out, "llama-server-%s-%d.log" % (size, n)), env=env, port=port)
            run["series"].append(run_series(args, "llama-server", proc, LlamaSide(proc, model_id, slots), setup))
        if size == "agreement":
            reference_answers(args, setup, model, work, run["series"])
        run["load_end"] = os.getloadavg()
        out["runs"].append(run)
    return out


def ttft_stats(p, cap_s):
    """TTFT p50 and p99 (ms) of a phase; a request that did not complete
    counts as infinitely slow (above the cap)."""
    v = sorted(r["ttft_ms"] if r.get("ok") else math.inf for r in p["results"])
    return (pct(v, 50), pct(v, 99)) if v else (None, None)


def fms(x, cap_s):
    if x is None:
        return "-"
    return ">%.0f s" % cap_s if math.isinf(x) else ("%.0f" % x if x >= 10 else "%.1f" % x)


def ratio(a, b):
    """a/b as text; an infinite b (cut by the cap) makes it an upper bound."""
    if a is None or b is None or b == 0:
        return "-"
    if math.isinf(a) and math.isinf(b):
        return "-"
    if math.isinf(b):
        return "<<1 (llama-server cut by the cap)"
    if math.isinf(a):
        return ">>1 (agentkv cut by the cap)"
    return "%.3f" % (a / b)


def summarize(size_res, cap_s):
    """Markdown tables of one size: per N, a row per series; and the ratios."""
    lines = []
    for run in size_res["runs"]:
        lines += ["### %s, N = %d agents (document %d tokens, context %d, %d llama-server slots, KV RAM %d MiB "
                  "on each side)" % (size_res["size"], run["n"], size_res["doc_tokens"], size_res["ctx"],
                                     run["slots"], run["kv_budget_mib"]), "",
                  "Load average (1 min) at the start and the end: %.1f, %.1f." % (run["load_start"][0],
                                                                                  run["load_end"][0]), "",
                  "| series | wall s | completed 1/2/3 | TTFT p50 ms 1/2/3 | TTFT p99 ms 1/2/3 "
                  "| prefilled 1/2/3 | peak RSS MiB | agreement |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for s in run["series"]:
            ph = [s["phases"].get(k) for k in PHASES]
            done = "/".join("%d" % sum(1 for r in p["results"] if r.get("ok")) if p else "-" for p in ph)
            st = [ttft_stats(p, cap_s) if p else (None, None) for p in ph]
            pre = "/".join("%d" % sum(r.get("prefilled", 0) for r in p["results"] if r.get("ok")) if p else "-"
                           for p in ph)
            ag = [r["agrees"] for p in ph if p for r in p["results"] if "agrees" in r]
            s["agreement"] = sum(ag) / len(ag) if ag else None
            s["ttft_p50_ms"] = [x[0] for x in st]
            lines.append("| %s | %s | %s of %d | %s | %s | %s | %s | %s |" % (
                s["series"], "%.1f" % s["wall_s"] if "wall_s" in s else "-", done, run["n"],
                " / ".join(fms(x[0], cap_s) for x in st), " / ".join(fms(x[1], cap_s) for x in st), pre,
                "%.0f" % s["peak_rss_mib"] if s.get("peak_rss_mib") else "-",
                "%d/%d (%.0f%%)" % (sum(ag), len(ag), 100.0 * sum(ag) / len(ag)) if ag else "-"))
        lines.append("")
        ll = next((s for s in run["series"] if s["series"] == "llama-server"), None)
        for s in run["series"]:
            if s is ll or not ll:
                continue
            r = {"wall": ratio(s.get("wall_s"), ll.get("wall_s"))}
            for k in range(3):
                r["ttft_p50_%d" % (k + 1)] = ratio(s["ttft_p50_ms"][k], ll["ttft_p50_ms"][k])
            all_a = sorted(x["ttft_ms"] if x.get("ok") else math.inf
                           for p in s["phases"].values() for x in p["results"])
            all_b = sorted(x["ttft_ms"] if x.get("ok") else math.inf
                           for p in ll["phases"].values() for x in p["results"])
            r["ttft_p50_all"] = ratio(pct(all_a, 50), pct(all_b, 50)) if all_a and all_b else "-"
            r["peak_rss"] = ratio(s.get("peak_rss_mib"), ll.get("peak_rss_mib"))
            s["ratios_vs_llama"] = r
            lines.append("%s / llama-server: wall %s; TTFT p50 triage %s, handoff %s, follow-up %s, all phases %s; "
                         "peak RSS %s." % (s["series"], r["wall"], r["ttft_p50_1"], r["ttft_p50_2"], r["ttft_p50_3"],
                                           r["ttft_p50_all"], r["peak_rss"]))
        for s in run["series"]:
            keys = sorted({k for p in s["phases"].values() for r in p["results"] for k in r.get("usage_details", {})})
            sums = ["%s %s" % (k, "/".join("%d" % sum(r.get("usage_details", {}).get(k, 0) for r in p["results"])
                                            for p in (s["phases"][ph] for ph in PHASES if ph in s["phases"])))
                    for k in keys]
            if sums:
                lines.append("%s: usage.prompt_tokens_details beyond cached_tokens, per phase: %s." % (
                    s["series"], "; ".join(sums)))
        lines.append("")
    return "\n".join(lines)


def write_svg(path, sizes_res, cap_s):
    """A panel per (size, N): TTFT p50 per phase (log scale), a line per
    series; a phase whose p50 was cut by the cap is drawn at the cap, hollow."""
    panels = [(sr, run) for sr in sizes_res for run in sr["runs"]]
    W, PH, PW, L, T, GAP = 400, 220, 300, 70, 70, 40
    H = T + PH + 50
    W = L + len(panels) * (PW + GAP)
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="13">TTFT p50 per phase (log scale): agentkv vs llama-server, '
           'same workflow</text>' % L]
    names = []
    for _, run in panels:
        for s in run["series"]:
            if s["series"] not in names:
                names.append(s["series"])
    color = {n: (LLAMA_COLOR if n == "llama-server" else SERIES_COLORS[k % len(SERIES_COLORS)])
             for k, n in enumerate(names)}
    for k, n in enumerate(names):
        x = L + 230 * k
        svg.append('<line x1="%d" y1="34" x2="%d" y2="34" stroke="%s" stroke-width="2"/>'
                   '<text x="%d" y="38">%s</text>' % (x, x + 14, color[n], x + 18, n))
    vals = [min(v, cap_s * 1000) for _, run in panels for s in run["series"] for v in s["ttft_p50_ms"]
            if v is not None]
    lo = math.floor(math.log10(max(min(vals), 0.1)))
    hi = max(lo + 1, math.ceil(math.log10(max(vals))))
    for k, (sr, run) in enumerate(panels):
        x0 = L + k * (PW + GAP)
        y_of = lambda ms: T + PH - PH * (math.log10(max(ms, 10 ** lo)) - lo) / (hi - lo)
        x_of = lambda ph: x0 + PW * (ph - 0.5) / 3
        svg.append('<text x="%d" y="%d" font-size="12">%s, N = %d</text>' % (x0, T - 8, sr["size"], run["n"]))
        svg.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (x0, T, PW, PH))
        for e in range(lo, hi + 1):
            y = y_of(10 ** e)
            svg.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (x0, y, x0 + PW, y))
            if k == 0:
                svg.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (
                    x0 - 5, y + 4, "%g ms" % 10 ** e if e < 3 else "%g s" % 10 ** (e - 3)))
        for ph in PHASES:
            svg.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x_of(ph), T + PH + 14,
                                                                                PHASE_NAMES[ph]))
        for s in run["series"]:
            pts = [(ph, v) for ph, v in zip(PHASES, s["ttft_p50_ms"]) if v is not None]
            svg.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (
                color[s["series"]], " ".join("%.1f,%.1f" % (x_of(ph), y_of(min(v, cap_s * 1000))) for ph, v in pts)))
            for ph, v in pts:
                cut = math.isinf(v)
                svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s" stroke="%s"/>' % (
                    x_of(ph), y_of(min(v, cap_s * 1000)), "white" if cut else color[s["series"]],
                    color[s["series"]]))
    svg.append('<text x="%d" y="%d">hollow: p50 not reached within the phase cap (%.0f s), drawn at the cap'
               '</text>' % (L, H - 10, cap_s))
    with open(path, "w") as f:
        f.write("\n".join(svg + ["</svg>"]) + "\n")


def finite(x):
    """x for JSON: an infinite TTFT (cut by the cap) becomes null."""
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return None if isinstance(x, float) and math.isinf(x) else x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/agentkv")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (without it: agentkv only)")
    ap.add_argument("--sizes", default="agreement", help="agreement, speed or both (a list)")
    ap.add_argument("--model", default=None, help="another GGUF for a single size")
    ap.add_argument("--agents", default=None, help="N, a list (default: per size)")
    ap.add_argument("--slots", type=int, default=8, help="llama-server slots at most (-np)")
    ap.add_argument("--handoff-modes", default="none,cacheblend:0.3",
                    help="agentkv --handoff-reuse values, a series each (only none when serve lacks the flag)")
    ap.add_argument("--phase-cap-s", type=float, default=600, help="a bound on each phase")
    ap.add_argument("--tool-turns", choices=("messages", "plain"), default="messages",
                    help="the tool call and result as tool_calls and a tool message, or as plain text turns")
    ap.add_argument("--idle-gap-s", type=float, default=2, help="the idle time before the restart")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chat-template-file", default=None,
                    help="a Jinja template both servers render with (default: llama.cpp's tree's Qwen2.5 "
                         "template when there, else --chat-template chatml on both)")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the tree whose docs make the document")
    ap.add_argument("--out", default="build/workflow", help="directory for summary.json and server logs")
    ap.add_argument("--svg", default=None, help="the plot (default: OUT/workflow-ttft.svg)")
    args = ap.parse_args()
    args.sizes = [s for s in args.sizes.split(",") if s]
    if any(s not in SIZES for s in args.sizes) or not 1 <= args.slots <= 64 or args.phase_cap_s <= 0:
        ap.error("--sizes from %s; --slots 1..64; --phase-cap-s > 0" % ",".join(SIZES))
    os.makedirs(args.out, exist_ok=True)
    tpl = args.chat_template_file
    if tpl is None and args.llama_server:
        tpl = os.path.join(os.path.dirname(os.path.abspath(args.llama_server)), "..", "..", "models", "templates",
                           QWEN_TEMPLATE)
        tpl = os.path.normpath(tpl) if os.path.exists(tpl) else None
    args.template_flags = ["--chat-template-file", tpl] if tpl else ["--chat-template", "chatml"]
    if not tpl and args.llama_server:
        print("no --chat-template-file: chatml on both (llama-server's chatml drops the tool call)")
    modes = [m for m in args.handoff_modes.split(",") if m]
    args.handoff_flag = handoff_supported(args.bin)
    if not args.handoff_flag:
        print("agentkv serve --help lists no --handoff-reuse: only the off series runs")
        modes = ["none"]

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    work = tempfile.mkdtemp(prefix="agentkv-workflow-")
    sizes_res = []
    t0 = now()
    try:
        for size in args.sizes:
            sizes_res.append(run_size(args, size, work, modes))
    except (KeyboardInterrupt, RuntimeError, subprocess.SubprocessError) as e:
        print("workflow: stopped: %s" % e)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("KV: f16 K and V on both servers; phase cap %.0f s; idle gap %.0f s; run %.0f s in all\n" % (
        args.phase_cap_s, args.idle_gap_s, now() - t0))
    for sr in sizes_res:
        print(summarize(sr, args.phase_cap_s))
        for s in sr["runs"][0]["series"]:
            print("%s: %s" % (s["series"], s["cmd"]))
        print()
    svg = args.svg or os.path.join(args.out, "workflow-ttft.svg")
    write_svg(svg, sizes_res, args.phase_cap_s)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(finite({"phase_cap_s": args.phase_cap_s, "idle_gap_s": args.idle_gap_s, "threads": args.threads,
                   "handoff_flag": args.handoff_flag, "template_flags": args.template_flags,
                   "tool_turns": args.tool_turns,
                   "sizes": sizes_res}), f, indent=1)
    print("plot: %s\nsummary: %s" % (svg, os.path.join(args.out, "summary.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
