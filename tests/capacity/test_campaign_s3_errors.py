"""The campaign's ``s3-errors`` fault always lands: armed, it fails the next requests of each S3
operation (whatever the run's first requests are), which the client's retries absorb."""

from __future__ import annotations

from benchmarks.campaign.faults import S3Errors
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.uri import S3Uri


def test_an_armed_fault_fails_the_next_two_requests_of_each_operation_and_the_reads_still_succeed(bucket):
    store = CheckpointStore()
    errors = S3Errors(store.client)
    run = S3Uri.parse(f"s3://{bucket}/runs/r/", field="run_uri")
    store.put_if_absent(bucket, "runs/r/owner.json", b"{}")  # before arming: not failed
    assert errors.injected == 0

    errors.arm(2)
    assert store.read(bucket, "runs/r/owner.json", limit=10) == b"{}"  # 2 x 503, then the retry
    assert [o.key for o in store.list(run)] == ["runs/r/owner.json"]  # its own 2 x 503
    assert store.read(bucket, "runs/r/owner.json", limit=10) == b"{}"  # GetObject's two are spent
    assert errors.injected == 4

    errors.disarm()
    store.list(run)
    errors.arm(1)  # a fresh burst for the next run
    assert [o.key for o in store.list(run)] == ["runs/r/owner.json"]
    assert errors.injected == 1
