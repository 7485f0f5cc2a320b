// A run's timeline: one row per stage, one bar per attempt (its phase as colour, mark and
// title), the wait before a stage's first attempt (queued: its upstream had ended, no
// slot yet), an attempt's wait for GPUs (with who held them), the backoff between attempts, a mark where a stage took cached outputs, and
// a map stage's items packed into lanes (as many as ran at once). Every bar carries
// `data-stage`, `data-attempt` (and `data-item`), `data-start` and `data-end`; the drawing
// carries `data-t0` and `data-ms-per-px`, so a bar's place can be checked against times.

import { h, seen } from "./dom.js";

const LABEL = 190, ROW = 20, BAR = 14, AXIS = 24;

const ms = (t) => (t ? Date.parse(t) : NaN);

function span(msTotal) {
  if (msTotal < 1000) return `${Math.round(msTotal)} ms`;
  if (msTotal < 60000) return `${(msTotal / 1000).toFixed(msTotal < 10000 ? 1 : 0)} s`;
  const m = Math.floor(msTotal / 60000);
  return m < 60 ? `${m} min ${Math.round((msTotal % 60000) / 1000)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** Tick spacing of about `want` ms, rounded to 1, 2 or 5 of a power of ten. */
function tickStep(want) {
  const p = 10 ** Math.floor(Math.log10(Math.max(want, 1)));
  return [1, 2, 5, 10].map((f) => f * p).find((s) => s >= want) || p * 10;
}

/** Items into lanes: each goes to the first lane free when it starts. */
function lanes(items, now) {
  const ends = [];
  const out = [];
  for (const it of items.slice().sort((a, b) => ms(a.started_at) - ms(b.started_at))) {
    const start = ms(it.started_at);
    const end = ms(it.finished_at) || now;
    let lane = ends.findIndex((e) => e <= start);
    if (lane < 0) lane = ends.push(0) - 1;
    ends[lane] = end;
    out.push([it, lane]);
  }
  return { placed: out, count: Math.max(1, ends.length) };
}

/** The latest time recorded of `run` (its start, its attempts' and items' starts and ends). */
function lastHeard(run, attempts, items) {
  let last = ms(run.created_at);
  for (const x of [...attempts, ...items]) {
    for (const t of [ms(x.started_at), ms(x.finished_at)]) if (t > last) last = t;
  }
  return last;
}

/**
 * The timeline of `run` with stages `order` (names, in the pipeline's order), `needs`
 * (name → upstream names), `stages` (name → stage record), `attempts` and `items` (the
 * attempts API), `width` in pixels.
 */
export function timeline({ run, order, needs, stages, attempts, items, width }) {
  // An orphaned run's bars stop where it was last heard of, not at the clock.
  const now = run.orphaned ? lastHeard(run, attempts, items) : Date.now();
  const t0 = ms(run.created_at);
  const ended = [ms(run.finished_at)];
  for (const a of attempts) ended.push(ms(a.finished_at) || now);
  for (const it of items) if (it.started_at) ended.push(ms(it.finished_at) || now);
  for (const s of stages.values()) ended.push(ms(s.finished_at));
  const t1 = Math.max(t0 + 1000, ...ended.filter((t) => !isNaN(t)));
  const plot = Math.max(300, width - LABEL - 20);
  const perPx = (t1 - t0) / plot;
  const x = (t) => LABEL + Math.max(0, t - t0) / perPx;

  const byStage = new Map();
  for (const a of attempts) (byStage.get(a.stage) || byStage.set(a.stage, []).get(a.stage)).push(a);
  const itemsOf = new Map();
  for (const it of items) if (it.started_at) (itemsOf.get(it.stage) || itemsOf.set(it.stage, []).get(it.stage)).push(it);

  const rows = [];
  let y = AXIS;
  const bars = h("svg:g", { class: "bars" });
  const labels = h("svg:g", { class: "labels" });
  const bar = (x1, x2, top, cls, data, title) => {
    const r = h("svg:rect", { x: x1.toFixed(2), y: top, width: Math.max(1.5, x2 - x1).toFixed(2), height: BAR, class: cls, ...data },
      h("svg:title", {}, title));
    bars.append(r);
  };
  for (const name of order) {
    const s = stages.get(name);
    const tries = byStage.get(name) || [];
    const its = itemsOf.get(name) || [];
    if (!s && !tries.length) continue;
    const top = y + (ROW - BAR) / 2;
    // Ready: when the last of its upstream stages ended (the run's start for a root).
    const ups = (needs.get(name) || []).map((u) => ms((stages.get(u) || {}).finished_at)).filter((t) => !isNaN(t));
    const ready = ups.length ? Math.max(...ups) : t0;
    const first = tries.length ? ms(tries[0].started_at) : its.length ? Math.min(...its.map((i) => ms(i.started_at))) : NaN;
    if (!isNaN(first) && first - ready > perPx) {
      bar(x(ready), x(first), top, "queued", { "data-stage": name, "data-kind": "queued", "data-start": new Date(ready).toISOString(), "data-end": new Date(first).toISOString() },
        `${name}: queued ${span(first - ready)} (its upstream had ended)`);
    }
    tries.forEach((a, i) => {
      const asked = ms(a.started_at), end = ms(a.finished_at) || now;
      // The wait for GPUs is its own segment, with why it waited.
      const admitted = a.waited_until ? ms(a.waited_until) : asked;
      if (admitted > asked) {
        bar(x(asked), x(admitted), top, "gpu-wait", { "data-stage": name, "data-attempt": a.attempt, "data-kind": "gpu-wait", "data-start": a.started_at, "data-end": a.waited_until },
          `${name} attempt ${a.attempt}: ${a.waited_for || "waiting for GPUs"} (${span(admitted - asked)})`);
      }
      const start = admitted;
      if (i > 0) {
        const prev = ms(tries[i - 1].finished_at);
        if (!isNaN(prev) && start - prev > perPx) {
          bar(x(prev), x(start), top, "backoff", { "data-stage": name, "data-kind": "backoff", "data-start": tries[i - 1].finished_at, "data-end": a.started_at },
            `${name}: retry backoff ${span(start - prev)} before attempt ${a.attempt}`);
        }
      }
      const v = seen(a.phase, { orphaned: run.orphaned, reason: a.reason });
      bar(x(start), x(end), top, `bar phase-${v.cls}`, { "data-stage": name, "data-attempt": a.attempt, "data-start": a.started_at, "data-end": a.finished_at || "" },
        `${name} attempt ${a.attempt}: ${v.mark} ${v.word}, ${span(end - start)}${a.reason ? ` (${a.reason})` : ""}`);
    });
    let height = ROW;
    if (its.length) {
      const { placed, count } = lanes(its, now);
      for (const [it, lane] of placed) {
        const start = ms(it.started_at), end = ms(it.finished_at) || now;
        const v = seen(it.phase, { orphaned: run.orphaned, reason: it.reason });
        bar(x(start), x(end), top + lane * ROW, `bar item phase-${v.cls}`,
          { "data-stage": name, "data-item": it.index, "data-attempt": it.attempts, "data-start": it.started_at, "data-end": it.finished_at || "" },
          `${name} item ${it.index} attempt ${it.attempts}: ${v.word}, ${span(end - start)}`);
      }
      height = count * ROW;
    }
    if (s && !tries.length && !its.length && s.origin && s.origin !== "ran" && s.finished_at) {
      const at = x(ms(s.finished_at));
      bar(at - 3, at + 3, top, "cached", { "data-stage": name, "data-kind": s.origin, "data-start": s.finished_at, "data-end": s.finished_at },
        `${name}: outputs ${s.origin} from run ${s.origin_run}`);
    }
    const shown = seen(s ? s.phase : "Pending", { orphaned: run.orphaned, reason: s && s.reason });
    labels.append(h("svg:text", { x: 4, y: y + ROW / 2 + 4, class: "stage" }, `${shown.mark} ${name.length > 24 ? `${name.slice(0, 23)}…` : name}`,
      its.length ? ` (${its.length} items)` : ""));
    rows.push(name);
    y += height;
  }
  const axis = h("svg:g", { class: "axis" });
  const step = tickStep(perPx * 90);
  for (let t = 0; t <= t1 - t0; t += step) {
    axis.append(h("svg:line", { x1: x(t0 + t), x2: x(t0 + t), y1: AXIS - 6, y2: y }),
      h("svg:text", { x: x(t0 + t) + 2, y: AXIS - 10 }, span(t)));
  }
  const svg = h("svg:svg", {
    class: "timeline", width, height: y + 6, role: "img",
    "aria-label": `timeline of ${rows.length} stage(s) over ${span(t1 - t0)}`,
    "data-t0": new Date(t0).toISOString(), "data-ms-per-px": perPx, "data-label-width": LABEL,
  }, axis, labels, bars);
  const legend = h("p", { class: "legend" }, ["Succeeded", "Failed", "Running", "Cancelled", "Preempted"].map((p) => h("span", { class: `key phase-${p}` }, `${seen(p).mark} ${p}`)),
    h("span", { class: "key queued" }, "queued"), h("span", { class: "key gpu-wait" }, "waiting for GPUs"), h("span", { class: "key backoff" }, "retry backoff"), h("span", { class: "key cached" }, "cached"));
  return h("div", { class: "timeline-box", tabindex: 0, role: "region", "aria-label": "timeline" }, svg, legend);
}
