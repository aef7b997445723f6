"""Node lifecycle: condition taints and NoExecute eviction, as kube-controller-manager does.

* Taints from state (TaintNodesByCondition): ``Ready=False`` -> ``node.kubernetes.io/not-ready``,
  ``Ready=Unknown`` -> ``node.kubernetes.io/unreachable`` (each NoSchedule and NoExecute), and
  ``spec.unschedulable`` -> ``node.kubernetes.io/unschedulable:NoSchedule``; removed when the state
  clears.  Other taints are kept as they are, and the write is atomic, so no one's taint is lost.
* Taint eviction: a pod on a node with a NoExecute taint it does not tolerate is deleted at once;
  one it tolerates with ``tolerationSeconds`` is deleted when they run out, unless the taint goes
  first.  The pod first gets ``DisruptionTarget`` (``DeletionByTaintManager``); it is a plain
  delete (PodDisruptionBudgets do not apply), and the kubelet then stops it.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime

from trainops_devcluster.conditions import find_condition, set_condition
from trainops_devcluster.events import EventRecorder
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.podutil import delete_pod, is_deleting, is_terminal, node_of
from trainops_devcluster.scheduler import tolerates
from trainops_devcluster.store import NotFound, Store

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
MANAGED = (NOT_READY, UNREACHABLE, UNSCHEDULABLE)


def wanted_taints(node: dict) -> list[dict]:
    """The node's taints with the lifecycle ones made to match its state (others untouched)."""
    current = list((node.get("spec") or {}).get("taints") or [])
    ready = find_condition(node, "Ready")
    ready_status = (ready or {}).get("status", "True")
    wanted: list[tuple[str, str]] = []
    if ready_status == "False":
        wanted += [(NOT_READY, "NoSchedule"), (NOT_READY, "NoExecute")]
    elif ready_status == "Unknown":
        wanted += [(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")]
    if (node.get("spec") or {}).get("unschedulable"):
        wanted.append((UNSCHEDULABLE, "NoSchedule"))
    kept = [t for t in current if t.get("key") not in MANAGED or (t.get("key"), t.get("effect")) in wanted]
    have = {(t.get("key"), t.get("effect")) for t in kept}
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for key, effect in wanted:
        if (key, effect) not in have:
            kept.append(
                {"key": key, "effect": effect} | ({"timeAdded": stamp} if effect == "NoExecute" else {})
            )
    return kept


def eviction_delay(pod: dict, taints: list[dict]) -> float | None:
    """Seconds until the taint manager deletes ``pod`` for the NoExecute ``taints`` (0: now,
    ``None``: never), the smallest ``tolerationSeconds`` among the tolerations in use."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    used = []
    for taint in taints:
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        used += matching
    limits = [t["tolerationSeconds"] for t in used if t.get("tolerationSeconds") is not None]
    return max(0.0, float(min(limits))) if limits else None


class NodeLifecycle(InformerController):
    watches = ("nodes", "pods")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.events = EventRecorder(store, "node-controller")
        self._pods_on: dict[str, set[Key]] = {}
        self._evictions: dict[Key, tuple[int, float]] = {}  # pod -> (token, due) of its pending eviction
        self._tokens = itertools.count(1)

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "nodes":
            if new is not None:
                self._node_changed(old, new)
            return
        pod = new or old
        key = key_of(pod)
        if old is not None and node_of(old):
            self._pods_on.get(node_of(old), set()).discard(key)
        if new is None:
            self._evictions.pop(key, None)
            return
        if node_of(new):
            self._pods_on.setdefault(node_of(new), set()).add(key)
            self._check(new)

    def _node_changed(self, old: dict | None, new: dict) -> None:
        name = new["metadata"]["name"]
        if wanted_taints(new) != ((new.get("spec") or {}).get("taints") or []):

            def retaint(node: dict) -> None:
                node.setdefault("spec", {})["taints"] = wanted_taints(node)

            try:
                self.observe("nodes", self.store.mutate("nodes", "", name, retaint))
            except NotFound:
                pass
            return
        if old is None or _no_execute(old) != _no_execute(new):
            for key in list(self._pods_on.get(name, ())):
                pod = self.cache["pods"].get(key)
                if pod is not None:
                    self._check(pod)

    def _check(self, pod: dict) -> None:
        key = key_of(pod)
        node = self.cache["nodes"].get(("", node_of(pod)))
        taints = _no_execute(node) if node is not None else []
        delay = None if is_terminal(pod) or is_deleting(pod) or not taints else eviction_delay(pod, taints)
        if delay is None:
            self._evictions.pop(key, None)
            return
        due = time.monotonic() + delay
        if key in self._evictions and self._evictions[key][1] <= due:
            return
        token = next(self._tokens)
        self._evictions[key] = (token, due)
        self.after(delay, lambda: self._evict(key, pod["metadata"]["uid"], token))

    def _evict(self, key: Key, uid: str, token: int) -> None:
        if self._evictions.get(key, (None,))[0] != token:
            return
        del self._evictions[key]

        def mark(pod: dict) -> None:
            if pod["metadata"]["uid"] != uid or is_deleting(pod) or is_terminal(pod):
                raise NotFound("no longer to evict")
            set_condition(
                pod,
                "DisruptionTarget",
                "True",
                "DeletionByTaintManager",
                "Taint manager: deleting due to NoExecute taint",
            )

        try:
            pod = self.store.mutate("pods", *key, mark)
        except NotFound:
            return
        self.events.record(pod, "TaintManagerEviction", f"Marking for deletion Pod {key[0]}/{key[1]}")
        delete_pod(self.store, *key, uid=uid)


def _no_execute(node: dict) -> list[dict]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
