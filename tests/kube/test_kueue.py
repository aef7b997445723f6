"""Kueue as deployed: the version picked from discovery, and a Workload of either version read by meaning.

The Workloads are plain data shaped as a real Kueue writes them: the 0.13 line (v1beta1; reasons from
``apis/kueue/v1beta1/workload_types.go``, ``pkg/scheduler/scheduler.go``, the measurement in
``reference/realk8s.md``) and 0.15 and later (v1beta2, granular pending reasons)."""

from __future__ import annotations

import pytest

from trainops.kube.kueue import (
    BY_KUEUE,
    BY_USER,
    KueueNotServed,
    Said,
    deactivation_message,
    pick_version,
    workload_facts,
)


def group(*versions: str, preferred: str | None = None) -> dict:
    entries = [{"groupVersion": f"kueue.x-k8s.io/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "name": "kueue.x-k8s.io",
        "versions": entries,
        "preferredVersion": {"version": preferred or versions[0]},
    }


@pytest.mark.parametrize(
    ("api_group", "version"),
    [
        (group("v1beta1"), "v1beta1"),  # Kueue 0.13/0.14
        (group("v1beta2", "v1beta1"), "v1beta2"),  # 0.15 and later serve both
        (group("v1beta1", "v1beta2", preferred="v1beta1"), "v1beta1"),  # the server's preference, spoken
        (group("v1", "v1beta2", preferred="v1"), "v1beta2"),  # a future version trainops does not speak
    ],
)
def test_the_version_spoken_is_the_servers_preferred_one_else_the_newest_trainops_knows(api_group, version):
    assert pick_version(api_group) == version


@pytest.mark.parametrize("api_group", [None, group("v1alpha1")])
def test_a_cluster_without_a_kueue_trainops_speaks_is_refused_with_the_fix(api_group):
    with pytest.raises(KueueNotServed, match=r"install Kueue 0\.13 or newer .* deploy/kueue-queues.yaml"):
        pick_version(api_group)


def workload(*conditions: tuple, active: bool = True) -> dict:
    """``conditions``: (type, status, reason, message, lastTransitionTime)."""
    return {
        "metadata": {"name": "job-run-1-abcde"},
        "spec": {"active": active},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": at}
                for t, s, r, m, at in conditions
            ]
        },
    }


