// The Training run tab of a DAG run in the Airflow UI: the attempt ledger (its world size, where it resumed from,
// how it ended, the culprit), the heartbeat and its rate, a plot of step against time with crash and resume
// markers, the checkpoints as verified now, the capacity claimed and returned, and "Return this run's GPUs".
import {C, ConfirmDialog, ErrorText, React, ago, formatTime, h, post, useApi, useTimezone} from "./common.js";

const {useState} = React;
const ENDED = {succeeded: "success", infrastructure: "failed", user: "failed", hang: "failed", stopped: "skipped"};
const quota = (r) => (r.quota_returned ? `${r.quota_returned} GPUs of quota taken back` : "no quota was granted");

function Section({title, children}) {
  return h(C.Box, {as: "section", mt: 6},
    h(C.Heading, {as: "h3", size: "md", mb: 2}, title),
    children);
}

function Attempts({ledger, times, zone}) {
  const span = (a) => (a && a.started_at != null
    ? `${formatTime(a.started_at, zone, {date: false})} – ${a.ended_at != null ? formatTime(a.ended_at, zone, {date: false}) : "now"}` : "");
  return h(C.Table.Root, {id: "attempts", size: "sm", striped: true},
    h(C.Table.Header, null, h(C.Table.Row, null,
      ...["#", "Job", "Nodes", "Resumed from", "How it ended", "Why", "Culprit", "Hints"].map((t) => h(C.Table.ColumnHeader, {key: t}, t)))),
    h(C.Table.Body, null, (ledger.attempts || []).map((a) => h(C.Table.Row, {key: a.number},
      h(C.Table.Cell, null, a.number),
      h(C.Table.Cell, null, h(C.Text, {fontSize: "sm"}, a.job), h(C.Text, {fontSize: "xs", color: "fg.muted"}, span(times[a.number]))),
      h(C.Table.Cell, {fontSize: "sm", title: "the attempt's world size (nodes); fewer after an elastic resume"}, a.nodes ?? "?"),
      h(C.Table.Cell, {fontSize: "sm"}, a.resume_from
        ? `${a.resume_from}${a.resume_step != null ? ` (step ${a.resume_step})` : ""}` : h(C.Text, {as: "span", color: "fg.muted"}, "fresh start")),
      h(C.Table.Cell, null, h(C.Badge, {colorPalette: ENDED[a.kind] || "running"}, a.kind ?? a.phase)),
      h(C.Table.Cell, {fontSize: "sm"}, a.ended),
      h(C.Table.Cell, {fontSize: "sm"}, ((times[a.number] || {}).culprits || []).join(", ")),
      h(C.Table.Cell, {fontSize: "sm"}, (a.hints || []).join("; "))))));
}

// "Step 200 at 14:30:05 CET (12 s ago), 17.2 steps/s since the step-20 checkpoint"
function Heartbeat({progress, zone}) {
  const beat = progress.heartbeat, rate = progress.rate;
  if (!beat) {
    return progress.errors.heartbeat ? null : h(C.Text, {id: "heartbeat", color: "fg.muted"},
      "No heartbeat: the trainer writes none through the helper (progress is judged by new checkpoints)");
  }
  const pace = rate
    ? `, ${rate.steps_per_s.toFixed(1)} steps/s since ${rate.what} (${formatTime(rate.at, zone, {date: false})})`
    : ", no rate yet (no earlier progress of this attempt)";
  return h(C.Text, {id: "heartbeat"},
    "Heartbeat: ", h("b", null, `step ${beat.step}`),
    ` at ${formatTime(beat.at, zone)} (${ago(beat.at)}${beat.saving ? ", saving a checkpoint" : ""})${pace}`);
}

// Young–Daly from the newest save time and the run's failures: "Checkpoint interval: save every 27 min ..."
function Interval({progress}) {
  const advice = progress.interval;
  return advice ? h(C.Text, {id: "checkpoint-interval", fontSize: "sm"}, `Checkpoint interval: ${advice.summary}`) : null;
}

