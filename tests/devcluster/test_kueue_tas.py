"""The devcluster's Kueue Topology Aware Scheduling, through the API as a real Kueue answers it: the
assignment in the Workload (v1beta2 slices, v1beta1 domains), the scheduling gate released with a
per-pod hostname selector, TopologyPlacementFailed's message, and a failed node replaced or evicted."""

from __future__ import annotations

import pytest
from trainops_devcluster.kueue import KueueConfig

from tests.devcluster.ctrl_support import wait_for
from trainops.capacity.procedure import claim
from trainops.kube.client import Kube
from trainops.kube.kueue import topology_domains
from trainops.placement.request import BLOCK_LABEL, RACK_LABEL

NS = "training"
GATE = "kueue.x-k8s.io/topology"
TRAINING = {"key": "trainops.io/mode", "operator": "Equal", "value": "training", "effect": "NoSchedule"}


@pytest.fixture
def tas(make_devcluster):
    """``tas(fabric, claimed, version=...)``: a devcluster of that fabric, no inference, with the
    ``claimed`` node indexes claimed for run ``d/r`` (taints flipped, quota raised)."""

    def make(fabric: str, claimed: list[int], version: str = "v1beta2"):
        config = KueueConfig(version=version, topology_aware_scheduling=True)
        nodes = sum(int(n) for block in fabric.split("/") for n in block.split(","))
        dev = make_devcluster(nodes=nodes, fabric=fabric, inference=[], system_nodes=0, kueue_config=config)
        kube = Kube.from_kubeconfig(str(dev.kubeconfig))
        claim(kube, "d/r", [f"gpu-node-{i:03d}" for i in claimed], cluster_queue="training")
        return dev, kube, version

    return make


def submit(
    kube: Kube,
    name: str,
    pods: int,
    annotation: dict | None = None,
    backoff: int = 0,
    limits: dict | None = None,
) -> None:
    kube.batch.create_namespaced_job(
        NS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "training"}},
            "spec": {
                "completionMode": "Indexed",
                "completions": pods,
                "parallelism": pods,
                "backoffLimit": backoff,
                "template": {
                    "metadata": {"annotations": annotation or {}},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"trainops.io/gpu-pool": "true"},
                        "tolerations": [TRAINING],
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "trainer:1",
                                "resources": {
                                    "limits": {"nvidia.com/gpu": "8"} if limits is None else limits
                                },
                                "command": ["sleep"],
                            }
                        ],
                    },
                },
            },
        },
    )


def workload(kube: Kube, version: str) -> dict | None:
    found = kube.custom.list_namespaced_custom_object("kueue.x-k8s.io", version, NS, "workloads")["items"]
    return found[0] if found else None


def condition(obj: dict | None, kind: str) -> dict:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {}
    )


def admitted(kube: Kube, version: str) -> dict:
    return wait_for(
        lambda: (w := workload(kube, version)) and condition(w, "Admitted").get("status") == "True" and w
    )


def pending(kube: Kube, version: str) -> dict:
    return wait_for(
        lambda: (
            condition(workload(kube, version), "QuotaReserved").get("status") == "False"
            and condition(workload(kube, version), "QuotaReserved")
        )
    )


def pods(kube: Kube) -> list:
    return sorted(kube.core.list_namespaced_pod(NS).items, key=lambda p: p.metadata.name)


