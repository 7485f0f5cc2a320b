// Two to five runs side by side: a row for each param, the code each ran (its pipeline
// folder's commit, and the digest of each file a command named), each stage's phase and
// values, and the best trial of each search; only the rows that differ unless all are
// asked for. Under it, each search's best trial's curve of its metric, one line a run.
// Rows carry `data-key` and their cells `data-run`, so tests read what is shown.

import { h, num } from "./dom.js";
import { lineChart } from "./charts.js";

/** `v`'s leaves as `prefix.KEY…` entries of `into` (4 levels at most; `series` left out). */
function flatten(prefix, v, into, depth = 0) {
  if (v && typeof v === "object" && !Array.isArray(v) && depth < 4) {
    for (const [k, x] of Object.entries(v)) if (k !== "series") flatten(`${prefix}.${k}`, x, into, depth + 1);
  } else if (v !== undefined) {
    into[prefix] = v;
  }
}

/** What one run shows: key → value. */
function column(detail) {
  const col = { pipeline: detail.run.pipeline, phase: detail.run.phase };
  flatten("params", detail.run.params || {}, col);
  const code = detail.stages.map((s) => s.provenance && s.provenance.code).find((c) => c);
  if (code) flatten("code", code, col);
  for (const s of detail.stages) {
    col[`${s.stage}.phase`] = s.phase;
    const parts = (s.provenance && s.provenance.components) || {};
    for (const [k, v] of Object.entries(parts)) if (k.startsWith("file:")) col[`${s.stage}.${k}`] = v;
    if (s.values && typeof s.values === "object") flatten(`${s.stage}.values`, s.values, col);
  }
  return col;
}

function text(v) {
  if (v === undefined || v === null) return "–";
  if (typeof v === "number") return num(v);
  return typeof v === "string" ? v : JSON.stringify(v);
}

/** The compare page of `ids` (2 to 5): `api` reads the API, `runLink` links a run. */
export async function comparePage(ids, { api, runLink, signal }) {
  const details = await Promise.all(ids.map((id) => api(`/api/v1/runs/${encodeURIComponent(id)}`, { signal })));
  const cols = details.map(column);
  const keys = [...new Set(cols.flatMap((c) => Object.keys(c)))].sort();
  const same = (k) => cols.every((c) => JSON.stringify(c[k]) === JSON.stringify(cols[0][k]));
  const body = h("tbody");
  const all = h("input", { type: "checkbox", id: "compare-all" });
  const fill = () => {
    const shown = keys.filter((k) => all.checked || !same(k));
    body.replaceChildren(...shown.map((k) => h("tr", { "data-key": k },
      h("th", { scope: "row" }, k),
      cols.map((c, i) => h("td", { "data-run": ids[i] }, text(c[k]))))));
    if (!shown.length) body.append(h("tr", {}, h("td", { colspan: ids.length + 1 }, "The runs differ in nothing compared.")));
  };
  all.addEventListener("change", fill);
  fill();
  const table = h("table", { class: "compare", id: "compare" },
    h("caption", {}, `${ids.length} runs side by side`),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), ids.map((id) => h("th", { scope: "col" }, runLink(id))))),
    body);
  const charts = h("div", { class: "chart-row" });
  // Each search's best trial's curve, a line a run.
  const searches = [...new Set(details.flatMap((d) => d.stages.filter((s) => s.values && s.values.best && "trials" in s.values).map((s) => s.stage)))];
  for (const stage of searches) {
    const pages = await Promise.all(ids.map((id) => api(`/api/v1/runs/${encodeURIComponent(id)}/stages/${encodeURIComponent(stage)}/trials`, { signal }).catch(() => null)));
    const series = [];
    pages.forEach((p, i) => {
      const best = details[i].stages.find((s) => s.stage === stage);
      const trial = best && best.values.best && best.values.best.trial;
      const curve = p && p.curves.find((c) => c.trial === trial);
      if (curve && curve.points.length) series.push({ name: `${ids[i]} (${trial})`, points: curve.points, run: ids[i] });
    });
    if (!series.length) continue;
    const metric = pages.find((p) => p) ? pages.find((p) => p).metric : "metric";
    const chart = lineChart({ title: `${stage}: ${metric} of the best trial`, series, x: "step", y: metric });
    chart.querySelectorAll("g.series").forEach((g, i) => g.setAttribute("data-run", series[i].run));
    charts.append(chart);
  }
  return [h("h1", {}, "Compare runs"),
    h("p", {}, h("label", {}, all, " every row, also those the runs share")),
    table, charts];
}
