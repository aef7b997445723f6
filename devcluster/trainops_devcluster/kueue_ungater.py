"""Kueue's TAS controllers on pods and nodes (``pkg/controller/tas/topology_ungater.go``,
``node_controller.go``), for the devcluster's ``kueue_tas``.

- The ungater: a pod held by the ``kueue.x-k8s.io/topology`` scheduling gate whose Workload has a
  topology assignment gets the node selector of its rank's domain (rank: the Job completion index;
  the assignment's domains in order, each repeated for its pods) and loses the gate.
- Node failures: a node of an admitted assignment that is gone, not Ready, or carries a
  NoSchedule/NoExecute taint the Workload's pods do not tolerate is failed once none of the
  Workload's pods is still running there (``TASReplaceNodeOnPodTermination``, ``...OnNodeTaints``): it
  goes to ``status.unhealthyNodes`` (the Kueue scheduler then replaces it, or evicts); a second failed
  node evicts the Workload with reason ``NodeFailures`` at once.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from trainops.kube.kueue import topology_domains
from trainops_devcluster.conditions import find_condition, set_condition
from trainops_devcluster.informer import InformerController, key_of
from trainops_devcluster.kueue_api import (
    EVICTED,
    PODSET_LABEL,
    WORKLOAD_ANNOTATION,
    WORKLOADS,
    has_quota,
    is_finished,
)
from trainops_devcluster.kueue_tas import GATE, HOSTNAME, NODE_FAILURES, POD_INDEX_LABEL, pod_domains
from trainops_devcluster.podutil import is_deleting, is_terminal, node_of
from trainops_devcluster.scheduler import untolerated_taint
from trainops_devcluster.store import NotFound

MULTIPLE_FAILURES = "Workload eviction triggered due to multiple TAS assigned node failures, including: {}"


class TopologyUngater(InformerController):
    watches = ("pods", "nodes", WORKLOADS)

    def __init__(self, store) -> None:
        super().__init__(store)
        # node -> the unfinished Workloads placed on it, so that a node's change costs what is on it,
        # not a scan of every Workload the cluster ever ran (a burst of node writes fell minutes behind)
        self._placed: dict[str, set] = defaultdict(set)
        self._nodes_of: dict = {}  # Workload key -> the nodes it is indexed under

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        if resource == WORKLOADS:
            self._index(key_of(obj), new)
            self.mark(("workload", key_of(obj)))
        elif resource == "pods":
            workload = (obj["metadata"].get("annotations") or {}).get(WORKLOAD_ANNOTATION)
            if workload:
                self.mark(("workload", (obj["metadata"]["namespace"], workload)))
        else:  # a node changed: every Workload placed on it
            for key in sorted(self._placed.get(obj["metadata"]["name"], ())):
                self.mark(("workload", key))

    def _index(self, key, workload: dict | None) -> None:
        for node in self._nodes_of.pop(key, ()):
            self._placed[node].discard(key)
        if workload is not None and not is_finished(workload):
            self._nodes_of[key] = _assigned_nodes(workload)
            for node in self._nodes_of[key]:
                self._placed[node].add(key)

    def reconcile(self, keys: set) -> None:
        for _, key in keys:
            workload = self.cache[WORKLOADS].get(key)
            if workload is None or not has_quota(workload) or is_finished(workload):
                continue
            pods = [
                p
                for p in self.cache["pods"].values()
                if p["metadata"].get("namespace") == key[0]
                and (p["metadata"].get("annotations") or {}).get(WORKLOAD_ANNOTATION) == key[1]
            ]
            self._ungate(workload, pods)
            self._check_nodes(workload, pods)

    # ---- the ungater ------------------------------------------------------------------------------
    def _ungate(self, workload: dict, pods: list[dict]) -> None:
        for assignment in workload["status"]["admission"].get("podSetAssignments") or []:
            levels, domains = topology_domains(assignment)
            mine = [
                p
                for p in pods
                if (p["metadata"].get("labels") or {}).get(PODSET_LABEL) == assignment["name"]
                and not is_terminal(p)
            ]
            for pod, selector in _pods_to_domains(levels, domains, mine):
                self._release(pod, selector)

    def _release(self, pod: dict, selector: dict[str, str]) -> None:
        def ungate(p: dict) -> None:
            spec = p["spec"]
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **selector}
            spec["schedulingGates"] = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GATE]
            if not spec["schedulingGates"]:
                del spec["schedulingGates"]

        try:
            self.observe("pods", self.store.mutate("pods", *key_of(pod), ungate))
        except NotFound:
            pass

    # ---- failed nodes -----------------------------------------------------------------------------
    def _check_nodes(self, workload: dict, pods: list[dict]) -> None:
        recorded = [n.get("name") for n in workload["status"].get("unhealthyNodes") or []]
        tolerations = (workload["spec"]["podSets"][0].get("template") or {}).get("spec", {}).get(
            "tolerations"
        ) or []
        for name in sorted(_assigned_nodes(workload)):
            if name in recorded or not self._failed(name, tolerations):
                continue
            if any(_runs_on(pod, name) for pod in pods):
                continue  # TASReplaceNodeOnPodTermination: wait until its pods stopped running there
            self._record(workload, name, recorded)
            return

    def _failed(self, name: str, tolerations: list) -> bool:
        node = self.cache["nodes"].get(("", name))
        if node is None or (find_condition(node, "Ready") or {}).get("status") != "True":
            return True
        taints = (node.get("spec") or {}).get("taints") or []
        return untolerated_taint(tolerations, taints, ("NoSchedule", "NoExecute")) is not None

    def _record(self, workload: dict, node: str, recorded: list[str]) -> None:
        def change(w: dict) -> None:
            if recorded:  # a second failure: no hot swap, evicted now
                message = MULTIPLE_FAILURES.format(", ".join([*recorded, node]))
                set_condition(w, EVICTED, "True", NODE_FAILURES, message)
                return
            w["status"]["unhealthyNodes"] = [{"name": node}]

        try:
            self.observe(WORKLOADS, self.store.mutate(WORKLOADS, *key_of(workload), change))
        except NotFound:
            pass


def _gated(pod: dict) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or [])


def _pods_to_domains(levels: list[str], domains: list, pods: list[dict]) -> list[tuple[dict, dict[str, str]]]:
    """Which gated pod goes to which domain: by rank (the completion index) while every released pod
    sits where its rank says; else greedily, the domains' free places in order (Kueue's fallback after
    a node was replaced)."""
    by_rank = pod_domains(levels, domains)
    ranks = [(p["metadata"].get("labels") or {}).get(POD_INDEX_LABEL, "") for p in pods]
    if all(r.isdigit() and int(r) < len(by_rank) for r in ranks) and all(
        _gated(p)
        or all((p["spec"].get("nodeSelector") or {}).get(k) == v for k, v in by_rank[int(r)].items())
        for p, r in zip(pods, ranks, strict=True)
    ):
        return [(p, by_rank[int(r)]) for p, r in zip(pods, ranks, strict=True) if _gated(p)]
    taken = Counter(
        tuple((p["spec"].get("nodeSelector") or {}).get(level, "") for level in levels)
        for p in pods
        if not _gated(p)
    )
    gated = iter(sorted((p for p in pods if _gated(p)), key=lambda p: p["metadata"]["name"]))
    result = []
    for values, count in domains:
        for _ in range(max(0, count - taken[tuple(values)])):
            pod = next(gated, None)
            if pod is None:
                return result
            result.append((pod, dict(zip(levels, values, strict=True))))
    return result


def _assigned_nodes(workload: dict) -> set[str]:
    if not has_quota(workload):
        return set()
    nodes = set()
    for assignment in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        levels, domains = topology_domains(assignment)
        if levels and levels[-1] == HOSTNAME:
            nodes |= {values[-1] for values, _ in domains}
    return nodes


def _runs_on(pod: dict, node: str) -> bool:
    """The pod is running (or still to run) on ``node``: bound there, or headed there by its selector."""
    there = node_of(pod) == node or (pod["spec"].get("nodeSelector") or {}).get(HOSTNAME) == node
    return there and not is_terminal(pod) and not is_deleting(pod)
