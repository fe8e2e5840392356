/*
 * The dashboard page's JavaScript (inline in the page; its hash is in the CSP).
 *
 *     every 1 s: api/summary -> the header and the overview (cards, counts, nodes)
 *     the view shown (location.hash: #actors, #tasks, #stream, #nodes, #objects, #logs,
 *         #drivers, #metrics) polls its own api/NAME: only that view costs the head
 *     the task stream and the charts ask only for what is new (since=), keep the rest here,
 *         and draw on canvases (thousands of bars a second stay cheap)
 *
 * Every text from the cluster (names, messages, log lines) goes in with textContent or
 * canvas fillText, never as HTML.
 */
"use strict";
const TASK_STATES = ["PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "RUNNING", "FINISHED", "FAILED"];
const ACTOR_STATES = ["DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"];
const VIEWS = ["overview", "actors", "tasks", "stream", "nodes", "objects", "logs", "drivers", "metrics"];
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
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
function fmtTime(ms) { return ms ? new Date(ms).toLocaleTimeString() : ""; }
function fmtDur(ms) {
  if (ms === null || ms === undefined) return "";
  return ms < 1000 ? ms.toFixed(0) + " ms" : ms < 60000 ? (ms / 1000).toFixed(2) + " s"
    : (ms / 60000).toFixed(1) + " min";
}
function shown(res) {
  const names = Object.keys(res || {}).filter((k) => !k.includes("_group_") && !k.startsWith("node:")).sort();
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
function stateTag(s) { return el("span", "state s-" + s, s); }
function logLink(pid) {
  if (!pid) return td("");
  const a = el("a", "loglink", "log");
  a.href = "#logs:" + pid;
  return cellWith(a);
}
async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (!r.ok) throw new Error("the head answered " + r.status);
  const text = await r.text();
  stats.bytes += text.length;
  stats.polls += 1;
  return JSON.parse(text);
}
const stats = { bytes: 0, polls: 0, renderMs: 0 };

// ------------------------------------------------------------------ overview
function renderCounts(tbodyId, states, counts) {
  const rows = [];
  const names = states.concat(Object.keys(counts || {}).filter((k) => !states.includes(k)));
  for (const s of names) {
    const n = (counts || {})[s] || 0;
    const tr = row([cellWith(stateTag(s)), td(n, "num count")]);
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
  $("store-sub").textContent = (st.spilled_bytes ?
    "spilled " + fmtBytes(st.spilled_bytes) + " (" + (st.spilled_objects || 0) + " objects)" :
    "nothing spilled") + (st.pooled ? ", " + fmtBytes(st.pooled) + " kept for reuse" : "");
  setBar("store-bar", st.capacity ? st.used / st.capacity : 0);
  $("workers").textContent = s.workers || 0;
  $("drivers").textContent = (s.drivers || 0) + " driver" + (s.drivers === 1 ? "" : "s") + " connected";
  const r = s.head_restarts || 0, last = s.head_last_restart;
  $("head-restarts").textContent = r ? "head restarted " + r + " time" + (r === 1 ? "" : "s") +
    (last ? " (last: " + last.reason + ")" : "") : "";
  const sec = s.security;
  $("security").textContent = !sec ? "" : sec.tls ? "connections: TLS 1.3 (" + (sec.ca ? "certificates of " + sec.ca : sec.key) + ")" :
    sec.loopback ? "connections: plain TCP, loopback only" :
    "connections: NOT ENCRYPTED between machines (--insecure-no-tls)";
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
      const text = await r.text();
      stats.bytes += text.length;
      stats.polls += 1;
      render(JSON.parse(text));
      $("notice").style.display = "none";
      status(true, "live");
    }
  } catch (e) {
    status(false, "disconnected: the head does not answer");
  }
  setTimeout(poll, document.hidden ? 5000 : 1000);
}

// ------------------------------------------------------------------ actors
let actorRows = [];
function renderActors() {
  const want = $("actor-state").value, text = $("actor-filter").value.toLowerCase();
  const rows = actorRows.filter((a) => (!want || a.state === want) && (!text ||
    [a.actor_id, a.class_name, a.name, a.namespace].some((v) => (v || "").toLowerCase().includes(text))));
  $("actor-count").textContent = rows.length + " of " + actorRows.length;
  $("actor-rows").replaceChildren(...rows.slice(0, 2000).map((a) => {
    const tr = row([td(a.actor_id, "mono"), td(a.class_name), td(a.name || ""), td(a.namespace || "", "muted"),
      cellWith(stateTag(a.state)), td(a.node_id || "", "mono"), td(a.pid || "", "num"),
      td(a.restarts, "num"), td(a.cause || "", "cause"), logLink(a.pid)]);
    tr.dataset.actor = a.actor_id;
    return tr;
  }));
}
async function pollActors() { actorRows = (await getJSON("api/actors")).actors; renderActors(); }

