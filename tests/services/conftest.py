"""The real Airflow services stack (``make up``), started once per test run, driven through REST API v2.

Everything a test does to Airflow goes through the public API with a JWT from ``/auth/token``, as
the UI does; the cluster and the bucket are read with the official clients to check end states.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from trainops_devcluster import stack
from trainops_devcluster.local_s3 import LocalS3, free_port
from trainops_devcluster.stack_spec import ADMIN_USER, BUCKET, DEFAULT_ADMIN_PASSWORD, Endpoints

WRITES = {"create", "update", "patch", "delete"}
TERMINAL = {"success", "failed"}


def trainer(steps: int, step_seconds: float) -> list[str]:
    """The demo trainer as the DAG's ``command`` param: a checkpoint every 10 steps, heartbeat every 5."""
    return [
        "python",
        "-m",
        "trainops_devcluster.demo.trainer",
        "--steps",
        str(steps),
        "--checkpoint-every",
        "10",
        "--step-seconds",
        str(step_seconds),
        "--heartbeat-every",
        "5",
    ]


@dataclass
class Stack:
    """A running stack: its endpoints and the folder with its pid files and logs."""

    at: Endpoints
    state: Path

    @property
    def s3(self) -> LocalS3:
        return LocalS3(self.at.s3_url)

    def bucket_keys(self, prefix: str = "") -> list[str]:
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def cluster_writes(self) -> list[dict]:
        """The writes (create/update/patch/delete) the devcluster's API server answered so far."""
        audit = requests.get(f"{self.at.devcluster_url}/devcluster/audit", timeout=30).json()["entries"]
        return [e for e in audit if e["verb"] in WRITES]

    def kube(self):
        from kubernetes import config

        return config.new_client_from_config(config_file=self.at.kubeconfig)


def pytest_collection_modifyitems(items):
    """test_least_privilege judges the audit log of every other test here: it runs last."""
    items.sort(key=lambda item: item.module.__name__.endswith(".test_least_privilege"))


@pytest.fixture(scope="session")
def services(request) -> Stack:
    """``make up``'s stack in a throw-away folder, on free ports; ``make down``'s stop at the end.

    After a failure the folder (with every service's log) is kept and named."""
    state = Path(tempfile.mkdtemp(prefix="trainops-stack-"))
    try:
        at = stack.up(state, api_port=free_port(), nodes=8)
    except BaseException:  # up() stopped what it had started; its logs say why it failed
        print(f"\nservices stack logs kept in {state}/logs")
        raise
    try:
        yield Stack(at, state)
    finally:
        stack.down(state)
        if request.session.testsfailed:
            print(f"\nservices stack logs kept in {state}/logs")
        else:
            shutil.rmtree(state, ignore_errors=True)


class AirflowApi:
    """The public REST API v2, authenticated as the local admin with a JWT."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url
        answer = requests.post(
            f"{base_url}/auth/token",
            json={"username": ADMIN_USER, "password": DEFAULT_ADMIN_PASSWORD},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.session.request(method, f"{self.base}/api/v2{path}", timeout=30, **kwargs)

    def ok(self, method: str, path: str, **kwargs) -> dict:
        answer = self.call(method, path, **kwargs)
        assert answer.status_code in (200, 201), f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def unpause(self, dag_id: str) -> None:
        """Unpause the DAG once the dag-processor has parsed it (the stack may have just started)."""
        wait_for(lambda: self.call("GET", f"/dags/{dag_id}").status_code == 200, f"the DAG {dag_id} parsed")
        self.ok("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, run_id: str, conf: dict) -> requests.Response:
        return self.call(
            "POST", f"/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf}
        )

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.ok("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.ok("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}

    def follow(
        self, dag_id: str, run_id: str, until: Callable[[dict, dict], bool], timeout_s: float = 240
    ) -> list[dict[str, str | None]]:
        """Poll the run's task states until ``until(run, states)``; returns every distinct state seen."""
        seen: list[dict[str, str | None]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            run, states = self.run(dag_id, run_id), self.task_states(dag_id, run_id)
            if not seen or seen[-1] != states:
                seen.append(states)
            if until(run, states):
                return seen
            assert time.monotonic() < deadline, f"{dag_id}/{run_id} stuck: run {run['state']}, tasks {states}"
            time.sleep(0.5)


@pytest.fixture(scope="session")
def airflow(services) -> AirflowApi:
    return AirflowApi(f"http://127.0.0.1:{services.at.api_port}")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
