"""The dashboard's one page: HTML with its CSS and JavaScript inline (no CDN: clusters
run offline), and the Content-Security-Policy that lets only that script and that style
run (by their hashes), fetching from its own origin only.

    the page --GET api/summary every 1 s (every 5 s while hidden)--> render(summary):
    cards (nodes, CPU, GPU, object store, workers), tasks and actors by state,
    resources, one row per node. Text goes in with textContent, never as HTML.
"""
from __future__ import annotations

import base64
import hashlib

_STYLE = """
:root { --bg:#f6f7f9; --fg:#1d2430; --muted:#667085; --card:#fff; --line:#e3e6eb;
  --bar:#e9ecf1; --accent:#2f6fed; --ok:#1f9d55; --warn:#d98a00; --bad:#d64545; --idle:#98a2b3; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#12161d; --fg:#e6e9ee; --muted:#98a2b3; --card:#1b212b; --line:#2a3240;
    --bar:#2a3240; --accent:#6b9bff; }
}
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; }
header { display:flex; align-items:baseline; gap:16px; padding:14px 24px;
  border-bottom:1px solid var(--line); background:var(--card); }
header h1 { margin:0; font-size:18px; letter-spacing:.2px; }
#session { color:var(--muted); font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12px; }
#live { margin-left:auto; font-size:12px; color:var(--muted); }
#live::before { content:""; display:inline-block; width:8px; height:8px; border-radius:50%;
  margin-right:6px; background:var(--idle); }
#live.ok::before { background:var(--ok); }
#live.down::before { background:var(--bad); }
main { padding:18px 24px 8px; max-width:1280px; margin:0 auto; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(180px,1fr)); gap:12px; }
.card, .panel { background:var(--card); border:1px solid var(--line); border-radius:8px; }
.card { padding:12px 14px; }
.label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.5px; }
.value { font-size:24px; font-weight:600; margin-top:2px; font-variant-numeric:tabular-nums; }
.sub { color:var(--muted); font-size:12px; margin-top:2px; min-height:17px; }
.bar { height:6px; background:var(--bar); border-radius:3px; overflow:hidden; margin-top:8px; }
.bar > div { height:100%; width:0; background:var(--accent); transition:width .4s; }
.bar.hot > div { background:var(--warn); }
.grid2 { display:grid; grid-template-columns:1fr 1fr; gap:12px; margin-top:12px; }
@media (max-width:760px) { .grid2 { grid-template-columns:1fr; } }
.panel { padding:10px 14px 12px; margin-top:12px; }
.grid2 .panel { margin-top:0; }
h2 { font-size:13px; margin:2px 0 8px; color:var(--muted); text-transform:uppercase;
  letter-spacing:.5px; font-weight:600; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th { text-align:left; color:var(--muted); font-weight:500; font-size:12px;
  border-bottom:1px solid var(--line); padding:4px 6px; }
td { padding:5px 6px; border-bottom:1px solid var(--line); vertical-align:middle; }
tr:last-child td { border-bottom:0; }
td.num, th.num { text-align:right; }
td.mono { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12px; }
td.barcell { width:32%; }
td.barcell .bar { margin-top:0; }
.state { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
  font-weight:500; color:#fff; background:var(--idle); }
.s-RUNNING, .s-PENDING_CREATION { background:var(--accent); }
.s-FINISHED, .s-ALIVE { background:var(--ok); }
.s-FAILED, .s-DEAD.dead-node { background:var(--bad); }
.s-RESTARTING, .s-PENDING_NODE_ASSIGNMENT { background:var(--warn); }
tr.zero td { color:var(--muted); }
tr.zero .state { opacity:.45; }
.empty { color:var(--muted); padding:6px; }
footer { color:var(--muted); font-size:12px; padding:4px 24px 18px; max-width:1280px;
  margin:0 auto; }
footer a { color:var(--muted); }
#notice { display:none; margin:12px 0 0; padding:10px 14px; border-radius:8px;
  border:1px solid var(--bad); color:var(--bad); background:var(--card); }
"""

