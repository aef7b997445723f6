"""``s3://bucket/prefix`` URIs for checkpoints and run paths, always in directory form."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class S3Uri:
    """A bucket and a key prefix; ``prefix`` is ``""`` (bucket root) or ends with ``/``."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str, *, field: str = "uri") -> S3Uri:
        """Parse ``s3://bucket/some/prefix``; ``field`` names the argument in the error message."""
        example = "s3://my-bucket/runs/my-run/"
        if not isinstance(uri, str) or not uri.startswith("s3://"):
            raise ValueError(f"{field} must be an s3:// URI such as {example!r}, got {uri!r}")
        bucket, _, path = uri[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"{field} has no bucket: {uri!r}; write it as {example!r}")
        path = path.strip("/")
        if path and any(part in ("", ".", "..") for part in path.split("/")):
            raise ValueError(f"{field} has an empty, '.' or '..' path segment: {uri!r}")
        return cls(bucket, f"{path}/" if path else "")

    @property
    def name(self) -> str:
        """The last path segment (``step-100`` for ``s3://b/run/step-100/``)."""
        return self.prefix.rstrip("/").rpartition("/")[2]

    @property
    def parent(self) -> S3Uri:
        head = self.prefix.rstrip("/").rpartition("/")[0]
        return S3Uri(self.bucket, f"{head}/" if head else "")

    def child(self, name: str) -> S3Uri:
        return S3Uri(self.bucket, f"{self.prefix}{name.strip('/')}/")

    def key(self, name: str) -> str:
        """The object key of ``name`` directly under this prefix."""
        return self.prefix + name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"
