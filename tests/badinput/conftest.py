"""One small devcluster and one bucket for the whole bad-input suite: every case checks that it wrote
nothing to either, so they can be shared."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="module")
def cluster(s3_server):
    from trainops_devcluster import airflow_home
    from trainops_devcluster.cluster import DevCluster

    with pytest.MonkeyPatch.context() as patch, DevCluster(nodes=4, gpus_per_node=8) as running:
        running.wait_until_settled()
        for key, value in s3_server.env().items():
            patch.setenv(key, value)
        patch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection_uri())
        patch.setenv("KUBECONFIG", str(running.kubeconfig))
        patch.setenv(
            "AIRFLOW_CONN_KUBERNETES_DEFAULT", airflow_home.kubernetes_connection(running.kubeconfig)
        )
        yield running


@pytest.fixture(scope="module")
def shared_bucket(s3_server, cluster) -> str:
    return s3_server.create_bucket(f"badinput-{uuid.uuid4().hex[:12]}")
