"""Claim nodes (setup) -> gang training with resumes -> give the capacity back (teardown), driven by conf.

conf: ``node_names`` (names to claim), ``run_uri``, ``size`` (gang nodes), ``args`` (trainer args),
``priority_class``, ``kill_worker_after_submit`` (true: try 1's worker dies right after submitting).
"""

import sys

from airflow.sdk import DAG
from trainops.operators.capacity import ClaimNodesOperator, ReturnCapacityOperator
from trainops.operators.training import GangTrainingOperator


class WorkerDiesOnFirstTry(GangTrainingOperator):
    """Try 1 dies right after the submit (no defer, no on_kill), as a killed worker would."""

    def execute(self, context):
        if not context["dag_run"].conf.get("kill_worker_after_submit") or context["ti"].try_number > 1:
            return super().execute(context)
        self.gang_run(context).start()
        raise SystemError("worker killed right after submitting")


with DAG("gang_training_e2e", schedule=None, render_template_as_native_obj=True, tags=["test"]) as dag:
    claim = ClaimNodesOperator(
        task_id="claim", node_names="{{ dag_run.conf['node_names'] }}", cluster_queue="training"
    )
    train = WorkerDiesOnFirstTry(
        task_id="train",
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args="{{ dag_run.conf.get('args', []) }}",
        run_uri="{{ dag_run.conf['run_uri'] }}",
        nodes="{{ dag_run.conf.get('size', 2) }}",
        priority_class="{{ dag_run.conf.get('priority_class', 'training-standard') }}",
        hang_timeout=None,
        hang_policy={"floor": 3.0, "startup_timeout": 30.0, "safety_factor": 5.0},
        start_timeout=60,
        admission_timeout=120,
        heartbeat_poll=0.2,
        retries=2,
        retry_delay=0.5,
        evidence_wait_s=5,
        # A hung attempt's frozen pods keep their GPUs until the grace ends; the devcluster's PodsReady
        # timeout is 10 s (Kueue's: 30 min), so a 30 s grace gets the next attempt evicted twice first.
        termination_grace_seconds=5,
    )
    give_back = ReturnCapacityOperator(task_id="give_back", cluster_queue="training", ready_deadline_s=60)
    claim >> train >> give_back.as_teardown(setups=claim)
