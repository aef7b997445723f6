"""The gate and the claim place a run by the fabric on the devcluster (two blocks of two racks of four):
nodes held by another run and a quarantined one leave the blocks with different free capacity."""

from __future__ import annotations

import pytest

from tests.devcluster.ctrl_support import wait_for
from trainops.capacity.procedure import PlacementFailed, claim, give_back
from trainops.health.gate import GateConfig, run_gate
from trainops.kube.client import Kube
from trainops.placement.request import BLOCK_LABEL, RACK_LABEL, TopologyRequest
from trainops.training.job import build_job
from trainops.training.spec import TrainingSpec

RUN, OTHER = "train_llm/manual__1", "train_llm/manual__2"


def block_of(devcluster, node: str) -> str:
    return devcluster.store.get("nodes", "", node)["metadata"]["labels"][BLOCK_LABEL]


def rack_of(devcluster, node: str) -> tuple[str, str]:
    labels = devcluster.store.get("nodes", "", node)["metadata"]["labels"]
    return labels[BLOCK_LABEL], labels[RACK_LABEL]


@pytest.fixture
def devcluster(make_devcluster):
    return make_devcluster(inference=[])


def test_preferred_block_claims_run_and_spare_in_the_block_that_fits_them_best(devcluster):
    kube = Kube.from_kubeconfig(str(devcluster.kubeconfig))
    claim(kube, OTHER, ["gpu-node-000", "gpu-node-001", "gpu-node-002"], cluster_queue="training")
    devcluster.inject("xid", "gpu-node-012", code=79)  # block-b: 7 healthy, block-a: 8 of which 3 held
    preferred = TopologyRequest("preferred", BLOCK_LABEL)
    config = GateConfig(min_nodes=5, topology=preferred, spares=1, speed_tiers=False)

    gate = wait_for(  # once the node's probe has reported the XID
        lambda: "gpu-node-012" not in (g := run_gate(kube.core, config)).selection.node_names and g
    )
    summary = claim(kube, RUN, gate.selected, count=5, cluster_queue="training", topology=preferred, spares=1)

    # the gate does not know about claims: block-a (8 healthy) holds more, block-b (7) fits best
    assert gate.enough and {block_of(devcluster, n) for n in gate.placement.nodes} == {"block-b"}
    # the claim does: block-a has 5 free, block-b 7; the tighter block-a holds run and spare, the run in
    # its one free rack, the spare beside it
    assert {block_of(devcluster, n) for n in summary.node_names} == {"block-a"}
    placement = summary.placement
    assert placement["domains"][BLOCK_LABEL] == ["block-a"] and placement["spares"] == ["gpu-node-003"]
    assert {rack_of(devcluster, n) for n in placement["run"]} == {("block-a", "rack-2")}
    give_back(kube, RUN, cluster_queue="training")
    give_back(kube, OTHER, cluster_queue="training")


def test_required_rack_that_no_rack_holds_is_not_enough_for_the_gate_and_fails_the_claim(devcluster):
    kube = Kube.from_kubeconfig(str(devcluster.kubeconfig))
    required = TopologyRequest("required", RACK_LABEL)

    gate = run_gate(kube.core, GateConfig(min_nodes=5, topology=required, speed_tiers=False))

    assert not gate.enough
    assert gate.missing() == (
        f"placement (required {RACK_LABEL}): no {RACK_LABEL} domain holds 5 free node(s) (required); the largest "
        "hold: block-a/rack-1 4, block-a/rack-2 4, block-b/rack-1 4, block-b/rack-2 4"
    )
    every = [f"gpu-node-{i:03d}" for i in range(16)]
    with pytest.raises(PlacementFailed, match=f"no {RACK_LABEL} domain holds 5 free node"):
        claim(kube, RUN, every, count=5, cluster_queue="training", topology=required)
    assert not [
        n
        for n in every
        if "trainops.io/claimed-by"
        in (devcluster.store.get("nodes", "", n)["metadata"].get("annotations") or {})
    ]


def test_the_job_asks_kueue_for_the_topology_on_its_pod_template():
    spec = TrainingSpec(
        image="trainer:1",
        command=["train"],
        run_uri="s3://b/runs/r/",
        nodes=2,
        topology={
            "mode": "required",
            "level": RACK_LABEL,
            "levels": [BLOCK_LABEL, RACK_LABEL, "kubernetes.io/hostname"],
        },
    )

    template = build_job(spec, name="j", dag_id="d", run_id="r", attempt=1, resume_from=None)["spec"][
        "template"
    ]

    assert template["metadata"]["annotations"] == {"kueue.x-k8s.io/podset-required-topology": RACK_LABEL}
    plain = TrainingSpec(
        image="trainer:1", command=["train"], run_uri="s3://b/runs/r/", topology={"mode": "none"}
    )
    assert (
        "annotations"
        not in build_job(plain, name="j", dag_id="d", run_id="r", attempt=1, resume_from=None)["spec"][
            "template"
        ]["metadata"]
        and plain.topology is None
    )
    with pytest.raises(ValueError, match="topology_level 'rack' is not one of the topology's levels"):
        TrainingSpec(
            image="t", command=["t"], run_uri="s3://b/r/", topology={"mode": "preferred", "level": "rack"}
        )
