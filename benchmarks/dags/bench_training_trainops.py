"""Benchmark DAG (``benchmarks/bench_training.py``, ``bench_services.py``): the gang run with
trainops' ``GangTrainingOperator``.

conf: ``run_uri``, ``args`` (trainer args), ``timings`` (a JSON-lines file the benchmark reads).
The only addition to the stock operator: each try's trigger event records when the follower saw
the failure (``seen_at``), for the "failure seen" benchmark.
"""

import json
import sys
from datetime import timedelta

from airflow.sdk import DAG
from trainops.operators.training import GangTrainingOperator

RETRIES, RETRY_DELAY = 2, timedelta(seconds=1)  # the same on both sides of the benchmark


class TimedGangTraining(GangTrainingOperator):
    def execute_complete(self, context, event: dict):
        with open(context["dag_run"].conf["timings"], "a") as out:
            out.write(json.dumps({"try": context["ti"].try_number, "seen_at": event["seen_at"]}) + "\n")
        return super().execute_complete(context, event)


with DAG("bench_training_trainops", schedule=None, render_template_as_native_obj=True, tags=["bench"]):
    TimedGangTraining(
        task_id="train",
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args="{{ dag_run.conf['args'] }}",
        run_uri="{{ dag_run.conf['run_uri'] }}",
        nodes=2,
        hang_policy={"floor": 30.0},
        heartbeat_poll=0.5,
        retries=RETRIES,
        retry_delay=RETRY_DELAY,
    )
