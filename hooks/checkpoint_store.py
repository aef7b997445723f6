"""An Airflow hook that hands the checkpoint core a boto3 S3 client built from an ``aws`` connection."""

from __future__ import annotations

from airflow.providers.amazon.aws.hooks.s3 import S3Hook

from trainops.checkpoints.store import CheckpointStore


class CheckpointStoreHook(S3Hook):
    """``S3Hook`` (credentials, region, ``endpoint_url`` from the connection extra) plus ``get_store()``."""

    hook_name = "trainops checkpoint store"

    def get_store(self) -> CheckpointStore:
        return CheckpointStore(self.get_conn())
