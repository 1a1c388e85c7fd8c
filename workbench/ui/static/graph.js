// SPDX-License-Identifier: Apache-2.0 (part of onnx-drift-workbench; no third-party code)
// onnx-drift-workbench graph view: a layered DAG drawn on a 2D canvas (anywidget ESM, no dependencies).
// Python computes the layout (workbench/plots/graph.py); this file only draws, pans, zooms and reports clicks.
// Traits: data (see graph_payload), selected (node id), highlight (ids), height (px).
// Messages to Python: {event: "expand", id} on double click (expand a collapsed name scope).

const NODE_W = 120;
const NODE_H = 30;
const X_GAP = 150;
const Y_GAP = 56;

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
  return {
    n, xs, ys, edges, adj, index, ids: d.ids || [], labels: d.labels || [], sub: d.sub || [], tips: d.tips || [],
    color: d.color || [], group: d.group || [], legend: d.legend || [], title: d.title || "",
    bounds: { x0: x0 - NODE_W, x1: x1 + NODE_W, y0: y0 - NODE_H, y1: y1 + NODE_H },
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
  bar.append(fitBtn, inBtn, outBtn, status);
  const stage = el("div", "wb-graph-stage");
  const canvas = el("canvas", "wb-graph-canvas");
  const tip = el("div", "wb-graph-tip");
  stage.append(canvas, tip);
  root.append(bar, stage, legend);
  host.append(root);

  const ctx = canvas.getContext("2d");
  let g = unpack(model.get("data"));
  let view = { s: 1, tx: 0, ty: 0 };
  let selected = -1;
  let highlight = new Set();
  let hover = -1;
  let frame = 0;
  let anim = 0;
  let width = 0, height = 0;
  let sized = false;  // laid out at a real size yet (a widget in a hidden tab has none)

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
    if (!sized) {  // first real size: frame the graph (and the selection) now
      sized = true;
      fit();
      syncSelected(false);
    }
    schedule();
  }

  function schedule() {
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; draw(); });
  }

  function fit() {
    if (!width || !height) return;
    const b = g.bounds;
    const w = b.x1 - b.x0, h = b.y1 - b.y0;
    let s = Math.min(width / w, height / h);
    if (s < 0.08) {  // a very deep graph: fit its width and start at the top
      s = Math.min(width / w, 1);
      view = { s, tx: width / 2 - ((b.x0 + b.x1) / 2) * s, ty: 10 - b.y0 * s };
    } else {
      s = Math.min(s, 1.5);
      view = { s, tx: width / 2 - ((b.x0 + b.x1) / 2) * s, ty: height / 2 - ((b.y0 + b.y1) / 2) * s };
    }
    schedule();
  }

  function centreOn(i, animate = true) {
    if (i < 0 || !width) return;
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
    };
    anim = requestAnimationFrame(step);
  }

  function edgePath(path, a, b) {
    const x1 = g.xs[a], y1 = g.ys[a] + NODE_H / 2, x2 = g.xs[b], y2 = g.ys[b] - NODE_H / 2;
    path.moveTo(x1, y1);
    const dy = y2 - y1;
    if (dy > Y_GAP * 1.5 && Math.abs(x2 - x1) < X_GAP / 2) {  // a skip connection along a column: bow sideways
      const off = X_GAP * 0.55;
      path.bezierCurveTo(x1 + off, y1 + dy * 0.25, x2 + off, y2 - dy * 0.25, x2, y2);
    } else if (dy < 0) {  // a back edge (after collapsing scopes): loop around
      path.bezierCurveTo(x1 - X_GAP, y1 + Y_GAP, x2 - X_GAP, y2 - Y_GAP, x2, y2);
    } else {
      path.bezierCurveTo(x1, y1 + dy / 2, x2, y2 - dy / 2, x2, y2);
    }
  }

  function draw() {
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    const { s, tx, ty } = view;
    ctx.setTransform(dpr * s, 0, 0, dpr * s, dpr * tx, dpr * ty);
    const vx0 = -tx / s - NODE_W, vx1 = (width - tx) / s + NODE_W;
    const vy0 = -ty / s - NODE_H, vy1 = (height - ty) / s + NODE_H;
    const visible = (i) => g.xs[i] >= vx0 && g.xs[i] <= vx1 && g.ys[i] >= vy0 && g.ys[i] <= vy1;
    const E = g.edges;
    const edges = new Path2D();
    const hot = new Path2D();
    for (let k = 0; k + 1 < E.length; k += 2) {
      const a = E[k], b = E[k + 1];
      const ya = Math.min(g.ys[a], g.ys[b]), yb = Math.max(g.ys[a], g.ys[b]);
      if (yb < vy0 || ya > vy1) continue;
      if (Math.max(g.xs[a], g.xs[b]) + X_GAP < vx0 || Math.min(g.xs[a], g.xs[b]) - X_GAP > vx1) continue;
      edgePath(a === selected || b === selected ? hot : edges, a, b);
    }
    ctx.lineWidth = Math.max(1 / s, 0.5);
    ctx.strokeStyle = "#9aa0a6";
    ctx.stroke(edges);
    ctx.lineWidth = 2.5 / s;
    ctx.strokeStyle = "#1a73e8";
    ctx.stroke(hot);

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
      ctx.strokeStyle = "#455a64";
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
    for (const i of highlight) ring(i, "#f9a825", 4);
    if (hover >= 0 && hover !== selected) ring(hover, "#607d8b", 2);
    if (selected >= 0) ring(selected, "#1a73e8", 4);
    status.textContent = `${g.title}${g.title ? " \u00b7 " : ""}${g.n} nodes, ${E.length / 2} edges` +
      (selected >= 0 ? ` \u00b7 selected: ${g.ids[selected]}` : "");
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
    if (i !== hover) { hover = i; schedule(); }
    if (i >= 0) {
      const r = stage.getBoundingClientRect();
      tip.textContent = g.tips[i] || g.ids[i];
      tip.style.left = `${ev.clientX - r.left + 14}px`;
      tip.style.top = `${ev.clientY - r.top + 14}px`;
      tip.style.display = "block";
    } else {
      tip.style.display = "none";
    }
  });
  canvas.addEventListener("mouseleave", () => { hover = -1; tip.style.display = "none"; schedule(); });
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
    const s = Math.min(4, Math.max(0.002, view.s * k));
    const f = s / view.s;
    view = { s, tx: cx - (cx - view.tx) * f, ty: cy - (cy - view.ty) * f };
    schedule();
  }
  fitBtn.addEventListener("click", fit);
  inBtn.addEventListener("click", () => zoomAt(width / 2, height / 2, 1.5));
  outBtn.addEventListener("click", () => zoomAt(width / 2, height / 2, 1 / 1.5));

  function renderLegend() {
    legend.replaceChildren(...g.legend.map(([label, color]) => {
      const item = el("span", "wb-graph-key");
      const sw = el("i", "wb-graph-swatch");
      sw.style.background = color;
      item.append(sw, document.createTextNode(label));
      return item;
    }));
  }

  function syncSelected(animate) {
    const id = model.get("selected");
    selected = id && g.index.has(id) ? g.index.get(id) : -1;
    if (selected >= 0) centreOn(selected, animate);
    schedule();
  }
  function syncHighlight() {
    highlight = new Set((model.get("highlight") || []).map((id) => g.index.get(id)).filter((i) => i !== undefined));
    schedule();
  }

  const onData = () => {
    g = unpack(model.get("data"));
    hover = -1;
    renderLegend();
    syncHighlight();
    fit();
    syncSelected(false);
  };
  model.on("change:data", onData);
  model.on("change:selected", () => syncSelected(true));
  model.on("change:highlight", syncHighlight);
  model.on("change:height", () => { setHeight(); resize(); });

  const ro = new ResizeObserver(() => resize());
  ro.observe(stage);
  setHeight();
  resize();
  renderLegend();
  syncHighlight();
  fit();
  syncSelected(false);
  draw();
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
  return () => {
    ro.disconnect();
    window.removeEventListener("mouseup", onUp);
    cancelAnimationFrame(frame);
    cancelAnimationFrame(anim);
  };
}

export default { render };
