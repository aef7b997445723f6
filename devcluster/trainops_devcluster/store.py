"""The devcluster's object store: what etcd plus the API server's storage layer do.

It owns resourceVersions, uids, creation timestamps and generations, enforces
resourceVersion preconditions, and fans every change out to watchers and controllers.

Objects are plain dicts shaped like the Kubernetes JSON.  A *resource* is named by its
plural and group, e.g. ``"nodes"``, ``"pods"``, ``"deployments.apps"``, ``"jobs.batch"``,
``"workloads.kueue.x-k8s.io"``.  Cluster-scoped objects live in namespace ``""``.

Copy discipline: writes store a private deep copy; ``get`` returns a copy the caller may
change; ``list`` and events return the stored snapshots themselves, which nobody may mutate
(the store never changes a stored dict in place, it replaces it).
"""

from __future__ import annotations

import bisect
import collections
import copy
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


class StoreError(Exception):
    """An API error with the HTTP code and Status reason the API server answers; ``resource``
    (``plural[.group]``) and ``name`` name the object it is about, for the Status ``details``."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str = "", *, resource: str = "", name: str = "") -> None:
        super().__init__(message)
        self.resource, self.name = resource, name


class NotFound(StoreError):
    code, reason = 404, "NotFound"


class AlreadyExists(StoreError):
    code, reason = 409, "AlreadyExists"


class Conflict(StoreError):
    code, reason = 409, "Conflict"


class Gone(StoreError):
    code, reason = 410, "Expired"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    """``previous``: the object before a MODIFIED event, as the watch cache keeps it (selector
    watches judge on it whether the client held the object)."""

    type: str
    resource: str
    object: dict
    resource_version: int
    previous: dict | None = None


@dataclass
class Watch:
    """One open watch: events for one resource (optionally one namespace) arrive on ``events``."""

    resource: str
    namespace: str | None
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    closed: threading.Event = field(default_factory=threading.Event)

    def matches(self, event: Event) -> bool:
        if event.resource != self.resource:
            return False
        return self.namespace is None or event.object["metadata"].get("namespace", "") == self.namespace

    def close(self) -> None:
        self.closed.set()
        self.events.put(None)


Listener = Callable[[Event], None]


class Store:
    """Thread-safe object store with resourceVersions, preconditions, watch history and listeners."""

    def __init__(self, history: int = 20_000) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[tuple[str, str], dict]] = collections.defaultdict(dict)
        self._rv = 1
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._watches: list[Watch] = []
        self._listeners: list[Listener] = []
        self._owned: dict[str, set[tuple[str, str, str]]] = collections.defaultdict(set)
        self._sorted: dict[str, list[tuple[str, str]]] = {}  # sorted keys per resource, rebuilt lazily

    # ---- reads -------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    @property
    def oldest_resource_version(self) -> int:
        """The oldest resourceVersion a watch or a continue token can still resume from."""
        with self._lock:
            return self._history[0].resource_version - 1 if self._history else self._rv

    def get(self, resource: str, namespace: str, name: str) -> dict:
        with self._lock:
            try:
                return copy.deepcopy(self._objects[resource][(namespace, name)])
            except KeyError:
                raise NotFound(f'{resource} "{name}" not found', resource=resource, name=name) from None

    def find(self, resource: str, namespace: str, name: str) -> dict | None:
        """Like ``get`` but ``None`` when absent."""
        try:
            return self.get(resource, namespace, name)
        except NotFound:
            return None

    def list(
        self, resource: str, namespace: str | None = None, *, after: tuple[str, str] | None = None
    ) -> tuple[list[dict], int]:
        """Stored snapshots (do not mutate), sorted by namespace and name, and the list's resourceVersion.
        ``after``: only the objects sorted after that (namespace, name) key, as a list page continues."""
        with self._lock:
            items = self._objects.get(resource, {})
            keys = self._sorted_keys(resource)
            low, high = 0, len(keys)
            if namespace is not None:  # one namespace's keys are contiguous
                low, high = (
                    bisect.bisect_left(keys, (namespace, "")),
                    bisect.bisect_left(keys, (namespace + "\0", "")),
                )
            if after is not None:
                low = max(low, bisect.bisect_right(keys, after))
            return [items[k] for k in keys[low:high]], self._rv

    def _sorted_keys(self, resource: str) -> list[tuple[str, str]]:
        keys = self._sorted.get(resource)
        if keys is None:
            keys = self._sorted[resource] = sorted(self._objects.get(resource, {}))
        return keys

    def dependents(self, owner_uid: str) -> list[tuple[str, dict]]:
        """(resource, stored snapshot) of every object with an ownerReference to ``owner_uid``."""
        with self._lock:
            return [
                (resource, self._objects[resource][(namespace, name)])
                for resource, namespace, name in sorted(self._owned.get(owner_uid, ()))
            ]

    def count(self, resource: str) -> int:
        with self._lock:
            return len(self._objects.get(resource, {}))

    # ---- writes ------------------------------------------------------------------------
    def create(self, resource: str, obj: dict) -> dict:
        """Store a new object; fills uid (unless given), creationTimestamp, resourceVersion, generation
        and a name from generateName."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "")
        _drop_empty(meta)
        with self._lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            key = (namespace, meta["name"])
            if key in self._objects[resource]:
                raise AlreadyExists(
                    f'{resource} "{meta["name"]}" already exists', resource=resource, name=meta["name"]
                )
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            meta["generation"] = 1
            meta.pop("resourceVersion", None)
            return self._commit(ADDED, resource, key, obj)

    def update(self, resource: str, obj: dict, *, check_version: bool = True) -> dict:
        """Replace an object.  With ``check_version``, a resourceVersion in ``obj`` that is not
        the stored one raises ``Conflict`` (an empty one means "unconditional")."""
        return self._replace(resource, copy.deepcopy(obj), check_version)

    def _replace(self, resource: str, obj: dict, check_version: bool) -> dict:
        """``update`` of an ``obj`` the store may keep as it is (nobody else holds it)."""
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        _drop_empty(meta)
        with self._lock:
            current = self._objects[resource].get(key)
            if current is None:
                raise NotFound(f'{resource} "{meta["name"]}" not found', resource=resource, name=meta["name"])
            cur_meta = current["metadata"]
            wanted = meta.get("resourceVersion")
            if check_version and wanted and wanted != cur_meta["resourceVersion"]:
                raise Conflict(
                    f'Operation cannot be fulfilled on {resource} "{meta["name"]}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    resource=resource,
                    name=meta["name"],
                )
            for immutable in ("uid", "creationTimestamp"):
                meta[immutable] = cur_meta[immutable]
            generation = cur_meta.get("generation", 1)
            if obj.get("spec") != current.get("spec"):
                generation += 1
            meta["generation"] = generation
            if obj == current | {"metadata": obj["metadata"]} and _same_meta(meta, cur_meta):
                return copy.deepcopy(current)
            return self._commit(MODIFIED, resource, key, obj)

    def mutate(self, resource: str, namespace: str, name: str, change: Callable[[dict], object]) -> dict:
        """Read-modify-write under the store lock (for controllers): ``change`` edits a copy in place."""
        with self._lock:
            obj = self.get(resource, namespace, name)
            change(obj)
            obj["metadata"].pop("resourceVersion", None)
            return self._replace(resource, obj, check_version=False)

    def delete(
        self, resource: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> dict:
        with self._lock:
            current = self._objects[resource].get((namespace, name))
            if current is None:
                raise NotFound(f'{resource} "{name}" not found', resource=resource, name=name)
            if resource_version and resource_version != current["metadata"]["resourceVersion"]:
                raise Conflict(
                    f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                    f"ResourceVersion in precondition: {resource_version}, ResourceVersion in object meta: "
                    f"{current['metadata']['resourceVersion']}",
                    resource=resource,
                    name=name,
                )
            del self._objects[resource][(namespace, name)]
            self._sorted.pop(resource, None)
            self._index_owners(resource, (namespace, name), current, None)
            self._rv += 1
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._publish(Event(DELETED, resource, gone, self._rv))
            return gone

    def _commit(self, kind: str, resource: str, key: tuple[str, str], obj: dict) -> dict:
        if kind == ADDED:
            self._sorted.pop(resource, None)
        previous = self._objects[resource].get(key)
        self._index_owners(resource, key, previous, obj)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[resource][key] = obj
        self._publish(Event(kind, resource, obj, self._rv, previous))
        return copy.deepcopy(obj)

    def _index_owners(self, resource: str, key: tuple[str, str], old: dict | None, new: dict | None) -> None:
        entry = (resource, *key)
        for ref in (old or {}).get("metadata", {}).get("ownerReferences") or ():
            owned = self._owned.get(ref.get("uid"))
            if owned is not None:
                owned.discard(entry)
                if not owned:
                    del self._owned[ref.get("uid")]
        for ref in (new or {}).get("metadata", {}).get("ownerReferences") or ():
            self._owned[ref.get("uid")].add(entry)

    def _publish(self, event: Event) -> None:
        self._history.append(event)
        for watch in self._watches:
            if watch.matches(event):
                watch.events.put(event)
        for listener in self._listeners:
            listener(event)

    # ---- change feeds ------------------------------------------------------------------
    def watch(self, resource: str, namespace: str | None = None, since: int | None = None) -> Watch:
        """Open a watch.  ``since``: replay history after that resourceVersion (``Gone`` if it
        is older than the history kept); ``None`` or 0: an ADDED event for every current object first."""
        with self._lock:
            watch = Watch(resource, namespace)
            if since:
                oldest = self._history[0].resource_version if self._history else self._rv + 1
                if since < oldest - 1 and since < self._rv:
                    raise Gone(f"too old resource version: {since} ({oldest - 1})")
                for event in self._history:
                    if event.resource_version > since and watch.matches(event):
                        watch.events.put(event)
            else:
                for obj in self.list(resource, namespace)[0]:
                    watch.events.put(Event(ADDED, resource, obj, int(obj["metadata"]["resourceVersion"])))
            self._watches.append(watch)
            return watch

    def stop_watch(self, watch: Watch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)
        watch.close()

    def close_all_watches(self) -> int:
        """Drop every open watch (fault injection: ``drop-watches``); returns how many."""
        with self._lock:
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.close()
        return len(watches)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every change, in order, while the store lock is held:
        it must only enqueue work, never write back or block."""
        with self._lock:
            self._listeners.append(listener)

    def iter_events(self, watch: Watch, timeout: float | None = None) -> Iterator[Event]:
        """Events of ``watch`` until it is closed (or ``timeout`` passes with no event)."""
        while not watch.closed.is_set():
            try:
                event = watch.events.get(timeout=timeout)
            except queue.Empty:
                return
            if event is None:
                return
            yield event


def _drop_empty(meta: dict) -> None:
    """Omit empty metadata fields, as the API server does (a cluster-scoped object has no namespace)."""
    for name in ("namespace", "labels", "annotations", "ownerReferences", "finalizers"):
        if name in meta and not meta[name]:
            del meta[name]


def _same_meta(a: dict, b: dict) -> bool:
    ignore = {"resourceVersion"}
    return {k: v for k, v in a.items() if k not in ignore} == {k: v for k, v in b.items() if k not in ignore}
