// Charts as SVG: a line chart of numeric series and a grouped bar chart. Each is a
// <figure> with a caption, a text table of the same numbers (for screen readers and
// copying), and one `data-series` group per series whose `data-points` holds its points
// as JSON, so tests and tools read what is drawn. Series differ by colour (Okabe–Ito),
// dash and marker shape, and are named in a legend.

import { h, num } from "./dom.js";

const COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"];
const DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4", ""];
const W = 340, H = 190, L = 52, R = 10, T = 12, B = 34;

function ticks(lo, hi, n = 4) {
  if (lo === hi) return [lo];
  const raw = (hi - lo) / n;
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * p).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

function marker(i, x, y, colour) {
  const shape = i % 3;
  if (shape === 0) return h("svg:circle", { cx: x, cy: y, r: 3, fill: colour });
  if (shape === 1) return h("svg:rect", { x: x - 3, y: y - 3, width: 6, height: 6, fill: colour });
  return h("svg:path", { d: `M${x},${y - 4} L${x + 4},${y + 3} L${x - 4},${y + 3} z`, fill: colour });
}

function table(head, rows) {
  return h("details", { class: "chart-data" }, h("summary", {}, "numbers"),
    h("table", {}, h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, typeof c === "number" ? num(c) : c)))))));
}

function legend(names) {
  return names.length < 2 ? "" : h("p", { class: "chart-legend" }, names.map((n, i) => h("span", { class: "key" },
    h("svg:svg", { width: 22, height: 10, "aria-hidden": "true" },
      h("svg:line", { x1: 1, x2: 21, y1: 5, y2: 5, stroke: COLOURS[i % COLOURS.length], "stroke-width": 2, "stroke-dasharray": DASHES[i % DASHES.length] })), ` ${n}`)));
}

/**
 * A line chart: `series` [{name, points: [[x, y], …]}], axes named `x` and `y`,
 * `xLabels` (x → text) where x is an index.
 */
export function lineChart({ title, series, x: xName = "", y: yName = "", xLabels = null }) {
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.1, y1 + Math.abs(y1 || 1) * 0.1];
  const px = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
  const py = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const grid = h("svg:g", { class: "grid" });
  for (const v of ticks(y0, y1)) grid.append(h("svg:line", { x1: L, x2: W - R, y1: py(v), y2: py(v) }), h("svg:text", { x: L - 4, y: py(v) + 4, class: "y" }, num(v)));
  const xt = xLabels ? xs.filter((v, i, a) => a.indexOf(v) === i) : ticks(x0, x1);
  const every = Math.ceil(xt.length / 6);
  xt.forEach((v, i) => {
    if (i % every) return;
    grid.append(h("svg:text", { x: px(v), y: H - B + 14, class: "x" }, xLabels ? xLabels(v) : num(v)));
  });
  grid.append(h("svg:text", { x: (L + W - R) / 2, y: H - 4, class: "x name" }, xName));
  const lines = series.map((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ");
    return h("svg:g", { class: "series", "data-series": s.name, "data-points": JSON.stringify(s.points) },
      h("svg:path", { d, stroke: colour, "stroke-dasharray": DASHES[i % DASHES.length] }),
      s.points.map((p) => marker(i, px(p[0]), py(p[1]), colour)));
  });
  const names = series.map((s) => s.name);
  const caption = `${title}${yName && yName !== title ? ` (${yName})` : ""}`;
  const rows = [...new Set(xs)].sort((a, b) => a - b).map((xv) => [xLabels ? xLabels(xv) : xv,
    ...series.map((s) => { const p = s.points.find((q) => q[0] === xv); return p ? p[1] : ""; })]);
  return h("figure", { class: "chart", "data-chart": title },
    h("svg:svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${caption}: ${names.join(", ")} by ${xName || "x"}` }, grid, lines),
    h("figcaption", {}, caption), legend(names), table([xName || "x", ...names], rows));
}

