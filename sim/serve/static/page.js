// sim serve's page: everything it shows comes from the JSON API (docs/serve.md), and
// every piece of world text is put in the page as text (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PAGE = 200; // characters per page of the list
const DOTS = 8; // characters drawn by name at one place; more are counted
const SCENES = 20; // scenes shown at once (more on request)

const state = {
  world: null, // GET /api/world
  offset: 0,
  tick: null, // the tick shown
  logged: [],
  scenesShown: SCENES,
  view: null, // GET /api/ticks/{n}
  colours: new Map(),
  selected: null,
  running: false,
  runOrder: 0, // the newest run state shown (its `order`)
  loading: false, // the world is being loaded, or did not load (GET /api/world: 503, 422)
  preview: false, // the views shown are a big world's first look, taken before its load
  ended: false, // a load's end was heard (`hello`, `loaded`): a first look answered is stale
  asking: null, // the next GET /api/world while the world loads
};

function $(id) { return document.getElementById(id); }

// The world, its network, its charts and the character inspected are asked for again at
// each change (or click), and the answers can come back out of order (each is read on a
// thread of the server's): one asked for before the answer shown is older, and dropped.
const asked = { world: 0, network: 0, charts: 0, character: 0 };
const shown = { world: 0, network: 0, charts: 0, character: 0 };

async function latest(kind, path) {
  const n = ++asked[kind];
  const data = await api(path);
  if (n < shown[kind]) return null;
  shown[kind] = n;
  return data;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    const error = new Error(data.error || `HTTP ${response.status}`);
    error.load = data.load || null; // 503: the world is loading; 422: it did not load
    throw error;
  }
  return data;
}

// -- colours: characters in hues spread by the golden angle, two lightnesses -------------

function hash(text) {
  let h = 0;
  for (const ch of text) h = (h * 31 + ch.codePointAt(0)) >>> 0;
  return h;
}

// Few characters: hues evenly spread around the wheel; many: spread by the golden angle.
function colour(id, index, total) {
  if (!state.colours.has(id)) {
    if (index === undefined) index = hash(id);
    const even = total !== undefined && total <= 24;
    const hue = Math.round(even ? (index * 360) / total : (index * 137.508) % 360);
    const light = index % 2 ? 32 : 42;
    state.colours.set(id, `hsl(${hue} 70% ${light}%)`);
  }
  return state.colours.get(id);
}

// -- the world -------------------------------------------------------------------------

async function loadWorld() {
  // a big world's first look while it loads (`preview`), until its `loaded` event
  const world = await latest("world", `/api/world?offset=${state.offset}&limit=${PAGE}&preview=1`);
  if (world === null) return false; // a later answer is shown
  if (world.preview && state.ended) return false; // answered before the load's end came
  state.world = world;
  state.preview = world.preview;
  state.logged = world.logged;
  $("world-name").textContent = world.name;
  document.title = `${world.name} · sim serve`;
  $("world-tick").textContent = `tick ${world.tick}`;
  $("mode").textContent = world.read_only ? "read-only" : "";
  $("mode").hidden = !world.read_only;
  for (const id of ["run", "pause", "step"]) $(id).disabled = world.read_only;
  for (const form of ["inject-form", "set-form", "ask-form", "history-form"]) {
    for (const input of $(form).elements) input.disabled = world.read_only;
  }
  const all = [...world.characters].sort((a, b) => a.id.localeCompare(b.id));
  all.forEach((c, i) => colour(c.id, world.offset + i, world.total_characters));
  fillSelect($("inject-at"), world.locations, "everywhere");
  fillSelect($("ask-who"), world.characters, "everyone");
  showPeople();
  showRun(world.run);
  timeline();
  drawMap();
  return true;
}

function fillSelect(select, items, first) {
  const keep = select.value;
  select.replaceChildren(el("option", { value: "" }, first));
  for (const item of items) select.append(el("option", { value: item.id }, item.name));
  select.value = keep;
}

function showPeople() {
  const world = state.world;
  const places = new Map(world.locations.map((l) => [l.id, l.name]));
  const list = $("people");
  list.replaceChildren();
  for (const c of world.characters) {
    const button = el("button", { type: "button" }, c.name);
    button.style.color = colour(c.id);
    button.addEventListener("click", () => inspect(c.id));
    list.append(el("li", {}, button, " ", el("span", { class: "where" }, c.location_name || places.get(c.location) || c.location || "")));
  }
  const last = Math.min(world.offset + world.characters.length, world.total_characters);
  $("people-count").textContent = `${world.total_characters}`;
  $("people-page").textContent = world.total_characters
    ? `${world.offset + 1}–${last} of ${world.total_characters}` : "none";
  $("people-prev").disabled = world.offset === 0;
  $("people-next").disabled = last >= world.total_characters;
}

