"""Services killed mid-run on the real stack: the triggerer SIGKILLed as it judges a crash, the Celery
worker SIGKILLed too, both started again as their supervisor would.  The run still ends with exactly
one Job per attempt, and the ledger read back from the cluster is the one the UI shows and the task
returned (the cluster is the ledger: nothing of it lived only in the killed processes)."""

from __future__ import annotations

import requests
from trainops_devcluster import stack

from tests.e2e.conftest import Capacity, assert_capacity_back
from tests.services.conftest import TERMINAL, trainer, wait_for
from tests.services.test_resume_api import DAG_ID, followed_past_step_20, xcom
from trainops.kube.client import JOBS, Kube
from trainops.training.cluster import GangCluster
from trainops.training.job import ATTEMPT_LABEL, RUN_LABEL
from trainops.training.naming import run_key
from trainops.training.reconcile import TrainingRun

RUN = "api-crashes"


def test_killing_the_triggerer_as_it_judges_a_crash_and_the_worker_loses_nothing(services, airflow):
    api = services.kube()
    before = Capacity.read(api)
    airflow.unpause(DAG_ID)
    answer = airflow.trigger(DAG_ID, RUN, {"run_name": RUN, "command": trainer(400, 0.05)})
    assert answer.status_code == 200, answer.text
    culprit = followed_past_step_20(services, airflow, api, RUN)
    injected = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/xid",
        json={"target": culprit, "code": 79},
        timeout=30,
    )
    assert injected.status_code == 200, injected.text
    stack.crash(services.state, "airflow-triggerer")  # while its trigger judges the crash, or about to
    stack.crash(services.state, "airflow-worker")  # while train is deferred

    # a new triggerer takes the trigger over once the killed one's heartbeat is stale (30 s)
    airflow.follow(DAG_ID, RUN, lambda run, _: run["state"] in TERMINAL, timeout_s=420)

    assert airflow.run(DAG_ID, RUN)["state"] == "success", airflow.task_states(DAG_ID, RUN)
    assert airflow.ok("GET", f"/dags/{DAG_ID}/dagRuns/{RUN}/taskInstances/train")["try_number"] == 1
    kube = Kube(api)
    attempts = sorted(
        int(job["metadata"]["labels"][ATTEMPT_LABEL])
        for job in kube.list(JOBS, "training", labels=f"{RUN_LABEL}={run_key(DAG_ID, RUN)}")
    )
    assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) == 2, attempts  # one Job each
    ledger = TrainingRun(GangCluster(kube), "training", DAG_ID, RUN).observe().to_dict()
    shown = airflow.session.get(f"{airflow.base}/trainops/api/runs/{DAG_ID}/{RUN}", timeout=30).json()
    assert shown["ledger"] == {**ledger, "error": None}
    # the return that followed train marked the run stopped on its newest attempt: nothing resumes it now
    newest = ledger["attempts"][-1]
    assert "capacity is given back" in newest["run_stopped"], newest
    assert xcom(airflow, RUN, "train")["history"] == ledger["attempts"][:-1] + [
        {**newest, "run_stopped": None}
    ]
    first, second = ledger["attempts"]
    assert first["kind"] == "infrastructure" and culprit in first["culprits"], first
    assert (second["kind"], second["resume_from"] is not None) == ("succeeded", True)
    assert_capacity_back(api, before)
    heal(services, kube, culprit)


def heal(services, kube: Kube, node: str) -> None:
    """Repair ``node`` and lift its quarantine once its probe reports it healthy, so that the tests after
    this one have the whole fleet (8 nodes: two quarantined leave inference nowhere to go)."""
    from trainops.health.quarantine import ReleaseRefused, release
    from trainops.kube.retry import Deadline

    repaired = requests.post(
        f"{services.at.devcluster_url}/devcluster/faults/repair", json={"target": node}, timeout=30
    )
    assert repaired.status_code == 200, repaired.text

    def released() -> bool:
        try:
            release(kube.core, node, Deadline(30))
        except ReleaseRefused:
            return False
        return True

    wait_for(released, f"{node} repaired and released")
