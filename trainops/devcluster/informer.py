"""A controller with an informer's cache: the latest object of every watched resource, in order.

Like client-go's shared informer it lists the watched resources when it starts, then applies
each change, ignoring any event older than what it already holds, and hands subclasses the
old and new object of every change (``new`` is ``None`` for a deletion).
"""

from __future__ import annotations

from trainops.devcluster.controller import Controller
from trainops.devcluster.store import DELETED, Event, Store

Key = tuple[str, str]


def key_of(obj: dict) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class InformerController(Controller):
    """Subclass, set ``watches`` and implement ``changed(resource, old, new)``."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.cache: dict[str, dict[Key, dict]] = {resource: {} for resource in self.watches}

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

    def _relist(self) -> None:
        for resource in self.watches:
            for obj in self.store.list(resource)[0]:
                self.observe(resource, obj)


def _version(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])
