"""The gate's deferrable wait, its trigger, and the GPU/fabric sensors, in real DAG runs (dag.test())."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from trainops.hooks.health_gate import GateSpec
from trainops.triggers.health import HealthGateTrigger
from trainops_devcluster.airflow_home import xcom_value

# SLOW is one of the idle nodes (inference fills 000-011): the probe times its GEMM on idle GPUs only.
SLOW, A, B, OTHER = "gpu-node-013", "gpu-node-001", "gpu-node-002", "gpu-node-009"
WRITES = ("create", "update", "patch", "delete")


def node_lists(devcluster) -> int:
    return sum(
        1
        for e in devcluster.server.audit.entries()
        if e["verb"] == "list" and e["path"].startswith("/api/v1/nodes")
    )


def after_gate_looked(devcluster, times: int, change) -> threading.Thread:
    """Run ``change`` once the gate has listed the nodes ``times`` more times (it is waiting by then)."""
    start = node_lists(devcluster)

    def wait_then_change() -> None:
        while node_lists(devcluster) < start + times:
            time.sleep(0.05)
        change()

    thread = threading.Thread(target=wait_then_change, daemon=True)
    thread.start()
    return thread


def task_state(run, task_id: str) -> str:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}[task_id]


def test_gate_waits_deferred_until_enough_nodes_pass(devcluster, run_dag):
    devcluster.inject("slow-gpu", SLOW, factor=0.7)
    devcluster.probe_daemon.wait_rounds(2)
    fixed = after_gate_looked(devcluster, 3, lambda: devcluster.telemetry[SLOW].slow_gpu(1.0))

    run = run_dag("health_gate", {"min_nodes": 16, "wait_timeout_s": 600, "poll_interval_s": 0.2})

    fixed.join(timeout=5)
    assert run.state == "success"
    assert len(xcom_value(run, "gate")["node_names"]) == 16 and SLOW in xcom_value(run, "chosen")


def test_gate_fails_at_the_deadline_naming_what_is_missing(devcluster, run_dag):
    devcluster.inject("slow-gpu", SLOW, factor=0.7)
    devcluster.probe_daemon.wait_rounds(2)
    lists_before = node_lists(devcluster)

    run = run_dag("health_gate", {"min_nodes": 16, "wait_timeout_s": 1.5, "poll_interval_s": 0.2})

    assert run.state == "failed" and task_state(run, "gate") == "failed"
    assert node_lists(devcluster) - lists_before >= 2  # evaluated, deferred, re-evaluated by the trigger
    spec = GateSpec(min_nodes=16).to_dict()
    event = asyncio.run(anext(HealthGateTrigger(spec, deadline=time.time(), poll_interval_s=0.1).run()))
    assert event.payload["status"] == "timeout"
    assert event.payload["message"].startswith("need 16 healthy node(s), have 15 of 16 candidate(s)")
    assert f"{SLOW}: exclude: straggler" in event.payload["message"]


def test_trigger_serializes_and_reports_bad_input():
    trigger = HealthGateTrigger(GateSpec(min_nodes=3, side="gpu").to_dict(), 123.0, 5)
    path, kwargs = trigger.serialize()
    assert path == "trainops.triggers.health.HealthGateTrigger"
    assert HealthGateTrigger(**kwargs).serialize() == (path, kwargs)
    with pytest.raises(ValueError, match="unknown health policy row 'no_such_row'"):
        GateSpec(policy_overrides={"no_such_row": {"verdict": "ok"}}).config()


def test_unknown_policy_row_fails_the_gate_before_anything_changes(devcluster, run_dag):
    devcluster.inject("xid", A, code=79)
    devcluster.probe_daemon.wait_rounds(2)
    devcluster.server.audit.clear()
    run = run_dag("health_gate", {"policy_overrides": {"gpu_cnt": {"threshold": 4}}})
    assert task_state(run, "gate") == "failed"
    assert [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES] == []


def test_the_clusters_fabrics_reach_the_gate_and_a_bad_setting_fails_before_any_write(devcluster, run_dag):
    devcluster.probe_daemon.wait_rounds(1)
    devcluster.server.audit.clear()
    run = run_dag("health_gate", {"fabrics": {"default": {"rate": 400}}})  # no such setting
    assert task_state(run, "gate") == "failed"
    assert [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES] == []

    ndr = run_dag(
        "health_gate", {"min_nodes": 16, "fabrics": {"default": {"rate_gbps": 400}}, "fault_window_s": 600}
    )
    assert ndr.state == "success" and len(xcom_value(ndr, "chosen")) == 16
    xdr = run_dag(
        "health_gate", {"min_nodes": 1, "fabrics": {"default": {"rate_gbps": 800}}}
    )  # every port short
    assert task_state(xdr, "gate") == "failed"
    assert not any(e["verb"] in WRITES and "/nodes/" in e["path"] for e in devcluster.server.audit.entries())


def test_the_gate_names_the_memory_risk_of_an_elastic_resume_and_refuses_a_bad_peak(devcluster, run_dag):
    devcluster.probe_daemon.wait_rounds(1)
    # 50 GiB per GPU on 4 nodes is up to 100 GiB on 2, above an H100's 79.6 GiB (GFD: 81559 MiB); 3 nodes fit
    risky = run_dag("health_gate", {"min_nodes": 4, "resume_min_nodes": 2, "gpu_memory_gib": 50})
    assert risky.state == "success"
    (warning,) = [w for w in xcom_value(risky, "gate")["warnings"] if "GPU memory" in w]
    assert "min_nodes=2 of 4 nodes each GPU may need up to 100 GiB" in warning
    assert "nvidia.com/gpu.memory=81559" in warning and "set min_nodes >= 3" in warning
    safe = run_dag("health_gate", {"min_nodes": 4, "resume_min_nodes": 3, "gpu_memory_gib": 50})
    assert not [w for w in xcom_value(safe, "gate")["warnings"] if "GPU memory" in w]

    devcluster.server.audit.clear()
    bad = run_dag("health_gate", {"min_nodes": 4, "resume_min_nodes": 2, "gpu_memory_gib": "lots"})
    assert task_state(bad, "gate") == "failed"
    assert [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES] == []
    with pytest.raises(ValueError, match="gpu_memory_gib must be a number, got 'lots'"):
        GateSpec(min_nodes=4, resume_min_nodes=2, gpu_memory_gib="lots").config()


def test_sensors_wait_on_their_own_side(devcluster, run_dag):
    devcluster.inject("xid", A, code=79)
    devcluster.inject("ib-down", B)
    devcluster.probe_daemon.wait_rounds(2)

    run = run_dag("health_sensors", {"gpu_nodes": [B, OTHER], "fabric_nodes": [A, OTHER]})
    assert run.state == "success"
    assert sorted(xcom_value(run, "gpus")["node_names"]) == [B, OTHER]
    assert sorted(xcom_value(run, "fabric")["node_names"]) == [A, OTHER]

    run = run_dag("health_sensors", {"gpu_nodes": [A, OTHER], "fabric_nodes": [B]})
    assert task_state(run, "gpus") == "failed" and task_state(run, "fabric") == "failed"
    assert [e for e in devcluster.server.audit.entries() if e["verb"] in WRITES] == []