// -- the map: places on a ring, their connections, who is there, this tick's moves ------

const RING_LABELS = 16; // past this many places, each name goes outward along its radius

// Where each place is drawn: on a wide ring with its name above it, or, for more than
// RING_LABELS places (whose names above them would overlap), on a round ring with the
// names outward along the radii and the counts inward.
function layout(locations) {
  const at = new Map();
  const crowded = locations.length > RING_LABELS;
  const [rx, ry] = crowded ? [140, 140] : [300, 215];
  locations.forEach((loc, i) => at.set(loc.id, ring(locations.length, i, rx, ry)));
  return { at, crowded };
}

// The i-th of n points on a ring around the drawing's centre, from the top, clockwise.
function ring(n, i, rx, ry) {
  const angle = (2 * Math.PI * i) / Math.max(n, 1) - Math.PI / 2;
  return { x: 400 + rx * Math.cos(angle), y: 280 + ry * Math.sin(angle), angle };
}

// A label along a place's radius, `from` px beyond its node (negative: inward), reading
// left to right on either side of the ring.
function radial(p, from, text, cls) {
  const cos = Math.cos(p.angle), sin = Math.sin(p.angle);
  const right = cos >= -1e-9;
  const degrees = (p.angle * 180) / Math.PI + (right ? 0 : 180);
  const x = p.x + from * cos, y = p.y + from * sin;
  const outward = from >= 0;
  return svg("text", {
    class: cls, x, y, dy: "0.35em",
    "text-anchor": outward === right ? "start" : "end",
    transform: `rotate(${degrees.toFixed(2)} ${x.toFixed(1)} ${y.toFixed(1)})`,
  }, text);
}

function drawMap() {
  const world = state.world;
  const map = $("map");
  map.replaceChildren();
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5",
    markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#555" }));
  defs.append(marker);
  map.append(defs);
  const { at, crowded } = layout(world.locations);
  const drawn = new Set();
  for (const loc of world.locations) {
    for (const other of loc.connections) {
      const a = at.get(loc.id), b = at.get(other);
      const key = [loc.id, other].sort().join("\u0000");
      if (!a || !b || drawn.has(key)) continue;
      drawn.add(key);
      map.append(svg("line", { class: "edge", x1: a.x, y1: a.y, x2: b.x, y2: b.y }));
    }
  }
  // who is where: by name when every character is in hand and few are at a place
  const whole = world.total_characters <= world.characters.length;
  const here = new Map();
  if (whole) {
    for (const c of world.characters) {
      if (!here.has(c.location)) here.set(c.location, []);
      here.get(c.location).push(c);
    }
  }
  const moves = state.view && state.view.tick === world.tick ? state.view.moves : [];
  for (const move of moves) {
    const a = at.get(move.from.id), b = at.get(move.to.id);
    if (!a || !b) continue;
    const mx = (a.x + b.x) / 2 + (b.y - a.y) * 0.15, my = (a.y + b.y) / 2 - (b.x - a.x) * 0.15;
    const path = svg("path", { class: "move", d: `M${a.x},${a.y} Q${mx},${my} ${b.x},${b.y}` });
    path.setAttribute("stroke", colour(move.character.id));
    path.append(svg("title", {}, `${move.character.name}: ${move.from.name} → ${move.to.name}`));
    map.append(path);
  }
  for (const loc of world.locations) {
    const p = at.get(loc.id);
    const group = svg("g", { class: "loc" });
    const counted = `${loc.count} character${loc.count === 1 ? "" : "s"}`;
    if (crowded) {
      const node = svg("circle", { class: "place", cx: p.x, cy: p.y, r: 6 });
      node.append(svg("title", {}, `${loc.name}: ${counted}`));
      group.append(node, radial(p, 10, loc.name, "place-name crowded"), radial(p, -9, String(loc.count), "count crowded"));
      map.append(group);
      continue;
    }
    group.append(svg("circle", { class: "place", cx: p.x, cy: p.y, r: 9 }));
    group.append(svg("text", { class: "place-name", x: p.x, y: p.y - 14, "text-anchor": "middle" }, loc.name));
    const people = here.get(loc.id) || [];
    if (!whole || people.length > DOTS) {
      group.append(svg("text", { class: "count", x: p.x, y: p.y + 24, "text-anchor": "middle" }, counted));
    } else {
      people.forEach((c, i) => {
        const y = p.y + 22 + i * 14;
        const dot = svg("circle", { class: "dot", cx: p.x - 30, cy: y - 4, r: 5, fill: colour(c.id) });
        dot.append(svg("title", {}, c.name));
        dot.addEventListener("click", () => inspect(c.id));
        group.append(dot);
        const label = svg("text", { class: "who", x: p.x - 22, y, fill: colour(c.id) }, c.name);
        label.addEventListener("click", () => inspect(c.id));
        group.append(label);
      });
    }
    map.append(group);
  }
  $("map-note").textContent = `tick ${world.tick}` + (moves.length ? `: ${moves.length} moved` : "") +
    (world.locations_shown === "busiest"
      ? `; the ${world.locations.length} busiest of ${world.total_locations} places` : "");
  const legend = $("legend");
  legend.replaceChildren();
  if (whole && world.characters.length <= 40) {
    for (const c of world.characters) {
      const item = el("span", {}, c.name);
      item.style.setProperty("--c", colour(c.id));
      legend.append(item);
    }
  }
}

