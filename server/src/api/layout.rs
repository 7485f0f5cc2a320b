//! Where the web view draws a graph's nodes and edges: a layered (Sugiyama) layout, left
//! to right, by the `rust-sugiyama` crate (longest-path ranking, barycentre crossing
//! reduction with transposition, Brandes–Köpf coordinates), computed here so a browser
//! only draws.
//!
//! The crate places nodes only; an edge that skips layers would be drawn straight
//! through the nodes between. So the layout runs twice: once to learn each node's layer,
//! then again with a chain of small dummy nodes along every long edge, whose places are
//! the edge's bends.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use rust_sugiyama::configure::{Config, RankingType};
use serde::Serialize;

/// A node's size along a layer (its height on the page) and across (its width).
pub const NODE_W: f64 = 190.0;
pub const NODE_H: f64 = 38.0;
/// The gap between nodes of a layer, and half the gap between layers.
const SPACING: f64 = 14.0;
/// A bend's height: edges through one layer pass this far apart.
const BEND: f64 = 6.0;

/// The most nodes laid out: a larger graph (a run of 100,000 stages) is answered with
/// no layout ([`Layout::is_empty`]), and the page draws its nodes in a column. The crate
/// recurses as deep as the longest path; [`place`] gives it a stack of its own.
pub const MAX_LAID_OUT: usize = 5_000;
/// The most bends (a point in each layer a long edge crosses); past it, long edges are
/// drawn straight rather than the drawing growing with edges × layers.
const MAX_BENDS: usize = 50_000;
/// The stack the layout runs on: ample for [`MAX_LAID_OUT`] layers of the crate's
/// recursion in a debug build (a 100,000-stage chain overflowed a 2 MiB stack and
/// aborted the server).
const LAYOUT_STACK: usize = 256 << 20;
/// Around the drawing.
const MARGIN: f64 = 10.0;

/// Which way a drawing's layers go: left to right (a run's stages, wide and short) or top
/// to bottom (lineage, a long chain from a model down to its drive logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    #[default]
    Right,
    Down,
}

/// Between the layers of a top-to-bottom drawing, beyond [`SPACING`]: room for the edges.
const DOWN_GAP: f64 = 26.0;

impl Flow {
    /// A node's room as the crate sees it: (along its layer, across layers).
    fn slot(self) -> (f64, f64) {
        match self {
            Flow::Right => (NODE_H, NODE_W),
            Flow::Down => (NODE_W, NODE_H + DOWN_GAP),
        }
    }

    /// A node's drawn size across its layer.
    fn across(self) -> f64 {
        match self {
            Flow::Right => NODE_W,
            Flow::Down => NODE_H,
        }
    }

    /// The page's `[x, y]` of a point `along` a layer and `across` layers.
    fn point(self, along: f64, across: f64) -> [f64; 2] {
        match self {
            Flow::Right => [across, along],
            Flow::Down => [along, across],
        }
    }
}

/// Where to draw a graph: each node's top-left corner, each edge's path (its source's
/// downstream side, its bends, its target's upstream side), and the size of the whole.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Layout {
    pub width: f64,
    pub height: f64,
    pub node_width: f64,
    pub node_height: f64,
    /// Which way the layers go.
    pub flow: Flow,
    /// Node id → `[x, y]` of its top-left corner.
    pub nodes: BTreeMap<String, [f64; 2]>,
    pub edges: Vec<EdgePath>,
}

