"""A real ``torch.distributed`` job as devcluster pods: two ranks rendezvous through the Job's headless
Service (rank 0's DNS name) and save one sharded DCP checkpoint each step, committed through the helper."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import idle_nodes, node, raw
from trainops.conventions import MODE_TAINT, MODE_TRAINING

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "torch_trainer" / "train.py"


@pytest.fixture
def devcluster(make_devcluster, s3):
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return make_devcluster(process_env={**s3.env(), "PATH": path})


def to_training_mode(api, name: str) -> None:
    """What a claim does to a node's mode taint (the claim itself is tested elsewhere)."""
    from kubernetes import client

    current = node(api, name)
    taints = [t for t in current["spec"].get("taints") or [] if t["key"] != MODE_TAINT]
    taints.append({"key": MODE_TAINT, "value": MODE_TRAINING, "effect": "NoSchedule"})
    body = {
        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        "spec": {"taints": taints},
    }
    client.CoreV1Api(api).patch_node(name, body)


def test_two_torch_ranks_rendezvous_through_the_headless_service_and_save_sharded_dcp(
    cluster, k8s, s3, bucket
):
    from kubernetes import client

    from trainops.training.job import build_job, build_service
    from trainops.training.spec import TrainingSpec

    nodes = idle_nodes(k8s)[:2]
    for name in nodes:
        to_training_mode(k8s, name)
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, str(TRAINER)],
        args=["--steps", "4", "--checkpoint-every", "2", "--timeout-seconds", "60"],
        run_uri=f"s3://{bucket}/runs/torch/",
        nodes=2,
        gpus_per_node=0,  # gloo on CPU
        cpu="1",  # a pod that requests nothing gets no flavor, which a TAS-only ClusterQueue cannot place
        node_names=nodes,
    )
    core, batch = client.CoreV1Api(k8s), client.BatchV1Api(k8s)
    job = build_job(spec, name="torch-a1", dag_id="tests", run_id="torch", attempt=1, resume_from=None)
    created = raw(batch.create_namespaced_job("training", job, _preload_content=False))
    core.create_namespaced_service("training", build_service(spec, created))

    deadline = (
        time.monotonic() + 600
    )  # only stops a broken test from hanging (torch imports slowly on a busy machine)
    while not (
        conditions := {
            c["type"]
            for c in raw(batch.read_namespaced_job("torch-a1", "training", _preload_content=False))
            .get("status", {})
            .get("conditions")
            or []
            if c["status"] == "True"
        }
    ) & {"Complete", "Failed"}:
        assert time.monotonic() < deadline, "the torch Job did not finish"
        time.sleep(0.2)
    logs = {
        p.metadata.name: core.read_namespaced_pod_log(p.metadata.name, "training")
        for p in core.list_namespaced_pod(
            "training", label_selector="batch.kubernetes.io/job-name=torch-a1"
        ).items
    }
    assert "Complete" in conditions, logs

    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket, Prefix="runs/torch/")["Contents"]}
    for step in (2, 4):
        shards = {"__0_0.distcp", "__1_0.distcp", ".metadata", "_COMMITTED", "trainops-manifest.json"}
        assert {f"runs/torch/step-{step}/{name}" for name in shards} <= keys
    assert any("[rank 1/2] training done at step 4" in log for log in logs.values())
    assert any("[rank 0/2] checkpoint s3://" in log and "step-4/ committed" in log for log in logs.values())
