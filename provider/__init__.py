"""Airflow provider metadata, read through the ``apache_airflow_provider`` entry point."""

from trainops import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-trainops",
        "name": "trainops",
        "description": "GPU training lifecycle on Kubernetes: health gate, taint flip, Kueue gang run, "
        "verified checkpoints in S3, crash-triggered resume, return of inference capacity.",
        "versions": [__version__],
    }
