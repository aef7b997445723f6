"""Moving the remaining pods off claimed nodes through the Eviction API.

Eviction (not delete) is what honours PodDisruptionBudgets: the API server answers 429 while an
eviction would take a workload below its budget, and the drain retries that pod later (other
pods go on meanwhile) until the deadline.  DaemonSet pods, mirror pods and finished pods stay,
as with ``kubectl drain``.  The drain is done when no other pod is left on the nodes.

A pod of a workload that lacks a clean hand-off (``trainops.capacity.handoff``) is drained the
safe way when ``safely`` says so: the Eviction API is asked first as a dry run (its budget must
allow the pod to go), then the pod is taken out of its Services, and it is evicted once no
EndpointSlice lists it (plus the endpoint propagation time); one such pod per namespace at a time
is out of its Service and not yet evicted, so budgets are kept.

A drain that cannot finish says so early: when evicted pods' replacements cannot be scheduled
anywhere and every pod left is held by its budget, waiting longer changes nothing, so after
``stall_s`` it raises ``DrainStalled`` naming the pods and the scheduler's reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from trainops.errors import PermanentError
from trainops.kube.client import api_message, json_of
from trainops.kube.lists import PAGE, list_all
from trainops.kube.retry import Backoff, Deadline, DeadlineExceeded, is_transient

log = logging.getLogger(__name__)
EVICTED, GONE = "evicted", "gone"
LEAVING = "leaving its Service before it is evicted"


class DrainStalled(PermanentError):
    """Evicted pods cannot be rescheduled and the rest are held by their PodDisruptionBudgets."""


def unschedulable(pods: Iterable[dict]) -> dict[str, str]:
    """Pending pods the scheduler found no node for: ``namespace/name`` -> the scheduler's message."""
    stuck = {}
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                meta = pod["metadata"]
                stuck[f"{meta['namespace']}/{meta['name']}"] = condition.get("message") or "Unschedulable"
    return stuck


def list_pods(core_v1, deadline: Deadline, field_selector: str = "") -> list[dict]:
    """The pods ``field_selector`` selects (every pod when empty), as dicts, ``PAGE`` per request."""

    def fetch(token: str | None) -> dict:
        response = core_v1.list_pod_for_all_namespaces(
            field_selector=field_selector, limit=PAGE, _continue=token, _preload_content=False
        )
        return json_of(response)

    return list_all(fetch, deadline, f"list pods {field_selector}".rstrip())


def pods_on(core_v1, nodes: Iterable[str], deadline: Deadline) -> list[dict]:
    """The pods bound to ``nodes``: one ``spec.nodeName`` list per node, whatever the cluster's size."""
    return [pod for node in sorted(nodes) for pod in list_pods(core_v1, deadline, f"spec.nodeName={node}")]


def must_move(pod: dict) -> bool:
    """Whether a drain has to move this pod (DaemonSet, mirror and finished pods stay)."""
    meta = pod["metadata"]
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pods_to_move(pods: Iterable[dict], nodes: set[str]) -> list[dict]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") in nodes and must_move(p)]


def _evict(core_v1, pod: dict, dry_run: bool = False) -> str:
    """Ask to evict one pod: ``EVICTED``, ``GONE``, or why it must wait (PDB, API busy).  A dry run
    asks only whether the budget allows it (``EVICTED``: it would)."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    try:  # read the answer whole: a connection released unread fails the next request sent on it
        json_of(
            core_v1.create_namespaced_pod_eviction(
                meta["name"],
                meta["namespace"],
                body,
                _preload_content=False,
                **({"dry_run": "All"} if dry_run else {}),
            )
        )
    except Exception as error:
        status = getattr(error, "status", None)
        if status == 404:
            return GONE
        if is_transient(error) or status == 409:  # 409: the budget's update conflicted; ask again
            return api_message(error)
        raise
    return EVICTED


def drain(
    core_v1,
    nodes: set[str],
    deadline: Deadline,
    stall_s: float = 30.0,
    safely: Callable[[dict], bool] | None = None,
    handoff=None,
) -> int:
    """Evict every pod that must move off ``nodes`` and wait until they are gone; returns how many
    evictions were accepted.  Raises ``DeadlineExceeded`` naming the pods still there, or
    ``DrainStalled`` once it has been stuck (see the module docstring) for ``stall_s``.
    ``safely``: which pods go the safe way, through ``handoff`` (a ``handoff.SafeDrain``)."""
    from trainops.capacity.handoff import is_detached

    backoff = Backoff()
    evicted: set[tuple[str, str]] = set()
    stalled_since: float | None = None
    while True:
        remaining = pods_to_move(pods_on(core_v1, nodes, deadline), nodes)
        if not remaining:
            return len(evicted)
        waiting: dict[str, str] = {}
        leaving = {
            p["metadata"]["namespace"]
            for p in remaining
            if is_detached(p) and not p["metadata"].get("deletionTimestamp")
        }
        for pod in remaining:
            meta = pod["metadata"]
            key = (meta["namespace"], meta["name"])
            where = f"pod {meta['namespace']}/{meta['name']} on {pod['spec']['nodeName']}"
            if meta.get("deletionTimestamp"):
                waiting[where] = "terminating"
                continue
            if handoff is not None and safely is not None and safely(pod):
                if not is_detached(pod):
                    if meta["namespace"] in leaving:  # one pod per namespace out of its Service at a time
                        waiting[where] = "waits for another pod to leave its Service"
                        continue
                    outcome = _evict(core_v1, pod, dry_run=True)  # may its budget lose it now?
                    if outcome == EVICTED:
                        handoff.detach([pod], deadline)
                        leaving.add(meta["namespace"])
                        waiting[where] = LEAVING
                    else:
                        waiting[where] = "terminating" if outcome == GONE else outcome
                    continue
                if not handoff.ready(pod, deadline):
                    waiting[where] = LEAVING
                    continue
            outcome = _evict(core_v1, pod)
            if outcome == EVICTED:
                log.info("evicted %s", where)
                evicted.add(key)
            waiting[where] = "terminating" if outcome in (EVICTED, GONE) else outcome
        blocked = all(why not in ("terminating", LEAVING) for why in waiting.values())
        stuck = unschedulable(list_pods(core_v1, deadline, "status.phase=Pending")) if blocked else {}
        held = bool(stuck)
        stalled_since = (stalled_since or time.monotonic()) if held else None
        if held and time.monotonic() - stalled_since >= stall_s:
            pod, why = next(iter(sorted(stuck.items())))
            raise DrainStalled(
                f"drain of {len(nodes)} claimed node(s) is stuck: {len(stuck)} evicted pod(s) cannot be "
                f"rescheduled (e.g. {pod}: {why}) and the {len(waiting)} pod(s) left on the claimed nodes "
                f"are held by their PodDisruptionBudget ({next(iter(waiting.values()))}). Claim other "
                "nodes (idle ones first), free capacity for inference, or relax the budget."
            )
        try:
            deadline.sleep(backoff.next(), "drain")
        except DeadlineExceeded:
            details = "; ".join(f"{pod}: {why}" for pod, why in sorted(waiting.items())[:10])
            raise DeadlineExceeded(
                f"drain of {len(nodes)} claimed node(s) not done within {deadline.seconds:g}s; "
                f"{len(waiting)} pod(s) still there: {details}"
            ) from None
