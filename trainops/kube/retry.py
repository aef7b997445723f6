"""Deadlines and retries for Kubernetes API calls.

``call(fn, deadline, what)`` runs ``fn`` and retries it while the API server answers with a
transient status (429 Too Many Requests, 502/503/504) or the connection drops, backing off
with jitter and honouring ``Retry-After``, until ``deadline`` passes.  Any other error is
raised at once.  409 Conflict is not transient here: the guarded edits re-read and retry it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TRANSIENT = frozenset({0, 429, 502, 503, 504})  # 0: the client's code for a dropped connection


class DeadlineExceeded(TimeoutError):
    """A step did not finish before its deadline; the message names what was being waited for."""


class Deadline:
    """A point in time (monotonic) by which a step must be done."""

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"a deadline must be positive seconds, got {seconds!r}")
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self._at - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0

    def sleep(self, seconds: float, what: str) -> None:
        """Sleep ``seconds`` (cut short at the deadline); raise ``DeadlineExceeded(what)`` when it is gone."""
        if self.expired:
            raise DeadlineExceeded(f"{what}: not done within {self.seconds:g}s")
        time.sleep(max(0.0, min(seconds, self.remaining())))


class Backoff:
    """Exponential backoff with full jitter: 0.05 s doubling up to ``cap`` seconds."""

    def __init__(self, base: float = 0.05, cap: float = 2.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return random.uniform(delay / 2, delay)


def retry_after(error: BaseException) -> float | None:
    """The server's ``Retry-After`` seconds, when it sent one."""
    headers = getattr(error, "headers", None) or {}
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def call(fn: Callable[[], T], deadline: Deadline, what: str) -> T:
    """``fn()``, retried on transient API errors until ``deadline``; ``what`` names it in errors."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    backoff = Backoff()
    while True:
        try:
            return fn()
        except (ApiException, HTTPError) as error:
            status = getattr(error, "status", 0)
            if status not in TRANSIENT:
                raise
            if deadline.expired:
                raise DeadlineExceeded(
                    f"{what}: the API server kept answering {status or error!r} for {deadline.seconds:g}s"
                ) from error
            deadline.sleep(min(retry_after(error) or backoff.next(), 5.0), what)
