"""Kept-out nodes and one pod per node under Kueue's Topology Aware Scheduling, per Kueue release.

TAS, not the kube-scheduler, picks each pod's node.  Before 0.13.10 and 0.14.5 it ignores the pods'
required node affinity (kueue#7728; fixed in 0.15.0 by #7899, backported by #7936 and #7937), which is
how trainops keeps a resume off the nodes it blames: the devcluster plays such a release with
``KueueConfig(controller_version=...)``, and ``trainops doctor`` refuses it.  A quarantined culprit's
``trainops.io/quarantine`` taint is honoured in every release (#3678).  No release looks at pod
anti-affinity, so two pods that fit one node may be assigned to it: the training task refuses such a
run before it submits anything (``GangCluster.check_admissible``).
"""

from __future__ import annotations

import pytest
from kubernetes.client import AppsV1Api
from trainops_devcluster.kueue import KueueConfig

from tests.devcluster.ctrl_support import wait_for
from trainops.capacity.procedure import claim
from trainops.conventions import QUARANTINE_TAINT
from trainops.doctor.config import DoctorConfig
from trainops.doctor.kueue import check_api
from trainops.doctor.reads import Reads
from trainops.kube.client import Kube
from trainops.kube.kueue import topology_domains
from trainops.kube.kueue_release import release_of, tas_honours_node_affinity
from trainops.kube.retry import Deadline
from trainops.training.cluster import GangCluster, KueueRelease, SharedNode
from trainops.training.job import build_job
from trainops.training.spec import TrainingSpec

NS = "training"
RUN = "d/r"


def start(make_devcluster, claimed: int, *, version: str = "v1beta1", controller: str | None = None):
    """A devcluster of one rack of ``claimed`` 8-GPU nodes, all claimed for run ``d/r``, with TAS on."""
    config = KueueConfig(version=version, topology_aware_scheduling=True, controller_version=controller)
    dev = make_devcluster(
        nodes=claimed, fabric=str(claimed), inference=[], system_nodes=0, kueue_config=config
    )
    kube = Kube.from_kubeconfig(str(dev.kubeconfig))
    names = [f"gpu-node-{i:03d}" for i in range(claimed)]
    claim(kube, RUN, names, cluster_queue="training")
    return dev, kube, names


def attempt(names: list[str], *, nodes: int, gpus: int, kept_out: dict | None = None) -> dict:
    spec = TrainingSpec(
        image="trainer:1",
        command=["python", "-m", "train"],
        run_uri="s3://b/runs/r1",
        nodes=nodes,
        gpus_per_node=gpus,
        node_names=names,
        shm_size=None,
    )
    return build_job(
        spec,
        name="train-r-a2",
        dag_id="d",
        run_id="r",
        attempt=2,
        resume_from="s3://b/runs/r1/step-40/",
        excluded_nodes=kept_out,
    )


def workload(kube: Kube, version: str) -> dict | None:
    found = kube.custom.list_namespaced_custom_object("kueue.x-k8s.io", version, NS, "workloads")["items"]
    return found[0] if found else None


def assigned(kube: Kube, version: str) -> list[tuple[str, int]]:
    """Each node of the admitted Workload's topology assignment and its pods."""

    def read():
        found = workload(kube, version)
        assignments = (((found or {}).get("status") or {}).get("admission") or {}).get("podSetAssignments")
        if not assignments or not assignments[0].get("topologyAssignment"):
            return None
        return [(values[-1], count) for values, count in topology_domains(assignments[0])[1]]

    return wait_for(read)


def quarantine(kube: Kube, name: str) -> None:
    node = kube.core.read_node(name)
    taint = {"key": QUARANTINE_TAINT, "value": "xid-79", "effect": "NoSchedule"}
    kube.core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in node.spec.taints] + [taint]}})


