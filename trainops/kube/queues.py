"""A run's Kueue queues, and whether they can ever admit what its pods request.

Kueue leaves a Workload pending for good when a resource its pods request is in none of its
ClusterQueue's ``coveredResources``: at once, and in every release, it answers ``QuotaReserved=False``
(0.13: reason ``Pending``; from 0.19: ``NoMatchingFlavor``) with "couldn't assign flavors to pod set
main: resource rdma/ib unavailable in ClusterQueue", and the run would wait for its admission timeout.
Two callers read the queues before that (with ``read_queues`` and ``uncovered``): the claim, for the
resources it is told the run requests (``trainops.capacity.coverage``), and the training run, for what
its Job's pod template requests, before its first Job is created (``trainops.training.cluster``).

``never_admits`` reads Kueue's answer for the follower, which ends an attempt on it instead of waiting
for the admission timeout.  Only answers that nothing but an edit of the queues or of the request can
change count (Kueue's flavor assigner, ``pkg/scheduler/flavorassigner/flavorassigner.go`` and
``tas_flavorassigner.go``):

- ``resource <r> unavailable in ClusterQueue``: no resource group covers ``r``;
- ``untolerated taint <t> in flavor <f>``, ``flavor <f> doesn't match node affinity``: the flavor's
  ``nodeTaints``/``nodeLabels`` against the pod template's tolerations and node selector;
- ``Flavor "<f>" does not support TopologyAwareScheduling`` / ``does not contain the requested level`` /
  ``supports only TopologyAwareScheduling``: the flavor's topology against the PodSet's request.

A PodSet's answer counts only when every reason in it is one of these: Kueue lists one reason per
flavor it tried (sorted, joined with ", "), and one flavor short of quota (``insufficient unused quota``,
``insufficient quota ... > maximum capacity``: a claim raises the quota), a preemption under way
(``Pending the preemption of``), a topology with no room now (``doesn't allow to fit``) or anything
unknown may still admit it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainops.conventions import GPU_RESOURCE
from trainops.errors import PermanentError
from trainops.kube.retry import Deadline

QUEUES_MANIFEST = "deploy/kueue-queues.yaml"


class QueueMismatch(PermanentError, ValueError):
    """The run's Kueue queues cannot admit it; the message says what to change."""


def read_queues(
    kube, namespace: str, local_queue: str, deadline: Deadline
) -> tuple[dict | None, str, dict | None]:
    """LocalQueue ``namespace/local_queue`` (None: it does not exist), the name of the ClusterQueue it
    sends runs to, and that ClusterQueue (None: it does not exist, or there is no LocalQueue).  Reads
    only; ``kube``: a ``trainops.kube.client.Kube``."""
    queue = kube.get(kube.kueue("localqueues"), local_queue, namespace, deadline=deadline)
    if queue is None:
        return None, "", None
    target = str((queue.get("spec") or {}).get("clusterQueue") or "")
    found = (
        kube.get(kube.kueue("clusterqueues", namespaced=False), target, deadline=deadline) if target else None
    )
    return queue, target, found


def covered_resources(cluster_queue: Mapping) -> set[str]:
    """Every resource the ClusterQueue's resource groups cover."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    return {str(name) for group in groups for name in group.get("coveredResources") or []}


def uncovered(cluster_queue: Mapping, resources: Iterable[str]) -> list[str]:
    """Those of ``resources`` the ClusterQueue covers in none of its resource groups, sorted."""
    return sorted(set(resources) - covered_resources(cluster_queue))


def tas_flavors(kube, cluster_queue: Mapping, deadline: Deadline) -> dict[str, dict]:
    """The ResourceFlavors of ``cluster_queue`` that cover ``nvidia.com/gpu`` and name a Topology, by name
    (sorted), each its ``spec``: the flavors a run's GPUs go through, where Kueue places its pods by TAS
    (implied when all its flavors are TAS flavors, else asked for by the pod template's annotation).  A TAS
    flavor of a resource group without the GPUs takes no run trainops submits.  ``kube``: a
    ``trainops.kube.client.Kube``."""
    kind = kube.kueue("resourceflavors", namespaced=False)
    names = sorted(
        {
            str(flavor.get("name"))
            for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []
            if GPU_RESOURCE in (group.get("coveredResources") or [])
            for flavor in group.get("flavors") or []
            if flavor.get("name")
        }
    )
    found = {name: (kube.get(kind, name, deadline=deadline) or {}).get("spec") or {} for name in names}
    return {name: spec for name, spec in found.items() if spec.get("topologyName")}


def coverage_fix(cluster_queue: str, missing: list[str]) -> str:
    """How to make ClusterQueue ``cluster_queue`` cover ``missing``."""
    names = ", ".join(missing)
    return (
        f"Add {names} to coveredResources of ClusterQueue {cluster_queue}, with a nominalQuota in each flavor "
        f"of that resource group (see {QUEUES_MANIFEST})"
    )


def requested_resources(pod_spec: Mapping) -> set[str]:
    """The resources one pod of ``pod_spec`` requests as Kueue counts them: its containers', its init
    containers' and its ``overhead``, a limit standing in for a missing request (the API server
    defaults it so); a zero quantity is no request (Kueue skips it)."""
    return {name for name, amount in _effective(pod_spec).items() if amount is None or amount != 0}


def pod_requests(pod_spec: Mapping) -> dict[str, float]:
    """What one pod of ``pod_spec`` requests, as numbers: Kubernetes' effective request (what the
    scheduler and Kueue count), per resource the larger of its containers' sum and its largest init
    container, plus its ``overhead``; a limit stands in for a missing request, zero and unreadable
    quantities are left out."""
    return {name: amount for name, amount in _effective(pod_spec).items() if amount}


def _effective(pod_spec: Mapping) -> dict[str, float | None]:
    """Each resource's effective request (``pod_requests``); None where a quantity cannot be read."""

    def add(total: dict[str, float | None], amounts: Mapping[str, float | None], combine) -> None:
        for name, amount in amounts.items():
            had = total.get(name, 0.0)
            total[name] = None if amount is None or had is None else combine(had, amount)

    containers: dict[str, float | None] = {}
    for container in pod_spec.get("containers") or []:
        add(containers, _requested(container), lambda a, b: a + b)
    init: dict[str, float | None] = {}
    for container in pod_spec.get("initContainers") or []:
        add(init, _requested(container), max)
    add(containers, init, max)
    add(containers, _amounts(pod_spec.get("overhead") or {}), lambda a, b: a + b)
    return containers