// ------------------------------------------------------------------ tasks
let openTask = null;
async function pollTasks() {
  const q = new URLSearchParams({ state: $("task-state").value, name: $("task-filter").value, limit: 200 });
  const d = await getJSON("api/tasks?" + q.toString());
  $("task-count").textContent = d.matched + " matching of " + d.total + " kept" +
    (d.dropped ? " (" + d.dropped + " older dropped)" : "");
  const now = Date.now();
  $("task-rows").replaceChildren(...d.tasks.map((t) => {
    const dur = t.start_ms ? (t.end_ms || now) - t.start_ms : null;
    const err = t.error_type ? t.error_type + (t.error_message ? ": " + t.error_message : "") : "";
    const tr = row([td(t.name), cellWith(stateTag(t.state)), td(t.node_id || "", "mono"),
      td(t.pid || "", "num"), td(fmtTime(t.start_ms)), td(fmtDur(dur), "num"), td(err, "error")]);
    tr.dataset.task = t.task_id;
    if (t.state === "FAILED") {
      tr.className = "failed clickable";
      tr.title = "show the traceback";
      tr.addEventListener("click", () => showTask(t.task_id));
    }
    return tr;
  }));
  $("fn-rows").replaceChildren(...d.by_function.slice(0, 50).map((f) => row([td(f.name), td(f.type, "muted"),
    td(f.counts.RUNNING || 0, "num"), td(f.counts.FINISHED || 0, "num"), td(f.counts.FAILED || 0, "num"),
    td(Object.values(f.counts).reduce((a, b) => a + b, 0), "num")])));
}
async function showTask(id) {
  openTask = id;
  const d = await getJSON("api/task?id=" + encodeURIComponent(id));
  const box = $("traceback-box");
  box.hidden = false;
  if (d.error) { $("traceback-title").textContent = d.error; $("traceback").textContent = ""; return; }
  const t = d.task;
  $("traceback-title").textContent = t.name + " (" + t.task_id + ") " + (t.error_type || "");
  $("traceback").textContent = t.traceback || t.error_message || "no traceback was kept for this task";
}

// ------------------------------------------------------------------ task stream
const stream = { seq: 0, tasks: new Map(), last: new Map(), workers: [], workerIndex: new Map(), names: [],
  nameIndex: new Map(), colors: [], offset: 0, drawn: 0 };
