"""A run path belongs to one DAG run: a second run with the same run_name is refused, its own retries are not
(the run's name and path themselves: tests/training/test_naming.py)."""

from __future__ import annotations

import json

import boto3
import pytest

from trainops.checkpoints.owner import OWNER_FILE, RunPathTaken, claim_run_path
from trainops.checkpoints.store import CheckpointStore


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
