"""A run without a name gets one derived from its DAG run: readable, a DNS-1123 label, unique per DAG run;
a malformed run path names the field to fix."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from trainops.training.naming import DNS_1123_LABEL, derived_run_name, run_path

WHEN = datetime(2026, 5, 1, 12, 30, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    "dag_id, run_id, expected",
    [
        (
            "training_lifecycle",
            "manual__2026-05-01T12:30:05+00:00",
            r"training-lifecycle-20260501-123005-[0-9a-f]{6}",
        ),
        ("x" * 80, "manual__1", r"x{40}-20260501-123005-[0-9a-f]{6}"),
        ("__", "api run", r"run-20260501-123005-[0-9a-f]{6}"),
    ],
    ids=["readable", "long-dag-id-cut-to-fit", "nothing-readable"],
)
def test_a_derived_run_name_is_a_readable_dns_label(dag_id, run_id, expected):
    name = derived_run_name(dag_id, run_id, WHEN)
    assert re.fullmatch(expected, name) and DNS_1123_LABEL.match(name) and len(name) <= 63
    assert run_path("s3://b/runs", name) == f"s3://b/runs/{name}/"


def test_derived_run_names_differ_per_dag_run_and_stay_the_same_for_one():
    """Two runs triggered in the same second differ; a retry of one run derives its name again alike."""
    names = {derived_run_name("training_lifecycle", f"manual__{n}", WHEN) for n in range(1000)}
    assert len(names) == 1000
    assert derived_run_name("d", "r", WHEN) == derived_run_name("d", "r", WHEN)


@pytest.mark.parametrize(
    "checkpoint_uri, run_name, field",
    [
        ("s3://b/runs/", "My_Run", "run_name"),
        ("s3://b/runs/", "", "run_name"),
        ("/tmp/runs", "a", "checkpoint_uri"),
    ],
)
def test_a_malformed_run_path_names_the_field(checkpoint_uri, run_name, field):
    with pytest.raises(ValueError, match=field):
        run_path(checkpoint_uri, run_name)
