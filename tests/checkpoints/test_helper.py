"""The training-side helper: commit once, heartbeat, resume_from."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from tests.checkpoints.builders import prefix_of, put, write_dcp
from trainops.checkpoints.helper import CommitConflict, commit, heartbeat, resume_from
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.verify import verify_checkpoint


def versions(client, bucket: str, key: str) -> list[dict]:
    return [
        v
        for v in client.list_object_versions(Bucket=bucket, Prefix=key).get("Versions", [])
        if v["Key"] == key
    ]


def test_commit_writes_manifest_then_committed(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    result = commit(f"{run}step-100/")
    assert result.written and (result.files, result.bytes) > (0, 0)
    manifest = json.loads(
        client.get_object(Bucket=bucket, Key=prefix_of(run) + "step-100/trainops-manifest.json")[
            "Body"
        ].read()
    )
    assert manifest["step"] == 100
    assert sorted(f["key"] for f in manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert all(f["size"] > 0 and len(f["etag"]) == 32 for f in manifest["files"])
    committed = json.loads(
        client.get_object(Bucket=bucket, Key=prefix_of(run) + "step-100/_COMMITTED")["Body"].read()
    )
    assert committed["manifest_sha256"] == result.manifest_sha256
    assert verify_checkpoint(f"{run}step-100/").ok


def test_retried_commit_is_a_no_op(client, bucket, run):
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    first, second = commit(f"{run}step-100/"), commit(f"{run}step-100/")
    assert (first.written, second.written) == (True, False)
    assert first.manifest_sha256 == second.manifest_sha256
    assert len(versions(client, bucket, prefix_of(run) + "step-100/_COMMITTED")) == 1


def test_two_concurrent_commits_write_committed_once_and_both_succeed(client, bucket, run):
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    start = threading.Barrier(2)
    results, errors = [], []

    def commit_after_barrier():
        start.wait()
        try:
            results.append(commit(f"{run}step-100/"))
        except Exception as error:  # recorded, asserted below
            errors.append(error)

    threads = [threading.Thread(target=commit_after_barrier) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(result.written for result in results) == [False, True]
    assert len(versions(client, bucket, prefix_of(run) + "step-100/_COMMITTED")) == 1
    assert verify_checkpoint(f"{run}step-100/").ok


def test_commit_of_changed_files_after_a_lost_race_raises(client, bucket, run):
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    commit(f"{run}step-100/")
    committed = client.get_object(Bucket=bucket, Key=prefix + "_COMMITTED")["Body"].read()
    client.delete_object(Bucket=bucket, Key=prefix + "_COMMITTED")
    put(client, bucket, prefix + "__0_0.distcp", b"changed")

    class OtherWriterWinsStore(CheckpointStore):
        """Another commit (of the old files) finishes between our listing and our manifest."""

        def put_if_absent(self, bucket_name, key, body, **kwargs):
            if key.endswith("trainops-manifest.json"):
                self.client.put_object(Bucket=bucket_name, Key=prefix + "_COMMITTED", Body=committed)
            return super().put_if_absent(bucket_name, key, body, **kwargs)

    with pytest.raises(CommitConflict, match="changed after it was committed"):
        commit(f"{run}step-100/", store=OtherWriterWinsStore())


def test_a_late_committer_with_another_listing_cannot_unverify_the_commit(client, bucket, run):
    """Issue 15: a second committer that listed a late file overwrote the committed manifest, and the
    checkpoint failed verification from then on."""
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    put(client, bucket, prefix + "late.tmp", b"a temp file the framework removes")
    listed, go = threading.Event(), threading.Event()
    errors = []

    class ListsThenWaits(CheckpointStore):
        def list(self, uri):
            found = list(super().list(uri))
            listed.set()
            go.wait()
            return iter(found)

    def late_committer():
        try:
            commit(f"{run}step-100/", store=ListsThenWaits())
        except CommitConflict as error:
            errors.append(error)

    late = threading.Thread(target=late_committer)
    late.start()
    listed.wait()
    client.delete_object(Bucket=bucket, Key=prefix + "late.tmp")
    assert commit(f"{run}step-100/").written
    go.set()
    late.join()

    assert len(errors) == 1 and "changed after it was committed" in str(errors[0])
    assert verify_checkpoint(f"{run}step-100/").ok


def test_a_stale_manifest_of_other_files_is_not_overwritten(client, bucket, run):
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    put(client, bucket, prefix + "trainops-manifest.json", b'{"files": []}')
    with pytest.raises(CommitConflict, match="delete runs/demo/step-100/trainops-manifest.json"):
        commit(f"{run}step-100/")
    stored = client.get_object(Bucket=bucket, Key=prefix + "trainops-manifest.json")["Body"].read()
    assert stored == b'{"files": []}'


def test_commit_of_an_empty_prefix_is_refused(s3, bucket, run):
    with pytest.raises(ValueError, match="holds no files"):
        commit(f"{run}step-100/")
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket)


def test_heartbeat_writes_step_time_ranks_and_saving(client, bucket, run, monkeypatch):
    monkeypatch.setenv("TRAINOPS_RUN_URI", run)
    heartbeat(42, ranks=16, saving=True, phase="checkpoint")
    body = json.loads(client.get_object(Bucket=bucket, Key=prefix_of(run) + "heartbeat.json")["Body"].read())
    assert (body["step"], body["ranks"], body["saving"], body["phase"]) == (42, 16, True, "checkpoint")
    assert body["time"] > 0 and body["time_iso"].endswith("+00:00")


def test_each_heartbeat_after_a_save_says_how_long_the_newest_save_took(client, bucket, run, monkeypatch):
    monkeypatch.setenv("TRAINOPS_RUN_URI", run)
    began = heartbeat(40, saving=True, phase="checkpoint")
    heartbeat(40, saving=True, phase="checkpoint")  # still saving: the save began at the first
    after = heartbeat(40)
    later = heartbeat(45)
    second = heartbeat(60, saving=True, phase="checkpoint")
    after_second = heartbeat(60)

    assert after["last_save_s"] == pytest.approx(after["time"] - began["time"], abs=0.002)
    assert "last_save_s" not in began and "last_save_s" not in second
    assert later["last_save_s"] == after["last_save_s"]  # what the run view reads between saves
    assert after_second["last_save_s"] == pytest.approx(after_second["time"] - second["time"], abs=0.002)


def test_heartbeat_without_a_run_uri_names_the_variable(s3, monkeypatch):
    monkeypatch.delenv("TRAINOPS_RUN_URI", raising=False)
    with pytest.raises(ValueError, match="TRAINOPS_RUN_URI is not set"):
        heartbeat(1)


def test_resume_from_takes_the_orchestrators_choice_when_the_run_has_nothing_newer(
    client, bucket, run, monkeypatch
):
    monkeypatch.setenv("TRAINOPS_RUN_URI", run)
    monkeypatch.setenv("TRAINOPS_RESUME_FROM", f"{run}step-200/")
    for step in (100, 200):
        write_dcp(client, bucket, prefix_of(run) + f"step-{step}/")
        commit(f"{run}step-{step}/")
    assert resume_from() == f"{run}step-200/"


def test_resume_from_after_an_in_place_restart_takes_the_newer_verified_checkpoint(
    client, bucket, run, monkeypatch
):
    """A pod re-admitted after a preemption keeps its env, which names the attempt's first checkpoint."""
    monkeypatch.setenv("TRAINOPS_RUN_URI", run)
    monkeypatch.setenv("TRAINOPS_RESUME_FROM", f"{run}step-100/")
    for step in (100, 200, 300):
        write_dcp(client, bucket, prefix_of(run) + f"step-{step}/")
        commit(f"{run}step-{step}/")
    assert resume_from() == f"{run}step-300/"


def test_resume_from_finds_the_latest_verified_checkpoint(client, bucket, run, monkeypatch):
    monkeypatch.setenv("TRAINOPS_RESUME_FROM", "")
    monkeypatch.setenv("TRAINOPS_RUN_URI", run)
    assert resume_from() is None
    for step in (100, 200, 300):
        write_dcp(client, bucket, prefix_of(run) + f"step-{step}/")
        commit(f"{run}step-{step}/")
    client.delete_object(Bucket=bucket, Key=prefix_of(run) + "step-300/_COMMITTED")
    assert resume_from() == f"{run}step-200/"


def test_helper_imports_without_airflow():
    code = (
        "import sys; sys.modules['airflow'] = None\n"
        "import trainops.checkpoints.helper\n"
        "assert not any(m.startswith('airflow') for m in sys.modules if sys.modules[m] is not None)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
