"""The lifecycle form reaches DCGM and the fabric: ``prometheus_conn_id`` is used by the gate, and the
claimed nodes' InfiniBand ports are checked again (``fabric_ready``) before the run gets them."""

from __future__ import annotations

import json
import time

import pytest
from trainops_devcluster.airflow_home import xcom_value

from tests.e2e.conftest import DAG_ID, assert_capacity_back, lifecycle_conf, task_instances, writes
from tests.training.conftest import pods

UNREACHABLE = json.dumps({"conn_type": "http", "host": "http://127.0.0.1:9"})  # discard port: refused


def test_an_unreachable_prometheus_fails_the_gate_before_any_write(
    cluster, bucket, run_dag, capfd, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_PROM_DOWN", UNREACHABLE)
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "prom-down", prometheus_conn_id="prom_down"))

    assert dag_run.state == "failed" and task_instances(dag_run)["health_gate"].state == "failed"
    assert "probe-only" in capfd.readouterr().out  # the error names the way out
    assert writes(cluster) == []


def test_probe_only_gates_on_the_probe_and_fabric_ready_hands_train_its_nodes(
    cluster, api, bucket, run_dag, monkeypatch, capacity_before
):
    monkeypatch.setenv("AIRFLOW_CONN_PROM_DOWN", UNREACHABLE)
    conf = lifecycle_conf(
        bucket, "probe-only", prometheus_conn_id="prom_down", on_prometheus_unavailable="probe-only"
    )
    dag_run = run_dag(DAG_ID, conf)

    assert dag_run.state == "success"
    gate = xcom_value(dag_run, "health_gate")
    assert any("Prometheus unavailable" in w for w in gate["warnings"])
    claimed = xcom_value(dag_run, "claim_nodes")["node_names"]
    fabric = xcom_value(dag_run, "fabric_ready")
    assert sorted(fabric["node_names"]) == sorted(claimed)
    assert {p["spec"]["nodeName"] for p in pods(api)} <= set(fabric["node_names"])
    assert_capacity_back(api, capacity_before)


def test_fabric_ready_hands_on_only_nodes_that_pass_when_it_returns(cluster):
    """A port that goes down after the trigger saw the nodes pass is waited for again, not handed to train."""
    from airflow.sdk.exceptions import TaskDeferred
    from trainops.sensors.health import FabricHealthSensor

    nodes = ["gpu-node-001", "gpu-node-002"]
    sensor = FabricHealthSensor(task_id="fabric_ready", node_names=nodes, timeout=60)
    ready = {"status": "ready", "selected": nodes, "deadline": time.time() + 60}
    assert sorted(sensor.execute_complete({}, ready)["node_names"]) == nodes

    cluster.inject("ib-down", nodes[1])
    cluster.probe_daemon.wait_rounds(2)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute_complete({}, ready)
    assert deferred.value.trigger.deadline == ready["deadline"]  # the wait keeps the sensor's deadline
