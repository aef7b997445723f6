"""Container logs of the devcluster's pods, written by the pod runtimes and read by ``pods/<name>/log``."""

from __future__ import annotations

import threading


class PodLogs:
    """Log text per pod (``namespace/name``), kept in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, str], list[str]] = {}

    def append(self, namespace: str, name: str, text: str) -> None:
        with self._lock:
            self._logs.setdefault((namespace, name), []).append(text)

    def read(self, namespace: str, name: str) -> str:
        with self._lock:
            return "".join(self._logs.get((namespace, name), []))

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._logs.pop((namespace, name), None)
