"""core/v1 Events written by the simulated controllers, aggregated and capped.

Like client-go's recorder, a repeat of the same reason and message for the same object bumps
``count`` and ``lastTimestamp`` instead of adding an object.  So that 32,768 pods do not flood
the store, each recorder writes at most ``rate`` Events a second (after a burst of ``burst``;
the rest are dropped, as an API server's EventRateLimit does) and keeps at most ``limit``,
deleting its oldest beyond that (a real cluster expires them after an hour).
"""

from __future__ import annotations

import collections
import threading
import time

from trainops_devcluster.store import NotFound, Store, StoreError, now_iso

WARNING, NORMAL = "Warning", "Normal"


class EventRecorder:
    """Records Events from one component (``default-scheduler``, ``kubelet``, ``job-controller`` ...)."""

    def __init__(
        self, store: Store, component: str, *, limit: int = 1000, rate: float = 20.0, burst: int = 200
    ) -> None:
        self.store = store
        self.component = component
        self.limit = limit
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._refilled = time.monotonic()
        self._lock = threading.Lock()
        self._names: collections.OrderedDict[tuple, tuple[str, str]] = collections.OrderedDict()

    def record(
        self, obj: dict, reason: str, message: str, type: str = NORMAL, host: str | None = None
    ) -> None:
        """Record an Event about ``obj`` (any stored object); cluster-scoped objects' Events go to ``default``."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        dedupe = (meta.get("uid"), reason, message, type)
        with self._lock:
            if dedupe in self._names and self._bump(*self._names[dedupe]):
                self._names.move_to_end(dedupe)
                return
            if not self._take_token():
                return
            name = f"{meta['name']}.{time.time_ns():x}"
            stamp = now_iso()
            source = {"component": self.component} | ({"host": host} if host else {})
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion", "v1"),
                    "kind": obj.get("kind", ""),
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "resourceVersion": meta.get("resourceVersion", ""),
                }
                | ({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
                "reason": reason,
                "message": message,
                "type": type,
                "source": source,
                "reportingComponent": self.component,
                "reportingInstance": host or self.component,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                self.store.create("events", event)
            except StoreError:
                return
            self._names[dedupe] = (namespace, name)
            while len(self._names) > self.limit:
                _, (old_ns, old_name) = self._names.popitem(last=False)
                try:
                    self.store.delete("events", old_ns, old_name)
                except NotFound:
                    pass

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _bump(self, namespace: str, name: str) -> bool:
        def bump(event: dict) -> None:
            event["count"] = event.get("count", 1) + 1
            event["lastTimestamp"] = now_iso()

        try:
            self.store.mutate("events", namespace, name, bump)
        except NotFound:
            return False
        return True
