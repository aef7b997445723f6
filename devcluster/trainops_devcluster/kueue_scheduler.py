"""Kueue's scheduler in the devcluster: quota reservation, preemption and queue status.

Each pass sorts a ClusterQueue's pending Workloads by priority, then queue time (creation, or the
PodsReady-timeout eviction), and reserves quota all-or-nothing.  ``BestEffortFIFO`` (the default)
lets a smaller Workload past one that doesn't fit; ``StrictFIFO`` stops at it.  A Workload that would
fit without lower-priority admitted ones preempts them when ``spec.preemption.withinClusterQueue``
allows (``LowerPriority`` or ``LowerOrNewerEqualPriority``), and then waits for their quota.  The
pending reasons are the release's (``Release.pending_reason``: 0.13 says ``Pending``/``Inadmissible``).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from trainops.kube.kueue import topology_domains
from trainops_devcluster import kueue_tas
from trainops_devcluster.kueue_api import (
    ADMITTED,
    CLUSTER_QUEUES,
    EVICTED,
    FLAVORS,
    JOB_UID_LABEL,
    LOCAL_QUEUES,
    PODS_READY_TIMEOUT,
    PREEMPTED,
    QUOTA_RESERVED,
    REQUEUED,
    WORKLOADS,
    Release,
    Writer,
    condition,
    has_quota,
    holds_quota,
    is_active,
    is_finished,
    is_true,
    parse_iso,
    priority,
)
from trainops_devcluster.kueue_quota import (
    Fit,
    QuotaError,
    ResourceGroup,
    Usage,
    fit_workload,
    flavor_names,
    format_quantity,
    parse_quantity,
    resource_groups,
)
from trainops_devcluster.kueue_tas import TOPOLOGIES, FlavorSnapshot, assignment_usage, encode

COMPONENT = "kueue-admission"


@dataclass
class Queue:
    """A ClusterQueue as the scheduler sees it; ``problem`` (reason, message) when it can't admit."""

    obj: dict
    groups: list[ResourceGroup] = field(default_factory=list)
    node_labels: dict[str, dict] = field(default_factory=dict)
    problem: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]


def admission_usage(workload: dict) -> Usage:
    """The quota an admitted Workload holds: (flavor, resource) -> quantity."""
    usage: Usage = Counter()
    for assignment in workload["status"]["admission"].get("podSetAssignments", []):
        for resource, flavor in assignment.get("flavors", {}).items():
            usage[(flavor, resource)] += parse_quantity(assignment["resourceUsage"][resource])
    return usage


def waiting_for_quota(workload: dict) -> bool:
    """Pending and eligible for quota: active, unfinished, unreserved and not in requeue backoff."""
    if not is_active(workload) or is_finished(workload) or has_quota(workload):
        return False
    requeued = condition(workload, REQUEUED)
    backoff = requeued and requeued["status"] == "False" and requeued["reason"] == PODS_READY_TIMEOUT
    return not backoff and bool(workload.get("spec", {}).get("podSets"))


