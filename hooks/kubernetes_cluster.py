"""The one Airflow way to reach the cluster: ``KubernetesClusterHook``, from a ``kubernetes`` connection.

The cncf provider's ``KubernetesHook`` reads the connection (kubeconfig path or content,
in-cluster, context; ``config_file`` overrides the path).  ``kube()`` hands the Airflow-free core
its facade (``trainops.kube.client.Kube``) with ``settings()``: the API deadlines, backoff, paging and
watching of ``trainops.kube.settings.KubeSettings``, from ``[trainops]`` in airflow.cfg and from the
connection's extra (same keys, which win).  ``async_client()`` is the same connection for
``kubernetes_asyncio`` (the watches of a deferred task).  Every trainops operator, sensor and trigger
gets its clients here.
"""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

from trainops.kube.client import Kube, KubeconfigError
from trainops.kube.settings import KubeSettings


class KubernetesClusterHook(KubernetesHook):
    """``KubernetesHook`` plus ``kube()`` (sync) and ``async_client()`` (async) for the trainops core."""

    def settings(self) -> KubeSettings:
        """``KubeSettings`` from ``[trainops]`` and this connection's extra (which wins)."""
        from airflow.configuration import conf

        section = conf.getsection("trainops") or {}
        return KubeSettings.from_options(
            ("[trainops]", section), (f"connection {self.conn_id!r} extra", self.conn_extras)
        )

    def kube(self) -> Kube:
        """The facade on this connection's ApiClient, under ``settings()``."""
        from airflow.exceptions import AirflowNotFoundException

        settings = self.settings()  # a bad value is a ValueError naming the key and where it is set
        try:
            return Kube(self.api_client, settings)
        except AirflowNotFoundException:
            raise
        except Exception as error:  # the client raises TypeError, YAMLError... on a bad kubeconfig
            raise KubeconfigError(
                f"connection {self.conn_id!r}: its kubeconfig cannot be used ({type(error).__name__}: "
                f"{str(error)[:300]}); fix the connection's kube_config or kube_config_path extra"
            ) from None

    def async_client(self):
        """An async context manager yielding a ``kubernetes_asyncio`` ApiClient on this connection."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(
            conn_id=self.conn_id,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
            in_cluster=self.in_cluster,
        ).get_conn()
