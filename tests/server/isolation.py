#!/usr/bin/env python3
"""isolation.py BIN SHARED - 64 concurrent agents, each told its own secret,
must only ever see their own cache. Python standard library only.

The crowd: one `agentkv serve` with a KV budget that holds about a quarter
of the 64 agents (so agents are evicted to disk and restored mid-test, and
others come back to their cache still in RAM: about 50 later turns hot and
80 warm, far from either edge; at a third, which other tests running beside
it could push to all hot, it once failed that way), all 64
agents talking at once, greedy, TURNS turns each: turn 0 tells the agent a
secret (a distinct word and number), the later turns ask for it back. Then
the crowd's server gets SIGTERM (it must exit 0, every agent saved), a new
one starts on the same memory directory, and every agent takes one more turn
at once: each must come back warm, from its own file.

The references never touch the crowd's caches:
- answers: each conversation of each turn is sent again, as an anonymous
  request (no agent id), to a separate, fresh server process; the crowd's
  answer, prompt_tokens and completion_tokens must equal it;
- cached tokens: an agent's cache holds exactly the tokens it computed for
  its own previous turn: that turn's prompt and every answer token but the
  last (the last is sampled, never fed back), plus whole blocks of the new
  prompt whose tokens (from position 0) other agents computed already and
  that it linked instead of computing (agentkv.shared counts the positions
  linked this turn: content-addressed, so the same tokens, and the same
  bits, since a token's KV does not depend on the batch). So turn k's
  usage.prompt_tokens_details.cached_tokens must lie between P and P +
  agentkv.shared, where P is prompt_tokens + completion_tokens - 1 of turn
  k-1 (0 for turn 0: a new agent has nothing of its own), and GET
  /v1/agents/{id} must report prompt + completion - 1 tokens after each turn.
A later turn that reused another agent's history, or a restore that brought
back another agent's file, changes an answer or a count.

Also checked: evictions happened (/metrics), some later turns came back warm
(restored from disk) and some hot (blocks still in RAM among the others'),
else the test proved nothing about that path.
Bounded: every request has a timeout, the whole run a deadline; both servers
are killed on every exit path. Exits 0 when every check passed.
"""
import concurrent.futures
import json
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
import urllib.error
import urllib.request

AGENTS = 64
TURNS = 3                 # before the restart; one more after it
MAX_TOKENS = 8
DEADLINE_S = 240          # below test_server.c's limit, so this script reports first
REQUEST_TIMEOUT_S = 120
FLAGS = ["-t", "2", "-c", "256", "-ctk", "q8", "-ctv", "q8", "--kv-block", "16"]
CROWD_FLAGS = ["--kv-budget", "2000K", "--max-agents", "16"]
WORDS = ["apple", "river", "candle", "forest", "yellow", "pencil", "garden", "window"]
ASKS = ["What is my secret? Say it.", "Say the secret number again."]

START = time.time()
servers = []                  # every server started; killed on exit


def fail_exit(msg):
    print("FAIL " + msg)
    sys.exit(1)