const WINDOW_MS = 60000;
// Functions' colours step round the hue circle by the golden angle, leaving out the
// reds (hues 330-30) that mark a failed task.
function colorOf(i) { return "hsl(" + (30 + (i * 137.508) % 300).toFixed(0) + ",62%,52%)"; }
async function pollStream() {
  const d = await getJSON("api/stream?since=" + stream.seq);
  if (d.reset) { stream.tasks.clear(); stream.last.clear(); }
  stream.seq = d.seq;
  stream.offset = Date.now() - d.time;
  const fn = d.names.map((n) => {
    if (!stream.nameIndex.has(n)) { stream.nameIndex.set(n, stream.names.length); stream.names.push(n); }
    return stream.nameIndex.get(n);
  });
  const wk = d.workers.map((w) => {
    if (!stream.workerIndex.has(w)) { stream.workerIndex.set(w, stream.workers.length); stream.workers.push(w); }
    return stream.workerIndex.get(w);
  });
  for (const [f, w, start, end, failed, count] of d.tasks) {
    const t = { fn: fn[f], worker: wk[w], start: d.time + start, end: end === null ? null : d.time + end,
      failed: failed, count: count };
    const key = t.worker + ":" + t.start;
    const last = stream.last.get(t.worker);
    stream.tasks.delete(key);   // its running bar, now ended
    if (last && t.end !== null && !t.failed && !last.failed && last.fn === t.fn && last.end !== null &&
        t.start - last.end <= 5 && t.end - t.start < 50 && stream.tasks.get(last.key) === last) {
      last.end = Math.max(last.end, t.end);   // back to back on one worker: one bar
      last.count += t.count;
      continue;
    }
    t.key = key;
    stream.tasks.set(key, t);
    if (t.end !== null) stream.last.set(t.worker, t);
  }
  const cutoff = d.time - WINDOW_MS * 1.5;
  for (const [id, t] of stream.tasks) if (t.end !== null && t.end < cutoff) stream.tasks.delete(id);
  drawStream();
}
function drawStream() {
  const t0 = performance.now();
  const canvas = $("stream-canvas");
  const rowH = 16, top = 4, left = 150;
  const rows = Math.max(stream.workers.length, 1);
  const width = canvas.parentElement.clientWidth || 900;
  const height = top + rows * rowH + 18;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const now = Date.now() - stream.offset, from = now - WINDOW_MS;
  const scale = (width - left - 8) / WINDOW_MS;
  ctx.font = "11px ui-monospace,Menlo,Consolas,monospace";
  ctx.fillStyle = getComputedStyle(document.body).color;
  ctx.textBaseline = "middle";
  stream.workers.forEach((w, i) => ctx.fillText(w.length > 22 ? "\u2026" + w.slice(-21) : w, 4, top + i * rowH + rowH / 2));
  let n = 0;
  const hits = [];
  for (const t of stream.tasks.values()) {
    const end = t.end === null ? now : t.end;
    if (end < from) continue;
    const x = left + Math.max(t.start - from, 0) * scale;
    const w = Math.max((end - Math.max(t.start, from)) * scale, 1);
    const y = top + t.worker * rowH + 2;
    ctx.fillStyle = t.failed ? "#d64545" : colorOf(t.fn);
    ctx.fillRect(x, y, w, rowH - 4);
    hits.push([x, y, w, t]);
    n++;
  }
  ctx.fillStyle = getComputedStyle(document.body).color;
  for (let s = 0; s <= 60; s += 10) {
    const x = left + (WINDOW_MS - s * 1000) * scale;
    ctx.fillText(s === 0 ? "now" : "-" + s + " s", Math.min(x - 8, width - 30), height - 8);
  }
  stream.hits = hits;
  stream.drawn = n;
  let tasks = 0;
  for (const [, , , t] of hits) tasks += t.count;
  $("stream-count").textContent = tasks + " tasks (" + n + " bars) in the last minute on " +
    stream.workers.length + " workers";
  $("stream-legend").replaceChildren(...stream.names.slice(0, 40).map((name, i) => {
    const s = el("span", "legend", name);
    s.style.borderColor = colorOf(i);
    return s;
  }));
  stats.renderMs = performance.now() - t0;
}
function streamHover(ev) {
  const r = ev.target.getBoundingClientRect();
  const x = ev.clientX - r.left, y = ev.clientY - r.top;
  const tip = $("stream-tip");
  const hit = (stream.hits || []).find(([hx, hy, hw]) => x >= hx - 1 && x <= hx + hw + 1 && y >= hy && y <= hy + 12);
  if (!hit) { tip.hidden = true; return; }
  const t = hit[3];
  tip.hidden = false;
  tip.textContent = stream.names[t.fn] + (t.count > 1 ? " \u00d7 " + t.count + " tasks" : "") +
    " \u00b7 " + stream.workers[t.worker] + " \u00b7 " +
    (t.end === null ? "running " + fmtDur(Date.now() - stream.offset - t.start) : fmtDur(t.end - t.start)) +
    (t.failed ? " \u00b7 FAILED" : "");
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 320) + "px";
  tip.style.top = ev.clientY + 12 + "px";
}

