"""An Airflow hook that hands the checkpoint core a boto3 S3 client built from an ``aws`` connection."""

from __future__ import annotations

from airflow.providers.amazon.aws.hooks.s3 import S3Hook

from trainops.checkpoints.store import CheckpointStore
from trainops.errors import PermanentError


class CheckpointStoreHook(S3Hook):
    """``S3Hook`` (credentials, region, ``endpoint_url`` from the connection extra) plus ``get_store()``."""

    hook_name = "trainops checkpoint store"

    def get_store(self) -> CheckpointStore:
        try:
            return CheckpointStore(self.get_conn())
        except ValueError as error:  # botocore: an endpoint_url that is not a URL, a bad region
            raise PermanentError(
                f"connection {self.aws_conn_id!r} cannot make an S3 client ({error}); fix its extra "
                "(endpoint_url like http://host:9000, region_name)"
            ) from None
