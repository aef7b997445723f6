"""The resume budget (``max_resumes``, else ``retries``; and ``unconfirmed_fault_retries``) counts the
resumes made since the run started or was last cleared, whichever try or trigger made them, and both
reset the same way at a Clear (``trainops.training.decide.Budget``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from trainops.operators.training import GangTrainingOperator

from trainops.training.decide import Begin, Budget, Fail, decide
from trainops.training.ledger import Attempt, End, Ledger, State, Verdict

CRASH = End("infrastructure", Verdict.RESUME, "node lost")


def operator(max_resumes: int | None, retries: int = 10) -> GangTrainingOperator:
    return GangTrainingOperator(
        task_id="train",
        image="img",
        command=["python", "train.py"],
        run_uri="s3://bucket/runs/r/",
        retries=retries,
        max_resumes=max_resumes,
    )


def budget_of(op: GangTrainingOperator, try_number: int, max_tries: int) -> Budget:
    return Budget(try_number=try_number, **op.resume_budget(SimpleNamespace(max_tries=max_tries)))


def resumes_left(budget: Budget, *tries: int) -> int:
    """How many more crashes ``decide`` resumes after attempts begun by ``tries``, each made as ``decide``
    made it (before a Clear the run counted from try 1) and each ended by a crash judged a resume."""
    attempts: list[Attempt] = []

    def crashed(action: Begin, try_number: int) -> None:
        attempts.append(
            Attempt(action.number, "job", State.FAILED, try_number, spent=action.spent, end=CRASH)
        )

    for try_number in tries:
        first_try = budget.first_try if try_number >= budget.first_try else 1
        then = replace(budget, try_number=try_number, first_try=first_try, max_resumes=1_000)
        crashed(decide(Ledger(tuple(attempts)), then, 0.0), try_number)
    left = 0
    while isinstance(action := decide(Ledger(tuple(attempts)), budget, 0.0), Begin):
        left += 1
        crashed(action, budget.try_number)
    assert isinstance(action, Fail) and action.exhausted
    return left


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2), (50, 50)])
def test_a_fresh_run_gets_max_resumes_else_retries(max_resumes, expected):
    assert resumes_left(budget_of(operator(max_resumes), 1, max_tries=10), 1) == expected


@pytest.mark.parametrize("max_resumes, expected", [(None, 7), (2, 0), (4, 1)])
def test_resumes_made_in_one_try_by_the_trigger_count(max_resumes, expected):
    # try 1 began attempt 1 and its trigger resumed three times (attempts 2-4, all begun by try 1)
    assert resumes_left(budget_of(operator(max_resumes), 1, max_tries=10), 1, 1, 1, 1) == expected


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2)])
def test_a_clear_gives_a_fresh_budget(max_resumes, expected):
    # 4 attempts in tries 1-3; Clear sets max_tries = 3 + retries, and its try 4 began attempt 5
    assert resumes_left(budget_of(operator(max_resumes), 4, max_tries=3 + 10), 1, 1, 2, 3, 4) == expected


def test_the_operator_hands_both_budgets_and_where_they_count_from():
    op = operator(2, retries=3)
    op.unconfirmed_fault_retries = 1
    assert op.resume_budget(SimpleNamespace(max_tries=7)) == {
        "first_try": 5,
        "max_resumes": 2,
        "unconfirmed_fault_retries": 1,
    }
