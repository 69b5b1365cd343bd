// The eventing console: polls the REST API and redraws in place (no reload, no build step, no library).
// Every value from the server is put in the page as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const DETAIL_POLL_MS = 2000;
const DLQ_PAGE = 50; // dead letters per page, fetched with ?limit=&offset=
const HISTORY = 90; // points per function chart (1 s apart)
const STATE_ACTIONS = {
  undeployed: ["deploy", "delete"],
  deployed: ["pause", "undeploy"],
  paused: ["resume", "undeploy"],
  deploying: [], pausing: [], undeploying: [],
};
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#bab0ac", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"];

const state = {
  token: sessionStorage.getItem("eventing-token") || "",
  functions: {},      // name -> last status app
  history: {},        // name -> [{t, seen, backlog, rate}]
  selected: null,
  checkpoints: [],
  showAllCheckpoints: false,
  windows: null,
  dlqOffset: 0,
  dlqShown: null,     // what the dead-letter table shows (function, page, rows), so an unchanged page is not redrawn
  detailPolls: 0,
  busy: false,
};

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

function fmt(n) {
  if (n == null) return "-";
  if (typeof n === "bigint") return n.toLocaleString("en-US");
  return typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 1 }) : String(n);
}

// An epoch as the CLI shows it (`eventing checkpoints`): generation:counter, where epoch = generation << 32 | counter.
function fmtEpoch(epoch) {
  if (epoch == null) return "-";
  const e = BigInt(epoch);
  return `${e >> 32n}:${e & 0xFFFFFFFFn}`;
}

// Epoch seconds as the CLI shows them: UTC date and time, 2026-01-01T12:00:00Z.
function fmtUtc(seconds) {
  if (!seconds) return "-";
  return new Date(Number(seconds) * 1000).toISOString().slice(0, 19) + "Z";
}

// JSON.parse rounds integers beyond 2^53 (a cas is a nanosecond clock, about 1.8e18), so such integers are
// read from the text as BigInt: each becomes a marked string ("\u0000#digits") that the reviver turns into a
// BigInt. A real string value that starts with \u0000 gets one more \u0000 in front, which the reviver
// takes off again, so no string is ever mistaken for a number; keys are left as they are.
const JSON_TOKEN = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
function parseJson(text) {
  let big = false;
  const marked = text.replace(JSON_TOKEN, (token, at) => {
    if (token[0] === '"') {
      const isKey = /^\s*:/.test(text.slice(at + token.length, at + token.length + 40));
      return !isKey && token.startsWith('"\\u0000') ? '"\\u0000' + token.slice(1) : token;
    }
    if (!/^-?\d+$/.test(token) || Number.isSafeInteger(Number(token))) return token;
    big = true;
    return '"\\u0000#' + token + '"';
  });
  if (!big) return JSON.parse(text);
  return JSON.parse(marked, (key, value) => typeof value === "string" && value[0] === "\u0000"
    ? (value[1] === "#" ? BigInt(value.slice(2)) : value.slice(1)) : value);
}

// JSON.stringify with two-space indentation that writes a BigInt as its exact digits.
function toJson(value, indent = "") {
  if (typeof value === "bigint") return value.toString();
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  const inner = indent + "  ";
  const items = Array.isArray(value) ? value.map((v) => inner + toJson(v, inner))
    : Object.entries(value).map(([k, v]) => inner + JSON.stringify(k) + ": " + toJson(v, inner));
  const [open, close] = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
  return items.length ? `${open}\n${items.join(",\n")}\n${indent}${close}` : open + close;
}

// The caller's role, named by the server on every authenticated response (X-Eventing-Role): controls that
// change state (class admin-only) show only for "admin" (console.css hides them otherwise).
function setRole(role) {
  if (document.body.dataset.role !== role) document.body.dataset.role = role;
}

async function api(method, path, body, isText) {
  const headers = {};
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = isText ? "text/plain" : "application/json";
    init.body = isText ? body : JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const type = r.headers.get("content-type") || "";
  const text = await r.text();
  const data = type.includes("json") ? parseJson(text) : text;
  if (r.headers.get("x-eventing-role")) setRole(r.headers.get("x-eventing-role"));
  else if (r.status === 401) setRole("none");
  if (!r.ok) {
    const err = new Error(data && data.error ? data.error : `${r.status} ${r.statusText}`);
    err.status = r.status;
    err.fix = data && data.fix;
    throw err;
  }
  return data;
}

