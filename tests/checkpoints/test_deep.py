"""Deep verification streams the bytes and recomputes the ETag and S3 checksums."""

from __future__ import annotations

import os

import boto3
import pytest
from botocore.config import Config

from tests.checkpoints.builders import dcp_size, prefix_of, put, write_dcp
from trainops.checkpoints.helper import commit
from trainops.checkpoints.store import CheckpointStore
from trainops.checkpoints.verify import verify_checkpoint


def test_intact_checkpoint_verifies_deep(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    commit(f"{run}step-100/")
    result = verify_checkpoint(f"{run}step-100/", level="deep")
    assert result.ok, result.reasons
    assert result.level == "deep"


def test_multipart_object_etag_is_recomputed(client, bucket, run):
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    key = prefix + "optimizer.bin"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for number, body in enumerate([os.urandom(5 << 20), os.urandom(1000)], start=1):
        etag = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=number, Body=body
        )["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )
    assert client.head_object(Bucket=bucket, Key=key)["ETag"].endswith('-2"')

    result = verify_checkpoint(f"{run}step-100/", level="deep")

    assert result.ok, result.reasons


@pytest.mark.parametrize("botocore_validates", [True, False], ids=["botocore-validates", "trainops-hashes"])
def test_bytes_not_matching_the_stored_checksum_fail_deep_only(client, bucket, run, botocore_validates):
    """S3 would reject this upload (BadDigest); moto stores the checksum it is given, which stands in
    for bytes corrupted at rest: only streaming the bytes can tell.  Caught whether or not botocore
    validates response checksums itself."""
    validation = "when_supported" if botocore_validates else "when_required"
    store = CheckpointStore(boto3.client("s3", config=Config(response_checksum_validation=validation)))
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    client.put_object(
        Bucket=bucket,
        Key=prefix + "__0_0.distcp",
        Body=os.urandom(dcp_size("__0_0.distcp")),
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256="AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    )
    assert verify_checkpoint(f"{run}step-100/", level="metadata").ok

    result = verify_checkpoint(f"{run}step-100/", level="deep", store=store)

    assert not result.ok
    assert any(reason.startswith("__0_0.distcp: ") and "corrupt" in reason for reason in result.reasons), (
        result.reasons
    )


def test_deep_does_not_hash_a_checkpoint_that_failed_metadata(client, bucket, run):
    prefix = prefix_of(run) + "step-100/"
    write_dcp(client, bucket, prefix)
    put(client, bucket, prefix + "__0_0.distcp", b"short")
    result = verify_checkpoint(f"{run}step-100/", level="deep")
    assert not result.ok and any("truncated" in reason for reason in result.reasons)
