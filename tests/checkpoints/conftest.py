"""Fixtures for checkpoint tests: a boto3 client and a run path in a fresh bucket."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(s3):
    return s3.client()


@pytest.fixture
def run(bucket) -> str:
    """The run path ``s3://<bucket>/runs/demo/``."""
    return f"s3://{bucket}/runs/demo/"
