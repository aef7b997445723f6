"""S3 access for checkpoints over boto3: paginated listing, bounded reads, streaming, conditional writes.

The endpoint comes from ``endpoint_url`` or boto3's standard environment (``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL``), so the same code talks to AWS, MinIO or a local moto server.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainops.checkpoints.uri import S3Uri
from trainops.errors import PermanentError
from trainops.kube.retry import Deadline, call

CHUNK_SIZE = 1 << 20
CONFLICT_DEADLINE_S = 30.0
MAX_DIR_ENTRIES = 100_000  # entries right under one run path; training pods write there, so it is bounded


class ObjectTooLarge(PermanentError, ValueError):
    """A metadata object is larger than the verifier is willing to hold in memory."""


class TooManyEntries(PermanentError, ValueError):
    """A directory holds more entries than a listing is willing to hold in memory."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as the listing reports it; ``etag`` has its quotes stripped."""

    key: str
    size: int
    etag: str
    last_modified: datetime


def _error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")


class CheckpointStore:
    """The S3 operations checkpoint verification and commit need, on one boto3 client."""

    def __init__(self, client: Any | None = None, *, endpoint_url: str | None = None) -> None:
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint_url)
        self.client = client

    def list(self, uri: S3Uri) -> Iterator[ObjectInfo]:
        """Every object under ``uri``, recursively, one listing page (up to 1,000 keys) at a time."""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"], item["Size"], item["ETag"].strip('"'), item["LastModified"])

    def list_dir(self, uri: S3Uri, *, limit: int = MAX_DIR_ENTRIES) -> tuple[list[str], list[ObjectInfo]]:
        """The immediate sub-directory names and the objects directly under ``uri``; raises
        ``TooManyEntries`` past ``limit`` of them together."""
        paginator = self.client.get_paginator("list_objects_v2")
        names: list[str] = []
        objects: list[ObjectInfo] = []
        for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.prefix, Delimiter="/"):
            names += [p["Prefix"][len(uri.prefix) :].rstrip("/") for p in page.get("CommonPrefixes", ())]
            objects += [
                ObjectInfo(item["Key"], item["Size"], item["ETag"].strip('"'), item["LastModified"])
                for item in page.get("Contents", ())
            ]
            if len(names) + len(objects) > limit:
                raise TooManyEntries(
                    f"{uri} holds more than {limit} entries: delete old checkpoints there, "
                    "or give the run a fresh run path"
                )
        return names, objects

    def exists(self, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=bucket, Key=key)
        except ClientError as error:
            if _error_code(error) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def read(self, bucket: str, key: str, *, limit: int) -> bytes | None:
        """The whole object, or None when it does not exist; refuses objects over ``limit`` bytes."""
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        body = response["Body"]
        try:
            if response["ContentLength"] > limit:
                raise ObjectTooLarge(
                    f"s3://{bucket}/{key} is {response['ContentLength']} bytes, over the {limit}-byte limit"
                )
            return body.read()
        finally:
            body.close()

    def read_range(self, bucket: str, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer when the object is shorter)."""
        body = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")[
            "Body"
        ]
        try:
            return body.read()
        finally:
            body.close()

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks of about 1 MiB, never the whole object in memory."""
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            yield from body.iter_chunks(CHUNK_SIZE)
        finally:
            body.close()

    def head(self, bucket: str, key: str, *, part_number: int | None = None) -> dict[str, Any]:
        """HeadObject with checksum mode on (returns ``Checksum*`` values when the object has them)."""
        extra = {"PartNumber": part_number} if part_number else {}
        return self.client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED", **extra)

    def put(self, bucket: str, key: str, body: bytes, *, content_type: str = "application/json") -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)

    def put_if_absent(
        self, bucket: str, key: str, body: bytes, *, deadline_s: float = CONFLICT_DEADLINE_S
    ) -> bool:
        """Create ``key`` only if it does not exist (``If-None-Match: *``).

        Returns True when this call created it, False when it already existed (412).  A 409 (a
        concurrent conditional write in flight) is retried under the retry policy until
        ``deadline_s``; the retry then sees 412 or succeeds.
        """
        from botocore.exceptions import ClientError

        try:
            call(
                lambda: self.client.put_object(
                    Bucket=bucket, Key=key, Body=body, IfNoneMatch="*", ContentType="application/json"
                ),
                Deadline(deadline_s),
                f"conditional write of s3://{bucket}/{key}",
                transient=lambda error: _error_code(error) == "ConditionalRequestConflict",
            )
        except ClientError as error:
            if _error_code(error) == "PreconditionFailed":
                return False
            raise
        return True

    def unfinished_uploads(self, uri: S3Uri) -> set[str]:
        """Keys under ``uri`` with a multipart upload that was started and never completed."""
        paginator = self.client.get_paginator("list_multipart_uploads")
        return {
            upload["Key"]
            for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.prefix)
            for upload in page.get("Uploads", ())
        }