OVER = "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor gpu"
ADMITTED = [
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue training", "t1"),
    ("Admitted", "True", "Admitted", "The workload is admitted", "t1"),
]
LIMIT = ("RequeuingLimitExceeded", "exceeding the maximum number of re-queuing retries")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (  # 0.13: every quota problem is "Pending"
            workload(("QuotaReserved", "False", "Pending", OVER, "t0")),
            {"pending": Said("Pending", OVER, "t0"), "admitted": False, "pods_ready": None},
        ),
        (  # 0.15+: the granular reason
            workload(("QuotaReserved", "False", "ExceedsMaxQuota", OVER, "t0")),
            {"pending": Said("ExceedsMaxQuota", OVER, "t0"), "quota_reserved": False},
        ),
        (  # 0.13's missing queue
            workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue q doesn't exist", "t0")),
            {"pending": Said("Inadmissible", "LocalQueue q doesn't exist", "t0")},
        ),
        (  # admitted, waitForPodsReady off: no PodsReady at all
            workload(*ADMITTED),
            {"admitted": True, "quota_reserved": True, "pending": None, "pods_ready": None},
        ),
        (
            workload(*ADMITTED, ("PodsReady", "False", "WaitForStart", "Not all pods are ready", "t1")),
            {"admitted": True, "pods_ready": False},
        ),
        (
            workload(*ADMITTED, ("PodsReady", "True", "Started", "All pods reached readiness", "t2")),
            {"pods_ready": True},
        ),
        (  # preempted after admission: no longer admitted, requeued by Kueue, not deactivated
            workload(*ADMITTED, ("Evicted", "True", "Preempted", "Preempted to accommodate", "t2")),
            {"admitted": False, "requeued": True, "deactivated_by": None},
        ),
        (  # PodsReady timeout: requeued with backoff
            workload(
                *ADMITTED, ("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout", "t2")
            ),
            {"requeued": True, "deactivated_by": None},
        ),
        (  # admitted again after an eviction (Evicted=False "QuotaReserved")
            workload(
                ("QuotaReserved", "True", "QuotaReserved", "", "t3"),
                ("Admitted", "True", "Admitted", "", "t3"),
                ("Evicted", "False", "QuotaReserved", "Previously: Preempted", "t3"),
            ),
            {"admitted": True, "requeued": False, "evicted": None},
        ),
        (
            workload(*ADMITTED, ("Finished", "True", "Succeeded", "Job finished successfully", "t4")),
            {"finished": Said("Succeeded", "Job finished successfully", "t4"), "deactivated_by": None},
        ),
    ],
)
def test_workload_conditions_are_read_by_meaning(given, expected):
    facts = workload_facts(given)
    assert {name: getattr(facts, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("given", "by", "cause"),
    [
        # Kueue at the requeuing limit: DeactivationTarget first (spec.active still true) ...
        (workload(*ADMITTED, ("DeactivationTarget", "True", *LIMIT, "t5")), BY_KUEUE, LIMIT[0]),
        # ... then spec.active=false, 17 ms before the eviction (reference/realk8s.md) ...
        (workload(*ADMITTED, ("DeactivationTarget", "True", *LIMIT, "t5"), active=False), BY_KUEUE, LIMIT[0]),
        # ... then Evicted with the cause, the target condition removed
        (
            workload(
                *ADMITTED,
                (
                    "Evicted",
                    "True",
                    "DeactivatedDueToRequeuingLimitExceeded",
                    "The workload is deactivated due to exceeding the maximum number of re-queuing retries",
                    "t5",
                ),
                active=False,
            ),
            BY_KUEUE,
            "RequeuingLimitExceeded",
        ),
        (
            workload(
                ("Evicted", "True", "DeactivatedDueToMaximumExecutionTimeExceeded", "...", "t5"), active=False
            ),
            BY_KUEUE,
            "MaximumExecutionTimeExceeded",
        ),
        # a person's (or trainops's) stop: spec.active=false, then Evicted=Deactivated
        (workload(*ADMITTED, active=False), BY_USER, "Deactivated"),
        (
            workload(
                *ADMITTED,
                ("Evicted", "True", "Deactivated", "The workload is deactivated", "t5"),
                active=False,
            ),
            BY_USER,
            "Deactivated",
        ),
    ],
)
def test_who_deactivated_a_workload_and_why(given, by, cause):
    facts = workload_facts(given)
    assert (facts.deactivated_by, facts.deactivation.reason, facts.requeued) == (by, cause, False)
    message = deactivation_message(facts)
    if by == BY_KUEUE:
        assert message.startswith(f"Kueue deactivated Workload job-run-1-abcde (DeactivatedDueTo{cause}: ")
    else:
        assert message.startswith("Workload job-run-1-abcde was deactivated (Deactivated")


def test_topology_assignments_of_both_versions_are_read_alike():
    from trainops.kube.kueue import topology_domains

    # v1beta2, the example of Kueue's "Setup Topology-Aware Scheduling" page: prefix-compressed names
    v1beta2 = {
        "topologyAssignment": {
            "levels": ["kubernetes.io/hostname"],
            "slices": [
                {
                    "domainCount": 2,
                    "podCounts": {"individual": [7, 3]},
                    "valuesPerLevel": [{"individual": {"prefix": "kind-worker", "roots": ["", "2"]}}],
                }
            ],
        }
    }
    v1beta1 = {
        "topologyAssignment": {
            "levels": ["kubernetes.io/hostname"],
            "domains": [{"values": ["kind-worker"], "count": 7}, {"values": ["kind-worker2"], "count": 3}],
        }
    }
    universal = {
        "topologyAssignment": {
            "levels": ["block", "rack"],
            "slices": [
                {
                    "domainCount": 2,
                    "podCounts": {"universal": 4},
                    "valuesPerLevel": [
                        {"universal": "b1"},
                        {"individual": {"suffix": "-x", "roots": ["r1", "r2"]}},
                    ],
                }
            ],
        }
    }

    expected = (["kubernetes.io/hostname"], [(["kind-worker"], 7), (["kind-worker2"], 3)])
    assert topology_domains(v1beta2) == topology_domains(v1beta1) == expected
    assert topology_domains(universal) == (["block", "rack"], [(["b1", "r1-x"], 4), (["b1", "r2-x"], 4)])
    assert topology_domains({"flavors": {}}) == ([], [])


@pytest.mark.parametrize(
    "assignment",
    [
        {
            "levels": ["h"],
            "slices": [
                {
                    "domainCount": 3,
                    "podCounts": {"universal": 1},
                    "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
                }
            ],
        },
        {
            "levels": ["h"],
            "slices": [
                {"domainCount": 10**9, "podCounts": {"universal": 1}, "valuesPerLevel": [{"universal": "a"}]}
            ],
        },
        {"levels": ["h", "g"], "domains": [{"values": ["a"], "count": 1}]},
        {"levels": "h", "domains": [{"count": 1}]},
    ],
)
def test_a_topology_assignment_that_is_not_kueues_is_refused(assignment):
    from trainops.kube.kueue import topology_domains

    with pytest.raises(ValueError, match="topologyAssignment is not Kueue's"):
        topology_domains({"topologyAssignment": assignment})
