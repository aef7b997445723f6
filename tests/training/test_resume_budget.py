"""The resume budget (``max_resumes``) counts from the run's start or its last Clear, as Airflow counts tries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from trainops.operators.training import GangTrainingOperator


def operator(max_resumes: int | None, retries: int = 10) -> GangTrainingOperator:
    return GangTrainingOperator(
        task_id="train",
        image="img",
        command=["python", "train.py"],
        run_uri="s3://bucket/runs/r/",
        retries=retries,
        max_resumes=max_resumes,
    )


def resumes_allowed(op: GangTrainingOperator, max_tries: int, first_try: int) -> int:
    """How many tries after ``first_try`` Airflow may make before the operator calls the run exhausted."""
    try_number = first_try
    while try_number <= op._last_retry(SimpleNamespace(max_tries=max_tries, try_number=try_number)):
        try_number += 1
    return try_number - first_try


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2), (50, 10)])
def test_a_fresh_run_gets_max_resumes_capped_by_retries(max_resumes, expected):
    assert resumes_allowed(operator(max_resumes), max_tries=10, first_try=1) == expected


@pytest.mark.parametrize("max_resumes, expected", [(None, 10), (0, 0), (2, 2)])
def test_a_clear_gives_a_fresh_budget(max_resumes, expected):
    # the run used 3 tries; Clear sets max_tries = 3 + retries and the next try is number 4
    assert resumes_allowed(operator(max_resumes), max_tries=3 + 10, first_try=4) == expected
