"""The training run's calls to the cluster, through ``Kube``'s verbs: submit, find, inspect and stop
Jobs.  Transient API errors are retried until the settings' deadline (``trainops.kube``).  Async code
(the follower in the triggerer) runs them in a thread; only the watches are async (``trainops.kube.aio``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Iterator, Mapping

from trainops.conventions import (
    GPU_POOL_LABEL,
    GPU_RESOURCE,
    KUEUE_JOB_UID_LABEL,
    KUEUE_QUEUE_LABEL,
    MODE_TAINT,
    MODE_TRAINING,
)
from trainops.errors import TemporaryError
from trainops.kube.client import JOBS, NODES, PODS, SERVICES, Kind, Kube, api_message
from trainops.kube.kueue import KueueNotServed
from trainops.kube.kueue_release import UPGRADE, controller_version, ignores_affinity
from trainops.kube.nodes import NodeState, gpus, holder_of, is_quarantined
from trainops.kube.queues import (
    QueueMismatch,
    coverage_fix,
    pod_requests,
    read_queues,
    requested_resources,
    tas_flavors,
    uncovered,
)
from trainops.kube.retry import Deadline
from trainops.placement.scheduling import selects
from trainops.training.job import HOSTNAME_LABEL, JOB_NAME_LABEL, RUN_LABEL
from trainops.training.ledger import timestamp
from trainops.training.naming import run_key

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 100
WORKLOADS = "workloads"
WORKLOAD_WAIT_S = 30.0  # Kueue makes a Job's Workload within this of the Job's creation, or never


class GangCluster:
    """The run's Jobs, pods, Workloads and nodes through ``kube``."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.core = kube.core

    def read_job(self, namespace: str, name: str) -> dict | None:
        return self.kube.get(JOBS, name, namespace)

    def create_job(self, job: dict) -> tuple[dict, bool]:
        """Create the Job; returns it and whether this call created it (False: it already existed)."""
        return self.kube.create(job, JOBS)

    def check_admissible(self, job: Mapping, *, coverage: bool = True) -> str | None:
        """Refuse ``job`` (its Workload's one PodSet, before it is created) when a resource its pod
        template requests is covered by no resource group of the ClusterQueue behind its LocalQueue:
        Kueue would never admit it (``QueueMismatch``, naming the resource, the ClusterQueue and the fix);
        ``coverage=False`` (the operator's ``check_queue=False``) skips that one check.  Either way it
        refuses what ``_check_one_pod_per_node`` refuses under Topology Aware Scheduling.  Reads only.
        When the queues cannot be read (RBAC, Kueue not served, a LocalQueue or ClusterQueue that does
        not exist yet), it says so in the log and refuses nothing: Kueue's own answer ends the attempt
        then (the follower).  Returns the ClusterQueue's name when it was read."""
        from kubernetes.client.exceptions import ApiException

        meta = job["metadata"]
        namespace, local_queue = meta["namespace"], (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        if not local_queue:
            return None
        where = f"LocalQueue {namespace}/{local_queue}"
        try:
            queue, target, found = read_queues(self.kube, namespace, local_queue, self.kube.deadline())
        except (ApiException, KueueNotServed, TemporaryError) as error:
            log.warning(
                "could not read %s and its ClusterQueue (%s); submitting unchecked", where, _said(error)
            )
            return None
        if found is None:
            absent = (
                f"{where} does not exist" if queue is None else f"its ClusterQueue {target!r} does not exist"
            )
            log.warning("%s; submitting unchecked: Kueue leaves the run pending until it does", absent)
            return None
        requested = requested_resources(job["spec"]["template"].get("spec") or {})
        if not coverage:
            log.info("%s -> ClusterQueue %s; resource coverage unchecked (check_queue off)", where, target)
        elif missing := uncovered(found, requested):
            raise QueueMismatch(
                f"Kueue can never admit Job {namespace}/{meta['name']}: ClusterQueue {target} (behind {where}) "
                f"does not cover {', '.join(missing)}, which each pod of the run requests (Kueue would answer "
                f'"resource {missing[0]} unavailable in ClusterQueue" and the run wait for its admission '
                f"timeout); nothing was submitted. {coverage_fix(target, missing)}, or drop the request from "
                "the run (extra_resources, pod_template)"
            )
        else:
            log.info(
                "%s -> ClusterQueue %s covers %s", where, target, ", ".join(sorted(requested)) or "nothing"
            )
        self._check_one_pod_per_node(job, target, found)
        return target

    def _check_one_pod_per_node(self, job: Mapping, target: str, cluster_queue: Mapping) -> None:
        """When ClusterQueue ``target`` places by Topology Aware Scheduling, refuse ``job``:

        - ``KueueRelease``: the controller's Deployment names a release whose TAS ignores required node
          affinity (0.13.0-0.13.9, 0.14.0-0.14.4; ``trainops.kube.kueue_release``), which is what keeps
          a resume off the nodes trainops keeps out;
        - ``SharedNode``: a node the run may land on (one a TAS flavor's ``nodeLabels`` select, that the
          pod template's node selector and affinity allow, schedulable and not quarantined) holds two
          of its pods by their requests: TAS assigns pods to nodes by capacity and never looks at pod
          anti-affinity (in no Kueue release), so it may put two ranks on that node, where the
          kube-scheduler's one-pod-per-node rule leaves the second Pending until waitForPodsReady
          requeues the run.  Kueue documents nothing that keeps
          one pod per node; a pod that asks for more than half a node (a whole node's GPUs) cannot
          share it.

        ResourceFlavors, the controller's Deployment or nodes it may not read: logged, nothing refused."""
        from kubernetes.client.exceptions import ApiException

        try:
            flavors = tas_flavors(self.kube, cluster_queue, self.kube.deadline())
            if not flavors:
                return
            version, where = controller_version(self.kube, self.kube.deadline())
            template_spec = job["spec"]["template"].get("spec") or {}
            names = pinned_nodes(template_spec)
            if names:
                nodes = [n for n in self.read_nodes(sorted(names)).values() if n]
            else:
                nodes = self.kube.list(NODES, labels=f"{GPU_POOL_LABEL}=true")
        except (ApiException, KueueNotServed, TemporaryError) as error:
            log.warning(
                "could not read ClusterQueue %s's flavors or the run's nodes (%s); one pod per node unchecked",
                target,
                _said(error),
            )
            return
        nodes = [node for node in nodes if _may_take(node, template_spec, flavors.values())]
        meta = job["metadata"]
        if why := ignores_affinity(version, where, list(flavors)):
            raise KueueRelease(
                f"Kueue cannot keep Job {meta['namespace']}/{meta['name']} off the nodes trainops keeps out: "
                f"{why}; nothing was submitted. Fix: {UPGRADE}"
            )
        per_pod = pod_requests(template_spec)
        shared = sorted(
            ((pods_fitting(node, per_pod), node["metadata"]["name"]) for node in nodes),
            key=lambda found: (-found[0], found[1]),
        )
        if not shared or shared[0][0] < 2:
            return
        fits, name = shared[0]
        node = next(n for n in nodes if n["metadata"]["name"] == name)
        has = gpus(node) or 0
        asked = per_pod.get(GPU_RESOURCE, 0)
        fix = (
            f"Set gpus_per_node to {has} (each pod takes a whole node), or run on nodes with {asked:g} GPUs "
            "(node_names)"
            if asked
            else "A run without GPUs: request more than half a node's cpu or memory, so that no node holds two "
            "of its pods"
        )
        raise SharedNode(
            f"Kueue could place two pods of Job {meta['namespace']}/{meta['name']} on one node: gpus_per_node is "
            f"{asked:g} but node {name} has {has} allocatable {GPU_RESOURCE} and holds {fits} such pods; "
            f"ClusterQueue {target} places by Topology Aware Scheduling (ResourceFlavor {', '.join(flavors)}), "
            "which assigns pods to nodes by capacity and ignores pod anti-affinity, and the kube-scheduler would "
            "leave the second pod on a node Pending (one pod per node) until waitForPodsReady requeues the run; "
            f"nothing was submitted. {fix}, or remove topologyName from ResourceFlavor {next(iter(flavors))} to admit "
            "by quota alone"
        )

    def create_service(self, service: dict) -> bool:
        """Create a Service; False when it already existed."""
        return self.kube.create(service, SERVICES, read_back=False)[1]

    def workload_kind(self) -> Kind:
        """Kueue's Workloads, at the version the cluster serves."""
        return self.kube.kueue(WORKLOADS)

    def deactivate_workload(self, namespace: str, name: str) -> bool:
        """Stop a run through its Kueue Workload (``spec.active=false``: Kueue evicts it and does not
        requeue it); False when that Workload no longer exists."""
        return self.kube.patch(self.workload_kind(), name, {"spec": {"active": False}}, namespace) is not None

    def workloads(self, namespace: str, job: dict) -> list[dict]:
        """The Kueue Workloads of ``job`` (by its uid)."""
        return self.kube.list(
            self.workload_kind(), namespace, labels=f"{KUEUE_JOB_UID_LABEL}={job['metadata']['uid']}"
        )

    def stop(self, namespace: str, job_name: str, workload: str | None = None) -> str:
        """Stop an attempt: deactivate its Workload (``spec.active=false``: Kueue evicts it and does not
        requeue it), or, when Kueue made no Workload for it, delete the Job with Foreground
        propagation.  Kueue makes the Workload after the Job (created suspended): a stop in between waits
        for it (``_workload_names``), since the Job is the attempt's record (its judged end, the
        run-stopped mark) and deleting it deletes that too.  ``workload``: the Workload's name where the
        caller read it (the ledger): then deactivating it is the one request.  Returns what was done."""
        if workload is not None and self.deactivate_workload(namespace, workload):
            return f"deactivated Workload {workload} (spec.active=false)"
        job = self.read_job(namespace, job_name)
        if job is None:
            return f"Job {namespace}/{job_name} is already gone"
        names = self._workload_names(namespace, job)
        if names:
            for name in names:
                self.deactivate_workload(namespace, name)
            return f"deactivated Workload {', '.join(names)} (spec.active=false)"
        self.kube.delete(JOBS, job_name, namespace, propagation="Foreground")
        return f"deleted Job {namespace}/{job_name} (Foreground propagation)"

    def _workload_names(self, namespace: str, job: dict) -> list[str]:
        """The names of ``job``'s Workloads; for a suspended Job that has none yet, those Kueue makes
        until ``WORKLOAD_WAIT_S`` after the Job's creation (none: Kueue does not manage it, e.g. its
        priority class is missing)."""
        meta = job["metadata"]
        names = [w["metadata"]["name"] for w in self.workloads(namespace, job)]
        created = timestamp(meta.get("creationTimestamp")) or 0.0
        left = min(WORKLOAD_WAIT_S, created + WORKLOAD_WAIT_S - time.time())  # min: a skewed clock
        if names or not (job.get("spec") or {}).get("suspend") or left <= 0:
            return names
        log.info(
            "waiting up to %.0fs for Kueue to make the Workload of Job %s to stop it", left, meta["name"]
        )
        labels, until = f"{KUEUE_JOB_UID_LABEL}={meta['uid']}", time.monotonic() + left
        for found in self.kube.watch(self.workload_kind(), namespace, labels=labels, until=until):
            if names := sorted(name for name, workload in found.items() if workload is not None):
                return names
        return []

    def record_end(self, namespace: str, job_name: str, end) -> bool:
        """Write the judged ``end`` (``ledger.End``) on the attempt's Job unless it has a readable one
        already (the first judgement stands: a try and a trigger that race judge the same end; an
        unreadable one is replaced); False when it had one or the Job is gone."""
        from trainops.training.ledger import Unreadable, end_annotation, parse_end

        def change(job: dict) -> dict | None:
            try:
                if parse_end((job.get("metadata") or {}).get("annotations") or {}) is not None:
                    return None
            except Unreadable:
                pass
            return {"metadata": {"annotations": end_annotation(end)}}

        current = self.read_job(namespace, job_name)
        if current is None:
            return False
        return self.kube.edit(JOBS, job_name, change, namespace, current=current).wrote

    def mark_run_stopped(self, namespace: str, job_name: str, by: str) -> bool:
        """Mark the run stopped by ``by`` on its newest attempt's Job (``ledger.RUN_STOPPED_ANNOTATION``);
        False when the Job is gone."""
        from trainops.training.ledger import run_stopped_annotation

        marked = self.kube.patch(
            JOBS, job_name, {"metadata": {"annotations": run_stopped_annotation(by)}}, namespace
        )
        return marked is not None

    def run_workloads(self, namespace: str, jobs: list[dict]) -> list[dict]:
        """The Kueue Workloads of ``jobs`` (by their uids), one list."""
        uids = sorted(j["metadata"]["uid"] for j in jobs if (j.get("metadata") or {}).get("uid"))
        if not uids:
            return []
        return self.kube.list(
            self.workload_kind(), namespace, labels=f"{KUEUE_JOB_UID_LABEL} in ({','.join(uids)})"
        )

    def live_pods(self, namespace: str, run: str) -> list[str]:
        """The pods of ``run``'s attempts that are pending or running."""
        dag_id, _, run_id = run.partition("/")
        return sorted(
            pod["metadata"]["name"]
            for pod in self.kube.list(PODS, namespace, labels=f"{RUN_LABEL}={run_key(dag_id, run_id)}")
            if (pod.get("status") or {}).get("phase") in ("Pending", "Running", None)
        )

    def run_jobs(self, namespace: str, run: str, deadline: Deadline | None = None) -> list[dict]:
        """The Jobs of ``run``'s attempts (``<dag_id>/<run_id>``, by the run label)."""
        dag_id, _, run_id = run.partition("/")
        return self.kube.list(
            JOBS, namespace, labels=f"{RUN_LABEL}={run_key(dag_id, run_id)}", deadline=deadline
        )

    def job_pods(self, namespace: str, name: str) -> list[dict]:
        return self.kube.list(PODS, namespace, labels=f"{JOB_NAME_LABEL}={name}")

    def failure_evidence(
        self, namespace: str, pods: list[Mapping]
    ) -> tuple[dict[str, dict | None], dict[str, str]]:
        """What a failure is judged on, read concurrently: the nodes the pods ran on (None for a node
        that no longer exists) and the last lines of each failed pod's log (pods already gone are
        skipped)."""
        names = sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
        failed = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
        results = self.kube.concurrently(
            [lambda n=n: self.kube.get(NODES, n) for n in names]
            + [lambda p=p: self.kube.log_tail(namespace, p, LOG_TAIL_LINES) for p in failed]
        )
        tails = {
            pod: tail for pod, tail in zip(failed, results[len(names) :], strict=True) if tail is not None
        }
        return dict(zip(names, results[: len(names)], strict=True)), tails

    def read_nodes(self, names: list[str]) -> dict[str, dict | None]:
        """Each node by name, read concurrently (None for one that no longer exists)."""
        return self.kube.get_all(NODES, names)

    def free_nodes(self, candidates: Collection[str], excluded: Collection[str], run: str) -> list[str]:
        """The nodes a new attempt of ``run`` could run on now: ``candidates`` (the run's claimed nodes;
        empty: the GPU pool's nodes) that are not ``excluded``, exist, are in training mode (the pods
        tolerate only that), Ready and schedulable, not quarantined, and held by no other run."""
        if candidates:
            nodes = [n for n in self.read_nodes(sorted(set(candidates) - set(excluded))).values() if n]
        else:
            nodes = self.kube.list(NODES, labels=f"{GPU_POOL_LABEL}=true")
        return sorted(
            name
            for node in nodes
            if (name := node["metadata"]["name"]) not in excluded and _usable(node, run)
        )

    def node_changes(self, names: list[str], until: float) -> Iterator[dict[str, dict | None]]:
        """The nodes ``names`` now, then again each time one of them changes, until ``until``
        (``time.monotonic()``): ``Kube.watch`` on nodes, filtered to these names."""
        yield from self.kube.watch(NODES, names=set(names), until=until)


class SharedNode(QueueMismatch):
    """Kueue's Topology Aware Scheduling could put two of the run's pods on one node."""


class KueueRelease(QueueMismatch):
    """The cluster's Kueue places by Topology Aware Scheduling and ignores required node affinity."""


def pinned_nodes(pod_spec: Mapping) -> set[str]:
    """The node names the pods' required node affinity allows (``kubernetes.io/hostname In``, the run's
    ``node_names``); empty: any node of the GPU pool."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    names: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == HOSTNAME_LABEL and expression.get("operator") == "In":
                names |= set(expression.get("values") or [])
    return names


def pods_fitting(node: Mapping, per_pod: Mapping[str, float]) -> int:
    """How many pods asking for ``per_pod`` the node's allocatable holds, as TAS counts it (one ``pods``
    slot each)."""
    from kubernetes.utils.quantity import parse_quantity

    allocatable = (node.get("status") or {}).get("allocatable") or {}
    counts = []
    for name, amount in {**per_pod, "pods": 1.0}.items():
        if amount <= 0:
            continue
        try:
            have = float(parse_quantity(allocatable.get(name, "0")))
        except (ValueError, TypeError, ArithmeticError):
            have = 0.0
        counts.append(int(have // amount))
    return min(counts) if counts else 0


def _may_take(node: Mapping, pod_spec: Mapping, flavors: Iterable[Mapping]) -> bool:
    """Whether the run's pods may land on ``node`` under TAS: schedulable, not quarantined, allowed by the
    pod template's node selector and required affinity, and selected by a TAS flavor's ``nodeLabels``
    (``flavors``: their specs)."""
    state = NodeState.of(node)
    if state.unschedulable or is_quarantined(state) or not selects(dict(pod_spec), dict(node)):
        return False
    return any(selects({"nodeSelector": spec.get("nodeLabels") or {}}, dict(node)) for spec in flavors)


def _said(error: BaseException) -> str:
    """An API error's status and message, or the error (for the log)."""
    status = getattr(error, "status", None)
    return f"HTTP {status}: {api_message(error)}" if status else f"{type(error).__name__}: {error}"


def _usable(node: Mapping, run: str) -> bool:
    """In training mode, Ready, schedulable, not quarantined, and not claimed by a run other than ``run``
    (another run's training nodes are in training mode too)."""
    state = NodeState.of(node)
    mode = state.taint(MODE_TAINT) or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    return (
        ready
        and mode.get("value") == MODE_TRAINING
        and not state.unschedulable
        and not is_quarantined(state)
        and holder_of(state.annotations) in (None, run)
    )
