"use strict";
// The run view: /trainops/runs/<dag_id>/<run_id> shows /trainops/api/runs/<dag_id>/<run_id>.
const parts = location.pathname.split("/").filter(Boolean);  // ["trainops", "runs", dag, run]
const dagId = decodeURIComponent(parts[2]), runId = decodeURIComponent(parts[3]);
const base = `/trainops/api/runs/${encodeURIComponent(dagId)}/${encodeURIComponent(runId)}`;
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const $ = (id) => document.getElementById(id);

function showError(response, text) {
  $("error").innerHTML = response.status === 401 || response.status === 403
    ? `Not allowed (${response.status}). <a href="/auth/login/?next=${encodeURIComponent(location.href)}">Log in</a>`
    : esc(`${response.status}: ${text}`);
}

function render(d) {
  $("title").textContent = `Training run ${d.dag_id} / ${d.run_id}`;
  const train = d.tasks.train || {};
  $("summary").textContent = `run ${d.state}; train ${train.state ?? "not started"} (try ${train.try_number ?? 0}); ` +
    `${d.ledger.preemptions ?? 0} preemption(s)`;
  $("attempts").querySelector("tbody").innerHTML = (d.ledger.attempts || []).map((a) =>
    `<tr><td>${a.number}</td><td>${esc(a.job)}</td>` +
    `<td>${a.resume_from ? esc(a.resume_from) + (a.resume_step != null ? ` (step ${a.resume_step})` : "") : '<span class="muted">fresh start</span>'}</td>` +
    `<td class="${a.kind === "succeeded" ? "ok" : a.kind ? "bad" : ""}">${esc(a.kind ?? a.phase)}</td><td>${esc(a.ended)}</td>` +
    `<td>${esc((a.hints || []).join("; "))}</td></tr>`).join("");
  const excluded = Object.entries(d.ledger.excluded || {});
  $("excluded").innerHTML = excluded.length
    ? "Nodes kept out (culprits): " + excluded.map(([n, why]) => `<b>${esc(n)}</b>: ${esc(why)}`).join("; ") : "";
  const c = d.checkpoints;
  $("latest").innerHTML = c.error ? `<span class="bad">${esc(c.error)}</span>`
    : c.checkpoint ? `Latest verified: <b>${esc(c.checkpoint.uri)}</b> (step ${esc(c.checkpoint.step)})`
    : c.run_uri ? `No verified checkpoint under ${esc(c.run_uri)} yet` : "The run has no run path yet";
  $("skipped").querySelector("tbody").innerHTML = (c.skipped || []).map((s) =>
    `<tr><td>${esc(s.uri)}</td><td>${esc(s.step)}</td><td class="bad">${esc((s.reasons || []).join("; "))}</td></tr>`).join("");
  const claimed = d.capacity.claimed, returned = d.capacity.returned;
  $("capacity").innerHTML = (claimed ? `Claimed: ${esc((claimed.node_names || []).join(", "))}. ` : "Nothing claimed yet. ") +
    (returned ? `Returned: ${esc((returned.node_names || []).join(", "))} (${esc(returned.gpus_returned)} GPUs).` : "Not returned yet.");
}

async function load() {
  const response = await fetch(base, {credentials: "same-origin"});
  const text = await response.text();
  if (!response.ok) return showError(response, text);
  render(JSON.parse(text));
}

$("return").addEventListener("click", async () => {
  const run = `${dagId}/${runId}`;
  const typed = prompt(`Return every GPU node and inference loan of ${run}? Type ${run} to confirm.`);
  if (typed === null) return;
  const response = await fetch(`${base}/return`, {
    method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: JSON.stringify({confirm: typed}),
  });
  const text = await response.text();
  if (!response.ok) return showError(response, text);
  $("error").textContent = "";
  await load();
});
load();