def test_required_block_is_placed_in_the_best_fitting_block_and_each_pod_gets_its_node(tas):
    # block-a: racks of 2 and 2, block-b: one rack of 3; all claimed: block-b (3) fits 3 pods best
    dev, kube, version = tas("2,2/3", [0, 1, 2, 3, 4, 5, 6])
    submit(kube, "run", 3, {"kueue.x-k8s.io/podset-required-topology": BLOCK_LABEL})

    found = admitted(kube, version)

    assignment = found["status"]["admission"]["podSetAssignments"][0]
    assert topology_domains(assignment) == (
        ["kubernetes.io/hostname"],
        [(["gpu-node-004"], 1), (["gpu-node-005"], 1), (["gpu-node-006"], 1)],
    )
    assert assignment["topologyAssignment"]["slices"][0]["valuesPerLevel"][0] == {
        "individual": {"prefix": "gpu-node-00", "roots": ["4", "5", "6"]}
    }
    assert found["spec"]["podSets"][0]["topologyRequest"] == {
        "required": BLOCK_LABEL,
        "podIndexLabel": "batch.kubernetes.io/job-completion-index",
    }
    running = wait_for(lambda: len(p := [x for x in pods(kube) if x.spec.node_name]) == 3 and p)
    for index, pod in enumerate(running):  # rank i -> the i-th domain, gate gone
        assert (
            pod.spec.node_selector["kubernetes.io/hostname"]
            == f"gpu-node-00{4 + index}"
            == pod.spec.node_name
        )
        assert not pod.spec.scheduling_gates
    job = kube.batch.read_namespaced_job("run", NS)
    assert [g.name for g in job.spec.template.spec.scheduling_gates] == [GATE]


def test_implied_topology_in_a_tas_only_queue_is_unconstrained_and_gated(tas):
    dev, kube, version = tas("4", [0, 1])
    submit(kube, "run", 2)

    admitted(kube, version)

    job = wait_for(lambda: (j := kube.batch.read_namespaced_job("run", NS)) and not j.spec.suspend and j)
    assert job.spec.template.metadata.annotations["kueue.x-k8s.io/podset-unconstrained-topology"] == "true"
    placed = wait_for(lambda: (ps := pods(kube)) and all(p.spec.node_name for p in ps) and ps)
    assert {p.spec.node_name for p in placed} == {"gpu-node-000", "gpu-node-001"}


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_pods_that_request_nothing_in_a_tas_only_queue_get_no_tas_flavor(tas, version):
    # Kueue 0.17.8+/0.19: no TAS flavor, pending for good; 0.13 admitted it with no topology (kueue#12055)
    dev, kube, version = tas("4", [0, 1], version=version)
    submit(kube, "run", 2, limits={})

    if version == "v1beta2":
        quota = pending(kube, version)
        assert (quota["reason"], quota["message"]) == (
            "NoMatchingFlavor",
            "failed to assign flavors to pod set main: no TAS flavor assigned",
        )
        assert all(p.spec.node_name is None for p in pods(kube))
    else:
        assert (
            "topologyAssignment" not in admitted(kube, version)["status"]["admission"]["podSetAssignments"][0]
        )
        placed = wait_for(lambda: len(ps := [p for p in pods(kube) if p.spec.node_name]) == 2 and ps)
        assert all(not p.spec.scheduling_gates for p in placed)


def test_a_required_rack_no_rack_holds_waits_with_kueues_message(tas):
    dev, kube, version = tas("2,2/2", [0, 2, 4])
    submit(kube, "run", 2, {"kueue.x-k8s.io/podset-required-topology": RACK_LABEL})

    quota = pending(kube, version)

    assert quota["reason"] == "TopologyPlacementFailed"
    assert quota["message"] == (
        'couldn\'t assign flavors to pod set main: topology "gpu-topology" allows to fit only 1 out of 2 pod(s). '
        'Total nodes: 6; excluded: taint "trainops.io/mode=inference:NoSchedule": 3'
    )
    assert all(p.spec.node_name is None for p in pods(kube))