// -- the timeline and a tick's scenes ------------------------------------------------

function timeline() {
  const scrub = $("scrub");
  const logged = state.logged;
  if (state.preview) {  // a tick's view reads the world: it waits for the load
    scrub.disabled = true;
    $("tick-label").textContent = "the logged ticks show once the world is loaded";
    return;
  }
  scrub.max = String(Math.max(logged.length - 1));
  scrub.disabled = logged.length === 0;
  if (!logged.length) {  // none yet, or all rewound
    state.tick = null;
    state.view = null;
    $("tick-label").textContent = "no tick logged yet";
    $("tick-numbers").textContent = "";
    $("scenes").replaceChildren();
    historyControls();
    return;
  }
  if (state.tick === null || $("follow").checked || !logged.includes(state.tick)) {
    showTick(logged[logged.length - 1]);
  }
}

async function showTick(tick) {
  state.tick = tick;
  state.scenesShown = SCENES;
  const logged = state.logged;
  const index = logged.indexOf(tick);
  $("scrub").value = String(index);
  $("scrub").setAttribute("aria-valuetext", `Tick ${tick}`);
  $("tick-label").textContent = `Tick ${tick} of ${logged[0]}–${logged[logged.length - 1]}`;
  $("prev").disabled = index <= 0;
  $("next").disabled = index >= logged.length - 1;
  historyControls();
  try {
    const view = await api(`/api/ticks/${tick}`);
    if (state.tick !== tick) return;
    state.view = view;
    showScenes();
    drawMap();
  } catch (error) {
    $("scenes").replaceChildren(el("p", { class: "muted" }, `tick ${tick}: ${error.message}`));
  }
}

// Rewind and fork go back to the start of the tick shown (as `sim rewind` / `sim fork`).
function historyControls() {
  const off = state.tick === null || Boolean(state.world && state.world.read_only);
  $("rewind").disabled = off || Boolean(state.running);
  $("fork").disabled = off;
  $("rewind").title = off ? "" : `put the world back to the start of tick ${state.tick}; later logs are kept aside`;
  $("fork").title = off ? "" : `a new world beside this one, at the start of tick ${state.tick}`;
}

function historySaid(text, failed) {
  const box = $("history-result");
  box.textContent = text;
  box.classList.toggle("error", Boolean(failed));
}

async function rewindHere() {
  const tick = state.tick;
  try {
    const done = await api("/api/rewind", { tick });
    historySaid(`rewound: the world is at tick ${done.tick}, ready to run tick ${done.next_tick}` +
      (done.moved_to ? ` (${done.logs_moved} later logs kept in ${done.moved_to})` : ""));
    $("follow").checked = true;
    await loadWorld();
    await loadCharts();
    await loadNetwork();
  } catch (error) {
    historySaid(error.message, true);
  }
}

async function forkHere() {
  const tick = state.tick;
  try {
    const made = await api("/api/fork", { tick, to: $("fork-to").value });
    historySaid(`forked: ${made.world} is at tick ${made.tick}, ready to run tick ${made.next_tick}`);
    $("fork-to").value = "";
  } catch (error) {
    historySaid(error.message, true);
  }
}

function showScenes() {
  const view = state.view;
  const cost = view.cost === null ? "cost unknown" : `$${view.cost.toFixed(4)}`;
  $("tick-numbers").textContent =
    `${view.calls} calls, ${view.failures} failed, ${view.tokens.toLocaleString()} tokens, ${cost}` +
    (view.committed ? "" : " (not committed)");
  const box = $("scenes");
  box.replaceChildren();
  for (const iv of view.interventions) {
    box.append(el("p", { class: "muted" }, `${iv.kind} ${iv.where || "everywhere"}: ${iv.what}`));
  }
  for (const scene of view.scenes.slice(0, state.scenesShown)) {
    const rows = el("tbody");
    for (const c of scene.characters) {
      const name = el("td", {}, c.name);
      name.style.color = colour(c.id);
      rows.append(el("tr", {}, name, el("td", {}, [c.action, c.target].filter(Boolean).join(" → ")),
        el("td", {}, c.content), el("td", {}, c.outcome)));
    }
    const table = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "who"), el("th", {}, "action"),
      el("th", {}, "intention"), el("th", {}, "outcome"))), rows);
    box.append(el("div", { class: "scene" }, el("h3", {}, scene.location.name),
      el("p", { class: "narrative" }, scene.narrative), table));
  }
  const more = $("more-scenes");
  more.hidden = view.scenes.length <= state.scenesShown;
  more.textContent = `more scenes (${view.scenes.length - state.scenesShown} left)`;
}

