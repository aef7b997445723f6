"""Why an attempt failed, from what the cluster shows: infrastructure, user code, or unknown.

The evidence is plain API data (the Job's pods, their nodes, the tail of each failed pod's log,
and optionally each node's health verdict), so the rules are testable without a cluster.
A node is blamed only on evidence from the node side; what the user's container printed (an
"Xid 13", "CUDA error: an illegal memory access", an NCCL timeout) is a *hint*, recorded with the
attempt and never enough to quarantine: a kernel bug in the user's code prints the same lines.

Rules, in order:
1. Node-side evidence (the node not Ready or gone, GPUs its device plugin took out of allocatable,
   a ``GPUHealthy=False`` condition published by the node probe, a health verdict that says
   quarantine) makes it an infrastructure failure and blames that node (it gets quarantined).
2. The kubelet's or the control plane's word that the pod was taken away (node lost, evicted,
   disrupted, killed by SIGTERM/SIGKILL from outside) is infrastructure too, blaming nobody.
3. Otherwise a failed container with a non-zero exit code is the user's code (exit 1, a
   segfault, an abort, OOMKilled, a GPU error that the node does not confirm), with any hints.
4. A failed attempt with no failed container to look at is infrastructure, reason unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from trainops.conventions import GPU_HEALTHY_CONDITION, GPU_RESOURCE, HEALTH_LABEL, HEALTH_QUARANTINED
from trainops.kube.nodes import gpus, unhealthy_gpus


class FailureKind(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    USER_CODE = "user_code"
    HANG = "hang"
    HEARTBEAT_UNREADABLE = "heartbeat_unreadable"
    START_TIMEOUT = "start_timeout"
    ADMISSION_TIMEOUT = "admission_timeout"
    PODS_REFUSED = (
        "pods_refused"  # the API refuses its pods: no resume helps until the spec or policy changes
    )
    NEVER_ADMITTED = (
        "never_admitted"  # Kueue answered that its queue can never admit the request as it stands
    )
    STOPPED = "stopped"
    KUEUE_DEACTIVATED = "kueue_deactivated"  # Kueue gave up on it (requeuing limit, maximum execution time)


RETRYABLE = frozenset(
    {
        FailureKind.INFRASTRUCTURE,
        FailureKind.HANG,
        FailureKind.HEARTBEAT_UNREADABLE,
        FailureKind.START_TIMEOUT,
    }
)

# XID in kernel/driver lines ("NVRM: Xid (PCI:0000:3b:00): 79, ...") and in plain "Xid 79" forms.
_XID = re.compile(r"\bXid\b(?:\s*\([^)]*\))?[:\s]+(\d+)", re.IGNORECASE)
_GPU_FATAL = re.compile(
    r"uncorrectable ECC error|GPU has fallen off the bus|CUDA error: (?:an illegal memory access|"
    r"unspecified launch failure|uncorrectable ECC)|NVLink (?:error|fatal)",
    re.IGNORECASE,
)
# "NCCL error" as PyTorch prints it ("DistBackendError: NCCL error in: ...") and NCCL's own InfiniBand
# transport warnings ("NCCL WARN NET/IB : Got completion ... IBV_WC_RETRY_EXC_ERR"): a fabric fault the
# node probe confirms a round later, so they must start the wait for the nodes' evidence too.
_NCCL = re.compile(
    r"Watchdog caught collective operation timeout|NCCL[^\n]*(?:timeout|timed out)|ncclSystemError|"
    r"ncclRemoteError|ncclInternalError|NCCL communicator was aborted|NCCL error|NET/IB\b",
    re.IGNORECASE,
)
# Killed from outside (node shutdown, kubelet, runtime); other signals (SEGV, ABRT, FPE) are the code's own.
_OUTSIDE_SIGNALS = {128 + 9: "SIGKILL", 128 + 15: "SIGTERM"}
_NODE_LOST_REASONS = {"NodeLost", "Evicted", "Terminated", "UnexpectedAdmissionError", "NodeShutdown"}
_DISRUPTION_INFRA = {
    "DeletionByTaintManager",
    "TerminationByKubelet",
    "DeletionByPodGC",
    "EvictionByEvictionAPI",
}


@dataclass
class Failure:
    """The verdict on one failed attempt.  ``culprits``: node -> evidence (to quarantine)."""

    kind: FailureKind
    reason: str
    culprits: dict[str, dict] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)  # what the user's logs say; never blames a node

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def to_dict(self) -> dict:
        return {
            "kind": str(self.kind),
            "reason": self.reason,
            "culprits": self.culprits,
            "evidence": self.evidence,
            "hints": self.hints,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Failure:
        return cls(
            FailureKind(data["kind"]),
            data["reason"],
            dict(data.get("culprits") or {}),
            list(data.get("evidence") or []),
            list(data.get("hints") or []),
        )


@dataclass(frozen=True)
class PodExit:
    """What one pod's trainer container shows: how it ended and where it ran."""

    pod: str
    node: str | None
    exit_code: int | None
    reason: str
    message: str
    finished_at: str
    pod_reason: str
    disruption: str
    deleted: bool = False

    @classmethod
    def of(cls, pod: Mapping, container: str | None = None) -> PodExit:
        status = pod.get("status") or {}
        statuses = status.get("containerStatuses") or []
        chosen = next(
            (s for s in statuses if container in (None, s.get("name"))), statuses[0] if statuses else {}
        )
        terminated = (
            ((chosen.get("state") or {}).get("terminated"))
            or ((chosen.get("lastState") or {}).get("terminated"))
            or {}
        )
        disruption = next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            ),
            {},
        )
        return cls(
            pod=pod["metadata"]["name"],
            node=(pod.get("spec") or {}).get("nodeName"),
            exit_code=terminated.get("exitCode"),
            reason=terminated.get("reason") or "",
            message=terminated.get("message") or "",
            finished_at=terminated.get("finishedAt") or "",
            pod_reason=status.get("reason") or "",
            disruption=disruption.get("reason") or "",
            deleted=bool(pod["metadata"].get("deletionTimestamp")),
        )

    def order(self) -> tuple:
        """Earliest first; on a tie, a pod that ended by itself before one that was being deleted."""
        return (self.finished_at or "~", self.deleted, self.exit_code in _OUTSIDE_SIGNALS)

    @property
    def failed(self) -> bool:
        return (self.exit_code not in (None, 0)) or bool(
            self.pod_reason in _NODE_LOST_REASONS or self.disruption
        )


