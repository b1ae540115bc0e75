// Loom's web page: the jobs, one job's curves, events, memory and logs, and the nodes. It reads
// the planner's JSON API (/api/v1/, the gRPC messages in proto3's JSON mapping: 64-bit integers
// arrive as strings, enums as their names) and polls it while shown. The API wants a bearer
// token: the page asks for one and keeps it for the tab (sessionStorage); a link may carry it
// once as ?token=... (loomctl run prints such a link), which the page takes out of the address.
"use strict";

const POLL_MS = 2000;
// Curves drawn first, when the job reports them; any other metric of rank 0 follows.
const FIRST_CURVES = ["loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "rollout_output_tokens_per_s"];
// Metrics that are not curves worth a chart (per-rank memory has its own table).
const NOT_CURVES = /^(memory\.|progress$|samples$|step_time_s$|skipped_steps$)/;

const view = document.getElementById("view");
const statusLine = document.getElementById("status");
let timer = null;
let page = null; // the page shown: {poll(), ...}

const TOKEN_KEY = "loom-token";
(function tokenFromLink() {
  const token = new URLSearchParams(location.search).get("token");
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", location.pathname + location.hash);
})();

// A 401: the token is missing, unknown or revoked.
class SignInNeeded extends Error {}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const res = await fetch(path, { cache: "no-store", headers });
  if (!res.ok) {
    let message = res.statusText;
    try { message = (await res.json()).error; } catch (e) { /* not JSON */ }
    if (res.status === 401) throw new SignInNeeded(message);
    throw new Error(`${path}: ${message}`);
  }
  return path.includes("/logs") ? res.text() : res.json();
}

function age(ms) {
  const s = Math.max(0, (Date.now() - Number(ms)) / 1000);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}

function fmt(v) {
  if (v === undefined || v === null || Number.isNaN(v)) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

// About `count` round ticks (1, 2 or 5 times a power of ten) covering lo..hi, as loomctl plot's.
function niceTicks(lo, hi, count) {
  const raw = (hi - lo) / count;
  const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const ticks = [];
  for (let k = Math.floor(lo / step); k * step <= hi + step / 2 && ticks.length < 100; k++) ticks.push(k * step);
  return { ticks, step };
}

function tickLabel(v, step) {
  const a = Math.max(Math.abs(v), Math.abs(step));
  if (a >= 1e6 || (a > 0 && a < 1e-3)) return v.toExponential(1);
  return v.toFixed(Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
}

function bytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function stateBadge(state, id) {
  const attrs = { class: `state ${state}` };
  if (id) attrs.id = id;
  return el("span", attrs, state);
}

// ---- the jobs ----------------------------------------------------------------------------------

function jobsPage() {
  const body = el("tbody");
  view.replaceChildren(el("h1", {}, "Jobs"), el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ...["Job", "Name", "Kind", "State", "Reason", "Tenant", "Ranks", "Restarts", "Age"]
      .map((h) => el("th", {}, h)))), body));
  return {
    async poll() {
      const { jobs } = await api("/api/v1/jobs");
      body.replaceChildren(...jobs.slice().reverse().map((j) => el("tr", { "data-job": j.id },
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id)),
        el("td", {}, j.name), el("td", {}, j.kind), el("td", {}, stateBadge(j.state)),
        el("td", { class: "reason" }, j.reason), el("td", {}, j.tenant || "-"), el("td", { class: "num" }, j.world_size),
        el("td", { class: "num" }, j.restarts), el("td", { class: "num" }, age(j.create_time_ms)))));
      if (!jobs.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No jobs yet.")));
    },
  };
}

