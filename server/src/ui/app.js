// The web view of drivetrain: runs, a run's DAG, stages, logs, lineage, the registry and
// schedules. Plain JavaScript modules (this one, dom.js, graph.js, timeline.js, charts.js),
// no dependencies, no build step; the server lays graphs out. Everything comes from the
// API under /api/v1 (docs/openapi.json). Text from the server is only ever set as text
// (textContent, attributes), never parsed as HTML.

import { h, num, MARK, seen } from "./dom.js";
import { graphView } from "./graph.js";
import { timeline } from "./timeline.js";
import { barChart, overTime, recordedSeries } from "./charts.js";
import { trialsSection } from "./trials.js";
import { comparePage } from "./compare.js";

// The phases of `drivetrain_engine::state::Phase`; all but the first two and the last
// (a run waiting for people) are ends.
const PHASES = ["Pending", "Running", "Succeeded", "Failed", "Error", "Skipped", "Omitted", "Cancelled", "Waiting"];
const TRIGGERS = ["cli", "api", "schedule", "rerun", "retry"];
/** How many rows of the run list are drawn at a time. */
const ROWS = 500;
const TERMINAL = new Set(PHASES.slice(2, -1));

// ---- small helpers ----------------------------------------------------------------


const main = () => document.getElementById("main");
function show(...nodes) {
  main().replaceChildren(...nodes.flat());
}
function say(text, kind = "info") {
  const s = document.getElementById("status");
  s.className = kind;
  s.textContent = text;
}

let token = sessionStorage.getItem("drivetrain-token") || "";

function headers(extra = {}) {
  const out = { ...extra };
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

/** A JSON request to the API; a refusal throws its `error` text. */
async function api(path, options = {}) {
  const r = await fetch(path, { ...options, headers: headers(options.headers) });
  const type = r.headers.get("content-type") || "";
  const body = type.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    const why = body && body.error ? body.error : `${r.status} ${r.statusText}`;
    if (r.status === 401) document.getElementById("token").focus();
    throw new Error(why);
  }
  return body;
}

// ---- who the caller is, and what the view offers them ---------------------------

/** `GET /api/v1/whoami`, once per token: the subject, its grants and what it may do. */
let me = null;
async function whoami() {
  if (me) return me;
  try {
    me = await api("/api/v1/whoami");
  } catch {
    me = { subject: "", grants: [], may: {} };
  }
  for (const a of document.querySelectorAll("nav a[data-needs]")) {
    a.hidden = !can(a.dataset.needs);
  }
  return me;
}

/** Whether the caller may `verb` in `project` (a grant for `*` counts everywhere). */
function can(verb, project = "default") {
  const may = (me && me.may) || {};
  return [project, "*"].some((p) => (may[p] || []).includes(verb));
}

/** Whether the caller holds approval role `role` in `project`. */
function approves(role, project = "default") {
  return ((me && me.grants) || []).some((g) => (g.project === project || g.project === "*")
    && (g.approves || []).some((a) => a === role || a === "*"));
}

function post(path, body) {
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body || {}),
  });
}

/** Server-sent events over fetch (so the token goes in a header): calls on(event, data). */
async function events(path, signal, on) {
  const r = await fetch(path, { headers: headers({ accept: "text/event-stream" }), signal });
  if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error || `${path}: ${r.status}`);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) on(name, JSON.parse(data.join("\n")));
    }
  }
}

/** Streams a text response into `pre`, keeping the end in view while it grows. */
async function streamText(path, signal, pre) {
  const r = await fetch(path, { headers: headers(), signal });
  if (!r.ok) {
    pre.textContent = (await r.json().catch(() => ({}))).error || `${r.status}`;
    return;
  }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  pre.textContent = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(value);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
  pre.dataset.ended = "true";
}

const esc = encodeURIComponent;
const runLink = (id) => h("a", { href: `#/runs/${esc(id)}` }, id);
/** A phase as a badge; `how` ({orphaned, reason}) as `seen` reads it. */
const badge = (phase, how) => {
  const v = seen(phase, how);
  return h("span", { class: `badge phase-${v.cls}`, title: v.cls === "Orphaned" ? ORPHANED : null }, h("span", { "aria-hidden": "true" }, v.mark), ` ${v.word}`);
};
const ORPHANED = "its engine stopped beating: nothing runs it until `drivetrain resume` goes on where it stopped (or `drivetrain cancel` ends it)";
const lineageLink = (target, text = "lineage") => h("a", { href: `#/lineage?target=${esc(target)}`, class: "lineage-link" }, text);

function when(t) {
  if (!t) return "";
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleString();
}

