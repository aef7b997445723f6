"""The one retry policy: transient answers retried (Retry-After honoured), others raised at once,
and a deadline that names what kept failing."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes.client.exceptions import ApiException

from trainops.errors import TemporaryError
from trainops.kube import retry
from trainops.kube.retry import Deadline, DeadlineExceeded, acall, call


def answers(*statuses, retry_after=None):
    """A call that fails with each status in turn, then returns "done"; ``calls`` counts the tries."""
    left = list(statuses)

    def fn():
        fn.calls += 1
        if left:
            error = ApiException(status=left.pop(0))
            error.headers = {"Retry-After": retry_after} if retry_after else {}
            raise error
        return "done"

    fn.calls = 0
    return fn


@pytest.fixture
def waits(monkeypatch):
    """The waits the sync runner asks for (nothing really sleeps)."""
    asked: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", asked.append)
    return asked


def test_transient_answers_are_retried_waiting_what_the_server_asks(waits):
    fn = answers(429, 503, retry_after="2")
    assert call(fn, Deadline(60), "list nodes") == "done"
    assert fn.calls == 3 and waits == [2.0, 2.0]


def test_without_retry_after_the_waits_are_jittered_and_capped(waits):
    fn = answers(*[502] * 12)
    assert call(fn, Deadline(600), "list nodes") == "done"
    assert all(0 <= w <= retry.DEFAULTS.backoff_cap_s for w in waits) and len(waits) == 12


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422, 500])
def test_other_answers_are_raised_at_once(status, waits):
    fn = answers(status)
    with pytest.raises(ApiException) as raised:
        call(fn, Deadline(60), "patch node")
    assert raised.value.status == status and fn.calls == 1 and waits == []


def test_the_deadline_names_the_step_and_the_last_answer():
    fn = answers(*[503] * 10_000, retry_after="0.01")
    with pytest.raises(
        DeadlineExceeded, match=r"read ClusterQueue training: kept failing with 503 for 0.2s"
    ) as raised:
        call(fn, Deadline(0.2), "read ClusterQueue training")
    assert isinstance(raised.value, TemporaryError) and fn.calls > 1


def test_the_async_runner_retries_dropped_connections():
    import aiohttp

    tries = []

    async def fn():
        tries.append(1)
        if len(tries) < 3:
            raise aiohttp.ClientConnectionError("connection reset")
        return "listed"

    assert asyncio.run(acall(fn, Deadline(60), "list nodes")) == "listed"
    assert len(tries) == 3


def test_a_caller_chooses_what_is_transient(waits):
    conflicts = iter(["ConditionalRequestConflict", "ConditionalRequestConflict"])

    def put():
        code = next(conflicts, None)
        if code:
            raise KeyError(code)
        return "written"

    assert call(put, Deadline(60), "conditional write", transient=lambda e: "Conflict" in str(e)) == "written"
    assert len(waits) == 2
