"""The async side of the Kubernetes access layer: resumable watches.

Deferred tasks follow their objects with ``watch``, never by polling, on a ``kubernetes_asyncio``
ApiClient (Airflow: ``KubernetesClusterHook(conn_id).async_client()``).  A watch is resumed from the last
resourceVersion it saw when the server closes it or the connection drops; a 410 Gone re-lists;
transient answers (``trainops.kube.retry.is_transient``) wait as the retry policy says and retry,
forever (the caller owns the deadlines).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from trainops.kube.retry import Backoff, is_transient, wait_before_retry

log = logging.getLogger(__name__)

WATCH_SECONDS = 60

Lister = Callable[..., Awaitable]


@dataclass(frozen=True)
class Resource:
    """One watched collection: ``kind`` names it in events; ``list_fn(**kwargs)`` is a ``list_*``
    function of kubernetes_asyncio (bound to its namespace); ``selector``: its list arguments."""

    kind: str
    list_fn: Lister
    selector: dict


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


async def watch(resource: Resource) -> AsyncIterator[tuple[str, dict]]:
    """``(event type, object)`` forever: a re-list (as ADDED/MODIFIED, and DELETED for objects gone
    since the last list), then watch events from the list's resourceVersion, resumed on drops."""
    from kubernetes_asyncio import watch as k8s_watch

    known: dict[str, dict] = {}
    backoff = Backoff(cap=5.0)
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
            await asyncio.sleep(wait_before_retry(error, backoff))
