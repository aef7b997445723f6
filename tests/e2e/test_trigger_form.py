"""Bad trigger-form params are rejected with a message naming the field, and nothing in the cluster changes.

The form checks what JSON-schema can (the run is never created); the run path is reserved before the
gate, and the gate checks what needs the cluster before it writes anything.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import DAG_ID, lifecycle_conf, task_instances, writes
from trainops.checkpoints.owner import claim_run_path
from trainops.checkpoints.store import CheckpointStore


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("nodes", -1, "-1"),
        ("run_name", "My_Run", "My_Run"),
        ("checkpoint_uri", "s3:///runs/", "s3:///runs/"),
        ("health_policy_overrides", {"no_such_row": {"threshold": 1}}, "no_such_row"),
        ("topology", "sometimes", "sometimes"),
        ("min_nodes", 0, "0"),
    ],
)
def test_the_form_rejects_a_bad_param_naming_it_and_the_cluster_sees_no_write(
    cluster, bucket, run_dag, field, value, named
):
    from airflow.sdk.definitions.param import ParamValidationError

    conf = {**lifecycle_conf(bucket, "bad"), field: value}
    with pytest.raises(ParamValidationError) as rejected:
        run_dag(DAG_ID, conf)

    assert field in str(rejected.value) and named in str(rejected.value)
    assert writes(cluster) == []


@pytest.mark.parametrize(
    "params, named",
    [
        ({"nodes": 9}, "min_nodes: 10 node(s) needed, but the cluster has 8 node(s) matching"),
        ({"gpus_per_node": 16}, "gpus_per_node: 16 asked, but no node matching"),
        (
            {"topology": "required", "topology_level": "rack"},
            "topology_level 'rack' is not one of the topology's levels",
        ),
        ({"nodes": 2, "min_nodes": 3}, "min_nodes must be an integer from 1 to nodes (2), got 3"),
    ],
    ids=[
        "more-nodes-than-the-cluster",
        "more-gpus-per-node-than-any-node",
        "a-level-the-topology-lacks",
        "min-nodes-above-nodes",
    ],
)
def test_a_run_the_cluster_cannot_hold_fails_at_the_gate_naming_the_field_before_any_write(
    cluster, bucket, run_dag, capfd, params, named
):
    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "too-big", **params))

    assert dag_run.state == "failed"
    assert task_instances(dag_run)["health_gate"].state == "failed"
    assert named in capfd.readouterr().out
    assert writes(cluster) == []


def test_an_unknown_policy_row_that_reaches_the_gate_fails_naming_the_row_before_any_write(cluster, capfd):
    """A caller that skips the form (the operator used from code) still gets the check, in the gate."""
    from airflow.sdk.exceptions import AirflowFailException
    from trainops.operators.health import NodeHealthGateOperator

    gate = NodeHealthGateOperator(task_id="gate", policy_overrides={"no_such_row": {"threshold": 1}})
    with pytest.raises(AirflowFailException, match="unknown health policy row 'no_such_row'"):
        gate.execute({})
    assert writes(cluster) == []


def test_a_run_name_another_dag_run_owns_is_refused_before_the_gate_touches_a_node(
    cluster, bucket, run_dag, capfd
):
    claim_run_path(CheckpointStore(), f"s3://{bucket}/runs/taken/", "training_lifecycle/manual__earlier")

    dag_run = run_dag(DAG_ID, lifecycle_conf(bucket, "taken"))

    assert dag_run.state == "failed"
    states = {task_id: ti.state for task_id, ti in task_instances(dag_run).items()}
    assert states["reserve_run_path"] == "failed" and states["health_gate"] == "upstream_failed", states
    log = capfd.readouterr().out
    assert "belongs to DAG run 'training_lifecycle/manual__earlier'" in log
    assert "Trigger again with run_name left empty" in log
    assert writes(cluster) == []  # no quarantine, no claim: the gate never ran
