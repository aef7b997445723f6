"""The evidence a failure is judged on is read under the retry policy: a flaky API server does not
lose the failed pod's log, and with it the hint of what the pod printed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from trainops.kube import retry
from trainops.training.cluster import GangCluster
from trainops.training.failures import FailureKind, classify
from trainops.training.spec import CONTAINER_NAME

NODE = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
POD = {
    "metadata": {"name": "job-1-0"},
    "spec": {"nodeName": "n1"},
    "status": {
        "phase": "Failed",
        "containerStatuses": [
            {"name": CONTAINER_NAME, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
        ],
    },
}


class FlakyCore:
    """A CoreV1Api whose log reads answer ``statuses`` first (then the log)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)

    def read_node(self, name, _preload_content):
        return SimpleNamespace(data=json.dumps(NODE).encode())

    def read_namespaced_pod_log(self, name, namespace, tail_lines):
        if self.statuses:
            raise ApiException(status=self.statuses.pop(0))
        return "step 41\nRuntimeError: CUDA error: an illegal memory access was encountered\n"


@pytest.fixture(autouse=True)
def no_waits(monkeypatch):
    monkeypatch.setattr(retry.time, "sleep", lambda seconds: None)


def judged(core: FlakyCore):
    cluster = GangCluster(SimpleNamespace(core=core, batch=None, custom=None))
    nodes, logs = cluster.failure_evidence("training", [POD])
    return classify([POD], nodes, logs, container=CONTAINER_NAME)


def test_a_log_read_through_transient_errors_keeps_the_hint():
    failure = judged(FlakyCore(503, 429))

    assert failure.kind is FailureKind.USER_CODE
    assert failure.hints == ["pod job-1-0 on n1 printed 'CUDA error: an illegal memory access'"]


def test_a_log_the_api_refuses_is_skipped():
    failure = judged(FlakyCore(404))

    assert failure.kind is FailureKind.USER_CODE and failure.hints == []
