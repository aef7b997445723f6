"""Kept for test modules: the local S3 server lives in the package (the demo uses it too)."""

from trainops_devcluster.local_s3 import LocalS3, free_port, local_s3

__all__ = ["LocalS3", "free_port", "local_s3"]