function took(start, end) {
  if (!start) return "";
  const ms = (end ? new Date(end) : new Date()) - new Date(start);
  if (!(ms >= 0)) return "";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60000);
  return m < 60 ? `${m} min ${Math.round((ms % 60000) / 1000)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function json(v) {
  return h("pre", { class: "json" }, JSON.stringify(v, null, 2));
}

// ---- the page's one live stream ---------------------------------------------------

let live = new AbortController();
/** The run page on show: `{run, select(stage)}`, so choosing a stage redraws nothing else. */
let current = null;
function fresh() {
  current = null;
  live.abort();
  live = new AbortController();
  return live.signal;
}
const quiet = (e) => {
  if (e.name !== "AbortError") say(e.message, "error");
};

// ---- runs -------------------------------------------------------------------------

async function runsPage(query) {
  const signal = fresh();
  const q = new URLSearchParams(query);
  const field = (label, input) => h("label", {}, h("span", {}, label), input);
  const choice = (name, options) =>
    h("select", { name },
      h("option", { value: "" }, "any"),
      options.map((o) => h("option", { value: o, selected: q.get(name) === o }, o)));
  const form = h("form", { class: "filters", "aria-label": "filter runs" },
    field("Pipeline", h("input", { name: "pipeline", value: q.get("pipeline") || "" })),
    field("Phase", choice("phase", PHASES)),
    field("Trigger", choice("trigger", TRIGGERS)),
    field("Since", h("input", { name: "since", type: "datetime-local", value: q.get("since") || "" })),
    field("Show", h("select", { name: "limit" },
      [50, 200, 1000, 10000].map((n) => h("option", { value: n, selected: String(n) === (q.get("limit") || "200") }, n)))),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const params = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) params.set(k, v);
    location.hash = `#/runs?${params}`;
  });
  const count = h("p", { class: "count" });
  const more = h("p");
  const body = h("tbody");
  const table = h("table", { class: "runs" },
    h("caption", { class: "sr-only" }, "Runs, newest first"),
    h("thead", {}, h("tr", {}, ["Compare", "Run", "Pipeline", "Phase", "Trigger", "From", "Created", "Took", "Reason"].map((c) => h("th", { scope: "col" }, c)))),
    body);
  // Two to five runs chosen: side by side.
  const chosen = new Set();
  const compare = h("button", { type: "button", id: "compare-runs", disabled: true,
    onclick: () => { location.hash = `#/compare?runs=${[...chosen].map(esc).join(",")}`; } }, "Compare chosen runs");
  const pick = (id, on) => {
    if (on) chosen.add(id); else chosen.delete(id);
    compare.disabled = chosen.size < 2 || chosen.size > 5;
    compare.textContent = `Compare chosen runs (${chosen.size})`;
  };
  show(h("h1", {}, "Runs"), form, h("p", {}, compare), count, table, more);

  const load = async () => {
    const params = new URLSearchParams(q);
    if (!params.get("limit")) params.set("limit", "200");
    const since = params.get("since");
    if (since) params.set("since", new Date(since).toISOString());
    const { runs } = await api(`/api/v1/runs?${params}`);
    const row = (r) => h("tr", { "data-run": r.id },
      h("td", {}, h("input", { type: "checkbox", class: "pick", "aria-label": `compare ${r.id}`, checked: chosen.has(r.id),
        onchange: (e) => pick(r.id, e.target.checked) })),
      h("td", {}, runLink(r.id)),
      h("td", {}, r.pipeline),
      h("td", {}, badge(r.phase, r)),
      h("td", {}, r.trigger),
      h("td", {}, r.parent ? runLink(r.parent) : ""),
      h("td", {}, when(r.created_at)),
      h("td", {}, r.orphaned ? "—" : took(r.created_at, r.finished_at)),
      h("td", { class: "reason" }, r.reason || ""));
    // Drawn a page at a time: a browser lays out 500 rows at once quickly, 10,000 slowly.
    const draw = (n) => {
      body.replaceChildren(...runs.slice(0, n).map(row));
      const rest = runs.length - body.rows.length;
      count.textContent = `${runs.length} run(s)${rest ? `, the first ${body.rows.length} shown` : ""}`;
      more.replaceChildren(rest
        ? h("button", { type: "button", id: "more", onclick: () => draw(body.rows.length + ROWS) }, `Show ${Math.min(ROWS, rest)} more`)
        : "");
    };
    draw(Math.max(ROWS, body.rows.length));
  };
  // The stream's first event (sent at once) loads the list, later ones reload it: nothing
  // is read twice, and nothing that changes in between is missed.
  let pending = null;
  let loaded = false;
  let shown;
  const first = new Promise((resolve) => (shown = resolve));
  const reload = () => {
    if (!loaded) {
      loaded = true;
      load().catch(quiet).finally(shown);
      return;
    }
    clearTimeout(pending);
    pending = setTimeout(() => load().catch(quiet), 200);
  };
  events("/api/v1/events", signal, reload).catch((e) => {
    if (e.name === "AbortError") return;
    quiet(e);
    if (!loaded) reload();
  });
  await first;
}

// ---- one run ----------------------------------------------------------------------

