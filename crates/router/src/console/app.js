// The Cellfleet console: polls this node's /ui/api/* (the admin calls the
// CLI makes) and draws the cluster, the Cells and one Cell. No framework,
// no build step; every value reaches the page through textContent.
"use strict";

const POLL_MS = 1000;          // cluster refresh
const TICK_MS = 250;           // countdowns
const RATE_WINDOW_MS = 10000;  // rates and latencies over the last 10 s
const HISTORY_MS = 5 * 60000;  // plots keep 5 minutes
const PLOT_MIN_MS = 60000;     // and show at least the last minute
const COLORS = ["#0969da", "#1a7f37", "#bf3989", "#9a6700", "#8250df", "#cf222e", "#1b7c83", "#57606a"];

const state = {
  cluster: null,       // the last /ui/api/cluster answer
  fetchedAt: 0,        // Date.now() when it arrived
  history: new Map(),  // node id -> [stats samples], oldest first
  cellsNext: null,     // the last search's continuation
  cellTimer: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function setStatus(text, error = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

// The answering node's clock now (its now_ms plus the time since).
function serverNow() {
  return state.cluster ? state.cluster.now_ms + (Date.now() - state.fetchedAt) : Date.now();
}

// As `cellfleet leases`: retired, late (live, renewal overdue), live,
// expired; judged at the instant the node answered (`answeredAt`), so a
// lease renewed since is not shown late because this page has not asked
// again yet. Only the countdown ticks between answers.
function leaseState(lease, answeredAt = state.cluster ? state.cluster.now_ms : Date.now()) {
  if (lease.draining) return "retired";
  if (!lease.live || answeredAt >= lease.expires_at_ms) return "expired";
  const length = lease.expires_at_ms - lease.renewed_at_ms;
  if (lease.renewed_at_ms > 0 && answeredAt - lease.renewed_at_ms > length / 2) return "late";
  return "live";
}

function seconds(ms) {
  return `${(Math.abs(ms) / 1000).toFixed(1)} s`;
}

function countdown(lease, leaseNow, now) {
  const left = lease.expires_at_ms - now;
  if (leaseNow === "expired") return left >= 0 ? "expired" : `expired ${seconds(left)} ago`;
  return `expires in ${seconds(Math.max(0, left))}`;
}

// ---- rates and latencies from successive samples ----

function remember(stats) {
  for (const sample of stats) {
    const samples = state.history.get(sample.node_id) || [];
    if (!samples.length || samples[samples.length - 1].at_ms < sample.at_ms) samples.push(sample);
    while (samples.length > 2 && samples[0].at_ms < sample.at_ms - HISTORY_MS) samples.shift();
    state.history.set(sample.node_id, samples);
  }
}

// The sample at least `window` before the last one (or the oldest).
function baseline(samples, window) {
  const last = samples[samples.length - 1];
  let base = samples[0];
  for (const sample of samples) {
    if (sample.at_ms <= last.at_ms - window) base = sample;
  }
  return base;
}

function rate(samples, field, window = RATE_WINDOW_MS) {
  if (!samples || samples.length < 2) return null;
  const last = samples[samples.length - 1];
  const base = baseline(samples, window);
  const dt = (last.at_ms - base.at_ms) / 1000;
  if (dt <= 0) return null;
  return Math.max(0, (last[field] - base[field]) / dt);
}

// The q-quantile of the observations between two histogram snapshots, as
// the upper bound of its bucket, in ms ("> max" above the largest bound).
function quantile(samples, field, q) {
  if (!samples || samples.length < 2) return "–";
  const now = samples[samples.length - 1][field];
  const then = baseline(samples, RATE_WINDOW_MS)[field];
  if (!now || !then) return "–";
  const total = now.count - then.count;
  if (total <= 0) return "–";
  for (let i = 0; i < now.bounds.length; i++) {
    if (now.cumulative[i] - then.cumulative[i] >= q * total) return `≤ ${formatMs(now.bounds[i] * 1000)}`;
  }
  return `> ${formatMs(now.bounds[now.bounds.length - 1] * 1000)}`;
}

function formatMs(ms) {
  return ms < 1 ? `${ms.toFixed(1)} ms` : `${Math.round(ms)} ms`;
}

function formatRate(value) {
  if (value === null) return "–";
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

// Rate series over the history, one point per sample pair.
function series(samples, field) {
  const points = [];
  for (let i = 1; i < (samples || []).length; i++) {
    const dt = (samples[i].at_ms - samples[i - 1].at_ms) / 1000;
    if (dt > 0) points.push([samples[i].at_ms, Math.max(0, (samples[i][field] - samples[i - 1][field]) / dt)]);
  }
  return points;
}

// ---- drawing ----

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

// How much time the plots span: the history held, between a minute and
// HISTORY_MS.
function plotSpan() {
  let oldest = serverNow();
  for (const samples of state.history.values()) if (samples.length) oldest = Math.min(oldest, samples[0].at_ms);
  return Math.min(HISTORY_MS, Math.max(PLOT_MIN_MS, serverNow() - oldest));
}

function sparkline(points) {
  const width = 160, height = 28;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "sparkline" });
  if (points.length < 2) return root;
  const now = serverNow();
  const span = plotSpan();
  const max = Math.max(1, ...points.map((p) => p[1]));
  const path = points.map(([t, v], i) => {
    const x = width - ((now - t) / span) * width;
    const y = height - 2 - (v / max) * (height - 4);
    return `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
  }).join("");
  root.append(svg("path", { d: path, fill: "none", stroke: "#0969da", "stroke-width": 1.5 }));
  return root;
}

function ratesPlot(nodes) {
  const box = $("rates-plot");
  const width = 1300, height = 220, left = 48, right = 24, top = 10, bottom = 22;
  const span = plotSpan();
  const plotX = (t, now) => width - right - ((now - t) / span) * (width - left - right);
  const plotY = (v, max) => top + (height - top - bottom) * (1 - v / max);
  const lines = [];
  nodes.forEach((node, i) => {
    const samples = state.history.get(node);
    lines.push({ label: `${node} commands/s`, color: COLORS[(2 * i) % COLORS.length], points: series(samples, "commands_total"), dash: "" });
    lines.push({ label: `${node} queries/s`, color: COLORS[(2 * i + 1) % COLORS.length], points: series(samples, "queries_total"), dash: "4 3" });
  });
  const max = Math.max(1, ...lines.flatMap((line) => line.points.map((p) => p[1])));
  const now = serverNow();
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "rates over the last minutes" });
  for (let tick = 0; tick <= 4; tick++) {
    const y = plotY((max * tick) / 4, max);
    root.append(svg("line", { x1: left, x2: width - right, y1: y, y2: y, stroke: "#d9dee5" }));
    const label = svg("text", { x: left - 6, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#5f6b7a" });
    label.textContent = formatRate((max * tick) / 4);
    root.append(label);
  }
  for (let part = 0; part <= 4; part++) {
    const ago = (span * part) / 4;
    const label = svg("text", { x: plotX(now - ago, now), y: height - 6, "text-anchor": part === 4 ? "start" : "middle", "font-size": 11, fill: "#5f6b7a" });
    label.textContent = part ? `-${Math.round(ago / 1000)} s` : "now";
    root.append(label);
  }
  for (const line of lines) {
    if (line.points.length < 2) continue;
    const d = line.points.map(([t, v], i) => {
      const x = Math.max(left, plotX(t, now));
      return `${i ? "L" : "M"}${x.toFixed(1)},${plotY(v, max).toFixed(1)}`;
    }).join("");
    root.append(svg("path", { d, fill: "none", stroke: line.color, "stroke-width": 1.6, "stroke-dasharray": line.dash }));
  }
  const legend = el("div", { class: "legend" });
  for (const line of lines) {
    const swatch = el("i");
    swatch.style.background = line.color;
    legend.append(el("span", {}, swatch, line.label));
  }
  box.replaceChildren(root, legend);
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
}

function drawCluster() {
  const cluster = state.cluster;
  if (!cluster) return;
  const now = serverNow();
  const leases = [...cluster.leases].sort((a, b) => a.node_id.localeCompare(b.node_id));
  const stats = new Map(cluster.stats.map((s) => [s.node_id, s]));
  const live = leases.filter((l) => ["live", "late"].includes(leaseState(l))).length;
  let commands = 0, queries = 0;
  for (const lease of leases) {
    commands += rate(state.history.get(lease.node_id), "commands_total") || 0;
    queries += rate(state.history.get(lease.node_id), "queries_total") || 0;
  }
  $("cards").replaceChildren(
    card("nodes live", `${live} / ${leases.length}`, "card-live"),
    card("Cells owned", cluster.stats.reduce((n, s) => n + s.cells_owned, 0), "card-owned"),
    card("commands/s", formatRate(commands), "card-commands"),
    card("queries/s", formatRate(queries), "card-queries"),
  );
  const rows = leases.map((lease) => {
    const leaseNow = leaseState(lease);
    const samples = state.history.get(lease.node_id);
    const s = stats.get(lease.node_id);
    const badges = [el("span", { class: `badge ${leaseNow}` }, leaseNow)];
    if (lease.ingress_only) badges.push(" ", el("span", { class: "badge tag" }, "ingress-only"));
    if (lease.node_id === cluster.node_id) badges.push(" ", el("span", { class: "badge tag" }, "this node"));
    return el("tr", { "data-node": lease.node_id, "data-state": leaseNow },
      el("td", {}, lease.node_id),
      el("td", {}, ...badges, el("span", { class: "countdown" }, leaseNow === "retired" ? "drained" : countdown(lease, leaseNow, now))),
      el("td", { class: "mono", title: lease.session_id }, lease.session_id.slice(0, 8)),
      el("td", { class: "mono" }, lease.endpoint),
      el("td", { class: "num" }, s ? s.cells_owned : "–"),
      el("td", { class: "num" }, s ? s.cells_open : "–"),
      el("td", { class: "num" }, formatRate(rate(samples, "commands_total"))),
      el("td", { class: "num" }, formatRate(rate(samples, "queries_total"))),
      el("td", { class: "num" }, quantile(samples, "publication_seconds", 0.5)),
      el("td", { class: "num" }, quantile(samples, "publication_seconds", 0.99)),
      el("td", {}, !s ? "–" : s.publication_mode === "log" ? `log, ${s.log_lanes} lane${s.log_lanes === 1 ? "" : "s"}` : s.publication_mode),
      el("td", { class: "num" }, formatRate(rate(samples, "log_segments_total"))),
      el("td", { class: "num" }, `${quantile(samples, "log_segment_put_seconds", 0.5)} / ${quantile(samples, "log_segment_put_seconds", 0.99)}`),
      el("td", {}, sparkline(series(samples, "commands_total"))),
    );
  });
  $("nodes").tBodies[0].replaceChildren(...rows);
  const missing = cluster.unreachable.map((u) => `${u.node_id} (${u.reason})`);
  $("unreachable").hidden = !missing.length;
  $("unreachable").textContent = missing.length ? `No stats from: ${missing.join("; ")}` : "";
  ratesPlot(leases.map((l) => l.node_id));
  const owner = $("search-owner");
  const names = leases.map((l) => l.node_id);
  if (owner.dataset.nodes !== names.join(",")) {
    const chosen = owner.value;
    owner.replaceChildren(el("option", { value: "" }, "any"), ...names.map((n) => el("option", { value: n }, n)));
    owner.value = chosen;
    owner.dataset.nodes = names.join(",");
  }
}

async function pollCluster() {
  try {
    const cluster = await api("/ui/api/cluster");
    state.cluster = cluster;
    state.fetchedAt = Date.now();
    remember(cluster.stats);
    $("served-by").textContent = `served by ${cluster.node_id}`;
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
    drawCluster();
  } catch (error) {
    setStatus(`cannot reach this node: ${error.message}`, true);
  }
}

// ---- Cells ----

function ownerBadge(owner) {
  if (!owner) return el("span", { class: "note" }, "none");
  const lease = state.cluster && state.cluster.leases.find((l) => l.node_id === owner);
  const leaseNow = lease ? leaseState(lease) : "expired";
  return el("span", {}, owner, " ", el("span", { class: `badge ${leaseNow}` }, leaseNow));
}

// Whether a Cell is open is known to its owner only: this node's own Cells
// say open or parked, others' point to their owner's console.
function openCell(cell) {
  if (state.cluster && cell.owner === state.cluster.node_id) return el("td", {}, cell.open ? "open" : "parked");
  return el("td", { class: "note", title: "only its owner knows; see the owner's console" }, "–");
}

async function searchCells(more = false) {
  const form = new FormData($("cell-search"));
  const params = new URLSearchParams();
  for (const name of ["kind", "q", "owner"]) {
    const value = String(form.get(name) || "").trim();
    if (value) params.set(name, value);
  }
  if (more && state.cellsNext) params.set("after", state.cellsNext);
  try {
    const answer = await api(`/ui/api/cells?${params}`);
    const rows = answer.cells.map((cell) => el("tr", { class: "clickable", "data-cell": cell.cell_id, "data-owner": cell.owner, onclick: () => { location.hash = `#/cell/${cell.cell_id}`; } },
      el("td", { class: "mono", title: cell.cell_id }, cell.cell_id.slice(0, 12)),
      el("td", {}, cell.kind),
      el("td", { class: "mono", title: `hex ${cell.key_hex}` }, cell.key),
      el("td", {}, ownerBadge(cell.owner)),
      el("td", { class: "num" }, cell.epoch),
      el("td", { class: "num" }, cell.txid),
      openCell(cell),
    ));
    const body = $("cells").tBodies[0];
    if (more) body.append(...rows); else body.replaceChildren(...rows);
    state.cellsNext = answer.next;
    $("cells-more").hidden = !answer.next;
    $("cells-summary").textContent = `${body.rows.length} shown (${answer.scanned} read this time)${answer.next ? "; more after the last one" : ""}`;
  } catch (error) {
    $("cells-summary").textContent = `search failed: ${error.message}`;
  }
}

