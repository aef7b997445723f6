"""The base of every simulated controller: a thread fed by store events and timers.

A controller names the resources it watches, gets each change as ``handle(event)`` and can
ask to be called back later with ``after(seconds, callback)`` (a pod's simulated runtime,
a backoff, a deadline).  It reads and writes through the store as a real controller would
through the API, so everything it does is visible to watches and the audit of clients.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from trainops_devcluster.store import Event, Store

log = logging.getLogger(__name__)


class Controller:
    """Subclass, set ``watches`` and implement ``handle``; call ``start()`` once the store is seeded."""

    watches: tuple[str, ...] = ()

    def __init__(self, store: Store) -> None:
        self.store = store
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._timers_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        watched = set(self.watches)
        store.add_listener(lambda event: event.resource in watched and self._inbox.put(event))

    # ---- for subclasses ----------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """React to one change of a watched resource."""

    def after(self, seconds: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on this controller's thread in ``seconds``."""
        with self._timers_lock:
            heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._timer_ids), callback))
        self._inbox.put(None)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._inbox.put(None)
        self._thread.join(timeout=5)

    def _due_timers(self) -> tuple[list[Callable[[], None]], float | None]:
        now = time.monotonic()
        due = []
        with self._timers_lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
            wait = self._timers[0][0] - now if self._timers else None
        return due, wait

    def _loop(self) -> None:
        while not self._stopped.is_set():
            due, wait = self._due_timers()
            for callback in due:
                self._safely(callback)
            try:
                item = self._inbox.get(timeout=wait if wait is not None else 0.5)
            except queue.Empty:
                continue
            if isinstance(item, Event):
                self._safely(lambda item=item: self.handle(item))

    def _safely(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # a controller bug must not stop the simulated cluster
            log.exception("%s failed", type(self).__name__)