function say(text, ok) {
  const box = $("#message");
  box.textContent = text;
  box.className = ok ? "ok" : "";
  box.hidden = !text;
}

// -- functions ---------------------------------------------------------------------------------------

async function pollFunctions() {
  let status, stats;
  try {
    [status, stats] = await Promise.all([api("GET", "/api/v1/status"), api("GET", "/api/v1/stats")]);
  } catch (e) {
    $("#connection").textContent = e.status !== 401 ? "cannot reach the API: " + e.message
      : state.token ? "token not accepted: it is neither the admin nor the read-only token of this server; check it"
        : "needs a token: paste the admin or read-only token and press use";
    return;
  }
  const services = status.services.length;
  $("#connection").textContent = `${status.apps.length} functions · ${status.num_eventing_nodes} eventing node(s) · ` +
    (services ? `service running (${services})` : "no service running") +
    (document.body.dataset.role === "read" ? " · read-only token: changes are hidden" : "");
  const byName = Object.fromEntries(stats.map((s) => [s.function_name, s]));
  const now = Date.now() / 1000;
  const tbody = $("#functions tbody");
  const seen = new Set();
  for (const shown of status.apps) {
    // Couchbase's shape names a function in a namespace by its plain name beside function_scope; the
    // console (and every request it makes) uses its full name, BUCKET.SCOPE.NAME
    const scope = shown.function_scope || { bucket: "*", scope: "*" };
    const app = scope.bucket === "*" ? shown : { ...shown, name: `${scope.bucket}.${scope.scope}.${shown.name}` };
    const s = byName[app.name] || {};
    seen.add(app.name);
    state.functions[app.name] = app;
    const hist = (state.history[app.name] = state.history[app.name] || []);
    const prev = hist[hist.length - 1];
    const rate = prev && now > prev.t ? Math.max(0, (s.mutations_seen - prev.seen) / (now - prev.t)) : 0;
    hist.push({ t: now, seen: s.mutations_seen || 0, backlog: s.checkpoint_lag || 0, rate });
    if (hist.length > HISTORY) hist.shift();
    let row = tbody.querySelector(`tr[data-function="${CSS.escape(app.name)}"]`);
    if (!row) {
      row = el("tr", { dataset: { function: app.name } });
      for (const cls of ["name", "state", "source", "workers", "seen num", "success num", "failure num", "timeout num",
        "dlq num", "backlog num", "rate num", "chart", "actions"]) row.append(el("td", { class: cls }));
      row.querySelector(".name").textContent = app.name;
      row.querySelector(".name").addEventListener("click", () => select(app.name));
      row.querySelector(".chart").append(el("canvas", { class: "spark", width: 180, height: 34 }));
      tbody.append(row);
    }
    const stateCell = row.querySelector(".state");
    if (stateCell.dataset.value !== app.composite_status) {
      stateCell.dataset.value = app.composite_status;
      stateCell.replaceChildren(el("span", { class: "state-" + app.composite_status }, app.composite_status));
      renderActions(row.querySelector(".actions"), app);
    }
    row.querySelector(".source").textContent = app.source_bucket;
    row.querySelector(".workers").textContent = `${app.vbuckets_leased ? app.workers + " live" : app.workers}`;
    const dlq = Object.values(s.dlq || {}).reduce((a, b) => a + b, 0);
    const sum = (k) => (s["on_update_" + k] || 0) + (s["on_delete_" + k] || 0);
    row.querySelector(".seen").textContent = fmt(s.mutations_seen);
    row.querySelector(".success").textContent = fmt(sum("success"));
    row.querySelector(".failure").textContent = fmt(sum("failure"));
    row.querySelector(".timeout").textContent = fmt(sum("timeout"));
    row.querySelector(".dlq").textContent = fmt(dlq);
    row.querySelector(".backlog").textContent = fmt(s.checkpoint_lag);
    row.querySelector(".rate").textContent = fmt(Math.round(rate));
    drawSpark(row.querySelector("canvas"), hist);
    row.classList.toggle("selected", app.name === state.selected);
  }
  for (const row of [...tbody.children]) if (!seen.has(row.dataset.function)) row.remove();
  $("#no-functions").hidden = status.apps.length > 0;
  if (!state.selected && seen.size) select([...seen][0]);
  if (state.selected && state.functions[state.selected]) {
    const badge = $("#detail-state");
    badge.textContent = state.functions[state.selected].composite_status;
    badge.className = "badge state-" + state.functions[state.selected].composite_status;
  }
}