// Step against time: one line per attempt (from where it resumed, through its commits and the heartbeat),
// a triangle where each resume started, a cross where an attempt failed. Colours are the UI's tokens.
function Plot({progress, zone}) {
  const W = 860, HT = 260, L = 56, R = 16, T = 12, B = 30;
  const clock = (t) => formatTime(t, zone, {date: false});
  const timed = progress.attempts.filter((a) => a.started_at != null);
  const lines = timed.map((a, i) => {
    const end = a.ended_at ?? (i === timed.length - 1 ? Infinity : timed[i + 1].started_at);
    const inside = (t) => t >= a.started_at && t <= end;
    const pts = [{t: a.started_at, step: a.resume_step ?? 0},
      ...progress.commits.filter((c) => inside(c.at)).map((c) => ({t: c.at, step: c.step}))];
    if (progress.heartbeat && inside(progress.heartbeat.at)) pts.push({t: progress.heartbeat.at, step: progress.heartbeat.step});
    pts.sort((x, y) => x.t - y.t);
    if (a.ended_at != null) pts.push({t: a.ended_at, step: pts[pts.length - 1].step});
    return {a, pts};
  });
  const all = [...lines.flatMap((l) => l.pts), ...(timed.length ? [] : progress.commits.map((c) => ({t: c.at, step: c.step})))];
  if (progress.heartbeat && !timed.length) all.push({t: progress.heartbeat.at, step: progress.heartbeat.step});
  if (!all.length) return null;
  const t0 = Math.min(...all.map((q) => q.t)), t1 = Math.max(...all.map((q) => q.t), t0 + 1);
  const s1 = Math.max(...all.map((q) => q.step), 1);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R), y = (s) => HT - B - (s / s1) * (HT - T - B);
  const points = (pts) => pts.map((q) => `${x(q.t).toFixed(1)},${y(q.step).toFixed(1)}`).join(" ");
  const ink = {axis: "var(--chakra-colors-fg-muted)", series: "var(--chakra-colors-blue-solid)",
    resume: "var(--chakra-colors-green-solid)", crash: "var(--chakra-colors-red-solid)", text: "var(--chakra-colors-fg)"};
  const parts = [
    h("line", {key: "xa", x1: L, y1: HT - B, x2: W - R, y2: HT - B, className: "axis", stroke: ink.axis}),
    h("line", {key: "ya", x1: L, y1: T, x2: L, y2: HT - B, className: "axis", stroke: ink.axis}),
    h("text", {key: "top", x: L - 6, y: y(s1), textAnchor: "end", dy: 4, fill: ink.text}, s1),
    h("text", {key: "zero", x: L - 6, y: HT - B, textAnchor: "end", fill: ink.text}, 0),
    h("text", {key: "t0", x: L, y: HT - 8, fill: ink.text}, clock(t0)),
    h("text", {key: "t1", x: W - R, y: HT - 8, textAnchor: "end", fill: ink.text}, clock(t1)),
    h("text", {key: "label", x: 12, y: (HT - B) / 2, transform: `rotate(-90 12 ${(HT - B) / 2})`, textAnchor: "middle", fill: ink.text}, "step"),
  ];
  if (!timed.length) {
    parts.push(h("polyline", {key: "all", className: "series", fill: "none", stroke: ink.series, strokeWidth: 1.5,
      points: points([...all].sort((p, q) => p.t - q.t))}));
  }
  for (const {a, pts} of lines) {
    parts.push(h("polyline", {key: `s${a.number}`, className: "series", "data-attempt": a.number, fill: "none",
      stroke: ink.series, strokeWidth: 1.5, points: points(pts)}));
    pts.slice(1).forEach((c, i) => parts.push(h("circle", {key: `p${a.number}-${i}`, className: "point", cx: x(c.t), cy: y(c.step), r: 2.5, fill: ink.series})));
    if (a.number > 1) {
      const [cx, cy] = [x(a.started_at), y(a.resume_step ?? 0)];
      parts.push(h("path", {key: `r${a.number}`, className: "marker resume", "data-attempt": a.number, fill: ink.resume,
        d: `M${cx},${cy - 7} l6,11 h-12 z`},
      h("title", null, `attempt ${a.number} resumed from step ${a.resume_step ?? 0} at ${clock(a.started_at)}`)));
    }
    if (a.ended_at != null && a.kind !== "succeeded") {
      const end = pts[pts.length - 1], [cx, cy] = [x(end.t), y(end.step)];
      const culprit = a.culprits && a.culprits.length ? ` (culprit ${a.culprits.join(", ")})` : "";
      parts.push(h("path", {key: `c${a.number}`, className: "marker crash", "data-attempt": a.number, fill: "none",
        stroke: ink.crash, strokeWidth: 2.5, d: `M${cx - 5},${cy - 5} l10,10 m0,-10 l-10,10`},
      h("title", null, `attempt ${a.number} ended at ${clock(a.ended_at)}: ${a.kind}: ${a.ended ?? ""}${culprit}`)));
    }
  }
  return h(C.Box, {id: "plot", mt: 2},
    h("svg", {id: "progress-plot", width: W, height: HT, viewBox: `0 0 ${W} ${HT}`, role: "img", "aria-label": "step against time",
      style: {font: "11px var(--chakra-fonts-body)", border: "1px solid var(--chakra-colors-border)", borderRadius: 4}}, parts),
    progress.checkpoints_unread ? h(C.Text, {color: "fg.muted", fontSize: "sm"}, `${progress.checkpoints_unread} older checkpoints not plotted`) : null);
}