def kill_all():
    """SIGTERM every server still running, SIGKILL after 10 s."""
    for p in servers:
        if p.poll() is None:
            p.terminate()
    for p in servers:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_server(bin_, model, mem, extra):
    """Starts `agentkv serve` on a free port; returns (process, base URL, log
    lines). Exits the script if it does not print its port within 60 s."""
    p = subprocess.Popen([bin_, "serve", "-m", model, "--port", "0", "--memory-dir", mem] + FLAGS + extra,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    servers.append(p)
    lines, ports = [], queue.Queue()

    def drain():
        for line in p.stderr:
            lines.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                ports.put(int(m.group(1)))
        ports.put(None)
    threading.Thread(target=drain, daemon=True).start()
    try:
        port = ports.get(timeout=60)
    except queue.Empty:
        port = None
    if not port:
        fail_exit("server did not start:\n" + "".join(lines))
    return p, "http://127.0.0.1:%d" % port, lines


def call(url, path, body=None, agent=None):
    """One request; returns (status, parsed JSON or None)."""
    headers = {"Content-Type": "application/json"}
    if agent:
        headers["X-Agent-Id"] = agent
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, None


def chat_body(messages):
    return {"model": "stories260K", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}


def secret_of(i):
    return "My secret is the word %s and the number %d. Keep it." % (WORDS[i % len(WORDS)], 1000 + (i * 7919) % 9000)


def main():
    bin_, shared = sys.argv[1], sys.argv[2]
    model = os.path.join(shared, "models", "stories260K.gguf")
    work = tempfile.mkdtemp(prefix="agentkv-isolation-")
    signal.signal(signal.SIGTERM, lambda *_: fail_exit("terminated"))
    failures = []
    try:
        crowd, crowd_url, crowd_log = start_server(bin_, model, os.path.join(work, "crowd"), CROWD_FLAGS)
        ref, ref_url, ref_log = start_server(bin_, model, os.path.join(work, "ref"), ["--max-agents", "16"])

        # the crowd: 64 agents at once, each its turns in order
        history = {}      # agent -> list of (messages sent, response, agent tokens after)

        def agent_run(i, url, first, last, msgs):
            aid = "secret-%02d" % i
            turns = []
            for k in range(first, last):
                if time.time() - START > DEADLINE_S:
                    raise RuntimeError("deadline")
                st, r = call(url, "/v1/chat/completions", chat_body(msgs), aid)
                if st != 200:
                    raise RuntimeError("%s turn %d: status %d %s" % (aid, k, st, r))
                gst, g = call(url, "/v1/agents/" + aid)
                turns.append((list(msgs), r, g.get("tokens") if gst == 200 and g else None))
                answer = r["choices"][0]["message"]["content"]
                msgs = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": ASKS[k % len(ASKS)]}]
            return aid, turns, msgs

        def crowd_turns(url, first, last, log):
            """Every agent's turns first..last-1, all agents at once."""
            with concurrent.futures.ThreadPoolExecutor(AGENTS) as ex:
                futs = []
                for i in range(AGENTS):
                    aid = "secret-%02d" % i
                    msgs = pending.get(aid) or [{"role": "user", "content": secret_of(i)}]
                    futs.append(ex.submit(agent_run, i, url, first, last, msgs))
                for fut in futs:
                    try:
                        aid, turns, msgs = fut.result(timeout=max(1, DEADLINE_S - (time.time() - START)))
                        history.setdefault(aid, []).extend(turns)
                        pending[aid] = msgs
                    except Exception as e:  # noqa: BLE001 - every error is a failure here
                        failures.append("crowd: %r" % e)
            if failures:
                print("\n".join("FAIL " + f for f in failures[:10]))
                print("".join(log[-30:]))
            return not failures

        pending = {}      # agent -> the messages of its next turn
        if not crowd_turns(crowd_url, 0, TURNS, crowd_log):
            return 1
        with urllib.request.urlopen(crowd_url + "/metrics", timeout=REQUEST_TIMEOUT_S) as r:
            metrics = r.read().decode()
        crowd.terminate()
        try:
            code = crowd.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = "none (still running after 60 s)"
        if code != 0:
            fail_exit("the crowd's server after SIGTERM: exit status %s, want 0:\n%s" % (code, "".join(crowd_log[-20:])))
        crowd, crowd_url, crowd_log = start_server(bin_, model, os.path.join(work, "crowd"), CROWD_FLAGS)
        if not crowd_turns(crowd_url, TURNS, TURNS + 1, crowd_log):
            return 1
        crowd_done = time.time() - START

        # the references: every conversation again, anonymous, on the other server
        jobs = [(aid, k, msgs) for aid, turns in history.items() for k, (msgs, _, _) in enumerate(turns)]

        def ref_run(job):
            aid, k, msgs = job
            st, r = call(ref_url, "/v1/chat/completions", chat_body(msgs))
            if st != 200:
                raise RuntimeError("reference %s turn %d: status %d %s" % (aid, k, st, r))
            return job, r
        refs = {}
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            for fut in [ex.submit(ref_run, j) for j in jobs]:
                try:
                    (aid, k, _), r = fut.result(timeout=max(1, DEADLINE_S - (time.time() - START)))
                    refs[(aid, k)] = r
                except Exception as e:  # noqa: BLE001
                    failures.append("reference: %r" % e)

        tiers, checked = {}, 0
        for aid, turns in sorted(history.items()):
            prev = None
            for k, (msgs, r, tokens_after) in enumerate(turns):
                ref_r = refs.get((aid, k))
                if ref_r is None:
                    continue
                u, ru = r["usage"], ref_r["usage"]
                ans, ref_ans = r["choices"][0]["message"]["content"], ref_r["choices"][0]["message"]["content"]
                tier = r["agentkv"]["tier"]
                if 0 < k < TURNS:
                    tiers[tier] = tiers.get(tier, 0) + 1
                where = "%s turn %d (%s)" % (aid, k, tier)
                if k == TURNS and tier != "warm":
                    failures.append("%s: after the restart, tier %s, want warm" % (where, tier))
                if ans != ref_ans:
                    failures.append("%s: answer %r, alone on a fresh server %r" % (where, ans, ref_ans))
                if (u["prompt_tokens"], u["completion_tokens"]) != (ru["prompt_tokens"], ru["completion_tokens"]):
                    failures.append("%s: prompt/completion tokens %d/%d, reference %d/%d" % (
                        where, u["prompt_tokens"], u["completion_tokens"], ru["prompt_tokens"], ru["completion_tokens"]))
                want_cached = 0 if prev is None else prev["prompt_tokens"] + prev["completion_tokens"] - 1
                cached = u.get("prompt_tokens_details", {}).get("cached_tokens")
                shared = r["agentkv"].get("shared")
                if not isinstance(cached, int) or not isinstance(shared, int) or \
                        not want_cached <= cached <= want_cached + shared:
                    failures.append("%s: cached_tokens %s (%s linked from others' blocks), its own previous turn "
                                    "computed %d" % (where, cached, shared, want_cached))
                want_tokens = u["prompt_tokens"] + u["completion_tokens"] - 1
                if tokens_after != want_tokens:
                    failures.append("%s: GET /v1/agents says %s tokens, this turn computed %d" % (
                        where, tokens_after, want_tokens))
                prev = u
                checked += 1
        m = re.search(r"^agentkv_evictions_total(?:\{[^}]*\})? (\d+)", metrics, re.M)
        evictions = int(m.group(1)) if m else 0
        if checked != AGENTS * (TURNS + 1):
            failures.append("only %d of %d turns checked" % (checked, AGENTS * (TURNS + 1)))
        if evictions == 0 or tiers.get("warm", 0) == 0 or tiers.get("hot", 0) == 0:
            failures.append("later turns did not take both paths, hot and warm (evictions %d, by tier %s): "
                            "adjust the KV budget" % (evictions, tiers))
        print("isolation: %d agents x %d turns + 1 after a restart, crowd %.1f s, total %.1f s; later turns before the "
              "restart by tier %s; evictions %d" % (AGENTS, TURNS, crowd_done, time.time() - START,
                                                    json.dumps(tiers, sort_keys=True), evictions))
        for f in failures[:20]:
            print("FAIL " + f)
        if len(failures) > 20:
            print("... %d failures in all" % len(failures))
        if failures:
            print("crowd server log tail:\n" + "".join(crowd_log[-20:]))
        return 1 if failures else 0
    finally:
        kill_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