function renderActions(cell, app) {
  cell.replaceChildren();
  for (const action of STATE_ACTIONS[app.composite_status] || []) {
    cell.append(el("button", { type: "button", class: "admin-only", dataset: { action }, onclick: () => lifecycle(app.name, action) },
      action), " ");
  }
}

async function lifecycle(name, action) {
  if ((action === "delete" || action === "undeploy") && !confirm(`${action} function ${name}?`)) return;
  const row = document.querySelector(`tr[data-function="${CSS.escape(name)}"]`);
  row.querySelectorAll("button").forEach((b) => (b.disabled = true));
  say(`${action} ${name}…`, true);
  try {
    if (action === "delete") await api("DELETE", `/api/v1/functions/${encodeURIComponent(name)}`);
    else await api("POST", `/api/v1/functions/${encodeURIComponent(name)}/${action}`);
    say(`${name}: ${action} done`, true);
    if (action === "delete" && state.selected === name) state.selected = null;
  } catch (e) {
    say(`${action} ${name}: ${e.message}`);
  }
  const stateCell = row.querySelector(".state");
  if (stateCell) stateCell.dataset.value = ""; // redraw the buttons on the next poll
  await pollFunctions();
}

function drawSpark(canvas, hist) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (hist.length < 2) return;
  const line = (key, color) => {
    const max = Math.max(1, ...hist.map((p) => p[key]));
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    hist.forEach((p, i) => {
      const x = (i / (hist.length - 1)) * w;
      const y = h - 2 - (p[key] / max) * (h - 4);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  };
  line("backlog", "#e15759");
  line("rate", "#4e79a7");
}

// -- detail of one function --------------------------------------------------------------------------

function select(name) {
  state.selected = name;
  state.checkpoints = [];
  state.windows = null;
  state.dlqOffset = 0;
  state.dlqShown = null;
  $("#app-log").textContent = "";
  $("#detail").hidden = false;
  $("#detail-name").textContent = name;
  $("#dlq-detail").hidden = true;
  document.querySelectorAll("#functions tr[data-function]").forEach((r) => r.classList.toggle("selected", r.dataset.function === name));
  pollDetail();
}

async function pollDetail() {
  const name = state.selected;
  if (!name) return;
  const base = `/api/v1/functions/${encodeURIComponent(name)}`;
  const showReplayed = $("#dlq-show-replayed").checked ? "&all=1" : "";
  const offset = state.dlqOffset;
  const [cps, dlq, log, windows] = await Promise.allSettled([
    api("GET", base + "/checkpoints"),
    api("GET", `${base}/dlq?limit=${DLQ_PAGE + 1}&offset=${offset}${showReplayed}`), // one more: is there a next page
    api("GET", `/getAppLog?name=${encodeURIComponent(name)}`),
    state.functions[name] && state.functions[name].windowed ? api("GET", base + "/windows?limit=400")
      : Promise.reject(new Error("not windowed")),
  ]);
  if (name !== state.selected) return;
  if (cps.status === "fulfilled") renderCheckpoints(cps.value.rows);
  else if (cps.reason.status === 409) renderCheckpoints([]); // not deployed: no checkpoints
  if (dlq.status === "fulfilled" && offset === state.dlqOffset) renderDlq(dlq.value, offset, showReplayed);
  renderLog(log.status === "fulfilled" ? log.value || "(no log lines yet: they appear once the handler calls log())"
    : log.reason.message);
  $("#windows-part").hidden = windows.status !== "fulfilled";
  if (windows.status === "fulfilled") renderWindows(windows.value);
  document.body.dataset.detailPolls = String(++state.detailPolls); // how many refreshes the detail has had
}

// Follow mode, as `tail -f`: new lines scroll into view only while the pane is scrolled to the bottom;
// a reader scrolled up to older lines stays where they are.
function renderLog(text) {
  const box = $("#app-log");
  if (box.textContent === text) return;
  const following = box.scrollHeight - box.scrollTop - box.clientHeight < 8;
  box.textContent = text;
  if (following) box.scrollTop = box.scrollHeight;
}

function ownerColors(rows) {
  const owners = [...new Set(rows.map((r) => r.owner || "(none)"))].sort();
  return Object.fromEntries(owners.map((o, i) => [o, PALETTE[i % PALETTE.length]]));
}

function renderCheckpoints(rows) {
  state.checkpoints = rows;
  const canvas = $("#vbmap");
  const ctx = canvas.getContext("2d");
  const cell = canvas.width / 32;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const colors = ownerColors(rows);
  const byVb = new Map(rows.map((r) => [r.vb, r]));
  for (let vb = 0; vb < 1024; vb++) {
    const r = byVb.get(vb);
    const x = (vb % 32) * cell, y = Math.floor(vb / 32) * cell;
    ctx.fillStyle = r ? colors[r.owner || "(none)"] : "#eceff3";
    ctx.globalAlpha = r && r.leased ? 1 : 0.45; // faded: not held by a live worker right now
    ctx.fillRect(x + 1, y + 1, cell - 2, cell - 2);
    if (r && r.backlog > 0) {
      ctx.globalAlpha = 1;
      ctx.fillStyle = "#000";
      ctx.fillRect(x + cell / 2 - 1.5, y + cell / 2 - 1.5, 3, 3);
    }
  }
  ctx.globalAlpha = 1;
  const counts = {};
  rows.forEach((r) => (counts[r.owner || "(none)"] = (counts[r.owner || "(none)"] || 0) + 1));
  $("#vbmap-legend").replaceChildren(...Object.entries(colors).map(([o, c]) =>
    el("li", {}, swatch(c), `${o}: ${counts[o]} vBuckets`)));
  if (!rows.length) $("#vbmap-legend").replaceChildren(el("li", {}, "not deployed: no checkpoints"));

  const sorted = [...rows].sort((a, b) => b.backlog - a.backlog || a.vb - b.vb);
  const shown = state.showAllCheckpoints ? sorted : sorted.slice(0, 32);
  $("#checkpoints tbody").replaceChildren(...shown.map((r) => el("tr", {},
    el("td", { class: "num" }, r.vb), el("td", { class: "num" }, fmt(r.checkpoint)), el("td", { class: "num" }, fmt(r.high_seqno)),
    el("td", { class: "num" }, fmt(r.backlog)), el("td", {}, r.owner || "-"), el("td", { class: "num epoch" }, fmtEpoch(r.epoch)),
    el("td", {}, r.leased ? "yes" : "no"), el("td", { class: "muted updated" }, fmtUtc(r.updated_at)))));
  $("#checkpoints-more").textContent = state.showAllCheckpoints ? "show the top 32" : `show all ${rows.length}`;
}

function swatch(color) {
  const span = el("span");
  span.style.background = color; // CSSOM, allowed by the page's Content-Security-Policy (no inline styles)
  return span;
}

function vbHover(ev) {
  const canvas = $("#vbmap");
  const rect = canvas.getBoundingClientRect();
  const cell = rect.width / 32;
  const col = Math.floor((ev.clientX - rect.left) / cell), line = Math.floor((ev.clientY - rect.top) / cell);
  if (col < 0 || col > 31 || line < 0 || line > 31) return;
  const vb = line * 32 + col;
  const r = state.checkpoints.find((c) => c.vb === vb);
  const text = r ? `vBucket ${vb}: owner ${r.owner || "-"}, epoch ${fmtEpoch(r.epoch)}, checkpoint ${r.checkpoint} of ${r.high_seqno} ` +
    `(backlog ${r.backlog}), ${r.leased ? "held by a live worker" : "not held"}` : `vBucket ${vb}: no checkpoint`;
  canvas.title = text;
  $("#vbmap-hover").textContent = text;
}

function renderDlq(page, offset, showReplayed) {
  const name = state.selected;
  if (!page.length && offset > 0) { // the page emptied (purged or replayed): go back one
    state.dlqOffset = Math.max(0, offset - DLQ_PAGE);
    pollDetail();
    return;
  }
  const shown = toJson({ name, offset, showReplayed, page });
  if (shown === state.dlqShown) return; // nothing changed: keep the rows (and the reader's place) as they are
  state.dlqShown = shown;
  const rows = page.slice(0, DLQ_PAGE);
  $("#dlq-prev").disabled = offset === 0;
  $("#dlq-next").disabled = page.length <= DLQ_PAGE;
  $("#dlq-page").textContent = rows.length ? `rows ${offset + 1}–${offset + rows.length}` +
    (page.length > DLQ_PAGE ? "" : " (the last page)") : "";
  $("#dlq tbody").replaceChildren(...rows.map((r) => el("tr", {},
    el("td", { class: "num" }, r.vb), el("td", { class: "num" }, r.seqno), el("td", {}, r.key), el("td", {}, r.reason),
    el("td", { class: "num" }, r.attempts), el("td", { class: "muted" }, r.last_failed_at), el("td", {}, r.replayed_at ? "yes" : ""),
    el("td", {}, (r.error || "").split("\n")[0].slice(0, 90)),
    el("td", {},
      el("button", { type: "button", onclick: () => dlqShow(name, r) }, "show"), " ",
      el("button", { type: "button", class: "admin-only", onclick: () => dlqAction(name, "replay", { vb: r.vb, seqno: r.seqno }) },
        "replay"), " ",
      el("button", { type: "button", class: "admin-only", onclick: () => dlqAction(name, "purge", { vb: r.vb, seqno: r.seqno }) },
        "purge")))));
  if (!rows.length) $("#dlq tbody").replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "no dead letters")));
}

