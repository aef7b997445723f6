"""Kueue's Topology Aware Scheduling (TAS), as the devcluster plays it (``reference/kueue.md`` §1.7).

After Kueue's own code (main: ``pkg/cache/scheduler/tas_flavor_snapshot.go``, ``pkg/util/tas/``,
``pkg/controller/tas/``, ``pkg/podset/podset.go``):

- A ResourceFlavor with ``spec.topologyName`` is a TAS flavor; its Topology lists the levels (node
  labels, widest first).  A PodSet asks for TAS with a pod-template annotation
  (``kueue.x-k8s.io/podset-required-topology``, ``-preferred-topology``, ``-unconstrained-topology``),
  or implicitly when every flavor of its ClusterQueue is a TAS flavor (then it is unconstrained).
  One whose pods request nothing the queue covers has no TAS flavor (``kueue_scheduler``).
- Capacity per node: only nodes of the flavor (its ``nodeLabels``), Ready, schedulable and carrying
  every level's label; their allocatable minus what the pods TAS does not manage request, minus the
  admitted TAS Workloads' assignments.  With ``kubernetes.io/hostname`` as the last level a node is
  also left out for a taint the pods do not tolerate (NoSchedule, NoExecute), their nodeSelector (the
  flavor's nodeLabels included) or their required node affinity (not before 0.13.10 / 0.14.5:
  ``KueueConfig.controller_version``); the message counts them.  Pod (anti-)affinity is never looked
  at, as in every Kueue release: two pods that fit one node's capacity may be assigned to it.
- "BestFit": at the requested level (the lowest for unconstrained), the domain with the least
  capacity that holds every pod; none: required fails, preferred tries the level above, and the
  widest level takes domains largest first, the best fit for the last.  Then level by level down,
  the child domains of everything chosen so far largest first, the best fit for the last.
- The assignment: ``levels`` (only the hostname when that is the last level) and per node the pods
  (v1beta1 ``domains``; v1beta2 one compact slice).  Failure: ``TopologyPlacementFailed`` (0.13:
  ``Pending``) with ``couldn't assign flavors to pod set <ps>: topology "<t>" doesn't allow to fit any
  of N pod(s)`` or ``allows to fit only K out of N pod(s)``, then (v1beta2) ``. Total nodes: T;
  excluded: ...``.
- Hot swap: a node of an admitted assignment that is gone, not Ready or has a taint the pods do not
  tolerate, once none of the Workload's pods still runs there, is recorded in ``status.unhealthyNodes``
  and replaced by a node inside the required domain (anywhere for preferred); no replacement evicts the
  Workload with reason ``NodeFailures`` (``TASFailedNodeReplacementFailFast``), as do two failed nodes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from trainops.kube.kueue import topology_domains
from trainops_devcluster.conditions import find_condition
from trainops_devcluster.kueue_api import GROUP
from trainops_devcluster.podutil import is_deleting, is_terminal, milli, node_of, pod_requests
from trainops_devcluster.scheduler import NodeInfo, matches_node_selector_term, untolerated_taint

TOPOLOGIES = f"topologies.{GROUP}"
GATE = f"{GROUP}/topology"
REQUIRED = f"{GROUP}/podset-required-topology"
PREFERRED = f"{GROUP}/podset-preferred-topology"
UNCONSTRAINED = f"{GROUP}/podset-unconstrained-topology"
POD_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
HOSTNAME = "kubernetes.io/hostname"
PLACEMENT_FAILED = "TopologyPlacementFailed"
NODE_FAILURES = "NodeFailures"
SCHEDULING_TAINTS = ("NoSchedule", "NoExecute")


def topology_request(template: dict) -> dict:
    """The PodSet's ``topologyRequest`` from its pod template's annotations, as Kueue's Job
    integration builds it (the completion index is the pod's rank)."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    request: dict = {}
    if REQUIRED in annotations:
        request["required"] = annotations[REQUIRED]
    elif PREFERRED in annotations:
        request["preferred"] = annotations[PREFERRED]
    elif UNCONSTRAINED in annotations:
        request["unconstrained"] = str(annotations[UNCONSTRAINED]).lower() == "true"
    return {**request, "podIndexLabel": POD_INDEX_LABEL}


def explicit(request: dict | None) -> bool:
    return any(key in (request or {}) for key in ("required", "preferred", "unconstrained"))


def is_tas_pod(pod: dict) -> bool:
    annotations = pod["metadata"].get("annotations") or {}
    return any(key in annotations for key in (REQUIRED, PREFERRED, UNCONSTRAINED))


def taint_text(taint: dict) -> str:
    """``Taint.ToString()``: ``key=value:Effect``."""
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


# ---- the Workload's assignment, per API version -------------------------------------------------
def encode(levels: list[str], domains: list[tuple[list[str], int]], version: str) -> dict:
    """A ``topologyAssignment``: v1beta1 ``domains``; v1beta2 one slice, each level universal when
    every domain shares its value, else individual with the common prefix and suffix taken out."""
    if version == "v1beta1":
        return {
            "levels": levels,
            "domains": [{"values": values, "count": count} for values, count in domains],
        }
    counts = [count for _, count in domains]
    per_level = []
    for index in range(len(levels)):
        values = [domain[index] for domain, _ in domains]
        per_level.append(_compact(values))
    part = {
        "domainCount": len(domains),
        "valuesPerLevel": per_level,
        "podCounts": {"universal": counts[0]} if len(set(counts)) == 1 else {"individual": counts},
    }
    return {"levels": levels, "slices": [part]}


def _compact(values: list[str]) -> dict:
    if len(set(values)) == 1:
        return {"universal": values[0]}
    shortest = min(len(v) for v in values)
    prefix = 0
    while prefix < shortest and len({v[prefix] for v in values}) == 1:
        prefix += 1
    suffix = 0
    while suffix < shortest - prefix and len({v[len(v) - 1 - suffix] for v in values}) == 1:
        suffix += 1
    individual: dict = {"roots": [v[prefix : len(v) - suffix] for v in values]}
    if prefix:
        individual["prefix"] = values[0][:prefix]
    if suffix:
        individual["suffix"] = values[0][len(values[0]) - suffix :]
    return {"individual": individual}


# ---- capacity -----------------------------------------------------------------------------------
@dataclass
class _Leaf:
    node: NodeInfo
    values: tuple[str, ...]  # one per level
    free: Counter = field(default_factory=Counter)  # thousandths


@dataclass
class _Domain:
    values: tuple[str, ...]
    children: list[_Domain] = field(default_factory=list)
    leaf: _Leaf | None = None
    count: int = 0  # pods it can take, then pods assigned


@dataclass
class _Stats:
    total: int = 0
    node_selector: int = 0
    affinity: int = 0
    topology_domain: int = 0
    taints: Counter = field(default_factory=Counter)
    resources: Counter = field(default_factory=Counter)

    def text(self) -> str:
        reasons = []
        for name, value in (("nodeSelector", self.node_selector), ("affinity", self.affinity)):
            if value:
                reasons.append(f"{name}: {value}")
        if self.topology_domain:
            reasons.append(f"topologyDomain: {self.topology_domain}")
        reasons += [f'taint "{key}": {self.taints[key]}' for key in sorted(self.taints)]
        reasons += [f'resource "{key}": {self.resources[key]}' for key in sorted(self.resources)]
        return f". Total nodes: {self.total}; excluded: {', '.join(reasons)}" if reasons else ""


class FlavorSnapshot:
    """One TAS flavor's nodes and their free capacity, for one scheduling pass."""

    def __init__(
        self,
        topology: str,
        levels: list[str],
        flavor: dict,
        nodes: list[dict],
        version: str,
        *,
        node_affinity: bool = True,
    ) -> None:
        self.topology, self.levels, self.version = topology, levels, version
        self.node_affinity = node_affinity  # False: a release before 0.13.10 / 0.14.5 (kueue#7728)
        spec = flavor.get("spec") or {}
        self.flavor_labels = spec.get("nodeLabels") or {}
        self.flavor_tolerations = spec.get("tolerations") or []
        self.leaves: dict[str, _Leaf] = {}
        for node in nodes:
            labels = node["metadata"].get("labels") or {}
            ready = (find_condition(node, "Ready") or {}).get("status") == "True"
            if (
                not ready
                or (node.get("spec") or {}).get("unschedulable")
                or any(labels.get(k) != v for k, v in self.flavor_labels.items())
                or any(not labels.get(level) for level in levels)
            ):
                continue
            allocatable = {
                k: milli(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
            }
            info = NodeInfo(
                node["metadata"]["name"],
                labels,
                (node.get("spec") or {}).get("taints") or [],
                False,
                allocatable,
            )
            self.leaves[info.name] = _Leaf(
                info, tuple(labels[level] for level in levels), Counter(allocatable)
            )

    @property
    def lowest_is_node(self) -> bool:
        return self.levels[-1] == HOSTNAME

    def subtract_pods(self, pods: list[dict]) -> None:
        """What the pods TAS does not manage hold on the nodes (bound, not finished)."""
        for pod in pods:
            leaf = self.leaves.get(node_of(pod))
            if leaf is not None and not is_terminal(pod) and not is_tas_pod(pod):
                leaf.free.subtract(_with_pod(pod_requests(pod)))

    def subtract_assignment(
        self, levels: list[str], domains: list[tuple[list[str], int]], per_pod: dict
    ) -> None:
        """What an admitted TAS Workload's PodSet holds."""
        by_values = {leaf.values[-len(levels) :]: leaf for leaf in self.leaves.values()}
        for values, count in domains:
            leaf = by_values.get(tuple(values))
            if leaf is not None:
                for resource, amount in per_pod.items():
                    leaf.free[resource] -= amount * count

    # ---- placement ------------------------------------------------------------------------------
    def find(
        self, count: int, request: dict | None, pod_spec: dict, within: tuple[str, ...] = ()
    ) -> tuple[list[tuple[list[str], int]] | None, str]:
        """(levels' values, pods) per node for ``count`` pods of ``pod_spec``, or ``(None, why)``;
        ``within``: only nodes under this domain (a replacement inside the required domain)."""
        request = request or {}
        key = request.get("required") or request.get("preferred") or self.levels[-1]
        if key not in self.levels:
            return None, f"no requested topology level: {key}"
        index = self.levels.index(key)
        required, unconstrained = (
            "required" in request,
            "preferred" not in request and "required" not in request,
        )
        per_pod = _with_pod(pod_requests({"spec": pod_spec}))
        per_level, stats = self._fill(per_pod, pod_spec, within)
        chosen, at, failure = self._fit_level(per_level, index, count, required, unconstrained, stats)
        if chosen is None:
            return None, failure
        chosen = _minimum(chosen, count)
        for _ in range(at, len(self.levels) - 1):
            children = _sorted([child for domain in chosen for child in domain.children])
            chosen = _minimum(children, count)
        leaves = sorted((d for d in chosen if d.count > 0), key=lambda d: d.values)
        start = len(self.levels) - 1 if self.lowest_is_node else 0
        return [(list(d.values[start:]), d.count) for d in leaves], ""

    def required_domain(self, request: dict, kept: list[tuple[list[str], int]]) -> tuple[str, ...]:
        """The domain a replacement must stay in: the required level's domain of the pods that stay
        (none for preferred or unconstrained, or when no pod stays)."""
        level = (request or {}).get("required")
        leaf = self.leaves.get(kept[0][0][-1]) if kept and level in self.levels else None
        return leaf.values[: self.levels.index(level) + 1] if leaf else ()

    def assignment_levels(self) -> list[str]:
        return self.levels[-1:] if self.lowest_is_node else list(self.levels)

    def _fill(
        self, per_pod: dict, pod_spec: dict, within: tuple[str, ...]
    ) -> tuple[list[dict[tuple, _Domain]], _Stats]:
        stats = _Stats()
        tolerations = (pod_spec.get("tolerations") or []) + self.flavor_tolerations
        selector = {**(pod_spec.get("nodeSelector") or {}), **self.flavor_labels}
        required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        if not self.node_affinity:  # 0.13.0-0.13.9, 0.14.0-0.14.4: placed as if it had none
            required = None
        per_level: list[dict[tuple, _Domain]] = [{} for _ in self.levels]
        for leaf in sorted(self.leaves.values(), key=lambda lf: lf.values):
            stats.total += 1
            count = 0
            if self.lowest_is_node and (
                taint := untolerated_taint(tolerations, leaf.node.taints, SCHEDULING_TAINTS)
            ):
                stats.taints[taint_text(taint)] += 1
            elif self.lowest_is_node and any(leaf.node.labels.get(k) != v for k, v in selector.items()):
                stats.node_selector += 1
            elif (
                self.lowest_is_node
                and required is not None
                and not any(
                    matches_node_selector_term(t, leaf.node) for t in required.get("nodeSelectorTerms") or []
                )
            ):
                stats.affinity += 1
            elif leaf.values[: len(within)] != within:
                stats.topology_domain += 1
            else:
                count, limiting = _count_in(leaf.free, per_pod)
                if count == 0 and limiting:
                    stats.resources[limiting] += 1
            parent = None
            for depth in range(len(self.levels)):
                key = leaf.values[: depth + 1]
                domain = per_level[depth].get(key)
                if domain is None:
                    domain = per_level[depth][key] = _Domain(key)
                    if parent is not None:
                        parent.children.append(domain)
                domain.count += count
                parent = domain
            parent.leaf = leaf
        return per_level, stats

    def _fit_level(
        self,
        per_level: list[dict[tuple, _Domain]],
        index: int,
        count: int,
        required: bool,
        unconstrained: bool,
        stats: _Stats,
    ) -> tuple[list[_Domain] | None, int, str]:
        domains = _sorted(per_level[index].values())
        if not domains:
            return None, 0, f"no topology domains at level: {self.levels[index]}"
        top = domains[0]
        if top.count >= count:
            return [_best_fit(domains, count)], index, ""
        if required:
            return None, 0, self._not_fit(top.count, count, stats)
        if index > 0 and not unconstrained:
            return self._fit_level(per_level, index - 1, count, required, unconstrained, stats)
        results, remaining = [], count
        for i, domain in enumerate(domains):
            if remaining <= 0:
                break
            if domain.count >= remaining:
                domain = _best_fit(domains[i:], remaining)
            results.append(domain)
            remaining -= domain.count
        if remaining > 0:
            return None, 0, self._not_fit(count - remaining, count, stats)
        return results, index, ""

    def _not_fit(self, fit: int, count: int, stats: _Stats) -> str:
        head = (
            f'topology "{self.topology}" doesn\'t allow to fit any of {count} pod(s)'
            if fit == 0
            else f'topology "{self.topology}" allows to fit only {fit} out of {count} pod(s)'
        )
        return head + (stats.text() if self.version != "v1beta1" else "")


def _with_pod(requests: dict[str, int]) -> Counter:
    return Counter({**requests, "pods": requests.get("pods", 0) + 1000})


def _count_in(free: Counter, per_pod: Counter) -> tuple[int, str]:
    """How many pods fit in ``free``, and the resource that limits it."""
    fits = {r: max(0, free.get(r, 0)) // amount for r, amount in per_pod.items() if amount > 0}
    if not fits:
        return 0, ""
    least = min(fits.values())
    return least, min(r for r, n in fits.items() if n == least)


def _sorted(domains) -> list[_Domain]:
    """Kueue's BestFit order: most capacity first, then by the level values."""
    return sorted(domains, key=lambda d: (-d.count, d.values))


def _best_fit(domains: list[_Domain], needed: int) -> _Domain:
    best = None
    for domain in domains:
        if domain.count >= needed and (best is None or domain.count < best.count):
            best = domain
    return best or domains[0]


def _minimum(domains: list[_Domain], count: int) -> list[_Domain]:
    """``updateCountsToMinimum``: take domains in order, the best fit for the last; the domains'
    ``count`` becomes the pods assigned to each (copies: the snapshot's counts stay)."""
    result, remaining = [], count
    for i, domain in enumerate(domains):
        if domain.count >= remaining:
            domain = _best_fit(domains[i:], remaining)
            result.append(_Domain(domain.values, domain.children, domain.leaf, remaining))
            return result
        if domain.count > 0:
            result.append(_Domain(domain.values, domain.children, domain.leaf, domain.count))
            remaining -= domain.count
    return result


def pod_domains(levels: list[str], domains: list[tuple[list[str], int]]) -> list[dict[str, str]]:
    """The node selector of each rank, in rank order (the ungater's ``rankToDomainID``)."""
    return list(
        itertools.chain.from_iterable(
            [dict(zip(levels, values, strict=True))] * count for values, count in domains
        )
    )


def assignment_usage(
    podset: dict, podset_assignment: dict
) -> tuple[list[str], list[tuple[list[str], int]], dict]:
    """(levels, domains, per-pod requests) an admitted PodSet holds."""
    levels, domains = topology_domains(podset_assignment)
    return (
        levels,
        domains,
        _with_pod(pod_requests({"spec": (podset.get("template") or {}).get("spec") or {}})),
    )


def pod_progressing(pod: dict) -> bool:
    """Still running (or about to) on its node: neither finished nor being deleted."""
    return not is_terminal(pod) and not is_deleting(pod)
