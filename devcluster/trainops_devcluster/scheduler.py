"""The simulated kube-scheduler: binds pending pods to nodes.

Filters as kube-scheduler's default plugins do, in their order: NodeUnschedulable,
TaintToleration (NoSchedule and NoExecute), NodeAffinity (nodeSelector and required node
affinity) and NodeResourcesFit (allocatable minus what bound, unfinished pods request, plus the
pod count).  Among the nodes that fit it takes the next one round-robin, which spreads pods
like the default LeastAllocated scoring.  A pod that fits nowhere stays Pending with
``PodScheduled=False``/``Unschedulable`` and the real message, and is retried when nodes change
or capacity is freed.

To scale to tens of thousands of pods, the label/taint filters are computed once per distinct
pod scheduling constraint ("signature") and node set, and failures are remembered per signature
and request until something changes.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field

from trainops_devcluster.conditions import find_condition, set_condition
from trainops_devcluster.events import WARNING, EventRecorder
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.podutil import is_deleting, is_terminal, milli, node_of, pod_requests
from trainops_devcluster.store import NotFound, Store, StoreError

SCHEDULER_NAME = "default-scheduler"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
RETRY_DELAY_S = 0.02
RESOURCE_ORDER = ("cpu", "memory", "ephemeral-storage")  # checked first, as NodeResourcesFit does
CONDITION_REFRESH_S = 1.0  # rewrite an unchanged reason's message at most this often per pod


@dataclass
class NodeInfo:
    name: str
    labels: dict
    taints: list
    unschedulable: bool
    allocatable: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


def tolerates(toleration: dict, taint: dict) -> bool:
    """``Toleration.ToleratesTaint`` of k8s.io/api: effect and key must match unless empty;
    ``Exists`` ignores the value, ``Equal`` (the default) compares it."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(tolerations: list, taints: list, effects: tuple[str, ...]) -> dict | None:
    """The first taint with one of ``effects`` that no toleration tolerates."""
    for taint in taints:
        if taint.get("effect") in effects and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _requirement_matches(requirement: dict, values: dict) -> bool:
    key, operator = requirement.get("key"), requirement.get("operator")
    wanted = requirement.get("values") or []
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            number, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def matches_node_selector_term(term: dict, node: NodeInfo) -> bool:
    """A NodeSelectorTerm: its expressions (labels) and fields (``metadata.name``) all match; an empty term matches nothing."""
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(_requirement_matches(r, node.labels) for r in expressions) and all(
        _requirement_matches(r, {"metadata.name": node.name}) for r in fields
    )


