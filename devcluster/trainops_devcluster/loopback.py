"""How local-process pods reach each other by cluster DNS names — the devcluster's concession.

Every process-runtime pod runs on this machine, so a cluster name resolves to ``127.0.0.1``, and
pods that would each bind the same port on their own IP get distinct ports instead.  Nothing in a
process can resolve ``*.svc`` names, so the kubelet rewrites them in the environment it starts
the process with: the value of a variable named ``*_ADDR``, ``*_ADDRESS``, ``*_HOST`` or
``*_ENDPOINT`` that is a name served by a Service in the pod's namespace (``<svc>``,
``<svc>.<ns>``, ``<svc>.<ns>.svc[.cluster.local]``, and ``<hostname>.<svc>...`` for a pod with
that hostname and subdomain when the Service is headless) becomes ``127.0.0.1``; its port (``host:port`` in the value, or the
matching ``*_PORT`` variable: ``MASTER_ADDR`` -> ``MASTER_PORT``) becomes a free local port,
one per Service and port, the same for every pod of that Service.  Other names are left as
they are and fail to resolve, as they would on a cluster.

A pod's own ports are local ports too: each ``containerPort`` a process container declares gets a
free local port, handed to the process as ``DEVCLUSTER_PORT_<containerPort>`` (its server binds
that).  A ClusterIP Service's local port is where ``proxy.ServiceProxy`` listens and balances over
the Service's Ready endpoints, as kube-proxy does.
"""

from __future__ import annotations

import re
import socket
import threading

from trainops_devcluster.endpointslices import selects
from trainops_devcluster.store import Store

LOOPBACK = "127.0.0.1"
CLUSTER_DOMAIN = "cluster.local"
ADDRESS_SUFFIXES = ("_ADDR", "_ADDRESS", "_HOST", "_ENDPOINT")
_HOST_PORT = re.compile(r"^(?P<host>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(:(?P<port>[0-9]{1,5}))?$")


class Loopback:
    """Cluster DNS names and ports for the process runtime (safe from any thread)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ports: dict[tuple[str, int], int] = {}
        self._pod_ports: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def service_for(self, name: str, namespace: str) -> dict | None:
        """The Service through which ``name`` resolves for a pod in ``namespace``, or None."""
        labels = name.lower().rstrip(".").split(".")
        if labels[-3:] == ["svc", *CLUSTER_DOMAIN.split(".")]:
            labels = labels[:-2]
        if labels[-1] == "svc":
            if len(labels) not in (3, 4):
                return None
            namespace, labels = labels[-2], labels[:-2]
        elif len(labels) == 3 or (len(labels) == 2 and self._service(labels[1], namespace) is None):
            namespace, labels = labels[-1], labels[:-1]  # <svc>.<ns> or <host>.<svc>.<ns>
        if len(labels) not in (1, 2):
            return None
        service = self._service(labels[-1], namespace)
        if service is None or len(labels) == 1:
            return service
        if (service.get("spec") or {}).get("clusterIP") != "None":
            return None  # cluster DNS has per-pod records only under a headless Service
        host = labels[0]
        pods, _ = self.store.list("pods", namespace)
        named = any(
            (p.get("spec") or {}).get("hostname") == host
            and (p.get("spec") or {}).get("subdomain") == labels[1]
            and selects(service, p)
            for p in pods
        )
        return service if named else None

    def _service(self, name: str, namespace: str) -> dict | None:
        return self.store.find("services", namespace, name)

    def port(self, service: dict, port: int) -> int:
        """The local port standing for ``port`` of ``service`` (allocated on first use)."""
        with self._lock:
            return _allocate(self._ports, (service["metadata"]["uid"], port))

    def pod_port(self, uid: str, container_port: int) -> int:
        """The local port the pod with ``uid`` binds for ``container_port`` (allocated on first use)."""
        with self._lock:
            return _allocate(self._pod_ports, (uid, container_port))

    def pod_port_of(self, uid: str, container_port: int) -> int | None:
        """The local port of a pod's ``container_port``; None when its process was given none."""
        with self._lock:
            return self._pod_ports.get((uid, container_port))

    def forget_pod(self, uid: str) -> None:
        with self._lock:
            for key in [k for k in self._pod_ports if k[0] == uid]:
                del self._pod_ports[key]

    def rewrite(self, env: dict[str, str], namespace: str) -> dict[str, str]:
        """``env`` with cluster names of address variables resolved as described above."""
        out = dict(env)
        for variable, value in env.items():
            suffix = next((s for s in ADDRESS_SUFFIXES if variable.endswith(s)), None)
            match = _HOST_PORT.match(value or "") if suffix else None
            service = match and self.service_for(match["host"], namespace)
            if not service:
                continue
            if match["port"]:
                out[variable] = f"{LOOPBACK}:{self.port(service, int(match['port']))}"
                continue
            out[variable] = LOOPBACK
            port_variable = variable[: -len(suffix)] + "_PORT"
            if (env.get(port_variable) or "").isdigit():
                out[port_variable] = str(self.port(service, int(env[port_variable])))
        return out


def _allocate(ports: dict, key: tuple) -> int:
    if key not in ports:
        with socket.socket() as probe:  # a port free now; its server binds it moments later
            probe.bind((LOOPBACK, 0))
            ports[key] = probe.getsockname()[1]
    return ports[key]
