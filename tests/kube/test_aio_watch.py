"""``trainops.kube.aio.watch`` against the devcluster: transient answers to its list are retried."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import config

from trainops.kube.aio import collection, watch
from trainops.kube.client import NODES

LIST = r"^/api/v1/nodes(\?(?!.*watch=)|$)"  # the list, not the watch


def test_a_list_answered_429_or_503_is_retried_not_a_crash(devcluster):
    # unpreloaded, kubernetes_asyncio raises nothing for an error answer: the watch read the Status
    # body as a list and died with KeyError 'resourceVersion' (the campaign's API bursts, issue 15)
    devcluster.inject("api-fault", path=LIST, status=503, count=1)
    devcluster.inject("api-fault", path=LIST, status=429, count=1)

    async def first_event():
        api = await config.new_client_from_config(config_file=str(devcluster.kubeconfig))
        async with api:
            nodes = collection(api, "node", NODES)
            async for event, obj in watch(nodes):
                return event, obj["metadata"]["name"]

    event, name = asyncio.run(first_event())

    assert event == "ADDED" and name
    assert devcluster.server.faults.pick("/api/v1/nodes") is None  # both faults were served
