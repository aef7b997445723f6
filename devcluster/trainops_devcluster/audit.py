"""The API server's audit log (every request) and its injected API faults."""

from __future__ import annotations

import collections
import random
import re
import threading
import time
from dataclasses import dataclass


class AuditLog:
    """Every request the server answered, newest last; thread-safe and bounded."""

    def __init__(self, limit: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._entries: collections.deque[dict] = collections.deque(maxlen=limit)

    def record(
        self, *, verb: str, method: str, path: str, status: int, user_agent: str, user: str = ""
    ) -> None:
        """One request: ``user`` is the authenticated user's name ("" when authentication failed)."""
        entry = {
            "time": time.time(),
            "verb": verb,
            "method": method,
            "path": path,
            "status": status,
            "user_agent": user_agent,
            "user": user,
        }
        with self._lock:
            self._entries.append(entry)

    def entries(self) -> list[dict]:
        with self._lock:
            return [dict(e) for e in self._entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


@dataclass
class _Fault:
    pattern: re.Pattern
    status: int
    count: int | None
    fraction: float | None


class ApiFaults:
    """Injected API errors: for requests whose path (with query) matches a regex, answer ``status``
    (429, 500 or 503) for the next ``count`` requests, or for a ``fraction`` of them (seeded RNG)."""

    STATUSES = (429, 500, 503)

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._random = random.Random(seed)

    def add(
        self, path_regex: str, status: int, count: int | None = None, fraction: float | None = None
    ) -> None:
        if status not in self.STATUSES:
            raise ValueError(f"status must be one of {self.STATUSES}, not {status}")
        if (count is None) == (fraction is None):
            raise ValueError("give exactly one of count (next N requests) or fraction (0 < F <= 1)")
        if count is not None and count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], not {fraction}")
        try:
            pattern = re.compile(path_regex)
        except re.error as exc:
            raise ValueError(f"path_regex {path_regex!r} is not a regular expression: {exc}") from None
        with self._lock:
            self._faults.append(_Fault(pattern, status, count, fraction))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def pick(self, path: str) -> int | None:
        """The status to inject for this request, if any (consumes one of a counted fault)."""
        with self._lock:
            for fault in self._faults:
                if not fault.pattern.search(path):
                    continue
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                    return fault.status
                if self._random.random() < fault.fraction:
                    return fault.status
        return None
