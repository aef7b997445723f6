"""A run whose pods the API refuses (Pod Security here; a quota or an admission policy alike) fails at
once with the API's message, read from the Job controller's FailedCreate event, instead of waiting
for its start timeout; the follower stops it."""

from __future__ import annotations

import asyncio
import contextlib

from kubernetes import client
from kubernetes_asyncio import config as async_config

from trainops.kube.client import Kube
from trainops.training.cluster import GangCluster
from trainops.training.follow import FollowConfig, RunFollower, Status, refusal
from trainops.training.spec import CONTAINER_NAME


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
    assert outcome.stopped  # the follower stopped the Job, as after a start timeout


def test_only_the_api_refusing_a_pod_is_a_refusal():
    event = {"reason": "FailedCreate", "message": 'Error creating: pods "p" is forbidden: exceeded quota: q'}
    assert refusal(event) == 'pods "p" is forbidden: exceeded quota: q'
    webhook = {
        "reason": "FailedCreate",
        "message": 'Error creating: admission webhook "x" denied the request: no',
    }
    assert refusal(webhook) == 'admission webhook "x" denied the request: no'
    transient = {
        "reason": "FailedCreate",
        "message": "Error creating: Internal error occurred: etcdserver: timeout",
    }
    assert refusal(transient) is None
    assert refusal({"reason": "SuccessfulCreate", "message": "Created pod: p"}) is None
