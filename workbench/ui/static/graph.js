// SPDX-License-Identifier: Apache-2.0 (part of onnx-drift-workbench; no third-party code)
// onnx-drift-workbench graph view: a layered DAG drawn on a 2D canvas (anywidget ESM, no dependencies).
// Python computes the layout (workbench/plots/graph.py); this file only draws, pans, zooms and reports clicks.
// Traits: data (see graph_payload; data.view "fit" frames the whole graph, "keep" keeps the pan/zoom, anchored on
// data.anchor [old id, new id] or on a node both layouts share), selected (node id), highlight (ids), height (px),
// query (the search box, both ways) and matches ([[name, op], ...] best first, from Python) with match_total.
// Messages to Python: {event: "expand", id} on double click (expand a collapsed name scope).
// data.groups (an engine's fused groups: {id, label, items, tip}) are drawn as boxes around their items, behind
// the edges and nodes; hovering a box (off its nodes) shows its tooltip.
// data.edge_tips (one per edge: "tensor  dtype [shape]" lines) show on hovering an edge and, zoomed in, as labels.
// A minimap (bottom right, the Map button) shows the whole graph and the viewport; click or drag it to move.
// PNG / SVG download the current view (the canvas; an SVG of what is on screen), in the browser.
// Colours follow JupyterLab's theme (CSS variables --jp-*), read again when the theme changes.

const NODE_W = 120;
const NODE_H = 30;
const X_GAP = 150;
const Y_GAP = 56;
const GROUP_PAD = 10;
const GROUP_COLOR = "#8e24aa";
const GROUP_FILL = "rgba(142, 36, 170, 0.10)";

