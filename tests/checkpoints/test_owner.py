"""A run path belongs to one DAG run: a second run with the same run_name is refused, its own retries are not;
a run without a name gets one derived from its DAG run."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import boto3
import pytest

from trainops.checkpoints.owner import OWNER_FILE, RunPathTaken, claim_run_path, derived_run_name, run_path
from trainops.checkpoints.store import CheckpointStore
from trainops.training.naming import DNS_1123_LABEL


def keys(bucket: str) -> dict[str, bytes]:
    s3 = boto3.client("s3")
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_the_first_run_owns_the_path_and_its_retries_keep_it(bucket):
    store, uri = CheckpointStore(), f"s3://{bucket}/runs/shared/"
    assert claim_run_path(store, uri, "training_lifecycle/manual__1") is True
    assert claim_run_path(store, uri, "training_lifecycle/manual__1") is False  # a retry or a Clear
    assert json.loads(keys(bucket)[f"runs/shared/{OWNER_FILE}"]) == {"owner": "training_lifecycle/manual__1"}


def test_a_second_run_with_the_same_name_is_refused_and_changes_nothing(bucket):
    store, uri = CheckpointStore(), f"s3://{bucket}/runs/shared/"
    claim_run_path(store, uri, "training_lifecycle/manual__1")
    before = keys(bucket)
    with pytest.raises(
        RunPathTaken,
        match=r"belongs to DAG run 'training_lifecycle/manual__1'.*run_name left empty.*another run_name",
    ):
        claim_run_path(store, uri, "training_lifecycle/manual__2")
    assert keys(bucket) == before


def test_a_garbled_owner_file_is_refused_not_taken_over(bucket):
    boto3.client("s3").put_object(Bucket=bucket, Key=f"runs/x/{OWNER_FILE}", Body=b"[not json")
    with pytest.raises(RunPathTaken, match="belongs to DAG run None"):
        claim_run_path(CheckpointStore(), f"s3://{bucket}/runs/x/", "training_lifecycle/manual__1")


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
