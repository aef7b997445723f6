"""The one retry policy of trainops: what is transient, how long to wait, and until when.

``call(fn, deadline, what)`` (sync) and ``await acall(fn, deadline, what)`` (async) run ``fn`` and
retry it while it fails transiently, until ``deadline``; any other error is raised at once, and
``DeadlineExceeded`` (naming ``what`` and the last answer) once the deadline is gone.  Between
tries they wait what the server asked for (``Retry-After``, at most ``retry_after_cap_s``), else a
full-jitter exponential backoff (``Backoff``); the numbers are ``KubeSettings``'.

Transient by default (``is_transient``): an API answer of 429, 502, 503 or 504 and a dropped or
timed-out connection, from either Kubernetes client.  409 Conflict is not: the guarded edits
re-read and retry it (``trainops.kube.guarded``).  Other systems pass their own ``transient``
test (S3's conditional-write conflict in ``trainops.checkpoints.store``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from trainops.errors import TemporaryError, TrainopsError
from trainops.kube.settings import KubeSettings

T = TypeVar("T")

TRANSIENT = frozenset({0, 429, 502, 503, 504})  # 0: the client's code for a dropped connection
DEFAULTS = KubeSettings()


class DeadlineExceeded(TemporaryError, TimeoutError):
    """A step did not finish before its deadline; the message names what was being waited for."""


class Deadline:
    """A point in time (monotonic) by which a step must be done."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline must be positive seconds, got {seconds!r}")
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self._at - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0

    def _cut(self, seconds: float, what: str) -> float:
        if self.expired:
            raise DeadlineExceeded(f"{what}: not done within {self.seconds:g}s")
        return max(0.0, min(seconds, self.remaining()))

    def sleep(self, seconds: float, what: str) -> None:
        """Sleep ``seconds`` (cut short at the deadline); raise ``DeadlineExceeded(what)`` when it is gone."""
        time.sleep(self._cut(seconds, what))

    async def asleep(self, seconds: float, what: str) -> None:
        """``sleep`` without blocking the event loop."""
        await asyncio.sleep(self._cut(seconds, what))


class Backoff:
    """Exponential backoff with full jitter: a wait drawn from [0, ``base`` * 2^attempt], at most ``cap``;
    a server's ``Retry-After`` is honoured up to ``retry_after_cap`` (``wait_after``)."""

    def __init__(self, settings: KubeSettings = DEFAULTS) -> None:
        self.base, self.cap, self.attempt = settings.backoff_base_s, settings.backoff_cap_s, 0
        self.retry_after_cap = settings.retry_after_cap_s

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0

    def wait_after(self, error: BaseException) -> float:
        """How long to wait after ``error``: its ``Retry-After`` (capped), else the next backoff."""
        asked = retry_after(error)
        return min(asked, self.retry_after_cap) if asked is not None else self.next()


def retry_after(error: BaseException) -> float | None:
    """The server's ``Retry-After`` seconds, when it sent one (Kubernetes clients and botocore)."""
    headers = getattr(error, "headers", None)
    if headers is None:  # botocore's ClientError
        headers = (getattr(error, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPHeaders")
    try:
        return float((headers or {}).get("Retry-After") or (headers or {}).get("retry-after"))
    except (TypeError, ValueError):
        return None


def _connection_errors() -> tuple[type[BaseException], ...]:
    """Dropped or timed-out connections of the sync (urllib3) and async (aiohttp) clients."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from urllib3.exceptions import HTTPError

        found.append(HTTPError)
    except ImportError:
        pass
    try:
        from aiohttp import ClientError

        found.append(ClientError)
    except ImportError:
        pass
    return tuple(found)


def is_transient(error: BaseException) -> bool:
    """An API answer with a status in ``TRANSIENT``, or a dropped/timed-out connection."""
    if isinstance(error, TrainopsError):  # already the verdict of an inner retry
        return False
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status in TRANSIENT
    return isinstance(error, _connection_errors())


def _wait_or_raise(
    error: Exception,
    transient: Callable[[BaseException], bool],
    deadline: Deadline,
    backoff: Backoff,
    what: str,
) -> float:
    """The wait before the next try after ``error``; raises ``error`` when it is not transient, and
    ``DeadlineExceeded`` (naming ``what`` and the last answer) when the deadline is gone."""
    if not transient(error):
        raise error
    if deadline.expired:
        answer = getattr(error, "status", None) or repr(error)
        raise DeadlineExceeded(f"{what}: kept failing with {answer} for {deadline.seconds:g}s") from error
    return backoff.wait_after(error)


def call(
    fn: Callable[[], T],
    deadline: Deadline,
    what: str,
    *,
    transient: Callable[[BaseException], bool] = is_transient,
    settings: KubeSettings = DEFAULTS,
) -> T:
    """``fn()``, retried while it fails ``transient``-ly until ``deadline``; ``what`` names it in errors."""
    backoff = Backoff(settings)
    while True:
        try:
            return fn()
        except Exception as error:
            deadline.sleep(_wait_or_raise(error, transient, deadline, backoff, what), what)


async def acall(
    fn: Callable[[], Awaitable[T]],
    deadline: Deadline,
    what: str,
    *,
    transient: Callable[[BaseException], bool] = is_transient,
    settings: KubeSettings = DEFAULTS,
) -> T:
    """``await fn()`` with the same policy as ``call``."""
    backoff = Backoff(settings)
    while True:
        try:
            return await fn()
        except Exception as error:
            await deadline.asleep(_wait_or_raise(error, transient, deadline, backoff, what), what)
