"use strict";
// The sim report page. Every text from the world goes through textContent (never innerHTML).
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const ticks = D.ticks, chars = D.chars, locs = D.locs;
  let cur = 0; // index into ticks
  let followed = -1; // character index, or -1

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const kid of kids) {
      if (kid === null || kid === undefined) continue;
      node.appendChild(typeof kid === "string" || typeof kid === "number"
        ? document.createTextNode(String(kid)) : kid);
    }
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function setAttrs(node, attrs) {
    for (const key in attrs || {}) {
      if (key === "class") node.setAttribute("class", attrs[key]);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), attrs[key]);
      else node.setAttribute(key, String(attrs[key]));
    }
  }
  const fmtInt = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
  const fmtCost = (c) => (c === null || c === undefined ? "-" : "$" + Number(c).toFixed(4));
  const fmtWall = (w) => (w === null || w === undefined ? "-" : Number(w).toFixed(2) + " s");
  const locName = (i) => (locs[i] ? locs[i].name : "?");
  const charName = (i) => (chars[i] ? chars[i].name : "?");
  // Each character its own colour: few characters get hues spread evenly around the
  // wheel, in two lightnesses; many are spread by the golden angle (no two neighbours
  // close). A hash of the id put two of the demo's ten characters on one hue.
  const colour = (i) => {
    const even = chars.length <= 24;
    const hue = Math.round(even ? (i * 360) / chars.length : (i * 137.508) % 360);
    return "hsl(" + hue + ",65%," + (i % 2 ? 34 : 44) + "%)";
  };

  // -- derived: each character's location per tick, and after the last -------------------
  const at = ticks.map((t) => {
    const m = new Map();
    for (const [c, l] of t.at) m.set(c, l);
    return m;
  });
  const finalAt = new Map(at.length ? at[at.length - 1] : []);
  if (ticks.length) for (const [c, , to] of ticks[ticks.length - 1].moves) finalAt.set(c, to);
  function pathOf(c) {
    const runs = [];
    const push = (loc, t) => {
      const last = runs[runs.length - 1];
      if (last && last.loc === loc) last.to = t;
      else runs.push({ loc: loc, from: t, to: t });
    };
    ticks.forEach((t, i) => { if (at[i].has(c)) push(at[i].get(c), t.t); });
    if (ticks.length && finalAt.has(c)) {
      const endTick = ticks[ticks.length - 1].t;
      const last = runs[runs.length - 1];
      if (!last || last.loc !== finalAt.get(c)) runs.push({ loc: finalAt.get(c), from: endTick, to: endTick, end: true });
    }
    return runs;
  }
  function pathText(runs) {
    return runs.map((r) => locName(r.loc) + (r.end ? " (end)" : r.from === r.to ? " (" + r.from + ")" : " (" + r.from + "–" + r.to + ")")).join(" → ");
  }
  const nameById = new Map();
  locs.forEach((x) => nameById.set(x.id, x.name));
  chars.forEach((x) => nameById.set(x.id, x.name));
  const targetText = (target) => (nameById.has(target) ? nameById.get(target) : target);
  // an intervention: ["inject", location id or null (everywhere), text] or ["set", "file field", "before → after"]
  const ivText = (iv) => iv[0] === "inject"
    ? "inject " + (iv[1] === null ? "everywhere" : "at " + targetText(iv[1])) + ": " + iv[2]
    : "set " + iv[1] + ": " + iv[2];

  // -- header ------------------------------------------------------------------------------
  $("title").textContent = D.world;
  document.title = D.world + " — sim report";
  const total = (k) => ticks.reduce((s, t) => s + (t[k] || 0), 0);
  const priced = ticks.some((t) => t.cost !== null);
  if (!ticks.length) {
    $("subtitle").textContent = chars.length + " characters · " + locs.length + " locations";
    $("empty").hidden = false;
    $("no-logs").hidden = D.logged > 0;
    $("no-range").hidden = D.logged === 0;
  } else {
    $("subtitle").textContent = "ticks " + ticks[0].t + "–" + ticks[ticks.length - 1].t +
      " · " + chars.length + " characters · " + locs.length + " locations · " +
      fmtInt(total("calls")) + " calls · " + fmtInt(total("failures")) + " failed · " +
      fmtInt(total("tokens")) + " tokens · " + (priced ? fmtCost(total("cost")) : "cost unknown (no prices)");
  }
  if (D.problems.length) {
    $("problems").hidden = false;
    for (const p of D.problems) $("problem-list").appendChild(el("li", {}, p));
  }
  if (!ticks.length) return;
  for (const id of ["stage", "numbers", "people"]) $(id).hidden = false;

  // -- map -----------------------------------------------------------------------------------
  // A bigger world gets a bigger canvas (so smaller text and dots relative to the map).
  const SCALE = Math.min(3, Math.max(1, Math.sqrt(locs.length / 12)));
  const W = 1000 * SCALE, H = 760 * SCALE, PADX = 120, PADT = 80, PADB = 75;
  const px = (l) => PADX + locs[l].x * (W - 2 * PADX);
  const py = (l) => PADT + locs[l].y * (H - PADT - PADB);
  const map = $("map");
  map.setAttribute("viewBox", "0 0 " + W + " " + H);
  const defs = svg("defs");
  for (const [id, fill] of [["arrow", "#8a94a6"], ["movearrow", "#d9480f"]]) {
    const m = svg("marker", { id: id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    m.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: fill }));
    defs.appendChild(m);
  }
  map.appendChild(defs);
  const R = 30;
  const DOT = 9, LABELS = 5; // characters named beside a place (the rest counted)
  function trimmed(a, b, r1, r2) {
    const x1 = px(a), y1 = py(a), x2 = px(b), y2 = py(b);
    const d = Math.hypot(x2 - x1, y2 - y1) || 1;
    return [x1 + (x2 - x1) * r1 / d, y1 + (y2 - y1) * r1 / d, x2 - (x2 - x1) * r2 / d, y2 - (y2 - y1) * r2 / d];
  }
  const edgeLayer = svg("g", { class: "edges" });
  for (const [a, b, oneWay] of D.edges) {
    const [x1, y1, x2, y2] = trimmed(a, b, R + 2, R + 4);
    const line = svg("line", { x1: x1, y1: y1, x2: x2, y2: y2, class: oneWay ? "edge oneway" : "edge" });
    if (oneWay) line.setAttribute("marker-end", "url(#arrow)");
    edgeLayer.appendChild(line);
  }
  map.appendChild(edgeLayer);
  const trailLayer = svg("g", { class: "trail" });
  const moveLayer = svg("g", { class: "moves" });
  const nodeLayer = svg("g", { class: "nodes" });
  const dotLayer = svg("g", { class: "dots" });
  map.append(trailLayer, nodeLayer, moveLayer, dotLayer);
  const counts = [];
  locs.forEach((loc, l) => {
    const g = svg("g", { class: "node" });
    g.appendChild(svg("circle", { cx: px(l), cy: py(l), r: R }));
    // a label near an edge of the map is anchored at the node's side so it is not cut off
    const side = loc.x < 0.15 ? "start" : loc.x > 0.85 ? "end" : "middle";
    const lx = px(l) + (side === "start" ? -R : side === "end" ? R : 0);
    g.appendChild(svg("text", { x: lx, y: py(l) + R + 24, class: "locname", "text-anchor": side }, loc.name));
    const count = svg("text", { x: px(l), y: py(l) + 8, class: "count" }, "");
    counts.push(count);
    g.appendChild(count);
    g.appendChild(svg("title", {}, loc.name + " (" + loc.id + ")"));
    nodeLayer.appendChild(g);
  });

  function drawMap() {
    const t = ticks[cur];
    const here = new Map();
    for (const [c, l] of t.at) {
      if (!here.has(l)) here.set(l, []);
      here.get(l).push(c);
    }
    locs.forEach((_, l) => { counts[l].textContent = here.has(l) ? String(here.get(l).length) : ""; });
    dotLayer.replaceChildren();
    moveLayer.replaceChildren();
    // beside each place, a column of its characters: a dot and the name in its colour
    for (const [l, cs] of here) {
      const shown = cs.slice(0, LABELS);
      const left = locs[l].x > 0.8; // a place near the right edge: its column to the left
      const x = px(l) + (left ? -(R + 12) : R + 12);
      shown.forEach((c, k) => {
        const y = py(l) - R + 4 + k * 24;
        const pick = () => follow(c === followed ? -1 : c);
        const dot = svg("circle", {
          cx: x, cy: y, r: c === followed ? DOT * 1.2 : DOT * 0.8,
          fill: colour(c), class: c === followed ? "dot followed" : "dot", onclick: pick,
        });
        dot.appendChild(svg("title", {}, charName(c) + " — " + locName(l)));
        dotLayer.appendChild(dot);
        const name = charName(c);
        dotLayer.appendChild(svg("text", {
          x: x + (left ? -12 : 12), y: y + 5, fill: colour(c), onclick: pick,
          class: c === followed ? "dotlabel followed" : "dotlabel", "text-anchor": left ? "end" : "start",
        }, name.length > 22 ? name.slice(0, 21) + "…" : name));
      });
      if (cs.length > shown.length) {
        dotLayer.appendChild(svg("text", { x: x + (left ? -12 : 12), y: py(l) - R + 10 + shown.length * 24, class: "more", "text-anchor": left ? "end" : "start" }, "+" + (cs.length - shown.length) + " more"));
      }
    }
    const seen = new Map();
    for (const [c, a, b] of t.moves) {
      const key = a + ">" + b;
      if (seen.has(key)) { seen.get(key).push(c); continue; }
      seen.set(key, [c]);
    }
    for (const [key, cs] of seen) {
      const [a, b] = key.split(">").map(Number);
      const [x1, y1, x2, y2] = trimmed(a, b, R + 4, R + 8);
      const mx = (x1 + x2) / 2 - (y2 - y1) * 0.15, my = (y1 + y2) / 2 + (x2 - x1) * 0.15;
      const p = svg("path", { d: "M" + x1 + "," + y1 + " Q" + mx + "," + my + " " + x2 + "," + y2, class: cs.includes(followed) ? "move followed" : "move", "marker-end": "url(#movearrow)" });
      p.appendChild(svg("title", {}, cs.map(charName).join(", ") + ": " + locName(a) + " → " + locName(b)));
      moveLayer.appendChild(p);
    }
  }
  function drawTrail() {
    trailLayer.replaceChildren();
    if (followed < 0) return;
    const runs = pathOf(followed);
    const pts = runs.map((r) => px(r.loc) + "," + py(r.loc)).join(" ");
    if (runs.length > 1) trailLayer.appendChild(svg("polyline", { points: pts, class: "trailline", stroke: colour(followed) }));
  }

  // -- tick detail ---------------------------------------------------------------------------
  // A long history's scenes are in side files beside the page (D.detail), one script per
  // tick calling simReportTick(token, tick, detail), loaded when the tick is first shown:
  // a page opened from disk cannot fetch JSON, but it can load a script from its folder.
  const loaded = new Map(); // side file name -> its detail, or "loading" / "missing"
  const tickFile = (tick) => "tick-" + String(tick).padStart(6, "0") + ".js";
  let onMemory = null; // redraws the open memory row when memory.js arrives
  function arrived(token, name, detail, redraw) {
    if (!D.detail || token !== D.detail.token || !detail) return; // another run's file
    loaded.set(name, detail);
    redraw();
  }
  window.simReportTick = function (token, tick, detail) {
    arrived(token, tickFile(tick), detail, () => { if (ticks[cur] && ticks[cur].t === tick) drawDetail(); });
  };
  window.simReportMemory = function (token, memory) {
    arrived(token, "memory.js", memory, () => { if (onMemory) onMemory(); });
  };
  // A side file's content, or "loading" (it is being loaded: redraw() runs if it never
  // arrives) or "missing".
  function side(name, redraw) {
    const got = loaded.get(name);
    if (got !== undefined) return got;
    loaded.set(name, "loading");
    const script = document.createElement("script");
    script.src = encodeURIComponent(D.detail.dir) + "/" + name;
    const done = () => {
      script.remove();
      if (typeof loaded.get(name) === "string") {
        loaded.set(name, "missing"); // no file, or one from another run of sim report
        redraw();
      }
    };
    script.addEventListener("load", done);
    script.addEventListener("error", done);
    document.head.appendChild(script);
    return "loading";
  }
  function detailOf(t) {
    return t.d ? side(tickFile(t.t), () => { if (ticks[cur] === t) drawDetail(); }) : t;
  }
  const missingText = () => D.detail.dir + "/ beside this page is missing or from another run of sim report (run it again).";
  function drawDetail() {
    const t = ticks[cur];
    const detail = detailOf(t);
    const box = $("tick-detail");
    box.replaceChildren();
    box.appendChild(el("h2", {}, "Tick " + t.t, t.committed ? null : el("span", { class: "badge bad" }, "not committed")));
    box.appendChild(el("p", { class: "muted" }, fmtInt(t.calls) + " calls · " + fmtInt(t.failures) + " failed · " +
      fmtInt(t.tokens) + " tokens · " + (t.cost === null ? "cost unknown" : fmtCost(t.cost)) + " · wall " + fmtWall(t.wall)));
    if (t.iv && t.iv.length) {
      const ul = el("ul", { class: "interventions" });
      for (const iv of t.iv) ul.appendChild(el("li", {}, "intervention before this tick: " + ivText(iv)));
      box.appendChild(ul);
    }
    if (t.fallbacks.length) {
      const ul = el("ul", { class: "fallbacks" });
      for (const f of t.fallbacks) ul.appendChild(el("li", {}, "fallback: " + f));
      box.appendChild(ul);
    }
    if (followed >= 0) {
      box.appendChild(el("p", { class: "following" }, "Following ", el("b", {}, charName(followed)), " · ",
        el("a", { href: "#", onclick: (e) => { e.preventDefault(); follow(-1); } }, "stop")));
    }
    if (typeof detail === "string") {
      box.appendChild(el("p", { class: detail === "missing" ? "muted warn-text" : "muted", id: "detail-state" },
        detail === "missing"
          ? "This tick's scenes are not available: " + missingText()
          : "Loading this tick's scenes…"));
      return;
    }
    for (const scene of detail.scenes) {
      const sec = el("div", { class: "scene" });
      sec.appendChild(el("h3", {}, locName(scene.l)));
      sec.appendChild(el("p", { class: scene.n ? "narrative" : "narrative muted" }, scene.n || "(no narrative)"));
      const table = el("table", { class: "rows" });
      for (const [c, action, target, content, outcome] of scene.r) {
        const who = el("a", { href: "#", class: "who", style: "--c:" + colour(c), onclick: (e) => { e.preventDefault(); follow(c); } }, charName(c));
        const intent = el("div", { class: "intent" }, el("span", { class: "action" }, action || "?"),
          target ? " " + targetText(target) : "", content ? el("div", { class: "content" }, content) : null);
        table.appendChild(el("tr", { class: c === followed ? "hl" : "" }, el("td", {}, who), el("td", {}, intent), el("td", { class: "outcome" }, outcome || "—")));
      }
      if (scene.r.length) sec.appendChild(table);
      box.appendChild(sec);
    }
    for (const phase of detail.phases || []) {
      const sec = el("div", { class: "scene" });
      sec.appendChild(el("h3", {}, phase.p));
      const table = el("table", { class: "rows" });
      for (const [[kind, ref], answer] of phase.r) {
        const who = kind === "c"
          ? el("a", { href: "#", class: "who", style: "--c:" + colour(ref), onclick: (e) => { e.preventDefault(); follow(ref); } }, charName(ref))
          : el("span", {}, kind === "l" ? locName(ref) : String(ref));
        table.appendChild(el("tr", { class: kind === "c" && ref === followed ? "hl" : "" }, el("td", {}, who), el("td", { class: "outcome" }, answer)));
      }
      sec.appendChild(table);
      box.appendChild(sec);
    }
  }

  // -- timeline, chart and tables ------------------------------------------------------------
  // an axis's top: the next round number (1, 2, 2.5 or 5 times a power of ten) at or above
  function nice(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  const maxTokens = nice(Math.max(1, ...ticks.map((t) => t.tokens || 0)));
  const timeline = $("timeline");
  const cells = ticks.map((t, i) => {
    const iv = t.iv || [];
    const cell = el("button", {
      type: "button", class: "cell" + (t.failures ? " failed" : "") + (t.committed ? "" : " open") + (iv.length ? " iv" : ""),
      title: "tick " + t.t + iv.map((x) => "\n" + ivText(x)).join(""), onclick: () => go(i),
    });
    cell.appendChild(el("span", { class: "ivmark" }, iv.length ? "◆" : ""));
    cell.appendChild(el("span", { class: "bar", style: "height:" + Math.round(6 + 24 * (t.tokens || 0) / maxTokens) + "px" }));
    cell.appendChild(el("span", { class: "num" }, String(t.t)));
    timeline.appendChild(cell);
    return cell;
  });
  const chart = $("chart");
  // tokens per tick as bars (left axis), cost as a line (right axis): titled, both axes
  // with values, the ticks along the bottom
  const CW = 1000, CH = 230, L = 74, RM = 74, B = 42, T = 34;
  const bw = (CW - L - RM) / ticks.length;
  const maxCost = Math.max(0, ...ticks.map((t) => t.cost || 0));
  const ty = (v) => CH - B - (CH - B - T) * v / maxTokens;
  chart.appendChild(svg("text", { x: L, y: 16, class: "charttitle" }, maxCost > 0 ? "Tokens (bars) and cost (line) per tick" : "Tokens per tick"));
  for (let k = 0; k <= 4; k++) {
    const v = maxTokens * k / 4;
    chart.appendChild(svg("line", { x1: L, y1: ty(v), x2: CW - RM, y2: ty(v), class: "grid" }));
    chart.appendChild(svg("text", { x: L - 6, y: ty(v) + 4, class: "ylab" }, fmtInt(Math.round(v))));
  }
  chart.appendChild(svg("line", { x1: L, y1: CH - B, x2: CW - RM, y2: CH - B, class: "axis" }));
  chart.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: CH - B, class: "axis" }));
  const mid = (T + CH - B) / 2;
  chart.appendChild(svg("text", { x: 14, y: mid, class: "axistitle", transform: "rotate(-90 14 " + mid + ")" }, "tokens"));
  chart.appendChild(svg("text", { x: (L + CW - RM) / 2, y: CH - 6, class: "axistitle" }, "tick"));
  const bars = ticks.map((t, i) => {
    const h = (CH - B - T) * (t.tokens || 0) / maxTokens;
    const r = svg("rect", { x: L + i * bw + bw * 0.12, y: CH - B - h, width: bw * 0.76, height: Math.max(h, 1), class: "tbar", onclick: () => go(i) });
    r.appendChild(svg("title", {}, "tick " + t.t + ": " + fmtInt(t.tokens) + " tokens, " + fmtInt(t.calls) + " calls, " + fmtInt(t.failures) + " failed, " + fmtCost(t.cost)));
    chart.appendChild(r);
    if (t.failures) chart.appendChild(svg("circle", { cx: L + (i + 0.5) * bw, cy: T + 4, r: 4, class: "fail" }));
    if (t.iv && t.iv.length) {
      const mark = svg("line", { x1: L + i * bw, y1: T, x2: L + i * bw, y2: CH - B, class: "ivline" });
      mark.appendChild(svg("title", {}, "before tick " + t.t + ": " + t.iv.map(ivText).join("; ")));
      chart.appendChild(mark);
    }
    if (ticks.length <= 40 || i % Math.ceil(ticks.length / 40) === 0) chart.appendChild(svg("text", { x: L + (i + 0.5) * bw, y: CH - B + 16, class: "xlab" }, t.t));
    return r;
  });
  if (maxCost > 0) {
    const cy = (v) => CH - B - (CH - B - T) * v / maxCost;
    const pts = ticks.map((t, i) => (L + (i + 0.5) * bw) + "," + cy(t.cost || 0)).join(" ");
    chart.appendChild(svg("polyline", { points: pts, class: "costline" }));
    chart.appendChild(svg("line", { x1: CW - RM, y1: T, x2: CW - RM, y2: CH - B, class: "axis" }));
    for (const v of [0, maxCost / 2, maxCost]) {
      chart.appendChild(svg("text", { x: CW - RM + 6, y: cy(v) + 4, class: "ylab cost right" }, fmtCost(v)));
    }
    chart.appendChild(svg("text", { x: CW - 10, y: mid, class: "axistitle cost", transform: "rotate(90 " + (CW - 10) + " " + mid + ")" }, "cost (USD)"));
  }
  const tt = $("tick-table");
  tt.appendChild(el("thead", {}, el("tr", {}, ...["tick", "calls", "failed", "fallbacks", "tokens", "cost", "wall time"].map((h) => el("th", {}, h)))));
  const tbody = el("tbody");
  const rows = ticks.map((t, i) => {
    const tr = el("tr", { onclick: () => go(i) }, el("td", {}, t.t + (t.committed ? "" : " *")), el("td", {}, fmtInt(t.calls)),
      el("td", { class: t.failures ? "bad" : "" }, fmtInt(t.failures)), el("td", {}, t.fallbacks.length),
      el("td", {}, fmtInt(t.tokens)), el("td", {}, fmtCost(t.cost)), el("td", {}, fmtWall(t.wall)));
    tbody.appendChild(tr);
    return tr;
  });
  tt.appendChild(tbody);

  // -- the world's own state fields over ticks --------------------------------------------------
  const PALETTE = ["#2f5fd0", "#2b8a3e", "#e8a200", "#ae3ec9", "#0c8599", "#f06595", "#74b816", "#5c7cfa", "#868e96"];
  const fieldCurs = []; // per chart: the line marking the current tick, and its x scale
  if (D.fields && D.fields.length) {
    $("fields").hidden = false;
    const box = $("field-charts");
    const FW = 1000, FH = 190, FL = 74, FR = 14, FT = 12, FB = 40;
    const FM = (FT + FH - FB) / 2;
    for (const f of D.fields) {
      const lo = Math.min(f.t[0], ticks[0].t - 1), hi = Math.max(f.t[f.t.length - 1], ticks[ticks.length - 1].t);
      // half a tick of room at each end, so a bar at the first tick clears the y axis
      const x = (t) => FL + (FW - FL - FR) * (t - lo + 0.5) / (hi - lo + 1);
      const chartBox = el("div", { class: "fieldchart" }, el("h3", {}, f.f));
      const g = svg("svg", { class: "fchart", viewBox: "0 0 " + FW + " " + FH, role: "img", "aria-label": f.f + " over ticks" });
      g.appendChild(svg("line", { x1: FL, y1: FH - FB, x2: FW - FR, y2: FH - FB, class: "axis" }));
      g.appendChild(svg("line", { x1: FL, y1: FT, x2: FL, y2: FH - FB, class: "axis" }));
      g.appendChild(svg("text", { x: (FL + FW - FR) / 2, y: FH - 6, class: "axistitle" }, "after tick"));
      g.appendChild(svg("text", { x: 14, y: FM, class: "axistitle", transform: "rotate(-90 14 " + FM + ")" }, f.kind === "num" ? "value" : "characters"));
      const step = Math.max(1, Math.ceil((hi - lo + 1) / 40));
      for (let t = lo; t <= hi; t++) if ((t - lo) % step === 0) g.appendChild(svg("text", { x: x(t), y: FH - FB + 16, class: "xlab" }, t));
      // the y axis: five values with grid lines, from lo to hi of the chart's scale
      const yaxis = (y, low, high, whole) => {
        for (let k = 0; k <= 4; k++) {
          const v = low + (high - low) * k / 4;
          g.appendChild(svg("line", { x1: FL, y1: y(v), x2: FW - FR, y2: y(v), class: "grid" }));
          g.appendChild(svg("text", { x: FL - 6, y: y(v) + 4, class: "ylab" }, whole ? String(Math.round(v)) : String(+v.toFixed(3))));
        }
      };
      if (f.kind === "num") {
        const vals = f.min.concat(f.max).filter((v) => v !== null);
        let ymin = Math.min(...vals), ymax = Math.max(...vals);
        if (ymin === ymax) { ymin -= 1; ymax += 1; }
        const y = (v) => FH - FB - (FH - FB - FT) * (v - ymin) / (ymax - ymin);
        yaxis(y, ymin, ymax, false);
        const idx = f.t.map((_, k) => k).filter((k) => f.mean[k] !== null);
        const band = idx.map((k) => x(f.t[k]) + "," + y(f.max[k])).concat(idx.slice().reverse().map((k) => x(f.t[k]) + "," + y(f.min[k])));
        if (idx.length > 1) g.appendChild(svg("polygon", { points: band.join(" "), class: "band" }));
        if (idx.length > 1) g.appendChild(svg("polyline", { points: idx.map((k) => x(f.t[k]) + "," + y(f.mean[k])).join(" "), class: "meanline" }));
        for (const k of idx) {
          const dot = svg("circle", { cx: x(f.t[k]), cy: y(f.mean[k]), r: 3.5, class: "meandot" });
          dot.appendChild(svg("title", {}, "after tick " + f.t[k] + ": mean " + (+f.mean[k].toFixed(3)) + ", min " + f.min[k] + ", max " + f.max[k] + " (" + f.n[k] + " characters)"));
          g.appendChild(dot);
        }
        chartBox.appendChild(el("div", { class: "catlegend muted" }, "mean (line) and lowest–highest (shaded) over the characters"));
      } else {
        // a whole number of characters at each of the five grid lines
        const most = 4 * Math.ceil(Math.max(1, ...f.counts.map((row) => row.reduce((a, b) => a + b, 0))) / 4);
        const y = (v) => FH - FB - (FH - FB - FT) * v / most;
        yaxis(y, 0, most, true);
        const w = Math.max(3, Math.min(40, (FW - FL - FR) / (hi - lo + 1) * 0.7));
        f.t.forEach((t, k) => {
          let base = 0;
          f.counts[k].forEach((n, c) => {
            if (!n) return;
            const r = svg("rect", { x: x(t) - w / 2, y: y(base + n), width: w, height: y(base) - y(base + n), fill: PALETTE[c % PALETTE.length] });
            r.appendChild(svg("title", {}, "after tick " + t + ": " + f.cats[c] + " " + n));
            g.appendChild(r);
            base += n;
          });
        });
        chartBox.appendChild(el("div", { class: "catlegend" }, ...f.cats.map((c, k) =>
          el("span", {}, el("span", { class: "swatch", style: "background:" + PALETTE[k % PALETTE.length] }), c))));
      }
      for (const t of ticks) {
        if (!t.iv || !t.iv.length) continue;
        const mark = svg("line", { x1: x(t.t - 0.5), y1: FT, x2: x(t.t - 0.5), y2: FH - FB, class: "ivline" });
        mark.appendChild(svg("title", {}, "before tick " + t.t + ": " + t.iv.map(ivText).join("; ")));
        g.appendChild(mark);
      }
      const curLine = svg("line", { x1: 0, y1: FT, x2: 0, y2: FH - FB, class: "curline" });
      g.appendChild(curLine);
      fieldCurs.push([curLine, x]);
      chartBox.appendChild(g);
      box.appendChild(chartBox);
    }
  }

  const ct = $("char-table");
  ct.appendChild(el("thead", {}, el("tr", {}, ...["character", "path (location and ticks)", "calls", "tokens", "cost"].map((h) => el("th", {}, h)))));
  const cbody = el("tbody");
  const charRows = chars.map((ch, c) => {
    const tr = el("tr", { class: "char", onclick: () => follow(c === followed ? -1 : c) },
      el("td", {}, el("span", { class: "swatch", style: "background:" + colour(c) }), ch.name, el("div", { class: "muted small" }, ch.id)),
      el("td", { class: "path" }, pathText(pathOf(c))),
      el("td", {}, fmtInt(ch.calls) + (ch.failures ? " (" + ch.failures + " failed)" : "")),
      el("td", {}, fmtInt(ch.tokens)), el("td", {}, fmtCost(ch.cost)));
    const mem = el("tr", { class: "memory", hidden: "" }); // filled when first opened
    cbody.append(tr, mem);
    return [tr, mem];
  });
  ct.appendChild(cbody);
  function memoryOf(c) {
    const ch = chars[c];
    const box = el("div", { class: "memorybox" }, el("b", {}, "Memory summary over time"));
    let memory = ch.memory;
    if (memory === undefined) {
      const all = side("memory.js", () => { if (onMemory) onMemory(); });
      if (typeof all === "string") {
        box.appendChild(el("p", { class: "muted" }, all === "missing" ? "Not available: " + missingText() : "Loading…"));
        return box;
      }
      memory = all[c] || [];
    }
    if (ch.memory_versions > memory.length) {
      box.appendChild(el("span", { class: "muted small" }, " (" + memory.length + " of " + ch.memory_versions + " versions, evenly spread)"));
    }
    const list = memory.filter((m) => m[1]);
    if (!list.length) box.appendChild(el("p", { class: "muted" }, "(no summary yet)"));
    for (const [tick, text] of list) box.appendChild(el("p", {}, el("span", { class: "badge" }, "after tick " + tick), " " + text));
    return box;
  }
  $("filter").addEventListener("input", (e) => {
    const q = e.target.value.toLowerCase();
    chars.forEach((ch, c) => {
      const show = !q || ch.name.toLowerCase().includes(q) || ch.id.includes(q);
      charRows[c][0].hidden = !show;
      if (!show) charRows[c][1].hidden = true;
      else charRows[c][1].hidden = c !== followed;
    });
  });

  // -- state -----------------------------------------------------------------------------------
  const slider = $("slider");
  slider.max = String(ticks.length - 1);
  function go(i) {
    cur = Math.max(0, Math.min(ticks.length - 1, i));
    slider.value = String(cur);
    const label = "Tick " + ticks[cur].t + " of " + ticks[0].t + "–" + ticks[ticks.length - 1].t;
    $("tick-label").textContent = label;
    slider.setAttribute("aria-valuetext", label);
    cells.forEach((cell, k) => cell.classList.toggle("current", k === cur));
    bars.forEach((bar, k) => bar.classList.toggle("current", k === cur));
    rows.forEach((row, k) => row.classList.toggle("current", k === cur));
    for (const [line, x] of fieldCurs) {
      line.setAttribute("x1", String(x(ticks[cur].t)));
      line.setAttribute("x2", String(x(ticks[cur].t)));
    }
    drawMap();
    drawDetail();
    setHash();
  }
  function setHash() {
    const hash = "#tick=" + ticks[cur].t + (followed >= 0 ? "&char=" + encodeURIComponent(chars[followed].id) : "");
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }
  function follow(c) {
    followed = c;
    setHash();
    charRows.forEach(([tr, mem], k) => { tr.classList.toggle("hl", k === c); mem.hidden = k !== c; });
    if (c >= 0) {
      const row = charRows[c][1];
      const fill = () => row.replaceChildren(el("td", { colspan: 5 }, memoryOf(c)));
      onMemory = fill;
      fill();
    }
    drawTrail();
    drawMap();
    drawDetail();
  }
  // The URL fragment picks the tick and the followed character: #tick=3&char=ada
  function fromHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const c = chars.findIndex((x) => x.id === params.get("char"));
    if (c >= 0 && c !== followed) follow(c);
    const i = ticks.findIndex((t) => String(t.t) === params.get("tick"));
    if (i >= 0) go(i);
    return i >= 0;
  }
  slider.addEventListener("input", () => go(Number(slider.value)));
  $("prev").addEventListener("click", () => go(cur - 1));
  $("next").addEventListener("click", () => go(cur + 1));
  document.addEventListener("keydown", (e) => {
    if (e.target === slider || e.target.tagName === "INPUT" || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "ArrowLeft") { go(cur - 1); e.preventDefault(); }
    else if (e.key === "ArrowRight") { go(cur + 1); e.preventDefault(); }
    else if (e.key === "Home") { go(0); e.preventDefault(); }
    else if (e.key === "End") { go(ticks.length - 1); e.preventDefault(); }
  });
  window.addEventListener("hashchange", fromHash);
  if (!fromHash()) go(ticks.length - 1); // the latest tick first
})();