impl Layout {
    /// No drawing yet: a graph too large to lay out ([`MAX_LAID_OUT`]) stays so.
    pub fn none(flow: Flow) -> Layout {
        Layout {
            width: 0.0,
            height: 0.0,
            node_width: NODE_W,
            node_height: NODE_H,
            flow,
            nodes: BTreeMap::new(),
            edges: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// One edge: `from` → `to`, through `points` (`[x, y]`, first and last on the nodes).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EdgePath {
    pub from: String,
    pub to: String,
    pub points: Vec<[f64; 2]>,
}

/// The layered layout of `nodes` and `edges` (pairs of indices into `nodes`; an edge
/// naming no node is left out), left to right. Components are stacked top to bottom.
pub fn layered(nodes: &[String], edges: &[(usize, usize)]) -> Layout {
    layered_to(nodes, edges, Flow::Right)
}

/// [`layered`], its layers going `flow`.
pub fn layered_to(nodes: &[String], edges: &[(usize, usize)], flow: Flow) -> Layout {
    if nodes.len() > MAX_LAID_OUT {
        return Layout::none(flow);
    }
    let edges: Vec<(usize, usize)> = edges
        .iter()
        .copied()
        .filter(|&(a, b)| a < nodes.len() && b < nodes.len() && a != b)
        .collect();
    // Layers by the crate's `Original` ranking (as early as possible, then as late as
    // its successors allow), not its network simplex: that one took 7 s (release build)
    // on the 1,000-stage DAG of the test below, this one 13 ms.
    let config = Config {
        vertex_spacing: SPACING,
        ranking_type: RankingType::Original,
        ..Config::default()
    };
    // Sizes are (along the layer, across it): the crate stacks layers top to bottom,
    // and `flow` turns that the page's way on the way out.
    let size = flow.slot();
    let first = place(nodes.len(), &[], &edges, size, &config);
    let step = size.1 + SPACING;
    let layer = |i: usize| (first[i].1 / step).round() as i64;

    // Second pass: a dummy in each layer a long edge crosses.
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(edges.len());
    let mut dummies = 0usize;
    let mut linked: Vec<(usize, usize)> = Vec::new();
    let bends: usize = edges
        .iter()
        .map(|&(a, b)| (layer(b) - layer(a)).max(1) as usize - 1)
        .sum();
    for &(a, b) in &edges {
        let span = match bends > MAX_BENDS {
            true => 1,
            false => (layer(b) - layer(a)).max(1) as usize,
        };
        let mut chain = vec![a];
        for _ in 1..span {
            chain.push(nodes.len() + dummies);
            dummies += 1;
        }
        chain.push(b);
        linked.extend(chain.windows(2).map(|w| (w[0], w[1])));
        chains.push(chain);
    }
    let placed = match dummies {
        0 => first,
        _ => place(
            nodes.len(),
            &vec![(BEND, size.1); dummies],
            &linked,
            size,
            &config,
        ),
    };
    out_of(nodes, &placed, chains, flow)
}

/// The page's drawing of `placed` (the crate's centres, `(along, across)`): each node's
/// box and each chain's path, at the margin.
fn out_of(nodes: &[String], placed: &[(f64, f64)], chains: Vec<Vec<usize>>, flow: Flow) -> Layout {
    let (along, slot) = flow.slot();
    let (min_along, min_across) = placed.iter().fold((f64::MAX, f64::MAX), |(a, c), p| {
        (a.min(p.0 - along / 2.0), c.min(p.1 - slot / 2.0))
    });
    // Node `i`: the middle of its side along its layer, and where its box starts across.
    let at = |i: usize| {
        let (a, c) = placed[i];
        let lead = c - slot / 2.0 - min_across + MARGIN + (slot - flow.across()) / 2.0;
        (a - min_along + MARGIN, lead)
    };
    let mut out = Layout {
        edges: Vec::with_capacity(chains.len()),
        ..Layout::none(flow)
    };
    for (i, name) in nodes.iter().enumerate() {
        let (mid, lead) = at(i);
        let [x, y] = flow.point(mid - along / 2.0, lead);
        out.nodes.insert(name.clone(), [x, y]);
        out.width = out.width.max(x + NODE_W + MARGIN);
        out.height = out.height.max(y + NODE_H + MARGIN);
    }
    for chain in chains {
        let (a, b) = (chain[0], chain[chain.len() - 1]);
        let mut points = Vec::with_capacity(chain.len());
        let (mid, lead) = at(a);
        points.push(flow.point(mid, lead + flow.across()));
        for &d in &chain[1..chain.len() - 1] {
            let (mid, lead) = at(d);
            // A dummy is as deep as a layer: the edge enters and leaves it level.
            points.push(flow.point(mid, lead));
            points.push(flow.point(mid, lead + flow.across()));
        }
        let (mid, lead) = at(b);
        points.push(flow.point(mid, lead));
        out.edges.push(EdgePath {
            from: nodes[a].clone(),
            to: nodes[b].clone(),
            points,
        });
    }
    out
}

/// [`layered`] of the nodes named `names` and edges `(from, to)` between names (an edge
/// naming no node is left out).
pub fn by_name<'a>(
    names: &[String],
    edges: impl IntoIterator<Item = (&'a str, &'a str)>,
    flow: Flow,
) -> Layout {
    let at: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let edges: Vec<(usize, usize)> = edges
        .into_iter()
        .filter_map(|(a, b)| Some((*at.get(a)?, *at.get(b)?)))
        .collect();
    layered_to(names, &edges, flow)
}

/// How many layouts [`cached`] keeps (every run of a pipeline shares one; the 1,000-stage
/// DAG of the tests below takes ~0.1 s).
const KEPT: usize = 64;

/// The layout of `key` (a pipeline's digest) made once by `make`, then kept.
pub fn cached(key: &str, make: impl FnOnce() -> Layout) -> Arc<Layout> {
    static KEEP: OnceLock<Mutex<HashMap<String, Arc<Layout>>>> = OnceLock::new();
    let keep = KEEP.get_or_init(Default::default);
    if let Some(l) = keep.lock().unwrap().get(key) {
        return l.clone();
    }
    let made = Arc::new(make());
    let mut keep = keep.lock().unwrap();
    if keep.len() >= KEPT {
        keep.clear();
    }
    keep.insert(key.to_owned(), made.clone());
    made
}

/// The crate's centres `(along, across)` of `n` nodes of `size` and then `extra` nodes of
/// their own sizes, components stacked along the layers.
fn place(
    n: usize,
    extra: &[(f64, f64)],
    edges: &[(usize, usize)],
    size: (f64, f64),
    config: &Config,
) -> Vec<(f64, f64)> {
    let vertices: Vec<(u32, (f64, f64))> = (0..n)
        .map(|i| (i as u32, size))
        .chain(extra.iter().enumerate().map(|(i, s)| ((n + i) as u32, *s)))
        .collect();
    let pairs: Vec<(u32, u32)> = edges.iter().map(|&(a, b)| (a as u32, b as u32)).collect();
    let mut out = vec![(0.0, 0.0); vertices.len()];
    let mut offset = 0.0;
    let config = *config;
    let count = vertices.len();
    let components = std::thread::Builder::new()
        .name("layout".into())
        .stack_size(LAYOUT_STACK)
        .spawn(move || rust_sugiyama::from_vertices_and_edges(&vertices, &pairs, &config))
        .and_then(|t| {
            t.join()
                .map_err(|_| std::io::Error::other("the layout panicked"))
        });
    let Ok(components) = components else {
        // Unplaced: the page draws what has no place in a column.
        return vec![(0.0, 0.0); count];
    };
    for (component, _, _) in components {
        let lo = component
            .iter()
            .map(|(_, (x, _))| *x)
            .fold(f64::MAX, f64::min);
        let hi = component
            .iter()
            .map(|(_, (x, _))| *x)
            .fold(f64::MIN, f64::max);
        for (id, (x, y)) in component {
            out[id] = (x - lo + offset, y);
        }
        offset += hi - lo + size.0 + config.vertex_spacing;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest chain laid out, from a thread of a small stack (the crate recurses
    /// once per layer: a 100,000-stage chain overflowed the server's 2 MiB and aborted
    /// it); one node more is not laid out at all.
    #[test]
    fn a_long_chain_is_laid_out_on_a_stack_of_its_own_and_a_longer_one_not_at_all() {
        let chain = |n: usize| -> (Vec<String>, Vec<(usize, usize)>) {
            (names(n), (1..n).map(|i| (i - 1, i)).collect())
        };
        let (nodes, edges) = chain(MAX_LAID_OUT);
        let laid = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || layered(&nodes, &edges))
            .unwrap()
            .join()
            .expect("laid out");
        assert_eq!(laid.nodes.len(), MAX_LAID_OUT);
        assert_eq!(laid.edges.len(), MAX_LAID_OUT - 1);
        let (nodes, edges) = chain(MAX_LAID_OUT + 1);
        let none = layered(&nodes, &edges);
        assert!(none.is_empty() && none.edges.is_empty());
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    /// The driving loop's shape: a skip edge (0 → 3) bends around the middle layer
    /// instead of crossing a node; every node is right of what it needs.
    #[test]
    fn long_edges_bend_and_layers_go_left_to_right() {
        let edges = [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3), (3, 4)];
        let l = layered(&names(5), &edges);
        assert_eq!(l.edges.len(), 6);
        for &(a, b) in &edges {
            let (pa, pb) = (l.nodes[&format!("s{a}")], l.nodes[&format!("s{b}")]);
            assert!(pa[0] + NODE_W < pb[0], "s{a} left of s{b}: {l:?}");
        }
        let skip = l
            .edges
            .iter()
            .find(|e| e.from == "s0" && e.to == "s3")
            .unwrap();
        assert_eq!(skip.points.len(), 4, "one bend of two points: {skip:?}");
        // The bend is in the middle layer, but off both of its nodes.
        let [bx, by] = skip.points[1];
        for mid in ["s1", "s2"] {
            let [x, y] = l.nodes[mid];
            assert_eq!(bx, x, "the bend is in the middle layer");
            assert!(by < y || by > y + NODE_H, "the bend misses {mid}: {l:?}");
        }
        let short = l.edges.iter().find(|e| e.from == "s3").unwrap();
        assert_eq!(short.points.len(), 2);
        assert_eq!(short.points[0][0], l.nodes["s3"][0] + NODE_W);
    }

    /// The 1,000-stage DAG of the web view's benchmark (`ui::at_scale`): 100 layers of
    /// 10, each stage needing two of the layer before and every fifth one three layers
    /// up. Every edge runs left to right, long ones through one bend a layer, and no
    /// two stages overlap. (How long it takes is a figure of bench/README.md.)
    #[test]
    fn a_thousand_stages() {
        let mut edges = Vec::new();
        let id = |layer: usize, i: usize| layer * 10 + i;
        for layer in 0..100 {
            for i in 0..10 {
                if layer > 0 {
                    edges.push((id(layer - 1, i), id(layer, i)));
                    if (i * 3 + 1) % 10 != i {
                        edges.push((id(layer - 1, (i * 3 + 1) % 10), id(layer, i)));
                    }
                }
                if layer > 2 && i % 5 == 0 {
                    edges.push((id(layer - 3, (i + 7) % 10), id(layer, i)));
                }
            }
        }
        let started = std::time::Instant::now();
        let l = layered(&names(1000), &edges);
        println!(
            "1,000 stages, {} edges: {:?}",
            edges.len(),
            started.elapsed()
        );
        assert_eq!(l.edges.len(), edges.len());
        for e in &l.edges {
            let (a, b) = (l.nodes[&e.from], l.nodes[&e.to]);
            assert!(a[0] < b[0], "{e:?}");
            let layers = ((b[0] - a[0]) / (NODE_W + SPACING)).round() as usize;
            assert_eq!(e.points.len(), 2 * layers, "{e:?}");
        }
        no_overlap(&l);
    }

    fn no_overlap(l: &Layout) {
        let boxes: Vec<[f64; 2]> = l.nodes.values().copied().collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(a[0] >= 0.0 && a[1] >= 0.0);
            assert!(a[0] + NODE_W <= l.width && a[1] + NODE_H <= l.height);
            for b in &boxes[i + 1..] {
                let apart = a[0] + NODE_W <= b[0]
                    || b[0] + NODE_W <= a[0]
                    || a[1] + NODE_H <= b[1]
                    || b[1] + NODE_H <= a[1];
                assert!(apart, "{a:?} and {b:?} overlap");
            }
        }
    }

    /// Top to bottom (lineage): every node below what it needs, edges leaving a node's
    /// bottom and entering the next one's top, a skip edge bent around the middle layer,
    /// nothing overlapping.
    #[test]
    fn down_layers_go_top_to_bottom() {
        let edges = [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3), (3, 4)];
        let l = layered_to(&names(5), &edges, Flow::Down);
        assert_eq!(l.flow, Flow::Down);
        for e in &l.edges {
            let (a, b) = (l.nodes[&e.from], l.nodes[&e.to]);
            assert!(a[1] + NODE_H < b[1], "{} above {}: {l:?}", e.from, e.to);
            let (first, last) = (e.points[0], e.points[e.points.len() - 1]);
            assert_eq!(first, [a[0] + NODE_W / 2.0, a[1] + NODE_H], "{e:?}");
            assert_eq!(last, [b[0] + NODE_W / 2.0, b[1]], "{e:?}");
        }
        let skip = l.edges.iter().find(|e| e.from == "s0" && e.to == "s3");
        let [bx, by] = skip.unwrap().points[1];
        for mid in ["s1", "s2"] {
            let [x, y] = l.nodes[mid];
            assert_eq!(by, y, "the bend is in the middle layer");
            assert!(bx < x || bx > x + NODE_W, "the bend misses {mid}: {l:?}");
        }
        no_overlap(&l);
        // A chain of 12 is one column: as tall as its layers, one node wide.
        let chain: Vec<(usize, usize)> = (0..11).map(|i| (i, i + 1)).collect();
        let l = layered_to(&names(12), &chain, Flow::Down);
        assert_eq!(l.width, NODE_W + 2.0 * MARGIN, "{l:?}");
        assert!(l.height > 12.0 * NODE_H, "{l:?}");
    }

    /// Nodes never overlap, components included, and everything is inside the size.
    #[test]
    fn nothing_overlaps() {
        let edges = [(0, 1), (1, 2), (0, 2), (3, 4), (5, 6), (5, 7), (5, 8)];
        let l = layered(&names(10), &edges);
        no_overlap(&l);
    }
}
