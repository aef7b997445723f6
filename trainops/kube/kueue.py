"""Kueue as deployed: the version of ``kueue.x-k8s.io`` the cluster serves, and what a Workload says.

Kueue up to 0.14 serves only ``v1beta1``; 0.15 and later serve ``v1beta1`` and ``v1beta2`` (the
storage version from 0.16).  ``served_version(api_client)`` asks discovery (``GET
/apis/kueue.x-k8s.io``, allowed to every authenticated user by the default ``system:discovery``
role) once per client and picks the newest version trainops speaks; every Kueue call of the package
names its resource with ``resource(custom, plural)``.  The fields trainops reads and writes are the
same in both versions (ClusterQueue ``spec.resourceGroups`` and annotations, LocalQueue
``spec.clusterQueue``, Workload ``spec.active``, ``status.conditions``, the ``job-uid`` label); what
differs is read by meaning in ``WorkloadFacts``:

- pending: ``QuotaReserved=False`` with reason ``Pending`` or ``Inadmissible`` (0.13), or the
  granular reasons of later releases (``WaitingForQuota``, ``NoMatchingFlavor``, ...);
- ``PodsReady`` exists only where Kueue's ``waitForPodsReady`` is configured (``None`` otherwise);
- a deactivation is Kueue's when it set ``DeactivationTarget`` (then ``spec.active=false``) or evicted
  with ``Deactivated<DueTo><cause>`` (requeuing limit, maximum execution time, a rejected admission
  check); a plain ``spec.active=false`` and ``Evicted=Deactivated`` are a person's or a program's stop.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from trainops.errors import PermanentError
from trainops.kube.retry import Deadline, call

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # the versions trainops speaks, newest first
DISCOVERY_DEADLINE_S = 60.0
DEACTIVATED = "Deactivated"
BY_KUEUE, BY_USER = "kueue", "user"

_served: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ApiClient -> version
_lock = threading.Lock()


class KueueNotServed(PermanentError):
    """The cluster serves no version of ``kueue.x-k8s.io`` that trainops speaks."""


def pick_version(api_group: Mapping | None) -> str:
    """The version to speak, from discovery's APIGroup (None: the group is not served): the
    server's preferred one when trainops speaks it, else the newest one it speaks."""
    served = [v.get("version") for v in (api_group or {}).get("versions") or []]
    preferred = ((api_group or {}).get("preferredVersion") or {}).get("version")
    if preferred in VERSIONS:
        return preferred
    for version in VERSIONS:
        if version in served:
            return version
    raise KueueNotServed(
        f"the cluster serves {GROUP} versions {served or 'none'}; trainops needs {' or '.join(VERSIONS)}: "
        "install Kueue 0.13 or newer (its CRDs and controller) and the queues of deploy/kueue-queues.yaml"
    )


def served_version(api_client) -> str:
    """The Kueue version to speak on ``api_client`` (a ``kubernetes.client.ApiClient``), discovered
    on first use and cached for the client's life; transient answers are retried."""
    with _lock:
        known = _served.get(api_client)
    if known is not None:
        return known
    version = pick_version(
        call(lambda: _api_group(api_client), Deadline(DISCOVERY_DEADLINE_S), f"discover {GROUP}")
    )
    with _lock:
        _served[api_client] = version
    return version


def _api_group(api_client) -> dict | None:
    import json

    from kubernetes.client.exceptions import ApiException

    try:
        response = api_client.call_api(
            f"/apis/{GROUP}",
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return json.loads(response.data)


def resource(custom, plural: str) -> tuple[str, str, str]:
    """``(group, version, plural)`` of a Kueue resource for ``custom`` (a ``CustomObjectsApi``), the
    first arguments of its ``*_custom_object`` calls."""
    return GROUP, served_version(custom.api_client), plural


def read(custom, plural: str, name: str, deadline: Deadline, namespace: str | None = None) -> dict | None:
    """Kueue object ``name`` (in ``namespace`` for a namespaced kind), or None when it does not exist."""
    from kubernetes.client.exceptions import ApiException

    group, version, _ = resource(custom, plural)
    if namespace is None:
        fn = lambda: custom.get_cluster_custom_object(group, version, plural, name)  # noqa: E731
    else:
        fn = lambda: custom.get_namespaced_custom_object(group, version, namespace, plural, name)  # noqa: E731
    try:
        return call(fn, deadline, f"read {plural}.{GROUP} {name}")
    except ApiException as error:
        if error.status != 404:
            raise
        return None


# ---- what a Workload says ---------------------------------------------------------------------
@dataclass(frozen=True)
class Said:
    """A condition's reason and message, and when it last changed status."""

    reason: str
    message: str
    since: str = ""

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}" if self.message else self.reason


@dataclass(frozen=True)
class WorkloadFacts:
    """A Workload of either version, by meaning (see the module docstring)."""

    name: str
    active: bool
    quota_reserved: bool
    admitted: bool  # admitted since its last eviction
    pending: Said | None  # why it holds no quota (QuotaReserved=False)
    evicted: Said | None  # Evicted=True
    deactivated_by: str | None  # BY_KUEUE, BY_USER or None (active)
    deactivation: Said | None  # Kueue's cause (reason ``RequeuingLimitExceeded``...), or the user's stop
    finished: Said | None  # Finished=True: Succeeded or Failed
    pods_ready: bool | None  # None: Kueue reports no PodsReady (waitForPodsReady is off)

    @property
    def requeued(self) -> bool:
        """Evicted and back in the queue: every eviction but a deactivation (preemption, PodsReady
        timeout, node failures, a stopped queue) is requeued by Kueue."""
        return self.evicted is not None and not self.evicted.reason.startswith(DEACTIVATED)


