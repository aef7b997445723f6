"""Benchmark DAG (``benchmarks/bench_training.py``, ``bench_services.py``): the gang run with
trainops' ``GangTrainingOperator``.

conf: ``run_uri``, ``args`` (trainer args).  The stock operator; the benchmarks read when the
failure was seen from its XCom (``history[0]["ended_at"]``).
"""

import sys
from datetime import timedelta

from airflow.sdk import DAG
from trainops.operators.training import GangTrainingOperator

RETRIES, RETRY_DELAY = 2, timedelta(seconds=1)  # the same on both sides of the benchmark


with DAG("bench_training_trainops", schedule=None, render_template_as_native_obj=True, tags=["bench"]):
    GangTrainingOperator(
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