// ------------------------------------------------------------------ charts (nodes, metrics)
const history = { since: 0, series: new Map(), nodes: [] };
const HISTORY_MS = 300000;
async function pollHistory() {
  const d = await getJSON("api/history?since=" + history.since);
  history.nodes = d.nodes;
  for (const [name, pts] of Object.entries(d.series)) {
    const have = history.series.get(name) || [];
    history.series.set(name, have.concat(pts));
  }
  const cutoff = d.time - HISTORY_MS / 1000;
  for (const [name, pts] of history.series) {
    while (pts.length && pts[0][0] < cutoff) pts.shift();
    if (!pts.length) history.series.delete(name);
  }
  for (const pts of history.series.values()) if (pts.length) history.since = Math.max(history.since, pts[pts.length - 1][0]);
  history.now = d.time;
}
function drawChart(canvas, pts, fmt, fixedMax) {
  const width = canvas.clientWidth || 260, height = canvas.clientHeight || 70;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr)) { canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const now = history.now || Date.now() / 1000, from = now - HISTORY_MS / 1000;
  let max = fixedMax || 0;
  for (const p of pts) max = Math.max(max, p[1]);
  max = max || 1;
  const X = (t) => (t - from) / (now - from) * width, Y = (v) => height - 14 - v / max * (height - 20);
  const color = getComputedStyle(document.body).getPropertyValue("--accent") || "#2f6fed";
  ctx.strokeStyle = color; ctx.fillStyle = color; ctx.lineWidth = 1.5;
  if (pts.length) {
    ctx.beginPath();
    pts.forEach((p, i) => (i ? ctx.lineTo(X(p[0]), Y(p[1])) : ctx.moveTo(X(p[0]), Y(p[1]))));
    ctx.stroke();
    ctx.globalAlpha = 0.15;
    ctx.lineTo(X(pts[pts.length - 1][0]), Y(0)); ctx.lineTo(X(pts[0][0]), Y(0)); ctx.closePath(); ctx.fill();
    ctx.globalAlpha = 1;
  }
  ctx.fillStyle = getComputedStyle(document.body).color;
  ctx.font = "11px system-ui,sans-serif";
  ctx.textBaseline = "top";
  ctx.fillText("max " + fmt(max), 2, 1);
  const last = pts.length ? pts[pts.length - 1][1] : null;
  ctx.textAlign = "right";
  ctx.fillText(last === null ? "no data" : "now " + fmt(last), width - 2, 1);
  ctx.textAlign = "left";
  ctx.textBaseline = "bottom";
  ctx.fillText("-5 min", 2, height);
}
function chartBox(title, id, cls) {
  const box = el("div", "chart");
  box.appendChild(el("div", cls || "label", title));
  const c = el("canvas");
  c.id = id;
  box.appendChild(c);
  return box;
}
const NODE_CHARTS = [["cpu", "CPU use (cores)", fmtAmount], ["mem", "workers' memory", fmtBytes],
  ["store", "object store", fmtBytes], ["spilled", "spilled", fmtBytes]];
function renderNodeCharts() {
  const root = $("node-charts");
  for (const n of history.nodes) {
    let card = root.querySelector('[data-node="' + n.node_id + '"]');
    if (!card) {
      card = el("div", "panel nodecard");
      card.dataset.node = n.node_id;
      const h = el("h2");
      h.appendChild(el("span", "mono", n.node_id + " "));
      h.appendChild(el("span", "", n.address));
      h.appendChild(el("span", "state", ""));
      card.appendChild(h);
      const grid = el("div", "charts");
      for (const [key, title] of NODE_CHARTS) grid.appendChild(chartBox(title, "chart-" + n.node_id + "-" + key));
      card.appendChild(grid);
      root.appendChild(card);
    }
    const tag = card.querySelector("h2 .state");
    tag.className = "state " + (n.alive ? "s-ALIVE" : "s-DEAD dead-node");
    tag.textContent = n.alive ? "ALIVE" : "DEAD";
    card.classList.toggle("dead", !n.alive);
    for (const [key, , fmt] of NODE_CHARTS) {
      const max = key === "cpu" ? n.cpus : key === "store" ? n.store_capacity : 0;
      drawChart($("chart-" + n.node_id + "-" + key), history.series.get("node:" + n.node_id + ":" + key) || [], fmt, max);
    }
  }
}
async function pollNodes() { await pollHistory(); renderNodeCharts(); }

async function pollMetrics() {
  const d = await getJSON("api/metrics");
  await pollHistory();
  $("metric-rows").replaceChildren(...d.metrics.map((m) => row([td(m.name, "mono"), td(m.kind),
    td(Object.entries(m.tags).map(([k, v]) => k + "=" + v).join(", ")),
    td(m.kind === "histogram" ? fmtAmount(m.count) + " obs, mean " + fmtAmount(m.mean || 0) : fmtAmount(m.value), "num"),
    td(m.description, "muted")])));
  $("metrics-empty").hidden = d.metrics.length > 0;
  const root = $("metric-charts");
  const names = [...history.series.keys()].filter((k) => k.startsWith("metric:")).sort();
  for (const name of names) {   // every box first: the grid's widths are final when drawn
    const id = "chart-" + name;
    if (!document.getElementById(id)) {
      const box = chartBox(name.slice(7), id, "ctitle mono");
      box.dataset.metric = name.slice(7);
      root.appendChild(box);
    }
  }
  for (const name of names) drawChart(document.getElementById("chart-" + name), history.series.get(name), fmtAmount, 0);
}