function fact(list, name, value) {
  list.append(el("dt", {}, name), el("dd", {}, value));
}

async function showCell(id) {
  try {
    const cell = await api(`/ui/api/cell?id=${encodeURIComponent(id)}`);
    const summary = cell.summary;
    $("cell-title").textContent = `${summary.kind} / ${summary.key}`;
    const root = $("cell-root");
    root.replaceChildren();
    root.dataset.owner = summary.owner;
    root.dataset.epoch = summary.epoch;
    fact(root, "Cell id", el("span", { class: "mono" }, summary.cell_id));
    fact(root, "Key (hex)", el("span", { class: "mono" }, summary.key_hex));
    fact(root, "Owner", ownerBadge(summary.owner));
    fact(root, "Epoch", summary.epoch);
    fact(root, "TXID in the root", summary.txid);
    fact(root, "Root revision", cell.revision);
    fact(root, "Checksum", el("span", { class: "mono" }, cell.checksum));
    if (state.cluster && summary.owner === state.cluster.node_id) fact(root, "Open on this node", summary.open ? "yes" : "no (parked)");
    const total = cell.chain.reduce((n, f) => n + f.size_bytes, 0);
    fact(root, "Chain", `${cell.chain.length} file${cell.chain.length === 1 ? "" : "s"}, ${total} bytes`);
    $("cell-chain").tBodies[0].replaceChildren(...cell.chain.map((file) => el("tr", {},
      el("td", { class: "num" }, file.min_txid === file.max_txid ? file.min_txid : `${file.min_txid}–${file.max_txid}`),
      el("td", { class: "num" }, file.size_bytes),
      el("td", { class: "mono" }, file.file_checksum),
      el("td", { class: "mono" }, file.post_apply_checksum),
      el("td", { class: "mono" }, file.object_key),
    )));
    $("cell-log").textContent = cell.log
      ? `records past the chain from slot ${cell.log.from_seq} of lane ${cell.log.lane}, node ${cell.log.node_id}, session ${cell.log.session}`
      : "none: the chain is the Cell's whole state";
  } catch (error) {
    $("cell-title").textContent = `Cell ${id}: ${error.message}`;
  }
}

// ---- pages ----

function route() {
  const hash = location.hash || "#/";
  clearInterval(state.cellTimer);
  for (const page of ["cluster", "cells", "cell"]) $(`page-${page}`).hidden = true;
  $("nav-cluster").classList.toggle("active", hash === "#/");
  $("nav-cells").classList.toggle("active", hash.startsWith("#/cell"));
  if (hash.startsWith("#/cell/")) {
    const id = decodeURIComponent(hash.slice("#/cell/".length));
    $("page-cell").hidden = false;
    showCell(id);
    state.cellTimer = setInterval(() => showCell(id), POLL_MS);
  } else if (hash.startsWith("#/cells")) {
    $("page-cells").hidden = false;
    searchCells();
  } else {
    $("page-cluster").hidden = false;
    drawCluster();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("cell-search").addEventListener("submit", (event) => { event.preventDefault(); searchCells(); });
  $("cells-more").addEventListener("click", () => searchCells(true));
  window.addEventListener("hashchange", route);
  route();
  pollCluster();
  setInterval(pollCluster, POLL_MS);
  setInterval(() => { if (!$("page-cluster").hidden) drawCluster(); }, TICK_MS);
});
