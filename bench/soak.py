#!/usr/bin/env python3
"""soak.py - drives `agentkv serve` for a given time under mixed traffic and
fails on what a long-running server must never do. Python standard library
only. `make soak SOAK_SECONDS=N` builds the binary and runs it.

    python3 bench/soak.py --bin build/agentkv --model ../shared/models/stories260K.gguf \
        --seconds 60 --out build/soak

The server is started here: 127.0.0.1, a free port, a fresh memory directory,
a small KV budget (agents are evicted to disk and restored all the time).
32 agents, one client thread each, send back-to-back requests with short
pauses, drawn at random (seeded) from:
  chat turns, not streamed (the conversation grows; when it nears the context
    it starts over with another opening, which the server sees as diverging)
  chat turns streamed (SSE read to [DONE])
  streams the client abandons after the first event, and non-streamed
    requests it abandons before the answer (the server must cancel them)
  /v1/completions with the agent id
  malformed requests: bad JSON, wrong types, huge numbers (1e300), unknown
    model, invalid agent id, a body over --max-body, GET and DELETE of an
    agent that does not exist
  DELETE of the agent itself (its next turn starts cold)
Halfway, the server gets SIGTERM while traffic runs (running requests end,
queued ones get 503) and must exit 0; it is restarted on the same memory
directory and the agents come back from disk (tier warm).

Each of the two server runs has a warm-up (WARMUP_FRACTION of the run, at
least 5 s); after it, and again at the run's end, traffic pauses until no
request is in flight and the server's RSS (VmRSS, /proc/PID/status) and open
descriptors (/proc/PID/fd) are read. RSS and descriptors are also sampled
every second under traffic.

It fails (exit 1) on:
  - a 5xx other than 503 (503 is documented: a request queued at shutdown,
    or a body over the server's --max-buffered total, with Retry-After);
  - a request the server did not answer (timeout, connection refused or
    reset) outside the SIGTERM/restart window;
  - the server exiting other than by the planned SIGTERM, or exiting non-zero
    after it;
  - RSS growth: idle RSS at the run's end above idle RSS after warm-up by
    more than RSS_MARGIN_MIB or RSS_MARGIN_FRACTION of it, whichever is
    larger;
  - a leaked descriptor: idle descriptors at the run's end above those after
    warm-up (after waiting up to FD_SETTLE_S for connections to close);
  - no request served warm after the restart.

Prints requests by outcome, p50/p99 TTFT (the server's agentkv.ttft_ms of
each answered turn) per tier over time windows, RSS and descriptors over
time, then "soak: PASS" or "soak: FAIL" with the reasons; writes summary.json,
the server logs and soak.svg (TTFT and RSS over time) under --out and prints
the SVG's path. Every loop is bounded in count and time; the server is killed
on every exit path (and dies with this process: PR_SET_PDEATHSIG).
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
import threading
import time

AGENTS = 32
RSS_MARGIN_MIB = 8.0
RSS_MARGIN_FRACTION = 0.10
WARMUP_FRACTION = 0.15
FD_SETTLE_S = 10.0
DRAIN_S = 10.0                    # how long the server may take to finish/cancel what clients left
REQUEST_TIMEOUT_S = 60.0
MAX_REQUESTS = 2_000_000          # a bound on the whole run, far above what it reaches
SERVER_FLAGS = ["-t", "2", "-c", "512", "--kv-budget", "1536K", "--kv-block", "16", "-ctk", "q8", "-ctv", "q8",
                "--max-agents", "8", "--max-body", "65536"]
OPENINGS = [
    "You are a storyteller. Tell a story about a cat.",
    "You are a planner. Plan a day at the sea.",
    "You are a teacher. Explain why the sky is blue.",
    "You are a gardener. Say what to plant in spring.",
]
ASKS = ["Go on.", "What happens next?", "Tell me more about it.", "And then?", "Make it shorter."]


def now():
    return time.monotonic()


class Server:
    """One `agentkv serve` process, its log file and its URL."""

    def __init__(self, args, mem, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        libc = ctypes.CDLL(None, use_errno=True)

        def die_with_parent():
            libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: no server outlives the soak
        self.p = subprocess.Popen([args.bin, "serve", "-m", args.model, "--port", "0", "--memory-dir", mem]
                                  + SERVER_FLAGS + args.server_arg,
                                  stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                  preexec_fn=die_with_parent)
        self.pid = self.p.pid
        self.port = None
        deadline = now() + 60
        while now() < deadline and self.p.poll() is None:
            with open(log_path) as f:
                m = re.search(r"on http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.1)
        if not self.port:
            self.kill()
            raise RuntimeError("the server did not start; its log: " + log_path)

    def rss_mib(self):
        try:
            with open("/proc/%d/status" % self.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            return None
        return None

    def fds(self):
        try:
            return len(os.listdir("/proc/%d/fd" % self.pid))
        except OSError:
            return None

    def term(self, timeout):
        """SIGTERM; returns the exit code, or None if it had to be killed."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.log.close()


