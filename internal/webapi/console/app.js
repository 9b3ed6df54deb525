// streamd console: polls the REST API (docs/rest.md) every second and draws
// the job list or one job's page. Plain JavaScript, no dependencies.
"use strict";

const state = { config: { refresh_interval_ms: 1000 }, timer: null, prev: null, route: "", busy: false, logs: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") Object.assign(e.style, v); // through the CSSOM: the CSP forbids style attributes
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch (e) { /* not JSON */ }
  if (!resp.ok) {
    const msg = data && data.errors ? data.errors.join("; ") : resp.status + " " + resp.statusText;
    throw new Error(msg);
  }
  return data;
}

function stateBadge(s) { return el("span", { class: "state " + s, "data-state": s }, s); }

function fmtBytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function fmtMS(ms) {
  if (ms < 1000) return ms.toFixed(ms < 10 ? 2 : 0) + " ms";
  const s = ms / 1000;
  if (s < 120) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + " min " + Math.round(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

function fmtRate(r) {
  if (r === undefined || r === null || !isFinite(r)) return "–";
  if (r >= 1e6) return (r / 1e6).toFixed(2) + " M/s";
  if (r >= 1e4) return (r / 1e3).toFixed(1) + " k/s";
  return r.toFixed(r < 10 ? 1 : 0) + " /s";
}

function fmtTime(t) { return t ? new Date(t).toLocaleTimeString() : ""; }

// traceURL links to a Jaeger UI search (tracing.ui_url) for spans with
// these tags; null when no UI is configured.
function traceURL(tags) {
  const c = state.config;
  if (!c.tracing_ui_url) return null;
  const q = new URLSearchParams();
  if (c.service) q.set("service", c.service);
  q.set("tags", JSON.stringify(tags));
  return c.tracing_ui_url + "/search?" + q.toString();
}

function setMain(...nodes) {
  const m = document.getElementById("main");
  m.replaceChildren(...nodes);
}

function setUpdated(ok, text) {
  const u = document.getElementById("updated");
  u.textContent = ok ? "updated " + new Date().toLocaleTimeString() : text;
}

// --- job list ---------------------------------------------------------------

async function renderList() {
  const data = await api("GET", "/jobs");
  const rows = data.jobs.map(j => el("tr", { "data-job": j.id },
    el("td", {}, el("a", { href: "#/jobs/" + encodeURIComponent(j.id) }, j.name)),
    el("td", { class: "muted" }, j.id),
    el("td", {}, stateBadge(j.state)),
    el("td", {}, fmtTime(j.start_time)),
    el("td", { class: "num" }, fmtMS(j.duration_ms)),
    el("td", {}, Object.entries(j.tasks).map(([s, n]) => el("span", {}, stateBadge(s), " " + n + " "))),
    el("td", {}, (j.hosts || []).join(", "))));
  setMain(el("h1", {}, "Jobs"),
    el("section", {}, rows.length ? el("table", { id: "jobs" },
      el("thead", {}, el("tr", {}, ["Name", "Id", "State", "Started", "Duration", "Subtasks", "Hosts"].map(h => el("th", {}, h)))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No jobs. Deploy one with: streamd deploy JOB.yaml")));
}

// --- job page ---------------------------------------------------------------

// subtaskTimes are a subtask's cumulative times (ms) from the API.
const TIMES = { bp: "backpressured_ms", busy: "busy_ms", idle: "idle_ms" };

// rates are records per second of each vertex since the previous poll, and
// each subtask's back-pressured, busy and idle milliseconds per second
// (rate[v].subtasks[i].bp ...).
function rates(job) {
  const out = {};
  const p = state.prev;
  if (p && p.id === job.id && job.now > p.now) {
    const dt = (job.now - p.now) / 1000;
    for (const v of job.vertices) {
      const q = p.vertices[v.id];
      if (!q) continue;
      out[v.id] = { in: (v.records_in - q.in) / dt, out: (v.records_out - q.out) / dt, subtasks: {} };
      for (const s of v.subtasks) {
        const t = q.subtasks[s.subtask];
        if (!t) continue;
        const r = {};
        for (const [k, f] of Object.entries(TIMES)) {
          if (s[f] !== undefined && t[k] !== undefined) r[k] = Math.max(0, (s[f] - t[k]) / dt);
        }
        out[v.id].subtasks[s.subtask] = r;
      }
    }
  }
  if (!p || p.id !== job.id || job.now - p.now >= 900) {
    const vs = {};
    for (const v of job.vertices) {
      const subs = {};
      for (const s of v.subtasks) {
        const t = {};
        for (const [k, f] of Object.entries(TIMES)) if (s[f] !== undefined) t[k] = s[f];
        subs[s.subtask] = t;
      }
      vs[v.id] = { in: v.records_in, out: v.records_out, subtasks: subs };
    }
    state.prev = { id: job.id, now: job.now, vertices: vs, rates: out };
    return out;
  }
  return p.rates; // a poll sooner than a second: keep the last rates
}

// layout places each node in the column of its longest path from a source.
function layout(nodes) {
  const byId = Object.fromEntries(nodes.map(n => [n.id, n]));
  const level = {};
  const lv = (id, seen) => {
    if (level[id] !== undefined) return level[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const n = byId[id];
    let l = 0;
    for (const i of (n && n.inputs) || []) l = Math.max(l, lv(i.id, seen) + 1);
    return (level[id] = l);
  };
  nodes.forEach(n => lv(n.id, new Set()));
  const cols = [];
  for (const n of nodes) (cols[level[n.id]] = cols[level[n.id]] || []).push(n.id);
  return { level, cols };
}

function drawGraph(plan, job, rate) {
  const W = 210, GAP = 90, ROWGAP = 30, SQ = 12;
  const vert = Object.fromEntries(job.vertices.map(v => [v.id, v]));
  const { cols } = layout(plan.nodes);
  const height = id => {
    const p = (vert[id] || {}).parallelism || 1;
    return 84 + Math.ceil(p / 14) * (SQ + 2);
  };
  const pos = {};
  let maxH = 0;
  cols.forEach((ids, c) => {
    let y = 10;
    for (const id of ids) {
      pos[id] = { x: 10 + c * (W + GAP), y, h: height(id) };
      y += pos[id].h + ROWGAP;
    }
    maxH = Math.max(maxH, y);
  });
  const width = 20 + cols.length * (W + GAP) - GAP;
  const root = svg("svg", { width, height: maxH, viewBox: `0 0 ${width} ${maxH}`, role: "img", "aria-label": "job graph" },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a94a6" }))));
  for (const e of plan.edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2, mx = (x1 + x2) / 2;
    root.append(svg("g", { class: "edge", "data-from": e.from, "data-to": e.to, "data-partitioning": e.partitioning },
      svg("path", { d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`, "marker-end": "url(#arrow)" }),
      svg("text", { x: mx, y: (y1 + y2) / 2 - 6, "text-anchor": "middle" }, e.partitioning)));
  }
  for (const n of plan.nodes) {
    const p = pos[n.id], v = vert[n.id] || { subtasks: [], records_in: 0, records_out: 0 };
    const r = rate[n.id] || {};
    const g = svg("g", { class: "node", "data-id": n.id, "data-state": v.state, transform: `translate(${p.x},${p.y})` },
      svg("rect", { class: "box", width: W, height: p.h }),
      svg("text", { class: "title", x: 10, y: 19 }, n.id),
      svg("text", { class: "meta", x: 10, y: 36 }, `${n.kind || "operator"} · parallelism ${n.parallelism}`),
      svg("text", { class: "rates", x: 10, y: 54 }, `in ${fmtRate(r.in)}  out ${fmtRate(r.out)}`),
      svg("text", { class: "meta", x: 10, y: 70 }, `${v.records_in} in · ${v.records_out} out`));
    v.subtasks.forEach((s, i) => {
      const sr = (r.subtasks || {})[s.subtask] || {};
      g.append(svg("rect", { class: "subtask " + s.state, "data-subtask": s.subtask, "data-state": s.state,
        x: 10 + (i % 14) * (SQ + 2), y: 78 + Math.floor(i / 14) * (SQ + 2), width: SQ, height: SQ },
        svg("title", {}, `subtask ${s.subtask}: ${s.state}${s.host ? " on " + s.host : ""}` +
          `\nwatermark in ${fmtWatermark(s.watermark)}, out ${fmtWatermark(s.output_watermark)}\nback-pressured ${fmtPerSec(sr.bp)}\nbusy ${fmtPerSec(sr.busy)}`)));
    });
    root.append(g);
  }
  return root;
}

function vertexTable(job, rate) {
  return el("table", { id: "vertices" },
    el("thead", {}, el("tr", {}, ["Operator", "Kind", "Parallelism", "State", "Records in", "Records out", "In /s", "Out /s", "Subtasks"]
      .map((h, i) => el("th", { class: i >= 4 && i < 8 ? "num" : "" }, h)))),
    el("tbody", {}, job.vertices.map(v => el("tr", { "data-id": v.id },
      el("td", {}, v.id), el("td", {}, v.kind || ""), el("td", { class: "num" }, v.parallelism),
      el("td", {}, stateBadge(v.state)),
      el("td", { class: "num" }, v.records_in), el("td", { class: "num" }, v.records_out),
      el("td", { class: "num rate-in" }, fmtRate((rate[v.id] || {}).in)),
      el("td", { class: "num rate-out" }, fmtRate((rate[v.id] || {}).out)),
      el("td", {}, v.subtasks.map(s => el("span", { title: s.host ? "on " + s.host : "" }, "#" + s.subtask + " ", stateBadge(s.state), " ")))))));
}

// fmtPerSec shows milliseconds per second as Flink does ("123 ms/s"), with
// the share of the second.
function fmtPerSec(ms) {
  if (ms === undefined || ms === null || !isFinite(ms)) return "–";
  ms = Math.min(ms, 1000);
  return Math.round(ms) + " ms/s (" + Math.round(ms / 10) + "%)";
}

// level is how the back-pressure or busy share colors its cell.
function level(ms) {
  if (ms === undefined || !isFinite(ms)) return "";
  return ms >= 500 ? "high" : ms >= 100 ? "mid" : "low";
}

// fmtWatermark shows a watermark (event-time ms): as a time when it looks
// like one (after 2000-01-01), else the number.
function fmtWatermark(wm) {
  if (wm === undefined || wm === null) return "–";
  if (wm > 946684800000 && wm < 32503680000000) return new Date(wm).toISOString().replace("T", " ").replace("Z", "") + " (" + wm + ")";
  return String(wm);
}

// subtaskTable lists every subtask with its watermarks, back-pressure, busy
// and idle time per second and (nats sources) its lag, updating live.
function subtaskTable(job, rate) {
  const rows = [];
  for (const v of job.vertices) {
    for (const s of v.subtasks) {
      const r = ((rate[v.id] || {}).subtasks || {})[s.subtask] || {};
      rows.push(el("tr", { "data-id": v.id, "data-subtask": s.subtask },
        el("td", {}, v.id), el("td", { class: "num" }, s.subtask), el("td", {}, s.host || ""), el("td", {}, stateBadge(s.state)),
        el("td", { class: "num watermark", "data-value": s.watermark }, fmtWatermark(s.watermark)),
        el("td", { class: "num output-watermark", "data-value": s.output_watermark }, fmtWatermark(s.output_watermark)),
        el("td", { class: "num backpressure " + level(r.bp), "data-value": r.bp }, fmtPerSec(r.bp)),
        el("td", { class: "num busy " + level(r.busy), "data-value": r.busy }, fmtPerSec(r.busy)),
        el("td", { class: "num idle", "data-value": r.idle }, fmtPerSec(r.idle)),
        el("td", { class: "num lag", "data-value": s.source_lag }, s.source_lag === undefined ? "–" : s.source_lag)));
    }
  }
  return el("table", { id: "subtasks" },
    el("thead", {}, el("tr", {}, ["Operator", "Subtask", "Host", "State", "Input watermark", "Output watermark", "Back-pressured", "Busy", "Idle", "Source lag"]
      .map((h, i) => el("th", { class: i === 1 || i >= 4 ? "num" : "" }, h)))),
    el("tbody", {}, rows));
}

// checkpointCounts says how many checkpoints completed, failed and are in
// progress, and why the latest failed.
function checkpointCounts(cps) {
  const c = cps.counts;
  if (!c) return null;
  const failed = cps.failed || [];
  return el("div", { id: "checkpoint-counts" },
    el("p", {}, ["completed", "failed", "in_progress"].map(k => el("span", { class: "count " + k, "data-count": k },
      el("b", {}, c[k]), " " + k.replace("_", " ") + "  ")), el("span", { class: "muted" }, " (since this process started)")),
    failed.length ? el("table", { id: "failed-checkpoints" },
      el("thead", {}, el("tr", {}, ["Failed", "Kind", "At", "Why"].map(h => el("th", {}, h)))),
      el("tbody", {}, failed.map(f => el("tr", { "data-id": f.id },
        el("td", {}, f.id), el("td", {}, f.kind || "checkpoint"), el("td", {}, fmtTime(f.time)), el("td", { class: "reason" }, f.reason))))) : null);
}

function checkpointTable(job, cps) {
  if (!job.checkpoint_mode) return el("p", { class: "muted" }, "The job does not checkpoint (no checkpoint section).");
  if (!cps.history.length) return el("p", { class: "muted", id: "no-checkpoints" }, "No checkpoint completed yet.");
  const traced = new Set(cps.traced || []);
  const link = c => {
    const u = traceURL({ "streamd.job": job.name, "streamd.checkpoint_id": String(c.id) });
    return [traced.has(c.id) ? el("a", { class: "waterfall", href: "#/jobs/" + encodeURIComponent(job.id) + "/checkpoints/" + c.id }, "waterfall") : "",
      u ? " " : "", u ? el("a", { class: "jaeger", href: u, target: "_blank", rel: "noopener" }, "Jaeger") : ""];
  };
  return el("table", { id: "checkpoints" },
    el("thead", {}, el("tr", {}, ["Id", "Kind", "Status", "Completed", "Duration", "Size", "In-flight", "Location", "", "Finished"]
      .map((h, i) => el("th", { class: i >= 4 && i <= 6 ? "num" : "" }, h)))),
    el("tbody", {}, cps.history.map(c => el("tr", { "data-id": c.id, "data-kind": c.kind },
      el("td", {}, c.id), el("td", {}, c.kind + (c.unaligned ? " (unaligned)" : "")), el("td", {}, c.status),
      el("td", {}, fmtTime(c.completed_at)), el("td", { class: "num" }, fmtMS(c.duration_ms)),
      el("td", { class: "num" }, fmtBytes(c.state_size)), el("td", { class: "num" }, fmtBytes(c.inflight_bytes)),
      el("td", { class: "muted" }, c.external_path || ""), el("td", { class: "links" }, link(c)),
      el("td", { class: "finished" }, finishedText(c))))));
}

// finishedText says which subtasks and operators had finished at checkpoint c
// (FLIP-147), and what an incremental checkpoint wrote.
function finishedText(c) {
  const parts = [];
  if (c.finished_subtasks) parts.push(c.finished_subtasks + " subtasks");
  if (c.finished_operators && c.finished_operators.length) parts.push("done: " + c.finished_operators.join(", "));
  if (c.incremental_size) parts.push("incremental " + fmtBytes(c.incremental_size));
  return parts.join("; ");
}

function exceptionList(ex) {
  if (!ex.root_exception && !ex.entries.length) return el("p", { class: "muted", id: "no-exceptions" }, "No failures.");
  return el("div", { id: "exceptions" },
    ex.root_exception ? [el("h3", {}, "Root cause"), failure(ex.root_summary, ex.root_exception)] : null,
    ex.entries.map(e => el("div", { class: "entry", "data-attempt": e.attempt },
      el("div", {}, "Attempt " + e.attempt + " ", stateBadge(e.state), e.hosts ? " on " + e.hosts.join(", ") : ""),
      failure(e.summary, e.exception))));
}

// failure shows a cause in words when the API has them, the raw text
// (the guest's message and wasm stack) folded beneath.
function failure(summary, raw) {
  if (!summary) return el("pre", { class: "exception" }, raw);
  const d = el("details", {}, el("summary", {}, "Details"), el("pre", { class: "exception" }, raw));
  return el("div", {}, el("p", { class: "summary" }, summary), d);
}

function message(text, kind) {
  const m = document.getElementById("message");
  if (!m) return;
  m.textContent = text;
  m.className = kind || "";
}

async function act(what, fn) {
  state.busy = true;
  document.querySelectorAll(".actions button").forEach(b => b.disabled = true);
  message(what + "…", "");
  try {
    const r = await fn();
    message(what + ": " + (r.location ? "savepoint " + r.location : "done") + (r.state ? " (job " + r.state + ")" : ""), "ok");
  } catch (e) {
    message(what + " failed: " + e.message, "error");
  } finally {
    state.busy = false;
    tick();
  }
}

function actions(job) {
  const id = encodeURIComponent(job.id);
  const live = ["running", "finishing"].includes(job.state);
  const ended = ["finished", "failed", "canceled", "stopped"].includes(job.state);
  const cp = !!job.checkpoint_mode;
  const drain = el("input", { type: "checkbox", id: "drain" });
  const cancel = el("button", { id: "btn-cancel", class: "danger", disabled: ended || state.busy });
  cancel.textContent = "Cancel";
  cancel.addEventListener("click", () => {
    if (cancel.dataset.confirm !== "1") { // a second click confirms
      cancel.dataset.confirm = "1";
      cancel.textContent = "Click again to cancel the job";
      return;
    }
    act("Cancel", () => api("POST", `/jobs/${id}/cancel`));
  });
  return el("div", { class: "actions" },
    el("button", { id: "btn-stop", disabled: !live || !cp || state.busy,
      onclick: () => act("Stop with savepoint", () => api("POST", `/jobs/${id}/stop`, { drain: drain.checked })) }, "Stop with savepoint"),
    el("label", {}, drain, " drain"),
    el("button", { id: "btn-savepoint", disabled: !live || !cp || state.busy,
      onclick: () => act("Savepoint", () => api("POST", `/jobs/${id}/savepoints`, {})) }, "Savepoint"),
    cancel,
    el("span", { id: "message" }));
}

// renderJob draws the page once and then updates its parts in place, so
// that the buttons and the message stay while the data refreshes.
async function renderJob(id) {
  const p = encodeURIComponent(id);
  const [job, plan, cps, ex, vs] = await Promise.all([api("GET", `/jobs/${p}`), api("GET", `/jobs/${p}/plan`),
    api("GET", `/jobs/${p}/checkpoints`), api("GET", `/jobs/${p}/exceptions`), api("GET", `/jobs/${p}/versions`)]);
  const rate = rates(job);
  let page = document.getElementById("job-page");
  if (!page || page.dataset.id !== id) {
    const trace = traceURL({ "streamd.job": state.config.mode === "run" ? job.name : job.id });
    page = el("div", { id: "job-page", "data-id": id },
      el("h1", {}, el("a", { href: "#/" }, "Jobs"), " / ", job.name, " ", el("span", { id: "job-state" })),
      el("section", {}, el("div", { id: "actions" }), el("dl", { class: "kv", id: "summary" }),
        trace ? el("p", {}, el("a", { href: trace, target: "_blank", rel: "noopener", id: "job-trace" }, "Traces of this job in Jaeger")) : null),
      el("h2", {}, "Graph"), el("section", { id: "graph" }),
      el("h2", {}, "Operators"), el("section", { id: "vertex-table" }),
      el("h2", {}, "Subtasks"), el("section", { id: "subtask-table" }),
      el("h2", {}, "Checkpoints"), el("section", { id: "checkpoint-section" }),
      el("h2", {}, "Failures"), el("section", { id: "exception-section" }),
      el("h2", {}, "Versions"), el("section", { id: "version-section" }),
      el("h2", {}, "Logs"), el("section", { id: "log-section" },
        el("label", {}, "Operator ", el("select", { id: "log-operator", onchange: e => {
          state.logs = { id, next: 0, error: null, operator: e.target.value };
          document.querySelector("#logs tbody").replaceChildren();
          readLogs(id);
        } }, el("option", { value: "" }, "all"), job.vertices.map(v => el("option", { value: v.id }, v.id)))),
        el("div", { id: "log-note", class: "muted" }),
        el("div", { id: "logs-box" }, el("table", { id: "logs" }, el("tbody", {})))));
    setMain(page);
    state.logs = { id, next: 0, error: null };
  }
  const st = document.getElementById("job-state");
  if (st.dataset.state !== job.state) {
    st.dataset.state = job.state;
    st.replaceChildren(stateBadge(job.state));
  }
  const acts = document.getElementById("actions");
  const key = job.state + "|" + state.busy;
  if (acts.dataset.key !== key) { // redraw the buttons only when they change
    const msg = document.getElementById("message");
    const keep = msg ? [msg.textContent, msg.className] : null;
    acts.dataset.key = key;
    acts.replaceChildren(actions(job));
    if (keep) message(keep[0], keep[1]);
  }
  const kv = [["Id", job.id], ["State", job.state], ["Attempt", job.attempt], ["Started", new Date(job.start_time).toLocaleString()],
    ["Duration", fmtMS(job.duration_ms)], ["Hosts", (job.hosts || []).join(", ")],
    ["Parallelism", parallelismText(job)], ["Autoscaler", autoscalerText(job)],
    ["Checkpoints", job.checkpoint_mode || "off"], ["Savepoint", job.savepoint], ["Reason", job.reason_summary || job.reason]];
  document.getElementById("summary").replaceChildren(...kv.filter(([, v]) => v !== undefined && v !== "")
    .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-key": k.toLowerCase() }, v)]));
  document.getElementById("graph").replaceChildren(drawGraph(plan.plan, job, rate));
  document.getElementById("vertex-table").replaceChildren(vertexTable(job, rate));
  document.getElementById("subtask-table").replaceChildren(subtaskTable(job, rate));
  document.getElementById("checkpoint-section").replaceChildren(checkpointCounts(cps) || "", checkpointTable(job, cps));
  document.getElementById("exception-section").replaceChildren(exceptionList(ex));
  document.getElementById("version-section").replaceChildren(versionTable(vs));
  await readLogs(id);
}

// parallelismText is the parallelism the job runs at, the one it declares
// and the least it runs at, and its latest rescale (adaptive scheduling).
function parallelismText(job) {
  if (!job.declared_parallelism) return undefined;
  let s = job.parallelism + " (declared " + job.declared_parallelism + ", min " + job.min_parallelism + ")";
  const r = (job.rescales || []).at(-1);
  if (r) s += "; rescaled " + r.from + " \u2192 " + r.to + " at " + new Date(r.time).toLocaleTimeString() + ": " + r.reason;
  return s;
}

// autoscalerText is the job's autoscaler (off: undefined): what it waits
// for, and its latest decisions with their reasons, newest first.
function autoscalerText(job) {
  const a = job.autoscaler;
  if (!a) return undefined;
  const lines = [a.settings];
  if (a.hold) lines.push("holding: " + a.hold);
  for (const d of (a.decisions || []).slice(-5).reverse()) {
    lines.push(new Date(d.time).toLocaleTimeString() + " " + d.operator + " " + d.from + " \u2192 " + d.to + " (" + d.outcome + "): " + d.reason);
  }
  return el("div", { id: "autoscaler" }, lines.map(l => el("div", {}, l)));
}

// versionTable is the job's version history (streamd upgrade).
function versionTable(vs) {
  if (!vs.versions.length) return el("p", { class: "muted", id: "no-versions" }, "Version 1, as deployed: no upgrade yet (streamd upgrade).");
  return el("table", { id: "versions" },
    el("thead", {}, el("tr", {}, ["Version", "State", "Started", "First attempt", "From", "Modules", "Why"].map(h => el("th", {}, h)))),
    el("tbody", {}, vs.versions.slice().reverse().map(v => el("tr", { "data-version": v.version },
      el("td", {}, v.version + (v.rerun ? " (runs " + v.rerun + " again)" : "")), el("td", {}, stateBadge(v.state)),
      el("td", {}, new Date(v.started).toLocaleString()), el("td", { class: "num" }, v.attempt),
      el("td", { class: "muted" }, v.from || ""),
      el("td", {}, (v.modules || []).map(m => el("div", { title: m.digest }, m.operator + ": " + m.name + " " + m.digest.slice(0, 12)))),
      el("td", {}, v.reason || "")))));
}

// MAXLOG is how many log lines the page keeps.
const MAXLOG = 1000;

// readLogs appends the job's new log lines (GET /jobs/{id}/logs?after=):
// the last hour's at first, then what came since the previous poll.
async function readLogs(id) {
  const lg = state.logs;
  if (!lg || lg.id !== id || lg.error || lg.reading) return;
  lg.reading = true; // one read at a time: a filter change and a poll may overlap
  let q = lg.next ? "after=" + lg.next : "since=1h";
  if (lg.operator) q += "&operator=" + encodeURIComponent(lg.operator);
  let r;
  try {
    r = await api("GET", `/jobs/${encodeURIComponent(id)}/logs?${q}&limit=500`);
  } catch (e) {
    lg.reading = false;
    lg.error = e.message; // e.g. streamd run: no log stream; said once, not asked again
    document.getElementById("log-note").textContent = "No logs here: " + e.message;
    return;
  }
  lg.reading = false;
  if (state.logs !== lg) return; // the filter changed meanwhile
  lg.next = r.next;
  const body = document.querySelector("#logs tbody");
  for (const l of r.records) {
    const where = l.operator !== undefined && l.subtask !== undefined ? l.operator + "[" + l.subtask + "]" : "job";
    const attrs = Object.entries(l.attrs || {}).map(([k, v]) => k + "=" + v).join(" ");
    body.append(el("tr", { class: "log " + (l.level || "").toLowerCase(), "data-seq": l.seq, "data-source": l.source },
      el("td", { class: "muted" }, new Date(l.time).toLocaleTimeString()), el("td", {}, where + "@" + l.host),
      el("td", { class: "num" }, l.attempt), el("td", {}, l.level), el("td", {}, l.source),
      el("td", { class: "msg" }, l.msg + (attrs ? " " + attrs : ""))));
  }
  while (body.children.length > MAXLOG) body.firstChild.remove();
  document.getElementById("log-note").textContent = body.children.length ? "" : "No log lines in the last hour.";
}

// --- hosts page ---------------------------------------------------------------

async function renderHosts() {
  const data = await api("GET", "/hosts");
  const rows = data.hosts.map(h => el("tr", { "data-host": h.id },
    el("td", {}, h.id), el("td", {}, el("span", { class: "state " + (h.state === "alive" ? "running" : h.state === "unconfirmed" ? "restarting" : "failed"), "data-state": h.state }, h.state)),
    el("td", { class: "num" }, h.slots), el("td", { class: "num slots-free" }, h.free),
    el("td", {}, new Date(h.last_seen).toLocaleTimeString()),
    el("td", {}, h.jobs.map(j => el("a", { href: "#/jobs/" + encodeURIComponent(j) }, j, " ")))));
  setMain(el("h1", {}, "Hosts"),
    el("section", {}, rows.length ? el("table", { id: "hosts" },
      el("thead", {}, el("tr", {}, ["Host", "State", "Slots", "Free", "Last heartbeat", "Jobs"].map((h, i) => el("th", { class: i === 2 || i === 3 ? "num" : "" }, h)))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No hosts. Start one with: streamd host")));
}

// --- checkpoint trace (waterfall) ----------------------------------------------

// spanLabel names a span and what it ran on.
function spanLabel(s) {
  const a = s.attributes || {};
  const who = a["streamd.operator"] !== undefined ? " " + a["streamd.operator"] + "[" + a["streamd.subtask"] + "]" : "";
  return s.name + who;
}

// treeOrder lists spans depth first (children by start), with their depth.
function treeOrder(spans) {
  const ids = new Set(spans.map(s => s.span_id));
  const kids = {};
  const roots = [];
  for (const s of spans) {
    if (s.parent_id && ids.has(s.parent_id)) (kids[s.parent_id] = kids[s.parent_id] || []).push(s);
    else roots.push(s);
  }
  const out = [];
  const walk = (s, d) => {
    out.push([s, d]);
    for (const c of (kids[s.span_id] || []).sort((a, b) => new Date(a.start) - new Date(b.start))) walk(c, d + 1);
  };
  roots.sort((a, b) => new Date(a.start) - new Date(b.start)).forEach(s => walk(s, 0));
  return out;
}

// tms is a time of the API in milliseconds with its fraction (a Date keeps
// whole milliseconds only; spans are often shorter).
function tms(t) {
  const m = /\.(\d+)/.exec(t);
  return Date.parse(t.replace(/\.\d+/, "")) + (m ? parseFloat("0." + m[1]) * 1000 : 0);
}

// waterfall draws the spans of a trace on one time axis.
function waterfall(spans) {
  const t0 = Math.min(...spans.map(s => tms(s.start)));
  const t1 = Math.max(...spans.map(s => tms(s.end)));
  const total = Math.max(t1 - t0, 0.001);
  const rows = treeOrder(spans).map(([s, d]) => {
    const st = tms(s.start) - t0, dur = tms(s.end) - tms(s.start);
    const kind = s.name.split(".")[0];
    const title = Object.entries(s.attributes || {}).map(([k, v]) => k + "=" + v).join("\n") + (s.error ? "\nerror: " + s.error : "");
    return el("div", { class: "span-row" + (s.error ? " error" : ""), "data-name": s.name, title },
      el("div", { class: "span-name", style: { paddingLeft: (d * 14) + "px" } }, spanLabel(s)),
      el("div", { class: "span-track" },
        el("div", { class: "span-bar " + kind, style: { left: (st / total * 100).toFixed(3) + "%", width: Math.max(dur / total * 100, 0.3).toFixed(3) + "%" } }),
        el("span", { class: "span-dur" + ((st + dur) / total > 0.86 && dur / total > 0.2 ? " inside" : ""), style: { left: Math.min((st + dur) / total * 100, 86).toFixed(3) + "%" } }, fmtMS(dur) + (s.error ? " — " + s.error : ""))));
  });
  return el("div", { id: "waterfall" },
    el("div", { class: "span-row axis" }, el("div", { class: "span-name muted" }, spans.length + " spans"),
      el("div", { class: "span-track muted" }, "0", el("span", { class: "axis-end" }, fmtMS(total)))), rows);
}

// renderTrace draws a checkpoint's trace once (it does not change after the
// checkpoint ended).
async function renderTrace(id, cid) {
  const key = id + "/" + cid;
  if (document.getElementById("trace-page") && document.getElementById("trace-page").dataset.key === key) return;
  const p = encodeURIComponent(id);
  const job = await api("GET", `/jobs/${p}`);
  const tr = await api("GET", `/jobs/${p}/checkpoints/${cid}/trace`);
  const root = tr.spans.find(s => s.name === "checkpoint") || tr.spans[0];
  const a = (root && root.attributes) || {};
  const subs = tr.subtasks.map(s => el("tr", { "data-id": s.operator, "data-subtask": s.subtask },
    el("td", {}, s.operator), el("td", { class: "num" }, s.subtask), el("td", { class: "num" }, s.attempt),
    el("td", { class: "num ack" }, fmtMS(s.ack_ms)), el("td", { class: "num" }, fmtBytes(s.state_size)),
    el("td", { class: "num" }, fmtBytes(s.inflight_bytes)),
    el("td", {}, s.declined ? "declined: " + s.declined : s.finished ? "finished (FLIP-147)" : s.after_end_of_data ? "after end of data" : "acknowledged")));
  setMain(el("div", { id: "trace-page", "data-key": key },
    el("h1", {}, el("a", { href: "#/" }, "Jobs"), " / ", el("a", { href: "#/jobs/" + p }, job.name), " / ",
      (a["streamd.checkpoint_kind"] || "checkpoint") + " " + cid),
    el("section", {}, el("dl", { class: "kv" },
      el("dt", {}, "Duration"), el("dd", {}, root ? fmtMS(tms(root.end) - tms(root.start)) : ""),
      el("dt", {}, "Outcome"), el("dd", { id: "trace-outcome" }, root && root.error ? root.error : "completed"),
      el("dt", {}, "Subtasks"), el("dd", {}, tr.subtasks.length + " answered"))),
    el("h2", {}, "Waterfall"), el("section", {}, waterfall(tr.spans)),
    el("h2", {}, "Subtasks"), el("section", {}, el("table", { id: "trace-subtasks" },
      el("thead", {}, el("tr", {}, ["Operator", "Subtask", "Attempt", "Trigger to ack", "State", "In-flight", "Outcome"]
        .map((h, i) => el("th", { class: i >= 1 && i <= 5 ? "num" : "" }, h)))),
      el("tbody", {}, subs)))));
}

// --- routing and polling -------------------------------------------------------

async function tick() {
  clearTimeout(state.timer);
  const route = location.hash.replace(/^#/, "") || "/";
  try {
    const m = route.match(/^\/jobs\/([^/]+)$/);
    const t = route.match(/^\/jobs\/([^/]+)\/checkpoints\/([0-9]+)$/);
    if (m) await renderJob(decodeURIComponent(m[1]));
    else if (t) await renderTrace(decodeURIComponent(t[1]), t[2]);
    else if (route === "/hosts") await renderHosts();
    else await renderList();
    setUpdated(true);
  } catch (e) {
    setUpdated(false, "not updated: " + e.message);
    if (!document.getElementById("job-page") && !document.getElementById("jobs") && !document.getElementById("hosts")) {
      setMain(el("p", { class: "error" }, e.message), el("p", {}, el("a", { href: "#/" }, "Back to the jobs")));
    }
  }
  state.timer = setTimeout(tick, state.config.refresh_interval_ms || 1000);
}

async function start() {
  try {
    state.config = await api("GET", "/config");
    document.getElementById("mode").textContent = state.config.mode === "run" ? "streamd run" : "controller";
  } catch (e) { /* keep the defaults */ }
  window.addEventListener("hashchange", () => { state.prev = null; tick(); });
  tick();
}

start();