function Checkpoints({checkpoints}) {
  const c = checkpoints;
  const latest = c.error ? h(C.Text, {as: "span", color: "fg.error"}, c.error)
    : c.checkpoint ? ["Latest verified: ", h("b", {key: "u"}, c.checkpoint.uri), ` (step ${c.checkpoint.step})`]
      : c.run_uri ? `No verified checkpoint under ${c.run_uri} yet` : "The run has no run path yet";
  return [
    h(C.Text, {key: "latest", id: "latest"}, latest),
    (c.skipped || []).length > 0 && h(C.Table.Root, {key: "skipped", id: "skipped", size: "sm", mt: 2},
      h(C.Table.Header, null, h(C.Table.Row, null,
        ...["Skipped (newer)", "Step", "Reasons"].map((t) => h(C.Table.ColumnHeader, {key: t}, t)))),
      h(C.Table.Body, null, c.skipped.map((s) => h(C.Table.Row, {key: s.uri},
        h(C.Table.Cell, null, s.uri), h(C.Table.Cell, null, s.step),
        h(C.Table.Cell, {color: "fg.error"}, (s.reasons || []).join("; ")))))),
  ];
}

// The inference the run borrows from, now (Ready replicas of the primary and of its overflow pool), and
// what the claim could and could not move to an overflow pool, how many waves brought it back.
function Inference({path, claimed, given, refresh}) {
  const [view, reload] = useApi(`${path}/inference`);
  React.useEffect(() => { reload(); }, [refresh, reload]);
  const rows = (view.data || {}).workloads || [];
  const of = (ready, wanted) => (wanted == null ? "n/a" : `${ready}/${wanted}`);
  const notes = [
    ...Object.entries((claimed || {}).offloaded || {}).map(([w, n]) => `${w}: ${n} replica(s) moved to its overflow pool first`),
    ...Object.entries((claimed || {}).not_offloaded || {}).map(([w, why]) => `${w}: not offloaded: ${why}`),
    ...((given || {}).waves ? [`Returned in ${given.waves} wave(s); overflow emptied: ${(given.overflow_removed || []).join(", ") || "none"}`] : []),
  ];
  return [
    h(ErrorText, {key: "error", error: view.error}),
    h(C.Table.Root, {key: "table", id: "inference", size: "sm", mt: 2},
      h(C.Table.Header, null, h(C.Table.Row, null,
        ...["Workload", "Ready (primary)", "Ready (overflow pool)", "Replicas lent", "In the overflow pool"].map((t) => h(C.Table.ColumnHeader, {key: t}, t)))),
      h(C.Table.Body, null, rows.length ? rows.map((w) => h(C.Table.Row, {key: w.workload},
        h(C.Table.Cell, null, w.workload), h(C.Table.Cell, null, of(w.primary_ready, w.primary_replicas)),
        h(C.Table.Cell, null, of(w.overflow_ready, w.overflow_replicas)), h(C.Table.Cell, null, w.lent), h(C.Table.Cell, null, w.offloaded)))
        : h(C.Table.Row, null, h(C.Table.Cell, {colSpan: 5, color: "fg.muted"}, view.loading ? "…" : "none borrowed now")))),
    notes.length > 0 && h(C.Text, {key: "notes", id: "offload", mt: 2, fontSize: "sm", whiteSpace: "pre-wrap"}, notes.join("\n")),
  ];
}

// where the claimed nodes sit in the fabric: the domains of each topology level, the spares, what was asked
function placementText(p) {
  if (!p) return "";
  const levels = Object.entries(p.domains || {}).map(([level, names]) => `${level.split("/").pop()}: ${names.join(", ")}`);
  const asked = p.topology && p.topology.mode !== "none" ? ` (${p.topology.mode} ${p.topology.level})` : "";
  return `Placement${asked}: ${levels.join("; ") || "no topology labels"}` +
    (p.spares && p.spares.length ? `; spares ${p.spares.join(", ")}` : "") + ".";
}

