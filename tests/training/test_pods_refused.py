"""A run whose pods the API refuses (Pod Security here; an admission policy alike) ends its follow at
once with the API's message, read from the Job controller's FailedCreate event, instead of waiting
for its start timeout (``reconcile`` then judges and stops it: test_reconcile.py); a refusal over a
ResourceQuota may clear, so it waits and is named when the start timeout fires."""

from __future__ import annotations

import asyncio
import contextlib

from kubernetes import client
from kubernetes_asyncio import config as async_config

from trainops.kube.client import Kube
from trainops.training.cluster import GangCluster
from trainops.training.follow import FollowConfig, RunFollower, Status, refusal
from trainops.training.job import CONTAINER_NAME


class NoHeartbeat:
    def read(self, bucket: str, key: str, *, limit: int) -> None:
        return None

    def list_dir(self, uri) -> tuple[list, list]:
        return [], []


def test_a_run_whose_pods_are_refused_fails_at_once_with_the_apis_message(devcluster, k8s):
    container = {
        "name": CONTAINER_NAME,
        "image": "train:1",
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    }
    template = {"spec": {"containers": [container], "restartPolicy": "Never"}}
    job = {"metadata": {"name": "refused"}, "spec": {"template": template}}
    client.BatchV1Api(k8s).create_namespaced_job("training", job)  # training enforces Pod Security "baseline"

    @contextlib.asynccontextmanager
    async def async_client():
        api = await async_config.new_client_from_config(config_file=str(devcluster.kubeconfig))
        async with api:
            yield api

    config = FollowConfig("training", "refused", "s3://bucket/runs/refused/", nodes=1, start_timeout=3600)
    follower = RunFollower(config, GangCluster(Kube(k8s)), async_client, NoHeartbeat())
    outcome = asyncio.run(follower.follow())

    assert outcome.status is Status.PODS_REFUSED
    assert outcome.message.startswith('the API refuses the pods of Job refused: pods "refused-') and (
        'violates PodSecurity "baseline:latest": non-default capabilities (container "trainer" must not include '
        '"IPC_LOCK" in securityContext.capabilities.add); change what the run asks for' in outcome.message
    )


def test_only_the_api_refusing_a_pod_is_a_refusal_and_only_a_quota_may_clear():
    event = {"reason": "FailedCreate", "message": 'Error creating: pods "p" is forbidden: exceeded quota: q'}
    assert refusal(event) == ('pods "p" is forbidden: exceeded quota: q', False)
    webhook = {
        "reason": "FailedCreate",
        "message": 'Error creating: admission webhook "x" denied the request: no',
    }
    assert refusal(webhook) == ('admission webhook "x" denied the request: no', True)
    transient = {
        "reason": "FailedCreate",
        "message": "Error creating: Internal error occurred: etcdserver: timeout",
    }
    assert refusal(transient) is None
    assert refusal({"reason": "SuccessfulCreate", "message": "Created pod: p"}) is None


def test_reconcile_fails_a_refused_run_with_the_apis_message_and_stops_it(cluster, api, s3, bucket):
    """The run's own path: the follower sees the refusal, reconcile judges it (no resume: nothing changes
    until the spec or the namespace's policy does), records it on the Job and stops the attempt."""
    import dataclasses

    from tests.training.conftest import claimed_run, run_to_end, training_run
    from trainops.training.decide import Fail
    from trainops.training.failures import FailureKind
    from trainops.training.ledger import State

    kube, spec = claimed_run(cluster, api, bucket, "refused", ["--steps", "40"])
    run = training_run(kube, dataclasses.replace(spec, capabilities=["IPC_LOCK"]), "refused")

    action = run_to_end(cluster, run)

    assert isinstance(action, Fail) and 'violates PodSecurity "baseline:latest"' in action.reason, action
    (attempt,) = run.observe().attempts
    assert attempt.end.kind == FailureKind.PODS_REFUSED and attempt.state is State.STOPPED