async function runPage(id, selected) {
  const signal = fresh();
  const [graph, detail] = await Promise.all([
    api(`/api/v1/runs/${esc(id)}/graph`),
    api(`/api/v1/runs/${esc(id)}`),
  ]);
  const stages = new Map(detail.stages.map((s) => [s.stage, s]));
  let run = detail.run;
  await whoami();

  const head = h("section", { class: "run-head", "aria-label": "run" });
  const actions = h("div", { class: "actions" });
  const panel = h("aside", { class: "stage-panel", "aria-label": "stage" }, h("p", {}, "Choose a stage to see its attempts, outputs and log."));
  const names = graph.nodes.map((n) => n.name);

  const renderHead = () => {
    head.replaceChildren(
      h("h1", {}, `Run ${run.id}`, " ", badge(run.phase, run)),
      run.orphaned ? h("p", { class: "note orphaned" }, `Orphaned: the engine of this run stopped beating, so nothing runs it now. \`drivetrain resume ${run.id}\` goes on where it stopped; \`drivetrain cancel ${run.id}\` ends it.`) : "",
      h("dl", { class: "facts" },
        h("dt", {}, "Pipeline"), h("dd", {}, run.pipeline, " ", lineageLink(`${run.id}/${names[names.length - 1]}`, "lineage of its last stage")),
        h("dt", {}, "Trigger"), h("dd", {}, run.trigger, run.parent ? [" of ", runLink(run.parent)] : ""),
        h("dt", {}, "Created"), h("dd", {}, when(run.created_at)),
        h("dt", {}, "Took"), h("dd", { "data-field": "took" }, run.orphaned ? "— (its engine stopped)" : took(run.created_at, run.finished_at)),
        run.reason ? [h("dt", {}, "Reason"), h("dd", { class: "reason" }, run.reason)] : "",
        run.selection ? [h("dt", {}, "Executed"), h("dd", {}, run.selection.join(", "))] : "",
        Object.keys(run.params || {}).length ? [h("dt", {}, "Params"), h("dd", {}, Object.entries(run.params).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join("  "))] : ""));
    renderActions();
  };

  const renderActions = () => {
    const ended = TERMINAL.has(run.phase);
    const stageSelect = h("select", { id: "rerun-stage", name: "stage" }, names.map((n) => h("option", { value: n, selected: n === selected }, n)));
    const downstream = h("input", { type: "checkbox", id: "rerun-downstream", checked: true });
    const params = h("textarea", { id: "rerun-params", rows: 2, placeholder: "name=value, one a line" });
    const form = h("form", { class: "rerun", "aria-label": "rerun" },
      h("label", { for: "rerun-stage" }, "Stage"), stageSelect,
      h("label", {}, downstream, " and downstream"),
      h("label", { for: "rerun-params" }, "Params"), params,
      h("button", { type: "submit", id: "rerun", disabled: !ended }, "Rerun"));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const overrides = {};
      for (const line of params.value.split("\n")) {
        const at = line.indexOf("=");
        if (at > 0) overrides[line.slice(0, at).trim()] = line.slice(at + 1).trim();
      }
      try {
        const r = await post(`/api/v1/runs/${esc(run.id)}/rerun`, { stages: [stageSelect.value], downstream: downstream.checked, params: overrides });
        say(`started rerun ${r.run}`);
        location.hash = `#/runs/${esc(r.run)}`;
      } catch (err) {
        say(`rerun: ${err.message}`, "error");
      }
    });
    const button = (label, idName, path, enabled) => {
      const b = h("button", { type: "button", id: idName, disabled: !enabled }, label);
      b.addEventListener("click", async () => {
        try {
          const r = await post(path);
          if (r.run && r.run !== run.id) {
            say(`started ${label.toLowerCase()} ${r.run}`);
            location.hash = `#/runs/${esc(r.run)}`;
          } else say(`${label.toLowerCase()}: accepted`);
        } catch (err) {
          say(`${label.toLowerCase()}: ${err.message}`, "error");
        }
      });
      return b;
    };
    // What the caller's role may not do is not offered.
    actions.replaceChildren(
      can("cancel", run.project) ? button("Cancel", "cancel", `/api/v1/runs/${esc(run.id)}/cancel`, !ended) : "",
      can("launch", run.project) ? button("Retry", "retry", `/api/v1/runs/${esc(run.id)}/retry`, ended && run.phase !== "Succeeded") : "",
      can("launch", run.project) ? form : "",
      run.phase === "Waiting" ? h("a", { href: "#/approvals", class: "waiting" }, "Waiting for approval: decide") : "");
  };

  const nodes = graph.nodes.map((n) => ({ id: n.name, needs: n.needs, kind: n.kind, map: n.map, search: n.search, hook: n.hook }));
  const needs = new Map(nodes.map((n) => [n.id, n.needs]));
  const phaseOf = (name) => (stages.get(name) || { phase: "Pending" }).phase;
  // A map stage's items by phase, from the attempts API (read again as the run goes on).
  let timed = { attempts: [], items: [] };
  const itemCounts = (name) => {
    const counts = {};
    for (const it of timed.items) if (it.stage === name) counts[it.phase] = (counts[it.phase] || 0) + 1;
    return counts;
  };
  const sub = (n) => {
    const s = stages.get(n.id);
    const phase = s ? s.phase : "Pending";
    const v = seen(phase, { orphaned: run.orphaned, reason: s && s.reason });
    const bits = [`${v.mark} ${v.word}`];
    if (s && s.attempts > 1) bits.push(`${s.attempts} attempts`);
    if (s && s.origin && s.origin !== "ran") bits.push(s.origin);
    if (n.map) {
      const c = itemCounts(n.id);
      const total = Object.values(c).reduce((a, b) => a + b, 0);
      bits.push(total ? `${total} items: ${Object.entries(c).map(([p, k]) => `${k} ${MARK[p]}`).join(" ")}` : "map");
    }
    return bits.join(" · ");
  };
  const view = graphView(nodes, graph.layout, {
    name: `stages of ${run.pipeline}`,
    label: (n) => [n.id, sub(n)],
    classOf: (n) => `phase-${seen(phaseOf(n.id), { orphaned: run.orphaned, reason: (stages.get(n.id) || {}).reason }).cls}${n.map ? " map" : ""}`,
    onPick: (n) => { location.hash = `#/runs/${esc(id)}/${esc(n.id)}`; },
  });
  const paint = (name) => view.paint(name);

  // The timeline, drawn again as attempts start and end (at most once a second).
  const lane = h("section", { class: "run-timeline", "aria-label": "timeline" }, h("h2", {}, "Timeline"), h("p", {}, "…"));
  let redraw = null;
  const drawTimeline = async () => {
    timed = await api(`/api/v1/runs/${esc(id)}/attempts`);
    for (const n of nodes) if (n.map) paint(n.id);
    const width = Math.max(700, (lane.clientWidth || main().clientWidth || 1200) - 8);
    lane.replaceChildren(h("h2", {}, "Timeline"), timeline({ run, order: names, needs, stages, ...timed, width }));
    document.body.dataset.timelineDrawn = String(Date.now());
  };
  const later = () => {
    if (redraw) return;
    redraw = setTimeout(() => {
      redraw = null;
      if (!signal.aborted) drawTimeline().catch(quiet);
    }, 1000);
  };
  // While the run goes on, running bars grow.
  const ticking = setInterval(() => {
    if (signal.aborted) clearInterval(ticking);
    else if (!TERMINAL.has(run.phase) && !run.orphaned) later();
  }, 2000);

  const select = (name) => {
    selected = name;
    view.select(name);
    if (!name) return;
    stageSignal.abort();
    stageSignal = new AbortController();
    const s = stages.get(name);
    const node = nodes.find((n) => n.id === name) || {};
    if (s) stagePanel(run, s, panel, stageSignal.signal, { map: !!node.map, search: !!node.search });
    else panel.replaceChildren(h("h2", {}, name), h("p", {}, "Pending: not started yet."));
    renderActions();
  };
  let stageSignal = new AbortController();
  signal.addEventListener("abort", () => stageSignal.abort());
  current = { run: id, select };

  renderHead();
  show(head, actions,
    graph.note ? h("p", { class: "note" }, graph.note) : "",
    view.element, h("div", { class: "run-body" }, panel), lane);
  for (const n of names) paint(n);
  if (selected) select(selected);
  await drawTimeline().catch(quiet);

  events(`/api/v1/runs/${esc(id)}/events`, signal, (name, data) => {
    if (name === "snapshot") {
      run = data.run;
      for (const s of data.stages) stages.set(s.stage, s);
      renderHead();
      for (const n of names) paint(n);
      later();
    } else if (name === "run") {
      run = data;
      renderHead();
      later();
    } else if (name === "stage") {
      const before = stages.get(data.stage);
      stages.set(data.stage, data);
      paint(data.stage);
      later();
      if (data.stage === selected && (!before || before.phase !== data.phase || before.attempts !== data.attempts)) {
        select(selected);
      }
    } else if (name === "end") {
      document.body.dataset.runEnded = run.id;
    }
  }).catch(quiet);
}

