"""The lifecycle's task chain, added to the DAG being defined: ``training_lifecycle(dag_id)``.

preflight (trainops doctor; off unless the preflight param is true) -> reserve the run path -> health gate -> claim nodes -> fabric of the claimed nodes (the three are setups) -> gang training (each
retry a resume) -> verify the final checkpoint (outlet: an Airflow Asset), and beside it return capacity
(teardown, runs on every path; its failure fails the run).
The tasks are the provider's operators as they are; everything heavy (kubernetes, boto3) is imported
inside them, so this module parses fast. Values flow typed (the DAG renders native objects):
the form's ``nodes`` count reaches the Job as an int, node names travel as ``node_names`` lists
taken from each task's return value.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Asset
from trainops.operators.capacity import ClaimNodesOperator, ReturnCapacityOperator
from trainops.operators.checkpoint import CheckpointVerifyOperator, RunPathOperator
from trainops.operators.doctor import ClusterDoctorOperator
from trainops.operators.health import NodeHealthGateOperator
from trainops.operators.lifecycle import task_ids
from trainops.operators.lifecycle.docs import (
    CLAIM_DOC,
    FABRIC_DOC,
    GATE_DOC,
    PREFLIGHT_DOC,
    RESERVE_DOC,
    RETURN_DOC,
    TRAIN_DOC,
    VERIFY_DOC,
)
from trainops.operators.training import GangTrainingOperator
from trainops.sensors.health import FabricHealthSensor

from trainops.health.policy import DEFAULT_POLICY

# The run path and name as the first task reserved them (run_name empty: derived from the DAG run).
RUN_PATH = f"{{{{ ti.xcom_pull(task_ids='{task_ids.RESERVE_RUN_PATH}')['run_uri'] }}}}"
RUN_NAME = f"{{{{ ti.xcom_pull(task_ids='{task_ids.RESERVE_RUN_PATH}')['run_name'] }}}}"
# The run's node total, computed here only: the gate finds at least this many, the claim takes this many.
NODES_WITH_SPARES = "{{ params.nodes + params.spare_nodes }}"
# Where in the fabric the run goes: the gate, the claim and Kueue (the Job's PodSet annotation) all place it so.
TOPOLOGY = {
    "mode": "{{ params.topology }}",
    "level": "{{ params.topology_level }}",
    "levels": "{{ params.topology_levels }}",
}
# fabric_gate off: every InfiniBand row of the policy switched off (clusters without InfiniBand).
FABRIC_OFF = {
    row.name: {"verdict": "ok", "if_unknown": "ok"}
    for row in DEFAULT_POLICY.rows
    if row.scope == "ib_port" or row.name in ("ib_port_count", "ib_ports_missing")
}
POLICY_OVERRIDES = (
    "{{ params.health_policy_overrides if params.fabric_gate "
    f"else dict(params.health_policy_overrides, **{FABRIC_OFF!r}) }}}}"
)
FABRIC_WAIT_S = 600
# A train try that fails on its own (a worker lost, the API unreachable) is retried this many times;
# the next try reattaches to the run's Job or resumes it.  Resumes after crashes are max_resumes'.
TRY_RETRIES = 3
# A teardown that fails fails the DAG run (GPUs may still be held), after this many retries.
TEARDOWN_RETRIES = 3


def final_checkpoint_asset(dag_id: str) -> Asset:
    """The Asset a lifecycle DAG updates with each verified final checkpoint (the event's extra has the URI).

    Named, without a URI scheme: a scheme would load every provider's URI handlers (boto3 among
    them) while the DAG file is parsed."""
    return Asset(name=f"trainops/{dag_id}/final-checkpoint")


def training_lifecycle(
    dag_id: str,
    *,
    kubernetes_conn_id: str = "kubernetes_default",
    aws_conn_id: str = "aws_default",
    retry_delay: timedelta = timedelta(seconds=5),
) -> dict[str, Any]:
    """Add the lifecycle's tasks to the DAG being defined (``with DAG(...)``); returns them by task id.

    The DAG needs ``params=lifecycle_params()`` and ``render_template_as_native_obj=True``.
    The run's S3 path is ``<checkpoint_uri>/<run_name>/``, reserved for the DAG run by its first task.
    """
    # The gate and the fabric check read health alike (fabric_gate off reaches both through the policy).
    health_sources = {
        "policy_overrides": POLICY_OVERRIDES,
        "prometheus_conn_id": "{{ params.prometheus_conn_id }}",
        "on_prometheus_unavailable": "{{ params.on_prometheus_unavailable }}",
        "fabrics": "{{ params.fabrics }}",
        "fault_window_s": "{{ params.fault_window_s }}",
        "kubernetes_conn_id": kubernetes_conn_id,
    }
    preflight = ClusterDoctorOperator(
        task_id=task_ids.PREFLIGHT,
        enabled="{{ params.preflight }}",
        prometheus_conn_id="{{ params.prometheus_conn_id }}",
        cluster_queue="{{ params.cluster_queue }}",
        local_queue="{{ params.kueue_queue }}",
        priority_class="{{ params.priority_class }}",
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=PREFLIGHT_DOC,
    )
    reserve = RunPathOperator(
        task_id=task_ids.RESERVE_RUN_PATH,
        checkpoint_uri="{{ params.checkpoint_uri }}",
        run_name="{{ params.run_name }}",
        aws_conn_id=aws_conn_id,
        doc_md=RESERVE_DOC,
    )
    gate = NodeHealthGateOperator(
        task_id=task_ids.HEALTH_GATE,
        min_nodes=NODES_WITH_SPARES,
        gpus_per_node="{{ params.gpus_per_node }}",
        speed_tiers="{{ params.speed_tiers }}",
        topology=TOPOLOGY,
        spares="{{ params.spare_nodes }}",
        resume_min_nodes="{{ params.min_nodes }}",  # train's: a bad one fails here, before any write
        gpu_memory_gib="{{ params.gpu_memory_gib }}",
        wait_timeout_s="{{ params.health_wait_s }}",
        poll_interval_s=10,
        doc_md=GATE_DOC,
        **health_sources,
    )
    claim = ClaimNodesOperator(
        task_id=task_ids.CLAIM_NODES,
        node_names=f"{{{{ ti.xcom_pull(task_ids='{task_ids.HEALTH_GATE}')['node_names'] }}}}",
        count=NODES_WITH_SPARES,
        topology=TOPOLOGY,
        spares="{{ params.spare_nodes }}",
        prepull_image="{{ params.image }}",  # hot spares: the image on every claimed node before training
        cluster_queue="{{ params.cluster_queue }}",
        # train's queue and priority, checked first: the queue leads to cluster_queue and covers its GPUs
        local_queue="{{ params.kueue_queue }}",
        priority_class="{{ params.priority_class }}",
        inference_deployments="{{ params.inference_workloads }}",
        overflow_pool="{{ params.overflow_pool }}",
        kubernetes_conn_id=kubernetes_conn_id,
        retries=2,  # idempotent: a retry finishes the same claim (the nodes it already holds first)
        retry_delay=retry_delay,
        doc_md=CLAIM_DOC,
    )
    fabric_ready = FabricHealthSensor(
        task_id=task_ids.FABRIC_READY,
        node_names=f"{{{{ ti.xcom_pull(task_ids='{task_ids.CLAIM_NODES}')['node_names'] }}}}",
        min_healthy="{{ params.nodes }}",
        poke_interval=10,
        timeout=FABRIC_WAIT_S,
        doc_md=FABRIC_DOC,
        **health_sources,
    )
    train = GangTrainingOperator(
        task_id=task_ids.TRAIN,
        image="{{ params.image }}",
        command="{{ params.command }}",
        run_uri=RUN_PATH,
        env={"TRAINOPS_RUN_NAME": RUN_NAME},
        nodes="{{ params.nodes }}",
        min_nodes="{{ params.min_nodes }}",
        elastic_wait_s="{{ params.elastic_wait_s }}",
        gpus_per_node="{{ params.gpus_per_node }}",
        local_queue="{{ params.kueue_queue }}",
        priority_class="{{ params.priority_class }}",
        node_names=f"{{{{ ti.xcom_pull(task_ids='{task_ids.FABRIC_READY}')['node_names'] }}}}",
        topology=TOPOLOGY,
        hang_timeout="{{ params.hang_timeout_s }}",
        max_resumes="{{ params.max_resumes }}",
        retries=TRY_RETRIES,
        retry_delay=retry_delay,
        kubernetes_conn_id=kubernetes_conn_id,
        aws_conn_id=aws_conn_id,
        doc_md=TRAIN_DOC,
    )
    verify = CheckpointVerifyOperator(
        task_id=task_ids.VERIFY_CHECKPOINT,
        run_uri=RUN_PATH,
        aws_conn_id=aws_conn_id,
        outlets=[final_checkpoint_asset(dag_id)],
        doc_md=VERIFY_DOC,
    )
    give_back = ReturnCapacityOperator(
        task_id=task_ids.RETURN_CAPACITY,
        cluster_queue="{{ params.cluster_queue }}",
        wave_nodes="{{ params.return_wave_nodes }}",
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=RETURN_DOC,
        retries=TEARDOWN_RETRIES,
        retry_delay=retry_delay,
    ).as_teardown(setups=[gate, claim, fabric_ready], on_failure_fail_dagrun=True)
    # The gate and the fabric check are setups of the teardown too, so a Clear on train re-runs them with
    # the claim (the resumed run goes to nodes that pass the gate again, never to the node just
    # quarantined), and a Clear on verify_checkpoint, which the teardown is not downstream of, runs
    # verify_checkpoint alone: a setup without a teardown would be re-run for every task after it.
    # verify_checkpoint stays a leaf beside the teardown: it holds no GPUs, and with the teardown able
    # to fail the run (on_failure_fail_dagrun), Airflow judges the run by both of them.
    # The run path is reserved before the gate: a path another DAG run owns fails the run before any node
    # is touched (no quarantine, no claim).
    # preflight (trainops doctor, off unless params.preflight) reads the cluster before anything is reserved.
    preflight >> reserve >> gate >> claim >> fabric_ready >> train >> [verify, give_back]
    tasks = (preflight, reserve, gate, claim, fabric_ready, train, verify, give_back)
    return {task.task_id: task for task in tasks}
