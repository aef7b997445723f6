"""Deep verification: stream every object and recompute what S3 recorded about its bytes.

Per object it recomputes the ETag when that is an MD5 (single-part: MD5 of the bytes;
multipart: MD5 of the part MD5s plus ``-N``, with the part size from ``HeadObject(PartNumber=1)``)
and any full-object SHA-256, SHA-1 or CRC32 additional checksum (``HeadObject`` with
``ChecksumMode=ENABLED``).  CRC32C and CRC64NVME need awscrt and are not recomputed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from concurrent.futures import ThreadPoolExecutor

from trainops.checkpoints.store import CheckpointStore, ObjectInfo
from trainops.checkpoints.uri import S3Uri

WORKERS = 8
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}(?:-(\d+))?$")


class _EtagHasher:
    """Recomputes an S3 ETag: plain MD5 (``part_size`` None) or the multipart MD5-of-MD5s."""

    def __init__(self, part_size: int | None) -> None:
        self.part_size = part_size
        self.part = hashlib.md5(usedforsecurity=False)
        self.part_filled = 0
        self.part_digests: list[bytes] = []

    def update(self, chunk: bytes) -> None:
        if self.part_size is None:
            self.part.update(chunk)
            return
        while chunk:
            take = self.part_size - self.part_filled
            self.part.update(chunk[:take])
            self.part_filled += len(chunk[:take])
            chunk = chunk[take:]
            if self.part_filled == self.part_size:
                self.part_digests.append(self.part.digest())
                self.part, self.part_filled = hashlib.md5(usedforsecurity=False), 0

    def result(self) -> str:
        if self.part_size is None:
            return self.part.hexdigest()
        digests = self.part_digests + ([self.part.digest()] if self.part_filled else [])
        return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, chunk: bytes) -> None:
        self.value = zlib.crc32(chunk, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


class _Base64Checksum:
    """An S3 additional checksum: the digest, base64-encoded."""

    def __init__(self, hasher) -> None:
        self.hasher = hasher

    def update(self, chunk: bytes) -> None:
        self.hasher.update(chunk)

    def result(self) -> str:
        return base64.b64encode(self.hasher.digest()).decode()


_CHECKSUMS = {
    "SHA256": hashlib.sha256,
    "SHA1": lambda: hashlib.sha1(usedforsecurity=False),
    "CRC32": _Crc32,
}


def check_contents(store: CheckpointStore, uri: S3Uri, files: dict[str, ObjectInfo]) -> list[str]:
    """Reasons any object's bytes differ from its recorded size, ETag or checksum."""
    with ThreadPoolExecutor(WORKERS) as pool:
        results = pool.map(lambda item: _check_object(store, uri, *item), sorted(files.items()))
        return [reason for reason in results if reason]


def _check_object(store: CheckpointStore, uri: S3Uri, relative_key: str, info: ObjectInfo) -> str | None:
    head = store.head(uri.bucket, info.key)
    expected: dict[str, tuple[_EtagHasher | _Base64Checksum, str]] = {}
    etag_match = _MD5_ETAG.match(info.etag)
    if etag_match:
        part_size = None
        if etag_match.group(1):
            part_size = store.head(uri.bucket, info.key, part_number=1)["ContentLength"]
        expected["ETag"] = (_EtagHasher(part_size), info.etag)
    for algorithm, factory in _CHECKSUMS.items():
        value = head.get(f"Checksum{algorithm}")
        if value and "-" not in value and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            expected[algorithm] = (_Base64Checksum(factory()), value)
    if not expected:
        return f"{relative_key}: cannot check its bytes (no MD5 ETag and no SHA-256/SHA-1/CRC32 checksum)"
    from botocore.exceptions import FlexibleChecksumError

    size = 0
    try:
        for chunk in store.stream(uri.bucket, info.key):
            size += len(chunk)
            for hasher, _ in expected.values():
                hasher.update(chunk)
    except FlexibleChecksumError as error:  # botocore validates a full-object checksum on GET itself
        return f"{relative_key}: {error}: corrupt"
    if size != info.size:
        return f"{relative_key}: read {size} bytes, the listing says {info.size}"
    for name, (hasher, value) in expected.items():
        if hasher.result() != value:
            return f"{relative_key}: {name} of the bytes is {hasher.result()}, S3 recorded {value}: corrupt"
    return None