function unpack(d) {
  const n = (d && d.ids) ? d.ids.length : 0;
  const index = new Map();
  const xs = new Float64Array(n);
  const ys = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    index.set(d.ids[i], i);
    xs[i] = d.x[i] * X_GAP;
    ys[i] = d.y[i] * Y_GAP;
  }
  const edges = d && d.edges ? d.edges : [];
  const adj = Array.from({ length: n }, () => []);
  for (let k = 0; k + 1 < edges.length; k += 2) {
    adj[edges[k]].push(k);
    adj[edges[k + 1]].push(k);
  }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (let i = 0; i < n; i++) {
    x0 = Math.min(x0, xs[i]); x1 = Math.max(x1, xs[i]);
    y0 = Math.min(y0, ys[i]); y1 = Math.max(y1, ys[i]);
  }
  if (!n) { x0 = y0 = 0; x1 = y1 = 1; }
  const boxes = [];  // fused groups: world-space rectangles around their items
  for (const grp of (d && d.groups) || []) {
    const items = (grp.items || []).filter((k) => k >= 0 && k < n);
    if (!items.length) continue;
    let bx0 = Infinity, bx1 = -Infinity, by0 = Infinity, by1 = -Infinity;
    for (const k of items) {
      bx0 = Math.min(bx0, xs[k]); bx1 = Math.max(bx1, xs[k]);
      by0 = Math.min(by0, ys[k]); by1 = Math.max(by1, ys[k]);
    }
    boxes.push({ id: grp.id, label: grp.label || "", tip: grp.tip || grp.id, items,
                 x0: bx0 - NODE_W / 2 - GROUP_PAD, x1: bx1 + NODE_W / 2 + GROUP_PAD,
                 y0: by0 - NODE_H / 2 - GROUP_PAD, y1: by1 + NODE_H / 2 + GROUP_PAD });
  }
  const bounds = { x0: x0 - NODE_W, x1: x1 + NODE_W, y0: y0 - NODE_H, y1: y1 + NODE_H };
  for (const b of boxes) {  // a box and the label above it stay inside what Fit frames
    bounds.x0 = Math.min(bounds.x0, b.x0 - GROUP_PAD); bounds.x1 = Math.max(bounds.x1, b.x1 + GROUP_PAD);
    bounds.y0 = Math.min(bounds.y0, b.y0 - 2 * GROUP_PAD); bounds.y1 = Math.max(bounds.y1, b.y1 + GROUP_PAD);
  }
  return {
    n, xs, ys, edges, adj, index, ids: d.ids || [], labels: d.labels || [], sub: d.sub || [], tips: d.tips || [],
    color: d.color || [], group: d.group || [], legend: d.legend || [], title: d.title || "", boxes, bounds,
    edgeTips: d.edge_tips || [],
  };
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render({ model, el: host }) {
  const root = el("div", "wb-graph");
  const bar = el("div", "wb-graph-bar");
  const fitBtn = el("button", "wb-graph-btn", "Fit");
  const inBtn = el("button", "wb-graph-btn", "+");
  const outBtn = el("button", "wb-graph-btn", "\u2212");
  const status = el("span", "wb-graph-status");
  const legend = el("div", "wb-graph-legend");
  const find = el("input", "wb-graph-find");
  find.type = "search";
  find.placeholder = "find a node by name";
  find.title = "Enter or \u2193: next match; Shift+Enter or \u2191: previous; Esc: close the list";
  find.setAttribute("aria-label", "find a node by name");
  const prevBtn = el("button", "wb-graph-btn wb-graph-prev", "\u25B2");
  const nextBtn = el("button", "wb-graph-btn wb-graph-next", "\u25BC");
  prevBtn.title = "previous match (Shift+Enter, \u2191)";
  nextBtn.title = "next match (Enter, \u2193)";
  const count = el("span", "wb-graph-count");
  const results = el("ul", "wb-graph-results");
  fitBtn.title = "fit the whole graph";
  inBtn.title = "zoom in";
  outBtn.title = "zoom out";
  const pngBtn = el("button", "wb-graph-btn wb-graph-png", "PNG");
  const svgBtn = el("button", "wb-graph-btn wb-graph-svg", "SVG");
  pngBtn.title = "download the current view as a PNG image";
  svgBtn.title = "download the current view as an SVG drawing";
  const mapBtn = el("button", "wb-graph-btn wb-graph-mapbtn", "Map");
  mapBtn.title = "show or hide the minimap (click or drag in it to move the view)";
  bar.append(fitBtn, inBtn, outBtn, find, prevBtn, nextBtn, count, mapBtn, pngBtn, svgBtn, status, results);
  const stage = el("div", "wb-graph-stage");
  const canvas = el("canvas", "wb-graph-canvas");
  const tip = el("div", "wb-graph-tip");
  const mini = el("canvas", "wb-graph-minimap");
  mini.title = "the whole graph: click or drag to move the view";
  stage.append(canvas, mini, tip);
  root.append(bar, stage, legend);
  host.append(root);

  const ctx = canvas.getContext("2d");
  let g = unpack(model.get("data"));
  let view = { s: 1, tx: 0, ty: 0 };
  let selected = -1;
  let highlight = new Set();
  let hover = -1;
  let hoverBox = -1;  // the fused-group box under the mouse (off its nodes)
  let hoverEdge = -1;  // the edge under the mouse (off nodes and boxes): its tensor in the tooltip
  let miniBase = null;  // the minimap's nodes, drawn once per layout
  let miniOn = true;
  let frame = 0;
  let anim = 0;
  let width = 0, height = 0;
  let sized = false;  // laid out at a real size yet (a widget in a hidden tab has none)
  let minScale = 0.002;
  let colors = themeColors();
  let matches = [];  // [[name, op], ...] from Python, best first
  let current = -1;  // the match shown (index into matches)
  let typing = 0;

  function themeColors() {
    const css = getComputedStyle(host);
    const v = (name, fallback) => (css.getPropertyValue(name) || "").trim() || fallback;
    return { bg: v("--jp-layout-color0", "#ffffff"), edge: v("--jp-border-color1", "#9aa0a6"),
             label: v("--jp-ui-font-color2", "#546e7a"),
             outline: v("--jp-ui-font-color2", "#455a64"), group: v("--jp-ui-font-color1", "#4a148c") };
  }

  function setHeight() {
    stage.style.height = `${model.get("height") || 600}px`;
  }

  function resize() {
    const dpr = window.devicePixelRatio || 1;
    width = stage.clientWidth;
    height = stage.clientHeight;
    if (!width || !height) return;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    if (!sized) {  // first real size (attached to the page: the theme's colours can be read): frame the graph now
      sized = true;
      colors = themeColors();
      fit();
      syncSelected(false);
    }
    schedule();
  }

  function schedule() {
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; draw(); });
  }

  function hideTip() {
    hover = -1;
    hoverBox = -1;
    hoverEdge = -1;
    tip.style.display = "none";
  }

  function fit() {  // the whole graph, however deep (boxes become plain rectangles when small)
    if (!width || !height) return;
    hideTip();
    cancelAnimationFrame(anim);
    const b = g.bounds;
    const w = b.x1 - b.x0, h = b.y1 - b.y0;
    const s = Math.min(width / w, height / h, 1.5);
    minScale = Math.min(0.002, s / 2);
    view = { s, tx: width / 2 - ((b.x0 + b.x1) / 2) * s, ty: height / 2 - ((b.y0 + b.y1) / 2) * s };
    schedule();
  }

  function onScreen(i, margin = 40) {
    const x = view.tx + g.xs[i] * view.s, y = view.ty + g.ys[i] * view.s;
    return x >= margin && x <= width - margin && y >= margin && y <= height - margin;
  }

  function keepView(old, anchor) {
    // the same place stays under the same pixels: the anchor pair (an expanded scope and its first node) or the
    // node both layouts share nearest the middle of the screen
    if (!old.n || !g.n || !width) return false;
    let a = null, b = null;
    if (anchor && old.index.has(anchor[0]) && g.index.has(anchor[1])) {
      a = old.index.get(anchor[0]);
      b = g.index.get(anchor[1]);
    } else {
      const cx = (width / 2 - view.tx) / view.s, cy = (height / 2 - view.ty) / view.s;
      let best = Infinity;
      for (let i = 0; i < old.n; i++) {
        const j = g.index.get(old.ids[i]);
        if (j === undefined) continue;
        const d = (old.xs[i] - cx) ** 2 + (old.ys[i] - cy) ** 2;
        if (d < best) { best = d; a = i; b = j; }
      }
    }
    if (a === null) return false;
    view = { s: view.s, tx: view.tx + (old.xs[a] - g.xs[b]) * view.s, ty: view.ty + (old.ys[a] - g.ys[b]) * view.s };
    schedule();
    return true;
  }

  function centreOn(i, animate = true) {
    if (i < 0 || !width) return;
    hideTip();  // the node under the mouse moves away: its tooltip goes
    const s = Math.max(view.s, 0.9);
    const target = { s, tx: width / 2 - g.xs[i] * s, ty: height / 2 - g.ys[i] * s };
    if (!animate) { view = target; schedule(); return; }
    const start = { ...view };
    const t0 = performance.now();
    cancelAnimationFrame(anim);
    const step = (now) => {
      const k = Math.min(1, (now - t0) / 250);
      const e = k * (2 - k);
      view = { s: start.s + (target.s - start.s) * e, tx: start.tx + (target.tx - start.tx) * e,
               ty: start.ty + (target.ty - start.ty) * e };
      draw();
      if (k < 1) anim = requestAnimationFrame(step);
      else hideTip();
    };
    anim = requestAnimationFrame(step);
  }

  function edgeCurve(a, b) {  // [x1, y1, c1x, c1y, c2x, c2y, x2, y2]: a cubic from a's bottom to b's top
    const x1 = g.xs[a], y1 = g.ys[a] + NODE_H / 2, x2 = g.xs[b], y2 = g.ys[b] - NODE_H / 2;
    const dy = y2 - y1;
    if (dy > Y_GAP * 1.5 && Math.abs(x2 - x1) < X_GAP / 2) {  // a skip connection along a column: bow sideways
      const off = X_GAP * 0.55;
      return [x1, y1, x1 + off, y1 + dy * 0.25, x2 + off, y2 - dy * 0.25, x2, y2];
    }
    if (dy < 0) return [x1, y1, x1 - X_GAP, y1 + Y_GAP, x2 - X_GAP, y2 - Y_GAP, x2, y2];  // a back edge: loop
    return [x1, y1, x1, y1 + dy / 2, x2, y2 - dy / 2, x2, y2];
  }
  function edgePath(path, a, b) {
    const c = edgeCurve(a, b);
    path.moveTo(c[0], c[1]);
    path.bezierCurveTo(c[2], c[3], c[4], c[5], c[6], c[7]);
  }
  function curveAt(c, t) {
    const u = 1 - t, a = u * u * u, b = 3 * u * u * t, d = 3 * u * t * t, e = t * t * t;
    return [a * c[0] + b * c[2] + d * c[4] + e * c[6], a * c[1] + b * c[3] + d * c[5] + e * c[7]];
  }
  function edgeVisible(k, vx0, vx1, vy0, vy1) {
    const a = g.edges[k], b = g.edges[k + 1];
    const ya = Math.min(g.ys[a], g.ys[b]), yb = Math.max(g.ys[a], g.ys[b]);
    if (yb < vy0 || ya > vy1) return false;
    return !(Math.max(g.xs[a], g.xs[b]) + X_GAP < vx0 || Math.min(g.xs[a], g.xs[b]) - X_GAP > vx1);
  }
  function edgeLabel(k) {  // "float32 [1, 8]": the first tensor's type, without its name
    const t = (g.edgeTips[k / 2] || "").split("\n")[0];
    const at = t.indexOf("  ");
    return at >= 0 ? t.slice(at + 2) : "";
  }
  function hitEdge(ev) {  // the edge (index into g.edges, even) within a few pixels of the mouse, -1 if none
    if (!g.edgeTips.length || NODE_H * view.s < 6) return -1;
    const r = canvas.getBoundingClientRect();
    const wx = (ev.clientX - r.left - view.tx) / view.s, wy = (ev.clientY - r.top - view.ty) / view.s;
    const reach = 5 / view.s;
    let best = -1, bestD = reach * reach;
    for (let k = 0; k + 1 < g.edges.length; k += 2) {
      if (!edgeVisible(k, wx - reach, wx + reach, wy - reach, wy + reach)) continue;
      const c = edgeCurve(g.edges[k], g.edges[k + 1]);
      let [px, py] = curveAt(c, 0);
      for (let j = 1; j <= 16; j++) {
        const [qx, qy] = curveAt(c, j / 16);
        const dx = qx - px, dy = qy - py, L = dx * dx + dy * dy || 1;
        const t = Math.max(0, Math.min(1, ((wx - px) * dx + (wy - py) * dy) / L));
        const d = (px + t * dx - wx) ** 2 + (py + t * dy - wy) ** 2;
        if (d < bestD) { bestD = d; best = k; }
        px = qx; py = qy;
      }
    }
    return best;
  }

  function draw() {
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = colors.bg;
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    const { s, tx, ty } = view;
    ctx.setTransform(dpr * s, 0, 0, dpr * s, dpr * tx, dpr * ty);
    const vx0 = -tx / s - NODE_W, vx1 = (width - tx) / s + NODE_W;
    const vy0 = -ty / s - NODE_H, vy1 = (height - ty) / s + NODE_H;
    const visible = (i) => g.xs[i] >= vx0 && g.xs[i] <= vx1 && g.ys[i] >= vy0 && g.ys[i] <= vy1;
    drawBoxes(vx0, vx1, vy0, vy1);
    const E = g.edges;
    const edges = new Path2D();
    const hot = new Path2D();
    const labelled = [];
    for (let k = 0; k + 1 < E.length; k += 2) {
      if (!edgeVisible(k, vx0, vx1, vy0, vy1)) continue;
      const a = E[k], b = E[k + 1];
      edgePath(a === selected || b === selected || k === hoverEdge ? hot : edges, a, b);
      labelled.push(k);
    }
    ctx.lineWidth = Math.max(1 / s, 0.5);
    ctx.strokeStyle = colors.edge;
    ctx.stroke(edges);
    ctx.lineWidth = 2.5 / s;
    ctx.strokeStyle = "#1a73e8";
    ctx.stroke(hot);
    drawEdgeLabels(labelled);

    const px = NODE_H * s;
    const byColor = new Map();
    const shown = [];
    for (let i = 0; i < g.n; i++) {
      if (!visible(i)) continue;
      shown.push(i);
      const c = g.color[i] || "#cfd8dc";
      if (!byColor.has(c)) byColor.set(c, new Path2D());
      const p = byColor.get(c);
      if (px < 8) p.rect(g.xs[i] - NODE_W / 2, g.ys[i] - NODE_H / 2, NODE_W, NODE_H);
      else p.roundRect(g.xs[i] - NODE_W / 2, g.ys[i] - NODE_H / 2, NODE_W, NODE_H, 6);
    }
    for (const [c, p] of byColor) { ctx.fillStyle = c; ctx.fill(p); }
    if (px >= 8) {
      ctx.lineWidth = 1 / s;
      ctx.strokeStyle = colors.outline;
      const outline = new Path2D();
      const groups = new Path2D();
      for (const i of shown) {
        const r = [g.xs[i] - NODE_W / 2, g.ys[i] - NODE_H / 2, NODE_W, NODE_H];
        (g.group[i] ? groups : outline).roundRect(...r, 6);
      }
      ctx.stroke(outline);
      ctx.setLineDash([6, 3]);
      ctx.lineWidth = 2 / s;
      ctx.stroke(groups);
      ctx.setLineDash([]);
    }
    if (px >= 13) {
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      const two = px >= 26;
      for (const i of shown) {
        const dark = isDark(g.color[i] || "#cfd8dc");
        ctx.font = `${two ? 11 : 12}px sans-serif`;
        ctx.fillStyle = dark ? "#ffffff" : "#102027";
        ctx.fillText(fitText(g.labels[i] || "", NODE_W - 8), g.xs[i], g.ys[i] - (two ? 6 : 0));
        if (two) {
          ctx.font = "9px sans-serif";
          ctx.fillStyle = dark ? "#eceff1" : "#37474f";
          ctx.fillText(fitText(g.sub[i] || g.ids[i] || "", NODE_W - 8), g.xs[i], g.ys[i] + 8);
        }
      }
    }
    drawMinimap();
    for (const i of highlight) ring(i, "#f9a825", 4);
    if (hover >= 0 && hover !== selected) ring(hover, "#607d8b", 2);
    if (selected >= 0) ring(selected, "#1a73e8", 4);
    status.textContent = `${g.title}${g.title ? " \u00b7 " : ""}${g.n} nodes, ${E.length / 2} edges` +
      (selected >= 0 ? ` \u00b7 selected: ${g.ids[selected]}` : "");
  }

  function labelsShown() { return NODE_H * view.s >= 26 && g.edgeTips.length > 0; }
  function drawEdgeLabels(ks) {  // zoomed in: each edge's tensor dtype and shape beside its middle
    root.dataset.edgeLabels = "0";
    if (!labelsShown()) return;
    ctx.font = "9px sans-serif";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillStyle = colors.label;
    let n = 0;
    for (const k of ks) {
      const text = edgeLabel(k);
      if (!text) continue;
      const [x, y] = curveAt(edgeCurve(g.edges[k], g.edges[k + 1]), 0.5);
      ctx.fillText(text, x + 4, y);
      n++;
    }
    root.dataset.edgeLabels = String(n);
  }

  // --- minimap: the whole graph small, the viewport as a rectangle; click or drag to move the view ---------
  const MINI_W = 180, MINI_H = 130;
  function miniFrame() {
    const b = g.bounds, w = b.x1 - b.x0, h = b.y1 - b.y0;
    const k = Math.min(MINI_W / w, MINI_H / h);
    return { k, ox: (MINI_W - w * k) / 2 - b.x0 * k, oy: (MINI_H - h * k) / 2 - b.y0 * k };
  }
  function drawMiniBase() {  // once per layout: the nodes as dots in their colours
    const dpr = window.devicePixelRatio || 1;
    const off = document.createElement("canvas");
    off.width = MINI_W * dpr; off.height = MINI_H * dpr;
    const c = off.getContext("2d");
    c.setTransform(dpr, 0, 0, dpr, 0, 0);
    c.fillStyle = colors.bg;
    c.fillRect(0, 0, MINI_W, MINI_H);
    const f = miniFrame();
    const w = Math.max(1, NODE_W * f.k), h = Math.max(1, NODE_H * f.k);
    const byColor = new Map();
    for (let i = 0; i < g.n; i++) {
      const col = g.color[i] || "#cfd8dc";
      if (!byColor.has(col)) byColor.set(col, new Path2D());
      byColor.get(col).rect(f.ox + g.xs[i] * f.k - w / 2, f.oy + g.ys[i] * f.k - h / 2, w, h);
    }
    for (const [col, p] of byColor) { c.fillStyle = col; c.fill(p); }
    miniBase = off;
  }
  function drawMinimap() {
    mini.style.display = miniOn && g.n ? "block" : "none";
    if (!miniOn || !g.n) return;
    const dpr = window.devicePixelRatio || 1;
    if (mini.width !== MINI_W * dpr) {
      mini.width = MINI_W * dpr; mini.height = MINI_H * dpr;
      mini.style.width = `${MINI_W}px`; mini.style.height = `${MINI_H}px`;
    }
    if (!miniBase) drawMiniBase();
    const m = mini.getContext("2d");
    m.setTransform(1, 0, 0, 1, 0, 0);
    m.drawImage(miniBase, 0, 0);
    m.setTransform(dpr, 0, 0, dpr, 0, 0);
    const r = miniRect();
    if (r.w < 6) { r.x -= (6 - r.w) / 2; r.w = 6; }  // a tall, narrow graph: the viewport stays visible
    if (r.h < 6) { r.y -= (6 - r.h) / 2; r.h = 6; }
    m.fillStyle = "rgba(26, 115, 232, 0.12)";
    m.fillRect(r.x, r.y, r.w, r.h);
    m.lineWidth = 1.5;
    m.strokeStyle = "#1a73e8";
    m.strokeRect(r.x, r.y, r.w, r.h);
  }
  function miniRect() {  // the viewport, in minimap pixels
    const f = miniFrame();
    const x0 = -view.tx / view.s, y0 = -view.ty / view.s;
    return { x: f.ox + x0 * f.k, y: f.oy + y0 * f.k, w: (width / view.s) * f.k, h: (height / view.s) * f.k };
  }
  function miniMove(ev) {  // centre the view on the world point under the mouse in the minimap
    const r = mini.getBoundingClientRect(), f = miniFrame();
    const wx = (ev.clientX - r.left - f.ox) / f.k, wy = (ev.clientY - r.top - f.oy) / f.k;
    cancelAnimationFrame(anim);
    hideTip();
    view = { s: view.s, tx: width / 2 - wx * view.s, ty: height / 2 - wy * view.s };
    schedule();
  }
  let miniDrag = false;
  mini.addEventListener("mousedown", (ev) => { ev.preventDefault(); ev.stopPropagation(); miniDrag = true; miniMove(ev); });
  mini.addEventListener("mousemove", (ev) => { if (miniDrag && ev.buttons) miniMove(ev); });
  const onMiniUp = () => { miniDrag = false; };
  window.addEventListener("mouseup", onMiniUp);
  mapBtn.addEventListener("click", () => { miniOn = !miniOn; schedule(); });

  // --- export: the current view as PNG (the canvas) or SVG (the nodes and edges on screen) ------------------
  function fileName(ext) {
    return `${(g.title || "graph").replace(/[^\w.-]+/g, "_").replace(/\.onnx$/, "")}-view.${ext}`;
  }
  function download(blob, name) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }
  function svgText() {
    const { s, tx, ty } = view;
    const X = (x) => (tx + x * s).toFixed(1), Y = (y) => (ty + y * s).toFixed(1);
    const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
    const vx0 = -tx / s - NODE_W, vx1 = (width - tx) / s + NODE_W;
    const vy0 = -ty / s - NODE_H, vy1 = (height - ty) / s + NODE_H;
    const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" ` +
                 `viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
                 `<rect width="100%" height="100%" fill="${esc(colors.bg)}"/>`];
    for (const b of g.boxes) {
      if (b.x1 < vx0 || b.x0 > vx1 || b.y1 < vy0 || b.y0 > vy1) continue;
      out.push(`<rect class="group" x="${X(b.x0)}" y="${Y(b.y0)}" width="${((b.x1 - b.x0) * s).toFixed(1)}" ` +
               `height="${((b.y1 - b.y0) * s).toFixed(1)}" rx="${(10 * s).toFixed(1)}" fill="${GROUP_FILL}" ` +
               `stroke="${GROUP_COLOR}"><title>${esc(b.tip)}</title></rect>`);
    }
    const labels = labelsShown();
    for (let k = 0; k + 1 < g.edges.length; k += 2) {
      if (!edgeVisible(k, vx0, vx1, vy0, vy1)) continue;
      const c = edgeCurve(g.edges[k], g.edges[k + 1]);
      out.push(`<path class="edge" d="M${X(c[0])},${Y(c[1])} C${X(c[2])},${Y(c[3])} ${X(c[4])},${Y(c[5])} ` +
               `${X(c[6])},${Y(c[7])}" fill="none" stroke="${esc(colors.edge)}">` +
               `<title>${esc(g.edgeTips[k / 2] || "")}</title></path>`);
      if (labels && edgeLabel(k)) {
        const [x, y] = curveAt(c, 0.5);
        out.push(`<text class="edge-label" x="${X(x + 4)}" y="${Y(y)}" font-size="${(9 * s).toFixed(1)}" ` +
                 `dominant-baseline="middle" fill="${esc(colors.label)}">${esc(edgeLabel(k))}</text>`);
      }
    }
    const fs = Math.min(12 * s, 14).toFixed(1);
    for (let i = 0; i < g.n; i++) {
      if (g.xs[i] < vx0 || g.xs[i] > vx1 || g.ys[i] < vy0 || g.ys[i] > vy1) continue;
      const col = g.color[i] || "#cfd8dc";
      out.push(`<g class="node" data-id="${esc(g.ids[i])}"><title>${esc(g.tips[i] || g.ids[i])}</title>` +
               `<rect x="${X(g.xs[i] - NODE_W / 2)}" y="${Y(g.ys[i] - NODE_H / 2)}" width="${(NODE_W * s).toFixed(1)}" ` +
               `height="${(NODE_H * s).toFixed(1)}" rx="${(6 * s).toFixed(1)}" fill="${esc(col)}" ` +
               `stroke="${i === selected ? "#1a73e8" : esc(colors.outline)}" ` +
               `stroke-width="${i === selected ? 3 : 1}"${g.group[i] ? ' stroke-dasharray="6 3"' : ""}/>` +
               `<text x="${X(g.xs[i])}" y="${Y(g.ys[i])}" font-size="${fs}" text-anchor="middle" ` +
               `dominant-baseline="middle" fill="${isDark(col) ? "#ffffff" : "#102027"}">${esc(g.labels[i] || "")}` +
               "</text></g>");
    }
    out.push("</svg>");
    return out.join("\n");
  }
  pngBtn.addEventListener("click", () => {
    draw();
    canvas.toBlob((blob) => { if (blob) download(blob, fileName("png")); }, "image/png");
  });
  svgBtn.addEventListener("click", () => download(new Blob([svgText()], { type: "image/svg+xml" }), fileName("svg")));

  function drawBoxes(vx0, vx1, vy0, vy1) {  // fused groups, behind everything else
    if (!g.boxes.length) return;
    const s = view.s;
    const fill = new Path2D();
    const line = new Path2D();
    const labelled = [];
    g.boxes.forEach((b, k) => {
      if (b.x1 < vx0 || b.x0 > vx1 || b.y1 < vy0 || b.y0 > vy1) return;
      fill.roundRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0, 10);
      line.roundRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0, 10);
      labelled.push(k);
    });
    ctx.fillStyle = GROUP_FILL;
    ctx.fill(fill);
    ctx.lineWidth = Math.max(2 / s, 1);
    ctx.strokeStyle = GROUP_COLOR;
    ctx.stroke(line);
    if (hoverBox >= 0) {
      const b = g.boxes[hoverBox];
      ctx.lineWidth = Math.max(4 / s, 2);
      ctx.beginPath();
      ctx.roundRect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0, 10);
      ctx.stroke();
    }
    if (NODE_H * s >= 13) {  // the fused kernel's name, above its box's top-left corner
      ctx.font = "9px sans-serif";
      ctx.textAlign = "left";
      ctx.textBaseline = "bottom";
      ctx.fillStyle = colors.group;
      for (const k of labelled) {
        const b = g.boxes[k];
        ctx.fillText(fitText(b.label, b.x1 - b.x0 - 8), b.x0 + 4, b.y0 - 1);
      }
    }
  }

  function hitBox(ev) {  // the smallest fused-group box under the mouse
    if (!g.boxes.length) return -1;
    const r = canvas.getBoundingClientRect();
    const wx = (ev.clientX - r.left - view.tx) / view.s;
    const wy = (ev.clientY - r.top - view.ty) / view.s;
    let best = -1, area = Infinity;
    g.boxes.forEach((b, k) => {
      const a = (b.x1 - b.x0) * (b.y1 - b.y0);
      if (wx >= b.x0 && wx <= b.x1 && wy >= b.y0 && wy <= b.y1 && a < area) { best = k; area = a; }
    });
    return best;
  }

  const darkCache = new Map();
  function isDark(color) {
    if (!darkCache.has(color)) {
      const m = /^#([0-9a-f]{6})$/i.exec(color);
      const v = m ? parseInt(m[1], 16) : 0xcccccc;
      const lum = (0.299 * ((v >> 16) & 255) + 0.587 * ((v >> 8) & 255) + 0.114 * (v & 255)) / 255;
      darkCache.set(color, lum < 0.5);
    }
    return darkCache.get(color);
  }

  const widthCache = new Map();
  function fitText(text, maxW) {
    const key = ctx.font + text;
    if (widthCache.has(key)) return widthCache.get(key);
    let t = text;
    if (ctx.measureText(t).width > maxW) {
      while (t.length > 1 && ctx.measureText(`\u2026${t}`).width > maxW) t = t.slice(1);
      t = `\u2026${t}`;
    }
    if (widthCache.size > 20000) widthCache.clear();
    widthCache.set(key, t);
    return t;
  }

  function ring(i, color, w) {
    const s = view.s;
    ctx.lineWidth = Math.max(w / s, w * 0.5);
    ctx.strokeStyle = color;
    const pad = 3 / s;
    ctx.beginPath();
    ctx.roundRect(g.xs[i] - NODE_W / 2 - pad, g.ys[i] - NODE_H / 2 - pad, NODE_W + 2 * pad, NODE_H + 2 * pad, 8);
    ctx.stroke();
  }

  function hit(ev) {
    const r = canvas.getBoundingClientRect();
    const wx = (ev.clientX - r.left - view.tx) / view.s;
    const wy = (ev.clientY - r.top - view.ty) / view.s;
    const slack = Math.max(0, 4 / view.s - NODE_H / 2);
    for (let i = 0; i < g.n; i++) {
      if (Math.abs(g.xs[i] - wx) <= NODE_W / 2 + slack && Math.abs(g.ys[i] - wy) <= NODE_H / 2 + slack) return i;
    }
    return -1;
  }

  let drag = null;
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, moved: false }; });
  window.addEventListener("mouseup", onUp);
  function onUp() { if (drag) setTimeout(() => { drag = null; }, 0); }
  canvas.addEventListener("mousemove", (ev) => {
    if (drag && ev.buttons) {
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
      view.tx += dx; view.ty += dy;
      drag.x = ev.clientX; drag.y = ev.clientY;
      tip.style.display = "none";
      schedule();
      return;
    }
    const i = hit(ev);
    const k = i >= 0 ? -1 : hitBox(ev);
    const e = i >= 0 || k >= 0 ? -1 : hitEdge(ev);
    if (i !== hover || k !== hoverBox || e !== hoverEdge) { hover = i; hoverBox = k; hoverEdge = e; schedule(); }
    if (i >= 0 || k >= 0 || e >= 0) {
      const r = stage.getBoundingClientRect();
      tip.textContent = i >= 0 ? (g.tips[i] || g.ids[i]) : k >= 0 ? g.boxes[k].tip
        : `${g.edgeTips[e / 2]}\n${g.ids[g.edges[e]]} \u2192 ${g.ids[g.edges[e + 1]]}`;
      tip.style.left = `${ev.clientX - r.left + 14}px`;
      tip.style.top = `${ev.clientY - r.top + 14}px`;
      tip.style.display = "block";
    } else {
      tip.style.display = "none";
    }
  });
  canvas.addEventListener("mouseleave", () => {
    hover = -1;
    hoverBox = -1;
    hoverEdge = -1;
    tip.style.display = "none";
    schedule();
  });
  canvas.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const i = hit(ev);
    if (i < 0) return;
    selected = i;
    model.set("selected", g.ids[i]);
    model.save_changes();
    schedule();
  });
  canvas.addEventListener("dblclick", (ev) => {
    const i = hit(ev);
    if (i >= 0 && g.group[i]) model.send({ event: "expand", id: g.ids[i] });
  });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoomAt(ev.clientX - r.left, ev.clientY - r.top, Math.exp(-ev.deltaY * 0.0015));
  }, { passive: false });
  function zoomAt(cx, cy, k) {
    hideTip();
    const s = Math.min(4, Math.max(minScale, view.s * k));
    const f = s / view.s;
    view = { s, tx: cx - (cx - view.tx) * f, ty: cy - (cy - view.ty) * f };
    schedule();
  }
  fitBtn.addEventListener("click", fit);
  inBtn.addEventListener("click", () => zoomAt(width / 2, height / 2, 1.5));
  outBtn.addEventListener("click", () => zoomAt(width / 2, height / 2, 1 / 1.5));

  function renderLegend() {
    const keys = g.legend.map(([label, color]) => {
      const item = el("span", "wb-graph-key");
      const sw = el("i", "wb-graph-swatch");
      sw.style.background = color;
      item.append(sw, document.createTextNode(label));
      return item;
    });
    if (highlight.size) {  // the orange rings' key: what they mark (Repair's kept nodes, search matches)
      const item = el("span", "wb-graph-key wb-graph-key-ring");
      const sw = el("i", "wb-graph-swatch wb-graph-swatch-ring");
      item.append(sw, document.createTextNode(`${model.get("highlight_label") || "ringed"} (${highlight.size})`));
      item.title = "nodes ringed in orange";
      keys.push(item);
    }
    if (g.boxes.length) {  // the boxes' key: an outlined swatch
      const item = el("span", "wb-graph-key wb-graph-key-group");
      const sw = el("i", "wb-graph-swatch wb-graph-swatch-group");
      item.append(sw, document.createTextNode(`fused group (${g.boxes.length})`));
      item.title = "an executed node of the engine that runs several ONNX nodes: hover a box for its kernel";
      keys.push(item);
    }
    legend.replaceChildren(...keys);
  }

  function syncSelected(animate, zoom = false) {
    // ring the selected node; bring it into view only when it is off screen (a click does not move the view);
    // ``zoom`` (a new selection): also when it is drawn too small to see (a search in a big graph seen whole)
    const id = model.get("selected");
    selected = id && g.index.has(id) ? g.index.get(id) : -1;
    if (selected >= 0 && (!onScreen(selected) || (zoom && NODE_H * view.s < 8))) centreOn(selected, animate);
    const k = matches.findIndex((m) => m[0] === id);
    if (k >= 0) { current = k; renderMatches(); }
    schedule();
  }
  function syncHighlight() {
    highlight = new Set((model.get("highlight") || []).map((id) => g.index.get(id)).filter((i) => i !== undefined));
    renderLegend();
    schedule();
  }

  // --- search: Python ranks the matches (exact name first); here the list, next/previous and the keys -------
  function renderMatches() {
    const total = model.get("match_total") || matches.length;
    count.textContent = find.value.trim() ? (matches.length ? `${current + 1}/${total}` : "no match") : "";
    prevBtn.disabled = nextBtn.disabled = matches.length < 2;
    results.replaceChildren(...matches.map(([name, op], k) => {
      const li = el("li", k === current ? "wb-current" : "");
      li.append(document.createTextNode(name), el("span", "wb-graph-op", op));
      li.title = name;
      li.dataset.index = String(k);
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); goTo(k); });
      return li;
    }));
    const shown = results.children[current];
    if (shown && results.style.display === "block") shown.scrollIntoView({ block: "nearest" });
  }
  function openList(open) {
    results.style.display = open && matches.length ? "block" : "none";
  }
  function goTo(k) {
    if (!matches.length) return;
    current = ((k % matches.length) + matches.length) % matches.length;
    renderMatches();
    model.set("selected", matches[current][0]);
    model.save_changes();
  }
  function sendQuery() {
    clearTimeout(typing);
    if (model.get("query") === find.value.trim()) return false;
    model.set("query", find.value.trim());
    model.save_changes();
    return true;
  }
  find.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(sendQuery, 250);
  });
  find.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") {
      ev.preventDefault();
      if (!sendQuery()) goTo(current + (ev.shiftKey ? -1 : 1));  // a new query selects its best match itself
      openList(true);
    } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      ev.preventDefault();
      goTo(current + (ev.key === "ArrowDown" ? 1 : -1));
      openList(true);
    } else if (ev.key === "Escape") {
      openList(false);
    }
    ev.stopPropagation();  // keys typed here are not JupyterLab's shortcuts
  });
  find.addEventListener("focus", () => openList(true));
  find.addEventListener("blur", () => setTimeout(() => openList(false), 150));
  prevBtn.addEventListener("click", () => goTo(current - 1));
  nextBtn.addEventListener("click", () => goTo(current + 1));
  function syncMatches() {
    matches = model.get("matches") || [];
    const id = model.get("selected");
    current = Math.max(0, matches.findIndex((m) => m[0] === id));
    if (!matches.length) current = -1;
    renderMatches();
    openList(document.activeElement === find);
  }
  function syncQuery() {
    const q = model.get("query") || "";
    if (find.value.trim() !== q) find.value = q;
  }

  const onData = () => {
    const old = g;
    const d = model.get("data") || {};
    g = unpack(d);
    miniBase = null;
    hideTip();
    renderLegend();
    syncHighlight();
    if (!sized || d.view === "fit" || !keepView(old, d.anchor)) fit();
    syncSelected(false);
  };
  model.on("change:data", onData);
  model.on("change:selected", () => syncSelected(true, true));
  model.on("change:highlight", syncHighlight);
  model.on("change:highlight_label", renderLegend);
  model.on("change:matches", syncMatches);
  model.on("change:match_total", renderMatches);
  model.on("change:query", syncQuery);
  model.on("change:height", () => { setHeight(); resize(); });
  // scroll the page to the graph: its tab may be made visible in this same update, so wait until it has a size
  function scrollIntoView(tries = 20) {
    if (stage.offsetParent === null || stage.clientHeight === 0) {
      if (tries > 0) requestAnimationFrame(() => scrollIntoView(tries - 1));
      return;
    }
    root.scrollIntoView({ block: "nearest" });
  }
  model.on("change:scroll_into_view", () => requestAnimationFrame(() => scrollIntoView()));
  const themeWatch = new MutationObserver(() => { colors = themeColors(); miniBase = null; schedule(); });
  themeWatch.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name"] });

  const ro = new ResizeObserver(() => resize());
  ro.observe(stage);
  setHeight();
  resize();
  renderLegend();
  syncHighlight();
  syncQuery();
  syncMatches();
  fit();
  syncSelected(false);
  draw();
  // asked to be shown before this view existed (its panel built by the tab switch that reveals it)
  if (model.get("scroll_into_view") > 0) {
    requestAnimationFrame(() => scrollIntoView());
  }
  root.dataset.ready = "1";
  // for tests and benchmarks: where a node is drawn (client coordinates), null if unknown
  root.wbNodePosition = (id) => {
    const i = g.index.get(id);
    if (i === undefined) return null;
    const r = canvas.getBoundingClientRect();
    return { x: r.left + view.tx + g.xs[i] * view.s, y: r.top + view.ty + g.ys[i] * view.s };
  };
  root.wbVisibleIds = () => g.ids.filter((_, i) => {
    const x = view.tx + g.xs[i] * view.s, y = view.ty + g.ys[i] * view.s;
    return x >= 0 && x <= width && y >= 0 && y <= height;
  });
  root.wbView = () => ({ ...view });
  // the colour a node (or collapsed scope) is filled with, and the node ringed as selected ("" for none)
  root.wbNodeColor = (id) => { const i = g.index.get(id); return i === undefined ? null : (g.color[i] || null); };
  root.wbSelectedId = () => (selected >= 0 ? g.ids[selected] : "");
  // the fused-group boxes drawn (client coordinates)
  root.wbGroupBoxes = () => {
    const r = canvas.getBoundingClientRect();
    return g.boxes.map((b) => ({ id: b.id, items: b.items.map((k) => g.ids[k]),
      x0: r.left + view.tx + b.x0 * view.s, x1: r.left + view.tx + b.x1 * view.s,
      y0: r.top + view.ty + b.y0 * view.s, y1: r.top + view.ty + b.y1 * view.s }));
  };
  root.wbColors = () => ({ ...colors });
  // the minimap's viewport rectangle (client coordinates) and the SVG export's text
  root.wbMinimap = () => {
    const r = mini.getBoundingClientRect(), m = miniRect();
    return { shown: mini.style.display !== "none", left: r.left, top: r.top, width: r.width, height: r.height,
             x: r.left + m.x, y: r.top + m.y, w: m.w, h: m.h };
  };
  root.wbSvg = svgText;
  root.wbEdgeAt = (a, b) => {  // the middle of the edge a -> b (client coordinates), null if not drawn
    const i = g.index.get(a), j = g.index.get(b);
    for (let k = 0; k + 1 < g.edges.length; k += 2) {
      if (g.edges[k] !== i || g.edges[k + 1] !== j) continue;
      const [x, y] = curveAt(edgeCurve(i, j), 0.5);
      const r = canvas.getBoundingClientRect();
      return { x: r.left + view.tx + x * view.s, y: r.top + view.ty + y * view.s, tip: g.edgeTips[k / 2] || "" };
    }
    return null;
  };
  return () => {
    ro.disconnect();
    themeWatch.disconnect();
    clearTimeout(typing);
    window.removeEventListener("mouseup", onUp);
    window.removeEventListener("mouseup", onMiniUp);
    cancelAnimationFrame(frame);
    cancelAnimationFrame(anim);
  };
}

export default { render };
