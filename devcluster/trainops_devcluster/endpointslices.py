"""The EndpointSlice controller, as kube-controller-manager's: one ``discovery.k8s.io/v1`` slice per
Service with a selector, listing the selected pods that have an IP (Ready ones; every one when the
Service sets ``publishNotReadyAddresses``).  A pod whose ``subdomain`` is the Service's name is
listed with its ``hostname``, which is what gives it the DNS name ``<hostname>.<service>.<ns>.svc``.
The slice is owned by its Service, so the garbage collector deletes it with it."""

from __future__ import annotations

from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.podutil import is_deleting, is_ready, is_terminal, owner_reference
from trainops_devcluster.selectors import match_label_selector
from trainops_devcluster.store import Conflict, NotFound, StoreError

SLICES = "endpointslices.discovery.k8s.io"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGER = "endpointslice-controller.k8s.io"


def selects(service: dict, pod: dict | None) -> bool:
    """Whether ``service`` (with a selector) selects ``pod``."""
    selector = (service.get("spec") or {}).get("selector")
    return (
        pod is not None
        and bool(selector)
        and pod["metadata"].get("namespace") == service["metadata"].get("namespace")
        and match_label_selector({"matchLabels": selector}, pod["metadata"].get("labels") or {})
    )


def slice_name(service: dict) -> str:
    return f"{service['metadata']['name']}-{service['metadata']['uid'][:5]}"


def endpoint(service: dict, pod: dict) -> dict:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    ready = is_ready(pod) and not is_deleting(pod)
    entry = {
        "addresses": [status["podIP"]],
        "conditions": {"ready": ready, "serving": is_ready(pod), "terminating": is_deleting(pod)},
        "targetRef": {
            "kind": "Pod",
            "namespace": pod["metadata"]["namespace"],
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        },
    }
    if spec.get("hostname") and spec.get("subdomain") == service["metadata"]["name"]:
        entry["hostname"] = spec["hostname"]
    if spec.get("nodeName"):
        entry["nodeName"] = spec["nodeName"]
    return entry


class EndpointSliceController(InformerController):
    watches = ("services", "pods")

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "services":
            if new is not None:
                self.mark(key_of(new))
            return
        for key, service in self.cache["services"].items():
            if selects(service, old) or selects(service, new):
                self.mark(key)

    def reconcile(self, keys: set[Key]) -> None:
        for key in sorted(keys):
            service = self.cache["services"].get(key)
            if service is not None and (service.get("spec") or {}).get("selector"):
                self._sync(service)

    def _sync(self, service: dict) -> None:
        namespace = service["metadata"]["namespace"]
        publish_all = bool(service["spec"].get("publishNotReadyAddresses"))
        pods = sorted(
            (
                pod
                for (ns, _), pod in self.cache["pods"].items()
                if ns == namespace
                and selects(service, pod)
                and (pod.get("status") or {}).get("podIP")
                and not is_terminal(pod)
                and (publish_all or is_ready(pod) or is_deleting(pod))
            ),
            key=lambda pod: pod["metadata"]["name"],
        )
        wanted = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name(service),
                "namespace": namespace,
                "labels": {SERVICE_NAME_LABEL: service["metadata"]["name"], MANAGED_BY_LABEL: MANAGER},
                "ownerReferences": [owner_reference(service)],
            },
            "addressType": "IPv4",
            "endpoints": [endpoint(service, pod) for pod in pods],
            "ports": [
                {
                    "name": port.get("name", ""),
                    "port": port["targetPort"] if isinstance(port.get("targetPort"), int) else port["port"],
                    "protocol": port.get("protocol", "TCP"),
                }
                for port in service["spec"].get("ports") or []
            ],
        }
        current = self.store.find(SLICES, namespace, wanted["metadata"]["name"])
        try:
            if current is None:
                self.store.create(SLICES, wanted)
            elif (current.get("endpoints"), current.get("ports")) != (wanted["endpoints"], wanted["ports"]):
                wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.store.update(SLICES, wanted)
        except (Conflict, NotFound):
            self.mark(key_of(service))  # changed meanwhile: again with the next batch
        except StoreError:
            pass  # the Service is being deleted: the garbage collector removes its slice
