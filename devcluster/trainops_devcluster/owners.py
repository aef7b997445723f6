"""The shared part of the controllers whose objects own pods (Job, Deployment, DaemonSet).

Like the real ones it indexes pods by their controller owner reference, reconciles an owner
whenever one of its pods changes, and writes pods and status through the store, recording the
``SuccessfulCreate``/``FailedCreate``/``SuccessfulDelete`` events ``kubectl describe`` shows.  A pod
it creates first meets the API server's validating admission (Pod Security, admission policies) as
the controller's ServiceAccount, as the real controller's request would: refused, it is a
``FailedCreate`` event with the API's message.
"""

from __future__ import annotations

import uuid

from trainops_devcluster import kinds
from trainops_devcluster.admission import Attributes, ValidatingAdmission
from trainops_devcluster.authn import service_account_user
from trainops_devcluster.events import WARNING, EventRecorder
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.pod_admission import admit_pod
from trainops_devcluster.podutil import controller_uid, delete_pod
from trainops_devcluster.store import NotFound, Store, StoreError

_POD = kinds.by_resource("pods")


class PodOwnerController(InformerController):
    """Subclass, set ``owner`` (the owning resource), ``component`` (the events' source) and
    ``watches`` (``owner``, ``"pods"`` and anything else), and implement ``sync(obj)``."""

    owner: str
    component: str

    def __init__(self, store: Store, admission: ValidatingAdmission | None = None) -> None:
        super().__init__(store)
        self.admission = admission
        self.user = service_account_user("kube-system", self.component)
        self.events = EventRecorder(store, self.component)
        self._pods_of: dict[str, set[Key]] = {}
        self._keys: dict[str, Key] = {}

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == self.owner:
            if new is None:
                self.forget(old["metadata"]["uid"])
            else:
                self._keys[new["metadata"]["uid"]] = key_of(new)
                self.mark(key_of(new))
        elif resource == "pods":
            pod = new or old
            owner = controller_uid(pod)
            if owner is None:
                return
            if new is None:
                self._pods_of.get(owner, set()).discard(key_of(pod))
            else:
                self._pods_of.setdefault(owner, set()).add(key_of(pod))
            self.pod_changed(owner, pod, gone=new is None)
            if owner in self._keys:
                self.mark(self._keys[owner])

    def pod_changed(self, owner_uid: str, pod: dict, gone: bool) -> None:
        """React to a change of one owned pod, before its owner is marked."""

    def forget(self, uid: str) -> None:
        """Drop what is kept about a deleted owner."""
        self._pods_of.pop(uid, None)
        self._keys.pop(uid, None)

    def mark_all(self) -> None:
        for key in self._keys.values():
            self.mark(key)

    def reconcile(self, keys: set[Key]) -> None:
        for key in sorted(keys):
            obj = self.cache[self.owner].get(key)
            if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                self.sync(obj)

    def sync(self, obj: dict) -> None:
        """Bring one owner's pods and status to its wanted state."""

    def pods_of(self, obj: dict) -> list[dict]:
        pods = self.cache["pods"]
        return [pods[k] for k in self._pods_of.get(obj["metadata"]["uid"], ()) if k in pods]

    def create_pod(self, obj: dict, pod: dict) -> dict | None:
        """Create ``pod`` for ``obj``; ``None`` (and a ``FailedCreate`` event) if refused."""
        try:
            # mutating admission (priority, runtime class): a refusal names the generateName
            pod = admit_pod(pod, self.store)
            meta = pod["metadata"]
            if not meta.get("name"):  # named then, before validating admission, as the API server names it
                meta["name"] = meta.get("generateName", "") + uuid.uuid4().hex[:5]
            if self.admission is not None:
                self.admission.validate(
                    Attributes(self.user, "CREATE", _POD, "", meta["namespace"], meta["name"], pod, None)
                )
            created = self.store.create("pods", pod)
        except StoreError as error:
            self.events.record(obj, "FailedCreate", f"Error creating: {error}", WARNING)
            return None
        self.observe("pods", created)
        self.events.record(obj, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")
        return created

    def delete_pods(self, obj: dict, pods: list[dict]) -> None:
        for pod in pods:
            if delete_pod(self.store, *key_of(pod), uid=pod["metadata"]["uid"]):
                self.events.record(obj, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")

    def write_status(self, obj: dict, status: dict) -> None:
        """Replace ``obj``'s status, unless it is gone or was replaced by a namesake meanwhile."""
        if status == (obj.get("status") or {}):
            return
        uid = obj["metadata"]["uid"]

        def write(current: dict) -> None:
            if current["metadata"]["uid"] != uid:
                raise NotFound("replaced")
            current["status"] = status

        try:
            self.observe(self.owner, self.store.mutate(self.owner, *key_of(obj), write))
        except NotFound:
            pass
