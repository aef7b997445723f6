"""Async Kubernetes access for one run: raw-dict lists, resumable watches, stopping the run.

Everything goes through a ``kubernetes_asyncio`` ApiClient (the Airflow trigger gets it from the
cncf provider's ``AsyncKubernetesHook.get_conn()``; elsewhere ``kubeconfig_client`` makes one).
A watch is resumed from the last resourceVersion it saw when the server closes it or the
connection drops; a 410 Gone re-lists; 429 and 5xx answers and dropped connections back off
and retry, forever (the caller owns the deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOADS = "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MERGE_PATCH = "application/merge-patch+json"
TRANSIENT = frozenset({0, 429, 500, 502, 503, 504})
WATCH_SECONDS = 60

Lister = Callable[..., Awaitable]


@contextlib.asynccontextmanager
async def kubeconfig_client(kubeconfig: str | None = None, context: str | None = None):
    """A ``kubernetes_asyncio`` ApiClient from a kubeconfig file (default location when None)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        await api.close()


def is_transient(error: BaseException) -> bool:
    """A 429/5xx answer, a dropped connection or a client-side timeout: worth retrying."""
    import aiohttp
    from kubernetes_asyncio.client.exceptions import ApiException

    if isinstance(error, ApiException):
        return error.status in TRANSIENT
    return isinstance(error, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError)


class Backoff:
    def __init__(self, base: float = 0.05, cap: float = 5.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    async def sleep(self) -> None:
        delay = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        await asyncio.sleep(random.uniform(delay / 2, delay))

    def reset(self) -> None:
        self.attempt = 0


@dataclass(frozen=True)
class Resource:
    """One watched collection: ``kind`` names it in events; ``list_fn(**kwargs)`` is a namespaced
    ``list_*`` function of kubernetes_asyncio bound to the namespace."""

    kind: str
    list_fn: Lister
    selector: dict


async def _list(resource: Resource) -> tuple[list[dict], str]:
    response = await resource.list_fn(**resource.selector, _preload_content=False)
    body = json.loads(await response.read())
    return body.get("items") or [], body["metadata"]["resourceVersion"]


async def watch(resource: Resource) -> AsyncIterator[tuple[str, dict]]:
    """``(event type, object)`` forever: a re-list (as ADDED/MODIFIED, and DELETED for objects gone
    since the last list), then watch events from the list's resourceVersion, resumed on drops."""
    from kubernetes_asyncio import watch as k8s_watch
    from kubernetes_asyncio.client.exceptions import ApiException

    known: dict[str, dict] = {}
    backoff = Backoff()
    version: str | None = None
    while True:
        try:
            if version is None:
                items, version = await _list(resource)
                current = {item["metadata"]["name"]: item for item in items}
                for name, obj in known.items():
                    if name not in current:
                        yield "DELETED", obj
                for name, obj in current.items():
                    yield ("MODIFIED" if name in known else "ADDED"), obj
                known = current
            async with k8s_watch.Watch() as stream:
                async for event in stream.stream(
                    resource.list_fn,
                    **resource.selector,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                ):
                    backoff.reset()
                    kind, obj = event["type"], event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if kind == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    if kind == "DELETED":
                        known.pop(name, None)
                    else:
                        known[name] = obj
                    yield kind, obj
            # the server ended the watch (its timeout, or a dropped stream): resume from `version`
        except ApiException as error:
            if error.status == 410:
                log.info("%s watch: resourceVersion %s expired, re-listing", resource.kind, version)
                version = None
                continue
            if not is_transient(error):
                raise
            log.warning("%s watch: API answered %s, retrying", resource.kind, error.status)
            await backoff.sleep()
        except Exception as error:
            if not is_transient(error):
                raise
            log.warning("%s watch: %s, retrying", resource.kind, type(error).__name__)
            await backoff.sleep()


async def retrying(call: Callable[[], Awaitable], what: str, attempts: int = 30):
    """``await call()``, retried with backoff on transient errors (at most ``attempts`` times)."""
    backoff = Backoff()
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as error:
            if not is_transient(error) or attempt == attempts - 1:
                raise
            log.warning("%s: %s, retrying", what, getattr(error, "status", type(error).__name__))
            await backoff.sleep()


def resources(api, namespace: str, job_name: str, job_uid: str) -> list[Resource]:
    """The Job, its pods and its Kueue Workload, as watchable collections."""
    from kubernetes_asyncio import client

    batch, core, custom = client.BatchV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)

    def lister(fn, *before, after=()):
        # kubernetes_asyncio urlencodes Python booleans as "True"; send the canonical "true"
        return lambda **kw: fn(*before, namespace, *after, **{k: _query_value(k, v) for k, v in kw.items()})

    return [
        Resource("job", lister(batch.list_namespaced_job), {"field_selector": f"metadata.name={job_name}"}),
        Resource("pod", lister(core.list_namespaced_pod), {"label_selector": f"{JOB_NAME_LABEL}={job_name}"}),
        Resource(
            "workload",
            lister(custom.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, after=(WORKLOADS,)),
            {"label_selector": f"{JOB_UID_LABEL}={job_uid}"},
        ),
    ]


def _query_value(name: str, value):
    return str(value).lower() if isinstance(value, bool) and not name.startswith("_") else value


async def read_job(api, namespace: str, name: str) -> dict | None:
    """The Job as a dict, or None when it does not exist."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        response = await retrying(
            lambda: client.BatchV1Api(api).read_namespaced_job(name, namespace, _preload_content=False),
            f"read Job {namespace}/{name}",
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return json.loads(await response.read())


async def stop_run(api, namespace: str, job_name: str) -> str:
    """Stop the run: deactivate its Workload (``spec.active=false``, Kueue evicts it and does not
    requeue), or, when Kueue has made no Workload for it, delete the Job with Foreground propagation.
    Returns what was done."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    job = await read_job(api, namespace, job_name)
    if job is None:
        return f"Job {namespace}/{job_name} is already gone"
    custom = client.CustomObjectsApi(api)
    response = await retrying(
        lambda: custom.list_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            WORKLOADS,
            label_selector=f"{JOB_UID_LABEL}={job['metadata']['uid']}",
            _preload_content=False,
        ),
        "list Workloads",
    )
    workloads = json.loads(await response.read()).get("items") or []
    if workloads:
        for workload in workloads:
            name = workload["metadata"]["name"]
            await retrying(
                lambda name=name: custom.patch_namespaced_custom_object(
                    KUEUE_GROUP,
                    KUEUE_VERSION,
                    namespace,
                    WORKLOADS,
                    name,
                    {"spec": {"active": False}},
                    _content_type=MERGE_PATCH,
                ),
                f"deactivate Workload {name}",
            )
        return (
            f"deactivated Workload {', '.join(w['metadata']['name'] for w in workloads)} (spec.active=false)"
        )
    try:
        await retrying(
            lambda: client.BatchV1Api(api).delete_namespaced_job(
                job_name, namespace, body=client.V1DeleteOptions(propagation_policy="Foreground")
            ),
            f"delete Job {job_name}",
        )
    except ApiException as error:
        if error.status != 404:
            raise
    return f"deleted Job {namespace}/{job_name} (Foreground propagation)"
