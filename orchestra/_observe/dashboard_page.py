"""The dashboard's one page: HTML with its CSS and JavaScript inline (no CDN: clusters
run offline), and the Content-Security-Policy that lets only that script and that style
run (by their hashes), fetching from its own origin only.

    views, one shown at a time (location.hash): overview (the summary: cards, tasks and
    actors by state, resources, nodes), actors, tasks, task stream, nodes over time,
    objects, logs, drivers, user metrics; the script (_observe/dashboard_script.py)
    polls api/summary every 1 s and the shown view's api/NAME. Text goes in with
    textContent, never as HTML; charts and the task stream are drawn on canvases.
"""
from __future__ import annotations

import base64
import hashlib

from .dashboard_script import SCRIPT

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
td.mono, .mono { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12px; }
td.barcell { width:32%; }
td.barcell .bar { margin-top:0; }
.state { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
  font-weight:500; color:#fff; background:var(--idle); }
.s-RUNNING, .s-PENDING_CREATION { background:var(--accent); }
.s-FINISHED, .s-ALIVE, .s-SUCCEEDED { background:var(--ok); }
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
nav { display:flex; gap:2px; flex-wrap:wrap; }
nav a { color:var(--muted); text-decoration:none; padding:4px 10px; border-radius:6px; font-size:13px; }
nav a:hover { background:var(--bar); }
nav a.on { color:var(--fg); background:var(--bar); font-weight:600; }
.toolbar { display:flex; gap:8px; align-items:center; margin:2px 0 10px; flex-wrap:wrap; }
.toolbar input, .toolbar select, .toolbar button { font:inherit; padding:3px 8px; border-radius:6px;
  border:1px solid var(--line); background:var(--card); color:var(--fg); }
.muted { color:var(--muted); }
td.error, td.cause { color:var(--bad); max-width:520px; overflow:hidden; text-overflow:ellipsis;
  white-space:nowrap; }
tr.clickable { cursor:pointer; }
tr.clickable:hover td { background:var(--bar); }
pre { white-space:pre-wrap; word-break:break-word; font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;
  background:var(--bg); border:1px solid var(--line); border-radius:6px; padding:8px; margin:6px 0;
  max-height:520px; overflow:auto; }
#stream-wrap { position:relative; width:100%; }
#stream-canvas { display:block; width:100%; }
#stream-tip { position:fixed; z-index:5; background:var(--card); border:1px solid var(--line);
  border-radius:6px; padding:4px 8px; font-size:12px; pointer-events:none; max-width:320px; }
.legend { display:inline-block; border-left:10px solid; padding:0 8px 0 4px; margin:2px 6px 2px 0;
  font-size:12px; }
.charts { display:grid; grid-template-columns:repeat(auto-fit,minmax(220px,1fr)); gap:10px; }
.chart canvas { width:100%; height:70px; display:block; }
.ctitle { font-size:12px; color:var(--muted); }
.nodecard.dead { opacity:.6; }
.nodecard h2 .state { margin-left:8px; }
a.loglink { color:var(--accent); }
"""

_SCRIPT = SCRIPT

_BODY = """
<header><h1>orchestra</h1><span id="session"></span>
<nav><a href="#overview" data-view="overview">Overview</a><a href="#actors" data-view="actors">Actors</a>
<a href="#tasks" data-view="tasks">Tasks</a><a href="#stream" data-view="stream">Task stream</a>
<a href="#nodes" data-view="nodes">Nodes</a><a href="#objects" data-view="objects">Objects</a>
<a href="#logs" data-view="logs">Logs</a><a href="#drivers" data-view="drivers">Drivers</a>
<a href="#metrics" data-view="metrics">Metrics</a></nav>
<span id="live">connecting</span></header>
<main>
<div id="notice"></div>
<div id="view-overview">
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
    <div class="sub" id="drivers"></div><div class="sub" id="head-restarts"></div>
    <div class="sub" id="security"></div></div>
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
</div>
<div id="view-actors" hidden><section class="panel"><h2>Actors</h2>
  <div class="toolbar"><select id="actor-state"><option value="">every state</option>
  <option>ALIVE</option><option>PENDING_CREATION</option><option>DEPENDENCIES_UNREADY</option>
  <option>RESTARTING</option><option>DEAD</option></select>
  <input id="actor-filter" placeholder="filter: id, class, name, namespace">
  <span class="muted" id="actor-count"></span></div>
  <table><thead><tr><th>actor id</th><th>class</th><th>name</th><th>namespace</th><th>state</th>
  <th>node</th><th class="num">pid</th><th class="num">restarts</th><th>death cause</th><th></th></tr>
  </thead><tbody id="actor-rows"></tbody></table></section></div>
