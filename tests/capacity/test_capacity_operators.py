"""The operators in a real DAG (dag.test()) against the devcluster: the teardown always gives back."""

import threading

from trainops_devcluster.airflow_home import xcom_value

from tests.capacity.helpers import default_seeded_objects, kube_for, nodes_by_app, snapshot
from trainops.capacity.procedure import claim, give_back

DAG_ID = "test_capacity_operators"


def nodes_to_claim(cluster) -> list[str]:
    default_seeded_objects(cluster)
    where = nodes_by_app(cluster)
    return where["llm-chat"][:1] + where["idle"][:2]


def task_states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_dag_claims_trains_and_returns(run_dag, devcluster):
    nodes = nodes_to_claim(devcluster)
    before = snapshot(devcluster)

    # checked before the claim: the shipped queues cover what an RDMA run's pods request
    resources = ["nvidia.com/gpu", "rdma/ib", "cpu", "memory"]
    run = run_dag(DAG_ID, conf={"node_names": nodes, "run_resources": resources})

    assert run.state == "success", task_states(run)
    claimed = xcom_value(run, "claim_nodes")
    assert sorted(claimed["node_names"]) == sorted(nodes) and claimed["gpus"] == 24
    assert sorted(xcom_value(run, "return_capacity")["node_names"]) == sorted(nodes)
    assert snapshot(devcluster) == before


def test_teardown_returns_capacity_when_training_fails(run_dag, devcluster):
    nodes = nodes_to_claim(devcluster)
    before = snapshot(devcluster)

    run = run_dag(DAG_ID, conf={"node_names": nodes, "fail_training": True})

    assert run.state == "failed"
    assert task_states(run) == {"claim_nodes": "success", "train": "failed", "return_capacity": "success"}
    assert snapshot(devcluster) == before


def test_a_claim_failing_halfway_gives_back_what_it_took(run_dag, devcluster):
    """Airflow skips a teardown whose only setup failed, so the failing claim undoes itself."""
    nodes = nodes_to_claim(devcluster)
    before = snapshot(devcluster)
    devcluster.inject("api-fault", path="/clusterqueues/training$", status=500, count=1)

    run = run_dag(DAG_ID, conf={"node_names": nodes})

    assert task_states(run)["claim_nodes"] == "failed"
    assert task_states(run)["return_capacity"] == "upstream_failed"
    assert snapshot(devcluster) == before


def test_claim_waits_deferred_until_another_run_returns_its_node(run_dag, devcluster):
    nodes = nodes_to_claim(devcluster)
    apis = kube_for(devcluster)
    claim(apis, "other_dag/run_1", nodes[-1:], cluster_queue="training")
    release = threading.Timer(
        2.0, lambda: give_back(kube_for(devcluster), "other_dag/run_1", cluster_queue="training")
    )
    release.start()

    run = run_dag(DAG_ID, conf={"node_names": nodes})
    release.join()

    assert run.state == "success", task_states(run)
    assert sorted(xcom_value(run, "claim_nodes")["node_names"]) == sorted(nodes)


def test_claim_waits_for_nodes_held_by_another_run_then_fails_naming_it(run_dag, devcluster):
    nodes = nodes_to_claim(devcluster)
    apis = kube_for(devcluster)
    claim(apis, "other_dag/run_1", nodes[-1:], cluster_queue="training")

    run = run_dag(DAG_ID, conf={"node_names": nodes})

    assert task_states(run)["claim_nodes"] == "failed"
    holders = {
        n["metadata"]["name"]: n["metadata"].get("annotations", {}).get("trainops.io/claimed-by")
        for n in devcluster.store.list("nodes")[0]
    }
    assert {n: h for n, h in holders.items() if h} == {nodes[-1]: "other_dag/run_1"}
    give_back(apis, "other_dag/run_1", cluster_queue="training")
