"""Claim -> train -> return, as a real DAG (used by tests/cluster/test_capacity_operators.py).

conf: ``node_names`` (list), ``fail_training`` (bool), ``run_resources`` (what the run's pods request,
checked against the LocalQueue's ClusterQueue before the claim); the claim waits (deferred) for nodes
held by other runs.
"""

from airflow.sdk import DAG, task
from trainops.operators.capacity import ClaimNodesOperator, ReturnCapacityOperator

with DAG(
    "test_capacity_operators",
    schedule=None,
    render_template_as_native_obj=True,
    params={"node_names": [], "fail_training": False, "run_resources": ["nvidia.com/gpu"]},
    tags=["test"],
):
    claim = ClaimNodesOperator(
        task_id="claim_nodes",
        node_names="{{ params.node_names }}",
        local_queue="training",
        run_resources="{{ params.run_resources }}",
        inference_deployments=["inference/llm-chat", "inference/embeddings"],
        wait_for_nodes_s=15,
        poll_interval_s=0.2,
        api_deadline_s=30,
        drain_deadline_s=60,
    )

    @task
    def train(params=None) -> str:
        if params["fail_training"]:
            raise RuntimeError("training crashed (test)")
        return "trained"

    give_back = ReturnCapacityOperator(task_id="return_capacity", ready_deadline_s=60).as_teardown(
        setups=claim
    )
    claim >> train() >> give_back
