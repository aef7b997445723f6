"""The campaign's invariants: what a store listener sees while a run goes, and the end state after it.

Seen live (``Recorder``, a listener on the devcluster's store, so nothing between two polls is missed):

- no node in two runs: a node's ``claimed-by`` never changes from one run to another without being
  free in between, and a training pod is bound only to a node its own run holds;
- a quarantined node is never used: no training pod is bound to a node quarantined at that moment;
- every Job created, with its run, attempt and ``TRAINOPS_RESUME_FROM`` (checked at the end).

Checked at the end (``end_state``): no node claimed and no quota granted once the run has ended, the
quota back where it was, inference restored (spec) and Ready, at most one Job per attempt, and every
checkpoint a Job resumed from verifies (a resume from a torn one leaves it torn: no later attempt
rewrites a step it resumed after).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.capacity.helpers import snapshot
from trainops.capacity.claims import parse_run
from trainops.checkpoints.helper import RESUME_FROM_ENV
from trainops.checkpoints.verify import verify_checkpoint
from trainops.kube.nodes import NodeState, holder_of, is_quarantined
from trainops.training.job import ATTEMPT_LABEL, RUN_LABEL
from trainops.training.naming import run_key

NAMESPACE = "training"
QUEUE = "training"


@dataclass
class JobSeen:
    at: float
    run: str  # the RUN_LABEL hash
    attempt: str
    name: str
    resume_from: str | None


@dataclass
class Seen:
    jobs: list[JobSeen] = field(default_factory=list)
    quarantined: set[str] = field(default_factory=set)  # nodes that became quarantined
    violations: list[str] = field(default_factory=list)


def run_label(run: str) -> str:
    """The label value of a claim key ``<dag_id>/<run_id>`` on its Jobs and pods."""
    dag_id, _, run_id = parse_run(run).partition("/")
    return run_key(dag_id, run_id)


class Recorder:
    """Store listener; ``take()`` returns what was seen since the last ``take()`` and starts afresh."""

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._seen = Seen()
        self._holder = {
            n["metadata"]["name"]: holder_of(n["metadata"].get("annotations")) for n in store.list("nodes")[0]
        }
        self._bound: set[str] = set()
        store.add_listener(self)

    def take(self) -> Seen:
        with self._lock:
            seen, self._seen = self._seen, Seen()
            return seen

    def __call__(self, event) -> None:  # under the store lock: quick reads only, and never raise
        try:
            if event.resource == "nodes":
                self._node(event.object)
            elif event.object["metadata"].get("namespace") != NAMESPACE:
                return
            elif event.resource == "jobs.batch" and event.type == "ADDED":
                self._job(event.object)
            elif event.resource == "pods" and event.type != "DELETED":
                self._pod(event.object)
        except Exception as error:  # noqa: BLE001 - reported, never lost, never breaks the store
            with self._lock:
                self._seen.violations.append(f"the recorder failed on {event.resource}: {error!r}")

    def _node(self, node: dict) -> None:
        name, now = node["metadata"]["name"], holder_of(node["metadata"].get("annotations"))
        before = self._holder.get(name)
        self._holder[name] = now
        with self._lock:
            if before and now and before != now:
                self._seen.violations.append(f"node {name} went from run {before} to run {now} directly")
            if is_quarantined(NodeState.of(node)):
                self._seen.quarantined.add(name)

    def _job(self, job: dict) -> None:
        labels = job["metadata"].get("labels") or {}
        containers = job["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for c in containers for e in c.get("env") or []}
        seen = JobSeen(
            time.time(),
            labels.get(RUN_LABEL, ""),
            labels.get(ATTEMPT_LABEL, ""),
            job["metadata"]["name"],
            env.get(RESUME_FROM_ENV) or None,
        )
        with self._lock:
            self._seen.jobs.append(seen)

    def _pod(self, pod: dict) -> None:
        uid, name = pod["metadata"].get("uid"), pod["spec"].get("nodeName")
        if not name or uid in self._bound:
            return
        self._bound.add(uid)
        node = self.store.find("nodes", "", name)
        holder = holder_of((node or {}).get("metadata", {}).get("annotations"))
        label = (pod["metadata"].get("labels") or {}).get(RUN_LABEL)
        with self._lock:
            if node is not None and is_quarantined(NodeState.of(node)):
                self._seen.violations.append(
                    f"pod {pod['metadata']['name']} bound to quarantined node {name}"
                )
            if holder is None or run_label(holder) != label:
                self._seen.violations.append(
                    f"pod {pod['metadata']['name']} of run {label} bound to node {name} held by {holder}"
                )


def holders(cluster) -> dict[str, str]:
    return {
        n["metadata"]["name"]: h
        for n in cluster.store.list("nodes")[0]
        if (h := holder_of(n["metadata"].get("annotations")))
    }


def gpu_quota(cluster) -> str:
    queue = cluster.store.get("clusterqueues.kueue.x-k8s.io", "", QUEUE)
    resources = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return next(str(r["nominalQuota"]) for r in resources if r["name"] == "nvidia.com/gpu")


def grants(cluster) -> dict[str, str]:
    from trainops.capacity.quota import grants_of

    return grants_of(cluster.store.get("clusterqueues.kueue.x-k8s.io", "", QUEUE))


def end_state(
    cluster,
    seen: Seen,
    before: dict,
    quota_before: str,
    store,
    *,
    faulted: set[str] = frozenset(),
    ready_s: float = 60,
) -> list[str]:
    """The violations in the cluster and the bucket once a run (and any rival) has ended; ``before``:
    ``snapshot(cluster)`` before the run (nodes the run quarantined, and ``faulted`` ones, are left out of that comparison)."""
    bad = list(seen.violations)
    if held := holders(cluster):
        bad.append(f"nodes still claimed after the run ended: {held}")
    if granted := grants(cluster):
        bad.append(f"quota still granted after the run ended: {granted}")
    if gpu_quota(cluster) != quota_before:
        bad.append(f"the GPU quota is {gpu_quota(cluster)}, was {quota_before}")
    for (run, attempt), count in Counter((j.run, j.attempt) for j in seen.jobs).items():
        if count > 1:
            names = [j.name for j in seen.jobs if (j.run, j.attempt) == (run, attempt)]
            bad.append(f"{count} Jobs for attempt {attempt} of run {run}: {names}")
    for job in seen.jobs:
        if job.resume_from and not (result := verify_checkpoint(job.resume_from, store=store)).ok:
            bad.append(
                f"Job {job.name} resumed from {job.resume_from}, which does not verify: {result.reasons}"
            )
    try:
        cluster.wait_until_settled(timeout=ready_s)
    except TimeoutError:
        bad.append(f"inference not Ready within {ready_s:g} s of the return")
    after = snapshot(cluster)
    for kind, objects in before.items():
        for name, obj in objects.items():
            if after[kind].get(name) != obj and not (kind == "nodes" and name in seen.quarantined | faulted):
                bad.append(f"{kind[:-1]} {name} not as before the run: {after[kind].get(name)}")
    return bad
