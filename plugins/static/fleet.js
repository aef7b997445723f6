"use strict";
// The fleet view: one call to /trainops/api/fleet, then filter and sort in the page (4,096 rows); the
// tensor-core activity arrives apart (/trainops/api/fleet/tensor-activity) and fills its column.
const api = "/trainops/api";
let rows = [], activity = {}, sortKey = "name", sortDir = 1;
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const age = (stamp) => {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(stamp)) / 1000));
  return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
};
const tensor = (v) => v == null ? '<span class="muted">n/a</span>' : `${(v * 100).toFixed(0)}%`;
const since = (q) => q && q.since ? new Date(q.since * 1000).toISOString().replace(".000", "") : "";

function showError(response, text) {
  const login = response.status === 401 || response.status === 403;
  document.getElementById("error").innerHTML = login
    ? `Not logged in to Airflow (${response.status}). <a href="/auth/login/?next=${encodeURIComponent(location.href)}">Log in</a>`
    : esc(`${response.status}: ${text}`);
}

function runLink(run) {
  if (!run) return "";
  const [dag, id] = run.split("/");
  return `<a href="/trainops/runs/${encodeURIComponent(dag)}/${encodeURIComponent(id)}">${esc(run)}</a>`;
}

function rowHtml(n) {
  const q = n.quarantine;
  const health = n.health === "ok" || n.health === "warn" ? "ok" : n.health === "unknown" ? "muted" : "bad";
  return `<tr data-node="${esc(n.name)}"><td>${esc(n.name)}</td><td>${esc(n.mode)}</td><td>${runLink(n.claimed_by)}</td>` +
    `<td class="${health}">${esc(n.health)}${n.reported_at ? ` <span class="muted">${esc(age(n.reported_at))}</span>` : ""}</td><td>${esc(n.reasons.join("; "))}</td>` +
    `<td class="${q ? "bad" : ""}">${q ? esc(q.reason) + ` <span class="muted">since ${esc(since(q))}</span>` : ""}</td>` +
    `<td>${n.gpus}</td><td class="tensor">${tensor(activity[n.name])}</td><td>${q ? `<button class="release" data-node="${esc(n.name)}">Release…</button>` : ""}</td></tr>`;
}

function sortValue(n, key) {
  const v = n[key];
  if (key === "quarantine") return v ? v.reason : "";
  if (key === "reasons") return v.join("; ");
  if (key === "tensor_active") return activity[n.name] ?? -1;
  return v ?? "";
}

function render() {
  const words = document.getElementById("filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  const shown = rows.filter((n) => words.every((w) => n._text.includes(w)));
  shown.sort((a, b) => {
    const x = sortValue(a, sortKey), y = sortValue(b, sortKey);
    return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
  });
  document.querySelector("#fleet tbody").innerHTML = shown.map(rowHtml).join("");
  document.getElementById("shown").textContent = `${shown.length} of ${rows.length} nodes`;
}

function renderCounts(c) {
  const parts = [`total ${c.total}`, `quarantined ${c.quarantined}`, `claimed ${c.claimed}`,
    ...Object.entries(c.mode).map(([k, v]) => `${k} ${v}`), ...Object.entries(c.health).map(([k, v]) => `${k} ${v}`)];
  document.getElementById("counts").innerHTML = parts.map((p) => `<span>${esc(p)}</span>`).join("");
}

async function load() {
  const response = await fetch(`${api}/fleet`, {credentials: "same-origin"});
  const text = await response.text();
  if (!response.ok) return showError(response, text);
  const data = JSON.parse(text);
  rows = data.nodes.map((n) => ({...n, _text: [n.name, n.mode, n.health, n.claimed_by, n.quarantine && n.quarantine.reason, ...n.reasons].join(" ").toLowerCase()}));
  renderCounts(data.counts);
  render();
}

async function loadActivity() {
  const response = await fetch(`${api}/fleet/tensor-activity`, {credentials: "same-origin"});
  if (!response.ok) return;  // the fleet's own answer says why (login)
  const t = await response.json();
  activity = t.nodes;
  document.getElementById("notes").textContent = !t.configured
    ? "Tensor-core activity: n/a (no Prometheus: set [trainops] prometheus_conn_id to a trainops_prometheus connection)"
    : t.error ? `Tensor-core activity: n/a (${t.error})` : "";
  if (rows.length) render();
}

async function release(node) {
  const typed = prompt(`Re-check ${node} and release it from quarantine if it passes? Type the node name to confirm.`);
  if (typed === null) return;
  const response = await fetch(`${api}/nodes/${encodeURIComponent(node)}/release`, {
    method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: JSON.stringify({confirm: typed}),
  });
  const text = await response.text();
  if (!response.ok) return showError(response, JSON.parse(text).detail ?? text);
  document.getElementById("error").textContent = "";
  await load();
}

document.getElementById("filter").addEventListener("input", render);
document.querySelector("#fleet thead").addEventListener("click", (e) => {
  const key = e.target.dataset.key;
  if (!key) return;
  sortDir = key === sortKey ? -sortDir : 1;
  sortKey = key;
  render();
});
document.querySelector("#fleet tbody").addEventListener("click", (e) => {
  if (e.target.classList.contains("release")) release(e.target.dataset.node);
});
load();
loadActivity();
