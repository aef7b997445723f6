"""``trainops checkpoints verify|latest``: exit 0 when verified, 1 when not, reasons printed."""

from __future__ import annotations

import json

import pytest

from tests.checkpoints.builders import prefix_of, write_dcp
from trainops.cli import main


@pytest.fixture
def run_with_good_and_partial(client, bucket, run) -> str:
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-200/.metadata")
    return run


def test_verify_exits_0_for_a_good_checkpoint(run_with_good_and_partial, capsys):
    assert main(["checkpoints", "verify", f"{run_with_good_and_partial}step-100/"]) == 0
    assert "verified at metadata level" in capsys.readouterr().out


def test_verify_exits_1_with_reasons_for_a_partial_one(run_with_good_and_partial, capsys):
    assert (
        main(["checkpoints", "verify", f"{run_with_good_and_partial}step-200/", "--level", "structural"]) == 1
    )
    out = capsys.readouterr().out
    assert "NOT verified" in out and ".metadata is missing" in out


def test_verify_json(run_with_good_and_partial, capsys):
    assert main(["checkpoints", "verify", f"{run_with_good_and_partial}step-200/", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert (result["ok"], result["step"], result["format"], result["files"]) == (False, 200, "torchtitan", 2)


def test_latest_json_names_the_good_one_and_the_skipped_one(run_with_good_and_partial, capsys):
    assert main(["checkpoints", "latest", run_with_good_and_partial, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["checkpoint"]["uri"] == f"{run_with_good_and_partial}step-100/"
    assert [s["uri"] for s in result["skipped"]] == [f"{run_with_good_and_partial}step-200/"]


def test_latest_exits_1_when_nothing_verifies(s3, bucket, capsys):
    assert main(["checkpoints", "latest", f"s3://{bucket}/runs/none/"]) == 1
    assert "no verified checkpoint" in capsys.readouterr().out


def test_bad_level_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["checkpoints", "verify", "s3://b/x/", "--level", "shallow"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'shallow'" in capsys.readouterr().err


def test_uri_without_a_bucket_exits_2_naming_the_field(capsys):
    assert main(["checkpoints", "latest", "s3:///runs/demo/"]) == 2
    assert "run_uri has no bucket" in capsys.readouterr().err
