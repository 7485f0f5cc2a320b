// A search stage's trials: a sortable table (only the params that differ between
// trials), every trial's learning curve overlaid (pruned, failed and stale trials faded),
// and a parallel-coordinates plot of the params against the metric. Each drawn trial
// carries `data-trial` (and the plot's lines `data-values`), so tests read what is drawn.

import { h, num } from "./dom.js";
import { lineChart } from "./charts.js";

const ENDED_EARLY = new Set(["pruned", "failed", "stale"]);

/** The params whose values differ between trials, in the order the first trial has them. */
function differing(trials) {
  if (!trials.length) return [];
  return Object.keys(trials[0].params).filter((k) => {
    const first = JSON.stringify(trials[0].params[k]);
    return trials.some((t) => JSON.stringify(t.params[k]) !== first);
  });
}

function cell(v) {
  if (v === null || v === undefined) return "–";
  return typeof v === "number" ? num(v) : typeof v === "string" ? v : JSON.stringify(v);
}

/** The trials table: sorted by the metric (best first) until a header is chosen. */
function table(page) {
  const params = differing(page.trials);
  const cols = [
    { name: "Trial", key: (t) => t.index, text: (t) => t.id },
    { name: "State", key: (t) => t.state, text: (t) => t.state },
    { name: "Rung", key: (t) => t.rung, text: (t) => t.rung },
    { name: "Steps", key: (t) => t.steps, text: (t) => t.steps },
    { name: page.metric, key: (t) => t.metric, text: (t) => cell(t.metric) },
    ...params.map((p) => ({ name: p, key: (t) => t.params[p], text: (t) => cell(t.params[p]) })),
  ];
  const body = h("tbody");
  const better = page.goal === "maximize" ? -1 : 1;
  let order = { col: 4, dir: better };
  const heads = cols.map((c, i) => h("th", { scope: "col", "aria-sort": "none" },
    h("button", { type: "button", class: "link", "data-sort": c.name, onclick: () => sort(i) }, c.name)));
  const fill = () => {
    const c = cols[order.col];
    const rows = [...page.trials].sort((a, b) => {
      const [x, y] = [c.key(a), c.key(b)];
      if (x === y) return a.index - b.index;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * order.dir;
    });
    body.replaceChildren(...rows.map((t) => h("tr", { "data-trial": t.id, class: ENDED_EARLY.has(t.state) ? "faded" : "" },
      cols.map((col, i) => h(i ? "td" : "th", { scope: i ? null : "row", class: i >= 2 ? "num" : "" }, col.text(t))))));
    heads.forEach((th, i) => th.setAttribute("aria-sort", i === order.col ? (order.dir > 0 ? "ascending" : "descending") : "none"));
  };
  const sort = (i) => {
    order = { col: i, dir: order.col === i ? -order.dir : 1 };
    fill();
  };
  fill();
  const states = {};
  for (const t of page.trials) states[t.state] = (states[t.state] || 0) + 1;
  const summary = Object.entries(states).map(([s, n]) => `${n} ${s}`).join(", ");
  return h("table", { class: "trials", id: "trials" },
    h("caption", {}, `Trials (${page.method}): ${summary}`),
    h("thead", {}, h("tr", {}, heads)), body);
}

/** Every trial's curve of the metric, the ones that ended early faded. */
function curves(page) {
  const drawn = page.curves.filter((c) => c.points.length);
  if (!drawn.length) return "";
  const chart = lineChart({ title: page.metric, series: drawn.map((c) => ({ name: c.trial, points: c.points })), x: "step", y: page.metric });
  const state = Object.fromEntries(page.trials.map((t) => [t.id, t.state]));
  for (const g of chart.querySelectorAll("g.series")) {
    const id = g.getAttribute("data-series");
    g.setAttribute("data-trial", id);
    if (ENDED_EARLY.has(state[id])) g.classList.add("faded");
  }
  chart.classList.add("learning-curves");
  return chart;
}

/** Parallel coordinates: an axis per differing numeric param and one for the metric;
 * a line per trial with a metric, the best darkest. Params spanning more than a
 * hundredfold are drawn on a log scale. */
function parallel(page) {
  const params = differing(page.trials).filter((p) => page.trials.every((t) => typeof t.params[p] === "number"));
  const done = page.trials.filter((t) => typeof t.metric === "number");
  if (!done.length || !params.length) return "";
  const axes = [...params.map((p) => ({ name: p, of: (t) => t.params[p] })), { name: page.metric, of: (t) => t.metric }];
  const W = 120 * axes.length + 40, H = 220, T = 20, B = 30;
  for (const a of axes) {
    const vs = done.map(a.of);
    a.lo = Math.min(...vs);
    a.hi = Math.max(...vs);
    a.log = a.lo > 0 && a.hi / a.lo > 100;
    const f = a.log ? Math.log10 : (v) => v;
    a.y = (v) => (a.hi === a.lo ? (T + H - B) / 2 : T + (1 - (f(v) - f(a.lo)) / (f(a.hi) - f(a.lo))) * (H - T - B));
  }
  const x = (i) => 30 + i * 120;
  const ranked = [...done].sort((a, b) => (a.metric - b.metric) * (page.goal === "maximize" ? -1 : 1));
  const place = new Map(ranked.map((t, i) => [t.id, i]));
  // The best drawn last, on top.
  const lines = [...ranked].reverse().map((t) => {
    const rank = place.get(t.id);
    const shade = Math.round(40 + 170 * (rank / Math.max(1, done.length - 1)));
    const values = axes.map((a) => a.of(t));
    return h("svg:polyline", {
      points: axes.map((a, i) => `${x(i)},${a.y(values[i]).toFixed(1)}`).join(" "),
      stroke: `rgb(${shade},${shade},${Math.min(255, shade + 60)})`, "stroke-width": rank === 0 ? 3 : 1.5, fill: "none",
      "data-trial": t.id, "data-values": JSON.stringify(values),
    }, h("svg:title", {}, `${t.id}: ${axes.map((a, i) => `${a.name}=${num(values[i])}`).join(", ")}`));
  });
  const drawnAxes = axes.map((a, i) => h("svg:g", { class: "axis", "data-axis": a.name },
    h("svg:line", { x1: x(i), x2: x(i), y1: T, y2: H - B, stroke: "#555" }),
    h("svg:text", { x: x(i), y: H - B + 16, "text-anchor": "middle" }, `${a.name}${a.log ? " (log)" : ""}`),
    h("svg:text", { x: x(i) + 4, y: T - 6 }, num(a.hi)),
    h("svg:text", { x: x(i) + 4, y: H - B - 2 }, num(a.lo))));
  return h("figure", { class: "chart parallel", "data-chart": "parallel coordinates" },
    h("svg:svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `parallel coordinates of ${params.join(", ")} against ${page.metric}, one line per trial` }, drawnAxes, lines),
    h("figcaption", {}, `Params against ${page.metric} (the best trial darkest and thickest)`));
}

/** The trials section of a search stage's panel, filled once the API answers. */
export function trialsSection(page) {
  return h("section", { class: "search", "aria-label": "trials" },
    table(page),
    h("div", { class: "chart-row" }, curves(page), parallel(page)));
}