class Scheduler:
    def __init__(
        self, writer: Writer, release: Release, topology_aware: bool = False, *, node_affinity: bool = True
    ) -> None:
        self.writer, self.release = writer, release
        self.store = writer.store
        self.topology_aware = topology_aware
        self.node_affinity = node_affinity  # TAS honours required node affinity (0.13.10, 0.14.5, 0.15+)
        self._seen: dict[str, int] = {}
        self._sequence = itertools.count()
        self._tas: dict[str, FlavorSnapshot] | None = None  # per pass, built when first needed
        self.topology_pending = False  # a Workload waits for a topology placement

    # ---- admission -------------------------------------------------------------------------
    def schedule(self) -> None:
        self._tas = None
        self.topology_pending = False
        queues = self._queues()
        local = {
            (q["metadata"]["namespace"], q["metadata"]["name"]): q for q in self.store.list(LOCAL_QUEUES)[0]
        }
        holding: dict[str, list[dict]] = defaultdict(list)
        pending: dict[str, list[dict]] = defaultdict(list)
        for workload in self.store.list(WORKLOADS)[0]:
            if holds_quota(workload):
                holding[workload["status"]["admission"]["clusterQueue"]].append(workload)
                if self.topology_aware and workload["status"].get("unhealthyNodes"):
                    self._replace_node(workload)
            elif waiting_for_quota(workload):
                queue, problem = self._route(workload, local, queues)
                if problem:
                    self._pending(workload, "Inadmissible", problem)
                else:
                    pending[queue].append(workload)
        for name, waiting in pending.items():
            self._admit(queues[name], sorted(waiting, key=self._queue_order), holding[name])

    def _admit(self, queue: Queue, waiting: list[dict], holding: list[dict]) -> None:
        usage: Usage = Counter()
        for workload in holding:
            usage.update(admission_usage(workload))
        strict = queue.obj.get("spec", {}).get("queueingStrategy") == "StrictFIFO"
        for workload in waiting:
            fit = fit_workload(workload, queue.groups, usage, queue.node_labels)
            if fit.fits and self.topology_aware:
                fit = self._place(workload, fit, queue)
            if fit.fits:
                admitted = self._reserve(workload, queue.name, fit)
                if admitted:
                    usage.update(fit.usage)
                    holding.append(admitted)
                continue
            preemption = (
                self._preemption(queue, workload, holding, usage) if fit.reason == "WaitingForQuota" else None
            )
            if preemption:
                unfit, (victims, fit) = fit, preemption
                for victim in victims:
                    if not is_true(victim, EVICTED):
                        self._preempt(victim, workload)
                    usage.subtract(admission_usage(victim))
                    holding.remove(victim)
                usage.update(fit.usage)  # the freed quota is this workload's first
                waiting = f"Pending the preemption of {len(victims)} workload(s)"
                if self.release.version == "v1beta1":  # 0.13: the unfit message, then the preemption
                    waiting = f"{unfit.message}. {waiting}"
                self._pending(workload, "WaitingForPreemptedWorkloads", waiting)
                continue
            self._pending(workload, fit.reason, fit.message)
            if strict:
                break

    def _preemption(
        self, queue: Queue, workload: dict, holding: list[dict], usage: Usage
    ) -> tuple[list[dict], Fit] | None:
        """The fewest lower-priority admitted Workloads whose quota would let ``workload`` fit."""
        policy = queue.obj.get("spec", {}).get("preemption", {}).get("withinClusterQueue", "Never")
        if policy not in ("LowerPriority", "LowerOrNewerEqualPriority"):
            return None
        mine = priority(workload)

        def eligible(other: dict) -> bool:
            theirs = priority(other)
            newer = self._queue_order(other) > self._queue_order(workload)
            return theirs < mine or (policy == "LowerOrNewerEqualPriority" and theirs == mine and newer)

        candidates = sorted(
            filter(eligible, holding),
            key=lambda o: (not is_true(o, EVICTED), priority(o), -self.writer.since(o, QUOTA_RESERVED)),
        )
        chosen: list[dict] = []
        freed = Counter(usage)
        for candidate in candidates:
            chosen.append(candidate)
            freed.subtract(admission_usage(candidate))
            fit = fit_workload(workload, queue.groups, freed, queue.node_labels)
            if fit.fits:
                break
        else:
            return None
        for candidate in reversed(chosen[:-1]):  # give back every victim it can do without
            trial = freed + admission_usage(candidate)
            smaller = fit_workload(workload, queue.groups, trial, queue.node_labels)
            if smaller.fits:
                chosen.remove(candidate)
                freed, fit = trial, smaller
        return chosen, fit

    # ---- Topology Aware Scheduling (kueue_tas) ----------------------------------------------
    def _snapshots(self) -> dict[str, FlavorSnapshot]:
        """The TAS flavors' snapshots of this pass: nodes, the pods TAS does not manage, the assignments
        of the admitted TAS Workloads."""
        if self._tas is not None:
            return self._tas
        topologies = {t["metadata"]["name"]: t for t in self.store.list(TOPOLOGIES)[0]}
        flavors = [f for f in self.store.list(FLAVORS)[0] if (f.get("spec") or {}).get("topologyName")]
        self._tas = {}
        if not flavors:
            return self._tas
        nodes, pods = self.store.list("nodes")[0], self.store.list("pods")[0]
        for flavor in flavors:
            topology = topologies.get(flavor["spec"]["topologyName"])
            levels = [
                level.get("nodeLabel") for level in ((topology or {}).get("spec") or {}).get("levels") or []
            ]
            if levels and all(levels):
                snapshot = FlavorSnapshot(
                    topology["metadata"]["name"],
                    levels,
                    flavor,
                    nodes,
                    self.release.version,
                    node_affinity=self.node_affinity,
                )
                snapshot.subtract_pods(pods)
                self._tas[flavor["metadata"]["name"]] = snapshot
        for workload in self.store.list(WORKLOADS)[0]:
            if holds_quota(workload):
                self._hold(workload)
        return self._tas

    def _hold(self, workload: dict) -> None:
        """Count an admitted Workload's topology assignments in the snapshots."""
        podsets = {p["name"]: p for p in workload["spec"].get("podSets") or []}
        for assignment in workload["status"]["admission"].get("podSetAssignments") or []:
            snapshot = self._tas.get(next(iter(assignment.get("flavors", {}).values()), ""))
            if snapshot is not None and assignment.get("topologyAssignment"):
                snapshot.subtract_assignment(
                    *assignment_usage(podsets.get(assignment["name"], {}), assignment)
                )

    def _place(self, workload: dict, fit: Fit, queue: Queue) -> Fit:
        """The topology assignment of every PodSet that asks for TAS (or of all, in a ClusterQueue whose
        flavors are all TAS flavors), added to ``fit``; a failed placement makes the Fit fail."""
        snapshots = self._snapshots()
        tas_only = bool(queue.node_labels) and all(name in snapshots for name in queue.node_labels)
        for podset, assignment in zip(workload["spec"]["podSets"], fit.assignments, strict=True):
            request = podset.get("topologyRequest")
            if not (tas_only or kueue_tas.explicit(request)):
                continue
            flavor = next(iter(assignment["flavors"].values()), "")
            if not flavor:  # its pods request nothing the queue covers: no TAS flavor to place them in
                if self.release.version == "v1beta1":
                    continue  # 0.13 kept the Fit it had cached: admitted, no topology (fixed by kueue#12055)
                return Fit(
                    reason="NoMatchingFlavor",
                    message=f"failed to assign flavors to pod set {podset['name']}: no TAS flavor assigned",
                )
            failed = f"couldn't assign flavors to pod set {podset['name']}: "
            snapshot = snapshots.get(flavor)
            if snapshot is None:
                return Fit(
                    reason="NoMatchingFlavor",
                    message=f'{failed}Flavor "{flavor}" does not support TopologyAwareScheduling',
                )
            domains, why = snapshot.find(assignment["count"], request, podset["template"].get("spec") or {})
            if domains is None:
                self.topology_pending = True
                return Fit(reason=kueue_tas.PLACEMENT_FAILED, message=failed + why)
            assignment["topologyAssignment"] = encode(
                snapshot.assignment_levels(), domains, self.release.version
            )
        return fit

    def _replace_node(self, workload: dict) -> None:
        """Hot swap: a node for the pods of the unhealthy one, inside the required domain; none (fail
        fast): the Workload is evicted with reason NodeFailures."""
        failed = workload["status"]["unhealthyNodes"][0]["name"]
        snapshots = self._snapshots()
        podsets = {p["name"]: p for p in workload["spec"].get("podSets") or []}
        changes = {}
        for index, assignment in enumerate(workload["status"]["admission"].get("podSetAssignments") or []):
            snapshot = snapshots.get(next(iter(assignment.get("flavors", {}).values()), ""))
            levels, domains = topology_domains(assignment)
            lost = sum(count for values, count in domains if values[-1] == failed)
            if snapshot is None or not lost or levels[-1] != kueue_tas.HOSTNAME:
                continue
            kept = [(values, count) for values, count in domains if values[-1] != failed]
            podset = podsets.get(assignment["name"], {})
            request = podset.get("topologyRequest") or {}
            within = snapshot.required_domain(request, kept)
            replacement, _ = snapshot.find(
                lost, request, (podset.get("template") or {}).get("spec") or {}, within
            )
            if replacement is None or any(values[-1] == failed for values, _ in replacement):
                self._evict_node_failure(workload, failed)
                return
            merged = Counter({tuple(v): c for v, c in kept})
            merged.update({tuple(v): c for v, c in replacement})
            changes[index] = encode(
                levels, [(list(v), c) for v, c in sorted(merged.items())], self.release.version
            )

        def change(w: dict) -> None:
            for index, assignment in changes.items():
                w["status"]["admission"]["podSetAssignments"][index]["topologyAssignment"] = assignment
            w["status"].pop("unhealthyNodes", None)

        self.writer.write(WORKLOADS, workload, change)

    def _evict_node_failure(self, workload: dict, node: str) -> None:
        message = f"Workload was evicted as there was no replacement for unhealthy node(s): {node}"

        def change(w: dict) -> None:
            self.writer.set(w, EVICTED, True, kueue_tas.NODE_FAILURES, message)

        if self.writer.write(WORKLOADS, workload, change):
            self.writer.event(
                workload, "Normal", f"EvictedDueTo{kueue_tas.NODE_FAILURES}", message, COMPONENT
            )

    def _reserve(self, workload: dict, queue: str, fit: Fit) -> dict | None:
        def change(w: dict) -> None:
            if has_quota(w) or not is_active(w) or is_finished(w):
                return
            w.setdefault("status", {})["admission"] = {
                "clusterQueue": queue,
                "podSetAssignments": fit.assignments,
            }
            self.writer.set(
                w, QUOTA_RESERVED, True, "QuotaReserved", f"Quota reserved in ClusterQueue {queue}"
            )
            for kind in (EVICTED, PREEMPTED):
                if is_true(w, kind):
                    previous = condition(w, kind)["message"]
                    self.writer.set(w, kind, False, "QuotaReserved", f"Previously: {previous}")
            self.writer.set(w, ADMITTED, True, "Admitted", "The workload is admitted")

        written = self.writer.write(WORKLOADS, workload, change)
        if not written or not has_quota(written):
            return None
        if self._tas:
            self._hold(written)
        queued = self.writer.since(written, REQUEUED) if condition(written, REQUEUED) else None
        queued = queued or parse_iso(written["metadata"]["creationTimestamp"])
        wait = max(0, self.writer.since(written, QUOTA_RESERVED) - queued)
        self.writer.event(
            written,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {queue}, wait time since queued was {wait:.0f}s",
            COMPONENT,
        )
        self.writer.event(
            written,
            "Normal",
            "Admitted",
            f"Admitted by ClusterQueue {queue}, wait time since reservation was 0s",
            COMPONENT,
        )
        return written

    def _preempt(self, victim: dict, preemptor: dict) -> None:
        meta = preemptor["metadata"]
        message = (
            f"Preempted to accommodate a workload (UID: {meta['uid']}, JobUID: "
            f"{meta.get('labels', {}).get(JOB_UID_LABEL, 'UNKNOWN')}) due to prioritization in the ClusterQueue"
        )
        if self.release.version == "v1beta2":  # 0.19+ names where both sit in the cohort tree
            path = f"/{victim['status']['admission']['clusterQueue']}"
            message += f"; preemptor path: {path}; preemptee path: {path}"

        def change(w: dict) -> None:
            self.writer.set(w, EVICTED, True, "Preempted", message)
            self.writer.set(w, PREEMPTED, True, "InClusterQueue", message)

        if self.writer.write(WORKLOADS, victim, change):
            self.writer.event(victim, "Normal", "Preempted", message, COMPONENT)

    def _pending(self, workload: dict, reason: str, message: str) -> None:
        reason = self.release.pending_reason(reason)
        current = condition(workload, QUOTA_RESERVED)
        if current and (current["status"], current["reason"], current["message"]) == (
            "False",
            reason,
            message,
        ):
            return
        self.writer.write(
            WORKLOADS, workload, lambda w: self.writer.set(w, QUOTA_RESERVED, False, reason, message)
        )

    def _queue_order(self, workload: dict) -> tuple:
        """Priority first, then the queue time (eviction time after a PodsReady timeout), then arrival."""
        evicted = condition(workload, EVICTED)
        if evicted and evicted["status"] == "True" and evicted["reason"] == PODS_READY_TIMEOUT:
            queued = self.writer.since(workload, EVICTED)
        else:
            queued = parse_iso(workload["metadata"]["creationTimestamp"])
        seen = self._seen.setdefault(workload["metadata"]["uid"], next(self._sequence))
        return (-priority(workload), queued, seen)

    # ---- queues ------------------------------------------------------------------------------
    def _queues(self) -> dict[str, Queue]:
        flavors = {f["metadata"]["name"]: f for f in self.store.list(FLAVORS)[0]}
        queues = {}
        for obj in self.store.list(CLUSTER_QUEUES)[0]:
            queue = Queue(obj)
            try:
                queue.groups = resource_groups(obj)
            except QuotaError as error:
                queue.problem = ("InvalidQuota", f"Can't admit new workloads: {error}")
            missing = [name for name in flavor_names(queue.groups) if name not in flavors]
            if missing:
                queue.problem = (
                    "FlavorNotFound",
                    f"Can't admit new workloads: references missing ResourceFlavor(s): {', '.join(missing)}",
                )
            queue.node_labels = {
                name: flavors[name].get("spec", {}).get("nodeLabels") or {}
                for name in flavor_names(queue.groups)
                if name in flavors
            }
            queues[queue.name] = queue
        return queues

    @staticmethod
    def _route(workload: dict, local: dict, queues: dict[str, Queue]) -> tuple[str, str]:
        """The ClusterQueue behind the Workload's LocalQueue, or why it can't be admitted."""
        name = workload["spec"].get("queueName", "")
        local_queue = local.get((workload["metadata"]["namespace"], name))
        if local_queue is None:
            return "", f"LocalQueue {name} doesn't exist"
        cluster_queue = local_queue.get("spec", {}).get("clusterQueue", "")
        if cluster_queue not in queues:
            return "", f"ClusterQueue {cluster_queue} doesn't exist"
        if queues[cluster_queue].problem:
            return "", f"ClusterQueue {cluster_queue} is inactive"
        return cluster_queue, ""

    def publish_status(self) -> None:
        """ClusterQueue and LocalQueue status: workload counts, flavor reservation and usage, Active."""
        queues = self._queues()
        local_queues = self.store.list(LOCAL_QUEUES)[0]
        routes = {
            (q["metadata"]["namespace"], q["metadata"]["name"]): q.get("spec", {}).get("clusterQueue")
            for q in local_queues
        }
        tally: dict[tuple, _Tally] = defaultdict(_Tally)
        for workload in self.store.list(WORKLOADS)[0]:
            lq_key = (workload["metadata"]["namespace"], workload["spec"].get("queueName", ""))
            if holds_quota(workload):
                cq_name = workload["status"]["admission"]["clusterQueue"]
                keys = [("cq", cq_name), ("lq", *lq_key)]
                for key in keys:
                    tally[key].add_reserved(workload)
            elif is_active(workload) and not is_finished(workload):
                for key in (("lq", *lq_key), ("cq", routes.get(lq_key))):
                    tally[key].pending += 1
        for queue in queues.values():
            counts = tally[("cq", queue.name)]
            status = counts.status(queue.groups, borrowed=True)
            ok = queue.problem is None
            reason, message = queue.problem or ("Ready", "Can admit new workloads")
            self._write_status(CLUSTER_QUEUES, queue.obj, status, ok, reason, message)
        for obj in local_queues:
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            queue = queues.get(routes[key])
            status = tally[("lq", *key)].status(queue.groups if queue else [], borrowed=False)
            status[self.release.local_queue_usage] = status.pop("flavorsUsage")
            if queue is None:
                ok, reason, message = (
                    False,
                    "ClusterQueueDoesNotExist",
                    "Can't submit new workloads to clusterQueue",
                )
            elif queue.problem:
                ok, reason, message = (
                    False,
                    "ClusterQueueIsInactive",
                    "Can't submit new workloads to clusterQueue",
                )
            else:
                ok, reason, message = True, "Ready", "Can submit new workloads to localQueue"
            self._write_status(LOCAL_QUEUES, obj, status, ok, reason, message)

    def _write_status(
        self, resource: str, obj: dict, status: dict, ok: bool, reason: str, message: str
    ) -> None:
        current = obj.get("status", {})
        active = condition(obj, "Active")
        wanted = ("True" if ok else "False", reason, message)
        if (
            active
            and (active["status"], active["reason"], active["message"]) == wanted
            and all(current.get(key) == value for key, value in status.items())
        ):
            return

        def change(o: dict) -> None:
            o.setdefault("status", {}).update(status)
            self.writer.set(o, "Active", ok, reason, message)

        self.writer.write(resource, obj, change)


@dataclass
class _Tally:
    pending: int = 0
    reserving: int = 0
    admitted: int = 0
    reservation: Usage = field(default_factory=Counter)
    usage: Usage = field(default_factory=Counter)

    def add_reserved(self, workload: dict) -> None:
        held = admission_usage(workload)
        self.reserving += 1
        self.reservation.update(held)
        if is_true(workload, ADMITTED):
            self.admitted += 1
            self.usage.update(held)

    def status(self, groups: list[ResourceGroup], *, borrowed: bool) -> dict:
        def table(amounts: Usage) -> list[dict]:
            rows = []
            for group in groups:
                for flavor in group.flavors:
                    resources = []
                    for name in flavor.nominal:
                        row = {"name": name, "total": format_quantity(Decimal(amounts[(flavor.name, name)]))}
                        if borrowed:
                            row["borrowed"] = "0"
                        resources.append(row)
                    rows.append({"name": flavor.name, "resources": resources})
            return rows

        return {
            "pendingWorkloads": self.pending,
            "reservingWorkloads": self.reserving,
            "admittedWorkloads": self.admitted,
            "flavorsReservation": table(self.reservation),
            "flavorsUsage": table(self.usage),
        }