// ------------------------------------------------------------------ objects, drivers, logs
async function pollObjects() {
  const d = await getJSON("api/objects");
  $("object-count").textContent = d.total + " objects, " + fmtBytes(d.bytes);
  $("object-rows").replaceChildren(...d.objects.map((o) => row([td(o.object_id, "mono"),
    td(fmtBytes(o.size), "num"), td(o.location), td(o.node_id || "", "mono"),
    td((o.copies || []).join(", "), "mono"),
    td(o.holders.map((h) => h.type + " pid " + h.pid + (h.count > 1 ? " \u00d7" + h.count : "")).join(", "))])));
}
function jobStatus(r) {
  const c = cellWith(stateTag(r.status));
  if (r.message) c.appendChild(el("span", "muted", " " + r.message));
  return c;
}
async function pollDrivers() {
  const d = await getJSON("api/drivers");
  $("driver-rows").replaceChildren(...d.drivers.map((r) => row([td(r.job_id, "mono"),
    jobStatus(r),
    td(r.pid, "num"), td(r.node_id, "mono"), td(r.namespace || "", "muted"),
    td(r.entrypoint || "", "mono"), td(fmtTime(r.connected_at_ms)),
    td(r.end_time_ms ? fmtTime(r.end_time_ms) : ""),
    td((r.tasks.RUNNING || 0), "num"), td((r.tasks.FINISHED || 0), "num"), td((r.tasks.FAILED || 0), "num")])));
}
const log = { pid: null, out: -1, err: -1 };
function openLog(pid) {
  if (String(pid) !== String(log.pid)) {
    log.pid = pid; log.out = -1; log.err = -1;
    $("log-out").textContent = ""; $("log-err").textContent = ""; $("log-note").textContent = "";
  }
  $("log-pid").value = pid;
}
async function pollLogs() {
  if (!log.pid) return;
  if (log.out >= 0 && !$("log-follow").checked) return;
  const d = await getJSON("api/logs?" + new URLSearchParams({ pid: log.pid, offset_out: log.out, offset_err: log.err }));
  if (d.error) { $("log-note").textContent = d.error; return; }
  for (const s of ["out", "err"]) {
    const part = d[s];
    if (!part) continue;
    if (part.text) $("log-" + s).textContent += part.text;
    log[s] = part.offset;
  }
  $("log-note").textContent = "worker pid " + log.pid + ($("log-follow").checked ? " (following)" : "");
}

// ------------------------------------------------------------------ views
const POLLERS = { actors: [pollActors, 2000], tasks: [pollTasks, 2000], stream: [pollStream, 1000],
  nodes: [pollNodes, 2000], objects: [pollObjects, 3000], logs: [pollLogs, 1000],
  drivers: [pollDrivers, 3000], metrics: [pollMetrics, 2000] };
let current = "overview", timer = null;
function show() {
  const hash = location.hash.slice(1);
  const [name, arg] = hash.split(":");
  current = VIEWS.includes(name) ? name : "overview";
  for (const v of VIEWS) $("view-" + v).hidden = v !== current;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.view === current);
  if (current === "logs" && arg) openLog(arg);
  clearTimeout(timer);
  tick();
}
async function tick() {
  const p = POLLERS[current];
  if (!p) return;
  const view = current;
  try {
    await p[0]();
    document.body.dataset.view = view;
  } catch (e) {
    status(false, String(e.message || e));
  }
  if (view === current) timer = setTimeout(tick, document.hidden ? 5000 : p[1]);
}
window.addEventListener("hashchange", show);
$("actor-state").addEventListener("change", renderActors);
$("actor-filter").addEventListener("input", renderActors);
$("task-state").addEventListener("change", () => { clearTimeout(timer); tick(); });
$("task-filter").addEventListener("change", () => { clearTimeout(timer); tick(); });
$("traceback-close").addEventListener("click", () => { $("traceback-box").hidden = true; openTask = null; });
$("stream-canvas").addEventListener("mousemove", streamHover);
$("stream-canvas").addEventListener("mouseleave", () => { $("stream-tip").hidden = true; });
$("log-open").addEventListener("click", () => { location.hash = "logs:" + $("log-pid").value.trim(); });
$("log-follow").addEventListener("change", () => { clearTimeout(timer); tick(); });
window.orchestraStats = stats;
poll();
show();
