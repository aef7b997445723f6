"""The evidence a failure is judged on is read under the retry policy: a flaky API server does not
lose the failed pod's log, and with it the hint of what the pod printed."""

from __future__ import annotations

import pytest

from trainops.kube.client import Kube
from trainops.training.cluster import GangCluster
from trainops.training.failures import FailureKind, classify
from trainops.training.job import CONTAINER_NAME

LOG_PATH = r"/api/v1/namespaces/training/pods/job-1-0/log"


@pytest.fixture
def failed_pod(make_devcluster):
    """A failed pod of a gang on the devcluster's first node, with the last lines its trainer printed."""
    cluster = make_devcluster(nodes=2)
    node = sorted(n["metadata"]["name"] for n in cluster.store.list("nodes", "")[0])[0]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "job-1-0", "namespace": "training"},
        "spec": {"nodeName": node, "containers": [{"name": CONTAINER_NAME, "image": "registry.example/t:1"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": CONTAINER_NAME, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
            ],
        },
    }
    cluster.store.create("pods", pod)
    cluster.logs.append(
        "training", "job-1-0", "step 41\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    return cluster, cluster.store.get("pods", "training", "job-1-0")


def judged(cluster, pod):
    evidence = GangCluster(Kube.from_kubeconfig(str(cluster.kubeconfig)))
    nodes, logs = evidence.failure_evidence("training", [pod])
    return classify([pod], nodes, logs, container=CONTAINER_NAME)


def test_a_log_read_through_transient_errors_keeps_the_hint(failed_pod):
    cluster, pod = failed_pod
    cluster.inject("api-fault", path=LOG_PATH, status=503, count=1)
    cluster.inject("api-fault", path=LOG_PATH, status=429, count=1)

    failure = judged(cluster, pod)

    assert failure.kind is FailureKind.USER_CODE
    assert failure.hints == [
        f"pod job-1-0 on {pod['spec']['nodeName']} printed 'CUDA error: an illegal memory access'"
    ]
    assert cluster.server.faults.pick(LOG_PATH) is None  # both faults were served, then the log


def test_the_log_of_a_pod_already_gone_is_skipped(failed_pod):
    cluster, pod = failed_pod
    cluster.store.delete("pods", "training", "job-1-0")  # the API answers its log with 404

    failure = judged(cluster, pod)

    assert failure.kind is FailureKind.USER_CODE and failure.hints == []