// -- the inspector -------------------------------------------------------------------

function value(v) {
  return typeof v === "string" ? v : JSON.stringify(v, null, 1);
}

async function inspect(id) {
  state.selected = id;
  const box = $("inspector");
  try {
    const data = await latest("character", `/api/characters/${encodeURIComponent(id)}`);
    if (data === null || state.selected !== id) return; // a later choice is shown
    const entity = data.entity || {};
    const identity = entity.identity || {};
    const rows = el("dl");
    const add = (term, node) => rows.append(el("dt", {}, term), el("dd", {}, node));
    add("id", data.id);
    const books = data.books;
    if (books) {
      const cost = books.cost === null ? "cost unknown" : `$${books.cost.toFixed(4)}`;
      add("calls", `${books.calls} calls for them (${books.failures} failed), ${books.tokens.toLocaleString()} tokens, ${cost} over the logged ticks`);
    }
    for (const key of ["description", "personality"]) if (identity[key]) add(key, value(identity[key]));
    if (Array.isArray(identity.goals) && identity.goals.length) {
      add("goals", el("ul", {}, ...identity.goals.map((g) => el("li", {}, value(g)))));
    }
    for (const [key, v] of Object.entries(entity.state || {})) add(`state.${key}`, value(v));
    const memory = entity.memory || {};
    if (memory.summary) add("memory summary", memory.summary);
    if (Array.isArray(memory.cells) && memory.cells.length) {
      add("memories", el("ul", {}, ...memory.cells.map((m) => el("li", {}, `tick ${m.tick}: ${m.text}`))));
    }
    const recalled = data.recalled;
    if (recalled) {
      const archived = new Set((memory.archive || []).map((m) => `tick ${m.tick}: ${m.text}`));
      const items = recalled.lines.map((line) => el("li", {}, line + (archived.has(line) ? " (from the long-term store)" : "")));
      if (recalled.mode === "retrieve") {
        add("retrieval chose", el("div", { class: "recalled" },
          el("p", { class: "muted" }, `for tick ${recalled.tick}'s intention, by recency, importance and relevance:`),
          items.length ? el("ul", {}, ...items) : el("p", {}, "nothing (no memories yet)")));
      } else if (recalled.mode === "window") {
        add("retrieval chose", el("div", { class: "recalled" },
          el("p", { class: "muted" }, `no retrieval: tick ${recalled.tick}'s intention saw a window, the last ${recalled.lines.length} memories`),
          el("ul", {}, ...items)));
      } else {
        add("retrieval chose", el("p", { class: "muted" }, `tick ${recalled.tick}: ${recalled.problem || "the intention's input shows no memory"}`));
      }
    }
    const relations = entity.relationships || {};
    const names = Object.keys(relations);
    if (names.length) {
      add("relationships", el("ul", {}, ...names.slice(0, 50).map((other) => el("li", {}, `${other}: ${value(relations[other])}`))));
    }
    for (const [key, v] of Object.entries(entity)) {
      if (!["identity", "state", "memory", "relationships"].includes(key)) add(key, value(v));
    }
    const title = el("h3", {}, data.name);
    title.style.color = colour(id);
    box.replaceChildren(title, rows);
  } catch (error) {
    if (state.selected === id) box.replaceChildren(el("p", { class: "muted" }, error.message));
  }
}

// -- the relationships network: a deterministic ring (grouped by place), names as text --

const LABELS = 60; // names drawn beside the dots up to this many characters; then on hover


