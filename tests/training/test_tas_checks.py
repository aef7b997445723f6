"""The training task's Topology Aware Scheduling refusals and the doctor's, against a small fake API:
which TAS flavors count (the ones the run's GPUs go through, one rule in ``trainops.kube.queues``), and
which nodes the one-pod-per-node check looks at (those the run may land on)."""

from __future__ import annotations

import pytest

from trainops.doctor.config import DoctorConfig
from trainops.doctor.kueue import check_release
from trainops.doctor.reads import Reads
from trainops.kube.client import Kind
from trainops.kube.queues import pod_requests
from trainops.kube.retry import Deadline
from trainops.training.cluster import GangCluster, KueueRelease, SharedNode
from trainops.training.job import build_job
from trainops.training.spec import TrainingSpec

POOL = {"trainops.io/gpu-pool": "true"}


class FakeKube:
    """``Kube``'s reads over a dict of objects by plural and name."""

    def __init__(self, objects: dict[str, dict[str, dict]]) -> None:
        self.objects = objects
        self.core = None  # GangCluster keeps it; these checks read through the verbs only

    def kueue(self, plural: str, *, namespaced: bool = True) -> Kind:
        return Kind("kueue.x-k8s.io", "v1beta2", plural, namespaced)

    def deadline(self) -> Deadline:
        return Deadline(10)

    def get(self, kind: Kind, name: str, namespace: str | None = None, *, deadline=None) -> dict | None:
        return self.objects.get(kind.plural, {}).get(name)

    def get_all(self, kind: Kind, names: list[str]) -> dict[str, dict | None]:
        return {name: self.get(kind, name) for name in names}

    def list(
        self, kind: Kind, namespace: str | None = None, *, labels: str = "", deadline=None
    ) -> list[dict]:
        wanted = dict(pair.split("=", 1) for pair in labels.split(",") if pair)
        return [
            obj
            for obj in self.objects.get(kind.plural, {}).values()
            if wanted.items() <= (obj["metadata"].get("labels") or {}).items()
        ]


def node(name: str, gpus: int, labels: dict, *, unschedulable: bool = False, taints=()) -> dict:
    return {
        "metadata": {"name": name, "labels": {**POOL, "kubernetes.io/hostname": name, **labels}},
        "spec": {"unschedulable": unschedulable, "taints": list(taints)},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "192", "memory": "2Ti", "pods": "110"}
        },
    }


def flavor(name: str, labels: dict, topology: str | None = "gpu-topology") -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels, **({"topologyName": topology} if topology else {})},
    }


def queue(*groups: tuple[list[str], list[str]]) -> dict:
    return {
        "metadata": {"name": "training"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": covered,
                    "flavors": [
                        {"name": f, "resources": [{"name": r, "nominalQuota": "100"} for r in covered]}
                        for f in flavors
                    ],
                }
                for covered, flavors in groups
            ]
        },
    }


def controller(version: str) -> dict:
    return {
        "metadata": {"name": "kueue-controller-manager", "labels": {"app.kubernetes.io/version": version}},
        "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": f"kueue:{version}"}]}}},
    }


def cluster(nodes: list[dict], flavors: list[dict], cq: dict, version: str = "v0.15.0") -> FakeKube:
    return FakeKube(
        {
            "nodes": {n["metadata"]["name"]: n for n in nodes},
            "resourceflavors": {f["metadata"]["name"]: f for f in flavors},
            "clusterqueues": {"training": cq},
            "localqueues": {
                "training": {"metadata": {"name": "training"}, "spec": {"clusterQueue": "training"}}
            },
            "deployments": {"kueue-controller-manager": controller(version)},
        }
    )


def job(gpus: int, nodes: int = 2, names: tuple[str, ...] = (), **extra) -> dict:
    spec = TrainingSpec(
        image="trainer:1",
        command=["python", "-m", "train"],
        run_uri="s3://b/runs/r1",
        nodes=nodes,
        gpus_per_node=gpus,
        node_names=list(names),
        shm_size=None,
        **extra,
    )
    return build_job(spec, name="train-r-a1", dag_id="d", run_id="r", attempt=1, resume_from=None)


H100 = {"example.com/gpu-type": "h100"}
MIG = {"example.com/gpu-type": "mig"}
GPU_QUEUE = queue((["cpu", "memory", "nvidia.com/gpu", "rdma/ib"], ["h100", "mig"]))


