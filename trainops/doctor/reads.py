"""What the checks read of the cluster, and nothing else: GETs, paged LISTs, discovery and
SelfSubjectAccessReviews (which answer a question and store nothing), through the ``Kube`` facade.

``Reads`` is one check's view: every request ends by that check's deadline.  Reads that several
checks need (the GPU nodes, every DaemonSet, the probe's DaemonSet, GPU Operator's ClusterPolicy)
are made once and shared.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from trainops.kube.client import Kind
from trainops.kube.retry import Deadline

MISSING = 404
DAEMONSETS = Kind("apps", "v1", "daemonsets")
NAMESPACES = Kind("", "v1", "namespaces", namespaced=False)
ACCESS_REVIEWS = Kind("authorization.k8s.io", "v1", "selfsubjectaccessreviews", namespaced=False)


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

    def _timeout(self) -> float:
        return max(1.0, self.deadline.remaining())

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        """The object; None when it does not exist."""
        return self.kube.get(kind, name, namespace, deadline=self.deadline)

    def get_path(self, path: str, what: str) -> dict | None:
        """A document that is not an object (``/version``, discovery); None when the API has none there."""
        return self.kube.request(
            "GET", path, f"read {what}", unless=MISSING, deadline=self.deadline, timeout=self._timeout()
        )

    def list(self, kind: Kind, namespace: str | None = None, *, labels: str = "") -> list[dict]:
        """Every object of ``kind`` (matching ``labels``), in pages."""
        return self.kube.list(kind, namespace, labels=labels, deadline=self.deadline)

    def shared(self, key: str, read: Callable[[], Any]) -> Any:
        """``read()``, made once for all checks."""
        return self._shared.once(key, read, self.deadline)

    # ---- what several checks read ------------------------------------------------------------
    def served_resources(self, group: str, version: str) -> set[str] | None:
        """The resources the API serves at ``group/version`` (discovery); None when it serves none there."""
        url = f"/apis/{group}/{version}" if group else f"/api/{version}"
        found = self.shared(f"discovery {url}", lambda: self.get_path(url, f"API discovery {url}"))
        return None if found is None else {r.get("name") for r in found.get("resources") or []}

    def daemon_sets(self) -> list[dict]:
        return self.shared("daemonsets", lambda: self.list(DAEMONSETS))

    def access(self, verb: str, group: str, resource: str, namespace: str = "") -> bool:
        """May the caller ``verb`` ``resource`` (``pods/eviction``: with its subresource)?  Asked with a
        SelfSubjectAccessReview, which the API answers without storing anything."""
        plural, _, sub = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": plural, "subresource": sub}
        if namespace:
            attributes["namespace"] = namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = self.kube.request(
            "POST",
            ACCESS_REVIEWS.path(),
            f"ask whether this account may {verb} {resource}",
            body=body,
            deadline=self.deadline,
            timeout=self._timeout(),
        )
        return bool((answer.get("status") or {}).get("allowed"))
