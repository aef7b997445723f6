"""A real local S3 server (moto's server mode) on a free loopback port, for tests, benchmarks and the demo.

moto is a test/demo extra (`pip install airflow-provider-trainops[test]`); it is imported only here.
Its request log (werkzeug's) goes to a file, never to the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "trainops-test"
SECRET_KEY = "trainops-test-secret"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LocalS3:
    endpoint_url: str

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def airflow_connection_uri(self) -> str:
        """The Airflow connection as JSON, for ``AIRFLOW_CONN_<ID>``."""
        import json

        return json.dumps(
            {
                "conn_type": "aws",
                "login": ACCESS_KEY,
                "password": SECRET_KEY,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": REGION},
            }
        )

    def env(self) -> dict[str, str]:
        """Environment that points boto3 (and the training-side helper) at this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }


@contextlib.contextmanager
def local_s3(log_file: Path | None = None) -> Iterator[LocalS3]:
    """Run the server; its request log is appended to ``log_file`` (default: ``local-s3.log`` in the
    temporary directory)."""
    from moto.server import ThreadedMotoServer

    requests_log = logging.getLogger("werkzeug")  # moto serves through werkzeug, which logs each request
    handler = logging.FileHandler(log_file or Path(tempfile.gettempdir()) / "local-s3.log")
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.INFO)
    requests_log.propagate = False
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield LocalS3(f"http://127.0.0.1:{port}")
    finally:
        server.stop()
        requests_log.removeHandler(handler)
        handler.close()
