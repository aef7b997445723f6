"""The devcluster API server against ``kubernetes_asyncio``: list, watch, resume and 410."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from tests.devcluster.local_api import LocalApi, pod

pytestmark = pytest.mark.servers  # LocalApi: the devcluster's API server


async def _api(local: LocalApi) -> client.ApiClient:
    return await config.new_client_from_config(config_file=str(local.kubeconfig))


def test_async_list_watch_and_resume(tmp_path):
    local = LocalApi(tmp_path)

    async def scenario() -> tuple[list, list]:
        api = await _api(local)
        core = client.CoreV1Api(api)
        nodes = await core.list_node(label_selector="rack=r0")
        assert [n.metadata.name for n in nodes.items] == ["node-0", "node-2"]
        start = (await core.list_namespaced_pod("default")).metadata.resource_version

        async def watch_three() -> list:
            seen = []
            w = watch.Watch()
            async for event in w.stream(
                core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=20
            ):
                seen.append((event["type"], event["object"].metadata.name))
                if len(seen) == 3:
                    w.stop()
            return seen

        watcher = asyncio.create_task(watch_three())
        await asyncio.sleep(0.2)
        await core.create_namespaced_pod("default", pod("a1"))
        await core.patch_namespaced_pod("a1", "default", {"metadata": {"labels": {"k": "v"}}})
        await core.delete_namespaced_pod("a1", "default")
        live = await asyncio.wait_for(watcher, 30)
        replay = await watch_three()  # resumed from the same resourceVersion
        await api.close()
        return live, replay

    try:
        live, replay = asyncio.run(scenario())
    finally:
        local.close()
    assert live == [("ADDED", "a1"), ("MODIFIED", "a1"), ("DELETED", "a1")]
    assert replay == live


def test_async_watch_from_a_compacted_resource_version_is_410(tmp_path):
    local = LocalApi(tmp_path, history=5)

    async def scenario() -> None:
        api = await _api(local)
        core = client.CoreV1Api(api)
        old = (await core.list_node()).metadata.resource_version
        for i in range(10):
            local.store.mutate("nodes", "", "node-0", lambda n, i=i: n["metadata"]["labels"].update(v=str(i)))
        try:
            with pytest.raises(ApiException) as exc:
                async for _ in watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=5):
                    pass
            assert exc.value.status == 410
        finally:
            await api.close()

    try:
        asyncio.run(scenario())
    finally:
        local.close()
