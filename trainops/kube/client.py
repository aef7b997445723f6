"""How trainops gets its Kubernetes clients: ``Kube``, the official sync clients on one ApiClient.

Everything that talks to the API server synchronously takes a ``Kube``: the capacity claim and
return, the health gate and quarantine, the training run's Job calls.  Make one from a kubeconfig
(the CLI: ``Kube.from_kubeconfig(path)``), or from an ApiClient you already have
(``Kube(api_client)``; Airflow: ``KubernetesClusterHook(conn_id).kube()``).  The async side (the
watches of a deferred task) is ``trainops.kube.aio``.
"""

from __future__ import annotations

import json
import os

from trainops.errors import PermanentError

MERGE_PATCH = "application/merge-patch+json"


class KubeconfigError(PermanentError, ValueError):
    """The kubeconfig is missing, not YAML, or not shaped like a kubeconfig."""


def api_message(error: BaseException) -> str:
    """What the API server said in its Status (which PDB, RBAC rule or admission policy refused),
    else the HTTP status, else the error itself (a connection error)."""
    try:
        return json.loads(error.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        status = getattr(error, "status", None)
        return f"HTTP {status}" if status else str(error)


class Kube:
    """``core``, ``batch`` and ``custom`` (``CoreV1Api``, ``BatchV1Api``, ``CustomObjectsApi``) on ``api_client``."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, *, context: str | None = None) -> Kube:
        """From ``kubeconfig``; without one, in-cluster when running in a pod, else ``$KUBECONFIG`` or
        ``~/.kube/config``."""
        from kubernetes import client, config

        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return cls(client.ApiClient(configuration))
        try:
            return cls(config.new_client_from_config(config_file=kubeconfig, context=context))
        except Exception as error:  # the client raises TypeError, KeyError, YAMLError... on a bad file
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise KubeconfigError(
                f"kubeconfig {where} cannot be used ({type(error).__name__}: {str(error)[:300]}); "
                "fix the file or pass another with --kubeconfig or $KUBECONFIG"
            ) from None
