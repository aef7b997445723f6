"""The async side of the Kubernetes access layer: resumable watches.

Deferred tasks follow their objects with ``watch(collection(api, ...))``, never by polling, on a
``kubernetes_asyncio`` ApiClient (Airflow: ``KubernetesClusterHook(conn_id).async_client()``).  A watch
is resumed from the last resourceVersion it saw when the server closes it (``watch_timeout_s``) or the
connection drops; a 410 Gone re-lists; transient answers (``trainops.kube.retry.is_transient``) wait as
the retry policy says and retry, forever (the caller owns the deadlines).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from trainops.kube.client import Kind
from trainops.kube.retry import DEFAULTS, Backoff, is_transient
from trainops.kube.settings import KubeSettings

log = logging.getLogger(__name__)

Lister = Callable[..., Awaitable]
# the typed kubernetes_asyncio list methods of the built-in kinds trainops watches (custom resources
# go through CustomObjectsApi)
_TYPED = {
    ("", "nodes"): ("CoreV1Api", "list_node"),
    ("", "pods"): ("CoreV1Api", "list_namespaced_pod"),
    ("", "events"): ("CoreV1Api", "list_namespaced_event"),
    ("", "configmaps"): ("CoreV1Api", "list_namespaced_config_map"),
    ("batch", "jobs"): ("BatchV1Api", "list_namespaced_job"),
}


@dataclass(frozen=True)
class Resource:
    """One watched collection: ``kind`` names it in events; ``list_fn(**kwargs)`` is a ``list_*``
    function of kubernetes_asyncio (bound to its namespace); ``selector``: its list arguments."""

    kind: str
    list_fn: Lister
    selector: dict


def collection(
    api, tag: str, kind: Kind, namespace: str | None = None, *, labels: str = "", fields: str = ""
) -> Resource:
    """``kind``'s objects (in ``namespace``) matching the selectors, on the ``kubernetes_asyncio``
    ApiClient ``api``, as a ``Resource`` whose events are tagged ``tag``."""
    from kubernetes_asyncio import client

    selector = {k: v for k, v in (("label_selector", labels), ("field_selector", fields)) if v}
    typed = _TYPED.get((kind.group, kind.plural))
    if typed is not None:
        api_class, method = typed
        fn = getattr(getattr(client, api_class)(api), method)
        return Resource(tag, namespaced(fn, namespace) if kind.namespaced else fn, selector)
    custom = client.CustomObjectsApi(api)
    if kind.namespaced:
        fn = namespaced(
            custom.list_namespaced_custom_object, namespace, kind.group, kind.version, after=(kind.plural,)
        )
    else:
        fn = functools.partial(custom.list_cluster_custom_object, kind.group, kind.version, kind.plural)
    return Resource(tag, fn, selector)


def namespaced(fn, namespace: str, *before, after=()) -> Lister:
    """``fn`` bound to ``namespace`` (``before``/``after``: the arguments around it, e.g. a custom
    resource's group, version and plural) as a ``Resource.list_fn``."""

    def lister(**kwargs):
        # kubernetes_asyncio urlencodes Python booleans as "True"; send the canonical "true"
        return fn(*before, namespace, *after, **{k: _query_value(k, v) for k, v in kwargs.items()})

    return lister


def _query_value(name: str, value):
    return str(value).lower() if isinstance(value, bool) and not name.startswith("_") else value


async def _list(resource: Resource) -> tuple[list[dict], str]:
    response = await resource.list_fn(**resource.selector, _preload_content=False)
    data = await response.read()
    if not 200 <= response.status <= 299:
        # unpreloaded, kubernetes_asyncio raises nothing for an error answer: raise it as preloaded
        # calls do, so that a 429/5xx is retried (``watch``) rather than read as a list
        from kubernetes_asyncio.client.exceptions import ApiException

        error = ApiException(status=response.status, reason=response.reason)
        error.headers, error.body = response.headers, data
        raise error
    body = json.loads(data)
    return body.get("items") or [], body["metadata"]["resourceVersion"]


async def watch(resource: Resource, settings: KubeSettings = DEFAULTS) -> AsyncIterator[tuple[str, dict]]:
    """``(event type, object)`` forever: a re-list (as ADDED/MODIFIED, and DELETED for objects gone
    since the last list), then watch events from the list's resourceVersion, resumed on drops."""
    from kubernetes_asyncio import watch as k8s_watch

    known: dict[str, dict] = {}
    backoff = Backoff(settings)
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
                    timeout_seconds=settings.watch_timeout_s,
                    _request_timeout=settings.watch_timeout_s + settings.watch_read_slack_s,
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
        except Exception as error:
            if getattr(error, "status", None) == 410:
                log.info("%s watch: resourceVersion %s expired, re-listing", resource.kind, version)
                version = None
                continue
            if not is_transient(error):
                raise
            log.warning(
                "%s watch: %s, retrying", resource.kind, getattr(error, "status", type(error).__name__)
            )
            await asyncio.sleep(backoff.wait_after(error))
