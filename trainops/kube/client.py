"""``Kube``: the one facade over the Kubernetes API, with typed verbs on plain API dicts.

Everything that talks to the API server synchronously takes a ``Kube``: the capacity claim and
return, the health gate and quarantine, the training run's Job calls.  Make one from a kubeconfig
(the CLI: ``Kube.from_kubeconfig(path)``), or from an ApiClient you already have
(``Kube(api_client, settings)``; Airflow: ``KubernetesClusterHook(conn_id).kube()``).

The verbs, each under the one retry policy (``trainops.kube.retry``) with ``KubeSettings``' deadline:

- ``get`` (None when the object does not exist), ``list`` (every page), ``create`` (returns the
  object and whether this call created it: an existing one is read back), ``patch`` (a JSON merge
  patch; None when the object is gone), ``edit`` (read, change, write guarded by resourceVersion,
  re-read on 409: ``trainops.kube.guarded``), ``delete``, ``log_tail`` and ``watch`` (resumable, on
  the sync client; the async watches of a deferred task are ``trainops.kube.aio``).

Objects are named by a ``Kind`` (``NODES``, ``JOBS``, ... and ``kube.kueue("workloads")``, at the
Kueue version the cluster serves); requests go to the same REST paths the typed clients use.  ``core``, ``batch`` and ``custom`` (the official typed clients)
remain for the few calls with no verb here (pod evictions, ConfigMap replaces).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from trainops.errors import PermanentError, TemporaryError
from trainops.kube.guarded import Change, Edited, edit
from trainops.kube.lists import list_all
from trainops.kube.retry import Backoff, Deadline, call, is_transient
from trainops.kube.settings import KubeSettings

MERGE_PATCH = "application/merge-patch+json"
MISSING, EXISTS, GONE = 404, 409, 410


@dataclass(frozen=True)
class Kind:
    """An API resource: ``group`` ("" for the core group), ``version``, ``plural``, and whether its
    objects live in a namespace."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        """The REST path of the collection (``name`` None) or of one object (and its subresource)."""
        root = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.plural} are namespaced: a namespace is needed")
            root += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{root}/{self.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
        return f"{path}/{sub}" if sub else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = Kind("", "v1", "nodes", namespaced=False)
PODS = Kind("", "v1", "pods")
SERVICES = Kind("", "v1", "services")
EVENTS = Kind("", "v1", "events")
CONFIGMAPS = Kind("", "v1", "configmaps")
JOBS = Kind("batch", "v1", "jobs")
DEPLOYMENTS = Kind("apps", "v1", "deployments")
STATEFULSETS = Kind("apps", "v1", "statefulsets")
PDBS = Kind("policy", "v1", "poddisruptionbudgets")


class KubeconfigError(PermanentError, ValueError):
    """The kubeconfig is missing, not YAML, or not shaped like a kubeconfig."""


def api_message(error: BaseException) -> str:
    """What the API server said in its Status (which PDB, RBAC rule or admission policy refused),
    else the HTTP status, else the error itself (a connection error)."""
    try:
        return json.loads(error.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        status = getattr(error, "status", None)
        return f"HTTP {status}" if status else str(error)


def json_of(response) -> dict:
    """The JSON body of a raw (``_preload_content=False``) client response (reading it all returns
    the connection to the pool)."""
    return json.loads(response.data)


def _status(error: BaseException) -> int | None:
    return getattr(error, "status", None)


def is_denied(error: BaseException) -> bool:
    """The API server refused the caller (401 unauthenticated, 403 not authorized: RBAC)."""
    return _status(error) in (401, 403)


class Kube:
    """The verbs (see the module docstring) and the typed clients ``core``, ``batch`` and ``custom``
    on ``api_client``; ``settings``: deadlines, backoff, paging and watching."""

    def __init__(self, api_client, settings: KubeSettings | None = None) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.settings = settings or KubeSettings()
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        settings: KubeSettings | None = None,
    ) -> Kube:
        """From ``kubeconfig``; without one, in-cluster when running in a pod, else ``$KUBECONFIG`` or
        ``~/.kube/config``."""
        from kubernetes import client, config

        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return cls(client.ApiClient(configuration), settings)
        try:
            return cls(config.new_client_from_config(config_file=kubeconfig, context=context), settings)
        except Exception as error:  # the client raises TypeError, KeyError, YAMLError... on a bad file
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise KubeconfigError(
                f"kubeconfig {where} cannot be used ({type(error).__name__}: {str(error)[:300]}); "
                "fix the file or pass another with --kubeconfig or $KUBECONFIG"
            ) from None

    @classmethod
    def of(cls, client: Any) -> Kube:
        """``client`` as a ``Kube``: itself, or one on the ApiClient of a typed client (``CoreV1Api``)."""
        return client if isinstance(client, Kube) else cls(getattr(client, "api_client", client))

    def kueue(self, plural: str, *, namespaced: bool = True) -> Kind:
        """A Kueue resource at the version the cluster serves (``trainops.kube.kueue``, discovered once
        per client): ``kube.kueue("workloads")``, ``kube.kueue("clusterqueues", namespaced=False)``."""
        from trainops.kube.kueue import GROUP, served_version

        return Kind(GROUP, served_version(self.api_client), plural, namespaced)

    def with_settings(self, settings: KubeSettings) -> Kube:
        """The same connection under other settings (a view that must answer within seconds)."""
        return type(self)(self.api_client, settings)

    # ---- the request under the retry policy --------------------------------------------------
    def deadline(self) -> Deadline:
        """A fresh deadline of ``settings.api_deadline_s`` for one step."""
        return Deadline(self.settings.api_deadline_s)

    def _raw(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        stream: bool = False,
    ):
        """One request; the urllib3 response (not read when ``stream``)."""
        params = [(k, str(v).lower() if isinstance(v, bool) else v) for k, v in (query or {}).items()]
        return self.api_client.call_api(
            path,
            method,
            query_params=[(k, v) for k, v in params if v not in (None, "")],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )

    def request(
        self,
        method: str,
        path: str,
        what: str,
        *,
        unless: int | None = None,
        deadline: Deadline | None = None,
        **kwargs: Any,
    ) -> dict | None:
        """``method path`` under the retry policy, its JSON answer; None when the API answers
        ``unless`` (an outcome, not an error: the object is missing or exists)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = call(
                lambda: self._raw(method, path, **kwargs),
                deadline or self.deadline(),
                what,
                settings=self.settings,
            )
        except ApiException as error:
            if unless is None or error.status != unless:
                raise
            return None
        return json_of(response)

    # ---- verbs -------------------------------------------------------------------------------
    def get(
        self, kind: Kind, name: str, namespace: str | None = None, *, deadline: Deadline | None = None
    ) -> dict | None:
        """The object, or None when it does not exist."""
        where = f"{namespace}/{name}" if namespace else name
        return self.request(
            "GET", kind.path(namespace, name), f"read {kind} {where}", unless=MISSING, deadline=deadline
        )

    def get_all(
        self, kind: Kind, names: Collection[str], namespace: str | None = None
    ) -> dict[str, dict | None]:
        """Each named object (None for one that does not exist), ``max_concurrent_reads`` at a time."""
        return dict(
            zip(
                names,
                self.concurrently([lambda n=n: self.get(kind, n, namespace) for n in names]),
                strict=True,
            )
        )

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
        deadline: Deadline | None = None,
    ) -> list[dict]:
        """Every object of ``kind`` matching the selectors, ``page_size`` per request (all namespaces
        for a namespaced kind when ``namespace`` is None)."""
        path = (
            f"{Kind(kind.group, kind.version, kind.plural, False).path()}"
            if kind.namespaced and namespace is None
            else kind.path(namespace)
        )
        where = f" in {namespace}" if namespace else ""
        what = f"list {kind}{where}" + (f" ({labels or fields})" if labels or fields else "")
        settings = self.settings

        def page(token: str | None) -> dict:
            query = {"labelSelector": labels, "fieldSelector": fields, "limit": settings.page_size}
            return json_of(self._raw("GET", path, query={**query, "continue": token}))

        return list_all(page, deadline or self.deadline(), what, settings)

    def create(
        self, obj: Mapping, kind: Kind, *, read_back: bool = True, deadline: Deadline | None = None
    ) -> tuple[dict | None, bool]:
        """Create ``obj``; returns it and whether this call created it (False: it existed, and is read
        back unless ``read_back`` is False: then None, and no read permission is needed)."""
        meta = obj["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        where = f"{namespace}/{name}" if namespace else name
        created = self.request(
            "POST", kind.path(namespace), f"create {kind} {where}", unless=EXISTS, body=obj, deadline=deadline
        )
        if created is not None or not read_back:
            return created, created is not None
        existing = self.get(kind, name, namespace, deadline=deadline)
        if existing is None:
            raise TemporaryError(f"{kind} {where} was reported as existing but cannot be read")
        return existing, False

    def patch(
        self,
        kind: Kind,
        name: str,
        body: Mapping,
        namespace: str | None = None,
        *,
        deadline: Deadline | None = None,
    ) -> dict | None:
        """Apply the JSON merge patch ``body``; the object after it, or None when it does not exist.
        Put ``metadata.resourceVersion`` in ``body`` to make it a precondition (409 if it moved on),
        or use ``edit``, which does that and retries."""
        where = f"{namespace}/{name}" if namespace else name
        return self.request(
            "PATCH",
            kind.path(namespace, name),
            f"patch {kind} {where}",
            unless=MISSING,
            body=dict(body),
            content_type=MERGE_PATCH,
            deadline=deadline,
        )

    def edit(
        self,
        kind: Kind,
        name: str,
        change: Change,
        namespace: str | None = None,
        *,
        current: dict | None = None,
        deadline: Deadline | None = None,
    ) -> Edited:
        """Read, ``change(obj)`` (the merge patch to send, or None: nothing to do), write guarded by the
        object's resourceVersion, re-read and re-apply on 409 until ``deadline`` (``guarded.edit``).
        ``current``: an already-read copy (saves one GET).  A missing object raises the 404."""
        where = f"{namespace}/{name}" if namespace else name
        path = kind.path(namespace, name)

        def read() -> dict:
            return json_of(self._raw("GET", path))

        def write(body: dict) -> dict:
            return json_of(self._raw("PATCH", path, body=body, content_type=MERGE_PATCH))

        return edit(
            read, write, change, deadline or self.deadline(), f"{kind} {where}", current, self.settings
        )

    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        deadline: Deadline | None = None,
    ) -> bool:
        """Delete the object (``propagation``: ``Background``, ``Foreground`` or ``Orphan``); False when
        it was already gone."""
        where = f"{namespace}/{name}" if namespace else name
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        return (
            self.request(
                "DELETE",
                kind.path(namespace, name),
                f"delete {kind} {where}",
                unless=MISSING,
                body=body,
                deadline=deadline,
            )
            is not None
        )

    def log_tail(self, namespace: str, pod: str, lines: int, *, limit_bytes: int | None = None) -> str | None:
        """The last ``lines`` of the pod's log (at most ``limit_bytes``); None when the API refuses them
        (the pod is gone, its node unreachable)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = call(
                lambda: self._raw(
                    "GET",
                    PODS.path(namespace, pod, "log"),
                    query={"tailLines": lines, "limitBytes": limit_bytes},
                ),
                self.deadline(),
                f"read the log of pod {namespace}/{pod}",
                settings=self.settings,
            )
        except ApiException:
            return None
        return response.data.decode("utf-8", errors="replace")

    def concurrently(self, reads: list[Callable[[], Any]]) -> list[Any]:
        """Each read's result, in order, at most ``max_concurrent_reads`` at a time."""
        workers = max(1, min(self.settings.max_concurrent_reads, len(reads)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda read: read(), reads))

    def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        names: Collection[str] | None = None,
        labels: str = "",
        until: float,
    ) -> Iterator[dict[str, dict | None]]:
        """The objects now, then again each time one of them changes, until ``until``
        (``time.monotonic()``): name -> object (None: it does not exist).  With ``names``, only those
        objects, read one by one, and the watch's events of others are skipped here (a field selector
        takes one name); else every object matching ``labels``.  The watch starts from a resourceVersion
        taken before the reads, so no change is missed, and a broken watch (410 Gone, a dropped
        connection, a transient answer) starts over the same way.  Events stay JSON (a large fleet's
        status writes are not built into client models)."""
        from kubernetes.watch.watch import iter_resp_lines

        backoff, path = Backoff(self.settings), kind.path(namespace)
        while time.monotonic() < until:
            try:
                if names is not None:
                    version = self._version(kind, namespace, labels)
                    objects = self.get_all(kind, sorted(names), namespace)
                else:
                    version, listed = self._list_with_version(kind, namespace, labels)
                    objects = {o["metadata"]["name"]: o for o in listed}
                yield dict(objects)
                left = until - time.monotonic()
                response = self._raw(
                    "GET",
                    path,
                    query={
                        "watch": True,
                        "labelSelector": labels,
                        "resourceVersion": version,
                        "allowWatchBookmarks": True,
                        "timeoutSeconds": max(1, min(self.settings.watch_timeout_s, int(left) + 1)),
                    },
                    timeout=max(1.0, min(left, self.settings.watch_timeout_s))
                    + self.settings.watch_read_slack_s,
                )
                try:
                    for line in iter_resp_lines(response):
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            raise _WatchError(event.get("object") or {})
                        obj = event.get("object") or {}
                        name = (obj.get("metadata") or {}).get("name")
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and (
                            names is None or name in names
                        ):
                            objects[name] = None if event["type"] == "DELETED" else obj
                            yield dict(objects)
                        backoff.reset()
                        if time.monotonic() >= until:
                            return
                finally:
                    response.release_conn()
            except Exception as error:
                if _status(error) != GONE and not is_transient(error):
                    raise
                time.sleep(min(backoff.wait_after(error), max(0.0, until - time.monotonic())))

    def _version(self, kind: Kind, namespace: str | None, labels: str) -> str:
        return self._list_with_version(kind, namespace, labels, limit=1)[0]

    def _list_with_version(
        self, kind: Kind, namespace: str | None, labels: str, limit: int | None = None
    ) -> tuple[str, list[dict]]:
        listed = self.request(
            "GET",
            kind.path(namespace),
            f"list {kind}",
            query={"labelSelector": labels, "limit": limit},
        )
        return listed["metadata"]["resourceVersion"], listed.get("items") or []


class _WatchError(Exception):
    """An ERROR event in a watch stream (410 Gone: its resourceVersion is too old)."""

    def __init__(self, status: Mapping) -> None:
        super().__init__(status.get("message") or "watch error")
        self.status = status.get("code")