async function dlqShow(name, r) {
  try {
    const rows = await api("GET", `/api/v1/functions/${encodeURIComponent(name)}/dlq/show?vb=${r.vb}&seqno=${r.seqno}`);
    const box = $("#dlq-detail");
    box.textContent = toJson(rows[0]); // exact: a cas keeps all its digits
    box.hidden = false;
  } catch (e) {
    say(e.message);
  }
}

async function dlqAction(name, action, selector) {
  if (action === "purge" && !confirm(`purge dead letters of ${name}?`)) return;
  try {
    const out = await api("POST", `/api/v1/functions/${encodeURIComponent(name)}/dlq/${action}`, selector);
    say(action === "purge" ? `purged ${out.purged} dead letters` :
      `replayed ${out.replayed} of ${out.selected}; ${out.failed} still failing`, !out.failed);
  } catch (e) {
    say(`${action}: ${e.message}`);
  }
  pollDetail();
}

function renderWindows(report) {
  state.windows = report;
  $("#windows-watermark").textContent = `watermark ${report.watermark || "-"} · ${report.open_windows} open · ` +
    `${report.windows_emitted} emitted · ${report.late_rows} late rows`;
  const select = $("#windows-aggregate");
  if (select.options.length !== report.aggregates.length) {
    select.replaceChildren(...report.aggregates.map((a) => el("option", { value: a }, a)));
  }
  const aggregate = select.value || report.aggregates[0];
  drawWindows(report, aggregate);
  const headers = ["window start", "window end", ...report.group_by, ...report.aggregates];
  $("#windows thead").replaceChildren(el("tr", {}, ...headers.map((h) => el("th", {}, h))));
  const rows = report.results.slice(-40).reverse();
  $("#windows tbody").replaceChildren(...rows.map((r) => el("tr", {},
    el("td", {}, r.window_start), el("td", {}, r.window_end), ...report.group_by.map((g) => el("td", {}, r[g])),
    ...report.aggregates.map((a) => el("td", { class: "num" }, fmt(r[a]))))));
}

