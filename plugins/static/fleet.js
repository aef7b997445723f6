// The GPU fleet, a page of the Airflow UI (Browse > GPU fleet): every GPU node's status read against its
// mode (an inference node busy serving is "serving", not a warning), what needs a person first, its GPU
// model and pool, the run that holds it, its findings grouped by policy row, its tensor-core activity.
import {C, ConfirmDialog, ErrorText, React, UiLink, ago, dagRunPath, formatTime, h, post, runViewPath, useApi, useTimezone} from "./common.js";

const {useMemo, useState} = React;
const PAGE = 50;
// Airflow's own state colours: healthy nodes look like successful work, what needs a person like failures.
const STATUS = {
  serving: {palette: "success", label: "serving"},
  training: {palette: "running", label: "training"},
  idle: {palette: "gray", label: "idle"},
  warn: {palette: "up_for_retry", label: "warning"},
  excluded: {palette: "upstream_failed", label: "excluded"},
  failing: {palette: "failed", label: "failing"},
  quarantined: {palette: "failed", label: "quarantined"},
  unknown: {palette: "gray", label: "no report"},
};
const COLUMNS = [
  ["name", "Node"], ["domain", "Block / rack"], ["status", "Status"], ["mode", "Mode"], ["gpu_model", "GPU model"], ["pool", "Pool"],
  ["gpus", "GPUs"], ["claimed_by", "Run"], ["findings", "Findings"], ["quarantine", "Quarantine"],
  ["tensor_active", "Tensor active"], ["reported_at", "Reported"],
];

// "gpu 0-7" for gpu 0, gpu 1, ..., gpu 7: one line per finding, never one per GPU.
export function targetsText(targets) {
  const byKind = new Map();
  for (const t of targets) {
    const m = /^(.*) (\d+)$/.exec(t);
    const [kind, n] = m ? [m[1], Number(m[2])] : [t, null];
    if (!byKind.has(kind)) byKind.set(kind, []);
    if (n !== null) byKind.get(kind).push(n);
  }
  return [...byKind].map(([kind, ns]) => {
    if (!ns.length) return kind;
    ns.sort((a, b) => a - b);
    const runs = [];
    for (const n of ns) {
      const last = runs[runs.length - 1];
      if (last && n === last[1] + 1) last[1] = n; else runs.push([n, n]);
    }
    return `${kind} ${runs.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(", ")}`;
  }).join("; ");
}

// A finding the node's mode explains, in a word: what the GPUs are busy with. The policy's own words
// ("processes on the GPU (drained later)") are the gate's; they stay in the tooltip.
const WORK = {gpu_in_use: "in use", tensor_busy: "tensor cores busy"};
const where = (f) => (f.targets.length ? ` (${targetsText(f.targets)})` : "");

function Findings({node}) {
  if (!node.findings.length) return null;
  return h(C.Stack, {gap: 0.5}, node.findings.map((f, i) => (f.expected
    ? h(C.Text, {key: i, fontSize: "sm", color: "fg.muted", className: "expected", title: `${f.text}: expected of a node in ${node.mode} mode`},
      `${f.rows.map((r) => WORK[r] || r).join(", ")}${where(f)}`)
    : h(C.Text, {key: i, fontSize: "sm", className: "attention"}, `${f.text}${where(f)}`))));
}

function Run({run}) {
  if (!run) return null;
  const [dagId, ...rest] = run.split("/");
  const runId = rest.join("/");
  return h(C.Stack, {gap: 0},
    h(UiLink, {to: dagRunPath(dagId, runId), fontSize: "sm", title: "the DAG run in Airflow"}, run),
    h(UiLink, {to: runViewPath(dagId, runId), fontSize: "xs", className: "run-view"}, "Training run"));
}

// where the node sits in the fabric: its topology levels above the node ("block-a / rack-2")
const domainText = (n) => (n.domain || []).map((v) => v ?? "?").join(" / ");

function sortValue(n, key, activity) {
  if (key === "domain") return `${domainText(n)}\u0000${n.name}`;
  if (key === "status") return `${n.attention ? 0 : 1}${n.status}`;
  if (key === "quarantine") return n.quarantine ? n.quarantine.reason : "";
  if (key === "findings") return n.findings.map((f) => f.text).join("; ");
  if (key === "tensor_active") return activity[n.name] ?? -1;
  return n[key] ?? "";
}