function returnedText(r) {
  return `You returned ${r.node_names.length ? r.node_names.join(", ") : "nothing (the run held no nodes)"}` +
    ` (${r.gpus_returned} GPUs; ${quota(r)})` + (r.quarantined.length ? `; still quarantined: ${r.quarantined.join(", ")}` : "") +
    (r.workloads_restored.length ? `; inference restored: ${r.workloads_restored.join(", ")}` : "");
}

function TrainingRun({dagId, runId}) {
  const zone = useTimezone();
  const path = `runs/${encodeURIComponent(dagId)}/${encodeURIComponent(runId)}`;
  const [view, reload] = useApi(path);
  const [asking, setAsking] = useState(false);
  const [returned, setReturned] = useState(null);
  const [actionError, setActionError] = useState(null);
  const run = `${dagId}/${runId}`;
  const d = view.data;

  async function giveBack(typed) {
    setAsking(false);
    const answer = await post(`${path}/return`, {confirm: typed});
    setActionError(answer.error || null);
    if (answer.data) { setReturned(answer.data); reload(); }
  }

  if (!d) return h(C.Box, {p: 2}, h(ErrorText, {error: view.error}), view.loading && h(C.Spinner, {size: "sm"}));
  const train = d.tasks.train || {};
  const times = Object.fromEntries(d.progress.attempts.map((a) => [a.number, a]));
  const excluded = Object.entries(d.ledger.excluded || {});
  const progressErrors = Object.entries(d.progress.errors).filter(([, why]) => why);
  const claimed = d.capacity.claimed, given = d.capacity.returned;
  return h(C.Box, {p: 2},
    h(ErrorText, {error: actionError || (d.ledger.error ? {status: "ledger", detail: d.ledger.error} : null)}),
    h(C.HStack, {id: "summary", gap: 2, wrap: "wrap"},
      h(C.Badge, {colorPalette: d.state, size: "lg"}, `run ${d.state}`),
      h(C.Badge, {colorPalette: train.state || "gray", size: "lg"}, `train ${train.state ?? "not started"} (try ${train.try_number ?? 0})`),
      h(C.Badge, {variant: "outline", size: "lg"}, `${(d.ledger.attempts || []).length} attempt(s), ${d.ledger.preemptions ?? 0} preemption(s)`)),
    h(Section, {title: "Attempts"},
      h(Attempts, {ledger: d.ledger, times, zone}),
      excluded.length > 0 && h(C.Text, {id: "excluded", mt: 2},
        "Nodes kept out (culprits): ", excluded.map(([n, why]) => `${n}: ${why}`).join("; "))),
    h(Section, {title: "Progress"},
      h(Heartbeat, {progress: d.progress, zone}),
      h(Interval, {progress: d.progress}),
      h(Plot, {progress: d.progress, zone}),
      progressErrors.length > 0 && h(C.Text, {id: "progress-errors", color: "fg.error", whiteSpace: "pre-wrap"},
        progressErrors.map(([part, why]) => `${part}: ${why}`).join("\n"))),
    h(Section, {title: "Checkpoints"}, h(Checkpoints, {checkpoints: d.checkpoints})),
    h(Section, {title: "Capacity"},
      h(C.Text, {id: "capacity"},
        (claimed ? `Claimed: ${(claimed.node_names || []).join(", ")}. ` : "Nothing claimed yet. ") +
        (given ? `Returned: ${(given.node_names || []).join(", ")} (${given.gpus_returned} GPUs; ${quota(given)}).` : "Not returned yet.")),
      h(C.Button, {id: "return", mt: 2, size: "sm", variant: "outline", colorPalette: "red", onClick: () => setAsking(true)},
        "Return this run's GPUs…"),
      d.placement && h(C.Text, {id: "placement", mt: 1, fontSize: "sm"}, placementText(d.placement)),
      returned && h(C.Text, {id: "returned", mt: 2}, returnedText(returned))),
    h(Section, {title: "Inference it borrows from"}, h(Inference, {path, claimed, given, refresh: view.data})),
    h(ConfirmDialog, {open: asking, expected: run, action: "Return the GPUs", title: "Return this run's GPUs",
      message: `Return every GPU node and inference loan of ${run}? Type ${run} to confirm.`,
      onConfirm: giveBack, onClose: () => setAsking(false)}));
}

globalThis["Training run"] = TrainingRun;
globalThis.AirflowPlugin = TrainingRun;
export default TrainingRun;