_SCRIPT = """
"use strict";
const TASK_STATES = ["PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "RUNNING", "FINISHED", "FAILED"];
const ACTOR_STATES = ["DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"];
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  n = Number(n) || 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? n.toFixed(0) + " B" : n.toFixed(1) + " " + units[i];
}
function fmtAmount(x) {
  x = Number(x) || 0;
  return Number.isInteger(x) ? String(x) : x.toFixed(2).replace(/0+$/, "");
}
function fmtRes(name, x) { return name === "memory" ? fmtBytes(x) : fmtAmount(x); }
function shown(res) {
  const names = Object.keys(res || {}).filter((k) => !k.includes("_group_")).sort();
  return names.filter((k) => k !== "memory").concat(names.includes("memory") ? ["memory"] : []);
}
function bar(frac) {
  const b = el("div", "bar" + (frac > 0.9 ? " hot" : ""));
  const f = el("div");
  f.style.width = (Math.max(0, Math.min(1, frac || 0)) * 100).toFixed(1) + "%";
  b.appendChild(f);
  return b;
}
function setBar(id, frac) {
  const b = $(id);
  b.classList.toggle("hot", frac > 0.9);
  b.firstElementChild.style.width = (Math.max(0, Math.min(1, frac || 0)) * 100).toFixed(1) + "%";
}
function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(c);
  return tr;
}
function td(text, cls) { return el("td", cls, text); }
function cellWith(node, cls) { const c = el("td", cls); c.appendChild(node); return c; }

function renderCounts(tbodyId, states, counts) {
  const rows = [];
  const names = states.concat(Object.keys(counts || {}).filter((k) => !states.includes(k)));
  for (const s of names) {
    const n = (counts || {})[s] || 0;
    const tr = row([cellWith(el("span", "state s-" + s, s)), td(n, "num count")]);
    tr.dataset.state = s;
    if (!n) tr.className = "zero";
    rows.push(tr);
  }
  $(tbodyId).replaceChildren(...rows);
}

function renderCards(s) {
  const nodes = s.nodes || [];
  const alive = nodes.filter((n) => n.alive).length;
  $("nodes-alive").textContent = alive;
  $("nodes-sub").textContent = nodes.length > alive ? (nodes.length - alive) + " dead" : "all alive";
  for (const [key, label] of [["CPU", "cpu"], ["GPU", "gpu"]]) {
    const total = (s.resources_total || {})[key] || 0;
    const used = total - ((s.resources_available || {})[key] || 0);
    $(label + "-card").hidden = key === "GPU" && !total;
    $(label + "-used").textContent = fmtAmount(used);
    $(label + "-sub").textContent = "of " + fmtAmount(total);
    setBar(label + "-bar", total ? used / total : 0);
  }
  const st = s.store || {};
  $("store-used").textContent = fmtBytes(st.used);
  $("store-cap").textContent = "of " + fmtBytes(st.capacity) +
    (st.capacity ? " (" + Math.round(100 * st.used / st.capacity) + "%)" : "");
  $("store-sub").textContent = st.spilled_bytes ?
    "spilled " + fmtBytes(st.spilled_bytes) + " (" + (st.spilled_objects || 0) + " objects)" :
    "nothing spilled";
  setBar("store-bar", st.capacity ? st.used / st.capacity : 0);
  $("workers").textContent = s.workers || 0;
  $("drivers").textContent = (s.drivers || 0) + " driver" + (s.drivers === 1 ? "" : "s") + " connected";
}

function renderResources(s) {
  const total = s.resources_total || {}, free = s.resources_available || {};
  const rows = shown(total).map((k) => {
    const used = total[k] - (free[k] || 0);
    const tr = row([td(k), td(fmtRes(k, used), "num"), td(fmtRes(k, total[k]), "num"),
                    cellWith(bar(total[k] ? used / total[k] : 0), "barcell")]);
    tr.dataset.resource = k;
    return tr;
  });
  $("resources").replaceChildren(...rows);
}

function renderNodes(s) {
  const rows = (s.nodes || []).map((n) => {
    const tot = n.resources_total || {}, free = n.resources_available || {};
    const res = shown(tot).filter((k) => k !== "memory").map(
      (k) => k + " " + (n.alive ? fmtAmount(tot[k] - (free[k] || 0)) + "/" : "") + fmtAmount(tot[k]));
    const state = el("span", "state " + (n.alive ? "s-ALIVE" : "s-DEAD dead-node"),
                     n.alive ? "ALIVE" : "DEAD");
    const store = n.alive ? fmtBytes(n.store_used) + " / " + fmtBytes(n.store_capacity) : "";
    const tr = row([td(n.node_id, "mono"), td(n.address), cellWith(state), td(res.join(", ")),
                    td(store, "num"), td(n.spilled_bytes ? fmtBytes(n.spilled_bytes) : "", "num")]);
    tr.dataset.node = n.node_id;
    return tr;
  });
  $("nodes").replaceChildren(...rows);
}

function render(s) {
  $("session").textContent = s.session ? "session " + s.session : "";
  renderCards(s);
  renderCounts("tasks", TASK_STATES, s.tasks);
  renderCounts("actors", ACTOR_STATES, s.actors);
  renderResources(s);
  renderNodes(s);
  $("updated").textContent = new Date((s.time || Date.now() / 1000) * 1000).toLocaleTimeString();
  document.body.dataset.loaded = "1";
}

function status(ok, text) {
  const live = $("live");
  live.className = ok ? "ok" : "down";
  live.textContent = text;
}

async function poll() {
  try {
    const r = await fetch("api/summary", { cache: "no-store", credentials: "same-origin" });
    if (r.status === 401 || r.status === 403) {
      $("notice").style.display = "block";
      $("notice").textContent = "This dashboard needs the cluster token: open it as " +
        location.origin + "/?token=TOKEN (the token `orchestra start --head` printed).";
      status(false, "no access");
    } else if (!r.ok) {
      status(false, "the head answered " + r.status);
    } else {
      render(await r.json());
      $("notice").style.display = "none";
      status(true, "live");
    }
  } catch (e) {
    status(false, "disconnected: the head does not answer");
  }
  setTimeout(poll, document.hidden ? 5000 : 1000);
}
poll();
"""