def _conditions(workload: Mapping) -> dict[str, Mapping]:
    return {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type")}


def _said(cond: Mapping | None, status: str = "True") -> Said | None:
    if cond is None or cond.get("status") != status:
        return None
    return Said(
        str(cond.get("reason") or ""),
        str(cond.get("message") or ""),
        str(cond.get("lastTransitionTime") or ""),
    )


def workload_facts(workload: Mapping) -> WorkloadFacts:
    """What ``workload`` (a Workload as the API served it, either version) says."""
    conditions = _conditions(workload)
    evicted = _said(conditions.get("Evicted"))
    admitted = _said(conditions.get("Admitted"))
    target = _said(conditions.get("DeactivationTarget"))  # Kueue's, before and while it deactivates
    active = (workload.get("spec") or {}).get("active") is not False
    deactivated_by, deactivation = None, None
    if target is not None:
        deactivated_by, deactivation = BY_KUEUE, target
    elif evicted is not None and evicted.reason.startswith(f"{DEACTIVATED}DueTo"):
        cause = evicted.reason.removeprefix(f"{DEACTIVATED}DueTo")
        deactivated_by, deactivation = BY_KUEUE, Said(cause, evicted.message, evicted.since)
    elif not active or (evicted is not None and evicted.reason == DEACTIVATED):
        deactivated_by = BY_USER
        deactivation = evicted or Said(DEACTIVATED, "spec.active=false")
    ready = conditions.get("PodsReady")
    return WorkloadFacts(
        name=str((workload.get("metadata") or {}).get("name") or ""),
        active=active,
        quota_reserved=_said(conditions.get("QuotaReserved")) is not None,
        admitted=admitted is not None and (evicted is None or evicted.since < admitted.since),
        pending=_said(conditions.get("QuotaReserved"), "False"),
        evicted=evicted,
        deactivated_by=deactivated_by,
        deactivation=deactivation,
        finished=_said(conditions.get("Finished")),
        pods_ready=None if ready is None else ready.get("status") == "True",
    )


def deactivation_message(facts: WorkloadFacts) -> str:
    """How a deactivated Workload ended, naming who deactivated it and why."""
    if facts.deactivated_by == BY_KUEUE:
        return f"Kueue deactivated Workload {facts.name} ({DEACTIVATED}DueTo{facts.deactivation})"
    return f"Workload {facts.name} was deactivated ({facts.deactivation})"


# ---- where Kueue's Topology Aware Scheduling put the pods ---------------------------------------
MAX_TOPOLOGY_DOMAINS = 100_000  # Kueue's own bound per slice; a larger answer is not Kueue's


def topology_domains(podset_assignment: Mapping) -> tuple[list[str], list[tuple[list[str], int]]]:
    """``(levels, [(values, pods)])`` of a PodSet assignment's ``topologyAssignment`` in either version
    (v1beta1 ``domains``; v1beta2 ``slices`` with universal or individual values and counts, the
    individual ones with an optional common prefix and suffix); ``([], [])`` when it has none.  Values
    go from the widest level down (only ``kubernetes.io/hostname`` when that is the Topology's last
    level).  A malformed assignment raises ValueError."""
    assignment = (
        podset_assignment.get("topologyAssignment") if isinstance(podset_assignment, Mapping) else None
    )
    if not assignment:
        return [], []
    try:
        levels = [str(level) for level in assignment["levels"]]
        if "domains" in assignment:
            found = [([str(v) for v in d["values"]], int(d["count"])) for d in assignment["domains"]]
        else:
            found = [
                domain for part in assignment.get("slices") or [] for domain in _slice_domains(part, levels)
            ]
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ValueError(f"topologyAssignment is not Kueue's: {error!r}") from None
    if len(found) > MAX_TOPOLOGY_DOMAINS or any(len(values) != len(levels) for values, _ in found):
        raise ValueError(f"topologyAssignment is not Kueue's: {len(found)} domain(s) over levels {levels}")
    return levels, found


def _slice_domains(part: Mapping, levels: list[str]) -> list[tuple[list[str], int]]:
    count = int(part["domainCount"])
    if not 0 < count <= MAX_TOPOLOGY_DOMAINS or len(part["valuesPerLevel"]) != len(levels):
        raise ValueError(f"slice of {count} domain(s) with {len(part['valuesPerLevel'])} level(s)")
    pods = part["podCounts"]
    counts = [int(pods["universal"])] * count if "universal" in pods else [int(c) for c in pods["individual"]]
    per_level = []
    for values in part["valuesPerLevel"]:
        if "universal" in values:
            per_level.append([str(values["universal"])] * count)
            continue
        individual = values["individual"]
        prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
        per_level.append([f"{prefix}{root}{suffix}" for root in individual["roots"]])
    if len(counts) != count or any(len(values) != count for values in per_level):
        raise ValueError("slice lists are not domainCount long")
    return [([values[i] for values in per_level], counts[i]) for i in range(count)]
