"""The cluster API clients trainops needs, from an Airflow ``kubernetes`` connection.

The cncf provider's ``KubernetesHook`` reads the connection (kubeconfig path or content,
in-cluster, context); it has no node or cluster-scoped custom-object calls, so trainops uses its
official clients (``core_v1_client``, ``custom_object_client``) through the Airflow-free core.
"""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

from trainops.capacity.procedure import Apis


class KubernetesClusterHook(KubernetesHook):
    """``KubernetesHook`` plus ``apis()``: the clients the capacity claim and return use."""

    def apis(self) -> Apis:
        return Apis(core=self.core_v1_client, custom=self.custom_object_client)