class Soak:
    def __init__(self, args):
        self.args = args
        self.t0 = now()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.running = threading.Event()      # clients may send
        self.running.set()
        self.in_flight = 0
        self.n_requests = 0
        self.outcomes = {}                      # "kind status" -> count
        self.ttft = []                          # (t, tier, ms)
        self.samples = []                       # (t, server run, rss MiB, fds)
        self.failures = {}                      # kind of failure -> [count, first message]
        self.server = None
        self.run_no = 0
        self.restart_window = False             # SIGTERM sent, new server not up yet
        self.planned_exit = False
        self.idle = {}                          # (run, "warm"|"end") -> (rss, fds)
        self.warm_after_restart = 0
        self.t_restart = None

    # ------------------------------------------------------------ bookkeeping
    def t(self):
        return now() - self.t0

    def count(self, kind, status):
        with self.lock:
            key = "%s %s" % (kind, status)
            self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def fail(self, msg, kind=None):
        """Records a failure; repeats of one kind (default: the message) are
        counted, the first kept."""
        with self.lock:
            f = self.failures.setdefault(kind or msg, [0, "%.1fs %s" % (self.t(), msg)])
            f[0] += 1

    # -------------------------------------------------------------- requests
    def request(self, kind, method, path, body=None, agent=None, raw=None, abandon=None):
        """One HTTP request. body: JSON-able, or raw bytes. abandon: None,
        "stream" (close after the first event) or "wait" (close before the
        answer). Returns (status, parsed JSON or None, SSE events or None)."""
        self.running.wait(timeout=REQUEST_TIMEOUT_S)
        with self.lock:
            if self.n_requests >= MAX_REQUESTS:
                self.stop.set()
                return None, None, None
            self.n_requests += 1
            self.in_flight += 1
            port, in_restart = self.server.port, self.restart_window
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            headers = {"Content-Type": "application/json"}
            if agent:
                headers["X-Agent-Id"] = agent
            conn.request(method, path, body=data, headers=headers)
            if abandon == "wait":
                time.sleep(random.uniform(0.001, 0.03))
                conn.sock.shutdown(socket.SHUT_RDWR)
                self.count(kind, "disconnected")
                return None, None, None
            r = conn.getresponse()
            status = r.status
            if abandon == "stream" and status == 200:
                r.fp.readline()
                conn.sock.shutdown(socket.SHUT_RDWR)
                self.count(kind, "disconnected")
                return None, None, None
            payload = r.read()
            self.count(kind, status)
            if status >= 500 and status != 503:
                self.fail("%s %s -> %d: %s" % (method, path, status, payload[:200]), "status %d" % status)
            if r.getheader("Content-Type", "").startswith("text/event-stream"):
                events = [json.loads(line[6:]) for line in payload.decode().splitlines()
                          if line.startswith("data: {")]
                return status, None, events
            try:
                return status, json.loads(payload), None
            except ValueError:
                return status, None, None
        except (OSError, http.client.HTTPException) as e:
            with self.lock:
                restarting = in_restart or self.restart_window or port != self.server.port
            if restarting:
                self.count(kind, "cut by the restart")
            else:
                self.count(kind, "no answer")
                self.fail("%s %s: no answer (%s: %s)" % (method, path, type(e).__name__, e), "no answer")
            return None, None, None
        finally:
            conn.close()
            with self.lock:
                self.in_flight -= 1

    def note_ttft(self, agentkv):
        if agentkv and "tier" in agentkv and "ttft_ms" in agentkv:
            with self.lock:
                self.ttft.append((self.t(), agentkv["tier"], float(agentkv["ttft_ms"])))
                if self.run_no == 2 and agentkv["tier"] == "warm":
                    self.warm_after_restart += 1

    # --------------------------------------------------------------- clients
    def client(self, i):
        rng = random.Random(self.args.seed * 1000 + i)
        aid = "soak-%02d" % i
        msgs = [{"role": "system", "content": OPENINGS[i % len(OPENINGS)]},
                {"role": "user", "content": ASKS[0]}]
        last_prompt = 0
        model = self.args.model_id
        while not self.stop.is_set():
            x = rng.random()
            if x < 0.45 or x >= 0.97:
                stream = x >= 0.97 or rng.random() < 0.3
                body = {"model": model, "messages": msgs, "max_tokens": rng.choice([8, 16, 32]),
                        "temperature": rng.choice([0, 0.8])}
                if stream:
                    body.update(stream=True, stream_options={"include_usage": True})
                st, j, ev = self.request("chat-stream" if stream else "chat", "POST", "/v1/chat/completions",
                                         body, agent=aid)
                text = None
                if st == 200 and j:
                    text = j["choices"][0]["message"]["content"]
                    self.note_ttft(j.get("agentkv"))
                    last_prompt = j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"]
                elif st == 200 and ev:
                    text = "".join(c.get("delta", {}).get("content", "") for e in ev for c in e.get("choices", []))
                    for e in ev:
                        if e.get("usage"):
                            self.note_ttft(e.get("agentkv"))
                            last_prompt = e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
                if text is not None:
                    msgs = msgs + [{"role": "assistant", "content": text},
                                   {"role": "user", "content": rng.choice(ASKS)}]
                if last_prompt > 380 or st == 400:
                    msgs = [{"role": "system", "content": rng.choice(OPENINGS)}, {"role": "user", "content": ASKS[0]}]
                    last_prompt = 0
            elif x < 0.55:
                body = {"model": model, "messages": msgs, "max_tokens": 96, "temperature": 0.8}
                if rng.random() < 0.5:
                    body.update(stream=True)
                    self.request("abandoned stream", "POST", "/v1/chat/completions", body, agent=aid, abandon="stream")
                else:
                    self.request("abandoned", "POST", "/v1/chat/completions", body, agent=aid, abandon="wait")
            elif x < 0.65:
                st, j, _ = self.request("completions", "POST", "/v1/completions",
                                        {"model": model, "prompt": "Once upon a time " * rng.randint(1, 8),
                                         "max_tokens": 16, "temperature": 0}, agent="soak-c%02d" % i)
                if st == 200 and j:
                    self.note_ttft(j.get("agentkv"))
            elif x < 0.90:
                self.malformed(rng, aid)
            elif x < 0.93:
                st, _, _ = self.request("delete", "DELETE", "/v1/agents/" + aid)
                if st == 200:
                    msgs = [{"role": "system", "content": rng.choice(OPENINGS)}, {"role": "user", "content": ASKS[0]}]
                    last_prompt = 0
            else:
                self.request("list", "GET", "/v1/agents")
            # a think time, bounded by the run's stop: the first 8 agents are
            # busy (their caches tend to stay in RAM), the others slower
            self.stop.wait(rng.uniform(0, 0.05 if i < 8 else 0.4))

    def malformed(self, rng, aid):
        model = self.args.model_id
        msg = [{"role": "user", "content": "hi"}]
        k = rng.randrange(11)
        if k == 0:
            self.request("bad json", "POST", "/v1/chat/completions", raw=b'{"model": "x", "messages": [}', agent=aid)
        elif k == 1:
            self.request("wrong type", "POST", "/v1/chat/completions",
                         {"model": model, "messages": msg, "max_tokens": "many"}, agent=aid)
        elif k == 2:
            self.request("wrong type", "POST", "/v1/chat/completions", {"model": model, "messages": "hi"}, agent=aid)
        elif k == 3:
            self.request("huge number", "POST", "/v1/chat/completions",
                         {"model": model, "messages": msg, "max_tokens": 1e300}, agent=aid)
        elif k == 4:
            self.request("huge number", "POST", "/v1/completions",
                         {"model": model, "prompt": "a", "max_tokens": 4, "seed": -1e300, "temperature": 1e300})
        elif k == 5:
            self.request("unknown model", "POST", "/v1/chat/completions", {"model": "gpt-17", "messages": msg})
        elif k == 6:
            self.request("invalid agent id", "POST", "/v1/chat/completions", {"model": model, "messages": msg},
                         agent="../etc/passwd")
        elif k == 7:
            self.request("body too big", "POST", "/v1/chat/completions",
                         {"model": model, "messages": [{"role": "user", "content": "x" * 70000}]})
        elif k == 8:
            self.request("unknown agent", "GET", "/v1/agents/nobody-%d" % rng.randrange(1000))
        elif k == 9:
            self.request("unknown agent", "DELETE", "/v1/agents/nobody-%d" % rng.randrange(1000))
        else:
            self.request("bad json", "POST", "/v1/completions", raw=b"\xff\xfe not json at all", agent=aid)

    # --------------------------------------------------------------- monitor
    def monitor(self):
        """Samples RSS and descriptors every second; notices a server that
        exits on its own."""
        while not self.stop.is_set():
            with self.lock:
                srv, run = self.server, self.run_no
            if srv.p.poll() is not None and not self.planned_exit:
                self.fail("the server (pid %d) exited by itself with status %s" % (srv.pid, srv.p.returncode))
                self.stop.set()
                self.running.set()
                return
            rss, fds = srv.rss_mib(), srv.fds()
            if rss is not None and fds is not None:
                with self.lock:
                    self.samples.append((self.t(), run, rss, fds))
            self.stop.wait(1.0)

    def quiet_sample(self, label):
        """Pauses the clients until nothing is in flight, then reads idle RSS
        and descriptors (waiting up to FD_SETTLE_S for descriptors to settle
        at their lowest). Returns (rss MiB, fds)."""
        self.running.clear()
        deadline = now() + REQUEST_TIMEOUT_S + 5
        while now() < deadline:
            with self.lock:
                if self.in_flight == 0:
                    break
            time.sleep(0.05)
        srv = self.server
        # nothing may keep running for a client that is gone
        t_drain, left = now(), None
        while now() < t_drain + DRAIN_S:
            left = metric_values(srv.port, ("agentkv_requests_active", "agentkv_requests_queued"))
            if left is not None and sum(left) == 0:
                break
            time.sleep(0.1)
        if left is None or sum(left) != 0:
            self.fail("server run %d, %s: %s requests still running/queued %.0f s after the last client left" % (
                self.run_no, label, left, DRAIN_S))
        fails = metric_values(srv.port, ("agentkv_store_save_failures_total",))
        if fails and fails[0] > 0:
            self.fail("server run %d: %d failed saves" % (self.run_no, fails[0]), "failed saves")
        fds, best = None, None
        settle = now() + FD_SETTLE_S
        while now() < settle:
            fds = srv.fds()
            if best is None or (fds is not None and fds < best):
                best = fds
            if label == "warm" and fds is not None and now() > settle - FD_SETTLE_S + 1.0:
                break
            if label == "end" and fds is not None and fds <= self.idle.get((self.run_no, "warm"), (0, 0))[1]:
                break
            time.sleep(0.2)
        rss = srv.rss_mib()
        self.idle[(self.run_no, label)] = (rss, best)
        print("soak: %6.1fs  server run %d %-4s idle: RSS %.1f MiB, %s descriptors" % (
            self.t(), self.run_no, label, rss or -1, best), flush=True)
        self.running.set()
        return rss, best

    # ------------------------------------------------------------------ main
    def run(self):
        args = self.args
        mem = os.path.join(self.work, "memory")
        half = args.seconds / 2.0
        self.server = Server(args, mem, os.path.join(args.out, "server-1.log"))
        self.run_no = 1
        print("soak: server 1 (pid %d) on 127.0.0.1:%d, %d agents, %.0f s, memory %s" % (
            self.server.pid, self.server.port, AGENTS, args.seconds, mem), flush=True)
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(AGENTS)]
        mon = threading.Thread(target=self.monitor, daemon=True)
        mon.start()
        for th in threads:
            th.start()

        def phase(run_start, run_end):
            warm = run_start + max(5.0, (run_end - run_start) * WARMUP_FRACTION)
            self.stop.wait(max(0.0, warm - self.t()))
            if self.stop.is_set():
                return False
            self.quiet_sample("warm")
            self.stop.wait(max(0.0, run_end - 2.0 - self.t()))
            if self.stop.is_set():
                return False
            self.quiet_sample("end")
            return True

        ok = phase(0.0, half)
        if ok:
            # SIGTERM under traffic: resume the clients for a moment first
            self.stop.wait(1.0)
            with self.lock:
                self.planned_exit = True
                self.restart_window = True
            old = self.server
            self.t_restart = self.t()
            code = old.term(timeout=60)
            if code != 0:
                self.fail("server 1 after SIGTERM: exit status %s (want 0); its log: %s" % (code, old.log_path))
            old.kill()
            new = Server(args, mem, os.path.join(args.out, "server-2.log"))
            with self.lock:
                self.server, self.run_no = new, 2
                self.planned_exit = False
                self.restart_window = False
            print("soak: %6.1fs  SIGTERM -> exit %s; server 2 (pid %d) on 127.0.0.1:%d, same memory" % (
                self.t(), code, new.pid, new.port), flush=True)
            ok = phase(self.t(), args.seconds)
        self.stop.set()
        self.running.set()
        for th in threads:
            th.join(timeout=REQUEST_TIMEOUT_S + 5)
        mon.join(timeout=5)
        if ok:
            with self.lock:
                self.planned_exit = True
            code = self.server.term(timeout=60)
            if code != 0:
                self.fail("server 2 after SIGTERM: exit status %s (want 0)" % code)
        self.server.kill()
        self.check_growth()
        if ok and self.warm_after_restart == 0:
            self.fail("no request was served warm after the restart (agents did not come back from disk)")

    def check_growth(self):
        for run in (1, 2):
            w, e = self.idle.get((run, "warm")), self.idle.get((run, "end"))
            if not w or not e or None in w or None in e:
                continue
            margin = max(RSS_MARGIN_MIB, RSS_MARGIN_FRACTION * w[0])
            if e[0] > w[0] + margin:
                self.fail("server run %d: idle RSS grew from %.1f MiB after warm-up to %.1f MiB at the end "
                          "(margin %.1f MiB)" % (run, w[0], e[0], margin))
            if e[1] > w[1]:
                self.fail("server run %d: %d open descriptors after warm-up, %d at the end (leak)" % (run, w[1], e[1]))

    # ---------------------------------------------------------------- report
    def report(self):
        args = self.args
        print("soak: requests by outcome (%d in all)" % sum(self.outcomes.values()))
        for k in sorted(self.outcomes):
            print("  %-32s %7d" % (k, self.outcomes[k]))
        win = max(10.0, args.seconds / 12.0)
        n_win = max(1, int(-(-args.seconds // win)))
        last = n_win * win   # what ran past the planned end (the final drain) joins the last window
        rows = []
        print("soak: TTFT (ms, server-measured) p50/p99 per tier, RSS and descriptors, per %.0f s window" % win)
        print("  %-11s %-22s %-22s %-22s %-10s %-5s" % ("window", "hot n p50/p99", "warm n p50/p99",
                                                         "cold n p50/p99", "RSS MiB", "fds"))
        for w in range(n_win):
            a, b = w * win, ((w + 1) * win if w < n_win - 1 else float("inf"))
            cells, row = [], {"from_s": a, "to_s": b}
            for tier in ("hot", "warm", "cold"):
                v = sorted(ms for t, ti, ms in self.ttft if a <= t < b and ti == tier)
                if v:
                    p50, p99 = pct(v, 50), pct(v, 99)
                    cells.append("%5d %6.1f/%-8.1f" % (len(v), p50, p99))
                    row[tier] = {"n": len(v), "p50_ms": p50, "p99_ms": p99}
                else:
                    cells.append("%5d %-15s" % (0, "-"))
            s = [x for x in self.samples if a <= x[0] < b]
            if not s and not any(k in row for k in ("hot", "warm", "cold")):
                continue
            rss = max(x[2] for x in s) if s else None
            fds = max(x[3] for x in s) if s else None
            row.update(rss_max_mib=rss, fds_max=fds)
            rows.append(row)
            row["to_s"] = min(b, last)
            print("  %4.0f-%-5.0fs %s %-10s %-5s" % (a, min(b, last), " ".join(cells),
                                                     "%.1f" % rss if rss else "-", fds if fds else "-"))
        allv = {}
        for tier in ("hot", "warm", "cold"):
            v = sorted(ms for _, ti, ms in self.ttft if ti == tier)
            if v:
                allv[tier] = {"n": len(v), "p50_ms": pct(v, 50), "p99_ms": pct(v, 99)}
        print("soak: TTFT over the whole run: " + ", ".join(
            "%s n=%d p50 %.1f ms p99 %.1f ms" % (k, x["n"], x["p50_ms"], x["p99_ms"]) for k, x in allv.items()))
        for run in (1, 2):
            w, e = self.idle.get((run, "warm")), self.idle.get((run, "end"))
            if w and e:
                print("soak: server run %d idle after warm-up: RSS %.1f MiB, %s fds; at the end: RSS %.1f MiB, %s fds"
                      % (run, w[0], w[1], e[0], e[1]))
        print("soak: served warm after the restart: %d" % self.warm_after_restart)
        svg = os.path.join(args.out, "soak.svg")
        write_svg(svg, self.ttft, self.samples, max(args.seconds, self.t()), self.t_restart)
        summary = {"seconds": args.seconds, "agents": AGENTS, "seed": args.seed, "server_flags": SERVER_FLAGS +
                   args.server_arg, "outcomes": self.outcomes, "ttft_all": allv, "windows": rows,
                   "idle": {"%d %s" % k: v for k, v in self.idle.items()},
                   "warm_after_restart": self.warm_after_restart,
                   "rss_margin": "max(%.0f MiB, %.0f%%)" % (RSS_MARGIN_MIB, RSS_MARGIN_FRACTION * 100),
                   "failures": [{"count": n, "first": m} for n, m in self.failures.values()]}
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print("soak: plot %s" % os.path.abspath(svg))
        print("soak: summary %s" % os.path.abspath(os.path.join(args.out, "summary.json")))
        for n, m in sorted(self.failures.values(), key=lambda f: float(f[1].split("s", 1)[0]))[:30]:
            print("soak: FAIL %s%s" % (m, " (and %d more like it)" % (n - 1) if n > 1 else ""))
        print("soak: %s (%.0f s, %d requests)" % ("FAIL" if self.failures else "PASS", self.t(),
                                                 sum(self.outcomes.values())), flush=True)
        return 1 if self.failures else 0


def metric_values(port, names):
    """The values of the named unlabelled metrics in /metrics (a tuple), or
    None when the server does not answer or lacks one."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    out = []
    for n in names:
        m = re.search(r"^%s (\S+)$" % re.escape(n), text, re.M)
        if not m:
            return None
        out.append(float(m.group(1)))
    return tuple(out)


def pct(sorted_v, p):
    """Nearest-rank percentile of a sorted, non-empty list."""
    k = max(0, min(len(sorted_v) - 1, int(-(-p * len(sorted_v) // 100)) - 1))
    return sorted_v[k]


SVG_MAX_DOTS = 2500


def write_svg(path, ttft, samples, seconds, t_restart):
    """Two panels over time: TTFT (log scale) of answered turns, as dots by
    tier (every k-th turn when there are more than SVG_MAX_DOTS) and p99 lines
    by tier over short windows; RSS (line, left axis) with descriptors (line,
    right axis)."""
    W, H, L, R, T = 900, 560, 70, 70, 30
    ph = 200
    top2 = T + ph + 70
    x_of = lambda t: L + (W - L - R) * min(max(t / max(seconds, 1e-9), 0), 1)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<rect width="100%" height="100%" fill="white"/>']
    colors = {"hot": "#d62728", "warm": "#ff7f0e", "cold": "#1f77b4"}
    # panel 1: TTFT, log10 ms
    vals = [ms for _, _, ms in ttft if ms > 0]
    lo = min(vals) if vals else 0.1
    hi = max(vals) if vals else 1000
    llo, lhi = math.floor(math.log10(max(lo, 1e-3))), math.ceil(math.log10(max(hi, 1e-3)))
    if lhi <= llo:
        lhi = llo + 1
    y1 = lambda ms: T + ph - ph * (math.log10(max(ms, 10 ** llo)) - llo) / (lhi - llo)
    out.append('<text x="%d" y="%d" font-size="13">TTFT of answered turns (ms, log scale; lines: p99 per %.0f s)'
               '</text>' % (L, T - 10, max(2.0, seconds / 90.0)))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, T, W - L - R, ph))
    for e in range(llo, lhi + 1):
        y = y1(10 ** e)
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (L, y, W - R, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 5, y + 4, 10 ** e))
    order = {"warm": 0, "cold": 1, "hot": 2}   # the rarer tiers drawn on top
    stride = max(1, -(-len(ttft) // SVG_MAX_DOTS))
    for t, tier, ms in sorted(ttft[::stride], key=lambda x: order.get(x[1], 3)):
        if ms > 0:
            out.append('<circle cx="%.1f" cy="%.1f" r="1.3" fill="%s" fill-opacity="0.4"/>' % (
                x_of(t), y1(ms), colors.get(tier, "#000")))
    win = max(2.0, seconds / 90.0)
    buckets = {}
    for t, ti, ms in ttft:
        if ms > 0:
            buckets.setdefault((ti, int(t // win)), []).append(ms)
    for tier, c in colors.items():
        pts = []
        for w in range(int(-(-seconds // win))):
            v = sorted(buckets.get((tier, w), ()))
            if len(v) >= 5:
                pts.append("%.1f,%.1f" % (x_of((w + 0.5) * win), y1(pct(v, 99))))
        if len(pts) > 1:
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.2" points="%s"/>' % (c, " ".join(pts)))
    for k, (tier, c) in enumerate(colors.items()):
        out.append('<circle cx="%d" cy="%d" r="4" fill="%s"/><text x="%d" y="%d">%s</text>' % (
            W - R - 150 + 55 * k, T - 14, c, W - R - 143 + 55 * k, T - 10, tier))
    # panel 2: RSS and descriptors
    out.append('<text x="%d" y="%d" font-size="13">server RSS (MiB, left, blue) and open descriptors (right, grey)'
               '</text>' % (L, top2 - 10))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, top2, W - L - R, ph))
    if samples:
        rmax = max(s[2] for s in samples) * 1.1
        fmax = max(s[3] for s in samples) * 1.1 + 1
        yr = lambda v: top2 + ph - ph * v / rmax
        yf = lambda v: top2 + ph - ph * v / fmax
        for k in range(5):
            v = rmax * k / 4
            out.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (L - 5, yr(v) + 4, v))
            out.append('<text x="%d" y="%.1f">%.0f</text>' % (W - R + 5, yf(fmax * k / 4) + 4, fmax * k / 4))
        for run in (1, 2):
            pts = [s for s in samples if s[1] == run]
            if pts:
                out.append('<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/>' % " ".join(
                    "%.1f,%.1f" % (x_of(s[0]), yr(s[2])) for s in pts))
                out.append('<polyline fill="none" stroke="#999" stroke-width="1" points="%s"/>' % " ".join(
                    "%.1f,%.1f" % (x_of(s[0]), yf(s[3])) for s in pts))
    # time axis under both panels, and the restart
    for top in (T, top2):
        for k in range(7):
            t = seconds * k / 6
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%.0f s</text>' % (x_of(t), top + ph + 14, t))
    if t_restart is not None:
        for top in (T, top2):
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#2ca02c" stroke-dasharray="4,3"/>' % (
                x_of(t_restart), top, x_of(t_restart), top + ph))
        out.append('<text x="%.1f" y="%d" fill="#2ca02c">SIGTERM + restart</text>' % (x_of(t_restart) + 4, top2 + 12))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/agentkv")
    ap.add_argument("--model", default="../shared/models/stories260K.gguf")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--out", default="build/soak", help="directory for the plot, summary and server logs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--server-arg", action="append", default=[], help="one more flag for agentkv serve (repeat)")
    args = ap.parse_args()
    if args.seconds < 20:
        ap.error("--seconds: at least 20 (two server runs, each with a warm-up)")
    args.model_id = os.path.basename(args.model)[:-5] if args.model.endswith(".gguf") else os.path.basename(args.model)
    os.makedirs(args.out, exist_ok=True)
    soak = Soak(args)
    soak.work = tempfile.mkdtemp(prefix="agentkv-soak-")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    rc = 1
    try:
        soak.run()
        rc = soak.report()
    except KeyboardInterrupt as e:
        print("soak: interrupted (%s)" % e)
    except RuntimeError as e:
        print("soak: FAIL %s" % e)
    finally:
        soak.stop.set()
        soak.running.set()
        if soak.server:
            soak.server.kill()
        shutil.rmtree(soak.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