# ---- the release rule ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "honoured"),
    [
        ("v0.13.0", False),
        ("v0.13.9", False),
        ("v0.13.10", True),
        ("v0.13.12", True),
        ("v0.14.0", False),
        ("v0.14.4", False),
        ("v0.14.5", True),
        ("v0.15.0", True),
        ("v0.19.2", True),
    ],
)
def test_tas_honours_required_node_affinity_from_0_13_10_0_14_5_and_0_15_0(version, honoured):
    assert tas_honours_node_affinity(release_of(version)) is honoured
    line = "v1beta2" if release_of(version) >= (0, 15, 0) else "v1beta1"
    config = KueueConfig(version=line, controller_version=version)
    assert config.tas_node_affinity is honoured


def test_a_controller_version_that_does_not_serve_the_api_version_is_refused():
    with pytest.raises(ValueError, match="controller_version"):
        KueueConfig(version="v1beta2", controller_version="v0.14.5")
    with pytest.raises(ValueError, match="controller_version"):
        KueueConfig(version="v1beta1", controller_version="0.15")
    assert KueueConfig(version="v1beta1").controller_version == "v0.13.10"


def kueue_controller(kube: Kube, version: str) -> AppsV1Api:
    """Kueue's controller Deployment as its release manifests name it, image tag ``version`` (no pods)."""
    kube.core.create_namespace({"metadata": {"name": "kueue-system"}})
    labels = {"control-plane": "controller-manager"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "kueue-controller-manager", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "manager", "image": f"registry.k8s.io/kueue/kueue:{version}"}]
                },
            },
        },
    }
    apps = AppsV1Api(kube.core.api_client)
    apps.create_namespaced_deployment("kueue-system", deployment)
    return apps


# ---- kept-out nodes ------------------------------------------------------------------------------
def test_before_0_13_10_tas_places_a_resume_on_a_node_kept_out_by_affinity_alone(make_devcluster):
    """The hazard: 0.13.9 ignores the affinity, picks the kept-out node, and the pod stays Pending."""
    dev, kube, names = start(make_devcluster, 2, controller="v0.13.9")
    kube.batch.create_namespaced_job(NS, attempt(names, nodes=1, gpus=8, kept_out={names[0]: "slowed"}))

    assert assigned(kube, "v1beta1") == [(names[0], 1)]
    pod = wait_for(
        lambda: (
            (p := kube.core.list_namespaced_pod(NS).items)
            and any(c.reason == "Unschedulable" for c in p[0].status.conditions or [])
            and p[0]
        )
    )
    assert pod.spec.node_name is None  # the kube-scheduler honours the affinity TAS ignored


@pytest.mark.parametrize("controller", ["v0.13.10", "v0.14.5"])
def test_from_0_13_10_and_0_14_5_tas_keeps_a_resume_off_a_kept_out_node(make_devcluster, controller):
    dev, kube, names = start(make_devcluster, 2, controller=controller)
    kube.batch.create_namespaced_job(NS, attempt(names, nodes=1, gpus=8, kept_out={names[0]: "slowed"}))

    assert assigned(kube, "v1beta1") == [(names[1], 1)]
    wait_for(lambda: (p := kube.core.list_namespaced_pod(NS).items) and p[0].spec.node_name == names[1])


def test_on_0_13_9_a_quarantined_culprit_is_never_chosen_its_taint_is_honoured(make_devcluster):
    dev, kube, names = start(make_devcluster, 3, controller="v0.13.9")
    quarantine(kube, names[0])
    job = attempt(names, nodes=2, gpus=8, kept_out={names[0]: "XID 79"})
    kube.batch.create_namespaced_job(NS, job)

    assert sorted(assigned(kube, "v1beta1")) == [(names[1], 1), (names[2], 1)]
    bound = wait_for(
        lambda: (
            len(p := [x.spec.node_name for x in kube.core.list_namespaced_pod(NS).items if x.spec.node_name])
            == 2
            and p
        )
    )
    assert names[0] not in bound