async function loadNetwork() {
  const box = $("network");
  let net;
  try {
    net = await latest("network", `/api/network?preview=${state.preview ? 1 : 0}`);
  } catch (error) {
    $("network-note").textContent = error.message;
    return;
  }
  if (net === null) return; // a later answer is shown
  box.replaceChildren();
  const at = new Map();
  // places (a big world's network) are named along the radii, as on a crowded map
  const crowded = net.by === "place";
  const [rx, ry] = crowded ? [140, 140] : [300, 230];
  net.nodes.forEach((node, i) => at.set(node.id, ring(net.nodes.length, i, rx, ry)));
  const ties = net.by === "place" ? "ties between places" : "ties";
  $("network-note").textContent = net.total_ties
    ? `${net.total_ties} ${net.total_ties === 1 ? "tie" : "ties"} among ${net.total_characters} characters` +
      (net.by === "place" ? " (drawn by place: too many to draw one by one)" : "") +
      (net.place_pairs > net.edges.length ? `; the ${net.edges.length} most tied of ${net.place_pairs} pairs of places shown` : "")
    : "no relationships in this world";
  const top = Math.max(1, ...net.edges.map((e) => e.ties || 1));
  for (const edge of net.edges) {
    const a = at.get(edge.a), b = at.get(edge.b);
    const line = svg("line", { class: "tie", x1: a.x, y1: a.y, x2: b.x, y2: b.y, "data-a": edge.a, "data-b": edge.b });
    if (net.by === "place") {
      line.setAttribute("stroke-width", String(1 + (5 * edge.ties) / top));
      line.append(svg("title", {}, `${edge.ties} ${ties}`));
    } else {
      if (!edge.mutual) line.classList.add("one-way");
      line.setAttribute("stroke-width", String(1 + 2 * (edge.trust ?? 0.5)));
      line.setAttribute("stroke-opacity", String(0.35 + 0.6 * (edge.trust ?? 0.5)));
      const names = new Map(net.nodes.map((n) => [n.id, n.name]));
      const what = [edge.kind, edge.trust === null ? null : `trust ${edge.trust}`, edge.mutual ? null : "one way"].filter(Boolean).join(", ");
      line.append(svg("title", {}, `${names.get(edge.a)} — ${names.get(edge.b)}${what ? ": " + what : ""}`));
    }
    box.append(line);
  }
  for (const node of net.nodes) {
    const p = at.get(node.id);
    const group = svg("g", { class: "network-node", "data-id": node.id });
    if (crowded) {
      const circle = svg("circle", { class: "place-node", cx: p.x, cy: p.y, r: 6 });
      circle.append(svg("title", {}, `${node.name}: ${node.count} characters, ${node.ties} ties within`));
      group.append(circle, radial(p, 10, node.name, "label place-name crowded"), radial(p, -9, String(node.count), "count crowded"));
    } else {
      const dot = svg("circle", { class: "node", cx: p.x, cy: p.y, r: 7, fill: colour(node.id) });
      dot.append(svg("title", {}, node.name));
      dot.addEventListener("click", () => inspect(node.id));
      group.append(dot);
      if (net.nodes.length <= LABELS) {
        const label = svg("text", { class: "label", x: p.x + (p.x >= 400 ? 10 : -10), y: p.y + 4,
          "text-anchor": p.x >= 400 ? "start" : "end", fill: colour(node.id) }, node.name);
        group.append(label);
      }
    }
    box.append(group);
  }
}

// -- charts: an SVG line per series, axes with values and a title ------------------------

function chart(title, ticks, series, unit) {
  const W = 460, H = 180, L = 52, R = 10, T = 30, B = 28;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  box.append(svg("text", { class: "title", x: L, y: 14 }, title));
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const top = Math.max(1, ...values);
  const first = ticks[0], last = ticks[ticks.length - 1];
  const x = (t) => L + (last === first ? (W - L - R) / 2 : ((t - first) / (last - first)) * (W - L - R));
  const y = (v) => H - B - (v / top) * (H - T - B - 10);
  for (let i = 0; i <= 4; i++) { // the y axis: five values
    const v = (top * i) / 4;
    box.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    const shown = v >= 1000 ? `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k` : String(Math.round(v * 100) / 100);
    box.append(svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, shown));
  }
  box.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  box.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  const step = Math.max(1, Math.ceil(ticks.length / 8));
  ticks.forEach((t, i) => {
    if (i % step && i !== ticks.length - 1) return;
    box.append(svg("text", { x: x(t), y: H - B + 12, "text-anchor": "middle" }, t));
  });
  box.append(svg("text", { x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle" }, "tick"));
  box.append(svg("text", { x: 10, y: (T + H - B) / 2, "text-anchor": "middle",
    transform: `rotate(-90 10 ${(T + H - B) / 2})` }, unit));
  series.forEach((s, k) => {
    const points = ticks.map((t, i) => (s.values[i] === null ? null : `${x(t)},${y(s.values[i])}`)).filter(Boolean);
    const hue = Math.round((k * 137.508) % 360);
    box.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: `hsl(${hue} 70% 42%)`, "stroke-width": 2 }));
  });
  if (series.length > 1) { // the legend: under the title, one entry after another
    let at = L;
    series.forEach((s, k) => {
      const hue = Math.round((k * 137.508) % 360);
      box.append(svg("rect", { x: at, y: T - 4, width: 8, height: 8, fill: `hsl(${hue} 70% 42%)` }));
      const label = String(s.name).slice(0, 24);
      box.append(svg("text", { x: at + 11, y: T + 4 }, label));
      at += 22 + label.length * 5.5;
    });
  }
  return el("div", { class: "chart" }, box);
}