def test_a_mig_node_no_tas_flavor_selects_does_not_refuse_whole_node_runs():
    """A mixed pool: the TAS flavor selects the 8-GPU nodes; a MIG single-strategy node (56 GPUs) is in a
    flavor without a topology.  TAS places the run only on the flavor's nodes, where 8 GPUs take a node."""
    nodes = [node("h100-0", 8, H100), node("h100-1", 8, H100), node("mig-0", 56, MIG)]
    kube = cluster(nodes, [flavor("h100", H100), flavor("mig", MIG, topology=None)], GPU_QUEUE)

    assert GangCluster(kube).check_admissible(job(8)) == "training"
    with pytest.raises(SharedNode, match="node h100-0 has 8 allocatable"):  # the check still bites there
        GangCluster(kube).check_admissible(job(4))


def test_only_schedulable_unquarantined_nodes_of_the_run_count():
    big = [node("h100-big", 16, H100)]
    flavors = [flavor("h100", H100)]
    one_queue = queue((["nvidia.com/gpu"], ["h100"]))
    # the run's node_names leave the 16-GPU node out
    kube = cluster([node("h100-0", 8, H100), *big], flavors, one_queue)
    assert GangCluster(kube).check_admissible(job(8, nodes=1, names=("h100-0",))) == "training"
    with pytest.raises(SharedNode, match="node h100-big has 16 allocatable nvidia.com/gpu and holds 2"):
        GangCluster(kube).check_admissible(job(8))
    # cordoned, or quarantined: no pod lands there
    cordoned = cluster(
        [node("h100-0", 8, H100), node("h100-big", 16, H100, unschedulable=True)], flavors, one_queue
    )
    assert GangCluster(cordoned).check_admissible(job(8)) == "training"
    taint = {"key": "trainops.io/quarantine", "value": "xid-79", "effect": "NoSchedule"}
    quarantined = cluster(
        [node("h100-0", 8, H100), node("h100-big", 16, H100, taints=[taint])], flavors, one_queue
    )
    assert GangCluster(quarantined).check_admissible(job(8)) == "training"


def test_check_queue_off_still_refuses_a_kueue_whose_tas_ignores_node_affinity():
    kube = cluster(
        [node("h100-0", 8, H100)], [flavor("h100", H100)], queue((["nvidia.com/gpu"], ["h100"])), "v0.13.9"
    )
    uncovered = job(8, extra_resources={"example.com/fpga": 1})
    with pytest.raises(KueueRelease):
        GangCluster(kube).check_admissible(uncovered, coverage=False)


def test_a_tas_flavor_the_gpus_do_not_go_through_is_refused_by_neither_the_doctor_nor_the_task():
    """One rule for both: only the flavors covering nvidia.com/gpu place the run by TAS."""
    cq = queue((["nvidia.com/gpu"], ["h100"]), (["example.com/fpga"], ["fpga"]))
    flavors = [flavor("h100", H100, topology=None), flavor("fpga", {}, topology="fpga-topology")]
    kube = cluster([node("h100-0", 8, H100)], flavors, cq, "v0.13.9")

    assert GangCluster(kube).check_admissible(job(8)) == "training"
    said, problems = check_release(Reads(kube, Deadline(10)), DoctorConfig())
    assert problems == [] and "no TAS flavor" in said

    kube.objects["resourceflavors"]["h100"] = flavor("h100", H100)  # the GPUs' flavor under TAS: both refuse
    with pytest.raises(KueueRelease):
        GangCluster(kube).check_admissible(job(8))
    said, problems = check_release(Reads(kube, Deadline(10)), DoctorConfig())
    assert [p.what.split(" ")[:2] for p in problems] == [["Kueue", "v0.13.9"]]


def test_a_pods_request_is_kubernetes_effective_request():
    """The larger of the containers' sum and the largest init container, plus overhead (what TAS counts)."""
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "4", "cpu": "2"}}},
            {"resources": {"requests": {"cpu": "2", "memory": "0"}}},
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "8", "nvidia.com/gpu": "2"}}},
            {"resources": {"limits": {"rdma/ib": "1"}}},
        ],
        "overhead": {"cpu": "500m", "memory": "64Mi"},
    }
    assert pod_requests(spec) == {"cpu": 8.5, "nvidia.com/gpu": 4.0, "rdma/ib": 1.0, "memory": 64 * 2**20}
