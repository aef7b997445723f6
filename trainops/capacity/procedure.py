"""Claim GPU nodes from inference for a training run, and give them back: the whole procedure.

``claim`` (setup): check every node is free, then per node one guarded patch that flips the mode
taint to training and records the claim; shrink the inference workloads that had pods there
(loans recorded on each object); evict what is left through the Eviction API; raise the training
ClusterQueue's GPU quota by the GPUs claimed.  ``give_back`` (teardown): lower the quota, release
every node the run holds (found by its annotation, not from memory), repay every loan of the run,
wait until inference is Ready.  Both are idempotent and write nothing when already done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from trainops.capacity import claims, inference
from trainops.capacity.claims import NodeQuarantined, NodesHeld, holder_of, is_quarantined, parse_run
from trainops.capacity.drain import drain, list_pods
from trainops.capacity.inference import DEPLOYMENT, INFERENCE_SERVICE, WorkloadRef
from trainops.capacity.loans import get_path
from trainops.capacity.quota import grants_of, set_grant
from trainops.capacity.ranking import least_disruptive
from trainops.conventions import GPU_RESOURCE, MODE_TAINT
from trainops.errors import TemporaryError
from trainops.kube.client import Kube
from trainops.kube.nodes import NodeState, allocatable_gpus, edit_node, list_nodes
from trainops.kube.retry import Deadline, DeadlineExceeded, call

module_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deadlines:
    """Seconds allowed for: each API step (retries of 409/429/5xx), the drain, inference Ready again,
    and a drain that cannot progress (evicted pods unschedulable, the rest held by their budgets)."""

    api_s: float = 120.0
    drain_s: float = 600.0
    ready_s: float = 600.0
    drain_stall_s: float = 30.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"deadline {name} must be > 0 seconds, got {value!r}")


class ReturnIncomplete(TemporaryError):
    """The return finished every step it could; these failed (the message names each)."""


@dataclass
class ClaimSummary:
    run: str
    node_names: list[str]
    gpus: int
    newly_claimed: list[str] = field(default_factory=list)
    workloads_shrunk: list[str] = field(default_factory=list)
    evictions: int = 0
    cluster_queue: str = ""


@dataclass
class ReturnSummary:
    run: str
    node_names: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    workloads_restored: list[str] = field(default_factory=list)
    gpus_returned: int = 0  # allocatable GPUs of the nodes given back to inference
    quota_returned: int = 0  # GPUs of ClusterQueue quota the run held and gave back
    cluster_queue: str = ""

    def describe(self) -> str:
        """One line for a log or a terminal: what was given back, and what was not there to give."""
        nodes = (
            f"{len(self.node_names)} node(s) with {self.gpus_returned} GPUs back to inference"
            if self.node_names
            else "no node (it held none)"
        )
        quota = (
            f"{self.quota_returned} GPUs of ClusterQueue {self.cluster_queue} quota taken back"
            if self.quota_returned
            else f"no quota on ClusterQueue {self.cluster_queue} (none was granted)"
        )
        return (
            f"returned {self.run}: {nodes}; {quota}; inference restored: "
            f"{', '.join(self.workloads_restored) or 'none'}; still quarantined: {', '.join(self.quarantined) or 'none'}"
        )


def _check_node_names(names: Sequence[str]) -> list[str]:
    if isinstance(names, str) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"node_names must be a non-empty list of node names, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(
            f"node_names lists a node more than once: {sorted(n for n in set(names) if names.count(n) > 1)}"
        )
    return list(names)


def claim(
    kube: Kube,
    run: str,
    node_names: Sequence[str],
    *,
    count: int | None = None,
    cluster_queue: str,
    gpus_per_node: int | None = None,
    deployments: Sequence[str] = (),
    inference_services: Sequence[str] = (),
    gpu_flavor: str | None = None,
    deadlines: Deadlines = Deadlines(),
    log: logging.Logger = module_log,
) -> ClaimSummary:
    """Claim ``node_names`` for ``run`` (``<dag_id>/<run_id>``); see the module docstring.

    ``count``: claim only this many of ``node_names``, the least disruptive first (see
    ``ranking.least_disruptive``); default: all of them.  ``gpus_per_node``: GPUs each node adds to
    the quota (default: the node's allocatable ``nvidia.com/gpu``).  ``deployments``/``inference_services``: ``namespace/name`` of the inference
    workloads to shrink.  Raises ``NodesHeld`` (nothing changed) when another run holds a node.
    """
    parse_run(run)
    candidates = _check_node_names(node_names)
    if gpus_per_node is not None and (not isinstance(gpus_per_node, int) or gpus_per_node < 1):
        raise ValueError(f"gpus_per_node must be a positive integer or None, got {gpus_per_node!r}")
    refs = [WorkloadRef.parse(DEPLOYMENT, d, "inference_deployments") for d in deployments]
    refs += [WorkloadRef.parse(INFERENCE_SERVICE, s, "inference_services") for s in inference_services]

    step = Deadline(deadlines.api_s)
    by_name = {n["metadata"]["name"]: n for n in call(lambda: list_nodes(kube.core), step, "list nodes")}
    missing = [n for n in candidates if n not in by_name]
    if missing:
        raise ValueError(f"node_names: not in the cluster: {missing}")
    holders = {n: holder_of(by_name[n]["metadata"].get("annotations")) for n in candidates}
    others = {n for n, holder in holders.items() if holder not in (None, run)}
    # one pod list serves the ranking and the inference shrink (the drain follows the pods itself)
    pods = list_pods(kube.core, step) if count is not None or refs else []
    nodes = candidates if count is None else _choose(candidates, holders, run, pods, count, others)
    states = {n: NodeState.of(by_name[n]) for n in nodes}
    held = {n: holders[n] for n in nodes if n in others}
    if held:
        raise NodesHeld(held)
    quarantined = [n for n, s in states.items() if is_quarantined(s) and holder_of(s.annotations) != run]
    if quarantined:
        raise NodeQuarantined(", ".join(quarantined))

    summary = ClaimSummary(run, nodes, 0, cluster_queue=cluster_queue)
    change = claims.claim(run, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    for name in sorted(nodes):  # one global order: of two overlapping claims, the first to a node wins all
        # NodesHeld from the change: another run won the race for this node after the check above
        edited = edit_node(kube.core, name, change, Deadline(deadlines.api_s), current=by_name[name])
        gpus = gpus_per_node or allocatable_gpus(edited.object)
        summary.gpus += gpus
        if edited.wrote:
            summary.newly_claimed.append(name)
            prior = states[name].taint(MODE_TAINT)
            log.info(
                "node %s: claimed, mode %s -> training (%d GPUs)", name, prior and prior.get("value"), gpus
            )
        else:
            log.info("node %s: already claimed by this run", name)

    summary.workloads_shrunk = _shrink_inference(kube, run, set(nodes), refs, pods, deadlines, log)
    summary.evictions = drain(kube.core, set(nodes), Deadline(deadlines.drain_s), deadlines.drain_stall_s)
    log.info("drained %d node(s): %d pod(s) evicted", len(nodes), summary.evictions)
    if set_grant(kube.custom, cluster_queue, run, summary.gpus, Deadline(deadlines.api_s), gpu_flavor).wrote:
        log.info("ClusterQueue %s: %s quota of this run set to %d", cluster_queue, GPU_RESOURCE, summary.gpus)
    return summary


def _choose(
    candidates: list[str], holders: dict, run: str, pods: list[dict], count: int, others: set[str]
) -> list[str]:
    """``count`` nodes: those ``run`` already holds first (a retried claim finishes the same claim),
    then the least disruptive of the rest."""
    mine = [n for n in candidates if holders[n] == run][:count]
    if len(mine) == count:
        return mine
    rest = [n for n in candidates if n not in mine]
    return mine + least_disruptive(rest, pods, count - len(mine), held=others)


def _shrink_inference(
    kube: Kube,
    run: str,
    nodes: set[str],
    refs: list[WorkloadRef],
    pods: list[dict],
    deadlines: Deadlines,
    log: logging.Logger,
) -> list[str]:
    """Lend the capacity of every workload that has pods on ``nodes`` (a loan is recorded even when
    nothing is scaled down, so the return waits for the workload to be Ready); returns what was shrunk."""
    if not refs:
        return []
    step = Deadline(deadlines.api_s)
    pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    shrunk = []
    for ref in refs:
        obj = call(lambda ref=ref: ref.get(kube.custom), step, f"read {ref}")
        selector = inference.pod_selector(ref.kind, obj)
        mine = [
            p
            for p in pods
            if p["metadata"]["namespace"] == ref.namespace
            and inference.selector_matches(selector, p["metadata"].get("labels") or {})
        ]
        displaced = sum(1 for p in mine if (p.get("spec") or {}).get("nodeName") in nodes)
        if not displaced:
            log.info("%s: no pods on the claimed nodes, left as is", ref)
            continue
        pdbs = call(
            lambda ref=ref: kube.custom.list_namespaced_custom_object(
                "policy", "v1", ref.namespace, "poddisruptionbudgets"
            ),
            step,
            f"list PodDisruptionBudgets in {ref.namespace}",
        )["items"]
        target, target_obj, pod_labels = ref, obj, selector.get("matchLabels") or {}
        if ref.kind is DEPLOYMENT:
            pod_labels = obj["spec"]["template"]["metadata"].get("labels") or {}
            hpa = inference.hpa_for(kube.custom, ref, step)
            if hpa:
                target, target_obj = hpa
        expected = obj["spec"].get("replicas", len(mine)) if ref.kind is DEPLOYMENT else len(mine)
        floor = inference.pdb_floor(pdbs, pod_labels, expected)
        fields = inference.shrink_fields(target.kind, target_obj, len(mine), displaced, floor)
        inference.lend(kube.custom, target, run, fields, Deadline(deadlines.api_s), target_obj)
        changes = ", ".join(
            f"{'.'.join(path)}={value}"
            for path, value in fields.items()
            if value != get_path(target_obj, path)
        )
        how = f"scaled down: {changes}" if changes else "kept as is; its pods move by eviction"
        log.info("%s: %d pod(s) on claimed nodes, PDB floor %d; %s", target, displaced, floor, how)
        if changes:
            shrunk.append(str(target))
    return shrunk


def give_back(
    kube: Kube,
    run: str,
    *,
    cluster_queue: str,
    training_namespace: str | None = None,
    deadlines: Deadlines = Deadlines(),
    log: logging.Logger = module_log,
) -> ReturnSummary:
    """Return everything ``run`` holds (see the module docstring); works from the cluster's records
    alone.  Every step is tried; ``ReturnIncomplete`` names the ones that failed.

    With ``training_namespace``, the run's training Jobs there are stopped first and their pods
    gone before anything is returned (a run failed by hand, reaped or returned from the CLI or the
    UI may still be training); if they cannot be stopped nothing is returned."""
    parse_run(run)
    summary = ReturnSummary(run, cluster_queue=cluster_queue)
    failures: list[str] = []
    if training_namespace:
        from trainops.training.cluster import GangCluster

        try:
            for stopped in GangCluster(kube).stop_run(training_namespace, run, Deadline(deadlines.ready_s)):
                log.info("stopped the run's training before returning its capacity: %s", stopped)
        except Exception as error:
            raise ReturnIncomplete(
                f"return of run {run} not started: its training in namespace {training_namespace} "
                f"could not be stopped ({error}); its nodes stay claimed until it is"
            ) from error

    try:
        taken = set_grant(kube.custom, cluster_queue, run, 0, Deadline(deadlines.api_s))
        summary.quota_returned = grants_of(taken.before).get(run, {}).get("gpus", 0)
        if taken.wrote:
            log.info("ClusterQueue %s: %s quota of this run taken back", cluster_queue, GPU_RESOURCE)
    except Exception as error:  # the nodes must still be returned
        failures.append(f"ClusterQueue {cluster_queue}: {error}")

    step = Deadline(deadlines.api_s)
    for node in call(lambda: list_nodes(kube.core), step, "list nodes"):
        name = node["metadata"]["name"]
        if holder_of(node["metadata"].get("annotations")) != run:
            continue
        try:
            edited = edit_node(kube.core, name, claims.release(run), Deadline(deadlines.api_s), current=node)
        except Exception as error:  # return the other nodes
            failures.append(f"node {name}: {error}")
            continue
        summary.node_names.append(name)
        summary.gpus_returned += allocatable_gpus(edited.object)
        if is_quarantined(NodeState.of(edited.object)):
            summary.quarantined.append(name)
            log.warning("node %s: returned to inference mode but stays quarantined", name)
        else:
            log.info("node %s: returned to inference", name)

    repaid = []
    for ref, obj in inference.find_loans(kube.custom, run, step):
        try:
            inference.repay(kube.custom, ref, run, Deadline(deadlines.api_s), obj)
        except Exception as error:  # repay the others
            failures.append(f"{ref}: {error}")
            continue
        log.info("%s: capacity lent to this run given back", ref)
        repaid.append(ref)
        summary.workloads_restored.append(str(ref))

    try:
        _wait_ready(kube, repaid, Deadline(deadlines.ready_s), log)
    except DeadlineExceeded as error:
        failures.append(str(error))
    if failures:
        raise ReturnIncomplete(f"return of run {run} incomplete: " + "; ".join(failures))
    return summary


def _wait_ready(kube: Kube, refs: list[WorkloadRef], deadline: Deadline, log: logging.Logger) -> None:
    pending = {ref: "not checked yet" for ref in refs}
    while True:
        for ref in list(pending):
            obj = call(lambda ref=ref: ref.get(kube.custom), deadline, f"read {ref}")
            reason = inference.not_ready_reason(ref.kind, obj)
            if reason is None:
                log.info("%s: Ready", ref)
                del pending[ref]
            else:
                pending[ref] = reason
        if not pending:
            return
        try:
            deadline.sleep(0.2, "inference Ready")
        except DeadlineExceeded:
            raise DeadlineExceeded(
                f"inference not Ready within {deadline.seconds:g}s after return: "
                + "; ".join(f"{ref}: {why}" for ref, why in pending.items())
            ) from None
