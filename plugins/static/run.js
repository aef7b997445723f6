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
  const times = Object.fromEntries(d.progress.attempts.map((a) => [a.number, a]));
  const span = (a) => a && a.started_at != null ? `${clock(a.started_at)}–${a.ended_at != null ? clock(a.ended_at) : ""}` : "";
  $("attempts").querySelector("tbody").innerHTML = (d.ledger.attempts || []).map((a) =>
    `<tr><td>${a.number}</td><td>${esc(a.job)}<br><span class="muted">${span(times[a.number])}</span></td>` +
    `<td>${a.resume_from ? esc(a.resume_from) + (a.resume_step != null ? ` (step ${a.resume_step})` : "") : '<span class="muted">fresh start</span>'}</td>` +
    `<td class="${a.kind === "succeeded" ? "ok" : a.kind ? "bad" : ""}">${esc(a.kind ?? a.phase)}</td><td>${esc(a.ended)}</td>` +
    `<td>${esc(((times[a.number] || {}).culprits || []).join(", "))}</td><td>${esc((a.hints || []).join("; "))}</td></tr>`).join("");
  if (d.ledger.error) $("error").textContent = d.ledger.error;
  renderProgress(d.progress);
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
    (returned ? `Returned: ${esc((returned.node_names || []).join(", "))} (${esc(returned.gpus_returned)} GPUs; ${quota(returned)}).` : "Not returned yet.");
}

const quota = (r) => r.quota_returned ? `${esc(r.quota_returned)} GPUs of quota taken back` : "no quota was granted";
const clock = (t) => new Date(t * 1000).toISOString().slice(11, 19);
const ago = (t) => { const s = Math.max(0, Math.round(Date.now() / 1000 - t)); return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`; };

function renderHeartbeat(p) {
  const h = p.heartbeat, r = p.rate;
  if (!h) {
    $("heartbeat").innerHTML = p.errors.heartbeat ? "" : '<span class="muted">No heartbeat: the trainer writes none through the helper (progress is judged by new checkpoints)</span>';
    return;
  }
  const rate = r ? `<b>${r.steps_per_s.toFixed(2)} steps/s</b> since ${esc(r.what)} (${clock(r.at)} UTC)` : '<span class="muted">rate n/a (no earlier progress of this attempt)</span>';
  $("heartbeat").innerHTML = `Heartbeat: <b>step ${h.step}</b> at ${clock(h.at)} UTC (${ago(h.at)}${h.saving ? ", saving a checkpoint" : ""}); ${rate}`;
}

// Step against time: one line per attempt (from where it resumed, through its commits and the heartbeat),
// a triangle where each resume started, a cross where an attempt failed.
function plotSvg(p) {
  const W = 860, H = 260, L = 56, R = 16, T = 12, B = 30;
  const timed = p.attempts.filter((a) => a.started_at != null);
  const lines = timed.map((a, i) => {
    const last = i === timed.length - 1;
    const end = a.ended_at ?? (last ? Infinity : timed[i + 1].started_at);
    const inside = (t) => t >= a.started_at && t <= end;
    const pts = [{t: a.started_at, step: a.resume_step ?? 0}, ...p.commits.filter((c) => inside(c.at)).map((c) => ({t: c.at, step: c.step}))];
    if (p.heartbeat && inside(p.heartbeat.at)) pts.push({t: p.heartbeat.at, step: p.heartbeat.step});
    pts.sort((x, y) => x.t - y.t);
    if (a.ended_at != null) pts.push({t: a.ended_at, step: pts[pts.length - 1].step});
    return {a, pts};
  });
  const all = [...lines.flatMap((l) => l.pts), ...(timed.length ? [] : p.commits.map((c) => ({t: c.at, step: c.step})))];
  if (p.heartbeat && !timed.length) all.push({t: p.heartbeat.at, step: p.heartbeat.step});
  if (!all.length) return "";
  const t0 = Math.min(...all.map((q) => q.t)), t1 = Math.max(...all.map((q) => q.t), t0 + 1);
  const s1 = Math.max(...all.map((q) => q.step), 1);
  const x = (t) => (L + (t - t0) / (t1 - t0) * (W - L - R)).toFixed(1), y = (s) => (H - B - s / s1 * (H - T - B)).toFixed(1);
  const path = (pts) => pts.map((q) => `${x(q.t)},${y(q.step)}`).join(" ");
  const parts = [
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" class="axis"/><line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" class="axis"/>`,
    `<text x="${L - 6}" y="${y(s1)}" text-anchor="end" dy="4">${s1}</text><text x="${L - 6}" y="${H - B}" text-anchor="end">0</text>`,
    `<text x="${L}" y="${H - 8}">${clock(t0)}</text><text x="${W - R}" y="${H - 8}" text-anchor="end">${clock(t1)} UTC</text>`,
    `<text x="12" y="${(H - B) / 2}" transform="rotate(-90 12 ${(H - B) / 2})" text-anchor="middle">step</text>`,
  ];
  if (!timed.length) parts.push(`<polyline class="series" points="${path(all.sort((p1, p2) => p1.t - p2.t))}"/>`);
  for (const {a, pts} of lines) {
    parts.push(`<polyline class="series" data-attempt="${a.number}" points="${path(pts)}"/>`);
    for (const c of pts.slice(1)) parts.push(`<circle class="point" cx="${x(c.t)}" cy="${y(c.step)}" r="2.5"/>`);
    if (a.number > 1) {
      const [cx, cy] = [x(a.started_at), y(a.resume_step ?? 0)];
      parts.push(`<path class="marker resume" data-attempt="${a.number}" d="M${cx},${cy - 7} l6,11 h-12 z"><title>attempt ${a.number} resumed from step ${a.resume_step ?? 0} at ${clock(a.started_at)} UTC</title></path>`);
    }
    if (a.ended_at != null && a.kind !== "succeeded") {
      const end = pts[pts.length - 1], [cx, cy] = [x(end.t), y(end.step)];
      const why = `attempt ${a.number} ended at ${clock(a.ended_at)} UTC: ${a.kind}: ${a.ended ?? ""}` + (a.culprits && a.culprits.length ? ` (culprit ${a.culprits.join(", ")})` : "");
      parts.push(`<path class="marker crash" data-attempt="${a.number}" d="M${cx - 5},${cy - 5} l10,10 m0,-10 l-10,10"><title>${esc(why)}</title></path>`);
    }
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" id="progress-plot" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="step against time">${parts.join("")}</svg>`;
}

function renderProgress(p) {
  renderHeartbeat(p);
  $("plot").innerHTML = plotSvg(p);
  const errors = Object.entries(p.errors).filter(([, why]) => why);
  $("progress-errors").textContent = errors.map(([part, why]) => `${part}: ${why}`).join("\n");
  if (p.checkpoints_unread) $("plot").insertAdjacentHTML("beforeend", `<p class="muted">${p.checkpoints_unread} older checkpoints not plotted</p>`);
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
  const r = JSON.parse(text);
  $("error").textContent = "";
  $("returned").textContent = `You returned ${r.node_names.length ? r.node_names.join(", ") : "nothing (the run held no nodes)"}` +
    ` (${r.gpus_returned} GPUs; ${quota(r)})` + (r.quarantined.length ? `; still quarantined: ${r.quarantined.join(", ")}` : "") +
    (r.workloads_restored.length ? `; inference restored: ${r.workloads_restored.join(", ")}` : "");
  await load();
});
load();
