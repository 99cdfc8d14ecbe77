#!/usr/bin/env python3
"""demo.py BIN MODEL - the main job: a multi-agent workflow over HTTP.

Starts `agentkv serve` on the model with a KV budget that holds only some of
the agents, then six agents (planner, researcher, writer, critic, editor,
tester) take three phases of chat turns, all agents of a phase at once (the
server batches them). Between phases 2 and 3 the server is restarted: every
agent comes back from the memory directory (tier warm) without re-prefill.
Prints one line per turn and a summary. Standard library only.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/agentkv"
MODEL = sys.argv[2] if len(sys.argv) > 2 else "../shared/models/stories260K.gguf"
MEM = os.environ.get("MEM", "build/demo-memory")
BUDGET = os.environ.get("BUDGET", "200K")   # about 3 of the 6 agents at the end

AGENTS = {
    "planner": "You are the planner. You split the story into parts.",
    "researcher": "You are the researcher. You find facts about animals.",
    "writer": "You are the writer. You write the story of Lily and her dog.",
    "critic": "You are the critic. You say what is good and what is bad.",
    "editor": "You are the editor. You make the story short and clear.",
    "tester": "You are the tester. You check that the story makes sense.",
}
ASKS = [
    "Start: a story about a little girl named Lily who finds a lost dog in the park.",
    "Go on: what happens when they meet the dog's old owner?",
    "End it: how do Lily and the dog say goodbye?",
]


def start_server():
    log = open(os.path.join(MEM, "server.log"), "a")
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", "0", "--memory-dir", MEM, "-c", "512",
                          "-ctk", "q8", "-ctv", "tq3", "--kv-budget", BUDGET],
                         stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        log.write(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            sys.stderr.write("demo: " + line)
            break
    if not port:
        sys.exit("demo: the server did not start (see %s/server.log)" % MEM)
    # keep draining the server's log in the background
    threading.Thread(target=lambda: [log.write(l) or log.flush() for l in p.stderr], daemon=True).start()
    return p, "http://127.0.0.1:%d" % port


def chat(url, agent, messages):
    body = json.dumps({"model": os.path.basename(MODEL)[:-5], "messages": messages, "max_tokens": 24,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "X-Agent-Id": agent})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def phase(url, k, history, rows):
    results = {}

    def one(agent):
        msgs = [{"role": "system", "content": AGENTS[agent]}] + history[agent] + [{"role": "user", "content": ASKS[k]}]
        results[agent] = chat(url, agent, msgs)

    threads = [threading.Thread(target=one, args=(a,)) for a in AGENTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for agent in AGENTS:
        r = results[agent]
        reply = r["choices"][0]["message"]["content"]
        history[agent] += [{"role": "user", "content": ASKS[k]}, {"role": "assistant", "content": reply}]
        a, u = r["agentkv"], r["usage"]
        rows.append((k + 1, agent, a["tier"], a["match"], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
                     a["prefilled"], a["restore_ms"], a["queue_ms"], a["ttft_ms"] - a["queue_ms"], a["evicted"], reply))
        print("%-5d %-10s %-5s %-7s %6d %6d %9d %10.2f %8.1f %8.1f %7d  %s" % (rows[-1][:-1] + (reply.strip()[:36].replace("\n", " "),)),
              flush=True)


def main():
    if not os.path.exists(MODEL):
        sys.exit("demo: model %s not found (make demo MODEL=path/to/model.gguf)" % MODEL)
    shutil.rmtree(MEM, ignore_errors=True)
    os.makedirs(MEM)
    history = {a: [] for a in AGENTS}
    rows = []
    server, url = start_server()
    print("ttft_ms: from admission to the first token (queue_ms: waiting for a batch slot or KV room)")
    print("%-5s %-10s %-5s %-7s %6s %6s %9s %10s %8s %8s %7s  %s" % ("phase", "agent", "tier", "match", "prompt", "cached",
                                                                 "prefilled", "restore_ms", "queue_ms", "ttft_ms", "evicted", "reply"))
    try:
        phase(url, 0, history, rows)
        phase(url, 1, history, rows)
        print("--- restarting the server (SIGTERM: every agent is saved) ---", flush=True)
        server.send_signal(signal.SIGTERM)
        if server.wait(timeout=120) != 0:
            sys.exit("demo: the server did not exit cleanly")
        server, url = start_server()
        phase(url, 2, history, rows)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    print()
    print("summary (KV budget %s, %d agents, keys q8 / values tq3):" % (BUDGET, len(AGENTS)))
    print("%-5s %5s %5s %5s %14s %14s %14s" % ("phase", "hot", "warm", "cold", "cached/prompt", "mean ttft ms", "evictions"))
    for k in (1, 2, 3):
        rs = [r for r in rows if r[0] == k]
        tiers = [r[2] for r in rs]
        print("%-5d %5d %5d %5d %7d/%-6d %14.1f %14d" % (k, tiers.count("hot"), tiers.count("warm"), tiers.count("cold"),
                                                     sum(r[5] for r in rs), sum(r[4] for r in rs),
                                                     sum(r[9] for r in rs) / len(rs), sum(r[10] for r in rs)))
    for tier in ("hot", "warm", "cold"):
        rs = [r for r in rows if r[2] == tier]
        if rs:
            print("mean ttft %-4s: %7.1f ms over %2d turns (prompt %5.1f tokens, %5.1f of them from the cache)" % (
                tier, sum(r[9] for r in rs) / len(rs), len(rs), sum(r[4] for r in rs) / len(rs), sum(r[5] for r in rs) / len(rs)))
    print()
    subprocess.run([BIN, "cache", "ls", "--memory-dir", MEM])


if __name__ == "__main__":
    main()