def test_kueue_0_13_writes_domains_and_pending(tas):
    dev, kube, version = tas("2/2", [0, 2, 3], version="v1beta1")
    topology = kube.custom.get_cluster_custom_object(
        "kueue.x-k8s.io", "v1alpha1", "topologies", "gpu-topology"
    )
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]][0] == BLOCK_LABEL
    submit(kube, "big", 3, {"kueue.x-k8s.io/podset-required-topology": BLOCK_LABEL})

    quota = pending(kube, version)
    assert (quota["reason"], quota["message"]) == (
        "Pending",
        'couldn\'t assign flavors to pod set main: topology "gpu-topology" allows to fit only 2 out of 3 pod(s)',
    )
    kube.batch.delete_namespaced_job("big", NS, propagation_policy="Foreground")
    wait_for(lambda: workload(kube, version) is None)
    submit(kube, "run", 2, {"kueue.x-k8s.io/podset-preferred-topology": BLOCK_LABEL})
    assignment = admitted(kube, version)["status"]["admission"]["podSetAssignments"][0]
    assert assignment["topologyAssignment"] == {
        "levels": ["kubernetes.io/hostname"],
        "domains": [{"values": ["gpu-node-002"], "count": 1}, {"values": ["gpu-node-003"], "count": 1}],
    }


def test_a_tainted_node_is_replaced_inside_the_required_block_then_the_workload_is_evicted(tas):
    dev, kube, version = tas("2,2/2", [0, 1, 2, 4])
    submit(kube, "run", 2, {"kueue.x-k8s.io/podset-required-topology": BLOCK_LABEL}, backoff=5)
    admitted(kube, version)

    def placed() -> list[str]:
        assignment = workload(kube, version)["status"]["admission"]["podSetAssignments"][0]
        return [values[-1] for values, _ in topology_domains(assignment)[1]]

    def running() -> list:
        live = [p for p in pods(kube) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return live if len(live) == 2 else []

    def quarantine_and_crash(pod) -> None:
        node = kube.core.read_node(pod.spec.node_name)
        taint = {"key": "trainops.io/quarantine", "value": "xid-79", "effect": "NoSchedule"}
        kube.core.patch_node(
            node.metadata.name, {"spec": {"taints": [t.to_dict() for t in node.spec.taints] + [taint]}}
        )
        dev.inject("crash-pod", f"{NS}/{pod.metadata.name}")

    first = wait_for(running)[0]
    assert set(placed()) < {"gpu-node-000", "gpu-node-001", "gpu-node-002"}  # block-a, which holds 3
    quarantine_and_crash(first)

    wait_for(lambda: first.spec.node_name not in placed())
    assert set(placed()) < {"gpu-node-000", "gpu-node-001", "gpu-node-002"}  # the swap stays in block-a
    again = wait_for(
        lambda: (live := running()) and {p.spec.node_name for p in live} == set(placed()) and live
    )
    assert not workload(kube, version)["status"].get("unhealthyNodes")

    quarantine_and_crash(again[0])  # block-a has no free node left: Kueue evicts

    evicted = wait_for(
        lambda: (
            condition(workload(kube, version), "Evicted").get("status") == "True"
            and condition(workload(kube, version), "Evicted")
        )
    )
    assert (evicted["reason"], evicted["message"]) == (
        "NodeFailures",
        f"Workload was evicted as there was no replacement for unhealthy node(s): {again[0].spec.node_name}",
    )


def test_a_gated_pod_may_gain_node_selector_entries_through_the_api_and_nothing_else(tas):
    from kubernetes.client.exceptions import ApiException

    dev, kube, version = tas("2", [0])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "nodeSelector": {"trainops.io/gpu-pool": "true"},
            "containers": [{"name": "c", "image": "trainer:1"}],
        },
    }
    kube.core.create_namespaced_pod(NS, pod)

    kube.core.patch_namespaced_pod(
        "gated", NS, {"spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-000"}}}
    )
    with pytest.raises(ApiException) as refused:
        kube.core.patch_namespaced_pod(
            "gated", NS, {"spec": {"nodeSelector": {"trainops.io/gpu-pool": "false"}}}
        )
    assert refused.value.status == 422 and "only additions to spec.nodeSelector" in refused.value.body
    kube.core.patch_namespaced_pod("gated", NS, {"spec": {"schedulingGates": None}})
    with pytest.raises(ApiException) as ungated:
        kube.core.patch_namespaced_pod("gated", NS, {"spec": {"nodeSelector": {"zone": "a"}}})
    assert ungated.value.status == 422