def _requested(container: Mapping) -> dict[str, float | None]:
    resources = container.get("resources") or {}
    return _amounts({**(resources.get("limits") or {}), **(resources.get("requests") or {})})


def _amounts(quantities: Mapping) -> dict[str, float | None]:
    from kubernetes.utils.quantity import parse_quantity

    amounts: dict[str, float | None] = {}
    for name, quantity in quantities.items():
        try:
            amounts[str(name)] = float(parse_quantity(quantity))
        except (ValueError, TypeError, ArithmeticError):
            amounts[str(name)] = None  # the API server refuses it anyway; not ours to judge
    return amounts


# ---- Kueue's answer that it can never assign a flavor ---------------------------------------------
_PODSET = re.compile(r"(?:couldn't|failed to) assign flavors to pod set (\S+): ")
_UNCOVERED = re.compile(r"resource ([^\s,;]+) unavailable in ClusterQueue")
_MISFIT = re.compile(
    r"untolerated taint \S+ in flavor ([^\s,;]+)"
    r"|flavor ([^\s,;]+) doesn't match node affinity"
    r'|Flavor "([^"]+)" (?:does not support TopologyAwareScheduling|does not contain the requested level'
    r"|supports only TopologyAwareScheduling)"
)
_SEPARATORS = " ,;."


@dataclass(frozen=True)
class NeverAdmits:
    """What Kueue's answer names: ``resources`` no resource group of the ClusterQueue covers, and
    ``flavors`` that can never take the PodSet (``reasons``: Kueue's words for each PodSet)."""

    resources: tuple[str, ...]
    flavors: tuple[str, ...]
    reasons: tuple[str, ...]

    def fix(self, queue: str) -> str:
        """What to change; ``queue``: which queue the Workload is in, for the message."""
        fixes = []
        if self.resources:
            names = ", ".join(self.resources)
            fixes.append(
                f"add {names} to coveredResources of the ClusterQueue behind {queue}, with a nominalQuota in "
                f"each flavor of that resource group (see {QUEUES_MANIFEST}), or drop the request from the run"
            )
        if self.flavors:
            names = ", ".join(self.flavors)
            fixes.append(
                f"make flavor {names} fit the run's pods (its nodeLabels, nodeTaints or topology against their "
                "node selector, tolerations and topology request), add a flavor that does, or change the run's"
            )
        return "; ".join(fixes)


def never_admits(message: str) -> NeverAdmits | None:
    """Whether Kueue's ``QuotaReserved=False`` ``message`` says the Workload can never be admitted as the
    queues and the request stand (see the module docstring); None for any answer that may change."""
    parts = _PODSET.split(message or "")
    resources: list[str] = []
    flavors: list[str] = []
    reasons: list[str] = []
    # [before, podset, answer, podset, answer, ...]: one PodSet that can never fit keeps the gang out
    for answer in parts[2::2]:
        answer = answer.strip().rstrip(";").strip()
        uncovered_here = _UNCOVERED.findall(answer)
        misfits = [next(name for name in match if name) for match in _MISFIT.findall(answer)]
        rest = _MISFIT.sub("", _UNCOVERED.sub("", answer))
        if (uncovered_here or misfits) and not rest.strip(_SEPARATORS):
            resources += uncovered_here
            flavors += misfits
            reasons.append(answer)
    if not reasons:
        return None
    return NeverAdmits(
        tuple(dict.fromkeys(resources)), tuple(dict.fromkeys(flavors)), tuple(dict.fromkeys(reasons))
    )
