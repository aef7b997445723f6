"""Benchmark DAG (``benchmarks/bench_training.py``, ``bench_services.py``): the same gang run with
the cncf provider's ``KubernetesJobOperator(deferrable=True, wait_until_job_complete=True)`` and
Airflow retries.

The Job is equivalent to trainops' (``trainops.training.job.build_job``): Indexed, one pod per
node with all its GPUs, ``backoffLimit: 0``, the Kueue queue and priority labels, the training
toleration, the GPU-pool node selector, quarantined nodes kept out, the run's env.  Provider
defaults are kept (``job_poll_interval=10``, ``get_logs``, ``on_finish_action``), except
``discover_pods_retry_number``: its default (3, no delay) fails every try of a Kueue-managed
Job before Kueue has admitted it and its pods exist (apache/airflow#70585).

conf: ``run_uri``, ``args`` (trainer args).
"""

import sys
from datetime import timedelta

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.sdk import DAG
from kubernetes.client import models as k8s

from trainops.conventions import (
    GPU_POOL_LABEL,
    GPU_RESOURCE,
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MODE_TAINT,
    MODE_TRAINING,
)

NODES, GPUS = 2, "8"
RETRIES, RETRY_DELAY = 2, timedelta(seconds=1)  # the same on both sides of the benchmark
DISCOVER_PODS_TRIES = 2000  # list calls (no delay between them) while Kueue admits the Job

with DAG("bench_training_provider", schedule=None, render_template_as_native_obj=True, tags=["bench"]):
    KubernetesJobOperator(
        task_id="train",
        name="bench-provider",
        namespace="training",
        image="devcluster.trainops.io/local",
        cmds=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        arguments="{{ dag_run.conf['args'] }}",
        # native rendering (for the args list) would turn "2" into an int: tojson keeps it a string
        env_vars={
            "TRAINOPS_RUN_URI": "{{ dag_run.conf['run_uri'] }}",
            "TRAINOPS_WORLD_SIZE": f"{{{{ {NODES} | string | tojson }}}}",
        },
        labels={KUEUE_QUEUE_LABEL: "training", KUEUE_PRIORITY_LABEL: "training-standard"},
        container_resources=k8s.V1ResourceRequirements(
            requests={GPU_RESOURCE: GPUS}, limits={GPU_RESOURCE: GPUS}
        ),
        node_selector={GPU_POOL_LABEL: "true"},
        tolerations=[
            k8s.V1Toleration(key=MODE_TAINT, operator="Equal", value=MODE_TRAINING, effect="NoSchedule")
        ],
        affinity=k8s.V1Affinity(
            node_affinity=k8s.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                    node_selector_terms=[
                        k8s.V1NodeSelectorTerm(
                            match_expressions=[
                                k8s.V1NodeSelectorRequirement(
                                    key=HEALTH_LABEL, operator="NotIn", values=[HEALTH_QUARANTINED]
                                )
                            ]
                        )
                    ]
                )
            )
        ),
        completion_mode="Indexed",
        completions=NODES,
        parallelism=NODES,
        backoff_limit=0,
        wait_until_job_complete=True,
        deferrable=True,
        discover_pods_retry_number=DISCOVER_PODS_TRIES,
        retries=RETRIES,
        retry_delay=RETRY_DELAY,
    )
