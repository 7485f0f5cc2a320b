// A laid-out graph (the API's `layout`: a layered drawing made by the server, its layers
// going right or down) in a view that pans (drag), zooms (wheel, + and -, the buttons)
// and is walked with the keyboard: arrows go to the node upstream, downstream or beside,
// Enter opens it. It is never drawn smaller than its text can be read. Every edge
// carries `data-from` and `data-to`; every node `data-node`.

import { h } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";

/** The smallest text the view shows, in px at scale 1 (`.dag .node text.sub`). */
const SMALLEST_TEXT = 11;
/** The smallest on-screen text size a first paint (or Fit) may give. */
const READABLE = 11;

/** An edge's path through its points: straight along the flow at each end, a curve
 * between layers. */
function pathOf(points, down) {
  let d = `M${points[0][0]},${points[0][1]}`;
  for (let i = 1; i < points.length; i++) {
    const [ax, ay] = points[i - 1];
    const [bx, by] = points[i];
    if (down) {
      const mid = (ay + by) / 2;
      d += ax === bx ? ` L${bx},${by}` : ` C${ax},${mid} ${bx},${mid} ${bx},${by}`;
    } else {
      const mid = (ax + bx) / 2;
      d += ay === by ? ` L${bx},${by}` : ` C${mid},${ay} ${mid},${by} ${bx},${by}`;
    }
  }
  return d;
}

/**
 * The view of `nodes` ([{id, needs}]) at the places `lay` gives. `label(n)` is a node's
 * two lines, `classOf(n)` its class, `onPick(n)` what choosing it does. Returns
 * `{element, paint(id), select(id)}`.
 */