async function loadCharts() {
  const history = await latest("charts", "/api/history");
  if (history === null) return; // a later answer is shown
  const box = $("charts");
  box.replaceChildren();
  if (!history.ticks.length) {
    box.append(el("p", { class: "muted" }, "No tick logged yet."));
    return;
  }
  const ticks = history.ticks.map((t) => t.t);
  box.append(chart("Tokens per tick", ticks, [{ name: "tokens", values: history.ticks.map((t) => t.tokens) }], "tokens"));
  box.append(chart("Calls per tick", ticks, [{ name: "calls", values: history.ticks.map((t) => t.calls) },
    { name: "failed", values: history.ticks.map((t) => t.failures) }], "calls"));
  for (const field of history.fields.slice(0, 6)) {
    if (field.kind === "num") {
      box.append(chart(`state.${field.f} (mean, min, max)`, field.t,
        [{ name: "mean", values: field.mean }, { name: "min", values: field.min }, { name: "max", values: field.max }], field.f));
    } else {
      box.append(chart(`state.${field.f} (characters per value)`, field.t,
        field.cats.map((cat, i) => ({ name: cat, values: field.counts.map((row) => row[i]) })), "characters"));
    }
  }
}

// -- scenes as they are written (a streaming provider: [llm] stream) ---------------------

// The "narrative" string of a JSON answer that is still arriving: its characters so far.
function partialNarrative(raw) {
  const key = raw.indexOf('"narrative"');
  if (key < 0) return "";
  let at = key + 11;
  while (at < raw.length && " \t\r\n:".includes(raw[at])) at++;
  if (raw[at] !== '"') return "";
  let out = "";
  const escapes = { n: "\n", t: "\t", r: "\r", b: "\b", f: "\f", '"': '"', "\\": "\\", "/": "/" };
  for (at++; at < raw.length; at++) {
    const ch = raw[at];
    if (ch === '"') break;
    if (ch !== "\\") { out += ch; continue; }
    if (at + 1 >= raw.length) break;
    const code = raw[at + 1];
    if (code === "u") {
      if (at + 6 > raw.length) break;
      const n = parseInt(raw.slice(at + 2, at + 6), 16);
      if (!Number.isNaN(n)) out += String.fromCharCode(n);
      at += 5;
      continue;
    }
    out += escapes[code] ?? code;
    at += 1;
  }
  return out;
}

const live = new Map(); // place -> raw answer text so far
let liveDrawn = null;

function onText(data) {
  if (data.restart) live.set(data.place, "");
  else live.set(data.place, (live.get(data.place) || "") + data.text);
  if (!liveDrawn) liveDrawn = requestAnimationFrame(drawLive);
}

function drawLive() {
  liveDrawn = null;
  const box = $("live-scenes");
  const names = new Map((state.world ? state.world.locations : []).map((l) => [l.id, l.name]));
  box.replaceChildren(el("p", { class: "muted" }, "being written"));
  for (const [place, raw] of live) {
    box.append(el("h3", {}, names.get(place) || place), el("p", { class: "narrative" }, partialNarrative(raw)));
  }
  box.hidden = live.size === 0;
}

function clearLive() {
  live.clear();
  drawLive();
}

// -- the run: live from the server's events ---------------------------------------------

function showRun(run) {
  // an answer to a control can arrive after a later event: the newer state stays shown
  if (!run || run.order < state.runOrder) return;
  state.runOrder = run.order;
  const status = $("status");
  status.classList.toggle("error", Boolean(run.error));
  const bar = $("phase-bar");
  if (run.running) {
    const tick = run.tick === null ? "between ticks" : `tick ${run.tick}`;
    const phase = run.phase ? `${run.phase}: ${run.phase_calls} calls` + (run.phase_failed ? `, ${run.phase_failed} failed` : "") : "";
    const shards = run.workers > 1 ? ` · ${run.workers} workers` : run.note ? ` · ${run.note}` : "";
    status.textContent = `running ${run.done}/${run.ticks} · ${tick}${phase ? " · " + phase : ""}${shards}${run.pausing ? " · pausing after this tick" : ""}`;
    bar.max = run.ticks;
    bar.value = run.done;
  } else {
    status.textContent = run.error ? `stopped: ${run.error}` : run.ticks ? `idle (ran ${run.done} of ${run.ticks})` : "idle";
    bar.value = 0;
  }
  const cost = run.cost === null ? "cost unknown" : `$${run.cost.toFixed(4)}`;
  $("usage").textContent = run.ticks ? `${(run.input_tokens + run.output_tokens).toLocaleString()} tokens, ${cost} this run` : "";
  $("run").disabled = $("step").disabled = run.running || (state.world && state.world.read_only);
  state.running = run.running;
  historyControls();
  $("pause").disabled = !run.running || run.pausing;
}