function Counts({counts}) {
  const attention = counts.attention;
  return h(C.HStack, {id: "counts", wrap: "wrap", gap: 2, my: 3},
    h(C.Badge, {size: "lg", colorPalette: attention ? "failed" : "success", "data-attention": attention},
      attention ? `${attention} need${attention === 1 ? "s" : ""} attention` : "nothing needs attention"),
    h(C.Badge, {size: "lg", variant: "outline"}, `${counts.total} nodes`),
    ...Object.entries(counts.status).sort().map(([status, n]) =>
      h(C.Badge, {key: status, size: "lg", variant: "subtle", colorPalette: (STATUS[status] || STATUS.unknown).palette},
        `${(STATUS[status] || {label: status}).label} ${n}`)),
    h(C.Badge, {size: "lg", variant: "outline"}, `claimed by runs ${counts.claimed}`));
}

// nodes by block (the widest topology level): how many are free for a run in each
function Blocks({blocks}) {
  return h(C.HStack, {id: "blocks", wrap: "wrap", gap: 2, mb: 2},
    ...Object.entries(blocks || {}).map(([name, b]) => h(C.Badge, {key: name, size: "md", variant: "outline"},
      `${name}: ${b.total} nodes, ${b.free} free, ${b.claimed} claimed, ${b.quarantined} quarantined`)));
}

function NodeRow({node, activity, zone, onRelease}) {
  const status = STATUS[node.status] || STATUS.unknown;
  const q = node.quarantine;
  const tensor = activity[node.name];
  return h(C.Table.Row, {"data-node": node.name, "data-status": node.status},
    h(C.Table.Cell, {whiteSpace: "nowrap", fontWeight: "medium"}, node.name),
    h(C.Table.Cell, {whiteSpace: "nowrap", fontSize: "sm", className: "domain"}, domainText(node)),
    h(C.Table.Cell, null, h(C.Badge, {colorPalette: status.palette, className: "status"}, status.label)),
    h(C.Table.Cell, null, node.mode),
    h(C.Table.Cell, {fontSize: "sm"}, node.gpu_model || h(C.Text, {as: "span", color: "fg.muted"}, "unknown")),
    h(C.Table.Cell, null, node.pool),
    h(C.Table.Cell, {textAlign: "end"}, node.gpus),
    h(C.Table.Cell, null, h(Run, {run: node.claimed_by})),
    h(C.Table.Cell, {className: "findings"}, h(Findings, {node})),
    h(C.Table.Cell, {className: "quarantine"}, q && h(C.Stack, {gap: 0},
      h(C.Text, {color: "fg.error", fontSize: "sm"}, q.reason),
      q.since && h(C.Text, {color: "fg.muted", fontSize: "xs"}, `since ${formatTime(q.since, zone)}`))),
    h(C.Table.Cell, {className: "tensor", textAlign: "end"},
      tensor == null ? h(C.Text, {as: "span", color: "fg.muted"}, "n/a") : `${(tensor * 100).toFixed(0)}%`),
    h(C.Table.Cell, {whiteSpace: "nowrap", fontSize: "sm", title: node.reported_at ? formatTime(node.reported_at, zone) : ""},
      node.reported_at ? ago(node.reported_at) : ""),
    h(C.Table.Cell, null, q && h(C.Button, {size: "xs", variant: "outline", className: "release", "data-node": node.name,
      onClick: () => onRelease(node.name)}, "Release…")));
}

