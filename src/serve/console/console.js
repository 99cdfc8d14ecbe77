// console.js - the console's behaviour (console.html). It reads the public
// API only: GET /v1/models, /v1/agents, /v1/pools, /v1/memories and
// /metrics (polled every POLL_MS), DELETE /v1/agents/{id}, and streamed
// POST /v1/chat/completions. Everything it shows that came from the server
// or from a client (ids, text, error messages) goes into the page as text
// (textContent, text nodes), never as markup. When the server wants an API
// key the page asks for it, keeps it in this tab's sessionStorage and sends
// it to this server only; on a 401 it forgets it and clears every view.
"use strict";

(() => {
  const POLL_MS = 2000;
  const WINDOW_S = 60;    // TTFT quantiles are over the turns of the last WINDOW_S
  const HISTORY_S = 300;  // what the charts span
  const KEY_ITEM = "agentkv.apiKey";
  const TIERS = ["hot", "warm", "cold"];
  const TIER_RANK = { hot: 0, warm: 1, cold: 2 };
  const COLORS = { hot: "#d9480f", warm: "#e8a200", cold: "#1c7ed6", all: "#364fc7", completions: "#2b8a3e" };
  const ID_RE = /^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$/;   // the server's agent id rule

  const $ = (id) => document.getElementById(id);
  let key = sessionStorage.getItem(KEY_ITEM) || "";
  let modelId = "";
  let pollTimer = 0;
  let polls = 0;          // the console's own polls answered (left out of requests/s)
  const view = { agents: [], sort: { key: "last_used_at", dir: -1 }, filter: "" };
  const samples = [];     // one per poll: counters of /metrics and what the charts plot
  const chat = { agent: "", messages: [], busy: false };

  class KeyNeeded extends Error {}

  // ------------------------------------------------------------ helpers

  // An element with properties (never innerHTML) and children (strings
  // become text nodes).
  function el(tag, props = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k === "onclick") e.addEventListener("click", v);
      else e[k] = v;
    }
    e.append(...kids);
    return e;
  }

  function fmtBytes(n) {
    if (n == null) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0) : String(n)) + " " + units[i];
  }

  function fmtMs(s) {
    if (s == null) return "—";
    const ms = s * 1000;
    return ms < 10 ? ms.toFixed(1) + " ms" : ms < 10000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(1) + " s";
  }

  function fmtAgo(unix) {
    if (!unix) return "—";
    const s = Math.max(0, Math.round(Date.now() / 1000 - unix));
    if (s < 5) return "just now";
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }

  function setStatus(text, bad = false) {
    $("status").textContent = text;
    $("status").classList.toggle("error", bad);
  }

  // fetch with the key; a 401 throws KeyNeeded. poll: one of the console's
  // own reads (counted to leave them out of requests/s).
  async function api(path, init = {}, poll = false) {
    const headers = new Headers(init.headers || {});
    if (key) headers.set("Authorization", "Bearer " + key);
    const r = await fetch(path, { ...init, headers, cache: "no-store" });
    if (poll) polls++;
    if (r.status === 401) throw new KeyNeeded();
    return r;
  }

  async function errorText(r) {
    try {
      const j = await r.json();
      return `${r.status}: ${(j.error && j.error.message) || ""}`;
    } catch {
      return String(r.status);
    }
  }

  async function apiJSON(path) {
    const r = await api(path, {}, true);
    if (!r.ok) throw new Error(`${path} ${await errorText(r)}`);
    return r.json();
  }

  // ------------------------------------------------------------ the key

  function needKey(message) {
    clearTimeout(pollTimer);
    key = "";
    sessionStorage.removeItem(KEY_ITEM);
    clearViews();
    $("main").hidden = true;
    $("forget-key").hidden = true;
    $("key-form").hidden = false;
    $("key-error").textContent = message || "";
    $("key").focus();
  }

  // Empties every view: nothing one viewer saw stays for the next.
  function clearViews() {
    view.agents = [];
    samples.length = 0;
    chat.messages = [];
    chat.agent = "";
    modelId = "";
    $("model").textContent = "";
    $("chat-log").replaceChildren();
    $("agent-ids").replaceChildren();
    for (const id of ["agents", "pools", "memories"]) $(id).tBodies[0].replaceChildren();
    for (const id of ["kv-text", "disk-text", "counts", "sharing", "ttft-legend", "rps-legend"]) $(id).textContent = "";
    renderAgents();
    renderCharts();
  }

  async function start() {
    clearTimeout(pollTimer);
    try {
      const models = await apiJSON("/v1/models");
      modelId = (models.data && models.data[0] && models.data[0].id) || "";
      $("model").textContent = modelId ? "model " + modelId : "";
      $("key-form").hidden = true;
      $("main").hidden = false;
      $("forget-key").hidden = !key;
      poll();
    } catch (e) {
      if (e instanceof KeyNeeded) return needKey(key ? "The server refused this key." : "");
      setStatus("cannot reach the server: " + e.message, true);
      pollTimer = setTimeout(start, POLL_MS);
    }
  }

  // ------------------------------------------------------------ polling

  async function poll() {
    clearTimeout(pollTimer);
    try {
      const own = polls;   // every poll answered so far is in this rendering's counters
      const r = await api("/metrics", {}, true);
      if (!r.ok) throw new Error("/metrics " + (await errorText(r)));
      const m = parseMetrics(await r.text());
      const [agents, pools, memories] = await Promise.all(["/v1/agents", "/v1/pools", "/v1/memories"].map(apiJSON));
      addSample(m, own);
      renderGauges(m);
      renderCharts();
      view.agents = agents.data || [];
      renderAgents();
      renderShared("pools", "pool-count", pools.data || [], "readers");
      renderShared("memories", "memory-count", memories.data || [], "sharers");
      setStatus("updated " + new Date().toLocaleTimeString());
    } catch (e) {
      if (e instanceof KeyNeeded) return needKey("The server refused this key.");
      setStatus("cannot reach the server: " + e.message, true);
    }
    pollTimer = setTimeout(poll, POLL_MS);
  }

  // Prometheus text: "name{labels} value" lines into a Map.
  function parseMetrics(text) {
    const m = new Map();
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const sp = line.lastIndexOf(" ");
      m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
    }
    return m;
  }

  // The cumulative TTFT buckets of a tier: [[le, count], ...] by le.
  function buckets(m, tier) {
    const prefix = `agentkv_ttft_seconds_bucket{tier="${tier}",le="`;
    const out = [];
    for (const [k, v] of m) {
      if (!k.startsWith(prefix)) continue;
      const le = k.slice(prefix.length, -2);
      out.push([le === "+Inf" ? Infinity : Number(le), v]);
    }
    return out.sort((a, b) => a[0] - b[0]);
  }

  // The q-quantile (seconds) of the turns counted between the buckets old
  // and cur, read as Prometheus's histogram_quantile does (linear within a
  // bucket; the +Inf bucket reads as the highest finite bound); null when
  // no turn fell between them.
  function quantile(q, old, cur) {
    if (!cur.length) return null;
    const d = cur.map(([le, c], i) => [le, c - (old && old[i] ? old[i][1] : 0)]);
    const n = d[d.length - 1][1];
    if (n <= 0) return null;
    const rank = q * n;
    let lo = 0, below = 0;
    for (const [le, c] of d) {
      if (c >= rank) {
        if (le === Infinity) return lo;
        return c > below ? lo + (le - lo) * (rank - below) / (c - below) : lo;
      }
      lo = le;
      below = c;
    }
    return lo;
  }

  function addSample(m, own) {
    const s = { t: performance.now() / 1000, own, req: 0, completions: 0, ttft: {}, p: {}, total: {}, rps: null, cps: null };
    for (const [k, v] of m) {
      if (!k.startsWith("agentkv_requests_total{")) continue;
      s.req += v;
      if (/endpoint="\/v1\/(chat\/)?completions"/.test(k)) s.completions += v;
    }
    // the sample WINDOW_S ago (or the first one): quantiles over the turns since
    let base = null;
    for (const x of samples) if (x.t <= s.t - WINDOW_S || !base) base = x;
    for (const tier of TIERS) {
      s.ttft[tier] = buckets(m, tier);
      const old = base ? base.ttft[tier] : null;
      s.p[tier] = base ? [quantile(0.5, old, s.ttft[tier]), quantile(0.99, old, s.ttft[tier])] : [null, null];
      s.total[tier] = [quantile(0.5, null, s.ttft[tier]), quantile(0.99, null, s.ttft[tier])];
    }
    const prev = samples[samples.length - 1];
    if (prev && s.t > prev.t) {
      s.rps = Math.max(0, (s.req - prev.req - (s.own - prev.own)) / (s.t - prev.t));
      s.cps = Math.max(0, (s.completions - prev.completions) / (s.t - prev.t));
    }
    samples.push(s);
    while (samples.length && samples[0].t < s.t - HISTORY_S - WINDOW_S) samples.shift();
  }

  // ------------------------------------------------------------ views

  function gauge(name, used, budget) {
    const bar = $(name + "-bar"), text = $(name + "-text");
    const f = budget > 0 ? used / budget : 0;
    bar.value = Math.min(f, 1);
    bar.classList.toggle("full", f >= 0.9);
    text.textContent = budget > 0
      ? `${fmtBytes(used)} of ${fmtBytes(budget)} (${(100 * f).toFixed(1)} %)`
      : `${fmtBytes(used)} (no budget set)`;
    text.dataset.used = used;
    text.dataset.budget = budget;
  }

  function renderGauges(m) {
    const get = (k) => m.get(k) || 0;
    gauge("kv", get('agentkv_tier_bytes{tier="hot"}'), get("agentkv_kv_budget_bytes"));
    gauge("disk", get('agentkv_tier_bytes{tier="warm"}'), get("agentkv_disk_budget_bytes"));
    $("counts").textContent =
      `${get('agentkv_agents{tier="hot"}')} agents hot, ${get('agentkv_agents{tier="warm"}')} warm · ` +
      `${get("agentkv_requests_active")} requests running, ${get("agentkv_requests_queued")} queued`;
    $("sharing").textContent =
      `${fmtBytes(get("agentkv_kv_shared_bytes"))} shared, dedup ×${get("agentkv_kv_dedup_ratio").toFixed(2)} · ` +
      `${get("agentkv_evictions_total")} evictions, ${get("agentkv_restores_total")} restores · ` +
      `${get("agentkv_agents_unsaved")} unsaved`;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const k of [1, 2, 5, 10]) if (k * p >= v) return k * p;
    return 10 * p;
  }

  // Lines over the last HISTORY_S: series [{color, dash, points: [[t, v|null]]}].
  function drawChart(canvas, series, fmt) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const left = 52, right = 10, top = 8, bottom = 20;
    const now = performance.now() / 1000;
    let max = 0;
    for (const s of series) for (const [t, v] of s.points) if (v != null && now - t <= HISTORY_S) max = Math.max(max, v);
    max = niceMax(max);
    const x = (t) => left + (w - left - right) * (1 - (now - t) / HISTORY_S);
    const y = (v) => top + (h - top - bottom) * (1 - v / max);
    g.font = "11px system-ui, sans-serif";
    g.lineWidth = 1;
    g.strokeStyle = "#dde1e6";
    g.fillStyle = "#6b7480";
    g.textAlign = "right";
    g.textBaseline = "middle";
    for (let i = 0; i <= 5; i++) {   // fifths of a 1, 2 or 5 times a power of ten: round labels
      const yy = Math.round(y((max * i) / 5)) + 0.5;
      g.beginPath();
      g.moveTo(left, yy);
      g.lineTo(w - right, yy);
      g.stroke();
      g.fillText(fmt((max * i) / 5), left - 4, yy);
    }
    g.textAlign = "center";
    g.textBaseline = "top";
    for (let min = 0; min <= HISTORY_S / 60; min++) {
      const xx = Math.min(Math.max(x(now - min * 60), left + 16), w - right - 16);
      g.fillText(min ? `-${min} min` : "now", xx, h - bottom + 5);
    }
    for (const s of series) {
      g.strokeStyle = g.fillStyle = s.color;
      g.lineWidth = 1.5;
      g.setLineDash(s.dash ? [5, 3] : []);
      g.beginPath();
      let pen = false;
      for (const [t, v] of s.points) {
        if (v == null || now - t > HISTORY_S) { pen = false; continue; }
        if (pen) g.lineTo(x(t), y(v));
        else g.moveTo(x(t), y(v));
        pen = true;
      }
      g.stroke();
      g.setLineDash([]);
      for (const [t, v] of s.points)   // a lone point shows too
        if (v != null && now - t <= HISTORY_S) g.fillRect(x(t) - 1.5, y(v) - 1.5, 3, 3);
    }
  }

  function legendItem(name, text, data) {
    return el("span", { dataset: data }, el("b", { class: "sw-" + name, textContent: "■ " }), text);
  }

  function renderCharts() {
    const ttft = [], legend = [];
    for (const tier of TIERS) {
      for (const [i, dash] of [[0, false], [1, true]])
        ttft.push({ color: COLORS[tier], dash, points: samples.map((s) => [s.t, s.p[tier][i] == null ? null : s.p[tier][i] * 1000]) });
      const last = samples[samples.length - 1];
      const [p50, p99] = last ? last.p[tier] : [null, null];
      const [a50, a99] = last ? last.total[tier] : [null, null];
      legend.push(legendItem(tier, `${tier}: p50 ${fmtMs(p50)}, p99 ${fmtMs(p99)} (since start ${fmtMs(a50)} / ${fmtMs(a99)})`,
                             { tier, p50: p50 == null ? "" : p50, p99: p99 == null ? "" : p99 }));
    }
    const msFmt = (v) => (v < 10 ? v.toFixed(1) : Math.round(v)) + " ms";
    drawChart($("ttft-chart"), ttft, msFmt);
    $("ttft-legend").replaceChildren(...legend);
    const rps = [
      { color: COLORS.all, points: samples.map((s) => [s.t, s.rps]) },
      { color: COLORS.completions, points: samples.map((s) => [s.t, s.cps]) },
    ];
    drawChart($("rps-chart"), rps, (v) => (v < 10 ? v.toFixed(1) : Math.round(v)) + "/s");
    const last = samples[samples.length - 1];
    const f = (v) => (v == null ? "—" : v.toFixed(2));
    $("rps-legend").replaceChildren(
      legendItem("all", `all requests ${f(last && last.rps)}/s (the console's own left out)`, { rps: last && last.rps != null ? last.rps : "" }),
      legendItem("completions", `completions ${f(last && last.cps)}/s`, { cps: last && last.cps != null ? last.cps : "" }));
  }

  function compare({ key: k, dir }) {
    return (a, b) => {
      let x = a[k], y = b[k];
      if (k === "tier") { x = TIER_RANK[x] ?? 9; y = TIER_RANK[y] ?? 9; }
      if (x == null && y != null) return 1;    // nothing last, either way
      if (y == null && x != null) return -1;
      let c = 0;
      if (x != null) c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return c ? c * dir : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    };
  }

  function tierBadge(tier) {
    const cls = Object.hasOwn(TIER_RANK, tier) ? "tier-" + tier : "tier-other";
    return el("span", { class: "tier " + cls, textContent: String(tier) });
  }

  const cell = (text, value, cls = "") => el("td", { class: cls, textContent: text, dataset: { value: value == null ? "" : String(value) } });

  function agentRow(a) {
    const last = cell(fmtAgo(a.last_used_at), a.last_used_at);
    if (a.last_used_at) last.title = new Date(a.last_used_at * 1000).toISOString();
    const tier = el("td", { dataset: { value: a.tier } }, tierBadge(a.tier));
    if (a.busy) tier.append(el("span", { class: "busy", textContent: "busy" }));
    return el("tr", { dataset: { id: a.id } },
      cell(a.id, a.id, "id"), tier,
      cell(String(a.tokens), a.tokens, "num"),
      cell(fmtBytes(a.bytes), a.bytes, "num"),
      cell(fmtBytes(a.private_bytes), a.private_bytes, "num"),
      cell(a.pool == null ? "—" : a.pool, a.pool),
      cell(a.card == null ? "—" : a.card, a.card),
      last,
      el("td", {},
        el("button", { type: "button", class: "link chat", textContent: "chat", onclick: () => chatWith(a.id) }),
        el("button", { type: "button", class: "link danger delete", textContent: "delete", onclick: () => askDelete(a.id) })));
  }

  function renderAgents() {
    const f = view.filter.toLowerCase();
    const rows = view.agents.filter((a) => String(a.id).toLowerCase().includes(f)).sort(compare(view.sort));
    $("agents").tBodies[0].replaceChildren(...rows.map(agentRow));
    $("agent-count").textContent = f ? `(${rows.length} of ${view.agents.length})` : `(${view.agents.length})`;
    $("agents-empty").hidden = view.agents.length > 0;
    for (const th of $("agents").tHead.rows[0].cells) {
      th.classList.toggle("sorted-up", th.dataset.key === view.sort.key && view.sort.dir > 0);
      th.classList.toggle("sorted-down", th.dataset.key === view.sort.key && view.sort.dir < 0);
    }
    $("agent-ids").replaceChildren(...view.agents.map((a) => el("option", { value: a.id })));
  }

  function formats(x) {
    return `${x.cache_type_k} / ${x.cache_type_v}`;
  }

  // The pools' or memories' table (id table, its count in id count): last
  // names the column that ends a row (readers, sharers).
  function renderShared(table, count, items, last) {
    $(count).textContent = `(${items.length})`;
    $(table).tBodies[0].replaceChildren(...items.map((x) => el("tr", { dataset: { id: x.id } },
      cell(x.id, x.id, "id"), cell(String(x.tokens), x.tokens, "num"), cell(fmtBytes(x.bytes), x.bytes, "num"),
      cell(fmtBytes(x.file_bytes), x.file_bytes, "num"), cell(formats(x)), cell(x.resident ? "yes" : "no", x.resident),
      cell(String(x[last]), x[last], "num"))));
  }

  // ------------------------------------------------------------ delete

  function askDelete(id) {
    const d = $("confirm");
    $("confirm-text").textContent = `Delete the agent ${id}? Its memory in RAM and its file go for good.`;
    d.dataset.id = id;
    d.showModal();
  }

  async function doDelete() {
    const d = $("confirm");
    const id = d.dataset.id;
    d.close();
    try {
      const r = await api("/v1/agents/" + encodeURIComponent(id), { method: "DELETE" });
      if (!r.ok) setStatus(`delete ${id}: ${await errorText(r)}`, true);
      else setStatus(`deleted ${id}`);
    } catch (e) {
      if (e instanceof KeyNeeded) return needKey("The server refused this key.");
      setStatus(`delete ${id}: ${e.message}`, true);
    }
    poll();
  }

  // ------------------------------------------------------------ chat

  function newConversation(agent) {
    chat.agent = agent;
    chat.messages = [];
    $("chat-log").replaceChildren();
    $("chat-error").textContent = "";
  }

  function chatWith(id) {
    $("chat-agent").value = id;
    if (id !== chat.agent) newConversation(id);
    $("chat").scrollIntoView({ block: "nearest" });
    $("chat-input").focus();
  }

  function turnEl(role, who, text) {
    const body = el("div", { class: "text", textContent: text });
    const stats = el("p", { class: "stats" });
    const t = el("div", { class: "turn " + role }, el("div", { class: "who", textContent: who }), body, stats);
    $("chat-log").append(t);
    return { t, body, stats };
  }

  // Reads an SSE chat stream: calls onText with each piece of text; resolves
  // to {text, usage, kv} at [DONE]; throws on an error event or a cut stream.
  async function readStream(r, onText) {
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "", text = "", usage = null, kv = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended before [DONE]");
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return { text, usage, kv };
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          const c = j.choices && j.choices[0];
          if (c && c.delta && c.delta.content) {
            text += c.delta.content;
            onText(c.delta.content);
          }
          if (j.usage) usage = j.usage;
          if (j.agentkv) kv = j.agentkv;
        }
      }
    }
  }

  async function send() {
    if (chat.busy) return;
    const agent = $("chat-agent").value.trim();
    const text = $("chat-input").value;
    $("chat-error").textContent = "";
    if (!ID_RE.test(agent)) {
      $("chat-error").textContent = "An agent id is 1 to 128 of A-Z a-z 0-9 _ . - and does not start with a dot.";
      return;
    }
    if (!text.trim()) return;
    if (agent !== chat.agent) newConversation(agent);
    chat.messages.push({ role: "user", content: text });
    $("chat-input").value = "";
    const mine = turnEl("user", "you", text);
    const out = turnEl("assistant", agent, "");
    chat.busy = true;
    $("chat-send").disabled = true;
    const maxTokens = Math.max(1, Math.min(4096, Number($("chat-max").value) || 64));
    try {
      const r = await api("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Agent-Id": agent },
        body: JSON.stringify({ model: modelId, messages: chat.messages, max_tokens: maxTokens, stream: true,
                               stream_options: { include_usage: true } }),
      });
      if (!r.ok) throw new Error(await errorText(r));
      const res = await readStream(r, (piece) => {
        out.body.textContent += piece;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      });
      chat.messages.push({ role: "assistant", content: res.text });
      const u = res.usage || {}, kv = res.kv || {};
      const cached = (u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens) || 0;
      out.stats.append(tierBadge(kv.tier),
        ` cached ${cached} of ${u.prompt_tokens} prompt tokens · ${u.completion_tokens} generated · ` +
        `TTFT ${kv.ttft_ms == null ? "—" : Math.round(kv.ttft_ms) + " ms"}`);
      Object.assign(out.stats.dataset, { tier: String(kv.tier), cached: String(cached), prompt: String(u.prompt_tokens),
                                         completion: String(u.completion_tokens) });
      out.t.classList.add("done");
    } catch (e) {
      chat.messages.pop();   // the message made no turn: it is not part of the conversation
      mine.stats.textContent = "not sent";
      out.t.remove();
      if (e instanceof KeyNeeded) return needKey("The server refused this key.");
      $("chat-error").textContent = e.message;
    } finally {
      chat.busy = false;
      $("chat-send").disabled = false;
    }
    poll();
  }

  // ------------------------------------------------------------ wiring

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      key = $("key").value.trim();
      $("key").value = "";
      if (key) sessionStorage.setItem(KEY_ITEM, key);
      start();
    });
    $("forget-key").addEventListener("click", () => needKey(""));
    $("filter").addEventListener("input", () => { view.filter = $("filter").value; renderAgents(); });
    for (const th of $("agents").tHead.rows[0].cells) {
      if (!th.dataset.key) continue;
      th.addEventListener("click", () => {
        const k = th.dataset.key;
        view.sort = { key: k, dir: view.sort.key === k ? -view.sort.dir : 1 };
        renderAgents();
      });
    }
    $("confirm-ok").addEventListener("click", doDelete);
    $("confirm-cancel").addEventListener("click", () => $("confirm").close());
    $("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("chat-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
    });
    $("chat-new").addEventListener("click", () => newConversation($("chat-agent").value.trim()));
    window.addEventListener("resize", renderCharts);
    start();
  });
})();