/** Grouped bars: `categories` (names) and `series` [{name, values}] (a value a category). */
export function barChart({ title, categories, series }) {
  const ys = series.flatMap((s) => s.values).filter((v) => typeof v === "number");
  const y1 = Math.max(0, ...ys), y0 = Math.min(0, ...ys);
  const width = Math.max(W, L + R + categories.length * (series.length * 12 + 14));
  const py = (v) => T + (1 - (v - y0) / ((y1 - y0) || 1)) * (H - T - B - 20);
  const slot = (width - L - R) / categories.length;
  const bw = Math.min(16, (slot - 8) / series.length);
  const grid = h("svg:g", { class: "grid" });
  for (const v of ticks(y0, y1 || 1)) grid.append(h("svg:line", { x1: L, x2: width - R, y1: py(v), y2: py(v) }), h("svg:text", { x: L - 4, y: py(v) + 4, class: "y" }, num(v)));
  categories.forEach((c, i) => grid.append(h("svg:text", { x: L + slot * i + slot / 2, y: H - B - 4, class: "x cat", transform: `rotate(20 ${L + slot * i + slot / 2} ${H - B - 4})` }, c.length > 16 ? `${c.slice(0, 15)}…` : c)));
  const groups = series.map((s, j) => h("svg:g", { class: "series", "data-series": s.name, "data-points": JSON.stringify(categories.map((c, i) => [c, s.values[i]])) },
    categories.map((c, i) => typeof s.values[i] !== "number" ? "" : h("svg:rect", {
      x: L + slot * i + (slot - bw * series.length) / 2 + j * bw, y: Math.min(py(s.values[i]), py(0)), width: Math.max(1, bw - 2),
      height: Math.abs(py(0) - py(s.values[i])), fill: COLOURS[j % COLOURS.length], class: `pattern-${j % 3}`,
    }, h("svg:title", {}, `${c}, ${s.name}: ${num(s.values[i])}`)))));
  return h("figure", { class: "chart", "data-chart": title },
    h("svg:svg", { width, height: H, viewBox: `0 0 ${width} ${H}`, role: "img", "aria-label": `${title}: ${series.map((s) => s.name).join(" vs ")} for ${categories.length} categories` }, grid, groups),
    h("figcaption", {}, title), legend(series.map((s) => s.name)),
    table(["", ...series.map((s) => s.name)], categories.map((c, i) => [c, ...series.map((s) => s.values[i] ?? "")])));
}

/**
 * Numbers recorded again and again (a stage's values run after run, a model's metrics
 * version after version) as charts: one per key, a number its own line, an object of
 * numbers one line a field. `entries` [{x, values}]; at most `max` charts.
 */
export function overTime(entries, { x, xLabels, skip = [], max = 8 }) {
  const keys = new Map();
  for (const e of entries) {
    for (const [k, v] of Object.entries(e.values || {})) {
      if (skip.includes(k)) continue;
      if (typeof v === "number") (keys.get(k) || keys.set(k, new Map()).get(k)).set(k, null);
      else if (v && typeof v === "object" && !Array.isArray(v)) {
        for (const [k2, v2] of Object.entries(v)) if (typeof v2 === "number") (keys.get(k) || keys.set(k, new Map()).get(k)).set(k2, null);
      }
    }
  }
  const charts = [];
  for (const [k, fields] of keys) {
    const series = [...fields.keys()].map((f) => ({
      name: f,
      points: entries.map((e) => [e.x, f === k ? e.values[k] : (e.values[k] || {})[f]]).filter((p) => typeof p[1] === "number"),
    })).filter((s) => s.points.length);
    // Fields of one size share a chart (counts per rule; rates); a count beside rates
    // gets its own, so neither flattens the other.
    const size = (s) => Math.max(1, ...s.points.map((p) => Math.abs(p[1])));
    series.sort((a, b) => size(a) - size(b));
    let group = [];
    const flush = () => {
      if (!group.length) return;
      const title = group.length === 1 && group[0].name !== k ? `${k}.${group[0].name}` : k;
      charts.push(lineChart({ title, series: group, x, xLabels }));
      group = [];
    };
    for (const s of series) {
      if (group.length && size(s) > 20 * size(group[0])) flush();
      group.push(s);
    }
    flush();
  }
  return charts.slice(0, max);
}

/** A stage's `series` (docs/spec.md): charts, and how many points were left out. */
export function recordedSeries(series) {
  const charts = [];
  let dropped = 0;
  for (const [name, s] of Object.entries(series || {})) {
    const raw = Array.isArray(s) ? s.map((v, i) => [i + 1, v]) : (s && s.points) || [];
    const points = raw.filter((p) => Array.isArray(p) && p.length === 2 && p.every((v) => typeof v === "number" && isFinite(v)));
    dropped += raw.length - points.length;
    if (points.length) charts.push(lineChart({ title: name, series: [{ name, points }], x: Array.isArray(s) ? "" : s.x || "", y: name }));
  }
  return { charts, dropped };
}