function listen() {
  const events = new EventSource("/api/events");
  let refreshing = null;
  const refresh = () => {
    if (refreshing) return;
    refreshing = setTimeout(async () => {
      refreshing = null;
      await openWorld();
    }, 50);
  };
  events.addEventListener("hello", (e) => {
    const hello = JSON.parse(e.data);
    showRun(hello.run);
    if (state.loading) onLoad(hello.load);
    // a tick committed before this stream connected (or while it was down) sent its
    // `world` event to no one: the tick it names is the news
    else if (state.world && hello.tick !== null && hello.tick !== state.world.tick) refresh();
  });
  events.addEventListener("loaded", (e) => onLoad(JSON.parse(e.data)));
  // a big world's first look: its views at once, without waiting for the next ask
  events.addEventListener("preview", () => { if (!state.preview && !state.ended) openWorld(); });
  for (const kind of ["run", "phase", "progress", "tick"]) {
    events.addEventListener(kind, (e) => showRun(JSON.parse(e.data)));
  }
  events.addEventListener("text", (e) => onText(JSON.parse(e.data)));
  events.addEventListener("tick", clearLive);
  events.addEventListener("world", refresh);
  events.addEventListener("run", (e) => { if (!JSON.parse(e.data).running) clearLive(); refresh(); });
}

// -- controls ----------------------------------------------------------------------------

function said(text, failed) {
  const box = $("steer-result");
  box.textContent = text;
  box.classList.toggle("error", Boolean(failed));
}

async function control(path, body) {
  try {
    return await api(path, body);
  } catch (error) {
    said(error.message, true);
    return null;
  }
}

function wire() {
  $("run-form").addEventListener("submit", (e) => {
    e.preventDefault();
    control("/api/run", { ticks: Number($("run-ticks").value) }).then((run) => run && showRun(run));
  });
  $("pause").addEventListener("click", () => control("/api/pause", {}).then((run) => run && showRun(run)));
  $("step").addEventListener("click", () => control("/api/step", {}).then((run) => run && showRun(run)));
  $("scrub").addEventListener("input", () => {
    $("follow").checked = false;
    showTick(state.logged[Number($("scrub").value)]);
  });
  $("prev").addEventListener("click", () => { $("follow").checked = false; showTick(state.logged[state.logged.indexOf(state.tick) - 1]); });
  $("next").addEventListener("click", () => showTick(state.logged[state.logged.indexOf(state.tick) + 1]));
  $("rewind").addEventListener("click", rewindHere);
  $("history-form").addEventListener("submit", (e) => { e.preventDefault(); forkHere(); });
  $("more-scenes").addEventListener("click", () => { state.scenesShown += SCENES; showScenes(); });
  $("people-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadWorld(); });
  $("people-next").addEventListener("click", () => { state.offset += PAGE; loadWorld(); });
  $("inject-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const at = $("inject-at").value;
    const body = at ? { at, text: $("inject-text").value } : { everywhere: true, text: $("inject-text").value };
    const made = await control("/api/inject", body);
    if (made) { said(`recorded: ${made.recorded} (applies at tick ${made.applies_at_tick})`); $("inject-text").value = ""; }
  });
  $("set-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const made = await control("/api/set", { assignment: $("set-assignment").value });
    if (made) { said(`recorded: ${made.recorded}`); loadWorld(); loadNetwork(); if (state.selected) inspect(state.selected); }
  });
  $("ask-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const who = $("ask-who").value;
    const body = who ? { character: who, question: $("ask-question").value } : { everyone: true, question: $("ask-question").value };
    said("asking…");
    const asked = await control("/api/ask", body);
    if (asked) said(asked.answers.map((a) => `${a.name}: ${a.answer ?? "failed: " + a.error}`).join("\n\n"));
  });
}

// -- a study's or a sweep's folder: its runs and how far each has gone, refreshed --------

const RUNS_POLL = 1000; // ms between two readings of the runs' progress