@dataclass(frozen=True)
class Signature:
    """Everything but resources that decides where a pod may go."""

    node_selector: tuple
    affinity_terms: str | None  # JSON of requiredDuringScheduling... nodeSelectorTerms, None if absent
    tolerations: str

    @classmethod
    def of(cls, pod: dict) -> Signature:
        spec = pod.get("spec") or {}
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or None
        terms = (
            None if required is None else json.dumps(required.get("nodeSelectorTerms") or [], sort_keys=True)
        )
        return cls(
            tuple(sorted((spec.get("nodeSelector") or {}).items())),
            terms,
            json.dumps(spec.get("tolerations") or [], sort_keys=True),
        )

    @functools.cached_property
    def _tolerations(self) -> list:
        return json.loads(self.tolerations)

    @functools.cached_property
    def _terms(self) -> list | None:
        return None if self.affinity_terms is None else json.loads(self.affinity_terms)

    def static_failure(self, node: NodeInfo) -> str | None:
        """Why the node is out before resources are looked at, as kube-scheduler words it; None if it passes."""
        tolerations = self._tolerations
        if node.unschedulable and not any(
            tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}) for t in tolerations
        ):
            return "node(s) were unschedulable"
        taint = untolerated_taint(tolerations, node.taints, ("NoSchedule", "NoExecute"))
        if taint is not None:
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
        if any(node.labels.get(k) != v for k, v in self.node_selector):
            return "node(s) didn't match Pod's node affinity/selector"
        if self._terms is not None and not any(
            matches_node_selector_term(term, node) for term in self._terms
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        return None


@dataclass
class Feasible:
    """The nodes a signature may use, why the others are out, and where round-robin continues."""

    nodes: list[str]
    rejected: dict[str, int]
    cursor: int = 0


def insufficient(node: NodeInfo, requests: dict[str, int]) -> list[str]:
    """NodeResourcesFit's reasons for one node (empty when the pod fits)."""
    reasons = ["Too many pods"] if node.pods + 1 > node.allocatable.get("pods", 10**12) // 1000 else []
    ordered = [r for r in RESOURCE_ORDER if r in requests] + sorted(
        r for r in requests if r not in RESOURCE_ORDER
    )
    for resource in ordered:
        if requests[resource] > 0 and requests[resource] > node.free(resource):
            reasons.append(f"Insufficient {resource}")
    return reasons


class Scheduler(InformerController):
    watches = ("nodes", "pods")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.events = EventRecorder(store, SCHEDULER_NAME)
        self.nodes: dict[str, NodeInfo] = {}
        self._bound: dict[Key, tuple[str, dict[str, int]]] = {}  # pod -> (node, requests) counted on the node
        self._unschedulable: dict[Key, dict] = {}  # pods waiting for the cluster to change
        self._feasible: dict[Signature, Feasible] = {}
        self._known_failures: dict[tuple[Signature, tuple], str] = {}
        self._retry_pending = False
        self._condition_written: dict[Key, float] = {}

    # ---- cache maintenance -------------------------------------------------------------
    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "nodes":
            self._node_changed(old, new)
        else:
            self._pod_changed(old, new)

    def _node_changed(self, old: dict | None, new: dict | None) -> None:
        if new is None:
            self.nodes.pop(old["metadata"]["name"], None)
            self._cluster_changed(topology=True)
            return
        name = new["metadata"]["name"]
        current = self.nodes.get(name)
        info = NodeInfo(
            name=name,
            labels=dict(new["metadata"].get("labels") or {}),
            taints=list((new.get("spec") or {}).get("taints") or []),
            unschedulable=bool((new.get("spec") or {}).get("unschedulable")),
            allocatable={
                k: milli(v) for k, v in ((new.get("status") or {}).get("allocatable") or {}).items()
            },
        )
        if current is None:
            for node_name, requests in self._bound.values():
                if node_name == name:
                    info.pods += 1
                    for resource, amount in requests.items():
                        info.requested[resource] = info.requested.get(resource, 0) + amount
        else:
            info.requested, info.pods = current.requested, current.pods
            same_shape = (current.labels, current.taints, current.unschedulable) == (
                info.labels,
                info.taints,
                info.unschedulable,
            )
            if same_shape and current.allocatable == info.allocatable:
                self.nodes[name] = info
                return
        self.nodes[name] = info
        self._cluster_changed(topology=True)

    def _pod_changed(self, old: dict | None, new: dict | None) -> None:
        key = key_of(old or new)
        gone = new is None or (old is not None and old["metadata"]["uid"] != new["metadata"]["uid"])
        if gone:
            self._unschedulable.pop(key, None)
            self._condition_written.pop(key, None)
            if self._release(key):
                self._cluster_changed()
            if new is None:
                return
        if node_of(new):
            self._unschedulable.pop(key, None)
            self._condition_written.pop(key, None)
            if is_terminal(new):
                if self._release(key):
                    self._cluster_changed()
            elif key not in self._bound:
                self._account(key, node_of(new), pod_requests(new))
            return
        if (
            is_deleting(new)
            or is_terminal(new)
            or new["spec"].get("schedulerName", SCHEDULER_NAME) != SCHEDULER_NAME
        ):
            self._unschedulable.pop(key, None)
            return
        waiting = self._unschedulable.get(key)
        if waiting is not None and _scheduling_inputs(waiting) == _scheduling_inputs(new):
            self._unschedulable[key] = new  # a status-only change, e.g. our own condition
            return
        self._unschedulable.pop(key, None)
        self._schedule(new)

    def _account(self, key: Key, node_name: str, requests: dict[str, int]) -> None:
        self._bound[key] = (node_name, requests)
        node = self.nodes.get(node_name)
        if node is not None:
            node.pods += 1
            for resource, amount in requests.items():
                node.requested[resource] = node.requested.get(resource, 0) + amount

    def _release(self, key: Key) -> bool:
        entry = self._bound.pop(key, None)
        if entry is None:
            return False
        node = self.nodes.get(entry[0])
        if node is not None:
            node.pods -= 1
            for resource, amount in entry[1].items():
                node.requested[resource] = node.requested.get(resource, 0) - amount
        return True

    def _cluster_changed(self, topology: bool = False) -> None:
        """Forget what is no longer true and retry the unschedulable pods soon (once per burst)."""
        if topology:
            self._feasible.clear()
        self._known_failures.clear()
        if self._unschedulable and not self._retry_pending:
            self._retry_pending = True
            self.after(RETRY_DELAY_S, self._retry)

    def _retry(self) -> None:
        self._retry_pending = False
        for key, pod in list(self._unschedulable.items()):
            if self._unschedulable.get(key) is pod:
                del self._unschedulable[key]
                self._schedule(pod)

    # ---- scheduling --------------------------------------------------------------------
    def _schedule(self, pod: dict) -> None:
        if pod["spec"].get("schedulingGates"):
            self._mark_unschedulable(
                pod, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
            )
            return
        signature = Signature.of(pod)
        requests = pod_requests(pod)
        memo = (signature, tuple(sorted(requests.items())))
        message = self._known_failures.get(memo)
        if message is None:
            node_name, message = self._find_node(signature, requests)
            if node_name is not None:
                self._bind(pod, node_name)
                return
            self._known_failures[memo] = message
        self._mark_unschedulable(pod, "Unschedulable", message)

    def _feasible_for(self, signature: Signature) -> Feasible:
        feasible = self._feasible.get(signature)
        if feasible is None:
            nodes, rejected = [], {}
            for name in sorted(self.nodes):
                reason = signature.static_failure(self.nodes[name])
                if reason is None:
                    nodes.append(name)
                else:
                    rejected[reason] = rejected.get(reason, 0) + 1
            feasible = self._feasible[signature] = Feasible(nodes, rejected)
        return feasible

    def _find_node(self, signature: Signature, requests: dict[str, int]) -> tuple[str | None, str]:
        feasible = self._feasible_for(signature)
        count = len(feasible.nodes)
        for step in range(count):
            index = (feasible.cursor + step) % count
            if not insufficient(self.nodes[feasible.nodes[index]], requests):
                feasible.cursor = index + 1
                return feasible.nodes[index], ""
        histogram = dict(feasible.rejected)
        for name in feasible.nodes:
            for reason in insufficient(self.nodes[name], requests):
                histogram[reason] = histogram.get(reason, 0) + 1
        return None, self._fit_error(histogram, count)

    def _fit_error(self, histogram: dict[str, int], resource_bound: int) -> str:
        total = len(self.nodes)
        reasons = sorted(f"{n} {reason}" for reason, n in histogram.items())
        message = f"0/{total} nodes are available" + (f": {', '.join(reasons)}." if reasons else ".")
        preemption = []
        if resource_bound:
            preemption.append(f"{resource_bound} No preemption victims found for incoming pod")
        if total - resource_bound:
            preemption.append(f"{total - resource_bound} Preemption is not helpful for scheduling")
        return f"{message} preemption: 0/{total} nodes are available: {', '.join(sorted(preemption))}."

    def _bind(self, pod: dict, node_name: str) -> None:
        namespace, name = key_of(pod)
        uid = pod["metadata"]["uid"]

        def bind(current: dict) -> None:
            if current["metadata"]["uid"] != uid or node_of(current) or is_deleting(current):
                raise _Skip
            current["spec"]["nodeName"] = node_name
            set_condition(current, "PodScheduled", "True")

        try:
            bound = self.store.mutate("pods", namespace, name, bind)
        except (_Skip, NotFound):
            return
        self.observe("pods", bound)
        self.events.record(bound, "Scheduled", f"Successfully assigned {namespace}/{name} to {node_name}")

    def _mark_unschedulable(self, pod: dict, reason: str, message: str) -> None:
        """Keep the pod waiting and say why (an unchanged reason's message is refreshed at most
        every CONDITION_REFRESH_S, so retries of thousands of pods do not turn into writes)."""
        key = key_of(pod)
        uid = pod["metadata"]["uid"]
        self._unschedulable[key] = pod
        first = key not in self._condition_written
        if not first and time.monotonic() - self._condition_written[key] < CONDITION_REFRESH_S:
            current = find_condition(pod, "PodScheduled")
            if current is not None and current.get("reason") == reason:
                return

        def mark(current: dict) -> None:
            if current["metadata"]["uid"] != uid or node_of(current):
                raise _Skip
            if not set_condition(current, "PodScheduled", "False", reason, message):
                raise _Skip

        try:
            updated = self.store.mutate("pods", key[0], key[1], mark)
        except _Skip:
            return
        except StoreError:
            self._unschedulable.pop(key, None)
            return
        self._condition_written[key] = time.monotonic()
        self.observe("pods", updated)
        if first and reason == "Unschedulable":
            self.events.record(updated, "FailedScheduling", message, WARNING)


class _Skip(Exception):
    """The pod changed under us; leave it alone."""


def _scheduling_inputs(pod: dict) -> tuple:
    spec = pod.get("spec") or {}
    return (
        Signature.of(pod),
        json.dumps(pod_requests(pod), sort_keys=True),
        bool(spec.get("schedulingGates")),
        pod["metadata"].get("uid"),
    )