<div id="view-tasks" hidden><section class="panel"><h2>Tasks</h2>
  <div class="toolbar"><select id="task-state"><option value="">every state</option>
  <option>FAILED</option><option>RUNNING</option><option>FINISHED</option>
  <option>PENDING_NODE_ASSIGNMENT</option><option>PENDING_ARGS_AVAIL</option></select>
  <input id="task-filter" placeholder="filter by name (Enter)"><span class="muted" id="task-count"></span></div>
  <div id="traceback-box" hidden><div class="toolbar"><strong id="traceback-title"></strong>
  <button id="traceback-close">close</button></div><pre id="traceback"></pre></div>
  <table><thead><tr><th>name</th><th>state</th><th>node</th><th class="num">worker pid</th>
  <th>start</th><th class="num">duration</th><th>error</th></tr></thead><tbody id="task-rows"></tbody>
  </table></section>
  <section class="panel"><h2>By function</h2><table><thead><tr><th>function</th><th>type</th>
  <th class="num">running</th><th class="num">finished</th><th class="num">failed</th>
  <th class="num">all</th></tr></thead><tbody id="fn-rows"></tbody></table></section></div>
<div id="view-stream" hidden><section class="panel"><h2>Task stream (last minute)</h2>
  <div class="toolbar"><span class="muted" id="stream-count"></span></div>
  <div id="stream-wrap"><canvas id="stream-canvas"></canvas></div>
  <div id="stream-tip" hidden></div><div id="stream-legend"></div></section></div>
<div id="view-nodes" hidden><div id="node-charts"></div></div>
<div id="view-objects" hidden><section class="panel"><h2>Largest objects</h2>
  <div class="toolbar"><span class="muted" id="object-count"></span></div>
  <table><thead><tr><th>object id</th><th class="num">size</th><th>where</th><th>node</th>
  <th>copies on</th><th>held by</th></tr></thead><tbody id="object-rows"></tbody></table></section></div>
<div id="view-logs" hidden><section class="panel"><h2>Logs</h2>
  <div class="toolbar"><input id="log-pid" placeholder="worker pid" size="10"><button id="log-open">open</button>
  <label><input type="checkbox" id="log-follow" checked> follow</label><span class="muted" id="log-note">
  </span></div><div class="label">stdout</div><pre id="log-out"></pre><div class="label">stderr</div>
  <pre id="log-err"></pre></section></div>
<div id="view-drivers" hidden><section class="panel"><h2>Jobs</h2>
  <table><thead><tr><th>job id</th><th>status</th><th class="num">driver pid</th><th>node</th>
  <th>namespace</th><th>entrypoint</th><th>started</th><th>ended</th><th class="num">running</th>
  <th class="num">finished</th><th class="num">failed</th>
  </tr></thead><tbody id="driver-rows"></tbody></table></section></div>
<div id="view-metrics" hidden><section class="panel"><h2>User metrics</h2>
  <p class="muted" id="metrics-empty">No metric recorded yet (orchestra.util.metrics: Counter, Gauge,
  Histogram).</p><table><thead><tr><th>name</th><th>kind</th><th>tags</th><th class="num">value</th>
  <th>description</th></tr></thead><tbody id="metric-rows"></tbody></table></section>
  <section class="panel"><h2>Over time</h2><div class="charts" id="metric-charts"></div></section></div>
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
