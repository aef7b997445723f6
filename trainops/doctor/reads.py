"""What the checks read of the cluster, and nothing else: GETs, paged LISTs, discovery and
SelfSubjectAccessReviews (which answer a question and store nothing), under the one retry policy.

``Reads`` is one check's view: every request ends by that check's deadline.  Reads that several
checks need (the nodes, every DaemonSet, the probe's DaemonSet) are made once and shared.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any
from urllib.parse import quote

from trainops.kube.lists import list_all
from trainops.kube.retry import Deadline, call

NOT_FOUND = 404


def path(group: str, version: str, plural: str, namespace: str = "", name: str = "") -> str:
    """The REST path of a collection or (with ``name``) of one object."""
    root = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        root += f"/namespaces/{quote(namespace, safe='')}"
    return f"{root}/{plural}" + (f"/{quote(name, safe='')}" if name else "")


class _Shared:
    """Reads made once for every check (the first caller reads; the others wait for its answer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[str, Future] = {}

    def once(self, key: str, read: Callable[[], Any], deadline: Deadline) -> Any:
        with self._lock:
            future, mine = self._futures.get(key), False
            if future is None:
                future, mine = Future(), True
                self._futures[key] = future
        if mine:
            try:
                future.set_result(read())
            except BaseException as error:
                future.set_exception(error)
        return future.result(timeout=max(0.0, deadline.remaining()))


class Reads:
    """The cluster as one check reads it (``kube``: a ``trainops.kube.client.Kube``)."""

    def __init__(self, kube, deadline: Deadline, shared: _Shared | None = None) -> None:
        self.kube, self.deadline = kube, deadline
        self._shared = shared or _Shared()

    def for_check(self, deadline: Deadline) -> Reads:
        """A view for another check: its own deadline, the same shared reads."""
        return Reads(self.kube, deadline, self._shared)

    # ---- requests ----------------------------------------------------------------------------
    def _request(self, method: str, url: str, what: str, *, query=None, body=None) -> dict:
        def once() -> dict:
            response = self.kube.api_client.call_api(
                url,
                method,
                query_params=[(k, v) for k, v in (query or {}).items() if v not in (None, "")],
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=max(1.0, self.deadline.remaining()),
            )
            return json.loads(response.data)

        return call(once, self.deadline, what)

    def get(self, url: str, what: str) -> dict | None:
        """The object at ``url``; None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._request("GET", url, f"read {what}")
        except ApiException as error:
            if error.status == NOT_FOUND:
                return None
            raise

    def list(self, url: str, what: str, *, labels: str = "") -> list[dict]:
        """Every object of the collection at ``url`` (matching ``labels``), in pages."""
        from trainops.kube.lists import PAGE

        def page(token: str | None) -> dict:
            query = {"labelSelector": labels, "limit": PAGE, "continue": token}
            return self._request("GET", url, f"list {what}", query=query)

        return list_all(page, self.deadline, f"list {what}")

    def shared(self, key: str, read: Callable[[], Any]) -> Any:
        """``read()``, made once for all checks."""
        return self._shared.once(key, read, self.deadline)

    # ---- what several checks read ------------------------------------------------------------
    def served_resources(self, group: str, version: str) -> set[str] | None:
        """The resources the API serves at ``group/version`` (discovery); None when it serves none there."""
        url = f"/apis/{group}/{version}" if group else f"/api/{version}"
        found = self.shared(f"discovery {url}", lambda: self.get(url, f"API discovery {url}"))
        return None if found is None else {r.get("name") for r in found.get("resources") or []}

    def nodes(self) -> list[dict]:
        return self.shared("nodes", lambda: self.list(path("", "v1", "nodes"), "nodes"))

    def daemon_sets(self) -> list[dict]:
        return self.shared("daemonsets", lambda: self.list(path("apps", "v1", "daemonsets"), "DaemonSets"))

    def access(self, verb: str, group: str, resource: str, namespace: str = "") -> tuple[bool, str]:
        """May the caller ``verb`` ``resource`` (``pods/eviction``: with its subresource)?  A
        SelfSubjectAccessReview: (allowed, the authorizer's reason)."""
        plural, _, sub = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": plural, "subresource": sub}
        if namespace:
            attributes["namespace"] = namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        url = path("authorization.k8s.io", "v1", "selfsubjectaccessreviews")
        answer = self._request("POST", url, f"ask whether this account may {verb} {resource}", body=body)
        status = answer.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")