// What the stage's last attempt used: peak memory, CPU time, GPUs where measured.
function usage(u) {
  const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
  return [
    u.peak_memory_bytes != null ? `peak ${mib(u.peak_memory_bytes)} memory` : "",
    u.cpu_seconds != null ? `${u.cpu_seconds.toFixed(2)} CPU s` : "",
    u.gpu_utilization_percent != null ? `GPUs ${Math.round(u.gpu_utilization_percent)}% busy` : "",
    u.gpu_memory_bytes != null ? `peak ${mib(u.gpu_memory_bytes)} GPU memory` : "",
  ].filter(Boolean).join(", ");
}

function origin(s) {
  if (s.origin === "cached") return ["cached from ", runLink(s.origin_run)];
  if (s.origin === "reused") return ["reused from ", runLink(s.origin_run)];
  return s.origin || "ran";
}

/** Numbers of an object, one level down too: {"recall": {"all": 1}} → [["recall.all", 1]]. */
function flat(o) {
  const out = [];
  for (const [k, v] of Object.entries(o || {})) {
    if (typeof v === "number") out.push([k, v]);
    else if (v && typeof v === "object" && !Array.isArray(v)) for (const [k2, v2] of Object.entries(v)) if (typeof v2 === "number") out.push([`${k}.${k2}`, v2]);
  }
  return out;
}

/** What a stage's values show as charts: its `series`, a candidate against production
 * (validation), and its values over the pipeline's recent runs (filled in when read). */
function stageCharts(run, s, signal) {
  const box = h("section", { class: "charts", "aria-label": `charts of ${s.stage}` });
  const v = s.values || {};
  const { charts, dropped } = recordedSeries(v.series);
  if (charts.length) box.append(h("h3", {}, "Recorded series"), h("div", { class: "chart-row" }, charts));
  if (dropped) box.append(h("p", { class: "note" }, `${dropped} point(s) of its series were not two numbers and are not drawn.`));
  const m = v.metrics;
  if (m && m.candidate && typeof m.candidate === "object") {
    const cand = new Map(flat(m.candidate)), prod = new Map(flat(m.production));
    const categories = [...new Set([...cand.keys(), ...prod.keys()])].filter((c) => c !== "frames");
    box.append(h("h3", {}, "Candidate against production, by slice"), barChart({
      title: m.production ? "candidate vs production" : "candidate (no production model yet)",
      categories,
      series: [{ name: "candidate", values: categories.map((c) => cand.get(c)) }]
        .concat(m.production ? [{ name: "production", values: categories.map((c) => prod.get(c)) }] : []),
    }));
  }
  const history = h("div", { class: "chart-row" });
  box.append(history);
  api(`/api/v1/runs/${esc(run.id)}/stages/${esc(s.stage)}/history?limit=20`, { signal }).then(({ runs }) => {
    const done = runs.filter((r) => r.phase === "Succeeded");
    if (done.length < 2) return;
    const made = overTime(done.map((r, i) => ({ x: i + 1, values: r.values })), {
      x: "run (when it started)", xLabels: (i) => new Date(done[i - 1].created_at).toLocaleTimeString([], { hourCycle: "h23", hour: "2-digit", minute: "2-digit", second: "2-digit" }),
      skip: ["series", "metrics", "history"],
    });
    if (made.length) history.replaceWith(h("h3", {}, `Over the last ${done.length} successful runs of ${run.pipeline}`), h("div", { class: "chart-row history" }, made));
  }).catch(quiet);
  return box;
}

/** An item's value or values in one short line: `{"lr": 0.1}` → `lr=0.1`. */
function brief(v) {
  if (v === null || v === undefined) return "";
  if (typeof v !== "object") return String(v);
  const text = Array.isArray(v) ? JSON.stringify(v) : Object.entries(v).map(([k, x]) => `${k}=${typeof x === "number" ? num(x) : typeof x === "string" ? x : JSON.stringify(x)}`).join("  ");
  return text.length > 160 ? `${text.slice(0, 159)}…` : text;
}

/** A map stage's items, a page at a time: value, phase, attempts, time, values, reason;
 * choosing one shows its log in `logs`. */
function itemsTable(run, s, logs, signal) {
  const body = h("tbody");
  const count = h("span", { class: "count" });
  const more = h("p");
  const page = 100;
  let reading = new AbortController();
  const load = async (offset) => {
    const p = await api(`/api/v1/runs/${esc(run.id)}/stages/${esc(s.stage)}/items?offset=${offset}&limit=${page}`, { signal });
    for (const it of p.items) {
      const open = h("button", { type: "button", class: "link", "data-item": it.index, title: `the log of item ${it.index}` }, String(it.index));
      open.addEventListener("click", () => {
        for (const r of body.querySelectorAll("tr.chosen")) r.classList.remove("chosen");
        open.closest("tr").classList.add("chosen");
        logs.setAttribute("aria-label", `log of ${s.stage} item ${it.index}`);
        logs.textContent = it.attempts ? "…" : "(not started)";
        delete logs.dataset.ended;
        reading.abort();
        reading = new AbortController();
        const both = AbortSignal.any([signal, reading.signal]);
        if (it.attempts) streamText(`/api/v1/runs/${esc(run.id)}/logs?stage=${esc(it.log_stage)}${it.phase === "Running" ? "&follow=true" : ""}`, both, logs).catch(quiet);
      });
      body.append(h("tr", { "data-item": it.index },
        h("td", {}, open), h("td", { class: "item" }, brief(it.item)), h("td", {}, badge(it.phase, { orphaned: run.orphaned, reason: it.reason })),
        h("td", { class: "num" }, it.attempts), h("td", {}, took(it.started_at, it.finished_at)),
        h("td", { class: "values" }, brief(it.values)), h("td", { class: "reason" }, it.reason || "")));
    }
    const shown = body.rows.length;
    count.textContent = ` (${p.total}${shown < p.total ? `, the first ${shown} shown` : ""})`;
    more.replaceChildren(shown < p.total
      ? h("button", { type: "button", id: "more-items", onclick: () => load(shown).catch(quiet) }, `Show ${Math.min(page, p.total - shown)} more`)
      : "");
  };
  load(0).catch(quiet);
  return [h("table", { class: "items" }, h("caption", {}, "Items", count),
    h("thead", {}, h("tr", {}, ["#", "Item", "Phase", "Attempts", "Took", "Values", "Reason"].map((c) => h("th", { scope: "col" }, c)))), body), more];
}