export function graphView(nodes, lay, { label, classOf, onPick, name = "graph" }) {
  const W = lay.node_width, H = lay.node_height;
  const down = lay.flow === "down";
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const after = new Map(nodes.map((n) => [n.id, []]));
  for (const e of lay.edges) if (after.has(e.from)) after.get(e.from).push(e.to);
  // Nodes laid out where the server could not (it failed): one column.
  const at = (id, i) => lay.nodes[id] || [10, 10 + i * (H + 12)];

  const viewport = h("svg:g", { class: "viewport" });
  const svg = h("svg:svg", { class: "dag", role: "group", "aria-label": `${name}: ${nodes.length} node(s), ${lay.edges.length} edge(s)` },
    h("svg:defs", {}, h("svg:marker", { id: "arrow", viewBox: "0 0 8 8", refX: 8, refY: 4, markerWidth: 5, markerHeight: 5, orient: "auto" },
      h("svg:path", { d: "M0,0 L8,4 L0,8 z", class: "arrowhead" }))),
    viewport);
  const edges = h("svg:g", { class: "edges" });
  const edgeEls = new Map(nodes.map((n) => [n.id, []]));
  for (const e of lay.edges) {
    const p = h("svg:path", { d: pathOf(e.points, down), "data-from": e.from, "data-to": e.to, "marker-end": "url(#arrow)" });
    edges.append(p);
    for (const end of [e.from, e.to]) if (edgeEls.has(end)) edgeEls.get(end).push(p);
  }
  viewport.append(edges);
  const els = new Map();
  nodes.forEach((n, i) => {
    const [x, y] = at(n.id, i);
    const [first, second] = label(n);
    const shown = first.length > 26 ? `${first.slice(0, 25)}…` : first;
    // Its accessible name is the text it shows (the full name is its title).
    const g = h("svg:g", {
      class: `node ${classOf(n)}`, transform: `translate(${x},${y})`, tabindex: -1,
      role: "button", "data-node": n.id, "aria-label": `${shown} ${second}`,
    },
      h("svg:title", {}, `${first}\n${second}`),
      h("svg:rect", { width: W, height: H, rx: 6 }),
      h("svg:text", { x: 8, y: 15, class: "name" }, `${shown} `),
      h("svg:text", { x: 8, y: 31, class: "sub" }, second));
    g.addEventListener("click", () => onPick(n));
    g.addEventListener("keydown", (e) => key(e, n));
    g.addEventListener("focus", () => reveal(n.id));
    viewport.append(g);
    els.set(n.id, g);
  });
  if (nodes.length) els.get(nodes[0].id).setAttribute("tabindex", 0);

  // ---- pan and zoom: one transform on the viewport ----
  let k = 1, tx = 0, ty = 0;
  const apply = () => viewport.setAttribute("transform", `translate(${tx},${ty}) scale(${k})`);
  const box = () => svg.getBoundingClientRect();
  const zoom = (f, cx = box().width / 2, cy = box().height / 2) => {
    const k2 = Math.min(2.5, Math.max(0.05, k * f));
    tx = cx - (cx - tx) * (k2 / k);
    ty = cy - (cy - ty) * (k2 / k);
    k = k2;
    apply();
  };
  const fit = () => {
    const b = box();
    // Small enough to see it all, but never so small that its smallest text is below
    // READABLE px: a big graph shows its start, and is panned.
    const least = READABLE / SMALLEST_TEXT;
    k = Math.min(1, Math.max(least, Math.min((b.width || 800) / lay.width, (b.height || 480) / lay.height)));
    tx = Math.max(0, ((b.width || 800) - lay.width * k) / 2);
    ty = 0;
    apply();
  };
  /** Pans so node `id` is in view. */
  const reveal = (id) => {
    const [x, y] = lay.nodes[id] || [0, 0];
    const b = box();
    const [sx, sy] = [x * k + tx, y * k + ty];
    if (sx < 0 || sy < 0 || sx + W * k > b.width || sy + H * k > b.height) {
      tx = b.width / 2 - (x + W / 2) * k;
      ty = b.height / 2 - (y + H / 2) * k;
      apply();
    }
  };
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const b = box();
    zoom(Math.exp(-e.deltaY * 0.0015), e.clientX - b.left, e.clientY - b.top);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    if (e.target.closest(".node")) return;
    drag = { x: e.clientX - tx, y: e.clientY - ty };
    svg.setPointerCapture(e.pointerId);
    svg.classList.add("dragging");
  });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    tx = e.clientX - drag.x;
    ty = e.clientY - drag.y;
    apply();
  });
  const stop = () => {
    drag = null;
    svg.classList.remove("dragging");
  };
  svg.addEventListener("pointerup", stop);
  svg.addEventListener("pointercancel", stop);

  // ---- the keyboard: one node at a time in the tab order (a roving tabindex) ----
  const focus = (id) => {
    const el = els.get(id);
    if (!el) return;
    for (const other of svg.querySelectorAll(".node[tabindex='0']")) other.setAttribute("tabindex", -1);
    el.setAttribute("tabindex", 0);
    el.focus();
  };
  // Along a layer is y (flowing right) or x (flowing down); across layers the other.
  const [ALONG, ACROSS] = down ? [0, 1] : [1, 0];
  /** The node of `ids` nearest to `id` along its layer. */
  const nearest = (id, ids) => {
    const a = (lay.nodes[id] || [0, 0])[ALONG];
    return ids.slice().sort((p, q) => Math.abs((lay.nodes[p] || [0, 0])[ALONG] - a) - Math.abs((lay.nodes[q] || [0, 0])[ALONG] - a))[0];
  };
  const beside = (id, dir) => {
    const at = lay.nodes[id] || [0, 0];
    const same = nodes.map((n) => n.id).filter((o) => o !== id && (lay.nodes[o] || [])[ACROSS] === at[ACROSS])
      .filter((o) => (lay.nodes[o][ALONG] - at[ALONG]) * dir > 0)
      .sort((p, q) => (lay.nodes[p][ALONG] - lay.nodes[q][ALONG]) * dir);
    return same[0];
  };
  // The keys to go to a linked node further on or back across the layers (as the page
  // shows them: right or down), and to the one beside in the layer.
  const KEYS = down
    ? { on: "ArrowDown", back: "ArrowUp", prev: "ArrowLeft", next: "ArrowRight" }
    : { on: "ArrowRight", back: "ArrowLeft", prev: "ArrowUp", next: "ArrowDown" };
  /** The nodes linked to `id` (either way) that lie further across the layers (`dir` 1)
   * or back (-1). */
  const linked = (id, dir) => {
    const at = (lay.nodes[id] || [0, 0])[ACROSS];
    const ends = (after.get(id) || []).concat((byId.get(id).needs || []).filter((u) => byId.has(u)));
    return ends.filter((o) => ((lay.nodes[o] || [0, 0])[ACROSS] - at) * dir > 0);
  };
  function key(e, n) {
    let to;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      onPick(n);
      return;
    }
    if (e.key === KEYS.on) to = nearest(n.id, linked(n.id, 1));
    else if (e.key === KEYS.back) to = nearest(n.id, linked(n.id, -1));
    else if (e.key === KEYS.next) to = beside(n.id, 1);
    else if (e.key === KEYS.prev) to = beside(n.id, -1);
    else if (e.key === "+" || e.key === "=") zoom(1.25);
    else if (e.key === "-") zoom(0.8);
    else return;
    e.preventDefault();
    if (to) focus(to);
  }

  // ---- the chosen node and its neighbours ----
  let chosen = null;
  const select = (id) => {
    for (const el of svg.querySelectorAll(".near")) el.classList.remove("near");
    chosen = id;
    if (!id || !els.has(id)) return;
    for (const p of edgeEls.get(id) || []) {
      p.classList.add("near");
      for (const end of [p.dataset.from, p.dataset.to]) if (end !== id && els.has(end)) els.get(end).classList.add("near");
    }
    focus(id);
  };
  /** Redraws node `id`'s class and lines (its phase changed). */
  const paint = (id) => {
    const el = els.get(id);
    if (!el) return;
    const n = byId.get(id);
    const [first, second] = label(n);
    const near = el.classList.contains("near");
    el.setAttribute("class", `node ${classOf(n)}${id === chosen ? " selected" : ""}${near ? " near" : ""}`);
    el.querySelector(".sub").textContent = second;
    el.querySelector("title").textContent = `${first}\n${second}`;
    el.setAttribute("aria-label", `${el.querySelector(".name").textContent}${second}`);
  };

  const button = (text, title, act) => h("button", { type: "button", title, "aria-label": title, onclick: act }, text);
  const element = h("div", { class: "graph" },
    h("div", { class: "graph-tools" },
      button("+", "zoom in", () => zoom(1.25)), button("−", "zoom out", () => zoom(0.8)), button("Fit", "fit the graph in view", fit),
      h("span", { class: "hint" }, "drag to pan, wheel to zoom; Tab into the graph, arrows move to the linked node that way (or the one beside), Enter opens one")),
    svg);
  // As tall as the graph, within most of the window (a graph flowing down, within a few
  // windows: the page scrolls); fitted once it is on the page.
  const tallest = window.innerHeight * (down ? 3 : 0.7);
  svg.style.height = `${Math.round(Math.max(220, Math.min(lay.height + 16, tallest)))}px`;
  requestAnimationFrame(fit);
  return { element, paint, select, fit };
}
