"""Elastic resume with the real PyTorch trainer (FSDP2 over gloo on CPU, sharded DCP in S3): a 3-rank run
on its 3 claimed nodes loses one (it stops responding), no spare is left, and after the bounded wait it resumes on
the 2 nodes there are, from its last verified checkpoint, with the state it loaded equal bit for bit to
the one saved at world size 3."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

from tests.training.conftest import heartbeat_step, idle_nodes, jobs, node, run_to_end, training_run, when
from tests.training.test_gang_e2e import env_of, running_pod
from trainops.conventions import CLAIMED_BY_ANNOTATION, HEALTH_LABEL

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "torch_trainer" / "train.py"
STEPS, EVERY = 40, 10


@pytest.fixture
def devcluster(make_devcluster, s3):
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return make_devcluster(process_env={**s3.env(), "PATH": path})


def test_a_three_rank_torch_run_loses_a_node_and_resumes_at_world_size_two_from_its_dcp_checkpoint(
    cluster, api, s3, bucket, caplog
):
    import boto3
    from trainops_devcluster.demo.torch_checks import load_trainer, saved_state_digest

    from trainops.capacity.procedure import claim
    from trainops.kube.client import Kube
    from trainops.training.decide import Succeed
    from trainops.training.spec import TrainingSpec

    caplog.set_level(logging.INFO, logger="trainops")
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    nodes = idle_nodes(api)[:3]
    claim(kube, "dag/elastic", nodes, cluster_queue="training")
    run_uri = f"s3://{bucket}/runs/elastic/"
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, str(TRAINER)],
        args=["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--step-seconds", "0.2"],
        run_uri=run_uri,
        nodes=3,
        min_nodes=2,
        elastic_wait_s=2,  # no spare can come: the wait is only gone through
        gpus_per_node=0,  # gloo on CPU
        # a pod that requests nothing gets no flavor, which a TAS-only ClusterQueue cannot place; more than
        # half a node's 192 CPUs: TAS ignores anti-affinity, and a node that held two ranks is refused
        cpu="100",
        node_names=nodes,
    )
    culprit: dict = {}

    def lose_a_node():
        culprit["node"] = running_pod(api, "1")["spec"]["nodeName"]
        cluster.inject("node-notready", culprit["node"])

    # after the first checkpoint, before the second: the resume loads step 10's three shards
    when(lambda: heartbeat_step(s3, run_uri) >= EVERY + 3 and running_pod(api, "1"), lose_a_node)
    run = training_run(kube, spec, "elastic", max_resumes=1)
    action = run_to_end(cluster, run)

    assert isinstance(action, Succeed), action
    first, second = run.observe().attempts
    assert (first.nodes, second.nodes) == (3, 2)  # the ledger says each attempt's world size
    assert second.kept_out.keys() == {culprit["node"]}
    assert node(api, culprit["node"])["metadata"]["labels"][HEALTH_LABEL] == "quarantined"
    assert "waiting up to 2s for more before resuming on fewer (min_nodes=2)" in caplog.text
    assert "elastic resume on 2 of 3 nodes (2 free, min_nodes=2)" in caplog.text
    job = next(j for j in jobs(api) if j["metadata"]["name"] == second.job)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2  # Kueue's PodSet: the smaller gang
    assert env_of(job)["WORLD_SIZE"] == env_of(job)["TRAINOPS_WORLD_SIZE"] == "2"

    trainer = load_trainer(TRAINER)
    s3c, (bucket_name, prefix) = boto3.client("s3"), trainer.split_uri(run_uri)
    record = json.loads(
        s3c.get_object(Bucket=bucket_name, Key=f"{prefix}resumes/attempt-2.json")["Body"].read()
    )
    saved, saved_step = saved_state_digest(trainer, record["from"])
    assert record["from"] == run_uri + f"step-{EVERY}/" and record["step"] == saved_step == EVERY
    assert record["state_sha256"] == saved  # loaded at world size 2 what was saved at world size 3
    keys = {
        o["Key"][len(prefix) :] for o in s3c.list_objects_v2(Bucket=bucket_name, Prefix=prefix)["Contents"]
    }
    assert {f"step-{EVERY}/__{rank}_0.distcp" for rank in range(3)} <= keys  # saved by 3 ranks
    assert {f"step-{STEPS}/__{rank}_0.distcp" for rank in range(2)} <= keys  # then by 2
    assert f"step-{STEPS}/__2_0.distcp" not in keys and f"step-{STEPS}/_COMMITTED" in keys


@pytest.mark.parametrize(
    "change, usable",
    [
        ({}, True),
        ({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}, False),
        ({"unschedulable": True}, False),
        ({"taints": [{"key": "trainops.io/quarantine", "value": "xid-79", "effect": "NoSchedule"}]}, False),
        ({"labels": {HEALTH_LABEL: "quarantined"}}, False),
        ({"mode": "inference"}, False),  # not claimed (yet): the run's pods do not tolerate it
        ({"annotations": {CLAIMED_BY_ANNOTATION: "dag/run"}}, True),
        ({"annotations": {CLAIMED_BY_ANNOTATION: "dag/other"}}, False),  # another run trains on it
    ],
    ids=[
        "ready-training-node",
        "not-ready",
        "cordoned",
        "quarantine-taint",
        "quarantine-label",
        "inference",
        "claimed-by-this-run",
        "claimed-by-another-run",
    ],
)
def test_the_nodes_an_elastic_resume_counts_as_free(change, usable):
    from trainops.training.cluster import _usable

    mode = {"key": "trainops.io/mode", "value": change.get("mode", "training"), "effect": "NoSchedule"}
    node_obj = {
        "metadata": {
            "name": "gpu-node-1",
            "labels": change.get("labels", {}),
            "annotations": change.get("annotations", {}),
        },
        "spec": {
            "taints": [mode, *change.get("taints", [])],
            "unschedulable": change.get("unschedulable", False),
        },
        "status": change.get("status", {"conditions": [{"type": "Ready", "status": "True"}]}),
    }
    assert _usable(node_obj, "dag/run") is usable