async function stagePanel(run, s, panel, signal, { map = false, search = false } = {}) {
  const logs = h("pre", { class: "log", id: "log", tabindex: 0, "aria-label": `log of ${s.stage}` }, "…");
  const explained = h("div", { class: "explain" });
  const explain = h("button", { type: "button", id: "explain" }, "Explain");
  explain.addEventListener("click", async () => {
    try {
      const e = await api(`/api/v1/runs/${esc(run.id)}/stages/${esc(s.stage)}/explain`);
      explained.replaceChildren(
        h("p", {}, e.verdict),
        e.changes.length ? h("ul", {}, e.changes.map((c) => h("li", {}, c))) : "",
        e.definition_changes && e.definition_changes.length
          ? [h("p", {}, "In the rendered definition:"), h("ul", { class: "definition" }, e.definition_changes.map((c) => h("li", { class: "digest" }, c)))]
          : "",
        e.compared_with_run ? h("p", {}, "compared with ", runLink(e.compared_with_run)) : "",
        h("details", {}, h("summary", {}, "key components"), json(e.components)));
    } catch (err) {
      explained.textContent = err.message;
    }
  });
  const outputs = Object.entries(s.outputs || {});
  const inputs = Object.entries(s.inputs || {});
  const charts = stageCharts(run, s, signal);
  const trials = h("div", { class: "trials-box" });
  if (search) {
    api(`/api/v1/runs/${esc(run.id)}/stages/${esc(s.stage)}/trials`, { signal })
      .then((page) => trials.replaceChildren(trialsSection(page))).catch(quiet);
  }
  const attempts = h("tbody");
  panel.replaceChildren(
    h("h2", {}, s.stage, " ", badge(s.phase, { orphaned: run.orphaned, reason: s.reason })),
    h("dl", { class: "facts" },
      h("dt", {}, "Outputs from"), h("dd", { "data-field": "origin" }, origin(s)),
      map || search ? "" : [h("dt", {}, "Attempts"), h("dd", {}, s.attempts)],
      h("dt", {}, "Took"), h("dd", {}, took(s.started_at, s.finished_at)),
      s.exit_code !== null && s.exit_code !== undefined ? [h("dt", {}, "Exit code"), h("dd", {}, s.exit_code)] : "",
      s.reason ? [h("dt", {}, "Reason"), h("dd", { class: "reason" }, s.reason)] : "",
      s.usage ? [h("dt", {}, "Used"), h("dd", { "data-field": "usage" }, usage(s.usage))] : "",
      s.provenance && s.provenance.code ? [h("dt", {}, "Code"), h("dd", { "data-field": "code", class: "digest" },
        `${s.provenance.code.commit.slice(0, 12)}${s.provenance.code.dirty ? " (dirty)" : ""}`)] : ""),
    // A search's attempts are its trials' (below).
    search ? "" : h("div", { class: "tries" }, map ? itemsTable(run, s, logs, signal) : h("table", { class: "attempts" }, h("caption", {}, "Attempts"),
      h("thead", {}, h("tr", {}, ["#", "Phase", "Started", "Took", "Exit", "Reason"].map((c) => h("th", { scope: "col" }, c)))), attempts)),
    outputs.length ? h("table", { class: "outputs" }, h("caption", {}, "Outputs"),
      h("thead", {}, h("tr", {}, ["Output", "Digest", ""].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, outputs.map(([name, o]) => h("tr", {},
        h("td", {}, name), h("td", { class: "digest" }, o.digest ? lineageLink(o.digest, o.digest) : ""),
        h("td", {}, o.digest ? lineageLink(`${o.digest}`, "made of it") : ""))))) : "",
    inputs.length ? h("table", { class: "inputs" }, h("caption", {}, "Inputs"),
      h("tbody", {}, inputs.map(([name, i]) => h("tr", {}, h("td", {}, name), h("td", { class: "digest" }, i.digest ? lineageLink(i.digest, i.digest) : ""))))) : "",
    trials,
    charts,
    s.values && Object.keys(s.values).length ? h("details", {}, h("summary", {}, "Values"), json(s.values)) : "",
    h("p", {}, explain, " ", h("a", { href: `#/lineage?target=${esc(`${run.id}/${s.stage}`)}` }, "Lineage")),
    explained,
    h("h3", {}, "Log"),
    logs);
  api(`/api/v1/runs/${esc(run.id)}/attempts`).then(({ attempts: all }) => {
    attempts.replaceChildren(...all.filter((a) => a.stage === s.stage).map((a) => h("tr", {},
      h("td", {}, a.attempt), h("td", {}, badge(a.phase, { orphaned: run.orphaned, reason: a.reason })), h("td", {}, when(a.started_at)),
      h("td", {}, took(a.started_at, a.finished_at)), h("td", {}, a.exit_code ?? ""), h("td", { class: "reason" }, a.reason || ""))));
  }).catch(quiet);
  if (map) {
    logs.textContent = "Choose an item to see its log.";
  } else if (search) {
    logs.textContent = "Each trial's log: `drivetrain logs RUN --stage STAGE`.";
  } else if (s.attempts > 0 || s.phase === "Running") {
    const follow = s.phase === "Running" ? "&follow=true" : "";
    streamText(`/api/v1/runs/${esc(run.id)}/logs?stage=${esc(s.stage)}${follow}`, signal, logs).catch(quiet);
  } else {
    logs.textContent = s.origin === "ran" || !s.origin ? "(no attempt)" : `(outputs ${s.origin}: no attempt here)`;
  }
}

// ---- lineage ----------------------------------------------------------------------

async function lineagePage(query) {
  fresh();
  const q = new URLSearchParams(query);
  const target = h("input", { id: "lineage-target", name: "target", value: q.get("target") || "", size: 60, placeholder: "sha256:…, RUN/STAGE or MODEL@VERSION" });
  const down = h("input", { type: "checkbox", name: "downstream", id: "lineage-down", checked: q.get("downstream") === "true" });
  const form = h("form", { class: "filters", "aria-label": "lineage" },
    h("label", { for: "lineage-target" }, "From"), target,
    h("label", {}, down, " downstream (what was made of it)"),
    h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = `#/lineage?target=${esc(target.value)}&downstream=${down.checked}`;
  });
  show(h("h1", {}, "Lineage"), form);
  if (!q.get("target")) {
    main().append(h("p", {}, "From a model version, an artifact or a run's stage: up to the drive logs, or down to what was made of it."));
    // One click from what people start from: the models' newest versions.
    const { models } = await api("/api/v1/registry").catch(() => ({ models: [] }));
    const versions = models.flatMap((m) => m.versions.slice(-5).reverse().map((v) => `${m.model}@${v.version}`));
    if (versions.length) main().append(h("h2", {}, "Model versions"), h("ul", { class: "shortcuts" }, versions.map((t) => h("li", {}, lineageLink(t, t)))));
    return;
  }
  const g = await api(`/api/v1/lineage?target=${esc(q.get("target"))}&downstream=${q.get("downstream") === "true"}`);
  const needs = new Map(Object.keys(g.nodes).map((id) => [id, []]));
  for (const [from, to] of g.edges) if (needs.has(to)) needs.get(to).push(from);
  const nodes = Object.keys(g.nodes).map((id) => ({ id, needs: needs.get(id) }));
  const label = (n) => {
    const v = g.nodes[n.id];
    // The model version asked for is its artifact: the root is named by it.
    if (v.kind === "artifact" && g.model_version && g.roots.includes(n.id)) return [g.model_version, `${v.output} ${v.digest.slice(7, 19)}`];
    if (v.kind === "artifact") return [`${v.output} ${v.digest.slice(7, 19)}`, v.url.split("/").slice(-2).join("/")];
    return [`${v.stage}`, `${v.run} · ${v.origin}`];
  };
  const view = graphView(nodes, g.layout, {
    name: "lineage",
    label,
    classOf: (n) => `kind-${g.nodes[n.id].kind}${g.roots.includes(n.id) ? " root" : ""}`,
    onPick: (n) => {
      const v = g.nodes[n.id];
      if (v.kind === "stage") location.hash = `#/runs/${esc(v.run)}/${esc(v.stage)}`;
      else location.hash = `#/lineage?target=${esc(v.digest)}&downstream=${q.get("downstream") !== "true"}`;
    },
  });
  for (const [id, v] of Object.entries(g.nodes)) {
    const el = view.element.querySelector(`[data-node="${CSS.escape(id)}"]`);
    if (el) el.dataset.kind = v.kind;
  }
  main().append(h("p", { class: "count" }, `${g.model_version ? `${g.model_version}: ` : ""}${nodes.length} node(s), ${g.edges.length} edge(s), ${q.get("downstream") === "true" ? "what was made of it below" : "what it was made of below"}. A stage opens its run; an artifact turns the walk around.`), view.element);
}