def test_doctor_refuses_a_kueue_whose_tas_ignores_required_node_affinity(make_devcluster):
    dev, kube, names = start(make_devcluster, 1, controller="v0.13.9")
    config = DoctorConfig()

    outcome = check_api(Reads(kube, Deadline(20)), config)
    assert (
        outcome.problems == []
        and "controller version unknown (no Deployment kueue-system/kueue-controller-manager"
        in outcome.summary
    )

    apps = kueue_controller(kube, "v0.13.9")
    outcome = check_api(Reads(kube, Deadline(20)), config)
    assert [p.what for p in outcome.problems] == [
        "Kueue v0.13.9 (Deployment kueue-system/kueue-controller-manager) places pods by Topology Aware "
        "Scheduling (ResourceFlavor gpu) but ignores their required node affinity (kueue#7728, fixed in "
        "0.13.10, 0.14.5 and 0.15.0): a resume may be placed on a node trainops keeps out of the run, or "
        "outside the run's claimed nodes, where its pod stays Pending until waitForPodsReady requeues it, "
        "maybe again and again"
    ]
    assert "v0.13.10 or later" in outcome.problems[0].fix

    apps.patch_namespaced_deployment(
        "kueue-controller-manager",
        "kueue-system",
        {"metadata": {"labels": {"app.kubernetes.io/version": "v0.13.10"}}},
    )
    outcome = check_api(Reads(kube, Deadline(20)), config)
    assert outcome.problems == [] and "controller v0.13.10" in outcome.summary


# ---- one pod per node ----------------------------------------------------------------------------
def test_tas_ignores_anti_affinity_so_a_run_two_of_whose_pods_fit_a_node_is_refused(make_devcluster):
    dev, kube, names = start(make_devcluster, 2, version="v1beta2")
    cluster = GangCluster(kube)
    shared = attempt(names, nodes=2, gpus=4)

    with pytest.raises(SharedNode) as refused:
        cluster.check_admissible(shared)
    message = str(refused.value)
    assert "gpus_per_node is 4 but node gpu-node-000 has 8 allocatable nvidia.com/gpu" in message
    assert "ignores pod anti-affinity" in message and "Set gpus_per_node to 8" in message

    kube.batch.create_namespaced_job(NS, shared)  # what the check prevents: TAS packs both on one node
    assert [count for _, count in assigned(kube, "v1beta2")] == [2]


def test_a_run_whose_pods_take_whole_nodes_gets_one_node_per_pod(make_devcluster):
    dev, kube, names = start(make_devcluster, 3, version="v1beta2")
    job = attempt(names, nodes=3, gpus=8)
    assert GangCluster(kube).check_admissible(job) == "training"

    kube.batch.create_namespaced_job(NS, job)
    placed = assigned(kube, "v1beta2")
    assert sorted(placed) == [(name, 1) for name in names]
    bound = wait_for(
        lambda: (
            len(p := [x.spec.node_name for x in kube.core.list_namespaced_pod(NS).items if x.spec.node_name])
            == 3
            and p
        )
    )
    assert sorted(bound) == names


@pytest.mark.parametrize(("controller", "refused"), [("v0.13.9", True), ("v0.13.10", False)])
def test_the_training_task_refuses_a_kueue_whose_tas_ignores_required_node_affinity(
    make_devcluster, controller, refused
):
    dev, kube, names = start(make_devcluster, 2, controller=controller)
    kueue_controller(kube, controller)
    job = attempt(names, nodes=1, gpus=8, kept_out={names[0]: "slowed"})
    if not refused:
        assert GangCluster(kube).check_admissible(job) == "training"
        return
    with pytest.raises(KueueRelease) as error:
        GangCluster(kube).check_admissible(job)
    assert str(error.value).startswith(
        "Kueue cannot keep Job training/train-r-a2 off the nodes trainops keeps out: Kueue v0.13.9 "
        "(Deployment kueue-system/kueue-controller-manager) places pods by Topology Aware Scheduling"
    )
    assert "nothing was submitted. Fix: upgrade Kueue to v0.13.10 or later" in str(error.value)
