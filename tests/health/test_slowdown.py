"""Speed evidence from work: per-node step times in the training run's heartbeat find the node that
slowed down; kept on the node, it keeps the node out of the next gate for the fault window."""

from __future__ import annotations

import time

import pytest
from kubernetes import client, config

from trainops.checkpoints.helper import gather_step_seconds, heartbeat
from trainops.health.gate import GateConfig, run_gate
from trainops.health.slowdown import (
    SLOWDOWN_ANNOTATION,
    Slowdown,
    node_step_seconds,
    nodes_by_rank,
    record,
    recorded,
    slow_nodes,
)
from trainops.kube.retry import Deadline

NODES = {str(rank): f"gpu-node-{rank:03d}" for rank in range(6)}


def beat(**seconds) -> dict:
    return {
        "step": 400,
        "time": 1_700_000_000.0,
        "node_step_s": {k.removeprefix("r"): v for k, v in seconds.items()},
    }


def test_the_node_whose_steps_slowed_down_is_found_with_its_evidence():
    found = slow_nodes(beat(r0=1.00, r1=1.02, r2=0.99, r3=1.43, r4=1.01, r5=1.00), NODES, run="dag/run-1")
    assert list(found) == ["gpu-node-003"]
    slow = found["gpu-node-003"]
    assert (slow.step_s, slow.median_s, slow.pct_slower) == (1.43, 1.005, 42.3)
    assert slow.reason == (
        "slowed down in training of run dag/run-1: 1.43s per step against the run's median 1s (42% slower), "
        "seen 2023-11-14T22:13:20Z"
    )


@pytest.mark.parametrize(
    "seconds",
    [
        {
            "r0": 1.00,
            "r1": 1.02,
            "r2": 0.99,
            "r3": 1.06,
            "r4": 1.01,
            "r5": 1.00,
        },  # 6% slower: within the noise
        {"r0": 1.0, "r1": 2.0},  # two nodes: no statistics
        {},
    ],
)
def test_no_node_is_slow_without_evidence(seconds):
    assert slow_nodes(beat(**seconds), NODES) == {}


@pytest.mark.parametrize(
    ("node_step_s", "message"),
    [
        ([1.0, 2.0], "must be an object of at most"),
        ({"rank-0": 1.0}, "is not a node rank"),
        ({"0": -1}, "node_step_s[0] must be positive seconds"),
        ({"0": True}, "node_step_s[0] must be positive seconds"),
        ({"0": float("inf")}, "node_step_s[0] must be positive seconds"),
    ],
)
def test_a_hostile_heartbeat_is_refused_naming_the_field(node_step_s, message):
    with pytest.raises(ValueError) as raised:
        node_step_seconds({"step": 1, "time": 1.0, "node_step_s": node_step_s})
    assert message in str(raised.value)


def test_the_helper_reports_step_seconds_per_node_rank(monkeypatch):
    monkeypatch.setenv("NODE_RANK", "3")
    assert gather_step_seconds(1.25) == {"3": 1.25}  # torch.distributed not initialised: this node only

    class Store:
        def put(self, bucket, key, body):
            self.body = body

    store = Store()
    written = heartbeat(10, run_uri="s3://b/runs/r/", node_step_s={3: 1.25, "4": 1}, store=store)
    assert written["node_step_s"] == {"3": 1.25, "4": 1.0}
    assert node_step_seconds(written) == {"3": 1.25, "4": 1.0}


def test_a_recorded_slowdown_keeps_the_node_out_of_the_next_gate_for_the_fault_window(make_devcluster):
    cluster = make_devcluster(nodes=4)
    cluster.probe_daemon.wait_rounds(1)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core = client.CoreV1Api(api)
    now = time.time()
    slow = Slowdown("gpu-node-002", 1.43, 1.0, 43.0, now - 600, "dag/run-1")
    assert record(core, slow, Deadline(30))
    assert recorded(cluster.store.get("nodes", "", "gpu-node-002")["metadata"]["annotations"]) == slow

    result = run_gate(core, GateConfig(speed_tiers=False), now=now)
    verdict = {n.name: n for n in result.nodes}["gpu-node-002"]
    assert verdict.verdict == "exclude" and "gpu-node-002" not in result.selected
    assert verdict.reasons[0].startswith("slowed_in_training [node] slowed down in a training run")
    assert "slowdown_pct=43.0" in verdict.reasons[0] and "(last seen " in verdict.reasons[0]

    record(core, Slowdown("gpu-node-002", 1.43, 1.0, 43.0, now - 7300, "dag/run-1"), Deadline(30))
    later = run_gate(core, GateConfig(speed_tiers=False), now=now)  # seen before the window
    assert "gpu-node-002" in later.selected
    api.close()


def test_a_malformed_annotation_is_no_slowdown():
    assert recorded({SLOWDOWN_ANNOTATION: '{"node": "n"'}) is None
    assert (
        recorded(
            {SLOWDOWN_ANNOTATION: '{"node": "n", "step_s": 1, "median_s": 1, "pct_slower": 1, "at": "x"}'}
        )
        is None
    )


def test_a_resume_leaves_out_the_node_the_attempts_step_times_show_slow(make_devcluster, s3, bucket):
    """The attempt's last heartbeat says node rank 2 computed its steps 50% slower than the others: the
    judgement of the attempt (here a hang) keeps that node out of the next attempt and on the node for
    the next gate."""
    import sys

    from tests.devcluster.ctrl_support import wait_for
    from tests.training.conftest import training_run
    from trainops.capacity.procedure import claim
    from trainops.kube.client import Kube
    from trainops.training.decide import Follow
    from trainops.training.follow import Outcome, Status
    from trainops.training.spec import TrainingSpec

    cluster = make_devcluster(nodes=6, process_env=s3.env())
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    nodes = ["gpu-node-003", "gpu-node-004", "gpu-node-005"]
    claim(kube, "dag/slow", nodes, cluster_queue="training")
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=["--steps", "400", "--step-seconds", "0.05"],
        run_uri=f"s3://{bucket}/runs/slow/",
        nodes=3,
        node_names=nodes,
    )
    run = training_run(kube, spec, "slow")
    first = run.reconcile().attempt
    calls = run.cluster

    def running() -> list[dict] | None:
        pods = [p for p in calls.job_pods("training", first.job) if p["status"].get("phase") == "Running"]
        return pods if len(pods) == 3 else None

    placed = nodes_by_rank(wait_for(running, "three running pods"))
    slow_node = placed["2"]
    beat = {"step": 120, "time": time.time(), "node_step_s": {"0": 1.0, "1": 1.02, "2": 1.5}}
    # the slow rank holds every step back until the run is judged hung (the follower's verdict)
    pods = calls.job_pods("training", first.job)
    run.followed = first
    action = run.reconcile(seen=Outcome(Status.HANG, "no progress", first.job, pods, heartbeat=beat))

    assert isinstance(action, Follow) and action.attempt.number == 2  # resumed
    assert action.attempt.kept_out[slow_node].startswith(
        "slowed down in training of run dag/slow: 1.5s per step"
    )
    kept = recorded(cluster.store.get("nodes", "", slow_node)["metadata"]["annotations"])
    assert (kept.node, kept.pct_slower, kept.run) == (slow_node, 47.1, "dag/slow")
    assert set(action.attempt.kept_out) == {slow_node}
    assert run.observe().attempts[0].end.slowed.keys() == {slow_node}  # on the ledger, not blamed
