"""The resume budget (``max_resumes``, else ``retries``) counts the resumes made since the run started or
was last cleared, whichever try or trigger made them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from trainops.operators.training import GangTrainingOperator

from trainops.training.attempts import RunLedger
from trainops.training.runner import GangRun


def operator(max_resumes: int | None, retries: int = 10) -> GangTrainingOperator:
    return GangTrainingOperator(
        task_id="train",
        image="img",
        command=["python", "train.py"],
        run_uri="s3://bucket/runs/r/",
        retries=retries,
        max_resumes=max_resumes,
    )


def ledger(*tries: int) -> RunLedger:
    """A ledger with one ended attempt per entry, begun by that try."""
    ledger = RunLedger()
    for number, try_number in enumerate(tries, 1):
        ledger.begin(f"job-{number}", None, None, None, try_number)
        ledger.end("infrastructure", "node lost")
    return ledger


def resumes_left(op: GangTrainingOperator, max_tries: int, ledger: RunLedger) -> int:
    """What the run the operator makes for a try with ``max_tries`` may still resume."""
    budget = op.resume_budget(SimpleNamespace(max_tries=max_tries))
    return GangRun(op.spec(), "dag", "run", None, None, ledger, print, **budget).resumes_left


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2), (50, 50)])
def test_a_fresh_run_gets_max_resumes_else_retries(max_resumes, expected):
    assert resumes_left(operator(max_resumes), max_tries=10, ledger=ledger(1)) == expected


@pytest.mark.parametrize("max_resumes, expected", [(None, 7), (2, 0), (4, 1)])
def test_resumes_made_in_one_try_by_the_trigger_count(max_resumes, expected):
    # try 1 began attempt 1 and its trigger resumed three times (attempts 2-4, all begun by try 1)
    assert resumes_left(operator(max_resumes), max_tries=10, ledger=ledger(1, 1, 1, 1)) == expected


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2)])
def test_a_clear_gives_a_fresh_budget(max_resumes, expected):
    # 4 attempts in tries 1-3; Clear sets max_tries = 3 + retries and its try (4) made attempt 5
    assert resumes_left(operator(max_resumes), max_tries=3 + 10, ledger=ledger(1, 1, 2, 3, 4)) == expected


def test_the_ledger_records_when_each_attempt_began_and_when_its_end_was_seen():
    ledger, before = RunLedger(), time.time()
    ledger.begin("job-1", None, None, None, 1)
    ledger.end("infrastructure", "node lost", seen_at=123.0)
    ledger.begin("job-2", None, None, None, 1)
    after = time.time()
    first, second = RunLedger.from_dict(ledger.to_dict()).attempts
    assert first.ended_at == 123.0 and second.ended_at is None
    assert before <= first.began_at <= second.began_at <= after