def node_problems(node: Mapping | None) -> list[str]:
    """Node-level faults visible on the Node object: not Ready, GPUs unhealthy, already quarantined."""
    if node is None:
        return ["the node object is gone (node deleted or lost)"]
    problems = []
    if (lost := unhealthy_gpus(node)) > 0:
        problems.append(
            f"{lost} GPU(s) unhealthy: the device plugin took them out of allocatable "
            f"({GPU_RESOURCE} capacity {gpus(node, 'capacity')}, allocatable {gpus(node)})"
        )
    conditions = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is not None and ready.get("status") != "True":
        problems.append(
            f"node not Ready ({ready.get('status')}: {ready.get('reason') or ready.get('message') or '-'})"
        )
    gpu = conditions.get(GPU_HEALTHY_CONDITION)
    if gpu is not None and gpu.get("status") == "False":
        problems.append(f"{GPU_HEALTHY_CONDITION}=False: {gpu.get('message') or gpu.get('reason') or '-'}")
    if ((node.get("metadata") or {}).get("labels") or {}).get(HEALTH_LABEL) == HEALTH_QUARANTINED:
        problems.append("node already quarantined")
    return problems


def gpu_errors(text: str) -> list[str]:
    """GPU errors named in a log or termination message: XIDs and the CUDA/ECC/NVLink errors they cause."""
    found = [f"XID {code}" for code in dict.fromkeys(_XID.findall(text))]
    found += list(dict.fromkeys(m.group(0) for m in _GPU_FATAL.finditer(text)))
    return found


def log_hints(exits: list[PodExit], logs: Mapping[str, str]) -> list[str]:
    """What the failed pods' own output says about GPUs and NCCL, one line per pod and finding."""
    hints = []
    for e in exits:
        text = f"{e.message}\n{logs.get(e.pod, '')}"
        found = gpu_errors(text) + [m.group(0) for m in _NCCL.finditer(text)][:1]
        hints += [f"pod {e.pod} on {e.node} printed {item!r}" for item in found]
    return hints


def classify(
    pods: list[Mapping],
    nodes: Mapping[str, Mapping | None],
    logs: Mapping[str, str] | None = None,
    node_health: Mapping[str, list[str]] | None = None,
    *,
    container: str | None = None,
) -> Failure:
    """Classify a failed attempt.  ``nodes``: node name -> Node (None when gone); ``logs``: pod -> log
    tail; ``node_health``: node -> reasons a health check says to quarantine it."""
    logs = logs or {}
    exits = sorted((PodExit.of(p, container) for p in pods), key=PodExit.order)
    failed = [e for e in exits if e.failed]
    hints = log_hints(failed, logs)
    culprits: dict[str, dict] = {}
    for node in sorted({e.node for e in exits if e.node}):
        problems = node_problems(nodes.get(node)) + list((node_health or {}).get(node, []))
        if problems:
            culprits[node] = {"problems": problems}
    if culprits:
        summary = "; ".join(f"{n}: {', '.join(c['problems'])}" for n, c in sorted(culprits.items()))
        return Failure(FailureKind.INFRASTRUCTURE, f"node fault: {summary}", culprits, [], hints)
    # Once one pod fails the Job controller stops the others, so only the first failure tells why.
    evidence: list[str] = []
    for e in failed[:1]:
        if e.pod_reason in _NODE_LOST_REASONS:
            evidence.append(f"pod {e.pod} on {e.node}: {e.pod_reason}")
        if e.disruption in _DISRUPTION_INFRA:
            evidence.append(f"pod {e.pod} on {e.node}: disrupted ({e.disruption})")
        if e.exit_code in _OUTSIDE_SIGNALS and e.reason != "OOMKilled":
            evidence.append(
                f"pod {e.pod} on {e.node}: killed by {_OUTSIDE_SIGNALS[e.exit_code]} from outside"
            )
    if evidence:
        return Failure(FailureKind.INFRASTRUCTURE, evidence[0], {}, evidence, hints)
    first = failed[0] if failed else None
    if first is not None and first.exit_code not in (None, 0):
        detail = f" ({first.reason})" if first.reason and first.reason != "Error" else ""
        message = f": {first.message.strip()[:300]}" if first.message.strip() else ""
        return Failure(
            FailureKind.USER_CODE,
            f"pod {first.pod} on {first.node} exited with code {first.exit_code}{detail}{message}",
            {},
            [f"no infrastructure evidence on nodes {sorted({e.node for e in exits if e.node})}"],
            hints,
        )
    return Failure(
        FailureKind.INFRASTRUCTURE, "the attempt failed with no failed container to explain it", {}, [], hints
    )