function drawWindows(report, aggregate) {
  const canvas = $("#windows-chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 40;
  ctx.clearRect(0, 0, w, h);
  const series = {};
  for (const r of report.results) {
    const label = report.group_by.map((g) => r[g]).join(" / ") || aggregate;
    (series[label] = series[label] || []).push([r.window_start_ms, r[aggregate]]);
  }
  const points = Object.values(series).flat().filter((p) => p[1] != null);
  if (!points.length) {
    ctx.fillStyle = "#6b7385";
    ctx.fillText("no closed windows yet", pad, h / 2);
    return;
  }
  const t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0]));
  const max = Math.max(...points.map((p) => p[1]));
  const min = Math.min(...points.map((p) => p[1]));
  const span = Math.max(max - min, 1e-9);
  const x = (t) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (w - pad - 10);
  const y = (v) => h - 20 - ((v - min) / span) * (h - 50);
  ctx.strokeStyle = "#dde1e8";
  ctx.strokeRect(pad, 10, w - pad - 10, h - 30);
  ctx.fillStyle = "#6b7385";
  ctx.font = "11px system-ui";
  ctx.fillText(fmt(max), 2, 40);
  ctx.fillText(fmt(min), 2, h - 20);
  ctx.fillText(new Date(t0).toISOString().slice(11, 16), pad, h - 5);
  ctx.fillText(new Date(t1).toISOString().slice(11, 16), w - 50, h - 5);
  Object.entries(series).slice(0, 12).forEach(([label, pts], i) => {
    ctx.strokeStyle = PALETTE[i % PALETTE.length];
    ctx.beginPath();
    pts.sort((a, b) => a[0] - b[0]).forEach(([t, v], j) => (j ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    ctx.fillStyle = PALETTE[i % PALETTE.length];
    ctx.fillText(label, pad + 8 + (i % 6) * 80, 24 + Math.floor(i / 6) * 12);
  });
}

// -- nodes and rebalance -----------------------------------------------------------------------------

async function pollCluster() {
  try {
    const [nodes, progress] = await Promise.all([api("GET", "/api/v1/nodes"), api("GET", "/api/v1/rebalance")]);
    $("#nodes tbody").replaceChildren(...nodes.nodes.map((n) => el("tr", {},
      el("td", {}, n.name), el("td", {}, n.state), el("td", { class: "num" }, n.vbuckets))));
    const req = progress.request;
    $("#rebalance-progress").value = req ? progress.progress : 0;
    $("#rebalance-text").textContent = req ? `rebalance ${req.id}: ${req.status}, ${progress.moved} of ${progress.moves} vBuckets moved` +
      (req.seconds != null ? ` in ${req.seconds}s` : "") : "no rebalance yet";
  } catch (e) { /* shown by the function poll */ }
}

async function rebalance(start) {
  try {
    const plan = await api(start ? "POST" : "GET", start ? "/api/v1/rebalance" : "/api/v1/rebalance/plan");
    const box = $("#rebalance-plan-text");
    box.textContent = `moves: ${plan.moves} vBuckets\n` + plan.move_groups.map((g) => `${g.from} -> ${g.to}: ${g.vbuckets} (${g.ranges})`).join("\n") +
      (start ? `\nstatus: ${plan.status}` : "");
    box.hidden = false;
    pollCluster();
  } catch (e) {
    say(e.message);
  }
}

// -- start -------------------------------------------------------------------------------------------

function loop(fn, ms) {
  const tick = async () => {
    try { await fn(); } finally { setTimeout(tick, ms); }
  };
  tick();
}

$("#token").value = state.token;
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("#token").value.trim();
  sessionStorage.setItem("eventing-token", state.token);
  say("", true);
  pollFunctions();
});
$("#vbmap").addEventListener("mousemove", vbHover);
$("#checkpoints-more").addEventListener("click", () => {
  state.showAllCheckpoints = !state.showAllCheckpoints;
  renderCheckpoints(state.checkpoints);
});
$("#windows-aggregate").addEventListener("change", () => state.windows && drawWindows(state.windows, $("#windows-aggregate").value));
$("#dlq-replay-all").addEventListener("click", () => dlqAction(state.selected, "replay", { all: true }));
$("#dlq-purge-replayed").addEventListener("click", () => dlqAction(state.selected, "purge", { replayed: true }));
$("#dlq-purge-all").addEventListener("click", () => dlqAction(state.selected, "purge", { all: true }));
$("#dlq-show-replayed").addEventListener("change", () => { state.dlqOffset = 0; pollDetail(); });
$("#dlq-prev").addEventListener("click", () => { state.dlqOffset = Math.max(0, state.dlqOffset - DLQ_PAGE); pollDetail(); });
$("#dlq-next").addEventListener("click", () => { state.dlqOffset += DLQ_PAGE; pollDetail(); });
$("#rebalance-plan").addEventListener("click", () => rebalance(false));
$("#rebalance-start").addEventListener("click", () => confirm("start a rebalance?") && rebalance(true));
loop(pollFunctions, POLL_MS);
loop(pollDetail, DETAIL_POLL_MS);
loop(pollCluster, DETAIL_POLL_MS);
