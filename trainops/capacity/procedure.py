"""Claim GPU nodes from inference for a training run, and give them back: the whole procedure.

``claim`` (setup): check every node is free, then per node one guarded patch that flips the mode
taint to training and records the claim; lend the capacity of the inference workloads that had pods
there (loans recorded on each object): a workload with an overflow pool first gets as many replicas
there as the pool has room for, Ready (``overflow``), then it shrinks, its pods on the claimed nodes
first (``controller.kubernetes.io/pod-deletion-cost``); evict what is left through the Eviction API;
raise the training ClusterQueue's GPU quota by the GPUs claimed.  ``give_back`` (teardown): lower
the quota, release every node the run holds (found by its annotation, not from memory) and repay
every loan of the run, wait until inference is Ready.  With replicas in an overflow pool the nodes
come back in waves: after each, the primary scales up on the returned nodes, its new replicas
become Ready, and only then does the overflow scale down by as many; the state is on the objects
(claimed nodes, loan records), so a killed return resumes where it stopped.  Both are idempotent
and write nothing when already done.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from trainops.capacity import claims, handoff, inference, prepull
from trainops.capacity.claims import NodeQuarantined, NodesHeld, parse_run
from trainops.capacity.drain import drain, list_pods, pods_on
from trainops.capacity.handoff import DEFAULT_PROPAGATION_S, SafeDrain, UnsafeInference, is_detached
from trainops.capacity.inference import DEPLOYMENT, INFERENCE_SERVICE, KSERVE_STOP, WorkloadRef
from trainops.capacity.loans import get_path, lend_patch, loans_of, repay_part_patch
from trainops.capacity.overflow import (
    DELETION_COST,
    FIRST_TO_GO,
    OVERFLOW_OF_LABEL,
    REPLICAS,
    OverflowPool,
    Room,
    companion_manifest,
    companion_name,
    is_companion_of,
    lent,
    pool_pod_spec,
    primary_of,
    wait_serving,
)
from trainops.capacity.quota import grants_of, set_grant
from trainops.capacity.ranking import drain_costs, least_disruptive
from trainops.conventions import GPU_RESOURCE, MODE_TAINT
from trainops.errors import TemporaryError
from trainops.kube.client import DEPLOYMENTS, EXISTS, MISSING, PDBS, PODS, Kube, is_denied
from trainops.kube.nodes import NodeState, allocatable_gpus, edit_node, holder_of, is_quarantined, list_nodes
from trainops.kube.retry import Deadline, DeadlineExceeded, call
from trainops.placement.nodes import place_nodes
from trainops.placement.place import domains_of
from trainops.placement.request import TopologyRequest

module_log = logging.getLogger(__name__)
DEFAULT_WAVES = 4  # a return with replicas in an overflow pool gives the nodes back in this many waves


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


class PlacementFailed(TemporaryError):
    """The topology asked for (``required``) cannot be met by the candidates now; the message says why."""


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
    offloaded: dict[str, int] = field(default_factory=dict)  # workload -> replicas moved to its overflow pool
    not_offloaded: dict[str, str] = field(default_factory=dict)  # workload -> why (some) were not
    placement: dict | None = None  # where the nodes sit (and the run/spare split, with a topology)
    prepulled: dict[str, str] = field(default_factory=dict)  # node -> the image pull's outcome


@dataclass
class ReturnSummary:
    run: str
    node_names: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    workloads_restored: list[str] = field(default_factory=list)
    gpus_returned: int = 0  # allocatable GPUs of the nodes given back to inference
    quota_returned: int = 0  # GPUs of ClusterQueue quota the run held and gave back
    cluster_queue: str = ""
    waves: int = 0  # waves of nodes given back with replicas moving back from an overflow pool
    overflow_removed: list[str] = field(default_factory=list)  # companion Deployments emptied and deleted

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
        overflow = (
            f" (back from the overflow pool in {self.waves} wave(s); emptied: {', '.join(self.overflow_removed) or 'none'})"
            if self.waves
            else ""
        )
        return (
            f"returned {self.run}: {nodes}; {quota}; inference restored: "
            f"{', '.join(self.workloads_restored) or 'none'}{overflow}; "
            f"still quarantined: {', '.join(self.quarantined) or 'none'}"
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
    overflow_pool: dict | str | None = None,
    topology: TopologyRequest | None = None,
    spares: int = 0,
    image: str | None = None,
    training_namespace: str = "training",
    unsafe_inference: UnsafeInference = "drain-safely",
    endpoint_propagation_s: float = DEFAULT_PROPAGATION_S,
    deadlines: Deadlines = Deadlines(),
    log: logging.Logger = module_log,
) -> ClaimSummary:
    """Claim ``node_names`` for ``run`` (``<dag_id>/<run_id>``); see the module docstring.

    ``count``: claim only this many of ``node_names``, the least disruptive first (see
    ``ranking.least_disruptive``); default: all of them.  With a ``topology`` the ``count`` nodes are
    placed first (``trainops.placement``): the run's ``count - spares`` in the smallest domain of the
    requested level that holds them, its ``spares`` beside them; the least disruptive within.
    ``image``: pulled onto every claimed node in ``training_namespace`` once they are drained (hot
    spares: a resume onto one pays no pull; ``prepull``).  ``gpus_per_node``: GPUs each node adds to
    the quota (default: the node's allocatable ``nvidia.com/gpu``).  ``deployments``/``inference_services``:
    ``namespace/name`` of the inference workloads to lend from.  ``overflow_pool``: the pool (``overflow.OverflowPool.parse``) of the
    Deployments that name none in their ``trainops.io/overflow-pool`` annotation (default: none).
    ``unsafe_inference``: what to do with a workload to shrink or move whose pods lack a clean
    hand-off (a readinessProbe, a preStop hook longer than ``endpoint_propagation_s``, a grace
    period above both and the server's drain: ``handoff.check_workload``): ``"drain-safely"``
    (default) takes each of its pods out of its Services, waits until no EndpointSlice lists it
    and ``endpoint_propagation_s`` more, and only then lets it be scaled away or evicted;
    ``"refuse"`` raises ``handoff.UnsafeHandoff`` naming each field and its fix, nothing changed.
    Raises ``NodesHeld`` (nothing changed) when another run holds a node.
    """
    parse_run(run)
    topology = topology or TopologyRequest()
    candidates = _check_node_names(node_names)
    if gpus_per_node is not None and (not isinstance(gpus_per_node, int) or gpus_per_node < 1):
        raise ValueError(f"gpus_per_node must be a positive integer or None, got {gpus_per_node!r}")
    refs = [WorkloadRef.parse(DEPLOYMENT, d, "inference_deployments") for d in deployments]
    refs += [WorkloadRef.parse(INFERENCE_SERVICE, s, "inference_services") for s in inference_services]
    default_pool = None if overflow_pool is None else OverflowPool.parse(overflow_pool, "overflow_pool")
    handoff.check_choice(unsafe_inference)
    safe_drain = SafeDrain(kube, endpoint_propagation_s, log)

    step = Deadline(deadlines.api_s)
    objs = {ref: call(lambda ref=ref: ref.get(kube.custom), step, f"read {ref}") for ref in refs}
    for ref in refs:  # a pool annotation that cannot be used fails the claim before anything changes
        if ref.kind is DEPLOYMENT:
            OverflowPool.of(objs[ref], default_pool)
    by_name = {n["metadata"]["name"]: n for n in call(lambda: list_nodes(kube.core), step, "list nodes")}
    missing = [n for n in candidates if n not in by_name]
    if missing:
        raise ValueError(f"node_names: not in the cluster: {missing}")
    holders = {n: holder_of(by_name[n]["metadata"].get("annotations")) for n in candidates}
    others = {n for n, holder in holders.items() if holder not in (None, run)}
    # one pod and one budget list serve the ranking and the inference shrink (the drain follows the pods itself)
    pods = list_pods(kube.core, step) if count is not None or refs else []
    pdbs = kube.list(PDBS, deadline=step) if count is not None or refs else []
    placement = None
    if count is not None and topology.active:
        costs = drain_costs(pods, pdbs)
        cost = {n: -1.0 if holders[n] == run else float(costs[n]) for n in candidates}
        placement = _place(candidates, by_name, cost, count, spares, topology, others)
        if not placement.fits and others:  # would it fit once the other runs give theirs back? then wait
            placement = _place(candidates, by_name, cost, count, spares, topology, set())
        log.info("placement (%s): %s", topology.describe(), placement.reason)
        if not placement.fits and topology.required:
            raise PlacementFailed(f"placement ({topology.describe()}): {placement.reason}")
    if placement is not None and placement.fits:
        nodes = placement.nodes  # nodes other runs hold in it end in NodesHeld below: a wait for them
    else:  # no topology, or too few labelled nodes: the least disruptive
        nodes = candidates if count is None else _choose(candidates, holders, run, pods, pdbs, count, others)
    states = {n: NodeState.of(by_name[n]) for n in nodes}
    held = {n: holders[n] for n in nodes if n in others}
    if held:
        raise NodesHeld(held)
    quarantined = [n for n, s in states.items() if is_quarantined(s) and holder_of(s.annotations) != run]
    if quarantined:
        raise NodeQuarantined(", ".join(quarantined))
    unsafe = _unsafe_workloads(refs, objs, pods, set(nodes), endpoint_propagation_s)
    if unsafe and unsafe_inference == "refuse":
        raise handoff.refusal([f for findings in unsafe.values() for f in findings])
    for ref, findings in unsafe.items():
        log.warning(
            "%s lacks a clean hand-off, its pods leave their Service before SIGTERM: %s",
            ref,
            "; ".join(f"{f.field}: {f.problem}" for f in findings),
        )

    summary = ClaimSummary(run, nodes, 0, cluster_queue=cluster_queue)
    if placement is not None and placement.fits:
        summary.placement = placement.to_dict()
    else:  # where the nodes sit all the same (the run view shows it)
        labels = {n: by_name[n]["metadata"].get("labels") or {} for n in nodes}
        summary.placement = {
            "topology": topology.to_dict(),
            "domains": domains_of(topology.levels, labels, nodes),
        }
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

    lending = Lending(kube, run, set(nodes), pods, pdbs, list(by_name.values()), default_pool, deadlines, log)
    lending.safe_drain, lending.unsafe = safe_drain, set(unsafe)
    for ref in refs:
        lending.lend(ref, summary)
    unsafe_selectors = [(ref.namespace, inference.pod_selector(ref.kind, objs[ref])) for ref in unsafe]

    def safely(pod: dict) -> bool:
        labels, namespace = pod["metadata"].get("labels") or {}, pod["metadata"]["namespace"]
        return is_detached(pod) or any(
            ns == namespace and inference.selector_matches(sel, labels) for ns, sel in unsafe_selectors
        )

    summary.evictions = drain(
        kube.core,
        set(nodes),
        Deadline(deadlines.drain_s),
        deadlines.drain_stall_s,
        safely=safely if unsafe else None,
        handoff=safe_drain,
    )
    log.info("drained %d node(s): %d pod(s) evicted", len(nodes), summary.evictions)
    if image:
        pulled = Deadline(min(deadlines.drain_s, prepull.PULL_DEADLINE_S))
        summary.prepulled = prepull.prepull(
            kube, run, nodes, image, namespace=training_namespace, deadline=pulled, log=log
        )
    if set_grant(kube, cluster_queue, run, summary.gpus, Deadline(deadlines.api_s), gpu_flavor).wrote:
        log.info("ClusterQueue %s: %s quota of this run set to %d", cluster_queue, GPU_RESOURCE, summary.gpus)
    return summary


def _unsafe_workloads(
    refs: list[WorkloadRef], objs: dict, pods: list[dict], nodes: set[str], propagation_s: float
) -> dict[WorkloadRef, list]:
    """The workloads with pods on ``nodes`` (those the claim shrinks or moves) that lack a clean
    hand-off, with what they lack."""
    found = {}
    for ref in refs:
        obj = objs[ref]
        selector = inference.pod_selector(ref.kind, obj)
        moved = any(
            p["metadata"]["namespace"] == ref.namespace
            and (p.get("spec") or {}).get("nodeName") in nodes
            and inference.selector_matches(selector, p["metadata"].get("labels") or {})
            for p in pods
        )
        findings = handoff.check_workload(ref.kind.name, obj, propagation_s) if moved else []
        if findings:
            found[ref] = findings
    return found


def _removed_by(target_kind, target_obj: dict, fields: dict, running: int) -> int:
    """How many pods the shrink ``fields`` removes by itself (the rest move by eviction)."""
    if ("metadata", "annotations", KSERVE_STOP) in fields:
        return running
    for path in (("spec", "replicas"), ("spec", "maxReplicas"), ("spec", "predictor", "maxReplicas")):
        if path in fields:
            base = (
                (target_obj.get("spec") or {}).get("replicas", running)
                if target_kind is DEPLOYMENT
                else running
            )
            return max(0, base - fields[path])
    return 0


def _choose(
    candidates: list[str],
    holders: dict,
    run: str,
    pods: list[dict],
    pdbs: list[dict],
    count: int,
    others: set[str],
) -> list[str]:
    """``count`` nodes: those ``run`` already holds first (a retried claim finishes the same claim),
    then the least disruptive of the rest."""
    mine = [n for n in candidates if holders[n] == run][:count]
    if len(mine) == count:
        return mine
    rest = [n for n in candidates if n not in mine]
    return mine + least_disruptive(rest, pods, count - len(mine), held=others, pdbs=pdbs)


def _place(
    candidates: list[str],
    by_name: dict[str, dict],
    cost: dict[str, float],
    count: int,
    spares: int,
    topology: TopologyRequest,
    taken: set[str],
):
    """The placement of ``count`` of ``candidates`` (``spares`` of them spares): ``taken`` nodes are not
    free; ``cost``: what taking each disturbs (those this run holds: nothing, a retried claim keeps them)."""
    return place_nodes(
        [by_name[n] for n in candidates], count - spares, topology, spares=spares, taken=taken, cost=cost
    )


@dataclass
class Lending:
    """One claim's lending of inference capacity: per workload, the replicas on the claimed nodes go
    to its overflow pool (as many as it has room for) and the workload shrinks by the rest."""

    kube: Kube
    run: str
    nodes: set[str]
    pods: list[dict]
    pdbs: list[dict]  # the cluster's PodDisruptionBudgets
    all_nodes: list[dict]
    default_pool: OverflowPool | None
    deadlines: Deadlines
    log: logging.Logger
    room: Room | None = None  # free room of the whole cluster, counted once, shared by the workloads
    safe_drain: SafeDrain | None = None
    unsafe: set[WorkloadRef] = field(default_factory=set)  # workloads whose pods leave their Service first

    def lend(self, ref: WorkloadRef, summary: ClaimSummary) -> None:
        """Lend what ``ref`` runs on the claimed nodes (a loan is recorded even when nothing is scaled
        down, so the return waits for the workload to be Ready); records it in ``summary``."""
        kube, log = self.kube, self.log
        step = Deadline(self.deadlines.api_s)
        obj = call(lambda: ref.get(kube.custom), step, f"read {ref}")
        selector = inference.pod_selector(ref.kind, obj)
        mine = [
            p
            for p in self.pods
            if p["metadata"]["namespace"] == ref.namespace
            and not p["metadata"].get("deletionTimestamp")
            and inference.selector_matches(selector, p["metadata"].get("labels") or {})
        ]
        on_claimed = [p for p in mine if (p.get("spec") or {}).get("nodeName") in self.nodes]
        displaced = len(on_claimed)
        if not displaced:
            log.info("%s: no pods on the claimed nodes, left as is", ref)
            return
        pdbs = [p for p in self.pdbs if p["metadata"].get("namespace") == ref.namespace]
        target, target_obj, pod_labels = ref, obj, selector.get("matchLabels") or {}
        if ref.kind is DEPLOYMENT:
            pod_labels = obj["spec"]["template"]["metadata"].get("labels") or {}
            hpa = inference.hpa_for(kube.custom, ref, step)
            if hpa:
                target, target_obj = hpa
        expected = obj["spec"].get("replicas", len(mine)) if ref.kind is DEPLOYMENT else len(mine)
        pool = OverflowPool.of(obj, self.default_pool) if ref.kind is DEPLOYMENT else None
        floor = min(
            max(inference.pdb_floor(pdbs, pod_labels, expected), pool.min_ready if pool else 0), expected
        )
        offloaded = 0
        if pool is not None:
            if target is not ref:
                why = f"its replicas are {target}'s; only a Deployment without an HPA is offloaded"
            else:
                offloaded, why = self._offload(ref, obj, pool, displaced)
            if offloaded:
                summary.offloaded[str(ref)] = offloaded
            if why:
                summary.not_offloaded[str(ref)] = why
                log.warning("%s: %s", ref, why)
        fields = inference.shrink_fields(
            target.kind, target_obj, len(mine), displaced, max(0, floor - offloaded)
        )
        going = on_claimed
        if ref in self.unsafe and self.safe_drain is not None:
            # the scale-down's pods leave their Service first; the rest go the drain's safe way
            going = on_claimed[: min(displaced, _removed_by(target.kind, target_obj, fields, len(mine)))]
            if going:
                _first_to_go(kube, going, step)
                detached = self.safe_drain.detach(going, step, keep=set(selector.get("matchLabels") or {}))
                self.safe_drain.wait_detached(detached, Deadline(self.deadlines.drain_s))
        else:
            _first_to_go(kube, going, step)
        inference.lend(kube.custom, target, self.run, fields, Deadline(self.deadlines.api_s), target_obj)
        changes = ", ".join(
            f"{'.'.join(path)}={value}"
            for path, value in fields.items()
            if value != get_path(target_obj, path)
        )
        how = f"scaled down: {changes}" if changes else "kept as is; its pods move by eviction"
        log.info("%s: %d pod(s) on claimed nodes, floor %d; %s", target, displaced, floor, how)
        if changes:
            summary.workloads_shrunk.append(str(target))
            if target.kind is DEPLOYMENT:  # its own scale-down removes the marked pods: not the drain's
                _wait_scaled_down(kube, target, Deadline(self.deadlines.api_s))

    def _offload(
        self, ref: WorkloadRef, primary: dict, pool: OverflowPool, displaced: int
    ) -> tuple[int, str]:
        """Make up to ``displaced`` replicas of ``ref`` Ready in its overflow companion (as many as the
        pool has room for); returns how many, and why not all ('' when all)."""
        kube, run = self.kube, self.run
        companion = WorkloadRef(DEPLOYMENT, ref.namespace, companion_name(ref.name))
        step = Deadline(self.deadlines.api_s)
        if len(ref.name) > 63:
            return 0, f"its name is longer than the {OVERFLOW_OF_LABEL} label value may be (63)"
        existing = _read(kube, companion, step)
        if existing is not None and not is_companion_of(existing, ref.name):
            return (
                0,
                f"{companion} exists and is not its overflow companion (no label {OVERFLOW_OF_LABEL}={ref.name})",
            )
        count = lent(existing, run) if existing is not None else 0
        if not count:  # not lent yet (a retried claim finds its loan and goes on with it)
            if self.room is None:  # as listed before the claim: the claimed nodes are training's now
                self.room = Room(
                    [n for n in self.all_nodes if n["metadata"]["name"] not in self.nodes], self.pods
                )
            count = self.room.take(pool_pod_spec(primary, pool), displaced)
            if not count:
                return 0, f"no room in its overflow pool ({_selector_text(pool.node_selector)}) for its pods"
            if existing is None:
                made, created = kube.create(
                    companion_manifest(primary, pool, run, count), DEPLOYMENTS, deadline=step
                )
                if not created and not is_companion_of(made, ref.name):
                    return 0, f"{companion} was made meanwhile by someone else"
                existing = None if created else made  # made meanwhile (a retry whose answer was lost)
            if existing is not None:
                replicas = existing["spec"].get("replicas", 1) + count
                companion.edit(
                    kube.custom, lambda obj: lend_patch(obj, run, {REPLICAS: replicas}), step, existing
                )
            self.log.info(
                "%s: %d replica(s) made in the overflow pool, waiting until Ready", companion, count
            )
        ready = Deadline(self.deadlines.ready_s)
        _wait_ready(kube, [companion], ready, self.log, "in the overflow pool")
        if pool.serve_check:  # judged by requests served through the Service, not the Ready bit
            wait_serving(*pool.serve_check, ready, self.log)
        return (
            count,
            "" if count >= displaced else f"{count} of {displaced} fit in its overflow pool; the rest shrink",
        )


def _wait_scaled_down(kube: Kube, ref: WorkloadRef, deadline: Deadline) -> None:
    """Wait until the Deployment controller has removed the pods of a scale-down (its status counts
    no more pods than wanted); on timeout the drain evicts what is left."""
    while True:
        obj = call(lambda: ref.get(kube.custom), deadline, f"read {ref}")
        status = obj.get("status") or {}
        caught_up = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
        if caught_up and status.get("replicas", 0) <= obj["spec"].get("replicas", 1):
            return
        try:
            deadline.sleep(0.05, f"{ref} scaled down")
        except DeadlineExceeded:
            return


def _selector_text(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def _read(kube: Kube, ref: WorkloadRef, deadline: Deadline) -> dict | None:
    """A Deployment, or None when it does not exist."""
    return kube.get(DEPLOYMENTS, ref.name, ref.namespace, deadline=deadline)


def _first_to_go(kube: Kube, pods: list[dict], deadline: Deadline) -> None:
    """Mark ``pods`` to be the first their ReplicaSet removes when it scales down (a pod gone already
    needs nothing)."""
    body = {"metadata": {"annotations": {DELETION_COST: FIRST_TO_GO}}}
    for pod in pods:
        meta = pod["metadata"]
        if (meta.get("annotations") or {}).get(DELETION_COST) != FIRST_TO_GO:
            kube.patch(PODS, meta["name"], body, meta["namespace"], deadline=deadline)


def give_back(
    kube: Kube,
    run: str,
    *,
    cluster_queue: str,
    training_namespace: str | None = None,
    wave_nodes: int | None = None,
    endpoint_propagation_s: float = DEFAULT_PROPAGATION_S,
    deadlines: Deadlines = Deadlines(),
    log: logging.Logger = module_log,
) -> ReturnSummary:
    """Return everything ``run`` holds (see the module docstring); works from the cluster's records
    alone.  Every step is tried; ``ReturnIncomplete`` names the ones that failed.

    With ``training_namespace``, the run's training Jobs there are stopped first and their pods
    gone before anything is returned (a run failed by hand, reaped or returned from the CLI or the
    UI may still be training); if they cannot be stopped nothing is returned.  ``wave_nodes``: nodes
    per wave when replicas come back from an overflow pool (default: a quarter of the run's nodes).
    An overflow companion whose pods lack a clean hand-off (``handoff.check_workload``) has the pods
    its scale-down removes taken out of their Services first (``endpoint_propagation_s``), where the
    account may (the worker's; without the grants the scale-down goes on as it is, with a warning)."""
    parse_run(run)
    if wave_nodes is not None and (not isinstance(wave_nodes, int) or wave_nodes < 1):
        raise ValueError(f"wave_nodes must be a positive integer or None, got {wave_nodes!r}")
    summary = ReturnSummary(run, cluster_queue=cluster_queue)
    failures: list[str] = []
    if training_namespace:
        from trainops.training.cluster import GangCluster
        from trainops.training.reconcile import stop_run

        try:
            why = "its capacity is given back (the teardown, the reaper or a user's return)"
            for stopped in stop_run(
                GangCluster(kube), training_namespace, run, why, Deadline(deadlines.ready_s)
            ):
                log.info("stopped the run's training before returning its capacity: %s", stopped)
        except Exception as error:
            raise ReturnIncomplete(
                f"return of run {run} not started: its training in namespace {training_namespace} "
                f"could not be stopped ({error}); its nodes stay claimed until it is"
            ) from error

    try:
        taken = set_grant(kube, cluster_queue, run, 0, Deadline(deadlines.api_s))
        summary.quota_returned = grants_of(taken.before).get(run, {}).get("gpus", 0)
        if taken.wrote:
            log.info("ClusterQueue %s: %s quota of this run taken back", cluster_queue, GPU_RESOURCE)
    except Exception as error:  # the nodes must still be returned
        failures.append(f"ClusterQueue {cluster_queue}: {error}")

    step = Deadline(deadlines.api_s)
    held = sorted(
        (
            n
            for n in call(lambda: list_nodes(kube.core), step, "list nodes")
            if holder_of(n["metadata"].get("annotations")) == run
        ),
        key=lambda n: n["metadata"]["name"],
    )
    moves = _overflow_moves(inference.find_loans(kube.custom, run, step))
    size = len(held) or 1
    if moves:
        size = wave_nodes or max(1, math.ceil(len(held) / DEFAULT_WAVES))
        log.info(
            "%d node(s) go back in waves of %d; replicas come back from the overflow pool of %s",
            len(held),
            size,
            ", ".join(str(primary) for primary, _ in moves),
        )
    waves = [held[i : i + size] for i in range(0, len(held), size)] or [[]]
    for index, wave in enumerate(waves):
        returned = [
            node for node in (_release(kube, run, n, summary, failures, deadlines, log) for n in wave) if node
        ]
        if not moves:
            continue
        try:
            _move_back(
                kube, run, moves, returned, index == len(waves) - 1, deadlines, log, endpoint_propagation_s
            )
        except Exception as error:  # the rest waits for a retry, which resumes here
            failures.append(f"wave {index + 1} of {len(waves)}: {error}")
            break
        summary.waves += 1
        log.info("wave %d of %d done: %d node(s) back", index + 1, len(waves), len(wave))

    moved_back = not failures or summary.waves == len(waves)
    skip = set() if moved_back else {ref for pair in moves for ref in pair}
    repaid = []
    for ref, obj in inference.find_loans(kube.custom, run, step):
        if ref in skip:
            continue
        try:
            inference.repay(kube.custom, ref, run, Deadline(deadlines.api_s), obj)
        except Exception as error:  # repay the others
            failures.append(f"{ref}: {error}")
            continue
        log.info("%s: capacity lent to this run given back", ref)
        repaid.append(ref)
        if primary_of(ref, obj) is None:
            summary.workloads_restored.append(str(ref))

    try:
        _wait_ready(kube, repaid, Deadline(deadlines.ready_s), log, "after return")
    except DeadlineExceeded as error:
        failures.append(str(error))
    for _, companion in moves if moved_back else ():
        try:
            if _delete_if_empty(kube, companion, Deadline(deadlines.api_s)):
                log.info("%s: empty, deleted", companion)
                summary.overflow_removed.append(str(companion))
        except Exception as error:
            failures.append(f"{companion}: {error}")
    if failures:
        raise ReturnIncomplete(f"return of run {run} incomplete: " + "; ".join(failures))
    return summary


def _release(
    kube: Kube, run: str, node: dict, summary: ReturnSummary, failures: list[str], deadlines: Deadlines, log
) -> dict | None:
    """Give one node back to inference; the node as written, or None when that failed (noted in ``failures``)."""
    name = node["metadata"]["name"]
    try:
        edited = edit_node(kube.core, name, claims.release(run), Deadline(deadlines.api_s), current=node)
    except Exception as error:  # return the other nodes
        failures.append(f"node {name}: {error}")
        return None
    summary.node_names.append(name)
    summary.gpus_returned += allocatable_gpus(edited.object)
    if is_quarantined(NodeState.of(edited.object)):
        summary.quarantined.append(name)
        log.warning("node %s: returned to inference mode but stays quarantined", name)
    else:
        log.info("node %s: returned to inference", name)
    return edited.object


def _overflow_moves(loans: list[tuple[WorkloadRef, dict]]) -> list[tuple[WorkloadRef, WorkloadRef]]:
    """(primary, companion) of every overflow companion among a run's loans."""
    return [(primary, ref) for ref, obj in loans if (primary := primary_of(ref, obj)) is not None]


def _move_back(
    kube: Kube,
    run: str,
    moves: list[tuple[WorkloadRef, WorkloadRef]],
    returned: list[dict],
    last: bool,
    deadlines: Deadlines,
    log: logging.Logger,
    propagation_s: float = DEFAULT_PROPAGATION_S,
) -> None:
    """One wave: each primary scales up by what fits on the ``returned`` nodes (the last wave: all
    it lent), its replicas become Ready, and only then does its companion scale down to what the
    primary still lends (so the Ready replicas never drop)."""
    step = Deadline(deadlines.api_s)
    room = None
    if not last and returned:
        names = [n["metadata"]["name"] for n in returned]
        room = Room(returned, pods_on(kube.core, names, step))
    primaries = []
    for primary, _ in moves:
        obj = _read(kube, primary, step)
        if obj is None:  # deleted: its companion goes with it (owner reference)
            continue
        primaries.append(primary)
        owed = lent(obj, run)
        back = owed if last or room is None else room.take(obj["spec"]["template"]["spec"], owed)
        if back:
            primary.edit(
                kube.custom, lambda o, back=back: repay_part_patch(o, run, REPLICAS, back), step, obj
            )
            log.info("%s: %d replica(s) back on the returned nodes", primary, back)
    _wait_ready(kube, primaries, Deadline(deadlines.ready_s), log, "on the returned nodes")
    for primary, companion in moves:
        obj = _read(kube, companion, step)
        if obj is None:
            continue
        owner = _read(kube, primary, step)
        surplus = lent(obj, run) - (lent(owner, run) if owner is not None else 0)
        if surplus > 0:
            detached = []
            if handoff.check_workload("Deployment", obj, propagation_s):
                detached = _leave_service_first(
                    kube, obj, surplus, SafeDrain(kube, propagation_s, log), deadlines
                )
            companion.edit(
                kube.custom, lambda o, surplus=surplus: repay_part_patch(o, run, REPLICAS, surplus), step, obj
            )
            log.info("%s: %d replica(s) fewer in the overflow pool", companion, surplus)
            _evict_orphans(kube, detached, Deadline(deadlines.drain_s), log)


def _evict_orphans(kube: Kube, pods: list[dict], deadline: Deadline, log: logging.Logger) -> None:
    """Evict those of ``pods`` their Deployment let go of: a ReplicaSet releases a pod that lost a
    label of its selector (taken out of its Service), and its scale-down then removes another.  A
    refused eviction (a budget, the API busy) is asked again until ``deadline``, then named in a
    warning: the pod still runs, out of its Service."""
    from trainops.capacity.drain import EVICTED, GONE, _evict
    from trainops.kube.retry import Backoff

    for pod in pods:
        meta = pod["metadata"]
        where = f"{meta['namespace']}/{meta['name']}"
        backoff = Backoff(kube.settings)
        while True:
            # a list, not a get: the workers' account may list pods everywhere, not get them
            found = kube.list(PODS, meta["namespace"], fields=f"metadata.name={meta['name']}")
            now = found[0] if found else None
            if now is None or now["metadata"].get("deletionTimestamp"):
                break
            if any(o.get("controller") for o in now["metadata"].get("ownerReferences") or []):
                break  # still its ReplicaSet's: the scale-down removes it
            answer = _evict(kube.core, now)
            if answer in (EVICTED, GONE):
                break
            if deadline.remaining() <= 0:
                log.warning(
                    "pod %s: released by its ReplicaSet and not evicted in time (%s); it still runs, "
                    "out of its Service: delete it by hand",
                    where,
                    answer,
                )
                break
            time.sleep(max(0.0, min(backoff.next(), deadline.remaining())))


def _leave_service_first(
    kube: Kube, obj: dict, count: int, safe: SafeDrain, deadlines: Deadlines
) -> list[dict]:
    """Take ``count`` pods of the Deployment ``obj`` out of their Services, marked first to go, before
    its scale-down removes them (those not Ready first, then the newest, as a ReplicaSet picks)."""
    from kubernetes.client.exceptions import ApiException

    meta, selector = obj["metadata"], obj["spec"]["selector"].get("matchLabels") or {}
    step = Deadline(deadlines.api_s)
    try:
        pods = kube.list(
            PODS,
            meta["namespace"],
            labels=",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            deadline=step,
        )
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        live.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
        live.sort(
            key=lambda p: any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        going = live[:count]
        _first_to_go(kube, going, step)
        detached = safe.detach(going, step, keep=set(selector))
        safe.wait_detached(detached, Deadline(deadlines.drain_s))
        return detached
    except ApiException as error:
        if not is_denied(error):
            raise
        safe.log.warning(
            "%s/%s: its pods lack a clean hand-off, but this account may not take them out of their "
            "Service (%s); scaled down as they are",
            meta["namespace"],
            meta["name"],
            error.reason,
        )
        return []


def _delete_if_empty(kube: Kube, ref: WorkloadRef, deadline: Deadline) -> bool:
    """Delete a companion that no run lends to any more and runs no replica (guarded by its
    resourceVersion, so a claim lending to it meanwhile wins); True when deleted."""
    from kubernetes.client.exceptions import ApiException

    while True:
        obj = _read(kube, ref, deadline)
        if obj is None or loans_of(obj) or obj["spec"].get("replicas", 1):
            return False
        options = {"apiVersion": "v1", "kind": "DeleteOptions"}
        options["preconditions"] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
        path = DEPLOYMENTS.path(ref.namespace, ref.name)
        try:
            return (
                kube.request("DELETE", path, f"delete {ref}", unless=MISSING, body=options, deadline=deadline)
                is not None
            )
        except ApiException as error:
            if error.status != EXISTS:  # 409: it changed since it was read
                raise
            deadline.sleep(0.05, f"delete {ref}")


def _wait_ready(
    kube: Kube, refs: list[WorkloadRef], deadline: Deadline, log: logging.Logger, when: str
) -> None:
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
                f"inference not Ready within {deadline.seconds:g}s {when}: "
                + "; ".join(f"{ref}: {why}" for ref, why in pending.items())
            ) from None