function showRuns(view) {
  const body = $("runs").tBodies[0];
  body.replaceChildren();
  for (const run of view.runs) {
    const bar = el("progress", { max: "1", value: "0" });
    if (run.target !== null && run.start_tick !== null && run.tick !== null) {
      bar.max = Math.max(1, run.target - run.start_tick);
      bar.value = run.tick - run.start_tick;
    } else if (run.status === "finished") {
      bar.value = 1;
    }
    const tick = run.tick === null ? "" : run.target === null ? `${run.tick}` : `${run.tick} of ${run.target}`;
    const settings = Object.entries(run.overrides || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
    const status = el("td", { class: `status-${run.status.replace(" ", "-")}` }, run.status);
    if (run.problem) status.title = run.problem;
    body.append(el("tr", {}, el("td", {}, run.group ?? ""), el("td", {}, run.name), status,
      el("td", { class: "tick" }, tick), el("td", {}, bar), el("td", {}, run.seed ?? ""), el("td", {}, settings)));
  }
  $("runs-note").textContent = `${view.kind}: ${view.finished} of ${view.total} finished, ${view.in_progress} in progress` +
    (view.ticks === null ? "" : `, ${view.ticks} ticks each`);
}

async function watchRuns(first) {
  $("runs-panel").hidden = false;
  for (const id of ["run-form", "live", "world-tick"]) $(id).hidden = true;
  document.querySelector("main").hidden = true;
  const name = `${first.kind === "study" ? "Study" : "Sweep"}`;
  $("world-name").textContent = name;
  document.title = `${name} · sim serve`;
  showRuns(first);
  for (;;) {
    await new Promise((done) => setTimeout(done, RUNS_POLL));
    try {
      showRuns(await api("/api/runs"));
    } catch (error) {
      $("runs-note").textContent = error.message;
    }
  }
}

// -- the world's load: a big world is read and validated after the server starts --------

// Where the load stands ("loading", "ready" or "invalid": each problem named), as the
// server tells it: a 503 or 422 answer, the `hello` and `loaded` events.
function showLoad(load) {
  if (load.name) {  // from world.json, validated before the rest
    $("world-name").textContent = load.name;
    $("world-tick").textContent = `tick ${load.tick}`;
  }
  const box = $("load");
  box.hidden = load.state === "ready";
  box.classList.toggle("error", load.state === "invalid");
  // a first look is shown while the load runs (the views of names and places)
  const look = load.state === "loading" && state.preview;
  document.querySelector("main").hidden = load.state !== "ready" && !look;
  let checked = load.files ? `: ${load.checked.toLocaleString("en")} of ${load.files.toLocaleString("en")} files checked` : "";
  if (load.files && load.checked && load.seconds) { // at the pace so far
    checked += `, about ${Math.ceil((load.seconds / load.checked) * (load.files - load.checked))} s left`;
  }
  $("load-text").textContent = look
    ? `A first look: who is where, read before the full check${load.skipped ? ` (${load.skipped.toLocaleString("en")} files left out)` : ""}. ` +
      "Loading the world (every file is read and validated); the page shows it when done…"
    : load.state === "loading"
    ? `Loading the world (every file is read and validated)${checked}…`
    : load.state === "invalid"
      ? `This world could not be loaded (${load.problems.length || 1} ` +
        `problem${load.problems.length > 1 ? "s" : ""}); fix the files and it is loaded again:`
      : "";
  const list = $("load-problems");
  list.replaceChildren();
  for (const p of load.problems || []) {
    list.append(el("li", {}, el("code", {}, p.file || "the world"),
      p.field ? el("span", {}, " field ", el("code", {}, p.field)) : "", `: ${p.problem}`));
  }
  if (load.state === "invalid" && !(load.problems || []).length) list.append(el("li", {}, load.error || ""));
}

async function onLoad(load) {
  if (!load) return;
  state.loading = load.state !== "ready";
  if (load.state !== "loading") { // the load's answer replaces the look
    state.preview = false;
    state.ended = true;
  }
  showLoad(load);
  if (load.state === "ready") await openWorld();
}

async function openWorld() {
  try {
    if (!(await loadWorld())) return;
    if (state.preview) {  // the first look: its views now, the rest when `loaded` comes
      state.loading = true;
      showLoad(state.world.load);
      await loadNetwork();
      return;
    }
    state.loading = false;
    showLoad({ state: "ready" });
    await loadCharts();
    await loadNetwork();
  } catch (error) {
    if (error.load && error.load.state !== "ready") {
      state.loading = true;
      showLoad(error.load);
      // ask again while it loads (each answer comes after a wait, with the progress)
      if (error.load.state === "loading" && !state.asking) {
        state.asking = setTimeout(() => { state.asking = null; openWorld(); }, 250);
      }
      return;
    }
    $("status").textContent = error.message;
    $("status").classList.add("error");
  }
}

async function start() {
  try {
    const runs = await api("/api/runs");
    if (runs.kind) return watchRuns(runs);
  } catch (error) {
    $("status").textContent = error.message;
  }
  wire();
  await openWorld();
  listen();
}

start();
