// The one way the web view makes elements: text from the server only ever becomes text
// nodes and attribute values, never HTML.

/** An element: h("a", {href: "#/"}, "text", child); "svg:rect" makes an SVG element. */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A number as people read it: 0.0163 → "0.0163", 1234.5 → "1,234.5". */
export function num(v) {
  if (typeof v !== "number" || !isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.001 || a >= 1e7)) return v.toExponential(2);
  return v.toLocaleString("en", { maximumSignificantDigits: 4 });
}

/** Phases as words and marks as well as colours (Okabe–Ito, safe for colour blindness). */
export const MARK = {
  Pending: "○", Running: "▶", Succeeded: "✓", Failed: "✗", Error: "!", Skipped: "–",
  Omitted: "–", Cancelled: "■", Waiting: "⏸", Preempted: "↺",
};

/**
 * How a phase is shown: an orphaned run (its engine stopped beating) and a lost attempt
 * (its process or node vanished) say so, rather than ▶ Running with a growing bar or
 * ✗ Failed. `{cls, mark, word}`: a class suffix, a mark and the words.
 */
export function seen(phase, { orphaned = false, reason = "" } = {}) {
  // An orphaned run's running run, stages, attempts and items: none runs any more.
  if (orphaned && phase === "Running") {
    return { cls: "Orphaned", mark: "⚠", word: `${phase} (orphaned)` };
  }
  if ((phase === "Failed" || phase === "Error") && /^lost\b/.test(reason || "")) {
    return { cls: "Lost", mark: "⚠", word: "Lost" };
  }
  return { cls: phase, mark: MARK[phase] || "", word: phase };
}