// ---- registry ---------------------------------------------------------------------

/** A version's metrics as a definition list, numbers rounded as people read them. */
function metrics(m) {
  const pairs = flat(m);
  return pairs.length ? h("dl", { class: "metrics" }, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-metric": k, title: String(v) }, num(v))])) : "";
}

/** An alias move's note as text with links: the run that moved it, its gate and reasons,
 * the approvals, a roll-back; anything else as `key: value`. */
function note(n) {
  if (!n || typeof n !== "object") return n ? String(n) : "";
  const parts = [];
  if (n.run) parts.push(h("p", {}, "by run ", runLink(n.run), " ", lineageLink(`${n.run}/promote`, "lineage")));
  if (n.gate) {
    const reasons = n.gate.reasons || [];
    parts.push(h("p", { class: n.gate.passed ? "gate passed" : "gate failed" }, `${n.gate.passed ? "✓ gate passed" : "✗ gate failed"}${reasons.length ? ":" : ""}`),
      reasons.length ? h("ul", { class: "reasons" }, reasons.map((r) => h("li", {}, r))) : "");
  }
  for (const a of n.approvals || []) {
    parts.push(h("p", {}, `✓ approved at ${a.stage} (role ${a.role}) by ${(a.by || []).join(", ") || "?"}${a.reason ? `: ${a.reason}` : ""}`));
  }
  if (n.rollback_of != null) parts.push(h("p", {}, `roll-back of version ${n.rollback_of}`));
  for (const [k, v] of Object.entries(n)) {
    if (["run", "gate", "approvals", "rollback_of"].includes(k)) continue;
    parts.push(h("p", {}, `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`));
  }
  return h("div", { class: "note-text" }, parts);
}

async function registryPage() {
  fresh();
  const [{ models }] = await Promise.all([api("/api/v1/registry"), whoami()]);
  // An editor moves aliases; a holder of an approval role moves the ones it protects.
  const mayMove = can("move-alias") || ((me && me.grants) || []).some((g) => (g.approves || []).length);
  const sections = models.map((m) => {
    const aliases = Object.entries(m.aliases).map(([alias, version]) => {
      const b = h("button", { type: "button", "data-rollback": `${m.model}@${alias}` }, "Roll back");
      b.addEventListener("click", async () => {
        try {
          const r = await post(`/api/v1/registry/${esc(m.model)}/aliases/${esc(alias)}/rollback`);
          say(`${m.model}@${alias} → version ${r.version}`);
          registryPage().catch(quiet);
        } catch (err) {
          say(`rollback: ${err.message}`, "error");
        }
      });
      return h("li", {}, h("strong", {}, alias), ` → version ${version} `, mayMove ? b : "");
    });
    const trend = m.versions.length > 1
      ? [h("h3", {}, "Metrics version by version"), h("div", { class: "chart-row" }, overTime(m.versions.map((v) => ({ x: v.version, values: v.metrics })), { x: "version", skip: [] }))]
      : "";
    return h("section", { class: "model", "data-model": m.model },
      h("h2", {}, m.model),
      h("ul", { class: "aliases", "aria-label": "aliases" }, aliases),
      trend,
      h("table", { class: "versions" }, h("caption", {}, "Versions"),
        h("thead", {}, h("tr", {}, ["Version", "Registered", "Made by", "Metrics", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, [...m.versions].reverse().map((v) => h("tr", {},
          h("td", {}, v.version), h("td", {}, when(v.registered_at)),
          h("td", {}, v.source && v.source.run ? [runLink(v.source.run), ` ${v.source.stage || ""}`] : ""),
          h("td", {}, metrics(v.metrics)),
          h("td", {}, h("a", { href: `#/lineage?target=${esc(`${m.model}@${v.version}`)}`, "data-lineage": `${m.model}@${v.version}` }, "lineage")))))),
      h("table", { class: "alias-history" }, h("caption", {}, "Alias history"),
        h("thead", {}, h("tr", {}, ["When", "Alias", "From", "To", "Who", "Note"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, [...m.history].reverse().map((e) => h("tr", {},
          h("td", {}, when(e.at)), h("td", {}, e.alias), h("td", {}, e.from ?? "-"), h("td", {}, e.version),
          h("td", {}, e.who || ""), h("td", {}, note(e.note)))))));
  });
  show(h("h1", {}, "Registry"), ...(models.length ? sections : [h("p", {}, "No models registered yet.")]));
}

// ---- schedules --------------------------------------------------------------------

async function schedulesPage() {
  fresh();
  const [{ schedules }] = await Promise.all([api("/api/v1/schedules"), whoami()]);
  const act = (label, path) => {
    if (!can(label === "Trigger" ? "launch" : "configure")) return "";
    const b = h("button", { type: "button" }, label);
    b.addEventListener("click", async () => {
      try {
        const r = await post(path);
        say(r.run ? `${label}: run ${r.run} queued` : `${label}: done`);
        schedulesPage().catch(quiet);
      } catch (err) {
        say(`${label}: ${err.message}`, "error");
      }
    });
    return b;
  };
  const rows = schedules.map(({ schedule: s, next_tick: next, recent_ticks: ticks }) => h("tr", {},
    h("td", {}, s.pipeline),
    h("td", {}, s.suspended ? "suspended" : "active"),
    h("td", {}, next && next.error ? next.error : next ? [next.local, h("br"), h("small", {}, next.utc)] : "never"),
    h("td", {}, h("ul", { class: "ticks" }, ticks.slice(0, 5).map((t) => h("li", {}, when(t.scheduled_time), " ", t.outcome, " ", t.run_id ? runLink(t.run_id) : "", t.reason ? ` (${t.reason})` : "")))),
    h("td", {}, s.suspended ? act("Resume", `/api/v1/schedules/${esc(s.pipeline)}/resume`) : act("Suspend", `/api/v1/schedules/${esc(s.pipeline)}/suspend`),
      " ", act("Trigger", `/api/v1/schedules/${esc(s.pipeline)}/trigger`))));
  show(h("h1", {}, "Schedules"), schedules.length
    ? h("table", {}, h("thead", {}, h("tr", {}, ["Pipeline", "State", "Next tick", "Last ticks", ""].map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows))
    : h("p", {}, "No schedules: `drivetrain serve --pipelines DIR` keeps those of its pipelines with a `schedule:`."));
}

// ---- triggers and notifications ---------------------------------------------------

async function triggersPage() {
  fresh();
  const [{ triggers }, outbox] = await Promise.all([api("/api/v1/triggers"), api("/api/v1/notifications?state=dead&limit=100"), whoami()]);
  const act = (label, path) => {
    if (!can("configure")) return "";
    const b = h("button", { type: "button" }, label);
    b.addEventListener("click", async () => {
      try {
        const r = await post(path);
        say(`${label}: done${r.skipped ? `, ${r.skipped} skipped` : ""}`);
        triggersPage().catch(quiet);
      } catch (err) {
        say(`${label}: ${err.message}`, "error");
      }
    });
    return b;
  };
  const lag = (s) => (s == null ? "-" : s < 90 ? `${Math.round(s)} s` : `${Math.round(s / 60)} min`);
  const rows = triggers.map((t) => {
    const base = `/api/v1/triggers/${esc(t.pipeline)}/${esc(t.trigger)}`;
    const actions = t.paused
      ? [act("Resume, replay queued", `${base}/resume?queued=replay`), " ", act("Resume, skip queued", `${base}/resume?queued=skip`)]
      : [act("Pause", `${base}/pause`)];
    return h("tr", { "data-trigger": `${t.pipeline}/${t.trigger}` },
      h("td", {}, `${t.pipeline}/${t.trigger}`),
      h("td", {}, t.paused ? "paused" : "active"),
      h("td", {}, h("code", {}, t.cursor ?? "-")),
      h("td", { class: "num" }, String(t.waiting)),
      h("td", { class: "num" }, lag(t.lag_seconds)),
      h("td", { class: "num" }, `${t.consumed} / ${t.skipped}`),
      h("td", {}, t.last_reason ?? "-", t.evaluated_at ? [h("br"), h("small", {}, when(t.evaluated_at))] : ""),
      h("td", {}, ...actions));
  });
  const dead = outbox.notifications.map((n) => h("tr", { "data-notification": n.id },
    h("td", {}, when(n.created_at)), h("td", {}, runLink(n.run_id)), h("td", {}, n.event),
    h("td", { class: "num" }, String(n.attempts)), h("td", {}, n.last_error ?? "")));
  const c = outbox.counts;
  show(h("h1", {}, "Triggers"), triggers.length
    ? h("table", {}, h("thead", {}, h("tr", {}, ["Trigger", "State", "Cursor", "Waiting", "Lag", "Consumed / skipped", "Last decision", ""].map((x) => h("th", { scope: "col" }, x)))), h("tbody", {}, rows))
    : h("p", {}, "No triggers: `drivetrain serve --pipelines DIR` keeps those of its pipelines with `triggers:`."),
    h("h2", {}, "Notifications"),
    h("p", {}, `${c.pending ?? 0} pending, ${c.delivered ?? 0} delivered, ${c.dead ?? 0} dead.`),
    dead.length
      ? h("table", { "aria-label": "dead letters" }, h("thead", {}, h("tr", {}, ["When", "Run", "Event", "Attempts", "Last error"].map((x) => h("th", { scope: "col" }, x)))), h("tbody", {}, dead))
      : h("p", {}, "No dead letters."));
}

// ---- people: approvals and the audit log --------------------------------------------

/** An approval's evidence as text: each upstream stage's values and outputs, with a link
 * into its lineage. */
function evidence(ev) {
  const stages = Object.entries((ev && ev.stages) || {});
  if (!stages.length) return h("p", {}, "No upstream stage left evidence.");
  return h("dl", { class: "evidence" }, stages.flatMap(([stage, e]) => [
    h("dt", {}, stage, " ", h("a", { href: `#/lineage?target=${encodeURIComponent(e.lineage)}` }, "lineage")),
    h("dd", {},
      Object.entries(e.values || {}).map(([k, v]) => h("span", { class: "value", "data-value": k }, `${k} ${typeof v === "string" ? v : JSON.stringify(v)}`, " ")),
      Object.entries(e.outputs || {}).map(([name, o]) => h("span", { class: "output" }, `${name} `, h("code", {}, String(o.digest || "").slice(0, 19)), " "))),
  ]));
}

async function approvalsPage() {
  fresh();
  const [{ approvals }] = await Promise.all([api("/api/v1/approvals?limit=200"), whoami()]);
  const decide = (a, verdict, comment) => async () => {
    try {
      const r = await post(`/api/v1/runs/${esc(a.run)}/stages/${esc(a.stage)}/${verdict}`, comment.value ? { comment: comment.value } : {});
      say(`${verdict}: ${r.outcome ? r.outcome : `counted, ${r.votes.filter((v) => v.decision === "approve").length} of ${r.min}`}`);
      approvalsPage().catch(quiet);
    } catch (err) {
      say(`${verdict}: ${err.message}`, "error");
    }
  };
  const rows = approvals.map((a) => {
    const yes = a.votes.filter((v) => v.decision === "approve").length;
    const comment = h("input", { type: "text", "aria-label": `comment on ${a.run}/${a.stage}`, placeholder: "why" });
    const mine = !a.outcome && approves(a.role, a.project);
    return h("tr", { "data-approval": `${a.run}/${a.stage}` },
      h("td", {}, runLink(a.run), " ", a.stage, h("br"), h("small", {}, a.pipeline, " · ", a.project)),
      h("td", {}, a.outcome ? a.outcome : "waiting", h("br"), h("small", {}, a.reason || (a.timeout_at ? `times out ${when(a.timeout_at)} (${a.on_timeout})` : ""))),
      h("td", {}, `${yes} of ${a.min} by role ${a.role}`, h("ul", { class: "votes" }, a.votes.map((v) => h("li", {}, `${v.subject} ${v.decision}`, v.comment ? `: ${v.comment}` : "")))),
      h("td", {}, evidence(a.evidence)),
      h("td", {}, mine ? [comment, " ",
        h("button", { type: "button", onclick: decide(a, "approve", comment) }, "Approve"), " ",
        h("button", { type: "button", onclick: decide(a, "reject", comment) }, "Reject")] : ""));
  });
  show(h("h1", {}, "Approvals"), approvals.length
    ? h("table", {}, h("thead", {}, h("tr", {}, ["Run and stage", "State", "Decided by", "Evidence", ""].map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows))
    : h("p", {}, "No approvals: a stage with `approval:` asks here when its run reaches it."));
}

async function auditPage() {
  fresh();
  await whoami();
  if (!can("read-audit")) {
    show(h("h1", {}, "Audit log"), h("p", {}, "Reading the audit log needs the admin role."));
    return;
  }
  const { entries } = await api("/api/v1/audit?limit=1000");
  const change = (e) => [e.before ? `before ${JSON.stringify(e.before)}` : "", e.after ? ` after ${JSON.stringify(e.after)}` : ""].join("");
  const rows = entries.slice().reverse().map((e) => h("tr", { "data-seq": String(e.seq), class: `decision-${e.decision}` },
    h("td", { class: "num" }, String(e.seq)), h("td", {}, when(e.at)), h("td", {}, e.subject),
    h("td", {}, e.action), h("td", {}, h("code", {}, e.resource)), h("td", {}, e.project),
    h("td", {}, e.decision), h("td", {}, e.reason || "", h("br"), h("small", {}, change(e)))));
  show(h("h1", {}, "Audit log"), h("p", {}, "Every mutating request, allowed or denied, newest first; nothing edits or deletes it."),
    h("table", {}, h("thead", {}, h("tr", {}, ["#", "When", "Who", "What", "Resource", "Project", "Decision", "Why and what changed"].map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows)));
}

// ---- routing ----------------------------------------------------------------------

async function route() {
  const hash = location.hash.slice(1) || "/runs";
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.section === parts[0]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }

  const started = performance.now();
  try {
    if (parts[0] === "runs" && parts[1] && current && current.run === parts[1]) current.select(parts[2]);
    else if (parts[0] === "runs" && parts[1]) await runPage(parts[1], parts[2]);
    else if (parts[0] === "lineage") await lineagePage(query);
    else if (parts[0] === "compare") {
      const ids = (new URLSearchParams(query).get("runs") || "").split(",").filter(Boolean).slice(0, 5);
      show(...await comparePage(ids, { api, runLink, signal: fresh() }));
    }
    else if (parts[0] === "registry") await registryPage();
    else if (parts[0] === "schedules") await schedulesPage();
    else if (parts[0] === "triggers") await triggersPage();
    else if (parts[0] === "approvals") await approvalsPage();
    else if (parts[0] === "audit") await auditPage();
    else await runsPage(query);
  } catch (e) {
    show(h("h1", {}, "Cannot show this"), h("p", { class: "error" }, e.message));
  }
  // How long the page took to show, from the route to the drawing (read by the benchmark).
  document.body.dataset.shownMs = String(Math.round(performance.now() - started));
}

document.getElementById("token").value = token;
document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("drivetrain-token", token);
  me = null;
  say("");
  route();
});
window.addEventListener("hashchange", route);
whoami().then(route);
