"""A controller with an informer's cache: the latest object of every watched resource, in order.

Like client-go's shared informer it lists the watched resources when it starts, then applies
each change, ignoring any event older than what it already holds, and hands subclasses the
old and new object of every change (``new`` is ``None`` for a deletion).  Like a controller's
work queue, ``mark(key)`` collects keys and reconciles each once per batch, however many
changes arrived for it meanwhile.
"""

from __future__ import annotations

from trainops_devcluster.controller import Controller
from trainops_devcluster.store import DELETED, Event, Store

Key = tuple[str, str]


def key_of(obj: dict) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class InformerController(Controller):
    """Subclass, set ``watches``, implement ``changed(resource, old, new)`` and, to use ``mark``,
    ``reconcile(keys)``."""

    batch_seconds = 0.02  # changes arriving within this window are reconciled together

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.cache: dict[str, dict[Key, dict]] = {resource: {} for resource in self.watches}
        self._dirty: set = set()
        self._flush_pending = False

    def start(self) -> None:
        self.after(0, self._relist)
        super().start()

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        """React to one change; both objects are snapshots nobody may mutate."""

    def handle(self, event: Event) -> None:
        self.observe(event.resource, event.object, deleted=event.type == DELETED)

    def observe(self, resource: str, obj: dict, *, deleted: bool = False) -> None:
        """Apply one version of an object to the cache (also used for the controller's own writes)."""
        cache = self.cache[resource]
        key = key_of(obj)
        old = cache.get(key)
        if old is not None and _version(old) >= _version(obj):
            return
        if deleted:
            if old is None:
                return
            del cache[key]
            self.changed(resource, old, None)
        else:
            cache[key] = obj
            self.changed(resource, old, obj)

    def mark(self, key) -> None:
        """Reconcile ``key`` with the next batch."""
        self._dirty.add(key)
        if not self._flush_pending:
            self._flush_pending = True
            self.after(self.batch_delay(), self._flush)

    def batch_delay(self) -> float:
        return self.batch_seconds

    def reconcile(self, keys: set) -> None:
        """Bring the objects behind the marked ``keys`` to their wanted state."""

    def _flush(self) -> None:
        self._flush_pending = False
        dirty, self._dirty = self._dirty, set()
        self.reconcile(dirty)

    def _relist(self) -> None:
        for resource in self.watches:
            for obj in self.store.list(resource)[0]:
                self.observe(resource, obj)


def _version(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])