_BODY = """
<header><h1>orchestra</h1><span id="session"></span><span id="live">connecting</span></header>
<main>
<div id="notice"></div>
<section class="cards">
  <div class="card"><div class="label">Nodes alive</div><div class="value" id="nodes-alive">-</div>
    <div class="sub" id="nodes-sub"></div></div>
  <div class="card" id="cpu-card"><div class="label">CPU in use</div>
    <div class="value" id="cpu-used">-</div><div class="sub" id="cpu-sub"></div>
    <div class="bar" id="cpu-bar"><div></div></div></div>
  <div class="card" id="gpu-card" hidden><div class="label">GPU in use</div>
    <div class="value" id="gpu-used">-</div><div class="sub" id="gpu-sub"></div>
    <div class="bar" id="gpu-bar"><div></div></div></div>
  <div class="card"><div class="label">Object store</div><div class="value" id="store-used">-</div>
    <div class="sub" id="store-cap"></div><div class="bar" id="store-bar"><div></div></div>
    <div class="sub" id="store-sub"></div></div>
  <div class="card"><div class="label">Workers</div><div class="value" id="workers">-</div>
    <div class="sub" id="drivers"></div></div>
</section>
<section class="grid2">
  <div class="panel"><h2>Tasks</h2><table><thead><tr><th>state</th><th class="num">count</th></tr>
    </thead><tbody id="tasks"></tbody></table></div>
  <div class="panel"><h2>Actors</h2><table><thead><tr><th>state</th><th class="num">count</th></tr>
    </thead><tbody id="actors"></tbody></table></div>
</section>
<section class="panel"><h2>Resources</h2><table><thead><tr><th>resource</th>
  <th class="num">in use</th><th class="num">total</th><th></th></tr></thead>
  <tbody id="resources"></tbody></table></section>
<section class="panel"><h2>Nodes</h2><table><thead><tr><th>node</th><th>address</th>
  <th>state</th><th>resources (in use/total)</th><th class="num">object store</th>
  <th class="num">spilled</th></tr></thead><tbody id="nodes"></tbody></table></section>
</main>
<footer>Updated <span id="updated">never</span> &middot; <a href="api/summary">api/summary</a>
  &middot; <a href="metrics">metrics</a></footer>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<title>orchestra dashboard</title>\n<link rel=\"icon\" href=\"data:,\">\n"
        f"<style>{_STYLE}</style></head>\n<body>{_BODY}<script>{_SCRIPT}</script>\n"
        "</body></html>\n").encode()

# Only this page's own script and style run; it fetches from its own origin only; no
# frame may embed it, and no form or base URL goes elsewhere.
CSP = (f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_STYLE)}; "
       "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