function Fleet() {
  const zone = useTimezone();
  const [fleet, reload] = useApi("fleet");
  const [tensors] = useApi("fleet/tensor-activity");
  const [words, setWords] = useState("");
  const [sort, setSort] = useState({key: "status", dir: 1});
  const [page, setPage] = useState(0);
  const [releasing, setReleasing] = useState(null);
  const [actionError, setActionError] = useState(null);
  const activity = tensors.data?.nodes || {};
  const rows = useMemo(() => (fleet.data?.nodes || []).map((n) => ({
    ...n, text: [n.name, domainText(n), n.mode, n.status, n.health, n.gpu_model, n.pool, n.claimed_by, n.quarantine?.reason, ...n.reasons]
      .join(" ").toLowerCase(),
  })), [fleet.data]);
  const shown = useMemo(() => {
    const terms = words.toLowerCase().split(/\s+/).filter(Boolean);
    const kept = rows.filter((n) => terms.every((w) => n.text.includes(w)));
    return kept.sort((a, b) => {
      const x = sortValue(a, sort.key, activity), y = sortValue(b, sort.key, activity);
      return (x < y ? -1 : x > y ? 1 : a.name < b.name ? -1 : 1) * sort.dir;
    });
  }, [rows, words, sort, activity]);
  const pages = Math.max(1, Math.ceil(shown.length / PAGE));
  const current = Math.min(page, pages - 1);
  const note = tensors.data && (!tensors.data.configured
    ? "Tensor-core activity: n/a (no Prometheus: set [trainops] prometheus_conn_id to a trainops_prometheus connection)"
    : tensors.data.error ? `Tensor-core activity: n/a (${tensors.data.error})` : "");

  async function release(typed) {
    const node = releasing;
    setReleasing(null);
    const answer = await post(`nodes/${encodeURIComponent(node)}/release`, {confirm: typed});
    setActionError(answer.error || null);
    if (!answer.error) reload();
  }

  return h(C.Box, {p: 2},
    h(C.Heading, {size: "lg", mb: 1}, "GPU fleet"),
    h(C.Text, {color: "fg.muted", fontSize: "sm"},
      "Every GPU node as its probe reports it, read against its mode: busy GPUs are a node doing its job. " +
      "What needs a person comes first."),
    h(ErrorText, {error: fleet.error || actionError}),
    fleet.data && h(Counts, {counts: fleet.data.counts}),
    fleet.data && h(Blocks, {blocks: fleet.data.blocks}),
    h(C.HStack, {my: 2, gap: 3},
      h(C.Input, {id: "filter", type: "search", maxW: "md", size: "sm", value: words, "aria-label": "filter",
        placeholder: "filter: node, status, model, pool, reason, run...",
        onChange: (e) => { setWords(e.target.value); setPage(0); }}),
      h(C.Text, {id: "shown", color: "fg.muted", fontSize: "sm"}, `${shown.length} of ${rows.length} nodes`)),
    h(C.Text, {id: "notes", color: "fg.muted", fontSize: "sm"}, note || ""),
    h(C.Table.Root, {id: "fleet", size: "sm", striped: true, interactive: true, stickyHeader: true},
      h(C.Table.Header, null, h(C.Table.Row, null,
        ...COLUMNS.map(([key, label]) => h(C.Table.ColumnHeader, {key, "data-key": key, cursor: "pointer", userSelect: "none",
          onClick: () => { setSort({key, dir: key === sort.key ? -sort.dir : 1}); setPage(0); }},
          label + (key === sort.key ? (sort.dir > 0 ? " ↑" : " ↓") : ""))),
        h(C.Table.ColumnHeader, {key: "action"}, ""))),
      h(C.Table.Body, null, shown.slice(current * PAGE, (current + 1) * PAGE).map((node) =>
        h(NodeRow, {key: node.name, node, activity, zone, onRelease: setReleasing})))),
    pages > 1 && h(C.HStack, {mt: 2, gap: 2},
      h(C.Button, {size: "xs", variant: "outline", disabled: current === 0, onClick: () => setPage(current - 1)}, "Previous"),
      h(C.Text, {fontSize: "sm"}, `page ${current + 1} of ${pages}`),
      h(C.Button, {size: "xs", variant: "outline", disabled: current >= pages - 1, onClick: () => setPage(current + 1)}, "Next")),
    h(ConfirmDialog, {open: releasing !== null, expected: releasing || "", action: "Release",
      title: `Release ${releasing} from quarantine`,
      message: `Re-check ${releasing} and release it from quarantine if it passes? Type the node name to confirm.`,
      onConfirm: release, onClose: () => setReleasing(null)}));
}

globalThis["GPU fleet"] = Fleet;
globalThis.AirflowPlugin = Fleet;
export default Fleet;
