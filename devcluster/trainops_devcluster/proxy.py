"""kube-proxy for the devcluster: every ClusterIP Service port is a loopback port that balances TCP
connections over the Service's Ready endpoints.

Like kube-proxy it follows the EndpointSlices, not the pods: an endpoint that is not ``ready``
(its probe fails, or it is terminating) gets no new connection, and a Service without one
refuses connections (reset at once; kube-proxy's REJECT rule).  New connections go round-robin
over the endpoints in a fixed order (kube-proxy's IPVS mode; its iptables and nftables modes pick
at random), so an endpoint joining or leaving does not send two connections in a row to one pod;
each connection goes to one endpoint for its whole life (L4: a client that keeps one connection
open talks to one pod).  Headless Services get no proxy, as on a
cluster.  An endpoint is reached at the local port its pod's process was given for the target
port (``loopback.Loopback.pod_port``).  The Service's address: ``Loopback.port(service, port)``,
also what the process runtime hands pods for the Service's cluster DNS name.

``lag_s`` (0 unless set, e.g. ``cluster._controllers.proxy.lag_s = 1``): how long the proxy keeps
sending new connections to an endpoint its EndpointSlice no longer lists as ready, as a real
kube-proxy catching up on a busy cluster does: a pod that gets SIGTERM without a ``preStop`` sleep
longer than that is sent connections it no longer accepts.
"""

from __future__ import annotations

import bisect
import logging
import socket
import struct
import threading
import time

from trainops_devcluster.endpointslices import SERVICE_NAME_LABEL, SLICES
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.loopback import LOOPBACK, Loopback
from trainops_devcluster.store import Store

log = logging.getLogger(__name__)
Backend = tuple[str, int]  # (pod uid, target port)
CONNECT_TIMEOUT_S = 5.0


class ServiceProxy(InformerController):
    watches = ("services", SLICES)
    lag_s = 0.0

    def __init__(self, store: Store, loopback: Loopback) -> None:
        super().__init__(store)
        self.loopback = loopback
        self._listeners: dict[tuple[Key, int], Listener] = {}
        self._leaving: dict[tuple[Key, int], dict[Backend, float]] = {}  # backends kept until then

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        if resource == "services":
            self.mark(key_of(obj))
        else:
            name = (obj["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL)
            if name:
                self.mark((obj["metadata"]["namespace"], name))

    def reconcile(self, keys: set[Key]) -> None:
        for key in sorted(keys):
            service = self.cache["services"].get(key)
            spec = (service or {}).get("spec") or {}
            proxied = spec.get("clusterIP") not in (None, "", "None") and spec.get("type") != "ExternalName"
            ports = {p["port"]: p for p in spec.get("ports") or []} if proxied else {}
            for (owner, number), listener in list(self._listeners.items()):
                if owner == key and (number not in ports or listener.uid != service["metadata"]["uid"]):
                    listener.close()
                    del self._listeners[(owner, number)]
            for number, port in ports.items():
                listener = self._listeners.get((key, number))
                if listener is None:
                    try:
                        listener = Listener(
                            self.loopback.port(service, number), service["metadata"]["uid"], self.loopback
                        )
                    except OSError as error:  # the port was taken meanwhile: say so, serve the rest
                        log.warning("service %s/%s port %s: cannot listen: %s", *key, number, error)
                        continue
                    self._listeners[(key, number)] = listener
                listener.backends = self._lagged(
                    (key, number), listener.backends, self._backends(key, port.get("name", ""))
                )

    def _lagged(self, where, old: tuple[Backend, ...], new: tuple[Backend, ...]) -> tuple[Backend, ...]:
        """``new``, plus the backends that left less than ``lag_s`` ago (checked again then)."""
        if self.lag_s <= 0:
            return new
        now = time.monotonic()
        leaving = self._leaving.setdefault(where, {})
        for backend in old:
            if backend not in new and backend not in leaving:
                leaving[backend] = now + self.lag_s
                self.after(self.lag_s, lambda key=where[0]: self.mark(key))
        for backend in list(leaving):
            if backend in new or leaving[backend] <= now:
                del leaving[backend]
        return tuple(sorted({*new, *leaving}))

    def _backends(self, key: Key, port_name: str) -> tuple[Backend, ...]:
        found = []
        for (namespace, _), piece in sorted(self.cache[SLICES].items()):
            if (
                namespace != key[0]
                or (piece["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) != key[1]
            ):
                continue
            target = next(
                (p["port"] for p in piece.get("ports") or [] if p.get("name", "") == port_name), None
            )
            for entry in piece.get("endpoints") or []:
                conditions = entry.get("conditions") or {}
                uid = (entry.get("targetRef") or {}).get("uid")
                if target and uid and conditions.get("ready") and not conditions.get("terminating"):
                    found.append((uid, target))
        return tuple(sorted(found))

    def stop(self) -> None:
        super().stop()
        for listener in self._listeners.values():
            listener.close()
        self._listeners.clear()


class Listener:
    """One Service port: accepts on ``port`` and splices each connection to the next backend."""

    def __init__(self, port: int, uid: str, loopback: Loopback) -> None:
        self.uid, self.loopback = uid, loopback
        self.backends: tuple[Backend, ...] = ()  # sorted; replaced whole by the proxy's thread
        self._last: Backend | None = None
        self._turn = threading.Lock()
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((LOOPBACK, port))
            self._socket.listen(256)
        except OSError:
            self._socket.close()
            raise
        threading.Thread(target=self._accept, name=f"proxy-{port}", daemon=True).start()

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._socket.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._socket.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _next(self) -> Backend | None:
        """The backend after the last one chosen, in the fixed order (the first, after the end)."""
        with self._turn:
            backends = self.backends
            if not backends:
                return None
            index = 0 if self._last is None else bisect.bisect_right(backends, self._last)
            self._last = backends[index % len(backends)]
            return self._last

    def _serve(self, client: socket.socket) -> None:
        chosen = self._next()
        local = self.loopback.pod_port_of(*chosen) if chosen else None
        try:
            upstream = socket.create_connection((LOOPBACK, local), CONNECT_TIMEOUT_S) if local else None
        except OSError:
            upstream = None
        if upstream is None:  # no endpoint: refused, as kube-proxy's REJECT does
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then end ``sink``'s writing side."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