function nodesPage() {
  const body = el("tbody");
  view.replaceChildren(el("h1", {}, "Nodes"), el("table", { id: "nodes" },
    el("thead", {}, el("tr", {}, ...["Node", "Host", "Address", "Slots", "Used", "GPUs", "Connected", "Cordon", "Last seen"]
      .map((h) => el("th", {}, h)))), body));
  return {
    async poll() {
      const { nodes } = await api("/api/v1/nodes");
      body.replaceChildren(...nodes.map((n) => el("tr", {},
        el("td", {}, n.node_id), el("td", {}, n.hostname), el("td", {}, n.address),
        el("td", { class: "num" }, n.slots), el("td", { class: "num" }, n.used_slots),
        el("td", { class: "num" }, n.gpus ? `${n.used_gpus}/${n.gpus}` : "-"),
        el("td", {}, n.connected ? "yes" : "no"), el("td", { class: "reason" }, n.cordoned ? n.cordon_reason || "cordoned" : ""),
        el("td", { class: "num" }, age(n.last_seen_ms)))));
      if (!nodes.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No node has attached.")));
    },
  };
}

// ---- one job -------------------------------------------------------------------------------------

// A line chart of one metric over steps, redrawn as points arrive.
class Chart {
  constructor(name) {
    this.name = name;
    this.points = []; // [step, value], by step
    this.latest = el("span");
    this.svg = svgEl("svg", { viewBox: "0 0 420 180", preserveAspectRatio: "none" });
    this.node = el("div", { class: "chart", "data-metric": name, "data-points": "0" },
      el("div", { class: "title" }, name, this.latest), this.svg);
  }

  add(step, value) {
    if (!Number.isFinite(value)) return;
    const last = this.points[this.points.length - 1];
    if (last && last[0] === step) last[1] = value; // a restarted attempt repeats a step: keep the newest
    else this.points.push([step, value]);
  }

  draw() {
    const pts = this.points;
    this.node.setAttribute("data-points", String(pts.length));
    this.latest.textContent = pts.length ? fmt(pts[pts.length - 1][1]) : "";
    const W = 420, H = 180, left = 48, right = 8, top = 8, bottom = 20;
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (!pts.length) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.05 || 1; y1 += Math.abs(y1) * 0.05 || 1; }
    const { ticks, step } = niceTicks(y0, y1, 4);
    y0 = Math.min(y0, ticks[0]);
    y1 = Math.max(y1, ticks[ticks.length - 1]);
    const px = (x) => left + ((x - x0) / (x1 - x0)) * (W - left - right);
    const py = (y) => top + (1 - (y - y0) / (y1 - y0)) * (H - top - bottom);
    const parts = [];
    for (const y of ticks) {
      parts.push(svgEl("line", { class: "grid", x1: left, x2: W - right, y1: py(y), y2: py(y) }));
      const label = svgEl("text", { class: "tick", x: left - 4, y: py(y) + 3, "text-anchor": "end" });
      label.textContent = tickLabel(y, step);
      parts.push(label);
    }
    for (const x of [x0, x1]) {
      const label = svgEl("text", { class: "tick", x: px(x), y: H - 6, "text-anchor": x === x0 ? "start" : "end" });
      label.textContent = `step ${Math.round(x)}`;
      parts.push(label);
    }
    parts.push(svgEl("line", { class: "axis", x1: left, x2: left, y1: top, y2: H - bottom }));
    parts.push(svgEl("line", { class: "axis", x1: left, x2: W - right, y1: H - bottom, y2: H - bottom }));
    parts.push(svgEl("polyline", { points: pts.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ") }));
    this.svg.replaceChildren(...parts);
  }
}

function jobPage(id) {
  const path = `/api/v1/jobs/${encodeURIComponent(id)}`;
  const title = el("h1", {}, id);
  const badge = stateBadge("", "job-state");
  const reason = el("div", { class: "reason", id: "job-reason" });
  const summary = el("div", { class: "summary" });
  const charts = el("div", { class: "charts", id: "charts" });
  const memory = el("tbody");
  const ranks = el("tbody");
  const events = el("tbody");
  const rankSelect = el("select", { id: "log-rank" });
  const log = el("pre", { class: "log", id: "log" });
  view.replaceChildren(
    el("div", {}, title, badge), reason, summary,
    el("h2", {}, "Curves"), charts,
    el("h2", {}, "Ranks"), el("table", { id: "ranks" }, el("thead", {}, el("tr", {},
      ...["Rank", "Node", "PID", "State", "Step", "Detail"].map((h) => el("th", {}, h)))), ranks),
    el("h2", {}, "Memory per rank"), el("table", { id: "memory" }, memory),
    el("h2", {}, "Events"), el("table", { id: "events" }, el("thead", {}, el("tr", {},
      ...["Time", "Attempt", "State", "Reason"].map((h) => el("th", {}, h)))), events),
    el("h2", {}, "Log ", rankSelect), log);

  const chartsByName = new Map();
  let pageToken = "";
  let worldSize = 0;
  let finalSeen = false;

  function chartFor(name) {
    if (!chartsByName.has(name)) {
      chartsByName.set(name, new Chart(name));
      const order = (n) => { const i = FIRST_CURVES.indexOf(n); return i < 0 ? FIRST_CURVES.length : i; };
      const sorted = [...chartsByName.values()].sort((a, b) => order(a.name) - order(b.name) || a.name.localeCompare(b.name));
      charts.replaceChildren(...sorted.map((c) => c.node));
    }
    return chartsByName.get(name);
  }

  async function pollMetrics() {
    for (;;) { // every page stored so far
      const page = await api(`${path}/metrics?ranks=0&page_token=${pageToken}`);
      for (const m of page.metrics) {
        if (!NOT_CURVES.test(m.name)) chartFor(m.name).add(Number(m.step), m.value);
      }
      pageToken = page.next_page_token;
      if (!page.more) break;
    }
    for (const c of chartsByName.values()) c.draw();
    if (!chartsByName.size) charts.replaceChildren(el("div", { class: "empty" }, "No metrics reported yet."));
  }

  function showJob(job, jobEvents) {
    badge.textContent = job.state;
    badge.className = `state ${job.state}`;
    reason.textContent = job.reason;
    summary.replaceChildren(...[["name", job.name], ["kind", job.kind], ["attempt", job.attempt],
      ["restarts", `${job.restarts} of ${job.max_restarts}`], ["ranks", job.world_size], ["age", age(job.create_time_ms)]]
      .map(([k, v]) => el("span", {}, `${k} `, el("b", {}, v))));
    ranks.replaceChildren(...job.ranks.map((r) => el("tr", {},
      el("td", { class: "num" }, r.rank), el("td", {}, r.node_id), el("td", { class: "num" }, r.pid),
      el("td", {}, r.state.replace("RANK_", "")), el("td", { class: "num" }, r.step), el("td", { class: "reason" }, r.detail))));
    // Kinds some rank has (a CPU job has no device peak).
    const kinds = [...new Set(job.ranks.flatMap((r) => Object.entries(r.metrics || {})
      .filter(([k, v]) => k.startsWith("memory.") && v > 0).map(([k]) => k)))].sort();
    memory.replaceChildren(
      el("tr", {}, el("th", {}, "Rank"), ...kinds.map((k) => el("th", {}, k.slice(7).replace(/_bytes$/, "").replace(/_/g, " ")))),
      ...job.ranks.map((r) => el("tr", {}, el("td", { class: "num" }, r.rank),
        ...kinds.map((k) => el("td", { class: "num" }, r.metrics && k in r.metrics ? bytes(r.metrics[k]) : "")))));
    events.replaceChildren(...jobEvents.slice().reverse().map((e) => el("tr", {},
      el("td", {}, new Date(Number(e.time_ms)).toLocaleString()), el("td", { class: "num" }, e.attempt),
      el("td", {}, stateBadge(e.state)), el("td", { class: "reason" }, e.reason))));
    if (job.world_size !== worldSize) {
      worldSize = job.world_size;
      rankSelect.replaceChildren(...Array.from({ length: worldSize }, (_, r) => el("option", { value: r }, `rank ${r}`)));
    }
  }

  async function pollLog(job) {
    if (Number(job.attempt) === 0) { log.textContent = "(not launched yet)"; return; }
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = await api(`${path}/logs?rank=${rankSelect.value || 0}&tail=200`);
    if (atEnd) log.scrollTop = log.scrollHeight; // follow the tail unless the reader scrolled up
  }

  let lastJob = null;
  rankSelect.addEventListener("change", () => lastJob && pollLog(lastJob).catch(showError));
  return {
    async poll() {
      if (finalSeen) return; // a final job changes no more
      const { job, events: jobEvents } = await api(path);
      lastJob = job;
      showJob(job, jobEvents);
      await pollMetrics();
      await pollLog(job).catch((e) => { log.textContent = e.message; });
      finalSeen = ["SUCCEEDED", "FAILED", "CANCELLED"].includes(job.state);
    },
  };
}

// ---- routing and polling -------------------------------------------------------------------------

function showError(e) {
  statusLine.textContent = e.message;
  statusLine.className = "status error";
}

// Asks for a token; polling stops until one is given.
function signInPage(why) {
  const input = el("input", { type: "password", id: "token", placeholder: "loom_...", autocomplete: "off" });
  const form = el("form", { id: "sign-in" },
    el("h1", {}, "Sign in"),
    el("p", {}, "This planner answers callers with a bearer token: paste the contents of your token file ",
      "(loomctl --token-file; a planner started without --tokens writes an admin's into STATE_DIR/admin.token)."),
    el("p", { class: "error" }, why),
    input, " ", el("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  });
  view.replaceChildren(form);
  statusLine.textContent = "";
  input.focus();
}

async function tick() {
  clearTimeout(timer);
  try {
    await page.poll();
    statusLine.textContent = `updated ${new Date().toLocaleTimeString()}`;
    statusLine.className = "status";
  } catch (e) {
    if (e instanceof SignInNeeded) return signInPage(e.message);
    showError(e);
  }
  timer = setTimeout(tick, POLL_MS);
}

document.getElementById("sign-out").addEventListener("click", (event) => {
  event.preventDefault();
  sessionStorage.removeItem(TOKEN_KEY);
  route();
});

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const job = hash.match(/^\/jobs\/(.+)$/);
  page = job ? jobPage(decodeURIComponent(job[1])) : hash === "/nodes" ? nodesPage() : jobsPage();
  tick();
}

window.addEventListener("hashchange", route);
route();
